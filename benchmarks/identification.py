"""
Identify real robots from their recordings: wall time, rollout errors and parameters.

Sections (``benchmarks/README.md`` explains each in full):

* timing: wall time from the loaded samples (derivative estimation included) to the
  converged model for one 10 s chirp run of the Quanser Qube (target: at most 5 s on 2
  cores) and for the Panda excitation, with differentiable-robot-model's learnable model
  running the same inverse-dynamics fits as the peer;
* qube, cartpole: train on the chirp runs, validate on the held-out swing-up runs (``--split``
  chooses other held-out runs); multi-step rollout NMSE over 0.5 s, 1 s and 2 s for the
  catalogue model, NEA, DiffNEA with the inverse-dynamics loss x {none, viscous, Stribeck,
  NN-friction, NN-residual}, the forward loss, the multi-step loss, the inverse -> multi-step
  schedule x {none, viscous, Stribeck}, ``diffsim-fit``'s default and FF-NN (as in DiffNEA
  Fig. 2), and whether any rollout diverged;
* panda: per-joint torque MSE and 0.25 s / 0.5 s rollout NMSE on the held-out last 30 % of
  the excitation for the catalogue model, Gaz et al.'s p-hat with their own friction models,
  NEA and DiffNEA (inverse, and diffsim-fit's default, each with and without Gaz's sigmoid
  friction), beside their Table IV; identified masses beside their Table VIII;
* dfki: identifiable parameter combinations of the DFKI simple and double pendulum beside
  the published ones; for the double pendulum also the simulation table: train on the
  design A.0 identification records (the last one stops the fit), validate on the three
  held-out pendubot swing-ups; 0.5 s / 1 s / 2 s rollout NMSE and held-out torque NMSE / MSE
  per joint for the catalogue model, the authors' published model with their friction,
  NEA, DiffNEA-inverse and ``diffsim-fit``'s DiffNEA default.

Run ``python benchmarks/identification.py [--quick] [--json PATH]``; the data root is
``$DIFFSIM_DATA`` or ``shared/data`` next to the repository (``--data DIR``).
"""

import contextlib
import io
import json
import math
import os
from pathlib import Path
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple
from xml.etree import ElementTree

import numpy as np
import torch

try:
    from benchmarks import _common
except ImportError:  # run as ``python benchmarks/identification.py``
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks import _common

from diffsim_ros import robots  # noqa: I100
from diffsim_ros.core import crba, load_urdf, rnea
from diffsim_ros.core.model import RobotModel
from diffsim_ros.io import datasets
from diffsim_ros.io.formats import dfki as dfki_format
from diffsim_ros.io.report import (physical_predictor, Predictor, predictors, rollout_study,
                                   torque_metrics)
from diffsim_ros.io.selection import early_stopping_split
from diffsim_ros.sysid.dataset import Trajectory
from diffsim_ros.sysid.diffnea import (DiffNEAConfig, SCHEDULE_ROLLOUT_LR, SCHEDULE_ROLLOUT_STEPS,
                                       simulation_schedule)
from diffsim_ros.sysid.estimators import fit, make_config
from diffsim_ros.sysid.filters import estimate_derivatives
from diffsim_ros.sysid.losses import make_actuator
from diffsim_ros.sysid.preprocess import delay_commands, resample, split_time
from diffsim_ros.sysid.result import IdentificationResult

PACKAGES = ('torch', 'numpy', 'differentiable-robot-model')
QUBE_TIME_LIMIT_S = 5.0
#: Voltage delay (samples) applied to the Quanser commands before fitting and validating:
#: on the real Qube two samples (8 ms at 250 Hz) of delay fit best.
QUBE_DELAY = 2
CARTPOLE_DELAY = 0
#: Leading samples dropped from every run (the cart-pole's stale first sample is dropped by
#: its loader, ``io/datasets.load_cartpole_runs``).
QUBE_SKIP = 0
CARTPOLE_SKIP = 0
#: Derivative low-pass cutoffs, Hz.
QUANSER_CUTOFF_HZ = 20.0
PANDA_RATE_HZ = 200.0
PANDA_CUTOFF_HZ = 5.0
#: Trailing fraction of the Panda excitation held out, and its rollout horizons, s.
PANDA_VALIDATION = 0.3
PANDA_HORIZONS = (0.25, 0.5)
#: DFKI records: ``diffsim-fit``'s data-set defaults (``io/formats/dfki.py``), one place.
DFKI_RATE_HZ = float(dfki_format.DOUBLE_DEFAULTS['rate'])
DFKI_CUTOFF_HZ = float(dfki_format.DOUBLE_DEFAULTS['cutoff'])
DFKI_SIMPLE_CUTOFF_HZ = float(dfki_format.SIMPLE_DEFAULTS['cutoff'])
#: Smoothing velocity of the tanh Coulomb term in the DFKI rows (DiffNEA's default), rad/s.
DFKI_COULOMB_EPS = 1e-2
#: A rollout whose NMSE is not finite or above this counts as diverged.
DIVERGED_NMSE = 1e3
HORIZONS = (0.5, 1.0, 2.0)
QUICK_HORIZONS = (0.5, 1.0)
#: Optimiser budget shared by DiffNEA and the differentiable-robot-model peer.
ADAM_ITERATIONS = 200
LBFGS_ITERATIONS = 20
LBFGS_MAX_INNER = 20
#: DiffNEA's prior toward the nominal (URDF) parameters in the real Quanser fits.
PRIOR_WEIGHT = 1e-3
DRM_LR = 1e-3
#: Per-body factors in [1 - PERTURB, 1 + PERTURB] scale the published Panda / DFKI inertial
#: parameters into the start (and NEA prior) so that the fits do not start at the answer.
PERTURB = 0.3
SEED = 0
G = 9.81

DIFFNEA_VARIANTS = ('none', 'viscous', 'stribeck', 'nn-friction', 'nn-residual')
QUICK_VARIANTS = ('viscous',)
#: Held-out splits of the Quanser runs (:func:`split_quanser`).
SPLITS = ('chirp', 'mixed', 'mixed-odd', 'halves', 'swingup')
#: Rows of ``--rows core`` (besides the catalogue model).
CORE_ROWS = ('NEA', 'DiffNEA-inverse-viscous', 'DiffNEA-default')
#: Friction models of the inverse -> multi-step schedule rows.
SCHEDULE_VARIANTS = ('none', 'viscous', 'stribeck')
#: Smoothing velocity of the tanh Coulomb term of NEA and of the catalogue model, rad/s or m/s.
QUANSER_COULOMB_EPS = 0.05
#: Sample rate of the Quanser runs used here (the 500 Hz Qube swing-ups are left out), Hz.
QUANSER_RATE_HZ = 250.0


# --------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------
def prepare_quanser(runs: Sequence[Trajectory], delay: int, skip: int = 0) -> List[Trajectory]:
    """
    Delay the voltages, drop leading samples and estimate zero-phase derivatives.

    :param runs: Quanser runs.
    :param delay: voltage delay in samples.
    :param skip: leading samples dropped (after the delay) before the derivatives.
    :return: runs with ``qd`` and ``qdd``.
    """
    return [estimate_derivatives(delay_commands(run, delay).crop(skip, len(run)),
                                 cutoff_hz=QUANSER_CUTOFF_HZ) for run in runs]


def model_of(name: str) -> RobotModel:
    """
    Load a shipped robot as a float64 model.

    :param name: robot name in :mod:`diffsim_ros.robots`.
    :return: the model.
    """
    return load_urdf(str(robots.urdf_path(name)), dtype=torch.float64)


