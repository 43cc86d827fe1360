"""
Online identification node: message conversion around the one online identification engine.

Subscriptions: ``joint_states`` (joints mapped by name, each message through the input gate
:class:`~diffsim_ros.nodes.gates.StateGate`, parameters ``gate.*``), the command topic
(``/<controller_name>/commands``, stamped on receipt with the node clock) and
``<mocap_topic_prefix>/<body>`` poses.  Samples go into the window of a
:class:`~diffsim_ros.sysid.online.OnlineEngine`, the loop ``diffsim-sim-eval --controller
adaptive-mpc`` runs too (its module docstring says what a refit does); every
``refit_period`` s a worker thread asks it for one refit (in a child process when
``refit_process``, so that a fit never holds the interpreter lock of the thread taking
``joint_states``).  A refused candidate or refused data leave the last good model in use,
and the diagnostics say why (WARN where a user should look).  Parameters:
:class:`~diffsim_ros.nodes.identifier_config.IdentifierConfig`; ``model_file``
(:mod:`~diffsim_ros.nodes.model_file`) makes an offline fit its nominal model, published
with its friction module until a refit replaces it.  A refit with an analytic friction
module (``<estimator>.friction_model``: ``sigmoid``, ``stribeck``) publishes the module
in the model document; a neural one is listed as omitted.

Publications:

* ``~/model`` (``std_msgs/String``, transient local): the current model whole, a JSON
  document of every parameter with units and std (:mod:`diffsim_ros.robots.message`), which
  the mpc and monitor load exactly and gate before use;
* ``~/robot_description`` (``std_msgs/String``, transient local): URDF of the current model
  for RViz and MoveIt (for ``'svgd'`` the posterior mean);
* ``~/parameters`` (``std_msgs/String``, transient local): JSON ``{"stamp", "method",
  "heldout_loss", "refits", "parameters": {name: {"value", "unit"[, "std"]}}}`` with the
  standard deviation wherever the estimator is Bayesian;
* ``/diagnostics`` (``diagnostic_msgs/DiagnosticArray``): refit losses, refit rate, window
  fill, dropped messages;
* ``/lockstep`` under ``use_sim_time`` only: each refit's due time holds a lockstep
  simulated plant until the refit has finished (:mod:`diffsim_ros.nodes.lockstep`).

Given a ``string_topic`` (cup mode, ball in a cup: ``config/wam4_cup.yaml``), the string the
ball hangs on is refit beside the arm from the ball's gated poses and joins ``~/parameters``
(:mod:`~diffsim_ros.nodes.string_identifier`).

Given an ``object`` (``-p object:=cube``, or in the parameter file), the executable runs the
identifier's object mode instead, which learns a tossed object from its mocap topic
(:mod:`~diffsim_ros.nodes.object_identifier`).

Services (``std_srvs``): ``~/reset`` (Trigger: empty window, nominal model), ``~/save``
(Trigger: URDF and parameter YAML into ``save_directory``), ``~/freeze`` (SetBool: stop or
resume refitting; data keep flowing into the window).
"""

import json
import sys
import threading
import time

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from geometry_msgs.msg import PoseStamped
from rclpy.node import Node
from rclpy.qos import (DurabilityPolicy, HistoryPolicy, qos_profile_sensor_data,
                       QoSProfile, ReliabilityPolicy)
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray, String
from std_srvs.srv import SetBool, Trigger

from .convert import (commands_array, COMMANDS_QOS, CommandTimes, MessageError,
                      pose_matrix, stamp_to_sec, ThrottledLogger)
from .gates import StateGate, StateGateConfig
from .identifier_config import (complete_estimator, engine_options, IdentifierConfig,
                                PHYSICAL_ESTIMATORS)
from .lockstep import LockstepPeer
from .model_file import load_model_file
from .params import declare_config, declare_robot
from .pose_gate import PoseGateConfig
from .runtime import configure_interpreter, run_node
from .string_identifier import StringIdentification
from .. import robots
from ..io.urdf_export import model_to_urdf, write_identified
from ..robots.message import model_message, parameters_message
from ..sysid.estimators import ESTIMATORS
from ..sysid.online import Decision, DecisionLog, OnlineEngine
from ..sysid.string_online import StringOnlineConfig

