"""
DiffNEA: gradient-based identification of physically consistent robot models.

The learnable quantities are unconstrained vectors mapped to physical parameters that are
feasible for every value (Lutter et al., ICRA 2021, section 3.2; Rucker and Wensing, RA-L 2022):

- ``'inertial'``: per body, ``theta`` of :func:`diffsim_ros.core.make_parameterization`
  (``'diffnea'`` or ``'log_cholesky'``);
- ``'damping'``, ``'coulomb'``, ``'armature'``: the model's ``damping``, ``friction`` (Coulomb
  level of ``friction tanh(qd / eps)``) and ``armature`` fields, each ``scale softplus(raw)``;
- ``'kinematics'``: joint origins through a bounded
  :class:`~diffsim_ros.core.KinematicParameterization` around the nominal ones;
- ``'actuator'``: the constants of a :class:`~diffsim_ros.core.DCMotor` (voltage-commanded
  robots). Without a torque measurement, scaling every inertial parameter, friction
  coefficient and the motor's stall gain ``k_m / R_m`` together leaves the data unchanged, so
  by default (``actuator_gain='fixed'``) the gain stays at its nominal value and only ``k_m``
  (the back-EMF, i.e. the speed-dependent part) is learned (:class:`FixedGainMotor`);
- ``'friction_model'``: an extra friction module of :func:`diffsim_ros.core.make_friction`
  (``'stribeck'``, ``'nn-friction'``, ``'nn-residual'``...); neural ones see inputs and give
  outputs scaled by the data (:class:`ScaledFriction`) and are L2-regularised.

The inertial vectors are optimised as ``theta = theta_start + s * z`` with a per-entry scale
``s`` (1 for log-like entries, the body's radius of gyration for lengths), so one Adam
learning rate moves all parameters by comparable relative amounts. Coefficient scales
(``damping``, ``coulomb``, ``armature``) come from the data: torque standard deviation per
joint divided by that of ``qd`` (or ``qdd``); a start value of exactly zero is raised to
``1e-4`` of that scale so the softplus is not stuck in its flat tail.

Losses (:mod:`diffsim_ros.sysid.losses`): inverse dynamics, one-step forward (accelerations),
multi-step rollout over windows. The schedule is a list of :class:`Stage` s (progressive
parameter groups, horizon growth), each Adam then optional L-BFGS, with early stopping on a
validation run (the best model is returned) and a prior pulling the normalised parameters
``z`` toward the nominal model (``prior_weight``). The inverse-dynamics loss uses a
precomputed regressor when the kinematics are not learned (``rnea = Y pi + armature qdd``
exactly), which makes each iteration a small matrix product.
"""

import copy
from dataclasses import dataclass
import math
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.func import functional_call
import torch.nn.functional as F

from .losses import (ACTUATORS, as_trajectories, command_joints_for, command_matrix, Data,
                     error_metrics, forward_loss, inverse_dynamics_loss, make_actuator,
                     make_torque_fn, make_windows, resolve_source, rigid_torque, rollout_loss,
                     SampleBatch, stack_samples, state_scale, variance_scale, WindowBatch)
from .result import (check_choice, check_positive, EstimatorConfig, frozen_mapping,
                     IdentificationResult, inertial_parameters, joint_parameters, joint_unit)
from ..core.actuators import DCMotor, FrictionModel, make_friction, NNFriction, NNResidual
from ..core.dispatch import aba, rnea
from ..core.model import RobotModel
from ..core.parameterization import (is_physically_consistent, KinematicParameterization,
                                     make_parameterization, regularize_inertial)
from ..core.regressor import joint_torque_regressor

Tensor = torch.Tensor

#: Parameter groups DiffNEA can learn.
PARAMETER_GROUPS = ('inertial', 'damping', 'coulomb', 'armature', 'kinematics', 'actuator',
                    'friction_model')
#: Loss names.
LOSSES = ('inverse_dynamics', 'forward', 'rollout')
#: Friction modules by name (``'none'``: only the model's damping / Coulomb fields).
FRICTION_MODELS = ('none', 'viscous', 'coulomb', 'stribeck', 'sigmoid', 'nn-friction',
                   'nn-residual')
#: A coefficient that starts at zero starts at this fraction of its data scale instead.
START_FLOOR = 1e-4
#: Smearing radius (m) applied to nominal bodies that are not strictly consistent.
REGULARIZE_RADIUS = 1e-4
_DTYPES = {'float64': torch.float64, 'float32': torch.float32}
_MAX_NONFINITE = 5


@dataclass(frozen=True)
class Stage(EstimatorConfig):
    """
    One stage of a progressive schedule.

    :param groups: parameter groups learned in this stage (empty: the config's ``learn``).
    :param adam_iterations: Adam steps.
    :param lbfgs_iterations: L-BFGS steps after Adam (each up to ``lbfgs_max_inner``
        iterations with a strong-Wolfe line search).
    :param lr: Adam learning rate (0: the config's ``lr``).
    :param loss: loss of this stage (empty: the config's ``loss``).
    :param horizon: rollout horizon of this stage (0: the config's ``horizon``).
    :param torque_weight: weight of the inverse-dynamics loss added to this stage's loss
        (0: none): a multi-step refinement then keeps explaining measured torques, which on
        a robot with joint torque sensors are the most direct measurement there is.  When
        the last stage has one, early stopping judges the same sum on the validation data.
    """

    groups: Tuple[str, ...] = ()
    adam_iterations: int = 200
    lbfgs_iterations: int = 0
    lr: float = 0.0
    loss: str = ''
    horizon: int = 0
    torque_weight: float = 0.0

    def __post_init__(self) -> None:
        """Validate the fields."""
        object.__setattr__(self, 'groups', tuple(self.groups))
        for group in self.groups:
            check_choice('groups', group, PARAMETER_GROUPS)
        check_positive('adam_iterations', self.adam_iterations, allow_zero=True, integer=True)
        check_positive('lbfgs_iterations', self.lbfgs_iterations, allow_zero=True,
                       integer=True)
        check_positive('lr', self.lr, allow_zero=True)
        check_positive('horizon', self.horizon, allow_zero=True, integer=True)
        check_positive('torque_weight', self.torque_weight, allow_zero=True)
        if self.loss:
            check_choice('loss', self.loss, LOSSES)


