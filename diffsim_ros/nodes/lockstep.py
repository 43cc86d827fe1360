"""
Lockstep protocol: in simulation the plant waits for the work due at a simulated time.

A ``sim_driver`` in ``clock_mode: lockstep`` owns the simulated clock: it publishes ``/clock``
and the nodes run with ``use_sim_time``.  Where a node's work takes wall time while that
clock runs on, a busy machine changes the simulated outcome: a refit lands later in
simulated time, a model reaches the controller ticks after it was published.  Two waits
remove that dependence on the machine's speed:

* **Commands** (:class:`CommandWaiter`): after each tick the driver waits for the
  controller's command answering it, once a controller has sent one (or from the first
  tick, when one already publishes on the command topic) and while the command topic has
  a publisher; a safety timeout logs an error and stops the waits until the next command.
* **Peers** (this module): a node whose work is due at simulated times announces itself on
  ``/lockstep`` (``std_msgs/String``, reliable, transient local, the newest message of each
  sender kept), one JSON object per change of its state::

      {"node": "/identifier", "until": 2500000000,
       "published": {"/identifier/robot_description": "9f3c0b1d2e4a5f60"}, "used": {}}
      {"node": "/mpc", "until": null, "published": {},
       "used": {"/identifier/robot_description": "9f3c0b1d2e4a5f60"}}

  ``node``: the sender's fully qualified name; ``until``: simulated time, integer
  nanoseconds, up to which the sender lets the plant advance (``null``: no hold);
  ``published`` / ``used``: per topic, the :func:`message_id` of the last message the sender
  published there / took from there (applied or refused; ``null``: none yet).  A new
  message replaces the sender's previous state.

The driver (:class:`PeerWaiter`) publishes no tick stamped later than a peer's ``until``,
nor any tick while a peer that uses a topic has not taken the message another peer last
published there (:func:`holding`).  The identifier holds at its next refit's due time (its
refit timer on the simulated clock) and, once that refit has finished (accepted, refused,
failed or skipped), moves the hold to the next one; it announces each model it publishes.
The mpc announces each model message it has taken.  So no tick passes a due refit until the
refit has finished and, if it produced a model, the mpc has it.

No deadlock on a peer that is not there: the driver waits only for peers that announced
themselves, forgets one whose ``/lockstep`` publisher has been absent from the ROS graph for
:data:`GRAPH_GRACE_S` (a node that left or died), and after ``peer_timeout`` wall seconds
of one hold logs an error and ignores the peers that hold until they announce a new state.

Only nodes with ``use_sim_time`` take part (:class:`LockstepPeer` creates nothing
otherwise): the real robot's path, on the wall clock, is untouched.
"""

from dataclasses import dataclass, field, replace
import hashlib
import json
import threading
import time
from types import MappingProxyType
from typing import Any, Callable, Dict, Mapping, Optional

from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.serialization import serialize_message
from std_msgs.msg import String

from .convert import MessageError

__all__ = ['CommandWaiter', 'GRAPH_GRACE_S', 'LockstepPeer', 'PeerState', 'PeerWaiter', 'TOPIC',
           'await_matched', 'holding', 'lockstep_ticks', 'message_id', 'parse_announcement']

#: The protocol's topic.
TOPIC = '/lockstep'
#: Announcements: reliable, the newest per sender kept for late joiners.
ANNOUNCE_QOS = QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL,
                          reliability=ReliabilityPolicy.RELIABLE)
#: The driver's reader keeps many, so that no sender's newest state is overwritten.
LISTEN_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=100,
                        durability=DurabilityPolicy.TRANSIENT_LOCAL,
                        reliability=ReliabilityPolicy.RELIABLE)
#: Wall seconds a held-for peer may be missing from the ROS graph before it is forgotten
#: (graph updates lag behind the messages that announce a node).
GRAPH_GRACE_S = 2.0
#: Wall seconds between liveness checks while the driver waits.
POLL_S = 0.05
#: Wall seconds between the log lines that say what a long hold is waiting for.
REPORT_S = 30.0
#: Longest announcement accepted, characters (a handful of topics).
MAX_ANNOUNCEMENT = 4096
_KEEP = object()   # LockstepPeer._announce: leave 'until' as it is


def message_id(msg) -> str:
    """
    Return a short identifier of a message's content, the same on both ends of a topic.

    :param msg: any ROS message.
    :return: 16 hex digits of the BLAKE2b hash of its CDR serialisation.
    """
    return hashlib.blake2b(serialize_message(msg), digest_size=8).hexdigest()


