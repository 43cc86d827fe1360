"""
Monitor node: shows how well the current model predicts the robot.

It buffers measured ``joint_states`` and the commands sent to the robot, and every ``period``
seconds rolls the current model (nominal, or the offline fit of ``model_file``:
:mod:`~diffsim_ros.nodes.model_file`; then each model the identifier publishes on
``/identifier/model`` that passes the model gate of :mod:`diffsim_ros.robots.gate`,
parameters ``model_gate.*``) forward from the state measured ``horizon`` seconds ago with the
recorded commands (each held until the next and averaged over a rollout step) through the
robot's actuator model: the DC motor for Quanser voltages, minus the model's joint friction
and friction module, plus gravity when the driver compensates it.  States are timed by their
header stamps, commands on the states' timeline by the identifier's rule
(:class:`~diffsim_ros.nodes.convert.CommandTimes`): the stamp of the newest state that had
arrived when the command arrived, plus the time between the two arrivals (DDS receive times);
under ``use_sim_time``, the stamp of the state published last before the command.  It
publishes

* ``/predicted/joint_states``: the predicted state at the newest measurement time, which a
  second ``robot_state_publisher`` (``frame_prefix: predicted/``) turns into a ghost robot;
* ``~/markers``: measured and predicted end-effector paths over the window, LINE_STRIPs in
  namespaces ``measured_path`` and ``predicted_path``, in the base link's frame;
* ``~/prediction_nmse``: ``Float64MultiArray`` ``[state NMSE, position NMSE per joint...]``
  (errors over variances of the measured window, as the identification metrics, but never
  over less than the largest window variances seen so far: a balanced pendulum's window is
  nearly still), ``inf`` when the rollout diverged; also on ``/diagnostics``.

Every ``joint_states`` message passes the input gate (:mod:`diffsim_ros.nodes.gates`,
parameters ``gate.*``: stamps ahead of the clock or behind the last one, states beyond the
joint or velocity limits of the nominal model are refused, counted and shown on
``/diagnostics``, WARN while recent).  Rollouts run on a worker thread, so a slow prediction
never delays the subscriptions.
"""

from collections import deque
from dataclasses import dataclass, field
import math
import threading
from typing import Any, Dict, Optional

from builtin_interfaces.msg import Duration
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from geometry_msgs.msg import Point
import numpy as np
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, qos_profile_sensor_data, QoSProfile
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray, MultiArrayDimension, MultiArrayLayout
from std_msgs.msg import String
import torch
from visualization_msgs.msg import Marker, MarkerArray

from .convert import (commands_array, COMMANDS_QOS, CommandTimes, joint_state_msg,
                      MessageError, ThrottledLogger)
from .diagnostics import diagnostics_msg
from .gates import StateGate, StateGateConfig
from .model_file import load_model_file, MODEL_FILE_DESCRIPTION
from .params import declare_config, declare_robot, meta
from .runtime import configure_interpreter, run_node
from .. import robots
from ..core import INTEGRATORS, RobotModel
from ..robots.gate import ModelGate, ModelGateConfig
from ..robots.prediction import end_effector_path, predict_window

__all__ = ['MODEL_QOS', 'MonitorConfig', 'MonitorNode', 'main']

MODEL_QOS = QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL)
#: Marker namespaces of the measured and predicted end-effector paths (config/monitor.rviz).
MEASURED_NS, PREDICTED_NS = 'measured_path', 'predicted_path'


