"""
Learning a tossed object online from its pose stream: tosses cut out, the refit engine fed.

The identifier's object mode (``nodes/object_identifier.py``) gives this module the poses
it accepted and runs the refits; the module imports no ROS.

**Velocities** (:func:`pose_velocities`), as the shared toss recordings are made
(``contactnets_cube_toss/SOURCE.md``): the backward difference of the stamped poses
(linear velocity of the position in world axes, angular velocity of ``R_{k-1}^T R_k`` in
body axes, each over its own stamp interval; the first sample repeats the second's), then a
3-tap median filter per component (ends: the nearest samples repeated); stored in our layout
``v = [R^T p_dot, w_body]`` (``docs/conventions.md``).

**Tosses** (:class:`TossSegmenter`).  A toss runs from the release to rest:

* *released* at the first sample ``k`` from which ``release_samples`` consecutive
  accelerations (second differences of the stamped positions) lie within
  ``freefall_tolerance`` m/s^2 of gravity: the object flies free, no hand holds it;
* *at rest* once linear speed below ``rest_speed`` and angular speed below
  ``rest_angular_speed`` have held for ``rest_time`` s: the toss ends with that rest;
* *aborted* (not kept) by a stamp gap above ``max_gap`` s (tracking lost), after
  ``max_toss_time`` s without rest (picked up in flight), or when time starts over
  (:meth:`TossSegmenter.restart`: a toss never spans two timelines); shorter than
  ``min_samples`` samples: dropped.

**Refits** (:class:`ObjectEngine`, the one refit engine's object side,
:class:`~diffsim_ros.sysid.online.RefitEngine`).  A sliding window keeps the newest
``window_tosses`` tosses; each ``refit_every`` new tosses (once ``min_tosses`` are there)
the engine takes a snapshot of the window; snapshots are fit in their order, so what is fit
depends only on the stream, never on the machine's speed.  Of a snapshot the newest
``heldout_tosses`` tosses are held out, the next newest one is the validation toss of early
stopping, the rest are trained on with :func:`~diffsim_ros.sysid.object_learning.fit_object`,
started at the object in use (the nominal object first).  The candidate replaces the object
in use when its ``prediction_steps``-sample open-loop prediction error on the held-out
tosses is lower (:func:`toss_error`).  Standard deviations:
``bootstrap`` more fits on resamples (with replacement) of the training tosses, each started
at the candidate and run for ``bootstrap_steps`` steps; the std of each named parameter over
them.  Warm-started and short, these fits understate the spread of independent fits: read
the std as a lower bound.
"""

from collections import deque
from dataclasses import dataclass, field, replace
import math
import time
from typing import Any, Deque, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

from .contact_learning import ObjectFit, ObjectSpec, rollout_errors
from .object_learning import fit_object, METHODS
from .online import Decision, EXECUTIONS, JobSizes, RefitEngine
from ..core.parameterization import mass_com_inertia
from ..core.spatial import quat_conjugate, quat_log, quat_multiply, quat_rotate

Tensor = torch.Tensor

__all__ = ['GRAVITY', 'ObjectEngine', 'ObjectJob', 'ObjectOnlineConfig', 'ObjectResult',
           'SegmenterConfig', 'Toss', 'TossSegmenter', 'UNITS', 'evaluate_object',
           'object_parameters', 'pose_velocities', 'toss_error']

#: Gravity of the free-fall test, m/s^2, world z up.
GRAVITY = np.array([0.0, 0.0, -9.81])


def _median3(x: Tensor) -> Tensor:
    """3-tap median along dim 0, the end samples repeated."""
    if len(x) < 3:
        return x
    padded = torch.cat((x[:1], x, x[-1:]))
    return torch.stack((padded[:-2], padded[1:-1], padded[2:])).median(0).values


