"""
The "true" physical parameters of a simulated robot, and attachments (payload, tool frame).

A :class:`TrueParameters` describes how the simulated plant differs from the nominal model of
the robot (the shipped URDF plus the catalog's rotor armature): per-body multiplicative mass
and inertia errors and CoM offsets, absolute joint damping, Coulomb friction and armature, and
actuator errors.  :meth:`TrueParameters.as_model` returns the :class:`RobotModel` that
describes the plant exactly, so identified parameters can be compared with the truth entry by
entry (``RobotModel.inertial_parameter_names()``).

Names, not positions, address everything: inertial entries are keyed by the body's link name
(``model.tree.body_links``, the prefix of ``'link/m'``), joint entries by joint name.
"""

import dataclasses
from dataclasses import dataclass, field
import functools
import math
from types import MappingProxyType
from typing import Any, Mapping, Optional, Sequence, Union
import xml.etree.ElementTree as ET

import torch

from .. import robots
from ..core import inertial_from_mass_com_inertia, load_urdf, mass_com_inertia, RobotModel
from ..core.spatial import homogeneous, rpy_to_matrix, transform_inertial

__all__ = ['Payload', 'ToolOffset', 'TrueParameters', 'add_payload', 'attach_tool',
           'dataclass_from_dict', 'finite_vector', 'nominal_model']

Tensor = torch.Tensor


def dataclass_from_dict(cls: type, data: Mapping[str, Any], nested: Optional[dict] = None):
    """
    Build a dataclass from a mapping, rejecting unknown keys.

    :param cls: the dataclass type.
    :param data: field name -> value (lists become tuples).
    :param nested: field name -> callable converting a mapping value (nested configs).
    :return: ``cls(**data)``.
    :raises ValueError: unknown keys (the message lists the valid ones).
    """
    if not isinstance(data, Mapping):
        raise ValueError(f'{cls.__name__}.from_dict expects a mapping, got {type(data).__name__}')
    valid = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(valid))
    if unknown:
        raise ValueError(f'{cls.__name__}: unknown key(s) {unknown}; valid keys: '
                         f'{", ".join(valid)}')
    kwargs = {}
    for key, value in data.items():
        if nested and key in nested and isinstance(value, Mapping):
            value = nested[key](value)
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[key] = value
    return cls(**kwargs)


def finite_vector(value: Sequence[float], size: int, what: str) -> tuple:
    """
    Return ``value`` as a tuple of ``size`` finite floats, or raise naming ``what``.

    :param value: the numbers.
    :param size: how many there must be.
    :param what: the name in the error.
    :return: the floats.
    :raises ValueError: not numbers, not ``size`` of them, or not finite.
    """
    try:
        values = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f'{what}: expected {size} numbers, got {value!r}') from None
    if len(values) != size or not all(math.isfinite(v) for v in values):
        raise ValueError(f'{what}: expected {size} finite numbers, got {value!r}')
    return values


@dataclass(frozen=True)
class Payload:
    """
    A rigid payload fixed to a link (a tool, a grasped object): adds mass to the plant.

    :param link: link it is attached to (any link, fixed links such as a flange included).
    :param mass: kg, > 0.
    :param com: centre of mass in the link frame, m.
    :param inertia: ``(ixx, ixy, ixz, iyy, iyz, izz)`` about the CoM, link axes, kg m^2.
    """

    link: str
    mass: float
    com: tuple = (0.0, 0.0, 0.0)
    inertia: tuple = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0)

    def __post_init__(self) -> None:
        """Validate and normalise the numbers."""
        if not isinstance(self.link, str) or not self.link:
            raise ValueError(f'Payload.link must be a link name, got {self.link!r}')
        if not (math.isfinite(float(self.mass)) and float(self.mass) > 0.0):
            raise ValueError(f'Payload.mass must be > 0 kg, got {self.mass!r}')
        object.__setattr__(self, 'mass', float(self.mass))
        object.__setattr__(self, 'com', finite_vector(self.com, 3, 'Payload.com'))
        inertia = finite_vector(self.inertia, 6, 'Payload.inertia')
        ixx, ixy, ixz, iyy, iyz, izz = inertia
        moments = torch.linalg.eigvalsh(torch.tensor(
            [[ixx, ixy, ixz], [ixy, iyy, iyz], [ixz, iyz, izz]], dtype=torch.float64))
        if float(moments.min()) < -1e-12:
            raise ValueError(f'Payload.inertia is not positive semi-definite: {inertia}')
        object.__setattr__(self, 'inertia', inertia)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> 'Payload':
        """
        Build from a mapping (YAML), rejecting unknown keys.

        :param data: ``{'link': ..., 'mass': ..., 'com': [...], 'inertia': [...]}``.
        :return: the payload.
        """
        return dataclass_from_dict(cls, data)

    def inertial(self, dtype: torch.dtype = torch.float64) -> Tensor:
        """
        Return the payload's inertial 10-vector about the link origin, link axes.

        :param dtype: tensor dtype.
        :return: ``pi`` ``(10,)`` (docs/conventions.md).
        """
        ixx, ixy, ixz, iyy, iyz, izz = self.inertia
        I_com = torch.tensor([[ixx, ixy, ixz], [ixy, iyy, iyz], [ixz, iyz, izz]], dtype=dtype)
        return inertial_from_mass_com_inertia(torch.tensor(self.mass, dtype=dtype),
                                              torch.tensor(self.com, dtype=dtype), I_com)


