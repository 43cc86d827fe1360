"""
Adaptive MPC node: commands the robot with a controller running on the newest model.

* Subscribes ``joint_states`` (sensor-data QoS) and the identifier's model
  (``/identifier/model``, ``std_msgs/String`` JSON of the whole model, transient-local).  A
  model is used only if the model gate (:mod:`diffsim_ros.robots.gate`) accepts it: within
  its plausibility bounds, physically consistent, and predicting the node's last seconds of
  states and commands no worse than the model in use (``model_gate.*``); otherwise it is
  counted, logged (throttled), shown as WARN on ``/diagnostics``, and the old one stays.
  The controller keeps the catalog's motor model (the constants sent are only bounded).
* A timer at ``control_rate`` asks a worker thread to solve (iLQR or MPPI from
  :mod:`diffsim_ros.control`) from the newest state; the solve never blocks commanding. With
  ``native`` (default) every iLQR rollout is one call of the C++ rollout kernel and the
  backward pass runs in C++ (the Qube task's 3-iteration, 50-step solve: p50 1.7 ms, p99
  6 ms on 2 shared cores); otherwise, or where the kernel does not apply, the rollouts
  run ``torch.compile``-d with ``compile``.  The controller is warmed up on that thread
  before its first plan (the time is logged: the kernel's build on first use, or the
  compilation).
* The task's baseline (energy swing-up + LQR, PD + gravity) is a state feedback law: it is
  solved inline at every command tick from the newest state, as a driver-rate controller
  should be (held for a 50 Hz replanning period, the bang-bang energy pump loses the Qube's
  swing-up).  Its model steps (the law's probe and the one-tick state prediction) run in
  the native kernel with ``native``, or ``torch.compile``-d with ``compile``, warmed up in
  the constructor before any timer exists (compiling takes 20 s with a warm Inductor
  cache, 1-2 min cold): a compiled Qube tick costs 1.2 ms instead of 3.8 ms eager (p50,
  loaded machine).
* A command thread (:class:`~diffsim_ros.nodes.command_loop.DeadlineLoop`) wakes at the
  deadlines ``k / command_rate`` of the node clock, takes the waiting ``joint_states`` itself
  (at most the sensor-data queue depth; the executor never runs that subscription, so a
  message burst costs no Python work and cannot delay a command), passes each through the
  input gate (:class:`~diffsim_ros.nodes.gates.StateGate`, parameters ``gate.*``: future or
  backward stamps, states beyond the joint or velocity limits are refused and counted),
  evaluates the newest :class:`FeedbackPolicy` on the newest accepted state and publishes
  ``std_msgs/Float64MultiArray`` on ``/<controller_name>/commands`` in the catalog's
  ``command_joints`` order, clipped to the command limits and always finite.  Under
  ``use_sim_time`` it runs once per deadline the simulated clock reaches (one command per
  driver tick in lockstep).
* Watchdog: with ``joint_states`` older than ``stale_timeout`` (or none yet), a plan that
  ended more than ``plan_timeout`` ago, or a non-finite command, it publishes
  ``safe_command`` (zero effort by default); stale data raise ``/diagnostics`` to ERROR,
  and control resumes when fresh data return.
* ``/diagnostics``: solve time, solve and command rates (the command rate on the node clock;
  WARN below 95 % of ``command_rate``), missed command deadlines, state age, model updates,
  refused ``joint_states`` per reason (WARN while refusals are recent).
* Under ``use_sim_time`` it tells a lockstep simulated plant on ``/lockstep`` which model it
  has judged, so that the plant waits for each new model (:mod:`diffsim_ros.nodes.lockstep`).

Time is the node clock (simulated time under ``use_sim_time``), counted from the first
accepted state, which is also the time origin of tracking references.
"""

from dataclasses import dataclass, field
import math
import threading
import time
from typing import Optional

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
import numpy as np
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data, QoSProfile
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray, Header, String
import torch

