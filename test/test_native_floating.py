"""
The native kernels on floating-base trees equal the torch algorithms, with exact gradients.

Cases: the shipped robots mounted on a free base, seeded random trees on a free base and
single free bodies (the cases and helpers of test_reference_pinocchio_floating.py).  The
torch algorithms (:mod:`diffsim_ros.core.rnea`, ``aba``, ``crba``) are the references to
1e-12 relative in float64; Pinocchio's free-flyer is the independent one, at its 1e-9.
"""

from diffsim_ros import core
from diffsim_ros.core import BackendError, native
from diffsim_ros.core.aba import aba
from diffsim_ros.core.crba import crba
from diffsim_ros.core.rnea import rnea
import pytest
from test_native import _close, _path, default_backend, TOL  # noqa: F401 (fixture)
from test_reference_pinocchio_floating import (
    _load, _states, pin, pin_aba, pin_crba, pin_rnea, Reference)
import torch
from torch.autograd import gradcheck
from urdf_factory import as_tensor, assert_close, reference_cases, shipped_robot_names

#: Shipped robots, random trees (seeds 10-15: the kernels were written against seed 3 and the
#: Panda) and single free bodies (odd seeds: with links fixed to the body).
CASES = reference_cases(range(10, 16)) + [
    pytest.param(('free_body', seed), id=f'free_body{seed}') for seed in (40, 41)]
TORCH = {'rnea': rnea, 'aba': aba}


def _inputs(ref: Reference, label: str, batch: int = 3, dtype=torch.float64) -> tuple:
    """Return (model with random armature, q, v, x) with every leaf requiring grad."""
    g = torch.Generator().manual_seed(len(label) + batch)
    model = ref.model.to(dtype)
    armature = torch.rand(model.nv, generator=g, dtype=dtype)
    model = model.replace(inertial=model.inertial.clone().requires_grad_(),
                          armature=armature.requires_grad_())
    q, v, x = (as_tensor(t).to(dtype).requires_grad_() for t in _states(ref, label, batch))
    return model, q, v, x


def _ran_natively(out: torch.Tensor) -> bool:
    """Say whether a kernel made ``out`` (looking through the reshape of a broadcast call)."""
    fn = out.grad_fn
    while fn is not None and type(fn).__name__.startswith(('View', 'Reshape', 'UnsafeView')):
        fn = fn.next_functions[0][0]
    return fn is not None and type(fn).__name__.startswith(('_Rnea', '_Aba', '_Crba'))


def _leaves(model, *states) -> tuple:
    return (*states, model.inertial, model.armature)


def test_shipped_robots_are_all_cases():
    """Every shipped robot is one of the cases (on a free base)."""
    labels = {c.values[0] for c in CASES}
    assert {('robot', name) for name in shipped_robot_names()} <= labels
    assert len(shipped_robot_names()) == 7


@pytest.mark.parametrize('case', CASES)
@pytest.mark.parametrize('algorithm', ('rnea', 'aba'))
def test_outputs_and_every_gradient_equal_torch(kernels, case, algorithm):
    """Value and gradients w.r.t. q (all nq), v, qdd/tau, inertial, armature: 1e-12."""
    ref = _load(case)
    model, q, v, x = _inputs(ref, algorithm)
    out = getattr(core, algorithm)(model, q, v, x, backend='native')
    assert _path(out) == 'native'
    expected = TORCH[algorithm](model, q, v, x)
    _close(out, expected)
    weight = torch.randn(expected.shape, generator=torch.Generator().manual_seed(1),
                         dtype=torch.float64)
    leaves = _leaves(model, q, v, x)
    got = torch.autograd.grad((out * weight).sum(), leaves)
    want = torch.autograd.grad((expected * weight).sum(), leaves)
    for name, a, b in zip(('q', 'v', 'x', 'inertial', 'armature'), got, want):
        assert a.shape == b.shape, name
        _close(a, b)
    # the quaternion gradient is tangent to the unit sphere, as torch's through q / |q|
    quat = q[..., 3:7].detach()
    assert (got[0][..., 3:7] * quat).sum(-1).abs().max() < 1e-10


@pytest.mark.parametrize('case', CASES)
def test_crba_and_its_parameter_gradients_equal_torch(kernels, case):
    """The (nv, nv) CRBA matrix and its inertial/armature gradients equal torch's."""
    ref = _load(case)
    model, q, _, _ = _inputs(ref, 'crba')
    q = q.detach()
    M = core.crba(model, q, backend='native')
    assert _path(M) == 'native' and M.shape == (3, model.nv, model.nv)
    expected = crba(model, q)
    _close(M, expected)
    weight = torch.randn(M.shape, generator=torch.Generator().manual_seed(2),
                         dtype=torch.float64)
    leaves = (model.inertial, model.armature)
    for a, b in zip(torch.autograd.grad((M * weight).sum(), leaves),
                    torch.autograd.grad((expected * weight).sum(), leaves)):
        _close(a, b)