@dataclass(frozen=True)
class ToolOffset:
    """
    A massless frame fixed to a link at an offset (tool centre point, mocap marker body).

    The plant adds it as a fixed link named ``name`` so that its pose can be tracked;
    :func:`attach_tool` writes the same link into a URDF for our own kinematics.

    :param link: parent link.
    :param xyz: translation of the tool frame in the parent link frame, m.
    :param rpy: fixed-axis roll, pitch, yaw of the tool frame, rad (URDF convention).
    :param name: name of the new link (its fixed joint is ``<name>_joint``).
    """

    link: str
    xyz: tuple = (0.0, 0.0, 0.0)
    rpy: tuple = (0.0, 0.0, 0.0)
    name: str = 'tool'

    def __post_init__(self) -> None:
        """Validate and normalise the numbers."""
        for key in ('link', 'name'):
            if not isinstance(getattr(self, key), str) or not getattr(self, key):
                raise ValueError(f'ToolOffset.{key} must be a non-empty string, '
                                 f'got {getattr(self, key)!r}')
        object.__setattr__(self, 'xyz', finite_vector(self.xyz, 3, 'ToolOffset.xyz'))
        object.__setattr__(self, 'rpy', finite_vector(self.rpy, 3, 'ToolOffset.rpy'))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> 'ToolOffset':
        """
        Build from a mapping (YAML), rejecting unknown keys.

        :param data: ``{'link': ..., 'xyz': [...], 'rpy': [...], 'name': ...}``.
        :return: the tool offset.
        """
        return dataclass_from_dict(cls, data)

    def transform(self, dtype: torch.dtype = torch.float64) -> Tensor:
        """
        Return ``T_link_tool``.

        :param dtype: tensor dtype.
        :return: ``(4, 4)`` homogeneous transform.
        """
        return homogeneous(rpy_to_matrix(torch.tensor(self.rpy, dtype=dtype)),
                           torch.tensor(self.xyz, dtype=dtype))


def attach_tool(urdf: str, tool: ToolOffset) -> str:
    """
    Return a URDF with the tool frame added as a fixed, massless link.

    :param urdf: URDF XML.
    :param tool: the tool frame.
    :return: URDF XML with ``<joint name="<tool.name>_joint" type="fixed">`` and
        ``<link name="<tool.name>"/>``.
    :raises ValueError: the parent link does not exist or the tool name is taken.
    """
    root = ET.fromstring(urdf.strip())
    links = {element.get('name') for element in root.findall('link')}
    joints = {element.get('name') for element in root.findall('joint')}
    if tool.link not in links:
        raise ValueError(f'ToolOffset.link {tool.link!r} is not a link of the robot; links: '
                         f'{", ".join(sorted(links))}')
    if tool.name in links or f'{tool.name}_joint' in joints:
        raise ValueError(f'ToolOffset.name {tool.name!r} clashes with an existing link/joint')
    joint = ET.SubElement(root, 'joint', {'name': f'{tool.name}_joint', 'type': 'fixed'})
    ET.SubElement(joint, 'parent', {'link': tool.link})
    ET.SubElement(joint, 'child', {'link': tool.name})
    ET.SubElement(joint, 'origin', {'xyz': ' '.join(repr(v) for v in tool.xyz),
                                    'rpy': ' '.join(repr(v) for v in tool.rpy)})
    ET.SubElement(root, 'link', {'name': tool.name})
    return ET.tostring(root, encoding='unicode')


