"""Identities of rigid-body dynamics that need no reference engine (shipped + random robots)."""

from diffsim_ros import robots
from diffsim_ros.core import (aba, crba, kinetic_energy, load_urdf, potential_energy, rnea,
                              rollout, semi_implicit_euler)
from diffsim_ros.core.regressor import joint_torque_regressor
import numpy as np
import pytest
import torch
from urdf_factory import robot_to_urdf, seeded_robot

# Per-dtype tolerances (relative to the magnitude of the compared quantity), one table.
TOLERANCE = {torch.float64: 1e-10, torch.float32: 2e-4}

CASES = [('robot', name) for name in robots.names()] + [('seed', s) for s in range(8)]


def _model(case, dtype=torch.float64):
    kind, key = case
    xml = robots.urdf_string(key) if kind == 'robot' else robot_to_urdf(seeded_robot(key))
    return load_urdf(xml=xml, dtype=dtype)


def _states(model, batch, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q, qd, qdd = (torch.randn((batch, model.n), generator=g, dtype=torch.float64).to(dtype)
                  for _ in range(3))
    return q, qd, qdd


def _close(actual, expected, dtype=torch.float64):
    scale = max(1.0, float(expected.abs().max()))
    error = float((actual - expected).abs().max())
    assert error <= TOLERANCE[dtype] * scale, f'error {error:.3e} (scale {scale:.3e})'


@pytest.mark.parametrize('case', CASES, ids=str)
def test_mass_matrix_and_bias_reproduce_rnea(case):
    model = _model(case)
    q, qd, qdd = _states(model, 5, 0)
    M = crba(model, q)
    h = rnea(model, q, qd, torch.zeros_like(qdd))
    _close((M @ qdd.unsqueeze(-1)).squeeze(-1) + h, rnea(model, q, qd, qdd))
    _close(M, M.mT)
    assert bool((torch.linalg.eigvalsh(M) > 0).all())


@pytest.mark.parametrize('case', CASES, ids=str)
def test_aba_inverts_rnea(case):
    model = _model(case).replace(armature=torch.linspace(0.0, 0.05, _model(case).n,
                                                         dtype=torch.float64))
    q, qd, qdd = _states(model, 5, 1)
    _close(aba(model, q, qd, rnea(model, q, qd, qdd)), qdd)


@pytest.mark.parametrize('case', CASES, ids=str)
def test_regressor_is_linear_in_inertial_parameters(case):
    model = _model(case)
    q, qd, qdd = _states(model, 4, 2)
    Y = joint_torque_regressor(model, q, qd, qdd)
    assert Y.shape == (4, model.n, 10 * model.n)
    _close((Y @ model.inertial.flatten(-2).unsqueeze(-1)).squeeze(-1), rnea(model, q, qd, qdd))


@pytest.mark.parametrize('case', CASES[:4], ids=str)
def test_regressor_equals_autograd_jacobian(case):
    model = _model(case)
    q, qd, qdd = (x[0] for x in _states(model, 1, 3))

    def torque(pi_flat):
        return rnea(model.replace(inertial=pi_flat.reshape(model.n, 10)), q, qd, qdd)

    J = torch.autograd.functional.jacobian(torque, model.inertial.flatten())
    _close(joint_torque_regressor(model, q, qd, qdd), J)


@pytest.mark.parametrize('case', CASES, ids=str)
def test_dtau_dqdd_is_mass_matrix(case):
    model = _model(case)
    q, qd, qdd = (x[0] for x in _states(model, 1, 4))
    J = torch.autograd.functional.jacobian(lambda a: rnea(model, q, qd, a), qdd)
    _close(J, crba(model, q))


@pytest.mark.parametrize('case', CASES, ids=str)
def test_kinetic_energy_matches_mass_matrix(case):
    model = _model(case)
    q, qd, _ = _states(model, 3, 5)
    M = crba(model, q)
    expected = 0.5 * (qd.unsqueeze(-2) @ M @ qd.unsqueeze(-1)).squeeze(-1).squeeze(-1)
    _close(kinetic_energy(model, q, qd), expected)


@pytest.mark.parametrize('case', [('robot', 'double_pendulum'), ('robot', 'panda'),
                                  ('seed', 3)], ids=str)
def test_energy_is_conserved_by_undamped_rk4(case):
    model = _model(case)
    q0, qd0, _ = _states(model, 2, 6)
    x0 = torch.cat((q0, 0.5 * qd0), dim=-1)
    dt, steps = 1e-3, 1000
    states = rollout(model, x0, torch.zeros(2, steps, model.n, dtype=torch.float64), dt)
    q, qd = states.chunk(2, dim=-1)
    energy = kinetic_energy(model, q, qd) + potential_energy(model, q)
    drift = (energy - energy[:, :1]).abs().max() / energy.abs().max().clamp_min(1.0)
    assert float(drift) < 1e-7, f'relative energy drift {float(drift):.2e} over 1 s'


def test_potential_energy_gradient_is_gravity_torque():
    model = _model(('robot', 'wam7'))
    q = _states(model, 1, 7)[0][0].requires_grad_()
    (dV,) = torch.autograd.grad(potential_energy(model, q), q)
    _close(dV, rnea(model, q.detach(), torch.zeros_like(q), torch.zeros_like(q)))


@pytest.mark.parametrize('dtype', [torch.float64, torch.float32])
def test_batched_equals_loop(dtype):
    model = _model(('robot', 'panda'), dtype)
    q, qd, qdd = _states(model, 6, 8, dtype)
    batched = (rnea(model, q, qd, qdd), aba(model, q, qd, qdd), crba(model, q))
    for i in range(6):
        single = (rnea(model, q[i], qd[i], qdd[i]), aba(model, q[i], qd[i], qdd[i]),
                  crba(model, q[i]))
        for b, s in zip(batched, single):
            _close(b[i], s, dtype)


@pytest.mark.parametrize('dtype', [torch.float32])
def test_float32_agrees_with_float64(dtype):
    m64 = _model(('robot', 'panda'))
    m32 = m64.to(dtype)
    q, qd, qdd = _states(m64, 16, 9)
    for f64, f32 in ((rnea(m64, q, qd, qdd), rnea(m32, q.to(dtype), qd.to(dtype), qdd.to(dtype))),
                     (aba(m64, q, qd, qdd), aba(m32, q.to(dtype), qd.to(dtype), qdd.to(dtype)))):
        _close(f32.double(), f64, dtype)


def test_particle_batch_broadcasts_against_state_batch():
    model = _model(('robot', 'wam4'))
    g = torch.Generator().manual_seed(10)
    P, B = 3, 5
    scale = 1.0 + 0.2 * torch.rand((P, 1, model.n, 1), generator=g, dtype=torch.float64)
    particles = model.replace(inertial=model.inertial * scale,
                              armature=torch.rand((P, 1, model.n), generator=g,
                                                  dtype=torch.float64))
    q, qd, qdd = _states(model, B, 11)
    tau = rnea(particles, q, qd, qdd)
    qdd_back = aba(particles, q, qd, tau)
    M = crba(particles, q)
    assert tau.shape == (P, B, model.n) and M.shape == (P, B, model.n, model.n)
    _close(qdd_back, qdd.expand(P, B, model.n))
    for p in range(P):
        single = model.replace(inertial=particles.inertial[p, 0],
                               armature=particles.armature[p, 0])
        _close(tau[p], rnea(single, q, qd, qdd))
        _close(M[p], crba(single, q))


def test_semi_implicit_euler_matches_definition():
    model = _model(('robot', 'qube'))
    x = torch.tensor([0.3, 2.5, -0.4, 1.0], dtype=torch.float64)
    u = torch.tensor([0.01, 0.0], dtype=torch.float64)
    dt = 2e-3
    qdd = aba(model, x[:2], x[2:], u)
    qd_next = x[2:] + dt * qdd
    expected = torch.cat((x[:2] + dt * qd_next, qd_next))
    _close(semi_implicit_euler(model, x, u, dt), expected)


@pytest.mark.parametrize('method, order', [('rk4', 4), ('semi_implicit_euler', 1)])
def test_integrator_convergence_order(method, order):
    model = _model(('robot', 'double_pendulum'))
    x0 = torch.tensor([1.0, -0.5, 0.0, 0.0], dtype=torch.float64)
    horizon = 0.2

    def final_state(dt):
        steps = round(horizon / dt)
        return rollout(model, x0, torch.zeros(steps, 2, dtype=torch.float64), dt,
                       method=method)[-1]

    reference = rollout(model, x0, torch.zeros(4000, 2, dtype=torch.float64), horizon / 4000)[-1]
    coarse = float((final_state(0.01) - reference).abs().max())
    fine = float((final_state(0.005) - reference).abs().max())
    observed = np.log2(coarse / fine)
    assert abs(observed - order) < 0.3, f'observed order {observed:.2f}, expected {order}'


def test_rollout_shapes_and_torque_fn():
    model = _model(('robot', 'qube'))
    x0 = torch.zeros(4, 4, dtype=torch.float64)
    x0[:, 1] = torch.linspace(0.1, 0.4, 4, dtype=torch.float64)
    controls = torch.zeros(4, 30, 2, dtype=torch.float64)

    def damped(q, qd, u):
        # Viscous damping of the order of the Qube's own (a few 1e-5 N m s/rad).
        return u - 5e-5 * qd

    free = rollout(model, x0, controls, 2e-3)
    damped_states = rollout(model, x0, controls, 2e-3, method='semi_implicit_euler',
                            torque_fn=damped)
    assert free.shape == damped_states.shape == (4, 31, 4)
    with pytest.raises(ValueError, match='rk4'):
        rollout(model, x0, controls, 2e-3, method='euler')
    assert np.all(np.isfinite(damped_states.numpy()))
    energy = [kinetic_energy(model, *s.chunk(2, -1)) + potential_energy(model, s[..., :2])
              for s in (free[:, -1], damped_states[:, -1])]
    assert bool((energy[1] < energy[0]).all())
