"""
The WAM-4's swing-up task (ball in a cup) and the simulated recordings it is learned from.

One place for what ``benchmarks/ball_in_a_cup.py`` and ``diffsim-cup-search`` share:

- the task (:func:`make_task`): a ProMP of :data:`N_BASIS` basis functions per joint from
  :data:`HOME` over :data:`DURATION_S`, then :data:`HOLD_S` at rest, scored on the model at
  :data:`MODEL_DT` with the cup kinematics every :data:`KINEMATICS_STRIDE` steps, the cup and
  ball sizes of :mod:`diffsim_ros.sim.cup`, the joint limits of the arm model and the
  catalogue's command limits;
- the transfer (:func:`transfer`): a ProMP mean tracked on the MuJoCo plant by
  ``sim.cup.tracking_controller``, judged by ``sim.cup.in_cup``;
- the simulated identification data as files (:func:`write_recordings`): every run of
  ``sim.cup.identification_recordings`` as one NPZ table of :mod:`diffsim_ros.io.tables`
  (``t``, ``q``, ``qd``, ``tau`` of the WAM-4's joints; the swing runs with the ball's measured
  centre as the pose ``ball``, identity orientation), the layout ``diffsim-cup-search`` reads;
- the same identification motions as reference files for a physical WAM
  (:func:`identification_documents`): the excitation documents of
  :func:`~diffsim_ros.sysid.excitation.trajectory_document` that the mpc node tracks.
"""

import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np
import torch

from . import cup
from .. import robots
from ..control.ball_in_cup import (arm_contact, BallInCupTask, CupGeometry, link_poses,
                                   shape_axes)
from ..control.promp import ProMP
from ..core.model import RobotModel
from ..io.tables import write_npz
from ..sysid.dataset import Trajectory
from ..sysid.excitation import trajectory_document

__all__ = ['BALL_BODY', 'DURATION_S', 'HOLD_S', 'HOME', 'KINEMATICS_STRIDE', 'MODEL_DT',
           'N_BASIS', 'identification_documents', 'make_task', 'recording_trajectory',
           'transfer', 'write_recordings']

#: Start of every swing-up: cup opening tilted 0.6 rad forward so the hanging ball clears
#: the forearm (the cup's axis is parallel to it), the cup 1.2 m above the base.
HOME = (0.0, 0.2, 0.0, 0.4)
#: Movement duration and the rest after it, s (the last 0.2 s of the rest decide success).
DURATION_S = 2.0
HOLD_S = 0.5
#: ProMP basis functions per joint (five are spent on the start/end conditions).
N_BASIS = 10
#: Model rollout step and the kinematics grid (20 ms knots): on the nominal string model the
#: same six searched swing-ups scored the same catches at 2 ms and 4 ms (rewards within
#: 0.02), and 4 ms halves the search.
MODEL_DT = 0.004
KINEMATICS_STRIDE = 5
#: Name of the ball's pose in the recordings' tables.
BALL_BODY = 'ball'


def make_task(arm: RobotModel) -> BallInCupTask:
    """
    Return the swing-up task on an arm model (limits and torques from the catalogue).

    :param arm: the arm model the torque penalty uses.
    :return: the task.
    """
    info = robots.get(cup.ROBOT)
    return BallInCupTask(promp=ProMP(HOME, DURATION_S, N_BASIS),
                         geometry=CupGeometry(cup.CUP_RADIUS, cup.CUP_HEIGHT, cup.BALL_RADIUS,
                                              cup.CUP_WALL),
                         q_lower=tuple(arm.lower.tolist()), q_upper=tuple(arm.upper.tolist()),
                         torque_max=tuple(float(v) for v in info.command_limit), arm=arm,
                         dt=MODEL_DT, hold=HOLD_S, kinematics_stride=KINEMATICS_STRIDE,
                         obstacles=cup.arm_shapes())


