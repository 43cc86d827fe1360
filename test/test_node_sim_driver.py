"""The simulated driver node over real DDS (loopback): interfaces, rates, commands, clock."""

import time

from diffsim_ros import robots
from diffsim_ros.nodes.convert import stamp_to_sec
from diffsim_ros.nodes.params import parameter_overrides
from diffsim_ros.nodes.sim_driver import SimDriver
from geometry_msgs.msg import PoseStamped
import numpy as np
import pytest
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, qos_profile_sensor_data, ReliabilityPolicy
from ros_helpers import own_endpoints, wait_for
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray
import torch

pytest_plugins = ['ros_helpers']
pytestmark = pytest.mark.ros


def make_driver(executor, **params):
    """Start a driver (lockstep by default) and spin it."""
    params = {'robot': 'qube', 'clock_mode': 'lockstep', 'real_time_factor': 1.0, **params}
    return executor.add_node(SimDriver(context=executor.executor.context,
                                       parameter_overrides=parameter_overrides(params)))


def make_probe(executor, topics):
    """Return a node collecting the messages of ``{topic: type}`` into lists."""
    node = executor.add_node(Node('probe', context=executor.executor.context))
    inbox = {topic: [] for topic in topics}
    for topic, kind in topics.items():
        node.create_subscription(kind, topic, inbox[topic].append, qos_profile_sensor_data)
    return node, inbox


def test_interfaces_types_qos_and_parameters(executor):
    driver = make_driver(executor)
    info = own_endpoints(driver, '/joint_states', 'publishers')
    assert [i.topic_type for i in info] == ['sensor_msgs/msg/JointState']
    assert info[0].qos_profile.reliability == ReliabilityPolicy.BEST_EFFORT
    assert [i.topic_type for i in own_endpoints(driver, '/clock', 'publishers')] == \
        ['rosgraph_msgs/msg/Clock']
    mocap = own_endpoints(driver, '/mocap/pendulum_tip', 'publishers')
    assert [i.topic_type for i in mocap] == ['geometry_msgs/msg/PoseStamped']
    subs = own_endpoints(driver, '/effort_controller/commands', 'subscriptions')
    assert [i.topic_type for i in subs] == ['std_msgs/msg/Float64MultiArray']
    assert subs[0].qos_profile.durability == DurabilityPolicy.VOLATILE
    descriptor = driver.describe_parameter('clock_mode')
    assert 'lockstep' in descriptor.description and descriptor.read_only
    assert driver.get_parameter('robot').value == 'qube'
    assert driver.get_parameter('command_timeout').value == 0.5   # from config/qube.yaml


def test_invalid_parameters_raise(executor):
    with pytest.raises(ValueError, match='clock_mode'):
        make_driver(executor, clock_mode='warp')
    with pytest.raises(ValueError, match='unknown robot'):
        make_driver(executor, robot='r2d2')


@pytest.mark.parametrize('robot', ['qube', 'cartpole', 'wam4', 'panda'])
def test_lockstep_publishes_joint_states_at_the_robot_rate(executor, robot):
    info = robots.get(robot)
    _, inbox = make_probe(executor, {'/joint_states': JointState, '/clock': Clock})
    driver = make_driver(executor, robot=robot, real_time_factor=0.5)
    assert wait_for(lambda: len(inbox['/joint_states']) > 50, timeout=20.0)
    messages = list(inbox['/joint_states'])
    assert all(list(m.name) == list(info.joint_names) for m in messages)
    assert all(len(m.position) == len(m.velocity) == len(m.effort) == info.n_joints
               for m in messages)
    stamps = np.array([stamp_to_sec(m.header.stamp) for m in messages])
    ticks = stamps * info.driver_rate_hz
    np.testing.assert_allclose(ticks, np.round(ticks), atol=1e-6)   # on the tick grid
    assert np.all(np.diff(stamps) > 0)
    assert np.isclose(np.diff(stamps).min(), 1.0 / info.driver_rate_hz)
    clocks = [stamp_to_sec(m.clock) for m in inbox['/clock']]
    assert clocks and np.all(np.diff(clocks) > 0)
    assert driver.plant.rate_hz == info.driver_rate_hz


def test_realtime_mode_keeps_the_wall_clock_rate(executor):
    driver = make_driver(executor, robot='cartpole', clock_mode='realtime')
    start_tick, start = driver.plant.tick, time.monotonic()
    time.sleep(1.0)
    rate = (driver.plant.tick - start_tick) / (time.monotonic() - start)
    assert 0.6 * 250 < rate < 1.1 * 250, rate
    # this node publishes no /clock (the graph may still list another test's lockstep driver
    # for a moment after it was destroyed: DDS discovery forgets endpoints lazily)
    assert '/clock' not in {publisher.topic_name for publisher in driver.publishers}


