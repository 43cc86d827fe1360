"""
CCN (violation-implicit loss) learned from N real elbow tosses, against the nominal URDF.

The DAIR articulated elbow (two 0.10 x 0.05 x 0.05 m boxes on a hinge, 541 tosses of 121
samples at 0.0068 s; ``diffsim_ros.io.tosses.load_elbow_tosses``), split as
``benchmarks/contact_learning.py`` splits the cube (a permutation from ``--split-seed``: the
last ``--test-tosses`` held out for every N and seed, the ``--validation-tosses`` before them
used only for early stopping, the first N for training). CCN learns both links' vertices,
both links' inertias with each mass held at 0.37 kg and mu, the ground held at the table
(``diffsim_ros.io.object_urdf.elbow_spec``: the URDF's boxes and the elbow's own violation
weights and smoothing window; start 0.5-1.5x, random box inertias, the paper's appendix A.4)
through ``sysid.object_learning.fit_object``; ``--methods`` names any of its methods (CCN-R,
DiffSim ...), each fitted ``--seeds`` times. Every method learns from training and validation
tosses whose poses are smoothed by local quadratic fits and whose velocities are the backward
differences of those (``sysid.pose_smoothing``, ``--smooth-window``, default the elbow spec's
``io.object_urdf.ELBOW_SMOOTH_WINDOW``); the test tosses, and every rollout's first state,
are the recorded ones for every row.

On the test tosses, in the same run, three models: the learned one (``core.contact_step`` at
the recording's dt), and the nominal URDF (boxes, 0.37 kg each, mu 0.3, no restitution)
rolled out by our contact step and by MuJoCo (``benchmarks/tosses.py``: RK4, its soft
contact, 10 substeps per sample). Two error windows, both from recorded states the fit never
saw:

- horizon: from every sample ``s >= 1`` (every ``--window-stride``-th) with ``s + H`` inside
  the toss, predict ``H = --horizon`` (16, the paper's) samples; error = mean over the H
  predicted samples. Per toss the mean over its windows, then mean / median / p90 over tosses.
- full: from the second sample to the end (119 samples), mean over samples, then over tosses.

Errors: position of elbow_1's frame (m), geodesic orientation of elbow_1 (rad), hinge angle
(rad; unwrapped).
"""

import dataclasses
import json
import os
from pathlib import Path
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import torch

try:
    from benchmarks import _common, contact_learning as cube_bench, tosses as toss_bench
except ImportError:  # run as ``python benchmarks/elbow_learning.py``
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks import _common, contact_learning as cube_bench, tosses as toss_bench

from diffsim_ros.io.object_urdf import elbow_spec  # noqa: I100
from diffsim_ros.io.tosses import load_elbow_tosses, TossSet
from diffsim_ros.sysid import contact_learning as cl
from diffsim_ros.sysid.object_learning import fit_object, METHODS, RESTART_CRITERIA

HORIZON = 16
#: The fixed held-out tosses of the default split (``--test-tosses``, ``--validation-tosses``)
#: and the largest training set it leaves room for (``contact_weights.py --object elbow``
#: judges on the tosses after it).
TEST_TOSSES, VALIDATION_TOSSES, LARGEST_TRAINING = 20, 8, 256
ERROR_KEYS = ('position_m', 'orientation_rad', 'hinge_rad')
#: Predictor: ``(x0 (W, nq + nv), steps) -> (W, steps, nq)`` configurations.
Predictor = Callable[[torch.Tensor, int], torch.Tensor]


def configuration_errors(predicted: torch.Tensor, recorded: torch.Tensor) -> Dict[str, Any]:
    """
    Return position, orientation and hinge errors of elbow configurations, per sample.

    :param predicted: ``(..., 8)`` configurations in our layout.
    :param recorded: ``(..., 8)`` the recorded ones.
    :return: ``position_m``, ``orientation_rad``, ``hinge_rad``, each ``(...)``.
    """
    return {'position_m': (predicted[..., :3] - recorded[..., :3]).norm(dim=-1),
            'orientation_rad': toss_bench.geodesic_angle(predicted[..., 3:7],
                                                         recorded[..., 3:7]),
            'hinge_rad': (predicted[..., 7] - recorded[..., 7]).abs()}


