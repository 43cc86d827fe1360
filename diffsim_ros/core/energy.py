"""Kinetic and potential energy of the rigid-body tree."""

import torch

from .kinematics import body_poses, check_state, motion_subspaces, world_inertial
from .model import RobotModel
from .rnea import body_velocities, floating_velocities
from .spatial import inertia_apply, small_matvec

Tensor = torch.Tensor


def kinetic_energy(model: RobotModel, q: Tensor, qd: Tensor) -> Tensor:
    """
    Return ``0.5 qd^T M(q) qd`` (rotor armature included).

    :param model: the robot.
    :param q: joint positions ``(..., nq)``.
    :param qd: joint velocities ``(..., nv)``.
    :return: ``(...)`` in J; a floating base's root body is included.
    """
    check_state(model, q, qd=qd)
    T_world_body = body_poses(model, q)
    S = motion_subspaces(model, T_world_body)
    if model.tree.floating:
        v = floating_velocities(model, T_world_body, S, qd)[2]
    else:
        v = body_velocities(model, S, qd)
    Iv = inertia_apply(world_inertial(model, T_world_body), v)
    return 0.5 * ((v * Iv).sum((-1, -2)) + (model.armature * qd * qd).sum(-1))


def potential_energy(model: RobotModel, q: Tensor) -> Tensor:
    """
    Return the gravitational potential energy of the moving bodies (zero at the world origin).

    :param model: the robot.
    :param q: joint positions ``(..., nq)``.
    :return: ``(...)`` in J; links fixed to the world are not counted (as in Pinocchio), a
        floating base's root body is.
    """
    check_state(model, q)
    T_world_body = body_poses(model, q)
    R = T_world_body[..., :3, :3]
    p = T_world_body[..., :3, 3]
    first_moment = small_matvec(R, model.inertial[..., 1:4]) \
        + model.inertial[..., :1] * p
    return -(first_moment * model.gravity.unsqueeze(-2)).sum((-1, -2))
