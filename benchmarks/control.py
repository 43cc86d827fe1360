"""
MPC solve latency and achieved control rate: iLQR swing-ups (Qube, cart-pole), Panda tracking.

Every case runs with each rollout backend of :class:`~diffsim_ros.control.ILQRConfig`, in the
same process: ``native`` (the C++ rollout kernel, one call per horizon; the default of the mpc
node and ``diffsim-sim-eval``) and ``compile`` (one ``torch.compile``-d call per step), or
``eager`` torch with ``--no-compile``; the table prints each case's rate relative to the
compiled one.

Each case runs a receding-horizon loop on the controller's own model: at every control step
(``dt`` of the case) one warm-started ``solve`` from the current state, then one model step
under the returned feedback policy.  Printed per case: solve latency p50/p99/min
(:func:`time.perf_counter` around ``solve``), the achieved control rate (1 / mean solve
time), the cost of one ``FeedbackPolicy.__call__`` (what the MPC node pays at the driver
rate, 1 kHz on the Panda) and the task error at the end of the loop.  The first three cases
take one iteration per solve on hand-set costs; the fourth is the Qube as the mpc node and
``diffsim-sim-eval`` run it (the task's cost and 3 iterations, with the LQR guess rolled out
at every solve, :func:`~diffsim_ros.control.tasks.make_ilqr`).  Compilation
(``ILQR.warm_up``) is timed separately and never counted in the latencies.

Other engineers share the machine this runs on: the load average is recorded before and after,
each case is repeated and the quietest repeat (lowest p50) is reported beside the median one.

Run ``python benchmarks/control.py [--quick] [--json PATH] [--threads N] [--no-compile]
[--backends native,compile]``.
"""

import math
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

try:
    from benchmarks import _common
except ImportError:  # run as a script: benchmarks/ is not a package on the path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks import _common

from diffsim_ros import robots  # noqa: I100
from diffsim_ros.control import (ILQR, ILQRConfig, ModelDynamics, QuadraticCost, state_error,
                                 TrackingCost)
from diffsim_ros.control.tasks import angle_mask, get_task, goal_state, make_ilqr
from diffsim_ros.core import load_urdf

fmt_number, format_table, Target = _common.fmt_number, _common.format_table, _common.Target

F64 = torch.float64
PANDA_READY = (0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785)


def _config(backend: str, **kw: Any) -> ILQRConfig:
    """Return the solver options of a rollout backend (``native``, ``compile`` or ``eager``)."""
    return ILQRConfig(compile=backend == 'compile', native=backend == 'native', **kw)


def swing_up(robot: str, dt: float, horizon: int, iters: int, backend: str) -> Dict[str, Any]:
    """Return the case description of a pendulum swing-up (pendulum from hanging to upright)."""
    model = load_urdf(xml=robots.urdf_string(robot), dtype=F64)
    dyn = ModelDynamics.for_robot(robot, model, dt)
    if robot == 'qube':
        Q, R, Qf = [0.01, 0.1, 0.001, 0.001], [0.001], [10.0, 100.0, 1.0, 1.0]
    else:
        Q, R, Qf = [1.0, 0.1, 0.01, 0.001], [0.001], [50.0, 100.0, 1.0, 1.0]
    pendulum = 1   # joint order: actuated joint first, pendulum second, on both robots
    goal = torch.zeros(4, dtype=F64)
    goal[pendulum] = math.pi
    mask = torch.zeros(4, dtype=torch.bool)
    mask[pendulum] = True
    cost = QuadraticCost(torch.tensor(Q), torch.tensor(R), torch.tensor(Qf), goal,
                         angle_mask=mask)
    x0 = torch.zeros(4, dtype=F64)
    x0[pendulum] = 0.01

    def error(x: torch.Tensor, t: float) -> float:
        return abs(float(state_error(x, goal, mask)[pendulum]))

    return {'name': f'{robot} swing-up iLQR', 'dynamics': dyn, 'cost': cost, 'x0': x0,
            'config': _config(backend, horizon=horizon, max_iters=iters),
            'error': error, 'error_name': 'final |pendulum angle - pi| (rad)'}


def qube_task(backend: str, horizon: Optional[int] = None) -> Dict[str, Any]:
    """
    Return the Qube swing-up as the mpc node and ``diffsim-sim-eval`` run it.

    The task's cost, horizon and iterations (:func:`diffsim_ros.control.tasks.get_task`) and
    the LQR guess of :func:`~diffsim_ros.control.tasks.make_ilqr` rolled out at every solve.
    """
    task = get_task('qube')
    model = load_urdf(xml=robots.urdf_string('qube'), dtype=F64)
    dyn = ModelDynamics.for_robot('qube', model, task.mpc_dt)
    config = _config(backend, horizon=horizon or task.horizon, max_iters=task.iterations)
    goal = goal_state(task, model)
    mask = angle_mask(task, model)

    def error(x: torch.Tensor, t: float) -> float:
        return float(state_error(x, goal, mask).abs().max())

    return {'name': 'qube swing-up, node iLQR', 'dynamics': dyn, 'cost': None,
            'x0': torch.tensor([0.0, 0.01, 0.0, 0.0], dtype=F64), 'config': config,
            'controller': lambda: make_ilqr(task, dyn, config), 'error': error,
            'error_name': 'final max |state - goal| (rad, rad/s)'}


