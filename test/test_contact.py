"""Tests of contact geometry, Jacobians and the contact time steps on free bodies."""

from dataclasses import replace
import math

from contact_bodies import cube, GRAVITY, sphere, two_link
from diffsim_ros.core import (contact_kinematics, contact_parameters_from_theta,
                              contact_parameters_to_theta, contact_step, ContactModel, crba,
                              forward_kinematics, integrate, quat_to_matrix, ShapeError)
from diffsim_ros.core.contact import box_vertices
import pytest
import torch

SIDE = 0.1048
MASS = 0.37


def _state(*values):
    return torch.tensor(values, dtype=torch.float64)


def _kinetic(model, q, v):
    M = crba(model, q)
    return 0.5 * (v.unsqueeze(-2) @ M @ v.unsqueeze(-1)).squeeze(-1).squeeze(-1)


def _free_velocity(model, q, v, dt):
    # The step's velocity without contact: v + dt M^-1 (0 - h), from a contact-free model.
    empty = ContactModel.create(friction=0.0, sphere_links=('body',),
                                sphere_centers=[[0.0, 0.0, 100.0]], sphere_radii=[1e-3])
    return contact_step(model, q, v, torch.zeros_like(v), dt, empty).v


def _random_near_ground(model, contact, batch, seed):
    # Random orientations and velocities, lifted so the lowest candidate just touches
    # (phi >= 0): the contact is active within the step but nothing starts in penetration.
    g = torch.Generator().manual_seed(seed)
    quat = torch.randn(batch, 4, dtype=torch.float64, generator=g)
    q = torch.cat((0.2 * torch.randn(batch, 2, dtype=torch.float64, generator=g),
                   torch.zeros(batch, 1, dtype=torch.float64),
                   quat / quat.norm(dim=-1, keepdim=True)), -1)
    phi = contact_kinematics(model, q, contact).phi
    lift = 1e-4 * torch.rand(batch, dtype=torch.float64, generator=g)
    q[:, 2] = q[:, 2] - phi.amin(-1) + lift
    v = torch.randn(batch, 6, dtype=torch.float64, generator=g)
    # Moving towards the ground: the world velocity's z is set through the body axes.
    R = quat_to_matrix(q[:, 3:7])
    world = (R @ v[:, :3].unsqueeze(-1)).squeeze(-1)
    world[:, 2] = -world[:, 2].abs() - 0.5
    v[:, :3] = (R.mT @ world.unsqueeze(-1)).squeeze(-1)
    return q, v


@pytest.mark.parametrize('body', [cube, sphere])
def test_inelastic_step_never_increases_kinetic_energy(body):
    # With phi >= 0 and restitution 0, lambda^T J v+ = -lambda_n phi / dt - eps |lambda|^2
    # <= 0, so |v+|_M <= |v_free|_M (Anitescu 2006): contact only removes energy.
    model, contact = body(mu=0.6)
    q, v = _random_near_ground(model, contact, 64, seed=7)
    dt = 0.01
    step = contact_step(model, q, v, torch.zeros_like(v), dt, contact)
    v_free = _free_velocity(model, q, v, dt)
    assert (step.impulses[..., 0] > 1e-6).any(dim=-1).all()  # every sample hits the ground
    before, after = _kinetic(model, q, v_free), _kinetic(model, q, step.v)
    assert (after <= before * (1 + 1e-9)).all(), (after - before).max()
    assert ((after - before) / before).amin() < -1e-2  # and really dissipates


def test_resting_cube_normal_impulses_carry_its_weight():
    model, contact = cube(mu=0.5)
    yaw = 0.3
    q = _state(0.1, -0.2, SIDE / 2, 0.0, 0.0, math.sin(yaw / 2), math.cos(yaw / 2))
    dt = 0.01
    step = contact_step(model, q, torch.zeros(6, dtype=torch.float64),
                        torch.zeros(6, dtype=torch.float64), dt, contact)
    # The relative error is the solver's compliance (regularization 1e-8 of the Delassus
    # diagonal) and its tolerance.
    total = step.impulses[..., 0].sum()
    assert abs(total / (MASS * GRAVITY * dt) - 1) < 1e-6
    assert step.impulses[..., 1:].abs().max() < 1e-9
    assert step.v.abs().max() < 1e-8
    # Only the four bottom corners push.
    assert int((step.impulses[..., 0] > 1e-6).sum()) == 4