@dataclass(frozen=True)
class MonitorConfig:
    """Parameters of the monitor node (``monitor:`` section of ``config/<robot>.yaml``)."""

    joint_states_topic: str = field(default='joint_states', metadata=meta(
        'sensor_msgs/JointState topic of the robot'))
    command_topic: str = field(default='', metadata=meta(
        'commands sent to the robot; empty: /<controller_name>/commands of the catalog'))
    model_topic: str = field(default='/identifier/model', metadata=meta(
        'std_msgs/String JSON document of the identified model (transient-local, '
        'diffsim_ros.robots.message), judged by the model gate before use'))
    horizon: float = field(default=1.0, metadata=meta(
        'prediction horizon: the model is rolled out from the state this long ago, s',
        range=(0.0, 60.0)))
    dt: float = field(default=0.01, metadata=meta('rollout step, s', range=(0.0, 1.0)))
    integrator: str = field(default='rk4', metadata=meta(
        'rollout integrator: rk4 or semi_implicit_euler (needs a smaller dt)'))
    period: float = field(default=1.0, metadata=meta('time between two predictions, s',
                                                     range=(0.0, 3600.0)))
    buffer_duration: float = field(default=5.0, metadata=meta(
        'measured states and commands kept, s (>= horizon)', range=(0.0, 3600.0)))
    line_width: float = field(default=0.005, metadata=meta('path marker width, m',
                                                           range=(0.0, 1.0)))
    model_file: str = field(default='', metadata=meta(MODEL_FILE_DESCRIPTION))
    max_stamp_offset: float = field(default=0.5, metadata=meta(
        "joint_states are timed by their header stamps (the driver's sample times) unless "
        'a stamp is this far (s) from the arrival time (unset or unsynchronised clock): then '
        'by arrival, like the commands', range=(0.0, 3600.0)))

    def __post_init__(self) -> None:
        """Reject non-positive durations and unknown integrators."""
        for name in ('horizon', 'dt', 'period', 'buffer_duration', 'line_width',
                     'max_stamp_offset'):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0.0):
                raise ValueError(f'{name} must be finite and > 0, got {value}')
        if self.dt > self.horizon:
            raise ValueError(f'dt ({self.dt}) must not exceed horizon ({self.horizon})')
        if self.buffer_duration < self.horizon:
            raise ValueError(f'buffer_duration ({self.buffer_duration}) must be >= horizon '
                             f'({self.horizon})')
        if self.integrator not in INTEGRATORS:
            raise ValueError(f'unknown integrator {self.integrator!r}; valid: '
                             f'{", ".join(INTEGRATORS)}')


def _path_marker(name: str, frame: str, points: np.ndarray, rgba, width: float) -> Marker:
    """Return one LINE_STRIP marker through ``points`` ``(K, 3)``."""
    marker = Marker(ns=name, id=0, type=Marker.LINE_STRIP, action=Marker.ADD,
                    lifetime=Duration(sec=0), frame_locked=False)
    marker.header.frame_id = frame
    marker.pose.orientation.w = 1.0
    marker.scale.x = width
    marker.color.r, marker.color.g, marker.color.b, marker.color.a = rgba
    marker.points = [Point(x=float(x), y=float(y), z=float(z)) for x, y, z in points]
    return marker


