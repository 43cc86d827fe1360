"""
Identification losses and the batched data they consume.

Three losses, each a normalised mean squared error (dimensionless, about 1 for a model that
explains none of the signal):

- :func:`inverse_dynamics_loss`: net applied torque vs rigid-body inverse dynamics on measured
  ``(q, qd, qdd)``, each joint normalised by a torque variance;
- :func:`forward_loss`: predicted vs measured joint accelerations (one-step forward model),
  normalised by the acceleration variance;
- :func:`rollout_loss`: multi-step simulation of many windows at once (the windows are the batch
  dim of one :func:`diffsim_ros.core.rollout` call, RK4 or semi-implicit Euler) vs the measured
  states, normalised per state coordinate, angle errors optionally wrapped to ``(-pi, pi]``.

Applied torques follow ``docs/conventions.md``: ``M qdd + h = tau_motor - tau_f`` with
``tau_motor = B actuator(u, B^T qd)`` (``B`` maps command columns to joints, see
:func:`command_matrix`) and ``tau_f = damping qd + friction tanh(qd / eps) + module(q, qd)``.
"""

from dataclasses import dataclass
import math
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from .dataset import Trajectory
from ..core.actuators import DCMotor
from ..core.dispatch import aba, rnea
from ..core.errors import ShapeError
from ..core.integrators import rollout
from ..core.model import RobotModel

Tensor = torch.Tensor
TorqueFn = Callable[[Tensor, Tensor, Tensor], Tensor]
AccelFn = Callable[[Tensor, Tensor, Tensor], Tensor]
Data = Union[Trajectory, Sequence[Trajectory]]

#: Largest relative deviation of a sample interval from the median that rollout windows accept.
DT_TOLERANCE = 0.25
#: Variances below this fraction of the largest one (same signal) are raised to it.
VARIANCE_FLOOR = 1e-6
#: Input sources an estimator can read the applied effort from.
INPUT_SOURCES = ('auto', 'tau', 'u')
#: Actuator models by config name (``'none'``: the inputs are joint torques).
ACTUATORS = ('none', 'dc_motor', 'qube_servo2', 'quanser_ip02')


@dataclass(frozen=True, eq=False)
class SampleBatch:
    """
    All samples of a data set stacked along the first dim.

    ``q``, ``qd``, ``qdd`` are ``(N, n)`` (``qdd`` may be ``None`` for rollout-only data),
    ``u`` is ``(N, m)``: joint torques (``source == 'tau'``) or actuator commands.
    """

    q: Tensor
    qd: Tensor
    qdd: Optional[Tensor]
    u: Tensor
    source: str

    def __len__(self) -> int:
        """Return the number of samples."""
        return self.q.shape[0]


@dataclass(frozen=True, eq=False)
class WindowBatch:
    """
    Rollout windows cut from runs.

    ``x0 (W, 2n)`` start states, ``controls (W, H, m)`` commands held over each step of
    ``dt`` s, and ``targets (W, H, 2n)`` the measured states after each step.
    """

    x0: Tensor
    controls: Tensor
    targets: Tensor
    dt: float

    def __len__(self) -> int:
        """Return the number of windows."""
        return self.x0.shape[0]

    @property
    def horizon(self) -> int:
        """Return the number of steps per window."""
        return self.controls.shape[-2]


def as_trajectories(data: Data, name: str = 'data') -> List[Trajectory]:
    """
    Return a list of trajectories from one trajectory or a sequence of them.

    :param data: a :class:`Trajectory` or a non-empty sequence of them.
    :param name: argument name for error messages.
    :return: list of trajectories.
    :raises ValueError: for an empty sequence or non-trajectory items.
    """
    items = [data] if isinstance(data, Trajectory) else list(data)
    if not items:
        raise ValueError(f'{name}: expected at least one Trajectory, got none')
    for item in items:
        if not isinstance(item, Trajectory):
            raise ValueError(f'{name}: expected Trajectory items, got {type(item).__name__}')
    return items


