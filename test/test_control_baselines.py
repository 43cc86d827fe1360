"""
Baseline controllers and task definitions: Riccati solver, LQR, swing-up law, arm tracking.

Identities need no reference (the doubling solver against scipy's DARE, the LQR gain
stabilising the linearised model); the controllers are checked on our own model, one short
closed loop each, so the file runs in seconds.
"""

import math

from diffsim_ros.control.baselines import (ComputedTorque, linearize, lqr_gain, PDGravity,
                                           solve_dare, swing_up_design, SwingUpLQR)
from diffsim_ros.control.dynamics import ModelDynamics
from diffsim_ros.control.policy import FeedbackPolicy
from diffsim_ros.control.tasks import (angle_mask, evaluate, get_task, goal_state, make_cost,
                                       reference, start_state, swing_up_time, task_names,
                                       upright_angle, wrap_angle)
from diffsim_ros.core import crba, rnea
from diffsim_ros.core.energy import potential_energy
from diffsim_ros.sim import nominal_model
import numpy as np
import pytest
import scipy.linalg
import torch

F64 = torch.float64


def _qube(dt=0.002):
    model = nominal_model('qube')
    return ModelDynamics.for_robot('qube', model, dt)


def test_doubling_riccati_matches_scipy():
    generator = torch.Generator().manual_seed(4)
    A = torch.randn(4, 4, generator=generator, dtype=F64) * 0.6
    B = torch.randn(4, 2, generator=generator, dtype=F64)
    Q = torch.diag(torch.tensor([1.0, 2.0, 0.5, 0.1], dtype=F64))
    R = torch.eye(2, dtype=F64) * 0.3
    P = solve_dare(A, B, Q, R)
    expected = scipy.linalg.solve_discrete_are(A.numpy(), B.numpy(), Q.numpy(), R.numpy())
    np.testing.assert_allclose(P.numpy(), expected, rtol=1e-9, atol=1e-10)


def test_unstabilisable_pair_raises():
    A = torch.diag(torch.tensor([2.0, 0.5], dtype=F64))
    B = torch.tensor([[0.0], [1.0]], dtype=F64)
    with pytest.raises(ValueError, match='stabilisable'):
        solve_dare(A, B, torch.eye(2, dtype=F64), torch.eye(1, dtype=F64))


@pytest.mark.parametrize('robot', ['qube', 'cartpole'])
def test_lqr_stabilises_the_upright_linearisation(robot):
    task = get_task(robot)
    model = nominal_model(robot)
    dynamics = ModelDynamics.for_robot(robot, model, 0.004)
    x_up = goal_state(task, model)
    u0 = torch.zeros(1, dtype=F64)
    # the linearisation lqr_gain designs on: Coulomb friction (the cart-pole's) left out,
    # whose tanh slope at rest is no damping the plant has
    smooth = dynamics.with_model(model.replace(friction=torch.zeros_like(model.friction)))
    A, B = linearize(smooth, x_up, u0)
    assert float(torch.linalg.eigvals(A).abs().max()) > 1.0     # upright is unstable
    K = lqr_gain(dynamics, x_up, u0, torch.eye(4, dtype=F64), torch.eye(1, dtype=F64))
    closed = torch.linalg.eigvals(A - B @ K).abs().max()
    assert float(closed) < 1.0
    # The upright state is an equilibrium of the model with zero command.
    torch.testing.assert_close(dynamics.step(x_up, u0), x_up, atol=1e-12, rtol=0)


def test_lqr_gain_linearises_only_smooth_passive_friction():
    # a refit with Coulomb friction and negative damping (NEA is unconstrained) gets the gain
    # of the model without Coulomb friction and with the damping clamped to zero
    task, model = get_task('qube'), nominal_model('qube')
    refit = model.replace(friction=torch.tensor([3e-4, 6e-5], dtype=F64),
                          damping=torch.tensor([-2e-5, 1e-5], dtype=F64))
    passive = model.replace(friction=torch.zeros(2, dtype=F64),
                            damping=torch.tensor([0.0, 1e-5], dtype=F64))
    x_up, u0 = goal_state(task, model), torch.zeros(1, dtype=F64)
    Q, R = torch.eye(4, dtype=F64), torch.eye(1, dtype=F64)
    gains = [lqr_gain(ModelDynamics.for_robot('qube', m, 0.002), x_up, u0, Q, R)
             for m in (refit, passive)]
    torch.testing.assert_close(gains[0], gains[1], rtol=1e-12, atol=1e-12)
    raw_A, raw_B = linearize(ModelDynamics.for_robot('qube', refit, 0.002), x_up, u0)
    smooth_A, _ = linearize(ModelDynamics.for_robot('qube', passive, 0.002), x_up, u0)
    assert not torch.allclose(raw_A, smooth_A)   # the raw linearisation really differs


