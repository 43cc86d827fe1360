"""
Trajectory-set consistency metrics: k-NN KL divergence, MMD, held-out log-likelihood.

The KL estimator is checked against the closed-form KL of two diagonal Gaussians; at
n = 2000 and k = 3 it is biased low by up to ~0.2 nats in 4 D (finite-sample bias of the
Wang-Kulkarni-Verdu estimator), hence the tolerance ``0.1 + 0.3 KL``.
"""

import math

from diffsim_ros.sysid.consistency import (heldout_log_likelihood, knn_kl_divergence,
                                           median_bandwidth, mmd)
import pytest
import torch

F64 = torch.float64
N = 2000


def kl_diagonal_gaussians(m0, s0, m1, s1):
    return float((torch.log(s1 / s0) + (s0 ** 2 + (m0 - m1) ** 2) / (2 * s1 ** 2) - 0.5).sum())


def gaussian_pair(dim, seed, n=N):
    g = torch.Generator().manual_seed(seed)
    m1 = torch.full((dim,), 0.5, dtype=F64)
    s1 = torch.linspace(0.8, 1.4, dim, dtype=F64)
    x = torch.randn(n, dim, generator=g, dtype=F64)
    y = m1 + s1 * torch.randn(n, dim, generator=g, dtype=F64)
    x2 = torch.randn(n, dim, generator=g, dtype=F64)
    return x, y, x2, m1, s1


@pytest.mark.parametrize('dim', [2, 3, 4])
def test_knn_kl_matches_closed_form_both_directions(dim):
    x, y, _, m1, s1 = gaussian_pair(dim, seed=dim)
    m0, s0 = torch.zeros(dim, dtype=F64), torch.ones(dim, dtype=F64)
    forward = kl_diagonal_gaussians(m0, s0, m1, s1)
    backward = kl_diagonal_gaussians(m1, s1, m0, s0)
    assert float(knn_kl_divergence(x, y, k=3)) == pytest.approx(forward, abs=0.1 + 0.3 * forward)
    assert float(knn_kl_divergence(y, x, k=3)) == pytest.approx(backward,
                                                                abs=0.1 + 0.3 * backward)


@pytest.mark.slow
@pytest.mark.parametrize('dim', [2, 4])
def test_knn_kl_average_over_seeds(dim):
    m0, s0 = torch.zeros(dim, dtype=F64), torch.ones(dim, dtype=F64)
    estimates = []
    for seed in range(5):
        x, y, _, m1, s1 = gaussian_pair(dim, seed=100 + seed)
        estimates.append(float(knn_kl_divergence(x, y)))
    forward = kl_diagonal_gaussians(m0, s0, m1, s1)
    assert sum(estimates) / len(estimates) == pytest.approx(forward, abs=0.05 + 0.25 * forward)


@pytest.mark.parametrize('dim', [2, 4])
def test_knn_kl_same_distribution_is_near_zero(dim):
    x, _, x2, _, _ = gaussian_pair(dim, seed=10 + dim)
    assert abs(float(knn_kl_divergence(x, x2))) < 0.1
    assert abs(float(knn_kl_divergence(x2, x))) < 0.1


def test_knn_kl_flattens_trajectories_and_scales_features():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(300, 5, 2, generator=g, dtype=F64)
    y = torch.randn(200, 5, 2, generator=g, dtype=F64) + 0.3
    flat = knn_kl_divergence(x.reshape(300, -1), y.reshape(200, -1))
    torch.testing.assert_close(knn_kl_divergence(x, y), flat)
    # KL is invariant to an invertible linear map applied to both sets
    scale = torch.tensor([10.0, 0.1], dtype=F64)
    torch.testing.assert_close(knn_kl_divergence(x * scale, y * scale, scale=scale), flat)
    with pytest.raises(ValueError, match='k must'):
        knn_kl_divergence(x[:3], y, k=3)


def test_knn_kl_is_deterministic():
    x, y, _, _, _ = gaussian_pair(2, seed=5, n=500)
    assert float(knn_kl_divergence(x, y)) == float(knn_kl_divergence(x, y))
    x_again, _, _, _, _ = gaussian_pair(2, seed=5, n=500)
    torch.testing.assert_close(x, x_again, rtol=0.0, atol=0.0)


def test_mmd_same_distribution_near_zero_and_shifted_positive():
    x, y, x2, _, _ = gaussian_pair(3, seed=21, n=500)
    same = float(mmd(x, x2))
    shifted = float(mmd(x, y))
    assert abs(same) < 5e-3
    assert shifted > 0.03
    assert shifted > 10 * abs(same)
    # the larger the shift, the larger the MMD
    assert float(mmd(x, x2 + 1.0)) > shifted


def test_mmd_unbiased_estimator_matches_explicit_sums():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(6, 2, generator=g, dtype=F64)
    y = torch.randn(5, 2, generator=g, dtype=F64) + 0.5
    h = 0.7

    def k(a, b):
        return math.exp(-float(((a - b) ** 2).sum()) / (2 * h * h))

    xx = sum(k(x[i], x[j]) for i in range(6) for j in range(6) if i != j) / 30
    yy = sum(k(y[i], y[j]) for i in range(5) for j in range(5) if i != j) / 20
    xy = sum(k(x[i], y[j]) for i in range(6) for j in range(5)) / 30
    assert float(mmd(x, y, bandwidth=h)) == pytest.approx(xx + yy - 2 * xy, rel=1e-12)
    pooled = torch.cat((x, y))
    distances = [float((pooled[i] - pooled[j]).norm())
                 for i in range(11) for j in range(i + 1, 11)]
    assert float(median_bandwidth(x, y)) == pytest.approx(sorted(distances)[len(distances) // 2])
    with pytest.raises(ValueError, match='valid'):
        mmd(x, y, kernel='laplace')


def test_heldout_log_likelihood_mixture():
    g = torch.Generator().manual_seed(8)
    simulated = torch.randn(4, 11, 2, generator=g, dtype=F64)          # (P, T + 1, s)
    heldout = torch.randn(3, 11, 2, generator=g, dtype=F64)            # (R, T + 1, s)
    sigma = torch.tensor([0.5, 1.5], dtype=F64)
    result = heldout_log_likelihood(simulated, heldout, sigma)
    assert result.shape == (3,)
    normal = torch.distributions.Normal(simulated[:, 1:], sigma)
    for r in range(3):
        per_particle = normal.log_prob(heldout[r, 1:]).sum(dim=(-2, -1))
        expected = torch.logsumexp(per_particle, 0) - math.log(4)
        torch.testing.assert_close(result[r], expected)
    # per-reference simulations (R, P, T + 1, s) give the same when they are all equal
    torch.testing.assert_close(
        heldout_log_likelihood(simulated.expand(3, 4, 11, 2), heldout, sigma), result)
    # a particle that reproduces a held-out trajectory scores it higher
    better = torch.cat((simulated, heldout[:1]), 0)
    assert float(heldout_log_likelihood(better, heldout, sigma)[0]) > float(result[0])
    with pytest.raises(ValueError, match='simulated'):
        heldout_log_likelihood(simulated[:, :5], heldout, sigma)
