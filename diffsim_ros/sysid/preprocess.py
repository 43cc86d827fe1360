"""
Preparing recorded trajectories: angle unwrapping, resampling, stream alignment and splits.

Time bases
----------
Recorded streams arrive at their own, often non-uniform, timestamps (driver jitter, dropped
messages, motion capture at another rate).  The functions here put them on one time grid:

* joint states (``q``, ``qd``, ``qdd``, ``tau``) are interpolated linearly;
* commands (``u``) are held (zero-order hold): command ``k`` acts on ``[t_k, t_{k+1})``,
  which is how a ros2_control forward command controller applies them;
* poses are interpolated linearly in position and with SLERP in rotation.

Splits are made by run name and never mix samples of one run into two splits; segments made
by :func:`segment` keep the run name of their parent so that they follow it.

Everything here runs on NumPy/SciPy in float64 and returns tensors with the dtype and device
of the input trajectory; these are preprocessing steps, not differentiable operations.
"""

import math
from typing import Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from .dataset import Trajectory

Tensor = torch.Tensor
#: A timestamped stream: times ``(K,)`` in s and values ``(K, ...)``.
Stream = Tuple[Tensor, Tensor]

__all__ = ['align_streams', 'delay_commands', 'interpolate', 'limit_free_runs',
           'matrix_to_quaternion', 'quaternion_to_matrix', 'resample', 'sample_and_hold',
           'segment', 'segment_tensors',
           'slerp_poses', 'Split', 'split_blocks', 'split_runs', 'split_time', 'Stream',
           'uniform_rate', 'unwrap_angles']

#: Relative jitter of the sample period below which timestamps count as uniform.
UNIFORM_TOLERANCE = 1e-3


def _np(x) -> np.ndarray:
    """Return a float64 NumPy copy of a tensor or array-like."""
    if isinstance(x, Tensor):
        return x.detach().cpu().numpy().astype(np.float64)
    return np.asarray(x, dtype=np.float64)


def _like(array: np.ndarray, ref: Tensor) -> Tensor:
    """Return ``array`` as a tensor with the dtype and device of ``ref``."""
    return torch.as_tensor(np.ascontiguousarray(array), dtype=ref.dtype, device=ref.device)


def _check_times(t: np.ndarray, what: str) -> None:
    """Raise ValueError unless ``t`` is 1-D, finite and strictly increasing."""
    if t.ndim != 1 or t.shape[0] == 0:
        raise ValueError(f'{what}: expected non-empty timestamps of shape (K,), got {t.shape}')
    if not np.isfinite(t).all():
        raise ValueError(f'{what}: timestamps contain NaN or inf')
    if t.shape[0] > 1 and not (np.diff(t) > 0).all():
        raise ValueError(f'{what}: timestamps must be strictly increasing')


def uniform_rate(t, tolerance: float = UNIFORM_TOLERANCE) -> Optional[float]:
    """
    Return the sample rate of uniformly spaced timestamps, or None when they are not.

    :param t: ``(T,)`` timestamps in s, strictly increasing, T >= 2.
    :param tolerance: largest accepted ``|dt - mean(dt)| / mean(dt)``.
    :return: ``1 / mean(dt)`` in Hz, or None when the spacing jitters more than ``tolerance``.
    """
    t = _np(t)
    dt = np.diff(t)
    if dt.size == 0:
        return None
    mean = float(dt.mean())
    if mean <= 0 or float(np.abs(dt - mean).max()) > tolerance * mean:
        return None
    return 1.0 / mean


def interpolate(t_new, t, x) -> np.ndarray:
    """
    Interpolate samples linearly along the first axis, holding the end values outside.

    :param t_new: ``(K,)`` query times in s.
    :param t: ``(T,)`` sample times in s, strictly increasing.
    :param x: ``(T, ...)`` samples.
    :return: ``(K, ...)`` float64 array.
    """
    t_new, t, x = _np(t_new), _np(t), _np(x)
    if t.shape[0] == 1:
        return np.repeat(x[:1], t_new.shape[0], axis=0)
    index = np.clip(np.searchsorted(t, t_new, side='right') - 1, 0, t.shape[0] - 2)
    weight = np.clip((t_new - t[index]) / (t[index + 1] - t[index]), 0.0, 1.0)
    weight = weight.reshape((-1,) + (1,) * (x.ndim - 1))
    return x[index] * (1.0 - weight) + x[index + 1] * weight


