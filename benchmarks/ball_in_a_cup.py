"""
Ball in a cup on the WAM-4 (issue 18; DiffNEA's Table I): identify, search offline, transfer.

Per string length (0.35, 0.40, 0.45 m; ``--lengths``: some of them, the same plants and
seeds as in the whole run; ``--quick``: 0.40 only, its own plant):

1. Hidden plant: ``draw_truth(seed, length)`` (arm inertials, cup transform, ball mass, the
   string's true length within 1 cm of the measured one), simulated in MuJoCo
   (:class:`~diffsim_ros.sim.cup.CupPlant`: the string a chain of capsules).
2. Data like the paper's, no swing-up: ``identification_recordings`` (a high-acceleration
   sinusoid of the arm, slow cosines that swing the ball).
3. Models (rows):

   - ``diffnea``: ``fit_cup_model`` (the arm by the existing identification, the string
     model by its penalty fit, started at the measured length);
   - ``nominal``: the catalogue arm and the string model at the nominal cup transform and
     the measured length (what a user has from a datasheet and a tape measure);
   - ``ffnn``, ``lstm``: black-box ball models (``BallFFNN``, ``BallLSTM``) trained on the
     same string recordings, paired with the identified arm and cup kinematics (they model
     the ball only, as in the paper).

4. Policy search on each model: eREPS over a ProMP (:mod:`diffsim_ros.control.ball_in_cup`),
   ``--searches`` independent seeds drawn from ``--seed``, the arm exactly tracking the
   ProMP in the model; an episode whose ball touches the arm (``sim.cup.arm_shapes``, the
   plant's contact shapes) or the cup from outside ends there as a failure (the plant's ball
   hit the upper arm in most swing-ups searched without this rule:
   ``benchmarks/cup_divergence.py``).  With ``--ensemble-tilt-deg A
   --ensemble-length-mm L`` the search on the string-model rows (``diffnea``, ``nominal``)
   is robust: each sample is scored by the mean reward over five members of the model
   (:func:`ensemble_for`: the cup tilted ``+-A`` about its x and y axes, which the data
   cannot see, the string ``+-L`` longer), and the best 10 are chosen by that mean.  Off by
   default: at A = 2.89, L = 5 it did not raise the transfer rate (benchmarks/README.md).
   The black-box rows search on their network alone.
5. Transfer: each search's mean trajectory executed on the hidden plant by
   ``ComputedTorque`` (``sim.cup.tracking_controller``) on that row's arm model; success is
   ``sim.cup.in_cup`` (the ball inside for the last 0.2 s).  Best 10 = the 10 searches with
   the highest model reward (the paper's protocol).  Repeatability: every best-10 policy
   that transferred is executed ``--repeats`` more times with the plant's sensor noise
   (``SENSOR_NOISE``, a new noise seed each), and the fraction of those runs that succeed
   is reported (None when nothing transferred).

JSON (``--json``): per length (``"0.40"``) and model: ``transfer_best10``,
``transfer_all``, ``repeatability``, ``reward_best10`` (mean model reward of the best 10),
``caught_in_model`` (fraction of searches whose mean catches the ball in its own model),
``tracking_error_rad`` (median over transfers of the largest joint error), ``per_seed``
(model reward, catch, plant success, the searched ProMP mean, where the plant's ball
ended, when it first touched anything and the arm); per length
``string_length_error_m``, ``cup_offset_error_m``; timings and the machine.
"""

import math
import os
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch

try:
    from benchmarks import _common
except ImportError:  # run as ``python benchmarks/ball_in_a_cup.py``
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks import _common

from diffsim_ros.control.ball_in_cup import (policy_search, SearchConfig,  # noqa: I100
                                             StringEnsemble)
from diffsim_ros.core.model import RobotModel
from diffsim_ros.sim import cup
# The task and the transfer are shared with diffsim-cup-search (one place: sim.cup_swing).
from diffsim_ros.sim.cup_swing import (DURATION_S, HOLD_S, HOME, make_task, N_BASIS,
                                       transfer)
from diffsim_ros.sim.parameters import nominal_model
from diffsim_ros.sysid import string_model

LENGTHS = (0.35, 0.40, 0.45)
MODELS = ('diffnea', 'nominal', 'ffnn', 'lstm')
#: The black-box rows' ball models, by the class names issue 18 gives them.
BLACK_BOX = {'ffnn': 'BallFFNN', 'lstm': 'BallLSTM'}
BEST = 10
#: Robust search, off by default (measured: it did not raise the transfer rate and made the
#: search 2-5 times slower; benchmarks/README.md): the setting tried.  The identification
#: cannot see the cup's orientation, and the plant's is the nominal one +-5 degrees per angle
#: (a mounting tolerance), whose standard deviation is 5 / sqrt(3) degrees; the string length
#: came out 3.4 and 4.7 mm off on the development plants (seeds 1 and 2).
TRIED_TILT_DEG = 5.0 / 3.0 ** 0.5
TRIED_LENGTH_MM = 5.0


