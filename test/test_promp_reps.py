"""ProMP boundary conditions and derivatives; eREPS on a quadratic with a known optimum."""

import math

from diffsim_ros.control.promp import normalized_gaussian_basis, ProMP
from diffsim_ros.control.reps import (Gaussian, gaussian_kl, reps_dual, reps_update,
                                      reps_weights)
import pytest
import torch

HOME = (0.0, 0.4, 0.0, 1.2)


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_basis_is_normalised_and_derivatives_match_autograd():
    z = torch.linspace(-0.2, 1.2, 301, dtype=torch.float64, requires_grad=True)
    phi, dphi, ddphi = normalized_gaussian_basis(z, 7, 1.3)
    assert torch.allclose(phi.sum(-1), torch.ones_like(z))
    for i in range(7):
        g, = torch.autograd.grad(phi[:, i].sum(), z, create_graph=True, retain_graph=True)
        gg, = torch.autograd.grad(g.sum(), z, retain_graph=True)
        assert torch.allclose(g, dphi[:, i], atol=1e-10)
        assert torch.allclose(gg, ddphi[:, i], atol=1e-8)


def test_promp_starts_at_home_at_rest_ends_at_rest_and_holds():
    promp = ProMP(HOME, duration=1.5, n_basis=9)
    theta = torch.randn(5, promp.dim, dtype=torch.float64, generator=_generator(0))
    times = promp.time_grid(0.001, hold=0.3)
    q, qd, qdd = promp.trajectory(theta, times)
    assert q.shape == (5, times.numel(), 4)
    home = torch.tensor(HOME, dtype=torch.float64)
    assert torch.allclose(q[:, 0], home.expand(5, 4), atol=1e-12)
    for x in (qd[:, 0], qdd[:, 0], qd[:, 1500], qdd[:, 1500], qd[:, -1], qdd[:, -1]):
        assert x.abs().max() < 1e-10
    assert torch.allclose(q[:, -1], q[:, 1500])
    # The movement is not trivial: weights move the arm.
    assert (q - home).abs().max() > 0.1
    # Analytic derivatives against central differences of the trajectory.
    dt = 0.001
    fd = (q[:, 2:1500] - q[:, :1498]) / (2 * dt)
    assert torch.allclose(fd, qd[:, 1:1499], atol=1e-4 * qd.abs().max())
    fdd = (qd[:, 2:1500] - qd[:, :1498]) / (2 * dt)
    assert torch.allclose(fdd, qdd[:, 1:1499], atol=1e-4 * qdd.abs().max())


def test_promp_batched_equals_loop_and_reference_matches_trajectory():
    promp = ProMP(HOME, duration=1.0, n_basis=8)
    theta = torch.randn(3, 2, promp.dim, dtype=torch.float64, generator=_generator(1))
    times = promp.time_grid(0.01)
    q, qd, _ = promp.trajectory(theta, times)
    for i in range(3):
        for j in range(2):
            qi, qdi, _ = promp.trajectory(theta[i, j], times)
            assert torch.allclose(qi, q[i, j]) and torch.allclose(qdi, qd[i, j])
    ref = promp.reference(theta[0, 0], t0=0.5)
    q_ref, _, _ = ref(times + 0.5)
    assert torch.allclose(q_ref, q[0, 0])
    with pytest.raises(ValueError, match='theta'):
        promp.trajectory(theta[..., :-1], times)
    with pytest.raises(ValueError, match='n_basis'):
        ProMP(HOME, duration=1.0, n_basis=5)


def test_reps_temperature_minimises_the_dual_and_meets_the_bound():
    returns = torch.randn(3, 40, dtype=torch.float64, generator=_generator(2)) * 5.0
    epsilon = 0.5
    p, eta = reps_weights(returns, epsilon)
    assert torch.allclose(p.sum(-1), torch.ones(3, dtype=torch.float64))
    kl = (p * torch.log(p * 40)).sum(-1)
    assert torch.allclose(kl, torch.full_like(kl, epsilon), atol=1e-6)
    # The dual is larger anywhere else on a fine grid of temperatures.
    grid = eta[:, None] * torch.logspace(-1, 1, 201, dtype=torch.float64)
    dual = reps_dual(grid.T, returns, epsilon).T
    assert bool((dual >= reps_dual(eta, returns, epsilon)[:, None] - 1e-9).all())


def test_gaussian_kl_matches_closed_form_in_one_dimension():
    p = Gaussian(torch.tensor([[0.3]], dtype=torch.float64),
                 torch.tensor([[[0.5 ** 2]]], dtype=torch.float64))
    q = Gaussian(torch.tensor([[-0.2]], dtype=torch.float64),
                 torch.tensor([[[1.5 ** 2]]], dtype=torch.float64))
    closed = math.log(1.5 / 0.5) + (0.5 ** 2 + 0.5 ** 2) / (2 * 1.5 ** 2) - 0.5
    assert float(gaussian_kl(p, q)) == pytest.approx(closed, rel=1e-12)


def test_ereps_converges_on_a_quadratic_and_respects_the_kl_bound_each_update():
    """Maximise ``-|A (theta - theta*)|^2`` in 6 dims, 4 independent searches at once."""
    gen = _generator(3)
    d, searches, n, kl_bound = 6, 4, 30, 0.3
    optimum = torch.randn(searches, d, dtype=torch.float64, generator=gen)
    A = torch.diag(torch.tensor([1.0, 2.0, 0.5, 1.0, 3.0, 1.0], dtype=torch.float64))
    dist = Gaussian.isotropic(torch.zeros(searches, d, dtype=torch.float64), 1.0)
    start = float(((optimum @ A) ** 2).sum(-1).sqrt().max())
    for _ in range(80):
        samples = dist.sample(n, gen)
        returns = -(((samples - optimum[:, None]) @ A) ** 2).sum(-1)
        step = reps_update(dist, samples, returns, epsilon=1.0, kl_bound=kl_bound)
        assert bool((step.kl_update <= kl_bound + 1e-9).all())
        assert bool((step.kl_samples <= 1.0 + 1e-6).all())
        dist = step.distribution
    error = ((dist.mean - optimum) @ A).pow(2).sum(-1).sqrt()
    assert float(error.max()) < 0.05 * start
    assert float(torch.linalg.eigvalsh(dist.cov).max()) < 0.01