def test_swing_up_balances_near_upright_on_the_model():
    dynamics = _qube()
    controller = SwingUpLQR(dynamics, 'pendulum_joint', 'arm_joint',
                            position_limit=get_task('qube').position_limit)
    x = torch.tensor([0.1, math.pi - 0.15, 0.0, 0.3], dtype=F64)
    for k in range(400):   # 0.8 s of the model itself, policy re-solved every tick
        policy = controller.solve(x, k * dynamics.dt)
        x = dynamics.step(x, policy(k * dynamics.dt, x))
    assert controller.mode == 'balance'
    assert abs(float(wrap_angle(x[1] - math.pi))) < 0.02
    assert abs(float(x[0])) < 0.3 and abs(float(x[3])) < 0.2


def test_swing_up_pumps_energy_from_hanging_and_respects_limits():
    dynamics = _qube()
    controller = SwingUpLQR(dynamics, 'pendulum_joint', 'arm_joint', position_limit=1.8)
    x = torch.zeros(4, dtype=F64)
    assert float(controller.energy(x)) == pytest.approx(-1.0)
    energies = []
    for k in range(150):
        policy = controller.solve(x, k * dynamics.dt)
        assert isinstance(policy, FeedbackPolicy)
        u = policy(k * dynamics.dt, x)
        assert float(u.abs().max()) <= 4.0
        x = dynamics.step(x, u)
        energies.append(float(controller.energy(x)))
    assert controller.mode == 'swing'
    assert max(energies) > energies[0] + 0.05     # pumped up from -1 (hanging at rest)


def test_swing_up_design_comes_from_the_pendulum_physics():
    dynamics = _qube()
    design = swing_up_design(dynamics, 'pendulum_joint', 'arm_joint', 1.8)
    # Pyrado's Qube pendulum: m = 0.024 kg, l = 0.0645 m to the CoM, J = m L^2 / 3 about the
    # joint (0.129 m rod) plus the small axial term kept for consistency.
    mgl = 0.024 * 9.81 * 0.0645
    inertia = 0.024 * 0.129 ** 2 / 3.0
    assert design.frequency == pytest.approx(math.sqrt(mgl / inertia), rel=1e-3)
    assert design.max_acceleration == pytest.approx(
        math.pi / 4 * design.frequency ** 2 * 1.8 / 4)
    assert design.centering[0] == pytest.approx((design.frequency / 4) ** 2)
    with pytest.raises(ValueError, match='position_limit'):
        swing_up_design(dynamics, 'pendulum_joint', 'arm_joint', 0.0)


def test_swing_up_reaches_upright_on_the_model():
    dynamics = _qube()
    controller = SwingUpLQR(dynamics, 'pendulum_joint', 'arm_joint', position_limit=1.8)
    x = torch.zeros(4, dtype=F64)
    arm = 0.0
    for k in range(2500):   # 5 s; swings up in about 3.9 s
        x = dynamics.step(x, controller.solve(x, k * dynamics.dt)(k * dynamics.dt, x))
        arm = max(arm, abs(float(x[0])))
    assert controller.mode == 'balance'
    assert abs(float(wrap_angle(x[1] - math.pi))) < 0.05 and arm < 1.8


def test_swing_up_rejects_bad_arguments():
    dynamics = _qube()
    with pytest.raises(ValueError, match='energy_gain'):
        SwingUpLQR(dynamics, 'pendulum_joint', 'arm_joint', energy_gain=-1.0)
    with pytest.raises(KeyError):
        SwingUpLQR(dynamics, 'no_such_joint', 'arm_joint')


def test_set_model_recomputes_the_gain():
    dynamics = _qube()
    controller = SwingUpLQR(dynamics, 'pendulum_joint', 'arm_joint')
    K = controller.gain().clone()
    heavier = dynamics.model.replace(inertial=dynamics.model.inertial * 1.5)
    controller.set_model(heavier)
    assert controller.dynamics.model is heavier
    assert not torch.allclose(controller.gain(), K)


