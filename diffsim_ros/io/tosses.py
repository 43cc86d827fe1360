"""
Real toss recordings (ContactNets cube, DAIR elbow) in our floating-base ``q``/``v`` layout.

Both data sets store the free root MuJoCo's way: position and linear velocity in the table
frame (z up), quaternion (w, x, y, z), angular velocity in body axes (checked against finite
differences of the poses: the linear velocity is the backward difference of the position,
the angular velocity that of the orientation in body axes).  We convert toss by toss to SI and
``q = [p, quat (x, y, z, w), joints]``, ``v = [R^T p_dot, w_body, joint rates]``
(docs/conventions.md); :func:`to_cube_rows` and :func:`to_elbow_rows` write predictions back
in the recorded layout.  The table top is the plane z = 0 in both (elbow: every toss ends
with its lowest corner at exactly 0; cube: resting corners at about -2 mm).
"""

from dataclasses import dataclass
import logging
from pathlib import Path
from typing import Optional, Tuple

import numpy as np
import torch

from ..core.configuration import (free_joint_from_mujoco, free_joint_to_mujoco,
                                  QUATERNION_NORM_TOLERANCE)
from ..robots import object_urdf_path

Tensor = torch.Tensor

CUBE_FILE = Path('contactnets_cube_toss') / 'cube_tosses.npz'
ELBOW_FILE = Path('dair_elbow_toss') / 'elbow_tosses.npz'
#: Cube positions and linear velocities are stored in half-widths (SOURCE.md).
CUBE_HALF_WIDTH_M = 0.0524
#: Nominal friction of the cube (the data set's ``experiment_params.json``).
CUBE_FRICTION = 0.18
#: Nominal friction of the elbow (the authors' URDF value).
ELBOW_FRICTION = 0.3
CUBE_COLUMNS = ('x', 'y', 'z', 'qw', 'qx', 'qy', 'qz', 'vx', 'vy', 'vz', 'wx', 'wy', 'wz')
ELBOW_COLUMNS = ('qw', 'qx', 'qy', 'qz', 'x', 'y', 'z', 'theta_joint', 'wx', 'wy', 'wz',
                 'vx', 'vy', 'vz', 'theta_joint_dot')


@dataclass(frozen=True)
class TossSet:
    """
    Tosses of one object in our layout, with the nominal contact values the papers used.

    :ivar name: ``'cube_toss'`` or ``'elbow_toss'`` (also the shipped URDF's name).
    :ivar urdf_path: the object's URDF (load with ``floating_base=True``).
    :ivar dt: sample period in s.
    :ivar toss_ids: the original file index of each toss.
    :ivar q: one ``(T_i, nq)`` tensor per toss.
    :ivar v: one ``(T_i, nv)`` tensor per toss.
    :ivar friction: nominal Coulomb friction coefficient.
    :ivar restitution: nominal restitution, or None where the source gives none.
    """

    name: str
    urdf_path: Path
    dt: float
    toss_ids: Tuple[int, ...]
    q: Tuple[Tensor, ...]
    v: Tuple[Tensor, ...]
    friction: float
    restitution: Optional[float]

    def __len__(self) -> int:
        """Return the number of tosses."""
        return len(self.q)


def _read(path: Path, columns: Tuple[str, ...]) -> dict:
    """Read a toss ``.npz`` and check that its columns are the ones this module expects."""
    if not path.is_file():
        raise FileNotFoundError(f'toss data not found at {path} (see the shared data INDEX.md)')
    with np.load(path) as archive:
        data = {key: archive[key] for key in archive.files}
    found = tuple(str(c) for c in data['columns'])
    if found != columns:
        raise ValueError(f'{path}: expected columns {columns}, found {found}')
    return data


#: Largest ``| |quat| - 1 |`` a reader repairs by renormalising (with a log line); beyond
#: it the four numbers are not a stored unit quaternion and the toss is refused.
REPAIRABLE_QUATERNION_ERROR = 1e-2

_logger = logging.getLogger(__name__)