def perturb_factors(n: int, seed: int = SEED) -> torch.Tensor:
    """
    Return the seeded per-body scale factors of :func:`perturbed`.

    :param n: number of movable joints.
    :param seed: seed of the local generator.
    :return: ``(n,)`` float64 factors in ``[1 - PERTURB, 1 + PERTURB]``.
    """
    generator = torch.Generator().manual_seed(seed)
    return 1.0 + PERTURB * (2.0 * torch.rand(n, generator=generator,
                                             dtype=torch.float64) - 1.0)


def perturbed(model: RobotModel, seed: int = SEED) -> RobotModel:
    """
    Scale each body's inertial parameters by a seeded factor (stays physically consistent).

    :param model: nominal model.
    :param seed: seed of the local generator.
    :return: model with ``inertial[i] *= U(1 - PERTURB, 1 + PERTURB)``.
    """
    factors = perturb_factors(model.n, seed).to(model.dtype)
    return model.replace(inertial=model.inertial * factors[:, None])


# --------------------------------------------------------------------------------------
# Estimator configurations
# --------------------------------------------------------------------------------------
def quanser_configs(robot: str, quick: bool,
                    rate_hz: float = QUANSER_RATE_HZ) -> Dict[str, Tuple[str, Dict[str, Any]]]:
    """
    Return the methods compared on a Quanser robot: ``label -> (estimator, config)``.

    ``DiffNEA-inverse-*``: inverse-dynamics loss with each friction model; ``forward``: one-step
    acceleration loss; ``multistep``: rollout loss only, from the URDF; ``schedule-*``: the
    inverse fit refined by the rollout loss (:func:`diffsim_ros.sysid.diffnea.simulation_schedule`,
    motor back-EMF learned in the refinement); ``DiffNEA-default`` is exactly what
    ``diffsim-fit --method diffnea`` runs (no prior, viscous + Coulomb fields).

    :param robot: ``'qube'`` or ``'cartpole'``.
    :param quick: NEA, DiffNEA-inverse-viscous and DiffNEA-default only.
    :param rate_hz: sample rate of the data (shooting window length in samples).
    :return: the configurations.
    """
    actuator = 'qube_servo2' if robot == 'qube' else 'quanser_ip02'
    info = robots.get(robot)
    common = {'actuator': actuator, 'command_joints': list(info.command_joints), 'source': 'u'}
    out: Dict[str, Tuple[str, Dict[str, Any]]] = {
        'NEA': ('nea', dict(common, friction=['viscous', 'coulomb'], coulomb='tanh',
                            coulomb_eps=QUANSER_COULOMB_EPS))}
    # A weak prior toward the URDF keeps bodies the chirps barely excite from collapsing:
    # without it, DiffNEA with NN friction shrinks the cart-pole's pole to a point mass
    # (8.4e-7 kg m^2 about its joint), which is consistent but too stiff for RK4.
    inverse = dict(common, adam_iterations=ADAM_ITERATIONS, lbfgs_iterations=LBFGS_ITERATIONS,
                   lbfgs_max_inner=LBFGS_MAX_INNER, prior_weight=PRIOR_WEIGHT)

    def friction(variant: str) -> Dict[str, Any]:
        if variant == 'none':
            return {'learn': ['inertial']}
        return {'friction_model': variant, 'learn': ['inertial', 'friction_model']}

    def schedule(variant: str) -> Dict[str, Any]:
        config = dict(common, prior_weight=PRIOR_WEIGHT, **friction(variant))
        config.update(simulation_schedule(rate_hz, config['learn'], ['actuator']))
        return config
    default = dict(common, **simulation_schedule(rate_hz, DiffNEAConfig.learn, ['actuator']))
    variants = QUICK_VARIANTS if quick else DIFFNEA_VARIANTS
    for variant in variants:
        out[f'DiffNEA-inverse-{variant}'] = ('diffnea', dict(inverse, **friction(variant)))
    if not quick:
        window = simulation_schedule(rate_hz, ['inertial', 'friction_model'])
        out['DiffNEA-forward-viscous'] = ('diffnea', dict(inverse, **friction('viscous'),
                                                          loss='forward'))
        out['DiffNEA-multistep-viscous'] = ('diffnea', dict(
            common, prior_weight=PRIOR_WEIGHT, friction_model='viscous', loss='rollout',
            horizon=window['horizon'], window_stride=window['window_stride'],
            learn=['inertial', 'friction_model', 'actuator'],
            adam_iterations=SCHEDULE_ROLLOUT_STEPS, lbfgs_iterations=0,
            lr=SCHEDULE_ROLLOUT_LR))
        for variant in SCHEDULE_VARIANTS:
            out[f'DiffNEA-schedule-{variant}'] = ('diffnea', schedule(variant))
    out['DiffNEA-default'] = ('diffnea', default)
    if not quick:
        out['FF-NN'] = ('ffnn', {'source': 'u', 'command_joints': list(info.command_joints),
                                 'iterations': 1000, 'hidden': [64, 64], 'lr': 3e-3,
                                 'patience': 0})
    return out


def fitted_predictor(result: IdentificationResult, nominal: RobotModel, method: str,
                     config: Dict[str, Any]) -> Predictor:
    """
    Return the forward model of a fit (black boxes included).

    :param result: the fit.
    :param nominal: nominal model (dtype, joint order).
    :param method: estimator name.
    :param config: its configuration mapping.
    :return: the predictor.
    """
    fitted, _ = predictors(result, nominal, make_config(method, config))
    return fitted


def rollout_entry(predictor: Predictor, runs: Sequence[Trajectory], source: str,
                  horizons: Sequence[float]) -> Dict[str, Any]:
    """
    Measure rollout NMSE at each horizon on the validation runs.

    :param predictor: the model.
    :param runs: validation runs.
    :param source: ``'u'`` or ``'tau'``.
    :param horizons: horizons, s.
    :return: ``{'nmse_<h>s': value or None, 'diverged': bool, 'windows': {...}}``.
    """
    metrics, _ = rollout_study(predictor, runs, source, horizons)
    entry: Dict[str, Any] = {'diverged': False, 'windows': {}}
    for h in horizons:
        m = metrics[f'{h:g}s']
        value = m.get('nmse')
        bad = bool(m.get('diverged')) or (value is not None and value > DIVERGED_NMSE)
        entry[f'nmse_{h:g}s'] = value
        entry['windows'][f'{h:g}s'] = m.get('windows', 0)
        entry['diverged'] = entry['diverged'] or bad
    return entry


def split_quanser(chirps: Sequence[Trajectory], swingups: Sequence[Trajectory], split: str
                  ) -> Tuple[List[Trajectory], List[Trajectory], List[Trajectory]]:
    """
    Return ``(train, early-stopping, validation)`` runs of a Quanser split.

    ``'chirp'``: train on the chirps but the last (early stopping), validate on every
    swing-up; ``'mixed'``: train on the chirps but the last and on every other swing-up
    (even positions), validate on the remaining swing-ups; ``'mixed-odd'``: the same with
    the odd positions trained; ``'halves'``: train on the chirps but the last and on the
    first half of the swing-ups, validate on the second half; ``'swingup'``: train on the
    swing-ups but the last (early stopping), validate on every chirp.

    :param chirps: chirp runs.
    :param swingups: swing-up runs.
    :param split: one of :data:`SPLITS`.
    :return: the three lists (validation runs are never fitted nor used for early stopping).
    :raises ValueError: unknown split.
    """
    if split not in SPLITS:
        raise ValueError(f'unknown split {split!r}; valid: {", ".join(SPLITS)}')
    chirps, swingups = list(chirps), list(swingups)
    if split == 'swingup':
        return swingups[:-1], swingups[-1:], chirps
    train, stopping = chirps[:-1], chirps[-1:]
    if split == 'mixed':
        return train + swingups[0::2], stopping, swingups[1::2]
    if split == 'mixed-odd':
        return train + swingups[1::2], stopping, swingups[0::2]
    if split == 'halves':
        half = len(swingups) // 2
        return train + swingups[:half], stopping, swingups[half:]
    return train, stopping, swingups


