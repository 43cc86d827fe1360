"""
Choose CCN's violation weights on real tosses of one object held out for the choice.

The violation loss's ``w_comp`` and ``w_pen`` (``sysid.contact_learning.ViolationWeights``)
are hyperparameters: the paper chose Table 2's by a search on its own data and code, and read
in our SI units they fail (see ``ViolationWeights``). This is that search, per object
(``--object``), on tosses that neither its benchmark's training, validation nor test tosses
use. The cube: the split of ``benchmarks/contact_learning.py`` (``--split-seed``, its 50 test
and 16 validation tosses and up to 256 training tosses) leaves about 250 tosses unused. The
elbow: the split of ``benchmarks/elbow_learning.py`` (its 20 test and 8 validation tosses and
up to 256 training tosses) leaves 257. The first ``--selection-tosses`` of them judge. For
every pair of the grid ``--w-comp`` x ``--w-pen`` and every seed, CCN learns from the first
``--train-tosses`` training tosses (perturbed start, ground held, early stopping on the
validation tosses) and is rolled out on the selection tosses as the object's benchmark
measures it: the cube from the second sample to the end (position and orientation errors),
the elbow over 16-sample horizons from every 4th sample (position, orientation and hinge
errors). Score of a run: the sum over those errors of its error over our step's with the
nominal object on the same tosses; a pair's score is the mean over seeds; the lowest wins.
Volume and inertia errors are printed beside, never used to choose.
"""

import dataclasses
from dataclasses import dataclass
import itertools
import math
import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import torch

try:
    from benchmarks import _common, contact_learning as curves, elbow_learning as elbow
    from benchmarks import tosses as toss_bench
except ImportError:  # run as ``python benchmarks/contact_weights.py``
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks import _common, contact_learning as curves, elbow_learning as elbow
    from benchmarks import tosses as toss_bench

from diffsim_ros.io.object_urdf import elbow_spec  # noqa: I100
from diffsim_ros.io.tosses import CUBE_HALF_WIDTH_M, load_cube_tosses, load_elbow_tosses
from diffsim_ros.sysid import contact_learning as cl
from diffsim_ros.sysid.object_learning import fit_object, horizon_error

#: The elbow's selection windows start at every 4th sample (as its benchmark's tables).
ELBOW_WINDOW_STRIDE = 4


def selection_indices(n_total: int, n_train: int, n_val: int, n_test: int, n_select: int,
                      seed: int) -> np.ndarray:
    """
    Return the tosses the choice is judged on: the split's unused ones, in its order.

    :param n_total: number of tosses.
    :param n_train: the largest training set of the benchmark (256).
    :param n_val: its validation tosses.
    :param n_test: its test tosses.
    :param n_select: how many to take.
    :param seed: the split's seed.
    :return: indices disjoint from the split's training, validation and test tosses.
    :raises ValueError: when fewer than ``n_select`` tosses are unused.
    """
    curves.split(n_total, n_train, n_val, n_test, seed)   # checks that the split fits
    order = np.random.default_rng(seed).permutation(n_total)
    unused = order[n_train:n_total - n_test - n_val]
    if len(unused) < n_select:
        raise ValueError(f'{n_select} selection tosses asked, {len(unused)} unused')
    return unused[:n_select]


@dataclass
class Judge:
    """
    One object's tosses, its benchmark's split, and how a learned model is scored.

    :ivar tosses: the object's tosses.
    :ivar spec: its nominal spec (the start of every fit).
    :ivar train: the benchmark's training indices (the first N train a fit).
    :ivar validation: its validation indices (early stopping).
    :ivar select: the selection tosses (:func:`selection_indices`).
    :ivar errors: ``(model, contact) -> {error key: mean over selection tosses}``.
    :ivar nominal: ``errors`` of our contact step with the nominal object.
    """

    tosses: Any
    spec: cl.ObjectSpec
    train: np.ndarray
    validation: np.ndarray
    select: np.ndarray
    errors: Callable[[Any, Any], Dict[str, float]]
    nominal: Dict[str, float]


