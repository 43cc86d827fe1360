"""
Conversions between ROS messages and numpy arrays, with validation at the boundary.

Every incoming message is checked here once (finite values, consistent lengths, joints mapped
by name), so the nodes can hand plain arrays to the library.  A rejected message raises
:class:`MessageError` with one clear reason; nodes log it through :class:`ThrottledLogger`
and drop the message.
"""

from bisect import bisect_left
from collections import deque
import math
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from builtin_interfaces.msg import Time
from geometry_msgs.msg import PoseStamped
import numpy as np
from rclpy.qos import HistoryPolicy, QoSProfile
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray

__all__ = ['COMMANDS_QOS', 'CommandTimeline', 'CommandTimes', 'MessageError',
           'PublicationTimeline', 'ThrottledLogger', 'commands_array', 'commands_msg',
           'joint_state_arrays', 'joint_state_msg', 'pose_matrix', 'pose_msg', 'receive_ns',
           'sec_to_stamp', 'stamp_to_ns', 'stamp_to_sec']


class MessageError(ValueError):
    """An incoming message that cannot be used; the message text gives the one reason."""


def stamp_to_sec(stamp) -> float:
    """
    Convert a ``builtin_interfaces/Time`` (or a header holding one) to seconds.

    :param stamp: a ``Time`` message, a ``std_msgs/Header`` or an ``rclpy.time.Time``.
    :return: seconds as a float.
    """
    stamp = getattr(stamp, 'stamp', stamp)
    if hasattr(stamp, 'nanoseconds'):
        return stamp.nanoseconds * 1e-9
    # one rounding, the same as the input gate's (nodes/gates.py): a stamp converted here and
    # there is the same float
    return stamp_to_ns(stamp) * 1e-9


def stamp_to_ns(stamp) -> int:
    """
    Convert a ``builtin_interfaces/Time`` (or a header holding one) to integer nanoseconds.

    Exact, unlike :func:`stamp_to_sec`: float epoch seconds resolve only ~0.2 us, so two
    stamps exactly 1 ms apart can differ by less than 1e-3 s as floats.

    :param stamp: a ``Time`` message or a ``std_msgs/Header``.
    :return: ``sec * 10**9 + nanosec``.
    """
    stamp = getattr(stamp, 'stamp', stamp)
    return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec)


