"""
The fused C++ RNEA/ABA/CRBA kernels equal the torch algorithms, with exact gradients.

``rnea``/``aba``/``crba`` below are the torch implementations (the references); the public
``diffsim_ros.core`` names are the dispatching functions, tested at the end.
"""

import logging
import os
from pathlib import Path
import subprocess
import sys

from diffsim_ros import core, robots
from diffsim_ros.core import BackendError, dispatch, load_urdf, native, native_build, ShapeError
from diffsim_ros.core.aba import aba
from diffsim_ros.core.crba import crba
from diffsim_ros.core.native import aba_native, crba_native, rnea_native
from diffsim_ros.core.rnea import rnea
import pytest
import torch
from torch.autograd import gradcheck
from urdf_factory import case_urdf, reference_cases, robot_to_urdf, seeded_robot

#: Agreement with the torch algorithms, relative to max(1, |reference|).
TOL = {torch.float64: 1e-12, torch.float32: 2e-4}


def _crba_native(model, q, qd, x):
    return crba_native(model, q)


def _crba(model, q, qd, x):
    return crba(model, q)


#: (native, torch) with the signature (model, q, qd, x); CRBA ignores qd and x.
PAIRS = {'rnea': (rnea_native, rnea), 'aba': (aba_native, aba), 'crba': (_crba_native, _crba)}
#: Leaves whose gradient each kernel computes besides inertial and armature.
STATE_GRADIENT = {'rnea': True, 'aba': True, 'crba': False}


