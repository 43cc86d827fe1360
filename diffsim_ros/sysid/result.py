"""
The one result type every estimator returns, and the configuration plumbing they share.

An :class:`IdentificationResult` holds the identified :class:`~diffsim_ros.core.RobotModel`
(inertials, damping, Coulomb friction and armature in its own fields, so it can be written back
to a URDF), any actuator / friction / network modules, the named parameters with units, the
training and validation curves and the metrics. :meth:`IdentificationResult.to_dict` gives a
JSON/YAML-ready view.

Estimator configurations are frozen dataclasses deriving from :class:`EstimatorConfig`;
:meth:`EstimatorConfig.from_dict` rejects unknown keys with one error listing the valid ones.
"""

from dataclasses import dataclass, field, fields
import math
from types import MappingProxyType
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Type, TypeVar

import torch
from torch import nn

from .losses import command_matrix, make_torque_fn
from ..core.model import PRISMATIC, RobotModel

Tensor = torch.Tensor
TorqueFn = Callable[[Tensor, Tensor, Tensor], Tensor]
ConfigT = TypeVar('ConfigT', bound='EstimatorConfig')

#: Units of the ten inertial parameters of a body, ``docs/conventions.md`` order.
INERTIAL_UNITS = ('kg', 'kg m', 'kg m', 'kg m', 'kg m^2', 'kg m^2', 'kg m^2', 'kg m^2',
                  'kg m^2', 'kg m^2')
#: Units of the joint-level parameters for (revolute, prismatic) joints.
JOINT_UNITS = {
    'damping': ('N m s/rad', 'N s/m'),
    'coulomb': ('N m', 'N'),
    'offset': ('N m', 'N'),
    'armature': ('kg m^2', 'kg'),
    'static': ('N m', 'N'),
    'stribeck_velocity': ('rad/s', 'm/s'),
    'viscous': ('N m s/rad', 'N s/m'),
    'phi1': ('N m', 'N'),
    'phi2': ('s/rad', 's/m'),
    'phi3': ('rad/s', 'm/s'),
}


def joint_unit(model: RobotModel, joint: int, kind: str) -> str:
    """
    Return the unit of a joint-level parameter.

    :param model: the robot (joint types decide rotational vs linear units).
    :param joint: joint index in ``model.joint_names``.
    :param kind: a key of :data:`JOINT_UNITS`.
    :return: the unit string, e.g. ``'N m s/rad'``.
    """
    return JOINT_UNITS[kind][int(model.tree.joint_types[joint] == PRISMATIC)]


def inertial_parameters(model: RobotModel) -> Dict[str, Tuple[float, str]]:
    """
    Return the named inertial parameters of an unbatched model with their units.

    :param model: the robot; ``model.inertial`` of shape ``(n, 10)``.
    :return: ``{'<link>/<m|mx|...|izz>': (value, unit)}`` in body order.
    """
    values = model.inertial.detach().reshape(-1).tolist()
    units = INERTIAL_UNITS * model.n
    return {name: (value, unit) for name, value, unit
            in zip(model.inertial_parameter_names(), values, units)}


def joint_parameters(model: RobotModel, kind: str, values: Tensor) -> Dict[str, Tuple[float, str]]:
    """
    Return one named joint-level parameter per joint.

    :param model: the robot.
    :param kind: parameter kind (a key of :data:`JOINT_UNITS`), used in the name.
    :param values: ``(n,)`` values in model joint order.
    :return: ``{'<joint>/<kind>': (value, unit)}``.
    """
    flat = values.detach().reshape(-1).tolist()
    return {f'{joint}/{kind}': (flat[i], joint_unit(model, i, kind))
            for i, joint in enumerate(model.joint_names)}


def _jsonable(value: Any) -> Any:
    """Convert tensors, tuples, mappings and non-finite floats into JSON-ready values."""
    if isinstance(value, Tensor):
        value = value.detach().cpu().tolist()
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    return str(value)


