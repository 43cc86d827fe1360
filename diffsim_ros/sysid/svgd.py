"""
Stein variational gradient descent (SVGD) and its constrained variant (CSVGD).

SVGD (Liu & Wang, NeurIPS 2016) moves ``P`` particles ``x_i`` along

    ``phi(x_i) = 1/P sum_j [k(x_j, x_i) grad log p(x_j) + grad_{x_j} k(x_j, x_i)]``,

a kernel-smoothed gradient plus a repulsive term that keeps the particles spread like the
target.  The particles are one ``(P, d)`` tensor; ``log_prob_fn`` receives all of them in one
call, so a simulator evaluates every particle in a single batched rollout: the caller maps
the ``(P, d)`` matrix to model fields of shape ``(P, 1, ...)`` (see :class:`ParameterMap`)
and lets :class:`~diffsim_ros.core.model.RobotModel` broadcasting do the rest.

Constrained SVGD (Heiden et al., ICRA 2022) adds equality constraints ``c(x) = 0`` (the
shooting-window defects of multiple shooting) through an augmented Lagrangian, see
:meth:`SVGD.run`.  Particles are initialised by a scrambled Sobol sequence
(:func:`sobol_particles`) and summarised by :func:`summarize`.
"""

import abc
from dataclasses import dataclass
import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Type, Union

import numpy as np
import torch

from ..core.errors import ShapeError

Tensor = torch.Tensor
LogProbFn = Callable[[Tensor], Union[Tensor, Tuple[Tensor, Tensor]]]
ConstraintFn = Callable[[Tensor], Tensor]
Callback = Callable[[int, Tensor, Dict[str, float]], None]


def _check_particles(name: str, x: Tensor) -> None:
    if x.dim() != 2:
        raise ShapeError(f'{name}: expected shape (P, d), got {tuple(x.shape)}')


def _median_bandwidth(sq_dist: Tensor) -> Tensor:
    """Median of the off-diagonal squared distances over ``log(P + 1)`` (Liu & Wang 2016)."""
    P = sq_dist.shape[0]
    off_diagonal = sq_dist[~torch.eye(P, dtype=torch.bool, device=sq_dist.device)]
    med = off_diagonal.median() if P > 1 else sq_dist.new_tensor(1.0)
    return (med / math.log(P + 1)).clamp_min(torch.finfo(sq_dist.dtype).tiny)


class Kernel(abc.ABC):
    """
    Stationary kernel ``k(x, y) = f(|x - y|^2 / h)`` on particles ``(P, d)``.

    :meth:`__call__` returns the kernel matrix and the repulsive term in closed form, so
    SVGD needs autograd only for ``grad log p``.  A bandwidth of ``None`` uses the median
    heuristic, recomputed at every call from the current particles (not differentiated).
    """

    #: registry name
    name: str = ''

    def __init__(self, bandwidth: Optional[float] = None) -> None:
        """
        Kernel with a fixed or adaptive bandwidth.

        :param bandwidth: ``h`` in squared units of the particle coordinates; ``None`` for
            the median heuristic ``h = med(|x_i - x_j|^2) / log(P + 1)``.
        """
        if bandwidth is not None and not bandwidth > 0:
            raise ValueError(f'{self.name} kernel: bandwidth must be > 0, got {bandwidth}')
        self.bandwidth = bandwidth

    @abc.abstractmethod
    def _profile(self, r: Tensor) -> Tuple[Tensor, Tensor]:
        """Return ``f(r)`` and ``f'(r)`` for scaled squared distances ``r``."""

    def __call__(self, x: Tensor) -> Tuple[Tensor, Tensor]:
        """
        Kernel matrix and repulsive term of particles.

        :param x: particles ``(P, d)``.
        :return: ``K (P, P)`` with ``K[i, j] = k(x_i, x_j)`` and the repulsive term
            ``R (P, d)`` with ``R[i] = sum_j grad_{x_j} k(x_j, x_i)``.
        """
        x = x.detach()
        sq_norm = x.square().sum(-1)
        sq_dist = (sq_norm.unsqueeze(-1) + sq_norm - 2.0 * x @ x.mT).clamp_min(0.0)
        h = _median_bandwidth(sq_dist) if self.bandwidth is None \
            else sq_dist.new_tensor(self.bandwidth)
        K, dK_dr = self._profile(sq_dist / h)
        # grad_{x_j} f(|x_j - x_i|^2 / h) = f'(r_ij) 2 (x_j - x_i) / h, summed over j
        R = (2.0 / h) * (dK_dr @ x - dK_dr.sum(-1, keepdim=True) * x)
        return K, R


