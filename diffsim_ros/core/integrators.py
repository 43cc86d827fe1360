"""
Time integration of the robot dynamics and batched differentiable rollouts.

The state is ``x = [q; v]`` of shape ``(..., nq + nv)``.  Configurations move with
:func:`diffsim_ros.core.configuration.integrate`; for fixed-base models (``nq == nv``) that is
``q + dt v`` and every step is the plain vector-space scheme it always was.  On a floating
base, RK4 is the Runge-Kutta-Munthe-Kaas method, 4th order on SE(3).
"""

from typing import Callable, Optional

import torch

from .configuration import (check_configuration, configuration_sizes, integrate, is_floating,
                            momentum_hold, semi_implicit_update)
from .dispatch import aba
from .errors import check_trailing_shape
from .model import RobotModel

Tensor = torch.Tensor
TorqueFn = Callable[[Tensor, Tensor, Tensor], Tensor]


#: Velocity (rad/s or m/s) over which the smooth Coulomb friction ramps up.
FRICTION_VELOCITY_SCALE = 1e-2


def joint_friction(model: RobotModel, qd: Tensor,
                   velocity_scale: float = FRICTION_VELOCITY_SCALE) -> Tensor:
    """
    Return the URDF ``<dynamics damping friction>`` torque, smooth in the velocity.

    ``damping * qd + friction * tanh(qd / velocity_scale)``; it opposes motion and is
    differentiable w.r.t. ``model.damping`` and ``model.friction``.

    :param model: the robot (``damping`` and ``friction`` may carry batch dims).
    :param qd: joint velocities ``(..., n)``.
    :param velocity_scale: velocity (rad/s or m/s) over which Coulomb friction ramps up.
    :return: friction torque ``(..., n)`` to subtract from the applied torque.
    """
    return model.damping * qd + model.friction * torch.tanh(qd / velocity_scale)


def with_joint_friction(model: RobotModel, torque_fn: Optional[TorqueFn] = None,
                        velocity_scale: float = FRICTION_VELOCITY_SCALE) -> TorqueFn:
    """
    Wrap a command-to-torque map so that it also applies the model's joint friction.

    :param model: the robot whose ``damping``/``friction`` are used.
    :param torque_fn: inner ``(q, qd, u) -> tau``; joint torques ``u`` when None.
    :param velocity_scale: see :func:`joint_friction`.
    :return: ``(q, qd, u) -> tau - joint_friction(qd)``.
    """
    def torque(q: Tensor, qd: Tensor, u: Tensor) -> Tensor:
        tau = u if torque_fn is None else torque_fn(q, qd, u)
        return tau - joint_friction(model, qd, velocity_scale)
    return torque


def forward_dynamics(model: RobotModel, q: Tensor, qd: Tensor, u: Tensor,
                     torque_fn: Optional[TorqueFn] = None) -> Tensor:
    """
    Return joint accelerations for a command ``u``.

    :param model: the robot.
    :param q: joint positions ``(..., n)``.
    :param qd: joint velocities ``(..., n)``.
    :param u: commands ``(..., m)``; joint torques when ``torque_fn`` is None.
    :param torque_fn: ``(q, qd, u) -> tau`` mapping commands to the net applied joint torque
        (actuator model minus friction), e.g. a DC motor for voltage-driven robots.
    :return: ``(..., n)``.
    """
    tau = u if torque_fn is None else torque_fn(q, qd, u)
    return aba(model, q, qd, tau)


def semi_implicit_euler(model: RobotModel, x: Tensor, u: Tensor, dt: float,
                        torque_fn: Optional[TorqueFn] = None) -> Tensor:
    """
    Advance ``x = [q; v]`` by one semi-implicit (symplectic) Euler step.

    :param model: the robot.
    :param x: states ``(..., nq + nv)``.
    :param u: commands ``(..., m)``, held constant over the step.
    :param dt: step in s.
    :param torque_fn: see :func:`forward_dynamics`.
    :return: next states ``(..., nq + nv)``: ``v' = v + dt a``, ``q' = q + dt v'`` (a
        floating root holds its world-frame linear velocity over the step, see
        :func:`~diffsim_ros.core.configuration.momentum_hold`).
    """
    nq, nv = configuration_sizes(model)
    q, qd = x.split((nq, nv), dim=-1)
    qd_step = qd + dt * forward_dynamics(model, q, qd, u, torque_fn) \
        + momentum_hold(model, qd, dt)
    return torch.cat(semi_implicit_update(model, q, qd_step, dt), dim=-1)


def rk4(model: RobotModel, x: Tensor, u: Tensor, dt: float,
        torque_fn: Optional[TorqueFn] = None) -> Tensor:
    """
    Advance ``x = [q; v]`` by one Runge-Kutta 4 step (zero-order-hold command).

    Classical RK4 for fixed-base models; Runge-Kutta-Munthe-Kaas on a floating base (see
    :func:`_rk4_munthe_kaas`).

    :param model: the robot.
    :param x: states ``(..., nq + nv)``.
    :param u: commands ``(..., m)``.
    :param dt: step in s.
    :param torque_fn: see :func:`forward_dynamics`.
    :return: next states ``(..., nq + nv)``.
    """
    if is_floating(model):
        return _rk4_munthe_kaas(model, x, u, dt, torque_fn)

    def derivative(state):
        q, qd = state.chunk(2, dim=-1)
        return torch.cat((qd, forward_dynamics(model, q, qd, u, torque_fn)), dim=-1)

    k1 = derivative(x)
    k2 = derivative(x + 0.5 * dt * k1)
    k3 = derivative(x + 0.5 * dt * k2)
    k4 = derivative(x + dt * k3)
    return x + (dt / 6.0) * (k1 + 2.0 * k2 + 2.0 * k3 + k4)


