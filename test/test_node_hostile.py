"""
Hostile input against the nodes (issue 14: text as a path, case 1; joint_states, 3-6).

And the rules of the joint_states gate.

The node tests run the nodes as a user does (``main()`` of the executable in a subprocess,
parameters on the command line) on real DDS; the hostile peer is this test process or a
spawned one.  The rule tests drive :class:`~diffsim_ros.nodes.gates.StateGate` directly.
"""

import gc
import math
import multiprocessing
import os
from pathlib import Path
import signal
import struct
import subprocess
import sys
import threading
import time

from builtin_interfaces.msg import Time
from diagnostic_msgs.msg import DiagnosticArray
from diffsim_ros import robots
from diffsim_ros.nodes.command_loop import (CollectorPauses, DeadlineLoop, freeze_heap,
                                            middleware_threads)
from diffsim_ros.nodes.convert import joint_state_msg, ThrottledLogger
from diffsim_ros.nodes.gates import REASONS, StateGate, StateGateConfig
from diffsim_ros.nodes.monitor import MODEL_QOS
from diffsim_ros.sim.parameters import nominal_model
import numpy as np
import pytest
from rcl_interfaces.msg import Log
import rclpy
import rclpy.executors
import rclpy.parameter
from rclpy.qos import qos_profile_sensor_data
from rclpy.serialization import serialize_message
from ros_helpers import realtime_process, settled, wait_for
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray, String

pytest_plugins = ['ros_helpers']

REPO = Path(__file__).resolve().parent.parent
JOINTS = robots.get('qube').joint_names
COMMANDS = '/effort_controller/commands'
LIMIT_V = 4.0          # the Qube's command limit (catalog)
SECOND = 1_000_000_000


# -- the gate's rules, no ROS graph ---------------------------------------------------------
class Silent:
    """A logger that records its lines."""

    def __init__(self):
        self.lines = []

    def warning(self, text):
        self.lines.append(text)


def make_gate(strict=True, **config):
    model = nominal_model('qube')
    log = ThrottledLogger(Silent(), period=2.0, clock=lambda: 0.0)
    return StateGate(model.joint_names, model.lower, model.upper, model.velocity_limit,
                     StateGateConfig(**config), log, strictly_increasing=strict), log


