"""
``diffsim-sim-eval``: closed-loop evaluation of the controllers on the simulated robots.

The plant is a :class:`~diffsim_ros.sim.MujocoPlant` whose true parameters are drawn
``--param-error`` off the nominal ones from ``--seed`` (it also has Coulomb friction and motor
dynamics the model lacks); every controller starts from the nominal model
(``robots.interface(name).nominal_model()``), or with ``--model PATH`` from a
``diffsim-fit --out`` folder (or its ``params.yaml``: :func:`~diffsim_ros.io.fits.load_fit`,
checked by the robot interface), whose friction module (a sigmoid, Stribeck) the controller
applies too. The controllers:

- ``nominal-mpc``: iLQR MPC on the nominal model;
- ``adaptive-mpc``: the same MPC wrapped in :class:`~diffsim_ros.control.adaptive.AdaptiveMPC`,
  which refits the model from what it observes and keeps it across episodes (that is how it
  learns);
- ``baseline``: energy swing-up + LQR (Quanser robots) or computed torque (arms) on the
  nominal model;
- ``adaptive-baseline``: the same baseline wrapped in
  :class:`~diffsim_ros.control.adaptive.AdaptiveMPC` (its constants and LQR gain are
  rederived from every accepted model).

The MPC replans at the task's control rate (simulated time) and its feedback policy is applied
at the driver rate.  Rollouts run in the native kernel (``ILQRConfig(native=True)``), or
compiled where it does not apply.  Each episode is scored by
:func:`diffsim_ros.control.tasks.evaluate`; the table goes to stdout and ``--json`` gets the
full record: ``success_rate``, ``episodes`` (per episode: ``success``, ``swing_up_time_s``
or ``tracking_rms``, ``refits``, ``param_error``), ``mean_swing_up_time_s`` (successful
episodes) or ``tracking_rms``, ``refits``,
``final_param_error`` and its definition (:func:`~diffsim_ros.control.adaptive.
parameter_error`: relative inverse-dynamics error of the controller's model against the true
one at random states, 0 when every identifiable inertial and friction parameter is exact).

Progress goes to stdout as it runs: a start line (robot, controller, episodes, their simulated
length), the native kernel's preparation (built on the first run on a machine), a line at every
fifth of an episode's simulated time (refits so far, wall time), a line per finished episode
and the summary, numbers rounded to what they mean.

Exit status: 0 when the evaluation ran (whatever its success rate), 2 for bad arguments
(argparse's usage line and message on stderr) and for a ``--model`` that does not load or that
the robot interface refuses (one line on stderr).

>>> main(['--robot', 'qube', '--controller', 'adaptive-mpc', '--episodes', '3',
...       '--param-error', '0.3', '--seed', '1', '--json', 'qube.json'])
"""

import argparse
import json
import math
from pathlib import Path
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import torch
from torch import nn

from . import robots
from .control.adaptive import AdaptiveMPC, parameter_error
from .control.baselines import ComputedTorque, SwingUpLQR
from .control.dynamics import ModelDynamics
from .control.ilqr import ILQRConfig
from .control.tasks import evaluate, get_task, make_ilqr, reference, start_state, SWING_UP, \
    Task, task_names, upright_angle
from .core import RobotModel
from .core.native import native_available
from .io.fits import Fit, FitFileError, load_fit
from .nodes.identifier import engine_options, PHYSICAL_ESTIMATORS
from .nodes.reference import load_reference_task, ReferenceFileError
from .sim import MujocoPlant, PlantConfig

CONTROLLERS = ('nominal-mpc', 'adaptive-mpc', 'baseline', 'adaptive-baseline')
PARAM_ERROR_DEFINITION = (
    'relative inverse-dynamics error of the controller model vs the true plant model at 256 '
    'random states: sqrt(mean_j sum_s (tau_model - tau_true)^2 / sum_s tau_true^2) with '
    'tau = rnea + damping qd + coulomb tanh(qd / 0.01); 0 iff every identifiable inertial and '
    'friction parameter is exact')
