"""The C++ contact solver (``core/native/contact.cpp``) against the torch solver it replaces."""

from dataclasses import replace

from contact_bodies import cube, sphere, two_link
from diffsim_ros.core import (BackendError, contact_kinematics, contact_parameters_from_theta,
                              contact_parameters_to_theta, contact_step, dispatch, native,
                              native_contact, set_backend)
from diffsim_ros.core.contact_solver import solve_contact_impulses
import pytest
from test_contact import _random_near_ground as _near_ground
import torch
from torch.autograd import gradcheck

DT = 0.01
# float64 agreement of the two paths: the same iterations in another summation order.
TOL = 1e-10


@pytest.fixture(scope='module', autouse=True)
def kernels():
    """Build (or load the cached) contact kernels once; skip when impossible."""
    ext, reason = native_contact.extension()
    if ext is None:
        pytest.skip(f'native contact kernels unavailable: {reason}')
    return ext


def _flat(model, contact, speeds, side):
    # Cubes lying flat on the ground, sliding along x at the given speeds.
    q = torch.zeros(len(speeds), 7, dtype=torch.float64)
    q[:, 2], q[:, 6] = side / 2, 1.0
    v = torch.zeros(len(speeds), 6, dtype=torch.float64)
    v[:, 0] = torch.tensor(speeds, dtype=torch.float64)
    return q, v


def _step_and_gradients(backend, model, template, q, v, names, inertial=True):
    # Next state, impulses, and the gradients of a fixed random weighting of them w.r.t. the
    # state, the named contact parameters (unconstrained values) and the inertials.
    theta = contact_parameters_to_theta(template)
    leaves = [q.clone().requires_grad_(True), v.clone().requires_grad_(True)]
    leaves += [theta[n].clone().requires_grad_(True) for n in names]
    if inertial:
        leaves.append(model.inertial.clone().requires_grad_(True))
        model = model.replace(inertial=leaves[-1])
    contact = contact_parameters_from_theta(template, dict(zip(names, leaves[2:])))
    tau = torch.zeros_like(v)
    out = contact_step(model, leaves[0], leaves[1], tau, DT, contact, backend=backend)
    g = torch.Generator().manual_seed(0)
    loss = sum((torch.randn(x.shape, dtype=x.dtype, generator=g) * x).sum()
               for x in (out.q, out.v, out.impulses))
    grads = torch.autograd.grad(loss, leaves)
    return (out.q, out.v, out.impulses) + grads


def _assert_same(torch_result, native_result):
    labels = ['q', 'v', 'impulses', 'd/dq', 'd/dv']
    labels += [f'gradient {i}' for i in range(len(torch_result) - 5)]
    for label, a, b in zip(labels, torch_result, native_result):
        scale = 1.0 + float(a.detach().abs().max())
        error = float((a - b).detach().abs().max())
        assert error <= TOL * scale, f'{label}: native differs from torch by {error:.3g} ' \
                                     f'(scale {scale:.3g})'


CASES = {
    # a cube corner- or edge-down, hitting the ground, one sample without batch dims
    'cube_single': lambda: (
        cube(mu=0.4), 1, 3, ('friction', 'vertices', 'ground_height', 'ground_tilt')),
    # spheres landing with spin: rolling and sliding contacts
    'spheres': lambda: (
        sphere(mu=0.3), 6, 5, ('friction', 'sphere_radii', 'sphere_centers', 'ground_height')),
    'cubes': lambda: (
        cube(mu=0.2, restitution=0.3), 8, 9,
        ('friction', 'restitution', 'vertices', 'ground_height')),
}


@pytest.mark.parametrize('case', sorted(CASES))
def test_native_step_and_gradients_equal_torch(case):
    (model, contact), batch, seed, names = CASES[case]()
    q, v = _near_ground(model, contact, batch, seed)
    if case == 'cube_single':
        q, v = q[0], v[0]
    _assert_same(_step_and_gradients('torch', model, contact, q, v, names),
                 _step_and_gradients('native', model, contact, q, v, names))


