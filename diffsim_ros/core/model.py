"""
The immutable robot model: kinematic tree structure plus (batched) physical parameters.

A :class:`RobotModel` is built once by :func:`diffsim_ros.core.load_urdf` and never mutated;
identification creates new models with :meth:`RobotModel.replace`.  Parameter tensors may
carry leading batch dimensions (particles, ensembles) that broadcast against the state batch.
"""

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

import torch

from .errors import ShapeError
from .parameterization import mass_com_inertia
from .spatial import homogeneous, rpy_to_matrix, skew

Tensor = torch.Tensor

REVOLUTE = 'revolute'
CONTINUOUS = 'continuous'
PRISMATIC = 'prismatic'
FLOATING = 'floating'
#: Name of the free-flyer joint of a floating-base model (Pinocchio's name).
ROOT_JOINT = 'root_joint'

# Fields that are physical parameters: differentiable, may carry leading batch dims.
# Value = number of trailing dims that belong to the parameter itself.
PARAMETER_FIELDS = {
    'origin_xyz': 2, 'origin_rpy': 2, 'inertial': 2,
    'damping': 1, 'friction': 1, 'armature': 1, 'gravity': 1,
}
# Parameter fields with one entry per degree of freedom (nv); the others with a trailing
# per-joint dimension have one row per joint (njoints), gravity has none.
PER_DOF_FIELDS = ('damping', 'friction', 'armature')
_INERTIAL_SUFFIXES = ('m', 'mx', 'my', 'mz', 'ixx', 'ixy', 'ixz', 'iyy', 'iyz', 'izz')


@dataclass(frozen=True, eq=False)
class KinematicTree:
    """
    Static structure of a robot: joint topology, names and constant tensors.

    Bodies are the child links of movable joints after merging fixed joints; body ``i`` moves
    with joint ``i``.  Joints are topologically ordered (``parents[i] < i``); ``-1`` is the base.
    In a floating-base tree joint 0 is the free-flyer ``'root_joint'`` (6 DOF, type
    ``'floating'``, zero axis and generators) whose body 0 is the URDF root link.
    """

    joint_names: tuple
    joint_types: tuple
    parents: tuple
    body_links: tuple
    link_names: tuple
    link_bodies: tuple
    axis: Tensor                 # (n, 3) unit joint axes in the joint (child) frame
    T_body_parentlink: Tensor    # (n, 4, 4) pose of joint i's parent link in its parent body
    T_body_link: Tensor          # (n_links, 4, 4) pose of each link in the body it is fixed to
    ancestors: Tensor            # (n, n): [i, j] = 1 if joint j is joint i or an ancestor of it
    has_parent_offsets: bool
    # Joint-motion generators, see joint_transforms(): T_J = E + sin q K + (1 - cos q) K2 + q P
    K: Tensor
    K2: Tensor
    P: Tensor
    eye4: Tensor
    revolute_mask: Tensor        # (n,) 1 for revolute/continuous joints
    prismatic_mask: Tensor       # (n,) 1 for prismatic joints
    floating: bool = False       # joint 0 is a free-flyer

    @property
    def n(self) -> int:
        """Return the number of joints (root joint included) = the number of bodies."""
        return len(self.joint_names)

    @property
    def nq(self) -> int:
        """Return the configuration size: 7 for a free-flyer root, 1 per other joint."""
        return self.n + 6 if self.floating else self.n

    @property
    def nv(self) -> int:
        """Return the number of degrees of freedom: 6 for a free-flyer root, 1 per other joint."""
        return self.n + 5 if self.floating else self.n

    def to(self, dtype=None, device=None) -> 'KinematicTree':
        """Return a copy with every constant tensor converted."""
        changes = {f.name: getattr(self, f.name).to(dtype=dtype, device=device)
                   for f in dataclasses.fields(self)
                   if isinstance(getattr(self, f.name), Tensor)}
        return dataclasses.replace(self, **changes)


