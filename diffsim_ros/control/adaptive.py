"""
Adaptive MPC: control with the current model, record transitions, refit, swap the model.

The loop of Algorithm 1 of IDS (identify while controlling): every step the wrapped controller
acts on the newest accepted model; the measured transitions ``(t, q, qd, u)`` go to a replay
buffer; every ``refit_every`` observed steps (once ``min_samples`` are buffered) an estimator of
:mod:`diffsim_ros.sysid.estimators` refits the model on the older part of the buffer, and the
fit is accepted only if it predicts the held-out newest part better than the current model
(``k``-step open-loop rollouts from measured states, normalised squared error). An accepted
model is handed to ``controller.set_model``, which keeps the warm start, so there is no gap:
until then the last policy keeps being applied. With ``background=True`` the fit runs in a
worker thread and is swapped in at the first ``observe``/``solve`` after it finished (what a
ROS node does); the default runs it in place, which keeps simulations deterministic.

Older cells of data that carry information the buffer has lost (a balanced pendulum's
buffer has none about its inertia) are kept in a :class:`~diffsim_ros.sysid.memory.
SegmentMemory` and fit together with the buffer: without them the refits during a balance
accepted models thousands of percent off (on the Qube, NEA), which then failed the next
swing-up.  Times are made increasing across episodes (each restarts the clock).

Accelerations for the estimators are forward differences of the measured velocities,
``qdd_k = (qd_{k+1} - qd_k) / (t_{k+1} - t_k)``, the mean acceleration under the command held
over that interval; segments (episodes, or gaps in time) are never differenced across.

:func:`parameter_error` scores a model against a known truth in a unit-free way (used with
the simulated plants, whose true model is known).
"""

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
import math
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from .dynamics import ModelDynamics
from .policy import FeedbackPolicy
from .. import robots
from ..core.integrators import joint_friction
from ..core.model import RobotModel
from ..core.rnea import rnea
from ..sysid import estimators
from ..sysid.dataset import Trajectory
from ..sysid.memory import SegmentMemory
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
        :func:`parameter_error` of every accepted model.
    """

    def __init__(self, controller: Any, estimator: Optional[str] = None,
                 refit_every: Optional[int] = None, buffer_size: Optional[int] = None,
                 min_samples: Optional[int] = None,
                 estimator_config: Optional[Mapping[str, Any]] = None,
                 validation_fraction: Optional[float] = None,
                 config: Optional[AdaptiveConfig] = None,
                 truth: Optional[TruthFn] = None) -> None:
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
        #: One entry per fit tried: time, sample count, errors, acceptance, wall time.
        self.history: List[Dict[str, Any]] = []
        self.truth = truth
        self.last_result: Optional[IdentificationResult] = None
        self._buffer: deque = deque(maxlen=self.config.buffer_size)
        #: The informative older data, fit together with the buffer (see AdaptiveConfig).
        self.memory = SegmentMemory(self.nominal_model, self.config.memory_segments,
                                    self.config.memory_segment)
        # Episodes restart the clock; the buffer and the memory see one increasing time.
        self._offset, self._last_time = 0.0, None
        self._segment = 0
        self._since_refit = 0
        self._executor: Optional[ThreadPoolExecutor] = None
        self._pending: Optional[Future] = None
        self._lower = self.nominal_model.lower.detach().to('cpu', torch.float64)
        self._upper = self.nominal_model.upper.detach().to('cpu', torch.float64)

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

        :param model: the new model.
        """
        self.current_model = model
        self.controller.set_model(model)

    def reset(self) -> None:
        """Forget the controller's warm start; keep the model and the data (a new episode)."""
        self.controller.reset()
        self._segment += 1

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
        sample = tuple(torch.as_tensor(v, dtype=torch.float64).detach().reshape(-1).clone()
                       for v in (q, qd, u))
        if not all(bool(torch.isfinite(v).all()) for v in sample) or self._near_limit(sample[0]):
            self._segment += 1
            return False
        t = float(t) + self._offset
        if self._last_time is not None and t <= self._last_time:
            # a new episode (its clock restarted): continue from the last time, 1 s later
            self._offset += self._last_time + 1.0 - t
            t = self._last_time + 1.0
        self._last_time = t
        self._buffer.append((t, self._segment) + sample)
        self._since_refit += 1
        accepted = self._collect()
        if (self._since_refit >= self.config.refit_every
                and len(self._buffer) >= self.config.min_samples and self._pending is None):
            self._since_refit = 0
            accepted = self.refit() or accepted
        return accepted

    def _near_limit(self, q: Tensor) -> bool:
        margin = self.config.limit_margin
        return bool(((q < self._lower + margin) | (q > self._upper - margin)).any())

    @property
    def samples(self) -> int:
        """Return the number of buffered samples."""
        return len(self._buffer)

    def trajectories(self) -> List[Trajectory]:
        """
        Return the buffer as runs with forward-difference accelerations.

        :return: one :class:`Trajectory` per contiguous segment with at least 3 samples
            (the last sample of a segment has no successor and is dropped).
        """
        joint_names = tuple(self.nominal_model.joint_names)
        buffer = list(self._buffer)
        if len(buffer) < 2:
            return []
        times = torch.tensor([s[0] for s in buffer], dtype=torch.float64)
        steps = times[1:] - times[:-1]
        positive = steps[steps > 0]
        median = float(positive.median()) if positive.numel() else 1.0
        runs, start = [], 0
        for i in range(1, len(buffer) + 1):
            end = i == len(buffer)
            if not end:
                dt = buffer[i][0] - buffer[i - 1][0]
                if buffer[i][1] == buffer[i - 1][1] and 0 < dt <= self.config.max_gap * median:
                    continue
            segment = buffer[start:i]
            start = i
            if len(segment) < 3:
                continue
            t = torch.tensor([s[0] for s in segment], dtype=torch.float64)
            q, qd, u = (torch.stack([s[k] for s in segment]) for k in (2, 3, 4))
            qdd = (qd[1:] - qd[:-1]) / (t[1:] - t[:-1])[:, None]
            runs.append(Trajectory(t=t[:-1], q=q[:-1], qd=qd[:-1], qdd=qdd, u=u[:-1],
                                   joint_names=joint_names, run=f'segment{len(runs)}'))
        return runs

    def split(self) -> Tuple[List[Trajectory], List[Trajectory]]:
        """
        Split the buffer into older training runs and the newest held-out runs.

        :return: ``(train, validation)``; the last ``validation_fraction`` of the samples
            (in time order) are held out, cutting a run in two where needed.
        """
        runs = self.trajectories()
        total = sum(len(r) for r in runs)
        held = int(round(self.config.validation_fraction * total))
        train, validation = [], []
        remaining = total - held
        for run in runs:
            if remaining >= len(run):
                train.append(run)
                remaining -= len(run)
            elif remaining > 0:
                train.append(run.crop(0, remaining))
                validation.append(run.crop(remaining, len(run)))
                remaining = 0
            else:
                validation.append(run)
        keep = self.config.prediction_steps + 2
        return ([r for r in train if len(r) >= 3],
                [r for r in validation if len(r) >= keep])

    # -- refitting ---------------------------------------------------------------------------
    def prediction_error(self, model: RobotModel, runs: Sequence[Trajectory]) -> float:
        """
        Return the held-out open-loop prediction error of a model.

        From every sample of the runs the measured commands are replayed for
        ``prediction_steps`` steps through the controller's dynamics (actuator and friction
        included) on ``model``; squared state errors are normalised by each state
        coordinate's variance over the runs and averaged.

        :param model: the model to score.
        :param runs: held-out runs (uniformly sampled).
        :return: the normalised mean squared error (inf when it cannot be computed).
        """
        steps = self.config.prediction_steps
        windows = [r for r in runs if len(r) > steps]
        if not windows:
            return math.inf
        dynamics = _with_dt(self.dynamics.with_model(model.to(dtype=torch.float64)),
                            float(torch.cat([r.t[1:] - r.t[:-1] for r in windows]).median()))
        x0s, targets, controls = [], [], []
        for run in windows:
            x = torch.cat((run.q, run.qd), -1)
            windows_x = x.unfold(0, steps + 1, 1).transpose(-1, -2)
            x0s.append(windows_x[:, 0])
            targets.append(windows_x[:, 1:])
            controls.append(run.u[:-1].unfold(0, steps, 1).transpose(-1, -2))
        x0, target, u = torch.cat(x0s), torch.cat(targets), torch.cat(controls)
        with torch.no_grad():
            predicted = dynamics.rollout(x0.to(dynamics.model.dtype), u.to(
                dynamics.model.dtype))[..., 1:, :]
        scale = torch.cat([torch.cat((r.q, r.qd), -1) for r in windows]).var(0)
        scale = scale.clamp_min(1e-12 * float(scale.max()) + 1e-300)
        error = ((predicted - target).square() / scale).mean()
        value = float(error)
        return value if math.isfinite(value) else math.inf

    def refit(self) -> bool:
        """
        Fit a model on the buffer now (or start a background fit) and accept it if better.

        :return: whether a new model was accepted (always False when started in the
            background; the swap happens in a later :meth:`observe` / :meth:`solve`).
        """
        train, validation = self.split()
        if not train or not validation:
            return False
        # the memory's cells from before the buffer join the training data (the whole
        # buffer is offered, unsplit, so that every cell is seen whole by some refit)
        remembered = self.memory.runs(before=float(self._buffer[0][0]))
        self.memory.offer(self.trajectories())
        train = remembered + train
        warm = self.last_result if self.config.warm_start else None
        job = (self.nominal_model, train, validation, warm, self.current_model,
               float(train[-1].t[-1]))
        if self.config.background:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1)
            self._pending = self._executor.submit(self._fit, *job)
            return False
        return self._accept(*self._fit(*job))

    def _fit(self, nominal: RobotModel, train: List[Trajectory],
             validation: List[Trajectory], warm: Optional[IdentificationResult],
             current: RobotModel, t: float) -> tuple:
        start = time.perf_counter()
        entry: Dict[str, Any] = {'t': t, 'samples': sum(len(r) for r in train),
                                 'validation_samples': sum(len(r) for r in validation)}
        result = None
        try:
            result = estimators.fit(self.config.estimator, nominal, train, validation,
                                    dict(self.config.estimator_config), warm_start=warm)
            candidate = result.model
            entry['error_new'] = self.prediction_error(candidate, validation) \
                if candidate is not None else math.inf
        except (ValueError, RuntimeError) as exc:   # ill-posed data: keep the current model
            entry['error'] = f'{type(exc).__name__}: {exc}'
            entry['error_new'] = math.inf
        entry['error_current'] = self.prediction_error(current, validation)
        entry['fit_time_s'] = time.perf_counter() - start
        return result, entry

    def _accept(self, result: Optional[IdentificationResult], entry: Dict[str, Any]) -> bool:
        self.attempts += 1
        new, current = entry['error_new'], entry['error_current']
        accepted = (result is not None and result.model is not None and math.isfinite(new)
                    and new < (1.0 - self.config.accept_margin) * current)
        entry['accepted'] = bool(accepted)
        if accepted:
            model = result.model.to(dtype=self.nominal_model.dtype,
                                    device=self.nominal_model.device)
            self.set_model(model)
            self.last_result = result
            self.refits += 1
        if self.truth is not None:
            entry['param_error'] = parameter_error(self.current_model, self.truth())
        self.history.append(entry)
        return bool(accepted)

    def _collect(self) -> bool:
        """Swap in a finished background fit; return whether it was accepted."""
        if self._pending is None or not self._pending.done():
            return False
        future, self._pending = self._pending, None
        return self._accept(*future.result())

    def close(self) -> None:
        """Wait for a running background fit and stop the worker thread."""
        if self._pending is not None:
            future, self._pending = self._pending, None
            self._accept(*future.result())
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None


def _with_dt(dynamics: ModelDynamics, dt: float) -> ModelDynamics:
    """Return the same dynamics with another step (the data's sample interval)."""
    return ModelDynamics(dynamics.model, dt, command_joints=dynamics.command_joints,
                         actuator=dynamics.actuator, friction=dynamics.friction,
                         method=dynamics.method, substeps=dynamics.substeps,
                         u_min=dynamics.u_min, u_max=dynamics.u_max)