@dataclass(frozen=True)
class DiffNEAConfig(EstimatorConfig):
    """
    Configuration of :func:`fit_diffnea` (frozen; :meth:`from_dict` rejects unknown keys).

    :param parameterization: ``'diffnea'`` or ``'log_cholesky'``.
    :param loss: ``'inverse_dynamics'``, ``'forward'`` or ``'rollout'`` (also the validation
        objective).
    :param learn: parameter groups (:data:`PARAMETER_GROUPS`) of the default single stage.
    :param stages: progressive schedule; empty: one stage learning ``learn`` with
        ``adam_iterations`` and ``lbfgs_iterations``.
    :param adam_iterations: Adam steps of the default stage.
    :param lbfgs_iterations: L-BFGS steps of the default stage.
    :param lr: Adam learning rate (on the normalised parameters ``z``).
    :param lbfgs_max_inner: iterations inside one L-BFGS step.
    :param horizon: rollout window length in samples.
    :param window_stride: samples between window starts (0: ``horizon``).
    :param integrator: ``'rk4'`` or ``'semi_implicit_euler'``.
    :param wrap_angles: wrap revolute angle errors to ``(-pi, pi]`` in the rollout loss.
    :param coulomb_eps: smoothing velocity of ``friction tanh(qd / eps)``, rad/s or m/s.
    :param friction_model: extra friction module (:data:`FRICTION_MODELS`).
    :param friction_kwargs: its constructor arguments (e.g. ``hidden``, initial coefficients).
    :param actuator: actuator model (:data:`losses.ACTUATORS`).
    :param actuator_kwargs: its constructor arguments.
    :param actuator_gain: ``'fixed'`` (learn only ``k_m`` at constant ``k_m / R_m``) or
        ``'free'`` (learn both; unidentifiable scale unless inertials are fixed or a prior
        holds them).
    :param command_joints: joints driven by the columns of ``u``.
    :param source: where the applied effort comes from: ``'auto'``, ``'tau'`` or ``'u'``.
    :param kinematic_xyz_radius: bound of learned joint-origin offsets, m.
    :param kinematic_rpy_radius: bound of learned joint-origin rotations, rad.
    :param prior_weight: weight of ``mean(z_nominal^2)``, the prior toward the nominal model.
    :param nn_weight_decay: weight of the sum of squared neural-network weights.
    :param eval_every: Adam steps between validation evaluations (and after every L-BFGS
        step).
    :param patience: evaluations without improvement that end a stage (0: no early stop).
    :param min_delta: relative improvement of the validation loss that counts.
    :param loss_tolerance: end a stage once the training objective is below this.
    :param max_seconds: wall-time budget of the whole fit (0: none).
    :param max_regressor_mb: largest precomputed regressor, MB (beyond it RNEA runs).
    :param seed: seed of the local generator initialising neural networks.
    :param dtype: ``'float64'`` or ``'float32'``.
    """

    parameterization: str = 'diffnea'
    loss: str = 'inverse_dynamics'
    learn: Tuple[str, ...] = ('inertial', 'damping', 'coulomb')
    stages: Tuple[Stage, ...] = ()
    adam_iterations: int = 200
    lbfgs_iterations: int = 20
    lr: float = 2e-2
    lbfgs_max_inner: int = 20
    horizon: int = 10
    window_stride: int = 0
    integrator: str = 'rk4'
    wrap_angles: bool = True
    coulomb_eps: float = 1e-2
    friction_model: str = 'none'
    friction_kwargs: Mapping[str, Any] = None
    actuator: str = 'none'
    actuator_kwargs: Mapping[str, Any] = None
    actuator_gain: str = 'fixed'
    command_joints: Tuple[str, ...] = ()
    source: str = 'auto'
    kinematic_xyz_radius: float = 0.05
    kinematic_rpy_radius: float = 0.2
    prior_weight: float = 0.0
    nn_weight_decay: float = 1e-4
    eval_every: int = 10
    patience: int = 10
    min_delta: float = 0.0
    loss_tolerance: float = 0.0
    max_seconds: float = 0.0
    max_regressor_mb: float = 512.0
    seed: int = 0
    dtype: str = 'float64'

    def __post_init__(self) -> None:
        """Validate the fields."""
        for name in ('learn', 'command_joints'):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, 'stages', tuple(
            s if isinstance(s, Stage) else Stage.from_dict(s) for s in self.stages))
        for name in ('friction_kwargs', 'actuator_kwargs'):
            object.__setattr__(self, name, frozen_mapping(getattr(self, name), name))
        check_choice('parameterization', self.parameterization, ('diffnea', 'log_cholesky'))
        check_choice('loss', self.loss, LOSSES)
        check_choice('integrator', self.integrator, ('rk4', 'semi_implicit_euler'))
        check_choice('friction_model', self.friction_model, FRICTION_MODELS)
        check_choice('actuator', self.actuator, ACTUATORS)
        check_choice('actuator_gain', self.actuator_gain, ('fixed', 'free'))
        check_choice('source', self.source, ('auto', 'tau', 'u'))
        check_choice('dtype', self.dtype, tuple(_DTYPES))
        for group in self.learn:
            check_choice('learn', group, PARAMETER_GROUPS)
        for name in ('adam_iterations', 'lbfgs_iterations', 'window_stride', 'patience',
                     'seed'):
            check_positive(name, getattr(self, name), allow_zero=True, integer=True)
        for name in ('lbfgs_max_inner', 'horizon', 'eval_every'):
            check_positive(name, getattr(self, name), integer=True)
        for name in ('lr', 'coulomb_eps', 'kinematic_xyz_radius', 'kinematic_rpy_radius',
                     'max_regressor_mb'):
            check_positive(name, getattr(self, name))
        for name in ('prior_weight', 'nn_weight_decay', 'min_delta', 'loss_tolerance',
                     'max_seconds'):
            check_positive(name, getattr(self, name), allow_zero=True)
        if not isinstance(self.wrap_angles, bool):
            raise ValueError(f'wrap_angles must be a bool, got {self.wrap_angles!r}')
        groups = self.all_groups()
        if 'actuator' in groups and self.actuator == 'none':
            raise ValueError("learning the 'actuator' group needs an actuator model "
                             "(actuator: 'dc_motor', 'qube_servo2' or 'quanser_ip02')")
        if 'friction_model' in groups and self.friction_model == 'none':
            raise ValueError("learning the 'friction_model' group needs friction_model "
                             f'set to one of {FRICTION_MODELS[1:]}')

    def schedule(self) -> Tuple[Stage, ...]:
        """Return the stages with every default resolved."""
        stages = self.stages or (Stage(groups=self.learn, adam_iterations=self.adam_iterations,
                                       lbfgs_iterations=self.lbfgs_iterations),)
        return tuple(Stage(groups=s.groups or self.learn, adam_iterations=s.adam_iterations,
                           lbfgs_iterations=s.lbfgs_iterations, lr=s.lr or self.lr,
                           loss=s.loss or self.loss, horizon=s.horizon or self.horizon,
                           torque_weight=s.torque_weight)
                     for s in stages)

    def all_groups(self) -> Tuple[str, ...]:
        """Return every group some stage learns, in :data:`PARAMETER_GROUPS` order."""
        used = set(self.learn) if not self.stages else set()
        for stage in self.stages:
            used |= set(stage.groups or self.learn)
        return tuple(g for g in PARAMETER_GROUPS if g in used)


