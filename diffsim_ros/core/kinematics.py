"""Forward kinematics, world-frame motion subspaces and link Jacobians."""

import torch

from .errors import check_trailing_shape
from .model import RobotModel
from .spatial import (homogeneous, quat_to_matrix, skew, small_matmul, small_matvec,
                      transform_inertial)

Tensor = torch.Tensor

FRAMES = ('world', 'local', 'local_world_aligned')


def check_state(model: RobotModel, q: Tensor, **tangent: Tensor) -> None:
    """
    Raise :class:`ShapeError` unless ``q`` ends with ``nq`` and each ``tangent`` with ``nv``.

    :param model: the robot.
    :param q: configurations ``(..., nq)``.
    :param tangent: velocities, accelerations or torques by argument name, ``(..., nv)``.
    """
    floating = model.tree.floating
    check_trailing_shape('q', q, (model.nq,), 'nq' if floating else '')
    for name, value in tangent.items():
        check_trailing_shape(name, value, (model.nv,), 'nv' if floating else '')


def root_transform(q: Tensor) -> Tensor:
    """
    Return the free-flyer's motion ``T(q[:7])``: translation ``q[:3]``, quaternion ``q[3:7]``.

    :param q: configurations ``(..., nq)`` of a floating-base model (or any ``(..., >= 7)``).
    :return: ``(..., 4, 4)``; the root body's pose is the root joint's origin times this.
    """
    return homogeneous(quat_to_matrix(q[..., 3:7]), q[..., :3])


def joint_positions(model: RobotModel, q: Tensor) -> Tensor:
    """
    Return one position per joint: ``q`` itself for a fixed base, else ``[0, q[7:]]``.

    :param model: the robot.
    :param q: configurations ``(..., nq)``.
    :return: ``(..., njoints)``; the free-flyer's entry is a placeholder zero.
    """
    if not model.tree.floating:
        return q
    return torch.cat((torch.zeros_like(q[..., :1]), q[..., 7:]), dim=-1)


def joint_rates(model: RobotModel, v: Tensor) -> Tensor:
    """
    Return one rate per joint: ``v`` for a fixed base, else ``[0, v[6:]]`` (1-DOF joints).

    :param model: the robot.
    :param v: velocities, accelerations or torques ``(..., nv)``.
    :return: ``(..., njoints)``; the free-flyer's entry is zero (see :func:`root_subspace`).
    """
    if not model.tree.floating:
        return v
    return torch.cat((torch.zeros_like(v[..., :1]), v[..., 6:]), dim=-1)


def root_subspace(T_world_root: Tensor) -> Tensor:
    """
    Return the free-flyer's motion subspace in world coordinates (about the world origin).

    :param T_world_root: root body poses ``(..., 4, 4)``.
    :return: ``S0`` with shape ``(..., 6, 6)``: ``S0 @ v[:6]`` is the root body's spatial
        velocity ``[angular; linear]`` in world coordinates, for ``v[:6] = [linear velocity
        of the root origin; angular velocity]`` in root axes (Pinocchio's order).
    """
    R = T_world_root[..., :3, :3]
    zero = torch.zeros_like(R)
    linear_columns = torch.cat((zero, R), dim=-2)
    angular_columns = torch.cat((R, small_matmul(skew(T_world_root[..., :3, 3]), R)), dim=-2)
    return torch.cat((linear_columns, angular_columns), dim=-1)


def joint_transforms(model: RobotModel, q: Tensor) -> Tensor:
    """
    Return each body's pose in its parent body, ``T_parent_body(q)``.

    :param model: the robot.
    :param q: configurations ``(..., nq)`` (rad or m; a floating base's ``q[:7]`` is the
        root position and quaternion x, y, z, w).
    :return: ``(..., njoints, 4, 4)``; a free-flyer's entry is ``T_world_root``.
    """
    if model.tree.floating:
        T = _joint_transforms(model, joint_positions(model, q))
        T_root = small_matmul(T[..., 0, :, :], root_transform(q))
        T, T_root = torch.broadcast_tensors(T, T_root.unsqueeze(-3))
        return torch.cat((T_root[..., :1, :, :], T[..., 1:, :, :]), dim=-3)
    return _joint_transforms(model, q)


def _joint_transforms(model: RobotModel, q: Tensor) -> Tensor:
    """Return ``T_parent_body`` of one-position-per-joint ``q`` (free-flyer: its origin)."""
    tree = model.tree
    s = torch.sin(q)[..., None, None]
    one_minus_c = (1.0 - torch.cos(q))[..., None, None]
    # Rodrigues' formula for revolute joints, a translation for prismatic ones; the generator
    # tensors are zero where a joint type does not apply.
    T_joint = tree.eye4 + s * tree.K + one_minus_c * tree.K2 + q[..., None, None] * tree.P
    return small_matmul(model.joint_origins(), T_joint)


