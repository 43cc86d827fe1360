"""
Choose CCN's violation weights on real cube tosses held out for the choice.

The violation loss's ``w_comp`` and ``w_pen`` (``sysid.contact_learning.ViolationWeights``)
are hyperparameters: the paper chose Table 2's by a search on its own data and code, and read
in our SI units they fail (see ``ViolationWeights``). This is that search, on tosses that
neither the learning curves' training, validation nor test tosses use: the split of
``benchmarks/contact_learning.py`` (``--split-seed``, its 50 test and 16 validation tosses and
up to 256 training tosses) leaves about 250 tosses unused, and the first
``--selection-tosses`` of them judge. For every pair of the grid ``--w-comp`` x ``--w-pen``
and every seed, CCN learns from the first ``--train-tosses`` training tosses (perturbed start,
ground held, early stopping on the validation tosses) and is rolled out on the selection
tosses from their second sample. Score of a run: its mean position error over our step's with
the nominal cube plus its mean orientation error over our step's, on the same tosses; a
pair's score is the mean over seeds; the lowest wins. Volume and inertia errors are printed
beside, never used to choose.
"""

import math
import os
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch

try:
    from benchmarks import _common, contact_learning as curves, tosses as toss_bench
except ImportError:  # run as ``python benchmarks/contact_weights.py``
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks import _common, contact_learning as curves, tosses as toss_bench

from diffsim_ros.io.tosses import CUBE_HALF_WIDTH_M, load_cube_tosses  # noqa: I100
from diffsim_ros.sysid import contact_learning as cl


def selection_indices(n_total: int, n_train: int, n_val: int, n_test: int, n_select: int,
                      seed: int) -> np.ndarray:
    """
    Return the tosses the choice is judged on: the split's unused ones, in its order.

    :param n_total: number of tosses.
    :param n_train: the largest training set of the learning curves (256).
    :param n_val: their validation tosses.
    :param n_test: their test tosses.
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


def run(data, w_comps: Sequence[float], w_pens: Sequence[float], seeds: Sequence[int],
        n_train: int, n_select: int, steps: int, split_seed: int = 0,
        log=None) -> Dict[str, Any]:
    """
    Learn CCN for every pair and seed and score it on the selection tosses.

    :param data: the shared data root.
    :param w_comps: complementarity weights [1/s].
    :param w_pens: penetration weights [J/m^2].
    :param seeds: initialisation seeds.
    :param n_train: training tosses.
    :param n_select: selection tosses.
    :param steps: maximum Adam steps per fit.
    :param split_seed: the learning curves' split seed.
    :param log: called with a line per fit, or None.
    :return: the JSON payload (``runs``, ``pairs``, ``chosen``, ``nominal``).
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
    nominal = curves._nominal(tosses, model, spec, x0, lengths, recorded)['ours_nominal']
    train = cl.transitions([tosses.q[i] for i in train_i[:n_train]],
                           [tosses.v[i] for i in train_i[:n_train]])
    validation = cl.transitions([tosses.q[i] for i in val_i], [tosses.v[i] for i in val_i])
    runs = []
    for w_comp in w_comps:
        for w_pen in w_pens:
            weights = cl.ViolationWeights(w_comp=w_comp, w_pen=w_pen)
            for seed in seeds:
                start = time.perf_counter()
                theta0 = cl.start_parameters(spec, seed, True)
                theta, history = cl.train_violation(
                    spec.model, spec.contact, theta0, spec.masses, train, validation,
                    tosses.dt, cl.TrainConfig(steps=steps, seed=seed, weights=weights))
                m, c = cl.object_models(spec.model, spec.contact, theta, spec.masses)
                batch = cl.rollout(m, c, x0, max(lengths), tosses.dt)
                row = curves._test_errors([batch[k, :n, :7] for k, n in enumerate(lengths)],
                                          recorded)
                summary = cl.physical_summary(spec, m, c)
                row.update(w_comp=w_comp, w_pen=w_pen, seed=seed,
                           score=row['position_m'] / nominal['position_m']
                           + row['orientation_rad'] / nominal['orientation_rad'],
                           volume_error=summary['volume_error'],
                           inertia_error=summary['inertia_error'],
                           friction=summary['friction'], last_step=history['step'][-1],
                           train_s=time.perf_counter() - start)
                runs.append(row)
                if log is not None:
                    log(f'w_comp {w_comp:g} w_pen {w_pen:g} seed {seed}: score '
                        f'{row["score"]:.3f}, {1e3 * row["position_m"]:.1f} mm, '
                        f'{math.degrees(row["orientation_rad"]):.1f} deg, volume error '
                        f'{row["volume_error"]:.3f}')
    pairs = []
    for w_comp in w_comps:
        for w_pen in w_pens:
            mine = [r for r in runs if r['w_comp'] == w_comp and r['w_pen'] == w_pen]
            pairs.append({'w_comp': w_comp, 'w_pen': w_pen,
                          **{key: float(np.mean([r[key] for r in mine])) for key in
                             ('score', 'position_m', 'orientation_rad', 'volume_error',
                              'inertia_error', 'friction')}})
    chosen = min(pairs, key=lambda p: p['score'])
    return {'runs': runs, 'pairs': pairs, 'chosen': chosen, 'nominal': nominal,
            'train_tosses': n_train, 'selection_tosses': [int(i) for i in select],
            'seeds': list(seeds), 'steps': steps, 'split_seed': split_seed}


