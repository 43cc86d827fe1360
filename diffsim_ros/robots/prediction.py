"""
How well a model predicts what was measured: open-loop rollouts over recorded data.

Shared by the model gate (:mod:`diffsim_ros.robots.gate`, which compares a new model with
the one in use on the node's recent data) and the monitor node (which shows the current
model's prediction of the last seconds beside the measurement).  Measurements are taken at
the sample nearest each time of a regular grid (:func:`nearest_samples`: no interpolation
across wrapped angles), commands as the mean of the held command signal over each grid step
(:func:`mean_commands`), and the model is driven through the robot's command map
(:meth:`~diffsim_ros.robots.interface.RobotInterface.torque_fn`).
"""

import math
from typing import Any, Dict, Optional

import numpy as np
import torch
from torch import nn

from .catalog import RobotInfo
from .interface import interface
from ..core.integrators import rollout
from ..core.kinematics import forward_kinematics
from ..core.model import RobotModel
from ..sysid.losses import normalized_mse, state_scale, wrap_angle_error

__all__ = ['end_effector_path', 'mean_commands', 'nearest_samples', 'predict_window']


def nearest_samples(t: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """
    Return the index of the measurement nearest each grid time.

    :param t: measurement times ``(N,)``, s, increasing, ``N >= 2``.
    :param grid: times ``(K,)``, s.
    :return: ``(K,)`` indices into ``t`` (the earlier one on a tie).
    """
    after = np.clip(np.searchsorted(t, grid), 1, len(t) - 1)
    return np.where(grid - t[after - 1] <= t[after] - grid, after - 1, after)


def mean_commands(t_cmd: np.ndarray, u: np.ndarray, grid: np.ndarray, m: int) -> np.ndarray:
    """
    Return the time average of the held command signal over each grid interval.

    The command signal holds each command from its arrival to the next one (zero before the
    first).  Averaging it over ``[grid[k], grid[k + 1])`` makes a rollout insensitive to
    whether a command arrived just before or just after a grid time.

    :param t_cmd: arrival times ``(M,)``, s, increasing (may be empty).
    :param u: commands ``(M, m)``.
    :param grid: interval bounds ``(K + 1,)``, s, increasing.
    :param m: command dimension.
    :return: ``(K, m)`` mean commands.
    """
    if len(t_cmd) == 0:
        return np.zeros((len(grid) - 1, m))
    # Integral of the held signal from t_cmd[0] to each arrival, then to each grid time.
    segments = u[:-1] * np.diff(t_cmd)[:, None]
    at_arrival = np.concatenate((np.zeros((1, m)), np.cumsum(segments, axis=0)))
    last = np.searchsorted(t_cmd, grid, side='right') - 1
    held = np.where(last[:, None] >= 0, u[np.maximum(last, 0)], 0.0)
    integral = np.where(last[:, None] >= 0, at_arrival[np.maximum(last, 0)]
                        + held * (grid - t_cmd[np.maximum(last, 0)])[:, None], 0.0)
    return np.diff(integral, axis=0) / np.diff(grid)[:, None]


def predict_window(model: RobotModel, info: RobotInfo, t, q, qd, t_cmd, u,
                   horizon: float, dt: float, integrator: str,
                   scale_floor: Optional[torch.Tensor] = None,
                   actuator: Optional[nn.Module] = None,
                   friction: Optional[nn.Module] = None) -> Optional[Dict[str, Any]]:
    """
    Roll the model over the last ``horizon`` seconds of measurements and score it.

    :param model: the model to evaluate.
    :param info: catalog entry of the robot.
    :param t: measurement times ``(N,)``, s, increasing.
    :param q: measured positions ``(N, n)`` in model joint order.
    :param qd: measured velocities ``(N, n)``.
    :param t_cmd: command times ``(M,)``, s, increasing (may be empty).
    :param u: commands ``(M, m)``, each held until the next (zero before the first); the
        rollout applies their mean over each step (:func:`mean_commands`).
    :param horizon: window length, s.
    :param dt: rollout step, s.
    :param integrator: ``'semi_implicit_euler'`` or ``'rk4'``.
    :param scale_floor: ``(2 n,)`` variances below which the window's own state variances
        are not taken (the monitor passes the largest it has seen: a window of a still
        pendulum has variances near zero, and its NMSE would measure the noise).
    :param actuator: the model's motor model (``None``: the robot's nominal one).
    :param friction: the model's extra friction module (a fit's sigmoid friction), or
        ``None``.
    :return: ``None`` when the measurements span less than the horizon, else ``t`` (grid
        ``(K + 1,)``), ``q_measured``/``q_predicted`` ``(K + 1, n)``, ``qd_predicted``,
        ``nmse`` (state) and ``nmse_q`` ``(n,)``, both ``inf`` if the rollout diverged, and
        ``scale``, the window's own variances ``(2 n,)``.
    """
    if len(t) < 2 or t[-1] - t[0] < horizon - 0.5 * dt:
        return None
    steps = max(1, int(round(horizon / dt)))
    grid = t[-1] - dt * np.arange(steps, -1, -1)
    index = nearest_samples(t, grid)
    controls = mean_commands(t_cmd, u, grid, len(info.command_joints))
    x_meas = torch.as_tensor(np.concatenate((q[index], qd[index]), axis=1),
                             dtype=model.dtype, device=model.device)
    with torch.no_grad():
        x_pred = rollout(model, x_meas[0], torch.as_tensor(controls, dtype=model.dtype,
                                                           device=model.device), dt, integrator,
                         interface(info.name).torque_fn(model, actuator, friction=friction))
    mask = model.tree.revolute_mask
    error = wrap_angle_error(x_pred - x_meas, mask)
    finite = bool(torch.isfinite(x_pred).all())
    own = state_scale(x_meas[:, :model.n], x_meas[:, model.n:], mask)
    scale = own if scale_floor is None else torch.maximum(own, scale_floor.to(own))
    nmse = float(normalized_mse(error, scale)) if finite else math.inf
    nmse_q = ((error[:, :model.n].square() / scale[:model.n]).mean(0).tolist() if finite
              else [math.inf] * model.n)
    return {'t': grid, 'q_measured': q[index], 'q_predicted': x_pred[:, :model.n].cpu().numpy(),
            'qd_predicted': x_pred[:, model.n:].cpu().numpy(), 'finite': finite, 'nmse': nmse,
            'nmse_q': nmse_q, 'scale': own}


def end_effector_path(model: RobotModel, info: RobotInfo, q: np.ndarray) -> np.ndarray:
    """
    Return end-effector positions in the base link's frame.

    :param model: the robot.
    :param info: catalog entry (``base_link``, ``end_effector_link``).
    :param q: positions ``(K, n)``.
    :return: ``(K, 3)`` positions, m.
    """
    with torch.no_grad():
        T = forward_kinematics(model, torch.as_tensor(q, dtype=model.dtype))
    base = model.link_names.index(info.base_link)
    ee = model.link_names.index(info.end_effector_link)
    T_base_ee = torch.linalg.solve(T[:, base], T[:, ee])
    return T_base_ee[:, :3, 3].cpu().numpy()
