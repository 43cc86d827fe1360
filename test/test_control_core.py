"""Control core: feedback policies, model dynamics and their Jacobians, costs, iLQR, MPPI."""

import dataclasses
import math

from diffsim_ros import robots
from diffsim_ros.control import (box_qp, Controller, FeedbackPolicy, ILQR, ILQRConfig,
                                 ModelDynamics, MPPI, MPPIConfig, QuadraticCost, state_error,
                                 TrackingCost, wrap_angle)
from diffsim_ros.control import dynamics as dynamics_module
from diffsim_ros.control import ilqr as ilqr_module
from diffsim_ros.control.costs import CostDerivatives
from diffsim_ros.control.ilqr import closed_loop_rollout
from diffsim_ros.core import load_urdf, native_available
from diffsim_ros.core import native as native_module
from diffsim_ros.core.errors import ShapeError
from diffsim_ros.core.native import feedback_rollout_native, riccati_backward_native
import pytest
import torch

F64 = torch.float64

# A point mass on two orthogonal horizontal prismatic joints: with semi-implicit Euler its
# dynamics are exactly linear, x' = A x + B u, so iLQR must reproduce discrete LQR.
POINT_MASS_URDF = """<?xml version="1.0"?>
<robot name="point_mass">
  <link name="base"/>
  <joint name="x" type="prismatic">
    <parent link="base"/><child link="slider"/>
    <axis xyz="1 0 0"/><limit lower="-10" upper="10" effort="100" velocity="10"/>
  </joint>
  <link name="slider">
    <inertial><mass value="0.5"/><inertia ixx="0.01" ixy="0" ixz="0" iyy="0.01" iyz="0"
      izz="0.01"/></inertial>
  </link>
  <joint name="y" type="prismatic">
    <parent link="slider"/><child link="mass"/>
    <axis xyz="0 1 0"/><limit lower="-10" upper="10" effort="100" velocity="10"/>
  </joint>
  <link name="mass">
    <inertial><mass value="1.5"/><inertia ixx="0.01" ixy="0" ixz="0" iyy="0.01" iyz="0"
      izz="0.01"/></inertial>
  </link>
</robot>
"""
POINT_MASS = (2.0, 1.5)   # kg moved by joint x (both bodies) and by joint y


def point_mass_dynamics(dt=0.1, **kw):
    model = load_urdf(xml=POINT_MASS_URDF, dtype=F64)
    return ModelDynamics(model, dt, friction=False, **kw)


def point_mass_matrices(dt):
    A = torch.eye(4, dtype=F64)
    A[0, 2] = A[1, 3] = dt
    B = torch.zeros(4, 2, dtype=F64)
    for j, mass in enumerate(POINT_MASS):
        B[j, j] = dt * dt / mass
        B[2 + j, j] = dt / mass
    return A, B


def discrete_lqr(A, B, Q, R, Qf, horizon):
    """Finite-horizon LQR gains ``u_k = -L_k x_k`` (cost without factor 1/2)."""
    P, gains = Qf, []
    for _ in range(horizon):
        L = torch.linalg.solve(R + B.T @ P @ B, B.T @ P @ A)
        P = Q + A.T @ P @ (A - B @ L)
        gains.append(L)
    return gains[::-1]


def qube_dynamics(dt=0.04):
    return ModelDynamics.for_robot('qube', load_urdf(robots.urdf_path('qube'), dtype=F64), dt)


def swing_up_cost():
    return QuadraticCost(torch.tensor([0.01, 0.1, 0.001, 0.001]), torch.tensor([0.001]),
                         torch.tensor([10.0, 100.0, 1.0, 1.0]),
                         torch.tensor([0.0, math.pi, 0.0, 0.0], dtype=F64),
                         angle_mask=torch.tensor([False, True, False, False]))


def make_policy(H=4, nu=2, nx=3):
    g = torch.Generator().manual_seed(0)
    return FeedbackPolicy(t0=1.0, dt=0.1, u_ff=torch.randn(H, nu, generator=g, dtype=F64),
                          K=torch.randn(H, nu, nx, generator=g, dtype=F64),
                          x_ref=torch.randn(H + 1, nx, generator=g, dtype=F64),
                          u_min=torch.full((nu,), -1.0, dtype=F64),
                          u_max=torch.full((nu,), 1.0, dtype=F64))


# -- FeedbackPolicy ---------------------------------------------------------------------------
def test_policy_index_is_floor_of_elapsed_steps_clamped_to_horizon():
    policy = make_policy()
    assert [policy.index(t) for t in (0.0, 1.0, 1.05, 1.1, 1.2999, 1.3, 1.7, 99.0)] == \
        [0, 0, 0, 1, 2, 3, 3, 3]
    assert policy.index(float('nan')) == 0 and policy.index(float('inf')) == 3


def test_policy_applies_affine_feedback_and_clips():
    policy = make_policy()
    x = torch.tensor([0.3, -0.2, 0.1], dtype=F64)
    for t, k in ((1.0, 0), (1.15, 1), (5.0, 3)):
        expected = policy.u_ff[k] + policy.K[k] @ (x - policy.x_ref[k])
        assert torch.equal(policy(t, x), expected.clamp(-1.0, 1.0))
    batch = torch.stack((x, 2 * x))
    assert policy(1.0, batch).shape == (2, 2)


