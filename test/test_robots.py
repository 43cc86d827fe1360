"""
Tests of ``diffsim_ros.robots``: the catalog API, the URDF files and the numbers in them.

Besides parsing every URDF with Pinocchio, MuJoCo and (once it exists) ``diffsim_ros.core``,
the arms are checked against independent implementations built directly from the published
tables:

* Barrett WAM: libbarrett's standard (distal) DH table and its link inertials, given in the DH
  frames (CoM and inertia about the CoM in frame i).  A small Newton-Euler recursion written in
  world coordinates computes joint torques and the tool position; Pinocchio on the URDF (whose
  link frames differ from the DH frames) must agree to 1e-9.
* Franka Panda: Franka's modified-DH (Craig) table and Gaz et al.'s identified inertials (CoM in
  frame i, inertia about the CoM with axes of frame i), same checks plus every link pose.
* Quanser and DFKI systems: mass matrix, gravity and full inverse dynamics against the closed-form
  models of Pyrado and of the DFKI documentation.

The reference numbers below are transcribed from the cited sources independently of the URDF
files; when the shared data folder is present they are also compared with its parameter files.
"""

import dataclasses
import json
import math
import xml.etree.ElementTree as ET

from diffsim_ros import robots
from diffsim_ros.core import rnea
from diffsim_ros.robots.catalog import RobotInfo
import numpy as np
import pytest
import torch

ALL = ('qube', 'cartpole', 'wam4', 'wam7', 'panda', 'double_pendulum', 'simple_pendulum')
G = 9.81
TOL = 1e-9

# Joint names of the drivers (ros2_control / joint_states names), in URDF order.
DRIVER_JOINTS = {
    'qube': ('arm_joint', 'pendulum_joint'),
    'cartpole': ('cart_joint', 'pole_joint'),
    'wam4': ('wam/base_yaw_joint', 'wam/shoulder_pitch_joint', 'wam/shoulder_yaw_joint',
             'wam/elbow_pitch_joint'),
    'wam7': ('wam/base_yaw_joint', 'wam/shoulder_pitch_joint', 'wam/shoulder_yaw_joint',
             'wam/elbow_pitch_joint', 'wam/wrist_yaw_joint', 'wam/wrist_pitch_joint',
             'wam/palm_yaw_joint'),
    'panda': tuple(f'panda_joint{i}' for i in range(1, 8)),
    'double_pendulum': ('shoulder_joint', 'elbow_joint'),
    'simple_pendulum': ('pendulum_joint',),
}

# --------------------------------------------------------------------------------------
# Reference data, transcribed from the sources
# --------------------------------------------------------------------------------------
# libbarrett config/wam4.conf, config/wam7w.conf (commit 109faf6066b3): standard DH
# (alpha, a, d) per joint and (mass, com in DH frame i, I about CoM in DH frame i).
WAM_DH = ((-math.pi / 2, 0.0, 0.0), (math.pi / 2, 0.0, 0.0), (-math.pi / 2, 0.045, 0.55),
          (math.pi / 2, -0.045, 0.0), (-math.pi / 2, 0.0, 0.3), (math.pi / 2, 0.0, 0.0),
          (0.0, 0.0, 0.0609))
_WAM_UPPER = (
    (10.7677, (-4.43e-3, 121.89e-3, -0.66e-3),
     ((134880.33e-6, -2130.41e-6, -124.85e-6), (-2130.41e-6, 113283.69e-6, 685.55e-6),
      (-124.85e-6, 685.55e-6, 90463.30e-6))),
    (3.8749, (-2.37e-3, 31.06e-3, 15.42e-3),
     ((21409.58e-6, 271.72e-6, 24.61e-6), (271.72e-6, 13778.75e-6, -1819.20e-6),
      (24.61e-6, -1819.20e-6, 15589.06e-6))),
    (1.8023, (-38.26e-3, 207.51e-3, 0.03e-3),
     ((59110.77e-6, -2496.12e-6, 7.38e-6), (-2496.12e-6, 3245.50e-6, -17.67e-6),
      (7.38e-6, -17.67e-6, 59270.43e-6))),
)
WAM4_LINKS = _WAM_UPPER + (
    (1.0651, (10.95e-3, -0.03e-3, 140.54e-3),
     ((18485.77e-6, 2.19e-6, -1608.68e-6), (2.19e-6, 18916.58e-6, 5.15e-6),
      (-1608.68e-6, 5.15e-6, 1975.17e-6))),
)
WAM7_LINKS = _WAM_UPPER + (
    (2.17266212, (0.00553408, 0.00006822, 0.11927695),
     ((0.01067491, 0.00004503, -0.00135557), (0.00004503, 0.01058659, -0.00011002),
      (-0.00135557, -0.00011002, 0.00282036))),
    (0.35655692, (0.00005483, 0.02886286, 0.00148493),
     ((0.00037112, -0.00000008, -0.00000003), (-0.00000008, 0.00019434, -0.00001613),
      (-0.00000003, -0.00001613, 0.00038209))),
    (0.40915886, (-0.00005923, -0.01686123, 0.02419052),
     ((0.00054889, 0.00000019, -0.00000010), (0.00000019, 0.00023846, -0.00004430),
      (-0.00000010, -0.00004430, 0.00045133))),
    (0.07548270, (0.00014836, 0.00007252, -0.00335185),
     ((0.00003911, 0.00000019, 0.0), (0.00000019, 0.00003877, 0.0), (0.0, 0.0, 0.00007614))),
)
WAM_TOOL_D = {4: 0.36, 7: 0.0}     # toolplate d (alpha = 0, a = 0)
WAM_BASE_HEIGHT = 0.346            # barrett_model: base_link to the shoulder (DH frame 0)

# Franka modified-DH (Craig): (a_{i-1}, d_i, alpha_{i-1}); flange d = 0.107 m.
PANDA_MDH = ((0.0, 0.333, 0.0), (0.0, 0.0, -math.pi / 2), (0.0, 0.316, math.pi / 2),
             (0.0825, 0.0, math.pi / 2), (-0.0825, 0.384, -math.pi / 2), (0.0, 0.0, math.pi / 2),
             (0.088, 0.0, math.pi / 2))
