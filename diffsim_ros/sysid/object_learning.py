"""
Learning a tossed object's contact, inertia and continuous dynamics: one entry for every method.

Every method takes an :class:`~diffsim_ros.sysid.contact_learning.ObjectSpec` (the nominal
object), training and validation trajectories and a seed, and returns an
:class:`~diffsim_ros.sysid.contact_learning.ObjectFit` that predicts (``predict``) and says
what it learned (``summary``). The command line, the benchmarks and the identifier node go
through :func:`fit_object`, so a method added to :data:`METHODS` reaches all of them.
"""

from typing import Callable, Dict, Tuple

from .contact_baselines import fit_diffsim, fit_diffsim_r, fit_mlp
from .contact_learning import (fit_ccn, fit_ccn_r, ObjectFit, ObjectSpec, regime_weights,
                               Trajectories)
from .pose_smoothing import impact_samples, smooth_trajectories

__all__ = ['METHODS', 'fit_object', 'smooth_for_learning', 'RESTART_SEED_STRIDE']

#: Method name -> ``fit(spec, train, validation, dt, seed=..., steps=..., perturb=...,
#: regime=...)``.
METHODS: Dict[str, Callable[..., ObjectFit]] = {
    'ccn': fit_ccn,
    'ccn-r': fit_ccn_r,
    'diffsim': fit_diffsim,
    'diffsim-r': fit_diffsim_r,
    'mlp': fit_mlp,
}


#: Seed offset between the starts of :func:`fit_object`'s restarts: start ``r`` of seed ``s``
#: is drawn with seed ``s + RESTART_SEED_STRIDE * r`` (start 0 is seed ``s`` itself), apart
#: from the seeds a benchmark runs (0 .. K-1).
RESTART_SEED_STRIDE = 1000


def smooth_for_learning(spec: ObjectSpec, trajectories: Trajectories,
                        dt: float) -> Tuple[list, list]:
    """
    Return trajectories smoothed as the spec says every method learns from them.

    Local polynomial fits over ``spec.smooth_window`` samples; where ``spec.impact_jump`` is
    set, no window spans an impact found in the recorded poses with the spec's nominal
    geometry (:func:`~diffsim_ros.sysid.pose_smoothing.impact_samples`).

    :param spec: the nominal object.
    :param trajectories: ``(q list, v list)`` as recorded.
    :param dt: sample period [s].
    :return: ``(q list, v list)`` smoothed.
    """
    breaks = None
    if spec.impact_jump is not None and spec.smooth_window > 1:
        breaks = [impact_samples(spec.model, spec.contact, q, dt, spec.impact_jump)
                  for q in trajectories[0]]
    return smooth_trajectories(trajectories, dt, spec.smooth_window, breaks=breaks)


def fit_object(spec: ObjectSpec, method: str, train: Trajectories, validation: Trajectories,
               dt: float, seed: int = 0, steps: int = 400, perturb: bool = True,
               regime: str = 'real', restarts: int = 1) -> ObjectFit:
    """
    Learn an object with one of :data:`METHODS`.

    The training and validation tosses are first smoothed with the spec's
    ``smooth_window`` (:func:`smooth_for_learning`; 1, the default, leaves them as
    recorded), the same for every method. With ``restarts`` K > 1 the method is fitted from
    K starts (seeds ``seed + RESTART_SEED_STRIDE * r``, :data:`RESTART_SEED_STRIDE`) and the
    fit with the lowest validation loss (the least of its history's ``validation``, the
    method's own loss on the validation tosses) is returned: a guard against a start that
    ends in a poor local optimum, at K times the cost. Its ``extra['restarts']`` lists every
    start's ``seed`` and ``validation_loss``.

    :param spec: the nominal object.
    :param method: a key of :data:`METHODS`.
    :param train: training trajectories ``(q list, v list)``.
    :param validation: held-out trajectories for early stopping.
    :param dt: sample period [s].
    :param seed: seed of the initialisation and of the method's randomness.
    :param steps: maximum optimiser steps.
    :param perturb: start 0.5-1.5x the spec (the paper's protocol) instead of at it.
    :param regime: Table 2's weights for real data (``'real'``, the default) or simulated
        data (``'sim'``): the residual methods' regularisation (``contact_learning.REGIMES``).
    :param restarts: starts to fit, keeping the lowest validation loss (1: ``seed`` alone).
    :return: the learned object.
    :raises ValueError: for an unknown method or regime, no training trajectory, or
        ``restarts`` below 1.
    """
    if method not in METHODS:
        raise ValueError(f'unknown method {method!r}; valid: {", ".join(METHODS)}')
    regime_weights(regime)
    if not len(train[0]):
        raise ValueError('no training trajectory')
    if restarts < 1:
        raise ValueError(f'restarts {restarts}: at least 1')
    train = smooth_for_learning(spec, train, dt)
    validation = smooth_for_learning(spec, validation, dt)
    fits = []
    for r in range(restarts):
        fit = METHODS[method](spec, train, validation, dt,
                              seed=seed + RESTART_SEED_STRIDE * r, steps=steps,
                              perturb=perturb, regime=regime)
        fits.append((min(fit.history['validation']), r, fit))
    if restarts == 1:
        return fits[0][2]
    best = min(fits, key=lambda item: item[:2])[2]
    best.extra['restarts'] = [{'seed': seed + RESTART_SEED_STRIDE * r, 'validation_loss': loss}
                              for loss, r, _ in fits]
    return best
