"""
LQR of a model at an equilibrium: linearisation, discrete Riccati equation, gain and law.

Used by the baselines (the balance LQR of :class:`~diffsim_ros.control.baselines.SwingUpLQR`)
and by iLQR, whose swing-up solves start from the LQR's closed-loop rollout whenever it costs
less than the warm start (:class:`~diffsim_ros.control.ilqr.ILQR`).
"""

from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from .dynamics import ModelDynamics
from .policy import state_error

Tensor = torch.Tensor

__all__ = ['LinearLaw', 'linearize', 'lqr_gain', 'lqr_law', 'solve_dare']


def linearize(dynamics: ModelDynamics, x: Tensor, u: Tensor) -> Tuple[Tensor, Tensor]:
    """
    Return the Jacobians of one model step by autograd.

    :param dynamics: the discrete model ``x' = f(x, u)``.
    :param x: state ``(nx,)``.
    :param u: command ``(nu,)``.
    :return: ``(A (nx, nx), B (nx, nu))`` with ``A = df/dx``, ``B = df/du``.
    """
    A, B = torch.autograd.functional.jacobian(dynamics.step, (x.detach(), u.detach()))
    return A.detach(), B.detach()


def solve_dare(A: Tensor, B: Tensor, Q: Tensor, R: Tensor, tolerance: float = 1e-12,
               max_iterations: int = 100) -> Tensor:
    """
    Solve the discrete algebraic Riccati equation by the structured doubling algorithm.

    ``P = A^T P A - A^T P B (R + B^T P B)^-1 B^T P A + Q``; the iteration converges
    quadratically for stabilisable ``(A, B)`` and detectable ``(A, Q)``.

    :param A: ``(nx, nx)``.
    :param B: ``(nx, nu)``.
    :param Q: ``(nx, nx)`` symmetric positive semi-definite.
    :param R: ``(nu, nu)`` symmetric positive definite.
    :param tolerance: relative change of ``P`` that ends the iteration.
    :param max_iterations: doubling steps at most.
    :return: ``P (nx, nx)``.
    :raises ValueError: no convergence (e.g. an unstabilisable pair).
    """
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    G = B @ torch.linalg.solve(R, B.mT)
    H, Ak = Q.clone(), A.clone()
    for _ in range(max_iterations):
        W = eye + G @ H
        W_A = torch.linalg.solve(W, Ak)
        W_G = torch.linalg.solve(W, G)
        H_next = H + Ak.mT @ H @ W_A
        G = G + Ak @ W_G @ Ak.mT
        Ak = Ak @ W_A
        if not bool(torch.isfinite(H_next).all()):
            break
        change = float((H_next - H).abs().max()) / max(float(H_next.abs().max()), 1e-300)
        H = H_next
        if change < tolerance:
            return 0.5 * (H + H.mT)
    raise ValueError('the Riccati iteration did not converge: is (A, B) stabilisable?')


def lqr_gain(dynamics: ModelDynamics, x_eq: Tensor, u_eq: Tensor, Q: Tensor,
             R: Tensor) -> Tensor:
    """
    Return the infinite-horizon discrete LQR gain of the model linearised at an equilibrium.

    Only the smooth, passive part of the model is linearised: Coulomb friction is left out
    (its tanh has a slope ``F / eps`` at rest, no damping the plant provides: the force is
    the same in any direction of motion), and so is an extra friction module (a sigmoid's
    slope at rest is Coulomb-like too), and negative damping, which an unconstrained fit
    (NEA) can return, is taken as zero; on the Qube both turned refitted gains unstable.

    :param dynamics: the model; its ``dt`` is the period the gain is applied at.
    :param x_eq: equilibrium state ``(nx,)``.
    :param u_eq: equilibrium command ``(nu,)``.
    :param Q: state weight ``(nx, nx)``.
    :param R: command weight ``(nu, nu)``.
    :return: ``K (nu, nx)``, the optimal law being ``u = u_eq - K (x - x_eq)``.
    """
    model = dynamics.model
    dynamics = dynamics.with_model(model.replace(friction=torch.zeros_like(model.friction),
                                                 damping=model.damping.clamp_min(0.0)),
                                   friction_model=None)
    A, B = linearize(dynamics, x_eq, u_eq)
    P = solve_dare(A, B, Q, R)
    return torch.linalg.solve(R + B.mT @ P @ B, B.mT @ P @ A)


