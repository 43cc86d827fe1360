"""The mpc node over real DDS: finite commands, fuzzed input, stale watchdog, model updates."""

import json
import math
import threading
import time

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from diffsim_ros import robots
from diffsim_ros.control.controller import make_controller
from diffsim_ros.nodes.mpc import INLINE_MIN_SOLVE_HZ, MpcConfig, MpcNode
from diffsim_ros.robots.message import model_message
from diffsim_ros.sim.parameters import nominal_model
import pytest
from rcl_interfaces.msg import Log
import rclpy
from rclpy.parameter import Parameter
from rclpy.qos import DurabilityPolicy, qos_profile_sensor_data, QoSProfile
from ros_helpers import wait_for
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray, String
import torch

pytest_plugins = ['ros_helpers']
pytestmark = pytest.mark.ros

ROBOT = 'qube'
JOINTS = robots.get(ROBOT).joint_names
COMMANDS = '/effort_controller/commands'
# Lenient timing: the test machine may be shared and slow.
STALE_TIMEOUT = 0.4


def make_mpc(context, **overrides):
    # Uncompiled unless a test asks: compiling takes about 10 s on a loaded machine.
    params = {'robot': ROBOT, 'controller': 'ilqr', 'horizon': 10, 'iterations': 1,
              'control_rate': 20.0, 'command_rate': 100.0, 'stale_timeout': STALE_TIMEOUT,
              'diagnostics_period': 0.2, 'compile': False, **overrides}
    return MpcNode(context=context, parameter_overrides=[
        Parameter(name, value=value) for name, value in params.items()])


def state_msg(q=(0.0, 0.01), qd=(0.0, 0.0), names=JOINTS, stamp=None):
    msg = JointState(name=list(names), position=list(q), velocity=list(qd))
    if stamp is None:
        stamp = time.time()
    msg.header.stamp.sec, msg.header.stamp.nanosec = int(stamp), int((stamp % 1.0) * 1e9)
    return msg


class Robot:
    """Test harness: publishes joint_states in a thread, records commands and diagnostics."""

    def __init__(self, context, executor):
        self.node = executor.add_node(rclpy.create_node('fake_robot', context=context))
        self.states = self.node.create_publisher(JointState, 'joint_states',
                                                 qos_profile_sensor_data)
        latched = QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL)
        self.models = self.node.create_publisher(String, '/identifier/model', latched)
        self.commands, self.diagnostics, self.errors = [], [], []
        self.node.create_subscription(Float64MultiArray, COMMANDS,
                                      lambda m: self.commands.append(list(m.data)), 100)
        self.node.create_subscription(DiagnosticArray, '/diagnostics',
                                      self._on_diagnostics, 100)
        self.node.create_subscription(Log, '/rosout', self._on_log, 100)
        self.publishing = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _on_diagnostics(self, msg):
        self.diagnostics += [s.level for s in msg.status if s.name.startswith('mpc')]

    def _on_log(self, msg):
        if msg.name == 'mpc' and msg.level >= Log.ERROR:
            self.errors.append(msg.msg)

    def _run(self):
        while not self._stop.is_set():
            if self.publishing.is_set():
                self.states.publish(state_msg())
            time.sleep(0.005)

    def close(self):
        self._stop.set()
        self._thread.join(timeout=2.0)


@pytest.fixture
def robot(ros_context, executor):
    harness = Robot(ros_context, executor)
    yield harness
    harness.close()


def finite_and_bounded(commands, limit=4.0):
    return all(len(c) == 1 and math.isfinite(c[0]) and abs(c[0]) <= limit for c in commands)


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match='unknown controller'):
        MpcConfig(controller='pid')
    with pytest.raises(ValueError, match='stale_timeout'):
        MpcConfig(stale_timeout=0.0)
    with pytest.raises(ValueError, match='no baseline'):
        make_controller(robots.get('wam7'), nominal_model('wam7'),
                        MpcConfig(controller='baseline'))


def test_publishes_finite_commands_of_the_right_length(ros_context, executor, robot):
    mpc = executor.add_node(make_mpc(ros_context))
    # Before any joint_states the node commands the safe (zero) voltage.
    assert wait_for(lambda: len(robot.commands) >= 5, 10.0)
    assert all(c == [0.0] for c in robot.commands)
    robot.publishing.set()
    assert wait_for(lambda: mpc.stats['solves'] >= 3 and any(c != [0.0] for c in robot.commands),
                    20.0), mpc.stats
    assert finite_and_bounded(robot.commands)
    assert wait_for(lambda: DiagnosticStatus.OK in robot.diagnostics, 5.0)


