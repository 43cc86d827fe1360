"""
Evaluation, figures and files of an offline identification (what ``diffsim-fit`` writes).

* :class:`Predictor` wraps a fitted (or nominal) model as ``(q, qd, u) -> qdd`` and, for
  physical models, ``(q, qd, u) -> applied joint torque``;
* :func:`torque_metrics`, :func:`acceleration_metrics` and :func:`rollout_study` measure
  it on trajectories (per joint, normalised by the data's variances);
* :func:`predictors` and :func:`evaluate` apply them to an
  :class:`~diffsim_ros.sysid.result.IdentificationResult` and to the nominal model;
* :func:`parameter_table` and :func:`export_urdf` give the named parameters with their
  nominal values and the URDF of a fit;
* :func:`write_params_yaml` and :func:`write_metrics_json` write ``params.yaml`` and
  ``metrics.json``; :mod:`diffsim_ros.io.report_figure` draws ``report.png``.

Normalised errors (NMSE) are ``mean(e^2) / var`` per column, so 1 means "explains none of
the signal" and 0 a perfect fit.  The inverse-dynamics residual of a physical model is
``e = tau_applied(q, qd, u) - rnea(q, qd, qdd)`` (motor model and friction on the left), its
variance scale per joint is the larger of the variances of both sides computed with a
reference model (the nominal one, so that every fit is measured on the same scale; a fit's own
torques would make a passive joint's scale vanish).  Rollouts start from the measured state at
the start of each window and hold the measured commands; their NMSE is averaged over every
step and state coordinate (angle errors of revolute joints wrapped), normalised by the
variances of the measured positions and velocities.

URDF export (:func:`export_urdf`): when least squares (NEA) leaves bodies physically
inconsistent, the URDF holds the consistent model that reproduces its base parameters best
(:func:`consistent_base_fit`); otherwise inconsistent bodies are projected onto nearby
consistent ones (:func:`nearest_consistent`) or, failing that, reset to their nominal inertia;
negative damping / Coulomb levels are clipped to zero, and the viscous / Coulomb levels of a
Stribeck module are added to the URDF's damping / friction; the returned description lists
each change.  A black-box fit has no physical parameters: its URDF is the nominal one.
"""

from dataclasses import dataclass
import json
import math
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import yaml

from .urdf_export import model_to_urdf
from ..core.actuators import make_friction
from ..core.dispatch import aba, rnea
from ..core.errors import URDFError
from ..core.model import RobotModel
from ..core.parameterization import (inertial_from_pseudo_inertia, is_physically_consistent,
                                     make_parameterization, pseudo_inertia,
                                     regularize_inertial)
from ..sysid.dataset import Trajectory
from ..sysid.losses import (command_matrix, integrate, make_actuator, make_torque_fn,
                            sample_interval, stack_samples, state_scale, variance_scale,
                            wrap_angle_error)
from ..sysid.nea import RegressorColumns
from ..sysid.result import IdentificationResult, inertial_parameters, joint_parameters

__all__ = ['Predictor', 'ROLLOUT_HORIZONS', 'acceleration_metrics', 'consistent_base_fit',
           'evaluate', 'export_urdf', 'jsonable', 'nearest_consistent', 'nominal_actuator',
           'nominal_values', 'parameter_table', 'physical_predictor', 'predictors',
           'rollout_study', 'score', 'stribeck_levels', 'torque_metrics', 'write_metrics_json',
           'write_params_yaml']

Tensor = torch.Tensor
PathLike = Union[str, Path]
SignalFn = Callable[[Tensor, Tensor, Tensor], Tensor]

#: Default rollout horizons of the metrics, s (``diffsim-fit --horizons``).
ROLLOUT_HORIZONS = (0.5, 1.0)


@dataclass(frozen=True)
class Predictor:
    """
    A forward model to evaluate.

    :param label: name in the figure legend and the metrics (``'identified'``, ``'nominal'``).
    :param model: the robot model (joint order, revolute mask, RNEA for torque metrics).
    :param accel: ``(q (..., n), qd (..., n), u (..., m)) -> qdd (..., n)``.
    :param torque: ``(q, qd, u) -> net applied joint torque (..., n)``, ``None`` for black
        boxes (no torque metrics).
    :param drive: ``(q, qd, u) -> the actuators' joint torque before friction (..., n)``
        (``B u`` for torque inputs, the motor model's torque for voltages), ``None`` for black
        boxes; the report draws the nominal model's as the measured torque.
    """

    label: str
    model: RobotModel
    accel: SignalFn
    torque: Optional[SignalFn] = None
    drive: Optional[SignalFn] = None