__all__ = ['DATA_WAIT_S', 'Identifier', 'IdentifierConfig', 'engine_options', 'main']

#: Wall seconds a refit under simulated time waits for the data up to its due time.
DATA_WAIT_S = 2.0


class Identifier(Node):
    """
    The online identification node (executable ``identifier``).

    :param kwargs: ``rclpy.node.Node`` arguments (``context``, ``parameter_overrides``, ...).
    """

    PARAMETERS = {'': IdentifierConfig, 'gate.': StateGateConfig,   # and each estimator's
                  **{f'{e}.': ESTIMATORS[e][1] for e in PHYSICAL_ESTIMATORS},   # under its name
                  'string.': StringOnlineConfig, 'string_gate.': PoseGateConfig}   # cup mode

    def __init__(self, **kwargs) -> None:
        """Declare parameters, load the nominal model and create the interfaces."""
        super().__init__(kwargs.pop('node_name', 'identifier'), **kwargs)
        configure_interpreter()   # torch in callbacks: see nodes/runtime.py
        self.robot, defaults = declare_robot(self)
        self.config = config = declare_config(self, IdentifierConfig, defaults=defaults)
        self.info, self.interface = robots.get(self.robot), robots.interface(self.robot)
        _, config_cls = ESTIMATORS[config.estimator]
        self.estimator_config = complete_estimator(declare_config(
            self, config_cls, f'{config.estimator}.', defaults, skip_unsupported=True),
            self.robot)
        # limits from the robot description; the model a fit's when model_file names one
        limits = self.interface.nominal_model()
        self.fit = load_model_file(self.interface, config.model_file)
        self.nominal = limits if self.fit is None else self.fit.model
        self.warnings = ThrottledLogger(self.get_logger())
        self.state_gate = StateGate(
            limits.joint_names, limits.lower, limits.upper, limits.velocity_limit,
            declare_config(self, StateGateConfig, 'gate.', defaults),
            self.warnings, config.joint_states_topic, require_velocity=False)
        self.messages = {'received': 0, 'decimated': 0}
        # cup mode: the ball on its string, refit beside the arm (nodes/string_identifier.py)
        string_config = declare_config(self, StringOnlineConfig, 'string.', defaults)
        ball_gate = declare_config(self, PoseGateConfig, 'string_gate.', defaults)
        self.string = StringIdentification(
            limits, config.string_length, ball_gate, string_config, self.warnings,
            config.string_topic) if config.string_topic else None
        self._lock = threading.Lock()
        # simulated time: commands timed by publication order, and a refit waits until the
        # data up to its due time are all in (a lockstep plant holds there meanwhile)
        self._simulated = bool(self.get_parameter('use_sim_time').value)
        self._times = CommandTimes(self.get_clock(), self._simulated)   # the states' timeline
        self._due = None   # simulated due time of the refit asked for, s
        self.incomplete_refits = 0
        # integer nanoseconds: an exact 1 kHz stream differs by exactly 10**6 ns, where float
        # epoch seconds lose ~1e-7 s and dropped 39 % of such samples against a 1 ms interval
        self._min_interval_ns = int(round(
            (config.min_sample_interval or 0.5 / self.info.driver_rate_hz) * 1e9))
        # a candidate outside the robot's plausibility bounds, or physically inconsistent, is
        # refused before it is published (the mpc and monitor gate it again on receipt)
        self.engine = OnlineEngine(
            self.nominal, config.online(self.estimator_config),
            check=lambda result: self.interface.check_model(result.model, result.actuator,
                                                            result.friction))
        self.memory, self.log = self.engine.memory, DecisionLog()
        self._reset_state()
        latched = QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL)
        self.description_pub = self.create_publisher(String, '~/robot_description', latched)
        self.model_pub = self.create_publisher(String, '~/model', latched)   # sent whole
        self.parameters_pub = self.create_publisher(String, '~/parameters', latched)
        # simulation: refits hold the plant's clock at their due time (nodes/lockstep.py)
        self._lockstep = LockstepPeer(self)
        self.diagnostics_pub = self.create_publisher(DiagnosticArray, '/diagnostics', 10)
        self.command_topic = config.command_topic or f'/{self.info.controller_name}/commands'
        # sensor-data QoS, but a deeper queue: a burst from the driver or a pause of this
        # process (the worker thread preparing a window) must not cost the 1 kHz stream
        stream = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=500,
                            reliability=ReliabilityPolicy.BEST_EFFORT)
        # two-argument callbacks: rclpy passes the message info (source times) only to those
        self.create_subscription(JointState, config.joint_states_topic,
                                 lambda msg, info: self._on_joint_state(msg, info), stream)
        self.create_subscription(Float64MultiArray, self.command_topic,
                                 lambda msg, info: self._on_command(msg, info), COMMANDS_QOS)
        if self.string is not None:
            self.create_subscription(PoseStamped, config.string_topic, self._on_ball, stream)
        for body in config.mocap_bodies:
            self.create_subscription(PoseStamped, f'{config.mocap_topic_prefix}/{body}',
                                     lambda msg, body=body: self._on_pose(body, msg),
                                     qos_profile_sensor_data)
        self.create_service(Trigger, '~/reset', self._on_reset)
        self.create_service(Trigger, '~/save', self._on_save)
        self.create_service(SetBool, '~/freeze', self._on_freeze)
        self.frozen = False
        self._wake, self._stop = threading.Event(), threading.Event()
        self._worker = threading.Thread(target=self._work, daemon=True)
        self._worker.start()
        self._refit_timer = self.create_timer(config.refit_period, self._on_refit_timer)
        self._lockstep.hold_until_next_call(self._refit_timer)
        self.create_timer(config.diagnostics_period, self.publish_diagnostics)
        self._publish_model()

    @property
    def best(self):
        """Return the identification result in use (None: the nominal model)."""
        return self.engine.current

    @property
    def last(self) -> dict:
        """Return the record of the last refit decision (:class:`DecisionLog`)."""
        return self.log.last

    @property
    def stats(self) -> dict:
        """Return the message and refit counts (a refit: a decision on data)."""
        counts = self.engine.counts
        return {**self.messages, 'accepted': counts['accepted'], 'rejected': counts['refused'],
                'failed': counts['failed'], 'discarded': counts['discarded'],
                'refits': sum(counts[k] for k in ('accepted', 'refused', 'failed', 'discarded'))}

    # -- data ------------------------------------------------------------------------------
    def _reset_state(self) -> None:
        """Empty the window and go back to the nominal model."""
        with self._lock:
            self.engine.reset()   # window and memory emptied, a running fit discarded
            if self.string is not None:
                self.string.reset()
            self._times.reset()
            self._last_ns = None
            self.log.clear()

    def _on_joint_state(self, msg: JointState, info=None) -> None:
        """Gate one joint state and append it to the window (decimated)."""
        self.messages['received'] += 1
        now_ns = self.get_clock().now().nanoseconds
        sample = self.state_gate.admit(msg, now_ns)
        if sample is None:
            return
        with self._lock:
            if sample.restart:   # time started over (sim reset, bag loop): forget the past
                self.engine.restart()   # window emptied, memory forgotten
                self._times.reset()
                if self.string is not None:
                    self.string.restart()
            if self.string is not None:
                self.string.add_state(sample.t, sample.q, sample.qd)
            # decimated or not: every state times the commands that arrive after it
            placed = self._times.state(sample.t, info)
            decimated = not sample.restart and self._last_ns is not None and \
                sample.stamp_ns - self._last_ns < self._min_interval_ns
            if decimated:
                self.messages['decimated'] += 1
            else:
                self._last_ns = sample.stamp_ns
                self.engine.window.add_state(sample.t, sample.q, sample.qd, sample.effort)
            self._add_commands(placed)

    def _on_command(self, msg: Float64MultiArray, info=None) -> None:
        """Store a command, timed on the states' timeline, for the zero-order hold."""
        try:
            u = commands_array(msg, len(self.estimator_config.command_joints))
        except MessageError as error:
            self.warnings.warn('commands', f'dropped: {error}')
            return
        with self._lock:
            self._add_commands(self._times.command(u, info))

    def _add_commands(self, timed) -> None:
        """Add ``[(t, u)]`` to the window (the caller holds the lock)."""
        for t, u in timed:
            if t is None:   # published before the states in the window: nothing to hold
                continue
            if not self.engine.window.add_command(t, u):
                self.warnings.warn('commands', 'dropped: the clock went back')

    def _on_pose(self, body: str, msg: PoseStamped) -> None:
        """Store a motion-capture pose."""
        try:
            T, t = pose_matrix(msg), stamp_to_sec(msg.header.stamp)
        except MessageError as error:
            self.warnings.warn(f'mocap/{body}', f'dropped: {error}')
            return
        if not self.engine.window.add_pose(body, t, T):
            self.warnings.warn(f'mocap/{body}', 'dropped: duplicate or out-of-order stamp')

    def _on_ball(self, msg: PoseStamped) -> None:
        """Cup mode: gate a ball pose and feed the string's window."""
        self.string.on_pose(msg, self.get_clock().now().nanoseconds)

    # -- refits ----------------------------------------------------------------------------
    def _on_refit_timer(self) -> None:
        """Ask the worker for a refit of the data up to now (the simulated due time)."""
        self._due = self.get_clock().now().nanoseconds * 1e-9
        self._wake.set()

    def _await_data(self, due: float) -> None:
        """
        Under simulated time, wait until the window holds every sample up to ``due``.

        The timer fires once the clock reaches ``due``, while states and commands stamped
        before it may still wait in the executor's queue: what a refit saw, and so what it
        accepted, depended on the machine.  In lockstep the plant holds at ``due`` until the
        refit has finished, and the window is complete once a state stamped ``due`` and the
        command published after it, which answers it, are in.  Without them (no controller,
        a lost state) the refit goes on after :data:`DATA_WAIT_S` wall seconds and is
        counted (``incomplete_refits`` on ``/diagnostics``).

        :param due: simulated due time of the refit, s.
        """
        deadline = time.monotonic() + DATA_WAIT_S
        while not self._stop.is_set():
            with self._lock:
                if self._times.published.settled(due):
                    # the command after the newest state answers it: the plant applies it
                    # from that state's stamp, and no later state will place it before
                    self._add_commands(self._times.published.drain())
                    return
            if time.monotonic() > deadline:
                self.incomplete_refits += 1
                self.warnings.warn('refit', f'data up to t = {due:.3f} s incomplete after '
                                   f'{DATA_WAIT_S:g} s: refitting on what arrived')
                return
            time.sleep(0.001)

    def _work(self) -> None:
        """Worker thread: refit whenever the timer asks and the node is not frozen."""
        while not self._stop.is_set():
            self._wake.wait()   # the timer or destroy_node wakes it
            self._wake.clear()
            if not self.frozen and not self._stop.is_set():
                if self._simulated and self._due is not None:
                    self._await_data(self._due)
                self.refit()
                if self.string is not None and self.string.refit_due():
                    self._publish_model()
            self._lockstep.hold_until_next_call(self._refit_timer)   # this one is done

    def refit(self) -> bool:
        """
        Run one refit of the engine on the current window and report its decision.

        :return: True when the new model was accepted (and published).
        """
        decision = self.engine.refit()
        self._record(decision)
        return decision.accepted

    def _record(self, decision: Decision) -> None:
        """Report a refit decision: diagnostics, a throttled warning, the model if accepted."""
        self.log.record(decision, time.monotonic())
        if decision.outcome == 'waiting':
            return
        if decision.warn:
            self.warnings.warn('refit', self.log.last['status'] + '; keeping the last good model')
        if decision.accepted:
            self._publish_model()
        self.publish_diagnostics()

    # -- outputs ---------------------------------------------------------------------------
    def _publish_model(self) -> None:
        """Publish the current model whole, its URDF and its parameters."""
        best = self.best
        model = best.model if best is not None else self.nominal
        try:
            # the whole model is what the mpc and monitor take: a lockstep plant waits for it
            self._lockstep.publish(self.model_pub, String(data=json.dumps(
                model_message(best if best is not None else self.fit or model,
                              self.interface))))
            self.description_pub.publish(String(data=model_to_urdf(model)))
        except ValueError as error:
            self.warnings.warn('robot_description', f'not published: {error}')
        document = parameters_message(best, self.log.heldout_loss,
                                      self.get_clock().now().nanoseconds * 1e-9,
                                      self.stats['accepted'])
        if self.string is not None:   # cup mode: the string's entries beside the arm's
            string = self.string.parameters()
            document['parameters'].update(string['parameters'])
            document['string'] = string['string']
        self.parameters_pub.publish(String(data=json.dumps(document)))

    def publish_diagnostics(self) -> None:
        """Publish one ``DiagnosticStatus`` with the refit and window statistics."""
        now_ns = self.get_clock().now().nanoseconds
        warn, message = self.log.last['warn'], self.log.last['status']
        refused = [line for line in (self.state_gate.status(now_ns), self.string.status(now_ns)
                                     if self.string is not None else None) if line]
        if refused:
            warn, message = True, '; '.join([message] + refused)
        window = self.engine.window
        values = {**self.stats, 'frozen': self.frozen, 'estimator': self.config.estimator,
                  'window_fill': min(window.span() / self.config.window, 1.0),
                  'window_samples': len(window), 'memory_cells': len(self.memory),
                  'drops': self.warnings.total, **self.state_gate.values(),
                  'incomplete_refits': self.incomplete_refits,
                  **{f'drops/{key}': count for key, count in self.warnings.drops.items()},
                  **self.log.values(),
                  **(self.string.values(now_ns) if self.string is not None else {})}
        status = DiagnosticStatus(
            level=DiagnosticStatus.WARN if warn else DiagnosticStatus.OK,
            name=f'{self.get_name()}: identification', message=message, hardware_id=self.robot,
            values=[KeyValue(key=k, value=str(v)) for k, v in values.items()])
        msg = DiagnosticArray(status=[status])
        msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(now_ns, 1_000_000_000)
        self.diagnostics_pub.publish(msg)

    # -- services --------------------------------------------------------------------------
    def _on_reset(self, request, response):
        """Empty the window and return to the nominal model."""
        self._reset_state()
        self._publish_model()
        response.success, response.message = True, 'window cleared, nominal model restored'
        return response

    def _on_save(self, request, response):
        """Write the current URDF and parameters to ``save_directory``."""
        best = self.best
        document = best.to_dict() if best is not None else {'method': 'nominal'}
        if self.string is not None:   # cup mode: the string in use beside the arm
            string = self.string.parameters()
            document = {**document, 'string': string['string'], 'parameters': {
                **document.get('parameters', {}), **string['parameters']}}
        try:
            urdf, params = write_identified(
                self.config.save_directory, self.robot,
                best.model if best is not None else self.nominal, document)
        except (OSError, ValueError) as error:
            response.success, response.message = False, f'save failed: {error}'
            return response
        response.success, response.message = True, f'wrote {urdf} and {params}'
        return response

    def _on_freeze(self, request, response):
        """Stop (``data=True``) or resume (``data=False``) refitting."""
        self.frozen = bool(request.data)
        response.success = True
        response.message = 'refits frozen' if self.frozen else 'refits resumed'
        return response

    def destroy_node(self) -> None:
        """Stop the worker thread, then destroy the node."""
        self._stop.set()
        self._wake.set()
        self.engine.close()
        if self.string is not None:
            self.string.close()
        self._worker.join(timeout=30.0)
        super().destroy_node()


def main(args=None) -> None:
    """Run the node (``ros2 run diffsim_ros identifier``); given an ``object``, its object mode."""
    from .object_identifier import object_mode, ObjectIdentifier
    argv = sys.argv if args is None else args
    run_node(ObjectIdentifier if object_mode(argv) else Identifier, args)


if __name__ == '__main__':
    main()
