"""
How well a recording excites the identifiable dynamics of a robot.

Inverse dynamics is linear in the base parameters (:func:`diffsim_ros.sysid.nea.
base_parameters`): ``tau = W_base(q, qd, qdd) beta``.  Data determine ``beta`` only as well as
the stacked base regressor of the samples is conditioned.  The measure here is that of the
identification literature (Gautier & Khalil 1992, Swevers et al. 1997): the condition number
of the base regressor with its columns scaled to unit norm, the same quantity NEA reports as
``condition_number`` after its fit (unweighted), computed before any fit.

A robot at rest excites only the gravity columns at one configuration, a joint turning at
constant velocity no acceleration columns: the regressor loses rank (condition number
infinite), or, with sensor noise, keeps it only through the noise.  Measured on this
package's robots (double pendulum, Qube, Panda): chirps and multisines 5-30, the recorded
Qube chirps and swing-ups 12-19, the cart-pole's 3, the Panda's published excitation
trajectory 10; the same robots at rest or at constant velocity, with derivatives filtered
from positions carrying 1e-4 to 1e-3 rad of noise, 650 to 1e6 (without noise: infinite or
above 1e5).  Sensor noise alone lends a motionless recording some rank: the more noise, the
lower its condition number.
"""

from dataclasses import asdict, dataclass
import math
from typing import Any, Dict, Optional, Sequence

import numpy as np
import torch

from .dataset import Trajectory
from .nea import base_parameters, RegressorColumns
from ..core.model import RobotModel


@dataclass(frozen=True)
class Excitation:
    """
    Conditioning of the base regressor of a data set.

    :param condition_number: largest over smallest singular value of the column-normalised
        base regressor (``inf`` when a base parameter has no signal at all).
    :param rank: numerical rank of that regressor (singular values above ``max(shape) eps``
        of the largest, as :func:`~diffsim_ros.sysid.nea.least_squares` counts them).
    :param base_parameters: number of base parameters (the rank full excitation reaches).
    :param samples: samples stacked.
    :param least_excited: expression of the base parameter that dominates the direction of
        the smallest singular value (what the data tell least about).
    """

    condition_number: float
    rank: int
    base_parameters: int
    samples: int
    least_excited: str

    def to_dict(self) -> Dict[str, Any]:
        """
        Return the fields as a JSON-ready mapping (``inf`` as ``None``).

        :return: the mapping.
        """
        out = asdict(self)
        if not math.isfinite(self.condition_number):
            out['condition_number'] = None
        return out


def excitation(model: RobotModel, runs: Sequence[Trajectory],
               columns: Optional[RegressorColumns] = None) -> Excitation:
    """
    Measure how well runs excite a robot's base parameters (see the module docstring).

    :param model: the robot (kinematics only).
    :param runs: trajectories with ``q``, ``qd`` and ``qdd`` (joints in any order, matched by
        name), e.g. the training runs of a fit.
    :param columns: regressor layout (default: inertial + viscous + Coulomb, NEA's).
    :return: the measure.
    :raises ValueError: when a run lacks velocities or accelerations, or there are no samples.
    """
    model = model.to(dtype=torch.float64, device='cpu')
    base = base_parameters(model, columns)
    states = []
    for run in runs:
        if run.qd is None or run.qdd is None:
            raise ValueError(f'run {run.run!r} has no qd or qdd; estimate derivatives first')
        run = run.reorder(model.joint_names).to(dtype=torch.float64, device='cpu')
        states.append((run.q, run.qd, run.qdd))
    if not states or not sum(len(q) for q, _, _ in states):
        raise ValueError('excitation: no samples')
    q, qd, qdd = (torch.cat(parts) for parts in zip(*states))
    r = len(base.independent)
    with torch.no_grad():
        A = base.regressor(model, q, qd, qdd).reshape(-1, r).numpy()
    norms = np.linalg.norm(A, axis=0)
    A = A / np.where(norms > 0, norms, 1.0)
    _, singular, Vt = np.linalg.svd(A, full_matrices=False)
    rank = int(np.sum(singular > singular[0] * max(A.shape) * np.finfo(float).eps)) \
        if singular[0] > 0 else 0
    condition = float(singular[0] / singular[-1]) if singular[-1] > 0 else math.inf
    weakest = int(np.argmax(np.abs(Vt[-1])))
    return Excitation(condition_number=condition, rank=rank, base_parameters=r,
                      samples=int(q.shape[0]),
                      least_excited=base.expressions(digits=3)[weakest])


__all__ = ['Excitation', 'excitation']
