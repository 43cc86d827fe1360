"""
The online identification engine: one refit-and-accept loop for the robot and for simulation.

Algorithm 1 of IDS (identify while controlling) as one object, :class:`OnlineEngine`, used
unchanged by the identifier node (``nodes/identifier.py``, which only converts messages) and
by the adaptive MPC of ``diffsim-sim-eval`` (``control/adaptive.py``), so that what the
simulated evaluation measures is the loop that runs on the robot.  One refit:

1. **Window.**  :class:`SampleWindow` keeps time-stamped joint states ``(t, q[, qd][,
   effort])``, commands ``(t, u)`` (each held from its stamp until the next one) and poses,
   for ``window`` s and at most ``max_samples`` states.  States are cut into runs at
   :meth:`SampleWindow.new_run` (an episode) and at steps longer than ``max_gap`` median
   intervals.
2. **Derivatives** (:func:`window_runs`).  Measured velocities (``velocity_source``) are
   kept and differentiated on their own stamps (central differences, ``np.gradient``), which
   keeps the steps of bang-bang commands a low-passed second derivative of quantised
   positions loses; without them, positions (and efforts) go through the zero-phase
   low-pass of :func:`~diffsim_ros.sysid.filters.estimate_derivatives`, and
   ``2 / derivative_cutoff_hz`` s (its transient) are cropped at both ends of a run.
   Commands are held onto the state stamps.
3. **Limit-free stretches** (:func:`usable_runs`): samples within ``limit_margin`` of a
   position limit are left out, with the filter transient around them (the stop's force is
   not in the model).
4. **Split**: the newest ``holdout_fraction`` of the samples is held out; the rest, with the
   cells of older informative data the window has lost
   (:class:`~diffsim_ros.sysid.memory.SegmentMemory`), is the training data.
5. **Driver check** (:func:`driver_check`), before any fit: data whose commands the model of
   the driver cannot explain are refused (and kept out of the memory).
6. **Fit** with :func:`diffsim_ros.sysid.estimators.fit`, warm-started from the model in use,
   run by an execution strategy (:data:`EXECUTIONS`: in place, on a thread, or in a child
   process that never holds the caller's interpreter lock).
7. **Acceptance** on the held-out data (:func:`prediction_error`): the candidate replaces the
   model in use only if its ``prediction_steps``-step open-loop prediction error is below
   ``(1 - accept_margin)`` times that of the model in use.  A model for MPC is judged by what
   the controller uses it for, predicting the next states from the commands, on data it was
   not fit to: an inverse-dynamics torque error rewards models that explain noisy
   accelerations and can prefer a model whose simulated trajectories drift; a held-out
   rollout error weighs the errors exactly as the planner meets them, in state units,
   normalised per coordinate so every joint counts.
8. **Candidate checks**: an optional ``check(candidate) -> reasons`` hook (the robot's
   plausibility bounds) refuses a candidate with the reasons it returns.

Each refit returns a :class:`Decision` (accepted/refused/failed/waiting, reason, losses,
durations) that the caller turns into diagnostics.  The module imports no ROS package, reads
no file and no environment variable.
"""

from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
import copyreg
from dataclasses import dataclass, field, replace
import math
import multiprocessing
import os
import threading
import time
from types import MappingProxyType
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from . import estimators
from .dataset import Trajectory
from .filters import estimate_derivatives
from .losses import (command_joints_for, make_actuator, make_windows, resolve_source,
                     rollout_loss, stack_samples, state_scale)
from .memory import SegmentMemory
from .preprocess import align_streams, limit_free_runs
from .result import EstimatorConfig, IdentificationResult
from ..core.dispatch import rnea
from ..core.model import RobotModel

Tensor = torch.Tensor
CheckFn = Callable[[IdentificationResult], Sequence[str]]

__all__ = ['Decision', 'DecisionLog', 'DriverCheck', 'EXECUTIONS', 'JobSizes', 'OnlineConfig',
           'OnlineEngine', 'RefitEngine', 'RefitJob', 'RefitPool', 'SampleWindow', 'driver_check',
           'evaluate', 'nominal_result', 'prediction_error', 'usable_runs', 'window_runs']

#: Execution strategies of a fit: on the caller's thread, on a worker thread, or in one
#: spawned child process (torch with one thread, lower priority; no ROS imported there).
EXECUTIONS = ('inline', 'thread', 'process')
#: Largest deviation of a held-out sample interval from the median that a rollout window
#: spans; longer or shorter steps (dropped or bunched samples) cut the run there.
UNIFORM_TOLERANCE = 0.2


def _mapping_proxy(items: dict) -> MappingProxyType:
    return MappingProxyType(items)


def _pickle_mapping_proxy(proxy: MappingProxyType) -> tuple:
    return _mapping_proxy, (dict(proxy),)


# Frozen configs and trajectories hold read-only mappings; a child process gets them as such.
copyreg.pickle(MappingProxyType, _pickle_mapping_proxy)


