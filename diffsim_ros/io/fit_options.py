"""
Command line of ``diffsim-fit``: options, their checks, exit codes and one-line errors.

Every bad input becomes a :class:`UsageError` with one line for stderr (exit status
:data:`EXIT_USAGE`), found before anything is fitted; :func:`reported` turns the errors of a
block into it.  :func:`build_parser` is the whole option set (``diffsim-fit --help``).
"""

import argparse
import contextlib
import math
from pathlib import Path
from typing import Any, Iterator, Tuple, Type


from .conventions import parse_delay
from .formats import FORMATS
from .loss_options import LOSS_CHOICES
from .report import ROLLOUT_HORIZONS
from .selection import EARLY_STOPPING
from .. import robots
from ..sysid import estimators
from ..sysid.object_learning import METHODS as OBJECT_METHODS, RESTART_CRITERIA

PROG = 'diffsim-fit'
#: Friction choices of ``--actuator``.
ACTUATOR_CHOICES = ('viscous', 'coulomb', 'stribeck', 'sigmoid', 'nn-friction', 'nn-residual')
#: Fewest training samples worth fitting.
MIN_SAMPLES = 20
#: Block length of the validation split of a single run, s.
SPLIT_BLOCK_S = 2.0
#: Exit status: the inputs or the output folder are unusable (one line on stderr).
EXIT_USAGE = 2
#: Exit status: outputs written, but the data do not excite the dynamics (see --max-condition).
EXIT_NOT_EXCITED = 3
#: Exit status: outputs written, but held-out rollouts are worse than the nominal model's.
EXIT_WORSE = 4
#: Built-in values of the options a data format may set (None: unset).
OPTION_DEFAULTS = {'runs': None, 'validation': None, 'input_delay': None, 'rate': None,
                   'derivatives': 'auto', 'cutoff': 20.0, 'early_stopping': 'validation',
                   'actuator': None}
#: Default ``--max-condition``.  Measured (sysid/excitation.py): chirps, multisines and the
#: recorded Qube, cart-pole and Panda excitations 3-40; robots at rest or at constant velocity
#: with sensor noise 650 and more; this lies a factor 3-5 from both.
MAX_CONDITION = 200.0
#: Sampling rates a recording can plausibly have, Hz (outside: times not in seconds).
RATE_RANGE_HZ = (0.1, 1e6)


EPILOG = """\
data:
  bags      sensor_msgs/JointState (position, velocity, effort; joints matched by name)
            on --topic, std_msgs/Float64MultiArray commands on --command-topic
            (voltage-commanded robots default to /<controller>/commands)
  CSV       header t, q:<joint>..., optional qd:/qdd:/tau:<joint>, u:<name>, run
            (rows sharing a run name form one run); lines starting with # are comments
  NPZ       arrays t, q, joint_names, optional qd, qdd, tau, u, run
  data sets (read in place; --robot, split and conventions default to the data set's,
  see config/README.md; --early-stopping train; options given win):
  quanser   quanser_qube_pyrado / quanser_cartpole_pyrado folder, a group or a rollout CSV:
            train on chirps, validate on swing-ups; Qube: --input-delay 2, 250 Hz runs
  panda-gaz panda_gaz2019_excitation folder: --validation last:0.3 --rate 200 --cutoff 5
            (diffnea: --actuator sigmoid)
  dfki      dfki_double_pendulum (design A.0; validate on the swing-ups) or
            dfki_simple_pendulum folder or file: --rate 250 --cutoff 10
  missing qd/qdd are estimated with a zero-phase Butterworth filter (--cutoff)

objects (--object cube|elbow|URDF; --method one of the object learners):
  TOSSES    the shared toss .npz (cube_tosses.npz, elbow_tosses.npz, or the shared data
            folder: its cube file); a CSV with header t,x,y,z,qw,qx,qy,qz[,toss] (s, m,
            quaternion body->frame real part first, z up, table at z = 0; rows sharing a
            toss id form a toss); or a rosbag2 with a geometry_msgs/PoseStamped or
            TransformStamped topic of the object (--topic, default: the only one).
            Poses without toss ids are cut into tosses at gaps in the stamps and at rest
            (slower than 0.02 m/s for --rest s); velocities are backward differences of
            the poses, first sample repeated, 3-tap median (as the shared data).
  split     --validation F (default 0.2) of the tosses, drawn with --seed, are held out
            and never fitted; a fifth of the rest (at least one) stops the optimiser
  outputs   params.yaml (named parameters, units, nominal beside), <object>_learned.urdf
            (+ <object>_learned_<link>.obj: learned contact vertices and their hull),
            metrics.json (held-out position/orientation errors of the fit and of the
            nominal object, volume_error and inertia_error where the truth is known,
            friction), report.png (loss history, held-out tosses), modules.pt (networks)
  diffsim-predict DIR TOSSES --out PRED.npz rolls a fit out on other tosses

examples:
  diffsim-fit shared/data/contactnets_cube_toss --object cube --method ccn --out fits/cube
  diffsim-fit shared/data/quanser_qube_pyrado --out fits/qube
  diffsim-fit shared/data/panda_gaz2019_excitation --out fits/panda
  diffsim-fit recording.mcap --robot panda --validation 0.3 --out fits/mine

outputs in --out: params.yaml, model.urdf, metrics.json, report.png,
  report_validation.pdf
  report.png: per joint, measured vs predicted torque and open-loop rollouts at each
  --horizons length, fit and catalogue model, on the validation runs (axes follow the
  measurement; predictions that leave them are marked); metrics; parameters (catalogue
  beside identified, * = not identifiable from the data); report_validation.pdf: the
  same panels for every validation run, one page each
  (--out is created and checked for writing before anything is fitted)

exit status:
  0    done
  2    bad input or unwritable --out: one line on stderr (checked before fitting)
  3    done, but the data do not excite the dynamics (condition number of the base
       regressor above --max-condition, e.g. a robot at rest or at constant velocity):
       a warning on stderr, "excitation" and "warning" in metrics.json
  4    done, but on the validation runs the fit's open-loop rollouts are worse than the
       nominal (catalogue) model's at some --horizons length: a warning on stderr,
       "better_than_nominal" in metrics.json (--allow-worse: exit 0); 3 wins over 4
  130  interrupted
"""