class RBFKernel(Kernel):
    """Gaussian kernel ``k(x, y) = exp(-|x - y|^2 / h)``."""

    name = 'rbf'

    def _profile(self, r: Tensor) -> Tuple[Tensor, Tensor]:
        # Weights below eps^2 (invisible next to k(x, x) = 1) become exact zeros: their tiny
        # and subnormal products slow the kernel matrix products down several-fold.
        cutoff = -2.0 * math.log(torch.finfo(r.dtype).eps)
        K = torch.exp(-r.clamp_max(cutoff)).masked_fill(r >= cutoff, 0.0)
        return K, -K


class IMQKernel(Kernel):
    """Inverse multiquadric kernel ``k(x, y) = (1 + |x - y|^2 / h)^beta``, ``beta < 0``."""

    name = 'imq'

    def __init__(self, bandwidth: Optional[float] = None, beta: float = -0.5) -> None:
        """
        IMQ kernel (Gorham & Mackey 2017); heavy tails keep far particles interacting.

        :param bandwidth: ``h``; ``None`` for the median heuristic.
        :param beta: exponent in ``(-1, 0)``; ``-1/2`` is the usual choice.
        """
        super().__init__(bandwidth)
        if not -1.0 < beta < 0.0:
            raise ValueError(f'imq kernel: beta must lie in (-1, 0), got {beta}')
        self.beta = beta

    def _profile(self, r: Tensor) -> Tuple[Tensor, Tensor]:
        base = 1.0 + r
        return base.pow(self.beta), self.beta * base.pow(self.beta - 1.0)


_KERNELS: Dict[str, Type[Kernel]] = {cls.name: cls for cls in (RBFKernel, IMQKernel)}


def make_kernel(name: str, **options: Any) -> Kernel:
    """
    SVGD kernel by registry name.

    :param name: ``'rbf'`` or ``'imq'``.
    :param options: constructor options (``bandwidth``; ``beta`` for ``'imq'``).
    :return: the kernel.
    """
    try:
        cls = _KERNELS[name]
    except (KeyError, TypeError):
        valid = ', '.join(repr(n) for n in sorted(_KERNELS))
        raise ValueError(f'unknown SVGD kernel {name!r}; valid names: {valid}') from None
    return cls(**options)


def svgd_direction(particles: Tensor, grad_log_p: Tensor, kernel: Kernel) -> Tensor:
    """
    Stein variational direction ``phi`` at every particle.

    :param particles: ``(P, d)``.
    :param grad_log_p: ``grad log p`` at each particle ``(P, d)``.
    :param kernel: the kernel (see :func:`make_kernel`).
    :return: ``phi (P, d)``, the ascent direction of SVGD.
    """
    _check_particles('particles', particles)
    if grad_log_p.shape != particles.shape:
        raise ShapeError(f'grad_log_p: expected shape {tuple(particles.shape)}, '
                         f'got {tuple(grad_log_p.shape)}')
    K, R = kernel(particles)
    return (K @ grad_log_p + R) / particles.shape[0]


_OPTIMIZERS: Dict[str, Type[torch.optim.Optimizer]] = {
    'adagrad': torch.optim.Adagrad, 'adam': torch.optim.Adam, 'sgd': torch.optim.SGD,
}


@dataclass(frozen=True)
class AugmentedLagrangian:
    """
    Schedule of the constrained-SVGD augmented Lagrangian.

    :param mu: initial penalty weight ``mu``.
    :param mu_growth: factor applied to ``mu`` at every multiplier update.
    :param mu_max: upper limit of ``mu``.
    :param update_every: SVGD steps ``K`` between multiplier updates.
    """

    mu: float = 1.0
    mu_growth: float = 1.0
    mu_max: float = 1e3
    update_every: int = 5

    def __post_init__(self) -> None:
        """Reject schedules that cannot converge."""
        if not (self.mu > 0 and self.mu_growth >= 1 and self.mu_max >= self.mu
                and self.update_every >= 1):
            raise ValueError(f'invalid augmented-Lagrangian schedule: {self}')


