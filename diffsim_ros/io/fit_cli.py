"""
``diffsim-fit``: identify a robot's dynamics offline from a recording.

::

    diffsim-fit DATA [--robot NAME|URDF] [--format auto|table|bag|quanser|panda-gaz|dfki]
                [--method nea|diffnea|ffnn] [--loss inverse|forward|multistep --horizon S]
                [--actuator viscous|stribeck|nn-friction|nn-residual] --out DIR

``DATA`` is a rosbag2 recording (directory, ``.mcap`` or ``.db3``) whose
``sensor_msgs/JointState`` messages carry position, velocity and effort (columns matched to
the robot by joint name; ``--topic`` chooses the topic, ``--command-topic`` a
``std_msgs/Float64MultiArray`` command topic), a CSV / NPZ table in the column
specification of :mod:`diffsim_ros.io.tables` (``t``, ``q:<joint>``, optional
``qd:``/``qdd:``/``tau:``/``u:`` columns and a ``run`` column), or a published real-robot
data set read in place (:mod:`diffsim_ros.io.formats`: the Pyrado Quanser rollouts, Gaz et
al.'s Panda excitation, the DFKI pendulums), whose robot, split and conventions
(``config/README.md``) become the defaults of ``--robot``, ``--runs``, ``--validation``,
``--input-delay``, ``--rate``, ``--derivatives``, ``--cutoff`` and ``--early-stopping``.
``--format auto`` detects the format from the path.  Data conventions
(:mod:`diffsim_ros.io.conventions`): ``--input-delay`` delays the commands, ``--offset``
shifts joint zeros, ``--unwrap`` makes wrapped angles continuous; ``--runs`` picks runs by
name, kind or pattern (:mod:`diffsim_ros.io.selection`).

Pipeline:

1. the robot: a catalog name (:func:`diffsim_ros.robots.names`; nominal model = URDF plus the
   catalog's rotor armature) or a URDF file (every joint torque-commanded);
2. the data, joints in model order; when ``qd`` or ``qdd`` is missing (bags carry no
   accelerations) they are estimated with a zero-phase Butterworth filter (``--cutoff``):
   ``qdd`` from the measured ``qd`` when the data have velocities
   (:func:`diffsim_ros.sysid.filters.accelerations_from_velocity`), else ``qd`` and ``qdd``
   from ``q`` (:func:`~diffsim_ros.sysid.filters.estimate_derivatives`, and always with
   ``--derivatives filter``); torques and commands go through the same filter (they are
   paired with the filtered accelerations), and ``1 / cutoff`` s of filter edge are cropped
   from each end; runs whose sampling is not uniform are resampled at their median rate;
3. the split: ``--validation`` names runs (comma-separated names, kinds or patterns), gives
   a fraction of the runs, or ``last:F``, the trailing fraction of every run;
   a single run is cut into 2 s blocks and that fraction of them, spread over the run, is
   held out (:func:`diffsim_ros.sysid.preprocess.split_blocks`; 20 % by default), so that a
   recording of a swing-up and then a balance validates on both (a recording too short for
   one held-out block holds out its end); then the stretches within
   ``--limit-margin`` of a position limit of the model are left out (a limit stop pushes
   with a force the model lacks);
4. the fit (:func:`diffsim_ros.sysid.estimators.fit`; ``diffnea`` by default runs
   :func:`diffsim_ros.sysid.diffnea.simulation_schedule`: an inverse-dynamics fit, then a
   multi-step stage on 0.1 s RK4 rollouts from measured states, judged by held-out
   rollouts, because the inverse fit alone simulated the real Quanser robots worse than
   their catalogue models) with the configuration of
   ``--config FILE.yaml`` (estimator keys; unknown keys are an error) and the options below;
   ``--loss`` and ``--horizon`` choose the loss (:mod:`diffsim_ros.io.loss_options`);
   ``--early-stopping`` the data that stop the optimiser (by default the validation runs,
   which then take part in choosing the model; ``train``, the default of the data set
   formats: the last training run, so that the validation runs stay unseen).
   Voltage-commanded robots (catalog ``command_unit`` ``'V'``: Qube, cart-pole) are fitted
   on their commands ``u`` through the catalogued DC motor model; other robots on the measured
   joint efforts ``tau`` (or on ``u`` as joint torques when the data has no efforts).

``--actuator`` selects the friction model: ``viscous`` (viscous damping only; the Coulomb
level stays at its nominal value), ``stribeck``, ``nn-friction`` (passive network) or
``nn-residual`` (unconstrained network), the last three as an extra learned module of
``diffnea`` next to the URDF's damping and Coulomb fields.  Without it each estimator uses its
default (viscous and Coulomb friction).  ``--max-iter`` bounds the Adam steps (``diffnea``:
and L-BFGS steps to a tenth of it; ``ffnn``: its iterations; ``nea`` is closed-form).

Outputs in ``--out``:

* ``params.yaml``: per named parameter ``value``, ``unit``, ``nominal`` and ``std`` where the
  estimator gives one (NEA base parameters, with their ``expression``); method, robot, data
  path, joint names, command joints and armature; and under ``model`` the whole model
  document (:mod:`diffsim_ros.io.fits`: the friction module too, sigmoid and Stribeck
  included), which ``diffsim-sim-eval --model``, the demo and the nodes' ``model_file``
  parameter load back (catalogue robots, physical models);
* ``model.urdf``: the nominal URDF with the identified inertials, damping and Coulomb friction
  (:func:`diffsim_ros.io.model_to_urdf`); when least squares leaves bodies physically
  inconsistent, the consistent model closest to its base parameters, and negative friction is
  clipped to zero (``metrics.json`` ``urdf`` says which, and scores the written
  model too); Stribeck viscous / Coulomb levels are added to the damping / friction fields;
  for ``ffnn`` the nominal URDF;
* ``metrics.json``: inverse-dynamics torque and acceleration RMSE / NMSE per joint on the
  training and validation runs, rollout NMSE over windows of each ``--horizons`` length
  (default 0.5 s and 1 s) of the validation runs, the same for the nominal model,
  ``better_than_nominal`` per metric (:mod:`diffsim_ros.io.verdict`), wall time,
  iterations, preprocessing, data format and the defaults it set, versions;
* ``report.png``: measured vs predicted positions per joint on a validation run and the
  parameter table;
* ``modules.pt`` (neural friction or black-box models only): their ``state_dict``.

Before the fit, the excitation of the training data is measured
(:func:`diffsim_ros.sysid.excitation.excitation`: condition number of the column-normalised
base regressor); above ``--max-condition`` the data cannot determine every base parameter (a
robot at rest, a joint at constant velocity): a warning goes to stderr, ``metrics.json`` gets
``excitation`` and ``warning``, the fit still runs and writes its outputs, and the exit status
is 3.

When the fit's held-out rollouts are worse than the nominal model's at some horizon, a
warning goes to stderr and the exit status is 4 (unless ``--allow-worse``; 3 wins when both
apply).

Exit codes: 0 success; 2 for problems with the inputs or the output folder (one line on
stderr, no traceback, found before the fit): missing / empty / corrupt data, arrays of the
wrong shape or with NaN, unknown topic or joints, unknown robot, invalid URDF or configuration,
unknown method or actuator, out-of-range option values, an ``--out`` that cannot be written;
3 when the outputs are written but the data do not excite the dynamics; 4 when they are
written but the fit simulates the validation runs worse than the nominal model; 130 when
interrupted.
Anything else is a bug and raises with its traceback.
"""

