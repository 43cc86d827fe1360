"""
The tracking reference an operator gives the mpc node: an ``excitation.yaml`` file.

``diffsim-excite`` writes the file (:func:`~diffsim_ros.sysid.excitation.trajectory_document`:
a periodic Fourier series per joint); the mpc node's ``reference_file`` parameter and
``diffsim-sim-eval --reference`` read it here, once, at start-up.  The path comes from the
operator's launch configuration, never from a topic.  A file is refused with one line naming
it and the first problem: unreadable or not YAML, a robot with passive joints, joints that are
not the robot's (matched by name, in any order), values that are not finite, or a trajectory
that leaves the robot's position, velocity or nominal torque limits
(:func:`~diffsim_ros.sysid.excitation.excitation_limits`) anywhere on a period sampled at the
driver's rate.
"""

from pathlib import Path
from typing import Union

import yaml

from .. import robots
from ..control.tasks import Task, tracking_task
from ..core.model import RobotModel
from ..sysid.excitation import excitation_limits, trajectory_from_document

__all__ = ['load_reference_task', 'ReferenceFileError']


class ReferenceFileError(ValueError):
    """An excitation file that cannot be read or is refused (one-line message)."""


def load_reference_task(path: Union[str, Path], robot: str, model: RobotModel) -> Task:
    """
    Return the tracking task of an excitation file for a catalog robot (module docstring).

    :param path: the file.
    :param robot: catalog name.
    :param model: its nominal model (joint names and limits).
    :return: :func:`~diffsim_ros.control.tasks.tracking_task` of the series over the file's
        ``duration_s`` (the reference repeats with its period after that).
    :raises ReferenceFileError: the file is unreadable or refused.
    """
    info = robots.get(robot)
    try:
        text = Path(path).read_text(encoding='utf-8')
        document = yaml.safe_load(text)
        limits = excitation_limits(model, info)
        trajectory, duration = trajectory_from_document(document, model, limits,
                                                        info.driver_rate_hz)
        return tracking_task(robot, model, trajectory, duration)
    except (OSError, UnicodeDecodeError, yaml.YAMLError, ValueError) as error:
        text = ' '.join(str(error).split()) or type(error).__name__
        raise ReferenceFileError(f'excitation file {str(path)!r}: {text}') from None
