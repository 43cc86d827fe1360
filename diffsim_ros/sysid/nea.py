"""
NEA: classic linear least-squares identification on the joint-torque regressor.

Inverse dynamics is linear in the parameters ``phi`` = inertial 10-vectors of every body
(``10 n``), then optionally armature (``qdd`` columns), viscous (``qd``), Coulomb (``sign(qd)``
or ``tanh(qd / eps)``) and offset (``1``) columns per joint::

    tau_applied = W(q, qd, qdd) phi
    W = [Y | diag(qdd) | diag(qd) | diag(sign qd) | I]

Only the base parameters ``beta = B phi`` (``r`` independent combinations) are identifiable.
They are found from the *structure* of ``W``: a QR decomposition with column pivoting
(``scipy.linalg.qr(pivoting=True)``) of ``W`` on random states, columns normalised to unit
norm (columns below ``rank_tolerance`` times the largest norm are round-off of structurally
zero columns and are zeroed), numerical rank ``r = #{|R_ii| > rank_tolerance |R_00|}``
(default ``1e-8``: structural dependencies give ``|R_ii| ~ 1e-15 |R_00|``, genuinely weak
columns of a robot stay far above it). With ``W P = Q R``, independent columns ``P[:r]``
and ``W_dep = W_ind K`` (``K = R11^-1 R12``), ``beta = phi_ind + K phi_dep``, and
:meth:`BaseParameters.expressions` prints these combinations. The data fit is ordinary (or
per-joint weighted) least squares on ``W_ind``; its covariance ``sigma^2 (W_ind^T W_ind)^-1``
gives the standard deviations.

A full ``phi`` (needed to build a model) is recovered as the point of ``B phi = beta`` closest
to the nominal model (``full_parameters='prior'``) or to zero (``'min_norm'``), distances
measured with every parameter scaled by its column norm. Unidentifiable combinations thus keep
their nominal values; NEA does not enforce physical consistency (``metrics`` reports it).
Terms that are not identified (e.g. the nominal damping when ``'viscous'`` is off) are
subtracted from the measured torque with their nominal values.
"""

from dataclasses import dataclass
import math
import time
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np
import scipy.linalg
import torch

from .losses import (ACTUATORS, as_trajectories, command_joints_for, command_matrix, Data,
                     error_metrics, make_actuator, resolve_source, SampleBatch, stack_samples,
                     variance_scale)
from .result import (check_choice, check_positive, EstimatorConfig, frozen_mapping,
                     IdentificationResult, inertial_parameters, INERTIAL_UNITS,
                     joint_parameters, joint_unit)
from ..core.dispatch import rnea
from ..core.model import PRISMATIC, RobotModel
from ..core.parameterization import is_physically_consistent
from ..core.regressor import joint_torque_regressor

Tensor = torch.Tensor

#: Friction columns NEA can add, in column order.
FRICTION_TERMS = ('viscous', 'coulomb', 'offset')
#: Coefficients below this (on unit-norm columns) are round-off, not structure.
_COEFFICIENT_ROUNDOFF = 1e-9


