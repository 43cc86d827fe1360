"""
Tests of the MuJoCo plant (``diffsim_ros.sim``): the ground truth of simulated experiments.

The central check is that ``TrueParameters.as_model()`` (and ``plant.true_model``) describes
the plant exactly: with friction, limits, noise and delay off, MuJoCo's accelerations equal
our ``aba`` on that model to 1e-8 for every shipped robot, and a whole RK4 rollout of the
plant equals our RK4 rollout.  The remaining tests cover the sensor model (noise,
quantisation, delays), actuation (DC motor, gains, gravity compensation), command validation,
payload and tool frames, recording and excitation signals.
"""

import dataclasses
import math

from diffsim_ros import robots
from diffsim_ros.core import (aba, DCMotor, forward_kinematics, is_physically_consistent,
                              load_urdf, rollout)
from diffsim_ros.sim import (CommandError, excitation_for, fourier_series, Measurement,
                             MujocoPlant, multisine, Payload, PlantConfig, ToolOffset,
                             TrueParameters)
from diffsim_ros.sim.parameters import nominal_model
import numpy as np
import pytest
import torch

ALL = robots.names()
TOL = 1e-8
EXACT = {'joint_limits': False, 'encoder_counts_per_rev': 0}


def _t(x) -> torch.Tensor:
    return torch.as_tensor(np.asarray(x), dtype=torch.float64)


def _frictionless(params: TrueParameters, model) -> TrueParameters:
    """Remove Coulomb friction and set a distinct armature on every joint."""
    return dataclasses.replace(
        params, friction=dict.fromkeys(model.joint_names, 0.0),
        armature={j: 1e-3 * (i + 1) for i, j in enumerate(model.joint_names)})


def _random_state(plant: MujocoPlant, rng: np.random.Generator) -> tuple:
    n, m = plant.n, len(plant.command_joints)
    q = rng.uniform(-1.0, 1.0, n)
    qd = rng.uniform(-2.0, 2.0, n)
    u = rng.uniform(-1.0, 1.0, m) * np.where(np.isfinite(plant.command_limit),
                                             plant.command_limit, 1.0)
    return q, qd, u


def _assert_close(actual, expected, what: str, tol: float = TOL) -> None:
    actual, expected = np.asarray(actual), np.asarray(expected)
    scale = max(1.0, float(np.abs(expected).max()))
    np.testing.assert_allclose(actual, expected, rtol=0.0, atol=tol * scale, err_msg=what)


# --------------------------------------------------------------------------------------
# The plant is exactly TrueParameters.as_model()
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize('robot', ALL)
def test_plant_acceleration_equals_aba_of_true_model(robot):
    sampled = TrueParameters.sample(robot, 0.3, torch.Generator().manual_seed(7),
                                    actuator_error=0.2)
    params = _frictionless(sampled, nominal_model(robot))
    plant = MujocoPlant(PlantConfig(robot=robot, true_parameters=params, **EXACT))
    true, nominal = params.as_model(), nominal_model(robot)
    torch.testing.assert_close(plant.true_model.inertial, true.inertial, rtol=0, atol=0)
    rng = np.random.default_rng(3)
    differs = 0.0
    for _ in range(4):
        q, qd, u = _random_state(plant, rng)
        plant.reset(q, qd)
        qdd, tau = plant.forward(u)
        expected = aba(true, _t(q), _t(qd), _t(tau) - true.damping * _t(qd))
        _assert_close(qdd, expected, f'{robot}: MuJoCo qacc vs aba(true model)')
        off = aba(nominal, _t(q), _t(qd), _t(tau) - nominal.damping * _t(qd))
        differs = max(differs, float((off - expected).abs().max() / expected.abs().max()))
        passive = [i for i, j in enumerate(plant.joint_names) if j not in plant.command_joints]
        if not plant.gravity_compensation:
            assert np.all(tau[passive] == 0.0)
    assert differs > 1e-3, f'{robot}: the true model is indistinguishable from the nominal'


