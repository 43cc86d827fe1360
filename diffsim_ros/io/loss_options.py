"""
``diffsim-fit --loss inverse|forward|multistep --horizon S`` on an estimator's config.

* ``inverse``: inverse-dynamics torque error (every stage of the schedule; NEA is always
  this loss);
* ``forward``: one-step forward (acceleration) error;
* ``multistep``: rollout error over shooting windows of ``--horizon`` seconds from measured
  states, integrated like the model is used (the config's integrator).  A DiffNEA schedule
  without a rollout stage becomes its stages on the inverse-dynamics loss (the warm start)
  followed by one rollout stage with the budget of its last stage; a schedule that already
  refines with rollouts keeps its stages (``--horizon`` sets their window length).

Without ``--loss`` the estimator's own defaults stand (``--horizon`` then sets the window of
the rollout stages it has).  The early-stopping objective on the validation runs is the
chosen loss.
"""

import dataclasses
from typing import Any, Optional

__all__ = ['LOSS_CHOICES', 'LOSS_NAMES', 'apply_loss', 'horizon_steps']

#: ``--loss`` name -> the estimators' loss name.
LOSS_NAMES = {'inverse': 'inverse_dynamics', 'forward': 'forward', 'multistep': 'rollout'}
#: Choices of ``--loss``.
LOSS_CHOICES = tuple(LOSS_NAMES)


def horizon_steps(horizon_s: float, dt: float, shortest: int) -> int:
    """
    Return a rollout horizon in samples.

    :param horizon_s: horizon, s (> 0).
    :param dt: sample interval of the training runs, s.
    :param shortest: samples in the shortest training run.
    :return: ``max(1, round(horizon_s / dt))``.
    :raises ValueError: a horizon no training run is long enough for.
    """
    steps = max(1, int(round(horizon_s / dt)))
    if steps >= shortest:
        raise ValueError(f'--horizon {horizon_s:g} s is {steps} samples at {1 / dt:.4g} Hz, '
                         f'not shorter than the shortest training run ({shortest} samples)')
    return steps


def apply_loss(method: str, config: Any, loss: Optional[str], steps: Optional[int]) -> Any:
    """
    Return the config with ``--loss`` / ``--horizon`` applied (see the module docstring).

    :param method: estimator name.
    :param config: its validated, frozen config.
    :param loss: a :data:`LOSS_CHOICES` name or ``None`` (the estimator's default).
    :param steps: rollout horizon in samples or ``None`` (the config's).
    :return: the new config (the same object when nothing applies).
    :raises ValueError: a loss or horizon the method cannot take.
    """
    if loss is None and steps is None:
        return config
    if method == 'nea':
        if loss == 'inverse' and steps is None:
            return config
        raise ValueError(f'--loss {loss or "(default)"} / --horizon: nea is least squares on '
                         'the inverse-dynamics loss only; use --method diffnea')
    if not hasattr(config, 'loss') or not hasattr(config, 'horizon'):
        raise ValueError(f'--loss / --horizon: method {method} has no selectable loss')
    if loss is not None and loss != 'multistep' and steps is not None:
        raise ValueError(f'--horizon applies to --loss multistep, not --loss {loss}')
    target = LOSS_NAMES[loss] if loss is not None else None
    if method != 'diffnea':
        changes = {'loss': target or config.loss, 'horizon': steps or config.horizon}
        try:
            return dataclasses.replace(config, **changes)
        except ValueError as exc:
            raise ValueError(f'--loss {loss}: {exc}') from None
    return _diffnea(config, target, steps)


def _diffnea(config: Any, target: Optional[str], steps: Optional[int]) -> Any:
    schedule = config.schedule()
    has_rollout = any(stage.loss == 'rollout' for stage in schedule)
    horizon = steps or config.horizon
    if target is None:
        if not has_rollout:
            raise ValueError('--horizon sets the multi-step (rollout) window, but the fit has '
                             'no rollout stage: add --loss multistep')
        stages = tuple(dataclasses.replace(s, horizon=horizon) if s.loss == 'rollout' else s
                       for s in schedule)
        return dataclasses.replace(config, stages=stages,
                                   horizon=horizon if config.loss == 'rollout'
                                   else config.horizon)
    if target != 'rollout':
        stages = tuple(dataclasses.replace(s, loss=target) for s in schedule)
        return dataclasses.replace(config, loss=target, stages=stages)
    if has_rollout:
        stages = tuple(dataclasses.replace(s, horizon=horizon) if s.loss == 'rollout' else s
                       for s in schedule)
    else:
        warm = tuple(dataclasses.replace(s, loss='inverse_dynamics') for s in schedule)
        last = schedule[-1]
        stages = warm + (dataclasses.replace(last, loss='rollout', horizon=horizon),)
    return dataclasses.replace(config, loss='rollout', horizon=horizon, stages=stages)
