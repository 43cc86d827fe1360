"""
Particle inference on the real IBM double pendulum: speed of CSVGD and CSVGD Table 2.

Sections (the model and its 11 parameters: :mod:`diffsim_ros.sysid.double_pendulum`):

* speed: iterations per second of constrained SVGD with multiple shooting (10 shooting
  windows over the first second, 400 frames, of run 0) for 10, 50, 100 and 400 particles
  (target: at least 20 it/s at 100 particles on 2 CPU cores; CUDA when available);
* table 2: every method (SVGD/CSVGD, SGLD, CEM, emcee) fitted with single shooting (SS) and
  multiple shooting (MS) to the first second of run 0, then scored on held-out 1 s
  windows of runs 2-20: KL(real || sim), KL(sim || real) (k = 3 nearest neighbours) and
  the squared MMD between the held-out trajectories and each posterior sample's
  simulations from the same start states, averaged over the samples (see
  :func:`~diffsim_ros.sysid.double_pendulum.trajectory_metrics`), as in Heiden et al.
  (ICRA 2022) Table 2; with the identified link lengths beside the published
  0.091 m / 0.070 m;
* link lengths: which first-arm length the recordings support, by maximum likelihood over
  the 0.1 s windows of the first 10 s of run 0 with ``l1`` free against ``l1`` pinned at the
  published 0.091 m (:func:`length_study`).

Run ``python benchmarks/inference.py [--quick] [--json PATH]``; the data root is
``$DIFFSIM_DATA`` or ``shared/data`` next to the repository (``--data DIR``).
"""

import math
import os
from pathlib import Path
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

import torch

try:
    from benchmarks import _common
except ImportError:  # run as ``python benchmarks/inference.py``
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks import _common

from diffsim_ros.io.datasets import load_ibm_double_pendulum  # noqa: I100
from diffsim_ros.sysid import double_pendulum as dp
from diffsim_ros.sysid.baselines import make_inference
from diffsim_ros.sysid.svgd import AugmentedLagrangian

PACKAGES = ('torch', 'numpy', 'emcee')
DT = 1.0 / 400.0
WINDOWS = 10
SPEED_HORIZON = 400
PARTICLE_COUNTS = (10, 50, 100, 400)
QUICK_PARTICLE_COUNTS = (10, 100)
SPEED_TARGET_IT_S = 20.0
METHODS = ('svgd', 'sgld', 'cem', 'emcee')
SECTIONS = ('speed', 'table', 'lengths')
LAGRANGIAN = AugmentedLagrangian(mu=1.0, mu_growth=1.2, mu_max=100.0, update_every=5)


#: Sizes of the Table-2 study (full run and ``--quick``).  The full run is the setting of
#: Heiden et al. (ICRA 2022): the first second (400 frames) of run 0, 10 shooting windows;
#: held-out 1 s windows start at frames 0, 400 and 800 of runs 2-20 (57 windows).
FULL = {'train_runs': (0,), 'heldout_runs': tuple(range(2, 21)), 'horizon': 400,
        'heldout_starts': (0, 400, 800), 'particles': 32, 'steps': 200, 'stride': 5}
QUICK = {'train_runs': (0,), 'heldout_runs': tuple(range(2, 10)), 'horizon': 80,
         'heldout_starts': (0,), 'particles': 12, 'steps': 15, 'stride': 4}


def method_options(name: str, shooting: str, seed: int) -> Dict[str, Any]:
    """
    Return the constructor options of one inference method on this problem.

    The log density of a trajectory sums thousands of squared errors, so its gradient is
    large: SVGD uses Adam (scale-free steps), SGLD a small step size.

    :param name: ``'svgd'``, ``'sgld'``, ``'cem'`` or ``'emcee'``.
    :param shooting: ``'ss'`` or ``'ms'``.
    :param seed: seed of the method's own generator.
    :return: keyword options for :func:`~diffsim_ros.sysid.baselines.make_inference`.
    """
    if name == 'svgd':
        return {'kernel': 'rbf', 'optimizer': 'adam', 'lr': 0.05, 'lr_final': 0.005}
    if name == 'sgld':
        return {'lr': 1e-6, 'lr_final': 1e-7, 'seed': seed}   # 1e-5 diverged with SS
    if name == 'cem':
        return {'elite_fraction': 0.2, 'seed': seed, 'min_std': 1e-3}
    return {'seed': seed}


