"""
``diffsim-cup-search``: a swing-up for ball in a cup on the WAM-4, from identification data.

What goes in: recordings of the WAM-4 (issue 18's identification data: an arm excitation with
the ball taken off, slow swings that make the ball oscillate, no swing-up), each

- a rosbag2 (folder, ``.mcap`` or ``.db3``) with ``sensor_msgs/JointState`` (``--topic``,
  default ``/joint_states``; torques from ``effort`` or from the effort commands on
  ``--command-topic``, as ``diffsim-fit`` reads them) and the ball's centre as
  ``geometry_msgs/PoseStamped`` on ``--ball-topic`` (default ``/mocap/ball``, world frame, m);
- an NPZ or CSV table of :mod:`diffsim_ros.io.tables` (one run per NPZ file) with the ball as
  the pose ``ball`` (``pose:ball:x`` ... columns in a CSV), or a folder of such tables:
  ``--record-sim DIR`` writes one from the simulated plant (:mod:`diffsim_ros.sim.cup_swing`).

A run with ball positions is a swing run (it fits the string); a run without is an arm run (it
fits the arm; when there is none, the swing runs fit the arm too).  The last ``--validation``
of every run is held out: the fit never sees it, and ``report.json`` scores the fitted and the
nominal (catalogue arm, tape-measure string) models on it.  ``--model PATH`` reuses a fit
instead of fitting: a ``diffsim-fit --out`` folder or ``params.yaml`` (the arm, its ``model``
document), the identifier's saved ``wam4_identified.yaml`` (the string, its ``string/<name>``
parameters) or a ``diffsim-cup-search --out`` folder (both); whatever it lacks is fitted.

The search: ``--searches`` independent eREPS policy searches (seeds from ``--seed``) of the
ProMP swing-up of :func:`~diffsim_ros.sim.cup_swing.make_task` (from ``HOME`` over 2 s, then
0.5 s at rest) on the fitted arm and string (:func:`~diffsim_ros.control.ball_in_cup.
policy_search`).  The searches are taken in order of their model reward; the first whose mean
passes the mpc's own reference check (:func:`~diffsim_ros.nodes.reference.load_reference_task`
with the speed limits of ``--config``'s mpc section, ``config/wam4_cup.yaml``: positions,
speeds, nominal torques) is written.

What comes out, in ``--out``:

- ``swing_up.yaml``: a ``kind: sampled`` reference (:mod:`diffsim_ros.sysid.sampled`) at the
  WAM's 500 Hz over the movement and the rest, for ``ros2 launch diffsim_ros cup.launch.py
  reference_file:=swing_up.yaml`` (the arm must stand at rest at ``HOME`` when it starts);
- ``params.yaml``: the arm's model document (``model``, read back by ``model_file:=`` and
  ``--model``) and the string as ``parameters: {string/<name>: {value, unit}}``;
- ``report.json``: the identified string length and cup transform beside the nominal ones,
  held-out errors of both models, every search's seed, model reward, catch in the model and
  reference check, and which one was written (with the ball's peak along the cup's axis in
  the fitted and in the nominal model);
- ``report.png``: the written swing-up's ball height in the cup frame in the fitted and the
  nominal model, and every search's mean sample reward per eREPS iteration.

Exit status: 0 when ``swing_up.yaml`` was written; 2 for bad arguments or input that cannot be
used (one line on stderr); 3 when no search's mean passes the reference check (``report.json``
says why for each; no ``swing_up.yaml``).

>>> main(['--record-sim', 'cup_data', '--plant-seed', '3'])        # doctest: +SKIP
>>> main(['cup_data', '--out', 'cup_search', '--searches', '8'])   # doctest: +SKIP
"""

import argparse
import json
import math
from pathlib import Path
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import yaml

from . import robots
from .control.ball_in_cup import cup_coordinates, model_episode, policy_search, SearchConfig
from .core.dispatch import rnea
from .core.model import RobotModel
from .io import read_csv, read_npz, TableError
from .io.fits import FitFileError, load_fit, write_model_document
from .nodes.params import config_path, load_yaml_params
from .nodes.reference import load_reference_task, ReferenceFileError
from .robots.message import model_message
from .sim import cup
from .sim.cup_swing import (BALL_BODY, HOME, identification_documents, make_task,
                            write_recordings)
from .sysid.dataset import Trajectory
from .sysid.estimators import fit as fit_arm
from .sysid.preprocess import resample, uniform_rate
from .sysid.sampled import sampled_document
from .sysid.string_model import (arm_trajectory, ball_prediction_error, fit_cup_model,
                                 fit_string, StringModel)
