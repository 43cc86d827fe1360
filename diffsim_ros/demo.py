"""
Offline identification demo: a simulated robot with hidden parameters, recorded and refitted.

Stands in for the ROS demo (identifier, adaptive MPC, monitor and simulated driver over DDS)
until its nodes land.  It runs the same data path a user runs on a real robot:

1. a MuJoCo plant whose true parameters are ``--param-error`` off the nominal URDF (masses,
   CoMs, inertias, damping, Coulomb friction, armature) is excited for ``--duration`` s;
2. the run is recorded as a rosbag2 ``.mcap`` (JointState + Float64MultiArray commands);
3. ``diffsim-fit`` identifies a model from that bag (DiffNEA by default);
4. the identified model is scored against the hidden truth: identifiable (base) parameters
   and 1 s / 2 s rollout prediction error on held-out data, next to the nominal model.

It writes ``recording.mcap``, ``fit/`` (params.yaml, model.urdf, metrics.json, report.png)
and ``report.json`` into ``--out``.
"""

import argparse
import json
from pathlib import Path
import sys
import time
from typing import Dict, Optional, Sequence

import torch

from . import robots
from .core import load_urdf, RobotModel
from .io import write_bag
from .io.fit_cli import main as fit_main
from .sim import excitation_for, MujocoPlant, nominal_model, PlantConfig
from .sysid.nea import base_parameters


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    """
    Parse the command line.

    :param argv: arguments without the program name; ``None`` reads ``sys.argv``.
    :return: the parsed arguments.
    """
    parser = argparse.ArgumentParser(
        prog='diffsim-demo',
        description='Identify a simulated robot with hidden parameters from a recorded bag.')
    parser.add_argument('--robot', default='qube', choices=robots.names())
    parser.add_argument('--out', default='demo_out', type=Path, help='output directory')
    parser.add_argument('--duration', default=12.0, type=float,
                        help='excitation length in s (default 12)')
    parser.add_argument('--param-error', default=0.3, type=float,
                        help='relative error of the hidden true parameters (default 0.3)')
    parser.add_argument('--rate', default=100.0, type=float,
                        help='recording rate in Hz (default 100)')
    parser.add_argument('--method', default='diffnea', choices=('nea', 'diffnea'))
    parser.add_argument('--seed', default=0, type=int, help='seed of the hidden parameters')
    args = parser.parse_args(argv)
    for name in ('duration', 'rate'):
        if not getattr(args, name) > 0:
            parser.error(f'--{name} must be positive')
    if not 0.0 <= args.param_error < 1.0:
        parser.error('--param-error must be in [0, 1)')
    return args


def record(args: argparse.Namespace) -> tuple:
    """
    Excite the plant and return its true model, nominal model and the recorded run.

    :param args: parsed arguments.
    :return: ``(plant, run)``.
    """
    plant = MujocoPlant(PlantConfig(robot=args.robot, rate_hz=args.rate,
                                    param_error=args.param_error, seed=args.seed,
                                    joint_limits=False, encoder_counts_per_rev=0))
    commands = excitation_for(plant, 'multisine', duration=args.duration, fraction=0.3,
                              band=(0.2, 2.0), generator=torch.Generator().manual_seed(args.seed))
    run = plant.run(commands, run='demo').replace(poses={}, qdd=None)
    return plant, run


def parameter_report(nominal: RobotModel, identified: RobotModel,
                     true: RobotModel) -> Dict[str, Dict[str, float]]:
    """
    Compare identifiable parameter combinations of three models.

    :param nominal: the URDF model the fit started from.
    :param identified: the fitted model.
    :param true: the plant's hidden model.
    :return: ``{expression: {'estimate', 'true', 'nominal', 'relative_error'}}``.
    """
    base = base_parameters(true)
    values = {key: base.values(model.to(torch.float64)) for key, model in
              (('estimate', identified), ('true', true), ('nominal', nominal))}
    report = {}
    for i, expression in enumerate(base.expressions(digits=4)):
        entry = {key: float(v[i]) for key, v in values.items()}
        scale = max(abs(entry['true']), 1e-12)
        entry['relative_error'] = abs(entry['estimate'] - entry['true']) / scale
        entry['nominal_relative_error'] = abs(entry['nominal'] - entry['true']) / scale
        report[expression] = entry
    return report