def quanser_study(robot: str, root: Path, quick: bool, split: str = 'chirp',
                  rows: str = 'all') -> Dict[str, Any]:
    """
    Train every method on one split of the runs and roll it out on the held-out runs.

    The catalogue row is the nominal model (URDF, catalogued motor) scored the same way.

    :param robot: ``'qube'`` or ``'cartpole'``.
    :param root: data root.
    :param quick: fewer runs, methods and horizons.
    :param split: :func:`split_quanser` split.
    :param rows: ``'all'``; ``'core'``: catalogue, NEA, DiffNEA-inverse-viscous and
        DiffNEA-default only; or comma-separated row labels (the catalogue row is always in).
    :return: ``{method: {'nmse_0.5s', 'nmse_1s', 'nmse_2s', 'diverged', 'fit_s', ...}}`` and a
        ``_setup`` entry.
    """
    load = datasets.load_qube_runs if robot == 'qube' else datasets.load_cartpole_runs
    delay = QUBE_DELAY if robot == 'qube' else CARTPOLE_DELAY
    skip = QUBE_SKIP if robot == 'qube' else CARTPOLE_SKIP
    chirps = prepare_quanser(load(root, kinds=('chirp',)), delay, skip)
    swingups = prepare_quanser([r for r in load(root, kinds=('swingup',)) if '500Hz' not in r.run],
                               delay, skip)
    if quick:
        chirps, swingups = chirps[:3], swingups[:4]
    train, stopping, validation = split_quanser(chirps, swingups, split)
    horizons = QUICK_HORIZONS if quick else HORIZONS
    nominal = model_of(robot)
    out: Dict[str, Any] = {'_setup': {
        'split': split, 'train_runs': len(train), 'train_seconds': sum(r.duration for r in train),
        'validation_runs': len(validation),
        'validation_seconds': sum(r.duration for r in validation),
        'voltage_delay_samples': delay, 'skipped_leading_samples': skip,
        'horizons_s': list(horizons), 'early_stopping_runs': len(stopping),
        'diffnea_prior_weight': PRIOR_WEIGHT}}
    catalogue = None
    configs = quanser_configs(robot, quick)
    if rows != 'all':
        chosen = CORE_ROWS if rows == 'core' else tuple(r.strip() for r in rows.split(','))
        unknown = sorted(set(chosen) - set(configs))
        if unknown:
            raise ValueError(f'unknown rows {unknown}; valid: {", ".join(configs)}')
        configs = {k: v for k, v in configs.items() if k in chosen}
    for label, (method, config) in configs.items():
        start = time.perf_counter()
        with torch.no_grad() if method == 'nea' else contextlib.nullcontext():
            result = fit(method, nominal, train, stopping, config)
        seconds = time.perf_counter() - start
        fitted, _ = predictors(result, nominal, make_config(method, config))
        if catalogue is None:
            catalogue = rollout_entry(catalogue_predictor(robot, nominal), validation, 'u',
                                      horizons)
            out['catalogue'] = dict(catalogue, fit_s=0.0)
            _print_row(robot, 'catalogue', out['catalogue'], horizons)
        entry = rollout_entry(fitted, validation, 'u', horizons)
        entry['fit_s'] = seconds
        out[label] = entry
        _print_row(robot, label, entry, horizons)
    return out


def catalogue_predictor(robot: str, nominal: RobotModel) -> Predictor:
    """
    Return the catalogue model of a Quanser robot: URDF and catalogued motor, nothing fitted.

    :param robot: ``'qube'`` or ``'cartpole'``.
    :param nominal: the URDF model.
    :return: the predictor (URDF Coulomb levels smoothed as NEA's, :data:`QUANSER_COULOMB_EPS`).
    """
    info = robots.get(robot)
    motor = make_actuator('qube_servo2' if robot == 'qube' else 'quanser_ip02',
                          len(info.command_joints), None, nominal.dtype)
    return physical_predictor('catalogue', nominal, info.command_joints, motor, None,
                              QUANSER_COULOMB_EPS)


def _print_row(robot: str, label: str, entry: Dict[str, Any], horizons: Sequence[float]) -> None:
    print(f'  {robot} {label}: fit {entry["fit_s"]:.1f} s, '
          + ', '.join(f'{h:g} s {_fmt(entry[f"nmse_{h:g}s"])}' for h in horizons)
          + (' DIVERGED' if entry['diverged'] else ''), flush=True)


# --------------------------------------------------------------------------------------
# Timing and the differentiable-robot-model peer
# --------------------------------------------------------------------------------------
def qube_timing_config() -> Dict[str, Any]:
    """
    Return the DiffNEA configuration the Qube target is timed with.

    :return: DiffNEA-viscous with the fixed-gain Qube motor, voltage input.
    """
    return {'actuator': 'qube_servo2', 'command_joints': ['arm_joint'], 'source': 'u',
            'friction_model': 'viscous', 'learn': ['inertial', 'friction_model'],
            'adam_iterations': ADAM_ITERATIONS, 'lbfgs_iterations': LBFGS_ITERATIONS,
            'lbfgs_max_inner': LBFGS_MAX_INNER}


def motor_torques(run: Trajectory) -> Trajectory:
    """
    Turn the Qube's voltages into joint torques through the catalogued DC motor.

    :param run: Qube run with ``u`` and ``qd``.
    :return: the run with ``tau`` = (motor torque on the arm, 0 on the pendulum).
    """
    motor = make_actuator('qube_servo2', 1, None, run.q.dtype)
    with torch.no_grad():
        arm = motor(run.u, run.qd[:, :1])
    return run.replace(tau=torch.cat((arm, torch.zeros_like(arm)), -1))


def drm_urdf(path: str) -> str:
    """
    Return the URDF text with a ``<limit>`` on every movable joint that lacks one.

    differentiable-robot-model reads ``joint.limit.effort`` of every movable joint and fails
    on a continuous joint without limits (the Qube's pendulum); the added limits are wide and
    do not enter the dynamics.

    :param path: URDF file.
    :return: the patched URDF text.
    """
    tree = ElementTree.parse(path)
    for joint in tree.getroot().iter('joint'):
        if joint.get('type') != 'fixed' and joint.find('limit') is None:
            ElementTree.SubElement(joint, 'limit', effort='1000', velocity='1000',
                                   lower='-1000', upper='1000')
    return ElementTree.tostring(tree.getroot(), encoding='unicode')


