"""
Choosing runs of a recording and splitting them into training and validation data.

A run selector is a comma-separated list of tokens; a token picks every run whose name
(``qube/chirp/qq_chrip_.../rollout_real_...`` for the shared data sets, see
:mod:`diffsim_ros.io.datasets`) equals it, whose kind (``chirp``, ``swingup``, ``sine``,
...: :func:`~diffsim_ros.io.datasets.run_kind`), group (the third part) or last part equals
it, or, for tokens with ``*``, ``?`` or ``[``, whose name matches it as a shell pattern.

A validation specification is one of

* a fraction in ``[0, 1)`` of the runs (the last ones); a single run is cut into blocks of
  ``block_s`` seconds and that fraction of them, spread over the run, is held out
  (:func:`~diffsim_ros.sysid.preprocess.split_blocks`);
* ``last:F``: the trailing fraction ``F`` of every run (:func:`~diffsim_ros.sysid.
  preprocess.split_time`);
* a run selector: the runs it picks.
"""

import fnmatch
from typing import List, Sequence, Tuple, Union

from .datasets import run_kind
from ..core.errors import DiffsimError
from ..sysid.dataset import Trajectory
from ..sysid.preprocess import split_blocks, split_runs, split_time

__all__ = ['EARLY_STOPPING', 'SelectionError', 'early_stopping_split', 'matches',
           'parse_validation', 'select_runs', 'split']

#: Choices of ``--early-stopping``: which data stop the optimiser.
EARLY_STOPPING = ('validation', 'train', 'none')

#: A parsed validation specification: a fraction, ``('last', F)`` or run names.
Validation = Union[float, Tuple[str, float], List[str]]


class SelectionError(DiffsimError, ValueError):
    """A run selector or validation specification that the data cannot satisfy."""


def _tokens(spec: str) -> List[str]:
    return [token.strip() for token in spec.split(',') if token.strip()]


def matches(token: str, name: str) -> bool:
    """
    Return whether a selector token picks the run called ``name``.

    :param token: one token (see the module docstring).
    :param name: the run name.
    :return: whether it matches.
    """
    if any(c in token for c in '*?['):
        return fnmatch.fnmatchcase(name, token)
    parts = name.split('/')
    group = parts[2] if len(parts) >= 4 else None
    return token in (name, run_kind(name), group, parts[-1])


def _picked(spec: str, names: Sequence[str], what: str) -> List[str]:
    tokens = _tokens(spec)
    if not tokens:
        raise SelectionError(f'{what}: no run names or kinds in {spec!r}')
    unmatched = [t for t in tokens if not any(matches(t, name) for name in names)]
    if unmatched:
        kinds = sorted({run_kind(name) for name in names} - {''})
        shown = ', '.join(names[:8]) + (f' ... ({len(names)} runs)' if len(names) > 8 else '')
        raise SelectionError(f'{what}: nothing matches {", ".join(unmatched)}; runs: {shown}'
                             + (f'; kinds: {", ".join(kinds)}' if kinds else ''))
    return [name for name in names if any(matches(t, name) for t in tokens)]


def select_runs(runs: Sequence[Trajectory], spec: str, what: str = '--runs'
                ) -> List[Trajectory]:
    """
    Keep the runs a selector picks.

    :param runs: the runs.
    :param spec: the selector (see the module docstring).
    :param what: option name for messages.
    :return: the picked runs, in their order.
    :raises SelectionError: a token that picks no run.
    """
    names = list(dict.fromkeys(run.run for run in runs))
    keep = set(_picked(spec, names, what))
    return [run for run in runs if run.run in keep]


def parse_validation(spec: Union[str, float, None], default: float = 0.2) -> Validation:
    """
    Parse a validation specification (see the module docstring).

    :param spec: the text, a fraction, or ``None`` for ``default``.
    :param default: fraction used for ``None``.
    :return: a fraction, ``('last', F)`` or the list of selector tokens.
    :raises SelectionError: a fraction outside ``[0, 1)`` or an empty list.
    """
    if spec is None:
        return default
    text = str(spec).strip()
    if text.startswith('last:'):
        fraction = _fraction(text[5:], spec, open_low=True)
        return 'last', fraction
    try:
        value = float(text)
    except ValueError:
        tokens = _tokens(text)
        if not tokens:
            raise SelectionError(f'--validation: no run names in {spec!r}') from None
        return tokens
    return _fraction(value, spec)


