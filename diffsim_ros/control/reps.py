"""
Episodic relative entropy policy search (eREPS) with parameter exploration.

The search distribution is a Gaussian ``pi(theta) = N(mu, Sigma)`` over policy parameters
(parameter exploration: one draw per episode, Rueckstiess et al. 2010).  One update, given
``N`` samples ``theta_i ~ pi`` and their returns ``R_i``:

1. REPS (Peters et al. 2010) asks for the sample distribution ``p`` that maximises
   ``sum_i p_i R_i`` subject to ``KL(p || uniform) <= epsilon``.  Its solution is
   ``p_i ~ exp(R_i / eta)`` with ``eta > 0`` the minimiser of the dual::

       g(eta) = eta epsilon + eta log( (1/N) sum_i exp(R_i / eta) ),

   whose derivative is ``g'(eta) = epsilon - KL(p_eta || uniform)``; ``g`` is convex, so the
   minimiser is the root of ``g'`` (bisection in ``log eta``) or, when even the greedy
   ``eta -> 0`` stays inside the bound, the smallest ``eta`` searched.
2. The weighted maximum-likelihood fit of a Gaussian to the samples with weights ``p``
   (``mu_ml = sum p_i theta_i``, ``Sigma_ml = sum p_i (theta_i - mu_ml)(...)^T`` plus a
   ``min_std^2`` floor on the diagonal).
3. The ML update can leave the sampled region (few samples, many dimensions), so it is
   bounded too (the KL-bounded ML step of Abdolmaleki et al. 2015): the new Gaussian is
   ``N(mu + a (mu_ml - mu), Sigma + a (Sigma_ml - Sigma))`` with the largest ``a`` in
   ``[0, 1]`` whose ``KL(new || old) <= kl_bound``.  That KL is convex in ``a`` and zero at
   ``a = 0``, hence non-decreasing, and bisection finds ``a``.

Everything carries leading batch dims: ``S`` independent searches (seeds) update in one call.

References: J. Peters, K. Muelling, Y. Altun, "Relative Entropy Policy Search", AAAI 2010;
A. Abdolmaleki et al., "Model-Based Relative Entropy Stochastic Search", NeurIPS 2015;
T. Rueckstiess et al., "Exploring parameter space in reinforcement learning", 2010.
"""

from dataclasses import dataclass
import math
from typing import Optional, Tuple

import torch

Tensor = torch.Tensor

__all__ = ['Gaussian', 'REPSStep', 'gaussian_kl', 'reps_dual', 'reps_update', 'reps_weights']


@dataclass(frozen=True)
class Gaussian:
    """
    A batch of Gaussians over parameter vectors.

    :param mean: ``(..., d)``.
    :param cov: ``(..., d, d)``, symmetric positive definite.
    """

    mean: Tensor
    cov: Tensor

    @classmethod
    def isotropic(cls, mean: Tensor, std: float) -> 'Gaussian':
        """
        Return ``N(mean, std^2 I)``.

        :param mean: ``(..., d)``.
        :param std: standard deviation, > 0.
        :return: the Gaussian.
        """
        d = mean.shape[-1]
        eye = torch.eye(d, dtype=mean.dtype, device=mean.device)
        return cls(mean, (std ** 2 * eye).expand(mean.shape[:-1] + (d, d)).clone())

    def sample(self, n: int, generator: Optional[torch.Generator] = None) -> Tensor:
        """
        Draw ``n`` samples per Gaussian.

        :param n: samples.
        :param generator: local random generator.
        :return: ``(..., n, d)``.
        """
        L = torch.linalg.cholesky(self.cov)
        eps = torch.randn(self.mean.shape[:-1] + (n, self.mean.shape[-1]),
                          dtype=self.mean.dtype, device=self.mean.device, generator=generator)
        return self.mean[..., None, :] + eps @ L.transpose(-1, -2)


def gaussian_kl(p: Gaussian, q: Gaussian) -> Tensor:
    """
    Return ``KL(p || q)`` of Gaussians, batched.

    :param p: first Gaussian ``(..., d)``.
    :param q: second Gaussian, broadcastable.
    :return: ``(...)`` nats.
    """
    d = p.mean.shape[-1]
    Lq = torch.linalg.cholesky(q.cov)
    diff = (p.mean - q.mean)[..., None]
    maha = torch.cholesky_solve(diff, Lq)
    trace = torch.cholesky_solve(p.cov, Lq).diagonal(dim1=-2, dim2=-1).sum(-1)
    logdet_q = 2.0 * torch.log(Lq.diagonal(dim1=-2, dim2=-1)).sum(-1)
    logdet_p = torch.linalg.slogdet(p.cov)[1]
    return 0.5 * (trace + (diff * maha).sum((-1, -2)) - d + logdet_q - logdet_p)


