"""
Box-constrained iterative LQR (control-limited DDP) for model-predictive control.

One iteration: the Jacobians of the dynamics along the nominal trajectory (autograd through the
differentiable core, the whole horizon in one batched call), the analytic cost derivatives, a
backward pass that solves the box-constrained QP of each step by projected Newton (gains only
in the free subspace, zero rows for clamped commands), and a line search whose step sizes are
all rolled out at once as a batch.  Levenberg-Marquardt regularisation ``Quu + mu I`` grows on
failure and shrinks on success.  Consecutive solves are warm-started from the previous command
sequence shifted by the elapsed steps.

A warm start is only a local guess: on a pendulum it can hold a plan that lets the pendulum
fall over and come round again, and iLQR stays in that basin (on the MuJoCo Qube it never
balanced, even on the true model).  An optional *guess*, an affine feedback law (for a
swing-up the LQR of the goal, :func:`~diffsim_ros.control.lqr.lqr_law`), is therefore rolled
out in closed loop through the model at every solve (one compiled step per step), and
whichever of the two initial trajectories costs less is the one iLQR improves.  ``guess_for``
and ``cost_for`` rebuild the law and the cost for every model :meth:`ILQR.set_model` receives
(a refitted pendulum balances at another angle).

The control-rate penalty ``w |u_k - u_{k-1}|^2`` couples neighbouring steps; it is handled
exactly by augmenting the state with the previous command inside the solver (the policy's
gains keep only the ``x`` columns).

Reference: Y. Tassa, N. Mansard, E. Todorov, "Control-Limited Differential Dynamic
Programming", ICRA 2014.

Speed: the backward pass and the box QPs run in numpy float64 (the matrices are tiny, so
per-operation overhead is what counts, and numpy's is a fraction of torch's), and with
``ILQRConfig(compile=True)`` every rollout step, feedback law included, is one call of a
shared compiled function (see :mod:`diffsim_ros.control.dynamics`).  With
``ILQRConfig(native=True)`` every rollout (the warm start's, the guess law's, all line-search
step sizes at once) is one call of the C++ rollout kernel, and the Jacobians are closed-form
from :func:`~diffsim_ros.core.aba_derivatives`: the per-step Python calls that bound the
compiled solve are gone,
and the backward pass (the same recursion and box QPs) runs in C++ as well.
"""

from dataclasses import dataclass
import math
import time
from typing import Callable, NamedTuple, Optional, Tuple

import numpy as np
import torch
from torch import nn

from .costs import CostDerivatives, QuadraticCost
from .dynamics import compiled, KEEP, ModelDynamics
from .lqr import LinearLaw
from .policy import FeedbackPolicy, warm_start
from ..core.model import RobotModel
from ..core.native import native_available, riccati_backward_native

Tensor = torch.Tensor

# Relative slack with which a command counts as lying on its bound.
_BOUND_TOL = 1e-9


