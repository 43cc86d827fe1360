"""
Single- and multiple-shooting trajectory likelihoods (CSVGD) on the simple pendulum.

The references are simulated by the same batched simulator (RK4, 10 ms) with the pendulum's
inertial vector scaled by 0.8 and 1.2 (mass scale with the same geometry), driven by a torque
sinusoid so that the scale is identifiable.
"""

import math

from diffsim_ros import robots
from diffsim_ros.core import load_urdf
from diffsim_ros.sysid.likelihoods import (gaussian_log_likelihood, MultipleShooting,
                                           ParameterMap, SingleShooting, TrajectorySimulator)
import pytest
import torch

F64 = torch.float64
DT = 0.01
STEPS = 60
SCALES = (0.8, 1.2)


@pytest.fixture(scope='module')
def setup():
    model = load_urdf(xml=robots.urdf_string('simple_pendulum'), dtype=F64)
    simulator = TrajectorySimulator(ParameterMap(model, [('inertial', (0,))]), DT)
    t = torch.arange(STEPS, dtype=F64) * DT
    controls = (1.5 * torch.sin(2.0 * math.pi * 1.5 * t))[:, None]
    x0 = torch.tensor([[0.3, 0.0]], dtype=F64)
    scales = torch.tensor(SCALES, dtype=F64)[:, None]
    references = simulator.simulate(scales, x0, controls[None])
    return model, simulator, controls, references


def test_references_differ(setup):
    _, _, _, references = setup
    assert references.shape == (2, STEPS + 1, 2)
    assert float((references[0] - references[1]).abs().max()) > 0.05


def test_gaussian_log_likelihood_matches_closed_form():
    g = torch.Generator().manual_seed(1)
    sim = torch.randn(3, 4, 2, generator=g, dtype=F64)
    ref = torch.randn(3, 4, 2, generator=g, dtype=F64)
    sigma = torch.tensor([0.5, 2.0], dtype=F64)
    normal = torch.distributions.Normal(sim, sigma)
    expected = normal.log_prob(ref).sum(dim=(-2, -1))
    torch.testing.assert_close(gaussian_log_likelihood(sim, ref, sigma), expected)


def test_parameter_map_scale_and_value(setup):
    model = setup[0]
    scaled = ParameterMap(model, [('inertial', (0,))])(torch.tensor([[2.0], [0.5]], dtype=F64))
    assert scaled.inertial.shape == (2, 1, 10)
    torch.testing.assert_close(scaled.inertial[0], 2.0 * model.inertial)
    valued = ParameterMap(model, [('damping', (0,))], mode='value')(
        torch.tensor([[0.3]], dtype=F64))
    torch.testing.assert_close(valued.damping, torch.tensor([[0.3]], dtype=F64))
    with pytest.raises(ValueError, match='valid'):
        ParameterMap(model, [('mass', (0,))])


@pytest.mark.parametrize('cls', ['single', 'multiple'])
def test_gradients_exist_and_are_finite(setup, cls):
    _, simulator, controls, references = setup
    if cls == 'single':
        lik = SingleShooting(simulator, references, controls, 0.05)
        particles = lik.pack(torch.tensor([[0.9], [1.1]], dtype=F64))
    else:
        lik = MultipleShooting(simulator, references, controls, 0.05, windows=3)
        particles = lik.pack(torch.tensor([[0.9], [1.1]], dtype=F64))
    particles.requires_grad_(True)
    (grad,) = torch.autograd.grad(lik.log_prob(particles).sum(), particles)
    assert grad.shape == particles.shape
    assert bool(torch.isfinite(grad).all())
    assert float(grad[:, 0].abs().min()) > 0.0
    if cls == 'multiple':
        (jac,) = torch.autograd.grad(lik.defects(particles).square().sum(), particles)
        assert bool(torch.isfinite(jac).all())
        assert float(jac.abs().max()) > 0.0


def test_gradcheck_short_horizon(setup):
    _, simulator, controls, references = setup
    short = references[:, :7]
    ss = SingleShooting(simulator, short, controls[:6], 0.1)
    ms = MultipleShooting(simulator, short, controls[:6], 0.1, windows=3)
    z = ss.pack(torch.tensor([[0.9], [1.05]], dtype=F64)).requires_grad_(True)
    assert torch.autograd.gradcheck(ss.log_prob, (z,))
    zm = ms.pack(torch.tensor([[0.9], [1.05]], dtype=F64)).requires_grad_(True)
    assert torch.autograd.gradcheck(ms.log_prob, (zm,))
    assert torch.autograd.gradcheck(ms.defects, (zm,))


@pytest.mark.parametrize('combine', ['sum', 'product'])
def test_multiple_equals_single_shooting_for_zero_defects(setup, combine):
    _, simulator, controls, references = setup
    params = torch.tensor([[0.7], [1.0], [1.3]], dtype=F64)
    ss = SingleShooting(simulator, references, controls, 0.05, combine=combine)
    ms = MultipleShooting(simulator, references, controls, 0.05, windows=4, combine=combine)
    particles = ms.pack(params, ms.simulated_starts(params))
    assert particles.shape == (3, ms.particle_dim) == (3, 1 + 2 * 3 * 2)
    torch.testing.assert_close(ms.defects(particles), torch.zeros(3, 12, dtype=F64),
                               atol=1e-12, rtol=0.0)
    expected = ss.log_prob(ss.pack(params))
    torch.testing.assert_close(ms.log_prob(particles), expected, rtol=1e-12, atol=1e-8)
    log_prob, defects = ms.log_prob_and_defects(particles)
    torch.testing.assert_close(log_prob, ms.log_prob(particles))
    torch.testing.assert_close(defects, ms.defects(particles))


