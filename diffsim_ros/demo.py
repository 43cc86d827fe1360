"""
The closed-loop demo: simulated driver, identifier, MPC and monitor talking over DDS.

``diffsim-demo --robot qube`` composes the node graph of ``sim.launch.py`` in one process
(``launch`` is not needed) on real DDS:

* ``sim_driver``: a MuJoCo plant whose hidden true parameters are ``--param-error`` off the
  URDF (and which has Coulomb friction and motor effects the model lacks), in lockstep mode:
  it publishes ``/clock``, every other node runs on simulated time, and the plant waits for
  the mpc's command at every tick and, at each refit's due time, for the refit and for the
  mpc to take the model it produced (:mod:`diffsim_ros.nodes.lockstep`), so that the outcome
  does not depend on how fast or busy the machine is;
* ``identifier``: refits the model from ``joint_states`` and the commands every
  ``refit_period`` and publishes it as URDF;
* ``mpc``: starts from the nominal (wrong) model, swaps in every model the identifier
  publishes, and swings the pendulum up and balances it (tracks a trajectory on the arms);
* ``monitor``: rolls the current model over the last second and publishes the prediction
  error and the predicted/measured paths;
* a recorder writing every topic into ``--out/recording.mcap`` (rosbag2, via ``rosbags``).

Afterwards ``diffsim-fit`` fits the recorded bag offline (unless ``--no-fit``), and the
demo writes ``report.json`` (``success``, ``swing_up_time_s``, ``parameters`` with the online
``estimate``, the offline fit and the hidden ``true`` value per identifiable parameter,
``median_parameter_error`` and ``offline_fit_median_parameter_error`` over the parameters the
plant has, ``prediction_nmse``) and ``prediction.png`` (predicted vs measured trajectories).
Exit code 0 when the task succeeded and the identified model predicts better than the
nominal one, 1 otherwise.  Before any of its nodes start, the demo listens on its domain and
refuses (exit code 2) where another graph publishes ``/joint_states`` or ``/clock`` or takes
the robot's commands: a real driver there would take the simulated torques
(:func:`refuse_foreign_robot`).
"""

import argparse
import json
import math
from pathlib import Path
import sys
import threading
import time
from typing import Any, Dict, Optional, Sequence

import numpy as np
import torch

from . import robots
from .control import tasks
from .core import RobotModel
from .io import read_bag
from .io.fit_cli import main as fit_main
from .io.fits import FitFileError, load_fit
from .nodes.foreign_graph import (claim_a_quiet_domain, FOREIGN_PROBE_S, ForeignGraphError,
                                  refuse_foreign_graph)
from .robots.message import load_model_message
from .sysid.losses import state_scale
from .sysid.nea import base_parameters

#: Robots the demo runs: those with a control task.
DEMO_ROBOTS = ('qube', 'cartpole', 'wam4', 'panda')
#: The ids ``--domain-id auto`` tries, in a random order (0, ROS's default, is left to robots).
AUTO_DOMAIN_IDS = range(1, 233)
#: Hidden plant of the default run: its pendulum balances 0.21 rad from the URDF's upright,
#: so the nominal model's catch throws the arm out and the swing-up needs the identified
#: model (the README lists the other seeds measured).
DEFAULT_SEED = 7

#: Simulated seconds the demo adds to the task's episode: the first model is published at
#: 2.5 s (the first refit with 2 s of data, at its due time: lockstep holds simulated time
#: for it), and on a plant the nominal model cannot balance the swing-up waits for it (seed
#: 7 swung up after 3.5-3.8 s in six runs beside four busy processes, load 7-22, and the
#: task asks for 1 s of balance after it).
IDENTIFY_S = 2.0

