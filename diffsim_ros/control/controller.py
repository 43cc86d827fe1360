"""
The controller of the mpc node, built from its parameters: iLQR, MPPI or the task's baseline.

:func:`make_controller` turns a :class:`ControllerConfig` (the controller's part of the mpc
node's parameters) into a controller for a catalog robot.  Robots with a task in
:mod:`diffsim_ros.control.tasks` use its cost, step, horizon and baseline; others regulate to
``goal`` with a quadratic cost.  :func:`command_limit` and :func:`safe_command` give the
command bounds and the command sent when control stops, both checked against the robot's
command joints.  Torch only: no ROS, no files.

* iLQR and MPPI plan over a horizon and are re-solved at ``control_rate``.  With ``native``
  (default) every iLQR rollout is one call of the C++ rollout kernel and the backward pass
  runs in C++ (the Qube task's 3-iteration, 50-step solve: p50 1.7 ms, p99 6 ms on 2 shared
  cores); otherwise, or where the kernel does not apply, the rollouts run
  ``torch.compile``-d with ``compile``.
* The task's baseline (energy swing-up + LQR, PD + gravity) is a state feedback law, solved
  at every command tick from the newest state, as a driver-rate controller should be (held
  for a 50 Hz replanning period, the bang-bang energy pump loses the Qube's swing-up).  Its
  step is the command period, its model integrates the hold at the driver's rate, and its
  model steps (the law's probe and the one-tick state prediction of
  :class:`~diffsim_ros.control.planner.Planner`) run in the native kernel with ``native``,
  or ``torch.compile``-d with ``compile`` (compiling takes 20 s with a warm Inductor cache,
  1-2 min cold; a compiled Qube tick costs 1.2 ms instead of 3.8 ms eager, p50, loaded
  machine).
"""

from dataclasses import dataclass, field
import math
from typing import Any, Optional, Tuple

import numpy as np
import torch
from torch import nn

from .baselines import ComputedTorque, SwingUpLQR
from .costs import QuadraticCost, TrackingCost
from .dynamics import ModelDynamics
from .ilqr import ILQR, ILQRConfig
from .mppi import MPPI, MPPIConfig
from .tasks import DEFAULT_TRACKING, get_task, make_cost, make_ilqr, reference, Task, task_names
from ..core.model import RobotModel
from ..robots.catalog import RobotInfo

__all__ = ['CONTROLLERS', 'ControllerConfig', 'command_limit', 'make_controller',
           'safe_command']

#: Controllers :func:`make_controller` builds.
CONTROLLERS = ('ilqr', 'mppi', 'baseline')


