"""
Contact geometry, contact parameters, contact Jacobians and the contact time steps.

A :class:`ContactModel` holds a robot's contact shapes (per link: vertex sets, spheres,
capsules), an optional half-space ground, sphere/capsule pairs between links, and the contact
parameters. Every tensor may carry leading batch dims (particles) that broadcast against the
state batch, like :class:`~diffsim_ros.core.model.RobotModel`'s.

Parameters, units (``CONTACT_PARAMETER_UNITS``):

- ``friction`` ``(...)`` Coulomb coefficient mu [-], ``restitution`` ``(...)`` in [0, 1] [-];
- ``stiffness`` [N/m], ``damping`` [N s/m] and ``slip_velocity`` [m/s] (the velocity below
  which Coulomb friction is smoothed) of the compliant model, each ``(...)``;
- ``vertices`` one ``(..., k, 3)`` tensor per vertex set [m, link frame];
- ``sphere_centers`` ``(..., ns, 3)`` [m, link frame], ``sphere_radii`` ``(..., ns)`` [m];
- ``capsule_ends`` ``(..., nk, 2, 3)`` [m, link frame], ``capsule_radii`` ``(..., nk)`` [m];
- ``ground_height`` ``(...)`` [m] offset of the ground plane along its normal and
  ``ground_tilt`` ``(..., 2)`` [rad]: the ground frame is ``R_x(tilt[0]) R_y(tilt[1])``, its
  z axis the unit normal, its x and y axes the contact tangents.

Contact candidates come in a fixed order (so batches stay rectangular): every vertex of every
vertex set against the ground, every sphere against the ground, both end spheres of every
capsule against the ground, then the pairs. For each candidate ``phi`` is the signed distance
[m] (negative in penetration), the normal points from the second body (ground, or the pair's
second shape) to the first, and ``J_n``/``J_t`` map generalized velocities to the relative
velocity of the first body's contact point along the normal and the two tangents.
"""

from dataclasses import dataclass, replace
from typing import Dict, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from . import native_contact
from .configuration import check_configuration, momentum_hold, semi_implicit_update
from .contact_solver import solve_contact_impulses
from .dispatch import _choice, crba, rnea
from .errors import check_trailing_shape, ShapeError
from .kinematics import forward_kinematics, jacobian
from .model import RobotModel
from .parameterization import _softplus, _softplus_inverse

__all__ = ['CONTACT_METHODS', 'CONTACT_PARAMETER_UNITS', 'ContactFrame', 'ContactModel',
           'ContactStep', 'box_vertices', 'compliant_contact_force', 'contact_kinematics',
           'contact_parameters_from_theta', 'contact_parameters_to_theta', 'contact_rows',
           'contact_step', 'free_velocity', 'ground_frame']

CONTACT_PARAMETER_UNITS = {
    'friction': '-', 'restitution': '-', 'stiffness': 'N/m', 'damping': 'N s/m',
    'slip_velocity': 'm/s', 'vertices': 'm', 'sphere_centers': 'm', 'sphere_radii': 'm',
    'capsule_ends': 'm', 'capsule_radii': 'm', 'ground_height': 'm', 'ground_tilt': 'rad',
}

# How each parameter maps to an unconstrained value for learning: positive quantities through
# softplus, restitution through a sigmoid, positions and angles as they are (any tilt gives a
# unit normal by construction).
_POSITIVE = ('friction', 'stiffness', 'damping', 'slip_velocity', 'sphere_radii',
             'capsule_radii')
_UNIT_INTERVAL = ('restitution',)


