"""
Random URDF robots and their Pinocchio / MuJoCo counterparts, for reference tests.

The generator draws kinematic trees (not only chains) with revolute, continuous, prismatic
and fixed joints, arbitrary unit axes, arbitrary joint and inertial origins and physically
consistent inertias, and writes them as URDF strings with every number printed to full
double precision, so that every parser reads exactly the same robot.

The mapping helpers translate between our joint order (``model.joint_names``) and the
coordinate layouts of Pinocchio (continuous joints use ``nq = 2``: ``(cos q, sin q)``) and
MuJoCo (``qpos``/``qvel`` addresses per named joint).
"""

from dataclasses import dataclass
import math
from pathlib import Path
import re
from typing import Optional, Sequence
import xml.etree.ElementTree as ET
import zlib

import numpy as np
import torch

MOVABLE_TYPES = ('revolute', 'continuous', 'prismatic')
#: Name of the free-flyer joint (ours and Pinocchio's).
FREE_FLYER = 'root_joint'
JOINT_TYPES = MOVABLE_TYPES + ('fixed',)
#: Agreement required with Pinocchio and MuJoCo, relative to max(1, |reference|), float64.
TOL = 1e-9


@dataclass(frozen=True)
class LinkSpec:
    """
    One URDF link with its inertial element.

    :param name: link name.
    :param mass: mass in kg.
    :param com: centre of mass in the link frame (inertial origin xyz), m.
    :param rpy: inertial origin rpy, rad (frame in which ``inertia`` is expressed).
    :param inertia: (3, 3) inertia about the CoM in the rotated inertial frame, kg m^2.
    """

    name: str
    mass: float
    com: np.ndarray
    rpy: np.ndarray
    inertia: np.ndarray


@dataclass(frozen=True)
class JointSpec:
    """
    One URDF joint.

    :param name: joint name.
    :param kind: joint type, one of ``JOINT_TYPES``.
    :param parent: parent link name.
    :param child: child link name.
    :param xyz: origin translation, m.
    :param rpy: origin roll-pitch-yaw, rad.
    :param axis: unit joint axis in the joint frame.
    :param lower: lower position limit (revolute, prismatic).
    :param upper: upper position limit (revolute, prismatic).
    :param effort: effort limit.
    :param velocity: velocity limit.
    :param damping: viscous damping coefficient.
    :param friction: Coulomb friction coefficient.
    """

    name: str
    kind: str
    parent: str
    child: str
    xyz: np.ndarray
    rpy: np.ndarray
    axis: np.ndarray
    lower: float
    upper: float
    effort: float
    velocity: float
    damping: float
    friction: float


@dataclass(frozen=True)
class RobotSpec:
    """
    A whole random robot: links (root first) and joints (each joint's parent exists).

    :param name: robot name.
    :param links: all links, the root link first.
    :param joints: all joints, in creation order.
    """

    name: str
    links: tuple
    joints: tuple

    @property
    def movable_joint_names(self) -> tuple:
        """
        Names of the movable joints, in creation order.

        :return: tuple of joint names.
        """
        return tuple(j.name for j in self.joints if j.kind != 'fixed')

    @property
    def root(self) -> str:
        """
        Name of the root link.

        :return: link name.
        """
        return self.links[0].name


def _fmt(x: float) -> str:
    """Print a float so that parsing it back gives the same double."""
    return format(float(x), '.17g')


def _vec(v: Sequence[float]) -> str:
    return ' '.join(_fmt(x) for x in v)


def rpy_to_matrix(rpy: Sequence[float]) -> np.ndarray:
    """
    Rotation matrix of URDF fixed-axis roll-pitch-yaw, ``Rz(yaw) Ry(pitch) Rx(roll)``.

    :param rpy: (3,) roll, pitch, yaw in rad.
    :return: (3, 3) rotation matrix.
    """
    r, p, y = rpy
    cr, sr, cp, sp, cy, sy = (math.cos(r), math.sin(r), math.cos(p), math.sin(p),
                              math.cos(y), math.sin(y))
    rx = np.array([[1.0, 0.0, 0.0], [0.0, cr, -sr], [0.0, sr, cr]])
    ry = np.array([[cp, 0.0, sp], [0.0, 1.0, 0.0], [-sp, 0.0, cp]])
    rz = np.array([[cy, -sy, 0.0], [sy, cy, 0.0], [0.0, 0.0, 1.0]])
    return rz @ ry @ rx


