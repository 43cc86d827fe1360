"""
Format ``dfki``: the DFKI underactuated-lab double and simple pendulum records.

Accepts the ``dfki_double_pendulum`` folder (design A.0, the shipped ``double_pendulum``
robot: its nine identification records and three pendubot swing-ups; design C.0 has other
link lengths and no shipped URDF), one of its ``.npz`` records, or the
``dfki_simple_pendulum`` folder or its ``sysid_data_measured.csv``.  Loaded by
:func:`~diffsim_ros.io.datasets.load_dfki_double_pendulum` /
:func:`~diffsim_ros.io.datasets.load_dfki_simple_pendulum`; fitted on the measured torques.

Defaults (:data:`DOUBLE_DEFAULTS`, :data:`SIMPLE_DEFAULTS`; ``benchmarks/identification.py``
prepares the data with the same values): resampled at 250 Hz (``--rate 250``; the records run
at 400 to 670 Hz with jitter), velocities and accelerations from the positions with a 10 Hz
zero-phase low-pass filter (``--derivatives filter --cutoff 10``), training data stop the fit
(``--early-stopping train``).  Double pendulum: validate on the three pendubot swing-ups
(``--validation swingup``).  The cutoff was checked on another split than the swing-ups (fit
the sine records, validate on the passive-joint and tracking records): ``diffsim-fit``'s
default DiffNEA schedule simulates those better at 10 Hz than at 7 Hz (0.5 s rollout NMSE
0.028 against 0.053; catalogue 0.042 and 0.037), while NEA does better at 7 Hz (0.052 against
0.148): with ``--method nea`` pass ``--cutoff 7``.  Simple pendulum (one 3.9 s record): on
its last 30 % (``--validation last:0.3``).
"""

from pathlib import Path
from typing import Optional

from .base import DataFormat, in_group, LoadOptions, Recording
from ..datasets import DATASETS, load_dfki_double_pendulum, load_dfki_simple_pendulum

__all__ = ['DOUBLE_DEFAULTS', 'FORMAT', 'SIMPLE_DEFAULTS']

DESIGN = 'A.0'
SIMPLE_FILE = 'sysid_data_measured.csv'
_FILTER = {'rate': 250.0, 'derivatives': 'filter', 'early_stopping': 'train'}
#: ``diffsim-fit`` option defaults of the double-pendulum folder.
DOUBLE_DEFAULTS = {**_FILTER, 'cutoff': 10.0, 'validation': 'swingup'}
#: ``diffsim-fit`` option defaults of the simple-pendulum folder or file.
SIMPLE_DEFAULTS = {**_FILTER, 'cutoff': 10.0, 'validation': 'last:0.3'}


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
                         defaults=dict(SIMPLE_DEFAULTS),
                         note=f'DFKI simple pendulum record from {folder}')
    folder = path if path.is_dir() else path.parent.parent
    runs = load_dfki_double_pendulum(folder, design=DESIGN)
    defaults = dict(DOUBLE_DEFAULTS)
    if path.is_file():
        runs = in_group(runs, path.stem)
        defaults['validation'] = 'last:0.3'
    return Recording(runs=runs, defaults=defaults,
                     note=f'DFKI double pendulum (design {DESIGN}) records from {folder}')


FORMAT = DataFormat(
    name='dfki', detect=lambda path: _robot(path) is not None, load=_load, robot=_robot,
    summary='DFKI double (design A.0) / simple pendulum records (folder or file)')
