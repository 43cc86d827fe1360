"""
How well a recording excites the identifiable dynamics of a robot.

Inverse dynamics is linear in the base parameters (:func:`diffsim_ros.sysid.nea.
base_parameters`): ``tau = W_base(q, qd, qdd) beta``.  Data determine ``beta`` only as well as
the stacked base regressor of the samples is conditioned.  The measure here is that of the
identification literature (Gautier & Khalil 1992, Swevers et al. 1997): the condition number
of the base regressor with its columns scaled to unit norm, the same quantity NEA reports as
``condition_number`` after its fit (unweighted), computed before any fit.

A robot at rest excites only the gravity columns at one configuration, a joint turning at
constant velocity no acceleration columns: the regressor loses rank (condition number
infinite), or, with sensor noise, keeps it only through the noise.  Measured on this
package's robots (double pendulum, Qube, Panda): chirps and multisines 5-30, the recorded
Qube chirps and swing-ups 12-19, the cart-pole's 3, the Panda's published excitation
trajectory 10; the same robots at rest or at constant velocity, with derivatives filtered
from positions carrying 1e-4 to 1e-3 rad of noise, 650 to 1e6 (without noise: infinite or
above 1e5).  Sensor noise alone lends a motionless recording some rank: the more noise, the
lower its condition number.

Designing an excitation (:func:`design_excitation`, ``diffsim-excite``)
-----------------------------------------------------------------------
Each joint follows a periodic Fourier series (Swevers et al. 1997, the form of Gaz et al.'s
Panda excitation; :func:`fourier_states`), ``K`` harmonics of ``omega = 2 pi / period``; the
recording is a whole number of periods, so one period holds every state and its regressor
has the condition number of the whole recording.  The offsets stay inside the position
limits by a ``tanh``; the coefficients are projected onto ``sum_k a_k = 0`` and
``sum_k k b_k = 0`` so that the trajectory starts and ends at rest (hence ``K >= 2``).  Adam
minimises ``log cond`` of the column-normalised base regressor on 200 states of a period
plus a penalty on the squared violations of the limits tightened by a margin (positions
0.1 rad in from the limits, 90 % of the speed limits, 90 % of the torque limits for the
nominal torque with gravity, armature and friction, :func:`nominal_torque`), from a random
start scaled into those limits.  The best iterate without violations is checked on one
period at the driver rate and its coefficients are scaled down by bisection until the
tightened limits hold there exactly (in the runs below: WAM-4 0.998, the others 1).

Why the condition number and not the log-determinant: it is the measure ``diffsim-fit``
reports and the one that bounds the relative error of the least-squares base parameters; the
log-determinant of the column-normalised Gram matrix (``criterion='logdet'``, D-optimality)
is smoother but spreads its effort over all directions, and measured by the condition number
it ended worse on every robot tried: WAM-4 17.5, Panda 11.1, double pendulum 3.2 against
8.2, 5.0 and 2.7 (same settings, 300 steps, checked at 100 Hz).

Measured with ``diffsim-excite --robot R --duration 20`` (period 10 s, 5 harmonics, 300
steps, seed 0, condition numbers on one period at the driver rate; 2 shared, loaded cores):

=================  ==============  ============  =========  ===========================
robot              plain sinusoid  random start  optimised  wall (CPU) time
=================  ==============  ============  =========  ===========================
Panda (57 base)    66.7            12.4          5.05       590 s (162 s)
WAM-4 (30 base)    851             184           8.41       392 s (131 s)
double pendulum    54.3            3.86          2.25       92 s (50 s)
=================  ==============  ============  =========  ===========================

For comparison, Gaz et al.'s recorded Panda excitation measures 10 (above); ``diffsim-fit``
measures 8.0 on the training blocks of the designed Panda CSV (two of ten 2 s blocks held
out, accelerations refiltered).  The plain sinusoid (one harmonic per joint, phases spread,
as large as the limits allow) shows why a design is needed: a single frequency makes the
accelerations proportional to the displacements.  The WAM's speed limits (0.2-0.5 rad/s)
keep its trajectories slow and its condition number higher than the Panda's.  On the WAM-4
with a 4 s period and 60 steps (the test's design, condition number 28 against 1000 for its
start and 39000 for the sinusoid), NEA fitted to a perturbed model's torques with 0.3 N m
of noise recovers the base parameters with relative errors 0.52 and 0.96 (two noise draws)
against 1.45 and 3.86 from the start and 233 and 165 from the sinusoid.  Not handled: robots
with passive joints (Qube, cart-pole; refused by :func:`excitation_limits`), acceleration
and jerk limits (the URDF has none; the designed Panda trajectory peaks at 1.9-5.0 rad/s^2,
within Franka's 7.5-20 rad/s^2) and self-collision.
"""

from dataclasses import asdict, dataclass
import math
import time
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np
import torch

from .dataset import Trajectory
from .nea import base_parameters, BaseParameters, RegressorColumns
from .result import check_choice, check_positive
from .sampled import joint_order, KIND as SAMPLED, SampledTrajectory
from ..core.dispatch import rnea
from ..core.integrators import joint_friction
from ..core.model import RobotModel
from ..robots.catalog import RobotInfo

