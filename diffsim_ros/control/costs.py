"""
Quadratic task costs for the controllers, batched over samples and particles.

Over a horizon of ``H`` steps with states ``X (..., H + 1, nx)`` and commands ``U (..., H, nu)``::

    J = sum_k [e_k^T Q e_k + v_k^T R v_k + w |u_k - u_{k-1}|^2] + e_H^T Qf e_H

with ``e_k = x_k - x_goal_k`` (angle entries wrapped to ``(-pi, pi]``), ``v_k = u_k - u_goal``
and ``w`` the control-rate weight (``u_{-1}`` is the command applied before the horizon, when
known).  No factor 1/2.  :class:`QuadraticCost` regulates to one goal state;
:class:`TrackingCost` follows a reference trajectory.

Optional soft state bounds add ``W sum_i (max(0, x_i - hi_i)^2 + max(0, lo_i - x_i)^2)`` to
every stage and to the terminal cost, e.g. to keep a cart on its track or an arm within its
travel: the penalty is zero inside the bounds and its Gauss-Newton derivatives are exact.
"""

import copy
from typing import Callable, NamedTuple, Optional, Union

import torch

from .policy import state_error
from ..core.errors import ShapeError

Tensor = torch.Tensor
Reference = Union[Tensor, Callable[[Tensor], Tensor]]


class CostDerivatives(NamedTuple):
    """
    First and second derivatives of the stage and terminal costs along a trajectory.

    Shapes: ``lx (H, nx)``, ``lu (H, nu)``, ``lxx (H, nx, nx)``, ``luu (H, nu, nu)``,
    ``lux (H, nu, nx)``, ``vx (nx,)``, ``vxx (nx, nx)``; the rate term is not included.
    """

    lx: Tensor
    lu: Tensor
    lxx: Tensor
    luu: Tensor
    lux: Tensor
    vx: Tensor
    vxx: Tensor


def _weight(value: Union[Tensor, float, list], size: int, name: str,
            like: Tensor) -> Tensor:
    """Return a ``(size, size)`` weight matrix from a scalar, a diagonal or a matrix."""
    value = torch.as_tensor(value, dtype=like.dtype, device=like.device)
    if value.dim() == 0:
        value = value.expand(size)
    if value.dim() == 1:
        value = torch.diag_embed(value)
    if tuple(value.shape) != (size, size):
        raise ShapeError(f'{name}: expected a scalar, shape ({size},) or ({size}, {size}), '
                         f'got {tuple(value.shape)}')
    if not bool(torch.isfinite(value).all()):
        raise ValueError(f'{name} must be finite')
    return 0.5 * (value + value.mT)