def physical_predictor(label: str, model: RobotModel, command_joints: Sequence[str],
                       actuator: Optional[torch.nn.Module] = None,
                       friction: Optional[torch.nn.Module] = None,
                       coulomb_eps: float = 1e-2) -> Predictor:
    """
    Return the predictor of a rigid-body model with its actuator and friction.

    :param label: legend name.
    :param model: unbatched robot model (damping / Coulomb fields used).
    :param command_joints: joints driven by the input columns, in column order.
    :param actuator: module ``(u, qd_commanded) -> tau`` or ``None`` (inputs are torques).
    :param friction: extra friction module or ``None``.
    :param coulomb_eps: smoothing velocity of ``friction tanh(qd / eps)``.
    :return: the predictor.
    """
    B = command_matrix(model, command_joints)
    torque = make_torque_fn(model, B, actuator, friction, coulomb_eps)
    frictionless = model.replace(damping=torch.zeros_like(model.damping),
                                 friction=torch.zeros_like(model.friction))
    drive = make_torque_fn(frictionless, B, actuator, None, coulomb_eps)

    def accel(q: Tensor, qd: Tensor, u: Tensor) -> Tensor:
        return aba(model, q, qd, torque(q, qd, u))
    return Predictor(label=label, model=model, accel=accel, torque=torque, drive=drive)


def _per_joint(values: Tensor, joints: Sequence[str]) -> Dict[str, Optional[float]]:
    return {joint: _finite(float(v)) for joint, v in zip(joints, values.tolist())}


def _finite(value: float) -> Optional[float]:
    return value if math.isfinite(value) else None


def _error_summary(error: Tensor, scale: Tensor, joints: Sequence[str]) -> Dict[str, Any]:
    mse = error.square().mean(0)
    nmse = mse / scale
    return {'rmse': _per_joint(mse.sqrt(), joints), 'mse': _per_joint(mse, joints),
            'mse_sum': _finite(float(mse.sum())), 'nmse': _per_joint(nmse, joints),
            'nmse_mean': _finite(float(nmse.mean())), 'samples': int(error.shape[0])}


def torque_metrics(predictor: Predictor, runs: Sequence[Trajectory], source: str,
                   reference: Optional[Predictor] = None) -> Optional[Dict[str, Any]]:
    """
    Return the inverse-dynamics residual per joint (see the module docstring).

    :param predictor: a physical predictor (``torque`` set).
    :param runs: trajectories with ``qdd``.
    :param source: input signal, ``'tau'`` or ``'u'``.
    :param reference: predictor whose applied and rigid-body torques give the variance scale
        (default: ``predictor``); pass the nominal model so that fits are compared on one
        scale, which for a passive joint is not the fit's own (near-zero) torque.
    :return: ``{'rmse': {joint: N m}, 'nmse': {joint: -}, 'nmse_mean', 'samples'}``, or
        ``None`` without runs, accelerations or a torque model.
    """
    if predictor.torque is None or not runs:
        return None
    reference = reference if reference is not None and reference.torque is not None \
        else predictor
    model = predictor.model
    with torch.no_grad():
        batch = stack_samples(runs, model, source, need_qdd=False)
        if batch.qdd is None:
            return None
        applied = predictor.torque(batch.q, batch.qd, batch.u)
        rigid = rnea(model, batch.q, batch.qd, batch.qdd)
        scale = torch.maximum(
            variance_scale(reference.torque(batch.q, batch.qd, batch.u)),
            variance_scale(rnea(reference.model, batch.q, batch.qd, batch.qdd)))
        return _error_summary(applied - rigid, scale, model.joint_names)


