"""
Identification experiments on the MuJoCo plant, shared by the plant-validation tests.

Every experiment starts from seeded :class:`~diffsim_ros.sim.TrueParameters` about 30 % off
the nominal model, records noise-free, unquantised, undelayed runs from the plant (never from
our own engine) and offers the yardsticks the tests use: base parameters of two models, which
of them the data excite, and open-loop rollout errors from held-out initial states.
"""

import dataclasses
from typing import Callable, List, Optional, Sequence, Tuple

from diffsim_ros.core import rnea, rollout
from diffsim_ros.sim import (chirp, MujocoPlant, multisine, nominal_model, PlantConfig,
                             TrueParameters)
from diffsim_ros.sysid.losses import command_matrix, make_torque_fn
from diffsim_ros.sysid.nea import BaseParameters, RegressorColumns
import numpy as np
import torch

#: Relative torque noise assumed when judging whether the data excite a base parameter.
NOISE_FRACTION = 0.01
#: A base parameter is well excited when that noise gives it a relative std below this.
WELL_EXCITED_STD = 0.01


def make_plant(robot: str, seed: int, coulomb: bool = False) -> MujocoPlant:
    """
    Return a noise-free plant with sampled true parameters (30 % error).

    :param robot: catalog name.
    :param seed: seed of the parameter sampling.
    :param coulomb: keep the sampled Coulomb friction (MuJoCo ``frictionloss``); False sets
        it to zero.
    :return: the plant (no noise, quantisation or delay; joint limits enforced).
    """
    nominal = nominal_model(robot)
    true = TrueParameters.sample(nominal, 0.3, torch.Generator().manual_seed(seed))
    if not coulomb:
        true = dataclasses.replace(true, friction=dict.fromkeys(nominal.joint_names, 0.0))
    return MujocoPlant(PlantConfig(robot=robot, true_parameters=true, seed=seed,
                                   encoder_counts_per_rev=0))


def chirp_with_centering(plant: MujocoPlant, duration: float, seed: int,
                         fraction: float = 0.6, kp: float = 4.0, kd: float = 0.1,
                         f0: float = 0.3, f1: float = 3.0) -> Tuple[Callable, int]:
    """
    Chirp voltage on the actuated joint plus a weak PD pull toward zero (keeps it in range).

    :param plant: a Quanser plant (one command joint, first joint).
    :param duration: length, s.
    :param seed: phase seed.
    :param fraction: chirp peak as a fraction of the command limit.
    :param kp: position gain, command unit per rad or m.
    :param kd: velocity gain.
    :param f0: start frequency, Hz.
    :param f1: end frequency, Hz.
    :return: ``(controller, steps)``.
    """
    steps = int(round(duration * plant.rate_hz))
    limit = float(plant.command_limit[0])
    ref = chirp(steps, plant.rate_hz, fraction * limit, f0=f0, f1=f1,
                generator=torch.Generator().manual_seed(seed)).numpy()
    index = plant.true_model.joint_index(plant.command_joints[0])
    tick = [0]

    def controller(measurement) -> np.ndarray:
        k = min(tick[0], steps - 1)
        tick[0] += 1
        return ref[k] - kp * measurement.q[index:index + 1] - kd * measurement.qd[index:index + 1]
    return controller, steps


def gravity_compensated_pd(plant: MujocoPlant, duration: float, seed: int,
                           amplitude: float = 0.5, band: Sequence[float] = (0.1, 1.0),
                           kp: float = 60.0, kd: float = 6.0) -> Tuple[Callable, int]:
    """
    PD tracking of multisine references about mid-range, gravity compensated on the NOMINAL model.

    :param plant: a torque-commanded plant.
    :param duration: length, s.
    :param seed: phase seed.
    :param amplitude: reference peak as a fraction of each joint's half range.
    :param band: reference frequency band, Hz.
    :param kp: position gain, N m/rad.
    :param kd: velocity gain, N m s/rad.
    :return: ``(controller, steps)``.
    """
    model = plant.nominal_model
    steps = int(round(duration * plant.rate_hz))
    lower, upper = model.lower.numpy(), model.upper.numpy()
    centre, half = 0.5 * (lower + upper), 0.5 * (upper - lower)
    ref = multisine(steps, plant.rate_hz, amplitude * half, band=band, n_sines=6,
                    generator=torch.Generator().manual_seed(seed)).numpy() + centre
    tick = [0]

    def controller(measurement) -> np.ndarray:
        k = min(tick[0], steps - 1)
        tick[0] += 1
        q = torch.tensor(measurement.q)
        gravity = rnea(model, q, torch.zeros_like(q), torch.zeros_like(q)).numpy()
        return gravity + kp * (ref[k] - measurement.q) - kd * measurement.qd
    return controller, steps