@dataclass(frozen=True)
class OnlineConfig:
    """
    Options of :class:`OnlineEngine` (see the module docstring for the steps they set).

    :param estimator: estimator name (:func:`diffsim_ros.sysid.estimators.names`).
    :param estimator_config: its configuration (mapping or config object).
    :param window: seconds of joint states kept (``inf``: no time limit).
    :param max_samples: joint states kept at most (0: no count limit).
    :param min_window: seconds of data a refit needs.
    :param min_samples: joint states a refit needs.
    :param holdout_fraction: newest fraction of the samples held out for acceptance.
    :param prediction_steps: open-loop steps of the held-out prediction error.
    :param accept_margin: relative improvement over the model in use a candidate needs.
    :param velocity_source: ``'auto'`` (measured when every sample has one), ``'message'``
        or ``'differentiate'``.
    :param derivative_cutoff_hz: low-pass cutoff of the differentiation (also sets the
        cropped filter transient ``2 / cutoff`` s), Hz.
    :param limit_margin: samples this close to a position limit are left out (negative:
        none), rad or m.
    :param max_gap: a step longer than this many median intervals starts a new run.
    :param memory_segments: informative older cells kept (0: the window alone).
    :param memory_segment: memory cell length, s.
    :param memory_max_age: cells older than this are forgotten (``inf``: never), s.
    :param warm_start: start each fit from the model in use.
    :param max_unexplained: the driver check's threshold on the normalised residual of a
        block (see :func:`driver_check`); above 1 = the commands push against the motion
        they should have caused.
    :param driver_block: block length of the driver check, s.
    :param execution: one of :data:`EXECUTIONS`.
    :raises ValueError: invalid values, naming the field.
    """

    estimator: str = 'nea'
    estimator_config: Any = None
    window: float = 5.0
    max_samples: int = 0
    min_window: float = 1.0
    min_samples: int = 10
    holdout_fraction: float = 0.25
    prediction_steps: int = 10
    accept_margin: float = 0.0
    velocity_source: str = 'auto'
    derivative_cutoff_hz: float = 20.0
    limit_margin: float = 0.05
    max_gap: float = math.inf
    memory_segments: int = 4
    memory_segment: float = 1.0
    memory_max_age: float = math.inf
    warm_start: bool = True
    max_unexplained: float = 1.0
    driver_block: float = 0.5
    execution: str = 'inline'

    def __post_init__(self) -> None:
        """Validate, and turn the estimator configuration into its frozen config object."""
        object.__setattr__(self, 'estimator_config',
                           estimators.make_config(self.estimator, self.estimator_config))
        for name in ('max_samples', 'min_samples', 'prediction_steps', 'memory_segments'):
            value = getattr(self, name)
            low = 1 if name == 'prediction_steps' else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f'{name} must be an int >= {low}, got {value!r}')
        for name in ('window', 'derivative_cutoff_hz', 'memory_segment', 'max_gap',
                     'memory_max_age', 'max_unexplained', 'driver_block'):
            value = getattr(self, name)
            if not (value > 0 and not math.isnan(value)):
                raise ValueError(f'{name} must be > 0, got {value!r}')
        for name in ('derivative_cutoff_hz', 'memory_segment', 'max_unexplained',
                     'driver_block'):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f'{name} must be finite, got {getattr(self, name)!r}')
        for name in ('min_window', 'accept_margin'):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f'{name} must be finite and >= 0, got {value!r}')
        if not 0.0 < self.holdout_fraction < 1.0:
            raise ValueError(f'holdout_fraction must be in (0, 1), got {self.holdout_fraction!r}')
        if not math.isfinite(self.limit_margin):
            raise ValueError(f'limit_margin must be finite, got {self.limit_margin!r}')
        if self.min_window > self.window:
            raise ValueError(f'min_window ({self.min_window}) exceeds window ({self.window})')
        if self.max_samples and self.max_samples < self.min_samples:
            raise ValueError(f'max_samples ({self.max_samples}) is below min_samples '
                             f'({self.min_samples})')
        choices = {'velocity_source': ('auto', 'message', 'differentiate'),
                   'execution': EXECUTIONS}
        for name, valid in choices.items():
            if getattr(self, name) not in valid:
                raise ValueError(f'{name} must be one of {", ".join(valid)}; got '
                                 f'{getattr(self, name)!r}')

    def replace(self, **changes: Any) -> 'OnlineConfig':
        """
        Return a copy with some fields changed (validated again).

        :param changes: field values.
        :return: the new config.
        """
        return replace(self, **changes)


# -- the window ----------------------------------------------------------------------------
class SampleWindow:
    """
    Time-stamped joint states, commands and poses of the last ``window`` s (thread-safe).

    States must come with increasing stamps (the caller drops or restarts on others); a
    command or pose that does not advance its stream is refused (the return value says so).

    :param window: seconds kept (``inf``: no limit).
    :param max_samples: states kept at most (0: no limit).
    """

    def __init__(self, window: float = math.inf, max_samples: int = 0) -> None:
        """Create an empty window."""
        self.window = float(window)
        self._lock = threading.Lock()
        self._states: deque = deque(maxlen=max_samples or None)
        self._commands: deque = deque()
        self._poses: Dict[str, deque] = {}
        self._run = 0

    def __len__(self) -> int:
        """Return the number of joint states kept."""
        return len(self._states)

    @property
    def states(self) -> List[tuple]:
        """Return a copy of the kept states ``(t, q, qd or None, effort or None, run)``."""
        with self._lock:
            return list(self._states)

    @property
    def commands(self) -> List[tuple]:
        """Return a copy of the kept commands ``(t, u)``."""
        with self._lock:
            return list(self._commands)

    def span(self) -> float:
        """Return the time between the oldest and the newest state, s."""
        with self._lock:
            return self._states[-1][0] - self._states[0][0] if len(self._states) > 1 else 0.0

    def add_state(self, t: float, q: np.ndarray, qd: Optional[np.ndarray] = None,
                  effort: Optional[np.ndarray] = None) -> None:
        """
        Append one joint state.

        :param t: stamp, s, later than the last one.
        :param q: ``(n,)`` positions in model joint order.
        :param qd: ``(n,)`` velocities, or None.
        :param effort: ``(n,)`` measured joint efforts, or None.
        :raises ValueError: a stamp that does not advance.
        """
        with self._lock:
            if self._states and not t > self._states[-1][0]:
                raise ValueError(f'stamp {t} s does not advance past {self._states[-1][0]} s')
            self._states.append((float(t), q, qd, effort, self._run))
            while self._states[0][0] < t - self.window:
                self._states.popleft()
            start = self._states[0][0]
            for queue in (self._commands, *self._poses.values()):
                # keep the last command before the window: it still acts at its start
                while len(queue) > 1 and queue[1][0] <= start:
                    queue.popleft()

    def add_command(self, t: float, u: np.ndarray) -> bool:
        """
        Record a command acting from ``t`` on (a command at the same stamp replaces it).

        :param t: stamp, s.
        :param u: ``(m,)`` command.
        :return: False when ``t`` is older than the last command (dropped).
        """
        with self._lock:
            if self._commands and t < self._commands[-1][0]:
                return False
            if self._commands and t == self._commands[-1][0]:
                self._commands[-1] = (float(t), u)
            else:
                self._commands.append((float(t), u))
            return True

    def add_pose(self, body: str, t: float, T_world_body: np.ndarray) -> bool:
        """
        Record a motion-capture pose.

        :param body: link name.
        :param t: stamp, s.
        :param T_world_body: ``(4, 4)`` pose.
        :return: False when ``t`` does not advance the body's stream (dropped).
        """
        with self._lock:
            queue = self._poses.setdefault(body, deque())
            if queue and t <= queue[-1][0]:
                return False
            queue.append((float(t), T_world_body))
            return True

    def new_run(self) -> None:
        """Start a new run with the next state (an episode: never differentiated across)."""
        with self._lock:
            self._run += 1

    def clear(self) -> None:
        """Forget every sample."""
        with self._lock:
            self._states.clear()
            self._commands.clear()
            self._poses.clear()
            self._run += 1

    def snapshot(self) -> tuple:
        """
        Return copies of the streams.

        :return: ``(states, commands, poses)`` lists (poses by body).
        """
        with self._lock:
            return (list(self._states), list(self._commands),
                    {body: list(queue) for body, queue in self._poses.items()})