#: Length of the shooting windows of :func:`simulation_schedule`, s.
SCHEDULE_WINDOW_S = 0.1
#: Windows of :func:`simulation_schedule` start every this many window lengths: a quarter of
#: the samples are simulated per step, a quarter of the cost; on the real Quanser runs 150
#: steps over a quarter simulated better than 60 over half (same wall time).
SCHEDULE_STRIDE_WINDOWS = 4
#: Adam / L-BFGS steps of the inverse-dynamics stage, Adam steps and learning rate of the
#: multi-step stage of :func:`simulation_schedule`.
SCHEDULE_INVERSE_STEPS = (200, 20)
SCHEDULE_ROLLOUT_STEPS = 150
SCHEDULE_ROLLOUT_LR = 3e-2


def simulation_schedule(rate_hz: float, groups: Sequence[str],
                        refine_groups: Sequence[str] = (),
                        window_s: float = SCHEDULE_WINDOW_S,
                        torque_weight: float = 0.0) -> Dict[str, Any]:
    """
    Return the :class:`DiffNEAConfig` keys of the fit for simulation: inverse, then multi-step.

    Stage 1 fits ``groups`` on the inverse-dynamics loss (cheap: a precomputed regressor);
    stage 2 refines ``groups + refine_groups`` on the RK4 rollout loss over shooting windows of
    ``window_s`` that start from measured states, the integrator and step the model is scored
    and used with.  Early stopping and the best model are judged by that rollout loss on the
    validation runs.  On the real Quanser recordings the inverse fit alone simulates worse
    than the catalogue model (it fits torques from filtered accelerations) and the
    refinement makes it simulate better (``benchmarks/README.md``, identification).

    :param rate_hz: sample rate of the (uniformly sampled) data, Hz.
    :param groups: parameter groups of both stages (:data:`PARAMETER_GROUPS`).
    :param refine_groups: groups learned in the multi-step stage only (e.g. ``'actuator'``:
        the back-EMF is hard to see in torques from filtered accelerations).
    :param window_s: shooting window length, s.
    :param torque_weight: weight of the inverse-dynamics loss kept in stage 2
        (:attr:`Stage.torque_weight`; 1 weighs the two normalised losses equally).  For
        robots with joint torque sensors: on the Panda's published excitation the rollout
        stage alone lowered the held-out 0.5 s rollout NMSE 20x but made the torque error
        27x worse than the inverse fit's (6x worse than the catalogue's); with weight 1 both
        stay better than the catalogue (``benchmarks/README.md``).
    :return: ``loss``, ``horizon``, ``window_stride``, ``learn`` and ``stages``.
    :raises ValueError: a non-positive rate or window, or an unknown group.
    """
    if not rate_hz > 0 or not window_s > 0:
        raise ValueError(f'rate_hz and window_s must be > 0, got {rate_hz!r}, {window_s!r}')
    inverse = tuple(dict.fromkeys(groups))
    refine = tuple(dict.fromkeys(inverse + tuple(refine_groups)))
    for group in refine:
        check_choice('groups', group, PARAMETER_GROUPS)
    horizon = max(2, int(round(window_s * rate_hz)))
    adam, lbfgs = SCHEDULE_INVERSE_STEPS
    return {'loss': 'rollout', 'horizon': horizon,
            'window_stride': SCHEDULE_STRIDE_WINDOWS * horizon, 'learn': list(refine),
            'stages': [{'groups': list(inverse), 'loss': 'inverse_dynamics',
                        'adam_iterations': adam, 'lbfgs_iterations': lbfgs},
                       {'groups': list(refine), 'loss': 'rollout',
                        'adam_iterations': SCHEDULE_ROLLOUT_STEPS,
                        'lbfgs_iterations': 0, 'lr': SCHEDULE_ROLLOUT_LR,
                        'torque_weight': float(torque_weight)}]}


def _softplus(x: Tensor) -> Tensor:
    return F.softplus(x, beta=1.0, threshold=40.0)


def _softplus_inverse(y: Tensor) -> Tensor:
    return y + torch.log(-torch.expm1(-y))


class ScaledFriction(FrictionModel):
    """
    A friction module seen through data scales: ``tau_scale f(q / q_scale, qd / qd_scale)``.

    Keeps neural friction models well conditioned whatever the robot's units; passivity of
    :class:`~diffsim_ros.core.NNFriction` is preserved (positive scales).

    :param inner: the wrapped module on normalised inputs.
    :param q_scale: ``(n,)`` position scale.
    :param qd_scale: ``(n,)`` velocity scale.
    :param tau_scale: ``(n,)`` torque scale.
    """

    def __init__(self, inner: FrictionModel, q_scale: Tensor, qd_scale: Tensor,
                 tau_scale: Tensor) -> None:
        super().__init__(inner.n)
        self.inner = inner
        self.register_buffer('q_scale', q_scale.detach().clone())
        self.register_buffer('qd_scale', qd_scale.detach().clone())
        self.register_buffer('tau_scale', tau_scale.detach().clone())

    def torque(self, q: Tensor, qd: Tensor) -> Tensor:
        """Return the scaled friction torque."""
        return self.tau_scale * self.inner(q / self.q_scale, qd / self.qd_scale)


