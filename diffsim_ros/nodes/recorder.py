"""
Record live topics into a rosbag2 file through ``rosbags``, like ``ros2 bag record``.

``ros2 bag`` (rosbag2_py) is not installable without a ROS distribution, so the demo and the
tests record with this node instead.  It discovers topics once per ``discovery_period``,
subscribes to each with ``raw=True`` and writes the CDR bytes as they arrive, so nothing is
decoded or re-encoded; the bag is the same a real ``ros2 bag record`` would write.  Like
rosbag2 it adapts the subscription's QoS to the publishers it finds: reliable only when
every publisher is reliable, transient-local when every publisher is (latched topics such as
``robot_description`` are then recorded too).

Topics whose type is known in advance (``types``) are subscribed at once, best-effort and
volatile (which matches every publisher), so a recording started before its publishers
loses nothing of their first messages to discovery.

Log times are DDS receive times (when the middleware took the message, not when this node's
executor got to it: on a busy machine that was up to 90 ms later, and a header-less command
moved that much against the states), or the node's clock with ``use_sim_time``, so that the
bag then carries simulated time.  Under
simulated time with a ``timeline_topic`` (the plant's joint states) they follow publication
instead of arrival: a message of that topic is logged at its header stamp, any other at the
stamp of the last one published before it (DDS source times, one host's clock), so that a
header-less command answering state ``k`` is logged at state ``k``'s stamp
(:class:`~diffsim_ros.nodes.convert.PublicationTimeline`).  Logged at arrival on the
simulated clock, the demo's commands fell a tick early or late with the executor's order:
the same plant run, recorded twice, gave two different 1 s prediction errors.
"""

import importlib
import threading
from typing import Dict, Mapping, Optional, Sequence

from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.serialization import deserialize_message

from .convert import PublicationTimeline, receive_ns, stamp_to_ns
from ..io.bags import BagWriter

__all__ = ['Recorder', 'message_class']


def message_class(type_name: str):
    """
    Import the Python class of a ROS message type.

    :param type_name: ``'pkg/msg/Type'``.
    :return: the message class.
    :raises ValueError: a malformed name or a package that is not installed.
    """
    parts = type_name.split('/')
    if len(parts) != 3 or parts[1] != 'msg':
        raise ValueError(f'not a message type name: {type_name!r}')
    try:
        return getattr(importlib.import_module(f'{parts[0]}.msg'), parts[2])
    except (ImportError, AttributeError) as error:
        raise ValueError(f'message type {type_name!r} is not installed: {error}') from None


