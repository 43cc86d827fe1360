"""
Velocities from local polynomial fits of recorded poses (``sysid.pose_smoothing``).

Identities (the fits reproduce polynomials of their degree; backward differences invert the
semi-implicit step the contact model and the violation loss use), the smoother against the
analytic velocities of a noisy simulated tumble, and the object spec's window reaching every
learning method through ``fit_object``; on a synthetic bounce whose impact sample and velocity
jump are known, impacts found where they are and kept at their sample by the segment-wise fits
(and blurred by fits that span them).
"""

import dataclasses
from types import SimpleNamespace

from diffsim_ros.core.configuration import semi_implicit_update
from diffsim_ros.core.contact import contact_kinematics
from diffsim_ros.core.spatial import (quat_conjugate, quat_exp, quat_multiply,
                                      quat_rotate)
from diffsim_ros.io.object_urdf import elbow_spec
from diffsim_ros.robots import object_urdf_path
from diffsim_ros.sysid import object_learning
from diffsim_ros.sysid.pose_smoothing import (backward_velocities, impact_samples,
                                              local_polynomial_weights, smooth_configurations,
                                              smooth_trajectories)
import numpy as np
import pytest
import torch

DT = 0.0068
T = 41


@pytest.fixture(scope='module')
def spec():
    """Return the elbow's spec from the shipped URDF (no recordings needed)."""
    return elbow_spec(SimpleNamespace(urdf_path=object_urdf_path('elbow_toss'), friction=0.3,
                                      q=(torch.zeros(1, 8, dtype=torch.float64),)))


@pytest.mark.parametrize('window, order', [(5, 2), (7, 2), (9, 3)])
def test_local_fits_reproduce_polynomials_of_their_degree_to_the_ends(window, order):
    t = np.arange(T, dtype=float)
    weights = local_polynomial_weights(T, window, order)
    for degree in range(order + 1):
        np.testing.assert_allclose(weights @ (0.3 + t ** degree), 0.3 + t ** degree,
                                   rtol=1e-9, atol=1e-8)
    # a degree above the fit's is not reproduced, so the identity above is not vacuous
    assert np.abs(weights @ t ** (order + 1) - t ** (order + 1)).max() > 1e-3
    with pytest.raises(ValueError, match='odd window'):
        local_polynomial_weights(T, window + 1, order)
    with pytest.raises(ValueError, match='odd window'):
        local_polynomial_weights(window - 2, window, order)


def _tumble(rate, n=T):
    # A free tumble: ballistic position, constant body rate, hinge angle quadratic in time;
    # returns the configurations and their analytic velocities half a sample back (where a
    # backward difference of a quadratic is exact).
    t = torch.arange(n, dtype=torch.float64) * DT
    g = torch.tensor([0.0, 0.0, -9.81], dtype=torch.float64)
    p0 = torch.tensor([0.1, -0.2, 0.3], dtype=torch.float64)
    u0 = torch.tensor([0.8, -0.3, 1.5], dtype=torch.float64)
    p = p0 + t[:, None] * u0 + 0.5 * t[:, None] ** 2 * g
    quat0 = torch.tensor([0.2, -0.4, 0.1, 0.9], dtype=torch.float64)
    quat0 = quat0 / quat0.norm()
    quat = quat_multiply(quat0.expand(n, 4), quat_exp(t[:, None] * rate))
    hinge = 0.4 + 6.0 * t - 20.0 * t ** 2
    q = torch.cat((p, quat, hinge[:, None]), -1)
    mid = t - 0.5 * DT
    world = u0 + mid[:, None] * g
    linear = quat_rotate(quat_conjugate(quat), world)   # root axes at sample k
    v = torch.cat((linear, rate.expand(n, 3), (6.0 - 40.0 * mid)[:, None]), -1)
    return q, v