@dataclass(frozen=True, eq=False)
class IdentificationResult:
    """
    What every estimator returns.

    :param method: estimator name (``'nea'``, ``'diffnea'``, ``'ffnn'``).
    :param model: identified robot model (inertials, ``damping``, ``friction`` = Coulomb level,
        ``armature``, joint origins when identified); for the black-box baseline the nominal
        model it was given (its physics is not identified).
    :param parameters: ``name -> (value, unit)``, e.g. ``'arm_link/m': (0.095, 'kg')``,
        ``'arm_joint/damping': (5e-6, 'N m s/rad')``; empty for black-box models.
    :param std: ``name -> standard deviation`` (same unit) where the estimator provides one.
    :param history: curves: ``'train'`` loss per iteration, ``'validation'`` loss per
        evaluation at iterations ``'validation_iteration'``; ``'stage'`` the stage index of
        every iteration (progressive schedules).
    :param metrics: torque / acceleration / rollout errors, wall time, iteration count and
        estimator-specific figures (see each estimator).
    :param actuator: identified actuator module ``(u, qd_commanded) -> tau`` or ``None``.
    :param friction: identified extra friction module ``(q, qd) -> tau_f`` or ``None``.
    :param network: black-box forward model ``(q, qd, u) -> qdd`` or ``None``.
    :param command_joints: joints driven by the command columns, in command order.
    :param coulomb_eps: smoothing velocity of the ``model.friction * tanh(qd / eps)`` term.
    :param config: the estimator configuration as a plain mapping.
    :param state: internal tensors for warm starts and diagnostics (not part of ``to_dict``).
    """

    method: str
    model: Optional[RobotModel]
    parameters: Mapping[str, Tuple[float, str]] = field(default_factory=dict)
    std: Mapping[str, float] = field(default_factory=dict)
    history: Mapping[str, Tuple[float, ...]] = field(default_factory=dict)
    metrics: Mapping[str, Any] = field(default_factory=dict)
    actuator: Optional[nn.Module] = None
    friction: Optional[nn.Module] = None
    network: Optional[nn.Module] = None
    command_joints: Tuple[str, ...] = ()
    coulomb_eps: float = 1e-2
    config: Mapping[str, Any] = field(default_factory=dict)
    state: Mapping[str, Tensor] = field(default_factory=dict)

    def value(self, name: str) -> float:
        """
        Return the value of a named parameter.

        :param name: parameter name, e.g. ``'pendulum_link/m'``.
        :return: its value in the unit of :meth:`unit`.
        :raises KeyError: listing the known names.
        """
        try:
            return self.parameters[name][0]
        except KeyError:
            raise KeyError(f'no parameter {name!r} in this {self.method} result; known: '
                           f'{", ".join(self.parameters) or "none"}') from None

    def unit(self, name: str) -> str:
        """
        Return the unit of a named parameter.

        :param name: parameter name.
        :return: unit string.
        """
        self.value(name)
        return self.parameters[name][1]

    def torque_fn(self) -> TorqueFn:
        """
        Return the net applied joint torque of the identified model, for ``rollout``.

        ``tau = B actuator(u, B^T qd) - damping qd - friction tanh(qd / eps) - friction_module``
        with ``B`` the command-to-joint selection of :attr:`command_joints` (identity actuator
        when there is none).

        :return: ``torque_fn(q, qd, u) -> tau (..., n)`` for
            :func:`diffsim_ros.core.rollout`.
        :raises ValueError: for results without a physical model.
        """
        if self.model is None or self.network is not None:
            raise ValueError(f'a {self.method!r} result has no physical torque model')
        B = command_matrix(self.model, self.command_joints or self.model.joint_names)
        return make_torque_fn(self.model, B, self.actuator, self.friction, self.coulomb_eps)

    def to_dict(self) -> Dict[str, Any]:
        """
        Return a JSON/YAML-ready description (no tensors, no modules).

        :return: ``method``, ``parameters`` (``{name: {'value', 'unit'[, 'std']}}``),
            ``history``, ``metrics``, ``command_joints``, ``config`` and the joint names.
        """
        parameters = {}
        for name, (value, unit) in self.parameters.items():
            entry = {'value': _jsonable(float(value)), 'unit': unit}
            if name in self.std:
                entry['std'] = _jsonable(float(self.std[name]))
            parameters[name] = entry
        return {
            'method': self.method,
            'joint_names': list(self.model.joint_names) if self.model is not None else [],
            'parameters': parameters,
            'history': _jsonable(self.history),
            'metrics': _jsonable(self.metrics),
            'command_joints': list(self.command_joints),
            'config': _jsonable(self.config),
        }


