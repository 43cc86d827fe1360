"""
The ball-on-a-string model: closed-form tension, rollout physics, cup kinematics and the fit.

Tiers: identities (the tension keeps ``rdd = 0``; gradcheck), closed-form references (the
pendulum's period ``2 pi sqrt(l / g)``, also under an accelerating anchor; the conical
pendulum; free fall; a fine RK4 solution of the large-amplitude pendulum), the WAM-4's
kinematics against finite differences, and fits on data the StringModel itself simulated
with a known truth, validated on a recording the fit never saw.
"""

import math
from types import SimpleNamespace

from diffsim_ros import robots
from diffsim_ros.core import forward_kinematics, load_urdf, rnea
from diffsim_ros.sysid import string_model
from diffsim_ros.sysid.string_model import (ball_prediction_error, BallFFNN, BallLSTM,
                                            fit_ball_network, fit_cup_model, fit_string,
                                            string_acceleration, StringModel)
import pytest
import torch

DT = 0.002
G = 9.81
#: Joint amplitude scales of the plant's identification swings: base yaw, a little shoulder.
NODDING = (1.0, 0.1, 0.0, 0.0)


@pytest.fixture(scope='module')
def wam4():
    """Return the catalogue WAM-4 in float64."""
    return load_urdf(robots.urdf_path('wam4'), dtype=torch.float64)


def still(T, B=1):
    """Return a fixed anchor at the origin: zero p, v, a of shape (B, T, 3)."""
    z = torch.zeros(B, T, 3, dtype=torch.float64)
    return z, z, z


def pendulum(model, theta0, seconds, anchor=None):
    """Release a taut planar pendulum at rest at angle theta0 from the anchor's vertical."""
    T = int(round(seconds / DT)) + 1
    p, v, a = still(T) if anchor is None else anchor(T)
    length = model.parameters_dict()['string_length']
    x0 = p[:, 0] + torch.tensor([[length * math.sin(theta0), 0.0, -length * math.cos(theta0)]],
                                dtype=torch.float64)
    with torch.no_grad():
        x, xd = model.rollout(x0, v[:, 0], p, v, a, DT)
    return x[0] - p[0], xd[0] - v[0]


def upward_crossings(signal):
    """Return the fractional sample indices where the signal crosses zero upward."""
    s0, s1 = signal[:-1], signal[1:]
    index = torch.nonzero((s0 < 0) & (s1 >= 0)).flatten()
    return index.double() + s0[index] / (s0[index] - s1[index])