@pytest.mark.parametrize('robot', ['qube', 'cartpole', 'double_pendulum'])
def test_plant_rollout_equals_core_rk4(robot):
    """Timing, zero-order hold and the motor model: MuJoCo RK4 == our RK4, step by step."""
    params = TrueParameters.sample(robot, 0.3, torch.Generator().manual_seed(1))
    params = dataclasses.replace(params, friction={})
    nominal = nominal_model(robot)
    params = dataclasses.replace(params, friction=dict.fromkeys(nominal.joint_names, 0.0))
    plant = MujocoPlant(PlantConfig(robot=robot, true_parameters=params, substeps=1,
                                    integrator='RK4', **EXACT))
    commands = excitation_for(plant, 'multisine', duration=0.4, fraction=0.8)
    traj = plant.run(commands, q0=[0.1] * plant.n, qd0=[0.5] * plant.n)
    true, index = plant.true_model, list(plant._command_index)
    if plant.motor is None:
        def actuators(qd, u):
            tau = torch.zeros(qd.shape[:-1] + (plant.n,), dtype=qd.dtype)
            tau[..., index] = u
            return tau
    else:
        def actuators(qd, u):
            tau = torch.zeros(qd.shape[:-1] + (plant.n,), dtype=qd.dtype)
            tau[..., index] = plant.motor(u, qd[..., index])
            return tau

    def torque_fn(q, qd, u):
        return actuators(qd, u) - true.damping * qd
    x0 = torch.cat((traj.q[0], traj.qd[0]))
    with torch.no_grad():
        states = rollout(true, x0, traj.u, plant.period, 'rk4', torque_fn)
    _assert_close(traj.q, states[:-1, :plant.n], f'{robot}: positions', 1e-10)
    _assert_close(traj.qd, states[:-1, plant.n:], f'{robot}: velocities', 1e-10)
    with torch.no_grad():
        _assert_close(traj.tau, actuators(traj.qd, traj.u), f'{robot}: recorded tau', 1e-12)


def test_gravity_compensation_of_the_panda_driver():
    """Gravity compensation as libfranka adds it: zero commands hold any pose at rest."""
    params = _frictionless(TrueParameters.sample('panda', 0.3), nominal_model('panda'))
    plant = MujocoPlant(PlantConfig(robot='panda', true_parameters=params, **EXACT))
    assert plant.gravity_compensation
    rng = np.random.default_rng(0)
    for _ in range(3):
        q = rng.uniform(-1.0, 1.0, plant.n)
        plant.reset(q)
        qdd, tau = plant.forward(np.zeros(plant.n))
        _assert_close(qdd, np.zeros(plant.n), 'panda held by gravity compensation')
        assert np.abs(tau).max() > 1.0
    off = MujocoPlant(PlantConfig(robot='panda', gravity_compensation=False, **EXACT))
    off.reset(q)
    assert np.abs(off.forward(np.zeros(plant.n))[0]).max() > 1.0


# --------------------------------------------------------------------------------------
# True parameters
# --------------------------------------------------------------------------------------
def test_sampled_parameters_are_off_by_about_param_error_and_reproducible():
    error = 0.3
    first = TrueParameters.sample('panda', error, torch.Generator().manual_seed(5))
    again = TrueParameters.sample('panda', error, torch.Generator().manual_seed(5))
    other = TrueParameters.sample('panda', error, torch.Generator().manual_seed(6))
    assert first == again and first != other
    nominal, true = nominal_model('panda'), first.as_model()
    assert set(first.mass_scale) == set(nominal.tree.body_links)
    names = true.inertial_parameter_names()
    assert names == nominal.inertial_parameter_names() and names[0].startswith('panda_link1/')
    for scales in (first.mass_scale, first.inertia_scale):
        logs = np.abs(np.log(list(scales.values())))
        assert np.all(logs >= math.log(1 + 0.5 * error) - 1e-12)
        assert np.all(logs <= math.log(1 + 1.5 * error) + 1e-12)
    relative_mass = (true.mass / nominal.mass - 1.0).abs()
    assert 0.5 * error < float(relative_mass.mean()) < 1.5 * error
    com_shift = (true.com - nominal.com).norm(dim=-1)
    assert float(com_shift.min()) > 0.0
    torch.testing.assert_close(true.damping / nominal.damping,
                               _t([first.damping[j] for j in nominal.joint_names])
                               / nominal.damping)
    assert bool(is_physically_consistent(true.inertial).all())
    assert not first.actuator_gain and not first.motor_constant   # actuator_error = 0
    torch.testing.assert_close(TrueParameters.sample('panda', 0.0).as_model().inertial,
                               nominal.inertial)