def _slide_on_slope(angle: float, mu: float, steps: int, dt: float) -> torch.Tensor:
    model, contact = cube(mu=mu, ground_tilt=(angle, 0.0))
    normal = _state(0.0, -math.sin(angle), math.cos(angle))
    q = torch.cat((0.5 * SIDE * normal, _state(math.sin(angle / 2), 0.0, 0.0,
                                               math.cos(angle / 2))))
    v = torch.zeros(6, dtype=torch.float64)
    tau = torch.zeros(6, dtype=torch.float64)
    start = q[:3].clone()
    for _ in range(steps):
        step = contact_step(model, q, v, tau, dt, contact)
        q, v = step.q, step.v
    downhill = -_state(0.0, math.cos(angle), math.sin(angle))
    return ((q[:3] - start) * downhill).sum()


@pytest.mark.parametrize('mu', [0.18, 0.5])
def test_cube_on_a_slope_sticks_below_atan_mu_and_slides_above(mu):
    # For a body on a plane the discrete Anitescu step with a second-order cone holds it
    # exactly while tan(angle) <= mu, so the threshold is atan(mu) itself; the 1 degree margin
    # only keeps the test off the edge where the solver's compliance (creep ~ eps g dt) and
    # tolerance decide.
    dt, steps = 0.01, 40
    margin = math.radians(1.0)
    stuck = _slide_on_slope(math.atan(mu) - margin, mu, steps, dt)
    assert abs(float(stuck)) < 1e-6
    angle = math.atan(mu) + margin
    slid = _slide_on_slope(angle, mu, steps, dt)
    # Semi-implicit Euler under the constant acceleration g (sin a - mu cos a) moves
    # a dt^2 N (N + 1) / 2; the Anitescu relaxation lets a sliding contact separate at
    # mu |v_t| per step, which the tolerance below covers (measured: see the assertion).
    accel = GRAVITY * (math.sin(angle) - mu * math.cos(angle))
    expected = accel * dt ** 2 * steps * (steps + 1) / 2
    assert float(slid) == pytest.approx(expected, rel=0.05)


def _roll(dt: float, duration: float = 0.2, radius: float = 0.05, v0: float = 1.0):
    model, contact = sphere(radius=radius, mu=0.3)
    q = _state(0.0, 0.0, radius, 0.0, 0.0, 0.0, 1.0)
    v = _state(0.0, v0, 0.0, 0.0, 0.0, 0.0)
    tau = torch.zeros(6, dtype=torch.float64)
    for _ in range(round(duration / dt)):
        step = contact_step(model, q, v, tau, dt, contact)
        q, v = step.q, step.v
    R = quat_to_matrix(q[3:7])
    linear, angular = R @ v[:3], R @ v[3:]
    # World velocity of the material point touching the ground, r below the centre.
    below = torch.tensor([0.0, 0.0, -radius], dtype=torch.float64)
    return linear + torch.linalg.cross(angular, below), linear, angular, q


def test_sphere_ends_rolling_at_five_sevenths():
    # A sphere launched sliding without spin: friction at the contact and gravity through the
    # centre keep its angular momentum about the contact line, so it ends rolling at 5/7 of
    # the launch speed whatever mu is. The contact impulses conserve it exactly, and the step
    # holds the root's world-frame velocity (semi_implicit_update), so no step size adds to
    # it: before that, the explicit w x v term and the SE(3) update gave +2.1 % at dt = 2 ms
    # and +1.0 % at 1 ms, growing while it rolled.
    radius, v0 = 0.05, 1.0
    for dt in (0.002, 0.001):
        slip, linear, angular, q = _roll(dt)
        assert float(slip.abs().max()) < 1e-9
        assert float(linear[1]) == pytest.approx(5.0 / 7.0 * v0, rel=1e-9)
        assert -float(angular[0]) * radius == pytest.approx(5.0 / 7.0 * v0, rel=1e-9)
        # It rolls on the ground, not into it.
        assert abs(float(q[2]) - radius) < 1e-9


