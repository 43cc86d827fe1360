"""
``diffsim-predict``: roll a fitted model out on recorded data and write what it predicts.

::

    diffsim-predict DIR DATA --out PRED.npz [--topic T] [--command-topic T] [--limit N]

``DIR`` is a ``diffsim-fit --out`` folder.

* An object fit (``diffsim-fit --object``; its ``params.yaml`` has ``object``): the learned
  object is read back from the URDF and meshes it wrote
  (:func:`~diffsim_ros.io.object_urdf.read_object_urdf`, which gives the same model) with the
  ground height of ``params.yaml`` and the networks of ``modules.pt`` (a ``residual``
  :class:`~diffsim_ros.sysid.contact_learning.ResidualNetwork`). ``DATA`` is read as
  ``diffsim-fit --object`` reads it (:mod:`diffsim_ros.io.object_data`); every toss is rolled
  out from its first full state (row :data:`~diffsim_ros.io.object_fit.FIRST_STATE`: row 0's
  velocity is a copy of row 1's) to its end; the rows before it are copied from the
  recording. ``PRED.npz`` has the input's layout: for the shared ``.npz`` layouts the same
  keys with ``states`` replaced by the prediction (same columns, units, ``toss_offsets``,
  ``toss_ids``; with ``--limit`` the offsets and ids of the tosses read); for CSV and bag
  poses ``columns`` (:data:`~diffsim_ros.io.object_data.POSE_COLUMNS` plus ``toss``),
  ``states``, ``measured`` (the rows read, same layout), ``toss_offsets``, ``toss_ids``,
  ``dt``.
* A fixed-base robot fit (``diffsim-fit --robot``; its ``params.yaml`` has ``robot`` and the
  ``model`` document, :func:`~diffsim_ros.io.fits.load_fit`): ``DATA`` is a rosbag2 with
  JointState and commands (``--topic``; ``--command-topic``, default the bag's only
  Float64MultiArray topic; without one, a fit on torques is driven by the recorded efforts).
  Every run is rolled out (RK4 at the recording's period, commands held) from its first
  sample to its end through the fit's actuator and friction. ``PRED.npz`` has the NPZ table
  layout of ``diffsim-fit`` (:mod:`diffsim_ros.io.tables`): ``t``, ``q``, ``qd``, ``u``,
  ``joint_names``, ``run``, rows in the order :func:`~diffsim_ros.io.bags.read_bag` returns
  them (runs in order, one row per joint state kept).

Exit status 0, or 2 with one line on stderr for bad inputs.
"""

import argparse
from pathlib import Path
import sys
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np
import torch
import yaml

from .bags import bag_topics, BagError, COMMAND, read_bag
from .fit_options import number_type, OneLineParser, path_type, reported, UsageError
from .fits import FitFileError, load_fit
from .object_data import (ObjectDataError, ObjectRecording, POSE_COLUMNS, pose_rows, read_tosses,
                          REST_S)
from .object_fit import predict_tosses
from .object_urdf import read_object_urdf
from .report import physical_predictor
from .tosses import to_cube_rows, to_elbow_rows
from .. import robots
from ..core.contact import ContactModel
from ..core.errors import URDFError
from ..sysid.contact_learning import ResidualNetwork, rollout
from ..sysid.losses import integrate

PROG = 'diffsim-predict'
EXIT_USAGE = 2


def _params(folder: Path) -> Dict[str, Any]:
    file = folder / 'params.yaml'
    if not file.is_file():
        raise UsageError(f'{str(folder)!r} is not a diffsim-fit --out folder (no params.yaml)')
    with reported(f'cannot read {str(file)!r}', OSError, UnicodeDecodeError, yaml.YAMLError):
        loaded = yaml.safe_load(file.read_text(encoding='utf-8'))
    if not isinstance(loaded, Mapping):
        raise UsageError(f'{str(file)!r} is not a YAML mapping')
    return dict(loaded)