class QuadraticCost:
    """
    Quadratic regulation cost to a goal state (see the module docstring for the formula).

    :param Q: stage state weight: scalar, diagonal ``(nx,)`` or matrix ``(nx, nx)``.
    :param R: command weight: scalar, ``(nu,)`` or ``(nu, nu)``.
    :param Qf: terminal state weight, like ``Q``.
    :param x_goal: goal state ``(nx,)``.
    :param u_goal: command the ``R`` term pulls towards ``(nu,)``; zeros when None.
    :param angle_mask: ``(nx,)`` bool: entries of ``x - x_goal`` wrapped to ``(-pi, pi]``.
    :param rate_weight: weight ``w >= 0`` of the rate penalty ``|u_k - u_{k-1}|^2``.
    :param nu: command dimension; needed only when ``R`` is a scalar and ``u_goal`` None
        (default 1).
    :param x_lower: ``(nx,)`` soft lower state bounds (``-inf`` where none); None for none.
    :param x_upper: ``(nx,)`` soft upper state bounds (``inf`` where none); None for none.
    :param bound_weight: ``W >= 0``, weight of the squared bound violations.
    :raises ShapeError: inconsistent shapes.
    :raises ValueError: negative ``rate_weight`` or ``bound_weight``, crossed bounds.
    """

    def __init__(self, Q: Tensor, R: Tensor, Qf: Tensor, x_goal: Tensor,
                 u_goal: Optional[Tensor] = None, angle_mask: Optional[Tensor] = None,
                 rate_weight: float = 0.0, nu: Optional[int] = None,
                 x_lower: Optional[Tensor] = None, x_upper: Optional[Tensor] = None,
                 bound_weight: float = 0.0) -> None:
        x_goal = torch.as_tensor(x_goal)
        if not x_goal.is_floating_point():
            x_goal = x_goal.to(torch.get_default_dtype())
        self._set_goal(x_goal)
        nx = self.nx
        self.Q = _weight(Q, nx, 'Q', x_goal)
        self.Qf = _weight(Qf, nx, 'Qf', x_goal)
        R = torch.as_tensor(R, dtype=x_goal.dtype, device=x_goal.device)
        if nu is None:
            nu = R.shape[-1] if R.dim() else (1 if u_goal is None else torch.as_tensor(
                u_goal).reshape(-1).shape[-1])
        self.R = _weight(R, nu, 'R', x_goal)
        self.nu = nu
        self.u_goal = x_goal.new_zeros(nu) if u_goal is None else torch.as_tensor(
            u_goal, dtype=x_goal.dtype, device=x_goal.device)
        if tuple(self.u_goal.shape) != (nu,):
            raise ShapeError(f'u_goal: expected shape ({nu},), got {tuple(self.u_goal.shape)}')
        if angle_mask is not None:
            angle_mask = torch.as_tensor(angle_mask, dtype=torch.bool, device=x_goal.device)
            if tuple(angle_mask.shape) != (nx,):
                raise ShapeError(f'angle_mask: expected shape ({nx},), '
                                 f'got {tuple(angle_mask.shape)}')
        self.angle_mask = angle_mask
        if not float(rate_weight) >= 0:
            raise ValueError(f'rate_weight must be >= 0, got {rate_weight}')
        self.rate_weight = float(rate_weight)
        if not float(bound_weight) >= 0:
            raise ValueError(f'bound_weight must be >= 0, got {bound_weight}')
        self.bound_weight = float(bound_weight)
        self.x_lower, self.x_upper = (
            None if value is None else torch.as_tensor(value, dtype=x_goal.dtype,
                                                       device=x_goal.device).reshape(-1)
            for value in (x_lower, x_upper))
        for name, value in (('x_lower', self.x_lower), ('x_upper', self.x_upper)):
            if value is not None and tuple(value.shape) != (nx,):
                raise ShapeError(f'{name}: expected shape ({nx},), got {tuple(value.shape)}')
        if self.x_lower is not None and self.x_upper is not None and \
                bool((self.x_lower > self.x_upper).any()):
            raise ValueError('x_lower exceeds x_upper')

    def _violation(self, x: Tensor) -> Optional[Tensor]:
        """Return the signed bound violations ``(..., nx)`` (0 inside), or None."""
        if self.bound_weight == 0 or (self.x_lower is None and self.x_upper is None):
            return None
        over = torch.zeros_like(x)
        if self.x_upper is not None:
            over = over + torch.clamp(x - self.x_upper, min=0.0)
        if self.x_lower is not None:
            over = over - torch.clamp(self.x_lower - x, min=0.0)
        return over

    def _bound_cost(self, x: Tensor) -> Tensor:
        over = self._violation(x)
        return x.new_zeros(x.shape[:-1]) if over is None else \
            self.bound_weight * over.square().sum(-1)

    def _set_goal(self, x_goal: Tensor) -> None:
        if x_goal.dim() != 1:
            raise ShapeError(f'x_goal: expected shape (nx,), got {tuple(x_goal.shape)}')
        self.x_goal = x_goal
        self.nx = x_goal.shape[-1]

    def goal(self, k: int) -> Tensor:
        """
        Return the goal state of step ``k``.

        :param k: step index (``H`` for the terminal state).
        :return: ``(nx,)``.
        """
        return self.x_goal

    def goals(self, horizon: int) -> Tensor:
        """
        Return the goal states of steps ``0..H``.

        :param horizon: ``H``.
        :return: ``(H + 1, nx)``.
        """
        return self.x_goal.expand(horizon + 1, self.nx)

    def bind(self, t0: float, dt: float, horizon: int) -> 'QuadraticCost':
        """
        Return the cost for a horizon starting at ``t0`` (time-varying costs resolve here).

        :param t0: start time in s.
        :param dt: step in s.
        :param horizon: number of steps ``H``.
        :return: ``self`` (a regulation cost does not depend on time).
        """
        return self

    def to(self, dtype: Optional[torch.dtype] = None,
           device: Optional[torch.device] = None) -> 'QuadraticCost':
        """
        Return a copy with the weights and goals converted.

        :param dtype: floating dtype.
        :param device: device.
        :return: the converted cost (``self`` is unchanged).
        """
        cost = copy.copy(self)
        for name in ('Q', 'R', 'Qf', 'x_goal', 'u_goal', 'x_ref', 'x_lower', 'x_upper'):
            value = getattr(cost, name, None)
            if value is not None:
                setattr(cost, name, value.to(dtype=dtype, device=device))
        if cost.angle_mask is not None:
            cost.angle_mask = cost.angle_mask.to(device=device)
        return cost

    def _quadratic(self, error: Tensor, weight: Tensor) -> Tensor:
        return ((error @ weight) * error).sum(-1)

    def stage(self, x: Tensor, u: Tensor, k: int) -> Tensor:
        """
        Stage cost of step ``k`` without the rate term.

        :param x: states ``(..., nx)``.
        :param u: commands ``(..., nu)``.
        :param k: step index.
        :return: ``(...)``.
        """
        error = state_error(x, self.goal(k), self.angle_mask)
        return self._quadratic(error, self.Q) + self._quadratic(u - self.u_goal, self.R) + \
            self._bound_cost(x)

    def terminal(self, x: Tensor) -> Tensor:
        """
        Terminal cost.

        :param x: final states ``(..., nx)``.
        :return: ``(...)``.
        """
        error = state_error(x, self.x_goal, self.angle_mask)
        return self._quadratic(error, self.Qf) + self._bound_cost(x)

    def total(self, X: Tensor, U: Tensor, u_prev: Optional[Tensor] = None) -> Tensor:
        """
        Total cost of trajectories, rate term included.

        :param X: states ``(..., H + 1, nx)``.
        :param U: commands ``(..., H, nu)``.
        :param u_prev: command applied before the horizon ``(..., nu)``; the rate term of
            step 0 is left out when None.
        :return: ``(...)``.
        """
        horizon = U.shape[-2]
        goals = self.goals(horizon)
        error = state_error(X, goals, self.angle_mask)
        cost = self._quadratic(error[..., :-1, :], self.Q).sum(-1)
        cost = cost + self._quadratic(error[..., -1, :], self.Qf)
        cost = cost + self._quadratic(U - self.u_goal, self.R).sum(-1)
        cost = cost + self._bound_cost(X).sum(-1)
        if self.rate_weight > 0:
            if u_prev is not None:
                U = torch.cat((u_prev.unsqueeze(-2).expand(U.shape[:-2] + (1, U.shape[-1])),
                               U), dim=-2)
            cost = cost + self.rate_weight * (U[..., 1:, :] - U[..., :-1, :]).square().sum(
                (-2, -1))
        return cost

    def derivatives(self, X: Tensor, U: Tensor) -> CostDerivatives:
        """
        Analytic derivatives of the stage and terminal costs (rate term excluded).

        :param X: states ``(H + 1, nx)``.
        :param U: commands ``(H, nu)``.
        :return: the derivatives (see :class:`CostDerivatives`).
        """
        horizon = U.shape[-2]
        error = state_error(X, self.goals(horizon), self.angle_mask)
        lx = 2.0 * error[:-1] @ self.Q
        lu = 2.0 * (U - self.u_goal) @ self.R
        lxx = (2.0 * self.Q).expand(horizon, self.nx, self.nx)
        luu = (2.0 * self.R).expand(horizon, self.nu, self.nu)
        lux = X.new_zeros(horizon, self.nu, self.nx)
        lfx, lfxx = 2.0 * error[-1] @ self.Qf, 2.0 * self.Qf
        over = self._violation(X)
        if over is not None:   # piecewise quadratic: exact first and second derivatives
            gradient = 2.0 * self.bound_weight * over
            curvature = torch.diag_embed(2.0 * self.bound_weight * (over != 0).to(X.dtype))
            lx, lxx = lx + gradient[:-1], lxx + curvature[:-1]
            lfx, lfxx = lfx + gradient[-1], lfxx + curvature[-1]
        return CostDerivatives(lx, lu, lxx, luu, lux, lfx, lfxx)


