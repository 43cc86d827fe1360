"""
Time-indexed affine feedback policies, the output of every controller.

A :class:`FeedbackPolicy` holds a plan over ``H`` steps of length ``dt`` starting at ``t0``:
feedforward commands, feedback gains and the reference states they were linearised about.
Evaluating it between solves is cheap and never returns a non-finite command, so the MPC node
can keep commanding the robot from the last plan while the next solve runs.
"""

from dataclasses import dataclass
import math
from typing import Optional, Tuple, Union

import torch

from ..core.errors import ShapeError

Tensor = torch.Tensor


def wrap_angle(angle: Tensor) -> Tensor:
    """
    Wrap angles to ``(-pi, pi]``.

    :param angle: angles in rad, any shape.
    :return: ``angle + 2 pi m`` in ``(-pi, pi]`` for the integer ``m`` that puts it there.
    """
    return math.pi - torch.remainder(math.pi - angle, 2.0 * math.pi)


def state_error(x: Tensor, x_ref: Tensor, angle_mask: Optional[Tensor]) -> Tensor:
    """
    Return ``x - x_ref`` with the masked (angle) entries wrapped to ``(-pi, pi]``.

    :param x: states ``(..., nx)``.
    :param x_ref: reference states broadcastable to ``x``.
    :param angle_mask: ``(nx,)`` bool, True for entries that are angles; None for none.
    :return: ``(..., nx)``.
    """
    error = x - x_ref
    if angle_mask is None:
        return error
    return torch.where(angle_mask, wrap_angle(error), error)


@dataclass(frozen=True, eq=False)
class FeedbackPolicy:
    """
    Piecewise-constant affine feedback ``u = clip(u_ff[k] + K[k] (x - x_ref[k]))``.

    Step ``k = clamp(floor((t - t0) / dt), 0, H - 1)`` covers ``[t0 + k dt, t0 + (k + 1) dt)``;
    before ``t0`` the first and after the horizon the last step applies.

    :param t0: start time of step 0 in s.
    :param dt: step length in s, > 0.
    :param u_ff: feedforward commands ``(H, nu)``.
    :param K: feedback gains ``(H, nu, nx)``.
    :param x_ref: states the gains act about ``(H + 1, nx)`` (the planned trajectory).
    :param u_min: lower command limits ``(nu,)``.
    :param u_max: upper command limits ``(nu,)``.
    :param angle_mask: ``(nx,)`` bool: entries of ``x - x_ref`` wrapped to ``(-pi, pi]``.
    :param interpolate: within step ``k``, compare ``x`` with the reference interpolated
        linearly between ``x_ref[k]`` and ``x_ref[k + 1]`` (the planned path between knots;
        feedforward and gains stay piecewise constant, the hold the plan assumed).  Applied
        at a driver rate far above ``1 / dt``, the held knot would make the gains fight the
        planned motion.
    :raises ShapeError: inconsistent shapes.
    :raises ValueError: ``dt <= 0`` or an empty horizon.
    """

    t0: float
    dt: float
    u_ff: Tensor
    K: Tensor
    x_ref: Tensor
    u_min: Tensor
    u_max: Tensor
    angle_mask: Optional[Tensor] = None
    interpolate: bool = False

    def __post_init__(self) -> None:
        """Validate the shapes once, so that evaluation needs no checks."""
        if not self.dt > 0:
            raise ValueError(f'FeedbackPolicy.dt must be > 0, got {self.dt}')
        if self.u_ff.dim() != 2 or self.u_ff.shape[0] < 1:
            raise ShapeError(f'FeedbackPolicy.u_ff: expected shape (H, nu) with H >= 1, '
                             f'got {tuple(self.u_ff.shape)}')
        H, nu = self.u_ff.shape
        nx = self.x_ref.shape[-1] if self.x_ref.dim() == 2 else -1
        expected = {'K': (H, nu, nx), 'x_ref': (H + 1, nx), 'u_min': (nu,), 'u_max': (nu,)}
        if self.angle_mask is not None:
            expected['angle_mask'] = (nx,)
        for name, shape in expected.items():
            actual = tuple(getattr(self, name).shape)
            if actual != shape:
                raise ShapeError(f'FeedbackPolicy.{name}: expected shape {shape}, got {actual}')
        if self.angle_mask is not None and self.angle_mask.dtype != torch.bool:
            raise ValueError('FeedbackPolicy.angle_mask must be a bool tensor')

    @property
    def horizon(self) -> int:
        """Return the number of steps ``H``."""
        return self.u_ff.shape[0]

    @property
    def nx(self) -> int:
        """Return the state dimension."""
        return self.x_ref.shape[-1]

    @property
    def nu(self) -> int:
        """Return the command dimension."""
        return self.u_ff.shape[-1]

    def index(self, t: float) -> int:
        """
        Return the step that applies at time ``t``.

        :param t: time in s (NaN counts as ``t0``).
        :return: ``clamp(floor((t - t0) / dt), 0, H - 1)``.
        """
        steps = (float(t) - self.t0) / self.dt
        if math.isnan(steps):
            return 0
        # A relative 1e-9 keeps t = t0 + k dt in step k despite rounding of t0 + k * dt.
        steps = steps + 1e-9 * max(1.0, abs(steps))
        return int(min(max(math.floor(min(max(steps, -1.0), 2.0 ** 62)), 0), self.horizon - 1))

    def reference(self, t: float, k: Optional[int] = None) -> Tensor:
        """
        Return the reference state the gains act about at time ``t``.

        :param t: time in s.
        :param k: the step at ``t`` when already known.
        :return: ``x_ref[k]``, or with ``interpolate`` the linear interpolation towards
            ``x_ref[k + 1]`` (held at the ends: before ``t0`` and after the horizon).
        """
        k = self.index(t) if k is None else k
        if not self.interpolate:
            return self.x_ref[k]
        fraction = (float(t) - self.t0) / self.dt - k
        if not math.isfinite(fraction):
            return self.x_ref[k]
        fraction = min(max(fraction, 0.0), 1.0)
        return torch.lerp(self.x_ref[k], self.x_ref[k + 1], fraction)

    def __call__(self, t: float, x: Tensor) -> Tensor:
        """
        Evaluate the command at time ``t`` for the measured state ``x``.

        :param t: time in s (same clock as ``t0``).
        :param x: state ``(..., nx)``; rows with a non-finite entry get the feedforward only.
        :return: command ``(..., nu)`` within ``[u_min, u_max]``, always finite.
        """
        k = self.index(t)
        u_ff = torch.nan_to_num(self.u_ff[k], nan=0.0)
        x = x.to(self.x_ref)
        error = state_error(x, self.reference(t, k), self.angle_mask)
        u = u_ff + (self.K[k] @ error.unsqueeze(-1)).squeeze(-1)
        fallback = torch.clamp(u_ff, self.u_min, self.u_max)
        u = torch.clamp(u, self.u_min, self.u_max)
        ok = torch.isfinite(u).all(-1, keepdim=True) & torch.isfinite(x).all(-1, keepdim=True)
        return torch.where(ok, u, fallback)

    def shifted(self, steps: int) -> 'FeedbackPolicy':
        """
        Return the plan advanced by ``steps`` steps, padded by repeating its last step.

        Used to warm-start the next solve: ``t0`` moves forward by ``steps * dt``.

        :param steps: number of steps to drop, >= 0.
        :return: a policy with the same horizon.
        :raises ValueError: ``steps < 0``.
        """
        steps = int(steps)
        if steps < 0:
            raise ValueError(f'steps must be >= 0, got {steps}')
        if steps == 0:
            return self
        return FeedbackPolicy(
            t0=self.t0 + steps * self.dt, dt=self.dt, u_ff=shift_sequence(self.u_ff, steps),
            K=shift_sequence(self.K, steps), x_ref=shift_sequence(self.x_ref, steps),
            u_min=self.u_min, u_max=self.u_max, angle_mask=self.angle_mask,
            interpolate=self.interpolate)

    @staticmethod
    def constant(u: Union[Tensor, float], nx: int, u_min: Tensor, u_max: Tensor,
                 t0: float = 0.0, dt: float = 1.0, horizon: int = 1) -> 'FeedbackPolicy':
        """
        Return a policy that commands ``u`` (clipped) whatever the state (zero gains).

        :param u: command ``(nu,)`` or a scalar broadcast to ``u_min``'s shape.
        :param nx: state dimension.
        :param u_min: lower limits ``(nu,)``.
        :param u_max: upper limits ``(nu,)``.
        :param t0: start time in s.
        :param dt: step length in s.
        :param horizon: number of steps ``H``.
        :return: the policy (dtype and device of ``u_min``).
        """
        u_min = torch.as_tensor(u_min)
        u = torch.as_tensor(u, dtype=u_min.dtype, device=u_min.device).expand(u_min.shape)
        nu = u_min.shape[-1]
        return FeedbackPolicy(
            t0=float(t0), dt=float(dt), u_ff=u.expand(horizon, nu).clone(),
            K=u_min.new_zeros(horizon, nu, nx), x_ref=u_min.new_zeros(horizon + 1, nx),
            u_min=u_min, u_max=torch.as_tensor(u_max).to(u_min))