def _arm(robot='wam4'):
    task = get_task(robot)
    model = nominal_model(robot)
    dynamics = ModelDynamics.for_robot(robot, model, 0.002)
    return task, model, dynamics


def test_computed_torque_feedforward_is_inverse_dynamics_of_the_reference():
    task, model, dynamics = _arm()
    controller = ComputedTorque(dynamics, lambda t: reference(task, t), kp=[100.0] * 4,
                                kd=[20.0] * 4, horizon=3, gravity_in_command=False)
    policy = controller.solve(torch.zeros(8, dtype=F64), 0.1)
    times = 0.1 + 0.002 * torch.arange(4, dtype=F64)
    q, qd, qdd = reference(task, times)
    expected = rnea(model, q[:3], qd[:3], qdd[:3]) + model.damping * qd[:3]
    torch.testing.assert_close(policy.u_ff, expected)
    torch.testing.assert_close(policy.K[0, :, :4], -crba(model, q[0]) * 100.0)
    # On the reference the command is the feedforward (clipped).
    x_ref = torch.cat((q[0], qd[0]))
    clipped = torch.clamp(expected[0], dynamics.u_min, dynamics.u_max)
    torch.testing.assert_close(policy(0.1, x_ref), clipped)


def test_arm_baselines_track_the_reference_on_the_model():
    task, model, dynamics = _arm()
    q0, qd0 = start_state(task, model)
    for controller in (ComputedTorque(dynamics, lambda t: reference(task, t), kp=[400.0] * 4,
                                      kd=[40.0] * 4),
                       PDGravity(dynamics, lambda t: reference(task, t),
                                 kp=[300.0, 300.0, 150.0, 60.0], kd=[20.0, 20.0, 10.0, 4.0])):
        x, times, states = torch.cat((q0, qd0)), [], []
        for k in range(300):
            t = k * dynamics.dt
            x = dynamics.step(x, controller.solve(x, t)(t, x))
            times.append(t + dynamics.dt)
            states.append(x)
        states = torch.stack(states)
        scores = evaluate(task, model, torch.tensor(times, dtype=F64), states[:, :4],
                          states[:, 4:])
        assert scores['tracking_rms'] < 0.05, type(controller).__name__


def test_panda_baseline_leaves_gravity_to_the_driver():
    task, model, dynamics = _arm('panda')
    controller = PDGravity(dynamics, lambda t: reference(task, t), kp=[1.0] * 7, kd=[1.0] * 7)
    assert controller.gravity_in_command
    q0, qd0 = start_state(task, model)
    policy = controller.solve(torch.cat((q0, qd0)), 0.0)
    torch.testing.assert_close(policy.u_ff, torch.zeros_like(policy.u_ff))


