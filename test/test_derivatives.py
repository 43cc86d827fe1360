"""
``rnea_derivatives`` and ``aba_derivatives`` against Pinocchio and against each other.

Cases: the shipped robots and seeded random trees of ``urdf_factory`` (continuous joints
mapped to Pinocchio's ``(cos, sin)`` coordinates, whose tangent is our angle), with a
non-zero armature and an arbitrary gravity.  float64, 1e-9 relative (``assert_close``).
The native kernels and the torch path are compared with each other, batched with a loop,
and with parameter particles.
"""

import functools

import numpy as np
import pytest
import torch
from urdf_factory import (
    as_tensor, assert_close, case_urdf, joint_types_of, pinocchio_model, PinocchioMap,
    random_state, reference_cases, require_core, robot_to_urdf, seeded_robot, state_rng)

pin = pytest.importorskip('pinocchio')

N_STATES = 3


def _symmetric(upper: np.ndarray) -> np.ndarray:
    """Pinocchio fills the upper triangle of M and M^-1 only."""
    upper = np.triu(np.asarray(upper))
    return upper + np.triu(upper, 1).T


@functools.lru_cache(maxsize=None)
def _load(case: tuple):
    core = require_core()
    xml = case_urdf(case)
    label = f'{case[0]}:{case[1]}'
    model = core.load_urdf(xml=xml, dtype=torch.float64)
    rng = state_rng(label + 'derivatives')
    armature = rng.uniform(0.01, 0.5, model.n)
    gravity = rng.uniform(-10.0, 10.0, 3)
    model = model.replace(armature=as_tensor(armature), gravity=as_tensor(gravity))
    pin_model, _ = pinocchio_model(xml)
    pmap = PinocchioMap(pin_model, model.joint_names)
    pin_model.armature[:] = pmap.v(armature)
    pin_model.gravity.linear = gravity
    return label, model, pin_model, pmap, tuple(joint_types_of(xml, model.joint_names))


@pytest.fixture(params=reference_cases())
def ref(request):
    """Return ``(label, model, pin_model, pmap, joint_types)`` of the case."""
    return _load(request.param)


def _states(ref, name):
    label, _, _, _, joint_types = ref
    return random_state(state_rng(label + name), joint_types, batch=(N_STATES,))


@pytest.mark.parametrize('backend', ['native', 'torch'])
def test_rnea_derivatives_match_pinocchio(ref, backend):
    """tau, dtau/dq, dtau/dqd and M equal computeRNEADerivatives for every sample."""
    core = require_core()
    _, model, pin_model, pmap, _ = ref
    q, qd, qdd = _states(ref, 'rnea')
    out = core.rnea_derivatives(model, as_tensor(q), as_tensor(qd), as_tensor(qdd),
                                backend=backend)
    data = pin_model.createData()
    for b in range(N_STATES):
        args = (pmap.q(q[b]), pmap.v(qd[b]), pmap.v(qdd[b]))
        dq, dv, da = pin.computeRNEADerivatives(pin_model, data, *args)
        tau = pin.rnea(pin_model, pin_model.createData(), *args)
        assert_close(out[0][b], pmap.v_from_pin(tau), f'tau {b}')
        assert_close(out[1][b], pmap.matrix_from_pin(dq), f'dtau_dq {b}')
        assert_close(out[2][b], pmap.matrix_from_pin(dv), f'dtau_dqd {b}')
        assert_close(out[3][b], pmap.matrix_from_pin(_symmetric(da)), f'M {b}')