def shift_sequence(values: Tensor, steps: int) -> Tensor:
    """
    Drop the first ``steps`` entries of a sequence and pad by repeating the last one.

    :param values: ``(T, ...)``.
    :param steps: entries to drop, >= 0.
    :return: ``(T, ...)``.
    """
    if steps <= 0:
        return values
    length = values.shape[0]
    steps = min(steps, length - 1)
    tail = values[-1:].expand((steps,) + values.shape[1:])
    return torch.cat((values[steps:], tail), dim=0)


def warm_start(previous: Optional[Tensor], u_prev: Optional[Tensor], t_prev: Optional[float],
               t: float, dt: float, horizon: int, u_min: Tensor,
               u_max: Tensor) -> Tuple[Tensor, Optional[Tensor]]:
    """
    Return the initial control sequence of a receding-horizon solve and the command before it.

    :param previous: the last solve's controls ``(horizon, nu)``, or None before the first.
    :param u_prev: the command before ``previous[0]`` (None when unknown).
    :param t_prev: the time of ``previous[0]``, s.
    :param t: the time of the new solve, s.
    :param dt: control step, s.
    :param horizon: steps.
    :param u_min: ``(nu,)`` lower limits (also gives dtype and device).
    :param u_max: ``(nu,)`` upper limits.
    :return: ``(controls, u_prev)``: clipped zeros first; later the previous controls shifted
        by the elapsed steps, and the last command of the shifted-out part.
    """
    if previous is None:
        zeros = u_min.new_zeros(horizon, u_min.shape[-1])
        return torch.clamp(zeros, u_min, u_max), None
    steps = max(0, int(round((t - t_prev) / dt)))
    if steps == 0:
        return previous, u_prev
    return shift_sequence(previous, steps), previous[min(steps, horizon) - 1]