PANDA_FLANGE_D = 0.107
# Gaz et al. 2019, supplementary Tables VIII/IX, p_hat: mass, CoM (frame i), inertia about
# the CoM (xx, xy, xz, yy, yz, zz).  c1z is undetermined there (None).
PANDA_GAZ = (
    (4.970684, (3.875e-03, 2.081e-03, None),
     (7.0337e-01, -1.3900e-04, 6.7720e-03, 7.0661e-01, 1.9169e-02, 9.1170e-03)),
    (0.646926, (-3.141e-03, -2.872e-02, 3.495e-03),
     (7.9620e-03, -3.9250e-03, 1.0254e-02, 2.8110e-02, 7.0400e-04, 2.5995e-02)),
    (3.228604, (2.7518e-02, 3.9252e-02, -6.6502e-02),
     (3.7242e-02, -4.7610e-03, -1.1396e-02, 3.6155e-02, -1.2805e-02, 1.0830e-02)),
    (3.587895, (-5.317e-02, 1.04419e-01, 2.7454e-02),
     (2.5853e-02, 7.7960e-03, -1.3320e-03, 1.9552e-02, 8.6410e-03, 2.8323e-02)),
    (1.225946, (-1.1953e-02, 4.1065e-02, -3.8437e-02),
     (3.5549e-02, -2.1170e-03, -4.0370e-03, 2.9474e-02, 2.2900e-04, 8.6270e-03)),
    (1.666555, (6.0149e-02, -1.4117e-02, -1.0517e-02),
     (1.9640e-03, 1.0900e-04, -1.1580e-03, 4.3540e-03, 3.4100e-04, 5.4330e-03)),
    (0.735522, (1.0517e-02, -4.252e-03, 6.1597e-02),
     (1.2516e-02, -4.2800e-04, -1.1960e-03, 1.0027e-02, -7.4100e-04, 4.8150e-03)),
)

# Pyrado QQubeSim nominal domain parameters.
QUBE = {'Mr': 0.095, 'Lr': 0.085, 'Mp': 0.024, 'Lp': 0.129, 'Dr': 5e-6, 'Dp': 1e-6,
        'km': 0.042, 'Rm': 8.4}
# Quanser config_ip02.m (NO_LOAD) and Pyrado QCartPoleSim (short pole).
CARTPOLE = {'M': 0.57, 'm': 0.127, 'l': 0.3365 / 2, 'Beq': 4.3, 'Bp': 0.0024}
# DFKI double pendulum design A.0 model_2.0 (I about the joint axes).
DFKI_DP = {'m1': 0.5593806151425046, 'm2': 0.6043459469186889, 'l1': 0.3, 'l2': 0.2, 'r1': 0.3,
           'r2': 0.18377686083653508, 'I1': 0.053470810264216295, 'I2': 0.02392374528789766,
           'b': (0.001, 0.001), 'cf': (0.093, 0.078)}
# DFKI simple pendulum system identification (J about the joint axis).
DFKI_SP = {'J': 6.259e-2, 'mcx': 1.022e-1, 'Fv': 4.707e-2, 'Fc': 1.839e-1, 'm': 0.676}

# Link masses [kg] per robot, in URDF order of the massive links.
CITED_MASSES = {
    'qube': {'arm_link': QUBE['Mr'], 'pendulum_link': QUBE['Mp']},
    'cartpole': {'cart_link': CARTPOLE['M'], 'pole_link': CARTPOLE['m']},
    'wam4': dict(zip(('wam/shoulder_yaw_link', 'wam/shoulder_pitch_link', 'wam/upper_arm_link',
                      'wam/forearm_link'), (link[0] for link in WAM4_LINKS))),
    'wam7': dict(zip(('wam/shoulder_yaw_link', 'wam/shoulder_pitch_link', 'wam/upper_arm_link',
                      'wam/forearm_link', 'wam/wrist_yaw_link', 'wam/wrist_pitch_link',
                      'wam/wrist_palm_link'), (link[0] for link in WAM7_LINKS))),
    'panda': {f'panda_link{i + 1}': link[0] for i, link in enumerate(PANDA_GAZ)},
    'double_pendulum': {'upper_link': DFKI_DP['m1'], 'lower_link': DFKI_DP['m2']},
    'simple_pendulum': {'pendulum_link': DFKI_SP['m']},
}


# --------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------
def _root(name: str) -> ET.Element:
    return ET.fromstring(robots.urdf_string(name))


def _movable_joints(root: ET.Element) -> list:
    return [j for j in root.findall('joint') if j.get('type') != 'fixed']


def _inertials(root: ET.Element) -> dict:
    """Return {link: (mass, com, I_com in link axes)} for links with an <inertial>."""
    out = {}
    for link in root.findall('link'):
        inertial = link.find('inertial')
        if inertial is None:
            continue
        origin = inertial.find('origin')
        assert origin.get('rpy', '0 0 0').split() == ['0', '0', '0']
        com = np.array([float(v) for v in origin.get('xyz').split()])
        e = inertial.find('inertia')
        keys = ('ixx', 'ixy', 'ixz', 'iyy', 'iyz', 'izz')
        xx, xy, xz, yy, yz, zz = (float(e.get(k)) for k in keys)
        inertia = np.array([[xx, xy, xz], [xy, yy, yz], [xz, yz, zz]])
        out[link.get('name')] = (float(inertial.find('mass').get('value')), com, inertia)
    return out


def _pin():
    return pytest.importorskip('pinocchio')


def _pin_model(name: str):
    pin = _pin()
    model = pin.buildModelFromXML(robots.urdf_string(name))
    return pin, model, model.createData()


def _pin_q(model, q: np.ndarray) -> np.ndarray:
    """Map joint angles (one per joint, model order) to Pinocchio's configuration vector."""
    out = np.zeros(model.nq)
    for i, joint in enumerate(model.joints[1:]):
        if joint.nq == 2:       # continuous joint: (cos q, sin q)
            out[joint.idx_q:joint.idx_q + 2] = (math.cos(q[i]), math.sin(q[i]))
        else:
            out[joint.idx_q] = q[i]
    return out