def _run_slices(states: List[tuple], max_gap: float) -> List[slice]:
    """Cut the states at run changes and at steps over ``max_gap`` median intervals."""
    t = np.array([s[0] for s in states])
    steps = np.diff(t)
    limit = max_gap * float(np.median(steps)) if steps.size else math.inf
    cuts = [k for k in range(1, len(states))
            if states[k][4] != states[k - 1][4] or steps[k - 1] > limit]
    bounds = [0, *cuts, len(states)]
    return [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


def _run_trajectory(states: List[tuple], commands: List[tuple], poses: Mapping[str, list],
                    joint_names: Sequence[str], config: OnlineConfig, name: str
                    ) -> Optional[Trajectory]:
    f64 = torch.float64
    t = torch.tensor([s[0] for s in states], dtype=f64)
    q = torch.tensor(np.stack([s[1] for s in states]), dtype=f64)
    measured = all(s[2] is not None for s in states)
    filtered = not measured or config.velocity_source == 'differentiate'
    tau = torch.tensor(np.stack([s[3] for s in states]), dtype=f64) \
        if all(s[3] is not None for s in states) else None
    traj = Trajectory(t=t, q=q, tau=tau, joint_names=tuple(joint_names), run=name)
    if measured and config.velocity_source != 'differentiate':
        qd = np.stack([s[2] for s in states])
        qdd = np.gradient(qd, t.numpy(), axis=0, edge_order=1)
        traj = traj.replace(qd=torch.tensor(qd, dtype=f64), qdd=torch.tensor(qdd, dtype=f64))
    elif config.velocity_source == 'message':
        raise ValueError("velocity_source is 'message' but joint states lack velocities")
    else:
        try:
            traj = estimate_derivatives(traj, 'filtfilt', config.derivative_cutoff_hz)
        except ValueError:   # too short or too sparse for the filter: not usable
            return None
    end = float(t[-1])
    if commands and commands[-1][0] < end:
        commands = commands + [(end, commands[-1][1])]   # the last command still acts
    command_stream = (torch.tensor([c[0] for c in commands], dtype=f64),
                      torch.tensor(np.stack([c[1] for c in commands]), dtype=f64)) \
        if commands else None
    pose_streams = {body: (torch.tensor([p[0] for p in items], dtype=f64),
                           torch.tensor(np.stack([p[1] for p in items]), dtype=f64))
                    for body, items in poses.items() if len(items) > 1}
    try:
        traj = align_streams(traj, command_stream, pose_streams or None)
    except ValueError:   # no command (or pose) during this run
        return None
    if filtered:   # the filter's transients at both ends
        edge = 2.0 / config.derivative_cutoff_hz
        keep = torch.nonzero((traj.t >= traj.t[0] + edge)
                             & (traj.t <= traj.t[-1] - edge)).flatten()
        start, stop = (int(keep[0]), int(keep[-1]) + 1) if keep.numel() else (0, 0)
    else:   # one-sided differences at both ends
        start, stop = 1, len(traj) - 1
    return traj.crop(start, stop) if stop - start >= 10 else None


def window_runs(window: SampleWindow, joint_names: Sequence[str],
                config: OnlineConfig) -> List[Trajectory]:
    """
    Return the window as runs with derivatives, held commands and poses (step 2).

    :param window: the samples.
    :param joint_names: the model's joints (the states' column order).
    :param config: the engine options.
    :return: runs named ``window/<k>``, oldest first, each at least 10 samples.
    :raises ValueError: less than ``min_window`` s or ``min_samples`` states, no run left,
        or ``velocity_source='message'`` without velocities.
    """
    states, commands, poses = window.snapshot()
    if len(states) < max(3, config.min_samples) or \
            states[-1][0] - states[0][0] < config.min_window:
        raise ValueError('not enough data in the window yet')
    runs = []
    for piece in _run_slices(states, config.max_gap):
        if piece.stop - piece.start < 3:
            continue
        run = _run_trajectory(states[piece], commands, poses, joint_names, config,
                              f'window/{len(runs)}')
        if run is not None:
            runs.append(run)
    if not runs:
        raise ValueError('not enough data in the window yet')
    return runs


def usable_runs(runs: Sequence[Trajectory], model: RobotModel,
                config: OnlineConfig) -> List[Trajectory]:
    """
    Return the stretches of some runs away from the joint limits and the window's edges.

    The zero-phase derivative filter has no data beyond a run's ends, so its first and last
    ``2 / derivative_cutoff_hz`` s carry its transient (accelerations opposite to the true
    ones were seen there): they are left out, like the transient around a limit (step 3).

    :param runs: runs of the window.
    :param model: the robot (its position limits).
    :param config: ``limit_margin`` and ``derivative_cutoff_hz`` (the transient padded).
    :return: their :func:`~diffsim_ros.sysid.preprocess.limit_free_runs`.
    """
    pad = 2.0 / config.derivative_cutoff_hz
    inner = []
    for traj in runs:
        if len(traj) < 2:
            continue
        t = traj.t
        keep = torch.nonzero((t >= t[0] + pad) & (t <= t[-1] - pad)).flatten()
        if len(keep):
            inner.append(traj.crop(int(keep[0]), int(keep[-1]) + 1))
    return [part for traj in inner for part in limit_free_runs(
        traj, model.lower, model.upper, config.limit_margin, pad)]


def _uniform_pieces(runs: Sequence[Trajectory], min_length: int) -> List[Trajectory]:
    """Cut runs where a step deviates from the median interval (rollouts need one step)."""
    steps = [r.t[1:] - r.t[:-1] for r in runs if len(r) > 1]
    if not steps:
        return []
    dt = float(torch.cat(steps).median())
    pieces = []
    for run in runs:
        step = (run.t[1:] - run.t[:-1]).cpu().numpy()
        bad = np.flatnonzero(np.abs(step - dt) > UNIFORM_TOLERANCE * dt)
        bounds = [0, *(bad + 1).tolist(), len(run)]
        for a, b in zip(bounds[:-1], bounds[1:]):
            if b - a >= min_length:
                pieces.append(run.crop(a, b).replace(run=f'{run.run}:{len(pieces)}'))
    return pieces


def split_newest(runs: Sequence[Trajectory], fraction: float,
                 min_heldout: int) -> Tuple[List[Trajectory], List[Trajectory]]:
    """
    Split runs into older training runs and the newest held-out runs (step 4).

    :param runs: runs in time order.
    :param fraction: share of the samples held out, cutting a run in two where needed.
    :param min_heldout: held-out runs need this many samples (a k-step window and one).
    :return: ``(train, heldout)``; the held-out runs are uniformly sampled pieces.
    """
    total = sum(len(r) for r in runs)
    remaining = total - int(round(fraction * total))
    train, heldout = [], []
    for run in runs:
        if remaining >= len(run):
            train.append(run)
        elif remaining > 0:
            train.append(run.crop(0, remaining))
            heldout.append(run.crop(remaining, len(run)))
        else:
            heldout.append(run)
        remaining = max(remaining - len(run), 0)
    return [r for r in train if len(r) >= 3], _uniform_pieces(heldout, min_heldout)


# -- models, driver check and acceptance ----------------------------------------------------
def nominal_result(nominal: RobotModel, config: EstimatorConfig,
                   source: str) -> IdentificationResult:
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


@dataclass(frozen=True)
class DriverCheck:
    """
    What :func:`driver_check` found.

    :param verdict: ``'consistent'``, ``'inconsistent'`` or ``'unknown'`` (no block with
        commands that carry the motion: no commands, no excitation).
    :param reason: one line for diagnostics.
    :param worst: the largest block residual under the best-explaining model (nan: none).
    :param blocks: blocks with commands weighed.
    :param unexplained: blocks that no model explains.
    """

    verdict: str
    reason: str
    worst: float = math.nan
    blocks: int = 0
    unexplained: int = 0


def _block_sums(runs: Sequence[Trajectory], block: float) -> Dict[int, List[Tuple[int, int]]]:
    """Group samples into grid blocks of ``block`` s: key -> [(run index, sample index)]."""
    cells: Dict[int, List[Tuple[int, int]]] = {}
    for i, run in enumerate(runs):
        keys = torch.floor(run.t / block).to(torch.int64).tolist()
        for k, key in enumerate(keys):
            cells.setdefault(key, []).append((i, k))
    return cells


def driver_check(runs: Sequence[Trajectory], models: Sequence[IdentificationResult],
                 source: str, block: float, threshold: float) -> DriverCheck:
    """
    Tell whether the inputs of the data can be what drove the measured motion.

    For every model and every sample, the torque the inputs must supply on the driven joints
    is ``need = B^T (rnea(q, qd, qdd) - tau_net(q, qd, 0))`` and the inputs supply
    ``given = B^T (tau_net(q, qd, u) - tau_net(q, qd, 0))`` (``tau_net`` the model's net
    applied torque, actuator and friction included; ``B`` the command selection).  Per block
    of ``block`` s the normalised residual is
    ``rho = sum |need - given|^2 / (sum |need|^2 + sum |given|^2)``: 0 when the inputs supply
    exactly what the motion needs, 1 when they are unrelated to it, 2 when they oppose it
    exactly, and above 1 exactly when they push against the motion they should have caused
    (``sum need . given < 0``).  Inputs scaled by ``s`` give ``(1 - s)^2 / (1 + s^2)``: at
    most 1 for any ``s >= 0``, so a model that is merely wrong (a 38 % parameter error and
    unmodelled friction gave 0.5-0.7 on a simulated Qube) never looks hostile, and 1.6 for
    the ``-3`` scaling of a hostile peer; 1 is the default threshold.  (The residual
    normalised by ``sum |need|^2`` alone reached 1.4 on that honest Qube data: in a block
    where the commands fight unmodelled friction, the inputs are larger than what the
    motion shows.)  A block is weighed only when its inputs carry the motion
    (``sum |given|^2 >= sum |need|^2 / 4``); otherwise the check cannot tell from it.  A
    block counts as unexplained only if every model given (the nominal one and the model in
    use: the plausible ones) leaves ``rho > threshold``, so that one wrong model cannot make
    good data look hostile.

    :param runs: runs with ``qd``, ``qdd`` and the ``source`` signal.
    :param models: physical results whose torque maps are tried.
    :param source: ``'u'`` (commands) or ``'tau'`` (measured efforts).
    :param block: block length, s.
    :param threshold: largest residual a block may keep under its best model.
    :return: the finding.
    """
    if not runs:
        return DriverCheck('unknown', 'could not tell: no data')
    cells = _block_sums(runs, block)
    need_sq, residual_sq, given_sq = (torch.zeros(len(models), len(cells), dtype=torch.float64)
                                      for _ in range(3))
    keys = sorted(cells)
    column = {key: j for j, key in enumerate(keys)}
    for i, result in enumerate(models):
        model = result.model.to(dtype=torch.float64)
        torque_fn = result.torque_fn()
        joints = [model.joint_index(j) for j in (result.command_joints or model.joint_names)]
        for r, run in enumerate(runs):
            batch = stack_samples([run], model, source, True)
            with torch.no_grad():
                free = torque_fn(batch.q, batch.qd, torch.zeros_like(batch.u))
                need = (rnea(model, batch.q, batch.qd, batch.qdd) - free)[:, joints]
                given = (torque_fn(batch.q, batch.qd, batch.u) - free)[:, joints]
            index = torch.tensor([column[k] for k in
                                  torch.floor(run.t / block).to(torch.int64).tolist()])
            need_sq[i].index_add_(0, index, need.square().sum(-1))
            given_sq[i].index_add_(0, index, given.square().sum(-1))
            residual_sq[i].index_add_(0, index, (need - given).square().sum(-1))
    carried = (given_sq >= 0.25 * need_sq) & (need_sq > 0)
    rho = torch.where(carried, residual_sq / (need_sq + given_sq).clamp_min(1e-300),
                      torch.full_like(need_sq, math.nan))
    weighed = carried.all(0)   # every model sees the inputs carry the motion there
    if not bool(weighed.any()):
        return DriverCheck('unknown', 'could not tell: no block where the inputs carry the '
                           'motion (no commands or no excitation)')
    best = rho.min(0).values[weighed]
    worst = float(best.max())
    bad = best > threshold
    count, blocks = int(bad.sum()), int(weighed.sum())
    if count:
        starts = [keys[j] * block for j in torch.nonzero(weighed).flatten()[bad].tolist()]
        return DriverCheck('inconsistent', f'inputs unexplained in {count} of {blocks} '
                           f'blocks from t = {starts[0]:.2f} s: normalised residual up to '
                           f'{worst:.3g} > {threshold:g} under every plausible model '
                           '(commands that push against the motion: not what the driver '
                           'applied?)', worst, blocks, count)
    return DriverCheck('consistent', f'inputs explain the motion in {blocks} blocks '
                       f'(normalised residual up to {worst:.3g})', worst, blocks, 0)


def prediction_error(result: IdentificationResult, windows: Any, scale: Tensor) -> float:
    """
    Return a model's open-loop prediction error on held-out windows (the acceptance loss).

    :param result: a result with a physical model (its actuator and friction are used).
    :param windows: :func:`~diffsim_ros.sysid.losses.make_windows` of the held-out data.
    :param scale: ``(2 n,)`` state variances, the same for every model compared.
    :return: the normalised mean squared state error (``inf`` when not finite).
    """
    model = result.model.to(dtype=torch.float64)
    with torch.no_grad():
        value = float(rollout_loss(model, result.torque_fn(), windows, scale))
    return value if math.isfinite(value) else math.inf


class JobSizes:
    """What :class:`RefitEngine` reads of any job with ``train`` and ``heldout`` runs."""

    @property
    def end_time(self) -> float:
        """Return the newest held-out stamp, s."""
        return float(self.heldout[-1].t[-1])

    @property
    def train_samples(self) -> int:
        """Return the training samples (memory included)."""
        return sum(len(r) for r in self.train)

    @property
    def heldout_samples(self) -> int:
        """Return the held-out samples."""
        return sum(len(r) for r in self.heldout)


@dataclass(frozen=True)
class RefitJob(JobSizes):
    """
    Everything a fit needs, picklable for a child process.

    :param estimator: estimator name.
    :param nominal: the nominal model.
    :param config: the estimator configuration.
    :param source: ``'tau'`` or ``'u'``.
    :param train: training runs (memory cells first).
    :param heldout: held-out runs (uniformly sampled pieces).
    :param current: the model in use (None: the nominal one).
    :param warm: warm start (None: none).
    :param prediction_steps: steps of the held-out prediction.
    :param driver: the driver check's finding on these data.
    """

    estimator: str
    nominal: RobotModel
    config: EstimatorConfig
    source: str
    train: Tuple[Trajectory, ...]
    heldout: Tuple[Trajectory, ...]
    current: Optional[IdentificationResult]
    warm: Optional[IdentificationResult]
    prediction_steps: int
    driver: str = ''


def evaluate(job: RefitJob) -> Dict[str, Any]:
    """
    Fit a candidate and score it, the model in use and the nominal model on held-out data.

    :param job: the fit.
    :return: ``candidate`` (the result), ``losses`` (``candidate``, ``current``,
        ``nominal``: :func:`prediction_error`) and ``fit_s`` / ``score_s`` durations.
    """
    started = time.perf_counter()
    candidate = estimators.fit(job.estimator, job.nominal, list(job.train), list(job.heldout),
                               job.config, warm_start=job.warm)
    fitted = time.perf_counter()
    nominal = nominal_result(job.nominal, job.config, job.source)
    if candidate.actuator is None and nominal.actuator is not None:
        # an estimator that keeps the configured actuator fixed ('nea') may not return it;
        # the candidate drives the joints through that same actuator
        candidate = replace(candidate, actuator=nominal.actuator)
    windows = make_windows(job.heldout, job.nominal, job.source, job.prediction_steps, 1)
    held = stack_samples(job.heldout, job.nominal, job.source, False)
    scale = state_scale(held.q, held.qd)
    nominal_loss = prediction_error(nominal, windows, scale)
    losses = {'candidate': prediction_error(candidate, windows, scale)
              if candidate.model is not None and candidate.network is None else math.inf,
              'current': prediction_error(job.current, windows, scale)
              if job.current is not None else nominal_loss,
              'nominal': nominal_loss}
    return {'candidate': candidate, 'losses': losses, 'fit_s': fitted - started,
            'score_s': time.perf_counter() - fitted}


@dataclass(frozen=True)
class Decision:
    """
    The record of one refit, for diagnostics and histories.

    :param outcome: ``'accepted'``, ``'refused'``, ``'failed'``, ``'waiting'`` (not enough
        data; nothing fit) or ``'discarded'`` (a reset during the fit).
    :param reason: one line saying why.
    :param warn: whether a user should look (a refused worse candidate, hostile data, a
        failure); False for waiting and for a fit that did not move.
    :param t: newest data time, s.
    :param samples: training samples (memory included).
    :param heldout_samples: held-out samples.
    :param losses: held-out prediction errors of ``candidate``, ``current``, ``nominal``.
    :param driver: the driver check's finding.
    :param checks: reasons the candidate checks gave.
    :param durations: ``fit_s``, ``score_s``, ``total_s`` (wall time, s).
    :param result: the candidate (not part of :meth:`to_dict`).
    """

    outcome: str
    reason: str
    warn: bool = False
    t: float = math.nan
    samples: int = 0
    heldout_samples: int = 0
    losses: Mapping[str, float] = field(default_factory=dict)
    driver: str = ''
    checks: Tuple[str, ...] = ()
    durations: Mapping[str, float] = field(default_factory=dict)
    result: Optional[IdentificationResult] = field(default=None, compare=False, repr=False)

    @property
    def accepted(self) -> bool:
        """Return whether the candidate replaced the model in use."""
        return self.outcome == 'accepted'

    def to_dict(self) -> Dict[str, Any]:
        """
        Return a flat, JSON-ready view (losses as ``<which>_heldout_loss``).

        :return: the record without the candidate.
        """
        out: Dict[str, Any] = {'outcome': self.outcome, 'accepted': self.accepted,
                               'reason': self.reason, 't': self.t, 'samples': self.samples,
                               'heldout_samples': self.heldout_samples, 'driver': self.driver,
                               'checks': list(self.checks)}
        if self.result is not None:
            out['train_loss'] = float(getattr(self.result, 'metrics', {}).get('loss', math.nan))
        out.update({f'{key}_heldout_loss': value for key, value in self.losses.items()})
        out.update(self.durations)
        return out


class DecisionLog:
    """
    What a caller reports of an engine's decisions: the last one, the loss, the refit rate.

    The identifier node turns it into diagnostics; it keeps no model (the engine's
    :attr:`OnlineEngine.current` is the model in use) and no counts (``OnlineEngine.counts``).

    :param rate_window: finished refits the refit rate is measured over.
    """

    def __init__(self, rate_window: int = 20) -> None:
        """Start collecting data, with the nominal model in use."""
        self._finished: deque = deque(maxlen=rate_window)
        self.clear()

    def clear(self) -> None:
        """Forget the last decision and the loss (back to the nominal model)."""
        #: Held-out prediction error of the model in use at the last refit (inf: none yet).
        self.heldout_loss = math.inf
        #: The last decision: ``status`` (one line), ``warn`` and its :meth:`Decision.to_dict`
        #: fields (losses as ``<which>_heldout_loss``, durations, ``duration_s``).
        self.last: Dict[str, Any] = {'status': 'collecting data', 'warn': False}

    def record(self, decision: Decision, now: float) -> None:
        """
        Take one decision.

        :param decision: the engine's decision.
        :param now: a monotonic time, s (the refit rate's clock).
        """
        if decision.outcome == 'waiting':
            self.last = {'status': decision.reason, 'warn': decision.warn}
            return
        report = {key: value for key, value in decision.to_dict().items()
                  if key not in ('outcome', 'accepted', 'reason')}
        report.update(status=f'refit {decision.outcome}: {decision.reason}',
                      warn=decision.warn, duration_s=decision.durations.get('total_s', 0.0))
        if decision.accepted:
            self.heldout_loss = decision.losses['candidate']
        elif 'current' in decision.losses:
            self.heldout_loss = decision.losses['current']
        self._finished.append(float(now))
        self.last = report

    def rate_hz(self) -> float:
        """
        Return the rate of the recent refits that reached a decision on data, Hz.

        :return: 0 with fewer than two.
        """
        finished = list(self._finished)
        if len(finished) < 2 or not finished[-1] > finished[0]:
            return 0.0
        return (len(finished) - 1) / (finished[-1] - finished[0])

    def values(self) -> Dict[str, Any]:
        """
        Return the diagnostics values: the last decision's fields, the loss and the rate.

        :return: ``{'refit_rate_hz', 'heldout_loss', ...}`` (``status`` and ``warn`` left out).
        """
        return {'refit_rate_hz': self.rate_hz(), 'heldout_loss': self.heldout_loss,
                **{key: value for key, value in self.last.items()
                   if key not in ('status', 'warn')}}


# -- execution strategies --------------------------------------------------------------------
def _child_setup() -> None:
    """Child process: one torch thread, and yield the CPU to the caller's stream."""
    torch.set_num_threads(1)
    try:
        os.nice(5)
    except OSError:
        pass


class _Inline:
    """Run the fit on the calling thread."""

    def submit(self, fn: Callable, *args: Any) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args))
        except Exception as error:  # noqa: B902 - handed to the caller with the future
            future.set_exception(error)
        return future

    def close(self) -> None:
        pass


