"""Recursive Newton-Euler inverse dynamics, vectorised over the tree in world coordinates."""

import torch

from .kinematics import (body_poses, check_state, joint_rates, motion_subspaces,
                         root_subspace, world_inertial)
from .model import RobotModel
from .spatial import force_cross, inertia_apply, motion_cross, small_matmul, small_matvec

Tensor = torch.Tensor


def body_velocities(model: RobotModel, S: Tensor, qd: Tensor) -> Tensor:
    """
    Return world-frame spatial velocities of all bodies of a fixed-base tree.

    :param model: the robot.
    :param S: world motion subspaces ``(..., n, 6)``.
    :param qd: joint velocities ``(..., n)`` (one per joint, see :func:`floating_velocities`).
    :return: ``(..., n, 6)``; ``v_i`` is the sum of ``S_j qd_j`` over ``j`` on the path to i.
    """
    return small_matmul(model.tree.ancestors, S * qd.unsqueeze(-1))


def floating_velocities(model: RobotModel, T_world_body: Tensor, S: Tensor, v: Tensor) -> tuple:
    """
    Return the free-flyer's subspace, the per-joint rates and every body's velocity.

    Every body descends from the root, so its velocity is the root's ``S0 v[:6]`` plus the
    1-DOF joint terms on its path.

    :param model: a floating-base robot.
    :param T_world_body: body poses ``(..., njoints, 4, 4)``.
    :param S: world motion subspaces ``(..., njoints, 6)`` (zero row for the root).
    :param v: generalized velocities ``(..., nv)``.
    :return: ``(S0 (..., 6, 6), qd (..., njoints), v_body (..., njoints, 6))`` with ``S0``
        from :func:`~diffsim_ros.core.kinematics.root_subspace` and ``qd = [0, v[6:]]``.
    """
    S0 = root_subspace(T_world_body[..., 0, :, :])
    qd = joint_rates(model, v)
    v_root = small_matvec(S0, v[..., :6]).unsqueeze(-2)
    return S0, qd, body_velocities(model, S, qd) + v_root


def rnea(model: RobotModel, q: Tensor, qd: Tensor, qdd: Tensor) -> Tensor:
    """
    Compute inverse dynamics ``tau = M(q) qdd + C(q, qd) qd + g(q)``.

    Rigid-body terms plus ``armature * qdd``; joint damping/friction are not included.
    The tree recursions are evaluated as ancestor/descendant sums in world coordinates, so
    the cost is a handful of batched tensor operations plus one pass for the body poses.

    A floating base (``model.floating_base``) takes ``q`` ``(..., nq)`` and returns the
    root wrench ``[force; torque]`` in root axes (about the root origin) as the first six
    entries, like Pinocchio's free-flyer.

    :param model: the robot; its parameters may carry leading batch dims.
    :param q: joint positions ``(..., nq)`` [rad or m].
    :param qd: joint velocities ``(..., nv)``.
    :param qdd: joint accelerations ``(..., nv)``.
    :return: joint torques/forces ``(..., nv)`` [N m or N].
    """
    check_state(model, q, qd=qd, qdd=qdd)
    T_world_body = body_poses(model, q)
    S = motion_subspaces(model, T_world_body)
    pi_world = world_inertial(model, T_world_body)
    if model.tree.floating:
        return _rnea_floating(model, T_world_body, S, pi_world, qd, qdd)
    v = body_velocities(model, S, qd)
    bias = motion_cross(v, S * qd.unsqueeze(-1))
    a = small_matmul(model.tree.ancestors, S * qdd.unsqueeze(-1) + bias) \
        + model.gravity_acceleration().unsqueeze(-2)
    f = inertia_apply(pi_world, a) + force_cross(v, inertia_apply(pi_world, v))
    # Force transmitted by joint j = sum of the body forces of its subtree.
    f_joint = small_matmul(model.tree.ancestors.T, f)
    return (S * f_joint).sum(-1) + model.armature * qdd


def _rnea_floating(model: RobotModel, T_world_body: Tensor, S: Tensor, pi_world: Tensor,
                   qd: Tensor, qdd: Tensor) -> Tensor:
    """Inverse dynamics of a floating-base tree; see :func:`rnea`."""
    S0, qd_joint, v = floating_velocities(model, T_world_body, S, qd)
    qdd_joint = joint_rates(model, qdd)
    bias = motion_cross(v, S * qd_joint.unsqueeze(-1))
    # d/dt (S0 v_root) = S0 a_root: the root's own bias v x v vanishes.
    a_root = small_matvec(S0, qdd[..., :6]) + model.gravity_acceleration()
    a = small_matmul(model.tree.ancestors, S * qdd_joint.unsqueeze(-1) + bias) \
        + a_root.unsqueeze(-2)
    f = inertia_apply(pi_world, a) + force_cross(v, inertia_apply(pi_world, v))
    f_joint = small_matmul(model.tree.ancestors.T, f)
    tau_joint = (S * f_joint).sum(-1)[..., 1:]
    tau_root = small_matvec(S0.mT, f_joint[..., 0, :])
    return cat_dofs(tau_root, tau_joint) + model.armature * qdd


def cat_dofs(root: Tensor, joints: Tensor) -> Tensor:
    """
    Join the free-flyer's six entries and the 1-DOF joints' entries along the last dim.

    :param root: ``(..., 6)``.
    :param joints: ``(..., njoints - 1)``, batch broadcastable against ``root``'s.
    :return: ``(..., nv)``.
    """
    batch = torch.broadcast_shapes(root.shape[:-1], joints.shape[:-1])
    return torch.cat((root.expand(batch + root.shape[-1:]),
                      joints.expand(batch + joints.shape[-1:])), dim=-1)
