"""
Recorded tosses of one tracked object, from any input ``diffsim-fit --object`` accepts.

Three inputs, told apart by the path:

* the shared ``.npz`` layout (``cube_tosses.npz`` / ``elbow_tosses.npz`` of the shared data,
  a file in the same layout anywhere, a folder holding one, or the shared data folder itself:
  its cube file), read
  by :mod:`diffsim_ros.io.tosses`;
* a CSV (``.csv``) of poses: header ``t, x, y, z, qw, qx, qy, qz`` and optionally ``toss``
  (an integer: rows sharing it form one toss, in file order). Time in s, position in m in a
  frame whose z axis points up with the table top at z = 0, quaternion body -> frame with the
  real part first. Lines starting with ``#`` are comments; no other column is accepted;
* a rosbag2 recording (directory, ``.mcap`` or ``.db3``) with a
  ``geometry_msgs/PoseStamped`` or ``TransformStamped`` topic of the object (``topic``, or
  the only such topic).

Poses without a ``toss`` column are cut into tosses (:func:`segment`): at gaps in the stamps
(longer than ``max(0.1 s, 20 sample periods)``), and at rest periods: where the object moves
slower than :data:`REST_SPEED` for ``rest_s`` seconds, the toss ends ``rest_s`` after the rest
began, and the next toss starts at the last resting sample before the object moves again
(the rest samples in between belong to no toss). A recording of a hand carrying the object
from rest and throwing it therefore starts the toss with the carry: cut such recordings
with a ``toss`` column.

Velocities of poses are computed as the shared data's were (their SOURCE.md): backward
differences ``v_k = (p_k - p_{k-1}) / dt`` of the position (world axes) and
``w_k = log(R_{k-1}^T R_k) / dt`` of the orientation (body axes), the first sample repeated,
then a 3-tap median filter; then converted to our layout like the shared tosses
(:func:`~diffsim_ros.core.configuration.free_joint_from_mujoco`). Each toss must be sampled
uniformly (within :data:`~diffsim_ros.sysid.preprocess.UNIFORM_TOLERANCE`), all at one rate.

Every problem is a :class:`ObjectDataError` with one precise line: a toss shorter than two
samples, a non-finite pose, a quaternion that is not a unit one (within
:data:`~diffsim_ros.io.tosses.REPAIRABLE_QUATERNION_ERROR`; closer ones are renormalised with
a log line), an unknown topic, an empty bag, unknown columns.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from .bags import _split_at_gaps, BagError, read_pose_stream, STORAGE_SUFFIXES
from .tosses import (_checked_rows, CUBE_COLUMNS, CUBE_FILE, ELBOW_COLUMNS, ELBOW_FILE,
                     read_cube_file, read_elbow_file, TossSet)
from ..core.configuration import free_joint_from_mujoco
from ..sysid.object_online import pose_velocities
from ..sysid.preprocess import UNIFORM_TOLERANCE

__all__ = ['ObjectDataError', 'ObjectRecording', 'POSE_COLUMNS', 'REST_SPEED', 'REST_S',
           'read_tosses', 'poses_to_states', 'segment']

#: Columns of a pose table (CSV input, and the layout predictions of poses are written in).
POSE_COLUMNS = ('t', 'x', 'y', 'z', 'qw', 'qx', 'qy', 'qz')
#: Speed [m/s] below which the tracked object counts as resting (tracking noise of a mocap
#: system is a few 0.1 mm per sample: at 100-300 Hz, well below this).
REST_SPEED = 0.02
#: Default duration [s] of slow motion that makes a rest.
REST_S = 0.2


class ObjectDataError(ValueError):
    """Recorded tosses cannot be used (one line saying which toss, row or topic)."""


@dataclass(frozen=True)
class ObjectRecording:
    """
    Tosses of one object in our floating layout, and how to write states back as recorded.

    :ivar source: the path read.
    :ivar layout: ``'cube'`` or ``'elbow'`` (the shared ``.npz`` layouts) or ``'poses'``
        (CSV / bag: :data:`POSE_COLUMNS`).
    :ivar dt: sample period [s].
    :ivar toss_ids: one id per toss (the file's ids; for poses the ``toss`` column or the
        count from 0).
    :ivar q: one ``(T_i, nq)`` tensor per toss.
    :ivar v: one ``(T_i, nv)`` tensor per toss.
    :ivar t: one ``(T_i,)`` array of times [s] per toss (``None`` for the ``.npz`` layouts).
    :ivar topic: the bag topic read, if any.
    """

    source: Path
    layout: str
    dt: float
    toss_ids: Tuple[int, ...]
    q: Tuple[torch.Tensor, ...]
    v: Tuple[torch.Tensor, ...]
    t: Optional[Tuple[np.ndarray, ...]] = None
    topic: Optional[str] = None

    def __len__(self) -> int:
        """Return the number of tosses."""
        return len(self.q)


def _from_toss_set(path: Path, layout: str, tosses: TossSet) -> ObjectRecording:
    return ObjectRecording(path, layout, tosses.dt, tosses.toss_ids, tosses.q, tosses.v)


def poses_to_states(rows: np.ndarray, dt: float,
                    dtype: torch.dtype = torch.float64) -> Tuple[torch.Tensor, torch.Tensor]:
    """
    Return the states of a toss of poses, with velocities as the shared data computed them.

    :param rows: ``(T, 7)`` poses ``x, y, z [m], qw, qx, qy, qz`` (unit quaternions), T >= 2.
    :param dt: sample period [s].
    :param dtype: dtype of the result.
    :return: ``q (T, 7)``, ``v (T, 6)`` in our layout (module docstring), the velocities by
        :func:`~diffsim_ros.sysid.object_online.pose_velocities` (the node's too).
    """
    qpos = torch.as_tensor(rows, dtype=dtype)
    q, _ = free_joint_from_mujoco(qpos, torch.zeros(len(rows), 6, dtype=dtype))
    return q, pose_velocities(torch.arange(len(rows), dtype=dtype) * dt, q)


def segment(t: np.ndarray, positions: np.ndarray, rest_s: float = REST_S,
            max_gap_s: Optional[float] = None) -> List[Tuple[int, int]]:
    """
    Cut a stream of poses into tosses at gaps and rest periods (module docstring).

    :param t: ``(P,)`` increasing times [s].
    :param positions: ``(P, 3)`` positions [m].
    :param rest_s: duration [s] of motion slower than :data:`REST_SPEED` that makes a rest.
    :param max_gap_s: gap that splits; default ``max(0.1 s, 20 sample periods)``.
    :return: ``[(start, stop), ...]`` row ranges, one per toss.
    """
    tosses = []
    for lo, hi in _split_at_gaps(t, max_gap_s):
        if hi - lo < 2:
            tosses.append((lo, hi))
            continue
        speed = np.linalg.norm(np.diff(positions[lo:hi], axis=0), axis=1) / np.diff(t[lo:hi])
        slow = np.concatenate(([True], speed < REST_SPEED))   # row k: moved slowly into k
        k, n = 0, hi - lo
        while k < n:
            # skip rest: the toss starts at the last slow row before motion
            while k + 1 < n and slow[k + 1]:
                k += 1
            if k + 1 >= n:
                break
            start, k = k, k + 1
            stop = n
            run_start = None
            while k < n:
                if slow[k]:
                    run_start = k if run_start is None else run_start
                    if t[lo + k] - t[lo + run_start] >= rest_s:
                        stop = k + 1
                        break
                else:
                    run_start = None
                k += 1
            tosses.append((lo + start, lo + min(stop, n)))
            k = min(stop, n) - 1 if stop < n else n
    return tosses


def _uniform_dt(t: np.ndarray, where: str) -> float:
    dt = np.diff(t)
    mean = float(dt.mean())
    if mean <= 0 or float(np.abs(dt - mean).max()) > UNIFORM_TOLERANCE * mean:
        worst = int(np.argmax(np.abs(dt - mean)))
        raise ObjectDataError(f'{where} is not sampled uniformly: step {worst} is '
                              f'{dt[worst]:.6g} s against a mean of {mean:.6g} s (tolerance '
                              f'{UNIFORM_TOLERANCE:g}); resample the poses first')
    return mean


def _pose_tosses(path: Path, t: np.ndarray, rows: np.ndarray, ranges, ids, rest_s: float,
                 limit: Optional[int], dtype, topic: Optional[str] = None) -> ObjectRecording:
    qs, vs, ts, kept, dts = [], [], [], [], []
    for (lo, hi), toss_id in zip(ranges, ids):
        if limit is not None and len(qs) >= limit:
            break
        if hi - lo < 2:
            raise ObjectDataError(f'{path}: toss {toss_id} (t = {t[lo]:.6g} s) has {hi - lo} '
                                  'sample(s); a toss needs at least two (one transition)')
        try:
            checked = _checked_rows(path, toss_id, rows[lo:hi], slice(3, 7))
        except ValueError as exc:
            raise ObjectDataError(str(exc)) from None
        dt = _uniform_dt(t[lo:hi], f'{path}: toss {toss_id}')
        q, v = poses_to_states(checked, dt, dtype)
        qs.append(q)
        vs.append(v)
        ts.append(t[lo:hi])
        kept.append(toss_id)
        dts.append(dt)
    if not qs:
        raise ObjectDataError(f'{path}: no toss found (every pose at rest?)')
    rate = float(np.median(dts))
    for toss_id, dt in zip(kept, dts):
        if abs(dt - rate) > UNIFORM_TOLERANCE * rate:
            raise ObjectDataError(f'{path}: toss {toss_id} is sampled every {dt:.6g} s, the '
                                  f'others every {rate:.6g} s; one rate is needed')
    return ObjectRecording(path, 'poses', rate, tuple(kept), tuple(qs), tuple(vs), tuple(ts),
                           topic)


def _check_rows_finite(path: Path, t: np.ndarray, rows: np.ndarray, what: str) -> None:
    bad = ~np.isfinite(np.column_stack((t, rows))).all(axis=1)
    if bad.any():
        raise ObjectDataError(f'{path}: {what} {int(np.argmax(bad))} has a non-finite entry')
    step = np.diff(t)
    if (step <= 0).any():
        row = int(np.argmax(step <= 0)) + 1
        raise ObjectDataError(f'{path}: {what} {row}: time {t[row]:.9g} s does not increase')


def read_csv(path: Path, rest_s: float = REST_S, limit: Optional[int] = None,
             dtype: torch.dtype = torch.float64) -> ObjectRecording:
    """
    Read a CSV of poses (module docstring).

    :param path: the file.
    :param rest_s: rest duration of :func:`segment` (without a ``toss`` column).
    :param limit: read at most this many tosses.
    :param dtype: dtype of the tensors.
    :return: the tosses.
    :raises ObjectDataError: a bad header, value or toss.
    """
    with open(path, encoding='utf-8') as handle:
        lines = [line for line in handle if line.strip() and not line.lstrip().startswith('#')]
    if not lines:
        raise ObjectDataError(f'{path}: no header and no rows')
    header = tuple(name.strip() for name in lines[0].split(','))
    unknown = [name for name in header if name not in POSE_COLUMNS + ('toss',)]
    missing = [name for name in POSE_COLUMNS if name not in header]
    if unknown or missing:
        raise ObjectDataError(f'{path}: columns must be {", ".join(POSE_COLUMNS)} and '
                              f'optionally toss; unknown {unknown}, missing {missing}')
    try:
        table = np.array([[float(x) for x in line.split(',')] for line in lines[1:]],
                         dtype=np.float64).reshape(-1, len(header))
    except ValueError as exc:
        raise ObjectDataError(f'{path}: not a table of numbers with {len(header)} columns: '
                              f'{exc}') from None
    if not len(table):
        raise ObjectDataError(f'{path}: no rows after the header')
    column = {name: i for i, name in enumerate(header)}
    t = table[:, column['t']]
    rows = table[:, [column[name] for name in POSE_COLUMNS[1:]]]
    if 'toss' in column:
        labels = table[:, column['toss']]
        bad = ~np.isfinite(labels)
        if bad.any():
            raise ObjectDataError(f'{path}: row {int(np.argmax(bad))} has a non-finite toss id')
        cuts = np.nonzero(np.diff(labels) != 0)[0] + 1
        bounds = [0] + cuts.tolist() + [len(table)]
        ranges = list(zip(bounds[:-1], bounds[1:]))
        ids = [int(labels[lo]) for lo, _ in ranges]
        for lo, hi in ranges:
            _check_rows_finite(path, t[lo:hi], rows[lo:hi], f'toss {int(labels[lo])} row')
    else:
        _check_rows_finite(path, t, rows, 'row')
        ranges = segment(t, rows[:, :3], rest_s)
        ids = list(range(len(ranges)))
    return _pose_tosses(path, t, rows, ranges, ids, rest_s, limit, dtype)


def read_bag_tosses(path: Path, topic: Optional[str] = None, rest_s: float = REST_S,
                    limit: Optional[int] = None,
                    dtype: torch.dtype = torch.float64) -> ObjectRecording:
    """
    Read tosses from a rosbag2 pose topic (module docstring).

    :param path: bag directory, ``.mcap`` or ``.db3`` file.
    :param topic: PoseStamped / TransformStamped topic; default: the only one.
    :param rest_s: rest duration of :func:`segment`.
    :param limit: read at most this many tosses.
    :param dtype: dtype of the tensors.
    :return: the tosses.
    :raises ObjectDataError: a bad bag, topic or pose (the bag reader's message).
    """
    try:
        topic, t, rows = read_pose_stream(path, topic)
    except BagError as exc:
        raise ObjectDataError(str(exc)) from None
    _check_rows_finite(path, t, rows, f'pose on {topic}, message')
    ranges = segment(t, rows[:, :3], rest_s)
    return _pose_tosses(path, t, rows, ranges, list(range(len(ranges))), rest_s, limit, dtype,
                        topic)


def _npz_layout(path: Path) -> str:
    try:
        with np.load(path) as archive:
            keys = set(archive.files)
            columns = tuple(str(c) for c in archive['columns']) if 'columns' in keys else None
    except (OSError, ValueError) as exc:
        raise ObjectDataError(f'{path}: not a readable .npz: {exc}') from None
    needed = {'states', 'toss_offsets', 'toss_ids', 'columns', 'dt'}
    if not needed <= keys:
        raise ObjectDataError(f'{path}: not the shared toss layout: keys {sorted(keys)}, '
                              f'expected {sorted(needed)}')
    for layout, expected in (('cube', CUBE_COLUMNS), ('elbow', ELBOW_COLUMNS)):
        if columns == expected:
            return layout
    raise ObjectDataError(f'{path}: columns {columns} are neither the cube layout '
                          f'{CUBE_COLUMNS} nor the elbow layout {ELBOW_COLUMNS}')


def read_tosses(path: Path, topic: Optional[str] = None, rest_s: float = REST_S,
                limit: Optional[int] = None,
                dtype: torch.dtype = torch.float64) -> ObjectRecording:
    """
    Read an object's tosses from any supported input (module docstring).

    :param path: ``.npz``, shared data folder, ``.csv``, or rosbag2 directory / file.
    :param topic: bag pose topic (bags only).
    :param rest_s: rest duration that separates tosses in pose streams [s].
    :param limit: read at most this many tosses.
    :param dtype: dtype of the tensors.
    :return: the tosses.
    :raises ObjectDataError: anything unusable, in one line.
    """
    path = Path(path)
    if not path.exists():
        raise ObjectDataError(f'{str(path)!r} does not exist')
    is_bag = path.suffix in STORAGE_SUFFIXES or (path.is_dir() and (
        (path / 'metadata.yaml').is_file() or any(p.suffix in STORAGE_SUFFIXES
                                                  for p in path.iterdir())))
    if topic is not None and not is_bag:
        raise ObjectDataError(f'--topic {topic!r} is given but {str(path)!r} is not a bag')
    if is_bag:
        return read_bag_tosses(path, topic, rest_s, limit, dtype)
    if path.is_dir():
        inside = [path / name for name in (CUBE_FILE, CUBE_FILE.name, ELBOW_FILE.name)
                  if (path / name).is_file()]
        if not inside:
            raise ObjectDataError(f'{str(path)!r} is a folder but neither a rosbag2 recording, '
                                  f'the shared data folder ({CUBE_FILE}) nor a toss folder '
                                  f'({CUBE_FILE.name} or {ELBOW_FILE.name})')
        path = inside[0]
    if path.stat().st_size == 0:
        raise ObjectDataError(f'{str(path)!r} is empty (0 bytes)')
    if path.suffix == '.csv':
        return read_csv(path, rest_s, limit, dtype)
    if path.suffix != '.npz':
        raise ObjectDataError(f'{str(path)!r}: expected a .npz, .csv, or a rosbag2 recording')
    layout = _npz_layout(path)
    reader = read_cube_file if layout == 'cube' else read_elbow_file
    try:
        return _from_toss_set(path, layout, reader(path, dtype, limit))
    except ValueError as exc:
        raise ObjectDataError(str(exc)) from None


def pose_rows(q: torch.Tensor) -> np.ndarray:
    """
    Return poses ``x, y, z, qw, qx, qy, qz`` (:data:`POSE_COLUMNS` after ``t``) of states.

    :param q: ``(..., 7)`` configurations in our layout.
    :return: ``(..., 7)`` float64 rows.
    """
    q = q.detach().cpu().to(torch.float64)
    return torch.cat((q[..., :3], q[..., 6:7], q[..., 3:6]), -1).numpy()


def recorded_tosses(recording: ObjectRecording, indices: Sequence[int]):
    """
    Return the ``(q list, v list)`` trajectories of some tosses (``fit_object``'s input).

    :param recording: the tosses.
    :param indices: which ones.
    :return: ``([q_i], [v_i])``.
    """
    return [recording.q[i] for i in indices], [recording.v[i] for i in indices]
