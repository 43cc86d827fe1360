"""
``diffsim-fit``: identify a robot's dynamics offline from a recording.

::

    diffsim-fit DATA [--robot NAME|URDF] [--format auto|table|bag|quanser|panda-gaz|dfki]
                [--method nea|diffnea|ffnn] [--loss inverse|forward|multistep --horizon S]
                [--actuator viscous|stribeck|nn-friction|nn-residual] --out DIR
    diffsim-fit TOSSES --object cube|elbow|URDF [--method ccn|...] [--seed N] [--steps N]
                [--validation F] [--limit N] [--topic T] --out DIR

With ``--object`` the command learns a tossed object instead (:mod:`diffsim_ros.io.object_fit`;
inputs in :mod:`diffsim_ros.io.object_data`); what follows is the robot pipeline.

``DATA`` is a rosbag2 recording (directory, ``.mcap`` or ``.db3``) whose
``sensor_msgs/JointState`` messages carry position, velocity and effort (columns matched to
the robot by joint name; ``--topic`` chooses the topic, ``--command-topic`` a
``std_msgs/Float64MultiArray`` command topic), a CSV / NPZ table in the column
specification of :mod:`diffsim_ros.io.tables` (``t``, ``q:<joint>``, optional
``qd:``/``qdd:``/``tau:``/``u:`` columns and a ``run`` column), or a published real-robot
data set read in place (:mod:`diffsim_ros.io.formats`: the Pyrado Quanser rollouts, Gaz et
al.'s Panda excitation, the DFKI pendulums), whose robot, split and conventions
(``config/README.md``) become the defaults of ``--robot``, ``--runs``, ``--validation``,
``--input-delay``, ``--rate``, ``--derivatives``, ``--cutoff`` and ``--early-stopping``.
``--format auto`` detects the format from the path.  Data conventions
(:mod:`diffsim_ros.io.conventions`): ``--input-delay`` delays the commands, ``--offset``
shifts joint zeros, ``--unwrap`` makes wrapped angles continuous; ``--runs`` picks runs by
name, kind or pattern (:mod:`diffsim_ros.io.selection`).

Pipeline:

1. the robot: a catalog name (:func:`diffsim_ros.robots.names`; nominal model = URDF plus the
   catalog's rotor armature) or a URDF file (every joint torque-commanded);
2. the data, joints in model order; when ``qd`` or ``qdd`` is missing (bags carry no
   accelerations) they are estimated with a zero-phase Butterworth filter (``--cutoff``):
   ``qdd`` from the measured ``qd`` when the data have velocities
   (:func:`diffsim_ros.sysid.filters.accelerations_from_velocity`), else ``qd`` and ``qdd``
   from ``q`` (:func:`~diffsim_ros.sysid.filters.estimate_derivatives`, and always with
   ``--derivatives filter``); torques and commands go through the same filter (they are
   paired with the filtered accelerations), and ``1 / cutoff`` s of filter edge are cropped
   from each end; runs whose sampling is not uniform are resampled at their median rate;
3. the split: ``--validation`` names runs (comma-separated names, kinds or patterns), gives
   a fraction of the runs, or ``last:F``, the trailing fraction of every run;
   a single run is cut into 2 s blocks and that fraction of them, spread over the run, is
   held out (:func:`diffsim_ros.sysid.preprocess.split_blocks`; 20 % by default), so that a
   recording of a swing-up and then a balance validates on both (a recording too short for
   one held-out block holds out its end); then the stretches within
   ``--limit-margin`` of a position limit of the model are left out (a limit stop pushes
   with a force the model lacks);
4. the fit (:func:`diffsim_ros.sysid.estimators.fit`; ``diffnea`` by default runs
   :func:`diffsim_ros.sysid.diffnea.simulation_schedule`: an inverse-dynamics fit, then a
   multi-step stage on 0.1 s RK4 rollouts from measured states, judged by held-out
   rollouts, because the inverse fit alone simulated the real Quanser robots worse than
   their catalogue models) with the configuration of
   ``--config FILE.yaml`` (estimator keys; unknown keys are an error) and the options below;
   ``--loss`` and ``--horizon`` choose the loss (:mod:`diffsim_ros.io.loss_options`);
   ``--early-stopping`` the data that stop the optimiser (by default the validation runs,
   which then take part in choosing the model; ``train``, the default of the data set
   formats: the last training run, so that the validation runs stay unseen).
   Voltage-commanded robots (catalog ``command_unit`` ``'V'``: Qube, cart-pole) are fitted
   on their commands ``u`` through the catalogued DC motor model; other robots on the measured
   joint efforts ``tau`` (or on ``u`` as joint torques when the data has no efforts).

``--actuator`` selects the friction model: ``viscous`` (viscous damping only; the Coulomb
level stays at its nominal value), ``stribeck``, ``nn-friction`` (passive network) or
``nn-residual`` (unconstrained network), the last three as an extra learned module of
``diffnea`` next to the URDF's damping and Coulomb fields.  Without it each estimator uses its
default (viscous and Coulomb friction).  ``--max-iter`` bounds the Adam steps (``diffnea``:
and L-BFGS steps to a tenth of it; ``ffnn``: its iterations; ``nea`` is closed-form).

Outputs in ``--out``:

* ``params.yaml``: per named parameter ``value``, ``unit``, ``nominal`` and ``std`` where the
  estimator gives one (NEA base parameters, with their ``expression``), and
  ``identifiable: false`` with the reason on parameters the data cannot determine
  (:mod:`diffsim_ros.io.identifiability`: they enter no base parameter of the regressor, or
  their std exceeds their value); method, robot, data path, joint names, command joints and
  armature; and under ``model`` the whole model document (:mod:`diffsim_ros.io.fits`: the
  friction module too, sigmoid and Stribeck included), which ``diffsim-sim-eval --model``,
  the demo and the nodes' ``model_file`` parameter load back (catalogue robots, physical
  models);
* ``model.urdf``: the nominal URDF with the identified inertials, damping and Coulomb friction
  (:func:`diffsim_ros.io.model_to_urdf`); when least squares leaves bodies physically
  inconsistent, the consistent model closest to its base parameters, and negative friction is
  clipped to zero (``metrics.json`` ``urdf`` says which, and scores the written
  model too); Stribeck viscous / Coulomb levels are added to the damping / friction fields;
  for ``ffnn`` the nominal URDF;
* ``metrics.json``: inverse-dynamics torque and acceleration RMSE / NMSE per joint on the
  training and validation runs, rollout NMSE over windows of each ``--horizons`` length
  (default 0.5 s and 1 s) of the validation runs, the same for the nominal model,
  ``better_than_nominal`` per metric (:mod:`diffsim_ros.io.verdict`), wall time,
  iterations, preprocessing, data format and the defaults it set, versions, and
  ``unidentifiable`` (``{parameter: reason}``);
* ``report.png`` (:mod:`diffsim_ros.io.report_figure`), one row per joint: measured vs
  predicted joint torque of the fit and of the catalogue model with each one's NMSE (for
  voltage-commanded robots the command through the catalogued DC motor), open-loop rollouts
  of both against the measured positions for each ``--horizons`` length (y-limits from the
  measurement; where a prediction leaves the axes it is marked and counted), on every
  validation run end to end (the longest one when together they last over 30 s), then the
  key metrics beside the catalogue model's and the parameter table (catalogue value beside
  the identified one, unidentifiable parameters greyed and starred);
* ``report_validation.pdf``: the same torque and rollout panels for every validation run,
  one page per run (per 20 s of a long run), each curve's RMSE on the page;
* ``modules.pt`` (neural friction or black-box models only): their ``state_dict``.

Before the fit, the excitation of the training data is measured
(:func:`diffsim_ros.sysid.excitation.excitation`: condition number of the column-normalised
base regressor); above ``--max-condition`` the data cannot determine every base parameter (a
robot at rest, a joint at constant velocity): a warning goes to stderr, ``metrics.json`` gets
``excitation`` and ``warning``, the fit still runs and writes its outputs, and the exit status
is 3.

When the fit's held-out rollouts are worse than the nominal model's at some horizon, a
warning goes to stderr and the exit status is 4 (unless ``--allow-worse``; 3 wins when both
apply).

Exit codes: 0 success; 2 for problems with the inputs or the output folder (one line on
stderr, no traceback, found before the fit): missing / empty / corrupt data, arrays of the
wrong shape or with NaN, unknown topic or joints, unknown robot, invalid URDF or configuration,
unknown method or actuator, out-of-range option values, an ``--out`` that cannot be written;
3 when the outputs are written but the data do not excite the dynamics; 4 when they are
written but the fit simulates the validation runs worse than the nominal model; 130 when
interrupted.
Anything else is a bug and raises with its traceback.

The command is split by step: :mod:`~diffsim_ros.io.fit_options` (options, exit codes,
one-line errors), :mod:`~diffsim_ros.io.fit_inputs` (robot, data, conventions,
preprocessing, split), :mod:`~diffsim_ros.io.fit_estimator` (configuration, excitation,
the fit), :mod:`~diffsim_ros.io.progress` (stderr); this module evaluates, writes the
outputs and runs the whole.
"""
import argparse
import dataclasses
import importlib.metadata
from pathlib import Path
import platform
import sys
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np
import torch
import yaml