def random_rotation(rng: np.random.Generator) -> np.ndarray:
    """
    Draw a uniformly distributed rotation matrix.

    :param rng: random generator.
    :return: (3, 3) rotation matrix with determinant +1.
    """
    q, r = np.linalg.qr(rng.standard_normal((3, 3)))
    q = q * np.sign(np.diag(r))
    if np.linalg.det(q) < 0.0:
        q[:, 0] = -q[:, 0]
    return q


def random_unit_axis(rng: np.random.Generator, p_aligned: float = 0.25) -> np.ndarray:
    """
    Draw a joint axis: usually a random unit vector, sometimes +-x, +-y or +-z.

    Aligned axes exercise Pinocchio's specialised joint types, random ones its
    ``Unaligned`` joints.

    :param rng: random generator.
    :param p_aligned: probability of a coordinate axis.
    :return: (3,) unit vector.
    """
    if rng.random() < p_aligned:
        axis = np.zeros(3)
        axis[rng.integers(3)] = rng.choice([-1.0, 1.0])
        return axis
    v = rng.standard_normal(3)
    return v / np.linalg.norm(v)


def random_link(rng: np.random.Generator, name: str) -> LinkSpec:
    """
    Draw a link with a physically consistent, generic inertial.

    Principal moments are built as ``tr(S) - s_i`` from positive second moments ``s``,
    which makes them satisfy the strict triangle inequality; the principal frame and the
    inertial origin rpy are both random, so the URDF inertia has off-diagonal terms.

    :param rng: random generator.
    :param name: link name.
    :return: the link.
    """
    mass = float(rng.uniform(0.2, 5.0))
    com = rng.uniform(-0.2, 0.2, 3)
    radii = rng.uniform(0.02, 0.25, 3)
    second_moments = mass * radii ** 2
    principal = second_moments.sum() - second_moments
    rotation = random_rotation(rng)
    inertia = rotation @ np.diag(principal) @ rotation.T
    inertia = 0.5 * (inertia + inertia.T)
    rpy = rng.uniform(-math.pi, math.pi, 3) if rng.random() < 0.8 else np.zeros(3)
    return LinkSpec(name=name, mass=mass, com=com, rpy=rpy, inertia=inertia)


def random_robot(rng: np.random.Generator, n_movable: Optional[int] = None,
                 max_movable: int = 7, n_fixed: Optional[int] = None,
                 name: str = 'random_robot') -> RobotSpec:
    """
    Draw a random kinematic tree.

    Each new joint attaches a new link to an existing one, usually the newest (long
    chains) and otherwise any (branches); fixed joints are mixed in, so they occur in the
    middle of chains and as leaves.

    :param rng: random generator.
    :param n_movable: number of movable joints; drawn from ``1..max_movable`` if None.
    :param max_movable: upper bound when drawing ``n_movable``.
    :param n_fixed: number of fixed joints; drawn from ``0..3`` if None.
    :param name: robot name.
    :return: the robot specification.
    """
    if n_movable is None:
        n_movable = int(rng.integers(1, max_movable + 1))
    if n_fixed is None:
        n_fixed = int(rng.integers(0, 4))
    types = [str(t) for t in rng.choice(MOVABLE_TYPES, size=n_movable)] + ['fixed'] * n_fixed
    rng.shuffle(types)
    links = [random_link(rng, 'base_link')]
    joints = []
    for i, joint_type in enumerate(types):
        if rng.random() < 0.6:
            parent = links[-1].name
        else:
            parent = links[int(rng.integers(len(links)))].name
        child = random_link(rng, f'link_{i + 1}')
        if joint_type == 'prismatic':
            lower = float(rng.uniform(-1.0, 0.0))
            upper = float(rng.uniform(0.1, 1.0))
        else:
            lower = float(rng.uniform(-3.0, 0.0))
            upper = float(rng.uniform(0.1, 3.0))
        xyz = rng.uniform(-0.5, 0.5, 3)
        rpy = rng.uniform(-math.pi, math.pi, 3) if rng.random() < 0.85 else np.zeros(3)
        joints.append(JointSpec(
            name=f'joint_{i + 1}_{joint_type}', kind=joint_type, parent=parent,
            child=child.name, xyz=xyz, rpy=rpy, axis=random_unit_axis(rng),
            lower=lower, upper=upper, effort=float(rng.uniform(5.0, 100.0)),
            velocity=float(rng.uniform(1.0, 10.0)), damping=float(rng.uniform(0.0, 2.0)),
            friction=float(rng.uniform(0.0, 1.0))))
        links.append(child)
    return RobotSpec(name=name, links=tuple(links), joints=tuple(joints))


