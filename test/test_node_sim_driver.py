"""The simulated driver node over real DDS (loopback): interfaces, rates, commands, clock."""

import math
import threading
import time

from diffsim_ros import robots
from diffsim_ros.nodes.convert import stamp_to_sec
from diffsim_ros.nodes.foreign_graph import ForeignGraphError
from diffsim_ros.nodes.lockstep import ANNOUNCE_QOS, LockstepPeer
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
from std_msgs.msg import Float64MultiArray, String
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
    # command_wait 0: the plant steps on without this probe's answers
    driver = make_driver(executor, command_timeout=0.3, command_wait=0.0)
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
    # beside the first driver, in a namespace of its own and on the wall clock: the first
    # one's joint_states, mocap poses and /clock are not its streams (module docstring)
    explicit = SimDriver(context=executor.executor.context, node_name='sim_driver_2',
                         namespace='explicit', parameter_overrides=parameter_overrides(
                             {'robot': 'qube', 'clock_mode': 'realtime',
                              'true_parameters_file': str(path)}))
    executor.add_node(explicit)
    index = explicit.plant.true_model.joint_index('pendulum_joint')
    assert float(explicit.plant.true_model.inertial[index, 0]) == pytest.approx(
        2.0 * float(nominal.inertial[index, 0]))


def test_a_second_driver_on_the_first_ones_streams_is_refused(executor):
    make_driver(executor)
    with pytest.raises(ForeignGraphError) as refused:
        make_driver(executor)
    found = str(refused.value).split(': ', 1)[1].split('. ')[0].split('; ')
    assert found == [f'publishers of {topic}: /sim_driver'
                     for topic in ('/joint_states', '/mocap/pendulum_tip', '/clock')]


def test_use_sim_time_nodes_follow_the_lockstep_clock(executor):
    driver = make_driver(executor, real_time_factor=2.0)
    follower = executor.add_node(Node(
        'follower', context=executor.executor.context,
        parameter_overrides=parameter_overrides({'use_sim_time': True})))
    assert wait_for(lambda: follower.get_clock().now().nanoseconds > 0.5e9, timeout=10.0)
    lag = driver.plant.time - follower.get_clock().now().nanoseconds * 1e-9
    assert -0.01 <= lag < 1.5   # plant seconds; the follower sees /clock with some delay


def answering_controller(executor, name, delay, hear_after=1):
    """
    Return a node that commands once per ``/clock`` tick, as the mpc's command loop does.

    :param delay: ``delay(stamp)`` -> wall seconds the answer takes.
    :param hear_after: the answer comes at the ``hear_after``-th ``/clock`` message of a
        time (2: every first one is lost, as a best-effort message can be on a busy machine).
    :return: ``(node, answered stamps, answering flag list)``.
    """
    node = executor.add_node(Node(name, context=executor.executor.context))
    publisher = node.create_publisher(Float64MultiArray, '/effort_controller/commands', 10)
    answered, answering, heard = [], [True], {}

    def answer(msg: Clock) -> None:
        stamp = stamp_to_sec(msg.clock)
        heard[stamp] = heard.get(stamp, 0) + 1
        if answering[0] and heard[stamp] == hear_after:   # one answer per time
            time.sleep(delay(stamp))
            publisher.publish(Float64MultiArray(data=[0.5]))
            answered.append(stamp)

    node.create_subscription(Clock, '/clock', answer, 10)
    return node, answered, answering


