"""
Format ``quanser``: Pyrado rollouts of the Quanser Qube-Servo 2 and IP02 cart-pole (CSV).

Accepts the data set folder (``quanser_qube_pyrado``, ``quanser_cartpole_pyrado``), one of
its group folders (``qq_chrip_...``, ``qq-su_ectrl_...``, ``qcp_...``) or one rollout CSV in
a group folder.  Loaded by :func:`~diffsim_ros.io.datasets.load_qube_runs` /
:func:`~diffsim_ros.io.datasets.load_cartpole_runs`.

Defaults, as ``benchmarks/identification.py`` treats the data: train on the chirps, validate
on the swing-ups (``--validation swingup``); velocities and accelerations re-estimated from
the angles (``--derivatives filter``, ``--cutoff 20``: the recorded velocities are
QUARC-filtered, about 20 ms late); the Qube's voltages two samples late
(``--input-delay 2``, 8 ms at 250 Hz; the cart-pole's none); the Qube's 500 Hz swing-ups
are left out (``--runs '*250Hz*'``) so that every run has one sampling rate; the last
training chirp stops the fit (``--early-stopping train``), so the swing-ups stay unseen.
"""

from pathlib import Path
from typing import Optional

from .base import DataFormat, in_group, LoadOptions, Recording
from ..datasets import DATASETS, load_cartpole_runs, load_qube_runs

__all__ = ['FORMAT']

_PREFIXES = {'qq': 'qube', 'qcp': 'cartpole'}
_DEFAULTS = {
    'qube': {'runs': '*250Hz*', 'validation': 'swingup', 'input_delay': '2',
             'derivatives': 'filter', 'cutoff': 20.0, 'early_stopping': 'train'},
    'cartpole': {'validation': 'swingup', 'input_delay': '0', 'derivatives': 'filter',
                 'cutoff': 20.0, 'early_stopping': 'train'},
}


def _group_robot(name: str) -> Optional[str]:
    head = name.split('_')[0].split('-')[0]
    return _PREFIXES.get(head)


def _robot(path: Path) -> Optional[str]:
    """Return ``'qube'`` / ``'cartpole'`` for a data set folder, group folder or rollout."""
    for robot in ('qube', 'cartpole'):
        if path.is_dir() and path.name == DATASETS[robot]:
            return robot
    group = path if path.is_dir() else path.parent
    robot = _group_robot(group.name)
    if robot is None or group.parent.name != DATASETS[robot]:
        return None
    if path.is_dir() or (path.suffix == '.csv' and path.name.startswith('rollout')):
        return robot
    return None


def _load(path: Path, options: LoadOptions) -> Recording:
    robot = _robot(path)
    folder = path if path.name == DATASETS[robot] else \
        (path.parent if path.is_dir() else path.parent.parent)
    load = load_qube_runs if robot == 'qube' else load_cartpole_runs
    runs = load(folder)
    defaults = dict(_DEFAULTS[robot])
    if folder != path:
        runs = in_group(runs, path.stem if path.is_file() else path.name)
        defaults.pop('runs', None)
        if len({run.run.split('/')[1] for run in runs}) < 2:
            defaults.pop('validation')   # a single kind: the generic split
    return Recording(runs=runs, defaults=defaults,
                     note=f'Pyrado {robot} rollouts from {folder}')


FORMAT = DataFormat(
    name='quanser', detect=lambda path: _robot(path) is not None, load=_load, robot=_robot,
    summary='Pyrado Qube / cart-pole rollouts (quanser_*_pyrado folder, group or CSV)')