from .fit_estimator import (apply_loss_options, budget, estimator_config, measure_excitation,
                            motor_config, run_fit)
from .fit_inputs import (apply_defaults, away_from_limits, check_out, conventions, data_format,
                         load_data, load_robot, needs_commands, preprocess, sample_rate, split)
from .fit_options import (build_parser, EXIT_NOT_EXCITED, EXIT_USAGE, EXIT_WORSE, MIN_SAMPLES,
                          PROG, reported, UsageError)
from .fits import write_model_document
from .identifiability import mark_unidentifiable, unidentifiable
from .object_fit import check_object_options, fit_object_command
from .progress import Progress
from .report import (evaluate, export_urdf, parameter_table, physical_predictor, predictors, score,
                     stribeck_levels, write_metrics_json, write_params_yaml)
from .report_figure import report_content, validation_blocks, write_report
from .selection import early_stopping_split
from .verdict import better_than_nominal, verdict
from .. import __version__, robots
from ..core.model import PRISMATIC, RobotModel
from ..core.urdf import load_urdf
from ..robots.message import model_message, ModelMessageError
from ..sysid import estimators
from ..sysid.dataset import Trajectory
from ..sysid.losses import command_joints_for, resolve_source
from ..sysid.object_learning import METHODS as OBJECT_METHODS
from ..sysid.result import IdentificationResult


