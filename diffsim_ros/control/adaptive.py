"""
Adaptive MPC: control with the current model, refit it while controlling, swap it in.

The loop of Algorithm 1 of IDS (identify while controlling), run by the one online
identification engine, :class:`~diffsim_ros.sysid.online.OnlineEngine`, that the identifier
node runs on the robot: what ``diffsim-sim-eval --controller adaptive-mpc`` measures is the
loop of the ROS graph.  Every step the wrapped controller acts on the newest accepted model;
:meth:`AdaptiveMPC.observe` puts the measured state and the applied command into the
engine's window; every ``refit_every`` observed steps (once the engine's ``min_samples`` are
there) the engine refits, with the options of an
:class:`~diffsim_ros.sysid.online.OnlineConfig` (its module docstring says what a refit
does; :data:`SAMPLE_LOOP` by default, the identifier node's own for ``diffsim-sim-eval``).
An accepted model is handed to ``controller.set_model``, which keeps the warm start, so
there is no gap.  With the engine's ``execution`` ``'thread'`` (or ``'process'``) the fit
runs in the background and is swapped in at the first ``observe``/``solve`` after it
finished (what a ROS node does); ``'inline'`` runs it in place, which keeps simulations
deterministic.  Episodes restart the clock; the window sees one increasing time and never
differentiates across episodes.

:func:`parameter_error` scores a model against a known truth in a unit-free way (used with
the simulated plants, whose true model is known).
"""

from dataclasses import dataclass
import math
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import torch

from .dynamics import KEEP, ModelDynamics
from .policy import FeedbackPolicy
from .. import robots
from ..core.dispatch import rnea
from ..core.integrators import joint_friction
from ..core.model import RobotModel
from ..sysid.online import Decision, OnlineConfig, OnlineEngine
from ..sysid.result import IdentificationResult

Tensor = torch.Tensor
TruthFn = Callable[[], RobotModel]

__all__ = ['AdaptiveConfig', 'AdaptiveMPC', 'SAMPLE_LOOP', 'default_estimator_config',
           'parameter_error']


#: The engine's options for a loop counted in samples (a simulation at a known rate): the
#: newest 2000 states without a time limit, a refit once 100 are there, the newest 30 % held
#: out, runs cut at steps over three median intervals, half-second memory cells (without them
#: the refits during a balance accepted models thousands of percent off on the Qube), 'nea'
#: with its defaults, fits in place.
SAMPLE_LOOP = OnlineConfig(window=math.inf, max_samples=2000, min_window=0.0, min_samples=100,
                           holdout_fraction=0.3, max_gap=3.0, memory_segment=0.5)


@dataclass(frozen=True)
class AdaptiveConfig:
    """
    Options of :class:`AdaptiveMPC`: its refit trigger, and the engine's options.

    :param refit_every: observed steps between refits, >= 1.
    :param online: the engine's options (window, estimator, acceptance, execution).
    :raises ValueError: invalid values.
    """

    refit_every: int = 100
    online: OnlineConfig = SAMPLE_LOOP

    def __post_init__(self) -> None:
        """Validate the options (the engine's are validated by :class:`OnlineConfig`)."""
        if isinstance(self.refit_every, bool) or not isinstance(self.refit_every, int) \
                or self.refit_every < 1:
            raise ValueError(f'refit_every must be an int >= 1, got {self.refit_every!r}')
        if not isinstance(self.online, OnlineConfig):
            raise ValueError(f'online must be an OnlineConfig, got {type(self.online).__name__}')


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
    :param estimator: the engine's estimator, replacing that of ``online`` or ``config``
        (with its default configuration unless ``estimator_config`` is given).
    :param refit_every: replaces ``config.refit_every`` when given.
    :param config: the trigger and the engine's options at once (default
        :class:`AdaptiveConfig`).
    :param truth: callable returning the true model (simulations): ``history`` then records
        :func:`parameter_error` of the model in use after every refit.
    :param online: the engine's options, replacing ``config.online`` (e.g. the identifier
        node's, to run exactly its loop).
    :param check: candidate checks handed to the engine (reasons to refuse a candidate).
    :param options: further fields of the engine's options to change, by their
        :class:`~diffsim_ros.sysid.online.OnlineConfig` names (``max_samples=500``,
        ``estimator_config={...}``); validated by it.
    """

    def __init__(self, controller: Any, estimator: Optional[str] = None,
                 refit_every: Optional[int] = None, config: Optional[AdaptiveConfig] = None,
                 truth: Optional[TruthFn] = None, online: Optional[OnlineConfig] = None,
                 check: Optional[Callable[[IdentificationResult], Sequence[str]]] = None,
                 **options: Any) -> None:
        base = config if config is not None else AdaptiveConfig()
        engine = online if online is not None else base.online
        if estimator is not None and estimator != engine.estimator:
            options = {'estimator_config': None, **options, 'estimator': estimator}
        self.config = AdaptiveConfig(
            base.refit_every if refit_every is None else refit_every,
            engine.replace(**options) if options else engine)
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
        self.engine = OnlineEngine(self.nominal_model, self.config.online, check)
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

    def set_model(self, model: RobotModel, friction_model: Any = KEEP) -> None:
        """
        Plan with another model from the next solve on (e.g. one identified elsewhere).

        It becomes the model in use that refits must beat.

        :param model: the new model.
        :param friction_model: its extra friction module (None: none); :data:`KEEP`: the
            one in use.
        """
        self._use(model, friction_model)
        self.engine.adopt(model)

    def _use(self, model: RobotModel, friction_model: Any = KEEP) -> None:
        self.current_model = model
        self.controller.set_model(model, friction_model=friction_model)

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
                and len(self.engine.window) >= self.engine.config.min_samples
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
        if self.engine.config.execution != 'inline':   # in the background
            decision = self.engine.start()
            return self._record(decision) if decision is not None else False
        return self._record(self.engine.refit())

    def _record(self, decision: Decision) -> bool:
        if decision.outcome == 'waiting':
            return False
        self.decisions.append(decision)
        self.attempts += 1
        if decision.accepted:
            # a refit is the whole model: its own friction module, or none (the damping and
            # Coulomb fields it fitted took the place of a starting fit's module)
            self._use(decision.result.model.to(dtype=self.nominal_model.dtype,
                                               device=self.nominal_model.device),
                      decision.result.friction)
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
