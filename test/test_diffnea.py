"""
DiffNEA gradient identification on data from our own simulator.

Identifiable parameters are compared through the base parameters of the NEA regressor layout
(``BaseParameters.values`` of the true and the identified model) and through torques predicted
on held-out runs. Data: multisine-driven rollouts (semi-implicit Euler) with accelerations
from ABA at every sample, so the inverse-dynamics and the matching rollout loss are exactly zero
at the true parameters.
"""

import json

from diffsim_ros.core import aba, DCMotor, rnea, rollout
from diffsim_ros.sysid.dataset import Trajectory
from diffsim_ros.sysid.diffnea import DiffNEAConfig, fit_diffnea, ScaledFriction, Stage
from diffsim_ros.sysid.estimators import fit
from diffsim_ros.sysid.losses import command_matrix, make_torque_fn
from diffsim_ros.sysid.nea import base_parameters, RegressorColumns
import pytest
from sysid_data import F64, load, multisine, perturbed, simulate
import torch


def base_error(model, true, identified, **columns):
    """Return the largest relative error of the base parameters."""
    base = base_parameters(model, RegressorColumns(coulomb='tanh', **columns))
    expected = base.values(true)
    return float(((base.values(identified) - expected) / expected.abs()).abs().max())


def torque_error(true, identified, run):
    """Return the held-out relative RMS error of the rigid-body torques."""
    expected = rnea(true, run.q, run.qd, run.qdd)
    error = rnea(identified, run.q, run.qd, run.qdd) - expected
    return float(error.square().mean().sqrt() / expected.square().mean().sqrt())


FAST = {'adam_iterations': 40, 'lbfgs_iterations': 15}


@pytest.fixture(scope='module')
def pendulum():
    model = load('double_pendulum')
    generator = torch.Generator().manual_seed(0)
    true = perturbed(model, generator).replace(damping=torch.tensor([0.02, 0.01], dtype=F64),
                                               friction=torch.tensor([0.1, 0.05], dtype=F64))
    runs = [simulate(true, 500, 0.004, [3.0, 1.0], generator, run=f'r{i}') for i in range(4)]
    return model, true, runs


@pytest.mark.parametrize('parameterization', ['diffnea', 'log_cholesky'])
def test_inverse_dynamics_loss_recovers_the_double_pendulum(pendulum, parameterization):
    model, true, runs = pendulum
    config = DiffNEAConfig(parameterization=parameterization, **FAST)
    result = fit_diffnea(model, runs[:2], runs[2], config)
    assert base_error(model, true, result.model) < 1e-2
    assert torque_error(true, result.model, runs[3]) < 1e-2
    assert result.value('shoulder_joint/damping') == pytest.approx(0.02, rel=1e-2)
    assert result.value('elbow_joint/coulomb') == pytest.approx(0.05, rel=1e-2)
    assert all(result.metrics['physically_consistent'])
    assert result.metrics['validation_torque_nmse'] < 1e-6
    assert len(result.history['train']) == result.metrics['iterations']


def test_forward_loss_recovers_the_double_pendulum(pendulum):
    model, true, runs = pendulum
    config = DiffNEAConfig(loss='forward', adam_iterations=20, lbfgs_iterations=6)
    result = fit_diffnea(model, runs[0], runs[2], config)
    assert base_error(model, true, result.model) < 1e-2
    assert result.metrics['validation_qdd_nmse'] < 1e-6


def test_inverse_dynamics_loss_recovers_the_voltage_driven_qube():
    model = load('qube')
    generator = torch.Generator().manual_seed(1)
    true = perturbed(model, generator).replace(damping=torch.tensor([2e-4, 3e-5], dtype=F64))
    motor = DCMotor.qube_servo2(dtype=F64)
    runs = [simulate(true, 500, 0.004, [3.0], generator, actuator=motor,
                     command_joints=('arm_joint',), run=f'r{i}') for i in range(3)]
    config = {'actuator': 'qube_servo2', 'command_joints': ['arm_joint'],
              'learn': ['inertial', 'damping'], 'adam_iterations': 150,
              'lbfgs_iterations': 15}
    result = fit('diffnea', model, runs[:2], runs[2], config)
    assert base_error(model, true, result.model, friction=('viscous',)) < 1e-2
    assert torque_error(true, result.model, runs[2]) < 1e-2
    assert result.value('arm_joint/damping') == pytest.approx(2e-4, rel=1e-2)
    assert result.command_joints == ('arm_joint',)
    assert result.actuator is not None


