"""Composite-rigid-body algorithm for the joint-space inertia matrix."""

import torch

from .errors import check_trailing_shape
from .kinematics import body_poses, motion_subspaces, world_inertial
from .model import RobotModel
from .spatial import inertia_apply, small_matmul

Tensor = torch.Tensor


def crba(model: RobotModel, q: Tensor) -> Tensor:
    """
    Compute the joint-space inertia matrix ``M(q)``.

    Composite inertias are subtree sums of world-frame body inertias;
    ``M[j, k] = S_j . (Ic_k S_k)`` when ``j`` is ``k`` or one of its ancestors, mirrored
    for the lower triangle, zero for unrelated branches.  Armature is added to the diagonal.

    :param model: the robot.
    :param q: joint positions ``(..., n)``.
    :return: symmetric positive-definite ``(..., n, n)`` [kg m^2, kg, kg m].
    """
    check_trailing_shape('q', q, (model.n,))
    T_world_body = body_poses(model, q)
    S = motion_subspaces(model, T_world_body)
    ancestors = model.tree.ancestors
    # Inertial parameters are additive, so composite bodies are subtree sums of 10-vectors.
    pi_composite = small_matmul(ancestors.T, world_inertial(model, T_world_body))
    F = inertia_apply(pi_composite, S)
    upper = (S.unsqueeze(-2) * F.unsqueeze(-3)).sum(-1) * ancestors.T
    M = upper + upper.mT - torch.diag_embed(torch.diagonal(upper, dim1=-2, dim2=-1))
    return M + torch.diag_embed(model.armature)
