"""
Loaders for the real-robot recordings in the shared data folder (see its ``INDEX.md``).

Each loader takes either the data root (the folder holding ``INDEX.md``) or the dataset's
own folder, reads the files in place (they are never copied) and returns a list of
:class:`~diffsim_ros.sysid.dataset.Trajectory`, one per recorded run, with joint columns named
and ordered like the matching robot of :mod:`diffsim_ros.robots`.  The angle conventions of
every dataset already equal those of the shipped URDFs (0 = hanging down for the pendulums;
signs checked against the models' inverse dynamics in ``test/test_real_datasets.py``), so no
sign flips or offsets are applied.

Run names are ``<robot>/<kind>/<group>/<file stem>``, where ``kind`` tells how the robot was
driven; :func:`run_kind` extracts it:

* :func:`load_qube_runs` (``qube``): ``chirp`` (open-loop voltage chirp), ``swingup``
  (energy-based swing-up and stabilisation, closed loop);
* :func:`load_cartpole_runs` (``cartpole``): ``chirp``, ``swingup``;
* :func:`load_panda_excitation` (``panda``): ``excitation`` (5-harmonic Fourier trajectory);
* :func:`load_dfki_simple_pendulum` (``simple_pendulum``): ``excitation`` (Fourier trajectory
  under PD control);
* :func:`load_dfki_double_pendulum` (``double_pendulum``): ``sine`` (open-loop sine torques on
  both joints), ``sine_passive1`` / ``sine_passive2`` (joint 1 / 2 left unactuated),
  ``tracking`` (reference tracking towards the upright pose), ``swingup`` (pendubot TVLQR
  swing-up and LQR stabilisation).

Signals: ``q`` as recorded; ``qd`` the velocities the robot reported (Quanser: filtered by
``50 s / (s + 50)``, about 20 ms late; prefer :func:`diffsim_ros.sysid.filters.
estimate_derivatives`, which replaces them); ``tau`` measured joint torques where the robot
has them; ``u`` the commands where they differ from ``tau`` (Quanser voltage, DFKI commanded
torque).  Licences: see each folder's ``SOURCE.md`` (the Panda data is GPL-3.0).
"""

import csv
from pathlib import Path
from typing import List, Optional, Sequence, Union

import numpy as np
import torch

from ..core.errors import DiffsimError
from ..sysid.dataset import Trajectory
from ..sysid.filters import estimate_derivatives

__all__ = ['DATASETS', 'DatasetError', 'load_cartpole_runs', 'load_dfki_double_pendulum',
           'load_dfki_simple_pendulum', 'load_ibm_double_pendulum', 'load_panda_excitation',
           'load_qube_runs', 'run_kind']

PathLike = Union[str, Path]

#: Dataset folder names in the shared data root, by loader robot.
DATASETS = {
    'qube': 'quanser_qube_pyrado',
    'cartpole': 'quanser_cartpole_pyrado',
    'panda': 'panda_gaz2019_excitation',
    'simple_pendulum': 'dfki_simple_pendulum',
    'double_pendulum': 'dfki_double_pendulum',
}


class DatasetError(DiffsimError, ValueError):
    """A dataset folder or one of its files is missing or unreadable."""


def run_kind(run: str) -> str:
    """
    Return the kind of a run from its name (``'chirp'``, ``'swingup'``, ...).

    :param run: a run name made by the loaders, ``<robot>/<kind>/<group>/<stem>``.
    :return: the kind, or ``''`` for names of another form.
    """
    parts = run.split('/')
    return parts[1] if len(parts) >= 4 else ''


def _folder(data_dir: PathLike, name: str) -> Path:
    """Return the dataset folder, given the data root or the folder itself."""
    root = Path(data_dir)
    if root.name == name and root.is_dir():
        return root
    if (root / name).is_dir():
        return root / name
    raise DatasetError(f'dataset folder {name!r} not found under {str(root)!r} (pass the '
                       'shared data root holding INDEX.md, or the dataset folder itself)')


