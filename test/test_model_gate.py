"""The model sent whole and the gate in front of the motors: offline, then the mpc over DDS."""

import json
import math
import threading
import time

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from diffsim_ros import robots
from diffsim_ros.control.controller import make_controller
from diffsim_ros.core import rollout
from diffsim_ros.nodes.mpc import MpcConfig, MpcNode
from diffsim_ros.robots.gate import judge_model, ModelGate, ModelGateConfig, RecentData
from diffsim_ros.robots.message import load_model_message, model_message, ModelMessageError
import numpy as np
import pytest
import rclpy
from rclpy.parameter import Parameter
from rclpy.qos import DurabilityPolicy, qos_profile_sensor_data, QoSProfile
from ros_helpers import wait_for
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray, String
import torch

pytest_plugins = ['ros_helpers']

FIELDS = ('inertial', 'damping', 'friction', 'armature', 'gravity', 'origin_xyz', 'origin_rpy')


class Result:
    """Stands in for an identification result: what model_message reads of one."""

    def __init__(self, model, actuator=None, std=None, method='nea'):
        self.model, self.actuator, self.std, self.method = model, actuator, std or {}, method
        self.friction, self.coulomb_eps = None, 0.01


def perturbed(name, seed):
    """Return a model and motor of a robot with every parameter field changed a little."""
    interface = robots.interface(name)
    model = interface.nominal_model()
    generator = torch.Generator().manual_seed(seed)

    def noise(tensor):
        return tensor * (1.0 + 0.05 * torch.rand(tensor.shape, generator=generator,
                                                 dtype=torch.float64)) + 1e-7 / 3.0
    model = model.replace(inertial=noise(model.inertial), damping=noise(model.damping),
                          friction=noise(model.friction), armature=noise(model.armature),
                          origin_xyz=model.origin_xyz + 1e-3 / 3.0,
                          origin_rpy=model.origin_rpy - 1e-3 / 7.0)
    motor = interface.actuator()
    if motor is not None:
        with torch.no_grad():
            motor.log_motor_constant += 0.1 / 3.0
            motor.log_resistance -= 0.1 / 7.0
    return interface, model, motor


@pytest.mark.parametrize('name', robots.names())
def test_model_message_round_trips_bit_for_bit(name):
    interface, model, motor = perturbed(name, 0)
    std = {f'{model.joint_names[0]}/damping': 1e-4 / 3.0}
    text = json.dumps(model_message(Result(model, motor, std), interface))
    loaded, loaded_motor, friction = load_model_message(text, interface)
    assert friction is None
    for field in FIELDS:
        assert torch.equal(getattr(loaded, field), getattr(model, field)), field
    assert loaded.dtype == torch.float64 and loaded.joint_names == model.joint_names
    if motor is None:
        assert loaded_motor is None
    else:
        for key, value in motor.state_dict().items():
            assert torch.equal(loaded_motor.state_dict()[key], value), key
    document = json.loads(text)
    entry = document['parameters'][f'{model.joint_names[0]}/damping']
    assert entry['std'] == std[f'{model.joint_names[0]}/damping']
    assert entry['unit'] in ('N m s/rad', 'N s/m')
    assert document['command_joints'] == list(robots.get(name).command_joints)


def test_model_message_refuses_what_is_not_a_complete_model_of_this_robot():
    qube = robots.interface('qube')
    good = model_message(qube.nominal_model(), qube)
    load_model_message(json.dumps(good), qube)

    def changed(edit):
        document = json.loads(json.dumps(good))
        edit(document)
        return json.dumps(document)
    bad = {
        'other robot': changed(lambda d: d.update(robot='cartpole')),
        'other joints': changed(lambda d: d.update(joint_names=['a', 'b'])),
        'missing': changed(lambda d: d['parameters'].pop('pendulum_link/m')),
        'unknown': changed(lambda d: d['parameters'].update({'x/m': {'value': 1.0}})),
        'non-finite': changed(lambda d: d['parameters']['pendulum_link/m'].update(
            value=None)),
        'text': changed(lambda d: d['parameters']['pendulum_link/m'].update(value='0.02')),
        'bool': changed(lambda d: d['parameters']['pendulum_link/m'].update(value=True)),
        'negative motor': changed(lambda d: d['parameters']['arm_joint/resistance'].update(
            value=-8.4, log=None)),
        'version': changed(lambda d: d.update(version=3)),
    }
    for what, text in bad.items():
        with pytest.raises(ModelMessageError):
            load_model_message(text, qube)
    for text in ('/dev/zero', '<robot name="qube"/>', '[]', ' ' * (1 << 21)):
        with pytest.raises(ModelMessageError):
            load_model_message(text, qube)
    # NaN written by a careless publisher is refused too (json reads it as a float)
    with pytest.raises(ModelMessageError):
        load_model_message(json.dumps(good).replace('"value": 0.024,', '"value": NaN,', 1),
                           qube)