def add_payload(model: RobotModel, payload: Payload) -> RobotModel:
    """
    Return the model with a payload's inertia merged into the body that carries its link.

    :param model: unbatched robot model.
    :param payload: the payload; its link may be a fixed link (merged into its body).
    :return: new model (``inertial`` changed).
    :raises ValueError: the link is fixed to the base (the payload would not move).
    """
    index = model.link_index(payload.link)
    body = model.tree.link_bodies[index]
    if body < 0:
        raise ValueError(f'payload link {payload.link!r} is fixed to the base; a payload there '
                         'has no effect on the dynamics')
    T_body_link = model.tree.T_body_link[index].to(model.dtype)
    pi = transform_inertial(payload.inertial(model.dtype).to(model.device), T_body_link)
    inertial = model.inertial.clone()
    inertial[..., body, :] = inertial[..., body, :] + pi
    return model.replace(inertial=inertial)


@functools.lru_cache(maxsize=32)
def _load(urdf: str) -> RobotModel:
    return load_urdf(xml=urdf, dtype=torch.float64)


def nominal_model(robot: str = '', urdf: Optional[str] = None) -> RobotModel:
    """
    Return the nominal model of a robot, from its robot interface.

    A catalog robot's model is ``robots.interface(robot).nominal_model()`` itself.

    :param robot: catalog name (``diffsim_ros.robots.names()``); may be empty when ``urdf``
        is given (then the armature stays zero).
    :param urdf: URDF XML overriding the catalog's file (a tool attached, a custom robot);
        a catalog robot's armature is copied onto its joints by name.
    :return: float64 model on the CPU.
    :raises ValueError: neither given, or unknown robot.
    """
    if not robot and urdf is None:
        raise ValueError('nominal_model needs a robot name or a URDF string')
    if urdf is None:
        return robots.interface(robot).nominal_model()
    model = _load(urdf)
    if robot:
        nominal = robots.interface(robot).nominal_model()
        values = model.armature.clone()
        for name, value in zip(nominal.joint_names, nominal.armature.tolist()):
            if name in model.joint_names:
                values[model.joint_index(name)] = value
        model = model.replace(armature=values)
    return model


_Number = Union[int, float]


def _frozen_map(value: Mapping[str, Any], what: str, size: int = 0,
                positive: bool = False) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f'TrueParameters.{what} must map names to values, got {value!r}')
    out = {}
    for key, item in value.items():
        if size:
            out[str(key)] = finite_vector(item, size, f'TrueParameters.{what}[{key!r}]')
            continue
        try:
            number = float(item)
        except (TypeError, ValueError):
            raise ValueError(f'TrueParameters.{what}[{key!r}] must be a number, '
                             f'got {item!r}') from None
        if not math.isfinite(number) or number < 0.0 or (positive and number == 0.0):
            bound = '> 0' if positive else '>= 0'
            raise ValueError(f'TrueParameters.{what}[{key!r}] must be finite and {bound}, '
                             f'got {item!r}')
        out[str(key)] = number
    return MappingProxyType(out)


# Field -> (vector size, must be strictly positive).
_MAP_FIELDS = {
    'mass_scale': (0, True), 'com_offset': (3, False), 'inertia_scale': (0, True),
    'damping': (0, False), 'friction': (0, False), 'armature': (0, False),
    'actuator_gain': (0, True), 'motor_constant': (0, True), 'motor_resistance': (0, True),
}