@pytest.mark.parametrize('case', [('robot', 'panda'), ('free_body', 41), ('seed', 12)])
def test_batched_equals_loop(kernels, case):
    """One batched call equals one call per sample, values and gradients."""
    ref = _load(case)
    model, q, v, x = _inputs(ref, 'loop', batch=4)
    for algorithm in ('rnea', 'aba'):
        call = getattr(core, algorithm)
        batched = call(model, q, v, x, backend='native')
        grads = torch.autograd.grad(batched.sum(), (q, v, x))
        for b in range(4):
            single = call(model, q[b], v[b], x[b], backend='native')
            _close(single, batched[b])
            for a, g in zip(torch.autograd.grad(single.sum(), (q, v, x)), grads):
                _close(a[b], g[b])
    M = core.crba(model, q.detach(), backend='native')
    for b in range(4):
        _close(core.crba(model, q[b].detach(), backend='native'), M[b])


@pytest.mark.parametrize('algorithm', ('rnea', 'aba'))
def test_calls_split_over_threads_equal_one_thread(kernels, algorithm):
    """
    A batch split over 2 threads gives the 1-thread values and gradients.

    (Against torch the 1e-12 cases above hold; over 700 random states, ABA's q gradient has
    entries that cancel to ~1 from terms ~300 through M^-1 (cond ~500), where the two
    algorithms' roundoff differs by ~1e-11: the split is checked against itself here.)
    """
    ref = _load(('robot', 'panda'))
    model, q, v, x = _inputs(ref, 'threads', batch=700)
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            assert native._extension().threads_for(700, model.njoints) == threads
            out = getattr(core, algorithm)(model, q, v, x, backend='native')
            results.append((out, *torch.autograd.grad(out.sum(), _leaves(model, q, v, x))))
    finally:
        torch.set_num_threads(before)
    for split, single in zip(*results):
        _close(split, single)


@pytest.mark.parametrize('algorithm', ('rnea', 'aba', 'crba'))
def test_parameter_particles(kernels, algorithm):
    """Inertial particles (P, 1, njoints, 10) broadcast against a state batch like torch."""
    ref = _load(('robot', 'panda'))
    model, q, v, x = _inputs(ref, 'particles')
    g = torch.Generator().manual_seed(5)
    scale = 1.0 + 0.5 * torch.rand(4, 1, model.njoints, 1, generator=g, dtype=torch.float64)
    inertial = (model.inertial.detach() * scale).requires_grad_()
    particles = model.replace(inertial=inertial)
    if algorithm == 'crba':
        out, expected = core.crba(particles, q.detach(), backend='native'), crba(particles,
                                                                                 q.detach())
        leaves = (inertial,)
    else:
        out = getattr(core, algorithm)(particles, q, v, x, backend='native')
        expected = TORCH[algorithm](particles, q, v, x)
        leaves = (inertial, q, v, x)
    assert _ran_natively(out) and out.shape[:2] == (4, 3)
    _close(out, expected)
    for a, b in zip(torch.autograd.grad(out.sum(), leaves),
                    torch.autograd.grad(expected.sum(), leaves)):
        _close(a, b)


@pytest.mark.parametrize('algorithm', ('rnea', 'aba', 'crba'))
def test_float32_agrees_with_float64_torch(kernels, algorithm):
    """float32 kernels stay within the float32 tolerance of float64 torch."""
    ref = _load(('robot', 'panda'))
    model, q, v, x = _inputs(ref, 'float32')
    with torch.no_grad():
        model32 = model.to(torch.float32)
    q32, v32, x32 = (t.detach().float().requires_grad_() for t in (q, v, x))
    if algorithm == 'crba':
        out, expected = core.crba(model32, q32.detach(), backend='native'), crba(model,
                                                                                 q.detach())
    else:
        out = getattr(core, algorithm)(model32, q32, v32, x32, backend='native')
        expected = TORCH[algorithm](model, q, v, x)
    assert out.dtype == torch.float32   # backend='native' raises rather than take torch
    _close(out.double(), expected, torch.float32)


@pytest.mark.parametrize('case', [('robot', 'panda'), ('robot', 'wam4'), ('seed', 13),
                                  ('free_body', 40), ('free_body', 41)])
