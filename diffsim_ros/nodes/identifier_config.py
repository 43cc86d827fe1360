"""
Parameters of the identifier node, and the engine options it runs with, without a node.

:class:`IdentifierConfig` is the node's ``ros__parameters`` (``config/<robot>.yaml``, section
``identifier``); :func:`engine_options` builds the
:class:`~diffsim_ros.sysid.online.OnlineConfig` the node gives its engine, for callers that
run the same loop without ROS (``diffsim-sim-eval --controller adaptive-mpc``).
"""

import dataclasses
from dataclasses import dataclass, field
import math
from typing import Any, Mapping, Optional, Tuple

from .model_file import MODEL_FILE_DESCRIPTION
from .params import build_config, config_path, load_yaml_params, meta
from .. import robots
from ..sysid.estimators import ESTIMATORS
from ..sysid.online import OnlineConfig

__all__ = ['IdentifierConfig', 'PHYSICAL_ESTIMATORS', 'complete_estimator', 'engine_options']


#: Estimators whose result is a physical model ('svgd': the posterior-mean model, with a
#: standard deviation per parameter in ``~/parameters``).
PHYSICAL_ESTIMATORS = ('nea', 'diffnea', 'svgd')


@dataclass(frozen=True)
class IdentifierConfig:
    """Parameters of the identifier node (see the module docstring)."""

    estimator: str = field(default='diffnea', metadata=meta(
        "estimator: 'nea', 'diffnea' or 'svgd'; its settings are the parameters "
        "'<estimator>.*'"))
    refit_period: float = field(default=1.0, metadata=meta('seconds between refits',
                                                           range=(0.0, 3600.0)))
    window: float = field(default=5.0, metadata=meta('sliding window length, s',
                                                     range=(0.0, 3600.0)))
    min_window: float = field(default=1.0, metadata=meta('data needed before a refit, s',
                                                         range=(0.0, 3600.0)))
    holdout_fraction: float = field(default=0.25, metadata=meta(
        'last fraction of the window held out to accept or reject a refit'))
    min_improvement: float = field(default=0.0, metadata=meta(
        'relative improvement of the held-out prediction error a refit needs to replace the '
        'current model'))
    prediction_steps: int = field(default=10, metadata=meta(
        'open-loop steps of the held-out prediction error that accepts or refuses a refit'))
    max_unexplained: float = field(default=1.0, metadata=meta(
        'refuse refits on data whose commands leave more than this normalised residual in a '
        'block under every plausible model (0 explained, 1 unrelated, above 1 pushing against '
        'the motion, 2 opposed)'))
    velocity_source: str = field(default='auto', metadata=meta(
        "'auto' (message velocity when every sample has one), 'message' or 'differentiate'"))
    derivative_cutoff_hz: float = field(default=20.0, metadata=meta(
        'low-pass cutoff of the zero-phase differentiation, Hz', range=(0.0, 10000.0)))
    limit_margin: float = field(default=0.05, metadata=meta(
        'samples this close to a position limit (rad or m), or beyond it, are left out of '
        'refits, with the filter transient around them; negative keeps every sample'))
    min_sample_interval: float = field(default=0.0, metadata=meta(
        'joint states closer than this (s) to the last kept one are skipped; 0 = half the '
        "driver's period", range=(0.0, 10.0)))
    joint_states_topic: str = field(default='joint_states', metadata=meta(
        'sensor_msgs/JointState input'))
    command_topic: str = field(default='', metadata=meta(
        "std_msgs/Float64MultiArray commands; '' = /<controller_name>/commands"))
    mocap_bodies: tuple[str, ...] = field(default=(), metadata=meta(
        'links with motion-capture poses on <mocap_topic_prefix>/<link>'))
    mocap_topic_prefix: str = field(default='mocap', metadata=meta('mocap topic prefix'))
    model_file: str = field(default='', metadata=meta(
        MODEL_FILE_DESCRIPTION + '; the nominal model (prior, reset) of the refits'))
    save_directory: str = field(default='', metadata=meta(
        "where ~/save writes the URDF and parameter YAML; '' = ./diffsim_identified"))
    diagnostics_period: float = field(default=1.0, metadata=meta(
        'seconds between /diagnostics messages', range=(0.0, 3600.0)))
    memory_segments: int = field(default=4, metadata=meta(
        'past cells of data kept beyond the window for their information about the base '
        'parameters (a robot holding still must not make refits forget); 0 = window only',
        range=(0, 1000)))
    memory_segment: float = field(default=1.0, metadata=meta('memory cell length, s',
                                                             range=(0.0, 3600.0)))
    memory_max_age: float = field(default=120.0, metadata=meta(
        'memory cells older than this (s) are forgotten (a changed robot, e.g. a new payload, '
        'is then fit on its own data); 0 = never', range=(0.0, 1000000.0)))
    string_topic: str = field(default='', metadata=meta(
        "cup mode (ball in a cup): the ball's geometry_msgs/PoseStamped (world frame, e.g. "
        'mocap/ball), gated by string_gate.*; the string is refit beside the arm (string.*) '
        "and joins ~/parameters as string/<name>; '' = no cup"))
    string_length: float = field(default=0.40, metadata=meta(
        "cup mode: the string's nominal length, m (the first fit's start)",
        range=(0.01, 10.0)))
    refit_process: bool = field(default=True, metadata=meta(
        'run each fit in a child process, so that it never holds the lock of the '
        'interpreter taking joint_states (False: on a thread of this process)'))

    def __post_init__(self) -> None:
        """Validate choices and ranges."""
        if self.estimator not in PHYSICAL_ESTIMATORS or self.estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be 'nea', 'diffnea' or 'svgd' (a physical model "
                             f'the node can publish as URDF), got {self.estimator!r}')
        if self.velocity_source not in ('auto', 'message', 'differentiate'):
            raise ValueError("velocity_source must be 'auto', 'message' or 'differentiate', "
                             f'got {self.velocity_source!r}')
        for name in ('refit_period', 'window', 'min_window', 'derivative_cutoff_hz',
                     'diagnostics_period'):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise ValueError(f'{name} must be > 0, got {getattr(self, name)!r}')
        if not 0.0 < self.holdout_fraction < 1.0:
            raise ValueError(f'holdout_fraction must be in (0, 1), got {self.holdout_fraction}')
        if not math.isfinite(self.limit_margin):
            raise ValueError(f'limit_margin must be finite, got {self.limit_margin!r}')
        if self.memory_segments < 0:
            raise ValueError(f'memory_segments must be >= 0, got {self.memory_segments}')
        if self.prediction_steps < 1:
            raise ValueError(f'prediction_steps must be >= 1, got {self.prediction_steps}')
        if not (math.isfinite(self.max_unexplained) and self.max_unexplained > 0):
            raise ValueError(f'max_unexplained must be > 0, got {self.max_unexplained!r}')
        for name in ('memory_segment',):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise ValueError(f'{name} must be > 0, got {getattr(self, name)!r}')
        for name in ('min_improvement', 'min_sample_interval', 'memory_max_age'):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise ValueError(f'{name} must be >= 0, got {getattr(self, name)!r}')
        if self.min_window > self.window:
            raise ValueError(f'min_window ({self.min_window}) exceeds window ({self.window})')

    def online(self, estimator_config) -> OnlineConfig:
        """
        Return the engine's options (the same engine as ``control/adaptive.py``).

        :param estimator_config: the estimator's configuration object.
        :return: the :class:`~diffsim_ros.sysid.online.OnlineConfig`.
        """
        return OnlineConfig(
            estimator=self.estimator, estimator_config=estimator_config, window=self.window,
            min_window=self.min_window, holdout_fraction=self.holdout_fraction,
            prediction_steps=self.prediction_steps, accept_margin=self.min_improvement,
            velocity_source=self.velocity_source,
            derivative_cutoff_hz=self.derivative_cutoff_hz, limit_margin=self.limit_margin,
            memory_segments=self.memory_segments, memory_segment=self.memory_segment,
            memory_max_age=self.memory_max_age or math.inf,
            max_unexplained=self.max_unexplained,
            execution='process' if self.refit_process else 'inline')