@dataclass
class SVGDResult:
    """
    Outcome of :meth:`SVGD.run`.

    :param particles: final particles ``(P, d)`` (detached).
    :param multipliers: final Lagrange multipliers ``(P, m)`` (``None`` without constraints).
    :param mu: final penalty weight (``None`` without constraints).
    :param history: per step ``log_prob`` (mean over particles), ``phi_norm`` (mean norm of
        the direction) and, with constraints, ``violation`` (max ``|c|`` over particles).
    """

    particles: Tensor
    multipliers: Optional[Tensor]
    mu: Optional[float]
    history: List[Dict[str, float]]


class SVGD:
    """
    SVGD / constrained SVGD driver over a ``(P, d)`` particle tensor.

    The optimiser (``'adagrad'`` as in Pyro, ``'adam'`` or ``'sgd'``) ascends ``phi``;
    adaptive optimisers only rescale the step per coordinate, so the fixed point ``phi = 0``
    is unchanged, but Adam needs a decaying learning rate (``lr_final``) to settle.  With
    constraints prefer ``'sgd'``: the large early penalty gradients shrink Adagrad's and
    Adam's steps along the constraint set, and SGD is stable while
    ``lr * mu * |dc/dx|^2 < 2``.
    """

    def __init__(self, kernel: Union[str, Kernel] = 'rbf', optimizer: str = 'adagrad',
                 lr: float = 0.5, lr_final: Optional[float] = None) -> None:
        """
        Configure the driver.

        :param kernel: a :class:`Kernel` or a registry name (median-heuristic bandwidth).
        :param optimizer: ``'adam'``, ``'adagrad'`` or ``'sgd'``.
        :param lr: initial learning rate.
        :param lr_final: learning rate at the last step (geometric decay); ``None`` keeps
            ``lr``.
        """
        self.kernel = make_kernel(kernel) if isinstance(kernel, str) else kernel
        if optimizer not in _OPTIMIZERS:
            valid = ', '.join(repr(n) for n in sorted(_OPTIMIZERS))
            raise ValueError(f'unknown SVGD optimizer {optimizer!r}; valid names: {valid}')
        if not lr > 0 or (lr_final is not None and not lr_final > 0):
            raise ValueError(f'learning rates must be > 0, got lr={lr}, lr_final={lr_final}')
        self.optimizer = optimizer
        self.lr = lr
        self.lr_final = lr_final

    def run(self, log_prob_fn: LogProbFn, initial: Tensor, steps: int,
            constraint_fn: Optional[ConstraintFn] = None,
            lagrangian: Optional[AugmentedLagrangian] = None,
            callback: Optional[Callback] = None,
            with_constraints: bool = False) -> SVGDResult:
        """
        Move particles ``steps`` times along the (constrained) Stein direction.

        Without constraints each step ascends ``phi`` of :func:`svgd_direction` with the
        gradients of ``log_prob_fn(x).sum()`` (particle ``i``'s log density depends only on
        row ``i``, so one backward pass gives every ``grad log p(x_i)``).

        With constraints (CSVGD) every particle ``i`` has its own multipliers
        ``lambda_i (m,)``; the SVGD direction of ``log p`` is augmented by the gradient of
        particle ``i``'s own penalty, ``grad_{x_i} [-lambda_i^T c(x_i) - mu/2 |c(x_i)|^2]``.
        The penalty acts locally, outside the kernel average, so a neighbour's defects never
        push a particle off its own constraint set; the kernel and repulsion act as in SVGD.
        Every ``update_every`` steps ``lambda_i <- lambda_i + mu c(x_i)`` (per particle) and
        then ``mu <- min(mu * mu_growth, mu_max)`` (one scalar shared by all particles).
        For a linear constraint the tangential motion is exactly SVGD on the conditional
        density, and the normal motion drives every ``c(x_i)`` to zero.

        The constraints come from ``constraint_fn`` or, with ``with_constraints``, from
        ``log_prob_fn``, which then returns ``(log p (P,), c (P, m))``: a simulator evaluates
        both from one rollout (e.g. :meth:`MultipleShooting.log_prob_and_defects
        <diffsim_ros.sysid.likelihoods.MultipleShooting.log_prob_and_defects>`).  Either way
        one forward and one backward pass per step give both gradients: the particles are
        stacked twice, the first copy carries ``log p`` and the second the penalty.

        :param log_prob_fn: ``x (P, d) -> log p(x) (P,)`` (or ``(log p(x), c(x))``, see
            ``with_constraints``), differentiable, up to a constant; row ``i`` depends on
            ``x_i`` only.
        :param initial: initial particles ``(P, d)`` (not modified).
        :param steps: number of updates.
        :param constraint_fn: optional ``x (P, d) -> c(x) (P, m)``, differentiable; not
            allowed when ``log_prob_fn`` returns the constraints.
        :param lagrangian: schedule of ``mu`` and the multiplier updates (``None``: the
            defaults of :class:`AugmentedLagrangian`).
        :param callback: called as ``callback(step, particles, record)`` after each step.
        :param with_constraints: ``log_prob_fn`` returns the pair ``(log p, c)``.
        :return: the final particles, multipliers and per-step history.
        """
        _check_particles('initial', initial)
        if with_constraints and constraint_fn is not None:
            raise ValueError('with_constraints: log_prob_fn returns the constraints; do not '
                             'pass constraint_fn as well')
        lagrangian = lagrangian or AugmentedLagrangian()
        x = initial.detach().clone().requires_grad_(True)
        P = x.shape[0]
        optimizer = _OPTIMIZERS[self.optimizer]([x], lr=self.lr)
        gamma = 1.0 if self.lr_final is None or steps < 2 \
            else (self.lr_final / self.lr) ** (1.0 / (steps - 1))
        schedule = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma)
        multipliers: Optional[Tensor] = None
        mu = lagrangian.mu
        constrained = with_constraints or constraint_fn is not None
        history: List[Dict[str, float]] = []
        for step in range(steps):
            # Constrained: rows :P carry log p and rows P: the penalty, so that one backward
            # pass through one simulation returns both per-particle gradients.
            copies = x.detach().repeat(2, 1) if constrained else x.detach()
            copies.requires_grad_(True)
            log_p, c = _evaluate(log_prob_fn, constraint_fn, copies, with_constraints)
            log_p = log_p[:P]
            objective = log_p.sum()
            if c is not None:
                c = c[P:]
                if multipliers is None:
                    multipliers = c.new_zeros(c.shape).detach()
                objective = objective - (multipliers * c).sum() - 0.5 * mu * c.square().sum()
            gradient, = torch.autograd.grad(objective, copies)
            phi = svgd_direction(x.detach(), gradient[:P], self.kernel)
            record = {'log_prob': float(log_p.detach().mean()),
                      'phi_norm': float(phi.norm(dim=-1).mean())}
            if c is not None:
                phi = phi + gradient[P:]
                record['violation'] = float(c.detach().abs().max()) if c.numel() else 0.0
                if (step + 1) % lagrangian.update_every == 0:
                    multipliers = multipliers + mu * c.detach()
                    mu = min(mu * lagrangian.mu_growth, lagrangian.mu_max)
            optimizer.zero_grad(set_to_none=False)
            x.grad = -phi
            optimizer.step()
            schedule.step()
            history.append(record)
            if callback is not None:
                callback(step, x.detach(), record)
        return SVGDResult(x.detach(), multipliers, mu if constrained else None, history)