def sample_and_hold(t_new, t, x) -> np.ndarray:
    """
    Sample a piecewise-constant signal (zero-order hold) at new times.

    Sample ``k`` holds on ``[t_k, t_{k+1})``; query times before ``t_0`` take the first sample.

    :param t_new: ``(K,)`` query times in s.
    :param t: ``(T,)`` sample times in s, strictly increasing.
    :param x: ``(T, ...)`` samples.
    :return: ``(K, ...)`` float64 array.
    """
    t_new, t, x = _np(t_new), _np(t), _np(x)
    index = np.clip(np.searchsorted(t, t_new, side='right') - 1, 0, t.shape[0] - 1)
    return x[index]


# --------------------------------------------------------------------------------------
# Rotations: matrix <-> quaternion and SLERP (NumPy, float64, quaternions as w, x, y, z)
# --------------------------------------------------------------------------------------
def matrix_to_quaternion(R) -> np.ndarray:
    """
    Convert rotation matrices to unit quaternions (Shepperd's method).

    :param R: ``(..., 3, 3)`` rotation matrices.
    :return: ``(..., 4)`` float64 quaternions ``(w, x, y, z)`` with ``w >= 0``.
    """
    R = _np(R)
    m = R
    trace = m[..., 0, 0] + m[..., 1, 1] + m[..., 2, 2]
    candidates = np.stack([
        np.stack([1.0 + trace, m[..., 2, 1] - m[..., 1, 2], m[..., 0, 2] - m[..., 2, 0],
                  m[..., 1, 0] - m[..., 0, 1]], -1),
        np.stack([m[..., 2, 1] - m[..., 1, 2], 1.0 + m[..., 0, 0] - m[..., 1, 1] - m[..., 2, 2],
                  m[..., 0, 1] + m[..., 1, 0], m[..., 0, 2] + m[..., 2, 0]], -1),
        np.stack([m[..., 0, 2] - m[..., 2, 0], m[..., 0, 1] + m[..., 1, 0],
                  1.0 - m[..., 0, 0] + m[..., 1, 1] - m[..., 2, 2],
                  m[..., 1, 2] + m[..., 2, 1]], -1),
        np.stack([m[..., 1, 0] - m[..., 0, 1], m[..., 0, 2] + m[..., 2, 0],
                  m[..., 1, 2] + m[..., 2, 1],
                  1.0 - m[..., 0, 0] - m[..., 1, 1] + m[..., 2, 2]], -1),
    ], -2)
    # Shepperd: use the candidate with the largest diagonal term (best conditioned).
    diagonal = np.stack([1.0 + trace, 1.0 + m[..., 0, 0] - m[..., 1, 1] - m[..., 2, 2],
                         1.0 - m[..., 0, 0] + m[..., 1, 1] - m[..., 2, 2],
                         1.0 - m[..., 0, 0] - m[..., 1, 1] + m[..., 2, 2]], -1)
    best = np.argmax(diagonal, axis=-1)
    quat = np.take_along_axis(candidates, best[..., None, None], axis=-2)[..., 0, :]
    quat = quat / np.linalg.norm(quat, axis=-1, keepdims=True)
    return np.where(quat[..., :1] < 0, -quat, quat)


def quaternion_to_matrix(quat) -> np.ndarray:
    """
    Convert quaternions to rotation matrices.

    :param quat: ``(..., 4)`` quaternions ``(w, x, y, z)``, normalised here.
    :return: ``(..., 3, 3)`` float64 rotation matrices.
    """
    quat = _np(quat)
    quat = quat / np.linalg.norm(quat, axis=-1, keepdims=True)
    w, x, y, z = (quat[..., i] for i in range(4))
    return np.stack([
        np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)], -1),
        np.stack([2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)], -1),
        np.stack([2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], -1),
    ], -2)


