"""
``diffsim-fit TOSSES --object cube|elbow|URDF``: learn a tossed object from recorded tosses.

Pipeline: the nominal object (:func:`~diffsim_ros.io.object_urdf.object_spec`), the tosses
(:func:`~diffsim_ros.io.object_data.read_tosses`), a split drawn with ``--seed``
(``--validation`` F of the tosses held out and never fitted; of the rest a fifth, at least
one, stops the optimiser early, unless only one toss is left, which is then fitted and stops
alike), :func:`~diffsim_ros.sysid.object_learning.fit_object`, then on the held-out tosses
the fit's and the nominal object's rollouts from each toss's first full state
(:data:`FIRST_STATE`) against the recording. Outputs: ``params.yaml``, the learned URDF and
its meshes (:func:`~diffsim_ros.io.object_urdf.learned_urdf`), ``metrics.json``,
``report.png``, ``modules.pt`` (networks of the fit, if any). Exit status 4 when the fit's
held-out position or orientation error is above the nominal object's (``--allow-worse``: 0).
"""

import argparse
import dataclasses
from pathlib import Path
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
import numpy as np
import torch

from .fit_inputs import check_out
from .fit_options import EXIT_WORSE, reported, UsageError
from .object_data import ObjectDataError, ObjectRecording, read_tosses, recorded_tosses
from .object_urdf import learned_urdf, object_spec
from .progress import Progress
from .report import write_metrics_json, write_params_yaml
from ..core.errors import URDFError
from ..core.parameterization import mass_com_inertia
from ..sysid.contact_learning import ObjectFit, ObjectSpec, rollout, rollout_errors
from ..sysid.object_learning import fit_object

__all__ = ['FIRST_STATE', 'fit_object_command', 'predict_tosses', 'split_tosses',
           'object_parameters']

#: Row of a toss whose state a rollout starts from: row 0's velocity is a copy of row 1's
#: (backward differences, first sample repeated), so row 1 is the first full state.
FIRST_STATE = 1
#: Default number of optimiser steps of ``--object`` fits.
DEFAULT_STEPS = 400
#: Held-out tosses drawn in report.png.
REPORT_TOSSES = 3

Predict = Callable[[torch.Tensor, int, float], torch.Tensor]


def split_tosses(n: int, fraction: float, seed: int):
    """
    Split ``n`` tosses into train, early-stopping and held-out sets (module docstring).

    :param n: number of tosses, >= 2.
    :param fraction: held-out fraction in (0, 1).
    :param seed: seed of the permutation.
    :return: ``(train, stopping, held_out)`` index lists; ``stopping`` is ``train`` when a
        single toss is left to fit.
    """
    order = np.random.default_rng(seed).permutation(n).tolist()
    n_test = min(n - 1, max(1, int(round(fraction * n))))
    held_out, rest = sorted(order[:n_test]), order[n_test:]
    if len(rest) == 1:
        return rest, rest, held_out
    n_stop = max(1, int(round(0.2 * len(rest))))
    return sorted(rest[n_stop:]), sorted(rest[:n_stop]), held_out


def predict_tosses(predict: Predict, recording: ObjectRecording,
                   indices: Sequence[int]) -> List[torch.Tensor]:
    """
    Roll a model out on tosses from their first full state over their whole length.

    :param predict: ``(x0 (B, nx), steps, dt) -> (B, steps, nx)``.
    :param recording: the tosses.
    :param indices: which tosses.
    :return: per toss a ``(T_i, nq + nv)`` tensor: rows up to :data:`FIRST_STATE` are the
        recorded states, the later ones predicted (row for row with the recording).
    """
    indices = list(indices)
    if not indices:
        return []
    recorded = [torch.cat((recording.q[i], recording.v[i]), -1) for i in indices]
    steps = max(len(x) for x in recorded) - 1 - FIRST_STATE
    x0 = torch.stack([x[min(FIRST_STATE, len(x) - 1)] for x in recorded])
    with torch.no_grad():
        batch = predict(x0, max(steps, 1), recording.dt) if steps > 0 else None
    out = []
    for k, x in enumerate(recorded):
        head = x[:FIRST_STATE + 1]
        tail = batch[k, :len(x) - 1 - FIRST_STATE] if batch is not None else x[:0]
        out.append(torch.cat((head, tail.to(x)), 0)[:len(x)])
    return out


