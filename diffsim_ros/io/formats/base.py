"""
What a data format of ``diffsim-fit`` provides: :class:`DataFormat` and :class:`Recording`.

A format recognises its data from a path (:attr:`DataFormat.detect`), may name the catalog
robot the data belong to (:attr:`DataFormat.robot`, so that ``--robot`` can be left out) and
loads the runs (:attr:`DataFormat.load`) with the data set's conventions as option defaults
(:attr:`Recording.defaults`: the split, the input delay, the derivative filter ...), which
the user's own options override.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, List, Mapping, Optional, Sequence

from ..selection import matches
from ...sysid.dataset import Trajectory

__all__ = ['DataFormat', 'LoadOptions', 'Recording', 'in_group']


@dataclass(frozen=True)
class LoadOptions:
    """
    What a format may need besides the path (bags and tables read columns by joint name).

    :param joint_names: the model's joints, in model order.
    :param topic: JointState topic of a bag, or ``None``.
    :param command_topic: command topic of a bag, or ``None``.
    :param command_joints: the robot's command joints, or ``None``.
    """

    joint_names: Sequence[str] = ()
    topic: Optional[str] = None
    command_topic: Optional[str] = None
    command_joints: Optional[Sequence[str]] = None


@dataclass(frozen=True)
class Recording:
    """
    Loaded runs and the conventions of their data set.

    :param runs: the runs (joint columns named; any order, matched to the model by name).
    :param defaults: option defaults of the data set, keyed by ``diffsim-fit`` option
        destination (``'validation'``, ``'input_delay'``, ``'cutoff'``, ``'derivatives'``,
        ``'rate'``, ``'runs'``); the user's options win.
    :param note: one line on what was read (for the progress output).
    """

    runs: List[Trajectory]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    note: str = ''


@dataclass(frozen=True)
class DataFormat:
    """
    One data format: how to recognise, attribute and load it.

    :param name: the ``--format`` name.
    :param summary: one line for ``--help``.
    :param detect: ``path -> bool``, whether the path holds this format.
    :param load: ``(path, LoadOptions) -> Recording``; raises the reader's own errors
        (:class:`~diffsim_ros.io.datasets.DatasetError`, ``TableError``, ``BagError``).
    :param robot: ``path -> catalog robot name or None``.
    """

    name: str
    summary: str
    detect: Callable[[Path], bool]
    load: Callable[[Path, LoadOptions], Recording]
    robot: Callable[[Path], Optional[str]] = lambda path: None


def in_group(runs: Sequence[Trajectory], part: str) -> List[Trajectory]:
    """
    Keep the runs a data-set subfolder or file stands for (its name is a run-name part).

    :param runs: the data set's runs.
    :param part: the folder or file stem, e.g. ``'qq_chrip_10to0Hz_pos1.5V_250Hz_10s'``.
    :return: the runs whose group or last name part is ``part``.
    """
    return [run for run in runs if matches(part, run.run)]
