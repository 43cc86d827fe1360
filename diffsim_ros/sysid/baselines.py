"""
Inference baselines behind the interface of :class:`~diffsim_ros.sysid.svgd.SVGD`.

Every method has ``run(log_prob_fn, initial, steps, constraint_fn=None, lagrangian=None,
callback=None)`` and returns an :class:`~diffsim_ros.sysid.svgd.SVGDResult`, so an experiment
swaps methods by name through :func:`make_inference`:

- ``'svgd'``: :class:`~diffsim_ros.sysid.svgd.SVGD` (Liu & Wang 2016).
- ``'csvgd'``: :class:`CSVGD`, SVGD that requires constraints (Heiden et al. 2022), with the
  SGD optimiser that the SVGD docstring recommends for them.
- ``'sgld'``: :class:`SGLD`, per-particle Langevin dynamics (Welling & Teh 2011).
- ``'cem'``: :class:`CEM`, the cross-entropy method (Rubinstein 1999), an optimiser that
  concentrates at a mode and does not sample the posterior.
- ``'emcee'``: :class:`Emcee`, the affine-invariant ensemble sampler (Goodman & Weare 2010,
  Foreman-Mackey et al. 2013) of the ``emcee`` package.

With ``constraint_fn`` (the multiple-shooting defects ``c(x) = 0``) every method maximises the
augmented-Lagrangian objective ``log p(x) - lambda^T c(x) - mu/2 |c(x)|^2`` of
:meth:`SVGD.run <diffsim_ros.sysid.svgd.SVGD.run>`, with the multiplier schedule of
:class:`~diffsim_ros.sysid.svgd.AugmentedLagrangian`; :class:`Emcee` keeps ``lambda = 0`` and
``mu`` fixed, because a sampler's target must not change during the run.  NUTS is not
provided (it needs per-chain tree building that does not batch over particles).
"""

import inspect
import math
from typing import Any, Dict, List, Optional, Protocol, Tuple, Type

import numpy as np
import torch

from .svgd import AugmentedLagrangian, Callback, ConstraintFn, LogProbFn, SVGD, SVGDResult
from ..core.errors import ShapeError

Tensor = torch.Tensor
#: The result type every method returns (particles, multipliers, mu, history).
InferenceResult = SVGDResult


class Inference(Protocol):
    """What :func:`make_inference` returns: an object with the ``run`` of :class:`SVGD`."""

    def run(self, log_prob_fn: LogProbFn, initial: Tensor, steps: int,
            constraint_fn: Optional[ConstraintFn] = None,
            lagrangian: Optional[AugmentedLagrangian] = None,
            callback: Optional[Callback] = None) -> InferenceResult:
        """
        Run the method from ``initial`` particles ``(P, d)`` for ``steps`` iterations.

        :param log_prob_fn: ``x (N, d) -> log p(x) (N,)``.
        :param initial: initial particles ``(P, d)``.
        :param steps: number of iterations.
        :param constraint_fn: optional ``x (N, d) -> c(x) (N, m)``.
        :param lagrangian: augmented-Lagrangian schedule.
        :param callback: ``callback(step, particles, record)`` after each iteration.
        :return: final particles and history.
        """


def _check_particles(x: Tensor) -> None:
    if x.dim() != 2:
        raise ShapeError(f'initial: expected shape (P, d), got {tuple(x.shape)}')


def _check_steps(steps: int) -> None:
    if int(steps) != steps or steps < 0:
        raise ValueError(f'steps must be a non-negative integer, got {steps}')


def _log_prob(log_prob_fn: LogProbFn, x: Tensor) -> Tensor:
    log_p = log_prob_fn(x)
    if log_p.shape != x.shape[:1]:
        raise ShapeError(f'log_prob_fn: expected shape ({x.shape[0]},), got {tuple(log_p.shape)}')
    return log_p