def engine_options(robot: str, overrides: Optional[Mapping[str, Any]] = None,
                   simulated: bool = False) -> Tuple[OnlineConfig, float]:
    """
    Return the engine options and refit period the identifier node runs with for a robot.

    Without a node: ``config/<robot>.yaml`` (its ``identifier`` section), then ``overrides``.

    ``diffsim-sim-eval --controller adaptive-mpc`` runs the engine with them, so that it
    measures the loop the identifier runs on the robot.

    :param robot: catalog robot name.
    :param overrides: parameter values by name (``{'estimator': 'nea', 'nea.source': 'u'}``).
    :param simulated: time is simulated and a refit holds it (as in lockstep): the
        estimator's wall-clock budget (``max_seconds``), which would make results depend on
        the machine's speed, is lifted, and fits run in place.
    :return: ``(OnlineConfig, refit_period in s)``.
    :raises ParameterError: a value the node would refuse.
    """
    params = {**load_yaml_params(config_path(robot), 'identifier'), **dict(overrides or {})}
    config = build_config(IdentifierConfig, params)
    _, config_cls = ESTIMATORS[config.estimator]
    estimator = complete_estimator(
        build_config(config_cls, params, f'{config.estimator}.', skip_unsupported=True), robot,
        simulated)
    online = config.online(estimator)
    if simulated:
        online = dataclasses.replace(online, execution='inline')
    return online, config.refit_period


def complete_estimator(estimator: Any, robot: str, simulated: bool = False) -> Any:
    """
    Return an estimator configuration with what the node leaves to the robot filled in.

    :param estimator: the estimator's configuration object, as the parameters give it.
    :param robot: catalog robot name: commands drive its command joints unless the
        configuration names them.
    :param simulated: lift the wall-clock budget ``max_seconds`` (see :func:`engine_options`).
    :return: the configuration (the same object when nothing changes).
    """
    changes = {}
    if not estimator.command_joints:
        changes['command_joints'] = list(robots.get(robot).command_joints)
    if simulated and getattr(estimator, 'max_seconds', 0.0):
        changes['max_seconds'] = 0.0
    if not changes:
        return estimator
    return type(estimator).from_dict({**estimator.to_dict(), **changes})