class UsageError(Exception):
    """A problem with the command line or its inputs: reported in one line, exit code 2."""


class OneLineParser(argparse.ArgumentParser):
    """Argument parser whose errors become :class:`UsageError` (one line, no usage dump)."""

    def error(self, message: str) -> None:
        """Raise instead of printing the usage and exiting."""
        raise UsageError(message)


#: ``--method`` when none is given: for a robot, and with ``--object``.
DEFAULT_METHOD = {'robot': 'diffnea', 'object': 'ccn'}


class FitParser(OneLineParser):
    """``diffsim-fit``'s parser: ``--method`` defaults by mode (robot or ``--object``)."""

    def parse_known_args(self, args=None, namespace=None):
        """Parse, then fill in the mode's default method (:data:`DEFAULT_METHOD`)."""
        parsed, extras = super().parse_known_args(args, namespace)
        if getattr(parsed, 'method', None) is None and hasattr(parsed, 'object'):
            parsed.method = DEFAULT_METHOD['robot' if parsed.object is None else 'object']
        return parsed, extras


@contextlib.contextmanager
def reported(what: str, *errors: Type[BaseException]) -> Iterator[None]:
    """
    Turn the listed exceptions raised inside the block into a :class:`UsageError`.

    The one place where errors of the libraries that read the user's inputs (files, YAML,
    estimator configs) become the one-line message; anything not listed stays a bug.

    :param what: prefix of the message (e.g. ``"cannot read --config 'x.yaml'"``), or ``''``.
    :param errors: exception types that mean bad input here.
    :return: a context manager.
    :raises UsageError: ``what: <the exception in one line>``.
    """
    try:
        yield
    except errors as exc:
        text = one_line(exc).strip('"') or type(exc).__name__
        raise UsageError(f'{what}: {text}' if what else text) from None


def one_line(exc: BaseException) -> str:
    """
    Return an exception's message on one line.

    :param exc: the exception.
    :return: its text with runs of whitespace as single spaces.
    """
    return ' '.join(str(exc).split())


def path_type(text: str) -> Path:
    """
    Parse a path argument (argparse type).

    :param text: the argument.
    :return: the path.
    :raises argparse.ArgumentTypeError: an empty or blank argument.
    """
    if not text.strip():
        raise argparse.ArgumentTypeError('empty path')
    return Path(text)


def number_type(kind: type, low: float, high: float = math.inf):
    """
    Return an argparse type: a finite ``kind`` in ``[low, high]``.

    :param kind: ``int`` or ``float``.
    :param low: smallest value accepted.
    :param high: largest value accepted.
    :return: the parse function.
    """
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f'not a{"n integer" if kind is int else " number"}'
                                             f': {text!r}') from None
        finite = kind is int or math.isfinite(value)   # int: no overflow to float
        if not (finite and low <= value <= high):
            bounds = [] if kind is int else ['finite']
            bounds += [f'>= {low}'] if math.isfinite(low) else []
            bounds += [f'<= {high}'] if math.isfinite(high) else []
            raise argparse.ArgumentTypeError(f'must be {" and ".join(bounds)}, got {text!r}')
        return value
    parse.__name__ = kind.__name__
    return parse