def recorded(model, seconds=3.0, dt=0.002, seed=0):
    """Return RecentData snapshot arrays of the Qube driven by random voltages (model)."""
    qube = robots.interface('qube')
    steps = int(round(seconds / dt))
    generator = torch.Generator().manual_seed(seed)
    # piecewise-constant voltages held 0.1 s: excitation a controller would give
    held = 2.0 * (2.0 * torch.rand(steps // 50 + 1, 1, generator=generator,
                                   dtype=torch.float64) - 1.0)
    u = held.repeat_interleave(50, dim=0)[:steps]
    x0 = torch.tensor([0.0, 0.3, 0.0, 0.0], dtype=torch.float64)
    with torch.no_grad():
        x = rollout(model, x0, u, dt, 'rk4', qube.torque_fn(model)).numpy()
    t = dt * np.arange(steps + 1)
    data = RecentData(seconds + 1.0, 1.0 / dt)
    for k in range(steps + 1):
        data.add_state(t[k], x[k, :2], x[k, 2:])
        if k < steps:
            data.add_command(t[k], u[k].numpy())
    return data.snapshot(1)


def with_pendulum_mass(model, factor):
    inertial = model.inertial.clone()
    inertial[1] = inertial[1] * factor   # mass, first moments and inertia: the same shape
    return model.replace(inertial=inertial)


def test_gate_compares_predictions_of_recent_data():
    qube = robots.interface('qube')
    true = with_pendulum_mass(qube.nominal_model(), 1.3)
    data = recorded(true)
    config = ModelGateConfig()
    nominal = qube.nominal_model()
    # the true model predicts its own data better than the nominal one: accepted
    better = judge_model(qube, true, None, nominal, None, data, config)
    assert better.accepted and better.compared, better
    assert better.candidate_error < 1e-6 < better.current_error
    # the reverse, a plausible model (within every bound) that predicts worse: refused
    in_bounds = with_pendulum_mass(true, 2.0)
    assert qube.check_model(in_bounds) == []
    worse = judge_model(qube, in_bounds, None, true, None, data, config)
    assert not worse.accepted and worse.compared, worse
    assert worse.candidate_error > (1.0 + config.margin) * worse.current_error
    assert 'worse than the model in use' in worse.reasons[0]
    # out of bounds: refused before any prediction
    heavy = judge_model(qube, with_pendulum_mass(true, 1000.0), None, true, None, data, config)
    assert not heavy.accepted and not heavy.compared
    assert heavy.reasons[0].startswith('pendulum_link/m = ')


def test_gate_says_when_recent_data_cannot_tell():
    qube = robots.interface('qube')
    nominal = qube.nominal_model()
    candidate = with_pendulum_mass(nominal, 2.0)
    short = recorded(nominal, seconds=0.5)
    decision = judge_model(qube, candidate, None, nominal, None, short, ModelGateConfig())
    assert decision.accepted and not decision.compared
    assert 'bounds and consistency only' in decision.note and '0.50 s' in decision.note
    still = RecentData(3.0, 500.0)
    for k in range(1000):
        still.add_state(0.002 * k, np.array([0.0, 0.0]), np.array([0.0, 0.0]))
    decision = judge_model(qube, candidate, None, nominal, None, still.snapshot(1),
                           ModelGateConfig())
    assert decision.accepted and not decision.compared and 'held still' in decision.note


