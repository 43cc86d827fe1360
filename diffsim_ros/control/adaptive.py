"""
Adaptive MPC: control with the current model, refit it while controlling, swap it in.

The loop of Algorithm 1 of IDS (identify while controlling), run by the one online
identification engine, :class:`~diffsim_ros.sysid.online.OnlineEngine`, that the identifier
node runs on the robot: what ``diffsim-sim-eval --controller adaptive-mpc`` measures is the
loop of the ROS graph.  Every step the wrapped controller acts on the newest accepted model;
:meth:`AdaptiveMPC.observe` puts the measured state and the applied command into the
engine's window (``buffer_size`` states); every ``refit_every`` observed steps (once
``min_samples`` are there) the engine refits: derivatives from the measured velocities,
stretches near a joint limit left out, informative older cells kept
(:class:`~diffsim_ros.sysid.memory.SegmentMemory`: without them the refits during a balance
accepted models thousands of percent off on the Qube), data whose commands the driver model
cannot explain refused, and a candidate accepted only if its ``prediction_steps``-step
open-loop prediction of the held-out newest data beats the model in use by
``accept_margin``.  An accepted model is handed to ``controller.set_model``, which keeps the
warm start, so there is no gap.  With ``background=True`` the fit runs on a worker thread and
is swapped in at the first ``observe``/``solve`` after it finished (what a ROS node does);
the default runs it in place, which keeps simulations deterministic.  Episodes restart the
clock; the window sees one increasing time and never differentiates across episodes.

:func:`parameter_error` scores a model against a known truth in a unit-free way (used with
the simulated plants, whose true model is known).
"""

from dataclasses import dataclass, field
import math
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np
import torch

from .dynamics import ModelDynamics
from .policy import FeedbackPolicy
from .. import robots
from ..core.integrators import joint_friction
from ..core.model import RobotModel
from ..core.rnea import rnea
from ..sysid import estimators
from ..sysid.online import Decision, OnlineConfig, OnlineEngine
from ..sysid.result import IdentificationResult

Tensor = torch.Tensor
TruthFn = Callable[[], RobotModel]

__all__ = ['AdaptiveConfig', 'AdaptiveMPC', 'default_estimator_config', 'parameter_error']