from .sysid.string_online import string_values, UNITS

__all__ = ['main']

ROBOT = cup.ROBOT
#: The arm's estimator (the benchmark's and the identifier's).
ARM_ESTIMATOR = 'diffnea'
#: Held-out ball prediction horizon, s (issue 18's 1 s error).
PREDICTION_S = 1.0
#: Shortest swing data the string fit accepts, s: the identifier's first string refit waits
#: for as much (config/wam4_cup.yaml, ``string.min_window``).
MIN_SWING_S = 12.0
#: Largest relative spread of the runs' sample rates used as they are (else resampled).
RATE_TOLERANCE = 1e-3


class InputError(ValueError):
    """Input that cannot be used (one line; exit status 2)."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog='diffsim-cup-search', formatter_class=argparse.RawDescriptionHelpFormatter,
        description='Ball in a cup on the WAM-4: fit the arm and the string from '
                    'identification data, search a swing-up offline on the fitted model and '
                    'write it as the kind: sampled reference_file of the mpc node.',
        epilog=f"""in: rosbag2 (JointState with effort or --command-topic, the ball as PoseStamped
  on --ball-topic) or NPZ/CSV tables (the ball as the pose "ball"), or folders of tables;
  runs with the ball fit the string, runs without it the arm.
out (--out DIR):
  swing_up.yaml   kind: sampled reference for the mpc: ros2 launch diffsim_ros cup.launch.py
                  simulate:=false reference_file:=DIR/swing_up.yaml (the arm at rest at
                  HOME {list(HOME)} when it starts)
  params.yaml     the fitted arm and string (--model DIR reuses them)
  report.json     identified vs nominal string, held-out errors of both, every search
  report.png      the swing-up's ball in the fitted and nominal models, the searches
exit status: 0 written; 2 bad arguments or unusable input; 3 no searched swing-up passes
  the mpc's reference check (report.json says why).