from .command_loop import DeadlineLoop, PolledGroup, take_messages
from .convert import commands_msg, MessageError, ThrottledLogger
from .gates import StateGate, StateGateConfig
from .lockstep import LockstepPeer
from .monitor import MODEL_QOS
from .params import declare_config, declare_robot, meta
from .runtime import configure_interpreter, run_node
from .. import robots
from ..control.baselines import PDGravity, SwingUpLQR
from ..control.costs import QuadraticCost, TrackingCost
from ..control.dynamics import ModelDynamics
from ..control.ilqr import ILQR, ILQRConfig
from ..control.mppi import MPPI, MPPIConfig
from ..control.tasks import get_task, make_cost, make_ilqr, reference, task_names
from ..core import rnea, RobotModel
from ..robots.gate import ModelGate, ModelGateConfig

__all__ = ['CONTROLLERS', 'MpcConfig', 'MpcNode', 'main', 'make_controller']

CONTROLLERS = ('ilqr', 'mppi', 'baseline')


@dataclass(frozen=True)
class MpcConfig:
    """Parameters of the mpc node (``mpc:`` section of ``config/<robot>.yaml``)."""

    controller: str = field(default='ilqr', metadata=meta(
        "'ilqr', 'mppi' or 'baseline' (energy swing-up + LQR, or PD + gravity for arms)"))
    control_rate: float = field(default=0.0, metadata=meta(
        "replanning rate, Hz; 0 = the robot task's rate (50 Hz without a task)",
        range=(0.0, 1000.0)))
    command_rate: float = field(default=0.0, metadata=meta(
        "command publishing rate, Hz; 0 = the robot's driver rate", range=(0.0, 10000.0)))
    dt: float = field(default=0.0, metadata=meta("model step, s; 0 = the task's mpc_dt",
                                                 range=(0.0, 1.0)))
    horizon: int = field(default=0, metadata=meta("steps per plan; 0 = the task's horizon",
                                                  range=(0, 10000)))
    iterations: int = field(default=0, metadata=meta(
        "iLQR iterations / MPPI rounds per solve; 0 = the task's", range=(0, 1000)))
    dtype: str = field(default='float64', metadata=meta("solver dtype: 'float64'/'float32'"))
    predict_latency: bool = field(default=True, metadata=meta(
        'baseline: roll the state forward with the model and the last command over its age '
        '(at most 4 driver ticks) plus one tick before solving (the energy law loses the '
        'swing at 2 ms delay)'))
    compile: bool = field(default=True, metadata=meta(  # noqa: A003 (the option's name)
        'torch.compile the iLQR rollouts / the baseline model steps where the native kernel '
        'does not run, warmed up before the first plan or command (logged)'))
    native: bool = field(default=True, metadata=meta(
        'roll out iLQR / MPPI / the baseline model steps in the C++ kernel (one call per '
        'horizon; falls back to compile where it does not apply)'))
    mppi_samples: int = field(default=256, metadata=meta('MPPI samples per round',
                                                         range=(1, 1000000)))
    mppi_lambda: float = field(default=1.0, metadata=meta('MPPI temperature, cost units'))
    mppi_noise: float = field(default=0.3, metadata=meta(
        'MPPI noise std as a fraction of the command limit', range=(0.0, 10.0)))
    seed: int = field(default=0, metadata=meta('seed of the MPPI generator'))
    goal: tuple[float, ...] = field(default=(), metadata=meta(
        'goal positions (model joint order) for robots without a task; empty = zeros'))
    state_weight: tuple[float, ...] = field(default=(), metadata=meta(
        'diagonal of Q (2 n) for robots without a task; empty = 100 per q, 1 per qd'))
    control_weight: tuple[float, ...] = field(default=(), metadata=meta(
        'diagonal of R (one per command) for robots without a task; empty = 1e-3'))
    joint_states_topic: str = field(default='joint_states', metadata=meta(
        'sensor_msgs/JointState topic'))
    model_topic: str = field(default='/identifier/model', metadata=meta(
        'std_msgs/String JSON document of the identified model (transient-local, '
        'diffsim_ros.robots.message), judged by the model gate before use'))
    command_topic: str = field(default='', metadata=meta(
        "Float64MultiArray command topic; '' = /<controller_name>/commands"))
    command_limit: tuple[float, ...] = field(default=(), metadata=meta(
        "symmetric limit per command joint; empty = the catalog's command_limit"))
    safe_command: tuple[float, ...] = field(default=(), metadata=meta(
        'command sent on stale data or a stalled solver; empty = zero effort'))
    stale_timeout: float = field(default=0.1, metadata=meta(
        'joint_states older than this (s) stop control: safe command, diagnostics ERROR',
        range=(0.0, 10.0)))
    plan_timeout: float = field(default=0.5, metadata=meta(
        'a plan that ended more than this long ago (s) is not applied', range=(0.0, 60.0)))
    diagnostics_period: float = field(default=1.0, metadata=meta(
        'period of /diagnostics, s', range=(0.0, 3600.0)))
    command_priority: int = field(default=50, metadata=meta(
        'SCHED_FIFO priority of the command thread on the wall clock (1-99, needs rtprio or '
        'root; refused: normal priority and a warning); 0 = normal scheduling. A controller '
        'slower than the command period then keeps a core busy: diagnostics WARN on the rate'))

    def __post_init__(self) -> None:
        """Reject unknown choices and non-positive or negative values."""
        if self.controller not in CONTROLLERS:
            raise ValueError(f'unknown controller {self.controller!r}; valid: '
                             f'{", ".join(CONTROLLERS)}')
        if self.dtype not in ('float64', 'float32'):
            raise ValueError(f"dtype must be 'float64' or 'float32', got {self.dtype!r}")
        for name in ('control_rate', 'command_rate', 'dt', 'horizon', 'iterations'):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise ValueError(f'{name} must be >= 0, got {getattr(self, name)}')
        for name in ('stale_timeout', 'plan_timeout', 'diagnostics_period', 'mppi_samples',
                     'mppi_lambda', 'mppi_noise'):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise ValueError(f'{name} must be > 0, got {getattr(self, name)}')
        if not 0 <= self.command_priority <= 99:
            raise ValueError(f'command_priority must be in [0, 99], got {self.command_priority}')
        if any(not (math.isfinite(v) and v >= 0) for v in self.command_limit):
            raise ValueError(f'command_limit must be finite and >= 0, got {self.command_limit}')


