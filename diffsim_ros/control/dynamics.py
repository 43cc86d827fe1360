"""
Discrete-time robot dynamics ``x_{k+1} = f(x_k, u_k)`` for the controllers.

The state is ``x = [q; qd]`` (``nx = 2 n``) and the command ``u`` drives the robot's command
joints (``nu`` of them) in the driver's unit: joint torque, or motor voltage for the Quanser
robots, turned into torque by a DC-motor model.  Everything is differentiable and batched over
leading dims (states, samples and the model's own parameter batch dims), so one call rolls out
many MPPI samples or posterior particles, and the Jacobians along a whole horizon come from one
batched forward and backward pass.

MPC on small robots is bound by per-operation overhead, not arithmetic: one eager Qube step
runs a few hundred tiny tensor operations.  With ``compile=True`` the gradient-free step is
``torch.compile``-d (Inductor's C++ wrapper) into one call per step, and the Jacobians come
from central differences of that compiled step, all points of a horizon in one batched call.
The compiled code is cached per robot, dtype and device and takes the dynamics (model
included) as an argument, so controllers of the same robot and refitted models share it;
each new batch shape compiles once (tens of seconds), on first use.

With ``native=True`` a gradient-free rollout runs the whole horizon in one call of a C++ kernel
(:func:`~diffsim_ros.core.native.feedback_rollout_native`: the same semi-implicit Euler ABA
step, affine actuator and joint friction, with the iLQR's clipped feedback law inside), and
single steps go through it too: a few microseconds per step instead of a Python call of tens
of microseconds, and nothing to compile but the extension.  The Jacobians then come in
closed form from :func:`~diffsim_ros.core.aba_derivatives` (one C++ call per substep for
all points of a horizon, chained through the affine torque map and the Euler update)
instead of central differences: exact to rounding, and faster (a 50-step Qube horizon
1.8x, a 20-step Panda horizon 17x, one thread; ``benchmarks/README.md``).
It needs the semi-implicit Euler integrator, a linear actuator (None or
:class:`MotorActuator`), no extra friction module and a model without parameter batch dims on
the CPU; otherwise, and when the extension cannot be built, the compiled or eager path runs
instead (logged once).

An extra friction module (``friction_model``: a fit's sigmoid or Stribeck friction, loaded
from a model document or a fit's ``params.yaml``) acts beside the URDF fields, as in
:func:`~diffsim_ros.sysid.losses.make_torque_fn`:
``tau = actuator(u) - damping qd - coulomb tanh(qd / s) - friction_model(q, qd)``.
"""

import copy
import math
import threading
from typing import Callable, Dict, Optional, Sequence, Tuple

import torch
from torch import nn

from .. import robots
from ..core.actuators import DCMotor
from ..core.derivatives import aba_derivatives
from ..core.errors import ShapeError
from ..core.integrators import FRICTION_VELOCITY_SCALE, INTEGRATORS, joint_friction
from ..core.model import RobotModel
from ..core.native import log_fallback, rollout_kernel, RolloutKernel

Tensor = torch.Tensor
Actuator = Callable[[Tensor, Tensor, Tensor], Tensor]


class _Keep:
    """Type of :data:`KEEP`."""

    def __repr__(self) -> str:
        """Return the name it is exported under."""
        return 'KEEP'


#: ``friction_model`` default of :meth:`ModelDynamics.with_model` and the controllers'
#: ``set_model``: keep the extra friction module in use.
KEEP = _Keep()


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

    def to(self, dtype: Optional[torch.dtype] = None,
           device: Optional[torch.device] = None) -> 'MotorActuator':
        """
        Return a copy with the coefficients converted (``self`` when nothing changes).

        :param dtype: floating dtype.
        :param device: device.
        :return: the converted actuator.
        """
        gain = self.gain.to(dtype=dtype, device=device)
        if gain.dtype == self.gain.dtype and gain.device == self.gain.device:
            return self
        actuator = object.__new__(MotorActuator)
        actuator.joint_indices = self.joint_indices
        actuator.gain = gain
        actuator.back_emf = self.back_emf.to(gain)
        actuator.selection = self.selection.to(gain)
        return actuator

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


