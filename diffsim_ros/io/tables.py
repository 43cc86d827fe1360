"""
Trajectories as CSV and NPZ tables.

CSV column specification
------------------------
One header row, comma-separated; lines starting with ``#`` are comments.  Columns, in any
order:

==========================  ===============================================================
column                      content
==========================  ===============================================================
``t``                       time in s (required), strictly increasing within a run
``q:<joint>``               joint position, rad (revolute) or m (prismatic) (required, one
                            per joint; their order is the joint order unless ``joint_names``
                            is given)
``qd:<joint>``              joint velocity, rad/s or m/s (optional; all joints or none)
``qdd:<joint>``             joint acceleration, rad/s^2 or m/s^2 (optional; all or none)
``tau:<joint>``             joint torque/force, N m or N (optional; all or none)
``u:<name>``                command, in the robot's command unit (optional; column order is
                            the command order, e.g. ``u:arm_joint`` for the Qube voltage)
``pose:<body>:<field>``     motion-capture pose of ``body`` in the world frame, fields ``x``,
                            ``y``, ``z`` (m) and ``qx``, ``qy``, ``qz``, ``qw`` (unit
                            quaternion); all seven or none per body
``run``                     run name (optional): rows sharing it form one trajectory
==========================  ===============================================================

Every numeric cell must be finite: empty cells, NaN and inf are errors naming the column and
the line.  Unknown columns are errors too (they are usually typos).

NPZ layout
----------
One run per file, loadable with ``allow_pickle=False``: ``t`` (T,), ``q`` (T, n),
``joint_names`` (n,) strings, optional ``qd``, ``qdd``, ``tau`` (T, n), ``u`` (T, m),
``pose_names`` (B,) strings with ``poses`` (B, T, 4, 4), and ``run`` (0-d string).
"""

import csv
from pathlib import Path
from typing import List, Optional, Sequence, Union
import zipfile

import numpy as np
import torch

from ..core.errors import DiffsimError
from ..sysid.dataset import Trajectory
from ..sysid.preprocess import matrix_to_quaternion, quaternion_to_matrix

__all__ = ['POSE_FIELDS', 'read_csv', 'read_npz', 'TableError', 'write_csv', 'write_npz']

PathLike = Union[str, Path]
JOINT_PREFIXES = ('q', 'qd', 'qdd', 'tau')
POSE_FIELDS = ('x', 'y', 'z', 'qx', 'qy', 'qz', 'qw')


class TableError(DiffsimError, ValueError):
    """A CSV/NPZ table is missing, malformed or holds invalid values."""


# --------------------------------------------------------------------------------------
# CSV
# --------------------------------------------------------------------------------------
def _parse_header(header: List[str], path) -> dict:
    """Sort the header into ``{'t': i, 'run': i, 'q': {joint: i}, ..., 'pose': {body: {}}}``."""
    spec = {'t': None, 'run': None, 'u': {}, 'pose': {}}
    spec.update({prefix: {} for prefix in JOINT_PREFIXES})
    for i, raw in enumerate(header):
        name = raw.strip()
        if name in ('t', 'run'):
            if spec[name] is not None:
                raise TableError(f'{path}: column {name!r} appears twice')
            spec[name] = i
            continue
        prefix, _, rest = name.partition(':')
        if prefix in JOINT_PREFIXES + ('u',) and rest:
            if rest in spec[prefix]:
                raise TableError(f'{path}: column {name!r} appears twice')
            spec[prefix][rest] = i
        elif prefix == 'pose' and rest.count(':') == 1 and rest.split(':')[1] in POSE_FIELDS:
            body, field = rest.split(':')
            spec['pose'].setdefault(body, {})[field] = i
        else:
            raise TableError(
                f'{path}: unknown column {name!r}; expected t, run, q:<joint>, qd:<joint>, '
                'qdd:<joint>, tau:<joint>, u:<name> or pose:<body>:<x|y|z|qx|qy|qz|qw>')
    if spec['t'] is None:
        raise TableError(f"{path}: missing the time column 't' (columns: {header})")
    if not spec['q']:
        raise TableError(f'{path}: no position columns q:<joint> (columns: {header})')
    return spec