def object_predictor(folder: Path, params: Mapping[str, Any]):
    """
    Return the rollout function of an object fit folder.

    :param folder: the ``diffsim-fit --object`` output folder.
    :param params: its ``params.yaml``.
    :return: ``(x0 (B, nx), steps, dt) -> (B, steps, nx)``.
    :raises UsageError: a missing URDF or mesh, or a method whose model cannot be rebuilt.
    """
    note = params.get('note')
    if note:
        raise UsageError(f'{folder}: {note}; diffsim-predict rebuilds physical objects only')
    with reported(f'cannot load the learned object of {str(folder)!r}', URDFError, OSError,
                  ValueError, TypeError):
        model, contact, _ = read_object_urdf(folder / str(params['urdf']))
        ground = float(params['parameters']['ground_height']['value'])
        contact = ContactModel(
            friction=contact.friction, restitution=contact.restitution,
            stiffness=contact.stiffness, damping=contact.damping,
            slip_velocity=contact.slip_velocity,
            ground_height=torch.tensor(ground, dtype=model.dtype),
            ground_tilt=contact.ground_tilt, vertex_links=contact.vertex_links,
            vertices=contact.vertices)
    residual = None
    if params.get('modules'):
        with reported(f'cannot load {folder / str(params["modules"])}', OSError, RuntimeError,
                      KeyError):
            modules = torch.load(folder / str(params['modules']), weights_only=True)
            if set(modules) - {'residual'}:
                raise UsageError(f'{folder}: modules {sorted(modules)}: diffsim-predict '
                                 'rebuilds a residual network only')
            if 'residual' in modules:
                residual = ResidualNetwork(int(model.nq), int(model.nv), dtype=model.dtype)
                residual.load_state_dict(modules['residual']['state_dict'])

    def predict(x0, steps, dt):
        return rollout(model, contact, x0, steps, dt, residual=residual)
    return predict


def _object_layout(recording: ObjectRecording, states: List[torch.Tensor]) -> Dict[str, Any]:
    nq = recording.q[0].shape[-1]
    lengths = [len(x) for x in states]
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    if recording.layout in ('cube', 'elbow'):
        with np.load(recording.source) as archive:
            out = {key: archive[key] for key in archive.files}
        write = to_cube_rows if recording.layout == 'cube' else to_elbow_rows
        out['states'] = np.concatenate([write(x[:, :nq], x[:, nq:]) for x in states])
        out['toss_offsets'] = offsets.astype(out['toss_offsets'].dtype)
        out['toss_ids'] = np.asarray(recording.toss_ids, dtype=out['toss_ids'].dtype)
        return out

    def table(qs):
        return np.concatenate([np.column_stack((t, pose_rows(q), np.full(len(t), toss_id)))
                               for t, q, toss_id in zip(recording.t, qs, recording.toss_ids)])
    return {'columns': np.array(POSE_COLUMNS + ('toss',)),
            'states': table([x[:, :nq] for x in states]), 'measured': table(recording.q),
            'toss_offsets': offsets, 'toss_ids': np.asarray(recording.toss_ids),
            'dt': np.float64(recording.dt)}


def predict_objects(folder: Path, params: Mapping[str, Any], args: argparse.Namespace) -> str:
    """
    Predict every toss of ``DATA`` with an object fit and write ``--out``.

    :param folder: the fit folder.
    :param params: its ``params.yaml``.
    :param args: the command line.
    :return: a one-line summary.
    :raises UsageError: bad fit folder or data.
    """
    predict = object_predictor(folder, params)
    with reported('', ObjectDataError):
        recording = read_tosses(args.data, args.topic, args.rest, args.limit)
    nq = int(recording.q[0].shape[-1])
    with reported(f'{args.data}: the tosses do not fit the object of {folder}', RuntimeError,
                  ValueError):
        states = predict_tosses(predict, recording, range(len(recording)))
    np.savez(args.out, **_object_layout(recording, states))
    return (f'predicted {len(recording)} tosses ({sum(len(x) for x in states)} rows, nq {nq}) '
            f'in the {recording.layout} layout')


def _command_topic(data: Path) -> Optional[str]:
    """Return a bag's only Float64MultiArray topic (None when it has none or several)."""
    candidates = [topic for topic, (kind, _) in bag_topics(data).items() if kind == COMMAND]
    return candidates[0] if len(candidates) == 1 else None