#: In-episode progress lines per episode (at equal fractions of its simulated time).
PROGRESS_LINES = 4


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    """
    Parse and validate the command line (bad values exit with status 2).

    :param argv: arguments without the program name; ``None`` reads ``sys.argv``.
    :return: the parsed arguments.
    """
    parser = argparse.ArgumentParser(
        prog='diffsim-sim-eval',
        description='Closed-loop evaluation of nominal MPC, adaptive MPC and baselines on a '
                    'simulated robot whose parameters differ from the nominal model.',
        epilog='exit status: 0 the evaluation ran (whatever its success rate); 2 bad '
               'arguments (one message on stderr). Progress goes to stdout: a start line, '
               'a line at every fifth of an episode and one per finished episode.')
    parser.add_argument('--robot', default='qube', choices=task_names())
    parser.add_argument('--controller', default='adaptive-mpc', choices=CONTROLLERS)
    parser.add_argument('--episodes', default=3, type=int, help='episodes (default 3)')
    parser.add_argument('--param-error', default=0.3, type=float,
                        help='relative error of the true parameters (default 0.3)')
    parser.add_argument('--seed', default=0, type=int, help='seed of the true parameters')
    parser.add_argument('--json', type=Path, help='write the results to this JSON file')
    parser.add_argument('--quick', action='store_true',
                        help='cheaper MPC (shorter horizon, one iteration) for smoke tests')
    parser.add_argument('--duration', type=float,
                        help="episode length in s (default: the task's)")
    parser.add_argument('--estimator', choices=PHYSICAL_ESTIMATORS,
                        help="estimator of the adaptive MPC (default: the identifier node's, "
                             'config/<robot>.yaml)')
    parser.add_argument('--reference', type=Path, metavar='FILE',
                        help='track this excitation trajectory (excitation.yaml of '
                        "diffsim-excite) instead of the task's reference; arms only")
    parser.add_argument('--model', type=Path, metavar='PATH',
                        help="the controller's starting model: a diffsim-fit --out folder or "
                             'its params.yaml (default: the nominal model)')
    parser.add_argument('--threads', default=1, type=int,
                        help='torch intra-op threads (default 1: the loop works on small '
                             'tensors, and on a busy machine more threads cost far more than '
                             'they give)')
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error('--threads must be >= 1')
    if args.episodes < 1:
        parser.error('--episodes must be >= 1')
    if not (math.isfinite(args.param_error) and 0.0 <= args.param_error < 1.0):
        parser.error('--param-error must be in [0, 1)')
    if args.seed < 0:
        parser.error('--seed must be >= 0')
    if args.duration is not None and not (math.isfinite(args.duration) and args.duration > 0):
        parser.error('--duration must be positive')
    args.task = get_task(args.robot)
    if args.reference is not None:
        try:
            args.task = load_reference_task(args.reference, args.robot,
                                            robots.interface(args.robot).nominal_model())
        except ReferenceFileError as error:
            parser.error(str(error))
    return args


def control_model(robot: str, model: RobotModel) -> RobotModel:
    """
    Return the model the controllers plan with for a robot's command interface.

    When the driver adds gravity compensation (libfranka), a command ``u`` produces the
    torque ``u + g(q)``, so the plant behaves as the model without gravity. That is also the
    model ``adaptive-mpc`` refits from the commands: the gravity terms are not in the data,
    and the first moments are identified from the inertial and Coriolis terms alone (what
    the planner needs, since the driver cancels gravity). The simulated driver cancels the
    plant's true gravity; a real one cancels its own model's, and the difference is an
    unmodelled torque no refit of this model can absorb.

    :param robot: catalog name.
    :param model: rigid-body model.
    :return: ``model``, or a copy with zero gravity.
    """
    if robots.interface(robot).driver_adds_gravity:
        return model.replace(gravity=torch.zeros_like(model.gravity))
    return model