physical WAM: diffsim-cup-search --write-references REFS, track each REFS/*.yaml with the
  mpc (reference_file:=) and record a bag (/joint_states, /mocap/ball), then
  diffsim-cup-search BAG... --out DIR.
no robot: diffsim-cup-search --record-sim DATA (simulated recordings), then
  diffsim-cup-search DATA --out DIR.""")
    parser.add_argument('data', nargs='*', type=Path,
                        help='recordings: bags, .npz/.csv tables or folders of tables')
    parser.add_argument('--out', type=Path, help='output folder (created)')
    parser.add_argument('--ball-topic', default='/mocap/ball',
                        help='PoseStamped topic of the ball in bags (default /mocap/ball)')
    parser.add_argument('--topic', default=None,
                        help='JointState topic in bags (default /joint_states)')
    parser.add_argument('--command-topic', default=None,
                        help='effort command topic (Float64MultiArray, N m) in bags whose '
                             'joint states carry no effort, e.g. /effort_controller/commands')
    parser.add_argument('--model', type=Path, default=None,
                        help='reuse a fit: a diffsim-fit or diffsim-cup-search --out folder, '
                             "a params.yaml or the identifier's wam4_identified.yaml")
    parser.add_argument('--string-length', type=float, default=cup.NOMINAL_STRING_LENGTH,
                        help='measured string length, m (the fit starts there and the '
                             f'nominal model uses it; default {cup.NOMINAL_STRING_LENGTH})')
    parser.add_argument('--validation', type=float, default=0.2,
                        help='fraction held out at the end of every run (default 0.2)')
    parser.add_argument('--searches', type=int, default=8,
                        help='independent policy searches (default 8)')
    parser.add_argument('--seed', type=int, default=0, help='seed of the searches and fits')
    parser.add_argument('--iterations', type=int, default=SearchConfig.iterations,
                        help=f'eREPS updates per search (default {SearchConfig.iterations})')
    parser.add_argument('--samples', type=int, default=SearchConfig.samples,
                        help=f'episodes per update and search (default {SearchConfig.samples})')
    parser.add_argument('--arm-iterations', type=int, default=None,
                        help="Adam steps of the arm fit (default: the estimator's)")
    parser.add_argument('--string-iterations', type=int, default=150,
                        help='rollout-stage steps of the string fit (default 150)')
    parser.add_argument('--geometry-iterations', type=int, default=300,
                        help='geometry-stage steps of the string fit (default 300)')
    parser.add_argument('--config', type=Path, default=None,
                        help='parameter file whose mpc section gives the joint speed limits '
                             "(default: the package's config/wam4_cup.yaml)")
    parser.add_argument('--threads', type=int, default=0,
                        help="torch threads (default 0: torch's choice)")
    simulated = parser.add_argument_group(
        'identification motions: --write-references DIR or --record-sim DIR writes them and '
        'exits')
    simulated.add_argument('--write-references', type=Path, default=None, metavar='DIR',
                           help='write the motions as mpc reference files for a physical WAM: '
                                'DIR/arm_excitation.yaml (ball off), DIR/swing_<k>.yaml (ball '
                                'on), for the seed --plant-seed and --string-length')
    simulated.add_argument('--record-sim', type=Path, default=None, metavar='DIR',
                           help='record the motions on the simulated MuJoCo cup (a hidden plant) '
                                'into DIR as NPZ tables')
    simulated.add_argument('--plant-seed', type=int, default=0,
                           help='seed of the motions and of the hidden simulated plant')
    simulated.add_argument('--arm-seconds', type=float, default=60.0,
                           help='arm excitation run, s (default 60)')
    simulated.add_argument('--swing-runs', type=int, default=6,
                           help='ball-swinging runs (default 6)')
    simulated.add_argument('--swing-seconds', type=float, default=30.0,
                           help='each swing run, s (default 30)')
    return parser


# -- input ----------------------------------------------------------------------------------
def _is_bag(path: Path) -> bool:
    if path.suffix in ('.mcap', '.db3'):
        return True
    return path.is_dir() and ((path / 'metadata.yaml').is_file() or any(
        p.suffix in ('.mcap', '.db3') for p in path.iterdir()))


def _files(path: Path) -> List[Path]:
    """Return the recordings a path stands for (a folder of tables: its tables)."""
    if not path.exists():
        raise InputError(f'{str(path)!r} does not exist')
    if _is_bag(path) or path.is_file():
        return [path]
    tables = sorted(p for p in path.iterdir() if p.suffix in ('.npz', '.csv'))
    if not tables:
        raise InputError(f'{str(path)!r} is neither a rosbag2 nor a folder of .npz/.csv tables')
    return tables


def _read_bag(path: Path, args: argparse.Namespace, joints: Sequence[str],
              poses_seen: set) -> List[Trajectory]:
    from .io.bags import bag_topics, POSE, read_pose_stream
    topics = bag_topics(path)
    poses_seen.update(name for name, (kind, _) in topics.items() if kind == POSE)
    pose_topics = {}
    if args.ball_topic in topics and topics[args.ball_topic][1] > 0:
        _, t, rows = read_pose_stream(path, args.ball_topic)
        bad = ~np.isfinite(rows).all(axis=1)
        if bad.all():   # the tracker saw no ball: an arm run recorded with the ball off
            return _read_bag_runs(path, args, joints, {})
        if bad.any():
            first = int(np.argmax(bad))
            raise InputError(f'{path}: {int(bad.sum())} of {len(rows)} ball poses on '
                             f'{args.ball_topic} are not finite (NaN), the first at '
                             f'{t[first]:.3f} s: the string fit needs an unbroken ball track; '
                             f'cut the recording where the tracker lost the ball')
        pose_topics = {args.ball_topic: BALL_BODY}
    return _read_bag_runs(path, args, joints, pose_topics)


def _read_bag_runs(path: Path, args: argparse.Namespace, joints: Sequence[str],
                   pose_topics: Dict[str, str]) -> List[Trajectory]:
    from .io.bags import read_bag
    info = robots.get(ROBOT)
    return read_bag(path, topic=args.topic, command_topic=args.command_topic,
                    pose_topics=pose_topics, joint_names=joints,
                    command_joints=info.command_joints)


def _with_torque(run: Trajectory, model: RobotModel) -> Trajectory:
    if run.tau is not None:
        return run
    if run.u is None:
        raise InputError(f'run {run.run!r} carries neither joint efforts (JointState.effort, '
                         'tau columns) nor effort commands (--command-topic, u columns)')
    interface = robots.interface(ROBOT)
    tau = interface.motor_torque(model, run.q, run.qd, run.u)
    return run.replace(tau=tau)


def load_runs(args: argparse.Namespace, model: RobotModel
              ) -> Tuple[List[Trajectory], List[Trajectory]]:
    """
    Read every recording; return the arm runs and the swing runs on one uniform rate.

    :param args: parsed arguments (``data``, ``ball_topic``, ``topic``, ``command_topic``).
    :param model: the catalogue arm (joint names, command-to-torque map).
    :return: ``(arm runs, swing runs)``, joints in model order, ``tau`` and ``qd`` set.
    :raises InputError: unreadable input, missing signals, no ball anywhere, too little.
    """
    from .io.bags import BagError
    joints = model.joint_names
    runs: List[Trajectory] = []
    poses_seen: set = set()
    for path in (f for item in args.data for f in _files(item)):
        try:
            if _is_bag(path):
                runs += _read_bag(path, args, joints, poses_seen)
            elif path.suffix == '.npz':
                runs.append(read_npz(path, joint_names=joints))
            elif path.suffix == '.csv':
                runs += read_csv(path, joint_names=joints)
            else:
                raise InputError(f'{str(path)!r}: expected a rosbag2, .npz or .csv')
        except (BagError, TableError) as error:
            raise InputError(' '.join(str(error).split())) from None
    runs = [_with_torque(run, model) for run in runs]
    for run in runs:
        if run.qd is None:
            raise InputError(f'run {run.run!r} has no joint velocities')
        if len(run) < 3:
            raise InputError(f'run {run.run!r} holds {len(run)} samples')
    rates = [1.0 / float(run.t.diff().median()) for run in runs]
    rate = float(np.median(rates))
    runs = [run if uniform_rate(run.t.numpy()) is not None and
            abs(r - rate) <= RATE_TOLERANCE * rate else resample(run, rate)
            for run, r in zip(runs, rates)]
    swings = [run for run in runs if BALL_BODY in run.poses]
    arm = [run for run in runs if BALL_BODY not in run.poses]
    if not swings:
        found = f'; the bags have PoseStamped topics {sorted(poses_seen)}' if poses_seen else ''
        raise InputError(f'no recording has ball positions (bags: topic {args.ball_topic!r}, '
                         f'tables: pose {BALL_BODY!r}){found}; the string cannot be fitted')
    return arm, swings


def split(runs: Sequence[Trajectory], fraction: float
          ) -> Tuple[List[Trajectory], List[Trajectory]]:
    """
    Hold out the last ``fraction`` of every run.

    :param runs: the runs.
    :param fraction: in ``[0, 1)``.
    :return: ``(training parts, held-out parts)`` (a part of fewer than 3 samples is left out).
    """
    train, held = [], []
    for run in runs:
        cut = int(round(len(run) * (1.0 - fraction)))
        if cut >= 3:
            train.append(run.crop(0, cut))
        if len(run) - cut >= 3:
            held.append(run.crop(cut, len(run)))
    return train, held


class _BallRun:
    """A swing run as the string functions read it: ``t``, ``q``, ``qd``, ``ball``."""

    def __init__(self, run: Trajectory) -> None:
        self.t, self.q, self.qd = run.t, run.q, run.qd
        self.ball = run.poses[BALL_BODY][:, :3, 3]


# -- models ---------------------------------------------------------------------------------
def _model_file(path: Path) -> Path:
    if path.is_file():
        return path
    for name in ('params.yaml', f'{ROBOT}_identified.yaml'):
        if (path / name).is_file():
            return path / name
    raise InputError(f'--model {str(path)!r}: no params.yaml or {ROBOT}_identified.yaml there')


def load_model(path: Path,
               model: RobotModel) -> Tuple[Optional[RobotModel], Optional[StringModel]]:
    """
    Read what a fit file gives: the arm (a ``model`` document), the string (``string/*``).

    :param path: ``--model``.
    :param model: the catalogue arm (the string's kinematics).
    :return: ``(arm or None, string or None)``.
    :raises InputError: unreadable, refused, or holding neither.
    """
    file = _model_file(path)
    try:
        document = yaml.safe_load(file.read_text(encoding='utf-8'))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise InputError(f'--model {str(file)!r}: {" ".join(str(error).split())[:200]}'
                         ) from None
    if not isinstance(document, dict):
        raise InputError(f'--model {str(file)!r}: expected a mapping')
    arm = None
    if 'model' in document:
        interface = robots.interface(ROBOT)
        try:
            fit = load_fit(file, interface)
        except FitFileError as error:
            raise InputError(f'--model: {error}') from None
        problems = interface.check_model(fit.model, fit.actuator, fit.friction)
        if problems:
            raise InputError(f'--model {str(file)!r}: the {ROBOT} interface refuses the arm: '
                             f'{"; ".join(problems[:2])}')
        arm = fit.model
    parameters = document.get('parameters') or {}
    names = [f'string/{name}' for name in UNITS]
    string = None
    if all(name in parameters for name in names):
        try:
            values = {name[len('string/'):]: float(parameters[name]['value']) for name in names}
            string = StringModel(model, values['string_length'],
                                 (values['cup_x'], values['cup_y'], values['cup_z']),
                                 (values['cup_roll'], values['cup_pitch'], values['cup_yaw']),
                                 values['friction'])
        except (TypeError, KeyError, ValueError) as error:
            raise InputError(f'--model {str(file)!r}: bad string parameters: {error}') from None
    if arm is None and string is None:
        raise InputError(f'--model {str(file)!r} holds neither an arm model document '
                         f'(model:) nor the string ({", ".join(names)})')
    return arm, string


def fit_models(args: argparse.Namespace, catalogue: RobotModel, arm_runs: List[Trajectory],
               swing_runs: List[Trajectory], arm: Optional[RobotModel],
               string: Optional[StringModel]) -> Tuple[RobotModel, StringModel, Dict]:
    """
    Fit what ``--model`` did not give: the arm and the string (``fit_cup_model``).

    :return: ``(arm, string, what was fitted and how long it took)``.
    """
    start = time.perf_counter()
    arm_data = arm_runs or swing_runs
    arm_config = {} if args.arm_iterations is None else {'adam_iterations': args.arm_iterations}
    options = {'geometry_iterations': args.geometry_iterations,
               'iterations': args.string_iterations, 'seed': args.seed}
    first = StringModel(catalogue, args.string_length)
    balls = [_BallRun(run) for run in swing_runs]
    if arm is None and string is None:
        arm, string = fit_cup_model(arm_data, balls, catalogue, ARM_ESTIMATOR, arm_config,
                                    start=first, **options)
    elif arm is None:
        runs = [arm_trajectory(run, catalogue) for run in arm_data]
        arm = fit_arm(ARM_ESTIMATOR, catalogue, runs, config=arm_config).model
    elif string is None:
        string, _ = fit_string(balls, first, **options)
    fitted = {'arm_runs': [run.run for run in arm_data],
              'arm_fitted_on_swing_runs': not arm_runs,
              'swing_runs': [run.run for run in swing_runs],
              'seconds': time.perf_counter() - start}
    return arm, string, fitted


def heldout_errors(arm: RobotModel, catalogue: RobotModel, string: StringModel,
                   nominal: StringModel, arm_held: Sequence[Trajectory],
                   swing_held: Sequence[Trajectory]) -> Dict[str, Any]:
    """
    Score the fitted and the nominal models on the held-out parts.

    :return: ``torque_rms_nm`` per joint (inverse dynamics against the measured torque) and
        ``ball_1s_m`` (open-loop ball error over 1 s windows, :func:`ball_prediction_error`),
        each ``{'fitted', 'nominal'}``, or a ``note`` where the held-out data are too short.
    """
    out: Dict[str, Any] = {}
    if arm_held:
        squared = {'fitted': 0.0, 'nominal': 0.0}
        count = 0
        for run in arm_held:
            run = arm_trajectory(run, catalogue)
            with torch.no_grad():
                for key, model in (('fitted', arm), ('nominal', catalogue)):
                    tau = rnea(model, run.q, run.qd, run.qdd)
                    squared[key] = squared[key] + ((tau - run.tau) ** 2).sum(0)
            count += len(run)
        out['torque_rms_nm'] = {key: (value / count).sqrt().tolist()
                                for key, value in squared.items()}
    ball: Dict[str, List[float]] = {'fitted': [], 'nominal': []}
    for run in swing_held:
        if run.duration < PREDICTION_S + 0.1:
            continue
        for key, model in (('fitted', string), ('nominal', nominal)):
            ball[key].append(ball_prediction_error(model, model, _BallRun(run), PREDICTION_S,
                                                   stride=100)['mean_m'])
    if ball['fitted']:
        out['ball_1s_m'] = {key: float(np.mean(value)) for key, value in ball.items()}
    else:
        out['ball_1s_m'] = None
        out['note'] = (f'no held-out swing part is longer than {PREDICTION_S} s; raise '
                       '--validation or record longer swings')
    return out


# -- search and reference -------------------------------------------------------------------
def velocity_limits(path: Optional[Path]) -> Tuple[float, ...]:
    """
    Return the mpc's configured joint speed limits (its ``gate.velocity_limits``).

    :param path: the parameter file (None: ``config/wam4_cup.yaml``).
    :return: rad/s per joint, or ``()`` when the file gives none (the URDF's then apply).
    :raises InputError: an unreadable file.
    """
    file = config_path('wam4_cup') if path is None else path
    try:
        values = load_yaml_params(file, 'mpc')
    except (OSError, ValueError, yaml.YAMLError) as error:
        raise InputError(f'--config {str(file)!r}: {" ".join(str(error).split())[:200]}'
                         ) from None
    return tuple(float(v) for v in values.get('gate.velocity_limits', ()))


def reference_document(task: Any, joint_names: Sequence[str], theta: torch.Tensor,
                       extra: Dict[str, Any]) -> Dict:
    """
    Return a ProMP mean as a ``kind: sampled`` document at the driver rate.

    :param task: the swing-up task.
    :param joint_names: the arm's joints (the ProMP's columns).
    :param theta: ProMP parameters ``(dim,)``.
    :param extra: entries saying how it was made.
    :return: the document (movement and rest, 500 Hz).
    """
    rate = robots.get(ROBOT).driver_rate_hz
    seconds = task.promp.duration + task.hold
    t = torch.arange(int(round(seconds * rate)) + 1, dtype=torch.float64) / rate
    with torch.no_grad():
        q, _, _ = task.promp.reference(theta)(t)
    return sampled_document(joint_names, rate, q, ROBOT, extra)


def check_reference(document: Dict[str, Any], out: Path, catalogue: RobotModel,
                    limits: Sequence[float]) -> Optional[str]:
    """
    Run a document through the mpc node's reference loader.

    :return: None when accepted, else the loader's one-line reason.
    """
    with tempfile.NamedTemporaryFile('w', suffix='.yaml', dir=out, delete=False) as stream:
        yaml.safe_dump(document, stream)
        path = Path(stream.name)
    try:
        load_reference_task(path, ROBOT, catalogue, limits)
        return None
    except ReferenceFileError as error:
        return str(error).split(': ', 1)[-1]
    finally:
        path.unlink()


def _plain(string: StringModel) -> Dict[str, float]:
    return {name: float(value) for name, value in string_values(string).items()}


def write_params(path: Path, arm: RobotModel, string: StringModel, method: str) -> None:
    """
    Write the fitted string and the arm's model document (``--model`` reads it back).

    :param path: the ``params.yaml``.
    :param arm: the arm.
    :param string: the string.
    :param method: how they were obtained.
    """
    parameters = {f'string/{name}': {'value': value, 'unit': UNITS[name]}
                  for name, value in _plain(string).items()}
    path.write_text('# diffsim-cup-search: the string and the arm it searched on\n'
                    + yaml.safe_dump({'method': method, 'parameters': parameters},
                                     sort_keys=False), encoding='utf-8')
    write_model_document(path, model_message(arm, robots.interface(ROBOT), method=method))


def search(args: argparse.Namespace, arm: RobotModel, string: StringModel,
           catalogue: RobotModel, out: Path) -> Tuple[Optional[Dict], List[Dict], Dict]:
    """
    Search, then take the searches by model reward until one passes the reference check.

    :param args: parsed arguments (search sizes, seed, ``config``).
    :param arm: the fitted arm; :param string: the fitted string.
    :param catalogue: the catalogue arm (the reference check's nominal torques).
    :param out: the output folder (the check's temporary file).
    :return: ``(the chosen document or None, per search records, search facts)``.
    """
    task = make_task(arm)
    seeds = [args.seed * 1000 + k for k in range(args.searches)]
    result = policy_search(task, string, seeds,
                           SearchConfig(iterations=args.iterations, samples=args.samples))
    limits = velocity_limits(args.config)
    records = []
    for i, seed in enumerate(seeds):
        records.append({'seed': seed, 'model_reward': float(result.reward[i]),
                        'caught_in_model': bool(result.caught[i]),
                        'last_mean_sample_reward': float(result.history[-1, i])
                        if len(result.history) else None})
    chosen = None
    for i in torch.argsort(result.reward, descending=True).tolist():
        theta = result.distribution.mean[i]
        document = reference_document(task, arm.joint_names, theta, {
            'made_by': 'diffsim-cup-search', 'search_seed': seeds[i],
            'model_reward': records[i]['model_reward'],
            'caught_in_model': records[i]['caught_in_model'], 'home': list(task.promp.q_home),
            'promp_theta': theta.tolist()})
        refusal = check_reference(document, out, catalogue, limits)
        records[i]['reference_check'] = 'accepted' if refusal is None else refusal
        if refusal is None:
            chosen = document
            break
    return chosen, records, {'seconds': result.seconds, 'velocity_limits': list(limits),
                             'history': result.history.tolist()}


def ball_heights(task: Any, theta: torch.Tensor, kinematics: StringModel) -> np.ndarray:
    """
    Return the ball's height in the cup frame over a model episode of a ProMP mean.

    :param task: the swing-up task.
    :param theta: ProMP parameters ``(dim,)``.
    :param kinematics: the string model the episode runs on.
    :return: ``(T,)`` m along the cup's axis at ``task.times()`` (the anchor at 0, the rim at
        the cup's height).
    """
    with torch.no_grad():
        episode = model_episode(task, theta[None], kinematics)
        _, R = kinematics.cup_frame(episode.q[0])
        return cup_coordinates(episode.ball[0], episode.cup[0], R)[:, 2].numpy()


def write_figure(path: Path, task: Any, heights: Dict[str, np.ndarray],
                 history: Sequence[Sequence[float]], chosen: int) -> None:
    """
    Plot the written swing-up in the models and the searches' progress.

    :param path: the PNG.
    :param task: the swing-up task (times).
    :param heights: ``{'fitted', 'nominal'}`` ball heights in the cup frame, m.
    :param history: mean sample reward per iteration ``(iterations, searches)``.
    :param chosen: index of the written search.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    figure = Figure(figsize=(10, 4))
    FigureCanvasAgg(figure)
    left, right = figure.subplots(1, 2)
    t = task.times().numpy()
    for name, z in heights.items():
        left.plot(t, z, label=f'{name} model')
    left.axhline(cup.CUP_HEIGHT, color='k', lw=0.8, ls='--', label='rim')
    left.axhline(0.0, color='k', lw=0.8, label='bottom (anchor)')
    left.set(xlabel='t [s]', ylabel='ball along the cup axis [m]',
             title='the written swing-up in the models')
    left.legend(fontsize=8)
    values = np.asarray(history, dtype=float)
    if values.size:
        for k in range(values.shape[1]):
            right.plot(values[:, k], lw=2.0 if k == chosen else 0.8,
                       label='written' if k == chosen else None)
        right.legend(fontsize=8)
    right.set(xlabel='eREPS iteration', ylabel='mean sample reward (model)',
              title=f'{values.shape[-1] if values.size else 0} searches')
    figure.tight_layout()
    figure.savefig(path, dpi=100)


# -- main -----------------------------------------------------------------------------------
def record_simulation(args: argparse.Namespace) -> int:
    """Record the simulated identification runs into ``--record-sim`` (``--plant-seed``)."""
    truth = cup.draw_truth(args.plant_seed, args.string_length)
    arm, swings = cup.identification_recordings(
        truth, args.plant_seed, arm_seconds=args.arm_seconds, string_runs=args.swing_runs,
        string_seconds=args.swing_seconds)
    paths = write_recordings(args.record_sim, arm, swings, truth)
    print(f'wrote {len(paths)} runs to {args.record_sim} (hidden plant in truth.json); next: '
          f'diffsim-cup-search {args.record_sim} --out <DIR>')
    return 0


def write_references(args: argparse.Namespace) -> int:
    """Write the identification motions as reference files into ``--write-references``."""
    directory: Path = args.write_references
    directory.mkdir(parents=True, exist_ok=True)
    documents = identification_documents(args.plant_seed, args.string_length,
                                         args.arm_seconds, args.swing_runs, args.swing_seconds)
    for name, document in documents.items():
        (directory / f'{name}.yaml').write_text(yaml.safe_dump(document, sort_keys=False),
                                                encoding='utf-8')
    print(f'wrote {", ".join(documents)} (.yaml) to {directory}: track each with the mpc '
          f'(arm_excitation with the ball taken off), record /joint_states and the ball, then '
          f'diffsim-cup-search <bags> --out <DIR>')
    return 0


def _check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.record_sim is not None or args.write_references is not None:
        if args.data or (args.record_sim is not None and args.write_references is not None):
            parser.error('--record-sim and --write-references write identification data or '
                         'motions; give neither DATA nor the other with it')
        return
    if args.out is None:
        parser.error('--out is required')
    if not args.data and args.model is None:
        parser.error('give recordings (DATA) or --model with both the arm and the string')
    if not 0.0 <= args.validation < 1.0:
        parser.error(f'--validation must be in [0, 1), got {args.validation}')
    for name in ('searches', 'iterations', 'samples'):
        if getattr(args, name) < 1:
            parser.error(f'--{name} must be >= 1')
    if not (math.isfinite(args.string_length) and args.string_length > 0):
        parser.error(f'--string-length must be > 0, got {args.string_length}')


def run(args: argparse.Namespace) -> int:
    """
    Fit, search and write (module docstring).

    :param args: checked arguments.
    :return: exit status.
    :raises InputError: unusable input.
    """
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    catalogue = robots.interface(ROBOT).nominal_model()
    arm, string = load_model(args.model, catalogue) if args.model else (None, None)
    arm_runs, swing_runs = load_runs(args, catalogue) if args.data else ([], [])
    arm_train, arm_held = split(arm_runs, args.validation)
    swing_train, swing_held = split(swing_runs, args.validation)
    if string is None or arm is None:
        if not args.data:
            raise InputError('--model lacks the arm or the string and no DATA was given')
        seconds = sum(run.duration for run in swing_train)
        if string is None and seconds < MIN_SWING_S:
            raise InputError(f'{seconds:.1f} s of swing data to fit on (after holding out '
                             f'{args.validation:g}); the string fit needs at least '
                             f'{MIN_SWING_S:g} s')
    print(f'data: {len(arm_runs)} arm runs, {len(swing_runs)} swing runs; fitting '
          f'{"nothing" if arm is not None and string is not None else "the models"}',
          flush=True)
    fitted_arm = arm is None
    fitted_string = string is None
    arm, string, fitted = fit_models(args, catalogue, arm_train, swing_train, arm, string)
    nominal = StringModel(catalogue, args.string_length)
    report: Dict[str, Any] = {
        'inputs': [str(p) for p in args.data], 'model_file': str(args.model or ''),
        'fitted': {'arm': fitted_arm, 'string': fitted_string, **fitted},
        'string': {'identified': _plain(string), 'nominal': _plain(nominal)},
        'heldout': heldout_errors(arm, catalogue, string, nominal, arm_held, swing_held),
    }
    s = report['string']['identified']
    print(f'string length {s["string_length"]:.4f} m (nominal {args.string_length:.4f}), cup '
          f'[{s["cup_x"]:.4f}, {s["cup_y"]:.4f}, {s["cup_z"]:.4f}] m', flush=True)
    write_params(out / 'params.yaml', arm, string, 'diffsim-cup-search')
    chosen, records, info = search(args, arm, string, catalogue, out)
    report['search'] = {'searches': records, 'iterations': args.iterations,
                        'samples': args.samples, **info}
    reference = out / 'swing_up.yaml'
    if chosen is None:
        report['search'].pop('history')
        report['written'] = None
        _write_json(out / 'report.json', report)
        print(f'no searched swing-up passes the mpc reference check; see {out}/report.json',
              file=sys.stderr)
        return 3
    reference.write_text(yaml.safe_dump(chosen, sort_keys=False), encoding='utf-8')
    task = make_task(arm)
    theta = torch.tensor(chosen['promp_theta'], dtype=torch.float64)
    heights = {'fitted': ball_heights(task, theta, string),
               'nominal': ball_heights(task, theta, nominal)}
    history = report['search'].pop('history')
    index = [r['seed'] for r in records].index(chosen['search_seed'])
    write_figure(out / 'report.png', task, heights, history, index)
    report['written'] = {'file': str(reference), 'search_seed': chosen['search_seed'],
                         'model_reward': chosen['model_reward'],
                         'caught_in_model': chosen['caught_in_model'],
                         'model_ball_peak_m': {k: float(z.max()) for k, z in heights.items()}}
    _write_json(out / 'report.json', report)
    print(f'wrote {reference} (search seed {chosen["search_seed"]}, model reward '
          f'{chosen["model_reward"]:.3f}, caught in the model: {chosen["caught_in_model"]}), '
          f'{out}/params.yaml, {out}/report.json')
    return 0


def _write_json(path: Path, payload: Dict[str, Any]) -> None:
    path.write_text(json.dumps(payload, indent=1) + '\n', encoding='utf-8')


def main(argv: Optional[Sequence[str]] = None) -> int:
    """
    Run ``diffsim-cup-search`` (module docstring).

    :param argv: arguments (None: ``sys.argv[1:]``).
    :return: exit status.
    """
    parser = _parser()
    args = parser.parse_args(argv)
    _check_args(parser, args)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    try:
        if args.record_sim is not None:
            return record_simulation(args)
        if args.write_references is not None:
            return write_references(args)
        return run(args)
    except (InputError, OSError) as error:
        print(f'diffsim-cup-search: error: {error}', file=sys.stderr)
        return 2


if __name__ == '__main__':
    sys.exit(main())