@dataclass(frozen=True)
class NEAConfig(EstimatorConfig):
    """
    Configuration of :func:`fit_nea`.

    :param friction: friction columns per joint, a subset of ``('viscous', 'coulomb',
        'offset')``.
    :param coulomb: ``'sign'`` (classic) or ``'tanh'`` (``tanh(qd / coulomb_eps)``, as the
        simulator and DiffNEA use).
    :param coulomb_eps: smoothing velocity for ``'tanh'`` (rad/s or m/s), > 0.
    :param armature: add one ``qdd`` column per joint (reflected rotor inertia).
    :param rank_tolerance: relative threshold on ``|R_ii| / |R_00|`` for the structural rank.
    :param structural_samples: random states for the structural QR (0: ``3 p / n + 10``).
    :param weighting: ``'none'`` (ordinary LS) or ``'per_joint'`` (two-step weighted LS with
        each joint's rows divided by its OLS residual standard deviation).
    :param full_parameters: ``'prior'`` (closest to the nominal model) or ``'min_norm'``.
    :param source: where the applied effort comes from: ``'auto'``, ``'tau'`` or ``'u'``
        (see :func:`losses.resolve_source`).
    :param command_joints: joints driven by the columns of ``u``.
    :param actuator: fixed (not identified) actuator mapping ``u`` to torques, one of
        :data:`losses.ACTUATORS`.
    :param actuator_kwargs: its constructor arguments.
    :param seed: seed of the local generator drawing the structural random states.
    """

    friction: Tuple[str, ...] = ('viscous', 'coulomb')
    coulomb: str = 'sign'
    coulomb_eps: float = 1e-2
    armature: bool = False
    rank_tolerance: float = 1e-8
    structural_samples: int = 0
    weighting: str = 'none'
    full_parameters: str = 'prior'
    source: str = 'auto'
    command_joints: Tuple[str, ...] = ()
    actuator: str = 'none'
    actuator_kwargs: Mapping[str, Any] = None
    seed: int = 0

    def __post_init__(self) -> None:
        """Validate the fields."""
        object.__setattr__(self, 'friction', tuple(self.friction))
        object.__setattr__(self, 'command_joints', tuple(self.command_joints))
        object.__setattr__(self, 'actuator_kwargs',
                           frozen_mapping(self.actuator_kwargs, 'actuator_kwargs'))
        for term in self.friction:
            check_choice('friction', term, FRICTION_TERMS)
        if len(set(self.friction)) != len(self.friction):
            raise ValueError(f'friction: repeated terms in {self.friction}')
        check_choice('coulomb', self.coulomb, ('sign', 'tanh'))
        check_choice('weighting', self.weighting, ('none', 'per_joint'))
        check_choice('full_parameters', self.full_parameters, ('prior', 'min_norm'))
        check_choice('source', self.source, ('auto', 'tau', 'u'))
        check_choice('actuator', self.actuator, ACTUATORS)
        check_positive('coulomb_eps', self.coulomb_eps)
        check_positive('rank_tolerance', self.rank_tolerance)
        check_positive('structural_samples', self.structural_samples, allow_zero=True,
                       integer=True)
        if not isinstance(self.armature, bool):
            raise ValueError(f'armature must be a bool, got {self.armature!r}')


@dataclass(frozen=True)
class RegressorColumns:
    """
    Column layout of the extended regressor ``W`` and of the parameter vector ``phi``.

    Order: inertial ``(10 n)``, armature ``(n)`` if enabled, then the friction terms in
    :data:`FRICTION_TERMS` order, ``n`` each.
    """

    friction: Tuple[str, ...] = ('viscous', 'coulomb')
    armature: bool = False
    coulomb: str = 'sign'
    coulomb_eps: float = 1e-2

    def terms(self) -> Tuple[str, ...]:
        """Return the joint-level column groups in order."""
        return (('armature',) if self.armature else ()) + tuple(
            t for t in FRICTION_TERMS if t in self.friction)

    def names(self, model: RobotModel) -> Tuple[str, ...]:
        """
        Return the ``p`` parameter names.

        :param model: the robot.
        :return: ``'<link>/<m|mx|...>'`` then ``'<joint>/<armature|damping|coulomb|offset>'``.
        """
        names = list(model.inertial_parameter_names())
        for term in self.terms():
            kind = 'damping' if term == 'viscous' else term
            names += [f'{joint}/{kind}' for joint in model.joint_names]
        return tuple(names)

    def units(self, model: RobotModel) -> Tuple[str, ...]:
        """
        Return the ``p`` parameter units.

        :param model: the robot.
        :return: unit strings in :meth:`names` order.
        """
        units = list(INERTIAL_UNITS * model.n)
        for term in self.terms():
            kind = 'damping' if term == 'viscous' else term
            units += [joint_unit(model, j, kind) for j in range(model.n)]
        return tuple(units)

    def matrix(self, model: RobotModel, q: Tensor, qd: Tensor, qdd: Tensor) -> Tensor:
        """
        Return the extended regressor ``W`` with ``W @ phi = tau_applied``.

        :param model: the robot (kinematics only).
        :param q: ``(..., n)``.
        :param qd: ``(..., n)``.
        :param qdd: ``(..., n)``.
        :return: ``(..., n, p)``.
        """
        blocks = [joint_torque_regressor(model, q, qd, qdd)]
        for term in self.terms():
            blocks.append(torch.diag_embed(self._signal(term, qd, qdd)))
        return torch.cat(blocks, -1)

    def _signal(self, term: str, qd: Tensor, qdd: Tensor) -> Tensor:
        if term == 'armature':
            return qdd
        if term == 'viscous':
            return qd
        if term == 'coulomb':
            return torch.sign(qd) if self.coulomb == 'sign' else torch.tanh(
                qd / self.coulomb_eps)
        return torch.ones_like(qd)

    def vector(self, model: RobotModel, offset: Optional[Tensor] = None) -> Tensor:
        """
        Return a model's parameter vector ``phi`` in this layout.

        :param model: an unbatched robot model.
        :param offset: ``(n,)`` torque offsets (zeros when ``None``).
        :return: ``(p,)``.
        """
        fields = {'armature': model.armature, 'viscous': model.damping,
                  'coulomb': model.friction,
                  'offset': offset if offset is not None else torch.zeros_like(model.damping)}
        parts = [model.inertial.reshape(-1)] + [fields[t].reshape(-1) for t in self.terms()]
        return torch.cat(parts)

    def fixed_torque(self, model: RobotModel, qd: Tensor, qdd: Tensor) -> Tensor:
        """
        Return the modelled torque of the terms this layout does *not* identify.

        ``armature qdd`` (when armature is off) and the nominal damping / Coulomb friction
        (when those columns are off) of the model; they are subtracted from the target.

        :param model: the robot with the nominal values.
        :param qd: ``(..., n)``.
        :param qdd: ``(..., n)``.
        :return: ``(..., n)``.
        """
        tau = torch.zeros_like(qd)
        if not self.armature:
            tau = tau + model.armature * qdd
        if 'viscous' not in self.friction:
            tau = tau + model.damping * qd
        if 'coulomb' not in self.friction:
            tau = tau + model.friction * self._signal('coulomb', qd, qdd)
        return tau