def _checked_rows(path: Path, toss_id: int, rows: np.ndarray, quat: slice) -> np.ndarray:
    """
    Refuse a toss that cannot be used and repair quaternions stored slightly off unit.

    :param path: the file, for messages.
    :param toss_id: the toss's id in the file.
    :param rows: its recorded rows.
    :param quat: the columns of the quaternion.
    :return: the rows, quaternions renormalised where they were off by more than
        ``QUATERNION_NORM_TOLERANCE`` and at most ``REPAIRABLE_QUATERNION_ERROR``.
    :raises ValueError: a toss with fewer than two samples, a non-finite entry, or a
        quaternion farther from unit than ``REPAIRABLE_QUATERNION_ERROR``.
    """
    if len(rows) < 2:
        raise ValueError(f'{path}: toss {toss_id} has {len(rows)} sample(s); a toss needs '
                         'at least two (one transition)')
    bad = ~np.isfinite(rows).all(axis=1)
    if bad.any():
        raise ValueError(f'{path}: toss {toss_id} has a non-finite entry in row '
                         f'{int(np.argmax(bad))} (of {len(rows)})')
    norm = np.linalg.norm(rows[:, quat], axis=1)
    error = np.abs(norm - 1.0)
    if (error > REPAIRABLE_QUATERNION_ERROR).any():
        row = int(np.argmax(error > REPAIRABLE_QUATERNION_ERROR))
        raise ValueError(f'{path}: toss {toss_id} row {row}: quaternion norm {norm[row]:.6g} '
                         f'is not a unit quaternion (repairable within '
                         f'{REPAIRABLE_QUATERNION_ERROR:g})')
    off = error > QUATERNION_NORM_TOLERANCE
    if off.any():
        rows = rows.copy()
        rows[:, quat] /= norm[:, None]
        _logger.warning('%s: toss %d: renormalised %d quaternion(s) off unit by up to %.3g',
                        path, toss_id, int(off.sum()), float(error.max()))
    return rows


def _split(data: dict, limit: Optional[int]):
    """Yield ``(toss_id, rows)`` per toss, at most ``limit`` tosses."""
    offsets = data['toss_offsets']
    count = len(offsets) - 1 if limit is None else min(limit, len(offsets) - 1)
    for i in range(count):
        yield int(data['toss_ids'][i]), data['states'][offsets[i]:offsets[i + 1]]


def load_cube_tosses(data_root: Path, dtype: torch.dtype = torch.float64,
                     limit: Optional[int] = None) -> TossSet:
    """
    Read the ContactNets cube tosses (570, 148 Hz) into ``q (T, 7)``, ``v (T, 6)`` in SI.

    :param data_root: the shared data folder (holding ``contactnets_cube_toss/``).
    :param dtype: dtype of the tensors.
    :param limit: read only the first ``limit`` tosses.
    :return: the tosses, mu 0.18 and restitution 0.125 (ContactNets' nominal values).
    :raises ValueError: a toss shorter than two samples, a non-finite entry or a quaternion
        that is not one (see :func:`_checked_rows`; slightly off-unit ones are repaired).
    """
    return read_cube_file(Path(data_root) / CUBE_FILE, dtype, limit)


def read_cube_file(path: Path, dtype: torch.dtype = torch.float64,
                   limit: Optional[int] = None) -> TossSet:
    """
    Read a file in the cube tosses' layout (:func:`load_cube_tosses`, wherever it lies).

    :param path: the ``.npz`` file.
    :param dtype: dtype of the tensors.
    :param limit: read only the first ``limit`` tosses.
    :return: the tosses.
    :raises ValueError: as :func:`load_cube_tosses`.
    """
    path = Path(path)
    data = _read(path, CUBE_COLUMNS)
    qs, vs, ids = [], [], []
    for toss_id, rows in _split(data, limit):
        rows = torch.as_tensor(_checked_rows(path, toss_id, rows, slice(3, 7)), dtype=dtype)
        scale = rows.new_tensor([CUBE_HALF_WIDTH_M] * 3 + [1.0] * 4)
        q, v = free_joint_from_mujoco(
            rows[:, :7] * scale,
            torch.cat((rows[:, 7:10] * CUBE_HALF_WIDTH_M, rows[:, 10:13]), dim=-1))
        qs.append(q)
        vs.append(v)
        ids.append(toss_id)
    return TossSet('cube_toss', object_urdf_path('cube_toss'), float(data['dt']), tuple(ids),
                   tuple(qs), tuple(vs), friction=CUBE_FRICTION, restitution=0.125)


