"""
The one timeline rule (:mod:`diffsim_ros.nodes.timeline`), driven through both gates.

Every rule test runs once through the ``joint_states`` gate and once through the pose gate:
the two must decide alike, because they share the rule's code.
"""

from types import SimpleNamespace

from builtin_interfaces.msg import Time
from diffsim_ros.nodes.convert import joint_state_msg, pose_msg, ThrottledLogger
from diffsim_ros.nodes.gates import StateGate, StateGateConfig
from diffsim_ros.nodes.pose_gate import PoseGate, PoseGateConfig
from diffsim_ros.nodes.timeline import TimelineConfig
import numpy as np
import pytest

SECOND = 1_000_000_000
PERIOD = 8_000_000   # 125 Hz: each gate takes it (the pose gate refuses below half 1/148 s)


def stamped(msg, stamp_ns):
    msg.header.stamp = Time(sec=stamp_ns // SECOND, nanosec=stamp_ns % SECOND)
    return msg


def make(kind, **config):
    """Return ``(gate, admit(stamp_ns, now_ns, z=0.0), log lines)`` of one gate kind."""
    lines = []
    log = ThrottledLogger(SimpleNamespace(warning=lines.append), period=2.0, clock=lambda: 0.0)
    if kind == 'joint_states':
        gate = StateGate(('a', 'b'), (-1.0, -1.0), (1.0, 1.0), (10.0, 10.0),
                         StateGateConfig(**config), log)

        def admit(stamp_ns, now_ns, z=0.0):
            return gate.admit(stamped(joint_state_msg(('a', 'b'), (z, 0.0), (0.0, 0.0)),
                                      stamp_ns), now_ns)
    else:
        gate = PoseGate(PoseGateConfig(**config), log, 'mocap/cube')

        def admit(stamp_ns, now_ns, z=0.0):
            T = np.eye(4)
            T[2, 3] = z
            return gate.admit(stamped(pose_msg(T, 'world'), stamp_ns), now_ns)
    return gate, admit, lines


GATES = ('joint_states', 'pose')


@pytest.mark.parametrize('kind', GATES)
def test_a_clock_that_jumps_back_starts_a_new_timeline_at_once(kind):
    gate, admit, lines = make(kind)
    t = 1000 * SECOND
    for k in range(3):
        assert admit(t + k * PERIOD, t + k * PERIOD).restart is False
    # the node's clock went back with the stamps (a simulation reset under use_sim_time)
    sample = admit(SECOND, SECOND)
    assert sample is not None and sample.restart and gate.timeline.restarts == 1
    assert admit(SECOND + PERIOD, SECOND + PERIOD).restart is False   # the new timeline goes on
    assert gate.refused['stamp_back'] == 0 and gate.values()['timeline_restarts'] == 1
    assert sum('time starts over' in line for line in lines) == 1


@pytest.mark.parametrize('kind', GATES)
def test_a_silent_stream_gives_way_to_enough_increasing_stamps_behind_it(kind):
    gate, admit, _ = make(kind, resync_time=0.5, resync_messages=10)
    t = 1000 * SECOND
    assert admit(t, t) is not None
    now = t
    for k in range(9):   # a driver restarting its counter: its stamps are refused at first
        now += 60_000_000
        assert admit(SECOND + k * PERIOD, now) is None
    assert gate.refused['stamp_back'] == 9 and gate.timeline.restarts == 0
    sample = admit(SECOND + 9 * PERIOD, now + 1_000_000)   # tenth, 0.54 s of silence
    assert sample is not None and sample.restart and gate.timeline.restarts == 1
    assert admit(SECOND + 10 * PERIOD, now + 2_000_000).restart is False
    assert admit(SECOND, now + 3_000_000) is None   # behind the new timeline: refused


@pytest.mark.parametrize('kind', GATES)
def test_no_peer_restarts_time_while_the_real_stream_lives(kind):
    gate, admit, _ = make(kind, resync_time=0.5, resync_messages=10)
    t = 1000 * SECOND
    assert admit(t - PERIOD, t - PERIOD) is not None
    for k in range(500):   # 4 s: hostile increasing stamps far behind, between real ones
        now = t + k * PERIOD
        assert admit(now - 500 * SECOND + k, now) is None
        assert admit(now, now) is not None
    assert gate.refused['stamp_back'] == 500 and gate.timeline.restarts == 0


@pytest.mark.parametrize('kind', GATES)
def test_a_new_timeline_needs_increasing_plausible_stamps(kind):
    gate, admit, _ = make(kind, resync_time=0.5, resync_messages=3)
    t = 1000 * SECOND
    assert admit(t, t) is not None
    now = t + SECOND   # silent long enough
    assert admit(2 * SECOND, now) is None
    assert admit(2 * SECOND, now) is None   # not increasing: the count starts again
    assert admit(2 * SECOND + PERIOD, now) is None
    assert admit(2 * SECOND + 2 * PERIOD, now, z=np.nan) is None   # implausible: not counted
    assert gate.refused['invalid'] == 1 and gate.timeline.restarts == 0
    assert admit(2 * SECOND + 3 * PERIOD, now).restart   # third of an increasing run


def test_the_rule_is_one_config_of_both_gates():
    for cls in (StateGateConfig, PoseGateConfig):
        assert issubclass(cls, TimelineConfig)
        with pytest.raises(ValueError, match='resync_messages'):
            cls(resync_messages=0)
        with pytest.raises(ValueError, match='resync_time'):
            cls(resync_time=0.0)


def test_the_first_pose_of_a_new_timeline_is_not_judged_against_the_old_pose():
    gate, admit, _ = make('pose')
    t = 1000 * SECOND
    for k in range(200):
        assert admit(t + k * PERIOD, t + k * PERIOD, z=0.1) is not None
    assert gate.values()['rate_hz'] == 126.0   # the last second of stamps, both ends
    # a reset simulation puts the object elsewhere: no jump, and the rate starts afresh
    sample = admit(SECOND, SECOND, z=1.5)
    assert sample.restart and gate.refused['jump'] == 0 and gate.values()['rate_hz'] == 1.0
    assert admit(SECOND + PERIOD, SECOND + PERIOD, z=3.0) is None   # then the checks hold
    assert gate.refused['jump'] == 1
