"""
NEA least squares: base parameters, exact recovery, LS statistics; and the estimator registry.

Data come from our own simulator (``diffsim_ros.core.rollout``, semi-implicit Euler) with the
accelerations evaluated by ABA at every sample, so ``q, qd, qdd`` and the torques are exact.
"""

import json
import math

from diffsim_ros import robots
from diffsim_ros.core import DCMotor, rnea
from diffsim_ros.sysid.estimators import fit, make_config, make_estimator, names
from diffsim_ros.sysid.nea import (base_parameters, fit_nea, least_squares, NEAConfig,
                                   RegressorColumns)
from diffsim_ros.sysid.result import IdentificationResult
import numpy as np
import pytest
from sysid_data import F64, load, perturbed, simulate
import torch


@pytest.fixture(scope='module')
def pendulum_data():
    model = load('double_pendulum')
    generator = torch.Generator().manual_seed(3)
    true = perturbed(model, generator).replace(
        damping=torch.tensor([0.02, 0.01], dtype=F64),
        friction=torch.tensor([0.1, 0.05], dtype=F64),
        armature=torch.tensor([2e-3, 3e-3], dtype=F64))
    runs = [simulate(true, 500, 0.004, [3.0, 1.0], generator, run=f'r{i}') for i in range(3)]
    return model, true, runs


def test_base_parameters_of_the_double_pendulum():
    model = load('double_pendulum')
    base = base_parameters(model, RegressorColumns(friction=(), armature=False))
    assert base.structural_rank == 6
    expressions = set(base.expressions())
    # planar arm about -y: only the y moments and the x/z first moments act; the elbow mass
    # enters the shoulder terms through the link length l1 = 0.3 m
    assert 'lower_link/iyy' in expressions
    assert any('0.09 lower_link/m' in e and 'upper_link/iyy' in e for e in expressions)


@pytest.mark.parametrize('name', ['panda', 'wam4', 'qube'])
def test_null_space_of_the_base_map_produces_no_torque(name):
    model = load(name)
    columns = RegressorColumns(friction=('viscous', 'coulomb'), armature=True)
    base = base_parameters(model, columns)
    generator = torch.Generator().manual_seed(0)
    q, qd, qdd = (torch.randn(64, model.n, generator=generator, dtype=F64) for _ in range(3))
    W = columns.matrix(model, q, qd, qdd).reshape(-1, len(base.names))
    _, s, Vh = torch.linalg.svd(base.matrix)
    null = Vh[base.structural_rank:].T
    assert null.shape[1] == len(base.names) - base.structural_rank
    assert float((W @ null).abs().max()) < 1e-10 * float(W.abs().max())
    # and the independent columns reproduce the full regressor exactly
    reconstructed = W[:, list(base.independent)] @ base.matrix
    assert torch.allclose(reconstructed, W, atol=1e-9 * float(W.abs().max()))


@pytest.mark.parametrize('name', ['panda', 'wam4'])
def test_structural_rank_matches_pinocchio(name):
    pin = pytest.importorskip('pinocchio')
    model = load(name)
    pmodel = pin.buildModelFromXML(robots.urdf_string(name))
    data = pmodel.createData()
    rng = np.random.default_rng(0)
    rows = [pin.computeJointTorqueRegressor(pmodel, data, rng.uniform(-3, 3, pmodel.nq),
                                            rng.normal(size=pmodel.nv),
                                            rng.normal(size=pmodel.nv)).copy()
            for _ in range(100)]
    W = np.vstack(rows)
    norms = np.linalg.norm(W, axis=0)
    keep = norms > 1e-8 * norms.max()        # round-off columns are structural zeros
    singular = np.linalg.svd(W[:, keep] / norms[keep], compute_uv=False)
    pinocchio_rank = int(np.sum(singular > 1e-8 * singular[0]))
    base = base_parameters(model, RegressorColumns(friction=(), armature=False))
    assert base.structural_rank == pinocchio_rank


