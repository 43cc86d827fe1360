"""
Adaptive MPC node: commands the robot with a controller running on the newest model.

The controller (iLQR, MPPI or the task's baseline: :mod:`diffsim_ros.control.controller`),
the newest state, the model in use and the plan live in a
:class:`~diffsim_ros.control.planner.Planner`; this node converts messages and runs the
threads around it:

* A command thread (:class:`~diffsim_ros.nodes.command_loop.DeadlineLoop`) wakes at the
  deadlines ``k / command_rate`` of the node clock, takes the waiting ``joint_states`` itself
  (at most the queue depth; the executor never runs that subscription, so a message burst
  costs no Python work and cannot delay a command), passes each through the input gate
  (:class:`~diffsim_ros.nodes.gates.StateGate`, parameters ``gate.*``: future or backward
  stamps, states beyond the joint or velocity limits are refused and counted), and
  publishes the plan's command for the newest accepted state as
  ``std_msgs/Float64MultiArray`` on ``/<controller_name>/commands`` in the catalog's
  ``command_joints`` order, clipped to the command limits and always finite.  Under
  ``use_sim_time`` it runs once per deadline the simulated clock reaches (one command per
  driver tick in lockstep).
* iLQR and MPPI are solved on a worker thread, asked by a timer at ``control_rate``; a solve
  never blocks commanding.  The controller is warmed up on that thread before its first
  plan (the time is logged: the native kernel's build on first use, or the compilation).
  A baseline is a state feedback law, solved on the command thread at every tick and warmed
  up in the constructor, before any timer exists.  A tick that starts more than half a
  command period late, or comes while the command thread has spent more than
  :data:`INLINE_BUSY_LIMIT` of the recent time ticking, skips the solve and evaluates the
  last law on the newest state (counted as ``inline_solves_skipped``), unless the last
  solve is older than ``1 /`` :data:`INLINE_MIN_SOLVE_HZ`.  On 2 cores kept
  busy by other processes a Qube swing-up tick cost 2.2-2.6 ms of CPU, more than the 2 ms
  period: the command rate fell to 340-420 Hz, and a real-time thread busy all the time is
  stopped for 50 ms of every second by the kernel (``DeadlineLoop.busy``).  So the command
  rate never waits for the law; the law is refreshed less often.
* The identifier's model (``/identifier/model``, ``std_msgs/String`` JSON of the whole
  model, transient-local) is used only if the model gate (:mod:`diffsim_ros.robots.gate`,
  parameters ``model_gate.*``) accepts it: within its plausibility bounds, physically
  consistent, and predicting the node's last seconds of states and commands no worse than
  the model in use; otherwise it is counted, logged (throttled), shown as WARN on
  ``/diagnostics``, and the old one stays.  The controller keeps the catalog's motor model
  (the constants sent are only bounded) and applies the friction module the document
  carries.  ``model_file`` (:mod:`~diffsim_ros.nodes.model_file`): an offline fit to plan on
  until the gate accepts a newer model.
* Watchdog: with ``joint_states`` older than ``stale_timeout`` (or none yet), a plan that
  ended more than ``plan_timeout`` ago, or a non-finite command, it publishes
  ``safe_command`` (zero effort by default); stale data raise ``/diagnostics`` to ERROR,
  and control resumes when fresh data return.
* ``/diagnostics``: solve time, solve and command rates (the command rate on the node clock;
  WARN below 95 % of ``command_rate``), missed command deadlines and, per period, the longest
  wake-up delay, tick and garbage collection (whose wait a slow second was), state age, model
  updates, refused ``joint_states`` per reason (WARN while refusals are recent).
* ``start_after`` (a simulated launch's ``/sim_driver/ready``): no command at all before a
  message there, the driver's word that no other robot runs on the domain
  (:mod:`~diffsim_ros.nodes.foreign_graph`); ``/diagnostics`` WARN until then.
* Under ``use_sim_time`` it tells a lockstep simulated plant on ``/lockstep`` which model it
  has judged, so that the plant waits for each new model (:mod:`diffsim_ros.nodes.lockstep`).

Time is the node clock (simulated time under ``use_sim_time``), counted from the first
accepted state, which is also the time origin of tracking references.
"""
from dataclasses import dataclass, field
import math
import threading
from typing import Optional

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
import numpy as np
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data, QoSProfile
from sensor_msgs.msg import JointState
from std_msgs.msg import Empty, Float64MultiArray, String

