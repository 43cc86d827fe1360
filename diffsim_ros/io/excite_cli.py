"""
``diffsim-excite``: design an excitation trajectory for identifying a robot.

::

    diffsim-excite --robot NAME|URDF --duration S [--period P] [--harmonics K] [--rate HZ]
                   [--criterion condition|logdet] [--iterations N] [--seed N]
                   [--margin RAD] [--velocity-scale F] [--torque-scale F] --out DIR

Identification is only as good as the excitation: the data determine the base parameters
only as well as the base regressor of the samples is conditioned (what ``diffsim-fit``
reports as ``excitation``).  This command optimises a periodic Fourier series per joint
(:func:`diffsim_ros.sysid.excitation.design_excitation`: Swevers et al. 1997, the form of
Gaz et al.'s Panda excitation) for that conditioning, within the joint, velocity and torque
limits of the robot (:func:`~diffsim_ros.sysid.excitation.excitation_limits`; torques of the
nominal model with gravity and friction), starting and ending at rest, and writes to
``--out``:

* ``excitation.csv``: the trajectory at ``--rate`` over ``--duration`` (whole periods) in the
  table format ``diffsim-fit`` reads (``t``, ``q:``, ``qd:``, ``qdd:``, and the nominal
  model's torques as ``tau:``), so that ``diffsim-fit excitation.csv --robot R`` runs on it
  (a smoke test: it fits the nominal model back, and may exit 4, since no fit simulates
  torques that the nominal model made better than the nominal model);
* ``excitation.yaml``: the series (:func:`~diffsim_ros.sysid.excitation.trajectory_document`)
  that the mpc node tracks (parameter ``reference_file``) and ``diffsim-sim-eval
  --reference`` evaluates, with the condition numbers and the limit check.

It prints the condition number of a plain sinusoid per joint, of the random start and of
the optimised trajectory (one period at ``--rate``).  On the robot: move it to ``q_start``
(in the YAML), run the mpc node with ``reference_file:=excitation.yaml``, record
``joint_states`` and fit the recording with ``diffsim-fit``.

Measured in simulation (``diffsim-sim-eval --reference FILE --duration 10``, plant 30 % off
nominal, seed 0) on the 20 s designs of :mod:`diffsim_ros.sysid.excitation`: computed torque
tracks the Panda's with 0.025 rad RMS (its sinusoid task: 0.038), the WAM-4's with 0.080
(task 0.040; on the exact plant 3e-5); the nominal iLQR MPC tracks the WAM-4's with 0.017
(task 0.008): the optimised trajectories are harder to follow than the task's single
sinusoid on the slow WAM, whose speed limits they use to 90 %.

Robots with passive joints (Qube, cart-pole) are refused: a passive joint cannot follow a
reference, and designing the actuated joint's trajectory on a simulation of the pendulum
would optimise a prediction that does not hold on the robot (the Qube's pendulum is nearly
undamped and sensitive to its start); excite them with chirps or swing-ups of the actuated
joint, as the shared Quanser recordings do (condition numbers 3-19; see
:mod:`diffsim_ros.sysid.excitation`).

exit status: 0 written; 2 bad input (one line on stderr); 130 interrupted.
"""

import argparse
import math
from pathlib import Path
import sys
from typing import Any, Dict, Optional, Sequence

import torch

import yaml

from .fit_inputs import check_out, load_robot
from .fit_options import number_type, OneLineParser, path_type, reported, UsageError
from .tables import write_csv
from ..sysid.dataset import Trajectory
from ..sysid.excitation import (CRITERIA, design_excitation, DesignConfig, excitation_limits,
                                ExcitationDesign, nominal_torque, trajectory_document)

PROG = 'diffsim-excite'
EXIT_USAGE = 2
#: Default period, s (Gaz et al.'s Panda excitation: 2 pi / (0.15 pi) = 13.3 s).
DEFAULT_PERIOD_S = 10.0
#: Check rate of a bare URDF (no driver rate in the catalog), Hz.
DEFAULT_RATE_HZ = 500.0
CSV_NAME, YAML_NAME = 'excitation.csv', 'excitation.yaml'

EPILOG = """
example:
  diffsim-excite --robot panda --duration 20 --out excite/panda
  diffsim-fit excite/panda/excitation.csv --robot panda --method nea --out fits/smoke

exit status:
  0    excitation.csv and excitation.yaml written
  2    bad input or unwritable --out: one line on stderr
  130  interrupted
"""