@dataclass(frozen=True)
class ILQRConfig:
    """
    Options of :class:`ILQR`.

    :param horizon: number of steps ``H`` (of ``dynamics.dt``), >= 1.
    :param max_iters: iterations per solve, >= 1 (1-3 suffice when warm-started in MPC).
    :param tol: convergence tolerance on the relative cost decrease and on the feedforward
        step (relative to the commands).
    :param mu_init: initial regularisation of ``Quu`` (also after a reset).
    :param mu_min: smallest regularisation; decreases stop there (may be 0).
    :param mu_max: the solve stops when the regularisation must exceed this.
    :param alphas: line-search step sizes, tried in this order (largest first).
    :param dtype: dtype of the solve (the model and cost are converted to it).
    :param mu_factor: factor by which the regularisation grows on failure and shrinks on
        success, > 1.
    :param armijo: accepted steps reduce the cost by at least this fraction of the predicted
        reduction.
    :param compile: run the dynamics through the shared compiled step (finite-difference
        Jacobians; see :class:`~diffsim_ros.control.ModelDynamics`); compilation happens in
        :meth:`ILQR.warm_up` or the first solve.
    :param native: roll out through the C++ kernel
        (:class:`~diffsim_ros.control.ModelDynamics` ``native``; closed-form Jacobians from
        ``aba_derivatives``) where it applies; elsewhere ``compile`` decides.
    :raises ValueError: invalid values.
    """

    horizon: int = 50
    max_iters: int = 10
    tol: float = 1e-6
    mu_init: float = 1e-6
    mu_min: float = 1e-9
    mu_max: float = 1e10
    alphas: Tuple[float, ...] = (1.0, 0.5, 0.25, 0.1, 0.03, 0.01)
    dtype: torch.dtype = torch.float64
    mu_factor: float = 4.0
    armijo: float = 1e-4
    compile: bool = False  # noqa: A003 (the option's name)
    native: bool = False

    def __post_init__(self) -> None:
        """Validate the options."""
        if int(self.horizon) != self.horizon or self.horizon < 1:
            raise ValueError(f'horizon must be a positive int, got {self.horizon}')
        if int(self.max_iters) != self.max_iters or self.max_iters < 1:
            raise ValueError(f'max_iters must be a positive int, got {self.max_iters}')
        if not (self.tol >= 0 and 0 <= self.mu_min <= self.mu_init <= self.mu_max):
            raise ValueError('need tol >= 0 and 0 <= mu_min <= mu_init <= mu_max, got '
                             f'{self.tol}, {self.mu_min}, {self.mu_init}, {self.mu_max}')
        alphas = tuple(float(a) for a in self.alphas)
        if not alphas or any(not 0 < a <= 1 for a in alphas):
            raise ValueError(f'alphas must be non-empty and in (0, 1], got {self.alphas}')
        object.__setattr__(self, 'alphas', alphas)
        if not self.mu_factor > 1:
            raise ValueError(f'mu_factor must be > 1, got {self.mu_factor}')
        if self.dtype not in (torch.float32, torch.float64):
            raise ValueError(f'dtype must be torch.float32 or torch.float64, got {self.dtype}')


class BackwardPass(NamedTuple):
    """
    Result of one backward pass.

    Feedforward ``k (H, nu)``, gains ``K (H, nu, nz)`` and the predicted cost change terms
    ``dv = (sum k.Qu, sum 0.5 k.Quu.k)``.
    """

    k: Tensor
    K: Tensor
    dv: Tuple[float, float]


def box_qp(hessian: Tensor, gradient: Tensor, lower: Tensor, upper: Tensor,
           x0: Optional[Tensor] = None, max_iters: int = 50) -> Tuple[Tensor, Tensor, bool]:
    """
    Minimise ``0.5 x^T H x + g^T x`` subject to ``lower <= x <= upper`` by projected Newton.

    Tassa et al. 2014, Algorithm 3: Newton steps on the free subspace (variables not held at a
    bound by their gradient) with a projected backtracking line search.  Computed in numpy
    float64.

    :param hessian: ``H (m, m)``, positive definite.
    :param gradient: ``g (m,)``.
    :param lower: lower bounds ``(m,)`` (may be ``-inf``).
    :param upper: upper bounds ``(m,)`` (may be ``inf``).
    :param x0: starting point ``(m,)``; zeros when None.
    :param max_iters: Newton iterations at most.
    :return: the minimiser ``(m,)``, the free mask ``(m,)`` bool, and whether the free block
        of ``H`` was positive definite throughout.
    """
    def array(value: Tensor) -> np.ndarray:
        return value.detach().cpu().to(torch.float64).numpy()

    start = None if x0 is None else array(x0)
    x, free, ok = _box_qp(array(hessian), array(gradient), array(lower), array(upper), start,
                          max_iters)
    return (torch.from_numpy(x).to(dtype=gradient.dtype, device=gradient.device),
            torch.from_numpy(free).to(device=gradient.device), ok)


def _box_qp(hessian: np.ndarray, gradient: np.ndarray, lower: np.ndarray, upper: np.ndarray,
            x0: Optional[np.ndarray] = None,
            max_iters: int = 50) -> Tuple[np.ndarray, np.ndarray, bool]:
    """Run :func:`box_qp` on numpy arrays."""
    x = np.zeros_like(gradient) if x0 is None else x0
    x = np.minimum(np.maximum(x, lower), upper)
    slack = _BOUND_TOL * (1.0 + np.abs(x))

    def objective(value: np.ndarray) -> float:
        return float(0.5 * value @ (hessian @ value) + gradient @ value)

    for _ in range(max_iters):
        grad = gradient + hessian @ x
        free = ~(((x <= lower + slack) & (grad > 0)) | ((x >= upper - slack) & (grad < 0)))
        if not free.any():
            break
        block = hessian[np.ix_(free, free)]
        if not _positive_definite(block):
            return x, free, False
        step = np.zeros_like(x)
        step[free] = -np.linalg.solve(block, grad[free])
        if np.abs(step).max() <= 1e-12 * (1.0 + np.abs(x).max()):
            break
        value = objective(x)
        alpha = 1.0
        while alpha > 1e-10:
            candidate = np.minimum(np.maximum(x + alpha * step, lower), upper)
            if objective(candidate) <= value + 1e-12 * (1.0 + abs(value)):
                break
            alpha *= 0.5
        else:
            break
        x = candidate
    grad = gradient + hessian @ x
    free = ~(((x <= lower + slack) & (grad > 0)) | ((x >= upper - slack) & (grad < 0)))
    return x, free, True