@dataclass(frozen=True)
class ControllerConfig:
    """The controller's parameters (top-level parameters of the mpc node)."""

    # Each field is one ROS parameter of the mpc node: nodes/params.py reads the description
    # and the inclusive range from the metadata (written out: control/ may not import
    # nodes.params.meta, layers point down).
    controller: str = field(default='ilqr', metadata={'description': (
        "'ilqr', 'mppi' or 'baseline' (energy swing-up + LQR, or PD + gravity for arms)")})
    control_rate: float = field(default=0.0, metadata={'description': (
        "replanning rate, Hz; 0 = the robot task's rate (50 Hz without a task)"),
        'range': (0.0, 1000.0)})
    command_rate: float = field(default=0.0, metadata={'description': (
        "command publishing rate, Hz; 0 = the robot's driver rate"), 'range': (0.0, 10000.0)})
    dt: float = field(default=0.0, metadata={
        'description': "model step, s; 0 = the task's mpc_dt", 'range': (0.0, 1.0)})
    horizon: int = field(default=0, metadata={
        'description': "steps per plan; 0 = the task's horizon", 'range': (0, 10000)})
    iterations: int = field(default=0, metadata={'description': (
        "iLQR iterations / MPPI rounds per solve; 0 = the task's"), 'range': (0, 1000)})
    dtype: str = field(default='float64', metadata={
        'description': "solver dtype: 'float64'/'float32'"})
    predict_latency: bool = field(default=True, metadata={'description': (
        'baseline: roll the state forward with the model and the last command over its age '
        '(at most 4 driver ticks) plus one tick before solving (the energy law loses the '
        'swing at 2 ms delay)')})
    compile: bool = field(default=True, metadata={  # noqa: A003 (the option's name)
        'description': 'torch.compile the iLQR rollouts / the baseline model steps where the '
                       'native kernel does not run, warmed up before the first plan or '
                       'command (logged)'})
    native: bool = field(default=True, metadata={'description': (
        'roll out iLQR / MPPI / the baseline model steps in the C++ kernel (one call per '
        'horizon; falls back to compile where it does not apply)')})
    mppi_samples: int = field(default=256, metadata={
        'description': 'MPPI samples per round', 'range': (1, 1000000)})
    mppi_lambda: float = field(default=1.0, metadata={
        'description': 'MPPI temperature, cost units'})
    mppi_noise: float = field(default=0.3, metadata={'description': (
        'MPPI noise std as a fraction of the command limit'), 'range': (0.0, 10.0)})
    seed: int = field(default=0, metadata={'description': 'seed of the MPPI generator'})
    goal: Tuple[float, ...] = field(default=(), metadata={'description': (
        'goal positions (model joint order) for robots without a task; empty = zeros')})
    state_weight: Tuple[float, ...] = field(default=(), metadata={'description': (
        'diagonal of Q (2 n) for robots without a task; empty = 100 per q, 1 per qd')})
    control_weight: Tuple[float, ...] = field(default=(), metadata={'description': (
        'diagonal of R (one per command) for robots without a task; empty = 1e-3')})
    command_limit: Tuple[float, ...] = field(default=(), metadata={'description': (
        "symmetric limit per command joint; empty = the catalog's command_limit")})
    safe_command: Tuple[float, ...] = field(default=(), metadata={'description': (
        'command sent on stale data or a stalled solver; empty = zero effort')})

    def __post_init__(self) -> None:
        """Reject unknown choices and non-positive or negative values."""
        if self.controller not in CONTROLLERS:
            raise ValueError(f'unknown controller {self.controller!r}; valid: '
                             f'{", ".join(CONTROLLERS)}')
        if self.dtype not in ('float64', 'float32'):
            raise ValueError(f"dtype must be 'float64' or 'float32', got {self.dtype!r}")
        for name in ('control_rate', 'command_rate', 'dt', 'horizon', 'iterations'):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise ValueError(f'{name} must be >= 0, got {getattr(self, name)}')
        for name in ('mppi_samples', 'mppi_lambda', 'mppi_noise'):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise ValueError(f'{name} must be > 0, got {getattr(self, name)}')
        if any(not (math.isfinite(v) and v >= 0) for v in self.command_limit):
            raise ValueError(f'command_limit must be finite and >= 0, got {self.command_limit}')


def command_limit(info: RobotInfo, config: ControllerConfig) -> np.ndarray:
    """
    Return the symmetric limit per command joint, checking the configured length.

    :param info: catalog entry of the robot.
    :param config: the controller's parameters (``command_limit``, empty = the catalog's).
    :return: ``(m,)`` limits in the driver's unit, ``command_joints`` order.
    :raises ValueError: a configured limit of the wrong length.
    """
    limit = config.command_limit or tuple(info.command_limit[i] for i in info.command_indices)
    if len(limit) != len(info.command_joints):
        raise ValueError(f'command_limit needs {len(info.command_joints)} values '
                         f'({list(info.command_joints)}), got {len(limit)}')
    return np.asarray(limit, dtype=np.float64)


def safe_command(info: RobotInfo, config: ControllerConfig) -> np.ndarray:
    """
    Return the command sent when control stops (stale data, no plan), within the limits.

    :param info: catalog entry of the robot.
    :param config: the controller's parameters (``safe_command``, empty = zeros).
    :return: ``(m,)`` finite command, clipped to :func:`command_limit`.
    :raises ValueError: a configured command of the wrong length or not finite.
    """
    limit = command_limit(info, config)
    safe = np.asarray(config.safe_command or np.zeros(len(limit)), dtype=np.float64)
    if safe.shape != limit.shape or not np.all(np.isfinite(safe)):
        raise ValueError(f'safe_command needs {len(limit)} finite values, got '
                         f'{list(config.safe_command)}')
    return np.clip(safe, -limit, limit)


