"""SVGD and constrained SVGD against closed-form posteriors; kernels, init, maps, summaries."""

import math

from diffsim_ros.core import load_urdf, rnea
from diffsim_ros.core.regressor import joint_torque_regressor
from diffsim_ros.robots import urdf_path
from diffsim_ros.sysid.svgd import AugmentedLagrangian, make_kernel, ParameterMap
from diffsim_ros.sysid.svgd import sobol_particles, summarize, SVGD, svgd_direction
import pytest
import scipy.linalg
import torch

DTYPE = torch.float64


def _randn(generator: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=generator, dtype=DTYPE)


def _regressor_problem(d: int = 4, noise: float = 10.0, prior_std: float = 1.0):
    """Linear-Gaussian torque model ``tau = Y theta + noise`` on a well-conditioned subset."""
    model = load_urdf(urdf_path('double_pendulum'), dtype=DTYPE)
    generator = torch.Generator().manual_seed(0)
    q, qd, qdd = 1.5 * _randn(generator, 20, 2), _randn(generator, 20, 2), \
        3.0 * _randn(generator, 20, 2)
    Y = joint_torque_regressor(model, q, qd, qdd).reshape(-1, 10 * model.n)
    # The full regressor is rank deficient (unidentifiable inertial combinations); column
    # pivoted QR picks the d best-conditioned columns.
    _, _, pivots = scipy.linalg.qr(Y.numpy(), pivoting=True)
    A = Y[:, torch.as_tensor(pivots[:d])]
    theta = _randn(generator, d)
    tau = A @ theta + noise * _randn(generator, A.shape[0])
    precision = A.T @ A / noise ** 2 + torch.eye(d, dtype=DTYPE) / prior_std ** 2
    cov = torch.linalg.inv(precision)
    mean = cov @ (A.T @ tau) / noise ** 2

    def log_prob(x: torch.Tensor) -> torch.Tensor:
        residual = tau - x @ A.T
        return -0.5 * (residual.square().sum(-1) / noise ** 2
                       + x.square().sum(-1) / prior_std ** 2)

    return log_prob, mean, cov


def _correlation(cov: torch.Tensor) -> torch.Tensor:
    std = cov.diagonal().sqrt()
    return cov / torch.outer(std, std)


@pytest.mark.parametrize('kernel', ['rbf', 'imq'])
def test_linear_gaussian_matches_exact_posterior(kernel):
    log_prob, mean, cov = _regressor_problem()
    d = mean.numel()
    initial = sobol_particles(300, [-3.0] * d, [3.0] * d, seed=1)
    result = SVGD(kernel, 'adagrad', lr=1.0).run(log_prob, initial, steps=300)
    x = result.particles
    std = cov.diagonal().sqrt()
    assert ((x.mean(0) - mean).abs() / std).max() < 0.03
    cov_svgd = torch.cov(x.T)
    ratio = cov_svgd.diagonal().sqrt() / std
    # finite-particle SVGD slightly under-disperses (most with the RBF kernel)
    assert ((ratio - 1.0).abs() < 0.1).all(), ratio
    assert (_correlation(cov_svgd) - _correlation(cov)).abs().max() < 0.03


def test_linear_gaussian_with_adam_and_decay():
    log_prob, mean, cov = _regressor_problem()
    d = mean.numel()
    initial = sobol_particles(128, [-3.0] * d, [3.0] * d, seed=2)
    x = SVGD('imq', 'adam', lr=0.1, lr_final=1e-3).run(log_prob, initial, 600).particles
    std = cov.diagonal().sqrt()
    assert ((x.mean(0) - mean).abs() / std).max() < 0.1
    assert ((torch.cov(x.T).diagonal().sqrt() / std - 1.0).abs() < 0.2).all()


def test_repulsion_spreads_particles():
    target_std = torch.tensor([2.0, 0.5], dtype=DTYPE)

    def log_prob(x):
        return -0.5 * (x / target_std).square().sum(-1)

    initial = sobol_particles(128, [-0.05, -0.05], [0.05, 0.05], seed=3)
    x = SVGD('rbf', 'adagrad', lr=0.5).run(log_prob, initial, 300).particles
    ratio = x.std(0) / target_std
    assert ((ratio > 0.85) & (ratio < 1.1)).all(), ratio