def _positive_definite(matrix: np.ndarray) -> bool:
    """Return whether a symmetric matrix is positive definite (its Cholesky exists)."""
    if not np.isfinite(matrix).all():
        return False
    try:
        np.linalg.cholesky(matrix)
    except np.linalg.LinAlgError:
        return False
    return True


class ILQR:
    """
    Control-limited iLQR controller (see the module docstring).

    :param dynamics: the discrete-time model (its command limits bound the solution).
    :param cost: task cost (:class:`~diffsim_ros.control.costs.QuadraticCost` or a subclass).
    :param config: solver options.
    :param cost_for: ``cost_for(model)`` builds the cost for a new model (:meth:`set_model`);
        None keeps ``cost``.
    :param guess_for: ``guess_for(dynamics)`` builds an affine law whose closed-loop rollout
        competes with the warm start as the initial trajectory of every solve (module
        docstring); built for ``dynamics`` now and for every model :meth:`set_model` gets.
    """

    def __init__(self, dynamics: ModelDynamics, cost: QuadraticCost,
                 config: Optional[ILQRConfig] = None,
                 cost_for: Optional[Callable[[RobotModel], QuadraticCost]] = None,
                 guess_for: Optional[Callable[[ModelDynamics], LinearLaw]] = None) -> None:
        self.config = ILQRConfig() if config is None else config
        self.dynamics = self._converted(dynamics)
        self.cost = cost.to(dtype=self.config.dtype, device=self.dynamics.model.device)
        self._cost_for, self._guess_for = cost_for, guess_for
        self.guess_error: Optional[str] = None
        self.guess = self._build_guess(self.dynamics)
        self.info: dict = {}
        self.reset()

    def _converted(self, dynamics: ModelDynamics) -> ModelDynamics:
        model = dynamics.model
        compile_ = self.config.compile or dynamics.compiled
        native = self.config.native or dynamics.native_requested
        if model.dtype == self.config.dtype and compile_ == dynamics.compiled \
                and native == dynamics.native_requested:
            return dynamics
        return dynamics.with_model(model.to(dtype=self.config.dtype), compile=compile_,
                                   native=native)

    def warm_up(self, x0: Optional[Tensor] = None) -> float:
        """
        Build every compiled shape a solve uses (with ``compile``), keeping the warm start.

        Two solves from ``x0`` (the second with a previous command, which the rate term
        uses); the controller's plan, regularisation and info are restored afterwards.

        :param x0: a typical state ``(nx,)``; zeros when None.
        :return: seconds spent.
        """
        start = time.perf_counter()
        dyn = self.dynamics
        saved = (self._controls, self._u_prev, self._t, self._policy, self.mu, self.info)
        x0 = dyn.u_min.new_zeros(dyn.nx) if x0 is None else x0
        self.solve(x0, 0.0)
        self.solve(x0, dyn.dt)
        (self._controls, self._u_prev, self._t, self._policy, self.mu, self.info) = saved
        return time.perf_counter() - start

    def reset(self) -> None:
        """Forget the warm start and the regularisation."""
        self._controls: Optional[Tensor] = None
        self._u_prev: Optional[Tensor] = None
        self._t: Optional[float] = None
        self._policy: Optional[FeedbackPolicy] = None
        self.mu = self.config.mu_init

    def set_model(self, model: RobotModel, friction_model: Optional[nn.Module] = KEEP) -> None:
        """
        Use another model from the next solve on; the warm start is kept.

        :param model: the new model (same joints; converted to the solver's dtype).
        :param friction_model: its extra friction module (None: none); :data:`KEEP`: the
            one in use.
        """
        dynamics = self._converted(self.dynamics.with_model(model,
                                                            friction_model=friction_model))
        cost = self.cost
        if self._cost_for is not None:
            cost = self._cost_for(dynamics.model).to(dtype=self.config.dtype,
                                                     device=dynamics.model.device)
        self.dynamics, self.cost, self.guess = dynamics, cost, self._build_guess(dynamics)

    def _build_guess(self, dynamics: ModelDynamics) -> Optional[LinearLaw]:
        """Return the guess law for a model, or None (with ``guess_error``) if none exists."""
        self.guess_error = None
        if self._guess_for is None:
            return None
        try:
            return self._guess_for(dynamics)
        except (ValueError, RuntimeError) as error:   # e.g. no stabilising LQR for the model
            self.guess_error = str(error)
            return None

    # -- warm start --------------------------------------------------------------------------
    def _initial_controls(self, t: float) -> Tuple[Tensor, Optional[Tensor]]:
        dyn = self.dynamics
        return warm_start(self._controls, self._u_prev, self._t, t, dyn.dt, self.config.horizon,
                          dyn.u_min, dyn.u_max)

    # -- solve -------------------------------------------------------------------------------
    def solve(self, x0: Tensor, t: float = 0.0) -> FeedbackPolicy:
        """
        Optimise the command sequence from state ``x0`` at time ``t``.

        :param x0: current state ``(nx,)`` = ``[q; qd]``.
        :param t: current time in s; the warm start is shifted by the steps elapsed since the
            previous solve.
        :return: the feedback policy of the optimised plan, starting at ``t``.  A non-finite
            ``x0`` returns the previous plan (or zero commands) without solving.
        """
        start = time.perf_counter()
        cfg, dyn = self.config, self.dynamics
        x0 = torch.as_tensor(x0).to(dtype=cfg.dtype, device=dyn.model.device).reshape(dyn.nx)
        if not bool(torch.isfinite(x0).all()):
            self.info = {'iterations': 0, 'converged': False, 'reason': 'non-finite state'}
            if self._policy is not None:
                return self._policy.shifted(max(0, int(round((t - self._policy.t0) / dyn.dt))))
            return FeedbackPolicy.constant(torch.clamp(dyn.u_min.new_zeros(dyn.nu), dyn.u_min,
                                                       dyn.u_max),
                                           dyn.nx, dyn.u_min, dyn.u_max, t0=t, dt=dyn.dt,
                                           horizon=cfg.horizon)
        cost = self.cost.bind(t, dyn.dt, cfg.horizon)
        controls, u_prev = self._initial_controls(t)
        initial = 'warm start' if self._controls is not None else 'zeros'
        with torch.no_grad():
            states = dyn.rollout(x0, controls)
            value = float(cost.total(states, controls, u_prev))
            if self.guess is not None:
                guess_states, guess_controls = law_rollout(dyn, x0, self.guess, cfg.horizon)
                guess_value = float(cost.total(guess_states, guess_controls, u_prev))
                if guess_value < value or not math.isfinite(value):
                    states, controls, value = guess_states, guess_controls, guess_value
                    initial = 'guess'
        costs = [value]
        gains = None
        converged = False
        reason = 'max_iters'
        iterations = 0
        for iterations in range(1, cfg.max_iters + 1):
            A, B = dyn.jacobians(states[:-1], controls)
            derivatives = cost.derivatives(states, controls)
            result = self._backward(A, B, derivatives, controls, u_prev, cost.rate_weight)
            if result is None:
                reason = 'regularisation exceeded mu_max'
                break
            gains = result.K
            step_size = float(result.k.abs().max())
            if step_size <= cfg.tol * (1.0 + float(controls.abs().max())):
                converged, reason = True, 'feedforward step below tol'
                break
            accepted = self._line_search(x0, states, controls, u_prev, result, cost, value)
            if accepted is None:
                self.mu = max(self.mu * cfg.mu_factor, cfg.mu_min, 1e-9)
                if self.mu > cfg.mu_max:
                    reason = 'line search failed at mu_max'
                    break
                continue
            new_value, states, controls = accepted
            self.mu = max(self.mu / cfg.mu_factor, cfg.mu_min)
            decrease = value - new_value
            value = new_value
            costs.append(value)
            if decrease <= cfg.tol * max(1.0, abs(value)):
                converged, reason = True, 'cost decrease below tol'
                break
        if gains is None:
            gains = controls.new_zeros(cfg.horizon, dyn.nu, dyn.nx)
        self._controls, self._u_prev, self._t = controls, u_prev, float(t)
        self._policy = FeedbackPolicy(
            t0=float(t), dt=dyn.dt, u_ff=controls, K=gains[..., :dyn.nx].contiguous(),
            x_ref=states, u_min=dyn.u_min, u_max=dyn.u_max, angle_mask=cost.angle_mask,
            interpolate=True)
        self.info = {'iterations': iterations, 'cost': value, 'costs': costs, 'mu': self.mu,
                     'converged': converged, 'reason': reason, 'initial': initial,
                     'solve_time': time.perf_counter() - start}
        return self._policy

    # -- backward pass -----------------------------------------------------------------------
    def _backward(self, A: Tensor, B: Tensor, d: CostDerivatives, controls: Tensor,
                  u_prev: Optional[Tensor], rate_weight: float) -> Optional[BackwardPass]:
        """Run the backward pass, raising the regularisation until it succeeds (or None)."""
        cfg = self.config
        augmented = _augmented(A, B, d, controls, u_prev, rate_weight)
        limits = (self.dynamics.u_min, self.dynamics.u_max)
        if cfg.native and native_available()[0]:
            def backward(mu: float) -> Optional[tuple]:
                return riccati_backward_native(*augmented, controls, *limits, mu)[1]
        else:
            data = [_numpy(value) for value in augmented + (controls,) + limits]

            def backward(mu: float) -> Optional[tuple]:
                return _backward_pass(*data, mu)
        while True:
            result = backward(self.mu)
            if result is not None:
                k, K, dv = result
                return BackwardPass(k.to(controls), K.to(controls), dv)
            self.mu = max(self.mu * cfg.mu_factor, cfg.mu_min, 1e-9)
            if self.mu > cfg.mu_max:
                return None

    # -- line search -------------------------------------------------------------------------
    def _line_search(self, x0: Tensor, states: Tensor, controls: Tensor,
                     u_prev: Optional[Tensor], result: BackwardPass, cost: QuadraticCost,
                     value: float) -> Optional[Tuple[float, Tensor, Tensor]]:
        """Roll out every step size at once; return the first acceptable one's trajectory."""
        dyn = self.dynamics
        alphas = torch.tensor(self.config.alphas, dtype=states.dtype, device=states.device)
        with torch.no_grad():
            new_states, new_controls = closed_loop_rollout(
                dyn, x0, states, controls, result.k, result.K, alphas, u_prev)
            values = cost.total(new_states, new_controls, u_prev)
        predicted = alphas * result.dv[0] + alphas.square() * result.dv[1]
        reduction = value - values
        ok = torch.isfinite(values) & (reduction > 0) & (
            reduction >= -self.config.armijo * predicted)
        if not bool(ok.any()):
            return None
        index = int(ok.nonzero()[0])
        return float(values[index]), new_states[index], new_controls[index]


