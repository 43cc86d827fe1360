"""
Baseline controllers: energy swing-up + LQR balance, PD + gravity and computed torque.

Every baseline implements the controller protocol of :mod:`diffsim_ros.control`
(``dynamics``, ``solve(x0, t) -> FeedbackPolicy``, ``set_model``, ``reset``), so the
evaluation loop and the adaptive MPC wrapper drive them exactly like an MPC. They are cheap:
one solve is a handful of dynamics evaluations, meant to be called at the driver rate.

- :class:`SwingUpLQR` (Qube, cart-pole): the energy-pumping law of Astrom and Furuta (2000)
  written for any passive pendulum driven through an actuated joint: with the pendulum energy
  ``E`` measured from the upright state and normalised by the hanging-to-upright energy gap,
  the actuated joint is asked to accelerate at
  ``a = sat(k E sign(qd_p M_pa)) - kp q_a - kd v_a`` (``M_pa`` the inertia coupling; since
  ``dE/dt = -qd_p M_pa a`` this drives ``E`` to 0, the second part keeps the arm / cart
  centred; it damps the momentum velocity ``v_a = qd_a + M_ap qd_p / M_aa``, because damping
  ``qd_a``, which the pendulum's reaction moves in phase with ``qd_p M_pa``, drains the pumped
  energy: on the Qube at 4 V that stalls the swing at 2.1 rad), and the command realising
  ``a`` is read off the model (the acceleration is affine
  in the command). Within ``switch_angle`` of upright an LQR takes over, its gain from the
  discrete Riccati equation of the model linearised at the top by autograd.
- :class:`PDGravity` (arms): ``u = g(q) + Kp (q_ref - q) + Kd (qd_ref - qd)``.
- :class:`ComputedTorque` (arms): ``u = RNEA(q_ref, qd_ref, qdd_ref) + friction(qd_ref) +
  M(q_ref) (Kp e + Kd e_dot)``, i.e. the inverse dynamics of the reference plus PD feedback
  scaled by the mass matrix (a linear feedback policy along the reference).

When the robot's driver adds gravity compensation itself (libfranka), the arm controllers leave
the model's gravity out of the command.

Reference: K. J. Astrom and K. Furuta, "Swinging up a pendulum by energy control",
Automatica 36(2):287-295, 2000.
"""

from dataclasses import dataclass
import math
import time
from typing import Callable, Optional, Sequence, Tuple

import torch
from torch import nn

from .dynamics import KEEP, ModelDynamics
from .lqr import linearize, lqr_gain, lqr_law, solve_dare
from .policy import FeedbackPolicy
from .tasks import upright_angle
from .. import robots
from ..core.dispatch import crba, rnea
from ..core.energy import potential_energy
from ..core.integrators import joint_friction
from ..core.model import RobotModel

Tensor = torch.Tensor
ReferenceFn = Callable[[Tensor], Tuple[Tensor, Tensor, Tensor]]

__all__ = ['ComputedTorque', 'PDGravity', 'SwingUpDesign', 'SwingUpLQR', 'linearize', 'lqr_gain',
           'lqr_law', 'solve_dare', 'swing_up_design']


def _diag(values: Sequence[float], size: int, like: Tensor, what: str) -> Tensor:
    tensor = torch.as_tensor(values, dtype=like.dtype, device=like.device).reshape(-1)
    if tensor.numel() == 1:
        tensor = tensor.expand(size)
    if tensor.numel() != size:
        raise ValueError(f'{what}: expected {size} values, got {tensor.numel()}')
    return torch.diag(tensor)


def _gravity_in_command(model: RobotModel, value: Optional[bool]) -> bool:
    if value is not None:
        return bool(value)
    if model.name in robots.names():
        return robots.interface(model.name).driver_adds_gravity
    return False


@dataclass(frozen=True)
class SwingUpDesign:
    """
    Constants of the energy swing-up, each derived from the model (see :func:`swing_up_design`).

    :param frequency: small-oscillation frequency of the hanging pendulum ``w_p``, rad/s.
    :param max_acceleration: saturation of the pumping acceleration of the actuated joint
        (rad/s^2 or m/s^2).
    :param energy_gain: pumping acceleration per unit of normalised energy deficit.
    :param centering: ``(kp, kd)`` of the actuated joint's centring term (1/s^2, 1/s).
    :param lqr_q: diagonal LQR state weight (Bryson's rule).
    :param lqr_r: LQR command weight (Bryson's rule).
    """

    frequency: float
    max_acceleration: float
    energy_gain: float
    centering: Tuple[float, float]
    lqr_q: Tuple[float, ...]
    lqr_r: Tuple[float, ...]


