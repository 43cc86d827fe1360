"""
The identified model sent whole: a JSON document the mpc and monitor rebuild exactly.

A URDF has no field for armature or the motor model, and rounds nothing back reliably, so the
identifier publishes this document on ``~/model`` (``std_msgs/String``, transient-local)
beside the URDF it keeps for RViz and MoveIt::

    {"schema": "diffsim_ros/model", "version": 2, "robot": "qube", "method": "nea",
     "joint_names": [...], "body_links": [...], "command_joints": [...],
     "actuator": "dc_motor" | "none", "coulomb_eps": 0.01, "omitted": [],
     "friction_model": null | {"name": "sigmoid", "coefficients": {"phi1": [...], ...}},
     "parameters": {"pendulum_link/m": {"value": 0.024, "unit": "kg", "std": 0.001}, ...}}

``parameters`` holds every parameter field of a :class:`~diffsim_ros.core.RobotModel` that
an identification may change, by the names of :func:`~diffsim_ros.robots.model_parameters`:
the ten inertials of each body, ``<joint>/damping``, ``/coulomb``, ``/armature``,
``/origin_x..z`` and ``/origin_roll..yaw``, ``gravity/x..z``, and for a DC motor
``<joint>/motor_constant`` and ``/resistance``; ``std`` where the estimator gave one.  The
DC motor stores ``log k_m`` and ``log R_m``; their exact logs travel as ``"log"`` beside the
values so the motor is rebuilt bit for bit.  JSON writes floats with ``repr``, which reads
back to the same float64; non-finite values are written as ``null`` and refused on load.

``friction_model`` (version 2) carries an analytic extra friction module, one richer than a
URDF's ``damping`` and symmetric ``friction`` fields (Gaz et al.'s offset sigmoids, Stribeck):
its :data:`~diffsim_ros.core.actuators` registry name, its physical ``coefficients`` by
constructor keyword, one value per joint in ``joint_names`` order, and ``eps`` for the models
with a fixed smoothing velocity (Coulomb, Stribeck), so that
``make_friction(name, n, **coefficients)`` rebuilds it.  It acts beside the URDF fields:
``tau = B a(u) - damping qd - coulomb tanh(qd / eps) - f(q, qd)``.  Neural friction modules
(``nn-friction``, ``nn-residual``) have thousands of weights and no physical reading: they
stay in a fit's ``modules.pt`` and are listed in ``omitted``, as is a non-DC-motor actuator.
Version 1 documents (no ``friction_model``) still load, without a friction module.

Loading never touches the file system and never trusts the text: unknown or missing names,
other joints, non-numbers, a foreign robot and oversized text are refused with a
:class:`ModelMessageError` naming what is wrong.  Whether the values are plausible is the
robot interface's :meth:`~diffsim_ros.robots.interface.RobotInterface.check_model` question.
"""

import json
import math
from typing import Any, Dict, Mapping, Optional, Tuple, Union

import torch
from torch import nn

from .interface import ACTUATOR_UNITS, model_parameters, RobotInterface
from ..core.actuators import (CoulombFriction, DCMotor, FrictionModel, make_friction,
                              SigmoidFriction, StribeckFriction, ViscousFriction)
from ..core.errors import ShapeError
from ..core.integrators import FRICTION_VELOCITY_SCALE
from ..core.model import RobotModel

__all__ = ['ANALYTIC_FRICTION', 'MAX_MESSAGE_CHARS', 'ModelMessageError', 'SCHEMA', 'VERSION',
           'friction_document', 'load_model_message', 'model_message', 'parameters_message']

SCHEMA = 'diffsim_ros/model'
VERSION = 2
#: Versions :func:`load_model_message` reads (1: no ``friction_model``).
READABLE_VERSIONS = (1, 2)
#: Friction modules the document carries, by their ``make_friction`` name.
ANALYTIC_FRICTION = {'viscous': ViscousFriction, 'coulomb': CoulombFriction,
                     'stribeck': StribeckFriction, 'sigmoid': SigmoidFriction}
#: Coefficients that may take any sign (Gaz et al.'s velocity offset); the others are >= 0.
_SIGNED_COEFFICIENTS = frozenset({'phi3'})
#: Coefficients that must be > 0 (slopes and velocity scales divide or multiply qd).
_POSITIVE_COEFFICIENTS = frozenset({'phi2', 'stribeck_velocity'})
#: Longest document accepted (a 7-joint arm's is about 25 kB).
MAX_MESSAGE_CHARS = 1 << 20


