"""
Robot descriptions shipped with diffsim_ros: URDF files plus metadata, with cited parameters.

Robots: ``qube`` (Quanser QUBE-Servo 2 Furuta pendulum), ``cartpole`` (Quanser IP02 cart-pole),
``wam4`` / ``wam7`` (Barrett WAM), ``panda`` (Franka Emika Panda, Gaz et al. 2019 dynamics),
``double_pendulum`` and ``simple_pendulum`` (DFKI underactuated-lab platforms).

>>> from diffsim_ros import robots
>>> robots.get('qube').command_unit
'V'
>>> xml = robots.urdf_string('panda')   # diffsim_ros.core.load_urdf(xml=xml)

Standard library only (no torch, no ROS), so it is cheap to import anywhere.
"""

from pathlib import Path

from .catalog import RobotInfo, ROBOTS

__all__ = ['RobotInfo', 'get', 'names', 'urdf_path', 'urdf_string']

_URDF_DIR = Path(__file__).resolve().parent / 'urdf'


def names() -> tuple[str, ...]:
    """
    Return the names of all shipped robots.

    :return: tuple of robot names, in catalog order.
    """
    return tuple(ROBOTS)


def get(name: str) -> RobotInfo:
    """
    Return the metadata of a robot.

    :param name: robot name, one of :func:`names`.
    :return: the robot's :class:`RobotInfo`.
    :raises ValueError: unknown name (the message lists the valid names).
    """
    try:
        return ROBOTS[name]
    except (KeyError, TypeError):
        raise ValueError(f'unknown robot {name!r}; valid names: {", ".join(ROBOTS)}') from None


def urdf_path(name: str) -> Path:
    """
    Return the path of a robot's URDF file.

    :param name: robot name, one of :func:`names`.
    :return: absolute path of the ``.urdf`` file inside the installed package.
    :raises ValueError: unknown name.
    """
    return _URDF_DIR / get(name).urdf_file


def urdf_string(name: str) -> str:
    """
    Return the URDF XML of a robot.

    :param name: robot name, one of :func:`names`.
    :return: the file's text (UTF-8).
    :raises ValueError: unknown name.
    """
    return urdf_path(name).read_text(encoding='utf-8')
