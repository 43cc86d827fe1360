"""
The model gate: a published model reaches a motor only if it is plausible and predicts well.

A node that uses models sent by the identifier (the mpc, the monitor) passes every document
through :class:`ModelGate`:

1. it must load (:func:`~diffsim_ros.robots.message.load_model_message`: this robot, every
   parameter, finite numbers);
2. every parameter must lie within its plausibility bounds and the model must be physically
   consistent (:meth:`~diffsim_ros.robots.interface.RobotInterface.check_model`);
3. it must predict the last ``duration`` seconds of what the node measured (its own joint
   states and the commands it sent, kept in :class:`RecentData`) no worse than the model in
   use: k-step open-loop rollouts (``horizon`` seconds each, one batched
   :func:`~diffsim_ros.core.rollout` through the interface's command map) from measured
   states, errors normalised per state coordinate by the variances of the data
   (:func:`~diffsim_ros.sysid.losses.state_scale`), and the candidate's normalised error
   must not exceed ``(1 + margin)`` times the current model's.  Each model is rolled out
   with its own extra friction module (a fit's sigmoid or Stribeck friction), if it has one.

When the node holds less than ``min_duration`` seconds of data (0: the smaller of 1 s and
``duration``), or the data are still (no joint velocity varies by more than
``still_velocity``), the prediction test cannot tell the models apart: the model is then
accepted on bounds and consistency alone, and the decision says so (the nodes show it in
their diagnostics).  A model that is never compared is still never out of bounds.

A refused model is counted, logged through a :class:`~diffsim_ros.nodes.convert`
``ThrottledLogger``-like object (``warn(key, text)``), and its reason is kept as
:attr:`ModelGate.warning` for ``warn_hold`` seconds so diagnostics show WARN; the node keeps
its last good model.  Judging runs on the gate's own thread: a rollout never delays the
node's command loop.
"""

from collections import deque
from dataclasses import dataclass, field
import math
import threading
import time
from typing import Any, Callable, Deque, Dict, Optional, Tuple

import numpy as np
import torch
from torch import nn

from .interface import RobotInterface
from .message import load_model_message, ModelMessageError
from .prediction import mean_commands, nearest_samples
from ..core.integrators import rollout
from ..core.model import RobotModel
from ..sysid.losses import normalized_mse, state_scale, wrap_angle_error

__all__ = ['ModelGateConfig', 'GateDecision', 'ModelGate', 'RecentData', 'judge_model',
           'prediction_error']

Accept = Callable[[RobotModel, Optional[nn.Module], Optional[nn.Module], 'GateDecision'], None]