def horizon_windows(tosses: TossSet, indices: Sequence[int], horizon: int,
                    stride: int = 1) -> List[tuple]:
    """
    Return ``(toss, start)`` of every window of ``horizon`` samples after a start ``>= 1``.

    Sample 0 is skipped: its velocity repeats the first backward difference.

    :param tosses: the tosses.
    :param indices: which tosses.
    :param horizon: predicted samples per window.
    :param stride: keep every ``stride``-th start.
    :return: the windows.
    """
    return [(i, s) for i in indices for s in range(1, len(tosses.q[i]) - horizon, stride)]


def horizon_errors(predict: Predictor, tosses: TossSet, windows: Sequence[tuple],
                   horizon: int) -> Dict[str, Dict[str, Optional[float]]]:
    """
    Return the horizon errors of one model: per window the mean over its samples.

    :param predict: the model's predictor.
    :param tosses: the tosses.
    :param windows: ``(toss, start)`` pairs (:func:`horizon_windows`).
    :param horizon: predicted samples per window.
    :return: per error key, mean / median / p90 over tosses of the per-toss window mean.
    """
    x0 = torch.stack([torch.cat((tosses.q[i][s], tosses.v[i][s])) for i, s in windows])
    recorded = torch.stack([tosses.q[i][s + 1:s + 1 + horizon] for i, s in windows])
    errors = configuration_errors(predict(x0, horizon), recorded)
    toss_of = np.array([i for i, _ in windows])
    return {key: toss_bench.summarize(toss_bench.per_toss_mean(value.mean(-1), toss_of))
            for key, value in errors.items()}


def horizon_means(model, contact, tosses: TossSet, windows: Sequence[tuple],
                  horizon: int = HORIZON) -> Dict[str, float]:
    """
    Return a physical model's horizon errors (our contact step), the mean over tosses only.

    :param model: the elbow's body model.
    :param contact: its contact model.
    :param tosses: the tosses.
    :param windows: ``(toss, start)`` pairs (:func:`horizon_windows`).
    :param horizon: predicted samples per window.
    :return: per error key, the mean over tosses of the per-toss window mean.
    """
    nq = int(model.nq)
    rows = horizon_errors(lambda x0, steps: cl.rollout(model, contact, x0, steps,
                                                       tosses.dt)[..., :nq],
                          tosses, windows, horizon)
    return {key: row['mean'] for key, row in rows.items()}


def full_errors(predict: Predictor, tosses: TossSet,
                indices: Sequence[int]) -> Dict[str, Dict[str, Optional[float]]]:
    """
    Return the whole-toss errors of one model, from the second sample to the end.

    :param predict: the model's predictor.
    :param tosses: the tosses.
    :param indices: which tosses.
    :return: per error key, mean / median / p90 over tosses of the per-toss sample mean.
    """
    x0 = torch.stack([torch.cat((tosses.q[i][1], tosses.v[i][1])) for i in indices])
    lengths = [len(tosses.q[i]) - 2 for i in indices]
    batch = predict(x0, max(lengths))
    per_toss = {key: [] for key in ERROR_KEYS}
    for k, (i, n) in enumerate(zip(indices, lengths)):
        for key, value in configuration_errors(batch[k, :n], tosses.q[i][2:]).items():
            per_toss[key].append(float(value.mean()))
    return {key: toss_bench.summarize(value) for key, value in per_toss.items()}


def nominal_predictors(spec: cl.ObjectSpec, tosses: TossSet) -> Dict[str, Predictor]:
    """
    Return the nominal URDF's predictors: our contact step and MuJoCo.

    :param spec: the elbow's spec (the URDF: boxes, masses, mu, no restitution).
    :param tosses: the tosses (dt, URDF, nominal friction).
    :return: name -> predictor.
    """
    nq = int(spec.model.nq)
    mj_model = toss_bench.mujoco_model(tosses, tosses.dt / toss_bench.CONTACT_SUBSTEPS,
                                       contact=True)
    return {
        'ours_nominal': lambda x0, steps: cl.rollout(spec.model, spec.contact, x0, steps,
                                                     tosses.dt)[..., :nq],
        'mujoco_nominal': lambda x0, steps: toss_bench.rollout_mujoco(
            mj_model, x0, steps, toss_bench.CONTACT_SUBSTEPS)}


def _evaluate(predict: Predictor, tosses: TossSet, windows, test_i, horizon: int):
    return {'horizon': horizon_errors(predict, tosses, windows, horizon),
            'full': full_errors(predict, tosses, test_i)}