def test_exact_recovery_without_noise(pendulum_data):
    model, true, runs = pendulum_data
    config = NEAConfig(friction=('viscous', 'coulomb'), coulomb='tanh', armature=True)
    result = fit_nea(model, runs[:2], runs[2], config)
    columns = RegressorColumns(friction=('viscous', 'coulomb'), armature=True, coulomb='tanh')
    base = base_parameters(model, columns)
    expected = base.values(true)
    estimate = result.state['base_values']
    assert torch.allclose(estimate, expected, rtol=1e-8, atol=1e-10 * float(expected.abs().max()))
    # the full model built from them reproduces every base parameter and the torques
    assert torch.allclose(base.values(result.model), expected, rtol=1e-8, atol=1e-12)
    assert max(result.metrics['validation_torque_rmse']) < 1e-8
    assert result.metrics['rank'] == result.metrics['structural_rank'] == base.structural_rank
    assert math.isfinite(result.metrics['condition_number'])
    assert len(result.metrics['base_expressions']) == base.structural_rank


def test_unidentifiable_combinations_keep_their_nominal_values(pendulum_data):
    model, _, runs = pendulum_data
    prior = fit_nea(model, runs, config=NEAConfig(coulomb='tanh', armature=True))
    minimum = fit_nea(model, runs, config=NEAConfig(coulomb='tanh', armature=True,
                                                    full_parameters='min_norm'))
    columns = RegressorColumns(armature=True, coulomb='tanh')
    base = base_parameters(model, columns)
    null = torch.linalg.svd(base.matrix)[2][base.structural_rank:]
    phi_nominal = columns.vector(model)
    metric = base.column_norms.square()
    # 'prior': the change from nominal is orthogonal (in the column metric) to the null space
    change = prior.state['phi'] - phi_nominal
    assert float((null @ (metric * change)).abs().max()) < 1e-9 * float(
        (metric * change).abs().max())
    assert torch.allclose(minimum.state['base_values'], prior.state['base_values'])
    assert not torch.allclose(minimum.state['phi'], prior.state['phi'])


def test_noise_gives_unbiased_estimates_within_the_predicted_std(pendulum_data):
    model, true, runs = pendulum_data
    columns = RegressorColumns(friction=('viscous', 'coulomb'), armature=True, coulomb='tanh')
    base = base_parameters(model, columns)
    run = runs[0]
    W = base.regressor(model, run.q, run.qd, run.qdd)
    expected = base.values(true)
    generator = torch.Generator().manual_seed(1)
    # heteroscedastic: 5 % of the torque spread on the shoulder, 0.5 % on the elbow
    sigma = torch.tensor([0.05, 0.005], dtype=F64) * run.tau.std(0)
    trials = 100
    z_wls, z_ols = [], []
    for _ in range(trials):
        noisy = run.tau + sigma * torch.randn(run.tau.shape, generator=generator, dtype=F64)
        wls = least_squares(W, noisy, weighting='per_joint', iterations=1)
        ols = least_squares(W, noisy, weighting='none')
        std = wls['covariance'].diagonal().sqrt()
        z_wls.append((wls['beta'] - expected) / std)
        z_ols.append((ols['beta'] - expected) / std)
    z_wls, z_ols = torch.stack(z_wls), torch.stack(z_ols)
    # unbiased: every mean z-score within 4 standard errors of 0; calibrated: std of z ~ 1
    assert float(z_wls.mean(0).abs().max()) < 4.0 / math.sqrt(trials)
    assert float((z_wls.std(0) - 1.0).abs().max()) < 0.3
    # per-joint weighting beats ordinary LS on such data
    assert float(z_ols.square().mean()) > 1.5 * float(z_wls.square().mean())


def test_per_joint_weighting_estimates_each_joints_noise(pendulum_data):
    model, _, runs = pendulum_data
    base = base_parameters(model, RegressorColumns(coulomb='tanh', armature=True))
    run = runs[1]
    W = base.regressor(model, run.q, run.qd, run.qdd)
    generator = torch.Generator().manual_seed(2)
    sigma = torch.tensor([0.3, 0.001], dtype=F64)
    noisy = run.tau + sigma * torch.randn(run.tau.shape, generator=generator, dtype=F64)
    wls = least_squares(W, noisy, 'per_joint')
    assert torch.allclose(wls['joint_std'], sigma, rtol=0.2)


