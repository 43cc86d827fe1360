"""
The estimator of ``diffsim-fit``: its configuration, the excitation check and the fit.

Robot defaults < ``--config FILE`` < command-line flags (:func:`estimator_config`); DiffNEA's
default is :func:`diffsim_ros.sysid.diffnea.simulation_schedule`.
"""

import argparse
import inspect
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
import yaml

from .fit_inputs import check_file, needs_commands, sample_rate
from .fit_options import EXIT_NOT_EXCITED, reported, UsageError
from .loss_options import apply_loss, horizon_steps
from .progress import Progress
from .. import robots
from ..core.model import RobotModel
from ..sysid import estimators
from ..sysid.dataset import Trajectory
from ..sysid.diffnea import DiffNEAConfig, simulation_schedule
from ..sysid.excitation import Excitation, excitation
from ..sysid.nea import RegressorColumns
from ..sysid.result import IdentificationResult


# --------------------------------------------------------------------------------------
# Estimator configuration


# --------------------------------------------------------------------------------------
def _read_config(path: Optional[Path]) -> Dict[str, Any]:
    if path is None:
        return {}
    if path.exists() and not path.is_dir():
        check_file(path, '--config')
    with reported(f'cannot read --config {str(path)!r}', OSError, UnicodeDecodeError):
        text = path.read_text(encoding='utf-8')
    with reported(f'--config {str(path)!r} is not valid YAML', yaml.YAMLError):
        loaded = yaml.safe_load(text)
    if loaded is None:
        return {}
    if not isinstance(loaded, Mapping):
        raise UsageError(f'--config {str(path)!r} must hold a mapping of estimator keys, '
                         f'got a {type(loaded).__name__}')
    return dict(loaded)


def motor_config(info: robots.RobotInfo) -> Tuple[str, Dict[str, Any]]:
    """
    Return the ``(actuator, actuator_kwargs)`` config of a voltage robot's motor.

    :param info: catalog entry.
    :return: the pair.
    """
    # The catalog is the one source of motor constants (the MuJoCo plant uses it too); the
    # named presets in core.DCMotor follow other references (e.g. Pyrado's efficiencies).
    return 'dc_motor', info.dc_motor_kwargs()


def estimator_config(args: argparse.Namespace, info: Optional[robots.RobotInfo],
                     runs: Sequence[Trajectory],
                     data_set_options: Sequence[str] = ()) -> Tuple[Any, Dict[str, Any]]:
    """
    Build the estimator configuration: robot defaults < ``--config`` < command-line flags.

    :param args: parsed arguments.
    :param info: catalog entry or ``None``.
    :param runs: the runs (whether they carry efforts).
    :param data_set_options: options the data set set (:func:`~diffsim_ros.io.fit_inputs.
        apply_defaults`): a data set's ``--actuator`` yields to a ``--config`` that names
        its friction model.
    :return: ``(frozen config, the mapping it was made from)``.
    :raises UsageError: unknown keys or values, or an ``--actuator`` the method cannot take.
    """
    method = args.method
    mapping = _read_config(args.config)
    if 'actuator' in data_set_options and 'friction_model' in mapping:
        args.actuator = None
    if method != 'ffnn' and needs_commands(info):
        actuator, kwargs = motor_config(info)
        mapping.setdefault('actuator', actuator)
        if kwargs:
            mapping.setdefault('actuator_kwargs', kwargs)
    uses_commands = needs_commands(info) or any(run.tau is None for run in runs)
    if uses_commands and info is not None:
        mapping.setdefault('command_joints', list(info.command_joints))
        mapping.setdefault('source', 'u')
    if args.actuator is not None:
        if method == 'ffnn':
            raise UsageError(f'--actuator {args.actuator}: the ffnn black box has no friction '
                             'model; use --method diffnea or nea')
        if method == 'nea':
            if args.actuator not in ('viscous', 'coulomb'):
                raise UsageError(f'--actuator {args.actuator} needs --method diffnea (nea is '
                                 'linear least squares: viscous, or viscous + Coulomb by '
                                 'default)')
            if args.actuator == 'viscous':
                mapping['friction'] = ['viscous']
        elif args.actuator == 'coulomb':
            mapping['friction_model'] = 'none'   # the estimator's default: the URDF's fields
        elif args.actuator == 'viscous':
            mapping['friction_model'] = 'none'
            mapping['learn'] = [g for g in mapping.get('learn', ('inertial', 'damping'))
                                if g != 'coulomb'] or ['inertial', 'damping']
        else:
            mapping['friction_model'] = args.actuator
            learn = list(mapping.get('learn', ('inertial', 'damping', 'coulomb')))
            mapping['learn'] = learn + ([] if 'friction_model' in learn else ['friction_model'])
    if args.seed is not None:
        mapping['seed'] = args.seed
    single = {'loss', 'stages', 'horizon', 'adam_iterations', 'lbfgs_iterations'}
    if method == 'diffnea' and not single & set(mapping) and runs:
        # Default: inverse fit, then multi-step refinement judged by held-out rollouts (the
        # inverse fit alone simulates the real Quanser robots worse than the catalogue); a
        # config that sets the loss or the budget gets the single stage it describes, and one
        # that names its groups gets those (the motor's back-EMF only when it names none).
        learn = list(mapping.get('learn', DiffNEAConfig.learn))
        if mapping.get('friction_model', 'none') != 'none' and 'friction_model' not in learn:
            learn.append('friction_model')
        motor = 'learn' not in mapping and mapping.get('actuator', 'none') != 'none'
        rate = 1.0 / float(torch.median(torch.diff(runs[0].t)))
        # measured joint torques stay in the refinement's loss (simulation_schedule)
        sensed = info is not None and bool(info.motor.get('torque_sensors')) \
            and not uses_commands
        mapping.update(simulation_schedule(rate, learn, ['actuator'] if motor else [],
                                           torque_weight=1.0 if sensed else 0.0))
    config = _make_config(method, mapping)
    if args.max_iter is not None:
        _apply_max_iter(method, mapping, args.max_iter, config)
        config = _make_config(method, mapping)
    return config, mapping