def msg_at(stamp_ns, q=(0.0, 0.0), qd=(0.0, 0.0)):
    msg = joint_state_msg(JOINTS, q, qd)
    msg.header.stamp = Time(sec=stamp_ns // SECOND, nanosec=stamp_ns % SECOND)
    return msg


def test_gate_refuses_future_stamps_without_adopting_them():
    gate, _ = make_gate()
    now = 1000 * SECOND
    assert gate.admit(msg_at(now), now) is not None
    assert gate.admit(msg_at(now + 1000 * SECOND), now + 1_000_000) is None
    assert gate.admit(msg_at(now + 2_000_000), now + 2_000_000) is not None   # not pinned
    later = now + 2_000_000
    assert gate.admit(msg_at(later + 101_000_000), later) is None      # > 0.1 s ahead
    assert gate.admit(msg_at(later + 99_000_000), later) is not None   # < 0.1 s ahead
    assert gate.refused['future_stamp'] == 2 and gate.accepted == 3


def test_gate_limits_with_margin_and_for_unlimited_joints():
    gate, _ = make_gate()
    model = nominal_model('qube')
    arm_upper, arm_speed = float(model.upper[0]), float(model.velocity_limit[0])
    travel = 2.0 * arm_upper
    t = 1000 * SECOND
    cases = [((arm_upper + 0.09 * travel, 0.0), (0.0, 0.0), None),   # inside the margin
             ((arm_upper + 0.11 * travel, 0.0), (0.0, 0.0), 'position_limit'),
             ((10.0, 0.0), (0.0, 0.0), 'position_limit'),
             ((1e300, 0.0), (0.0, 0.0), 'position_limit'),
             ((0.0, 1e6), (0.0, 0.0), None),   # a continuous joint: any angle (turns)
             ((0.0, 0.0), (1.9 * arm_speed, 0.0), None),
             ((0.0, 0.0), (-2.1 * arm_speed, 0.0), 'velocity_limit'),
             ((0.0, 0.0), (0.0, 199.0), None),   # no limit in the URDF: 2 x 100 rad/s
             ((0.0, 0.0), (0.0, 1e6), 'velocity_limit')]
    for k, (q, qd, reason) in enumerate(cases):
        before = dict(gate.refused)
        sample = gate.admit(msg_at(t + k * 1_000_000, q, qd), t + k * 1_000_000)
        assert (sample is None) == (reason is not None), (q, qd)
        if reason:
            assert gate.refused[reason] == before[reason] + 1, (q, qd, gate.refused)
    bad = msg_at(t + 20_000_000, (float('nan'), 0.0))
    assert gate.admit(bad, t + 20_000_000) is None and gate.refused['invalid'] == 1


def test_gate_order_duplicates_and_a_single_message_never_restarts_time():
    gate, log = make_gate(resync_time=0.5, resync_messages=10)
    t = 1000 * SECOND
    period = 2_000_000
    for k in range(5):
        assert gate.admit(msg_at(t + k * period), t + k * period) is not None
    now = t + 4 * period
    assert gate.admit(msg_at(now), now) is None and gate.refused['duplicate_stamp'] == 1
    # alternating hostile stamps far behind, between the real ones, for 2 s: no restart
    for k in range(5, 1005):
        now = t + k * period
        assert gate.admit(msg_at(now - 500 * SECOND + k), now) is None
        assert gate.admit(msg_at(now), now) is not None
    assert gate.refused['stamp_back'] == 1000 and gate.restarts == 0
    # throttled: one line per reason per 2 s of the logger's clock (frozen here)
    assert sum('stamp_back' in line for line in log._logger.lines) == 1
    lenient, _ = make_gate(strict=False)
    assert lenient.admit(msg_at(t), t) and lenient.admit(msg_at(t), t)   # repeated stamp


def test_gate_restarts_time_on_a_clock_jump_or_a_silent_stream_only():
    gate, _ = make_gate(resync_time=0.5, resync_messages=10)
    t = 1000 * SECOND
    assert gate.admit(msg_at(t), t) is not None
    # the node's own clock jumped back (simulation reset): the next message restarts time
    sample = gate.admit(msg_at(2_000_000), 2_000_000)
    assert sample is not None and sample.restart and gate.restarts == 1
    # a driver restarting its counter (no clock jump): the old stream silent for 0.5 s and
    # ten increasing messages behind it are needed
    now = 3 * SECOND
    assert gate.admit(msg_at(now), now) is not None
    for k in range(9):
        now += 60_000_000
        assert gate.admit(msg_at(SECOND + k * 1_000_000), now) is None
    sample = gate.admit(msg_at(SECOND + 9 * 1_000_000), now + 1_000_000)
    assert sample is not None and sample.restart and gate.restarts == 2
    assert gate.admit(msg_at(SECOND + 10 * 1_000_000), now + 2_000_000) is not None


def test_gate_status_is_recent_and_counts_every_reason():
    gate, _ = make_gate(refusal_hold=5.0)
    t = 1000 * SECOND
    assert gate.status(t) is None
    gate.admit(msg_at(t + 10 * SECOND), t)
    assert 'future_stamp: 1' in gate.status(t + 4 * SECOND)
    assert gate.status(t + 6 * SECOND) is None
    assert set(gate.values()) == {'refused', 'timeline_restarts'} | {
        f'refused/{reason}' for reason in REASONS}
    with pytest.raises(ValueError, match='max_stamp_lead'):
        StateGateConfig(max_stamp_lead=0.0)
    with pytest.raises(ValueError, match='resync_messages'):
        StateGateConfig(resync_messages=0)


# -- the nodes as executables ------------------------------------------------------------------
class NodeProcess:
    """A node's executable in a subprocess, output in a log file, stopped with SIGINT."""

    def __init__(self, module, params, log_path):
        argv = [sys.executable, '-c', f'from diffsim_ros.nodes.{module} import main; main()',
                '--ros-args']
        for name, value in params.items():
            argv += ['-p', f'{name}:={value}']
        env = dict(os.environ, PYTHONUNBUFFERED='1', PYTHONPATH=os.pathsep.join(
            [str(REPO)] + [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p]))
        self.log_path = log_path
        self._log = open(log_path, 'w')
        self.process = subprocess.Popen(argv, env=env, stdout=self._log,
                                        stderr=subprocess.STDOUT)

    def output(self):
        return Path(self.log_path).read_text()

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(15.0)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


@pytest.fixture
def launch(ros_domain, tmp_path):
    started = []

    def start(module, **params):
        node = NodeProcess(module, params, tmp_path / f'{module}_{len(started)}.log')
        started.append(node)
        return node
    yield start
    for node in started:
        node.stop()


class Observer:
    """The robot's side: real joint_states (a spawned driver), commands and diagnostics seen."""

    def __init__(self, executor, node_name):
        self.node = executor.add_node(rclpy.create_node('observer',
                                                        context=executor.executor.context))
        self.states = self.node.create_publisher(JointState, 'joint_states',
                                                 qos_profile_sensor_data)
        self.commands = []   # (DDS receive time ns, value)
        self.diagnostics = []   # (level, message, {key: value}) of node_name
        self.warnings = []   # /rosout lines of node_name at WARN or above
        self._name = node_name
        self.node.create_subscription(Float64MultiArray, COMMANDS, self._on_command, 1000)
        self.node.create_subscription(DiagnosticArray, '/diagnostics', self._on_diagnostics, 100)
        self.node.create_subscription(Log, '/rosout', self._on_log, 1000)
        # the driver runs in its own real-time process, as a robot's does: a thread of this
        # process, busy with the observer's callbacks, paused for 0.1-0.3 s on a loaded
        # machine and the mpc rightly went stale
        context = multiprocessing.get_context('spawn')
        self.real, self._stop = context.Event(), context.Event()
        self._driver = context.Process(target=_driver_main, args=(self.real, self._stop),
                                       daemon=True)
        self._driver.start()

    def _on_command(self, msg, info):
        self.commands.append((info['received_timestamp'], msg.data[0]))

    def _on_diagnostics(self, msg):
        for status in msg.status:
            if status.name.startswith(self._name):
                self.diagnostics.append((status.level, status.message,
                                         {v.key: v.value for v in status.values}))

    def _on_log(self, msg):
        if msg.name == self._name and msg.level >= Log.WARN:
            self.warnings.append((time.monotonic(), msg.msg))

    def wait_commands(self, until_ns):
        """Wait until a command received after ``until_ns`` (DDS time) was processed."""
        return wait_for(lambda: self.commands and self.commands[-1][0] > until_ns,
                        (until_ns - time.time_ns()) * 1e-9 + 10.0)

    def latest(self, key):
        return self.diagnostics[-1][2].get(key) if self.diagnostics else None

    def close(self):
        self._stop.set()
        self._driver.join(timeout=10.0)


def _driver_main(real, stop):
    """Body of the driver: once ``real`` is set, one state at 500 Hz, wall-clock stamps."""
    realtime_process()
    context = rclpy.Context()
    rclpy.init(context=context)
    node = rclpy.create_node('driver', context=context)
    publisher = node.create_publisher(JointState, 'joint_states', qos_profile_sensor_data)
    while not real.wait(0.05):
        if stop.is_set():
            break
    next_time = time.monotonic()
    while not stop.is_set():
        publisher.publish(joint_state_msg(JOINTS, (0.0, 0.01), (0.0, 0.0), stamp=time.time()))
        next_time += 0.002
        time.sleep(max(0.0, next_time - time.monotonic()))
    node.destroy_node()
    rclpy.shutdown(context=context)


@pytest.fixture
def observer(executor):
    made = []

    def make(node_name):
        made.append(Observer(executor, node_name))
        return made[-1]
    yield make
    for item in made:
        item.close()


def start_mpc(launch, **params):
    # the Qube's baseline (swing-up + LQR) at the 500 Hz driver rate, native model steps
    return launch('mpc', robot='qube', controller='baseline', compile='false',
                  diagnostics_period=0.2, **params)


def wait_running(observer, node, timeout=90.0):
    """Wait until the node's diagnostics say it runs on the observer's states."""
    ok = wait_for(lambda: observer.diagnostics and observer.diagnostics[-1][0] == b'\x00'
                  and observer.latest('stale') == 'False', timeout, 0.05)
    assert ok, (observer.diagnostics[-1:], node.output()[-3000:])


def hostile(states):
    """
    Publish ``[(delay s, stamp offset s, q, qd)]`` from a fresh (spawned) process.

    :return: ``(first, last)`` wall-clock ns of the first and last publication; the process
        ends by itself.
    """
    context = multiprocessing.get_context('spawn')
    sent = context.Queue()
    context.Process(target=_hostile_main, args=(states, sent), daemon=True).start()
    return sent.get(timeout=60.0)


def _hostile_main(states, sent):
    """Body of the hostile process: one context, one publisher, then the messages."""
    realtime_process()   # the counts below assume its 5 ms pace holds on a loaded machine
    context = rclpy.Context()
    rclpy.init(context=context)
    node = rclpy.create_node('peer', context=context)
    publisher = node.create_publisher(JointState, 'joint_states', qos_profile_sensor_data)
    deadline = time.monotonic() + 10.0
    while publisher.get_subscription_count() == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)   # discovery completes in both directions
    first = time.time_ns()
    for delay, offset, q, qd in states:
        time.sleep(delay)
        publisher.publish(joint_state_msg(JOINTS, q, qd, stamp=time.time() + offset))
    sent.put((first, time.time_ns()))
    time.sleep(0.5)
    node.destroy_node()
    rclpy.shutdown(context=context)