@dataclass(frozen=True)
class ContactModel:
    """
    Contact shapes and contact parameters of a robot (see the module docstring for units).

    :param vertex_links: link name of each vertex set.
    :param vertices: one ``(..., k, 3)`` tensor per vertex set, ``k >= 1``.
    :param sphere_links: link name of each sphere.
    :param capsule_links: link name of each capsule.
    :param pairs: body-body candidates, each ``((kind, index), (kind, index))`` with kind
        ``'sphere'`` or ``'capsule'``; the two shapes must be on different links.
    :param ground: whether the half-space ground is present.
    """

    friction: Tensor
    restitution: Tensor
    stiffness: Tensor
    damping: Tensor
    slip_velocity: Tensor
    ground_height: Tensor
    ground_tilt: Tensor
    vertex_links: Tuple[str, ...] = ()
    vertices: Tuple[Tensor, ...] = ()
    sphere_links: Tuple[str, ...] = ()
    sphere_centers: Optional[Tensor] = None
    sphere_radii: Optional[Tensor] = None
    capsule_links: Tuple[str, ...] = ()
    capsule_ends: Optional[Tensor] = None
    capsule_radii: Optional[Tensor] = None
    pairs: Tuple[Tuple[Tuple[str, int], Tuple[str, int]], ...] = ()
    ground: bool = True

    def __post_init__(self):
        if len(self.vertex_links) != len(self.vertices):
            raise ShapeError(f'ContactModel: {len(self.vertex_links)} vertex_links for '
                             f'{len(self.vertices)} vertex sets')
        for i, (link, verts) in enumerate(zip(self.vertex_links, self.vertices)):
            if verts.dim() < 2 or verts.shape[-2] == 0:
                raise ValueError(f'ContactModel: vertex set {i} of link {link!r} has no '
                                 f'vertices (shape {tuple(verts.shape)})')
            check_trailing_shape(f'ContactModel.vertices[{i}]', verts, (verts.shape[-2], 3))
        self._check_round('sphere', self.sphere_links, self.sphere_centers, self.sphere_radii,
                          (3,))
        self._check_round('capsule', self.capsule_links, self.capsule_ends, self.capsule_radii,
                          (2, 3))
        check_trailing_shape('ContactModel.ground_tilt', self.ground_tilt, (2,))
        for a, b in self.pairs:
            links = []
            for kind, index in (a, b):
                names = {'sphere': self.sphere_links, 'capsule': self.capsule_links}.get(kind)
                if names is None or not 0 <= index < len(names):
                    raise ValueError(f'ContactModel.pairs: no {kind} {index}; pairs name '
                                     f"('sphere' | 'capsule', index) of an existing shape")
                links.append(names[index])
            if links[0] == links[1]:
                raise ValueError(f'ContactModel.pairs: {a} and {b} are both on link '
                                 f'{links[0]!r}')
        for name in ('friction', 'stiffness', 'damping', 'slip_velocity'):
            if bool((getattr(self, name) < 0).any()):
                raise ValueError(f'ContactModel.{name} must be >= 0')
        if bool(((self.restitution < 0) | (self.restitution > 1)).any()):
            raise ValueError('ContactModel.restitution must lie in [0, 1]')

    @staticmethod
    def _check_round(kind, links, centers, radii, trailing):
        if not links:
            return
        if centers is None or radii is None:
            raise ShapeError(f'ContactModel: {len(links)} {kind}_links need {kind} '
                             f'geometry and radii')
        check_trailing_shape(f'ContactModel.{kind} geometry', centers, (len(links),) + trailing)
        check_trailing_shape(f'ContactModel.{kind}_radii', radii, (len(links),))
        if bool((radii <= 0).any()):
            raise ValueError(f'ContactModel.{kind}_radii must be > 0, got '
                             f'{radii.detach().flatten().tolist()}')

    @property
    def links(self) -> Tuple[str, ...]:
        """Return the links that carry contact shapes, in first-use order."""
        return tuple(dict.fromkeys(self.vertex_links + self.sphere_links + self.capsule_links))

    @property
    def n_contacts(self) -> int:
        """Return the number of contact candidates ``nc``."""
        ground = (sum(v.shape[-2] for v in self.vertices) + len(self.sphere_links)
                  + 2 * len(self.capsule_links)) if self.ground else 0
        return ground + len(self.pairs)

    def parameter_names(self) -> Tuple[str, ...]:
        """
        Return the names of the learnable parameter tensors present in this model.

        :return: names, keys of ``CONTACT_PARAMETER_UNITS`` (units there).
        """
        names = ['friction', 'restitution', 'stiffness', 'damping', 'slip_velocity']
        if self.vertices:
            names.append('vertices')
        if self.sphere_links:
            names += ['sphere_centers', 'sphere_radii']
        if self.capsule_links:
            names += ['capsule_ends', 'capsule_radii']
        if self.ground:
            names += ['ground_height', 'ground_tilt']
        return tuple(names)

    @classmethod
    def create(cls, friction: float, restitution: float = 0.0, stiffness: float = 1e4,
               damping: float = 1e2, slip_velocity: float = 1e-3, ground_height: float = 0.0,
               ground_tilt=(0.0, 0.0), dtype: torch.dtype = torch.float64,
               device=None, **shapes) -> 'ContactModel':
        """
        Build a contact model from plain numbers (tensors for the geometry in ``shapes``).

        :param friction: Coulomb coefficient [-].
        :param restitution: normal restitution in [0, 1] [-].
        :param stiffness: compliant normal stiffness [N/m].
        :param damping: compliant normal damping [N s/m].
        :param slip_velocity: compliant friction smoothing velocity [m/s].
        :param ground_height: ground offset along its normal [m].
        :param ground_tilt: ground tilt angles about x then y [rad].
        :param dtype: floating dtype of every tensor.
        :param device: device of every tensor.
        :param shapes: the remaining fields (``vertex_links``, ``vertices``, ...).
        :return: the model.
        """
        def t(x):
            return torch.as_tensor(x, dtype=dtype, device=device)
        shapes = {k: (tuple(t(x) for x in v) if k == 'vertices'
                      else t(v) if k in CONTACT_PARAMETER_UNITS else v)
                  for k, v in shapes.items()}
        return cls(friction=t(friction), restitution=t(restitution), stiffness=t(stiffness),
                   damping=t(damping), slip_velocity=t(slip_velocity),
                   ground_height=t(ground_height), ground_tilt=t(ground_tilt), **shapes)


