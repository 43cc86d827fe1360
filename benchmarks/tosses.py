"""
Real tosses with nominal parameters: our floating model and MuJoCo against the recordings.

(a) DAIR elbow, free flight before first contact: from every measured state whose next 8
    samples are still in free flight, roll out 8 steps (RK4 at the recording's dt, no
    contact) with our floating model and with MuJoCo from the same URDF, and compare with the
    recording at step 8: position of elbow_1's frame (m), geodesic orientation (rad), hinge
    angle (rad); beside them a prediction without forces (constant velocity).  First
    contact is the first sample whose lowest box corner is below ``--contact-margin``
    (1 cm by default; the table is z = 0, every toss ends at exactly 0).
(b) ContactNets cube, whole tosses (release to rest) from the second recorded state with
    nominal parameters (0.37 kg, mu 0.18, edge 0.1048 m): MuJoCo (its default soft contact,
    10 substeps per sample; restitution is not a MuJoCo parameter), and our complementarity
    contact step (``diffsim_ros.core.contact_step``, eight vertices, restitution 0.125 as
    ContactNets' nominal model; ``--ours-substeps`` steps per sample, default 1 as ContactNets
    simulates), all tosses in one batch; position and orientation error at every sample.
Per toss, errors are averaged over its windows (a) or samples (b); the tables give the mean,
median and 90th percentile over tosses.  ``--quick`` reads a few tosses.
"""

import os
from pathlib import Path
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch

try:
    from benchmarks import _common
except ImportError:  # run as ``python benchmarks/tosses.py``
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks import _common

from diffsim_ros import core  # noqa: I100
from diffsim_ros.core.configuration import free_joint_from_mujoco, free_joint_to_mujoco
from diffsim_ros.io.tosses import (CUBE_HALF_WIDTH_M, load_cube_tosses, load_elbow_tosses,
                                   TossSet)
from diffsim_ros.sysid.contact_learning import rollout as contact_rollout

HORIZON = 8
CONTACT_MARGIN_M = 0.01
#: MuJoCo substeps per recorded sample in the whole-toss contact rollouts (0.68 ms steps:
#: 30x below MuJoCo's default contact time constant of 0.02 s).
CONTACT_SUBSTEPS = 10
QUICK_TOSSES = 6


def geodesic_angle(quat_a: torch.Tensor, quat_b: torch.Tensor) -> torch.Tensor:
    """
    Return the rotation angle between orientations.

    :param quat_a: unit quaternions ``(..., 4)`` (x, y, z, w).
    :param quat_b: unit quaternions ``(..., 4)``.
    :return: angles ``(...)`` in ``[0, pi]`` rad.
    """
    relative = core.quat_multiply(core.quat_conjugate(quat_a), quat_b)
    return core.quat_log(relative).norm(dim=-1)


def mujoco_model(tosses: TossSet, timestep: float, contact: bool):
    """
    Build MuJoCo's model of a toss object from its URDF: free joint, RK4, optional floor.

    :param tosses: the data set (its URDF and nominal friction).
    :param timestep: MuJoCo step in s.
    :param contact: add the table (plane z = 0) and enable contact.
    :return: ``mujoco.MjModel``.
    """
    import mujoco
    spec = mujoco.MjSpec.from_string(tosses.urdf_path.read_text(encoding='utf-8'))
    spec.worldbody.first_body().add_freejoint()
    spec.option.timestep = timestep
    spec.option.integrator = mujoco.mjtIntegrator.mjINT_RK4
    spec.option.gravity = [0.0, 0.0, -9.81]
    if contact:
        spec.worldbody.add_geom(type=mujoco.mjtGeom.mjGEOM_PLANE, size=[5.0, 5.0, 0.1])
    else:
        spec.option.disableflags |= mujoco.mjtDisableBit.mjDSBL_CONTACT
    for geom in spec.geoms:
        geom.friction = [tosses.friction, 0.005, 0.0001]
    return spec.compile()


def box_corners(mj_model) -> List[tuple]:
    """Return ``(geom id, (8, 3) corners in the geom frame)`` for every box geom."""
    import mujoco
    signs = np.array([[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)], float)
    return [(g, signs * mj_model.geom_size[g]) for g in range(mj_model.ngeom)
            if mj_model.geom_type[g] == mujoco.mjtGeom.mjGEOM_BOX]