def resolve_source(trajectories: Sequence[Trajectory], source: str, has_actuator: bool) -> str:
    """
    Decide whether the applied effort comes from ``tau`` or from the commands ``u``.

    ``'auto'`` picks ``'u'`` when an actuator model is configured, else ``'tau'`` when every
    run has it, else ``'u'``.

    :param trajectories: the runs.
    :param source: ``'auto'``, ``'tau'`` or ``'u'``.
    :param has_actuator: whether commands go through an actuator model.
    :return: ``'tau'`` or ``'u'``.
    :raises ValueError: when the chosen signal is missing from a run.
    """
    if source not in INPUT_SOURCES:
        raise ValueError(f'unknown input source {source!r}; valid: {", ".join(INPUT_SOURCES)}')
    if source == 'auto':
        source = 'u' if has_actuator or any(t.tau is None for t in trajectories) else 'tau'
    if has_actuator and source == 'tau':
        raise ValueError("an actuator model maps commands u to torques: use input 'u'")
    for traj in trajectories:
        if getattr(traj, source) is None:
            raise ValueError(f'run {traj.run!r} has no {source!r} signal, which the '
                             f'estimator needs as its input')
    return source


def command_matrix(model: RobotModel, joints: Sequence[str]) -> Tensor:
    """
    Return the selection ``B (n, m)`` that maps command columns to joints.

    :param model: the robot.
    :param joints: the joint each command column drives, in command order.
    :return: ``B`` with ``B[model.joint_index(joints[k]), k] = 1``.
    """
    B = torch.zeros(model.n, len(joints), dtype=model.dtype, device=model.device)
    for k, joint in enumerate(joints):
        B[model.joint_index(joint), k] = 1.0
    return B


def command_joints_for(model: RobotModel, source: str, m: int,
                       configured: Sequence[str]) -> Tuple[str, ...]:
    """
    Return the joints the ``m`` input columns drive.

    :param model: the robot.
    :param source: ``'tau'`` (all joints, model order) or ``'u'``.
    :param m: number of input columns.
    :param configured: configured command joints (may be empty).
    :return: joint names in column order.
    :raises ValueError: when the column count does not match.
    """
    if source == 'tau':
        return tuple(model.joint_names)
    joints = tuple(configured) if configured else (
        tuple(model.joint_names) if m == model.n else ())
    if len(joints) != m:
        raise ValueError(f'the commands u have {m} columns but command_joints names '
                         f'{list(joints)}; set command_joints to the {m} joint(s) the '
                         f'commands drive (model joints: {list(model.joint_names)})')
    for joint in joints:
        model.joint_index(joint)
    return joints


def _prepare(traj: Trajectory, model: RobotModel) -> Trajectory:
    if tuple(traj.joint_names) != tuple(model.joint_names):
        traj = traj.reorder(model.joint_names)
    return traj.to(dtype=model.dtype, device=model.device)


def stack_samples(trajectories: Sequence[Trajectory], model: RobotModel, source: str,
                  need_qdd: bool) -> SampleBatch:
    """
    Stack every sample of the runs, with joint columns in model order.

    :param trajectories: the runs (joints mapped by name).
    :param model: the robot; gives joint order, dtype and device.
    :param source: ``'tau'`` or ``'u'`` (see :func:`resolve_source`).
    :param need_qdd: require accelerations (inverse-dynamics and forward losses).
    :return: the batch.
    :raises ValueError: for missing velocities / accelerations or differing command widths.
    """
    runs = [_prepare(t, model) for t in trajectories]
    for run in runs:
        if run.qd is None or (need_qdd and run.qdd is None):
            missing = 'qd' if run.qd is None else 'qdd'
            raise ValueError(f'run {run.run!r} has no {missing}; estimate derivatives first '
                             '(diffsim_ros.sysid.filters.estimate_derivatives)')
    widths = {getattr(run, source).shape[-1] for run in runs}
    if len(widths) != 1:
        raise ValueError(f'runs have different numbers of {source!r} columns: {sorted(widths)}')
    qdd = torch.cat([r.qdd for r in runs]) if all(r.qdd is not None for r in runs) else None
    return SampleBatch(q=torch.cat([r.q for r in runs]), qd=torch.cat([r.qd for r in runs]),
                       qdd=qdd, u=torch.cat([getattr(r, source) for r in runs]),
                       source=source)