def test_voltage_driven_qube_with_a_fixed_motor_model():
    model = load('qube')
    generator = torch.Generator().manual_seed(4)
    true = perturbed(model, generator).replace(damping=torch.tensor([2e-4, 3e-5], dtype=F64))
    motor = DCMotor.qube_servo2(dtype=F64)
    runs = [simulate(true, 400, 0.004, [3.0], generator, actuator=motor,
                     command_joints=('arm_joint',), run=f'r{i}') for i in range(2)]
    config = {'friction': ['viscous'], 'actuator': 'qube_servo2',
              'command_joints': ['arm_joint']}
    result = fit('nea', model, runs[0], runs[1], config)
    base = base_parameters(model, RegressorColumns(friction=('viscous',)))
    expected = base.values(true)
    assert torch.allclose(result.state['base_values'], expected, rtol=1e-7,
                          atol=1e-9 * float(expected.abs().max()))
    assert result.parameters['arm_joint/damping'][1] == 'N m s/rad'
    assert result.value('arm_joint/damping') == pytest.approx(2e-4, rel=1e-6)


def test_result_parameters_units_std_and_json(pendulum_data):
    model, _, runs = pendulum_data
    result = fit_nea(model, runs[:2], config=NEAConfig(friction=('viscous', 'offset')))
    assert isinstance(result, IdentificationResult)
    assert result.method == 'nea'
    assert result.unit('upper_link/m') == 'kg'
    assert result.unit('upper_link/mx') == 'kg m'
    assert result.unit('lower_link/izz') == 'kg m^2'
    assert result.unit('elbow_joint/offset') == 'N m'
    assert set(result.std) == {k for k in result.parameters if k.startswith('base/')}
    text = json.dumps(result.to_dict())
    loaded = json.loads(text)
    assert loaded['parameters']['base/0']['std'] >= 0
    assert loaded['metrics']['structural_rank'] == len(result.std)
    with pytest.raises(KeyError, match='known'):
        result.value('no/such')


def test_nea_config_validation():
    with pytest.raises(ValueError, match="unknown key.*'frictions'.*valid keys"):
        NEAConfig.from_dict({'frictions': ['viscous']})
    with pytest.raises(ValueError, match='valid'):
        NEAConfig(friction=('stiction',))
    with pytest.raises(ValueError, match='weighting'):
        NEAConfig.from_dict({'weighting': 'robust'})
    assert NEAConfig.from_dict({'friction': ['coulomb']}).friction == ('coulomb',)


def test_missing_accelerations_are_reported(pendulum_data):
    model, _, runs = pendulum_data
    with pytest.raises(ValueError, match='qdd'):
        fit_nea(model, runs[0].replace(qdd=None))
    with pytest.raises(ValueError, match='command_joints'):
        fit_nea(model, runs[0].replace(u=runs[0].tau[:, :1]),
                config=NEAConfig(source='u'))


def test_estimator_registry():
    assert names() == ('nea', 'diffnea', 'svgd', 'ffnn')
    with pytest.raises(ValueError,
                       match="unknown estimator 'sgd'.*'nea', 'diffnea', 'svgd', 'ffnn'"):
        make_estimator('sgd')
    with pytest.raises(ValueError, match='unknown key'):
        make_estimator('diffnea', learning_rate=1e-3)
    estimator = make_estimator('nea', friction=['viscous'])
    assert estimator.config == NEAConfig(friction=('viscous',))
    with pytest.raises(ValueError, match='takes a DiffNEAConfig'):
        make_config('diffnea', NEAConfig())


def test_registry_fit_matches_the_direct_call(pendulum_data):
    model, _, runs = pendulum_data
    direct = fit_nea(model, runs[0], config=NEAConfig(coulomb='tanh'))
    registry = make_estimator('nea', coulomb='tanh').fit(model, runs[0])
    assert torch.equal(direct.state['base_values'], registry.state['base_values'])
    run = runs[1]
    assert torch.allclose(rnea(direct.model, run.q, run.qd, run.qdd),
                          rnea(registry.model, run.q, run.qd, run.qdd))