@dataclass(frozen=True)
class PeerState:
    """
    A peer's announced state (see the module docstring).

    :param node: fully qualified node name.
    :param until: simulated time up to which the plant may advance, ns; None = no hold.
    :param published: topic -> id of the last message published there (None: none yet).
    :param used: topic -> id of the last message taken from there (None: none yet).
    """

    node: str
    until: Optional[int] = None
    published: Mapping[str, Optional[str]] = field(default_factory=lambda: MappingProxyType({}))
    used: Mapping[str, Optional[str]] = field(default_factory=lambda: MappingProxyType({}))

    def to_json(self) -> str:
        """
        Return the announcement text.

        :return: JSON of the four fields.
        """
        return json.dumps({'node': self.node, 'until': self.until,
                           'published': dict(self.published), 'used': dict(self.used)})


def _topic_ids(value, key: str) -> Mapping[str, Optional[str]]:
    """Check a ``published``/``used`` field: topic name -> id string or None."""
    if not isinstance(value, dict) or not all(
            isinstance(topic, str) and topic.startswith('/') and
            (ident is None or isinstance(ident, str) and len(ident) <= 64)
            for topic, ident in value.items()):
        raise MessageError(f"'{key}' must map topic names to message ids or null")
    return MappingProxyType(dict(value))


def parse_announcement(text: str) -> PeerState:
    """
    Parse and check one ``/lockstep`` message.

    :param text: the message's JSON text.
    :return: the peer's state.
    :raises MessageError: not a valid announcement (too long, not JSON, a field missing or
        of the wrong type, a negative or non-integer ``until``).
    """
    if len(text) > MAX_ANNOUNCEMENT:
        raise MessageError(f'announcement of {len(text)} characters (at most '
                           f'{MAX_ANNOUNCEMENT})')
    try:
        data = json.loads(text)
    except ValueError as error:
        raise MessageError(f'not JSON: {error}') from None
    if not isinstance(data, dict) or set(data) != {'node', 'until', 'published', 'used'}:
        raise MessageError("an announcement is an object with 'node', 'until', 'published' "
                           "and 'used'")
    node, until = data['node'], data['until']
    if not isinstance(node, str) or not node.startswith('/') or len(node) > 256:
        raise MessageError(f"'node' must be a fully qualified node name, got {node!r}")
    if until is not None and (isinstance(until, bool) or not isinstance(until, int) or
                              until < 0):
        raise MessageError(f"'until' must be null or integer nanoseconds >= 0, got {until!r}")
    return PeerState(node, until, _topic_ids(data['published'], 'published'),
                     _topic_ids(data['used'], 'used'))


def holding(peers: Mapping[str, PeerState], next_ns: int) -> Dict[str, str]:
    """
    Return the peers that hold the tick stamped ``next_ns``, and why.

    :param peers: node name -> its newest state.
    :param next_ns: simulated time of the tick about to be published, ns.
    :return: node name -> reason, empty when the tick may go.
    """
    reasons = {}
    for name, peer in peers.items():
        if peer.until is not None and peer.until < next_ns:
            reasons[name] = f'work due at {peer.until * 1e-9:.3f} s'
    for user in peers.values():
        for topic, taken in user.used.items():
            for source in peers.values():
                latest = source.published.get(topic)
                if source is not user and latest is not None and latest != taken:
                    reasons[user.node] = f'has not taken the message of {source.node} on {topic}'
    return reasons