#: Wall seconds to wait for the mpc node's warm-up (compiling the iLQR) before the plant starts.
MPC_READY_TIMEOUT_S = 180.0


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    """
    Parse the command line.

    :param argv: arguments without the program name; ``None`` reads ``sys.argv``.
    :return: the parsed arguments.
    """
    parser = argparse.ArgumentParser(
        prog='diffsim-demo',
        description='Identify and control a simulated robot with hidden parameters: '
                    'sim_driver + identifier + mpc + monitor over DDS, then an offline fit '
                    'of the recorded bag.')
    parser.add_argument('--robot', default='qube', choices=DEMO_ROBOTS)
    parser.add_argument('--out', default='demo_out', type=Path, help='output directory')
    parser.add_argument('--duration', default=None, type=float,
                        help="simulated seconds (default: the robot task's episode length "
                             f'plus {IDENTIFY_S:g} s)')
    parser.add_argument('--param-error', default=0.3, type=float,
                        help='relative error of the hidden true parameters (default 0.3)')
    parser.add_argument('--seed', default=DEFAULT_SEED, type=int,
                        help=f'seed of the hidden parameters (default {DEFAULT_SEED})')
    parser.add_argument('--controller', default=None, choices=('ilqr', 'mppi', 'baseline'),
                        help='mpc node controller (default: config/<robot>.yaml)')
    parser.add_argument('--real-time-factor', default=0.5, type=float,
                        help='pace of the simulated clock relative to the wall clock '
                             '(default 0.5; the Python nodes share 2 cores)')
    parser.add_argument('--domain-id', default=None, type=_domain_id,
                        help='ROS_DOMAIN_ID of the graph, 0-232, or "auto": a random id on '
                             'which no node answers within 4 s, held by an idle node of the '
                             "demo's until it ends (default: from the environment); the demo "
                             'refuses a domain where a robot already publishes joint_states '
                             'or takes commands')
    parser.add_argument('--no-fit', action='store_true',
                        help='skip the offline diffsim-fit of the recorded bag')
    args = parser.parse_args(argv)
    if args.duration is not None and not args.duration > 0:
        parser.error('--duration must be positive')
    if not 0.0 <= args.param_error < 1.0:
        parser.error('--param-error must be in [0, 1)')
    if not args.real_time_factor > 0:
        parser.error('--real-time-factor must be positive')
    return args


def _domain_id(text: str):
    """Parse ``--domain-id``: ``'auto'`` or an id in [0, 232] (Fast DDS's port range)."""
    if text == 'auto':
        return text
    try:
        domain = int(text)
    except ValueError:
        domain = -1
    if not 0 <= domain <= 232:
        raise argparse.ArgumentTypeError(f"'{text}' is neither 'auto' nor an id in [0, 232]")
    return domain


class _Observer:
    """Demo-side subscriptions: the latest model, parameters, prediction error and state."""

    def __init__(self, node, joint_names: Sequence[str]) -> None:
        from rclpy.qos import DurabilityPolicy, qos_profile_sensor_data, QoSProfile
        from sensor_msgs.msg import JointState
        from std_msgs.msg import Float64MultiArray, String
        self.node = node
        self.joint_names = list(joint_names)
        self.lock = threading.Lock()
        #: The identifier's newest whole-model document (robots/message.py), as published.
        self.model: Optional[str] = None
        #: Models the identifier published beyond the nominal one (its accepted refits),
        #: counted as they arrive on ~/parameters, and their (simulated) publication times.
        self.models = 0
        self.model_times: list = []
        self.parameters: Dict[str, Any] = {}
        self.nmse: Optional[float] = None
        self.q: Optional[np.ndarray] = None
        latched = QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL)
        node.create_subscription(String, '/identifier/model', self._on_model, latched)
        node.create_subscription(String, '/identifier/parameters', self._on_parameters, latched)
        node.create_subscription(Float64MultiArray, '/monitor/prediction_nmse', self._on_nmse,
                                 10)
        node.create_subscription(JointState, 'joint_states', self._on_state,
                                 qos_profile_sensor_data)

    def snapshot(self) -> Dict[str, Any]:
        """Return what was observed so far, read at one instant."""
        with self.lock:
            return {'model': self.model, 'parameters': dict(self.parameters),
                    'models_accepted': self.models, 'model_times_s': list(self.model_times),
                    'prediction_nmse': self.nmse, 'q': self.q}

    def _on_model(self, msg) -> None:
        with self.lock:
            self.model = msg.data

    def _on_parameters(self, msg) -> None:
        try:
            parameters = json.loads(msg.data)
        except ValueError:
            return
        if not isinstance(parameters, dict):
            return
        with self.lock:
            self.parameters = parameters
            if parameters.get('method', 'nominal') != 'nominal':
                self.models += 1
                stamp = parameters.get('stamp')
                self.model_times.append(round(float(stamp), 9)
                                        if isinstance(stamp, (int, float)) else None)

    def _on_nmse(self, msg) -> None:
        if len(msg.data) and math.isfinite(msg.data[0]):
            with self.lock:
                self.nmse = float(msg.data[0])

    def _on_state(self, msg) -> None:
        index = {name: i for i, name in enumerate(msg.name)}
        if all(name in index for name in self.joint_names) and len(msg.position) == len(msg.name):
            with self.lock:
                self.q = np.array([msg.position[index[name]] for name in self.joint_names])


