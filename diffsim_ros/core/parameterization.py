"""
Physically consistent parameterizations of rigid-body inertia and joint kinematics.

Every inertial parameterization maps an unconstrained tensor ``theta`` of shape
``(..., n_bodies, k)`` to inertial 10-vectors ``pi`` of shape ``(..., n_bodies, 10)``
(``pi = [m, m cx, m cy, m cz, Ixx, Ixy, Ixz, Iyy, Iyz, Izz]``, inertia about the body-frame
origin, see ``docs/conventions.md``) and back. ``'diffnea'`` and ``'log_cholesky'`` produce a
physically consistent body (positive-definite pseudo-inertia) for every finite ``theta``;
``'raw'`` is the identity for least-squares baselines.

References: Lutter et al., "Differentiable Physics Models for Real-world Offline Model-based
Reinforcement Learning", ICRA 2021 (section 3.2, virtual physical parameters); Rucker and
Wensing, "Smooth Parameterization of Rigid-Body Inertia", RA-L 2022 (log-Cholesky); Wensing et
al., "Linear Matrix Inequalities for Physically Consistent Inertial Parameter Identification",
RA-L 2017 (pseudo-inertia).

Limits of float64: a parameterization is consistent in exact arithmetic, but ``pi`` stores the
inertia about the link origin, ``I = I_com + m (|c|^2 E - c c^T)``; when ``I_com`` is below
about 1e-16 of ``m |c|^2`` it is lost to round-off in ``pi`` itself, whatever produced it.
"""

import abc
from typing import Dict, Optional, Tuple, Type, Union

import torch
from torch import Tensor
import torch.nn.functional as F

from .errors import check_trailing_shape
from .spatial import inertia_tensor, inertial_vector

__all__ = [
    'InertialParameterization',
    'DiffNEAParameterization',
    'LogCholeskyParameterization',
    'RawParameterization',
    'KinematicParameterization',
    'make_parameterization',
    'pseudo_inertia',
    'inertial_from_pseudo_inertia',
    'is_physically_consistent',
    'inertial_from_mass_com_inertia',
    'mass_com_inertia',
    'regularize_inertial',
]

# Above this argument softplus(x) == x to float64 precision (exp(-40) ~ 4e-18); torch's default
# threshold of 20 would cost 2e-9 absolute, more than the round-trip tolerance.
_SOFTPLUS_THRESHOLD = 40.0


def _softplus(x: Tensor) -> Tensor:
    return F.softplus(x, beta=1.0, threshold=_SOFTPLUS_THRESHOLD)


def _softplus_inverse(y: Tensor) -> Tensor:
    # log(exp(y) - 1) written so that it neither overflows for large y nor loses digits for
    # tiny y; y <= 0 gives -inf / nan, callers check positivity first.
    return y + torch.log(-torch.expm1(-y))


def _eye3_like(x: Tensor) -> Tensor:
    return torch.eye(3, dtype=x.dtype, device=x.device)


def _so3_exp(omega: Tensor) -> Tensor:
    """Rotation matrix ``(..., 3, 3)`` of a rotation vector ``omega (..., 3)`` (Rodrigues)."""
    theta2 = (omega * omega).sum(-1)
    small = theta2 < torch.finfo(omega.dtype).eps ** 0.5
    # The safe value keeps sqrt and the divisions away from 0 so both branches have finite
    # gradients; torch.where then picks the Taylor series near the identity.
    theta = torch.sqrt(torch.where(small, torch.ones_like(theta2), theta2))
    half = 0.5 * theta
    a = torch.where(small, 1.0 - theta2 / 6.0, torch.sin(theta) / theta)
    # (1 - cos t) / t^2 = 0.5 (sin(t/2) / (t/2))^2, free of cancellation for small t.
    b = torch.where(small, 0.5 - theta2 / 24.0, 0.5 * (torch.sin(half) / half) ** 2)
    wx, wy, wz = omega.unbind(-1)
    zero = torch.zeros_like(wx)
    K = torch.stack((torch.stack((zero, -wz, wy), -1),
                     torch.stack((wz, zero, -wx), -1),
                     torch.stack((-wy, wx, zero), -1)), -2)
    return (_eye3_like(omega) + a[..., None, None] * K
            + b[..., None, None] * (K @ K))


