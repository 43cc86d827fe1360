"""
Control tasks per robot: what to achieve, how success is judged and how the MPC is set up.

Two kinds of task:

- ``'swing_up'`` (Qube, cart-pole): start hanging at rest, swing the passive pendulum up and
  balance it. The pendulum angle is 0 hanging and ``+-pi`` upright (the URDF convention of
  both Quanser robots); its error is ``wrap(angle - pi)`` in ``(-pi, pi]``. An episode
  succeeds when, from some time ``t_up`` to the end, the error stays below ``success_angle``,
  the end is at least ``hold_s`` after ``t_up`` and the actuated joint (arm or cart) never
  left ``|q| <= position_limit``; ``t_up`` is the swing-up time.
- ``'tracking'`` (WAM-4, Panda): follow ``q_ref(t) = centre + amplitude sin(2 pi f t +
  phase)`` (per joint) within the command limits; the score is the RMS joint-position error
  over the episode after ``settle_s`` (rad), success when it is below ``success_rms``.  The
  reference is in general a Fourier series, ``q_ref,j(t) = centre_j + sum_k amplitude_jk
  sin(2 pi k f t + phase_jk)`` (``amplitude`` and ``phase`` with one row of ``K`` harmonics
  per joint); the arms' tasks are its one-harmonic case, and :func:`tracking_task` turns an
  excitation trajectory (``diffsim-excite``) into a task with the robot's tracking settings.
  A one-shot reference (a swing-up given as samples, :mod:`diffsim_ros.sysid.sampled`) is
  held whole in :attr:`Task.trajectory` instead: played once, then held at its end.

:func:`make_cost` returns the MPC cost of a task (a quadratic cost with the pendulum angle
wrapped for the swing-ups, a tracking cost along the reference for the arms) and the task
fields ``mpc_dt``, ``horizon``, ``iterations`` and ``control_rate_hz`` hold the MPC choices.
Every number here was set on the nominal models, never on evaluation seeds; the energy
swing-up's constants are not here at all but derived from the model
(:func:`~diffsim_ros.control.baselines.swing_up_design`), only its LQR switch angle is.
"""

from dataclasses import dataclass, field, replace
import math
from types import MappingProxyType
from typing import Any, Dict, Mapping, Optional, Tuple

import torch

from .costs import QuadraticCost, TrackingCost
from .dynamics import ModelDynamics
from .ilqr import ILQR, ILQRConfig
from .lqr import lqr_law
from ..core.energy import potential_energy
from ..core.model import RobotModel

Tensor = torch.Tensor

__all__ = ['Task', 'TASKS', 'angle_mask', 'evaluate', 'get_task', 'goal_state', 'make_cost',
           'make_ilqr', 'reference', 'reference_states', 'start_state', 'swing_up_time',
           'task_names', 'tracking_task', 'wrap_angle']

SWING_UP = 'swing_up'
TRACKING = 'tracking'


