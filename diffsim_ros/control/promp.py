"""
Probabilistic movement primitives (ProMP) for joint trajectories that start and end at rest.

A ProMP (Paraschos et al. 2013) writes joint ``j``'s trajectory as a weighted sum of basis
functions of the phase ``z = t / duration`` in ``[0, 1]`` and keeps a Gaussian over the
weights; sampling weights samples trajectories.  The basis is the normalised Gaussian one::

    b_i(z) = exp(-(z - c_i)^2 / (2 h^2)),   phi_i(z) = b_i(z) / sum_k b_k(z),

``n_basis`` centres ``c_i`` evenly over ``[0, 1]`` and ``h = width / (n_basis - 1)``.

Boundary conditions are built in rather than penalised: with ``Phi(z)`` the ``(n_basis,)``
row of basis values, a joint's trajectory is ``q_j(t) = q_home_j + Phi(z) w_j`` and the
conditions ``Phi(0) w = 0`` (start at home), ``Phi'(0) w = 0``, ``Phi''(0) w = 0`` (start at
rest), ``Phi'(1) w = 0``, ``Phi''(1) w = 0`` (end at rest) are linear in ``w``.  ``N`` is an
orthonormal basis of their null space (``n_basis x k``, ``k = n_basis - 5``) and
``w_j = N theta_j``: every ``theta`` in ``R^(n_joints k)`` gives a trajectory that meets the
conditions exactly, so the search distribution lives on ``theta`` and wastes no exploration.
After ``duration`` the arm holds the final posture (velocity and acceleration zero).

Reference: A. Paraschos, C. Daniel, J. Peters, G. Neumann, "Probabilistic Movement
Primitives", NeurIPS 2013.
"""

from dataclasses import dataclass, field
from typing import Callable, Tuple

import torch

Tensor = torch.Tensor

__all__ = ['ProMP', 'normalized_gaussian_basis']

#: The boundary rows of :class:`ProMP`: (phase, derivative order).
BOUNDARY = ((0.0, 0), (0.0, 1), (0.0, 2), (1.0, 1), (1.0, 2))


def normalized_gaussian_basis(z: Tensor, n_basis: int,
                              width: float = 1.0) -> Tuple[Tensor, Tensor, Tensor]:
    """
    Return the normalised Gaussian basis and its first two derivatives in the phase.

    :param z: phases ``(...,)``, any real values (the basis is smooth everywhere).
    :param n_basis: number of basis functions, >= 2.
    :param width: bandwidth in units of the centre spacing, > 0.
    :return: ``(phi, dphi/dz, d2phi/dz2)`` each ``(..., n_basis)``.
    :raises ValueError: ``n_basis < 2`` or ``width <= 0``.
    """
    if n_basis < 2 or not width > 0:
        raise ValueError(f'need n_basis >= 2 and width > 0, got {n_basis}, {width}')
    c = torch.linspace(0.0, 1.0, n_basis, dtype=z.dtype, device=z.device)
    h2 = (width / (n_basis - 1)) ** 2
    d = z[..., None] - c
    b = torch.exp(-0.5 * d * d / h2)
    db = -d / h2 * b
    ddb = (d * d / (h2 * h2) - 1.0 / h2) * b
    s, ds, dds = b.sum(-1, True), db.sum(-1, True), ddb.sum(-1, True)
    phi = b / s
    dphi = db / s - b * ds / s ** 2
    ddphi = ddb / s - 2.0 * db * ds / s ** 2 - b * dds / s ** 2 + 2.0 * b * ds ** 2 / s ** 3
    return phi, dphi, ddphi


