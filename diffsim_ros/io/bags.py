"""
Read and write rosbag2 recordings (``.mcap`` and ``.db3``) without ROS, through ``rosbags``.

Reading (:func:`read_bag`)
--------------------------
``path`` is a rosbag2 directory (with ``metadata.yaml``), a single ``.mcap`` or ``.db3`` file,
or a directory holding exactly one such file (a recording whose ``metadata.yaml`` was never
written).  Supported messages:

* ``sensor_msgs/msg/JointState`` (the joint stream): columns are matched by joint name, never by
  position.  Messages lacking a requested joint or with mismatched array lengths are dropped
  and counted; samples with NaN are dropped; ``velocity``/``effort`` become ``qd``/``tau``
  when every kept message carries them.
* ``std_msgs/msg/Float64MultiArray`` commands (``u``), in the order of the robot's
  ``command_joints`` (what a ros2_control forward command controller takes).
* ``geometry_msgs/msg/PoseStamped`` motion capture (``poses``).

Timestamps: a stream's header stamps are used when all of them are set (non-zero), else the
bag's receive times.  Header-less commands use their receive times shifted onto the joint
stream's clock by the smallest delivery delay (receive time minus header stamp) of the joint
states received within :data:`DELAY_WINDOW_S` of them (the nearest one when none is): a
recorder that fell behind delays both streams alike at that moment, and the smallest nearby
delay is the one least inflated by jitter.
Each stream is sorted; duplicate stamps keep the first message (the last one for commands, the
newest command wins).  Times in the returned trajectories are seconds since the first
joint-state stamp.  Joint states are split into separate runs at gaps longer than
``max_gap_s``; commands are held and poses interpolated onto the joint stamps
(:func:`diffsim_ros.sysid.preprocess.align_streams`), cropped to the common time span.

Problems that make a bag unusable raise :class:`BagError` (a :class:`DiffsimError`) with the
reason: missing path, not a bag, corrupt or truncated file, unknown topic (the message lists
the bag's topics and types), missing joints (the message lists the joints the bag has), no
usable samples.  Recoverable problems (dropped messages) emit one :class:`BagWarning` with the
counts.

Writing (:class:`BagWriter`, :func:`write_bag`)
-----------------------------------------------
Writes ``JointState``, ``Float64MultiArray``, ``PoseStamped`` and ``String`` (e.g. the URDF on
``/robot_description``) messages to a new rosbag2 directory with storage ``'mcap'`` (default) or
``'sqlite3'``, or to a single ``.mcap`` / ``.db3`` file.  Message definitions come from the
ROS 2 Humble type store (the definitions of these standard messages are the same in every ROS 2
release).
"""

from collections import Counter
from pathlib import Path
import shutil
import time
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union
import warnings

import numpy as np
from rosbags.rosbag2 import Reader, StoragePlugin, Writer
from rosbags.typesys import get_typestore, Stores
import torch

from ..core.errors import DiffsimError
from ..sysid.dataset import Trajectory
from ..sysid.preprocess import align_streams, matrix_to_quaternion, quaternion_to_matrix

__all__ = ['BagError', 'BagWarning', 'BagWriter', 'bag_topics', 'JOINT_STATE', 'COMMAND',
           'POSE', 'STRING', 'TRANSFORM', 'read_bag', 'read_pose_stream', 'write_bag']

JOINT_STATE = 'sensor_msgs/msg/JointState'
COMMAND = 'std_msgs/msg/Float64MultiArray'
POSE = 'geometry_msgs/msg/PoseStamped'
TRANSFORM = 'geometry_msgs/msg/TransformStamped'
STRING = 'std_msgs/msg/String'
STORAGE_SUFFIXES = ('.mcap', '.db3')
_STORAGE_PLUGINS = {'mcap': StoragePlugin.MCAP, 'sqlite3': StoragePlugin.SQLITE3,
                    'db3': StoragePlugin.SQLITE3}

PathLike = Union[str, Path]

#: Joint states received this close (s) to a header-less message share its delivery delay.
DELAY_WINDOW_S = 0.01


class BagError(DiffsimError, ValueError):
    """A rosbag2 recording is missing, unreadable, or lacks the requested topics or joints."""


class BagWarning(UserWarning):
    """Some messages of a bag were dropped (the message says how many and why)."""


_TYPESTORE = None


def _typestore():
    """Return the (cached) ROS 2 type store used to (de)serialize messages."""
    global _TYPESTORE
    if _TYPESTORE is None:
        store = getattr(Stores, 'ROS2_HUMBLE', None) or Stores.LATEST
        _TYPESTORE = get_typestore(store)
    return _TYPESTORE