def test_tension_keeps_the_string_length_and_only_pulls():
    generator = torch.Generator().manual_seed(3)

    def rand(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    B = 512
    length = torch.tensor(0.4, dtype=torch.float64)
    p, v, a = rand(B, 3) * 0.3, rand(B, 3), rand(B, 3) * 5
    n = rand(B, 3)
    n = n / n.norm(dim=-1, keepdim=True)
    x = p + length * n
    tangent = torch.linalg.cross(n, rand(B, 3))
    xd = v + tangent
    gravity = torch.tensor([0.0, 0.0, -G], dtype=torch.float64)
    xdd, held = string_acceleration(x, xd, p, v, a, length, torch.tensor(0.05), gravity)
    free = gravity - 0.05 * (xd - v)     # friction on the velocity relative to the anchor
    w = xd - v
    rdd = ((w * w).sum(-1) - ((n * w).sum(-1)) ** 2) / length + (n * (xdd - a)).sum(-1)
    held = held.squeeze(-1)
    assert 50 < int(held.sum()) < B - 50
    assert rdd[held].abs().max() < 1e-12
    # Where the string would have to push, it is slack: the ball flies freely.
    assert torch.allclose(xdd[~held], free[~held], atol=1e-14)
    tension = -((xdd - free) * n).sum(-1)
    assert bool((tension[held] > 0).all())
    # Slack: inside the sphere, or on it and moving inward.
    inside = p + 0.9 * length * n
    assert torch.allclose(string_acceleration(inside, xd, p, v, a, length, 0.05, gravity)[0],
                          free)
    inward = v - 0.1 * n + tangent
    assert torch.allclose(string_acceleration(x, inward, p, v, a, length, 0.05, gravity)[0],
                          gravity - 0.05 * (inward - v))


def test_gradcheck_taut_acceleration():
    generator = torch.Generator().manual_seed(1)
    n = torch.tensor([0.3, -0.2, -0.9], dtype=torch.float64)
    n = n / n.norm()
    inputs = (n * 0.4 + 1e-3 * torch.randn(3, generator=generator, dtype=torch.float64),
              torch.tensor([0.5, 0.2, -0.1], dtype=torch.float64),
              torch.zeros(3, dtype=torch.float64),
              torch.tensor([0.1, 0.0, 0.0], dtype=torch.float64),
              torch.tensor([0.0, 0.3, 1.0], dtype=torch.float64),
              torch.tensor(0.399, dtype=torch.float64),
              torch.tensor(0.05, dtype=torch.float64))
    inputs = tuple(value.requires_grad_(True) for value in inputs)
    gravity = torch.tensor([0.0, 0.0, -G], dtype=torch.float64)

    def taut(x, xd, p, v, a, length, friction):
        xdd, held = string_acceleration(x, xd, p, v, a, length, friction, gravity)
        assert bool(held.all())
        return xdd

    assert torch.autograd.gradcheck(taut, inputs)


def test_small_swings_have_the_pendulum_period(wam4):
    model = StringModel(wam4, string_length=0.4, friction=1e-9)
    relative, _ = pendulum(model, 0.05, 6.0)
    crossings = upward_crossings(relative[:, 0])
    period = float((crossings[-1] - crossings[0]) / (crossings.numel() - 1)) * DT
    expected = 2 * math.pi * math.sqrt(0.4 / G) * (1 + 0.05 ** 2 / 16)
    assert period == pytest.approx(expected, rel=2e-3)


def test_an_anchor_accelerating_upward_shortens_the_period(wam4):
    model = StringModel(wam4, string_length=0.3, friction=1e-9)
    lift = 5.0

    def anchor(T):
        t = torch.arange(T, dtype=torch.float64) * DT
        zero = torch.zeros_like(t)
        p = torch.stack((zero, zero, 0.5 * lift * t * t), -1)[None]
        v = torch.stack((zero, zero, lift * t), -1)[None]
        return p, v, torch.stack((zero, zero, zero + lift), -1)[None]

    relative, _ = pendulum(model, 0.05, 3.0, anchor)
    crossings = upward_crossings(relative[:, 0])
    period = float((crossings[-1] - crossings[0]) / (crossings.numel() - 1)) * DT
    assert period == pytest.approx(2 * math.pi * math.sqrt(0.3 / (G + lift)), rel=3e-3)


def test_large_swings_follow_the_exact_pendulum_and_keep_energy(wam4):
    length, theta0, seconds = 0.4, 1.2, 2.0
    model = StringModel(wam4, string_length=length, friction=1e-9)
    relative, velocity = pendulum(model, theta0, seconds)
    assert (relative.norm(dim=-1) - length).abs().max() < 1e-12
    energy = 0.5 * (velocity ** 2).sum(-1) + G * relative[:, 2]
    # Symplectic Euler's energy error is O(omega dt) relative; 1 % of g l bounds it here.
    assert (energy - energy[0]).abs().max() < 0.01 * G * length

    def f(state):
        return torch.stack((state[1], -G / length * torch.sin(state[0])))

    state = torch.tensor([theta0, 0.0], dtype=torch.float64)
    h, reference = DT / 10, [theta0]
    for _ in range(relative.shape[0] - 1):
        for _ in range(10):
            k1 = f(state)
            k2 = f(state + h / 2 * k1)
            k3 = f(state + h / 2 * k2)
            k4 = f(state + h * k3)
            state = state + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        reference.append(float(state[0]))
    theta = torch.atan2(relative[:, 0], -relative[:, 2])
    assert (theta - torch.tensor(reference, dtype=torch.float64)).abs().max() < 0.02


def test_conical_pendulum_stays_on_its_circle(wam4):
    length, cone = 0.4, 0.6
    model = StringModel(wam4, string_length=length, friction=1e-9)
    radius, depth = length * math.sin(cone), length * math.cos(cone)
    speed = math.sqrt(G * radius * math.tan(cone))
    T = int(2.0 / DT) + 1
    p, v, a = still(T)
    x0 = torch.tensor([[radius, 0.0, -depth]], dtype=torch.float64)
    xd0 = torch.tensor([[0.0, speed, 0.0]], dtype=torch.float64)
    with torch.no_grad():
        x, _ = model.rollout(x0, xd0, p, v, a, DT)
    assert (x[0, :, :2].norm(dim=-1) - radius).abs().max() < 2e-3
    assert (x[0, :, 2] + depth).abs().max() < 2e-3


def test_a_slack_ball_falls_freely_and_never_stretches_the_string(wam4):
    model = StringModel(wam4, string_length=0.4, friction=1e-9)
    T = 400
    p, v, a = still(T)
    x0 = torch.tensor([[0.0, 0.0, 0.1]], dtype=torch.float64)
    xd0 = torch.tensor([[0.5, 0.0, 1.0]], dtype=torch.float64)
    with torch.no_grad():
        x, xd = model.rollout(x0, xd0, p, v, a, DT)
    k = torch.arange(T, dtype=torch.float64)[:, None]
    gravity = torch.tensor([0.0, 0.0, -G], dtype=torch.float64)
    # Semi-implicit Euler's exact discrete free flight.
    flight = x0 + xd0 * DT * k + gravity * DT ** 2 * k * (k + 1) / 2
    slack = flight.norm(dim=-1) < 0.4
    first_taut = int(torch.nonzero(~slack)[0])
    assert first_taut > 50
    assert torch.allclose(x[0, :first_taut], flight[:first_taut], atol=1e-12)
    assert x[0].norm(dim=-1).max() <= 0.4 + 1e-12
    # The jerk is inelastic: no outward velocity remains once the string is taut.
    outward = (xd[0, first_taut:] * x[0, first_taut:]).sum(-1) / 0.4
    assert outward.max() < 1e-9


def test_friction_acts_on_the_velocity_relative_to_the_anchor():
    # A slack ball (inside the sphere): only gravity and friction, by hand.
    gravity = torch.tensor([0.0, 0.0, -G], dtype=torch.float64)
    x = torch.tensor([0.1, 0.0, -0.2], dtype=torch.float64)
    xd = torch.tensor([1.0, -0.5, 0.3], dtype=torch.float64)
    p = torch.zeros(3, dtype=torch.float64)
    v = torch.tensor([0.8, 0.4, 0.3], dtype=torch.float64)
    a = torch.tensor([5.0, 0.0, 2.0], dtype=torch.float64)
    xdd, held = string_acceleration(x, xd, p, v, a, torch.tensor(0.4, dtype=torch.float64),
                                    torch.tensor(0.2, dtype=torch.float64), gravity)
    hand = torch.tensor([-0.2 * 0.2, -0.2 * -0.9, -G], dtype=torch.float64)
    assert not bool(held)
    assert torch.allclose(xdd, hand, atol=1e-15)
    # A ball the anchor carries at its own velocity is not braked.
    xdd, _ = string_acceleration(x, v, p, v, a, torch.tensor(0.4, dtype=torch.float64),
                                 torch.tensor(0.2, dtype=torch.float64), gravity)
    assert torch.allclose(xdd, gravity, atol=1e-15)


def test_batched_rollout_equals_one_at_a_time(wam4):
    model = StringModel(wam4)
    generator = torch.Generator().manual_seed(0)
    B, T = 5, 300
    p = 0.1 * torch.randn(B, 1, 3, generator=generator, dtype=torch.float64)
    t = torch.arange(T, dtype=torch.float64)[None, :, None] * DT
    w = 2 * math.pi * (0.5 + torch.rand(B, 1, 3, generator=generator, dtype=torch.float64))
    p, v, a = p * torch.cos(w * t), -p * w * torch.sin(w * t), -p * w * w * torch.cos(w * t)
    x0 = p[:, 0] + torch.tensor([0.05, 0.0, -0.38], dtype=torch.float64)
    xd0 = torch.randn(B, 3, generator=generator, dtype=torch.float64)
    with torch.no_grad():
        x, xd = model.rollout(x0, xd0, p, v, a, DT)
        for b in range(B):
            xb, xdb = model.rollout(x0[b], xd0[b], p[b], v[b], a[b], DT)
            assert torch.allclose(xb, x[b], atol=1e-13)
            assert torch.allclose(xdb, xd[b], atol=1e-13)


def joint_path(T, seed, dt=DT, scale=(1.0, 1.0, 1.0, 1.0)):
    """Return a smooth WAM-4 joint path (slow cosines, amplitudes times scale), derivatives."""
    generator = torch.Generator().manual_seed(seed)
    t = torch.arange(T, dtype=torch.float64)[:, None] * dt
    amplitude = 0.15 + 0.2 * torch.rand(4, generator=generator, dtype=torch.float64)
    amplitude = amplitude * torch.tensor(scale, dtype=torch.float64)
    w = 2 * math.pi * (0.3 + 0.5 * torch.rand(4, generator=generator, dtype=torch.float64))
    q0 = torch.tensor([0.0, 0.6, 0.0, 1.6], dtype=torch.float64)
    return (t[:, 0], q0 + amplitude * (1 - torch.cos(w * t)),
            amplitude * w * torch.sin(w * t), amplitude * w * w * torch.cos(w * t))


def test_cup_motion_is_the_derivative_of_the_cup_frame(wam4, monkeypatch):
    model = StringModel(wam4, cup_xyz=(0.03, -0.02, 0.07), cup_rpy=(0.2, -0.1, 0.3))
    t, q, qd, qdd = joint_path(1001, seed=4)
    with torch.no_grad():
        p, v, a = model.cup_motion(q, qd, qdd)
        p_frame, R = model.cup_frame(q)
        state = model.cup_state(q, qd, qdd)
    assert torch.allclose(p, p_frame, atol=1e-14)
    # The policy search's one-pass kinematics are the same numbers.
    for one_pass, separate in zip(state, (p, v, a, R)):
        assert torch.allclose(one_pass, separate, atol=1e-14)
    T_tool = forward_kinematics(wam4, q)[:, wam4.link_index('wam/tool_link')]
    assert torch.allclose(p, T_tool[:, :3, 3] + (T_tool[:, :3, :3] @ model.cup_xyz.detach()),
                          atol=1e-14)
    assert torch.allclose(R @ R.mT, torch.eye(3, dtype=torch.float64).expand_as(R), atol=1e-12)
    central_v = (p[2:] - p[:-2]) / (2 * DT)
    central_a = (v[2:] - v[:-2]) / (2 * DT)
    assert (central_v - v[1:-1]).abs().max() < 1e-4 * v.abs().max()
    assert (central_a - a[1:-1]).abs().max() < 1e-4 * a.abs().max()
    # Batched over (B, T) like the policy search calls it.
    batched = model.cup_motion(q.reshape(7, 143, 4), qd.reshape(7, 143, 4),
                               qdd.reshape(7, 143, 4))
    assert torch.allclose(batched[2].reshape(-1, 3), a, atol=1e-12)
    # In pieces (as for many long rollouts) it is the same computation.
    monkeypatch.setattr(string_model, 'LINK_MOTION_CHUNK', 100)
    pieces = model.cup_motion(q.reshape(7, 143, 4), qd.reshape(7, 143, 4),
                              qdd.reshape(7, 143, 4))
    for whole, piece in zip(batched, pieces):
        assert torch.equal(whole, piece)


def swing_recording(model, seconds, seed, scale=(1.0, 1.0, 1.0, 1.0)):
    """Simulate the StringModel itself: slow joint cosines, ball released hanging still."""
    t, q, qd, qdd = joint_path(int(round(seconds / DT)) + 1, seed, scale=scale)
    with torch.no_grad():
        p, v, a = model.cup_motion(q, qd, qdd)
        x0 = p[0] - torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64) * model.string_length
        ball, _ = model.rollout(x0, v[0], p, v, a, DT)
    return SimpleNamespace(t=t, q=q, qd=qd, qdd=qdd, ball=ball)


