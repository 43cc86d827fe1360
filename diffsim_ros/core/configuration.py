"""
Configuration space: exact integration and differences of ``q``, and conversions.

A floating model's configuration is ``q = [p_world (3), quat (x, y, z, w), joints]`` and its
velocity ``v = [linear velocity of the root origin in root axes (3), angular velocity in root
axes (3), joint rates]`` (Pinocchio's free-flyer).  :func:`integrate` moves the root along the
SE(3) exponential of the body twist, exactly as ``pinocchio.integrate``; :func:`difference`
is its inverse (``pinocchio.difference``).  Fixed-base models keep ``q + dt v`` and ``q1 - q0``.
The conversions to MuJoCo ``qpos``/``qvel`` and ROS poses/twists are in docs/conventions.md.
"""

from typing import Dict, Tuple

import torch

from .errors import check_trailing_shape
from .kinematics import root_transform
from .model import RobotModel
from .spatial import (matrix_to_quat, quat_conjugate, quat_exp, quat_log, quat_multiply,
                      quat_rotate, SMALL_ANGLE_SQ)

Tensor = torch.Tensor

#: Largest ``| |quat| - 1 |`` that :func:`check_configuration` accepts by default: loose
#: enough for a float32 state or a quaternion stored with 7 significant digits, tight enough
#: that a user who passes Euler angles or an unnormalised estimate is told.
QUATERNION_NORM_TOLERANCE = 1e-6


def is_floating(model: RobotModel) -> bool:
    """
    Return whether ``model`` has a free-flyer root joint.

    :param model: a robot model.
    :return: ``model.floating_base``.
    """
    return model.floating_base


def configuration_sizes(model: RobotModel) -> Tuple[int, int]:
    """
    Return ``(nq, nv)``, the sizes of a configuration and of a velocity.

    :param model: a robot model.
    :return: ``(model.nq, model.nv)``; ``(n, n)`` for a fixed-base model.
    """
    return model.nq, model.nv


def _series_or_exact(theta_sq: Tensor, small: Tensor, series, exact) -> Tensor:
    """Evaluate ``exact(theta)`` away from zero and ``series(theta^2)`` near it, grad-safe."""
    theta = torch.sqrt(torch.where(small, torch.ones_like(theta_sq), theta_sq))
    return torch.where(small, series(theta_sq), exact(theta))


def se3_left_jacobian_apply(w: Tensor, u: Tensor) -> Tensor:
    """
    Return ``V(w) u``, the translation of the SE(3) exponential of the twist ``(u, w)``.

    ``V = E + (1 - cos t) / t^2 [w] + (t - sin t) / t^3 [w]^2`` with ``t = |w|``.

    :param w: angular parts ``(..., 3)`` in rad.
    :param u: linear parts ``(..., 3)``.
    :return: ``(..., 3)``.
    """
    theta_sq = (w * w).sum(-1, keepdim=True)
    small = theta_sq < SMALL_ANGLE_SQ
    a = _series_or_exact(theta_sq, small, lambda t2: 0.5 - t2 / 24.0 + t2 * t2 / 720.0,
                         lambda t: (1.0 - torch.cos(t)) / (t * t))
    b = _series_or_exact(theta_sq, small,
                         lambda t2: 1.0 / 6.0 - t2 / 120.0 + t2 * t2 / 5040.0,
                         lambda t: (t - torch.sin(t)) / (t * t * t))
    shape = torch.broadcast_shapes(w.shape, u.shape)
    w = w.expand(shape)
    w_u = torch.linalg.cross(w, u.expand(shape))
    return u + a * w_u + b * torch.linalg.cross(w, w_u)


def se3_left_jacobian_inverse_apply(w: Tensor, p: Tensor) -> Tensor:
    """
    Return ``V(w)^-1 p`` (see :func:`se3_left_jacobian_apply`), for ``|w| <= pi``.

    ``V^-1 = E - [w] / 2 + (1 - (t / 2) cot(t / 2)) / t^2 [w]^2``.

    :param w: angular parts ``(..., 3)`` in rad, norm at most pi.
    :param p: translations ``(..., 3)``.
    :return: ``(..., 3)``.
    """
    theta_sq = (w * w).sum(-1, keepdim=True)
    small = theta_sq < SMALL_ANGLE_SQ
    c = _series_or_exact(
        theta_sq, small, lambda t2: 1.0 / 12.0 + t2 / 720.0 + t2 * t2 / 30240.0,
        lambda t: (1.0 - 0.5 * t * torch.cos(0.5 * t) / torch.sin(0.5 * t)) / (t * t))
    shape = torch.broadcast_shapes(w.shape, p.shape)
    w = w.expand(shape)
    w_p = torch.linalg.cross(w, p.expand(shape))
    return p - 0.5 * w_p + c * torch.linalg.cross(w, w_p)


