"""
The mpc node's receding-horizon loop without ROS: newest state, model in use, plan, command.

A :class:`Planner` owns the controller (:func:`~diffsim_ros.control.controller.
make_controller`) and what the node's threads share around it:

* the newest accepted state and when it arrived (:meth:`Planner.observe`); time is counted
  from the first one, which is also the origin of tracking references, and starts over
  with :meth:`Planner.restart` (the controller forgets its warm start);
* a model waiting to replace the one in use (:meth:`Planner.offer`), swapped in by the next
  :meth:`Planner.solve`, which plans from the newest state (a baseline, solved at every
  command, first rolls the state forward over its age and one driver tick with the model
  and the last command: ``predict_latency``; a command the caller had no time to solve
  for evaluates the last law on the newest state as measured);
* the command (:meth:`Planner.command`): the plan evaluated on the newest state, turned
  into the driver's command by the robot interface (:meth:`~diffsim_ros.robots.interface.
  RobotInterface.command`: the model's gravity taken out for a driver that adds it),
  always finite and within the limits; the safe command when the state is stale, no plan
  exists, or the plan ended more than ``plan_timeout`` ago.

Every method is thread-safe.  Times are seconds of the caller's clock (the node clock).
Problems are counted in :attr:`Planner.stats` and reported through ``log.warn(key, text)``
(a throttled logger).
"""

from collections import deque
import threading
import time
from typing import Any, Deque, Dict, Optional, Tuple

import numpy as np
import torch
from torch import nn

from .controller import command_limit, ControllerConfig, make_controller, safe_command
from .policy import FeedbackPolicy
from .tasks import Task
from ..core.model import RobotModel
from ..robots.catalog import RobotInfo
from ..robots.interface import interface as robot_interface
from ..sysid.losses import command_matrix

__all__ = ['Planner']


