"""Tests of the batched friction-cone solver and its implicit backward."""

from diffsim_ros.core import contact_residual, project_friction_cone, solve_contact_impulses
import pytest
import torch


def _problem(seed: int, batch: int = 4, nc: int = 3, rank: int = 12, shift: float = 0.1,
             tangent_scale: float = 1.0):
    g = torch.Generator().manual_seed(seed)
    m = 3 * nc
    J = torch.randn(batch, m, rank, dtype=torch.float64, generator=g)
    A = J @ J.mT / rank + shift * torch.eye(m, dtype=torch.float64)
    b = torch.randn(batch, m, dtype=torch.float64, generator=g)
    mu = 0.2 + torch.rand(batch, nc, dtype=torch.float64, generator=g)
    b.reshape(batch, nc, 3)[..., 1:] *= tangent_scale
    return A, b, mu


def test_projection_is_the_euclidean_projection():
    g = torch.Generator().manual_seed(0)
    y = 3 * torch.randn(2000, 3, dtype=torch.float64, generator=g)
    mu = torch.rand(2000, dtype=torch.float64, generator=g)
    p = project_friction_cone(y, mu)
    assert (p[:, 1:].norm(dim=-1) - mu * p[:, 0]).max() <= 1e-12
    assert torch.allclose(project_friction_cone(p, mu), p, atol=1e-14)
    # Variational inequality of a projection onto a convex set: (y - p).(z - p) <= 0.
    z = project_friction_cone(torch.randn(2000, 3, dtype=torch.float64, generator=g), mu)
    assert ((y - p) * (z - p)).sum(-1).max() <= 1e-12


def test_solution_satisfies_the_cone_complementarity_conditions():
    A, b, mu = _problem(1)
    lam = solve_contact_impulses(A, b, mu, tol=1e-13)
    assert contact_residual(A, b, mu, lam).max() <= 1e-10
    # Primal in K, dual velocity in K* = {mu |w_t| <= w_n}, complementary.
    w = (A @ lam.unsqueeze(-1)).squeeze(-1) + b
    lam3, w3 = lam.reshape(4, 3, 3), w.reshape(4, 3, 3)
    assert (lam3[..., 1:].norm(dim=-1) - mu * lam3[..., 0]).max() <= 1e-10
    assert (mu * w3[..., 1:].norm(dim=-1) - w3[..., 0]).max() <= 1e-9
    assert (lam * w).sum(-1).abs().max() <= 1e-9

    # Against brute force: no feasible perturbation lowers the QP objective.
    def objective(x):
        return 0.5 * (x.unsqueeze(-2) @ A @ x.unsqueeze(-1)).squeeze() + (b * x).sum(-1)
    g = torch.Generator().manual_seed(2)
    for _ in range(200):
        trial = project_friction_cone(
            (lam + 0.05 * torch.randn(lam.shape, dtype=lam.dtype, generator=g)
             ).reshape(4, 3, 3), mu).reshape(lam.shape)
        assert (objective(trial) >= objective(lam) - 1e-12).all()


def test_implicit_backward_matches_gradcheck():
    A, b, mu = _problem(13, batch=3, tangent_scale=0.2)
    # The nine contacts are three inside the cone (sticking), three on its surface
    # (sliding) and three separated, so every branch of the projection is checked:
    lam = solve_contact_impulses(A, b, mu, tol=1e-13).reshape(3, 3, 3)
    inside = lam[..., 1:].norm(dim=-1) < mu * lam[..., 0] - 1e-6
    edge = (lam[..., 1:].norm(dim=-1) - mu * lam[..., 0]).abs() < 1e-9
    off = lam.abs().amax(-1) == 0
    assert inside.any() and (edge & ~off).any() and off.any()
    inputs = tuple(x.clone().requires_grad_(True) for x in (A, b, mu))

    def solve(A, b, mu):
        return solve_contact_impulses(0.5 * (A + A.mT), b, mu, tol=1e-14)
    assert torch.autograd.gradcheck(solve, inputs, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize('backend, node', [('torch', '_ContactImpulsesBackward'),
                                           ('native', 'NativeContactImpulsesBackward')])
def test_backward_does_not_unroll_iterations(backend, node):
    A, b, mu = _problem(4)
    b = b.clone().requires_grad_(True)
    lam = solve_contact_impulses(A, b, mu, backend=backend)
    # One custom node (behind the reshapes of the batch), not a chain of iteration nodes.
    fn = lam.grad_fn
    while type(fn).__name__ in ('ViewBackward0', 'ReshapeAliasBackward0'):
        fn = fn.next_functions[0][0]
    assert type(fn).__name__ == node


def test_batched_equals_loop():
    A, b, mu = _problem(5, batch=6)
    batched = solve_contact_impulses(A, b, mu, tol=1e-13)
    for i in range(6):
        single = solve_contact_impulses(A[i], b[i], mu[i], tol=1e-13)
        assert torch.allclose(batched[i], single, atol=1e-10)


@pytest.mark.parametrize('mu_value', [0.0, 0.5])
def test_single_contact_closed_form(mu_value):
    # One contact with A = I: the solution is the projection of -b onto the cone.
    A = torch.eye(3, dtype=torch.float64)
    b = torch.tensor([-1.0, 0.8, -0.3], dtype=torch.float64)
    mu = torch.tensor([mu_value], dtype=torch.float64)
    lam = solve_contact_impulses(A, b, mu, tol=1e-14)
    expected = project_friction_cone((-b).reshape(1, 3), mu).reshape(3)
    assert torch.allclose(lam, expected, atol=1e-12)
