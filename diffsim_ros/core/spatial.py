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