def _read_table(path: Path) -> dict:
    """Read a numeric CSV with a header row into ``{column: float64 array}`` (empty -> NaN)."""
    try:
        with path.open(newline='', encoding='utf-8') as stream:
            rows = list(csv.reader(stream))
    except OSError as exc:
        raise DatasetError(f'cannot read {path}: {exc}') from exc
    if len(rows) < 2:
        raise DatasetError(f'{path}: no data rows')
    header = [name.strip() for name in rows[0]]
    try:
        data = np.array([[float(cell) if cell.strip() else np.nan for cell in row]
                         for row in rows[1:]], dtype=np.float64)
    except ValueError as exc:
        raise DatasetError(f'{path}: non-numeric cell: {exc}') from exc
    return {name: data[:, i] for i, name in enumerate(header)}


def _tensor(x, dtype: torch.dtype) -> torch.Tensor:
    return torch.as_tensor(np.ascontiguousarray(x), dtype=dtype)


def _quanser_runs(folder: Path, robot: str, joints: tuple, columns: tuple, prefix: str,
                  kinds: Optional[Sequence[str]], unwrap: Sequence[int],
                  dtype: torch.dtype) -> List[Trajectory]:
    """Load Pyrado rollouts; the last row (no input) is dropped."""
    runs = []
    for group in sorted(p for p in folder.iterdir() if p.is_dir()):
        kind = 'chirp' if '_chrip_' in group.name or '_chirp_' in group.name else 'swingup'
        if not group.name.startswith(prefix) or (kinds is not None and kind not in kinds):
            continue
        for file in sorted(group.glob('*.csv')):
            table = _read_table(file)
            missing = [c for c in ('t_s',) + columns + ('u_applied_V',) if c not in table]
            if missing:
                raise DatasetError(f'{file}: missing column(s) {missing}')
            u = table['u_applied_V']
            keep = np.isfinite(u)   # the last row carries no input
            q = np.stack([table[c] for c in columns[:2]], axis=1)[keep]
            for column in unwrap:
                q[:, column] = np.unwrap(q[:, column])
            qd = np.stack([table[c] for c in columns[2:]], axis=1)[keep]
            runs.append(Trajectory(
                t=_tensor(table['t_s'][keep], dtype), q=_tensor(q, dtype), joint_names=joints,
                qd=_tensor(qd, dtype), u=_tensor(u[keep, None], dtype),
                run=f'{robot}/{kind}/{group.name}/{file.stem}'))
    if not runs:
        raise DatasetError(f'no rollouts of kind {kinds} in {folder}')
    return runs


def load_qube_runs(data_dir: PathLike, kinds: Optional[Sequence[str]] = None,
                   dtype: torch.dtype = torch.float64) -> List[Trajectory]:
    """
    Load the Quanser Qube-Servo 2 rollouts (Pyrado, 250/500 Hz, 40 runs).

    Joints ``arm_joint`` (theta, rad, 0 = centre of the arm's range) and ``pendulum_joint``
    (alpha, rad, 0 = hanging down, upright at +-pi, continuous); ``qd`` is the QUARC-filtered
    velocity; ``u`` ``(T, 1)`` is the applied motor voltage in V, acting on ``[t_k, t_{k+1})``
    (the recordings' last row, which has no input, is dropped).  No torque is measured.

    :param data_dir: shared data root or the ``quanser_qube_pyrado`` folder.
    :param kinds: subset of ``('chirp', 'swingup')`` (default both).
    :param dtype: floating dtype.
    :return: trajectories named ``qube/<kind>/<group>/<stem>``, sorted by group and time.
    :raises DatasetError: missing folder or files.
    """
    folder = _folder(data_dir, DATASETS['qube'])
    return _quanser_runs(folder, 'qube', ('arm_joint', 'pendulum_joint'),
                         ('theta_rad', 'alpha_rad', 'theta_dot_rad_s', 'alpha_dot_rad_s'),
                         'qq', kinds, (), dtype)


