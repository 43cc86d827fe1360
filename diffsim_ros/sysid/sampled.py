"""
A one-shot joint trajectory given as samples: the ``kind: sampled`` reference document.

The periodic Fourier series of ``diffsim-excite`` (:class:`~diffsim_ros.sysid.excitation.
FourierTrajectory`) repeats forever; a swing-up (ball in a cup) is played once.  Its document
(the same ``reference_file`` of the mpc node, read by the same loader,
:func:`~diffsim_ros.sysid.excitation.trajectory_from_document`) is a YAML mapping::

    kind: sampled
    robot: wam4                     # informative
    joint_names: [wam/base_yaw_joint, ...]
    rate_hz: 500.0                  # samples per second
    q: [[...], [...], ...]          # one list of T >= 2 positions per joint, rad or m
    duration_s: 2.998               # optional; if given, (T - 1) / rate_hz

Only positions are given, so velocities and accelerations cannot disagree with them: they are
finite differences of the samples, ``qd`` by :func:`numpy.gradient` (central differences,
second order at the ends) and ``qdd`` by the three-point second difference
``(q[k+1] - 2 q[k] + q[k-1]) / dt^2`` (the end values repeat their neighbours').  For samples of
a smooth trajectory at 500 Hz both are within ``dt^2`` times the third (fourth) derivative of
the exact ones.  Between samples ``q``, ``qd`` and ``qdd`` are each interpolated linearly.

Time 0 is the first sample (the robot should stand there at rest when tracking starts); the
trajectory ends at ``(T - 1) / rate_hz`` and is then held at its last position with zero
velocity and acceleration.  A trajectory that does not end at rest has its velocity stepped
to zero there: the tracking controller then brakes to the last position.
"""

from dataclasses import dataclass
import math
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np
import torch

Tensor = torch.Tensor

__all__ = ['KIND', 'SampledTrajectory', 'joint_order', 'sampled_document']

#: The ``kind`` of a sampled reference document.
KIND = 'sampled'