def box_vertices(size, dtype: torch.dtype = torch.float64) -> Tensor:
    """
    Return the eight corners of a box centred on its link origin.

    :param size: edge lengths ``(3,)`` [m] (a cube of side ``s``: ``(s, s, s)``).
    :param dtype: result dtype.
    :return: ``(8, 3)`` corners in the link frame [m].
    """
    half = 0.5 * torch.as_tensor(size, dtype=dtype)
    signs = torch.tensor([[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)],
                         dtype=dtype)
    return signs * half


def contact_parameters_to_theta(contact: ContactModel) -> Dict[str, Tensor]:
    """
    Map the learnable parameters to unconstrained values (inverse of the map below).

    :param contact: the contact model.
    :return: one unconstrained tensor per name of ``contact.parameter_names()``; the vertex
        sets are concatenated along their vertex axis.
    """
    theta = {}
    for name in contact.parameter_names():
        value = (torch.cat(contact.vertices, -2) if name == 'vertices'
                 else getattr(contact, name))
        if name in _POSITIVE:
            value = _softplus_inverse(value)
        elif name in _UNIT_INTERVAL:
            value = torch.logit(value.clamp(1e-12, 1 - 1e-12))
        theta[name] = value
    return theta


def contact_parameters_from_theta(template: ContactModel,
                                  theta: Dict[str, Tensor]) -> ContactModel:
    """
    Return ``template`` with parameters mapped from unconstrained values.

    Every finite ``theta`` gives a valid model: mu, stiffness, damping, slip velocity and
    radii positive (softplus), restitution in (0, 1) (sigmoid), a unit ground normal.

    :param template: model giving the structure (links, pairs, counts).
    :param theta: unconstrained tensors by name (a subset of ``parameter_names()``); unknown
        names raise ``KeyError`` listing the valid ones.
    :return: the new model (leading dims of ``theta`` become particle dims).
    """
    valid = template.parameter_names()
    changes = {}
    for name, value in theta.items():
        if name not in valid:
            raise KeyError(f'unknown contact parameter {name!r}; valid: {", ".join(valid)}')
        if name in _POSITIVE:
            value = _softplus(value)
        elif name in _UNIT_INTERVAL:
            value = torch.sigmoid(value)
        if name == 'vertices':
            counts = [v.shape[-2] for v in template.vertices]
            value = tuple(torch.split(value, counts, dim=-2))
        changes[name] = value
    return replace(template, **changes)