# --------------------------------------------------------------------------------------
# Opening and listing
# --------------------------------------------------------------------------------------
def _storage_path(path: PathLike) -> Path:
    """Return what ``rosbags.rosbag2.Reader`` should open, or raise :class:`BagError`."""
    path = Path(path)
    if not path.exists():
        raise BagError(f'bag {str(path)!r} does not exist')
    if path.is_dir():
        if (path / 'metadata.yaml').is_file():
            return path
        files = sorted(p for p in path.iterdir() if p.suffix in STORAGE_SUFFIXES)
        if len(files) == 1:
            return files[0]
        found = ', '.join(p.name for p in files) or 'none'
        raise BagError(f'{str(path)!r} is not a rosbag2 directory: no metadata.yaml and '
                       f'{len(files)} storage files ({found}); expected a bag directory or '
                       'one .mcap/.db3 file')
    if path.suffix not in STORAGE_SUFFIXES:
        raise BagError(f'{str(path)!r} is not a rosbag2 file: expected a bag directory or a '
                       f'file ending in {" or ".join(STORAGE_SUFFIXES)}')
    return path


def _open(path: PathLike) -> Reader:
    """Open a bag for reading, turning every failure into :class:`BagError`."""
    target = _storage_path(path)
    try:
        reader = Reader(target)
        reader.open()
    except Exception as exc:   # rosbags raises many kinds on corrupt files
        raise BagError(f'cannot read bag {str(path)!r} (corrupt, truncated or not a rosbag2 '
                       f'recording): {type(exc).__name__}: {exc}') from exc
    return reader


def _topic_table(reader: Reader) -> Dict[str, Tuple[str, int]]:
    """Return ``{topic: (msgtype, message count)}``."""
    table = {}
    for conn in reader.connections:
        msgtype, count = table.get(conn.topic, (conn.msgtype, 0))
        table[conn.topic] = (msgtype, count + conn.msgcount)
    return table


def _describe(table: Mapping[str, Tuple[str, int]]) -> str:
    """Format a topic table for error messages."""
    if not table:
        return 'the bag has no topics'
    return 'topics in the bag: ' + ', '.join(
        f'{topic} [{msgtype}, {count} msgs]' for topic, (msgtype, count) in sorted(table.items()))


def bag_topics(path: PathLike) -> Dict[str, Tuple[str, int]]:
    """
    List the topics of a bag.

    :param path: bag directory, ``.mcap`` or ``.db3`` file.
    :return: ``{topic: (message type, message count)}``.
    :raises BagError: missing, unreadable or corrupt bag.
    """
    reader = _open(path)
    try:
        return _topic_table(reader)
    finally:
        reader.close()


def _select_topic(table, topic: Optional[str], msgtype: str, what: str, preferred: str) -> str:
    """Return the topic to read for ``msgtype`` (checking a given name), or raise BagError."""
    if topic is not None:
        if topic not in table:
            raise BagError(f'{what} topic {topic!r} not found; {_describe(table)}')
        if table[topic][0] != msgtype:
            raise BagError(f'{what} topic {topic!r} carries {table[topic][0]}, expected '
                           f'{msgtype}; {_describe(table)}')
        return topic
    candidates = sorted(name for name, (kind, _) in table.items() if kind == msgtype)
    if preferred in candidates:
        return preferred
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise BagError(f'no {msgtype} topic in the bag for the {what}; {_describe(table)}')
    raise BagError(f'several {msgtype} topics ({", ".join(candidates)}); choose the {what} '
                   'topic explicitly')


def _read_messages(reader: Reader, path, topics: Sequence[str]) -> Dict[str, list]:
    """Return ``{topic: [(receive_ns, message), ...]}`` in storage order."""
    store = _typestore()
    wanted = [conn for conn in reader.connections if conn.topic in topics]
    out = {topic: [] for topic in topics}
    try:
        for conn, receive_ns, raw in reader.messages(connections=wanted):
            out[conn.topic].append((receive_ns, store.deserialize_cdr(raw, conn.msgtype)))
    except Exception as exc:   # truncated chunks, garbled bytes, bad CDR
        raise BagError(f'cannot read messages from bag {str(path)!r} (corrupt or truncated): '
                       f'{type(exc).__name__}: {exc}') from exc
    return out


# --------------------------------------------------------------------------------------
# Decoding streams
# --------------------------------------------------------------------------------------
def _stamp_ns(header) -> int:
    """Return a header stamp in ns (0 when unset)."""
    return int(header.stamp.sec) * 1_000_000_000 + int(header.stamp.nanosec)


def _sort_unique(times: np.ndarray, keep: str) -> np.ndarray:
    """Return indices that sort ``times`` and drop duplicates (keep 'first' or 'last')."""
    order = np.argsort(times, kind='stable')
    sorted_times = times[order]
    if keep == 'first':
        mask = np.ones(len(order), dtype=bool)
        mask[1:] = sorted_times[1:] != sorted_times[:-1]
    else:
        mask = np.ones(len(order), dtype=bool)
        mask[:-1] = sorted_times[1:] != sorted_times[:-1]
    return order[mask]