def sample_interval(trajectories: Sequence[Trajectory]) -> float:
    """
    Return the common sample interval of the runs (median), checking that it is uniform.

    :param trajectories: the runs.
    :return: ``dt`` in s.
    :raises ValueError: when an interval deviates from the median by more than
        :data:`DT_TOLERANCE` (resample such data before fitting a rollout loss).
    """
    steps = torch.cat([t.t[1:] - t.t[:-1] for t in trajectories if len(t) > 1])
    if steps.numel() == 0:
        raise ValueError('rollout windows need runs with at least two samples')
    dt = float(steps.median())
    worst = float((steps - dt).abs().max()) / dt
    if worst > DT_TOLERANCE:
        raise ValueError(f'sample intervals vary by up to {100 * worst:.0f} % of the median '
                         f'{dt:.6g} s (limit {100 * DT_TOLERANCE:.0f} %); rollout losses need '
                         'uniformly sampled runs: resample them first')
    return dt


def make_windows(trajectories: Sequence[Trajectory], model: RobotModel, source: str,
                 horizon: int, stride: int) -> WindowBatch:
    """
    Cut every run into overlapping rollout windows.

    Window ``k`` of a run starts at sample ``k * stride``: ``x0 = [q; qd]`` there, the next
    ``horizon`` commands and the ``horizon`` measured states after them.

    :param trajectories: the runs.
    :param model: the robot (joint order, dtype, device).
    :param source: ``'tau'`` or ``'u'``.
    :param horizon: steps per window, >= 1.
    :param stride: samples between window starts, >= 1.
    :return: the windows of all runs, concatenated.
    :raises ValueError: when no run is longer than ``horizon``.
    """
    if horizon < 1 or stride < 1:
        raise ValueError(f'horizon and stride must be >= 1, got {horizon}, {stride}')
    dt = sample_interval(trajectories)
    x0, controls, targets = [], [], []
    for traj in trajectories:
        run = _prepare(traj, model)
        if len(run) <= horizon:
            continue
        if run.qd is None:
            raise ValueError(f'run {run.run!r} has no qd; estimate derivatives first')
        x = torch.cat((run.q, run.qd), -1)
        states = x.unfold(0, horizon + 1, stride).transpose(-1, -2)     # (W, H + 1, 2n)
        u = getattr(run, source)[:-1].unfold(0, horizon, stride).transpose(-1, -2)
        x0.append(states[:, 0])
        targets.append(states[:, 1:])
        controls.append(u)
    if not x0:
        raise ValueError(f'no run is longer than the rollout horizon of {horizon} samples')
    return WindowBatch(x0=torch.cat(x0), controls=torch.cat(controls),
                       targets=torch.cat(targets), dt=dt)


def variance_scale(x: Tensor, floor: float = VARIANCE_FLOOR) -> Tensor:
    """
    Return per-column variances, floored so that none is (nearly) zero.

    :param x: samples ``(N, d)``.
    :param floor: fraction of the largest variance below which a column is raised to it.
    :return: ``(d,)``, strictly positive.
    """
    var = x.detach().var(0, unbiased=False) if x.shape[0] > 1 else torch.ones_like(x[0])
    tiny = torch.finfo(x.dtype).tiny ** 0.5
    return var.clamp_min(max(float(var.max()) * floor, tiny))