def test_model_gate_thread_counts_logs_and_keeps_the_warning():
    qube = robots.interface('qube')
    nominal = qube.nominal_model()
    warnings, accepted, refused = [], [], []

    class Log:

        def warn(self, key, text):
            warnings.append((key, text))
    now = [0.0]
    gate = ModelGate(qube, ModelGateConfig(warn_hold=5.0), 500.0, Log(), clock=lambda: now[0])
    try:
        heavy = json.dumps(model_message(with_pendulum_mass(nominal, 1000.0), qube))
        gate.submit(heavy, nominal, None, lambda *a: accepted.append(a), refused.append)
        assert wait_for(lambda: gate.refused == 1, 10.0)
        assert refused and 'pendulum_link/m' in refused[0] and not accepted
        assert warnings and warnings[0][0] == 'model' and 'keeping the model' in warnings[0][1]
        assert gate.warning.startswith('model refused: pendulum_link/m')
        now[0] = 6.0
        assert gate.warning == ''
        good = json.dumps(model_message(with_pendulum_mass(nominal, 1.1), qube))
        gate.submit(good, nominal, None, lambda *a: accepted.append(a), refused.append)
        assert wait_for(lambda: accepted, 10.0)
        model, motor, friction, decision = accepted[0]
        assert torch.equal(model.inertial, with_pendulum_mass(nominal, 1.1).inertial)
        assert motor is not None and not decision.compared
        assert gate.diagnostics()['models_accepted_without_comparison'] == 1
    finally:
        gate.close()


def test_gate_config_rejects_bad_values():
    for bad, named in (({'margin': -0.1}, 'margin'), ({'dt': 0.0}, 'dt'),
                       ({'horizon': math.nan}, 'horizon'), ({'dt': 0.5}, 'dt'),
                       ({'min_duration': 5.0}, 'min_duration'),
                       ({'min_duration': 0.1}, 'min_duration'),   # under one 0.2 s window
                       ({'duration': 0.1}, 'duration')):
        with pytest.raises(ValueError, match=f'model gate: {named} must'):
            ModelGateConfig(**bad)


def test_gate_needs_one_second_of_data_or_all_it_keeps_unless_told():
    assert ModelGateConfig().compare_after == 1.0
    assert ModelGateConfig(duration=0.5).compare_after == 0.5   # all it keeps, not 1 s
    assert ModelGateConfig(duration=3.0, horizon=2.0).compare_after == 2.0   # one window
    assert ModelGateConfig(min_duration=2.5).compare_after == 2.5
    # the rule decides: 0.7 s of moving data are compared with duration 0.5, not with 3 s
    t = np.arange(0.0, 0.7, 0.002)
    q = np.stack((np.sin(t), np.zeros_like(t)), 1)
    data = {'t': t, 'q': q, 'qd': np.stack((np.cos(t), np.zeros_like(t)), 1),
            't_cmd': t, 'u': np.zeros((len(t), 1))}
    qube = robots.interface('qube')
    nominal = qube.nominal_model()
    for duration, compared in ((0.5, True), (3.0, False)):
        decision = judge_model(qube, nominal, None, nominal, None, data,
                               ModelGateConfig(duration=duration))
        assert decision.accepted and decision.compared == compared, (duration, decision)


@pytest.mark.ros
def test_model_gate_is_a_parameter_section_with_descriptions_and_ranges(ros_context):
    from diffsim_ros.nodes.params import declare_config, parameter_overrides, ParameterError
    node = rclpy.create_node('mpc', context=ros_context, parameter_overrides=parameter_overrides(
        {'model_gate.margin': 0.3, 'model_gate.duration': 0.5}))
    try:
        config = declare_config(node, ModelGateConfig, 'model_gate.')
        assert config == ModelGateConfig(margin=0.3, duration=0.5)
        for name in ('margin', 'duration', 'min_duration', 'horizon', 'dt', 'still_velocity',
                     'warn_hold'):
            descriptor = node.describe_parameter(f'model_gate.{name}')
            assert descriptor.description and descriptor.floating_point_range, name
        (margin,) = node.describe_parameter('model_gate.margin').floating_point_range
        assert margin.from_value == 0.0 and margin.to_value == math.inf
    finally:
        node.destroy_node()
    node = rclpy.create_node('mpc', context=ros_context, parameter_overrides=parameter_overrides(
        {'model_gate.min_duration': 0.1}))
    try:
        with pytest.raises(ParameterError) as caught:
            declare_config(node, ModelGateConfig, 'model_gate.')
        assert caught.value.name == 'model_gate.min_duration' and caught.value.value == 0.1
    finally:
        node.destroy_node()