def run(data: Path, n_train: int, seeds: Sequence[int], n_val: int, n_test: int, steps: int,
        horizon: int = HORIZON, stride: int = 1, split_seed: int = 0,
        limit: Optional[int] = None, perturb: bool = True,
        methods: Sequence[str] = ('ccn',), log=None,
        smooth_window: Optional[int] = None, shape: Optional[str] = None,
        mass_split: Optional[bool] = None, restarts: int = 1,
        choose: str = 'rollout', joint_damping: Optional[bool] = None) -> Dict[str, Any]:
    """
    Learn the elbow from ``n_train`` tosses; evaluate it and the nominal URDF on the test set.

    Every method (keys of ``sysid.object_learning.METHODS``) is fitted once per seed; per
    method, window and error the mean over seeds of the over-tosses mean, with its 95 %
    Student-t half-width (``benchmarks/contact_learning.py``'s ``t_interval``).

    :param smooth_window: the local polynomial window every method's training and validation
        tosses are smoothed with (``ObjectSpec.smooth_window``; None: the elbow spec's own;
        the test tosses and every rollout's first state stay as recorded).
    :param shape: how CCN and CCN-R learn the geometry (``ObjectSpec.shape``; None: the
        elbow spec's own).
    :param mass_split: whether CCN and CCN-R learn how the total mass splits between the
        links (``ObjectSpec.mass_split``; None: the elbow spec's own).
    :param restarts: starts per fit, the lowest validation loss kept
        (``sysid.object_learning.fit_object``'s ``restarts``; the fit's time counts them all).
    :param choose: how the restarts are ranked on the validation tosses (``fit_object``'s
        ``choose``: ``'loss'`` or ``'rollout'``).
    :param joint_damping: whether CCN and CCN-R learn the hinge's viscous damping
        (``ObjectSpec.joint_damping``; None: the elbow spec's own).
    :return: the JSON payload (see the module docstring): ``runs`` (one per method and seed,
        its errors' mean / median / p90 over tosses), ``errors`` (per window and model: per
        method the t-interval over seeds of each error's mean, per nominal row its mean /
        median / p90 over tosses).
    """
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f'unknown methods {unknown}; valid: {", ".join(METHODS)}')
    tosses = load_elbow_tosses(data, limit=limit)
    train_i, val_i, test_i = cube_bench.split(len(tosses), n_train, n_val, n_test, split_seed)
    spec = elbow_spec(tosses)
    if smooth_window is not None:
        spec = dataclasses.replace(spec, smooth_window=smooth_window)
    if shape is not None:
        spec = dataclasses.replace(spec, shape=shape)
    if mass_split is not None:
        spec = dataclasses.replace(spec, mass_split=mass_split)
    if joint_damping is not None:
        spec = dataclasses.replace(spec, joint_damping=joint_damping)
    train = ([tosses.q[i] for i in train_i], [tosses.v[i] for i in train_i])
    validation = ([tosses.q[i] for i in val_i], [tosses.v[i] for i in val_i])
    windows = horizon_windows(tosses, test_i, horizon, stride)
    errors: Dict[str, Dict[str, Any]] = {'horizon': {}, 'full': {}}
    seconds = {}
    for name, predict in nominal_predictors(spec, tosses).items():
        start = time.perf_counter()
        for window, rows in _evaluate(predict, tosses, windows, test_i, horizon).items():
            errors[window][name] = rows
        seconds[f'{name}_rollouts_s'] = time.perf_counter() - start
    runs = []
    for method in methods:
        for seed in seeds:
            start = time.perf_counter()
            fit = fit_object(spec, method, train, validation, tosses.dt, seed=seed,
                             steps=steps, perturb=perturb, restarts=restarts,
                             choose=choose)
            train_s = time.perf_counter() - start
            nq = int(spec.model.nq)
            row = _evaluate(lambda x0, n: fit.predict(x0, n, tosses.dt)[..., :nq], tosses,
                            windows, test_i, horizon)
            runs.append({'method': method, 'seed': int(seed), 'errors': row,
                         'learned': fit.summary(), 'start': fit.start,
                         'last_step': int(fit.history['step'][-1]), 'train_s': train_s,
                         'validation_loss': min(fit.history['validation']),
                         'restarts': fit.extra.get('restarts'),
                         'rollouts_s': time.perf_counter() - start - train_s})
            if log is not None:
                log(f'{method} seed {seed}: 16-sample ' + ', '.join(
                    f'{key} {row["horizon"][key]["mean"]:.4g}' for key in ERROR_KEYS)
                    + f'; {train_s:.0f} s')
    for method in methods:
        mine = [r for r in runs if r['method'] == method]
        for window in errors:
            errors[window][method] = {key: cube_bench.t_interval(
                [r['errors'][window][key]['mean'] for r in mine]) for key in ERROR_KEYS}
    weights = spec.violation_weights()
    return {'train_tosses': n_train, 'seeds': [int(s) for s in seeds],
            'split_seed': split_seed, 'methods': list(methods),
            'validation_tosses': len(val_i), 'test_tosses': len(test_i),
            'train_toss_ids': [int(tosses.toss_ids[i]) for i in train_i],
            'test_toss_ids': [int(tosses.toss_ids[i]) for i in test_i],
            'train_transitions': sum(len(tosses.q[i]) - 2 for i in train_i),
            'dt': tosses.dt, 'horizon': horizon, 'window_stride': stride,
            'windows': len(windows), 'steps': steps,
            'start_from': 'paper' if perturb else 'nominal',
            'violation_weights': {'w_comp': weights.w_comp, 'w_pen': weights.w_pen},
            'smooth_window': spec.smooth_window, 'shape': spec.shape,
            'mass_split': spec.mass_split, 'restarts': restarts, 'choose': choose,
            'joint_damping': spec.joint_damping, 'runs': runs,
            'errors': errors, 'seconds': seconds}


