"""Joint-torque regressor: ``rnea(model, q, qd, qdd) == Y(q, qd, qdd) @ pi + armature * qdd``."""

import torch

from .errors import check_trailing_shape
from .kinematics import body_poses, motion_subspaces
from .model import RobotModel
from .rnea import body_velocities
from .spatial import force_cross, motion_cross, motion_transform_inverse, spatial_inertia

Tensor = torch.Tensor


def joint_torque_regressor(model: RobotModel, q: Tensor, qd: Tensor, qdd: Tensor) -> Tensor:
    """
    Return the regressor ``Y`` that makes inverse dynamics linear in the inertial parameters.

    ``Y @ model.inertial.flatten(-2)`` equals ``rnea(model, q, qd, qdd)`` minus the armature
    term.  Column ``10 i + k`` belongs to parameter ``k`` of body ``i`` (see
    :meth:`RobotModel.inertial_parameter_names`).

    :param model: the robot (its inertial parameters are not used, only the kinematics).
    :param q: joint positions ``(..., n)``.
    :param qd: joint velocities ``(..., n)``.
    :param qdd: joint accelerations ``(..., n)``.
    :return: ``(..., n, 10 n)``.
    """
    for name, value in (('q', q), ('qd', qd), ('qdd', qdd)):
        check_trailing_shape(name, value, (model.n,))
    n = model.n
    T_world_body = body_poses(model, q)
    S = motion_subspaces(model, T_world_body)
    v = body_velocities(model, S, qd)
    bias = motion_cross(v, S * qd.unsqueeze(-1))
    a = model.tree.ancestors @ (S * qdd.unsqueeze(-1) + bias) \
        + model.gravity_acceleration().unsqueeze(-2)
    X = motion_transform_inverse(T_world_body)                 # world -> body, (..., n, 6, 6)
    v_body = (X @ v.unsqueeze(-1)).unsqueeze(-3)               # (..., n, 1, 6, 1)
    a_body = (X @ a.unsqueeze(-1)).unsqueeze(-3)
    # spatial_inertia is linear in pi, so the identity basis gives one 6x6 matrix per parameter.
    basis = spatial_inertia(torch.eye(10, dtype=S.dtype, device=S.device))
    Bv = (basis @ v_body).squeeze(-1)                          # (..., n, 10, 6)
    per_param_force = (basis @ a_body).squeeze(-1) + force_cross(v_body.squeeze(-1), Bv)
    S_in_body = X @ S.mT.unsqueeze(-3)                         # (..., n_i, 6, n_j)
    Y = (per_param_force @ S_in_body) * model.tree.ancestors.unsqueeze(-2)
    return Y.permute(*range(Y.dim() - 3), -1, -3, -2).reshape(Y.shape[:-3] + (n, 10 * n))