def test_true_parameters_dict_round_trip_and_validation():
    params = TrueParameters.sample('qube', 0.2, actuator_error=0.1)
    assert set(params.motor_constant) == {'arm_joint'}
    assert TrueParameters.from_dict(params.to_dict()) == params
    with pytest.raises(ValueError, match='unknown key'):
        TrueParameters.from_dict({'robot': 'qube', 'mass_scales': {}})
    with pytest.raises(ValueError, match='> 0'):
        TrueParameters(robot='qube', mass_scale={'arm_link': -1.0})
    with pytest.raises(KeyError, match='valid'):
        TrueParameters(robot='qube', damping={'elbow': 0.1}).as_model()


# --------------------------------------------------------------------------------------
# Sensors: noise, quantisation, delays
# --------------------------------------------------------------------------------------
def test_noise_statistics():
    config = PlantConfig(robot='qube', q_noise_std=0.01, qd_noise_std=(0.2, 0.1),
                         encoder_counts_per_rev=0, seed=3)
    plant = MujocoPlant(config)
    plant.reset()
    errors_q, errors_qd = [], []
    for _ in range(3000):
        m = plant.step([0.0])
        state = plant.state
        errors_q.append(m.q - state.q)
        errors_qd.append(m.qd - state.qd)
    std_q, std_qd = np.std(errors_q, axis=0), np.std(errors_qd, axis=0)
    np.testing.assert_allclose(std_q, [0.01, 0.01], rtol=0.08)
    np.testing.assert_allclose(std_qd, [0.2, 0.1], rtol=0.08)
    assert np.abs(np.mean(errors_q, axis=0)).max() < 4 * 0.01 / math.sqrt(3000)
    # Reproducible from the seed; reset(seed=...) restarts the noise stream.
    np.testing.assert_array_equal(MujocoPlant(config).step([0.0]).q,
                                  MujocoPlant(config).step([0.0]).q)
    first = plant.reset(seed=9).q
    assert not np.array_equal(plant.reset().q, first)
    np.testing.assert_array_equal(plant.reset(seed=9).q, first)


@pytest.mark.parametrize('robot', ['qube', 'cartpole'])
def test_encoder_quantisation_from_the_catalog(robot):
    plant = MujocoPlant(PlantConfig(robot=robot))
    sensor = robots.get(robot).sensor
    if robot == 'qube':
        expected = [2 * math.pi / sensor['encoder_counts_per_rev']] * 2
    else:
        expected = [sensor['cart_encoder_m_per_count'], sensor['pole_encoder_rad_per_count']]
    np.testing.assert_allclose(plant.position_resolution, expected, rtol=1e-15)
    commands = excitation_for(plant, 'chirp', duration=1.0, fraction=0.5)
    plant.reset(qd0=[0.3, 2.0])
    for u in commands:
        m = plant.step(u)
        counts = m.q / plant.position_resolution
        np.testing.assert_allclose(counts, np.round(counts), atol=1e-6)
        assert np.all(np.abs(m.q - plant.state.q) <= 0.5 * plant.position_resolution + 1e-12)
    assert MujocoPlant(PlantConfig(robot=robot, encoder_counts_per_rev=0)) \
        .position_resolution.max() == 0.0


def _record(plant: MujocoPlant, commands: np.ndarray) -> list:
    out = [plant.reset()]
    for u in commands:
        out.append(plant.step(u))
    return out


