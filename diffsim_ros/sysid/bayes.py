"""
Bayesian identification (estimator ``'svgd'``): SVGD particles over physically consistent models.

The posterior over the learned parameters given torque data is

    ``log p(x | D) = -1/2 sum_k,j (r_kj(x) / sigma_j)^2 - 1/2 |z(x)|^2 + const``,

with the inverse-dynamics residual ``r = torque_fn(q, qd, u) - rnea(q, qd, qdd)`` (the same
command map, fixed actuator and Coulomb smoothing as NEA / DiffNEA, :mod:`.losses`) and a
Gaussian prior around the nominal model in unconstrained coordinates:

- inertial: ``theta`` of a :func:`~diffsim_ros.core.make_parameterization` (``'log_cholesky'``
  or ``'diffnea'``: every particle is a physically consistent body; ``'raw'`` makes the problem
  linear-Gaussian, for tests and baselines only), with prior standard deviations chosen so that
  ``prior_std`` is a *relative* spread of masses and second moments (lengths are scaled by the
  body's radius of gyration about its origin);
- damping / Coulomb levels: ``log(value)``, prior std ``prior_std`` around the nominal value;
  a nominal of zero (below ``1e-4`` of the data scale) gets a wide prior (std 3) at that floor.

``z`` are those coordinates whitened by the prior (nominal at ``z = 0``).  The ``P`` particles
are a leading batch dim of the model fields (``inertial (P, 1, n, 10)``, ``damping (P, 1, n)``),
so one RNEA call (or one product with the precomputed joint-torque regressor, the same thing
since RNEA is linear in ``pi``) evaluates all particles on all samples.

SVGD (:class:`~diffsim_ros.sysid.svgd.SVGD`, RBF kernel with the median heuristic) runs in a
preconditioned frame ``z = z_map + A w`` with ``A A^T`` the inverse Gauss-Newton Hessian of the
log posterior at the MAP point: there the posterior is close to a standard normal, so an
isotropic kernel fits it and a few hundred particles-steps suffice even though identifiable
combinations are known to 1e-3 and unidentifiable ones only to the prior.  The MAP point is
found first by ``map_steps`` Gauss-Newton steps from the nominal model (or from the warm
start's particle mean).  Particles start as ``init_std`` standard normal draws in ``w`` (a warm
start's particles are reused, re-centred on the new MAP point).

The result's model is the particle mean of the *physical* parameters (the set of consistent
bodies is convex, so the mean body is consistent), ``std`` the particle standard deviation of
every learned named parameter, ``state['particles']`` the ``(P, d)`` unconstrained particles
(warm starts) and ``state['physical_particles']`` the ``(P, p)`` physical ones.
"""

from dataclasses import dataclass
import math
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn

from .losses import (ACTUATORS, as_trajectories, command_joints_for, command_matrix, Data,
                     error_metrics, make_actuator, make_torque_fn, resolve_source,
                     SampleBatch, stack_samples, variance_scale)
from .result import (check_choice, check_positive, EstimatorConfig, frozen_mapping,
                     IdentificationResult, inertial_parameters, joint_parameters)
from .svgd import make_kernel, summarize, SVGD
from ..core.dispatch import rnea
from ..core.model import RobotModel
from ..core.parameterization import (is_physically_consistent, make_parameterization,
                                     regularize_inertial)
from ..core.regressor import joint_torque_regressor

Tensor = torch.Tensor

#: Parameter groups the Bayesian estimator can learn, in coordinate order.
SVGD_GROUPS = ('inertial', 'damping', 'coulomb')
#: Model field of each joint-level group.
_FIELDS = {'damping': 'damping', 'coulomb': 'friction'}
#: Nominal coefficients below this fraction of the data scale count as unknown.
_COEFFICIENT_FLOOR = 1e-4
#: Prior std of ``log(value)`` of a coefficient whose nominal value is unknown (zero).
_UNKNOWN_LOG_STD = 3.0
#: Largest number of samples of the regressor behind the Gauss-Newton preconditioner.
_PRECONDITIONER_SAMPLES = 2000
#: Radius (m) by which a degenerate warm-start body is thickened into a consistent one.
_REGULARIZE_RADIUS = 1e-3