class _Thread:
    """Run fits on one worker thread, one at a time."""

    def __init__(self) -> None:
        self._executor: Optional[ThreadPoolExecutor] = None

    def submit(self, fn: Callable, *args: Any) -> Future:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1)
        return self._executor.submit(fn, *args)

    def close(self) -> None:
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)


class RefitPool:
    """
    One spawned child process running fits, one at a time.

    On a thread of the caller, seconds of torch work hold the interpreter lock, and the
    thread taking ``joint_states`` starves (``benchmarks/ros_loop.py`` measured 24-68 % of a
    1 kHz stream lost); the child (no ROS imported there, one torch thread, lower priority)
    leaves the caller only waiting on a future, which releases the lock.  A child that died
    is replaced at the next fit.
    """

    def __init__(self) -> None:
        """Start nothing yet: the child is spawned on the first fit (torch loads there)."""
        self._executor: Optional[ProcessPoolExecutor] = None

    def submit(self, fn: Callable, *args: Any) -> Future:
        """
        Run ``fn(*args)`` in the child.

        :param fn: a module-level function.
        :param args: its (picklable) arguments.
        :return: the future of its result.
        """
        if self._executor is None:
            self._executor = ProcessPoolExecutor(
                max_workers=1, mp_context=multiprocessing.get_context('spawn'),
                initializer=_child_setup)
        try:
            return self._executor.submit(fn, *args)
        except BrokenProcessPool:
            self.close()
            raise

    def close(self) -> None:
        """Stop the child (a running fit is abandoned)."""
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)