from .command_loop import CollectorPauses, DeadlineLoop, freeze_heap, PolledGroup, take_messages
from .convert import commands_msg, MessageError, ThrottledLogger
from .diagnostics import diagnostics_msg, with_warnings
from .foreign_graph import READY_QOS
from .gates import configured_velocity_limits, StateGate, StateGateConfig
from .lockstep import LockstepPeer
from .model_file import load_model_file, MODEL_FILE_DESCRIPTION
from .monitor import MODEL_QOS
from .params import declare_config, declare_robot, meta, ParameterError
from .reference import load_reference_task, ReferenceFileError
from .runtime import configure_interpreter, run_node
from .. import robots
from ..control.controller import ControllerConfig
from ..control.planner import Planner
from ..core import RobotModel
from ..robots.gate import ModelGate, ModelGateConfig

__all__ = ['INLINE_BUSY_LIMIT', 'INLINE_MIN_SOLVE_HZ', 'MpcConfig', 'MpcNode', 'main']

#: Share of the wall clock the command thread may spend ticking before an inline law is
#: solved less often.  The kernel stops every real-time thread of a core they keep busy for
#: 50 ms a second, and the executor's and the middleware's threads (raised with the loop)
#: and a driver on the same computer need their share: half, the usual bound for a
#: real-time loop.  Under a burst on 2 busy cores the Qube's law was then solved for 8-31 %
#: of the commands at load 4-6 (balancing needs no solve: its gains act on each newest state).
INLINE_BUSY_LIMIT = 0.5
#: The inline law is solved at least this often whatever the budget says, Hz: at load 8-10
#: the budget alone let 1 % of the commands be solved (5 Hz), too stale for a swing law.
INLINE_MIN_SOLVE_HZ = 50.0