def reset_linear(module: nn.Module, generator: torch.Generator) -> None:
    """
    Re-draw every ``nn.Linear`` of a module from a local generator (PyTorch's default law).

    Weights and biases ``~ U(-1/sqrt(fan_in), 1/sqrt(fan_in))``, as ``nn.Linear`` does with the
    global generator, so initialisation is reproducible without touching global seeds.

    :param module: the module, changed in place (before training).
    :param generator: local generator on the module's device.
    """
    with torch.no_grad():
        for layer in module.modules():
            if isinstance(layer, nn.Linear):
                bound = 1.0 / math.sqrt(layer.in_features)
                layer.weight.uniform_(-bound, bound, generator=generator)
                if layer.bias is not None:
                    layer.bias.uniform_(-bound, bound, generator=generator)


class FixedGainMotor(nn.Module):
    """
    A :class:`~diffsim_ros.core.DCMotor` learned at constant stall gain ``k_m / R_m``.

    ``R_m = k_m / gain`` with the gain fixed at the wrapped motor's value, so the voltage path
    keeps its scale and only the back-EMF term ``k_m^2 / R_m qd = gain k_m qd`` changes.

    :param motor: the motor; its ``log_motor_constant`` is the learned tensor.
    """

    def __init__(self, motor: DCMotor) -> None:
        super().__init__()
        self.motor = motor
        self.register_buffer('log_gain', (motor.log_motor_constant
                                          - motor.log_resistance).detach().clone())

    def forward(self, voltage: Tensor, qd: Tensor) -> Tensor:
        """Return the motor torque with ``log R_m = log k_m - log gain``."""
        tied = {'log_resistance': self.motor.log_motor_constant - self.log_gain}
        return functional_call(self.motor, tied, (voltage, qd), strict=False)

    def synced(self) -> DCMotor:
        """Return the wrapped motor with its resistance set from the tie (in place)."""
        with torch.no_grad():
            self.motor.log_resistance.copy_(self.motor.log_motor_constant - self.log_gain)
        return self.motor


def _is_network(module: Optional[nn.Module]) -> bool:
    inner = module.inner if isinstance(module, ScaledFriction) else module
    return isinstance(inner, (NNFriction, NNResidual))


def _feasible(pi: Tensor, fallback: Optional[Tensor] = None) -> Tensor:
    """
    Return ``pi`` with bodies that are not strictly consistent slightly thickened.

    Bodies that stay infeasible (e.g. a least-squares warm start) are replaced by the
    ``fallback`` bodies when given.
    """
    bad = ~is_physically_consistent(pi)
    if not bool(bad.any()):
        return pi
    fixed = torch.where(bad[..., None], regularize_inertial(pi, REGULARIZE_RADIUS), pi)
    still = ~is_physically_consistent(fixed)
    if fallback is not None and bool(still.any()):
        fixed = torch.where(still[..., None], _feasible(fallback), fixed)
    if not bool(is_physically_consistent(fixed).all()):
        raise ValueError('the model has bodies that are not physically consistent (e.g. zero '
                         'or negative mass) and cannot be thickened into feasible ones')
    return fixed


def _theta_scale(parameterization: str, pi: Tensor) -> Tensor:
    """Per-entry scale of the unconstrained inertial parameters ``(n, 10)``."""
    mass = pi[..., 0]
    trace = pi[..., 4] + pi[..., 7] + pi[..., 9]
    length = (0.5 * trace / mass).clamp_min(1e-6).sqrt().clamp_min(1e-3)
    ones = torch.ones_like(pi)
    lengths = length[..., None].expand_as(pi)
    columns = torch.arange(10, device=pi.device)
    is_length = (columns >= 1) & (columns <= 3) if parameterization == 'diffnea' \
        else columns >= 4
    return torch.where(is_length, lengths, ones)


class PhysicalParameters(nn.Module):
    """
    The learnable physical parameters of a robot (see the module docstring).

    :param nominal: the nominal model (prior anchor).
    :param start: the model to start from (nominal, or a warm start).
    :param groups: every group that will be learned; the others are taken from ``start``.
    :param parameterization: ``'diffnea'`` or ``'log_cholesky'``.
    :param coefficient_scales: ``{'damping' | 'coulomb' | 'armature': (n,)}`` data scales.
    :param kinematics: bounded kinematic parameterization, needed with ``'kinematics'``.
    :param actuator: actuator module or ``None``.
    :param friction: extra friction module or ``None``.
    """

    def __init__(self, nominal: RobotModel, start: RobotModel, groups: Sequence[str],
                 parameterization: str, coefficient_scales: Mapping[str, Tensor],
                 kinematics: Optional[KinematicParameterization] = None,
                 actuator: Optional[nn.Module] = None,
                 friction: Optional[nn.Module] = None) -> None:
        super().__init__()
        self.nominal = nominal
        self.start = start
        self.groups = tuple(groups)
        self.parameterization = make_parameterization(parameterization)
        self.actuator = actuator
        self.friction = friction
        self.kinematics = kinematics
        like = {'dtype': start.dtype, 'device': start.device}
        if 'inertial' in self.groups:
            pi_start = _feasible(start.inertial.detach(), nominal.inertial.detach())
            theta_start = self.parameterization.from_inertial(pi_start)
            theta_nominal = self.parameterization.from_inertial(_feasible(nominal.inertial))
            scale = _theta_scale(parameterization, pi_start)
            self.register_buffer('theta_start', theta_start)
            self.register_buffer('theta_scale', scale)
            self.register_buffer('z_nominal', (theta_nominal - theta_start) / scale)
            self.inertial_z = nn.Parameter(torch.zeros_like(theta_start))
        for group, field in (('damping', 'damping'), ('coulomb', 'friction'),
                             ('armature', 'armature')):
            if group not in self.groups:
                continue
            scale = coefficient_scales[group].to(**like)
            floor = START_FLOOR * scale
            raw = _softplus_inverse(getattr(start, field).detach().maximum(floor) / scale)
            raw_nominal = _softplus_inverse(getattr(nominal, field).maximum(floor) / scale)
            self.register_buffer(f'{group}_scale', scale)
            self.register_buffer(f'{group}_nominal', raw_nominal)
            setattr(self, f'{group}_raw', nn.Parameter(raw))
        if 'kinematics' in self.groups:
            theta = kinematics.from_xyz_rpy(start.origin_xyz.detach(), start.origin_rpy.detach())
            self.kinematic_theta = nn.Parameter(theta)
            self.register_buffer('kinematic_nominal', kinematics.from_xyz_rpy(
                nominal.origin_xyz, nominal.origin_rpy))

    def group_parameters(self, group: str) -> List[nn.Parameter]:
        """
        Return the tensors optimised for a group.

        :param group: one of :data:`PARAMETER_GROUPS`.
        :return: list of parameters (empty when the group is not learnable here).
        """
        if group not in self.groups:
            return []
        if group == 'inertial':
            return [self.inertial_z]
        if group in ('damping', 'coulomb', 'armature'):
            return [getattr(self, f'{group}_raw')]
        if group == 'kinematics':
            return [self.kinematic_theta]
        module = self.actuator if group == 'actuator' else self.friction
        if isinstance(module, FixedGainMotor):
            return [module.motor.log_motor_constant]
        return list(module.parameters()) if module is not None else []

    def model(self) -> RobotModel:
        """
        Return the robot model of the current parameter values (differentiable).

        :return: ``start`` with the learned fields replaced.
        """
        changes = {}
        if 'inertial' in self.groups:
            theta = self.theta_start + self.theta_scale * self.inertial_z
            changes['inertial'] = self.parameterization.to_inertial(theta)
        for group, field in (('damping', 'damping'), ('coulomb', 'friction'),
                             ('armature', 'armature')):
            if group in self.groups:
                changes[field] = getattr(self, f'{group}_scale') * _softplus(
                    getattr(self, f'{group}_raw'))
        if 'kinematics' in self.groups:
            xyz, rpy = self.kinematics.to_xyz_rpy(self.kinematic_theta)
            changes['origin_xyz'], changes['origin_rpy'] = xyz, rpy
        return self.start.replace(**changes)

    def prior(self) -> Tensor:
        """
        Return the mean squared normalised distance of the learned groups from the nominal.

        Inertial: ``z - z_nominal``; coefficients: softplus raw values; kinematics: their
        unconstrained values.

        :return: scalar.
        """
        terms = []
        if 'inertial' in self.groups:
            terms.append((self.inertial_z - self.z_nominal).reshape(-1))
        for group in ('damping', 'coulomb', 'armature'):
            if group in self.groups:
                terms.append(getattr(self, f'{group}_raw') - getattr(self, f'{group}_nominal'))
        if 'kinematics' in self.groups:
            terms.append((self.kinematic_theta - self.kinematic_nominal).reshape(-1))
        if not terms:
            return torch.zeros((), dtype=self.start.dtype, device=self.start.device)
        return torch.cat(terms).square().mean()

    def network_l2(self) -> Tensor:
        """
        Return the sum of squared weights of neural friction models (0 without one).

        :return: scalar.
        """
        total = torch.zeros((), dtype=self.start.dtype, device=self.start.device)
        if _is_network(self.friction):
            for weight in self.friction.parameters():
                total = total + weight.square().sum()
        return total


