"""Message <-> array conversion, throttled warnings and ROS parameter plumbing of the nodes."""

import dataclasses
from dataclasses import dataclass, field
import math

from builtin_interfaces.msg import Time
from diffsim_ros import robots
from diffsim_ros.nodes.convert import (commands_array, commands_msg, joint_state_arrays,
                                       joint_state_msg, MessageError, pose_matrix, pose_msg,
                                       sec_to_stamp, stamp_to_ns, stamp_to_sec,
                                       ThrottledLogger)
from diffsim_ros.nodes.params import (config_path, declare_config, declare_robot,
                                      load_yaml_params, parameter_overrides)
import numpy as np
import pytest
from rclpy.node import Node
from std_msgs.msg import Float64MultiArray

pytest_plugins = ['ros_helpers']

NAMES = ('a', 'b', 'c')


def _state(names, position, velocity=None, effort=None, stamp=1.5):
    return joint_state_msg(names, position, velocity, effort, stamp)


def test_joint_state_maps_by_name_and_ignores_extra_joints():
    msg = _state(['gripper', 'c', 'a', 'b'], [9.0, 3.0, 1.0, 2.0], [0.9, 0.3, 0.1, 0.2],
                 [0.0, 30.0, 10.0, 20.0], stamp=12.25)
    t, q, qd, effort = joint_state_arrays(msg, NAMES)
    assert t == 12.25
    np.testing.assert_array_equal(q, [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(qd, [0.1, 0.2, 0.3])
    np.testing.assert_array_equal(effort, [10.0, 20.0, 30.0])


@pytest.mark.parametrize('names, position, velocity, reason', [
    (['a', 'b'], [1.0, 2.0], [0.0, 0.0], 'missing'),
    (['a', 'b', 'c', 'a'], [1.0, 2.0, 3.0, 4.0], [0.0] * 4, 'duplicate'),
    (['a', 'b', 'c'], [1.0, float('nan'), 3.0], [0.0] * 3, 'non-finite'),
    (['a', 'b', 'c'], [1.0, 2.0, 3.0], [0.0, float('inf'), 0.0], 'non-finite'),
    (['a', 'b', 'c'], [1.0, 2.0], [0.0] * 3, 'positions'),
    (['a', 'b', 'c'], [1.0, 2.0, 3.0], [0.0] * 2, 'velocities'),
    (['a', 'b', 'c'], [1.0, 2.0, 3.0], [], 'velocities'),
])
def test_joint_state_rejects_bad_messages(names, position, velocity, reason):
    msg = _state(NAMES, [0.0] * 3)
    msg.name, msg.position, msg.velocity = names, position, velocity
    with pytest.raises(MessageError, match=reason):
        joint_state_arrays(msg, NAMES)


def test_joint_state_optional_velocity_and_effort():
    msg = _state(NAMES, [1.0, 2.0, 3.0], effort=[1.0, float('nan'), 0.0])
    t, q, qd, effort = joint_state_arrays(msg, NAMES, require_velocity=False)
    assert qd is None and effort is None   # NaN effort (passive joint): no effort
    msg.effort = [1.0, 2.0]
    with pytest.raises(MessageError, match='efforts'):
        joint_state_arrays(msg, NAMES, require_velocity=False)


def test_joint_state_msg_checks_lengths():
    with pytest.raises(MessageError, match='velocity'):
        joint_state_msg(NAMES, [1.0, 2.0, 3.0], qd=[1.0])


def test_commands_round_trip_and_validation():
    msg = commands_msg(np.array([1.0, -2.5]))
    assert isinstance(msg, Float64MultiArray) and list(msg.data) == [1.0, -2.5]
    np.testing.assert_array_equal(commands_array(msg, 2), [1.0, -2.5])
    with pytest.raises(MessageError, match='expected 3'):
        commands_array(msg, 3)
    with pytest.raises(MessageError, match='non-finite'):
        commands_msg([0.0, float('nan')])
    with pytest.raises(MessageError, match='non-finite'):
        commands_array(Float64MultiArray(data=[float('inf')]), 1)


def _rotation(axis, angle):
    axis = np.asarray(axis, dtype=np.float64) / np.linalg.norm(axis)
    K = np.array([[0, -axis[2], axis[1]], [axis[2], 0, -axis[0]], [-axis[1], axis[0], 0]])
    return np.eye(3) + math.sin(angle) * K + (1 - math.cos(angle)) * K @ K


def test_pose_round_trip_including_half_turns():
    rng = np.random.default_rng(4)
    cases = [(rng.normal(size=3), rng.uniform(-math.pi, math.pi)) for _ in range(20)]
    cases += [((1, 0, 0), math.pi), ((0, 1, 0), math.pi), ((0, 0, 1), math.pi),
              ((1, 1, 0), math.pi), ((0, 0, 1), 0.0)]
    for axis, angle in cases:
        T = np.eye(4)
        T[:3, :3] = _rotation(axis, angle)
        T[:3, 3] = rng.normal(size=3)
        msg = pose_msg(T, 'world', 3.0)
        assert msg.header.frame_id == 'world' and stamp_to_sec(msg.header) == 3.0
        assert msg.pose.orientation.w >= 0.0
        np.testing.assert_allclose(pose_matrix(msg), T, atol=1e-12)


def test_pose_matrix_normalises_and_rejects():
    msg = pose_msg(np.eye(4), 'world')
    msg.pose.orientation.w = 2.0
    np.testing.assert_allclose(pose_matrix(msg), np.eye(4), atol=1e-15)
    msg.pose.orientation.w = 0.0
    with pytest.raises(MessageError, match='quaternion'):
        pose_matrix(msg)
    msg.pose.orientation.w, msg.pose.position.x = 1.0, float('nan')
    with pytest.raises(MessageError, match='non-finite'):
        pose_matrix(msg)


def test_stamps():
    stamp = sec_to_stamp(1.25)
    assert (stamp.sec, stamp.nanosec) == (1, 250_000_000)
    assert stamp_to_sec(stamp) == 1.25
    for bad in (-1.0, float('nan')):
        with pytest.raises(MessageError):
            sec_to_stamp(bad)
    # integer nanoseconds are exact where float epoch seconds are not
    first, second = Time(sec=1_795_000_000, nanosec=999_500_000), \
        Time(sec=1_795_000_001, nanosec=500_000)
    assert stamp_to_ns(second) - stamp_to_ns(first) == 1_000_000
    assert stamp_to_sec(second) - stamp_to_sec(first) != 1e-3
    header = _state(NAMES, [0.0] * 3).header
    header.stamp = second
    assert stamp_to_ns(header) == 1_795_000_001_000_500_000


class _Recorder:

    def __init__(self):
        self.lines = []

    def warning(self, text):
        self.lines.append(text)


def test_throttled_logger_logs_once_per_period_and_counts():
    now = [0.0]
    recorder = _Recorder()
    throttled = ThrottledLogger(recorder, period=1.0, clock=lambda: now[0])
    for _ in range(5):
        throttled.warn('joint_states', 'bad')
    throttled.warn('commands', 'bad')
    assert recorder.lines == ['joint_states: bad', 'commands: bad']
    now[0] = 1.5
    assert throttled.warn('joint_states', 'bad')
    assert recorder.lines[-1] == 'joint_states: bad (4 similar suppressed)'
    assert throttled.drops == {'joint_states': 6, 'commands': 1} and throttled.total == 7


def test_deferred_throttled_logger_logs_only_when_flushed():
    now = [0.0]
    recorder = _Recorder()
    deferred = ThrottledLogger(recorder, period=1.0, clock=lambda: now[0], deferred=True)
    for _ in range(3):
        deferred.warn('joint_states', 'bad')
    assert recorder.lines == [] and deferred.drops == {'joint_states': 3}
    deferred.flush()
    assert recorder.lines == ['joint_states: bad']
    now[0] = 1.5
    deferred.warn('joint_states', 'bad')
    deferred.flush()
    deferred.flush()
    assert recorder.lines[-1] == 'joint_states: bad (2 similar suppressed)'
    assert len(recorder.lines) == 2


# -- parameters ----------------------------------------------------------------------------
def test_load_yaml_params_wildcards_namespaces_and_nesting(tmp_path):
    path = tmp_path / 'params.yaml'
    path.write_text(
        '/**:\n  ros__parameters:\n    use_sim_time: true\n    rate: 1\n'
        'robot_ns:\n  identifier:\n    ros__parameters:\n      rate: 2\n'
        '      diffnea: {lr: 0.1, learn: [inertial]}\n'
        'other:\n  ros__parameters:\n    rate: 3\n')
    assert load_yaml_params(path, 'identifier') == {
        'use_sim_time': True, 'rate': 2, 'diffnea.lr': 0.1, 'diffnea.learn': ['inertial']}
    assert load_yaml_params(path, 'missing') == {'use_sim_time': True, 'rate': 1}


@dataclass(frozen=True)
class _Config:
    """
    A test configuration.

    :param gain: documented in the docstring only.
    """

    gain: float = 1.0
    count: int = field(default=2, metadata={'description': 'how many', 'read_only': False})
    names: tuple[str, ...] = ()
    values: tuple[float, ...] = (1.0, 2.0)
    options: dict = field(default_factory=dict)
    label: str = 'x'

    def __post_init__(self):
        if self.count < 0:
            raise ValueError(f'count must be >= 0, got {self.count}')


ROS = pytest.mark.ros


@pytest.fixture
def make_node(ros_context):
    nodes = []

    def make(overrides=None, name='params_test'):
        node = Node(name, context=ros_context,
                    parameter_overrides=parameter_overrides(overrides or {}))
        nodes.append(node)
        return node
    yield make
    for node in nodes:
        node.destroy_node()


@ROS
def test_declare_config_descriptors_and_precedence(make_node):
    node = make_node({'p.gain': 3, 'p.names': ['u', 'v'], 'p.options': '{k: 1.5}'})
    config = declare_config(node, _Config, 'p.', defaults={'p.label': 'from-yaml',
                                                           'p.gain': 9.0, 'p.count': 5})
    assert config == _Config(gain=3.0, count=5, names=('u', 'v'), values=(1.0, 2.0),
                             options={'k': 1.5}, label='from-yaml')
    assert isinstance(config.gain, float)
    gain = node.describe_parameter('p.gain')
    assert gain.description == 'documented in the docstring only.' and gain.read_only
    count = node.describe_parameter('p.count')
    assert count.description == 'how many' and not count.read_only
    assert node.get_parameter('p.values').value == [1.0, 2.0]


@ROS
def test_declare_config_nested_mapping_default_and_empty_tuple(make_node):
    config = declare_config(make_node(), _Config, defaults={'options.a': 1, 'options.b': 'z'})
    assert config.options == {'a': 1, 'b': 'z'} and config.names == ()


@ROS
@pytest.mark.parametrize('overrides, match', [
    ({'count': -1}, 'count must be >= 0'),
    ({'count': 'many'}, 'count'),
    ({'gain': 'fast'}, "'gain' = 'fast' refused: must be a float"),
    ({'options': '[1, 2]'}, 'mapping'),
])
def test_declare_config_rejects_bad_values(make_node, overrides, match):
    with pytest.raises(ValueError, match=match):
        declare_config(make_node(overrides), _Config)


@ROS
def test_declare_robot_reads_the_robot_yaml(make_node):
    robot, defaults = declare_robot(make_node({'robot': 'cartpole'}, name='identifier'))
    assert robot == 'cartpole' and 'robot' not in defaults
    assert defaults['diffnea.actuator'] == 'quanser_ip02'
    with pytest.raises(ValueError, match='unknown robot'):
        declare_robot(make_node({'robot': 'r2d2'}, name='identifier'))
    with pytest.raises(ValueError, match='does not exist'):
        declare_robot(make_node({'config_file': '/nonexistent.yaml'}, name='identifier'))


@ROS
@pytest.mark.parametrize('robot', ['qube', 'cartpole', 'wam4', 'wam7', 'panda'])
def test_shipped_configs_validate(make_node, robot):
    from diffsim_ros.nodes.identifier import IdentifierConfig
    from diffsim_ros.nodes.sim_driver import SimDriverConfig
    from diffsim_ros.sysid.estimators import ESTIMATORS
    path = config_path(robot)
    assert path.is_file()
    for node_name, config_cls in (('sim_driver', SimDriverConfig),
                                  ('identifier', IdentifierConfig)):
        values = load_yaml_params(path, node_name)
        assert values.pop('robot') == robot
        names = {item.name for item in dataclasses.fields(config_cls)}
        own = {key for key in values if '.' not in key}
        assert own <= names, f'{node_name}: unknown keys {sorted(own - names)}'
        node = make_node(name=node_name)
        config = declare_config(node, config_cls, defaults=values)
        if node_name == 'identifier':
            for estimator in ('nea', 'diffnea'):
                declare_config(node, ESTIMATORS[estimator][1], f'{estimator}.', values,
                               skip_unsupported=True)
            assert config.mocap_bodies == (robots.get(robot).end_effector_link,)


def test_commands_are_timed_on_the_timeline_of_the_states_they_answer():
    from diffsim_ros.nodes.convert import CommandTimeline
    timeline = CommandTimeline()
    # before any state: no time on wall time (its arrival, on the node's clock, is not the
    # states' timeline, and a driver's stamps 100 s behind that clock held every command
    # there); its arrival on simulated time, where the clock is the stamps'
    assert timeline.command(105.0) is None
    timeline.state(5.0, 105.01)
    assert timeline.command(105.02) == pytest.approx(5.01)
    assert CommandTimeline(shared_clock=True).command(5.0) == 5.0
    timeline.reset()
    lag = 0.3   # the states reach the node 0.3 s after their stamps
    times = []
    for k in range(5):
        stamp = 10.0 + 0.002 * k
        timeline.state(stamp, stamp + lag)
        times.append(timeline.command(stamp + lag + 0.0005))   # answered 0.5 ms later
    np.testing.assert_allclose(times, 10.0 + 0.002 * np.arange(5) + 0.0005, atol=1e-12)
    # the states stop: the commands' times follow their arrival from the last state on
    assert timeline.command(10.008 + lag + 0.1) == pytest.approx(10.008 + 0.1)
    # a late command answering an older state never moves time back
    timeline.state(10.010, 10.010 + lag)
    assert timeline.command(10.010 + lag) == pytest.approx(10.108)


def test_a_command_is_timed_by_the_state_that_had_arrived_before_it_not_the_newest_taken():
    # A busy executor takes states 90 ms newer than a command before the command; the
    # command answers the state that had arrived before it, whatever was taken since.
    from diffsim_ros.nodes.convert import CommandTimeline
    timeline = CommandTimeline()
    stamps = 10.0 + 0.01 * np.arange(40)
    arrivals = 50.0 + 0.01 * np.arange(40) + 0.001   # 1 ms after the stamps, on another clock
    times = []
    for batch in range(0, 40, 10):   # ten states taken, then the ten commands answering them
        for k in range(batch, batch + 10):
            timeline.state(stamps[k], arrivals[k])
        times += [timeline.command(arrivals[k] + 0.0005) for k in range(batch, batch + 10)]
    np.testing.assert_allclose(times, stamps + 0.0005, atol=1e-9)
    # a command taken before the state it answers: the state before it times it
    timeline.reset()
    timeline.state(10.0, 50.0)
    assert timeline.command(50.0125) == pytest.approx(10.0125)
    timeline.state(10.01, 50.01)   # taken after the command, arrived before it: no change back
    assert timeline.command(50.013) == pytest.approx(10.013)
    # a command that arrived before every state kept is timed back from the oldest of them
    timeline = CommandTimeline(history=2)
    for k in range(3):
        timeline.state(stamps[k], arrivals[k])
    assert timeline.command(arrivals[0]) == pytest.approx(stamps[0])


def test_publication_timeline_places_by_publication_order_and_drains_at_the_end():
    # source times: the order things were published in, whatever order they are taken in
    from diffsim_ros.nodes.convert import PublicationTimeline
    timeline = PublicationTimeline()
    assert timeline.command('latched', 1) == []         # published before any state
    assert timeline.state(0.5, 2) == [(None, 'latched')]   # no state to hold it on
    assert timeline.command('u0', 3) == []   # a state published after it may still come
    assert timeline.state(0.6, 4) == [(0.5, 'u0')]      # it did not: u0 answers 0.5
    assert timeline.state(0.7, 6) == []                 # taken before u1, published after
    assert timeline.command('u1', 5) == [(0.6, 'u1')]   # placed at once
    assert timeline.state(0.7, 6) == []                 # a duplicate changes nothing
    assert timeline.settled(0.6) and not timeline.settled(0.7)
    assert timeline.command('u2', 7) == [] and timeline.settled(0.7)
    assert not timeline.settled(0.8)
    assert timeline.drain() == [(0.7, 'u2')] and timeline.drain() == []