def _true_upright(task: tasks.Task, true_model: RobotModel) -> Optional[float]:
    """Return the hidden plant's balance point (swing-ups), where success is measured."""
    if task.kind != tasks.SWING_UP:
        return None
    return tasks.upright_angle(true_model, task.pendulum_joint)


def _progress(seen: Dict[str, Any], task: tasks.Task, model: RobotModel, t: float,
              upright: Optional[float]) -> str:
    """Return one progress line from an observer's :meth:`_Observer.snapshot`."""
    q, nmse, models = seen['q'], seen['prediction_nmse'], seen['models_accepted']
    parts = [f't = {t:5.1f} s']
    if q is not None and upright is not None:
        angle = q[model.joint_index(task.pendulum_joint)]
        error = abs(math.remainder(angle - upright, 2 * math.pi))
        parts.append(f'pendulum {error:4.2f} rad from upright')
    parts.append(f'models accepted {models}')
    if nmse is not None:
        parts.append(f'1 s prediction NMSE {nmse:.3g}')
    return ', '.join(parts)


def _lockstep_identifier(robot: str) -> list:
    """
    Return the identifier parameters for refits that hold simulated time.

    In lockstep a refit holds the plant until it has finished, so (1) a wall-clock budget of
    its estimator would only make its result, and the demo's, depend on how busy the
    machine is: it is lifted; (2) the fit runs on the identifier's worker thread rather than
    in a child process at a lower priority (that process keeps a real robot's 1 kHz stream
    flowing during a fit; here nothing flows during one, and on a busy machine the niced
    child's start took over two minutes).

    :param robot: catalog robot name.
    :return: ``Parameter`` overrides.
    """
    from rclpy.parameter import Parameter
    from .nodes.params import config_path, load_yaml_params
    params = load_yaml_params(config_path(robot), 'identifier')
    budget = f'{params.get("estimator", "diffnea")}.max_seconds'
    return [Parameter('refit_process', value=False)] + (
        [Parameter(budget, value=0.0)] if budget in params else [])


def refuse_foreign_robot(context, info: robots.RobotInfo, wait_s: float = FOREIGN_PROBE_S
                         ) -> None:
    """
    Refuse to start the simulated graph on a domain where a robot's graph already runs.

    The demo's mpc publishes torque commands on ``/<controller>/commands`` and its plant
    publishes ``/joint_states`` and ``/clock``: a real driver on the same domain (this
    machine, or the lab's network where discovery reaches it) would take the simulated
    commands, and its states would corrupt the demo's.  So before any of the demo's nodes
    exist, a probe node listens for ``wait_s`` and any publisher of ``/joint_states`` or
    ``/clock`` or subscriber of the command topic is foreign
    (:func:`~diffsim_ros.nodes.foreign_graph.refuse_foreign_graph`).  (Other nodes, RViz
    say, may watch.)

    :param context: the demo's initialised ``rclpy`` context.
    :param info: the robot (its command topic).
    :param wait_s: how long to listen for the graph's discovery [s].
    :raises ForeignGraphError: naming the topics and the nodes on them.
    """
    import rclpy

    probe = rclpy.create_node('diffsim_demo_probe', context=context)
    try:
        refuse_foreign_graph(
            probe, publishers=('/joint_states', '/clock'),
            subscribers=(f'/{info.controller_name}/commands',),
            harm='The simulated demo would send its torque commands to it',
            remedy='run it on a free domain with --domain-id auto (or N)', wait_s=wait_s)
    finally:
        probe.destroy_node()