def test_tasks_and_costs():
    assert set(task_names()) == {'qube', 'cartpole', 'wam4', 'panda'}
    with pytest.raises(ValueError, match='no control task'):
        get_task('wam7')
    for robot in task_names():
        task = get_task(robot)
        model = nominal_model(robot)
        cost = make_cost(task, model)
        assert cost.nx == 2 * model.n
        if task.kind == 'swing_up':
            mask = angle_mask(task, model)
            assert mask.sum() == 1 and bool(mask[model.joint_index(task.pendulum_joint)])
        else:
            bound = cost.bind(0.3, task.mpc_dt, task.horizon)
            q, qd, _ = reference(task, torch.tensor([0.3], dtype=F64))
            torch.testing.assert_close(bound.goal(0).to(F64), torch.cat((q[0], qd[0])),
                                       rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize('robot', ['wam4', 'panda'])
def test_tracking_reference_is_feasible(robot):
    task = get_task(robot)
    model = nominal_model(robot)
    t = torch.linspace(0.0, task.duration_s, 400, dtype=F64)
    q, qd, qdd = reference(task, t)
    assert bool(((q > model.lower + 0.05) & (q < model.upper - 0.05)).all())
    tau = rnea(model, q, qd, qdd) + model.damping * qd + model.friction
    if robot == 'panda':   # the driver adds gravity: commands exclude it
        zero = torch.zeros_like(q)
        tau = tau - rnea(model, q, zero, zero)
    limit = torch.tensor([dict(zip(model.joint_names, (87.0,) * 4 + (12.0,) * 3)).get(j, 0)
                          for j in model.joint_names], dtype=F64) if robot == 'panda' else \
        torch.tensor([25.0, 20.0, 15.0, 15.0], dtype=F64)
    assert bool((tau.abs() < 0.8 * limit).all())


def test_swing_up_scoring():
    t = torch.arange(0, 3.0, 0.01, dtype=F64)
    error = torch.where(t < 1.2, torch.full_like(t, 2.0), torch.full_like(t, 0.05))
    assert swing_up_time(t, error, 0.2) == pytest.approx(1.2)
    assert swing_up_time(t, torch.full_like(t, 1.0), 0.2) is None
    task = get_task('cartpole')
    model = nominal_model('cartpole')
    q = torch.stack((0.1 * torch.sin(t), math.pi + error), -1)
    scores = evaluate(task, model, t, q, torch.zeros_like(q))
    assert scores['success'] and scores['swing_up_time_s'] == pytest.approx(1.2)
    q_far = q.clone()
    q_far[100, 0] = 0.4                   # cart beyond 0.35 m once
    assert not evaluate(task, model, t, q_far, torch.zeros_like(q))['success']
    late = torch.where(t < 2.5, torch.full_like(t, 2.0), torch.full_like(t, 0.05))
    q_late = torch.stack((torch.zeros_like(t), math.pi + late), -1)
    assert not evaluate(task, model, t, q_late, torch.zeros_like(q))['success']   # < 1 s held


def _tilted(robot, offset):
    """Return the nominal model with the pendulum's centre of mass moved by ``offset`` (m)."""
    task = get_task(robot)
    model = nominal_model(robot)
    index = model.joint_index(task.pendulum_joint)
    inertial = model.inertial.detach().clone()
    inertial[index, 1:4] += inertial[index, 0] * torch.tensor(offset, dtype=F64)
    return task, model.replace(inertial=inertial), index


@pytest.mark.parametrize('robot', ['qube', 'cartpole'])
@pytest.mark.parametrize('offset', [(0.0, 0.0, 0.0), (0.01, -0.02, 0.015), (-0.03, 0.01, 0.0)])
def test_upright_angle_is_the_maximum_of_the_potential(robot, offset):
    task, model, index = _tilted(robot, offset)
    angles = torch.linspace(-math.pi, math.pi, 20001, dtype=F64)
    q = torch.zeros(angles.numel(), model.n, dtype=F64)
    q[:, index] = angles
    expected = float(angles[potential_energy(model, q).argmax()])
    assert abs(float(wrap_angle(torch.tensor(upright_angle(model, task.pendulum_joint)
                                             - expected, dtype=F64)))) < 1e-3
    if offset == (0.0, 0.0, 0.0):   # the URDFs: centre of mass on the pendulum's axis line
        assert abs(abs(upright_angle(model, task.pendulum_joint)) - math.pi) < 1e-9


def test_swing_up_balances_at_the_models_balance_point():
    task, model, index = _tilted('qube', (0.0, 0.02, 0.0))   # across the rod, in its plane
    up = upright_angle(model, task.pendulum_joint)
    assert abs(float(wrap_angle(torch.tensor(up - math.pi, dtype=F64)))) > 0.1   # 0.3 rad
    controller = SwingUpLQR(ModelDynamics.for_robot('qube', model, 0.002), 'pendulum_joint',
                            'arm_joint', position_limit=1.8)
    assert controller.upright == pytest.approx(up)
    assert float(goal_state(task, model)[index]) == pytest.approx(up)
    # released next to that balance point, the LQR holds it there with the arm near 0
    dynamics = controller.dynamics
    x = controller.goal() + torch.tensor([0.05, 0.1, 0.0, 0.0], dtype=F64)
    for _ in range(1000):
        x = dynamics.step(x, controller.solve(x)(0.0, x))
    assert controller.mode == 'balance'
    assert abs(float(wrap_angle(x[index] - up))) < 0.01 and abs(float(x[0])) < 0.1
    # and the task scores errors from the balance point it is given
    t = torch.linspace(0.0, 2.0, 101, dtype=F64)
    q = torch.stack((torch.zeros_like(t), torch.full_like(t, up)), -1)
    assert evaluate(task, model, t, q, torch.zeros_like(q))['success']
    assert not evaluate(task, model, t, q, torch.zeros_like(q), upright=math.pi)['success']