def test_fuzzed_joint_states_never_give_non_finite_commands(ros_context, executor, robot):
    mpc = executor.add_node(make_mpc(ros_context))
    robot.publishing.set()
    assert wait_for(lambda: mpc.stats['solves'] >= 1, 20.0)
    now = time.time()
    nan, inf = float('nan'), float('inf')
    bad = [
        state_msg(q=(nan, 0.0)), state_msg(q=(0.0, inf)), state_msg(qd=(-inf, 0.0)),
        state_msg(q=(0.0,)), state_msg(qd=(0.0, 0.0, 0.0)),
        state_msg(names=('unknown_a', 'unknown_b')), state_msg(names=('arm_joint', 'arm_joint')),
        JointState(), state_msg(stamp=now - 100.0),
        state_msg(q=(1e300, -1e300), qd=(1e300, 1e300)),   # finite but absurd
    ]
    # one at a time (best-effort QoS), between the robot's states: each is refused, counted
    gate = mpc.state_gate
    for count, msg in enumerate(bad, 1):
        robot.states.publish(msg)
        assert wait_for(lambda: sum(gate.refused.values()) == count, 5.0), (msg, gate.refused)
    assert {key: n for key, n in gate.refused.items() if n} == {
        'invalid': 8, 'stamp_back': 1, 'position_limit': 1}
    start = time.monotonic()
    for k in range(3000):   # a burst at about 10 kHz, valid and invalid mixed
        robot.states.publish(state_msg(q=(0.0, 0.01 * (k % 7))) if k % 3 else bad[k % len(bad)])
        if k % 100 == 0:
            time.sleep(max(0.0, start + k * 1e-4 - time.monotonic()))
    received = len(robot.commands)
    assert wait_for(lambda: len(robot.commands) >= received + 20, 10.0), 'node stopped'
    assert finite_and_bounded(robot.commands)
    # no refused state reached the controller: it never computed a non-finite command
    assert mpc.stats['unsafe_commands'] == 0 and mpc._log.total >= sum(gate.refused.values())
    assert mpc._worker.is_alive()


def test_stale_watchdog_zeroes_the_command_and_resumes(ros_context, executor, robot):
    mpc = executor.add_node(make_mpc(ros_context))
    robot.publishing.set()
    assert wait_for(lambda: mpc.stats['solves'] >= 2 and not mpc.stale, 20.0)
    robot.publishing.clear()
    assert wait_for(lambda: mpc.stale, 5.0)
    assert wait_for(lambda: DiagnosticStatus.ERROR in robot.diagnostics, 5.0)
    count = len(robot.commands)
    assert wait_for(lambda: len(robot.commands) >= count + 10, 5.0)
    assert all(c == [0.0] for c in robot.commands[count + 2:])
    assert any('stale' in line for line in robot.errors)
    robot.diagnostics.clear()
    robot.publishing.set()
    assert wait_for(lambda: not mpc.stale, 5.0)
    assert wait_for(lambda: robot.diagnostics and robot.diagnostics[-1] != DiagnosticStatus.ERROR,
                    5.0)
    count = len(robot.commands)
    assert wait_for(lambda: any(c != [0.0] for c in robot.commands[count:]), 10.0)
    assert finite_and_bounded(robot.commands)


def test_invalid_models_are_rejected_and_valid_ones_used(ros_context, executor, robot):
    mpc = executor.add_node(make_mpc(ros_context))
    robot.publishing.set()
    assert wait_for(lambda: mpc.stats['solves'] >= 1, 20.0)
    nominal = mpc.model
    robot.models.publish(String(data='{"schema": "diffsim_ros/model", "parameters": '))
    assert wait_for(lambda: mpc.stats['models_rejected'] == 1, 5.0)
    assert mpc._log.drops.get('model') == 1
    cartpole = robots.interface('cartpole')   # a whole model, of other joints
    robot.models.publish(String(data=json.dumps(model_message(cartpole.nominal_model(),
                                                              cartpole))))
    assert wait_for(lambda: mpc.stats['models_rejected'] == 2, 5.0)
    assert mpc.model is nominal
    # A valid update (heavier pendulum) is taken over by the controller.
    inertial = nominal.inertial.clone()
    inertial[1] *= 0.03 / 0.024
    heavier = model_message(nominal.replace(inertial=inertial), robots.interface(ROBOT))
    robot.models.publish(String(data=json.dumps(heavier)))
    assert wait_for(lambda: mpc.stats['models_accepted'] == 1, 10.0)
    assert mpc.model is not nominal
    assert not torch.equal(mpc.model.inertial, nominal.inertial)
    assert torch.equal(mpc.model.armature, nominal.armature)
    count = len(robot.commands)
    assert wait_for(lambda: len(robot.commands) >= count + 10, 5.0)
    assert finite_and_bounded(robot.commands)


