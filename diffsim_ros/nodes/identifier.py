"""
Online identification node: message conversion around the one online identification engine.

Subscriptions: ``joint_states`` (sensor-data QoS; joints mapped by name; each message passes
the input gate :class:`~diffsim_ros.nodes.gates.StateGate`, parameters ``gate.*``: stamps
ahead of the node clock or behind the last accepted one, states beyond the joint or velocity
limits are refused and counted; the window and the memory are cleared only when the gate
adopts a new timeline, which no single message can make it do), the command topic
(``/<controller_name>/commands``, stamped on receipt with the node clock and held onto the
joint-state stamps) and ``<mocap_topic_prefix>/<body>`` poses.  Samples go into the window of
a :class:`~diffsim_ros.sysid.online.OnlineEngine`; every ``refit_period`` s a worker thread
asks it for one refit (in a child process when ``refit_process``, so that the fit never
holds the interpreter lock of the thread taking ``joint_states``).  The engine, the same one
``diffsim-sim-eval --controller adaptive-mpc`` runs, estimates the derivatives, leaves out
the stretches near a position limit, keeps informative older cells (``memory_*``), refuses
data whose commands the model of the driver cannot explain (``max_unexplained``), fits, and
accepts a candidate only if its ``prediction_steps``-step open-loop prediction of the
held-out newest data (``holdout_fraction``) beats the model in use by ``min_improvement``;
otherwise the last good model stays and the diagnostics say why (WARN where a user should
look).

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

Services (``std_srvs``): ``~/reset`` (Trigger: empty window, nominal model), ``~/save``
(Trigger: URDF and parameter YAML into ``save_directory``), ``~/freeze`` (SetBool: stop or
resume refitting; data keep flowing into the window).
"""

from collections import deque
import dataclasses
from dataclasses import dataclass, field
import json
import math
from pathlib import Path
import threading
import time
from typing import Any, Mapping, Optional, Tuple

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from geometry_msgs.msg import PoseStamped
from rclpy.node import Node
from rclpy.qos import (DurabilityPolicy, HistoryPolicy, qos_profile_sensor_data,
                       QoSProfile, ReliabilityPolicy)
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray, String
from std_srvs.srv import SetBool, Trigger
import yaml

from .convert import commands_array, MessageError, pose_matrix, stamp_to_sec, ThrottledLogger
from .gates import StateGate, StateGateConfig
from .lockstep import LockstepPeer
from .params import (build_config, config_path, declare_config, declare_robot, load_yaml_params,
                     meta)
from .runtime import configure_interpreter, run_node
from .. import robots
from ..io.urdf_export import model_to_urdf
from ..robots.message import model_message
from ..sysid.estimators import ESTIMATORS
from ..sysid.online import Decision, OnlineConfig, OnlineEngine

__all__ = ['Identifier', 'IdentifierConfig', 'engine_options', 'main']


#: Estimators whose result is a physical model ('svgd': the posterior-mean model, with a
#: standard deviation per parameter in ``~/parameters``).
PHYSICAL_ESTIMATORS = ('nea', 'diffnea', 'svgd')