def test_motor_back_emf_is_learned_at_fixed_stall_gain():
    model = load('qube')
    generator = torch.Generator().manual_seed(7)
    true = perturbed(model, generator)
    # same stall gain k_m / R_m = 0.005 N m/V as the nominal motor, stronger back-EMF
    motor = DCMotor.qube_servo2(dtype=F64, motor_constant=0.05, resistance=10.0)
    runs = [simulate(true, 500, 0.004, [3.0], generator, actuator=motor,
                     command_joints=('arm_joint',), run=f'r{i}') for i in range(2)]
    config = DiffNEAConfig(actuator='qube_servo2', command_joints=('arm_joint',),
                           learn=('inertial', 'actuator'), adam_iterations=150,
                           lbfgs_iterations=15)
    result = fit_diffnea(model, runs[0], runs[1], config)
    assert result.value('arm_joint/motor_constant') == pytest.approx(0.05, rel=1e-2)
    assert result.value('arm_joint/resistance') == pytest.approx(10.0, rel=1e-2)
    assert isinstance(result.actuator, DCMotor)
    assert base_error(model, true, result.model, friction=()) < 1e-2


def test_rollout_loss_recovers_the_double_pendulum():
    model = load('double_pendulum')
    generator = torch.Generator().manual_seed(2)
    true = perturbed(model, generator).replace(damping=torch.tensor([0.02, 0.01], dtype=F64),
                                               friction=torch.tensor([0.1, 0.05], dtype=F64))
    runs = [simulate(true, 300, 0.01, [3.0, 1.0], generator, coulomb_eps=0.1, run=f'r{i}')
            for i in range(3)]
    # progressive horizon: short windows first, then the full horizon
    stages = (Stage(horizon=5, adam_iterations=40), Stage(adam_iterations=0, lbfgs_iterations=5))
    config = DiffNEAConfig(loss='rollout', integrator='semi_implicit_euler', horizon=20,
                           coulomb_eps=0.1, stages=stages)
    assert [s.horizon for s in config.schedule()] == [5, 20]
    result = fit_diffnea(model, runs[:2], runs[2], config)
    base = base_parameters(model, RegressorColumns(coulomb='tanh', coulomb_eps=0.1))
    expected = base.values(true)
    error = (base.values(result.model) - expected) / expected.abs()
    assert float(error.abs().max()) < 1e-2
    assert result.metrics['validation_rollout_nmse'] < 1e-6
    assert 'rollout_nmse' in result.metrics


def test_rk4_rollout_stage_after_an_inverse_dynamics_stage_on_the_qube():
    model = load('qube')
    generator = torch.Generator().manual_seed(5)
    true = perturbed(model, generator).replace(damping=torch.tensor([2e-4, 3e-5], dtype=F64))
    motor = DCMotor.qube_servo2(dtype=F64)
    dt, joints = 0.01, ('arm_joint',)
    B = command_matrix(true, joints)
    torque_fn = make_torque_fn(true, B, motor)
    runs = []
    for i in range(3):
        t, u = multisine(200, 1, dt, [3.0], generator)
        with torch.no_grad():
            x = rollout(true, torch.zeros(4, dtype=F64), u[:-1], dt, 'rk4', torque_fn)
            q, qd = x.chunk(2, -1)
            qdd = aba(true, q, qd, torque_fn(q, qd, u))
        runs.append(Trajectory(t=t, q=q, qd=qd, qdd=qdd, u=u, joint_names=model.joint_names,
                               run=f'r{i}'))
    stages = (Stage(loss='inverse_dynamics', adam_iterations=100, lbfgs_iterations=10),
              Stage(loss='rollout', adam_iterations=0, lbfgs_iterations=2))
    config = DiffNEAConfig(loss='rollout', integrator='rk4', horizon=10, actuator='qube_servo2',
                           command_joints=joints, learn=('inertial', 'damping'),
                           stages=stages)
    result = fit_diffnea(model, runs[:2], runs[2], config)
    assert base_error(model, true, result.model, friction=('viscous',)) < 1e-2
    assert result.metrics['validation_rollout_nmse'] < 1e-6