@dataclass(frozen=True)
class Task:
    """
    One control task of one robot (see the module docstring).

    :param robot: catalog robot name.
    :param kind: ``'swing_up'`` or ``'tracking'``.
    :param duration_s: episode length, s.
    :param q0: start positions in model joint order (rad or m).
    :param control_rate_hz: MPC replanning rate (simulated time), Hz.
    :param mpc_dt: MPC model step, s.
    :param horizon: MPC horizon, steps of ``mpc_dt``.
    :param iterations: iLQR iterations per solve.
    :param state_weight: diagonal of the stage cost ``Q`` on ``[q; qd]`` (``2 n``).
    :param control_weight: diagonal of ``R`` (one per command).
    :param terminal_weight: diagonal of the terminal cost ``Qf`` (``2 n``).
    :param rate_weight: weight of ``||u_k - u_{k-1}||^2``.
    :param pendulum_joint: passive joint to swing up (swing-up tasks).
    :param actuated_joint: the arm / cart joint kept within ``position_limit``.
    :param position_limit: bound on ``|q|`` of ``actuated_joint`` (rad or m).
    :param bound_fraction: the MPC's soft bound on ``|q|`` of ``actuated_joint`` is this
        fraction of ``position_limit`` (margin for its prediction errors).
    :param bound_weight: weight of the squared violation of that soft bound.
    :param success_angle: largest pendulum error that counts as upright, rad.
    :param hold_s: time the pendulum must stay upright before the end, s.
    :param centre: tracking reference centre per joint, rad.
    :param amplitude: tracking amplitude per joint, rad: one value (a sinusoid) or one row of
        ``K`` values (harmonics ``k = 1..K``) per joint.
    :param frequency_hz: tracking (base) frequency, Hz.
    :param phase: phase per joint, rad, shaped as ``amplitude``.
    :param settle_s: start of the tracking RMS window, s.
    :param success_rms: largest tracking RMS that counts as success, rad.
    :param trajectory: a one-shot reference in place of the series (``centre``, ``amplitude``,
        ``phase`` and ``frequency_hz`` are then unused): an object whose ``evaluate(t)``
        returns ``(q, qd, qdd)`` in model joint order, such as a
        :class:`~diffsim_ros.sysid.sampled.SampledTrajectory`; None for the series.
    """

    robot: str
    kind: str
    duration_s: float
    q0: Tuple[float, ...]
    control_rate_hz: float
    mpc_dt: float
    horizon: int
    iterations: int
    state_weight: Tuple[float, ...]
    control_weight: Tuple[float, ...]
    terminal_weight: Tuple[float, ...]
    rate_weight: float = 0.0
    pendulum_joint: str = ''
    actuated_joint: str = ''
    position_limit: float = math.inf
    bound_fraction: float = 0.8
    bound_weight: float = 1e3
    success_angle: float = 0.2
    hold_s: float = 1.0
    centre: Tuple[float, ...] = ()
    amplitude: Tuple[Any, ...] = ()
    frequency_hz: float = 0.0
    phase: Tuple[Any, ...] = ()
    settle_s: float = 0.0
    success_rms: float = 0.05
    extra: Mapping[str, Any] = field(default_factory=dict, hash=False)
    trajectory: Any = field(default=None, hash=False)

    def __post_init__(self) -> None:
        """Validate the kind and the lengths, freeze ``extra``."""
        if self.kind not in (SWING_UP, TRACKING):
            raise ValueError(f"Task.kind must be 'swing_up' or 'tracking', got {self.kind!r}")
        n = len(self.q0)
        if len(self.state_weight) != 2 * n or len(self.terminal_weight) != 2 * n:
            raise ValueError(f'Task {self.robot}: state/terminal weights need {2 * n} entries')
        series = self.kind == TRACKING and self.trajectory is None
        if series and not (len(self.centre) == len(self.amplitude) == len(self.phase) == n):
            raise ValueError(f'Task {self.robot}: centre, amplitude and phase need {n} entries')
        if series and _harmonic_shape(self.amplitude) != _harmonic_shape(self.phase):
            raise ValueError(f'Task {self.robot}: amplitude and phase need one value per joint '
                             'or rows of the same number of harmonics')
        object.__setattr__(self, 'extra', MappingProxyType(dict(self.extra)))

    @property
    def replan_every_s(self) -> float:
        """Return the MPC replanning period, s."""
        return 1.0 / self.control_rate_hz


def _harmonic_shape(values: Tuple[Any, ...]) -> Optional[Tuple[int, ...]]:
    """Return ``()`` for one number per joint, ``(K,)`` for rows of ``K``, None otherwise."""
    if all(isinstance(v, (int, float)) for v in values):
        return ()
    lengths = {len(v) if isinstance(v, (tuple, list)) else -1 for v in values}
    return (lengths.pop(),) if len(lengths) == 1 and min(lengths) > 0 else None


def _swing_up(robot: str, duration_s: float, pendulum: str, actuated: str, limit: float,
              q_weight: Tuple[float, float], qd_weight: Tuple[float, float], r: float,
              terminal: Tuple[float, ...], horizon: int, mpc_dt: float,
              extra: Dict[str, Any]) -> Task:
    return Task(robot=robot, kind=SWING_UP, duration_s=duration_s, q0=(0.0, 0.0),
                control_rate_hz=1.0 / mpc_dt, mpc_dt=mpc_dt, horizon=horizon, iterations=3,
                state_weight=q_weight + qd_weight, control_weight=(r,),
                terminal_weight=terminal, rate_weight=0.0, pendulum_joint=pendulum,
                actuated_joint=actuated, position_limit=limit, success_angle=0.2, hold_s=1.0,
                extra=extra)


_PANDA_READY = (0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785)
_WAM4_READY = (0.0, 0.0, 0.0, 1.2)