def make_controller(kind: str, task: Task, model: RobotModel, rate_hz: float, quick: bool,
                    estimator: Optional[str] = None, truth=None,
                    friction: Optional[nn.Module] = None) -> tuple:
    """
    Build a controller and the number of driver ticks between its solves.

    :param kind: one of :data:`CONTROLLERS`.
    :param task: the task.
    :param model: the nominal (control) model.
    :param rate_hz: driver rate, Hz.
    :param quick: cheaper MPC settings.
    :param estimator: estimator of the adaptive MPC (None: the identifier node's).
    :param truth: callable returning the true model (adaptive history).
    :param friction: the model's extra friction module (a fit's), or None.
    :return: ``(controller, replan_every_ticks)``.
    """
    robot = task.robot
    if kind == 'adaptive-baseline':
        controller, replan = make_controller('baseline', task, model, rate_hz, quick,
                                             friction=friction)
        return _adaptive(controller, robot, estimator, rate_hz, truth), replan
    if kind == 'baseline':
        dynamics = ModelDynamics.for_robot(robot, model, 1.0 / rate_hz, native=True,
                                           friction_model=friction)
        extra = dict(task.extra)
        if task.kind == SWING_UP:
            controller = SwingUpLQR(
                dynamics, task.pendulum_joint, task.actuated_joint,
                position_limit=task.position_limit,
                switch_angle=extra.get('switch_angle', 0.3))
            return controller, 1
        gains = extra.get('computed_torque', {'kp': 400.0, 'kd': 40.0})

        def ref(times: torch.Tensor) -> tuple:
            return reference(task, times)
        controller = ComputedTorque(dynamics, ref, kp=[gains['kp']] * model.n,
                                    kd=[gains['kd']] * model.n,
                                    horizon=max(1, int(round(rate_hz / task.control_rate_hz))),
                                    gravity_in_command=False)
        return controller, max(1, int(round(rate_hz / task.control_rate_hz)))
    horizon = max(5, int(round(0.6 * task.horizon))) if quick else task.horizon
    iterations = 1 if quick else task.iterations
    dynamics = ModelDynamics.for_robot(robot, model, task.mpc_dt, friction_model=friction)
    controller = make_ilqr(task, dynamics, ILQRConfig(horizon=horizon, max_iters=iterations,
                                                      compile=True, native=True))
    replan = max(1, int(round(rate_hz / task.control_rate_hz)))
    if kind == 'adaptive-mpc':
        controller = _adaptive(controller, robot, estimator, rate_hz, truth)
    return controller, replan


def _adaptive(controller: Any, robot: str, estimator: Optional[str], rate_hz: float,
              truth: Any) -> AdaptiveMPC:
    """
    Wrap a controller in the loop the identifier node runs on the robot.

    That is its engine options and refit period from ``config/<robot>.yaml``
    (:func:`~diffsim_ros.nodes.identifier.engine_options`, time simulated) and the robot's
    plausibility and consistency checks on every candidate.  ``estimator`` replaces the
    configured estimator when given.
    """
    online, period = engine_options(robot, {'estimator': estimator} if estimator else None,
                                    simulated=True)
    interface = robots.interface(robot)
    gravity = interface.nominal_model().gravity

    def check(result) -> list:
        # a gravity-adding driver's control model is the gravity-free view of the robot
        # (control_model): the checks judge the physical model it stands for
        model = result.model.replace(gravity=gravity.to(result.model.gravity)) \
            if interface.driver_adds_gravity else result.model
        return interface.check_model(model, result.actuator, result.friction)

    return AdaptiveMPC(controller, online.estimator,
                       refit_every=max(1, int(round(period * rate_hz))), online=online,
                       check=check, truth=truth)