#: The tosses ``contact_weights.py --object elbow`` judges on (the first of the unused ones).
SELECTION_TOSSES = 100


def fresh_indices(n_total: int, split_seed: int) -> np.ndarray:
    """
    Return the tosses no fit, early stop, test or choice of the elbow's has used.

    The split leaves the tosses between its largest training set and its validation tosses
    unused; the weight search (and every other choice of the elbow's settings) judged on the
    first :data:`SELECTION_TOSSES` of them; these are the rest.

    :param n_total: number of tosses.
    :param split_seed: the split's seed.
    :return: toss indices, in the split's order.
    """
    order = np.random.default_rng(split_seed).permutation(n_total)
    return order[LARGEST_TRAINING + SELECTION_TOSSES:n_total - TEST_TOSSES - VALIDATION_TOSSES]


def learned_models(spec: cl.ObjectSpec, learned: Dict[str, Any]):
    """
    Rebuild a learned elbow from a run's ``learned`` summary (``ObjectFit.summary``).

    :param spec: the elbow's spec.
    :param learned: ``inertial``, ``vertices_m``, ``vertex_sets``, ``friction``,
        ``ground_height_m`` (and ``damping``, where the summary has it).
    :return: ``(model, contact)``.
    """
    dtype = spec.model.inertial.dtype
    vertices = torch.split(torch.tensor(learned['vertices_m'], dtype=dtype),
                           [n for _, n in learned['vertex_sets']])
    theta = cl.object_parameters(vertices, learned['friction'],
                                 torch.tensor(learned['inertial'], dtype=dtype).reshape(-1, 10),
                                 learned['ground_height_m'])
    masses = torch.tensor(learned['inertial'], dtype=dtype).reshape(-1, 10)[:, 0].tolist()
    model, contact = cl.object_models(spec.model, spec.contact, theta, masses)
    if 'damping' in learned:   # runs from before the summary had it learned none
        model = model.replace(damping=torch.tensor(learned['damping'], dtype=dtype))
    return model, contact