def slerp_poses(t_new, t, T_world_body) -> np.ndarray:
    """
    Interpolate homogeneous transforms: linear in position, SLERP in rotation.

    :param t_new: ``(K,)`` query times in s (held at the end values outside ``t``).
    :param t: ``(P,)`` sample times in s, strictly increasing.
    :param T_world_body: ``(P, 4, 4)`` poses.
    :return: ``(K, 4, 4)`` float64 poses.
    """
    t_new, t, poses = _np(t_new), _np(t), _np(T_world_body)
    out = np.zeros((t_new.shape[0], 4, 4))
    out[:, 3, 3] = 1.0
    out[:, :3, 3] = interpolate(t_new, t, poses[:, :3, 3])
    quat = matrix_to_quaternion(poses[:, :3, :3])
    # make neighbours lie in the same hemisphere so that SLERP takes the short way
    for k in range(1, quat.shape[0]):
        if np.dot(quat[k - 1], quat[k]) < 0:
            quat[k] = -quat[k]
    if t.shape[0] == 1:
        out[:, :3, :3] = poses[0, :3, :3]
        return out
    index = np.clip(np.searchsorted(t, t_new, side='right') - 1, 0, t.shape[0] - 2)
    weight = np.clip((t_new - t[index]) / (t[index + 1] - t[index]), 0.0, 1.0)[:, None]
    q0, q1 = quat[index], quat[index + 1]
    cos = np.clip(np.sum(q0 * q1, -1, keepdims=True), -1.0, 1.0)
    angle = np.arccos(cos)
    sin = np.sin(angle)
    small = sin < 1e-9
    safe = np.where(small, 1.0, sin)
    w0 = np.where(small, 1.0 - weight, np.sin((1.0 - weight) * angle) / safe)
    w1 = np.where(small, weight, np.sin(weight * angle) / safe)
    out[:, :3, :3] = quaternion_to_matrix(w0 * q0 + w1 * q1)
    return out


# --------------------------------------------------------------------------------------
# Trajectory operations
# --------------------------------------------------------------------------------------
def unwrap_angles(traj: Trajectory, joints: Sequence[str]) -> Trajectory:
    """
    Remove 2 pi jumps from wrapped joint angles.

    Use it for continuous joints whose driver wraps the angle (e.g. the cart-pole pole angle,
    wrapped to ``[-pi, pi)``); ``qd``, ``qdd`` and ``tau`` are unchanged.

    :param traj: the trajectory.
    :param joints: names of the joints to unwrap (revolute joints only).
    :return: a trajectory whose ``q`` columns of ``joints`` are continuous.
    :raises KeyError: a name not in ``traj.joint_names``.
    """
    missing = [j for j in joints if j not in traj.joint_names]
    if missing:
        raise KeyError(f'unwrap_angles: trajectory {traj.run!r} has no joint(s) {missing}; '
                       f'it has {list(traj.joint_names)}')
    q = _np(traj.q)
    for name in joints:
        column = traj.joint_names.index(name)
        q[:, column] = np.unwrap(q[:, column])
    return traj.replace(q=_like(q, traj.q))


def delay_commands(traj: Trajectory, samples: int) -> Trajectory:
    """
    Delay the commands by whole samples, holding the first command at the start.

    An actuator that acts ``samples`` periods after the command was logged (amplifier,
    communication) is modelled by shifting ``u`` against the states; on the real Qube two
    samples (8 ms at 250 Hz) fit best (``benchmarks/identification.py``).

    :param traj: run with ``u`` (unchanged when it has none).
    :param samples: delay in samples, >= 0 (0: unchanged).
    :return: the run with ``u[k] = u[max(k - samples, 0)]``.
    :raises ValueError: a negative delay.
    """
    if samples < 0:
        raise ValueError(f'the command delay must be >= 0 samples, got {samples}')
    if samples == 0 or traj.u is None:
        return traj
    held = min(samples, len(traj))
    u = torch.cat((traj.u[:1].expand(held, -1), traj.u[:len(traj) - held]))
    return traj.replace(u=u)