def test_compliant_sphere_settles_at_weight_over_stiffness():
    mass, radius, k = 0.2, 0.05, 1e4
    model, contact = sphere(radius=radius, mass=mass, mu=0.5, stiffness=k, damping=50.0)
    q = _state(0.0, 0.0, radius, 0.0, 0.0, 0.0, 1.0)
    v = torch.zeros(6, dtype=torch.float64)
    tau = torch.zeros(6, dtype=torch.float64)
    for _ in range(400):
        step = contact_step(model, q, v, tau, 1e-3, contact, method='compliant')
        q, v = step.q, step.v
    assert float(radius - q[2]) == pytest.approx(mass * GRAVITY / k, rel=1e-3)
    assert float(step.impulses[0, 0]) == pytest.approx(mass * GRAVITY * 1e-3, rel=1e-3)


def test_batched_step_equals_loop():
    model, contact = cube(mu=0.4)
    q, v = _random_near_ground(model, contact, 3, seed=11)
    tau = torch.zeros_like(v)
    batched = contact_step(model, q, v, tau, 0.01, contact)
    for i in range(3):
        single = contact_step(model, q[i], v[i], tau[i], 0.01, contact)
        assert torch.allclose(batched.v[i], single.v, atol=1e-9)
        assert torch.allclose(batched.q[i], single.q, atol=1e-12)


def _mixed_contact(**overrides):
    # Vertices and a capsule on the body, a sphere on the arm, a pair between them.
    return ContactModel.create(
        friction=0.5, ground_tilt=(0.1, -0.2), ground_height=0.02,
        vertex_links=('body',), vertices=(box_vertices((0.1, 0.2, 0.05)),),
        sphere_links=('arm',), sphere_centers=[[0.1, 0.05, 0.1]], sphere_radii=[0.04],
        capsule_links=('body',), capsule_ends=[[[0.0, -0.1, 0.05], [0.05, 0.1, 0.1]]],
        capsule_radii=[0.03], pairs=((('capsule', 0), ('sphere', 0)),), **overrides)


def _two_link_state(seed):
    g = torch.Generator().manual_seed(seed)
    quat = torch.randn(4, dtype=torch.float64, generator=g)
    q = torch.cat((0.3 * torch.randn(3, dtype=torch.float64, generator=g),
                   quat / quat.norm(), torch.randn(1, dtype=torch.float64, generator=g)))
    return q, torch.randn(7, dtype=torch.float64, generator=g)


def test_contact_jacobians_are_the_derivatives_of_the_contact_points():
    model = two_link()
    contact = _mixed_contact()
    assert contact.n_contacts == 8 + 1 + 2 + 1
    q, v = _two_link_state(3)
    frame = contact_kinematics(model, q, contact)
    h = 1e-7
    later = contact_kinematics(model, integrate(model, q, v, h), contact)
    # d phi / dt = J_n v for every candidate (ground, vertices, capsule ends, the pair).
    assert torch.allclose((later.phi - frame.phi) / h, frame.J_n @ v, atol=1e-6)
    # The frames are orthonormal.
    basis = torch.cat((frame.normal.unsqueeze(-2), frame.tangents), -2)
    assert torch.allclose(basis @ basis.mT, torch.eye(3, dtype=torch.float64), atol=1e-12)


def test_contact_geometry_gradcheck():
    model = two_link()
    template = _mixed_contact()
    theta = contact_parameters_to_theta(template)
    names = ('vertices', 'sphere_centers', 'sphere_radii', 'capsule_ends', 'capsule_radii',
             'ground_height', 'ground_tilt')
    q = _two_link_state(5)[0].requires_grad_(True)
    leaves = [theta[n].clone().requires_grad_(True) for n in names]

    def geometry(q, *values):
        contact = contact_parameters_from_theta(template, dict(zip(names, values)))
        frame = contact_kinematics(model, q, contact)
        return frame.phi, frame.J_n, frame.J_t, frame.point
    assert torch.autograd.gradcheck(geometry, (q, *leaves), atol=1e-7, rtol=1e-6)