@pytest.mark.parametrize('executable, old, new', [
    ('mpc', 'model_margin', 'model_gate.margin'),
    ('monitor', 'model_test_duration', 'model_gate.duration'),
])
def test_the_old_model_gate_names_are_refused_with_the_new_one_suggested(executable, old, new):
    from test_node_startup import assert_refused
    line = assert_refused(executable, ['--ros-args', '-p', f'{old}:=0.3'],
                          f"'{old}' = 0.3", 'no such parameter', f'did you mean {new}')
    assert f'[{executable}]' in line


# -- the mpc over real DDS ---------------------------------------------------------------

ROBOT = 'qube'
UPRIGHT_OFFSET = 0.02   # rad off the balance point: the nominal answers with about 0.5 V
MPC_PARAMS = {'robot': ROBOT, 'controller': 'ilqr', 'horizon': 10, 'iterations': 1,
              'control_rate': 20.0, 'command_rate': 100.0, 'stale_timeout': 0.4,
              'diagnostics_period': 0.2, 'compile': False, 'native': False}


def upright_state():
    return torch.tensor([0.0, math.pi - UPRIGHT_OFFSET, 0.0, 0.0], dtype=torch.float64)


def implausible_models():
    nominal = robots.interface(ROBOT).nominal_model()
    damping = nominal.damping.clone()
    damping[1] = -1e-3
    return {'1000x pendulum mass': with_pendulum_mass(nominal, 1000.0),
            'mass 1e6': with_pendulum_mass(nominal, 1e6 / 0.024),
            'mass 1e-9': with_pendulum_mass(nominal, 1e-9 / 0.024),
            'negative damping': nominal.replace(damping=damping)}


def test_an_accepted_1000x_mass_would_saturate_the_commands():
    # What the gate prevents: the same controller on the heavy model commands the limit.
    info, nominal = robots.get(ROBOT), robots.interface(ROBOT).nominal_model()
    config = MpcConfig(**{k: v for k, v in MPC_PARAMS.items() if k != 'robot'})
    x = upright_state()
    volts = {}
    for label, model in (('nominal', nominal),
                         ('heavy', implausible_models()['1000x pendulum mass'])):
        controller, _ = make_controller(info, nominal, config)
        controller.set_model(model)
        volts[label] = abs(float(controller.solve(x, 0.0)(0.0, x)))
    assert volts['heavy'] == pytest.approx(4.0) and volts['nominal'] < 1.0, volts