def _receive_offsets(receive: np.ndarray, header: np.ndarray, uses_header: bool):
    """
    Return ``offset(receive_ns) -> ns`` that maps receive times onto the joint stamps' clock.

    The offset at a receive time is ``max(header - receive)`` (the smallest delay) over the
    joint states received within :data:`DELAY_WINDOW_S` of it, else that of the nearest one.
    """
    if not uses_header:
        return lambda query: np.zeros(np.shape(query), dtype=np.int64)
    order = np.argsort(receive, kind='stable')
    received = receive[order]
    offsets = (header - receive)[order]
    window = int(DELAY_WINDOW_S * 1e9)

    def offset(query: np.ndarray) -> np.ndarray:
        query = np.asarray(query, dtype=np.int64)
        lo = np.searchsorted(received, query - window)
        hi = np.searchsorted(received, query + window, side='right')
        nearest = np.clip(np.searchsorted(received, query), 1, len(received) - 1)
        nearest = np.where(np.abs(received[nearest - 1] - query)
                           <= np.abs(received[nearest] - query), nearest - 1, nearest)
        out = offsets[np.clip(nearest, 0, len(received) - 1)].copy()
        for i in np.nonzero(hi > lo)[0]:
            out[i] = offsets[lo[i]:hi[i]].max()
        return out
    return offset


def _stream_times(receive: np.ndarray, header: Optional[np.ndarray], offset) -> np.ndarray:
    """Header stamps when all are set, else receive times shifted by ``offset(receive)``."""
    if header is not None and header.size and (header != 0).all():
        return header
    return receive + offset(receive)


def _decode_joint_states(messages, joint_names: Optional[Sequence[str]], topic: str,
                         dropped: Counter):
    """Return ``(names, receive_ns, header_ns, q, qd, tau)`` arrays from JointState messages."""
    available = {}
    if joint_names is None:
        for _, msg in messages:
            names = list(msg.name)
            if names and len(msg.position) == len(names):
                joint_names = names
                break
        if joint_names is None:
            raise BagError(f'no JointState message on {topic!r} carries named positions')
    joint_names = tuple(joint_names)
    receive, header, q, qd, tau = [], [], [], [], []
    for receive_ns, msg in messages:
        names = list(msg.name)
        for name in names:
            available[name] = None
        index = {name: i for i, name in enumerate(names)}
        if any(name not in index for name in joint_names):
            dropped['without the requested joints'] += 1
            continue
        if len(msg.position) != len(names):
            dropped['with position and name arrays of different lengths'] += 1
            continue
        columns = [index[name] for name in joint_names]
        receive.append(receive_ns)
        header.append(_stamp_ns(msg.header))
        q.append(np.asarray(msg.position, dtype=np.float64)[columns])
        qd.append(np.asarray(msg.velocity, dtype=np.float64)[columns]
                  if len(msg.velocity) == len(names) else None)
        tau.append(np.asarray(msg.effort, dtype=np.float64)[columns]
                   if len(msg.effort) == len(names) else None)
    if not q:
        raise BagError(f'joint(s) {list(joint_names)} not found on {topic!r}; joints in the '
                       f'bag: {list(available)}')

    def stacked(rows, field):
        if all(row is not None for row in rows):
            return np.stack(rows)
        if any(row is not None for row in rows):
            warnings.warn(f'{topic}: JointState.{field} is present in only some messages; '
                          f'ignoring it', BagWarning, stacklevel=4)
        return None
    return (joint_names, np.array(receive, dtype=np.int64), np.array(header, dtype=np.int64),
            np.stack(q), stacked(qd, 'velocity'), stacked(tau, 'effort'))


def _decode_commands(messages, topic: str, size: Optional[int], offset, t0: int,
                     dropped: Counter):
    """Return ``(t (K,), u (K, m))`` from Float64MultiArray messages (None when empty)."""
    lengths = Counter(len(msg.data) for _, msg in messages)
    if not lengths:
        raise BagError(f'command topic {topic!r} has no messages')
    width = size if size is not None else lengths.most_common(1)[0][0]
    if size is not None and lengths.get(size, 0) == 0:
        raise BagError(f'command topic {topic!r}: expected {size} values per message (one per '
                       f'command joint), found lengths {sorted(lengths)}')
    receive, data = [], []
    for receive_ns, msg in messages:
        values = np.asarray(msg.data, dtype=np.float64)
        if values.shape[0] != width:
            dropped[f'commands with {values.shape[0]} instead of {width} values'] += 1
        elif not np.isfinite(values).all():
            dropped['commands with NaN'] += 1
        else:
            receive.append(receive_ns)
            data.append(values)
    if not data:
        raise BagError(f'command topic {topic!r} has no finite {width}-value commands')
    receive = np.array(receive, dtype=np.int64)
    times = receive + offset(receive)
    keep = _sort_unique(times, 'last')
    return (times[keep] - t0) * 1e-9, np.stack(data)[keep]


