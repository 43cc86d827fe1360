"""
Check the configuration space of floating bases.

integrate/difference against Pinocchio, gradients, checks, and the conversions to MuJoCo
qpos/qvel and ROS pose/twist dicts.

The models are free-flyer chains loaded with ``load_urdf(..., floating_base=True)``; the
Pinocchio reference is built from the same URDF with ``JointModelFreeFlyer``.
"""

import math

from diffsim_ros.core import (check_configuration, difference, from_mujoco, from_ros_pose,
                              from_ros_twist, integrate, load_urdf, matrix_to_quat, normalize,
                              quat_exp, quat_log, quat_to_matrix, to_mujoco, to_ros_pose,
                              to_ros_twist)
import numpy as np
import pytest
import torch

F64 = torch.float64
N_JOINTS = 2                       # hinges after the free-flyer
_AXES = ('0 1 0', '0 0 1', '1 0 0')


def chain_urdf(n_joints: int) -> str:
    """Return a chain of ``n_joints`` revolute joints (axes y, z, x) with unit boxes."""
    inertial = ('<inertial><origin xyz="0.1 0 0"/><mass value="1"/><inertia ixx="0.01" '
                'ixy="0" ixz="0" iyy="0.02" iyz="0" izz="0.03"/></inertial>')
    links = ''.join(f'<link name="l{i}">{inertial}</link>' for i in range(n_joints + 1))
    joints = ''.join(
        f'<joint name="j{i + 1}" type="revolute"><parent link="l{i}"/>'
        f'<child link="l{i + 1}"/><origin xyz="0.2 0 0"/><axis xyz="{_AXES[i % 3]}"/>'
        '<limit lower="-100" upper="100" effort="1" velocity="1"/></joint>'
        for i in range(n_joints))
    return f'<robot name="chain">{links}{joints}</robot>'


def floating_layout(n_joints: int = N_JOINTS):
    """Return a free-flyer followed by ``n_joints`` revolute joints."""
    return load_urdf(xml=chain_urdf(n_joints), floating_base=True)