def swing_up_design(dynamics: ModelDynamics, pendulum_joint: str, actuated_joint: str,
                    position_limit: float, switch_angle: float = 0.3,
                    upright: float = math.pi) -> SwingUpDesign:
    """
    Derive the swing-up constants from the model's pendulum and the travel of the drive.

    With ``J`` the pendulum's inertia about its joint and ``m g l`` half the
    hanging-to-upright potential gap, the hanging pendulum oscillates at
    ``w_p = sqrt(m g l / J)``. A square-wave acceleration ``a`` of the actuated joint at that
    frequency swings it with amplitude ``(4 / pi) a / w_p^2``, so the pumping saturates at the
    acceleration that spends a quarter of ``position_limit`` on it,
    ``a_max = (pi / 4) w_p^2 position_limit / 4``; the energy gain saturates it until the
    energy is within 10 % of the gap (Astrom and Furuta's bang-bang-then-linear law). The
    centring term is a critically damped loop four times slower than the pendulum
    (``kp = (w_p / 4)^2``, ``kd = 2 w_p / 4``, acting on the momentum velocity, see
    :meth:`SwingUpLQR.desired_acceleration`), so it does not fight the pumping. The LQR
    weights follow Bryson's rule: the actuated joint may deviate by ``position_limit / 2``,
    the pendulum by ``switch_angle``, velocities by ``w_p`` times those, the command by its
    limit.

    :param dynamics: the model (command limits included).
    :param pendulum_joint: passive joint (0 hanging, ``upright`` up).
    :param actuated_joint: driven joint (arm or cart).
    :param position_limit: allowed ``|q|`` of the actuated joint, rad or m.
    :param switch_angle: pendulum error where the LQR takes over, rad.
    :param upright: pendulum angle upright, rad.
    :return: the constants.
    :raises ValueError: a non-positive ``position_limit`` or ``switch_angle``, or a model whose
        pendulum has no potential gap.
    """
    for name, value in (('position_limit', position_limit), ('switch_angle', switch_angle)):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f'{name} must be finite and > 0, got {value!r}')
    model = dynamics.model
    n, p, a = model.n, model.joint_index(pendulum_joint), model.joint_index(actuated_joint)
    with torch.no_grad():
        postures = torch.zeros(2, n, dtype=model.dtype, device=model.device)
        postures[0, p], postures[1, p] = upright, upright - math.pi
        V = potential_energy(model, postures)
        inertia = float(crba(model, postures[1])[p, p])
    mgl = 0.5 * abs(float(V[0] - V[1]))
    if not mgl > 0 or not inertia > 0:
        raise ValueError(f'the pendulum {pendulum_joint!r} has no potential gap or inertia')
    w = math.sqrt(mgl / inertia)
    max_acceleration = 0.25 * math.pi * w * w * position_limit / 4.0
    w_c = w / 4.0
    u_limit = [float(v) if math.isfinite(float(v)) and float(v) > 0 else 1.0
               for v in dynamics.u_max]
    bound = [1.0] * (2 * n)
    bound[a], bound[p] = 0.5 * position_limit, switch_angle
    bound[n + a], bound[n + p] = w * 0.5 * position_limit, w * switch_angle
    return SwingUpDesign(frequency=w, max_acceleration=max_acceleration,
                         energy_gain=10.0 * max_acceleration, centering=(w_c * w_c, 2.0 * w_c),
                         lqr_q=tuple(1.0 / b ** 2 for b in bound),
                         lqr_r=tuple(1.0 / v ** 2 for v in u_limit))