class DrmFit:
    """Inverse-dynamics fit of every link's mass, CoM and inertia in differentiable-robot-model."""

    def __init__(self, urdf: str, factors: Optional[torch.Tensor] = None) -> None:
        """
        Load the URDF in differentiable-robot-model and make the link parameters learnable.

        As in ``dynamics.py``: ``UnconstrainedScalar`` / ``UnconstrainedTensor`` at the URDF
        values; links without ``<inertial>`` stay at zero mass.  ``factors`` scale the mass and
        CoM-frame inertia of the bodies of the movable joints, in joint order, like
        :func:`perturbed` scales our start model.

        :param urdf: URDF path.
        :param factors: per-joint body scale factors, or ``None``.
        """
        from differentiable_robot_model.rigid_body_params import (
            UnconstrainedScalar, UnconstrainedTensor)
        from differentiable_robot_model.robot_model import DifferentiableRobotModel
        with tempfile.NamedTemporaryFile('w', suffix='.urdf', delete=False) as stream:
            stream.write(drm_urdf(urdf))
        try:
            quiet = io.StringIO()
            with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
                self.robot = DifferentiableRobotModel(stream.name, 'robot')
        finally:
            os.unlink(stream.name)
        links = {link.name: link for link in self.robot._urdf_model.robot.links}
        movable = 0
        for body in list(self.robot._bodies)[1:]:
            mass, com, inertia = (v.detach().clone()
                                  for v in body.inertia._get_parameter_values())
            if links[body.name].inertial is None:
                mass, com, inertia = (torch.zeros_like(v) for v in (mass, com, inertia))
            if body.joint_limits is not None:
                if factors is not None and movable < len(factors):
                    mass, inertia = mass * float(factors[movable]), inertia * float(
                        factors[movable])
                movable += 1
            self.robot.make_link_param_learnable(body.name, 'mass', UnconstrainedScalar(mass))
            self.robot.make_link_param_learnable(
                body.name, 'com', UnconstrainedTensor(1, 3, com.reshape(1, 3)))
            self.robot.make_link_param_learnable(
                body.name, 'inertia_mat', UnconstrainedTensor(3, 3, inertia.reshape(3, 3)))
        self.initial = {k: v.detach().clone() for k, v in self.robot.state_dict().items()}

    def run(self, runs: Sequence[Trajectory], adam: int = ADAM_ITERATIONS,
            lbfgs: int = LBFGS_ITERATIONS) -> float:
        """
        Fit from the URDF values with Adam then L-BFGS on the normalised torque MSE.

        :param runs: trajectories with ``q``, ``qd``, ``qdd`` and ``tau``.
        :param adam: Adam steps (learning rate :data:`DRM_LR`).
        :param lbfgs: L-BFGS steps of :data:`LBFGS_MAX_INNER` iterations (strong Wolfe).
        :return: final loss (mean over joints of MSE / torque variance).
        """
        self.robot.load_state_dict(self.initial)
        q, qd, qdd, tau = (torch.cat([getattr(r, k) for r in runs]).float()
                           for k in ('q', 'qd', 'qdd', 'tau'))
        scale = tau.var(0).clamp_min(1e-6)
        robot = self.robot
        parameters = list(robot.parameters())

        def loss() -> torch.Tensor:
            predicted = robot.compute_inverse_dynamics(q, qd, qdd, include_gravity=True,
                                                       use_damping=False)
            return ((predicted - tau).square() / scale).mean()
        optimiser = torch.optim.Adam(parameters, lr=DRM_LR)
        for _ in range(adam):
            optimiser.zero_grad()
            value = loss()
            value.backward()
            optimiser.step()
        if lbfgs:
            second = torch.optim.LBFGS(parameters, max_iter=LBFGS_MAX_INNER,
                                       line_search_fn='strong_wolfe')

            def closure() -> torch.Tensor:
                second.zero_grad()
                value = loss()
                value.backward()
                return value
            for _ in range(lbfgs):
                second.step(closure)
        with torch.no_grad():
            return float(loss())


def torque_nmse(model: RobotModel, runs: Sequence[Trajectory]) -> float:
    """
    Return the rigid-body torque NMSE (mean over joints) of a model on torque data.

    :param model: the model.
    :param runs: runs with ``qdd`` and ``tau``.
    :return: ``mean_j mean((rnea - tau)^2) / var(tau_j)``.
    """
    q, qd, qdd, tau = (torch.cat([getattr(r, k) for r in runs])
                       for k in ('q', 'qd', 'qdd', 'tau'))
    with torch.no_grad():
        error = rnea(model, q, qd, qdd) - tau
    return float((error.square().mean(0) / tau.var(0).clamp_min(1e-6)).mean())


def timing_study(root: Path, quick: bool) -> Dict[str, Any]:
    """
    Time data-to-model for the Qube and the Panda, ours and differentiable-robot-model's.

    :param root: data root.
    :param quick: one repeat, no torque-level fits and no differentiable-robot-model.
    :return: ``{'qube_diffnea': {...}, ...}`` with seconds and final losses, and the target.
    """
    out: Dict[str, Any] = {}
    qube = model_of('qube')
    chirp = datasets.load_qube_runs(root, kinds=('chirp',))[0]
    config = qube_timing_config()

    holder: Dict[str, IdentificationResult] = {}

    def qube_fit() -> None:
        run = prepare_quanser([chirp], QUBE_DELAY)
        holder['result'] = fit('diffnea', qube, run, None, config)
    timing = _common.time_call(qube_fit, quick=quick, min_repeats=3, max_repeats=3,
                               budget_s=0.0)
    result = holder['result']
    out['qube_diffnea_viscous_voltage'] = dict(
        timing.to_dict(), samples=len(chirp), data_seconds=chirp.duration,
        iterations=result.metrics.get('iterations'), run=chirp.run)
    nea_config = quanser_configs('qube', True)['NEA'][1]

    def qube_nea() -> IdentificationResult:
        run = prepare_quanser([chirp], QUBE_DELAY)
        return fit('nea', qube, run, None, nea_config)
    out['qube_nea_voltage'] = _common.time_call(qube_nea, quick=quick, min_repeats=3,
                                                max_repeats=3, budget_s=0.0).to_dict()
    # torque-level fits (DRM has no voltage actuator): torques from the voltages
    torque_run = motor_torques(prepare_quanser([chirp], QUBE_DELAY)[0])
    torque_config = {'source': 'tau', 'learn': ['inertial'],
                     'adam_iterations': ADAM_ITERATIONS, 'lbfgs_iterations': LBFGS_ITERATIONS,
                     'lbfgs_max_inner': LBFGS_MAX_INNER}
    if not quick:   # the peer alone takes longer than the whole ``--quick`` budget
        out.update(peer_pair('qube', qube, [torque_run], torque_config, quick, drm=True))
        panda, train, _ = panda_data(root)
        out.update(peer_pair('panda', perturbed(panda), train, torque_config, quick, drm=True,
                             factors=perturb_factors(panda.n)))
    return out


def peer_pair(robot: str, model: RobotModel, runs: Sequence[Trajectory],
              config: Dict[str, Any], quick: bool, drm: bool,
              factors: Optional[torch.Tensor] = None) -> Dict[str, Any]:
    """
    Time our torque-level DiffNEA fit and differentiable-robot-model's on the same data.

    :param robot: robot name (URDF of the peer).
    :param model: start model of DiffNEA.
    :param runs: runs with torques and derivatives.
    :param config: DiffNEA configuration.
    :param quick: single repeat.
    :param drm: also run the peer (it starts at the URDF values scaled by ``factors``).
    :param factors: per-body factors that made ``model`` from the URDF (``None``: none).
    :return: ``{'<robot>_diffnea_torque': {...}, '<robot>_drm_torque': {...}}``.
    """
    out: Dict[str, Any] = {}
    holder: Dict[str, IdentificationResult] = {}

    def ours() -> None:
        holder['result'] = fit('diffnea', model, runs, None, config)
    timing = _common.time_call(ours, quick=quick, min_repeats=1, max_repeats=1, warmup=1,
                               budget_s=0.0)
    result = holder['result']
    out[f'{robot}_diffnea_torque'] = dict(
        timing.to_dict(), samples=sum(len(r) for r in runs),
        final_loss_nmse=torque_nmse(result.model, runs),
        iterations=result.metrics.get('iterations'))
    if drm:
        try:
            peer = DrmFit(str(robots.urdf_path(robot)), factors)
        except Exception as exc:  # a peer that cannot load the URDF is reported, not fatal
            out[f'{robot}_drm_torque'] = {'error': f'{type(exc).__name__}: {exc}'}
            return out
        start = time.perf_counter()
        final = peer.run(runs)
        out[f'{robot}_drm_torque'] = {'seconds': time.perf_counter() - start,
                                      'final_loss_nmse': final, 'repeats': 1,
                                      'samples': sum(len(r) for r in runs)}
    return out