def _random_state(n: int, seed: int, lower=None, upper=None):
    rng = np.random.default_rng(seed)
    if lower is None:
        q = rng.uniform(-math.pi, math.pi, n)
    else:
        q = rng.uniform(lower, upper)
    return q, rng.uniform(-2.0, 2.0, n), rng.uniform(-5.0, 5.0, n)


def _rot_x(a: float) -> np.ndarray:
    c, s = math.cos(a), math.sin(a)
    return np.array([[1.0, 0.0, 0.0], [0.0, c, -s], [0.0, s, c]])


def _rot_z(a: float) -> np.ndarray:
    c, s = math.cos(a), math.sin(a)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def _hom(R=np.eye(3), p=(0.0, 0.0, 0.0)) -> np.ndarray:
    T = np.eye(4)
    T[:3, :3] = R
    T[:3, 3] = p
    return T


def _newton_euler(points, axes, poses, links, qd, qdd, gravity=(0.0, 0.0, -G)):
    """
    Inverse dynamics of a serial chain of revolute joints, in world coordinates.

    Joint k turns body k about the world axis ``axes[k]`` through ``points[k]``; body k has
    world pose ``poses[k]`` (4x4) and ``links[k] = (mass, com, I_com)`` in that frame.
    Independent of Pinocchio: plain Newton-Euler with accelerations of points.
    """
    n = len(axes)
    w = np.zeros(3)
    dw = np.zeros(3)
    a_prev_point = -np.asarray(gravity, dtype=float)   # base acceleration trick
    prev_point = points[0]
    prev_w, prev_dw = np.zeros(3), np.zeros(3)
    a_com, w_all, dw_all, com_world, inertia_world = [], [], [], [], []
    for k in range(n):
        m, c, I_com = links[k]
        R, o = poses[k][:3, :3], poses[k][:3, 3]
        # acceleration of the joint point, seen as a point of the previous body
        r = points[k] - prev_point
        a_point = a_prev_point + np.cross(prev_dw, r) + np.cross(prev_w, np.cross(prev_w, r))
        w = prev_w + axes[k] * qd[k]
        dw = prev_dw + axes[k] * qdd[k] + np.cross(prev_w, axes[k] * qd[k])
        c_w = o + R @ np.asarray(c, dtype=float)
        rc = c_w - points[k]
        a_c = a_point + np.cross(dw, rc) + np.cross(w, np.cross(w, rc))
        a_com.append(a_c)
        w_all.append(w)
        dw_all.append(dw)
        com_world.append(c_w)
        inertia_world.append(R @ np.asarray(I_com, dtype=float) @ R.T)
        prev_w, prev_dw, prev_point, a_prev_point = w, dw, points[k], a_point
    tau = np.zeros(n)
    f_next, n_next, p_next = np.zeros(3), np.zeros(3), points[-1]
    for k in reversed(range(n)):
        m = links[k][0]
        F = m * a_com[k]
        N = inertia_world[k] @ dw_all[k] + np.cross(w_all[k], inertia_world[k] @ w_all[k])
        moment = (N + np.cross(com_world[k] - points[k], F) + n_next
                  + np.cross(p_next - points[k], f_next))
        tau[k] = moment @ axes[k]
        f_next, n_next, p_next = F + f_next, moment, points[k]
    return tau


def _wam_reference(dof: int, q, qd, qdd, links=None):
    """Standard-DH chain of libbarrett: joint torques and tool position."""
    T = _hom(p=(0.0, 0.0, WAM_BASE_HEIGHT))
    points, axes, poses = [], [], []
    for k in range(dof):
        alpha, a, d = WAM_DH[k]
        points.append(T[:3, 3].copy())
        axes.append(T[:3, 2].copy())          # joint k+1 turns about z of DH frame k
        T = T @ _hom(_rot_z(q[k])) @ _hom(p=(0.0, 0.0, d)) @ _hom(p=(a, 0.0, 0.0)) \
            @ _hom(_rot_x(alpha))
        poses.append(T.copy())               # link k+1 inertials are given in DH frame k+1
    if links is None:
        links = WAM4_LINKS if dof == 4 else WAM7_LINKS
    tool = T @ _hom(p=(0.0, 0.0, WAM_TOOL_D[dof]))
    return _newton_euler(points, axes, poses, links, qd, qdd), tool


def _panda_links(c1z: float) -> list:
    links = []
    for mass, com, (xx, xy, xz, yy, yz, zz) in PANDA_GAZ:
        com = tuple(c1z if v is None else v for v in com)
        links.append((mass, com, ((xx, xy, xz), (xy, yy, yz), (xz, yz, zz))))
    return links


def _panda_reference(q, qd, qdd, c1z: float = 0.0):
    """Modified-DH chain of Franka: joint torques, link poses and flange pose."""
    T = np.eye(4)
    points, axes, poses = [], [], []
    for k in range(7):
        a, d, alpha = PANDA_MDH[k]
        T = T @ _hom(_rot_x(alpha)) @ _hom(p=(a, 0.0, 0.0)) @ _hom(_rot_z(q[k])) \
            @ _hom(p=(0.0, 0.0, d))
        points.append(T[:3, 3].copy())       # joint k+1 turns about z of MDH frame k+1
        axes.append(T[:3, 2].copy())
        poses.append(T.copy())
    flange = T @ _hom(p=(0.0, 0.0, PANDA_FLANGE_D))
    return _newton_euler(points, axes, poses, _panda_links(c1z), qd, qdd), poses, flange


def _assert_close(actual, expected, what: str, tol: float = TOL) -> None:
    actual, expected = np.asarray(actual, dtype=float), np.asarray(expected, dtype=float)
    scale = max(1.0, float(np.abs(expected).max()))
    err = float(np.abs(actual - expected).max())
    assert err <= tol * scale, f'{what}: max error {err:.3e} > {tol * scale:.1e}\n' \
                               f'actual   {actual}\nexpected {expected}'