import argparse
import contextlib
import dataclasses
import importlib.metadata
import inspect
import math
from pathlib import Path
import platform
import sys
import tempfile
import threading
import time
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, TextIO, Tuple, Type
import warnings

import numpy as np
import torch
import yaml

from .bags import bag_topics, BagError, COMMAND, STORAGE_SUFFIXES
from .conventions import apply_conventions, parse_delay
from .datasets import DatasetError
from .fits import write_model_document
from .formats import DataFormat, FormatError, FORMATS, in_model_order, LoadOptions, resolve
from .loss_options import apply_loss, horizon_steps, LOSS_CHOICES
from .report import (evaluate, export_urdf, parameter_table, physical_predictor, predictors,
                     ROLLOUT_HORIZONS, score, stribeck_levels, write_metrics_json,
                     write_params_yaml, write_report_png)
from .selection import (EARLY_STOPPING, early_stopping_split, select_runs, SelectionError,
                        split as split_runs_or_blocks)
from .tables import TableError
from .verdict import better_than_nominal, verdict
from .. import __version__, robots
from ..core.errors import URDFError
from ..core.model import PRISMATIC, RobotModel
from ..core.urdf import load_urdf
from ..robots.message import model_message, ModelMessageError
from ..sysid import estimators
from ..sysid.dataset import Trajectory
from ..sysid.diffnea import DiffNEAConfig, simulation_schedule
from ..sysid.excitation import Excitation, excitation
from ..sysid.filters import accelerations_from_velocity, estimate_derivatives
from ..sysid.losses import command_joints_for, DT_TOLERANCE, resolve_source
from ..sysid.nea import RegressorColumns
from ..sysid.preprocess import limit_free_runs, resample
from ..sysid.result import IdentificationResult

PROG = 'diffsim-fit'
#: Friction choices of ``--actuator``.
ACTUATOR_CHOICES = ('viscous', 'stribeck', 'sigmoid', 'nn-friction', 'nn-residual')
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
                   'derivatives': 'auto', 'cutoff': 20.0, 'early_stopping': 'validation'}
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
  dfki      dfki_double_pendulum (design A.0; validate on the swing-ups) or
            dfki_simple_pendulum folder or file: --rate 250 --cutoff 10
  missing qd/qdd are estimated with a zero-phase Butterworth filter (--cutoff)

examples:
  diffsim-fit shared/data/quanser_qube_pyrado --out fits/qube
  diffsim-fit shared/data/panda_gaz2019_excitation --out fits/panda
  diffsim-fit recording.mcap --robot panda --validation 0.3 --out fits/mine

outputs in --out: params.yaml, model.urdf, metrics.json, report.png
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


class _Parser(argparse.ArgumentParser):
    """Argument parser whose errors become :class:`UsageError` (one line, no usage dump)."""

    def error(self, message: str) -> None:
        """Raise instead of printing the usage and exiting."""
        raise UsageError(message)


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
        text = _one_line(exc).strip('"') or type(exc).__name__
        raise UsageError(f'{what}: {text}' if what else text) from None


def _path(text: str) -> Path:
    if not text.strip():
        raise argparse.ArgumentTypeError('empty path')
    return Path(text)