def record(plant: MujocoPlant, controllers: Sequence[Tuple[Callable, int]],
           q0s: Optional[Sequence] = None) -> List:
    """
    Run the plant once per controller, recording true accelerations.

    :param plant: the plant.
    :param controllers: ``(controller, steps)`` pairs (or ``(commands, steps)``).
    :param q0s: initial positions per run (None: home).
    :return: trajectories without poses.
    """
    runs = []
    for k, (controller, steps) in enumerate(controllers):
        q0 = None if q0s is None else q0s[k]
        run = plant.run(controller, steps=steps, q0=q0, true_acceleration=True, run=f'run{k}')
        runs.append(run.replace(poses={}))
    return runs


def joint_layout(model) -> RegressorColumns:
    """
    Return the regressor layout of the strict tests: inertial, armature and damping.

    :param model: the robot.
    :return: the layout (no Coulomb column: the strict plants have no ``frictionloss``).
    """
    return RegressorColumns(friction=('viscous',), armature=True)


def excitation(base: BaseParameters, model, runs: Sequence) -> Tuple[torch.Tensor, torch.Tensor]:
    """
    Relative std of each base parameter under an assumed torque noise, and singular values.

    The noise of joint ``j`` is ``NOISE_FRACTION`` of the RMS of its inertial torque
    ``(M(q) qdd)_j`` (a scale every joint has, passive ones included, in its own unit), the
    covariance ``(W^T W)^-1`` of least squares on the noise-whitened base regressor ``W`` of
    the runs, as NEA computes its std.

    :param base: base-parameter map.
    :param model: the true model (its base parameters normalise the std).
    :param runs: the training runs (true ``qdd``).
    :return: ``(relative_std (r,), singular values of the column-normalised W (r,))``.
    """
    q, qd, qdd = (torch.cat([getattr(r, k) for r in runs]) for k in ('q', 'qd', 'qdd'))
    zero = torch.zeros_like(qd)
    inertial_torque = rnea(model, q, zero, qdd) - rnea(model, q, zero, zero)
    sigma = NOISE_FRACTION * inertial_torque.pow(2).mean(0).sqrt()
    W = base.regressor(model, q, qd, qdd) / sigma[:, None]
    W = W.reshape(-1, W.shape[-1])
    covariance = torch.linalg.inv(W.T @ W)
    relative_std = covariance.diagonal().sqrt() / base.values(model).abs()
    return relative_std, torch.linalg.svdvals(W / W.norm(dim=0))


def relative_errors(base: BaseParameters, identified, true) -> torch.Tensor:
    """
    Return ``|beta_identified - beta_true| / |beta_true|`` per base parameter.

    :param base: base-parameter map.
    :param identified: identified model.
    :param true: true model.
    :return: ``(r,)``.
    """
    beta_true = base.values(true)
    return (base.values(identified) - beta_true).abs() / beta_true.abs()


def rollout_nmse(model, actuator, plant: MujocoPlant, runs: Sequence, seconds: float = 1.0,
                 windows: int = 3, source: str = 'u') -> float:
    """
    Open-loop rollout NMSE of positions over ``seconds`` from held-out plant states.

    Our engine replays the recorded commands (``u`` through ``actuator``, or the recorded
    true torques ``tau``) from true plant states and is compared with the plant's
    positions; the error is normalised by each joint's position variance over the window.

    :param model: model to evaluate (its damping enters the torque).
    :param actuator: actuator module for ``source='u'`` (None: commands are torques).
    :param plant: the plant (rate and command joints).
    :param runs: held-out runs.
    :param seconds: rollout length, s.
    :param windows: windows per run, evenly spread.
    :param source: ``'u'`` or ``'tau'``.
    :return: mean NMSE over windows and joints.
    """
    steps = int(round(seconds * plant.rate_hz))
    dt = 1.0 / plant.rate_hz
    if source == 'u':
        B = command_matrix(model, plant.command_joints).to(model.dtype)
        torque_fn = make_torque_fn(model, B, actuator)
    else:
        torque_fn = make_torque_fn(model, torch.eye(model.n, dtype=model.dtype))
    with torch.no_grad():
        errors = _window_errors(model, runs, steps, windows, dt, source, torque_fn)
    return float(torch.stack(errors).mean())


def _window_errors(model, runs: Sequence, steps: int, windows: int, dt: float, source: str,
                   torque_fn: Callable) -> List[torch.Tensor]:
    errors = []
    for run in runs:
        length = run.q.shape[0]
        for start in np.linspace(0, length - steps - 1, windows).astype(int):
            x0 = torch.cat([run.q[start], run.qd[start]])
            controls = getattr(run, source)[start:start + steps]
            states = rollout(model, x0, controls, dt, 'rk4', torque_fn)
            q_model = states[1:, :model.n]
            q_plant = run.q[start + 1:start + steps + 1]
            variance = q_plant.var(0).clamp_min(1e-12)
            errors.append(((q_model - q_plant).pow(2).mean(0) / variance).mean())
    return errors