@pytest.mark.ros
def test_mpc_refuses_implausible_models_and_keeps_commanding_with_the_last_good_one(
        ros_context, executor):
    mpc = executor.add_node(MpcNode(context=ros_context, parameter_overrides=[
        Parameter(k, value=v) for k, v in MPC_PARAMS.items()]))
    node = executor.add_node(rclpy.create_node('fake_identifier', context=ros_context))
    states = node.create_publisher(JointState, 'joint_states', qos_profile_sensor_data)
    models = node.create_publisher(String, '/identifier/model', QoSProfile(
        depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL))
    commands, levels = [], []
    node.create_subscription(Float64MultiArray, '/effort_controller/commands',
                             lambda m: commands.append(list(m.data)), 100)
    node.create_subscription(DiagnosticArray, '/diagnostics', lambda m: levels.extend(
        (s.level, s.message) for s in m.status if s.name.startswith('mpc')), 100)
    stop = threading.Event()
    x = upright_state().tolist()

    def publish_states():
        while not stop.is_set():
            msg = JointState(name=list(robots.get(ROBOT).joint_names), position=x[:2],
                             velocity=x[2:])
            msg.header.stamp = node.get_clock().now().to_msg()
            states.publish(msg)
            time.sleep(0.005)
    publisher = threading.Thread(target=publish_states, daemon=True)
    publisher.start()
    interface = robots.interface(ROBOT)
    try:
        assert wait_for(lambda: mpc.stats['solves'] >= 2 and len(commands) > 20, 30.0)
        nominal = mpc.model
        for count, (label, model) in enumerate(implausible_models().items(), start=1):
            del levels[:]
            sent = len(commands)
            models.publish(String(data=json.dumps(model_message(model, interface))))
            assert wait_for(lambda: mpc.stats['models_rejected'] == count, 10.0), label
            assert wait_for(lambda: any(level == DiagnosticStatus.WARN and 'model refused'
                                        in message for level, message in levels), 5.0), label
            assert wait_for(lambda: len(commands) >= sent + 30, 10.0), label
            volts = [abs(c[0]) for c in commands[sent:]]
            assert all(math.isfinite(v) for v in volts) and max(volts) < 1.0, (label, volts)
            assert mpc.model is nominal and mpc.stats['models_accepted'] == 0
        assert mpc.model_gate.refused == 4
        # a correct model (5 % heavier pendulum) is accepted; the data are still, so on
        # bounds and consistency alone, and the diagnostics say so
        correct = with_pendulum_mass(nominal, 1.05)
        models.publish(String(data=json.dumps(model_message(correct, interface))))
        assert wait_for(lambda: mpc.stats['models_accepted'] == 1, 10.0)
        assert torch.equal(mpc.model.inertial, correct.inertial)
        assert 'bounds and consistency only' in mpc.model_gate.diagnostics()['model_gate']
        sent = len(commands)
        assert wait_for(lambda: len(commands) >= sent + 30, 10.0)
        assert max(abs(c[0]) for c in commands[sent:]) < 1.0
    finally:
        stop.set()
        publisher.join(timeout=2.0)


@pytest.mark.ros
def test_identifier_publishes_the_whole_model_latched(ros_context, executor):
    from diffsim_ros.nodes.identifier import Identifier
    from diffsim_ros.nodes.params import parameter_overrides
    identifier = executor.add_node(Identifier(context=ros_context, parameter_overrides=(
        parameter_overrides({'robot': 'cartpole'}))))
    probe = executor.add_node(rclpy.create_node('probe', context=ros_context))
    inbox = []
    probe.create_subscription(String, '/identifier/model', inbox.append, QoSProfile(
        depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL))
    assert wait_for(lambda: inbox, 10.0)
    cartpole = robots.interface('cartpole')
    model, motor, _ = load_model_message(inbox[-1].data, cartpole)
    nominal = cartpole.nominal_model()
    assert identifier.nominal is nominal
    for field in FIELDS:
        assert torch.equal(getattr(model, field), getattr(nominal, field)), field
    # the cart's reflected rotor mass reaches the mpc now (a URDF has no field for it)
    assert float(model.armature[0]) > 0.1
    assert json.loads(inbox[-1].data)['method'] == 'nominal'


def test_recent_data_keeps_one_state_per_time_and_restarts_when_time_goes_back():
    data = RecentData(1.0, 100.0)
    for t in (0.0, 0.01, 0.01, 0.02):
        data.add_state(t, np.array([t, 0.0]), np.array([0.0, 0.0]))
    data.add_command(0.015, np.array([1.0]))
    snap = data.snapshot(1)
    assert snap['t'].tolist() == [0.0, 0.01, 0.02] and snap['u'].tolist() == [[1.0]]
    for k in range(300):   # bounded: only the last second is returned, the ring is finite
        data.add_state(0.03 + 0.01 * k, np.zeros(2), np.zeros(2))
    snap = data.snapshot(1)
    assert snap['t'][-1] - snap['t'][0] <= 1.0 + 1e-9 and len(data._states) <= 216
    data.add_state(0.5, np.zeros(2), np.zeros(2))   # back in time: a restarted clock
    assert data.snapshot(1)['t'].tolist() == [0.5] and len(data.snapshot(1)['t_cmd']) == 0