Tensor = torch.Tensor


@dataclass(frozen=True)
class Excitation:
    """
    Conditioning of the base regressor of a data set.

    :param condition_number: largest over smallest singular value of the column-normalised
        base regressor (``inf`` when a base parameter has no signal at all).
    :param rank: numerical rank of that regressor (singular values above ``max(shape) eps``
        of the largest, as :func:`~diffsim_ros.sysid.nea.least_squares` counts them).
    :param base_parameters: number of base parameters (the rank full excitation reaches).
    :param samples: samples stacked.
    :param least_excited: expression of the base parameter that dominates the direction of
        the smallest singular value (what the data tell least about).
    """

    condition_number: float
    rank: int
    base_parameters: int
    samples: int
    least_excited: str

    def to_dict(self) -> Dict[str, Any]:
        """
        Return the fields as a JSON-ready mapping (``inf`` as ``None``).

        :return: the mapping.
        """
        out = asdict(self)
        if not math.isfinite(self.condition_number):
            out['condition_number'] = None
        return out


def excitation(model: RobotModel, runs: Sequence[Trajectory],
               columns: Optional[RegressorColumns] = None) -> Excitation:
    """
    Measure how well runs excite a robot's base parameters (see the module docstring).

    :param model: the robot (kinematics only).
    :param runs: trajectories with ``q``, ``qd`` and ``qdd`` (joints in any order, matched by
        name), e.g. the training runs of a fit.
    :param columns: regressor layout (default: inertial + viscous + Coulomb, NEA's).
    :return: the measure.
    :raises ValueError: when a run lacks velocities or accelerations, or there are no samples.
    """
    model = model.to(dtype=torch.float64, device='cpu')
    base = base_parameters(model, columns)
    states = []
    for run in runs:
        if run.qd is None or run.qdd is None:
            raise ValueError(f'run {run.run!r} has no qd or qdd; estimate derivatives first')
        run = run.reorder(model.joint_names).to(dtype=torch.float64, device='cpu')
        states.append((run.q, run.qd, run.qdd))
    if not states or not sum(len(q) for q, _, _ in states):
        raise ValueError('excitation: no samples')
    q, qd, qdd = (torch.cat(parts) for parts in zip(*states))
    return _measure(model, base, q, qd, qdd)


def _measure(model: RobotModel, base: BaseParameters, q: Tensor, qd: Tensor,
             qdd: Tensor) -> Excitation:
    """Return the :class:`Excitation` of stacked float64 CPU states ``(N, n)``."""
    r = len(base.independent)
    with torch.no_grad():
        A = base.regressor(model, q, qd, qdd).reshape(-1, r).numpy()
    norms = np.linalg.norm(A, axis=0)
    A = A / np.where(norms > 0, norms, 1.0)
    _, singular, Vt = np.linalg.svd(A, full_matrices=False)
    rank = int(np.sum(singular > singular[0] * max(A.shape) * np.finfo(float).eps)) \
        if singular[0] > 0 else 0
    condition = float(singular[0] / singular[-1]) if singular[-1] > 0 else math.inf
    weakest = int(np.argmax(np.abs(Vt[-1])))
    return Excitation(condition_number=condition, rank=rank, base_parameters=r,
                      samples=int(q.shape[0]),
                      least_excited=base.expressions(digits=3)[weakest])


# --------------------------------------------------------------------------------------
# Designing an excitation: an optimised periodic Fourier series
# --------------------------------------------------------------------------------------
#: Design criteria: ``'condition'`` minimises ``log cond`` of the column-normalised base
#: regressor, ``'logdet'`` maximises ``log det`` of its Gram matrix (D-optimality), both
#: divided by nothing else.
CRITERIA = ('condition', 'logdet')