def _evaluate(log_prob_fn: LogProbFn, constraint_fn: Optional[ConstraintFn], x: Tensor,
              with_constraints: bool) -> Tuple[Tensor, Optional[Tensor]]:
    """Return ``log p (N,)`` and the constraints ``(N, m)`` (or ``None``) of particles."""
    c = None
    if with_constraints:
        out = log_prob_fn(x)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise ValueError('with_constraints: log_prob_fn must return (log_p, c)')
        log_p, c = out
    else:
        log_p = log_prob_fn(x)
        if isinstance(log_p, tuple):
            raise ValueError('log_prob_fn returned a tuple; pass with_constraints=True if it '
                             'returns (log_p, c)')
        if constraint_fn is not None:
            c = constraint_fn(x)
    if log_p.shape != x.shape[:1]:
        raise ShapeError(f'log_prob_fn: expected shape ({x.shape[0]},), '
                         f'got {tuple(log_p.shape)}')
    if c is not None and (c.dim() != 2 or c.shape[0] != x.shape[0]):
        raise ShapeError(f'constraint_fn: expected shape ({x.shape[0]}, m), '
                         f'got {tuple(c.shape)}')
    return log_p, c


def sobol_particles(count: int, lower: Sequence[float], upper: Sequence[float],
                    seed: Optional[int] = None, dtype: torch.dtype = torch.float64) -> Tensor:
    """
    Space-filling initial particles: a scrambled Sobol sequence in the box ``[lower, upper]``.

    Sobol points are balanced only in blocks of powers of two, so ``2^ceil(log2 count)``
    points are drawn and the first ``count`` kept (still low-discrepancy, not perfectly
    balanced).  The same ``seed`` gives the same particles.

    :param count: number of particles ``P``.
    :param lower: lower limits ``(d,)``.
    :param upper: upper limits ``(d,)``, each above its lower limit.
    :param seed: scrambling seed (``None``: fresh entropy).
    :param dtype: dtype of the result.
    :return: particles ``(P, d)`` inside ``[lower, upper)``.
    """
    lo = np.asarray(lower, dtype=np.float64).reshape(-1)
    hi = np.asarray(upper, dtype=np.float64).reshape(-1)
    if lo.shape != hi.shape or not np.all(np.isfinite(lo) & np.isfinite(hi) & (hi > lo)):
        raise ValueError(f'sobol_particles: need finite lower < upper of equal length, '
                         f'got lower={lo.tolist()}, upper={hi.tolist()}')
    if count < 1:
        raise ValueError(f'sobol_particles: count must be >= 1, got {count}')
    from scipy.stats import qmc   # here: scipy.stats is 0.5 s of every node's start-up
    sampler = qmc.Sobol(d=lo.size, scramble=True, seed=seed)
    unit = sampler.random_base2(max(0, math.ceil(math.log2(count))))[:count]
    return torch.as_tensor(qmc.scale(unit, lo, hi), dtype=dtype)