def pose_velocities(t: Tensor, q: Tensor, median: bool = True) -> Tensor:
    """
    Return the velocities of stamped free-body poses as the shared tosses define them.

    :param t: ``(T,)`` stamps, s, increasing.
    :param q: ``(T, 7)`` configurations ``[p_world, quat (x, y, z, w)]``.
    :param median: take the 3-tap median of the backward differences (for noisy mocap);
        False leaves them raw (noise-free simulated poses, as the shared files store them).
    :return: ``(T, 6)`` ``[R^T p_dot, w_body]`` (module docstring); ``T >= 2``.
    :raises ValueError: fewer than two samples or stamps that do not increase.
    """
    if len(t) < 2:
        raise ValueError(f'velocities need two poses or more, got {len(t)}')
    dt = (t[1:] - t[:-1]).unsqueeze(-1)
    if not bool((dt > 0).all()):
        raise ValueError('pose stamps must increase')
    linear = (q[1:, :3] - q[:-1, :3]) / dt
    relative = quat_multiply(quat_conjugate(q[:-1, 3:7]), q[1:, 3:7])
    angular = quat_log(relative) / dt
    backward = torch.cat((linear, angular), -1)
    backward = torch.cat((backward[:1], backward))
    if median:
        backward = _median3(backward)
    return torch.cat((quat_rotate(quat_conjugate(q[:, 3:7]), backward[:, :3]),
                      backward[:, 3:]), -1)


@dataclass(frozen=True)
class Toss:
    """
    One toss, release to rest.

    :ivar t: ``(T,)`` stamps, s.
    :ivar q: ``(T, 7)`` configurations.
    :ivar v: ``(T, 6)`` velocities (:func:`pose_velocities`).
    """

    t: Tensor
    q: Tensor
    v: Tensor

    def __len__(self) -> int:
        """Return the number of samples."""
        return len(self.t)


@dataclass(frozen=True)
class SegmenterConfig:
    """
    The toss rule's thresholds (module docstring).

    :param freefall_tolerance: largest deviation from gravity of a free-flight acceleration,
        m/s^2.
    :param release_samples: consecutive free-flight accelerations that make a release.
    :param rest_speed: linear speed below which the object may rest, m/s.
    :param rest_angular_speed: angular speed below which it may rest, rad/s.
    :param rest_time: how long it must stay so to be at rest, s.
    :param max_gap: a longer stamp gap aborts a toss, s.
    :param max_toss_time: a toss not at rest after this long is aborted, s.
    :param min_samples: shorter tosses are dropped.
    """

    freefall_tolerance: float = 2.0
    release_samples: int = 3
    rest_speed: float = 0.02
    rest_angular_speed: float = 0.2
    rest_time: float = 0.1
    max_gap: float = 0.05
    max_toss_time: float = 4.0
    min_samples: int = 10

    def __post_init__(self) -> None:
        """Reject non-positive thresholds."""
        for name in ('freefall_tolerance', 'rest_speed', 'rest_angular_speed', 'rest_time',
                     'max_gap', 'max_toss_time'):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f'{name} must be finite and > 0, got {value!r}')
        if self.release_samples < 1 or self.min_samples < 3:
            raise ValueError('release_samples must be >= 1 and min_samples >= 3')