def test_interpolating_policy_follows_the_planned_path_between_knots():
    held = make_policy()
    policy = dataclasses.replace(held, interpolate=True)
    x = torch.tensor([0.3, -0.2, 0.1], dtype=F64)
    # At the knots and outside the horizon it equals the held policy.
    for t in (0.0, 1.0, 1.1, 1.3):
        torch.testing.assert_close(policy(t, x), held(t, x))
    torch.testing.assert_close(policy.reference(99.0), policy.x_ref[-1])
    # Between knots the reference is interpolated; feedforward and gain stay held.
    x_mid = torch.lerp(policy.x_ref[1], policy.x_ref[2], 0.25)
    torch.testing.assert_close(policy.reference(1.125), x_mid)
    expected = policy.u_ff[1] + policy.K[1] @ (x - x_mid)
    torch.testing.assert_close(policy(1.125, x), expected.clamp(-1.0, 1.0))
    assert policy.shifted(1).interpolate


def test_policy_non_finite_state_gives_clipped_feedforward():
    policy = make_policy()
    for bad in (float('nan'), float('inf')):
        u = policy(1.0, torch.tensor([bad, 0.0, 0.0], dtype=F64))
        assert torch.equal(u, policy.u_ff[0].clamp(-1.0, 1.0))


def test_policy_wraps_masked_angles():
    policy = FeedbackPolicy(0.0, 0.1, torch.zeros(1, 1, dtype=F64),
                            torch.ones(1, 1, 2, dtype=F64), torch.zeros(2, 2, dtype=F64),
                            torch.tensor([-10.0], dtype=F64), torch.tensor([10.0], dtype=F64),
                            angle_mask=torch.tensor([True, False]))
    x = torch.tensor([2 * math.pi + 0.25, 0.5], dtype=F64)
    assert torch.allclose(policy(0.0, x), torch.tensor([0.75], dtype=F64))
    angles = torch.linspace(-20, 20, 1001, dtype=F64)
    wrapped = wrap_angle(angles)
    assert bool((wrapped > -math.pi).all()) and bool((wrapped <= math.pi).all())
    assert torch.allclose(torch.sin(wrapped), torch.sin(angles), atol=1e-12)
    assert float(wrap_angle(torch.tensor(-math.pi, dtype=F64))) == pytest.approx(math.pi)


def test_policy_shifted_drops_steps_and_repeats_the_last():
    policy = make_policy(H=4)
    shifted = policy.shifted(1)
    assert shifted.t0 == pytest.approx(1.1) and shifted.horizon == 4
    assert torch.equal(shifted.u_ff[:3], policy.u_ff[1:])
    assert torch.equal(shifted.u_ff[3], policy.u_ff[3])
    assert torch.equal(shifted.x_ref[:4], policy.x_ref[1:])
    assert torch.equal(shifted.K[3], policy.K[3])
    far = policy.shifted(10)
    assert torch.equal(far.u_ff, policy.u_ff[-1].expand(4, 2))
    assert policy.shifted(0) is policy
    x = torch.tensor([0.1, 0.2, 0.3], dtype=F64)
    assert torch.equal(shifted(1.25, x), policy(1.25, x))
    with pytest.raises(ValueError):
        policy.shifted(-1)


def test_policy_constant_and_shape_errors():
    policy = FeedbackPolicy.constant(torch.tensor([5.0, -0.5], dtype=F64), 3,
                                     torch.full((2,), -1.0, dtype=F64),
                                     torch.full((2,), 1.0, dtype=F64), dt=0.01)
    assert torch.equal(policy(3.0, torch.randn(3, dtype=F64)),
                       torch.tensor([1.0, -0.5], dtype=F64))
    with pytest.raises(ShapeError, match=r'K: expected shape \(4, 2, 3\)'):
        FeedbackPolicy(0.0, 0.1, torch.zeros(4, 2), torch.zeros(4, 3, 3), torch.zeros(5, 3),
                       torch.zeros(2), torch.zeros(2))
    with pytest.raises(ValueError, match='dt'):
        FeedbackPolicy(0.0, 0.0, torch.zeros(4, 2), torch.zeros(4, 2, 3), torch.zeros(5, 3),
                       torch.zeros(2), torch.zeros(2))


# -- dynamics -----------------------------------------------------------------------------------
def finite_difference_jacobians(dyn, x, u, eps=1e-6):
    def column(f, v):
        basis = torch.eye(v.shape[-1], dtype=F64)
        return torch.stack([(f(v + eps * e) - f(v - eps * e)) / (2 * eps) for e in basis], -1)
    return column(lambda v: dyn.step(v, u), x), column(lambda v: dyn.step(x, v), u)


@pytest.mark.parametrize('robot', ['qube', 'panda'])
def test_autograd_jacobians_match_finite_differences(robot):
    model = load_urdf(xml=robots.urdf_string(robot), dtype=F64)
    dyn = ModelDynamics.for_robot(robot, model, 0.01, method='rk4')
    g = torch.Generator().manual_seed(1)
    H = 3
    x = 0.5 * torch.randn(H, dyn.nx, generator=g, dtype=F64)
    u = 0.5 * torch.randn(H, dyn.nu, generator=g, dtype=F64)
    A, B = dyn.jacobians(x, u)
    assert A.shape == (H, dyn.nx, dyn.nx) and B.shape == (H, dyn.nx, dyn.nu)
    for k in range(H):
        A_fd, B_fd = finite_difference_jacobians(dyn, x[k], u[k])
        assert torch.allclose(A[k], A_fd, rtol=1e-6, atol=1e-7)
        assert torch.allclose(B[k], B_fd, rtol=1e-6, atol=1e-7)