def test_bimodal_mixture_populates_both_modes():
    def log_prob(x):
        x = x[:, 0]
        return torch.logaddexp(-0.5 * ((x + 3.0) / 0.5) ** 2, -0.5 * ((x - 3.0) / 0.5) ** 2)

    initial = sobol_particles(128, [-6.0], [6.0], seed=4)
    x = SVGD('rbf', 'adagrad', lr=0.5).run(log_prob, initial, 300).particles
    right = (x[:, 0] > 0).double().mean()
    assert 0.35 < right < 0.65
    summary = summarize(x, ['theta'])
    assert summary.modes.shape == (2, 1)
    assert torch.allclose(summary.modes[:, 0].abs(), torch.full((2,), 3.0, dtype=DTYPE),
                          atol=0.15)
    assert torch.allclose(summary.mode_weights.sum(), torch.tensor(1.0, dtype=DTYPE))


def test_constrained_svgd_matches_conditional_gaussian():
    generator = torch.Generator().manual_seed(5)
    L = torch.tril(_randn(generator, 3, 3)) + 2.0 * torch.eye(3, dtype=DTYPE)
    cov = L @ L.T / 4.0
    mean = _randn(generator, 3)
    precision = torch.linalg.inv(cov)
    a = torch.tensor([[1.0, 1.0, 1.0]], dtype=DTYPE)
    b = torch.tensor([1.0], dtype=DTYPE)

    def log_prob(x):
        r = x - mean
        return -0.5 * ((r @ precision) * r).sum(-1)

    def constraint(x):
        return x @ a.T - b

    gain = cov @ a.T @ torch.linalg.inv(a @ cov @ a.T)
    cond_mean = mean + gain @ (b - a @ mean)
    cond_cov = cov - gain @ a @ cov
    initial = sobol_particles(100, [-3.0] * 3, [3.0] * 3, seed=6)
    # SGD keeps the step size of the tangential motion (adaptive optimisers shrink it after
    # the large early penalty gradients); lr * mu * |a|^2 < 2 keeps the normal motion stable.
    schedule = AugmentedLagrangian(mu=1.0, mu_growth=1.0, mu_max=1.0, update_every=2)
    result = SVGD('rbf', 'sgd', lr=0.3).run(log_prob, initial, 800, constraint, schedule)
    x = result.particles
    assert constraint(x).abs().max() < 1e-4
    assert result.multipliers.shape == (100, 1)
    assert result.history[-1]['violation'] < 1e-4
    cond_std = cond_cov.diagonal().sqrt()
    assert ((x.mean(0) - cond_mean).abs() / cond_std).max() < 0.05
    ratio = torch.cov(x.T).diagonal().sqrt() / cond_std
    assert ((ratio - 1.0).abs() < 0.15).all(), ratio