@pytest.fixture(scope='module')
def truth(wam4):
    """Return the hidden string model the fits must recover."""
    return StringModel(wam4, string_length=0.42, cup_xyz=(0.02, -0.015, 0.075),
                       cup_rpy=(0.1, 0.0, 0.0), friction=0.05)


@pytest.mark.slow
@pytest.mark.parametrize('scale', [0.5, 1.5])
def test_fit_string_recovers_length_and_cup_offset(wam4, truth, scale):
    train = [swing_recording(truth, 12.0, seed) for seed in (10, 11)]
    held_out = swing_recording(truth, 6.0, seed=12)
    params = truth.parameters_dict()
    start = StringModel(wam4, string_length=scale * params['string_length'],
                        cup_xyz=[scale * c for c in params['cup_xyz']], friction=0.01)
    fitted, losses = fit_string(train, start, iterations=60)
    found = fitted.parameters_dict()
    assert abs(found['string_length'] - params['string_length']) < 0.01
    offset = torch.tensor(found['cup_xyz']) - torch.tensor(params['cup_xyz'])
    assert float(offset.norm()) < 0.01
    assert losses['rollout'][-1] < losses['rollout'][0]
    assert found['cup_rpy'] == [0.0, 0.0, 0.0]      # unobservable: kept at its start value
    nominal = StringModel(wam4)
    fitted_error = ball_prediction_error(fitted, fitted, held_out)['mean_m']
    assert fitted_error < 0.5 * ball_prediction_error(nominal, nominal, held_out)['mean_m']