@dataclass(frozen=True, eq=False)
class BaseParameters:
    """
    The identifiable combinations ``beta = matrix @ phi`` of a regressor layout.

    :param columns: the layout.
    :param names: the ``p`` parameter names.
    :param units: the ``p`` parameter units.
    :param independent: the ``r`` independent column indices (ascending).
    :param matrix: ``(r, p)`` float64: ``beta = matrix @ phi``, identity on ``independent``.
    :param column_norms: ``(p,)`` norms of the structural columns (the parameter metric).
    :param structural_rank: ``r``.
    """

    columns: RegressorColumns
    names: Tuple[str, ...]
    units: Tuple[str, ...]
    independent: Tuple[int, ...]
    matrix: Tensor
    column_norms: Tensor
    structural_rank: int

    @property
    def base_names(self) -> Tuple[str, ...]:
        """Return ``'base/<k>'`` names of the base parameters."""
        return tuple(f'base/{k}' for k in range(len(self.independent)))

    @property
    def base_units(self) -> Tuple[str, ...]:
        """Return the unit of each base parameter (that of its leading column)."""
        return tuple(self.units[i] for i in self.independent)

    def expressions(self, digits: int = 6) -> Tuple[str, ...]:
        """
        Return each base parameter as a readable combination of the original ones.

        :param digits: significant digits of the coefficients.
        :return: e.g. ``('upper_link/iyy + 0.09 lower_link/m + 0.6 lower_link/mz', ...)``.
        """
        out = []
        matrix = self.matrix.cpu().numpy()
        for row, lead in zip(matrix, self.independent):
            terms = [self.names[lead]]
            for k in np.flatnonzero(row):
                if k == lead:
                    continue
                terms.append(f'{"+" if row[k] > 0 else "-"} {abs(row[k]):.{digits}g} '
                             f'{self.names[k]}')
            out.append(' '.join(terms))
        return tuple(out)

    def unidentified(self) -> Tuple[str, ...]:
        """
        Return the parameters that enter no base parameter (their regressor column is zero).

        Such a parameter changes no joint torque of the robot in any state (e.g. the mass of
        a first link that turns about a vertical axis), so no data can determine it.

        :return: names from :attr:`names`, in layout order.
        """
        absent = (self.matrix == 0).all(0).tolist()
        return tuple(name for name, missing in zip(self.names, absent) if missing)

    def values(self, model: RobotModel, offset: Optional[Tensor] = None) -> Tensor:
        """
        Return the base parameters of a model, e.g. to compare two models' identifiable parts.

        :param model: unbatched robot model.
        :param offset: ``(n,)`` offsets when the layout has them.
        :return: ``(r,)`` float64.
        """
        phi = self.columns.vector(model, offset).detach().to(torch.float64).cpu()
        return self.matrix @ phi

    def regressor(self, model: RobotModel, q: Tensor, qd: Tensor, qdd: Tensor) -> Tensor:
        """
        Return the base regressor ``W[..., independent]``.

        :param model: the robot.
        :param q: ``(..., n)``.
        :param qd: ``(..., n)``.
        :param qdd: ``(..., n)``.
        :return: ``(..., n, r)``.
        """
        W = self.columns.matrix(model, q, qd, qdd)
        return W[..., list(self.independent)]

    def closest_full(self, beta: Tensor, phi0: Tensor) -> Tensor:
        """
        Return the ``phi`` with ``matrix @ phi = beta`` closest to ``phi0``.

        Distance ``||D (phi - phi0)||`` with ``D = diag(column_norms)``.

        :param beta: ``(r,)``.
        :param phi0: ``(p,)`` (nominal parameters, or zeros for the minimum norm).
        :return: ``(p,)`` float64.
        """
        Dinv2 = self.column_norms.reciprocal().square()
        B = self.matrix
        gap = beta.to(B) - B @ phi0.to(B)
        lagrange = torch.linalg.solve((B * Dinv2) @ B.T, gap)
        return phi0.to(B) + Dinv2 * (B.T @ lagrange)