def acceleration_metrics(predictor: Predictor, runs: Sequence[Trajectory],
                         source: str) -> Optional[Dict[str, Any]]:
    """
    Return the one-step forward-dynamics error per joint.

    :param predictor: the predictor.
    :param runs: trajectories with ``qdd``.
    :param source: input signal, ``'tau'`` or ``'u'``.
    :return: ``{'rmse': {joint: rad/s^2}, 'nmse': {joint: -}, 'nmse_mean', 'samples'}``, or
        ``None`` without runs or accelerations.
    """
    if not runs:
        return None
    model = predictor.model
    with torch.no_grad():
        batch = stack_samples(runs, model, source, need_qdd=False)
        if batch.qdd is None:
            return None
        error = predictor.accel(batch.q, batch.qd, batch.u) - batch.qdd
        return _error_summary(error, variance_scale(batch.qdd), model.joint_names)


def _wrap_mask(model: RobotModel) -> Tensor:
    return model.tree.revolute_mask.to(dtype=model.dtype, device=model.device)


def _padded_windows(runs: Sequence[Trajectory], model: RobotModel, source: str, steps: int,
                    stride: int) -> Dict[str, Tensor]:
    """
    Cut runs into windows of ``steps`` steps starting every ``stride`` samples.

    Windows that run past the end of their run are padded (last command held, last state as
    target) and their padded steps marked invalid, so that every window of every run shares
    one batched rollout.
    """
    parts: Dict[str, List[Tensor]] = {'x0': [], 'controls': [], 'targets': [], 'valid': [],
                                      'times': [], 'run': []}
    for index, traj in enumerate(runs):
        run = traj.reorder(model.joint_names) if tuple(traj.joint_names) != \
            tuple(model.joint_names) else traj
        run = run.to(dtype=model.dtype, device=model.device)
        length = len(run)
        if length < 2:
            continue
        x = torch.cat((run.q, run.qd), -1)
        signal = getattr(run, source)
        starts = torch.arange(0, length - 1, stride, device=model.device)
        offsets = torch.arange(steps + 1, device=model.device)
        index_matrix = starts[:, None] + offsets[None, :]                 # (W, steps + 1)
        clamped = index_matrix.clamp_max(length - 1)
        parts['x0'].append(x[starts])
        parts['targets'].append(x[clamped[:, 1:]])
        parts['controls'].append(signal[clamped[:, :-1]])
        parts['valid'].append(index_matrix[:, 1:] < length)
        t = run.t
        step = float(t.diff().median())
        parts['times'].append(t[starts][:, None] + step * offsets[None, :].to(t.dtype))
        parts['run'].append(torch.full((len(starts),), index, device=model.device))
    return {key: torch.cat(value) for key, value in parts.items()} if parts['x0'] else {}


