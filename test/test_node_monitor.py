"""The monitor node: exact predictions offline, markers and the ghost's joint states over DDS."""

import json
import math
import multiprocessing
import time

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from diffsim_ros import robots
from diffsim_ros.core import rollout
from diffsim_ros.nodes.convert import sec_to_stamp
from diffsim_ros.nodes.monitor import MonitorConfig, MonitorNode
from diffsim_ros.robots.message import model_message
from diffsim_ros.robots.prediction import end_effector_path, predict_window
import numpy as np
import pytest
import rclpy
from rclpy.parameter import Parameter
from rclpy.qos import DurabilityPolicy, qos_profile_sensor_data, QoSProfile
from ros_helpers import realtime_process, wait_for
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray, String
import torch
from visualization_msgs.msg import Marker, MarkerArray

pytest_plugins = ['ros_helpers']

DT = 0.01


def simulate(robot, steps, constant=False, seed=0):
    """Return times, states and commands of an open-loop rollout of the nominal model."""
    info, model = robots.get(robot), robots.interface(robot).nominal_model()
    limit = torch.tensor([info.command_limit[i] for i in info.command_indices],
                         dtype=torch.float64)
    if constant:   # slow: insensitive to when the commands of a live test arrive
        # (a constant 0.3 x limit drove the Qube's arm to 16 rad, past its +-2 rad stops,
        # which the monitor's input gate refuses; this cosine stays within +-1.1 rad)
        phase = 2.0 * math.pi * DT * torch.arange(steps, dtype=torch.float64)[:, None]
        u = 0.3 * limit * torch.cos(phase)
    else:
        generator = torch.Generator().manual_seed(seed)
        u = 0.3 * limit * (2.0 * torch.rand(steps, len(limit), generator=generator,
                                            dtype=torch.float64) - 1.0)
    x0 = torch.zeros(2 * model.n, dtype=torch.float64)
    x0[:model.n] = 0.1
    with torch.no_grad():
        x = rollout(model, x0, u, DT, 'semi_implicit_euler',
                    robots.interface(robot).torque_fn(model))
    return DT * np.arange(steps + 1), x.numpy(), u.numpy()


@pytest.mark.parametrize('robot', ['qube', 'cartpole', 'wam4', 'panda'])
def test_prediction_of_the_true_model_is_exact(robot):
    info, model = robots.get(robot), robots.interface(robot).nominal_model()
    t, x, u = simulate(robot, 60)
    n = model.n
    result = predict_window(model, info, t, x[:, :n], x[:, n:], t[:-1], u, 0.5, DT,
                            'semi_implicit_euler')
    assert result['finite'] and result['nmse'] < 1e-20
    np.testing.assert_allclose(result['q_predicted'], x[-51:, :n], atol=1e-12)
    np.testing.assert_allclose(result['t'], t[-51:], atol=1e-12)
    # A wrong model predicts worse; too little history gives no prediction.
    wrong = model.replace(damping=model.damping * 3.0 + 0.02)
    assert predict_window(wrong, info, t, x[:, :n], x[:, n:], t[:-1], u, 0.5, DT,
                          'semi_implicit_euler')['nmse'] > 1e-3
    assert predict_window(model, info, t[:20], x[:20, :n], x[:20, n:], t[:19], u[:19], 0.5,
                          DT, 'semi_implicit_euler') is None


def test_nmse_scale_floor_bounds_the_normalisation_of_still_windows():
    info, model = robots.get('qube'), robots.interface('qube').nominal_model()
    t, x, u = simulate('qube', 60)
    n = model.n
    wrong = model.replace(damping=model.damping * 3.0 + 0.02)
    args = (wrong, info, t, x[:, :n], x[:, n:], t[:-1], u, 0.5, DT, 'semi_implicit_euler')
    own = predict_window(*args)
    torch.testing.assert_close(own['scale'], predict_window(*args, own['scale'] * 0.5)['scale'])
    # a floor below the window's variances changes nothing; above them it divides instead
    assert predict_window(*args, own['scale'] * 0.5)['nmse'] == pytest.approx(own['nmse'])
    floored = predict_window(*args, own['scale'] * 4.0)
    assert floored['nmse'] == pytest.approx(own['nmse'] / 4.0)
    assert floored['nmse_q'] == pytest.approx([v / 4.0 for v in own['nmse_q']])