def sec_to_stamp(seconds: float) -> Time:
    """
    Convert seconds to a ``builtin_interfaces/Time`` message.

    :param seconds: non-negative time in seconds.
    :return: the ``Time`` message (nanoseconds rounded to the nearest integer).
    :raises MessageError: negative or non-finite time.
    """
    if not math.isfinite(seconds) or seconds < 0.0:
        raise MessageError(f'cannot stamp time {seconds!r} s (must be finite and >= 0)')
    total = int(round(seconds * 1e9))
    return Time(sec=total // 1_000_000_000, nanosec=total % 1_000_000_000)


def _as_stamp(stamp) -> Time:
    """Return a ``Time`` message from ``None`` (zero), seconds, rclpy Time or a ``Time``."""
    if stamp is None:
        return Time()
    if isinstance(stamp, Time):
        return stamp
    if hasattr(stamp, 'to_msg'):
        return stamp.to_msg()
    return sec_to_stamp(float(stamp))


def joint_state_arrays(msg: JointState, joint_names: Sequence[str],
                       require_velocity: bool = True
                       ) -> Tuple[float, np.ndarray, Optional[np.ndarray], Optional[np.ndarray]]:
    """
    Extract positions, velocities and efforts of the given joints from a ``JointState``.

    Joints are mapped by name; extra joints in the message (grippers, other robots) are
    ignored.  Positions and velocities must be finite.  Efforts are optional information:
    an empty ``effort`` field, or a non-finite effort of a requested joint (drivers report
    NaN for passive joints), gives ``None``.

    :param msg: the incoming message.
    :param joint_names: joints to extract, in the order of the returned arrays.
    :param require_velocity: when False, an empty ``velocity`` field is accepted and the
        returned velocity is ``None`` (the caller differentiates positions).
    :return: ``(t, q, qd, effort)``: header stamp in s, and ``(n,)`` float64 arrays in
        ``joint_names`` order (rad or m, rad/s or m/s, N m or N).
    :raises MessageError: duplicate names, a requested joint missing, field lengths that
        differ from ``name``, or non-finite positions/velocities.
    """
    names = list(msg.name)
    if len(set(names)) != len(names):
        dupes = sorted({name for name in names if names.count(name) > 1})
        raise MessageError(f'duplicate joint names {dupes}')
    missing = [name for name in joint_names if name not in names]
    if missing:
        raise MessageError(f'joints {missing} missing (message has {names})')
    if len(msg.position) != len(names):
        raise MessageError(f'{len(msg.position)} positions for {len(names)} names')
    if len(msg.velocity) not in (0, len(names)) or (require_velocity and not msg.velocity):
        raise MessageError(f'{len(msg.velocity)} velocities for {len(names)} names')
    if len(msg.effort) not in (0, len(names)):
        raise MessageError(f'{len(msg.effort)} efforts for {len(names)} names')
    index = [names.index(name) for name in joint_names]
    q = np.asarray(msg.position, dtype=np.float64)[index]
    qd = np.asarray(msg.velocity, dtype=np.float64)[index] if len(msg.velocity) else None
    if not np.all(np.isfinite(q)) or (qd is not None and not np.all(np.isfinite(qd))):
        raise MessageError('non-finite position or velocity')
    effort = np.asarray(msg.effort, dtype=np.float64)[index] if len(msg.effort) else None
    if effort is not None and not np.all(np.isfinite(effort)):
        effort = None
    t = stamp_to_sec(msg.header.stamp)
    if not math.isfinite(t):
        raise MessageError('non-finite stamp')
    return t, q, qd, effort


def joint_state_msg(names: Sequence[str], q, qd=None, effort=None, stamp=None,
                    frame_id: str = '') -> JointState:
    """
    Build a ``JointState`` message.

    :param names: joint names, one per entry of ``q``.
    :param q: positions ``(n,)`` (array, tensor or sequence).
    :param qd: velocities ``(n,)`` or None (empty field).
    :param effort: efforts ``(n,)`` or None (empty field).
    :param stamp: header stamp: ``Time`` message, rclpy ``Time``, seconds, or None (zero).
    :param frame_id: header frame id.
    :return: the message.
    :raises MessageError: lengths that differ from ``names``.
    """
    msg = JointState()
    msg.header.stamp = _as_stamp(stamp)
    msg.header.frame_id = frame_id
    msg.name = [str(name) for name in names]
    for field, values in (('position', q), ('velocity', qd), ('effort', effort)):
        if values is None:
            continue
        values = [float(v) for v in np.asarray(values, dtype=np.float64).reshape(-1)]
        if len(values) != len(msg.name):
            raise MessageError(f'{len(values)} {field} values for {len(msg.name)} names')
        setattr(msg, field, values)
    return msg


def commands_msg(values) -> Float64MultiArray:
    """
    Build the ``Float64MultiArray`` a forward command controller accepts.

    :param values: command vector ``(m,)`` in the controller's joint order.
    :return: the message with ``data`` set (layout left empty, as ros2_control expects).
    :raises MessageError: non-finite values.
    """
    data = np.asarray(values, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(data)):
        raise MessageError(f'non-finite command {data.tolist()}')
    return Float64MultiArray(data=[float(v) for v in data])


def commands_array(msg: Float64MultiArray, length: int) -> np.ndarray:
    """
    Read a command vector from a ``Float64MultiArray``.

    :param msg: the incoming message.
    :param length: expected number of entries (the controller's joint count).
    :return: ``(length,)`` float64 array.
    :raises MessageError: wrong length or non-finite values.
    """
    data = np.asarray(msg.data, dtype=np.float64).reshape(-1)
    if data.shape[0] != length:
        raise MessageError(f'command has {data.shape[0]} values, expected {length}')
    if not np.all(np.isfinite(data)):
        raise MessageError('non-finite command')
    return data


def pose_matrix(msg: PoseStamped) -> np.ndarray:
    """
    Convert a pose to a homogeneous transform ``T_frame_body``.

    :param msg: a ``PoseStamped`` (or a bare ``Pose``); the quaternion is normalised.
    :return: ``(4, 4)`` float64 transform mapping body coordinates to ``header.frame_id``.
    :raises MessageError: non-finite values or a quaternion of (near) zero norm.
    """
    pose = getattr(msg, 'pose', msg)
    p, o = pose.position, pose.orientation
    values = np.array([p.x, p.y, p.z, o.w, o.x, o.y, o.z], dtype=np.float64)
    if not np.all(np.isfinite(values)):
        raise MessageError('non-finite pose')
    norm = np.linalg.norm(values[3:])
    if norm < 1e-6:
        raise MessageError('zero quaternion')
    w, x, y, z = values[3:] / norm
    T = np.eye(4)
    T[:3, :3] = [[1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
                 [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
                 [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)]]
    T[:3, 3] = values[:3]
    return T


def pose_msg(T, frame_id: str, stamp=None) -> PoseStamped:
    """
    Convert a homogeneous transform to a ``PoseStamped``.

    :param T: ``(4, 4)`` transform ``T_frame_body`` (array or tensor).
    :param frame_id: the header frame (the frame ``T`` maps into).
    :param stamp: header stamp: ``Time`` message, rclpy ``Time``, seconds, or None (zero).
    :return: the message, quaternion with ``w >= 0``.
    """
    T = np.asarray(T, dtype=np.float64).reshape(4, 4)
    R = T[:3, :3]
    # Shepperd's method: pivot on the largest of w, x, y, z for accuracy.
    trace = np.trace(R)
    pivots = [trace, R[0, 0], R[1, 1], R[2, 2]]
    k = int(np.argmax(pivots))
    if k == 0:
        s = 2.0 * math.sqrt(max(1.0 + trace, 1e-300))
        quat = (0.25 * s, (R[2, 1] - R[1, 2]) / s, (R[0, 2] - R[2, 0]) / s,
                (R[1, 0] - R[0, 1]) / s)
    else:
        i, j, m = k - 1, k % 3, (k + 1) % 3
        s = 2.0 * math.sqrt(max(1.0 + R[i, i] - R[j, j] - R[m, m], 1e-300))
        xyz = [0.0, 0.0, 0.0]
        xyz[i] = 0.25 * s
        xyz[j] = (R[j, i] + R[i, j]) / s
        xyz[m] = (R[m, i] + R[i, m]) / s
        quat = ((R[m, j] - R[j, m]) / s, *xyz)
    w, x, y, z = quat if quat[0] >= 0.0 else tuple(-v for v in quat)
    msg = PoseStamped()
    msg.header.stamp = _as_stamp(stamp)
    msg.header.frame_id = frame_id
    msg.pose.position.x, msg.pose.position.y, msg.pose.position.z = (float(v) for v in T[:3, 3])
    orientation = msg.pose.orientation
    orientation.w, orientation.x, orientation.y, orientation.z = (float(w), float(x), float(y),
                                                                  float(z))
    return msg


#: Subscription QoS of a node that keeps the commands sent to the robot (monitor, identifier):
#: reliable, and deep enough that a busy executor loses none (with a depth of 10 the monitor
#: lost 7-17 of 90 commands of a 100 Hz stream on a loaded machine, and held the command
#: before each gap in their place).
COMMANDS_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=500)


def receive_ns(info, clock) -> int:
    """
    Return when a message reached this process, ns.

    The DDS receive time, taken by the middleware as the message came in, when rclpy passed
    the message info (two-argument callbacks) and the clock is not simulated; otherwise the
    clock's now.  The executor may run a callback long after the message arrived (a busy
    machine, a slow callback before it), so its own clock is the arrival only where nothing
    better exists.

    :param info: the message info rclpy passes to a two-argument callback, or None.
    :param clock: the node's clock (``Node.get_clock()``).
    :return: nanoseconds, on the node's clock.
    """
    received = int(info.get('received_timestamp', 0)) if info else 0
    if received > 0 and not clock.ros_time_is_active:
        return received
    return clock.now().nanoseconds


class CommandTimeline:
    """
    Time unstamped commands on the timeline of the stamped states they answer.

    A ``Float64MultiArray`` command carries no stamp.  Timed by its arrival, it drifts
    against the states whenever the states reach the node later than their stamps (a driver
    or a network lagging under load): a controller answers state ``k`` (stamp ``t_k``) with
    a command that arrives just after it, and a lag of 0.1-0.3 s then shifted every command
    by that much against the states it answered.  Here a command is timed as the stamp of
    the newest state that had arrived when it arrived, plus the time between the two
    arrivals, so lags common to both streams cancel; when the states stop, the commands'
    times keep advancing with their arrival.  Times never go back, and on wall time a
    command taken before any state has no time (nothing to hold it on).

    The states are looked up by arrival, not taken as the newest one the node has handled:
    a node's executor takes the two topics in its own order, and on a busy machine it
    handled states up to 90 ms newer than a command before the command, which put the
    command that much late (the monitor's prediction NMSE of an exact model read 0.6 where
    it reads 1e-5 on a quiet machine).  ``history`` states are kept for this look-up.
    """

    def __init__(self, history: int = 1024, shared_clock: bool = False) -> None:
        """
        Start with no state seen.

        :param history: how many of the newest states (stamp, arrival) are kept.
        :param shared_clock: the arrivals are on the clock of the states' stamps (simulated
            time); only then is a command taken before any state timed by its arrival.
        """
        self._states: deque = deque(maxlen=history)
        self._shared_clock = shared_clock
        self._last = -math.inf

    def reset(self) -> None:
        """Forget the states and the last time (time started over)."""
        self._states.clear()
        self._last = -math.inf

    def state(self, stamp: float, arrival: float) -> None:
        """
        Record a state, in the order the node handles them.

        :param stamp: its stamp, s.
        :param arrival: when it arrived, s (same clock as :meth:`command`'s ``arrival``).
        """
        self._states.append((stamp, arrival))

    def command(self, arrival: float) -> Optional[float]:
        """
        Return the time of a command that arrived at ``arrival`` s.

        :param arrival: arrival time, s.
        :return: the stamp of the newest state that arrived no later than the command, plus
            the time between the two arrivals (from the oldest state kept, when the command
            arrived before all of them), never earlier than the previous command's time.
            Before any state: its arrival with a ``shared_clock``, else None.  (Timed by
            its arrival on wall time, a command taken before the first state put the node's
            clock on the states' timeline; with a driver whose stamps run behind that
            clock, every later command was held at that time until the stamps caught up.)
        """
        if not self._states:
            if not self._shared_clock:
                return None
            t = arrival
        else:
            stamp, at = self._states[0]
            for kept in reversed(self._states):
                if kept[1] <= arrival:
                    stamp, at = kept
                    break
            t = stamp + (arrival - at)
        self._last = max(self._last, t)
        return self._last


class PublicationTimeline:
    """
    Time commands by the state published last before them (simulated time, one host).

    A lockstep simulated plant (:mod:`~diffsim_ros.nodes.lockstep`) publishes state ``k``, then
    ``/clock``, and publishes state ``k + 1`` only after the controller's command answering
    ``k``; it applies that command from state ``k``'s stamp on.  On the one clock of the host
    running the graph, the command's DDS source timestamp therefore lies between those of
    the two states, and this timeline gives it state ``k``'s stamp: the same whatever order
    the node's executor takes ``/clock``, the states and the commands in.  Timed by arrival
    on the simulated clock (:class:`CommandTimeline`), commands landed a tick early or late
    as the executor's order fell: the commands held onto the states of the demo's first
    refit differed between two runs at 44 % of the states, and so did the models the
    identifier accepted.  A command taken before the state published before it waits
    for that state.

    :param keep: states remembered (their source times and stamps).
    """

    def __init__(self, keep: int = 4096) -> None:
        """Start with no state and no command seen."""
        self._keep = keep
        self.reset()

    def reset(self) -> None:
        """Forget states and waiting commands (time started over)."""
        self._sources: List[int] = []   # source ns of the states, increasing
        self._stamps: List[float] = []
        self._waiting: List[Tuple[int, Any]] = []
        self._newest_command = -1
        self._last = -math.inf

    def state(self, stamp: float, source_ns: int) -> List[Tuple[float, Any]]:
        """
        Record a state; return the waiting commands it places.

        :param stamp: its stamp, s.
        :param source_ns: its DDS source timestamp, ns.
        :return: ``[(time s, command)]`` in publication order; the time is None for a
            command published before every state remembered.
        """
        if self._sources and source_ns <= self._sources[-1]:
            return []   # a duplicate or a reordered sample: the order is the publisher's
        self._sources.append(source_ns)
        self._stamps.append(stamp)
        if len(self._sources) > 2 * self._keep:
            del self._sources[:self._keep], self._stamps[:self._keep]
        placed = [c for c in self._waiting if c[0] < source_ns]
        self._waiting = [c for c in self._waiting if c[0] >= source_ns]
        return [self._place(*c) for c in placed]

    def command(self, command: Any, source_ns: int) -> List[Tuple[float, Any]]:
        """
        Record a command; return it timed, or nothing while its state has not been taken.

        :param command: the command (any object).
        :param source_ns: its DDS source timestamp, ns.
        :return: ``[(time s, command)]`` (empty while it waits; the time is None for a command
            published before every state remembered).
        """
        self._newest_command = max(self._newest_command, source_ns)
        if not self._sources or self._sources[-1] < source_ns:
            self._waiting.append((source_ns, command))
            return []
        return [self._place(source_ns, command)]

    def drain(self) -> List[Tuple[float, Any]]:
        """
        Return the waiting commands, timed at the newest state (the stream has ended).

        :return: ``[(time s, command)]`` (time None before any state).
        """
        waiting, self._waiting = self._waiting, []
        newest = self._stamps[-1] if self._stamps else None
        return [(newest, command) for _, command in waiting]

    def settled(self, stamp: float) -> bool:
        """
        Return whether every command answering the states up to ``stamp`` has been placed.

        :param stamp: s; true once a state stamped ``stamp`` or later and a command published
            after that state have been taken (publishers keep their order).
        """
        i = bisect_left(self._stamps, stamp) if self._stamps and \
            self._stamps[-1] >= stamp else None
        return i is not None and self._newest_command > self._sources[i]

    def _place(self, source_ns: int, command: Any) -> Tuple[Optional[float], Any]:
        i = bisect_left(self._sources, source_ns) - 1
        if i < 0:
            return None, command   # before the states remembered
        self._last = max(self._last, self._stamps[i])
        return self._last, command


class CommandTimes:
    """
    The one rule that times a node's commands on its states' timeline.

    On simulated time (``use_sim_time``: a simulated plant on this host), when both streams
    carry DDS source timestamps, a command is placed by publication order
    (:class:`PublicationTimeline`); otherwise by arrival (:class:`CommandTimeline`, DDS
    receive times, the node clock on simulated time).  The identifier and the monitor time
    their commands here, so the two judge a model on the same data.

    :param clock: the node's clock (``Node.get_clock()``).
    :param simulated: whether the node runs on simulated time.
    """

    def __init__(self, clock, simulated: bool) -> None:
        """Start with no state seen."""
        self._clock, self.simulated = clock, simulated
        self.arrival = CommandTimeline(shared_clock=simulated)
        self.published = PublicationTimeline()
        self._states_published = False   # the last state came with its source time

    def reset(self) -> None:
        """Forget everything (time started over)."""
        self.arrival.reset()
        self.published.reset()

    def received(self, info) -> float:
        """Return when a message with this message info arrived, s (:func:`receive_ns`)."""
        return receive_ns(info, self._clock) * 1e-9

    def _source_ns(self, info) -> int:
        return int(info.get('source_timestamp', 0)) if self.simulated and info else 0

    def state(self, stamp: float, info, arrival: Optional[float] = None
              ) -> List[Tuple[Optional[float], Any]]:
        """
        Record a state; return the waiting commands it places.

        :param stamp: the state's time on the timeline, s.
        :param info: its message info (None: timed by the clock's now).
        :param arrival: its arrival, s, when the caller has it already.
        :return: ``[(time s, command)]``; a time of None marks a command published before
            every state remembered (nothing to hold it on).
        """
        source_ns = self._source_ns(info)
        self.arrival.state(stamp, self.received(info) if arrival is None else arrival)
        self._states_published = bool(source_ns)
        return self.published.state(stamp, source_ns) if source_ns else []

    def command(self, command: Any, info) -> List[Tuple[Optional[float], Any]]:
        """
        Record a command; return it timed (or nothing while it waits for its state).

        :param command: the command (any object).
        :param info: its message info (None: timed by the clock's now).
        :return: ``[(time s, command)]``, as :meth:`state`.
        """
        source_ns = self._source_ns(info)
        if source_ns and self._states_published:   # both streams carry source times
            return self.published.command(command, source_ns)
        return [(self.arrival.command(self.received(info)), command)]


class ThrottledLogger:
    """
    Warn at most once per period per key, counting what was suppressed.

    ``warn('joint_states', reason)`` logs the first time and then once per ``period`` s,
    appending how many warnings of that key were suppressed in between; ``drops`` holds the
    total count per key (every call counts, logged or not) for diagnostics.

    :param logger: an rclpy logger (anything with ``warning(str)``).
    :param period: minimum time between two log lines of one key, s.
    :param clock: monotonic time source in seconds (wall clock by default, so throttling
        works the same under simulated time).
    :param deferred: keep the lines due for logging until :meth:`flush` (called by another
        thread): a thread that must keep deadlines (the mpc's command loop) never waits on
        the logging machinery; rclpy's first log line from a source file took 20 ms there
        (it reads the caller's source through ``inspect``).  At most 100 lines wait; more are
        counted as suppressed.
    """

    def __init__(self, logger, period: float = 2.0,
                 clock: Callable[[], float] = time.monotonic, deferred: bool = False) -> None:
        """Create the logger; see the class docstring."""
        self._logger = logger
        self._pending = deque(maxlen=100) if deferred else None
        self._period = float(period)
        self._clock = clock
        self._last: Dict[str, float] = {}
        self._suppressed: Dict[str, int] = {}
        self.drops: Dict[str, int] = {}

    def warn(self, key: str, message: str) -> bool:
        """
        Count one event of ``key`` and log ``message`` unless it was logged recently.

        :param key: what the event is about (topic name, check name).
        :param message: the warning text.
        :return: True when the message was logged, False when it was suppressed.
        """
        self.drops[key] = self.drops.get(key, 0) + 1
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self._period:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return False
        suppressed = self._suppressed.pop(key, 0)
        suffix = f' ({suppressed} similar suppressed)' if suppressed else ''
        self._last[key] = now
        if self._pending is not None:
            self._pending.append(f'{key}: {message}{suffix}')
        else:
            self._logger.warning(f'{key}: {message}{suffix}')
        return True

    def flush(self) -> None:
        """Log the lines a deferred logger holds (a no-op for a direct one)."""
        while self._pending:
            self._logger.warning(self._pending.popleft())

    @property
    def total(self) -> int:
        """
        Return the number of events counted over all keys.

        :return: sum of :attr:`drops`.
        """
        return sum(self.drops.values())