def ground_frame(tilt: Tensor) -> Tensor:
    """
    Return the ground frame ``R_x(tilt[0]) R_y(tilt[1])``.

    :param tilt: ``(..., 2)`` tilt angles [rad].
    :return: ``(..., 3, 3)`` rotation whose columns are tangent 1, tangent 2, unit normal.
    """
    ca, sa = torch.cos(tilt[..., 0]), torch.sin(tilt[..., 0])
    cb, sb = torch.cos(tilt[..., 1]), torch.sin(tilt[..., 1])
    zero = torch.zeros_like(ca)
    rows = (torch.stack((cb, zero, sb), -1),
            torch.stack((sa * sb, ca, -sa * cb), -1),
            torch.stack((-ca * sb, sa, ca * cb), -1))
    return torch.stack(rows, -2)


class ContactFrame(NamedTuple):
    """
    Contact candidates at one configuration.

    ``phi`` ``(..., nc)`` signed distances [m]; ``normal`` ``(..., nc, 3)`` and ``tangents``
    ``(..., nc, 2, 3)`` unit vectors in world axes; ``point`` ``(..., nc, 3)`` the first body's
    contact point [m, world]; ``J_n`` ``(..., nc, nv)`` and ``J_t`` ``(..., nc, 2, nv)``.
    """

    phi: Tensor
    normal: Tensor
    tangents: Tensor
    point: Tensor
    J_n: Tensor
    J_t: Tensor


def _point_jacobian(J_world: Tensor, point: Tensor) -> Tensor:
    # Linear velocity Jacobian (..., k, 3, nv) of world points on a link whose world-frame
    # spatial Jacobian is J_world (..., 6, nv): a world point p moves with lin + ang x p.
    angular = J_world[..., None, :3, :]
    linear = J_world[..., None, 3:, :]
    p = point.unsqueeze(-1)
    shape = torch.broadcast_shapes(angular.shape, p.shape)
    return linear + torch.linalg.cross(angular.expand(shape), p.expand(shape), dim=-2)


def _to_world(T_world_link: Tensor, local: Tensor) -> Tensor:
    # (..., 4, 4) and (..., k, 3) -> (..., k, 3)
    R = T_world_link[..., None, :3, :3]
    return (R @ local.unsqueeze(-1)).squeeze(-1) + T_world_link[..., None, :3, 3]


def _orthonormal_tangents(normal: Tensor) -> Tensor:
    # Duff et al., "Building an orthonormal basis, revisited" (JCGT 2017): smooth except
    # where the normal's z component changes sign.
    x, y, z = normal.unbind(-1)
    sign = torch.where(z >= 0, torch.ones_like(z), -torch.ones_like(z))
    a = -1.0 / (sign + z)
    b = x * y * a
    t1 = torch.stack((1.0 + sign * x * x * a, sign * b, -sign * x), -1)
    t2 = torch.stack((b, sign + y * y * a, -y), -1)
    return torch.stack((t1, t2), -2)