@pytest.fixture
def two_threads():
    """Run with 2 torch threads, so that big calls split (the kernels' rule allows it)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _close(actual, expected, dtype=torch.float64):
    scale = expected.abs().clamp(min=1.0)
    error = ((actual - expected).abs() / scale).max().item()
    assert error <= TOL[dtype], f'max relative error {error:.2e} > {TOL[dtype]:.0e}'


def _randn(generator, *shape, dtype=torch.float64):
    return torch.randn(*shape, generator=generator, dtype=dtype)


def _with_armature(model, generator):
    armature = torch.rand(model.n, generator=generator, dtype=model.dtype)
    return model.replace(armature=armature)


def _tree():
    # A branching tree with prismatic joints (as in test_core_gradients).
    for seed in range(100):
        model = load_urdf(xml=robot_to_urdf(seeded_robot(seed)))
        if 3 <= model.n <= 5 and len(set(model.tree.parents)) < model.n and any(
                t == 'prismatic' for t in model.tree.joint_types):
            return model
    raise RuntimeError('no branching random tree with a prismatic joint found')


MODELS = {'tree': _tree(), 'wam4': load_urdf(xml=robots.urdf_string('wam4'))}


@pytest.mark.parametrize('case', reference_cases())
@pytest.mark.parametrize('algorithm', PAIRS)
def test_matches_torch_batched(kernels, case, algorithm):
    g = torch.Generator().manual_seed(7)
    model = _with_armature(load_urdf(xml=case_urdf(case)), g)
    fast, reference = PAIRS[algorithm]
    q, qd, x = (_randn(g, 2, 3, model.n) for _ in range(3))
    with torch.no_grad():
        _close(fast(model, q, qd, x), reference(model, q, qd, x))
        single = (q[0, 0], qd[0, 0], x[0, 0])
        _close(fast(model, *single), reference(model, *single))


@pytest.mark.parametrize('algorithm', PAIRS)
def test_matches_torch_particle_batched(kernels, algorithm):
    # Particles (P, 1, ...) in every parameter the kernel reads, states (B, n).
    g = torch.Generator().manual_seed(1)
    model = MODELS['tree']
    n, particles = model.n, 4
    model = model.replace(
        inertial=model.inertial * (1.0 + 0.2 * torch.rand(particles, 1, n, 10, generator=g,
                                                          dtype=torch.float64)),
        armature=torch.rand(particles, 1, n, generator=g, dtype=torch.float64),
        origin_xyz=model.origin_xyz + 0.05 * _randn(g, particles, 1, n, 3),
        gravity=model.gravity + _randn(g, particles, 1, 3))
    fast, reference = PAIRS[algorithm]
    q, qd, x = (_randn(g, 5, n) for _ in range(3))
    with torch.no_grad():
        out = fast(model, q, qd, x)
        assert out.shape == (particles, 5, n) + ((n,) if algorithm == 'crba' else ())
        _close(out, reference(model, q, qd, x))


@pytest.mark.parametrize('algorithm', PAIRS)
def test_float32_matches_torch(kernels, algorithm):
    g = torch.Generator().manual_seed(2)
    model = load_urdf(xml=robots.urdf_string('panda'), dtype=torch.float32)
    fast, reference = PAIRS[algorithm]
    q, qd, x = (_randn(g, 64, model.n, dtype=torch.float32) for _ in range(3))
    with torch.no_grad():
        out = fast(model, q, qd, x)
        assert out.dtype == torch.float32
        _close(out, reference(model.to(torch.float64), q.double(), qd.double(), x.double()),
               torch.float32)


@pytest.mark.parametrize('model_name', MODELS)
@pytest.mark.parametrize('algorithm', PAIRS)
def test_gradcheck_inertial_armature_and_last_input(kernels, model_name, algorithm):
    g = torch.Generator().manual_seed(3)
    model = _with_armature(MODELS[model_name], g)
    fast, _ = PAIRS[algorithm]
    q, qd, x = (_randn(g, 3, model.n) for _ in range(3))
    leaves = (model.inertial.clone().requires_grad_(), model.armature.clone().requires_grad_(),
              x.requires_grad_(STATE_GRADIENT[algorithm]))

    def fn(inertial, armature, x):
        return fast(model.replace(inertial=inertial, armature=armature), q, qd, x)
    assert gradcheck(fn, leaves, eps=1e-6, atol=1e-6)


@pytest.mark.parametrize('algorithm', PAIRS)
def test_gradcheck_particle_inertial(kernels, algorithm):
    g = torch.Generator().manual_seed(4)
    model = MODELS['tree']
    fast, _ = PAIRS[algorithm]
    inertial = (model.inertial * (1.0 + 0.1 * torch.rand(2, 1, model.n, 10, generator=g,
                                                         dtype=torch.float64)))
    q, qd, x = (_randn(g, 3, model.n) for _ in range(3))
    assert gradcheck(lambda pi: fast(model.replace(inertial=pi), q, qd, x),
                     (inertial.requires_grad_(),), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize('algorithm', PAIRS)
def test_gradients_equal_torch_autograd_across_threads(kernels, two_threads, algorithm):
    # More samples than one chunk per thread: the per-chunk partial sums must add up.
    g = torch.Generator().manual_seed(5)
    model = _with_armature(load_urdf(xml=robots.urdf_string('panda')), g)
    fast, reference = PAIRS[algorithm]
    q, qd, x = (_randn(g, 700, model.n) for _ in range(3))
    weight = None
    grads = []
    for fn in (fast, reference):
        inertial = model.inertial.clone().requires_grad_()
        armature = model.armature.clone().requires_grad_()
        out = fn(model.replace(inertial=inertial, armature=armature), q, qd, x)
        weight = _randn(g, *out.shape) if weight is None else weight
        grads.append(torch.autograd.grad((out * weight).sum(), (inertial, armature)))
    for mine, theirs in zip(*grads):
        _close(mine, theirs)


STATES = ('q', 'qd', 'x')


def _grads_like_torch(algorithm, model, q, qd, x, leaves):
    """Compare outputs and gradients w.r.t. the named model fields and states with torch."""
    fast, reference = PAIRS[algorithm]
    results = []
    for fn in (fast, reference):
        values = {name: value.clone().requires_grad_() for name, value in leaves.items()}
        fields = {name: value for name, value in values.items() if name not in STATES}
        out = fn(model.replace(**fields), values.get('q', q), values.get('qd', qd),
                 values.get('x', x))
        weight = torch.linspace(-1.0, 2.0, out.numel(), dtype=out.dtype).reshape(out.shape)
        results.append((out, torch.autograd.grad((out * weight).sum(), tuple(values.values()))))
    (out, grads), (expected, expected_grads) = results
    assert out.shape == expected.shape
    _close(out, expected)
    for mine, theirs in zip(grads, expected_grads):
        assert mine.shape == theirs.shape
        _close(mine, theirs)


@pytest.mark.parametrize('algorithm', PAIRS)
def test_size_one_parameter_batch_dims_are_shared(kernels, algorithm):
    # (1, n, 10) inertial and (1, 1, n) armature: the kernels read one shared row and sum
    # the gradient over the batch themselves; shapes must come back as given.
    g = torch.Generator().manual_seed(9)
    model = _with_armature(MODELS['tree'], g)
    q, qd, x = (_randn(g, 6, model.n) for _ in range(3))
    leaves = {'inertial': model.inertial.unsqueeze(0), 'armature': model.armature[None, None]}
    if STATE_GRADIENT[algorithm]:
        leaves['x'] = x
    _grads_like_torch(algorithm, model, q, qd, x, leaves)


@pytest.mark.parametrize('algorithm', PAIRS)
def test_per_sample_parameters_and_broadcast_states(kernels, algorithm):
    # One parameter row per sample, q broadcast from (n,), a non-contiguous qd and x.
    g = torch.Generator().manual_seed(10)
    model = _with_armature(MODELS['wam4'], g)
    n, batch = model.n, 5
    inertial = model.inertial * (1.0 + 0.1 * torch.rand(batch, n, 10, generator=g,
                                                        dtype=torch.float64))
    armature = torch.rand(batch, n, generator=g, dtype=torch.float64)
    q = _randn(g, n)
    qd, x = (_randn(g, n, batch).T for _ in range(2))
    leaves = {'inertial': inertial, 'armature': armature}
    if STATE_GRADIENT[algorithm]:
        leaves['x'] = x
    _grads_like_torch(algorithm, model, q, qd, x, leaves)
    if algorithm == 'crba':
        _grads_like_torch(algorithm, model, _randn(g, batch, n), qd, x, leaves)


def test_crba_position_and_kinematic_gradients_fall_back(kernels, caplog):
    g = torch.Generator().manual_seed(11)
    model = MODELS['tree']
    q = _randn(g, 2, model.n).requires_grad_()
    with caplog.at_level(logging.INFO, logger=native.__name__):
        native._logged.clear()
        assert gradcheck(lambda q: crba_native(model, q), (q,), eps=1e-6, atol=1e-6)
        xyz = model.origin_xyz.clone().requires_grad_()
        moved = model.replace(origin_xyz=xyz)
        expected = torch.autograd.grad(crba(moved, q.detach()).sum(), xyz)[0]
        mine = torch.autograd.grad(crba_native(moved, q.detach()).sum(), xyz)[0]
    assert 'q requires grad in CRBA' in caplog.text
    assert 'kinematic parameter' in caplog.text
    _close(mine, expected)


def test_kinematic_gradients_fall_back(kernels, caplog):
    g = torch.Generator().manual_seed(12)
    model = MODELS['tree']
    q, qd, qdd = (_randn(g, 3, model.n) for _ in range(3))
    gravity = model.gravity.clone().requires_grad_()
    with caplog.at_level(logging.INFO, logger=native.__name__):
        native._logged.clear()
        for fast, reference in (PAIRS['rnea'], PAIRS['aba']):
            grads = [torch.autograd.grad(fn(model.replace(gravity=gravity), q, qd, qdd).sum(),
                                         gravity)[0] for fn in (fast, reference)]
            _close(*grads)
    assert 'kinematic parameter' in caplog.text


def test_other_devices_are_not_supported(kernels):
    model = MODELS['wam4']
    q = torch.zeros(model.n, dtype=torch.float64, device='meta')
    assert native._unsupported(model, (q,), (), ()) == 'tensors are not on the CPU'
    assert 'float32/float64' in native._unsupported(model, (torch.zeros(model.n),), (), ())


def test_threads_split_only_big_calls(kernels):
    # The documented rule: a call splits only where each thread gets >= 2048 joint-samples,
    # over at most torch.get_num_threads() threads.
    ext = native._extension()
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert [ext.threads_for(b, 7) for b in (1, 64, 585, 586, 10 ** 5)] == [1, 1, 1, 2, 2]
        torch.set_num_threads(1)
        assert ext.threads_for(10 ** 5, 7) == 1
        torch.set_num_threads(4)
        assert [ext.threads_for(b, 2) for b in (2047, 2048, 4096, 10 ** 5)] == [1, 2, 4, 4]
    finally:
        torch.set_num_threads(before)


def test_kernel_rejects_mismatched_parameter_rows(kernels):
    model = MODELS['wam4']
    ext = native._extension()
    q = torch.zeros(3, model.n, dtype=torch.float64)
    with pytest.raises(RuntimeError, match='inertial'):
        ext.crba_forward(q, model.inertial[:-1], model.armature, model.joint_origins(),
                         *native._structure(model), False)


#: Shipped robots and random trees (branching, prismatic joints) for the state gradients.
STATE_MODELS = {**MODELS, 'panda': load_urdf(xml=robots.urdf_string('panda')),
                'qube': load_urdf(xml=robots.urdf_string('qube')),
                'cartpole': load_urdf(xml=robots.urdf_string('cartpole'))}


def _native_node(out):
    return type(out.grad_fn).__name__ in ('_RneaFunctionBackward', '_AbaFunctionBackward')


@pytest.mark.parametrize('model_name', ['tree', 'wam4', 'cartpole'])
@pytest.mark.parametrize('algorithm', ['rnea', 'aba'])
def test_gradcheck_states_natively(kernels, model_name, algorithm, caplog):
    # q, qd and qdd/tau together with the parameters, through the kernels' own adjoint.
    g = torch.Generator().manual_seed(6)
    model = _with_armature(STATE_MODELS[model_name], g)
    fast, _ = PAIRS[algorithm]
    leaves = tuple(_randn(g, 2, model.n).requires_grad_() for _ in range(3)) + (
        model.inertial.clone().requires_grad_(), model.armature.clone().requires_grad_())

    def fn(q, qd, x, inertial, armature):
        return fast(model.replace(inertial=inertial, armature=armature), q, qd, x)
    with caplog.at_level(logging.INFO, logger=native.__name__):
        native._logged.clear()
        assert _native_node(fn(*leaves))
        assert gradcheck(fn, leaves, eps=1e-6, atol=1e-6)
    assert 'falling back' not in caplog.text


@pytest.mark.parametrize('model_name', STATE_MODELS)
@pytest.mark.parametrize('algorithm', ['rnea', 'aba'])
def test_state_gradients_equal_torch_autograd(kernels, two_threads, model_name, algorithm):
    # 1500 samples: 2 threads (>= 2048 joint-samples each) over several chunks.
    g = torch.Generator().manual_seed(13)
    model = _with_armature(STATE_MODELS[model_name], g)
    q, qd, x = (_randn(g, 1500, model.n) for _ in range(3))
    _grads_like_torch(algorithm, model, q, qd, x, {'q': q, 'qd': qd, 'x': x,
                                                   'inertial': model.inertial})


@pytest.mark.parametrize('algorithm', ['rnea', 'aba'])
def test_state_gradients_with_particles_and_random_trees(kernels, algorithm):
    # Held-out random trees, particle-batched inertials (P, 1, n, 10) against states (B, n).
    g = torch.Generator().manual_seed(14)
    for seed in range(100, 106):
        model = load_urdf(xml=robot_to_urdf(seeded_robot(seed)))
        inertial = model.inertial * (1.0 + 0.1 * torch.rand(3, 1, model.n, 10, generator=g,
                                                            dtype=torch.float64))
        q, qd, x = (_randn(g, 4, model.n) for _ in range(3))
        _grads_like_torch(algorithm, model, q, qd, x, {'q': q, 'qd': qd, 'x': x,
                                                       'inertial': inertial})


def test_disabled_falls_back(monkeypatch, caplog):
    monkeypatch.setattr(native, '_state', {**native._state})
    native.set_enabled(False)
    monkeypatch.setattr(native, '_logged', set())
    model = MODELS['wam4']
    g = torch.Generator().manual_seed(8)
    q, qd, x = (_randn(g, 4, model.n) for _ in range(3))
    with caplog.at_level(logging.INFO, logger=native.__name__):
        for fast, reference in PAIRS.values():
            assert torch.equal(fast(model, q, qd, x), reference(model, q, qd, x))
        fast(model, q, qd, x)
    assert caplog.text.count(native.DISABLED) == 1
    assert native.native_available() == (False, native.DISABLED)


def test_missing_compiler_falls_back(monkeypatch, caplog):
    monkeypatch.setenv('CXX', 'no-such-compiler-diffsim')
    monkeypatch.setattr(native, '_state', {'module': None, 'reason': None, 'tried': False,
                                           'enabled': True})
    monkeypatch.setattr(native, '_logged', set())
    model = MODELS['wam4']
    q = torch.zeros(model.n, dtype=torch.float64)
    with caplog.at_level(logging.WARNING, logger=native.__name__):
        assert torch.equal(rnea_native(model, q, q, q), rnea(model, q, q, q))
    available, reason = native.native_available()
    assert not available and 'no C++ compiler' in reason
    assert 'no C++ compiler' in caplog.text


def test_kernels_are_cached_under_their_source_key(kernels):
    # The build lies in the cache directory named by the source text and flags (so two
    # checkouts share it), next to the marker of a finished build.
    key = native_build.cache_key([native.SOURCE], native.CFLAGS, native.LDFLAGS)
    directory = native_build.default_root() / f'{native.EXTENSION_NAME}_{key}'
    assert Path(native._extension().__file__).parent == directory
    assert (directory / native_build.MARKER).is_file()
    assert native_build.key_inputs([native.SOURCE], native.CFLAGS, native.LDFLAGS)['host'] \
        == native_build.host_tag()


def test_shape_errors_name_the_argument(kernels):
    model = MODELS['wam4']
    q = torch.zeros(model.n + 1, dtype=torch.float64)
    with pytest.raises(ShapeError, match='qdd'):
        rnea_native(model, q[:-1], q[:-1], q)


# --- the public functions choose the path (diffsim_ros.core.dispatch) ---------------------

PUBLIC = {'rnea': lambda m, q, qd, x, **kw: core.rnea(m, q, qd, x, **kw),
          'aba': lambda m, q, qd, x, **kw: core.aba(m, q, qd, x, **kw),
          'crba': lambda m, q, qd, x, **kw: core.crba(m, q, **kw)}


@pytest.fixture
def default_backend(monkeypatch):
    """Start from no process-wide choice and no environment variable; restore afterwards."""
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)
    monkeypatch.setattr(dispatch, '_default', {'backend': None, 'env': None})


def _path(out):
    """Return which implementation produced ``out`` (it must require grad)."""
    name = type(out.grad_fn).__name__
    return 'native' if name.startswith(('_Rnea', '_Aba', '_Crba')) else 'torch'


def _inputs(model, generator, batch=3):
    leaves = [_randn(generator, batch, model.n).requires_grad_() for _ in range(3)]
    return model.replace(inertial=model.inertial.clone().requires_grad_()), leaves


@pytest.mark.parametrize('algorithm', PUBLIC)
def test_public_functions_take_the_kernels_by_default(kernels, default_backend, algorithm):
    # The README's first example, with gradients w.r.t. the states and the inertials.
    g = torch.Generator().manual_seed(20)
    model, (q, qd, x) = _inputs(load_urdf(xml=robots.urdf_string('panda')), g)
    q_crba = q.detach()  # CRBA's kernel has no q adjoint: asked for, it takes torch
    out = PUBLIC[algorithm](model, q_crba if algorithm == 'crba' else q, qd, x)
    assert dispatch.get_backend() == 'auto'
    assert _path(out) == 'native'
    _close(out, PAIRS[algorithm][1](model, q, qd, x))
    # float32 also runs natively
    model32 = load_urdf(xml=robots.urdf_string('panda'), dtype=torch.float32)
    q32 = torch.zeros(model32.n)
    with torch.no_grad():
        assert PUBLIC[algorithm](model32, q32, q32, q32, backend='native').dtype == torch.float32
    assert _path(core.crba(model, q)) == 'torch'


def test_parameters_changed_in_place_are_seen(kernels, default_backend):
    # The kernels keep a model's prepared parameters; an in-place change must reach them.
    g = torch.Generator().manual_seed(24)
    model = load_urdf(xml=robots.urdf_string('wam4'))
    q, qd, x = (_randn(g, model.n) for _ in range(3))
    with torch.no_grad():
        for algorithm, call in PUBLIC.items():
            call(model, q, qd, x)
            model.origin_xyz.add_(0.01)
            model.inertial.mul_(1.1)
            model.gravity.mul_(0.5)
            _close(call(model, q, qd, x), PAIRS[algorithm][1](model, q, qd, x))


def test_auto_takes_torch_inside_torch_compile(kernels, default_backend, monkeypatch):
    # Traced code (the controllers' compiled steps) must get the torch code, which compiles
    # into the graph, not an opaque kernel call; a forced backend is left as asked.
    model = MODELS['wam4']
    q = torch.zeros(2, model.n, dtype=torch.float64).requires_grad_()
    monkeypatch.setattr(torch.compiler, 'is_compiling', lambda: True)
    assert _path(core.aba(model, q, q, q)) == 'torch'
    assert _path(core.aba(model, q, q, q, backend='native')) == 'native'


def test_integrators_use_the_dispatching_aba(kernels, default_backend):
    g = torch.Generator().manual_seed(21)
    model = load_urdf(xml=robots.urdf_string('wam4'))
    q, qd, u = (_randn(g, 2, model.n).requires_grad_() for _ in range(3))
    assert _path(core.forward_dynamics(model, q, qd, u)) == 'native'


@pytest.mark.parametrize('algorithm', PUBLIC)
def test_auto_takes_torch_where_the_kernels_do_not_apply(kernels, default_backend, algorithm):
    g = torch.Generator().manual_seed(22)
    model = MODELS['tree']
    q, qd, x = (_randn(g, 2, model.n) for _ in range(3))
    gravity = model.gravity.clone().requires_grad_()
    origin = model.origin_xyz.clone().requires_grad_()
    for moved in (model.replace(gravity=gravity), model.replace(origin_xyz=origin)):
        if algorithm == 'crba' and moved.gravity.requires_grad:
            continue  # CRBA does not read gravity
        out = PUBLIC[algorithm](moved, q, qd, x)
        assert _path(out) == 'torch'
        _close(out, PAIRS[algorithm][1](moved, q, qd, x))
        with pytest.raises(BackendError, match='kinematic parameter'):
            PUBLIC[algorithm](moved, q, qd, x, backend='native')
    # other dtypes: the kernels take float32/float64 only
    half = model.to(torch.bfloat16)
    with pytest.raises(BackendError, match='float32/float64'):
        PUBLIC[algorithm](half, *(t.to(torch.bfloat16) for t in (q, qd, x)), backend='native')


def test_floating_base_models_take_the_kernels(kernels, default_backend):
    # A free-flyer model runs the kernels under 'auto' (test_native_floating checks them in
    # depth); CRBA with a gradient w.r.t. q still takes torch.
    g = torch.Generator().manual_seed(25)
    model = load_urdf(xml=robots.urdf_string('panda'), floating_base=True)
    assert model.floating_base and model.nq == model.nv + 1
    q = _randn(g, 2, model.nq)
    q[..., 3:7] = q[..., 3:7] / q[..., 3:7].norm(dim=-1, keepdim=True)
    v, a = (_randn(g, 2, model.nv).requires_grad_() for _ in range(2))
    tau = core.rnea(model, q, v, a)
    assert _path(tau) == 'native'
    _close(tau, rnea(model, q, v, a))
    assert _path(core.aba(model, q, v, tau.detach())) == 'native'
    assert native.kernels_for(model, q, v, a)[1] is None
    with pytest.raises(BackendError, match='q requires grad'):
        core.crba(model, q.requires_grad_(), backend='native')


@pytest.mark.parametrize('algorithm', PUBLIC)
def test_forced_backends_and_their_precedence(kernels, default_backend, monkeypatch,
                                              algorithm):
    g = torch.Generator().manual_seed(23)
    model, (q, qd, x) = _inputs(MODELS['wam4'], g)
    call = PUBLIC[algorithm]
    if algorithm == 'crba':
        q = q.detach()  # CRBA's kernel has no q adjoint
    assert _path(call(model, q, qd, x, backend='torch')) == 'torch'
    assert _path(call(model, q, qd, x, backend='native')) == 'native'
    # the environment variable (read at import and by set_backend(None)), then
    # set_backend, then the argument, each overriding
    monkeypatch.setenv(dispatch.ENV_VAR, 'torch')
    core.set_backend(None)
    assert _path(call(model, q, qd, x)) == 'torch'
    core.set_backend('native')
    assert dispatch.get_backend() == 'native'
    assert _path(call(model, q, qd, x)) == 'native'
    assert _path(call(model, q, qd, x, backend='auto')) == 'native'
    assert _path(call(model, q, qd, x, backend='torch')) == 'torch'
    core.set_backend(None)
    assert _path(call(model, q, qd, x)) == 'torch'
    monkeypatch.setenv(dispatch.ENV_VAR, 'native')
    core.set_backend(None)
    with pytest.raises(BackendError, match='requires grad'):
        call(model.replace(origin_rpy=model.origin_rpy.clone().requires_grad_()), q, qd, x)


def test_environment_variable_sets_a_fresh_process(kernels):
    # As a user would: DIFFSIM_BACKEND=torch python my_script.py
    script = ('import torch; from diffsim_ros import core, robots\n'
              'm = core.load_urdf(xml=robots.urdf_string("wam4"))\n'
              'q = torch.zeros(m.n, dtype=torch.float64, requires_grad=True)\n'
              'out = core.rnea(m, q, q, q)\n'
              'print(core.get_backend(), type(out.grad_fn).__name__)\n')
    for value, expected in (('torch', 'torch'), ('native', 'native'), ('', 'auto')):
        env = {**os.environ, dispatch.ENV_VAR: value}
        done = subprocess.run([sys.executable, '-c', script], env=env, capture_output=True,
                              text=True, check=True)
        backend, node = done.stdout.split()
        assert backend == expected
        assert node.startswith('_Rnea') == (expected != 'torch'), done.stdout


def test_unknown_backend_names_list_the_valid_ones(default_backend, monkeypatch):
    model = MODELS['wam4']
    q = torch.zeros(model.n, dtype=torch.float64)
    with pytest.raises(ValueError, match="'fast'.*auto, native, torch"):
        core.rnea(model, q, q, q, backend='fast')
    with pytest.raises(ValueError, match='set_backend'):
        core.set_backend('cuda')
    monkeypatch.setenv(dispatch.ENV_VAR, 'Native')
    core.set_backend(None)
    with pytest.raises(ValueError, match=r'\$DIFFSIM_BACKEND'):
        core.aba(model, q, q, q)


def test_native_without_kernels_raises(default_backend, monkeypatch):
    monkeypatch.setattr(native, '_state', {**native._state})
    monkeypatch.setattr(native, '_logged', set())
    native.set_enabled(False)
    model = MODELS['wam4']
    q = torch.zeros(model.n, dtype=torch.float64)
    assert torch.equal(core.rnea(model, q, q, q), rnea(model, q, q, q))
    with pytest.raises(BackendError, match='set_enabled'):
        core.crba(model, q, backend='native')