def robot_to_urdf(spec: RobotSpec) -> str:
    """
    Write a robot specification as a URDF string.

    :param spec: the robot.
    :return: URDF XML.
    """
    lines = ['<?xml version="1.0"?>', f'<robot name="{spec.name}">']
    for link in spec.links:
        inertia = link.inertia
        lines += [
            f'  <link name="{link.name}">',
            '    <inertial>',
            f'      <origin xyz="{_vec(link.com)}" rpy="{_vec(link.rpy)}"/>',
            f'      <mass value="{_fmt(link.mass)}"/>',
            f'      <inertia ixx="{_fmt(inertia[0, 0])}" ixy="{_fmt(inertia[0, 1])}"'
            f' ixz="{_fmt(inertia[0, 2])}" iyy="{_fmt(inertia[1, 1])}"'
            f' iyz="{_fmt(inertia[1, 2])}" izz="{_fmt(inertia[2, 2])}"/>',
            '    </inertial>',
            '  </link>']
    for joint in spec.joints:
        lines += [
            f'  <joint name="{joint.name}" type="{joint.kind}">',
            f'    <parent link="{joint.parent}"/>',
            f'    <child link="{joint.child}"/>',
            f'    <origin xyz="{_vec(joint.xyz)}" rpy="{_vec(joint.rpy)}"/>']
        if joint.kind != 'fixed':
            lines.append(f'    <axis xyz="{_vec(joint.axis)}"/>')
            bounds = ''
            if joint.kind != 'continuous':
                bounds = f' lower="{_fmt(joint.lower)}" upper="{_fmt(joint.upper)}"'
            lines += [
                f'    <limit effort="{_fmt(joint.effort)}" velocity="{_fmt(joint.velocity)}"'
                f'{bounds}/>',
                f'    <dynamics damping="{_fmt(joint.damping)}"'
                f' friction="{_fmt(joint.friction)}"/>']
        lines.append('  </joint>')
    lines.append('</robot>')
    return '\n'.join(lines) + '\n'


def random_urdf(rng: np.random.Generator, **kwargs) -> str:
    """
    Draw a random robot and return its URDF.

    :param rng: random generator.
    :param kwargs: forwarded to :func:`random_robot`.
    :return: URDF XML.
    """
    return robot_to_urdf(random_robot(rng, **kwargs))


RANDOM_SEEDS = tuple(range(30))


def seeded_robot(seed: int, **kwargs) -> RobotSpec:
    """
    Draw the random robot of a fixed seed (shared by every reference test).

    :param seed: seed of ``numpy.random.default_rng``.
    :param kwargs: forwarded to :func:`random_robot`.
    :return: the robot specification, named ``random_<seed>``.
    """
    return random_robot(np.random.default_rng(seed), name=f'random_{seed}', **kwargs)