def test_against_pinocchio_free_flyer(kernels, case):
    """RNEA, ABA, CRBA and dtau/dv of the kernels equal Pinocchio's free-flyer to 1e-9."""
    ref = _load(case)
    q, v, a = _states(ref, 'native pinocchio')
    q_t, v_t, a_t = as_tensor(q), as_tensor(v), as_tensor(a)
    tau = core.rnea(ref.model, q_t, v_t, a_t, backend='native')
    acc = core.aba(ref.model, q_t, v_t, tau, backend='native')
    M = core.crba(ref.model, q_t, backend='native')
    _, _, dtau_dv, M_d = core.rnea_derivatives(ref.model, q_t, v_t, a_t, backend='native')
    for b in range(len(q)):
        assert_close(tau[b], pin_rnea(ref.pin_model, ref.pmap, q[b], v[b], a[b]), f'rnea {b}')
        assert_close(acc[b], pin_aba(ref.pin_model, ref.pmap, q[b], v[b], tau[b].numpy()),
                     f'aba {b}')
        assert_close(M[b], pin_crba(ref.pin_model, ref.pmap, q[b]), f'crba {b}')
        assert_close(M_d[b], pin_crba(ref.pin_model, ref.pmap, q[b]), f'derivatives M {b}')
        data = ref.pin_model.createData()
        pin.computeRNEADerivatives(ref.pin_model, data, ref.pmap.q(q[b]), ref.pmap.v(v[b]),
                                   ref.pmap.v(a[b]))
        assert_close(dtau_dv[b], ref.pmap.matrix_from_pin(data.dtau_dv), f'dtau/dv {b}')


@pytest.mark.parametrize('case', [('free_body', 41), ('seed', 14)])
def test_gradcheck_through_the_native_path(kernels, case):
    """float64 gradcheck of RNEA and ABA (q incl. the quaternion, v, x, inertial) natively."""
    ref = _load(case)
    model, q, v, x = _inputs(ref, 'gradcheck', batch=2)
    inertial = model.inertial.detach().clone().requires_grad_()

    def run(algorithm):
        def function(q, v, x, inertial):
            out = getattr(core, algorithm)(model.replace(inertial=inertial), q, v, x,
                                           backend='native')
            assert _path(out) == 'native'
            return out
        return function

    inputs = (q.detach().requires_grad_(), v.detach().requires_grad_(),
              x.detach().requires_grad_(), inertial)
    for algorithm in ('rnea', 'aba'):
        assert gradcheck(run(algorithm), inputs, eps=1e-6, atol=1e-6, rtol=1e-5)


def test_derivatives_equal_the_torch_path(kernels):
    """rnea/aba_derivatives natively keep the convention: dtau/dq w.r.t. q's coordinates."""
    ref = _load(('robot', 'panda'))
    q, v, a = (as_tensor(t) for t in _states(ref, 'derivatives'))
    model = ref.model
    native_out = core.rnea_derivatives(model, q, v, a, backend='native', regressor=True)
    torch_out = core.rnea_derivatives(model, q, v, a, backend='torch', regressor=True)
    assert native_out[1].shape == (3, model.nv, model.nq)
    for name, got, want in zip(('tau', 'dq', 'dv', 'M', 'Y'), native_out, torch_out):
        assert got.shape == want.shape, name
        _close(got, want)
    # The torch path of aba_derivatives is another algorithm (M^-1 from a Cholesky factor of
    # the CRBA matrix, times RNEA's Jacobians), so the kernels meet it at test_derivatives'
    # 1e-9 relative to the largest entry, not at the 1e-12 of one algorithm run twice.
    tau = native_out[0]
    native_aba = core.aba_derivatives(model, q, v, tau, backend='native')
    torch_aba = core.aba_derivatives(model, q, v, tau, backend='torch')
    for name, got, want in zip(('qdd', 'dq', 'dv', 'M^-1'), native_aba, torch_aba):
        assert_close(got, want.numpy(), name)


@pytest.mark.usefixtures('default_backend')
def test_auto_takes_the_kernels_on_a_floating_base(kernels):
    """Under 'auto' floating models run natively; CRBA with a q gradient takes torch."""
    ref = _load(('robot', 'panda'))
    model, q, v, x = _inputs(ref, 'auto')
    assert native.kernels_for(model, q, v, x)[1] is None
    assert _path(core.rnea(model, q, v, x)) == 'native'
    assert _path(core.aba(model, q, v, x)) == 'native'
    assert _path(core.crba(model, q.detach())) == 'native'
    M = core.crba(model, q)
    assert _path(M) == 'torch'
    _close(M, crba(model, q))
    with pytest.raises(BackendError, match='q requires grad in CRBA'):
        core.crba(model, q, backend='native')


def test_rollout_kernel_refuses_a_floating_base(kernels):
    """The closed-loop rollout kernel stays fixed-base: None, not a wrong rollout."""
    model = _load(('robot', 'panda')).model
    nv = model.nv
    zeros = torch.zeros(nv, dtype=torch.float64)
    assert native.rollout_kernel(model, torch.eye(nv, dtype=torch.float64), zeros, zeros,
                                 zeros, 0.1) is None