def _joint_order(spec: dict, joint_names: Optional[Sequence[str]], path) -> tuple:
    """Return the joint order and check that optional joint columns are complete."""
    available = list(spec['q'])
    if joint_names is None:
        joints = tuple(available)
    else:
        joints = tuple(joint_names)
        missing = [j for j in joints if j not in spec['q']]
        if missing:
            raise TableError(f'{path}: no column q:<joint> for joint(s) {missing}; the table '
                             f'has joints {available}')
    for prefix in JOINT_PREFIXES[1:]:
        present = spec[prefix]
        if present:
            missing = [j for j in joints if j not in present]
            if missing:
                raise TableError(f'{path}: {prefix} columns are incomplete: missing '
                                 f'{", ".join(f"{prefix}:{j}" for j in missing)}')
    for body, fields in spec['pose'].items():
        missing = [f for f in POSE_FIELDS if f not in fields]
        if missing:
            raise TableError(f'{path}: pose of {body!r} lacks column(s) '
                             f'{", ".join(f"pose:{body}:{f}" for f in missing)}')
    return joints


def read_csv(path: PathLike, joint_names: Optional[Sequence[str]] = None,
             dtype: torch.dtype = torch.float64) -> List[Trajectory]:
    """
    Read trajectories from a CSV file following the module's column specification.

    :param path: the file.
    :param joint_names: joints to read, in this column order (default: the order of the
        ``q:`` columns); other joints in the file are ignored.
    :param dtype: floating dtype of the tensors.
    :return: one trajectory per run (a single one named after the file when there is no
        ``run`` column), in order of first appearance.
    :raises TableError: missing file, unknown or missing columns, non-numeric or non-finite
        cells, ragged rows, unsorted times.
    """
    path = Path(path)
    if not path.is_file():
        raise TableError(f'table {str(path)!r} does not exist')
    with path.open(newline='', encoding='utf-8') as stream:
        lines = [(number, row) for number, row in enumerate(csv.reader(stream), start=1)
                 if row and not row[0].lstrip().startswith('#')]
    if not lines:
        raise TableError(f'{path}: empty file (expected a header row)')
    header = lines[0][1]
    spec = _parse_header(header, path)
    joints = _joint_order(spec, joint_names, path)
    numeric = [i for i in range(len(header)) if i != spec['run']]
    rows, runs = [], []
    for number, row in lines[1:]:
        if len(row) != len(header):
            raise TableError(f'{path}, line {number}: {len(row)} cells, expected {len(header)}')
        values = np.empty(len(header))
        for i in numeric:
            try:
                values[i] = float(row[i])
            except ValueError:
                raise TableError(f'{path}, line {number}, column {header[i]!r}: not a number: '
                                 f'{row[i]!r}') from None
            if not np.isfinite(values[i]):
                raise TableError(f'{path}, line {number}, column {header[i]!r}: non-finite '
                                 f'value {row[i]!r}')
        rows.append(values)
        runs.append(row[spec['run']].strip() if spec['run'] is not None else path.stem)
    if not rows:
        raise TableError(f'{path}: no data rows')
    data = np.stack(rows)
    numbers = np.array([number for number, _ in lines[1:]])
    runs = np.array(runs)
    out = []
    for run in dict.fromkeys(runs.tolist()):
        mask = runs == run
        block = data[mask]
        t = block[:, spec['t']]
        bad = np.nonzero(np.diff(t) <= 0)[0]
        if bad.size:
            line = numbers[mask][bad[0] + 1]
            value = float(t[bad[0] + 1])
            raise TableError(f'{path}, line {line}: time {value!r} does not increase (run '
                             f'{run!r}); timestamps must be strictly increasing')

        def columns(prefix, names=joints):
            if not spec[prefix]:
                return None
            return torch.as_tensor(block[:, [spec[prefix][j] for j in names]], dtype=dtype)
        u = columns('u', list(spec['u'])) if spec['u'] else None
        poses = {}
        for body, fields in spec['pose'].items():
            values = block[:, [fields[f] for f in POSE_FIELDS]]
            T = np.zeros((len(block), 4, 4))
            T[:, :3, :3] = quaternion_to_matrix(values[:, [6, 3, 4, 5]])
            T[:, :3, 3] = values[:, :3]
            T[:, 3, 3] = 1.0
            poses[body] = torch.as_tensor(T, dtype=dtype)
        out.append(Trajectory(t=torch.as_tensor(t, dtype=dtype), q=columns('q'),
                              joint_names=joints, qd=columns('qd'), qdd=columns('qdd'),
                              tau=columns('tau'), u=u, poses=poses, run=run))
    return out