# --------------------------------------------------------------------------------------
# Catalog API
# --------------------------------------------------------------------------------------
def test_names_lists_every_robot():
    assert robots.names() == ALL


def test_get_returns_frozen_info():
    info = robots.get('qube')
    assert isinstance(info, RobotInfo)
    assert info.name == 'qube'
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.name = 'other'
    with pytest.raises(TypeError):
        info.motor['k_m'] = 1.0
    with pytest.raises(TypeError):
        info.friction['viscous'] = (0.0, 0.0)


def test_nested_catalog_mappings_are_read_only():
    nominal = robots.get('cartpole').motor['pyrado_nominal']
    with pytest.raises(TypeError):
        nominal['cart_mass'] = 1.0


@pytest.mark.parametrize('bad', ['nope', '', 'Qube', None, 3])
def test_unknown_name_lists_valid_names(bad):
    for function in (robots.get, robots.urdf_path, robots.urdf_string):
        with pytest.raises(ValueError) as info:
            function(bad)
        message = str(info.value)
        assert repr(bad) in message
        for name in ALL:
            assert name in message


def test_robot_info_rejects_inconsistent_entries():
    base = {'name': 'x', 'urdf_file': 'x.urdf', 'joint_names': ('a', 'b'),
            'command_joints': ('a',), 'driver_rate_hz': 100.0, 'command_unit': 'N m',
            'command_limit': (1.0, 0.0), 'controller_name': 'effort_controller',
            'base_link': 'base', 'end_effector_link': 'tip'}
    RobotInfo(**base)
    with pytest.raises(ValueError, match='command_limit'):
        RobotInfo(**{**base, 'command_limit': (1.0,)})
    with pytest.raises(ValueError, match='command_joints'):
        RobotInfo(**{**base, 'command_joints': ('c',)})
    with pytest.raises(ValueError, match='command_unit'):
        RobotInfo(**{**base, 'command_unit': 'Nm'})
    with pytest.raises(ValueError, match='armature'):
        RobotInfo(**{**base, 'motor': {'armature': (0.0,)}})


@pytest.mark.parametrize('name', ALL)
def test_catalog_entry_matches_urdf(name):
    info = robots.get(name)
    path = robots.urdf_path(name)
    assert path.is_file() and path.name == info.urdf_file
    root = _root(name)
    assert root.get('name') == name
    movable = _movable_joints(root)
    assert tuple(j.get('name') for j in movable) == DRIVER_JOINTS[name] == info.joint_names
    link_names = {link.get('name') for link in root.findall('link')}
    assert info.base_link in link_names and info.end_effector_link in link_names
    children = {j.find('child').get('link') for j in root.findall('joint')}
    assert info.base_link not in children, 'base link must be the URDF root'
    assert info.driver_rate_hz > 0 and info.controller_name == 'effort_controller'
    assert info.citations and all(isinstance(c, str) and c for c in info.citations)
    assert info.command_indices == tuple(info.joint_names.index(j) for j in info.command_joints)
    assert len(info.motor['armature']) == info.n_joints
    for joint, limit in zip(movable, info.command_limit):
        actuated = joint.get('name') in info.command_joints
        assert (limit > 0) == actuated
        if not actuated:
            assert joint.find('limit') is None, 'passive joints carry no <limit>'
        elif info.command_unit != 'V':
            assert limit <= float(joint.find('limit').get('effort')) + 1e-12


def test_expected_driver_settings():
    expect = {'qube': (500.0, 'V', (4.0, 0.0)), 'cartpole': (250.0, 'V', (8.0, 0.0)),
              'wam4': (500.0, 'N m', (25.0, 20.0, 15.0, 15.0)),
              'wam7': (500.0, 'N m', (25.0, 20.0, 15.0, 15.0, 5.0, 5.0, 5.0)),
              'panda': (1000.0, 'N m', (87.0,) * 4 + (12.0,) * 3),
              'double_pendulum': (500.0, 'N m', (10.0, 10.0)),
              'simple_pendulum': (300.0, 'N m', (12.0,))}
    for name, (rate, unit, limit) in expect.items():
        info = robots.get(name)
        assert (info.driver_rate_hz, info.command_unit, info.command_limit) == (rate, unit, limit)
    assert robots.get('panda').motor['driver_adds_gravity'] is True
    assert not any(robots.get(n).motor['driver_adds_gravity'] for n in ALL if n != 'panda')


def test_voltage_limits_map_to_urdf_efforts():
    qube = robots.get('qube')
    arm = _root('qube').find("joint[@name='arm_joint']/limit")
    tau_max = QUBE['km'] * qube.command_limit[0] / QUBE['Rm']
    assert float(arm.get('effort')) == pytest.approx(tau_max, rel=1e-14)
    assert qube.motor['max_torque_nm'] == pytest.approx(tau_max, rel=1e-14)
    cart = robots.get('cartpole')
    m = cart.motor
    limit = _root('cartpole').find("joint[@name='cart_joint']/limit")
    f_max = m['K_g'] * m['k_m'] * cart.command_limit[0] / (m['R_m'] * m['r_mp'])
    assert float(limit.get('effort')) == pytest.approx(f_max, rel=1e-14)
    v_max = cart.command_limit[0] * m['r_mp'] / (m['K_g'] * m['k_m'])
    assert float(limit.get('velocity')) == pytest.approx(v_max, rel=1e-14)


def test_cart_armature_is_the_rotor_inertia_reflected_through_gear_and_pinion():
    # Quanser config_ip02.m, typed here from the source rather than read from the catalog:
    # K_g = 3.71, J_m = 3.9e-7 kg m^2, r_mp = 6.35e-3 m, eta_g = 1.
    K_g, J_m, r_mp = 3.71, 3.9e-7, 6.35e-3
    # Same kinetic energy: the rotor turns at K_g xd / r_mp when the cart moves at xd, so
    # 0.5 J_m (K_g xd / r_mp)^2 = 0.5 m_reflected xd^2.
    xd = 0.37
    m_reflected = J_m * (K_g * xd / r_mp) ** 2 / xd ** 2
    assert robots.get('cartpole').motor['armature'] == pytest.approx((m_reflected, 0.0),
                                                                     rel=1e-12)
    model = robots.interface('cartpole').nominal_model()
    assert model.armature.tolist() == pytest.approx([m_reflected, 0.0], rel=1e-12)