def integrate(model: RobotModel, q: Tensor, v: Tensor, dt: float = 1.0) -> Tensor:
    """
    Return the configuration reached from ``q`` by moving with velocity ``v`` for ``dt``.

    Floating root: ``M' = M exp(dt [v_lin; w])`` on SE(3) (``pinocchio.integrate``), the
    quaternion renormalised; other joints ``q + dt v``.  No checks (hot path).

    :param model: the robot (only its layout is used).
    :param q: configurations ``(..., nq)``.
    :param v: velocities ``(..., nv)``, broadcastable against ``q``.
    :param dt: time step in s (or a scale; a tensor broadcastable to ``(..., 1)``).
    :return: ``(..., nq)``.
    """
    if not is_floating(model):
        return q + dt * v
    step = dt * v
    p, quat = q[..., :3], q[..., 3:7]
    u, w = step[..., :3], step[..., 3:6]
    p_next = p + quat_rotate(quat, se3_left_jacobian_apply(w, u))
    quat_next = quat_multiply(quat, quat_exp(w))
    quat_next = quat_next / torch.linalg.vector_norm(quat_next, dim=-1, keepdim=True)
    shape = torch.broadcast_shapes(q.shape[:-1], v.shape[:-1])
    return torch.cat((p_next.expand(shape + (3,)), quat_next.expand(shape + (4,)),
                      q[..., 7:] + step[..., 6:]), dim=-1)


def difference(model: RobotModel, q0: Tensor, q1: Tensor) -> Tensor:
    """
    Return the velocity that :func:`integrate` needs to go from ``q0`` to ``q1`` in unit time.

    Floating root: ``log(M0^-1 M1)`` on SE(3) as ``[linear; angular]`` in ``q0``'s root axes
    (``pinocchio.difference``), rotation angle in ``[0, pi]``; other joints ``q1 - q0``.

    :param model: the robot (only its layout is used).
    :param q0: start configurations ``(..., nq)`` with unit quaternions.
    :param q1: end configurations ``(..., nq)``, broadcastable against ``q0``.
    :return: ``(..., nv)``.
    """
    if not is_floating(model):
        return q1 - q0
    quat0_inv = quat_conjugate(q0[..., 3:7])
    w = quat_log(quat_multiply(quat0_inv, q1[..., 3:7]))
    p_local = quat_rotate(quat0_inv, q1[..., :3] - q0[..., :3])
    u = se3_left_jacobian_inverse_apply(w, p_local)
    return torch.cat((u, w, q1[..., 7:] - q0[..., 7:]), dim=-1)


def normalize(model: RobotModel, q: Tensor) -> Tensor:
    """
    Return ``q`` with a unit root quaternion (unchanged for fixed-base models).

    :param model: the robot.
    :param q: configurations ``(..., nq)``.
    :return: ``(..., nq)``.
    """
    if not is_floating(model):
        return q
    quat = q[..., 3:7]
    quat = quat / torch.linalg.vector_norm(quat, dim=-1, keepdim=True)
    return torch.cat((q[..., :3], quat, q[..., 7:]), dim=-1)


def check_configuration(model: RobotModel, q: Tensor,
                        tolerance: float = QUATERNION_NORM_TOLERANCE) -> None:
    """
    Raise ``ValueError`` unless ``q`` has the model's size and a unit root quaternion.

    :param model: the robot.
    :param q: configurations ``(..., nq)``.
    :param tolerance: largest accepted ``| |quat| - 1 |``; see
        :data:`QUATERNION_NORM_TOLERANCE`.
    :raises ShapeError: if the last dim is not ``nq``.
    :raises ValueError: on a non-finite entry or a quaternion off the unit sphere, naming the
        first offending batch index and its norm.
    """
    nq, _ = configuration_sizes(model)
    check_trailing_shape('q', q, (nq,))
    bad = ~torch.isfinite(q).all(-1)
    if bad.any():
        index = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(f'q: non-finite configuration at batch index {index}')
    if not is_floating(model):
        return
    error = (torch.linalg.vector_norm(q[..., 3:7], dim=-1) - 1.0).abs()
    bad = error > tolerance
    if bad.any():
        index = tuple(int(i) for i in bad.nonzero()[0])
        norm = float(torch.linalg.vector_norm(q[index + (slice(3, 7),)]))
        raise ValueError(
            f'q: root quaternion q[..., 3:7] (x, y, z, w) at batch index {index} has norm '
            f'{norm:.9g}; expected 1 within {tolerance:g} (use normalize(model, q))')


