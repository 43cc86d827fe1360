"""
Format ``panda-gaz``: the Franka Panda excitation of Gaz et al. 2019 (CSV, about 1 kHz).

Accepts the ``panda_gaz2019_excitation`` folder or its ``exciting_traj_measured.csv``;
loaded by :func:`~diffsim_ros.io.datasets.load_panda_excitation` (measured link-side
torques, gravity included).

Defaults: the last 30 % of the excitation held out (``--validation last:0.3``, as issue 15's
comparison with Gaz et al.'s p-hat); resampled at 200 Hz (``--rate 200``; the time stamps
vary from 0.7 to 8.8 ms) and velocities and accelerations estimated from the positions with
a 5 Hz zero-phase filter (``--derivatives filter --cutoff 5``), as
``benchmarks/identification.py`` does (Gaz et al. differentiated the positions too); the
last 20 % of the training part stops the fit (``--early-stopping train``).
"""

from pathlib import Path

from .base import DataFormat, LoadOptions, Recording
from ..datasets import DATASETS, load_panda_excitation

__all__ = ['FORMAT']

FILE = 'exciting_traj_measured.csv'
#: ``actuator``: the published identification's own friction form (Gaz et al., Table I:
#: offset sigmoids), for DiffNEA; see ``benchmarks/README.md`` (panda) for both forms.
_DEFAULTS = {'validation': 'last:0.3', 'rate': 200.0, 'derivatives': 'filter', 'cutoff': 5.0,
             'early_stopping': 'train', 'actuator': 'sigmoid'}


def _detect(path: Path) -> bool:
    folder = path if path.is_dir() else path.parent
    return folder.name == DATASETS['panda'] and (path.is_dir() or path.name == FILE)


def _load(path: Path, options: LoadOptions) -> Recording:
    folder = path if path.is_dir() else path.parent
    return Recording(runs=load_panda_excitation(folder), defaults=dict(_DEFAULTS),
                     note=f'Gaz et al. 2019 Panda excitation from {folder}')


FORMAT = DataFormat(
    name='panda-gaz', detect=_detect, load=_load,
    robot=lambda path: 'panda' if _detect(path) else None,
    summary='Franka Panda excitation of Gaz et al. 2019 (folder or exciting_traj_measured.csv)')