class LockstepPeer:
    """
    A node's side of the protocol: announce holds and the messages published or taken.

    Inert (no publisher, no announcements; :meth:`publish` just publishes) unless the node
    runs with ``use_sim_time``.

    :param node: the node taking part.
    """

    def __init__(self, node) -> None:
        """Create the announcement publisher when the node runs on simulated time."""
        self._node = node
        self.active = bool(node.get_parameter('use_sim_time').value)
        self._lock = threading.Lock()
        self._state = PeerState(node.get_fully_qualified_name())
        self._publisher = node.create_publisher(String, TOPIC, ANNOUNCE_QOS) \
            if self.active else None

    @property
    def state(self) -> PeerState:
        """Return the state last announced."""
        return self._state

    def _announce(self, until=_KEEP, published: Optional[Mapping] = None,
                  used: Optional[Mapping] = None) -> None:
        """Merge changes into the state and publish it (one writer at a time)."""
        with self._lock:
            state = self._state
            self._state = state = replace(
                state, until=state.until if until is _KEEP else until,
                published=MappingProxyType({**state.published, **(published or {})}),
                used=MappingProxyType({**state.used, **(used or {})}))
            self._publisher.publish(String(data=state.to_json()))

    def hold_until_next_call(self, timer) -> None:
        """
        Let the plant advance up to the timer's next call on the node's (simulated) clock.

        :param timer: an ``rclpy`` timer of this node (e.g. the refit timer).
        """
        if not self.active:
            return
        remaining = timer.time_until_next_call()
        until = None if remaining is None else \
            self._node.get_clock().now().nanoseconds + max(int(remaining), 0)
        self._announce(until=until)

    def hold(self, until_ns: Optional[int]) -> None:
        """
        Let the plant advance up to ``until_ns`` of simulated time (None: no hold).

        :param until_ns: simulated time, integer ns, or None.
        """
        if self.active:
            self._announce(until=until_ns)

    def publish(self, publisher, msg) -> None:
        """
        Publish ``msg`` and, when active, announce it as the newest on that topic.

        :param publisher: the node's publisher.
        :param msg: the message.
        """
        publisher.publish(msg)
        if self.active:
            self._announce(published={publisher.topic_name: message_id(msg)})

    def uses(self, topic: str) -> Callable[[Any], None]:
        """
        Declare a topic this node takes messages from; return the function announcing one.

        For a node that decides about a message later than its callback (the mpc's model
        gate judges on its own thread): call the returned function once it is decided.

        :param topic: the subscription's topic (resolved like the node resolves it).
        :return: ``taken(msg)``, announcing ``msg`` as taken (a no-op when inactive).
        """
        if not self.active:
            return lambda msg: None
        name = self._node.resolve_topic_name(topic)
        self._announce(used={name: None})
        return lambda msg: self._announce(used={name: message_id(msg)})

    def taking(self, topic: str, callback: Callable) -> Callable:
        """
        Wrap a subscription callback so that each message it handled is announced as taken.

        :param topic: the subscription's topic (resolved like the node resolves it).
        :param callback: the callback, taking the message.
        :return: the callback to subscribe (``callback`` itself when inactive).
        """
        if not self.active:
            return callback
        taken = self.uses(topic)

        def handled(msg) -> None:
            try:
                callback(msg)
            finally:   # applied or refused, the driver may go on
                taken(msg)
        return handled


class PeerWaiter:
    """
    The driver's side: peers' states, and the wait before a tick (module docstring).

    :param node: the driver node (subscribes ``/lockstep``).
    :param timeout: wall seconds one hold may last before an error; 0 = no peers waited for.
    :param warn: throttled warning ``warn(key, message)`` for refused announcements.
    """

    def __init__(self, node, timeout: float, warn: Callable[[str, str], object]) -> None:
        """Subscribe to the announcements."""
        self._node, self._timeout, self._warn = node, float(timeout), warn
        self._lock, self._changed = threading.Lock(), threading.Event()
        self.peers: Dict[str, PeerState] = {}
        self._missing_since: Dict[str, float] = {}
        self.stats = {'peer_holds': 0, 'peer_hold_s': 0.0, 'peers_lost': 0,
                      'peer_timeouts': 0}
        node.create_subscription(String, TOPIC, self._on_announcement, LISTEN_QOS)

    def _on_announcement(self, msg: String) -> None:
        try:
            state = parse_announcement(msg.data)
        except MessageError as error:
            self._warn('lockstep', f'dropped announcement: {error}')
            return
        with self._lock:
            self.peers[state.node] = state
            self._missing_since.pop(state.node, None)
        self._changed.set()

    def _forget_missing(self, names, now: float) -> None:
        """Forget the held-for peers whose announcer left the ROS graph (lock held)."""
        present = {f'{info.node_namespace.rstrip("/")}/{info.node_name}'
                   for info in self._node.get_publishers_info_by_topic(TOPIC)}
        for name in names:
            if name in present:
                self._missing_since.pop(name, None)
            elif now - self._missing_since.setdefault(name, now) > GRAPH_GRACE_S:
                self.peers.pop(name, None)
                self._missing_since.pop(name, None)
                self.stats['peers_lost'] += 1
                self._node.get_logger().warning(
                    f'lockstep: {name} left the ROS graph; no longer waiting for it')

    def wait(self, next_ns: int, stop: threading.Event) -> float:
        """
        Block until no peer holds the tick stamped ``next_ns`` (or ``stop`` is set).

        :param next_ns: simulated time of the next tick, ns.
        :param stop: ends the wait early (node shutting down).
        :return: wall seconds waited.
        """
        if self._timeout <= 0:
            return 0.0
        started, held = time.monotonic(), False
        report = started + REPORT_S
        while not stop.is_set():
            with self._lock:
                self._changed.clear()
                reasons = holding(self.peers, next_ns)
                if not reasons:
                    break
                held, now = True, time.monotonic()
                self._forget_missing(list(reasons), now)
                if now > report:   # a busy machine: say why simulated time stands still
                    report += REPORT_S
                    self._node.get_logger().info(
                        f'lockstep: holding at {next_ns * 1e-9:.3f} s for {now - started:.0f} s: '
                        + '; '.join(f'{name} {why}' for name, why in reasons.items()))
                if now - started > self._timeout:
                    for name, reason in holding(self.peers, next_ns).items():
                        self.peers.pop(name, None)
                        self.stats['peer_timeouts'] += 1
                        self._node.get_logger().error(
                            f'lockstep: {name} held the plant at {next_ns * 1e-9:.3f} s for '
                            f'{now - started:.0f} s ({reason}); ignoring it until it '
                            'announces again')
            self._changed.wait(POLL_S)
        waited = time.monotonic() - started
        if held:
            self.stats['peer_holds'] += 1
            self.stats['peer_hold_s'] += waited
        return waited