def _errors(predicted: Sequence[torch.Tensor], recording: ObjectRecording,
            indices: Sequence[int]) -> Dict[str, Any]:
    start = FIRST_STATE + 1
    pairs = [(p[start:, :7], recording.q[i][start:, :7]) for p, i in zip(predicted, indices)
             if len(recording.q[i]) > start]
    if not pairs:
        return {'tosses': 0}
    per_toss = rollout_errors([p for p, _ in pairs], [r for _, r in pairs])
    out: Dict[str, Any] = {'tosses': len(pairs)}
    for key, values in per_toss.items():
        values = np.asarray(values)
        out[key] = {'mean': float(values.mean()), 'median': float(np.median(values)),
                    'p90': float(np.percentile(values, 90)), 'per_toss': values.tolist()}
    return out


def object_parameters(spec: ObjectSpec, fit: ObjectFit) -> Dict[str, Dict[str, Any]]:
    """
    Return the named physical parameters of a fit with units and the nominal values.

    :param spec: the nominal object.
    :param fit: the learned one.
    :return: ``{name: {'value', 'unit', 'nominal'[, 'learned': False]}}``; ``{}`` for a fit
        without physics.
    """
    if fit.model is None or fit.contact is None:
        return {}
    out: Dict[str, Dict[str, Any]] = {
        'friction': {'value': float(fit.contact.friction), 'unit': '-',
                     'nominal': float(spec.contact.friction)},
        'ground_height': {'value': float(fit.contact.ground_height), 'unit': 'm',
                          'nominal': float(spec.contact.ground_height)}}
    learned = mass_com_inertia(fit.model.inertial.detach().reshape(-1, 10).double())
    nominal = mass_com_inertia(spec.model.inertial.detach().reshape(-1, 10).double())
    for b, link in enumerate(fit.model.tree.body_links):
        prefix = f'{link}.'
        out[prefix + 'mass'] = {'value': float(learned[0][b]), 'unit': 'kg',
                                'nominal': float(nominal[0][b]), 'learned': False}
        for i, axis in enumerate('xyz'):
            out[f'{prefix}com_{axis}'] = {'value': float(learned[1][b, i]), 'unit': 'm',
                                          'nominal': float(nominal[1][b, i])}
        for name, (i, j) in (('ixx', (0, 0)), ('iyy', (1, 1)), ('izz', (2, 2)),
                             ('ixy', (0, 1)), ('ixz', (0, 2)), ('iyz', (1, 2))):
            out[prefix + name] = {'value': float(learned[2][b, i, j]), 'unit': 'kg m^2',
                                  'nominal': float(nominal[2][b, i, j])}
    if spec.joint_damping:   # the joints' learned viscous damping (ObjectSpec.joint_damping)
        for k, joint in enumerate(fit.model.tree.joint_names[1:]):
            out[f'{joint}.damping'] = {'value': float(fit.model.damping[6 + k]),
                                       'unit': 'N m s/rad',
                                       'nominal': float(spec.model.damping[6 + k])}
    for link, verts, start in zip(fit.contact.vertex_links, fit.contact.vertices,
                                  spec.contact.vertices):
        for k, (point, point0) in enumerate(zip(verts.detach().tolist(), start.tolist())):
            out[f'{link}.vertex_{k}'] = {'value': point, 'unit': 'm', 'nominal': point0}
    return out


def _report(path: Path, title: str, fit: ObjectFit, recording: ObjectRecording,
            shown: Sequence[int], runs: Dict[str, List[torch.Tensor]],
            lines: Sequence[str]) -> None:
    figure = Figure(figsize=(13, 8.5), layout='constrained')
    FigureCanvasAgg(figure)
    grid = figure.add_gridspec(3, max(1, len(shown)), height_ratios=(1.1, 1, 1))
    axis = figure.add_subplot(grid[0, :])
    history = fit.history or {}
    step = history.get('step', [])
    for key, style in (('train', '-'), ('validation', '--')):
        values = history.get(key, [])
        pairs = [(s, v) for s, v in zip(step, values) if v is not None]
        if pairs:
            axis.plot(*zip(*pairs), style, marker='.', label=f'{key} loss')
    if axis.lines:
        axis.set_yscale('symlog', linthresh=1e-6)
        axis.legend(loc='upper right')
    axis.set_xlabel('optimiser step')
    axis.set_title(title, fontsize=10)
    axis.text(0.01, 0.02, '\n'.join(lines), transform=axis.transAxes, fontsize=8,
              family='monospace', va='bottom')
    for column, (index, k) in enumerate(shown):
        t = np.arange(len(recording.q[index])) * recording.dt
        top = figure.add_subplot(grid[1, column])
        bottom = figure.add_subplot(grid[2, column])
        top.plot(t, recording.q[index][:, 2].numpy(), 'k', label='measured')
        for (name, predicted), colour in zip(runs.items(), ('C0', 'C1')):
            x = predicted[k]
            top.plot(t, x[:, 2].numpy(), colour, label=name)
            errors = np.linalg.norm((x[:, :3] - recording.q[index][:, :3]).numpy(), axis=1)
            bottom.plot(t, errors, colour, label=name)
        top.set_title(f'held-out toss {recording.toss_ids[index]}', fontsize=9)
        top.set_ylabel('height z [m]')
        bottom.set_ylabel('position error [m]')
        bottom.set_xlabel('time [s]')
        if column == 0:
            top.legend(fontsize=8)
    figure.savefig(path, dpi=90)