def test_prior_pulls_toward_the_nominal_model(pendulum):
    model, true, runs = pendulum
    strong = fit_diffnea(model, runs[0], config=DiffNEAConfig(prior_weight=1e3, **FAST))
    free = fit_diffnea(model, runs[0], config=DiffNEAConfig(**FAST))
    run = runs[3]
    assert torque_error(model, strong.model, run) < 0.2 * torque_error(model, true, run)
    assert torque_error(true, free.model, run) < 1e-2


def test_early_stopping_returns_the_best_model(pendulum):
    model, _, runs = pendulum
    # validation data from the nominal model: the best validation loss is at the start, so
    # the fit must stop after `patience` evaluations and hand back the nominal model
    generator = torch.Generator().manual_seed(3)
    nominal_run = simulate(model, 300, 0.004, [3.0, 1.0], generator)
    config = DiffNEAConfig(learn=('inertial',), adam_iterations=400, lbfgs_iterations=0,
                           eval_every=5, patience=4)
    result = fit_diffnea(model, runs[:2], nominal_run, config)
    history = result.history
    assert result.metrics['stopped_early']
    assert result.metrics['iterations'] < 400
    assert result.metrics['best_iteration'] == 0
    assert min(history['validation']) == history['validation'][0]
    assert result.metrics['validation_loss'] == pytest.approx(history['validation'][0])
    assert torch.allclose(result.model.inertial, model.inertial, rtol=1e-10, atol=1e-12)


def test_warm_start_converges_in_fewer_iterations(pendulum):
    model, _, runs = pendulum
    config = DiffNEAConfig(adam_iterations=400, lbfgs_iterations=0, loss_tolerance=1e-4,
                           patience=0)
    cold = fit_diffnea(model, runs[0], config=config)
    assert cold.metrics['loss'] < 1e-3
    refit = fit_diffnea(model, runs[1], config=config)
    warm = fit_diffnea(model, runs[1], config=config, warm_start=cold)
    assert warm.metrics['iterations'] < refit.metrics['iterations'] / 3
    assert warm.metrics['loss'] < 1e-3


def test_progressive_stages_learn_the_groups_in_order(pendulum):
    model, true, runs = pendulum
    stages = [{'groups': ['inertial'], 'adam_iterations': 20, 'lbfgs_iterations': 3},
              {'groups': ['inertial', 'damping', 'coulomb'], 'adam_iterations': 20,
               'lbfgs_iterations': 15}]
    config = DiffNEAConfig.from_dict({'stages': stages})
    assert config.stages[0].groups == ('inertial',)
    result = fit_diffnea(model, runs[:2], runs[2], config)
    assert set(result.history['stage']) == {0, 1}
    assert base_error(model, true, result.model) < 1e-2


def test_kinematic_parameters_recover_a_link_length(pendulum):
    model, _, _ = pendulum
    xyz = model.origin_xyz.clone()
    xyz[1, 2] = -0.31                      # elbow 1 cm further down the upper link
    true = model.replace(origin_xyz=xyz)
    generator = torch.Generator().manual_seed(4)
    runs = [simulate(true, 250, 0.004, [3.0, 1.0], generator, run=f'r{i}') for i in range(2)]
    config = DiffNEAConfig(learn=('kinematics',), adam_iterations=30, lbfgs_iterations=10)
    result = fit_diffnea(model, runs[0], runs[1], config)
    assert result.value('elbow_joint/origin_z') == pytest.approx(-0.31, abs=1e-5)
    assert result.unit('elbow_joint/origin_z') == 'm'
    assert torch.allclose(result.model.origin_xyz, xyz, atol=1e-5)


