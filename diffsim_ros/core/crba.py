"""Composite-rigid-body algorithm for the joint-space inertia matrix."""

import torch

from .kinematics import body_poses, check_state, motion_subspaces, root_subspace, world_inertial
from .model import RobotModel
from .spatial import inertia_apply, small_matmul

Tensor = torch.Tensor


def crba(model: RobotModel, q: Tensor) -> Tensor:
    """
    Compute the joint-space inertia matrix ``M(q)``.

    Composite inertias are subtree sums of world-frame body inertias;
    ``M[j, k] = S_j . (Ic_k S_k)`` when ``j`` is ``k`` or one of its ancestors, mirrored
    for the lower triangle, zero for unrelated branches.  Armature is added to the diagonal.
    A free-flyer root adds the blocks ``M_00 = S0^T Ic_0 S0`` and ``M_0k = S0^T Ic_k S_k``
    (every body descends from the root).

    :param model: the robot.
    :param q: joint positions ``(..., nq)``.
    :return: symmetric positive-definite ``(..., nv, nv)`` [kg m^2, kg, kg m].
    """
    check_state(model, q)
    T_world_body = body_poses(model, q)
    S = motion_subspaces(model, T_world_body)
    ancestors = model.tree.ancestors
    # Inertial parameters are additive, so composite bodies are subtree sums of 10-vectors.
    pi_composite = small_matmul(ancestors.T, world_inertial(model, T_world_body))
    F = inertia_apply(pi_composite, S)
    upper = (S.unsqueeze(-2) * F.unsqueeze(-3)).sum(-1) * ancestors.T
    M = upper + upper.mT - torch.diag_embed(torch.diagonal(upper, dim1=-2, dim2=-1))
    if model.tree.floating:
        S0 = root_subspace(T_world_body[..., 0, :, :])
        F0 = inertia_apply(pi_composite[..., :1, :], S0.mT)          # rows: Ic_0 S0 columns
        M = _floating_blocks(small_matmul(S0.mT, F0.mT), small_matmul(S0.mT, F[..., 1:, :].mT),
                             M[..., 1:, 1:])
    return M + torch.diag_embed(model.armature)


def _floating_blocks(M_root: Tensor, M_root_joint: Tensor, M_joint: Tensor) -> Tensor:
    """Assemble ``[[M_00, M_0J], [M_0J^T, M_JJ]]`` over the broadcast batch."""
    batch = torch.broadcast_shapes(M_root.shape[:-2], M_root_joint.shape[:-2],
                                   M_joint.shape[:-2])
    n = M_joint.shape[-1]
    M_root_joint = M_root_joint.expand(batch + (6, n))
    top = torch.cat((M_root.expand(batch + (6, 6)), M_root_joint), dim=-1)
    bottom = torch.cat((M_root_joint.mT, M_joint.expand(batch + (n, n))), dim=-1)
    return torch.cat((top, bottom), dim=-2)