def _twist_bracket(a: Tensor, b: Tensor) -> Tensor:
    """Lie bracket ``[a, b]`` of twists ``[linear; angular]`` ``(..., 6)`` on se(3)."""
    a_lin, a_ang = a[..., :3], a[..., 3:]
    b_lin, b_ang = b[..., :3], b[..., 3:]
    shape = torch.broadcast_shapes(a.shape, b.shape)[:-1] + (3,)
    a_lin, a_ang, b_lin, b_ang = (t.expand(shape) for t in (a_lin, a_ang, b_lin, b_ang))
    return torch.cat((torch.linalg.cross(a_ang, b_lin) + torch.linalg.cross(a_lin, b_ang),
                      torch.linalg.cross(a_ang, b_ang)), dim=-1)


def _local_rate(theta: Tensor, v: Tensor) -> Tensor:
    """
    Return the rate of the local coordinate ``theta`` (``q = integrate(q_n, theta)``).

    For the root, ``dexp^-1_{-theta}(v) = v + [theta, v] / 2 + [theta, [theta, v]] / 12``,
    truncated after the term that 4th order needs (Munthe-Kaas 1999); joints: ``v``.
    """
    root_theta, root_v = theta[..., :6], v[..., :6]
    bracket = _twist_bracket(root_theta, root_v)
    root = root_v + 0.5 * bracket + _twist_bracket(root_theta, bracket) / 12.0
    return torch.cat((root, v[..., 6:].expand(root.shape[:-1] + v[..., 6:].shape[-1:])), -1)


def _rk4_munthe_kaas(model: RobotModel, x: Tensor, u: Tensor, dt: float,
                     torque_fn: Optional[TorqueFn]) -> Tensor:
    """
    One Runge-Kutta-Munthe-Kaas 4 step for a floating base.

    Classical RK4 on the local coordinate ``theta`` of ``q = integrate(q_n, theta)`` with the
    ``dexp^-1`` correction of :func:`_local_rate`; velocities are a vector space.
    """
    nq, nv = configuration_sizes(model)
    q, v = x.split((nq, nv), dim=-1)
    theta_rates, accelerations = [], []
    theta = torch.zeros_like(v)
    for fraction in (0.0, 0.5, 0.5, 1.0):
        if theta_rates:
            theta = fraction * dt * theta_rates[-1]
            v_stage = v + fraction * dt * accelerations[-1]
            q_stage = integrate(model, q, theta)
        else:
            v_stage, q_stage = v, q
        accelerations.append(forward_dynamics(model, q_stage, v_stage, u, torque_fn))
        theta_rates.append(_local_rate(theta, v_stage))
    k1, k2, k3, k4 = theta_rates
    a1, a2, a3, a4 = accelerations
    q_next = integrate(model, q, (dt / 6.0) * (k1 + 2.0 * k2 + 2.0 * k3 + k4))
    v_next = v + (dt / 6.0) * (a1 + 2.0 * a2 + 2.0 * a3 + a4)
    shape = torch.broadcast_shapes(q_next.shape[:-1], v_next.shape[:-1])
    return torch.cat((q_next.expand(shape + (nq,)), v_next.expand(shape + (nv,))), dim=-1)


INTEGRATORS = {'semi_implicit_euler': semi_implicit_euler, 'rk4': rk4}


def rollout(model: RobotModel, x0: Tensor, controls: Tensor, dt: float, method: str = 'rk4',
            torque_fn: Optional[TorqueFn] = None) -> Tensor:
    """
    Simulate a batch of trajectories; differentiable w.r.t. states, controls and parameters.

    :param model: the robot; parameter batch dims broadcast against ``x0``'s.
    :param x0: initial states ``(..., nq + nv)`` = ``[q; v]``.
    :param controls: commands ``(..., T, m)`` applied with zero-order hold.
    :param dt: step in s.
    :param method: ``'rk4'`` or ``'semi_implicit_euler'``.
    :param torque_fn: see :func:`forward_dynamics`.
    :return: states ``(..., T + 1, nq + nv)`` including ``x0``.
    :raises ValueError: for a floating base whose start quaternion is not unit (or a
        non-finite start), from :func:`~diffsim_ros.core.configuration.check_configuration`.
    """
    try:
        step = INTEGRATORS[method]
    except KeyError:
        raise ValueError(f'unknown integrator {method!r}; valid: '
                         f'{", ".join(INTEGRATORS)}') from None
    nq, nv = configuration_sizes(model)
    check_trailing_shape('x0', x0, (nq + nv,))
    if is_floating(model):
        # The start is the one configuration a rollout does not make itself.
        check_configuration(model, x0[..., :nq])
    if controls.dim() < 2:
        raise ValueError(f'controls: expected shape (..., T, m), got {tuple(controls.shape)}')
    states = [x0]
    for u in controls.unbind(-2):
        states.append(step(model, states[-1], u, dt, torque_fn))
    shape = torch.broadcast_shapes(*(s.shape for s in states))
    return torch.stack([s.expand(shape) for s in states], dim=-2)