def test_neural_friction_model_is_scaled_passive_and_regularised(pendulum):
    model, _, _ = pendulum
    generator = torch.Generator().manual_seed(6)
    true = model.replace(damping=torch.tensor([0.05, 0.02], dtype=F64))
    runs = [simulate(true, 250, 0.004, [3.0, 1.0], generator, run=f'r{i}') for i in range(2)]
    config = DiffNEAConfig(learn=('friction_model',), friction_model='nn-friction',
                           friction_kwargs={'hidden': [16]}, adam_iterations=150,
                           lbfgs_iterations=0, lr=1e-2, nn_weight_decay=1e-6)
    result = fit_diffnea(model, runs[0], runs[1], config)
    before = result.history['train'][0]
    assert result.metrics['loss'] < 0.2 * before
    assert isinstance(result.friction, ScaledFriction)
    qd = torch.randn(100, 2, generator=generator, dtype=F64)
    tau_f = result.friction(torch.zeros_like(qd), qd)
    assert bool(((tau_f * qd) >= 0).all())
    assert not any('friction_' in name for name in result.parameters)


def test_result_torque_fn_json_and_state(pendulum):
    model, true, runs = pendulum
    result = fit_diffnea(model, runs[0], config=DiffNEAConfig(**FAST))
    torque_fn = result.torque_fn()
    run = runs[3]
    x0 = torch.cat((run.q[0], run.qd[0]))
    with torch.no_grad():
        predicted = rollout(result.model, x0, run.tau[:49], 0.004, 'semi_implicit_euler',
                            torque_fn)
    assert torch.allclose(predicted[-1, :2], run.q[49], atol=1e-4)
    text = json.dumps(result.to_dict())
    loaded = json.loads(text)
    assert loaded['method'] == 'diffnea'
    assert loaded['parameters']['upper_link/m']['unit'] == 'kg'
    assert loaded['config']['learn'] == ['inertial', 'damping', 'coulomb']
    assert 'inertial_z' in result.state


def test_config_rejects_unknown_and_invalid_values():
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['adam_steps'\].*valid keys"):
        DiffNEAConfig.from_dict({'adam_steps': 10})
    with pytest.raises(ValueError, match=r"Stage: unknown key\(s\) \['group'\]"):
        DiffNEAConfig.from_dict({'stages': [{'group': ['inertial']}]})
    with pytest.raises(ValueError, match="'inertia'"):
        DiffNEAConfig(learn=('inertia',))
    with pytest.raises(ValueError, match='actuator'):
        DiffNEAConfig(learn=('inertial', 'actuator'))
    with pytest.raises(ValueError, match='loss'):
        DiffNEAConfig(loss='energy')
    with pytest.raises(ValueError, match='lr'):
        DiffNEAConfig(lr=-1.0)
    with pytest.raises(Exception):
        DiffNEAConfig().lr = 1.0
    config = DiffNEAConfig().replace(horizon=5)
    assert config.horizon == 5
    assert DiffNEAConfig.from_dict(config.to_dict()) == config


def test_time_budget_stops_the_fit(pendulum):
    model, _, runs = pendulum
    config = DiffNEAConfig(adam_iterations=100000, lbfgs_iterations=0, max_seconds=0.5)
    result = fit_diffnea(model, runs[0], config=config)
    assert result.metrics['out_of_time']
    assert result.metrics['iterations'] < 100000


def test_data_requirements_are_reported(pendulum):
    model, _, runs = pendulum
    with pytest.raises(ValueError, match='qdd'):
        fit_diffnea(model, runs[0].replace(qdd=None), config=DiffNEAConfig(**FAST))
    with pytest.raises(ValueError, match="no 'u' signal"):
        fit_diffnea(model, runs[0], config=DiffNEAConfig(actuator='qube_servo2'))
    steps = 0.004 * (1 + (torch.arange(len(runs[0]), dtype=F64) % 2))
    uneven = runs[0].replace(t=torch.cumsum(steps, 0))
    with pytest.raises(ValueError, match='resample'):
        fit_diffnea(model, uneven, config=DiffNEAConfig(loss='rollout'))


def test_warm_start_from_a_least_squares_result(pendulum):
    model, true, runs = pendulum
    nea = fit('nea', model, runs[:2], config={'coulomb': 'tanh'})
    result = fit_diffnea(model, runs[:2], runs[2], DiffNEAConfig(**FAST), warm_start=nea)
    assert all(result.metrics['physically_consistent'])
    assert base_error(model, true, result.model) < 1e-2