def _number(kind: type, low: float, high: float = math.inf):
    """Return an argparse type: a finite ``kind`` in ``[low, high]``."""
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
    parser = _Parser(
        prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
        description='Identify robot dynamics from a rosbag2 recording or a CSV/NPZ table and '
        'write params.yaml, model.urdf, metrics.json and report.png.')
    parser.add_argument('data', type=_path,
                        help='rosbag2 directory, .mcap or .db3 file, .csv / .npz table, or a '
                        'shared data set folder (see --format)')
    parser.add_argument('--format', default='auto', choices=('auto',) + tuple(FORMATS),
                        help='data format (default: %(default)s, detected from the path)')
    parser.add_argument('--robot', default=None,
                        help=f'robot name ({", ".join(robots.names())}) or a URDF file '
                        "(default for the data set formats: the data set's robot)")
    parser.add_argument('--out', type=_path, required=True,
                        help='output directory (created; checked for writing before the fit)')
    parser.add_argument('--method', default='diffnea', choices=estimators.names(),
                        help='estimator (default: %(default)s, an inverse-dynamics fit '
                             'refined with the multi-step rollout loss)')
    parser.add_argument('--actuator', choices=ACTUATOR_CHOICES, default=None,
                        help="friction model (default: the estimator's viscous + Coulomb)")
    parser.add_argument('--topic', help='JointState topic of a bag (default: /joint_states '
                        'or the only one)')
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
    parser.add_argument('--rate', type=_number(float, 1e-3), default=None,
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
    parser.add_argument('--horizon', type=_number(float, 1e-6), default=None,
                        help='window of the multistep loss, s (default: the estimator '
                        'configuration, 10 samples for diffnea)')
    parser.add_argument('--allow-worse', action='store_true',
                        help='exit 0 even when the held-out rollouts are worse than those of '
                        'the nominal model (the warning stays)')
    parser.add_argument('--config', type=_path, help='YAML mapping of estimator settings')
    parser.add_argument('--max-iter', type=_number(int, 1),
                        help='bound on the optimiser iterations (>= 1)')
    parser.add_argument('--seed', type=_number(int, 0, 2 ** 63 - 1),
                        help="seed of the estimator's local generator (>= 0)")
    parser.add_argument('--device', default='cpu', choices=('cpu', 'cuda'),
                        help='torch device (default: %(default)s)')
    parser.add_argument('--cutoff', type=_number(float, 0.0), default=None,
                        help='low-pass cutoff of the derivative filter, Hz; 0: no filter, '
                        'accelerations by central differences of measured velocities '
                        '(default: 20; Panda data set 5, DFKI 10)')
    parser.add_argument('--limit-margin', type=_number(float, -math.inf), default=0.05,
                        help='leave out samples this close to a position limit of the model '
                        '(rad or m; negative keeps all; default: %(default)s)')
    parser.add_argument('--derivatives', choices=('auto', 'filter'), default=None,
                        help='auto: estimate what is missing (qdd from measured qd when '
                        'there is one); filter: always re-estimate qd and qdd from q '
                        '(default: auto; data sets: filter)')
    parser.add_argument('--max-condition', type=_number(float, 1.0), default=MAX_CONDITION,
                        help='largest condition number of the base regressor of the training '
                        'data that counts as exciting the dynamics; above it: warning and '
                        'exit status 3 (default: %(default)g)')
    parser.add_argument('--quiet', action='store_true', help='print errors and warnings only')
    return parser


# --------------------------------------------------------------------------------------
# Progress on stderr
# --------------------------------------------------------------------------------------
class Progress:
    """
    Progress messages on a stream (stderr).

    Stage summaries are whole lines prefixed by the elapsed time.  During the fit a terminal
    gets one line rewritten in place (elapsed time, and iteration / losses when the estimator
    reports them); any other stream (CI logs) gets a plain line at most every
    ``log_every_s`` seconds, so no control characters reach log files.

    :param stream: where to write.
    :param quiet: write nothing.
    :param tty: force terminal behaviour (default: ``stream.isatty()``).
    :param log_every_s: interval of the plain progress lines, s.
    """

    def __init__(self, stream: TextIO, quiet: bool = False, tty: Optional[bool] = None,
                 log_every_s: float = 30.0) -> None:
        self.stream = stream
        self.quiet = quiet
        isatty = getattr(stream, 'isatty', None)
        self.tty = bool(isatty and isatty()) if tty is None else tty
        self.log_every_s = log_every_s
        self.start = time.perf_counter()
        self._label = ''
        self._status = ''
        self._live_start = 0.0
        self._last_log = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._width = 0

    def _elapsed(self) -> str:
        return f'[{time.perf_counter() - self.start:7.1f} s]'

    def _clear(self) -> None:
        if self.tty and self._width:
            self.stream.write('\r' + ' ' * self._width + '\r')
            self._width = 0

    def stage(self, message: str) -> None:
        """
        Print a stage summary line.

        :param message: the line.
        """
        if self.quiet:
            return
        with self._lock:
            self._clear()
            self.stream.write(f'{PROG}: {self._elapsed()} {message}\n')
            self.stream.flush()

    def warn(self, message: str) -> None:
        """
        Print a warning line (even when quiet).

        :param message: the warning.
        """
        with self._lock:
            self._clear()
            self.stream.write(f'{PROG}: warning: {message}\n')
            self.stream.flush()

    def update(self, *args: Any, **kwargs: Any) -> None:
        """
        Record the optimiser's state (estimator callback).

        Accepts ``(iteration, loss[, validation_loss])``, keywords of those names (``val_loss``
        and ``validation`` too) or one mapping of them.

        :param args: positional values or one mapping.
        :param kwargs: keyword values.
        """
        if len(args) == 1 and isinstance(args[0], Mapping):
            kwargs = {**args[0], **kwargs}
            args = ()
        names = ('iteration', 'loss', 'validation_loss')
        values = dict(zip(names, args))
        values.update(kwargs)
        validation = values.get('validation_loss', values.get('val_loss',
                                                              values.get('validation')))
        parts = []
        if values.get('iteration') is not None:
            parts.append(f'iteration {values["iteration"]}')
        if values.get('loss') is not None:
            parts.append(f'loss {float(values["loss"]):.4g}')
        if validation is not None:
            parts.append(f'val loss {float(validation):.4g}')
        with self._lock:
            self._status = ', '.join(parts)
        if not self.tty and not self.quiet:
            now = time.perf_counter()
            if now - self._last_log >= self.log_every_s:
                self._last_log = now
                self.stage(f'{self._label}: {self._status}')

    def _render(self) -> None:
        with self._lock:
            seconds = time.perf_counter() - self._live_start
            line = f'{PROG}: {self._label} {seconds:6.1f} s'
            if self._status:
                line += f'  {self._status}'
            line = line[:119]
            pad = max(0, self._width - len(line))
            self.stream.write('\r' + line + ' ' * pad)
            self.stream.flush()
            self._width = len(line)

    def _heartbeat(self) -> None:
        while not self._stop.wait(0.5 if self.tty else self.log_every_s):
            if self.tty:
                self._render()
            elif time.perf_counter() - self._last_log >= self.log_every_s:
                self._last_log = time.perf_counter()
                status = f': {self._status}' if self._status else ''
                self.stage(f'{self._label}: still running '
                           f'({time.perf_counter() - self._live_start:.0f} s){status}')

    def begin(self, label: str) -> None:
        """
        Start the live indicator of a long step.

        :param label: what runs (e.g. ``'fitting diffnea'``).
        """
        self._label, self._status = label, ''
        self._live_start = self._last_log = time.perf_counter()
        if self.quiet:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._heartbeat, daemon=True)
        self._thread.start()

    def end(self) -> None:
        """Stop the live indicator and clear its line."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        with self._lock:
            self._clear()
            self.stream.flush()


# --------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------
def _is_urdf_path(spec: str) -> bool:
    return spec.lower().endswith(('.urdf', '.xml')) or '/' in spec or Path(spec).is_file()


def load_robot(spec: str) -> Tuple[RobotModel, Optional[robots.RobotInfo], str]:
    """
    Return the nominal model of ``--robot`` and its catalog entry.

    :param spec: catalog name or URDF file.
    :return: ``(float64 model on the CPU, RobotInfo or None, label)``; catalog models carry
        the catalog's rotor armature.
    :raises UsageError: unknown name, missing or invalid URDF.
    """
    if spec in robots.names():
        info = robots.get(spec)
        return robots.interface(spec).nominal_model(), info, spec
    if not _is_urdf_path(spec):
        raise UsageError(f'unknown robot {spec!r}; valid names: {", ".join(robots.names())} '
                         '(or give the path of a URDF file)')
    path = Path(spec)
    _check_file(path, 'URDF file')
    with reported(f'cannot read URDF file {spec!r}', OSError, UnicodeDecodeError):
        text = path.read_text(encoding='utf-8')
    if not text.lstrip().startswith('<'):
        raise UsageError(f'URDF file {spec!r} does not hold XML (it starts with '
                         f'{text.strip()[:20]!r})')
    with reported(f'invalid URDF {spec!r}', URDFError, ValueError):
        model = load_urdf(xml=text, dtype=torch.float64)
    return model, None, str(path.resolve())


def _check_file(path: Path, what: str) -> None:
    """Raise unless ``path`` is a regular, non-empty file (a FIFO would block the read)."""
    if not path.exists():
        raise UsageError(f'{what} {str(path)!r} does not exist')
    if not path.is_file():
        raise UsageError(f'{what} {str(path)!r} is not a regular file')
    if path.stat().st_size == 0:
        raise UsageError(f'{what} {str(path)!r} is empty (0 bytes)')


def check_out(out: Path) -> None:
    """
    Create the output folder and make sure a file can be written there.

    Run before anything is loaded or fitted, so that a typo costs no fit.

    :param out: ``--out``.
    :raises UsageError: it cannot be created or written.
    """
    if out.exists() and not out.is_dir():
        raise UsageError(f'--out {str(out)!r} exists and is not a directory')
    with reported(f'--out {str(out)!r} cannot be created', OSError):
        out.mkdir(parents=True, exist_ok=True)
    with reported(f'--out {str(out)!r} is not writable', OSError):
        with tempfile.NamedTemporaryFile(dir=out, prefix='.diffsim-fit-write-test-'):
            pass


def _one_line(exc: BaseException) -> str:
    return ' '.join(str(exc).split())


def _needs_commands(info: Optional[robots.RobotInfo]) -> bool:
    return info is not None and info.command_unit == 'V'


def _default_command_topic(data: Path, info: Optional[robots.RobotInfo]) -> Optional[str]:
    """Return the command topic to read for a voltage robot's bag, when one is obvious."""
    if not _needs_commands(info) or not (data.is_dir() or data.suffix in STORAGE_SUFFIXES):
        return None
    try:
        table = bag_topics(data)
    except BagError:
        return None    # read_bag reports the problem with its own message
    preferred = f'/{info.controller_name}/commands'
    candidates = sorted(topic for topic, (kind, _) in table.items() if kind == COMMAND)
    if preferred in candidates:
        return preferred
    return candidates[0] if len(candidates) == 1 else None