def rollout_study(predictor: Predictor, runs: Sequence[Trajectory], source: str,
                  horizons_s: Sequence[float] = ROLLOUT_HORIZONS
                  ) -> Tuple[Dict[str, Dict[str, Any]], Optional[Dict[str, Any]]]:
    """
    Measure multi-step predictions, and return every simulated window for the report.

    One batched RK4 rollout of the longest horizon starts from the measured state every
    ``min(horizons_s)`` seconds of every run, holding the measured commands.  For each horizon
    the error of the windows that stay inside their run is averaged over the horizon's steps
    (see the module docstring).  The predicted positions of every window are returned for the
    figure (:mod:`diffsim_ros.io.report_figure`).

    :param predictor: the predictor.
    :param runs: uniformly sampled trajectories (validation runs).
    :param source: input signal, ``'tau'`` or ``'u'``.
    :param horizons_s: horizons, s.
    :return: ``({'<h>s': {'horizon_s', 'steps', 'windows', 'nmse', 'q_rmse': {joint: error at
        the horizon}, 'diverged'}}, traces or None)``; a horizon that no run is long enough
        for has ``nmse`` ``None`` and a ``note``.  ``traces``: ``{'t': (W, H + 1) s, 'q':
        (W, H + 1, n) predicted positions (NaN past the end of the window's run), 'run': (W,)
        index into ``runs``, 'stride': steps between window starts, 'steps': {'<h>s': steps of
        that horizon}}``, numpy arrays.
    :raises ValueError: non-uniformly sampled runs (resample them first).
    """
    horizons_s = sorted(horizons_s)
    metrics = {f'{h:g}s': {'horizon_s': h, 'windows': 0, 'nmse': None} for h in horizons_s}
    if not runs:
        for entry in metrics.values():
            entry['note'] = 'no validation runs'
        return metrics, None
    model = predictor.model
    dt = sample_interval(runs)
    steps = [max(1, int(round(h / dt))) for h in horizons_s]
    windows = _padded_windows(runs, model, source, steps[-1], steps[0])
    if not windows:
        return metrics, None
    with torch.no_grad():
        states = integrate(predictor.accel, windows['x0'], windows['controls'], dt, 'rk4')
        batch = stack_samples(runs, model, source, need_qdd=False)
        mask = _wrap_mask(model)
        scale = state_scale(batch.q, batch.qd, mask)
        error = wrap_angle_error(states[:, 1:] - windows['targets'], mask)
        squared = error.square() / scale
    longest = max(run.duration for run in runs)
    for h, k in zip(horizons_s, steps):
        entry = metrics[f'{h:g}s']
        inside = windows['valid'][:, k - 1]
        if not bool(inside.any()):
            entry['note'] = f'no validation run is {h:g} s long (longest: {longest:.3g} s)'
            continue
        nmse = float(squared[inside, :k].mean())
        end = error[inside, k - 1, :model.n]
        entry.update({'steps': k, 'windows': int(inside.sum()),
                      'diverged': not math.isfinite(nmse), 'nmse': _finite(nmse),
                      'q_rmse': _per_joint(end.square().mean(0).sqrt(), model.joint_names)})
    positions = states[..., :model.n]
    inside = torch.cat((torch.ones_like(windows['valid'][:, :1]), windows['valid']), -1)
    positions = torch.where(inside[..., None], positions, torch.full_like(positions, math.nan))
    traces = {'t': windows['times'].detach().cpu().double().numpy(),
              'q': positions.detach().cpu().double().numpy(),
              'run': windows['run'].detach().cpu().numpy(), 'stride': steps[0],
              'steps': {f'{h:g}s': k for h, k in zip(horizons_s, steps)}}
    return metrics, traces


# --------------------------------------------------------------------------------------
# Fitted and nominal predictors
# --------------------------------------------------------------------------------------
def nominal_actuator(config: Any, m: int, model: RobotModel) -> Optional[torch.nn.Module]:
    """
    Return the estimator's configured actuator at its nominal constants (``None``: torques).

    :param config: estimator config (``actuator`` and ``actuator_kwargs`` when it has them).
    :param m: number of command columns.
    :param model: gives dtype and device.
    :return: the module or ``None``.
    """
    name = getattr(config, 'actuator', 'none')
    return make_actuator(name, m, getattr(config, 'actuator_kwargs', None), model.dtype,
                         model.device)


def predictors(result: IdentificationResult, nominal: RobotModel, config: Any,
               motor: Optional[Tuple[str, Mapping[str, Any]]] = None
               ) -> Tuple[Predictor, Predictor]:
    """
    Return the predictors of the identified and of the nominal model.

    :param result: the fit.
    :param nominal: the nominal model (device and dtype of the evaluation).
    :param config: the estimator config (actuator of NEA, Coulomb smoothing).
    :param motor: ``(actuator name, kwargs)`` of the robot's motor, used by the nominal model
        when the config has no actuator (the black box learns the motor with the rest).
    :return: ``(identified, nominal)``.
    """
    joints = result.command_joints or nominal.joint_names
    m = len(joints)
    eps = float(getattr(config, 'coulomb_eps', result.coulomb_eps))
    base_actuator = nominal_actuator(config, m, nominal)
    if base_actuator is None and motor is not None:
        base_actuator = make_actuator(motor[0], m, motor[1], nominal.dtype, nominal.device)
    base = physical_predictor('nominal', nominal, joints, base_actuator, None, eps)
    if result.network is not None:
        network = result.network.to(dtype=nominal.dtype, device=nominal.device)
        fitted = Predictor(label=f'identified ({result.method})', model=nominal,
                           accel=lambda q, qd, u: network(q, qd, u))
        return fitted, base
    model = result.model.to(dtype=nominal.dtype, device=nominal.device)
    actuator = result.actuator if result.actuator is not None else \
        nominal_actuator(config, m, model)
    if actuator is not None:
        actuator = actuator.to(dtype=nominal.dtype, device=nominal.device)
    friction = result.friction.to(dtype=nominal.dtype, device=nominal.device) \
        if result.friction is not None else None
    fitted = physical_predictor(f'identified ({result.method})', model, joints, actuator,
                                friction, result.coulomb_eps)
    return fitted, base