def _segment_closest(p1: Tensor, q1: Tensor, p2: Tensor, q2: Tensor) -> Tuple[Tensor, Tensor]:
    # Closest points of segments [p1, q1] and [p2, q2] (Ericson, Real-Time Collision
    # Detection, 5.1.9), batched with torch.where; a sphere is a segment of zero length.
    eps = torch.finfo(p1.dtype).eps
    d1, d2, r = q1 - p1, q2 - p2, p1 - p2
    a, e = (d1 * d1).sum(-1), (d2 * d2).sum(-1)
    b, c, f = (d1 * d2).sum(-1), (d1 * r).sum(-1), (d2 * r).sum(-1)
    a_ok, e_ok = a > eps, e > eps
    a_s = torch.where(a_ok, a, torch.ones_like(a))
    e_s = torch.where(e_ok, e, torch.ones_like(e))
    denom = a * e - b * b
    d_ok = denom > eps * a_s * e_s
    d_s = torch.where(d_ok, denom, torch.ones_like(denom))
    s = torch.where(d_ok, ((b * f - c * e) / d_s).clamp(0, 1), torch.zeros_like(a))
    t = (b * s + f) / e_s
    s_far = torch.where(t > 1, ((b - c) / a_s).clamp(0, 1), s)
    s = torch.where(t < 0, (-c / a_s).clamp(0, 1), s_far)
    t = t.clamp(0, 1)
    # Degenerate segments: a point against a segment, or two points.
    s = torch.where(e_ok, s, (-c / a_s).clamp(0, 1))
    t = torch.where(e_ok, t, torch.zeros_like(t))
    t = torch.where(a_ok, t, (f / e_s).clamp(0, 1))
    s = torch.where(a_ok, s, torch.zeros_like(s))
    t = torch.where(a_ok | e_ok, t, torch.zeros_like(t))
    return p1 + s.unsqueeze(-1) * d1, p2 + t.unsqueeze(-1) * d2


def _round_shapes(contact: ContactModel, T_world: Dict[str, Tensor]):
    # World segments (..., ns + nk, 2, 3), radii (..., ns + nk) and links of every sphere
    # (a zero-length segment) and capsule.
    segments, radii, links = [], [], []
    if contact.sphere_links:
        for i, link in enumerate(contact.sphere_links):
            c = _to_world(T_world[link], contact.sphere_centers[..., i:i + 1, :])
            segments.append(torch.cat((c, c), -2))
        radii.append(contact.sphere_radii)
        links += contact.sphere_links
    if contact.capsule_links:
        for i, link in enumerate(contact.capsule_links):
            segments.append(_to_world(T_world[link], contact.capsule_ends[..., i, :, :]))
        radii.append(contact.capsule_radii)
        links += contact.capsule_links
    if not links:
        return None, None, ()
    shape = torch.broadcast_shapes(*[s.shape for s in segments])
    return (torch.stack([s.expand(shape) for s in segments], -3), torch.cat(radii, -1),
            tuple(links))