def run_graph(args: argparse.Namespace, bag: Path, duration: float) -> Dict[str, Any]:
    """
    Run sim_driver, identifier, mpc, monitor and the recorder until ``duration`` sim seconds.

    :param args: parsed arguments.
    :param bag: recording to write.
    :param duration: simulated seconds.
    :return: the last published model URDF, identifier parameters and prediction NMSE, the
        hidden true model and the wall time.
    """
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.parameter import Parameter
    from .nodes.identifier import Identifier
    from .nodes.monitor import MonitorNode
    from .nodes.mpc import MpcNode
    from .nodes.params import config_path, load_yaml_params
    from .nodes.recorder import Recorder
    from .nodes.sim_driver import SimDriver

    claim = None
    if args.domain_id == 'auto':
        # no node at all answered there, a stronger check than the robot probe below
        claim = claim_a_quiet_domain(AUTO_DOMAIN_IDS, name='diffsim_demo_claim')
        args.domain_id = claim.domain
        print(f'  ROS domain {claim.domain} (--domain-id auto: no node answered there)',
              flush=True)
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=args.domain_id)
    try:
        if claim is None:
            refuse_foreign_robot(context, robots.get(args.robot))
    except ForeignGraphError:
        rclpy.shutdown(context=context)
        raise
    robot = [Parameter('robot', value=args.robot)]
    sim_time = [Parameter('use_sim_time', value=True)]
    # One single-threaded executor per node, each in its own thread, as separate processes
    # would have: a shared multi-threaded executor costs ~2.4x the CPU per message
    # (benchmarks/ros_loop.py) and lets one busy node delay every other node's callbacks.
    spinning = []

    def spin(node) -> None:
        executor = SingleThreadedExecutor(context=context)
        executor.add_node(node)
        thread = threading.Thread(target=executor.spin, daemon=True, name=node.get_name())
        thread.start()
        spinning.append((node, executor, thread))

    start = time.perf_counter()
    try:
        info = robots.get(args.robot)
        controller = [] if args.controller is None else [
            Parameter('controller', value=args.controller)]
        # the plant's streams are subscribed before the plant starts: nothing is lost
        early = {'/joint_states': 'sensor_msgs/msg/JointState',
                 f'/{info.controller_name}/commands': 'std_msgs/msg/Float64MultiArray'}
        # commands logged at the state they answer, whatever order they arrive in
        recorder = Recorder(bag, types=early, exclude=('/clock', '/lockstep'), context=context,
                            timeline_topic='/joint_states', parameter_overrides=sim_time)
        spin(recorder)
        refits = _lockstep_identifier(args.robot)
        spin(Identifier(context=context, parameter_overrides=robot + sim_time + refits))
        chosen = args.controller or load_yaml_params(config_path(args.robot), 'mpc').get(
            'controller')
        # in lockstep the baseline's latency does not matter: skip its compile (1-2 min cold)
        eager = [Parameter('compile', value=False)] if chosen == 'baseline' else []
        mpc = MpcNode(context=context,
                      parameter_overrides=robot + sim_time + controller + eager)
        spin(mpc)
        spin(MonitorNode(context=context, parameter_overrides=robot + sim_time))
        observer_node = rclpy.create_node('demo_observer', context=context,
                                          parameter_overrides=sim_time)
        observer = _Observer(observer_node, info.joint_names)
        spin(observer_node)
        time.sleep(1.0)   # discovery: the plant starts once everyone listens
        if not mpc.ready.is_set():
            # the compiled iLQR/MPPI warms up first, or the plant would wait on it for
            # seconds of simulated time while the pendulum hangs
            print('  waiting for the mpc node to compile and warm up ...', flush=True)
            if not mpc.ready.wait(MPC_READY_TIMEOUT_S):
                raise RuntimeError(f'the mpc node was not ready after {MPC_READY_TIMEOUT_S} s')
        driver = SimDriver(context=context, parameter_overrides=robot + [
            Parameter('clock_mode', value='lockstep'),
            Parameter('real_time_factor', value=float(args.real_time_factor)),
            Parameter('param_error', value=float(args.param_error)),
            Parameter('seed', value=int(args.seed))])
        spin(driver)
        task = tasks.get_task(args.robot)
        model = robots.interface(args.robot).nominal_model()
        upright = _true_upright(task, driver.plant.true_model)
        next_print = 0.0
        while driver.plant.time < duration:
            if not all(thread.is_alive() for _, _, thread in spinning):
                raise RuntimeError('an executor stopped unexpectedly')
            if driver.plant.time >= next_print:
                seen = observer.snapshot()
                print('  ' + _progress(seen, task, model, driver.plant.time, upright), flush=True)
                next_print += 1.0
            time.sleep(0.05)
        driver.stop()
        # let the recorder write what is still queued (it may lag behind the plant)
        previous, deadline = -1, time.monotonic() + 10.0
        while time.monotonic() < deadline:
            total = sum(recorder.counts.values())
            if total == previous:
                break
            previous = total
            time.sleep(0.5)
        true_model = driver.plant.true_model
        # the last line and the report show the same instant
        result = observer.snapshot()
        print('  ' + _progress(result, task, model, duration, upright), flush=True)
        result.update(lockstep={**driver.stats, **driver.commands.stats, **driver.peers.stats},
                      true_model=true_model)
        recorded = dict(recorder.counts)
    finally:
        for _, executor, _ in spinning:
            executor.shutdown(timeout_sec=2.0)
        for _, _, thread in spinning:
            thread.join(timeout=5.0)
        for node, _, _ in spinning:
            node.destroy_node()
        context.try_shutdown()
        if claim is not None:
            claim.release()
    result['recorded'] = recorded
    result['wall_time_s'] = time.perf_counter() - start
    return result