def load_cartpole_runs(data_dir: PathLike, kinds: Optional[Sequence[str]] = None,
                       dtype: torch.dtype = torch.float64) -> List[Trajectory]:
    """
    Load the Quanser IP02 cart-pole rollouts (Pyrado, 250 Hz, 15 runs).

    Joints ``cart_joint`` (x, m, 0 = rail centre) and ``pole_joint`` (theta, rad, 0 = hanging
    down, upright at +-pi).  The recorded pole angle is wrapped to ``[-pi, pi)``; it is
    unwrapped here so that it is continuous.  ``qd`` is the QUARC-filtered velocity; ``u``
    ``(T, 1)`` is the applied motor voltage in V (last row without input dropped).  The first
    row of every run is dropped too: it holds a stale cart position (its finite difference
    implies 1 to 24 m/s where the recorded velocity and the next difference say about
    0.2 m/s), which a derivative filter would smear over ten samples.

    :param data_dir: shared data root or the ``quanser_cartpole_pyrado`` folder.
    :param kinds: subset of ``('chirp', 'swingup')`` (default both).
    :param dtype: floating dtype.
    :return: trajectories named ``cartpole/<kind>/<group>/<stem>``.
    :raises DatasetError: missing folder or files.
    """
    folder = _folder(data_dir, DATASETS['cartpole'])
    runs = _quanser_runs(folder, 'cartpole', ('cart_joint', 'pole_joint'),
                         ('x_m', 'theta_rad', 'x_dot_m_s', 'theta_dot_rad_s'), 'qcp', kinds,
                         (1,), dtype)
    return [run.crop(1, len(run)) for run in runs]


def load_panda_excitation(data_dir: PathLike,
                          dtype: torch.dtype = torch.float64) -> List[Trajectory]:
    """
    Load the Franka Panda exciting trajectory of Gaz et al. 2019 (21 s, about 1 kHz).

    Joints ``panda_joint1`` ... ``panda_joint7``; ``q`` link-side positions (rad), ``qd`` the
    velocities libfranka reported, ``tau`` the torques measured by the joint torque sensors
    (N m, gravity included, as measured).  Timestamps are non-uniform (0.7 to 8.8 ms).

    :param data_dir: shared data root or the ``panda_gaz2019_excitation`` folder.
    :param dtype: floating dtype.
    :return: a one-element list, run ``panda/excitation/gaz2019/exciting_traj_measured``
        (split it by time with :func:`diffsim_ros.sysid.preprocess.split_time`).
    :raises DatasetError: missing folder or file.
    """
    folder = _folder(data_dir, DATASETS['panda'])
    file = folder / 'exciting_traj_measured.csv'
    if not file.is_file():
        raise DatasetError(f'{file} not found')
    table = _read_table(file)
    joints = tuple(f'panda_joint{i}' for i in range(1, 8))

    def block(pattern):
        names = [pattern.format(i) for i in range(1, 8)]
        missing = [n for n in names if n not in table]
        if missing:
            raise DatasetError(f'{file}: missing column(s) {missing}')
        return _tensor(np.stack([table[n] for n in names], axis=1), dtype)
    return [Trajectory(t=_tensor(table['t_s'], dtype), q=block('q{}_rad'), joint_names=joints,
                       qd=block('dq{}_rad_s'), tau=block('tau{}_Nm'),
                       run='panda/excitation/gaz2019/exciting_traj_measured')]


def load_dfki_simple_pendulum(data_dir: PathLike, dtype: torch.dtype = torch.float64
                              ) -> List[Trajectory]:
    """
    Load the DFKI torque-limited simple pendulum identification record (about 300 Hz, 3.9 s).

    Joint ``pendulum_joint`` (rad, 0 = hanging down); ``qd`` measured velocity; ``tau`` the
    measured motor torque (N m).  The pendulum tracked a Fourier excitation under PD control;
    the desired trajectory (``sysid_data_desired.csv``) is not loaded.

    :param data_dir: shared data root or the ``dfki_simple_pendulum`` folder.
    :param dtype: floating dtype.
    :return: a one-element list, run ``simple_pendulum/excitation/sysid/sysid_data_measured``.
    :raises DatasetError: missing folder or file.
    """
    folder = _folder(data_dir, DATASETS['simple_pendulum'])
    file = folder / 'sysid_data_measured.csv'
    if not file.is_file():
        raise DatasetError(f'{file} not found')
    table = _read_table(file)
    return [Trajectory(t=_tensor(table['time'], dtype),
                       q=_tensor(table['position'][:, None], dtype),
                       joint_names=('pendulum_joint',),
                       qd=_tensor(table['velocity'][:, None], dtype),
                       tau=_tensor(table['torque'][:, None], dtype),
                       run=f'simple_pendulum/excitation/sysid/{file.stem}')]