def write_csv(path: PathLike, trajectories: Union[Trajectory, Sequence[Trajectory]],
              command_names: Optional[Sequence[str]] = None) -> Path:
    """
    Write trajectories to one CSV file (the module's column specification, 17 digits).

    :param path: the file to write (overwritten).
    :param trajectories: one trajectory or several with the same joints and signals; a
        ``run`` column is written when there are several or a run has a name.
    :param command_names: names for the ``u:`` columns (default ``u:0``, ``u:1``, ...).
    :return: the path.
    :raises TableError: trajectories with different joints or signals.
    """
    trajs = [trajectories] if isinstance(trajectories, Trajectory) else list(trajectories)
    if not trajs:
        raise TableError('write_csv: no trajectories to write')
    first = trajs[0]
    signature = _signature(first)
    for traj in trajs[1:]:
        if _signature(traj) != signature:
            raise TableError(f'write_csv: run {traj.run!r} has joints/signals '
                             f'{_signature(traj)}, expected {signature} like {first.run!r}')
    m = 0 if first.u is None else first.u.shape[1]
    names = list(command_names) if command_names is not None else [str(i) for i in range(m)]
    if len(names) != m:
        raise TableError(f'write_csv: {len(names)} command names for {m} command columns')
    with_run = len(trajs) > 1 or bool(first.run)
    header = (['run'] if with_run else []) + ['t']
    for prefix in JOINT_PREFIXES:
        if getattr(first, prefix) is not None:
            header += [f'{prefix}:{j}' for j in first.joint_names]
    header += [f'u:{name}' for name in names]
    for body in first.poses:
        header += [f'pose:{body}:{field}' for field in POSE_FIELDS]
    path = Path(path)
    with path.open('w', newline='', encoding='utf-8') as stream:
        writer = csv.writer(stream, lineterminator='\n')
        writer.writerow(header)
        for traj in trajs:
            blocks = [traj.t.detach().cpu().double().numpy()[:, None]]
            for prefix in JOINT_PREFIXES + ('u',):
                value = getattr(traj, prefix)
                if value is not None:
                    blocks.append(value.detach().cpu().double().numpy())
            for pose in traj.poses.values():
                T = pose.detach().cpu().double().numpy()
                quat = matrix_to_quaternion(T[:, :3, :3])
                blocks.append(np.concatenate([T[:, :3, 3], quat[:, [1, 2, 3, 0]]], axis=1))
            data = np.concatenate(blocks, axis=1)
            for row in data:
                cells = [repr(float(v)) for v in row]
                writer.writerow(([traj.run] if with_run else []) + cells)
    return path


def _signature(traj: Trajectory) -> tuple:
    """Return what must agree between trajectories written to one table."""
    present = tuple(name for name in JOINT_PREFIXES if getattr(traj, name) is not None)
    m = None if traj.u is None else traj.u.shape[1]
    return traj.joint_names, present, m, tuple(traj.poses)