def rescore(payload: Dict[str, Any], data: Path, stride: int,
            limit: Optional[int] = None) -> Dict[str, Any]:
    """
    Evaluate a run's learned models and the nominal rows again on :func:`fresh_indices`.

    Only methods whose fit is its physical parameters (CCN, DiffSim) can be rebuilt from the
    JSON; runs of other methods are left out.

    :param payload: :func:`run`'s (or :func:`combine`'s) result.
    :param data: the shared data root.
    :param stride: window stride.
    :param limit: only the first fresh tosses (a smoke run), or None for all.
    :return: a payload like :func:`run`'s on the fresh tosses (``runs`` without the fits'
        own fields, ``fresh_tosses`` the toss ids).
    """
    tosses = load_elbow_tosses(data)
    spec = elbow_spec(tosses)
    fresh = fresh_indices(len(tosses), payload['split_seed'])[:limit]
    horizon = payload['horizon']
    windows = horizon_windows(tosses, fresh, horizon, stride)
    nq = int(spec.model.nq)
    errors: Dict[str, Dict[str, Any]] = {'horizon': {}, 'full': {}}
    for name, predict in nominal_predictors(spec, tosses).items():
        for window, rows in _evaluate(predict, tosses, windows, fresh, horizon).items():
            errors[window][name] = rows
    methods = [m for m in payload['methods'] if m in ('ccn', 'diffsim')]
    runs = []
    for run in payload['runs']:
        if run['method'] not in methods:
            continue
        model, contact = learned_models(spec, run['learned'])
        runs.append({'method': run['method'], 'seed': run['seed'],
                     'learned': run['learned'], 'start': run['start'],
                     'last_step': run['last_step'],
                     'errors': _evaluate(lambda x0, n: cl.rollout(model, contact, x0, n,
                                                                  tosses.dt)[..., :nq],
                                         tosses, windows, fresh, horizon)})
    for method in methods:
        mine = [r for r in runs if r['method'] == method]
        for window in errors:
            errors[window][method] = {key: cube_bench.t_interval(
                [r['errors'][window][key]['mean'] for r in mine]) for key in ERROR_KEYS}
    return dict(payload, methods=methods, runs=runs, errors=errors, windows=len(windows),
                window_stride=stride, test_tosses=len(fresh),
                fresh_tosses=[int(tosses.toss_ids[i]) for i in fresh],
                rescored_from='the test tosses')