def random_states(generator: torch.Generator, count: int, n_joints: int = N_JOINTS):
    """
    Random configurations and velocities covering small, large and near-pi rotations.

    :return: ``q (count, 7 + n_joints)`` with unit quaternions, ``v (count, 6 + n_joints)``.
    """
    p = 2.0 * torch.randn(count, 3, generator=generator, dtype=F64)
    quat = torch.randn(count, 4, generator=generator, dtype=F64)
    quat = quat / quat.norm(dim=-1, keepdim=True)
    joints = 3.0 * torch.randn(count, n_joints, generator=generator, dtype=F64)
    v = torch.randn(count, 6 + n_joints, generator=generator, dtype=F64)
    scale = torch.tensor([1e-7, 1e-3, 1.0, 3.0], dtype=F64).repeat(count // 4 + 1)[:count]
    v[:, 3:6] *= scale[:, None]
    axis = v[::5, 3:6] / v[::5, 3:6].norm(dim=-1, keepdim=True)
    v[::5, 3:6] = axis * (math.pi - 1e-6)            # rotations just short of pi
    return torch.cat((p, quat, joints), dim=-1), v


def same_rotation_quat(a: np.ndarray, b: np.ndarray) -> float:
    """Return the distance between two quaternion arrays modulo the sign."""
    return min(np.abs(a - b).max(), np.abs(a + b).max())


@pytest.fixture(scope='module')
def pin_free_model():
    """Return Pinocchio's model of the same chain on a free-flyer."""
    pin = pytest.importorskip('pinocchio')
    model = pin.buildModelFromXML(chain_urdf(N_JOINTS), pin.JointModelFreeFlyer())
    assert (model.nq, model.nv) == (7 + N_JOINTS, 6 + N_JOINTS)
    return model


def test_integrate_and_difference_match_pinocchio(pin_free_model):
    pin = pytest.importorskip('pinocchio')
    layout = floating_layout()
    q, v = random_states(torch.Generator().manual_seed(3), 80)
    ours_next = integrate(layout, q, v, 0.7)
    ours_back = difference(layout, q, ours_next)
    for i in range(q.shape[0]):
        expected = pin.integrate(pin_free_model, q[i].numpy(), 0.7 * v[i].numpy())
        got = ours_next[i].numpy()
        np.testing.assert_allclose(got[:3], expected[:3], atol=1e-12, rtol=0)
        assert same_rotation_quat(got[3:7], expected[3:7]) < 1e-12
        np.testing.assert_allclose(got[7:], expected[7:], atol=1e-12, rtol=0)
        expected_diff = pin.difference(pin_free_model, q[i].numpy(), expected)
        np.testing.assert_allclose(ours_back[i].numpy(), expected_diff, atol=1e-9, rtol=0)


def test_difference_matches_pinocchio_on_unrelated_configurations(pin_free_model):
    pin = pytest.importorskip('pinocchio')
    layout = floating_layout()
    generator = torch.Generator().manual_seed(4)
    q0, _ = random_states(generator, 40)
    q1, _ = random_states(generator, 40)
    ours = difference(layout, q0, q1)
    for i in range(q0.shape[0]):
        expected = pin.difference(pin_free_model, q0[i].numpy(), q1[i].numpy())
        np.testing.assert_allclose(ours[i].numpy(), expected, atol=1e-10, rtol=0)


def test_integrate_of_difference_returns_the_target():
    layout = floating_layout()
    generator = torch.Generator().manual_seed(5)
    q0, _ = random_states(generator, 64)
    q1, _ = random_states(generator, 64)
    back = integrate(layout, q0, difference(layout, q0, q1))
    sign = torch.sign((back[:, 3:7] * q1[:, 3:7]).sum(-1, keepdim=True))
    torch.testing.assert_close(back[:, :3], q1[:, :3], atol=1e-11, rtol=0)
    torch.testing.assert_close(sign * back[:, 3:7], q1[:, 3:7], atol=1e-12, rtol=0)
    torch.testing.assert_close(back[:, 7:], q1[:, 7:], atol=1e-12, rtol=0)
    # and difference inverts integrate for rotations below pi
    _, v = random_states(generator, 64)
    angle = v[:, 3:6].norm(dim=-1, keepdim=True)
    v[:, 3:6] *= torch.where(angle > 3.0, 3.0 / angle, torch.ones_like(angle))
    torch.testing.assert_close(difference(layout, q0, integrate(layout, q0, v)), v,
                               atol=1e-8, rtol=0)


def test_batched_equals_loop_and_broadcasts():
    layout = floating_layout()
    q, v = random_states(torch.Generator().manual_seed(6), 12)
    batched = integrate(layout, q.reshape(3, 4, -1), v[:4], 0.01)
    for i in range(12):
        torch.testing.assert_close(batched.reshape(12, -1)[i],
                                   integrate(layout, q[i], v[i % 4], 0.01), atol=0, rtol=0)


@pytest.mark.parametrize('angle', [0.0, 1e-9, 1e-4, 0.5, math.pi - 1e-3])
def test_gradcheck_through_integrate_and_difference(angle):
    layout = floating_layout(1)
    generator = torch.Generator().manual_seed(7)
    q, v = random_states(generator, 2, 1)
    axis = torch.tensor([0.3, -0.5, 0.8], dtype=F64)
    v[:, 3:6] = angle * axis / axis.norm()
    q1 = integrate(layout, q, 0.5 * v).detach()
    q.requires_grad_(True)
    v.requires_grad_(True)
    q1.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda q, v: integrate(layout, q, v, 0.5), (q, v))
    assert torch.autograd.gradcheck(lambda a, b: difference(layout, a, b), (q, q1))