class ParameterMap:
    """
    Named physical parameters <-> normalised unconstrained coordinates ``z``.

    A bounded coordinate maps as ``x = lower + (upper - lower) sigmoid(z)``: every ``z`` in
    ``R`` gives a value strictly inside the limits (limits hold by construction) and
    ``z = 0`` is the middle of the range.  An unbounded coordinate (``lower = -inf`` and
    ``upper = inf``, e.g. a shooting-window start state) maps as ``x = loc + scale z``, with
    ``loc``/``scale`` a nominal value and spread (state normalisation, CSVGD appendix 1.3).
    Either way all coordinates SVGD moves are O(1) whatever the physical units.  If a
    density is defined on the physical parameters, the density of ``z`` is
    ``log p_z(z) = log p_x(x(z)) + log_abs_det_jacobian(z)``; a density defined directly on
    ``z`` (e.g. a likelihood with a flat prior in ``z``) needs no Jacobian.

    To simulate all particles in one call, turn ``physical(z)`` ``(P, d)`` into model fields
    with a particle dim, e.g. per-body scales ``s = x[:, :n]`` applied as
    ``model.replace(inertial=model.inertial * s[:, None, :, None])`` (shape ``(P, 1, n, 10)``),
    so that states ``(B, n)`` broadcast to results ``(P, B, n)`` (``docs/conventions.md``).
    """

    def __init__(self, names: Sequence[str], lower: Sequence[float], upper: Sequence[float],
                 loc: Optional[Sequence[float]] = None,
                 scale: Optional[Sequence[float]] = None) -> None:
        """
        Map of ``d`` named parameters.

        :param names: parameter names ``(d,)``, e.g. ``'link1/m'``, ``'joint1/damping'``.
        :param lower: lower limits ``(d,)`` in physical units, ``-inf`` for unbounded.
        :param upper: upper limits ``(d,)``, above the lower limit, ``inf`` for unbounded.
        :param loc: centre ``(d,)`` of the unbounded coordinates (default 0; ignored for
            bounded ones).
        :param scale: positive spread ``(d,)`` of the unbounded coordinates (default 1).
        """
        self.names = tuple(names)
        d = len(self.names)
        lo = torch.as_tensor(lower, dtype=torch.float64).reshape(-1)
        hi = torch.as_tensor(upper, dtype=torch.float64).reshape(-1)
        loc_t = torch.zeros(d, dtype=torch.float64) if loc is None \
            else torch.as_tensor(loc, dtype=torch.float64).reshape(-1)
        scale_t = torch.ones(d, dtype=torch.float64) if scale is None \
            else torch.as_tensor(scale, dtype=torch.float64).reshape(-1)
        if not (d == lo.numel() == hi.numel() == loc_t.numel() == scale_t.numel()):
            raise ValueError(f'ParameterMap: {d} names but {lo.numel()} lower, {hi.numel()} '
                             f'upper, {loc_t.numel()} loc and {scale_t.numel()} scale values')
        if len(set(self.names)) != d:
            raise ValueError(f'ParameterMap: duplicate names in {self.names}')
        bounded = torch.isfinite(lo) & torch.isfinite(hi)
        free = (lo == -math.inf) & (hi == math.inf)
        valid = (bounded & (hi > lo)) | (free & (scale_t > 0) & torch.isfinite(loc_t))
        bad = [n for k, n in enumerate(self.names) if not valid[k]]
        if bad:
            raise ValueError(f'ParameterMap: need finite lower < upper, or lower = -inf and '
                             f'upper = inf with finite loc and scale > 0, for {bad}')
        self.lower, self.upper, self.bounded = lo, hi, bounded
        # Unbounded coordinates use the same formulas with (offset, width) = (loc, scale).
        self._offset = torch.where(bounded, lo, loc_t)
        self._width = torch.where(bounded, hi - lo, scale_t)

    @property
    def dim(self) -> int:
        """Return the number ``d`` of parameters."""
        return len(self.names)

    def _constants(self, like: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        return tuple(t.to(dtype=like.dtype, device=like.device) if t.is_floating_point()
                     else t.to(device=like.device)
                     for t in (self._offset, self._width, self.bounded))

    def physical(self, z: Tensor) -> Tensor:
        """
        Physical parameters of normalised coordinates.

        :param z: ``(..., d)``, unconstrained.
        :return: ``(..., d)``; bounded coordinates strictly inside ``(lower, upper)`` (up to
            rounding).
        """
        offset, width, bounded = self._constants(z)
        return offset + width * torch.where(bounded, torch.sigmoid(z), z)

    def normalized(self, x: Tensor, margin: Optional[float] = None) -> Tensor:
        """
        Normalised coordinates of physical parameters (inverse of :meth:`physical`).

        :param x: ``(..., d)``, bounded coordinates inside ``[lower, upper]``.
        :param margin: fraction of the range by which values on a limit are moved inward,
            so that they map to finite ``z`` (default: the machine epsilon of ``x``).
        :return: ``z`` ``(..., d)``.
        """
        offset, width, bounded = self._constants(x)
        margin = torch.finfo(x.dtype).eps if margin is None else margin
        u = (x - offset) / width
        return torch.where(bounded, torch.logit(u.clamp(margin, 1.0 - margin)), u)

    def log_abs_det_jacobian(self, z: Tensor) -> Tensor:
        """
        ``log |det dx/dz|`` of :meth:`physical`.

        :param z: ``(..., d)``.
        :return: ``(...,)``.
        """
        _, width, bounded = self._constants(z)
        sigmoid_term = torch.nn.functional.logsigmoid(z) + torch.nn.functional.logsigmoid(-z)
        return (torch.log(width) + torch.where(bounded, sigmoid_term, 0.0)).sum(-1)

    def as_dict(self, x: Tensor) -> Dict[str, Tensor]:
        """
        Split physical parameters by name.

        :param x: ``(..., d)``.
        :return: ``{name: (...)}``.
        """
        return {name: x[..., k] for k, name in enumerate(self.names)}


@dataclass(frozen=True)
class PosteriorSummary:
    """
    Particle summary that an identification node can publish.

    :param names: parameter names ``(d,)``.
    :param mean: particle mean ``(d,)``.
    :param std: particle standard deviation ``(d,)`` (unbiased).
    :param modes: cluster centres ``(k, d)``, heaviest first.
    :param mode_weights: fraction of particles in each mode ``(k,)``.
    """

    names: Tuple[str, ...]
    mean: Tensor
    std: Tensor
    modes: Tensor
    mode_weights: Tensor

    def to_dict(self) -> Dict[str, Any]:
        """
        Plain-Python form (lists of floats) for messages, YAML or JSON.

        :return: ``{'names', 'mean', 'std', 'modes', 'mode_weights'}``.
        """
        return {'names': list(self.names), 'mean': self.mean.tolist(),
                'std': self.std.tolist(), 'modes': self.modes.tolist(),
                'mode_weights': self.mode_weights.tolist()}


def _kmeans(x: Tensor, k: int, generator: torch.Generator,
            iterations: int = 50) -> Tuple[Tensor, Tensor]:
    """K-means++ seeding and Lloyd iterations; return centres ``(k, d)``, labels ``(P,)``."""
    centres = x[torch.randint(x.shape[0], (1,), generator=generator)]
    for _ in range(1, k):
        d2 = torch.cdist(x, centres).square().min(-1).values
        pick = torch.multinomial(d2 + 1e-300, 1, generator=generator)
        centres = torch.cat([centres, x[pick]])
    labels = torch.cdist(x, centres).argmin(-1)
    for _ in range(iterations):
        for j in range(k):
            members = labels == j
            if members.any():
                centres[j] = x[members].mean(0)
        new_labels = torch.cdist(x, centres).argmin(-1)
        if torch.equal(new_labels, labels):
            break
        labels = new_labels
    return centres, labels


def _hard_mixture_bic(x: Tensor, labels: Tensor, centres: Tensor) -> float:
    """BIC of a hard-assigned mixture of isotropic Gaussians with one shared variance."""
    P, d = x.shape
    k = centres.shape[0]
    sse = float((x - centres[labels]).square().sum())
    counts = torch.bincount(labels, minlength=k).to(x.dtype)
    counts = counts[counts > 0]
    log_lik = -0.5 * P * d * math.log(max(sse / (P * d), 1e-300)) \
        + float((counts * torch.log(counts / P)).sum())
    n_params = k * d + (k - 1) + 1
    return -2.0 * log_lik + n_params * math.log(P)


def summarize(particles: Tensor, names: Sequence[str], max_modes: int = 4,
              seed: int = 0) -> PosteriorSummary:
    """
    Mean, standard deviation and modes of particles.

    Modes are k-means centres (k-means++ seeding from a local generator) on the particles
    standardised per coordinate; ``k = 1 .. max_modes`` is chosen by the BIC of a hard
    mixture of isotropic Gaussians with shared variance, whose assignment-entropy term keeps
    a single Gaussian blob at ``k = 1``.

    :param particles: ``(P, d)``.
    :param names: parameter names ``(d,)``.
    :param max_modes: largest number of modes tried.
    :param seed: seed of the k-means++ generator.
    :return: the summary.
    """
    _check_particles('particles', particles)
    x = particles.detach()
    if len(names) != x.shape[1]:
        raise ValueError(f'summarize: {len(names)} names for {x.shape[1]} parameters')
    P = x.shape[0]
    mean = x.mean(0)
    std = x.std(0) if P > 1 else torch.zeros_like(mean)
    z = (x - mean) / torch.where(std > 0, std, torch.ones_like(std))
    generator = torch.Generator(device=x.device).manual_seed(seed)
    best = None
    for k in range(1, min(max_modes, P) + 1):
        centres, labels = _kmeans(z, k, generator)
        bic = _hard_mixture_bic(z, labels, centres)
        if best is None or bic < best[0]:
            best = (bic, labels, k)
    _, labels, k = best
    counts = torch.bincount(labels, minlength=k)
    order = [j for j in torch.argsort(counts, descending=True).tolist() if counts[j] > 0]
    modes = torch.stack([x[labels == j].mean(0) for j in order])
    weights = counts[order].to(x.dtype) / P
    return PosteriorSummary(tuple(names), mean, std, modes, weights)