def test_batch_with_and_without_contact_and_sticking_and_sliding_cubes():
    side = 0.1048
    model, contact = cube(side=side, mu=0.3)
    # flat cubes at rest (sticking), slow (sticking within a step), fast (sliding), and one
    # lifted 1 m: no contact, zero impulses
    q, v = _flat(model, contact, [0.0, 0.002, 0.7, 1.5], side)
    q[3, 2] += 1.0
    names = ('friction', 'vertices', 'ground_height')
    reference = _step_and_gradients('torch', model, contact, q, v, names)
    result = _step_and_gradients('native', model, contact, q, v, names)
    _assert_same(reference[:3], result[:3])
    # A cube lying flat has four contacts for three constraint directions: the impulses'
    # split between corners is fixed only by the 1e-8 relative regularization, so their
    # gradients carry condition numbers near 1e8 and float64 determines them to ~1e-7
    # relative.  The bar: native is no further from torch than torch is from itself when
    # the positions move by 1e-16 m, a rounding-level change.
    g = torch.Generator().manual_seed(1)
    nudged = q.clone()
    nudged[:, :3] += 1e-16 * torch.randn(4, 3, dtype=torch.float64, generator=g)
    rounding = _step_and_gradients('torch', model, contact, nudged, v, names)
    for a, b, c in zip(reference[3:], result[3:], rounding[3:]):
        spread = float((a - c).abs().max())
        assert float((a - b).abs().max()) <= max(3 * spread, TOL * (1 + float(a.abs().max())))
    impulses = result[2].detach()
    assert float(impulses[3].abs().max()) == 0.0
    tangential = impulses[:3, :, 1:].sum(-2).norm(dim=-1)
    normal = impulses[:3, :, 0].sum(-1)
    # at rest: no friction; sliding fast: on the cone, against the motion
    assert float(tangential[0]) < 1e-9
    assert float(tangential[3 - 1]) == pytest.approx(0.3 * float(normal[2]), rel=1e-6)
    assert float(result[1][2, 0].detach()) < 0.7


def test_mixed_shapes_on_a_two_link_tree():
    # The solver kernel takes any model: vertices, a capsule and a sphere on two links of a
    # jointed floating tree, a body-body pair, a tilted and raised ground.
    from test_contact import _mixed_contact, _two_link_state
    model = two_link()
    contact = _mixed_contact()
    q, v = _two_link_state(5)
    q = q.clone()
    q[2] -= float(contact_kinematics(model, q, contact).phi.amin()) + 1e-3  # in contact
    names = ('friction', 'vertices', 'capsule_radii', 'sphere_radii', 'ground_tilt')
    _assert_same(_step_and_gradients('torch', model, contact, q, v, names),
                 _step_and_gradients('native', model, contact, q, v, names))


def test_each_problem_is_solved_independently_of_its_batch():
    model, contact = cube(mu=0.25)
    q, v = _near_ground(model, contact, 5, seed=13)
    tau = torch.zeros_like(v)
    for backend in ('torch', 'native'):
        batched = contact_step(model, q, v, tau, DT, contact, backend=backend)
        for i in range(5):
            alone = contact_step(model, q[i], v[i], tau[i], DT, contact, backend=backend)
            assert torch.allclose(batched.impulses[i], alone.impulses, rtol=0, atol=1e-12)