@dataclass(frozen=True)
class IdentifierConfig:
    """Parameters of the identifier node (see the module docstring)."""

    estimator: str = field(default='diffnea', metadata=meta(
        "estimator: 'nea', 'diffnea' or 'svgd'; its settings are the parameters "
        "'<estimator>.*'"))
    refit_period: float = field(default=1.0, metadata=meta('seconds between refits',
                                                           range=(0.0, 3600.0)))
    window: float = field(default=5.0, metadata=meta('sliding window length, s',
                                                     range=(0.0, 3600.0)))
    min_window: float = field(default=1.0, metadata=meta('data needed before a refit, s',
                                                         range=(0.0, 3600.0)))
    holdout_fraction: float = field(default=0.25, metadata=meta(
        'last fraction of the window held out to accept or reject a refit'))
    min_improvement: float = field(default=0.0, metadata=meta(
        'relative improvement of the held-out prediction error a refit needs to replace the '
        'current model'))
    prediction_steps: int = field(default=10, metadata=meta(
        'open-loop steps of the held-out prediction error that accepts or refuses a refit'))
    max_unexplained: float = field(default=1.0, metadata=meta(
        'refuse refits on data whose commands leave more than this normalised residual in a '
        'block under every plausible model (0 explained, 1 unrelated, above 1 pushing against '
        'the motion, 2 opposed)'))
    velocity_source: str = field(default='auto', metadata=meta(
        "'auto' (message velocity when every sample has one), 'message' or 'differentiate'"))
    derivative_cutoff_hz: float = field(default=20.0, metadata=meta(
        'low-pass cutoff of the zero-phase differentiation, Hz', range=(0.0, 10000.0)))
    limit_margin: float = field(default=0.05, metadata=meta(
        'samples this close to a position limit (rad or m), or beyond it, are left out of '
        'refits, with the filter transient around them; negative keeps every sample'))
    min_sample_interval: float = field(default=0.0, metadata=meta(
        'joint states closer than this (s) to the last kept one are skipped; 0 = half the '
        "driver's period", range=(0.0, 10.0)))
    joint_states_topic: str = field(default='joint_states', metadata=meta(
        'sensor_msgs/JointState input'))
    command_topic: str = field(default='', metadata=meta(
        "std_msgs/Float64MultiArray commands; '' = /<controller_name>/commands"))
    mocap_bodies: tuple[str, ...] = field(default=(), metadata=meta(
        'links with motion-capture poses on <mocap_topic_prefix>/<link>'))
    mocap_topic_prefix: str = field(default='mocap', metadata=meta('mocap topic prefix'))
    save_directory: str = field(default='', metadata=meta(
        "where ~/save writes the URDF and parameter YAML; '' = ./diffsim_identified"))
    diagnostics_period: float = field(default=1.0, metadata=meta(
        'seconds between /diagnostics messages', range=(0.0, 3600.0)))
    memory_segments: int = field(default=4, metadata=meta(
        'past cells of data kept beyond the window for their information about the base '
        'parameters (a robot holding still must not make refits forget); 0 = window only',
        range=(0, 1000)))
    memory_segment: float = field(default=1.0, metadata=meta('memory cell length, s',
                                                             range=(0.0, 3600.0)))
    memory_max_age: float = field(default=120.0, metadata=meta(
        'memory cells older than this (s) are forgotten (a changed robot, e.g. a new payload, '
        'is then fit on its own data); 0 = never', range=(0.0, 1000000.0)))
    refit_process: bool = field(default=True, metadata=meta(
        'run each fit in a child process, so that it never holds the lock of the '
        'interpreter taking joint_states (False: on a thread of this process)'))

    def __post_init__(self) -> None:
        """Validate choices and ranges."""
        if self.estimator not in PHYSICAL_ESTIMATORS or self.estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be 'nea', 'diffnea' or 'svgd' (a physical model "
                             f'the node can publish as URDF), got {self.estimator!r}')
        if self.velocity_source not in ('auto', 'message', 'differentiate'):
            raise ValueError("velocity_source must be 'auto', 'message' or 'differentiate', "
                             f'got {self.velocity_source!r}')
        for name in ('refit_period', 'window', 'min_window', 'derivative_cutoff_hz',
                     'diagnostics_period'):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise ValueError(f'{name} must be > 0, got {getattr(self, name)!r}')
        if not 0.0 < self.holdout_fraction < 1.0:
            raise ValueError(f'holdout_fraction must be in (0, 1), got {self.holdout_fraction}')
        if not math.isfinite(self.limit_margin):
            raise ValueError(f'limit_margin must be finite, got {self.limit_margin!r}')
        if self.memory_segments < 0:
            raise ValueError(f'memory_segments must be >= 0, got {self.memory_segments}')
        if self.prediction_steps < 1:
            raise ValueError(f'prediction_steps must be >= 1, got {self.prediction_steps}')
        if not (math.isfinite(self.max_unexplained) and self.max_unexplained > 0):
            raise ValueError(f'max_unexplained must be > 0, got {self.max_unexplained!r}')
        for name in ('memory_segment',):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise ValueError(f'{name} must be > 0, got {getattr(self, name)!r}')
        for name in ('min_improvement', 'min_sample_interval', 'memory_max_age'):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise ValueError(f'{name} must be >= 0, got {getattr(self, name)!r}')
        if self.min_window > self.window:
            raise ValueError(f'min_window ({self.min_window}) exceeds window ({self.window})')

    def online(self, estimator_config) -> OnlineConfig:
        """
        Return the engine's options (the same engine as ``control/adaptive.py``).

        :param estimator_config: the estimator's configuration object.
        :return: the :class:`~diffsim_ros.sysid.online.OnlineConfig`.
        """
        return OnlineConfig(
            estimator=self.estimator, estimator_config=estimator_config, window=self.window,
            min_window=self.min_window, holdout_fraction=self.holdout_fraction,
            prediction_steps=self.prediction_steps, accept_margin=self.min_improvement,
            velocity_source=self.velocity_source,
            derivative_cutoff_hz=self.derivative_cutoff_hz, limit_margin=self.limit_margin,
            memory_segments=self.memory_segments, memory_segment=self.memory_segment,
            memory_max_age=self.memory_max_age or math.inf,
            max_unexplained=self.max_unexplained,
            execution='process' if self.refit_process else 'inline')