def test_measurement_delay_shifts_by_exactly_k_ticks():
    k = 3
    base = {'robot': 'qube', 'q_noise_std': 0.001, 'seed': 2}
    commands = excitation_for(MujocoPlant(PlantConfig(**base)), 'multisine', 0.2).numpy()
    direct = _record(MujocoPlant(PlantConfig(**base)), commands)
    delayed = _record(MujocoPlant(PlantConfig(**base, measurement_delay=k)), commands)
    for tick, m in enumerate(delayed):
        source = direct[max(tick - k, 0)]
        np.testing.assert_array_equal(m.q, source.q)
        np.testing.assert_array_equal(m.qd, source.qd)
        np.testing.assert_array_equal(m.tau_applied, source.tau_applied)
        np.testing.assert_array_equal(m.poses['pendulum_tip'], source.poses['pendulum_tip'])
        assert m.t == direct[tick].t and m.t_sample == source.t_sample
    assert delayed[-1].t - delayed[-1].t_sample == pytest.approx(k / 500.0)


def test_command_delay_shifts_by_exactly_k_ticks():
    k = 2
    plant = MujocoPlant(PlantConfig(robot='cartpole'))
    commands = excitation_for(plant, 'multisine', 0.2).numpy()
    shifted = np.concatenate((np.zeros((k, 1)), commands[:-k]))
    direct = _record(plant, shifted)
    delayed = _record(MujocoPlant(PlantConfig(robot='cartpole', command_delay=k)), commands)
    for a, b in zip(direct, delayed):
        np.testing.assert_array_equal(a.q, b.q)


# --------------------------------------------------------------------------------------
# Actuation
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize('robot, motor', [
    ('qube', DCMotor.qube_servo2(dtype=torch.float64)),
    ('cartpole', DCMotor.quanser_ip02('quanser', gear_efficiency=1.0, motor_efficiency=1.0,
                                      dtype=torch.float64)),
])
def test_voltage_to_torque_through_the_dc_motor(robot, motor):
    plant = MujocoPlant(PlantConfig(robot=robot, **EXACT))
    limit = robots.get(robot).command_limit[0]
    for voltage, speed in ((1.5, 0.0), (-2.0, 3.0), (0.0, 10.0), (3 * limit, 1.0)):
        plant.reset(qd0=[speed, 0.0])
        _, tau = plant.forward([voltage])
        with torch.no_grad():
            expected = motor(_t([min(voltage, limit)]), _t([speed]))
        np.testing.assert_allclose(tau, [float(expected), 0.0], rtol=1e-12, atol=1e-15)
    # A spinning motor at 0 V brakes (back-EMF): torque opposes the motion, speed decays.
    plant.reset(qd0=[5.0, 0.0])
    first = plant.step([0.0])
    assert first.tau_applied[0] < 0.0
    for _ in range(100):
        plant.step([0.0])
    assert 0.0 < plant.state.qd[0] < 5.0
    free = MujocoPlant(PlantConfig(robot=robot, **EXACT))
    free.reset(qd0=[5.0, 0.0])
    free.mj_model.dof_damping[:] = 0.0
    for _ in range(101):
        free.step([0.0])
    assert plant.state.qd[0] < free.state.qd[0]


def test_perturbed_motor_constants_and_torque_gains():
    qube = MujocoPlant(PlantConfig(robot='qube', true_parameters=TrueParameters(
        robot='qube', motor_constant={'arm_joint': 0.05}, motor_resistance={'arm_joint': 7.0}),
        **EXACT))
    qube.reset(qd0=[2.0, 0.0])
    np.testing.assert_allclose(qube.forward([3.0])[1][0], 0.05 * (3.0 - 0.05 * 2.0) / 7.0,
                               rtol=1e-12)
    gains = {'shoulder_joint': 1.2, 'elbow_joint': 0.9}
    pendulum = MujocoPlant(PlantConfig(robot='double_pendulum', true_parameters=TrueParameters(
        robot='double_pendulum', actuator_gain=gains), **EXACT))
    np.testing.assert_allclose(pendulum.forward([1.0, -2.0])[1], [1.2, -1.8], rtol=1e-12)
    # Saturation happens on the command, before the gain.
    np.testing.assert_allclose(pendulum.forward([100.0, 0.0])[1], [12.0, 0.0], rtol=1e-12)