def cube_judge(data, n_select: int, split_seed: int) -> Judge:
    """
    Return the cube's judge: full-length rollouts, nominal with ContactNets' restitution.

    :param data: the shared data root.
    :param n_select: selection tosses.
    :param split_seed: ``benchmarks/contact_learning.py``'s split seed.
    :return: the judge (errors ``position_m``, ``orientation_rad``).
    """
    tosses = load_cube_tosses(data)
    split = (max(curves.DEFAULT_SIZES), curves.VALIDATION_TOSSES, curves.TEST_TOSSES)
    train_i, val_i, _ = curves.split(len(tosses), *split, split_seed)
    select = selection_indices(len(tosses), *split, n_select, split_seed)
    model = toss_bench.floating_model(tosses)
    spec = cl.cube_spec(model, CUBE_HALF_WIDTH_M, tosses.friction, curves.MASS_KG)
    x0 = torch.stack([torch.cat((tosses.q[i][1], tosses.v[i][1])) for i in select])
    lengths = [len(tosses.q[i]) - 2 for i in select]
    recorded = [tosses.q[i][2:] for i in select]

    def errors(m, c) -> Dict[str, float]:
        batch = cl.rollout(m, c, x0, max(lengths), tosses.dt)
        return curves._test_errors([batch[k, :n, :7] for k, n in enumerate(lengths)],
                                   recorded)

    nominal = curves._nominal(tosses, model, spec, x0, lengths, recorded)['ours_nominal']
    return Judge(tosses, spec, train_i, val_i, select, errors,
                 {k: nominal[k] for k in ('position_m', 'orientation_rad')})


def elbow_judge(data, n_select: int, split_seed: int) -> Judge:
    """
    Return the elbow's judge: 16-sample horizons from every 4th sample, nominal URDF.

    :param data: the shared data root.
    :param n_select: selection tosses.
    :param split_seed: ``benchmarks/elbow_learning.py``'s split seed.
    :return: the judge (errors ``position_m``, ``orientation_rad``, ``hinge_rad``: the
        mean over tosses of each toss's window mean).
    """
    tosses = load_elbow_tosses(data)
    split = (elbow.LARGEST_TRAINING, elbow.VALIDATION_TOSSES, elbow.TEST_TOSSES)
    train_i, val_i, _ = curves.split(len(tosses), *split, split_seed)
    select = selection_indices(len(tosses), *split, n_select, split_seed)
    spec = elbow_spec(tosses)
    windows = elbow.horizon_windows(tosses, select, elbow.HORIZON, ELBOW_WINDOW_STRIDE)

    def errors(m, c) -> Dict[str, float]:
        return elbow.horizon_means(m, c, tosses, windows)

    return Judge(tosses, spec, train_i, val_i, select, errors,
                 errors(spec.model, spec.contact))


#: ``--object`` -> its judge.
JUDGES: Dict[str, Callable[[Any, int, int], Judge]] = {
    'cube': cube_judge, 'elbow': elbow_judge}