def _grid(start: float, stop: float, rate_hz: float) -> np.ndarray:
    """Return ``start + k / rate_hz`` for every k with a time not past ``stop``."""
    count = int(math.floor((stop - start) * rate_hz + 1e-9)) + 1
    return start + np.arange(count) / rate_hz


def _on_grid(traj: Trajectory, t_new: np.ndarray) -> Trajectory:
    """Return ``traj`` sampled at ``t_new`` (interpolated states, held commands, SLERP poses)."""
    t = _np(traj.t)

    def lin(x):
        return None if x is None else _like(interpolate(t_new, t, x), x)
    u = None if traj.u is None else _like(sample_and_hold(t_new, t, traj.u), traj.u)
    poses = {body: _like(slerp_poses(t_new, t, pose), pose) for body, pose in traj.poses.items()}
    return traj.replace(t=_like(t_new, traj.t), q=lin(traj.q), qd=lin(traj.qd),
                        qdd=lin(traj.qdd), tau=lin(traj.tau), u=u, poses=poses)


def resample(traj: Trajectory, rate_hz: float, start: Optional[float] = None,
             stop: Optional[float] = None) -> Trajectory:
    """
    Resample a trajectory on a uniform time grid.

    ``q``, ``qd``, ``qdd`` and ``tau`` are interpolated linearly, commands ``u`` are held
    (zero-order hold) and poses are interpolated linearly in position and with SLERP in
    rotation.

    :param traj: the trajectory, possibly non-uniformly sampled.
    :param rate_hz: sample rate of the result, Hz.
    :param start: first time of the grid in s (default ``traj.t[0]``).
    :param stop: last admissible time in s (default ``traj.t[-1]``); the grid stops at the
        last multiple of ``1 / rate_hz`` not past it.
    :return: the resampled trajectory, same run name.
    :raises ValueError: non-positive rate or an empty time span.
    """
    if not rate_hz > 0:
        raise ValueError(f'resample: rate_hz must be positive, got {rate_hz}')
    t = _np(traj.t)
    _check_times(t, f'resample({traj.run!r})')
    start = float(t[0]) if start is None else float(start)
    stop = float(t[-1]) if stop is None else float(stop)
    if stop < start:
        raise ValueError(f'resample: empty time span [{start}, {stop}] s')
    return _on_grid(traj, _grid(start, stop, rate_hz))


def align_streams(joint_stream: Trajectory, command_stream: Optional[Stream] = None,
                  pose_streams: Optional[Mapping[str, Stream]] = None,
                  rate_hz: Optional[float] = None) -> Trajectory:
    """
    Put joint states, commands and motion-capture poses on one time grid.

    The grid is the joint stream's own timestamps (``rate_hz=None``) or a uniform grid at
    ``rate_hz``, in both cases cropped to the span covered by every stream:
    ``[max(first stamps), min(last stamps)]``.  Joint states are interpolated linearly,
    commands are held (each acts from its stamp until the next one) and poses are
    interpolated (SLERP for rotations).

    :param joint_stream: joint states as a trajectory (its ``u``/``poses`` are replaced by
        the streams given here, when given).
    :param command_stream: ``(t (K,), u (K, m))`` commands in s and command units, or None.
    :param pose_streams: ``{body: (t (P,), T_world_body (P, 4, 4))}``, or None.
    :param rate_hz: rate of a uniform output grid in Hz, or None to keep the joint stamps.
    :return: the aligned trajectory (run name of ``joint_stream``).
    :raises ValueError: unsorted or non-finite stamps, bad shapes, or streams that do not
        overlap in time.
    """
    pose_streams = dict(pose_streams or {})
    t_joint = _np(joint_stream.t)
    _check_times(t_joint, f'align_streams: joint stream {joint_stream.run!r}')
    starts, stops = [t_joint[0]], [t_joint[-1]]
    streams = []
    if command_stream is not None:
        streams.append(('command stream', command_stream, 2))
    streams += [(f'pose stream {body!r}', stream, 3) for body, stream in pose_streams.items()]
    for what, (t, x), ndim in streams:
        t, x = _np(t), _np(x)
        _check_times(t, f'align_streams: {what}')
        if x.ndim != ndim or x.shape[0] != t.shape[0] or (ndim == 3 and x.shape[1:] != (4, 4)):
            expected = '(K, m)' if ndim == 2 else '(K, 4, 4)'
            raise ValueError(f'align_streams: {what} values: expected shape {expected} with '
                             f'K = {t.shape[0]}, got {x.shape}')
        starts.append(t[0])
        stops.append(t[-1])
    start, stop = float(max(starts)), float(min(stops))
    if stop < start:
        raise ValueError(f'align_streams: the streams do not overlap in time (latest start '
                         f'{start:.6f} s, earliest end {stop:.6f} s)')
    if rate_hz is None:
        t_new = t_joint[(t_joint >= start) & (t_joint <= stop)]
    else:
        if not rate_hz > 0:
            raise ValueError(f'align_streams: rate_hz must be positive, got {rate_hz}')
        t_new = _grid(start, stop, rate_hz)
    out = _on_grid(joint_stream, t_new)
    ref = joint_stream.t
    if command_stream is not None:
        out = out.replace(u=_like(sample_and_hold(t_new, *command_stream), ref))
    if pose_streams:
        poses = dict(out.poses)
        poses.update({body: _like(slerp_poses(t_new, t, T), ref)
                      for body, (t, T) in pose_streams.items()})
        out = out.replace(poses=poses)
    return out


