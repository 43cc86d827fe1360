"""
Check free flight on the configuration manifold.

The integrators' order on SE(3) and their conservation laws on a spinning asymmetric body
(the floating model from ``load_urdf(..., floating_base=True)``), and the same body under
gravity against MuJoCo (issue 16's free-fall check).
"""

import math

from diffsim_ros.core import difference, from_mujoco, INTEGRATORS, load_urdf, quat_rotate, \
    rk4, rollout, to_mujoco
import numpy as np
import pytest
import torch

F64 = torch.float64
# Principal moments (kg m^2) of an asymmetric body: spin about a non-principal axis precesses.
INERTIA = (0.004, 0.009, 0.0125)
MASS = 0.7
X0 = torch.tensor([0.1, -0.2, 1.0, 0.0, 0.0, 0.0, 1.0,      # p, quat (x, y, z, w)
                   0.3, -0.2, 2.0, 3.0, 5.0, -4.0], dtype=F64)  # v_lin (body), w (body)


@pytest.fixture(scope='module')
def body():
    """Return the free body: one link, frame at its centre of mass."""
    return load_urdf(xml=free_body_urdf(), dtype=F64, floating_base=True)


def error_after_one_second(model, method: str, dt: float, reference: torch.Tensor):
    """Return the configuration error norm of ``method`` at ``dt`` after 1 s."""
    steps = round(1.0 / dt)
    x = rollout(model, X0, torch.zeros(steps, 6, dtype=F64), dt, method=method)[-1]
    return float(difference(model, reference[:7], x[:7]).norm())


@pytest.fixture(scope='module')
def reference_state(body):
    """
    Return the state after 1 s by RK4 at 0.4 ms.

    About 1e-11 from the exact solution (error ~ dt^4), 1e4 below the errors compared.
    """
    x = X0
    u = torch.zeros(6, dtype=F64)
    with torch.no_grad():
        for _ in range(2500):
            x = rk4(body, x, u, 4e-4)
    return x


@pytest.mark.parametrize('method, order', [('rk4', 4), ('semi_implicit_euler', 1)])
def test_integrators_reach_their_order_on_free_rotation(body, reference_state, method, order):
    """Check the convergence order after 1 s at dt = 20, 10, 5 ms."""
    with torch.no_grad():
        errors = [error_after_one_second(body, method, dt, reference_state)
                  for dt in (0.02, 0.01, 0.005)]
    rates = [math.log2(errors[i] / errors[i + 1]) for i in range(2)]
    # Without the dexp^-1 correction RK4 falls to order 2 here (measured 2.00).
    assert min(rates) > order - 0.3, (errors, rates)


def test_free_body_conserves_angular_momentum_and_energy(body):
    """Check that momentum (world axes) and rotational energy stay constant over 1 s."""
    with torch.no_grad():
        states = rollout(body, X0, torch.zeros(1000, 6, dtype=F64), 1e-3)
    inertia = torch.tensor(INERTIA, dtype=F64)
    w = states[:, 10:13]
    momentum_world = quat_rotate(states[:, 3:7], inertia * w)
    energy = 0.5 * (inertia * w * w).sum(-1)
    torch.testing.assert_close(momentum_world, momentum_world[:1].expand_as(momentum_world),
                               atol=1e-11, rtol=0)
    torch.testing.assert_close(energy, energy[:1].expand_as(energy), atol=1e-11, rtol=0)


def test_semi_implicit_euler_holds_linear_momentum_of_a_spinning_body(body):
    """Check that a spinning body's world velocity and straight path survive 1000 steps."""
    without_gravity = body.replace(gravity=torch.zeros(3, dtype=F64))
    with torch.no_grad():
        states = rollout(without_gravity, X0, torch.zeros(1000, 6, dtype=F64), 1e-3,
                         method='semi_implicit_euler')
    velocity_world = quat_rotate(states[:, 3:7], states[:, 7:10])
    torch.testing.assert_close(velocity_world, velocity_world[:1].expand_as(velocity_world),
                               atol=1e-12, rtol=0)
    # The origin (the centre of mass) moves on a straight line at that velocity.
    t = torch.arange(1001, dtype=F64).unsqueeze(-1) * 1e-3
    torch.testing.assert_close(states[:, :3], X0[:3] + t * velocity_world[0], atol=1e-12,
                               rtol=0)