class SwingUpLQR:
    """
    Energy-based swing-up of a passive pendulum with an LQR balance region (see the module).

    Constants left as None come from :func:`swing_up_design` on the model (recomputed when
    the model changes).

    :param dynamics: model of the robot (``dt`` = the period the policy is applied at).
    :param pendulum_joint: passive joint to swing up (0 hanging, about ``+-pi`` upright).
    :param actuated_joint: the driven joint (Furuta arm or cart) kept near 0.
    :param position_limit: allowed ``|q|`` of the actuated joint (sets the pumping
        acceleration and the LQR weights), rad or m.
    :param energy_gain: acceleration asked per unit of normalised energy deficit
        (rad/s^2 or m/s^2).
    :param max_acceleration: saturation of the energy-pumping acceleration.
    :param centering: ``(kp, kd)`` pulling the actuated joint to 0 during the swing-up
        (1/s^2, 1/s).
    :param switch_angle: pendulum error below which the LQR balances, rad.
    :param lqr_q: diagonal state weight of the LQR (``nx`` values).
    :param lqr_r: command weight of the LQR (``nu`` values or one).
    :param upright: pendulum angle of the upright state, rad; None: the model's balance point
        (:func:`~diffsim_ros.control.tasks.upright_angle`, ``pi`` for a centre of mass on
        the pendulum's axis line), recomputed when the model changes.
    :param energy_target: normalised energy the swing-up aims at (0: exactly upright at
        rest). 0 is a homoclinic orbit the pendulum only approaches asymptotically: on the
        Qube's model it hovered 0.31-0.34 rad short of the catch region for seconds; the
        default 5 % above it carries the pendulum over the top slowly enough for the LQR.
    """

    def __init__(self, dynamics: ModelDynamics, pendulum_joint: str, actuated_joint: str,
                 position_limit: float = 1.0, energy_gain: Optional[float] = None,
                 max_acceleration: Optional[float] = None,
                 centering: Optional[Tuple[float, float]] = None, switch_angle: float = 0.3,
                 lqr_q: Optional[Sequence[float]] = None,
                 lqr_r: Optional[Sequence[float]] = None, upright: Optional[float] = None,
                 energy_target: float = 0.05) -> None:
        model = dynamics.model
        self.pendulum = model.joint_index(pendulum_joint)
        self.actuated = model.joint_index(actuated_joint)
        self.pendulum_joint, self.actuated_joint = pendulum_joint, actuated_joint
        if dynamics.nu != 1:
            raise ValueError(f'SwingUpLQR drives one command, the dynamics have {dynamics.nu}')
        for name, value in (('energy_gain', energy_gain), ('max_acceleration',
                                                           max_acceleration),
                            ('switch_angle', switch_angle),
                            ('position_limit', position_limit)):
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f'{name} must be finite and > 0, got {value!r}')
        self.position_limit = float(position_limit)
        self.switch_angle = float(switch_angle)
        self._upright = upright
        self.energy_target = float(energy_target)
        self._overrides = {'energy_gain': energy_gain, 'max_acceleration': max_acceleration,
                           'centering': centering, 'lqr_q': lqr_q, 'lqr_r': lqr_r}
        nx = dynamics.nx
        mask = torch.zeros(nx, dtype=torch.bool, device=model.device)
        mask[self.pendulum] = True
        self.angle_mask = mask
        #: ``'swing'`` or ``'balance'``: the law used by the last solve.
        self.mode = 'swing'
        self._use(dynamics)

    def _use(self, dynamics: ModelDynamics) -> None:
        self.dynamics = dynamics
        #: Pendulum angle of the balance point, rad.
        self.upright = float(self._upright) if self._upright is not None else \
            upright_angle(dynamics.model, self.pendulum_joint)
        design = swing_up_design(dynamics, self.pendulum_joint, self.actuated_joint,
                                 self.position_limit, self.switch_angle, self.upright)
        chosen = {key: (value if value is not None else getattr(design, key))
                  for key, value in self._overrides.items()}
        #: The constants in use (derived from the model unless given).
        self.design = SwingUpDesign(frequency=design.frequency, **chosen)
        self.energy_gain = float(chosen['energy_gain'])
        self.max_acceleration = float(chosen['max_acceleration'])
        self.centering = (float(chosen['centering'][0]), float(chosen['centering'][1]))
        like = dynamics.model.inertial
        self._Q = _diag(chosen['lqr_q'], dynamics.nx, like, 'lqr_q')
        self._R = _diag(chosen['lqr_r'], dynamics.nu, like, 'lqr_r')
        self._gain: Optional[Tensor] = None

    # -- protocol ----------------------------------------------------------------------------
    def set_model(self, model: RobotModel, friction_model: Optional[nn.Module] = KEEP) -> None:
        """
        Use another model from the next solve on (constants and LQR gain are recomputed).

        :param model: the new robot model.
        :param friction_model: its extra friction module (None: none); :data:`KEEP`: the
            one in use.
        """
        self._use(self.dynamics.with_model(model, friction_model=friction_model))

    def reset(self) -> None:
        """Forget the mode (the gain depends on the model only and is kept)."""
        self.mode = 'swing'

    def warm_up(self, x0: Optional[Tensor] = None) -> float:
        """
        Build what the swing law's steps run on (compiled code or native kernel) first.

        :param x0: a typical state ``(nx,)``; zeros (hanging at rest, the swing law) when None.
        :return: seconds spent.
        """
        return _warm_up_law(self, x0)

    def solve(self, x0: Tensor, t: float = 0.0) -> FeedbackPolicy:
        """
        Return the policy for the current state.

        :param x0: state ``(nx,)`` ``[q; qd]`` in model joint order.
        :param t: time, s.
        :return: a one-step policy: the LQR law near upright, else the energy command
            (zero gains) for this state. A catch that throws the actuated joint outward
            faster than the pumping acceleration could stop within 90 % of its travel is
            abandoned for the swing law, whose travel guard brakes it: on the Qube a catch
            on a model whose balance point was 0.2 rad off took the arm to 2.15 rad.
        """
        dyn = self.dynamics
        x0 = x0.detach().to(dtype=dyn.model.dtype, device=dyn.model.device)
        goal = self.goal()
        error = _wrap(x0[self.pendulum] - self.upright)
        nu, nx = dyn.nu, dyn.nx
        n, a = dyn.model.n, self.actuated
        if bool(torch.isfinite(x0).all()) and abs(float(error)) < self.switch_angle \
                and self._stopping_deceleration(x0[a], x0[n + a]) < self.max_acceleration:
            self.mode = 'balance'
            u_ff = torch.zeros(1, nu, dtype=x0.dtype, device=x0.device)
            K = -self.gain()[None]
            x_ref = goal.expand(2, nx)
        else:
            self.mode = 'swing'
            u_ff = self.energy_command(x0)[None]
            K = torch.zeros(1, nu, nx, dtype=x0.dtype, device=x0.device)
            x_ref = x0.expand(2, nx)
        return FeedbackPolicy(t0=float(t), dt=float(dyn.dt), u_ff=u_ff, K=K,
                              x_ref=x_ref.clone(), u_min=dyn.u_min, u_max=dyn.u_max,
                              angle_mask=self.angle_mask)

    # -- pieces ------------------------------------------------------------------------------
    def goal(self) -> Tensor:
        """
        Return the upright state (everything else at 0, at rest).

        :return: ``(nx,)``.
        """
        model = self.dynamics.model
        x = torch.zeros(self.dynamics.nx, dtype=model.dtype, device=model.device)
        x[self.pendulum] = self.upright
        return x

    def gain(self) -> Tensor:
        """
        Return the LQR gain at the upright state (cached per model).

        :return: ``K (nu, nx)`` with ``u = -K (x - x_up)``.
        """
        if self._gain is None:
            dyn = self.dynamics
            u_eq = torch.zeros(dyn.nu, dtype=dyn.model.dtype, device=dyn.model.device)
            self._gain = lqr_gain(dyn, self.goal(), u_eq, self._Q, self._R)
        return self._gain

    def energy(self, x: Tensor, M: Optional[Tensor] = None) -> Tensor:
        """
        Return the pendulum energy relative to upright, normalised by the hanging gap.

        ``(0.5 M_pp qd_p^2 + V(q) - V(q_up)) / (V(q_up) - V(q_down))``: -1 hanging at rest,
        0 upright at rest (``q_up``, ``q_down``: ``q`` with the pendulum up / down).

        :param x: state ``(nx,)``.
        :param M: the mass matrix at ``x`` when already known.
        :return: scalar.
        """
        model, n, p = self.dynamics.model, self.dynamics.model.n, self.pendulum
        q, qd = x[:n], x[n:]
        postures = q.expand(3, n).clone()
        postures[1, p], postures[2, p] = self.upright, self.upright - math.pi
        V = potential_energy(model, postures)
        M = crba(model, q) if M is None else M
        gap = (V[1] - V[2]).abs().clamp_min(1e-12)
        return (0.5 * M[p, p] * qd[p] ** 2 + V[0] - V[1]) / gap

    def desired_acceleration(self, x: Tensor, M: Optional[Tensor] = None) -> Tensor:
        """
        Return the acceleration of the actuated joint the swing-up law asks for.

        ``sat(k (E - E_target) sign(qd_p M_pa)) - kp q_a - kd v_a``: since
        ``dE/dt = -qd_p M_pa qdd_a`` (up to the velocity-product terms), the first part drives
        the energy to its target; the second keeps the actuated joint centred, damping its
        momentum velocity ``v_a = qd_a + M_ap qd_p / M_aa`` rather than ``qd_a``.

        :param x: state ``(nx,)``.
        :param M: the mass matrix at ``x`` when already known.
        :return: scalar, rad/s^2 or m/s^2.
        """
        n, p, a = self.dynamics.model.n, self.pendulum, self.actuated
        M = crba(self.dynamics.model, x[:n]) if M is None else M
        direction = torch.sign(x[n + p] * M[p, a])
        direction = torch.where(direction == 0, torch.ones_like(direction), direction)
        deficit = self.energy(x, M) - self.energy_target
        pump = (self.energy_gain * deficit * direction).clamp(
            -self.max_acceleration, self.max_acceleration)
        kp, kd = self.centering
        # Damp the actuated joint's momentum velocity, not its velocity: the part
        # -M_ap qd_p / M_aa that the swinging pendulum's reaction induces is in phase with
        # qd_p M_pa, so damping it would drain the energy being pumped.
        momentum_velocity = x[n + a] + M[a, p] * x[n + p] / M[a, a]
        desired = pump - kp * x[a] - kd * momentum_velocity
        return self._travel_guard(x[a], x[n + a], desired)

    def _stopping_deceleration(self, position: Tensor, velocity: Tensor) -> float:
        """
        Return the deceleration that stops the actuated joint at 90 % of its travel.

        :param position: actuated joint position.
        :param velocity: actuated joint velocity.
        :return: ``v^2 / (2 room)`` when moving outward, else 0.
        """
        if not bool(position * velocity > 0):
            return 0.0  # at the centre, at rest or moving inward
        room = max(0.9 * self.position_limit - abs(float(position)), 1e-3)
        return float(velocity) ** 2 / (2.0 * room)

    def _travel_guard(self, position: Tensor, velocity: Tensor, desired: Tensor) -> Tensor:
        """
        Brake an actuated joint that moves outward too fast to stop within its travel.

        A half period of saturated pumping started from rest carries the joint about
        ``(pi / w_p)^2 a_max / 2``, four times the steady square-wave amplitude the design
        assumes, and on a plant stronger than the model further: on the Qube 30 % off nominal
        the first kick took the arm to 2.0 rad of its 1.8. When the deceleration that would
        stop the joint at 90 % of ``position_limit`` exceeds half the pumping acceleration,
        the joint is asked to decelerate at twice that (stopping it half-way to the wall, a
        margin for a plant that responds more weakly than the model), unless the law already
        asks for more.

        :param position: actuated joint position.
        :param velocity: actuated joint velocity.
        :param desired: acceleration the swing-up law asks for.
        :return: the acceleration to realise.
        """
        need = self._stopping_deceleration(position, velocity)
        if need < 0.5 * self.max_acceleration:
            return desired
        brake = -torch.sign(velocity) * 2.0 * need
        return torch.where(desired * torch.sign(velocity) > brake * torch.sign(velocity),
                           brake, desired)

    def energy_command(self, x: Tensor) -> Tensor:
        """
        Return the saturated command that gives the actuated joint the desired acceleration.

        The command is held for one model step ``dt`` (the period the policy is applied at),
        over which the model's velocity change is (nearly) affine in the command: probing one
        step at ``u = 0`` and ``u = 1`` gives the command for which the actuated joint gains
        ``a dt`` of velocity, with the pendulum's reaction, back-EMF and friction of the model
        accounted for (collocated partial feedback linearisation; Quanser's swing-up converts
        the acceleration to volts through the motor model the same way). At the driver's
        period this is the instantaneous acceleration; at a slower command rate it is the
        command whose hold realises the acceleration on average, where the instantaneous one
        would overshoot as the back-EMF grows (on the Qube at 50 Hz that stalls the swing).

        :param x: state ``(nx,)``.
        :return: ``(nu,)``.
        """
        dyn, n, a = self.dynamics, self.dynamics.model.n, self.actuated
        with torch.no_grad():
            M = crba(dyn.model, x[:n])
            desired = self.desired_acceleration(x, M)
            probe = torch.zeros(2, dyn.nu, dtype=x.dtype, device=x.device)
            probe[1] = 1.0
            # contiguous: the compiled step is many times slower on strided operands
            velocity = dyn.step(x.expand(2, 2 * n).contiguous(), probe)[:, n + a]
            per_unit = velocity[1] - velocity[0]
            change = x[n + a] + desired * dyn.dt - velocity[0]
            u = change * torch.sign(per_unit) / per_unit.abs().clamp_min(1e-300)
            return torch.clamp(u.expand(dyn.nu), dyn.u_min, dyn.u_max)


