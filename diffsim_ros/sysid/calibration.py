"""
Task-space observation model and calibration from motion-capture poses and joint torques.

Two calibrations that let a tracked body or a carried load drive identification (IDS section
3.2; the tracked box of CSVGD):

- **Tool / marker-body calibration** (:func:`calibrate_tool`): the pose of a tracked body is
  predicted by forward kinematics, ``T_mocap_tool = T_world_mocap^-1 T_world_link(q)
  T_link_tool``, and compared with the measured mocap poses (position error in m, rotation
  error as the geodesic angle in rad, each divided by its expected noise scale).
  ``T_link_tool`` (xyz + rotation vector) and optionally the mocap system's own world frame
  ``T_world_mocap`` are fitted by Levenberg-Marquardt, started from a closed-form solution
  (chordal rotation mean and linear least squares, or the Kronecker null-space solution of
  ``Z A_i Y = B_i`` when the mocap frame is unknown).
- **Payload identification** (:func:`identify_payload`): the mass, CoM and inertia of a rigid
  load fixed to a link, fitted from joint torques with the arm's own parameters held at the
  known model. The residual torque ``tau - rnea_arm(q, qd, qdd) - friction`` is linear in the
  payload's inertial vector, so the data reduce to a 10 x 10 normal system; the physically
  consistent fit (``make_parameterization``) is then a small L-BFGS problem on that system,
  started from the projected linear least-squares solution.

Rotation errors of :func:`pose_residuals` are expressed in the predicted tool frame:
``log(R_pred^T R_meas)``.
"""

from dataclasses import dataclass
import math
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from .dataset import Trajectory
from .losses import as_trajectories, Data, variance_scale
from .result import (check_choice, check_positive, EstimatorConfig, IdentificationResult)
from ..core.kinematics import forward_kinematics
from ..core.model import RobotModel
from ..core.parameterization import (is_physically_consistent, make_parameterization,
                                     mass_com_inertia)
from ..core.regressor import joint_torque_regressor
from ..core.spatial import homogeneous, matrix_to_rpy, transform_inertial, transform_inverse

Tensor = torch.Tensor

__all__ = ['CalibrationConfig', 'PAYLOAD_PARAMETERS', 'PayloadConfig', 'ToolCalibration',
           'calibrate_tool', 'identify_payload', 'pose_errors', 'pose_loss', 'pose_residuals',
           'predict_tool_poses', 'so3_exp', 'so3_log', 'tool_transform']

_DTYPES = {'float64': torch.float64, 'float32': torch.float32}
#: Names and units of the payload parameters reported by :func:`identify_payload`.
PAYLOAD_PARAMETERS = (('mass', 'kg'), ('com_x', 'm'), ('com_y', 'm'), ('com_z', 'm'),
                      ('ixx', 'kg m^2'), ('ixy', 'kg m^2'), ('ixz', 'kg m^2'),
                      ('iyy', 'kg m^2'), ('iyz', 'kg m^2'), ('izz', 'kg m^2'))


# -- SO(3) helpers -----------------------------------------------------------------------------
def _skew(w: Tensor) -> Tensor:
    wx, wy, wz = w.unbind(-1)
    zero = torch.zeros_like(wx)
    return torch.stack((torch.stack((zero, -wz, wy), -1),
                        torch.stack((wz, zero, -wx), -1),
                        torch.stack((-wy, wx, zero), -1)), -2)


def so3_exp(rotvec: Tensor) -> Tensor:
    """
    Return the rotation matrix of a rotation vector (Rodrigues), smooth at zero.

    :param rotvec: ``(..., 3)`` axis times angle, rad.
    :return: ``(..., 3, 3)``.
    """
    theta2 = (rotvec * rotvec).sum(-1)
    small = theta2 < 1e-8
    theta = torch.sqrt(torch.where(small, torch.ones_like(theta2), theta2))
    a = torch.where(small, 1.0 - theta2 / 6.0, torch.sin(theta) / theta)
    half = 0.5 * theta
    b = torch.where(small, 0.5 - theta2 / 24.0, 0.5 * (torch.sin(half) / half) ** 2)
    K = _skew(rotvec)
    eye = torch.eye(3, dtype=rotvec.dtype, device=rotvec.device)
    return eye + a[..., None, None] * K + b[..., None, None] * (K @ K)