def score(predictor: Predictor, reference: Predictor, train: Sequence[Trajectory],
          validation: Sequence[Trajectory], source: str,
          horizons_s: Sequence[float] = ROLLOUT_HORIZONS
          ) -> Tuple[Dict[str, Any], Optional[Dict[str, Any]]]:
    """
    Return the torque, acceleration and rollout metrics of one predictor and its rollouts.

    :param predictor: the model to score.
    :param reference: model giving the torque variance scale (the nominal model).
    :param train: training runs.
    :param validation: validation runs.
    :param source: input signal, ``'tau'`` or ``'u'``.
    :param horizons_s: rollout horizons, s.
    :return: ``({'torque': {'train', 'validation'} or None, 'acceleration': {...},
        'rollout': {...}}, traces)``; the traces (:func:`rollout_study`) are on every
        validation run, or on the first training run without validation runs.
    """
    rollout, segments = rollout_study(predictor, validation, source, horizons_s)
    if not validation and train:
        _, segments = rollout_study(predictor, train[:1], source, horizons_s)
    section = {
        'torque': None if predictor.torque is None else {
            'train': torque_metrics(predictor, train, source, reference),
            'validation': torque_metrics(predictor, validation, source, reference)},
        'acceleration': {'train': acceleration_metrics(predictor, train, source),
                         'validation': acceleration_metrics(predictor, validation, source)},
        'rollout': rollout,
    }
    return section, segments


def evaluate(fitted: Predictor, base: Predictor, train: Sequence[Trajectory],
             validation: Sequence[Trajectory], source: str,
             horizons_s: Sequence[float] = ROLLOUT_HORIZONS
             ) -> Tuple[Dict[str, Any], Dict[str, Dict[str, Any]]]:
    """
    Return the metrics of the fit and of the nominal model, and the figure's predictions.

    :param fitted: identified model.
    :param base: nominal model.
    :param train: training runs.
    :param validation: validation runs.
    :param source: input signal, ``'tau'`` or ``'u'``.
    :param horizons_s: rollout horizons, s.
    :return: ``({'torque', 'acceleration', 'rollout', 'nominal': {the same}}, {label:
        traces})`` (see :func:`score`).
    """
    out, fitted_segments = score(fitted, base, train, validation, source, horizons_s)
    out['nominal'], base_segments = score(base, base, train, validation, source, horizons_s)
    curves = {}
    for predictor, segments in ((fitted, fitted_segments), (base, base_segments)):
        if segments is not None:
            curves[predictor.label] = segments
    return out, curves