def _decode_poses(messages, topic: str, offset, t0: int, dropped: Counter):
    """Return ``(t (P,), T_world_body (P, 4, 4))`` from PoseStamped messages."""
    if not messages:
        raise BagError(f'pose topic {topic!r} has no messages')
    receive = np.array([r for r, _ in messages], dtype=np.int64)
    header = np.array([_stamp_ns(m.header) for _, m in messages], dtype=np.int64)
    values = np.array([[m.pose.position.x, m.pose.position.y, m.pose.position.z,
                        m.pose.orientation.w, m.pose.orientation.x, m.pose.orientation.y,
                        m.pose.orientation.z] for _, m in messages], dtype=np.float64)
    norm = np.linalg.norm(values[:, 3:], axis=1)
    good = np.isfinite(values).all(axis=1) & (norm > 1e-9)
    if (~good).any():
        dropped[f'poses on {topic} with NaN or zero quaternions'] += int((~good).sum())
    if not good.any():
        raise BagError(f'pose topic {topic!r} has no valid poses')
    times = _stream_times(receive[good], header[good], offset)
    values = values[good]
    keep = _sort_unique(times, 'first')
    values = values[keep]
    poses = np.zeros((len(keep), 4, 4))
    poses[:, :3, :3] = quaternion_to_matrix(values[:, 3:])
    poses[:, :3, 3] = values[:, :3]
    poses[:, 3, 3] = 1.0
    return (times[keep] - t0) * 1e-9, poses


def _split_at_gaps(t: np.ndarray, max_gap_s: Optional[float]) -> List[Tuple[int, int]]:
    """Return ``[(start, stop), ...]`` index ranges separated by gaps longer than the limit."""
    if t.shape[0] < 2:
        return [(0, t.shape[0])]
    dt = np.diff(t)
    limit = max(0.1, 20.0 * float(np.median(dt))) if max_gap_s is None else max_gap_s
    cuts = (np.nonzero(dt > limit)[0] + 1).tolist()
    bounds = [0] + cuts + [t.shape[0]]
    return list(zip(bounds[:-1], bounds[1:]))