def so3_log(R: Tensor) -> Tensor:
    """
    Return the rotation vector of a rotation matrix, differentiable at the identity.

    The angle is ``atan2(|vee(R - R^T)| / 2, (tr R - 1) / 2)`` (accurate at small angles);
    valid up to about 179 deg, which covers residuals and tool rotations alike.

    :param R: ``(..., 3, 3)`` rotation matrices.
    :return: ``(..., 3)`` axis times angle in rad, angle in ``[0, pi)``.
    """
    vee = torch.stack((R[..., 2, 1] - R[..., 1, 2], R[..., 0, 2] - R[..., 2, 0],
                       R[..., 1, 0] - R[..., 0, 1]), -1)
    cos_theta = 0.5 * (R.diagonal(dim1=-2, dim2=-1).sum(-1) - 1.0)
    norm2 = (vee * vee).sum(-1)
    small = norm2 < 1e-12
    norm = torch.sqrt(torch.where(small, torch.ones_like(norm2), norm2))
    theta = torch.atan2(0.5 * norm, cos_theta)
    # theta / (2 sin theta) = theta / |vee|; its series near 0 is 0.5 + theta^2 / 12.
    scale = torch.where(small, 0.5 + norm2 / 48.0, theta / norm)
    return scale[..., None] * vee


def _project_rotation(M: Tensor) -> Tensor:
    """Return the rotation closest to ``M (3, 3)`` in the Frobenius norm."""
    U, _, Vh = torch.linalg.svd(M)
    d = torch.sign(torch.linalg.det(U @ Vh))
    D = torch.diag(torch.stack((torch.ones_like(d), torch.ones_like(d), d)))
    return U @ D @ Vh


def tool_transform(xyz: Tensor, rotvec: Tensor) -> Tensor:
    """
    Return a rigid transform from a translation and a rotation vector.

    :param xyz: ``(..., 3)`` translation, m.
    :param rotvec: ``(..., 3)`` rotation vector, rad.
    :return: ``(..., 4, 4)``, differentiable w.r.t. both.
    """
    return homogeneous(so3_exp(rotvec), xyz)


# -- observation model -------------------------------------------------------------------------
def predict_tool_poses(model: RobotModel, q: Tensor, link: str, T_link_tool: Tensor,
                       T_world_mocap: Optional[Tensor] = None) -> Tensor:
    """
    Predict the poses a motion-capture system reports for a body fixed to a link.

    :param model: the robot.
    :param q: joint positions ``(..., n)`` in model joint order.
    :param link: link the tracked body is fixed to (any link of ``model.link_names``).
    :param T_link_tool: ``(4, 4)`` pose of the tracked body in the link frame.
    :param T_world_mocap: ``(4, 4)`` pose of the mocap frame in the robot's world frame, or
        ``None`` when the mocap system reports in the world frame.
    :return: ``T_mocap_tool`` ``(..., 4, 4)``.
    :raises KeyError: unknown link (listing the valid ones).
    """
    index = model.link_index(link)
    T_world_tool = forward_kinematics(model, q)[..., index, :, :] @ T_link_tool
    if T_world_mocap is not None:
        T_world_tool = transform_inverse(T_world_mocap) @ T_world_tool
    return T_world_tool


def pose_residuals(T_predicted: Tensor, T_measured: Tensor, position_scale: float = 1.0,
                   rotation_scale: float = 1.0) -> Tensor:
    """
    Return the normalised pose error of predicted vs measured poses.

    :param T_predicted: ``(..., 4, 4)`` predicted poses.
    :param T_measured: ``(..., 4, 4)`` measured poses (same frame).
    :param position_scale: position error counted as one unit, m.
    :param rotation_scale: rotation error counted as one unit, rad.
    :return: ``(..., 6)``: position error ``p_pred - p_meas`` (world/mocap axes) over
        ``position_scale``, then the rotation vector ``log(R_pred^T R_meas)`` (predicted tool
        axes; its norm is the geodesic angle) over ``rotation_scale``.
    """
    dp = T_predicted[..., :3, 3] - T_measured[..., :3, 3]
    dr = so3_log(T_predicted[..., :3, :3].mT @ T_measured[..., :3, :3])
    return torch.cat((dp / position_scale, dr / rotation_scale), -1)


def pose_errors(T_predicted: Tensor, T_measured: Tensor) -> Tuple[Tensor, Tensor]:
    """
    Return the position error norm and the geodesic rotation angle of each pose pair.

    :param T_predicted: ``(..., 4, 4)``.
    :param T_measured: ``(..., 4, 4)``.
    :return: ``(position (...) in m, angle (...) in rad)``.
    """
    r = pose_residuals(T_predicted, T_measured)
    return r[..., :3].norm(dim=-1), r[..., 3:].norm(dim=-1)


