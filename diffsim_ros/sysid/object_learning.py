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

__all__ = ['METHODS', 'fit_object', 'smooth_for_learning']

#: Method name -> ``fit(spec, train, validation, dt, seed=..., steps=..., perturb=...,
#: regime=...)``.
METHODS: Dict[str, Callable[..., ObjectFit]] = {
    'ccn': fit_ccn,
    'ccn-r': fit_ccn_r,
    'diffsim': fit_diffsim,
    'diffsim-r': fit_diffsim_r,
    'mlp': fit_mlp,
}


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
               regime: str = 'real') -> ObjectFit:
    """
    Learn an object with one of :data:`METHODS`.

    The training and validation tosses are first smoothed with the spec's
    ``smooth_window`` (:func:`smooth_for_learning`; 1, the default, leaves them as
    recorded), the same for every method.

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
    :return: the learned object.
    :raises ValueError: for an unknown method or regime, or no training trajectory.
    """
    if method not in METHODS:
        raise ValueError(f'unknown method {method!r}; valid: {", ".join(METHODS)}')
    regime_weights(regime)
    if not len(train[0]):
        raise ValueError('no training trajectory')
    train = smooth_for_learning(spec, train, dt)
    validation = smooth_for_learning(spec, validation, dt)
    return METHODS[method](spec, train, validation, dt, seed=seed, steps=steps,
                           perturb=perturb, regime=regime)