class TossSegmenter:
    """
    Cut a stream of accepted poses into tosses (module docstring's rule).

    :param config: thresholds.
    """

    #: Samples kept before a release: the backward difference and the median need them.
    _MARGIN = 2

    def __init__(self, config: SegmenterConfig = SegmenterConfig()) -> None:
        """Start waiting for a release."""
        self.config = config
        self.counts = {'tosses': 0, 'aborted_gap': 0, 'aborted_long': 0, 'aborted_restart': 0,
                       'dropped_short': 0}
        self._t: List[float] = []
        self._q: List[np.ndarray] = []
        self._start: Optional[int] = None   # index of the release in the buffer
        self._rest = 0

    @property
    def in_toss(self) -> bool:
        """Return whether a toss is under way."""
        return self._start is not None

    def reset(self) -> None:
        """Forget the stream (a toss under way is dropped silently)."""
        self._t, self._q, self._start, self._rest = [], [], None, 0

    def restart(self) -> None:
        """Forget the stream because time started over (a toss under way: ``aborted_restart``)."""
        if self._start is not None:
            self.counts['aborted_restart'] += 1
        self.reset()

    def add(self, t: float, q: np.ndarray) -> Optional[Toss]:
        """
        Take one pose.

        :param t: stamp, s, later than the previous one.
        :param q: ``(7,)`` configuration (unit quaternion).
        :return: the toss this pose completes, else None.
        """
        cfg = self.config
        if self._t and t - self._t[-1] > cfg.max_gap:
            if self._start is not None:
                self.counts['aborted_gap'] += 1
            self.reset()
        self._t.append(float(t))
        self._q.append(np.asarray(q, dtype=np.float64))
        if self._start is None:
            self._look_for_release()
            return None
        if t - self._t[self._start] > cfg.max_toss_time:
            self.counts['aborted_long'] += 1
            self.reset()
            return None
        if self._resting():
            self._rest += 1
        else:
            self._rest = 0
        if self._rest < 2 or self._t[-1] - self._t[-self._rest] < cfg.rest_time:
            return None
        return self._finish()

    def _acceleration(self, k: int) -> np.ndarray:
        t, p = self._t, self._q
        v1 = (p[k][:3] - p[k - 1][:3]) / (t[k] - t[k - 1])
        v2 = (p[k + 1][:3] - p[k][:3]) / (t[k + 1] - t[k])
        return (v2 - v1) / (0.5 * (t[k + 1] - t[k - 1]))

    def _look_for_release(self) -> None:
        """Set the release when the newest accelerations are free flight; trim the buffer."""
        n, need = len(self._t), self.config.release_samples
        if n >= need + 2:
            first = n - 1 - need   # accelerations at first .. n - 2
            if all(np.linalg.norm(self._acceleration(k) - GRAVITY) <=
                   self.config.freefall_tolerance for k in range(first, n - 1)):
                self._start, self._rest = first, 0
                return
        keep = need + 2 + self._MARGIN
        if n > keep:
            del self._t[:n - keep], self._q[:n - keep]

    def _resting(self) -> bool:
        t, q = self._t, self._q
        dt = t[-1] - t[-2]
        speed = np.linalg.norm(q[-1][:3] - q[-2][:3]) / dt
        qa, qb = (torch.as_tensor(x[3:7]) for x in (q[-2], q[-1]))
        spin = float(quat_log(quat_multiply(quat_conjugate(qa), qb)).norm()) / dt
        return speed < self.config.rest_speed and spin < self.config.rest_angular_speed

    def _finish(self) -> Optional[Toss]:
        start = self._start
        lead = max(start - self._MARGIN, 0)
        t = torch.tensor(self._t[lead:], dtype=torch.float64)
        q = torch.tensor(np.stack(self._q[lead:]), dtype=torch.float64)
        v = pose_velocities(t, q)
        cut = start - lead
        self.reset()
        if len(t) - cut < self.config.min_samples:
            self.counts['dropped_short'] += 1
            return None
        self.counts['tosses'] += 1
        return Toss(t[cut:], q[cut:], v[cut:])


# -- named parameters -------------------------------------------------------------------------
#: Units of the named parameters of a learned object.
UNITS = {'friction': '', 'ground_height': 'm', 'size_x': 'm', 'size_y': 'm', 'size_z': 'm',
         'volume': 'm^3', 'mass': 'kg', 'com_x': 'm', 'com_y': 'm', 'com_z': 'm',
         'ixx': 'kg m^2', 'iyy': 'kg m^2', 'izz': 'kg m^2', 'ixy': 'kg m^2',
         'ixz': 'kg m^2', 'iyz': 'kg m^2'}


def object_parameters(model, contact) -> Dict[str, float]:
    """
    Return the named physical parameters of a one-body object.

    :param model: its floating model (one body).
    :param contact: its contact model (one vertex set).
    :return: :data:`UNITS`' names: ``friction``, ``ground_height``, the extents ``size_*``
        of the vertex hull along the body axes, its ``volume``, the fixed ``mass``, the CoM
        ``com_*`` and the inertia about the CoM ``i**``.
    """
    from scipy.spatial import ConvexHull
    vertices = contact.vertices[0].detach().double().cpu().numpy()
    extent = vertices.max(0) - vertices.min(0)
    mass, com, inertia = (x.detach().double().cpu().numpy()
                          for x in mass_com_inertia(model.inertial.reshape(-1, 10)))
    inertia_com = inertia[0]
    return {'friction': float(contact.friction), 'ground_height': float(contact.ground_height),
            'size_x': float(extent[0]), 'size_y': float(extent[1]), 'size_z': float(extent[2]),
            'volume': float(ConvexHull(vertices).volume), 'mass': float(mass[0]),
            'com_x': float(com[0, 0]), 'com_y': float(com[0, 1]), 'com_z': float(com[0, 2]),
            **{name: float(inertia_com[i, j]) for name, (i, j) in (
                ('ixx', (0, 0)), ('iyy', (1, 1)), ('izz', (2, 2)), ('ixy', (0, 1)),
                ('ixz', (0, 2)), ('iyz', (1, 2)))}}