@dataclass(frozen=True)
class AdaptiveConfig:
    """
    Options of :class:`AdaptiveMPC`.

    :param estimator: estimator name (``diffsim_ros.sysid.estimators.names()``).
    :param estimator_config: its configuration mapping (see the estimator's config class).
    :param refit_every: observed steps between refits, >= 1.
    :param buffer_size: transitions kept (oldest dropped first), >= ``min_samples``.
    :param min_samples: transitions needed before the first refit, >= 10.
    :param validation_fraction: newest fraction of the buffer held out for acceptance.
    :param prediction_steps: open-loop steps of the held-out prediction error, >= 1.
    :param accept_margin: relative improvement of the held-out error a fit needs.
    :param max_gap: a time step larger than this many median steps starts a new segment.
    :param limit_margin: samples closer than this to a joint position limit are not used
        (the model has no joint-stop forces), rad or m.
    :param warm_start: pass the previously accepted result to the estimator.
    :param background: fit in a worker thread (swap in when done) instead of in place.
    :param memory_segments: cells of older data kept beyond the buffer for their information
        about the base parameters (:class:`~diffsim_ros.sysid.memory.SegmentMemory`) and fit
        with it; 0 fits on the buffer alone.
    :param memory_segment: length of a memory cell, s.
    :param max_unexplained: the engine's driver check threshold
        (:func:`~diffsim_ros.sysid.online.driver_check`).
    :raises ValueError: invalid values.
    """

    estimator: str = 'nea'
    estimator_config: Mapping[str, Any] = field(default_factory=dict)
    refit_every: int = 100
    buffer_size: int = 2000
    min_samples: int = 100
    validation_fraction: float = 0.3
    prediction_steps: int = 10
    accept_margin: float = 0.0
    max_gap: float = 3.0
    limit_margin: float = 0.05
    warm_start: bool = True
    background: bool = False
    memory_segments: int = 4
    memory_segment: float = 0.5
    max_unexplained: float = 1.0

    def __post_init__(self) -> None:
        """Validate the options."""
        if self.estimator not in estimators.names():
            raise ValueError(f'unknown estimator {self.estimator!r}; valid names: '
                             f'{", ".join(estimators.names())}')
        estimators.make_config(self.estimator, dict(self.estimator_config))
        for name, low in (('refit_every', 1), ('min_samples', 10), ('prediction_steps', 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f'{name} must be an int >= {low}, got {value!r}')
        if not isinstance(self.buffer_size, int) or self.buffer_size < self.min_samples:
            raise ValueError(f'buffer_size must be an int >= min_samples ({self.min_samples}), '
                             f'got {self.buffer_size!r}')
        if not 0.0 < self.validation_fraction < 1.0:
            raise ValueError(f'validation_fraction must be in (0, 1), got '
                             f'{self.validation_fraction!r}')
        if isinstance(self.memory_segments, bool) or not isinstance(self.memory_segments, int) \
                or self.memory_segments < 0:
            raise ValueError(f'memory_segments must be an int >= 0, got {self.memory_segments!r}')
        if not (math.isfinite(self.memory_segment) and self.memory_segment > 0):
            raise ValueError(f'memory_segment must be > 0, got {self.memory_segment!r}')
        for name in ('accept_margin', 'max_gap', 'limit_margin'):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0.0):
                raise ValueError(f'{name} must be finite and >= 0, got {value!r}')
        self.online()   # the engine's own checks

    def online(self) -> OnlineConfig:
        """
        Return the options of the online engine these options stand for.

        :return: a window of ``buffer_size`` states without a time limit, the estimator and
            acceptance settings, and in-place or thread execution (``background``).
        """
        return OnlineConfig(
            estimator=self.estimator, estimator_config=dict(self.estimator_config),
            window=math.inf, max_samples=self.buffer_size, min_window=0.0,
            min_samples=self.min_samples, holdout_fraction=self.validation_fraction,
            prediction_steps=self.prediction_steps, accept_margin=self.accept_margin,
            limit_margin=self.limit_margin, max_gap=self.max_gap or math.inf,
            memory_segments=self.memory_segments, memory_segment=self.memory_segment,
            warm_start=self.warm_start, max_unexplained=self.max_unexplained,
            execution='thread' if self.background else 'inline')


def default_estimator_config(robot: str, estimator: str = 'nea') -> Dict[str, Any]:
    """
    Return an estimator configuration that reads the commands of a catalog robot.

    Voltage-commanded robots get their catalog DC motor (``dc_motor_kwargs``), fixed; the
    commands ``u`` are the input (``source='u'``). ``'diffnea'`` gets a short schedule (a few
    seconds at most on a Quanser robot) learning inertials, damping and Coulomb friction.

    :param robot: catalog robot name.
    :param estimator: estimator name.
    :return: a plain mapping for :func:`diffsim_ros.sysid.estimators.fit`.
    """
    info = robots.get(robot)
    config: Dict[str, Any] = {'source': 'u', 'command_joints': list(info.command_joints)}
    if info.command_unit == 'V':
        config.update(actuator='dc_motor', actuator_kwargs=info.dc_motor_kwargs())
    if estimator == 'nea':
        config.update(friction=['viscous', 'coulomb'], coulomb='tanh')
    elif estimator == 'diffnea':
        config.update(learn=['inertial', 'damping', 'coulomb'], adam_iterations=60,
                      lbfgs_iterations=4, max_seconds=5.0, prior_weight=1e-3)
    return config