def test_end_effector_path_is_in_the_base_frame():
    info, model = robots.get('wam4'), robots.interface('wam4').nominal_model()
    path = end_effector_path(model, info, np.zeros((3, model.n)))
    assert path.shape == (3, 3) and np.all(np.isfinite(path))
    np.testing.assert_allclose(path[0], path[2])


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match='horizon'):
        MonitorConfig(horizon=0.0)
    with pytest.raises(ValueError, match='buffer_duration'):
        MonitorConfig(horizon=2.0, buffer_duration=1.0)
    with pytest.raises(ValueError, match='integrator'):
        MonitorConfig(integrator='euler')


@pytest.mark.ros
def test_states_and_commands_are_timed_by_their_dds_receive_times(ros_context, executor):
    # The monitor times messages by when the middleware took them, not when the executor
    # (late under load) ran the callback: rclpy hands the receive time only to a callback
    # that takes the message info, which the monitor's did not (every arrival was then the
    # node clock at callback time).
    robot = 'qube'
    info = robots.get(robot)
    monitor = executor.add_node(MonitorNode(context=ros_context, parameter_overrides=[
        Parameter('robot', value=robot)]))
    seen = []
    arrival = monitor._times.received

    def spy(message_info):
        seen.append(message_info)
        return arrival(message_info)
    monitor._times.received = spy
    node = executor.add_node(rclpy.create_node('fake_driver', context=ros_context))
    states = node.create_publisher(JointState, 'joint_states', qos_profile_sensor_data)
    commands = node.create_publisher(Float64MultiArray, '/effort_controller/commands', 10)
    zeros = [0.0] * len(info.joint_names)

    def publish():
        msg = JointState(name=list(info.joint_names), position=zeros, velocity=zeros)
        msg.header.stamp = node.get_clock().now().to_msg()
        states.publish(msg)
        commands.publish(Float64MultiArray(data=[0.0] * len(info.command_joints)))
        return len(seen) >= 2
    assert wait_for(publish, 10.0), seen
    assert all(m is not None and m['received_timestamp'] > 0 for m in seen), seen


def test_commands_are_timed_by_dds_arrival_not_by_when_the_executor_took_them(ros_context):
    # A busy executor takes ten states, then the ten commands that arrived between them: the
    # prediction NMSE of an exact model read up to 0.94 under load while commands were timed
    # by the newest state taken (up to 90 ms late); each is now held from the state it
    # answers, and the exact model predicts exactly.
    robot = 'qube'
    monitor = MonitorNode(context=ros_context, node_name='late_monitor', parameter_overrides=[
        Parameter('robot', value=robot), Parameter('horizon', value=0.5),
        Parameter('period', value=3600.0), Parameter('dt', value=DT),
        Parameter('integrator', value='semi_implicit_euler')])
    try:
        t, x, u = simulate(robot, 100, constant=True)
        names = list(robots.get(robot).joint_names)
        start = time.time() - 5.0
        arrival_ns = [int((start + t[k] + 0.001) * 1e9) for k in range(len(t))]
        for batch in range(0, len(t), 10):
            for k in range(batch, min(batch + 10, len(t))):
                msg = JointState(name=names, position=x[k, :2].tolist(),
                                 velocity=x[k, 2:].tolist())
                msg.header.stamp = sec_to_stamp(start + t[k])
                monitor._on_joint_state(msg, {'received_timestamp': arrival_ns[k]})
            for k in range(batch, min(batch + 10, len(u))):
                monitor._on_command(Float64MultiArray(data=u[k].tolist()),
                                    {'received_timestamp': arrival_ns[k] + 100_000})
        np.testing.assert_allclose([c[0] for c in monitor._commands],
                                   start + t[:-1] + 0.0001, atol=1e-6)
        assert monitor.predict_and_publish()['nmse'] < 1e-6
    finally:
        monitor.destroy_node()