_RUNNERS = {'inline': _Inline, 'thread': _Thread, 'process': RefitPool}


# -- the engine --------------------------------------------------------------------------------
class RefitEngine:
    """
    The refit-and-accept loop without its data: start, poll, decide, count (one for all).

    A subclass says what a refit fits (:meth:`prepare`: a job, or the decision that there is
    none) and how (:attr:`job_function`, a module-level function of the job returning
    ``{'candidate', 'losses': {'candidate', 'current', 'nominal'}, 'fit_s', 'score_s'}``);
    this class runs the job with the execution strategy, accepts a candidate only when its
    held-out loss is below ``(1 - accept_margin)`` times that of the model in use and the
    ``check`` hook finds nothing, and counts the decisions.  :class:`OnlineEngine` (joint
    states of a robot) and :class:`~diffsim_ros.sysid.object_online.ObjectEngine` (tosses of
    an object) are its two users.  A job tells ``end_time`` (newest data, s),
    ``train_samples``, ``heldout_samples`` (:class:`JobSizes`) and ``driver``.

    :param config: options with ``execution``, ``accept_margin`` and ``prediction_steps``.
    :param check: optional candidate checks: reasons to refuse a candidate (empty: none).
    :param loss_label: what the held-out loss is, for the decisions' reasons.
    """

    #: The fit of a job, run by the execution strategy (module level: a child process
    #: unpickles it by name).
    job_function: Callable[[Any], Dict[str, Any]] = staticmethod(evaluate)

    def __init__(self, config: Any, check: Optional[CheckFn] = None,
                 loss_label: str = 'held-out prediction error') -> None:
        """Start with no model in use (the nominal one) and no refit."""
        self.config = config
        self.check = check
        self.loss_label = loss_label
        #: The model in use (None: the nominal one).
        self.current: Optional[Any] = None
        self.counts = {'refits': 0, 'accepted': 0, 'refused': 0, 'failed': 0, 'waiting': 0,
                       'discarded': 0}
        self._generation = 0
        self._runner = _RUNNERS[config.execution]()
        self._pending: Optional[Tuple[Future, Any, dict]] = None
        self._refit_lock = threading.Lock()

    def discard_running(self) -> None:
        """Go back to the nominal model; a fit running now is discarded when it ends."""
        self.current = None
        self._generation += 1

    def restart(self) -> None:
        """Forget the data before the next refit and keep the model in use (subclasses)."""
        raise NotImplementedError

    def reset(self) -> None:
        """Forget the data and go back to the nominal model; a running fit is discarded."""
        self.restart()
        self.discard_running()

    @property
    def busy(self) -> bool:
        """Return whether a fit is running."""
        return self._pending is not None

    def prepare(self) -> Union[Decision, Any]:
        """
        Return the next fit's job, or the decision that there is none (subclasses).

        :return: a job, or a ``'waiting'`` / ``'refused'`` decision.
        """
        raise NotImplementedError

    def start(self) -> Optional[Decision]:
        """
        Start a refit unless one runs: its decision now when there is nothing to fit.

        :return: a decision when it is already made, else None (see :meth:`poll`).
        """
        with self._refit_lock:
            if self._pending is not None:
                return None
            started = time.perf_counter()
            prepared = self.prepare()
            if isinstance(prepared, Decision):
                return self._count(prepared)
            meta = {'started': started, 'generation': self._generation,
                    't': float(prepared.end_time)}
            try:
                future = self._runner.submit(type(self).job_function, prepared)
            except Exception as error:  # noqa: B902 - a broken pool: the next refit retries
                future = Future()
                future.set_exception(error)
            self._pending = (future, prepared, meta)
            return None

    def poll(self) -> Optional[Decision]:
        """
        Return the decision of a finished refit (None while it runs or when none was started).

        :return: the decision, or None.
        """
        with self._refit_lock:
            if self._pending is None or not self._pending[0].done():
                return None
            pending, self._pending = self._pending, None
        return self._decide(*pending)

    def refit(self) -> Decision:
        """
        Run one refit to its decision (waiting for one already running, if any).

        :return: the decision.
        """
        decision = self.start()
        if decision is not None:
            return decision
        with self._refit_lock:
            pending, self._pending = self._pending, None
        if pending is None:   # another thread took it
            return Decision('waiting', 'a refit from another thread took the data')
        try:
            pending[0].result()
        except Exception:  # noqa: B902 - judged in _decide
            pass
        return self._decide(*pending)

    def close(self) -> None:
        """Stop the execution strategy (a running child-process fit is abandoned)."""
        self._runner.close()

    def _count(self, decision: Decision) -> Decision:
        self.counts[decision.outcome] += 1
        return decision

    def _decide(self, future: Future, job: Any, meta: dict) -> Decision:
        common = {'t': meta['t'], 'samples': job.train_samples,
                  'heldout_samples': job.heldout_samples, 'driver': job.driver}
        self.counts['refits'] += 1
        try:
            scores = future.result()
        except BrokenProcessPool as error:
            self._runner.close()
            return self._count(Decision('failed', f'refit failed: {error!r}', warn=True,
                                        **common))
        except Exception as error:  # noqa: B902 - a failed fit must not end the caller
            return self._count(Decision('failed', f'refit failed: {error}', warn=True,
                                        **common))
        durations = {'fit_s': scores['fit_s'], 'score_s': scores['score_s'],
                     'total_s': time.perf_counter() - meta['started']}
        losses, candidate = scores['losses'], scores['candidate']
        new, old = losses['candidate'], losses['current']
        common.update(losses=losses, durations=durations, result=candidate)
        if meta['generation'] != self._generation:
            return self._count(Decision('discarded', 'a reset during the fit discards it',
                                        **common))
        label, margin = self.loss_label, self.config.accept_margin
        if not (math.isfinite(new) and new < (1.0 - margin) * old):
            moved = not new <= old * (1.0 + 1e-9)   # equal: the fit did not move
            return self._count(Decision(
                'refused', f'{label} {new:.4g} vs {old:.4g} of the model in use (margin '
                f'{margin:g})', warn=moved, **common))
        reasons = tuple(str(r) for r in self.check(candidate)) if self.check else ()
        if reasons:
            return self._count(Decision('refused', 'candidate checks: ' + '; '.join(reasons),
                                        warn=True, checks=reasons, **common))
        self.current = candidate
        return self._count(Decision('accepted', f'{label} {new:.4g} vs {old:.4g} of the model '
                                    'in use', **common))


