"""
Online identification node: refits a physically consistent model on a sliding data window.

Subscriptions: ``joint_states`` (sensor-data QoS; joints mapped by name), the command topic
(``/<controller_name>/commands``, stamped on receipt with the node clock and held onto the
joint-state stamps) and ``<mocap_topic_prefix>/<body>`` poses.  Every ``refit_period`` s a
worker thread takes the window, estimates velocities/accelerations (zero-phase filter;
measured velocities kept when ``velocity_source`` allows, and then differentiated on their own
stamps for the accelerations), splits off the last ``holdout_fraction`` as held-out data,
leaves out the stretches where a joint is within ``limit_margin`` of a position limit (the
limit stop's force is not in the model) and runs ``diffsim_ros.sysid.estimators.fit``
warm-started from the last accepted result, on the training part together with up to
``memory_segments`` older cells of data that the window has lost, kept for their information
about the base parameters (:class:`~diffsim_ros.sysid.memory.SegmentMemory`): without them a
robot holding still for a window's length (a balanced pendulum) lets refits drift.  A refit
is accepted only if its inverse-dynamics torque error on the held-out data (normalised by the
nominal model's torque variance) beats the current model's by ``min_improvement``; otherwise
the last good model stays and the diagnostics turn WARN.

Publications:

* ``~/robot_description`` (``std_msgs/String``, transient local): URDF of the current model
  (for ``'svgd'`` the posterior mean);
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
from dataclasses import dataclass, field
import json
import math
from pathlib import Path
import threading
import time

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from geometry_msgs.msg import PoseStamped
import numpy as np
from rclpy.node import Node
from rclpy.qos import (DurabilityPolicy, HistoryPolicy, qos_profile_sensor_data,
                       QoSProfile, ReliabilityPolicy)
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray, String
from std_srvs.srv import SetBool, Trigger
import torch
import yaml

from .convert import (commands_array, joint_state_arrays, MessageError, pose_matrix,
                      stamp_to_sec, ThrottledLogger)
from .lockstep import LockstepPeer
from .params import declare_config, declare_robot
from .refit import RefitPool, score_refit
from .runtime import configure_interpreter, run_node
from .. import robots
from ..core import load_urdf
from ..io.urdf_export import model_to_urdf
from ..sysid.dataset import Trajectory
from ..sysid.estimators import ESTIMATORS
from ..sysid.filters import estimate_derivatives
from ..sysid.losses import resolve_source
from ..sysid.memory import SegmentMemory
from ..sysid.preprocess import align_streams, limit_free_runs, split_time

__all__ = ['Identifier', 'IdentifierConfig', 'main']


#: Estimators whose result is a physical model ('svgd': the posterior-mean model, with a
#: standard deviation per parameter in ``~/parameters``).
PHYSICAL_ESTIMATORS = ('nea', 'diffnea', 'svgd')


def _meta(description: str) -> dict:
    return {'description': description}


@dataclass(frozen=True)
class IdentifierConfig:
    """Parameters of the identifier node (see the module docstring)."""

    estimator: str = field(default='diffnea', metadata=_meta(
        "estimator: 'nea', 'diffnea' or 'svgd'; its settings are the parameters "
        "'<estimator>.*'"))
    refit_period: float = field(default=1.0, metadata=_meta('seconds between refits'))
    window: float = field(default=5.0, metadata=_meta('sliding window length, s'))
    min_window: float = field(default=1.0, metadata=_meta('data needed before a refit, s'))
    holdout_fraction: float = field(default=0.25, metadata=_meta(
        'last fraction of the window held out to accept or reject a refit'))
    min_improvement: float = field(default=0.0, metadata=_meta(
        'relative held-out improvement a refit needs to replace the current model'))
    velocity_source: str = field(default='auto', metadata=_meta(
        "'auto' (message velocity when every sample has one), 'message' or 'differentiate'"))
    derivative_cutoff_hz: float = field(default=20.0, metadata=_meta(
        'low-pass cutoff of the zero-phase differentiation, Hz'))
    limit_margin: float = field(default=0.05, metadata=_meta(
        'samples this close to a position limit (rad or m), or beyond it, are left out of '
        'refits, with the filter transient around them; negative keeps every sample'))
    min_sample_interval: float = field(default=0.0, metadata=_meta(
        'joint states closer than this (s) to the last kept one are skipped; 0 = half the '
        "driver's period"))
    max_time_jump: float = field(default=1.0, metadata=_meta(
        'a stamp this far (s) behind the last one clears the window (bag loop, sim reset); '
        'smaller steps back are dropped'))
    joint_states_topic: str = field(default='joint_states', metadata=_meta(
        'sensor_msgs/JointState input'))
    command_topic: str = field(default='', metadata=_meta(
        "std_msgs/Float64MultiArray commands; '' = /<controller_name>/commands"))
    mocap_bodies: tuple[str, ...] = field(default=(), metadata=_meta(
        'links with motion-capture poses on <mocap_topic_prefix>/<link>'))
    mocap_topic_prefix: str = field(default='mocap', metadata=_meta('mocap topic prefix'))
    save_directory: str = field(default='', metadata=_meta(
        "where ~/save writes the URDF and parameter YAML; '' = ./diffsim_identified"))
    diagnostics_period: float = field(default=1.0, metadata=_meta(
        'seconds between /diagnostics messages'))
    memory_segments: int = field(default=4, metadata=_meta(
        'past cells of data kept beyond the window for their information about the base '
        'parameters (a robot holding still must not make refits forget); 0 = window only'))
    memory_segment: float = field(default=1.0, metadata=_meta('memory cell length, s'))
    memory_max_age: float = field(default=120.0, metadata=_meta(
        'memory cells older than this (s) are forgotten (a changed robot, e.g. a new payload, '
        'is then fit on its own data); 0 = never'))
    refit_process: bool = field(default=True, metadata=_meta(
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
                     'max_time_jump', 'diagnostics_period'):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise ValueError(f'{name} must be > 0, got {getattr(self, name)!r}')
        if not 0.0 < self.holdout_fraction < 1.0:
            raise ValueError(f'holdout_fraction must be in (0, 1), got {self.holdout_fraction}')
        if not math.isfinite(self.limit_margin):
            raise ValueError(f'limit_margin must be finite, got {self.limit_margin!r}')
        if self.memory_segments < 0:
            raise ValueError(f'memory_segments must be >= 0, got {self.memory_segments}')
        for name in ('memory_segment',):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise ValueError(f'{name} must be > 0, got {getattr(self, name)!r}')
        for name in ('min_improvement', 'min_sample_interval', 'memory_max_age'):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise ValueError(f'{name} must be >= 0, got {getattr(self, name)!r}')
        if self.min_window > self.window:
            raise ValueError(f'min_window ({self.min_window}) exceeds window ({self.window})')


class Identifier(Node):
    """
    The online identification node (executable ``identifier``).

    :param kwargs: ``rclpy.node.Node`` arguments (``context``, ``parameter_overrides``, ...).
    """

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
        self.nominal = load_urdf(robots.urdf_string(self.robot), dtype=torch.float64)
        self.warnings = ThrottledLogger(self.get_logger())
        self.stats = {'received': 0, 'refits': 0, 'accepted': 0, 'rejected': 0, 'failed': 0,
                      'decimated': 0}
        self._lock = threading.Lock()
        self._min_interval = config.min_sample_interval or 0.5 / self.info.driver_rate_hz
        self._finished = deque(maxlen=20)   # monotonic end times of recent refits
        self.memory = SegmentMemory(self.nominal, config.memory_segments, config.memory_segment,
                                    config.memory_max_age or math.inf)
        self._reset_state()
        latched = QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL)
        self.description_pub = self.create_publisher(String, '~/robot_description', latched)
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
        self._pool = RefitPool() if config.refit_process else None
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
            self._states = deque()
            self._commands = deque()
            self._poses = {body: deque() for body in self.config.mocap_bodies}
            self._last_t = None
            self._forget = True   # the worker empties the memory before its next refit
            self.best = None   # None = the nominal model
            self.best_loss = math.inf
            self.last = {'status': 'collecting data', 'level': DiagnosticStatus.OK}

    def _prune(self, now: float) -> None:
        """Drop samples older than the window (lock held)."""
        start = now - self.config.window
        for queue in (self._states, self._commands, *self._poses.values()):
            while len(queue) > 1 and queue[1][0] < start:
                queue.popleft()

    def _on_joint_state(self, msg: JointState) -> None:
        """Validate one joint state and append it to the window."""
        self.stats['received'] += 1
        try:
            t, q, qd, effort = joint_state_arrays(msg, self.nominal.joint_names,
                                                  require_velocity=False)
        except MessageError as error:
            self.warnings.warn('joint_states', f'dropped: {error}')
            return
        with self._lock:
            if self._last_t is not None and t <= self._last_t:
                if self._last_t - t > self.config.max_time_jump:
                    self.get_logger().warning(f'time jumped back {self._last_t - t:.3f} s: '
                                              'clearing the window')
                    self._states.clear()
                    self._commands.clear()
                    self._forget = True
                    for queue in self._poses.values():
                        queue.clear()
                else:
                    self.warnings.warn('joint_states', 'dropped: duplicate or out-of-order '
                                       f'stamp {t:.6f} s (last {self._last_t:.6f} s)')
                    return
            elif self._last_t is not None and t - self._last_t < self._min_interval:
                self.stats['decimated'] += 1
                return
            self._last_t = t
            self._states.append((t, q, qd, effort))
            self._prune(t)

    def _on_command(self, msg: Float64MultiArray) -> None:
        """Store a command, stamped now, for the zero-order hold."""
        try:
            u = commands_array(msg, len(self.estimator_config.command_joints))
        except MessageError as error:
            self.warnings.warn('commands', f'dropped: {error}')
            return
        with self._lock:
            t = self.get_clock().now().nanoseconds * 1e-9
            if self._commands and t <= self._commands[-1][0]:
                self._commands[-1] = (self._commands[-1][0], u)
            else:
                self._commands.append((t, u))

    def _on_pose(self, body: str, msg: PoseStamped) -> None:
        """Store a motion-capture pose."""
        try:
            T, t = pose_matrix(msg), stamp_to_sec(msg.header.stamp)
        except MessageError as error:
            self.warnings.warn(f'mocap/{body}', f'dropped: {error}')
            return
        with self._lock:
            queue = self._poses[body]
            if queue and t <= queue[-1][0]:
                self.warnings.warn(f'mocap/{body}', 'dropped: duplicate or out-of-order stamp')
                return
            queue.append((t, T))

    def window_trajectory(self) -> Trajectory:
        """
        Return the current window as a trajectory with derivatives, commands and poses.

        :return: samples in model joint order; ``qd`` from the messages (if allowed and
            present) and ``qdd`` its central differences, else both from the low-passed
            positions (and ``tau`` low-passed alike); ``tau`` from the efforts when every
            sample has one, ``u`` commands held onto the joint-state stamps.
        :raises ValueError: too little data (less than ``min_window`` s).
        """
        with self._lock:
            states, commands = list(self._states), list(self._commands)
            poses = {body: list(queue) for body, queue in self._poses.items() if len(queue) > 1}
        if len(states) < 3 or states[-1][0] - states[0][0] < self.config.min_window:
            raise ValueError('not enough data in the window yet')
        f64 = torch.float64
        t = torch.tensor([s[0] for s in states], dtype=f64)
        q = torch.tensor(np.stack([s[1] for s in states]), dtype=f64)
        measured = all(s[2] is not None for s in states)
        efforts = all(s[3] is not None for s in states)
        tau = torch.tensor(np.stack([s[3] for s in states]), dtype=f64) if efforts else None
        traj = Trajectory(t=t, q=q, tau=tau, joint_names=self.nominal.joint_names,
                          run='window')
        traj = estimate_derivatives(traj, 'filtfilt', self.config.derivative_cutoff_hz)
        if measured and self.config.velocity_source != 'differentiate':
            # accelerations: central differences of the measured velocity on the actual
            # stamps, not a low-passed second derivative of the (quantised) positions on a
            # resampled grid, which loses the steps of bang-bang commands and interpolates
            # over dropped samples (both shrink the fitted inertias)
            qd = np.stack([s[2] for s in states])
            qdd = np.gradient(qd, t.numpy(), axis=0, edge_order=1)
            traj = traj.replace(qd=torch.tensor(qd, dtype=f64), qdd=torch.tensor(qdd, dtype=f64),
                                tau=tau)   # unfiltered, as the accelerations
        elif self.config.velocity_source == 'message':
            raise ValueError("velocity_source is 'message' but joint states lack velocities")
        if commands and commands[-1][0] < states[-1][0]:
            commands.append((states[-1][0], commands[-1][1]))   # hold the last command
        command_stream = (torch.tensor([c[0] for c in commands], dtype=f64),
                          torch.tensor(np.stack([c[1] for c in commands]), dtype=f64)) \
            if commands else None
        pose_streams = {body: (torch.tensor([p[0] for p in items], dtype=f64),
                               torch.tensor(np.stack([p[1] for p in items]), dtype=f64))
                        for body, items in poses.items()}
        traj = align_streams(traj, command_stream, pose_streams or None)
        edge = 2.0 / self.config.derivative_cutoff_hz   # filter transients at both ends
        keep = (traj.t >= traj.t[0] + edge) & (traj.t <= traj.t[-1] - edge)
        index = torch.nonzero(keep).flatten()
        if index.numel() < 10:
            raise ValueError('not enough data in the window yet')
        return traj.crop(int(index[0]), int(index[-1]) + 1)

    # -- refits ----------------------------------------------------------------------------
    def usable_runs(self, runs) -> list:
        """
        Return the stretches of some runs that stay away from the joint limits.

        :param runs: trajectories of the window.
        :return: their :func:`~diffsim_ros.sysid.preprocess.limit_free_runs`.
        """
        pad = 2.0 / self.config.derivative_cutoff_hz   # the filter's transient
        return [part for traj in runs for part in limit_free_runs(
            traj, self.nominal.lower, self.nominal.upper, self.config.limit_margin, pad)]

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
        Run one refit on the current window and accept it if it improves the held-out data.

        :return: True when the new model was accepted.
        """
        try:
            traj = self.window_trajectory()
        except ValueError as error:
            self.last = {'status': str(error), 'level': DiagnosticStatus.OK}
            return False
        split = split_time(traj, validation=self.config.holdout_fraction)
        train, validation = (self.usable_runs(part) for part in (split.train, split.validation))
        # the memory's cells from before the window join the training data; the held-out
        # part stays the newest data, which the model must predict
        if self._forget:
            self._forget = False
            self.memory.clear()
        remembered = self.memory.runs(before=float(traj.t[0]))
        self.memory.offer(self.usable_runs([traj]))   # unsplit: cells across the cut count
        train = remembered + train
        if not train or not validation:
            self.last = {'status': 'not enough data away from the joint limits',
                         'level': DiagnosticStatus.OK}
            return False
        started = time.perf_counter()
        best = self.best
        self.stats['refits'] += 1
        try:
            cfg = self.estimator_config
            source = resolve_source(train, cfg.source, cfg.actuator != 'none')
            job = (self.config.estimator, self.nominal, cfg, source, train, validation, best)
            scores = self._pool.score(*job) if self._pool is not None else score_refit(*job)
            candidate = scores['candidate']
            new_loss, old_loss, nominal_loss = scores['new'], scores['old'], scores['nominal']
        except Exception as error:  # noqa: B902 - a failed refit must not kill the node
            self.stats['failed'] += 1
            self._finish({'status': f'refit failed: {error}', 'level': DiagnosticStatus.WARN},
                         started)
            self.warnings.warn('refit', f'failed: {error!r}; keeping the last good model')
            return False
        accepted = new_loss < (1.0 - self.config.min_improvement) * old_loss
        report = {'train_loss': float(candidate.metrics.get('loss', math.nan)),
                  'candidate_heldout_loss': new_loss, 'current_heldout_loss': old_loss,
                  'nominal_heldout_loss': nominal_loss}
        if accepted:
            with self._lock:
                if self.best is best:   # a reset during the fit discards it
                    self.best, self.best_loss = candidate, new_loss
            self.stats['accepted'] += 1
            self._finish({**report, 'status': 'refit accepted', 'level': DiagnosticStatus.OK},
                         started)
            self._publish_model()
        else:
            self.stats['rejected'] += 1
            self.best_loss = old_loss
            worse = not new_loss <= old_loss * (1.0 + 1e-9)   # equal: the fit did not move
            self._finish({**report, 'status': f'refit rejected: held-out loss {new_loss:.4g} '
                          f'vs {old_loss:.4g}', 'level': DiagnosticStatus.WARN if worse
                          else DiagnosticStatus.OK}, started)
            if worse:
                self.warnings.warn('refit', self.last['status'] + '; keeping the last good '
                                   'model')
        return accepted

    def _finish(self, report: dict, started: float) -> None:
        """Record a refit's outcome and publish diagnostics."""
        report['duration_s'] = time.perf_counter() - started
        report['finished'] = time.monotonic()
        self._finished.append(report['finished'])
        self.last = report
        self.publish_diagnostics()

    # -- outputs ---------------------------------------------------------------------------
    def _publish_model(self) -> None:
        """Publish the current model's URDF and parameters."""
        best = self.best
        try:
            model = best.model if best is not None else self.nominal
            self._lockstep.publish(self.description_pub, String(data=model_to_urdf(model)))
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
        with self._lock:
            span = self._states[-1][0] - self._states[0][0] if len(self._states) > 1 else 0.0
            samples = len(self._states)
        finished = list(self._finished)
        rate = (len(finished) - 1) / (finished[-1] - finished[0]) \
            if len(finished) > 1 and finished[-1] > finished[0] else 0.0
        values = {**self.stats, 'frozen': self.frozen, 'estimator': self.config.estimator,
                  'window_fill': min(span / self.config.window, 1.0), 'window_samples': samples,
                  'refit_rate_hz': rate, 'heldout_loss': self.best_loss,
                  'memory_cells': len(self.memory),
                  'drops': self.warnings.total,
                  **{f'drops/{key}': count for key, count in self.warnings.drops.items()},
                  **{key: value for key, value in self.last.items()
                     if key not in ('status', 'level', 'finished')}}
        status = DiagnosticStatus(level=self.last['level'], name=f'{self.get_name()}: '
                                  'identification', message=self.last['status'],
                                  hardware_id=self.robot,
                                  values=[KeyValue(key=k, value=str(v)) for k, v in
                                          values.items()])
        msg = DiagnosticArray(status=[status])
        msg.header.stamp = self.get_clock().now().to_msg()
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
        if self._pool is not None:
            self._pool.close()
        self._worker.join(timeout=30.0)
        super().destroy_node()


def main(args=None) -> None:
    """Run the node (``ros2 run diffsim_ros identifier``)."""
    run_node(Identifier, args)


if __name__ == '__main__':
    main()
