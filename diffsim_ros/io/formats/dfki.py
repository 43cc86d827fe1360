"""
Format ``dfki``: the DFKI underactuated-lab double and simple pendulum records.

Accepts the ``dfki_double_pendulum`` folder (design A.0, the shipped ``double_pendulum``
robot: its nine identification records and three pendubot swing-ups; design C.0 has other
link lengths and no shipped URDF), one of its ``.npz`` records, or the
``dfki_simple_pendulum`` folder or its ``sysid_data_measured.csv``.  Loaded by
:func:`~diffsim_ros.io.datasets.load_dfki_double_pendulum` /
:func:`~diffsim_ros.io.datasets.load_dfki_simple_pendulum`; fitted on the measured torques.

Defaults, as ``benchmarks/identification.py`` treats the data: resampled at 250 Hz
(``--rate 250``; the records run at 400 to 670 Hz with jitter), velocities and accelerations
from the positions with a 10 Hz zero-phase filter (``--derivatives filter --cutoff 10``);
double pendulum: validate on the three pendubot swing-ups (``--validation swingup``),
simple pendulum (one 3.9 s record): on its last 30 % (``--validation last:0.3``); training
data stop the fit (``--early-stopping train``).
"""

from pathlib import Path
from typing import Optional

from .base import DataFormat, in_group, LoadOptions, Recording
from ..datasets import DATASETS, load_dfki_double_pendulum, load_dfki_simple_pendulum

__all__ = ['FORMAT']

DESIGN = 'A.0'
SIMPLE_FILE = 'sysid_data_measured.csv'
_FILTER = {'rate': 250.0, 'derivatives': 'filter', 'cutoff': 10.0, 'early_stopping': 'train'}


def _robot(path: Path) -> Optional[str]:
    """Return ``'double_pendulum'`` / ``'simple_pendulum'`` for the folders and files."""
    if path.is_dir():
        return {DATASETS['double_pendulum']: 'double_pendulum',
                DATASETS['simple_pendulum']: 'simple_pendulum'}.get(path.name)
    if path.name == SIMPLE_FILE and path.parent.name == DATASETS['simple_pendulum']:
        return 'simple_pendulum'
    if path.suffix == '.npz' and path.parent.parent.name == DATASETS['double_pendulum'] and \
            DESIGN in path.name + path.parent.name and 'init_trajectory' not in path.name:
        return 'double_pendulum'
    return None


def _load(path: Path, options: LoadOptions) -> Recording:
    robot = _robot(path)
    if robot == 'simple_pendulum':
        folder = path if path.is_dir() else path.parent
        return Recording(runs=load_dfki_simple_pendulum(folder),
                         defaults={**_FILTER, 'validation': 'last:0.3'},
                         note=f'DFKI simple pendulum record from {folder}')
    folder = path if path.is_dir() else path.parent.parent
    runs = load_dfki_double_pendulum(folder, design=DESIGN)
    defaults = {**_FILTER, 'validation': 'swingup'}
    if path.is_file():
        runs = in_group(runs, path.stem)
        defaults['validation'] = 'last:0.3'
    return Recording(runs=runs, defaults=defaults,
                     note=f'DFKI double pendulum (design {DESIGN}) records from {folder}')


FORMAT = DataFormat(
    name='dfki', detect=lambda path: _robot(path) is not None, load=_load, robot=_robot,
    summary='DFKI double (design A.0) / simple pendulum records (folder or file)')