class CommandWaiter:
    """
    The driver's wait for the controller's command answering each tick (module docstring).

    :param node: the driver node.
    :param topic: the resolved command topic.
    :param timeout: safety timeout of one wait, wall s; 0 = never wait.
    """

    def __init__(self, node, topic: str, timeout: float) -> None:
        """Start unarmed: nobody has commanded yet."""
        self._node, self._topic, self._timeout = node, topic, float(timeout)
        self._answer = threading.Event()
        #: True while a controller is waited for (set by a command, cleared by a timeout or
        #: the controller's leaving).
        self.armed = False
        self.stats = {'command_waits_timed_out': 0, 'controller_lost': 0}

    def arm_if_listening(self) -> None:
        """Wait from now on if a controller already publishes on the command topic."""
        self.armed = self._node.count_publishers(self._topic) > 0

    def expect(self) -> None:
        """Call before publishing a tick: only a command after it answers the tick."""
        self._answer.clear()

    def answered(self) -> None:
        """Call on each valid command: it answers the tick and (re-)arms the waits."""
        self.armed = True
        self._answer.set()

    def wait(self, t: float, stop: threading.Event) -> None:
        """
        Wait for the command answering the tick at ``t`` (returns at once when unarmed).

        :param t: simulated time of the tick, s (for the log).
        :param stop: ends the wait early (node shutting down).
        """
        if self._timeout <= 0 or not self.armed:
            return
        started, missing = time.monotonic(), None
        while not self._answer.wait(POLL_S):
            now = time.monotonic()
            if stop.is_set():
                return
            if self._node.count_publishers(self._topic) > 0:
                missing = None
            elif missing is None:
                missing = now
            elif now - missing > GRAPH_GRACE_S:
                self.armed = False
                self.stats['controller_lost'] += 1
                self._node.get_logger().warning(
                    f'no publisher on {self._topic} any more: stepping on without waiting '
                    'for commands until one arrives')
                return
            if now - started > self._timeout:
                self.armed = False
                self.stats['command_waits_timed_out'] += 1
                self._node.get_logger().error(
                    f'no command within {self._timeout:g} s (wall) of the tick at {t:.3f} s '
                    f'although {self._topic} has a publisher: stepping on without waiting '
                    'for commands until the next one arrives (does the controller command '
                    'at the driver rate?)')
                return


def await_matched(node, publishers, timeout: float, stop: threading.Event) -> bool:
    """
    Wait until each publisher has matched every reader the ROS graph knows on its topic.

    :param node: the publishers' node.
    :param publishers: ``rclpy`` publishers.
    :param timeout: wall seconds at most.
    :param stop: ends the wait early.
    :return: True when all were matched in time.
    """
    deadline = time.monotonic() + timeout
    while not stop.is_set():
        if all(publisher.get_subscription_count() >= node.count_subscribers(
                publisher.topic_name) for publisher in publishers):
            return True
        if time.monotonic() > deadline:
            return False
        stop.wait(POLL_S)
    return False


def lockstep_ticks(node, peers: PeerWaiter, stop: threading.Event, factor: float,
                   next_ns: Callable[[], int]):
    """
    Yield each time a lockstep simulator may publish its next tick: the driver's loop.

    Before each tick the peers' holds are waited for (:meth:`PeerWaiter.wait`); after it the
    loop is paced at ``factor`` times real time (0: as fast as possible, yielding the
    interpreter lock between ticks).  Time spent holding is not made up afterwards.

    :param node: the simulator's node (the loop ends when its context does).
    :param peers: the peers' states.
    :param stop: ends the loop.
    :param factor: real-time factor; 0 = unpaced.
    :param next_ns: returns the simulated time of the next tick, ns.
    :return: a generator; the caller publishes one tick per item.
    """
    origin = time.monotonic()
    while not stop.is_set() and node.context.ok():
        due = next_ns()
        origin += peers.wait(due, stop)
        if stop.is_set():
            return
        yield due
        if factor > 0:
            ahead = due * 1e-9 / factor - (time.monotonic() - origin)
            if ahead > 0:
                stop.wait(ahead)
        else:
            time.sleep(0)   # let the executor threads take the GIL