@pytest.mark.parametrize('name', ALL)
def test_urdf_friction_matches_catalog(name):
    info = robots.get(name)
    movable = _movable_joints(_root(name))
    damping = [float(j.find('dynamics').get('damping')) if j.find('dynamics') is not None
               else 0.0 for j in movable]
    friction = [float(j.find('dynamics').get('friction')) if j.find('dynamics') is not None
                else 0.0 for j in movable]
    if 'viscous' in info.friction:
        assert damping == pytest.approx(info.friction['viscous'], rel=1e-14)
    else:
        assert damping == [0.0] * info.n_joints
    if 'coulomb_atan' in info.friction:     # atan model saturates at cf * pi / 2
        expected = [cf * math.pi / 2 for cf in info.friction['coulomb_atan']]
    else:
        expected = info.friction.get('coulomb', (0.0,) * info.n_joints)
    assert friction == pytest.approx(expected, rel=1e-14)


# --------------------------------------------------------------------------------------
# URDF content: masses, physical consistency, parsers
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize('name', ALL)
def test_masses_equal_cited_values(name):
    inertials = _inertials(_root(name))
    assert {link: values[0] for link, values in inertials.items()} == CITED_MASSES[name]


@pytest.mark.parametrize('name', ALL)
def test_bodies_are_physically_consistent(name):
    for link, (mass, com, inertia) in _inertials(_root(name)).items():
        moments = np.linalg.eigvalsh(inertia)
        assert mass > 0 and moments.min() > 0, link
        assert moments[0] + moments[1] >= moments[2] * (1 - 1e-12), link
        # pseudo-inertia about the CoM: 0.5 tr(I) E - I must be positive definite
        assert np.linalg.eigvalsh(0.5 * np.trace(inertia) * np.eye(3) - inertia).min() > 0, link


@pytest.mark.parametrize('name', ALL)
def test_pinocchio_parses_every_urdf(name):
    _, model, _ = _pin_model(name)
    assert tuple(model.names[1:]) == DRIVER_JOINTS[name]
    assert model.nv == len(DRIVER_JOINTS[name])
    total = sum(model.inertias[i].mass for i in range(1, model.njoints))
    assert total == pytest.approx(sum(CITED_MASSES[name].values()), rel=1e-14)


@pytest.mark.parametrize('name', ALL)
def test_core_loads_every_urdf(name):
    try:
        from diffsim_ros.core import load_urdf
    except ModuleNotFoundError as exc:       # only while the core does not exist yet
        if exc.name in ('diffsim_ros.core', 'torch'):
            pytest.skip(f'diffsim_ros.core is not importable yet ({exc.name})')
        raise
    import torch
    model = load_urdf(robots.urdf_path(name), dtype=torch.float64)
    info = robots.get(name)
    assert tuple(model.joint_names) == info.joint_names
    assert info.end_effector_link in model.link_names and info.base_link in model.link_names
    assert float(model.inertial[..., 0].sum()) == pytest.approx(
        sum(CITED_MASSES[name].values()), rel=1e-12)
    from_string = load_urdf(xml=robots.urdf_string(name), dtype=torch.float64)
    assert torch.equal(from_string.inertial, model.inertial)


@pytest.mark.parametrize('name', ALL)
def test_mujoco_matches_pinocchio(name):
    mujoco = pytest.importorskip('mujoco')
    pin, model, data = _pin_model(name)
    mj = mujoco.MjModel.from_xml_string(robots.urdf_string(name))
    info = robots.get(name)
    # the <mujoco> hint keeps fixed links (end effector) as bodies
    assert mujoco.mj_name2id(mj, mujoco.mjtObj.mjOBJ_BODY, info.end_effector_link) >= 0
    assert mj.body_mass.sum() == pytest.approx(sum(CITED_MASSES[name].values()), rel=1e-12)
    mj.dof_damping[:] = 0.0
    mj.dof_frictionloss[:] = 0.0
    mj.dof_armature[:] = 0.0
    mj_data = mujoco.MjData(mj)
    lower, upper = model.lowerPositionLimit, model.upperPositionLimit
    for seed in range(3):
        q, qd, qdd = _random_state(model.nv, seed)
        for i, joint in enumerate(model.joints[1:]):
            if joint.nq == 1 and math.isfinite(upper[joint.idx_q]):
                q[i] = np.random.default_rng(seed + 10 * i).uniform(
                    lower[joint.idx_q] + 1e-3, upper[joint.idx_q] - 1e-3)
        for i, joint_name in enumerate(info.joint_names):
            joint = mj.joint(joint_name)
            mj_data.qpos[joint.qposadr[0]] = q[i]
            mj_data.qvel[joint.dofadr[0]] = qd[i]
            mj_data.qacc[joint.dofadr[0]] = qdd[i]
        mujoco.mj_inverse(mj, mj_data)
        tau_mj = np.array([mj_data.qfrc_inverse[mj.joint(j).dofadr[0]]
                           for j in info.joint_names])
        tau_pin = pin.rnea(model, data, _pin_q(model, q), qd, qdd)
        _assert_close(tau_mj, tau_pin, f'{name} MuJoCo vs Pinocchio', tol=1e-8)


# --------------------------------------------------------------------------------------
# Barrett WAM: URDF frames vs libbarrett's standard DH frames
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize('dof', [4, 7])
def test_wam_matches_libbarrett_dh_dynamics(dof):
    pin, model, data = _pin_model(f'wam{dof}')
    tool_id = model.getFrameId('wam/tool_link')
    for seed in range(5):
        q, qd, qdd = _random_state(dof, seed)
        tau_ref, tool_ref = _wam_reference(dof, q, qd, qdd)
        tau = pin.rnea(model, data, q, qd, qdd)
        _assert_close(tau, tau_ref, f'wam{dof} RNEA seed {seed}')
        pin.forwardKinematics(model, data, q)
        pin.updateFramePlacements(model, data)
        _assert_close(data.oMf[tool_id].translation, tool_ref[:3, 3], f'wam{dof} tool position')
        _assert_close(data.oMf[tool_id].rotation, tool_ref[:3, :3], f'wam{dof} tool rotation')


