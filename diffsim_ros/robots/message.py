"""
The identified model sent whole: a JSON document the mpc and monitor rebuild exactly.

A URDF has no field for armature or the motor model, and rounds nothing back reliably, so the
identifier publishes this document on ``~/model`` (``std_msgs/String``, transient-local)
beside the URDF it keeps for RViz and MoveIt::

    {"schema": "diffsim_ros/model", "version": 1, "robot": "qube", "method": "nea",
     "joint_names": [...], "body_links": [...], "command_joints": [...],
     "actuator": "dc_motor" | "none", "coulomb_eps": 0.01, "omitted": [],
     "parameters": {"pendulum_link/m": {"value": 0.024, "unit": "kg", "std": 0.001}, ...}}

``parameters`` holds every parameter field of a :class:`~diffsim_ros.core.RobotModel` that
an identification may change, by the names of :func:`~diffsim_ros.robots.model_parameters`:
the ten inertials of each body, ``<joint>/damping``, ``/coulomb``, ``/armature``,
``/origin_x..z`` and ``/origin_roll..yaw``, ``gravity/x..z``, and for a DC motor
``<joint>/motor_constant`` and ``/resistance``; ``std`` where the estimator gave one.  The
DC motor stores ``log k_m`` and ``log R_m``; their exact logs travel as ``"log"`` beside the
values so the motor is rebuilt bit for bit.  JSON writes floats with ``repr``, which reads
back to the same float64; non-finite values are written as ``null`` and refused on load.
What the document cannot carry (an extra friction network) is listed in ``omitted``.

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
from ..core.actuators import DCMotor
from ..core.integrators import FRICTION_VELOCITY_SCALE
from ..core.model import RobotModel

__all__ = ['MAX_MESSAGE_CHARS', 'ModelMessageError', 'SCHEMA', 'VERSION',
           'load_model_message', 'model_message', 'parameters_message']

SCHEMA = 'diffsim_ros/model'
VERSION = 1
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
    if getattr(source, 'friction', None) is not None:
        omitted.append(f'friction {type(source.friction).__name__}')
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
        'omitted': omitted, 'parameters': parameters,
    }


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
                       ) -> Tuple[RobotModel, Optional[nn.Module]]:
    """
    Rebuild the model and motor model of a document exactly (module docstring).

    :param document: the document, or its JSON text (at most :data:`MAX_MESSAGE_CHARS`).
    :param interface: the robot's interface: its nominal model supplies the structure.
    :return: ``(model, actuator)``: float64 CPU model; ``DCMotor`` of the command joints or
        ``None`` for effort-commanded robots.
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
    expected = {'schema': SCHEMA, 'version': VERSION, 'robot': interface.name,
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
    if motor is None:
        return model, None
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
    return model, motor


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