def test_joint_log_prob_and_constraints_give_the_same_run():
    generator = torch.Generator().manual_seed(8)
    mean = _randn(generator, 3)
    a = torch.tensor([[1.0, -1.0, 2.0]], dtype=DTYPE)

    def log_prob(x):
        return -0.5 * (x - mean).square().sum(-1)

    def constraint(x):
        return torch.sin(x @ a.T) - 0.2

    def joint(x):
        return log_prob(x), constraint(x)

    initial = sobol_particles(12, [-2.0] * 3, [2.0] * 3, seed=3)
    schedule = AugmentedLagrangian(mu=1.0, mu_growth=1.5, mu_max=10.0, update_every=3)
    svgd = SVGD('imq', 'sgd', lr=0.05)
    separate = svgd.run(log_prob, initial, 20, constraint, schedule)
    together = svgd.run(joint, initial, 20, lagrangian=schedule, with_constraints=True)
    torch.testing.assert_close(together.particles, separate.particles, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(together.multipliers, separate.multipliers)
    assert together.mu == separate.mu and together.history == separate.history
    with pytest.raises(ValueError, match='with_constraints=True'):
        svgd.run(joint, initial, 1)
    with pytest.raises(ValueError, match='do not pass constraint_fn'):
        svgd.run(joint, initial, 1, constraint, with_constraints=True)
    with pytest.raises(ValueError, match=r'must return \(log_p, c\)'):
        svgd.run(log_prob, initial, 1, with_constraints=True)


def test_particles_simulate_in_one_batched_model_call():
    """Per-body inertial scales of the double pendulum, all particles in one rnea call."""
    model = load_urdf(urdf_path('double_pendulum'), dtype=DTYPE)
    generator = torch.Generator().manual_seed(12)
    q, qd, qdd = _randn(generator, 15, 2), _randn(generator, 15, 2), _randn(generator, 15, 2)
    true_scale = torch.tensor([1.3, 0.7], dtype=DTYPE)
    noise = 0.1
    tau = rnea(model.replace(inertial=model.inertial * true_scale[:, None]), q, qd, qdd)
    tau = tau + noise * _randn(generator, 15, 2)
    # rnea is linear in the scales: the posterior under a flat prior on the box is Gaussian
    # (the box edges lie > 5 posterior stds away)
    columns = torch.stack([
        rnea(model.replace(inertial=model.inertial * e[:, None]), q, qd, qdd).flatten()
        for e in torch.eye(2, dtype=DTYPE)], -1)
    cov = torch.linalg.inv(columns.T @ columns) * noise ** 2
    mean = cov @ columns.T @ tau.flatten() / noise ** 2
    pmap = ParameterMap(['upper_link/scale', 'lower_link/scale'], [0.5, 0.5], [2.0, 2.0])
    calls = []

    def log_prob(z):
        scale = pmap.physical(z)                                   # (P, 2)
        particle_model = model.replace(inertial=model.inertial * scale[:, None, :, None])
        predicted = rnea(particle_model, q, qd, qdd)               # (P, 15, 2)
        calls.append(predicted.shape)
        # flat prior on the physical box -> the density of z carries the log-Jacobian
        return -0.5 * ((predicted - tau) / noise).square().sum((-2, -1)) \
            + pmap.log_abs_det_jacobian(z)

    initial = pmap.normalized(sobol_particles(16, pmap.lower, pmap.upper, seed=13))
    z = SVGD('rbf', 'adagrad', lr=2.0).run(log_prob, initial, 150).particles
    assert calls[0] == (16, 15, 2) and len(calls) == 150
    summary = summarize(pmap.physical(z), pmap.names)
    std = cov.diagonal().sqrt()
    assert ((summary.mean - mean).abs() / std < 0.3).all()
    assert ((summary.std / std - 1.0).abs() < 0.3).all()


@pytest.mark.parametrize('kernel', ['rbf', 'imq'])
def test_repulsive_term_matches_autograd(kernel):
    generator = torch.Generator().manual_seed(7)
    x = _randn(generator, 6, 3)
    k = make_kernel(kernel, bandwidth=1.7)
    K, R = k(x)
    y = x.clone().requires_grad_(True)
    sq_dist = (y.unsqueeze(1) - x.unsqueeze(0)).square().sum(-1) / 1.7   # rows j, cols i
    K_auto = torch.exp(-sq_dist) if kernel == 'rbf' else (1.0 + sq_dist) ** -0.5
    R_auto, = torch.autograd.grad(K_auto.sum(), y)    # R_auto[j] = sum_i grad_{x_j} k
    assert torch.allclose(K, K_auto.detach(), atol=1e-14)
    # symmetric kernel: sum_j grad_{x_j} k(x_j, x_i) = -sum_j grad_{x_i} k(x_i, x_j)
    assert torch.allclose(R, -R_auto, atol=1e-13)


def test_median_bandwidth_and_direction():
    generator = torch.Generator().manual_seed(8)
    x = _randn(generator, 5, 2)
    sq = torch.cdist(x, x).square()
    h = sq[~torch.eye(5, dtype=torch.bool)].median() / math.log(6)
    K, _ = make_kernel('rbf')(x)
    assert torch.allclose(K, torch.exp(-sq / h), atol=1e-14)
    grad = -x
    phi = svgd_direction(x, grad, make_kernel('imq', beta=-0.3))
    assert phi.shape == (5, 2)
    with pytest.raises(ValueError, match='beta'):
        make_kernel('imq', beta=0.5)
    with pytest.raises(ValueError, match=r'expected shape \(5, 2\)'):
        svgd_direction(x, grad[:, :1], make_kernel('rbf'))


def test_registry_errors_list_valid_names():
    with pytest.raises(ValueError, match="unknown SVGD kernel 'gauss'; valid names: 'imq', 'rbf'"):
        make_kernel('gauss')
    with pytest.raises(ValueError, match="valid names: 'adagrad', 'adam', 'sgd'"):
        SVGD('rbf', optimizer='lbfgs')


def test_sobol_particles_inside_limits_and_deterministic():
    lower, upper = [0.5, -2.0, 10.0], [1.5, 2.0, 10.1]
    x = sobol_particles(100, lower, upper, seed=11)
    assert x.shape == (100, 3) and x.dtype == DTYPE
    assert (x >= torch.tensor(lower, dtype=DTYPE)).all()
    assert (x <= torch.tensor(upper, dtype=DTYPE)).all()
    assert torch.equal(x, sobol_particles(100, lower, upper, seed=11))
    assert not torch.equal(x, sobol_particles(100, lower, upper, seed=12))
    # first 64 of the 128 drawn points are a balanced Sobol block: one per 1/64 slice
    u = (sobol_particles(64, [0.0], [1.0], seed=11)[:, 0] * 64).floor()
    assert torch.equal(u.sort().values, torch.arange(64, dtype=DTYPE))
    with pytest.raises(ValueError, match='lower < upper'):
        sobol_particles(4, [1.0], [0.0])


def test_parameter_map_round_trip_and_bounds():
    pmap = ParameterMap(['link1/m', 'joint1/damping'], [0.1, 0.0], [5.0, 0.5])
    generator = torch.Generator().manual_seed(9)
    z = 10.0 * _randn(generator, 50, 2)
    x = pmap.physical(z)
    assert (x >= pmap.lower).all() and (x <= pmap.upper).all()
    assert torch.allclose(pmap.normalized(pmap.physical(z[:5] / 10)), z[:5] / 10, atol=1e-10)
    x_mid = torch.tensor([2.0, 0.3], dtype=DTYPE)
    assert torch.allclose(pmap.physical(pmap.normalized(x_mid)), x_mid, atol=1e-12)
    assert torch.isfinite(pmap.normalized(pmap.lower)).all()
    assert torch.isfinite(pmap.normalized(pmap.upper.float())).all()
    jac = torch.autograd.functional.jacobian(pmap.physical, z[0])
    assert torch.allclose(pmap.log_abs_det_jacobian(z[0]), torch.logdet(jac), atol=1e-10)
    assert set(pmap.as_dict(x)) == {'link1/m', 'joint1/damping'}
    with pytest.raises(ValueError, match='finite lower < upper'):
        ParameterMap(['a'], [1.0], [1.0])
    with pytest.raises(ValueError, match="for \\['b'\\]"):
        ParameterMap(['a', 'b'], [0.0, 0.0], [1.0, math.inf])
    with pytest.raises(ValueError, match='duplicate'):
        ParameterMap(['a', 'a'], [0.0, 0.0], [1.0, 1.0])


def test_parameter_map_normalises_unbounded_states():
    inf = math.inf
    pmap = ParameterMap(['q0', 'qd0', 'm'], [-inf, -inf, 0.5], [inf, inf, 2.0],
                        loc=[0.3, -1.0, 0.0], scale=[0.1, 2.0, 1.0])
    x = torch.tensor([[0.45, 3.0, 1.0]], dtype=DTYPE)
    z = pmap.normalized(x)
    assert torch.allclose(z[0, :2], torch.tensor([1.5, 2.0], dtype=DTYPE))
    assert torch.allclose(pmap.physical(z), x, atol=1e-12)
    jac = torch.autograd.functional.jacobian(pmap.physical, z[0])
    assert torch.allclose(pmap.log_abs_det_jacobian(z[0]), torch.logdet(jac), atol=1e-10)
    assert torch.equal(pmap.bounded, torch.tensor([False, False, True]))
    z32 = z.float().requires_grad_(True)
    pmap.physical(z32).sum().backward()
    assert z32.grad.dtype == torch.float32 and torch.isfinite(z32.grad).all()


def test_summary_of_unimodal_particles():
    generator = torch.Generator().manual_seed(10)
    x = torch.tensor([1.0, -2.0], dtype=DTYPE) + 0.3 * _randn(generator, 400, 2)
    summary = summarize(x, ['a', 'b'])
    assert summary.modes.shape == (1, 2)
    assert torch.allclose(summary.mean, x.mean(0))
    out = summary.to_dict()
    assert out['names'] == ['a', 'b'] and out['mode_weights'] == [1.0]
    assert len(out['std']) == 2 and isinstance(out['mean'][0], float)
