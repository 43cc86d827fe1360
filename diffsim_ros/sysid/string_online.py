"""
Learning the ball-in-a-cup string online: joint states and ball positions in, the string out.

The identifier's cup mode (``nodes/identifier.py`` with a ``string_topic``) feeds this module
the joint states and ball positions its gates accepted; the arm itself is refitted by the
identifier's usual :class:`~diffsim_ros.sysid.online.OnlineEngine`, the string here by the
same refit engine (:class:`~diffsim_ros.sysid.online.RefitEngine`, its string side).  Together
they are :func:`~diffsim_ros.sysid.string_model.fit_cup_model`'s two halves, run as data
arrive.  The module imports no ROS.

**Window** (:class:`StringEngine`): states ``(t, q, qd)`` and ball positions ``(t, x)`` of the
last ``window`` s.  Once it spans ``min_window`` s, a snapshot is taken each ``refit_every`` s
of new ball positions; snapshots are fit in their order, so what is fit depends only on the
stream, never on the machine's speed.

**Runs** (:func:`ball_runs`): the ball's stamps are cut at gaps above ``max_gap`` s; each piece
is resampled on a uniform grid at the median ball interval (positions linear in time) and the
joint states are interpolated onto it (linear).  The newest ``holdout_fraction`` of the newest
run is held out; the rest is trained on.

**Fit and acceptance** (:func:`evaluate_string`): :func:`~diffsim_ros.sysid.string_model.
fit_string` started at the string in use (the nominal one first), then the candidate, the
string in use and the nominal string each predict the held-out ball open loop from observed
states (:func:`ball_prediction_error`: windows of ``prediction_steps`` samples every half
window, the cup's motion from the measured joints, mean squared position error); the candidate
replaces the string in use when its error is lower (the engine's rule).  Standard deviations:
``bootstrap`` more fits, each on a resample (with replacement) of the training runs cut in
``bootstrap_blocks`` blocks, started at the candidate with the fit's iterations scaled by
``bootstrap_scale``; the std over them.  Warm-started and shortened, they understate the
spread of independent fits: read them as lower bounds.
"""

from collections import deque
from dataclasses import dataclass, field
import math
import time
from typing import Any, Deque, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

from .filters import savgol_derivative
from .online import Decision, EXECUTIONS, JobSizes, RefitEngine
from .string_model import fit_string, StringModel
from ..core.model import RobotModel

__all__ = ['BallRun', 'StringEngine', 'StringJob', 'StringOnlineConfig', 'StringResult',
           'UNITS', 'ball_prediction_error', 'ball_runs', 'evaluate_string', 'string_values']

#: Units of the named string parameters.
UNITS = {'string_length': 'm', 'cup_x': 'm', 'cup_y': 'm', 'cup_z': 'm', 'cup_roll': 'rad',
         'cup_pitch': 'rad', 'cup_yaw': 'rad', 'friction': '1/s'}


