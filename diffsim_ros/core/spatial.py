"""
Spatial algebra on batched tensors.

Spatial vectors are ``(..., 6)`` ordered ``[angular; linear]``; transforms ``T_a_b`` are
``(..., 4, 4)`` homogeneous matrices mapping frame-``b`` coordinates into frame ``a``.
Inertial parameters follow docs/conventions.md:
``pi = [m, m cx, m cy, m cz, Ixx, Ixy, Ixz, Iyy, Iyz, Izz]`` with the inertia about the
body-frame origin.
"""

import torch

Tensor = torch.Tensor

# (3, 3) index of the inertia tensor entries inside pi[4:10].
_INERTIA_INDEX = torch.tensor([[4, 5, 6], [5, 7, 8], [6, 8, 9]])


def small_matmul(A: Tensor, B: Tensor) -> Tensor:
    """
    Multiply batches of small matrices, ``A @ B``.

    Eager mode uses ``matmul``; under ``torch.compile`` the product is written as a
    broadcast multiply-and-sum so that Inductor fuses it with its neighbours instead of
    calling BLAS once per tiny matrix.

    :param A: ``(..., i, k)``.
    :param B: ``(..., k, j)``.
    :return: ``(..., i, j)``.
    """
    if torch.compiler.is_compiling():
        return (A.unsqueeze(-1) * B.unsqueeze(-3)).sum(-2)
    return A @ B


def small_matvec(A: Tensor, x: Tensor) -> Tensor:
    """
    Multiply batches of small matrices with vectors, ``A @ x``.

    :param A: ``(..., i, k)``.
    :param x: ``(..., k)``.
    :return: ``(..., i)``; fused under ``torch.compile`` like :func:`small_matmul`.
    """
    if torch.compiler.is_compiling():
        return (A * x.unsqueeze(-2)).sum(-1)
    return (A @ x.unsqueeze(-1)).squeeze(-1)


def skew(v: Tensor) -> Tensor:
    """
    Return the cross-product matrix of ``v``.

    :param v: vectors, shape ``(..., 3)``.
    :return: ``(..., 3, 3)`` matrices with ``skew(v) @ w == cross(v, w)``.
    """
    x, y, z = v.unbind(-1)
    zero = torch.zeros_like(x)
    return torch.stack(
        (zero, -z, y, z, zero, -x, -y, x, zero), dim=-1).reshape(v.shape[:-1] + (3, 3))


def rpy_to_matrix(rpy: Tensor) -> Tensor:
    """
    Convert URDF fixed-axis roll-pitch-yaw angles to rotation matrices.

    :param rpy: angles ``(..., 3)`` in rad, ``R = Rz(yaw) @ Ry(pitch) @ Rx(roll)``.
    :return: rotation matrices ``(..., 3, 3)``.
    """
    c = torch.cos(rpy)
    s = torch.sin(rpy)
    cr, cp, cy = c.unbind(-1)
    sr, sp, sy = s.unbind(-1)
    return torch.stack((
        cy * cp, cy * sp * sr - sy * cr, cy * sp * cr + sy * sr,
        sy * cp, sy * sp * sr + cy * cr, sy * sp * cr - cy * sr,
        -sp, cp * sr, cp * cr,
    ), dim=-1).reshape(rpy.shape[:-1] + (3, 3))


def matrix_to_rpy(R: Tensor) -> Tensor:
    """
    Convert rotation matrices to URDF roll-pitch-yaw angles (inverse of :func:`rpy_to_matrix`).

    :param R: rotation matrices ``(..., 3, 3)``.
    :return: angles ``(..., 3)`` in rad with pitch in ``[-pi/2, pi/2]``.
    """
    pitch = torch.atan2(-R[..., 2, 0], torch.hypot(R[..., 0, 0], R[..., 1, 0]))
    roll = torch.atan2(R[..., 2, 1], R[..., 2, 2])
    yaw = torch.atan2(R[..., 1, 0], R[..., 0, 0])
    return torch.stack((roll, pitch, yaw), dim=-1)