def test_wam_reference_is_sensitive_to_frame_errors():
    """A CoM left in DH coordinates (the classic conversion mistake) is detected."""
    q, qd, qdd = _random_state(4, 0)
    tau_ref, _ = _wam_reference(4, q, qd, qdd)
    mass, com, inertia = WAM4_LINKS[2]
    wrong = WAM4_LINKS[:2] + ((mass, (com[0], com[2], com[1]), inertia),) + WAM4_LINKS[3:]
    tau_wrong, _ = _wam_reference(4, q, qd, qdd, links=wrong)
    assert np.abs(tau_wrong - tau_ref).max() > 1e-2


def test_wam_home_tool_position():
    """At q = 0 the arm points straight up: tool at the shoulder height plus both links."""
    pin, model, data = _pin_model('wam7')
    pin.forwardKinematics(model, data, np.zeros(7))
    pin.updateFramePlacements(model, data)
    tool = data.oMf[model.getFrameId('wam/tool_link')].translation
    _assert_close(tool, (0.0, 0.0, 0.346 + 0.55 + 0.3 + 0.0609), 'wam7 home')


# --------------------------------------------------------------------------------------
# Franka Panda: URDF frames vs Franka's modified-DH table, Gaz et al. inertials
# --------------------------------------------------------------------------------------
def test_panda_matches_franka_mdh_and_gaz_dynamics():
    pin, model, data = _pin_model('panda')
    lower, upper = model.lowerPositionLimit, model.upperPositionLimit
    for seed in range(5):
        q, qd, qdd = _random_state(7, seed, lower, upper)
        tau_ref, poses, flange = _panda_reference(q, qd, qdd)
        _assert_close(pin.rnea(model, data, q, qd, qdd), tau_ref, f'panda RNEA seed {seed}')
        pin.forwardKinematics(model, data, q)
        pin.updateFramePlacements(model, data)
        for k in range(7):
            placement = data.oMf[model.getFrameId(f'panda_link{k + 1}')]
            _assert_close(placement.homogeneous, poses[k], f'panda_link{k + 1} pose')
        _assert_close(data.oMf[model.getFrameId('panda_link8')].homogeneous, flange, 'flange')


def test_panda_c1z_does_not_enter_the_dynamics():
    """Gaz et al. leave c1z undetermined; the URDF's value must not matter."""
    q, qd, qdd = _random_state(7, 3)
    tau_a, _, _ = _panda_reference(q, qd, qdd, c1z=0.0)
    tau_b, _, _ = _panda_reference(q, qd, qdd, c1z=-0.3)
    _assert_close(tau_a, tau_b, 'c1z')


# --------------------------------------------------------------------------------------
# Quanser and DFKI systems against their closed-form models
# --------------------------------------------------------------------------------------
def _mass_gravity(name: str, q):
    pin, model, data = _pin_model(name)
    q_pin = _pin_q(model, np.asarray(q, dtype=float))
    M = pin.crba(model, data, q_pin)
    M = np.triu(M) + np.triu(M, 1).T
    g = pin.computeGeneralizedGravity(model, data, q_pin)
    return M, g, (pin, model, data, q_pin)


@pytest.mark.parametrize('alpha', [0.0, 0.4, math.pi / 2, 2.5, math.pi])
def test_qube_matches_pyrado_model(alpha):
    p = QUBE
    Jr, Jp = p['Mr'] * p['Lr'] ** 2 / 12, p['Mp'] * p['Lp'] ** 2 / 12
    inertials = _inertials(_root('qube'))
    i_axial = inertials['pendulum_link'][2][2, 2]
    M, g, _ = _mass_gravity('qube', (0.7, alpha))
    s, c = math.sin(alpha), math.cos(alpha)
    # Pyrado: a = Jr + Mp Lr^2 + Mp Lp^2 / 4 sin^2, b = Mp Lp Lr / 2 cos, c = Jp + Mp Lp^2 / 4;
    # a rigid rod adds (Jp - I_axial) sin^2 + I_axial (documented in qube.urdf)
    a_pyrado = Jr + p['Mp'] * p['Lr'] ** 2 + 0.25 * p['Mp'] * p['Lp'] ** 2 * s ** 2
    expected = np.array([
        [a_pyrado + (Jp - i_axial) * s ** 2 + i_axial, 0.5 * p['Mp'] * p['Lp'] * p['Lr'] * c],
        [0.5 * p['Mp'] * p['Lp'] * p['Lr'] * c, Jp + 0.25 * p['Mp'] * p['Lp'] ** 2]])
    _assert_close(M, expected, 'qube mass matrix', tol=1e-12)
    _assert_close(g, (0.0, 0.5 * p['Mp'] * p['Lp'] * G * s), 'qube gravity', tol=1e-12)


def test_cartpole_matches_pyrado_model():
    p = CARTPOLE
    J_pole = p['m'] * p['l'] ** 2 / 3
    for x, theta in ((0.0, 0.0), (0.1, 0.3), (-0.2, 2.0), (0.3, -math.pi)):
        M, g, (pin, model, data, q_pin) = _mass_gravity('cartpole', (x, theta))
        c, s = math.cos(theta), math.sin(theta)
        expected = np.array([[p['M'] + p['m'], p['m'] * p['l'] * c],
                             [p['m'] * p['l'] * c, J_pole + p['m'] * p['l'] ** 2]])
        _assert_close(M, expected, 'cart-pole mass matrix', tol=1e-12)
        _assert_close(g, (0.0, p['m'] * p['l'] * G * s), 'cart-pole gravity', tol=1e-12)
        # Coriolis: -m l sin(theta) theta_dot^2 on the cart (Pyrado's right-hand side)
        h = pin.nonLinearEffects(model, data, q_pin, np.array([0.4, 1.7]))
        _assert_close(h - g, (-p['m'] * p['l'] * s * 1.7 ** 2, 0.0), 'cart-pole Coriolis',
                      tol=1e-12)


