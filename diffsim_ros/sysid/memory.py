"""
A memory of the most informative stretches of past data, for identification on a window.

A sliding window forgets: once a robot has been holding still (a pendulum balancing, an arm
parked) for a window's length, the window carries almost no information about the inertial
and friction parameters, and refits on it drift wherever the weakly constrained directions
let them.  Concurrent learning (Chowdhary & Johnson, 2010) answers this with a history stack
chosen to keep the data's information matrix well conditioned; :class:`SegmentMemory` does the
same for the base parameters of a rigid-body model.

Data are cut into cells of ``segment`` s on a fixed time grid.  A cell's information is the
Gram matrix ``W^T W`` of its base regressor (inertial, viscous and Coulomb columns, see
:func:`~diffsim_ros.sysid.nea.base_parameters`) per sample, and a set of cells is worth
``log det(sum_k I_k + eps R)``, with ``R`` the per-sample Gram of random states (so the value
does not depend on the units of the parameters, and ``eps R`` keeps a rank-deficient set
comparable).  A new cell joins while there is room, and later replaces the member whose
removal costs the least if that raises the set's value.
"""

from dataclasses import dataclass
import math
from typing import Dict, List, Optional

import torch

from .dataset import Trajectory
from .nea import _random_states, base_parameters
from ..core import RobotModel

__all__ = ['SegmentMemory']

Tensor = torch.Tensor

#: Samples per regressor evaluation in :meth:`SegmentMemory.information`.
_CHUNK = 64


@dataclass(frozen=True)
class _Cell:
    traj: Trajectory
    information: Tensor   # (r, r) per-sample Gram of the base regressor
    start: float
    end: float