def markdown(payload: Dict[str, Any]) -> str:
    """
    Return the pairs as a markdown table, the chosen one marked.

    :param payload: :func:`run`'s result.
    :return: the table.
    """
    nominal = payload['nominal']
    lines = [f'{len(payload["selection_tosses"])} selection tosses, {payload["train_tosses"]} '
             f'training tosses, seeds {payload["seeds"]}; our step with the nominal cube '
             f'{1e3 * nominal["position_m"]:.1f} mm, '
             f'{math.degrees(nominal["orientation_rad"]):.1f} deg', '',
             '| w_comp 1/s | w_pen J/m^2 | score | position mm | orientation deg | '
             'volume err | inertia err | friction |', '|---:|---:|---:|---:|---:|---:|---:|---:|']
    for p in payload['pairs']:
        mark = ' (chosen)' if p == payload['chosen'] else ''
        lines.append(f'| {p["w_comp"]:g} | {p["w_pen"]:g} | {p["score"]:.3f}{mark} | '
                     f'{1e3 * p["position_m"]:.1f} | {math.degrees(p["orientation_rad"]):.1f} | '
                     f'{p["volume_error"]:.3f} | {p["inertia_error"]:.2f} | '
                     f'{p["friction"]:.3f} |')
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
    parser.add_argument('--w-comp', default='0.001,1,10',
                        help='comma-separated complementarity weights [1/s]')
    parser.add_argument('--w-pen', default='1,10,100,1000',
                        help='comma-separated penetration weights [J/m^2]')
    parser.add_argument('--seeds', type=int, default=2, help='initialisations per pair')
    parser.add_argument('--train-tosses', type=int, default=64, help='training tosses')
    parser.add_argument('--selection-tosses', type=int, default=100,
                        help="tosses judged on (the learning curves' split leaves ~250)")
    parser.add_argument('--steps', type=int, default=1000, help='maximum Adam steps per fit')
    parser.add_argument('--split-seed', type=int, default=0,
                        help="the learning curves' split seed (keep it fixed)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    data = _common.data_root(args.data, 'contact_weights.py')
    if args.quick:
        args.w_comp, args.w_pen, args.seeds = '1', '10,100', 1
        args.train_tosses, args.selection_tosses, args.steps = 2, 4, 5
    payload = run(data, _floats(args.w_comp), _floats(args.w_pen), range(args.seeds),
                  args.train_tosses, args.selection_tosses, args.steps, args.split_seed,
                  log=lambda line: print(line, flush=True))
    print()
    print(markdown(payload))
    payload['machine'] = _common.machine_info(('torch', 'scipy'))
    payload['quick'] = args.quick
    if args.json:
        _common.write_json(args.json, payload)
    return 0


if __name__ == '__main__':
    sys.exit(main())