def _root_rotate(q: Tensor, vec: Tensor, inverse: bool = False) -> Tensor:
    """Rotate ``vec`` from root to world axes (or back when ``inverse``)."""
    quat = q[..., 3:7]
    return quat_rotate(quat_conjugate(quat) if inverse else quat, vec)


def _require_floating(model: RobotModel, what: str) -> None:
    """Raise ``ValueError`` for a fixed-base model where a free root is needed."""
    if not is_floating(model):
        raise ValueError(f'{what} needs a floating-base model (load_urdf(..., '
                         'floating_base=True)); this model is fixed to the world')


def free_joint_to_mujoco(q: Tensor, v: Tensor) -> Tuple[Tensor, Tensor]:
    """
    Convert a free-flyer ``(q, v)`` layout to MuJoCo's free-joint layout, whatever follows.

    MuJoCo's free joint stores ``[p_world, quat (w, x, y, z)]`` and ``[linear velocity in
    world axes, angular velocity in body axes]``; entries after the root are copied.  Many
    recorded data sets (ContactNets, dair_pll tosses) use this layout too.

    :param q: configurations ``(..., 7 + k)`` in our layout.
    :param v: velocities ``(..., 6 + k)`` in our layout.
    :return: ``(qpos (..., 7 + k), qvel (..., 6 + k))``.
    """
    quat = q[..., 3:7]
    qpos = torch.cat((q[..., :3], quat[..., 3:], quat[..., :3], q[..., 7:]), dim=-1)
    qvel = torch.cat((_root_rotate(q, v[..., :3]), v[..., 3:]), dim=-1)
    return qpos, qvel


def free_joint_from_mujoco(qpos: Tensor, qvel: Tensor) -> Tuple[Tensor, Tensor]:
    """
    Convert MuJoCo's free-joint layout to ours (inverse of :func:`free_joint_to_mujoco`).

    :param qpos: ``(..., 7 + k)`` with the quaternion (w, x, y, z) at ``[3:7]``.
    :param qvel: ``(..., 6 + k)`` with the linear velocity in world axes at ``[0:3]``.
    :return: ``(q (..., 7 + k), v (..., 6 + k))``.
    """
    q = torch.cat((qpos[..., :3], qpos[..., 4:7], qpos[..., 3:4], qpos[..., 7:]), dim=-1)
    v = torch.cat((_root_rotate(q, qvel[..., :3], inverse=True), qvel[..., 3:]), dim=-1)
    return q, v


def to_mujoco(model: RobotModel, q: Tensor, v: Tensor) -> Tuple[Tensor, Tensor]:
    """
    Convert our ``(q, v)`` to MuJoCo ``qpos``/``qvel`` of a free joint followed by hinges.

    See :func:`free_joint_to_mujoco`; hinge/slide joints are unchanged (same order assumed).
    Fixed-base models are returned as they are.

    :param model: the robot.
    :param q: configurations ``(..., nq)``.
    :param v: velocities ``(..., nv)``.
    :return: ``(qpos (..., nq), qvel (..., nv))``.
    """
    if not is_floating(model):
        return q, v
    return free_joint_to_mujoco(q, v)


def from_mujoco(model: RobotModel, qpos: Tensor, qvel: Tensor) -> Tuple[Tensor, Tensor]:
    """
    Convert MuJoCo ``qpos``/``qvel`` to our ``(q, v)`` (inverse of :func:`to_mujoco`).

    :param model: the robot.
    :param qpos: ``(..., nq)`` with the free joint's quaternion (w, x, y, z).
    :param qvel: ``(..., nv)`` with the free joint's linear velocity in world axes.
    :return: ``(q (..., nq), v (..., nv))``.
    """
    if not is_floating(model):
        return qpos, qvel
    return free_joint_from_mujoco(qpos, qvel)


def _xyz(vec) -> Dict[str, float]:
    return {'x': float(vec[0]), 'y': float(vec[1]), 'z': float(vec[2])}