@dataclass(frozen=True, eq=False)
class LinearLaw:
    """
    The affine feedback law ``u = clip(u_goal - K (x - x_goal))``, angle errors wrapped.

    :param K: gain ``(nu, nx)``, finite.
    :param x_goal: equilibrium state ``(nx,)``.
    :param u_goal: equilibrium command ``(nu,)``.
    :param angle_mask: ``(nx,)`` entries of ``x - x_goal`` wrapped to ``(-pi, pi]``, or None.
    :param u_min: ``(nu,)`` lower command limits.
    :param u_max: ``(nu,)`` upper command limits.
    :raises ValueError: a non-finite gain.
    """

    K: Tensor
    x_goal: Tensor
    u_goal: Tensor
    angle_mask: Optional[Tensor]
    u_min: Tensor
    u_max: Tensor

    def __post_init__(self) -> None:
        """Refuse a gain that would command NaN."""
        if not bool(torch.isfinite(self.K).all()):
            raise ValueError('the feedback gain is not finite')

    def __call__(self, x: Tensor) -> Tensor:
        """
        Evaluate the law.

        :param x: states ``(..., nx)``.
        :return: commands ``(..., nu)``.
        """
        error = state_error(x.to(self.K), self.x_goal, self.angle_mask)
        u = self.u_goal - (self.K @ error.unsqueeze(-1)).squeeze(-1)
        return torch.minimum(torch.maximum(u, self.u_min), self.u_max)

    def nearest_goal(self, x: Tensor) -> Tensor:
        """
        Return the copy of the goal nearest ``x`` (angles shifted by whole turns).

        ``x - nearest_goal(x)`` is the wrapped error, so that around ``x`` the law is the
        plain affine one of that goal (what the compiled closed-loop rollout applies).

        :param x: a state ``(nx,)``.
        :return: ``(nx,)``.
        """
        x = x.to(self.K)
        return x - state_error(x, self.x_goal, self.angle_mask)


def lqr_law(dynamics: ModelDynamics, x_goal: Tensor, Q: Tensor, R: Tensor,
            angle_mask: Optional[Tensor] = None,
            u_goal: Optional[Tensor] = None) -> LinearLaw:
    """
    Return the LQR feedback law of the model at a goal (e.g. an iLQR guess, see ``ILQR``).

    :param dynamics: the model; its ``dt`` is the period of the law.
    :param x_goal: equilibrium state ``(nx,)``.
    :param Q: state weight ``(nx, nx)``.
    :param R: command weight ``(nu, nu)``.
    :param angle_mask: ``(nx,)`` entries of ``x - x_goal`` wrapped to ``(-pi, pi]``.
    :param u_goal: equilibrium command ``(nu,)``; zeros when None.
    :return: the law ``u = clip(u_goal - K (x - x_goal))``.
    """
    like = dynamics.u_min
    f64 = {'dtype': torch.float64, 'device': like.device}
    # the Riccati iteration runs in float64 whatever the solver's dtype
    work = dynamics if like.dtype == torch.float64 else dynamics.with_model(
        dynamics.model.to(dtype=torch.float64), compile=False)
    x_goal = torch.as_tensor(x_goal).to(**f64)
    u_goal = torch.zeros(dynamics.nu, **f64) if u_goal is None else \
        torch.as_tensor(u_goal).to(**f64)
    K = lqr_gain(work, x_goal, u_goal, torch.as_tensor(Q).to(**f64),
                 torch.as_tensor(R).to(**f64))
    return LinearLaw(K=K.to(like), x_goal=x_goal.to(like), u_goal=u_goal.to(like),
                     angle_mask=angle_mask.to(device=like.device)
                     if angle_mask is not None else None,
                     u_min=dynamics.u_min, u_max=dynamics.u_max)