def warned(observer, since, word):
    """Return whether a WARN status mentioning ``word`` came after index ``since``."""
    return any(level == b'\x01' and word in message
               for level, message, _ in observer.diagnostics[since:])


def at_limit(commands):
    return [u for _, u in commands if abs(u) >= LIMIT_V * 0.999]


def longest_pause_s(observer, since):
    """
    Return the mpc's longest time between two command ticks in its diagnostics after ``since``.

    The cases below ask that commands keep flowing (a FIFO froze them for 5 s); each
    diagnostics message holds the longest gap of the node's last second, so this waits for a
    second more of them. The node's own measure, not this process's receive times: on a
    loaded machine this process alone paused 0.33-0.41 s (its DDS thread, or the mpc's
    10-deep reliable history overwritten meanwhile), with the mpc's loop on time.

    :return: seconds.
    """
    count = len(observer.diagnostics)
    assert wait_for(lambda: len(observer.diagnostics) >= count + 6, 10.0)   # 0.2 s period
    return max(float(values['command_gap_max_ms']) for _, _, values
               in observer.diagnostics[since:]) * 1e-3


def test_case3_a_future_stamp_never_pins_the_mpc(launch, observer):
    mpc = start_mpc(launch)
    robot = observer('mpc')
    robot.real.set()
    wait_running(robot, mpc)
    since = len(robot.diagnostics)
    back = int(robot.latest('refused/stamp_back'))
    # both states would put the command at the -4 V limit, were they used; the first one is
    # plausible (only its stamp, 1000 s ahead, is wrong)
    # each three times: a best-effort copy can be overwritten unseen on a loaded machine
    injected = (((1.5, 0.3), (20.0, 0.0)), ((0.0, 0.0), (0.0, 1e6)))
    first, last = hostile([(0.02, 1000.0, q, qd) for q, qd in injected for _ in range(3)])
    assert wait_for(lambda: 1 <= int(robot.latest('refused/future_stamp')) <= 6, 5.0), \
        robot.diagnostics[-1]
    assert wait_for(lambda: warned(robot, since, 'future_stamp'), 5.0)
    # the real states keep coming: 1 s of commands after the injection
    assert robot.wait_commands(last + 1e9), mpc.output()[-3000:]
    after = [(t, u) for t, u in robot.commands if first <= t <= last + 1e9]
    assert longest_pause_s(robot, since) < 0.25 and not at_limit(after), at_limit(after)[:5]
    assert all(abs(u - after[-1][1]) < 0.2 for _, u in after[-20:])   # the real state's law
    values = robot.diagnostics[-1][2]
    assert values['stale'] == 'False' and values['timeline_restarts'] == '0'
    assert float(values['state_age_s']) < 0.1
    # had the future stamp been adopted, every real state after it would be refused as behind
    assert int(values['refused/stamp_back']) == back, values