def test_commands_on_simulated_time_are_timed_by_publication_as_the_identifier_times_them(
        ros_context):
    # A lockstep plant publishes state k, then waits for the command answering it; on
    # simulated time the executor's order said nothing about which state a command answered
    # (the monitor timed commands by the simulated clock when its callback ran).  The
    # identifier's rule places each on the state published last before it, in any order.
    from rclpy.clock import ClockType
    from rclpy.time import Time
    robot = 'qube'
    monitor = MonitorNode(context=ros_context, node_name='simulated_monitor',
                          parameter_overrides=[
                              Parameter('robot', value=robot),
                              Parameter('use_sim_time', value=True),
                              Parameter('horizon', value=0.5), Parameter('period', value=3600.0),
                              Parameter('dt', value=DT),
                              Parameter('integrator', value='semi_implicit_euler')])
    try:
        t, x, u = simulate(robot, 100, constant=True)
        names = list(robots.get(robot).joint_names)
        order = [('state', k) for k in range(len(t))] + [('command', k) for k in range(len(u))]
        rng = np.random.default_rng(7)
        kinds = rng.permutation([kind for kind, _ in order])
        taken = {'state': 0, 'command': 0}
        for kind in kinds:   # any merge of the two streams, each in its publisher's order
            k = taken[kind]
            taken[kind] += 1
            if kind == 'state':   # source times: state k at 10 k + 1, its command at 10 k + 5
                msg = JointState(name=names, position=x[k, :2].tolist(),
                                 velocity=x[k, 2:].tolist())
                msg.header.stamp = sec_to_stamp(2.0 + t[k])
                monitor.get_clock().set_ros_time_override(Time(   # /clock, sent with it
                    nanoseconds=round((2.0 + t[k]) * 1e9), clock_type=ClockType.ROS_TIME))
                monitor._on_joint_state(msg, {'source_timestamp': 10 * k + 1})
            else:
                monitor._on_command(Float64MultiArray(data=u[k].tolist()),
                                    {'source_timestamp': 10 * k + 5})
        np.testing.assert_allclose([c[0] for c in monitor._commands], 2.0 + t[:-1], atol=1e-9)
        assert monitor.predict_and_publish()['nmse'] < 1e-20
    finally:
        monitor.destroy_node()


@pytest.mark.ros
def _replay_main(names, x, u, stop):
    """
    Body of the replaying process: state k stamped with its sample time, then command k.

    Real time at ``DT``, from 0.5 s after both topics are matched (discovery).
    """
    realtime_process()
    context = rclpy.Context()
    rclpy.init(context=context)
    node = rclpy.create_node('fake_robot_driver', context=context)
    states = node.create_publisher(JointState, 'joint_states', qos_profile_sensor_data)
    commands = node.create_publisher(Float64MultiArray, '/effort_controller/commands', 10)
    deadline = time.monotonic() + 30.0
    while min(states.get_subscription_count(), commands.get_subscription_count()) == 0 \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    start = time.time()
    for k in range(len(u) + 1):
        if stop.is_set():
            break
        msg = JointState(name=names, position=x[k, :2].tolist(), velocity=x[k, 2:].tolist())
        msg.header.stamp = sec_to_stamp(start + k * DT)
        states.publish(msg)
        if k < len(u):
            commands.publish(Float64MultiArray(data=u[k].tolist()))
        time.sleep(max(0.0, start + (k + 1) * DT - time.time()))
    node.destroy_node()
    rclpy.shutdown(context=context)