def _double_pendulum_kind(arrays, group: str) -> str:
    """Classify a DFKI double-pendulum record by how it was driven."""
    if group == 'swingup':
        return 'swingup'
    if 'pos_des1' in arrays:
        return 'tracking'
    for joint in (1, 2):
        if not np.any(arrays[f'tau_con{joint}']):
            return f'sine_passive{joint}'
    return 'sine'


def load_dfki_double_pendulum(data_dir: PathLike, design: str = 'A.0',
                              kinds: Optional[Sequence[str]] = None,
                              dtype: torch.dtype = torch.float64) -> List[Trajectory]:
    """
    Load the DFKI double-pendulum records (about 400 to 650 Hz, 6 to 20 s each).

    Joints ``shoulder_joint``, ``elbow_joint`` (rad, from the free-hanging position, the
    elbow relative to the upper link); ``qd`` measured velocities; ``tau`` the measured motor
    torques (current x torque constant, N m); ``u`` ``(T, 2)`` the commanded torques in N m.
    The shipped ``double_pendulum`` robot is design A.0 (l1 = 0.3 m, l2 = 0.2 m); design C.0
    (l1 = 0.2 m, l2 = 0.3 m) has the same joints but other link lengths.

    :param data_dir: shared data root or the ``dfki_double_pendulum`` folder.
    :param design: ``'A.0'`` (system identification records and the three pendubot swing-ups)
        or ``'C.0'`` (system identification records only).
    :param kinds: subset of ``('sine', 'sine_passive1', 'sine_passive2', 'tracking',
        'swingup')`` (default all).
    :param dtype: floating dtype.
    :return: trajectories named ``double_pendulum/<kind>/design_<design>_<group>/<stem>``.
    :raises DatasetError: missing folder/files or an unknown design.
    """
    if design not in ('A.0', 'C.0'):
        raise DatasetError(f'unknown DFKI double-pendulum design {design!r}; valid: A.0, C.0')
    folder = _folder(data_dir, DATASETS['double_pendulum'])
    files = [('sysid', f) for f in sorted((folder / f'design_{design}_sysid_records')
                                          .glob('trajectory_*.npz'))]
    files += [('swingup', f) for f in sorted((folder / 'swingup_records')
                                             .glob(f'design_{design}_*.npz'))
              if not f.stem.endswith('_init_trajectory')]   # a plan, not a recording
    if not files:
        raise DatasetError(f'no records of design {design} in {folder}')
    runs = []
    for group, file in files:
        with np.load(file, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
        kind = _double_pendulum_kind(arrays, group)
        if kinds is not None and kind not in kinds:
            continue

        def pair(name):
            return _tensor(np.stack([arrays[f'{name}1'], arrays[f'{name}2']], axis=1), dtype)
        runs.append(Trajectory(t=_tensor(arrays['time'], dtype), q=pair('pos_meas'),
                               joint_names=('shoulder_joint', 'elbow_joint'),
                               qd=pair('vel_meas'), tau=pair('tau_meas'), u=pair('tau_con'),
                               run=f'double_pendulum/{kind}/design_{design}_{group}/'
                                   f'{file.stem}'))
    if not runs:
        raise DatasetError(f'no records of kind {kinds} for design {design} in {folder}')
    return runs


#: Folder of the IBM double-pendulum video data set in the shared data root.
IBM_DOUBLE_PENDULUM = 'ibm_double_pendulum_chaotic'
#: Camera frame rate of the IBM recordings, Hz.
IBM_RATE_HZ = 400.0
#: Published pivot-to-elbow marker distance (Asseman et al. 2018), m: sets each run's scale.
IBM_LINK_1_LENGTH = 0.091


def load_ibm_double_pendulum(data_dir: PathLike, runs: Optional[Sequence[int]] = None,
                             cutoff_hz: float = 30.0, max_samples: Optional[int] = None,
                             dtype: torch.dtype = torch.float64) -> List[Trajectory]:
    """
    Load the IBM chaotic double-pendulum video runs (400 Hz marker tracks, 21 runs).

    Joint angles come from the three marker pixel tracks (red pivot, green elbow, blue tip).
    Gravity points along image **+x** in these videos (every run settles with the elbow at
    +x of the pivot; the folder's SOURCE.md says +y, which contradicts the data), so
    ``q1 = atan2(dy, dx)`` of the pivot-to-elbow pixel vector (0 = hanging down) and ``q2``
    the same angle of the elbow-to-tip vector minus ``q1``, both unwrapped; the sign (towards
    image +y) is a free choice, a mirrored pendulum has the same dynamics.  That is the
    convention of :mod:`diffsim_ros.sysid.double_pendulum` (joints ``joint_1``, ``joint_2``,
    world x = image y, world z = -image x).  Velocities and accelerations come from
    :func:`diffsim_ros.sysid.filters.estimate_derivatives` (zero-phase 4th-order Butterworth
    at ``cutoff_hz``; the angle spectra fall to the tracking-noise floor of about 1 mrad by
    25 Hz).  The pendulum is unactuated: ``u`` is a zero column and ``tau`` is None.
    ``poses`` holds the elbow and tip markers (``'elbow_marker'``, ``'tip_marker'``) relative
    to the pivot marker in metres in the world x-z plane, translation-only transforms; the
    pixel scale of each run is its median pivot-to-elbow pixel distance over the published
    ``l1 = 0.091 m`` (602 px in runs 0-1, 589 px in runs 2-20: the camera moved), so the
    elbow-to-tip distance it implies (about 0.0697 m) checks the published 0.070 m.

    :param data_dir: shared data root or the ``ibm_double_pendulum_chaotic`` folder.
    :param runs: run indices in ``0..20`` (default all).
    :param cutoff_hz: derivative low-pass cutoff in Hz.
    :param max_samples: keep only the first samples of each run (default all, ~44 s).
    :param dtype: floating dtype.
    :return: trajectories named ``ibm_double_pendulum/release/dpc/run_NN``, ``t`` from 0 s.
    :raises DatasetError: missing folder, file or run.
    """
    folder = _folder(data_dir, IBM_DOUBLE_PENDULUM)
    file = folder / 'dpc_all_runs_pixels.npz'
    if not file.is_file():
        raise DatasetError(f'{file} not found')
    out = []
    with np.load(file, allow_pickle=False) as archive:
        available = sorted(int(k[4:]) for k in archive.files if k.startswith('run_'))
        wanted = available if runs is None else [int(r) for r in runs]
        missing = [r for r in wanted if r not in available]
        if missing:
            raise DatasetError(f'{file}: no run(s) {missing}; available {available}')
        for index in wanted:
            pixels = archive[f'run_{index:02d}'].astype(np.float64)[:max_samples]
            if pixels.ndim != 2 or pixels.shape[1] != 6 or pixels.shape[0] < 32:
                raise DatasetError(f'{file}: run_{index:02d} has shape {pixels.shape}, '
                                   'expected (N >= 32, 6)')
            elbow = pixels[:, 2:4] - pixels[:, 0:2]
            tip = pixels[:, 4:6] - pixels[:, 2:4]
            q1 = np.unwrap(np.arctan2(elbow[:, 1], elbow[:, 0]))
            q2 = np.unwrap(np.arctan2(tip[:, 1], tip[:, 0]) - q1)
            metres_per_pixel = IBM_LINK_1_LENGTH / np.median(np.hypot(*elbow.T))

            def pose(offset):
                T = np.tile(np.eye(4), (len(offset), 1, 1))
                T[:, 0, 3] = offset[:, 1] * metres_per_pixel
                T[:, 2, 3] = -offset[:, 0] * metres_per_pixel
                return _tensor(T, dtype)
            traj = Trajectory(
                t=_tensor(np.arange(len(pixels)) / IBM_RATE_HZ, dtype),
                q=_tensor(np.stack([q1, q2], axis=1), dtype), joint_names=('joint_1', 'joint_2'),
                u=torch.zeros(len(pixels), 1, dtype=dtype),
                poses={'elbow_marker': pose(elbow), 'tip_marker': pose(elbow + tip)},
                run=f'ibm_double_pendulum/release/dpc/run_{index:02d}')
            out.append(estimate_derivatives(traj, 'filtfilt', cutoff_hz=cutoff_hz))
    return out
