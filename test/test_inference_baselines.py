"""
Inference baselines (SGLD, CEM, emcee) behind the SVGD interface, against closed forms.

SGLD and emcee sample the posterior (mean and covariance checked); CEM concentrates at the
mode (mean checked, its particles collapse).  Constrained runs use a linear equality
constraint, whose conditional Gaussian is known in closed form.
"""

from diffsim_ros.sysid.baselines import constraint_jacobian, CSVGD, make_inference, names
from diffsim_ros.sysid.baselines import SGLD, tangent_projection
from diffsim_ros.sysid.svgd import AugmentedLagrangian, sobol_particles, SVGD
import numpy as np
import pytest
from test_svgd import _regressor_problem
import torch

DTYPE = torch.float64


@pytest.fixture(autouse=True, scope='module')
def _single_thread():
    """Tiny tensors: one intra-op thread is several times faster on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _randn(generator: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=generator, dtype=DTYPE)


def _gaussian(mean: torch.Tensor, cov: torch.Tensor):
    precision = torch.linalg.inv(cov)

    def log_prob(x: torch.Tensor) -> torch.Tensor:
        r = x - mean
        return -0.5 * ((r @ precision) * r).sum(-1)

    return log_prob


def _gaussian_2d():
    std = torch.tensor([2.0, 0.5], dtype=DTYPE)
    corr = torch.tensor([[1.0, 0.6], [0.6, 1.0]], dtype=DTYPE)
    mean = torch.tensor([1.0, -2.0], dtype=DTYPE)
    cov = corr * torch.outer(std, std)
    return _gaussian(mean, cov), mean, cov


def _correlation(cov: torch.Tensor) -> torch.Tensor:
    std = cov.diagonal().sqrt()
    return cov / torch.outer(std, std)


def _linear_constraint_problem():
    """3-D Gaussian conditioned on ``x1 + x2 + x3 = 1`` (as in test_svgd)."""
    generator = torch.Generator().manual_seed(5)
    L = torch.tril(_randn(generator, 3, 3)) + 2.0 * torch.eye(3, dtype=DTYPE)
    cov = L @ L.T / 4.0
    mean = _randn(generator, 3)
    a = torch.tensor([[1.0, 1.0, 1.0]], dtype=DTYPE)
    b = torch.tensor([1.0], dtype=DTYPE)

    def constraint(x: torch.Tensor) -> torch.Tensor:
        return x @ a.T - b

    gain = cov @ a.T @ torch.linalg.inv(a @ cov @ a.T)
    cond_mean = mean + gain @ (b - a @ mean)
    cond_cov = cov - gain @ a @ cov
    return _gaussian(mean, cov), constraint, (mean, cov, a, b), cond_mean, cond_cov


# Settings for these O(1) problems.  SGLD: eps_0 lambda_max(precision) < 2 (stable); the
# slowest mode (lambda_min ~ 0.23 for gaussian_2d) relaxes within the run, and the last step
# leaves an O(eps lambda_max / 4) ~ 2 % std bias; independent chains, so P samples.  emcee:
# the last 20 of every 10th ensemble (burn-in discarded), correlated samples.
SAMPLERS = {
    'sgld': ({'lr': 0.05, 'lr_final': 0.003, 'seed': 0}, 512, 1000),
    'emcee': ({'thin': 10, 'samples_per_walker': 20, 'seed': 0}, 64, 500),
}


@pytest.mark.parametrize('method', sorted(SAMPLERS))
@pytest.mark.parametrize('problem', ['gaussian_2d', 'regressor'])
def test_samplers_match_closed_form_posterior(method, problem):
    log_prob, mean, cov = _gaussian_2d() if problem == 'gaussian_2d' else _regressor_problem()
    options, particles, steps = SAMPLERS[method]
    d = mean.numel()
    initial = sobol_particles(particles, [-3.0] * d, [3.0] * d, seed=1)
    x = make_inference(method, **options).run(log_prob, initial, steps).particles
    std = cov.diagonal().sqrt()
    assert ((x.mean(0) - mean).abs() / std).max() < 0.25
    cov_x = torch.cov(x.T)
    ratio = cov_x.diagonal().sqrt() / std
    assert ((ratio - 1.0).abs() < 0.15).all(), ratio
    # correlation sampling error ~ (1 - rho^2) / sqrt(512) < 0.045
    assert (_correlation(cov_x) - _correlation(cov)).abs().max() < 0.15


@pytest.mark.parametrize('problem', ['gaussian_2d', 'regressor'])
def test_cem_concentrates_at_the_mode(problem):
    log_prob, mean, cov = _gaussian_2d() if problem == 'gaussian_2d' else _regressor_problem()
    d = mean.numel()
    initial = sobol_particles(32, [-3.0] * d, [3.0] * d, seed=2)
    result = make_inference('cem', seed=0).run(log_prob, initial, 60)
    x = result.particles
    std = cov.diagonal().sqrt()
    assert x.shape == (32, d)     # the elites of ceil(32 / 0.1) = 320 samples
    assert ((x.mean(0) - mean).abs() / std).max() < 1e-3
    # an optimiser, not a sampler: the search distribution collapses onto the mode
    assert (x.std(0) / std).max() < 1e-3
    assert result.history[-1]['std'] < result.history[0]['std']


def test_sgld_linear_constraint_samples_conditional():
    log_prob, constraint, _, cond_mean, cond_cov = _linear_constraint_problem()
    initial = sobol_particles(256, [-3.0] * 3, [3.0] * 3, seed=6)
    # eps mu |a|^2 = 0.6 at the first step (< 2: stable); update_every * eps mu |a|^2 >= 1
    schedule = AugmentedLagrangian(mu=10.0, mu_growth=1.0, mu_max=10.0, update_every=5)
    sgld = SGLD(lr=0.02, lr_final=0.01, seed=3)
    result = sgld.run(log_prob, initial, 600, constraint, schedule)
    x = result.particles
    assert constraint(x).abs().max() < 1e-10
    assert result.history[-1]['violation'] < 1e-10
    assert result.history[0]['violation'] > 1.0
    assert result.multipliers.shape == (256, 1) and result.mu == 10.0
    cond_std = cond_cov.diagonal().sqrt()
    assert ((x.mean(0) - cond_mean).abs() / cond_std).max() < 0.25
    ratio = torch.cov(x.T).diagonal().sqrt() / cond_std
    assert ((ratio - 1.0).abs() < 0.15).all(), ratio


def test_sgld_without_projection_keeps_penalty_width():
    log_prob, constraint, _, _, _ = _linear_constraint_problem()
    initial = sobol_particles(64, [-3.0] * 3, [3.0] * 3, seed=6)
    schedule = AugmentedLagrangian(mu=10.0, mu_growth=1.0, mu_max=10.0, update_every=5)
    sgld = SGLD(lr=0.02, lr_final=0.01, project=False, seed=3)
    x = sgld.run(log_prob, initial, 300, constraint, schedule).particles
    # noise in the normal direction: |c| stays at the thermal width 1 / sqrt(mu |a|^2) ~ 0.18
    violation = constraint(x).abs()
    assert 0.05 < float(violation.max()) < 3.0
    assert float(violation.mean()) < 1.0


def test_cem_linear_constraint_reaches_the_constrained_mode():
    log_prob, constraint, _, cond_mean, cond_cov = _linear_constraint_problem()
    initial = sobol_particles(32, [-3.0] * 3, [3.0] * 3, seed=7)
    schedule = AugmentedLagrangian(mu=1.0, mu_growth=1.0, mu_max=1.0, update_every=1)
    result = make_inference('cem', seed=1).run(log_prob, initial, 80, constraint, schedule)
    x = result.particles
    assert constraint(x).abs().max() < 1e-6
    assert result.history[-1]['violation'] < 1e-6
    # the conditional of a Gaussian is Gaussian: its mode is its mean (the search collapses
    # slightly before the multiplier settles: ~1e-4 of the conditional std is left)
    assert ((x.mean(0) - cond_mean).abs() / cond_cov.diagonal().sqrt()).max() < 5e-3
    # shared multipliers, one row per particle; lambda -> the constraint's Lagrange multiplier
    assert result.multipliers.shape == (32, 1)
    assert torch.allclose(result.multipliers, result.multipliers[:1].expand(32, 1))


def test_emcee_samples_the_fixed_penalty_target():
    log_prob, constraint, (mean, cov, a, b), _, _ = _linear_constraint_problem()
    mu = 20.0
    # exp(log p - mu/2 |a x - b|^2) is Gaussian with precision Sigma^-1 + mu a^T a
    precision = torch.linalg.inv(cov) + mu * a.T @ a
    target_cov = torch.linalg.inv(precision)
    target_mean = target_cov @ (torch.linalg.inv(cov) @ mean + mu * a[0] * b)
    initial = sobol_particles(64, [-3.0] * 3, [3.0] * 3, seed=8)
    emcee = make_inference('emcee', thin=10, samples_per_walker=20, seed=2)
    result = emcee.run(log_prob, initial, 600, constraint, AugmentedLagrangian(mu=mu, mu_max=mu))
    x = result.particles
    assert x.shape == (20 * 64, 3)
    assert result.mu == mu and torch.equal(result.multipliers, torch.zeros(20 * 64, 1,
                                                                           dtype=DTYPE))
    std = target_cov.diagonal().sqrt()
    assert ((x.mean(0) - target_mean).abs() / std).max() < 0.25
    ratio = torch.cov(x.T).diagonal().sqrt() / std
    assert ((ratio - 1.0).abs() < 0.2).all(), ratio
    assert 0.05 < result.history[-1]['acceptance'] < 0.9


def test_emcee_de_move_and_history():
    log_prob, mean, cov = _gaussian_2d()
    initial = sobol_particles(16, [-3.0] * 2, [3.0] * 2, seed=9)
    records = []
    result = make_inference('emcee', move='de', seed=3).run(
        log_prob, initial, 200, callback=lambda step, x, record: records.append(step))
    assert result.particles.shape == (16, 2) and result.multipliers is None
    assert records == list(range(200)) and len(result.history) == 200
    assert set(result.history[0]) == {'log_prob', 'acceptance'}
    assert ((result.particles.mean(0) - mean).abs() / cov.diagonal().sqrt()).max() < 1.0


def test_constraint_jacobian_and_tangent_projection():
    generator = torch.Generator().manual_seed(10)
    x = _randn(generator, 5, 3).requires_grad_(True)
    c = torch.stack([x.square().sum(-1), x[:, 0] * x[:, 2]], -1)      # (5, 2)
    J = constraint_jacobian(c, x)
    expected = torch.stack([2.0 * x, torch.stack([x[:, 2], 0.0 * x[:, 1], x[:, 0]], -1)], 1)
    assert torch.allclose(J, expected.detach(), atol=1e-14)
    v = _randn(generator, 5, 3)
    v_t = tangent_projection(J, v)
    assert (J @ v_t.unsqueeze(-1)).abs().max() < 1e-12
    assert torch.allclose(tangent_projection(J, v_t), v_t, atol=1e-12)


def test_seeded_runs_are_reproducible_and_leave_global_rngs_alone():
    log_prob, _, _ = _gaussian_2d()
    initial = sobol_particles(16, [-3.0] * 2, [3.0] * 2, seed=11)
    torch_state, numpy_state = torch.get_rng_state(), np.random.get_state()
    untouched = initial.clone()
    for name in ('sgld', 'cem', 'emcee'):
        first = make_inference(name, seed=4).run(log_prob, initial, 20).particles
        assert torch.equal(initial, untouched), name
        again = make_inference(name, seed=4).run(log_prob, initial, 20).particles
        other = make_inference(name, seed=5).run(log_prob, initial, 20).particles
        assert torch.equal(first, again), name
        assert not torch.equal(first, other), name
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert all(np.array_equal(s, t) for s, t in zip(np.random.get_state(), numpy_state))


def test_sgld_step_size_schedule():
    eps = SGLD(lr=0.1, lr_final=0.01, gamma=0.6).step_sizes(50)
    assert eps[0] == pytest.approx(0.1) and eps[-1] == pytest.approx(0.01)
    assert all(later < earlier for earlier, later in zip(eps, eps[1:]))
    assert SGLD(lr=0.1).step_sizes(3) == [0.1] * 3
    with pytest.raises(ValueError, match='lr_final <= lr'):
        SGLD(lr=0.1, lr_final=0.2)
    with pytest.raises(ValueError, match='gamma'):
        SGLD(gamma=0.5)


def test_registry_and_interface():
    assert names() == ('cem', 'csvgd', 'emcee', 'sgld', 'svgd')
    valid = "valid names: 'cem', 'csvgd', 'emcee', 'sgld', 'svgd'"
    with pytest.raises(ValueError, match=f"unknown inference method 'nuts'; {valid}"):
        make_inference('nuts')
    with pytest.raises(ValueError, match=r"unknown options \['steps'\] for inference method "
                                         r"'cem'; valid options: elite_fraction"):
        make_inference('cem', steps=3)
    svgd = make_inference('svgd', kernel='imq', lr=0.3)
    assert isinstance(svgd, SVGD) and svgd.optimizer == 'adagrad'
    csvgd = make_inference('csvgd')
    assert isinstance(csvgd, CSVGD) and csvgd.optimizer == 'sgd'
    log_prob, constraint, _, _, _ = _linear_constraint_problem()
    initial = sobol_particles(16, [-3.0] * 3, [3.0] * 3, seed=12)
    with pytest.raises(ValueError, match="'csvgd' needs constraint_fn"):
        csvgd.run(log_prob, initial, 5)
    for name in names():
        result = make_inference(name).run(log_prob, initial, 3, constraint)
        assert result.particles.shape[1] == 3 and len(result.history) == 3, name
        assert 'violation' in result.history[-1] and 'log_prob' in result.history[-1], name
    with pytest.raises(ValueError, match='move'):
        make_inference('emcee', move='walk')
    with pytest.raises(ValueError, match='elite_fraction'):
        make_inference('cem', elite_fraction=0.0)


def test_shape_errors_name_expected_and_actual():
    log_prob, _, _ = _gaussian_2d()
    with pytest.raises(ValueError, match=r'at least 2 d = 4 walkers, got 3'):
        make_inference('emcee').run(log_prob, torch.zeros(3, 2, dtype=DTYPE), 5)
    with pytest.raises(ValueError, match=r'expected shape \(P, d\), got \(4,\)'):
        make_inference('sgld').run(log_prob, torch.zeros(4, dtype=DTYPE), 5)
    with pytest.raises(ValueError, match=r'log_prob_fn: expected shape \(4,\), got \(4, 1\)'):
        make_inference('sgld').run(lambda x: log_prob(x)[:, None], torch.zeros(4, 2,
                                                                               dtype=DTYPE), 1)
    with pytest.raises(ValueError, match=r'constraint_fn: expected shape \(320, m\)'):
        make_inference('cem').run(log_prob, torch.eye(32, 2, dtype=DTYPE), 1,
                                  lambda x: x.sum(-1))