@dataclass(frozen=True)
class EstimatorConfig:
    """
    Base of the frozen estimator configurations.

    Subclasses are frozen dataclasses with validated fields; build them from YAML-like
    mappings with :meth:`from_dict`, which rejects unknown keys.
    """

    @classmethod
    def from_dict(cls: Type[ConfigT], values: Optional[Mapping[str, Any]] = None,
                  **overrides: Any) -> ConfigT:
        """
        Build a configuration from a mapping, rejecting unknown keys.

        :param values: ``{field: value}``; missing fields keep their defaults.
        :param overrides: more fields, taking precedence over ``values``.
        :return: the validated configuration.
        :raises ValueError: naming the unknown keys and listing the valid ones.
        """
        merged = {**dict(values or {}), **overrides}
        valid = [f.name for f in fields(cls)]
        unknown = sorted(set(merged) - set(valid))
        if unknown:
            raise ValueError(f'{cls.__name__}: unknown key(s) {unknown}; valid keys: '
                             f'{", ".join(valid)}')
        return cls(**cls._convert(merged))

    @classmethod
    def _convert(cls, values: Dict[str, Any]) -> Dict[str, Any]:
        """Convert nested plain values (lists, dicts) into field types; identity by default."""
        return values

    def replace(self: ConfigT, **changes: Any) -> ConfigT:
        """
        Return a copy with some fields changed (validated again, unknown keys rejected).

        :param changes: ``{field: value}``.
        :return: the new configuration.
        """
        return type(self).from_dict(self.to_dict(), **changes)

    def to_dict(self) -> Dict[str, Any]:
        """
        Return the fields as a plain mapping (nested configs become mappings).

        :return: ``{field: value}``.
        """
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, EstimatorConfig):
                value = value.to_dict()
            elif isinstance(value, tuple) and value and isinstance(value[0], EstimatorConfig):
                value = tuple(v.to_dict() for v in value)
            elif isinstance(value, Mapping):
                value = dict(value)
            out[f.name] = value
        return out


def frozen_mapping(value: Optional[Mapping[str, Any]], name: str) -> Mapping[str, Any]:
    """
    Return a read-only copy of a mapping-valued config field.

    :param value: the mapping, or ``None`` for empty.
    :param name: field name for the error message.
    :return: a ``MappingProxyType``.
    :raises ValueError: when ``value`` is not a mapping.
    """
    if value is None:
        return MappingProxyType({})
    if not isinstance(value, Mapping):
        raise ValueError(f'{name} must be a mapping, got {type(value).__name__}')
    return MappingProxyType(dict(value))


def check_choice(name: str, value: Any, choices: Tuple[str, ...]) -> None:
    """
    Raise a ``ValueError`` listing the valid choices unless ``value`` is one of them.

    :param name: field name.
    :param value: given value.
    :param choices: valid values.
    """
    if value not in choices:
        raise ValueError(f'{name}: unknown value {value!r}; valid: '
                         f'{", ".join(repr(c) for c in choices)}')


def check_positive(name: str, value: Any, allow_zero: bool = False,
                   integer: bool = False) -> None:
    """
    Raise a ``ValueError`` unless ``value`` is a finite positive (or non-negative) number.

    :param name: field name.
    :param value: given value.
    :param allow_zero: accept 0.
    :param integer: require an ``int``.
    """
    if integer and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f'{name} must be an int, got {value!r}')
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        raise ValueError(f'{name} must be {">= 0" if allow_zero else "> 0"}, got {value!r}')


__all__ = ['EstimatorConfig', 'IdentificationResult', 'INERTIAL_UNITS', 'JOINT_UNITS',
           'check_choice', 'check_positive', 'frozen_mapping', 'inertial_parameters',
           'joint_parameters', 'joint_unit']