def lowest_height(mj_model, qpos: np.ndarray) -> np.ndarray:
    """
    Return the height of the lowest box corner of each configuration (MuJoCo kinematics).

    :param mj_model: the object's MuJoCo model.
    :param qpos: ``(T, nq)`` MuJoCo configurations.
    :return: ``(T,)`` in m.
    """
    import mujoco
    data = mujoco.MjData(mj_model)
    boxes = box_corners(mj_model)
    heights = np.empty(len(qpos))
    for k, row in enumerate(qpos):
        data.qpos[:] = row
        mujoco.mj_kinematics(mj_model, data)
        heights[k] = min((data.geom_xmat[g].reshape(3, 3) @ corners.T)[2].min()
                         + data.geom_xpos[g][2] for g, corners in boxes)
    return heights


def free_flight_windows(tosses: TossSet, margin: float) -> Dict[str, Any]:
    """
    Find every 8-step window before first contact.

    Sample 0 is skipped: its velocity is a repeated backward difference.

    :param tosses: the elbow tosses.
    :param margin: first contact = first sample with the lowest corner below this (m).
    :return: ``starts`` (toss index, start sample) pairs, ``contact`` index per toss.
    """
    mj_model = mujoco_model(tosses, tosses.dt, contact=False)
    starts, contact = [], []
    for i, (q, v) in enumerate(zip(tosses.q, tosses.v)):
        qpos, _ = free_joint_to_mujoco(q, v)
        below = np.nonzero(lowest_height(mj_model, qpos.numpy()) < margin)[0]
        first = int(below[0]) if below.size else len(q)
        contact.append(first)
        starts += [(i, s) for s in range(1, first - HORIZON)]
    return {'starts': starts, 'contact': contact}


def elbow_targets(tosses: TossSet, starts: Sequence[tuple]) -> Dict[str, torch.Tensor]:
    """Stack the start states and the recorded states 8 samples later."""
    x0 = torch.stack([torch.cat((tosses.q[i][s], tosses.v[i][s])) for i, s in starts])
    q_end = torch.stack([tosses.q[i][s + HORIZON] for i, s in starts])
    return {'x0': x0, 'q_end': q_end}


def floating_model(tosses: TossSet) -> core.RobotModel:
    """Return our floating model of the object (its URDF, ``floating_base=True``)."""
    return core.load_urdf(xml=tosses.urdf_path.read_text(encoding='utf-8'),
                          dtype=torch.float64, floating_base=True)


def rollout_ours(model, x0: torch.Tensor, dt: float) -> torch.Tensor:
    """
    Roll our floating model out ``HORIZON`` steps (RK4 at the recording's dt).

    :param model: the object's floating model.
    :param x0: start states ``(W, nq + nv)``.
    :param dt: step in s.
    :return: end configurations ``(W, nq)``.
    """
    controls = torch.zeros(x0.shape[0], HORIZON, int(model.nv), dtype=torch.float64)
    with torch.no_grad():
        states = core.rollout(model, x0, controls, dt, method='rk4')
    return states[:, -1, :int(model.nq)]


def constant_velocity(model, x0: torch.Tensor, dt: float) -> torch.Tensor:
    """
    Predict without forces: every coordinate keeps its start velocity for ``HORIZON`` steps.

    The reference that shows what gravity and the rigid-body dynamics add.

    :return: end configurations ``(W, nq)``.
    """
    nq = int(model.nq)
    return core.integrate(model, x0[:, :nq], x0[:, nq:], HORIZON * dt)


def rollout_mujoco(mj_model, x0: torch.Tensor, steps: int, substeps: int = 1) -> torch.Tensor:
    """
    Roll MuJoCo out from our states, recording every ``substeps`` steps.

    :param mj_model: the object's model.
    :param x0: start states ``(W, nq + nv)`` in our layout.
    :param steps: recorded samples after the start.
    :param substeps: MuJoCo steps per recorded sample.
    :return: configurations ``(W, steps, nq)`` in our layout.
    """
    import mujoco
    nq = mj_model.nq
    data = mujoco.MjData(mj_model)
    qpos0, qvel0 = free_joint_to_mujoco(x0[:, :nq], x0[:, nq:])
    out = np.empty((x0.shape[0], steps, nq))
    out_v = np.empty((x0.shape[0], steps, mj_model.nv))
    for w in range(x0.shape[0]):
        mujoco.mj_resetData(mj_model, data)
        data.qpos[:], data.qvel[:] = qpos0[w].numpy(), qvel0[w].numpy()
        for k in range(steps):
            for _ in range(substeps):
                mujoco.mj_step(mj_model, data)
            out[w, k], out_v[w, k] = data.qpos, data.qvel
    q, _ = free_joint_from_mujoco(torch.from_numpy(out), torch.from_numpy(out_v))
    return q


def summarize(per_toss: Sequence[float]) -> Dict[str, Optional[float]]:
    """Return mean, median and 90th percentile over tosses (None when empty)."""
    if len(per_toss) == 0:
        return {'mean': None, 'median': None, 'p90': None}
    values = np.asarray(per_toss, float)
    return {'mean': float(values.mean()), 'median': float(np.median(values)),
            'p90': float(np.percentile(values, 90))}