# --------------------------------------------------------------------------------------
# Commands and configuration
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize('command, match', [
    ([1.0, 2.0], r'shape \(1,\)'),
    ([[1.0]], r'shape \(1,\)'),
    (1.0, r'shape \(1,\)'),
    ([float('nan')], 'non-finite'),
    ([float('inf')], 'non-finite'),
    (['one'], 'numbers'),
    ({'pendulum_joint': 1.0}, 'do not match'),
    ({'arm_joint': 1.0, 'wrist': 0.0}, 'unknown'),
])
def test_invalid_commands_raise_and_leave_the_plant_unchanged(command, match):
    plant = MujocoPlant(PlantConfig(robot='qube'))
    plant.reset(qd0=[1.0, 0.0])
    before = plant.state
    with pytest.raises(CommandError, match=match):
        plant.step(command)
    assert isinstance(CommandError('x'), ValueError)
    assert plant.tick == 0
    np.testing.assert_array_equal(plant.state.qd, before.qd)


def test_commands_map_by_name():
    plant = MujocoPlant(PlantConfig(robot='wam4'))
    names = plant.command_joints
    vector = np.arange(1.0, 5.0)
    by_name = dict(zip(reversed(names), reversed(vector)))
    plant.reset()
    a = plant.forward(vector)
    b = plant.forward(by_name)
    np.testing.assert_array_equal(a[1], b[1])
    held = plant.step(vector)
    assert plant.step().tau_applied.tolist() == held.tau_applied.tolist()  # None holds


def test_config_from_dict_rejects_unknown_keys_and_builds_nested():
    config = PlantConfig.from_dict({
        'robot': 'panda', 'q_noise_std': [0.001] * 7, 'measurement_delay': 1,
        'payload': {'link': 'panda_link8', 'mass': 0.5, 'com': [0, 0, 0.05]},
        'tool': {'link': 'panda_link8', 'xyz': [0, 0, 0.1]},
        'true_parameters': {'robot': 'panda', 'mass_scale': {'panda_link3': 1.1}}})
    assert isinstance(config.payload, Payload) and isinstance(config.tool, ToolOffset)
    assert config.true_parameters.mass_scale['panda_link3'] == 1.1
    with pytest.raises(ValueError, match='valid keys'):
        PlantConfig.from_dict({'robot': 'qube', 'rate': 100})
    with pytest.raises(ValueError, match='valid keys'):
        PlantConfig.from_dict({'tool': {'link': 'panda_link8', 'offset': [0, 0, 1]}})
    with pytest.raises(ValueError, match='integrator'):
        PlantConfig(integrator='leapfrog')
    with pytest.raises(ValueError, match='valid names'):
        PlantConfig(robot='ur5')
    with pytest.raises(ValueError, match='one per joint'):
        MujocoPlant(PlantConfig(robot='qube', q_noise_std=(0.1, 0.1, 0.1)))


def test_custom_urdf_without_catalog_entry():
    urdf = robots.urdf_string('double_pendulum').replace('name="double_pendulum"',
                                                         'name="my_arm"')
    with pytest.raises(ValueError, match='rate_hz'):
        PlantConfig(robot='', urdf=urdf)
    plant = MujocoPlant(PlantConfig(robot='', urdf=urdf, rate_hz=200.0,
                                    tracked_bodies=('ee_link',)))
    assert plant.command_joints == plant.joint_names == ('shoulder_joint', 'elbow_joint')
    assert plant.command_unit == 'N m' and plant.rate_hz == 200.0 and plant.substeps == 5
    np.testing.assert_array_equal(plant.command_limit,
                                  load_urdf(xml=urdf).effort_limit.numpy())
    assert plant.true_model.name == 'my_arm'
    traj = plant.run(np.ones((10, 2)))
    assert tuple(traj.poses['ee_link'].shape) == (10, 4, 4)


