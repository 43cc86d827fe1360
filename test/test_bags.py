"""
Tests of ``diffsim_ros.io.bags``: rosbag2 round trips (mcap and sqlite3) and error handling.

Bags are written with :class:`BagWriter` / :func:`write_bag` and read back with
:func:`read_bag`; the out-of-order, duplicate, NaN and foreign-joint messages of a real
recording are reproduced on purpose.  Corrupt files are made by truncating or garbling the
storage file of a valid bag.
"""

import math
import warnings

from diffsim_ros.core import DiffsimError
from diffsim_ros.io import load_trajectories
from diffsim_ros.io.bags import (bag_topics, BagError, BagWarning, BagWriter, read_bag,
                                 write_bag)
from diffsim_ros.sysid.dataset import Trajectory
import numpy as np
import pytest
from rosbags.rosbag2 import Reader
from rosbags.typesys import get_typestore, Stores
import torch

STORAGES = ('mcap', 'sqlite3')
SUFFIX = {'mcap': '.mcap', 'sqlite3': '.db3'}
T0 = 1_700_000_000_000_000_000            # ns since the epoch
JOINTS = ('arm_joint', 'pendulum_joint')
CMD = '/effort_controller/commands'


def _rotation(axis, angle: float) -> np.ndarray:
    axis = np.asarray(axis, dtype=float) / np.linalg.norm(axis)
    K = np.array([[0, -axis[2], axis[1]], [axis[2], 0, -axis[0]], [-axis[1], axis[0], 0]])
    return np.eye(3) + math.sin(angle) * K + (1 - math.cos(angle)) * K @ K


def _signals(t: np.ndarray):
    q = np.stack([np.sin(t), 0.5 * np.cos(3 * t)], 1)
    return q, 2 * q + 0.1, -q