def body_poses(model: RobotModel, q: Tensor) -> Tensor:
    """
    Return the world pose of every body (joint child frame).

    :param model: the robot.
    :param q: configurations ``(..., nq)``.
    :return: ``T_world_body`` with shape ``(..., njoints, 4, 4)``.
    """
    local = joint_transforms(model, q).unbind(-3)
    poses = []
    for i, parent in enumerate(model.tree.parents):
        poses.append(local[i] if parent < 0 else small_matmul(poses[parent], local[i]))
    return torch.stack(poses, dim=-3)


def forward_kinematics(model: RobotModel, q: Tensor) -> Tensor:
    """
    Return the world pose of every link.

    :param model: the robot.
    :param q: configurations ``(..., nq)``.
    :return: ``T_world_link`` with shape ``(..., n_links, 4, 4)`` in ``model.link_names`` order
        (fixed links included; links fixed to the world keep their constant pose).
    """
    check_state(model, q)
    T_world_body = body_poses(model, q)
    eye = torch.eye(4, dtype=q.dtype, device=q.device).expand(T_world_body.shape[:-3] + (1, 4, 4))
    # Index njoints stands for the world (body -1).
    padded = torch.cat((T_world_body, eye), dim=-3)
    index = torch.tensor([b if b >= 0 else model.tree.n for b in model.tree.link_bodies],
                         device=q.device)
    return padded.index_select(-3, index) @ model.tree.T_body_link


def motion_subspaces(model: RobotModel, T_world_body: Tensor) -> Tensor:
    """
    Return joint motion subspaces in world coordinates (about the world origin).

    :param model: the robot.
    :param T_world_body: body poses ``(..., njoints, 4, 4)``.
    :return: ``S`` with shape ``(..., njoints, 6)``: the spatial velocity of body i due to a
        unit rate of joint i (zero for a free-flyer: see :func:`root_subspace`).
    """
    tree = model.tree
    R = T_world_body[..., :3, :3]
    p = T_world_body[..., :3, 3]
    axis_world = small_matvec(R, tree.axis)
    angular = axis_world * tree.revolute_mask.unsqueeze(-1)
    linear = torch.linalg.cross(p, angular) + axis_world * tree.prismatic_mask.unsqueeze(-1)
    return torch.cat((angular, linear), dim=-1)


def world_inertial(model: RobotModel, T_world_body: Tensor) -> Tensor:
    """
    Return body inertial parameters about the world origin, in world axes.

    :param model: the robot.
    :param T_world_body: body poses ``(..., njoints, 4, 4)``.
    :return: ``(..., njoints, 10)``.
    """
    return transform_inertial(model.inertial, T_world_body)


def jacobian(model: RobotModel, q: Tensor, link: str,
             frame: str = 'local_world_aligned') -> Tensor:
    """
    Return the geometric Jacobian of a link, rows ``[angular; linear]``.

    :param model: the robot.
    :param q: configurations ``(..., nq)``.
    :param link: link name (any link, fixed ones included).
    :param frame: ``'world'`` (spatial velocity at the world origin, world axes),
        ``'local_world_aligned'`` (velocity of the link origin, world axes) or ``'local'``
        (velocity of the link origin in link axes).
    :return: ``(..., 6, nv)``; a floating base's first six columns belong to ``v[:6]``.
    """
    if frame not in FRAMES:
        raise ValueError(f'unknown frame {frame!r}; valid frames: {", ".join(FRAMES)}')
    check_state(model, q)
    index = model.link_index(link)
    body = model.tree.link_bodies[index]
    T_world_body = body_poses(model, q)
    S = motion_subspaces(model, T_world_body)
    if body < 0:
        J = torch.zeros_like(S)
    else:
        J = S * model.tree.ancestors[body].unsqueeze(-1)
    J = J.transpose(-1, -2)
    if model.tree.floating:
        S0 = root_subspace(T_world_body[..., 0, :, :])
        if body < 0:
            S0 = torch.zeros_like(S0)
        J = torch.cat((S0, J[..., 1:]), dim=-1)
    if frame == 'world':
        return J
    T_world_link = forward_kinematics(model, q)[..., index, :, :]
    p = T_world_link[..., :3, 3].unsqueeze(-1).expand(J.shape[:-2] + (3, model.nv))
    angular = J[..., :3, :]
    linear = J[..., 3:, :] + torch.linalg.cross(angular, p, dim=-2)
    if frame == 'local':
        R_t = T_world_link[..., :3, :3].mT
        angular, linear = R_t @ angular, R_t @ linear
    return torch.cat((angular, linear), dim=-2)