def run(data, w_comps: Sequence[float], w_pens: Sequence[float], seeds: Sequence[int],
        n_train: int, n_select: int, steps: int, split_seed: int = 0,
        log=None, object_name: str = 'cube',
        smooth_windows: Sequence[int] = (1,),
        impact_jumps: Sequence[Optional[float]] = (None,),
        shape: Optional[str] = None,
        mass_split: Optional[bool] = None, restarts: int = 1,
        choose: str = 'rollout', joint_damping: Optional[bool] = None) -> Dict[str, Any]:
    """
    Learn CCN for every pair and seed and score it on the selection tosses.

    :param data: the shared data root.
    :param w_comps: complementarity weights [1/s].
    :param w_pens: penetration weights [J/m^2].
    :param seeds: initialisation seeds.
    :param n_train: training tosses.
    :param n_select: selection tosses.
    :param steps: maximum Adam steps per fit.
    :param split_seed: the object's benchmark's split seed.
    :param log: called with a line per fit, or None.
    :param object_name: a key of :data:`JUDGES`.
    :param smooth_windows: local polynomial windows the training and validation tosses are
        smoothed with (``sysid.object_learning.smooth_for_learning``; 1: as recorded), a third
        axis of the grid; the selection tosses are judged as recorded.
    :param impact_jumps: ``ObjectSpec.impact_jump`` values (None: windows span impacts), a
        fourth axis.
    :param shape: ``ObjectSpec.shape`` CCN learns (None: the object's own).
    :param mass_split: ``ObjectSpec.mass_split``, whether CCN learns how the mass splits
        between the bodies (None: the object's own).
    :param restarts: starts per fit, the lowest validation loss kept
        (``sysid.object_learning.fit_object``'s ``restarts``).
    :param choose: how the restarts are ranked (``fit_object``'s ``choose``).
    :param joint_damping: ``ObjectSpec.joint_damping``, whether CCN learns the joints'
        viscous damping (None: the object's own).
    :return: the JSON payload (``runs``, ``pairs``, ``chosen``, ``nominal``, ``object``).
    """
    judge = JUDGES[object_name](data, n_select, split_seed)
    tosses, keys = judge.tosses, tuple(judge.nominal)
    runs = []
    for window, impact_jump in itertools.product(smooth_windows, impact_jumps):
        spec = dataclasses.replace(
            judge.spec, smooth_window=window, impact_jump=impact_jump,
            shape=shape or judge.spec.shape,
            mass_split=judge.spec.mass_split if mass_split is None else mass_split,
            joint_damping=(judge.spec.joint_damping if joint_damping is None
                           else joint_damping))
        train = ([tosses.q[i] for i in judge.train[:n_train]],
                 [tosses.v[i] for i in judge.train[:n_train]])
        validation = ([tosses.q[i] for i in judge.validation],
                      [tosses.v[i] for i in judge.validation])
        for w_comp in w_comps:
            for w_pen in w_pens:
                for seed in seeds:
                    row = _fit_and_score(judge, spec, train, validation, w_comp, w_pen, seed,
                                         steps, restarts, choose)
                    row['smooth_window'] = window
                    row['impact_jump'] = impact_jump
                    runs.append(row)
                    if log is not None:
                        log(f'smooth {window} impact jump {impact_jump} w_comp {w_comp:g} '
                            f'w_pen {w_pen:g} seed {seed}: '
                            f'score {row["score"]:.3f}, ' + _errors_text(row, keys)
                            + f', volume error {row["volume_error"]:.3f}, friction '
                            f'{row["friction"]:.3f}, masses '
                            + ' / '.join(f'{m:.3f}' for m in row['masses'])
                            + ' kg, joint damping '
                            + ' / '.join(f'{d:.3g}' for d in row['joint_damping'])
                            + f' N m s/rad, validation loss {row["validation_loss"]:.4e}, '
                            f'validation horizon error {row["horizon_error"]:.4f}')
    pairs = []
    for window, impact_jump, w_comp, w_pen in itertools.product(smooth_windows, impact_jumps,
                                                                w_comps, w_pens):
        mine = [r for r in runs if (r['w_comp'], r['w_pen'], r['smooth_window'],
                                    r['impact_jump']) == (w_comp, w_pen, window, impact_jump)]
        pairs.append({'w_comp': w_comp, 'w_pen': w_pen, 'smooth_window': window,
                      'impact_jump': impact_jump,
                      **{key: _mean([r[key] for r in mine]) for key in
                         ('score', 'volume_error', 'inertia_error', 'friction') + keys}})
    chosen = min(pairs, key=lambda p: p['score'])
    return {'object': object_name, 'runs': runs, 'pairs': pairs, 'chosen': chosen,
            'nominal': judge.nominal, 'error_keys': list(keys), 'train_tosses': n_train,
            'selection_tosses': [int(i) for i in judge.select],
            'seeds': list(seeds), 'steps': steps, 'split_seed': split_seed,
            'shape': shape or judge.spec.shape,
            'mass_split': judge.spec.mass_split if mass_split is None else mass_split,
            'joint_damping': (judge.spec.joint_damping if joint_damping is None
                              else joint_damping),
            'restarts': restarts, 'choose': choose}