def reps_dual(eta: Tensor, returns: Tensor, epsilon: float) -> Tensor:
    """
    Return the REPS dual ``g(eta)`` of the module docstring.

    :param eta: temperatures ``(...)`` > 0.
    :param returns: ``(..., N)``.
    :param epsilon: KL bound, nats.
    :return: ``(...)``.
    """
    scaled = returns / eta[..., None]
    n = returns.shape[-1]
    return eta * (epsilon + torch.logsumexp(scaled, -1) - math.log(n))


def _kl_to_uniform(eta: Tensor, returns: Tensor) -> Tensor:
    logp = torch.log_softmax(returns / eta[..., None], -1)
    return (logp.exp() * (logp + math.log(returns.shape[-1]))).sum(-1)


def reps_weights(returns: Tensor, epsilon: float, iterations: int = 80) -> Tuple[Tensor, Tensor]:
    """
    Return the REPS sample weights and the temperature that minimises the dual.

    :param returns: ``(..., N)``, finite.
    :param epsilon: KL bound ``KL(p || uniform) <= epsilon``, nats (> 0).
    :param iterations: bisection steps in ``log eta``.
    :return: ``(p (..., N) summing to 1, eta (...))``.
    :raises ValueError: ``epsilon <= 0`` or non-finite returns.
    """
    if not epsilon > 0:
        raise ValueError(f'epsilon must be > 0, got {epsilon}')
    if not bool(torch.isfinite(returns).all()):
        raise ValueError('REPS needs finite returns')
    spread = (returns.amax(-1) - returns.amin(-1)).clamp_min(1e-12)
    # KL(p_eta || uniform) falls from log N (eta -> 0) to 0 (eta -> inf); at eta = spread
    # * 1e-6 it is as good as greedy and at spread * 1e6 as good as uniform.
    lo, hi = torch.log(spread * 1e-6), torch.log(spread * 1e6)
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        inside = _kl_to_uniform(mid.exp(), returns) <= epsilon
        hi = torch.where(inside, mid, hi)
        lo = torch.where(inside, lo, mid)
    eta = hi.exp()
    return torch.softmax(returns / eta[..., None], -1), eta


@dataclass(frozen=True)
class REPSStep:
    """
    What one update did.

    :param distribution: the new search distribution.
    :param eta: REPS temperature ``(...)``.
    :param kl_samples: ``KL(p || uniform)`` of the sample weights ``(...)``.
    :param kl_update: ``KL(new || old)`` ``(...)``.
    :param step: the ML interpolation factor ``a`` in ``[0, 1]`` ``(...)``.
    """

    distribution: Gaussian
    eta: Tensor
    kl_samples: Tensor
    kl_update: Tensor
    step: Tensor


def reps_update(distribution: Gaussian, samples: Tensor, returns: Tensor, epsilon: float,
                kl_bound: float, min_std: float = 0.0, iterations: int = 40) -> REPSStep:
    """
    Return the eREPS update of a Gaussian search distribution (module docstring).

    :param distribution: current ``N(mu, Sigma)`` ``(..., d)``.
    :param samples: ``(..., N, d)`` drawn from it.
    :param returns: ``(..., N)`` their returns (higher is better).
    :param epsilon: REPS bound on ``KL(p || uniform)``, nats.
    :param kl_bound: bound on ``KL(new || old)`` of the ML update, nats (> 0).
    :param min_std: floor added (squared) to the ML covariance's diagonal.
    :param iterations: bisection steps of the ML step length.
    :return: the new distribution and diagnostics.
    :raises ValueError: ``kl_bound <= 0``.
    """
    if not kl_bound > 0:
        raise ValueError(f'kl_bound must be > 0, got {kl_bound}')
    p, eta = reps_weights(returns, epsilon)
    mean_ml = (p[..., None] * samples).sum(-2)
    centred = samples - mean_ml[..., None, :]
    cov_ml = (p[..., None, None] * centred[..., :, None] * centred[..., None, :]).sum(-3)
    d = samples.shape[-1]
    eye = torch.eye(d, dtype=samples.dtype, device=samples.device)
    cov_ml = 0.5 * (cov_ml + cov_ml.transpose(-1, -2)) + (min_std ** 2 + 1e-12) * eye

    def blend(a: Tensor) -> Gaussian:
        return Gaussian(distribution.mean + a[..., None] * (mean_ml - distribution.mean),
                        distribution.cov + a[..., None, None] * (cov_ml - distribution.cov))

    lo = torch.zeros_like(eta)
    hi = torch.ones_like(eta)
    full_ok = gaussian_kl(blend(hi), distribution) <= kl_bound
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        ok = gaussian_kl(blend(mid), distribution) <= kl_bound
        lo = torch.where(ok, mid, lo)
        hi = torch.where(ok, hi, mid)
    step = torch.where(full_ok, torch.ones_like(lo), lo)
    new = blend(step)
    kl_samples = _kl_to_uniform(eta, returns)
    return REPSStep(distribution=new, eta=eta, kl_samples=kl_samples,
                    kl_update=gaussian_kl(new, distribution), step=step)