def test_case3_alternating_stamps_neither_empty_the_window_nor_flood_the_log(launch,
                                                                             observer):
    identifier = launch('identifier', robot='qube', window=2.0, min_window=1.0,
                        refit_period=1000.0, diagnostics_period=0.25)
    robot = observer('identifier')
    robot.real.set()
    assert wait_for(lambda: robot.latest('window_fill') is not None
                    and float(robot.latest('window_fill')) > 0.9, 60.0, 0.05), \
        (robot.diagnostics[-1:], identifier.output()[-3000:])
    robot.warnings.clear()
    since = len(robot.diagnostics)
    before = refusals(robot)
    # one far-future stamp, then 2 s of stamps alternately far behind and far ahead, while the
    # real stream goes on at 500 Hz
    first, last = hostile([(0.0, 1000.0, (0.0, 0.0), (0.0, 0.0))] + [
        (0.005, -50.0 if k % 2 else 1000.0, (0.0, 0.0), (0.0, 0.0)) for k in range(400)])
    elapsed = (last - first) * 1e-9
    # joint_states are best effort: on a loaded machine DDS may drop some hostile messages
    # before the node sees them, so the counts are bounded, not exact. Had one future stamp
    # been adopted, the real states after it would be refused as stamp_back by the hundred.
    future, back = (after - b for after, b in zip(settled(lambda: refusals(robot)), before))
    assert 100 < future <= 201 and 100 < back <= 200, (future, back)
    assert warned(robot, since, 'refused')
    values = robot.diagnostics[-1][2]
    assert values['timeline_restarts'] == '0'
    assert float(values['window_fill']) > 0.9   # the window was never emptied
    # one line per reason per 2 s (the restart key never fires)
    lines = [text for _, text in robot.warnings]
    assert len(lines) <= 2 * (math.ceil(elapsed / 2.0) + 1), lines


def refusals(observer):
    """Return the identifier's ``(future_stamp, stamp_back)`` refusals in its diagnostics."""
    values = observer.diagnostics[-1][2]
    return int(values['refused/future_stamp']), int(values['refused/stamp_back'])


def test_case4_absurd_states_are_refused_counted_and_flagged(launch, observer):
    mpc = start_mpc(launch)
    robot = observer('mpc')
    robot.real.set()
    wait_running(robot, mpc)
    since = len(robot.diagnostics)
    # each three times: joint_states are best effort, and the mpc keeps only a command
    # period's worth of them, so on a loaded machine one copy may be overwritten unseen
    # (neither used nor counted)
    absurd = [((1e300, -1e300), (1e300, 1e300)),   # finite, absurd: a position refusal
              ((0.0, 0.0), (0.0, 1e6)),            # 1e6 rad/s: a velocity refusal
              ((10.0, 0.0), (0.0, 0.0))]           # 10 rad on +-2 rad: a position refusal
    first, last = hostile([(0.02, 0.0, q, qd) for q, qd in absurd for _ in range(3)])

    def counted():
        values = robot.diagnostics[-1][2]
        return (int(values['refused/position_limit']), int(values['refused/velocity_limit']))
    assert wait_for(lambda: counted()[0] >= 1 and counted()[1] >= 1, 5.0), \
        robot.diagnostics[-1]
    time.sleep(0.5)
    assert counted()[0] <= 6 and counted()[1] <= 3, counted()   # never counted twice
    assert wait_for(lambda: warned(robot, since, 'position_limit'), 5.0)
    assert robot.wait_commands(last + 0.5e9), mpc.output()[-3000:]
    after = [(t, u) for t, u in robot.commands if first <= t <= last + 0.5e9]
    assert longest_pause_s(robot, since) < 0.25 and not at_limit(after), at_limit(after)[:5]
    values = robot.diagnostics[-1][2]
    assert values['stale'] == 'False' and float(values['state_age_s']) < 0.1
    assert 'refused' in mpc.output()