def test_defects_nonzero_for_inconsistent_starts(setup):
    _, simulator, controls, references = setup
    params = torch.tensor([[1.0]], dtype=F64)
    ms = MultipleShooting(simulator, references, controls, 0.05, windows=3)
    starts = ms.simulated_starts(params).clone()          # (P, R, W - 1, s)
    starts[0, 1, 0, 1] += 0.2                              # reference 1, window 2, velocity
    defects = ms.defects(ms.pack(params, starts)).reshape(1, 2, 2, 2)
    assert float(defects[0, 1, 0, 1].abs()) == pytest.approx(
        0.2 / float(ms.state_scale[1]), rel=1e-9)
    # the kick also changes the end of window 2, hence the next defect; the others stay zero
    assert float(defects[0, 1, 1].abs().max()) > 1e-3
    assert float(defects[0, 0].abs().max()) < 1e-12
    # the references' own states at the window boundaries do not match a wrong parameter
    wrong = ms.defects(ms.pack(torch.tensor([[0.6]], dtype=F64)))
    assert float(wrong.abs().max()) > 1e-2


def test_sum_peaks_at_each_reference_product_between(setup):
    """Core of CSVGD appendix figure 1: mixture (sum) vs product likelihood of two references."""
    _, simulator, controls, references = setup
    grid = torch.linspace(0.6, 1.4, 81, dtype=F64)[:, None]
    sums = SingleShooting(simulator, references, controls, 0.05, combine='sum')
    product = SingleShooting(simulator, references, controls, 0.05, combine='product')
    ll_sum = sums.log_prob(grid)
    ll_product = product.log_prob(grid)
    values = grid[:, 0]
    # product: one mode strictly between the references
    peak = float(values[ll_product.argmax()])
    assert SCALES[0] + 0.05 < peak < SCALES[1] - 0.05
    # sum: a local maximum at each reference scale and a dip between them
    local_max = (ll_sum[1:-1] > ll_sum[:-2]) & (ll_sum[1:-1] > ll_sum[2:])
    modes = values[1:-1][local_max].tolist()
    assert len(modes) == 2
    assert modes == pytest.approx(list(SCALES), abs=1e-9)
    middle = int((values - 1.0).abs().argmin())
    assert float(ll_sum[middle]) < min(float(ll_sum[20]), float(ll_sum[60])) - 100.0
    # a single reference's likelihood is a mixture component: sum = logsumexp - log 2
    per_ref = sums.per_reference(grid)
    torch.testing.assert_close(ll_sum, torch.logsumexp(per_ref, -1) - math.log(2.0))
    torch.testing.assert_close(ll_product, per_ref.sum(-1))


@pytest.mark.parametrize('windows', [1, 3])
def test_batched_equals_loop_over_particles(setup, windows):
    _, simulator, controls, references = setup
    g = torch.Generator().manual_seed(7)
    lik = MultipleShooting(simulator, references, controls, 0.05, windows=windows,
                           param_low=torch.tensor([0.5], dtype=F64),
                           param_high=torch.tensor([1.5], dtype=F64))
    base = lik.pack(torch.tensor([[0.9]], dtype=F64))
    particles = base + 0.1 * torch.randn(4, lik.particle_dim, generator=g, dtype=F64)
    batched = lik.log_prob(particles)
    looped = torch.cat([lik.log_prob(p[None]) for p in particles])
    torch.testing.assert_close(batched, looped, rtol=1e-12, atol=1e-9)
    batched_defects = lik.defects(particles)
    assert batched_defects.shape == (4, 2 * (windows - 1) * 2)
    looped_defects = torch.cat([lik.defects(p[None]) for p in particles])
    torch.testing.assert_close(batched_defects, looped_defects, rtol=1e-12, atol=1e-12)


def test_pack_unpack_round_trip_with_normalisation(setup):
    _, simulator, controls, references = setup
    lik = MultipleShooting(simulator, references, controls, 0.05, windows=4,
                           param_low=torch.tensor([0.5], dtype=F64),
                           param_high=torch.tensor([1.5], dtype=F64))
    params = torch.tensor([[0.5], [1.0], [1.5]], dtype=F64)
    starts = lik.simulated_starts(params)
    particles = lik.pack(params, starts)
    torch.testing.assert_close(particles[:, 0], torch.tensor([-1.0, 0.0, 1.0], dtype=F64))
    torch.testing.assert_close(lik.unpack(particles), params)
    torch.testing.assert_close(lik.unpack_starts(particles), starts)
    # normalised start states are O(1)
    assert float(particles[:, 1:].abs().max()) < 5.0


def test_joint_friction_particles_change_the_dynamics(setup):
    model, _, controls, _ = setup
    simulator = TrajectorySimulator(ParameterMap(model, [('damping', (0,))], mode='value'), DT,
                                    joint_friction=True)
    x0 = torch.tensor([[0.3, 0.0]], dtype=F64)
    states = simulator.simulate(torch.tensor([[0.0], [0.5]], dtype=F64), x0, controls[None])
    assert states.shape == (2, STEPS + 1, 2)
    assert float((states[0] - states[1]).abs().max()) > 1e-2


def test_invalid_arguments(setup):
    _, simulator, controls, references = setup
    with pytest.raises(ValueError, match='divisor'):
        MultipleShooting(simulator, references, controls, 0.05, windows=7)
    with pytest.raises(ValueError, match='valid'):
        SingleShooting(simulator, references, controls, 0.05, combine='mean')
    with pytest.raises(ValueError, match='controls'):
        SingleShooting(simulator, references, controls[:10], 0.05)
    with pytest.raises(ValueError, match='positive'):
        SingleShooting(simulator, references, controls, -1.0)