def ensemble_for(string: Any, tilt_rad: float, length_m: float) -> Any:
    """
    Return the robust-search members of a string model, or the model itself.

    Five members: the model, then the cup tilted by ``+-tilt`` about its x and about its y
    axis, with the string ``+-length`` longer (paired so that each sign of the length meets
    both axes): a symmetric set around the identified model (sigma points of the two
    unobserved tilts and the length).

    :param string: the identified (or nominal) string model.
    :param tilt_rad: tilt of the members, rad (0 with ``length_m`` 0: no ensemble).
    :param length_m: string length change of the members, m.
    :return: a :class:`StringEnsemble`, or ``string`` when both spreads are 0.
    """
    if tilt_rad == 0.0 and length_m == 0.0:
        return string
    a, dl = tilt_rad, length_m
    tilts = torch.tensor([[0.0, 0.0, 0.0], [a, 0.0, 0.0], [-a, 0.0, 0.0], [0.0, a, 0.0],
                          [0.0, -a, 0.0]], dtype=torch.float64)
    return StringEnsemble(string, tilts, torch.tensor([0.0, dl, -dl, -dl, dl],
                                                      dtype=torch.float64))


def available_models() -> List[str]:
    """
    Return the rows this checkout can run (the black-box ball models may not exist yet).

    :return: names among :data:`MODELS`.
    """
    return [name for name in MODELS
            if name not in BLACK_BOX or hasattr(string_model, BLACK_BOX[name])]


def models_for(truth: cup.CupTruth, seed: int, recording: Dict[str, Any],
               names: Sequence[str] = MODELS) -> Dict[str, Any]:
    """
    Identify the models of one hidden plant from its identification recordings.

    :param truth: the hidden plant.
    :param seed: seed of the recordings and the fits.
    :param recording: keyword arguments of ``identification_recordings`` (durations).
    :param names: the rows wanted; a black-box ball network is trained only when its row is
        among them (the two networks cost most of a short run's time).
    :return: ``{'models': {name: (arm, kinematics, ball_model)}, 'fit': {...}}``.
    """
    start = time.perf_counter()
    arm_runs, string_runs = cup.identification_recordings(truth, seed, **recording)
    recorded = time.perf_counter() - start
    catalogue = nominal_model(cup.ROBOT)
    # The fit starts where a user's would (diffsim-cup-search --string-length, the
    # identifier's string_length): at the measured length.  Since fit_string's closed-form
    # anchor stage, where it ends no longer depends on the start along the length / cup
    # offset valley: --seed 17's plants 0.1 / 0.7 / 1.0 mm off from the measured length and
    # from 5 cm either way (before: 2.7-19.3 mm, by the start).
    measured = truth_measured(truth)
    arm, string = string_model.fit_cup_model(
        arm_runs, string_runs, catalogue,
        start=string_model.StringModel(catalogue, string_length=measured))
    fitted = time.perf_counter() - start - recorded
    nominal = string_model.StringModel(catalogue, string_length=measured)
    models = {'diffnea': (arm, string, None), 'nominal': (catalogue, nominal, None)}
    for name in available_models():
        if name in BLACK_BOX and name in names:
            # The ball only: trained on the same swings, fed the identified cup's motion.
            network = getattr(string_model, BLACK_BOX[name])()
            network, _ = string_model.fit_ball_network(string_runs, network, string, seed=seed)
            models[name] = (arm, string, network)
    identified = string.parameters_dict()
    fit = {'string_length_m': identified['string_length'],
           'string_length_true_m': truth.string_length,
           'string_length_error_m': abs(identified['string_length'] - truth.string_length),
           'cup_offset_error_m': float(np.linalg.norm(np.subtract(identified['cup_xyz'],
                                                                  truth.cup_xyz))),
           'record_s': recorded, 'fit_s': fitted}
    return {'models': models, 'fit': fit}


def truth_measured(truth: cup.CupTruth) -> float:
    """
    Return the string length a user measured: the nominal length class of the truth.

    :param truth: the hidden plant.
    :return: the nearest of :data:`LENGTHS`, m.
    """
    return min(LENGTHS, key=lambda length: abs(length - truth.string_length))