def pose_loss(model: RobotModel, q: Tensor, T_measured: Tensor, link: str, xyz: Tensor,
              rotvec: Tensor, position_scale: float = 1e-3, rotation_scale: float = 1e-2,
              T_world_mocap: Optional[Tensor] = None) -> Tensor:
    """
    Return the weighted task-space loss of a tool transform on mocap data.

    ``mean(|p_pred - p_meas|^2) / position_scale^2 + mean(angle^2) / rotation_scale^2``;
    differentiable w.r.t. ``xyz``, ``rotvec``, ``T_world_mocap`` and the model's kinematics.

    :param model: the robot.
    :param q: ``(N, n)`` joint positions.
    :param T_measured: ``(N, 4, 4)`` measured poses ``T_mocap_tool``.
    :param link: link the tracked body is fixed to.
    :param xyz: ``(3,)`` tool translation in the link frame, m.
    :param rotvec: ``(3,)`` tool rotation vector in the link frame, rad.
    :param position_scale: m (e.g. the mocap position noise).
    :param rotation_scale: rad.
    :param T_world_mocap: ``(4, 4)`` mocap frame in the world, or ``None`` (identity).
    :return: scalar loss.
    """
    T_pred = predict_tool_poses(model, q, link, tool_transform(xyz, rotvec), T_world_mocap)
    r = pose_residuals(T_pred, T_measured, position_scale, rotation_scale)
    return r.square().sum(-1).mean()


# -- tool calibration --------------------------------------------------------------------------
@dataclass(frozen=True)
class CalibrationConfig(EstimatorConfig):
    """
    Configuration of :func:`calibrate_tool` (frozen; :meth:`from_dict` rejects unknown keys).

    :param position_scale: position residual counted as one unit, m (the mocap noise std).
    :param rotation_scale: rotation residual counted as one unit, rad.
    :param estimate_mocap_frame: also fit ``T_world_mocap`` (mocap reports in its own frame).
    :param closed_form_init: start from the closed-form solution (else from identity).
    :param max_iterations: Levenberg-Marquardt iterations.
    :param tolerance: stop when the relative cost decrease of an accepted step is below it.
    :param initial_damping: initial LM damping (relative to the diagonal of ``J^T J``).
    :param dtype: ``'float64'`` or ``'float32'``.
    """

    position_scale: float = 1e-3
    rotation_scale: float = 1e-2
    estimate_mocap_frame: bool = False
    closed_form_init: bool = True
    max_iterations: int = 50
    tolerance: float = 1e-12
    initial_damping: float = 1e-3
    dtype: str = 'float64'

    def __post_init__(self) -> None:
        """Validate the fields."""
        for name in ('position_scale', 'rotation_scale', 'initial_damping'):
            check_positive(name, getattr(self, name))
        check_positive('tolerance', self.tolerance, allow_zero=True)
        check_positive('max_iterations', self.max_iterations, allow_zero=True, integer=True)
        check_choice('dtype', self.dtype, tuple(_DTYPES))
        for name in ('estimate_mocap_frame', 'closed_form_init'):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f'{name} must be a bool, got {getattr(self, name)!r}')


@dataclass(frozen=True, eq=False)
class ToolCalibration:
    """
    Result of :func:`calibrate_tool`.

    :param link: link the tracked body is fixed to.
    :param body: tracked body name (key of ``Trajectory.poses``).
    :param T_link_tool: ``(4, 4)`` fitted pose of the body in the link frame.
    :param T_world_mocap: ``(4, 4)`` fitted mocap frame in the world (identity when not
        estimated).
    :param rms_position: RMS position residual, m.
    :param rms_angle: RMS geodesic rotation residual, rad.
    :param iterations: Levenberg-Marquardt iterations run.
    :param converged: whether the tolerance was reached before ``max_iterations``.
    :param samples: number of pose samples used.
    :param history: cost after each iteration (normalised, see :func:`pose_loss`).
    :param estimate_mocap_frame: whether ``T_world_mocap`` was fitted.
    """

    link: str
    body: str
    T_link_tool: Tensor
    T_world_mocap: Tensor
    rms_position: float
    rms_angle: float
    iterations: int
    converged: bool
    samples: int
    history: Tuple[float, ...] = ()
    estimate_mocap_frame: bool = False

    @property
    def xyz(self) -> Tuple[float, float, float]:
        """Return the tool translation in the link frame, m."""
        return tuple(self.T_link_tool[:3, 3].tolist())

    @property
    def rpy(self) -> Tuple[float, float, float]:
        """Return the tool orientation as URDF fixed-axis roll, pitch, yaw, rad."""
        return tuple(matrix_to_rpy(self.T_link_tool[:3, :3]).tolist())

    @property
    def rotvec(self) -> Tuple[float, float, float]:
        """Return the tool orientation as a rotation vector, rad."""
        return tuple(so3_log(self.T_link_tool[:3, :3]).tolist())

    @property
    def parameters(self) -> Dict[str, Tuple[float, str]]:
        """Return named parameters with units: ``'tool/x'`` ... ``'tool/yaw'``, mocap frame."""
        out = {}
        for prefix, T, enabled in (('tool', self.T_link_tool, True),
                                   ('mocap', self.T_world_mocap, self.estimate_mocap_frame)):
            if not enabled:
                continue
            rpy = matrix_to_rpy(T[:3, :3]).tolist()
            for axis, value in zip('xyz', T[:3, 3].tolist()):
                out[f'{prefix}/{axis}'] = (value, 'm')
            for name, value in zip(('roll', 'pitch', 'yaw'), rpy):
                out[f'{prefix}/{name}'] = (value, 'rad')
        return out

    def to_dict(self) -> Dict[str, Any]:
        """Return a JSON/YAML-ready description."""
        return {'link': self.link, 'body': self.body, 'xyz': list(self.xyz),
                'rpy': list(self.rpy), 'T_world_mocap': self.T_world_mocap.tolist(),
                'estimate_mocap_frame': self.estimate_mocap_frame,
                'rms_position': self.rms_position, 'rms_angle': self.rms_angle,
                'iterations': self.iterations, 'converged': self.converged,
                'samples': self.samples}


