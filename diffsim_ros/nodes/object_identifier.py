"""
Object identifier node: learns a tossed object's contact and inertia from its mocap topic.

The identifier's object mode (``identifier`` given an ``object``, or the executable
``object_identifier``; node name ``identifier``):
configured with an ``object`` (``cube``: the catalogue's ContactNets cube, or a URDF whose
single link has a ``<box>`` collision) and a ``method`` (:data:`~diffsim_ros.sysid.
object_learning.METHODS`), it subscribes ``pose_topic`` (``geometry_msgs/PoseStamped``,
vrpn_mocap style, sensor-data QoS), puts each message through the
:class:`~diffsim_ros.nodes.pose_gate.PoseGate` (``pose_gate.*``), cuts the accepted poses
into tosses and keeps a sliding window of them, and refits with
:func:`~diffsim_ros.sysid.object_learning.fit_object` on a worker thread, through the one
refit engine (:class:`~diffsim_ros.sysid.object_online.ObjectEngine`; the rules for
velocities, tosses, refits and standard deviations are in :mod:`diffsim_ros.sysid.
object_online`).  Parameters ``toss.*``: the toss rule; ``refit.*``: the window and the fits.

When time starts over (a simulation reset, a bag played in a loop: stamps jump back), the
gate adopts the new timeline under the rule the robot mode's ``joint_states`` gate uses
(:mod:`~diffsim_ros.nodes.timeline`; ``pose_gate.resync_time``,
``pose_gate.resync_messages``); until then the poses behind are refused as ``stamp_back``.
The node then forgets the old timeline, as the robot mode does: the toss under way is
dropped (``toss/aborted_restart``: a toss never spans two timelines), so are the window's
tosses and the refits not yet started; the learned object stays in use, and
``timeline_restarts`` counts the restarts on ``/diagnostics`` (each one logged).

Publications: ``~/robot_description`` (``std_msgs/String``, transient local): the object in
use as URDF with its learned collision shape (:func:`~diffsim_ros.io.urdf_export.
learned_urdf`, no files); ``~/parameters`` (``std_msgs/String``, transient local): JSON ``{"stamp",
"method", "heldout_loss", "refits", "parameters": {name: {"value", "unit", "std"}}}`` as
the robot mode's, std from the bootstrap fits; ``/diagnostics``: refused poses per reason,
tosses, refits.  Under ``use_sim_time`` it takes part in the lockstep protocol
(:mod:`~diffsim_ros.nodes.lockstep`): the simulated tosser never runs more than
``lockstep_lead`` s of poses ahead of what this node has taken, and stands still while a
refit is due or running, so that what is learned does not depend on the machine's speed.

Services (``std_srvs/Trigger``), as the robot mode's: ``~/reset`` (empty the window, drop the
toss under way, back to the nominal object; a running fit is discarded) and ``~/save`` (the
object in use as ``<object>_identified.urdf`` with its collision geometry, a non-box shape
as the ``.obj`` mesh it names, and ``<object>_identified.yaml``, its named parameters with
std and held-out errors, into ``save_directory``; :func:`~diffsim_ros.io.object_urdf.
read_object_urdf` reads the URDF back).  No text from a topic or request is a path.
"""

from dataclasses import dataclass, field, replace
import json
import math
import os
import threading
import time
from typing import Sequence

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from geometry_msgs.msg import PoseStamped
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from std_msgs.msg import String
from std_srvs.srv import Trigger
import yaml

from .convert import ThrottledLogger
from .diagnostics import diagnostics_msg
from .lockstep import LockstepPeer
from .params import (_parameter_overrides, check_unknown_parameters, config_path, declare_config,
                     load_yaml_params, meta, parameter_sections, ParameterError)
from .pose_gate import PoseGate, PoseGateConfig
from .runtime import configure_interpreter, run_node
from ..core.errors import URDFError
from ..io.object_urdf import learned_urdf, object_spec
from ..io.urdf_export import write_identified
from ..robots.message import parameters_message
from ..sysid.contact_learning import ObjectFit
from ..sysid.object_learning import METHODS
from ..sysid.object_online import (object_parameters, ObjectEngine, ObjectOnlineConfig,
                                   ObjectResult, SegmenterConfig, TossSegmenter)