def law_rollout(dynamics: ModelDynamics, x0: Tensor, law: LinearLaw,
                horizon: int) -> Tuple[Tensor, Tensor]:
    """
    Roll an affine law out in closed loop through the model, one compiled step per step.

    The law is applied around the copy of its goal nearest ``x0`` (angles shifted by whole
    turns, :meth:`LinearLaw.nearest_goal`), i.e. exactly while the wrapped joints stay within
    half a turn of it; a rollout that strays further has failed as a guess anyway.

    :param dynamics: the model (its command limits clip the law).
    :param x0: initial state ``(nx,)``.
    :param law: the law.
    :param horizon: steps.
    :return: states ``(H + 1, nx)`` and commands ``(H, nu)``.
    """
    goal = law.nearest_goal(x0)
    controls = law.u_goal.expand(horizon, dynamics.nu)
    states, commands = closed_loop_rollout(
        dynamics, x0, goal.expand(horizon + 1, dynamics.nx), controls,
        torch.zeros_like(controls), (-law.K).expand(horizon, dynamics.nu, dynamics.nx),
        x0.new_ones(1))
    return states[0], commands[0]


def closed_loop_rollout(dynamics: ModelDynamics, x0: Tensor, states: Tensor, controls: Tensor,
                        k: Tensor, K: Tensor, alphas: Tensor,
                        u_prev: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """
    Roll out ``u_t = clip(U_t + alpha k_t + K_t (z_t - Z_t))`` for several step sizes at once.

    :param dynamics: the model.
    :param x0: initial state ``(nx,)``.
    :param states: nominal states ``(H + 1, nx)``.
    :param controls: nominal commands ``(H, nu)``.
    :param k: feedforward steps ``(H, nu)``.
    :param K: gains ``(H, nu, nz)``, ``nz = nx`` or ``nx + nu`` (rate-augmented state
        ``z = [x; u_{t-1}]``).
    :param alphas: step sizes ``(A,)``.
    :param u_prev: command before the horizon ``(nu,)`` for the augmented state.
    :return: states ``(A, H + 1, nx)`` and commands ``(A, H, nu)``.
    """
    nx = dynamics.nx
    augmented = K.shape[-1] > nx
    count = alphas.shape[0]
    x = x0.expand(count, nx).clone()
    # Open-loop part of every step for every alpha, (H, A, nu), rows contiguous.
    u_open = (controls + alphas[:, None, None] * k).transpose(0, 1).contiguous()
    previous = None
    if augmented:
        first = (u_prev if u_prev is not None else controls[0]).unsqueeze(0)
        previous = torch.cat((first, controls[:-1]), dim=0)
        du_prev = torch.zeros_like(u_open[0])
    if dynamics.native:
        out = dynamics.feedback_rollout(x, states, u_open, K, previous)
        if out is not None:
            return out
    step = compiled('feedback_step', _feedback_step, dynamics) if dynamics.compiled else \
        _feedback_step
    xs, us = [x], []
    for t, (x_nom, u_t, K_t) in enumerate(zip(states.unbind(0), u_open.unbind(0),
                                              K.unbind(0))):
        if augmented and t > 0:
            du_prev = us[-1] - previous[t]
        x, u = step(dynamics, x, x_nom, u_t, K_t, du_prev if augmented else None)
        xs.append(x)
        us.append(u)
    return torch.stack(xs, dim=-2), torch.stack(us, dim=-2)


def _feedback_step(dynamics: ModelDynamics, x: Tensor, x_nom: Tensor, u_open: Tensor,
                   K: Tensor, du_prev: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """
    One closed-loop step: ``u = clip(u_open + K (z - z_nom))``, then the dynamics.

    :param dynamics: the model.
    :param x: states ``(A, nx)``.
    :param x_nom: nominal state ``(nx,)``.
    :param u_open: open-loop commands ``(A, nu)``.
    :param K: gain ``(nu, nz)``.
    :param du_prev: deviation of the previous command ``(A, nu)`` (augmented state) or None.
    :return: next states ``(A, nx)`` and the commands ``(A, nu)``.
    """
    dz = x - x_nom
    if du_prev is not None:
        dz = torch.cat((dz, du_prev), dim=-1)
    u = u_open + (dz.unsqueeze(-2) * K).sum(-1)
    u = torch.minimum(torch.maximum(u, dynamics.u_min), dynamics.u_max)
    return dynamics.eager_step(x, u), u


def _augmented(A: Tensor, B: Tensor, d: CostDerivatives, controls: Tensor,
               u_prev: Optional[Tensor], rate_weight: float
               ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """
    Stack the per-step LQ data over the horizon, augmenting the state for the rate term.

    :return: ``F = [fz | fu] (H, nz, nz + nu)``, stage gradient ``(H, nz + nu)`` and Hessian
        ``(H, nz + nu, nz + nu)`` in ``(z, u)`` order, terminal ``vz (nz,)``, ``vzz (nz, nz)``.
    """
    horizon, nx, nu = B.shape[0], A.shape[-1], B.shape[-1]
    if rate_weight <= 0:
        F = torch.cat((A, B), dim=-1)
        grad = torch.cat((d.lx, d.lu), dim=-1)
        hess = torch.cat((torch.cat((d.lxx, d.lux.mT), dim=-1),
                          torch.cat((d.lux, d.luu), dim=-1)), dim=-2)
        return F, grad, hess, d.vx, d.vxx
    # z = [x; p] with p = u_{k-1}: p' = u, rate cost w |u - p|^2 (w = 0 at k = 0 without u_prev).
    weights = controls.new_full((horizon,), rate_weight)
    if u_prev is None:
        weights[0] = 0.0
        u_prev = controls[0]
    previous = torch.cat((u_prev.unsqueeze(0), controls[:-1]), dim=0)
    diff = 2.0 * weights[:, None] * (controls - previous)                  # (H, nu)
    eye = torch.eye(nu, dtype=A.dtype, device=A.device)
    w_eye = 2.0 * weights[:, None, None] * eye                             # (H, nu, nu)
    nz = nx + nu
    F = A.new_zeros(horizon, nz, nz + nu)
    F[:, :nx, :nx] = A
    F[:, :nx, nz:] = B
    F[:, nx:, nz:] = eye
    grad = torch.cat((d.lx, -diff, d.lu + diff), dim=-1)
    hess = A.new_zeros(horizon, nz + nu, nz + nu)
    hess[:, :nx, :nx] = d.lxx
    hess[:, nx:nz, nx:nz] = w_eye
    hess[:, nz:, nz:] = d.luu + w_eye
    hess[:, nz:, :nx] = d.lux
    hess[:, :nx, nz:] = d.lux.mT
    hess[:, nz:, nx:nz] = -w_eye
    hess[:, nx:nz, nz:] = -w_eye
    vz = torch.cat((d.vx, d.vx.new_zeros(nu)))
    vzz = A.new_zeros(nz, nz)
    vzz[:nx, :nx] = d.vxx
    return F, grad, hess, vz, vzz


def _numpy(value: Tensor) -> np.ndarray:
    """Return a float64 numpy copy (or view) of a tensor."""
    return value.detach().cpu().to(torch.float64).numpy()


def _backward_pass(F: np.ndarray, l_grad: np.ndarray, l_hess: np.ndarray, vz: np.ndarray,
                   vzz: np.ndarray, controls: np.ndarray, u_min: np.ndarray,
                   u_max: np.ndarray, mu: float) -> Optional[BackwardPass]:
    """
    Riccati recursion with box-constrained feedforward (Tassa et al. 2014, section III).

    In numpy float64 (arguments as returned by :func:`_augmented`, converted).

    :return: the pass (tensors in float64), or None when some ``Quu + mu I`` (free block) is
        not positive definite.
    """
    horizon, nz = F.shape[0], F.shape[1]
    nu = controls.shape[-1]
    eye = np.eye(nu)
    lower, upper = u_min - controls, u_max - controls                     # (H, nu)
    ks = np.zeros((horizon, nu))
    Ks = np.zeros((horizon, nu, nz))
    dv1 = dv2 = 0.0
    F_T = np.ascontiguousarray(F.transpose(0, 2, 1))
    for t in range(horizon - 1, -1, -1):
        Q_grad = l_grad[t] + F_T[t] @ vz
        Q_hess = l_hess[t] + F_T[t] @ (vzz @ F[t])
        Qz, Qu = Q_grad[:nz], Q_grad[nz:]
        Qzz, Quz, Quu = Q_hess[:nz, :nz], Q_hess[nz:, :nz], Q_hess[nz:, nz:]
        K = Ks[t]
        if nu == 1:
            # One command (the pendulum tasks): the box QP in closed form.
            h = float(Quu[0, 0]) + mu
            if not (h > 0 and math.isfinite(h)):
                return None
            unconstrained = -float(Qu[0]) / h
            k = np.array([min(max(unconstrained, lower[t, 0]), upper[t, 0])])
            if unconstrained == k[0]:
                K[:] = Quz * (-1.0 / h)
        else:
            Quu_reg = Quu + mu * eye
            k, free, ok = _box_qp(Quu_reg, Qu, lower[t], upper[t])
            if not ok:
                return None
            if free.any():
                block = Quu_reg[np.ix_(free, free)]
                if not _positive_definite(block):
                    return None
                K[free] = -np.linalg.solve(block, Quz[free])
        Quu_k = Quu @ k
        vz = Qz + K.T @ (Quu_k + Qu) + Quz.T @ k
        KQ = K.T @ Quz
        vzz = Qzz + K.T @ Quu @ K + KQ + KQ.T
        vzz = 0.5 * (vzz + vzz.T)
        dv1 += float(k @ Qu)
        dv2 += 0.5 * float(k @ Quu_k)
        ks[t] = k
    return BackwardPass(torch.from_numpy(ks), torch.from_numpy(Ks), (dv1, dv2))