# --------------------------------------------------------------------------------------
# Panda and DFKI
# --------------------------------------------------------------------------------------
def panda_data(root: Path) -> Tuple[RobotModel, List[Trajectory], List[Trajectory]]:
    """
    Load the Panda excitation at 200 Hz with derivatives; split off the last 30 %.

    :param root: data root.
    :return: nominal model (Gaz et al.'s p-hat), training and validation runs.
    """
    run = datasets.load_panda_excitation(root)[0]
    run = estimate_derivatives(resample(run, PANDA_RATE_HZ), cutoff_hz=PANDA_CUTOFF_HZ)
    split = split_time(run, validation=PANDA_VALIDATION)
    return model_of('panda'), list(split.train), list(split.validation)


def gaz_reference(root: Path) -> Dict[str, Any]:
    """
    Read Gaz et al.'s Table IV and Table VIII masses from the data folder.

    :param root: data root.
    :return: ``{'table_iv': {'p_hat': [...], 'delta': [...]}, 'masses': [...]}``.
    """
    path = root / datasets.DATASETS['panda'] / 'gaz2019_identified_parameters.json'
    with path.open(encoding='utf-8') as stream:
        table = json.load(stream)
    iv = table['validation_torque_mse_tableIV_Nm2']
    return {'table_iv': {'p_hat': iv['p_hat'], 'delta': iv['delta']},
            'masses': table['p_hat_penalty_method']['mass'],
            'masses_delta': table['delta_lmi_sdp_sousa']['mass']}


def panda_configs(quick: bool) -> Dict[str, Tuple[str, Dict[str, Any]]]:
    """
    Return the fitted rows of the Panda table: ``{label: (method, config)}``.

    ``DiffNEA-default`` is what ``diffsim-fit`` runs on a torque-sensing robot: the inverse
    fit, then the multi-step refinement with the torque loss kept at weight 1
    (:func:`~diffsim_ros.sysid.diffnea.simulation_schedule`); ``-sigmoid`` rows add Gaz et
    al.'s offset-sigmoid friction module (``--actuator sigmoid``).
    """
    budget = {'adam_iterations': 50 if quick else ADAM_ITERATIONS,
              'lbfgs_iterations': 5 if quick else LBFGS_ITERATIONS,
              'lbfgs_max_inner': LBFGS_MAX_INNER}
    learn = ['inertial', 'damping', 'coulomb']
    sigmoid = {'friction_model': 'sigmoid'}
    configs: Dict[str, Tuple[str, Dict[str, Any]]] = {
        'NEA': ('nea', {'source': 'tau', 'friction': ['viscous', 'coulomb', 'offset']}),
        'DiffNEA-inverse': ('diffnea', {'source': 'tau', 'learn': learn, **budget}),
        'DiffNEA-inverse-sigmoid': ('diffnea', {'source': 'tau', **sigmoid, **budget,
                                                'learn': learn + ['friction_model']}),
    }
    if quick:
        return configs
    for label, extra, groups in (('DiffNEA-default', {}, learn),
                                 ('DiffNEA-default-sigmoid', sigmoid,
                                  learn + ['friction_model'])):
        configs[label] = ('diffnea', {'source': 'tau', **extra, **simulation_schedule(
            PANDA_RATE_HZ, groups, torque_weight=1.0)})
    return configs


def panda_study(root: Path, quick: bool) -> Dict[str, Any]:
    """
    Fit on the first 70 % of the excitation; score torques and rollouts on the last 30 %.

    Rows: the catalogue model (p-hat with the URDF's linear friction), Gaz et al.'s p-hat with
    their own friction models (Table I sigmoids; Table III linear with offsets, torques only),
    and the fits of :func:`panda_configs` from a perturbed start, stopped early on the last
    20 % of the training part as ``diffsim-fit`` does.

    :param root: data root.
    :param quick: fewer DiffNEA iterations, no multi-step rows.
    :return: ``{'per_joint_mse': {row: [...]}, 'rollout': {row: {...}}, 'gaz_table_iv': [...],
        'masses': {...}, ...}``.
    """
    nominal, train, validation = panda_data(root)
    start = perturbed(nominal)
    reference = gaz_reference(root)
    joints = nominal.joint_names
    mse: Dict[str, List[Optional[float]]] = {}
    rollout: Dict[str, Dict[str, Any]] = {}
    masses: Dict[str, List[float]] = {'gaz_p_hat': reference['masses'],
                                      'gaz_delta': reference['masses_delta'],
                                      'start': start.inertial[:, 0].tolist()}
    seconds: Dict[str, float] = {}

    def record(label: str, predictor: Predictor, with_rollout: bool = True) -> None:
        metrics = torque_metrics(predictor, validation, 'tau')
        mse[label] = [None if metrics['mse'][j] is None else metrics['mse'][j] for j in joints]
        if with_rollout:
            rollout[label] = rollout_entry(predictor, validation, 'tau', PANDA_HORIZONS)
        print(f'  panda {label}: torque MSE sum {_fmt(sum(v or 0.0 for v in mse[label]))}'
              + (' rollout ' + ' '.join(_fmt(rollout[label][f'nmse_{h:g}s'])
                                        for h in PANDA_HORIZONS) if with_rollout else ''),
              flush=True)

    record('catalogue (p-hat, URDF friction)', physical_predictor(
        'catalogue', nominal, joints, None, None))
    published = robots.interface('panda').published_friction()
    if published is not None:
        bare, friction, _ = published
        record('Gaz p-hat, Table I sigmoid friction', physical_predictor(
            'gaz', bare, joints, None, friction))
    record('Gaz p-hat, Table III linear friction + offset', physical_panda_gaz(nominal),
           with_rollout=False)
    # as diffsim-fit: the last 20 % of the training part stops the fit (never the validation)
    fitted, stopping = early_stopping_split(train, validation, 'train')
    for label, (method, config) in panda_configs(quick).items():
        begin = time.perf_counter()
        result = fit(method, start, fitted, stopping, config)
        seconds[label] = time.perf_counter() - begin
        record(label, fitted_predictor(result, start, method, config))
        masses[label] = result.model.inertial[:, 0].tolist()
    return {'per_joint_mse': mse, 'rollout': rollout, 'horizons': list(PANDA_HORIZONS),
            'gaz_table_iv': reference['table_iv']['p_hat'],
            'gaz_table_iv_delta': reference['table_iv']['delta'], 'masses': masses,
            'fit_s': seconds, 'validation_seconds': sum(r.duration for r in validation),
            'train_seconds': sum(r.duration for r in train)}