def _delay(text: str) -> Any:
    try:
        return parse_delay(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _horizons(text: str) -> Tuple[float, ...]:
    values = []
    for part in (p.strip() for p in text.split(',')):
        try:
            value = float(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f'not a number: {part!r}') from None
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f'horizons must be finite and > 0 s, got '
                                             f'{part!r}')
        values.append(value)
    return tuple(sorted(set(values)))


def build_parser() -> argparse.ArgumentParser:
    """
    Return the command-line parser of ``diffsim-fit``.

    :return: the parser.
    """
    parser = FitParser(
        prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
        description='Identify robot dynamics from a rosbag2 recording or a CSV/NPZ table and '
        'write params.yaml, model.urdf, metrics.json, report.png and report_validation.pdf; '
        'with --object, learn a tossed object (shape, friction, inertia) from its tosses.')
    parser.add_argument('data', type=path_type,
                        help='rosbag2 directory, .mcap or .db3 file, .csv / .npz table, or a '
                        'shared data set folder (see --format)')
    parser.add_argument('--format', default='auto', choices=('auto',) + tuple(FORMATS),
                        help='data format (default: %(default)s, detected from the path)')
    parser.add_argument('--robot', default=None,
                        help=f'robot name ({", ".join(robots.names())}) or a URDF file '
                        "(default for the data set formats: the data set's robot)")
    parser.add_argument('--object', default=None, metavar='cube|elbow|URDF',
                        help='learn a tossed object instead of a robot: the ContactNets cube, '
                        'the DAIR elbow, or a one-link URDF with box or .obj collision '
                        'geometry (the nominal object the learner starts 0.5-1.5x from)')
    parser.add_argument('--friction', type=number_type(float, 1e-6), default=None,
                        help='--object: nominal friction coefficient (default: cube 0.18; a '
                        'URDF its <gazebo><mu1>, else 0.3)')
    parser.add_argument('--smooth-window', type=number_type(int, 1), default=None,
                        help='--object: odd samples of the local quadratic fits that the '
                        "training tosses' poses are smoothed with, velocities then their "
                        'backward differences, for every method (1: as recorded; default: '
                        "the object's own, elbow 7, else 1)")
    parser.add_argument('--restarts', type=number_type(int, 1), default=1,
                        help='--object: fit from this many random starts (seeds SEED, '
                        'SEED + 1000, ...) and keep the one the early-stopping tosses rank '
                        'first (--choose-by); costs that many fits (default: %(default)s)')
    parser.add_argument('--choose-by', choices=RESTART_CRITERIA, default='rollout',
                        help='--object with --restarts: rank the starts by their '
                        '16-sample rollouts from every sample of the early-stopping tosses '
                        '(position over the object size + orientation + joint angles), or by '
                        "the method's loss there (default: %(default)s; on the elbow the loss "
                        'ranked starts no better than chance)')
    parser.add_argument('--rest', type=number_type(float, 1e-6), default=0.2,
                        help='--object: seconds slower than 0.02 m/s that end a toss in a pose '
                        'stream without toss ids (default: %(default)s)')
    parser.add_argument('--limit', type=number_type(int, 1), default=None,
                        help='--object: read only the first N tosses')
    parser.add_argument('--out', type=path_type, required=True,
                        help='output directory (created; checked for writing before the fit)')
    parser.add_argument('--method', default=None,
                        choices=tuple(estimators.names()) + tuple(
                            name for name in OBJECT_METHODS if name not in estimators.names()),
                        help='estimator (robots: ' + ', '.join(estimators.names()) + '; '
                        'default diffnea, an inverse-dynamics fit refined with the multi-step '
                        'rollout loss; --object: ' + ', '.join(OBJECT_METHODS) + ', default '
                        'ccn)')
    parser.add_argument('--actuator', choices=ACTUATOR_CHOICES, default=None,
                        help='friction model: viscous, coulomb (viscous + tanh Coulomb, the '
                        "URDF's two fields), or an extra module (default: coulomb; Panda data "
                        "set with diffnea: sigmoid, Gaz et al.'s offset sigmoids)")
    parser.add_argument('--topic', help='JointState topic of a bag (default: /joint_states '
                        'or the only one); --object: the PoseStamped / TransformStamped topic')
    parser.add_argument('--command-topic', help='Float64MultiArray command topic of a bag '
                        '(default for voltage-commanded robots: /<controller>/commands)')
    parser.add_argument('--runs', default=None,
                        help='runs to use: comma-separated run names, kinds (chirp, swingup, '
                        'sine, ...) or shell patterns (default: all; the Qube data set: '
                        "'*250Hz*')")
    parser.add_argument('--validation', default=None,
                        help='validation runs: comma-separated run names, kinds or patterns, '
                        'a fraction in [0, 1) of the runs, or last:F (the trailing fraction F '
                        'of every run) (default 0.2, a single run gives 2 s blocks in turn; '
                        'data sets: swingup, or last:0.3 for single recordings)')
    parser.add_argument('--early-stopping', choices=EARLY_STOPPING, default=None,
                        help='data that stop the optimiser: the validation runs (which then '
                        'take part in choosing the model), the last training run (not fitted; '
                        'the validation runs stay unseen) or none (default: validation; '
                        'data sets: train, as benchmarks/identification.py)')
    parser.add_argument('--input-delay', type=_delay, default=None,
                        help='delay of the commands u: whole samples of the recording (2) or '
                        'a time (0.008s, 8ms), applied before fitting and validating '
                        '(default 0; the Qube data set: 2)')
    parser.add_argument('--offset', action='append', default=[], metavar='JOINT=VALUE',
                        help="add VALUE (rad, or m) to a joint's recorded positions so that "
                        "the data's zero is the URDF's (repeatable)")
    parser.add_argument('--unwrap', action='append', default=[], metavar='JOINT',
                        help='make a joint angle that the recording wrapped to [-pi, pi) '
                        'continuous (repeatable)')
    parser.add_argument('--rate', type=number_type(float, 1e-3), default=None,
                        help='resample every run at this rate, Hz (default: runs keep their '
                        'rate; non-uniform runs are resampled at their median rate and runs '
                        'of different rates at the lowest one; Panda data set 200, DFKI 250)')
    parser.add_argument('--horizons', type=_horizons, default=ROLLOUT_HORIZONS,
                        help='open-loop rollout horizons of the validation, s, comma-separated '
                        '(default: 0.5,1)')
    parser.add_argument('--loss', choices=LOSS_CHOICES, default=None,
                        help='loss of the fit: inverse (torques), forward (accelerations) or '
                        'multistep (rollouts of --horizon from measured states, after an '
                        'inverse warm start) (default: the estimator configuration)')
    parser.add_argument('--horizon', type=number_type(float, 1e-6), default=None,
                        help='window of the multistep loss, s (default: the estimator '
                        'configuration, 10 samples for diffnea)')
    parser.add_argument('--allow-worse', action='store_true',
                        help='exit 0 even when the held-out rollouts are worse than those of '
                        'the nominal model (the warning stays)')
    parser.add_argument('--config', type=path_type, help='YAML mapping of estimator settings')
    parser.add_argument('--max-iter', '--steps', type=number_type(int, 1),
                        help='bound on the optimiser iterations (>= 1; --object: optimiser '
                        'steps, default 400)')
    parser.add_argument('--seed', type=number_type(int, 0, 2 ** 63 - 1),
                        help="seed of the estimator's local generator (>= 0)")
    parser.add_argument('--device', default='cpu', choices=('cpu', 'cuda'),
                        help='torch device (default: %(default)s)')
    parser.add_argument('--cutoff', type=number_type(float, 0.0), default=None,
                        help='low-pass cutoff of the derivative filter, Hz; 0: no filter, '
                        'accelerations by central differences of measured velocities '
                        '(default: 20; Panda data set 5, DFKI 10)')
    parser.add_argument('--limit-margin', type=number_type(float, -math.inf), default=0.05,
                        help='leave out samples this close to a position limit of the model '
                        '(rad or m; negative keeps all; default: %(default)s)')
    parser.add_argument('--derivatives', choices=('auto', 'filter'), default=None,
                        help='auto: estimate what is missing (qdd from measured qd when '
                        'there is one); filter: always re-estimate qd and qdd from q '
                        '(default: auto; data sets: filter)')
    parser.add_argument('--max-condition', type=number_type(float, 1.0), default=MAX_CONDITION,
                        help='largest condition number of the base regressor of the training '
                        'data that counts as exciting the dynamics; above it: warning and '
                        'exit status 3 (default: %(default)g)')
    parser.add_argument('--quiet', action='store_true', help='print errors and warnings only')
    return parser