def build_parser() -> argparse.ArgumentParser:
    """
    Return the command-line parser of ``diffsim-excite``.

    :return: the parser.
    """
    parser = OneLineParser(
        prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
        description='Optimise a periodic Fourier excitation trajectory for the condition of '
        'the base regressor within the joint, velocity and torque limits; write it as '
        f"{CSV_NAME} (diffsim-fit table) and {YAML_NAME} (the mpc node's reference_file).")
    parser.add_argument('--robot', required=True,
                        help='robot name (fully actuated: wam4, wam7, panda, double_pendulum, '
                        'simple_pendulum) or a URDF file (every joint commanded)')
    parser.add_argument('--duration', type=number_type(float, 1e-3), required=True,
                        help='length of the trajectory, s; rounded to whole periods')
    parser.add_argument('--out', type=path_type, required=True,
                        help='output directory (created)')
    parser.add_argument('--period', type=number_type(float, 1e-3), default=None,
                        help=f'period of the series, s (base frequency 1 / period; default '
                        f'{DEFAULT_PERIOD_S:g} s, or the duration when shorter)')
    parser.add_argument('--harmonics', type=number_type(int, 2, 100), default=5,
                        help='harmonics per joint, >= 2 (default: %(default)s)')
    parser.add_argument('--rate', type=number_type(float, 1.0, 1e5), default=None,
                        help='sample rate of the CSV and of the limit check, Hz (default: the '
                        f"robot's driver rate, {DEFAULT_RATE_HZ:g} for a URDF)")
    parser.add_argument('--criterion', choices=CRITERIA, default='condition',
                        help='condition: minimise the condition number of the column-'
                        'normalised base regressor (what diffsim-fit reports); logdet: '
                        'maximise the log-determinant of its Gram matrix (default: '
                        '%(default)s)')
    parser.add_argument('--iterations', type=number_type(int, 0, 100000), default=300,
                        help='optimiser (Adam) steps (default: %(default)s)')
    parser.add_argument('--seed', type=number_type(int, 0, 2 ** 63 - 1), default=0,
                        help='seed of the random start (default: %(default)s)')
    parser.add_argument('--margin', type=number_type(float, 0.0), default=0.1,
                        help='distance kept from every position limit, rad or m (default: '
                        '%(default)s)')
    parser.add_argument('--velocity-scale', type=number_type(float, 1e-3, 1.0), default=0.9,
                        help='fraction of the velocity limits to use (default: %(default)s)')
    parser.add_argument('--torque-scale', type=number_type(float, 1e-3, 1.0), default=0.9,
                        help='fraction of the torque limits the nominal torque may use '
                        '(default: %(default)s)')
    return parser


def _period_and_duration(args: argparse.Namespace) -> tuple:
    """Return ``(period, duration as whole periods)``."""
    period = args.period if args.period is not None else min(DEFAULT_PERIOD_S, args.duration)
    periods = max(1, round(args.duration / period))
    return period, periods * period


def _samples(design: ExcitationDesign, model: Any, duration: float, rate: float) -> Trajectory:
    """Return the trajectory sampled at ``rate`` from 0 to ``duration`` with nominal torques."""
    t = torch.arange(int(round(duration * rate)) + 1, dtype=torch.float64) / rate
    q, qd, qdd = design.trajectory.evaluate(t)
    with torch.no_grad():
        tau = nominal_torque(model, q, qd, qdd)
    return Trajectory(t=t, q=q, joint_names=model.joint_names, qd=qd, qdd=qdd, tau=tau,
                      run='excitation')


def _summary(design: ExcitationDesign, config: DesignConfig, model: Any) -> Dict[str, Any]:
    """Return what the YAML records about the design."""
    def condition(measured) -> Optional[float]:
        return measured.to_dict()['condition_number']
    limits = design.limits
    return {
        'criterion': design.criterion, 'iterations': design.iterations, 'seed': config.seed,
        'rate_hz': config.check_rate_hz,
        'condition_number': {'optimised': condition(design.excitation),
                             'random_start': condition(design.start_excitation),
                             'plain_sinusoid': condition(design.sinusoid_excitation)},
        'rank': design.excitation.rank, 'base_parameters': design.excitation.base_parameters,
        'least_excited': design.excitation.least_excited,
        'limits': {'margin': config.margin, 'velocity_scale': config.velocity_scale,
                   'torque_scale': config.torque_scale, 'satisfied': limits['satisfied'],
                   'coefficient_scale': design.scale,
                   'position_gap': limits['position_gap'],
                   'velocity_ratio': limits['velocity_ratio'],
                   'torque_ratio': limits['torque_ratio']},
        'wall_time_s': design.wall_time_s,
    }