# ---------------------------------------------------------------------------------------------
# The optimisation loop (shared with the black-box baseline)
# ---------------------------------------------------------------------------------------------
@dataclass
class StagePlan:
    """
    One stage ready to run: parameters, objective and iteration counts.

    :param parameters: tensors to optimise.
    :param objective: returns the scalar training objective.
    :param adam_iterations: Adam steps.
    :param lbfgs_iterations: L-BFGS steps.
    :param lr: Adam learning rate.
    """

    parameters: List[nn.Parameter]
    objective: Callable[[], Tensor]
    adam_iterations: int
    lbfgs_iterations: int
    lr: float


@dataclass
class StopRules:
    """
    Evaluation and stopping settings of :func:`optimize`.

    :param eval_every: Adam steps between validations.
    :param patience: evaluations without improvement that end a stage (0: never).
    :param min_delta: relative improvement that counts.
    :param loss_tolerance: end a stage once the objective is below this.
    :param max_seconds: wall-time budget (0: none).
    :param lbfgs_max_inner: iterations inside one L-BFGS step.
    """

    eval_every: int = 10
    patience: int = 10
    min_delta: float = 0.0
    loss_tolerance: float = 0.0
    max_seconds: float = 0.0
    lbfgs_max_inner: int = 20


class _Tracker:
    """Bookkeeping of :func:`optimize`: curves, best state, patience and budget."""

    def __init__(self, module: nn.Module, validate: Optional[Callable[[], float]],
                 rules: StopRules) -> None:
        self.module = module
        self.validate = validate
        self.rules = rules
        self.start = time.perf_counter()
        self.train: List[float] = []
        self.stage: List[int] = []
        self.validation: List[float] = []
        self.validation_iteration: List[int] = []
        self.best = math.inf
        self.best_iteration = 0
        self.best_state = self.snapshot()
        self.stale = 0
        self.stopped_early = False
        self.evaluated_at = -1

    def snapshot(self) -> Dict[str, Tensor]:
        return {k: v.detach().clone() for k, v in self.module.state_dict().items()}

    def restore(self, state: Dict[str, Tensor]) -> None:
        with torch.no_grad():
            self.module.load_state_dict(state)

    def out_of_time(self) -> bool:
        budget = self.rules.max_seconds
        return budget > 0 and time.perf_counter() - self.start > budget

    def record(self, loss: float, stage: int) -> None:
        self.train.append(loss)
        self.stage.append(stage)

    def evaluate(self) -> bool:
        """Validate now; return True when patience is exhausted."""
        self.evaluated_at = len(self.train)
        if self.validate is None:
            self.best_state = self.snapshot()
            self.best_iteration = len(self.train)
            return False
        with torch.no_grad():
            value = float(self.validate())
        self.validation.append(value)
        self.validation_iteration.append(len(self.train))
        threshold = self.best - self.rules.min_delta * abs(self.best) \
            if math.isfinite(self.best) else math.inf
        if math.isfinite(value) and value < threshold:
            self.best, self.best_iteration, self.stale = value, len(self.train), 0
            self.best_state = self.snapshot()
            return False
        self.stale += 1
        exhausted = self.rules.patience > 0 and self.stale >= self.rules.patience
        self.stopped_early |= exhausted
        return exhausted


def _run_adam(plan: StagePlan, index: int, tracker: _Tracker) -> str:
    rules = tracker.rules
    lr = plan.lr
    optimizer = torch.optim.Adam(plan.parameters, lr=lr)
    failures = 0
    for step in range(plan.adam_iterations):
        optimizer.zero_grad(set_to_none=True)
        loss = plan.objective()
        value = float(loss.detach())
        if not math.isfinite(value):
            failures += 1
            tracker.restore(tracker.best_state)
            if failures > _MAX_NONFINITE:
                return 'diverged'
            lr *= 0.5
            optimizer = torch.optim.Adam(plan.parameters, lr=lr)
            continue
        loss.backward()
        optimizer.step()
        tracker.record(value, index)
        if (step + 1) % rules.eval_every == 0 and tracker.evaluate():
            return 'patience'
        if value < rules.loss_tolerance:
            return 'tolerance'
        if tracker.out_of_time():
            return 'time'
    return 'done'


