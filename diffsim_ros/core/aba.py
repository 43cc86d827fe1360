"""Articulated-body algorithm (Featherstone) for forward dynamics, in world coordinates."""

import torch

from .kinematics import body_poses, check_state, joint_rates, motion_subspaces, world_inertial
from .model import RobotModel
from .rnea import body_velocities, floating_velocities
from .spatial import (force_cross, inertia_apply, motion_cross, small_matmul, small_matvec,
                      spatial_inertia)

Tensor = torch.Tensor


def aba(model: RobotModel, q: Tensor, qd: Tensor, tau: Tensor) -> Tensor:
    """
    Compute forward dynamics ``qdd = M(q)^-1 (tau - C(q, qd) qd - g(q))``.

    The O(n) articulated-body recursion.  Everything is expressed in world coordinates, so
    handing an articulated inertia to the parent is an addition (no 6x6 transforms), and the
    body poses, velocities and bias terms are computed for all bodies at once.  Each body
    carries the augmented matrix ``A = [I^A | p^A]`` (6 x 7) so that one joint's update is a
    few fused matrix products.

    A free-flyer root (``model.floating_base``): the backward sweep stops at the root, whose
    acceleration solves the 6x6 system ``S0^T I^A_0 S0 a_0 = tau[:6] - S0^T (I^A_0 a_g +
    p^A_0)`` (gravity as the fictitious base acceleration ``a_g``); the forward sweep starts
    from ``a_g + S0 a_0``.

    :param model: the robot; its parameters may carry leading batch dims.
    :param q: joint positions ``(..., nq)``.
    :param qd: joint velocities ``(..., nv)``.
    :param tau: applied joint torques/forces ``(..., nv)`` (damping/friction not included;
        a floating base's first six entries are the wrench ``[force; torque]`` applied to
        the root, in root axes about the root origin).
    :return: joint accelerations ``(..., nv)``.
    """
    check_state(model, q, qd=qd, tau=tau)
    n = model.tree.n
    floating = model.tree.floating
    T_world_body = body_poses(model, q)
    S = motion_subspaces(model, T_world_body)
    pi_world = world_inertial(model, T_world_body)
    I_world = spatial_inertia(pi_world)
    armature_joint, tau_joint = model.armature, tau
    if floating:
        S0, qd, v = floating_velocities(model, T_world_body, S, qd)
        armature_joint, tau_joint = joint_rates(model, armature_joint), joint_rates(model, tau)
    else:
        v = body_velocities(model, S, qd)
    c = motion_cross(v, S * qd.unsqueeze(-1))
    p_bias = force_cross(v, inertia_apply(pi_world, v))

    batch = torch.broadcast_shapes(I_world.shape[:-3], S.shape[:-2], tau.shape[:-1],
                                   model.armature.shape[:-1])
    zeros = torch.zeros(batch + (n, 1), dtype=S.dtype, device=S.device)
    # Column vectors padded with a 7th entry: S7 = [S; 0], c7 = [c; 0].
    S7 = torch.cat((S.expand(batch + (n, 6)), zeros), dim=-1).unsqueeze(-1)
    c7 = torch.cat((c.expand(batch + (n, 6)), zeros), dim=-1).unsqueeze(-1)
    e7 = torch.eye(7, dtype=S.dtype, device=S.device)[6]
    A = list(torch.cat((I_world, p_bias.unsqueeze(-1)), dim=-1)
             .expand(batch + (n, 6, 7)).unbind(-3))
    # tau e7^T, so that w = S^T [I^A | I^A c + p^A] - tau e7^T = [U^T | U.c + S.p - tau]
    # with U = I^A S (I^A is symmetric).
    tau_row = (tau_joint.unsqueeze(-1) * e7).expand(batch + (n, 7)).unsqueeze(-2).unbind(-3)
    S7_l, c7_l = S7.unbind(-3), c7.unbind(-3)
    S_col = S7[..., :6, :].unbind(-3)
    c_col = c.expand(batch + (n, 6)).unsqueeze(-1).unbind(-3)
    armature = armature_joint.expand(batch + (n,))[..., None, None].unbind(-3)

    # Only element-wise products and mat-vec products below: batched small mat-mat
    # products are slow on CPU at large batch sizes.
    w, neg_D_inv = [None] * n, [None] * n
    for i in range(n - 1, int(floating) - 1, -1):
        AC = A[i] + small_matmul(A[i][..., :6], c_col[i]) * e7
        w[i] = (AC * S_col[i]).sum(-2, keepdim=True) - tau_row[i]
        D_inv = 1.0 / (small_matmul(w[i], S7_l[i]) + armature[i])
        neg_D_inv[i] = -D_inv
        parent = model.tree.parents[i]
        if parent >= 0:
            # [I^a | p^a] = [I^A - U U^T / D | p^A + I^a c + U u / D]
            A[parent] = A[parent] + AC - (w[i].mT[..., :6, :] * D_inv) * w[i]

    a_base = torch.cat((model.gravity_acceleration(), model.gravity.new_ones(
        model.gravity.shape[:-1] + (1,))), dim=-1).expand(batch + (7,)).unsqueeze(-1)
    a, qdd = [None] * n, [None] * n
    if floating:
        qdd[0], a[0] = _root_acceleration(S0, A[0], a_base, tau[..., :6],
                                          model.armature[..., :6], batch)
    for i in range(int(floating), n):
        parent = model.tree.parents[i]
        a_parent = a_base if parent < 0 else a[parent]
        # qdd = (u - U . (a_parent + c)) / D, with a_parent augmented by a trailing 1.
        qdd[i] = small_matmul(w[i], a_parent) * neg_D_inv[i]
        a[i] = a_parent + c7_l[i] + S7_l[i] * qdd[i]
    return torch.cat(qdd, dim=-1).squeeze(-2)


def _root_acceleration(S0: Tensor, A_root: Tensor, a_base: Tensor, tau_root: Tensor,
                       armature_root: Tensor, batch: torch.Size) -> tuple:
    """
    Solve the free-flyer's 6x6 articulated system.

    :param S0: root motion subspace ``(..., 6, 6)`` (world, columns in ``v[:6]`` order).
    :param A_root: the root's augmented articulated inertia ``[I^A | p^A]`` ``(..., 6, 7)``.
    :param a_base: augmented fictitious base acceleration ``[a_g; 1]`` ``(..., 7, 1)``.
    :param tau_root: root wrench ``(..., 6)`` in root axes.
    :param armature_root: ``(..., 6)`` added to the diagonal.
    :param batch: the broadcast batch shape.
    :return: ``(a_root (..., 1, 6) in v[:6] order, augmented world acceleration of body 0
        (..., 7, 1))``.
    """
    S0 = S0.expand(batch + (6, 6))
    S0_T = S0.mT
    M_root = small_matmul(S0_T, small_matmul(A_root[..., :6], S0)) \
        + torch.diag_embed(armature_root.expand(batch + (6,)))
    rhs = tau_root - small_matvec(S0_T, small_matmul(A_root, a_base).squeeze(-1))
    a_root = torch.linalg.solve(M_root, rhs.unsqueeze(-1))
    a_body = a_base + torch.cat((small_matmul(S0, a_root), torch.zeros_like(a_root[..., :1, :])),
                                dim=-2)
    return a_root.mT, a_body