# --------------------------------------------------------------------------------------
# Splits and segments
# --------------------------------------------------------------------------------------
class Split(NamedTuple):
    """Training, validation and test trajectories of a split made by run."""

    train: list
    validation: list
    test: list


def _pick_runs(spec: Union[float, Sequence[str]], pool: list, what: str) -> list:
    """Return the run names a split specification selects from ``pool`` (taken from its end)."""
    if isinstance(spec, str):
        raise TypeError(f'split_runs: {what} must be a fraction or a sequence of run names, '
                        f'got the string {spec!r} (wrap one name in a list)')
    if isinstance(spec, (int, float)):
        if not 0.0 <= spec < 1.0:
            raise ValueError(f'split_runs: {what} fraction must lie in [0, 1), got {spec}')
        count = int(round(spec * len(pool)))
        if spec > 0 and count == 0:
            count = 1
        return pool[len(pool) - count:] if count else []
    names = list(spec)
    unknown = [name for name in names if name not in pool]
    if unknown:
        raise ValueError(f'split_runs: {what} names unknown or already used run(s) {unknown}; '
                         f'available: {pool}')
    return names


def split_runs(trajectories: Sequence[Trajectory],
               validation: Union[float, Sequence[str]] = 0.2,
               test: Union[float, Sequence[str]] = 0.0,
               generator: Optional[torch.Generator] = None) -> Split:
    """
    Split trajectories into training, validation and test sets by run name.

    All trajectories sharing a run name (e.g. the segments of one run) land in the same set,
    so no run contributes samples to two sets.  Fractions count runs, not samples; at least
    one run is held out for a positive fraction.  Runs are taken from the end of the
    first-appearance order (recordings are usually chronological, so later runs are held out)
    unless a ``generator`` shuffles the run order first.

    :param trajectories: the dataset.
    :param validation: fraction of runs, or the run names, for validation.
    :param test: fraction of runs, or the run names, for testing (chosen before validation).
    :param generator: local torch generator for a random choice of runs, or None.
    :return: :class:`Split` of three lists of trajectories (input order kept in each).
    :raises ValueError: bad fractions, unknown names, or no run left for training.
    """
    runs = list(dict.fromkeys(traj.run for traj in trajectories))
    if generator is not None:
        order = torch.randperm(len(runs), generator=generator).tolist()
        runs = [runs[i] for i in order]
    test_runs = _pick_runs(test, runs, 'test')
    pool = [run for run in runs if run not in test_runs]
    validation_runs = _pick_runs(validation, pool, 'validation')
    held_out = set(test_runs) | set(validation_runs)
    if not [run for run in runs if run not in held_out]:
        raise ValueError(f'split_runs: no run left for training among {len(runs)} run(s) '
                         f'{runs}; use split_time to split a single run by time')
    return Split(train=[tr for tr in trajectories if tr.run not in held_out],
                 validation=[tr for tr in trajectories if tr.run in validation_runs],
                 test=[tr for tr in trajectories if tr.run in test_runs])


