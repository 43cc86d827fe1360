"""
Data in and out of files: rosbag2 recordings, CSV/NPZ tables and the shared real-robot data.

No ROS installation is needed: bags are read and written with the ``rosbags`` package, which
is imported on first use of a bag name (``io.read_bag``...), so that the nodes on the robot
path may read a fit (:mod:`diffsim_ros.io.fits`) without loading the bag reader.

>>> from diffsim_ros import io, robots
>>> runs = io.load_trajectories('recording.mcap',
...                             joint_names=robots.get('qube').joint_names)  # doctest: +SKIP
"""

import importlib
from pathlib import Path
from typing import Any, List, Optional, Sequence, Union

from .datasets import (DatasetError, DATASETS, load_cartpole_runs, load_dfki_double_pendulum,
                       load_dfki_simple_pendulum, load_panda_excitation, load_qube_runs,
                       run_kind)
from .tables import read_csv, read_npz, TableError, write_csv, write_npz
from .urdf_export import model_to_urdf
from ..sysid.dataset import Trajectory

__all__ = [
    'BagError', 'BagWarning', 'BagWriter', 'bag_topics', 'DATASETS', 'DatasetError',
    'load_cartpole_runs', 'load_dfki_double_pendulum', 'load_dfki_simple_pendulum',
    'load_panda_excitation', 'load_qube_runs', 'load_trajectories', 'model_to_urdf',
    'read_bag', 'read_csv',
    'read_npz', 'run_kind', 'TableError', 'write_bag', 'write_csv', 'write_npz',
]

#: Names of :mod:`diffsim_ros.io.bags` reached through this package (imported on first use).
_BAG_NAMES = frozenset({'bag_topics', 'BagError', 'BagWarning', 'BagWriter', 'read_bag',
                        'STORAGE_SUFFIXES', 'write_bag'})


def __getattr__(name: str) -> Any:
    """
    Return a name of :mod:`diffsim_ros.io.bags`, importing it on first use (PEP 562).

    :param name: the attribute asked for.
    :return: the bag module's attribute.
    :raises AttributeError: a name this package does not have.
    """
    if name in _BAG_NAMES:
        return getattr(importlib.import_module('.bags', __name__), name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def load_trajectories(path: Union[str, Path], joint_names: Optional[Sequence[str]] = None,
                      topic: Optional[str] = None, command_topic: Optional[str] = None,
                      command_joints: Optional[Sequence[str]] = None) -> List[Trajectory]:
    """
    Load trajectories from a bag, a CSV or an NPZ file, chosen by the path.

    A directory or a ``.mcap``/``.db3`` file is read as a rosbag2 recording
    (:func:`read_bag`), ``.csv`` with :func:`read_csv` and ``.npz`` with :func:`read_npz`.

    :param path: the data.
    :param joint_names: joints to read, in column order (e.g. ``robots.get(n).joint_names``).
    :param topic: JointState topic (bags only).
    :param command_topic: command topic (bags only).
    :param command_joints: the robot's command joints (bags only; checks command lengths).
    :return: list of trajectories, one per run.
    :raises BagError: unreadable bags (see :mod:`diffsim_ros.io.bags`).
    :raises TableError: unreadable tables or an unknown file type.
    """
    from .bags import read_bag, STORAGE_SUFFIXES   # rosbags only when a bag may be read
    path = Path(path)
    if path.suffix == '.csv':
        return read_csv(path, joint_names=joint_names)
    if path.suffix == '.npz':
        return [read_npz(path, joint_names=joint_names)]
    if path.is_dir() or path.suffix in STORAGE_SUFFIXES:
        return read_bag(path, topic=topic, command_topic=command_topic,
                        joint_names=joint_names, command_joints=command_joints)
    if not path.exists():
        raise TableError(f'{str(path)!r} does not exist')
    raise TableError(f'{str(path)!r}: unknown data format; expected a rosbag2 directory, '
                     f'.mcap, .db3, .csv or .npz')