def _controller(case: Dict[str, Any]) -> ILQR:
    factory = case.get('controller')
    return factory() if factory else ILQR(case['dynamics'], case['cost'], case['config'])


def panda_tracking(dt: float, horizon: int, iters: int, backend: str) -> Dict[str, Any]:
    """Return the case description of 7-DOF joint-space sinusoid tracking on the Panda."""
    model = load_urdf(xml=robots.urdf_string('panda'), dtype=F64)
    dyn = ModelDynamics.for_robot('panda', model, dt)
    centre = torch.tensor(PANDA_READY, dtype=F64)
    phase = torch.arange(7, dtype=F64) * 0.9
    omega = 2.0 * math.pi * 0.5

    def reference(t: torch.Tensor) -> torch.Tensor:
        angle = omega * t.unsqueeze(-1) + phase
        q = centre + 0.3 * torch.sin(angle)
        return torch.cat((q, 0.3 * omega * torch.cos(angle)), dim=-1)

    weight = torch.tensor([400.0] * 7 + [1.0] * 7)
    cost = TrackingCost(reference, weight, torch.full((7,), 1e-3), weight, nx=14)
    x0 = reference(torch.zeros(1, dtype=F64))[0]

    def error(x: torch.Tensor, t: float) -> float:
        target = reference(torch.tensor([t], dtype=F64))[0]
        return float((x[:7] - target[:7]).norm() / math.sqrt(7))

    return {'name': 'panda tracking iLQR', 'dynamics': dyn, 'cost': cost, 'x0': x0,
            'config': _config(backend, horizon=horizon, max_iters=iters),
            'error': error, 'error_name': 'final joint RMS tracking error (rad)'}


def run_loop(case: Dict[str, Any], steps: int) -> Dict[str, Any]:
    """Run one receding-horizon loop; return the solve latencies and the task error."""
    ctrl = _controller(case)
    dyn = ctrl.dynamics
    x = case['x0'].clone()
    times: List[float] = []
    policy = None
    for i in range(steps):
        t = i * dyn.dt
        start = time.perf_counter()
        policy = ctrl.solve(x, t)
        times.append(time.perf_counter() - start)
        with torch.no_grad():
            x = dyn.step(x, policy(t, x))
    return {'times': times, 'error': case['error'](x, steps * dyn.dt), 'policy': policy,
            'state': x}


def summarise(times: List[float]) -> Dict[str, float]:
    """Return p50, p99, min and mean in ms and the rate in Hz of solve times in s."""
    ordered = sorted(times)
    p99 = ordered[min(len(ordered) - 1, int(math.ceil(0.99 * len(ordered))) - 1)]
    mean = statistics.fmean(ordered)
    return {'p50_ms': 1e3 * statistics.median(ordered), 'p99_ms': 1e3 * p99,
            'min_ms': 1e3 * ordered[0], 'mean_ms': 1e3 * mean, 'rate_hz': 1.0 / mean}