def homogeneous(R: Tensor, p: Tensor) -> Tensor:
    """
    Assemble homogeneous transforms.

    :param R: rotations ``(..., 3, 3)``.
    :param p: translations ``(..., 3)``, broadcastable against ``R``.
    :return: ``(..., 4, 4)`` transforms.
    """
    shape = torch.broadcast_shapes(R.shape[:-2], p.shape[:-1])
    R = R.expand(shape + (3, 3))
    p = p.expand(shape + (3,))
    top = torch.cat((R, p.unsqueeze(-1)), dim=-1)
    bottom = R.new_tensor([0.0, 0.0, 0.0, 1.0]).expand(shape + (1, 4))
    return torch.cat((top, bottom), dim=-2)


def transform_inverse(T: Tensor) -> Tensor:
    """
    Invert rigid transforms.

    :param T: ``(..., 4, 4)`` transforms ``T_a_b``.
    :return: ``T_b_a``, same shape.
    """
    R_t = T[..., :3, :3].mT
    return homogeneous(R_t, -(R_t @ T[..., :3, 3:]).squeeze(-1))


_MOTION_LEFT = torch.tensor([0, 0, 1])
_MOTION_RIGHT = torch.tensor([0, 1, 0])
_FORCE_LEFT = torch.tensor([0, 1, 0])
_FORCE_RIGHT = torch.tensor([0, 1, 1])


def _paired_cross(a: Tensor, b: Tensor, left: Tensor, right: Tensor) -> Tensor:
    """Cross products of the 3-vector halves of ``a`` and ``b`` selected by ``left``/``right``."""
    shape = torch.broadcast_shapes(a.shape, b.shape)
    a3 = a.expand(shape).unflatten(-1, (2, 3)).index_select(-2, left.to(a.device))
    b3 = b.expand(shape).unflatten(-1, (2, 3)).index_select(-2, right.to(b.device))
    return torch.linalg.cross(a3, b3)


def motion_cross(v: Tensor, m: Tensor) -> Tensor:
    """
    Spatial motion cross product ``v x m`` (Featherstone's ``crm(v) m``).

    :param v: spatial velocities ``(..., 6)``.
    :param m: spatial motion vectors ``(..., 6)``.
    :return: ``(..., 6)`` equal to ``[w x mw; w x ml + vl x mw]``.
    """
    c = _paired_cross(v, m, _MOTION_LEFT, _MOTION_RIGHT)
    return torch.cat((c[..., 0, :], c[..., 1, :] + c[..., 2, :]), dim=-1)


def force_cross(v: Tensor, f: Tensor) -> Tensor:
    """
    Spatial force cross product ``v x* f`` (Featherstone's ``crf(v) f``).

    :param v: spatial velocities ``(..., 6)``.
    :param f: spatial forces ``(..., 6)`` ordered ``[moment; force]``.
    :return: ``(..., 6)`` equal to ``[w x n + vl x fl; w x fl]``.
    """
    c = _paired_cross(v, f, _FORCE_LEFT, _FORCE_RIGHT)
    return torch.cat((c[..., 0, :] + c[..., 1, :], c[..., 2, :]), dim=-1)


def motion_transform_inverse(T_a_b: Tensor) -> Tensor:
    """
    Return the 6x6 matrix mapping motion vectors from frame ``a`` coordinates to ``b``.

    :param T_a_b: transforms ``(..., 4, 4)``.
    :return: ``X_b_a = [[R^T, 0], [-R^T skew(p), R^T]]`` with shape ``(..., 6, 6)``.
    """
    R_t = T_a_b[..., :3, :3].mT
    lower_left = -(R_t @ skew(T_a_b[..., :3, 3]))
    top = torch.cat((R_t, torch.zeros_like(R_t)), dim=-1)
    return torch.cat((top, torch.cat((lower_left, R_t), dim=-1)), dim=-2)