def _make_config(method: str, mapping: Mapping[str, Any]) -> Any:
    with reported(f'invalid {method} configuration', TypeError, ValueError):
        return estimators.make_config(method, mapping)


def _apply_max_iter(method: str, mapping: Dict[str, Any], limit: int, config: Any) -> None:
    """Bound the iterations of a validated ``config`` in ``mapping``."""
    lbfgs_limit = max(1, limit // 10)
    if method == 'ffnn':
        mapping['iterations'] = limit
    elif method == 'diffnea':
        mapping['adam_iterations'] = limit
        mapping['lbfgs_iterations'] = min(config.lbfgs_iterations, lbfgs_limit)
        if config.stages:
            mapping['stages'] = [
                {**stage.to_dict(), 'adam_iterations': min(stage.adam_iterations, limit),
                 'lbfgs_iterations': min(stage.lbfgs_iterations, lbfgs_limit)}
                for stage in config.stages]


def budget(method: str, config: Any) -> str:
    """
    Describe an estimator's iteration budget for the progress line.

    :param method: estimator name.
    :param config: its config.
    :return: e.g. ``'up to 350 Adam + 20 L-BFGS steps'``.
    """
    if method == 'nea':
        return 'closed-form least squares'
    if method == 'ffnn':
        return f'up to {config.iterations} Adam steps'
    stages = config.schedule()
    adam = sum(s.adam_iterations for s in stages)
    lbfgs = sum(s.lbfgs_iterations for s in stages)
    return f'up to {adam} Adam + {lbfgs} L-BFGS steps'


# --------------------------------------------------------------------------------------
# Fit and evaluation


# --------------------------------------------------------------------------------------
def run_fit(method: str, model: RobotModel, train: List[Trajectory],
            validation: List[Trajectory], config: Any,
            progress: Progress) -> IdentificationResult:
    """
    Run the estimator with the live progress indicator.

    :param method: estimator name.
    :param model: nominal model (on the target device).
    :param train: training runs.
    :param validation: validation runs (may be empty).
    :param config: the estimator's config.
    :param progress: progress output.
    :return: the identification result.
    """
    kwargs = {}
    if 'callback' in inspect.signature(estimators.fit).parameters:
        kwargs['callback'] = progress.update
    progress.begin(f'fitting {method}')
    try:
        return estimators.fit(method, model, train, validation or None, config, **kwargs)
    finally:
        progress.end()


def apply_loss_options(args: argparse.Namespace, config: Any,
                       train: Sequence[Trajectory]) -> Any:
    """
    Return the config with ``--loss`` / ``--horizon`` applied.

    :param args: parsed arguments.
    :param config: the estimator's config.
    :param train: training runs (their sample rate and shortest length).
    :return: the config.
    :raises UsageError: a horizon the runs cannot hold.
    """
    with reported('', ValueError):
        steps = None if args.horizon is None else horizon_steps(
            args.horizon, 1.0 / sample_rate(train[0]), min(len(run) for run in train))
        return apply_loss(args.method, config, args.loss, steps)


def measure_excitation(nominal: RobotModel, train: Sequence[Trajectory], config: Any,
                       max_condition: float, progress: Progress
                       ) -> Tuple[Excitation, Optional[str]]:
    """
    Measure how well the training data excite the dynamics, and warn when they do not.

    The regressor layout is the estimator's when it is NEA, else NEA's default (inertial,
    viscous and Coulomb friction).

    :param nominal: the robot.
    :param train: training runs (with ``qd`` and ``qdd``).
    :param config: the estimator's config.
    :param max_condition: ``--max-condition``.
    :param progress: where the warning goes.
    :return: ``(the measure, the warning or None)``.
    """
    columns = RegressorColumns()
    if hasattr(config, 'friction') and hasattr(config, 'coulomb'):
        columns = RegressorColumns(friction=config.friction, armature=config.armature,
                                   coulomb=config.coulomb, coulomb_eps=config.coulomb_eps)
    measured = excitation(nominal, train, columns)
    condition = measured.condition_number
    progress.stage(f'excitation: condition number {condition:.3g} of the base regressor '
                   f'(rank {measured.rank} of {measured.base_parameters}; at most '
                   f'{max_condition:g} counts as exciting)')
    if condition <= max_condition:
        return measured, None
    warning = (f'the training data do not excite the dynamics: condition number '
               f'{condition:.3g} > --max-condition {max_condition:g}, rank {measured.rank} of '
               f'{measured.base_parameters} base parameters (a robot at rest or at constant '
               'velocity?): the fit cannot determine all of them; '
               f'least excited: {measured.least_excited}; exit status {EXIT_NOT_EXCITED}')
    progress.warn(warning)
    return measured, warning