def parameter_report(nominal: RobotModel, estimates: Dict[str, RobotModel],
                     true: RobotModel) -> Dict[str, Dict[str, float]]:
    """
    Compare the identifiable (base) parameter combinations of several models with the truth.

    :param nominal: the URDF model everything started from.
    :param estimates: ``{'estimate': online model, 'offline_fit': ...}``.
    :param true: the plant's hidden model.
    :return: ``{expression: {'estimate', ..., 'true', 'nominal', 'relative_error',
        'nominal_relative_error'}}`` (relative errors of ``'estimate'``).
    """
    base = base_parameters(true)
    models = {**estimates, 'true': true, 'nominal': nominal}
    values = {key: base.values(model.to(torch.float64)) for key, model in models.items()}
    report = {}
    for i, expression in enumerate(base.expressions(digits=4)):
        entry = {key: float(v[i]) for key, v in values.items()}
        scale = max(abs(entry['true']), 1e-12)
        for key in estimates:
            name = 'relative_error' if key == 'estimate' else f'{key}_relative_error'
            entry[name] = abs(entry[key] - entry['true']) / scale
        entry['nominal_relative_error'] = abs(entry['nominal'] - entry['true']) / scale
        report[expression] = entry
    return report


def _sorted_errors(parameters: Dict[str, Dict[str, float]], key: str) -> list:
    """Relative errors ``key`` of the parameters whose true value is not zero, sorted."""
    # a parameter the plant lacks (Coulomb friction at zero) has no relative error
    return sorted(entry[key] for entry in parameters.values()
                  if key in entry and entry['true'] != 0.0)


def prediction_study(models: Dict[str, RobotModel], info: robots.RobotInfo, run,
                     horizon: float = 1.0, dt: float = 0.01) -> Dict[str, Any]:
    """
    Roll each model over consecutive ``horizon`` windows of the recorded run.

    :param models: ``{label: model}``.
    :param info: catalog entry of the robot.
    :param run: the recorded trajectory (``t``, ``q``, ``qd``, ``u``).
    :param horizon: window length, s.
    :param dt: rollout step, s.
    :return: ``{label: {'nmse': median over windows, 'windows': [...]}}``; a window's errors
        are divided by its own state variances, but never by less than the whole run's
        (a window of the balanced pendulum hardly moves, as for the monitor node).
    """
    from .robots.prediction import predict_window
    t, q, qd = run.t.numpy(), run.q.numpy(), run.qd.numpy()
    u = run.u.numpy() if run.u is not None else np.zeros((len(t), len(info.command_joints)))
    out = {}
    for label, model in models.items():
        floor = state_scale(run.q.to(model.dtype), run.qd.to(model.dtype),
                            model.tree.revolute_mask)
        windows = []
        end = t[0] + horizon
        while end <= t[-1]:
            keep = (t >= end - horizon - dt) & (t <= end)
            window = predict_window(model, info, t[keep], q[keep], qd[keep], t[keep], u[keep],
                                    horizon, dt, 'rk4', floor)
            if window is not None:
                windows.append(window)
            end += horizon
        nmse = [w['nmse'] for w in windows]
        out[label] = {'nmse': float(np.median(nmse)) if nmse else None, 'windows': windows}
    return out