def _vector(d: Dict[str, float], keys: str = 'xyz') -> list:
    try:
        return [float(d[k]) for k in keys]
    except KeyError as error:
        raise ValueError(f'missing field {error.args[0]!r} (need {", ".join(keys)})') from None


def to_ros_pose(model: RobotModel, q: Tensor) -> Dict[str, Dict[str, float]]:
    """
    Return the root pose of one configuration as a ``geometry_msgs/Pose``-shaped dict.

    :param model: a floating-base robot.
    :param q: one configuration ``(nq,)``.
    :return: ``{'position': {x, y, z}, 'orientation': {x, y, z, w}}``, world frame, metres.
    """
    _require_floating(model, 'to_ros_pose')
    quat = q[3:7]
    return {'position': _xyz(q[:3]),
            'orientation': dict(_xyz(quat), w=float(quat[3]))}


def from_ros_pose(pose: Dict[str, Dict[str, float]], dtype=torch.float64) -> Tensor:
    """
    Return the root part ``[p_world, quat (x, y, z, w)]`` of a configuration from a pose dict.

    :param pose: ``{'position': {x, y, z}, 'orientation': {x, y, z, w}}`` as written by
        :func:`to_ros_pose` (or read field by field from a ``geometry_msgs/Pose``).
    :param dtype: dtype of the result.
    :return: ``(7,)``; concatenate the joint positions to get ``q``.
    """
    return torch.tensor(_vector(pose['position']) + _vector(pose['orientation'], 'xyzw'),
                        dtype=dtype)


_TWIST_FRAMES = ('world', 'body')


def _check_twist_frame(frame: str) -> None:
    if frame not in _TWIST_FRAMES:
        raise ValueError(f'unknown twist frame {frame!r}; valid: {", ".join(_TWIST_FRAMES)}')


def to_ros_twist(model: RobotModel, q: Tensor, v: Tensor,
                 frame: str = 'world') -> Dict[str, Dict[str, float]]:
    """
    Return the root velocity as a ``geometry_msgs/Twist``-shaped dict.

    :param model: a floating-base robot.
    :param q: one configuration ``(nq,)``.
    :param v: one velocity ``(nv,)``.
    :param frame: ``'world'`` (axes of the world frame, the usual ``header.frame_id``) or
        ``'body'`` (root axes, as ``v`` stores it).  Linear is the root origin's velocity.
    :return: ``{'linear': {x, y, z}, 'angular': {x, y, z}}`` in m/s and rad/s.
    """
    _require_floating(model, 'to_ros_twist')
    _check_twist_frame(frame)
    linear, angular = v[:3], v[3:6]
    if frame == 'world':
        linear, angular = _root_rotate(q, linear), _root_rotate(q, angular)
    return {'linear': _xyz(linear), 'angular': _xyz(angular)}


def from_ros_twist(q: Tensor, twist: Dict[str, Dict[str, float]],
                   frame: str = 'world') -> Tensor:
    """
    Return the root part ``[linear; angular]`` (root axes) of ``v`` from a twist dict.

    :param q: the configuration ``(nq,)`` (or its root part ``(7,)``) the twist belongs to.
    :param twist: ``{'linear': {x, y, z}, 'angular': {x, y, z}}``.
    :param frame: ``'world'`` or ``'body'``, see :func:`to_ros_twist`.
    :return: ``(6,)`` in q's dtype; concatenate the joint rates to get ``v``.
    """
    _check_twist_frame(frame)
    root = q.new_tensor([_vector(twist['linear']), _vector(twist['angular'])])
    if frame == 'world':
        root = _root_rotate(q, root, inverse=True)
    return root.reshape(6)


def root_pose_matrix(q: Tensor) -> Tensor:
    """
    Return the world pose of the root frame, ``T_world_root``.

    :param q: floating-base configurations ``(..., nq)``.
    :return: ``(..., 4, 4)``.
    """
    return root_transform(q)


def root_configuration(T_world_root: Tensor) -> Tensor:
    """
    Return ``[p_world, quat (x, y, z, w)]`` of a root pose (inverse of :func:`root_pose_matrix`).

    :param T_world_root: ``(..., 4, 4)`` rigid transforms.
    :return: ``(..., 7)``.
    """
    return torch.cat((T_world_root[..., :3, 3], matrix_to_quat(T_world_root[..., :3, :3])), -1)