def test_gradcheck_through_the_native_solver():
    model, template = cube(mu=0.4)
    q, v = _near_ground(model, template, 2, seed=21)
    q, v = q.clone().requires_grad_(True), v.clone().requires_grad_(True)
    theta = contact_parameters_to_theta(template)
    friction = theta['friction'].clone().requires_grad_(True)
    height = theta['ground_height'].clone().requires_grad_(True)
    # inertials as relative changes: the moments (7e-4 kg m^2) would not survive gradcheck's
    # absolute 1e-6 perturbation at second order
    scale = torch.zeros_like(model.inertial).requires_grad_(True)

    def step(q, v, friction, height, scale):
        contact = contact_parameters_from_theta(template, {'friction': friction,
                                                           'ground_height': height})
        inertial = model.inertial * (1 + scale)
        out = contact_step(model.replace(inertial=inertial), q, v, torch.zeros_like(v), DT,
                           contact, tol=1e-13, max_iter=20000, backend='native')
        return out.v, out.impulses
    assert gradcheck(step, (q, v, friction, height, scale), atol=1e-6, rtol=1e-5)


def test_solver_gradcheck_on_random_cone_problems():
    g = torch.Generator().manual_seed(3)
    nc = 4
    J = torch.randn(2, 3 * nc, 5, dtype=torch.float64, generator=g)
    A = (J @ J.mT + 0.5 * torch.eye(3 * nc, dtype=torch.float64)).requires_grad_(True)
    b = torch.randn(2, 3 * nc, dtype=torch.float64, generator=g).requires_grad_(True)
    mu = (0.2 + torch.rand(2, nc, dtype=torch.float64, generator=g)).requires_grad_(True)

    def solve(A, b, mu):
        return solve_contact_impulses(0.5 * (A + A.mT), b, mu, tol=1e-14, backend='native')
    assert gradcheck(solve, (A, b, mu), atol=1e-7, rtol=1e-6)
    reference = solve_contact_impulses(A, b, mu, tol=1e-14, backend='torch')
    assert torch.allclose(solve_contact_impulses(A, b, mu, tol=1e-14, backend='native'),
                          reference, rtol=0, atol=TOL)


def test_float32_step_agrees_with_float64():
    model, contact = cube(mu=0.3)
    q, v = _near_ground(model, contact, 4, seed=2)
    reference = contact_step(model, q, v, torch.zeros_like(v), DT, contact, backend='native')
    model32 = model.to(torch.float32)
    contact32 = replace(contact, **{n: getattr(contact, n).float() for n in (
        'friction', 'restitution', 'stiffness', 'damping', 'slip_velocity', 'ground_height',
        'ground_tilt')}, vertices=tuple(x.float() for x in contact.vertices))
    out = contact_step(model32, q.float(), v.float(), torch.zeros(4, 6), DT, contact32,
                       tol=1e-6, backend='native')
    assert out.v.dtype == torch.float32
    # float32 rounding of a 1 cm step of a 1 m/s body: a few 1e-6 m/s
    assert torch.allclose(out.v.double(), reference.v, rtol=0, atol=1e-4)


def test_threads_split_large_calls_only_and_give_the_same_numbers(kernels):
    assert kernels.threads_for(1, 24) == 1
    assert kernels.threads_for(16, 24) == 1
    model, contact = cube(mu=0.2)
    q, v = _near_ground(model, contact, 256, seed=4)
    tau = torch.zeros_like(v)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = contact_step(model, q, v, tau, DT, contact, backend='native')
        torch.set_num_threads(2)
        assert kernels.threads_for(256, 24) == 2
        two = contact_step(model, q, v, tau, DT, contact, backend='native')
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one.impulses, two.impulses)


def test_backend_choice_follows_dispatch(monkeypatch):
    model, contact = cube(mu=0.3)
    q, v = _near_ground(model, contact, 2, seed=1)
    tau = torch.zeros_like(v)
    calls = []
    for name in ('solve', 'free_body_step'):  # the solver kernel, the step kernel
        monkeypatch.setattr(native_contact, name, lambda *a, real=getattr(
            native_contact, name): calls.append(1) or real(*a))
    contact_step(model, q, v, tau, DT, contact)  # auto: the kernels
    assert calls == [1]
    try:
        set_backend('torch')
        contact_step(model, q, v, tau, DT, contact)
        assert calls == [1]
        monkeypatch.setenv(dispatch.ENV_VAR, 'torch')
        set_backend(None)  # read the environment again
        contact_step(model, q, v, tau, DT, contact)
        assert calls == [1]
        contact_step(model, q, v, tau, DT, contact, backend='native')  # the argument wins
        assert calls == [1, 1]
    finally:
        monkeypatch.delenv(dispatch.ENV_VAR)
        set_backend(None)