def _modules(fit: ObjectFit) -> Dict[str, Any]:
    return {name: {'class': type(value).__name__,
                   'state_dict': {k: t.detach().cpu() for k, t in value.state_dict().items()}}
            for name, value in fit.extra.items() if isinstance(value, torch.nn.Module)}


def _load(args: argparse.Namespace, progress: Progress):
    with reported(f'--object {args.object}', ValueError, URDFError, OSError):
        spec = object_spec(args.object, args.friction)
    window = getattr(args, 'smooth_window', None)
    if window is not None:
        with reported('--smooth-window', ValueError):
            spec = dataclasses.replace(spec, smooth_window=window)
    with reported('', ObjectDataError):
        recording = read_tosses(args.data, args.topic, args.rest, args.limit)
    nq = int(spec.model.nq)
    if recording.q[0].shape[-1] != nq:
        raise UsageError(f'{args.data}: the tosses have {recording.q[0].shape[-1]} '
                         f'configuration entries ({recording.layout} layout), the object '
                         f'{spec.name} has {nq}')
    if len(recording) < 2:
        raise UsageError(f'{args.data}: {len(recording)} toss; at least two are needed (one '
                         'to fit, one to hold out)')
    progress.stage(f'read {len(recording)} tosses ({sum(len(q) for q in recording.q)} '
                   f'samples, {1 / recording.dt:.4g} Hz, {recording.layout} layout'
                   f'{", topic " + recording.topic if recording.topic else ""}) from '
                   f'{args.data}')
    return spec, recording