def evaluate_model(plant: cup.CupPlant, arm: RobotModel, kinematics: Any, ball_model: Any,
                   seeds: Sequence[int], config: SearchConfig, repeats: int,
                   search_model: Optional[Any] = None) -> Dict[str, Any]:
    """
    Search on one model, transfer every search's mean, repeat the best with noise.

    :param plant: the hidden plant.
    :param arm: the model's arm (torque penalty and tracking controller).
    :param kinematics: the model's cup kinematics.
    :param ball_model: the model's ball rollout (None: ``kinematics``).
    :param seeds: policy-search seeds.
    :param config: eREPS settings.
    :param repeats: noisy repetitions of each transferred best-10 policy.
    :param search_model: what the search runs on instead of ``kinematics`` (a
        :class:`StringEnsemble`; then ``ball_model`` must be None), or None.
    :return: the row's figures.
    """
    task = make_task(arm)
    result = policy_search(task, kinematics if search_model is None else search_model, seeds,
                           config, ball_model=ball_model)
    start = time.perf_counter()
    runs = [transfer(plant, task, arm, theta) for theta in result.distribution.mean]
    success = [run['success'] for run in runs]
    order = torch.argsort(result.reward, descending=True)[:BEST].tolist()
    repeated: List[bool] = []
    for i in order:
        if success[i]:
            repeated += [transfer(plant, task, arm, result.distribution.mean[i],
                                  noise=cup.SENSOR_NOISE, seed=1000 * seeds[i] + k)['success']
                         for k in range(repeats)]
    return {
        'transfer_best10': float(np.mean([success[i] for i in order])),
        'transfer_all': float(np.mean(success)),
        'repeatability': float(np.mean(repeated)) if repeated else None,
        'reward_best10': float(result.reward[order].mean()),
        'caught_in_model': float(result.caught.double().mean()),
        'tracking_error_rad': float(np.median([run['tracking_error_rad'] for run in runs])),
        'saturated': float(np.median([run['saturated'] for run in runs])),
        'search_s': result.seconds, 'search_s_per_seed': result.seconds / len(seeds),
        'transfer_s': time.perf_counter() - start,
        'per_seed': {'seed': list(seeds), 'reward': result.reward.tolist(),
                     'caught': result.caught.tolist(), 'success': success,
                     'final_radial_m': [run['final_radial_m'] for run in runs],
                     'theta': result.distribution.mean.tolist(),
                     'first_contact_s': [run['first_contact_s'] for run in runs],
                     'arm_contact_s': [run['arm_contact_s'] for run in runs],
                     'final_height_m': [run['final_height_m'] for run in runs]},
    }


