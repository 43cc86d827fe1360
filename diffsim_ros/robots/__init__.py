"""
Robot descriptions shipped with diffsim_ros: URDF files plus metadata, with cited parameters.

Robots: ``qube`` (Quanser QUBE-Servo 2 Furuta pendulum), ``cartpole`` (Quanser IP02 cart-pole),
``wam4`` / ``wam7`` (Barrett WAM), ``panda`` (Franka Emika Panda, Gaz et al. 2019 dynamics),
``double_pendulum`` and ``simple_pendulum`` (DFKI underactuated-lab platforms).

>>> from diffsim_ros import robots
>>> robots.get('qube').command_unit
'V'
>>> xml = robots.urdf_string('panda')   # diffsim_ros.core.load_urdf(xml=xml)
>>> qube = robots.interface('qube')      # nominal model, command map, limits, bounds

The catalog is standard library only (no torch, no ROS), so ``robots.get`` is cheap to
import anywhere; :func:`interface` (:mod:`diffsim_ros.robots.interface`, torch) is imported
on first use.
"""

import importlib
from pathlib import Path
import sys
import types

from .catalog import RobotInfo, ROBOTS

__all__ = ['RobotInfo', 'RobotInterface', 'get', 'interface', 'names', 'object_urdf_path',
           'urdf_path', 'urdf_string']
_LAZY = ('interface', 'RobotInterface', 'model_parameters')


def __getattr__(name: str):
    """
    Import the torch-based robot interface on first use.

    :param name: attribute name.
    :return: ``interface``, ``RobotInterface`` or ``model_parameters``.
    :raises AttributeError: any other name.
    """
    if name not in _LAZY:
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
    module = importlib.import_module('.interface', __name__)
    for key in _LAZY:
        globals()[key] = getattr(module, key)
    return globals()[name]


class _Package(types.ModuleType):
    """This package, whose ``interface`` stays the function when its submodule is imported."""

    def __setattr__(self, name: str, value) -> None:
        """Bind ``interface`` to the function, not the submodule of the same name."""
        if name == 'interface' and isinstance(value, types.ModuleType):
            value = value.interface   # the import system binds a loaded submodule here
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


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


#: Free objects (not robots: no catalog entry, no interface) whose URDFs ship here, for the
#: toss data sets (:mod:`diffsim_ros.io.tosses`); load with ``floating_base=True``.
OBJECTS = {'cube_toss': 'cube_toss.urdf', 'elbow_toss': 'elbow_toss.urdf'}


def object_urdf_path(name: str) -> Path:
    """
    Return the path of a shipped free object's URDF.

    :param name: one of :data:`OBJECTS` (``'cube_toss'``, ``'elbow_toss'``).
    :return: absolute path of the ``.urdf`` file.
    :raises ValueError: unknown name (the message lists the valid names).
    """
    try:
        return _URDF_DIR / OBJECTS[name]
    except (KeyError, TypeError):
        raise ValueError(f'unknown object {name!r}; valid names: {", ".join(OBJECTS)}') from None


def urdf_string(name: str) -> str:
    """
    Return the URDF XML of a robot.

    :param name: robot name, one of :func:`names`.
    :return: the file's text (UTF-8).
    :raises ValueError: unknown name.
    """
    return urdf_path(name).read_text(encoding='utf-8')