def inertia_tensor(pi: Tensor) -> Tensor:
    """
    Return the 3x3 rotational inertia about the body origin stored in ``pi``.

    :param pi: inertial parameters ``(..., 10)``.
    :return: ``(..., 3, 3)`` symmetric inertia tensors in kg m^2.
    """
    return pi[..., _INERTIA_INDEX.to(pi.device)]


def inertial_vector(m: Tensor, h: Tensor, I_origin: Tensor) -> Tensor:
    """
    Pack mass, first moment and origin inertia into the 10-vector ``pi``.

    :param m: masses ``(...)`` in kg.
    :param h: first moments ``m c``, ``(..., 3)`` in kg m.
    :param I_origin: inertia about the frame origin ``(..., 3, 3)`` in kg m^2.
    :return: ``(..., 10)``.
    """
    upper = torch.stack((I_origin[..., 0, 0], I_origin[..., 0, 1], I_origin[..., 0, 2],
                         I_origin[..., 1, 1], I_origin[..., 1, 2], I_origin[..., 2, 2]), -1)
    shape = torch.broadcast_shapes(m.shape, h.shape[:-1], upper.shape[:-1])
    return torch.cat((m.expand(shape).unsqueeze(-1), h.expand(shape + (3,)),
                      upper.expand(shape + (6,))), dim=-1)


def inertia_apply(pi: Tensor, v: Tensor) -> Tensor:
    """
    Multiply spatial inertias given by parameters with motion vectors, ``I(pi) @ v``.

    Cheaper than forming the 6x6 matrix: ``[I_o w + h x vl; m vl - h x w]``.

    :param pi: inertial parameters ``(..., 10)``.
    :param v: spatial motion vectors ``(..., 6)``.
    :return: spatial momenta / forces ``(..., 6)``.
    """
    h = pi[..., 1:4].unsqueeze(-2)
    v3 = v.unflatten(-1, (2, 3))
    shape = torch.broadcast_shapes(h.shape[:-2], v3.shape[:-2]) + (2, 3)
    h_cross = torch.linalg.cross(h.expand(shape), v3.expand(shape))   # [h x w; h x vl]
    top = small_matvec(inertia_tensor(pi), v[..., :3]) + h_cross[..., 1, :]
    bottom = pi[..., :1] * v[..., 3:] - h_cross[..., 0, :]
    return torch.cat((top, bottom), dim=-1)


def spatial_inertia(pi: Tensor) -> Tensor:
    """
    Build 6x6 spatial inertias from inertial parameters.

    :param pi: inertial parameters ``(..., 10)`` about the frame origin.
    :return: ``(..., 6, 6)`` matrices ``[[I, skew(h)], [skew(h)^T, m E]]``.
    """
    m = pi[..., 0]
    S_h = skew(pi[..., 1:4])
    eye = torch.eye(3, dtype=pi.dtype, device=pi.device)
    top = torch.cat((inertia_tensor(pi), S_h), dim=-1)
    bottom = torch.cat((S_h.mT, m[..., None, None] * eye), dim=-1)
    return torch.cat((top, bottom), dim=-2)


def transform_inertial(pi: Tensor, T_a_b: Tensor) -> Tensor:
    """
    Express inertial parameters given in frame ``b`` in frame ``a``.

    :param pi: inertial parameters ``(..., 10)`` about the origin of ``b``, axes of ``b``.
    :param T_a_b: transforms ``(..., 4, 4)``.
    :return: ``(..., 10)`` about the origin of ``a``, axes of ``a``.
    """
    R = T_a_b[..., :3, :3]
    p = T_a_b[..., :3, 3]
    m = pi[..., 0]
    h = small_matvec(R, pi[..., 1:4])
    I_rot = small_matmul(small_matmul(R, inertia_tensor(pi)), R.mT)
    # Parallel-axis theorem written with the first moment h = m c rotated into a.
    p_dot_h = (p * h).sum(-1)
    p_sq = (p * p).sum(-1)
    eye = torch.eye(3, dtype=pi.dtype, device=pi.device)
    ph = p.unsqueeze(-1) * h.unsqueeze(-2)
    I_a = (I_rot + (2.0 * p_dot_h + m * p_sq)[..., None, None] * eye
           - ph - ph.mT - m[..., None, None] * p.unsqueeze(-1) * p.unsqueeze(-2))
    return inertial_vector(m, h + m.unsqueeze(-1) * p, I_a)


