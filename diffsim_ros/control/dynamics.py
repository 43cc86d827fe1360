"""
Discrete-time robot dynamics ``x_{k+1} = f(x_k, u_k)`` for the controllers.

The state is ``x = [q; qd]`` (``nx = 2 n``) and the command ``u`` drives the robot's command
joints (``nu`` of them) in the driver's unit: joint torque, or motor voltage for the Quanser
robots, turned into torque by a DC-motor model.  Everything is differentiable and batched over
leading dims (states, samples and the model's own parameter batch dims), so one call rolls out
many MPPI samples or posterior particles, and the Jacobians along a whole horizon come from one
batched forward and backward pass.
"""

from typing import Callable, Optional, Sequence, Tuple

import torch

from .. import robots
from ..core.actuators import DCMotor
from ..core.errors import ShapeError
from ..core.integrators import INTEGRATORS, joint_friction
from ..core.model import RobotModel

Tensor = torch.Tensor
Actuator = Callable[[Tensor, Tensor, Tensor], Tensor]


class MotorActuator:
    """
    Voltage-driven DC motors on some joints: ``tau_j = gain V - back_emf qd_j`` (linear).

    The coefficients are taken from a :class:`~diffsim_ros.core.DCMotor`, evaluated once, so a
    rollout pays two element-wise products per step and no autograd bookkeeping for the motor.

    :param motor: motor model with one motor per command joint.
    :param joint_indices: model index of the joint each motor drives, in command order.
    :param n: number of model joints.
    """

    def __init__(self, motor: DCMotor, joint_indices: Sequence[int], n: int) -> None:
        if motor.n != len(joint_indices):
            raise ValueError(f'the motor model has {motor.n} motors for '
                             f'{len(joint_indices)} command joints')
        with torch.no_grad():
            zeros = torch.zeros(motor.n, dtype=motor.motor_constant.dtype,
                                device=motor.motor_constant.device)
            self.gain = motor(torch.ones_like(zeros), zeros).detach()
            self.back_emf = -motor(zeros, torch.ones_like(zeros)).detach()
        self.joint_indices = tuple(int(i) for i in joint_indices)
        self.selection = _selection(self.joint_indices, n, self.gain.dtype, self.gain.device)

    def __call__(self, q: Tensor, qd: Tensor, u: Tensor) -> Tensor:
        """
        Joint torques produced by the command voltages.

        :param q: joint positions ``(..., n)`` (unused).
        :param qd: joint velocities ``(..., n)``.
        :param u: voltages ``(..., nu)`` in V.
        :return: joint torques ``(..., n)``; zero on joints without a motor.
        """
        if self.gain.dtype != qd.dtype or self.gain.device != qd.device:
            self.gain, self.back_emf, self.selection = (
                t.to(qd) for t in (self.gain, self.back_emf, self.selection))
        qd_motor = qd @ self.selection
        return (self.gain * u - self.back_emf * qd_motor) @ self.selection.mT


def _selection(indices: Sequence[int], n: int, dtype: torch.dtype,
               device: torch.device) -> Tensor:
    """Return ``S (n, m)`` with ``S[indices[j], j] = 1``: ``tau = u @ S.T`` scatters commands."""
    selection = torch.zeros(n, len(indices), dtype=dtype, device=device)
    for column, index in enumerate(indices):
        selection[index, column] = 1.0
    return selection