@pytest.mark.parametrize('backend', ['native', 'torch'])
def test_aba_derivatives_match_pinocchio(ref, backend):
    """qdd, dqdd/dq, dqdd/dqd and M^-1 equal computeABADerivatives for every sample."""
    core = require_core()
    _, model, pin_model, pmap, _ = ref
    q, qd, tau = _states(ref, 'aba')
    out = core.aba_derivatives(model, as_tensor(q), as_tensor(qd), as_tensor(tau),
                               backend=backend)
    data = pin_model.createData()
    for b in range(N_STATES):
        args = (pmap.q(q[b]), pmap.v(qd[b]), pmap.v(tau[b]))
        dq, dv, m_inv = pin.computeABADerivatives(pin_model, data, *args)
        qdd = pin.aba(pin_model, pin_model.createData(), *args)
        assert_close(out[0][b], pmap.v_from_pin(qdd), f'qdd {b}')
        assert_close(out[1][b], pmap.matrix_from_pin(dq), f'dqdd_dq {b}')
        assert_close(out[2][b], pmap.matrix_from_pin(dv), f'dqdd_dqd {b}')
        assert_close(out[3][b], pmap.matrix_from_pin(_symmetric(m_inv)), f'M^-1 {b}')


def _random_model(seed: int):
    core = require_core()
    spec = seeded_robot(seed)
    xml = robot_to_urdf(spec)
    model = core.load_urdf(xml=xml, dtype=torch.float64)
    return model, tuple(joint_types_of(xml, model.joint_names))


@pytest.mark.parametrize('seed', [3, 11])
def test_regressor_and_paths_agree(seed):
    """Native == torch path, the regressor == joint_torque_regressor, Y pi + arm qdd = tau."""
    core = require_core()
    model, joint_types = _random_model(seed)
    q, qd, qdd = (as_tensor(x) for x in random_state(
        state_rng(f'paths{seed}'), joint_types, batch=(2, 3)))
    native = core.rnea_derivatives(model, q, qd, qdd, backend='native', regressor=True)
    reference = core.rnea_derivatives(model, q, qd, qdd, backend='torch', regressor=True)
    assert native[4].shape == (2, 3, model.n, 10 * model.n)
    for got, expected, name in zip(native, reference, ('tau', 'dq', 'dqd', 'M', 'Y')):
        assert_close(got, expected.numpy(), name)
    assert_close(native[4], core.joint_torque_regressor(model, q, qd, qdd).numpy(), 'Y')
    rebuilt = (native[4] @ model.inertial.reshape(-1, 1)).squeeze(-1) + model.armature * qdd
    assert_close(rebuilt, native[0].numpy(), 'Y pi + armature qdd')
    native = core.aba_derivatives(model, q, qd, qdd, backend='native')
    reference = core.aba_derivatives(model, q, qd, qdd, backend='torch')
    for got, expected, name in zip(native, reference, ('qdd', 'dq', 'dqd', 'Minv')):
        assert_close(got, expected.numpy(), name)


@pytest.mark.parametrize('backend', ['native', 'torch'])
def test_batched_equals_loop_and_particles(backend):
    """A batch equals its samples one by one; parameter particles broadcast like rnea's."""
    core = require_core()
    model, joint_types = _random_model(7)
    q, qd, qdd = (as_tensor(x) for x in random_state(
        state_rng('loop'), joint_types, batch=(4,)))
    for function in (core.rnea_derivatives, core.aba_derivatives):
        batched = function(model, q, qd, qdd, backend=backend)
        for b in range(4):
            single = function(model, q[b], qd[b], qdd[b], backend=backend)
            assert single[0].shape == (model.n,) and single[1].shape == (model.n, model.n)
            for got, expected in zip(single, batched):
                assert_close(got, expected[b].numpy(), f'{function.__name__} sample {b}')
    gen = torch.Generator().manual_seed(5)
    scale = 1.0 + 0.3 * torch.rand((2, 1, model.n, 1), generator=gen, dtype=torch.float64)
    particles = model.replace(inertial=model.inertial * scale)   # (2, 1, n, 10)
    for function in (core.rnea_derivatives, core.aba_derivatives):
        batched = function(particles, q, qd, qdd, backend=backend)
        assert batched[1].shape == (2, 4, model.n, model.n)
        for p in range(2):
            one = model.replace(inertial=particles.inertial[p, 0])
            for got, expected in zip(function(one, q, qd, qdd, backend=backend), batched):
                assert_close(got, expected[p].numpy(), f'{function.__name__} particle {p}')