def contact_kinematics(model: RobotModel, q: Tensor, contact: ContactModel) -> ContactFrame:
    """
    Return signed distances, frames and Jacobians of every contact candidate.

    Built from :func:`forward_kinematics` and ``jacobian(model, q, link, frame='world')``.

    :param model: the robot (fixed or floating base).
    :param q: configuration ``(..., nq)``.
    :param contact: the contact model (its links must exist in ``model``).
    :return: the :class:`ContactFrame` of the ``contact.n_contacts`` candidates.
    """
    check_trailing_shape('q', q, (model.nq,))
    T_all = forward_kinematics(model, q)
    T_world = {link: T_all[..., model.link_index(link), :, :] for link in contact.links}
    J_world = {link: jacobian(model, q, link, frame='world') for link in contact.links}
    parts = []  # (phi, normal, tangents, point, J_point) per group of candidates

    if contact.ground:
        R_ground = ground_frame(contact.ground_tilt)
        normal, tangents = R_ground[..., :, 2], R_ground[..., :, :2].mT

        def ground_part(points, link, radius=None):
            n = normal.unsqueeze(-2)
            phi = (points * n).sum(-1) - contact.ground_height.unsqueeze(-1)
            if radius is not None:
                phi = phi - radius
                points = points - radius.unsqueeze(-1) * n
            k = points.shape[-2]
            n = n.expand(points.shape[:-2] + (k, 3))
            t = tangents.unsqueeze(-3).expand(points.shape[:-2] + (k, 2, 3))
            parts.append((phi, n, t, points, _point_jacobian(J_world[link], points)))

        for link, verts in zip(contact.vertex_links, contact.vertices):
            ground_part(_to_world(T_world[link], verts), link)
        segments, radii, links = _round_shapes(contact, T_world)
        n_spheres = len(contact.sphere_links)
        for i, link in enumerate(links):
            ends = segments[..., i, :1, :] if i < n_spheres else segments[..., i, :, :]
            ground_part(ends, link, radii[..., i:i + 1])

    if contact.pairs:
        segments, radii, links = _round_shapes(contact, T_world)
        n_spheres = len(contact.sphere_links)
        for (kind_a, ia), (kind_b, ib) in contact.pairs:
            i = ia if kind_a == 'sphere' else n_spheres + ia
            j = ib if kind_b == 'sphere' else n_spheres + ib
            pa, pb = _segment_closest(segments[..., i, 0, :], segments[..., i, 1, :],
                                      segments[..., j, 0, :], segments[..., j, 1, :])
            diff = pa - pb
            dist = torch.linalg.vector_norm(diff, dim=-1)
            n = diff / dist.clamp_min(torch.finfo(dist.dtype).tiny).unsqueeze(-1)
            phi = dist - radii[..., i] - radii[..., j]
            point_a = pa - radii[..., i, None] * n
            point_b = pb + radii[..., j, None] * n
            J = (_point_jacobian(J_world[links[i]], point_a.unsqueeze(-2))
                 - _point_jacobian(J_world[links[j]], point_b.unsqueeze(-2)))
            parts.append((phi.unsqueeze(-1), n.unsqueeze(-2),
                          _orthonormal_tangents(n).unsqueeze(-3), point_a.unsqueeze(-2), J))

    if not parts:
        raise ValueError('contact_kinematics: the contact model has no contact candidates')
    batch = torch.broadcast_shapes(*[p[0].shape[:-1] for p in parts])
    nv = parts[0][4].shape[-1]
    trailing = ((), (3,), (2, 3), (3,), (3, nv))

    def cat(index):
        # Each part is (*its batch, k, *trailing): broadcast the batches, join along k.
        tail = trailing[index]
        pieces = [p[index] for p in parts]
        return torch.cat([x.expand(batch + x.shape[x.dim() - len(tail) - 1:]) for x in pieces],
                         len(batch))

    phi, normal, tangents, point, J_point = (cat(i) for i in range(5))
    J_n = (normal.unsqueeze(-1) * J_point).sum(-2)
    J_t = tangents @ J_point
    return ContactFrame(phi, normal, tangents, point, J_n, J_t)


class ContactStep(NamedTuple):
    """
    Result of one contact time step.

    ``q`` ``(..., nq)``, ``v`` ``(..., nv)`` the next state; ``impulses`` ``(..., nc, 3)``
    contact impulses ``[normal, tangent 1, tangent 2]`` over the step [N s] (the compliant
    model reports force times ``dt``); ``frame`` the :class:`ContactFrame` at the start.
    """

    q: Tensor
    v: Tensor
    impulses: Tensor
    frame: ContactFrame


def compliant_contact_force(frame: ContactFrame, v: Tensor, contact: ContactModel) -> Tensor:
    """
    Return the compliant (penalty) contact forces of every candidate.

    Normal force ``max(0, k d - c phi_dot)`` while the penetration ``d = -phi`` is positive
    (a linear spring-damper that never pulls), friction ``-mu f_n v_t / sqrt(|v_t|^2 + v_s^2)``
    (Coulomb smoothed below the slip velocity ``v_s``).

    :param frame: contact candidates at the current configuration.
    :param v: generalized velocity ``(..., nv)``.
    :param contact: parameters (stiffness, damping, friction, slip_velocity).
    :return: ``(..., nc, 3)`` forces ``[normal, tangent 1, tangent 2]`` [N].
    """
    phi_dot = (frame.J_n @ v.unsqueeze(-1)).squeeze(-1)
    v_t = (frame.J_t @ v.unsqueeze(-1).unsqueeze(-3)).squeeze(-1)
    depth = torch.relu(-frame.phi)
    k, c = contact.stiffness.unsqueeze(-1), contact.damping.unsqueeze(-1)
    f_n = torch.where(depth > 0, torch.relu(k * depth - c * phi_dot), torch.zeros_like(depth))
    speed = torch.sqrt((v_t * v_t).sum(-1) + contact.slip_velocity.unsqueeze(-1) ** 2)
    f_t = -(contact.friction.unsqueeze(-1) * f_n / speed).unsqueeze(-1) * v_t
    return torch.cat((f_n.unsqueeze(-1), f_t), -1)


