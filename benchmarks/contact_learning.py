"""
Learning curves on the real cube tosses: every method of METHODS against training-set size.

Tosses come from ``diffsim_ros.io.tosses.load_cube_tosses`` in recorded order, split once by a
permutation drawn from ``--split-seed``: the last ``--test-tosses`` are the held-out test set
(the same for every method, size and seed), the ``--validation-tosses`` before them are used
only for early stopping, and the first N of the rest are the training tosses of size N (so a
smaller training set is a subset of a larger one). For each method (``--methods``, the keys of
``sysid.object_learning.METHODS``), size (``--sizes``) and seed (``--seeds K``: seeds
``--seed .. --seed + K - 1``, the random initialisation: the physical methods start 0.5-1.5x
the nominal cube, inertia from a randomly rotated box, mass fixed at 0.37 kg; the MLP's
weights) the method is fitted through ``fit_object`` and rolled out on the test tosses from
their second recorded sample to the end. Errors per run: the mean over test tosses of each
toss's mean position error [m] and geodesic orientation error [rad]; the learned volume error
(exact convex-hull intersection, the paper's 13a), friction error (against the nominal 0.18)
and normalised inertia error (13c); physical parameters are None for the MLP. Per method and
size: the mean over seeds and its 95 % Student-t interval. Beside them, in the same run on the
same test tosses, our contact step and MuJoCo with the nominal cube (``benchmarks/tosses.py``).
"""

import json
import math
import os
from pathlib import Path
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch

try:
    from benchmarks import _common, tosses as toss_bench
except ImportError:  # run as ``python benchmarks/contact_learning.py``
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks import _common, tosses as toss_bench

from diffsim_ros import core  # noqa: I100
from diffsim_ros.io.tosses import CUBE_HALF_WIDTH_M, load_cube_tosses
from diffsim_ros.sysid import contact_learning as cl
from diffsim_ros.sysid.object_learning import fit_object, METHODS

MASS_KG = 0.37
#: Per-run metrics, in the order of the table and the figure's rows.
METRICS = ('position_m', 'orientation_rad', 'volume_error', 'friction_error', 'inertia_error')
DEFAULT_SIZES = (2, 4, 8, 16, 32, 64, 128, 256)
#: The fixed held-out sets of the default split (``--test-tosses``, ``--validation-tosses``).
TEST_TOSSES, VALIDATION_TOSSES = 50, 16


def split(n_total: int, n_train: int, n_val: int, n_test: int, seed: int):
    """
    Return train, validation and test indices of a fixed permutation.

    :param n_total: number of tosses.
    :param n_train: the largest training set wanted (its first N are any smaller one).
    :param n_val: validation tosses.
    :param n_test: test tosses.
    :param seed: seed of the permutation.
    :return: ``(train, validation, test)`` index arrays.
    :raises ValueError: when the training set does not fit beside the others.
    """
    order = np.random.default_rng(seed).permutation(n_total)
    test = order[n_total - n_test:]
    val = order[n_total - n_test - n_val:n_total - n_test]
    if n_train > n_total - n_test - n_val:
        raise ValueError(f'{n_train} training tosses: only {n_total - n_test - n_val} tosses '
                         'remain outside the test and validation sets')
    return order[:n_train], val, test