@dataclass(frozen=True)
class SVGDEstimatorConfig(EstimatorConfig):
    """
    Configuration of :func:`fit_svgd`.

    :param particles: number of SVGD particles ``P``.
    :param steps: SVGD steps.
    :param lr: SVGD learning rate (in the preconditioned frame, where the posterior is roughly
        a standard normal).
    :param optimizer: ``'sgd'``, ``'adagrad'`` or ``'adam'`` (see :class:`~.svgd.SVGD`).
    :param kernel: SVGD kernel, ``'rbf'`` or ``'imq'`` (median-heuristic bandwidth).
    :param parameterization: inertial parameterization, ``'log_cholesky'``, ``'diffnea'`` or
        ``'raw'`` (no consistency guarantee).
    :param prior_std: relative prior standard deviation of the parameters around the nominal
        model, > 0.
    :param sigma: torque noise std per joint (N m or N), one value for all joints, or empty to
        estimate it (``sigma_estimate``).
    :param sigma_estimate: ``'nominal'`` (RMS residual of the nominal model per joint) or
        ``'map'`` (RMS residual at the MAP point, an empirical-Bayes estimate).
    :param precondition: run SVGD in the Gauss-Newton whitened frame (recommended).
    :param map_steps: Gauss-Newton steps toward the MAP point before SVGD (0: start at the
        nominal model or the warm start).
    :param init_std: spread of fresh initial particles in the preconditioned frame.
    :param learn: parameter groups, a subset of ``('inertial', 'damping', 'coulomb')``.
    :param coulomb_eps: smoothing velocity of ``friction tanh(qd / eps)``, rad/s or m/s.
    :param source: where the applied effort comes from: ``'auto'``, ``'tau'`` or ``'u'``.
    :param command_joints: joints driven by the columns of ``u``.
    :param actuator: fixed actuator model (:data:`losses.ACTUATORS`).
    :param actuator_kwargs: its constructor arguments.
    :param max_regressor_mb: largest precomputed regressor, MB (beyond it RNEA runs on the
        batched particle model at every step).
    :param max_seconds: wall-time budget of the SVGD steps (0: none).
    :param seed: seed of the local generator drawing the initial particles.
    """

    particles: int = 32
    steps: int = 150
    lr: float = 0.5
    optimizer: str = 'sgd'
    kernel: str = 'rbf'
    parameterization: str = 'log_cholesky'
    prior_std: float = 0.5
    sigma: Tuple[float, ...] = ()
    sigma_estimate: str = 'nominal'
    precondition: bool = True
    map_steps: int = 20
    init_std: float = 1.0
    learn: Tuple[str, ...] = ('inertial', 'damping')
    coulomb_eps: float = 1e-2
    source: str = 'auto'
    command_joints: Tuple[str, ...] = ()
    actuator: str = 'none'
    actuator_kwargs: Mapping[str, Any] = None
    max_regressor_mb: float = 256.0
    max_seconds: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        """Validate the fields."""
        for name in ('learn', 'command_joints', 'sigma'):
            value = getattr(self, name)
            if isinstance(value, (str, bytes)) or not hasattr(value, '__iter__'):
                raise ValueError(f'{name} must be a list, got {value!r}')
            object.__setattr__(self, name, tuple(value))
        object.__setattr__(self, 'actuator_kwargs',
                           frozen_mapping(self.actuator_kwargs, 'actuator_kwargs'))
        check_choice('optimizer', self.optimizer, ('sgd', 'adagrad', 'adam'))
        check_choice('kernel', self.kernel, ('rbf', 'imq'))
        check_choice('parameterization', self.parameterization,
                     ('log_cholesky', 'diffnea', 'raw'))
        check_choice('sigma_estimate', self.sigma_estimate, ('nominal', 'map'))
        check_choice('source', self.source, ('auto', 'tau', 'u'))
        check_choice('actuator', self.actuator, ACTUATORS)
        if not self.learn:
            raise ValueError(f'learn: choose at least one of {SVGD_GROUPS}')
        for group in self.learn:
            check_choice('learn', group, SVGD_GROUPS)
        if len(set(self.learn)) != len(self.learn):
            raise ValueError(f'learn: repeated groups in {self.learn}')
        for value in self.sigma:
            check_positive('sigma', value)
        check_positive('particles', self.particles, integer=True)
        if self.particles < 2:
            raise ValueError(f'particles must be >= 2, got {self.particles}')
        for name in ('steps', 'map_steps', 'seed'):
            check_positive(name, getattr(self, name), allow_zero=True, integer=True)
        for name in ('lr', 'prior_std', 'init_std', 'coulomb_eps'):
            check_positive(name, getattr(self, name))
        for name in ('max_regressor_mb', 'max_seconds'):
            check_positive(name, getattr(self, name), allow_zero=True)
        if not isinstance(self.precondition, bool):
            raise ValueError(f'precondition must be a bool, got {self.precondition!r}')