def _so3_log(R: Tensor) -> Tensor:
    """
    Rotation vector ``(..., 3)`` of ``R`` ``(..., 3, 3)``; valid for angles below ~170 deg.

    Callers pass rotations of at most 120 deg (see ``DiffNEAParameterization``), where the
    closed form ``theta / (2 sin theta) vee(R - R^T)`` is well conditioned.
    """
    cos_theta = ((R.diagonal(dim1=-2, dim2=-1).sum(-1) - 1.0) * 0.5).clamp(-1.0, 1.0)
    theta = torch.acos(cos_theta)
    vee = torch.stack((R[..., 2, 1] - R[..., 1, 2], R[..., 0, 2] - R[..., 2, 0],
                       R[..., 1, 0] - R[..., 0, 1]), -1)
    small = theta < 1e-4
    safe = torch.where(small, torch.ones_like(theta), theta)
    scale = torch.where(small, 0.5 + theta * theta / 12.0, safe / (2.0 * torch.sin(safe)))
    return scale[..., None] * vee


def pseudo_inertia(pi: Tensor) -> Tensor:
    """
    Pseudo-inertia matrix of inertial 10-vectors.

    ``J = [[0.5 tr(I) E - I, m c], [m c^T, m]]``, i.e. the second moments ``int [x; 1][x; 1]^T dm``
    of the mass distribution in the body frame. ``pi`` is consistent iff ``J`` is positive
    definite.

    :param pi: inertial parameters ``(..., 10)`` (kg, kg m, kg m^2 about the body origin).
    :return: pseudo-inertia ``(..., 4, 4)``.
    """
    check_trailing_shape('pi', pi, (10,))
    inertia = inertia_tensor(pi)
    trace = inertia.diagonal(dim1=-2, dim2=-1).sum(-1)
    sigma = 0.5 * trace[..., None, None] * _eye3_like(pi) - inertia
    h = pi[..., 1:4]
    top = torch.cat((sigma, h[..., :, None]), -1)
    bottom = torch.cat((h, pi[..., :1]), -1)[..., None, :]
    return torch.cat((top, bottom), -2)


def inertial_from_pseudo_inertia(J: Tensor) -> Tensor:
    """
    Inertial 10-vectors from pseudo-inertia matrices (inverse of :func:`pseudo_inertia`).

    :param J: pseudo-inertia ``(..., 4, 4)``; only its symmetric part's upper triangle is read.
    :return: ``pi`` ``(..., 10)``.
    """
    check_trailing_shape('J', J, (4, 4))
    sigma = J[..., :3, :3]
    trace = sigma.diagonal(dim1=-2, dim2=-1).sum(-1)
    inertia = trace[..., None, None] * _eye3_like(J) - sigma
    return inertial_vector(J[..., 3, 3], J[..., :3, 3], inertia)


def is_physically_consistent(pi: Tensor, eps: float = 0.0) -> Tensor:
    """
    Whether each body's pseudo-inertia is positive definite, with a relative margin.

    The test is scale invariant: ``J`` is first congruence-scaled to unit diagonal,
    ``D J D`` with ``D = diag(J)^(-1/2)`` (positive definiteness is unchanged), and
    ``D J D - eps E`` must admit a Cholesky factorisation. The scaled matrix is the "correlation
    matrix" of the homogeneous coordinates ``[x; 1]`` of the mass distribution, so ``eps`` is
    dimensionless: ``0`` tests strict feasibility (to round-off), ``1e-6`` also rejects bodies
    closer than that to a point mass, a thin rod or a lamina.

    :param pi: inertial parameters ``(..., 10)``.
    :param eps: margin on the smallest eigenvalue of the unit-diagonal pseudo-inertia, in [0, 1).
    :return: boolean tensor ``(...)``.
    """
    J = pseudo_inertia(pi)
    diag = J.diagonal(dim1=-2, dim2=-1)
    valid = (diag > 0).all(-1) & torch.isfinite(J).all(-1).all(-1)
    eye = torch.eye(4, dtype=J.dtype, device=J.device)
    scale = torch.where(diag > 0, diag, torch.ones_like(diag)).rsqrt()
    J_unit = scale[..., :, None] * J * scale[..., None, :]
    J_unit = torch.where(valid[..., None, None], J_unit, eye)
    _, info = torch.linalg.cholesky_ex(J_unit - eps * eye)
    return valid & (info == 0)