class MonitorNode(Node):
    """
    Publish the current model's predictions next to the measurements (module docstring).

    :param node_name: ROS node name (its section of ``config/<robot>.yaml`` is read).
    :param kwargs: passed to ``rclpy.node.Node`` (``context``, ``parameter_overrides``...).
    """

    #: Parameter sections (``--help``, the unknown-name check): the input gate's under
    #: ``gate.``, the model gate's under ``model_gate.``.
    PARAMETERS = {'': MonitorConfig, 'gate.': StateGateConfig, 'model_gate.': ModelGateConfig}

    def __init__(self, node_name: str = 'monitor', **kwargs) -> None:
        """Declare parameters, load the nominal model, start the prediction thread."""
        super().__init__(node_name, **kwargs)
        configure_interpreter()   # torch in callbacks: see nodes/runtime.py
        robot, defaults = declare_robot(self)
        self.info = robots.get(robot)
        self.config = declare_config(self, MonitorConfig, defaults=defaults)
        gate_config = declare_config(self, StateGateConfig, 'gate.', defaults)
        model_gate_config = declare_config(self, ModelGateConfig, 'model_gate.', defaults)
        interface = robots.interface(self.info.name)
        fit = load_model_file(interface, self.config.model_file)
        self.model, self.actuator = interface.nominal_model(), None   # None: nominal motor
        self.friction = None   # the model's extra friction module
        self._names = self.model.joint_names
        self._lock = threading.Lock()
        keep = int(self.config.buffer_duration * self.info.driver_rate_hz * 2) + 16
        self._states = deque(maxlen=keep)
        self._commands = deque(maxlen=keep)
        # commands timed on the states' timeline, by the identifier's rule
        self._times = CommandTimes(self.get_clock(),
                                   bool(self.get_parameter('use_sim_time').value))
        self._log = ThrottledLogger(self.get_logger())
        self.model_gate = ModelGate(interface, model_gate_config, self.info.driver_rate_hz,
                                    self._log)
        # joint_states pass the input gate (nodes/gates.py), limits of the nominal model
        self.state_gate = StateGate(self._names, self.model.lower, self.model.upper,
                                    self.model.velocity_limit, gate_config, self._log,
                                    self.config.joint_states_topic)
        if fit is not None:   # after the limits: those stay the robot description's
            self.model, self.actuator, self.friction = fit.model, fit.actuator, fit.friction
        self.last_prediction: Optional[Dict[str, Any]] = None
        #: Largest state variances of a window so far, ``(2 n,)`` (the NMSE's floor).
        self._scale_floor: Optional[torch.Tensor] = None
        self.models_accepted = self.models_rejected = self.predictions = 0
        topic = self.config.command_topic or f'/{self.info.controller_name}/commands'
        # two-argument callbacks: rclpy passes the message info (DDS receive times) only to
        # those; with one argument every arrival was the executor's (late under load)
        self.create_subscription(JointState, self.config.joint_states_topic,
                                 lambda msg, info: self._on_joint_state(msg, info),
                                 qos_profile_sensor_data)
        self.create_subscription(Float64MultiArray, topic,
                                 lambda msg, info: self._on_command(msg, info), COMMANDS_QOS)
        self.create_subscription(String, self.config.model_topic, self._on_model, MODEL_QOS)
        self._predicted_pub = self.create_publisher(JointState, '/predicted/joint_states', 10)
        self._markers_pub = self.create_publisher(MarkerArray, '~/markers', 10)
        self._nmse_pub = self.create_publisher(Float64MultiArray, '~/prediction_nmse', 10)
        self._diagnostics_pub = self.create_publisher(DiagnosticArray, '/diagnostics', 10)
        self._stop = threading.Event()
        self._worker = threading.Thread(target=self._run, name='monitor-rollout', daemon=True)
        self._worker.start()

    def _on_joint_state(self, msg: JointState, info=None) -> None:
        sample = self.state_gate.admit(msg, self.get_clock().now().nanoseconds)
        if sample is None:
            return
        now = self._times.received(info)
        stamp = sample.t if abs(sample.t - now) <= self.config.max_stamp_offset else now
        with self._lock:
            if sample.restart:   # time started over (bag or simulation restarted)
                self._states.clear()
                self._commands.clear()
                self._times.reset()
                self._scale_floor = None
            elif self._states and stamp <= self._states[-1][0]:
                self._log.warn(self.config.joint_states_topic, 'dropped out-of-order message')
                return
            self._states.append((stamp, sample.q, sample.qd))
            placed = self._add_commands(self._times.state(stamp, info, now))
        self.model_gate.recent.add_state(stamp, sample.q, sample.qd)
        for t, u in placed:
            self.model_gate.recent.add_command(t, u)

    def _on_command(self, msg: Float64MultiArray, info=None) -> None:
        try:
            u = commands_array(msg, len(self.info.command_joints))
        except MessageError as error:
            self._log.warn('commands', f'dropped message: {error}')
            return
        with self._lock:
            placed = self._add_commands(self._times.command(u, info))
        for t, u in placed:
            self.model_gate.recent.add_command(t, u)

    def _add_commands(self, timed) -> list:
        """Buffer ``[(t, u)]`` (the caller holds the lock); return those kept."""
        kept = []
        for t, u in timed:   # None: published before every state, nothing to hold it on
            if t is not None and (not self._commands or t >= self._commands[-1][0]):
                self._commands.append((t, u))
                kept.append((t, u))
        return kept

    def _on_model(self, msg: String) -> None:
        """Hand a model document to the gate (robots/gate.py), which judges it on its thread."""
        with self._lock:
            model, actuator, friction = self.model, self.actuator, self.friction
        self.model_gate.submit(msg.data, model, actuator, self._use_model, self._refused,
                               current_friction=friction)

    def _use_model(self, model: RobotModel, actuator, friction, decision) -> None:
        with self._lock:
            self.model, self.actuator, self.friction = model, actuator, friction
        self.models_accepted += 1
        self.get_logger().info(f'model update {self.models_accepted} accepted '
                               f'({decision.note})')

    def _refused(self, reason: str) -> None:
        self.models_rejected += 1

    def _run(self) -> None:
        """Predict every ``period`` seconds (wall clock) until the node is closed."""
        while not self._stop.wait(self.config.period):
            try:
                self.predict_and_publish()
            except Exception as error:  # noqa: BLE001 - keep monitoring whatever happens
                self._log.warn('prediction', f'failed: {error!r}')

    def predict_and_publish(self) -> Optional[Dict[str, Any]]:
        """
        Run one prediction over the buffered window and publish its results.

        :return: the :func:`~diffsim_ros.robots.prediction.predict_window` result, or None
            without enough data.
        """
        with self._lock:
            states, commands = list(self._states), list(self._commands)
            model, actuator, friction = self.model, self.actuator, self.friction
            floor = self._scale_floor
        if not states:
            return None
        t = np.array([s[0] for s in states])
        cutoff = t[-1] - self.config.buffer_duration
        commands = [c for c in commands if c[0] >= cutoff]
        m = len(self.info.command_joints)
        result = predict_window(
            model, self.info, t, np.stack([s[1] for s in states]),
            np.stack([s[2] for s in states]), np.array([c[0] for c in commands]),
            np.stack([c[1] for c in commands]) if commands else np.zeros((0, m)),
            self.config.horizon, self.config.dt, self.config.integrator, floor, actuator,
            friction)
        if result is None:
            return None
        # the largest variances seen so far normalise later windows (a balance after a
        # swing-up is scored against the motion of the run, not against its own stillness)
        with self._lock:
            if self._scale_floor is floor:   # not reset by a clock jump meanwhile
                self._scale_floor = result['scale'] if floor is None \
                    else torch.maximum(floor, result['scale'])
        self._publish(model, result)
        self.predictions += 1
        self.last_prediction = result
        return result

    def _publish(self, model: RobotModel, result: Dict[str, Any]) -> None:
        stamp = self.get_clock().now().to_msg()
        frame = self.info.base_link
        markers = [_path_marker(MEASURED_NS, frame, end_effector_path(
            model, self.info, result['q_measured']), (0.1, 0.8, 0.1, 1.0),
            self.config.line_width)]
        if result['finite']:
            markers.append(_path_marker(PREDICTED_NS, frame, end_effector_path(
                model, self.info, result['q_predicted']), (1.0, 0.5, 0.0, 1.0),
                self.config.line_width))
            self._predicted_pub.publish(joint_state_msg(
                self._names, result['q_predicted'][-1], result['qd_predicted'][-1],
                stamp=stamp))
        for marker in markers:
            marker.header.stamp = stamp
        self._markers_pub.publish(MarkerArray(markers=markers))
        values = [result['nmse'], *result['nmse_q']]
        label = 'prediction_nmse: state, ' + ', '.join(f'q[{j}]' for j in self._names)
        self._nmse_pub.publish(Float64MultiArray(
            layout=MultiArrayLayout(dim=[MultiArrayDimension(
                label=label, size=len(values), stride=len(values))]),
            data=[float(v) for v in values]))
        level = DiagnosticStatus.OK if result['finite'] else DiagnosticStatus.WARN
        message = 'prediction ok' if result['finite'] else 'rollout diverged'
        if self.model_gate.warning:
            level, message = DiagnosticStatus.WARN, self.model_gate.warning
        refused = self.state_gate.status(self.get_clock().now().nanoseconds)
        if refused:
            level, message = DiagnosticStatus.WARN, f'{message}; {refused}'
        self._diagnostics_pub.publish(diagnostics_msg(
            stamp, f'{self.get_name()}: prediction', self.info.name, level, message, {
                'prediction_nmse': result['nmse'], 'horizon_s': self.config.horizon,
                'models_accepted': self.models_accepted,
                'models_rejected': self.models_rejected, **self.model_gate.diagnostics(),
                'dropped_messages': self._log.total, **self.state_gate.values()}))

    def destroy_node(self) -> None:
        """Stop the prediction thread, then destroy the node (its handles die with it)."""
        self._stop.set()
        self.model_gate.close()
        if self._worker.is_alive() and self._worker is not threading.current_thread():
            self._worker.join(timeout=10.0)
        super().destroy_node()

    def close(self) -> None:
        """Stop the prediction thread and destroy the node (same as :meth:`destroy_node`)."""
        self.destroy_node()


def main(args=None) -> None:
    """Run the monitor node (executable ``monitor``)."""
    run_node(MonitorNode, args)