def transfer(plant: cup.CupPlant, task: BallInCupTask, arm: RobotModel, theta: torch.Tensor,
             noise: Optional[cup.CupNoise] = None, seed: int = 0) -> Dict[str, Any]:
    """
    Execute a ProMP mean on the MuJoCo plant with computed-torque tracking.

    :param plant: the hidden plant.
    :param task: the task (ProMP, durations).
    :param arm: the arm model the tracking controller uses.
    :param theta: ProMP parameters ``(dim,)``.
    :param noise: sensor noise (None: noiseless).
    :param seed: noise seed.
    :return: ``success`` (bool), ``tracking_error_rad``, ``saturated`` (fraction of periods
        with a clipped torque), ``final_radial_m`` and ``final_height_m``: the largest radial
        distance and the height range of the ball's centre in the cup frame over the last
        ``HOLD_S`` of the run (what ``in_cup`` judges), ``first_contact_s``: when the plant's
        ball first touched anything (None: never), ``arm_contact_s``: when it first touched the
        arm (``arm_contact`` on the recorded ball; None: never), and ``recording`` (the run).
    """
    reference = task.promp.reference(theta)
    controller = cup.tracking_controller(arm, reference)
    seconds = task.promp.duration + task.hold
    recording = plant.run(controller, HOME, seconds, noise=noise, seed=seed)
    q_ref, _, _ = reference(torch.as_tensor(recording.t, dtype=torch.float64))
    error = float(np.abs(recording.q - q_ref.numpy()).max())
    last = recording.t >= recording.t[-1] - cup.HOLD_S + 1e-9
    ball = recording.ball_in_cup_frame()[last]
    q = torch.as_tensor(recording.q, dtype=torch.float64)
    poses = link_poses(task.arm, task.obstacles, q)
    touched = arm_contact(torch.from_numpy(recording.ball), shape_axes(poses, task.obstacles),
                          task.obstacles, task.geometry.ball_radius).numpy()
    return {'success': cup.in_cup(recording), 'tracking_error_rad': error,
            'first_contact_s': (float(recording.t[recording.contact.argmax()])
                                if recording.contact.any() else None),
            'arm_contact_s': float(recording.t[touched.argmax()]) if touched.any() else None,
            'saturated': float(recording.saturated),
            'final_radial_m': float(np.hypot(ball[:, 0], ball[:, 1]).max()),
            'final_height_m': [float(ball[:, 2].min()), float(ball[:, 2].max())],
            'recording': recording}


def recording_trajectory(recording: cup.CupRecording, run: str) -> Trajectory:
    """
    Return a plant run as a table trajectory: the joints, and the ball as a pose.

    :param recording: a run of :class:`~diffsim_ros.sim.cup.CupPlant`.
    :param run: its name.
    :return: float64 trajectory with ``t``, ``q``, ``qd``, ``tau`` and, when the run has a
        ball, ``poses[BALL_BODY]`` ``(T, 4, 4)`` (the measured centre, identity rotation).
    """
    poses = {}
    if recording.ball is not None:
        pose = np.tile(np.eye(4), (recording.t.shape[0], 1, 1))
        pose[:, :3, 3] = recording.ball
        poses[BALL_BODY] = torch.from_numpy(pose)
    traj = recording.trajectory(run)
    return traj.replace(poses=poses)


def write_recordings(directory: Union[str, Path], arm: Sequence[cup.CupRecording],
                     swings: Sequence[cup.CupRecording],
                     truth: Optional[cup.CupTruth] = None) -> List[Path]:
    """
    Write identification runs as NPZ tables (module docstring), one file per run.

    :param directory: the folder (created).
    :param arm: the arm's runs (no ball), written as ``arm_<k>.npz``.
    :param swings: the ball-swinging runs, written as ``swing_<k>.npz``.
    :param truth: the hidden plant, written to ``truth.json`` when given (to check a fit
        against; nothing reads it to fit).
    :return: the NPZ paths.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for prefix, runs in (('arm', arm), ('swing', swings)):
        for k, recording in enumerate(runs):
            name = f'{prefix}_{k}'
            paths.append(write_npz(directory / f'{name}.npz',
                                   recording_trajectory(recording, name)))
    if truth is not None:
        hidden = {'string_length': truth.string_length, 'cup_xyz': list(truth.cup_xyz),
                  'cup_rpy': list(truth.cup_rpy), 'ball_mass': truth.ball_mass}
        (directory / 'truth.json').write_text(json.dumps(hidden, indent=1) + '\n',
                                              encoding='utf-8')
    return paths


def identification_documents(seed: int, string_length: float = cup.NOMINAL_STRING_LENGTH,
                             arm_seconds: float = 60.0, swing_runs: int = 6,
                             swing_seconds: float = 30.0) -> Dict[str, Dict[str, Any]]:
    """
    Return the identification motions as mpc reference documents (excitation series).

    The arm's sinusoid (:func:`~diffsim_ros.sim.cup.arm_reference`, to run with the ball
    taken off) and the slow swings (:func:`~diffsim_ros.sim.cup.string_references`, with the
    ball on), the same motions :func:`~diffsim_ros.sim.cup.identification_recordings` records
    on the simulated plant.  Each document's ``q_start`` is where the arm must stand at rest
    when tracking starts; its ``duration_s`` is one period (the recording's length).

    :param seed: seed of the motions' draw.
    :param string_length: the measured string length, m (sets the swings' frequencies).
    :param arm_seconds: the arm run's period, s.
    :param swing_runs: number of swing runs.
    :param swing_seconds: each swing run's period, s.
    :return: ``{'arm_excitation': document, 'swing_0': document, ...}``.
    """
    references = {'arm_excitation': (cup.arm_reference(seed, arm_seconds), arm_seconds)}
    for k, reference in enumerate(cup.string_references(seed, string_length, swing_runs,
                                                        swing_seconds)):
        references[f'swing_{k}'] = (reference, swing_seconds)
    return {name: trajectory_document(reference, cup.ROBOT, seconds,
                                      {'ball': 'off' if name == 'arm_excitation' else 'on'})
            for name, (reference, seconds) in references.items()}
