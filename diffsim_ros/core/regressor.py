"""Joint-torque regressor: ``rnea(model, q, qd, qdd) == Y(q, qd, qdd) @ pi + armature * qdd``."""

import torch

from .kinematics import body_poses, check_state, joint_rates, motion_subspaces
from .model import RobotModel
from .rnea import body_velocities, floating_velocities
from .spatial import (force_cross, motion_cross, motion_transform_inverse, small_matvec,
                      spatial_inertia)

Tensor = torch.Tensor


def joint_torque_regressor(model: RobotModel, q: Tensor, qd: Tensor, qdd: Tensor) -> Tensor:
    """
    Return the regressor ``Y`` that makes inverse dynamics linear in the inertial parameters.

    ``Y @ model.inertial.flatten(-2)`` equals ``rnea(model, q, qd, qdd)`` minus the armature
    term.  Column ``10 i + k`` belongs to parameter ``k`` of body ``i`` (see
    :meth:`RobotModel.inertial_parameter_names`).

    :param model: the robot (its inertial parameters are not used, only the kinematics).
    :param q: joint positions ``(..., nq)``.
    :param qd: joint velocities ``(..., nv)``.
    :param qdd: joint accelerations ``(..., nv)``.
    :return: ``(..., nv, 10 njoints)``; a floating base's first six rows are the root wrench.
    """
    check_state(model, q, qd=qd, qdd=qdd)
    n = model.tree.n
    T_world_body = body_poses(model, q)
    S = motion_subspaces(model, T_world_body)
    ancestors = model.tree.ancestors
    a_base = model.gravity_acceleration().unsqueeze(-2)
    if model.tree.floating:
        S0, qd, v = floating_velocities(model, T_world_body, S, qd)
        a_base = a_base + small_matvec(S0, qdd[..., :6]).unsqueeze(-2)
        qdd = joint_rates(model, qdd)
        # One column per DOF: the root's six move every body.
        S_dofs = torch.cat((S0, S[..., 1:, :].mT), dim=-1)
        moves = torch.cat((ancestors.new_ones(n, 6), ancestors[:, 1:]), dim=-1)
    else:
        v = body_velocities(model, S, qd)
        S_dofs, moves = S.mT, ancestors
    bias = motion_cross(v, S * qd.unsqueeze(-1))
    a = ancestors @ (S * qdd.unsqueeze(-1) + bias) + a_base
    X = motion_transform_inverse(T_world_body)                 # world -> body, (..., n, 6, 6)
    v_body = (X @ v.unsqueeze(-1)).unsqueeze(-3)               # (..., n, 1, 6, 1)
    a_body = (X @ a.unsqueeze(-1)).unsqueeze(-3)
    # spatial_inertia is linear in pi, so the identity basis gives one 6x6 matrix per parameter.
    basis = spatial_inertia(torch.eye(10, dtype=S.dtype, device=S.device))
    Bv = (basis @ v_body).squeeze(-1)                          # (..., n, 10, 6)
    per_param_force = (basis @ a_body).squeeze(-1) + force_cross(v_body.squeeze(-1), Bv)
    S_in_body = X @ S_dofs.unsqueeze(-3)                       # (..., n_i, 6, nv)
    Y = (per_param_force @ S_in_body) * moves.unsqueeze(-2)
    return Y.permute(*range(Y.dim() - 3), -1, -3, -2).reshape(
        Y.shape[:-3] + (model.nv, 10 * n))