def _run_lbfgs(plan: StagePlan, index: int, tracker: _Tracker) -> None:
    rules = tracker.rules
    optimizer = torch.optim.LBFGS(plan.parameters, lr=1.0, max_iter=rules.lbfgs_max_inner,
                                  history_size=20, line_search_fn='strong_wolfe',
                                  tolerance_grad=1e-12, tolerance_change=1e-15)

    def closure() -> Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = plan.objective()
        if loss.requires_grad:
            loss.backward()
        return loss

    previous = math.inf
    for _ in range(plan.lbfgs_iterations):
        value = float(optimizer.step(closure).detach())
        if not math.isfinite(value):
            tracker.restore(tracker.best_state)
            return
        tracker.record(value, index)
        if tracker.evaluate() or value < rules.loss_tolerance or tracker.out_of_time():
            return
        if abs(previous - value) <= 1e-13 * max(abs(value), 1e-300):
            return
        previous = value


def optimize(module: nn.Module, plans: Sequence[StagePlan],
             validate: Optional[Callable[[], float]], rules: StopRules) -> Dict[str, Any]:
    """
    Run a staged Adam / L-BFGS schedule with early stopping; leave the best state loaded.

    With ``validate``, the validation loss is evaluated before the first step, every
    ``eval_every`` Adam steps, at the end of every Adam phase and after every L-BFGS step; a
    stage ends after ``patience``
    evaluations without improvement, the next stage starts from the best state so far, and
    the best state over the whole run is loaded at the end. Without it, the final state is
    kept. A non-finite objective restores the best (last evaluated) state and halves the Adam
    learning rate. Every parameter of ``module`` is left with ``requires_grad=False``.

    :param module: holds every optimised tensor (its ``state_dict`` is snapshotted).
    :param plans: the stages.
    :param validate: returns the validation loss, or ``None``.
    :param rules: evaluation and stopping settings.
    :return: ``history`` (``train``, ``stage``, ``validation``, ``validation_iteration``),
        ``iterations``, ``best_iteration``, ``best_validation``, ``stopped_early``,
        ``out_of_time``.
    """
    tracker = _Tracker(module, validate, rules)
    tracker.evaluate()
    for index, plan in enumerate(plans):
        if tracker.out_of_time():
            break
        tracker.stale = 0
        for p in module.parameters():
            p.requires_grad_(False)
        for p in plan.parameters:
            p.requires_grad_(True)
        if not plan.parameters:
            continue
        reason = _run_adam(plan, index, tracker) if plan.adam_iterations else 'done'
        if tracker.evaluated_at != len(tracker.train) and tracker.evaluate():
            reason = 'patience'
        if plan.lbfgs_iterations and reason == 'done':
            _run_lbfgs(plan, index, tracker)
        if validate is not None:
            tracker.restore(tracker.best_state)
    if validate is None:
        tracker.evaluate()
    tracker.restore(tracker.best_state)
    for p in module.parameters():
        p.requires_grad_(False)
    return {
        'history': {'train': tuple(tracker.train), 'stage': tuple(tracker.stage),
                    'validation': tuple(tracker.validation),
                    'validation_iteration': tuple(tracker.validation_iteration)},
        'iterations': len(tracker.train), 'best_iteration': tracker.best_iteration,
        'best_validation': tracker.best if validate is not None else None,
        'stopped_early': tracker.stopped_early, 'out_of_time': tracker.out_of_time(),
    }


# ---------------------------------------------------------------------------------------------
# DiffNEA
# ---------------------------------------------------------------------------------------------
@dataclass
class _Data:
    """One data split prepared for every loss the schedule needs."""

    batch: Optional[SampleBatch]
    windows: Dict[int, WindowBatch]
    regressor: Optional[Tensor]
    cache: Dict[str, Any]


def _finite_difference_qdd(runs: Sequence[Any], model: RobotModel) -> Tensor:
    parts = []
    for run in runs:
        qd = run.qd.to(model.dtype)
        t = run.t.to(model.dtype)
        if len(run) < 2:
            parts.append(torch.zeros_like(qd))
            continue
        dqd = torch.diff(qd, dim=0) / torch.diff(t)[:, None]
        parts.append(torch.cat((dqd, dqd[-1:])))
    return torch.cat(parts)


def _scales(model: RobotModel, runs: Sequence[Any], source: str, torque_fn: Callable,
            wrap_mask: Tensor) -> Dict[str, Tensor]:
    """Normalisations of the losses and coefficient scales, from the nominal model."""
    batch = stack_samples(runs, model, source, need_qdd=False)
    qdd = batch.qdd if batch.qdd is not None else _finite_difference_qdd(runs, model)
    with torch.no_grad():
        applied = torque_fn(batch.q, batch.qd, batch.u)
        rigid = rnea(model, batch.q, batch.qd, qdd)
    torque_var = torch.maximum(variance_scale(applied), variance_scale(rigid))
    torque_std = torque_var.sqrt()
    return {
        'torque': torque_var, 'qdd': variance_scale(qdd),
        'state': state_scale(batch.q, batch.qd, wrap_mask),
        'damping': torque_std / variance_scale(batch.qd).sqrt(),
        'coulomb': torque_std,
        'armature': torque_std / variance_scale(qdd).sqrt(),
        'q': variance_scale(batch.q).sqrt(), 'qd': variance_scale(batch.qd).sqrt(),
    }