def data_format(args: argparse.Namespace) -> DataFormat:
    """
    Return the format of ``args.data`` (``--format``, or detected).

    :param args: parsed arguments (``data``, ``format``).
    :return: the format.
    :raises UsageError: missing data, an unknown format or one that does not fit the path.
    """
    data: Path = args.data
    if not data.exists():
        raise UsageError(f'{str(data)!r} does not exist')
    with reported('', FormatError):
        return resolve(args.format, data)


def load_data(args: argparse.Namespace, fmt: DataFormat, model: RobotModel,
              info: Optional[robots.RobotInfo], progress: Progress
              ) -> Tuple[List[Trajectory], Dict[str, Any]]:
    """
    Read the recording with the robot's joints in model order.

    :param args: parsed arguments (``data``, ``topic``, ``command_topic``).
    :param fmt: its format (:func:`data_format`).
    :param model: the robot.
    :param info: its catalog entry or ``None``.
    :param progress: for warnings.
    :return: ``(runs, the data set's option defaults)``.
    :raises UsageError: unreadable data, unknown topics, missing joints or signals.
    """
    data: Path = args.data
    is_file_format = fmt.name in ('table', 'bag')
    if data.exists() and not data.is_dir():
        _check_file(data, 'data file')
    if fmt.name != 'bag' and (args.topic or args.command_topic):
        progress.warn(f'--topic / --command-topic apply to bags only; ignored for {fmt.name} '
                      'data')
    command_topic = (args.command_topic or _default_command_topic(data, info)) \
        if fmt.name == 'bag' else None
    options = LoadOptions(joint_names=model.joint_names, topic=args.topic,
                          command_topic=command_topic,
                          command_joints=info.command_joints if info is not None else None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        with reported('', BagError, TableError, DatasetError, FormatError), \
                reported(f'cannot read {str(data)!r}', OSError, UnicodeDecodeError):
            recording = fmt.load(data, options)
            runs = recording.runs if is_file_format else \
                in_model_order(recording.runs, model.joint_names)
    for warning in caught:
        progress.warn(_one_line(warning.message))
    if recording.note:
        progress.stage(f'{fmt.name}: {recording.note}')
    if not runs:
        raise UsageError(f'{str(data)!r} holds no samples')
    if _needs_commands(info) and any(run.u is None for run in runs):
        raise UsageError(f'robot {info.name!r} is voltage-commanded but the data carry no '
                         'commands u; pass --command-topic (bags) or u: columns (tables)')
    if any(run.tau is None and run.u is None for run in runs):
        raise UsageError(f'{str(data)!r} carries neither joint efforts (JointState.effort / '
                         'tau: columns) nor commands (--command-topic / u: columns)')
    return runs, dict(recording.defaults)


def apply_defaults(args: argparse.Namespace, defaults: Mapping[str, Any]) -> Dict[str, Any]:
    """
    Fill the options the user left unset from the data set's defaults, then the built-ins.

    :param args: parsed arguments (changed in place).
    :param defaults: the data set's option defaults (:class:`~diffsim_ros.io.formats.
        Recording`).
    :return: the options the data set set, ``{dest: value}`` (for the metrics).
    """
    applied = {}
    for dest, builtin in OPTION_DEFAULTS.items():
        if getattr(args, dest) is not None:
            continue
        if dest in defaults:
            value = defaults[dest]
            applied[dest] = value
            if dest == 'input_delay':
                value = parse_delay(str(value))
            setattr(args, dest, value)
        else:
            setattr(args, dest, builtin)
    return applied


def conventions(runs: Sequence[Trajectory], args: argparse.Namespace, model: RobotModel
                ) -> Tuple[List[Trajectory], Dict[str, Any]]:
    """
    Pick ``--runs`` and apply ``--input-delay``, ``--offset`` and ``--unwrap``.

    :param runs: the runs, joints in model order.
    :param args: parsed arguments, defaults applied.
    :param model: the robot (joint names).
    :return: ``(runs, description for metrics.json)``.
    :raises UsageError: a selector that picks nothing, unknown joints, a delay without
        commands.
    """
    with reported('', SelectionError, ValueError):
        if args.runs is not None:
            runs = select_runs(runs, args.runs)
        runs, info = apply_conventions(runs, model.joint_names, args.input_delay, args.offset,
                                       args.unwrap)
    return runs, {'runs': args.runs, **info}


def _sample_rate(run: Trajectory) -> float:
    return 1.0 / float(run.t.diff().median())


def _is_uniform(run: Trajectory) -> bool:
    steps = run.t.diff()
    dt = float(steps.median())
    return float((steps - dt).abs().max()) <= DT_TOLERANCE * dt


def preprocess(runs: Sequence[Trajectory], args: argparse.Namespace,
               progress: Progress) -> Tuple[List[Trajectory], Dict[str, Any]]:
    """
    Estimate missing derivatives, crop filter edges and resample non-uniform runs.

    :param runs: the loaded runs.
    :param args: parsed arguments (``cutoff``, ``derivatives``).
    :param progress: for warnings.
    :return: ``(runs, description for metrics.json)``.
    :raises UsageError: bad cutoff, or no run long enough.
    """
    info: Dict[str, Any] = {'derivatives': 'measured', 'cutoff_hz': None, 'edge_crop_s': 0.0,
                            'resampled_hz': None, 'dropped_runs': []}
    out = []
    short = [run for run in runs if len(run) < MIN_SAMPLES]
    if len(short) == len(runs):
        raise UsageError(f'no run has {MIN_SAMPLES} samples or more (longest: '
                         f'{max(len(run) for run in runs)})')
    for run in short:
        info['dropped_runs'].append(run.run)
        progress.warn(f'run {run.run!r} has only {len(run)} samples; skipped')
    runs = [run for run in runs if len(run) >= MIN_SAMPLES]
    for run in runs:
        rate = _sample_rate(run)
        if not RATE_RANGE_HZ[0] <= rate <= RATE_RANGE_HZ[1]:
            raise UsageError(f'run {run.run!r} is sampled at {rate:.3g} Hz: times must be in '
                             f'seconds (rates {RATE_RANGE_HZ[0]:g} to {RATE_RANGE_HZ[1]:g} Hz)')
    common = args.rate or _common_rate(runs, progress)
    if common is not None:
        with reported(f'--rate {common:g}', ValueError):
            runs = [resample(run, common) for run in runs]
        info['resampled_hz'] = common
    for run in runs:
        rate = _sample_rate(run)
        if args.derivatives == 'filter' or run.qd is None or run.qdd is None:
            from_velocity = args.derivatives == 'auto' and run.qd is not None
            if args.cutoff == 0.0 and not from_velocity:
                raise UsageError('--cutoff 0 needs measured velocities (and --derivatives '
                                 'auto): positions are always low-passed')
            # commands through the same filter as the accelerations they explain
            with reported(f'--cutoff {args.cutoff:g} Hz on samples at {rate:.4g} Hz',
                          ValueError, np.linalg.LinAlgError):
                if from_velocity:
                    run = accelerations_from_velocity(run, args.cutoff or None,
                                                      filter_inputs=True)
                else:
                    run = estimate_derivatives(run, method='filtfilt', cutoff_hz=args.cutoff,
                                               filter_inputs=True)
            if args.cutoff:
                info.update(derivatives='filtfilt of measured qd' if from_velocity
                            else 'filtfilt', cutoff_hz=args.cutoff)
                edge = int(math.ceil(_sample_rate(run) / args.cutoff))
            else:
                # one sample at each end, where the difference is one-sided
                info['derivatives'] = 'central differences of measured qd'
                edge = 1
            if len(run) > 10 * edge:
                run = run.crop(edge, len(run) - edge)
                info['edge_crop_s'] = edge / _sample_rate(run)
        if not _is_uniform(run):
            rate = _sample_rate(run)
            run = resample(run, rate)
            info['resampled_hz'] = rate
        out.append(run)
    return out, info


def _common_rate(runs: Sequence[Trajectory], progress: Progress) -> Optional[float]:
    """Return the lowest rate when the runs' rates differ (rollouts need one), else None."""
    rates = [_sample_rate(run) for run in runs]
    if max(rates) <= min(rates) * (1.0 + DT_TOLERANCE):
        return None
    progress.stage(f'runs sampled at {min(rates):.4g} to {max(rates):.4g} Hz: all resampled '
                   f'at {min(rates):.4g} Hz (--rate sets the rate)')
    return min(rates)


def split(runs: Sequence[Trajectory], spec: Optional[str]
          ) -> Tuple[List[Trajectory], List[Trajectory]]:
    """
    Split runs into training and validation sets (:func:`diffsim_ros.io.selection.split`).

    :param runs: the runs.
    :param spec: ``--validation``.
    :return: ``(train, validation)``; validation may be empty.
    :raises UsageError: unknown run names or nothing left for training.
    """
    with reported('', SelectionError):
        return split_runs_or_blocks(runs, spec, SPLIT_BLOCK_S, MIN_SAMPLES)


def away_from_limits(train: List[Trajectory], validation: List[Trajectory],
                     nominal: RobotModel, args: argparse.Namespace
                     ) -> Tuple[List[Trajectory], List[Trajectory], int]:
    """
    Leave out the stretches where a joint is within ``--limit-margin`` of a position limit.

    A limit stop pushes with a force the rigid-body model lacks (the identifier node leaves
    those samples out the same way): on the demo's iLQR bag, whose arm reached its stop, the
    fit came out 11 % off the truth with them.  The stretches are padded by the derivative
    filter's transient (``2 / cutoff`` s; 5 samples without a filter).

    :param train: training runs.
    :param validation: validation runs.
    :param nominal: the model, whose ``lower``/``upper`` are the limits.
    :param args: parsed arguments (``limit_margin``, ``cutoff``).
    :return: ``(train, validation, samples left out)``.
    """
    if args.limit_margin < 0:
        return train, validation, 0
    pad = 2.0 / args.cutoff if args.cutoff else 5.0 / _sample_rate(train[0])
    lower, upper = nominal.lower.detach().cpu(), nominal.upper.detach().cpu()
    before = sum(len(run) for run in train + validation)
    train, validation = ([part for run in runs for part in limit_free_runs(
        run, lower, upper, args.limit_margin, pad)] for runs in (train, validation))
    return train, validation, before - sum(len(run) for run in train + validation)


# --------------------------------------------------------------------------------------
# Estimator configuration
# --------------------------------------------------------------------------------------
def _read_config(path: Optional[Path]) -> Dict[str, Any]:
    if path is None:
        return {}
    if path.exists() and not path.is_dir():
        _check_file(path, '--config')
    with reported(f'cannot read --config {str(path)!r}', OSError, UnicodeDecodeError):
        text = path.read_text(encoding='utf-8')
    with reported(f'--config {str(path)!r} is not valid YAML', yaml.YAMLError):
        loaded = yaml.safe_load(text)
    if loaded is None:
        return {}
    if not isinstance(loaded, Mapping):
        raise UsageError(f'--config {str(path)!r} must hold a mapping of estimator keys, '
                         f'got a {type(loaded).__name__}')
    return dict(loaded)


def _motor(info: robots.RobotInfo) -> Tuple[str, Dict[str, Any]]:
    """Return the ``(actuator, actuator_kwargs)`` config of a voltage robot's motor."""
    # The catalog is the one source of motor constants (the MuJoCo plant uses it too); the
    # named presets in core.DCMotor follow other references (e.g. Pyrado's efficiencies).
    return 'dc_motor', info.dc_motor_kwargs()


def estimator_config(args: argparse.Namespace, info: Optional[robots.RobotInfo],
                     runs: Sequence[Trajectory]) -> Tuple[Any, Dict[str, Any]]:
    """
    Build the estimator configuration: robot defaults < ``--config`` < command-line flags.

    :param args: parsed arguments.
    :param info: catalog entry or ``None``.
    :param runs: the runs (whether they carry efforts).
    :return: ``(frozen config, the mapping it was made from)``.
    :raises UsageError: unknown keys or values, or an ``--actuator`` the method cannot take.
    """
    method = args.method
    mapping = _read_config(args.config)
    if method != 'ffnn' and _needs_commands(info):
        actuator, kwargs = _motor(info)
        mapping.setdefault('actuator', actuator)
        if kwargs:
            mapping.setdefault('actuator_kwargs', kwargs)
    uses_commands = _needs_commands(info) or any(run.tau is None for run in runs)
    if uses_commands and info is not None:
        mapping.setdefault('command_joints', list(info.command_joints))
        mapping.setdefault('source', 'u')
    if args.actuator is not None:
        if method == 'ffnn':
            raise UsageError(f'--actuator {args.actuator}: the ffnn black box has no friction '
                             'model; use --method diffnea or nea')
        if method == 'nea':
            if args.actuator != 'viscous':
                raise UsageError(f'--actuator {args.actuator} needs --method diffnea (nea is '
                                 'linear least squares: viscous, or viscous + Coulomb by '
                                 'default)')
            mapping['friction'] = ['viscous']
        elif args.actuator == 'viscous':
            mapping['friction_model'] = 'none'
            mapping['learn'] = [g for g in mapping.get('learn', ('inertial', 'damping'))
                                if g != 'coulomb'] or ['inertial', 'damping']
        else:
            mapping['friction_model'] = args.actuator
            learn = list(mapping.get('learn', ('inertial', 'damping', 'coulomb')))
            mapping['learn'] = learn + ([] if 'friction_model' in learn else ['friction_model'])
    if args.seed is not None:
        mapping['seed'] = args.seed
    single = {'loss', 'stages', 'horizon', 'adam_iterations', 'lbfgs_iterations'}
    if method == 'diffnea' and not single & set(mapping) and runs:
        # Default: inverse fit, then multi-step refinement judged by held-out rollouts (the
        # inverse fit alone simulates the real Quanser robots worse than the catalogue); a
        # config that sets the loss or the budget gets the single stage it describes, and one
        # that names its groups gets those (the motor's back-EMF only when it names none).
        learn = list(mapping.get('learn', DiffNEAConfig.learn))
        if mapping.get('friction_model', 'none') != 'none' and 'friction_model' not in learn:
            learn.append('friction_model')
        motor = 'learn' not in mapping and mapping.get('actuator', 'none') != 'none'
        rate = 1.0 / float(torch.median(torch.diff(runs[0].t)))
        # measured joint torques stay in the refinement's loss (simulation_schedule)
        sensed = info is not None and bool(info.motor.get('torque_sensors')) \
            and not uses_commands
        mapping.update(simulation_schedule(rate, learn, ['actuator'] if motor else [],
                                           torque_weight=1.0 if sensed else 0.0))
    config = _make_config(method, mapping)
    if args.max_iter is not None:
        _apply_max_iter(method, mapping, args.max_iter, config)
        config = _make_config(method, mapping)
    return config, mapping


def _make_config(method: str, mapping: Mapping[str, Any]) -> Any:
    with reported(f'invalid {method} configuration', TypeError, ValueError):
        return estimators.make_config(method, mapping)


def _apply_max_iter(method: str, mapping: Dict[str, Any], limit: int, config: Any) -> None:
    """Bound the iterations of a validated ``config`` in ``mapping``."""
    lbfgs_limit = max(1, limit // 10)
    if method == 'ffnn':
        mapping['iterations'] = limit
    elif method == 'diffnea':
        mapping['adam_iterations'] = limit
        mapping['lbfgs_iterations'] = min(config.lbfgs_iterations, lbfgs_limit)
        if config.stages:
            mapping['stages'] = [
                {**stage.to_dict(), 'adam_iterations': min(stage.adam_iterations, limit),
                 'lbfgs_iterations': min(stage.lbfgs_iterations, lbfgs_limit)}
                for stage in config.stages]


def _budget(method: str, config: Any) -> str:
    if method == 'nea':
        return 'closed-form least squares'
    if method == 'ffnn':
        return f'up to {config.iterations} Adam steps'
    stages = config.schedule()
    adam = sum(s.adam_iterations for s in stages)
    lbfgs = sum(s.lbfgs_iterations for s in stages)
    return f'up to {adam} Adam + {lbfgs} L-BFGS steps'


# --------------------------------------------------------------------------------------
# Fit and evaluation
# --------------------------------------------------------------------------------------
def run_fit(method: str, model: RobotModel, train: List[Trajectory],
            validation: List[Trajectory], config: Any,
            progress: Progress) -> IdentificationResult:
    """
    Run the estimator with the live progress indicator.

    :param method: estimator name.
    :param model: nominal model (on the target device).
    :param train: training runs.
    :param validation: validation runs (may be empty).
    :param config: the estimator's config.
    :param progress: progress output.
    :return: the identification result.
    """
    kwargs = {}
    if 'callback' in inspect.signature(estimators.fit).parameters:
        kwargs['callback'] = progress.update
    progress.begin(f'fitting {method}')
    try:
        return estimators.fit(method, model, train, validation or None, config, **kwargs)
    finally:
        progress.end()


# --------------------------------------------------------------------------------------
# Orchestration
# --------------------------------------------------------------------------------------
def _versions() -> Dict[str, str]:
    out = {'diffsim_ros': __version__, 'python': platform.python_version(),
           'torch': torch.__version__, 'numpy': np.__version__, 'pyyaml': yaml.__version__}
    for package in ('scipy', 'matplotlib', 'rosbags'):
        try:
            out[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def _summary(method: str, metrics: Mapping[str, Any]) -> List[str]:
    def fmt(value: Any) -> str:
        return f'{value:.3g}' if isinstance(value, float) else '-'

    def rollout(section: Mapping[str, Any]) -> str:
        return 'diverged' if section.get('diverged') else fmt(section.get('nmse'))

    lines = [f'method: {method}, iterations: {metrics.get("iterations")}, '
             f'fit {metrics["wall_time_s"]["fit"]:.1f} s']
    for key, label in (('torque', 'torque NMSE'), ('acceleration', 'qdd NMSE')):
        for which in ('identified', 'nominal'):
            section = metrics.get(key) if which == 'identified' else \
                (metrics['nominal'].get(key) or {})
            if not section:
                continue
            train = (section.get('train') or {}).get('nmse_mean')
            val = (section.get('validation') or {}).get('nmse_mean')
            lines.append(f'{label:<12} {which:<10} train {fmt(train):>8}  val {fmt(val):>8}')
    for key in metrics['rollout']:
        fitted = rollout(metrics['rollout'][key])
        base = rollout(metrics['nominal']['rollout'][key])
        lines.append(f'rollout {key} NMSE (val): identified {fitted}, nominal {base}')
    return lines


def _save_modules(result: IdentificationResult, out: Path) -> Optional[Path]:
    modules = {}
    if result.network is not None:
        modules['network'] = result.network.state_dict()
    if result.friction is not None and stribeck_levels(result.friction, 1) is None:
        modules['friction'] = result.friction.state_dict()
    if not modules:
        return None
    path = out / 'modules.pt'
    torch.save({name: {k: v.detach().cpu() for k, v in state.items()}
                for name, state in modules.items()}, path)
    return path


def _fit_summary(metrics: Mapping[str, Any]) -> str:
    keys = (('loss', 'loss'), ('validation_loss', 'validation loss')) if 'loss' in metrics \
        else (('torque_nmse', 'torque NMSE'), ('validation_torque_nmse', 'validation torque NMSE'))
    parts = [f'{metrics.get("iterations", 1)} iteration(s)']
    for key, label in keys:
        value = metrics.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            parts.append(f'{label} {value:.4g}')
    return ', '.join(parts)


def _check_device(name: str) -> torch.device:
    if name == 'cuda' and not torch.cuda.is_available():
        raise UsageError('--device cuda: CUDA is not available to this PyTorch installation')
    return torch.device(name)


def _check_inputs(nominal: RobotModel, config: Any, train: List[Trajectory],
                  validation: List[Trajectory]) -> str:
    """Return the input signal the estimator will read, or raise a UsageError."""
    has_actuator = getattr(config, 'actuator', 'none') != 'none'
    with reported('', KeyError, ValueError):
        source = resolve_source(train + validation, config.source, has_actuator)
        m = getattr(train[0], source).shape[-1]
        command_joints_for(nominal, source, m, getattr(config, 'command_joints', ()))
    return source


def _urdf_model(urdf_text: str, result: IdentificationResult,
                nominal: RobotModel) -> RobotModel:
    """Load the written URDF back (with the fit's armature, which URDF cannot hold)."""
    written = load_urdf(xml=urdf_text, dtype=nominal.dtype).to(device=nominal.device)
    armature = result.model.armature if result.model is not None else nominal.armature
    return written.replace(armature=armature.detach().to(written.armature))


def _adjusted(urdf_info: Mapping[str, Any]) -> bool:
    return any(urdf_info.get(key) for key in ('consistent_refit', 'projected_bodies',
                                              'nominal_bodies', 'clipped_friction_joints'))


def _header(args: argparse.Namespace, robot_label: str, nominal: RobotModel,
            result: IdentificationResult, config: Any, source: str) -> Dict[str, Any]:
    identified = result.model if result.model is not None else nominal
    return {
        'method': args.method, 'robot': robot_label, 'data': str(args.data.resolve()),
        'joint_names': list(nominal.joint_names),
        'command_joints': list(result.command_joints), 'input': source,
        'actuator': getattr(config, 'actuator', 'none'),
        'friction_model': getattr(config, 'friction_model', None),
        'armature': {joint: float(value) for joint, value in
                     zip(nominal.joint_names, identified.armature.detach().cpu().tolist())},
    }


def fit_command(args: argparse.Namespace, progress: Progress) -> Dict[str, Any]:
    """
    Run the whole pipeline of the module docstring.

    :param args: parsed arguments.
    :param progress: progress output.
    :return: the metrics written to ``metrics.json``.
    :raises UsageError: problems with the inputs.
    """
    start = time.perf_counter()
    device = _check_device(args.device)
    out: Path = args.out
    check_out(out)
    fmt = data_format(args)
    robot_spec = args.robot or fmt.robot(args.data)
    if robot_spec is None:
        raise UsageError(f'--robot is required for {fmt.name} data (a name: '
                         f'{", ".join(robots.names())}, or a URDF file)')
    nominal, info, robot_label = load_robot(robot_spec)
    runs, defaults = load_data(args, fmt, nominal, info, progress)
    applied = apply_defaults(args, defaults)
    if applied:
        progress.stage(f'{fmt.name} data set defaults: ' + ' '.join(
            f'--{dest.replace("_", "-")} {value}' for dest, value in applied.items()))
    runs, data_info = conventions(runs, args, nominal)
    progress.stage(f'loaded {len(runs)} run(s), {sum(len(run) for run in runs)} samples at '
                   f'about {_sample_rate(runs[0]):.4g} Hz from {args.data} for {robot_label} '
                   f'({", ".join(nominal.joint_names)})')
    runs, prep = preprocess(runs, args, progress)
    prep.update(data_info)
    train, validation = split(runs, args.validation)
    train, validation, prep['limit_samples_dropped'] = away_from_limits(
        train, validation, nominal, args)
    prep['limit_margin'] = args.limit_margin
    if prep['limit_samples_dropped']:
        progress.stage(f'left out {prep["limit_samples_dropped"]} samples within '
                       f'{args.limit_margin:g} of a position limit')
    if sum(len(run) for run in train) < MIN_SAMPLES:
        at_limits = (f' left after {prep["limit_samples_dropped"]} samples at position limits '
                     '(--limit-margin)') if prep['limit_samples_dropped'] else ''
        raise UsageError(f'fewer than {MIN_SAMPLES} training samples{at_limits}')
    config, _ = estimator_config(args, info, train)
    config = _apply_loss(args, config, train)
    source = _check_inputs(nominal, config, train, validation)
    excited, warning = measure_excitation(nominal, train, config, args.max_condition, progress)
    actuator = getattr(config, 'actuator', 'none')
    progress.stage(f'{len(train)} training run(s), {len(validation)} validation run(s); '
                   f'derivatives: {prep["derivatives"]}; input: {source}'
                   f'{" through " + actuator if actuator != "none" else ""}')
    progress.stage(f'fitting {args.method} ({_budget(args.method, config)}) on {device}')
    model = nominal.to(device=device)
    train = [run.to(device=device) for run in train]
    validation = [run.to(device=device) for run in validation]
    fit_start = time.perf_counter()
    fitted_runs, stopping = early_stopping_split(train, validation, args.early_stopping)
    result = run_fit(args.method, model, fitted_runs, stopping, config, progress)
    fit_seconds = time.perf_counter() - fit_start
    progress.stage(f'fit done in {fit_seconds:.1f} s: {_fit_summary(result.metrics)}')

    urdf_text, urdf_info = export_urdf(result, nominal, config)
    for note in urdf_info['notes']:
        if 'inconsistent' in note or 'clipped' in note:
            progress.warn(note)
    written = _urdf_model(urdf_text, result, model)
    progress.begin('evaluating')
    try:
        motor = _motor(info) if _needs_commands(info) else None
        fitted, base = predictors(result, model, config, motor)
        scores, curves = evaluate(fitted, base, train, validation, source, args.horizons)
        published = _published(info, model, result.command_joints or model.joint_names,
                               scores, base, train, validation, source, args.horizons)
        if _adjusted(urdf_info):
            exported, _ = predictors(dataclasses.replace(result, model=written), model, config,
                                     motor)
            urdf_info['evaluation'], _ = score(exported, base, train, validation, source,
                                               args.horizons)
    finally:
        progress.end()

    # the folder was checked before the fit; it can still vanish or fill up meanwhile
    with reported(f'cannot write to --out {str(out)!r}', OSError):
        (out / 'model.urdf').write_text(urdf_text, encoding='utf-8')
        parameters = parameter_table(result, nominal, config)
        write_params_yaml(out / 'params.yaml', _header(args, robot_label, nominal, result,
                                                       config, source), parameters)
        exported_model = _write_model_document(out / 'params.yaml', result, written, urdf_info,
                                               info)
        modules_path = _save_modules(result, out)
        metrics: Dict[str, Any] = {
            **_header(args, robot_label, nominal, result, config, source),
            'runs': {'train': [run.run for run in train],
                     'validation': [run.run for run in validation]},
            'early_stopping': {'mode': args.early_stopping,
                               'runs': [run.run for run in stopping]},
            'samples': {'train': sum(len(run) for run in train),
                        'validation': sum(len(run) for run in validation)},
            'preprocessing': prep,
            'data': {'format': fmt.name, 'defaults': applied, 'validation': args.validation},
            'excitation': {**excited.to_dict(), 'max_condition': args.max_condition,
                           'sufficient': warning is None},
            'warning': warning,
            **scores,
            'horizons_s': list(args.horizons),
            'better_than_nominal': better_than_nominal(scores),
            **({'published': published} if published is not None else {}),
            'iterations': result.metrics.get('iterations'),
            'wall_time_s': {'fit': fit_seconds, 'total': None},
            'urdf': urdf_info,
            'physical_parameters': bool(parameters),
            'modules': modules_path.name if modules_path is not None else None,
            'model_document': exported_model or 'params.yaml model',
            'estimator_metrics': result.to_dict()['metrics'],
            'history': {'train_iterations': len(result.history.get('train', ())),
                        'validation_evaluations': len(result.history.get('validation', ()))},
            'config': result.to_dict()['config'],
            'device': str(device),
            'versions': _versions(),
        }
        del metrics['armature']
        metrics['exit_status'] = _exit_status(metrics, args.allow_worse)
        plot_run = validation[0] if validation else train[0]
        run_label = f'validation run {plot_run.run}' if validation else \
            f'training run {plot_run.run} (no validation data)'
        note = 'black-box model: no physical parameters (model.urdf is the nominal URDF)' \
            if not parameters else ''
        units = ['m' if kind == PRISMATIC else 'rad' for kind in nominal.tree.joint_types]
        write_report_png(out / 'report.png', f'{robot_label}: {args.method} fit of '
                         f'{args.data.name}', plot_run, run_label, curves, parameters,
                         _summary(args.method, metrics), note, units)
        metrics['wall_time_s']['total'] = time.perf_counter() - start
        write_metrics_json(out / 'metrics.json', metrics)
    progress.stage(f'wrote params.yaml, model.urdf, metrics.json, report.png'
                   f'{", modules.pt" if modules_path is not None else ""} to {out}')
    if warning is not None:
        progress.warn(warning)
    if metrics['worse_than_nominal']:
        progress.warn(metrics['worse_than_nominal'])
    return metrics


def _write_model_document(path: Path, result: IdentificationResult, written: RobotModel,
                          urdf_info: Mapping[str, Any],
                          info: Optional[robots.RobotInfo]) -> Optional[str]:
    """
    Append the fit's model document to ``params.yaml`` (:mod:`diffsim_ros.io.fits`).

    The document holds the fitted model, its motor and its analytic friction module; where the
    URDF export had to change the fit (inconsistent bodies, negative friction), its inertials
    are the exported ones, so that a node accepts what ``model.urdf`` shows.

    :return: why no document was written (a black-box fit, a URDF outside the catalogue), or
        ``None`` when it was.
    """
    if result.model is None:
        return 'a black-box fit has no physical model'
    if info is None:
        return 'the robot is not in the catalogue (no interface to load the document with)'
    source = result
    if _adjusted(urdf_info):
        model = written.replace(damping=result.model.damping.detach().clamp_min(0.0).to(
            written.damping), friction=result.model.friction.detach().clamp_min(0.0).to(
            written.friction))
        source = dataclasses.replace(result, model=model)
    try:
        document = model_message(source, robots.interface(info.name))
    except ModelMessageError as error:   # e.g. a model with parameter batch dims
        return f'no model document: {error}'
    write_model_document(path, document)
    return None


def _published(info: Optional[robots.RobotInfo], model: RobotModel, joints: Sequence[str],
               scores: Mapping[str, Any], base: Any, train: List[Trajectory],
               validation: List[Trajectory], source: str,
               horizons: Sequence[float]) -> Optional[Dict[str, Any]]:
    """
    Score the robot's published model with its own friction model, as the fit is scored.

    :param info: catalog entry or ``None``.
    :param model: nominal model (dtype and device of the evaluation).
    :param joints: command joints of the fit's inputs.
    :param scores: the fit's metrics (:func:`~diffsim_ros.io.report.evaluate`).
    :param base: the nominal predictor (torque variance scale).
    :param train: training runs.
    :param validation: validation runs.
    :param source: ``'tau'`` or ``'u'``.
    :param horizons: rollout horizons, s.
    :return: ``{'description', 'torque', 'acceleration', 'rollout', 'better_than_published'}``
        or ``None`` when the catalog has no friction model beyond the URDF's fields.
    """
    if info is None:
        return None
    published = robots.interface(info.name).published_friction()
    if published is None:
        return None
    bare, friction, description = published
    predictor = physical_predictor(
        'published', bare.to(dtype=model.dtype, device=model.device), joints, None,
        friction.to(dtype=model.dtype, device=model.device))
    section, _ = score(predictor, base, train, validation, source, horizons)
    return {'description': f'catalogue inertials with {description}', **section,
            'better_than_published': better_than_nominal({**scores, 'nominal': section})}


def _exit_status(metrics: Dict[str, Any], allow_worse: bool) -> int:
    """Set ``metrics['worse_than_nominal']`` and return the exit status of the outputs."""
    metrics['worse_than_nominal'], lost = verdict(metrics, metrics['better_than_nominal'],
                                                  allow_worse, EXIT_WORSE)
    if metrics['warning'] is not None:
        return EXIT_NOT_EXCITED
    return EXIT_WORSE if lost and not allow_worse else 0


def _apply_loss(args: argparse.Namespace, config: Any, train: Sequence[Trajectory]) -> Any:
    """Return the config with ``--loss`` / ``--horizon`` applied."""
    with reported('', ValueError):
        steps = None if args.horizon is None else horizon_steps(
            args.horizon, 1.0 / _sample_rate(train[0]), min(len(run) for run in train))
        return apply_loss(args.method, config, args.loss, steps)


def measure_excitation(nominal: RobotModel, train: Sequence[Trajectory], config: Any,
                       max_condition: float, progress: Progress
                       ) -> Tuple[Excitation, Optional[str]]:
    """
    Measure how well the training data excite the dynamics, and warn when they do not.

    The regressor layout is the estimator's when it is NEA, else NEA's default (inertial,
    viscous and Coulomb friction).

    :param nominal: the robot.
    :param train: training runs (with ``qd`` and ``qdd``).
    :param config: the estimator's config.
    :param max_condition: ``--max-condition``.
    :param progress: where the warning goes.
    :return: ``(the measure, the warning or None)``.
    """
    columns = RegressorColumns()
    if hasattr(config, 'friction') and hasattr(config, 'coulomb'):
        columns = RegressorColumns(friction=config.friction, armature=config.armature,
                                   coulomb=config.coulomb, coulomb_eps=config.coulomb_eps)
    measured = excitation(nominal, train, columns)
    condition = measured.condition_number
    progress.stage(f'excitation: condition number {condition:.3g} of the base regressor '
                   f'(rank {measured.rank} of {measured.base_parameters}; at most '
                   f'{max_condition:g} counts as exciting)')
    if condition <= max_condition:
        return measured, None
    warning = (f'the training data do not excite the dynamics: condition number '
               f'{condition:.3g} > --max-condition {max_condition:g}, rank {measured.rank} of '
               f'{measured.base_parameters} base parameters (a robot at rest or at constant '
               'velocity?): the fit cannot determine all of them; '
               f'least excited: {measured.least_excited}; exit status {EXIT_NOT_EXCITED}')
    progress.warn(warning)
    return measured, warning


def main(argv: Optional[Sequence[str]] = None) -> int:
    """
    Run ``diffsim-fit``.

    :param argv: arguments without the program name; ``None`` reads ``sys.argv``.
    :return: exit code: 0 success, 2 input problems (one line on stderr), 3 outputs written
        but the data do not excite the dynamics, 4 outputs written but held-out rollouts
        worse than the nominal model's, 130 interrupted.
    """
    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        sys.stderr.write(f'{PROG}: error: {exc}\n')
        return EXIT_USAGE
    except SystemExit as exc:   # --help
        return int(exc.code or 0)
    progress = Progress(sys.stderr, quiet=args.quiet)
    try:
        metrics = fit_command(args, progress)
    except UsageError as exc:
        sys.stderr.write(f'{PROG}: error: {exc}\n')
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write(f'{PROG}: interrupted\n')
        return 130
    return metrics['exit_status']


if __name__ == '__main__':
    sys.exit(main())