def _converted_module(module: Optional[nn.Module], dtype: torch.dtype,
                      device: torch.device) -> Optional[nn.Module]:
    """Return the module with its parameters in ``dtype`` on ``device`` (a copy if moved)."""
    if module is None:
        return None
    like = next(iter(module.parameters()), None)
    if like is None or (like.dtype == dtype and like.device == device):
        return module
    return copy.deepcopy(module).to(dtype=dtype, device=device)


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
    :param friction: subtract the model's ``damping``/``friction`` joint friction and the
        extra friction module.
    :param method: integrator, ``'semi_implicit_euler'`` or ``'rk4'``.
    :param substeps: integrator steps per control step (zero-order hold), >= 1.
    :param u_min: lower command limits ``(nu,)``; ``-effort_limit`` of the command joints when
        None (unbounded where the URDF gives no positive limit).
    :param u_max: upper command limits ``(nu,)``; ``effort_limit`` when None.
    :param compile: run gradient-free steps through the shared ``torch.compile``-d step and
        take the Jacobians by central differences of it (see the module docstring); steps
        that need gradients stay eager.
    :param native: run gradient-free rollouts, steps and difference Jacobians through the
        C++ rollout kernel where it applies (module docstring); ``native`` tells whether it
        does for this dynamics.
    :param friction_model: extra friction module ``(q, qd) -> tau_f (..., n)`` (module
        docstring), converted to the model's dtype and device (a copy; the caller's module is
        untouched); None: the URDF fields only.
    :raises ValueError: unknown integrator, bad ``dt``/``substeps`` or unknown joint names.
    """

    def __init__(self, model: RobotModel, dt: float,
                 command_joints: Optional[Sequence[str]] = None,
                 actuator: Optional[Actuator] = None, friction: bool = True,
                 method: str = 'semi_implicit_euler', substeps: int = 1,
                 u_min: Optional[Tensor] = None, u_max: Optional[Tensor] = None,
                 compile: bool = False,  # noqa: A002 (the option's name)
                 native: bool = False, friction_model: Optional[nn.Module] = None) -> None:
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
        if isinstance(actuator, MotorActuator):
            actuator = actuator.to(dtype=model.dtype, device=model.device)
        self.model = model
        self.dt = float(dt)
        self.command_joints = names
        self.command_indices = indices
        self.actuator = actuator
        self.compiled = bool(compile)
        self.friction = bool(friction)
        self.friction_model = _converted_module(friction_model, model.dtype, model.device)
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
        #: Whether the native rollout kernel was asked for (see ``native``).
        self.native_requested = bool(native)
        self._affine = self._affine_torque() if native else None
        self._kernel: Optional[RolloutKernel] = None
        self._zero_gains: Dict[tuple, Tuple[Tensor, Tensor]] = {}

    @property
    def native(self) -> bool:
        """Return whether gradient-free rollouts run in the C++ kernel (module docstring)."""
        return self._affine is not None and self._rollout_kernel() is not None

    def _affine_torque(self) -> Optional[Tuple[Tensor, Tensor, Tensor, Tensor]]:
        """
        Return the torque map as ``(command (n, nu), emf, damping, friction)`` for the kernel.

        ``torque(q, qd, u) = command u - (emf + damping) qd - friction tanh(qd / s)``; None
        (reason logged once) when the dynamics is not one the kernel runs.  What the kernel
        needs of the model (dtype, device, no batch dims) :func:`rollout_kernel` checks.
        """
        model = self.model
        reason = None
        if self.method != 'semi_implicit_euler':
            reason = f'rollout: the {self.method} integrator'
        elif self.actuator is not None and not isinstance(self.actuator, MotorActuator):
            reason = (f'rollout: a {type(self.actuator).__name__} actuator (not a linear '
                      'MotorActuator)')
        elif model.damping.dim() != 1 or model.friction.dim() != 1:
            reason = 'rollout: the model has parameter batch dims'
        elif self.friction_model is not None and self.friction:
            reason = (f'rollout: a {type(self.friction_model).__name__} friction module (the '
                      'kernel has the URDF friction fields only)')
        if reason is not None:
            log_fallback(reason)
            return None
        n, dtype, device = model.n, model.dtype, model.device
        selection = self._selection if self._selection is not None else torch.eye(
            n, dtype=dtype, device=device)
        with torch.no_grad():
            if isinstance(self.actuator, MotorActuator):
                motor = self.actuator.to(dtype=dtype, device=device)
                command = motor.selection * motor.gain
                emf = motor.selection @ motor.back_emf
            else:
                command, emf = selection, torch.zeros(n, dtype=dtype, device=device)
            if self.friction:
                damping, friction = model.damping, model.friction
            else:
                damping = friction = torch.zeros(n, dtype=dtype, device=device)
            return tuple(t.detach().to(dtype).contiguous()
                         for t in (command, emf, damping, friction))

    def feedback_rollout(self, x0: Tensor, x_nom: Tensor, u_open: Tensor, gains: Tensor,
                         previous: Optional[Tensor] = None, clip: bool = True
                         ) -> Optional[Tuple[Tensor, Tensor]]:
        """
        Roll out ``u_t = u_open[t] + gains[t] (z_t - z_nom_t)`` in the C++ kernel.

        :param x0: initial states ``(B, nx)``.
        :param x_nom: nominal states ``(>= H, nx)``.
        :param u_open: open-loop commands ``(H, B, nu)``.
        :param gains: ``(H, nu, nx)``, or ``(H, nu, nx + nu)`` on ``z = [x; u_{t-1}]``.
        :param previous: nominal previous commands ``(H, nu)`` for the augmented gains.
        :param clip: clip the commands to ``[u_min, u_max]``.
        :return: ``(states (B, H + 1, nx), commands (B, H, nu))``, or None when the kernel
            does not run (not ``native``, gradients enabled, or the extension is missing).
        """
        kernel = self._rollout_kernel()
        if kernel is None or torch.is_grad_enabled():
            return None
        lower, upper = (self.u_min, self.u_max) if clip else self._unbounded
        return kernel(x0, x_nom, u_open, gains, previous, lower, upper, self.dt, self.substeps)

    def _rollout_kernel(self) -> Optional[RolloutKernel]:
        """Return the kernel bound to this model (built on first use), or None."""
        if self._affine is None:
            return None
        if self._kernel is None:
            self._kernel = rollout_kernel(self.model, *self._affine, FRICTION_VELOCITY_SCALE)
            if self._kernel is None:   # no extension here: torch from now on
                self._affine = None
                return None
            self._unbounded = (torch.full_like(self.u_min, -math.inf),
                               torch.full_like(self.u_max, math.inf))
        return self._kernel

    def _native_open_loop(self, x0: Tensor, controls: Tensor) -> Optional[Tensor]:
        """Open-loop rollout ``(..., H + 1, nx)`` in the kernel, or None (see above)."""
        if self._affine is None or torch.is_grad_enabled():
            return None
        horizon = controls.shape[-2]
        batch = x0.shape[:-1]
        if controls.shape[:-2] != batch:
            batch = torch.broadcast_shapes(batch, controls.shape[:-2])
        x = x0.expand(batch + (self.nx,)).reshape(-1, self.nx)
        u_open = controls.expand(batch + controls.shape[-2:]).reshape(
            -1, horizon, self.nu).transpose(0, 1)
        zeros = self._zero_gains.get((horizon, x.dtype))
        if zeros is None:
            zeros = (x.new_zeros(horizon, self.nx), x.new_zeros(horizon, self.nu, self.nx))
            self._zero_gains[(horizon, x.dtype)] = zeros
        out = self.feedback_rollout(x, zeros[0], u_open, zeros[1], clip=False)
        return None if out is None else out[0].reshape(batch + (horizon + 1, self.nx))

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

        Voltage-commanded robots get their DC motors, linearised
        (:class:`MotorActuator` of ``robots.interface(robot).actuator()``); the limits are the
        interface's ``command_limit``.

        :param robot: catalog name (``diffsim_ros.robots.names()``).
        :param model: the robot model (nominal or identified).
        :param dt: control step in s.
        :param kw: further constructor arguments (``friction``, ``method``, ``substeps``...),
            overriding the catalog's.
        :return: the dynamics.
        """
        interface = robots.interface(robot)
        limit = interface.command_limit.to(dtype=model.dtype, device=model.device)
        args = {'command_joints': interface.command_joints, 'u_min': -limit, 'u_max': limit}
        motor = interface.actuator(model.dtype, model.device)
        if motor is not None and 'actuator' not in kw:
            indices = [model.joint_index(name) for name in interface.command_joints]
            args['actuator'] = MotorActuator(motor, indices, model.n)
        args.update(kw)
        return cls(model, dt, **args)

    def with_model(self, model: RobotModel,
                   compile: Optional[bool] = None,  # noqa: A002
                   native: Optional[bool] = None,
                   friction_model: Optional[nn.Module] = KEEP) -> 'ModelDynamics':
        """
        Return the same dynamics (commands, actuator, limits, integrator) on another model.

        :param model: the new model, with the same joints.
        :param compile: switch the compiled path on or off; unchanged when None.
        :param native: switch the native rollouts on or off; unchanged when None.
        :param friction_model: the new model's extra friction module (None: none);
            :data:`KEEP`: the current one.
        :return: a new :class:`ModelDynamics`; ``self`` is unchanged.
        """
        if tuple(model.joint_names) != tuple(self.model.joint_names):
            raise ValueError(f'the new model has joints {model.joint_names}, expected '
                             f'{self.model.joint_names}')
        return ModelDynamics(model, self.dt, self.command_joints, self.actuator, self.friction,
                             self.method, self.substeps, self.u_min, self.u_max,
                             self.compiled if compile is None else compile,
                             self.native_requested if native is None else native,
                             self.friction_model if friction_model is KEEP else friction_model)

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
            if self.friction_model is not None:
                tau = tau - self.friction_model(q, qd)
        return tau

    def step(self, x: Tensor, u: Tensor) -> Tensor:
        """
        Advance the state by one control step with the command held constant.

        With ``native`` or ``compile=True`` and gradients disabled, the kernel or the compiled
        step runs (same result to rounding).

        :param x: states ``(..., nx)``.
        :param u: commands ``(..., nu)`` (broadcast against ``x``; not clipped here).
        :return: next states, the broadcast of ``x``, ``u`` and the model's batch dims.
        """
        if self._affine is not None and not torch.is_grad_enabled():
            states = self._native_open_loop(x, u.unsqueeze(-2))
            if states is not None:
                return states[..., 1, :]
        if self.compiled and not torch.is_grad_enabled():
            return compiled('step', _eager_step, self)(self, x, u)
        return self.eager_step(x, u)

    def eager_step(self, x: Tensor, u: Tensor) -> Tensor:
        """
        Advance the state by one control step without the compiled path (differentiable).

        :param x: states ``(..., nx)``.
        :param u: commands ``(..., nu)``.
        :return: next states.
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
        native = self._native_open_loop(x0, controls)
        if native is not None:
            return native
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

        With ``native`` they are closed-form, from :func:`~diffsim_ros.core.aba_derivatives`
        chained through the torque map and the Euler update (exact to rounding); with
        ``compile=True`` central differences of the compiled step (steps
        ``cbrt(eps) (1 + |z|)``; relative error about 1e-10 in float64), all
        ``2 (nx + nu)`` perturbations of all points in one batched call.

        :param x: states ``(..., nx)``.
        :param u: commands ``(..., nu)`` with the same leading dims.
        :return: ``A (..., nx, nx)`` and ``B (..., nx, nu)``.
        """
        if self.native:
            return self._analytic_jacobians(x, u)
        if self.compiled:
            return self._difference_jacobians(x, u)
        nx = self.nx
        point = torch.cat((x, u.expand(x.shape[:-1] + u.shape[-1:])), dim=-1)
        with torch.enable_grad():
            seed = point.detach().unsqueeze(-2).expand(
                point.shape[:-1] + (nx, point.shape[-1])).clone().requires_grad_(True)
            out = self.step(seed[..., :nx], seed[..., nx:])
            selected = torch.diagonal(out, dim1=-2, dim2=-1).sum()
            (jac,) = torch.autograd.grad(selected, seed)
        return jac[..., :nx], jac[..., nx:]

    def _analytic_jacobians(self, x: Tensor, u: Tensor) -> Tuple[Tensor, Tensor]:
        """
        Closed-form Jacobians of the native step (see :meth:`jacobians`).

        Per substep ``h``: ``tau = command u - (emf + damping) qd - friction tanh(qd / s)``,
        ``qdd = ABA(q, qd, tau)``, ``qd' = qd + h qdd``, ``q' = q + h qd'``; ``dqdd/dq`` and
        ``dqdd/dqd`` at fixed ``tau`` and ``M^-1 = dqdd/dtau`` come from
        :func:`~diffsim_ros.core.aba_derivatives`, and the substeps' Jacobians are chained.
        """
        command, emf, damping, friction = self._affine
        n, h = self.model.n, self.dt / self.substeps
        u = u.expand(x.shape[:-1] + u.shape[-1:]).detach()
        q, qd = (t.contiguous() for t in x.detach().split((n, n), dim=-1))
        eye = torch.eye(n, dtype=x.dtype, device=x.device)
        A = B = None
        for _ in range(self.substeps):
            slope = torch.tanh(qd / FRICTION_VELOCITY_SCALE)
            tau = u @ command.mT - (emf + damping) * qd - friction * slope
            dtau_dqd = -(emf + damping) - friction * (1.0 - slope.square()) \
                / FRICTION_VELOCITY_SCALE
            qdd, dq, dqd, M_inv = aba_derivatives(self.model, q, qd, tau.contiguous())
            dqd = dqd + M_inv * dtau_dqd.unsqueeze(-2)
            du = M_inv @ command
            # rows [q'; qd'] of one substep, columns [q; qd] and u
            step_z = torch.cat((torch.cat((eye + h * h * dq, h * eye + h * h * dqd), -1),
                                torch.cat((h * dq, eye + h * dqd), -1)), -2)
            step_u = torch.cat((h * h * du, h * du), -2)
            A, B = (step_z, step_u) if A is None else (step_z @ A, step_z @ B + step_u)
            qd = qd + h * qdd
            q = q + h * qd
        return A, B

    def _difference_jacobians(self, x: Tensor, u: Tensor) -> Tuple[Tensor, Tensor]:
        """Central-difference Jacobians through the compiled step (see :meth:`jacobians`)."""
        nx = self.nx
        point = torch.cat((x, u.expand(x.shape[:-1] + u.shape[-1:])), dim=-1).detach()
        lead, m = point.shape[:-1], point.shape[-1]
        step = torch.finfo(point.dtype).eps ** (1.0 / 3.0) * (1.0 + point.abs())
        # Round the steps to representable offsets so that (z + h) - (z - h) is exactly 2 h.
        step = ((point + step) - point)
        offsets = torch.diag_embed(step)                                    # (..., m, m)
        probes = torch.cat((point.unsqueeze(-2) + offsets, point.unsqueeze(-2) - offsets), -2)
        probes = probes.reshape(-1, m)
        with torch.no_grad():
            # Contiguous operands: the compiled code is many times slower on strided ones.
            out = self.step(probes[:, :nx].contiguous(), probes[:, nx:].contiguous())
        out = out.reshape(lead + (2 * m, nx))
        jac = ((out[..., :m, :] - out[..., m:, :]) / (2.0 * step).unsqueeze(-1)).mT
        return jac[..., :nx], jac[..., nx:]