def free_velocity(model: RobotModel, q: Tensor, v: Tensor, tau: Tensor,
                  dt: float) -> Tuple[Tensor, Tensor]:
    """
    Return the velocity of a contact-free step and the Cholesky factor of the mass matrix.

    The root's world momentum is held over the step (``momentum_hold``), so the gap and cone
    conditions hold for the velocity that moves ``q``; :func:`contact_step` adds
    ``M^-1 J^T lambda`` to it (the violation loss in ``sysid.contact_learning`` uses it too).

    :param model: the robot.
    :param q: configuration ``(..., nq)``.
    :param v: generalized velocity ``(..., nv)``.
    :param tau: applied generalized force ``(..., nv)``.
    :param dt: time step [s].
    :return: ``L`` ``(..., nv, nv)`` lower Cholesky factor of ``M(q)`` and ``v_free``
        ``(..., nv)``.
    """
    M = crba(model, q)
    h = rnea(model, q, v, torch.zeros_like(v))
    L = torch.linalg.cholesky(M)
    return L, (v + dt * torch.cholesky_solve((tau - h).unsqueeze(-1), L).squeeze(-1)
               + momentum_hold(model, v, dt))


def contact_rows(frame: ContactFrame) -> Tensor:
    """
    Stack the contact Jacobian rows the way the impulses are ordered.

    :param frame: contact candidates.
    :return: ``(..., 3 nc, nv)`` rows ``[normal, tangent 1, tangent 2]`` of each candidate.
    """
    J = torch.cat((frame.J_n.unsqueeze(-2), frame.J_t), -2)
    return J.reshape(J.shape[:-3] + (-1, J.shape[-1]))


def _complementarity(model, q, v, tau, dt, contact, frame, tol, max_iter, regularization,
                     backend):
    L, v_free = free_velocity(model, q, v, tau, dt)
    J = contact_rows(frame)
    MinvJt = torch.cholesky_solve(J.mT, L)
    G = J @ MinvJt
    nc = frame.phi.shape[-1]
    # A small relative compliance makes the Delassus matrix positive definite when contacts
    # outnumber the degrees of freedom (a cube on a plane), so the impulses are unique.
    diag = torch.diagonal(G, dim1=-2, dim2=-1).mean(-1)
    eye = torch.eye(3 * nc, dtype=G.dtype, device=G.device)
    A = G + (regularization * diag)[..., None, None] * eye
    b = (J @ v_free.unsqueeze(-1)).squeeze(-1).reshape(v_free.shape[:-1] + (nc, 3))
    v_n = (frame.J_n @ v.unsqueeze(-1)).squeeze(-1)
    closing = frame.phi + dt * v_n <= 0
    bounce = contact.restitution.unsqueeze(-1) * torch.relu(-v_n) * closing
    offset = torch.stack((frame.phi / dt - bounce, torch.zeros_like(bounce),
                          torch.zeros_like(bounce)), -1)
    b = (b + offset).reshape(b.shape[:-2] + (3 * nc,))
    mu = contact.friction.unsqueeze(-1) * torch.ones_like(frame.phi)  # particles x states
    lam = solve_contact_impulses(A, b, mu, tol, max_iter, backend)
    v_next = v_free + (MinvJt @ lam.unsqueeze(-1)).squeeze(-1)
    return v_next, lam.reshape(lam.shape[:-1] + (nc, 3))


def _compliant(model, q, v, tau, dt, contact, frame, tol, max_iter, regularization, backend):
    force = compliant_contact_force(frame, v, contact)
    J = contact_rows(frame)
    tau_contact = (J.mT @ force.reshape(force.shape[:-2] + (-1, 1))).squeeze(-1)
    _, v_next = free_velocity(model, q, v, tau + tau_contact, dt)
    return v_next, force * dt