def _inertial_prior_scale(name: str, theta: Tensor, pi: Tensor, prior_std: float) -> Tensor:
    """Prior std ``(n, 10)`` of the unconstrained inertial parameters (relative spread)."""
    mass = pi[..., 0]
    trace = pi[..., 4] + pi[..., 7] + pi[..., 9]
    length = (0.5 * trace / mass).clamp_min(1e-12).sqrt()[..., None]   # RMS radius, origin
    ones = torch.ones_like(pi)
    if name == 'log_cholesky':   # [alpha, d1..d3]: logs of sqrt(m), sqrt(moments); rest lengths
        scale = torch.cat((0.5 * ones[..., :4], length.expand_as(pi[..., 4:])), -1)
    elif name == 'diffnea':      # softplus mass / moments, CoM in m, rotation vector in rad
        slope = torch.sigmoid(theta)
        relative = torch.nn.functional.softplus(theta) / slope
        scale = torch.cat((relative[..., :1], length.expand_as(pi[..., 1:4]),
                           relative[..., 4:7], ones[..., 7:]), -1)
    else:                        # raw: kg, kg m, kg m^2
        scale = torch.cat((mass[..., None], (mass[..., None] * length).expand_as(pi[..., 1:4]),
                           (mass[..., None] * length.square()).expand_as(pi[..., 4:])), -1)
    return prior_std * scale


def _feasible(pi: Tensor, fallback: Tensor) -> Tensor:
    """Thicken degenerate bodies; bodies that stay infeasible take the ``fallback`` body."""
    bad = ~is_physically_consistent(pi)
    if not bool(bad.any()):
        return pi
    fixed = torch.where(bad[..., None], regularize_inertial(pi, _REGULARIZE_RADIUS), pi)
    return torch.where(is_physically_consistent(fixed)[..., None], fixed, fallback)