def run_episode(plant: MujocoPlant, task: Task, controller: Any, replan_every: int,
                model: RobotModel, duration: float,
                progress: Optional[Callable[[int, int], None]] = None) -> Dict[str, Any]:
    """
    Run one episode from the task's start state and score it.

    :param plant: the plant.
    :param task: the task.
    :param controller: a controller (an :class:`AdaptiveMPC` observes every tick).
    :param replan_every: driver ticks between solves.
    :param model: model giving the joint order of the scores.
    :param duration: episode length, s.
    :param progress: called as ``progress(tick, ticks)`` after the ticks that end each of
        :data:`PROGRESS_LINES` equal parts of the episode but the last (simulated time, so
        the lines do not depend on the machine's speed).
    :return: the episode's scores plus ``solve_ms`` (mean wall time of a solve).
    """
    q0, qd0 = start_state(task, model)
    measurement = plant.reset(q0=q0.numpy(), qd0=qd0.numpy())
    controller.reset()
    adaptive = isinstance(controller, AdaptiveMPC)
    steps = int(round(duration * plant.rate_hz))
    n = model.n
    record = np.zeros((steps, 1 + 2 * n + len(plant.command_joints)))
    solve_times, policy = [], None
    report_at = {steps * part // (PROGRESS_LINES + 1) for part in range(1, PROGRESS_LINES + 1)}
    for k in range(steps):
        if progress is not None and k in report_at and k:
            progress(k, steps)
        q = torch.tensor(measurement.q)
        qd = torch.tensor(measurement.qd)
        x = torch.cat((q, qd))
        if policy is None or k % replan_every == 0:
            start = time.perf_counter()
            policy = controller.solve(x, measurement.t)
            solve_times.append(time.perf_counter() - start)
        u = policy(measurement.t, x)
        if adaptive:
            controller.observe(measurement.t, q, qd, u)
        record[k, 0] = measurement.t
        record[k, 1:1 + 2 * n] = x.numpy()
        record[k, 1 + 2 * n:] = u.detach().cpu().numpy()
        measurement = plant.step(u.detach().cpu().numpy())
    data = torch.from_numpy(record)
    # a swing-up succeeds at the plant's balance point (its true centre of mass on top)
    upright = upright_angle(plant.true_model, task.pendulum_joint) \
        if task.kind == SWING_UP else None
    scores = evaluate(task, model, data[:, 0], data[:, 1:1 + n], data[:, 1 + n:1 + 2 * n],
                      data[:, 1 + 2 * n:], upright=upright)
    scores['solve_ms'] = 1e3 * float(np.mean(solve_times)) if solve_times else 0.0
    return scores


def evaluate_controller(args: argparse.Namespace) -> Dict[str, Any]:
    """
    Run every episode and return the JSON-ready summary.

    :param args: parsed arguments.
    :return: the summary (see the module docstring).
    """
    task = getattr(args, 'task', None) or get_task(args.robot)
    plant = MujocoPlant(PlantConfig(robot=args.robot, param_error=args.param_error,
                                    seed=args.seed))
    truth = control_model(args.robot, plant.true_model)
    fit = getattr(args, 'fit', None) or starting_fit(args.robot, args.model)
    model = control_model(args.robot, robots.interface(args.robot).nominal_model()
                          if fit is None else fit.model)
    controller, replan = make_controller(args.controller, task, model, plant.rate_hz,
                                         args.quick, args.estimator, truth=lambda: truth,
                                         friction=None if fit is None else fit.friction)
    duration = episode_duration(args, task)
    episodes: List[Dict[str, Any]] = []
    start = time.perf_counter()
    for episode in range(args.episodes):
        refits_before = getattr(controller, 'refits', 0)
        progress = _progress_printer(controller, episode, plant.rate_hz, duration, start)
        scores = run_episode(plant, task, controller, replan, model, duration, progress)
        current = getattr(controller, 'current_model', controller.dynamics.model)
        scores.update(episode=episode, refits=getattr(controller, 'refits', 0) - refits_before,
                      param_error=parameter_error(current, truth))
        episodes.append(scores)
        print(_row(scores, task), flush=True)
    summary: Dict[str, Any] = {
        'robot': args.robot, 'controller': args.controller, 'param_error_setting':
        args.param_error, 'seed': args.seed, 'quick': bool(args.quick),
        'episode_duration_s': duration, 'replan_hz': plant.rate_hz / replan,
        'success_rate': sum(bool(e['success']) for e in episodes) / len(episodes),
        'episodes': episodes,
        'refits': int(getattr(controller, 'refits', 0)),
        'model': 'nominal' if fit is None else str(fit.path),
        'friction_model': None if fit is None or fit.friction is None
        else type(fit.friction).__name__,
        'nominal_param_error': parameter_error(model, truth),
        'final_param_error': episodes[-1]['param_error'],
        'param_error_definition': PARAM_ERROR_DEFINITION,
        'wall_time_s': time.perf_counter() - start,
    }
    if task.kind == SWING_UP:
        times = [e['swing_up_time_s'] for e in episodes if e['success']]
        summary['mean_swing_up_time_s'] = float(np.mean(times)) if times else None
    else:
        summary['tracking_rms'] = float(np.mean([e['tracking_rms'] for e in episodes]))
    if isinstance(controller, AdaptiveMPC):
        summary['refit_history'] = controller.history
        summary['estimator'] = controller.engine.config.estimator
        summary['refused_candidates'] = sum(
            1 for d in controller.decisions if d.checks)
    return summary


def starting_fit(robot: str, path: Optional[Path]) -> Optional[Fit]:
    """
    Load ``--model``: a fit the robot interface accepts, or exit with status 2.

    :param robot: catalog name.
    :param path: the ``--model`` argument (None: the nominal model).
    :return: the fit, or None.
    :raises SystemExit: status 2 with one line on stderr when it does not load or is refused.
    """
    if path is None:
        return None
    interface = robots.interface(robot)
    try:
        fit = load_fit(path, interface)
    except FitFileError as error:
        _refuse(f'--model: {error}')
    problems = interface.check_model(fit.model, fit.actuator, fit.friction)
    if problems:
        _refuse(f'--model {str(path)!r} refused by the {robot} robot interface: '
                f'{"; ".join(problems[:2])}')
    return fit


def _refuse(message: str) -> None:
    print(f'diffsim-sim-eval: error: {message}', file=sys.stderr)
    raise SystemExit(2)


def episode_duration(args: argparse.Namespace, task: Task) -> float:
    """
    Return the simulated length of an episode.

    :param args: parsed arguments (``duration``, ``quick``).
    :param task: the task.
    :return: ``--duration``, else the task's (60 % of it with ``--quick``), s.
    """
    if args.duration is not None:
        return args.duration
    return 0.6 * task.duration_s if args.quick else task.duration_s


def _progress_printer(controller: Any, episode: int, rate_hz: float, duration: float,
                      start: float) -> Callable[[int, int], None]:
    """Return the in-episode progress callback of :func:`run_episode` (prints a line)."""
    refits_before = getattr(controller, 'refits', 0)

    def report(tick: int, ticks: int) -> None:
        refits = getattr(controller, 'refits', 0) - refits_before
        print(f'  episode {episode:2d}: {tick / rate_hz:5.2f} of {duration:.3g} s simulated, '
              f'{refits} refit(s) so far, {time.perf_counter() - start:.0f} s wall', flush=True)
    return report


def _number(value: Optional[float], unit: str = '') -> str:
    """Return a result to 3 significant digits (``-`` when missing)."""
    return '-' if value is None else f'{value:.3g}{" " + unit if unit else ""}'


def _row(scores: Dict[str, Any], task: Task) -> str:
    if task.kind == SWING_UP:
        t_up = scores['swing_up_time_s']
        metric = f'swing-up {t_up:5.2f} s' if t_up is not None else 'swing-up   -    '
    else:
        metric = f'rms {scores["tracking_rms"]:.4f} rad'
    return (f'episode {scores["episode"]:2d}  success {str(bool(scores["success"])):5s}  '
            f'{metric}  refits {scores["refits"]:2d}  param error '
            f'{scores["param_error"]:.3f}  solve {scores["solve_ms"]:.1f} ms')


def main(argv: Optional[Sequence[str]] = None) -> int:
    """
    Run the evaluation.

    :param argv: command-line arguments; ``None`` reads ``sys.argv``.
    :return: 0 (bad arguments exit with status 2 through argparse).
    """
    args = parse_args(argv)
    args.fit = starting_fit(args.robot, args.model)   # refused before anything runs
    # a held-out score took 0.6 s with one thread and 4.5-14 s with two on a loaded 2-core
    # machine (threads spinning on tensors of a few hundred rows)
    torch.set_num_threads(args.threads)
    print(_start_line(args), flush=True)
    start = time.perf_counter()
    print('preparing the native kernel (built on the first run on this machine, about a '
          'minute)', flush=True)
    native, reason = native_available()
    compiles = '; the first solves also compile the rollouts' \
        if args.controller.endswith('mpc') else ''
    print(f'native kernel {"ready" if native else "unavailable (" + str(reason) + ")"} after '
          f'{time.perf_counter() - start:.0f} s{compiles}', flush=True)
    summary = evaluate_controller(args)
    metric = ('mean swing-up time', _number(summary.get('mean_swing_up_time_s'), 's')) \
        if 'mean_swing_up_time_s' in summary else \
        ('tracking rms', _number(summary.get('tracking_rms'), 'rad'))
    print(f'success rate {summary["success_rate"]:.2f}  {metric[0]} {metric[1]}  refits '
          f'{summary["refits"]}  param error {summary["nominal_param_error"]:.3f} -> '
          f'{summary["final_param_error"]:.3f}  wall {summary["wall_time_s"]:.0f} s',
          flush=True)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(_jsonable(summary), indent=2), encoding='utf-8')
    return 0


def _start_line(args: argparse.Namespace) -> str:
    """Return what the run is about to do, in one line."""
    duration = episode_duration(args, get_task(args.robot))
    estimator = f' (estimator {args.estimator or "of the identifier node"})' \
        if args.controller.startswith('adaptive') else ''
    return (f'diffsim-sim-eval: {args.controller}{estimator} on one simulated {args.robot} '
            f'(MuJoCo), parameters {args.param_error:.0%} off nominal (seed {args.seed}): '
            f'{args.episodes} episode(s) of {duration:.3g} s simulated'
            f'{", quick MPC" if args.quick else ""}')


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.floating, np.integer)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


if __name__ == '__main__':
    sys.exit(main())