def _check_unbatched(model: RobotModel, what: str) -> None:
    if len(model.batch_shape):
        raise ValueError(f'{what} needs an unbatched model, got parameter batch shape '
                         f'{tuple(model.batch_shape)}')


def _pose_data(model: RobotModel, trajectories: List[Trajectory], link: str, body: str,
               dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    """Return ``(T_world_link (N, 4, 4), T_mocap_tool (N, 4, 4))`` of all finite samples."""
    index = model.link_index(link)
    T_links, T_meas = [], []
    for traj in trajectories:
        if not traj.poses:
            raise ValueError(f'run {traj.run!r} has no tracked poses (Trajectory.poses is '
                             f'empty); calibration needs motion-capture poses of {body!r}')
        if body not in traj.poses:
            raise KeyError(f'unknown tracked body {body!r} in run {traj.run!r}; tracked '
                           f'bodies: {", ".join(sorted(traj.poses))}')
        if tuple(traj.joint_names) != tuple(model.joint_names):
            traj = traj.reorder(model.joint_names)
        q = traj.q.to(dtype=dtype, device=model.device)
        pose = traj.poses[body].to(dtype=dtype, device=model.device)
        valid = torch.isfinite(pose).flatten(-2).all(-1) & torch.isfinite(q).all(-1)
        with torch.no_grad():
            T_links.append(forward_kinematics(model, q[valid])[:, index])
        T_meas.append(pose[valid])
    T_link, T_meas = torch.cat(T_links), torch.cat(T_meas)
    if T_link.shape[0] < 3:
        raise ValueError(f'calibration needs at least 3 finite pose samples of {body!r}, '
                         f'got {T_link.shape[0]}')
    return T_link, T_meas


def _closed_form(T_A: Tensor, T_B: Tensor, mocap: bool) -> Tuple[Tensor, Tensor]:
    """
    Solve ``Z A_i Y = B_i`` for ``Y = T_link_tool`` and ``Z = T_mocap_world`` (or ``Z = E``).

    :return: ``(T_link_tool, T_world_mocap)``.
    """
    R_A, p_A = T_A[:, :3, :3], T_A[:, :3, 3]
    R_B, p_B = T_B[:, :3, :3], T_B[:, :3, 3]
    eye = torch.eye(3, dtype=T_A.dtype, device=T_A.device)
    if not mocap:
        R_Y = _project_rotation((R_A.mT @ R_B).sum(0))
        p_Y = (R_A.mT @ (p_B - p_A)[..., None]).squeeze(-1).mean(0)
        return homogeneous(R_Y, p_Y), torch.eye(4, dtype=T_A.dtype, device=T_A.device)
    # R_Z R_A = R_B R_Y^T, column-major vec: (R_A^T kron E) vec R_Z - (E kron R_B) vec R_Y^T = 0
    N = T_A.shape[0]
    left = torch.einsum('nab,ij->naibj', R_A.mT, eye).reshape(N, 9, 9)
    right = torch.einsum('ab,nij->naibj', eye, R_B).reshape(N, 9, 9)
    M = torch.cat((left, -right), -1)
    _, vectors = torch.linalg.eigh((M.mT @ M).sum(0))
    x = vectors[:, 0]
    Z = x[:9].reshape(3, 3).mT
    Yt = x[9:].reshape(3, 3).mT
    sign = torch.sign(torch.linalg.det(Z))
    R_Z = _project_rotation(sign * Z)
    R_Y = _project_rotation(sign * Yt).mT
    # p_B - R_Z p_A = [R_Z R_A, E] [p_Y; p_Z]
    A = torch.cat((R_Z @ R_A, eye.expand(N, 3, 3)), -1).reshape(3 * N, 6)
    b = (p_B - (R_Z @ p_A[..., None]).squeeze(-1)).reshape(3 * N, 1)
    solution = torch.linalg.lstsq(A, b).solution.squeeze(-1)
    T_mocap_world = homogeneous(R_Z, solution[3:])
    return homogeneous(R_Y, solution[:3]), transform_inverse(T_mocap_world)


def _perturb(T: Tensor, delta: Tensor) -> Tensor:
    """Return ``T`` moved by ``delta = [dp, dw]``: ``p + dp``, ``R exp(dw)``."""
    return homogeneous(T[:3, :3] @ so3_exp(delta[3:]), T[:3, 3] + delta[:3])


def _inverse_left_jacobian(phi: Tensor) -> Tensor:
    """Return ``J_l(phi)^-1 (..., 3, 3)``: ``log(exp(a) exp(phi)) = phi + J_l^-1 a + O(a^2)``."""
    theta2 = (phi * phi).sum(-1)
    small = theta2 < 1e-8
    theta = torch.sqrt(torch.where(small, torch.ones_like(theta2), theta2))
    coefficient = torch.where(
        small, 1.0 / 12.0 + theta2 / 720.0,
        1.0 / theta2.clamp_min(1e-300)
        - (1.0 + torch.cos(theta)) / (2.0 * theta * torch.sin(theta)))
    K = _skew(phi)
    eye = torch.eye(3, dtype=phi.dtype, device=phi.device)
    return eye - 0.5 * K + coefficient[..., None, None] * (K @ K)


def _tool_residuals(T_A: Tensor, T_B: Tensor, T_tool: Tensor, T_mocap: Optional[Tensor],
                    scales: Tuple[float, float]) -> Tuple[Tensor, Tensor]:
    """
    Return the stacked residuals ``(6 N,)`` and their Jacobian ``(6 N, k)`` (analytic).

    Parameters are right increments ``[dp, dw]`` of the tool (``p + dp``, ``R exp(dw)``) and,
    when ``T_mocap`` is given, ``[du, dv]`` of ``T_world_mocap``; ``k`` is 6 or 12.
    """
    R_A, p_A = T_A[:, :3, :3], T_A[:, :3, 3]
    R_Y, p_Y = T_tool[:3, :3], T_tool[:3, 3]
    N = T_A.shape[0]
    eye = torch.eye(3, dtype=T_A.dtype, device=T_A.device)
    R_m = eye if T_mocap is None else T_mocap[:3, :3]
    p_world = (R_A @ p_Y) + p_A
    p_pred = p_world if T_mocap is None else (p_world - T_mocap[:3, 3]) @ R_m
    R_pred = R_m.mT @ R_A @ R_Y
    r_rot = so3_log(R_pred.mT @ T_B[:, :3, :3])
    residual = torch.cat(((p_pred - T_B[:, :3, 3]) / scales[0], r_rot / scales[1]), -1)
    J_inv = _inverse_left_jacobian(r_rot)
    zero = torch.zeros(N, 3, 3, dtype=T_A.dtype, device=T_A.device)
    position = [R_m.mT @ R_A, zero]
    rotation = [zero, -J_inv]
    if T_mocap is not None:
        position += [-R_m.mT.expand(N, 3, 3), _skew(p_pred)]
        rotation += [zero, J_inv @ R_pred.mT]
    J = torch.cat((torch.cat(position, -1) / scales[0], torch.cat(rotation, -1) / scales[1]),
                  -2)
    return residual.reshape(-1), J.reshape(6 * N, -1)


def calibrate_tool(model: RobotModel, trajectories: Data, link: str, body: str,
                   config: Optional[CalibrationConfig] = None) -> ToolCalibration:
    """
    Fit the pose of a tracked body in a link frame (and the mocap frame) from mocap poses.

    Levenberg-Marquardt on :func:`pose_residuals` with the update ``T <- (R exp(dw), p + dp)``
    (right-multiplied rotation increments) and analytic Jacobians.

    :param model: the robot with known kinematics.
    :param trajectories: runs with ``q`` and ``poses[body]`` (``T_mocap_body`` per sample;
        non-finite samples, i.e. mocap dropouts, are skipped).
    :param link: the link the body is fixed to.
    :param body: tracked body name in ``Trajectory.poses``.
    :param config: the configuration (default :class:`CalibrationConfig`).
    :return: the calibration.
    :raises KeyError: unknown link or body (listing the valid names).
    :raises ValueError: runs without poses, fewer than 3 pose samples, or a model with
        parameter batch dims.
    """
    config = CalibrationConfig() if config is None else config
    trajectories = as_trajectories(trajectories, 'trajectories')
    dtype = _DTYPES[config.dtype]
    _check_unbatched(model, 'calibrate_tool')
    model.link_index(link)
    T_A, T_B = _pose_data(model.to(dtype=dtype), trajectories, link, body, dtype)
    mocap = config.estimate_mocap_frame
    if config.closed_form_init:
        T_tool, T_mocap = _closed_form(T_A, T_B, mocap)
    else:
        T_tool = torch.eye(4, dtype=dtype, device=T_A.device)
        T_mocap = T_tool.clone()
    scales = (config.position_scale, config.rotation_scale)

    def residuals(T_tool: Tensor, T_mocap: Tensor) -> Tensor:
        return _tool_residuals(T_A, T_B, T_tool, T_mocap if mocap else None, scales)[0]

    r = residuals(T_tool, T_mocap)
    cost = float(r.square().sum()) / T_A.shape[0]
    history, damping, converged, iterations = [cost], config.initial_damping, False, 0
    while iterations < config.max_iterations and not converged:
        iterations += 1
        r, J = _tool_residuals(T_A, T_B, T_tool, T_mocap if mocap else None, scales)
        JtJ, Jtr = J.mT @ J, J.mT @ r
        accepted = False
        for _ in range(20):
            A = JtJ + damping * torch.diag(JtJ.diagonal().clamp_min(1e-12))
            step = -torch.linalg.solve(A, Jtr)
            new_tool = _perturb(T_tool, step[:6])
            new_mocap = _perturb(T_mocap, step[6:]) if mocap else T_mocap
            r_new = residuals(new_tool, new_mocap)
            new_cost = float(r_new.square().sum()) / T_A.shape[0]
            if math.isfinite(new_cost) and new_cost <= cost:
                accepted = True
                break
            damping *= 4.0
        if not accepted:
            converged = True
            break
        decrease = (cost - new_cost) / max(cost, 1e-300)
        T_tool, T_mocap, r, cost = new_tool, new_mocap, r_new, new_cost
        damping = max(damping / 3.0, 1e-12)
        history.append(cost)
        converged = decrease < config.tolerance
    with torch.no_grad():
        T_pred = T_A @ T_tool
        if mocap:
            T_pred = transform_inverse(T_mocap) @ T_pred
        position, angle = pose_errors(T_pred, T_B)
    return ToolCalibration(
        link=link, body=body, T_link_tool=T_tool.detach(), T_world_mocap=T_mocap.detach(),
        rms_position=float(position.square().mean().sqrt()),
        rms_angle=float(angle.square().mean().sqrt()), iterations=iterations,
        converged=converged, samples=int(T_A.shape[0]), history=tuple(history),
        estimate_mocap_frame=mocap)


# -- payload identification --------------------------------------------------------------------
@dataclass(frozen=True)
class PayloadConfig(EstimatorConfig):
    """
    Configuration of :func:`identify_payload` (frozen; :meth:`from_dict` rejects unknown keys).

    :param parameterization: ``'log_cholesky'`` or ``'diffnea'`` (physically consistent).
    :param lbfgs_iterations: L-BFGS iterations on the consistent parameters.
    :param coulomb_eps: smoothing velocity of the known model's ``friction tanh(qd / eps)``.
    :param min_radius: smallest radius of gyration given to the starting body when the
        least-squares solution is not physically consistent, m.
    :param weighting: per-joint weights of the torque errors: ``'residual'`` (inverse noise
        std estimated from the residuals of a first least-squares fit), ``'variance'``
        (inverse torque std, as the other estimators) or ``'uniform'``.
    :param dtype: ``'float64'`` or ``'float32'``.
    """

    parameterization: str = 'log_cholesky'
    lbfgs_iterations: int = 100
    coulomb_eps: float = 1e-2
    min_radius: float = 1e-3
    weighting: str = 'residual'
    dtype: str = 'float64'

    def __post_init__(self) -> None:
        """Validate the fields."""
        check_choice('parameterization', self.parameterization, ('log_cholesky', 'diffnea'))
        check_positive('lbfgs_iterations', self.lbfgs_iterations, allow_zero=True,
                       integer=True)
        check_positive('coulomb_eps', self.coulomb_eps)
        check_positive('min_radius', self.min_radius)
        check_choice('weighting', self.weighting, ('residual', 'variance', 'uniform'))
        check_choice('dtype', self.dtype, tuple(_DTYPES))


def _feasible(pi: Tensor, radius: float) -> Tensor:
    """Project an inertial vector onto consistent bodies: m > 0, second moments >= m r^2."""
    mass = pi[0].clamp_min(1e-6)
    com = pi[1:4] / mass
    _, _, inertia_com = mass_com_inertia(torch.cat((mass[None], pi[1:])))
    inertia_com = 0.5 * (inertia_com + inertia_com.mT)
    eye = torch.eye(3, dtype=pi.dtype, device=pi.device)
    sigma = 0.5 * inertia_com.diagonal().sum() * eye - inertia_com
    values, vectors = torch.linalg.eigh(sigma)
    sigma = vectors @ torch.diag(values.clamp_min(mass * radius ** 2)) @ vectors.mT
    inertia_com = sigma.diagonal().sum() * eye - sigma
    cc = com[:, None] * com[None, :]
    inertia = inertia_com + mass * ((com @ com) * eye - cc)
    return torch.cat((mass[None], mass * com, inertia[0, :], inertia[1, 1:], inertia[2, 2:]))


def _joint_weights(Y: Tensor, residual: Tensor, tau: Tensor, weighting: str) -> Tensor:
    """Return per-joint weights ``(n,)`` of the torque errors (see :class:`PayloadConfig`)."""
    if weighting == 'uniform':
        return torch.ones_like(tau[0])
    weight = variance_scale(tau).rsqrt()
    if weighting == 'variance':
        return weight
    # Feasible generalised least squares: a first fit, then each joint weighted by the inverse
    # std of its own residual, i.e. its noise level.
    Yw = (Y * weight[:, None]).reshape(-1, 10)
    pi = torch.linalg.lstsq(Yw, (residual * weight).reshape(-1, 1)).solution.squeeze(-1)
    noise = variance_scale(residual - Y @ pi, floor=1e-4)
    return noise.rsqrt()


def _with_payload(model: RobotModel, body: int, pi_body: Tensor) -> RobotModel:
    inertial = model.inertial.detach().clone()
    inertial[..., body, :] = inertial[..., body, :] + pi_body
    return model.replace(inertial=inertial)


def identify_payload(model: RobotModel, trajectories: Data, link: str,
                     config: Optional[PayloadConfig] = None) -> IdentificationResult:
    """
    Identify a rigid payload fixed to a link from joint torques, the arm's model held known.

    The payload's inertial vector ``pi_p`` (about the link origin, link axes) enters the
    torques linearly: ``tau - damping qd - friction tanh(qd / eps) - rnea_arm(q, qd, qdd) =
    Y_body(q, qd, qdd) A pi_p`` with ``A`` the map from link to body frame. Each joint's error
    is weighted (``config.weighting``, by default by the inverse of its estimated noise std).

    :param model: the arm's known model (without the payload).
    :param trajectories: runs with ``q``, ``qd``, ``qdd`` and measured joint torques ``tau``.
    :param link: link the payload is fixed to (fixed links such as a tool flange allowed).
    :param config: the configuration (default :class:`PayloadConfig`).
    :return: an :class:`~diffsim_ros.sysid.result.IdentificationResult` with ``method
        'payload'``, the model with the payload merged into its body, ``parameters``
        ``'payload/mass'`` (kg), ``'payload/com_x|y|z'`` (m, link frame) and
        ``'payload/ixx'`` ... ``'payload/izz'`` (about the CoM, link axes, kg m^2); metrics
        ``torque_rmse`` (N m or N per joint) before and after, ``loss`` (unexplained fraction of
        the weighted payload torque signal), the unconstrained least-squares solution and its
        consistency; ``state['pi']`` the payload's 10-vector about the link origin.
    :raises KeyError: unknown link (listing the valid ones).
    :raises ValueError: link fixed to the base, runs without ``tau``/``qd``/``qdd``, or a
        model with parameter batch dims.
    """
    config = PayloadConfig() if config is None else config
    trajectories = as_trajectories(trajectories, 'trajectories')
    dtype = _DTYPES[config.dtype]
    _check_unbatched(model, 'identify_payload')
    model = model.to(dtype=dtype)
    start_time = time.monotonic()
    index = model.link_index(link)
    body = model.tree.link_bodies[index]
    if body < 0:
        movable = [n for n, b in zip(model.link_names, model.tree.link_bodies) if b >= 0]
        raise ValueError(f'link {link!r} is fixed to the base: a payload there does not act '
                         f'on the joints; movable links: {", ".join(movable)}')
    q, qd, qdd, tau = _torque_data(model, trajectories, dtype)
    with torch.no_grad():
        tau_net = (tau - model.damping * qd
                   - model.friction * torch.tanh(qd / config.coulomb_eps))
        Y_all = joint_torque_regressor(model, q, qd, qdd)             # (N, n, 10 n)
        pi_arm = model.inertial.reshape(-1)
        residual = tau_net - (Y_all @ pi_arm + model.armature * qdd)  # rnea of the arm
        Y = Y_all[..., 10 * body:10 * body + 10]
        basis = torch.eye(10, dtype=dtype, device=model.device)
        T_body_link = model.tree.T_body_link[index].to(dtype)
        A = transform_inertial(basis, T_body_link).mT          # pi_body = A pi_link
        Y = Y @ A                                              # (N, n, 10)
        weight = _joint_weights(Y, residual, tau, config.weighting)   # (n,)
        # Scaled so that the loss is the unexplained fraction of the payload's torque signal.
        signal = (residual * weight).square().mean()
        weight = weight / signal.sqrt() if float(signal) > 0 else weight
        Yw = (Y * weight[:, None]).reshape(-1, 10)
        rw = (residual * weight).reshape(-1)
        count = rw.shape[0]
        G, g, c = Yw.mT @ Yw / count, Yw.mT @ rw / count, float(rw @ rw) / count
        pi_ls = torch.linalg.lstsq(Yw, rw[:, None]).solution.squeeze(-1)
    ls_consistent = bool(is_physically_consistent(pi_ls))
    parameterization = make_parameterization(config.parameterization)
    start = pi_ls if ls_consistent else _feasible(pi_ls, config.min_radius)
    theta = parameterization.from_inertial(start).detach().clone().requires_grad_(True)

    def objective() -> Tensor:
        pi = parameterization.to_inertial(theta)
        return pi @ G @ pi - 2.0 * (g @ pi) + c

    history = [float(objective().detach())]
    if config.lbfgs_iterations:
        optimizer = torch.optim.LBFGS([theta], lr=1.0, max_iter=config.lbfgs_iterations,
                                      tolerance_grad=1e-14, tolerance_change=1e-16,
                                      history_size=20, line_search_fn='strong_wolfe')

        def closure() -> Tensor:
            optimizer.zero_grad()
            loss = objective()
            loss.backward()
            history.append(float(loss.detach()))
            return loss
        optimizer.step(closure)
    with torch.no_grad():
        pi = parameterization.to_inertial(theta)
        fitted = _with_payload(model, body, A @ pi)
        tau_rmse_before = residual.square().mean(0).sqrt()
        tau_rmse_after = (residual - Y @ pi).square().mean(0).sqrt()
    mass, com, inertia_com = mass_com_inertia(pi.detach())
    values = [float(mass)] + com.tolist() + [float(inertia_com[i, j]) for i, j in
                                             ((0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2))]
    parameters = {f'payload/{name}': (value, unit)
                  for (name, unit), value in zip(PAYLOAD_PARAMETERS, values)}
    return IdentificationResult(
        method='payload', model=fitted, parameters=parameters,
        history={'train': tuple(history)},
        metrics={'link': link, 'body': model.tree.body_links[body],
                 'samples': int(q.shape[0]),
                 'torque_rmse_before': tau_rmse_before.tolist(),
                 'torque_rmse': tau_rmse_after.tolist(),
                 'loss': history[-1], 'least_squares_pi': pi_ls.tolist(),
                 'least_squares_consistent': ls_consistent,
                 'consistent': bool(is_physically_consistent(pi.detach())),
                 'iterations': len(history) - 1,
                 'wall_time': time.monotonic() - start_time},
        command_joints=tuple(model.joint_names), coulomb_eps=config.coulomb_eps,
        config=config.to_dict(), state={'pi': pi.detach(), 'theta': theta.detach()})


def _torque_data(model: RobotModel, trajectories: Sequence[Trajectory],
                 dtype: torch.dtype) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Stack ``q, qd, qdd, tau`` of all runs in model joint order, checking they exist."""
    signals: Mapping[str, List[Tensor]] = {'q': [], 'qd': [], 'qdd': [], 'tau': []}
    for traj in trajectories:
        if tuple(traj.joint_names) != tuple(model.joint_names):
            traj = traj.reorder(model.joint_names)
        for name, values in signals.items():
            value = getattr(traj, name)
            if value is None:
                hint = ('record joint torques (Trajectory.tau)' if name == 'tau' else
                        'estimate derivatives first (diffsim_ros.sysid.filters)')
                raise ValueError(f'run {traj.run!r} has no {name!r}; payload identification '
                                 f'needs q, qd, qdd and tau: {hint}')
            values.append(value.to(dtype=dtype, device=model.device))
    return tuple(torch.cat(signals[k]) for k in ('q', 'qd', 'qdd', 'tau'))