class _Layout:
    """
    Learned coordinates: absolute unconstrained ``a``, prior-whitened ``z``, physical ``phi``.

    ``a = [theta (10 n) | log damping (n) | log coulomb (n)]`` (learned groups only), ``z = (a -
    a_nominal) / prior_scale``, ``phi = [pi (10 n) | damping (n) | coulomb (n)]``.
    """

    def __init__(self, nominal: RobotModel, config: SVGDEstimatorConfig,
                 coefficient_scales: Mapping[str, Tensor]) -> None:
        self.nominal = nominal
        self.groups = tuple(g for g in SVGD_GROUPS if g in config.learn)
        self.parameterization = make_parameterization(config.parameterization)
        n = nominal.n
        centre, scale, names = [], [], []
        if 'inertial' in self.groups:
            pi = nominal.inertial.detach()
            if config.parameterization != 'raw':
                pi = _feasible(pi, regularize_inertial(pi, _REGULARIZE_RADIUS))
            theta = self.parameterization.from_inertial(pi)
            centre.append(theta.reshape(-1))
            scale.append(_inertial_prior_scale(config.parameterization, theta, pi,
                                               config.prior_std).reshape(-1))
            names += list(nominal.inertial_parameter_names())
        for group in self.groups:
            if group == 'inertial':
                continue
            floor = _COEFFICIENT_FLOOR * coefficient_scales[group]
            value = getattr(nominal, _FIELDS[group]).detach()
            known = value > floor
            centre.append(torch.log(torch.maximum(value, floor)))
            scale.append(torch.where(known, config.prior_std, _UNKNOWN_LOG_STD).to(value))
            names += [f'{joint}/{group}' for joint in nominal.joint_names]
        self.a_nominal = torch.cat(centre)
        self.scale = torch.cat(scale)
        self.names = tuple(names)
        self.n = n

    @property
    def dim(self) -> int:
        """Return the number ``d`` of learned coordinates."""
        return self.a_nominal.numel()

    def absolute(self, z: Tensor) -> Tensor:
        """Return ``a (..., d)`` of whitened ``z (..., d)``."""
        return self.a_nominal + self.scale * z

    def whitened(self, a: Tensor) -> Tensor:
        """Return ``z (..., d)`` of absolute ``a (..., d)``."""
        return (a - self.a_nominal) / self.scale

    def physical(self, z: Tensor) -> Tensor:
        """Return ``phi (..., d)`` of whitened ``z (..., d)``."""
        a = self.absolute(z)
        parts, offset = [], 0
        if 'inertial' in self.groups:
            theta = a[..., :10 * self.n].reshape(*a.shape[:-1], self.n, 10)
            parts.append(self.parameterization.to_inertial(theta).reshape(*a.shape[:-1], -1))
            offset = 10 * self.n
        if a.shape[-1] > offset:
            parts.append(torch.exp(a[..., offset:]))
        return torch.cat(parts, -1)

    def fields(self, phi: Tensor) -> Dict[str, Tensor]:
        """Return model fields with a particle dim: ``inertial (P, 1, n, 10)``, ``(P, 1, n)``."""
        lead = phi.shape[:-1]
        out, offset = {}, 0
        if 'inertial' in self.groups:
            out['inertial'] = phi[..., :10 * self.n].reshape(*lead, 1, self.n, 10)
            offset = 10 * self.n
        for group in self.groups:
            if group != 'inertial':
                out[_FIELDS[group]] = phi[..., offset:offset + self.n].reshape(*lead, 1, self.n)
                offset += self.n
        return out

    def model(self, phi: Tensor) -> RobotModel:
        """Return the nominal model with the fields of one physical vector ``phi (d,)``."""
        return self.nominal.replace(**{k: v.reshape(v.shape[2:])
                                       for k, v in self.fields(phi[None]).items()})


class _Likelihood:
    """Gaussian inverse-dynamics likelihood of all particles at once."""

    def __init__(self, nominal: RobotModel, layout: _Layout, batch: SampleBatch, B: Tensor,
                 actuator: Optional[nn.Module], config: SVGDEstimatorConfig) -> None:
        self.nominal, self.layout, self.batch, self.B = nominal, layout, batch, B
        self.actuator, self.eps = actuator, config.coulomb_eps
        self.cache: Dict[str, Any] = {}
        N, n = len(batch), nominal.n
        self.regressor = None
        size_mb = N * n * 10 * n * batch.q.element_size() / 2 ** 20
        if 'inertial' in layout.groups and size_mb <= config.max_regressor_mb:
            with torch.no_grad():
                Y = joint_torque_regressor(nominal, batch.q, batch.qd, batch.qdd)
            self.regressor = Y.reshape(N * n, 10 * n).contiguous()
        self.sigma = torch.ones(n, dtype=nominal.dtype, device=nominal.device)

    def residual(self, phi: Tensor) -> Tensor:
        """Return ``torque_fn(q, qd, u) - rnea(q, qd, qdd)`` ``(P, N, n)`` of ``phi (P, p)``."""
        fields = self.layout.fields(phi)
        model = self.nominal.replace(**fields)
        applied = make_torque_fn(model, self.B, self.actuator, None, self.eps,
                                 self.cache)(self.batch.q, self.batch.qd, self.batch.u)
        batch = self.batch
        if self.regressor is not None:
            pi = fields['inertial'].reshape(phi.shape[0], -1)
            rigid = (pi @ self.regressor.mT).reshape(phi.shape[0], *batch.q.shape) \
                + self.nominal.armature * batch.qdd
        else:
            rigid = rnea(model, batch.q, batch.qd, batch.qdd)
        return applied - rigid

    def log_likelihood(self, phi: Tensor) -> Tensor:
        """Return ``(P,)`` Gaussian log likelihoods (up to a constant)."""
        return -0.5 * (self.residual(phi) / self.sigma).square().sum((-2, -1))

    def normal_matrix(self) -> Tensor:
        """
        Return ``W^T Sigma^-1 W`` ``(p, p)`` of the residual's linear map ``dr/dphi = -W``.

        From at most :data:`_PRECONDITIONER_SAMPLES` evenly spaced samples, rescaled to all.
        """
        batch, n = self.batch, self.nominal.n
        N = len(batch)
        index = torch.linspace(0, N - 1, min(N, _PRECONDITIONER_SAMPLES),
                               device=batch.q.device).round().long()
        q, qd, qdd = batch.q[index], batch.qd[index], batch.qdd[index]
        blocks = []
        if 'inertial' in self.layout.groups:
            with torch.no_grad():
                blocks.append(joint_torque_regressor(self.nominal, q, qd, qdd))
        for group in self.layout.groups:
            if group == 'damping':
                blocks.append(torch.diag_embed(qd))
            elif group == 'coulomb':
                blocks.append(torch.diag_embed(torch.tanh(qd / self.eps)))
        W = (torch.cat(blocks, -1) / self.sigma[:, None]).reshape(index.numel() * n, -1)
        return W.T @ W * (N / index.numel())