class ModelMessageError(ValueError):
    """A model document that cannot be loaded (the message says why)."""


def model_message(source: Any, interface: RobotInterface, method: Optional[str] = None,
                  std: Optional[Mapping[str, float]] = None) -> Dict[str, Any]:
    """
    Return the JSON-ready document of a model (module docstring).

    :param source: a :class:`~diffsim_ros.core.RobotModel` (the nominal one, say) or an
        identification result (``.model``, ``.actuator``, ``.std``, ``.method``,
        ``.coulomb_eps``, ``.friction``).
    :param interface: the robot's interface (command joints, nominal actuator).
    :param method: estimator name; default the result's, or ``'nominal'``.
    :param std: standard deviation per parameter name; default the result's.
    :return: the document (``json.dumps`` it).
    :raises ModelMessageError: the model has parameter batch dims or other joints.
    """
    model = source if isinstance(source, RobotModel) else source.model
    if model.batch_shape != torch.Size():
        raise ModelMessageError(f'cannot send a model with batch dims {tuple(model.batch_shape)}')
    if model.joint_names != interface.nominal_model().joint_names:
        raise ModelMessageError(f'joints {list(model.joint_names)} are not those of the '
                                f'{interface.name} robot')
    actuator = None if isinstance(source, RobotModel) else getattr(source, 'actuator', None)
    omitted = []
    if actuator is not None and not isinstance(actuator, DCMotor):
        omitted.append(f'actuator {type(actuator).__name__}')
        actuator = None
    if actuator is None:
        actuator = interface.actuator()
    friction = getattr(source, 'friction', None)
    friction_model = None if friction is None else friction_document(friction, model.n)
    if friction is not None and friction_model is None:
        omitted.append(f'friction {type(friction).__name__}')
    if std is None:
        std = getattr(source, 'std', None) or {}
    model = model.to(dtype=torch.float64, device=torch.device('cpu'))
    parameters = {}
    for name, (value, unit) in model_parameters(model, actuator,
                                                interface.command_joints).items():
        entry = {'value': _number(value), 'unit': unit}
        if name in std:
            entry['std'] = _number(float(std[name]))
        parameters[name] = entry
    if actuator is not None:
        for key in ACTUATOR_UNITS:
            logs = getattr(actuator, f'log_{key}').detach().double().reshape(-1).tolist()
            for joint, log in zip(interface.command_joints, logs):
                parameters[f'{joint}/{key}']['log'] = _number(log)
    return {
        'schema': SCHEMA, 'version': VERSION, 'robot': interface.name,
        'method': method or getattr(source, 'method', None) or 'nominal',
        'joint_names': list(model.joint_names), 'body_links': list(model.tree.body_links),
        'command_joints': list(interface.command_joints),
        'actuator': 'none' if actuator is None else 'dc_motor',
        'coulomb_eps': float(getattr(source, 'coulomb_eps', FRICTION_VELOCITY_SCALE)),
        'omitted': omitted, 'friction_model': friction_model, 'parameters': parameters,
    }


def friction_document(module: nn.Module, n: int) -> Optional[Dict[str, Any]]:
    """
    Return the ``friction_model`` entry of an analytic friction module (module docstring).

    :param module: the extra friction module of a fit.
    :param n: number of model joints.
    :return: ``{"name", "coefficients": {keyword: [n floats]}[, "eps"]}``, or ``None`` for a
        module the document does not carry (a neural network).
    :raises ModelMessageError: the module has parameter batch dims or another joint count.
    """
    name = next((key for key, cls in ANALYTIC_FRICTION.items() if type(module) is cls), None)
    if name is None:
        return None
    if module.n != n:
        raise ModelMessageError(f'the {name} friction has {module.n} joints, the model {n}')
    coefficients = {}
    for key, value in module.coefficients.items():
        if tuple(value.shape) != (n,):
            raise ModelMessageError(f'cannot send a {name} friction with batch dims '
                                    f'{tuple(value.shape[:-1])}')
        coefficients[key] = [_number(v) for v in value.detach().double().cpu().tolist()]
    entry: Dict[str, Any] = {'name': name, 'coefficients': coefficients}
    if hasattr(module, 'eps'):
        entry['eps'] = _number(float(module.eps))
    return entry