@dataclass(frozen=True)
class MpcConfig(ControllerConfig):
    """Parameters of the mpc node (``mpc:`` section of ``config/<robot>.yaml``)."""

    joint_states_topic: str = field(default='joint_states', metadata=meta(
        'sensor_msgs/JointState topic'))
    model_topic: str = field(default='/identifier/model', metadata=meta(
        'std_msgs/String JSON document of the identified model (transient-local, '
        'diffsim_ros.robots.message), judged by the model gate (model_gate.*) before use'))
    command_topic: str = field(default='', metadata=meta(
        "Float64MultiArray command topic; '' = /<controller_name>/commands"))
    stale_timeout: float = field(default=0.1, metadata=meta(
        'joint_states older than this (s) stop control: safe command, diagnostics ERROR',
        range=(0.0, 10.0)))
    plan_timeout: float = field(default=0.5, metadata=meta(
        'a plan that ended more than this long ago (s) is not applied', range=(0.0, 60.0)))
    diagnostics_period: float = field(default=1.0, metadata=meta(
        'period of /diagnostics, s', range=(0.0, 3600.0)))
    reference_file: str = field(default='', metadata=meta(
        'reference trajectory to track, set at launch: excitation.yaml of diffsim-excite '
        '(repeated with its period) or a kind: sampled file (played once, then held at its '
        "end); validated at start-up (the robot's joints, finite, within its limits and "
        "gate.velocity_limits), time 0 at the first joint state; '' = the robot's task"))
    model_file: str = field(default='', metadata=meta(MODEL_FILE_DESCRIPTION))
    start_after: str = field(default='', metadata=meta(
        'std_msgs/Empty topic (transient local) whose first message the node waits for before '
        "it publishes any command: a simulated driver's ~/ready, sent once its domain probe "
        "found no other robot (sim.launch.py, cup.launch.py: /sim_driver/ready); '' = command "
        'from the start (a physical robot)'))
    command_priority: int = field(default=50, metadata=meta(
        'SCHED_FIFO priority of the command thread on the wall clock (1-99, needs rtprio or '
        'root; refused: normal priority and a warning); 0 = normal scheduling. A controller '
        'slower than the command period then keeps a core busy: diagnostics WARN on the rate'))

    def __post_init__(self) -> None:
        """Check the controller's parameters, then the node's."""
        super().__post_init__()
        for name in ('stale_timeout', 'plan_timeout', 'diagnostics_period'):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise ValueError(f'{name} must be > 0, got {getattr(self, name)}')
        if not 0 <= self.command_priority <= 99:
            raise ValueError(f'command_priority must be in [0, 99], got {self.command_priority}')


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
        nominal = robots.interface(robot).nominal_model()
        fit = load_model_file(robots.interface(robot), config.model_file)
        # lines logged by the executor thread: the command thread never waits on logging
        self._log = ThrottledLogger(self.get_logger(), deferred=True)
        task = None
        try:
            speeds = configured_velocity_limits(gate_config, nominal.joint_names,
                                                nominal.velocity_limit.tolist())
        except ValueError as error:
            Node.destroy_node(self)
            raise ParameterError('gate.velocity_limits', list(gate_config.velocity_limits),
                                 str(error)) from None
        if config.reference_file:
            try:
                task = load_reference_task(config.reference_file, robot, nominal, speeds)
            except ReferenceFileError as error:
                Node.destroy_node(self)   # nothing of this node runs yet: release it whole
                raise ParameterError('reference_file', config.reference_file,
                                     str(error)) from None
            form = (f'period {1.0 / task.frequency_hz:g} s' if task.trajectory is None
                    else 'played once, then held at its end')
            self.get_logger().info(f'tracking {config.reference_file} '
                                   f'({task.duration_s:g} s, {form})')
        self.planner = Planner(info, config, nominal if fit is None else fit.model, self._log,
                               config.stale_timeout, config.plan_timeout, task,
                               None if fit is None else fit.friction)
        self._inline = self.planner.inline   # a baseline is solved at every command tick
        self.safe_command = self.planner.safe_command
        self.model_gate = ModelGate(robots.interface(robot), model_gate_config,
                                    max(config.command_rate, info.driver_rate_hz), self._log,
                                    use_actuator=False)
        # limits from the robot description the node starts with, never from a model update
        self.state_gate = StateGate(nominal.joint_names, nominal.lower, nominal.upper,
                                    nominal.velocity_limit, gate_config, self._log,
                                    config.joint_states_topic, strictly_increasing=False)
        self._command_period = 1.0 / (config.command_rate or info.driver_rate_hz)
        self.stale = True
        self._commands = self._models_rejected = self._solves_skipped = 0
        self._inline_solved = -math.inf   # node-clock s of the last inline solve
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
        self.started = threading.Event()   # start_after heard (or none asked)
        if config.start_after:
            self.create_subscription(Empty, config.start_after, self._on_start, READY_QOS)
            self.get_logger().info(f'no command before a message on {config.start_after}')
        else:
            self.started.set()
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
            self.create_timer(1.0 / self.planner.control_rate, self._request_solve,
                              callback_group=timers)
        self.create_timer(config.diagnostics_period, self.publish_diagnostics,
                          callback_group=timers)
        self._solve_event, self._stop = threading.Event(), threading.Event()
        self._worker: Optional[threading.Thread] = None
        if not self._inline:
            self._worker = threading.Thread(target=self._solve_loop, name='mpc-solver',
                                            daemon=True)
            self._worker.start()
        self._started_ns = self.get_clock().now().nanoseconds
        self._collector = CollectorPauses.shared()
        if self._inline:   # warmed up above; an iLQR's solver thread freezes after its own
            freeze_heap()
        self._loop = DeadlineLoop(self, self._command_period, self._on_command, 'mpc-commands',
                                  config.command_priority)

    def spun_on(self, native_id: int) -> None:
        """
        Hear which thread spins this node's executor (:func:`~.runtime.run_node` says so).

        A command tick waits for that thread's GIL holds: it runs real-time with the command
        loop (:mod:`~diffsim_ros.nodes.command_loop`).

        :param native_id: ``threading.get_native_id()`` of the spinning thread.
        """
        self._loop.add_helper(native_id)

    @property
    def controller(self):
        """Return what the planner runs: the iLQR, the MPPI or a baseline."""
        return self.planner.controller

    @property
    def model(self) -> RobotModel:
        """Return the model in use (the nominal one until the gate accepts another)."""
        return self.planner.model

    @property
    def plan_expired(self) -> bool:
        """Return whether the last command found the plan ended (safe command sent)."""
        return self.planner.plan_expired

    @property
    def stats(self) -> dict:
        """Return the node's counters (``/diagnostics``): the planner's, commands, refusals."""
        return {**self.planner.stats, 'commands': self._commands,
                'models_rejected': self._models_rejected,
                'inline_solves_skipped': self._solves_skipped}

    def _now(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

    def take_states(self) -> None:
        """Take the waiting ``joint_states``, gate them and keep the newest accepted one."""
        now_ns = self.get_clock().now().nanoseconds
        newest = None
        for msg in take_messages(self._states, self._states.qos_profile.depth):
            sample = self.state_gate.admit(msg, now_ns)
            if sample is None:
                continue
            if sample.restart:   # time started over (simulation reset): plan from scratch
                self.planner.restart()
            # every accepted state, on its stamp: the model gate replays the recent seconds
            self.model_gate.recent.add_state(sample.t, sample.q, sample.qd)
            newest = sample
        if newest is not None:
            self.planner.observe(newest.q, newest.qd, newest.t, now_ns * 1e-9)

    def _on_model(self, msg: String) -> None:
        """Hand a model document to the gate (robots/gate.py), which judges it on its thread."""
        def use(model: RobotModel, actuator, friction, decision) -> None:
            self.planner.offer(model, friction)
            self._model_judged(msg)
            if not self._inline:
                self._solve_event.set()

        def refused(reason: str) -> None:
            self._models_rejected += 1
            self._model_judged(msg)
        self.model_gate.submit(msg.data, self.model, None, use, refused,
                               current_friction=self.planner.friction)

    def _request_solve(self) -> None:
        if not self.planner.is_stale(self._now()):
            self._solve_event.set()

    def _warm_up(self) -> None:
        """Compile the solver's shapes before its first plan (iLQR), logging the time."""
        if not (self.config.compile or self.config.native):
            return
        seconds = self.planner.warm_up()
        if seconds is not None:
            path = 'native kernel' if getattr(self.controller.dynamics, 'native', False) \
                else 'compiled' if self.config.compile else 'eager'
            self.get_logger().info(f'{self.config.controller} ({path}) warmed up in '
                                   f'{seconds:.1f} s')

    def _solve_loop(self) -> None:
        """Warm up, then solve whenever asked, on this thread, until the node closes."""
        self._warm_up()
        freeze_heap()   # the compiled solver's objects too (command_loop.py)
        self.ready.set()
        while not self._stop.is_set():
            self._solve_event.wait()   # destroy_node wakes it: no polling (command_loop.py)
            self._solve_event.clear()
            if self._stop.is_set():
                return
            self._solve()

    def _solve(self) -> None:
        """Swap in a pending model and solve from the newest state (the planner's)."""
        if self.planner.solve(self._now()) is not None:
            self.get_logger().info(f'model update {self.stats["models_accepted"]} in use')

    def compute_command(self) -> np.ndarray:
        """
        Return the command to send now (safe command when stale or without a valid plan).

        :return: ``(m,)`` finite command in ``command_joints`` order, within the limits.
        """
        now = self._now()
        if self._inline and not self.planner.is_stale(now):
            loop = self._loop
            if (loop.lateness() <= 0.5 * self._command_period
                    and loop.busy() <= INLINE_BUSY_LIMIT) \
                    or not 0.0 <= now - self._inline_solved < 1.0 / INLINE_MIN_SOLVE_HZ:
                self._solve()
                self._inline_solved = now
            else:   # late or busy: the last law on the newest state (module docstring)
                self._solves_skipped += 1
        command, stale = self.planner.command(now)
        if stale != self.stale:
            self.stale = stale
            if stale:
                self.get_logger().error(f'{self.config.joint_states_topic} stale (older than '
                                        f'{self.config.stale_timeout} s): sending the safe '
                                        'command')
            else:
                self.get_logger().info(f'{self.config.joint_states_topic} back: resuming')
            self.publish_diagnostics()
        return command

    def _on_start(self, msg: Empty) -> None:
        if not self.started.is_set():
            self.started.set()
            self.get_logger().info(f'{self.config.start_after} heard: commanding')

    def _on_command(self) -> None:
        self.take_states()
        if not self.started.is_set():   # nothing reaches a motor before start_after
            return
        command = self.compute_command()
        try:
            self.command_pub.publish(commands_msg(command))
        except MessageError as error:   # unreachable: compute_command is always finite
            self._log.warn('command', str(error))
            return
        self.planner.last_command = command
        self.model_gate.recent.add_command(self._now(), command)
        self._commands += 1

    def publish_diagnostics(self) -> None:
        """Publish the node's status on ``/diagnostics`` (ERROR while the state is stale)."""
        now_ns = self.get_clock().now().nanoseconds
        (rate, gap), nominal = self._loop.rate(), 1.0 / self._command_period
        late, tick = self._loop.waits()
        # a second of commands is needed to tell a slow loop from a young one
        slow = now_ns - self._started_ns >= 1e9 and rate < 0.95 * nominal
        if not self.started.is_set():
            level, message = DiagnosticStatus.WARN, \
                f'no command before a message on {self.config.start_after}'
        elif self.stale:
            level, message = DiagnosticStatus.ERROR, 'joint_states stale: safe command'
        elif self.planner.policy is None:
            level, message = DiagnosticStatus.WARN, 'no plan yet: safe command'
        elif self.plan_expired:
            level, message = DiagnosticStatus.WARN, 'solver too slow, plan ended: safe command'
        elif self.model_gate.warning:
            level, message = DiagnosticStatus.WARN, self.model_gate.warning
        else:
            level, message = DiagnosticStatus.OK, f'{self.config.controller} running'
        level, message = with_warnings(level, message, (
            f'command rate {rate:.0f} Hz below 95 % of {nominal:.0f} Hz' if slow else '',
            self.state_gate.status(now_ns)))
        values = {**self.stats, **self.model_gate.diagnostics(),
                  'state_age_s': self.planner.state_age(now_ns * 1e-9), 'stale': self.stale,
                  'plan_expired': self.plan_expired, 'solve_rate_hz': self.planner.solve_rate(),
                  'command_rate_hz': rate, 'command_gap_max_ms': gap,
                  'command_rate_nominal_hz': nominal, 'missed_deadlines': self._loop.missed,
                  'command_late_max_ms': late, 'command_tick_max_ms': tick,
                  'gc_pause_max_ms': self._collector.take_longest_ms(),
                  'command_errors': self._loop.errors, 'realtime_priority': self._loop.realtime,
                  'controller': self.config.controller, 'dropped_messages': self._log.total,
                  'started': self.started.is_set(),
                  **self.state_gate.values()}
        self.diagnostics_pub.publish(diagnostics_msg(
            self.get_clock().now().to_msg(), f'{self.get_name()}: control', self.info.name,
            level, message, values))

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