def read_bag(path: PathLike, topic: Optional[str] = None, command_topic: Optional[str] = None,
             pose_topics: Union[Sequence[str], Mapping[str, str]] = (),
             joint_names: Optional[Sequence[str]] = None,
             command_joints: Optional[Sequence[str]] = None,
             max_gap_s: Optional[float] = None,
             dtype: torch.dtype = torch.float64) -> List[Trajectory]:
    """
    Read joint states, commands and motion-capture poses of a rosbag2 recording.

    :param path: bag directory, ``.mcap`` or ``.db3`` file.
    :param topic: JointState topic; default ``/joint_states`` or the bag's only JointState topic.
    :param command_topic: Float64MultiArray command topic (e.g. ``/effort_controller/commands``),
        or None to read no commands.
    :param pose_topics: PoseStamped topics, or ``{topic: body name}``; a plain sequence uses the
        topic names as body names in ``Trajectory.poses``.
    :param joint_names: joints to read, in the order of the returned columns (e.g.
        ``robots.get(name).joint_names``); default: the names of the first message.
    :param command_joints: the robot's command joints; checks the command vector length.
    :param max_gap_s: split runs where joint stamps are further apart; default
        ``max(0.1 s, 20 x median period)``.
    :param dtype: floating dtype of the returned tensors.
    :return: one trajectory per gap-free run, named after the bag (``<name>``, or
        ``<name>#<k>`` when split), times in s since the first joint-state stamp.
    :raises BagError: see the module docstring.
    """
    reader = _open(path)
    try:
        table = _topic_table(reader)
        topic = _select_topic(table, topic, JOINT_STATE, 'joint state', '/joint_states')
        if command_topic is not None:
            _select_topic(table, command_topic, COMMAND, 'command', command_topic)
        body_of = (dict(pose_topics) if isinstance(pose_topics, Mapping)
                   else {name: name for name in pose_topics})
        for pose_topic in body_of:
            _select_topic(table, pose_topic, POSE, 'pose', pose_topic)
        wanted = [topic] + ([command_topic] if command_topic else []) + list(body_of)
        messages = _read_messages(reader, path, wanted)
    finally:
        reader.close()

    dropped = Counter()
    if not messages[topic]:
        raise BagError(f'joint state topic {topic!r} has no messages; {_describe(table)}')
    names, receive, header, q, qd, tau = _decode_joint_states(
        messages[topic], joint_names, topic, dropped)
    uses_header = (header != 0).all()
    times = header if uses_header else receive
    offset = _receive_offsets(receive, header, uses_header)
    finite = np.isfinite(q).all(axis=1)
    for extra in (qd, tau):
        if extra is not None:
            finite &= np.isfinite(extra).all(axis=1)
    if (~finite).any():
        dropped['joint states with NaN'] += int((~finite).sum())
    if not finite.any():
        raise BagError(f'joint state topic {topic!r} has no finite samples')
    index = np.nonzero(finite)[0]
    index = index[_sort_unique(times[index], 'first')]
    duplicates = int(finite.sum()) - index.shape[0]
    if duplicates:
        dropped['joint states with duplicate stamps'] += duplicates
    t0 = int(times[index[0]])
    t = (times[index] - t0) * 1e-9
    q = q[index]
    qd = None if qd is None else qd[index]
    tau = None if tau is None else tau[index]

    commands = None
    if command_topic is not None:
        size = None if command_joints is None else len(command_joints)
        commands = _decode_commands(messages[command_topic], command_topic, size, offset, t0,
                                    dropped)
    poses = {body_of[name]: _decode_poses(messages[name], name, offset, t0, dropped)
             for name in body_of}
    if dropped:
        details = ', '.join(f'{count} {why}' for why, count in dropped.items() if count)
        if details:
            warnings.warn(f'{path}: dropped {details}', BagWarning, stacklevel=2)

    stem = Path(path).name
    for suffix in STORAGE_SUFFIXES:
        stem = stem[:-len(suffix)] if stem.endswith(suffix) else stem
    ranges = _split_at_gaps(t, max_gap_s)
    runs = []
    for k, (lo, hi) in enumerate(ranges):
        def tensor(x):
            return None if x is None else torch.as_tensor(x[lo:hi], dtype=dtype)
        run = stem if len(ranges) == 1 else f'{stem}#{k}'
        joint_stream = Trajectory(t=tensor(t), q=tensor(q), joint_names=names, qd=tensor(qd),
                                  tau=tensor(tau), run=run)
        command_stream = None if commands is None else tuple(
            torch.as_tensor(x, dtype=dtype) for x in commands)
        pose_streams = {body: tuple(torch.as_tensor(x, dtype=dtype) for x in stream)
                        for body, stream in poses.items()}
        try:
            runs.append(align_streams(joint_stream, command_stream, pose_streams))
        except ValueError as exc:
            if len(ranges) == 1:
                raise BagError(f'{path}: cannot align the streams: {exc}') from exc
            warnings.warn(f'{path}: skipping run {run!r}: {exc}', BagWarning, stacklevel=2)
    if not runs:
        raise BagError(f'{path}: no run where joint states, commands and poses overlap')
    return runs


def _pose_topic(table: Mapping[str, Tuple[str, int]], topic: Optional[str]) -> str:
    """Return the PoseStamped / TransformStamped topic to read, or raise BagError."""
    kinds = (POSE, TRANSFORM)
    if topic is not None:
        if topic not in table:
            raise BagError(f'pose topic {topic!r} not found; {_describe(table)}')
        if table[topic][0] not in kinds:
            raise BagError(f'pose topic {topic!r} carries {table[topic][0]}, expected '
                           f'{POSE} or {TRANSFORM}; {_describe(table)}')
        return topic
    candidates = sorted(name for name, (kind, _) in table.items() if kind in kinds)
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise BagError(f'no {POSE} or {TRANSFORM} topic in the bag; {_describe(table)}')
    raise BagError(f'several pose topics ({", ".join(candidates)}); choose one with --topic')


