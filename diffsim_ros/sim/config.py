"""Configuration of the simulated plant: one frozen dataclass, built from YAML-like mappings."""

from dataclasses import dataclass, field
import math
from typing import Any, Mapping, Optional, Union

from .builder import INTEGRATORS
from .parameters import dataclass_from_dict, Payload, ToolOffset, TrueParameters
from .. import robots

__all__ = ['MAX_TIMESTEP', 'PlantConfig']

NoiseStd = Union[float, tuple]

#: Largest physics timestep chosen when ``PlantConfig.substeps`` is None, s.
MAX_TIMESTEP = 1e-3


def _check_std(value: NoiseStd, what: str) -> NoiseStd:
    values = value if isinstance(value, tuple) else (value,)
    try:
        numbers = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        raise ValueError(f'PlantConfig.{what} must be a number or a tuple of numbers, '
                         f'got {value!r}') from None
    if not all(math.isfinite(v) and v >= 0.0 for v in numbers):
        raise ValueError(f'PlantConfig.{what} must be finite and >= 0, got {value!r}')
    return numbers if isinstance(value, tuple) else numbers[0]


@dataclass(frozen=True)
class PlantConfig:
    """
    Everything that defines a simulated robot.

    :param robot: catalog name (``diffsim_ros.robots.names()``); '' for a custom ``urdf``.
    :param urdf: URDF XML replacing the catalog's (kept out of ``repr``).  Without a catalog
        entry every joint is torque-commanded with the URDF effort limits.
    :param rate_hz: driver rate (``joint_states`` and command loop), Hz; None = catalog's.
    :param substeps: physics steps per driver period (MuJoCo ``timestep = 1 / (rate *
        substeps)``); None = the fewest that keep the timestep <= ``MAX_TIMESTEP`` (1 ms).
    :param integrator: ``'RK4'`` (default: 4th order, so the plant follows the continuous
        dynamics to ~1e-8 at 1 ms, not a first-order discretisation of them),
        ``'implicitfast'``, ``'implicit'`` or ``'Euler'`` (MuJoCo's first-order schemes).
    :param joint_limits: enforce the URDF position limits (soft constraints, as the real
        hard stops); their forces are not part of ``tau_applied``.
    :param q_noise_std: Gaussian position noise std (scalar or per joint), rad or m.
    :param qd_noise_std: Gaussian velocity noise std, rad/s or m/s.
    :param encoder_counts_per_rev: position quantisation of revolute joints (counts per
        revolution after quadrature); None = the catalog's ``sensor`` entry (Qube 2048,
        cart-pole 4096 and the cart's metres per count), 0 = no quantisation.
    :param encoder_resolution: explicit quantisation step per joint, rad or m (0 = none);
        overrides ``encoder_counts_per_rev``.
    :param pose_noise_std: ``(position m, rotation rad)`` noise std of the tracked poses.
    :param measurement_delay: driver ticks between sampling and delivery of a measurement.
    :param command_delay: driver ticks between receiving and applying a command.
    :param true_parameters: the plant's true parameters; None = sample them with
        ``param_error``/``actuator_error`` from ``seed`` (the nominal model when both are 0).
    :param param_error: relative error of the sampled parameters (0.3 = 30 %).
    :param actuator_error: relative error of the sampled actuator gains / motor constants.
    :param seed: seed of the parameter sampling and of the sensor noise.
    :param tracked_bodies: links whose world poses are measured (mocap); None = the catalog's
        end-effector link, plus the tool frame when one is configured.
    :param payload: extra rigid body fixed to a link (part of ``plant.true_model``).
    :param tool: extra frame fixed to a link (becomes a link of ``plant.true_model``).
    :param gravity_compensation: the driver adds gravity compensation to the commands
        (libfranka does); None = catalog's ``motor['driver_adds_gravity']``.
    """

    robot: str = 'qube'
    urdf: Optional[str] = field(default=None, repr=False)
    rate_hz: Optional[float] = None
    substeps: Optional[int] = None
    integrator: str = 'RK4'
    joint_limits: bool = True
    q_noise_std: NoiseStd = 0.0
    qd_noise_std: NoiseStd = 0.0
    encoder_counts_per_rev: Optional[float] = None
    encoder_resolution: Optional[tuple] = None
    pose_noise_std: tuple = (0.0, 0.0)
    measurement_delay: int = 0
    command_delay: int = 0
    true_parameters: Optional[TrueParameters] = None
    param_error: float = 0.0
    actuator_error: float = 0.0
    seed: int = 0
    tracked_bodies: Optional[tuple] = None
    payload: Optional[Payload] = None
    tool: Optional[ToolOffset] = None
    gravity_compensation: Optional[bool] = None

    def __post_init__(self) -> None:
        """Validate every field once (messages name the field and the valid values)."""
        if self.robot:
            robots.get(self.robot)
        elif self.urdf is None:
            raise ValueError(f'PlantConfig needs robot (one of {", ".join(robots.names())}) '
                             'or urdf')
        if self.rate_hz is None and not self.robot:
            raise ValueError('PlantConfig.rate_hz is required for a robot outside the catalog')
        if self.rate_hz is not None and not (math.isfinite(self.rate_hz) and self.rate_hz > 0):
            raise ValueError(f'PlantConfig.rate_hz must be > 0, got {self.rate_hz!r}')
        value = self.substeps
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise ValueError(f'PlantConfig.substeps must be an int >= 1 or None, got {value!r}')
        for key in ('measurement_delay', 'command_delay', 'seed'):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f'PlantConfig.{key} must be an int >= 0, got {value!r}')
        if self.integrator not in INTEGRATORS:
            raise ValueError(f'PlantConfig.integrator must be one of '
                             f'{", ".join(repr(k) for k in INTEGRATORS)}, got '
                             f'{self.integrator!r}')
        object.__setattr__(self, 'q_noise_std', _check_std(self.q_noise_std, 'q_noise_std'))
        object.__setattr__(self, 'qd_noise_std', _check_std(self.qd_noise_std, 'qd_noise_std'))
        pose = _check_std(tuple(self.pose_noise_std), 'pose_noise_std')
        if len(pose) != 2:
            raise ValueError('PlantConfig.pose_noise_std must be (position_std, rotation_std), '
                             f'got {self.pose_noise_std!r}')
        object.__setattr__(self, 'pose_noise_std', pose)
        if self.encoder_counts_per_rev is not None:
            counts = float(self.encoder_counts_per_rev)
            if not (math.isfinite(counts) and counts >= 0):
                raise ValueError('PlantConfig.encoder_counts_per_rev must be >= 0 or None, '
                                 f'got {self.encoder_counts_per_rev!r}')
        if self.encoder_resolution is not None:
            object.__setattr__(self, 'encoder_resolution', _check_std(
                tuple(self.encoder_resolution), 'encoder_resolution'))
        for key in ('param_error', 'actuator_error'):
            value = float(getattr(self, key))
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f'PlantConfig.{key} must be finite and >= 0, '
                                 f'got {getattr(self, key)!r}')
        if self.tracked_bodies is not None:
            object.__setattr__(self, 'tracked_bodies', tuple(self.tracked_bodies))
        for key, cls in (('true_parameters', TrueParameters), ('payload', Payload),
                         ('tool', ToolOffset)):
            value = getattr(self, key)
            if value is not None and not isinstance(value, cls):
                raise ValueError(f'PlantConfig.{key} must be a {cls.__name__} (or a mapping '
                                 f'in from_dict), got {type(value).__name__}')
        if (self.true_parameters is not None and self.robot
                and self.true_parameters.robot not in ('', self.robot)):
            raise ValueError(f'PlantConfig.true_parameters belong to '
                             f'{self.true_parameters.robot!r}, not {self.robot!r}')

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> 'PlantConfig':
        """
        Build from a mapping (YAML, ROS parameters), rejecting unknown keys.

        ``true_parameters``, ``payload`` and ``tool`` may be nested mappings.

        :param data: field name -> value.
        :return: the configuration.
        :raises ValueError: unknown keys (listing the valid ones) or invalid values.
        """
        return dataclass_from_dict(cls, data, nested={
            'true_parameters': TrueParameters.from_dict, 'payload': Payload.from_dict,
            'tool': ToolOffset.from_dict})