class TrackingCost(QuadraticCost):
    """
    Quadratic cost that follows a reference trajectory ``x_ref`` (see the module docstring).

    :param x_ref: reference states ``(T, nx)``, entry ``k`` for step ``k`` of the horizon
        (the last entry repeats beyond ``T``), or a callable of time: called with a tensor of
        times ``(H + 1,)`` in s it returns ``(H + 1, nx)``; a callable that only takes a float
        is called once per step.  :meth:`bind` resolves the callable at a solve's times.
    :param Q: stage state weight (scalar, ``(nx,)`` or ``(nx, nx)``).
    :param R: command weight.
    :param Qf: terminal state weight.
    :param u_ref: command the ``R`` term pulls towards ``(nu,)``; zeros when None.
    :param angle_mask: ``(nx,)`` bool: wrapped entries.
    :param rate_weight: weight of ``|u_k - u_{k-1}|^2``.
    :param nx: state dimension of a callable reference (found by calling ``x_ref(0.0)`` when
        None).
    :param nu: command dimension when ``R`` is a scalar and ``u_ref`` None (default 1).
    """

    def __init__(self, x_ref: Reference, Q: Tensor, R: Tensor, Qf: Tensor,
                 u_ref: Optional[Tensor] = None, angle_mask: Optional[Tensor] = None,
                 rate_weight: float = 0.0, nx: Optional[int] = None,
                 nu: Optional[int] = None) -> None:
        self.reference_fn = x_ref if callable(x_ref) else None
        if self.reference_fn is None:
            x_ref = torch.as_tensor(x_ref)
            if not x_ref.is_floating_point():
                x_ref = x_ref.to(torch.get_default_dtype())
            if x_ref.dim() == 1:
                x_ref = x_ref.unsqueeze(0)
            template = x_ref[0]
        else:
            if nx is None:
                nx = _evaluate_reference(self.reference_fn, torch.zeros(1)).shape[-1]
            template = torch.zeros(nx, dtype=torch.get_default_dtype())
        super().__init__(Q, R, Qf, template, u_ref, angle_mask, rate_weight, nu)
        self.x_ref = x_ref if self.reference_fn is None else None

    def goal(self, k: int) -> Tensor:
        """
        Return the reference state of step ``k`` (the last one beyond the reference).

        :param k: step index.
        :return: ``(nx,)``.
        """
        reference = self._reference()
        return reference[min(k, reference.shape[0] - 1)]

    def goals(self, horizon: int) -> Tensor:
        """
        Return the reference states of steps ``0..H``, padded with the last one.

        :param horizon: ``H``.
        :return: ``(H + 1, nx)``.
        """
        reference = self._reference()
        length = reference.shape[0]
        if length >= horizon + 1:
            return reference[:horizon + 1]
        return torch.cat((reference, reference[-1:].expand(horizon + 1 - length, self.nx)))

    def _reference(self) -> Tensor:
        if self.x_ref is None:
            raise ValueError('TrackingCost with a callable reference: call bind(t0, dt, H) '
                             'first to resolve it')
        return self.x_ref

    def bind(self, t0: float, dt: float, horizon: int) -> 'TrackingCost':
        """
        Return the cost with the reference resolved for a horizon starting at ``t0``.

        :param t0: start time in s.
        :param dt: step in s.
        :param horizon: number of steps ``H``.
        :return: a cost whose reference has exactly ``H + 1`` states (``self`` when it has).
        """
        if self.reference_fn is None:
            if self.x_ref.shape[0] == horizon + 1:
                return self
            return TrackingCost(self.goals(horizon), self.Q, self.R, self.Qf, self.u_goal,
                                self.angle_mask, self.rate_weight)
        dtype, device = self.Q.dtype, self.Q.device
        times = t0 + dt * torch.arange(horizon + 1, dtype=dtype, device=device)
        reference = _evaluate_reference(self.reference_fn, times).to(dtype=dtype, device=device)
        if tuple(reference.shape) != (horizon + 1, self.nx):
            raise ShapeError(f'x_ref(t): expected states of shape ({self.nx},), got '
                             f'{tuple(reference.shape[1:])}')
        return TrackingCost(reference, self.Q, self.R, self.Qf, self.u_goal, self.angle_mask,
                            self.rate_weight)

    def terminal(self, x: Tensor) -> Tensor:
        """
        Terminal cost against the last reference state (call :meth:`bind` first).

        :param x: final states ``(..., nx)``.
        :return: ``(...)``.
        """
        error = state_error(x, self._reference()[-1], self.angle_mask)
        return self._quadratic(error, self.Qf)


def _evaluate_reference(function: Callable, times: Tensor) -> Tensor:
    """Call a reference with a tensor of times, or once per time if it only takes floats."""
    try:
        reference = torch.as_tensor(function(times))
        if reference.dim() == 2 and reference.shape[0] == times.shape[0]:
            return reference
    except (TypeError, ValueError, RuntimeError):
        pass
    return torch.stack([torch.as_tensor(function(t)) for t in times.tolist()])