def state_rng(label: str) -> np.random.Generator:
    """
    Return a generator seeded from a test label, for reproducible random states.

    :param label: any string, e.g. the test case id.
    :return: a fresh generator.
    """
    return np.random.default_rng(zlib.crc32(label.encode()))


def urdf_joint_types(xml: str) -> dict:
    """
    Read the type of every joint of a URDF.

    :param xml: URDF XML.
    :return: mapping joint name -> type string.
    """
    root = ET.fromstring(xml)
    return {j.get('name'): j.get('type') for j in root.iter('joint')}


def random_state(rng: np.random.Generator, joint_types: Sequence[str],
                 batch: tuple = (), velocity_scale: float = 2.0) -> tuple:
    """
    Draw joint positions, velocities and accelerations/torques for the given joints.

    Revolute and continuous positions are drawn from [-pi, pi] (beyond the URDF limits on
    purpose: rigid-body dynamics ignores them), prismatic ones from [-0.5, 0.5].

    :param rng: random generator.
    :param joint_types: type of each movable joint, in our joint order.
    :param batch: leading batch shape.
    :param velocity_scale: standard deviation of the velocities.
    :return: ``(q, qd, x)`` arrays of shape ``batch + (n,)``; ``x`` is a standard normal draw
        scaled by 3, usable as accelerations or torques.
    """
    n = len(joint_types)
    shape = tuple(batch) + (n,)
    span = np.array([0.5 if t == 'prismatic' else math.pi for t in joint_types])
    q = rng.uniform(-1.0, 1.0, shape) * span
    qd = velocity_scale * rng.standard_normal(shape)
    x = 3.0 * rng.standard_normal(shape)
    return q, qd, x


# --------------------------------------------------------------------------------------
# Test cases: shipped robots and seeded random trees
# --------------------------------------------------------------------------------------

REPO_ROOT = Path(__file__).resolve().parent.parent
CORE_API = ('load_urdf', 'rnea', 'aba', 'crba', 'forward_kinematics')


def require_core(*optional: str):
    """
    Import ``diffsim_ros.core`` or skip the calling test when it is not there yet.

    Skips only while the core's source is absent from this repository; a core that is
    there but cannot be imported (e.g. the package is not installed: run
    ``python -m pytest`` from the repository root or ``pip install -e .``) is an error.

    :param optional: further names the test needs; it is skipped unless the core lists
        them in ``__all__`` (or exposes them, when it has no ``__all__``).
    :return: the ``diffsim_ros.core`` module.
    """
    import importlib
    import pytest
    if not (REPO_ROOT / 'diffsim_ros' / 'core' / '__init__.py').is_file():
        pytest.skip('diffsim_ros.core is not written yet')
    core = importlib.import_module('diffsim_ros.core')
    missing = [name for name in CORE_API if not hasattr(core, name)]
    if missing:
        pytest.skip(f'diffsim_ros.core does not export {missing} yet')
    exported = getattr(core, '__all__', dir(core))
    absent = [name for name in optional if name not in exported]
    if absent:
        pytest.skip(f'diffsim_ros.core does not export {absent}')
    return core


def shipped_robot_names() -> tuple:
    """
    Return the names of the robots shipped in ``diffsim_ros.robots``.

    :return: names, or an empty tuple while the package's source is absent from this
        repository.
    """
    import importlib
    if not (REPO_ROOT / 'diffsim_ros' / 'robots' / '__init__.py').is_file():
        return ()
    return tuple(importlib.import_module('diffsim_ros.robots').names())


def reference_cases(seeds: Sequence[int] = RANDOM_SEEDS) -> list:
    """
    Build ``pytest.param`` cases: every shipped robot, then the seeded random trees.

    A broken robots package gives one failing case instead of a collection error, so the
    random-tree cases still run.

    :param seeds: seeds of the random trees.
    :return: list of ``pytest.param`` holding ``('robot', name)`` or ``('seed', seed)``.
    """
    import pytest
    try:
        names = shipped_robot_names()
    except Exception as exc:  # reported by the case itself, not at collection
        cases = [pytest.param(('error', f'diffsim_ros.robots: {exc!r}'), id='robots-error')]
    else:
        cases = [pytest.param(('robot', name), id=name) for name in names]
        if not names:
            cases = [pytest.param(('robot', None), id='robots-missing', marks=pytest.mark.skip(
                reason='diffsim_ros.robots is not written yet'))]
    return cases + [pytest.param(('seed', seed), id=f'random{seed}') for seed in seeds]