def _command_limit(info: robots.RobotInfo, config: MpcConfig) -> np.ndarray:
    """Return the symmetric limit per command joint, checking the configured length."""
    limit = config.command_limit or tuple(info.command_limit[i] for i in info.command_indices)
    if len(limit) != len(info.command_joints):
        raise ValueError(f'command_limit needs {len(info.command_joints)} values '
                         f'({list(info.command_joints)}), got {len(limit)}')
    return np.asarray(limit, dtype=np.float64)


def make_controller(info: robots.RobotInfo, model: RobotModel, config: MpcConfig):
    """
    Build the configured controller of a robot on a model.

    Robots with a task in :mod:`diffsim_ros.control.tasks` use its cost, step, horizon and
    baseline; others regulate to ``config.goal`` with a quadratic cost from the config.

    :param info: catalog entry of the robot.
    :param model: the model to start from (float64; converted to ``config.dtype``).
    :param config: node parameters.
    :return: ``(controller, control_rate_hz)``; the controller has ``solve``, ``set_model``
        and ``reset``; a baseline's rate is the command rate (it is solved at every command).
    :raises ValueError: a combination that does not exist (e.g. a baseline without a task).
    """
    task = get_task(info.name) if info.name in task_names() else None
    dtype = torch.float32 if config.dtype == 'float32' else torch.float64
    dt = config.dt or (task.mpc_dt if task else 0.02)
    horizon = int(config.horizon or (task.horizon if task else 25))
    iterations = int(config.iterations or (task.iterations if task else 2))
    rate = config.control_rate or (task.control_rate_hz if task else 50.0)
    if config.controller == 'baseline':
        # Solved at every command tick: its step (the LQR gain's period) is that tick.
        rate = config.command_rate or info.driver_rate_hz
        dt = config.dt or 1.0 / rate
    limit = torch.as_tensor(_command_limit(info, config), dtype=model.dtype)
    # A baseline's command is held for a command period: its model integrates that hold at
    # the driver's rate.
    substeps = max(1, int(round(dt * info.driver_rate_hz))) \
        if config.controller == 'baseline' else 1
    # A baseline evaluates its law and a model step at every command tick: those steps run
    # natively or compiled (the iLQR compiles its own rollouts through ILQRConfig.compile).
    dynamics = ModelDynamics.for_robot(info.name, model, dt, u_min=-limit, u_max=limit,
                                       substeps=substeps, native=bool(config.native))
    if config.controller == 'baseline' and config.compile and not dynamics.native:
        dynamics = dynamics.with_model(model, compile=True)
    if config.controller == 'baseline':
        if task is None:
            raise ValueError(f'no baseline for {info.name!r} (no task); use ilqr or mppi')
        if task.kind == 'swing_up':
            keys = ('energy_gain', 'max_acceleration', 'centering', 'switch_angle')
            return SwingUpLQR(dynamics, task.pendulum_joint, task.actuated_joint,
                              **{k: task.extra[k] for k in keys if k in task.extra}), rate
        return PDGravity(dynamics, lambda t: reference(task, t), task.extra['kp'],
                         task.extra['kd'], horizon=horizon), rate
    if task is not None and task.kind == 'tracking':
        # The reference as a function of the horizon's times (TrackingCost.bind calls it with
        # a (H + 1,) tensor), so that a configured horizon may differ from the task's.
        weights = (torch.diag(torch.as_tensor(w, dtype=model.dtype)) for w in (
            task.state_weight, task.control_weight, task.terminal_weight))
        cost = TrackingCost(lambda times: torch.cat(reference(task, times)[:2], -1), *weights,
                            nx=2 * model.n)
    elif task is not None:
        cost = make_cost(task, model)
    else:
        n, nu = model.n, dynamics.nu
        q_goal = torch.zeros(n, dtype=model.dtype)
        if config.goal:
            q_goal = torch.as_tensor(config.goal, dtype=model.dtype).reshape(n)
        Q = torch.diag(torch.as_tensor(config.state_weight or (100.0,) * n + (1.0,) * n,
                                       dtype=model.dtype))
        R = torch.diag(torch.as_tensor(config.control_weight or (1e-3,) * nu,
                                       dtype=model.dtype))
        cost = QuadraticCost(Q, R, Q, torch.cat((q_goal, torch.zeros_like(q_goal))))
    if config.controller == 'mppi':
        return MPPI(dynamics, cost, MPPIConfig(
            horizon=horizon, samples=config.mppi_samples, lambda_=config.mppi_lambda,
            noise_std=(config.mppi_noise * limit).tolist(), iters=iterations,
            seed=config.seed, dtype=dtype)), rate
    solver = ILQRConfig(horizon=horizon, max_iters=iterations, dtype=dtype,
                        compile=config.compile, native=config.native)
    if task is not None and task.kind == 'swing_up':
        # the goal follows every refitted model, and the LQR of the goal seeds each solve
        return make_ilqr(task, dynamics, solver), rate
    return ILQR(dynamics, cost, solver), rate