@dataclass(frozen=True)
class ProMP:
    """
    A ProMP over ``n_joints`` joints that starts at ``q_home`` at rest and ends at rest.

    :param q_home: start configuration ``(n_joints,)``, rad.
    :param duration: length of the movement, s (> 0); the posture is held afterwards.
    :param n_basis: basis functions per joint (> 5: five are spent on the boundary).
    :param width: basis bandwidth in centre spacings.
    """

    q_home: Tuple[float, ...]
    duration: float
    n_basis: int = 10
    width: float = 1.0
    null_space: Tensor = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Check the options and build the null space of the boundary conditions."""
        if not self.duration > 0:
            raise ValueError(f'duration must be > 0, got {self.duration}')
        if self.n_basis <= len(BOUNDARY):
            raise ValueError(f'n_basis must exceed {len(BOUNDARY)} (the boundary '
                             f'conditions), got {self.n_basis}')
        object.__setattr__(self, 'q_home', tuple(float(v) for v in self.q_home))
        z = torch.tensor([0.0, 1.0], dtype=torch.float64)
        rows = normalized_gaussian_basis(z, self.n_basis, self.width)
        A = torch.stack([rows[order][int(phase)] for phase, order in BOUNDARY])
        _, _, Vh = torch.linalg.svd(A)
        object.__setattr__(self, 'null_space', Vh[len(BOUNDARY):].T.contiguous())

    @property
    def n_joints(self) -> int:
        """Return the number of joints."""
        return len(self.q_home)

    @property
    def n_free(self) -> int:
        """Return the free weights per joint, ``n_basis - 5``."""
        return self.n_basis - len(BOUNDARY)

    @property
    def dim(self) -> int:
        """Return the length of a parameter vector ``theta``, ``n_joints * n_free``."""
        return self.n_joints * self.n_free

    def features(self, times: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """
        Return the constrained features ``G(t) = Phi(z) N`` and their time derivatives.

        :param times: ``(T,)`` s from the movement's start.
        :return: ``(G, dG/dt, d2G/dt2)`` each ``(T, n_free)``; after ``duration`` the
            first is held and the derivatives are zero.
        """
        z = (times / self.duration).clamp(0.0, 1.0)
        phi, dphi, ddphi = normalized_gaussian_basis(z, self.n_basis, self.width)
        N = self.null_space.to(times)
        moving = ((times >= 0) & (times <= self.duration)).to(times)[:, None]
        return (phi @ N, moving * (dphi @ N) / self.duration,
                moving * (ddphi @ N) / self.duration ** 2)

    def trajectory(self, theta: Tensor, times: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """
        Return the joint trajectory of parameter vectors, batched.

        :param theta: ``(..., dim)``, joint-major (joint 0's ``n_free`` weights first), rad.
        :param times: ``(T,)`` s.
        :return: ``(q, qd, qdd)`` each ``(..., T, n_joints)`` in rad, rad/s, rad/s^2.
        :raises ValueError: ``theta`` of the wrong length.
        """
        if theta.shape[-1] != self.dim:
            raise ValueError(f'theta: expected (..., {self.dim}), got {tuple(theta.shape)}')
        W = theta.reshape(theta.shape[:-1] + (self.n_joints, self.n_free))
        G, dG, ddG = self.features(times.to(theta))
        home = torch.as_tensor(self.q_home, dtype=theta.dtype, device=theta.device)
        q = home + torch.einsum('tk,...jk->...tj', G, W)
        qd = torch.einsum('tk,...jk->...tj', dG, W)
        qdd = torch.einsum('tk,...jk->...tj', ddG, W)
        return q, qd, qdd

    def reference(self, theta: Tensor,
                  t0: float = 0.0) -> Callable[[Tensor], Tuple[Tensor, Tensor, Tensor]]:
        """
        Return a tracking reference ``times (T,) -> (q, qd, qdd)`` of one parameter vector.

        The form :class:`~diffsim_ros.control.baselines.ComputedTorque` takes; before ``t0``
        the arm is held at home.

        :param theta: ``(dim,)``.
        :param t0: start of the movement, s.
        :return: the reference function.
        """
        theta = theta.detach().clone()

        def reference(times: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
            return self.trajectory(theta.to(times.dtype), times - t0)

        return reference

    def time_grid(self, dt: float, hold: float = 0.0,
                  dtype: torch.dtype = torch.float64) -> Tensor:
        """
        Return the sample times ``0, dt, ...`` over the movement and a hold after it.

        :param dt: step, s.
        :param hold: extra time at rest after ``duration``, s.
        :param dtype: dtype of the result.
        :return: ``(T,)`` s with ``T = round((duration + hold) / dt) + 1``.
        """
        steps = int(round((self.duration + hold) / dt))
        return dt * torch.arange(steps + 1, dtype=dtype)