class SegmentMemory:
    """
    Keep the ``capacity`` cells of past data that best determine the base parameters.

    :param model: the robot (its kinematics give the regressor).
    :param capacity: cells kept; 0 keeps none.
    :param segment: cell length, s.
    :param max_age: cells whose end is older than this (s) before the newest data are
        forgotten (``inf``: never), so that a changed robot (a new payload) is eventually fit
        on its own data alone.
    :param coverage: fraction of a cell the offered data must cover for it to count.
    :param eps: weight of the reference information in the set's value.
    """

    def __init__(self, model: RobotModel, capacity: int = 4, segment: float = 1.0,
                 max_age: float = math.inf, coverage: float = 0.9, eps: float = 1e-3) -> None:
        """Find the base parameters and the reference information of ``model``."""
        if capacity < 0:
            raise ValueError(f'capacity must be >= 0, got {capacity}')
        if not (math.isfinite(segment) and segment > 0):
            raise ValueError(f'segment must be a positive number of seconds, got {segment}')
        if not max_age > 0:
            raise ValueError(f'max_age must be > 0 (inf: never forget), got {max_age}')
        if not 0.0 < coverage <= 1.0:
            raise ValueError(f'coverage must be in (0, 1], got {coverage}')
        self.capacity, self.segment, self.max_age = int(capacity), float(segment), max_age
        self.coverage, self.eps = coverage, eps
        self.model = model.to(dtype=torch.float64, device='cpu')
        self.base = base_parameters(self.model)
        q, qd, qdd = _random_states(self.model, 200, torch.Generator().manual_seed(0))
        W = self.base.regressor(self.model, q, qd, qdd).reshape(-1, self.base.structural_rank)
        self.reference = W.T @ W / q.shape[0]
        self._cells: Dict[int, _Cell] = {}
        # cells already weighed (kept or not): a sliding window offers each one many times
        self._seen: set = set()

    def __len__(self) -> int:
        """Return the number of cells kept."""
        return len(self._cells)

    def clear(self) -> None:
        """Forget every cell."""
        self._cells.clear()
        self._seen.clear()

    def information(self, traj: Trajectory) -> Tensor:
        """
        Return the per-sample information matrix of some data.

        :param traj: samples with ``qd`` and ``qdd``.
        :return: ``(r, r)`` ``W^T W / T`` of the base regressor.
        """
        if traj.qd is None or traj.qdd is None:
            raise ValueError('the memory needs velocities and accelerations')
        like = {'dtype': torch.float64, 'device': 'cpu'}
        q, qd, qdd = (x.detach().to(**like) for x in (traj.q, traj.qd, traj.qdd))
        r = self.base.structural_rank
        total = torch.zeros(r, r, **like)
        # in chunks: the regressor's temporaries of a whole cell (a 7-DOF arm at 1 kHz) are
        # tens of MB, and allocations that size fragmented the node's heap (RSS kept growing)
        for start in range(0, q.shape[0], _CHUNK):
            W = self.base.regressor(self.model, q[start:start + _CHUNK],
                                    qd[start:start + _CHUNK], qdd[start:start + _CHUNK])
            W = W.reshape(-1, r)
            total += W.T @ W
        return total / max(traj.t.shape[0], 1)

    def value(self, informations: List[Tensor]) -> float:
        """
        Return ``log det(sum I_k + eps R)`` relative to ``log det(R)``.

        :param informations: per-cell information matrices.
        :return: the set's value (0 for an empty set with ``eps = 1``).
        """
        total = self.eps * self.reference
        for information in informations:
            total = total + information
        return float(torch.linalg.slogdet(total)[1] - torch.linalg.slogdet(self.reference)[1])

    def offer(self, runs: List[Trajectory]) -> int:
        """
        Offer new data: every grid cell they cover may join the memory.

        Each cell is weighed once, the first time the data cover it: a sliding window offers
        the same cells at every refit, and computing their regressors again would cost a
        window's worth of regressors per refit.

        :param runs: trajectories with ``qd`` and ``qdd`` (e.g. a window's usable stretches).
        :return: number of cells now kept.
        """
        if self.capacity == 0:
            return 0
        newest = max((float(r.t[-1]) for r in runs if r.t.numel()), default=None)
        if newest is not None and math.isfinite(self.max_age):
            self._cells = {k: c for k, c in self._cells.items()
                           if c.end >= newest - self.max_age}
        cells = self._cut(runs, skip=self._seen)
        first = min((float(r.t[0]) for r in runs if r.t.numel()), default=None)
        if first is not None:   # older cells cannot come back (a jump back in time clears)
            self._seen = {key for key in self._seen if key >= math.floor(first / self.segment)}
        self._seen.update(cells)
        for key, cell in cells.items():
            if len(self._cells) < self.capacity:
                self._cells[key] = cell
                continue
            kept = list(self._cells)
            infos = [self._cells[k].information for k in kept]
            best, best_value = None, self.value(infos)
            for i in range(len(kept)):
                trial = self.value(infos[:i] + infos[i + 1:] + [cell.information])
                if trial > best_value:
                    best, best_value = kept[i], trial
            if best is not None:
                del self._cells[best]
                self._cells[key] = cell
        return len(self._cells)

    def runs(self, before: Optional[float] = None) -> List[Trajectory]:
        """
        Return the kept cells, oldest first.

        :param before: only cells that end before this time (s), e.g. the start of the
            window they will be fit with, so that no sample is used twice.
        :return: one trajectory per cell, named ``memory/<start>``.
        """
        cells = sorted(self._cells.values(), key=lambda c: c.start)
        return [c.traj for c in cells if before is None or c.end < before]

    def spans(self) -> List[tuple]:
        """Return the ``(start, end)`` times of the kept cells, oldest first."""
        return sorted((c.start, c.end) for c in self._cells.values())

    def _cut(self, runs: List[Trajectory], skip: set) -> Dict[int, _Cell]:
        cells = {}
        for traj in runs:
            if traj.t.numel() < 2:
                continue
            t = traj.t.detach().to(torch.float64).cpu()
            dt = float((t[-1] - t[0]) / (t.numel() - 1))
            first = math.floor(float(t[0]) / self.segment)
            last = math.floor(float(t[-1]) / self.segment)
            for key in range(first, last + 1):
                if key in skip or key in cells:
                    continue
                start, end = key * self.segment, (key + 1) * self.segment
                index = torch.nonzero((t >= start) & (t < end)).flatten()
                if index.numel() < 2 or index.numel() * dt < self.coverage * self.segment:
                    continue
                piece = _owned(traj.crop(int(index[0]), int(index[-1]) + 1).replace(
                    run=f'memory/{start:.3f}'))
                cells[key] = _Cell(piece, self.information(piece), float(t[index[0]]),
                                   float(t[index[-1]]))
        return cells


def _owned(traj: Trajectory) -> Trajectory:
    """Return a copy whose tensors own their memory (a crop would keep a whole window alive)."""
    def own(x):
        return None if x is None else x.detach().clone()
    return traj.replace(t=own(traj.t), q=own(traj.q), qd=own(traj.qd), qdd=own(traj.qdd),
                        tau=own(traj.tau), u=own(traj.u),
                        poses={k: own(v) for k, v in traj.poses.items()})