def test_case5_a_10khz_burst_leaves_the_500hz_command_rate(launch, observer):
    mpc = start_mpc(launch)
    seconds, rate, burst = 2.0, 500.0, 10_000.0
    # the recorder and the flood start beside the node (spawning takes seconds)
    context = multiprocessing.get_context('spawn')
    record, window, go, done = (context.Queue(), context.Queue(), context.Event(),
                                context.Event())
    recorder = context.Process(target=_record_main, args=(done, record))
    flood = context.Process(target=_flood_main, args=(seconds, burst, go, window))
    recorder.start()
    flood.start()
    robot = observer('mpc')
    robot.real.set()
    wait_running(robot, mpc)
    assert record.get(timeout=60.0) == 'ready'
    time.sleep(1.0)   # calm first, for comparison
    go.set()
    start_ns, end_ns, sent = window.get(timeout=60.0)
    done.set()
    received = np.array(record.get(timeout=60.0))
    flood.join(10.0)
    recorder.join(10.0)
    # The burst must really flood: at least five states per command period, so that the
    # node's queue (the driver's states of one period and two more, 3) overflows in every
    # period.  The flood is a Python publisher paced to 10 kHz at normal priority; on 2
    # cores kept busy it sent 4700-10000 Hz.
    flood_hz = sent / ((end_ns - start_ns) * 1e-9)
    print(f'the flood sent {sent} states at {flood_hz:.0f} Hz')
    if flood_hz < 5.0 * rate:
        pytest.skip(f'the flooding process reached only {flood_hz:.0f} Hz on this machine '
                    f'(the case needs {5.0 * rate:.0f} Hz or more, {burst:.0f} asked)')
    stats = {}
    for name, times in (('calm', received[received < start_ns]),
                        ('burst', received[(received >= start_ns) & (received <= end_ns)])):
        gaps_ms = np.diff(times) * 1e-6
        stats[name] = ((len(times) - 1) / ((times[-1] - times[0]) * 1e-9),
                       np.percentile(gaps_ms, 99), gaps_ms.max())
        print('{}: {:.1f} Hz, gap p99 {:.2f} ms, max {:.2f} ms'.format(name, *stats[name]),
              f'at {(times[np.argmax(gaps_ms)] - start_ns) * 1e-9:.3f} s from the burst start')
    # the node's own account of its slowest moments: whose wait each was (command_loop.py)
    waits = {key: max(float(values[key]) for _, _, values in robot.diagnostics if key in values)
             for key in ('command_gap_max_ms', 'command_late_max_ms', 'command_tick_max_ms',
                         'gc_pause_max_ms')}
    node_side = ', '.join(f'{key} {value:.2f}' for key, value in waits.items())
    print(f"refused {robot.latest('refused')}: stamp_back {robot.latest('refused/stamp_back')}")
    print(f'node side, longest in a diagnostics period: {node_side}; missed deadlines '
          f'{robot.latest("missed_deadlines")}, inline solves skipped '
          f'{robot.latest("inline_solves_skipped")} of {robot.latest("commands")} commands')
    if robot.latest('realtime_priority') != 'True':
        pytest.skip('the command thread got no real-time priority (SCHED_FIFO; ulimit -r is 0 '
                    'for this user): a driver-rate loop on a busy machine needs it, as '
                    'ros2_control does')
    # start-up's heap is frozen (freeze_heap): a collection never walks the imports again.
    # Unfrozen, a full collection held the GIL 170-210 ms; frozen, the longest seen here was
    # 0.3-1.6 ms (wall time, on 2 busy cores), so five periods tell the two apart.
    period_ms = 1e3 / rate
    assert waits['gc_pause_max_ms'] <= 5.0 * period_ms, node_side
    # The burst costs the command rate nothing, whatever the machine holds without it: the
    # rate and the p99 gap are judged against the calm second before it (same machine, same
    # load).  The loop this test was written against lost 70 % of the rate and added 20-30 ms
    # to the p99 gap in a burst; the polled, budgeted loop lost at most 4.5 % and 2.3 ms,
    # at load 8-10 in a CI run beside a benchmark (calm 477 Hz, p99 8.5 ms).  The bounds, 10 %
    # of the rate and two periods, sit between the two.
    (calm, calm_p99, _), (burst, burst_p99, _) = stats['calm'], stats['burst']
    assert burst >= min(calm, rate) - 0.10 * rate, stats
    assert burst_p99 <= max(calm_p99, 5.0 * period_ms) + 2.0 * period_ms, stats
    if calm < 0.95 * rate:
        pytest.skip(f'this machine held {calm:.0f} Hz without any burst (node side: '
                    f'{node_side}), so the 500 Hz case cannot be staged here; the burst '
                    f'left {burst:.0f} Hz')
    # Before the command thread: 141-159 Hz with a p99 gap of 22-34 ms in the burst.  With
    # it, on 2 busy cores (load 4-6), 493-500 Hz and 3.8-6.6 ms, the calm second 494-501 Hz.
    # After the burst the node's own count is back where the calm second was.
    assert wait_for(lambda: float(robot.latest('command_rate_hz')) >= calm - 0.10 * rate,
                    5.0), robot.latest('command_rate_hz')