def case_urdf(case: tuple) -> str:
    """
    Return the URDF of a case from :func:`reference_cases`.

    :param case: ``('robot', name)`` or ``('seed', seed)``.
    :return: URDF XML.
    """
    import importlib
    import pytest
    kind, value = case
    if kind == 'error':
        pytest.fail(value)
    if kind == 'robot':
        return importlib.import_module('diffsim_ros.robots').urdf_string(value)
    return robot_to_urdf(seeded_robot(value))


def joint_types_of(xml: str, joint_names: Sequence[str]) -> list:
    """
    Return the URDF type of each named joint.

    :param xml: URDF XML.
    :param joint_names: joint names, e.g. ``model.joint_names``.
    :return: list of type strings in the same order.
    """
    types = urdf_joint_types(xml)
    return [types[name] for name in joint_names]


# --------------------------------------------------------------------------------------
# Pinocchio
# --------------------------------------------------------------------------------------

def pinocchio_model(xml: str, floating_base: bool = False) -> tuple:
    """
    Build a Pinocchio model and data from a URDF string.

    :param xml: URDF XML.
    :param floating_base: mount the root link on a ``JointModelFreeFlyer`` (named
        ``'root_joint'``, as ``load_urdf(..., floating_base=True)`` names it).
    :return: ``(pin_model, pin_data)``.
    """
    import pinocchio as pin
    if floating_base:
        pin_model = pin.buildModelFromXML(xml, pin.JointModelFreeFlyer())
    else:
        pin_model = pin.buildModelFromXML(xml)
    return pin_model, pin_model.createData()


def random_floating_state(rng: np.random.Generator, joint_types: Sequence[str],
                          batch: tuple = (), velocity_scale: float = 2.0) -> tuple:
    """
    Draw a floating-base state: a random root pose, then :func:`random_state`'s joints.

    :param rng: random generator.
    :param joint_types: type of each 1-DOF joint (the free-flyer excluded), our order.
    :param batch: leading batch shape.
    :param velocity_scale: standard deviation of the velocities.
    :return: ``(q, v, x)`` of shapes ``batch + (nq,)``, ``batch + (nv,)``, ``batch + (nv,)``:
        ``q = [p (uniform in [-1, 1] m), unit quaternion (x, y, z, w), joints]``.
    """
    q, qd, x = random_state(rng, joint_types, batch, velocity_scale)
    batch = tuple(batch)
    position = rng.uniform(-1.0, 1.0, batch + (3,))
    quaternion = rng.standard_normal(batch + (4,))
    quaternion /= np.linalg.norm(quaternion, axis=-1, keepdims=True)
    twist = velocity_scale * rng.standard_normal(batch + (6,))
    wrench = 3.0 * rng.standard_normal(batch + (6,))
    return (np.concatenate((position, quaternion, q), -1), np.concatenate((twist, qd), -1),
            np.concatenate((wrench, x), -1))