def test_default_pose_respects_joint_limits():
    plant = MujocoPlant(PlantConfig(robot='panda'))
    q = plant.reset().q
    lower, upper = plant.true_model.lower.numpy(), plant.true_model.upper.numpy()
    assert np.all((lower < q) & (q < upper))
    assert q[3] == pytest.approx(0.5 * (lower[3] + upper[3])) and q[0] == 0.0
    assert plant.reset({'panda_joint1': 0.3}).q[0] == 0.3


# --------------------------------------------------------------------------------------
# Payload, tool frame, tracked poses
# --------------------------------------------------------------------------------------
def test_tool_pose_and_payload_match_our_kinematics_and_dynamics():
    tool = ToolOffset(link='panda_link8', xyz=(0.01, -0.02, 0.12), rpy=(0.1, -0.2, 0.3))
    payload = Payload(link='tool', mass=1.5, com=(0.0, 0.01, 0.03),
                      inertia=(2e-3, 0.0, 0.0, 3e-3, 1e-4, 1e-3))
    params = _frictionless(TrueParameters.sample('panda', 0.2), nominal_model('panda'))
    plant = MujocoPlant(PlantConfig(robot='panda', tool=tool, payload=payload,
                                    true_parameters=params, **EXACT))
    assert plant.tracked_bodies == ('panda_link8', 'tool')
    nominal = load_urdf(xml=robots.urdf_string('panda'))
    flange = nominal.link_index('panda_link8')
    rng = np.random.default_rng(4)
    for _ in range(3):
        q, qd, u = _random_state(plant, rng)
        m = plant.reset(q, qd)
        T_world_tool = forward_kinematics(nominal, _t(q))[flange] @ tool.transform()
        _assert_close(m.poses['tool'], T_world_tool, 'tool pose', 1e-12)
        T_true = forward_kinematics(plant.true_model, _t(q))[plant.true_model.link_index('tool')]
        _assert_close(m.poses['tool'], T_true, 'tool pose of the true model', 1e-12)
        qdd, tau = plant.forward(u)
        true = plant.true_model
        expected = aba(true, _t(q), _t(qd), _t(tau) - true.damping * _t(qd))
        _assert_close(qdd, expected, 'qacc with payload')
    added = plant.true_model.mass.sum() - params.as_model().mass.sum()
    assert float(added) == pytest.approx(1.5, rel=1e-12)
    with pytest.raises(ValueError, match='fixed to the base'):
        MujocoPlant(PlantConfig(robot='panda', payload=Payload(link='panda_link0', mass=1.0)))


def test_pose_noise():
    plant = MujocoPlant(PlantConfig(robot='simple_pendulum', pose_noise_std=(0.002, 0.01)))
    plant.reset()
    exact = MujocoPlant(PlantConfig(robot='simple_pendulum')).reset()
    shifts, angles = [], []
    for _ in range(500):
        T = plant.step([0.0]).poses['pendulum_tip']
        T0 = exact.poses['pendulum_tip']
        shifts.append(T[:3, 3] - T0[:3, 3])
        R = T0[:3, :3].T @ T[:3, :3]
        angles.append(math.acos(min(1.0, (np.trace(R) - 1) / 2)))
        np.testing.assert_allclose(T[:3, :3] @ T[:3, :3].T, np.eye(3), atol=1e-12)
    np.testing.assert_allclose(np.std(shifts, axis=0), 0.002, rtol=0.15)
    # |w| of a 3-D Gaussian has RMS sqrt(3) std.
    assert math.sqrt(np.mean(np.square(angles))) == pytest.approx(math.sqrt(3) * 0.01,
                                                                  rel=0.15)