def test_contact_step_gradcheck_through_the_solver():
    # A cube corner-down with a sliding and a sticking phase across the batch: the step's
    # gradient with respect to state and contact parameters through the implicit backward.
    model, template = cube(mu=0.4)
    q, v = _random_near_ground(model, template, 2, seed=21)
    q, v = q.clone().requires_grad_(True), v.clone().requires_grad_(True)
    theta = contact_parameters_to_theta(template)
    friction = theta['friction'].clone().requires_grad_(True)
    tilt = theta['ground_tilt'].clone().requires_grad_(True)

    def step(q, v, friction, tilt):
        contact = contact_parameters_from_theta(template, {'friction': friction,
                                                           'ground_tilt': tilt})
        out = contact_step(model, q, v, torch.zeros_like(v), 0.01, contact, tol=1e-13,
                           max_iter=20000)
        return out.v
    assert torch.autograd.gradcheck(step, (q, v, friction, tilt), atol=1e-6, rtol=1e-5)


def test_parameters_round_trip_and_stay_physical():
    contact = _mixed_contact(restitution=0.3, stiffness=2e4)
    theta = contact_parameters_to_theta(contact)
    back = contact_parameters_from_theta(contact, theta)
    for name in contact.parameter_names():
        a, b = getattr(contact, name), getattr(back, name)
        if name == 'vertices':
            a, b = torch.cat(a, -2), torch.cat(b, -2)
        assert torch.allclose(a, b, atol=1e-12), name
    wild = {name: -50.0 * torch.ones_like(value) for name, value in theta.items()}
    extreme = contact_parameters_from_theta(contact, wild)
    assert (extreme.sphere_radii > 0).all() and (extreme.friction >= 0).all()
    assert 0 <= float(extreme.restitution) <= 1
    with pytest.raises(KeyError, match='valid: friction'):
        contact_parameters_from_theta(contact, {'mass': torch.zeros(())})


def test_particles_broadcast_against_states():
    model, template = cube(mu=0.4)
    q, v = _random_near_ground(model, template, 5, seed=2)
    # Two friction particles (2, 1) against five states (5,) give (2, 5) results.
    mu = torch.tensor([0.1, 0.9], dtype=torch.float64)
    contact = template
    particles = replace(contact, friction=mu.reshape(2, 1))
    out = contact_step(model, q, v, torch.zeros_like(v), 0.01, particles)
    assert out.v.shape == (2, 5, 6)
    for p in range(2):
        single = contact_step(model, q, v, torch.zeros_like(v), 0.01,
                              replace(contact, friction=mu[p]))
        assert torch.allclose(out.v[p], single.v, atol=1e-9)


def test_bad_input_gets_one_precise_error():
    with pytest.raises(ValueError, match="vertex set 0 of link 'body' has no vertices"):
        ContactModel.create(friction=0.5, vertex_links=('body',),
                            vertices=(torch.zeros(0, 3),))
    with pytest.raises(ValueError, match='sphere_radii must be > 0'):
        ContactModel.create(friction=0.5, sphere_links=('body',),
                            sphere_centers=[[0.0, 0.0, 0.0]], sphere_radii=[0.0])
    with pytest.raises(ValueError, match='restitution must lie in'):
        ContactModel.create(friction=0.5, restitution=1.5, sphere_links=('body',),
                            sphere_centers=[[0.0, 0.0, 0.0]], sphere_radii=[0.1])
    with pytest.raises(ValueError, match="both on link 'body'"):
        ContactModel.create(friction=0.5, sphere_links=('body', 'body'),
                            sphere_centers=[[0.0, 0.0, 0.0]] * 2, sphere_radii=[0.1, 0.1],
                            pairs=((('sphere', 0), ('sphere', 1)),))
    model, contact = cube()
    q = _state(0, 0, 1, 0, 0, 0, 1)
    with pytest.raises(ShapeError, match=r'v: expected shape \(\.\.\., 6\), got \(5,\)'):
        contact_step(model, q, torch.zeros(5, dtype=torch.float64),
                     torch.zeros(6, dtype=torch.float64), 0.01, contact)
    with pytest.raises(ShapeError, match=r'tau: expected shape'):
        contact_step(model, q, torch.zeros(6, dtype=torch.float64),
                     torch.zeros(7, dtype=torch.float64), 0.01, contact)
    with pytest.raises(ValueError, match='valid methods: complementarity, compliant'):
        contact_step(model, q, torch.zeros(6, dtype=torch.float64),
                     torch.zeros(6, dtype=torch.float64), 0.01, contact, method='lcp')