# --------------------------------------------------------------------------------------
# Orchestration


# --------------------------------------------------------------------------------------
def _versions() -> Dict[str, str]:
    out = {'diffsim_ros': __version__, 'python': platform.python_version(),
           'torch': torch.__version__, 'numpy': np.__version__, 'pyyaml': yaml.__version__}
    for package in ('scipy', 'matplotlib', 'rosbags'):
        try:
            out[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def _summary(method: str, metrics: Mapping[str, Any]) -> List[str]:
    def fmt(value: Any) -> str:
        return f'{value:.3g}' if isinstance(value, float) else '-'

    def rollout(section: Mapping[str, Any]) -> str:
        return 'diverged' if section.get('diverged') else fmt(section.get('nmse'))

    lines = [f'method: {method}, iterations: {metrics.get("iterations")}, '
             f'fit {metrics["wall_time_s"]["fit"]:.1f} s']
    for key, label in (('torque', 'torque NMSE'), ('acceleration', 'qdd NMSE')):
        for which in ('identified', 'nominal'):
            section = metrics.get(key) if which == 'identified' else \
                (metrics['nominal'].get(key) or {})
            if not section:
                continue
            train = (section.get('train') or {}).get('nmse_mean')
            val = (section.get('validation') or {}).get('nmse_mean')
            lines.append(f'{label:<12} {which:<10} train {fmt(train):>8}  val {fmt(val):>8}')
    for key in metrics['rollout']:
        fitted = rollout(metrics['rollout'][key])
        base = rollout(metrics['nominal']['rollout'][key])
        lines.append(f'rollout {key} NMSE (val): identified {fitted}, nominal {base}')
    return lines


def _save_modules(result: IdentificationResult, out: Path) -> Optional[Path]:
    modules = {}
    if result.network is not None:
        modules['network'] = result.network.state_dict()
    if result.friction is not None and stribeck_levels(result.friction, 1) is None:
        modules['friction'] = result.friction.state_dict()
    if not modules:
        return None
    path = out / 'modules.pt'
    torch.save({name: {k: v.detach().cpu() for k, v in state.items()}
                for name, state in modules.items()}, path)
    return path


def _fit_summary(metrics: Mapping[str, Any]) -> str:
    keys = (('loss', 'loss'), ('validation_loss', 'validation loss')) if 'loss' in metrics \
        else (('torque_nmse', 'torque NMSE'), ('validation_torque_nmse', 'validation torque NMSE'))
    parts = [f'{metrics.get("iterations", 1)} iteration(s)']
    for key, label in keys:
        value = metrics.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            parts.append(f'{label} {value:.4g}')
    return ', '.join(parts)


def _check_device(name: str) -> torch.device:
    if name == 'cuda' and not torch.cuda.is_available():
        raise UsageError('--device cuda: CUDA is not available to this PyTorch installation')
    return torch.device(name)


def _check_inputs(nominal: RobotModel, config: Any, train: List[Trajectory],
                  validation: List[Trajectory]) -> str:
    """Return the input signal the estimator will read, or raise a UsageError."""
    has_actuator = getattr(config, 'actuator', 'none') != 'none'
    with reported('', KeyError, ValueError):
        source = resolve_source(train + validation, config.source, has_actuator)
        m = getattr(train[0], source).shape[-1]
        command_joints_for(nominal, source, m, getattr(config, 'command_joints', ()))
    return source


def _urdf_model(urdf_text: str, result: IdentificationResult,
                nominal: RobotModel) -> RobotModel:
    """Load the written URDF back (with the fit's armature, which URDF cannot hold)."""
    written = load_urdf(xml=urdf_text, dtype=nominal.dtype).to(device=nominal.device)
    armature = result.model.armature if result.model is not None else nominal.armature
    return written.replace(armature=armature.detach().to(written.armature))


def _adjusted(urdf_info: Mapping[str, Any]) -> bool:
    return any(urdf_info.get(key) for key in ('consistent_refit', 'projected_bodies',
                                              'nominal_bodies', 'clipped_friction_joints'))


def _header(args: argparse.Namespace, robot_label: str, nominal: RobotModel,
            result: IdentificationResult, config: Any, source: str) -> Dict[str, Any]:
    identified = result.model if result.model is not None else nominal
    return {
        'method': args.method, 'robot': robot_label, 'data': str(args.data.resolve()),
        'joint_names': list(nominal.joint_names),
        'command_joints': list(result.command_joints), 'input': source,
        'actuator': getattr(config, 'actuator', 'none'),
        'friction_model': getattr(config, 'friction_model', None),
        'armature': {joint: float(value) for joint, value in
                     zip(nominal.joint_names, identified.armature.detach().cpu().tolist())},
    }


def fit_command(args: argparse.Namespace, progress: Progress) -> Dict[str, Any]:
    """
    Run the whole pipeline of the module docstring.

    :param args: parsed arguments.
    :param progress: progress output.
    :return: the metrics written to ``metrics.json``.
    :raises UsageError: problems with the inputs.
    """
    start = time.perf_counter()
    device = _check_device(args.device)
    out: Path = args.out
    check_out(out)
    fmt = data_format(args)
    robot_spec = args.robot or fmt.robot(args.data)
    if robot_spec is None:
        raise UsageError(f'--robot is required for {fmt.name} data (a name: '
                         f'{", ".join(robots.names())}, or a URDF file)')
    nominal, info, robot_label = load_robot(robot_spec)
    runs, defaults = load_data(args, fmt, nominal, info, progress)
    applied = apply_defaults(args, defaults)
    if applied:
        progress.stage(f'{fmt.name} data set defaults: ' + ' '.join(
            f'--{dest.replace("_", "-")} {value}' for dest, value in applied.items()))
    runs, data_info = conventions(runs, args, nominal)
    progress.stage(f'loaded {len(runs)} run(s), {sum(len(run) for run in runs)} samples at '
                   f'about {sample_rate(runs[0]):.4g} Hz from {args.data} for {robot_label} '
                   f'({", ".join(nominal.joint_names)})')
    runs, prep = preprocess(runs, args, progress)
    prep.update(data_info)
    train, validation = split(runs, args.validation)
    train, validation, prep['limit_samples_dropped'] = away_from_limits(
        train, validation, nominal, args)
    prep['limit_margin'] = args.limit_margin
    if prep['limit_samples_dropped']:
        progress.stage(f'left out {prep["limit_samples_dropped"]} samples within '
                       f'{args.limit_margin:g} of a position limit')
    if sum(len(run) for run in train) < MIN_SAMPLES:
        at_limits = (f' left after {prep["limit_samples_dropped"]} samples at position limits '
                     '(--limit-margin)') if prep['limit_samples_dropped'] else ''
        raise UsageError(f'fewer than {MIN_SAMPLES} training samples{at_limits}')
    config, _ = estimator_config(args, info, train, tuple(applied))
    config = apply_loss_options(args, config, train)
    source = _check_inputs(nominal, config, train, validation)
    excited, warning = measure_excitation(nominal, train, config, args.max_condition, progress)
    actuator = getattr(config, 'actuator', 'none')
    progress.stage(f'{len(train)} training run(s), {len(validation)} validation run(s); '
                   f'derivatives: {prep["derivatives"]}; input: {source}'
                   f'{" through " + actuator if actuator != "none" else ""}')
    progress.stage(f'fitting {args.method} ({budget(args.method, config)}) on {device}')
    model = nominal.to(device=device)
    train = [run.to(device=device) for run in train]
    validation = [run.to(device=device) for run in validation]
    fit_start = time.perf_counter()
    fitted_runs, stopping = early_stopping_split(train, validation, args.early_stopping)
    result = run_fit(args.method, model, fitted_runs, stopping, config, progress)
    fit_seconds = time.perf_counter() - fit_start
    progress.stage(f'fit done in {fit_seconds:.1f} s: {_fit_summary(result.metrics)}')

    urdf_text, urdf_info = export_urdf(result, nominal, config)
    for note in urdf_info['notes']:
        if 'inconsistent' in note or 'clipped' in note:
            progress.warn(note)
    written = _urdf_model(urdf_text, result, model)
    progress.begin('evaluating')
    try:
        motor = motor_config(info) if needs_commands(info) else None
        fitted, base = predictors(result, model, config, motor)
        scores, traces = evaluate(fitted, base, train, validation, source, args.horizons)
        published = _published(info, model, result.command_joints or model.joint_names,
                               scores, base, train, validation, source, args.horizons)
        if _adjusted(urdf_info):
            exported, _ = predictors(dataclasses.replace(result, model=written), model, config,
                                     motor)
            urdf_info['evaluation'], _ = score(exported, base, train, validation, source,
                                               args.horizons)
    finally:
        progress.end()

    # the folder was checked before the fit; it can still vanish or fill up meanwhile
    with reported(f'cannot write to --out {str(out)!r}', OSError):
        (out / 'model.urdf').write_text(urdf_text, encoding='utf-8')
        parameters = parameter_table(result, nominal, config)
        flags = unidentifiable(parameters, nominal, config)
        parameters = mark_unidentifiable(parameters, flags)
        write_params_yaml(out / 'params.yaml', _header(args, robot_label, nominal, result,
                                                       config, source), parameters)
        exported_model = _write_model_document(out / 'params.yaml', result, written, urdf_info,
                                               info)
        modules_path = _save_modules(result, out)
        metrics: Dict[str, Any] = {
            **_header(args, robot_label, nominal, result, config, source),
            'runs': {'train': [run.run for run in train],
                     'validation': [run.run for run in validation]},
            'early_stopping': {'mode': args.early_stopping,
                               'runs': [run.run for run in stopping]},
            'samples': {'train': sum(len(run) for run in train),
                        'validation': sum(len(run) for run in validation)},
            'preprocessing': prep,
            'data': {'format': fmt.name, 'defaults': applied, 'validation': args.validation},
            'excitation': {**excited.to_dict(), 'max_condition': args.max_condition,
                           'sufficient': warning is None},
            'warning': warning,
            **scores,
            'horizons_s': list(args.horizons),
            'better_than_nominal': better_than_nominal(scores),
            **({'published': published} if published is not None else {}),
            'iterations': result.metrics.get('iterations'),
            'wall_time_s': {'fit': fit_seconds, 'total': None},
            'urdf': urdf_info,
            'physical_parameters': bool(parameters),
            'unidentifiable': flags,
            'modules': modules_path.name if modules_path is not None else None,
            'model_document': exported_model or 'params.yaml model',
            'estimator_metrics': result.to_dict()['metrics'],
            'history': {'train_iterations': len(result.history.get('train', ())),
                        'validation_evaluations': len(result.history.get('validation', ()))},
            'config': result.to_dict()['config'],
            'device': str(device),
            'versions': _versions(),
        }
        del metrics['armature']
        metrics['exit_status'] = _exit_status(metrics, args.allow_worse)
        note = 'black-box model: no physical parameters (model.urdf is the nominal URDF)' \
            if not parameters else ''
        units = ['m' if kind == PRISMATIC else 'rad' for kind in nominal.tree.joint_types]
        content = report_content((fitted, base), scores, units,
                                 'measured: voltage x catalogue motor' if needs_commands(info)
                                 else 'measured',
                                 'validation' if validation else 'training (no validation)')
        reports = write_report(out, f'{robot_label}: {args.method} fit of {args.data.name}',
                               validation_blocks((fitted, base), validation or train[:1],
                                                 source, traces),
                               content, parameters, _summary(args.method, metrics), note)
        metrics['wall_time_s']['total'] = time.perf_counter() - start
        write_metrics_json(out / 'metrics.json', metrics)
    progress.stage(f'wrote params.yaml, model.urdf, metrics.json, '
                   f'{", ".join(path.name for path in reports)}'
                   f'{", modules.pt" if modules_path is not None else ""} to {out}')
    if warning is not None:
        progress.warn(warning)
    if metrics['worse_than_nominal']:
        progress.warn(metrics['worse_than_nominal'])
    return metrics


def _write_model_document(path: Path, result: IdentificationResult, written: RobotModel,
                          urdf_info: Mapping[str, Any],
                          info: Optional[robots.RobotInfo]) -> Optional[str]:
    """
    Append the fit's model document to ``params.yaml`` (:mod:`diffsim_ros.io.fits`).

    The document holds the fitted model, its motor and its analytic friction module; where the
    URDF export had to change the fit (inconsistent bodies, negative friction), its inertials
    are the exported ones, so that a node accepts what ``model.urdf`` shows.

    :return: why no document was written (a black-box fit, a URDF outside the catalogue), or
        ``None`` when it was.
    """
    if result.model is None:
        return 'a black-box fit has no physical model'
    if info is None:
        return 'the robot is not in the catalogue (no interface to load the document with)'
    source = result
    if _adjusted(urdf_info):
        model = written.replace(damping=result.model.damping.detach().clamp_min(0.0).to(
            written.damping), friction=result.model.friction.detach().clamp_min(0.0).to(
            written.friction))
        source = dataclasses.replace(result, model=model)
    try:
        document = model_message(source, robots.interface(info.name))
    except ModelMessageError as error:   # e.g. a model with parameter batch dims
        return f'no model document: {error}'
    write_model_document(path, document)
    return None


def _published(info: Optional[robots.RobotInfo], model: RobotModel, joints: Sequence[str],
               scores: Mapping[str, Any], base: Any, train: List[Trajectory],
               validation: List[Trajectory], source: str,
               horizons: Sequence[float]) -> Optional[Dict[str, Any]]:
    """
    Score the robot's published model with its own friction model, as the fit is scored.

    :param info: catalog entry or ``None``.
    :param model: nominal model (dtype and device of the evaluation).
    :param joints: command joints of the fit's inputs.
    :param scores: the fit's metrics (:func:`~diffsim_ros.io.report.evaluate`).
    :param base: the nominal predictor (torque variance scale).
    :param train: training runs.
    :param validation: validation runs.
    :param source: ``'tau'`` or ``'u'``.
    :param horizons: rollout horizons, s.
    :return: ``{'description', 'torque', 'acceleration', 'rollout', 'better_than_published'}``
        or ``None`` when the catalog has no friction model beyond the URDF's fields.
    """
    if info is None:
        return None
    published = robots.interface(info.name).published_friction()
    if published is None or needs_commands(info):   # scored on joint torques only
        return None
    bare, friction, description = published
    predictor = physical_predictor(
        'published', bare.to(dtype=model.dtype, device=model.device), joints, None,
        friction.to(dtype=model.dtype, device=model.device))
    section, _ = score(predictor, base, train, validation, source, horizons)
    return {'description': f'catalogue inertials with {description}', **section,
            'better_than_published': better_than_nominal({**scores, 'nominal': section})}


def _exit_status(metrics: Dict[str, Any], allow_worse: bool) -> int:
    """Set ``metrics['worse_than_nominal']`` and return the exit status of the outputs."""
    metrics['worse_than_nominal'], lost = verdict(metrics, metrics['better_than_nominal'],
                                                  allow_worse, EXIT_WORSE)
    if metrics['warning'] is not None:
        return EXIT_NOT_EXCITED
    return EXIT_WORSE if lost and not allow_worse else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """
    Run ``diffsim-fit``.

    :param argv: arguments without the program name; ``None`` reads ``sys.argv``.
    :return: exit code: 0 success, 2 input problems (one line on stderr), 3 outputs written
        but the data do not excite the dynamics, 4 outputs written but held-out rollouts
        worse than the nominal model's, 130 interrupted.
    """
    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        sys.stderr.write(f'{PROG}: error: {exc}\n')
        return EXIT_USAGE
    except SystemExit as exc:   # --help
        return int(exc.code or 0)
    progress = Progress(sys.stderr, PROG, quiet=args.quiet)
    try:
        args.method = check_object_options(args, tuple(OBJECT_METHODS), estimators.names())
        command = fit_object_command if args.object is not None else fit_command
        metrics = command(args, progress)
    except UsageError as exc:
        sys.stderr.write(f'{PROG}: error: {exc}\n')
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write(f'{PROG}: interrupted\n')
        return 130
    return metrics['exit_status']


if __name__ == '__main__':
    sys.exit(main())