def plot_prediction(path: Path, study: Dict[str, Any], model: RobotModel, title: str) -> None:
    """
    Plot measured joint positions and each model's 1 s predictions.

    :param path: PNG to write.
    :param study: output of :func:`prediction_study`.
    :param model: the robot (joint names).
    :param title: figure title.
    """
    import matplotlib
    matplotlib.use('Agg')
    from matplotlib import pyplot as plt
    fig, axes = plt.subplots(model.n, 1, figsize=(10, 2.4 * model.n), sharex=True,
                             squeeze=False)
    colours = {'identified': 'tab:green', 'nominal': 'tab:red'}
    for j, name in enumerate(model.joint_names):
        ax = axes[j, 0]
        first = True
        for label, entry in study.items():
            for window in entry['windows']:
                if first:
                    ax.plot(window['t'], window['q_measured'][:, j], color='k', lw=1.5,
                            label='measured')
                ax.plot(window['t'], window['q_predicted'][:, j], color=colours.get(label),
                        lw=1.0, ls='--', label=f'{label} model' if window is
                        entry['windows'][0] else None)
            first = False
        ax.set_ylabel(f'{name} [rad]')
        ax.legend(loc='upper right', fontsize=8)
    axes[-1, 0].set_xlabel('time [s] (each segment: a 1 s rollout from the measured state)')
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _number(value: Optional[float]) -> str:
    """Format a measured number with 3 significant digits ('n/a' when there is none)."""
    return 'n/a' if value is None else f'{value:.3g}'