def valley_start(wam4, truth, recording, shift):
    """Return a start ``shift`` up the hanging direction: higher anchor, longer string."""
    params = truth.parameters_dict()
    with torch.no_grad():
        R0 = truth.link_motion(recording.q[:1], recording.qd[:1], recording.qdd[:1]).R[0]
        up_in_link = R0.mT @ torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64)
    cup_xyz = torch.tensor(params['cup_xyz'], dtype=torch.float64) + shift * up_in_link
    return StringModel(wam4, string_length=params['string_length'] + shift,
                       cup_xyz=cup_xyz.tolist(), friction=0.01)


def errors_mm(fitted, truth):
    """Return the string length and cup offset errors of a fit, mm."""
    found, params = fitted.parameters_dict(), truth.parameters_dict()
    offset = torch.tensor(found['cup_xyz']) - torch.tensor(params['cup_xyz'])
    return (1e3 * abs(found['string_length'] - params['string_length']),
            1e3 * float(offset.norm()))


@pytest.mark.parametrize('shift', [-0.04, 0.04])
def test_the_anchor_stage_alone_recovers_the_string_from_a_start_along_the_valley(
        wam4, truth, shift):
    # The identification swings of the plant: the base yawing, the shoulder nodding a
    # little, the cup's tilt almost constant; the fit starts 4 cm up or down the hanging
    # direction (the ball where it hangs).  On the model's own exact data stage 0 alone
    # lands on the truth, whatever the start (the whole fit on the MuJoCo plant's data,
    # where the sphere alone stays in that valley: test_cup_sim's
    # test_the_string_fit_leaves_the_valley_of_length_and_anchor_height).
    train = [swing_recording(truth, 12.0, seed, scale=NODDING) for seed in (10, 11)]
    start = valley_start(wam4, truth, train[0], shift)
    closed_form, losses = fit_string(train, start, geometry_iterations=0, iterations=0,
                                     damping_seconds=0.0)
    assert losses['anchor'] == [pytest.approx(closed_form.parameters_dict()['string_length'])]
    assert max(errors_mm(closed_form, truth)) < 1.0


