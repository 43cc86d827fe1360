"""Formats ``table`` (CSV / NPZ, :mod:`diffsim_ros.io.tables`) and ``bag`` (rosbag2)."""

from pathlib import Path

from .base import DataFormat, LoadOptions, Recording
from .. import load_trajectories
from ..bags import STORAGE_SUFFIXES

__all__ = ['BAG', 'TABLE']


def _load(path: Path, options: LoadOptions) -> Recording:
    is_table = path.suffix in ('.csv', '.npz')
    runs = load_trajectories(path, joint_names=options.joint_names, topic=options.topic,
                             command_topic=None if is_table else options.command_topic,
                             command_joints=options.command_joints)
    return Recording(runs=runs)


TABLE = DataFormat(
    name='table', detect=lambda path: path.suffix in ('.csv', '.npz'), load=_load,
    summary='CSV (t, q:<joint>, qd:/qdd:/tau:<joint>, u:<name>, run) or NPZ table')

BAG = DataFormat(
    name='bag', detect=lambda path: path.is_dir() or path.suffix in STORAGE_SUFFIXES,
    load=_load, summary='rosbag2 folder, .mcap or .db3 (sensor_msgs/JointState, commands)')