# --------------------------------------------------------------------------------------
# NPZ
# --------------------------------------------------------------------------------------
def write_npz(path: PathLike, traj: Trajectory) -> Path:
    """
    Write one trajectory to an ``.npz`` file (layout in the module docstring).

    :param path: the file to write (NumPy appends ``.npz`` when missing).
    :param traj: the trajectory.
    :return: the written file's path.
    """
    arrays = {'t': traj.t, 'q': traj.q, 'joint_names': np.array(traj.joint_names, dtype=str),
              'run': np.array(traj.run, dtype=str)}
    for name in ('qd', 'qdd', 'tau', 'u'):
        if getattr(traj, name) is not None:
            arrays[name] = getattr(traj, name)
    if traj.poses:
        arrays['pose_names'] = np.array(list(traj.poses), dtype=str)
        arrays['poses'] = torch.stack(list(traj.poses.values()))
    arrays = {key: value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value
              for key, value in arrays.items()}
    path = Path(path)
    if path.suffix != '.npz':
        path = path.with_name(path.name + '.npz')
    np.savez(path, **arrays)
    return path


def read_npz(path: PathLike, joint_names: Optional[Sequence[str]] = None,
             dtype: torch.dtype = torch.float64) -> Trajectory:
    """
    Read one trajectory from an ``.npz`` file (layout in the module docstring).

    :param path: the file.
    :param joint_names: reorder/select joints by name (default: the file's order).
    :param dtype: floating dtype of the tensors.
    :return: the trajectory (run name from the file, else the file stem).
    :raises TableError: missing file or arrays, bad shapes, non-finite values, pickled data.
    """
    path = Path(path)
    if not path.is_file():
        raise TableError(f'table {str(path)!r} does not exist')
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise TableError(f'{path}: not a readable .npz archive: {exc}') from exc
    missing = [key for key in ('t', 'q', 'joint_names') if key not in arrays]
    if missing:
        raise TableError(f'{path}: missing array(s) {missing}; found {sorted(arrays)}')
    names = tuple(str(name) for name in np.atleast_1d(arrays['joint_names']).tolist())
    run = str(arrays['run']) if 'run' in arrays else path.stem
    for key, value in arrays.items():
        if key in ('joint_names', 'run', 'pose_names'):
            continue
        if not np.issubdtype(value.dtype, np.number) or np.iscomplexobj(value):
            raise TableError(f'{path}: array {key!r} is not real numbers ({value.dtype})')
        if not np.isfinite(value).all():
            bad = np.argwhere(~np.isfinite(value))[0].tolist()
            raise TableError(f'{path}: array {key!r} holds NaN or inf (first at index {bad})')

    def tensor(key):
        return torch.as_tensor(arrays[key], dtype=dtype) if key in arrays else None
    poses = {}
    if 'poses' in arrays:
        bodies = [str(b) for b in np.atleast_1d(arrays.get('pose_names', np.array([]))).tolist()]
        stacked = arrays['poses']
        if stacked.ndim != 4 or stacked.shape[0] != len(bodies):
            raise TableError(f'{path}: poses: expected shape ({len(bodies)}, T, 4, 4) matching '
                             f'pose_names, got {stacked.shape}')
        poses = {body: torch.as_tensor(stacked[i], dtype=dtype) for i, body in enumerate(bodies)}
    try:
        traj = Trajectory(t=tensor('t'), q=tensor('q'), joint_names=names, qd=tensor('qd'),
                          qdd=tensor('qdd'), tau=tensor('tau'), u=tensor('u'), poses=poses,
                          run=run)
    except ValueError as exc:   # ShapeError and unsorted times
        raise TableError(f'{path}: {exc}') from exc
    if joint_names is not None:
        try:
            traj = traj.reorder(joint_names)
        except KeyError as exc:
            raise TableError(f'{path}: {exc.args[0]}') from None
    return traj