def test_each_tick_waits_for_the_command_however_late_it_comes(executor):
    # as fast as possible, but every tick waits for the controller's answer, here slower
    # than the 0.2 s after which the driver used to step on (issue 14, case 9)
    # the controller listens before the plant starts, as the demo's mpc does: one that joins
    # a running plant first answers a backlog of old ticks (its /clock queue drops some)
    _, answered, answering = answering_controller(
        executor, 'slow_controller',
        lambda stamp: 0.3 if round(stamp * 500) % 25 == 0 else 0.002)
    driver = make_driver(executor, real_time_factor=0.0, command_wait=2.0)
    assert wait_for(lambda: len(answered) > 20, timeout=20.0)
    count = len(answered)
    assert wait_for(lambda: len(answered) > count + 120, timeout=30.0)
    ticks = np.round(np.array(answered[count:]) * 500).astype(int)
    assert np.all(np.diff(ticks) == 1), ticks   # one command per tick, none skipped
    assert sum(tick % 25 == 0 for tick in ticks) >= 4   # answers that took 0.3 s
    assert driver.commands.stats['command_waits_timed_out'] == 0
    # a controller that stays but goes quiet costs one safety timeout, logged as an error;
    # then the plant steps on without waiting
    answering[0] = False
    quiet = driver.stats['ticks']
    assert wait_for(lambda: driver.stats['ticks'] > quiet + 200, timeout=20.0)
    assert driver.commands.stats['command_waits_timed_out'] == 1
    assert not driver.commands.armed


def test_a_controller_already_listening_answers_every_tick_from_the_first(executor):
    # the ticks before a controller's first command would depend on how fast it answers
    _, answered, _ = answering_controller(executor, 'early_controller', lambda _: 0.01)
    driver = make_driver(executor, real_time_factor=0.0, command_wait=5.0)
    assert wait_for(lambda: len(answered) > 50, timeout=20.0)
    ticks = np.round(np.array(answered) * 500).astype(int)
    assert ticks[:50].tolist() == list(range(1, 51))
    assert driver.commands.stats['command_waits_timed_out'] == 0


def test_a_controller_that_left_is_not_waited_for(executor):
    # the safety timeout is long: what frees the plant is the controller leaving the graph
    driver = make_driver(executor, real_time_factor=0.0, command_wait=600.0)
    node, answered, _ = answering_controller(executor, 'leaving_controller', lambda _: 0.0)
    assert wait_for(lambda: len(answered) > 20, timeout=20.0)
    executor.nodes.remove(node)
    executor.executor.remove_node(node)
    node.destroy_node()
    gone, start = driver.stats['ticks'], time.monotonic()
    assert wait_for(lambda: driver.stats['ticks'] > gone + 200, timeout=20.0)
    assert time.monotonic() - start < 10.0
    assert driver.commands.stats['controller_lost'] == 1
    assert driver.commands.stats['command_waits_timed_out'] == 0


class FakeRefitPeer:
    """
    A slow identifier stand-in speaking the lockstep protocol.

    Every ``period`` simulated seconds its timer wakes a worker that "refits" for ``work_s``
    wall seconds, sampling the plant's time meanwhile, publishes a "model" and holds the
    plant at its next due time.  ``work_s`` = inf: a refit that never ends.
    """

    def __init__(self, executor, driver_ref, name, period, work_s) -> None:
        """Create the node, announce the first due time and start the worker."""
        self.node = executor.add_node(Node(
            name, context=executor.executor.context,
            parameter_overrides=parameter_overrides({'use_sim_time': True})))
        self.lockstep = LockstepPeer(self.node)
        self.model_pub = self.node.create_publisher(String, '~/model', ANNOUNCE_QOS)
        self.driver_ref, self.work_s = driver_ref, work_s
        self.refits = []   # (announced due time ns, plant times ns seen during the work)
        self.wake, self.stop = threading.Event(), threading.Event()
        self.timer = self.node.create_timer(period, self.wake.set)
        self.lockstep.hold_until_next_call(self.timer)
        self.thread = threading.Thread(target=self._work, daemon=True)
        self.thread.start()

    def _work(self) -> None:
        while not self.stop.is_set():
            if not self.wake.wait(0.05):
                continue
            self.wake.clear()
            due, seen = self.lockstep.state.until, []
            end = time.monotonic() + self.work_s
            while time.monotonic() < end and not self.stop.is_set():
                seen.append(round(self.driver_ref[0].plant.time * 1e9))
                time.sleep(0.01)
            if self.stop.is_set():
                return
            self.refits.append((due, seen))
            self.lockstep.publish(self.model_pub, String(data=f'model {len(self.refits)}'))
            self.lockstep.hold_until_next_call(self.timer)