def test_qube_dynamics_uses_the_dc_motor_and_catalog_limits():
    dyn = qube_dynamics(0.01)
    assert (dyn.nx, dyn.nu) == (4, 1)
    assert torch.equal(dyn.u_max, torch.tensor([4.0], dtype=F64))
    assert torch.equal(dyn.u_min, -dyn.u_max)
    q = torch.zeros(2, dtype=F64)
    qd = torch.tensor([2.0, 0.0], dtype=F64)
    tau = dyn.torque(q, qd, torch.tensor([3.0], dtype=F64))
    expected = 0.042 * (3.0 - 0.042 * 2.0) / 8.4 - 5e-6 * 2.0
    assert float(tau[0]) == pytest.approx(expected, rel=1e-9)
    assert float(tau[1]) == pytest.approx(0.0, abs=1e-12)


def test_step_is_batched_over_states_and_model_particles():
    dyn = qube_dynamics(0.01)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(5, 4, generator=g, dtype=F64)
    u = torch.randn(5, 1, generator=g, dtype=F64)
    batched = dyn.step(x, u)
    assert torch.allclose(batched, torch.stack([dyn.step(x[i], u[i]) for i in range(5)]),
                          rtol=1e-12, atol=1e-12)
    scale = torch.tensor([1.0, 1.3], dtype=F64)[:, None, None, None]
    particles = dyn.with_model(dyn.model.replace(inertial=dyn.model.inertial * scale))
    out = particles.step(x, u)
    assert out.shape == (2, 5, 4)
    assert torch.allclose(out[0], batched, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(out[1], batched)


# -- costs --------------------------------------------------------------------------------------
def test_quadratic_cost_total_and_derivatives():
    g = torch.Generator().manual_seed(3)
    mask = torch.tensor([True, False, False, False])
    R = torch.tensor([[0.3, 0.1], [0.1, 0.2]])
    cost = QuadraticCost(torch.tensor([1.0, 2.0, 0.5, 0.1]), R,
                         torch.tensor([3.0, 1.0, 1.0, 1.0]),
                         torch.tensor([math.pi, 0.5, 0.0, 0.0], dtype=F64),
                         u_goal=torch.tensor([0.1, -0.1]), angle_mask=mask, rate_weight=0.7)
    H = 5
    X = torch.randn(H + 1, 4, generator=g, dtype=F64)
    U = torch.randn(H, 2, generator=g, dtype=F64)
    u_prev = torch.randn(2, generator=g, dtype=F64)
    expected = sum(cost.stage(X[k], U[k], k) for k in range(H)) + cost.terminal(X[H])
    expected = expected + 0.7 * (torch.diff(torch.cat((u_prev[None], U)), dim=0) ** 2).sum()
    assert torch.allclose(cost.total(X, U, u_prev), expected, rtol=1e-12)
    shifted = X + 2 * math.pi * mask.to(F64)
    batched = cost.total(torch.stack((X, shifted)), torch.stack((U, U)), u_prev)
    assert torch.allclose(batched[0], batched[1], rtol=1e-10)

    no_rate = QuadraticCost(cost.Q, cost.R, cost.Qf, cost.x_goal, cost.u_goal, mask)
    d = no_rate.derivatives(X, U)
    Xg, Ug = X.clone().requires_grad_(), U.clone().requires_grad_()
    gx, gu = torch.autograd.grad(no_rate.total(Xg, Ug), (Xg, Ug))
    assert torch.allclose(d.lx, gx[:H]) and torch.allclose(d.vx, gx[H])
    assert torch.allclose(d.lu, gu)
    hess = torch.autograd.functional.hessian(lambda x: no_rate.stage(x, U[0], 0), X[0])
    assert torch.allclose(d.lxx[0], hess)


def test_tracking_cost_resolves_a_callable_reference():
    def reference(t):
        return torch.stack((torch.sin(t), torch.cos(t)), -1)

    cost = TrackingCost(reference, 1.0, 0.1, 2.0)
    bound = cost.bind(0.5, 0.1, 3)
    times = 0.5 + 0.1 * torch.arange(4, dtype=F64)
    assert torch.allclose(bound.x_ref, reference(times).to(bound.x_ref))
    X = bound.x_ref.clone()
    assert float(bound.total(X, torch.zeros(3, 1, dtype=bound.Q.dtype))) == pytest.approx(0.0)
    scalar_only = TrackingCost(lambda t: [math.sin(t), math.cos(t)], 1.0, 0.1, 2.0)
    assert torch.allclose(scalar_only.bind(0.5, 0.1, 3).x_ref, bound.x_ref)
    short = TrackingCost(torch.zeros(2, 2), 1.0, 0.1, 2.0).bind(0.0, 0.1, 4)
    assert short.x_ref.shape == (5, 2)


# -- iLQR ---------------------------------------------------------------------------------------
def test_box_qp_matches_the_bounded_minimiser():
    H = torch.tensor([[2.0, 0.5], [0.5, 1.0]], dtype=F64)
    g = torch.tensor([-4.0, 0.2], dtype=F64)
    lower, upper = torch.full((2,), -1.0, dtype=F64), torch.full((2,), 1.0, dtype=F64)
    x, free, ok = box_qp(H, g, lower, upper)
    assert ok and x[0] == 1.0 and free.tolist() == [False, True]
    assert float(x[1]) == pytest.approx(-(0.2 + 0.5 * 1.0) / 1.0)
    x, free, ok = box_qp(H, torch.tensor([-1.0, 0.2], dtype=F64), lower, upper)
    assert free.all() and torch.allclose(H @ x, torch.tensor([1.0, -0.2], dtype=F64))


def test_ilqr_equals_discrete_lqr_on_a_linear_system():
    dt, H = 0.1, 20
    dyn = point_mass_dynamics(dt)
    A, B = point_mass_matrices(dt)
    A_ad, B_ad = dyn.jacobians(torch.zeros(4, dtype=F64), torch.zeros(2, dtype=F64))
    assert torch.allclose(A_ad, A, atol=1e-14) and torch.allclose(B_ad, B, atol=1e-14)
    Q = torch.diag(torch.tensor([1.0, 2.0, 0.1, 0.1], dtype=F64))
    R = torch.diag(torch.tensor([0.01, 0.02], dtype=F64))
    Qf = 10 * Q
    cost = QuadraticCost(Q, R, Qf, torch.zeros(4, dtype=F64))
    ctrl = ILQR(dyn, cost, ILQRConfig(horizon=H, max_iters=5, tol=1e-12, mu_init=0.0,
                                      mu_min=0.0))
    x0 = torch.tensor([1.0, -0.5, 0.2, 0.3], dtype=F64)
    policy = ctrl.solve(x0)
    gains = discrete_lqr(A, B, Q, R, Qf, H)
    x = x0
    for k in range(H):
        u = -gains[k] @ x
        assert torch.allclose(policy.u_ff[k], u, rtol=1e-8, atol=1e-10)
        assert torch.allclose(policy.K[k], -gains[k], rtol=1e-8, atol=1e-10)
        x = A @ x + B @ u
    assert torch.allclose(policy.x_ref[-1], x, atol=1e-10)
    assert ctrl.info['converged']


def test_ilqr_respects_box_limits_and_decreases_the_cost_monotonically():
    dt, H = 0.1, 15
    limit = torch.tensor([0.4, 0.25], dtype=F64)
    dyn = point_mass_dynamics(dt, u_min=-limit, u_max=limit)
    cost = QuadraticCost(torch.tensor([1.0, 1.0, 0.1, 0.1]), torch.tensor([0.01, 0.01]),
                         torch.tensor([20.0, 20.0, 2.0, 2.0]), torch.zeros(4, dtype=F64))
    ctrl = ILQR(dyn, cost, ILQRConfig(horizon=H, max_iters=50, tol=1e-12))
    x0 = torch.tensor([1.0, -0.8, 0.0, 0.0], dtype=F64)
    policy = ctrl.solve(x0)
    assert bool((policy.u_ff.abs() <= limit + 1e-12).all())
    at_bound = (policy.u_ff.abs() >= limit - 1e-9)
    assert bool(at_bound.any())
    assert float(policy.K[at_bound].abs().max()) == 0.0
    costs = ctrl.info['costs']
    assert all(b <= a for a, b in zip(costs, costs[1:]))

    bounds = [(-float(limit[j]), float(limit[j])) for _ in range(H) for j in range(2)]
    assert ctrl.info['cost'] <= linear_qp_optimum(cost, x0, dt, H, bounds) + 1e-6


def linear_qp_optimum(cost, x0, dt, H, bounds=None, u_prev=None):
    """Minimise the cost over the command sequence of the linear point mass with L-BFGS-B."""
    from scipy.optimize import minimize

    A, B = point_mass_matrices(dt)

    def objective(flat):
        U = torch.tensor(flat, dtype=F64).reshape(H, 2).requires_grad_()
        states = [x0]
        for k in range(H):
            states.append(A @ states[-1] + B @ U[k])
        value = cost.total(torch.stack(states), U, u_prev)
        (grad,) = torch.autograd.grad(value, U)
        return float(value.detach()), grad.flatten().numpy()

    result = minimize(objective, torch.zeros(2 * H).numpy(), jac=True, method='L-BFGS-B',
                      bounds=bounds, options={'ftol': 1e-15, 'gtol': 1e-12, 'maxiter': 5000})
    return result.fun


def test_ilqr_rate_penalty_is_optimised_exactly_through_the_augmented_state():
    dt, H = 0.1, 12
    dyn = point_mass_dynamics(dt)
    cost = QuadraticCost(torch.tensor([1.0, 1.0, 0.1, 0.1]), torch.tensor([0.01, 0.01]),
                         torch.tensor([20.0, 20.0, 2.0, 2.0]), torch.zeros(4, dtype=F64),
                         rate_weight=0.5)
    ctrl = ILQR(dyn, cost, ILQRConfig(horizon=H, max_iters=4, tol=1e-12, mu_init=0.0,
                                      mu_min=0.0))
    x0 = torch.tensor([1.0, -0.8, 0.0, 0.0], dtype=F64)
    ctrl.solve(x0)
    assert ctrl.info['cost'] == pytest.approx(linear_qp_optimum(cost, x0, dt, H), rel=1e-7)
    # The next solve knows the command applied before its horizon and prices its rate.
    ctrl.solve(x0, t=dt)
    u_prev = ctrl._u_prev
    assert u_prev is not None
    assert ctrl.info['cost'] == pytest.approx(
        linear_qp_optimum(cost, x0, dt, H, u_prev=u_prev), rel=1e-7)


def test_ilqr_swings_up_the_qube_within_the_voltage_limit():
    dyn = qube_dynamics(0.04)
    cost = swing_up_cost()
    ctrl = ILQR(dyn, cost, ILQRConfig(horizon=50, max_iters=40, tol=1e-6))
    assert isinstance(ctrl, Controller)
    x0 = torch.tensor([0.0, 0.01, 0.0, 0.0], dtype=F64)
    policy = ctrl.solve(x0)
    assert bool((policy.u_ff.abs() <= 4.0).all())
    states = dyn.rollout(x0, policy.u_ff)          # open loop on the same model
    error = state_error(states[-1], cost.x_goal, cost.angle_mask)
    assert abs(float(error[1])) < 0.1, f'final pendulum error {error.tolist()}'
    assert abs(float(states[-1, 3])) < 1.0
    costs = ctrl.info['costs']
    assert all(b <= a for a, b in zip(costs, costs[1:]))
    # Warm start: one step later, the shifted plan is the starting point and stays good.
    ctrl.set_model(dyn.model)
    again = ctrl.solve(states[1], t=0.04)
    assert ctrl.info['costs'][0] < 0.5 * costs[0]
    assert again.t0 == pytest.approx(0.04)
    ctrl.reset()
    assert ctrl._controls is None


def test_ilqr_non_finite_state_returns_a_finite_plan():
    dyn = point_mass_dynamics()
    ctrl = ILQR(dyn, QuadraticCost(1.0, torch.ones(2), 1.0, torch.zeros(4, dtype=F64)),
                ILQRConfig(horizon=5))
    policy = ctrl.solve(torch.tensor([float('nan'), 0, 0, 0], dtype=F64))
    assert bool(torch.isfinite(policy(0.0, torch.zeros(4, dtype=F64))).all())


def test_ilqr_config_rejects_bad_values():
    with pytest.raises(ValueError, match='alphas'):
        ILQRConfig(alphas=(1.5,))
    with pytest.raises(TypeError):
        ILQRConfig(horizn=5)


# -- MPPI ---------------------------------------------------------------------------------------
def test_mppi_reduces_the_cost_of_a_double_integrator_and_is_seeded():
    dyn = point_mass_dynamics(0.1)
    cost = QuadraticCost(torch.tensor([1.0, 1.0, 0.1, 0.1]), torch.tensor([0.01, 0.01]),
                         torch.tensor([10.0, 10.0, 1.0, 1.0]), torch.zeros(4, dtype=F64))
    config = MPPIConfig(horizon=15, samples=128, lambda_=0.5, noise_std=2.0, iters=4, seed=7)
    x0 = torch.tensor([1.0, -1.0, 0.0, 0.0], dtype=F64)
    ctrl = MPPI(dyn, cost, config)
    policy = ctrl.solve(x0)
    costs = ctrl.info['costs']
    assert costs[-1] < 0.5 * costs[0]
    assert float(policy.K.abs().max()) == 0.0
    twin = MPPI(dyn, cost, config).solve(x0)
    assert torch.equal(twin.u_ff, policy.u_ff)


def test_mppi_averages_costs_over_model_particles():
    dyn = qube_dynamics(0.04)
    scale = torch.tensor([0.8, 1.0, 1.25], dtype=F64)[:, None, None]
    particles = dyn.model.replace(inertial=dyn.model.inertial * scale)
    ctrl = MPPI(dyn.with_model(particles), swing_up_cost(),
                MPPIConfig(horizon=10, samples=8, lambda_=1.0, noise_std=1.0))
    assert ctrl.particles == 3
    x0 = torch.tensor([0.0, 0.3, 0.0, 0.0], dtype=F64)
    U = torch.randn(8, 10, 1, generator=torch.Generator().manual_seed(4), dtype=F64)
    values, _ = ctrl.evaluate(x0, U)
    single = [MPPI(dyn.with_model(dyn.model.replace(inertial=dyn.model.inertial * s)),
                   swing_up_cost(), MPPIConfig(horizon=10, samples=8)).evaluate(x0, U)[0]
              for s in scale.flatten().tolist()]
    assert torch.allclose(values, torch.stack(single).mean(0), rtol=1e-12)
    policy = ctrl.solve(x0)
    assert policy.u_ff.shape == (10, 1) and policy.x_ref.shape == (11, 4)


# -- fast path (issue #5) -----------------------------------------------------------------------
@pytest.mark.parametrize('robot', ['qube', 'panda'])
def test_difference_jacobians_match_autograd(robot):
    # The compiled path's central differences, run here through the eager step.
    model = load_urdf(xml=robots.urdf_string(robot), dtype=F64)
    dyn = ModelDynamics.for_robot(robot, model, 0.01)
    g = torch.Generator().manual_seed(5)
    x = 0.5 * torch.randn(3, dyn.nx, generator=g, dtype=F64)
    u = 0.5 * torch.randn(3, dyn.nu, generator=g, dtype=F64)
    A, B = dyn.jacobians(x, u)
    A_fd, B_fd = dyn._difference_jacobians(x, u)
    assert A_fd.shape == A.shape and B_fd.shape == B.shape
    assert torch.allclose(A_fd, A, rtol=1e-7, atol=1e-8)
    assert torch.allclose(B_fd, B, rtol=1e-7, atol=1e-8)


@pytest.mark.parametrize('robot,substeps', [('qube', 1), ('qube', 3), ('panda', 2)])
def test_native_jacobians_are_closed_form_and_match_autograd(robot, substeps):
    # native dynamics chain aba_derivatives through the torque map and the Euler update;
    # velocities inside the Coulomb ramp exercise its tanh slope
    model = load_urdf(xml=robots.urdf_string(robot), dtype=F64)
    native = ModelDynamics.for_robot(robot, model, 0.01, native=True, substeps=substeps)
    if not native.native:
        pytest.skip('the native kernels are not available here')
    eager = ModelDynamics.for_robot(robot, model, 0.01, substeps=substeps)
    g = torch.Generator().manual_seed(6)
    x = 0.5 * torch.randn(4, native.nx, generator=g, dtype=F64)
    x[:2, model.n:] *= 0.01
    u = 0.5 * torch.randn(4, native.nu, generator=g, dtype=F64)
    A, B = native.jacobians(x, u)
    A_ref, B_ref = eager.jacobians(x, u)
    assert A.shape == A_ref.shape and B.shape == B_ref.shape
    assert torch.allclose(A, A_ref, rtol=1e-10, atol=1e-12)
    assert torch.allclose(B, B_ref, rtol=1e-10, atol=1e-12)


def test_compile_option_is_kept_and_compiled_code_is_shared_per_robot():
    dyn = qube_dynamics(0.02)
    assert not dyn.compiled and dyn.with_model(dyn.model, compile=True).compiled
    cost = swing_up_cost()
    ctrl = ILQR(dyn, cost, ILQRConfig(horizon=5, compile=True))
    assert ctrl.dynamics.compiled
    ctrl.set_model(dyn.model.replace(inertial=dyn.model.inertial * 1.1))
    assert ctrl.dynamics.compiled
    other = ILQR(qube_dynamics(0.04), cost, ILQRConfig(horizon=5, compile=True))
    # torch.compile is lazy: nothing is compiled until the first call.
    compiled, step = dynamics_module.compiled, dynamics_module._eager_step
    assert compiled('step', step, ctrl.dynamics) is compiled('step', step, other.dynamics)
    panda = ModelDynamics.for_robot('panda', load_urdf(xml=robots.urdf_string('panda')), 0.01)
    assert compiled('step', step, panda) is not compiled('step', step, ctrl.dynamics)


def test_box_qp_clamps_every_command_of_a_strongly_pushed_problem():
    H = torch.tensor([[1.0, 0.9], [0.9, 1.0]], dtype=F64)
    x, free, ok = box_qp(H, torch.tensor([5.0, 5.0], dtype=F64),
                         torch.full((2,), -1.0, dtype=F64), torch.full((2,), 1.0, dtype=F64))
    assert ok and x.dtype == F64 and free.dtype == torch.bool
    assert torch.equal(x, torch.tensor([-1.0, -1.0], dtype=F64)) and not free.any()


@pytest.fixture(scope='module')
def rollout_kernel():
    """Build (or load) the C++ kernels once; skip when they cannot be built here."""
    available, reason = native_available()
    if not available:
        pytest.skip(f'native kernels unavailable: {reason}')
    return True


@pytest.mark.parametrize('robot', ['qube', 'cartpole', 'panda'])
def test_native_rollouts_equal_the_torch_steps(rollout_kernel, robot):
    # DC motors (Quanser, one prismatic axis) or torques on every joint (Panda), with viscous
    # and Coulomb friction and two substeps per step: every kernel path against torch.
    g = torch.Generator().manual_seed(3)
    model = load_urdf(xml=robots.urdf_string(robot), dtype=F64)
    model = model.replace(damping=0.01 * torch.rand(model.n, generator=g, dtype=F64),
                          friction=0.02 * torch.rand(model.n, generator=g, dtype=F64))
    limit = ModelDynamics.for_robot(robot, model, 0.01).u_max.clamp(max=5.0)
    # limits of half the commands' scale, so that the closed loop clips
    eager = ModelDynamics.for_robot(robot, model, 0.01, substeps=2, u_min=-0.5 * limit,
                                    u_max=0.5 * limit)
    fast = ModelDynamics.for_robot(robot, model, 0.01, substeps=2, u_min=-0.5 * limit,
                                   u_max=0.5 * limit, native=True)
    assert fast.native and not eager.native
    x0 = 0.3 * torch.randn(4, eager.nx, generator=g, dtype=F64)
    u = 0.5 * limit * torch.randn(4, 12, eager.nu, generator=g, dtype=F64)
    with torch.no_grad():
        expected = eager.rollout(x0, u)
        torch.testing.assert_close(fast.rollout(x0, u), expected, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(fast.step(x0[0], u[0, 0]), expected[0, 1], rtol=1e-10,
                                   atol=1e-10)
        H = u.shape[1]
        k = 0.3 * limit * torch.randn(H, eager.nu, generator=g, dtype=F64)
        alphas = torch.tensor([1.0, 0.5, 0.1], dtype=F64)
        for columns in (eager.nx, eager.nx + eager.nu):   # plain and rate-augmented gains
            K = 0.05 * torch.randn(H, eager.nu, columns, generator=g, dtype=F64)
            args = (x0[1], expected[0], u[0], k, K, alphas, 0.5 * u[0, 0])
            states, commands = closed_loop_rollout(eager, *args)
            fast_states, fast_commands = closed_loop_rollout(fast, *args)
            clipped = commands.abs() >= eager.u_max - 1e-12
            assert bool(clipped.any()) and not bool(clipped.all())
            torch.testing.assert_close(fast_states, states, rtol=1e-10, atol=1e-10)
            torch.testing.assert_close(fast_commands, commands, rtol=1e-10, atol=1e-10)
    A, B = eager.jacobians(x0, u[:, 0])
    A_fast, B_fast = fast.jacobians(x0, u[:, 0])
    torch.testing.assert_close(A_fast, A, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(B_fast, B, rtol=1e-6, atol=1e-7)


def test_native_rollouts_fall_back_where_the_kernel_does_not_apply(rollout_kernel):
    model = load_urdf(xml=robots.urdf_string('qube'), dtype=F64)
    assert not ModelDynamics.for_robot('qube', model, 0.01, method='rk4', native=True).native
    batched = model.replace(inertial=model.inertial.expand(3, -1, -1))
    assert not ModelDynamics.for_robot('qube', batched, 0.01, native=True).native

    def actuator(q, qd, u):
        return torch.cat((u, torch.zeros_like(u)), -1)
    custom = ModelDynamics(model, 0.01, actuator=actuator, native=True)
    assert not custom.native
    fast = ModelDynamics.for_robot('qube', model, 0.01, native=True)
    x = torch.tensor([0.1, 0.2, 0.0, 0.0], dtype=F64, requires_grad=True)
    step = fast.step(x, torch.ones(1, dtype=F64))   # gradients: the torch step
    assert step.requires_grad
    torch.testing.assert_close(step.detach(), fast.with_model(model, native=False).step(
        x.detach(), torch.ones(1, dtype=F64)))


def test_feedback_rollout_native_is_the_kernel_of_the_dynamics(rollout_kernel):
    # the one-off function (kernel built per call) against the cached kernel of the dynamics
    model = load_urdf(xml=robots.urdf_string('panda'), dtype=F64)
    fast = ModelDynamics.for_robot('panda', model, 0.01, native=True)
    g = torch.Generator().manual_seed(4)
    x0 = 0.1 * torch.randn(3, fast.nx, generator=g, dtype=F64)
    u_open = torch.randn(5, 3, fast.nu, generator=g, dtype=F64)
    gains = 0.01 * torch.randn(5, fast.nu, fast.nx, generator=g, dtype=F64)
    x_nom = torch.zeros(6, fast.nx, dtype=F64)
    n = model.n
    torque = (torch.eye(n, dtype=F64), torch.zeros(n, dtype=F64), model.damping,
              model.friction)
    args = (x0, x_nom, u_open, gains, None, fast.u_min, fast.u_max)
    with torch.no_grad():
        expected = fast.feedback_rollout(*args[:5])
        actual = feedback_rollout_native(model, *args, *torque, 1e-2, 0.01, 1)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    # no adjoint: inputs that require grad go back to torch
    grad = x0.clone().requires_grad_(True)
    assert feedback_rollout_native(model, grad, *args[1:], *torque, 1e-2, 0.01, 1) is None


def test_rollout_kernel_rejects_mismatched_shapes(rollout_kernel):
    fast = ModelDynamics.for_robot('qube', load_urdf(xml=robots.urdf_string('qube'), dtype=F64),
                                   0.01, native=True)
    x0 = torch.zeros(2, 4, dtype=F64)
    with torch.no_grad(), pytest.raises(RuntimeError, match='u_open must be'):
        fast.feedback_rollout(x0, torch.zeros(3, 4, dtype=F64), torch.zeros(3, 5, 1, dtype=F64),
                              torch.zeros(3, 1, 4, dtype=F64))
    with torch.no_grad(), pytest.raises(RuntimeError, match='gains must be'):
        fast.feedback_rollout(x0, torch.zeros(3, 4, dtype=F64), torch.zeros(3, 2, 1, dtype=F64),
                              torch.zeros(3, 1, 3, dtype=F64))


@pytest.mark.parametrize('nu,nx,rate', [(1, 4, 0.0), (1, 4, 0.1), (7, 14, 0.0), (3, 6, 0.2)])
def test_native_backward_pass_equals_the_numpy_one(rollout_kernel, nu, nx, rate):
    # random stable LQ data with tight limits: about a fifth of the commands are clamped
    g = torch.Generator().manual_seed(nu)
    H = 20

    def spd(n):
        M = torch.randn(H, n, n, generator=g, dtype=F64)
        return M @ M.mT / n + 0.1 * torch.eye(n, dtype=F64)

    A = torch.eye(nx, dtype=F64) + 0.05 * torch.randn(H, nx, nx, generator=g, dtype=F64)
    B = 0.1 * torch.randn(H, nx, nu, generator=g, dtype=F64)
    d = CostDerivatives(lx=torch.randn(H, nx, generator=g, dtype=F64),
                        lu=torch.randn(H, nu, generator=g, dtype=F64), lxx=spd(nx),
                        luu=spd(nu), lux=0.05 * torch.randn(H, nu, nx, generator=g, dtype=F64),
                        vx=torch.randn(nx, generator=g, dtype=F64), vxx=spd(nx)[0])
    controls = 0.3 * torch.randn(H, nu, generator=g, dtype=F64)
    limit = torch.full((nu,), 0.5, dtype=F64)
    data = ilqr_module._augmented(A, B, d, controls, 0.5 * controls[0], rate)
    expected = ilqr_module._backward_pass(*(v.numpy() for v in data), controls.numpy(),
                                          (-limit).numpy(), limit.numpy(), 1e-6)
    ran, result = riccati_backward_native(*data, controls, -limit, limit, 1e-6)
    assert ran and result is not None
    k, K, dv = result
    clamped = (controls + k).abs() >= 0.5 - 1e-9
    assert 0 < int(clamped.sum()) < H * nu
    torch.testing.assert_close(k, expected.k, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(K, expected.K, rtol=1e-12, atol=1e-12)
    assert dv == pytest.approx(expected.dv, rel=1e-12)
    # a concave command cost: no positive definite Quu, None from both (iLQR raises mu)
    concave = d._replace(luu=-10.0 * torch.eye(nu, dtype=F64).expand(H, nu, nu))
    data = ilqr_module._augmented(A, B, concave, controls, None, rate)
    assert riccati_backward_native(*data, controls, -limit, limit, 1e-6) == (True, None)
    assert ilqr_module._backward_pass(*(v.numpy() for v in data), controls.numpy(),
                                      (-limit).numpy(), limit.numpy(), 1e-6) is None


def test_native_ilqr_without_the_extension_runs_in_torch():
    # a machine without a compiler: native=True falls back to torch, and says so
    native_module.set_enabled(False)
    try:
        fast = ILQR(qube_dynamics(0.04), swing_up_cost(),
                    ILQRConfig(horizon=10, max_iters=2, tol=0.0, native=True))
        assert not fast.dynamics.native
        policy = fast.solve(torch.tensor([0.1, 0.3, -0.2, 0.5], dtype=F64), 0.0)
    finally:
        native_module.set_enabled(True)
    eager = ILQR(qube_dynamics(0.04), swing_up_cost(), ILQRConfig(horizon=10, max_iters=2,
                                                                  tol=0.0))
    expected = eager.solve(torch.tensor([0.1, 0.3, -0.2, 0.5], dtype=F64), 0.0)
    assert fast.info['iterations'] == 2
    torch.testing.assert_close(policy.u_ff, expected.u_ff)


def test_native_ilqr_matches_eager_ilqr_on_the_qube(rollout_kernel):
    dyn = qube_dynamics(0.04)
    cost = swing_up_cost()
    eager = ILQR(dyn, cost, ILQRConfig(horizon=15, max_iters=3, tol=0.0))
    fast = ILQR(dyn, cost, ILQRConfig(horizon=15, max_iters=3, tol=0.0, native=True))
    assert fast.dynamics.native and not eager.dynamics.native
    fast.set_model(dyn.model.replace(inertial=dyn.model.inertial * 1.1))
    eager.set_model(dyn.model.replace(inertial=dyn.model.inertial * 1.1))
    assert fast.dynamics.native
    x0 = torch.tensor([0.1, 0.3, -0.2, 0.5], dtype=F64)
    for t in (0.0, 0.04):
        expected, actual = eager.solve(x0, t), fast.solve(x0, t)
        assert fast.info['iterations'] == eager.info['iterations'] == 3
        assert torch.allclose(actual.u_ff, expected.u_ff, rtol=1e-6, atol=1e-7)
        assert torch.allclose(actual.K, expected.K, rtol=1e-5, atol=1e-6)
        assert torch.allclose(actual.x_ref, expected.x_ref, rtol=1e-6, atol=1e-8)


@pytest.mark.slow
def test_compiled_ilqr_matches_eager_ilqr_on_the_qube():
    # Compiles the step at three batch shapes and the feedback step (about a minute).
    dyn = qube_dynamics(0.04)
    cost = swing_up_cost()
    config = ILQRConfig(horizon=15, max_iters=3, tol=0.0)
    eager = ILQR(dyn, cost, config)
    fast = ILQR(dyn, cost, ILQRConfig(horizon=15, max_iters=3, tol=0.0, compile=True))
    assert fast.warm_up() > 0.0 and fast._controls is None
    x0 = torch.tensor([0.1, 0.3, -0.2, 0.5], dtype=F64)
    with torch.no_grad():
        u = torch.tensor([1.5], dtype=F64)
        assert torch.allclose(fast.dynamics.step(x0, u), dyn.step(x0, u), rtol=1e-12,
                              atol=1e-12)
    for t in (0.0, 0.04):
        expected, actual = eager.solve(x0, t), fast.solve(x0, t)
        assert torch.allclose(actual.u_ff, expected.u_ff, rtol=1e-6, atol=1e-7)
        assert torch.allclose(actual.K, expected.K, rtol=1e-5, atol=1e-6)
        assert torch.allclose(actual.x_ref, expected.x_ref, rtol=1e-6, atol=1e-8)
