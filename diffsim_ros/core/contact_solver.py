"""
Batched solver of the velocity-level contact problem with Coulomb friction cones.

Anitescu's convex time step (Anitescu, "Optimization-based simulation of nonsmooth rigid
multibody dynamics", Math. Program. 2006; the step ContactNets and the tensegrity engine
build on) finds the contact impulses ``lambda`` of ``nc`` contacts as the minimiser of

    0.5 lambda^T A lambda + b^T lambda   subject to   lambda_i in K(mu_i),

with ``A = J M^-1 J^T + eps I`` (the Delassus matrix, regularised), ``b`` the contact
velocities the step would reach without contact (plus the gap and restitution terms), and
``K(mu) = {(n, t1, t2): ||t|| <= mu n}`` the second-order friction cone of each contact.
Components are ordered ``[normal, tangent 1, tangent 2]`` per contact and contacts follow
each other (``m = 3 nc`` rows).

The solver is accelerated projected gradient with adaptive restart (Nesterov; the APGD of
Mazhar et al., "A scalable parallel method for large collision detection problems", 2015,
which Chrono uses for this very problem): every iteration is one batched matrix-vector
product and a closed-form cone projection, so a batch of independent bodies is one tensor
operation. Projected Gauss-Seidel was the alternative; it is sequential over contacts and
its coordinate projections stall on the coupled cone constraint. The gradients come from
the implicit function theorem applied to the fixed-point optimality condition
``lambda = P_K(lambda - alpha (A lambda + b))``: the backward solves one linear system
with the projection's Jacobian on the solution (its active set), never the iterations.

On CPU float32/float64 :func:`solve_contact_impulses` runs the same iterations, problem by
problem, in C++ (:mod:`~diffsim_ros.core.native_contact`), backward included, unless the
torch path is forced (``backend='torch'``, :func:`~diffsim_ros.core.set_backend`,
``$DIFFSIM_BACKEND``: the rules of :mod:`~diffsim_ros.core.dispatch`).
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

from . import native_contact
from .dispatch import _choice, BackendError

__all__ = ['project_friction_cone', 'solve_contact_impulses', 'contact_residual']

# Newton steps that polish the APGD iterate. They finish well-conditioned problems (random
# dense Delassus matrices: 4 steps to 1e-13); on a cube resting on a plane (24 impulse
# components, 6 degrees of freedom) the active set keeps changing under full steps and the
# polish rarely helps: there APGD alone sets the accuracy (see solve_contact_impulses).
_NEWTON_ITERATIONS = 10


def project_friction_cone(y: Tensor, mu: Tensor) -> Tensor:
    """
    Project points onto second-order friction cones (Euclidean projection).

    :param y: ``(..., nc, 3)`` points ``[normal, tangent 1, tangent 2]``.
    :param mu: ``(..., nc)`` friction coefficients, ``>= 0``.
    :return: ``(..., nc, 3)`` the nearest points of ``{||t|| <= mu n}``.
    """
    n = y[..., 0]
    t = y[..., 1:]
    s2 = (t * t).sum(-1)
    positive = s2 > 0
    # The safe norm keeps sqrt and the division finite on both branches of torch.where.
    s_safe = torch.sqrt(torch.where(positive, s2, torch.ones_like(s2)))
    s = torch.where(positive, s_safe, torch.zeros_like(s2))
    n_proj = (n + mu * s) / (1.0 + mu * mu)
    t_proj = (mu * n_proj / s_safe).unsqueeze(-1) * t
    boundary = torch.cat((n_proj.unsqueeze(-1), t_proj), -1)
    inside = (s <= mu * n).unsqueeze(-1)
    polar = (mu * s <= -n).unsqueeze(-1)
    return torch.where(inside, y, torch.where(polar, torch.zeros_like(y), boundary))


def _step_size(A: Tensor) -> Tensor:
    # 1 / L with L an upper bound of the largest eigenvalue of the symmetric positive
    # definite A: the smaller of the largest absolute row sum and the Frobenius norm.
    rows = A.abs().sum(-1).amax(-1)
    frobenius = torch.linalg.matrix_norm(A)
    return 1.0 / torch.minimum(rows, frobenius)


def contact_residual(A: Tensor, b: Tensor, mu: Tensor, lam: Tensor) -> Tensor:
    """
    Return the natural residual of the cone problem, in the units of ``b`` (velocity).

    ``|| (lambda - P_K(lambda - alpha (A lambda + b))) / alpha ||_inf``: zero exactly at the
    solution, and it bounds how far the complementarity conditions are violated.

    :param A: ``(..., m, m)`` regularised Delassus matrix, ``m = 3 nc``.
    :param b: ``(..., m)`` free contact velocities.
    :param mu: ``(..., nc)`` friction coefficients.
    :param lam: ``(..., m)`` impulses.
    :return: ``(...)`` residuals.
    """
    alpha = _step_size(A).unsqueeze(-1)
    grad = (A @ lam.unsqueeze(-1)).squeeze(-1) + b
    shape = lam.shape[:-1] + (-1, 3)
    projected = project_friction_cone((lam - alpha * grad).reshape(shape), mu)
    return ((lam - projected.reshape(lam.shape)) / alpha).abs().amax(-1)


def _apgd(A: Tensor, b: Tensor, mu: Tensor, tol: float, max_iter: int) -> Tuple[Tensor, int]:
    # Works on the flattened batch and drops converged problems every ten iterations, so a
    # batch costs what its unconverged members cost, not max_iter times the whole batch.
    m = b.shape[-1]
    out = torch.empty_like(b).reshape(-1, m)
    index = torch.arange(out.shape[0], device=b.device)
    A, b, mu = A.reshape(-1, m, m), b.reshape(-1, m), mu.reshape(-1, m // 3)
    alpha = _step_size(A).unsqueeze(-1)
    scale = 1.0 + b.abs().amax(-1)

    def prox(point: Tensor) -> Tensor:
        grad = (A @ point.unsqueeze(-1)).squeeze(-1) + b
        return project_friction_cone((point - alpha * grad).reshape(-1, m // 3, 3),
                                     mu).reshape(point.shape)

    lam = prox(torch.zeros_like(b))
    y = lam
    theta = torch.ones_like(scale)
    iteration = 0
    for iteration in range(1, max_iter + 1):
        lam_next = prox(y)
        if iteration % 10 == 0:
            done = (lam_next - y).abs().amax(-1) / alpha.squeeze(-1) <= tol * scale
            if bool(done.any()):
                out[index[done]] = lam_next[done]
                keep = ~done
                if not bool(keep.any()):
                    return out, iteration
                index, A, b, mu, alpha, scale = (index[keep], A[keep], b[keep], mu[keep],
                                                 alpha[keep], scale[keep])
                lam, lam_next, y, theta = lam[keep], lam_next[keep], y[keep], theta[keep]
        theta_next = 0.5 * (-theta ** 2 + theta * torch.sqrt(theta ** 2 + 4.0))
        beta = (theta * (1.0 - theta) / (theta ** 2 + theta_next)).unsqueeze(-1)
        y_next = lam_next + beta * (lam_next - lam)
        # Adaptive restart (O'Donoghue and Candes 2015): drop the momentum where it points
        # uphill, which keeps the method monotone enough on ill-conditioned Delassus matrices.
        uphill = ((y - lam_next) * (lam_next - lam)).sum(-1) > 0
        y = torch.where(uphill.unsqueeze(-1), lam_next, y_next)
        theta = torch.where(uphill, torch.ones_like(theta), theta_next)
        lam = lam_next
    out[index] = lam
    return out, iteration


def _projection_jacobians(point: Tensor, mu: Tensor) -> Tuple[Tensor, Tensor]:
    # Jacobians of the per-contact projection: d/dpoint (..., nc, 3, 3) and d/dmu (..., nc, 3).
    point = point.detach().requires_grad_(True)
    mu = mu.detach().requires_grad_(True)
    with torch.enable_grad():
        projected = project_friction_cone(point, mu)
        rows, mu_rows = [], []
        for k in range(3):
            d_point, d_mu = torch.autograd.grad(projected[..., k].sum(), (point, mu),
                                                retain_graph=k < 2)
            rows.append(d_point)
            mu_rows.append(d_mu)
    return torch.stack(rows, -2), torch.stack(mu_rows, -1)


def _fixed_point_matrix(A: Tensor, b: Tensor, mu: Tensor, lam: Tensor):
    # F(lambda) = lambda - P(lambda - alpha (A lambda + b)) and its generalized Jacobian
    # K = I - D (I - alpha A), D the projection's Jacobian; also d P / d mu and alpha.
    alpha = _step_size(A).unsqueeze(-1)
    grad = (A @ lam.unsqueeze(-1)).squeeze(-1) + b
    shape = lam.shape[:-1] + (-1, 3)
    point = (lam - alpha * grad).reshape(shape)
    D_blocks, D_mu = _projection_jacobians(point, mu)
    D = _block_diagonal(D_blocks)
    eye = torch.eye(lam.shape[-1], dtype=lam.dtype, device=lam.device)
    K = eye - D + alpha.unsqueeze(-1) * (D @ A)
    F = lam - project_friction_cone(point, mu).reshape(lam.shape)
    return F, K, D, D_mu, alpha


def _newton(A: Tensor, b: Tensor, mu: Tensor, lam: Tensor, tol: float,
            max_iter: int) -> Tuple[Tensor, int]:
    # Semismooth Newton on the fixed-point equation, from the APGD iterate: once the active
    # set is right it converges in a few steps where APGD crawls (a cube on a plane has 24
    # impulse components for 6 degrees of freedom, a badly conditioned Delassus matrix). A
    # step is kept only where it lowers the residual; elsewhere a projected gradient step.
    # A problem that has converged is left as it is, so that its solution does not depend
    # on the others in the batch (and matches the per-problem native kernel).
    scale = 1.0 + b.abs().amax(-1)
    for iteration in range(max_iter):
        F, K, _, _, alpha = _fixed_point_matrix(A, b, mu, lam)
        residual = F.abs().amax(-1) / alpha.squeeze(-1)
        open_ = residual > tol * scale
        if not bool(open_.any()):
            return lam, iteration
        step, _ = torch.linalg.solve_ex(K, -F)
        candidate = lam + step
        grad = (A @ candidate.unsqueeze(-1)).squeeze(-1) + b
        shape = lam.shape[:-1] + (-1, 3)
        F_new = candidate - project_friction_cone((candidate - alpha * grad).reshape(shape),
                                                  mu).reshape(lam.shape)
        residual_new = F_new.abs().amax(-1) / alpha.squeeze(-1)
        better = torch.isfinite(F_new).all(-1) & (residual_new < residual)
        lam = torch.where(open_.unsqueeze(-1),
                          torch.where(better.unsqueeze(-1), candidate, lam - F), lam)
    return lam, max_iter


class _ContactImpulses(torch.autograd.Function):
    """Cone-constrained QP solution with the implicit-function-theorem backward."""

    @staticmethod
    def forward(ctx, A, b, mu, tol, max_iter):
        lam, _ = _apgd(A, b, mu, tol, max_iter)
        m = b.shape[-1]
        A_flat, b_flat, mu_flat = A.reshape(-1, m, m), b.reshape(-1, m), mu.reshape(-1, m // 3)
        open_ = contact_residual(A_flat, b_flat, mu_flat, lam) > tol * (1.0 + b_flat.abs()
                                                                        .amax(-1))
        if bool(open_.any()):
            lam[open_] = _newton(A_flat[open_], b_flat[open_], mu_flat[open_], lam[open_], tol,
                                 _NEWTON_ITERATIONS)[0]
        lam = lam.reshape(b.shape)
        ctx.save_for_backward(A, b, mu, lam)
        return lam

    @staticmethod
    def backward(ctx, grad_lam):
        A, b, mu, lam = ctx.saved_tensors
        _, K, D, D_mu, alpha = _fixed_point_matrix(A, b, mu, lam)
        # Linearising lambda = P(lambda - alpha (A lambda + b)) gives
        # K d lambda = -alpha D (dA lambda + db) + D_mu dmu; the adjoint solves with K^T.
        w = torch.linalg.solve(K.mT, grad_lam.unsqueeze(-1)).squeeze(-1)
        grad_b = -alpha * (D.mT @ w.unsqueeze(-1)).squeeze(-1)
        grad_A = grad_b.unsqueeze(-1) * lam.unsqueeze(-2)
        grad_mu = (D_mu * w.reshape(D_mu.shape)).sum(-1)
        return grad_A, grad_b, grad_mu, None, None


def _block_diagonal(blocks: Tensor) -> Tensor:
    # (..., nc, 3, 3) -> (..., 3 nc, 3 nc) block-diagonal matrix.
    nc = blocks.shape[-3]
    eye = torch.eye(nc, dtype=blocks.dtype, device=blocks.device)
    full = blocks.unsqueeze(-2) * eye[:, None, :, None]
    return full.reshape(blocks.shape[:-3] + (3 * nc, 3 * nc))


def solve_contact_impulses(A: Tensor, b: Tensor, mu: Tensor, tol: float = 1e-10,
                           max_iter: int = 1000, backend: Optional[str] = None) -> Tensor:
    """
    Solve the cone-constrained contact QP of Anitescu's step, batched, differentiably.

    Gradients with respect to ``A``, ``b`` and ``mu`` are those of the exact solution map
    (implicit differentiation on the solution's active set), not of the iterations; they are
    exact where the active set is locally stable (no contact exactly at the cone's edge or
    exactly at zero force with zero velocity).

    :param A: ``(..., m, m)`` symmetric positive definite (regularised Delassus) matrix,
        ``m = 3 nc``, rows ``[normal, tangent 1, tangent 2]`` per contact [m/(N s^2) x s].
    :param b: ``(..., m)`` contact velocities without contact impulses [m/s].
    :param mu: ``(..., nc)`` Coulomb friction coefficients, ``>= 0``.
    :param tol: stop when the fixed-point step moves no component by more than
        ``tol (1 + max |b|)`` in velocity units.
    :param max_iter: cap on the APGD iterations (ten semismooth Newton steps follow; the
        result is returned as reached: check it with :func:`contact_residual`; redundant
        contacts, a cube flat on the ground, converge slowly).
    :param backend: ``'auto'``, ``'native'`` (the C++ kernels of
        :mod:`~diffsim_ros.core.native_contact`: the same iterations per problem) or
        ``'torch'``; None: :func:`~diffsim_ros.core.get_backend`.
    :return: ``(..., m)`` impulses [N s].
    :raises BackendError: when ``'native'`` is forced and the kernels cannot run the call.
    """
    batch = torch.broadcast_shapes(A.shape[:-2], b.shape[:-1], mu.shape[:-1])
    m = A.shape[-1]
    A = A.expand(batch + (m, m))
    b = b.expand(batch + (m,))
    mu = mu.expand(batch + (m // 3,))
    choice = _choice(backend, 'solve_contact_impulses')
    if choice != 'torch':
        ext, reason = native_contact.kernels_for(A, b, mu)
        if ext is not None:
            return native_contact.solve(ext, A, b, mu, tol, max_iter)
        if choice == 'native':
            raise BackendError(f"solve_contact_impulses: backend 'native' cannot run this "
                               f'call: {reason}')
        native_contact.log_fallback(reason)
    return _ContactImpulses.apply(A, b, mu, tol, max_iter)