@dataclass(frozen=True)
class ModelGateConfig:
    """
    Parameters of the model gate (``model_gate.*`` of the mpc and the monitor).

    What a published model must pass before a node uses it (module docstring).  Each field
    is one ROS parameter; its metadata hold the description and the range (inclusive, None
    for an open side) that ``--help`` and the parameter descriptors show.

    :raises ValueError: a value out of range, ``dt <= horizon <= duration`` violated, or a
        non-zero ``min_duration`` outside ``[horizon, duration]`` (the error names the field).
    """

    # metadata written out: robots/ may not import nodes.params.meta (layers point down)
    margin: float = field(default=0.25, metadata={
        'description': 'a new model may predict the recent data this fraction worse than the '
                       'model in use (0 = no worse)', 'range': (0.0, None)})
    duration: float = field(default=3.0, metadata={
        'description': 'seconds of recent states and commands kept, which a new model must '
                       'predict', 'range': (0.0, 60.0)})
    min_duration: float = field(default=0.0, metadata={
        'description': 'with less recent data than this (s) predictions cannot tell models '
                       'apart: a model is then accepted on its bounds and consistency alone; '
                       '0 = the smaller of 1 s and duration (at least horizon)',
        'range': (0.0, 60.0)})
    horizon: float = field(default=0.2, metadata={
        'description': 'length of each open-loop prediction of the recent data, s',
        'range': (0.0, 10.0)})
    dt: float = field(default=0.01, metadata={
        'description': 'rollout step of the predictions, s (<= horizon)', 'range': (0.0, 1.0)})
    still_velocity: float = field(default=1e-3, metadata={
        'description': 'recent data whose joint velocities all vary less than this (standard '
                       'deviation, rad/s or m/s) are still: predictions cannot tell models '
                       'apart', 'range': (0.0, None)})
    warn_hold: float = field(default=10.0, metadata={
        'description': 'seconds a refused model keeps the diagnostics at WARN',
        'range': (0.0, 3600.0)})

    def __post_init__(self) -> None:
        """Reject non-finite, negative or inconsistent values, naming the field first."""
        for name in ('margin', 'duration', 'min_duration', 'horizon', 'dt', 'still_velocity',
                     'warn_hold'):
            value = getattr(self, name)
            open_zero = name in ('margin', 'min_duration', 'still_velocity')
            if not (isinstance(value, (int, float)) and math.isfinite(value)
                    and (value >= 0 if open_zero else value > 0)):
                raise ValueError(f'model gate: {name} must be finite and '
                                 f'{">= 0" if open_zero else "> 0"}, got {value!r}')
        if self.dt > self.horizon:
            raise ValueError(f'model gate: dt must not exceed horizon ({self.horizon} s), '
                             f'got {self.dt!r}')
        if self.min_duration and self.min_duration < self.horizon:
            # less than one prediction window could never be judged: every model refused
            raise ValueError(f'model gate: min_duration must be 0 or >= horizon '
                             f'({self.horizon} s), got {self.min_duration!r}')
        if self.min_duration > self.duration:
            raise ValueError(f'model gate: min_duration must not exceed duration '
                             f'({self.duration} s), got {self.min_duration!r}')
        if self.duration < self.horizon:
            raise ValueError(f'model gate: duration must be >= horizon ({self.horizon} s), '
                             f'got {self.duration!r}')

    @property
    def compare_after(self) -> float:
        """
        Return the seconds of recent data the prediction test needs.

        :return: ``min_duration``, or with 0 the smaller of 1 s and ``duration`` (never less
            than ``horizon``).
        """
        return self.min_duration or max(min(1.0, self.duration), self.horizon)


@dataclass(frozen=True)
class GateDecision:
    """
    What the gate decided about one model.

    :param accepted: whether the model may be used.
    :param reasons: why it was refused (empty when accepted).
    :param compared: whether the prediction test ran (enough, moving data).
    :param note: one line for diagnostics.
    :param candidate_error: normalised prediction error of the candidate (nan if not run).
    :param current_error: the same for the model in use.
    """

    accepted: bool
    reasons: Tuple[str, ...] = ()
    compared: bool = False
    note: str = ''
    candidate_error: float = math.nan
    current_error: float = math.nan