def state_scale(q: Tensor, qd: Tensor, wrap_mask: Optional[Tensor] = None) -> Tensor:
    """
    Return the normalisation of state errors: variances of ``q`` and ``qd`` per joint.

    The position variance of a wrapped joint is capped at ``pi^2 / 3`` (uniform on a circle),
    so a continuously spinning joint still weighs its angle errors.

    :param q: positions ``(N, n)``.
    :param qd: velocities ``(N, n)``.
    :param wrap_mask: ``(n,)`` 1 for wrapped (revolute) joints, or ``None``.
    :return: ``(2n,)``.
    """
    var_q = variance_scale(q)
    if wrap_mask is not None:
        var_q = torch.where(wrap_mask > 0, var_q.clamp_max(math.pi ** 2 / 3.0), var_q)
    return torch.cat((var_q, variance_scale(qd)))


def normalized_mse(error: Tensor, scale: Tensor) -> Tensor:
    """
    Return ``mean(error^2 / scale)`` over all elements.

    :param error: ``(..., d)``.
    :param scale: ``(d,)`` variances.
    :return: scalar.
    """
    return (error.square() / scale).mean()


def wrap_angle_error(error: Tensor, wrap_mask: Tensor) -> Tensor:
    """
    Wrap the position part of state errors to ``(-pi, pi]`` on the masked joints.

    :param error: state errors ``(..., 2n)`` = ``[q; qd]`` differences.
    :param wrap_mask: ``(n,)`` 1 for joints whose angle error is wrapped.
    :return: ``(..., 2n)``.
    """
    n = wrap_mask.shape[-1]
    eq, ev = error[..., :n], error[..., n:]
    wrapped = torch.atan2(torch.sin(eq), torch.cos(eq))
    return torch.cat((torch.where(wrap_mask > 0, wrapped, eq), ev), -1)


def make_actuator(name: str, m: int, kwargs: Optional[Mapping[str, Any]] = None,
                  dtype: Optional[torch.dtype] = None,
                  device: Optional[torch.device] = None) -> Optional[nn.Module]:
    """
    Build an actuator model by config name.

    :param name: ``'none'`` (commands are joint torques), ``'dc_motor'``
        (:class:`~diffsim_ros.core.DCMotor` with ``kwargs`` as constructor arguments), or the
        catalogued ``'qube_servo2'`` / ``'quanser_ip02'`` motors (``kwargs`` override them).
    :param m: number of command columns (motors).
    :param kwargs: constructor arguments.
    :param dtype: parameter dtype.
    :param device: parameter device.
    :return: the module ``(u (..., m), qd (..., m)) -> tau (..., m)``, or ``None``.
    :raises ValueError: unknown name (listing the valid ones) or motor count mismatch.
    """
    if name not in ACTUATORS:
        raise ValueError(f'unknown actuator {name!r}; valid names: '
                         f'{", ".join(repr(a) for a in ACTUATORS)}')
    if name == 'none':
        return None
    args: Dict[str, Any] = {'dtype': dtype, 'device': device, **dict(kwargs or {})}
    if name == 'dc_motor':
        return DCMotor(m, **args)
    motor = DCMotor.qube_servo2(**args) if name == 'qube_servo2' else \
        DCMotor.quanser_ip02(**args)
    if motor.n != m:
        raise ValueError(f'actuator {name!r} drives {motor.n} joint(s) but the commands have '
                         f'{m} column(s)')
    return motor


def error_metrics(error: Tensor, scale: Tensor) -> Dict[str, Any]:
    """
    Return RMSE per column and the normalised MSE of an error signal.

    :param error: ``(N, d)`` errors.
    :param scale: ``(d,)`` variances of the reference signal.
    :return: ``{'rmse': [d floats], 'nmse': float}``.
    """
    error = error.detach()
    mse = error.square().mean(0)
    return {'rmse': mse.sqrt().tolist(), 'nmse': float((mse / scale).mean())}