def per_toss_mean(errors: torch.Tensor, toss_of: np.ndarray) -> List[float]:
    """Average window errors over the windows of each toss."""
    return [float(errors[toss_of == t].mean()) for t in np.unique(toss_of)]


def elbow_study(data: Path, limit: Optional[int], margin: float) -> Dict[str, Any]:
    """Run (a): 8-step free-flight rollouts of the elbow, ours and MuJoCo's."""
    tosses = load_elbow_tosses(data, limit=limit)
    windows = free_flight_windows(tosses, margin)
    toss_of = np.array([i for i, _ in windows['starts']])
    targets = elbow_targets(tosses, windows['starts'])
    engines = {}
    model = floating_model(tosses)
    start = time.perf_counter()
    predicted = {'ours': rollout_ours(model, targets['x0'], tosses.dt)}
    engines['ours_s'] = time.perf_counter() - start
    predicted['constant_velocity'] = constant_velocity(model, targets['x0'], tosses.dt)
    start = time.perf_counter()
    mj_model = mujoco_model(tosses, tosses.dt, contact=False)
    predicted['mujoco'] = rollout_mujoco(mj_model, targets['x0'], HORIZON)[:, -1]
    engines['mujoco_s'] = time.perf_counter() - start
    rows = {}
    for name, q_end in predicted.items():
        true = targets['q_end']
        errors = {'position_m': (q_end[:, :3] - true[:, :3]).norm(dim=-1),
                  'orientation_rad': geodesic_angle(q_end[:, 3:7], true[:, 3:7]),
                  'hinge_rad': (q_end[:, 7] - true[:, 7]).abs()}
        rows[name] = {key: summarize(per_toss_mean(value, toss_of))
                      for key, value in errors.items()}
    rows['ours_vs_mujoco_max'] = {
        'position_m': float((predicted['ours'][:, :3] - predicted['mujoco'][:, :3])
                            .norm(dim=-1).max()),
        'orientation_rad': float(geodesic_angle(predicted['ours'][:, 3:7],
                                                predicted['mujoco'][:, 3:7]).max())}
    contact = np.array(windows['contact'])
    return {'tosses': len(tosses), 'tosses_with_windows': int(len(np.unique(toss_of))),
            'windows': len(windows['starts']), 'dt': tosses.dt, 'horizon': HORIZON,
            'contact_margin_m': margin,
            'free_flight_samples_median': float(np.median(contact)),
            'errors': rows, 'seconds': engines}


def cube_study(data: Path, limit: Optional[int], substeps: int = 1) -> Dict[str, Any]:
    """Run (b): whole cube tosses from the first state, MuJoCo and our contact step."""
    tosses = load_cube_tosses(data, limit=limit)
    mj_model = mujoco_model(tosses, tosses.dt / CONTACT_SUBSTEPS, contact=True)
    keys = ('position_m', 'orientation_rad', 'final_position_m', 'final_orientation_rad')
    per_toss = {name: {k: [] for k in keys} for name in ('mujoco', 'ours')}
    x0 = torch.stack([torch.cat((q[1], v[1])) for q, v in zip(tosses.q, tosses.v)])
    lengths = [len(q) - 2 for q in tosses.q]
    seconds = {}
    start = time.perf_counter()
    predicted = {'mujoco': [rollout_mujoco(mj_model, x0[i:i + 1], n, CONTACT_SUBSTEPS)[0]
                            for i, n in enumerate(lengths)]}
    seconds['mujoco_s'] = time.perf_counter() - start
    model = floating_model(tosses)
    contact = core.ContactModel.create(
        friction=tosses.friction, restitution=tosses.restitution or 0.0,
        vertex_links=(model.link_names[0],),
        vertices=(core.box_vertices((2 * CUBE_HALF_WIDTH_M,) * 3),))
    start = time.perf_counter()
    batch = contact_rollout(model, contact, x0, max(lengths), tosses.dt, substeps)
    predicted['ours'] = [batch[i, :n, :7] for i, n in enumerate(lengths)]
    seconds['ours_s'] = time.perf_counter() - start
    for name, runs in predicted.items():
        for q, run in zip(tosses.q, runs):
            position = (run[:, :3] - q[2:, :3]).norm(dim=-1)
            angle = geodesic_angle(run[:, 3:7], q[2:, 3:7])
            per_toss[name]['position_m'].append(float(position.mean()))
            per_toss[name]['orientation_rad'].append(float(angle.mean()))
            per_toss[name]['final_position_m'].append(float(position[-1]))
            per_toss[name]['final_orientation_rad'].append(float(angle[-1]))
    return {'tosses': len(tosses), 'dt': tosses.dt, 'mujoco_substeps': CONTACT_SUBSTEPS,
            'ours_substeps': substeps, 'friction': tosses.friction,
            'restitution': tosses.restitution,
            'errors': {name: {k: summarize(v) for k, v in rows.items()}
                       for name, rows in per_toss.items()},
            'seconds': seconds}