def test_double_pendulum_matches_dfki_model():
    p = DFKI_DP
    for seed in range(4):
        q, qd, qdd = _random_state(2, seed)
        M, g, (pin, model, data, q_pin) = _mass_gravity('double_pendulum', q)
        c2, s2 = math.cos(q[1]), math.sin(q[1])
        k = p['l1'] * p['m2'] * p['r2']
        # docs/text/dynamics.rst without the rotor terms (Ir = 0)
        M_ref = np.array([[p['I1'] + p['I2'] + p['l1'] ** 2 * p['m2'] + 2 * k * c2,
                           p['I2'] + k * c2], [p['I2'] + k * c2, p['I2']]])
        C_ref = np.array([[-2 * k * s2 * qd[1], -k * s2 * qd[1]], [k * s2 * qd[0], 0.0]])
        g_ref = np.array([
            G * p['m1'] * p['r1'] * math.sin(q[0])
            + G * p['m2'] * (p['l1'] * math.sin(q[0]) + p['r2'] * math.sin(q[0] + q[1])),
            G * p['m2'] * p['r2'] * math.sin(q[0] + q[1])])
        _assert_close(M, M_ref, 'double pendulum mass matrix', tol=1e-12)
        _assert_close(g, g_ref, 'double pendulum gravity', tol=1e-12)
        tau = pin.rnea(model, data, q_pin, qd, qdd)
        _assert_close(tau, M_ref @ qdd + C_ref @ qd + g_ref, 'double pendulum RNEA', tol=1e-12)


def test_simple_pendulum_matches_dfki_identification():
    p = DFKI_SP
    for q in (0.0, 0.5, 2.0, -3.0):
        M, g, _ = _mass_gravity('simple_pendulum', (q,))
        _assert_close(M, [[p['J']]], 'simple pendulum inertia', tol=1e-12)
        _assert_close(g, [p['mcx'] * G * math.sin(q)], 'simple pendulum gravity', tol=1e-12)


@pytest.mark.parametrize('name,tip,length', [
    ('qube', 'pendulum_tip', None), ('cartpole', 'pole_tip', 0.3365),
    ('double_pendulum', 'ee_link', None), ('simple_pendulum', 'pendulum_tip', 0.5)])
def test_pendulum_tip_conventions(name, tip, length):
    """Angles follow the data conventions: 0 hanging down, positive towards the documented side."""
    pin, model, data = _pin_model(name)
    frame = model.getFrameId(tip)

    def tip_at(*q):
        pin.forwardKinematics(model, data, _pin_q(model, np.array(q, dtype=float)))
        pin.updateFramePlacements(model, data)
        return data.oMf[frame].translation.copy()

    if name == 'qube':
        th, al = 0.3, 0.8   # Pyrado's animation formula
        expected = (QUBE['Lr'] * math.cos(th) - QUBE['Lp'] * math.sin(al) * math.sin(th),
                    QUBE['Lr'] * math.sin(th) + QUBE['Lp'] * math.sin(al) * math.cos(th),
                    -QUBE['Lp'] * math.cos(al))
        _assert_close(tip_at(th, al), expected, 'qube tip')
    elif name == 'cartpole':
        _assert_close(tip_at(0.1, 0.6), (0.1 + length * math.sin(0.6), 0.0,
                                         -length * math.cos(0.6)), 'cart-pole tip')
    elif name == 'double_pendulum':
        q1, q2 = 0.4, -1.1
        expected = (DFKI_DP['l1'] * math.sin(q1) + DFKI_DP['l2'] * math.sin(q1 + q2), 0.0,
                    -DFKI_DP['l1'] * math.cos(q1) - DFKI_DP['l2'] * math.cos(q1 + q2))
        _assert_close(tip_at(q1, q2), expected, 'double pendulum tip')
    else:
        _assert_close(tip_at(0.9), (length * math.sin(0.9), 0.0, -length * math.cos(0.9)),
                      'simple pendulum tip')


# --------------------------------------------------------------------------------------
# The transcribed reference numbers against the staged parameter files
# --------------------------------------------------------------------------------------
def test_reference_constants_match_shared_parameter_files(data_dir):
    wam_file = data_dir / 'wam_reference_parameters' / 'barrett_wam_inertial_specs_libbarrett.json'
    gaz_file = data_dir / 'panda_gaz2019_excitation' / 'gaz2019_identified_parameters.json'
    if not (wam_file.is_file() and gaz_file.is_file()):
        pytest.skip('parameter files not staged in the data directory')
    wam = json.loads(wam_file.read_text())
    for key, links in (('wam_4dof', WAM4_LINKS), ('wam_7dof_wrist', WAM7_LINKS)):
        table = wam[key]
        for k, row in enumerate(table['dh_standard']):
            assert (row['alpha_rad'], row['a_m'], row['d_m']) == pytest.approx(WAM_DH[k])
        for (mass, com, inertia), src in zip(links, table['links'], strict=True):
            assert mass == pytest.approx(src['mass_kg'], rel=1e-12)
            assert np.allclose(com, src['com_m'], rtol=0, atol=1e-12)
            assert np.allclose(inertia, src['inertia_at_com_kgm2'], rtol=0, atol=1e-12)
    gaz = json.loads(gaz_file.read_text())
    kin = gaz['kinematics_craig_mdh']
    assert [row[0] for row in PANDA_MDH] == kin['a']
    assert [row[1] for row in PANDA_MDH] == kin['d']
    assert [row[2] for row in PANDA_MDH] == pytest.approx(kin['alpha'])
    assert PANDA_FLANGE_D == kin['d_flange']
    p_hat = gaz['p_hat_penalty_method']
    assert [link[0] for link in PANDA_GAZ] == p_hat['mass']
    assert [list(link[1]) for link in PANDA_GAZ] == p_hat['com']
    assert [list(link[2]) for link in PANDA_GAZ] == p_hat['inertia_xx_xy_xz_yy_yz_zz']
    friction = robots.get('panda').friction
    for key in ('phi1', 'phi2', 'phi3'):
        table_key = {'phi1': 'phi1_Nm', 'phi2': 'phi2_s_per_rad', 'phi3': 'phi3_rad_per_s'}[key]
        assert list(friction[key]) == gaz['friction_sigmoid_tableI'][table_key]
    linear = gaz['friction_linear_tableIII']
    assert list(friction['viscous']) == linear['fv_OSI']
    assert list(friction['coulomb']) == linear['fc_OSI']
    assert list(friction['offset']) == linear['fo_OSI']


