"""
Open-loop excitation signals for identification experiments, deterministic from a generator.

Every function returns commands ``(steps, m)`` (float64) sampled at ``t_k = k / rate_hz``,
one column per command joint, whose peak over the samples equals ``amplitude`` exactly
(so a signal built from ``fraction * command_limit`` never saturates).  Feed the result to
:meth:`diffsim_ros.sim.MujocoPlant.run`.
"""

import math
from typing import Optional, Sequence, Union

import numpy as np
import torch

__all__ = ['chirp', 'excitation_for', 'EXCITATIONS', 'fourier_series', 'multisine']

Tensor = torch.Tensor
Amplitude = Union[float, Sequence[float], Tensor]


def _grid(steps: int, rate_hz: float, amplitude: Amplitude) -> tuple:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f'steps must be a positive int, got {steps!r}')
    if not (math.isfinite(rate_hz) and rate_hz > 0):
        raise ValueError(f'rate_hz must be > 0, got {rate_hz!r}')
    peak = torch.as_tensor(amplitude, dtype=torch.float64).reshape(-1)
    if not bool(torch.isfinite(peak).all()) or bool((peak < 0).any()):
        raise ValueError(f'amplitude must be finite and >= 0, got {amplitude!r}')
    t = torch.arange(steps, dtype=torch.float64) / rate_hz
    return t, peak


def _normalise(u: Tensor, peak: Tensor) -> Tensor:
    scale = u.abs().amax(0).clamp_min(1e-300)
    return u / scale * peak


def _generator(generator: Optional[torch.Generator]) -> torch.Generator:
    return torch.Generator().manual_seed(0) if generator is None else generator


def multisine(steps: int, rate_hz: float, amplitude: Amplitude,
              band: Sequence[float] = (0.1, 2.0), n_sines: int = 8,
              generator: Optional[torch.Generator] = None) -> Tensor:
    """
    Sum of ``n_sines`` equal-amplitude sines, log-spaced over ``band``, random phases.

    :param steps: number of samples.
    :param rate_hz: sample (driver) rate, Hz.
    :param amplitude: peak per channel (scalar or ``(m,)``), in command units.
    :param band: ``(f_min, f_max)`` in Hz.
    :param n_sines: number of sines per channel.
    :param generator: phases source (default seeded with 0).
    :return: ``(steps, m)``.
    """
    t, peak = _grid(steps, rate_hz, amplitude)
    f_min, f_max = float(band[0]), float(band[1])
    if not (0 < f_min <= f_max) or n_sines < 1:
        raise ValueError(f'need 0 < band[0] <= band[1] and n_sines >= 1, got {band}, {n_sines}')
    freqs = torch.logspace(math.log10(f_min), math.log10(f_max), n_sines, dtype=torch.float64)
    phase = 2 * math.pi * torch.rand(peak.numel(), n_sines, generator=_generator(generator),
                                     dtype=torch.float64)
    u = torch.sin(2 * math.pi * freqs * t[:, None, None] + phase).sum(-1)
    return _normalise(u, peak)


def chirp(steps: int, rate_hz: float, amplitude: Amplitude, f0: float = 0.1,
          f1: float = 2.0, generator: Optional[torch.Generator] = None) -> Tensor:
    """
    Linear chirp from ``f0`` to ``f1`` over the run, a random phase per channel.

    :param steps: number of samples.
    :param rate_hz: sample rate, Hz.
    :param amplitude: peak per channel, command units.
    :param f0: start frequency, Hz.
    :param f1: end frequency, Hz.
    :param generator: phase source (default seeded with 0).
    :return: ``(steps, m)``.
    """
    t, peak = _grid(steps, rate_hz, amplitude)
    duration = max(steps / rate_hz, 1e-12)
    phase = 2 * math.pi * torch.rand(peak.numel(), generator=_generator(generator),
                                     dtype=torch.float64)
    angle = 2 * math.pi * (f0 * t + 0.5 * (f1 - f0) * t * t / duration)
    return _normalise(torch.sin(angle[:, None] + phase), peak)


def fourier_series(steps: int, rate_hz: float, amplitude: Amplitude,
                   base_frequency: float = 0.1, harmonics: int = 5,
                   generator: Optional[torch.Generator] = None) -> Tensor:
    """
    Finite Fourier series (Swevers et al. 1997) with random ``1/k``-decaying coefficients.

    ``u(t) = sum_k a_k sin(2 pi k f t) + b_k cos(2 pi k f t) - u(0)``: periodic in
    ``1 / base_frequency`` and starting from zero.

    :param steps: number of samples.
    :param rate_hz: sample rate, Hz.
    :param amplitude: peak per channel, command units.
    :param base_frequency: fundamental ``f``, Hz.
    :param harmonics: number of harmonics ``k = 1..K``.
    :param generator: coefficient source (default seeded with 0).
    :return: ``(steps, m)``.
    """
    t, peak = _grid(steps, rate_hz, amplitude)
    if not base_frequency > 0 or harmonics < 1:
        raise ValueError(f'need base_frequency > 0 and harmonics >= 1, got {base_frequency}, '
                         f'{harmonics}')
    k = torch.arange(1, harmonics + 1, dtype=torch.float64)
    coefficients = torch.randn(2, peak.numel(), harmonics, generator=_generator(generator),
                               dtype=torch.float64) / k
    angle = 2 * math.pi * base_frequency * k * t[:, None, None]
    u = (coefficients[0] * torch.sin(angle) + coefficients[1] * torch.cos(angle)).sum(-1)
    return _normalise(u - u[:1], peak)


#: Excitation functions by name.
EXCITATIONS = {'multisine': multisine, 'chirp': chirp, 'fourier': fourier_series}


def excitation_for(plant, kind: str = 'multisine', duration: float = 10.0,
                   fraction: float = 0.5, generator: Optional[torch.Generator] = None,
                   **kwargs: object) -> Tensor:
    """
    Excitation for a plant's command joints, at its rate, within its command limits.

    :param plant: a :class:`~diffsim_ros.sim.MujocoPlant` (uses ``rate_hz`` and
        ``command_limit``).
    :param kind: ``'multisine'``, ``'chirp'`` or ``'fourier'``.
    :param duration: length, s (``round(duration * rate_hz)`` samples).
    :param fraction: peak as a fraction of the command limit, in (0, 1].
    :param generator: random source (default seeded with 0).
    :param kwargs: extra arguments of the chosen function (``band``, ``f0``, ...).
    :return: ``(steps, m)`` commands in ``plant.command_unit``.
    """
    if kind not in EXCITATIONS:
        raise ValueError(f'unknown excitation {kind!r}; valid: '
                         f'{", ".join(repr(k) for k in EXCITATIONS)}')
    if not (0 < fraction <= 1):
        raise ValueError(f'fraction must be in (0, 1], got {fraction!r}')
    steps = int(round(duration * plant.rate_hz))
    limit = torch.tensor(np.array(plant.command_limit, dtype=np.float64))
    limit = torch.where(torch.isfinite(limit), limit, torch.ones_like(limit))
    return EXCITATIONS[kind](steps, plant.rate_hz, fraction * limit, generator=generator,
                             **kwargs)