def parameter_error(model: RobotModel, truth: RobotModel, samples: int = 256,
                    seed: int = 0) -> float:
    """
    Return the relative inverse-dynamics error of a model against the true one.

    At ``samples`` random states (positions uniform within the joint limits, or in
    ``[-pi, pi]`` for unlimited joints; velocities ``N(0, 2^2)``; accelerations
    ``N(0, 10^2)``, rad or m based, from a local generator seeded with ``seed``) both models'
    joint torques ``rnea(q, qd, qdd) + damping qd + friction tanh(qd / 0.01)`` are compared::

        error = sqrt(mean_j  sum_s (tau_model - tau_true)_sj^2 / sum_s (tau_true)_sj^2)

    It is 0 exactly when every identifiable (base) inertial and friction parameter is right,
    whatever the unidentifiable ones are, and about the relative parameter error otherwise
    (0.3 for every parameter 30 % off). Actuator errors are not part of it.

    :param model: the model to score.
    :param truth: the true model (same joints).
    :param samples: number of random states.
    :param seed: seed of the local generator.
    :return: the error (dimensionless).
    """
    generator = torch.Generator().manual_seed(seed)
    truth = truth.to(dtype=torch.float64, device='cpu')
    model = model.to(dtype=torch.float64, device='cpu')
    n = truth.n
    lower, upper = truth.lower.clone(), truth.upper.clone()
    unbounded = ~(torch.isfinite(lower) & torch.isfinite(upper))
    lower[unbounded], upper[unbounded] = -math.pi, math.pi
    q = lower + (upper - lower) * torch.rand(samples, n, generator=generator,
                                             dtype=torch.float64)
    qd = 2.0 * torch.randn(samples, n, generator=generator, dtype=torch.float64)
    qdd = 10.0 * torch.randn(samples, n, generator=generator, dtype=torch.float64)
    with torch.no_grad():
        tau_true = rnea(truth, q, qd, qdd) + joint_friction(truth, qd)
        tau = rnea(model, q, qd, qdd) + joint_friction(model, qd)
    ratio = (tau - tau_true).square().sum(0) / tau_true.square().sum(0).clamp_min(1e-300)
    return float(ratio.mean().sqrt())