def _make_friction_module(config: DiffNEAConfig, model: RobotModel,
                          scales: Mapping[str, Tensor]) -> Optional[nn.Module]:
    if config.friction_model == 'none':
        return None
    like = {'dtype': model.dtype, 'device': model.device}
    kwargs = dict(config.friction_kwargs)
    if config.friction_model not in ('nn-friction', 'nn-residual'):
        return make_friction(config.friction_model, model.n, **like, **kwargs)
    inner = make_friction(config.friction_model, model.n, **like, **kwargs)
    reset_linear(inner, torch.Generator(device=model.device).manual_seed(config.seed))
    last = inner.net[-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.fill_(-6.0 if config.friction_model == 'nn-friction' else 0.0)
    return ScaledFriction(inner, scales['q'], scales['qd'], scales['torque'].sqrt())


def _prepare_split(runs: Sequence[Any], model: RobotModel, source: str, losses: Sequence[str],
                   horizons: Sequence[int], stride: int, with_regressor: bool,
                   max_mb: float) -> _Data:
    need_samples = any(loss != 'rollout' for loss in losses)
    batch = stack_samples(runs, model, source, need_qdd=True) if need_samples else None
    windows = {h: make_windows(runs, model, source, h, stride or h) for h in horizons}
    regressor = None
    if with_regressor and batch is not None:
        size_mb = len(batch) * model.n * 10 * model.n * batch.q.element_size() / 2 ** 20
        if size_mb <= max_mb:
            with torch.no_grad():
                regressor = joint_torque_regressor(model, batch.q, batch.qd,
                                                   batch.qdd).contiguous()
    return _Data(batch=batch, windows=windows, regressor=regressor, cache={})


def _physical_parameters(params: PhysicalParameters, model: RobotModel,
                         joints: Sequence[str]) -> Dict[str, Tuple[float, str]]:
    out = inertial_parameters(model)
    for kind, values in (('damping', model.damping), ('coulomb', model.friction),
                         ('armature', model.armature)):
        out.update(joint_parameters(model, kind, values))
    if 'kinematics' in params.groups:
        for i, joint in enumerate(model.joint_names):
            for k, axis in enumerate(('x', 'y', 'z')):
                out[f'{joint}/origin_{axis}'] = (float(model.origin_xyz[i, k]), 'm')
            for k, axis in enumerate(('roll', 'pitch', 'yaw')):
                out[f'{joint}/origin_{axis}'] = (float(model.origin_rpy[i, k]), 'rad')
    actuator = params.actuator
    if actuator is not None and hasattr(actuator, 'motor_constant'):
        for k, joint in enumerate(joints):
            out[f'{joint}/motor_constant'] = (float(actuator.motor_constant[k]), 'N m/A')
            out[f'{joint}/resistance'] = (float(actuator.resistance[k]), 'Ohm')
    friction = params.friction
    if friction is not None and not _is_network(friction):
        for name, values in friction.coefficients.items():
            kind = 'viscous' if name == 'damping' else name
            flat = values.detach().reshape(-1).tolist()
            for i, joint in enumerate(model.joint_names):
                out[f'{joint}/friction_{kind}'] = (flat[i], joint_unit(model, i, kind))
    return out


def fit_diffnea(model: RobotModel, train: Data, validation: Optional[Data] = None,
                config: Optional[DiffNEAConfig] = None,
                warm_start: Optional[IdentificationResult] = None) -> IdentificationResult:
    """
    Identify a physically consistent model by gradient descent (see the module docstring).

    :param model: nominal robot model (start point and prior anchor).
    :param train: training trajectories (``q, qd`` and ``qdd`` for the inverse-dynamics and
        forward losses; ``tau``, or ``u`` with an actuator / command joints).
    :param validation: held-out trajectories for early stopping (recommended).
    :param config: :class:`DiffNEAConfig` (defaults when ``None``).
    :param warm_start: a previous result to start from (its model and modules); the prior
        still pulls toward ``model``. Bodies of the warm-start model that are not physically
        consistent (e.g. from ``'nea'``) start from the nominal body instead.
    :return: the result; ``metrics``: ``loss`` / ``validation_loss`` (data loss of
        ``config.loss``), ``torque_rmse`` per joint / ``torque_nmse`` (and ``validation_*``)
        where accelerations are available (from the fit's regressor when there is one),
        ``qdd_rmse`` / ``qdd_nmse`` unless every loss is inverse dynamics, ``rollout_nmse``
        with the rollout loss, ``iterations``, ``best_iteration``, ``stopped_early``,
        ``wall_time_s``, ``physically_consistent`` per body.
    """
    start_time = time.perf_counter()
    config = config if config is not None else DiffNEAConfig()
    dtype = _DTYPES[config.dtype]
    nominal = model.to(dtype=dtype)
    runs = as_trajectories(train, 'train')
    val_runs = as_trajectories(validation, 'validation') if validation is not None else None
    source = resolve_source(runs, config.source, config.actuator != 'none')
    m = getattr(runs[0], source).shape[-1]
    joints = command_joints_for(nominal, source, m, config.command_joints)
    B = command_matrix(nominal, joints)
    groups = config.all_groups()
    wrap_mask = nominal.tree.revolute_mask.to(dtype) if config.wrap_angles else None

    start_model = nominal
    actuator = make_actuator(config.actuator, m, config.actuator_kwargs, dtype, nominal.device)
    if warm_start is not None and warm_start.model is not None:
        start_model = warm_start.model.to(dtype=dtype)
        if warm_start.actuator is not None and config.actuator != 'none':
            actuator = copy.deepcopy(warm_start.actuator)
    scales = _scales(nominal, runs, source, make_torque_fn(nominal, B, actuator, None,
                                                           config.coulomb_eps), wrap_mask)
    if 'actuator' in groups and config.actuator_gain == 'fixed' \
            and isinstance(actuator, DCMotor):
        actuator = FixedGainMotor(actuator)
    friction = _make_friction_module(config, nominal, scales)
    if warm_start is not None and warm_start.friction is not None and friction is not None \
            and type(warm_start.friction) is type(friction):
        friction = copy.deepcopy(warm_start.friction)
    kinematics = KinematicParameterization(
        nominal.origin_xyz.detach(), nominal.origin_rpy.detach(), config.kinematic_xyz_radius,
        config.kinematic_rpy_radius) if 'kinematics' in groups else None
    params = PhysicalParameters(nominal, start_model, groups, config.parameterization, scales,
                                kinematics, actuator, friction)

    schedule = config.schedule()
    losses = {s.loss for s in schedule} | {config.loss} | (
        {'inverse_dynamics'} if any(s.torque_weight > 0 for s in schedule) else set())
    horizons = sorted({s.horizon for s in schedule if s.loss == 'rollout'}
                      | ({config.horizon} if config.loss == 'rollout' else set()))
    use_regressor = 'inverse_dynamics' in losses and 'kinematics' not in groups
    train_data = _prepare_split(runs, start_model, source, sorted(losses), horizons,
                                config.window_stride, use_regressor, config.max_regressor_mb)
    # the validation criterion is the last stage's objective: with a torque weight, the
    # best model must explain held-out torques too, not only simulate them
    final = schedule[-1]
    val_weight = final.torque_weight if final.loss != 'inverse_dynamics' else 0.0
    val_losses = [config.loss] + (['inverse_dynamics'] if val_weight > 0 else [])
    val_data = None
    if val_runs is not None:
        val_horizons = [config.horizon] if config.loss == 'rollout' else []
        val_data = _prepare_split(val_runs, start_model, source, val_losses, val_horizons,
                                  config.window_stride, use_regressor,
                                  config.max_regressor_mb)

    def data_loss(data: _Data, loss: str, horizon: int) -> Tensor:
        current = params.model()
        torque_fn = make_torque_fn(current, B, params.actuator, params.friction,
                                   config.coulomb_eps, data.cache)
        if loss == 'inverse_dynamics':
            return inverse_dynamics_loss(current, torque_fn, data.batch, scales['torque'],
                                         data.regressor)
        if loss == 'forward':
            return forward_loss(current, torque_fn, data.batch, scales['qdd'])
        return rollout_loss(current, torque_fn, data.windows[horizon], scales['state'],
                            config.integrator, wrap_mask)

    def objective_for(stage: Stage) -> Callable[[], Tensor]:
        def objective() -> Tensor:
            value = data_loss(train_data, stage.loss, stage.horizon)
            if stage.torque_weight > 0 and stage.loss != 'inverse_dynamics':
                value = value + stage.torque_weight * data_loss(train_data,
                                                                'inverse_dynamics', 0)
            if config.prior_weight > 0:
                value = value + config.prior_weight * params.prior()
            if config.nn_weight_decay > 0 and _is_network(params.friction):
                value = value + config.nn_weight_decay * params.network_l2()
            return value
        return objective

    plans = [StagePlan(parameters=[p for g in stage.groups for p in params.group_parameters(g)],
                       objective=objective_for(stage), adam_iterations=stage.adam_iterations,
                       lbfgs_iterations=stage.lbfgs_iterations, lr=stage.lr)
             for stage in schedule]

    def validation_loss() -> float:
        value = data_loss(val_data, config.loss, config.horizon)
        if val_weight > 0:
            value = value + val_weight * data_loss(val_data, 'inverse_dynamics', 0)
        return float(value)
    validate = validation_loss if val_data is not None else None
    rules = StopRules(eval_every=config.eval_every, patience=config.patience,
                      min_delta=config.min_delta, loss_tolerance=config.loss_tolerance,
                      max_seconds=config.max_seconds, lbfgs_max_inner=config.lbfgs_max_inner)
    report = optimize(params, plans, validate, rules)

    if isinstance(params.actuator, FixedGainMotor):
        params.actuator = params.actuator.synced()
    with torch.no_grad():
        identified = _detached_model(params.model())
        splits = [('', runs, train_data)] + (
            [('validation_', val_runs, val_data)] if val_data is not None else [])
        metrics = _metrics(identified, params, B, config, scales, splits, source, wrap_mask)
        metrics['loss'] = float(data_loss(train_data, config.loss, config.horizon))
        if val_data is not None:
            metrics['validation_loss'] = float(data_loss(val_data, config.loss,
                                                         config.horizon))
        parameters = _physical_parameters(params, identified, joints)
    metrics.update({key: report[key] for key in ('iterations', 'best_iteration',
                                                 'stopped_early', 'out_of_time')})
    metrics['physically_consistent'] = is_physically_consistent(identified.inertial).tolist()
    metrics['wall_time_s'] = time.perf_counter() - start_time
    state = {k: v.detach().clone() for k, v in params.state_dict().items()}
    return IdentificationResult(
        method='diffnea', model=identified, parameters=parameters, history=report['history'],
        metrics=metrics, actuator=params.actuator, friction=params.friction,
        command_joints=joints, coulomb_eps=config.coulomb_eps, config=config.to_dict(),
        state=state)


def _detached_model(model: RobotModel) -> RobotModel:
    changes = {name: getattr(model, name).detach().clone()
               for name in ('inertial', 'damping', 'friction', 'armature', 'origin_xyz',
                            'origin_rpy')}
    return model.replace(**changes)


def _metrics(model: RobotModel, params: PhysicalParameters, B: Tensor, config: DiffNEAConfig,
             scales: Mapping[str, Tensor], splits: Sequence[Tuple[str, Sequence[Any], _Data]],
             source: str, wrap_mask: Optional[Tensor]) -> Dict[str, Any]:
    """
    Return torque (and, unless the loss is inverse dynamics, acceleration) errors per split.

    The prepared batches and regressors of the fit are reused; rollout errors are computed with
    the rollout loss only (they cost a simulation of every window).
    """
    metrics: Dict[str, Any] = {}
    accelerations = config.loss != 'inverse_dynamics' or any(
        s.loss != 'inverse_dynamics' for s in config.schedule())
    for prefix, split, data in splits:
        torque_fn = make_torque_fn(model, B, params.actuator, params.friction,
                                   config.coulomb_eps, data.cache)
        batch, regressor = data.batch, data.regressor
        if batch is None:
            batch, regressor = stack_samples(split, model, source, need_qdd=False), None
        if batch.qdd is not None:
            applied = torque_fn(batch.q, batch.qd, batch.u)
            fit = error_metrics(applied - rigid_torque(model, batch, regressor),
                                scales['torque'])
            metrics[f'{prefix}torque_rmse'] = fit['rmse']
            metrics[f'{prefix}torque_nmse'] = fit['nmse']
            if accelerations:
                qdd = aba(model, batch.q, batch.qd, applied)
                fit = error_metrics(qdd - batch.qdd, scales['qdd'])
                metrics[f'{prefix}qdd_rmse'] = fit['rmse']
                metrics[f'{prefix}qdd_nmse'] = fit['nmse']
        if config.loss == 'rollout':
            windows = data.windows.get(config.horizon) or make_windows(
                split, model, source, config.horizon, config.window_stride or config.horizon)
            metrics[f'{prefix}rollout_nmse'] = float(rollout_loss(
                model, torque_fn, windows, scales['state'], config.integrator, wrap_mask))
    return metrics


__all__ = ['DiffNEAConfig', 'FRICTION_MODELS', 'LOSSES', 'PARAMETER_GROUPS',
           'PhysicalParameters', 'ScaledFriction', 'Stage', 'StagePlan', 'StopRules',
           'fit_diffnea', 'optimize', 'simulation_schedule']
