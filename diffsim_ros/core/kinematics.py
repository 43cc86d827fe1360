"""Forward kinematics, world-frame motion subspaces and link Jacobians."""

import torch

from .errors import check_trailing_shape
from .model import RobotModel
from .spatial import small_matmul, small_matvec, transform_inertial

Tensor = torch.Tensor

FRAMES = ('world', 'local', 'local_world_aligned')


def joint_transforms(model: RobotModel, q: Tensor) -> Tensor:
    """
    Return each body's pose in its parent body, ``T_parent_body(q)``.

    :param model: the robot.
    :param q: joint positions ``(..., n)`` (rad or m).
    :return: ``(..., n, 4, 4)``.
    """
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
    :param q: joint positions ``(..., n)``.
    :return: ``T_world_body`` with shape ``(..., n, 4, 4)``.
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
    :param q: joint positions ``(..., n)``.
    :return: ``T_world_link`` with shape ``(..., n_links, 4, 4)`` in ``model.link_names`` order
        (fixed links included; links fixed to the base keep their constant pose).
    """
    check_trailing_shape('q', q, (model.n,))
    T_world_body = body_poses(model, q)
    eye = torch.eye(4, dtype=q.dtype, device=q.device).expand(T_world_body.shape[:-3] + (1, 4, 4))
    # Index n stands for the base (body -1).
    padded = torch.cat((T_world_body, eye), dim=-3)
    index = torch.tensor([b if b >= 0 else model.n for b in model.tree.link_bodies],
                         device=q.device)
    return padded.index_select(-3, index) @ model.tree.T_body_link


def motion_subspaces(model: RobotModel, T_world_body: Tensor) -> Tensor:
    """
    Return joint motion subspaces in world coordinates (about the world origin).

    :param model: the robot.
    :param T_world_body: body poses ``(..., n, 4, 4)``.
    :return: ``S`` with shape ``(..., n, 6)``: the spatial velocity of body i due to a unit
        rate of joint i.
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
    :param T_world_body: body poses ``(..., n, 4, 4)``.
    :return: ``(..., n, 10)``.
    """
    return transform_inertial(model.inertial, T_world_body)


def jacobian(model: RobotModel, q: Tensor, link: str,
             frame: str = 'local_world_aligned') -> Tensor:
    """
    Return the geometric Jacobian of a link, rows ``[angular; linear]``.

    :param model: the robot.
    :param q: joint positions ``(..., n)``.
    :param link: link name (any link, fixed ones included).
    :param frame: ``'world'`` (spatial velocity at the world origin, world axes),
        ``'local_world_aligned'`` (velocity of the link origin, world axes) or ``'local'``
        (velocity of the link origin in link axes).
    :return: ``(..., 6, n)``.
    """
    if frame not in FRAMES:
        raise ValueError(f'unknown frame {frame!r}; valid frames: {", ".join(FRAMES)}')
    check_trailing_shape('q', q, (model.n,))
    index = model.link_index(link)
    body = model.tree.link_bodies[index]
    T_world_body = body_poses(model, q)
    S = motion_subspaces(model, T_world_body)
    if body < 0:
        J = torch.zeros_like(S)
    else:
        J = S * model.tree.ancestors[body].unsqueeze(-1)
    J = J.transpose(-1, -2)
    if frame == 'world':
        return J
    T_world_link = forward_kinematics(model, q)[..., index, :, :]
    p = T_world_link[..., :3, 3].unsqueeze(-1).expand(J.shape[:-2] + (3, model.n))
    angular = J[..., :3, :]
    linear = J[..., 3:, :] + torch.linalg.cross(angular, p, dim=-2)
    if frame == 'local':
        R_t = T_world_link[..., :3, :3].mT
        angular, linear = R_t @ angular, R_t @ linear
    return torch.cat((angular, linear), dim=-2)