def _fmt(value: float) -> str:
    return f'{value:.4g}' if math.isfinite(value) else 'inf'


def excite(args: argparse.Namespace) -> Dict[str, Any]:
    """
    Design the excitation of ``args`` and write the files (module docstring).

    :param args: parsed arguments.
    :return: the YAML's summary plus ``csv`` and ``yaml`` (paths).
    :raises UsageError: bad input (passive joints, limits that leave no room, unwritable out).
    """
    model, info, label = load_robot(args.robot)
    try:
        limits = excitation_limits(model, info)
    except ValueError as error:
        hint = '' if info is None else (f' (excite it with chirps or swing-ups of '
                                        f'{list(info.command_joints)})')
        raise UsageError(f'{error}{hint}') from None
    check_out(args.out)
    period, duration = _period_and_duration(args)
    if abs(duration - args.duration) > 1e-9:
        sys.stderr.write(f'{PROG}: --duration {args.duration:g} s rounded to {duration:g} s '
                         f'({round(duration / period)} periods of {period:g} s)\n')
    rate = args.rate or (info.driver_rate_hz if info is not None else DEFAULT_RATE_HZ)
    with reported('', ValueError):
        config = DesignConfig(period_s=period, harmonics=args.harmonics,
                              criterion=args.criterion, iterations=args.iterations,
                              margin=args.margin, velocity_scale=args.velocity_scale,
                              torque_scale=args.torque_scale, check_rate_hz=rate,
                              seed=args.seed)
        limits.tightened(config.margin, config.velocity_scale, config.torque_scale)
    sys.stderr.write(f'{PROG}: {label}, {model.n} joints, {args.harmonics} harmonics, period '
                     f'{period:g} s, {args.iterations} iterations ...\n')
    with reported(f'{label}', ValueError):
        design = design_excitation(model, limits, config)
    summary = _summary(design, config, model)
    out = Path(args.out)
    with reported(f'cannot write to --out {str(out)!r}', OSError):
        csv_path = write_csv(out / CSV_NAME, _samples(design, model, duration, rate))
        yaml_path = out / YAML_NAME
        document = trajectory_document(design.trajectory, label, duration, summary)
        yaml_path.write_text(f'# Excitation trajectory of {label} (diffsim-excite): move the '
                             'robot to q_start at rest, then track the series\n'
                             + yaml.safe_dump(document, sort_keys=False, width=99),
                             encoding='utf-8')
    lines = [
        f'condition number of the base regressor ({design.excitation.base_parameters} base '
        f'parameters, one period at {rate:g} Hz):',
        f'  plain sinusoid  {_fmt(design.sinusoid_excitation.condition_number)}',
        f'  random start    {_fmt(design.start_excitation.condition_number)}',
        f'  optimised       {_fmt(design.excitation.condition_number)}  (criterion '
        f'{design.criterion}, {design.iterations} iterations, {design.wall_time_s:.1f} s)',
        f'limits (margin {config.margin:g}, {100 * config.velocity_scale:g} % of the velocity '
        f'and {100 * config.torque_scale:g} % of the torque limits): '
        f'{"satisfied" if design.limits["satisfied"] else "VIOLATED"}; largest velocity '
        f'{max(design.limits["velocity_ratio"]):.3g}, torque '
        f'{max(design.limits["torque_ratio"]):.3g} of the tightened limits',
        f'wrote {csv_path} ({duration:g} s) and {yaml_path}',
    ]
    sys.stdout.write('\n'.join(lines) + '\n')
    return {**summary, 'csv': str(csv_path), 'yaml': str(yaml_path)}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """
    Run ``diffsim-excite``.

    :param argv: arguments without the program name; ``None`` reads ``sys.argv``.
    :return: exit code: 0 written, 2 bad input (one line on stderr), 130 interrupted.
    """
    try:
        args = build_parser().parse_args(argv)
        excite(args)
    except UsageError as exc:
        sys.stderr.write(f'{PROG}: error: {exc}\n')
        return EXIT_USAGE
    except SystemExit as exc:   # --help
        return int(exc.code or 0)
    except KeyboardInterrupt:
        sys.stderr.write(f'{PROG}: interrupted\n')
        return 130
    return 0


if __name__ == '__main__':
    sys.exit(main())