def make_torque_fn(model: RobotModel, B: Tensor, actuator: Optional[nn.Module] = None,
                   friction: Optional[nn.Module] = None, coulomb_eps: float = 1e-2,
                   cache: Optional[Dict[str, Any]] = None) -> TorqueFn:
    """
    Return the net applied joint torque ``torque_fn(q, qd, u)`` of a model.

    ``tau = B a(u, B^T qd) - model.damping qd - model.friction tanh(qd / eps) - f(q, qd)``,
    where ``a`` is the actuator (identity when ``None``) and ``f`` the extra friction module.

    :param model: the robot (its ``damping`` / ``friction`` fields are used).
    :param B: command-to-joint selection ``(n, m)`` (:func:`command_matrix`).
    :param actuator: module ``(u (..., m), qd (..., m)) -> tau (..., m)`` or ``None``.
    :param friction: module ``(q, qd) -> tau_f (..., n)`` or ``None``.
    :param coulomb_eps: smoothing velocity of the Coulomb term, > 0.
    :param cache: a dict shared between the functions made for the same data: the Coulomb
        signal ``tanh(qd / eps)`` of a constant ``qd`` (not requiring grad) is kept there, keyed
        on the tensor, its version and ``eps``, so iterative fits compute it once.
    :return: the function, usable as ``torque_fn`` of :func:`diffsim_ros.core.rollout`.
    """
    identity = B.shape[-1] == B.shape[-2] and bool(torch.equal(B, torch.eye(
        B.shape[-1], dtype=B.dtype, device=B.device)))

    def coulomb_signal(qd: Tensor) -> Tensor:
        if cache is None or qd.requires_grad:
            return torch.tanh(qd / coulomb_eps)
        key = (id(qd), qd._version, coulomb_eps)
        if cache.get('key') != key:
            cache.update(key=key, qd=qd, value=torch.tanh(qd / coulomb_eps))
        return cache['value']

    def torque_fn(q: Tensor, qd: Tensor, u: Tensor) -> Tensor:
        if actuator is not None:
            u = actuator(u, qd @ B)
        tau = u if identity else u @ B.mT
        tau = tau - model.damping * qd - model.friction * coulomb_signal(qd)
        if friction is not None:
            tau = tau - friction(q, qd)
        return tau
    return torque_fn


def rigid_torque(model: RobotModel, batch: SampleBatch,
                 regressor: Optional[Tensor] = None) -> Tensor:
    """
    Return rigid-body inverse dynamics on the batch, from a precomputed regressor if given.

    :param model: the robot.
    :param batch: samples with ``qdd``.
    :param regressor: ``joint_torque_regressor(model, q, qd, qdd)`` ``(N, n, 10 n)`` computed
        with the same kinematics, or ``None`` to run RNEA.
    :return: ``(N, n)``.
    """
    if regressor is None:
        return rnea(model, batch.q, batch.qd, batch.qdd)
    pi = model.inertial.reshape(*model.inertial.shape[:-2], -1)
    if pi.dim() == 1 and regressor.is_contiguous():
        # one matrix-vector product over all rows: far fewer kernel calls than a batched matmul
        flat = regressor.view(-1, pi.shape[-1]) @ pi
        return flat.view(regressor.shape[:-1]) + model.armature * batch.qdd
    return (regressor @ pi.unsqueeze(-1)).squeeze(-1) + model.armature * batch.qdd


def inverse_dynamics_loss(model: RobotModel, torque_fn: TorqueFn, batch: SampleBatch,
                          scale: Tensor, regressor: Optional[Tensor] = None) -> Tensor:
    """
    Return the normalised inverse-dynamics torque error.

    ``mean_k,j (torque_fn(q, qd, u) - rnea(q, qd, qdd))_kj^2 / scale_j``.

    :param model: the robot.
    :param torque_fn: net applied torque (:func:`make_torque_fn`).
    :param batch: samples with ``qdd``.
    :param scale: ``(n,)`` torque variances.
    :param regressor: optional precomputed regressor (see :func:`rigid_torque`).
    :return: scalar loss.
    """
    error = torque_fn(batch.q, batch.qd, batch.u) - rigid_torque(model, batch, regressor)
    return normalized_mse(error, scale)