def test_restitution_returns_that_fraction_of_the_impact_speed():
    # A sphere arriving at 2 m/s, exactly touching: the step asks phi / dt + J_n v+ >= e |v_n|.
    for e in (0.0, 0.5, 1.0):
        model, contact = sphere(mu=0.5, restitution=e)
        q = _state(0.0, 0.0, 0.05, 0.0, 0.0, 0.0, 1.0)
        v = _state(0.0, 0.0, -2.0, 0.0, 0.0, 0.0)
        step = contact_step(model, q, v, torch.zeros(6, dtype=torch.float64), 1e-3, contact)
        # Off by the solver's compliance only: regularization (1e-8) x the mean Delassus
        # diagonal (below 1/m + r^2/I = 17.5 /kg) x the normal impulse.
        compliance = 1e-8 * 17.5 * float(step.impulses[0, 0])
        assert float(step.v[2]) == pytest.approx(2.0 * e, abs=compliance + 1e-12)


def test_capsule_pairs_find_the_closest_points():
    # Signed distance of random capsule/sphere pairs against dense sampling of the segments.
    model = two_link()
    g = torch.Generator().manual_seed(9)
    q, _ = _two_link_state(9)
    for trial in range(20):
        ends = 0.3 * torch.randn(2, 2, 3, dtype=torch.float64, generator=g)
        if trial % 4 == 0:
            ends[1, 1] = ends[1, 0]  # a sphere as a zero-length capsule
        if trial % 4 == 1:
            ends[1] = ends[0] + torch.tensor([0.0, 0.0, 0.5], dtype=torch.float64)  # parallel
        contact = ContactModel.create(
            friction=0.5, ground=False, capsule_links=('body', 'arm'), capsule_ends=ends,
            capsule_radii=[0.01, 0.02], pairs=((('capsule', 0), ('capsule', 1)),))
        frame = contact_kinematics(model, q, contact)
        T = forward_kinematics(model, q)
        world = []
        for i, link in enumerate(('body', 'arm')):
            T_link = T[model.link_index(link)]
            world.append(ends[i] @ T_link[:3, :3].mT + T_link[:3, 3])
        s = torch.linspace(0, 1, 2001, dtype=torch.float64).unsqueeze(-1)
        a = world[0][0] + s * (world[0][1] - world[0][0])
        b = world[1][0] + s * (world[1][1] - world[1][0])
        brute = torch.cdist(a, b).min() - 0.03
        # Sampling at 1/2000 of the segment lengths bounds the brute force's own error.
        assert float(frame.phi[0]) <= float(brute) + 1e-12
        assert float(frame.phi[0]) == pytest.approx(float(brute), abs=1e-6)


def test_a_non_unit_quaternion_is_refused_with_its_norm():
    model, contact = cube(mu=0.4)
    q = _state(0.0, 0.0, 0.2, 0.0, 0.0, 0.1, 1.0)          # |quat| = 1.005: Euler-ish input
    v = torch.zeros(6, dtype=torch.float64)
    with pytest.raises(ValueError, match=r'root quaternion .* norm 1\.00498'):
        contact_step(model, q, v, v, 1e-3, contact)