#: The task of every robot with one.
TASKS: Mapping[str, Task] = MappingProxyType({
    # Qube: 2 ms driver, 4 V; swing-up in about 1-2 s, balance at the top.
    'qube': _swing_up(
        'qube', 6.0, 'pendulum_joint', 'arm_joint', 1.8,
        q_weight=(1.0, 5.0), qd_weight=(0.02, 0.05), r=0.02,
        terminal=(5.0, 50.0, 0.2, 0.5), horizon=50, mpc_dt=0.02,
        extra={'switch_angle': 0.3}),
    # IP02 cart-pole: 4 ms driver, 8 V, track +-0.407 m (success keeps it within 0.35 m).
    'cartpole': _swing_up(
        'cartpole', 8.0, 'pole_joint', 'cart_joint', 0.35,
        q_weight=(5.0, 5.0), qd_weight=(0.1, 0.05), r=0.01,
        terminal=(50.0, 50.0, 1.0, 0.5), horizon=60, mpc_dt=0.02,
        extra={'switch_angle': 0.3}),
    'wam4': Task(
        robot='wam4', kind=TRACKING, duration_s=4.0, q0=_WAM4_READY, control_rate_hz=50.0,
        mpc_dt=0.01, horizon=20, iterations=2,
        state_weight=(400.0,) * 4 + (1.0,) * 4, control_weight=(1e-3,) * 4,
        terminal_weight=(400.0,) * 4 + (1.0,) * 4, centre=_WAM4_READY,
        amplitude=(0.5, 0.3, 0.5, 0.5), frequency_hz=0.8, phase=(0.0, 1.0, 2.0, 3.0),
        settle_s=0.5, success_rms=0.05,
        # critically damped at 50 rad/s (omega dt = 0.1 at 500 Hz): at 20 rad/s (400, 40)
        # the ball in the cup pulled light forearms off their swing-ups (sim/cup.py
        # TRACKING_KP, the same gains for the policy search's plant and the mpc node)
        extra={'computed_torque': {'kp': 2500.0, 'kd': 100.0}}),
    'panda': Task(
        robot='panda', kind=TRACKING, duration_s=4.0, q0=_PANDA_READY, control_rate_hz=50.0,
        mpc_dt=0.01, horizon=20, iterations=2,
        state_weight=(400.0,) * 7 + (1.0,) * 7, control_weight=(1e-3,) * 7,
        terminal_weight=(400.0,) * 7 + (1.0,) * 7, centre=_PANDA_READY,
        amplitude=(0.4, 0.3, 0.4, 0.4, 0.4, 0.4, 0.4), frequency_hz=0.8,
        phase=(0.0, 0.9, 1.8, 2.7, 3.6, 4.5, 5.4), settle_s=0.5, success_rms=0.05,
        extra={'computed_torque': {'kp': 400.0, 'kd': 40.0}}),
})


def task_names() -> Tuple[str, ...]:
    """
    Return the robots that have a task.

    :return: robot names in :data:`TASKS` order.
    """
    return tuple(TASKS)


def get_task(robot: str) -> Task:
    """
    Return the task of a robot.

    :param robot: catalog robot name.
    :return: the task.
    :raises ValueError: no task for that robot (the message lists those with one).
    """
    try:
        return TASKS[robot]
    except (KeyError, TypeError):
        raise ValueError(f'no control task for robot {robot!r}; robots with a task: '
                         f'{", ".join(TASKS)}') from None


def wrap_angle(angle: Tensor) -> Tensor:
    """
    Wrap angles to ``(-pi, pi]``.

    :param angle: any shape, rad.
    :return: same shape.
    """
    return math.pi - torch.remainder(math.pi - angle, 2.0 * math.pi)


def angle_mask(task: Task, model: RobotModel) -> Tensor:
    """
    Return the state entries whose errors are wrapped to ``(-pi, pi]``.

    :param task: the task.
    :param model: the robot (joint order).
    :return: ``(2 n,)`` bool: the pendulum angle of a swing-up, nothing for tracking.
    """
    mask = torch.zeros(2 * model.n, dtype=torch.bool, device=model.device)
    if task.kind == SWING_UP:
        mask[model.joint_index(task.pendulum_joint)] = True
    return mask


