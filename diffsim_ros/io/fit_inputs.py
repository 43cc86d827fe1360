"""
The inputs of ``diffsim-fit``: the robot, the data, their conventions and preprocessing, the split.

Steps 1-3 of the pipeline in :mod:`diffsim_ros.io.fit_cli`; every problem is a
:class:`~diffsim_ros.io.fit_options.UsageError`.
"""

import argparse
import math
from pathlib import Path
import tempfile
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple
import warnings

import numpy as np
import torch

from .bags import bag_topics, BagError, COMMAND, STORAGE_SUFFIXES
from .conventions import apply_conventions, parse_delay
from .datasets import DatasetError
from .fit_options import (MIN_SAMPLES, one_line, OPTION_DEFAULTS, RATE_RANGE_HZ, reported,
                          SPLIT_BLOCK_S, UsageError)
from .formats import DataFormat, FormatError, in_model_order, LoadOptions, resolve
from .progress import Progress
from .selection import select_runs, SelectionError, split as split_runs_or_blocks
from .tables import TableError
from .. import robots
from ..core.errors import URDFError
from ..core.model import RobotModel
from ..core.urdf import load_urdf
from ..sysid.dataset import Trajectory
from ..sysid.filters import accelerations_from_velocity, estimate_derivatives
from ..sysid.losses import DT_TOLERANCE
from ..sysid.preprocess import limit_free_runs, resample


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
    check_file(path, 'URDF file')
    with reported(f'cannot read URDF file {spec!r}', OSError, UnicodeDecodeError):
        text = path.read_text(encoding='utf-8')
    if not text.lstrip().startswith('<'):
        raise UsageError(f'URDF file {spec!r} does not hold XML (it starts with '
                         f'{text.strip()[:20]!r})')
    with reported(f'invalid URDF {spec!r}', URDFError, ValueError):
        model = load_urdf(xml=text, dtype=torch.float64)
    return model, None, str(path.resolve())


def check_file(path: Path, what: str) -> None:
    """
    Raise unless ``path`` is a regular, non-empty file (a FIFO would block the read).

    :param path: the file.
    :param what: its role, for the message (``'data file'``, ``'--config'``).
    :raises UsageError: missing, not a regular file, or empty.
    """
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


def needs_commands(info: Optional[robots.RobotInfo]) -> bool:
    """
    Return whether the robot is fitted on its commands (voltage-commanded: Qube, cart-pole).

    :param info: catalog entry or ``None`` (a URDF file: torques).
    :return: the answer.
    """
    return info is not None and info.command_unit == 'V'


def _default_command_topic(data: Path, info: Optional[robots.RobotInfo]) -> Optional[str]:
    """Return the command topic to read for a voltage robot's bag, when one is obvious."""
    if not needs_commands(info) or not (data.is_dir() or data.suffix in STORAGE_SUFFIXES):
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
        check_file(data, 'data file')
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
        progress.warn(one_line(warning.message))
    if recording.note:
        progress.stage(f'{fmt.name}: {recording.note}')
    if not runs:
        raise UsageError(f'{str(data)!r} holds no samples')
    if needs_commands(info) and any(run.u is None for run in runs):
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
        if dest == 'actuator' and args.method != 'diffnea':
            continue   # a data set's friction model is a DiffNEA module
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


def sample_rate(run: Trajectory) -> float:
    """
    Return a run's median sample rate, Hz.

    :param run: the run.
    :return: the rate.
    """
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
        rate = sample_rate(run)
        if not RATE_RANGE_HZ[0] <= rate <= RATE_RANGE_HZ[1]:
            raise UsageError(f'run {run.run!r} is sampled at {rate:.3g} Hz: times must be in '
                             f'seconds (rates {RATE_RANGE_HZ[0]:g} to {RATE_RANGE_HZ[1]:g} Hz)')
    common = args.rate or _common_rate(runs, progress)
    if common is not None:
        with reported(f'--rate {common:g}', ValueError):
            runs = [resample(run, common) for run in runs]
        info['resampled_hz'] = common
    for run in runs:
        rate = sample_rate(run)
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
                edge = int(math.ceil(sample_rate(run) / args.cutoff))
            else:
                # one sample at each end, where the difference is one-sided
                info['derivatives'] = 'central differences of measured qd'
                edge = 1
            if len(run) > 10 * edge:
                run = run.crop(edge, len(run) - edge)
                info['edge_crop_s'] = edge / sample_rate(run)
        if not _is_uniform(run):
            rate = sample_rate(run)
            run = resample(run, rate)
            info['resampled_hz'] = rate
        out.append(run)
    return out, info


def _common_rate(runs: Sequence[Trajectory], progress: Progress) -> Optional[float]:
    """Return the lowest rate when the runs' rates differ (rollouts need one), else None."""
    rates = [sample_rate(run) for run in runs]
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
    pad = 2.0 / args.cutoff if args.cutoff else 5.0 / sample_rate(train[0])
    lower, upper = nominal.lower.detach().cpu(), nominal.upper.detach().cpu()
    before = sum(len(run) for run in train + validation)
    train, validation = ([part for run in runs for part in limit_free_runs(
        run, lower, upper, args.limit_margin, pad)] for runs in (train, validation))
    return train, validation, before - sum(len(run) for run in train + validation)