class RecentData:
    """
    The last seconds of measured states and sent commands, thread-safe, bounded in memory.

    :param duration: seconds kept.
    :param rate_hz: the fastest expected rate of either stream (sizes the ring buffers).
    """

    def __init__(self, duration: float, rate_hz: float) -> None:
        size = int(2.0 * duration * rate_hz) + 16
        self.duration = float(duration)
        self._states: Deque[Tuple[float, np.ndarray, np.ndarray]] = deque(maxlen=size)
        self._commands: Deque[Tuple[float, np.ndarray]] = deque(maxlen=size)
        self._lock = threading.Lock()

    def add_state(self, t: float, q: np.ndarray, qd: np.ndarray) -> None:
        """
        Record a measured state (a repeated time is skipped; an older one restarts the buffer).

        :param t: time, s (the node clock).
        :param q: positions ``(n,)``.
        :param qd: velocities ``(n,)``.
        """
        with self._lock:
            if self._states and t == self._states[-1][0]:
                return   # a simulated clock that has not advanced: one state per time
            if self._states and t < self._states[-1][0]:   # the clock jumped back
                self._states.clear()
                self._commands.clear()
            self._states.append((float(t), np.array(q, dtype=np.float64),
                                 np.array(qd, dtype=np.float64)))

    def add_command(self, t: float, u: np.ndarray) -> None:
        """
        Record a command sent (or seen) at time ``t``.

        :param t: time, s (same clock as the states).
        :param u: command ``(m,)``.
        """
        with self._lock:
            if not self._commands or t >= self._commands[-1][0]:
                self._commands.append((float(t), np.array(u, dtype=np.float64)))

    def snapshot(self, m: int) -> Dict[str, np.ndarray]:
        """
        Return the data of the last ``duration`` seconds as arrays.

        :param m: command dimension (for an empty command array).
        :return: ``t (N,)``, ``q``/``qd (N, n)``, ``t_cmd (M,)``, ``u (M, m)``.
        """
        with self._lock:
            states, commands = list(self._states), list(self._commands)
        if not states:
            return {'t': np.zeros(0), 'q': np.zeros((0, 0)), 'qd': np.zeros((0, 0)),
                    't_cmd': np.zeros(0), 'u': np.zeros((0, m))}
        start = states[-1][0] - self.duration
        states = [s for s in states if s[0] >= start]
        return {'t': np.array([s[0] for s in states]),
                'q': np.stack([s[1] for s in states]), 'qd': np.stack([s[2] for s in states]),
                't_cmd': np.array([c[0] for c in commands]),
                'u': np.stack([c[1] for c in commands]) if commands else np.zeros((0, m))}


def prediction_error(interface: RobotInterface, model: RobotModel,
                     actuator: Optional[nn.Module], data: Dict[str, np.ndarray],
                     horizon: float, dt: float, scale: torch.Tensor,
                     friction: Optional[nn.Module] = None) -> float:
    """
    Return the normalised k-step open-loop prediction error of a model on recorded data.

    The data are resampled on a grid of step ``dt`` ending at the newest state (nearest
    measurement, no interpolation across wrapped angles) and cut into windows of
    ``round(horizon / dt)`` steps; each window is rolled out (RK4, mean commands per step)
    from its measured first state, all windows in one batch.

    :param interface: the robot's interface (command map).
    :param model: the model.
    :param actuator: its motor model, or ``None`` for the nominal one.
    :param data: :meth:`RecentData.snapshot` arrays.
    :param horizon: window length, s.
    :param dt: step, s.
    :param scale: ``(2 n,)`` state variances normalising the errors.
    :param friction: the model's extra friction module, or ``None``.
    :return: mean squared normalised error; ``inf`` if a rollout diverged.
    :raises ValueError: the data hold less than one window.
    """
    t = data['t']
    steps = max(1, int(round(horizon / dt)))
    count = int((t[-1] - t[0]) / dt + 1e-9) // steps if len(t) > 1 else 0
    if count < 1:
        raise ValueError('less data than one prediction window')
    grid = t[-1] - dt * np.arange(count * steps, -1, -1)
    index = nearest_samples(t, grid)
    m = len(interface.command_joints)
    controls = mean_commands(data['t_cmd'], data['u'], grid, m)
    x = torch.as_tensor(np.concatenate((data['q'][index], data['qd'][index]), axis=1),
                        dtype=model.dtype)
    x0 = x[:-1:steps]
    targets = x[1:].reshape(count, steps, -1)
    controls = torch.as_tensor(controls, dtype=model.dtype).reshape(count, steps, m)
    with torch.no_grad():
        states = rollout(model, x0, controls, dt, 'rk4',
                         interface.torque_fn(model, actuator, friction=friction))
    if not bool(torch.isfinite(states).all()):
        return math.inf
    error = wrap_angle_error(states[:, 1:] - targets, model.tree.revolute_mask)
    value = float(normalized_mse(error, scale.to(error)))
    return value if math.isfinite(value) else math.inf