def test_baseline_is_solved_at_every_command_from_the_newest_state(ros_context, executor,
                                                                   robot):
    mpc = executor.add_node(make_mpc(ros_context, controller='baseline'))
    assert mpc._worker is None   # no solver thread: the baseline is a state feedback law
    assert mpc.ready.is_set()    # nothing to compile first
    assert mpc.controller.dynamics.dt == pytest.approx(1.0 / 100.0)
    assert mpc.controller.dynamics.substeps == 5   # the 10 ms hold at the 500 Hz driver rate
    robot.publishing.set()
    assert wait_for(lambda: mpc.stats['solves'] >= 20, 20.0), mpc.stats
    # One solve per command once the state is fresh (none while it was missing).
    # (the two counters are read while the node runs: a solve may be counted before its command)
    assert -1 <= mpc.stats['commands'] - mpc.stats['solves'] <= mpc.stats['commands'] // 2 + 5
    assert any(c != [0.0] for c in robot.commands) and finite_and_bounded(robot.commands)
    # A model update is taken at the next command.
    inertial = mpc.model.inertial.clone()
    inertial[1] *= 0.03 / 0.024
    heavier = model_message(mpc.model.replace(inertial=inertial), robots.interface(ROBOT))
    robot.models.publish(String(data=json.dumps(heavier)))
    assert wait_for(lambda: mpc.stats['models_accepted'] == 1, 10.0)
    assert mpc.controller.dynamics.model is mpc.model


def test_a_busy_command_thread_solves_the_baseline_less_often_but_at_least_at_50_hz(
        ros_context, executor, robot, monkeypatch):
    # nodes/mpc.py: a command thread busy beyond INLINE_BUSY_LIMIT skips the inline solve
    # (the last law on the newest state), but solves at least INLINE_MIN_SOLVE_HZ
    mpc = executor.add_node(make_mpc(ros_context, controller='baseline', command_rate=500.0))
    robot.publishing.set()
    assert wait_for(lambda: mpc.stats['solves'] >= 20, 20.0), mpc.stats
    monkeypatch.setattr(mpc._loop, 'busy', lambda: 1.0)
    keys = ('solves', 'commands', 'inline_solves_skipped')
    solves, commands, skipped = (mpc.stats[k] for k in keys)
    start = time.monotonic()
    time.sleep(1.0)
    seconds = time.monotonic() - start
    solved = mpc.stats['solves'] - solves
    sent = mpc.stats['commands'] - commands
    assert mpc.stats['inline_solves_skipped'] - skipped >= sent - solved - 2
    assert sent >= 200, sent   # the commands go on (500 Hz asked)
    # one solve per 20 ms of the node clock, not one per command
    assert 0.6 * INLINE_MIN_SOLVE_HZ * seconds <= solved <= INLINE_MIN_SOLVE_HZ * seconds + 3, (
        solved, sent)
    assert finite_and_bounded(robot.commands)


@pytest.mark.slow
def test_compiled_baseline_is_warmed_up_when_the_node_starts(ros_context, executor, robot):
    mpc = executor.add_node(make_mpc(ros_context, controller='baseline', compile=True,
                                     native=False))
    assert mpc.controller.dynamics.compiled and not mpc.controller.dynamics.native
    assert mpc.ready.is_set() and mpc.stats['warm_up_s'] > 0.0
    robot.publishing.set()
    assert wait_for(lambda: mpc.stats['solves'] >= 20, 20.0), mpc.stats
    assert any(c != [0.0] for c in robot.commands) and finite_and_bounded(robot.commands)


def test_native_ilqr_plans_through_the_rollout_kernel(ros_context, executor, robot):
    # the default: no compilation, the C++ kernel rolls out every horizon (built on first use)
    mpc = executor.add_node(make_mpc(ros_context, horizon=20))
    assert mpc.controller.config.native and mpc.controller.dynamics.native
    robot.publishing.set()
    assert mpc.ready.wait(120.0)
    assert wait_for(lambda: mpc.stats['solves'] >= 5, 20.0), mpc.stats
    assert mpc.controller.info['iterations'] >= 1
    assert any(c != [0.0] for c in robot.commands) and finite_and_bounded(robot.commands)