def predict_robot(folder: Path, params: Mapping[str, Any], args: argparse.Namespace) -> str:
    """
    Predict every run of a bag with a fixed-base robot fit and write ``--out``.

    :param folder: the fit folder.
    :param params: its ``params.yaml``.
    :param args: the command line.
    :return: a one-line summary.
    :raises UsageError: bad fit folder or data.
    """
    name = str(params.get('robot'))
    if name not in robots.names():
        raise UsageError(f'{folder}: robot {name!r} is not in the catalogue; diffsim-predict '
                         'reads fits of catalogue robots (their model document)')
    with reported('', FitFileError):
        fit = load_fit(folder, robots.interface(name))
    command_joints = tuple(params.get('command_joints') or fit.model.joint_names)
    with reported('', BagError):
        command_topic = args.command_topic or _command_topic(args.data)
        runs = read_bag(args.data, args.topic, command_topic,
                        joint_names=fit.model.joint_names, command_joints=command_joints)
    if command_topic is None and (fit.actuator is not None or runs[0].tau is None):
        why = 'the fit is driven by voltages' if fit.actuator is not None else 'no efforts'
        raise UsageError(f'{args.data}: no command topic (give --command-topic) and {why}')
    predictor = physical_predictor('fit', fit.model, command_joints, fit.actuator,
                                   fit.friction, fit.coulomb_eps)
    columns: Dict[str, List[np.ndarray]] = {'t': [], 'q': [], 'qd': [], 'u': [], 'run': []}
    for run in runs:
        dt = run.t.diff()
        if len(run) < 2 or float((dt - dt.mean()).abs().max()) > 1e-3 * float(dt.mean()):
            raise UsageError(f'{args.data}: run {run.run!r} is not sampled uniformly; '
                             'resample it first')
        x0 = torch.cat((run.q[0], run.qd[0] if run.qd is not None else
                        torch.zeros_like(run.q[0])))
        drive = run.u if command_topic is not None else run.tau
        with torch.no_grad():
            states = integrate(predictor.accel, x0[None], drive[None, :-1], float(dt.mean()),
                               'rk4')[0]
        n = fit.model.n
        columns['t'].append(run.t.numpy())
        columns['q'].append(states[:, :n].numpy())
        columns['qd'].append(states[:, n:].numpy())
        columns['u'].append(drive.numpy())
        columns['run'].append(np.array([run.run] * len(run)))
    out = {key: np.concatenate(value) for key, value in columns.items()}
    out['joint_names'] = np.array(fit.model.joint_names)
    np.savez(args.out, **out)
    return f'predicted {len(runs)} run(s), {len(out["t"])} rows of {name} with its fit'


def build_parser() -> argparse.ArgumentParser:
    """
    Return the command-line parser of ``diffsim-predict``.

    :return: the parser.
    """
    parser = OneLineParser(
        prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description='Roll a diffsim-fit model out on recorded data from the first state of '
        'every toss or run, and write the prediction in the layout of the input.',
        epilog=__doc__.split('::')[1].split('Exit status')[0].strip('\n'))
    parser.add_argument('fit', type=path_type, help='a diffsim-fit --out folder')
    parser.add_argument('data', type=path_type, help='tosses (.npz, .csv, rosbag2 of poses) '
                        'for an object fit; a rosbag2 with joint states and commands for a '
                        'robot fit')
    parser.add_argument('--out', type=path_type, required=True, help='the .npz to write')
    parser.add_argument('--topic', help='pose topic (objects) or JointState topic (robots)')
    parser.add_argument('--command-topic', help='Float64MultiArray command topic (robots)')
    parser.add_argument('--limit', type=number_type(int, 1), help='objects: first N tosses')
    parser.add_argument('--rest', type=number_type(float, 1e-6), default=REST_S,
                        help='objects: seconds at rest that end a toss in a pose stream '
                        '(default: %(default)s)')
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """
    Run ``diffsim-predict``.

    :param argv: arguments without the program name; ``None`` reads ``sys.argv``.
    :return: 0, or 2 for bad inputs (one line on stderr).
    """
    try:
        args = build_parser().parse_args(argv)
        if args.out.suffix != '.npz':
            raise UsageError(f'--out {str(args.out)!r}: the prediction is written as a .npz')
        if not args.fit.is_dir():
            raise UsageError(f'{str(args.fit)!r} is not a diffsim-fit --out folder')
        params = _params(args.fit)
        with reported(f'cannot write --out {str(args.out)!r}', OSError):
            args.out.parent.mkdir(parents=True, exist_ok=True)
            line = (predict_objects if 'object' in params else predict_robot)(args.fit, params,
                                                                              args)
    except UsageError as exc:
        sys.stderr.write(f'{PROG}: error: {exc}\n')
        return EXIT_USAGE
    except SystemExit as exc:   # --help
        return int(exc.code or 0)
    sys.stderr.write(f'{PROG}: {line}; wrote {args.out}\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