def split_time(traj: Trajectory, validation: float = 0.2, test: float = 0.0) -> Split:
    """
    Split one run into contiguous blocks by time: training first, then validation, then test.

    For datasets of a single recording (e.g. the Panda excitation).  The blocks are renamed
    ``<run>#train``, ``<run>#validation`` and ``<run>#test`` so that :func:`split_runs` and
    :func:`segment` keep them apart.

    :param traj: the run.
    :param validation: fraction of the duration for validation.
    :param test: fraction of the duration for testing (the last block).
    :return: :class:`Split` of lists holding at most one trajectory each.
    :raises ValueError: fractions outside [0, 1) or summing to 1 or more.
    """
    if not (0.0 <= validation < 1.0 and 0.0 <= test < 1.0 and validation + test < 1.0):
        raise ValueError(f'split_time: need 0 <= validation, test and validation + test < 1, '
                         f'got {validation}, {test}')
    t = _np(traj.t)
    span = t[-1] - t[0]
    cut_val = int(np.searchsorted(t, t[0] + (1.0 - validation - test) * span))
    cut_test = int(np.searchsorted(t, t[0] + (1.0 - test) * span)) if test > 0 else len(t)
    parts = []
    for name, (lo, hi) in (('train', (0, cut_val)), ('validation', (cut_val, cut_test)),
                           ('test', (cut_test, len(t)))):
        parts.append([traj.crop(lo, hi).replace(run=f'{traj.run}#{name}')] if hi > lo else [])
    return Split(*parts)


def split_blocks(traj: Trajectory, validation: float = 0.2, block: float = 1.0) -> Split:
    """
    Split one run into blocks of ``block`` seconds, a fraction of them spread out for validation.

    A recording whose regimes follow each other (a swing-up, then a balance; an excitation,
    then a rest) gives a time split (:func:`split_time`) a validation block that shares
    nothing with the training data, and early stopping on it then stops a fit after a few
    iterations.  Blocks taken in turn put every regime on both sides: block ``i`` is held
    out when ``floor((i + 1) v + 1/2) > floor(i v + 1/2)``, which holds out the fraction
    ``v`` evenly (0.2: blocks 2, 7, 12, ...; 0.4: blocks 1, 3, 6, 8, ...).  Each block also
    takes the first sample of the next, so that a whole block spans ``block`` seconds (a
    1 s rollout fits into a 1 s block).  Pieces shorter than 2 samples are dropped; the
    others are named ``<run>#train<i>`` and ``<run>#validation<i>``.

    :param traj: the run.
    :param validation: fraction of the blocks held out, in ``[0, 1)``; 0 holds out none.
    :param block: block length in seconds (> 0).
    :return: :class:`Split` with lists of block trajectories (``test`` empty).
    :raises ValueError: ``validation`` outside ``[0, 1)`` or ``block <= 0``.
    """
    if not 0.0 <= validation < 1.0 or not block > 0.0:
        raise ValueError(f'split_blocks: need 0 <= validation < 1 and block > 0, got '
                         f'{validation}, {block}')
    t = _np(traj.t)
    index = np.floor((t - t[0]) / block).astype(np.int64)
    train, held = [], []
    for i in range(int(index[-1]) + 1):
        lo, hi = (int(v) for v in np.searchsorted(index, [i, i + 1]))
        hi = min(hi + 1, len(t))
        if hi - lo < 2:
            continue
        is_held = math.floor((i + 1) * validation + 0.5) > math.floor(i * validation + 0.5)
        name = f'{traj.run}#{"validation" if is_held else "train"}{i}'
        (held if is_held else train).append(traj.crop(lo, hi).replace(run=name))
    return Split(train, held, [])