class PinocchioMap:
    """
    Translate between our joint order and a Pinocchio model's coordinates.

    A free-flyer named ``'root_joint'`` first in ``joint_names`` (our floating base) takes
    our ``q[:7]`` (position, quaternion x y z w) and ``v[:6]`` (linear, angular) as they
    are: the layouts are the same.
    """

    def __init__(self, pin_model, joint_names: Sequence[str]) -> None:
        """
        Index the Pinocchio joints of the given names.

        :param pin_model: Pinocchio model.
        :param joint_names: our movable joints, in our order (``'root_joint'`` first for a
            floating base).
        :raises ValueError: a name is unknown to Pinocchio, a joint is not one-dof, or the
            model has other degrees of freedom.
        """
        self.joint_names = tuple(joint_names)
        self.nq = pin_model.nq
        self.nv = pin_model.nv
        self.root_q = None
        idx_v_root = []
        names = self.joint_names
        if names[:1] == (FREE_FLYER,):
            jid = pin_model.getJointId(FREE_FLYER)
            if (pin_model.nqs[jid], pin_model.nvs[jid]) != (7, 6):
                raise ValueError(f'{FREE_FLYER!r} is not a free-flyer in Pinocchio')
            self.root_q = pin_model.idx_qs[jid]
            idx_v_root = list(range(pin_model.idx_vs[jid], pin_model.idx_vs[jid] + 6))
            names = names[1:]
        if self.nv != len(names) + len(idx_v_root):
            raise ValueError(f'Pinocchio has nv={self.nv}, we have {len(self.joint_names)} '
                             f'joints: {self.joint_names}')
        idx_q, idx_v, continuous = [], [], []
        for name in names:
            if not pin_model.existJointName(name):
                raise ValueError(f'Pinocchio model has no joint {name!r}')
            jid = pin_model.getJointId(name)
            if pin_model.nvs[jid] != 1 or pin_model.nqs[jid] not in (1, 2):
                raise ValueError(f'joint {name!r}: nq={pin_model.nqs[jid]}, '
                                 f'nv={pin_model.nvs[jid]}')
            idx_q.append(pin_model.idx_qs[jid])
            idx_v.append(pin_model.idx_vs[jid])
            continuous.append(pin_model.nqs[jid] == 2)
        self.idx_q = np.array(idx_q, dtype=int)
        self.idx_v = np.array(idx_v_root + idx_v, dtype=int)
        self.continuous = np.array(continuous, dtype=bool)

    def q(self, q: np.ndarray) -> np.ndarray:
        """
        Map our positions ``(nq,)`` to a Pinocchio configuration ``(nq_pin,)``.

        :param q: joint positions in our order (a free-flyer's 7 coordinates first).
        :return: Pinocchio configuration; continuous joints as ``(cos q, sin q)``.
        """
        q = np.asarray(q, dtype=float)
        q_pin = np.zeros(self.nq)
        if self.root_q is not None:
            q_pin[self.root_q:self.root_q + 7] = q[:7]
            q = q[7:]
        for i, (iq, cont) in enumerate(zip(self.idx_q, self.continuous)):
            if cont:
                q_pin[iq] = math.cos(q[i])
                q_pin[iq + 1] = math.sin(q[i])
            else:
                q_pin[iq] = q[i]
        return q_pin

    def v(self, v: np.ndarray) -> np.ndarray:
        """
        Map a tangent-space vector (velocity, acceleration, torque) to Pinocchio's order.

        :param v: ``(nv,)`` in our order.
        :return: ``(nv,)`` in Pinocchio's order.
        """
        v_pin = np.zeros(self.nv)
        v_pin[self.idx_v] = np.asarray(v, dtype=float)
        return v_pin

    def v_from_pin(self, v_pin: np.ndarray) -> np.ndarray:
        """
        Map a Pinocchio tangent vector back to our order.

        :param v_pin: ``(nv,)``.
        :return: ``(n,)``.
        """
        return np.asarray(v_pin)[self.idx_v]

    def matrix_from_pin(self, m_pin: np.ndarray) -> np.ndarray:
        """
        Map an ``(nv, nv)`` matrix (e.g. the mass matrix) to our order.

        :param m_pin: Pinocchio matrix.
        :return: ``(n, n)`` matrix.
        """
        return np.asarray(m_pin).reshape(self.nv, self.nv)[np.ix_(self.idx_v, self.idx_v)]

    def columns_from_pin(self, j_pin: np.ndarray) -> np.ndarray:
        """
        Reorder the columns of a ``(k, nv)`` matrix (e.g. a Jacobian) to our order.

        :param j_pin: Pinocchio matrix.
        :return: ``(k, n)`` matrix.
        """
        # eigenpy returns a single-column matrix as a 1-D array
        return np.asarray(j_pin).reshape(-1, self.nv)[:, self.idx_v]