def test_publishes_markers_ghost_states_and_nmse(ros_context, executor):
    robot = 'qube'
    info = robots.get(robot)
    monitor = executor.add_node(MonitorNode(context=ros_context, parameter_overrides=[
        Parameter('robot', value=robot), Parameter('horizon', value=0.5),
        Parameter('period', value=0.25), Parameter('dt', value=DT),
        Parameter('integrator', value='semi_implicit_euler')]))
    node = executor.add_node(rclpy.create_node('fake_robot', context=ros_context))
    models = node.create_publisher(String, '/identifier/model', QoSProfile(
        depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL))
    received = {'markers': [], 'ghost': [], 'nmse': []}
    node.create_subscription(MarkerArray, '/monitor/markers',
                             lambda m: received['markers'].append(m), 10)
    node.create_subscription(JointState, '/predicted/joint_states',
                             lambda m: received['ghost'].append(m), 10)
    node.create_subscription(Float64MultiArray, '/monitor/prediction_nmse',
                             lambda m: received['nmse'].append(list(m.data)), 10)
    t, x, u = simulate(robot, 150, constant=True)
    # the replay is a robot's driver: its own real-time process (a thread of this process
    # paused on a loaded machine, so states went out late and the NMSE read 0.36, load 15)
    context = multiprocessing.get_context('spawn')

    def replay():
        stop = context.Event()
        player = context.Process(target=_replay_main, args=(
            list(info.joint_names), np.asarray(x), np.asarray(u), stop), daemon=True)
        player.start()
        return player, stop

    player, stop = replay()
    try:
        assert wait_for(lambda: received['markers'] and received['ghost'] and received['nmse'],
                        60.0), {k: len(v) for k, v in received.items()}
    finally:
        stop.set()
        player.join(timeout=10.0)
    markers = received['markers'][-1].markers
    assert {m.ns for m in markers} == {'measured_path', 'predicted_path'}
    for marker in markers:
        assert marker.type == Marker.LINE_STRIP and marker.header.frame_id == info.base_link
        assert len(marker.points) == 51
        assert all(math.isfinite(p.x + p.y + p.z) for p in marker.points)
    ghost = received['ghost'][-1]
    assert list(ghost.name) == list(info.joint_names)
    assert all(math.isfinite(v) for v in list(ghost.position) + list(ghost.velocity))
    nmse = received['nmse'][-1]
    assert len(nmse) == 1 + len(info.joint_names) and all(math.isfinite(v) for v in nmse)
    # Same model as the data: only lost or misplaced samples separate prediction and
    # measurement.  Every command placed one rollout step late would read 0.015; timed by the
    # newest state the executor had taken, under load they read up to 0.94 (0.60 in CI), and
    # timed by DDS arrival at most 5e-4 with four busy-loops on the two cores.
    n = len(info.joint_names)
    one_tick_late = predict_window(monitor.model, info, t, x[:, :n], x[:, n:], t[:-1] + DT, u,
                                   0.5, DT, 'semi_implicit_euler')['nmse']
    assert nmse[0] < one_tick_late, (nmse, one_tick_late)
    # An identified model arrives whole, passes the gate and is used from then on.
    heavier = monitor.model.inertial.clone()
    heavier[1] *= 1.1
    identified = monitor.model.replace(inertial=heavier)
    models.publish(String(data=json.dumps(model_message(identified,
                                                        robots.interface(robot)))))
    assert wait_for(lambda: monitor.models_accepted == 1, 10.0)
    assert torch.equal(monitor.model.inertial, heavier) and monitor.models_rejected == 0
    # A 1000x pendulum is refused: counted, WARN on /diagnostics, the last good model stays.
    diagnostics = []
    node.create_subscription(DiagnosticArray, '/diagnostics', lambda m: diagnostics.extend(
        (s.level, s.message) for s in m.status if s.name.startswith('monitor')), 10)
    absurd = monitor.model.inertial.clone()
    absurd[1] *= 1000.0
    models.publish(String(data=json.dumps(model_message(
        monitor.model.replace(inertial=absurd), robots.interface(robot)))))
    assert wait_for(lambda: monitor.models_rejected == 1, 10.0)
    assert torch.equal(monitor.model.inertial, heavier) and monitor.model_gate.refused == 1
    player, stop = replay()   # new data: a new prediction
    try:
        assert wait_for(lambda: any(level == DiagnosticStatus.WARN and 'pendulum_link/m' in text
                                    for level, text in diagnostics), 60.0), diagnostics
    finally:
        stop.set()
        player.join(timeout=10.0)