def _random_states(model: RobotModel, samples: int,
                   generator: torch.Generator) -> Tuple[Tensor, Tensor, Tensor]:
    like = {'dtype': torch.float64, 'generator': generator}
    n = model.n
    prismatic = torch.tensor([t == PRISMATIC for t in model.tree.joint_types])
    q = torch.rand(samples, n, **like) * 2.0 - 1.0
    q = torch.where(prismatic, q, math.pi * q)
    return q, torch.randn(samples, n, **like), torch.randn(samples, n, **like)


def base_parameters(model: RobotModel, columns: Optional[RegressorColumns] = None,
                    rank_tolerance: float = 1e-8, samples: int = 0,
                    generator: Optional[torch.Generator] = None) -> BaseParameters:
    """
    Find the base parameters of a robot from the structure of its regressor.

    :param model: the robot (kinematics only).
    :param columns: regressor layout (default: inertial + viscous + Coulomb).
    :param rank_tolerance: rank threshold on ``|R_ii| / |R_00|`` of the column-normalised QR.
    :param samples: random states (0: ``3 p / n + 10``).
    :param generator: local generator for the random states (default seed 0).
    :return: the base-parameter map.
    """
    columns = columns if columns is not None else RegressorColumns()
    generator = generator if generator is not None else torch.Generator().manual_seed(0)
    names = columns.names(model)
    p = len(names)
    samples = samples or (3 * p) // model.n + 10
    structural = model.to(dtype=torch.float64, device='cpu')
    q, qd, qdd = _random_states(structural, samples, generator)
    W = columns.matrix(structural, q, qd, qdd).reshape(-1, p).numpy()
    norms = np.linalg.norm(W, axis=0)
    # Columns that are zero in exact arithmetic hold round-off (~1e-16 of the others); scaled
    # to unit norm they would look independent, so they are zeroed first.
    zero = norms <= rank_tolerance * norms.max(initial=0.0)
    safe = np.where(zero, 1.0, norms)
    W = np.where(zero[None, :], 0.0, W / safe)
    _, R, perm = scipy.linalg.qr(W, mode='economic', pivoting=True)
    diag = np.abs(np.diag(R))
    rank = int(np.sum(diag > rank_tolerance * diag[0])) if diag.size and diag[0] > 0 else 0
    ind, dep = perm[:rank], perm[rank:]
    K = scipy.linalg.solve_triangular(R[:rank, :rank], R[:rank, rank:])
    K[np.abs(K) < _COEFFICIENT_ROUNDOFF] = 0.0
    matrix = np.zeros((rank, p))
    matrix[np.arange(rank), ind] = 1.0
    matrix[:, dep] = K * safe[dep][None, :] / safe[ind][:, None]
    order = np.argsort(ind)
    return BaseParameters(columns=columns, names=names, units=columns.units(model),
                          independent=tuple(int(i) for i in ind[order]),
                          matrix=torch.from_numpy(matrix[order]),
                          column_norms=torch.from_numpy(safe), structural_rank=rank)


