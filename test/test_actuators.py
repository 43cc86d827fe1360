"""Tests of the friction and actuator models (diffsim_ros.core.actuators)."""

import math

from diffsim_ros.core.actuators import (
    CoulombFriction, DCMotor, FFNN, make_friction, NNFriction, NNResidual, NoFriction,
    SigmoidFriction, StribeckFriction, ViscousFriction)
from diffsim_ros.core.errors import ShapeError
import pytest
import torch
from torch.autograd import gradcheck
from torch.func import functional_call

F64 = torch.float64
N = 3
FRICTION_NAMES = ('none', 'viscous', 'coulomb', 'stribeck', 'sigmoid', 'nn-friction',
                  'nn-residual')
PHYSICAL = ('none', 'viscous', 'coulomb', 'stribeck', 'sigmoid')

# Quanser constants as listed in shared/data/quanser_cartpole_pyrado/SOURCE.md and
# shared/data/quanser_qube_pyrado/SOURCE.md.
IP02 = {'R_m': 2.6, 'k_m': 7.67e-3, 'K_g': 3.71, 'r_mp': 6.35e-3, 'eta_g': 0.9, 'eta_m': 0.9,
        'J_m': 3.9e-7}
QUBE = {'R_m': 8.4, 'k_m': 0.042}


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_states(shape, seed: int):
    """Positions and velocities spanning tiny to large speeds, with exact zeros."""
    gen = generator(seed)
    q = 3 * torch.randn(*shape, generator=gen, dtype=F64)
    magnitude = 10 ** (6 * torch.rand(*shape, generator=gen, dtype=F64) - 4)  # 1e-4 .. 1e2
    sign = torch.randint(0, 2, shape, generator=gen).to(F64) * 2 - 1
    qd = sign * magnitude
    qd.view(-1)[::17] = 0.0
    return q, qd