def _fit_and_score(judge: Judge, spec: cl.ObjectSpec, train, validation, w_comp: float,
                   w_pen: float, seed: int, steps: int, restarts: int = 1,
                   choose: str = 'rollout') -> Dict[str, Any]:
    # One CCN fit (fit_object: the spec's smoothing) from the perturbed start, scored on the
    # selection tosses.
    keys = tuple(judge.nominal)
    start = time.perf_counter()
    fit = fit_object(dataclasses.replace(spec, w_comp=w_comp, w_pen=w_pen), 'ccn', train,
                     validation, judge.tosses.dt, seed=seed, steps=steps, restarts=restarts,
                     choose=choose)
    m, c, history = fit.model, fit.contact, fit.history
    row = judge.errors(m, c)
    row['horizon_error'] = horizon_error(fit, validation, judge.tosses.dt)
    summary = cl.physical_summary(spec, m, c)
    row.update(w_comp=w_comp, w_pen=w_pen, seed=seed,
               score=sum(row[k] / judge.nominal[k] for k in keys),
               volume_error=summary['volume_error'], inertia_error=summary.get('inertia_error'),
               friction=summary['friction'], last_step=history['step'][-1],
               masses=m.inertial.detach().reshape(-1, 10)[:, 0].tolist(),
               joint_damping=m.damping.detach().reshape(-1)[6:].tolist(),
               validation_loss=min(history['validation']),
               restarts=fit.extra.get('restarts'),
               train_s=time.perf_counter() - start)
    return row


def _mean(values) -> Optional[float]:
    # None where the spec knows no truth for the metric (the elbow's inertia).
    return None if any(v is None for v in values) else float(np.mean(values))


#: Error key -> (label, unit, scale from SI).
_UNITS = {'position_m': ('position', 'mm', 1e3),
          'orientation_rad': ('orientation', 'deg', 180 / math.pi),
          'hinge_rad': ('hinge', 'deg', 180 / math.pi)}


def _errors_text(row: Dict[str, Any], keys: Sequence[str]) -> str:
    return ', '.join(f'{_UNITS[k][0]} {_UNITS[k][2] * row[k]:.1f} {_UNITS[k][1]}' for k in keys)


def markdown(payload: Dict[str, Any]) -> str:
    """
    Return the pairs as a markdown table, the chosen one marked.

    :param payload: :func:`run`'s result.
    :return: the table.
    """
    nominal, keys = payload['nominal'], payload['error_keys']
    lines = [f'{payload["object"]}: {len(payload["selection_tosses"])} selection tosses, '
             f'{payload["train_tosses"]} training tosses, seeds {payload["seeds"]}; our step '
             f'with the nominal {payload["object"]}: ' + _errors_text(nominal, keys), '',
             '| smooth window | impact jump m/s | w_comp 1/s | w_pen J/m^2 | score | '
             + ' | '.join(f'{_UNITS[k][0]} {_UNITS[k][1]}' for k in keys)
             + ' | volume err | inertia err | friction |',
             '|---:|---:|---:|---:|---:|' + '---:|' * (len(keys) + 3)]
    for p in payload['pairs']:
        mark = ' (chosen)' if p == payload['chosen'] else ''
        inertia = '-' if p['inertia_error'] is None else f'{p["inertia_error"]:.2f}'
        jump = p.get('impact_jump')
        lines.append(f'| {p.get("smooth_window", 1)} | {"-" if jump is None else f"{jump:g}"} '
                     f'| {p["w_comp"]:g} | {p["w_pen"]:g} | '
                     f'{p["score"]:.3f}{mark} | '
                     + ' | '.join(f'{_UNITS[k][2] * p[k]:.1f}' for k in keys)
                     + f' | {p["volume_error"]:.3f} | {inertia} | {p["friction"]:.3f} |')
    return '\n'.join(lines)


