"""
CCN (violation-implicit loss) learned from N real elbow tosses, against the nominal URDF.

The DAIR articulated elbow (two 0.10 x 0.05 x 0.05 m boxes on a hinge, 541 tosses of 121
samples at 0.0068 s; ``diffsim_ros.io.tosses.load_elbow_tosses``), split as
``benchmarks/contact_learning.py`` splits the cube (a permutation from ``--split-seed``: the
last ``--test-tosses`` held out for every N and seed, the ``--validation-tosses`` before them
used only for early stopping, the first N for training). CCN learns both links' vertices,
both links' inertias with each mass held at 0.37 kg, mu and the ground height
(``diffsim_ros.io.object_urdf.elbow_spec``: the URDF's boxes; start 0.5-1.5x, random box
inertias, the paper's appendix A.4) through ``sysid.object_learning.fit_object``.

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
from diffsim_ros.sysid.object_learning import fit_object, METHODS

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


def predictors(fit: cl.ObjectFit, tosses: TossSet) -> Dict[str, Predictor]:
    """
    Return the three models' predictors: the learned one, the nominal URDF in ours and MuJoCo.

    :param fit: the learned elbow.
    :param tosses: the tosses (dt, URDF, nominal friction).
    :return: name -> predictor.
    """
    spec = fit.spec
    nq = int(spec.model.nq)
    mj_model = toss_bench.mujoco_model(tosses, tosses.dt / toss_bench.CONTACT_SUBSTEPS,
                                       contact=True)
    return {
        fit.method: lambda x0, steps: fit.predict(x0, steps, tosses.dt)[..., :nq],
        'ours_nominal': lambda x0, steps: cl.rollout(spec.model, spec.contact, x0, steps,
                                                     tosses.dt)[..., :nq],
        'mujoco_nominal': lambda x0, steps: toss_bench.rollout_mujoco(
            mj_model, x0, steps, toss_bench.CONTACT_SUBSTEPS)}


def run(data: Path, n_train: int, seed: int, n_val: int, n_test: int, steps: int,
        horizon: int = HORIZON, stride: int = 1, split_seed: int = 0,
        limit: Optional[int] = None, perturb: bool = True,
        method: str = 'ccn') -> Dict[str, Any]:
    """
    Learn the elbow from ``n_train`` tosses; evaluate it and the nominal URDF on the test set.

    ``method`` is a key of ``sysid.object_learning.METHODS`` (CCN by default).

    :return: the JSON payload (see the module docstring).
    """
    tosses = load_elbow_tosses(data, limit=limit)
    train_i, val_i, test_i = cube_bench.split(len(tosses), n_train, n_val, n_test, split_seed)
    spec = elbow_spec(tosses)
    train = ([tosses.q[i] for i in train_i], [tosses.v[i] for i in train_i])
    validation = ([tosses.q[i] for i in val_i], [tosses.v[i] for i in val_i])
    start = time.perf_counter()
    fit = fit_object(spec, method, train, validation, tosses.dt, seed=seed, steps=steps,
                     perturb=perturb)
    seconds = {'train_s': time.perf_counter() - start}
    windows = horizon_windows(tosses, test_i, horizon, stride)
    errors: Dict[str, Dict[str, Any]] = {'horizon': {}, 'full': {}}
    for name, predict in predictors(fit, tosses).items():
        start = time.perf_counter()
        errors['horizon'][name] = horizon_errors(predict, tosses, windows, horizon)
        errors['full'][name] = full_errors(predict, tosses, test_i)
        seconds[f'{name}_rollouts_s'] = time.perf_counter() - start
    return {'train_tosses': n_train, 'seed': seed, 'split_seed': split_seed,
            'validation_tosses': len(val_i), 'test_tosses': len(test_i),
            'train_toss_ids': [int(tosses.toss_ids[i]) for i in train_i],
            'test_toss_ids': [int(tosses.toss_ids[i]) for i in test_i],
            'train_transitions': sum(len(tosses.q[i]) - 2 for i in train_i),
            'dt': tosses.dt, 'horizon': horizon, 'window_stride': stride,
            'windows': len(windows), 'steps': steps,
            'start_from': 'paper' if perturb else 'nominal', 'method': method,
            'weights': cl.TrainConfig().weights.__dict__,
            'learned': fit.summary(), 'start': fit.start, 'history': fit.history,
            'errors': errors, 'seconds': seconds}


def markdown(payload: Dict[str, Any]) -> str:
    """Return the horizon and full-length tables (mm and degrees)."""
    learned, start = payload['learned'], payload['start']
    lines = [f'N = {payload["train_tosses"]} training tosses, seed {payload["seed"]}, start '
             f'{payload["start_from"]}, '
             f'{payload["test_tosses"]} test tosses ({payload["windows"]} windows of '
             f'{payload["horizon"]} samples); learned volume error '
             f'{learned["volume_error"]:.3f} (start {start["volume_error"]:.3f}), friction '
             f'{learned["friction"]:.3f} (start {start["friction"]:.3f}), ground '
             f'{1e3 * learned["ground_height_m"]:.1f} mm', '']
    for window, title in (('horizon', f'{payload["horizon"]}-sample horizon'),
                          ('full', 'full length')):
        lines += [f'{title}: per-toss mean, then mean / median / p90 over tosses', '',
                  '| model | position mm | orientation deg | hinge deg |', '|---|---|---|---|']
        for name, row in payload['errors'][window].items():
            cells = [' / '.join(toss_bench._cells(row[key], scale))
                     for key, scale in (('position_m', 1e3), ('orientation_rad', 180 / np.pi),
                                        ('hinge_rad', 180 / np.pi))]
            lines.append(f'| {name} | ' + ' | '.join(cells) + ' |')
        lines.append('')
    return '\n'.join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """
    Run the benchmark and print markdown tables.

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
    parser.add_argument('--method', choices=tuple(METHODS), default='ccn',
                        help='the learning method (sysid.object_learning.METHODS)')
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    data = _common.data_root(args.data, 'elbow_learning.py')
    if args.quick:
        payload = run(data, min(args.train_tosses, 2), args.seed, 2, 3, 6, args.horizon,
                      max(args.window_stride, 8), args.split_seed, limit=40,
                      perturb=args.start == 'paper', method=args.method)
    else:
        payload = run(data, args.train_tosses, args.seed, args.validation_tosses,
                      args.test_tosses, args.steps, args.horizon, args.window_stride,
                      args.split_seed, perturb=args.start == 'paper', method=args.method)
    payload['machine'] = _common.machine_info(('torch', 'mujoco', 'scipy'))
    payload['quick'] = args.quick
    print(markdown(payload))
    if args.json:
        _common.write_json(args.json, payload)
    return 0


if __name__ == '__main__':
    sys.exit(main())
