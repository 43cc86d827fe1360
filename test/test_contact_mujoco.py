"""
The contact step against MuJoCo with matching parameters (``sim.contact_scenes``).

A cube dropped, a cube sliding, a sphere rolling, the forces of a resting cube.

The engines differ by construction: ours is Anitescu's hard velocity-level step at 1 ms,
MuJoCo a soft contact (time constant 2 ms, critically damped) at 0.1 ms, so the tolerances
below are set from those differences, not from a run: a semi-implicit step at ``dt`` misplaces
a body sliding at ``u`` by at most ``u dt / 2`` per change of contact mode, MuJoCo's soft
normal penetrates ``m g / k`` (below 0.1 mm here), and both are checked against the closed
form of each scene (stopping distance ``u^2 / (2 mu g)``, the rolling speed ``5/7 u`` of a
solid sphere), which neither engine was tuned to.
"""

import math

from diffsim_ros.core import box_vertices, contact_step, ContactModel, load_urdf, quat_rotate
from diffsim_ros.robots import object_urdf_path
from diffsim_ros.sim.contact_scenes import free_body_scene, GeomSpec
import pytest
import torch

G = 9.81
DT = 1e-3
HALF = 0.0524


def _cube():
    return load_urdf(object_urdf_path('cube_toss'), floating_base=True)


def _cube_contact(mu: float) -> ContactModel:
    return ContactModel.create(friction=mu, vertex_links=('cube',),
                               vertices=(box_vertices((2 * HALF,) * 3),))


def _sphere(radius: float, mass: float):
    inertia = 0.4 * mass * radius ** 2
    xml = (f'<robot name="ball"><link name="ball"><inertial><mass value="{mass}"/>'
           f'<inertia ixx="{inertia}" iyy="{inertia}" izz="{inertia}" ixy="0" ixz="0" '
           f'iyz="0"/></inertial></link></robot>')
    return load_urdf(xml=xml, floating_base=True)


def _rollout(model, contact, q, v, duration):
    tau = torch.zeros(model.nv, dtype=torch.float64)
    impulses = None
    for _ in range(int(round(duration / DT))):
        step = contact_step(model, q, v, tau, DT, contact)
        q, v, impulses = step.q, step.v, step.impulses
    return q, v, impulses


def _state(p, lin):
    q = torch.tensor(list(p) + [0.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    v = torch.tensor(list(lin) + [0.0, 0.0, 0.0], dtype=torch.float64)
    return q, v


@pytest.mark.parametrize('mu, speed', [(0.3, 1.0), (0.15, 0.6)])
def test_cube_slides_to_the_same_stop_as_mujoco(mu, speed):
    model, contact = _cube(), _cube_contact(mu)
    q0, v0 = _state((0.0, 0.0, HALF), (speed, 0.0, 0.0))
    duration = speed / (mu * G) + 0.1
    q, v, _ = _rollout(model, contact, q0, v0, duration)
    scene = free_body_scene(model, [GeomSpec('box', (HALF,) * 3)], mu)
    scene.set_state(q0, v0)
    q_mj, v_mj = scene.simulate(duration)
    stop = speed ** 2 / (2 * mu * G)
    # One mode change (sliding -> stuck) at 1 ms: at most speed * DT / 2 apart, plus MuJoCo's
    # own 0.1 ms discretisation.
    tolerance = speed * DT / 2 + speed * 1e-4
    assert abs(float(q[0]) - stop) < tolerance
    assert abs(float(q[0] - q_mj[0])) < tolerance
    assert float(v.abs().max()) < 1e-6 and float(v_mj.abs().max()) < 1e-6
    # Resting on its face, as MuJoCo's (its soft contact sinks m g / k, far below 0.1 mm).
    assert abs(float(q[2]) - HALF) < 1e-6 and abs(float(q_mj[2]) - HALF) < 1e-4
    assert float(q[3:6].abs().max()) < 1e-6


def test_dropped_cube_lands_and_slides_like_mujoco():
    model, contact = _cube(), _cube_contact(0.3)
    q0, v0 = _state((0.0, 0.0, 0.3), (0.8, 0.0, 0.0))
    duration = 0.6
    q, v, impulses = _rollout(model, contact, q0, v0, duration)
    scene = free_body_scene(model, [GeomSpec('box', (HALF,) * 3)], 0.3)
    scene.set_state(q0, v0)
    q_mj, v_mj = scene.simulate(duration)
    # The inelastic impact takes the normal speed (2.2 m/s) and, with it, mu times that
    # impulse of tangential speed: the horizontal travel depends on how each engine resolves
    # the impact.  Both must agree within one step of the impact speed.
    impact_speed = math.sqrt(2 * G * (0.3 - HALF))
    assert abs(float(q[0] - q_mj[0])) < impact_speed * DT
    assert abs(float(q[2]) - HALF) < 1e-6 and abs(float(q_mj[2]) - HALF) < 1e-4
    assert float(v.abs().max()) < 1e-6
    # At rest the normal impulses carry the weight.
    assert abs(float(impulses[..., 0].sum()) / DT - float(model.mass[0]) * G) < 1e-6


def test_resting_cube_contact_force_matches_mujoco():
    model, contact = _cube(), _cube_contact(0.3)
    q0, v0 = _state((0.0, 0.0, HALF), (0.0, 0.0, 0.0))
    _, _, impulses = _rollout(model, contact, q0, v0, 0.05)
    scene = free_body_scene(model, [GeomSpec('box', (HALF,) * 3)], 0.3)
    scene.set_state(q0, v0)
    scene.simulate(0.05)
    weight = float(model.mass[0]) * G
    assert abs(float(impulses[..., 0].sum()) / DT - weight) < 1e-6
    assert abs(scene.normal_force() - weight) < 1e-3 * weight


@pytest.mark.parametrize('mu', [0.1, 0.4])
def test_sphere_rolls_at_five_sevenths_like_mujoco(mu):
    radius, mass, speed = 0.05, 0.5, 1.0
    model = _sphere(radius, mass)
    contact = ContactModel.create(friction=mu, sphere_links=('ball',),
                                  sphere_centers=[[0.0, 0.0, 0.0]], sphere_radii=[radius])
    q0, v0 = _state((0.0, 0.0, radius), (speed, 0.0, 0.0))
    slip_time = 2 * speed / (7 * mu * G)
    duration = slip_time + 0.1
    q, v, _ = _rollout(model, contact, q0, v0, duration)
    scene = free_body_scene(model, [GeomSpec('sphere', (radius,))], mu)
    scene.set_state(q0, v0)
    q_mj, v_mj = scene.simulate(duration)
    rolling = 5.0 / 7.0 * speed
    # Body-frame velocities: rotate to the world to compare (the ball has turned).
    lin, lin_mj = quat_rotate(q[3:7], v[:3]), quat_rotate(q_mj[3:7], v_mj[:3])
    # Friction decelerates at mu g: one step of it is the step's resolution.
    assert abs(float(lin[0]) - rolling) < mu * G * DT
    assert abs(float(lin_mj[0]) - rolling) < mu * G * 1e-4 + 1e-4
    # Rolling without slipping: the contact point is at rest.
    spin = quat_rotate(q[3:7], v[3:])
    assert abs(float(lin[0]) - float(spin[1]) * radius) < 1e-6
    assert abs(float(q[0] - q_mj[0])) < speed * DT