def _cells(stats: Dict[str, Optional[float]], scale: float) -> List[str]:
    return [_common.fmt_number(None if stats[k] is None else stats[k] * scale)
            for k in ('mean', 'median', 'p90')]


def markdown(payload: Dict[str, Any]) -> str:
    """
    Return the results as markdown tables (mm and degrees).

    :param payload: what :func:`main` writes as JSON.
    :return: markdown text.
    """
    lines = []
    elbow = payload.get('elbow')
    if elbow:
        lines += [f'(a) Elbow free flight: {elbow["windows"]} windows of {HORIZON} steps '
                  f'(dt {elbow["dt"]} s) in {elbow["tosses_with_windows"]} of '
                  f'{elbow["tosses"]} tosses; error at step {HORIZON}, per-toss mean, '
                  'then over tosses.', '',
                  '| engine | position mm (mean / median / p90) | orientation deg | hinge deg |',
                  '|---|---|---|---|']
        for name in ('ours', 'mujoco', 'constant_velocity'):
            row = elbow['errors'][name]
            cells = [' / '.join(_cells(row['position_m'], 1e3)),
                     ' / '.join(_cells(row['orientation_rad'], 180 / np.pi)),
                     ' / '.join(_cells(row['hinge_rad'], 180 / np.pi))]
            lines.append(f'| {name} | ' + ' | '.join(cells) + ' |')
        lines.append('')
    cube = payload.get('cube')
    if cube:
        lines += [f'(b) Cube whole tosses: {cube["tosses"]} tosses from the second sample to '
                  f'rest, mu {cube["friction"]}; per-toss mean over samples (and final), '
                  'then over tosses.', '',
                  '| engine | position mm (mean / median / p90) | orientation deg | '
                  'final position mm | final orientation deg |', '|---|---|---|---|---|']
        for name in ('ours', 'mujoco'):
            row = cube['errors'][name]
            if 'note' in row:
                lines.append(f'| {name} | {row["note"]} | | | |')
                continue
            cells = [' / '.join(_cells(row[key], scale)) for key, scale in (
                ('position_m', 1e3), ('orientation_rad', 180 / np.pi),
                ('final_position_m', 1e3), ('final_orientation_rad', 180 / np.pi))]
            lines.append(f'| {name} | ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines) + '\n'


def main(argv: Optional[Sequence[str]] = None) -> int:
    """
    Run the toss benchmark and print markdown tables.

    :param argv: command-line arguments (``sys.argv[1:]`` when None).
    :return: process exit status.
    """
    parser = _common.make_parser(__doc__.strip().splitlines()[0])
    parser.add_argument('--data', default=None, help='shared data root (holding INDEX.md)')
    parser.add_argument('--sections', default='elbow,cube',
                        help='comma-separated subset of: elbow, cube (default both)')
    parser.add_argument('--contact-margin', type=float, default=CONTACT_MARGIN_M,
                        help='first contact: lowest corner below this height in m '
                             f'(default {CONTACT_MARGIN_M})')
    parser.add_argument('--ours-substeps', type=int, default=1,
                        help='our contact steps per recorded sample in (b) (default 1: the '
                             "recording's dt, as ContactNets simulates)")
    parser.add_argument('--markdown', metavar='PATH', default=None,
                        help='also write the markdown tables to PATH')
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    sections = [s.strip() for s in args.sections.split(',') if s.strip()]
    unknown = sorted(set(sections) - {'elbow', 'cube'})
    if unknown:
        parser.error(f'unknown sections {unknown}; valid: elbow, cube')
    data = _common.data_root(args.data, 'tosses.py')
    limit = QUICK_TOSSES if args.quick else None
    payload: Dict[str, Any] = {'machine': _common.machine_info(('torch', 'mujoco')),
                               'quick': args.quick}
    if 'elbow' in sections:
        payload['elbow'] = elbow_study(data, limit, args.contact_margin)
    if 'cube' in sections:
        payload['cube'] = cube_study(data, limit, args.ours_substeps)
    text = markdown(payload)
    print(text)
    if args.json:
        _common.write_json(args.json, payload)
    if args.markdown:
        Path(args.markdown).write_text(text, encoding='utf-8')
    return 0


if __name__ == '__main__':
    sys.exit(main())