# Quaternions are (..., 4) ordered (x, y, z, w) (Pinocchio, Eigen coefficients, ROS).
# Below this squared angle (rad^2) the exponential/log use their Taylor series, so that values
# and gradients stay finite and exact at zero rotation; the series' truncation error there is
# below 3e-17 relative, under float64 rounding.
SMALL_ANGLE_SQ = 1e-4


def quat_multiply(q1: Tensor, q2: Tensor) -> Tensor:
    """
    Hamilton product ``q1 * q2`` (rotation ``q2`` first, then ``q1``).

    :param q1: quaternions ``(..., 4)`` (x, y, z, w).
    :param q2: quaternions ``(..., 4)`` (x, y, z, w), broadcastable against ``q1``.
    :return: ``(..., 4)`` (x, y, z, w), not renormalised.
    """
    v1, w1 = q1[..., :3], q1[..., 3:]
    v2, w2 = q2[..., :3], q2[..., 3:]
    shape = torch.broadcast_shapes(v1.shape, v2.shape)
    vec = w1 * v2 + w2 * v1 + torch.linalg.cross(v1.expand(shape), v2.expand(shape))
    scalar = w1 * w2 - (v1 * v2).sum(-1, keepdim=True)
    return torch.cat((vec, scalar), dim=-1)


def quat_conjugate(q: Tensor) -> Tensor:
    """
    Return the conjugate (the inverse of a unit quaternion).

    :param q: quaternions ``(..., 4)`` (x, y, z, w).
    :return: ``(..., 4)`` equal to ``(-x, -y, -z, w)``.
    """
    return torch.cat((-q[..., :3], q[..., 3:]), dim=-1)


def quat_rotate(q: Tensor, v: Tensor) -> Tensor:
    """
    Rotate vectors by unit quaternions, ``R(q) @ v``.

    :param q: unit quaternions ``(..., 4)`` (x, y, z, w).
    :param v: vectors ``(..., 3)``, broadcastable against ``q``.
    :return: ``(..., 3)``.
    """
    u, w = q[..., :3], q[..., 3:]
    shape = torch.broadcast_shapes(u.shape, v.shape)
    u = u.expand(shape)
    t = 2.0 * torch.linalg.cross(u, v.expand(shape))
    return v + w * t + torch.linalg.cross(u, t)


def quat_to_matrix(q: Tensor) -> Tensor:
    """
    Convert quaternions to rotation matrices, the rotation of ``q / |q|``.

    Dividing by the squared norm (instead of assuming a unit quaternion) makes the matrix
    invariant to the quaternion's scale, so gradients w.r.t. its four entries are tangent to
    the unit sphere; for a unit quaternion this is the usual (Pinocchio's) matrix.

    :param q: nonzero quaternions ``(..., 4)`` (x, y, z, w).
    :return: ``(..., 3, 3)`` rotation matrices.
    """
    x, y, z, w = q.unbind(-1)
    s = 2.0 / (q * q).sum(-1)
    xx, yy, zz = s * x * x, s * y * y, s * z * z
    xy, xz, yz = s * x * y, s * x * z, s * y * z
    wx, wy, wz = s * w * x, s * w * y, s * w * z
    return torch.stack((
        1.0 - yy - zz, xy - wz, xz + wy,
        xy + wz, 1.0 - xx - zz, yz - wx,
        xz - wy, yz + wx, 1.0 - xx - yy,
    ), dim=-1).reshape(q.shape[:-1] + (3, 3))


