"""
Trajectory data in the form every estimator consumes.

A :class:`Trajectory` is one contiguous run of one robot, sampled at (possibly non-uniform)
times, with joint columns in the order of ``joint_names``.  Datasets are lists of runs;
splits are made by run, never by shuffling samples across runs.
"""

from dataclasses import dataclass, field, replace
from typing import Mapping, Optional, Sequence

import torch

from ..core.errors import ShapeError

Tensor = torch.Tensor


@dataclass(frozen=True, eq=False)
class Trajectory:
    """
    One recorded or simulated run.

    ``t`` is ``(T,)`` in s, strictly increasing; ``q``, ``qd``, ``qdd``, ``tau`` are ``(T, n)``
    (rad or m, per s, per s^2, N m or N) with columns in ``joint_names`` order; ``u`` is
    ``(T, m)`` commands when they differ from joint torques (e.g. motor voltage, V);
    ``poses`` maps tracked body names to ``(T, 4, 4)`` world poses (motion capture).
    Missing signals are ``None`` and can be derived by :mod:`diffsim_ros.sysid.filters`.
    """

    t: Tensor
    q: Tensor
    joint_names: tuple
    qd: Optional[Tensor] = None
    qdd: Optional[Tensor] = None
    tau: Optional[Tensor] = None
    u: Optional[Tensor] = None
    poses: Mapping[str, Tensor] = field(default_factory=dict)
    run: str = ''

    def __post_init__(self):
        if self.t.dim() != 1:
            raise ShapeError(f'Trajectory.t: expected shape (T,), got {tuple(self.t.shape)}')
        T, n = self.t.shape[0], len(self.joint_names)
        for name in ('q', 'qd', 'qdd', 'tau'):
            value = getattr(self, name)
            if value is not None and tuple(value.shape) != (T, n):
                raise ShapeError(f'Trajectory.{name}: expected shape ({T}, {n}), '
                                 f'got {tuple(value.shape)}')
        if self.u is not None and (self.u.dim() != 2 or self.u.shape[0] != T):
            raise ShapeError(f'Trajectory.u: expected shape ({T}, m), got {tuple(self.u.shape)}')
        for body, pose in self.poses.items():
            if tuple(pose.shape) != (T, 4, 4):
                raise ShapeError(f'Trajectory.poses[{body!r}]: expected shape ({T}, 4, 4), '
                                 f'got {tuple(pose.shape)}')
        if T > 1 and not bool((self.t[1:] > self.t[:-1]).all()):
            raise ValueError(f'Trajectory {self.run!r}: timestamps must be strictly increasing')

    def __len__(self) -> int:
        """Return the number of samples."""
        return self.t.shape[0]

    @property
    def n(self) -> int:
        """Return the number of joints."""
        return len(self.joint_names)

    @property
    def duration(self) -> float:
        """Return the time span in s."""
        return float(self.t[-1] - self.t[0]) if len(self) else 0.0

    def replace(self, **changes) -> 'Trajectory':
        """Return a copy with some fields replaced (validated again)."""
        return replace(self, **changes)

    def crop(self, start: int, stop: int) -> 'Trajectory':
        """
        Return samples ``start:stop`` as a new trajectory.

        :param start: first index.
        :param stop: one past the last index.
        :return: the sub-trajectory (same run name).
        """
        def cut(x):
            return None if x is None else x[start:stop]
        return replace(self, t=self.t[start:stop], q=self.q[start:stop], qd=cut(self.qd),
                       qdd=cut(self.qdd), tau=cut(self.tau), u=cut(self.u),
                       poses={k: v[start:stop] for k, v in self.poses.items()})

    def to(self, dtype: Optional[torch.dtype] = None,
           device: Optional[torch.device] = None) -> 'Trajectory':
        """Return a copy with all tensors converted."""
        def conv(x):
            return None if x is None else x.to(dtype=dtype, device=device)
        return replace(self, t=self.t.to(dtype=dtype, device=device), q=conv(self.q),
                       qd=conv(self.qd), qdd=conv(self.qdd), tau=conv(self.tau), u=conv(self.u),
                       poses={k: conv(v) for k, v in self.poses.items()})

    def reorder(self, joint_names: Sequence[str]) -> 'Trajectory':
        """
        Return the trajectory with joint columns in the given order (mapping by name).

        :param joint_names: target order, e.g. ``model.joint_names``.
        :return: reordered trajectory.
        :raises KeyError: naming joints the trajectory lacks.
        """
        missing = [j for j in joint_names if j not in self.joint_names]
        if missing:
            raise KeyError(f'trajectory {self.run!r} has no joint(s) {missing}; it has '
                           f'{list(self.joint_names)}')
        index = torch.tensor([self.joint_names.index(j) for j in joint_names])

        def pick(x):
            return None if x is None else x.index_select(-1, index.to(x.device))
        return replace(self, q=pick(self.q), qd=pick(self.qd), qdd=pick(self.qdd),
                       tau=pick(self.tau), joint_names=tuple(joint_names))