def _floats(text: str) -> List[float]:
    return [float(x) for x in text.split(',') if x.strip()]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """
    Run the search and print the table.

    :param argv: command-line arguments (``sys.argv[1:]`` when None).
    :return: process exit status.
    """
    parser = _common.make_parser(__doc__.strip().splitlines()[0])
    parser.add_argument('--data', default=None, help='shared data root (holding INDEX.md)')
    parser.add_argument('--object', choices=tuple(JUDGES), default='cube',
                        help="whose weights: the cube's tosses (benchmarks/contact_learning.py's "
                             "split) or the elbow's (benchmarks/elbow_learning.py's split)")
    parser.add_argument('--w-comp', default='0.001,1,10',
                        help='comma-separated complementarity weights [1/s]')
    parser.add_argument('--w-pen', default='1,10,100,1000',
                        help='comma-separated penetration weights [J/m^2]')
    parser.add_argument('--seeds', type=int, default=2, help='initialisations per pair')
    parser.add_argument('--first-seed', type=int, default=0,
                        help='seeds FIRST .. FIRST + SEEDS - 1 (default 0; fit_object draws '
                             'restart r of seed s with seed s + 1000 r)')
    parser.add_argument('--train-tosses', type=int, default=64, help='training tosses')
    parser.add_argument('--selection-tosses', type=int, default=100,
                        help="tosses judged on (the cube's split leaves ~250, the elbow's 257)")
    parser.add_argument('--steps', type=int, default=1000, help='maximum Adam steps per fit')
    parser.add_argument('--split-seed', type=int, default=0,
                        help="the object's benchmark's split seed (keep it fixed)")
    parser.add_argument('--smooth-windows', default='1',
                        help='comma-separated odd local polynomial windows the training and '
                             'validation tosses are smoothed with (1: as recorded); '
                             'selection tosses are judged as recorded')
    parser.add_argument('--shape', choices=cl.SHAPES, default=None,
                        help='how CCN learns the geometry (ObjectSpec.shape; default the '
                             "object's own)")
    elbow.add_start_options(parser)
    parser.add_argument('--impact-jumps', default='none',
                        help="comma-separated ObjectSpec.impact_jump values [m/s] ('none': "
                             'smoothing windows span impacts)')
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    data = _common.data_root(args.data, 'contact_weights.py')
    if args.quick:
        args.w_comp, args.w_pen, args.seeds = '1', '10,100', 1
        args.train_tosses, args.selection_tosses, args.steps = 2, 4, 5
    payload = run(data, _floats(args.w_comp), _floats(args.w_pen),
                  range(args.first_seed, args.first_seed + args.seeds),
                  args.train_tosses, args.selection_tosses, args.steps, args.split_seed,
                  log=lambda line: print(line, flush=True), object_name=args.object,
                  smooth_windows=[int(w) for w in _floats(args.smooth_windows)],
                  impact_jumps=[None if x.strip() == 'none' else float(x)
                                for x in args.impact_jumps.split(',') if x.strip()],
                  shape=args.shape,
                  mass_split=None if args.mass_split is None else args.mass_split == 'learned',
                  restarts=args.restarts, choose=args.choose_by,
                  joint_damping=(None if args.joint_damping is None
                                 else args.joint_damping == 'learned'))
    print()
    print(markdown(payload))
    payload['machine'] = _common.machine_info(('torch', 'scipy'))
    payload['quick'] = args.quick
    if args.json:
        _common.write_json(args.json, payload)
    return 0


if __name__ == '__main__':
    sys.exit(main())
