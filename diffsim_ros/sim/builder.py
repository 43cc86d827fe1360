"""
Build a MuJoCo model whose rigid-body and joint dynamics equal a :class:`RobotModel`.

The mapping, made explicit:

* MuJoCo imports the URDF with ``fusestatic="false"``, so every URDF link is a MuJoCo body
  whose frame is the URDF link frame (fixed links such as a flange or tool stay separate
  bodies and can be tracked).  Visual and collision geometry is dropped; contacts are off.
* Our core merges fixed links into the body of their movable parent joint.  The builder
  writes each merged inertial (``model.inertial[i]``, about the origin of the link
  ``model.tree.body_links[i]``) into that link's MuJoCo body and makes every other link of
  the same body massless, so both engines carry the same mass distribution.
* MuJoCo stores inertia in a principal frame: ``body_ipos`` = CoM, ``body_iquat`` = rotation
  of the principal axes (eigenvectors of the inertia about the CoM, made right-handed),
  ``body_inertia`` = principal moments.
* Joint placements (``body_pos``/``body_quat`` of each moving body) come from
  ``model.origin_xyz``/``origin_rpy``; ``dof_damping``, ``dof_frictionloss`` (Coulomb) and
  ``dof_armature`` from the model, springs are removed, gravity is ``model.gravity``.
"""

from dataclasses import dataclass
import re
from typing import Callable, Mapping, Optional, Sequence
import xml.etree.ElementTree as ET

import mujoco
import numpy as np
import torch

from ..core import mass_com_inertia, RobotModel
from ..core.spatial import rpy_to_matrix

__all__ = ['INTEGRATORS', 'MujocoIndex', 'build_mujoco_model', 'mujoco_urdf',
           'principal_inertia']

#: Integrator names accepted by :func:`build_mujoco_model`.
INTEGRATORS = {
    'implicitfast': mujoco.mjtIntegrator.mjINT_IMPLICITFAST,
    'implicit': mujoco.mjtIntegrator.mjINT_IMPLICIT,
    'RK4': mujoco.mjtIntegrator.mjINT_RK4,
    'Euler': mujoco.mjtIntegrator.mjINT_EULER,
}

_COMPILER = ('<mujoco><compiler discardvisual="true" fusestatic="false" '
             'balanceinertia="false" strippath="true" inertiafromgeom="false" '
             'boundmass="0" boundinertia="0"/></mujoco>')


@dataclass(frozen=True, eq=False)
class MujocoIndex:
    """
    Where our joints and links live in a MuJoCo model.

    :param joint_names: our movable joints, model order.
    :param qpos: ``(n,)`` ``qpos`` address of each joint.
    :param dof: ``(n,)`` ``qvel``/``qfrc`` address of each joint.
    :param bodies: link name -> MuJoCo body id, for every URDF link.
    """

    joint_names: tuple
    qpos: np.ndarray
    dof: np.ndarray
    bodies: Mapping[str, int]


def mujoco_urdf(urdf: str) -> str:
    """
    Prepare a URDF for MuJoCo's importer.

    Drops geometry (meshes may be unavailable; contacts are not simulated) and any existing
    ``<mujoco>`` block, and adds compiler options that keep every link a body with its
    inertia as written.

    :param urdf: URDF XML.
    :return: URDF XML for ``mujoco.MjModel.from_xml_string``.
    """
    root = ET.fromstring(re.sub(r'^<\?xml[^>]*\?>', '', urdf.strip()))
    for parent in list(root.iter()):
        for child in list(parent):
            if child.tag in ('visual', 'collision', 'mujoco', 'gazebo', 'transmission'):
                parent.remove(child)
    root.insert(0, ET.fromstring(_COMPILER))
    return ET.tostring(root, encoding='unicode')


def _robot_dofs(mj_model, links: Sequence[str]) -> int:
    """Count the degrees of freedom of the joints that move the robot's own links."""
    bodies = {mujoco.mj_name2id(mj_model, mujoco.mjtObj.mjOBJ_BODY, link) for link in links}
    ends = list(mj_model.jnt_dofadr[1:]) + [mj_model.nv]
    return sum(int(end - start) for body, start, end in
               zip(mj_model.jnt_bodyid, mj_model.jnt_dofadr, ends) if int(body) in bodies)


def _index(mj_model, model: RobotModel) -> MujocoIndex:
    robot_dofs = _robot_dofs(mj_model, model.link_names)
    if robot_dofs != model.n:
        raise ValueError(f'MuJoCo imported {robot_dofs} degrees of freedom, the model has '
                         f'{model.n} ({", ".join(model.joint_names)})')
    qpos, dof = [], []
    for name in model.joint_names:
        jid = mujoco.mj_name2id(mj_model, mujoco.mjtObj.mjOBJ_JOINT, name)
        if jid < 0:
            raise ValueError(f'MuJoCo model has no joint {name!r}')
        if int(mj_model.jnt_type[jid]) not in (int(mujoco.mjtJoint.mjJNT_HINGE),
                                               int(mujoco.mjtJoint.mjJNT_SLIDE)):
            raise ValueError(f'joint {name!r} imported as MuJoCo type {mj_model.jnt_type[jid]}')
        qpos.append(int(mj_model.jnt_qposadr[jid]))
        dof.append(int(mj_model.jnt_dofadr[jid]))
    bodies = {}
    for link in model.link_names:
        bid = mujoco.mj_name2id(mj_model, mujoco.mjtObj.mjOBJ_BODY, link)
        if bid < 0:
            raise ValueError(f'MuJoCo model has no body for link {link!r}')
        bodies[link] = bid
    return MujocoIndex(model.joint_names, np.array(qpos, dtype=np.intp),
                       np.array(dof, dtype=np.intp), bodies)