# -- the robot interface -----------------------------------------------------------------

def _state(n, seed):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(4, n, generator=generator, dtype=torch.float64),
            torch.randn(4, n, generator=generator, dtype=torch.float64))


@pytest.mark.parametrize('name', ALL)
def test_interface_nominal_model_is_cached_consistent_and_shared(name):
    from diffsim_ros.sim.parameters import nominal_model
    interface = robots.interface(name)
    model = interface.nominal_model()
    assert robots.interface(name) is interface and interface.nominal_model() is model
    assert nominal_model(name) is model
    assert model.dtype == torch.float64 and model.device.type == 'cpu'
    assert model.joint_names == robots.get(name).joint_names
    assert interface.check_model(model, interface.actuator()) == []
    limits = interface.limits()
    assert torch.equal(limits['travel'], model.upper - model.lower)


def test_qube_voltage_map_is_the_cited_motor_equation_and_inverts():
    # tau_arm = k_m (V - k_m qd_arm) / R_m with k_m = 0.042, R_m = 8.4 (Quanser manual).
    qube = robots.interface('qube')
    model = qube.nominal_model()
    q, qd = _state(2, 0)
    volts = torch.linspace(-4.0, 4.0, 4, dtype=torch.float64)[:, None]
    tau = qube.motor_torque(model, q, qd, volts)
    expected = 0.042 * (volts[:, 0] - 0.042 * qd[:, 0]) / 8.4
    assert torch.allclose(tau[:, 0], expected, rtol=1e-13, atol=0.0)
    assert torch.equal(tau[:, 1], torch.zeros(4, dtype=torch.float64))
    assert torch.allclose(qube.command(model, q, qd, tau), volts, rtol=1e-12, atol=1e-15)
    # net torque subtracts the URDF's viscous damping
    net = qube.torque_fn(model)(q, qd, volts)
    assert torch.allclose(net, tau - model.damping * qd, rtol=1e-13, atol=1e-18)


def test_panda_driver_adds_gravity_and_the_inverse_removes_it():
    panda = robots.interface('panda')
    model = panda.nominal_model()
    q, qd = _state(7, 1)
    u = torch.randn(4, 7, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    zero = torch.zeros_like(q)
    gravity = rnea(model, q, zero, zero)
    assert torch.allclose(panda.motor_torque(model, q, qd, u), u + gravity, atol=1e-12)
    assert torch.allclose(panda.command(model, q, qd, u + gravity), u, atol=1e-12)
    assert panda.driver_adds_gravity and not robots.interface('wam7').driver_adds_gravity


def _scaled(model, body, factor):
    inertial = model.inertial.clone()
    inertial[body] = inertial[body] * factor
    return model.replace(inertial=inertial)


def test_check_model_refuses_implausible_and_inconsistent_models():
    qube = robots.interface('qube')
    model = qube.nominal_model()
    pendulum = model.tree.body_links.index('pendulum_link')
    for factor in (1000.0, 1e6, 1e-9):
        problems = qube.check_model(_scaled(model, pendulum, factor))
        assert any(p.startswith('pendulum_link/m ') for p in problems), (factor, problems)
    assert qube.check_model(_scaled(model, pendulum, 1.5)) == []
    damping = model.damping.clone()
    damping[1] = -1e-6
    assert any('pendulum_joint/damping' in p for p in
               qube.check_model(model.replace(damping=damping)))
    # a point mass off the joint axis: no rotational inertia of its own, not a body
    inertial = model.inertial.clone()
    inertial[pendulum, 4:] = 0.0
    assert any('not physically consistent' in p for p in
               qube.check_model(model.replace(inertial=inertial)))
    nan = model.inertial.clone()
    nan[0, 0] = math.nan
    assert any('not finite' in p for p in qube.check_model(model.replace(inertial=nan)))
    other = robots.interface('cartpole').nominal_model()
    assert 'differ from the nominal' in qube.check_model(other)[0]
    strong = robots.interface('qube').actuator()
    with torch.no_grad():
        strong.log_motor_constant += math.log(5.0)
    assert any('arm_joint/motor_constant' in p for p in qube.check_model(model, strong))


def test_parameter_bounds_cover_every_named_parameter():
    from diffsim_ros.sysid.result import inertial_parameters, joint_parameters
    qube = robots.interface('qube')
    model = qube.nominal_model()
    bounds = qube.parameter_bounds()
    names = set(inertial_parameters(model))
    names |= set(joint_parameters(model, 'damping', model.damping))
    assert names <= set(bounds)
    assert {'arm_joint/motor_constant', 'arm_joint/resistance'} <= set(bounds)
    # relative where the nominal is informative, absolute where it is not (module docstring)
    assert bounds['pendulum_link/m'] == pytest.approx((0.024 / 3.0, 0.024 * 3.0))
    assert bounds['pendulum_joint/coulomb'][1] > 0.0 == float(model.friction[1])


@pytest.mark.parametrize('name', ALL)
def test_plausibility_bounds_admit_every_plant_the_simulator_samples(name):
    # The demo accepts --param-error below 1: bounds that refused such plants would refuse
    # the identifier's correct answers about them.
    from diffsim_ros.sim.parameters import TrueParameters
    interface = robots.interface(name)
    for seed in range(5):
        true = TrueParameters.sample(name, 0.9, torch.Generator().manual_seed(seed))
        assert interface.check_model(true.as_model()) == [], seed