def main(argv: Optional[Sequence[str]] = None) -> int:
    """
    Run the demo.

    :param argv: command-line arguments; ``None`` reads ``sys.argv``.
    :return: exit code (0 on success, 1 when identification did not beat the nominal model).
    """
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    info = robots.get(args.robot)
    print(f'[1/4] simulating {args.robot} (MuJoCo, parameters {args.param_error:.0%} off '
          f'nominal, seed {args.seed}) for {args.duration:g} s', flush=True)
    plant, run = record(args)
    bag = args.out / 'recording.mcap'
    command_topic = f'/{info.controller_name}/commands'
    write_bag(bag, run, command_topic=command_topic, overwrite=True)
    print(f'[2/4] recorded {len(run)} samples to {bag}', flush=True)
    print(f'[3/4] diffsim-fit {bag.name} --robot {args.robot} --method {args.method}',
          flush=True)
    fit_dir = args.out / 'fit'
    code = fit_main([str(bag), '--robot', args.robot, '--method', args.method,
                     '--command-topic', command_topic, '--out', str(fit_dir),
                     '--seed', str(args.seed)])
    if code != 0:
        print(f'diffsim-fit failed with exit code {code}', file=sys.stderr)
        return code
    metrics = json.loads((fit_dir / 'metrics.json').read_text(encoding='utf-8'))
    identified = load_urdf(fit_dir / 'model.urdf')
    nominal = nominal_model(args.robot)
    identified = identified.replace(armature=nominal.armature)
    parameters = parameter_report(nominal, identified, plant.true_model)
    # Horizons longer than the validation data have no windows (NMSE None): left out.
    prediction = {horizon: {'identified': metrics['rollout'][horizon]['nmse'],
                            'nominal': metrics['nominal']['rollout'][horizon]['nmse']}
                  for horizon in metrics['rollout']
                  if metrics['rollout'][horizon].get('nmse') is not None
                  and metrics['nominal']['rollout'].get(horizon, {}).get('nmse') is not None}
    errors = sorted(p['relative_error'] for p in parameters.values())
    success = bool(prediction) and all(v['identified'] < v['nominal']
                                       for v in prediction.values())
    report = {
        'robot': args.robot, 'method': args.method, 'param_error': args.param_error,
        'seed': args.seed, 'samples': len(run), 'rate_hz': args.rate,
        'success': success, 'prediction_nmse': prediction,
        'median_base_parameter_error': errors[len(errors) // 2],
        'parameters': parameters, 'fit_wall_time_s': metrics.get('wall_time_s'),
        'wall_time_s': time.perf_counter() - start,
        'outputs': {'bag': str(bag), 'fit': str(fit_dir)},
    }
    (args.out / 'report.json').write_text(json.dumps(report, indent=2), encoding='utf-8')
    print('[4/4] identified vs hidden truth:', flush=True)
    for horizon, value in prediction.items():
        print(f'  rollout NMSE {horizon}: identified {value["identified"]:.3g}, '
              f'nominal {value["nominal"]:.3g}')
    nominal_errors = sorted(p['nominal_relative_error'] for p in parameters.values())
    print(f'  base parameters: median relative error {errors[len(errors) // 2]:.2%} '
          f'(nominal model: {nominal_errors[len(errors) // 2]:.2%})')
    print(f'wrote {args.out / "report.json"} and {fit_dir}/ in {report["wall_time_s"]:.1f} s')
    return 0 if success else 1


if __name__ == '__main__':
    sys.exit(main())