def fourier_states(q0: Tensor, a: Tensor, b: Tensor, omega: float,
                   t: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """
    Evaluate the joint Fourier series of Swevers et al. (1997) and its derivatives.

    ``q_j(t) = q0_j + sum_k a_jk / (omega k) sin(omega k t) - b_jk / (omega k) cos(omega k t)``,
    so ``qd_j = sum_k a_jk cos(omega k t) + b_jk sin(omega k t)`` (``a``, ``b`` in rad/s).

    :param q0: offsets ``(n,)``, rad or m.
    :param a: coefficients ``(n, K)``, rad/s or m/s.
    :param b: coefficients ``(n, K)``, rad/s or m/s.
    :param omega: base angular frequency ``2 pi / period``, rad/s.
    :param t: times ``(T,)``, s.
    :return: ``(q, qd, qdd)`` each ``(T, n)``.
    """
    k = torch.arange(1, a.shape[-1] + 1, dtype=a.dtype, device=a.device)
    w = omega * k
    angle = t.to(a)[:, None, None] * w
    sin, cos = torch.sin(angle), torch.cos(angle)
    q = q0 + (a / w * sin - b / w * cos).sum(-1)
    qd = (a * cos + b * sin).sum(-1)
    qdd = (w * (b * cos - a * sin)).sum(-1)
    return q, qd, qdd


@dataclass(frozen=True)
class FourierTrajectory:
    """
    A periodic joint trajectory: the Fourier series of :func:`fourier_states`.

    :param joint_names: joints of the rows of ``q0``, ``a``, ``b``.
    :param q0: offset per joint, rad or m.
    :param a: ``K`` coefficients per joint, rad/s or m/s.
    :param b: ``K`` coefficients per joint, rad/s or m/s.
    :param base_frequency_hz: ``1 / period``, Hz (``omega = 2 pi base_frequency_hz``).
    :raises ValueError: inconsistent lengths, non-finite values or a frequency <= 0.
    """

    joint_names: Tuple[str, ...]
    q0: Tuple[float, ...]
    a: Tuple[Tuple[float, ...], ...]
    b: Tuple[Tuple[float, ...], ...]
    base_frequency_hz: float

    def __post_init__(self) -> None:
        """Check shapes and values, store plain tuples of floats."""
        n = len(self.joint_names)
        try:
            q0 = tuple(float(v) for v in self.q0)
            a, b = (tuple(tuple(float(v) for v in row) for row in rows)
                    for rows in (self.a, self.b))
            frequency = float(self.base_frequency_hz)
        except (TypeError, ValueError):
            raise ValueError('q0, a, b and base_frequency_hz must be numbers') from None
        if len(set(self.joint_names)) != n or not n:
            raise ValueError(f'joint_names must be distinct and not empty, got '
                             f'{list(self.joint_names)}')
        if len(q0) != n or len(a) != n or len(b) != n:
            raise ValueError(f'q0, a and b need one entry per joint ({n})')
        harmonics = {len(row) for row in a + b}
        if len(harmonics) != 1 or harmonics == {0}:
            raise ValueError('every row of a and b needs the same number (>= 1) of harmonics')
        values = q0 + sum(a + b, ()) + (frequency,)
        if not all(math.isfinite(v) for v in values):
            raise ValueError('q0, a, b and base_frequency_hz must be finite')
        if frequency <= 0:
            raise ValueError(f'base_frequency_hz must be > 0, got {frequency}')
        object.__setattr__(self, 'joint_names', tuple(str(j) for j in self.joint_names))
        for name, value in (('q0', q0), ('a', a), ('b', b), ('base_frequency_hz', frequency)):
            object.__setattr__(self, name, value)

    @property
    def harmonics(self) -> int:
        """Return the number of harmonics ``K``."""
        return len(self.a[0])

    @property
    def period_s(self) -> float:
        """Return the period, s."""
        return 1.0 / self.base_frequency_hz

    @property
    def omega(self) -> float:
        """Return the base angular frequency, rad/s."""
        return 2.0 * math.pi * self.base_frequency_hz

    def tensors(self, dtype: torch.dtype = torch.float64) -> Tuple[Tensor, Tensor, Tensor]:
        """
        Return ``q0 (n,)``, ``a (n, K)`` and ``b (n, K)`` as tensors.

        :param dtype: their dtype.
        :return: the three tensors.
        """
        return tuple(torch.tensor(v, dtype=dtype) for v in (self.q0, self.a, self.b))

    def evaluate(self, t: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """
        Return positions, velocities and accelerations at times ``t``.

        :param t: ``(T,)``, s (float64 unless a floating dtype is given).
        :return: ``(q, qd, qdd)`` each ``(T, n)`` in :attr:`joint_names` order.
        """
        dtype = t.dtype if t.is_floating_point() else torch.float64
        return fourier_states(*self.tensors(dtype), self.omega, t.to(dtype))

    def amplitude_phase(self) -> Tuple[Tuple[float, ...], Tuple[Tuple[float, ...], ...],
                                       Tuple[Tuple[float, ...], ...]]:
        """
        Return the series as ``q_j = centre_j + sum_k A_jk sin(omega k t + phi_jk)``.

        ``A_jk = hypot(a_jk, b_jk) / (omega k)``, ``phi_jk = atan2(-b_jk, a_jk)``: the form of
        the tracking tasks (:mod:`diffsim_ros.control.tasks`).

        :return: ``(centre (n,), amplitude (n, K), phase (n, K))``, rad or m, rad.
        """
        amplitude = tuple(tuple(math.hypot(a, b) / (self.omega * (k + 1))
                                for k, (a, b) in enumerate(zip(ra, rb)))
                          for ra, rb in zip(self.a, self.b))
        phase = tuple(tuple(math.atan2(-b, a) for a, b in zip(ra, rb))
                      for ra, rb in zip(self.a, self.b))
        return self.q0, amplitude, phase

    def check_times(self, rate_hz: float) -> Tensor:
        """
        Return the times a limit check samples: one period (it holds every state).

        :param rate_hz: rate of the check, Hz.
        :return: ``(K,)`` float64, s.
        """
        return torch.arange(0.0, self.period_s, 1.0 / rate_hz, dtype=torch.float64)

    def reorder(self, joint_names: Sequence[str]) -> 'FourierTrajectory':
        """
        Return the same trajectory with its rows in another joint order.

        :param joint_names: the same joints in the wanted order.
        :return: the reordered trajectory.
        :raises ValueError: when the joints differ (the message lists both sets).
        """
        index = joint_order(self.joint_names, joint_names)
        return FourierTrajectory(tuple(joint_names), tuple(self.q0[i] for i in index),
                                 tuple(self.a[i] for i in index),
                                 tuple(self.b[i] for i in index), self.base_frequency_hz)


@dataclass(frozen=True)
class JointLimits:
    """
    Limits an excitation must respect, model joint order (``inf`` where a joint has none).

    :param lower: lower position limits, rad or m.
    :param upper: upper position limits, rad or m.
    :param velocity: speed limits, rad/s or m/s.
    :param torque: limits on the nominal inverse-dynamics torque, N m or N.
    """

    lower: Tuple[float, ...]
    upper: Tuple[float, ...]
    velocity: Tuple[float, ...]
    torque: Tuple[float, ...]

    def __post_init__(self) -> None:
        """Check lengths and signs."""
        n = len(self.lower)
        if not len(self.upper) == len(self.velocity) == len(self.torque) == n:
            raise ValueError('JointLimits: lower, upper, velocity and torque need one entry '
                             'per joint')
        if any(not (lo < hi) for lo, hi in zip(self.lower, self.upper)) or any(
                not v > 0 for v in self.velocity + self.torque):
            raise ValueError('JointLimits: need lower < upper and velocity, torque > 0')

    def tightened(self, margin: float, velocity_scale: float,
                  torque_scale: float) -> 'JointLimits':
        """
        Return the limits with a position margin and velocity / torque fractions.

        :param margin: kept from each finite position limit, rad or m.
        :param velocity_scale: fraction of the speed limits, in ``(0, 1]``.
        :param torque_scale: fraction of the torque limits, in ``(0, 1]``.
        :return: the tighter limits.
        :raises ValueError: a margin that leaves a joint no room.
        """
        lower = tuple(lo + margin for lo in self.lower)
        upper = tuple(hi - margin for hi in self.upper)
        if any(not lo < hi for lo, hi in zip(lower, upper)):
            raise ValueError(f'a position margin of {margin:g} leaves a joint no room '
                             f'(limits {list(zip(self.lower, self.upper))})')
        return JointLimits(lower, upper, tuple(velocity_scale * v for v in self.velocity),
                           tuple(torque_scale * v for v in self.torque))


def excitation_limits(model: RobotModel, info: Optional[RobotInfo] = None) -> JointLimits:
    """
    Return the limits an excitation of a robot must respect, model joint order.

    Positions and speeds from the robot description (URDF); torques from the URDF effort
    limits, lowered to the catalog's command limits for robots commanded in joint torques
    (the driver clips commands there).  Only commanded joints can follow a reference, so a
    robot with passive joints (Qube, cart-pole) has no excitation trajectory; a bare URDF
    counts as fully commanded.

    :param model: the robot.
    :param info: its catalog entry (None for a bare URDF).
    :return: the limits.
    :raises ValueError: passive joints, or a joint without a positive effort limit.
    """
    if info is not None:
        passive = [j for j in info.joint_names if j not in info.command_joints]
        if passive:
            raise ValueError(f'{info.name} has passive joints {passive}: a passive joint '
                             'cannot follow a reference, so excitation trajectories are for '
                             'fully actuated robots only')
    torque = model.effort_limit.tolist()
    if info is not None and info.command_unit != 'V':
        for joint, limit in zip(info.joint_names, info.command_limit):
            index = model.joint_index(joint)
            torque[index] = min(torque[index], float(limit))
    weak = [j for j, limit in zip(model.joint_names, torque) if not limit > 0]
    if weak:
        raise ValueError(f'joints {weak} have no positive effort limit')
    return JointLimits(tuple(model.lower.tolist()), tuple(model.upper.tolist()),
                       tuple(model.velocity_limit.tolist()), tuple(torque))


#: The series in words, as excitation documents state it.
FORM = ('q_j(t) = q0_j + sum_k a_jk/(w k) sin(w k t) - b_jk/(w k) cos(w k t), '
        'w = 2 pi base_frequency_hz, k = 1..harmonics')


def trajectory_document(trajectory: FourierTrajectory, robot: str, duration_s: float,
                        extra: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """
    Return an excitation trajectory as a plain mapping (the content of ``excitation.yaml``).

    Keys: ``robot``, ``form``, ``joint_names``, ``base_frequency_hz``, ``period_s``,
    ``harmonics``, ``duration_s`` (whole periods), ``q0`` (rad or m), ``a``, ``b`` (one row
    of ``harmonics`` values per joint, rad/s or m/s), ``q_start`` (``q(0)``: where the robot
    must stand, at rest, when tracking starts), then ``extra``.

    :param trajectory: the series.
    :param robot: catalog name or URDF path of the robot.
    :param duration_s: length of the recording, s.
    :param extra: further plain entries (the design's settings and results).
    :return: the mapping.
    """
    q_start, _, _ = trajectory.evaluate(torch.zeros(1, dtype=torch.float64))
    return {'robot': robot, 'form': FORM, 'joint_names': list(trajectory.joint_names),
            'base_frequency_hz': trajectory.base_frequency_hz, 'period_s': trajectory.period_s,
            'harmonics': trajectory.harmonics, 'duration_s': float(duration_s),
            'q0': list(trajectory.q0), 'a': [list(row) for row in trajectory.a],
            'b': [list(row) for row in trajectory.b], 'q_start': q_start[0].tolist(),
            **dict(extra or {})}


def trajectory_from_document(document: Any, model: RobotModel, limits: JointLimits,
                             rate_hz: float) -> Tuple[Any, float]:
    """
    Validate a reference mapping for a robot: an excitation series or a sampled trajectory.

    A mapping with ``kind: sampled`` is a one-shot :class:`~diffsim_ros.sysid.sampled.
    SampledTrajectory` (its module docstring gives the form), any other the periodic series of
    :func:`trajectory_document`.  Refused: anything but a mapping with the form's keys, joints
    other than the model's (matched by name, any order), values that are not finite numbers,
    and a trajectory that leaves ``limits`` anywhere on a period (a sampled one: its samples
    and its hold) sampled at ``rate_hz`` (:func:`limit_check`).

    :param document: the parsed file.
    :param model: the robot.
    :param limits: its limits (:func:`excitation_limits`).
    :param rate_hz: rate of the limit check, Hz.
    :return: ``(trajectory in model joint order, duration_s)``: the series' ``duration_s``,
        or the time of a sampled trajectory's last sample.
    :raises ValueError: the first problem, in one line.
    """
    if not isinstance(document, dict):
        raise ValueError('expected a mapping')
    if document.get('kind', 'fourier') not in ('fourier', SAMPLED):
        raise ValueError(f"kind must be 'fourier' (the default) or {SAMPLED!r}, got "
                         f"{document['kind']!r}")
    if document.get('kind') == SAMPLED:
        trajectory = SampledTrajectory.from_document(document).reorder(model.joint_names)
        _refuse_outside(model, limit_check(model, limits, trajectory, rate_hz))
        return trajectory, trajectory.duration_s
    missing = [k for k in ('joint_names', 'base_frequency_hz', 'q0', 'a', 'b', 'duration_s')
               if k not in document]
    if missing:
        raise ValueError(f'missing keys {missing}')
    names = document['joint_names']
    if not isinstance(names, list) or not all(isinstance(j, str) for j in names):
        raise ValueError('joint_names must be a list of strings')
    try:
        trajectory = FourierTrajectory(tuple(names), document['q0'], document['a'],
                                       document['b'], document['base_frequency_hz'])
    except TypeError:
        raise ValueError('q0, a and b must be lists of numbers') from None
    trajectory = trajectory.reorder(model.joint_names)
    duration = document['duration_s']
    if isinstance(duration, bool) or not isinstance(duration, (int, float)) or not (
            math.isfinite(duration) and duration > 0):
        raise ValueError(f'duration_s must be a finite number > 0, got {duration!r}')
    _refuse_outside(model, limit_check(model, limits, trajectory, rate_hz))
    return trajectory, float(duration)


def _refuse_outside(model: RobotModel, check: Dict[str, Any]) -> None:
    """Raise the first violated limit of a :func:`limit_check` as a ValueError."""
    if not check['satisfied']:
        raise ValueError(f'the trajectory leaves the limits of the robot: '
                         f'{_worst(model, check)}')


def _worst(model: RobotModel, check: Dict[str, Any]) -> str:
    """Return the first violated limit of a :func:`limit_check` in words."""
    for joint, gap, velocity, torque in zip(model.joint_names, check['position_gap'],
                                            check['velocity_ratio'], check['torque_ratio']):
        if gap < 0:
            return f'{joint} passes a position limit by {-gap:.3g}'
        if velocity > 1:
            return f'{joint} reaches {velocity:.3g} times its velocity limit'
        if torque > 1:
            return f'{joint} needs {torque:.3g} times its torque limit (nominal model)'
    return 'none'


def nominal_torque(model: RobotModel, q: Tensor, qd: Tensor, qdd: Tensor) -> Tensor:
    """
    Return the torque the actuators must apply along a trajectory, on the nominal model.

    Rigid body with gravity and armature (:func:`~diffsim_ros.core.rnea.rnea`) plus the
    URDF's viscous and (smooth) Coulomb friction (:func:`~diffsim_ros.core.integrators.
    joint_friction`).

    :param model: the robot.
    :param q: ``(..., n)``.
    :param qd: ``(..., n)``.
    :param qdd: ``(..., n)``.
    :return: ``(..., n)``, N m or N.
    """
    return rnea(model, q, qd, qdd) + joint_friction(model, qd)


def limit_check(model: RobotModel, limits: JointLimits, trajectory: Any,
                rate_hz: float) -> Dict[str, Any]:
    """
    Check a trajectory against limits at its ``check_times`` sampled at ``rate_hz``.

    A series is periodic: one period holds every state of any whole number of periods.  A
    sampled trajectory is checked over its samples and its hold.

    :param model: the robot (joint order; the trajectory is matched by name).
    :param limits: the limits, model joint order.
    :param trajectory: a :class:`FourierTrajectory` or a
        :class:`~diffsim_ros.sysid.sampled.SampledTrajectory`.
    :param rate_hz: sample rate of the check, Hz.
    :return: ``satisfied`` (bool) and per joint (model order) ``position_gap`` (smallest
        distance to a position limit over the period, negative beyond it, rad or m),
        ``velocity_ratio`` and ``torque_ratio`` (largest ``|qd| / limit``, ``|tau| / limit``).
    """
    model = model.to(dtype=torch.float64, device='cpu')
    trajectory = trajectory.reorder(model.joint_names)
    t = trajectory.check_times(rate_hz)
    with torch.no_grad():
        q, qd, qdd = trajectory.evaluate(t)
        tau = nominal_torque(model, q, qd, qdd)
    return _check(q, qd, tau, limits)


def _check(q: Tensor, qd: Tensor, tau: Tensor, limits: JointLimits) -> Dict[str, Any]:
    like = {'dtype': q.dtype}
    lower, upper, velocity, torque = (torch.tensor(v, **like) for v in (
        limits.lower, limits.upper, limits.velocity, limits.torque))
    gap = torch.minimum(q - lower, upper - q).amin(0)
    velocity_ratio = (qd.abs() / velocity).amax(0)
    torque_ratio = (tau.abs() / torque).amax(0)
    satisfied = bool((gap >= 0).all() and (velocity_ratio <= 1).all()
                     and (torque_ratio <= 1).all())
    return {'satisfied': satisfied, 'position_gap': gap.tolist(),
            'velocity_ratio': velocity_ratio.tolist(), 'torque_ratio': torque_ratio.tolist()}


@dataclass(frozen=True)
class DesignConfig:
    """
    Settings of :func:`design_excitation`.

    :param period_s: period of the series, s (base frequency ``1 / period_s``).
    :param harmonics: harmonics per joint ``K`` (>= 2: starting and ending at rest takes two
        linear conditions per joint).
    :param criterion: one of :data:`CRITERIA`.
    :param iterations: Adam steps.
    :param learning_rate: Adam step size on the dimensionless coefficients.
    :param samples: states per period on which the criterion and the penalties are evaluated
        during the optimisation.
    :param margin: kept from each finite position limit, rad or m.
    :param velocity_scale: fraction of the speed limits the trajectory may use.
    :param torque_scale: fraction of the torque limits the nominal torque may use.
    :param penalty: weight of the squared (normalised) limit violations.
    :param check_rate_hz: rate of the final limit check and of the reported condition numbers.
    :param seed: seed of the local generator of the random start.
    """

    period_s: float
    harmonics: int = 5
    criterion: str = 'condition'
    iterations: int = 300
    learning_rate: float = 0.05
    samples: int = 200
    margin: float = 0.1
    velocity_scale: float = 0.9
    torque_scale: float = 0.9
    penalty: float = 1e3
    check_rate_hz: float = 500.0
    seed: int = 0

    def __post_init__(self) -> None:
        """Validate the fields."""
        check_choice('criterion', self.criterion, CRITERIA)
        for name in ('period_s', 'learning_rate', 'penalty', 'check_rate_hz'):
            check_positive(name, getattr(self, name))
        check_positive('iterations', self.iterations, allow_zero=True, integer=True)
        check_positive('samples', self.samples, integer=True)
        check_positive('margin', self.margin, allow_zero=True)
        check_positive('seed', self.seed, allow_zero=True, integer=True)
        if not (isinstance(self.harmonics, int) and self.harmonics >= 2):
            raise ValueError(f'harmonics must be an int >= 2 (a trajectory that starts and '
                             f'ends at rest needs two), got {self.harmonics!r}')
        for name in ('velocity_scale', 'torque_scale'):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 < value <= 1):
                raise ValueError(f'{name} must lie in (0, 1], got {value!r}')


@dataclass(frozen=True)
class ExcitationDesign:
    """
    Result of :func:`design_excitation`.

    :param trajectory: the optimised trajectory (model joint order).
    :param start: the random start it was optimised from (scaled into the limits).
    :param sinusoid: a plain sinusoid per joint within the same limits, for comparison.
    :param excitation: conditioning of ``trajectory`` (one period at ``check_rate_hz``).
    :param start_excitation: the same for ``start``.
    :param sinusoid_excitation: the same for ``sinusoid``.
    :param limits: :func:`limit_check` of ``trajectory`` against the tightened limits.
    :param scale: factor applied to the optimised coefficients to satisfy the limits on the
        check grid (1: none needed).
    :param criterion: the criterion optimised.
    :param iterations: Adam steps run.
    :param wall_time_s: time of the design, s.
    """

    trajectory: FourierTrajectory
    start: FourierTrajectory
    sinusoid: FourierTrajectory
    excitation: Excitation
    start_excitation: Excitation
    sinusoid_excitation: Excitation
    limits: Dict[str, Any]
    scale: float
    criterion: str
    iterations: int
    wall_time_s: float


class _Problem:
    """The objective, the penalties and the limit repair of one design (float64, CPU)."""

    def __init__(self, model: RobotModel, limits: JointLimits, config: DesignConfig,
                 columns: Optional[RegressorColumns]) -> None:
        self.model, self.config = model, config
        self.base = base_parameters(model, columns)
        self.limits = limits
        self.omega = 2.0 * math.pi / config.period_s
        self.k = torch.arange(1, config.harmonics + 1, dtype=torch.float64)
        lower, upper, velocity, torque = (torch.tensor(v, dtype=torch.float64) for v in (
            limits.lower, limits.upper, limits.velocity, limits.torque))
        self.lower, self.upper, self.velocity, self.torque = lower, upper, velocity, torque
        self.finite = torch.isfinite(lower) & torch.isfinite(upper)
        self.mid = torch.where(self.finite, 0.5 * (lower + upper), torch.zeros_like(lower))
        self.half = torch.where(self.finite, 0.5 * (upper - lower), torch.ones_like(lower))
        # coefficients are velocities: measured in units of each joint's speed limit
        self.speed = torch.where(torch.isfinite(velocity), velocity, torch.ones_like(velocity))
        self.grid = config.period_s * torch.arange(config.samples,
                                                   dtype=torch.float64) / config.samples
        self.check_grid = torch.arange(0.0, config.period_s, 1.0 / config.check_rate_hz,
                                       dtype=torch.float64)

    def coefficients(self, z: Tensor, alpha: Tensor, beta: Tensor
                     ) -> Tuple[Tensor, Tensor, Tensor]:
        """Map free variables to ``(q0, a, b)``: offsets within limits, rest at ``t = 0``."""
        q0 = torch.where(self.finite, self.mid + self.half * torch.tanh(z), z)
        a = self.speed[:, None] * alpha
        b = self.speed[:, None] * beta
        # qd(0) = sum_k a_k = 0 and qdd(0) = omega sum_k k b_k = 0: start (and end) at rest
        a = a - a.mean(-1, keepdim=True)
        b = b - self.k * (b * self.k).sum(-1, keepdim=True) / self.k.square().sum()
        return q0, a, b

    def criterion(self, q: Tensor, qd: Tensor, qdd: Tensor) -> Tensor:
        """Return the criterion to minimise on stacked states (see :data:`CRITERIA`)."""
        r = len(self.base.independent)
        W = self.base.regressor(self.model, q, qd, qdd).reshape(-1, r)
        W = W / W.norm(dim=0).clamp_min(1e-12)
        singular = torch.linalg.svdvals(W).clamp_min(1e-300)
        if self.config.criterion == 'condition':
            return singular[0].log() - singular[-1].log()
        return -2.0 * singular.log().mean()

    def violation(self, q: Tensor, qd: Tensor, qdd: Tensor) -> Tensor:
        """Return the mean squared limit violations (positions in rad or m, others relative)."""
        tau = nominal_torque(self.model, q, qd, qdd)
        position = torch.relu(q - self.upper) + torch.relu(self.lower - q)
        velocity = torch.relu(qd.abs() - self.velocity) / self.velocity
        torque = torch.relu(tau.abs() - self.torque) / self.torque
        return sum((v.nan_to_num(0.0) ** 2).mean(0).sum() for v in (position, velocity, torque))

    def trajectory(self, q0: Tensor, a: Tensor, b: Tensor) -> FourierTrajectory:
        """Return the trajectory of tensors ``(q0, a, b)``."""
        return FourierTrajectory(self.model.joint_names, q0.tolist(), a.tolist(), b.tolist(),
                                 1.0 / self.config.period_s)

    def feasible_scale(self, q0: Tensor, a: Tensor, b: Tensor) -> float:
        """
        Return the largest scale of ``(a, b)`` (at most 1) within the limits on the check grid.

        Bisection (30 halvings); scale 0 is the robot at rest at ``q0``.

        :raises ValueError: when even rest at ``q0`` violates the limits (gravity torque).
        """
        def ok(scale: float) -> bool:
            with torch.no_grad():
                q, qd, qdd = fourier_states(q0, scale * a, scale * b, self.omega,
                                            self.check_grid)
                tau = nominal_torque(self.model, q, qd, qdd)
            return _check(q, qd, tau, self.limits)['satisfied']
        if ok(1.0):
            return 1.0
        if not ok(0.0):
            raise ValueError('holding the start configuration at rest already violates the '
                             'torque limits')
        low, high = 0.0, 1.0
        for _ in range(30):
            middle = 0.5 * (low + high)
            low, high = (middle, high) if ok(middle) else (low, middle)
        return low

    def measure(self, trajectory: FourierTrajectory) -> Excitation:
        """Return the conditioning of one period of a trajectory at the check rate."""
        with torch.no_grad():
            q, qd, qdd = trajectory.evaluate(self.check_grid)
        return _measure(self.model, self.base, q, qd, qdd)

    def sinusoid(self) -> FourierTrajectory:
        """Return one sinusoid per joint (phases spread), as large as the limits allow."""
        n = self.model.n
        phase = 2.0 * math.pi * torch.arange(n, dtype=torch.float64) / n
        amplitude = torch.minimum(self.speed / self.omega,
                                  torch.where(self.finite, self.half, torch.ones_like(self.half)))
        a = torch.zeros(n, self.config.harmonics, dtype=torch.float64)
        b = torch.zeros_like(a)
        a[:, 0] = amplitude * self.omega * torch.cos(phase)
        b[:, 0] = -amplitude * self.omega * torch.sin(phase)
        scale = self.feasible_scale(self.mid, a, b)
        return self.trajectory(self.mid, scale * a, scale * b)


def design_excitation(model: RobotModel, limits: JointLimits, config: DesignConfig,
                      columns: Optional[RegressorColumns] = None) -> ExcitationDesign:
    """
    Optimise a periodic Fourier excitation for the conditioning of the base regressor.

    Free variables: the offsets ``q0`` (kept inside the position limits by a ``tanh``) and the
    coefficients ``a``, ``b`` of :func:`fourier_states`, projected so that the trajectory
    starts and ends at rest (``qd(0) = qdd(0) = 0``).  Adam minimises the criterion of the
    column-normalised base regressor on ``config.samples`` states of one period plus
    ``config.penalty`` times the mean squared violations of the tightened limits (positions,
    speeds, nominal torques with gravity and friction, :func:`nominal_torque`), from a random
    start (local generator seeded with ``config.seed``) scaled into the limits.  The iterate
    kept is the best one without violations on that grid; it is then checked on one period at
    ``config.check_rate_hz`` and, if needed, its coefficients are scaled down (bisection)
    until it satisfies the tightened limits there exactly.

    :param model: the robot (every joint actuated; joints in model order).
    :param limits: the robot's limits (:meth:`JointLimits.tightened` by the config's margin
        and fractions before use).
    :param config: the settings.
    :param columns: regressor layout (default: NEA's inertial + viscous + Coulomb).
    :return: the design, with the start's and a plain sinusoid's conditioning beside it.
    :raises ValueError: limits that leave no room, or a start position that cannot be held.
    """
    start_time = time.perf_counter()
    model = model.to(dtype=torch.float64, device='cpu')
    tight = limits.tightened(config.margin, config.velocity_scale, config.torque_scale)
    problem = _Problem(model, tight, config, columns)
    generator = torch.Generator().manual_seed(config.seed)
    n, K = model.n, config.harmonics
    z = torch.zeros(n, dtype=torch.float64)
    alpha, beta = (torch.randn(n, K, generator=generator, dtype=torch.float64) / problem.k
                   for _ in range(2))
    q0, a, b = problem.coefficients(z, alpha, beta)
    scale = problem.feasible_scale(q0, a, b)
    start = problem.trajectory(q0, scale * a, scale * b)
    # the projection is linear: scaling the free coefficients scales (a, b)
    variables = [z.clone().requires_grad_(), (scale * alpha).requires_grad_(),
                 (scale * beta).requires_grad_()]
    optimiser = torch.optim.Adam(variables, lr=config.learning_rate)
    best = (math.inf, tuple(v.detach().clone() for v in variables))
    for _ in range(config.iterations):
        optimiser.zero_grad()
        q, qd, qdd = fourier_states(*problem.coefficients(*variables), problem.omega,
                                    problem.grid)
        value = problem.criterion(q, qd, qdd)
        violation = problem.violation(q, qd, qdd)
        if float(violation.detach()) == 0.0 and float(value.detach()) < best[0]:
            best = (float(value.detach()), tuple(v.detach().clone() for v in variables))
        (value + config.penalty * violation).backward()
        optimiser.step()
    with torch.no_grad():
        q0, a, b = problem.coefficients(*best[1])
    scale = problem.feasible_scale(q0, a, b)
    trajectory = problem.trajectory(q0, scale * a, scale * b)
    sinusoid = problem.sinusoid()
    return ExcitationDesign(
        trajectory=trajectory, start=start, sinusoid=sinusoid,
        excitation=problem.measure(trajectory), start_excitation=problem.measure(start),
        sinusoid_excitation=problem.measure(sinusoid),
        limits=limit_check(model, tight, trajectory, config.check_rate_hz), scale=scale,
        criterion=config.criterion, iterations=config.iterations,
        wall_time_s=time.perf_counter() - start_time)


__all__ = ['CRITERIA', 'DesignConfig', 'Excitation', 'ExcitationDesign', 'FORM',
           'FourierTrajectory', 'JointLimits', 'design_excitation', 'excitation',
           'excitation_limits', 'fourier_states', 'limit_check', 'nominal_torque',
           'trajectory_document', 'trajectory_from_document']