from ..sysid.online import DecisionLog

__all__ = ['ObjectIdentifier', 'ObjectIdentifierConfig', 'object_defaults', 'object_mode',
           'main']


@dataclass(frozen=True)
class ObjectIdentifierConfig:
    """Parameters of the object identifier (see the module docstring)."""

    object: str = field(default='cube', metadata=meta(  # noqa: A003 - the brief's name
        "'cube' (the ContactNets cube) or the path of a URDF whose one link has a <box> "
        'collision; selects config/<object>.yaml'))
    method: str = field(default='ccn', metadata=meta(
        f'learning method: {", ".join(METHODS)}'))
    pose_topic: str = field(default='mocap/cube', metadata=meta(
        "the object's geometry_msgs/PoseStamped"))
    friction: float = field(default=0.18, metadata=meta('nominal friction coefficient'))
    lockstep_lead: float = field(default=0.5, metadata=meta(
        'use_sim_time only: simulated seconds of poses the tosser may publish ahead of those '
        'taken'))
    save_directory: str = field(default='', metadata=meta(
        "where ~/save writes the learned URDF, its meshes and the parameter YAML; '' = "
        './diffsim_identified'))
    diagnostics_period: float = field(default=1.0, metadata=meta(
        'seconds between /diagnostics messages', range=(0.0, 3600.0)))

    def __post_init__(self) -> None:
        """Validate the method and the numbers."""
        if self.method not in METHODS:
            raise ValueError(f'method must be one of {", ".join(METHODS)}; got {self.method!r}')
        for name in ('friction', 'lockstep_lead', 'diagnostics_period'):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise ValueError(f'{name} must be > 0, got {getattr(self, name)!r}')


def object_mode(argv: Sequence[str], node: str = 'identifier') -> bool:
    """
    Return whether a command line configures a node with an ``object``.

    ``-p object:=NAME`` (or ``--param``), or ``object`` in the node's (or a wildcard)
    section of a ``--params-file``: ``ros2 run diffsim_ros identifier`` then runs this node
    instead of the robot identifier, ``sim_driver`` the simulated toss rig.

    :param argv: the command line.
    :param node: the node's name (its section in a parameter file).
    :return: True for the object mode.
    """
    args = list(argv)
    for flag, value in zip(args, args[1:]):
        if flag in ('-p', '--param') and value.split(':=', 1)[0] == 'object':
            return True
        if flag == '--params-file':
            try:
                if 'object' in load_yaml_params(value, node):
                    return True
            except (OSError, ValueError, yaml.YAMLError):
                pass   # rcl reports the file when the node starts
    return False


def object_defaults(node) -> dict:
    """
    Return a node's section of ``config_file``, else of ``config/<object>.yaml``, checked.

    Like :func:`~diffsim_ros.nodes.params.declare_robot` for robots: every parameter name
    the node was given (command line, parameter file, that section) is checked against the
    node's sections first.

    :param node: the node (its name selects the section; ``object`` and ``config_file`` as
        given to it, ``'cube'`` and ``''`` by default).
    :return: ``{parameter: value}`` (empty without a file).
    :raises ParameterError: a ``config_file`` that does not exist, or an unknown name.
    """
    given = _parameter_overrides(node)
    name, path = given.get('object', 'cube'), given.get('config_file', '')
    if not path and name == 'cube':
        path = str(config_path('cube'))
    defaults = {}
    if path and os.path.isfile(path):
        defaults = load_yaml_params(path, node.get_name())
    elif given.get('config_file'):
        raise ParameterError('config_file', path, 'the file does not exist')
    for key in ('use_sim_time', 'robot'):
        defaults.pop(key, None)
    check_unknown_parameters(node, {**defaults, **given}, parameter_sections(type(node)))
    return defaults