def load_elbow_tosses(data_root: Path, dtype: torch.dtype = torch.float64,
                      limit: Optional[int] = None) -> TossSet:
    """
    Read the DAIR elbow tosses (541 x 121 samples) into ``q (T, 8)``, ``v (T, 7)``.

    The hinge angle is unwrapped per toss (it is stored wrapped to (-pi, pi]), with a log
    line naming the tosses it changed.

    :param data_root: the shared data folder (holding ``dair_elbow_toss/``).
    :param dtype: dtype of the tensors.
    :param limit: read only the first ``limit`` tosses.
    :return: the tosses; mu 0.3 (the authors' URDF), no restitution given.
    :raises ValueError: as :func:`load_cube_tosses`.
    """
    return read_elbow_file(Path(data_root) / ELBOW_FILE, dtype, limit)


def read_elbow_file(path: Path, dtype: torch.dtype = torch.float64,
                    limit: Optional[int] = None) -> TossSet:
    """
    Read a file in the elbow tosses' layout (:func:`load_elbow_tosses`, wherever it lies).

    :param path: the ``.npz`` file.
    :param dtype: dtype of the tensors.
    :param limit: read only the first ``limit`` tosses.
    :return: the tosses.
    :raises ValueError: as :func:`load_cube_tosses`.
    """
    path = Path(path)
    data = _read(path, ELBOW_COLUMNS)
    qs, vs, ids, unwrapped = [], [], [], []
    for toss_id, rows in _split(data, limit):
        rows = _checked_rows(path, toss_id, rows, slice(0, 4)).copy()
        hinge = np.unwrap(rows[:, 7])
        if (hinge != rows[:, 7]).any():
            unwrapped.append((toss_id, int(np.argmax(hinge != rows[:, 7]))))
        rows[:, 7] = hinge
        rows = torch.as_tensor(rows, dtype=dtype)
        qpos = torch.cat((rows[:, 4:7], rows[:, 0:4], rows[:, 7:8]), dim=-1)
        qvel = torch.cat((rows[:, 11:14], rows[:, 8:11], rows[:, 14:15]), dim=-1)
        q, v = free_joint_from_mujoco(qpos, qvel)
        qs.append(q)
        vs.append(v)
        ids.append(toss_id)
    if unwrapped:
        _logger.info('%s: unwrapped the hinge angle (stored in (-pi, pi]) in %d of %d tosses; '
                     'first: toss %d from row %d', path, len(unwrapped), len(ids),
                     *unwrapped[0])
    return TossSet('elbow_toss', object_urdf_path('elbow_toss'), float(data['dt']), tuple(ids),
                   tuple(qs), tuple(vs), friction=ELBOW_FRICTION, restitution=None)


def to_cube_rows(q: Tensor, v: Tensor) -> np.ndarray:
    """
    Write cube states back in the recorded layout (inverse of :func:`load_cube_tosses`).

    :param q: ``(..., 7)`` in our layout, metres.
    :param v: ``(..., 6)`` in our layout.
    :return: ``(..., 13)`` float64 rows ``x, y, z, qw, qx, qy, qz, vx, vy, vz, wx, wy, wz``
        in half-widths.
    """
    qpos, qvel = free_joint_to_mujoco(q, v)
    rows = torch.cat((qpos, qvel), dim=-1).detach().cpu().to(torch.float64).numpy().copy()
    rows[..., [0, 1, 2, 7, 8, 9]] /= CUBE_HALF_WIDTH_M
    return rows


def to_elbow_rows(q: Tensor, v: Tensor) -> np.ndarray:
    """
    Write elbow states back in the recorded layout (inverse of :func:`load_elbow_tosses`).

    :param q: ``(..., 8)`` in our layout.
    :param v: ``(..., 7)`` in our layout.
    :return: ``(..., 15)`` float64 rows in :data:`ELBOW_COLUMNS` order, the hinge angle
        wrapped to (-pi, pi] as recorded.
    """
    qpos, qvel = free_joint_to_mujoco(q, v)
    qpos = qpos.detach().cpu().to(torch.float64).numpy()
    qvel = qvel.detach().cpu().to(torch.float64).numpy()
    theta = np.pi - np.mod(np.pi - qpos[..., 7:8], 2.0 * np.pi)
    return np.concatenate((qpos[..., 3:7], qpos[..., 0:3], theta, qvel[..., 3:6],
                           qvel[..., 0:3], qvel[..., 6:7]), axis=-1)
