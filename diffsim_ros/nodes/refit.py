"""
One identifier refit, runnable in a child process so that it never holds the node's GIL.

A refit is seconds of torch work in Python.  On the node's own worker thread it holds the
interpreter lock for long stretches, and the executor thread that takes ``joint_states``
starves: ``benchmarks/ros_loop.py`` measured 24-68 % of a 1 kHz stream lost with refits
running, 6 % with refits frozen.  :class:`RefitPool` runs :func:`score_refit` in one spawned
child process (no rclpy there; torch with one thread, at a lower scheduling priority), and
the node's worker thread only waits on the result, which releases the lock.

This module imports no ROS package, so a spawned child imports only torch and the
identification code.
"""

from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
import copyreg
import math
import multiprocessing
import os
from types import MappingProxyType
from typing import Any, Dict, Optional, Sequence

import torch

from ..core import rnea
from ..core.model import RobotModel
from ..sysid.estimators import fit
from ..sysid.losses import (command_joints_for, command_matrix, inverse_dynamics_loss,
                            make_actuator, make_torque_fn, stack_samples, variance_scale)
from ..sysid.result import IdentificationResult

__all__ = ['RefitPool', 'heldout_loss', 'nominal_result', 'score_refit']


def _mapping_proxy(items: dict) -> MappingProxyType:
    return MappingProxyType(items)


def _pickle_mapping_proxy(proxy: MappingProxyType) -> tuple:
    return _mapping_proxy, (dict(proxy),)


# Frozen configs and trajectories hold read-only mappings; the child gets them as such.
copyreg.pickle(MappingProxyType, _pickle_mapping_proxy)


def heldout_loss(result: IdentificationResult, runs, source: str, scale: torch.Tensor) -> float:
    """
    Return a result's normalised inverse-dynamics torque error on held-out runs.

    :param result: a result with a physical model.
    :param runs: trajectories with ``qd``, ``qdd`` and the ``source`` signal.
    :param source: ``'tau'`` or ``'u'``.
    :param scale: ``(n,)`` torque variances shared by every model compared.
    :return: the loss (``inf`` when it is not finite).
    """
    model = result.model
    B = command_matrix(model, result.command_joints or model.joint_names)
    torque_fn = make_torque_fn(model, B, result.actuator, result.friction, result.coulomb_eps)
    with torch.no_grad():
        value = float(inverse_dynamics_loss(model, torque_fn,
                                            stack_samples(runs, model, source, True), scale))
    return value if math.isfinite(value) else math.inf


def nominal_result(nominal: RobotModel, config: Any, source: str) -> IdentificationResult:
    """
    Return the nominal model as a result, with the estimator's actuator for commands.

    :param nominal: the nominal model.
    :param config: the estimator's configuration (``command_joints``, ``actuator``...).
    :param source: ``'tau'`` (efforts are joint torques) or ``'u'`` (commands).
    :return: a result with method ``'nominal'``.
    """
    m = nominal.n if source == 'tau' else len(config.command_joints)
    joints = command_joints_for(nominal, source, m, config.command_joints)
    actuator = make_actuator(config.actuator, m, config.actuator_kwargs, torch.float64) \
        if source == 'u' else None
    return IdentificationResult(method='nominal', model=nominal, actuator=actuator,
                                command_joints=joints, coulomb_eps=config.coulomb_eps)


def score_refit(estimator: str, nominal: RobotModel, config: Any, source: str,
                train: Sequence, validation: Sequence,
                current: Optional[IdentificationResult]) -> Dict[str, Any]:
    """
    Fit a candidate on ``train`` and score it, the current and the nominal model on held out.

    :param estimator: registry name (``'nea'``, ``'diffnea'``, ``'svgd'``).
    :param nominal: the nominal model.
    :param config: the estimator's configuration.
    :param source: ``'tau'`` or ``'u'``.
    :param train: training trajectories.
    :param validation: held-out trajectories.
    :param current: the model in use (warm start), None for the nominal one.
    :return: ``candidate`` (the result) and the held-out losses ``new``, ``old`` (of
        ``current``, or the nominal one) and ``nominal``, all with one torque scale.
    """
    held = stack_samples(validation, nominal, source, True)
    scale = variance_scale(rnea(nominal, held.q, held.qd, held.qdd))
    candidate = fit(estimator, nominal, train, validation, config, warm_start=current)
    nominal_loss = heldout_loss(nominal_result(nominal, config, source), validation, source,
                                scale)
    return {'candidate': candidate,
            'new': heldout_loss(candidate, validation, source, scale),
            'nominal': nominal_loss,
            'old': heldout_loss(current, validation, source, scale) if current is not None
            else nominal_loss}


def _child_setup() -> None:
    """Child process: one torch thread, and yield the CPU to the node's stream."""
    torch.set_num_threads(1)
    try:
        os.nice(5)
    except OSError:
        pass


class RefitPool:
    """A single spawned child process running :func:`score_refit` calls, one at a time."""

    def __init__(self) -> None:
        """Start nothing yet: the child is spawned on the first refit (torch loads there)."""
        self._executor: Optional[ProcessPoolExecutor] = None

    def score(self, *args: Any) -> Dict[str, Any]:
        """
        Run :func:`score_refit` in the child and wait for it.

        :param args: the arguments of :func:`score_refit`.
        :return: its result.
        :raises Exception: whatever the fit raised, or ``BrokenProcessPool`` when the child
            died (the next call starts a new one).
        """
        if self._executor is None:
            self._executor = ProcessPoolExecutor(
                max_workers=1, mp_context=multiprocessing.get_context('spawn'),
                initializer=_child_setup)
        try:
            return self._executor.submit(score_refit, *args).result()
        except BrokenProcessPool:
            self.close()
            raise

    def close(self) -> None:
        """Stop the child (a running fit is abandoned)."""
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