def test_forced_native_that_cannot_run_raises_and_auto_falls_back(monkeypatch):
    model, contact = cube(mu=0.3)
    q, v = _near_ground(model, contact, 2, seed=1)
    tau = torch.zeros_like(v)
    native.set_enabled(False)
    try:
        # with the kernels off, the rigid-body algorithms inside are torch's too
        reference = contact_step(model, q, v, tau, DT, contact, backend='torch')
        with pytest.raises(BackendError, match='disabled'):
            contact_step(model, q, v, tau, DT, contact, backend='native')
        fallback = contact_step(model, q, v, tau, DT, contact)
    finally:
        native.set_enabled(True)
    assert torch.equal(fallback.impulses, reference.impulses)
    half = torch.zeros(3, 3, dtype=torch.float16)
    assert 'float16' in native_contact.kernels_for(half)[1]
    with pytest.raises(ValueError, match='valid'):
        contact_step(model, q, v, tau, DT, contact, backend='fast')


def _shapes_on_one_body():
    from contact_bodies import free_body
    from diffsim_ros.core import ContactModel
    from diffsim_ros.core.contact import box_vertices
    model = free_body(1.0, (0.01, 0.02, 0.03))
    contact = ContactModel.create(
        friction=0.5, restitution=0.2, ground_height=0.01, ground_tilt=(0.1, -0.05),
        vertex_links=('body',), vertices=(box_vertices((0.1, 0.2, 0.05)),),
        sphere_links=('body',), sphere_centers=[[0.1, 0.0, -0.1]], sphere_radii=[0.03],
        capsule_links=('body',), capsule_ends=[[[0.0, -0.1, -0.05], [0.05, 0.1, -0.1]]],
        capsule_radii=[0.02])
    return model, contact


STEP_CASES = {
    'cubes': lambda: cube(mu=0.3, restitution=0.2, ground_height=0.01,
                          ground_tilt=(0.1, -0.05)),
    'spheres': lambda: sphere(mu=0.3),
    'vertices_sphere_capsule': _shapes_on_one_body,
}