def main(argv: Optional[Sequence[str]] = None) -> int:
    """
    Run the benchmark (see the module docstring).

    :param argv: command-line arguments (None: ``sys.argv``).
    :return: exit status.
    """
    parser = _common.make_parser('Ball in a cup on the WAM-4: identify, eREPS on each model, '
                                 'transfer to the MuJoCo ground truth (issue 18).')
    # The shared --quick help promises a minute; here it is the quick protocol.
    parser._option_string_actions['--quick'].help = (
        'only the 0.40 m string (still --searches seeds per model); see benchmarks/README.md '
        'for its measured time')
    parser.add_argument('--seed', type=int, default=0,
                        help='draws the hidden plants and the policy-search seeds')
    parser.add_argument('--lengths', default=None,
                        help='comma-separated string lengths among '
                             f'{",".join(f"{length:.2f}" for length in LENGTHS)} (default: '
                             'all; each with the plant and the searches it has in the whole '
                             "run, which --quick's 0.40 m plant is not)")
    parser.add_argument('--searches', type=int, default=30,
                        help='independent policy searches per model (default 30)')
    parser.add_argument('--iterations', type=int, default=SearchConfig.iterations,
                        help='eREPS updates per search')
    parser.add_argument('--samples', type=int, default=SearchConfig.samples,
                        help='episodes per eREPS update and search')
    parser.add_argument('--repeats', type=int, default=None,
                        help='noisy repetitions of each transferred best-10 policy '
                             '(default 5, --quick 3)')
    parser.add_argument('--models', default=','.join(available_models()),
                        help=f'comma-separated rows among {",".join(MODELS)} (default: those '
                             f'this checkout has: {",".join(available_models())})')
    parser.add_argument('--arm-seconds', type=float, default=60.0,
                        help='length of the arm identification run, s (default 60)')
    parser.add_argument('--string-runs', type=int, default=6,
                        help='number of ball-swinging identification runs (default 6)')
    parser.add_argument('--string-seconds', type=float, default=30.0,
                        help='length of each ball-swinging run, s (default 30)')
    parser.add_argument('--ensemble-tilt-deg', type=float, default=0.0,
                        help='robust search on the string-model rows: tilt of the cup in the '
                             'ensemble members, degrees (default 0 with --ensemble-length-mm '
                             f'0: search on the model alone; tried: {TRIED_TILT_DEG:.2f})')
    parser.add_argument('--ensemble-length-mm', type=float, default=0.0,
                        help='string length change of the ensemble members, mm (default 0; '
                             f'tried: {TRIED_LENGTH_MM:g})')
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    names = [name for name in args.models.split(',') if name]
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        parser.error(f'unknown models {unknown}; valid: {", ".join(MODELS)}')
    missing = sorted(set(names) - set(available_models()))
    if missing:
        parser.error(f'{missing}: sysid.string_model has no {[BLACK_BOX[m] for m in missing]} '
                     'yet')
    repeats = args.repeats if args.repeats is not None else (3 if args.quick else 5)
    config = SearchConfig(iterations=args.iterations, samples=args.samples)
    # (index, length): the index draws the plant and the searches' seeds
    if args.quick:
        lengths = [(0, 0.40)]
    elif args.lengths is None:
        lengths = list(enumerate(LENGTHS))
    else:
        keys = {f'{length:.2f}': index for index, length in enumerate(LENGTHS)}
        asked = [item.strip() for item in args.lengths.split(',') if item.strip()]
        try:
            asked = [f'{float(item):.2f}' for item in asked]
        except ValueError:
            parser.error(f'--lengths: {args.lengths!r} is not a list of numbers')
        if not asked or set(asked) - set(keys):
            parser.error(f'--lengths: {args.lengths!r}; choose among {", ".join(keys)}')
        lengths = [(keys[key], float(key)) for key in sorted(set(asked))]
    recording = {'arm_seconds': args.arm_seconds, 'string_runs': args.string_runs,
                 'string_seconds': args.string_seconds}
    start = time.perf_counter()
    payload: Dict[str, Any] = {'seed': args.seed, 'quick': args.quick,
                               'settings': {'lengths': [length for _, length in lengths],
                                            'searches': args.searches,
                                            'iterations': config.iterations,
                                            'samples': config.samples, 'repeats': repeats,
                                            'home': HOME, 'duration_s': DURATION_S,
                                            'hold_s': HOLD_S, 'n_basis': N_BASIS,
                                            'recording': recording,
                                            'ensemble_tilt_deg': args.ensemble_tilt_deg,
                                            'ensemble_length_mm': args.ensemble_length_mm}}
    for index, length in lengths:
        key = f'{length:.2f}'
        truth = cup.draw_truth(args.seed * 100 + index, length)
        plant = cup.CupPlant(truth)
        fitted = models_for(truth, args.seed * 100 + index, recording, names)
        entry: Dict[str, Any] = dict(fitted['fit'])
        for name in sorted(set(MODELS) - set(available_models())):
            entry[name] = {'missing': f'sysid.string_model has no {BLACK_BOX[name]}'}
        seeds = [args.seed * 10000 + index * 1000 + k for k in range(args.searches)]
        for name in names:
            arm, kinematics, ball_model = fitted['models'][name]
            # The ensemble perturbs the string model; the black-box rows keep their network.
            robust = None if ball_model is not None else ensemble_for(
                kinematics, math.radians(args.ensemble_tilt_deg),
                1e-3 * args.ensemble_length_mm)
            row = evaluate_model(plant, arm, kinematics, ball_model, seeds, config, repeats,
                                 search_model=robust)
            entry[name] = row
            print(f'{key} m {name:8s} transfer best10 {row["transfer_best10"]:.2f} '
                  f'all {row["transfer_all"]:.2f} repeatability {row["repeatability"]} '
                  f'reward best10 {row["reward_best10"]:.3f} in-model '
                  f'{row["caught_in_model"]:.2f} search {row["search_s_per_seed"]:.1f} s/seed '
                  f'transfer {row["transfer_s"]:.0f} s', flush=True)
        print(f'{key} m string length error {entry["string_length_error_m"] * 1e3:.1f} mm, '
              f'cup offset error {entry["cup_offset_error_m"] * 1e3:.1f} mm', flush=True)
        payload[key] = entry
    payload['total_s'] = time.perf_counter() - start
    payload['machine'] = _common.machine_info(('torch', 'mujoco'))
    print(f'total {payload["total_s"]:.0f} s')
    if args.json:
        _common.write_json(args.json, payload)
    return 0


if __name__ == '__main__':
    sys.exit(main())