@dataclass(frozen=True)
class ObjectResult:
    """
    A learned object with its named parameters, their spread and its held-out errors.

    :ivar fit: the learned object.
    :ivar values: :func:`object_parameters` of it.
    :ivar std: per name, the std over the bootstrap fits (absent: no bootstrap).
    :ivar errors: ``position_m`` and ``orientation_rad`` on the held-out tosses.
    """

    fit: ObjectFit
    values: Mapping[str, float]
    std: Mapping[str, float] = field(default_factory=dict)
    errors: Mapping[str, float] = field(default_factory=dict)

    @property
    def method(self) -> str:
        """Return the learning method's name."""
        return self.fit.method

    @property
    def metrics(self) -> Dict[str, float]:
        """Return the final training loss as ``loss`` (the engine's decisions report it)."""
        train = [x for x in self.fit.history.get('validation', []) if x is not None]
        return {'loss': float(min(train))} if train else {}

    def to_dict(self) -> Dict[str, Any]:
        """
        Return the JSON-ready document: method, parameters with unit and std, errors.

        :return: ``{'method', 'parameters': {name: {'value', 'unit'[, 'std']}}, 'heldout'}``.
        """
        parameters = {}
        for name, value in self.values.items():
            entry = {'value': value, 'unit': UNITS.get(name, '')}
            if name in self.std:
                entry['std'] = self.std[name]
            parameters[name] = entry
        return {'method': self.method, 'parameters': parameters, 'heldout': dict(self.errors)}


def toss_error(fit: ObjectFit, tosses: Sequence[Toss], dt: float, length: float,
               horizon: int) -> dict:
    """
    Return an object's open-loop prediction errors over ``horizon`` samples on tosses.

    From every sample ``s >= 1`` of a toss with ``horizon`` samples after it (the first
    sample's velocity repeats the second's), the object is rolled out ``horizon`` samples
    and compared with the record: the paper's position and geodesic orientation errors,
    averaged over the predicted samples of all windows.  A short horizon, as the robot
    mode's ``prediction_steps``: a whole toss's rollout is chaotic (the true object itself
    was seen predicting a single held-out toss worse than a wrong one).

    :param fit: the object.
    :param tosses: the tosses.
    :param dt: sample period, s.
    :param length: lever arm turning the orientation error into a length, m (half width).
    :param horizon: samples predicted from each start.
    :return: ``position_m``, ``orientation_rad`` and ``loss`` =
        ``position_m + length * orientation_rad`` (``inf`` when not finite).
    """
    starts, targets = [], []
    for toss in tosses:
        for s in range(1, len(toss) - horizon):
            starts.append(torch.cat((toss.q[s], toss.v[s])))
            targets.append(toss.q[s + 1:s + 1 + horizon])
    if not starts:
        return {'position_m': math.inf, 'orientation_rad': math.inf, 'loss': math.inf}
    predicted = fit.predict(torch.stack(starts), horizon, dt)[..., :7]
    errors = rollout_errors(list(predicted), targets)
    out = {key: float(np.mean(values)) for key, values in errors.items()}
    out['loss'] = out['position_m'] + length * out['orientation_rad']
    return out if math.isfinite(out['loss']) else {**out, 'loss': math.inf}