def free_body_urdf() -> str:
    """Return one link, frame at the centre of mass, principal axes along its axes."""
    ixx, iyy, izz = INERTIA
    return f"""<robot name="spinner"><link name="body"><inertial>
      <origin xyz="0 0 0" rpy="0 0 0"/><mass value="{MASS}"/>
      <inertia ixx="{ixx}" ixy="0" ixz="0" iyy="{iyy}" iyz="0" izz="{izz}"/>
    </inertial></link></robot>"""


def free_body_mjcf(timestep: float) -> str:
    """Return the same body in MuJoCo, RK4, no contact."""
    ixx, iyy, izz = INERTIA
    return f"""<mujoco><option timestep="{timestep}" integrator="RK4" gravity="0 0 -9.81">
      <flag contact="disable"/></option>
      <worldbody><body name="body"><freejoint/>
        <inertial pos="0 0 0" mass="{MASS}" diaginertia="{ixx} {iyy} {izz}"/>
      </body></worldbody></mujoco>"""


def test_spinning_free_fall_matches_mujoco(body):
    """Compare our RK4 at 1 ms over 1 s against MuJoCo's RK4 at 0.1 ms (converged to ~1e-12)."""
    mujoco = pytest.importorskip('mujoco')
    model = body
    mj_model = mujoco.MjModel.from_xml_string(free_body_mjcf(1e-4))
    data = mujoco.MjData(mj_model)
    qpos, qvel = to_mujoco(model, X0[:7], X0[7:])
    data.qpos[:], data.qvel[:] = qpos.numpy(), qvel.numpy()
    for _ in range(10000):
        mujoco.mj_step(mj_model, data)
    q_ref, v_ref = from_mujoco(model, torch.tensor(data.qpos), torch.tensor(data.qvel))
    ours = rollout(model, X0, torch.zeros(1000, 6, dtype=F64), 1e-3, method='rk4')[-1]
    error = difference(model, q_ref, ours[:7])
    orientation_error = float(error[3:6].norm())
    position_error = float((ours[:3] - q_ref[:3]).norm())
    # Orientation: issue 16's bound (measured 2.3e-11 rad; 1.1e-14 against MuJoCo at 1 ms).
    # Position: the body falls ~4.9 m while its body-frame velocity rotates; measured
    # 1.8e-10 m against MuJoCo at 0.1 ms and at 1 ms alike, i.e. 4e-11 of the distance.
    assert orientation_error < 1e-6, orientation_error
    assert position_error < 1e-9, position_error
    np.testing.assert_allclose(ours[7:].numpy(), v_ref.numpy(), atol=1e-8)
    # The spin precesses: the body-frame angular velocity turns by more than 1 rad.
    assert float(torch.arccos(torch.nn.functional.cosine_similarity(
        ours[10:13], X0[10:13], dim=0))) > 1.0


@pytest.mark.parametrize('method', ['rk4', 'semi_implicit_euler'])
def test_gradcheck_through_a_floating_step(body, method):
    """Check float64 gradients of one manifold step w.r.t. the state (quaternion included)."""
    step = INTEGRATORS[method]
    x = X0.clone().requires_grad_(True)
    u = torch.zeros(6, dtype=F64)
    assert torch.autograd.gradcheck(lambda x: step(body, x, u, 0.01), (x,))


def test_rollout_refuses_a_start_off_the_unit_sphere(body):
    """Check that a rollout names the non-unit start quaternion instead of simulating it."""
    x0 = X0.clone()
    x0[3:7] = torch.tensor([0.1, 0.2, 0.3, 0.9], dtype=F64)   # norm 0.975
    with pytest.raises(ValueError, match=r'root quaternion .* norm 0\.974679'):
        rollout(body, x0, torch.zeros(3, 6, dtype=F64), 1e-3)
