"""
Consistency metrics between sets of trajectories (CSVGD appendix 1.4).

- :func:`knn_kl_divergence`: the k-nearest-neighbour estimator of ``KL(P || Q)`` of Wang,
  Kulkarni and Verdu (IEEE Trans. Inf. Theory 55(5), 2009) on trajectories flattened to
  vectors; call it with swapped arguments for the other direction. Heiden et al. (ICRA 2022)
  use ``k = 3``.
- :func:`mmd`: the unbiased estimator of the squared maximum mean discrepancy (Gretton et al.,
  JMLR 2012) with an RBF kernel whose bandwidth defaults to the median heuristic.
- :func:`heldout_log_likelihood`: log-likelihood of held-out trajectories under the
  equal-weight mixture of the particles' simulated trajectories.
"""

import math
from typing import Optional, Union

import torch

from .likelihoods import gaussian_log_likelihood
from ..core.errors import ShapeError

Tensor = torch.Tensor

#: Kernels accepted by :func:`mmd`.
KERNELS = ('rbf',)


def _flatten(name: str, samples: Tensor, scale: Optional[Tensor]) -> Tensor:
    if samples.dim() < 2:
        raise ShapeError(f'{name}: expected shape (n, ...), got {tuple(samples.shape)}')
    if scale is not None:
        samples = samples / scale
    return samples.reshape(samples.shape[0], -1)


def knn_kl_divergence(X: Tensor, Y: Tensor, k: int = 3,
                      scale: Optional[Tensor] = None) -> Tensor:
    """
    Estimate ``KL(p_X || p_Y)`` from samples with the k-NN estimator of Wang et al. (2009).

    ``D / n sum_i log(nu_k(i) / rho_k(i)) + log(m / (n - 1))``, where ``rho_k(i)`` is the
    distance from ``X_i`` to its k-th nearest neighbour among the other ``X`` and ``nu_k(i)``
    to its k-th nearest neighbour in ``Y``.

    :param X: samples ``(n, ...)`` of the first distribution (e.g. trajectories ``(n, T, s)``),
        flattened to ``(n, D)``.
    :param Y: samples ``(m, ...)`` of the second distribution, same trailing shape.
    :param k: neighbour order (``k < n`` and ``k <= m``).
    :param scale: optional feature scaling broadcasting against one sample (e.g. ``(s,)`` per
        state coordinate); samples are divided by it before the distances.
    :return: scalar estimate in nats (may be slightly negative for equal distributions).
    """
    x = _flatten('X', X, scale)
    y = _flatten('Y', Y, scale).to(x.dtype)
    n, D = x.shape
    m = y.shape[0]
    if y.shape[1] != D:
        raise ShapeError(f'Y: expected {D} features per sample like X, got {y.shape[1]}')
    if not 1 <= k < n or k > m:
        raise ValueError(f'k must satisfy 1 <= k < n = {n} and k <= m = {m}, got {k}')
    d_xx = torch.cdist(x, x)
    d_xx.fill_diagonal_(math.inf)
    rho = d_xx.kthvalue(k, dim=1).values
    nu = torch.cdist(x, y).kthvalue(k, dim=1).values
    tiny = torch.finfo(x.dtype).tiny
    log_ratio = torch.log(nu.clamp(min=tiny)) - torch.log(rho.clamp(min=tiny))
    return D * log_ratio.mean() + math.log(m / (n - 1))


def median_bandwidth(X: Tensor, Y: Tensor) -> Tensor:
    """
    Return the median heuristic bandwidth: the median pairwise distance of the pooled samples.

    :param X: ``(n, D)`` samples.
    :param Y: ``(m, D)`` samples.
    :return: scalar bandwidth (distance units of the features).
    """
    z = torch.cat((X, Y), dim=0)
    dist = torch.cdist(z, z)
    i, j = torch.triu_indices(z.shape[0], z.shape[0], offset=1, device=z.device)
    return dist[i, j].median()