def _warm_up_law(controller, x0: Optional[Tensor]) -> float:
    """
    Build the steps (compiled or native) a feedback law and its caller use; return seconds.

    One solve from ``x0`` (zeros when None: the hanging pendulum, the arm at home) and one
    model step of a single state, which a driver-rate loop uses to predict the state its
    command acts on.  Nothing is kept: :meth:`reset` follows.
    """
    start = time.perf_counter()
    dyn = controller.dynamics
    x0 = dyn.u_min.new_zeros(dyn.nx) if x0 is None else x0.to(dyn.u_min)
    with torch.no_grad():
        controller.solve(x0, 0.0)
        dyn.step(x0, dyn.u_min.new_zeros(dyn.nu))
    controller.reset()
    return time.perf_counter() - start


def _wrap(angle: Tensor) -> Tensor:
    return math.pi - torch.remainder(math.pi - angle, 2.0 * math.pi)


class _ArmController:
    """Shared pieces of the arm baselines: reference, gains, gravity handling."""

    def __init__(self, dynamics: ModelDynamics, reference: ReferenceFn,
                 kp: Sequence[float], kd: Sequence[float], horizon: int,
                 gravity_in_command: Optional[bool]) -> None:
        model = dynamics.model
        if dynamics.nu != model.n:
            raise ValueError(f'{type(self).__name__} needs every joint actuated; the dynamics '
                             f'have {dynamics.nu} commands for {model.n} joints')
        if not isinstance(horizon, int) or horizon < 1:
            raise ValueError(f'horizon must be an int >= 1, got {horizon!r}')
        self.dynamics = dynamics
        self.reference = reference
        like = model.inertial
        self.kp = torch.diagonal(_diag(kp, model.n, like, 'kp'))
        self.kd = torch.diagonal(_diag(kd, model.n, like, 'kd'))
        self.horizon = horizon
        self.gravity_in_command = _gravity_in_command(model, gravity_in_command)

    def set_model(self, model: RobotModel, friction_model: Optional[nn.Module] = KEEP) -> None:
        """
        Use another model from the next solve on.

        :param model: the new robot model.
        :param friction_model: its extra friction module (None: none); :data:`KEEP`: the
            one in use.
        """
        self.dynamics = self.dynamics.with_model(model, friction_model=friction_model)

    def reset(self) -> None:
        """Nothing to forget: the arm baselines are memoryless."""

    def warm_up(self, x0: Optional[Tensor] = None) -> float:
        """
        Build the model step a driver-rate caller uses (compiled or native) before it runs.

        :param x0: a typical state ``(nx,)``; zeros when None.
        :return: seconds spent.
        """
        return _warm_up_law(self, x0)

    def _reference(self, t: float) -> Tuple[Tensor, Tensor, Tensor]:
        dyn = self.dynamics
        times = t + dyn.dt * torch.arange(self.horizon + 1, dtype=dyn.model.dtype,
                                          device=dyn.model.device)
        q, qd, qdd = self.reference(times)
        like = dyn.model.inertial
        return q.to(like), qd.to(like), qdd.to(like)

    def _gravity(self, q: Tensor) -> Tensor:
        zero = torch.zeros_like(q)
        return rnea(self.dynamics.model, q, zero, zero)

    def _policy(self, t: float, u_ff: Tensor, K: Tensor, x_ref: Tensor) -> FeedbackPolicy:
        dyn = self.dynamics
        return FeedbackPolicy(t0=float(t), dt=float(dyn.dt), u_ff=u_ff, K=K, x_ref=x_ref,
                              u_min=dyn.u_min, u_max=dyn.u_max)