def judge_model(interface: RobotInterface, candidate: RobotModel,
                candidate_actuator: Optional[nn.Module], current: RobotModel,
                current_actuator: Optional[nn.Module], data: Dict[str, np.ndarray],
                config: ModelGateConfig, use_actuator: bool = True,
                candidate_friction: Optional[nn.Module] = None,
                current_friction: Optional[nn.Module] = None) -> GateDecision:
    """
    Decide whether a candidate model may replace the current one (module docstring).

    :param interface: the robot's interface.
    :param candidate: the model received.
    :param candidate_actuator: its motor model, or ``None``.
    :param current: the model in use.
    :param current_actuator: its motor model, or ``None`` (nominal).
    :param data: recent measurements (:meth:`RecentData.snapshot`).
    :param config: gate settings.
    :param use_actuator: predict with the candidate's motor model (False: the node keeps the
        nominal motor, so the candidate is judged with it; its constants are still bounded).
    :param candidate_friction: the candidate's extra friction module, or ``None``.
    :param current_friction: the extra friction module in use, or ``None``.
    :return: the decision.
    """
    problems = interface.check_model(candidate, candidate_actuator, candidate_friction)
    if problems:
        return GateDecision(False, tuple(problems), note=f'refused: {problems[0]}')
    t = data['t']
    span = float(t[-1] - t[0]) if len(t) > 1 else 0.0
    if span < config.compare_after:
        return GateDecision(True, note=f'accepted on bounds and consistency only: '
                            f'{span:.2f} s of recent data, {config.compare_after:g} s needed '
                            'to compare predictions')
    velocity_std = data['qd'].std(axis=0)
    if float(velocity_std.max()) < config.still_velocity:
        return GateDecision(True, note='accepted on bounds and consistency only: the robot '
                            'held still, so predictions cannot tell the models apart')
    mask = current.tree.revolute_mask.to(torch.float64)
    scale = state_scale(torch.as_tensor(data['q']), torch.as_tensor(data['qd']), mask)
    errors = [prediction_error(interface, model, actuator, data, config.horizon, config.dt,
                               scale, friction)
              for model, actuator, friction in (
                  (candidate, candidate_actuator if use_actuator else None, candidate_friction),
                  (current, current_actuator, current_friction))]
    new, old = errors
    if new <= (1.0 + config.margin) * old or (math.isinf(old) and math.isfinite(new)):
        return GateDecision(True, compared=True, candidate_error=new, current_error=old,
                            note=f'accepted: prediction error {new:.3g} vs {old:.3g} '
                            f'of the model in use over {span:.1f} s')
    reason = (f'predicts the last {span:.1f} s worse than the model in use: normalised '
              f'error {new:.3g} vs {old:.3g} (margin {config.margin:.0%})')
    return GateDecision(False, (reason,), compared=True, candidate_error=new,
                        current_error=old, note=f'refused: {reason}')