# --------------------------------------------------------------------------------------
# Recording and excitation
# --------------------------------------------------------------------------------------
def test_run_records_a_trajectory():
    plant = MujocoPlant(PlantConfig(robot='qube', encoder_counts_per_rev=0))
    seen = []

    def controller(measurement: Measurement) -> list:
        seen.append(measurement.t)
        return [2.0 * math.sin(10.0 * measurement.t)]
    traj = plant.run(controller, steps=100, q0=[0.0, 0.2], true_acceleration=True, run='x')
    assert traj.run == 'x' and traj.joint_names == plant.joint_names
    assert tuple(traj.t.shape) == (100,) and tuple(traj.q.shape) == (100, 2)
    assert tuple(traj.tau.shape) == (100, 2) and tuple(traj.u.shape) == (100, 1)
    assert tuple(traj.qdd.shape) == (100, 2)
    assert tuple(traj.poses['pendulum_tip'].shape) == (100, 4, 4)
    torch.testing.assert_close(traj.t, torch.arange(100, dtype=torch.float64) / 500.0)
    assert seen == traj.t.tolist()
    assert bool((traj.tau[:, 1] == 0).all())
    # tau[j] is the torque applied from t[j] on: consistent with the state sampled there.
    true = plant.true_model
    expected = aba(true, traj.q, traj.qd, traj.tau - true.damping * traj.qd)
    _assert_close(traj.qdd, expected, 'recorded qdd vs aba(recorded tau)')
    assert plant.tick == 100
    more = plant.run(np.zeros((5, 1)), reset=False)
    assert float(more.t[0]) == pytest.approx(100 / 500.0)
    with pytest.raises(CommandError, match='shape'):
        plant.run(np.zeros((5, 2)))


def test_excitation_signals_are_bounded_and_deterministic():
    amplitude = torch.tensor([1.0, 0.5], dtype=torch.float64)
    for signal in (multisine, fourier_series):
        a = signal(1000, 500.0, amplitude, generator=torch.Generator().manual_seed(1))
        b = signal(1000, 500.0, amplitude, generator=torch.Generator().manual_seed(1))
        c = signal(1000, 500.0, amplitude, generator=torch.Generator().manual_seed(2))
        assert tuple(a.shape) == (1000, 2)
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        assert not torch.equal(a, c)
        torch.testing.assert_close(a.abs().amax(0), amplitude, rtol=1e-12, atol=0)
    assert float(fourier_series(10, 100.0, 1.0)[0, 0]) == 0.0
    plant = MujocoPlant(PlantConfig(robot='panda'))
    u = excitation_for(plant, 'chirp', duration=0.5, fraction=0.25)
    assert tuple(u.shape) == (500, 7)
    assert bool((u.abs() <= 0.25 * torch.tensor(plant.command_limit) + 1e-12).all())
    with pytest.raises(ValueError, match='valid'):
        excitation_for(plant, 'square')


@pytest.mark.slow
@pytest.mark.parametrize('robot', ['qube', 'panda'])
def test_plant_runs_faster_than_real_time(robot):
    import time
    plant = MujocoPlant(PlantConfig(robot=robot))
    commands = np.zeros((2000, len(plant.command_joints)))
    start = time.perf_counter()
    plant.run(commands)
    assert 2000 / (time.perf_counter() - start) > 2 * plant.rate_hz


@pytest.mark.parametrize('robot', ['qube', 'cartpole'])
def test_plant_and_estimators_build_the_same_motor_from_the_catalog(robot):
    # One source of motor constants: a fit of simulated data must not be biased by a
    # different efficiency or gear convention on the estimator side.
    from diffsim_ros.sysid.losses import make_actuator
    plant = MujocoPlant(PlantConfig(robot=robot))
    info = robots.get(robot)
    estimator_motor = make_actuator('dc_motor', len(info.command_joints),
                                    info.dc_motor_kwargs(), dtype=torch.float64)
    volts = torch.tensor([1.5], dtype=torch.float64)
    speed = torch.tensor([2.0], dtype=torch.float64)
    torch.testing.assert_close(estimator_motor(volts, speed), plant.motor(volts, speed))