def engine_options(robot: str, overrides: Optional[Mapping[str, Any]] = None,
                   simulated: bool = False) -> Tuple[OnlineConfig, float]:
    """
    Return the engine options and refit period this node runs with for a robot.

    They are read without a node: ``config/<robot>.yaml`` (its ``identifier`` section), then
    ``overrides``.

    ``diffsim-sim-eval --controller adaptive-mpc`` runs the engine with them, so that it
    measures the loop the identifier runs on the robot.

    :param robot: catalog robot name.
    :param overrides: parameter values by name (``{'estimator': 'nea', 'nea.source': 'u'}``).
    :param simulated: time is simulated and a refit holds it (as in lockstep): the
        estimator's wall-clock budget (``max_seconds``), which would make results depend on
        the machine's speed, is lifted, and fits run in place.
    :return: ``(OnlineConfig, refit_period in s)``.
    :raises ParameterError: a value the node would refuse.
    """
    params = {**load_yaml_params(config_path(robot), 'identifier'), **dict(overrides or {})}
    config = build_config(IdentifierConfig, params)
    _, config_cls = ESTIMATORS[config.estimator]
    estimator = build_config(config_cls, params, f'{config.estimator}.', skip_unsupported=True)
    changes = {}
    if not estimator.command_joints:   # commands drive the catalog's command joints
        changes['command_joints'] = list(robots.get(robot).command_joints)
    if simulated and getattr(estimator, 'max_seconds', 0.0):
        changes['max_seconds'] = 0.0
    if changes:
        estimator = config_cls.from_dict({**estimator.to_dict(), **changes})
    online = config.online(estimator)
    if simulated:
        online = dataclasses.replace(online, execution='inline')
    return online, config.refit_period