class MpcNode(Node):
    """
    The adaptive MPC node (module docstring; executable ``mpc``).

    :param node_name: ROS node name (its section of ``config/<robot>.yaml`` is read).
    :param kwargs: passed to ``rclpy.node.Node`` (``context``, ``parameter_overrides``...).
    """

    #: Parameter sections (``--help``, the unknown-name check): the input gate's under
    #: ``gate.``, the model gate's under ``model_gate.``.
    PARAMETERS = {'': MpcConfig, 'gate.': StateGateConfig, 'model_gate.': ModelGateConfig}

    def __init__(self, node_name: str = 'mpc', **kwargs) -> None:
        """Declare parameters, build the controller, start the timers and the solver thread."""
        super().__init__(node_name, **kwargs)
        configure_interpreter()   # torch in callbacks: see nodes/runtime.py
        robot, defaults = declare_robot(self)
        self.info = info = robots.get(robot)
        self.config = config = declare_config(self, MpcConfig, defaults=defaults)
        gate_config = declare_config(self, StateGateConfig, 'gate.', defaults)
        model_gate_config = declare_config(self, ModelGateConfig, 'model_gate.', defaults)
        self.model = robots.interface(robot).nominal_model()
        self.controller, control_rate = make_controller(info, self.model, config)
        # A baseline is solved inline at every command tick (see the module docstring).
        self._inline = config.controller == 'baseline'
        self._limit = _command_limit(info, config)
        safe = np.asarray(config.safe_command or np.zeros(len(self._limit)), dtype=np.float64)
        if safe.shape != self._limit.shape or not np.all(np.isfinite(safe)):
            raise ValueError(f'safe_command needs {len(self._limit)} finite values')
        self.safe_command = np.clip(safe, -self._limit, self._limit)
        # libfranka adds gravity to the commands: send what the model needs beyond it.
        self._subtract_gravity = robots.interface(robot).driver_adds_gravity and \
            not getattr(self.controller, 'gravity_in_command', False)
        self._lock = threading.Lock()
        # lines logged by the executor thread: the command thread never waits on logging
        self._log = ThrottledLogger(self.get_logger(), deferred=True)
        self.model_gate = ModelGate(robots.interface(robot), model_gate_config,
                                    max(config.command_rate, info.driver_rate_hz), self._log,
                                    use_actuator=False)
        # limits from the robot description the node starts with, never from a model update
        self.state_gate = StateGate(self.model.joint_names, self.model.lower, self.model.upper,
                                    self.model.velocity_limit, gate_config, self._log,
                                    config.joint_states_topic, strictly_increasing=False)
        self._command_period = 1.0 / (config.command_rate or info.driver_rate_hz)
        self._x: Optional[np.ndarray] = None
        self._stamp = self._received = self._origin = None
        self._policy, self._reset = None, False
        self._x_solved: Optional[torch.Tensor] = None   # the inline baseline's (predicted) state
        self._pending_model: Optional[RobotModel] = None
        self.stale, self.plan_expired = True, False
        self.last_command = self.safe_command.copy()
        self.stats = {'solves': 0, 'solve_errors': 0, 'solve_time_ms': math.nan,
                      'solve_time_max_ms': 0.0, 'commands': 0, 'models_accepted': 0,
                      'models_rejected': 0, 'unsafe_commands': 0, 'warm_up_s': 0.0}
        self._rates = {'solve': [], 'command': []}
        #: Set once the controller is warmed up (compiled) and plans can be made; a graph
        #: that starts the robot only then (the demo) loses no time to compilation.
        self.ready = threading.Event()
        if self._inline:
            # The baseline's steps compile here, before any timer or subscription exists:
            # beside the 500 Hz command timer the same compile took 265 s instead of 28 s
            # (both threads contend for the interpreter, see nodes/runtime.py).
            self._warm_up()
            self.ready.set()
        topic = config.command_topic or f'/{info.controller_name}/commands'
        self.command_pub = self.create_publisher(Float64MultiArray, topic, 10)
        self.diagnostics_pub = self.create_publisher(DiagnosticArray, '/diagnostics', 10)
        # polled by the command thread (module docstring): the executor never runs it.  The
        # queue holds the driver's states of one command period and two more (a late tick);
        # a burst beyond that is dropped by the middleware, so a tick's work does not grow
        # with it (with the sensor-data depth of 5 a 10 kHz burst cost 477-499 Hz, 3 with 3)
        depth = math.ceil(info.driver_rate_hz * self._command_period - 1e-9) + 2
        self._states = self.create_subscription(
            JointState, config.joint_states_topic, lambda msg: None,
            QoSProfile(depth=depth, reliability=qos_profile_sensor_data.reliability,
                       durability=qos_profile_sensor_data.durability),
            callback_group=PolledGroup())
        # simulation: a lockstep plant waits until this node has judged each published model
        self._lockstep = LockstepPeer(self)
        self._model_judged = self._lockstep.uses(config.model_topic)
        self.create_subscription(String, config.model_topic, self._on_model, MODEL_QOS)
        timers = MutuallyExclusiveCallbackGroup()
        self.create_timer(0.1, self._log.flush, callback_group=timers)
        if not self._inline:
            self.create_timer(1.0 / control_rate, self._request_solve, callback_group=timers)
        self.create_timer(config.diagnostics_period, self.publish_diagnostics,
                          callback_group=timers)
        self._solve_event, self._stop = threading.Event(), threading.Event()
        self._worker: Optional[threading.Thread] = None
        if not self._inline:
            self._worker = threading.Thread(target=self._solve_loop, name='mpc-solver',
                                            daemon=True)
            self._worker.start()
        self._started_ns = self.get_clock().now().nanoseconds
        self._loop = DeadlineLoop(self, self._command_period, self._on_command, 'mpc-commands',
                                  config.command_priority)

    def _now(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

    def _is_stale(self, now: float) -> bool:
        return self._received is None or now - self._received > self.config.stale_timeout

    def take_states(self) -> None:
        """Take the waiting ``joint_states``, gate them and keep the newest accepted one."""
        now_ns = self.get_clock().now().nanoseconds
        newest = None
        for msg in take_messages(self._states, self._states.qos_profile.depth):
            sample = self.state_gate.admit(msg, now_ns)
            if sample is None:
                continue
            if sample.restart:   # time started over (simulation reset): plan from scratch
                with self._lock:
                    self._origin, self._policy, self._reset = None, None, True
            # every accepted state, on its stamp: the model gate replays the recent seconds
            self.model_gate.recent.add_state(sample.t, sample.q, sample.qd)
            newest = sample
        if newest is None:
            return
        now = now_ns * 1e-9
        with self._lock:
            self._x = np.concatenate((newest.q, newest.qd))
            self._stamp, self._received = newest.t, now
            if self._origin is None:
                self._origin = now

    def _on_model(self, msg: String) -> None:
        """Hand a model document to the gate (robots/gate.py), which judges it on its thread."""
        def use(model: RobotModel, actuator, decision) -> None:
            with self._lock:
                self._pending_model = model
            self._model_judged(msg)
            if not self._inline:
                self._solve_event.set()

        def refused(reason: str) -> None:
            self.stats['models_rejected'] += 1
            self._model_judged(msg)
        self.model_gate.submit(msg.data, self.model, None, use, refused)

    def _request_solve(self) -> None:
        if not self._is_stale(self._now()):
            self._solve_event.set()

    def _warm_up(self) -> None:
        """Compile the solver's shapes before its first plan (iLQR), logging the time."""
        warm_up = getattr(self.controller, 'warm_up', None)
        if warm_up is None or not (self.config.compile or self.config.native):
            return
        try:
            seconds = warm_up()
        except Exception as error:  # noqa: BLE001 - the first solve compiles instead
            self._log.warn('solve', f'warm-up failed: {error!r}')
            return
        self.stats['warm_up_s'] = seconds
        path = 'native kernel' if getattr(self.controller.dynamics, 'native', False) \
            else 'compiled' if self.config.compile else 'eager'
        self.get_logger().info(f'{self.config.controller} ({path}) warmed up in '
                               f'{seconds:.1f} s')

    def _solve_loop(self) -> None:
        """Warm up, then solve whenever asked, on this thread, until the node closes."""
        self._warm_up()
        self.ready.set()
        while not self._stop.is_set():
            if not self._solve_event.wait(0.1):
                continue
            self._solve_event.clear()
            self._solve_newest()

    def _solve_newest(self) -> None:
        """Swap in a pending model, solve from the newest state and store the policy."""
        with self._lock:
            x, model, self._pending_model = self._x, self._pending_model, None
            t = None if x is None else self._received - self._origin
            reset, self._reset = self._reset, False
            age = None if x is None else self._now() - self._stamp
        try:
            if reset:
                self.controller.reset()
            if model is not None:
                self.controller.set_model(model)
                self.model = model
                self.stats['models_accepted'] += 1
                self.get_logger().info(f'model update {self.stats["models_accepted"]} in use')
            if x is None:
                return
            start = time.perf_counter()
            x_t = torch.as_tensor(x)
            if self._inline and self.config.predict_latency:
                x_t, t = self._predicted(x_t, t, age)
            policy = self.controller.solve(x_t, t)
            self._x_solved = x_t
            elapsed = 1e3 * (time.perf_counter() - start)
        except Exception as error:  # noqa: BLE001 - a failed solve keeps the old plan
            self.stats['solve_errors'] += 1
            self._log.warn('solve', f'failed: {error!r}')
            return
        with self._lock:
            self._policy = policy
        self.stats['solves'] += 1
        self.stats['solve_time_ms'] = elapsed
        self.stats['solve_time_max_ms'] = max(self.stats['solve_time_max_ms'], elapsed)
        self._tick('solve')

    def _predicted(self, x: torch.Tensor, t: float, age: float) -> tuple:
        """Return the state and time one driver tick after now, predicted from ``x``."""
        tick = 1.0 / self.info.driver_rate_hz
        # At most 5 ticks: the cost is one model step per tick, and a graph that lags more
        # cannot run a driver-rate law anyway.
        lag = min(max(age, 0.0), 4.0 * tick) + tick
        dynamics = self.controller.dynamics
        steps = int(round(lag / dynamics.dt))
        u = torch.as_tensor(self.last_command, dtype=dynamics.model.dtype)
        with torch.no_grad():
            x = x.to(dynamics.model.dtype)
            for _ in range(steps):
                x = dynamics.step(x, u)
        return x, t + steps * dynamics.dt

    def _tick(self, what: str) -> None:
        """Record an event time (wall clock) for the rate estimates."""
        times = self._rates[what]
        times.append(time.monotonic())
        del times[:-50]

    def compute_command(self) -> np.ndarray:
        """
        Return the command to send now (safe command when stale or without a valid plan).

        :return: ``(m,)`` finite command in ``command_joints`` order, within the limits.
        """
        now = self._now()
        if self._inline and not self._is_stale(now):
            self._solve_newest()
        with self._lock:
            x, policy, stale = self._x, self._policy, self._is_stale(now)
            t = None if self._origin is None else now - self._origin
        if stale != self.stale:
            self.stale = stale
            if stale:
                self.get_logger().error(f'{self.config.joint_states_topic} stale (older than '
                                        f'{self.config.stale_timeout} s): sending the safe '
                                        'command')
            else:
                self.get_logger().info(f'{self.config.joint_states_topic} back: resuming')
            self.publish_diagnostics()
        self.plan_expired = policy is not None and \
            t > policy.t0 + policy.horizon * policy.dt + self.config.plan_timeout
        if stale or policy is None or self.plan_expired:
            return self.safe_command
        with torch.no_grad():
            x_t = torch.as_tensor(x)
            if self._inline and self._x_solved is not None:
                x_t = self._x_solved   # the state one tick ahead, where the command acts
            u = policy(t, x_t).to(torch.float64)
            if self._subtract_gravity:
                q = x_t[:self.model.n].to(self.model.dtype)
                gravity = rnea(self.model, q, torch.zeros_like(q), torch.zeros_like(q))
                u = u - gravity[list(self.info.command_indices)].to(u)
        u = u.cpu().numpy()
        if not np.all(np.isfinite(u)):
            self.stats['unsafe_commands'] += 1
            self._log.warn('command', 'non-finite command replaced by the safe command')
            return self.safe_command
        return np.clip(u, -self._limit, self._limit)

    def _on_command(self) -> None:
        self.take_states()
        command = self.compute_command()
        try:
            self.command_pub.publish(commands_msg(command))
        except MessageError as error:   # unreachable: compute_command is always finite
            self._log.warn('command', str(error))
            return
        self.last_command = command
        self.model_gate.recent.add_command(self._now(), command)
        self.stats['commands'] += 1

    def _rate(self, what: str) -> float:
        times = self._rates[what]
        if len(times) < 2 or time.monotonic() - times[-1] > 2.0:
            return 0.0
        return (len(times) - 1) / max(times[-1] - times[0], 1e-9)

    def publish_diagnostics(self) -> None:
        """Publish the node's status on ``/diagnostics`` (ERROR while the state is stale)."""
        now_ns = self.get_clock().now().nanoseconds
        now = now_ns * 1e-9
        with self._lock:
            age = math.inf if self._received is None else now - self._received
            planned = self._policy is not None
        (rate, gap), nominal = self._loop.rate(), 1.0 / self._command_period
        # a second of commands is needed to tell a slow loop from a young one
        slow = now_ns - self._started_ns >= 1e9 and rate < 0.95 * nominal
        refused = self.state_gate.status(now_ns)
        if self.stale:
            level, message = DiagnosticStatus.ERROR, 'joint_states stale: safe command'
        elif not planned:
            level, message = DiagnosticStatus.WARN, 'no plan yet: safe command'
        elif self.plan_expired:
            level, message = DiagnosticStatus.WARN, 'solver too slow, plan ended: safe command'
        elif self.model_gate.warning:
            level, message = DiagnosticStatus.WARN, self.model_gate.warning
        else:
            level, message = DiagnosticStatus.OK, f'{self.config.controller} running'
        warnings = [text for text in (
            f'command rate {rate:.0f} Hz below 95 % of {nominal:.0f} Hz' if slow else None,
            refused) if text]
        if warnings and level == DiagnosticStatus.OK:
            level, message = DiagnosticStatus.WARN, '; '.join(warnings)
        elif warnings:
            message = '; '.join([message] + warnings)
        values = {**self.stats, **self.model_gate.diagnostics(), 'state_age_s': age,
                  'stale': self.stale,
                  'plan_expired': self.plan_expired,
                  'solve_rate_hz': self._rate('solve'), 'command_rate_hz': rate,
                  'command_gap_max_ms': gap,
                  'command_rate_nominal_hz': nominal, 'missed_deadlines': self._loop.missed,
                  'command_errors': self._loop.errors,
                  'realtime_priority': self._loop.realtime,
                  'controller': self.config.controller, 'dropped_messages': self._log.total,
                  **self.state_gate.values()}
        status = DiagnosticStatus(level=level, name=f'{self.get_name()}: control',
                                  message=message, hardware_id=self.info.name,
                                  values=[KeyValue(key=k, value=str(v))
                                          for k, v in values.items()])
        self.diagnostics_pub.publish(DiagnosticArray(
            header=Header(stamp=self.get_clock().now().to_msg()), status=[status]))

    def destroy_node(self) -> None:
        """Stop the command and solver threads, then destroy the node."""
        self._loop.stop()
        self._stop.set()
        self._solve_event.set()
        self.model_gate.close()
        if self._worker is not None and self._worker.is_alive() \
                and self._worker is not threading.current_thread():
            self._worker.join(timeout=10.0)
        super().destroy_node()

    def close(self) -> None:
        """Stop the solver thread and destroy the node (same as :meth:`destroy_node`)."""
        self.destroy_node()


def main(args=None) -> None:
    """Run the mpc node (executable ``mpc``)."""
    run_node(MpcNode, args)
