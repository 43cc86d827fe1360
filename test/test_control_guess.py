"""iLQR seeded by a feedback law, models it follows, and soft state bounds in the cost."""

import dataclasses
import math

from diffsim_ros.control import ILQR, ILQRConfig, ModelDynamics, QuadraticCost
from diffsim_ros.control.ilqr import law_rollout
from diffsim_ros.control.lqr import lqr_law
from diffsim_ros.control.tasks import angle_mask, get_task, goal_state, make_cost, make_ilqr, \
    upright_angle
from diffsim_ros.core.errors import ShapeError
from diffsim_ros.sim import nominal_model
import pytest
import torch

F64 = torch.float64
TASK = get_task('qube')


def qube(model=None, dt=TASK.mpc_dt, dtype=F64):
    model = (model if model is not None else nominal_model('qube')).to(dtype=dtype)
    return ModelDynamics.for_robot('qube', model, dt)


def near_top(model, offset=0.1):
    x = torch.zeros(4, dtype=F64)
    x[1] = upright_angle(model, 'pendulum_joint') + offset
    return x


def balance_in_the_model(controller, model, seconds=1.5):
    """Apply the MPC's policy at 2 ms on its own model from 0.1 rad off the top."""
    plant = qube(model, dt=0.002)
    x, policy, worst = near_top(model), None, 0.0
    up = upright_angle(model, 'pendulum_joint')
    for k in range(int(seconds / 0.002)):
        if k % 10 == 0:
            policy = controller.solve(x, 0.002 * k)
        x = plant.step(x, policy(0.002 * k, x))
        worst = max(worst, abs(math.remainder(float(x[1]) - up, 2 * math.pi)))
    return worst


def test_the_lqr_guess_makes_ilqr_catch_the_pendulum_that_its_warm_start_drops():
    model = nominal_model('qube')
    config = ILQRConfig(horizon=TASK.horizon, max_iters=TASK.iterations)
    seeded = make_ilqr(TASK, qube(model), config)
    plain = ILQR(qube(model), make_cost(TASK, model), config)
    # without a guess the plans let the pendulum fall over (and come round again): the
    # failure that kept the MPC from ever balancing the MuJoCo Qube, true model or not
    assert balance_in_the_model(plain, model) > 1.0
    assert balance_in_the_model(seeded, model) < 0.2
    assert seeded.guess is not None and plain.guess is None


def test_the_guess_competes_on_cost_and_never_makes_the_start_worse():
    model = nominal_model('qube')
    config = ILQRConfig(horizon=TASK.horizon, max_iters=1)
    seeded = make_ilqr(TASK, qube(model), config)
    x = near_top(model)
    seeded.solve(x, 0.0)
    assert seeded.info['initial'] == 'guess'   # zeros let it fall: the LQR costs less
    cost = seeded.cost.bind(0.0, seeded.dynamics.dt, TASK.horizon)
    states, controls = law_rollout(seeded.dynamics, x, seeded.guess, TASK.horizon)
    assert seeded.info['costs'][0] == pytest.approx(float(cost.total(states, controls)))
    # from anywhere, iLQR starts from the cheaper of the warm start and the guess
    seeded.reset()
    hanging = torch.zeros(4, dtype=F64)
    seeded.solve(hanging, 0.0)
    zeros = torch.zeros(TASK.horizon, 1, dtype=F64)
    cheaper = min(float(cost.total(seeded.dynamics.rollout(hanging, zeros), zeros)),
                  float(cost.total(*law_rollout(seeded.dynamics, hanging, seeded.guess,
                                                TASK.horizon))))
    assert seeded.info['costs'][0] == pytest.approx(cheaper)


def test_set_model_moves_the_goal_and_the_guess_to_the_new_balance_point():
    model = nominal_model('qube')
    controller = make_ilqr(TASK, qube(model), ILQRConfig(horizon=10, max_iters=1))
    # a centre of mass off the pendulum's axis: it balances at another angle
    inertial = model.inertial.clone()
    inertial[1, 2] = inertial[1, 0] * 0.01
    shifted = model.replace(inertial=inertial)
    assert abs(upright_angle(shifted, 'pendulum_joint')
               - upright_angle(model, 'pendulum_joint')) > 0.05
    controller.set_model(shifted)
    torch.testing.assert_close(controller.cost.x_goal, goal_state(TASK, shifted))
    top = near_top(shifted, 0.0)
    assert float(controller.guess(top).abs().max()) < 1e-6   # at rest at its equilibrium


def test_a_model_without_a_stabilising_lqr_leaves_the_solver_without_a_guess():
    def broken(dynamics):
        raise ValueError('the Riccati iteration did not converge')
    model = nominal_model('qube')
    controller = ILQR(qube(model), make_cost(TASK, model), ILQRConfig(horizon=10, max_iters=1),
                      guess_for=broken)
    assert controller.guess is None and 'Riccati' in controller.guess_error
    policy = controller.solve(near_top(model), 0.0)
    assert torch.isfinite(policy.u_ff).all()