@dataclass(frozen=True)
class StringOnlineConfig:
    """
    Options of :class:`StringEngine` (module docstring; the identifier's ``string.*``).

    :param window: seconds of states and ball positions kept.
    :param min_window: seconds of ball positions a refit needs.
    :param refit_every: seconds of new ball positions between refits.
    :param holdout_fraction: newest fraction of the newest run held out.
    :param max_gap: a longer step between ball stamps cuts a run, s.
    :param horizon: rollout steps of the fit's second stage (``fit_string``).
    :param stride: steps between its windows' starts.
    :param batch_windows: windows per iteration.
    :param geometry_iterations: Adam steps of the first stage.
    :param iterations: Adam steps of the second stage.
    :param prediction_steps: samples of the held-out open-loop predictions.
    :param bootstrap: resampled fits for the standard deviations (0: none).
    :param bootstrap_blocks: blocks the training runs are cut into for the resamples.
    :param bootstrap_scale: fraction of the fit's iterations each resampled fit runs.
    :param seed: seed of the fits (each refit adds its number).
    :param accept_margin: relative improvement a candidate needs.
    :param execution: one of :data:`~diffsim_ros.sysid.online.EXECUTIONS`.
    """

    window: float = 40.0
    min_window: float = 12.0
    refit_every: float = 10.0
    holdout_fraction: float = 0.25
    max_gap: float = 0.05
    horizon: int = 100
    stride: int = 20
    batch_windows: int = 64
    geometry_iterations: int = 300
    iterations: int = 60
    prediction_steps: int = 250
    bootstrap: int = 3
    bootstrap_blocks: int = 6
    bootstrap_scale: float = 0.3
    seed: int = 0
    accept_margin: float = 0.0
    execution: str = field(default='process')

    def __post_init__(self) -> None:
        """Validate the numbers and the execution."""
        if self.execution not in EXECUTIONS:
            raise ValueError(f'execution must be one of {", ".join(EXECUTIONS)}; got '
                             f'{self.execution!r}')
        for name in ('window', 'min_window', 'refit_every', 'max_gap'):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise ValueError(f'{name} must be finite and > 0, got {getattr(self, name)!r}')
        if self.min_window > self.window:
            raise ValueError(f'min_window ({self.min_window}) exceeds window ({self.window})')
        if not 0 < self.holdout_fraction < 1:
            raise ValueError(f'holdout_fraction must be in (0, 1), got {self.holdout_fraction}')
        for name in ('horizon', 'stride', 'batch_windows', 'geometry_iterations',
                     'prediction_steps', 'bootstrap_blocks'):
            if getattr(self, name) < 1:
                raise ValueError(f'{name} must be >= 1, got {getattr(self, name)}')
        if self.iterations < 0 or self.bootstrap < 0:
            raise ValueError('iterations and bootstrap must be >= 0')
        if not 0 < self.bootstrap_scale <= 1:
            raise ValueError(f'bootstrap_scale must be in (0, 1], got {self.bootstrap_scale}')
        if not (math.isfinite(self.accept_margin) and self.accept_margin >= 0):
            raise ValueError(f'accept_margin must be >= 0, got {self.accept_margin!r}')


@dataclass(frozen=True)
class BallRun:
    """
    Joint states and ball positions on one uniform grid (what ``fit_string`` reads).

    :ivar t: ``(T,)`` s; :ivar q: ``(T, n)`` rad; :ivar qd: ``(T, n)`` rad/s;
    :ivar ball: ``(T, 3)`` m, world.
    """

    t: np.ndarray
    q: np.ndarray
    qd: np.ndarray
    ball: np.ndarray

    def __len__(self) -> int:
        """Return the number of samples."""
        return int(self.t.shape[0])

    def piece(self, start: int, stop: int) -> 'BallRun':
        """
        Return the samples ``start:stop``.

        :param start: first index; :param stop: one past the last.
        :return: the piece.
        """
        return BallRun(self.t[start:stop], self.q[start:stop], self.qd[start:stop],
                       self.ball[start:stop])


def ball_runs(states: Sequence[tuple], balls: Sequence[tuple], max_gap: float) -> List[BallRun]:
    """
    Return the uniform runs of a window's states and ball positions (module docstring).

    :param states: ``[(t, q (n,), qd (n,))]`` in stamp order.
    :param balls: ``[(t, x (3,))]`` in stamp order.
    :param max_gap: a longer step between ball stamps cuts a run, s.
    :return: runs of at least 3 samples, each within the states' time span.
    """
    if len(states) < 2 or len(balls) < 3:
        return []
    t_state = np.array([s[0] for s in states])
    q = np.array([s[1] for s in states])
    qd = np.array([s[2] for s in states])
    t_ball = np.array([b[0] for b in balls])
    x = np.array([b[1] for b in balls])
    inside = (t_ball >= t_state[0]) & (t_ball <= t_state[-1])
    t_ball, x = t_ball[inside], x[inside]
    if len(t_ball) < 3:
        return []
    cuts = np.flatnonzero(np.diff(t_ball) > max_gap) + 1
    runs = []
    for piece_t, piece_x in zip(np.split(t_ball, cuts), np.split(x, cuts)):
        if len(piece_t) < 3:
            continue
        dt = float(np.median(np.diff(piece_t)))
        grid = piece_t[0] + dt * np.arange(int(np.floor((piece_t[-1] - piece_t[0]) / dt
                                                        + 1e-6)) + 1)

        def at(values: np.ndarray, t: np.ndarray = t_state) -> np.ndarray:
            return np.stack([np.interp(grid, t, column) for column in values.T], -1)

        runs.append(BallRun(grid, at(q), at(qd), at(piece_x, piece_t)))
    return runs