def _fraction(text: Union[str, float], spec: object, open_low: bool = False) -> float:
    try:
        value = float(text)
    except ValueError:
        raise SelectionError(f'--validation {spec}: {text!r} is not a number') from None
    if not (0.0 < value < 1.0 if open_low else 0.0 <= value < 1.0):
        bounds = '(0, 1)' if open_low else '[0, 1)'
        raise SelectionError(f'--validation fraction must lie in {bounds}, got {spec}')
    return value


def split(runs: Sequence[Trajectory], spec: Union[str, float, None], block_s: float = 2.0,
          min_samples: int = 20) -> Tuple[List[Trajectory], List[Trajectory]]:
    """
    Split runs into training and validation sets.

    :param runs: the runs.
    :param spec: the validation specification (``None``: 0.2).
    :param block_s: block length of the split of a single run, s.
    :param min_samples: fewest training samples a split must leave.
    :return: ``(train, validation)``; validation may be empty.
    :raises SelectionError: unknown runs or nothing left for training.
    """
    validation = parse_validation(spec)
    names = list(dict.fromkeys(run.run for run in runs))
    if isinstance(validation, tuple):
        parts = [split_time(run, validation[1]) for run in runs]
        return ([t for part in parts for t in part.train],
                [v for part in parts for v in part.validation])
    if len(names) == 1 and isinstance(validation, list):
        if all(matches(token, names[0]) for token in validation):
            raise SelectionError(f'--validation {spec}: that is the only run; nothing is left '
                                 'for training (give last:F or a fraction to hold out part '
                                 'of it)')
        raise SelectionError(f'--validation {spec}: the data hold a single run '
                             f'({names[0]!r}); give a fraction of it to hold out instead of '
                             'run names')
    if len(names) == 1:
        if validation == 0.0:
            return list(runs), []
        # blocks taken in turn: a swing-up-then-balance recording split at its end would
        # validate on the balance alone and stop the fit early
        parts = [split_blocks(run, validation, block_s) for run in runs]
        if not any(part.validation for part in parts):
            # too short for a held-out block at this fraction: hold out its end
            parts = [split_time(run, validation) for run in runs]
        train = [t for part in parts for t in part.train]
        held = [v for part in parts for v in part.validation]
        if sum(len(run) for run in train) < min_samples:
            raise SelectionError(f'--validation {validation}: too few samples left for '
                                 'training')
        return train, held
    if isinstance(validation, list):
        validation = _picked(','.join(validation), names, '--validation')
    try:
        parts = split_runs(runs, validation=validation)
    except (TypeError, ValueError) as exc:
        raise SelectionError(f'--validation: {" ".join(str(exc).split())}') from None
    return list(parts.train), list(parts.validation)


def early_stopping_split(train: Sequence[Trajectory], validation: Sequence[Trajectory],
                         mode: str) -> Tuple[List[Trajectory], List[Trajectory]]:
    """
    Choose the data the estimator fits and the data that stop it early.

    ``'validation'``: the validation runs stop the fit (they then took part in choosing the
    model); ``'train'``: the last training run (of a single run: its last 20 %) stops it and
    is not fitted, so the validation runs stay unseen, as ``benchmarks/identification.py``
    does; ``'none'``: no early stopping.

    :param train: training runs.
    :param validation: validation runs.
    :param mode: one of :data:`EARLY_STOPPING`.
    :return: ``(runs to fit, runs for early stopping)``.
    :raises SelectionError: an unknown mode.
    """
    if mode not in EARLY_STOPPING:
        raise SelectionError(f'unknown --early-stopping {mode!r}; valid: '
                             f'{", ".join(EARLY_STOPPING)}')
    if mode == 'validation':
        return list(train), list(validation)
    if mode == 'none' or not train:
        return list(train), []
    names = list(dict.fromkeys(run.run for run in train))
    if len(names) > 1:
        return ([run for run in train if run.run != names[-1]],
                [run for run in train if run.run == names[-1]])
    parts = [split_time(run, 0.2) for run in train]
    return ([t for part in parts for t in part.train],
            [v for part in parts for v in part.validation])