def _check_window(length: int, window: int, stride: int) -> None:
    """Raise ValueError for a bad window or stride."""
    if window < 2 or stride < 1:
        raise ValueError(f'segment: need window >= 2 and stride >= 1, got window={window}, '
                         f'stride={stride}')
    if window > length:
        raise ValueError(f'segment: window {window} is longer than the trajectory ({length} '
                         'samples)')


def segment(traj: Trajectory, window: int, stride: int) -> list:
    """
    Cut a trajectory into overlapping windows for multi-step losses.

    :param traj: the trajectory.
    :param window: samples per segment (>= 2).
    :param stride: samples between the starts of consecutive segments (>= 1).
    :return: list of trajectories ``traj.crop(s, s + window)`` for ``s = 0, stride, ...``
        while the window fits; every segment keeps the run name of ``traj``.
    :raises ValueError: window longer than the trajectory, or non-positive sizes.
    """
    _check_window(len(traj), window, stride)
    return [traj.crop(s, s + window) for s in range(0, len(traj) - window + 1, stride)]


def segment_tensors(traj: Trajectory, window: int, stride: int) -> dict:
    """
    Return the windows of :func:`segment` as batched tensors (views, no copies).

    :param traj: the trajectory.
    :param window: samples per segment.
    :param stride: samples between the starts of consecutive segments.
    :return: ``{'t': (B, W), 'q': (B, W, n), ...}`` for every signal present (``poses`` as
        ``{'poses': {body: (B, W, 4, 4)}}``), with ``B = (T - W) // stride + 1``.
    :raises ValueError: as :func:`segment`.
    """
    _check_window(len(traj), window, stride)

    def unfold(x):
        return x.unfold(0, window, stride).movedim(-1, 1)
    out = {'t': traj.t.unfold(0, window, stride)}
    for name in ('q', 'qd', 'qdd', 'tau', 'u'):
        value = getattr(traj, name)
        if value is not None:
            out[name] = unfold(value)
    if traj.poses:
        out['poses'] = {body: unfold(pose) for body, pose in traj.poses.items()}
    return out


def limit_free_runs(traj: Trajectory, lower: torch.Tensor, upper: torch.Tensor,
                    margin: float, pad: float, min_samples: int = 10) -> list:
    """
    Cut a trajectory into the stretches where no joint is near a position limit.

    A limit stop pushes with a force that rigid-body models without contact lack, and the
    derivative filter spreads that impact over ``pad`` s on both sides: such samples bias a
    fit of the inertial parameters, so they are left out.

    :param traj: the trajectory (``q`` is ``(T, n)``).
    :param lower: ``(n,)`` lower position limits (``-inf`` where none).
    :param upper: ``(n,)`` upper position limits (``inf`` where none).
    :param margin: distance to a limit (rad or m) that counts as at the limit; negative keeps
        every sample.
    :param pad: seconds left out on both sides of every sample at a limit.
    :param min_samples: shorter stretches are dropped.
    :return: the stretches, as trajectories named ``<run>/<k>`` (``[traj]`` when nothing is
        near a limit).
    """
    if margin < 0:
        return [traj]
    q = traj.q.detach()
    lower, upper = lower.to(q), upper.to(q)
    near = ((q <= lower + margin) | (q >= upper - margin)).any(-1).cpu().numpy()
    if not near.any():
        return [traj]
    t = traj.t.detach().cpu().double().numpy()
    t_near = t[near]
    index = np.searchsorted(t_near, t).clip(1, len(t_near) - 1)
    distance = np.minimum(np.abs(t - t_near[index - 1]), np.abs(t_near[index] - t))
    if len(t_near) == 1:
        distance = np.abs(t - t_near[0])
    free = np.concatenate([[False], distance > pad, [False]])
    edges = np.flatnonzero(np.diff(free.astype(np.int8)))
    runs = []
    for start, stop in zip(edges[0::2], edges[1::2]):
        if stop - start >= min_samples:
            runs.append(traj.crop(int(start), int(stop)).replace(run=f'{traj.run}/{len(runs)}'))
    return runs