def test_quaternion_exponential_gradient_is_exact_at_zero():
    # d exp(w) / dw at w = 0 is [E / 2; 0]; the series must give it exactly (no NaN).
    w = torch.zeros(3, dtype=F64, requires_grad=True)
    jac = torch.autograd.functional.jacobian(quat_exp, w)
    expected = torch.cat((0.5 * torch.eye(3, dtype=F64), torch.zeros(1, 3, dtype=F64)))
    torch.testing.assert_close(jac, expected, atol=0, rtol=0)
    identity = torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=F64, requires_grad=True)
    jac_log = torch.autograd.functional.jacobian(quat_log, identity)
    torch.testing.assert_close(jac_log[:, :3], 2.0 * torch.eye(3, dtype=F64), atol=0, rtol=0)
    assert torch.isfinite(jac_log).all()


def test_series_equals_the_closed_form_just_inside_the_switch():
    from diffsim_ros.core.spatial import SMALL_ANGLE_SQ
    axis = torch.tensor([0.6, 0.0, 0.8], dtype=F64)
    theta = math.sqrt(SMALL_ANGLE_SQ) * (1 - 1e-9)
    cos_half = torch.tensor([math.cos(theta / 2)], dtype=F64)
    closed_form = torch.cat((math.sin(theta / 2) * axis, cos_half))
    torch.testing.assert_close(quat_exp(theta * axis), closed_form, atol=2e-17, rtol=0)
    torch.testing.assert_close(quat_log(closed_form), theta * axis, atol=2e-17, rtol=0)


def test_quaternion_matrix_roundtrip_and_log_takes_the_short_way():
    generator = torch.Generator().manual_seed(8)
    quat = torch.randn(200, 4, generator=generator, dtype=F64)
    quat = quat / quat.norm(dim=-1, keepdim=True)
    back = matrix_to_quat(quat_to_matrix(quat))
    torch.testing.assert_close(back, torch.where(quat[:, 3:] < 0, -quat, quat), atol=1e-13,
                               rtol=0)
    assert (quat_log(quat).norm(dim=-1) <= math.pi + 1e-12).all()
    torch.testing.assert_close(quat_log(-quat), quat_log(quat), atol=1e-13, rtol=0)


def test_non_unit_quaternion_gets_one_precise_error():
    layout = floating_layout()
    q, _ = random_states(torch.Generator().manual_seed(9), 4)
    check_configuration(layout, q)
    check_configuration(layout, normalize(layout, 1.0 + 0 * q))
    bad = q.clone()
    bad[2, 3:7] *= 1.01
    with pytest.raises(ValueError, match=r'batch index \(2,\) has norm 1\.01.*within 1e-06'):
        check_configuration(layout, bad)
    with pytest.raises(ValueError, match='expected shape'):
        check_configuration(layout, q[:, :-1])
    torch.testing.assert_close(normalize(layout, bad)[2, 3:7].norm(), torch.tensor(1.0, dtype=F64))


def test_fixed_base_is_the_vector_space_update_bit_for_bit():
    layout = load_urdf(xml=chain_urdf(3))
    generator = torch.Generator().manual_seed(10)
    q = torch.randn(5, 3, generator=generator, dtype=F64)
    v = torch.randn(5, 3, generator=generator, dtype=F64)
    assert torch.equal(integrate(layout, q, v, 0.01), q + 0.01 * v)
    assert torch.equal(difference(layout, q, v), v - q)
    assert normalize(layout, q) is q


MJCF_FREE_BODY = """
<mujoco>
  <worldbody>
    <body name="b">
      <freejoint/>
      <inertial pos="0 0 0" mass="1" diaginertia="0.01 0.02 0.03"/>
      <body name="c" pos="0.1 0 0">
        <joint name="hinge" type="hinge" axis="0 1 0"/>
        <inertial pos="0 0 0" mass="0.5" diaginertia="0.01 0.01 0.01"/>
      </body>
    </body>
  </worldbody>
</mujoco>
"""