class Planner:
    """
    The controller of the mpc node and the state its threads share (module docstring).

    :param info: catalog entry of the robot.
    :param config: the controller's parameters.
    :param model: the model to start from (the robot's nominal model, or a fit's).
    :param log: object with ``warn(key, text)`` for failed solves and unsafe commands.
    :param stale_timeout: a state older than this (s) is stale: the safe command is sent.
    :param plan_timeout: a plan that ended more than this long ago (s) is not applied.
    :param task: the task to control (default: the robot's; see
        :func:`~diffsim_ros.control.controller.make_controller`).
    :param friction: the extra friction module of ``model`` (a fit's sigmoid friction), or
        None.
    :raises ValueError: a configuration that does not fit the robot.
    """

    def __init__(self, info: RobotInfo, config: ControllerConfig, model: RobotModel,
                 log: Any, stale_timeout: float, plan_timeout: float,
                 task: Optional[Task] = None, friction: Optional[nn.Module] = None) -> None:
        self.info = info
        self.controller, self.control_rate = make_controller(info, model, config, task,
                                                             friction_model=friction)
        self.model = model
        #: The extra friction module of :attr:`model` (None: the URDF fields only).
        self.friction = friction
        #: A baseline is a state feedback law, solved at every command from the newest state.
        self.inline = config.controller == 'baseline'
        self.limit = command_limit(info, config)
        self.safe_command = safe_command(info, config)
        self.last_command = self.safe_command.copy()
        self.plan_expired = False
        self.stats: Dict[str, Any] = {
            'solves': 0, 'solve_errors': 0, 'solve_time_ms': float('nan'),
            'solve_time_max_ms': 0.0, 'models_accepted': 0, 'unsafe_commands': 0,
            'warm_up_s': 0.0}
        self._interface = robot_interface(info.name)
        # libfranka adds gravity to the commands: send what the model needs beyond it
        self._driver_gravity = self._interface.driver_adds_gravity and \
            not getattr(self.controller, 'gravity_in_command', False)
        if self._driver_gravity and self._interface.actuator() is not None:
            raise ValueError(f'{info.name}: a driver that adds gravity to voltage commands '
                             'is not supported (the policy commands joint torques there)')
        #: ``(n, m)`` command joints -> joints (models on the wire keep the nominal joints)
        self._B = command_matrix(model, self._interface.command_joints)
        self._predict = self.inline and config.predict_latency
        self._log = log
        self._stale_timeout, self._plan_timeout = float(stale_timeout), float(plan_timeout)
        self._lock = threading.Lock()
        self._x: Optional[np.ndarray] = None
        self._stamp = self._received = self._origin = None
        self._policy: Optional[FeedbackPolicy] = None
        self._reset = False
        self._pending: Optional[Tuple[RobotModel, Optional[nn.Module]]] = None
        self._x_solved: Optional[torch.Tensor] = None   # the inline baseline's (predicted) state
        self._solved_from: Optional[np.ndarray] = None   # the measured state it came from
        self._solve_times: Deque[float] = deque(maxlen=50)

    # -- what the node's threads hand in ---------------------------------------------------
    def observe(self, q: np.ndarray, qd: np.ndarray, stamp: float, received: float) -> None:
        """
        Take the newest accepted state.

        :param q: positions ``(n,)``, model joint order.
        :param qd: velocities ``(n,)``.
        :param stamp: its header stamp, s.
        :param received: when it was taken, s (the first one is the time origin).
        """
        with self._lock:
            self._x = np.concatenate((q, qd))
            self._stamp, self._received = stamp, received
            if self._origin is None:
                self._origin = received

    def restart(self) -> None:
        """Forget the time origin and the plan (time started over): plan from scratch."""
        with self._lock:
            self._origin, self._policy, self._reset = None, None, True

    def offer(self, model: RobotModel, friction: Optional[nn.Module] = None) -> None:
        """
        Queue a model (accepted by the model gate) for the next solve.

        :param model: the model; a newer offer replaces one not yet swapped in.
        :param friction: its extra friction module, or None.
        """
        with self._lock:
            self._pending = (model, friction)

    def is_stale(self, now: float) -> bool:
        """
        Tell whether no state arrived within ``stale_timeout``.

        :param now: current time, s.
        :return: True without a state or with one older than ``stale_timeout``.
        """
        received = self._received
        return received is None or now - received > self._stale_timeout

    def state_age(self, now: float) -> float:
        """
        Return how long ago the newest state arrived.

        :param now: current time, s.
        :return: seconds; ``inf`` before the first state.
        """
        received = self._received
        return float('inf') if received is None else now - received

    @property
    def policy(self) -> Optional[FeedbackPolicy]:
        """Return the newest plan (None before the first solve and after a restart)."""
        return self._policy

    @property
    def stamp(self) -> Optional[float]:
        """Return the header stamp of the newest state, s (None before the first)."""
        return self._stamp

    # -- solving ---------------------------------------------------------------------------
    def warm_up(self) -> Optional[float]:
        """
        Build the controller's compiled or native steps before its first plan.

        :return: seconds spent, or None when the controller has no warm-up or it failed
            (logged: the first solve builds them instead).
        """
        warm_up = getattr(self.controller, 'warm_up', None)
        if warm_up is None:
            return None
        try:
            seconds = warm_up()
        except Exception as error:  # noqa: BLE001 - the first solve compiles instead
            self._log.warn('solve', f'warm-up failed: {error!r}')
            return None
        self.stats['warm_up_s'] = seconds
        return seconds

    def solve(self, now: float) -> Optional[RobotModel]:
        """
        Swap in an offered model, then plan from the newest state and keep the plan.

        A failed solve is counted and logged; the previous plan stays.

        :param now: current time, s.
        :return: the model swapped in, or None.
        """
        with self._lock:
            x, pending, self._pending = self._x, self._pending, None
            model, friction = pending if pending is not None else (None, None)
            t = None if x is None else self._received - self._origin
            reset, self._reset = self._reset, False
            age = None if x is None else now - self._stamp
        try:
            if reset:
                self.controller.reset()
            if model is not None:
                self.controller.set_model(model, friction_model=friction)
                self.model, self.friction = model, friction
                self.stats['models_accepted'] += 1
            if x is None:
                return model
            start = time.perf_counter()
            x_t = torch.as_tensor(x)
            if self._predict:
                x_t, t = self._predicted(x_t, t, age)
            policy = self.controller.solve(x_t, t)
            self._x_solved, self._solved_from = x_t, x
            elapsed = 1e3 * (time.perf_counter() - start)
        except Exception as error:  # noqa: BLE001 - a failed solve keeps the old plan
            self.stats['solve_errors'] += 1
            self._log.warn('solve', f'failed: {error!r}')
            return model
        with self._lock:
            self._policy = policy
        self.stats['solves'] += 1
        self.stats['solve_time_ms'] = elapsed
        self.stats['solve_time_max_ms'] = max(self.stats['solve_time_max_ms'], elapsed)
        self._solve_times.append(time.monotonic())
        return model

    def _predicted(self, x: torch.Tensor, t: float, age: float) -> Tuple[torch.Tensor, float]:
        """Return the state and time one driver tick after now, predicted from ``x``."""
        tick = 1.0 / self.info.driver_rate_hz
        # At most 5 ticks: the cost is one model step per tick, and a graph that lags more
        # cannot run a driver-rate law anyway.
        lag = min(max(age, 0.0), 4.0 * tick) + tick
        dynamics = self.controller.dynamics
        steps = int(round(lag / dynamics.dt))
        u = torch.as_tensor(self.last_command, dtype=dynamics.model.dtype)
        with torch.no_grad():
            x = x.to(dynamics.model.dtype)
            for _ in range(steps):
                x = dynamics.step(x, u)
        return x, t + steps * dynamics.dt

    def solve_rate(self) -> float:
        """
        Return the recent solve rate on the wall clock (0 when solves stopped for 2 s).

        :return: Hz.
        """
        times = list(self._solve_times)
        if len(times) < 2 or time.monotonic() - times[-1] > 2.0:
            return 0.0
        return (len(times) - 1) / max(times[-1] - times[0], 1e-9)

    # -- commanding ------------------------------------------------------------------------
    def command(self, now: float) -> Tuple[np.ndarray, bool]:
        """
        Return the command to send now and whether the state is stale (module docstring).

        :param now: current time, s.
        :return: ``((m,) command in command_joints order, finite and within the limits,
            stale)``; the safe command when stale, without a plan or after it expired.
        """
        with self._lock:
            x, policy = self._x, self._policy
            stale = self.is_stale(now)
            t = None if self._origin is None else now - self._origin
        self.plan_expired = policy is not None and \
            t > policy.t0 + policy.horizon * policy.dt + self._plan_timeout
        if stale or policy is None or self.plan_expired:
            return self.safe_command, stale
        with torch.no_grad():
            x_t = torch.as_tensor(x)
            if self.inline and self._x_solved is not None and self._solved_from is x:
                x_t = self._x_solved   # the state one tick ahead, where the command acts
            u = policy(t, x_t).to(torch.float64)
            if self._driver_gravity:
                u = self._without_driver_gravity(u, x_t)
        u = u.cpu().numpy()
        if not np.all(np.isfinite(u)):
            self.stats['unsafe_commands'] += 1
            self._log.warn('command', 'non-finite command replaced by the safe command')
            return self.safe_command, stale
        return np.clip(u, -self.limit, self.limit), stale

    def _without_driver_gravity(self, u: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Return the command that makes a gravity-adding driver apply the policy's torque."""
        model = self.model
        x = x.to(model.dtype)
        torque = u.to(model.dtype) @ self._B.to(model.dtype).mT
        return self._interface.command(model, x[:model.n], x[model.n:], torque).to(u)