@pytest.mark.parametrize('method', ['complementarity', 'compliant'])
@pytest.mark.parametrize('case', sorted(STEP_CASES))
def test_free_body_step_kernel_equals_torch(case, method, monkeypatch):
    # Without gradients a free body's whole step runs in the kernel: next state, impulses
    # and every field of the contact frame as the torch code computes them.
    model, contact = STEP_CASES[case]()
    q, v = _near_ground(model, contact, 8, seed=17)
    q[0, 2] -= 2e-3  # one body starts in penetration (the compliant force acts)
    q[1, 2] += 1.0  # one far above the ground
    tau = torch.randn(v.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    calls = []
    real = native_contact.free_body_step
    monkeypatch.setattr(native_contact, 'free_body_step',
                        lambda *a: calls.append(1) or real(*a))
    reference = contact_step(model, q, v, tau, DT, contact, method=method, backend='torch')
    result = contact_step(model, q, v, tau, DT, contact, method=method)
    assert calls == [1]
    _assert_same((reference.q, reference.v, reference.impulses) + tuple(reference.frame),
                 (result.q, result.v, result.impulses) + tuple(result.frame))
    assert float(result.impulses[1].abs().max()) == 0.0


def test_free_body_step_kernel_on_flat_cubes_and_particles():
    side = 0.1048
    model, contact = cube(side=side, mu=0.3)
    q, v = _flat(model, contact, [0.0, 0.002, 0.7, 1.5], side)
    # three friction particles against the four states: (3, 1) x (4,) -> (3, 4)
    contact = replace(contact, friction=torch.tensor([[0.1], [0.3], [0.9]],
                                                     dtype=torch.float64))
    tau = torch.zeros_like(v)
    reference = contact_step(model, q, v, tau, DT, contact, backend='torch')
    result = contact_step(model, q, v, tau, DT, contact)
    assert result.v.shape == (3, 4, 6)
    _assert_same((reference.q, reference.v, reference.impulses),
                 (result.q, result.v, result.impulses))


def test_unbatched_and_float32_free_body_steps():
    model, contact = cube(mu=0.3)
    q, v = _near_ground(model, contact, 1, seed=6)
    tau = torch.zeros(6, dtype=torch.float64)
    reference = contact_step(model, q[0], v[0], tau, DT, contact, backend='torch')
    result = contact_step(model, q[0], v[0], tau, DT, contact)
    assert result.q.shape == (7,) and result.impulses.shape == (8, 3)
    _assert_same((reference.q, reference.v, reference.impulses),
                 (result.q, result.v, result.impulses))
    contact32 = replace(contact, **{n: getattr(contact, n).float() for n in (
        'friction', 'restitution', 'stiffness', 'damping', 'slip_velocity', 'ground_height',
        'ground_tilt')}, vertices=tuple(x.float() for x in contact.vertices))
    out = contact_step(model.to(torch.float32), q[0].float(), v[0].float(), tau.float(), DT,
                       contact32, tol=1e-6)
    assert out.v.dtype == torch.float32
    assert torch.allclose(out.v.double(), result.v, rtol=0, atol=1e-4)


def test_trees_and_gradients_take_the_torch_step_with_the_solver_kernel():
    from test_contact import _mixed_contact
    model, contact = cube(mu=0.3)
    q, v = _near_ground(model, contact, 2, seed=1)
    reason = native_contact.free_body_reason
    assert reason(model, contact, 'complementarity', (q, v)) is None
    assert 'gradient' in reason(model, contact, 'complementarity',
                                (q.clone().requires_grad_(True), v))
    assert 'pairs' in reason(two_link(), _mixed_contact(), 'complementarity', (q, v))
    assert 'single free bodies' in reason(two_link(), replace(_mixed_contact(), pairs=()),
                                          'complementarity', (q, v))


def test_step_kernel_refuses_bad_configurations_with_the_torch_errors(kernels):
    model, contact = cube(mu=0.4)
    q = torch.tensor([[0.0, 0.0, 0.2, 0.0, 0.0, 0.0, 1.0]] * 3, dtype=torch.float64)
    v = torch.zeros(3, 6, dtype=torch.float64)
    q[2, 5] = 0.1  # |quat| = 1.005 at batch index 2
    with pytest.raises(ValueError, match=r'batch index \(2,\) has norm 1\.00498'):
        contact_step(model, q, v, v, 1e-3, contact)
    q[2, 5], q[1, 0] = 0.0, float('nan')
    with pytest.raises(ValueError, match=r'non-finite configuration at batch index \(1,\)'):
        contact_step(model, q, v, v, 1e-3, contact)
    flat = kernels.free_body_step  # and the kernel reports a singular mass matrix
    status = flat(q[:1], v[:1], v[:1], torch.zeros(10, dtype=torch.float64),
                  *(torch.zeros(n, dtype=torch.float64) for n in (6, 3)),
                  contact.vertices[0], torch.zeros(8, dtype=torch.float64),
                  *(getattr(contact, n) for n in ('friction', 'restitution', 'ground_height',
                                                  'ground_tilt', 'stiffness', 'damping',
                                                  'slip_velocity')),
                  [1], 1e-3, 1e-10, 100, 1e-8, 0, 1e-6)[1]
    assert status == 2