# --------------------------------------------------------------------------------------
# Parameters and URDF
# --------------------------------------------------------------------------------------
def nominal_values(result: IdentificationResult, nominal: RobotModel,
                   config: Any) -> Dict[str, Optional[float]]:
    """
    Return the nominal value of each named parameter of the result (``None`` when unknown).

    :param result: the fit.
    :param nominal: nominal model (CPU, float64).
    :param config: the estimator config.
    :return: ``{name: value}``.
    """
    values: Dict[str, Optional[float]] = {
        name: value for name, (value, _) in inertial_parameters(nominal).items()}
    for kind, field in (('damping', 'damping'), ('coulomb', 'friction'),
                        ('armature', 'armature')):
        values.update({name: value for name, (value, _)
                       in joint_parameters(nominal, kind, getattr(nominal, field)).items()})
    for i, joint in enumerate(nominal.joint_names):
        values[f'{joint}/offset'] = 0.0
        for k, axis in enumerate(('x', 'y', 'z')):
            values[f'{joint}/origin_{axis}'] = float(nominal.origin_xyz[i, k])
        for k, axis in enumerate(('roll', 'pitch', 'yaw')):
            values[f'{joint}/origin_{axis}'] = float(nominal.origin_rpy[i, k])
    joints = result.command_joints or nominal.joint_names
    motor = nominal_actuator(config, len(joints), nominal)
    if motor is not None and hasattr(motor, 'motor_constant'):
        with torch.no_grad():
            constants = motor.motor_constant.detach().reshape(-1).tolist()
            resistances = motor.resistance.detach().reshape(-1).tolist()
        for k, joint in enumerate(joints):
            values[f'{joint}/motor_constant'] = constants[k]
            values[f'{joint}/resistance'] = resistances[k]
    name = getattr(config, 'friction_model', 'none')
    if name in ('viscous', 'coulomb', 'stribeck', 'sigmoid'):   # analytic: .coefficients
        kwargs = {**dict(getattr(config, 'friction_kwargs', None) or {}),
                  'dtype': nominal.dtype}
        start = make_friction(name, nominal.n, **kwargs)
        for key, tensor in start.coefficients.items():
            kind = 'viscous' if key == 'damping' else key
            for i, joint in enumerate(nominal.joint_names):
                values[f'{joint}/friction_{kind}'] = float(tensor.detach().reshape(-1)[i])
    matrix = result.state.get('base_matrix')
    if matrix is not None and result.method == 'nea':
        columns = RegressorColumns(friction=tuple(config.friction), armature=config.armature,
                                   coulomb=config.coulomb, coulomb_eps=config.coulomb_eps)
        phi = columns.vector(nominal).detach().double().cpu()
        if matrix.shape[-1] == phi.shape[0]:
            for k, value in enumerate((matrix.double().cpu() @ phi).tolist()):
                values[f'base/{k}'] = value
    return values


def parameter_table(result: IdentificationResult, nominal: RobotModel,
                    config: Any) -> Dict[str, Dict[str, Any]]:
    """
    Return ``{name: {'value', 'unit', 'nominal'[, 'std'][, 'expression']}}`` of the result.

    :param result: the fit.
    :param nominal: nominal model (CPU, float64).
    :param config: the estimator config.
    :return: the table, in the estimator's order.
    """
    nominals = nominal_values(result, nominal, config)
    expressions = list(result.metrics.get('base_expressions', ()))
    table = {}
    for name, (value, unit) in result.parameters.items():
        entry: Dict[str, Any] = {'value': float(value), 'unit': unit,
                                 'nominal': nominals.get(name)}
        if name in result.std:
            entry['std'] = float(result.std[name])
        if name.startswith('base/'):
            index = int(name.split('/')[1])
            if index < len(expressions):
                entry['expression'] = expressions[index]
        table[name] = entry
    return table


def stribeck_levels(friction: Optional[torch.nn.Module],
                    n: int) -> Optional[Tuple[Tensor, Tensor]]:
    """
    Return the viscous and Coulomb levels of a Stribeck friction module.

    :param friction: a module with ``coefficients`` (``viscous``, ``coulomb``, ...), or any
        other module / ``None``.
    :param n: number of joints.
    :return: ``(viscous (n,), coulomb (n,))`` float64 CPU tensors, or ``None`` for modules
        without such coefficients (neural networks).
    """
    coefficients = getattr(friction, 'coefficients', None)
    if not isinstance(coefficients, Mapping) or 'viscous' not in coefficients:
        return None
    viscous = coefficients['viscous'].detach().double().cpu().reshape(-1)[:n]
    coulomb = coefficients.get('coulomb', torch.zeros(n)).detach().double().cpu().reshape(-1)
    return viscous, coulomb[:n]


def nearest_consistent(pi: Tensor, margin: float = 1e-6) -> Tensor:
    """
    Return a physically consistent body close to ``pi``.

    The pseudo-inertia's eigenvalues are raised to at least ``margin`` times the largest one
    (the nearest positive-definite matrix in the Frobenius norm, with a margin), which keeps
    the consistent part of an estimate and changes only its infeasible directions.

    :param pi: inertial parameters ``(10,)`` (possibly inconsistent).
    :param margin: relative floor of the eigenvalues, > 0.
    :return: ``(10,)`` consistent parameters (unless ``pi`` has no positive eigenvalue).
    """
    J = pseudo_inertia(pi.to(torch.float64))
    values, vectors = torch.linalg.eigh(0.5 * (J + J.mT))
    floor = margin * values.abs().max()
    values = values.clamp_min(float(floor))
    return inertial_from_pseudo_inertia((vectors * values) @ vectors.mT).to(pi)