class ObjectIdentifier(Node):
    """
    The object identifier node (executable ``object_identifier``).

    :param kwargs: ``rclpy.node.Node`` arguments (``context``, ``parameter_overrides``, ...).
    """

    PARAMETERS = {'': ObjectIdentifierConfig, 'pose_gate.': PoseGateConfig,
                  'toss.': SegmenterConfig, 'refit.': ObjectOnlineConfig}

    def __init__(self, **kwargs) -> None:
        """Declare parameters, build the nominal object and create the interfaces."""
        super().__init__(kwargs.pop('node_name', 'identifier'), **kwargs)
        configure_interpreter()
        defaults = object_defaults(self)
        self.config = config = declare_config(self, ObjectIdentifierConfig, defaults=defaults)
        self.spec = object_spec(config.object, config.friction)
        self.warnings = ThrottledLogger(self.get_logger())
        self.gate = PoseGate(declare_config(self, PoseGateConfig, 'pose_gate.', defaults),
                             self.warnings, config.pose_topic)
        self.segmenter = TossSegmenter(declare_config(self, SegmenterConfig, 'toss.', defaults))
        engine_config = replace(declare_config(self, ObjectOnlineConfig, 'refit.', defaults),
                                method=config.method)
        self.engine = ObjectEngine(self.spec, engine_config)
        self.log = DecisionLog()
        self._lock = threading.Lock()
        self._taken_ns = 0
        self._announced_ns = None
        self._hold_ns = None   # stamp of the oldest due refit (lockstep holds there)
        latched = QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL)
        self.description_pub = self.create_publisher(String, '~/robot_description', latched)
        self.parameters_pub = self.create_publisher(String, '~/parameters', latched)
        self.diagnostics_pub = self.create_publisher(DiagnosticArray, '/diagnostics', 10)
        self._lockstep = LockstepPeer(self)
        self._lead_ns = int(config.lockstep_lead * 1e9)
        self._announce()
        # sensor-data QoS (what vrpn_mocap publishes), a deeper queue for refit pauses
        stream = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1000,
                            reliability=ReliabilityPolicy.BEST_EFFORT)
        self.create_subscription(PoseStamped, config.pose_topic, self._on_pose, stream)
        self.create_service(Trigger, '~/reset', self._on_reset)
        self.create_service(Trigger, '~/save', self._on_save)
        self._wake, self._stop = threading.Event(), threading.Event()
        self._worker = threading.Thread(target=self._work, daemon=True)
        self._worker.start()
        self.create_timer(config.diagnostics_period, self.publish_diagnostics)
        self._publish()

    # -- data ------------------------------------------------------------------------------
    def _on_pose(self, msg: PoseStamped) -> None:
        """Gate a pose, feed the toss segmenter, queue a refit when one is due."""
        sample = self.gate.admit(msg, self.get_clock().now().nanoseconds)
        if sample is None:
            return
        with self._lock:
            if sample.restart:   # time started over (sim reset, bag loop): forget the past
                self._forget(sample.stamp_ns)
            toss = self.segmenter.add(sample.stamp_ns * 1e-9, sample.q)
            self._taken_ns = sample.stamp_ns
            if toss is not None and self.engine.add_toss(toss):
                if self._hold_ns is None:
                    self._hold_ns = sample.stamp_ns
                self._wake.set()
        self._announce()

    def _forget(self, stamp_ns: int) -> None:
        """
        Start a new timeline (lock held): no toss, window or due refit spans two timelines.

        The toss under way and the window's tosses are dropped, the object in use is kept; a
        lockstep hold for a running refit moves to the new timeline.
        """
        self.segmenter.restart()
        self.engine.restart()
        if self._hold_ns is not None:
            self._hold_ns = stamp_ns
        self._announced_ns = None

    def _announce(self) -> None:
        """Lockstep: hold the tosser at a due refit, else ``lockstep_lead`` ahead."""
        if not self._lockstep.active:
            return
        with self._lock:
            until = self._hold_ns if self._hold_ns is not None else \
                self._taken_ns + self._lead_ns
            if self._announced_ns is not None and self._hold_ns is None and \
                    0 <= until - self._announced_ns < self._lead_ns // 4:
                return   # announce every quarter lead, not every pose
            self._announced_ns = until
        self._lockstep.hold(until)

    # -- refits ----------------------------------------------------------------------------
    def _work(self) -> None:
        """Worker thread: run the due refits in their order."""
        while not self._stop.is_set():
            if not self._wake.wait(0.1):
                continue
            self._wake.clear()
            while self.engine.snapshots and not self._stop.is_set():
                decision = self.engine.refit()
                self.log.record(decision, time.monotonic())
                if decision.warn:
                    self.warnings.warn('refit', self.log.last['status'])
                if decision.accepted:
                    self._publish()
                self.publish_diagnostics()
            with self._lock:
                self._hold_ns = None if not self.engine.snapshots else self._hold_ns
                self._announced_ns = None
            self._announce()

    # -- outputs ---------------------------------------------------------------------------
    def _in_use(self) -> ObjectResult:
        """Return the object in use: the learned one, else the nominal one as a result."""
        best = self.engine.current
        if best is not None and best.fit.model is not None:
            return best
        nominal = ObjectFit('nominal', self.spec, self.spec.model, self.spec.contact, {})
        return ObjectResult(nominal, object_parameters(nominal.model, nominal.contact))

    def _publish(self) -> None:
        """Publish the object in use: URDF and named parameters."""
        fit = self._in_use().fit
        try:
            urdf, _ = learned_urdf(fit.model, fit.contact, self.spec.model.urdf, files=False)
            self.description_pub.publish(String(data=urdf))
        except (URDFError, ValueError) as error:
            self.warnings.warn('robot_description', f'not published: {error}')
        self.parameters_pub.publish(String(data=json.dumps(parameters_message(
            self.engine.current, self.log.heldout_loss,
            self.get_clock().now().nanoseconds * 1e-9, self.engine.counts['accepted']))))

    def publish_diagnostics(self) -> None:
        """Publish one status: pose refusals, tosses, refits."""
        now = self.get_clock().now()
        warn, message = self.log.last['warn'], self.log.last['status']
        refused = self.gate.status(now.nanoseconds)
        if refused:
            warn, message = True, f'{message}; {refused}'
        counts = self.engine.counts
        values = {**self.gate.values(), **{f'toss/{k}': v for k, v in
                                           self.segmenter.counts.items()},
                  'window_tosses': len(self.engine.tosses),
                  'refits_due': len(self.engine.snapshots),
                  **{f'refits/{k}': v for k, v in counts.items()}, **self.log.values()}
        level = DiagnosticStatus.WARN if warn else DiagnosticStatus.OK
        self.diagnostics_pub.publish(diagnostics_msg(
            now.to_msg(), f'{self.get_name()}: object identification', self.spec.name, level,
            message, values))

    # -- services --------------------------------------------------------------------------
    def _on_reset(self, request, response):
        """Empty the window and return to the nominal object; a running fit is discarded."""
        with self._lock:
            self.engine.reset()
            self.segmenter.reset()
            self.log.clear()
            self._hold_ns = self._announced_ns = None
        self._announce()
        self._publish()
        response.success, response.message = True, 'window cleared, nominal object restored'
        return response

    def _on_save(self, request, response):
        """Write the object in use (URDF, its meshes) and its parameters to ``save_directory``."""
        result = self._in_use()
        name = self.spec.name
        try:
            urdf, meshes = learned_urdf(result.fit.model, result.fit.contact,
                                        self.spec.model.urdf, f'{name}_identified')
            urdf, params = write_identified(self.config.save_directory, name, urdf,
                                            {'object': name, **result.to_dict()}, meshes)
        except (OSError, ValueError) as error:
            response.success, response.message = False, f'save failed: {error}'
            return response
        response.success, response.message = True, f'wrote {urdf} and {params}'
        return response

    def destroy_node(self) -> None:
        """Stop the worker, then destroy the node."""
        self._stop.set()
        self._wake.set()
        self.engine.close()
        self._worker.join(timeout=30.0)
        super().destroy_node()


def main(args=None) -> None:
    """Run the node (``ros2 run diffsim_ros object_identifier``)."""
    run_node(ObjectIdentifier, args)


if __name__ == '__main__':
    main()