def read_pose_stream(path: PathLike,
                     topic: Optional[str] = None) -> Tuple[str, np.ndarray, np.ndarray]:
    """
    Read one tracked object's poses from a ``PoseStamped`` or ``TransformStamped`` topic.

    Nothing is dropped or repaired here: the caller checks the values (NaN, non-unit
    quaternions) and names the bad row. Times are the header stamps when every one is set,
    else the receive times; messages are sorted by time, and a repeated stamp is an error.

    :param path: bag directory, ``.mcap`` or ``.db3`` file.
    :param topic: the topic; default: the bag's only PoseStamped / TransformStamped topic.
    :return: ``(topic, t (P,) [s since the first pose], rows (P, 7))`` with rows
        ``x, y, z [m], qw, qx, qy, qz`` in the header's frame.
    :raises BagError: missing or corrupt bag, no or several candidate topics, an unknown
        topic, no messages, repeated stamps.
    """
    reader = _open(path)
    try:
        table = _topic_table(reader)
        if not table or not sum(count for _, count in table.values()):
            raise BagError(f'bag {str(path)!r} is empty (no messages); {_describe(table)}')
        topic = _pose_topic(table, topic)
        messages = _read_messages(reader, path, [topic])[topic]
    finally:
        reader.close()
    if not messages:
        raise BagError(f'pose topic {topic!r} has no messages')
    rows, header = [], []
    for _, msg in messages:
        if table[topic][0] == POSE:
            position, rotation = msg.pose.position, msg.pose.orientation
        else:
            position, rotation = msg.transform.translation, msg.transform.rotation
        rows.append((position.x, position.y, position.z,
                     rotation.w, rotation.x, rotation.y, rotation.z))
        header.append(_stamp_ns(msg.header))
    receive = np.array([r for r, _ in messages], dtype=np.int64)
    header = np.array(header, dtype=np.int64)
    times = _stream_times(receive, header, lambda query: np.zeros(np.shape(query), np.int64))
    order = np.argsort(times, kind='stable')
    times, rows = times[order], np.asarray(rows, dtype=np.float64)[order]
    repeated = np.nonzero(np.diff(times) == 0)[0]
    if repeated.size:
        raise BagError(f'pose topic {topic!r}: messages {int(repeated[0])} and '
                       f'{int(repeated[0]) + 1} (in time order) have the same stamp')
    return topic, (times - times[0]) * 1e-9, rows