def matrix_to_quat(R: Tensor) -> Tensor:
    """
    Convert rotation matrices to unit quaternions (Shepperd's method, ``w >= 0``).

    :param R: rotation matrices ``(..., 3, 3)``.
    :return: ``(..., 4)`` (x, y, z, w); of the two signs the one with ``w >= 0``.
    """
    r = R.flatten(-2)
    m00, m01, m02, m10, m11, m12, m20, m21, m22 = r.unbind(-1)
    # Four candidate formulas, each well conditioned when its pivot is the largest.
    pivots = torch.stack((1 + m00 + m11 + m22, 1 + m00 - m11 - m22,
                          1 - m00 + m11 - m22, 1 - m00 - m11 + m22), dim=-1)
    best = pivots.argmax(-1, keepdim=True)
    s = 2.0 * torch.sqrt(pivots.gather(-1, best).squeeze(-1).clamp_min(1e-300))
    candidates = torch.stack((
        torch.stack(((m21 - m12) / s, (m02 - m20) / s, (m10 - m01) / s, 0.25 * s), -1),
        torch.stack((0.25 * s, (m01 + m10) / s, (m02 + m20) / s, (m21 - m12) / s), -1),
        torch.stack(((m01 + m10) / s, 0.25 * s, (m12 + m21) / s, (m02 - m20) / s), -1),
        torch.stack(((m02 + m20) / s, (m12 + m21) / s, 0.25 * s, (m10 - m01) / s), -1),
    ), dim=-2)
    index = best.unsqueeze(-1).expand(best.shape[:-1] + (1, 4))
    q = candidates.gather(-2, index).squeeze(-2)
    return torch.where(q[..., 3:] < 0, -q, q)


def quat_exp(w: Tensor) -> Tensor:
    """
    Return the unit quaternion of the rotation vector ``w`` (``exp`` of ``w / 2``).

    A Taylor series below :data:`SMALL_ANGLE_SQ` keeps gradients finite and exact at zero.

    :param w: rotation vectors ``(..., 3)`` in rad (axis times angle).
    :return: ``(..., 4)`` (x, y, z, w) with ``w >= 0`` for angles up to pi.
    """
    theta_sq = (w * w).sum(-1, keepdim=True)
    small = theta_sq < SMALL_ANGLE_SQ
    theta = torch.sqrt(torch.where(small, torch.ones_like(theta_sq), theta_sq))
    half = 0.5 * theta
    # sin(theta / 2) / theta and cos(theta / 2), exact or by series in theta^2.
    sinc = torch.where(small, 0.5 - theta_sq / 48.0 + theta_sq * theta_sq / 3840.0,
                       torch.sin(half) / theta)
    cos = torch.where(small, 1.0 - theta_sq / 8.0 + theta_sq * theta_sq / 384.0,
                      torch.cos(half))
    return torch.cat((sinc * w, cos), dim=-1)


def quat_log(q: Tensor) -> Tensor:
    """
    Return the rotation vector of a unit quaternion (inverse of :func:`quat_exp`).

    The sign of ``q`` is chosen so that the angle lies in ``[0, pi]`` (the shortest rotation);
    a series near zero angle keeps gradients finite and exact.

    :param q: unit quaternions ``(..., 4)`` (x, y, z, w).
    :return: rotation vectors ``(..., 3)`` in rad, norm in ``[0, pi]``.
    """
    q = torch.where(q[..., 3:] < 0, -q, q)
    u, c = q[..., :3], q[..., 3:]
    s_sq = (u * u).sum(-1, keepdim=True)
    small = s_sq < SMALL_ANGLE_SQ * c * c
    s = torch.sqrt(torch.where(small, torch.ones_like(s_sq), s_sq))
    # angle / sin(angle / 2) = 2 atan2(s, c) / s; series of atan(x) / x in x^2 = s^2 / c^2.
    c_safe = torch.where(small, c, torch.ones_like(c))
    x_sq = s_sq / (c_safe * c_safe)
    series = 2.0 / c_safe * (1.0 - x_sq / 3.0 + x_sq * x_sq / 5.0 - x_sq ** 3 / 7.0)
    return torch.where(small, series, 2.0 * torch.atan2(s, c) / s) * u