def _eager_step(dynamics: ModelDynamics, x: Tensor, u: Tensor) -> Tensor:
    """Call :meth:`ModelDynamics.eager_step`; the function ``torch.compile`` traces."""
    return dynamics.eager_step(x, u)


_compiled: Dict[tuple, Callable] = {}
_compiled_lock = threading.Lock()


def compiled(name: str, function: Callable, dynamics: ModelDynamics) -> Callable:
    """
    Return the shared ``torch.compile``-d version of ``function`` for a robot.

    One compiled function per ``(name, function, robot, joints, dtype, device)``: controllers
    of the same robot, and the refitted models they receive, reuse its code (the dynamics,
    model included, is an argument, so new parameter values with the same shapes do not
    recompile).  Each new input shape compiles on its first call (``dynamic=False``,
    Inductor's C++ wrapper, which cuts most of the per-call overhead at small batch sizes).

    :param name: name of the function in the cache.
    :param function: the function to compile; its first argument is the dynamics.
    :param dynamics: the dynamics it will be called with.
    :return: the compiled function.
    """
    model = dynamics.model
    key = (name, function, model.name, model.joint_names, model.dtype, str(model.device))
    with _compiled_lock:
        fn = _compiled.get(key)
        if fn is None:
            fn = torch.compile(function, dynamic=False, options={'cpp_wrapper': True})
            _compiled[key] = fn
    return fn