def string_values(model: StringModel) -> Dict[str, float]:
    """
    Return the named parameters of a string model (:data:`UNITS`).

    :param model: the model.
    :return: ``{name: value}``.
    """
    with torch.no_grad():
        xyz, rpy = (v.detach().double().tolist() for v in (model.cup_xyz, model.cup_rpy))
        return {'string_length': float(model.string_length), 'cup_x': xyz[0], 'cup_y': xyz[1],
                'cup_z': xyz[2], 'cup_roll': rpy[0], 'cup_pitch': rpy[1], 'cup_yaw': rpy[2],
                'friction': float(model.friction)}


def _model(robot: RobotModel, values: Mapping[str, float]) -> StringModel:
    """Return the string model of named values on ``robot``."""
    return StringModel(robot, values['string_length'],
                       (values['cup_x'], values['cup_y'], values['cup_z']),
                       (values['cup_roll'], values['cup_pitch'], values['cup_yaw']),
                       values['friction'])


@dataclass(frozen=True)
class StringResult:
    """
    A learned string with its named parameters, their spread and its held-out error.

    :ivar values: :func:`string_values` of it.
    :ivar std: per name, the std over the bootstrap fits (absent: no bootstrap).
    :ivar heldout: ``position_rms_m`` of its held-out prediction.
    :ivar method: ``'diffnea'`` (the string model) or ``'nominal'``.
    """

    values: Mapping[str, float]
    std: Mapping[str, float] = field(default_factory=dict)
    heldout: Mapping[str, float] = field(default_factory=dict)
    method: str = 'diffnea'

    @property
    def metrics(self) -> Dict[str, float]:
        """Return the held-out error (the engine's decisions report it)."""
        return dict(self.heldout)

    def to_dict(self) -> Dict[str, Any]:
        """
        Return the JSON-ready document: method, parameters with unit and std, errors.

        :return: ``{'method', 'parameters': {name: {'value', 'unit'[, 'std']}}, 'heldout'}``.
        """
        parameters = {}
        for name, value in self.values.items():
            entry = {'value': value, 'unit': UNITS[name]}
            if name in self.std:
                entry['std'] = self.std[name]
            parameters[name] = entry
        return {'method': self.method, 'parameters': parameters, 'heldout': dict(self.heldout)}