class PDGravity(_ArmController):
    """
    PD tracking plus the model's gravity at the measured posture.

    :param dynamics: model of an arm whose joints are all commanded (torques).
    :param reference: ``times (T,) -> (q, qd, qdd)`` each ``(T, n)``.
    :param kp: proportional gains per joint, N m/rad.
    :param kd: derivative gains per joint, N m s/rad.
    :param horizon: policy steps of ``dynamics.dt`` per solve (replanning period).
    :param gravity_in_command: the driver adds gravity itself (None: from the catalog).
    """

    def __init__(self, dynamics: ModelDynamics, reference: ReferenceFn,
                 kp: Sequence[float], kd: Sequence[float], horizon: int = 1,
                 gravity_in_command: Optional[bool] = None) -> None:
        super().__init__(dynamics, reference, kp, kd, horizon, gravity_in_command)

    def solve(self, x0: Tensor, t: float = 0.0) -> FeedbackPolicy:
        """
        Return ``u = g(q0) - [Kp Kd] (x - x_ref(t))`` over the next ``horizon`` steps.

        :param x0: state ``(nx,)``.
        :param t: time, s.
        :return: the policy.
        """
        n = self.dynamics.model.n
        q_ref, qd_ref, _ = self._reference(t)
        x0 = x0.detach().to(q_ref)
        with torch.no_grad():
            if self.gravity_in_command:
                g = torch.zeros(n, dtype=q_ref.dtype, device=q_ref.device)
            else:
                g = self._gravity(x0[:n])
        u_ff = g.expand(self.horizon, n).clone()
        K = -torch.cat((torch.diag(self.kp), torch.diag(self.kd)), -1).expand(
            self.horizon, n, 2 * n).clone()
        return self._policy(t, u_ff, K, torch.cat((q_ref, qd_ref), -1))


