"""
Short dynamics demo: release a robot from a displaced pose and check energy conservation.

This is a placeholder for ``diffsim-demo`` until the full demo lands (the identification
and adaptive-MPC launch running against the simulated robot).  It loads a robot
description from :mod:`diffsim_ros.robots` and integrates its free motion with RK4: zero
joint torques and no friction or damping model (``rollout`` without ``torque_fn``
integrates the rigid-body dynamics alone), so the mechanical energy should stay constant.
It prints progress and writes ``report.json`` (energy drift, final state, wall time) into
``--out``.
"""

import argparse
import json
import math
from pathlib import Path
import sys
import time
from typing import List, Optional, Sequence

import torch

from . import robots
from .core import kinetic_energy, load_urdf, potential_energy, RobotModel, rollout

#: Initial displacement of every joint from zero: radians (revolute) or metres (prismatic).
DISPLACEMENT_RAD = 0.5
DISPLACEMENT_M = 0.05
PROGRESS_CHUNKS = 5


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    """
    Parse the command line.

    :param argv: arguments without the program name; ``None`` reads ``sys.argv``.
    :return: the parsed arguments.
    """
    parser = argparse.ArgumentParser(
        prog='diffsim-demo',
        description='Release a robot from a displaced pose with zero joint torques and no '
                    'friction, integrate with RK4 and report the energy drift.')
    parser.add_argument('--robot', default='qube',
                        help='robot description name (default: %(default)s)')
    parser.add_argument('--out', type=Path, default=Path('demo_out'),
                        help='directory for report.json (default: %(default)s)')
    parser.add_argument('--duration', type=float, default=2.0,
                        help='simulated time in seconds (default: %(default)s)')
    parser.add_argument('--dt', type=float, default=0.002,
                        help='integration step in seconds (default: %(default)s)')
    args = parser.parse_args(argv)
    names = list(robots.names())
    if args.robot not in names:
        parser.error(f'unknown robot {args.robot!r}; valid names: {", ".join(names)}')
    if not (math.isfinite(args.duration) and args.duration > 0.0):
        parser.error(f'--duration must be a positive number of seconds, got {args.duration}')
    if not (math.isfinite(args.dt) and 0.0 < args.dt <= args.duration):
        parser.error(f'--dt must be in (0, duration], got {args.dt}')
    return args


def displaced_pose(model: RobotModel) -> torch.Tensor:
    """
    Return a pose displaced from zero on every joint, kept inside the joint limits.

    :param model: the robot.
    :return: joint positions ``(n,)`` [rad or m].
    """
    q = torch.tensor([DISPLACEMENT_M if kind == 'prismatic' else DISPLACEMENT_RAD
                      for kind in model.tree.joint_types], dtype=model.dtype)
    lower = model.lower.to(model.dtype)
    upper = model.upper.to(model.dtype)
    margin = torch.where(torch.isfinite(upper - lower), 0.1 * (upper - lower),
                         torch.zeros_like(q))
    return torch.minimum(torch.maximum(q, lower + margin), upper - margin)


def mechanical_energy(model: RobotModel, states: torch.Tensor) -> torch.Tensor:
    """
    Return kinetic plus gravitational potential energy of each state.

    :param model: the robot.
    :param states: ``(..., 2n)`` stacked ``[q, qd]``.
    :return: energy ``(...)`` [J], potential zero at the world origin.
    """
    q, qd = states[..., :model.n], states[..., model.n:]
    return kinetic_energy(model, q, qd) + potential_energy(model, q)


def simulate(model: RobotModel, x0: torch.Tensor, steps: int, dt: float) -> torch.Tensor:
    """
    Integrate the free motion in chunks, printing progress after each.

    :param model: the robot.
    :param x0: initial state ``(2n,)``.
    :param steps: number of integration steps.
    :param dt: step [s].
    :return: states ``(steps + 1, 2n)``.
    """
    energy0 = float(mechanical_energy(model, x0))
    chunks: List[torch.Tensor] = [x0.unsqueeze(0)]
    done = 0
    for chunk in range(PROGRESS_CHUNKS):
        count = steps * (chunk + 1) // PROGRESS_CHUNKS - done
        if count == 0:
            continue
        controls = torch.zeros(count, model.n, dtype=x0.dtype)
        states = rollout(model, chunks[-1][-1], controls, dt, method='rk4')
        chunks.append(states[1:])
        done += count
        drift = float(mechanical_energy(model, states[-1])) - energy0
        print(f'  t = {done * dt:7.3f} s   energy change {drift:+.3e} J', flush=True)
    return torch.cat(chunks)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """
    Run the demo.

    :param argv: command-line arguments without the program name; ``None`` reads
        ``sys.argv``.
    :return: process exit status (0 on success).
    """
    args = parse_args(argv)
    model = load_urdf(robots.urdf_path(args.robot), dtype=torch.float64)
    steps = max(1, round(args.duration / args.dt))
    q0 = displaced_pose(model)
    x0 = torch.cat([q0, torch.zeros_like(q0)])
    print(f'diffsim-demo: {args.robot}, {model.n} joints ({", ".join(model.joint_names)})',
          flush=True)
    print(f'  undamped release from q0 = {[round(v, 4) for v in q0.tolist()]}, '
          f'{steps} RK4 steps of {args.dt} s', flush=True)

    start = time.perf_counter()
    states = simulate(model, x0, steps, args.dt)
    wall = time.perf_counter() - start

    energy = mechanical_energy(model, states)
    kinetic_peak = float(kinetic_energy(model, states[:, :model.n], states[:, model.n:]).max())
    drift = float((energy - energy[0]).abs().max())
    final = states[-1]
    report = {
        'robot': args.robot,
        'joint_names': list(model.joint_names),
        'dt_s': args.dt,
        'steps': steps,
        'duration_s': steps * args.dt,
        'method': 'rk4',
        'initial_energy_J': float(energy[0]),
        'energy_drift_max_abs_J': drift,
        'energy_drift_relative_to_peak_kinetic': (drift / kinetic_peak if kinetic_peak > 0
                                                  else None),
        'peak_kinetic_energy_J': kinetic_peak,
        'final_state': {
            'q': dict(zip(model.joint_names, final[:model.n].tolist())),
            'qd': dict(zip(model.joint_names, final[model.n:].tolist())),
        },
        'wall_time_s': wall,
        'wall_time_per_step_us': 1e6 * wall / steps,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / 'report.json'
    path.write_text(json.dumps(report, indent=2) + '\n')
    print(f'  max |energy drift| {drift:.3e} J '
          f'(peak kinetic energy {kinetic_peak:.3e} J), wall time {wall:.2f} s', flush=True)
    print(f'wrote {path}', flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