class Recorder(Node):
    """
    Subscribe to topics and write every message into a rosbag2 file.

    :param path: bag directory or ``.mcap`` / ``.db3`` file to create.
    :param topics: topics to record; ``None`` = every topic discovered (except ``/rosout``
        and ``/parameter_events``).
    :param types: ``{topic: 'pkg/msg/Type'}`` subscribed immediately (see the module
        docstring); they are recorded even when ``topics`` does not list them.
    :param exclude: topics never recorded (e.g. ``/clock``: ``ros2 bag play --clock``
        publishes its own).
    :param discovery_period: seconds between topic discoveries.
    :param timeline_topic: under ``use_sim_time``, the stamped topic whose publication order
        times the others (module docstring); ``None``: log times are arrival times.
    :param node_name: ROS node name.
    :param kwargs: passed to ``rclpy.node.Node`` (e.g. ``context``, ``parameter_overrides``).
    """

    IGNORED = ('/rosout', '/parameter_events')

    def __init__(self, path, topics: Optional[Sequence[str]] = None,
                 types: Optional[Mapping[str, str]] = None, exclude: Sequence[str] = (),
                 discovery_period: float = 0.5, timeline_topic: Optional[str] = None,
                 node_name: str = 'recorder', **kwargs) -> None:
        """Open the bag and start discovering topics."""
        super().__init__(node_name, **kwargs)
        self._lock = threading.Lock()
        simulated = bool(self.get_parameter('use_sim_time').value)
        self._timeline_topic = timeline_topic if simulated else None
        self._timeline = PublicationTimeline()
        self._writer = BagWriter(path, overwrite=True)
        self._wanted = None if topics is None else frozenset(topics)
        self._excluded = frozenset(self.IGNORED) | frozenset(exclude)
        self._recorded: Dict[str, object] = {}
        self.counts: Dict[str, int] = {}
        early = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1000,
                           reliability=ReliabilityPolicy.BEST_EFFORT,
                           durability=DurabilityPolicy.VOLATILE)
        for topic, type_name in (types or {}).items():
            self._subscribe(topic, type_name, early)
        self._timer = self.create_timer(discovery_period, self.discover)
        self.discover()

    @property
    def path(self):
        """Return the bag's path."""
        return self._writer.path

    def _qos(self, topic: str) -> QoSProfile:
        publishers = self.get_publishers_info_by_topic(topic)
        reliable = bool(publishers) and all(
            p.qos_profile.reliability == ReliabilityPolicy.RELIABLE for p in publishers)
        latched = bool(publishers) and all(
            p.qos_profile.durability == DurabilityPolicy.TRANSIENT_LOCAL for p in publishers)
        return QoSProfile(
            history=HistoryPolicy.KEEP_LAST, depth=1000,
            reliability=ReliabilityPolicy.RELIABLE if reliable else ReliabilityPolicy.BEST_EFFORT,
            durability=(DurabilityPolicy.TRANSIENT_LOCAL if latched
                        else DurabilityPolicy.VOLATILE))

    def discover(self) -> None:
        """Subscribe to topics that appeared since the last discovery."""
        for topic, types in self.get_topic_names_and_types():
            if topic in self._recorded or topic in self._excluded:
                continue
            if self._wanted is not None and topic not in self._wanted:
                continue
            if not self.get_publishers_info_by_topic(topic):
                continue
            if len(types) != 1:
                self.get_logger().warning(f'not recording {topic}: it has several types {types}')
                self._recorded[topic] = None
                continue
            self._subscribe(topic, types[0], self._qos(topic))

    def _subscribe(self, topic: str, type_name: str, qos: QoSProfile) -> None:
        try:
            cls = message_class(type_name)
        except ValueError as error:
            self.get_logger().warning(f'not recording {topic}: {error}')
            self._recorded[topic] = None
            return
        self.counts[topic] = 0
        self._recorded[topic] = self.create_subscription(
            cls, topic, self._callback(topic, type_name, cls), qos, raw=True)

    def _callback(self, topic: str, type_name: str, cls):
        def write(data: bytes, info) -> None:
            now = receive_ns(info, self.get_clock())   # not when the executor got to it
            with self._lock:
                if self._writer is None:
                    return
                self.counts[topic] += 1
                source = int(info.get('source_timestamp', 0)) if self._timeline_topic else 0
                if not source:
                    self._writer.raw(topic, type_name, data, now)
                elif topic == self._timeline_topic:
                    stamp = stamp_to_ns(deserialize_message(data, cls).header)
                    self._writer.raw(topic, type_name, data, stamp)
                    self._write_timed(self._timeline.state(stamp, source), now)
                else:
                    self._write_timed(self._timeline.command((topic, type_name, data), source),
                                      now)
        return write

    def _write_timed(self, timed, now: int) -> None:
        """Write ``[(log time ns or None, (topic, type, data))]`` (None: ``now``)."""
        for stamp, (topic, type_name, data) in timed:
            self._writer.raw(topic, type_name, data, now if stamp is None else int(stamp))

    def close(self) -> None:
        """Stop recording and finish the bag (idempotent)."""
        with self._lock:
            if self._writer is not None:
                self._write_timed(self._timeline.drain(), self.get_clock().now().nanoseconds)
                self._writer.close()
                self._writer = None

    def destroy_node(self) -> None:
        """Close the bag, then destroy the node."""
        self.close()
        super().destroy_node()