def test_commands_apply_bad_ones_are_dropped_and_timeout_zeroes(executor):
    driver = make_driver(executor, command_timeout=0.3)
    probe, inbox = make_probe(executor, {'/joint_states': JointState,
                                         '/mocap/pendulum_tip': PoseStamped})
    publisher = probe.create_publisher(Float64MultiArray, '/effort_controller/commands', 10)
    assert wait_for(lambda: publisher.get_subscription_count() > 0)

    publisher.publish(Float64MultiArray(data=[2.0]))
    assert wait_for(lambda: driver._command[0] == 2.0)
    for bad in ([1.0, 2.0], [float('nan')], [], [float('inf')]):
        publisher.publish(Float64MultiArray(data=bad))
    assert wait_for(lambda: driver.warnings.drops.get('commands', 0) == 4)
    assert driver._command.tolist() == [2.0]        # the last valid command stays
    # 2 V on the arm: the driver reports the motor torque as effort, the arm turns
    assert wait_for(lambda: inbox['/joint_states']
                    and inbox['/joint_states'][-1].effort[0] > 1e-3)
    assert wait_for(lambda: abs(driver.plant.state.qd[0]) > 0.1)
    # no command for command_timeout (plant time): zero again
    assert wait_for(lambda: driver._command.tolist() == [0.0], timeout=5.0)
    assert inbox['/mocap/pendulum_tip'] and \
        inbox['/mocap/pendulum_tip'][-1].header.frame_id == 'world'


def test_hidden_true_parameters_from_error_or_file(executor, tmp_path):
    sampled = make_driver(executor, param_error=0.3, seed=2)
    nominal = sampled.plant.nominal_model
    assert not torch.allclose(sampled.plant.true_model.inertial, nominal.inertial)
    path = tmp_path / 'truth.yaml'
    path.write_text('robot: qube\nmass_scale: {pendulum_link: 2.0}\n')
    explicit = SimDriver(context=executor.executor.context, node_name='sim_driver_2',
                         parameter_overrides=parameter_overrides(
                             {'robot': 'qube', 'clock_mode': 'lockstep',
                              'real_time_factor': 1.0, 'true_parameters_file': str(path)}))
    executor.add_node(explicit)
    index = explicit.plant.true_model.joint_index('pendulum_joint')
    assert float(explicit.plant.true_model.inertial[index, 0]) == pytest.approx(
        2.0 * float(nominal.inertial[index, 0]))


def test_use_sim_time_nodes_follow_the_lockstep_clock(executor):
    driver = make_driver(executor, real_time_factor=2.0)
    follower = executor.add_node(Node(
        'follower', context=executor.executor.context,
        parameter_overrides=parameter_overrides({'use_sim_time': True})))
    assert wait_for(lambda: follower.get_clock().now().nanoseconds > 0.5e9, timeout=10.0)
    lag = driver.plant.time - follower.get_clock().now().nanoseconds * 1e-9
    assert -0.01 <= lag < 1.5   # plant seconds; the follower sees /clock with some delay


def test_command_wait_keeps_the_plant_in_lockstep_with_the_controller(executor):
    # as fast as possible, but every tick waits for the controller's answer
    driver = make_driver(executor, real_time_factor=0.0, command_wait=1.0)
    probe = executor.add_node(Node('answering_controller', context=executor.executor.context))
    publisher = probe.create_publisher(Float64MultiArray, '/effort_controller/commands', 10)
    answering, answered = [True], []

    def answer(msg: JointState) -> None:
        if answering[0]:
            time.sleep(0.002)   # a controller slower than the plant
            publisher.publish(Float64MultiArray(data=[0.5]))
            answered.append(stamp_to_sec(msg.header.stamp))

    probe.create_subscription(JointState, '/joint_states', answer, qos_profile_sensor_data)
    assert wait_for(lambda: len(answered) > 20, timeout=20.0)
    ticks, count = driver.stats['ticks'], len(answered)
    assert wait_for(lambda: len(answered) > count + 100, timeout=20.0)
    # one tick per answer: the answered stamps are consecutive ticks (a best-effort state can
    # be lost: then that tick's wait times out and leaves one gap of two periods); compared on
    # the stamps, since the tick counter and the answer list cannot be read at one instant
    assert driver.stats['ticks'] - ticks >= 90   # about 100: the plant kept stepping
    gaps = np.round(np.diff(answered[count:]) / driver.plant.period).astype(int)
    assert gaps.min() >= 1 and gaps.max() <= 2 and int((gaps == 2).sum()) <= 1, gaps
    assert driver.stats['command_waits_timed_out'] <= 1
    # a controller that goes quiet does not stall the plant: three waits, then free running
    timed_out = driver.stats['command_waits_timed_out']
    answering[0] = False
    quiet = driver.stats['ticks']
    assert wait_for(lambda: driver.stats['ticks'] > quiet + 200, timeout=20.0)
    assert driver.stats['command_waits_timed_out'] - timed_out == 3
    assert driver.warnings.drops.get('command_wait', 0) >= 1