class ModelGate:
    """
    Judge model documents on a thread of its own and hand accepted models to the node.

    :param interface: the robot's interface.
    :param config: gate settings.
    :param rate_hz: fastest rate of the recorded streams (the driver's rate).
    :param log: object with ``warn(key, text)`` (a ``ThrottledLogger``) for refusals.
    :param use_actuator: whether the node uses the motor model sent with the model.
    :param clock: monotonic clock for :attr:`warning`'s hold time.
    """

    def __init__(self, interface: RobotInterface, config: ModelGateConfig, rate_hz: float,
                 log: Any, use_actuator: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interface = interface
        self.config = config
        self.recent = RecentData(config.duration, rate_hz)
        self.use_actuator = bool(use_actuator)
        self.accepted = self.refused = self.unjudged = self.superseded = 0
        self.last_note = 'no model received'
        self._log, self._clock = log, clock
        self._refused_at = -math.inf
        self._last_refusal = ''
        self._pending: Optional[tuple] = None
        self._pending_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name='model-gate', daemon=True)
        self._thread.start()

    @property
    def warning(self) -> str:
        """Return the last refusal while it is recent (``warn_hold``), else ``''``."""
        if self._clock() - self._refused_at <= self.config.warn_hold:
            return self._last_refusal
        return ''

    def submit(self, text: str, current: RobotModel, current_actuator: Optional[nn.Module],
               on_accept: Accept, on_refuse: Optional[Callable[[str], None]] = None,
               current_friction: Optional[nn.Module] = None) -> None:
        """
        Queue a document for judging (a newer one replaces one still queued: counted).

        :param text: the document's JSON text, as received.
        :param current: the model in use (read when judging starts is fine: models are
            immutable).
        :param current_actuator: its motor model, or ``None``.
        :param on_accept: called on the gate's thread with ``(model, actuator, friction,
            decision)`` (``friction``: the document's extra friction module or ``None``).
        :param on_refuse: called on the gate's thread with the reason.
        :param current_friction: the extra friction module in use, or ``None``.
        """
        job = (text, current, current_actuator, current_friction, on_accept, on_refuse)
        with self._pending_lock:
            self._pending, replaced = job, self._pending
        self.superseded += replaced is not None
        self._wake.set()

    def judge(self, text: str, current: RobotModel, current_actuator: Optional[nn.Module],
              current_friction: Optional[nn.Module] = None
              ) -> Tuple[GateDecision, Any, Any, Any]:
        """
        Judge one document now, on the caller's thread.

        :param text: the document's JSON text.
        :param current: the model in use.
        :param current_actuator: its motor model, or ``None``.
        :param current_friction: its extra friction module, or ``None``.
        :return: ``(decision, model, actuator, friction)``, ``None`` where absent.
        """
        try:
            model, actuator, friction = load_model_message(text, self.interface)
        except ModelMessageError as error:
            return GateDecision(False, (f'not a model of this robot: {error}',),
                                note=f'refused: {error}'), None, None, None
        data = self.recent.snapshot(len(self.interface.command_joints))
        decision = judge_model(self.interface, model, actuator, current, current_actuator,
                               data, self.config, self.use_actuator, friction,
                               current_friction)
        return decision, model, actuator, friction

    def _refuse(self, reason: str, on_refuse) -> None:
        self.refused += 1
        self._refused_at, self._last_refusal = self._clock(), f'model refused: {reason}'
        self.last_note = self._last_refusal
        self._log.warn('model', f'{self._last_refusal}; keeping the model in use')
        if on_refuse is not None:
            on_refuse(reason)

    def _run(self) -> None:
        while not self._stop.is_set():
            # no polling timeout: close() wakes it; a thread waking to poll takes the GIL,
            # and preempted while holding it, it stalls a real-time command loop (mpc)
            self._wake.wait()
            self._wake.clear()
            with self._pending_lock:
                job, self._pending = self._pending, None
            if job is None:
                continue
            text, current, current_actuator, current_friction, on_accept, on_refuse = job
            try:
                decision, model, actuator, friction = self.judge(text, current,
                                                                 current_actuator,
                                                                 current_friction)
            except Exception as error:  # noqa: BLE001 - a model that breaks a check is refused
                self._refuse(f'could not be judged: {error!r}', on_refuse)
                continue
            if not decision.accepted:
                self._refuse('; '.join(decision.reasons[:3]), on_refuse)
                continue
            self.accepted += 1
            self.unjudged += not decision.compared
            self.last_note = decision.note
            self._refused_at = -math.inf
            on_accept(model, actuator if self.use_actuator else None, friction, decision)

    def diagnostics(self) -> Dict[str, Any]:
        """
        Return the gate's counters and last note for ``/diagnostics``.

        :return: ``models_refused``, ``models_accepted_without_comparison``,
            ``models_superseded`` (replaced by a newer one before being judged) and
            ``model_gate`` (the last decision in words).
        """
        return {'models_refused': self.refused,
                'models_accepted_without_comparison': self.unjudged,
                'models_superseded': self.superseded,
                'model_gate': self.last_note}

    def close(self) -> None:
        """Stop the gate's thread."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