def t_interval(values: Sequence[Optional[float]], level: float = 0.95) -> Dict[str, Any]:
    """
    Return the mean of ``values`` and its two-sided Student-t confidence interval.

    :param values: one number per seed (None entries, a method without that metric, are
        dropped).
    :param level: confidence level.
    :return: ``mean``, ``half_width``, ``lower``, ``upper`` (None where undefined: no value,
        or one value for the interval) and ``n``.
    """
    from scipy import stats
    x = np.asarray([v for v in values if v is not None], float)
    if len(x) == 0:
        return {'mean': None, 'half_width': None, 'lower': None, 'upper': None, 'n': 0}
    mean = float(x.mean())
    if len(x) < 2:
        return {'mean': mean, 'half_width': None, 'lower': None, 'upper': None, 'n': 1}
    half = float(stats.t.ppf(0.5 + level / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return {'mean': mean, 'half_width': half, 'lower': mean - half, 'upper': mean + half,
            'n': int(len(x))}


def _test_errors(predicted: List[torch.Tensor], recorded: List[torch.Tensor]) -> Dict[str, Any]:
    per_toss = cl.rollout_errors(predicted, recorded)
    return {key: float(np.mean(value)) for key, value in per_toss.items()}


def _nominal(tosses, model, spec, x0, lengths, recorded) -> Dict[str, Any]:
    nominal = core.ContactModel.create(friction=tosses.friction,
                                       restitution=tosses.restitution or 0.0,
                                       vertex_links=(model.link_names[0],),
                                       vertices=(spec.true_vertices[0],))
    batch = cl.rollout(model, nominal, x0, max(lengths), tosses.dt)
    out = {'ours_nominal': _test_errors([batch[k, :n, :7] for k, n in enumerate(lengths)],
                                        recorded)}
    mj_model = toss_bench.mujoco_model(tosses, tosses.dt / toss_bench.CONTACT_SUBSTEPS,
                                       contact=True)
    runs = [toss_bench.rollout_mujoco(mj_model, x0[k:k + 1], n, toss_bench.CONTACT_SUBSTEPS)[0]
            for k, n in enumerate(lengths)]
    out['mujoco_nominal'] = _test_errors(runs, recorded)
    for row in out.values():
        row.update(volume_error=0.0, friction_error=0.0, inertia_error=0.0)
    return out


def run(data: Path, methods: Sequence[str], sizes: Sequence[int], seeds: Sequence[int],
        n_val: int, n_test: int, steps: int, split_seed: int = 0,
        limit: Optional[int] = None, log=None) -> Dict[str, Any]:
    """
    Fit every method at every size and seed and evaluate it on the fixed test set.

    :param data: the shared data root.
    :param methods: keys of ``METHODS``.
    :param sizes: training-set sizes.
    :param seeds: initialisation seeds.
    :param n_val: validation tosses.
    :param n_test: test tosses.
    :param steps: maximum optimiser steps per fit (``fit_object``'s units).
    :param split_seed: seed of the split.
    :param limit: read only the first ``limit`` tosses.
    :param log: called with a line after each fit (progress), or None.
    :return: the JSON payload (``runs``, ``curves``, ``nominal`` ...).
    """
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f'unknown methods {unknown}; valid: {", ".join(METHODS)}')
    tosses = load_cube_tosses(data, limit=limit)
    train_i, val_i, test_i = split(len(tosses), max(sizes), n_val, n_test, split_seed)
    model = toss_bench.floating_model(tosses)
    spec = cl.cube_spec(model, CUBE_HALF_WIDTH_M, tosses.friction, MASS_KG)
    x0 = torch.stack([torch.cat((tosses.q[i][1], tosses.v[i][1])) for i in test_i])
    lengths = [len(tosses.q[i]) - 2 for i in test_i]
    recorded = [tosses.q[i][2:] for i in test_i]
    start = time.perf_counter()
    nominal = _nominal(tosses, model, spec, x0, lengths, recorded)
    nominal_s = time.perf_counter() - start
    validation = ([tosses.q[i] for i in val_i], [tosses.v[i] for i in val_i])
    runs = []
    for method in methods:
        for size in sizes:
            train = ([tosses.q[i] for i in train_i[:size]], [tosses.v[i] for i in train_i[:size]])
            for seed in seeds:
                start = time.perf_counter()
                fit = fit_object(spec, method, train, validation, tosses.dt, seed=seed,
                                 steps=steps)
                train_s = time.perf_counter() - start
                batch = fit.predict(x0, max(lengths), tosses.dt)
                row = _test_errors([batch[k, :n, :7] for k, n in enumerate(lengths)],
                                   recorded)
                summary = fit.summary()
                row.update({key: summary.get(key) for key in METRICS[2:]})
                row.update(method=method, size=int(size), seed=int(seed),
                           train_s=train_s, last_step=int(fit.history['step'][-1]),
                           friction=summary.get('friction'))
                runs.append(row)
                if log is not None:
                    log(f'{method} N={size} seed={seed}: position '
                        f'{1e3 * row["position_m"]:.1f} mm, orientation '
                        f'{math.degrees(row["orientation_rad"]):.1f} deg, {train_s:.0f} s')
    curves = {method: {str(size): {
        metric: t_interval([r[metric] for r in runs
                            if r['method'] == method and r['size'] == size])
        for metric in METRICS} for size in sizes} for method in methods}
    return {'methods': list(methods), 'sizes': [int(s) for s in sizes],
            'seeds': [int(s) for s in seeds], 'split_seed': split_seed,
            'validation_tosses': len(val_i), 'test_tosses': len(test_i),
            'test_toss_ids': [int(tosses.toss_ids[i]) for i in test_i],
            'dt': tosses.dt, 'steps': steps, 'metrics': list(METRICS),
            'nominal': nominal, 'runs': runs, 'curves': curves,
            'seconds': {'nominal_s': nominal_s,
                        'fits_s': float(sum(r['train_s'] for r in runs))}}


_SCALE = {'position_m': (1e3, 'position mm'),
          'orientation_rad': (180 / math.pi, 'orientation deg'),
          'volume_error': (1.0, 'volume err'), 'friction_error': (1.0, 'friction err'),
          'inertia_error': (1.0, 'inertia err')}


def _cell(stats: Dict[str, Any], scale: float) -> str:
    if stats['mean'] is None:
        return '-'
    text = _common.fmt_number(stats['mean'] * scale)
    if stats['half_width'] is not None:
        text += ' ± ' + _common.fmt_number(stats['half_width'] * scale)
    return text


def markdown(payload: Dict[str, Any]) -> str:
    """Return the learning curves as one markdown table (mean ± 95 % t half-width)."""
    headers = ['method', 'N'] + [_SCALE[m][1] for m in METRICS]
    rows = []
    for method, curve in payload['curves'].items():
        for size, stats in curve.items():
            rows.append([method, size] + [_cell(stats[m], _SCALE[m][0]) for m in METRICS])
    for name, row in payload['nominal'].items():
        rows.append([name, '-'] + [_common.fmt_number(row[m] * _SCALE[m][0])
                                   for m in METRICS])
    head = (f'{payload["test_tosses"]} test tosses, seeds {payload["seeds"]}, '
            f'mean ± 95 % t half-width over seeds\n\n')
    return head + _common.format_markdown_table(headers, rows) + '\n'


def plot(payload: Dict[str, Any], path: str) -> None:
    """
    Draw the learning curves like a column of the paper's Fig. 4 (one row per metric).

    :param payload: what :func:`run` returns.
    :param path: the PNG to write.
    """
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(METRICS), 1, figsize=(5, 2.2 * len(METRICS)), sharex=True)
    for ax, metric in zip(axes, METRICS):
        scale, label = _SCALE[metric]
        for method, curve in payload['curves'].items():
            sizes = [int(s) for s, st in curve.items() if st[metric]['mean'] is not None]
            if not sizes:
                continue
            stats = [curve[str(s)][metric] for s in sizes]
            mean = np.array([s['mean'] for s in stats]) * scale
            half = np.array([s['half_width'] or 0.0 for s in stats]) * scale
            line, = ax.plot(sizes, mean, marker='o', label=method)
            ax.fill_between(sizes, mean - half, mean + half, color=line.get_color(),
                            alpha=0.2)
        if metric in ('position_m', 'orientation_rad'):
            for (name, row), style in zip(payload['nominal'].items(), ('--', ':', '-.')):
                ax.axhline(row[metric] * scale, color='k', linestyle=style, label=name)
        ax.set_ylabel(label)
        ax.set_xscale('log', base=2)
    axes[0].legend(fontsize=7)
    axes[-1].set_xlabel('training tosses')
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def combine(payloads: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """
    Merge runs of the same split made in separate processes (a sweep run in parallel).

    :param payloads: :func:`run` payloads with the same test tosses.
    :return: one payload whose curves hold every method.
    :raises ValueError: when the test sets differ.
    """
    first = payloads[0]
    for other in payloads[1:]:
        if other['test_toss_ids'] != first['test_toss_ids']:
            raise ValueError('cannot combine runs on different test tosses')
    out = dict(first)
    out['runs'] = [r for p in payloads for r in p['runs']]
    out['curves'] = {m: c for p in payloads for m, c in p['curves'].items()}
    out['methods'] = list(out['curves'])
    out['sizes'] = sorted({s for p in payloads for s in p['sizes']})
    out['seeds'] = sorted({s for p in payloads for s in p['seeds']})
    out['seconds'] = {'nominal_s': first['seconds']['nominal_s'],
                      'fits_s': float(sum(r['train_s'] for r in out['runs']))}
    return out


def _ints(text: str) -> List[int]:
    return [int(x) for x in text.split(',') if x.strip()]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """
    Run the learning-curve benchmark and print a markdown table.

    :param argv: command-line arguments (``sys.argv[1:]`` when None).
    :return: process exit status.
    """
    parser = _common.make_parser(__doc__.strip().splitlines()[0])
    parser.add_argument('--data', default=None, help='shared data root (holding INDEX.md)')
    parser.add_argument('--methods', default=','.join(METHODS),
                        help=f'comma-separated methods (default: all of {", ".join(METHODS)})')
    parser.add_argument('--sizes', default=','.join(map(str, DEFAULT_SIZES)),
                        help='comma-separated training-set sizes (tosses)')
    parser.add_argument('--train-tosses', type=int, default=None,
                        help='one training-set size (overrides --sizes)')
    parser.add_argument('--seeds', type=int, default=3,
                        help='random initialisations per method and size')
    parser.add_argument('--seed', type=int, default=0, help='the first initialisation seed')
    parser.add_argument('--split-seed', type=int, default=0,
                        help='seed of the train/validation/test split (keep it fixed)')
    parser.add_argument('--test-tosses', type=int, default=TEST_TOSSES,
                        help='held-out test tosses')
    parser.add_argument('--validation-tosses', type=int, default=VALIDATION_TOSSES,
                        help='tosses for early stopping')
    parser.add_argument('--steps', type=int, default=400,
                        help='maximum optimiser steps per fit (the MLP takes 10x as many)')
    parser.add_argument('--plot', metavar='PATH', default=None,
                        help='write the learning curves as a PNG')
    parser.add_argument('--combine', metavar='JSON', nargs='+', default=None,
                        help='fit nothing: merge the --json files of runs on the same split '
                             '(a sweep split over processes) and print, write and plot them')
    args = parser.parse_args(argv)
    if args.combine:
        payload = combine([json.loads(Path(p).read_text(encoding='utf-8'))
                           for p in args.combine])
        return _report(payload, args)
    torch.set_num_threads(args.threads)
    data = _common.data_root(args.data, 'contact_learning.py')
    methods = [m.strip() for m in args.methods.split(',') if m.strip()]
    sizes = [args.train_tosses] if args.train_tosses else _ints(args.sizes)
    if args.quick:
        sizes = [min(args.train_tosses, 4)] if args.train_tosses else [2, 4]
        seeds = list(range(args.seed, args.seed + min(args.seeds, 2)))
        payload = run(data, methods, sizes, seeds, 2, 4, 5, args.split_seed, limit=30,
                      log=lambda line: print(line, file=sys.stderr))
    else:
        seeds = list(range(args.seed, args.seed + args.seeds))
        payload = run(data, methods, sizes, seeds, args.validation_tosses, args.test_tosses,
                      args.steps, args.split_seed, log=lambda line: print(line, file=sys.stderr))
    payload['machine'] = _common.machine_info(('torch', 'mujoco', 'scipy'))
    payload['quick'] = args.quick
    return _report(payload, args)


def _report(payload: Dict[str, Any], args) -> int:
    print(markdown(payload))
    if args.json:
        _common.write_json(args.json, payload)
    if args.plot:
        plot(payload, args.plot)
    return 0


if __name__ == '__main__':
    sys.exit(main())