def fit(name: str, shooting: str, references: torch.Tensor, particles: int, steps: int,
        seed: int = 0) -> Dict[str, Any]:
    """
    Fit the pendulum to reference windows with one method and one shooting scheme.

    :param name: inference method (see :data:`METHODS`).
    :param shooting: ``'ss'`` (single shooting) or ``'ms'`` (:data:`WINDOWS` windows, the
        defects as augmented-Lagrangian constraints: CSVGD for ``'svgd'``).
    :param references: ``(R, T + 1, 4)`` training states.
    :param particles: particle count (emcee uses at least ``2 D + 2`` walkers).
    :param steps: iterations.
    :param seed: seed of the initial particles and the method.
    :return: physical parameter samples ``(P, 11)``, wall time, iterations and violation.
    """
    likelihood = dp.make_likelihood(references, DT, WINDOWS if shooting == 'ms' else 1)
    count = particles
    if name == 'emcee':
        count = max(particles, 2 * likelihood.particle_dim + 2)
    initial = dp.initial_particles(likelihood, count, seed=seed)
    if name == 'emcee':
        # the shooting starts all begin on the data: an ensemble needs independent walkers
        generator = torch.Generator(device=initial.device).manual_seed(seed)
        initial = initial + 1e-2 * torch.randn(initial.shape, generator=generator,
                                               dtype=initial.dtype, device=initial.device)
    method = make_inference(name, **method_options(name, shooting, seed))
    constraint_fn = dp.constraint_function(likelihood)
    start = time.perf_counter()
    if name == 'svgd' and constraint_fn is not None:
        # CSVGD: log density and defects from one rollout per step
        result = method.run(dp.log_posterior_and_defects(likelihood), initial, steps,
                            lagrangian=LAGRANGIAN, with_constraints=True)
    else:
        result = method.run(dp.log_posterior(likelihood), initial, steps,
                            constraint_fn=constraint_fn,
                            lagrangian=LAGRANGIAN if constraint_fn is not None else None)
    seconds = time.perf_counter() - start
    physical = dp.physical_parameters(likelihood, result.particles)
    violation = result.history[-1].get('violation') if result.history else None
    return {'physical': physical, 'seconds': seconds, 'steps': steps,
            'particles': int(result.particles.shape[0]), 'violation': violation}


def speed_study(root: Path, quick: bool, device: torch.device,
                repeats: int = 3) -> Dict[str, Any]:
    """
    Measure CSVGD iterations per second against the particle count.

    Each count is warmed up first (the compiled step compiles once per shape; the compile
    time is reported apart), then timed ``repeats`` times; the best run is reported with the
    1-minute load average of the machine seen during the runs.

    :param root: data root.
    :param quick: fewer particle counts and iterations.
    :param device: where the particles and simulations live.
    :param repeats: timed runs per particle count.
    :return: ``{str(P): it/s}`` plus the problem size, compile times and load averages.
    """
    run = load_ibm_double_pendulum(root, runs=[0], max_samples=SPEED_HORIZON + 1)
    references = dp.state_references(run, SPEED_HORIZON).to(device)
    likelihood = dp.make_likelihood(references, DT, WINDOWS, compiled=True)
    evaluate = dp.log_posterior_and_defects(likelihood)
    steps = 3 if quick else 10
    out: Dict[str, Any] = {'horizon': SPEED_HORIZON, 'windows': WINDOWS, 'device': str(device),
                           'it_per_s': {}, 'it_per_s_runs': {}, 'warmup_s': {},
                           'load_average': {}}
    for count in (QUICK_PARTICLE_COUNTS if quick else PARTICLE_COUNTS):
        initial = dp.initial_particles(likelihood, count, seed=0).to(device)
        method = make_inference('svgd', **method_options('svgd', 'ms', 0))
        start = time.perf_counter()
        method.run(evaluate, initial, 2, lagrangian=LAGRANGIAN, with_constraints=True)
        out['warmup_s'][str(count)] = time.perf_counter() - start
        rates, loads = [], []
        for _ in range(repeats):
            start = time.perf_counter()
            method.run(evaluate, initial, steps, lagrangian=LAGRANGIAN, with_constraints=True)
            rates.append(steps / (time.perf_counter() - start))
            loads.append(os.getloadavg()[0])
        out['it_per_s'][str(count)] = max(rates)
        out['it_per_s_runs'][str(count)] = rates
        out['load_average'][str(count)] = loads
    return out