@pytest.mark.slow
def test_compiled_ilqr_is_warmed_up_before_its_first_plan(ros_context, executor, robot):
    mpc = executor.add_node(make_mpc(ros_context, compile=True, native=False, horizon=5))
    assert mpc.controller.config.compile and not mpc.controller.dynamics.native
    robot.publishing.set()
    assert mpc.ready.wait(120.0)
    assert mpc.stats['warm_up_s'] > 0.0   # ready only once compiled
    assert wait_for(lambda: mpc.stats['solves'] >= 2, 120.0), mpc.stats
    assert finite_and_bounded(robot.commands)


def test_reference_file_is_the_tracked_reference_and_hostile_files_are_refused(
        ros_context, tmp_path):
    from diffsim_ros.nodes.params import ParameterError
    from diffsim_ros.sysid.excitation import FourierTrajectory, trajectory_document
    import yaml
    joints = robots.get('wam4').joint_names
    # a small two-harmonic series that starts at rest (sum a = 0, sum k b = 0)
    trajectory = FourierTrajectory(joints, (0.0, 0.3, 0.0, 1.2), ((0.05, -0.05),) * 4,
                                   ((0.05, -0.025),) * 4, 0.25)
    path = tmp_path / 'excitation.yaml'
    path.write_text(yaml.safe_dump(trajectory_document(trajectory, 'wam4', 8.0)))
    mpc = make_mpc(ros_context, robot='wam4', reference_file=str(path), native=False)
    try:
        t = torch.linspace(0.0, 8.0, 81, dtype=torch.float64)
        q, qd, _ = trajectory.evaluate(t)
        x_ref = mpc.controller.cost.reference_fn(t)
        assert torch.allclose(x_ref, torch.cat((q, qd), -1), atol=1e-12, rtol=0)
    finally:
        mpc.close()
    document = trajectory_document(trajectory, 'wam4', 8.0)
    document['joint_names'][0] = 'elsewhere'
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(ParameterError, match="'reference_file'.*missing"):
        make_mpc(ros_context, robot='wam4', reference_file=str(path), native=False)


def test_sampled_swing_up_needs_the_configured_velocity_limits(ros_context, tmp_path):
    from diffsim_ros.nodes.params import ParameterError
    from diffsim_ros.sysid.sampled import SampledTrajectory, sampled_document
    import yaml
    joints = robots.get('wam4').joint_names
    # one fast rest-to-rest quintic: 2 rad/s peaks, beyond the URDF's 0.5 and 0.2 rad/s
    t = torch.arange(0.0, 1.5 + 1e-9, 0.002, dtype=torch.float64)
    s = (t / 1.5)[:, None]
    q = torch.tensor([0.0, 0.0, 0.0, 1.2], dtype=torch.float64) + (
        10 * s ** 3 - 15 * s ** 4 + 6 * s ** 5) * torch.tensor(
            [1.6, 1.6, -1.6, 1.0], dtype=torch.float64)
    path = tmp_path / 'swing_up.yaml'
    path.write_text(yaml.safe_dump(sampled_document(joints, 500.0, q, 'wam4')))
    with pytest.raises(ParameterError, match="'reference_file'.*velocity limit"):
        make_mpc(ros_context, robot='wam4', reference_file=str(path), native=False)
    with pytest.raises(ParameterError, match="'gate.velocity_limits'.*one value per joint"):
        make_mpc(ros_context, robot='wam4', reference_file=str(path), native=False,
                 **{'gate.velocity_limits': [3.0, 3.0]})
    mpc = make_mpc(ros_context, robot='wam4', reference_file=str(path), native=False,
                   **{'gate.velocity_limits': [3.0, 3.0, 3.0, 3.0]})
    try:
        times = torch.linspace(0.0, 2.0, 41, dtype=torch.float64)
        q_ref, qd_ref, _ = SampledTrajectory(joints, 500.0, q).evaluate(times)
        assert torch.allclose(mpc.controller.cost.reference_fn(times),
                              torch.cat((q_ref, qd_ref), -1), atol=1e-12, rtol=0)
        assert torch.allclose(q_ref[0], q[0]) and torch.allclose(q_ref[-1], q[-1])
        # the input gate takes the same limits, times its velocity_factor (2)
        assert mpc.state_gate._speed.tolist() == [6.0] * 4
    finally:
        mpc.close()