def inertial_from_mass_com_inertia(mass: Tensor, com: Tensor, inertia_com: Tensor) -> Tensor:
    """
    Inertial 10-vector from mass, centre of mass and inertia about the centre of mass.

    Applies the parallel-axis theorem ``I = I_com + m (|c|^2 E - c c^T)``.

    :param mass: mass ``(...)`` in kg.
    :param com: centre of mass ``(..., 3)`` in the body frame, in m.
    :param inertia_com: inertia tensor ``(..., 3, 3)`` about the centre of mass, axes of the
        body frame, in kg m^2.
    :return: ``pi`` ``(..., 10)``; leading dims are the broadcast of the inputs'.
    """
    check_trailing_shape('com', com, (3,))
    check_trailing_shape('inertia_com', inertia_com, (3, 3))
    m = mass[..., None, None]
    cc = com[..., :, None] * com[..., None, :]
    c2 = (com * com).sum(-1)[..., None, None]
    inertia = inertia_com + m * (c2 * _eye3_like(com) - cc)
    return inertial_vector(mass, mass[..., None] * com, inertia)


def mass_com_inertia(pi: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """
    Mass, centre of mass and inertia about the centre of mass of inertial 10-vectors.

    Inverse of :func:`inertial_from_mass_com_inertia`; requires ``m != 0``.

    :param pi: inertial parameters ``(..., 10)``.
    :return: ``(mass (...), com (..., 3), inertia_com (..., 3, 3))`` in kg, m, kg m^2.
    """
    check_trailing_shape('pi', pi, (10,))
    mass = pi[..., 0]
    com = pi[..., 1:4] / mass[..., None]
    cc = com[..., :, None] * com[..., None, :]
    c2 = (com * com).sum(-1)[..., None, None]
    inertia_com = inertia_tensor(pi) - mass[..., None, None] * (c2 * _eye3_like(pi) - cc)
    return mass, com, inertia_com


def regularize_inertial(pi: Tensor, radius: float) -> Tensor:
    """
    Thicken degenerate bodies (point masses, thin rods, laminae) into feasible ones.

    Adds ``m r^2`` to every principal second moment of the mass distribution about the CoM,
    i.e. ``I_com += 2 m r^2 E``, as if each point of the body were smeared over a small ball.
    Use it before ``from_inertial`` on URDF bodies with zero or triangle-equality moments,
    which have no finite preimage under ``'diffnea'`` and ``'log_cholesky'``.

    :param pi: inertial parameters ``(..., 10)`` with ``m > 0``.
    :param radius: smearing radius in m, e.g. ``1e-3``.
    :return: regularised ``pi`` ``(..., 10)``.
    """
    check_trailing_shape('pi', pi, (10,))
    if not radius > 0:
        raise ValueError(f'radius must be > 0, got {radius}')
    mass = pi[..., 0]
    extra = 2.0 * mass * radius ** 2
    zero = torch.zeros_like(mass)
    delta = torch.stack((zero, zero, zero, zero, extra, zero, zero, extra, zero, extra), -1)
    return pi + delta


def _infeasible_error(bad: Tensor, name: str) -> ValueError:
    index = [tuple(i) for i in torch.nonzero(bad).tolist()]
    shown = ', '.join(str(i) for i in index[:8]) + (' ...' if len(index) > 8 else '')
    return ValueError(
        f'{name}.from_inertial: {len(index)} bodies are not strictly physically consistent '
        f'(pseudo-inertia not positive definite), at indices {shown}; point masses, thin rods '
        'and laminae are degenerate: apply regularize_inertial(pi, radius) first')


class InertialParameterization(abc.ABC):
    """
    Map between unconstrained parameters ``theta (..., k)`` and inertial ``pi (..., 10)``.

    Subclasses are stateless, so one instance serves every body, dtype and device. Both maps
    act on the last dim and broadcast over all leading dims (particles, ensembles, bodies).
    """

    #: registry name
    name: str = ''
    #: number k of unconstrained parameters per body
    size: int = 0

    def to_inertial(self, theta: Tensor) -> Tensor:
        """
        Inertial parameters of unconstrained parameters.

        :param theta: unconstrained parameters ``(..., k)``.
        :return: ``pi`` ``(..., 10)`` (kg, kg m, kg m^2 about the body origin).
        """
        check_trailing_shape(f'{self.name} theta', theta, (self.size,))
        return self._to_inertial(theta)

    def from_inertial(self, pi: Tensor) -> Tensor:
        """
        Unconstrained parameters of inertial parameters (inverse of :meth:`to_inertial`).

        :param pi: inertial parameters ``(..., 10)``; strictly physically consistent for
            the constrained parameterizations (raises ``ValueError`` otherwise).
        :return: ``theta`` ``(..., k)``.
        """
        check_trailing_shape('pi', pi, (10,))
        return self._from_inertial(pi)

    @abc.abstractmethod
    def _to_inertial(self, theta: Tensor) -> Tensor:
        """Implement :meth:`to_inertial` on a shape-checked input."""

    @abc.abstractmethod
    def _from_inertial(self, pi: Tensor) -> Tensor:
        """Implement :meth:`from_inertial` on a shape-checked input."""

    def __repr__(self) -> str:
        """Return the class name."""
        return f'{type(self).__name__}()'


class DiffNEAParameterization(InertialParameterization):
    """
    DiffNEA virtual physical parameters (Lutter et al. 2021, section 3.2), 10 per body.

    ``theta = [theta_m, cx, cy, cz, theta_b1, theta_b2, theta_b3, w1, w2, w3]``:

    - mass ``m = softplus(theta_m)`` (DiffNEA squares a "sqrt mass", which can reach ``m = 0``;
      softplus keeps ``m > 0`` for every finite value and behaves like ``exp`` for small masses);
    - centre of mass ``c`` in the body frame, free, in m;
    - principal second moments of the mass distribution about the CoM,
      ``b_i = softplus(theta_bi) > 0`` (kg m^2), giving principal moments of inertia
      ``J1 = b2 + b3, J2 = b1 + b3, J3 = b1 + b2``, which satisfy the strict triangle
      inequality by construction (``J1 + J2 - J3 = 2 b3 > 0``) and are all reachable;
    - principal axes ``R = exp([w]x)`` from the rotation vector ``w`` (axis-angle, rad);
    - ``I_com = R diag(J) R^T``, then the parallel-axis theorem to the body origin.

    ``from_inertial`` eigen-decomposes ``Sigma_com = 0.5 tr(I_com) E - I_com`` and, among the
    four proper sign choices of the eigenvectors, takes the rotation of largest trace, whose
    angle is at most 120 deg (the four traces sum to 0), so the logarithm is well conditioned.
    Degenerate bodies (any ``b_i = 0``: point mass, thin rod, lamina) have no finite preimage;
    ``to_inertial`` approaches them as ``theta_bi -> -inf``.
    """

    name = 'diffnea'
    size = 10

    def _to_inertial(self, theta: Tensor) -> Tensor:
        mass = _softplus(theta[..., 0])
        com = theta[..., 1:4]
        b = _softplus(theta[..., 4:7])
        R = _so3_exp(theta[..., 7:10])
        sigma_com = (R * b[..., None, :]) @ R.transpose(-1, -2)
        inertia_com = b.sum(-1)[..., None, None] * _eye3_like(theta) - sigma_com
        return inertial_from_mass_com_inertia(mass, com, inertia_com)

    def _from_inertial(self, pi: Tensor) -> Tensor:
        mass, com, inertia_com = mass_com_inertia(pi)
        trace = inertia_com.diagonal(dim1=-2, dim2=-1).sum(-1)
        sigma_com = 0.5 * trace[..., None, None] * _eye3_like(pi) - inertia_com
        b, V = torch.linalg.eigh(sigma_com)
        bad = ~((mass > 0) & (b > 0).all(-1) & torch.isfinite(pi).all(-1))
        if bool(bad.any()):
            raise _infeasible_error(bad, self.name)
        sign_last = torch.where(torch.linalg.det(V) < 0, -1.0, 1.0).to(V.dtype)
        V = torch.cat((V[..., :2], V[..., 2:] * sign_last[..., None, None]), -1)
        flips = torch.tensor([[1.0, 1.0, 1.0], [1.0, -1.0, -1.0], [-1.0, 1.0, -1.0],
                              [-1.0, -1.0, 1.0]], dtype=V.dtype, device=V.device)
        traces = (V.diagonal(dim1=-2, dim2=-1)[..., None, :] * flips).sum(-1)
        best = flips[traces.argmax(-1)]
        R = V * best[..., None, :]
        return torch.cat((_softplus_inverse(mass)[..., None], com, _softplus_inverse(b),
                          _so3_log(R)), -1)


class LogCholeskyParameterization(InertialParameterization):
    """
    Log-Cholesky parameters of the pseudo-inertia (Rucker and Wensing, RA-L 2022), 10 per body.

    ``theta = [alpha, d1, d2, d3, s12, s23, s13, t1, t2, t3]`` and ``J = U U^T`` with the upper
    triangular ::

        U = exp(alpha) [[exp(d1), s12,     s13,     t1],
                        [0,       exp(d2), s23,     t2],
                        [0,       0,       exp(d3), t3],
                        [0,       0,       0,       1 ]]

    so ``m = exp(2 alpha)`` and ``J`` is positive definite for every finite ``theta``; the map
    is a diffeomorphism onto the feasible set. ``from_inertial`` takes the upper Cholesky factor
    (Cholesky of the index-reversed ``J``).
    """

    name = 'log_cholesky'
    size = 10

    def _to_inertial(self, theta: Tensor) -> Tensor:
        alpha, d1, d2, d3, s12, s23, s13, t1, t2, t3 = theta.unbind(-1)
        zero = torch.zeros_like(alpha)
        one = torch.ones_like(alpha)
        e1, e2, e3 = torch.exp(d1), torch.exp(d2), torch.exp(d3)
        U = torch.stack((e1, s12, s13, t1, zero, e2, s23, t2, zero, zero, e3, t3,
                         zero, zero, zero, one), -1)
        U = U.reshape(*theta.shape[:-1], 4, 4) * torch.exp(alpha)[..., None, None]
        return inertial_from_pseudo_inertia(U @ U.transpose(-1, -2))

    def _from_inertial(self, pi: Tensor) -> Tensor:
        J = pseudo_inertia(pi)
        L, info = torch.linalg.cholesky_ex(J.flip(-1, -2))
        bad = (info != 0) | ~torch.isfinite(pi).all(-1)
        if bool(bad.any()):
            raise _infeasible_error(bad, self.name)
        U = L.flip(-1, -2)
        scale = U[..., 3, 3]
        U = U / scale[..., None, None]
        d = torch.log(U.diagonal(dim1=-2, dim2=-1)[..., :3])
        return torch.cat((torch.log(scale)[..., None], d, U[..., 0, 1:2], U[..., 1, 2:3],
                          U[..., 0, 2:3], U[..., :3, 3]), -1)


class RawParameterization(InertialParameterization):
    """Identity on ``pi`` (10 per body): no consistency guarantee, for least-squares baselines."""

    name = 'raw'
    size = 10

    def _to_inertial(self, theta: Tensor) -> Tensor:
        return theta

    def _from_inertial(self, pi: Tensor) -> Tensor:
        return pi


_PARAMETERIZATIONS: Dict[str, Type[InertialParameterization]] = {
    cls.name: cls for cls in (DiffNEAParameterization, LogCholeskyParameterization,
                              RawParameterization)
}


def make_parameterization(name: str) -> InertialParameterization:
    """
    Inertial parameterization by registry name.

    :param name: one of ``'diffnea'``, ``'log_cholesky'``, ``'raw'``.
    :return: the (stateless) parameterization.
    """
    try:
        return _PARAMETERIZATIONS[name]()
    except (KeyError, TypeError):
        valid = ', '.join(repr(n) for n in sorted(_PARAMETERIZATIONS))
        raise ValueError(
            f'unknown inertial parameterization {name!r}; valid names: {valid}') from None


class KinematicParameterization:
    """
    Joint-origin virtual parameters ("no-Kin" identification of DiffNEA): 6 per joint.

    Maps unconstrained ``theta (..., n, 6) = [x, y, z, roll, pitch, yaw]`` to the joint origins
    ``xyz (..., n, 3)`` in m and ``rpy (..., n, 3)`` in rad (URDF fixed-axis roll-pitch-yaw,
    ``R = Rz(yaw) Ry(pitch) Rx(roll)``):

    - unbounded (radius ``None``): ``xyz = xyz_nominal + theta_xyz`` -- the identity when no
      nominal is given, and ``theta = 0`` is the nominal otherwise;
    - bounded: ``xyz = xyz_nominal + xyz_radius * tanh(theta_xyz)``, so every ``theta`` stays
      within ``xyz_radius`` of the nominal per coordinate (likewise for ``rpy`` with
      ``rpy_radius``).

    :param xyz_nominal: nominal origins ``(n, 3)`` (or broadcastable), default zeros.
    :param rpy_nominal: nominal orientations ``(n, 3)``, default zeros.
    :param xyz_radius: bound in m (float or tensor broadcastable to ``(n, 3)``), or ``None``.
    :param rpy_radius: bound in rad, or ``None``.
    """

    size = 6

    def __init__(self, xyz_nominal: Optional[Tensor] = None,
                 rpy_nominal: Optional[Tensor] = None,
                 xyz_radius: Union[float, Tensor, None] = None,
                 rpy_radius: Union[float, Tensor, None] = None) -> None:
        for label, radius in (('xyz_radius', xyz_radius), ('rpy_radius', rpy_radius)):
            if radius is not None and not bool((torch.as_tensor(radius) > 0).all()):
                raise ValueError(f'{label} must be > 0, got {radius}')
        for label, nominal in (('xyz_nominal', xyz_nominal), ('rpy_nominal', rpy_nominal)):
            if nominal is not None:
                check_trailing_shape(label, torch.as_tensor(nominal), (3,))
        self.xyz_nominal = xyz_nominal
        self.rpy_nominal = rpy_nominal
        self.xyz_radius = xyz_radius
        self.rpy_radius = rpy_radius

    @staticmethod
    def _forward(theta: Tensor, nominal: Optional[Tensor],
                 radius: Union[float, Tensor, None]) -> Tensor:
        like = {'dtype': theta.dtype, 'device': theta.device}
        out = theta if radius is None else torch.as_tensor(radius, **like) * torch.tanh(theta)
        return out if nominal is None else out + torch.as_tensor(nominal, **like)

    @staticmethod
    def _inverse(value: Tensor, nominal: Optional[Tensor],
                 radius: Union[float, Tensor, None], label: str) -> Tensor:
        like = {'dtype': value.dtype, 'device': value.device}
        offset = value if nominal is None else value - torch.as_tensor(nominal, **like)
        if radius is None:
            return offset
        ratio = offset / torch.as_tensor(radius, **like)
        if not bool((ratio.abs() < 1).all()):
            raise ValueError(f'{label} lies outside the bound of the bounded parameterization '
                             f'(|{label} - nominal| must be < radius)')
        return torch.atanh(ratio)

    def to_xyz_rpy(self, theta: Tensor) -> Tuple[Tensor, Tensor]:
        """
        Joint origins of unconstrained parameters.

        :param theta: ``(..., n, 6)``.
        :return: ``(xyz (..., n, 3) in m, rpy (..., n, 3) in rad)``.
        """
        check_trailing_shape('kinematic theta', theta, (self.size,))
        return (self._forward(theta[..., :3], self.xyz_nominal, self.xyz_radius),
                self._forward(theta[..., 3:], self.rpy_nominal, self.rpy_radius))

    def from_xyz_rpy(self, xyz: Tensor, rpy: Tensor) -> Tensor:
        """
        Unconstrained parameters of joint origins (inverse of :meth:`to_xyz_rpy`).

        :param xyz: ``(..., n, 3)`` in m.
        :param rpy: ``(..., n, 3)`` in rad.
        :return: ``theta (..., n, 6)``; raises ``ValueError`` outside a bound.
        """
        check_trailing_shape('xyz', xyz, (3,))
        check_trailing_shape('rpy', rpy, (3,))
        theta_xyz = self._inverse(xyz, self.xyz_nominal, self.xyz_radius, 'xyz')
        theta_rpy = self._inverse(rpy, self.rpy_nominal, self.rpy_radius, 'rpy')
        return torch.cat(torch.broadcast_tensors(theta_xyz, theta_rpy), -1)