def table_study(root: Path, quick: bool, device: torch.device,
                methods: Sequence[str] = METHODS) -> Dict[str, Any]:
    """
    Fit every method with SS and MS and score it on held-out windows (CSVGD Table 2).

    :param root: data root.
    :param quick: the :data:`QUICK` sizes instead of :data:`FULL`.
    :param device: where the particles and simulations live.
    :param methods: methods to run.
    :return: ``{'config', 'results': {method: {'ss'|'ms': metrics}}}``.
    """
    config = QUICK if quick else FULL
    horizon = config['horizon']
    needed = max(config['heldout_starts']) + horizon + 1
    train = load_ibm_double_pendulum(root, runs=config['train_runs'], max_samples=horizon + 1)
    heldout_runs = load_ibm_double_pendulum(root, runs=config['heldout_runs'],
                                            max_samples=needed)
    references = dp.state_references(train, horizon).to(device)
    heldout = dp.state_references(heldout_runs, horizon, config['heldout_starts']).to(device)
    results: Dict[str, Any] = {}
    for name in methods:
        results[name] = {}
        for shooting in ('ss', 'ms'):
            fitted = fit(name, shooting, references, config['particles'], config['steps'])
            metrics = dp.trajectory_metrics(fitted['physical'], heldout, DT,
                                            stride=config['stride'])
            finite = torch.isfinite(fitted['physical']).all(-1)
            lengths = fitted['physical'][finite, :2]
            metrics.update({
                'link_lengths_mean': lengths.mean(0).tolist() if len(lengths) else [math.nan] * 2,
                'link_lengths_std': lengths.std(0).tolist() if len(lengths) > 1 else None,
                'diverged_particles': int((~finite).sum()),
                'seconds': fitted['seconds'], 'steps': fitted['steps'],
                'particles': fitted['particles'], 'violation': fitted['violation']})
            results[name][shooting] = metrics
            print(f'  {name}/{shooting}: {fitted["seconds"]:.1f} s', flush=True)
    return {'config': {k: list(v) if isinstance(v, tuple) else v for k, v in config.items()},
            'heldout_windows': int(heldout.shape[0]), 'results': results}


#: Sizes of the link-length study (full run and ``--quick``): maximum likelihood over every
#: 40-frame (0.1 s) window of the first seconds of run 0, each window started on the data.
LENGTHS_FULL = {'run': 0, 'seconds': 10.0, 'window': 40, 'starts': 8, 'steps': 800}
LENGTHS_QUICK = {'run': 0, 'seconds': 2.0, 'window': 40, 'starts': 4, 'steps': 150}
#: Half-width of the box that pins l1 at the published length, m.
PIN_HALF_WIDTH = 5e-4


def length_study(root: Path, quick: bool, device: torch.device) -> Dict[str, Any]:
    """
    Ask the data which first-arm length they support: l1 free against l1 pinned at 0.091 m.

    An unactuated pendulum seen through its angles determines ``l1 = g B / G2`` (the coupling
    inertia ``m2 l1 l2`` over the link-2 gravity term ``g m2 l2``) through ``g`` and the frame
    period.  This fits the 11 parameters by maximum likelihood (Adam from Sobol starts) to
    many short windows, each simulated from its measured start state, once with the prior
    box and once with ``l1`` pinned to ``0.091 +- 0.0005`` m, and reports the best
    log-likelihood (no prior term) and the lengths of each.

    :param root: data root.
    :param quick: :data:`LENGTHS_QUICK` instead of :data:`LENGTHS_FULL`.
    :param device: where the particles and simulations live.
    :return: ``{'config', 'fits': {'free'|'pinned': {'log_likelihood', 'parameters'}},
        'log_likelihood_gap'}``.
    """
    config = LENGTHS_QUICK if quick else LENGTHS_FULL
    samples = int(config['seconds'] / DT)
    run = load_ibm_double_pendulum(root, runs=[config['run']], max_samples=samples + 1)
    window = config['window']
    references = dp.state_references(run, window, range(0, samples - window + 1, window)
                                     ).to(device)
    pinned = {dp.PARAMETER_NAMES[0]: (dp.TRUE_LENGTHS[0] - PIN_HALF_WIDTH,
                                      dp.TRUE_LENGTHS[0] + PIN_HALF_WIDTH)}
    fits: Dict[str, Any] = {}
    for label, bounds in (('free', None), ('pinned', pinned)):
        likelihood = dp.make_likelihood(references, DT, parameters=dp.parameter_map(bounds))
        start = time.perf_counter()
        log_likelihood, physical = dp.maximum_likelihood(likelihood, config['starts'],
                                                         config['steps'])
        fits[label] = {'log_likelihood': log_likelihood,
                       'parameters': dict(zip(dp.PARAMETER_NAMES, physical.tolist())),
                       'seconds': time.perf_counter() - start}
        print(f'  lengths/{label}: {fits[label]["seconds"]:.1f} s', flush=True)
    return {'config': dict(config, windows=int(references.shape[0])), 'fits': fits,
            'log_likelihood_gap': fits['free']['log_likelihood']
            - fits['pinned']['log_likelihood']}


def _fmt(value: Optional[float]) -> str:
    if value is None or not math.isfinite(value):
        return '-'
    return f'{value:.3g}'