def test_law_rollout_is_the_law_applied_step_by_step_a_whole_turn_away_too():
    model = nominal_model('qube')
    controller = make_ilqr(TASK, qube(model).with_model(model, compile=True),
                           ILQRConfig(horizon=20, max_iters=1, compile=True))
    dynamics, law = controller.dynamics, controller.guess
    x0 = near_top(model, 0.3)
    with torch.no_grad():
        states, controls = law_rollout(dynamics, x0, law, 20)
        x, expected = x0, []
        for _ in range(20):
            expected.append(law(x))
            x = dynamics.step(x, expected[-1])
        torch.testing.assert_close(controls, torch.stack(expected), rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(states[-1], x, rtol=1e-9, atol=1e-9)
        turned = x0.clone()
        turned[1] += 2 * math.pi
        _, again = law_rollout(dynamics, turned, law, 20)
    torch.testing.assert_close(again, controls, rtol=1e-9, atol=1e-9)
    assert bool((controls.abs() <= dynamics.u_max).all())


def test_a_law_with_a_non_finite_gain_is_refused():
    law = lqr_law(qube(), goal_state(TASK, nominal_model('qube')),
                  torch.diag(torch.tensor(TASK.state_weight)), torch.eye(1) * 0.02)
    with pytest.raises(ValueError, match='not finite'):
        dataclasses.replace(law, K=law.K * math.nan)


def test_lqr_law_in_float32_matches_float64():
    model = nominal_model('qube')
    Q, R = torch.diag(torch.tensor(TASK.state_weight)), torch.diag(torch.tensor([0.02]))
    laws = [lqr_law(qube(model, dtype=dtype), goal_state(TASK, model), Q, R,
                    angle_mask(TASK, model)) for dtype in (torch.float32, F64)]
    x = near_top(model, 0.05)
    torch.testing.assert_close(laws[0](x.float()).double(), laws[1](x), rtol=1e-4, atol=1e-4)


def bounded_cost(weight=100.0):
    return QuadraticCost(torch.ones(4), torch.ones(1), 2.0 * torch.ones(4),
                         torch.zeros(4, dtype=F64),
                         x_lower=torch.tensor([-0.5, -math.inf, -math.inf, -math.inf]),
                         x_upper=torch.tensor([0.5, math.inf, math.inf, math.inf]),
                         bound_weight=weight)


def test_soft_bounds_add_the_squared_violation_and_exact_derivatives():
    cost = bounded_cost()
    X = torch.tensor([[0.0, 0.1, 0.0, 0.0], [0.7, 0.2, 0.1, 0.0], [-0.9, 0.0, 0.0, 0.3]],
                     dtype=F64, requires_grad=True)
    U = torch.tensor([[0.2], [-0.1]], dtype=F64, requires_grad=True)
    free = QuadraticCost(torch.ones(4), torch.ones(1), 2.0 * torch.ones(4),
                         torch.zeros(4, dtype=F64))
    extra = 100.0 * (0.2 ** 2 + 0.4 ** 2)
    with torch.no_grad():
        assert float(cost.total(X, U)) == pytest.approx(float(free.total(X, U)) + extra)
        assert float(cost.stage(X[1], U[1], 1)) == pytest.approx(
            float(free.stage(X[1], U[1], 1)) + 100.0 * 0.2 ** 2)
    d = cost.derivatives(X.detach(), U.detach())
    gradient = torch.autograd.grad(cost.total(X, U), X)[0]
    torch.testing.assert_close(d.lx, gradient[:-1])
    torch.testing.assert_close(d.vx, gradient[-1])
    assert float(d.lxx[1, 0, 0]) == pytest.approx(2.0 + 200.0)   # 2 Q + 2 W where violated
    assert float(d.lxx[0, 0, 0]) == pytest.approx(2.0)
    assert float(d.vxx[0, 0]) == pytest.approx(4.0 + 200.0)
    converted = cost.to(dtype=torch.float32)
    assert converted.x_upper.dtype == torch.float32


@pytest.mark.parametrize('kwargs, error', [
    ({'bound_weight': -1.0}, ValueError),
    ({'x_lower': torch.ones(4), 'x_upper': torch.zeros(4), 'bound_weight': 1.0}, ValueError),
    ({'x_upper': torch.ones(3), 'bound_weight': 1.0}, ShapeError)])
def test_bad_bounds_are_refused(kwargs, error):
    with pytest.raises(error):
        QuadraticCost(1.0, 1.0, 1.0, torch.zeros(4, dtype=F64), **kwargs)


def test_swing_up_costs_bound_the_arm_within_its_travel():
    model = nominal_model('qube')
    cost = make_cost(TASK, model)
    arm = model.joint_index(TASK.actuated_joint)
    assert float(cost.x_upper[arm]) == pytest.approx(TASK.bound_fraction * TASK.position_limit)
    assert math.isinf(float(cost.x_upper[model.joint_index(TASK.pendulum_joint)]))