def upright_angle(model: RobotModel, pendulum_joint: str) -> float:
    """
    Return the pendulum angle of the model's unstable equilibrium (centre of mass on top).

    A rigid body on a revolute joint has the potential ``V(a) = c0 + c1 cos a + c2 sin a``
    whatever its mass distribution, so three evaluations give the maximum exactly,
    ``atan2(c2, c1)``. With the centre of mass on the pendulum's axis line (the URDFs) this
    is ``pi``; a centre of mass off that line (a sampled plant, an identified model) tilts
    the equilibrium, and a controller that balances at ``pi`` then pushes the arm or cart
    away to hold the pendulum off its balance point.  The other joints at 0 (a Furuta arm or
    a cart does not change the pendulum's potential).

    :param model: the robot.
    :param pendulum_joint: the passive revolute joint.
    :return: angle in ``(-pi, pi]``, rad.
    :raises ValueError: the pendulum has no potential gap (no gravity or no mass).
    """
    index = model.joint_index(pendulum_joint)
    q = torch.zeros(3, model.n, dtype=model.dtype, device=model.device)
    q[:, index] = torch.tensor([0.0, 0.5 * math.pi, math.pi], dtype=model.dtype)
    with torch.no_grad():
        v0, v1, v2 = (float(v) for v in potential_energy(model, q))
    c1, c2 = 0.5 * (v0 - v2), v1 - 0.5 * (v0 + v2)
    if not math.hypot(c1, c2) > 1e-12:
        raise ValueError(f'the pendulum {pendulum_joint!r} has no potential gap')
    return math.atan2(c2, c1)


def goal_state(task: Task, model: RobotModel) -> Tensor:
    """
    Return the swing-up goal: pendulum upright, everything else at 0, at rest.

    :param task: a swing-up task.
    :param model: the robot; its :func:`upright_angle` is the goal's pendulum angle.
    :return: ``(2 n,)`` in the model's dtype.
    :raises ValueError: for a tracking task.
    """
    if task.kind != SWING_UP:
        raise ValueError(f'the {task.robot} task tracks a reference; see reference_states')
    x = torch.zeros(2 * model.n, dtype=model.dtype, device=model.device)
    x[model.joint_index(task.pendulum_joint)] = upright_angle(model, task.pendulum_joint)
    return x


def start_state(task: Task, model: RobotModel) -> Tuple[Tensor, Tensor]:
    """
    Return the initial positions and velocities of an episode.

    :param task: the task.
    :param model: the robot.
    :return: ``(q0, qd0)`` each ``(n,)``: hanging at rest for swing-ups, the reference at
        ``t = 0`` for tracking.
    """
    if task.kind == TRACKING:
        q, qd, _ = reference(task, torch.zeros(1, dtype=model.dtype))
        return q[0], qd[0]
    q0 = torch.tensor(task.q0, dtype=model.dtype)
    return q0, torch.zeros_like(q0)