def test_the_plant_holds_for_a_due_refit_and_for_its_model_to_be_taken(executor):
    # peers first, then the driver (it reads their latched announcements)
    driver_ref = [None]
    refitter = FakeRefitPeer(executor, driver_ref, 'fake_identifier', period=0.5, work_s=0.4)
    user = executor.add_node(Node('fake_mpc', context=executor.executor.context,
                                  parameter_overrides=parameter_overrides(
                                      {'use_sim_time': True})))
    user_peer, taken = LockstepPeer(user), []

    def take(msg: String) -> None:   # a slow model swap
        seen = []
        for _ in range(20):
            seen.append(round(driver_ref[0].plant.time * 1e9))
            time.sleep(0.01)
        taken.append((msg.data, seen))

    user.create_subscription(String, '/fake_identifier/model',
                             user_peer.taking('/fake_identifier/model', take), ANNOUNCE_QOS)
    driver_ref[0] = driver = make_driver(executor, real_time_factor=0.5)
    assert wait_for(lambda: len(taken) >= 3, timeout=30.0), (refitter.refits, taken)
    assert driver.peers.peers.keys() >= {'/fake_identifier', '/fake_mpc'}
    # every refit ran with the plant held exactly at its due time (0.5 s, 1.0 s, ...), and
    # each model was taken before the plant moved on
    for k, (due, seen) in enumerate(refitter.refits[:3]):
        assert due == (k + 1) * 500_000_000
        assert set(seen) == {due}, (k, sorted(set(seen)))
    for k, (text, seen) in enumerate(taken[:3]):
        assert text == f'model {k + 1}'
        assert set(seen) == {(k + 1) * 500_000_000}, (k, sorted(set(seen)))
    assert driver.commands.stats['command_waits_timed_out'] == 0
    # (the third hold is counted when it ends, just after the third model was taken)
    assert wait_for(lambda: driver.peers.stats['peer_holds'] >= 3)
    assert driver.peers.stats['peer_timeouts'] == 0
    refitter.stop.set()


def test_a_dead_or_stuck_peer_does_not_hang_the_plant(executor):
    driver_ref = [None]
    stuck = FakeRefitPeer(executor, driver_ref, 'stuck_identifier', period=0.2,
                          work_s=math.inf)
    driver_ref[0] = driver = make_driver(executor, real_time_factor=0.0, peer_timeout=600.0)
    # held at the refit that never ends
    assert wait_for(lambda: driver.plant.tick == 100, timeout=10.0)
    time.sleep(1.0)
    assert driver.plant.tick == 100
    # the peer dies (its node leaves the graph): the plant goes on within the grace period
    stuck.stop.set()
    executor.nodes.remove(stuck.node)
    executor.executor.remove_node(stuck.node)
    stuck.node.destroy_node()
    start = time.monotonic()
    assert wait_for(lambda: driver.plant.tick > 500, timeout=20.0)
    assert time.monotonic() - start < 10.0
    assert driver.peers.stats['peers_lost'] == 1 and driver.peers.stats['peer_timeouts'] == 0


def test_a_peer_that_never_finishes_ends_in_an_error_after_peer_timeout(executor):
    driver_ref = [None]
    stuck = FakeRefitPeer(executor, driver_ref, 'hung_identifier', period=0.2, work_s=math.inf)
    driver_ref[0] = driver = make_driver(executor, real_time_factor=0.0, peer_timeout=1.0)
    assert wait_for(lambda: driver.plant.tick > 500, timeout=20.0)
    assert driver.peers.stats['peer_timeouts'] == 1 and driver.peers.stats['peers_lost'] == 0
    stuck.stop.set()