def consistent_base_fit(result: IdentificationResult, nominal: RobotModel, config: Any,
                        iterations: int = 300) -> Optional[Tensor]:
    """
    Return consistent inertials that reproduce a least-squares fit's base parameters.

    Minimises ``(beta(pi) - beta)^T C^+ (beta(pi) - beta)`` over physically consistent ``pi``
    (log-Cholesky parameterization, started at the nominal bodies), with ``beta`` the
    identified base parameters, ``C`` their covariance and the joint-level terms of the fit
    held fixed: the consistent model whose torque predictions on the data are closest to the
    least-squares ones.  A tiny pull toward the nominal model fixes the unidentifiable
    directions.

    :param result: an NEA result (``state`` holds ``base_matrix``, ``base_values``,
        ``base_covariance`` and ``phi``).
    :param nominal: the nominal model.
    :param config: the NEA config (unused beyond validation of the layout).
    :param iterations: L-BFGS iterations.
    :return: ``(n, 10)`` consistent inertials (dtype / device of ``nominal``), or ``None`` when
        the result lacks that state or the optimisation fails.
    """
    needed = ('base_matrix', 'base_values', 'base_covariance', 'phi')
    if any(key not in result.state for key in needed) or not hasattr(config, 'friction'):
        return None
    matrix, beta, covariance, phi = (result.state[key].detach().double().cpu()
                                     for key in needed)
    size = 10 * nominal.n
    if matrix.shape[-1] != phi.shape[0] or phi.shape[0] < size:
        return None
    target = beta - matrix[:, size:] @ phi[size:]
    A = matrix[:, :size]
    information = torch.linalg.pinv(covariance, hermitian=True)
    parameterization = make_parameterization('log_cholesky')
    start = nominal.inertial.detach().double().cpu()
    degenerate = ~is_physically_consistent(start)
    start = torch.where(degenerate[:, None], regularize_inertial(start, 1e-4), start)
    if not bool(is_physically_consistent(start).all()):
        return None
    theta = parameterization.from_inertial(start)
    z = torch.zeros_like(theta, requires_grad=True)

    def distance() -> Tensor:
        gap = A @ parameterization.to_inertial(theta + z).reshape(-1) - target
        return gap @ information @ gap

    with torch.no_grad():
        first = float(distance())
    if not math.isfinite(first) or first <= 0:
        return None
    optimizer = torch.optim.LBFGS([z], lr=1.0, max_iter=iterations, history_size=50,
                                  line_search_fn='strong_wolfe', tolerance_grad=1e-12,
                                  tolerance_change=1e-16)

    def closure() -> Tensor:
        optimizer.zero_grad()
        value = distance() / first + 1e-8 * z.square().mean()
        value.backward()
        return value
    optimizer.step(closure)
    with torch.no_grad():
        pi = parameterization.to_inertial(theta + z)
        if not (bool(torch.isfinite(pi).all()) and bool(is_physically_consistent(pi).all())
                and float(distance()) < first):
            return None
    return pi.to(dtype=nominal.dtype, device=nominal.device)