def reference(task: Task, t: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """
    Return the tracking reference and its derivatives.

    :param task: a tracking task.
    :param t: times ``(T,)``, s.
    :return: ``(q, qd, qdd)`` each ``(T, n)``.
    :raises ValueError: for a swing-up task.
    """
    if task.kind != TRACKING:
        raise ValueError(f'the {task.robot} task is a swing-up; see goal_state')
    if task.trajectory is not None:
        return task.trajectory.evaluate(t)
    dtype = t.dtype if t.is_floating_point() else torch.float64
    t = t.to(dtype)[..., None, None]
    centre, amplitude, phase = (torch.tensor(v, dtype=dtype, device=t.device)
                                for v in (task.centre, task.amplitude, task.phase))
    if amplitude.dim() == 1:   # one sinusoid per joint: the one-harmonic case
        amplitude, phase = amplitude[:, None], phase[:, None]
    # harmonic k at k w; with one harmonic every operation is that of a single sinusoid
    # (w * 1 is w), so the arms' references are unchanged bit for bit
    w = 2.0 * math.pi * task.frequency_hz * torch.arange(
        1, amplitude.shape[-1] + 1, dtype=dtype, device=t.device)
    angle = w * t + phase
    return (centre + (amplitude * torch.sin(angle)).sum(-1),
            (amplitude * w * torch.cos(angle)).sum(-1),
            (-amplitude * w * w * torch.sin(angle)).sum(-1))


#: MPC settings of a tracking reference for a robot without a tracking task (those of
#: :func:`~diffsim_ros.control.controller.make_controller` for robots without a task).
DEFAULT_TRACKING = MappingProxyType({
    'control_rate_hz': 50.0, 'mpc_dt': 0.02, 'horizon': 25, 'iterations': 2,
    'position_weight': 100.0, 'velocity_weight': 1.0, 'control_weight': 1e-3,
    'settle_s': 0.5, 'success_rms': 0.05})


def tracking_task(robot: str, model: RobotModel, trajectory: Any, duration_s: float) -> Task:
    """
    Return the tracking task of a reference trajectory: a Fourier series or one-shot samples.

    The robot's own tracking task (WAM-4, Panda) lends its MPC settings, weights and gains;
    other robots get :data:`DEFAULT_TRACKING`.  Swing-up robots have passive joints and
    cannot track a trajectory.

    :param robot: catalog robot name.
    :param model: the robot (joint order).
    :param trajectory: a :class:`~diffsim_ros.sysid.excitation.FourierTrajectory` (the task
        holds its series) or a :class:`~diffsim_ros.sysid.sampled.SampledTrajectory` (the task
        holds it as :attr:`Task.trajectory`).
    :param duration_s: episode length, s.
    :return: the task; its :func:`reference` is the trajectory and its start the trajectory
        at 0.
    :raises ValueError: a swing-up robot, or a trajectory of other joints.
    """
    template = TASKS.get(robot)
    if template is not None and template.kind != TRACKING:
        raise ValueError(f'{robot} has a passive joint ({template.pendulum_joint}): it cannot '
                         'track a trajectory')
    trajectory = trajectory.reorder(model.joint_names)
    q_start, _, _ = trajectory.evaluate(torch.zeros(1, dtype=torch.float64))
    series = {'duration_s': float(duration_s), 'q0': tuple(q_start[0].tolist())}
    if hasattr(trajectory, 'amplitude_phase'):
        centre, amplitude, phase = trajectory.amplitude_phase()
        series.update(centre=centre, amplitude=amplitude, phase=phase,
                      frequency_hz=trajectory.base_frequency_hz, trajectory=None)
    else:
        series.update(centre=(), amplitude=(), phase=(), frequency_hz=0.0,
                      trajectory=trajectory)
    if template is not None:
        return replace(template, **series)
    n, d = model.n, DEFAULT_TRACKING
    state = (d['position_weight'],) * n + (d['velocity_weight'],) * n
    return Task(robot=robot, kind=TRACKING, control_rate_hz=d['control_rate_hz'],
                mpc_dt=d['mpc_dt'], horizon=d['horizon'], iterations=d['iterations'],
                state_weight=state, control_weight=(d['control_weight'],) * n,
                terminal_weight=state, settle_s=d['settle_s'], success_rms=d['success_rms'],
                **series)


def reference_states(task: Task, t0: float, steps: int, dt: float,
                     dtype: torch.dtype = torch.float64) -> Tensor:
    """
    Return reference states ``[q; qd]`` at ``t0 + k dt`` for ``k = 0 .. steps - 1``.

    :param task: a tracking task.
    :param t0: first time, s.
    :param steps: number of states.
    :param dt: spacing, s.
    :param dtype: result dtype.
    :return: ``(steps, 2 n)``.
    """
    t = t0 + dt * torch.arange(steps, dtype=dtype)
    q, qd, _ = reference(task, t)
    return torch.cat((q, qd), -1)


def make_cost(task: Task, model: RobotModel,
              dtype: Optional[torch.dtype] = None) -> Any:
    """
    Return the MPC cost of a task.

    :param task: the task.
    :param model: the robot (joint order, dtype).
    :param dtype: cost dtype (default: the model's).
    :return: a :class:`~diffsim_ros.control.costs.QuadraticCost` to the upright goal with the
        pendulum angle wrapped and the actuated joint softly bounded (swing-up), or a
        :class:`~diffsim_ros.control.costs.TrackingCost` whose reference is the function
        ``times (H + 1,) -> (H + 1, 2 n)`` of :func:`reference` (tracking).
    """
    dtype = dtype if dtype is not None else model.dtype
    Q, R, Qf = (torch.diag(torch.tensor(w, dtype=dtype, device=model.device))
                for w in (task.state_weight, task.control_weight, task.terminal_weight))
    if task.kind == SWING_UP:
        bound = torch.full((2 * model.n,), math.inf, dtype=dtype, device=model.device)
        if math.isfinite(task.position_limit):
            bound[model.joint_index(task.actuated_joint)] = \
                task.bound_fraction * task.position_limit
        return QuadraticCost(Q, R, Qf, goal_state(task, model).to(dtype),
                             angle_mask=angle_mask(task, model), rate_weight=task.rate_weight,
                             x_lower=-bound, x_upper=bound, bound_weight=task.bound_weight)

    def x_ref(times: Tensor) -> Tensor:
        q, qd, _ = reference(task, times.to(dtype))
        return torch.cat((q, qd), -1).to(model.device)
    return TrackingCost(x_ref, Q, R, Qf, nx=2 * model.n)


def make_ilqr(task: Task, dynamics: ModelDynamics, config: ILQRConfig) -> ILQR:
    """
    Return the iLQR MPC of a task on a model, ready for refitted models.

    The cost is :func:`make_cost`, rebuilt for every model the controller is given (a swing-up's
    goal is the model's own balance point).  A swing-up also gets the LQR of that goal, with the
    task's stage weights, as the guess every solve compares with its warm start (see
    :class:`~diffsim_ros.control.ilqr.ILQR`): without it the warm-started plans let the
    pendulum fall over and come round again instead of catching it.

    :param task: the task.
    :param dynamics: the model's dynamics at the MPC step.
    :param config: solver options.
    :return: the controller.
    """
    if task.kind != SWING_UP:
        return ILQR(dynamics, make_cost(task, dynamics.model), config)

    def cost_for(model: RobotModel) -> QuadraticCost:
        return make_cost(task, model)

    def guess_for(model_dynamics: ModelDynamics):
        model = model_dynamics.model
        Q, R = (torch.diag(torch.tensor(w, dtype=model.dtype, device=model.device))
                for w in (task.state_weight, task.control_weight))
        return lqr_law(model_dynamics, goal_state(task, model), Q, R, angle_mask(task, model))
    return ILQR(dynamics, cost_for(dynamics.model), config, cost_for=cost_for,
                guess_for=guess_for)


def swing_up_time(t: Tensor, error: Tensor, threshold: float) -> Optional[float]:
    """
    Return the first time from which ``|error|`` stays below ``threshold`` to the end.

    :param t: times ``(T,)``, s.
    :param error: pendulum errors ``(T,)``, rad.
    :param threshold: bound, rad.
    :return: the time, or None when the last sample is outside the bound.
    """
    outside = (error.abs() >= threshold) | ~torch.isfinite(error)
    if bool(outside[-1]):
        return None
    index = torch.nonzero(outside).flatten()
    start = 0 if index.numel() == 0 else int(index[-1]) + 1
    return float(t[start])


def evaluate(task: Task, model: RobotModel, t: Tensor, q: Tensor, qd: Tensor,
             u: Optional[Tensor] = None, upright: Optional[float] = None) -> Dict[str, Any]:
    """
    Score one episode.

    :param task: the task.
    :param model: the robot (joint order).
    :param t: times ``(T,)``, s.
    :param q: positions ``(T, n)`` in model joint order.
    :param qd: velocities ``(T, n)``.
    :param u: commands ``(T, m)`` (only summarised).
    :param upright: pendulum angle of the plant's balance point (see :func:`upright_angle`
        of the true model; default: that of ``model``); errors are measured from it.
    :return: ``success`` (bool) and, for swing-ups, ``swing_up_time_s`` (None on failure),
        ``max_position`` (largest ``|q|`` of the actuated joint), ``within_limit``,
        ``final_angle_error``; for tracking, ``tracking_rms`` (rad over all joints) and
        ``tracking_rms_per_joint``; ``max_command`` when ``u`` is given.
    """
    out: Dict[str, Any] = {}
    if u is not None and u.numel():
        out['max_command'] = float(u.abs().max())
    finite = bool(torch.isfinite(q).all() and torch.isfinite(qd).all())
    if task.kind == SWING_UP:
        p = model.joint_index(task.pendulum_joint)
        a = model.joint_index(task.actuated_joint)
        if upright is None:
            upright = upright_angle(model, task.pendulum_joint)
        error = wrap_angle(q[:, p] - upright)
        t_up = swing_up_time(t, error, task.success_angle) if finite else None
        max_position = float(q[:, a].abs().max()) if finite else math.inf
        within = max_position <= task.position_limit
        held = t_up is not None and float(t[-1]) - t_up >= task.hold_s
        out.update(success=bool(held and within), swing_up_time_s=t_up if held else None,
                   max_position=max_position, within_limit=within,
                   final_angle_error=float(error[-1].abs()) if finite else math.inf)
        return out
    window = t >= task.settle_s
    q_ref, _, _ = reference(task, t[window])
    error = q[window] - q_ref
    per_joint = error.square().mean(0).sqrt() if finite else torch.full(
        (model.n,), math.inf, dtype=q.dtype)
    rms = float(error.square().mean().sqrt()) if finite else math.inf
    out.update(success=rms < task.success_rms, tracking_rms=rms,
               tracking_rms_per_joint=per_joint.tolist())
    return out