def _torque_scale(nominal: RobotModel, batch: SampleBatch, applied: Tensor) -> Tensor:
    """Torque variances ``(n,)`` of the data (the larger of applied and rigid)."""
    with torch.no_grad():
        rigid = rnea(nominal, batch.q, batch.qd, batch.qdd)
    return torch.maximum(variance_scale(applied), variance_scale(rigid))


def _rms_sigma(residual: Tensor) -> Tensor:
    """Per-joint RMS of residuals ``(N, n)``, floored relative to the largest joint."""
    rms = residual.detach().square().mean(0).sqrt()
    tiny = torch.finfo(rms.dtype).tiny ** 0.25
    return rms.clamp_min(max(float(rms.max()) * 1e-6, tiny))


def _sigma(config: SVGDEstimatorConfig, n: int, like: Tensor) -> Optional[Tensor]:
    if not config.sigma:
        return None
    if len(config.sigma) not in (1, n):
        raise ValueError(f'sigma: give 1 or {n} values (one per joint), got '
                         f'{len(config.sigma)}')
    return torch.as_tensor(config.sigma, dtype=like.dtype, device=like.device).expand(n).clone()


class _Posterior:
    """Log posterior of whitened ``z`` and its Gauss-Newton preconditioner."""

    def __init__(self, layout: _Layout, likelihood: _Likelihood) -> None:
        self.layout, self.likelihood = layout, likelihood

    def log_prob(self, z: Tensor) -> Tensor:
        """Return ``(P,)`` log posterior of ``z (P, d)``."""
        return self.likelihood.log_likelihood(self.layout.physical(z)) \
            - 0.5 * z.square().sum(-1)

    def preconditioner(self, z: Tensor, normal: Tensor) -> Tensor:
        """Return ``A (d, d)`` with ``A A^T`` the inverse Gauss-Newton Hessian at ``z (d,)``."""
        jac = torch.autograd.functional.jacobian(
            lambda x: self.layout.physical(x[None])[0], z.detach())
        H = jac.T @ normal @ jac
        H = 0.5 * (H + H.T) + torch.eye(z.numel(), dtype=z.dtype, device=z.device)
        L = torch.linalg.cholesky(H)
        eye = torch.eye(z.numel(), dtype=z.dtype, device=z.device)
        return torch.linalg.solve_triangular(L, eye, upper=False).T   # L^-T

    def calibrate(self, z: Tensor, A: Tensor, rounds: int = 4) -> Tensor:
        """
        Rescale the columns of ``A`` so that a unit step along each costs about 1/2 nat.

        The Gauss-Newton Hessian misses curvature that is zero to first order, e.g. off-
        diagonal log-Cholesky entries of a symmetric body enter ``pi`` quadratically; probing
        ``log p(z +- a_i)`` (all ``2 d`` points in one batched call) catches it.
        """
        A = A.clone()
        d = z.numel()
        with torch.no_grad():
            base = float(self.log_prob(z[None]))
            for _ in range(rounds):
                probes = z + torch.cat((A.T, -A.T))
                drop = base - self.log_prob(probes).view(2, d).min(0).values
                drop = torch.where(torch.isfinite(drop), drop, torch.full_like(drop, 1e6))
                factor = torch.sqrt(0.5 / drop.clamp_min(0.125)).clamp(1e-3, 2.0)
                factor = torch.where((drop > 0.25) & (drop < 1.0), torch.ones_like(drop),
                                     factor)
                if bool((factor == 1.0).all()):
                    break
                A = A * factor
        return A

    def maximize(self, z: Tensor, A: Tensor, steps: int) -> Tuple[Tensor, int]:
        """Gauss-Newton ascent ``z <- z + A A^T grad`` with backtracking; return ``z``, steps."""
        z = z.detach().clone()
        with torch.no_grad():
            value = float(self.log_prob(z[None]))
        done = 0
        for done in range(1, steps + 1):
            x = z.clone().requires_grad_(True)
            grad, = torch.autograd.grad(self.log_prob(x[None]).sum(), x)
            step = A @ (A.T @ grad)
            improved = False
            for _ in range(30):
                candidate = z + step
                with torch.no_grad():
                    new = float(self.log_prob(candidate[None]))
                if math.isfinite(new) and new >= value:
                    improved = True
                    break
                step = 0.5 * step
            if not improved:
                break
            gain, z, value = new - value, candidate, new
            if gain < 1e-10 * max(1.0, abs(value)):
                break
        return z, done