# --------------------------------------------------------------------------------------
# MuJoCo
# --------------------------------------------------------------------------------------

_MUJOCO_COMPILER = ('<mujoco><compiler discardvisual="true" fusestatic="false" '
                    'balanceinertia="false" strippath="true" inertiafromgeom="false" '
                    'boundmass="0" boundinertia="0"/></mujoco>')


def mujoco_urdf(xml: str) -> str:
    """
    Prepare a URDF for MuJoCo's importer.

    Drops geometry (visual/collision, which may point to meshes that are not available)
    and any existing ``<mujoco>`` block, and adds compiler options that keep every link a
    separate body with its inertia exactly as written.

    :param xml: URDF XML.
    :return: URDF XML for ``mujoco.MjModel.from_xml_string``.
    """
    root = ET.fromstring(re.sub(r'^<\?xml[^>]*\?>', '', xml.strip()))
    for parent in list(root.iter()):
        for child in list(parent):
            if child.tag in ('visual', 'collision', 'mujoco', 'gazebo', 'transmission'):
                parent.remove(child)
    root.insert(0, ET.fromstring(_MUJOCO_COMPILER))
    return ET.tostring(root, encoding='unicode')


def mujoco_model(xml: str) -> tuple:
    """
    Build a MuJoCo model and data for rigid-body comparisons from a URDF string.

    Joint damping, friction loss, armature, springs, contacts and all constraints (limits)
    are disabled so that ``qacc = M^-1 (tau - qfrc_bias)``; gravity is ``[0, 0, -9.81]``.

    :param xml: URDF XML.
    :return: ``(mj_model, mj_data)``.
    """
    import mujoco
    mj_model = mujoco.MjModel.from_xml_string(mujoco_urdf(xml))
    mj_model.dof_damping[:] = 0.0
    mj_model.dof_frictionloss[:] = 0.0
    mj_model.dof_armature[:] = 0.0
    mj_model.jnt_stiffness[:] = 0.0
    mj_model.opt.gravity[:] = (0.0, 0.0, -9.81)
    mj_model.opt.disableflags |= (mujoco.mjtDisableBit.mjDSBL_CONTACT
                                  | mujoco.mjtDisableBit.mjDSBL_CONSTRAINT
                                  | mujoco.mjtDisableBit.mjDSBL_LIMIT
                                  | mujoco.mjtDisableBit.mjDSBL_FRICTIONLOSS
                                  | mujoco.mjtDisableBit.mjDSBL_SPRING
                                  | mujoco.mjtDisableBit.mjDSBL_DAMPER)
    return mj_model, mujoco.MjData(mj_model)