def _record_main(done, queue):
    """Body of the recording process: DDS receive times of the commands until ``done``."""
    realtime_process()
    context = rclpy.Context()
    rclpy.init(context=context)
    node = rclpy.create_node('command_recorder', context=context)
    received = []
    node.create_subscription(Float64MultiArray, COMMANDS,
                             lambda msg, info: received.append(info['received_timestamp']), 1000)
    executor = rclpy.executors.SingleThreadedExecutor(context=context)
    executor.add_node(node)
    deadline = time.monotonic() + 10.0
    while len(received) < 10 and time.monotonic() < deadline:
        executor.spin_once(timeout_sec=0.05)
    queue.put('ready')
    while not done.is_set():
        executor.spin_once(timeout_sec=0.05)
    queue.put(received)
    node.destroy_node()
    rclpy.shutdown(context=context)


def _flood_main(seconds, rate_hz, go, window):
    """Body of the flooding process: valid states at ``rate_hz`` for ``seconds`` after ``go``."""
    # At normal priority, as a misbehaving process on the robot's computer would be.  At
    # real-time priority its loop, busy all the time, got every real-time thread of its core
    # stopped for 50 ms a second by the kernel (its fair server), the mpc's command thread
    # among them: a 50 ms gap in every burst.  Each state is the serialized message with its
    # stamp written in place (CDR: the stamp follows the 4-byte encapsulation header):
    # building messages, it sent 2300-3100 Hz at normal priority on 2 busy cores.
    context = rclpy.Context()
    rclpy.init(context=context)
    node = rclpy.create_node('flood', context=context)
    publisher = node.create_publisher(JointState, 'joint_states', qos_profile_sensor_data)
    deadline = time.monotonic() + 10.0
    while publisher.get_subscription_count() == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    message = bytearray(serialize_message(joint_state_msg(JOINTS, (0.0, 0.01), (0.0, 0.0))))
    go.wait(60.0)
    start_ns, start, sent = time.time_ns(), time.monotonic(), 0
    while time.monotonic() - start < seconds:
        due = int((time.monotonic() - start) * rate_hz)
        while sent < due:
            now = time.time_ns()
            struct.pack_into('<iI', message, 4, now // SECOND, now % SECOND)
            publisher.publish(bytes(message))
            sent += 1
        time.sleep(0.0002)
    window.put((start_ns, time.time_ns(), sent))
    node.destroy_node()
    rclpy.shutdown(context=context)


def test_case6_the_identifier_keeps_every_sample_of_an_exact_1khz_stream(launch, observer):
    identifier = launch('identifier', robot='qube', window=5.0, min_window=1.0,
                        min_sample_interval=0.001, refit_period=1000.0,
                        diagnostics_period=0.25)
    robot = observer('identifier')
    assert wait_for(lambda: robot.diagnostics, 60.0, 0.05), identifier.output()[-3000:]
    count, period = 1500, 1_000_000
    base = (time.time_ns() // SECOND - 3) * SECOND + 123_456_789   # in the past: not ahead
    # float epoch seconds of these stamps differ by 1 ms - 1e-7 s about 40 % of the time
    diffs = np.diff([(base + k * period) * 1e-9 for k in range(count)])
    assert np.mean(diffs < 1e-3) > 0.1
    start = time.monotonic()
    for k in range(count):
        stamp = base + k * period
        msg = joint_state_msg(JOINTS, (0.1, 0.2), (0.0, 0.0))
        msg.header.stamp = Time(sec=stamp // SECOND, nanosec=stamp % SECOND)
        robot.states.publish(msg)
        time.sleep(max(0.0, start + (k + 1) * 1e-3 - time.monotonic()))

    def counts():
        values = robot.diagnostics[-1][2]
        return tuple(int(values[key]) for key in ('received', 'decimated', 'window_samples',
                                                  'refused'))
    # best effort: on a loaded machine DDS may drop some before the node sees them; every
    # one it saw is kept (none decimated for a stamp 1e-7 s short of the interval)
    received, decimated, kept, refused = settled(counts)
    assert received > count // 2, received
    assert (decimated, kept, refused) == (0, received, 0), counts()


def test_deadline_loop_ticks_once_per_simulated_deadline_and_follows_a_reset(executor):
    context = executor.executor.context
    node = executor.add_node(rclpy.create_node(
        'paced', context=context, parameter_overrides=[
            rclpy.parameter.Parameter('use_sim_time', value=True)]))
    source = executor.add_node(rclpy.create_node('clock_source', context=context))
    clock = source.create_publisher(Clock, '/clock', 10)
    ticks = []
    loop = DeadlineLoop(node, 0.002, lambda: ticks.append(node.get_clock().now().nanoseconds),
                        'test-loop', priority=50)
    try:
        assert wait_for(lambda: clock.get_subscription_count() > 0)
        assert not loop.realtime   # simulated time: no real-time scheduling
        for k in list(range(1, 51)) + list(range(1, 11)):   # then a reset to t = 0
            count = len(ticks)
            clock.publish(Clock(clock=Time(sec=0, nanosec=k * 2_000_000 + 10)))
            assert wait_for(lambda: len(ticks) == count + 1, 5.0), (k, ticks[-3:])
        time.sleep(0.1)
        assert len(ticks) == 60 and loop.missed == 0   # one tick per step, none in between
        assert ticks[49] == 50 * 2_000_000 + 10 and ticks[-1] == 10 * 2_000_000 + 10
    finally:
        loop.stop()


def test_deadline_loop_serves_a_tick_whose_time_came_while_it_ticked(executor):
    # a lockstep plant that receives a tick's command steps at once; on a loaded machine the
    # loop's thread read the next tick's time after its own tick, took its next deadline from
    # that reading, skipped that tick, and the plant waited 10 s for its command
    context = executor.executor.context
    node = executor.add_node(rclpy.create_node(
        'raced', context=context, parameter_overrides=[
            rclpy.parameter.Parameter('use_sim_time', value=True)]))
    source = executor.add_node(rclpy.create_node('plant_clock', context=context))
    clock = source.create_publisher(Clock, '/clock', 10)
    ticks = []

    def tick():
        now = node.get_clock().now().nanoseconds
        ticks.append(now)
        if len(ticks) == 1:   # the plant steps before this thread reads the clock again
            clock.publish(Clock(clock=Time(sec=0, nanosec=now + 2_000_000)))
            wait_for(lambda: node.get_clock().now().nanoseconds == now + 2_000_000, 5.0)
    assert wait_for(lambda: clock.get_subscription_count() > 0)
    clock.publish(Clock(clock=Time(sec=0, nanosec=2_000_000)))
    assert wait_for(lambda: node.get_clock().now().nanoseconds == 2_000_000, 5.0)
    loop = DeadlineLoop(node, 0.002, tick, 'raced-loop')
    try:
        clock.publish(Clock(clock=Time(sec=0, nanosec=4_000_000)))
        assert wait_for(lambda: len(ticks) >= 2, 5.0), ticks
        assert ticks[:2] == [4_000_000, 6_000_000]
    finally:
        loop.stop()


def _policy(tid):
    """Return ``(policy without the reset-on-fork flag, priority)`` of a thread."""
    return (os.sched_getscheduler(tid) & ~os.SCHED_RESET_ON_FORK,
            os.sched_getparam(tid).sched_priority)


def test_deadline_loop_raises_the_threads_a_tick_waits_on_and_gives_them_back(executor):
    # measured on 2 cores at load 9-18: the real-time command thread waited 6-139 ms for the
    # GIL held by a preempted normal-priority thread (the executor's, the model gate's
    # 10 Hz poll) and 17-90 ms on Fast DDS locks held the same way (command_loop.py)
    node = executor.add_node(rclpy.create_node('raising', context=executor.executor.context))
    started, child, stop = threading.Event(), [], threading.Event()
    request = threading.Event()

    def helper():
        started.set()
        request.wait(10.0)   # then start a thread of its own, as a raised thread may
        thread = threading.Thread(target=stop.wait, args=(10.0,))
        thread.start()
        child.append(thread.native_id)
        stop.wait(10.0)
    helper_thread = threading.Thread(target=helper)
    helper_thread.start()
    started.wait(5.0)
    tid = helper_thread.native_id
    before = _policy(tid)
    # the middleware's threads when the loop starts; other nodes of this process may start
    # more at any time, which keep normal scheduling (not asserted on)
    middleware = middleware_threads()
    loop = DeadlineLoop(node, 0.002, lambda: None, 'raising-loop', priority=30)
    if not wait_for(lambda: loop.realtime, 2.0):
        loop.stop()
        request.set()
        stop.set()
        pytest.skip('the loop got no real-time priority (SCHED_FIFO refused: ulimit -r 0)')
    try:
        middleware = [t for t in middleware if t in set(middleware_threads())]   # alive
        assert middleware and set(middleware) <= set(loop.raised)   # Fast DDS's dds.* threads
        assert all(_policy(t) == (os.SCHED_FIFO, 29) for t in middleware)
        assert _policy(tid) == before   # not a helper yet
        loop.add_helper(tid)
        assert _policy(tid) == (os.SCHED_FIFO, 29)
        request.set()
        assert wait_for(lambda: child, 5.0)
        assert _policy(child[0]) == (os.SCHED_OTHER, 0)   # not inherited: reset on fork
    finally:
        loop.stop()
        stop.set()
    assert _policy(tid) == before and not loop.raised
    assert all(_policy(t) == (os.SCHED_OTHER, 0) for t in middleware_threads()), [
        (t, _policy(t), t in middleware) for t in middleware_threads()]
    helper_thread.join(5.0)


def test_deadline_loop_reports_its_busy_share_lateness_and_waits(executor):
    # what the mpc node budgets its inline solve by (nodes/mpc.py INLINE_BUSY_LIMIT): a
    # 2 ms loop whose ticks sleep 1.5 ms is busy about three quarters of the time, and one
    # that does nothing is not
    node = executor.add_node(rclpy.create_node('budget', context=executor.executor.context))
    seen, loops = [], []

    def tick():
        time.sleep(0.0015)
        if loops:
            seen.append(loops[0].lateness())
    loop = DeadlineLoop(node, 0.002, tick, 'busy-loop')
    loops.append(loop)
    try:
        time.sleep(1.0)
    finally:
        loop.stop()
    busy = loop.busy()
    _, longest = loop.waits()
    assert 0.6 <= busy <= 1.0, busy
    assert longest >= 1.5 and loop.waits() == (0.0, 0.0)   # read, then started over
    assert seen and min(seen) >= 0.0015   # asked inside a tick: after its 1.5 ms sleep
    assert loop.lateness() == 0.0   # outside a tick
    idle = DeadlineLoop(node, 0.002, lambda: None, 'idle-loop')
    try:
        time.sleep(1.0)
        assert idle.busy() < 0.3, idle.busy()
    finally:
        idle.stop()


def test_collector_pauses_are_measured_and_the_frozen_heap_is_not_walked():
    pauses = CollectorPauses.shared()
    assert CollectorPauses.shared() is pauses   # one per process
    pauses.take_longest_ms()
    garbage = [[] for _ in range(200_000)]
    for item in garbage:
        item.append(item)   # cycles only the collector frees
    del garbage, item
    gc.collect()
    walked = pauses.take_longest_ms()
    assert walked > 0.0 and pauses.take_longest_ms() == 0.0
    kept = [[] for _ in range(200_000)]
    frozen_before = gc.get_freeze_count()
    freeze_heap()
    try:
        assert gc.get_freeze_count() >= frozen_before + len(kept)
        # Building `kept` triggered collections of the whole (not yet frozen) heap: a CI
        # worker that had imported many test files measured 800 ms for one.  Drop them.
        pauses.take_longest_ms()
        gc.collect()
        # the 200 000 lists are not walked again: a fraction of the walk, even on a busy core
        assert pauses.take_longest_ms() < 0.25 * walked
    finally:
        gc.unfreeze()


def _rss_mb(pid):
    for line in Path(f'/proc/{pid}/status').read_text().splitlines():
        if line.startswith('VmRSS:'):
            return int(line.split()[1]) / 1024.0
    return math.nan


def test_case1_text_on_the_model_topic_is_never_opened_as_a_path(launch, observer, tmp_path):
    # issue 14, case 1: a FIFO froze the mpc for 5 s and /dev/zero grew it to 1.8 GB, when
    # a URDF string that did not start with '<' was opened as a file
    mpc = start_mpc(launch)
    robot = observer('mpc')
    robot.real.set()
    wait_running(robot, mpc)
    fifo = tmp_path / 'model.urdf'
    os.mkfifo(fifo)
    publisher = robot.node.create_publisher(String, '/identifier/model', MODEL_QOS)
    assert wait_for(lambda: publisher.get_subscription_count() > 0, 10.0)
    before = _rss_mb(mpc.process.pid)
    since = len(robot.diagnostics)
    texts = ('/dev/zero', str(fifo), robots.urdf_string('qube'), str(robots.urdf_path('qube')))
    for text in texts:
        publisher.publish(String(data=text))
        time.sleep(0.1)
    assert wait_for(lambda: robot.latest('models_rejected') == str(len(texts)), 60.0), \
        (robot.diagnostics[-1:], mpc.output()[-2000:])
    # commands never stopped: up to 1 s after the last text, no gap of a quarter second
    assert robot.wait_commands(time.time_ns() + 1e9), mpc.output()[-3000:]
    assert longest_pause_s(robot, since) < 0.25
    assert _rss_mb(mpc.process.pid) < before + 50.0
    assert mpc.process.poll() is None
    assert robot.latest('models_accepted') == '0', robot.diagnostics[-1][2]