def print_report(payload: Dict[str, Any], target: _common.Target) -> None:
    """
    Print the speed table, the Table-2 layout and the link-length study (those that ran).

    :param payload: the figures of :func:`main`.
    :param target: the speed target line.
    """
    speed = payload['speed']
    if speed:
        _common.print_section(
            f'CSVGD speed, MS {speed["windows"]} windows x {speed["horizon"]} steps, '
            f'{speed["device"]}',
            [_common.format_table(
                ['particles', 'it/s (best)', 'it/s (runs)', 'load avg (1 min)', 'warm-up s'],
                [[p, _fmt(v), ' '.join(_fmt(r) for r in speed['it_per_s_runs'][p]),
                  ' '.join(f'{a:.2f}' for a in speed['load_average'][p]),
                  _fmt(speed['warmup_s'][p])] for p, v in speed['it_per_s'].items()]),
             target.line()])
    table = payload['table']
    if table:
        rows = []
        for name, by_shooting in table['results'].items():
            for shooting, m in by_shooting.items():
                rows.append([f'{name.upper()} ({shooting.upper()})', _fmt(m['kl_real_sim']),
                             _fmt(m['kl_sim_real']), _fmt(m['mmd']),
                             ' / '.join(f'{v:.4f}' for v in m['link_lengths_mean'])])
        _common.print_section(
            f'Table 2: held-out IBM windows ({table["heldout_windows"]} x '
            f'{table["config"]["horizon"]} steps)',
            [_common.format_table(['method', 'KL(real||sim)', 'KL(sim||real)', 'MMD',
                                   'l1 / l2 [m] (0.091 / 0.070)'], rows)])
    lengths = payload['lengths']
    if lengths:
        config = lengths['config']
        rows = [[label, _fmt(fit['log_likelihood'])]
                + [f'{fit["parameters"][name]:.4f}'
                   for name in ('link_1/length', 'link_2/length', 'link_1/com')]
                for label, fit in lengths['fits'].items()]
        _common.print_section(
            f'Link lengths by maximum likelihood: {config["windows"]} windows of '
            f'{config["window"]} frames, first {config["seconds"]:g} s of run {config["run"]}',
            [_common.format_table(['l1', 'log-likelihood', 'l1 [m]', 'l2 [m]', 'c1 [m]'],
                                  rows),
             f'log-likelihood gap, free - pinned: {lengths["log_likelihood_gap"]:.4g}'])


def main(argv: Optional[Sequence[str]] = None) -> int:
    """
    Run the benchmark.

    :param argv: command-line arguments (``sys.argv[1:]`` when None).
    :return: exit status (0).
    """
    parser = _common.make_parser(__doc__.strip().splitlines()[0], threads=1)
    parser.add_argument('--data', default=None, help='shared data root (holding INDEX.md)')
    parser.add_argument('--device', default=None,
                        help='torch device (default: cuda when available, else cpu)')
    parser.add_argument('--methods', default=','.join(METHODS),
                        help=f'comma-separated subset of {",".join(METHODS)}')
    parser.add_argument('--sections', default=','.join(SECTIONS),
                        help=f'comma-separated subset of {",".join(SECTIONS)}')
    # The per-step tensors are tiny (P x windows states): intra-op threads only add
    # synchronisation (4x slower with 2 threads on the shared 2-core machine), so 1 thread.
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device or ('cuda' if torch.cuda.is_available() else 'cpu'))
    root = _common.data_root(args.data, 'inference.py')
    methods: List[str] = [m for m in args.methods.split(',') if m]
    sections = [name for name in args.sections.split(',') if name]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f'unknown section(s) {unknown}; valid: {",".join(SECTIONS)}')
    speed = speed_study(root, args.quick, device) if 'speed' in sections else None
    table = table_study(root, args.quick, device, methods) if 'table' in sections else None
    lengths = length_study(root, args.quick, device) if 'lengths' in sections else None
    at_100 = speed['it_per_s'].get('100') if speed else None
    target = _common.Target('CSVGD it/s at 100 particles', at_100, SPEED_TARGET_IT_S, 'it/s',
                            at_most=False)
    payload = {'machine': _common.machine_info(PACKAGES), 'quick': args.quick,
               'speed': speed, 'table': table, 'lengths': lengths,
               'results': {name: {s: {k: m[k] for k in ('kl_real_sim', 'kl_sim_real', 'mmd')}
                                  for s, m in by.items()}
                           for name, by in (table['results'] if table else {}).items()},
               'it_per_s': speed['it_per_s'] if speed else {}, 'target': target.to_dict()}
    print_report(payload, target)
    if args.json:
        _common.write_json(args.json, payload)
    return 0


if __name__ == '__main__':
    sys.exit(main())