class MujocoMap:
    """Translate between our joint order and MuJoCo's ``qpos``/``qvel`` addresses."""

    def __init__(self, mj_model, joint_names: Sequence[str]) -> None:
        """
        Index the MuJoCo joints of the given names.

        :param mj_model: MuJoCo model.
        :param joint_names: our movable joints, in our order.
        :raises ValueError: a name is unknown, a joint is not hinge/slide, or MuJoCo has
            other degrees of freedom.
        """
        import mujoco
        self.joint_names = tuple(joint_names)
        if mj_model.nv != len(self.joint_names):
            raise ValueError(f'MuJoCo has nv={mj_model.nv}, we have {len(self.joint_names)}')
        qpos, dof = [], []
        for name in self.joint_names:
            jid = mujoco.mj_name2id(mj_model, mujoco.mjtObj.mjOBJ_JOINT, name)
            if jid < 0:
                raise ValueError(f'MuJoCo model has no joint {name!r}')
            if int(mj_model.jnt_type[jid]) not in (int(mujoco.mjtJoint.mjJNT_HINGE),
                                                   int(mujoco.mjtJoint.mjJNT_SLIDE)):
                raise ValueError(f'joint {name!r} has MuJoCo type {mj_model.jnt_type[jid]}')
            qpos.append(mj_model.jnt_qposadr[jid])
            dof.append(mj_model.jnt_dofadr[jid])
        self.qpos = np.array(qpos, dtype=int)
        self.dof = np.array(dof, dtype=int)
        self.nq = mj_model.nq
        self.nv = mj_model.nv

    def set_state(self, mj_data, q: np.ndarray, qd: np.ndarray,
                  tau: Optional[np.ndarray] = None) -> None:
        """
        Write positions, velocities and applied joint torques into ``mj_data``.

        :param mj_data: MuJoCo data.
        :param q: ``(n,)`` positions in our order.
        :param qd: ``(n,)`` velocities in our order.
        :param tau: ``(n,)`` applied joint torques in our order (zero if None).
        """
        mj_data.qpos[:] = 0.0
        mj_data.qvel[:] = 0.0
        mj_data.qfrc_applied[:] = 0.0
        mj_data.ctrl[:] = 0.0
        mj_data.qpos[self.qpos] = q
        mj_data.qvel[self.dof] = qd
        if tau is not None:
            mj_data.qfrc_applied[self.dof] = tau

    def v_from_mj(self, v_mj: np.ndarray) -> np.ndarray:
        """
        Map a MuJoCo dof vector back to our order.

        :param v_mj: ``(nv,)``.
        :return: ``(n,)``.
        """
        return np.asarray(v_mj)[self.dof]

    def matrix_from_mj(self, m_mj: np.ndarray) -> np.ndarray:
        """
        Map an ``(nv, nv)`` MuJoCo matrix to our order.

        :param m_mj: MuJoCo matrix.
        :return: ``(n, n)`` matrix.
        """
        return np.asarray(m_mj)[np.ix_(self.dof, self.dof)]


def mujoco_dynamics(mj_model, mj_data, mj_map: MujocoMap, q: np.ndarray, qd: np.ndarray,
                    tau: np.ndarray) -> tuple:
    """
    Evaluate MuJoCo's rigid-body terms at one state.

    :param mj_model: model from :func:`mujoco_model`.
    :param mj_data: its data.
    :param mj_map: joint mapping.
    :param q: ``(n,)`` positions, our order.
    :param qd: ``(n,)`` velocities, our order.
    :param tau: ``(n,)`` applied torques, our order.
    :return: ``(qdd, M, bias)`` in our order: forward-dynamics acceleration, dense mass
        matrix and ``qfrc_bias`` (Coriolis, centrifugal and gravity).
    """
    import mujoco
    mj_map.set_state(mj_data, q, qd, tau)
    mujoco.mj_forward(mj_model, mj_data)
    mass = np.zeros((mj_model.nv, mj_model.nv))
    if hasattr(mj_data, 'qM'):  # MuJoCo < 4: mj_fullM(m, dst, qM)
        mujoco.mj_fullM(mj_model, mass, mj_data.qM)
    else:
        mujoco.mj_fullM(mj_model, mj_data, mass)
    return (mj_map.v_from_mj(mj_data.qacc).copy(), mj_map.matrix_from_mj(mass),
            mj_map.v_from_mj(mj_data.qfrc_bias).copy())


def assert_close(actual, expected, what: str, tol: float = TOL) -> None:
    """
    Assert ``|actual - expected| <= tol * max(1, max|expected|)`` elementwise.

    :param actual: our value.
    :param expected: the reference value.
    :param what: description printed on failure.
    :param tol: tolerance.
    """
    actual = np.asarray(actual.detach() if isinstance(actual, torch.Tensor) else actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f'{what}: shape {actual.shape} != {expected.shape}'
    scale = max(1.0, float(np.abs(expected).max(initial=0.0)))
    np.testing.assert_allclose(actual, expected, rtol=0.0, atol=tol * scale, err_msg=what)


def as_tensor(x: np.ndarray) -> torch.Tensor:
    return torch.as_tensor(np.asarray(x), dtype=torch.float64)