def test_autograd_agrees_and_no_graph():
    """The Jacobians equal autograd's through the public rnea, and carry no graph."""
    core = require_core()
    model, joint_types = _random_model(2)
    q, qd, qdd = (as_tensor(x).requires_grad_() for x in random_state(
        state_rng('autograd'), joint_types))
    tau, dq, dqd, M = core.rnea_derivatives(model, q, qd, qdd)
    assert not any(t.requires_grad for t in (tau, dq, dqd, M))
    jac = torch.autograd.functional.jacobian(
        lambda *x: core.rnea(model, *x, backend='torch'), (q, qd, qdd))
    for got, expected, name in zip((dq, dqd, M), jac, ('dq', 'dqd', 'M')):
        assert_close(got, expected.detach().numpy(), name)


def test_forced_native_refuses_what_it_cannot_run():
    """backend='native' on float16 names the reason instead of using torch."""
    core = require_core()
    model, joint_types = _random_model(2)
    q, qd, qdd = (torch.as_tensor(x, dtype=torch.float32) for x in random_state(
        state_rng('refuse'), joint_types))
    with pytest.raises(core.BackendError, match='dtype'):
        core.rnea_derivatives(model, q, qd, qdd, backend='native')


@pytest.mark.parametrize('backend', ('native', 'torch'))
def test_floating_base_in_coordinates(backend):
    """A floating base, on either path: dtau/dq w.r.t. q's coordinates, M = crba."""
    core = require_core()
    from diffsim_ros import robots
    if backend == 'native' and not core.native_available()[0]:
        pytest.skip(f'native kernels unavailable: {core.native_available()[1]}')
    model = core.load_urdf(robots.object_urdf_path('cube_toss'), floating_base=True)
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, model.nq, generator=gen, dtype=torch.float64)
    q[:, 3:7] /= q[:, 3:7].norm(dim=-1, keepdim=True)
    qd, qdd = (torch.randn(2, model.nv, generator=gen, dtype=torch.float64) for _ in range(2))
    tau, dq, dqd, M = core.rnea_derivatives(model, q, qd, qdd, backend=backend)
    assert dq.shape == (2, model.nv, model.nq)
    assert_close(M, core.crba(model, q).numpy(), 'M')
    for b in range(2):
        jac = torch.autograd.functional.jacobian(
            lambda *x: core.rnea(model, *x, backend='torch'), (q[b], qd[b], qdd[b]))
        for got, expected, name in zip((dq[b], dqd[b], M[b]), jac, ('dq', 'dqd', 'M')):
            assert_close(got, expected.numpy(), f'{name} {b}')
    qdd_out, dqdd_dq, _, M_inv = core.aba_derivatives(model, q, qd, tau, backend=backend)
    assert_close(qdd_out, qdd.numpy(), 'aba(rnea) = qdd')
    assert_close(M_inv @ M, np.broadcast_to(np.eye(model.nv), M.shape), 'M^-1 M')
    assert_close(dqdd_dq, (-M_inv @ dq).numpy(), 'dqdd/dq = -M^-1 dtau/dq')


def test_parameters_changed_in_place_are_seen():
    """The kernels bind a model once; an in-place change of its parameters must reach them."""
    core = require_core()
    model, joint_types = _random_model(4)
    q, qd, x = (as_tensor(v) for v in random_state(state_rng('inplace'), joint_types))
    for function in (core.rnea_derivatives, core.aba_derivatives):
        function(model, q, qd, x)
        with torch.no_grad():
            model.origin_xyz.add_(0.01)
            model.inertial.mul_(1.1)
            model.gravity.mul_(0.5)
        for got, expected in zip(function(model, q, qd, x),
                                 function(model, q, qd, x, backend='torch')):
            assert_close(got, expected.numpy(), f'{function.__name__} after the change')