def randomize_(module: torch.nn.Module, seed: int, scale: float) -> None:
    gen = generator(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(scale * torch.randn(param.shape, generator=gen, dtype=param.dtype))


def test_registry_and_error():
    q, qd = random_states((5, N), seed=0)
    for name in FRICTION_NAMES:
        model = make_friction(name, N, dtype=F64)
        assert model.n == N
        assert model(q, qd).shape == (5, N)
    with pytest.raises(ValueError) as info:
        make_friction('lugre', N)
    for name in FRICTION_NAMES:
        assert repr(name) in str(info.value)


@pytest.mark.parametrize('name', PHYSICAL[1:])
@pytest.mark.parametrize('seed', range(5))
def test_physical_models_dissipate_elementwise(name, seed):
    model = make_friction(name, N, dtype=F64)
    randomize_(model, seed, scale=5.0)
    q, qd = random_states((2000, N), seed=seed + 100)
    power = model(q, qd) * qd
    assert bool((power >= 0).all())


@pytest.mark.parametrize('seed', range(5))
def test_nn_friction_is_passive_for_any_weights(seed):
    model = NNFriction(N, hidden=(16, 16), dtype=F64)
    randomize_(model, seed, scale=3.0)
    q, qd = random_states((4000, N), seed=seed + 200)
    tau_f = model(q, qd)
    assert bool(((tau_f * qd).sum(-1) >= 0).all())
    assert bool(((tau_f * qd) >= 0).all())           # per joint as well (diagonal gain)


def test_nn_residual_is_not_passive():
    """The residual is documented as unconstrained: it does inject energy somewhere."""
    model = NNResidual(N, dtype=F64)
    randomize_(model, 0, scale=1.0)
    q, qd = random_states((2000, N), seed=300)
    assert bool(((model(q, qd) * qd).sum(-1) < 0).any())


def test_init_from_physical_values():
    damping = torch.tensor([0.0, 1e-3, 2.5], dtype=F64)
    model = ViscousFriction(N, damping=damping, dtype=F64)
    torch.testing.assert_close(model.damping, damping.clamp_min(1e-12), rtol=1e-12, atol=0)
    stribeck = StribeckFriction(N, coulomb=0.1, static=0.3, stribeck_velocity=0.05,
                                viscous=[0.01, 0.02, 0.03], dtype=F64)
    c = stribeck.coefficients
    torch.testing.assert_close(c['coulomb'], torch.full((N,), 0.1, dtype=F64))
    torch.testing.assert_close(c['static'], torch.full((N,), 0.3, dtype=F64))
    torch.testing.assert_close(c['stribeck_velocity'], torch.full((N,), 0.05, dtype=F64))
    torch.testing.assert_close(c['viscous'], torch.tensor([0.01, 0.02, 0.03], dtype=F64))
    with pytest.raises(ValueError, match='damping must be finite and >= 0'):
        ViscousFriction(N, damping=-0.1)
    with pytest.raises(ValueError, match='eps'):
        CoulombFriction(N, eps=0.0)
    with pytest.raises(ValueError, match='stribeck_velocity'):
        StribeckFriction(N, stribeck_velocity=0.0)


def test_closed_forms():
    q, qd = random_states((50, N), seed=1)
    eps = 0.01
    coulomb = CoulombFriction(N, coulomb=0.2, eps=eps, dtype=F64)
    torch.testing.assert_close(coulomb(q, qd), 0.2 * torch.tanh(qd / eps))
    fc, fs, vs, fv = 0.1, 0.3, 0.05, 0.02
    stribeck = StribeckFriction(N, coulomb=fc, static=fs, stribeck_velocity=vs, viscous=fv,
                                eps=eps, dtype=F64)
    expected = (fc + (fs - fc) * torch.exp(-(qd / vs) ** 2)) * torch.tanh(qd / eps) + fv * qd
    torch.testing.assert_close(stribeck(q, qd), expected)
    # Breakaway peak just above eps, Coulomb + viscous well above v_s.
    slow = torch.full((1, N), 0.1 * vs + 5 * eps, dtype=F64)
    fast = torch.full((1, N), 10.0, dtype=F64)
    assert bool((stribeck(q[:1], slow) > fc + fv * slow).all())
    torch.testing.assert_close(stribeck(q[:1], fast), fc + fv * fast)
    assert torch.equal(NoFriction(N)(q, qd), torch.zeros_like(qd))


def _gradcheck_module(module, inputs):
    named = list(module.named_parameters())
    names = [name for name, _ in named]
    params = [param.detach().clone().requires_grad_(True) for _, param in named]
    inputs = [x.detach().clone().requires_grad_(True) for x in inputs]

    def fn(*args):
        state = dict(zip(names, args[len(inputs):]))
        return functional_call(module, state, tuple(args[:len(inputs)]))

    return gradcheck(fn, (*inputs, *params))


@pytest.mark.parametrize('name', PHYSICAL[1:])
def test_gradcheck_physical_friction(name):
    model = make_friction(name, N, dtype=F64, batch_shape=(2, 1))
    randomize_(model, 3, scale=1.0)
    q, qd = random_states((4, N), seed=4)
    qd = qd.clamp(-1.0, 1.0)  # keep tanh(qd / eps) out of its flat, round-off-dominated tails
    assert _gradcheck_module(model, (q, qd))


def test_gradcheck_dc_motor():
    motor = DCMotor(N, motor_constant=[0.04, 0.05, 0.06], resistance=[8.0, 2.0, 1.0],
                    gear_ratio=[1.0, 3.0, 50.0], gear_efficiency=0.9, dtype=F64)
    gen = generator(5)
    voltage = torch.randn(4, N, generator=gen, dtype=F64)
    qd = torch.randn(4, N, generator=gen, dtype=F64)
    assert _gradcheck_module(motor, (voltage, qd))


def test_gradcheck_nn_models():
    q, qd = random_states((3, N), seed=6)
    qd = qd.clamp(-1.0, 1.0)
    for model in (NNFriction(N, hidden=(8,), dtype=F64), NNResidual(N, hidden=(8,), dtype=F64)):
        assert gradcheck(lambda a, b: model(a, b),
                         (q.clone().requires_grad_(True), qd.clone().requires_grad_(True)))


def test_dc_motor_closed_form():
    k_m, R_m = 0.05, 4.0
    motor = DCMotor(1, motor_constant=k_m, resistance=R_m, dtype=F64)
    voltage = torch.tensor([[-3.0], [0.0], [5.0]], dtype=F64)
    qd = torch.tensor([[2.0], [-7.0], [0.5]], dtype=F64)
    torch.testing.assert_close(motor(voltage, qd), k_m * (voltage - k_m * qd) / R_m,
                               rtol=1e-14, atol=0)
    torch.testing.assert_close(motor.motor_constant, torch.tensor([k_m], dtype=F64))
    torch.testing.assert_close(motor.resistance, torch.tensor([R_m], dtype=F64))

    G, eta_g, eta_m = 50.0, 0.8, 0.95
    geared = DCMotor(1, motor_constant=k_m, resistance=R_m, gear_ratio=G, gear_efficiency=eta_g,
                     motor_efficiency=eta_m, dtype=F64)
    expected = eta_g * G * eta_m * k_m * (voltage - G * k_m * qd) / R_m
    torch.testing.assert_close(geared(voltage, qd), expected, rtol=1e-14, atol=0)


def test_quanser_ip02_matches_pyrado_and_quanser():
    c = IP02
    voltage = torch.tensor([[-6.0], [0.0], [3.5], [3.5]], dtype=F64)
    xd = torch.tensor([[0.3], [-0.5], [0.0], [1.2]], dtype=F64)
    gain = c['eta_g'] * c['K_g'] * c['eta_m'] * c['k_m'] / (c['R_m'] * c['r_mp'])
    back_emf = c['K_g'] * c['k_m'] * xd / c['r_mp']
    # Pyrado QCartPoleSim._dynamics: f_act = gain * (eta_m * u - K_g k_m x_dot / r_mp)
    pyrado = DCMotor.quanser_ip02(dtype=F64)
    torch.testing.assert_close(pyrado(voltage, xd), gain * (c['eta_m'] * voltage - back_emf),
                               rtol=1e-14, atol=1e-14)
    quanser = DCMotor.quanser_ip02('quanser', dtype=F64)
    torch.testing.assert_close(quanser(voltage, xd), gain * (voltage - back_emf),
                               rtol=1e-14, atol=1e-14)
    # 3.5 V at rest: 0.9 * 3.71 * 0.9 * 7.67e-3 * 0.9 * 3.5 / (2.6 * 6.35e-3) = 4.3976 N.
    assert abs(float(pyrado(voltage[2:3], xd[2:3]).detach()) - 4.3976) < 1e-4
    # Pyrado's J_eq = m_cart + eta_g K_g^2 J_m / r_mp^2.
    reflected = c['eta_g'] * c['K_g'] ** 2 * c['J_m'] / c['r_mp'] ** 2
    torch.testing.assert_close(pyrado.reflected_inertia(c['J_m']),
                               torch.tensor([reflected], dtype=F64))
    with pytest.raises(ValueError, match="'pyrado', 'quanser'"):
        DCMotor.quanser_ip02('matlab')


def test_qube_servo2_motor():
    motor = DCMotor.qube_servo2(dtype=F64)
    voltage = torch.tensor([[1.5]], dtype=F64)
    qd = torch.tensor([[10.0]], dtype=F64)
    expected = QUBE['k_m'] * (voltage - QUBE['k_m'] * qd) / QUBE['R_m']
    torch.testing.assert_close(motor(voltage, qd), expected, rtol=1e-14, atol=0)


def test_sigmoid_friction_is_gaz_table_i():
    # Gaz et al. (RA-L 2019) Table I, joints 1 and 3 of the Panda, written out by hand
    phi1, phi2, phi3 = (0.54615, 0.64068), (5.1181, 10.136), (0.039533, -0.04607)
    model = SigmoidFriction(2, phi1=phi1, phi2=phi2, phi3=phi3, dtype=F64)
    qd = torch.tensor([[-1.0, 0.3], [0.0, 0.0], [0.05, -2.0]], dtype=F64)
    expected = torch.tensor([[phi1[j] / (1.0 + math.exp(-phi2[j] * (v + phi3[j])))
                              - phi1[j] / (1.0 + math.exp(-phi2[j] * phi3[j]))
                              for j, v in enumerate(row)] for row in qd.tolist()], dtype=F64)
    torch.testing.assert_close(model(torch.zeros_like(qd), qd), expected)
    # zero at rest, and saturation levels that differ by direction (what a URDF cannot hold)
    saturated = torch.tensor([[1e3, 1e3], [-1e3, -1e3]], dtype=F64)
    fast = model(torch.zeros(2, 2, dtype=F64), saturated)
    start = [1.0 / (1.0 + math.exp(-b * c)) for b, c in zip(phi2, phi3)]
    torch.testing.assert_close(fast[0], torch.tensor([a * (1 - s) for a, s in zip(phi1, start)],
                                                     dtype=F64))
    torch.testing.assert_close(fast[1], torch.tensor([-a * s for a, s in zip(phi1, start)],
                                                     dtype=F64))
    assert not torch.allclose(fast[0], -fast[1], rtol=1e-2)
    # the exported coefficients rebuild the same model
    again = make_friction('sigmoid', 2, dtype=F64, **model.coefficients)
    torch.testing.assert_close(again(torch.zeros_like(qd), qd), expected)
    with pytest.raises(ValueError, match='phi2'):
        SigmoidFriction(2, phi2=0.0)
    with pytest.raises(ValueError, match='phi3'):
        SigmoidFriction(2, phi3=math.nan)


def test_dc_motor_rejects_bad_constants():
    with pytest.raises(ValueError, match='resistance'):
        DCMotor(1, motor_constant=0.1, resistance=0.0)
    with pytest.raises(ValueError, match=r'gear_efficiency must be in \(0, 1\]'):
        DCMotor(1, motor_constant=0.1, resistance=1.0, gear_efficiency=1.5)


@pytest.mark.parametrize('name', PHYSICAL[1:])
def test_particle_batch_broadcasts_against_states(name):
    P, B = 4, 6
    model = make_friction(name, N, dtype=F64, batch_shape=(P, 1))
    randomize_(model, 7, scale=1.0)
    q, qd = random_states((B, N), seed=8)
    out = model(q, qd)
    assert out.shape == (P, B, N)
    raw = dict(model.named_parameters())
    for p in range(P):
        single = {k: v[p, 0] for k, v in raw.items()}
        torch.testing.assert_close(out[p], functional_call(model, single, (q, qd)))


def test_viscous_per_particle_values_broadcast():
    damping = torch.tensor([0.1, 0.2], dtype=F64)[:, None, None] * torch.ones(2, 1, N, dtype=F64)
    model = ViscousFriction(N, damping=damping, dtype=F64)
    qd = torch.ones(5, N, dtype=F64)
    out = model(torch.zeros(5, N, dtype=F64), qd)
    assert out.shape == (2, 5, N)
    torch.testing.assert_close(out[1], 0.2 * qd)


def test_dc_motor_particles():
    P, B = 3, 5
    motor = DCMotor(2, motor_constant=0.05, resistance=2.0, batch_shape=(P, 1), dtype=F64)
    with torch.no_grad():
        motor.log_resistance.add_(torch.linspace(0, 1, P, dtype=F64)[:, None, None])
    gen = generator(9)
    voltage = torch.randn(B, 2, generator=gen, dtype=F64)
    qd = torch.randn(B, 2, generator=gen, dtype=F64)
    out = motor(voltage, qd)
    assert out.shape == (P, B, 2)
    R = motor.resistance
    torch.testing.assert_close(out, 0.05 * (voltage - 0.05 * qd) / R)


def test_nn_models_accept_leading_dims():
    q, qd = random_states((2, 3, N), seed=10)
    for model in (NNFriction(N, dtype=F64), NNResidual(N, dtype=F64)):
        assert model(q, qd).shape == (2, 3, N)
    ffnn = FFNN(N, hidden=(16,), dtype=F64)
    tau = torch.zeros(2, 3, N, dtype=F64)
    qdd = ffnn(q, qd, tau)
    assert qdd.shape == (2, 3, N)
    qdd.sum().backward()
    assert all(p.grad is not None for p in ffnn.parameters())


def test_forward_is_pure():
    q, qd = random_states((8, N), seed=11)
    for name in FRICTION_NAMES[1:]:
        model = make_friction(name, N, dtype=F64)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        attributes = set(vars(model))
        first = model(q, qd)
        second = model(q, qd)
        assert torch.equal(first, second)
        assert set(vars(model)) == attributes
        for k, v in model.state_dict().items():
            assert torch.equal(v, before[k])


@pytest.mark.parametrize('name', FRICTION_NAMES)
def test_bad_shapes_raise(name):
    model = make_friction(name, N)
    good = torch.zeros(5, N)
    with pytest.raises(ShapeError, match=r'qd: expected shape \(\.\.\., 3\), got \(5, 4\)'):
        model(good, torch.zeros(5, 4))
    with pytest.raises(ShapeError, match=r'q: expected shape \(\.\.\., 3\), got \(2,\)'):
        model(torch.zeros(2), good)


def test_bad_shapes_raise_motor_and_ffnn():
    motor = DCMotor(2, motor_constant=0.05, resistance=2.0)
    with pytest.raises(ShapeError, match=r'voltage: expected shape \(\.\.\., 2\), got \(4, 3\)'):
        motor(torch.zeros(4, 3), torch.zeros(4, 2))
    ffnn = FFNN(N)
    with pytest.raises(ShapeError, match='tau'):
        ffnn(torch.zeros(4, N), torch.zeros(4, N), torch.zeros(4, N + 1))
    with pytest.raises(ShapeError, match='damping'):
        ViscousFriction(N, damping=torch.ones(4))
    with pytest.raises(ValueError, match='positive int'):
        ViscousFriction(0)