# -- the engine --------------------------------------------------------------------------------
@dataclass(frozen=True)
class ObjectOnlineConfig:
    """
    Options of :class:`ObjectEngine` (module docstring).

    :param window_tosses: tosses kept.
    :param min_tosses: tosses a refit needs (training, validation and held out).
    :param refit_every: new tosses between refits.
    :param heldout_tosses: newest tosses held out to accept or refuse a candidate.
    :param steps: optimiser steps of a fit.
    :param bootstrap: fits on resampled tosses for the standard deviations (0: none).
    :param bootstrap_steps: optimiser steps of each of them.
    :param seed: seed of the fits (each refit adds its number).
    :param accept_margin: relative improvement a candidate needs.
    :param execution: one of :data:`~diffsim_ros.sysid.online.EXECUTIONS`.
    :param prediction_steps: samples of the held-out open-loop predictions that accept or
        refuse a candidate (:func:`toss_error`; 16: the paper's elbow horizon).
    :param method: a key of :data:`~diffsim_ros.sysid.object_learning.METHODS`.
    """

    method: str = field(default='ccn', metadata={'ros': False})
    window_tosses: int = 16
    min_tosses: int = 4
    refit_every: int = 2
    heldout_tosses: int = 1
    steps: int = 200
    bootstrap: int = 4
    bootstrap_steps: int = 40
    seed: int = 0
    accept_margin: float = 0.0
    execution: str = 'process'
    prediction_steps: int = 16

    def __post_init__(self) -> None:
        """Validate names and counts."""
        if self.method not in METHODS:
            raise ValueError(f'method must be one of {", ".join(METHODS)}; got {self.method!r}')
        if self.execution not in EXECUTIONS:
            raise ValueError(f'execution must be one of {", ".join(EXECUTIONS)}; got '
                             f'{self.execution!r}')
        for name in ('window_tosses', 'refit_every', 'heldout_tosses', 'steps',
                     'prediction_steps'):
            if getattr(self, name) < 1:
                raise ValueError(f'{name} must be >= 1, got {getattr(self, name)}')
        if self.bootstrap < 0 or self.bootstrap_steps < 1:
            raise ValueError('bootstrap must be >= 0 and bootstrap_steps >= 1')
        if self.min_tosses < self.heldout_tosses + 2:
            raise ValueError(f'min_tosses ({self.min_tosses}) must leave a training and a '
                             f'validation toss beside {self.heldout_tosses} held out')
        if self.min_tosses > self.window_tosses:
            raise ValueError(f'min_tosses ({self.min_tosses}) exceeds window_tosses '
                             f'({self.window_tosses})')
        if not (math.isfinite(self.accept_margin) and self.accept_margin >= 0):
            raise ValueError(f'accept_margin must be >= 0, got {self.accept_margin!r}')


@dataclass(frozen=True)
class ObjectJob(JobSizes):
    """
    One refit of an object, picklable for a child process.

    :ivar spec: the nominal object (its catalogue values).
    :ivar start: the object the fit starts from (the one in use).
    :ivar current: the result in use (None: the nominal object).
    :ivar method: learning method.
    :ivar train: training tosses.
    :ivar validation: the early-stopping toss(es).
    :ivar heldout: the held-out tosses.
    :ivar dt: sample period, s.
    :ivar seed: seed of this refit's fits.
    :ivar steps: optimiser steps.
    :ivar bootstrap: resampled fits.
    :ivar bootstrap_steps: their steps.
    :ivar horizon: samples of the held-out predictions (:func:`toss_error`).
    """

    spec: ObjectSpec
    start: ObjectSpec
    current: Optional[ObjectResult]
    method: str
    train: Tuple[Toss, ...]
    validation: Tuple[Toss, ...]
    heldout: Tuple[Toss, ...]
    dt: float
    seed: int
    steps: int
    bootstrap: int
    bootstrap_steps: int
    horizon: int
    driver: str = ''


def _trajectories(tosses: Sequence[Toss]) -> tuple:
    return [toss.q for toss in tosses], [toss.v for toss in tosses]


def _started_at(spec: ObjectSpec, fit: ObjectFit) -> ObjectSpec:
    """Return the spec with the learned body and contact as its start (a warm start)."""
    return replace(spec, model=fit.model.replace(inertial=fit.model.inertial.detach()),
                   contact=replace(fit.contact, friction=fit.contact.friction.detach(),
                                   ground_height=fit.contact.ground_height.detach(),
                                   vertices=tuple(v.detach() for v in fit.contact.vertices)))