def _warm_particles(warm_start: Optional[IdentificationResult], layout: _Layout,
                    config: SVGDEstimatorConfig) -> Optional[Tensor]:
    """Return the whitened particles ``(P', d)`` of a compatible previous ``'svgd'`` result."""
    if warm_start is None or warm_start.method != 'svgd':
        return None
    particles = warm_start.state.get('particles')
    previous = warm_start.config
    if particles is None or particles.dim() != 2 or particles.shape[1] != layout.dim \
            or previous.get('parameterization') != config.parameterization \
            or set(previous.get('learn', ())) != set(layout.groups):
        return None
    like = layout.a_nominal
    return layout.whitened(particles.detach().to(dtype=like.dtype, device=like.device))


def _warm_centre(warm_start: Optional[IdentificationResult], layout: _Layout) -> Tensor:
    """Return whitened coordinates ``(d,)`` of a warm-start model (nominal when unusable)."""
    zero = torch.zeros_like(layout.a_nominal)
    if warm_start is None or warm_start.model is None:
        return zero
    model = warm_start.model.to(dtype=layout.nominal.dtype, device=layout.nominal.device)
    parts, n = [], layout.n
    if 'inertial' in layout.groups:
        pi = model.inertial.detach()
        if pi.shape != layout.nominal.inertial.shape:
            return zero
        if layout.parameterization.name != 'raw':
            pi = _feasible(pi, layout.nominal.inertial.detach())
            if not bool(is_physically_consistent(pi).all()):
                return zero
        parts.append(layout.parameterization.from_inertial(pi).reshape(-1))
    offset = 10 * n if 'inertial' in layout.groups else 0
    for group in layout.groups:
        if group != 'inertial':
            floor = torch.exp(layout.a_nominal[offset:offset + n]) * 1e-3
            value = getattr(model, _FIELDS[group]).detach().reshape(-1)
            parts.append(torch.log(torch.maximum(value, floor)))
            offset += n
    z = layout.whitened(torch.cat(parts))
    return z if bool(torch.isfinite(z).all()) else zero


class _OutOfTime(Exception):
    """Raised by the SVGD callback when the time budget is spent."""


