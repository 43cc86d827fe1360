"""The lockstep protocol: announcements, the hold rule, and peers that stay out of it."""

import json
import time

from diffsim_ros.nodes.convert import joint_state_msg, MessageError, sec_to_stamp
from diffsim_ros.nodes.lockstep import (holding, LockstepPeer, message_id, parse_announcement,
                                        PeerState, TOPIC)
from diffsim_ros.nodes.mpc import MpcNode
from diffsim_ros.nodes.params import parameter_overrides
import pytest
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data
from ros_helpers import wait_for
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray, String

pytest_plugins = ['ros_helpers']

MODEL = '/identifier/robot_description'


def announcement(**fields) -> str:
    """Return the JSON of a valid announcement with ``fields`` replaced."""
    return json.dumps({'node': '/identifier', 'until': 500_000_000, 'published': {},
                       'used': {}, **fields})


def test_an_announcement_round_trips():
    state = PeerState('/identifier', 2_500_000_000, {MODEL: 'ab12'}, {'/other': None})
    parsed = parse_announcement(state.to_json())
    assert parsed == state
    assert dict(parsed.published) == {MODEL: 'ab12'} and dict(parsed.used) == {'/other': None}


@pytest.mark.parametrize('text, reason', [
    ('{"node": ', 'not JSON'),
    ('[1, 2]', 'an object'),
    (announcement(extra=1), 'an object'),
    (json.dumps({'node': '/a', 'until': None, 'published': {}}), 'an object'),
    (announcement(node='identifier'), 'fully qualified'),
    (announcement(node=7), 'fully qualified'),
    (announcement(until=-1), 'until'),
    (announcement(until=0.5), 'until'),
    (announcement(until=True), 'until'),
    (announcement(until='1'), 'until'),
    (announcement(published={'relative/topic': 'ab'}), 'published'),
    (announcement(used={MODEL: 3}), 'used'),
    (announcement(used=[MODEL]), 'used'),
    (announcement(node='/' + 'x' * 5000), 'characters'),
])
def test_bad_announcements_are_refused(text, reason):
    with pytest.raises(MessageError, match=reason):
        parse_announcement(text)


def test_a_due_time_holds_the_ticks_after_it_only():
    peers = {'/identifier': PeerState('/identifier', 500_000_000)}
    assert holding(peers, 500_000_000) == {}   # the due tick itself is published
    assert list(holding(peers, 502_000_000)) == ['/identifier']
    assert holding({'/identifier': PeerState('/identifier', None)}, 10**12) == {}


def test_a_published_model_holds_until_its_user_took_it():
    source = PeerState('/identifier', None, {MODEL: 'new'})
    for taken, held in ((None, True), ('old', True), ('new', False)):
        user = PeerState('/mpc', None, {}, {MODEL: taken})
        reasons = holding({'/identifier': source, '/mpc': user}, 1)
        assert ('/mpc' in reasons) is held, (taken, reasons)
    # nothing published yet, or a topic nobody publishes: nothing to wait for
    user = PeerState('/mpc', None, {}, {MODEL: None})
    assert holding({'/identifier': PeerState('/identifier'), '/mpc': user}, 1) == {}
    assert holding({'/identifier': source,
                    '/mpc': PeerState('/mpc', None, {}, {'/elsewhere': None})}, 1) == {}


def test_message_ids_follow_the_content():
    assert message_id(String(data='<robot/>')) == message_id(String(data='<robot/>'))
    assert message_id(String(data='<robot/>')) != message_id(String(data='<robot />'))


def test_without_sim_time_a_peer_creates_and_announces_nothing(ros_context):
    node = Node('wall_clock_node', context=ros_context)
    try:
        peer = LockstepPeer(node)
        assert not peer.active
        assert TOPIC not in {publisher.topic_name for publisher in node.publishers}

        def callback(msg):
            return None
        assert peer.taking('/model', callback) is callback   # the subscription is unchanged
        publisher = node.create_publisher(String, '/model', 1)
        peer.publish(publisher, String(data='x'))
        timer = node.create_timer(1.0, callback)
        peer.hold_until_next_call(timer)
        assert peer.state == PeerState('/wall_clock_node')
    finally:
        node.destroy_node()


def test_with_sim_time_a_peer_announces_what_it_published_and_took(ros_context):
    node = Node('sim_node', context=ros_context,
                parameter_overrides=parameter_overrides({'use_sim_time': True}))
    try:
        peer = LockstepPeer(node)
        assert peer.active
        assert TOPIC in {publisher.topic_name for publisher in node.publishers}
        taken = []
        wrapped = peer.taking('/identifier/robot_description', taken.append)
        assert dict(peer.state.used) == {MODEL: None}
        wrapped(String(data='<robot name="a"/>'))
        assert taken and peer.state.used[MODEL] == message_id(String(data='<robot name="a"/>'))
        publisher = node.create_publisher(String, '~/model', 1)
        peer.publish(publisher, String(data='m'))
        assert dict(peer.state.published) == {'/sim_node/model': message_id(String(data='m'))}
        timer = node.create_timer(0.5, lambda: None)   # simulated clock at 0: due at 0.5 s
        peer.hold_until_next_call(timer)
        assert peer.state.until == 500_000_000
        assert parse_announcement(peer.state.to_json()) == peer.state
    finally:
        node.destroy_node()


def test_the_mpc_watchdog_runs_on_simulated_time(executor):
    # under use_sim_time a state goes stale after stale_timeout simulated seconds, however
    # long the wall clock waits meanwhile (a lockstep plant holding for a refit)
    context = executor.executor.context
    mpc = executor.add_node(MpcNode(context=context, parameter_overrides=parameter_overrides(
        {'robot': 'qube', 'controller': 'baseline', 'compile': False, 'use_sim_time': True,
         'stale_timeout': 0.1})))
    probe = executor.add_node(Node('sim_clock', context=context))
    clock = probe.create_publisher(Clock, '/clock', 10)
    states = probe.create_publisher(JointState, '/joint_states', qos_profile_sensor_data)

    def at(seconds: float) -> None:
        clock.publish(Clock(clock=sec_to_stamp(seconds)))
        assert wait_for(lambda: mpc.get_clock().now().nanoseconds == round(seconds * 1e9))

    commands = []
    probe.create_subscription(Float64MultiArray, '/effort_controller/commands',
                              lambda msg: commands.append(list(msg.data)), 10)
    at(1.0)
    assert wait_for(lambda: states.get_subscription_count() > 0)
    states.publish(joint_state_msg(('arm_joint', 'pendulum_joint'), [0.0, 0.1], [0.0, 0.0],
                                   None, 1.0))
    time.sleep(0.2)
    at(1.002)   # the command timer fires: a fresh state, control runs
    assert wait_for(lambda: not mpc.stale, timeout=10.0)
    time.sleep(0.5)   # five stale timeouts of wall time, none of simulated time
    sent = len(commands)
    at(1.05)
    assert wait_for(lambda: len(commands) > sent) and not mpc.stale
    at(1.2)   # 0.2 simulated seconds after the state: stale, the safe command goes out
    assert wait_for(lambda: mpc.stale)
    assert wait_for(lambda: commands[-1] == mpc.safe_command.tolist())