def test_the_anchor_ignores_a_free_flying_ball_and_contact_outliers(wam4, truth):
    run = string_model.ball_recording(swing_recording(truth, 12.0, seed=10, scale=NODDING))
    motion = truth.link_motion(run.q, run.qd, run.qdd)
    start = valley_start(wam4, truth, run, 0.04)
    acceleration = run.ball_acceleration.clone()
    # A stretch of free flight (the ball's pull is zero: a = g), and 5 % of the samples hit
    # by impulses (a ball touching the cup): 20 m/s^2 in random directions.
    acceleration[1000:1500] = truth.gravity
    generator = torch.Generator().manual_seed(3)
    hit = torch.randperm(acceleration.shape[0], generator=generator)[:acceleration.shape[0] // 20]
    kick = torch.randn(hit.numel(), 3, generator=generator, dtype=torch.float64)
    acceleration[hit] += 20.0 * kick / kick.norm(dim=-1, keepdim=True)
    cup_xyz, length = string_model.anchor_from_pulls(start, motion, run.ball, acceleration)
    found = StringModel(wam4, string_length=float(length), cup_xyz=cup_xyz.tolist())
    assert max(errors_mm(found, truth)) < 2.0
    # The clean recording.
    clean = string_model.anchor_from_pulls(start, motion, run.ball, run.ball_acceleration)
    assert max(errors_mm(StringModel(wam4, string_length=float(clean[1]),
                                     cup_xyz=clean[0].tolist()), truth)) < 1.0
    # Nothing pulled (the ball falling freely throughout): no answer, the start is kept.
    assert string_model.anchor_from_pulls(start, motion, run.ball,
                                          truth.gravity.expand_as(acceleration)) is None


@pytest.mark.slow
def test_fit_string_identifies_the_damping_of_long_swings(wam4):
    # A string that dissipates as the MuJoCo plant's does (about 0.16 1/s), started from the
    # paper's small nominal friction, on a short budget (an online refit's): the damping
    # stage's one batched pass over 1.5 s windows must find it.
    damped = StringModel(wam4, string_length=0.42, cup_xyz=(0.02, -0.015, 0.075),
                         friction=0.16)
    train = [swing_recording(damped, 10.0, seed) for seed in (13, 14)]
    start = StringModel(wam4, string_length=0.42, cup_xyz=(0.02, -0.015, 0.075),
                        friction=0.01)
    fitted, losses = fit_string(train, start, geometry_iterations=20, iterations=30)
    assert len(losses['damping']) == len(string_model.DAMPING_GRID)
    assert abs(fitted.parameters_dict()['friction'] / 0.16 - 1.0) < 0.15


@pytest.mark.slow
def test_fit_cup_model_identifies_the_arm_and_the_string(wam4, truth):
    t, q, qd, qdd = joint_path(3001, seed=20)
    arm_truth = wam4.replace(inertial=1.2 * wam4.inertial)    # heavier than the catalogue
    with torch.no_grad():
        tau = rnea(arm_truth, q, qd, qdd)
    arm_run = SimpleNamespace(t=t, q=q, qd=qd, qdd=qdd, tau=tau)
    swings = [swing_recording(truth, 10.0, seed=21)]
    arm, string = fit_cup_model(arm_run, swings, wam4, arm_estimator='nea',
                                geometry_iterations=200, iterations=5, horizon=50)
    _, q, qd, qdd = joint_path(3001, seed=22)      # a path the fit never saw
    with torch.no_grad():
        tau = rnea(arm_truth, q, qd, qdd)
        error = (rnea(arm, q, qd, qdd) - tau).abs().max()
        nominal_error = (rnea(wam4, q, qd, qdd) - tau).abs().max()
    assert error < 0.01 * nominal_error
    assert abs(string.parameters_dict()['string_length'] - 0.42) < 0.01


@pytest.mark.slow
@pytest.mark.parametrize('network', [BallFFNN, BallLSTM])
def test_black_box_baselines_learn_and_roll_out_like_the_string_model(wam4, truth, network):
    train = [swing_recording(truth, 8.0, seed) for seed in (30, 31)]
    held_out = swing_recording(truth, 4.0, seed=32)
    nominal = StringModel(wam4)
    untrained = ball_prediction_error(network(), nominal, held_out)['mean_m']
    trained, losses = fit_ball_network(train, network(), nominal, iterations=150)
    assert losses['train'][-1] < 0.5 * losses['train'][0]
    error = ball_prediction_error(trained, nominal, held_out)
    assert math.isfinite(error['mean_m']) and error['mean_m'] < untrained