def test_mujoco_conversion_by_experiment():
    """Check MuJoCo's free joint: quaternion (w, x, y, z), linear velocity world, angular local."""
    mujoco = pytest.importorskip('mujoco')
    mj_model = mujoco.MjModel.from_xml_string(MJCF_FREE_BODY)
    layout = floating_layout(1)
    q, v = random_states(torch.Generator().manual_seed(11), 8, 1)
    for i in range(q.shape[0]):
        qpos, qvel = (t.numpy().copy() for t in to_mujoco(layout, q[i], v[i]))
        q_back, v_back = from_mujoco(layout, torch.tensor(qpos), torch.tensor(qvel))
        torch.testing.assert_close(q_back, q[i], atol=1e-15, rtol=0)
        torch.testing.assert_close(v_back, v[i], atol=1e-14, rtol=0)
        # Position and rotation parts separately: MuJoCo integrates the free joint as
        # R^3 x SO(3) (world linear velocity, body angular), we as SE(3); they agree when
        # only one part moves.
        for part in (slice(0, 3), slice(3, 6)):
            v_part = torch.zeros_like(v[i])
            v_part[part] = v[i][part]
            _, qvel_part = to_mujoco(layout, q[i], v_part)
            qpos_next = qpos.copy()
            mujoco.mj_integratePos(mj_model, qpos_next, qvel_part.numpy().copy(), 0.3)
            ours = integrate(layout, q[i], v_part, 0.3)
            ours_mj, _ = to_mujoco(layout, ours, v_part)
            np.testing.assert_allclose(ours_mj.numpy()[:3], qpos_next[:3], atol=1e-12)
            assert same_rotation_quat(ours_mj.numpy()[3:7], qpos_next[3:7]) < 1e-12
        # The linear velocity MuJoCo reports for the body origin, in world axes.
        data = mujoco.MjData(mj_model)
        data.qpos[:], data.qvel[:] = qpos, qvel
        mujoco.mj_forward(mj_model, data)
        velocity = np.zeros(6)
        mujoco.mj_objectVelocity(mj_model, data, mujoco.mjtObj.mjOBJ_BODY, 1, velocity, 0)
        R = quat_to_matrix(q[i, 3:7]).numpy()
        np.testing.assert_allclose(velocity[:3], R @ v[i, 3:6].numpy(), atol=1e-12)
        np.testing.assert_allclose(velocity[3:], R @ v[i, :3].numpy(), atol=1e-12)


def test_ros_pose_and_twist_roundtrip():
    layout = floating_layout(1)
    q, v = random_states(torch.Generator().manual_seed(12), 3, 1)
    for i in range(3):
        pose = to_ros_pose(layout, q[i])
        assert set(pose) == {'position', 'orientation'}
        assert pose['orientation']['w'] == float(q[i, 6])
        torch.testing.assert_close(from_ros_pose(pose), q[i, :7], atol=0, rtol=0)
        for frame in ('world', 'body'):
            twist = to_ros_twist(layout, q[i], v[i], frame=frame)
            torch.testing.assert_close(from_ros_twist(q[i], twist, frame=frame), v[i, :6],
                                       atol=1e-14, rtol=0)
        world = to_ros_twist(layout, q[i], v[i])
        R = quat_to_matrix(q[i, 3:7])
        torch.testing.assert_close(torch.tensor([world['angular'][k] for k in 'xyz'],
                                                dtype=F64), R @ v[i, 3:6], atol=1e-14, rtol=0)
    with pytest.raises(ValueError, match="unknown twist frame 'local'; valid: world, body"):
        to_ros_twist(layout, q[0], v[0], frame='local')
    with pytest.raises(ValueError, match='floating-base model'):
        to_ros_pose(load_urdf(xml=chain_urdf(2)), q[0, :2])
    with pytest.raises(ValueError, match="missing field 'w'"):
        from_ros_pose({'position': {'x': 0, 'y': 0, 'z': 0},
                       'orientation': {'x': 0, 'y': 0, 'z': 0}})