# --------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------
class BagWriter:
    """
    Write joint states, commands, poses and strings to a new rosbag2 recording.

    ``path`` is either a bag directory to create (``<path>/<path name>.mcap`` or ``.db3``
    inside, with ``metadata.yaml``), or a file name ending in ``.mcap`` / ``.db3``: then the
    storage follows the suffix and the result is that single storage file, which
    :func:`read_bag` (and ``ros2 bag`` of recent releases) read without ``metadata.yaml``.
    Times are given in seconds and stored as ``t0_ns + round(t * 1e9)`` in the header stamps
    and, by default, as the bag's receive (log) times.  Use as a context manager or call
    :meth:`close`.

    :param path: bag directory or ``.mcap`` / ``.db3`` file to create.
    :param storage: ``'mcap'`` (default) or ``'sqlite3'`` (``'db3'`` also accepted); must
        match a file suffix.
    :param t0_ns: absolute time of ``t = 0`` in ns since the epoch; default: now.
    :param overwrite: replace an existing bag directory or storage file at ``path``.
    :raises BagError: unknown or mismatched storage, or ``path`` exists and is not replaceable.
    """

    def __init__(self, path: PathLike, storage: str = 'mcap', t0_ns: Optional[int] = None,
                 overwrite: bool = False):
        """Create the bag and open it for writing."""
        path = Path(path)
        if path.suffix in STORAGE_SUFFIXES:
            implied = 'mcap' if path.suffix == '.mcap' else 'sqlite3'
            if _STORAGE_PLUGINS.get(storage) != _STORAGE_PLUGINS[implied]:
                raise BagError(f'{str(path)!r}: the suffix asks for {implied} storage, not '
                               f'{storage!r}')
            storage = implied
        if storage not in _STORAGE_PLUGINS:
            raise BagError(f'unknown bag storage {storage!r}; valid: mcap, sqlite3')
        if path.exists():
            if not overwrite:
                raise BagError(f'{str(path)!r} exists already (pass overwrite=True)')
            if path.is_file() and path.suffix in STORAGE_SUFFIXES:
                path.unlink()
            elif path.is_dir() and (path / 'metadata.yaml').is_file():
                shutil.rmtree(path)
            else:
                raise BagError(f'{str(path)!r} exists and is not a rosbag2 recording; not '
                               'overwriting it')
        self.path = path
        # a single storage file is written as a bag directory next to it, then moved out
        self._directory = (path.with_name(f'.{path.name}.partial')
                           if path.suffix in STORAGE_SUFFIXES else path)
        if self._directory != path and self._directory.exists():
            shutil.rmtree(self._directory)
        self.t0_ns = time.time_ns() if t0_ns is None else int(t0_ns)
        self._store = _typestore()
        self._connections = {}
        self._writer = Writer(self._directory, version=9,
                              storage_plugin=_STORAGE_PLUGINS[storage])
        self._writer.open()

    def __enter__(self) -> 'BagWriter':
        """Return the writer."""
        return self

    def __exit__(self, *exc) -> None:
        """Close the bag (also on errors, so that what was written stays readable)."""
        self.close()

    def close(self) -> None:
        """Finish the bag (writes ``metadata.yaml``); further writes are errors."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            if self._directory != self.path:
                (storage_file,) = [p for p in self._directory.iterdir()
                                   if p.suffix in STORAGE_SUFFIXES]
                storage_file.replace(self.path)
                shutil.rmtree(self._directory)

    def _ns(self, t: float) -> int:
        return self.t0_ns + int(round(float(t) * 1e9))

    def _connection(self, topic: str, msgtype: str):
        if self._writer is None:
            raise BagError(f'bag {str(self.path)!r} is closed')
        key = (topic, msgtype)
        if key not in self._connections:
            clash = [other for (name, other) in self._connections if name == topic]
            if clash:
                raise BagError(f'topic {topic!r} already carries {clash[0]}, not {msgtype}')
            if msgtype not in self._store.types:
                raise BagError(f'topic {topic!r}: message type {msgtype!r} is not in the '
                               'rosbags type store')
            self._connections[key] = self._writer.add_connection(topic, msgtype,
                                                                 typestore=self._store)
        return self._connections[key]

    def _write(self, topic: str, msgtype: str, msg, t: float, log_t: Optional[float]) -> None:
        connection = self._connection(topic, msgtype)
        data = self._store.serialize_cdr(msg, msgtype)
        self._writer.write(connection, self._ns(t if log_t is None else log_t), data)

    def raw(self, topic: str, msgtype: str, data: bytes, log_ns: int) -> None:
        """
        Write one message that is already serialized (CDR, as rclpy's raw subscriptions get it).

        The recorder of a live ROS graph uses this: nothing is decoded or re-encoded.

        :param topic: topic name.
        :param msgtype: ROS type name, e.g. ``'sensor_msgs/msg/JointState'``.
        :param data: the CDR bytes, encapsulation header included.
        :param log_ns: receive time in ns since the epoch (not relative to ``t0_ns``).
        :raises BagError: closed bag, unknown type, or the topic already has another type.
        """
        connection = self._connection(topic, msgtype)
        self._writer.write(connection, int(log_ns), bytes(data))

    def _header(self, t: float, frame_id: str):
        types = self._store.types
        ns = self._ns(t)
        stamp = types['builtin_interfaces/msg/Time'](sec=ns // 1_000_000_000,
                                                     nanosec=ns % 1_000_000_000)
        return types['std_msgs/msg/Header'](stamp=stamp, frame_id=frame_id)

    def joint_state(self, topic: str, t: float, names: Sequence[str], position,
                    velocity=None, effort=None, log_t: Optional[float] = None) -> None:
        """
        Write one ``sensor_msgs/JointState``.

        :param topic: topic name, e.g. ``/joint_states``.
        :param t: header stamp, s after ``t0``.
        :param names: joint names.
        :param position: ``(n,)`` positions (rad or m).
        :param velocity: ``(n,)`` velocities, or None (empty field).
        :param effort: ``(n,)`` efforts (N m or N), or None.
        :param log_t: receive time in s after ``t0`` (default ``t``).
        """
        def array(x):
            return np.zeros(0) if x is None else np.asarray(
                x.detach().cpu() if isinstance(x, torch.Tensor) else x, dtype=np.float64)
        msg = self._store.types[JOINT_STATE](
            header=self._header(t, ''), name=list(names), position=array(position),
            velocity=array(velocity), effort=array(effort))
        self._write(topic, JOINT_STATE, msg, t, log_t)

    def command(self, topic: str, t: float, values) -> None:
        """
        Write one ``std_msgs/Float64MultiArray`` (no header: ``t`` is the receive time).

        :param topic: topic name, e.g. ``/effort_controller/commands``.
        :param t: time in s after ``t0``.
        :param values: ``(m,)`` command values in command-joint order.
        """
        types = self._store.types
        layout = types['std_msgs/msg/MultiArrayLayout'](dim=[], data_offset=0)
        data = np.asarray(values.detach().cpu() if isinstance(values, torch.Tensor) else values,
                          dtype=np.float64).reshape(-1)
        self._write(topic, COMMAND, types[COMMAND](layout=layout, data=data), t, None)

    def _translation_rotation(self, T, vector: str):
        """Return a ``(4, 4)`` pose as ``geometry_msgs`` ``vector`` and ``Quaternion``."""
        T = np.asarray(T.detach().cpu() if isinstance(T, torch.Tensor) else T, dtype=np.float64)
        w, x, y, z = matrix_to_quaternion(T[:3, :3]).tolist()
        types = self._store.types
        return (types[f'geometry_msgs/msg/{vector}'](x=float(T[0, 3]), y=float(T[1, 3]),
                                                     z=float(T[2, 3])),
                types['geometry_msgs/msg/Quaternion'](x=x, y=y, z=z, w=w))

    def pose(self, topic: str, t: float, T_world_body, frame_id: str = 'world',
             log_t: Optional[float] = None) -> None:
        """
        Write one ``geometry_msgs/PoseStamped``.

        :param topic: topic name.
        :param t: header stamp, s after ``t0``.
        :param T_world_body: ``(4, 4)`` pose of the body in ``frame_id``.
        :param frame_id: header frame.
        :param log_t: receive time in s after ``t0`` (default ``t``).
        """
        types = self._store.types
        position, orientation = self._translation_rotation(T_world_body, 'Point')
        pose = types['geometry_msgs/msg/Pose'](position=position, orientation=orientation)
        msg = types[POSE](header=self._header(t, frame_id), pose=pose)
        self._write(topic, POSE, msg, t, log_t)

    def transform(self, topic: str, t: float, T_parent_child, frame_id: str = 'world',
                  child_frame_id: str = 'object') -> None:
        """
        Write one ``geometry_msgs/TransformStamped`` (a tracker's pose as a transform).

        :param topic: topic name.
        :param t: header stamp (and receive time), s after ``t0``.
        :param T_parent_child: ``(4, 4)`` pose of ``child_frame_id`` in ``frame_id``.
        :param frame_id: header frame.
        :param child_frame_id: the tracked frame.
        """
        types = self._store.types
        translation, rotation = self._translation_rotation(T_parent_child, 'Vector3')
        transform = types['geometry_msgs/msg/Transform'](translation=translation,
                                                         rotation=rotation)
        msg = types[TRANSFORM](header=self._header(t, frame_id), child_frame_id=child_frame_id,
                               transform=transform)
        self._write(topic, TRANSFORM, msg, t, None)

    def string(self, topic: str, t: float, text: str) -> None:
        """
        Write one ``std_msgs/String`` (e.g. a URDF on ``/robot_description``).

        :param topic: topic name.
        :param t: receive time in s after ``t0``.
        :param text: the string.
        """
        self._write(topic, STRING, self._store.types[STRING](data=str(text)), t, None)


def write_bag(path: PathLike, trajectory: Trajectory, joint_topic: str = '/joint_states',
              command_topic: Optional[str] = None,
              pose_topics: Optional[Mapping[str, str]] = None,
              strings: Optional[Mapping[str, str]] = None, storage: str = 'mcap',
              t0_ns: Optional[int] = None, overwrite: bool = False) -> Path:
    """
    Write a trajectory as a rosbag2 recording.

    Joint states (``q``, ``qd``, ``tau`` as position, velocity, effort) go to ``joint_topic``;
    ``u`` to ``command_topic`` when both are given; each pose to ``pose_topics[body]``
    (default ``/mocap/<body>/pose``); ``strings`` (``{topic: text}``, e.g. the URDF on
    ``/robot_description``) are written once at the first time stamp.

    :param path: bag directory, or ``.mcap`` / ``.db3`` file, to create (see
        :class:`BagWriter`).
    :param trajectory: the data (times in s; they become stamps ``t0_ns + t``).
    :param joint_topic: JointState topic.
    :param command_topic: Float64MultiArray topic for ``trajectory.u``, or None.
    :param pose_topics: ``{body: topic}`` for ``trajectory.poses``.
    :param strings: ``{topic: text}`` String messages.
    :param storage: ``'mcap'`` or ``'sqlite3'`` (implied by a file suffix).
    :param t0_ns: absolute time of ``t = 0`` in ns since the epoch; default: now.
    :param overwrite: replace an existing bag.
    :return: the path of the bag directory or file.
    :raises BagError: see :class:`BagWriter`; ``u`` without a command topic is not an error
        (it is simply not written).
    """
    pose_topics = dict(pose_topics or {})
    t = trajectory.t.detach().cpu().double().numpy()
    with BagWriter(path, storage=storage, t0_ns=t0_ns, overwrite=overwrite) as bag:
        for topic, text in (strings or {}).items():
            bag.string(topic, float(t[0]) if len(t) else 0.0, text)
        rows = {name: (None if getattr(trajectory, name) is None else
                       getattr(trajectory, name).detach().cpu().double().numpy())
                for name in ('q', 'qd', 'tau', 'u')}
        poses = {body: pose.detach().cpu().double().numpy()
                 for body, pose in trajectory.poses.items()}
        for k in range(len(t)):
            bag.joint_state(joint_topic, t[k], trajectory.joint_names, rows['q'][k],
                            None if rows['qd'] is None else rows['qd'][k],
                            None if rows['tau'] is None else rows['tau'][k])
            if command_topic is not None and rows['u'] is not None:
                bag.command(command_topic, t[k], rows['u'][k])
            for body, pose in poses.items():
                bag.pose(pose_topics.get(body, f'/mocap/{body}/pose'), t[k], pose[k])
    return Path(path)