def _svd_solve(A: np.ndarray, b: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return min-norm LS ``beta``, ``(A^T A)^-1`` and singular values (normalised columns)."""
    norms = np.linalg.norm(A, axis=0)
    norms = np.where(norms > 0, norms, 1.0)
    U, singular, Vt = np.linalg.svd(A / norms, full_matrices=False)
    cutoff = singular[0] * max(A.shape) * np.finfo(float).eps if singular.size else 0.0
    inverse = np.where(singular > cutoff, 1.0 / np.where(singular > 0, singular, 1.0), 0.0)
    beta = (Vt.T @ (inverse * (U.T @ b))) / norms
    normal_inverse = (Vt.T * inverse ** 2) @ Vt / np.outer(norms, norms)
    return beta, normal_inverse, singular


def least_squares(W: Tensor, y: Tensor, weighting: str = 'none',
                  iterations: int = 3) -> Dict[str, Any]:
    """
    Solve ``min ||W beta - y||`` stacked over samples, with its covariance.

    One SVD of the column-normalised regressor gives the minimum-norm solution (singular
    values below ``max(shape) eps`` of the largest are dropped), the condition number and
    ``(W^T W)^-1``.

    :param W: base regressor ``(N, n, r)``.
    :param y: targets ``(N, n)``.
    :param weighting: ``'none'`` or ``'per_joint'``: rows of joint ``j`` divided by its
        residual standard deviation, re-estimated from the residuals ``iterations`` times
        starting from ordinary LS (iteratively reweighted LS).
    :param iterations: reweighting passes for ``'per_joint'``.
    :return: ``beta (r,)``, ``covariance (r, r)`` (``sigma^2 (W^T S^-1 W)^-1`` with the
        weights ``S``), ``residual (N, n)`` (unweighted), ``joint_std (n,)`` residual standard
        deviation per joint, ``condition_number`` of the column-normalised (weighted) regressor
        and ``rank`` of the data regressor.
    """
    N, n, r = W.shape
    A = W.reshape(-1, r).to(torch.float64).cpu().numpy()
    b = y.reshape(-1).to(torch.float64).cpu().numpy()
    dof = max(N * n - r, 1)
    weights = np.ones(n)
    joint_std = weights
    passes = 1 + (iterations if weighting == 'per_joint' else 0)
    for k in range(passes):
        if k:
            weights = 1.0 / joint_std
        row_weights = np.tile(weights, N)
        beta, normal_inverse, singular = _svd_solve(A * row_weights[:, None], b * row_weights)
        residual = (b - A @ beta).reshape(N, n)
        joint_std = np.sqrt(np.maximum((residual ** 2).sum(0) / (dof / n), 1e-300))
    sigma2 = float(((residual * weights) ** 2).sum()) / dof
    rank = int(np.sum(singular > singular[0] * max(A.shape) * np.finfo(float).eps))
    cond = float(singular[0] / singular[-1]) if singular[-1] > 0 else math.inf
    return {'beta': torch.from_numpy(beta),
            'covariance': torch.from_numpy(sigma2 * normal_inverse),
            'residual': torch.from_numpy(residual), 'joint_std': torch.from_numpy(joint_std),
            'condition_number': cond, 'rank': rank}


def _targets(config: NEAConfig, model: RobotModel, batch: SampleBatch, joints: Sequence[str],
             columns: RegressorColumns) -> Tuple[Tensor, Tensor]:
    """Return the applied torque and the LS target (applied minus fixed nominal terms)."""
    B = command_matrix(model, joints)
    m = batch.u.shape[-1]
    actuator = make_actuator(config.actuator, m, config.actuator_kwargs, model.dtype,
                             model.device)
    with torch.no_grad():
        u = batch.u if actuator is None else actuator(batch.u, batch.qd @ B)
        applied = u @ B.mT
    return applied, applied - columns.fixed_torque(model, batch.qd, batch.qdd)


def fit_nea(model: RobotModel, train: Data, validation: Optional[Data] = None,
            config: Optional[NEAConfig] = None) -> IdentificationResult:
    """
    Identify base parameters by linear least squares (see the module docstring).

    :param model: nominal robot (kinematics, and the prior for the full parameters).
    :param train: trajectories with ``q, qd, qdd`` and ``tau`` (or ``u`` with an actuator).
    :param validation: optional held-out trajectories (metrics only).
    :param config: :class:`NEAConfig` (default settings when ``None``).
    :return: result with ``parameters`` = full ``phi`` entries and ``'base/<k>'`` entries (the
        latter with ``std``); ``metrics``: ``rank``, ``structural_rank``,
        ``condition_number``, ``base_expressions``, ``residual_std`` per joint,
        ``torque_rmse`` / ``torque_nmse`` (and ``validation_*``), ``physically_consistent``
        per body, ``wall_time_s``; ``state``: ``base_matrix``, ``base_values``,
        ``base_covariance``.
    """
    start = time.perf_counter()
    config = config if config is not None else NEAConfig()
    model = model.to(dtype=torch.float64)
    columns = RegressorColumns(friction=config.friction, armature=config.armature,
                               coulomb=config.coulomb, coulomb_eps=config.coulomb_eps)
    generator = torch.Generator().manual_seed(config.seed)
    base = base_parameters(model, columns, config.rank_tolerance, config.structural_samples,
                           generator)
    runs = as_trajectories(train, 'train')
    source = resolve_source(runs, config.source, config.actuator != 'none')
    batch = stack_samples(runs, model, source, need_qdd=True)
    joints = command_joints_for(model, source, batch.u.shape[-1], config.command_joints)
    applied, target = _targets(config, model, batch, joints, columns)
    with torch.no_grad():
        W = base.regressor(model, batch.q, batch.qd, batch.qdd)
    solution = least_squares(W, target, config.weighting)
    beta = solution['beta']
    phi0 = columns.vector(model) if config.full_parameters == 'prior' else torch.zeros(
        len(base.names), dtype=torch.float64)
    phi = base.closest_full(beta, phi0)
    identified = _model_from_phi(model, columns, phi)

    parameters: Dict[str, Tuple[float, str]] = inertial_parameters(identified)
    for kind, values in (('armature', identified.armature), ('damping', identified.damping),
                         ('coulomb', identified.friction)):
        parameters.update(joint_parameters(identified, kind, values))
    n = model.n
    if 'offset' in config.friction:
        start_offset = len(base.names) - n
        parameters.update(joint_parameters(identified, 'offset', phi[start_offset:]))
    std = {}
    beta_std = solution['covariance'].diagonal().clamp_min(0).sqrt()
    for name, unit, value, sd in zip(base.base_names, base.base_units, beta.tolist(),
                                     beta_std.tolist()):
        parameters[name] = (value, unit)
        std[name] = sd

    # as DiffNEA: per joint, the larger of the applied and the nominal rigid-body torque
    # variance (a passive joint has no applied torque but still a dynamic torque scale)
    with torch.no_grad():
        nominal_rigid = rnea(model, batch.q, batch.qd, batch.qdd)
    scale = torch.maximum(variance_scale(applied), variance_scale(nominal_rigid))
    metrics: Dict[str, Any] = {
        'rank': solution['rank'], 'structural_rank': base.structural_rank,
        'condition_number': solution['condition_number'],
        'base_expressions': list(base.expressions()),
        'residual_std': solution['joint_std'].tolist(),
        'physically_consistent': is_physically_consistent(identified.inertial).tolist(),
    }
    fit = error_metrics(solution['residual'], scale)
    metrics.update({'torque_rmse': fit['rmse'], 'torque_nmse': fit['nmse']})
    if validation is not None:
        val_runs = as_trajectories(validation, 'validation')
        val = stack_samples(val_runs, model, source, need_qdd=True)
        _, val_target = _targets(config, model, val, joints, columns)
        with torch.no_grad():
            val_W = base.regressor(model, val.q, val.qd, val.qdd)
        residual = val_target - (val_W @ beta.to(val_W)).detach()
        fit = error_metrics(residual, scale)
        metrics.update({'validation_torque_rmse': fit['rmse'],
                        'validation_torque_nmse': fit['nmse']})
    metrics['wall_time_s'] = time.perf_counter() - start
    metrics['iterations'] = 1
    return IdentificationResult(
        method='nea', model=identified, parameters=parameters, std=std, metrics=metrics,
        command_joints=tuple(joints), coulomb_eps=config.coulomb_eps,
        config=config.to_dict(),
        state={'base_matrix': base.matrix, 'base_values': beta,
               'base_covariance': solution['covariance'], 'phi': phi})


def _model_from_phi(model: RobotModel, columns: RegressorColumns, phi: Tensor) -> RobotModel:
    """Return the model with the fields of ``phi`` written into it."""
    n = model.n
    phi = phi.to(dtype=model.dtype, device=model.device)
    changes = {'inertial': phi[:10 * n].reshape(n, 10)}
    field_of = {'armature': 'armature', 'viscous': 'damping', 'coulomb': 'friction'}
    for k, term in enumerate(columns.terms()):
        if term in field_of:
            changes[field_of[term]] = phi[10 * n + k * n:10 * n + (k + 1) * n]
    return model.replace(**changes)


__all__ = ['BaseParameters', 'FRICTION_TERMS', 'NEAConfig', 'RegressorColumns',
           'base_parameters', 'fit_nea', 'least_squares']