def _load_friction(entry: Any, n: int) -> Optional[FrictionModel]:
    """Rebuild a ``friction_model`` entry (float64 CPU), refusing anything hostile."""
    if entry is None:
        return None
    if not isinstance(entry, Mapping):
        raise ModelMessageError(f'friction_model must be an object or null, got '
                                f'{type(entry).__name__}')
    name = entry.get('name')
    if not isinstance(name, str) or name not in ANALYTIC_FRICTION:
        raise ModelMessageError(f'friction_model name {str(name)[:40]!r} is not one of '
                                f'{", ".join(ANALYTIC_FRICTION)}')
    cls = ANALYTIC_FRICTION[name]
    has_eps = name in ('coulomb', 'stribeck')
    allowed = {'name', 'coefficients'} | ({'eps'} if has_eps else set())
    if set(entry) - allowed:
        raise ModelMessageError(f'friction_model: unknown keys {sorted(set(entry) - allowed)}')
    coefficients = entry.get('coefficients')
    expected = set(cls(n).coefficients)
    if not isinstance(coefficients, Mapping) or set(coefficients) != expected:
        got = sorted(coefficients) if isinstance(coefficients, Mapping) else coefficients
        raise ModelMessageError(f'friction_model {name}: coefficients {str(got)[:80]}, '
                                f'expected {sorted(expected)}')
    kwargs: Dict[str, Any] = {}
    for key in sorted(expected):
        values = coefficients[key]
        if not isinstance(values, list) or len(values) != n:
            raise ModelMessageError(f'friction_model {name}: {key} must be a list of {n} '
                                    f'numbers (one per joint)')
        for value in values:
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value):
                raise ModelMessageError(f'friction_model {name}: {key} must be finite '
                                        f'numbers, got {value!r}')
            if key in _POSITIVE_COEFFICIENTS and not value > 0.0:
                raise ModelMessageError(f'friction_model {name}: {key} must be > 0, got {value}')
            if key not in _SIGNED_COEFFICIENTS and not value >= 0.0:
                raise ModelMessageError(f'friction_model {name}: {key} must be >= 0, got {value}')
        kwargs[key] = torch.tensor(values, dtype=torch.float64)
    if has_eps:
        eps = entry.get('eps')
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) \
                or not (math.isfinite(eps) and eps > 0):
            raise ModelMessageError(f'friction_model {name}: eps must be a finite number > 0, '
                                    f'got {eps!r}')
        kwargs['eps'] = float(eps)
    try:
        return make_friction(name, n, dtype=torch.float64, **kwargs)
    except (ValueError, ShapeError) as error:
        raise ModelMessageError(f'friction_model {name}: {str(error)[:120]}') from None


def _number(value: float) -> Optional[float]:
    return value if math.isfinite(value) else None


def _value(parameters: Mapping[str, Any], name: str, key: str = 'value') -> float:
    entry = parameters.get(name)
    value = entry.get(key) if isinstance(entry, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value):
        raise ModelMessageError(f'parameter {name!r}: {key} must be a finite number, got '
                                f'{value!r}')
    return float(value)