def fit_object_command(args: argparse.Namespace, progress: Progress) -> Dict[str, Any]:
    """
    Run ``diffsim-fit --object`` (module docstring).

    :param args: parsed arguments of :func:`~diffsim_ros.io.fit_options.build_parser`.
    :param progress: progress output.
    :return: the metrics written to ``metrics.json`` (``exit_status`` included).
    :raises UsageError: problems with the inputs.
    """
    start = time.perf_counter()
    method = args.method
    fraction = 0.2 if args.validation is None else args.validation
    try:
        fraction = float(fraction)
    except ValueError:
        raise UsageError(f'--validation {fraction!r}: with --object, a fraction of the '
                         'tosses in (0, 1)') from None
    if not 0.0 < fraction < 1.0:
        raise UsageError(f'--validation {fraction:g}: with --object, a fraction in (0, 1)')
    seed = 0 if args.seed is None else args.seed
    steps = DEFAULT_STEPS if args.max_iter is None else args.max_iter
    restarts = getattr(args, 'restarts', 1)
    check_out(args.out)
    spec, recording = _load(args, progress)
    train_i, stop_i, test_i = split_tosses(len(recording), fraction, seed)
    progress.stage(f'{len(train_i)} training, {len(stop_i)} early-stopping and {len(test_i)} '
                   f'held-out tosses; fitting {method} ({steps} steps, seed {seed}'
                   + (f', {restarts} starts' if restarts > 1 else '') + ')')
    fit_start = time.perf_counter()
    fit = fit_object(spec, method, recorded_tosses(recording, train_i),
                     recorded_tosses(recording, stop_i), recording.dt, seed=seed, steps=steps,
                     restarts=restarts, choose=getattr(args, 'choose_by', 'rollout'))
    fit_seconds = time.perf_counter() - fit_start
    progress.stage(f'fit done in {fit_seconds:.1f} s')

    def nominal(x0, n, dt):
        return rollout(spec.model, spec.contact, x0, n, dt)

    runs = {f'fit ({method})': predict_tosses(fit.predict, recording, test_i),
            'nominal': predict_tosses(nominal, recording, test_i)}
    errors = {name: _errors(predicted, recording, test_i)
              for name, predicted in zip(('fit', 'nominal'), runs.values())}
    better = {key: errors['fit'][key]['mean'] <= errors['nominal'][key]['mean']
              for key in ('position_m', 'orientation_rad') if key in errors['fit']}
    summary = fit.summary()
    out: Path = args.out
    stem = f'{spec.name}_learned'
    with reported(f'cannot write to --out {str(out)!r}', OSError):
        if fit.model is not None and fit.contact is not None:
            with reported('cannot export the learned object', URDFError):
                urdf_text, meshes = learned_urdf(fit.model, fit.contact, spec.model.urdf, stem)
            note = None
        else:
            urdf_text, meshes = learned_urdf(spec.model, spec.contact, spec.model.urdf, stem)
            note = f'{method} learns no physical object: the URDF is the nominal object'
        (out / f'{stem}.urdf').write_text(urdf_text, encoding='utf-8')
        for name, text in meshes.items():
            (out / name).write_text(text, encoding='utf-8')
        modules = _modules(fit)
        if modules:
            torch.save(modules, out / 'modules.pt')
        header = {'object': spec.name, 'object_argument': str(args.object), 'method': method,
                  'seed': seed, 'data': str(Path(args.data).resolve()),
                  'layout': recording.layout, 'dt': recording.dt,
                  'urdf': f'{stem}.urdf', 'meshes': sorted(meshes),
                  'modules': 'modules.pt' if modules else None, 'note': note}
        parameters = object_parameters(spec, fit)
        write_params_yaml(out / 'params.yaml', header, parameters)
        metrics: Dict[str, Any] = {
            **{k: header[k] for k in ('object', 'method', 'seed', 'data', 'layout', 'dt')},
            'topic': recording.topic, 'steps': steps, 'smooth_window': spec.smooth_window,
            'restarts': fit.extra.get('restarts'),
            'tosses': {'train': [recording.toss_ids[i] for i in train_i],
                       'early_stopping': [recording.toss_ids[i] for i in stop_i],
                       'held_out': [recording.toss_ids[i] for i in test_i]},
            'friction': summary.get('friction'),
            'friction_nominal': float(spec.contact.friction),
            'volume_error': summary.get('volume_error'),
            'inertia_error': summary.get('inertia_error'),
            'ground_height_m': summary.get('ground_height_m'),
            'start': fit.start,
            'held_out': errors,
            'rollout_start_row': FIRST_STATE,
            'better_than_nominal': better,
            'history': fit.history,
            'wall_time_s': {'fit': fit_seconds, 'total': None},
        }
        lost = [key for key, ok in better.items() if not ok]
        metrics['worse_than_nominal'] = (
            f'held-out {" and ".join(lost)} worse than the nominal object\'s' if lost else None)
        metrics['exit_status'] = EXIT_WORSE if lost and not args.allow_worse else 0
        lines = [f'{key}: fit {errors["fit"][key]["mean"]:.4g}, nominal '
                 f'{errors["nominal"][key]["mean"]:.4g} (mean over {errors["fit"]["tosses"]} '
                 'held-out tosses)' for key in better]
        for key in ('volume_error', 'friction', 'inertia_error'):
            if isinstance(summary.get(key), float):
                lines.append(f'{key}: {summary[key]:.4g}')
        shown = [(i, k) for k, i in enumerate(test_i)][:REPORT_TOSSES]
        _report(out / 'report.png', f'{spec.name}: {method} from {len(train_i)} tosses of '
                f'{Path(args.data).name} (seed {seed})', fit, recording, shown, runs, lines)
        metrics['wall_time_s']['total'] = time.perf_counter() - start
        write_metrics_json(out / 'metrics.json', metrics)
    for line in lines:
        progress.stage(line)
    progress.stage(f'wrote params.yaml, {stem}.urdf, metrics.json, report.png to {out}')
    if metrics['worse_than_nominal']:
        progress.warn(metrics['worse_than_nominal'])
    return metrics


def check_object_options(args: argparse.Namespace, object_methods: Sequence[str],
                         robot_methods: Sequence[str]) -> Optional[str]:
    """
    Check that ``--method`` fits the mode (object or robot) and return the method.

    :param args: parsed arguments.
    :param object_methods: the object learners' names.
    :param robot_methods: the robot estimators' names.
    :return: the method to use.
    :raises UsageError: a method of the other mode, or ``--robot`` with ``--object``.
    """
    if args.object is not None:
        if args.robot is not None:
            raise UsageError('--robot and --object exclude each other')
        if args.method not in object_methods:
            raise UsageError(f'--method {args.method} is a robot estimator; with --object '
                             f'choose one of {", ".join(object_methods)}')
    elif args.method not in robot_methods:
        raise UsageError(f'--method {args.method} learns a tossed object: give --object '
                         f'(robots: {", ".join(robot_methods)})')
    return args.method