def combine(payloads: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """
    Merge runs made on the same split: one process per method, or per group of seeds.

    :param payloads: :func:`run`'s results.
    :return: one payload: every run and method row, the nominal rows of the first, the CCN
        weights of the first that fitted a violation-loss method; a method run in several
        processes (other seeds, the same settings) gets its rows from all its runs.
    :raises ValueError: when the runs differ in test tosses, windows or training tosses,
        repeat a method's seed, or run one method with different settings.
    """
    first = payloads[0]
    same = ('test_toss_ids', 'train_toss_ids', 'horizon', 'window_stride', 'windows',
            'smooth_window')
    for other in payloads[1:]:
        if any(other.get(key, 1) != first.get(key, 1) for key in same):
            raise ValueError('cannot combine runs on different tosses or windows '
                             f'({", ".join(same)} must agree)')
    methods = list(dict.fromkeys(m for p in payloads for m in p['methods']))
    pairs = [(r['method'], r['seed']) for p in payloads for r in p['runs']]
    if len(set(pairs)) != len(pairs):
        raise ValueError(f'methods and seeds repeated across the runs: {pairs}')
    settings = ('steps', 'start_from', 'violation_weights', 'shape', 'mass_split', 'restarts',
                'choose', 'train_tosses', 'joint_damping')
    for method in methods:
        mine = [p for p in payloads if method in p['methods']]
        if any(p.get(key) != mine[0].get(key) for p in mine[1:] for key in settings):
            raise ValueError(f'{method} was run with different settings '
                             f'({", ".join(settings)} must agree)')
    violation = [p for p in payloads if set(p['methods']) & {'ccn', 'ccn-r'}]
    out = dict(first, methods=methods, runs=[r for p in payloads for r in p['runs']],
               seeds=sorted({s for p in payloads for s in p['seeds']}),
               violation_weights=(violation or [first])[0]['violation_weights'],
               combined_from=len(payloads))
    out['errors'] = {window: dict(rows) for window, rows in first['errors'].items()}
    for other in payloads[1:]:
        for window, rows in other['errors'].items():
            out['errors'][window].update({m: rows[m] for m in other['methods']})
    for method in methods:
        if sum(method in p['methods'] for p in payloads) > 1:   # seeds split over processes
            mine = [r for r in out['runs'] if r['method'] == method]
            for window in out['errors']:
                out['errors'][window][method] = {key: cube_bench.t_interval(
                    [r['errors'][window][key]['mean'] for r in mine]) for key in ERROR_KEYS}
    return out


def _cell(stats: Dict[str, Any], scale: float) -> str:
    # A method's mean over seeds (± the 95 % half-width), or a nominal's mean / median / p90.
    if 'half_width' not in stats:
        return ' / '.join(toss_bench._cells(stats, scale))
    text = _common.fmt_number(stats['mean'] * scale)
    if stats['half_width'] is not None:
        text += ' ± ' + _common.fmt_number(stats['half_width'] * scale)
    return text


def markdown(payload: Dict[str, Any]) -> str:
    """Return the horizon and full-length tables (mm and degrees) and the learned numbers."""
    weights = payload['violation_weights']
    lines = [f'N = {payload["train_tosses"]} training tosses, seeds {payload["seeds"]}, '
             f'start {payload["start_from"]}, CCN weights w_comp {weights["w_comp"]:g} w_pen '
             f'{weights["w_pen"]:g}, training tosses smoothed over '
             f'{payload.get("smooth_window", 1)} samples, {payload["test_tosses"]} test tosses '
             f'({payload["windows"]} windows of {payload["horizon"]} samples)', '']
    for run in payload['runs']:
        learned, start = run['learned'], run['start']
        if learned:
            lines.append(f'- {run["method"]} seed {run["seed"]}: volume error '
                         f'{learned["volume_error"]:.3f} (start {start["volume_error"]:.3f}), '
                         f'friction {learned["friction"]:.3f} (start {start["friction"]:.3f}), '
                         f'ground {1e3 * learned["ground_height_m"]:.1f} mm, masses '
                         + ' / '.join(f'{m:.3f}' for m in learned['inertial'][::10])
                         + f' kg, last step {run["last_step"]}')
    lines.append('')
    for window, title in (('horizon', f'{payload["horizon"]}-sample horizon'),
                          ('full', 'full length')):
        lines += [f'{title}: learned methods, the mean over tosses then mean ± 95 % t '
                  'half-width over seeds; nominal rows, the per-toss mean then mean / median / '
                  'p90 over tosses', '',
                  '| model | position mm | orientation deg | hinge deg |', '|---|---|---|---|']
        for name, row in payload['errors'][window].items():
            cells = [_cell(row[key], scale)
                     for key, scale in (('position_m', 1e3), ('orientation_rad', 180 / np.pi),
                                        ('hinge_rad', 180 / np.pi))]
            lines.append(f'| {name} | ' + ' | '.join(cells) + ' |')
        lines.append('')
    return '\n'.join(lines)


def add_start_options(parser) -> None:
    """
    Add ``--mass-split``, ``--joint-damping``, ``--restarts`` and ``--choose-by``.

    What the object's spec and ``fit_object`` take.

    :param parser: an ``argparse.ArgumentParser``.
    """
    parser.add_argument('--mass-split', choices=('fixed', 'learned'), default=None,
                        help='whether CCN learns how the total mass splits between the '
                             "bodies (default the object spec's, ObjectSpec.mass_split)")
    parser.add_argument('--joint-damping', choices=('none', 'learned'), default=None,
                        help="whether CCN learns a viscous damping of the object's joints "
                             "(the elbow's hinge), applied in the loss and the rollouts "
                             "(default the object spec's, ObjectSpec.joint_damping)")
    parser.add_argument('--restarts', type=int, default=1,
                        help='starts per fit, keeping the one the validation tosses rank first '
                             '(--choose-by; sysid.object_learning.fit_object; default 1)')
    parser.add_argument('--choose-by', choices=RESTART_CRITERIA, default='rollout',
                        help='how --restarts are ranked on the validation tosses: the '
                             "method's own loss, or 16-sample rollouts (default: rollout)")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """
    Run the benchmark and print markdown tables.

    :param argv: command-line arguments (``sys.argv[1:]`` when None).
    :return: process exit status.
    """
    parser = _common.make_parser(__doc__.strip().splitlines()[0])
    parser.add_argument('--data', default=None, help='shared data root (holding INDEX.md)')
    parser.add_argument('--train-tosses', type=int, default=16, help='N training tosses')
    parser.add_argument('--seeds', type=int, default=1,
                        help='fits per method, seeds 0 .. K-1 (the initialisation and the '
                             'mini-batches); with K > 1 the tables give 95 %% t-intervals')
    parser.add_argument('--first-seed', type=int, default=0,
                        help='seeds FIRST .. FIRST + K - 1 (default 0): one process per group '
                             'of seeds, merged by --combine')
    parser.add_argument('--split-seed', type=int, default=0,
                        help='seed of the train/validation/test split (keep it fixed)')
    parser.add_argument('--test-tosses', type=int, default=TEST_TOSSES,
                        help=f'held-out test tosses (default {TEST_TOSSES})')
    parser.add_argument('--validation-tosses', type=int, default=VALIDATION_TOSSES,
                        help=f'tosses for early stopping (default {VALIDATION_TOSSES})')
    parser.add_argument('--steps', type=int, default=400, help='maximum Adam steps')
    parser.add_argument('--horizon', type=int, default=HORIZON,
                        help=f'samples predicted per window (default {HORIZON}, as the paper)')
    parser.add_argument('--window-stride', type=int, default=1,
                        help='start a window at every n-th sample (default 1: every sample)')
    parser.add_argument('--start', choices=('paper', 'nominal'), default='paper',
                        help='paper: 0.5-1.5x the URDF, random box inertias (appendix A.4, '
                             'default); nominal: the URDF itself')
    parser.add_argument('--methods', '--method', default='ccn',
                        help='comma-separated learning methods, of '
                             f'{", ".join(METHODS)} (sysid.object_learning.METHODS)')
    parser.add_argument('--smooth-window', type=int, default=None,
                        help='odd samples of the local polynomial fits that the training and '
                             'validation tosses are smoothed with before learning, for every '
                             "method (1: as recorded; default: the elbow spec's, "
                             'io.object_urdf.ELBOW_SMOOTH_WINDOW); test tosses stay as recorded')
    parser.add_argument('--shape', choices=cl.SHAPES, default=None,
                        help='how CCN and CCN-R learn the geometry: every corner free '
                             "('vertices') or each link's box ('boxes'); default the elbow "
                             "spec's (ObjectSpec.shape)")
    add_start_options(parser)
    parser.add_argument('--rescore', metavar='JSON', default=None,
                        help="evaluate a run's learned CCN / DiffSim models (from its --json) "
                             'and the nominal rows on the tosses no fit, test or choice of the '
                             "elbow's has used (the split's unused tosses after the weight "
                             "search's first 100) instead of running")
    parser.add_argument('--combine', metavar='JSON', nargs='+', default=None,
                        help='merge the --json files of runs on the same split (one per '
                             'method) into one table instead of running')
    args = parser.parse_args(argv)
    if args.rescore:
        torch.set_num_threads(args.threads)
        payload = rescore(json.loads(Path(args.rescore).read_text(encoding='utf-8')),
                          _common.data_root(args.data, 'elbow_learning.py'),
                          args.window_stride, limit=3 if args.quick else None)
        print(markdown(payload))
        if args.json:
            _common.write_json(args.json, payload)
        return 0
    if args.combine:
        payload = combine([json.loads(Path(p).read_text(encoding='utf-8'))
                           for p in args.combine])
        print(markdown(payload))
        if args.json:
            _common.write_json(args.json, payload)
        return 0
    torch.set_num_threads(args.threads)
    data = _common.data_root(args.data, 'elbow_learning.py')
    methods = [m.strip() for m in args.methods.split(',') if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        parser.error(f'--methods {args.methods!r}: valid {", ".join(METHODS)}')
    log = (lambda line: print(line, file=sys.stderr, flush=True))
    split = None if args.mass_split is None else args.mass_split == 'learned'
    damping = None if args.joint_damping is None else args.joint_damping == 'learned'
    if args.quick:
        payload = run(data, min(args.train_tosses, 2), range(min(args.seeds, 2)), 2, 3, 6,
                      args.horizon, max(args.window_stride, 8), args.split_seed, limit=40,
                      perturb=args.start == 'paper', methods=methods, log=log,
                      smooth_window=args.smooth_window, shape=args.shape,
                      mass_split=split, restarts=args.restarts,
                      choose=args.choose_by, joint_damping=damping)
    else:
        payload = run(data, args.train_tosses,
                      range(args.first_seed, args.first_seed + args.seeds),
                      args.validation_tosses,
                      args.test_tosses, args.steps, args.horizon, args.window_stride,
                      args.split_seed, perturb=args.start == 'paper', methods=methods,
                      log=log, smooth_window=args.smooth_window, shape=args.shape,
                      mass_split=split, restarts=args.restarts,
                      choose=args.choose_by, joint_damping=damping)
    payload['machine'] = _common.machine_info(('torch', 'mujoco', 'scipy'))
    payload['quick'] = args.quick
    print(markdown(payload))
    if args.json:
        _common.write_json(args.json, payload)
    return 0


if __name__ == '__main__':
    sys.exit(main())