def load_model_message(document: Union[str, Mapping[str, Any]], interface: RobotInterface
                       ) -> Tuple[RobotModel, Optional[nn.Module], Optional[FrictionModel]]:
    """
    Rebuild the model, motor model and friction module of a document (module docstring).

    :param document: the document, or its JSON text (at most :data:`MAX_MESSAGE_CHARS`).
    :param interface: the robot's interface: its nominal model supplies the structure.
    :return: ``(model, actuator, friction)``: float64 CPU model; ``DCMotor`` of the command
        joints or ``None`` for effort-commanded robots; the extra friction module (float64,
        frozen: no gradient) or ``None``.
    :raises ModelMessageError: the document is not a complete model of this robot.
    """
    if isinstance(document, str):
        if len(document) > MAX_MESSAGE_CHARS:
            raise ModelMessageError(f'document of {len(document)} characters exceeds '
                                    f'{MAX_MESSAGE_CHARS}')
        try:
            document = json.loads(document)
        except (ValueError, RecursionError) as error:
            raise ModelMessageError(f'not JSON: {str(error)[:80]}') from None
    if not isinstance(document, Mapping):
        raise ModelMessageError(f'expected a JSON object, got {type(document).__name__}')
    nominal = interface.nominal_model()
    version = document.get('version')
    if isinstance(version, bool) or version not in READABLE_VERSIONS:
        raise ModelMessageError(f'version is {str(version)[:20]!r}, expected one of '
                                f'{list(READABLE_VERSIONS)}')
    if version == 1 and 'friction_model' in document:
        raise ModelMessageError('a version 1 document has no friction_model')
    expected = {'schema': SCHEMA, 'robot': interface.name,
                'joint_names': list(nominal.joint_names),
                'body_links': list(nominal.tree.body_links),
                'command_joints': list(interface.command_joints)}
    for key, value in expected.items():
        if document.get(key) != value:
            raise ModelMessageError(f'{key} is {str(document.get(key))[:120]!r}, expected '
                                    f'{value!r}')
    parameters = document.get('parameters')
    if not isinstance(parameters, Mapping):
        raise ModelMessageError('no parameters object')
    motor = interface.actuator()
    names = model_parameters(nominal, motor, interface.command_joints)
    unknown = sorted(set(parameters) - set(names))
    missing = sorted(set(names) - set(parameters))
    if unknown or missing:
        raise ModelMessageError(f'unknown parameters {unknown[:5]}, missing {missing[:5]}')
    n = nominal.n

    def tensor(suffixes, per_joint: bool = True) -> torch.Tensor:
        owners = nominal.joint_names if per_joint else nominal.tree.body_links
        return torch.tensor([[_value(parameters, f'{owner}/{s}') for s in suffixes]
                             for owner in owners], dtype=torch.float64)

    inertial = tensor(('m', 'mx', 'my', 'mz', 'ixx', 'ixy', 'ixz', 'iyy', 'iyz', 'izz'),
                      per_joint=False)
    joint = tensor(('damping', 'coulomb', 'armature'))
    model = nominal.replace(
        inertial=inertial, damping=joint[:, 0].contiguous(), friction=joint[:, 1].contiguous(),
        armature=joint[:, 2].contiguous(),
        origin_xyz=tensor(('origin_x', 'origin_y', 'origin_z')).reshape(n, 3),
        origin_rpy=tensor(('origin_roll', 'origin_pitch', 'origin_yaw')).reshape(n, 3),
        gravity=torch.tensor([_value(parameters, f'gravity/{a}') for a in 'xyz'],
                             dtype=torch.float64))
    friction = _load_friction(document.get('friction_model'), n)
    if friction is not None:
        friction.requires_grad_(False)
    if motor is None:
        return model, None, friction
    with torch.no_grad():
        for key in ACTUATOR_UNITS:
            logs = []
            for joint_name in interface.command_joints:
                name = f'{joint_name}/{key}'
                value = _value(parameters, name)
                if not value > 0.0:
                    raise ModelMessageError(f'parameter {name!r} must be > 0, got {value}')
                logs.append(_value(parameters, name, 'log')
                            if 'log' in parameters[name] else math.log(value))
            getattr(motor, f'log_{key}').copy_(torch.tensor(logs, dtype=torch.float64))
    return model, motor, friction


def parameters_message(result: Any, heldout_loss: float, stamp: float,
                       refits: int) -> Dict[str, Any]:
    """
    Return the identifier's ``~/parameters`` document: the estimate, for people and plots.

    ``{"stamp", "method", "heldout_loss", "refits", "parameters": {name: {"value", "unit"[,
    "std"]}}}``, with the standard deviation wherever the estimator is Bayesian.  Unlike the
    model document it is not meant to be loaded back.

    :param result: the identification result in use (None: the nominal model).
    :param heldout_loss: its held-out prediction error (not finite: none yet, ``null``).
    :param stamp: the time it is sent, s.
    :param refits: accepted refits so far.
    :return: the JSON-ready document.
    """
    return {'stamp': stamp, 'method': result.method if result is not None else 'nominal',
            'heldout_loss': heldout_loss if math.isfinite(heldout_loss) else None,
            'refits': refits,
            'parameters': result.to_dict()['parameters'] if result is not None else {}}