def _quat(R: np.ndarray) -> np.ndarray:
    quat = np.zeros(4)
    mujoco.mju_mat2Quat(quat, np.ascontiguousarray(R, dtype=np.float64).reshape(9))
    return quat


def principal_inertia(inertia_com: np.ndarray) -> tuple:
    """
    Return MuJoCo's form of an inertia about the CoM: principal moments and their axes.

    :param inertia_com: ``(3, 3)`` inertia about the centre of mass, kg m^2.
    :return: ``(moments (3,) clipped at 0, quaternion (w, x, y, z) of the right-handed
        principal axes)``, MuJoCo's ``body_inertia`` and ``body_iquat``.
    """
    moments, axes = np.linalg.eigh(inertia_com)
    if np.linalg.det(axes) < 0.0:
        axes[:, 2] = -axes[:, 2]
    return np.clip(moments, 0.0, None), _quat(axes)


def _write_inertials(mj_model, model: RobotModel, index: MujocoIndex) -> None:
    pi = model.inertial.detach().cpu().double()
    mass, com, inertia_com = mass_com_inertia(pi)
    tree = model.tree
    for link, body in zip(tree.link_names, tree.link_bodies):
        if body < 0:
            continue  # fixed to the base: its mass never moves
        bid = index.bodies[link]
        m = float(mass[body])
        if link != tree.body_links[body] or m == 0.0:
            mj_model.body_mass[bid] = 0.0
            mj_model.body_ipos[bid] = 0.0
            mj_model.body_iquat[bid] = (1.0, 0.0, 0.0, 0.0)
            mj_model.body_inertia[bid] = 0.0
            continue
        moments, quat = principal_inertia(inertia_com[body].numpy())
        mj_model.body_mass[bid] = m
        mj_model.body_ipos[bid] = com[body].numpy()
        mj_model.body_iquat[bid] = quat
        mj_model.body_inertia[bid] = moments


def build_mujoco_model(urdf: str, model: RobotModel, timestep: float,
                       integrator: str = 'implicitfast', joint_limits: bool = True,
                       gravity_compensation: bool = False,
                       extra_damping: Optional[Sequence[float]] = None,
                       extend: Optional[Callable[[mujoco.MjSpec], None]] = None,
                       contacts: bool = False) -> tuple:
    """
    Compile a MuJoCo model of ``urdf`` carrying exactly the parameters of ``model``.

    With ``extra_damping`` zero and without friction loss, limits and gravity compensation,
    MuJoCo's ``qacc`` equals ``aba(model, q, qd, qfrc_applied - model.damping * qd)``.

    :param urdf: URDF XML with the same joints and links as ``model``.
    :param model: unbatched robot model (float64 parameters are written).
    :param timestep: physics step, s.
    :param integrator: key of :data:`INTEGRATORS`.
    :param joint_limits: enforce the URDF position limits (MuJoCo soft constraints).
    :param gravity_compensation: apply forces cancelling gravity on every body (MuJoCo
        ``gravcomp``), as drivers such as libfranka do; they appear in ``qfrc_gravcomp``.
    :param extra_damping: ``(n,)`` damping added on top of ``model.damping`` (e.g. a DC
        motor's back-EMF ``k^2 / R``), N m s/rad or N s/m.
    :param extend: called with the imported ``mujoco.MjSpec`` before it is compiled, to add
        bodies that are not part of the robot model (a cup, a ball on a string); their
        masses, joints and geoms are left as it writes them.
    :param contacts: keep MuJoCo's contacts on (the robot's links carry no geoms; only what
        ``extend`` adds can touch).
    :return: ``(mj_model, index)`` with a :class:`MujocoIndex`.
    :raises ValueError: unknown integrator or a URDF that does not match the model.
    """
    if integrator not in INTEGRATORS:
        raise ValueError(f'unknown integrator {integrator!r}; valid: '
                         f'{", ".join(repr(k) for k in INTEGRATORS)}')
    if model.batch_shape != torch.Size([]):
        raise ValueError(f'build_mujoco_model needs an unbatched model, got batch shape '
                         f'{tuple(model.batch_shape)}')
    if extend is None:
        mj_model = mujoco.MjModel.from_xml_string(mujoco_urdf(urdf))
    else:
        spec = mujoco.MjSpec.from_string(mujoco_urdf(urdf))
        extend(spec)
        mj_model = spec.compile()
    index = _index(mj_model, model)

    def array(x: torch.Tensor) -> np.ndarray:
        return x.detach().cpu().double().numpy()

    _write_inertials(mj_model, model, index)
    rotations = array(rpy_to_matrix(model.origin_rpy.detach().cpu().double()))
    xyz = array(model.origin_xyz)
    for i, link in enumerate(model.tree.body_links):
        bid = index.bodies[link]
        mj_model.body_pos[bid] = xyz[i]
        mj_model.body_quat[bid] = _quat(rotations[i])
    damping = array(model.damping)
    if extra_damping is not None:
        damping = damping + np.asarray(extra_damping, dtype=np.float64)
    mj_model.dof_damping[index.dof] = damping
    mj_model.dof_frictionloss[index.dof] = array(model.friction)
    mj_model.dof_armature[index.dof] = array(model.armature)
    mj_model.jnt_stiffness[:] = 0.0
    mj_model.opt.gravity[:] = array(model.gravity)
    mj_model.opt.timestep = float(timestep)
    mj_model.opt.integrator = INTEGRATORS[integrator]
    if not contacts:
        mj_model.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_CONTACT
    if not joint_limits:
        mj_model.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_LIMIT
    if gravity_compensation:
        mj_model.body_gravcomp[list(index.bodies.values())] = 1.0
    mujoco.mj_setConst(mj_model, mujoco.MjData(mj_model))
    return mj_model, index