@dataclass(frozen=True, eq=False)
class SampledTrajectory:
    """
    A joint trajectory played once from samples, then held (module docstring).

    :param joint_names: joints of the columns of ``q``.
    :param rate_hz: sample rate, Hz.
    :param q: ``(T, n)`` positions, rad or m, ``T >= 2`` (any array-like of numbers).
    :raises ValueError: names that are not distinct, a shape other than ``(T >= 2, n)``, values
        that are not finite numbers, or a rate that is not a finite number > 0.
    """

    joint_names: Tuple[str, ...]
    rate_hz: float
    q: Any

    def __post_init__(self) -> None:
        """Check the samples, store them as a read-only float64 array."""
        names = tuple(self.joint_names)
        if not names or len(set(names)) != len(names) or not all(
                isinstance(j, str) for j in names):
            raise ValueError(f'joint_names must be distinct strings, not empty, got {names!r}')
        rate = self.rate_hz
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not (
                math.isfinite(rate) and rate > 0):
            raise ValueError(f'rate_hz must be a finite number > 0, got {rate!r}')
        q = self.q.detach().cpu().numpy() if isinstance(self.q, Tensor) else self.q
        try:
            q = np.array(q, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError('q must be lists of numbers, one per joint') from None
        if q.ndim != 2 or q.shape[1] != len(names) or q.shape[0] < 2:
            raise ValueError(f'q must hold at least 2 samples of {len(names)} joints, got shape '
                             f'{tuple(q.shape)}')
        if not np.isfinite(q).all():
            raise ValueError('q must be finite')
        q.setflags(write=False)
        object.__setattr__(self, 'joint_names', names)
        object.__setattr__(self, 'rate_hz', float(rate))
        object.__setattr__(self, 'q', q)

    @classmethod
    def from_document(cls, document: Dict[str, Any]) -> 'SampledTrajectory':
        """
        Return the trajectory of a ``kind: sampled`` mapping (module docstring).

        :param document: the parsed file.
        :return: the trajectory, in the document's joint order.
        :raises ValueError: missing keys or values refused by the constructor.
        """
        missing = [k for k in ('joint_names', 'rate_hz', 'q') if k not in document]
        if missing:
            raise ValueError(f'missing keys {missing}')
        names, rows = document['joint_names'], document['q']
        if not isinstance(names, list) or not isinstance(rows, list) or \
                len(rows) != len(names) or not all(isinstance(r, list) for r in rows):
            raise ValueError('joint_names must be a list and q one list of positions per joint')
        if len({len(r) for r in rows}) > 1:
            raise ValueError('every joint needs the same number of samples in q')
        if any(isinstance(v, bool) for r in rows for v in r):
            raise ValueError('q must be lists of numbers, one per joint')
        try:
            q = np.array(rows, dtype=np.float64).T
        except (TypeError, ValueError):
            raise ValueError('q must be lists of numbers, one per joint') from None
        trajectory = cls(tuple(names), document['rate_hz'], q)
        stated = document.get('duration_s', trajectory.duration_s)
        if isinstance(stated, bool) or not isinstance(stated, (int, float)) or not \
                abs(stated - trajectory.duration_s) <= 1e-9 * max(1.0, trajectory.duration_s):
            raise ValueError(f'duration_s {stated!r} is not that of the samples, '
                             f'{trajectory.duration_s:g} s ((T - 1) / rate_hz)')
        return trajectory

    @property
    def samples(self) -> int:
        """Return the number of samples ``T``."""
        return int(self.q.shape[0])

    @property
    def duration_s(self) -> float:
        """Return the time of the last sample, s (the hold starts there)."""
        return (self.samples - 1) / self.rate_hz

    def derivatives(self) -> Tuple[np.ndarray, np.ndarray]:
        """
        Return the velocities and accelerations at the samples (module docstring).

        :return: ``(qd, qdd)`` each ``(T, n)``, rad/s and rad/s^2 (or m).
        """
        dt = 1.0 / self.rate_hz
        q = self.q
        qd = np.gradient(q, dt, axis=0, edge_order=2 if self.samples >= 3 else 1)
        qdd = np.zeros_like(q)
        if self.samples >= 3:
            qdd[1:-1] = (q[2:] - 2.0 * q[1:-1] + q[:-2]) / (dt * dt)
            qdd[0], qdd[-1] = qdd[1], qdd[-2]
        return qd, qdd

    def evaluate(self, t: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """
        Return positions, velocities and accelerations at times ``t``.

        Linear interpolation between samples; before 0 the first sample, from
        :attr:`duration_s` on the last position at rest.

        :param t: ``(...)`` times, s (float64 unless a floating dtype is given; its device).
        :return: ``(q, qd, qdd)`` each ``(..., n)`` in :attr:`joint_names` order.
        """
        dtype = t.dtype if t.is_floating_point() else torch.float64
        like = {'dtype': dtype, 'device': t.device}
        qd, qdd = self.derivatives()
        table = torch.as_tensor(np.stack((self.q, qd, qdd)), **like)   # (3, T, n)
        position = t.to(dtype) * self.rate_hz
        index = position.floor().clamp(0, self.samples - 2)
        weight = (position - index).clamp(0.0, 1.0)[..., None]
        i = index.long()
        values = table[:, i] * (1.0 - weight) + table[:, i + 1] * weight
        held = (t.to(dtype) >= self.duration_s)[..., None]
        last = table[0, -1]
        q = torch.where(held, last, values[0])
        zero = torch.zeros((), **like)
        return q, torch.where(held, zero, values[1]), torch.where(held, zero, values[2])

    def check_times(self, rate_hz: float) -> Tensor:
        """
        Return the times a limit check samples: the samples at ``rate_hz``, then the hold.

        :param rate_hz: rate of the check, Hz.
        :return: ``(K,)`` float64, s, from 0 to one step past :attr:`duration_s`.
        """
        steps = int(math.floor(self.duration_s * rate_hz + 1e-9)) + 2
        return torch.arange(steps, dtype=torch.float64) / rate_hz

    def reorder(self, joint_names: Sequence[str]) -> 'SampledTrajectory':
        """
        Return the same trajectory with its columns in another joint order.

        :param joint_names: the same joints in the wanted order.
        :return: the reordered trajectory.
        :raises ValueError: when the joints differ (the message lists both sets).
        """
        index = joint_order(self.joint_names, joint_names)
        return SampledTrajectory(tuple(joint_names), self.rate_hz, self.q[:, index])


def joint_order(given: Sequence[str], wanted: Sequence[str]) -> list:
    """
    Return where each wanted joint stands among the given ones (both the same set).

    :param given: a trajectory's joints.
    :param wanted: the same joints in the wanted order (a robot's).
    :return: ``index`` with ``given[index[k]] == wanted[k]``.
    :raises ValueError: when the joints differ (the message lists both sets).
    """
    if sorted(wanted) != sorted(given) or len(set(wanted)) != len(wanted):
        missing = sorted(set(wanted) - set(given))
        extra = sorted(set(given) - set(wanted))
        raise ValueError(f'joint names do not match the robot: missing {missing}, '
                         f'unknown {extra}')
    return [list(given).index(j) for j in wanted]


def sampled_document(joint_names: Sequence[str], rate_hz: float, q: Any, robot: str,
                     extra: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """
    Return a sampled trajectory as a plain mapping (the content of its YAML file).

    :param joint_names: joints of the columns of ``q``.
    :param rate_hz: sample rate, Hz.
    :param q: ``(T, n)`` positions, rad or m (array-like or tensor).
    :param robot: catalog name of the robot (informative).
    :param extra: further plain entries (how it was made).
    :return: the mapping of the module docstring (validated by :class:`SampledTrajectory`).
    """
    trajectory = SampledTrajectory(tuple(joint_names), float(rate_hz), q)
    return {'kind': KIND, 'robot': robot, 'joint_names': list(trajectory.joint_names),
            'rate_hz': trajectory.rate_hz, 'duration_s': trajectory.duration_s,
            'q': trajectory.q.T.tolist(), **dict(extra or {})}