def _constraints(constraint_fn: ConstraintFn, x: Tensor) -> Tensor:
    c = constraint_fn(x)
    if c.dim() != 2 or c.shape[0] != x.shape[0]:
        raise ShapeError(f'constraint_fn: expected shape ({x.shape[0]}, m), got {tuple(c.shape)}')
    return c


def _generator(seed: Optional[int], device: torch.device) -> torch.Generator:
    """Local generator seeded by ``seed`` (fresh entropy for ``None``); never the global one."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


def _finite_or_minus_inf(values: Tensor) -> Tensor:
    return torch.where(torch.isnan(values), torch.full_like(values, -math.inf), values)


class _Multipliers:
    """Multipliers ``lambda`` and weight ``mu`` of an augmented Lagrangian, updated as SVGD."""

    def __init__(self, lagrangian: AugmentedLagrangian) -> None:
        self.lagrangian = lagrangian
        self.mu = lagrangian.mu
        self.values: Optional[Tensor] = None

    def penalty(self, c: Tensor) -> Tensor:
        """Return ``lambda^T c + mu/2 |c|^2`` per row of ``c (N, m)``."""
        quadratic = 0.5 * self.mu * c.square().sum(-1)
        return quadratic if self.values is None else (self.values * c).sum(-1) + quadratic

    def force(self, c: Tensor) -> Tensor:
        """Return ``lambda + mu c`` (detached), so that ``grad penalty = J^T force``."""
        c = c.detach()
        return self.mu * c if self.values is None else self.values + self.mu * c

    def update(self, step: int, c: Tensor) -> None:
        """Every ``update_every`` steps: ``lambda += mu c``, then grow ``mu``."""
        if (step + 1) % self.lagrangian.update_every:
            return
        c = c.detach()
        self.values = (torch.zeros_like(c) if self.values is None else self.values) + self.mu * c
        self.mu = min(self.mu * self.lagrangian.mu_growth, self.lagrangian.mu_max)


def constraint_jacobian(c: Tensor, x: Tensor) -> Tensor:
    """
    Per-particle Jacobian ``dc_i/dx_i`` of constraints whose row ``i`` depends on ``x_i`` only.

    One vector-Jacobian product per constraint, batched with ``vmap`` where the graph supports
    it (a loop of backward passes otherwise); the graph is retained.

    :param c: constraints ``(P, m)`` computed from ``x`` with autograd.
    :param x: particles ``(P, d)`` that require grad.
    :return: ``(P, m, d)``.
    """
    P, m = c.shape
    basis = torch.eye(m, dtype=c.dtype, device=c.device).unsqueeze(1).expand(m, P, m)
    try:
        rows, = torch.autograd.grad(c, x, grad_outputs=basis, retain_graph=True,
                                    is_grads_batched=True)
    except RuntimeError:
        rows = torch.stack([torch.autograd.grad(c, x, grad_outputs=basis[k], retain_graph=True)[0]
                            for k in range(m)])
    return rows.transpose(0, 1)


def tangent_projection(jacobian: Tensor, v: Tensor) -> Tensor:
    """
    Project vectors onto the null space of per-particle constraint Jacobians.

    :param jacobian: ``(P, m, d)``.
    :param v: ``(P, d)``.
    :return: ``v - J^+ J v`` ``(P, d)``, orthogonal to every row of ``J`` (rank deficient
        ``J`` allowed).
    """
    normal = torch.linalg.pinv(jacobian) @ (jacobian @ v.unsqueeze(-1))
    return v - normal.squeeze(-1)


class CSVGD(SVGD):
    """
    Constrained SVGD: :class:`SVGD` whose ``run`` requires ``constraint_fn``.

    The default optimiser is SGD, stable while ``lr * mu * |dc/dx|^2 < 2`` (see :class:`SVGD`).
    """

    def __init__(self, kernel: str = 'rbf', optimizer: str = 'sgd', lr: float = 0.1,
                 lr_final: Optional[float] = None) -> None:
        """
        Configure the driver.

        :param kernel: kernel registry name (median-heuristic bandwidth).
        :param optimizer: ``'adam'``, ``'adagrad'`` or ``'sgd'``.
        :param lr: initial learning rate.
        :param lr_final: learning rate at the last step; ``None`` keeps ``lr``.
        """
        super().__init__(kernel, optimizer, lr, lr_final)

    def run(self, log_prob_fn: LogProbFn, initial: Tensor, steps: int,
            constraint_fn: Optional[ConstraintFn] = None,
            lagrangian: Optional[AugmentedLagrangian] = None,
            callback: Optional[Callback] = None) -> InferenceResult:
        """
        Run :meth:`SVGD.run` with constraints.

        :param log_prob_fn: ``x (P, d) -> log p(x) (P,)``, differentiable.
        :param initial: initial particles ``(P, d)``.
        :param steps: number of updates.
        :param constraint_fn: ``x (P, d) -> c(x) (P, m)``, differentiable (required).
        :param lagrangian: augmented-Lagrangian schedule.
        :param callback: ``callback(step, particles, record)`` after each step.
        :return: the final particles, multipliers and per-step history.
        """
        if constraint_fn is None:
            raise ValueError("'csvgd' needs constraint_fn (e.g. multiple-shooting defects); "
                             "use 'svgd' without constraints")
        return super().run(log_prob_fn, initial, steps, constraint_fn, lagrangian, callback)


class SGLD:
    """
    Stochastic gradient Langevin dynamics (Welling & Teh 2011), one chain per particle.

    Each step moves every particle by ``x <- x + eps_t g(x) + sqrt(2 eps_t) xi`` with
    ``xi ~ N(0, I)`` and ``g`` the gradient of ``log p`` (full-batch: the likelihoods here
    are not minibatched, so this is the unadjusted Langevin algorithm with SGLD's decaying
    steps ``eps_t = lr (1 + t / b)^(-gamma)``, ``b`` chosen so that the last step is
    ``lr_final``).  The stationary density of a fixed step is biased by ``O(eps)``: for a
    Gaussian of precision ``a`` the variance is ``1 / (a (1 - eps a / 2))``.

    With constraints ``g`` is the gradient of the augmented Lagrangian, with per-particle
    multipliers and ``mu`` updated exactly as in :meth:`SVGD.run`.  A sampler never stops
    moving, so with ``project=False`` (that plain scheme) the noise holds ``|c|`` at the
    penalty's thermal width ``~1 / (sqrt(mu) |dc/dx|)`` and the multipliers integrate noise.
    With ``project=True`` (default) the ``log p`` gradient and the noise are projected onto
    the tangent space of the constraints (null space of each particle's ``J = dc/dx``, one
    vector-Jacobian product per constraint and step) while the penalty's restoring force
    ``J^T (lambda + mu c)`` acts in the normal directions: the violation then decays
    geometrically (for linear constraints; for curved ones the multipliers absorb the drift
    off the constraint set) and the tangential motion is Langevin dynamics of the density
    restricted to the constraint set (exact for linear constraints).  The normal motion is
    stable while ``eps mu |J|^2 < 2``, and needs ``update_every * eps mu |J|^2 >~ 1`` to
    settle between multiplier updates.
    """

    def __init__(self, lr: float = 0.01, lr_final: Optional[float] = None,
                 gamma: float = 0.55, project: bool = True,
                 seed: Optional[int] = None) -> None:
        """
        Configure the sampler.

        :param lr: first step size ``eps_0`` (squared units of the particle coordinates).
        :param lr_final: last step size, ``<= lr``; ``None`` keeps ``lr`` constant.
        :param gamma: decay exponent in ``(0.5, 1]`` (Welling & Teh's condition).
        :param project: with constraints, project the ``log p`` gradient and the noise onto
            the constraints' tangent space (see the class docstring).
        :param seed: seed of the local noise generator (``None``: fresh entropy).
        """
        if not lr > 0 or (lr_final is not None and not 0 < lr_final <= lr):
            raise ValueError(f'sgld: need lr > 0 and 0 < lr_final <= lr, got lr={lr}, '
                             f'lr_final={lr_final}')
        if not 0.5 < gamma <= 1.0:
            raise ValueError(f'sgld: gamma must lie in (0.5, 1], got {gamma}')
        self.lr, self.lr_final, self.gamma = lr, lr_final, gamma
        self.project = project
        self.seed = seed

    def step_sizes(self, steps: int) -> List[float]:
        """
        Step sizes of a run.

        :param steps: number of steps.
        :return: ``eps_t`` for ``t = 0 .. steps - 1``.
        """
        if self.lr_final is None or self.lr_final == self.lr or steps < 2:
            return [self.lr] * steps
        offset = (steps - 1) / ((self.lr / self.lr_final) ** (1.0 / self.gamma) - 1.0)
        return [self.lr * (1.0 + t / offset) ** -self.gamma for t in range(steps)]

    def run(self, log_prob_fn: LogProbFn, initial: Tensor, steps: int,
            constraint_fn: Optional[ConstraintFn] = None,
            lagrangian: Optional[AugmentedLagrangian] = None,
            callback: Optional[Callback] = None) -> InferenceResult:
        """
        Run ``steps`` Langevin steps of every particle.

        :param log_prob_fn: ``x (P, d) -> log p(x) (P,)``, differentiable, row ``i`` depending
            on ``x_i`` only.
        :param initial: initial particles ``(P, d)`` (not modified), one chain each.
        :param steps: number of steps.
        :param constraint_fn: optional ``x (P, d) -> c(x) (P, m)``, differentiable.
        :param lagrangian: schedule of ``mu`` and the multiplier updates (``None``: defaults).
        :param callback: ``callback(step, particles, record)`` after each step.
        :return: the final chain states as particles, multipliers and the history
            (``log_prob``, ``step_size``, ``violation`` with constraints).
        """
        _check_particles(initial)
        _check_steps(steps)
        generator = _generator(self.seed, initial.device)
        multipliers = _Multipliers(lagrangian or AugmentedLagrangian())
        x = initial.detach().clone()
        history: List[Dict[str, float]] = []
        for step, eps in enumerate(self.step_sizes(steps)):
            x.requires_grad_(True)
            log_p = _log_prob(log_prob_fn, x)
            record = {'log_prob': float(log_p.detach().mean()), 'step_size': eps}
            noise = torch.randn(x.shape, generator=generator, dtype=x.dtype, device=x.device)
            c = None if constraint_fn is None else _constraints(constraint_fn, x)
            if c is None:
                drift, = torch.autograd.grad(log_p.sum(), x)
            elif self.project and c.shape[1] > 0:
                jacobian = constraint_jacobian(c, x)
                grad_log_p, = torch.autograd.grad(log_p.sum(), x)
                force = multipliers.force(c).unsqueeze(-1)
                drift = tangent_projection(jacobian, grad_log_p) - (jacobian.mT @ force)[..., 0]
                noise = tangent_projection(jacobian, noise)
            else:
                drift, = torch.autograd.grad(log_p.sum() - multipliers.penalty(c).sum(), x)
            if c is not None:
                record['violation'] = float(c.detach().abs().max()) if c.numel() else 0.0
            x = x.detach() + eps * drift + math.sqrt(2.0 * eps) * noise
            if c is not None:
                multipliers.update(step, c)
            history.append(record)
            if callback is not None:
                callback(step, x, record)
        return _result(x, constraint_fn, multipliers, history)


def _result(x: Tensor, constraint_fn: Optional[ConstraintFn], multipliers: _Multipliers,
            history: List[Dict[str, float]], shared: bool = False) -> InferenceResult:
    if constraint_fn is None:
        return SVGDResult(x.detach(), None, None, history)
    values = multipliers.values
    if values is not None and shared:
        values = values.expand(x.shape[0], -1).clone()
    return SVGDResult(x.detach(), values, multipliers.mu, history)


class CEM:
    """
    Cross-entropy method with a diagonal Gaussian search distribution.

    Each iteration samples a population from ``N(mean, diag(std^2))``, keeps the elite
    fraction with the highest objective and refits ``mean``/``std`` to the elites, blended
    with the previous values by ``smoothing``.  The initial ``mean``/``std`` are those of
    the initial particles.  CEM is an optimiser: the search distribution collapses onto a
    mode, so the particles estimate the mode, not the posterior spread.

    With constraints the objective is the augmented Lagrangian of :meth:`SVGD.run` with
    multipliers shared by the population (it approximates one solution), updated every
    ``update_every`` iterations from the mean constraint value of the elites.
    """

    def __init__(self, elite_fraction: float = 0.1, population: Optional[int] = None,
                 smoothing: float = 0.1, min_std: float = 0.0,
                 seed: Optional[int] = None) -> None:
        """
        Configure the method.

        :param elite_fraction: fraction of the population kept as elites, in ``(0, 1]``.
        :param population: samples per iteration (``None``: ``ceil(P / elite_fraction)``,
            so that the ``P`` final elites replace the ``P`` initial particles).
        :param smoothing: weight of the previous ``mean``/``std`` in the refit, in ``[0, 1)``.
        :param min_std: floor of the search standard deviation (``0``: may collapse).
        :param seed: seed of the local sampling generator (``None``: fresh entropy).
        """
        if not 0 < elite_fraction <= 1 or not 0 <= smoothing < 1 or not min_std >= 0:
            raise ValueError(f'cem: need 0 < elite_fraction <= 1, 0 <= smoothing < 1 and '
                             f'min_std >= 0, got {elite_fraction}, {smoothing}, {min_std}')
        if population is not None and population < max(2, math.ceil(1 / elite_fraction)):
            raise ValueError(f'cem: population {population} leaves fewer than one elite or '
                             f'too few samples for a standard deviation')
        self.elite_fraction, self.population = elite_fraction, population
        self.smoothing, self.min_std, self.seed = smoothing, min_std, seed

    def _sizes(self, particles: int) -> Tuple[int, int]:
        population = self.population or max(2, math.ceil(particles / self.elite_fraction))
        return population, max(2, round(self.elite_fraction * population))

    def run(self, log_prob_fn: LogProbFn, initial: Tensor, steps: int,
            constraint_fn: Optional[ConstraintFn] = None,
            lagrangian: Optional[AugmentedLagrangian] = None,
            callback: Optional[Callback] = None) -> InferenceResult:
        """
        Run ``steps`` CEM iterations (no gradients; every population in one call).

        :param log_prob_fn: ``x (N, d) -> log p(x) (N,)``, evaluated under ``no_grad``.
        :param initial: initial particles ``(P, d)``, ``P >= 2``: their mean and standard
            deviation start the search distribution.
        :param steps: number of iterations.
        :param constraint_fn: optional ``x (N, d) -> c(x) (N, m)``.
        :param lagrangian: schedule of ``mu`` and the multiplier updates (``None``: defaults).
        :param callback: ``callback(step, elites, record)`` after each iteration.
        :return: the final elite population as particles, the shared multipliers repeated
            per particle, and the history (``log_prob`` and ``objective`` of the elites,
            ``std``, ``violation`` with constraints).
        """
        _check_particles(initial)
        _check_steps(steps)
        if initial.shape[0] < 2:
            raise ShapeError(f'initial: CEM needs P >= 2 particles, got {initial.shape[0]}')
        generator = _generator(self.seed, initial.device)
        multipliers = _Multipliers(lagrangian or AugmentedLagrangian())
        population, n_elite = self._sizes(initial.shape[0])
        x = initial.detach().clone()
        mean, std = x.mean(0), x.std(0).clamp_min(self.min_std)
        history: List[Dict[str, float]] = []
        with torch.no_grad():
            for step in range(steps):
                noise = torch.randn((population, x.shape[1]), generator=generator,
                                    dtype=x.dtype, device=x.device)
                samples = mean + std * noise
                log_p = _finite_or_minus_inf(_log_prob(log_prob_fn, samples))
                objective = log_p
                if constraint_fn is not None:
                    c = _constraints(constraint_fn, samples)
                    objective = log_p - _finite_or_minus_inf(multipliers.penalty(c))
                best = torch.topk(objective, n_elite).indices
                x = samples[best]
                weight = 1.0 - self.smoothing
                mean = weight * x.mean(0) + self.smoothing * mean
                std = (weight * x.std(0) + self.smoothing * std).clamp_min(self.min_std)
                record = {'log_prob': float(log_p[best].mean()),
                          'objective': float(objective[best].mean()),
                          'std': float(std.mean())}
                if constraint_fn is not None:
                    elite_c = c[best]
                    record['violation'] = float(elite_c.abs().max()) if c.numel() else 0.0
                    multipliers.update(step, elite_c.mean(0))
                history.append(record)
                if callback is not None:
                    callback(step, x, record)
        return _result(x, constraint_fn, multipliers, history, shared=True)


_MOVES = ('de', 'stretch')


class Emcee:
    """
    Affine-invariant ensemble MCMC of the ``emcee`` package; walkers are the particles.

    ``log_prob_fn`` is called on half the ensemble at a time (``vectorize=True``) under
    ``no_grad``; the sampler is invariant to affine maps of the parameters, so badly scaled
    posteriors need no preconditioning.  Needs ``P >= 2 d`` walkers.  With constraints the
    target is ``log p(x) - mu/2 |c(x)|^2`` with ``mu`` fixed at ``lagrangian.mu`` (no
    multipliers, no growth): the samples then satisfy the constraints only to the penalty's
    width ``1 / (sqrt(mu) |dc/dx|)``.
    """

    def __init__(self, move: str = 'stretch', thin: int = 1, samples_per_walker: int = 1,
                 seed: Optional[int] = None) -> None:
        """
        Configure the sampler.

        :param move: ``'stretch'`` (Goodman & Weare) or ``'de'`` (differential evolution).
        :param thin: keep every ``thin``-th ensemble state.
        :param samples_per_walker: number ``k`` of the last thinned states returned; the
            result then holds ``k P`` particles, newest last.
        :param seed: seed of the sampler's own ``numpy`` random state (``None``: fresh).
        """
        if move not in _MOVES:
            valid = ', '.join(repr(n) for n in _MOVES)
            raise ValueError(f'unknown emcee move {move!r}; valid names: {valid}')
        if thin < 1 or samples_per_walker < 1:
            raise ValueError(f'emcee: thin and samples_per_walker must be >= 1, got {thin}, '
                             f'{samples_per_walker}')
        try:
            import emcee
        except ImportError as error:
            raise ImportError("the 'emcee' method needs the emcee package "
                              '(requirements.txt pins it)') from error
        self._emcee = emcee
        self.move, self.thin, self.samples_per_walker = move, thin, samples_per_walker
        self.seed = seed

    def run(self, log_prob_fn: LogProbFn, initial: Tensor, steps: int,
            constraint_fn: Optional[ConstraintFn] = None,
            lagrangian: Optional[AugmentedLagrangian] = None,
            callback: Optional[Callback] = None) -> InferenceResult:
        """
        Run ``steps`` ensemble updates from the initial walkers.

        :param log_prob_fn: ``x (N, d) -> log p(x) (N,)``.
        :param initial: initial walkers ``(P, d)``, ``P >= 2 d``, linearly independent.
        :param steps: number of ensemble updates.
        :param constraint_fn: optional ``x (N, d) -> c(x) (N, m)`` (fixed-``mu`` penalty).
        :param lagrangian: its ``mu`` weights the penalty (``None``: the default ``mu``).
        :param callback: ``callback(step, walkers, record)`` after each update.
        :return: the last ``samples_per_walker`` thinned walker states ``(k P, d)``, zero
            multipliers and ``mu`` with constraints, and the history (``log_prob``,
            ``acceptance`` of the walkers so far, ``violation`` with constraints).
        """
        _check_particles(initial)
        _check_steps(steps)
        P, d = initial.shape
        if P < 2 * d:
            raise ShapeError(f'initial: emcee needs at least 2 d = {2 * d} walkers, got {P}')
        like = initial.detach()
        mu = (lagrangian or AugmentedLagrangian()).mu
        violations: List[float] = []

        def target(coords: np.ndarray) -> np.ndarray:
            x = torch.as_tensor(coords, dtype=like.dtype, device=like.device)
            with torch.no_grad():
                log_p = _log_prob(log_prob_fn, x)
                if constraint_fn is not None:
                    c = _constraints(constraint_fn, x)
                    log_p = log_p - 0.5 * mu * c.square().sum(-1)
                    violations.append(float(c.abs().max()) if c.numel() else 0.0)
            return np.nan_to_num(log_p.cpu().double().numpy(), nan=-np.inf)

        moves = self._emcee.moves
        move = moves.StretchMove() if self.move == 'stretch' else moves.DEMove()
        sampler = self._emcee.EnsembleSampler(P, d, target, moves=move, vectorize=True)
        state = self._emcee.State(like.cpu().double().numpy().copy(),
                                  random_state=np.random.RandomState(self.seed).get_state())
        kept: List[Tensor] = [like.clone()]
        history: List[Dict[str, float]] = []
        previous, accepted = state.coords.copy(), np.zeros(P)
        for step, state in enumerate(sampler.sample(state, iterations=steps, store=False)):
            # emcee updates state.coords in place: copy
            walkers = torch.tensor(state.coords, dtype=like.dtype, device=like.device)
            if (step + 1) % self.thin == 0 or step == steps - 1:
                kept = (kept + [walkers])[-self.samples_per_walker:]
            # store=False keeps emcee's own acceptance counters at zero: count moves here
            accepted += np.any(state.coords != previous, axis=-1)
            previous = state.coords.copy()
            record = {'log_prob': float(np.mean(state.log_prob)),
                      'acceptance': float(np.mean(accepted) / (step + 1))}
            if constraint_fn is not None:
                record['violation'] = max(violations[-2:]) if violations else 0.0
            history.append(record)
            if callback is not None:
                callback(step, walkers, record)
        particles = torch.cat(kept[-self.samples_per_walker:])
        if constraint_fn is None:
            return SVGDResult(particles, None, None, history)
        m = _constraints(constraint_fn, like[:1]).shape[1]
        return SVGDResult(particles, like.new_zeros(particles.shape[0], m), mu, history)


#: Registry of the inference methods by name.
INFERENCE_METHODS: Dict[str, Type[Any]] = {
    'cem': CEM, 'csvgd': CSVGD, 'emcee': Emcee, 'sgld': SGLD, 'svgd': SVGD,
}


def names() -> Tuple[str, ...]:
    """
    Return the registered inference method names.

    :return: sorted names.
    """
    return tuple(sorted(INFERENCE_METHODS))


def make_inference(name: str, **options: Any) -> Inference:
    """
    Inference method by registry name.

    :param name: ``'cem'``, ``'csvgd'``, ``'emcee'``, ``'sgld'`` or ``'svgd'``.
    :param options: constructor options of the method's class (e.g. ``lr``, ``seed``).
    :return: an object with ``run(log_prob_fn, initial, steps, constraint_fn, lagrangian,
        callback)``.
    """
    try:
        cls = INFERENCE_METHODS[name]
    except (KeyError, TypeError):
        valid = ', '.join(repr(n) for n in names())
        raise ValueError(f'unknown inference method {name!r}; valid names: {valid}') from None
    accepted = [p for p in inspect.signature(cls.__init__).parameters if p != 'self']
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(f'unknown options {unknown} for inference method {name!r}; valid '
                         f'options: {", ".join(accepted)}')
    return cls(**options)