def evaluate_object(job: ObjectJob) -> Dict[str, Any]:
    """
    Fit a candidate, its bootstrap spread, and score it, the object in use and the nominal one.

    :param job: the refit.
    :return: ``candidate`` (:class:`ObjectResult`), ``losses`` (``candidate``, ``current``,
        ``nominal``: :func:`toss_error`'s ``loss`` on the held-out tosses), ``fit_s``,
        ``score_s``.
    """
    started = time.perf_counter()
    train, validation = _trajectories(job.train), _trajectories(job.validation)
    fit = fit_object(job.start, job.method, train, validation, job.dt, seed=job.seed,
                     steps=job.steps, perturb=False)
    values = object_parameters(fit.model, fit.contact)
    samples = []
    generator = torch.Generator().manual_seed(job.seed)
    for b in range(job.bootstrap):
        pick = torch.randint(len(job.train), (len(job.train),), generator=generator).tolist()
        again = fit_object(_started_at(job.spec, fit), job.method,
                           _trajectories([job.train[i] for i in pick]), validation, job.dt,
                           seed=job.seed + 1 + b, steps=job.bootstrap_steps, perturb=False)
        samples.append(object_parameters(again.model, again.contact))
    std = {name: float(np.std([s[name] for s in samples], ddof=1))
           for name in values if name != 'mass'} if len(samples) > 1 else {}
    fitted = time.perf_counter()
    length = job.spec.length
    k = job.horizon
    errors = toss_error(fit, job.heldout, job.dt, length, k)
    nominal = ObjectFit('nominal', job.spec, job.spec.model, job.spec.contact, {})
    nominal_loss = toss_error(nominal, job.heldout, job.dt, length, k)['loss']
    current = toss_error(job.current.fit, job.heldout, job.dt, length, k)['loss'] \
        if job.current is not None else nominal_loss
    return {'candidate': ObjectResult(fit, values, std, errors),
            'losses': {'candidate': errors['loss'], 'current': current,
                       'nominal': nominal_loss},
            'fit_s': fitted - started, 'score_s': time.perf_counter() - fitted}


class ObjectEngine(RefitEngine):
    """
    Tosses in, learned objects out: the refit engine's object side (module docstring).

    Feed :meth:`add_toss` from the stream's thread; :meth:`refit` (or ``start``/``poll``) on
    a worker runs the snapshots in their order.

    :param spec: the nominal object.
    :param config: the options.
    :param check: optional candidate checks (reasons to refuse; empty: none).
    """

    job_function = staticmethod(evaluate_object)

    def __init__(self, spec: ObjectSpec, config: ObjectOnlineConfig, check=None) -> None:
        """Start with no toss and the nominal object in use."""
        super().__init__(config, check,
                         f'held-out {config.prediction_steps}-step toss prediction error')
        self.spec = spec
        self.tosses: Deque[Toss] = deque(maxlen=config.window_tosses)
        self.new_tosses = 0
        self.snapshots: Deque[Tuple[int, Tuple[Toss, ...]]] = deque()
        self.taken = 0   # snapshots taken: numbers the refits' seeds, whatever the timing

    def add_toss(self, toss: Toss) -> bool:
        """
        Add a completed toss; take a snapshot for a refit when one is due.

        :param toss: the toss.
        :return: True when a snapshot was taken (a refit is due).
        """
        self.tosses.append(toss)
        self.new_tosses += 1
        if len(self.tosses) < self.config.min_tosses or \
                self.new_tosses < self.config.refit_every:
            return False
        self.snapshots.append((self.taken, tuple(self.tosses)))
        self.taken += 1
        self.new_tosses = 0
        return True

    def restart(self) -> None:
        """
        Forget the tosses and the refits not yet started; keep the object in use.

        When time starts over: a snapshot never mixes timelines, and the tosses of a bag
        played again never stand beside their own copies (a held-out toss the copy of a
        training one).  A fit already running ends and is judged as usual.
        """
        self.tosses.clear()
        self.snapshots.clear()
        self.new_tosses = 0

    def prepare(self):
        """
        Turn the oldest snapshot into a job, or say that there is none.

        :return: an :class:`ObjectJob` or a ``'waiting'`` decision.
        """
        try:
            number, tosses = self.snapshots.popleft()
        except IndexError:   # none due, or a restart on the stream's thread took them
            return Decision('waiting', f'{len(self.tosses)} tosses in the window, '
                            f'{self.new_tosses} new: a refit needs {self.config.min_tosses} '
                            f'and {self.config.refit_every} new')
        config = self.config
        held = config.heldout_tosses
        train, validation, heldout = tosses[:-held - 1], tosses[-held - 1:-held], tosses[-held:]
        steps = torch.cat([toss.t[1:] - toss.t[:-1] for toss in tosses])
        start = self.spec if self.current is None else _started_at(self.spec, self.current.fit)
        return ObjectJob(self.spec, start, self.current, config.method, train, validation,
                         heldout, float(steps.median()), config.seed + number, config.steps,
                         config.bootstrap, config.bootstrap_steps, config.prediction_steps)
