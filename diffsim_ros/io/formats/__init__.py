"""
Data formats ``diffsim-fit`` reads (``--format``), and their detection from the path.

:data:`FORMATS` is the registry, in detection order: a new format is one module defining a
:class:`~diffsim_ros.io.formats.base.DataFormat` and one line here.  ``auto`` takes the
first format whose ``detect`` accepts the path.
"""

from pathlib import Path
from typing import Dict, List, Optional, Sequence

from . import dfki, files, panda_gaz, quanser
from .base import DataFormat, LoadOptions, Recording
from ..datasets import DATASETS
from ...sysid.dataset import Trajectory

__all__ = ['DataFormat', 'FORMATS', 'FormatError', 'LoadOptions', 'Recording', 'in_model_order',
           'resolve']

#: Formats by ``--format`` name, in detection order (data sets before generic files).
FORMATS: Dict[str, DataFormat] = {
    'quanser': quanser.FORMAT,
    'panda-gaz': panda_gaz.FORMAT,
    'dfki': dfki.FORMAT,
    'table': files.TABLE,
    'bag': files.BAG,
}


class FormatError(ValueError):
    """An unknown format name, or a path no format recognises."""


def resolve(name: str, path: Path) -> DataFormat:
    """
    Return the format of ``path``: the one named, or the detected one for ``'auto'``.

    :param name: a :data:`FORMATS` name or ``'auto'``.
    :param path: the data.
    :return: the format.
    :raises FormatError: an unknown name, the shared data root (which holds many data sets),
        or a path no format recognises / the named format does not accept.
    """
    if name != 'auto' and name not in FORMATS:
        raise FormatError(f'unknown --format {name!r}; valid: auto, {", ".join(FORMATS)}')
    if path.is_dir() and (path / 'INDEX.md').is_file() and \
            any((path / folder).is_dir() for folder in DATASETS.values()):
        present = [folder for folder in DATASETS.values() if (path / folder).is_dir()]
        raise FormatError(f'{str(path)!r} is the shared data root; give one data set '
                          f'folder: {", ".join(present)}')
    if name != 'auto':
        if not FORMATS[name].detect(path):
            raise FormatError(f'--format {name}: {str(path)!r} is not {FORMATS[name].summary}')
        return FORMATS[name]
    for candidate in FORMATS.values():
        if candidate.detect(path):
            return candidate
    raise FormatError(f'{str(path)!r}: unknown data format; expected '
                      + '; '.join(f'{f.name}: {f.summary}' for f in FORMATS.values()))


def in_model_order(runs: Sequence[Trajectory], joints: Sequence[str]) -> List[Trajectory]:
    """
    Return the runs with their joint columns in the model's order (matched by name).

    :param runs: runs whose ``joint_names`` hold every model joint (extra columns dropped).
    :param joints: the model's joints.
    :return: the runs, columns reordered.
    :raises FormatError: a model joint the data lack.
    """
    out = []
    for run in runs:
        if tuple(run.joint_names) == tuple(joints):
            out.append(run)
            continue
        missing = [j for j in joints if j not in run.joint_names]
        if missing:
            raise FormatError(f'run {run.run!r} has no joint(s) {", ".join(missing)} of the '
                              f'model; it has {", ".join(run.joint_names)}')
        index = [run.joint_names.index(j) for j in joints]

        def pick(x: Optional[object]) -> Optional[object]:
            return None if x is None else x[:, index]
        out.append(run.replace(joint_names=tuple(joints), q=pick(run.q), qd=pick(run.qd),
                               qdd=pick(run.qdd), tau=pick(run.tau)))
    return out