def physical_panda_gaz(nominal: RobotModel) -> Predictor:
    """
    Return the torque predictor of Gaz et al.'s p-hat with their Table III linear friction (OSI).

    :param nominal: the shipped Panda model (its inertials are p-hat).
    :return: the predictor (torques only: ``sign`` friction is not simulated here).
    """
    info = robots.get('panda')
    viscous = torch.tensor(info.friction['viscous'], dtype=nominal.dtype)
    coulomb = torch.tensor(info.friction['coulomb'], dtype=nominal.dtype)
    offset = torch.tensor(info.friction['offset'], dtype=nominal.dtype)

    def torque(q: torch.Tensor, qd: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        return u - viscous * qd - coulomb * torch.sign(qd) - offset
    return Predictor(label='gaz', model=nominal, accel=lambda q, qd, u: qd, torque=torque)


def dfki_combinations(model: RobotModel) -> Dict[str, float]:
    """
    Return identifiable combinations of a pendulum model (joint space, gravity along -z).

    One joint: ``J`` (inertia about the axis incl. armature) and ``m*l`` (gravity torque
    amplitude / g).  Two joints: ``M11``, ``M12``, ``M22`` at ``q = 0`` and the gravity
    amplitudes ``m1 r1 + m2 l1`` and ``m2 r2`` (torques at the horizontal poses / g).

    :param model: the model.
    :return: the combinations.
    """
    zero = torch.zeros(model.n, dtype=model.dtype)
    with torch.no_grad():
        M = crba(model, zero)
        out: Dict[str, float] = {}
        if model.n == 1:
            out['J'] = float(M[0, 0])
            tau = rnea(model, zero + math.pi / 2, zero, zero)
            out['m*l'] = abs(float(tau[0])) / G
            return out
        out.update({'M11(q=0)': float(M[0, 0]), 'M12(q=0)': float(M[0, 1]),
                    'M22(q=0)': float(M[1, 1])})
        horizontal = torch.tensor([math.pi / 2, 0.0], dtype=model.dtype)
        tau = rnea(model, horizontal, zero, zero)
        out['m1*r1+m2*l1'] = abs(float(tau[0] - tau[1])) / G
        out['m2*r2'] = abs(float(tau[1])) / G
        return out


def dfki_published(root: Path) -> Dict[str, Dict[str, float]]:
    """
    Return the published identified parameters in the same combinations.

    :param root: data root.
    :return: ``{'simple': {...}, 'double': {...}}``.
    """
    simple: Dict[str, float] = {}
    text = (root / datasets.DATASETS['simple_pendulum'] / 'sysid_system_identification.txt'
            ).read_text(encoding='utf-8')
    for line in text.splitlines():
        if '=' in line and not line.startswith('tau'):
            key, value = (part.strip() for part in line.split('=', 1))
            try:
                simple[key] = float(value)
            except ValueError:
                pass
    published = {'J': simple.get('J'), 'm*l': simple.get('m*cx'), 'Fv': simple.get('Fv'),
                 'Fc (atan(100 qd))': simple.get('Fc'), 'offset': simple.get('offset')}
    values: Dict[str, float] = {}
    path = root / datasets.DATASETS['double_pendulum'] / 'identified_design_A.0_model_2.0.yml'
    for line in path.read_text(encoding='utf-8').splitlines():
        if ':' in line:
            key, value = (part.strip() for part in line.split(':', 1))
            try:
                values[key] = float(value)
            except ValueError:
                pass
    v = values
    reflected = v['Ir'] * v['gr'] ** 2
    double = {
        'M11(q=0)': v['I1'] + v['I2'] + v['m2'] * v['l1'] ** 2 + 2 * v['m2'] * v['l1'] * v['r2']
        + reflected,
        'M12(q=0)': v['I2'] + v['m2'] * v['l1'] * v['r2'],
        'M22(q=0)': v['I2'] + reflected,
        'm1*r1+m2*l1': v['m1'] * v['r1'] + v['m2'] * v['l1'], 'm2*r2': v['m2'] * v['r2'],
        'b1': v['b1'], 'b2': v['b2'], 'cf1 (atan(100 qd))': v['cf1'],
        'cf2 (atan(100 qd))': v['cf2']}
    return {'simple': published, 'double': double}


class AtanFriction(torch.nn.Module):
    """
    The DFKI friction model ``tau_f = b qd + cf atan(gain qd)`` with fixed coefficients.

    :param viscous: ``b`` per joint, N m s/rad.
    :param coulomb: ``cf`` per joint, N m (the level is ``cf pi / 2`` at high speed).
    :param gain: ``gain`` of the atan, s/rad.
    :param dtype: floating dtype.
    """

    def __init__(self, viscous: Sequence[float], coulomb: Sequence[float], gain: float,
                 dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        self.register_buffer('viscous', torch.tensor(viscous, dtype=dtype))
        self.register_buffer('coulomb', torch.tensor(coulomb, dtype=dtype))
        self.gain = float(gain)

    def forward(self, q: torch.Tensor, qd: torch.Tensor) -> torch.Tensor:
        """
        Return the friction torque.

        :param q: joint positions ``(..., n)``, rad (unused).
        :param qd: joint velocities ``(..., n)``, rad/s.
        :return: ``(..., n)`` N m, subtracted from the applied torque.
        """
        del q
        return self.viscous * qd + self.coulomb * torch.atan(self.gain * qd)


def dfki_published_predictor(nominal: RobotModel) -> Predictor:
    """
    Return the authors' identified double pendulum (model_2.0) as their plant simulates it.

    The shipped URDF and the catalog's rotor armature already carry model_2.0's inertials and
    ``gr^2 Ir + Ir``, ``gr^2 Ir`` on the diagonal; this row adds what the URDF cannot hold:
    their friction ``b qd + cf atan(100 qd)`` (the URDF: ``cf pi / 2 tanh(qd / eps)``) and the
    rotor coupling ``-gr Ir`` off the diagonal of their mass matrix (``docs/text/dynamics.rst``).
    The coupling enters the rollouts; the torque metrics (``rnea`` of the model) leave it out.

    :param nominal: the shipped model with the catalog's armature.
    :return: the predictor.
    """
    info = robots.get('double_pendulum')
    zero = torch.zeros_like(nominal.damping)
    model = nominal.replace(damping=zero, friction=zero)
    friction = AtanFriction(info.friction['viscous'], info.friction['coulomb_atan'],
                            info.friction['atan_gain'], nominal.dtype)
    base = physical_predictor('published', model, info.command_joints, None, friction,
                              DFKI_COULOMB_EPS)
    coupling = -info.motor['gear_ratio'] * info.motor['rotor_inertia']
    rotor = torch.tensor([[0.0, coupling], [coupling, 0.0]], dtype=model.dtype)

    def accel(q: torch.Tensor, qd: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        bias = rnea(model, q, qd, torch.zeros_like(q))
        mass = crba(model, q) + rotor
        return torch.linalg.solve(mass, (base.torque(q, qd, u) - bias)[..., None])[..., 0]
    return Predictor(label='published', model=model, accel=accel, torque=base.torque)


def dfki_prepare(runs: Sequence[Trajectory], rate_hz: float = DFKI_RATE_HZ,
                 cutoff_hz: float = DFKI_CUTOFF_HZ) -> List[Trajectory]:
    """
    Resample DFKI records, estimate derivatives and crop the filter's edge transient.

    ``ceil(rate / cutoff)`` samples are cropped at each end, as ``diffsim-fit`` crops them:
    the records start at rest and the zero-phase filter's edge leaves acceleration spikes
    there that least squares fits with high leverage (uncropped, NEA's gravity and inertia
    combinations of the double pendulum came out 55-70 % of the published ones).

    :param runs: loaded records.
    :param rate_hz: resampling rate, Hz.
    :param cutoff_hz: derivative low-pass cutoff, Hz.
    :return: the runs with ``qd``, ``qdd`` and filtered ``tau`` (and ``u``).
    """
    edge = int(math.ceil(rate_hz / cutoff_hz))
    out = [estimate_derivatives(resample(r, rate_hz), cutoff_hz=cutoff_hz, filter_inputs=True)
           for r in runs]
    return [r.crop(edge, len(r) - edge) for r in out]


def dfki_double_runs(root: Path, rate_hz: float = DFKI_RATE_HZ,
                     cutoff_hz: float = DFKI_CUTOFF_HZ
                     ) -> Tuple[List[Trajectory], List[Trajectory], List[Trajectory]]:
    """
    Return ``(train, early-stopping, validation)`` of the DFKI double pendulum (design A.0).

    The split of ``diffsim-fit dfki_double_pendulum`` (``--validation swingup
    --early-stopping train``): the identification records but the last are fitted, the last
    (``trajectory_13``) stops the fit, the three pendubot swing-ups are held out.

    :param root: data root.
    :param rate_hz: resampling rate, Hz.
    :param cutoff_hz: derivative low-pass cutoff, Hz.
    :return: the three lists, prepared by :func:`dfki_prepare` (so that the catalogue row is
        ``diffsim-fit``'s nominal model on the same samples).
    """
    runs = dfki_prepare(datasets.load_dfki_double_pendulum(root), rate_hz, cutoff_hz)
    sysid = [r for r in runs if datasets.run_kind(r.run) != 'swingup']
    swingups = [r for r in runs if datasets.run_kind(r.run) == 'swingup']
    return sysid[:-1], sysid[-1:], swingups


def dfki_configs(quick: bool) -> Dict[str, Tuple[str, Dict[str, Any]]]:
    """
    Return the fitted rows of the DFKI double-pendulum simulation table.

    :param quick: NEA and DiffNEA-inverse only.
    :return: ``label -> (estimator, config)``; ``DiffNEA-default`` is what ``diffsim-fit
        --method diffnea`` runs on this data (no motor: measured torques are the input).
    """
    out: Dict[str, Tuple[str, Dict[str, Any]]] = {
        'NEA': ('nea', {'source': 'tau', 'friction': ['viscous', 'coulomb'], 'coulomb': 'tanh',
                        'coulomb_eps': DFKI_COULOMB_EPS, 'armature': True}),
        'DiffNEA-inverse': ('diffnea', {
            'source': 'tau', 'learn': ['inertial', 'damping', 'coulomb'],
            'adam_iterations': ADAM_ITERATIONS, 'lbfgs_iterations': LBFGS_ITERATIONS,
            'lbfgs_max_inner': LBFGS_MAX_INNER})}
    if not quick:
        out['DiffNEA-default'] = ('diffnea', dict(
            {'source': 'tau'}, **simulation_schedule(DFKI_RATE_HZ, DiffNEAConfig.learn)))
    return out


def dfki_entry(predictor: Predictor, reference: Predictor, validation: Sequence[Trajectory],
               horizons: Sequence[float]) -> Dict[str, Any]:
    """
    Score one model on the held-out runs: rollout NMSE and torque error per joint.

    :param predictor: the model.
    :param reference: the catalogue model (torque variance scale shared by every row).
    :param validation: held-out runs.
    :param horizons: rollout horizons, s.
    :return: :func:`rollout_entry` plus ``torque_nmse`` / ``torque_mse`` ``{joint: value}``.
    """
    entry = rollout_entry(predictor, validation, 'tau', horizons)
    torque = torque_metrics(predictor, validation, 'tau', reference) or {}
    entry['torque_nmse'] = torque.get('nmse', {})
    entry['torque_mse'] = {j: None if v is None else v ** 2
                           for j, v in torque.get('rmse', {}).items()}
    return entry


def dfki_simulation_study(root: Path, quick: bool) -> Dict[str, Any]:
    """
    Fit the DFKI double pendulum on its identification records and simulate the swing-ups.

    Every row is scored on the same held-out swing-ups (:func:`dfki_double_runs`) with the
    measured torques as input; the fits start from the catalogue model.

    :param root: data root.
    :param quick: fewer rows and horizons.
    :return: ``{row: {'nmse_<h>s', 'diverged', 'torque_nmse', 'torque_mse', 'fit_s'}}`` and a
        ``_setup`` entry.
    """
    train, stopping, validation = dfki_double_runs(root)
    horizons = QUICK_HORIZONS if quick else HORIZONS
    nominal = robots.interface('double_pendulum').nominal_model()
    catalogue = physical_predictor('catalogue', nominal, nominal.joint_names, None, None,
                                   DFKI_COULOMB_EPS)
    out: Dict[str, Any] = {'_setup': {
        'train_runs': len(train), 'train_seconds': sum(r.duration for r in train),
        'early_stopping_runs': [r.run for r in stopping],
        'validation_runs': len(validation),
        'validation_seconds': sum(r.duration for r in validation),
        'rate_hz': DFKI_RATE_HZ, 'cutoff_hz': DFKI_CUTOFF_HZ, 'horizons_s': list(horizons),
        'joints': list(nominal.joint_names)}}
    rows: Dict[str, Predictor] = {'catalogue': catalogue,
                                  'published model_2.0': dfki_published_predictor(nominal)}
    for label, predictor in rows.items():
        out[label] = dict(dfki_entry(predictor, catalogue, validation, horizons), fit_s=0.0)
        _print_row('double_pendulum', label, out[label], horizons)
    for label, (method, config) in dfki_configs(quick).items():
        start = time.perf_counter()
        with torch.no_grad() if method == 'nea' else contextlib.nullcontext():
            result = fit(method, nominal, train, stopping, config)
        seconds = time.perf_counter() - start
        fitted = fitted_predictor(result, nominal, method, config)
        out[label] = dict(dfki_entry(fitted, catalogue, validation, horizons), fit_s=seconds)
        _print_row('double_pendulum', label, out[label], horizons)
    return out


def dfki_study(root: Path, quick: bool) -> Dict[str, Any]:
    """
    Identify the DFKI simple and double pendulum with NEA (and DiffNEA) and compare.

    :param root: data root.
    :param quick: NEA only, two double-pendulum runs.
    :return: ``{'simple': {method: combos}, 'double': {...}, 'published': {...},
        'double_simulation': {...}}`` (:func:`dfki_simulation_study`).
    """
    published = dfki_published(root)
    out: Dict[str, Any] = {'published': published, 'simple': {}, 'double': {},
                           'double_simulation': dfki_simulation_study(root, quick)}
    simple = dfki_prepare(datasets.load_dfki_simple_pendulum(root), DFKI_RATE_HZ,
                          DFKI_SIMPLE_CUTOFF_HZ)
    double = dfki_prepare(datasets.load_dfki_double_pendulum(root, kinds=('sine',)))
    double = double[:2] if quick else double
    methods = {'NEA': ('nea', {'source': 'tau', 'friction': ['viscous', 'coulomb', 'offset'],
                               'coulomb': 'tanh', 'coulomb_eps': 0.01, 'armature': True})}
    if not quick:
        methods['DiffNEA'] = ('diffnea', {'source': 'tau',
                                          'learn': ['inertial', 'damping', 'coulomb'],
                                          'adam_iterations': ADAM_ITERATIONS,
                                          'lbfgs_iterations': LBFGS_ITERATIONS})
    for name, runs in (('simple', simple), ('double', double)):
        nominal = model_of(f'{name}_pendulum')
        start = perturbed(nominal)
        out[name]['shipped URDF'] = dfki_combinations(nominal)
        out[name]['start'] = dfki_combinations(start)
        for label, (method, config) in methods.items():
            if method == 'nea' and name == 'double':
                config = dict(config, friction=['viscous', 'coulomb'])
            result = fit(method, start, runs, None, config)
            combos = dfki_combinations(result.model)
            for j, joint in enumerate(result.model.joint_names):
                combos[f'viscous {joint}'] = float(result.model.damping[j])
                combos[f'coulomb {joint} (tanh)'] = float(result.model.friction[j])
            out[name][label] = combos
    return out


# --------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------
def _fmt(value: Optional[float]) -> str:
    if value is None:
        return '-'
    if not math.isfinite(value):
        return 'inf'
    return f'{value:.3g}'


def print_report(payload: Dict[str, Any], target: _common.Target) -> List[str]:
    """
    Print the tables and return them as markdown lines (for the README).

    :param payload: the JSON payload.
    :param target: the Qube timing target.
    :return: markdown lines.
    """
    md: List[str] = []
    timing = payload.get('timing') or {}  # absent with --skip timing
    rows = []
    for key, entry in timing.items():
        if not isinstance(entry, dict):
            continue
        rows.append([key, _fmt(entry.get('seconds')), _fmt(entry.get('min_seconds')),
                     str(entry.get('samples', '-')), _fmt(entry.get('final_loss_nmse')),
                     entry.get('error', '')])
    headers = ['fit', 'median s', 'min s', 'samples', 'final NMSE', 'note']
    if rows:
        _common.print_section('timing (data to converged model)',
                              [_common.format_table(headers, rows)])
        md += ['**Timing: data to converged model**', '',
               _common.format_markdown_table(headers, rows), '']
    for robot in ('qube', 'cartpole'):
        section = payload.get(robot)
        if not section:
            continue
        setup = section['_setup']
        horizons = setup['horizons_s']
        headers = ['method'] + [f'NMSE {h:g} s' for h in horizons] + ['diverged', 'fit s']
        rows = [[label] + [_fmt(entry.get(f'nmse_{h:g}s')) for h in horizons]
                + ['yes' if entry['diverged'] else 'no', _fmt(entry.get('fit_s'))]
                for label, entry in section.items() if not label.startswith('_')]
        title = (f'{robot} (split {setup.get("split", "chirp")}): train '
                 f'{setup["train_runs"]} runs ({setup["train_seconds"]:.0f} s), validate '
                 f'{setup["validation_runs"]} held-out runs '
                 f'({setup["validation_seconds"]:.0f} s)')
        _common.print_section(title, [_common.format_table(headers, rows)])
        md += [f'**{title}**', '', _common.format_markdown_table(headers, rows), '']
    panda = payload.get('panda')
    if panda:
        joints = [f'j{i + 1}' for i in range(len(panda['gaz_table_iv']))]
        horizons = panda.get('horizons', [])
        rows = []
        for label, values in panda['per_joint_mse'].items():
            entry = panda.get('rollout', {}).get(label, {})
            rows.append([label] + [_fmt(v) for v in values]
                        + [_fmt(sum(v or 0.0 for v in values))]
                        + [_fmt(entry.get(f'nmse_{h:g}s')) for h in horizons])
        for label, key in (('Gaz Table IV (p-hat)', 'gaz_table_iv'),
                           ('Gaz Table IV (delta)', 'gaz_table_iv_delta')):
            rows.append([label] + [_fmt(v) for v in panda[key]] + [_fmt(sum(panda[key]))]
                        + ['-'] * len(horizons))
        headers = (['torque MSE N^2m^2'] + joints + ['sum']
                   + [f'rollout NMSE {h:g} s' for h in horizons])
        title = (f'panda: torque MSE on the last {panda["validation_seconds"]:.1f} s '
                 f'(trained on {panda["train_seconds"]:.1f} s)')
        _common.print_section(title, [_common.format_table(headers, rows)])
        md += [f'**{title}**', '', _common.format_markdown_table(headers, rows), '']
        rows = [[label] + [_fmt(v) for v in values] for label, values in panda['masses'].items()]
        headers = ['mass kg'] + joints
        _common.print_section('panda: link masses', [_common.format_table(headers, rows)])
        md += ['**Panda: link masses, kg**', '', _common.format_markdown_table(headers, rows),
               '']
    dfki = payload.get('dfki')
    if dfki:
        for name in ('simple', 'double'):
            section = dfki[name]
            published = dfki['published'][name]
            columns = ['published'] + list(section)
            keys = list(dict.fromkeys(list(published) + [
                k for entry in section.values() for k in entry]))
            rows = [[key, _fmt(published.get(key))]
                    + [_fmt(section[c].get(key)) for c in columns[1:]] for key in keys]
            headers = ['quantity'] + columns
            title = f'DFKI {name} pendulum: identified vs published'
            _common.print_section(title, [_common.format_table(headers, rows)])
            md += [f'**{title}**', '', _common.format_markdown_table(headers, rows), '']
        simulation = dfki.get('double_simulation')
        if simulation:
            md += _dfki_simulation_table(simulation)
    print()
    print(target.line())
    md += [f'- {target.line()}', '']
    return md


def _dfki_simulation_table(section: Dict[str, Any]) -> List[str]:
    """Print the DFKI double-pendulum simulation table and return it as markdown lines."""
    setup = section['_setup']
    horizons, joints = setup['horizons_s'], setup['joints']
    headers = (['model'] + [f'NMSE {h:g} s' for h in horizons]
               + [f'torque NMSE {j}' for j in joints] + [f'torque MSE {j}' for j in joints]
               + ['diverged', 'fit s'])
    rows = [[label] + [_fmt(entry.get(f'nmse_{h:g}s')) for h in horizons]
            + [_fmt(entry['torque_nmse'].get(j)) for j in joints]
            + [_fmt(entry['torque_mse'].get(j)) for j in joints]
            + ['yes' if entry['diverged'] else 'no', _fmt(entry.get('fit_s'))]
            for label, entry in section.items() if not label.startswith('_')]
    title = (f'DFKI double pendulum: train {setup["train_runs"]} identification records '
             f'({setup["train_seconds"]:.0f} s), validate {setup["validation_runs"]} held-out '
             f'swing-ups ({setup["validation_seconds"]:.0f} s), measured torque as input')
    _common.print_section(title, [_common.format_table(headers, rows)])
    return [f'**{title}**', '', _common.format_markdown_table(headers, rows), '']


def main(argv: Optional[Sequence[str]] = None) -> int:
    """
    Run the benchmark.

    :param argv: command-line arguments (default ``sys.argv[1:]``).
    :return: exit status.
    """
    parser = _common.make_parser(__doc__.strip().splitlines()[0])
    parser.add_argument('--data', default=None,
                        help='recorded-data root (default $DIFFSIM_DATA or '
                             f'{_common.DEFAULT_DATA})')
    parser.add_argument('--markdown', metavar='PATH', default=None,
                        help='write the result tables as markdown to PATH')
    parser.add_argument('--split', default='chirp', choices=SPLITS,
                        help='held-out runs of the qube / cartpole sections: chirp (train '
                             'chirps, validate swing-ups), mixed / mixed-odd (train chirps and '
                             'the even / odd swing-ups, validate the rest), halves (train '
                             'chirps and the first half of the swing-ups, validate the second), '
                             'swingup (train swing-ups, validate chirps)')
    parser.add_argument('--rows', default='all',
                        help='qube / cartpole rows: all; core (catalogue, NEA, '
                             'DiffNEA-inverse-viscous, DiffNEA-default); or comma-separated '
                             'row labels, e.g. DiffNEA-default,NEA (the catalogue is always in)')
    parser.add_argument('--skip', default='',
                        help='comma-separated sections to skip: timing,qube,cartpole,panda,dfki')
    args = parser.parse_args(argv)
    root = _common.data_root(args.data, 'identification.py')
    torch.set_num_threads(args.threads)
    skip = {s.strip() for s in args.skip.split(',') if s.strip()}
    machine = _common.machine_info(PACKAGES)
    print(f'machine: {machine["cpu_model"]}, {machine["usable_cores"]} usable cores, load '
          + ' '.join(f'{x:.2f}' for x in machine['load_average_1_5_15_min'] or []))
    started = time.perf_counter()
    payload: Dict[str, Any] = {'machine': machine, 'quick': args.quick, 'data': str(root)}
    sections: Sequence[Tuple[str, Callable[[Path, bool], Dict[str, Any]]]] = (
        ('timing', timing_study),
        ('qube', lambda r, q: quanser_study('qube', r, q, args.split, args.rows)),
        ('cartpole', lambda r, q: quanser_study('cartpole', r, q, args.split, args.rows)),
        ('panda', panda_study), ('dfki', dfki_study))
    for name, study in sections:
        if name in skip:
            continue
        print(f'[{time.perf_counter() - started:6.1f} s] {name} ...', flush=True)
        payload[name] = study(root, args.quick)
    qube_time = payload.get('timing', {}).get('qube_diffnea_viscous_voltage', {})
    target = _common.Target('Qube: 10 s chirp to converged DiffNEA model',
                            qube_time.get('seconds'), QUBE_TIME_LIMIT_S, 's')
    payload['targets'] = [target.to_dict()]
    payload['total_seconds'] = time.perf_counter() - started
    md = print_report(payload, target)
    print(f'total {payload["total_seconds"]:.0f} s')
    if args.json:
        _common.write_json(args.json, _jsonable(payload))
    if args.markdown:
        Path(args.markdown).write_text('\n'.join(md), encoding='utf-8')
    return 0


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    return value


if __name__ == '__main__':
    sys.exit(main())