def main(argv: Optional[Sequence[str]] = None) -> int:
    """
    Run the demo.

    :param argv: command-line arguments; ``None`` reads ``sys.argv``.
    :return: exit code: 0 when the task succeeded and the identified model predicts better
        than the nominal one, 1 otherwise, 2 when another robot's graph runs on the domain.
    """
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    info = robots.get(args.robot)
    task = tasks.get_task(args.robot)
    duration = args.duration or task.duration_s + IDENTIFY_S
    bag = args.out / 'recording.mcap'
    steps = 3 if args.no_fit else 4
    print(f'[1/{steps}] sim_driver + identifier + mpc + monitor over DDS: {args.robot}, '
          f'hidden parameters {args.param_error:.0%} off nominal (seed {args.seed}), '
          f'{duration:g} s simulated at {args.real_time_factor:g}x real time', flush=True)
    try:
        graph = run_graph(args, bag, duration)
    except ForeignGraphError as error:
        print(f'diffsim-demo: {error}', file=sys.stderr)
        return 2
    command_topic = f'/{info.controller_name}/commands'
    held = graph['lockstep']
    print(f'[2/{steps}] recorded {sum(graph["recorded"].values())} messages on '
          f'{len(graph["recorded"])} topics to {bag}; simulated time waited '
          f'{held["peer_hold_s"]:.1f} s (wall) for {held["peer_holds"]} refits and models',
          flush=True)
    (run,) = read_bag(bag, command_topic=command_topic, joint_names=info.joint_names,
                      command_joints=info.command_joints)[:1]
    nominal = robots.interface(args.robot).nominal_model()
    true = graph['true_model']
    outcome = tasks.evaluate(task, nominal, run.t, run.q, run.qd, run.u,
                             upright=_true_upright(task, true))
    estimates = {}
    # the model exactly as the mpc and monitor received it (robots/message.py)
    online = load_model_message(graph['model'], robots.interface(args.robot))[0] \
        if graph['model'] else None
    if online is not None:
        estimates['estimate'] = online
    fit_dir = args.out / 'fit'
    if not args.no_fit:
        print(f'[3/{steps}] diffsim-fit {bag.name} --robot {args.robot} --cutoff 0 --loss inverse',
              flush=True)
        # the identifier's derivatives (central differences of the driver's velocities, its
        # velocity_source 'auto') and its loss (inverse dynamics, config/<robot>.yaml), so
        # that both fits see the same data the same way.  (diffsim-fit's default refines with
        # rollouts and learns the motor's back-EMF, for what real robots have and this plant
        # lacks: on this bag it took 200 s on a busy machine and left the base parameters
        # 8.7-16.5 % off, against 0.7-1.1 % for the inverse fit.)
        code = fit_main([str(bag), '--robot', args.robot, '--command-topic', command_topic,
                         '--out', str(fit_dir), '--seed', str(args.seed), '--cutoff', '0',
                         '--loss', 'inverse'])
        if code == 0:
            try:   # the fit as every tool reads it back: params.yaml's model document
                estimates['offline_fit'] = load_fit(fit_dir, robots.interface(args.robot)).model
            except FitFileError as error:
                print(f'diffsim-fit output not loaded: {error}', file=sys.stderr)
        else:
            print(f'diffsim-fit failed with exit code {code}', file=sys.stderr)
    parameters = parameter_report(nominal, estimates, true) if 'estimate' in estimates else {}
    compared = {'identified': online, 'nominal': nominal} if online is not None \
        else {'nominal': nominal}
    study = prediction_study(compared, info, run)
    plot_prediction(args.out / 'prediction.png', study, nominal,
                    f'{args.robot}: measured vs 1 s predictions (identified online vs nominal)')
    nmse = {label: entry['nmse'] for label, entry in study.items()}
    better = online is not None and nmse.get('identified') is not None \
        and nmse['identified'] < nmse['nominal']
    errors = _sorted_errors(parameters, 'relative_error')
    offline_errors = _sorted_errors(parameters, 'offline_fit_relative_error')
    report = {
        'robot': args.robot, 'param_error': args.param_error, 'seed': args.seed,
        'duration_s': duration, 'real_time_factor': args.real_time_factor,
        'success': bool(outcome['success']),
        'swing_up_time_s': outcome.get('swing_up_time_s'),
        'tracking_rms': outcome.get('tracking_rms'),
        'task': outcome,
        'identified_better_than_nominal': bool(better),
        'prediction_nmse': nmse.get('identified'),
        'prediction_nmse_nominal': nmse.get('nominal'),
        'monitor_prediction_nmse': graph['prediction_nmse'],
        'models_accepted': graph['models_accepted'],
        'model_times_s': graph['model_times_s'],
        'median_parameter_error': errors[len(errors) // 2] if errors else None,
        'offline_fit_median_parameter_error':
            offline_errors[len(offline_errors) // 2] if offline_errors else None,
        'parameters': parameters,
        'identifier_parameters': graph['parameters'].get('parameters', {}),
        'recorded_messages': graph['recorded'],
        'graph_wall_time_s': graph['wall_time_s'],
        'lockstep': graph['lockstep'],
        'wall_time_s': time.perf_counter() - start,
        'outputs': {'bag': str(bag), 'plot': str(args.out / 'prediction.png'),
                    'fit': None if args.no_fit else str(fit_dir)},
    }
    (args.out / 'report.json').write_text(json.dumps(report, indent=2), encoding='utf-8')
    print(f'[{steps}/{steps}] result:', flush=True)
    if task.kind == tasks.SWING_UP:
        verdict = (f'swung up and balanced after {report["swing_up_time_s"]:.2f} s'
                   if report['success'] else 'did NOT swing up and balance')
    else:
        verdict = f'tracking RMS {report["tracking_rms"]:.3g} rad'
    print(f'  task: {verdict}')
    print(f'  1 s prediction NMSE: identified {_number(nmse.get("identified"))}, nominal '
          f'{_number(nmse.get("nominal"))}; models accepted online: '
          f'{report["models_accepted"]}')
    if errors:
        nominal_errors = _sorted_errors(parameters, 'nominal_relative_error')
        offline = (f', offline fit of the bag {offline_errors[len(offline_errors) // 2]:.1%}'
                   if offline_errors else '')
        print(f'  base parameters: median relative error {errors[len(errors) // 2]:.1%} '
              f'(nominal model {nominal_errors[len(errors) // 2]:.1%}{offline})')
    print(f'wrote {args.out / "report.json"}, prediction.png and {bag.name} in '
          f'{report["wall_time_s"]:.0f} s')
    return 0 if report['success'] and better else 1


if __name__ == '__main__':
    sys.exit(main())