class ComputedTorque(_ArmController):
    """
    Inverse dynamics of the reference plus mass-matrix-scaled PD feedback.

    :param dynamics: model of an arm whose joints are all commanded (torques).
    :param reference: ``times (T,) -> (q, qd, qdd)`` each ``(T, n)``.
    :param kp: proportional gains per joint, 1/s^2 (acceleration per rad).
    :param kd: derivative gains per joint, 1/s.
    :param horizon: policy steps of ``dynamics.dt`` per solve (replanning period).
    :param gravity_in_command: the driver adds gravity itself (None: from the catalog).
    :param friction: add the model's joint friction of the reference velocity (and the
        dynamics' extra friction module).
    """

    def __init__(self, dynamics: ModelDynamics, reference: ReferenceFn,
                 kp: Sequence[float], kd: Sequence[float], horizon: int = 1,
                 gravity_in_command: Optional[bool] = None, friction: bool = True) -> None:
        super().__init__(dynamics, reference, kp, kd, horizon, gravity_in_command)
        self.friction = bool(friction)

    def solve(self, x0: Tensor, t: float = 0.0) -> FeedbackPolicy:
        """
        Return ``u = tau_ref(k) - M(q_ref(k)) [Kp Kd] (x - x_ref(k))`` for the next steps.

        :param x0: state ``(nx,)`` (unused: the law is linear in the state error).
        :param t: time, s.
        :return: the policy.
        """
        model, H = self.dynamics.model, self.horizon
        q_ref, qd_ref, qdd_ref = self._reference(t)
        with torch.no_grad():
            q, qd, qdd = q_ref[:H], qd_ref[:H], qdd_ref[:H]
            u_ff = rnea(model, q, qd, qdd)
            if self.friction:
                u_ff = u_ff + joint_friction(model, qd)
                if self.dynamics.friction_model is not None:
                    u_ff = u_ff + self.dynamics.friction_model(q, qd)
            if self.gravity_in_command:
                u_ff = u_ff - self._gravity(q)
            M = crba(model, q)
            K = -torch.cat((M * self.kp, M * self.kd), -1)
        return self._policy(t, u_ff, K, torch.cat((q_ref, qd_ref), -1))