def _non_uniform_times(count: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.cumsum(rng.uniform(0.5e-3, 4e-3, count))


@pytest.fixture
def sample():
    t = _non_uniform_times(300)
    q, qd, tau = _signals(t)
    poses = np.tile(np.eye(4), (len(t), 1, 1))
    for k, tk in enumerate(t):
        poses[k, :3, :3] = _rotation([1.0, 2.0, 0.5], 0.9 * tk)
        poses[k, :3, 3] = [tk, -tk, 0.2]
    return Trajectory(t=torch.as_tensor(t), q=torch.as_tensor(q), joint_names=JOINTS,
                      qd=torch.as_tensor(qd), tau=torch.as_tensor(tau),
                      u=torch.as_tensor(np.round(q[:, :1], 1)),
                      poses={'box': torch.as_tensor(poses)})


@pytest.mark.parametrize('storage', STORAGES)
def test_write_read_round_trip(tmp_path, sample, storage):
    path = write_bag(tmp_path / 'run', sample, command_topic=CMD, storage=storage, t0_ns=T0,
                     strings={'/robot_description': '<robot name="qube"/>'})
    assert (path / f'run{SUFFIX[storage]}').is_file()
    topics = bag_topics(path)
    assert topics['/joint_states'] == ('sensor_msgs/msg/JointState', len(sample))
    assert topics[CMD] == ('std_msgs/msg/Float64MultiArray', len(sample))
    assert topics['/mocap/box/pose'] == ('geometry_msgs/msg/PoseStamped', len(sample))
    assert topics['/robot_description'] == ('std_msgs/msg/String', 1)
    for target in (path, path / f'run{SUFFIX[storage]}'):      # directory or storage file
        with warnings.catch_warnings():
            warnings.simplefilter('error')
            (out,) = read_bag(target, command_topic=CMD, pose_topics={'/mocap/box/pose': 'box'},
                              command_joints=('arm_joint',))
        assert out.run == 'run' and out.joint_names == JOINTS
        assert np.allclose(out.t.numpy(), sample.t.numpy() - sample.t[0].item(), atol=1e-9)
        for name in ('q', 'qd', 'tau', 'u'):
            assert torch.equal(getattr(out, name), getattr(sample, name)), name
        assert torch.allclose(out.poses['box'], sample.poses['box'], atol=1e-12)
    with Reader(path) as reader:
        (conn,) = [c for c in reader.connections if c.topic == '/robot_description']
        (_, _, raw), = list(reader.messages([conn]))
        store = get_typestore(Stores.ROS2_HUMBLE)
        assert store.deserialize_cdr(raw, conn.msgtype).data == '<robot name="qube"/>'


@pytest.mark.parametrize('storage', STORAGES)
def test_out_of_order_duplicate_nan_and_foreign_messages(tmp_path, storage):
    t = _non_uniform_times(200, seed=1)
    q, qd, tau = _signals(t)
    order = np.random.default_rng(2).permutation(len(t))   # header stamps out of order
    with BagWriter(tmp_path / 'bag', storage=storage, t0_ns=T0) as bag:
        for log_k, k in enumerate(order):
            # receive times increase while header stamps jump around; columns are permuted
            # and an extra joint is present: matching must be by name
            bag.joint_state('/joint_states', t[k], ('gripper', 'pendulum_joint', 'arm_joint'),
                            [9.0, q[k, 1], q[k, 0]], [0.0, qd[k, 1], qd[k, 0]],
                            [0.0, tau[k, 1], tau[k, 0]], log_t=1.0 + 1e-3 * log_k)
        last = 1.0 + 1e-3 * len(t)
        bag.joint_state('/joint_states', t[5], JOINTS[::-1], [7.0, 7.0], [0.0, 0.0],
                        [0.0, 0.0], log_t=last)                     # duplicate stamp
        bag.joint_state('/joint_states', 0.5 * (t[8] + t[9]), JOINTS,
                        [math.nan, 1.0], [0.0, 0.0], [0.0, 0.0], log_t=last)   # NaN sample
        bag.joint_state('/joint_states', t[10] + 1e-5, ('other_robot_joint',), [1.0], [0.0],
                        [0.0], log_t=last)                          # foreign joints
        bag.joint_state('/joint_states', t[11] + 1e-5, JOINTS, [1.0], [], [],
                        log_t=last)                                 # malformed lengths
    with pytest.warns(BagWarning) as record:
        (out,) = read_bag(tmp_path / 'bag', joint_names=JOINTS)
    message = str(record[0].message)
    for expected in ('1 joint states with NaN', '1 without the requested joints',
                     '1 with position and name arrays of different lengths',
                     '1 joint states with duplicate stamps'):
        assert expected in message
    assert len(out) == len(t)
    assert np.allclose(out.t.numpy(), t - t[0], atol=1e-9)
    assert np.array_equal(out.q.numpy(), q)          # the first of the duplicates is kept
    assert np.array_equal(out.qd.numpy(), qd) and np.array_equal(out.tau.numpy(), tau)


def test_commands_are_held_and_use_the_joint_clock(tmp_path):
    t = np.arange(0, 500) * 2e-3                                  # joints at 500 Hz
    t_cmd = 0.1 + np.arange(0, 40) * 0.02                         # commands at 50 Hz
    u = np.stack([np.arange(40.0), -np.arange(40.0)], 1)
    skew = 3.0       # the driver's clock runs 3 s ahead of the recorder's receive clock
    with BagWriter(tmp_path / 'bag', t0_ns=T0) as bag:
        for tk in t:
            bag.joint_state('/joint_states', tk + skew, JOINTS, [tk, 0.0], log_t=tk)
        for tk, value in zip(t_cmd, u):
            bag.command(CMD, tk, value)
        bag.command(CMD, 0.55, [1.0, 2.0, 3.0])                  # wrong length: dropped
    with pytest.warns(BagWarning, match='1 commands with 3 instead of 2 values'):
        (out,) = read_bag(tmp_path / 'bag', command_topic=CMD)
    assert out.qd is None and out.tau is None                    # empty fields in the bag
    times = out.t.numpy() + t[0]          # joint times relative to the first joint stamp
    assert times[0] >= t_cmd[0] - 1e-9 and times[-1] <= t_cmd[-1] + 1e-9
    held = u[np.searchsorted(t_cmd, times + 1e-9, side='right') - 1]
    assert np.array_equal(out.u.numpy(), held)
    with pytest.raises(BagError, match='expected 4 values per message'):
        read_bag(tmp_path / 'bag', command_topic=CMD, command_joints=('a', 'b', 'c', 'd'))


def test_commands_follow_a_recorder_that_falls_behind(tmp_path):
    # The recorder keeps up for 0.5 s, then lags 0.8 s behind both streams (a backlog), and
    # every delivery jitters by up to 0.5 ms.  Commands must land at their send times.
    rng = np.random.default_rng(3)
    t = np.arange(0, 500) * 2e-3
    t_cmd = 0.011 + np.arange(0, 49) * 0.02        # between joint samples
    u = np.arange(49.0)[:, None]

    def delay(tk):
        return (0.8 if tk >= 0.5 else 0.0) + 1e-4 + 5e-4 * rng.random()

    with BagWriter(tmp_path / 'bag', t0_ns=T0) as bag:
        for tk in t:
            bag.joint_state('/joint_states', tk, JOINTS, [tk, 0.0], log_t=tk + delay(tk))
        for tk, value in zip(t_cmd, u):
            bag.command(CMD, tk + delay(tk), value)
    (out,) = read_bag(tmp_path / 'bag', command_topic=CMD)
    times = out.t.numpy()
    expected = u[np.searchsorted(t_cmd, times + 1e-9, side='right') - 1]
    # The recovered times are off by at most the 0.5 ms jitter, under half a joint period.
    assert np.array_equal(out.u.numpy(), expected)


def test_receive_times_are_used_without_header_stamps(tmp_path):
    with BagWriter(tmp_path / 'bag', t0_ns=0) as bag:          # t0 = 0: stamps are unset
        bag.joint_state('/joint_states', 0.0, JOINTS, [0.0, 0.0], log_t=5.0)
        bag.joint_state('/joint_states', 0.0, JOINTS, [1.0, 0.0], log_t=5.25)
    (out,) = read_bag(tmp_path / 'bag')
    assert out.t.tolist() == pytest.approx([0.0, 0.25])


def test_gaps_split_runs(tmp_path):
    t = np.concatenate([np.arange(100) * 2e-3, 5.0 + np.arange(50) * 2e-3])
    with BagWriter(tmp_path / 'gappy', t0_ns=T0) as bag:
        for tk in t:
            bag.joint_state('/joint_states', tk, JOINTS, [tk, 0.0])
    runs = read_bag(tmp_path / 'gappy')
    assert [(r.run, len(r)) for r in runs] == [('gappy#0', 100), ('gappy#1', 50)]
    assert len(read_bag(tmp_path / 'gappy', max_gap_s=10.0)) == 1


def test_velocity_in_only_some_messages_is_ignored_with_a_warning(tmp_path):
    with BagWriter(tmp_path / 'bag', t0_ns=T0) as bag:
        bag.joint_state('/joint_states', 0.0, JOINTS, [0.0, 0.0], [1.0, 1.0])
        bag.joint_state('/joint_states', 0.1, JOINTS, [0.0, 0.0])
    with pytest.warns(BagWarning, match='velocity is present in only some'):
        (out,) = read_bag(tmp_path / 'bag')
    assert out.qd is None


# --------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------
@pytest.fixture(params=STORAGES)
def small_bag(tmp_path, request):
    t = np.arange(0, 400) * 1e-3
    q, qd, tau = _signals(t)
    traj = Trajectory(t=torch.as_tensor(t), q=torch.as_tensor(q), joint_names=JOINTS,
                      qd=torch.as_tensor(qd), tau=torch.as_tensor(tau))
    return write_bag(tmp_path / 'small', traj, storage=request.param, t0_ns=T0)


def _storage_file(bag):
    (file,) = [p for p in bag.iterdir() if p.suffix in ('.mcap', '.db3')]
    return file


def test_unknown_topic_lists_the_topics(small_bag):
    with pytest.raises(BagError) as info:
        read_bag(small_bag, topic='/robot/joint_states')
    assert '/joint_states [sensor_msgs/msg/JointState, 400 msgs]' in str(info.value)
    with pytest.raises(BagError, match='command topic .*/cmd.* not found'):
        read_bag(small_bag, command_topic='/cmd')
    with pytest.raises(BagError, match='carries sensor_msgs/msg/JointState, expected'):
        read_bag(small_bag, pose_topics=['/joint_states'])


def test_missing_joints_list_the_available_ones(small_bag):
    with pytest.raises(BagError) as info:
        read_bag(small_bag, joint_names=('panda_joint1',))
    assert "['arm_joint', 'pendulum_joint']" in str(info.value)
    assert isinstance(info.value, DiffsimError)


@pytest.mark.parametrize('damage', ['truncate', 'garble', 'empty'])
def test_corrupt_files_raise_bag_error(small_bag, tmp_path, damage):
    file = _storage_file(small_bag)
    data = file.read_bytes()
    if damage == 'truncate':
        broken = data[:len(data) // 2]
    elif damage == 'garble':
        rng = np.random.default_rng(0)
        buffer = bytearray(data)
        for index in rng.integers(0, len(buffer), 400):
            buffer[index] = 0xAB
        broken = bytes(buffer)
    else:
        broken = b''
    target = tmp_path / f'broken{file.suffix}'
    target.write_bytes(broken)
    with pytest.raises(BagError, match='corrupt'):
        read_bag(target)
    file.write_bytes(broken)                  # also through the bag directory
    with pytest.raises(BagError):
        read_bag(small_bag)


def test_paths_that_are_not_bags(tmp_path):
    with pytest.raises(BagError, match='does not exist'):
        read_bag(tmp_path / 'missing.mcap')
    (tmp_path / 'notes.txt').write_text('hello')
    with pytest.raises(BagError, match='not a rosbag2 file'):
        read_bag(tmp_path / 'notes.txt')
    (tmp_path / 'folder').mkdir()
    with pytest.raises(BagError, match='not a rosbag2 directory'):
        read_bag(tmp_path / 'folder')
    (tmp_path / 'fake.mcap').write_bytes(b'not an mcap file at all' * 10)
    with pytest.raises(BagError, match='corrupt'):
        bag_topics(tmp_path / 'fake.mcap')


def test_empty_topic_and_other_message_types(tmp_path):
    with BagWriter(tmp_path / 'bag', t0_ns=T0) as bag:
        bag.string('/robot_description', 0.0, '<robot/>')
    with pytest.raises(BagError, match='no sensor_msgs/msg/JointState topic'):
        read_bag(tmp_path / 'bag')


def test_writer_refuses_to_clobber(tmp_path, sample):
    write_bag(tmp_path / 'bag', sample, t0_ns=T0)
    with pytest.raises(BagError, match='exists already'):
        write_bag(tmp_path / 'bag', sample, t0_ns=T0)
    write_bag(tmp_path / 'bag', sample.crop(0, 10), t0_ns=T0, overwrite=True)
    assert len(read_bag(tmp_path / 'bag')[0]) == 10
    (tmp_path / 'precious').mkdir()
    with pytest.raises(BagError, match='not a rosbag2 recording'):
        write_bag(tmp_path / 'precious', sample, overwrite=True)
    with pytest.raises(BagError, match='unknown bag storage'):
        BagWriter(tmp_path / 'other', storage='rosbag1')


@pytest.mark.parametrize('suffix', SUFFIX.values())
def test_write_a_single_storage_file(tmp_path, sample, suffix):
    path = write_bag(tmp_path / f'recording{suffix}', sample, t0_ns=T0,
                     storage='mcap' if suffix == '.mcap' else 'sqlite3')
    assert path.is_file() and sorted(p.name for p in tmp_path.iterdir()) == [path.name]
    (out,) = read_bag(path)
    assert out.run == 'recording' and torch.equal(out.q, sample.q)
    with pytest.raises(BagError, match='exists already'):
        write_bag(path, sample, t0_ns=T0, storage='sqlite3' if suffix == '.db3' else 'mcap')
    write_bag(path, sample.crop(0, 5), t0_ns=T0, overwrite=True,
              storage='sqlite3' if suffix == '.db3' else 'mcap')
    assert len(read_bag(path)[0]) == 5
    with pytest.raises(BagError, match='the suffix asks for'):
        BagWriter(tmp_path / f'other{suffix}', storage='mcap' if suffix == '.db3' else 'db3')


def test_load_trajectories_dispatches_bags(tmp_path, sample):
    path = write_bag(tmp_path / 'bag.d', sample, storage='sqlite3', t0_ns=T0)
    (out,) = load_trajectories(_storage_file(path), joint_names=JOINTS[::-1])
    assert out.joint_names == JOINTS[::-1]
    assert torch.equal(out.q, sample.q.flip(-1))