def build_tree(joint_names, joint_types, parents, body_links, link_names, link_bodies, axis,
               T_body_parentlink, T_body_link, floating: bool = False) -> KinematicTree:
    """
    Assemble a :class:`KinematicTree` and its precomputed index/generator tensors.

    :param joint_names: movable joint names in topological order.
    :param joint_types: ``'revolute'``, ``'continuous'``, ``'prismatic'`` per joint
        (``'floating'`` for joint 0 of a floating-base tree, with a zero axis).
    :param parents: parent joint index per joint, ``-1`` for the base.
    :param body_links: child link name of each joint.
    :param link_names: every link name (FK order).
    :param link_bodies: body index per link, ``-1`` for links fixed to the base.
    :param axis: ``(n, 3)`` unit axes.
    :param T_body_parentlink: ``(n, 4, 4)``.
    :param T_body_link: ``(n_links, 4, 4)``.
    :param floating: joint 0 is a free-flyer (every other joint descends from it).
    :return: the tree.
    """
    n = len(joint_names)
    dtype, device = axis.dtype, axis.device
    ancestors = torch.zeros(n, n, dtype=dtype, device=device)
    for i in range(n):
        j = i
        while j >= 0:
            ancestors[i, j] = 1.0
            j = parents[j]
    revolute = torch.tensor([t in (REVOLUTE, CONTINUOUS) for t in joint_types], dtype=dtype,
                            device=device)
    prismatic = torch.tensor([t == PRISMATIC for t in joint_types], dtype=dtype, device=device)
    K3 = skew(axis) * revolute[:, None, None]
    K = torch.zeros(n, 4, 4, dtype=dtype, device=device)
    K[:, :3, :3] = K3
    K2 = K @ K
    P = torch.zeros(n, 4, 4, dtype=dtype, device=device)
    P[:, :3, 3] = axis * prismatic[:, None]
    eye = torch.eye(4, dtype=dtype, device=device)
    has_offsets = bool(n and not torch.equal(T_body_parentlink, eye.expand(n, 4, 4)))
    return KinematicTree(
        joint_names=tuple(joint_names), joint_types=tuple(joint_types), parents=tuple(parents),
        body_links=tuple(body_links), link_names=tuple(link_names),
        link_bodies=tuple(link_bodies), axis=axis, T_body_parentlink=T_body_parentlink,
        T_body_link=T_body_link, ancestors=ancestors, has_parent_offsets=has_offsets,
        K=K, K2=K2, P=P, eye4=eye, revolute_mask=revolute, prismatic_mask=prismatic,
        floating=bool(floating))


