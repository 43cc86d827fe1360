"""Recursive Newton-Euler inverse dynamics, vectorised over the tree in world coordinates."""

import torch

from .errors import check_trailing_shape
from .kinematics import body_poses, motion_subspaces, world_inertial
from .model import RobotModel
from .spatial import force_cross, inertia_apply, motion_cross, small_matmul

Tensor = torch.Tensor


def body_velocities(model: RobotModel, S: Tensor, qd: Tensor) -> Tensor:
    """
    Return world-frame spatial velocities of all bodies.

    :param model: the robot.
    :param S: world motion subspaces ``(..., n, 6)``.
    :param qd: joint velocities ``(..., n)``.
    :return: ``(..., n, 6)``; ``v_i`` is the sum of ``S_j qd_j`` over ``j`` on the path to i.
    """
    return small_matmul(model.tree.ancestors, S * qd.unsqueeze(-1))


def rnea(model: RobotModel, q: Tensor, qd: Tensor, qdd: Tensor) -> Tensor:
    """
    Compute inverse dynamics ``tau = M(q) qdd + C(q, qd) qd + g(q)``.

    Rigid-body terms plus ``armature * qdd``; joint damping/friction are not included.
    The tree recursions are evaluated as ancestor/descendant sums in world coordinates, so
    the cost is a handful of batched tensor operations plus one pass for the body poses.

    :param model: the robot; its parameters may carry leading batch dims.
    :param q: joint positions ``(..., n)`` [rad or m].
    :param qd: joint velocities ``(..., n)``.
    :param qdd: joint accelerations ``(..., n)``.
    :return: joint torques/forces ``(..., n)`` [N m or N].
    """
    for name, value in (('q', q), ('qd', qd), ('qdd', qdd)):
        check_trailing_shape(name, value, (model.n,))
    T_world_body = body_poses(model, q)
    S = motion_subspaces(model, T_world_body)
    pi_world = world_inertial(model, T_world_body)
    v = body_velocities(model, S, qd)
    bias = motion_cross(v, S * qd.unsqueeze(-1))
    a = small_matmul(model.tree.ancestors, S * qdd.unsqueeze(-1) + bias) \
        + model.gravity_acceleration().unsqueeze(-2)
    f = inertia_apply(pi_world, a) + force_cross(v, inertia_apply(pi_world, v))
    # Force transmitted by joint j = sum of the body forces of its subtree.
    f_joint = small_matmul(model.tree.ancestors.T, f)
    return (S * f_joint).sum(-1) + model.armature * qdd