def test_backward_velocities_invert_the_semi_implicit_step(spec):
    # q_{k+1} = the semi-implicit step from q_k with step_velocity(v_{k+1}): the convention
    # of the violation loss and the contact model, and of the recorded velocities.
    g = torch.Generator().manual_seed(0)
    q = [torch.tensor([0.0, 0.1, 0.2, 0.0, 0.0, 0.0, 1.0, 0.3], dtype=torch.float64)]
    v_next = []
    for _ in range(12):
        step = torch.randn(7, generator=g, dtype=torch.float64) * torch.tensor(
            [1.0, 1.0, 1.0, 20.0, 20.0, 20.0, 40.0], dtype=torch.float64)
        q_new, v_new = semi_implicit_update(spec.model, q[-1], step, DT)
        q.append(q_new)
        v_next.append(v_new)
    v = backward_velocities(torch.stack(q), DT)
    torch.testing.assert_close(v[1:], torch.stack(v_next), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(v[0], v[1])


def test_smoothing_is_exact_on_a_noise_free_tumble_and_beats_differences_on_a_noisy_one():
    rate = torch.tensor([7.0, -12.0, 4.0], dtype=torch.float64)
    q, v_true = _tumble(rate)
    # noise free: the quadratic fits keep the tumble, so the velocities are its analytic ones
    exact, v_exact = smooth_trajectories(([q], [q[:, :7]]), DT, 7)
    torch.testing.assert_close(exact[0], q, rtol=0, atol=1e-9)
    torch.testing.assert_close(v_exact[0][1:], v_true[1:], rtol=0, atol=1e-6)
    # mocap-like noise: 0.3 mm, 3 mrad, 5 mrad on the hinge
    g = torch.Generator().manual_seed(1)
    n = torch.randn(T, 7, generator=g, dtype=torch.float64)
    noisy = torch.cat((q[:, :3] + 3e-4 * n[:, :3],
                       quat_multiply(q[:, 3:7], quat_exp(3e-3 * n[:, 3:6])),
                       q[:, 7:] + 5e-3 * n[:, 6:]), -1)
    raw = backward_velocities(noisy, DT)
    smooth = backward_velocities(smooth_configurations(noisy, 9), DT)
    for columns in (slice(0, 3), slice(3, 6), slice(6, 7)):
        error_raw = (raw - v_true)[1:, columns].pow(2).mean().sqrt()
        error_smooth = (smooth - v_true)[1:, columns].pow(2).mean().sqrt()
        assert error_smooth < 0.5 * error_raw, (columns, error_smooth, error_raw)
    # the velocity change from one sample to the next (what a one-step loss explains with
    # forces): noise dominates the raw differences, the smoothed ones are near the truth's
    change = v_true[2:] - v_true[1:-1]
    assert ((raw[2:] - raw[1:-1]) - change).pow(2).mean() > 20 * (
        (smooth[2:] - smooth[1:-1]) - change).pow(2).mean()


def test_the_specs_window_reaches_every_method_through_fit_object(spec, monkeypatch):
    rate = torch.tensor([7.0, -12.0, 4.0], dtype=torch.float64)
    q, v = _tumble(rate)
    g = torch.Generator().manual_seed(2)
    noisy = q + torch.cat((1e-3 * torch.randn(T, 3, generator=g, dtype=torch.float64),
                           torch.zeros(T, 4, dtype=torch.float64),
                           1e-2 * torch.randn(T, 1, generator=g, dtype=torch.float64)), -1)
    seen = {}

    def capture(spec_, train, validation, dt, **kwargs):
        seen['train'], seen['validation'] = train, validation
        return 'fit'

    for method in object_learning.METHODS:
        monkeypatch.setitem(object_learning.METHODS, method, capture)
        smoothed_spec = dataclasses.replace(spec, smooth_window=7)
        assert object_learning.fit_object(smoothed_spec, method, ([noisy], [v]),
                                          ([noisy[:20]], [v[:20]]), DT) == 'fit'
        expected = smooth_trajectories(([noisy], [v]), DT, 7)
        torch.testing.assert_close(seen['train'][0][0], expected[0][0])
        torch.testing.assert_close(seen['train'][1][0], expected[1][0])
        torch.testing.assert_close(seen['validation'][0][0],
                                   smooth_configurations(noisy[:20], 7))
        assert not torch.allclose(seen['train'][1][0], v)
        # the elbow's own spec carries its chosen window (io.object_urdf)
        object_learning.fit_object(spec, method, ([noisy], [v]), ([noisy], [v]), DT)
        torch.testing.assert_close(seen['train'][0][0],
                                   smooth_configurations(noisy, spec.smooth_window))
        plain = dataclasses.replace(spec, smooth_window=1)
        object_learning.fit_object(plain, method, ([noisy], [v]), ([noisy], [v]), DT)
        assert seen['train'][0][0] is noisy and seen['train'][1][0] is v
    for window in (0, 4):
        with pytest.raises(ValueError, match='smooth_window'):
            dataclasses.replace(spec, smooth_window=window)


def test_short_trajectories_are_fitted_over_what_they_hold():
    q, v = _tumble(torch.tensor([7.0, -12.0, 4.0], dtype=torch.float64), n=6)
    (short, two), (v_short, v_two) = smooth_trajectories(([q, q[:2]], [v, v[:2]]), DT, 7)
    torch.testing.assert_close(short, smooth_configurations(q, 5))
    torch.testing.assert_close(v_short, backward_velocities(short, DT))
    assert two is q[:2] or torch.equal(two, q[:2])
    assert torch.equal(v_two, v[:2])
    with pytest.raises(ValueError, match='odd window'):
        smooth_trajectories(([q], [v]), DT, 6)


def _bounce(spec, n=T, impact=20, restitution=0.5):
    # The elbow falling flat (hinge held) onto the table, its lowest corners reaching it
    # exactly at sample ``impact``, where the vertical velocity flips to ``-restitution``
    # times itself: positions are quadratic on either side of the impact, so a fit that does
    # not span it reproduces them, and the backward-difference velocity jumps at
    # ``impact + 1`` (``v_impact`` is the last pre-impact one).
    t = (torch.arange(n, dtype=torch.float64) - impact) * DT
    g, fall = 9.81, 1.5   # m/s^2, m/s at the impact
    before = -fall * t - 0.5 * g * t ** 2
    after = restitution * fall * t - 0.5 * g * t ** 2
    z = torch.where(t <= 0, before, after)
    q = torch.zeros(n, 8, dtype=torch.float64)
    q[:, 0] = 0.4 * t
    q[:, 6] = 1.0
    lowest = contact_kinematics(spec.model, q[:1], spec.contact).phi.amin()
    q[:, 2] = z - lowest
    return q, (1 + restitution) * fall


def test_impacts_are_found_at_the_sample_the_velocity_jumps(spec):
    q, _ = _bounce(spec)
    assert impact_samples(spec.model, spec.contact, q, DT, jump=0.5) == [21]
    # high above the table the same jump is no impact
    high = q.clone()
    high[:, 2] += 0.2
    assert impact_samples(spec.model, spec.contact, high, DT, jump=0.5) == []


def test_smoothing_keeps_an_impacts_velocity_jump_at_its_sample_only_with_breaks(spec):
    q, jump = _bounce(spec)
    v = backward_velocities(q, DT)
    assert float(v[21, 2] - v[20, 2]) == pytest.approx(jump - 9.81 * DT, abs=1e-9)
    breaks = [impact_samples(spec.model, spec.contact, q, DT, jump=0.5)]
    (aware,), (v_aware,) = smooth_trajectories(([q], [v]), DT, 7, breaks=breaks)
    # noise free and quadratic on either side: the fits reproduce the recording exactly
    torch.testing.assert_close(aware, q, rtol=0, atol=1e-9)
    torch.testing.assert_close(v_aware, v, rtol=0, atol=1e-6)
    # the fits across the impact soften it: the toss slows before its corners reach the
    # table (samples 18-20 are free flight) and the bounce ends after sample 21
    (_,), (v_blur,) = smooth_trajectories(([q], [v]), DT, 7)
    rise = v_blur[1:, 2] - v[1:, 2] - (v_blur[:-1, 2] - v[:-1, 2])
    assert (v_blur[18:21, 2] - v[18:21, 2]).abs().max() > 0.1
    assert float(v_blur[21, 2] - v_blur[20, 2]) < 0.6 * float(v[21, 2] - v[20, 2])
    assert rise.abs().max() > 0.3
    # with mocap-like noise (0.4 mm, 4 mrad, 7.5 mrad hinge) the jump stays at sample 21
    g = torch.Generator().manual_seed(3)
    n = torch.randn(T, 7, generator=g, dtype=torch.float64)
    noisy = torch.cat((q[:, :3] + 4e-4 * n[:, :3],
                       quat_multiply(q[:, 3:7], quat_exp(4e-3 * n[:, 3:6])),
                       q[:, 7:] + 7.5e-3 * n[:, 6:]), -1)
    found = impact_samples(spec.model, spec.contact, noisy, DT, jump=0.5)
    assert 21 in found
    (_,), (v_noisy,) = smooth_trajectories(([noisy], [v]), DT, 7, breaks=[found])
    change = v_noisy[1:, 2] - v_noisy[:-1, 2]
    assert int(change.argmax()) + 1 == 21
    assert float(change[20]) == pytest.approx(jump - 9.81 * DT, abs=0.3)
    (_,), (v_noisy_blur,) = smooth_trajectories(([noisy], [v]), DT, 7)
    assert float(v_noisy_blur[21, 2] - v_noisy_blur[20, 2]) < 0.6 * (jump - 9.81 * DT)
    with pytest.raises(ValueError, match='break lists'):
        smooth_trajectories(([q], [v]), DT, 7, breaks=[])


def test_the_specs_impact_jump_breaks_the_smoothing_in_fit_object(spec, monkeypatch):
    q, _ = _bounce(spec)
    v = backward_velocities(q, DT)
    seen = {}

    def capture(spec_, train, validation, dt, **kwargs):
        seen['train'] = train
        return 'fit'

    monkeypatch.setitem(object_learning.METHODS, 'ccn', capture)
    aware = dataclasses.replace(spec, smooth_window=7, impact_jump=0.5)
    object_learning.fit_object(aware, 'ccn', ([q], [v]), ([q], [v]), DT)
    torch.testing.assert_close(seen['train'][1][0], v, rtol=0, atol=1e-6)
    spanning = dataclasses.replace(spec, smooth_window=7, impact_jump=None)
    object_learning.fit_object(spanning, 'ccn', ([q], [v]), ([q], [v]), DT)
    assert (seen['train'][1][0] - v).abs().max() > 0.1
    with pytest.raises(ValueError, match='impact_jump'):
        dataclasses.replace(spec, impact_jump=0.0)
