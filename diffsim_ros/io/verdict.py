"""
Whether a fit is better than the catalogue (nominal) model on the held-out data.

Judged on what the model is for: the torque error (what an inverse-dynamics fit optimises)
and the open-loop rollout error at each validation horizon, both on the validation runs
only.  A rollout that diverged loses to one that did not.
"""

from typing import Any, Dict, List, Mapping, Optional, Tuple

__all__ = ['better_than_nominal', 'verdict', 'worse_message', 'worse_rollouts']


#: Ties in NMSE (relative, plus an absolute floor) count as not worse: a fit that recovers
#: the nominal model exactly scores the same up to rounding, and rounding must not decide.
TIE_RELATIVE = 1e-9
TIE_ABSOLUTE = 1e-12


def _not_worse(fitted: float, nominal: float) -> bool:
    return fitted < nominal or fitted <= nominal * (1.0 + TIE_RELATIVE) + TIE_ABSOLUTE


def _rollout_better(fitted: Mapping[str, Any], nominal: Mapping[str, Any]) -> Optional[bool]:
    fitted_diverged = bool(fitted.get('diverged'))
    nominal_diverged = bool(nominal.get('diverged'))
    if fitted_diverged or nominal_diverged:
        return None if fitted_diverged and nominal_diverged else nominal_diverged
    a, b = fitted.get('nmse'), nominal.get('nmse')
    if a is None or b is None:
        return None
    return _not_worse(a, b)


def better_than_nominal(scores: Mapping[str, Any]) -> Dict[str, Optional[bool]]:
    """
    Compare the held-out metrics of the fit with those of the nominal model.

    :param scores: the metrics of :func:`diffsim_ros.io.report.evaluate` (``torque``,
        ``rollout`` and ``nominal`` with the same two).
    :return: ``{'torque': ..., 'rollout_<h>s': ...}``: ``True`` when the fit's validation
        NMSE is lower or ties (within :data:`TIE_RELATIVE`, :data:`TIE_ABSOLUTE`), ``False``
        when it is higher (or only the fit diverged), ``None`` when
        there is nothing to compare (no validation runs, a black box without torques, a
        horizon longer than the runs, or both diverged).
    """
    nominal = scores.get('nominal') or {}
    out: Dict[str, Optional[bool]] = {}
    fitted_torque = ((scores.get('torque') or {}).get('validation') or {}).get('nmse_mean')
    nominal_torque = ((nominal.get('torque') or {}).get('validation') or {}).get('nmse_mean')
    out['torque'] = None if fitted_torque is None or nominal_torque is None else \
        _not_worse(fitted_torque, nominal_torque)
    for key, entry in (scores.get('rollout') or {}).items():
        out[f'rollout_{key}'] = _rollout_better(entry, (nominal.get('rollout') or {})
                                                .get(key, {}))
    return out


def worse_rollouts(better: Mapping[str, Optional[bool]]) -> List[str]:
    """
    Return the rollout horizons at which the fit lost to the nominal model.

    :param better: :func:`better_than_nominal`'s result.
    :return: keys such as ``'1s'``.
    """
    return [key[len('rollout_'):] for key, value in better.items()
            if key.startswith('rollout_') and value is False]


def worse_message(scores: Mapping[str, Any], better: Mapping[str, Optional[bool]]) -> str:
    """
    Describe where the fit is worse than the nominal model on the validation runs.

    :param scores: as for :func:`better_than_nominal`.
    :param better: its result.
    :return: e.g. ``'rollout 1s NMSE 0.8 vs nominal 0.51; torque NMSE ...'``, or ``''``.
    """
    def number(entry: Mapping[str, Any]) -> str:
        if entry.get('diverged'):
            return 'diverged'
        value = entry.get('nmse')
        return '-' if value is None else f'{value:.3g}'

    parts = []
    nominal = scores.get('nominal') or {}
    for key in worse_rollouts(better):
        parts.append(f'rollout {key} NMSE {number(scores["rollout"][key])} vs nominal '
                     f'{number(nominal["rollout"][key])}')
    if better.get('torque') is False:
        parts.append(f'torque NMSE {scores["torque"]["validation"]["nmse_mean"]:.3g} vs '
                     f'nominal {nominal["torque"]["validation"]["nmse_mean"]:.3g}')
    return '; '.join(parts)


def verdict(scores: Mapping[str, Any], better: Mapping[str, Optional[bool]], allow_worse: bool,
            worse_status: int) -> Tuple[Optional[str], bool]:
    """
    Return the warning line of a fit that lost to the nominal model, and whether it lost.

    :param scores: as for :func:`better_than_nominal`.
    :param better: its result.
    :param allow_worse: ``--allow-worse`` (the line says so instead of the exit status).
    :param worse_status: the exit status of a lost rollout comparison.
    :return: ``(line or None, whether a held-out rollout lost)``; worse torques alone give a
        line without losing.
    """
    lost = worse_rollouts(better)
    message = worse_message(scores, better)
    if not message:
        return None, False
    if not lost:
        return f'on the validation runs the fit is worse than the nominal model: {message}', \
            False
    status = 'allowed by --allow-worse' if allow_worse else f'exit status {worse_status}'
    return (f'on the validation runs the fit simulates worse than the nominal model: '
            f'{message} ({status})'), True