def export_urdf(result: IdentificationResult, nominal: RobotModel,
                config: Any = None) -> Tuple[str, Dict[str, Any]]:
    """
    Return the URDF of the fit and a description of what it holds.

    :param result: the fit.
    :param nominal: nominal model (CPU, float64, with its source URDF).
    :param config: the estimator config (NEA: enables :func:`consistent_base_fit` for
        inconsistent bodies).
    :return: ``(URDF text, {'source', 'notes', ...})``.
    """
    info: Dict[str, Any] = {'source': 'identified', 'notes': []}
    if result.network is not None or result.model is None:
        info['source'] = 'nominal'
        info['notes'].append('the ffnn black box has no physical parameters: model.urdf is '
                             'the nominal URDF')
        try:
            return model_to_urdf(nominal), info
        except URDFError:
            return nominal.urdf, info
    model = result.model.to(dtype=torch.float64, device='cpu')
    levels = stribeck_levels(result.friction, model.n)
    if levels is not None:
        model = model.replace(damping=model.damping + levels[0],
                              friction=model.friction + levels[1])
        info['notes'].append('Stribeck viscous and Coulomb levels are added to <dynamics '
                             'damping friction>; static friction and Stribeck velocity are '
                             'only in params.yaml')
    elif result.friction is not None:
        info['notes'].append('the neural friction model is not expressible in URDF: '
                             'model.urdf holds the analytic damping and Coulomb terms, the '
                             'network is in modules.pt')
    pairs = zip(model.joint_names, model.damping.tolist(), model.friction.tolist())
    negative = [joint for joint, d, f in pairs if d < 0 or f < 0]
    if negative:
        model = model.replace(damping=model.damping.clamp_min(0.0),
                              friction=model.friction.clamp_min(0.0))
        info['clipped_friction_joints'] = negative
        info['notes'].append(f'negative damping / friction clipped to 0 at {negative}')
    pi = model.inertial.clone()
    if not bool(is_physically_consistent(pi).all()) and config is not None:
        refit = consistent_base_fit(result, nominal, config)
        if refit is not None:
            model = model.replace(inertial=refit)
            info['consistent_refit'] = True
            info['notes'].append('physically inconsistent identified bodies: model.urdf holds '
                                 'the consistent model closest to the identified base '
                                 'parameters (Mahalanobis distance under their covariance)')
            return model_to_urdf(model, source=nominal.urdf), info
    consistent = is_physically_consistent(pi)
    projected, reset = [], []
    for body in torch.nonzero(~consistent).reshape(-1).tolist():
        link = model.tree.body_links[body]
        fixed = nearest_consistent(pi[body])
        if bool(is_physically_consistent(fixed)):
            projected.append(link)
        else:
            fixed = nominal.inertial[body].to(pi)
            reset.append(link)
        pi[body] = fixed
    if projected or reset:
        model = model.replace(inertial=pi)
        info['projected_bodies'], info['nominal_bodies'] = projected, reset
        info['notes'].append(f'physically inconsistent identified bodies: projected onto the '
                             f'nearest consistent ones {projected}, reset to nominal {reset}')
    return model_to_urdf(model, source=nominal.urdf), info


# --------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------
def jsonable(value: Any) -> Any:
    """
    Convert tensors, arrays, tuples, paths and non-finite floats into JSON/YAML-ready values.

    :param value: nested mappings and sequences of plain values, tensors or arrays.
    :return: the same structure with lists, dicts, finite floats (non-finite ones become
        ``None``), ints, bools, strings and ``None`` only.
    """
    if isinstance(value, (Tensor, np.ndarray)):
        value = value.tolist() if isinstance(value, np.ndarray) else \
            value.detach().cpu().tolist()
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, Mapping):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(item) for item in value]
    if isinstance(value, float):
        return _finite(value)
    if isinstance(value, (bool, int, str)) or value is None:
        return value
    if isinstance(value, Path):
        return str(value)
    return str(value)


def write_metrics_json(path: PathLike, metrics: Mapping[str, Any]) -> Path:
    """
    Write metrics as indented JSON (non-finite numbers become ``null``).

    :param path: the file.
    :param metrics: nested mapping.
    :return: the path.
    """
    path = Path(path)
    path.write_text(json.dumps(jsonable(metrics), indent=2, allow_nan=False) + '\n',
                    encoding='utf-8')
    return path


def write_params_yaml(path: PathLike, header: Mapping[str, Any],
                      parameters: Mapping[str, Mapping[str, Any]]) -> Path:
    """
    Write ``params.yaml``: a header (method, robot, data, joints, ...) then the parameters.

    :param path: the file.
    :param header: top-level keys written first, in order.
    :param parameters: ``{name: {'value', 'unit', 'nominal'[, 'std', ...]}}``.
    :return: the path.
    """
    document = dict(jsonable(header))
    document['parameters'] = jsonable(parameters)
    text = yaml.safe_dump(document, sort_keys=False, default_flow_style=None, width=99,
                          allow_unicode=True)
    path = Path(path)
    path.write_text('# Identified by diffsim-fit (diffsim_ros); units per entry.\n' + text,
                    encoding='utf-8')
    return path