#: Contact time steps by name.
CONTACT_METHODS = {'complementarity': _complementarity, 'compliant': _compliant}


def contact_step(model: RobotModel, q: Tensor, v: Tensor, tau: Tensor, dt: float,
                 contact: ContactModel, method: str = 'complementarity', tol: float = 1e-10,
                 max_iter: int = 1000, regularization: float = 1e-8,
                 backend: Optional[str] = None) -> ContactStep:
    """
    Advance one semi-implicit time step with contact.

    ``'complementarity'``: Anitescu's velocity-level step ``v+ = v + M^-1 (dt (tau - h) +
    J^T lambda)`` with ``phi / dt + J_n v+ >= -e min(J_n v, 0)`` (restitution ``e`` on
    candidates that close this step), second-order Coulomb cones and ``lambda`` from
    :func:`~diffsim_ros.core.contact_solver.solve_contact_impulses` (implicit gradients).
    Penetration present at the start is removed within the step. ``'compliant'``: the forces
    of :func:`compliant_contact_force` added to ``tau``, same integrator. Then
    ``q+`` from :func:`~diffsim_ros.core.configuration.semi_implicit_update` (the root's
    world-frame linear velocity held over the step). ``h = rnea(q, v, 0)`` includes gravity.

    :param model: the robot.
    :param q: configuration ``(..., nq)``.
    :param v: generalized velocity ``(..., nv)``.
    :param tau: applied generalized force ``(..., nv)`` (joint friction not included).
    :param dt: time step [s].
    :param contact: contact shapes and parameters.
    :param method: a key of ``CONTACT_METHODS``.
    :param tol: solver tolerance in velocity units (complementarity).
    :param max_iter: solver APGD iteration cap (complementarity).
    :param regularization: compliance added to the Delassus diagonal, relative to its mean.
    :param backend: ``'auto'``: on CPU float32/float64 the C++ kernels of
        :mod:`~diffsim_ros.core.native_contact` (a single free body without gradients, its
        shapes against the ground: the whole step in one call; otherwise this torch code
        with the cone solve and its backward in C++), else torch; ``'native'``: the same,
        raising where the solver kernel cannot run; ``'torch'``: torch alone; None:
        :func:`~diffsim_ros.core.get_backend` (rules of :mod:`~diffsim_ros.core.dispatch`).
        ``crba``/``rnea`` inside take their own default.
    :return: the :class:`ContactStep`.
    :raises ValueError: for a floating base whose quaternion is not unit (or a non-finite
        configuration), from :func:`~diffsim_ros.core.configuration.check_configuration`.
    :raises BackendError: when ``backend='native'`` and the solver kernels cannot run.
    """
    if method not in CONTACT_METHODS:
        raise ValueError(f'unknown contact method {method!r}; valid methods: '
                         f'{", ".join(CONTACT_METHODS)}')
    check_trailing_shape('q', q, (model.nq,))
    check_trailing_shape('v', v, (model.nv,))
    check_trailing_shape('tau', tau, (model.nv,))
    if _choice(backend, 'contact_step') != 'torch':
        # free bodies without gradients: the whole step in the kernel (which checks q as
        # check_configuration does); else the torch code below, whose cone solve takes the
        # solver kernel
        ext, reason = native_contact.extension()
        if ext is not None and native_contact.free_body_reason(model, contact, method,
                                                               (q, v, tau)) is None:
            q_next, v_next, impulses, frame = native_contact.free_body_step(
                ext, model, q, v, tau, dt, contact, method, tol, max_iter, regularization)
            return ContactStep(q_next, v_next, impulses, ContactFrame(*frame))
    if model.floating_base:
        check_configuration(model, q)
    frame = contact_kinematics(model, q, contact)
    v_next, impulses = CONTACT_METHODS[method](model, q, v, tau, dt, contact, frame, tol,
                                               max_iter, regularization, backend)
    q_next, v_next = semi_implicit_update(model, q, v_next, dt)
    return ContactStep(q_next, v_next, impulses, frame)
