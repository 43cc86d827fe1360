"""
The tracking reference an operator gives the mpc node: a YAML reference file.

Two forms, read by the same loader
(:func:`~diffsim_ros.sysid.excitation.trajectory_from_document`): the ``excitation.yaml``
that ``diffsim-excite`` writes (:func:`~diffsim_ros.sysid.excitation.trajectory_document`: a
periodic Fourier series per joint, repeated with its period), and a ``kind: sampled``
document (:mod:`diffsim_ros.sysid.sampled`: positions per joint at ``rate_hz``, played once
from its first sample, then held at its last with zero velocity; a swing-up).  The mpc node's
``reference_file`` parameter and ``diffsim-sim-eval --reference`` read it here, once, at
start-up.  The path comes from the operator's launch configuration, never from a topic.  A
file is refused with one line naming it and the first problem: unreadable or not YAML, a robot
with passive joints, joints that are not the robot's (matched by name, in any order), values
that are not finite, or a trajectory that leaves the robot's position, velocity or nominal
torque limits (:func:`~diffsim_ros.sysid.excitation.excitation_limits`) anywhere on a period
(a sampled one: anywhere on its samples and its hold) sampled at the driver's rate.

The velocity limits are the robot description's unless ``velocity_limits`` gives others
(the mpc node passes its ``gate.velocity_limits``: one configuration raises both the
reference's and the input gate's limits, e.g. ``config/wam4_cup.yaml`` for the swing-up).
"""

from dataclasses import replace
from pathlib import Path
from typing import Sequence, Union

import yaml

from .. import robots
from ..control.tasks import Task, tracking_task
from ..core.model import RobotModel
from ..sysid.excitation import excitation_limits, trajectory_from_document

__all__ = ['load_reference_task', 'ReferenceFileError']


class ReferenceFileError(ValueError):
    """A reference file that cannot be read or is refused (one-line message)."""


def load_reference_task(path: Union[str, Path], robot: str, model: RobotModel,
                        velocity_limits: Sequence[float] = ()) -> Task:
    """
    Return the tracking task of a reference file for a catalog robot (module docstring).

    :param path: the file.
    :param robot: catalog name.
    :param model: its nominal model (joint names and limits).
    :param velocity_limits: speed limits replacing the description's, rad/s or m/s, one per
        joint of the model in model order (checked by the caller); empty: the description's.
    :return: :func:`~diffsim_ros.control.tasks.tracking_task` of the trajectory over the
        file's ``duration_s`` (a series repeats with its period after that) or over a sampled
        trajectory's samples (held at its end after that).
    :raises ReferenceFileError: the file is unreadable or refused.
    """
    info = robots.get(robot)
    try:
        text = Path(path).read_text(encoding='utf-8')
        document = yaml.safe_load(text)
        limits = excitation_limits(model, info)
        if len(velocity_limits):
            limits = replace(limits, velocity=tuple(float(v) for v in velocity_limits))
        trajectory, duration = trajectory_from_document(document, model, limits,
                                                        info.driver_rate_hz)
        return tracking_task(robot, model, trajectory, duration)
    except (OSError, UnicodeDecodeError, yaml.YAMLError, ValueError) as error:
        text = ' '.join(str(error).split()) or type(error).__name__
        raise ReferenceFileError(f'reference file {str(path)!r}: {text}') from None