class Identifier(Node):
    """
    The online identification node (executable ``identifier``).

    :param kwargs: ``rclpy.node.Node`` arguments (``context``, ``parameter_overrides``, ...).
    """

    PARAMETERS = {'': IdentifierConfig, 'gate.': StateGateConfig,   # and each estimator's
                  **{f'{e}.': ESTIMATORS[e][1] for e in PHYSICAL_ESTIMATORS}}   # under its name

    def __init__(self, **kwargs) -> None:
        """Declare parameters, load the nominal model and create the interfaces."""
        super().__init__(kwargs.pop('node_name', 'identifier'), **kwargs)
        configure_interpreter()   # torch in callbacks: see nodes/runtime.py
        self.robot, defaults = declare_robot(self)
        self.config = config = declare_config(self, IdentifierConfig, defaults=defaults)
        self.info = robots.get(self.robot)
        _, config_cls = ESTIMATORS[config.estimator]
        estimator = declare_config(self, config_cls, f'{config.estimator}.', defaults,
                                   skip_unsupported=True)
        if not estimator.command_joints:   # commands drive the catalog's command joints
            estimator = config_cls.from_dict(
                {**estimator.to_dict(), 'command_joints': list(self.info.command_joints)})
        self.estimator_config = estimator
        self.nominal = robots.interface(self.robot).nominal_model()
        self.warnings = ThrottledLogger(self.get_logger())
        self.state_gate = StateGate(
            self.nominal.joint_names, self.nominal.lower, self.nominal.upper,
            self.nominal.velocity_limit, declare_config(self, StateGateConfig, 'gate.', defaults),
            self.warnings, config.joint_states_topic, require_velocity=False)
        self.stats = {'received': 0, 'refits': 0, 'accepted': 0, 'rejected': 0, 'failed': 0,
                      'decimated': 0}
        self._lock = threading.Lock()
        # integer nanoseconds: an exact 1 kHz stream differs by exactly 10**6 ns, where float
        # epoch seconds lose ~1e-7 s and dropped 39 % of such samples against a 1 ms interval
        self._min_interval_ns = int(round(
            (config.min_sample_interval or 0.5 / self.info.driver_rate_hz) * 1e9))
        self._finished = deque(maxlen=20)   # monotonic end times of recent refits
        # a candidate outside the robot's plausibility bounds, or physically inconsistent, is
        # refused before it is published (the mpc and monitor gate it again on receipt)
        interface = robots.interface(self.robot)
        self.engine = OnlineEngine(self.nominal, config.online(estimator), check=lambda result:
                                   interface.check_model(result.model, result.actuator))
        self.memory = self.engine.memory
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
        self.create_subscription(JointState, config.joint_states_topic, self._on_joint_state,
                                 stream)
        self.create_subscription(Float64MultiArray, self.command_topic, self._on_command, 10)
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
        self._refit_timer = self.create_timer(config.refit_period, self._wake.set)
        self._lockstep.hold_until_next_call(self._refit_timer)
        self.create_timer(config.diagnostics_period, self.publish_diagnostics)
        self._publish_model()

    # -- data ------------------------------------------------------------------------------
    def _reset_state(self) -> None:
        """Empty the window and go back to the nominal model."""
        with self._lock:
            self.engine.reset()   # window and memory emptied, a running fit discarded
            self._last_ns = None
            self.best = None   # None = the nominal model
            self.best_loss = math.inf
            self.last = {'status': 'collecting data', 'level': DiagnosticStatus.OK}

    def _on_joint_state(self, msg: JointState) -> None:
        """Gate one joint state and append it to the window (decimated)."""
        self.stats['received'] += 1
        sample = self.state_gate.admit(msg, self.get_clock().now().nanoseconds)
        if sample is None:
            return
        with self._lock:
            if sample.restart:   # time started over (sim reset, bag loop): forget the past
                self.engine.restart()   # window emptied, memory forgotten
            elif self._last_ns is not None and \
                    sample.stamp_ns - self._last_ns < self._min_interval_ns:
                self.stats['decimated'] += 1
                return
            self._last_ns = sample.stamp_ns
            self.engine.window.add_state(sample.t, sample.q, sample.qd, sample.effort)

    def _on_command(self, msg: Float64MultiArray) -> None:
        """Store a command, stamped now, for the zero-order hold."""
        try:
            u = commands_array(msg, len(self.estimator_config.command_joints))
        except MessageError as error:
            self.warnings.warn('commands', f'dropped: {error}')
            return
        if not self.engine.window.add_command(self.get_clock().now().nanoseconds * 1e-9, u):
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

    # -- refits ----------------------------------------------------------------------------
    def _work(self) -> None:
        """Worker thread: refit whenever the timer asks and the node is not frozen."""
        while not self._stop.is_set():
            if not self._wake.wait(0.1):
                continue
            self._wake.clear()
            if not self.frozen and not self._stop.is_set():
                self.refit()
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
        """Turn a refit decision into statistics, diagnostics, a log line and the model."""
        level = DiagnosticStatus.WARN if decision.warn else DiagnosticStatus.OK
        if decision.outcome == 'waiting':
            self.last = {'status': decision.reason, 'level': level}
            return
        self.stats['refits'] += 1
        key = {'accepted': 'accepted', 'failed': 'failed', 'refused': 'rejected'}.get(
            decision.outcome, 'discarded')
        self.stats[key] = self.stats.get(key, 0) + 1
        report = {k: v for k, v in decision.to_dict().items()
                  if k not in ('outcome', 'accepted', 'reason')}
        report.update(status=f'refit {decision.outcome}: {decision.reason}', level=level,
                      duration_s=decision.durations.get('total_s', 0.0),
                      finished=time.monotonic())
        if decision.accepted:
            self.best = decision.result
            self.best_loss = decision.losses['candidate']
        elif 'current' in decision.losses:
            self.best_loss = decision.losses['current']
        self._finished.append(report['finished'])
        self.last = report
        if decision.warn:
            self.warnings.warn('refit', report['status'] + '; keeping the last good model')
        if decision.accepted:
            self._publish_model()
        self.publish_diagnostics()

    # -- outputs ---------------------------------------------------------------------------
    def _publish_model(self) -> None:
        """Publish the current model's URDF and parameters."""
        best = self.best
        try:
            model = best.model if best is not None else self.nominal
            # the whole model is what the mpc and monitor take: a lockstep plant waits for it
            self._lockstep.publish(self.model_pub, String(data=json.dumps(model_message(
                best if best is not None else model, robots.interface(self.robot)))))
            self.description_pub.publish(String(data=model_to_urdf(model)))
        except ValueError as error:
            self.warnings.warn('robot_description', f'not published: {error}')
        payload = best.to_dict() if best is not None else {'parameters': {}}
        self.parameters_pub.publish(String(data=json.dumps({
            'stamp': self.get_clock().now().nanoseconds * 1e-9,
            'method': best.method if best is not None else 'nominal',
            'heldout_loss': self.best_loss if math.isfinite(self.best_loss) else None,
            'refits': self.stats['accepted'], 'parameters': payload['parameters']})))

    def publish_diagnostics(self) -> None:
        """Publish one ``DiagnosticStatus`` with the refit and window statistics."""
        span, samples = self.engine.window.span(), len(self.engine.window)
        finished = list(self._finished)
        rate = (len(finished) - 1) / (finished[-1] - finished[0]) \
            if len(finished) > 1 and finished[-1] > finished[0] else 0.0
        now_ns = self.get_clock().now().nanoseconds
        level, message = self.last['level'], self.last['status']
        refused = self.state_gate.status(now_ns)
        if refused:
            level, message = max(level, DiagnosticStatus.WARN), f'{message}; {refused}'
        values = {**self.stats, 'frozen': self.frozen, 'estimator': self.config.estimator,
                  'window_fill': min(span / self.config.window, 1.0), 'window_samples': samples,
                  'refit_rate_hz': rate, 'heldout_loss': self.best_loss,
                  'memory_cells': len(self.memory),
                  'drops': self.warnings.total, **self.state_gate.values(),
                  **{f'drops/{key}': count for key, count in self.warnings.drops.items()},
                  **{key: value for key, value in self.last.items()
                     if key not in ('status', 'level', 'finished')}}
        status = DiagnosticStatus(level=level, name=f'{self.get_name()}: identification',
                                  message=message,
                                  hardware_id=self.robot,
                                  values=[KeyValue(key=k, value=str(v)) for k, v in
                                          values.items()])
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
        directory = Path(self.config.save_directory or 'diffsim_identified').expanduser()
        best = self.best
        try:
            directory.mkdir(parents=True, exist_ok=True)
            urdf = directory / f'{self.robot}_identified.urdf'
            params = directory / f'{self.robot}_identified.yaml'
            urdf.write_text(model_to_urdf(best.model if best is not None else self.nominal),
                            encoding='utf-8')
            content = best.to_dict() if best is not None else {'method': 'nominal'}
            params.write_text(yaml.safe_dump(content, sort_keys=False), encoding='utf-8')
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
        self._worker.join(timeout=30.0)
        super().destroy_node()


def main(args=None) -> None:
    """Run the node (``ros2 run diffsim_ros identifier``)."""
    run_node(Identifier, args)


if __name__ == '__main__':
    main()