@dataclass(frozen=True)
class TrueParameters:
    """
    How the simulated robot differs from its nominal model.

    Every mapping may omit names (then the nominal value is kept).

    :param robot: catalog name of the robot these parameters belong to ('' for a custom URDF).
    :param urdf: the nominal URDF when it is not the catalog's (kept out of ``repr``).
    :param mass_scale: body link -> factor on the body mass (> 0).
    :param com_offset: body link -> CoM shift ``(x, y, z)`` in the body frame, m.
    :param inertia_scale: body link -> factor on the inertia about the CoM (> 0; keeps the
        body physically consistent).
    :param damping: joint -> true viscous damping, N m s/rad or N s/m.
    :param friction: joint -> true Coulomb friction (MuJoCo ``frictionloss``), N m or N.
    :param armature: joint -> true rotor armature, kg m^2 or kg.
    :param actuator_gain: command joint -> factor between the commanded and the produced
        joint torque (torque-commanded robots) or on the motor torque (voltage robots).
    :param motor_constant: command joint -> true ``k_m`` of a DC motor (voltage robots), N m/A.
    :param motor_resistance: command joint -> true ``R_m`` of a DC motor, Ohm.
    """

    robot: str = ''
    urdf: Optional[str] = field(default=None, repr=False, compare=False)
    mass_scale: Mapping[str, float] = field(default_factory=dict)
    com_offset: Mapping[str, tuple] = field(default_factory=dict)
    inertia_scale: Mapping[str, float] = field(default_factory=dict)
    damping: Mapping[str, float] = field(default_factory=dict)
    friction: Mapping[str, float] = field(default_factory=dict)
    armature: Mapping[str, float] = field(default_factory=dict)
    actuator_gain: Mapping[str, float] = field(default_factory=dict)
    motor_constant: Mapping[str, float] = field(default_factory=dict)
    motor_resistance: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Validate the values and freeze the mappings."""
        if self.robot:
            robots.get(self.robot)
        for name, (size, positive) in _MAP_FIELDS.items():
            object.__setattr__(self, name, _frozen_map(getattr(self, name), name, size,
                                                       positive))

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> 'TrueParameters':
        """
        Build from a mapping (YAML), rejecting unknown keys.

        :param data: field name -> value, e.g. ``{'robot': 'qube', 'mass_scale':
            {'arm_link': 1.2}}``.
        :return: the parameters.
        """
        return dataclass_from_dict(cls, data)

    def to_dict(self) -> dict:
        """
        Return plain Python containers (YAML/JSON friendly; ``urdf`` omitted when None).

        :return: field name -> value.
        """
        out = {'robot': self.robot}
        if self.urdf is not None:
            out['urdf'] = self.urdf
        for name in _MAP_FIELDS:
            out[name] = {k: (list(v) if isinstance(v, tuple) else v)
                         for k, v in getattr(self, name).items()}
        return out

    @classmethod
    def sample(cls, robot: Union[str, RobotModel], param_error: float = 0.3,
               generator: Optional[torch.Generator] = None,
               actuator_error: float = 0.0) -> 'TrueParameters':
        """
        Draw true parameters about ``param_error`` (relative) off the nominal ones.

        Each factor is ``(1 + e u) ** s`` with ``u ~ U(0.5, 1.5)`` and a random sign ``s``: the
        quantity is ``e/2 .. 3e/2`` too large, or divided by that much.  Factors apply to body
        masses, inertias about the CoM, and to the nominal joint damping, Coulomb friction
        and armature (zero stays zero).  Each CoM moves by ``e u L`` in a random direction,
        ``L = max(|c|, sqrt(tr(I_com) / m))`` (the body's own length scale).  Actuators are
        perturbed only when ``actuator_error > 0`` (a common gain error is indistinguishable
        from scaled inertias, so identification experiments usually keep it at zero).

        :param robot: catalog name or nominal model (its ``name`` selects the catalog entry
            for the actuators when it is one).
        :param param_error: relative error ``e`` >= 0, e.g. 0.3 for 30 %.
        :param generator: random source (default: seeded with 0), advanced in a fixed order.
        :param actuator_error: relative error of actuator gains (torque robots) or of the DC
            motor constant and resistance (voltage robots).
        :return: the sampled parameters.
        """
        for name, value in (('param_error', param_error), ('actuator_error', actuator_error)):
            if not (math.isfinite(value) and value >= 0.0):
                raise ValueError(f'{name} must be finite and >= 0, got {value!r}')
        if isinstance(robot, RobotModel):
            nominal = robot
            name = robot.name if robot.name in robots.names() else ''
            urdf = None if name and robot.urdf == robots.urdf_string(name) else robot.urdf
        else:
            nominal, name, urdf = nominal_model(robot), robot, None
        if generator is None:
            generator = torch.Generator().manual_seed(0)
        n = nominal.n
        e = float(param_error)

        def factors(count: int, error: float) -> Tensor:
            u = 0.5 + torch.rand(count, generator=generator, dtype=torch.float64)
            sign = torch.where(torch.rand(count, generator=generator, dtype=torch.float64)
                               < 0.5, -1.0, 1.0)
            return (1.0 + error * u) ** sign

        mass, com, inertia_com = mass_com_inertia(nominal.inertial.detach().cpu().double())
        radius = (torch.diagonal(inertia_com, dim1=-2, dim2=-1).sum(-1)
                  / mass.clamp_min(1e-12)).clamp_min(0.0).sqrt()
        length = torch.maximum(com.norm(dim=-1), radius)
        direction = torch.randn(n, 3, generator=generator, dtype=torch.float64)
        direction = direction / direction.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        shift = direction * (e * (0.5 + torch.rand(n, 1, generator=generator,
                                                   dtype=torch.float64)) * length[:, None])
        mass_scale, inertia_scale = factors(n, e), factors(n, e)
        joint_values = {}
        for key in ('damping', 'friction', 'armature'):
            joint_values[key] = getattr(nominal, key).detach().cpu().double() * factors(n, e)
        bodies, joints = nominal.tree.body_links, nominal.joint_names
        actuators = {}
        if actuator_error > 0.0 and name:
            info = robots.get(name)
            m = len(info.command_joints)
            if info.command_unit == 'V':
                for key, catalog_key in (('motor_constant', 'k_m'),
                                         ('motor_resistance', 'R_m')):
                    values = float(info.motor[catalog_key]) * factors(m, actuator_error)
                    actuators[key] = dict(zip(info.command_joints, values.tolist()))
            else:
                gain = factors(m, actuator_error)
                actuators['actuator_gain'] = dict(zip(info.command_joints, gain.tolist()))
        return cls(
            robot=name, urdf=urdf,
            mass_scale=dict(zip(bodies, mass_scale.tolist())),
            com_offset={b: tuple(s) for b, s in zip(bodies, shift.tolist())},
            inertia_scale=dict(zip(bodies, inertia_scale.tolist())),
            damping=dict(zip(joints, joint_values['damping'].tolist())),
            friction=dict(zip(joints, joint_values['friction'].tolist())),
            armature=dict(zip(joints, joint_values['armature'].tolist())),
            **actuators)

    # -- use ---------------------------------------------------------------------------------
    def nominal(self) -> RobotModel:
        """
        Return the nominal model these parameters perturb.

        :return: :func:`nominal_model` of ``robot`` / ``urdf``.
        """
        return nominal_model(self.robot, self.urdf)

    def as_model(self, nominal: Optional[RobotModel] = None) -> RobotModel:
        """
        Return the robot model that describes the plant exactly (rigid body and joints).

        Actuator errors are not part of a :class:`RobotModel`; the plant reports the joint
        torque they produce, so ``M(q) qdd + h = tau_applied - damping qd - friction``.

        :param nominal: model to perturb (default: :meth:`nominal`); it may carry extra
            fixed links (a tool frame) but must have the same bodies and joints.
        :return: float64 model with the true ``inertial``, ``damping``, ``friction`` and
            ``armature``.
        :raises KeyError: a mapping names a body or joint the model does not have.
        """
        model = self.nominal() if nominal is None else nominal
        bodies, joints = model.tree.body_links, model.joint_names
        for what, names, valid in (('mass_scale', self.mass_scale, bodies),
                                   ('com_offset', self.com_offset, bodies),
                                   ('inertia_scale', self.inertia_scale, bodies),
                                   ('damping', self.damping, joints),
                                   ('friction', self.friction, joints),
                                   ('armature', self.armature, joints)):
            unknown = sorted(set(names) - set(valid))
            if unknown:
                raise KeyError(f'TrueParameters.{what} names {unknown}, which the model '
                               f'{model.name!r} does not have; valid: {", ".join(valid)}')
        dtype = model.dtype
        mass, com, inertia_com = mass_com_inertia(model.inertial)
        massless = mass == 0.0
        com = torch.where(massless[..., None], torch.zeros_like(com), com)
        inertia_com = torch.where(massless[..., None, None],
                                  torch.zeros_like(inertia_com), inertia_com)
        mass_scale = torch.tensor([self.mass_scale.get(b, 1.0) for b in bodies], dtype=dtype)
        inertia_scale = torch.tensor([self.inertia_scale.get(b, 1.0) for b in bodies],
                                     dtype=dtype)
        shift = torch.tensor([self.com_offset.get(b, (0.0, 0.0, 0.0)) for b in bodies],
                             dtype=dtype)
        inertial = inertial_from_mass_com_inertia(
            mass * mass_scale, com + shift, inertia_com * inertia_scale[:, None, None])
        inertial = torch.where(massless[..., None], model.inertial, inertial)
        changes = {'inertial': inertial}
        for key in ('damping', 'friction', 'armature'):
            values = getattr(model, key).clone()
            for joint, value in getattr(self, key).items():
                values[..., model.joint_index(joint)] = value
            changes[key] = values
        return model.replace(**changes)