def make_controller(info: RobotInfo, model: RobotModel, config: ControllerConfig,
                    task: Optional[Task] = None,
                    friction_model: Optional[nn.Module] = None) -> Tuple[Any, float]:
    """
    Build the configured controller of a robot on a model (module docstring).

    :param info: catalog entry of the robot.
    :param model: the model to start from (float64; converted to ``config.dtype``).
    :param config: the controller's parameters.
    :param task: the task to control (default: the robot's task in
        :mod:`~diffsim_ros.control.tasks`, if it has one), e.g. the tracking task of an
        excitation trajectory (:func:`~diffsim_ros.control.tasks.tracking_task`).
    :param friction_model: the model's extra friction module (a fit's), or None.
    :return: ``(controller, control_rate_hz)``; the controller has ``solve``, ``set_model``
        and ``reset``; a baseline's rate is the command rate (it is solved at every command).
    :raises ValueError: a combination that does not exist (e.g. a baseline without a task).
    """
    if task is None and info.name in task_names():
        task = get_task(info.name)
    dtype = torch.float32 if config.dtype == 'float32' else torch.float64
    untasked = DEFAULT_TRACKING   # the same MPC settings as a tracking task without a template
    dt = config.dt or (task.mpc_dt if task else untasked['mpc_dt'])
    horizon = int(config.horizon or (task.horizon if task else untasked['horizon']))
    iterations = int(config.iterations or (task.iterations if task else untasked['iterations']))
    rate = config.control_rate or (task.control_rate_hz if task else untasked['control_rate_hz'])
    if config.controller == 'baseline':
        # Solved at every command tick: its step (the LQR gain's period) is that tick.
        rate = config.command_rate or info.driver_rate_hz
        dt = config.dt or 1.0 / rate
    limit = torch.as_tensor(command_limit(info, config), dtype=model.dtype)
    # A baseline's command is held for a command period: its model integrates that hold at
    # the driver's rate.
    substeps = max(1, int(round(dt * info.driver_rate_hz))) \
        if config.controller == 'baseline' else 1
    # A baseline evaluates its law and a model step at every command tick: those steps run
    # natively or compiled (the iLQR compiles its own rollouts through ILQRConfig.compile).
    dynamics = ModelDynamics.for_robot(info.name, model, dt, u_min=-limit, u_max=limit,
                                       substeps=substeps, native=bool(config.native),
                                       friction_model=friction_model)
    if config.controller == 'baseline' and config.compile and not dynamics.native:
        dynamics = dynamics.with_model(model, compile=True)
    if config.controller == 'baseline':
        if task is None:
            raise ValueError(f'no baseline for {info.name!r} (no task); use ilqr or mppi')
        if task.kind == 'swing_up':
            keys = ('energy_gain', 'max_acceleration', 'centering', 'switch_angle')
            return SwingUpLQR(dynamics, task.pendulum_joint, task.actuated_joint,
                              **{k: task.extra[k] for k in keys if k in task.extra}), rate
        # the task's computed-torque gains (acceleration per rad, per rad/s), as sim-eval
        gains = task.extra['computed_torque']
        return ComputedTorque(dynamics, lambda t: reference(task, t),
                              kp=[gains['kp']] * model.n, kd=[gains['kd']] * model.n,
                              horizon=horizon), rate
    if task is not None and task.kind == 'tracking':
        # The reference as a function of the horizon's times (TrackingCost.bind calls it with
        # a (H + 1,) tensor), so that a configured horizon may differ from the task's.
        weights = (torch.diag(torch.as_tensor(w, dtype=model.dtype)) for w in (
            task.state_weight, task.control_weight, task.terminal_weight))
        cost = TrackingCost(lambda times: torch.cat(reference(task, times)[:2], -1), *weights,
                            nx=2 * model.n)
    elif task is not None:
        cost = make_cost(task, model)
    else:
        n, nu = model.n, dynamics.nu
        q_goal = torch.zeros(n, dtype=model.dtype)
        if config.goal:
            q_goal = torch.as_tensor(config.goal, dtype=model.dtype).reshape(n)
        Q = torch.diag(torch.as_tensor(
            config.state_weight or (untasked['position_weight'],) * n
            + (untasked['velocity_weight'],) * n, dtype=model.dtype))
        R = torch.diag(torch.as_tensor(config.control_weight
                                       or (untasked['control_weight'],) * nu,
                                       dtype=model.dtype))
        cost = QuadraticCost(Q, R, Q, torch.cat((q_goal, torch.zeros_like(q_goal))))
    if config.controller == 'mppi':
        return MPPI(dynamics, cost, MPPIConfig(
            horizon=horizon, samples=config.mppi_samples, lambda_=config.mppi_lambda,
            noise_std=(config.mppi_noise * limit).tolist(), iters=iterations,
            seed=config.seed, dtype=dtype)), rate
    solver = ILQRConfig(horizon=horizon, max_iters=iterations, dtype=dtype,
                        compile=config.compile, native=config.native)
    if task is not None and task.kind == 'swing_up':
        # the goal follows every refitted model, and the LQR of the goal seeds each solve
        return make_ilqr(task, dynamics, solver), rate
    return ILQR(dynamics, cost, solver), rate
