"""
CCN (violation-implicit loss) learned from N real cube tosses, against nominal parameters.

Tosses come from ``diffsim_ros.io.tosses.load_cube_tosses`` in recorded order, split by a
permutation drawn from ``--split-seed`` (fixed, independent of ``--seed``): the last
``--test-tosses`` are the held-out test set (the same for every N and seed), the next
``--validation-tosses`` before them are used only for early stopping, and the first N are the
training tosses. The parameters start 0.5-1.5x the truth (``--seed``), inertia from a randomly
rotated box (the paper's appendix A.4), the mass fixed at 0.37 kg. On the test tosses, from the
second recorded sample to the end: the learned model rolled out with
``core.contact_step`` (no restitution: CCN does not learn one) beside our contact step and
MuJoCo with the nominal parameters (``benchmarks/tosses.py``'s functions); mean position and
geodesic orientation error per toss, then mean / median / p90 over tosses. Also the learned
volume error (exact convex-hull intersection) and friction.
"""

import os
from pathlib import Path
import sys
import time
from typing import Any, Dict, Optional, Sequence

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
from diffsim_ros.sysid.object_learning import fit_object

MASS_KG = 0.37


def _split(n_total: int, n_train: int, n_val: int, n_test: int, seed: int):
    order = np.random.default_rng(seed).permutation(n_total)
    test = order[n_total - n_test:]
    val = order[n_total - n_test - n_val:n_total - n_test]
    if n_train > n_total - n_test - n_val:
        raise ValueError(f'--train-tosses {n_train}: only {n_total - n_test - n_val} tosses '
                         'remain outside the test and validation sets')
    return order[:n_train], val, test


def run(data: Path, n_train: int, seed: int, n_val: int, n_test: int, steps: int,
        split_seed: int = 0, limit: Optional[int] = None) -> Dict[str, Any]:
    """
    Train CCN on ``n_train`` tosses and evaluate it with the nominal models on the test set.

    :return: the JSON payload (see the module docstring).
    """
    tosses = load_cube_tosses(data, limit=limit)
    train_i, val_i, test_i = _split(len(tosses), n_train, n_val, n_test, split_seed)
    model = toss_bench.floating_model(tosses)
    spec = cl.cube_spec(model, CUBE_HALF_WIDTH_M, tosses.friction, MASS_KG)
    true_vertices = spec.true_vertices[0]
    start = time.perf_counter()
    train = ([tosses.q[i] for i in train_i], [tosses.v[i] for i in train_i])
    validation = ([tosses.q[i] for i in val_i], [tosses.v[i] for i in val_i])
    fit = fit_object(spec, 'ccn', train, validation, tosses.dt, seed=seed, steps=steps)
    train_s = time.perf_counter() - start
    history = fit.history

    x0 = torch.stack([torch.cat((tosses.q[i][1], tosses.v[i][1])) for i in test_i])
    lengths = [len(tosses.q[i]) - 2 for i in test_i]
    recorded = [tosses.q[i][2:] for i in test_i]
    nominal = core.ContactModel.create(friction=tosses.friction,
                                       restitution=tosses.restitution or 0.0,
                                       vertex_links=(model.link_names[0],),
                                       vertices=(true_vertices,))
    predicted = {}
    seconds = {'train_s': train_s}
    start = time.perf_counter()
    batch = fit.predict(x0, max(lengths), tosses.dt)
    predicted['ccn'] = [batch[k, :n, :7] for k, n in enumerate(lengths)]
    seconds['ccn_rollout_s'] = time.perf_counter() - start
    batch = cl.rollout(model, nominal, x0, max(lengths), tosses.dt)
    predicted['ours_nominal'] = [batch[k, :n, :7] for k, n in enumerate(lengths)]
    mj_model = toss_bench.mujoco_model(tosses, tosses.dt / toss_bench.CONTACT_SUBSTEPS,
                                       contact=True)
    predicted['mujoco_nominal'] = [
        toss_bench.rollout_mujoco(mj_model, x0[k:k + 1], n, toss_bench.CONTACT_SUBSTEPS)[0]
        for k, n in enumerate(lengths)]
    errors = {}
    for name, runs in predicted.items():
        per_toss = cl.rollout_errors(runs, recorded)
        errors[name] = {key: toss_bench.summarize(value) for key, value in per_toss.items()}
    summary = fit.summary()
    start_summary = fit.start
    return {'train_tosses': n_train, 'seed': seed, 'split_seed': split_seed,
            'validation_tosses': len(val_i), 'test_tosses': len(test_i),
            'test_toss_ids': [int(tosses.toss_ids[i]) for i in test_i],
            'train_transitions': sum(len(tosses.q[i]) - 2 for i in train_i), 'dt': tosses.dt,
            'weights': cl.TrainConfig().weights.__dict__, 'steps': steps,
            'learned': summary, 'start': start_summary, 'history': history,
            'errors': errors, 'seconds': seconds}


def markdown(payload: Dict[str, Any]) -> str:
    """Return one markdown table row per engine (mm and degrees)."""
    lines = [f'N = {payload["train_tosses"]} training tosses, seed {payload["seed"]}, '
             f'{payload["test_tosses"]} test tosses; learned volume error '
             f'{payload["learned"]["volume_error"]:.3f} (start '
             f'{payload["start"]["volume_error"]:.3f}), friction '
             f'{payload["learned"]["friction"]:.3f} (start {payload["start"]["friction"]:.3f}'
             f'), inertia error {payload["learned"]["inertia_error"]:.3f} (start '
             f'{payload["start"]["inertia_error"]:.3f})', '',
             '| model | position mm (mean / median / p90) | orientation deg |', '|---|---|---|']
    for name, row in payload['errors'].items():
        cells = [' / '.join(toss_bench._cells(row[key], scale))
                 for key, scale in (('position_m', 1e3), ('orientation_rad', 180 / np.pi))]
        lines.append(f'| {name} | ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines) + '\n'


def main(argv: Optional[Sequence[str]] = None) -> int:
    """
    Run the benchmark and print a markdown table.

    :param argv: command-line arguments (``sys.argv[1:]`` when None).
    :return: process exit status.
    """
    parser = _common.make_parser(__doc__.strip().splitlines()[0])
    parser.add_argument('--data', default=None, help='shared data root (holding INDEX.md)')
    parser.add_argument('--train-tosses', type=int, default=16, help='N training tosses')
    parser.add_argument('--seed', type=int, default=0,
                        help='seed of the initialisation and the mini-batches')
    parser.add_argument('--split-seed', type=int, default=0,
                        help='seed of the train/validation/test split (keep it fixed)')
    parser.add_argument('--test-tosses', type=int, default=50, help='held-out test tosses')
    parser.add_argument('--validation-tosses', type=int, default=16,
                        help='tosses for early stopping')
    parser.add_argument('--steps', type=int, default=400, help='maximum Adam steps')
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    data = _common.data_root(args.data, 'contact_learning.py')
    if args.quick:
        payload = run(data, min(args.train_tosses, 4), args.seed, 4, 4, 20, args.split_seed,
                      limit=40)
    else:
        payload = run(data, args.train_tosses, args.seed, args.validation_tosses,
                      args.test_tosses, args.steps, args.split_seed)
    payload['machine'] = _common.machine_info(('torch', 'mujoco', 'scipy'))
    payload['quick'] = args.quick
    print(markdown(payload))
    if args.json:
        _common.write_json(args.json, payload)
    return 0


if __name__ == '__main__':
    sys.exit(main())
