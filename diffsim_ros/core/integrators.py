"""Time integration of the robot dynamics and batched differentiable rollouts."""

from typing import Callable, Optional

import torch

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
    Advance ``x = [q; qd]`` by one semi-implicit (symplectic) Euler step.

    :param model: the robot.
    :param x: states ``(..., 2n)``.
    :param u: commands ``(..., m)``, held constant over the step.
    :param dt: step in s.
    :param torque_fn: see :func:`forward_dynamics`.
    :return: next states ``(..., 2n)``: ``qd' = qd + dt qdd``, ``q' = q + dt qd'``.
    """
    q, qd = x.chunk(2, dim=-1)
    qd_next = qd + dt * forward_dynamics(model, q, qd, u, torque_fn)
    return torch.cat((q + dt * qd_next, qd_next), dim=-1)


def rk4(model: RobotModel, x: Tensor, u: Tensor, dt: float,
        torque_fn: Optional[TorqueFn] = None) -> Tensor:
    """
    Advance ``x = [q; qd]`` by one classical Runge-Kutta 4 step (zero-order-hold command).

    :param model: the robot.
    :param x: states ``(..., 2n)``.
    :param u: commands ``(..., m)``.
    :param dt: step in s.
    :param torque_fn: see :func:`forward_dynamics`.
    :return: next states ``(..., 2n)``.
    """
    def derivative(state):
        q, qd = state.chunk(2, dim=-1)
        return torch.cat((qd, forward_dynamics(model, q, qd, u, torque_fn)), dim=-1)

    k1 = derivative(x)
    k2 = derivative(x + 0.5 * dt * k1)
    k3 = derivative(x + 0.5 * dt * k2)
    k4 = derivative(x + dt * k3)
    return x + (dt / 6.0) * (k1 + 2.0 * k2 + 2.0 * k3 + k4)


INTEGRATORS = {'semi_implicit_euler': semi_implicit_euler, 'rk4': rk4}


def rollout(model: RobotModel, x0: Tensor, controls: Tensor, dt: float, method: str = 'rk4',
            torque_fn: Optional[TorqueFn] = None) -> Tensor:
    """
    Simulate a batch of trajectories; differentiable w.r.t. states, controls and parameters.

    :param model: the robot; parameter batch dims broadcast against ``x0``'s.
    :param x0: initial states ``(..., 2n)`` = ``[q; qd]``.
    :param controls: commands ``(..., T, m)`` applied with zero-order hold.
    :param dt: step in s.
    :param method: ``'rk4'`` or ``'semi_implicit_euler'``.
    :param torque_fn: see :func:`forward_dynamics`.
    :return: states ``(..., T + 1, 2n)`` including ``x0``.
    """
    try:
        step = INTEGRATORS[method]
    except KeyError:
        raise ValueError(f'unknown integrator {method!r}; valid: '
                         f'{", ".join(INTEGRATORS)}') from None
    check_trailing_shape('x0', x0, (2 * model.n,))
    if controls.dim() < 2:
        raise ValueError(f'controls: expected shape (..., T, m), got {tuple(controls.shape)}')
    states = [x0]
    for u in controls.unbind(-2):
        states.append(step(model, states[-1], u, dt, torque_fn))
    shape = torch.broadcast_shapes(*(s.shape for s in states))
    return torch.stack([s.expand(shape) for s in states], dim=-2)