class OnlineEngine(RefitEngine):
    """
    The refit-and-accept loop (see the module docstring); feed :attr:`window`, call refits.

    Thread safety: the window may be fed from one thread while another refits; refits
    themselves run one at a time.

    :param nominal: the nominal model (float64 is used for fits).
    :param config: the options.
    :param check: optional candidate checks: reasons to refuse a candidate (empty: none).
    """

    def __init__(self, nominal: RobotModel, config: OnlineConfig,
                 check: Optional[CheckFn] = None) -> None:
        """Create an empty window and memory; the model in use is the nominal one."""
        super().__init__(config, check,
                         f'held-out {config.prediction_steps}-step prediction error')
        self.nominal = nominal.to(dtype=torch.float64)
        self.window = SampleWindow(config.window, config.max_samples)
        self.memory = SegmentMemory(self.nominal, config.memory_segments,
                                    config.memory_segment, config.memory_max_age)
        self._forget = False

    # -- state -----------------------------------------------------------------------------
    def restart(self) -> None:
        """Empty the window and forget the memory before the next refit (a jump in time)."""
        self.window.clear()
        self._forget = True

    def adopt(self, model: Union[RobotModel, IdentificationResult]) -> None:
        """
        Make a model from elsewhere the model in use (with the estimator's actuator).

        :param model: a model, or a result with one.
        """
        if isinstance(model, IdentificationResult):
            self.current = model
            return
        cfg = self.config.estimator_config
        source = cfg.source if cfg.source != 'auto' else \
            ('u' if cfg.actuator != 'none' else 'tau')
        self.current = replace(nominal_result(self.nominal, cfg, source), method='external',
                               model=model.to(dtype=torch.float64))

    # -- refits ----------------------------------------------------------------------------
    def prepare(self) -> Union[Decision, RefitJob]:
        """
        Run steps 2-5 on the window: the fit's job, or the decision that there is none.

        :return: a :class:`RefitJob`, or a ``'waiting'`` / ``'refused'`` decision.
        """
        config, cfg = self.config, self.config.estimator_config
        try:
            runs = window_runs(self.window, self.nominal.joint_names, config)
        except ValueError as error:
            return Decision('waiting', str(error))
        usable = usable_runs(runs, self.nominal, config)
        t = float(runs[-1].t[-1])
        train, heldout = split_newest(usable, config.holdout_fraction,
                                      config.prediction_steps + 1)
        if not train or not heldout:
            return Decision('waiting', 'not enough data away from the joint limits', t=t)
        try:
            source = resolve_source(usable, cfg.source, cfg.actuator != 'none')
        except ValueError as error:
            return Decision('waiting', str(error), t=t)
        nominal = nominal_result(self.nominal, cfg, source)
        models = [nominal] + ([self.current] if self.current is not None else [])
        driver = driver_check(usable, models, source, config.driver_block,
                              config.max_unexplained)
        if self._forget:
            self._forget = False
            self.memory.clear()
        if driver.verdict == 'inconsistent':
            return Decision('refused', f'refused before fitting: {driver.reason}', warn=True,
                            t=t, driver=driver.reason)
        # the memory's cells from before the window join the training data; the held-out
        # part stays the newest data, which the model must predict
        remembered = self.memory.runs(before=float(runs[0].t[0]))
        self.memory.offer(usable)   # unsplit: cells across the cut count
        train = remembered + train
        warm = self.current if config.warm_start else None
        return RefitJob(config.estimator, self.nominal, cfg, source, tuple(train),
                        tuple(heldout), self.current, warm, config.prediction_steps,
                        driver.reason)
