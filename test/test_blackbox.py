"""
Black-box FF-NN forward-model baseline: learning, early stopping, result shape and config.

Data: batches of short runs of our own simulator from random initial states (one batched
``rollout`` call), multisine torques, accelerations from ABA.
"""

import json
import math

from diffsim_ros import robots
from diffsim_ros.core import aba, load_urdf, rollout
from diffsim_ros.sysid.blackbox import BlackBoxModel, FFNNConfig, fit_ffnn
from diffsim_ros.sysid.dataset import Trajectory
from diffsim_ros.sysid.estimators import fit
from diffsim_ros.sysid.losses import command_matrix, make_torque_fn
import pytest
import torch

F64 = torch.float64


def simulate_runs(name, count, steps, dt, amplitude, seed):
    """Return ``count`` runs from random initial states, simulated in one batched rollout."""
    model = load_urdf(xml=robots.urdf_string(name), dtype=F64)
    generator = torch.Generator().manual_seed(seed)
    n = model.n
    torque_fn = make_torque_fn(model, command_matrix(model, model.joint_names))
    t = torch.arange(steps, dtype=F64) * dt
    freq = 0.3 + 2.7 * torch.rand(count, 1, n, 4, generator=generator, dtype=F64)
    phase = 2 * math.pi * torch.rand(count, 1, n, 4, generator=generator, dtype=F64)
    u = torch.sin(2 * math.pi * freq * t[:, None, None] + phase).sum(-1) * 0.5 * torch.tensor(
        amplitude, dtype=F64)
    q0 = math.pi * (2 * torch.rand(count, n, generator=generator, dtype=F64) - 1)
    x0 = torch.cat((q0, torch.randn(count, n, generator=generator, dtype=F64)), -1)
    with torch.no_grad():
        x = rollout(model, x0, u[:, :-1], dt, 'semi_implicit_euler', torque_fn)
        q, qd = x.chunk(2, -1)
        qdd = aba(model, q, qd, torque_fn(q, qd, u))
    runs = [Trajectory(t=t, q=q[i], qd=qd[i], qdd=qdd[i], tau=u[i],
                       joint_names=model.joint_names, run=f'r{i}') for i in range(count)]
    return model, runs


@pytest.fixture(scope='module')
def pendulum_runs():
    return simulate_runs('simple_pendulum', 40, 100, 0.004, [0.5], seed=0)


def test_ffnn_learns_the_forward_dynamics(pendulum_runs):
    model, runs = pendulum_runs
    config = FFNNConfig(hidden=(64, 64), iterations=300, lr=5e-3, batch_size=256, patience=0)
    result = fit_ffnn(model, runs[:30], runs[30:], config)
    assert result.method == 'ffnn'
    assert result.metrics['validation_qdd_nmse'] < 0.1
    assert result.metrics['qdd_nmse'] < 0.1
    assert result.history['train'][-1] < 0.2 * result.history['train'][0]


def test_early_stopping_returns_the_best_network():
    # few runs of a double pendulum: the network overfits, the validation loss turns up
    model, runs = simulate_runs('double_pendulum', 8, 100, 0.004, [1.0, 0.3], seed=1)
    config = FFNNConfig(hidden=(64, 64), iterations=2000, lr=3e-3, eval_every=10, patience=5)
    result = fit_ffnn(model, runs[:4], runs[4:], config)
    history = result.history
    assert result.metrics['stopped_early']
    assert result.metrics['iterations'] < 2000
    best = min(history['validation'])
    assert result.metrics['validation_loss'] == pytest.approx(best, rel=1e-12)
    index = history['validation'].index(best)
    assert result.metrics['best_iteration'] == history['validation_iteration'][index]
    assert history['train'][-1] < history['train'][result.metrics['best_iteration']]


def test_rollout_loss_and_warm_start(pendulum_runs):
    model, runs = pendulum_runs
    config = FFNNConfig(hidden=(32,), loss='rollout', horizon=5, iterations=30, lr=3e-3,
                        patience=0)
    first = fit_ffnn(model, runs[:10], runs[30:32], config)
    assert 'rollout_nmse' in first.metrics and 'validation_rollout_nmse' in first.metrics
    assert first.metrics['loss'] < first.history['train'][0]
    second = fit_ffnn(model, runs[10:20], runs[30:32], config, warm_start=first)
    assert second.history['train'][0] < first.history['train'][0]


def test_result_has_no_physical_parameters(pendulum_runs):
    model, runs = pendulum_runs
    result = fit('ffnn', model, runs[:5], config={'hidden': [16], 'iterations': 20})
    assert result.parameters == {}
    assert result.model is not None and torch.equal(result.model.inertial, model.inertial)
    assert isinstance(result.network, BlackBoxModel)
    run = runs[5]
    qdd = result.network(run.q, run.qd, run.tau)
    assert qdd.shape == run.q.shape
    with pytest.raises(ValueError, match='no physical torque model'):
        result.torque_fn()
    loaded = json.loads(json.dumps(result.to_dict()))
    assert loaded['parameters'] == {}
    assert loaded['metrics']['weights'] == sum(p.numel() for p in result.network.net.parameters())


def test_seeded_initialisation_is_reproducible(pendulum_runs):
    model, runs = pendulum_runs
    config = FFNNConfig(hidden=(16,), iterations=5, seed=3)
    first = fit_ffnn(model, runs[:3], config=config)
    second = fit_ffnn(model, runs[:3], config=config)
    assert first.history['train'] == second.history['train']


def test_config_rejects_unknown_keys_and_losses():
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['layers'\]"):
        FFNNConfig.from_dict({'layers': [64]})
    with pytest.raises(ValueError, match="'inverse_dynamics'"):
        FFNNConfig(loss='inverse_dynamics')
    with pytest.raises(ValueError, match='hidden'):
        FFNNConfig(hidden=(0,))
    assert FFNNConfig.from_dict({'hidden': [8, 8]}).hidden == (8, 8)