def mmd(X: Tensor, Y: Tensor, kernel: str = 'rbf',
        bandwidth: Union[str, float, Tensor] = 'median',
        scale: Optional[Tensor] = None) -> Tensor:
    """
    Return the unbiased estimate of the squared MMD between two sample sets.

    ``1/(n(n-1)) sum_{i!=j} k(x_i, x_j) + 1/(m(m-1)) sum_{i!=j} k(y_i, y_j)
    - 2/(nm) sum_{i,j} k(x_i, y_j)`` with ``k(a, b) = exp(-|a - b|^2 / (2 h^2))``.

    :param X: samples ``(n, ...)``, flattened to ``(n, D)``; ``n >= 2``.
    :param Y: samples ``(m, ...)`` with the same trailing shape; ``m >= 2``.
    :param kernel: ``'rbf'``.
    :param bandwidth: ``h`` or ``'median'`` (median pairwise distance of the pooled samples).
    :param scale: optional feature scaling, as in :func:`knn_kl_divergence`.
    :return: scalar (can be slightly negative when the distributions are equal).
    """
    if kernel not in KERNELS:
        raise ValueError(f'unknown kernel {kernel!r}; valid: {", ".join(KERNELS)}')
    x = _flatten('X', X, scale)
    y = _flatten('Y', Y, scale).to(x.dtype)
    n, m = x.shape[0], y.shape[0]
    if n < 2 or m < 2 or x.shape[1] != y.shape[1]:
        raise ShapeError(f'X, Y: expected (n >= 2, D) and (m >= 2, D), got {tuple(x.shape)} '
                         f'and {tuple(y.shape)}')
    if isinstance(bandwidth, str):
        if bandwidth != 'median':
            raise ValueError(f"unknown bandwidth rule {bandwidth!r}; valid: 'median'")
        h = median_bandwidth(x, y)
    else:
        h = torch.as_tensor(bandwidth, dtype=x.dtype, device=x.device)

    def gram(a: Tensor, b: Tensor) -> Tensor:
        return torch.exp(-torch.cdist(a, b).square() / (2.0 * h * h))

    k_xx, k_yy = gram(x, x), gram(y, y)
    term_xx = (k_xx.sum() - k_xx.diagonal().sum()) / (n * (n - 1))
    term_yy = (k_yy.sum() - k_yy.diagonal().sum()) / (m * (m - 1))
    return term_xx + term_yy - 2.0 * gram(x, y).mean()


def heldout_log_likelihood(simulated: Tensor, heldout: Tensor,
                           sigma: Union[float, Tensor], skip_initial: bool = True) -> Tensor:
    """
    Return the log-likelihood of held-out trajectories under the particles' predictions.

    Each held-out trajectory is scored under the equal-weight mixture of diagonal Gaussians
    centred on the ``P`` simulated trajectories: ``log(1/P sum_p N(heldout | sim_p, sigma))``.

    :param simulated: particle simulations ``(P, T + 1, s)`` shared by all held-out
        trajectories, or ``(R, P, T + 1, s)`` simulated from each held-out trajectory's own
        start and commands (e.g. :meth:`SingleShooting.simulate`).
    :param heldout: held-out states ``(R, T + 1, s)``.
    :param sigma: observation standard deviation, scalar or ``(s,)``, in state units.
    :param skip_initial: leave out the first state (given, not predicted).
    :return: ``(R,)`` log-likelihoods.
    """
    if heldout.dim() != 3:
        raise ShapeError(f'heldout: expected shape (R, T + 1, s), got {tuple(heldout.shape)}')
    if simulated.dim() == 3:
        simulated = simulated.unsqueeze(0)
    if simulated.dim() != 4 or simulated.shape[-2:] != heldout.shape[-2:]:
        raise ShapeError(f'simulated: expected shape ([R,] P, {heldout.shape[1]}, '
                         f'{heldout.shape[2]}), got {tuple(simulated.shape)}')
    start = 1 if skip_initial else 0
    sigma = torch.as_tensor(sigma, dtype=heldout.dtype, device=heldout.device)
    ll = gaussian_log_likelihood(simulated[..., start:, :], heldout[:, None, start:], sigma)
    return torch.logsumexp(ll, dim=-1) - math.log(simulated.shape[-3])