class AdaptiveMPC:
    """
    A controller that refits its model from the transitions it observes (see the module).

    It implements the controller protocol itself (``solve``, ``set_model``, ``reset``,
    ``dynamics``), delegating planning to the wrapped controller; call :meth:`observe` once
    per applied command.

    :param controller: the wrapped controller (iLQR, MPPI or a baseline).
    :param estimator: estimator name (overrides ``config.estimator`` when given).
    :param refit_every: overrides ``config.refit_every`` when given.
    :param buffer_size: overrides ``config.buffer_size`` when given.
    :param min_samples: overrides ``config.min_samples`` when given.
    :param estimator_config: overrides ``config.estimator_config`` when given.
    :param validation_fraction: overrides ``config.validation_fraction`` when given.
    :param config: all options at once.
    :param truth: callable returning the true model (simulations): ``history`` then records
        :func:`parameter_error` of the model in use after every refit.
    :param online: the engine's options, replacing those ``config`` stands for (e.g. the
        identifier node's, to run exactly its loop); ``refit_every`` still sets the trigger.
    :param check: candidate checks handed to the engine (reasons to refuse a candidate).
    """

    def __init__(self, controller: Any, estimator: Optional[str] = None,
                 refit_every: Optional[int] = None, buffer_size: Optional[int] = None,
                 min_samples: Optional[int] = None,
                 estimator_config: Optional[Mapping[str, Any]] = None,
                 validation_fraction: Optional[float] = None,
                 config: Optional[AdaptiveConfig] = None,
                 truth: Optional[TruthFn] = None, online: Optional[OnlineConfig] = None,
                 check: Optional[Callable[[IdentificationResult], Sequence[str]]] = None
                 ) -> None:
        base = config if config is not None else AdaptiveConfig(
            estimator=estimator or 'nea', estimator_config=dict(estimator_config or {}))
        changes = {key: value for key, value in (
            ('estimator', estimator), ('refit_every', refit_every),
            ('buffer_size', buffer_size), ('min_samples', min_samples),
            ('estimator_config', estimator_config),
            ('validation_fraction', validation_fraction)) if value is not None}
        fields = {**base.__dict__, **changes}
        fields['estimator_config'] = dict(fields['estimator_config'])
        self.config = AdaptiveConfig(**fields)
        self.controller = controller
        self.nominal_model: RobotModel = controller.dynamics.model
        #: The model the controller plans with (the nominal one until a fit is accepted).
        self.current_model: RobotModel = self.nominal_model
        #: Number of accepted refits.
        self.refits = 0
        #: Number of fits tried.
        self.attempts = 0
        #: One entry per fit tried: the engine's decision record (``Decision.to_dict``).
        self.history: List[Dict[str, Any]] = []
        #: The engine's decisions, in order (fits tried, and data refused before a fit).
        self.decisions: List[Decision] = []
        self.truth = truth
        #: The loop itself: window, memory, refits, acceptance (shared with the node).
        self.engine = OnlineEngine(self.nominal_model, online or self.config.online(), check)
        self.memory = self.engine.memory
        # Episodes restart the clock; the window and the memory see one increasing time.
        self._offset, self._last_time = 0.0, None
        self._since_refit = 0

    @property
    def last_result(self) -> Optional[IdentificationResult]:
        """Return the result in use (None: the nominal model)."""
        return self.engine.current

    # -- protocol ----------------------------------------------------------------------------
    @property
    def dynamics(self) -> ModelDynamics:
        """Return the dynamics of the wrapped controller, on the current model."""
        return self.controller.dynamics

    def solve(self, x0: Tensor, t: float = 0.0) -> FeedbackPolicy:
        """
        Plan with the current model (swapping in a finished background fit first).

        :param x0: state ``(nx,)``.
        :param t: time, s.
        :return: the wrapped controller's policy.
        """
        self._collect()
        return self.controller.solve(x0, t)

    def set_model(self, model: RobotModel) -> None:
        """
        Plan with another model from the next solve on (e.g. one identified elsewhere).

        It becomes the model in use that refits must beat.

        :param model: the new model.
        """
        self._use(model)
        self.engine.adopt(model)

    def _use(self, model: RobotModel) -> None:
        self.current_model = model
        self.controller.set_model(model)

    def reset(self) -> None:
        """Forget the controller's warm start; keep the model and the data (a new episode)."""
        self.controller.reset()
        self.engine.window.new_run()

    # -- data --------------------------------------------------------------------------------
    def observe(self, t: float, q: Tensor, qd: Tensor, u: Tensor) -> bool:
        """
        Record the state measured at ``t`` and the command applied from ``t`` on.

        :param t: time, s.
        :param q: positions ``(n,)`` in model joint order.
        :param qd: velocities ``(n,)``.
        :param u: command ``(nu,)`` actually applied (after clipping).
        :return: whether a new model was accepted during this call.
        """
        sample = [torch.as_tensor(v, dtype=torch.float64).detach().reshape(-1).cpu().numpy()
                  for v in (q, qd, u)]
        if not all(bool(np.isfinite(v).all()) for v in sample):
            self.engine.window.new_run()
            return False
        t = float(t) + self._offset
        if self._last_time is not None and t <= self._last_time:
            # a new episode (its clock restarted): continue from the last time, 1 s later
            self._offset += self._last_time + 1.0 - t
            t = self._last_time + 1.0
        self._last_time = t
        self.engine.window.add_command(t, sample[2].copy())
        self.engine.window.add_state(t, sample[0].copy(), sample[1].copy())
        self._since_refit += 1
        accepted = self._collect()
        if (self._since_refit >= self.config.refit_every
                and len(self.engine.window) >= self.config.min_samples
                and not self.engine.busy):
            self._since_refit = 0
            accepted = self.refit() or accepted
        return accepted

    @property
    def samples(self) -> int:
        """Return the number of buffered samples."""
        return len(self.engine.window)

    # -- refitting ---------------------------------------------------------------------------
    def refit(self) -> bool:
        """
        Refit on the window now (or start a background fit) and accept the model if better.

        :return: whether a new model was accepted (always False when started in the
            background; the swap happens in a later :meth:`observe` / :meth:`solve`).
        """
        if self.config.background:
            decision = self.engine.start()
            return self._record(decision) if decision is not None else False
        return self._record(self.engine.refit())

    def _record(self, decision: Decision) -> bool:
        if decision.outcome == 'waiting':
            return False
        self.decisions.append(decision)
        self.attempts += 1
        if decision.accepted:
            self._use(decision.result.model.to(dtype=self.nominal_model.dtype,
                                               device=self.nominal_model.device))
            self.refits += 1
        entry = decision.to_dict()
        if self.truth is not None:
            entry['param_error'] = parameter_error(self.current_model, self.truth())
        self.history.append(entry)
        return decision.accepted

    def _collect(self) -> bool:
        """Swap in a finished background fit; return whether it was accepted."""
        decision = self.engine.poll()
        return self._record(decision) if decision is not None else False

    def close(self) -> None:
        """Wait for a running background fit and stop the worker thread."""
        if self.engine.busy:
            self._record(self.engine.refit())
        self.engine.close()