def bench_case(make: Callable[[str], Dict[str, Any]], backend: str, steps: int, repeats: int,
               quick: bool) -> Dict[str, Any]:
    """Warm up (compile) once, then time ``repeats`` loops of ``steps`` solves."""
    case = make(backend)
    case['backend'] = backend
    ctrl = _controller(case)
    warm_up_s = ctrl.warm_up(case['x0'])
    runs = []
    for _ in range(repeats):
        load = os.getloadavg()[0]
        result = run_loop(case, steps)
        summary = summarise(result['times'][1:])     # the cold first solve is not MPC
        summary.update(load_1min=load, error=result['error'],
                       first_solve_ms=1e3 * result['times'][0])
        runs.append((summary, result))
    runs.sort(key=lambda run: run[0]['p50_ms'])
    quietest, result = runs[0]
    median = runs[len(runs) // 2][0]
    policy, x = result['policy'], result['state']
    call = _common.time_call(lambda: policy(policy.t0 + 0.5 * policy.dt, x), quick=quick)
    config = case['config']
    backend = 'native' if ctrl.dynamics.native else 'compile' if config.compile else 'eager'
    return {'name': case['name'], 'horizon': config.horizon, 'dt': case['dynamics'].dt,
            'iterations': config.max_iters, 'compile': config.compile, 'backend': backend,
            'requested_backend': case['backend'], 'steps': steps,
            'warm_up_s': warm_up_s, 'median_repeat': median, 'quietest_repeat': quietest,
            'repeats': [run[0] for run in runs], 'policy_call_us': 1e6 * call.seconds,
            'error_name': case['error_name']}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the benchmark; return the exit status."""
    parser = _common.make_parser(__doc__.strip().splitlines()[0])
    parser.add_argument('--no-compile', action='store_true',
                        help="eager torch instead of torch.compile for the 'compile' backend "
                             '(no compile warm-up; much slower solves)')
    parser.add_argument('--backends', default='native,compile',
                        help="comma-separated rollout backends to time: 'native', 'compile' "
                             '(default: both)')
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    backends = [b.strip() for b in args.backends.split(',') if b.strip()]
    if not backends or any(b not in ('native', 'compile') for b in backends):
        parser.error(f"--backends takes 'native' and/or 'compile', got {args.backends!r}")
    if args.no_compile:
        backends = ['eager' if b == 'compile' else b for b in backends]
    steps = 40 if args.quick else 200
    repeats = 1 if args.quick else 3
    cases = [
        lambda b: swing_up('qube', 0.02, 30 if args.quick else 50, 1, b),
        lambda b: swing_up('cartpole', 0.02, 30 if args.quick else 50, 1, b),
        lambda b: panda_tracking(0.01, 10 if args.quick else 20, 1, b),
        lambda b: qube_task(b, 30 if args.quick else None),
    ]
    info = _common.machine_info(['torch', 'numpy'])
    info['torch_threads'] = torch.get_num_threads()
    _common.print_section('machine', [f'{key}: {value}' for key, value in info.items()])
    results = [bench_case(make, backend, min(steps, 15) if backend == 'eager' else steps,
                          repeats, args.quick)
               for make in cases for backend in backends]
    info['load_average_after'] = list(os.getloadavg())

    headers = ['case', 'backend', 'H', 'dt', 'it', 'p50 ms', 'p99 ms', 'min ms', 'rate Hz',
               'quiet p50', 'quiet p99', 'rate ratio', 'policy us', 'warm-up s', 'error']
    rows = []
    for r in results:
        med, quiet = r['median_repeat'], r['quietest_repeat']
        peer = next((p for p in results if p['name'] == r['name']
                     and p['requested_backend'] != 'native'), None)
        ratio = quiet['rate_hz'] / peer['quietest_repeat']['rate_hz'] if peer else math.nan
        r['rate_ratio_vs_torch'] = ratio
        rows.append([r['name'], r['backend'], str(r['horizon']), f'{r["dt"]:g}',
                     str(r['iterations']), fmt_number(med['p50_ms']),
                     fmt_number(med['p99_ms']), fmt_number(med['min_ms']),
                     fmt_number(med['rate_hz']), fmt_number(quiet['p50_ms']),
                     fmt_number(quiet['p99_ms']), f'{ratio:.1f}x' if peer else '-',
                     fmt_number(r['policy_call_us']), f'{r["warm_up_s"]:.1f}',
                     f'{quiet["error"]:.3g}'])
    title = (f'receding-horizon loops ({steps} solves, {repeats} repeat(s); '
             f'threads={torch.get_num_threads()}; rate ratio: quietest rate over the '
             "torch backend's of the same case)")
    errors = '; '.join(dict.fromkeys(f'{r["name"]}: {r["error_name"]}' for r in results))
    _common.print_section(title, [format_table(headers, rows), 'error: ' + errors])

    # the targets are the product's: the first backend asked for (native by default)
    first = [r for r in results if r['requested_backend'] == backends[0]]
    qube, panda = first[0], first[2]
    label = qube['backend']
    targets = [
        Target(f'qube swing-up MPC rate ({label}, quietest repeat)',
               qube['quietest_repeat']['rate_hz'], 200.0, 'Hz', at_most=False),
        Target(f'qube swing-up solve p99 ({label}, quietest repeat)',
               qube['quietest_repeat']['p99_ms'], 5.0, 'ms'),
        Target(f'panda tracking MPC rate ({panda["backend"]}, quietest repeat)',
               panda['quietest_repeat']['rate_hz'], 100.0, 'Hz', at_most=False),
        Target('panda FeedbackPolicy call at 1 kHz', panda['policy_call_us'], 1000.0, 'us'),
    ]
    load = (f'load average before {info["load_average_1_5_15_min"]}, after '
            f'{info["load_average_after"]}')
    _common.print_section('targets (2 shared CPU cores; timings are pessimistic under load)',
                          [target.line() for target in targets] + [load])
    if args.json:
        payload = {'machine': info, 'quick': args.quick, 'backends': backends,
                   'cases': results, 'targets': [target.to_dict() for target in targets]}
        _common.write_json(args.json, payload)
    return 0


if __name__ == '__main__':
    sys.exit(main())