@dataclass(frozen=True, eq=False)
class RobotModel:
    """
    A rigid-body tree, fixed or floating base, with physical parameters.

    Parameter fields (see ``PARAMETER_FIELDS``) may have leading batch dims ``(...)``:
    ``origin_xyz``/``origin_rpy`` ``(..., njoints, 3)`` joint origins relative to the parent
    link (URDF ``<origin>``), ``inertial`` ``(..., njoints, 10)`` per body
    (docs/conventions.md), ``damping`` [N m s/rad or N s/m], ``friction`` [N m or N],
    ``armature`` [kg m^2 or kg] ``(..., nv)`` per degree of freedom, ``gravity`` ``(..., 3)``
    [m/s^2] in the world frame.  ``lower``/``upper`` are ``(nq,)``, ``velocity_limit`` and
    ``effort_limit`` ``(nv,)``.  A fixed base has ``nq == nv == njoints == n``; a floating
    base (``floating_base``) has the free-flyer ``'root_joint'`` first, ``nq = njoints + 6``,
    ``nv = njoints + 5`` (docs/conventions.md, "Floating base").
    """

    name: str
    tree: KinematicTree
    origin_xyz: Tensor
    origin_rpy: Tensor
    inertial: Tensor
    damping: Tensor
    friction: Tensor
    armature: Tensor
    gravity: Tensor
    lower: Tensor
    upper: Tensor
    velocity_limit: Tensor
    effort_limit: Tensor
    urdf: Optional[str] = field(default=None, repr=False)

    def __post_init__(self):
        # Derived tensors that depend only on parameters, reused while those parameters
        # need no gradient and are not modified in place (keyed on tensor versions).
        object.__setattr__(self, '_cache', {})
        n = self.tree.n
        for name, trailing in PARAMETER_FIELDS.items():
            value = getattr(self, name)
            expected = (3,) if name == 'gravity' else (
                (self.tree.nv,) if trailing == 1 else (n, 10 if name == 'inertial' else 3))
            shape = tuple(value.shape)
            if len(shape) < len(expected) or shape[len(shape) - len(expected):] != expected:
                raise ShapeError(f'RobotModel.{name}: expected shape (..., '
                                 f'{", ".join(map(str, expected))}), got {shape}')

    # -- structure -------------------------------------------------------------------------
    @property
    def n(self) -> int:
        """Return the number of degrees of freedom (``nv``)."""
        return self.tree.nv

    @property
    def nq(self) -> int:
        """Return the configuration size (``nv + 1`` with a floating base, else ``nv``)."""
        return self.tree.nq

    @property
    def nv(self) -> int:
        """Return the number of degrees of freedom (size of velocities and torques)."""
        return self.tree.nv

    @property
    def njoints(self) -> int:
        """Return the number of joints, ``'root_joint'`` included (= number of bodies)."""
        return self.tree.n

    @property
    def floating_base(self) -> bool:
        """Return whether joint 0 is a free-flyer (``'root_joint'``)."""
        return self.tree.floating

    @property
    def joint_names(self) -> tuple:
        """Return the movable joint names in model order (``'root_joint'`` first if floating)."""
        return self.tree.joint_names

    @property
    def link_names(self) -> tuple:
        """Return every link name, in the order of :func:`forward_kinematics` outputs."""
        return self.tree.link_names

    @property
    def parents(self) -> tuple:
        """Return the parent joint index of each joint (``-1`` = base)."""
        return self.tree.parents

    @property
    def dtype(self) -> torch.dtype:
        """Return the floating dtype of the parameters."""
        return self.inertial.dtype

    @property
    def device(self) -> torch.device:
        """Return the device of the parameters."""
        return self.inertial.device

    @property
    def batch_shape(self) -> torch.Size:
        """Return the broadcast leading batch shape of all parameter tensors."""
        shapes = [getattr(self, k).shape[:getattr(self, k).dim() - t]
                  for k, t in PARAMETER_FIELDS.items()]
        return torch.broadcast_shapes(*shapes)

    def joint_index(self, name: str) -> int:
        """
        Return the model index of a movable joint.

        :param name: joint name.
        :return: index into ``joint_names`` (with a floating base this is the joint's body
            index, not its position in ``q`` or ``v``: joint ``i > 0`` is ``q[i + 6]``,
            ``v[i + 5]``).
        :raises KeyError: naming the valid joints when ``name`` is unknown.
        """
        try:
            return self.tree.joint_names.index(name)
        except ValueError:
            raise KeyError(f'unknown joint {name!r}; movable joints: '
                           f'{", ".join(self.tree.joint_names)}') from None

    def link_index(self, name: str) -> int:
        """
        Return the index of a link in ``link_names``.

        :param name: link name.
        :return: index.
        :raises KeyError: naming the valid links when ``name`` is unknown.
        """
        try:
            return self.tree.link_names.index(name)
        except ValueError:
            raise KeyError(f'unknown link {name!r}; links: '
                           f'{", ".join(self.tree.link_names)}') from None

    # -- parameter views -------------------------------------------------------------------
    @property
    def mass(self) -> Tensor:
        """Return body masses ``(..., njoints)`` in kg (fixed children merged in)."""
        return self.inertial[..., 0]

    @property
    def com(self) -> Tensor:
        """Return body centres of mass ``(..., njoints, 3)`` in the body frame, m."""
        return mass_com_inertia(self.inertial)[1]

    @property
    def inertia_com(self) -> Tensor:
        """Return body inertias about the CoM ``(..., njoints, 3, 3)``, body axes, kg m^2."""
        return mass_com_inertia(self.inertial)[2]

    def inertial_parameter_names(self) -> tuple:
        """Return the ``10 njoints`` names of ``inertial.flatten(-2)``, e.g. ``'link1/mx'``."""
        return tuple(f'{link}/{suffix}' for link in self.tree.body_links
                     for suffix in _INERTIAL_SUFFIXES)

    def replace(self, **changes) -> 'RobotModel':
        """
        Return a new model with some fields replaced (shapes are validated).

        :param changes: field name -> new value, e.g. ``inertial=pi``.
        :return: the new model; ``self`` is unchanged.
        """
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise TypeError(f'RobotModel has no field(s) {sorted(unknown)}; parameter fields: '
                            f'{", ".join(PARAMETER_FIELDS)}')
        return dataclasses.replace(self, **changes)

    def to(self, dtype: Optional[torch.dtype] = None,
           device: Optional[torch.device] = None) -> 'RobotModel':
        """
        Return a copy with every tensor converted to ``dtype`` / ``device``.

        :param dtype: floating dtype, e.g. ``torch.float32`` for MPC rollouts.
        :param device: target device.
        :return: the converted model.
        """
        changes = {f.name: getattr(self, f.name).to(dtype=dtype, device=device)
                   for f in dataclasses.fields(self)
                   if isinstance(getattr(self, f.name), Tensor)}
        return dataclasses.replace(self, tree=self.tree.to(dtype, device), **changes)

    def _cached(self, key: str, sources: tuple, compute):
        if torch.compiler.is_compiling() or any(t.requires_grad for t in sources):
            return compute()
        stamp = tuple((id(t), t._version) for t in sources)
        hit = self._cache.get(key)
        if hit is None or hit[0] != stamp:
            hit = (stamp, compute())
            self._cache[key] = hit
        return hit[1]

    def joint_origins(self) -> Tensor:
        """
        Return joint placements in their parent *body* frame at q = 0.

        :return: ``T_parentbody_joint`` with shape ``(..., njoints, 4, 4)``.
        """
        def compute():
            T = homogeneous(rpy_to_matrix(self.origin_rpy), self.origin_xyz)
            if self.tree.has_parent_offsets:
                T = self.tree.T_body_parentlink @ T
            return T
        return self._cached('origins', (self.origin_xyz, self.origin_rpy), compute)

    def gravity_acceleration(self) -> Tensor:
        """
        Return the fictitious base acceleration ``[0; -g]`` that models gravity.

        :return: ``(..., 6)``.
        """
        return self._cached('gravity', (self.gravity,), lambda: torch.cat(
            (torch.zeros_like(self.gravity), -self.gravity), dim=-1))