def ball_prediction_error(model: StringModel, runs: Sequence[BallRun], steps: int) -> float:
    """
    Return the mean squared open-loop ball prediction error on runs (module docstring).

    Windows of ``steps`` samples start every ``steps // 2`` samples; each starts from the
    observed position and its Savitzky-Golay velocity (15 Hz cutoff), the cup moving as the
    measured joints (their accelerations differentiated the same way) move it.

    :param model: the string model.
    :param runs: uniform runs (one sample interval).
    :param steps: samples per window (runs shorter than that give one shorter window).
    :return: m^2 per sample (inf without a window of 3 samples or more).
    """
    squared, count = 0.0, 0
    with torch.no_grad():
        for run in runs:
            if len(run) < 11:
                continue
            t = torch.as_tensor(run.t, dtype=torch.float64)
            ball = torch.as_tensor(run.ball, dtype=torch.float64)
            qd = torch.as_tensor(run.qd, dtype=torch.float64)
            qdd = savgol_derivative(qd, t, 1, cutoff_hz=15.0).to(torch.float64)
            velocity = savgol_derivative(ball, t, 1, cutoff_hz=15.0).to(torch.float64)
            p, v, a = model.cup_motion(torch.as_tensor(run.q, dtype=torch.float64), qd, qdd)
            dt = float((t[-1] - t[0]) / (len(t) - 1))
            length = min(steps, len(run))
            starts = list(range(0, len(run) - length + 1, max(1, length // 2)))
            index = torch.tensor(starts)[:, None] + torch.arange(length)
            x, _ = model.rollout(ball[starts], velocity[starts], p[index], v[index],
                                 a[index], dt)
            squared += float(((x - ball[index]) ** 2).sum(-1).sum())
            count += index.numel()
    return squared / count if count else math.inf


@dataclass(frozen=True)
class StringJob(JobSizes):
    """
    One refit of the string, picklable for a child process.

    :ivar robot: the arm's nominal model (its kinematics carry the cup).
    :ivar nominal: named values of the nominal string.
    :ivar current: the result in use (None: the nominal string).
    :ivar train: training runs.
    :ivar heldout: held-out runs.
    :ivar config: the options.
    :ivar seed: seed of this refit's fits.
    """

    robot: RobotModel
    nominal: Mapping[str, float]
    current: Optional[StringResult]
    train: Tuple[BallRun, ...]
    heldout: Tuple[BallRun, ...]
    config: StringOnlineConfig
    seed: int
    driver: str = ''


def _fit(job: StringJob, start: StringModel, runs: Sequence[BallRun], seed: int,
         scale: float = 1.0) -> StringModel:
    """Return ``fit_string`` of runs from ``start`` with the job's options."""
    c = job.config
    fitted, _ = fit_string(list(runs), start, horizon=c.horizon, stride=c.stride,
                           batch_windows=c.batch_windows,
                           geometry_iterations=max(1, int(round(scale * c.geometry_iterations))),
                           iterations=int(round(scale * c.iterations)), seed=seed)
    return fitted


def evaluate_string(job: StringJob) -> Dict[str, Any]:
    """
    Fit a candidate, its bootstrap spread, and score it, the string in use and the nominal.

    :param job: the refit.
    :return: ``candidate`` (:class:`StringResult`), ``losses`` (``candidate``, ``current``,
        ``nominal``: :func:`ball_prediction_error` on the held-out runs, m^2), ``fit_s``,
        ``score_s``.
    """
    started = time.perf_counter()
    start = _model(job.robot, job.current.values if job.current is not None else job.nominal)
    fitted = _fit(job, start, job.train, job.seed)
    values = string_values(fitted)
    pieces = [run.piece(int(idx[0]), int(idx[-1]) + 1) for run in job.train
              for idx in np.array_split(np.arange(len(run)), job.config.bootstrap_blocks)
              if len(idx) > job.config.horizon + 1]
    samples = []
    generator = torch.Generator().manual_seed(job.seed)
    for b in range(job.config.bootstrap if pieces else 0):
        pick = torch.randint(len(pieces), (len(pieces),), generator=generator).tolist()
        again = _fit(job, _model(job.robot, values), [pieces[i] for i in pick],
                     job.seed + 1 + b, job.config.bootstrap_scale)
        samples.append(string_values(again))
    std = {name: float(np.std([s[name] for s in samples], ddof=1)) for name in values} \
        if len(samples) > 1 else {}
    fitted_at = time.perf_counter()
    steps = job.config.prediction_steps
    loss = ball_prediction_error(fitted, job.heldout, steps)
    nominal = ball_prediction_error(_model(job.robot, job.nominal), job.heldout, steps)
    current = ball_prediction_error(_model(job.robot, job.current.values), job.heldout, steps) \
        if job.current is not None else nominal
    return {'candidate': StringResult(values, std, {'position_rms_m': math.sqrt(loss)}),
            'losses': {'candidate': loss, 'current': current, 'nominal': nominal},
            'fit_s': fitted_at - started, 'score_s': time.perf_counter() - fitted_at}


class StringEngine(RefitEngine):
    """
    States and ball positions in, learned strings out: the refit engine's string side.

    Feed :meth:`add_state` and :meth:`add_ball` from the stream's thread; :meth:`refit` on a
    worker runs the snapshots in their order (module docstring).

    :param robot: the arm's nominal model (kinematics up to the cup link).
    :param nominal: the nominal string model.
    :param config: the options.
    :param check: optional candidate checks (reasons to refuse; empty: none).
    """

    job_function = staticmethod(evaluate_string)

    def __init__(self, robot: RobotModel, nominal: StringModel, config: StringOnlineConfig,
                 check=None) -> None:
        """Start with an empty window and the nominal string in use."""
        super().__init__(config, check,
                         f'held-out {config.prediction_steps}-step ball prediction error')
        self.robot = robot.to(dtype=torch.float64)
        self.nominal = string_values(nominal)
        self.states: Deque[tuple] = deque()
        self.balls: Deque[tuple] = deque()
        self.snapshots: Deque[Tuple[int, tuple, tuple]] = deque()
        self.taken = 0
        self._last_snapshot: Optional[float] = None

    def add_state(self, t: float, q: np.ndarray, qd: np.ndarray) -> None:
        """
        Add a joint state (its stamp after the last one's; the caller's gate sees to it).

        :param t: stamp, s; :param q: ``(n,)`` rad; :param qd: ``(n,)`` rad/s.
        """
        self.states.append((float(t), np.asarray(q, dtype=float), np.asarray(qd, dtype=float)))
        self._trim(t)

    def add_ball(self, t: float, x: np.ndarray) -> bool:
        """
        Add a ball position; take a snapshot for a refit when one is due.

        :param t: stamp, s; :param x: ``(3,)`` world, m.
        :return: True when a snapshot was taken (a refit is due).
        """
        self.balls.append((float(t), np.asarray(x, dtype=float)))
        self._trim(t)
        span = self.balls[-1][0] - self.balls[0][0]
        if span < self.config.min_window:
            return False
        if self._last_snapshot is not None and \
                t - self._last_snapshot < self.config.refit_every:
            return False
        self.snapshots.append((self.taken, tuple(self.states), tuple(self.balls)))
        self.taken += 1
        self._last_snapshot = float(t)
        return True

    def _trim(self, t: float) -> None:
        oldest = t - self.config.window
        for stream in (self.states, self.balls):
            while stream and stream[0][0] < oldest:
                stream.popleft()

    def restart(self) -> None:
        """Forget the window and the refits not yet started; keep the string in use."""
        self.states.clear()
        self.balls.clear()
        self.snapshots.clear()
        self._last_snapshot = None

    def values(self) -> Dict[str, float]:
        """
        Return the named values of the string in use (the nominal one before any refit).

        :return: ``{name: value}``.
        """
        return dict(self.current.values if self.current is not None else self.nominal)

    def prepare(self):
        """
        Turn the oldest snapshot into a job, or say that there is none.

        :return: a :class:`StringJob` or a ``'waiting'`` decision.
        """
        try:
            number, states, balls = self.snapshots.popleft()
        except IndexError:
            span = self.balls[-1][0] - self.balls[0][0] if self.balls else 0.0
            return Decision('waiting', f'{span:.1f} s of ball positions in the window: a '
                            f'refit needs {self.config.min_window:g} s')
        config = self.config
        runs = ball_runs(states, balls, config.max_gap)
        if not runs:
            return Decision('waiting', 'no ball positions within the joint states')
        newest = runs[-1]
        cut = int(round(len(newest) * (1.0 - config.holdout_fraction)))
        heldout = (newest.piece(cut, len(newest)),)
        train = tuple(runs[:-1]) + (newest.piece(0, cut),)
        train = tuple(run for run in train if len(run) > config.horizon + 1)
        if not train or len(heldout[0]) < 11:
            return Decision('waiting', f'runs too short for a fit: {[len(r) for r in runs]} '
                            f'samples, horizon {config.horizon}')
        return StringJob(self.robot, self.nominal, self.current, train, heldout, config,
                         config.seed + number)