def forward_loss(model: RobotModel, torque_fn: TorqueFn, batch: SampleBatch,
                 scale: Tensor) -> Tensor:
    """
    Return the normalised one-step forward-dynamics (acceleration) error.

    :param model: the robot.
    :param torque_fn: net applied torque.
    :param batch: samples with ``qdd``.
    :param scale: ``(n,)`` acceleration variances.
    :return: scalar loss.
    """
    qdd = aba(model, batch.q, batch.qd, torque_fn(batch.q, batch.qd, batch.u))
    return normalized_mse(qdd - batch.qdd, scale)


def state_loss(predicted: Tensor, target: Tensor, scale: Tensor,
               wrap_mask: Optional[Tensor] = None) -> Tensor:
    """
    Return the normalised state error of simulated vs measured states.

    :param predicted: ``(..., 2n)``.
    :param target: ``(..., 2n)``.
    :param scale: ``(2n,)`` state variances (:func:`state_scale`).
    :param wrap_mask: ``(n,)`` joints whose angle error is wrapped, or ``None``.
    :return: scalar loss.
    """
    error = predicted - target
    if wrap_mask is not None:
        error = wrap_angle_error(error, wrap_mask)
    return normalized_mse(error, scale)


def rollout_loss(model: RobotModel, torque_fn: TorqueFn, windows: WindowBatch, scale: Tensor,
                 method: str = 'rk4', wrap_mask: Optional[Tensor] = None) -> Tensor:
    """
    Return the normalised multi-step rollout error over all windows (one batched rollout).

    :param model: the robot.
    :param torque_fn: net applied torque.
    :param windows: the windows (:func:`make_windows`).
    :param scale: ``(2n,)`` state variances.
    :param method: ``'rk4'`` or ``'semi_implicit_euler'``.
    :param wrap_mask: ``(n,)`` joints whose angle error is wrapped, or ``None``.
    :return: scalar loss.
    """
    states = rollout(model, windows.x0, windows.controls, windows.dt, method, torque_fn)
    return state_loss(states[..., 1:, :], windows.targets, scale, wrap_mask)


def integrate(accel_fn: AccelFn, x0: Tensor, controls: Tensor, dt: float,
              method: str = 'rk4') -> Tensor:
    """
    Simulate ``qdd = accel_fn(q, qd, u)`` from ``x0`` (for models without a ``RobotModel``).

    Same schemes as :mod:`diffsim_ros.core.integrators`, zero-order-hold commands.

    :param accel_fn: ``(q, qd, u) -> qdd``, e.g. a black-box network.
    :param x0: ``(..., 2n)``.
    :param controls: ``(..., T, m)``.
    :param dt: step in s.
    :param method: ``'rk4'`` or ``'semi_implicit_euler'``.
    :return: ``(..., T + 1, 2n)`` including ``x0``.
    """
    if method not in ('rk4', 'semi_implicit_euler'):
        raise ValueError(f'unknown integrator {method!r}; valid: rk4, semi_implicit_euler')
    if controls.dim() < 2:
        raise ShapeError(f'controls: expected shape (..., T, m), got {tuple(controls.shape)}')

    def derivative(x: Tensor, u: Tensor) -> Tensor:
        q, qd = x.chunk(2, dim=-1)
        return torch.cat((qd, accel_fn(q, qd, u)), -1)

    states = [x0]
    for u in controls.unbind(-2):
        x = states[-1]
        if method == 'semi_implicit_euler':
            q, qd = x.chunk(2, dim=-1)
            qd = qd + dt * accel_fn(q, qd, u)
            states.append(torch.cat((q + dt * qd, qd), -1))
            continue
        k1 = derivative(x, u)
        k2 = derivative(x + 0.5 * dt * k1, u)
        k3 = derivative(x + 0.5 * dt * k2, u)
        k4 = derivative(x + dt * k3, u)
        states.append(x + (dt / 6.0) * (k1 + 2.0 * k2 + 2.0 * k3 + k4))
    return torch.stack(states, -2)