class ModelDynamics:
    """
    ``x_{k+1} = f(x_k, u_k)`` for ``x = [q; qd]`` (``nx = 2n``) and commands ``u`` (``nu``).

    :param model: the robot (parameter batch dims broadcast against the state's).
    :param dt: control step in s, > 0.
    :param command_joints: names of the commanded joints, in command order; all movable
        joints (model order) when None.
    :param actuator: ``(q, qd, u) -> tau (..., n)`` turning commands into joint torques;
        None applies ``u`` as torques on ``command_joints``.
    :param friction: subtract the model's ``damping``/``friction`` joint friction.
    :param method: integrator, ``'semi_implicit_euler'`` or ``'rk4'``.
    :param substeps: integrator steps per control step (zero-order hold), >= 1.
    :param u_min: lower command limits ``(nu,)``; ``-effort_limit`` of the command joints when
        None (unbounded where the URDF gives no positive limit).
    :param u_max: upper command limits ``(nu,)``; ``effort_limit`` when None.
    :raises ValueError: unknown integrator, bad ``dt``/``substeps`` or unknown joint names.
    """

    def __init__(self, model: RobotModel, dt: float,
                 command_joints: Optional[Sequence[str]] = None,
                 actuator: Optional[Actuator] = None, friction: bool = True,
                 method: str = 'semi_implicit_euler', substeps: int = 1,
                 u_min: Optional[Tensor] = None, u_max: Optional[Tensor] = None) -> None:
        if method not in INTEGRATORS:
            raise ValueError(f'unknown integrator {method!r}; valid: {", ".join(INTEGRATORS)}')
        if not dt > 0:
            raise ValueError(f'dt must be > 0, got {dt}')
        if int(substeps) != substeps or substeps < 1:
            raise ValueError(f'substeps must be a positive int, got {substeps}')
        names = tuple(model.joint_names if command_joints is None else command_joints)
        indices = tuple(model.joint_index(name) for name in names)
        if len(set(indices)) != len(indices) or not indices:
            raise ValueError(f'command_joints must be distinct and non-empty, got {names}')
        self.model = model
        self.dt = float(dt)
        self.command_joints = names
        self.command_indices = indices
        self.actuator = actuator
        self.friction = bool(friction)
        self.method = method
        self.substeps = int(substeps)
        self.nx = 2 * model.n
        self.nu = len(indices)
        self._integrator = INTEGRATORS[method]
        dtype, device = model.dtype, model.device
        self._selection = None if indices == tuple(range(model.n)) else _selection(
            indices, model.n, dtype, device)
        effort = model.effort_limit.to(dtype=dtype, device=device)[list(indices)]
        effort = torch.where(effort > 0, effort, torch.full_like(effort, float('inf')))
        self.u_max = self._limit(u_max, effort, 'u_max')
        self.u_min = self._limit(u_min, -effort, 'u_min')
        if bool((self.u_min > self.u_max).any()):
            raise ValueError(f'u_min {self.u_min.tolist()} exceeds u_max {self.u_max.tolist()}')

    def _limit(self, value: Optional[Tensor], default: Tensor, name: str) -> Tensor:
        if value is None:
            return default
        value = torch.as_tensor(value, dtype=default.dtype, device=default.device)
        value = value.expand(default.shape) if value.dim() == 0 else value
        if tuple(value.shape) != (self.nu,):
            raise ShapeError(f'{name}: expected shape ({self.nu},), got {tuple(value.shape)}')
        return value.clone()

    @classmethod
    def for_robot(cls, robot: str, model: RobotModel, dt: float, **kw: object) -> 'ModelDynamics':
        """
        Build the dynamics of a catalog robot: its command joints, limits and motor model.

        Voltage-commanded robots (``command_unit == 'V'``) get their DC motors
        (``robots.get(robot).dc_motor_kwargs()``); the limits are the catalog's
        ``command_limit``.

        :param robot: catalog name (``diffsim_ros.robots.names()``).
        :param model: the robot model (nominal or identified).
        :param dt: control step in s.
        :param kw: further constructor arguments (``friction``, ``method``, ``substeps``...),
            overriding the catalog's.
        :return: the dynamics.
        """
        info = robots.get(robot)
        limit = torch.tensor([info.command_limit[i] for i in info.command_indices],
                             dtype=model.dtype, device=model.device)
        args = {'command_joints': info.command_joints, 'u_min': -limit, 'u_max': limit}
        if info.command_unit == 'V' and 'actuator' not in kw:
            motor = DCMotor(len(info.command_joints), **info.dc_motor_kwargs(),
                            dtype=model.dtype, device=model.device)
            indices = [model.joint_index(name) for name in info.command_joints]
            args['actuator'] = MotorActuator(motor, indices, model.n)
        args.update(kw)
        return cls(model, dt, **args)

    def with_model(self, model: RobotModel) -> 'ModelDynamics':
        """
        Return the same dynamics (commands, actuator, limits, integrator) on another model.

        :param model: the new model, with the same joints.
        :return: a new :class:`ModelDynamics`; ``self`` is unchanged.
        """
        if tuple(model.joint_names) != tuple(self.model.joint_names):
            raise ValueError(f'the new model has joints {model.joint_names}, expected '
                             f'{self.model.joint_names}')
        return ModelDynamics(model, self.dt, self.command_joints, self.actuator, self.friction,
                             self.method, self.substeps, self.u_min, self.u_max)

    def torque(self, q: Tensor, qd: Tensor, u: Tensor) -> Tensor:
        """
        Net applied joint torque: actuator torque minus joint friction.

        :param q: joint positions ``(..., n)``.
        :param qd: joint velocities ``(..., n)``.
        :param u: commands ``(..., nu)``.
        :return: ``(..., n)``.
        """
        if self.actuator is not None:
            tau = self.actuator(q, qd, u)
        elif self._selection is None:
            tau = u
        else:
            tau = u @ self._selection.mT
        if self.friction:
            tau = tau - joint_friction(self.model, qd)
        return tau

    def step(self, x: Tensor, u: Tensor) -> Tensor:
        """
        Advance the state by one control step with the command held constant.

        :param x: states ``(..., nx)``.
        :param u: commands ``(..., nu)`` (broadcast against ``x``; not clipped here).
        :return: next states, the broadcast of ``x``, ``u`` and the model's batch dims.
        """
        h = self.dt / self.substeps
        for _ in range(self.substeps):
            x = self._integrator(self.model, x, u, h, self.torque)
        return x

    def rollout(self, x0: Tensor, controls: Tensor) -> Tensor:
        """
        Simulate open-loop command sequences.

        :param x0: initial states ``(..., nx)``.
        :param controls: commands ``(..., H, nu)``.
        :return: states ``(..., H + 1, nx)`` including ``x0``.
        """
        states = [x0]
        for u in controls.unbind(-2):
            states.append(self.step(states[-1], u))
        shape = torch.broadcast_shapes(*(s.shape for s in states))
        return torch.stack([s.expand(shape) for s in states], dim=-2)

    def jacobians(self, x: Tensor, u: Tensor) -> Tuple[Tensor, Tensor]:
        """
        Return ``A = df/dx`` and ``B = df/du`` at a batch of points, by reverse-mode autograd.

        One forward pass over ``nx`` copies of every point and one backward pass give all the
        Jacobians at once (row ``j`` of each Jacobian is the gradient of output ``j`` of copy
        ``j``), so a whole iLQR horizon costs one batched call and no finite differences.
        The model's parameters must not carry batch dims here.

        :param x: states ``(..., nx)``.
        :param u: commands ``(..., nu)`` with the same leading dims.
        :return: ``A (..., nx, nx)`` and ``B (..., nx, nu)``.
        """
        nx = self.nx
        point = torch.cat((x, u.expand(x.shape[:-1] + u.shape[-1:])), dim=-1)
        with torch.enable_grad():
            seed = point.detach().unsqueeze(-2).expand(
                point.shape[:-1] + (nx, point.shape[-1])).clone().requires_grad_(True)
            out = self.step(seed[..., :nx], seed[..., nx:])
            selected = torch.diagonal(out, dim1=-2, dim2=-1).sum()
            (jac,) = torch.autograd.grad(selected, seed)
        return jac[..., :nx], jac[..., nx:]