def fit_svgd(model: RobotModel, train: Data, validation: Optional[Data] = None,
             config: Optional[SVGDEstimatorConfig] = None,
             warm_start: Optional[IdentificationResult] = None) -> IdentificationResult:
    """
    Sample the posterior over physically consistent parameters with SVGD (module docstring).

    :param model: nominal robot model (prior mean and start point).
    :param train: training trajectories with ``q, qd, qdd`` and ``tau`` (or ``u`` with an
        actuator / command joints).
    :param validation: held-out trajectories (validation metrics only).
    :param config: :class:`SVGDEstimatorConfig` (defaults when ``None``).
    :param warm_start: a previous result: the particles of an ``'svgd'`` result with the same
        parameterization and groups are reused; any other result's model is the start point.
    :return: the result; ``model`` is the posterior mean, ``std`` the particle std of every
        learned parameter; ``metrics``: ``loss`` / ``validation_loss`` (inverse-dynamics
        torque NMSE of the mean), ``torque_rmse`` / ``torque_nmse`` (and ``validation_*``),
        ``sigma`` per joint, ``log_posterior`` (mean over particles), ``posterior``
        (:func:`~.svgd.summarize`: names, mean, std, modes, mode weights), ``map_steps``,
        ``iterations``, ``out_of_time``, ``warm_started``, ``particles_consistent``,
        ``physically_consistent`` per body of the mean, ``wall_time_s``.
    :raises ValueError: missing signals, a bad ``sigma`` length, or an inconsistent nominal.
    """
    started = time.perf_counter()
    config = config if config is not None else SVGDEstimatorConfig()
    dtype = model.dtype if model.dtype in (torch.float32, torch.float64) else torch.float64
    nominal = model.to(dtype=dtype)
    runs = as_trajectories(train, 'train')
    source = resolve_source(runs, config.source, config.actuator != 'none')
    m = getattr(runs[0], source).shape[-1]
    joints = command_joints_for(nominal, source, m, config.command_joints)
    B = command_matrix(nominal, joints)
    actuator = make_actuator(config.actuator, m, config.actuator_kwargs, dtype, nominal.device)
    batch = stack_samples(runs, nominal, source, need_qdd=True)
    with torch.no_grad():
        applied = make_torque_fn(nominal, B, actuator, None, config.coulomb_eps)(
            batch.q, batch.qd, batch.u)
    torque_var = _torque_scale(nominal, batch, applied)
    torque_std = torque_var.sqrt()
    coefficient_scales = {'damping': torque_std / variance_scale(batch.qd).sqrt(),
                          'coulomb': torque_std}
    layout = _Layout(nominal, config, coefficient_scales)
    likelihood = _Likelihood(nominal, layout, batch, B, actuator, config)
    posterior = _Posterior(layout, likelihood)
    sigma = _sigma(config, nominal.n, torque_std)
    z_nominal = torch.zeros_like(layout.a_nominal)
    if sigma is None:
        with torch.no_grad():
            sigma = _rms_sigma(likelihood.residual(layout.physical(z_nominal)[None])[0])
    likelihood.sigma = sigma

    # MAP point and preconditioner
    warm = _warm_particles(warm_start, layout, config)
    z_start = warm.mean(0) if warm is not None else _warm_centre(warm_start, layout)
    eye = torch.eye(layout.dim, dtype=dtype, device=nominal.device)
    normal = likelihood.normal_matrix() if config.precondition else None
    A = posterior.preconditioner(z_start, normal) if config.precondition else eye
    z_map, map_steps = posterior.maximize(z_start, A, config.map_steps) \
        if config.map_steps else (z_start, 0)
    if config.sigma_estimate == 'map' and not config.sigma:
        with torch.no_grad():
            likelihood.sigma = sigma = _rms_sigma(
                likelihood.residual(layout.physical(z_map)[None])[0])
        normal = likelihood.normal_matrix() if config.precondition else None
    if config.precondition:
        A = posterior.calibrate(z_map, posterior.preconditioner(z_map, normal))
    A_inv = torch.linalg.inv(A)

    # initial particles in the frame z = z_map + A w
    generator = torch.Generator(device=nominal.device).manual_seed(config.seed)
    P = config.particles
    fresh = config.init_std * torch.randn(P, layout.dim, generator=generator, dtype=dtype,
                                          device=nominal.device)
    if warm is not None:
        w_warm = (warm - warm.mean(0)) @ A_inv.T
        w0 = torch.cat((w_warm[:P], fresh[w_warm.shape[0]:]))
    else:
        w0 = fresh

    def log_prob(w: Tensor) -> Tensor:
        return posterior.log_prob(z_map + w @ A.T)

    deadline = started + config.max_seconds if config.max_seconds > 0 else math.inf
    records: List[Dict[str, float]] = []
    latest = {'w': w0}

    def callback(step: int, particles: Tensor, record: Dict[str, float]) -> None:
        records.append(record)
        latest['w'] = particles
        if time.perf_counter() > deadline:
            raise _OutOfTime

    sampler = SVGD(make_kernel(config.kernel), config.optimizer, lr=config.lr)
    out_of_time = False
    try:
        latest['w'] = sampler.run(log_prob, w0, config.steps, callback=callback).particles
    except _OutOfTime:
        out_of_time = True
    z = z_map + latest['w'] @ A.T

    with torch.no_grad():
        phi = layout.physical(z)
        mean_phi = phi.mean(0)
        identified = layout.model(mean_phi)
        final_log_prob = float(posterior.log_prob(z).mean())
    metrics = _metrics(identified, B, actuator, config, runs, validation, source, torque_var)
    parameters = inertial_parameters(identified)
    for kind, values in (('damping', identified.damping), ('coulomb', identified.friction),
                         ('armature', identified.armature)):
        parameters.update(joint_parameters(identified, kind, values))
    std_phi = phi.std(0)
    std = {name: float(s) for name, s in zip(layout.names, std_phi.tolist())}
    summary = summarize(phi, layout.names, seed=config.seed)
    consistent = True
    if 'inertial' in layout.groups:
        consistent = bool(is_physically_consistent(layout.fields(phi)['inertial']).all())
    metrics.update({
        'sigma': sigma.tolist(), 'log_posterior': final_log_prob, 'posterior': summary.to_dict(),
        'map_steps': map_steps, 'iterations': len(records), 'out_of_time': out_of_time,
        'warm_started': warm is not None, 'particles': P, 'samples': len(batch),
        'particles_consistent': consistent,
        'physically_consistent': is_physically_consistent(identified.inertial).tolist(),
        'wall_time_s': time.perf_counter() - started,
    })
    history = {'train': tuple(-r['log_prob'] for r in records),
               'phi_norm': tuple(r['phi_norm'] for r in records)}
    state = {'particles': layout.absolute(z).detach().clone(),
             'physical_particles': phi.detach().clone(), 'sigma': sigma.detach().clone()}
    return IdentificationResult(
        method='svgd', model=identified, parameters=parameters, std=std, history=history,
        metrics=metrics, actuator=actuator, command_joints=joints,
        coulomb_eps=config.coulomb_eps, config=config.to_dict(), state=state)


def _metrics(model: RobotModel, B: Tensor, actuator: Optional[nn.Module],
             config: SVGDEstimatorConfig, runs: Sequence[Any], validation: Optional[Data],
             source: str, torque_var: Tensor) -> Dict[str, Any]:
    """Inverse-dynamics torque errors of the posterior-mean model on the data splits."""
    splits = [('', runs)]
    if validation is not None:
        splits.append(('validation_', as_trajectories(validation, 'validation')))
    metrics: Dict[str, Any] = {}
    torque_fn = make_torque_fn(model, B, actuator, None, config.coulomb_eps)
    for prefix, split in splits:
        batch = stack_samples(split, model, source, need_qdd=True)
        with torch.no_grad():
            rigid = rnea(model, batch.q, batch.qd, batch.qdd)
            error = torque_fn(batch.q, batch.qd, batch.u) - rigid
        fit = error_metrics(error, torque_var)
        metrics[f'{prefix}torque_rmse'] = fit['rmse']
        metrics[f'{prefix}torque_nmse'] = fit['nmse']
        metrics[f'{prefix}loss'] = fit['nmse']
    return metrics


__all__ = ['SVGD_GROUPS', 'SVGDEstimatorConfig', 'fit_svgd']
