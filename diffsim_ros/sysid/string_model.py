"""
Ball on a string hanging from a cup on a robot arm: the DiffNEA string model and its fit.

Model (DiffNEA, Lutter et al.; the ball-in-a-cup experiment). The arm is the rigid-body chain
of :mod:`diffsim_ros.core`; the cup frame is a learnable rigid transform ``(cup_xyz,
cup_rpy)`` from a link of the chain (the WAM-4's ``wam/tool_link``); the string's anchor is
the cup frame's origin ``p`` with world velocity ``v`` and acceleration ``a``
(:meth:`StringModel.cup_motion`). The ball is a particle ``x`` of unit mass (the string's
tension scales with the mass, so ball positions alone do not observe it) under gravity ``g``
and a viscous friction ``-c (xd - v)`` (``c`` in 1/s) on its velocity relative to the anchor,
held by an inextensible string of length ``l``: the constraint ``|x - p| <= l``.

Why relative: the paper adds "a small viscous friction for numerical stability" (its nominal
value, :data:`NOMINAL_FRICTION`, is our start); but what a string dissipates is its own
bending, which moves with the cup: the MuJoCo plant's string (:mod:`diffsim_ros.sim.cup`)
damps the rotation of each capsule joint relative to its parent, 1e-3 N m s/rad, about
``b / (m l^2)`` = 0.25 1/s on a 25 g ball at 0.40 m (measured: a 20 degree swing keeps 11.4
after 7 s, about 0.16 1/s). On the absolute velocity the same ``c`` would brake a ball that
the cup merely carries (a swing-up moves the cup at 1-3 m/s), which the plant's string does
not. Rotation of the cup about the anchor is not in it (the first capsule joint damps that
too; the string's bending spreads it, left unmodelled).

Constraint force (derived from the principle of virtual work). Write ``d = x - p``,
``r = |d|``, ``n = d / r``, ``w = xd - v`` (velocity relative to the anchor) and
``f0 = g - c w`` the free acceleration. A taut string does no work on motions that keep
``r = l``, so its force is along ``n``: ``xdd = f0 - T n`` with tension ``T >= 0``. Keeping
``r`` at ``l`` needs ``rdd = 0``; with ``rd = n . w`` and ``nd = (w - n (n . w)) / r``,

    rdd = nd . w + n . (xdd - a) = (|w|^2 - (n . w)^2) / r + n . (f0 - a) - T = 0,

    T = (|w|^2 - (n . w)^2) / r + n . (f0 - a),

the centripetal term plus the free acceleration relative to the anchor along the string.
The string acts only when it is taut and not going slack: ``r >= l - SLACK_TOLERANCE_M`` and
``n . w >= -SLACK_TOLERANCE_MPS``, and it only pulls: ``T`` is clipped at 0. The tolerances
(1 um, 1e-4 m/s) keep a ball that sits exactly on the sphere (as the step below leaves it)
from flickering slack through rounding.

Integration (:meth:`StringModel.rollout`): semi-implicit Euler at the anchor's samples,
``xd' = xd + dt xdd``, ``x' = x + dt xd'``, then a stabilisation of the length:

- held (the string pulled during the step, ``T > 0``): the ball ends on the sphere,
  ``x = p' + l n'`` with ``n' = (x' - p') / |x' - p'|`` (a radial correction of
  ``O(dt^2)``), and its velocity relative to the anchor is the tangential part of
  ``w + dt (xdd - a)`` at ``n``, carried to ``n'`` by the rotation between them. Keeping the
  radial part (the centripetal step) and projecting it away at ``n'`` instead would turn a
  fraction ``dt^2 |w|^2 / l^2`` of it into speed every step: about 20 %/s of energy for a
  0.4 m pendulum at 500 Hz; with the transport the energy error is that of symplectic Euler
  (bounded, ``O(dt)``).
- slack but overshooting (``|x' - p'| > l``, a string snapping taut): the ball is put back on
  the sphere and loses its outward velocity relative to the anchor (an inelastic jerk).

The closed-form tension thus decides when the string holds and when it goes slack (a ball
thrown inward or upward faster than the string can pull), and the two corrections keep
``|x - p| <= l`` exactly.

Fit (:func:`fit_string`; the constraint as a penalty). Four stages on ball positions with the
arm's joint trajectory known:

0. Anchor, in closed form (:func:`anchor_from_pulls`): where the string pulls, the ball's
   measured acceleration minus gravity points along the string to the anchor (friction is
   small), so the anchor lies on the line through ``x_obs,k`` along
   ``u_k = (xdd_obs,k - g) / |xdd_obs,k - g|``. A sample counts as pulled by a smooth
   rectifier of that pull, ``w_k = sigmoid((|xdd_obs,k - g| - 2) / 0.5)``, 0 below
   1 m/s^2 (a free-flying ball's, whose direction is noise); ``cup_xyz`` minimises
   ``sum_k w_k |P_k (p_theta,k - x_obs,k)|^2``
   (``P_k = I - u_k u_k^T``; the anchor is linear in ``cup_xyz``: linear least squares, with
   a ridge of ``1e-6`` per unit weight towards the start so that directions the data do not
   see keep it), solved twice, the second time with Cauchy weights
   ``1 / (1 + (r_k / s)^2)`` on each sample's distance ``r_k`` from its line
   (``s = 3 x`` the median, at least 0.5 mm: a ball touching the cup is not pulled by the
   string alone); then ``l`` is the mean of ``|x_obs,k - p_theta,k|`` with the same
   weights, the Cauchy factor included. The swing tilts the lines by its angle, so this
   sees the anchor's height on the hanging direction to first order in that angle, where
   the sphere of stage 1 sees it to second order only. It replaces the start, so the fit no
   longer depends on where it starts along that valley. On ``--seed 17``'s MuJoCo plants
   (0.35 / 0.40 / 0.45 m) the fit without it ended 2.7-19.3 mm off, by the start (e.g.
   12.4 mm from 0.40 m and 0.1 mm from 0.45 m on the 0.45 m plant); with it 0.1 / 0.7 /
   1.0 mm from every start tried (the measured length and 5 cm either way), this stage
   alone 1.3 / 1.6 / 1.9 mm. Skipped (the start kept) when fewer than 3 samples are pulled
   (``w_k > 1/2``).
1. Geometry: taut samples lie on the sphere ``|x_obs - p_theta| = l``. A sample counts as taut
   by a smooth rectifier of the string's tension measured from the data,
   ``s_k = -n_k . (xdd_obs,k - g)`` (m/s^2, ``n_k`` with the current estimate):
   ``w_k = sigmoid((s_k - 2) / 0.5)``, and the loss is
   ``sum_k w_k (|x_obs,k - p_theta,k| - l)^2 / sum_k w_k`` (the inequality made an equality
   where the string is seen to pull). Small swings show only a small cap of that sphere,
   along which the anchor's position on the hanging direction and ``l`` trade off almost
   freely: after stage 0 it refines; alone (``anchor=False``) it ends where the start
   puts it along that valley, and stage 2 (the pendulum's frequency over 0.2 s) moves it
   little.
2. Dynamics: multi-step rollouts of ``horizon`` steps from observed ball states, loss
   ``mean |x_pred - x_obs|^2`` plus ``penalty_weight * mean softplus_b(|x_obs - p_theta| -
   l)^2`` with ``softplus_b(z) = log(1 + exp(b z)) / b``, ``b = 1000`` 1/m: the inequality
   ``|x - p| <= l`` on every observed position as a smooth penalty (a ball 1 mm inside
   costs ``(0.3 mm)^2``, on the sphere ``(ln 2 / b)^2 = (0.7 mm)^2``, 1 mm outside
   ``(1.3 mm)^2``). This stage also moves the friction ``c``, but weakly: over its 0.2 s
   windows the whole range of ``c`` moves the error by about 0.1 mm, so each Adam step in
   ``log c`` is about a sign, and what it reaches depends on the step budget (20 steps left
   0.014-0.018 1/s on plants whose string dissipates about 0.16 1/s; 150 reached 0.16 on
   development plant 2; an online refit runs 60).
3. Damping: ``c`` alone on long windows (``damping_seconds``, default 1.5 s: several swings,
   where the decay shows in the amplitude) from observed ball states: the mean squared
   position error of :meth:`StringModel.rollout` over ``damping_windows`` evenly spaced
   windows is evaluated, without gradients, at :data:`DAMPING_GRID` values of ``c`` in one
   batched rollout, and ``c`` is the vertex of the parabola in ``log c`` through the best one
   and its neighbours. One forward pass: affordable online. Skipped (``c`` of stage 2 kept)
   when no recording is as long as a window.

What the data cannot tell: ``cup_rpy`` moves only the cup's walls, not the anchor, so the ball
on its string carries no information on it (it keeps its start value; its gradient is zero);
the ball's mass (see above).

Black-box baselines (:class:`BallFFNN`, :class:`BallLSTM`) predict the ball's acceleration from
the cup's motion and the ball's state, behind the same :meth:`rollout`; they are trained on
the same recordings (:func:`fit_ball_network`).
"""

from dataclasses import dataclass
import math
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn
import torch.nn.functional as F

from .dataset import Trajectory
from .estimators import fit as fit_arm
from .filters import accelerations_from_velocity, savgol_derivative
from .losses import Data
from ..core.kinematics import body_poses, motion_subspaces
from ..core.model import RobotModel
from ..core.spatial import motion_cross, rpy_to_matrix, small_matvec

Tensor = torch.Tensor

#: The link the cup is mounted on (the WAM-4's fixed tool frame after its 4th joint).
CUP_LINK = 'wam/tool_link'
#: Nominal string length (m), cup translation (m) and rotation (rad, URDF rpy) in CUP_LINK.
NOMINAL_STRING_LENGTH = 0.40
NOMINAL_CUP_XYZ = (0.0, 0.0, 0.06)
NOMINAL_CUP_RPY = (0.0, 0.0, 0.0)
#: Nominal viscous friction of the ball (1/s): small, for numerical stability as in the paper.
NOMINAL_FRICTION = 0.01
#: Stage 3's candidate frictions (1/s): a log grid (see the module's "Fit").
DAMPING_GRID = tuple(float(c) for c in torch.logspace(-3, 0, 13, dtype=torch.float64))
GRAVITY = (0.0, 0.0, -9.81)
SLACK_TOLERANCE_M = 1e-6
SLACK_TOLERANCE_MPS = 1e-4
#: Stage 1's taut-sample rectifier: tension threshold and softness (m/s^2).
TAUT_TENSION = 2.0
TAUT_SOFTNESS = 0.5
#: Samples per piece of :meth:`StringModel.link_motion` (see there).
LINK_MOTION_CHUNK = 8192
#: Stage 2's inequality penalty sharpness b (1/m).
PENALTY_SHARPNESS = 1000.0
#: Stage 0's ridge towards the start (per unit weight, m^2 / m^2) and the floor of its Cauchy
#: scale (m).
RIDGE = 1e-6
ROBUST_FLOOR_M = 5e-4


class LinkMotion:
    """
    World motion of one link along a trajectory, independent of the cup transform.

    :param R: link orientation ``(..., 3, 3)``; :param o: link origin ``(..., 3)`` (m);
    :param omega: angular velocity ``(..., 3)`` (rad/s); :param alpha: angular acceleration;
    :param v0: ``(..., 3)`` linear velocity and :param a0: linear acceleration of the
    body-fixed point at the world origin (spatial velocity/acceleration's linear parts).
    """

    def __init__(self, R: Tensor, o: Tensor, omega: Tensor, v0: Tensor, alpha: Tensor,
                 a0: Tensor) -> None:
        """Store the fields (see the class)."""
        self.R, self.o, self.omega, self.v0, self.alpha, self.a0 = R, o, omega, v0, alpha, a0


def link_motion(robot: RobotModel, link: str, q: Tensor, qd: Tensor, qdd: Tensor) -> LinkMotion:
    """
    Return the world motion of a link from joint positions, velocities and accelerations.

    Spatial velocities about the world origin, ``V_i = sum_{j <= i} S_j qd_j``, and
    accelerations ``A = sum_j (S_j qdd_j + (V_j x S_j) qd_j)`` over the link's ancestors
    (``dS_j/dt = V_j x S_j`` for a joint axis fixed in body j).

    :param robot: fixed-base robot model.
    :param link: link name.
    :param q: joint positions ``(..., n)`` (rad).
    :param qd: joint velocities ``(..., n)``.
    :param qdd: joint accelerations ``(..., n)``.
    :return: the link's :class:`LinkMotion`, leading dims of ``q``.
    """
    index = robot.link_index(link)
    body = robot.tree.link_bodies[index]
    T_world_body = body_poses(robot, q)
    S = motion_subspaces(robot, T_world_body)
    ancestors = robot.tree.ancestors.to(q.dtype)
    V = ancestors @ (S * qd.unsqueeze(-1))
    A_terms = S * qdd.unsqueeze(-1) + motion_cross(V, S) * qd.unsqueeze(-1)
    V_body = V[..., body, :]
    A_body = (ancestors[body].unsqueeze(-1) * A_terms).sum(-2)
    T_world_link = T_world_body[..., body, :, :] @ robot.tree.T_body_link[index].to(q.dtype)
    return LinkMotion(T_world_link[..., :3, :3], T_world_link[..., :3, 3], V_body[..., :3],
                      V_body[..., 3:], A_body[..., :3], A_body[..., 3:])


def point_motion(motion: LinkMotion, r_link: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """
    Return position, velocity and acceleration of a point fixed in a moving link.

    :param motion: the link's motion.
    :param r_link: the point in link coordinates ``(3,)`` (m), broadcast.
    :return: ``(p, v, a)`` world position (m), velocity (m/s), acceleration (m/s^2).
    """
    p = motion.o + small_matvec(motion.R, r_link.expand(motion.o.shape))
    v = motion.v0 + torch.linalg.cross(motion.omega, p)
    a = motion.a0 + torch.linalg.cross(motion.alpha, p) + torch.linalg.cross(motion.omega, v)
    return p, v, a


def integrate_ball(accel_fn, x0: Tensor, xd0: Tensor, p: Tensor, v: Tensor, a: Tensor,
                   dt: float, length: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """
    Integrate a ball with semi-implicit Euler along a given anchor motion.

    :param accel_fn: ``(x, xd, p, v, a, k) -> (xdd, held)`` at step ``k`` (``(..., 3)`` each;
        ``held`` ``(..., 1)`` bool where a string pulls, or None).
    :param x0: initial ball positions ``(..., 3)`` (m), world.
    :param xd0: initial ball velocities ``(..., 3)``.
    :param p: anchor positions ``(..., T, 3)``; :param v: velocities; :param a: accelerations.
    :param dt: step (s), the anchor's sample interval.
    :param length: string length for the inextensibility step (see the module), or None.
    :return: ``(x, xd)`` each ``(..., T, 3)`` with ``x[..., 0, :] = x0``.
    """
    shape = torch.broadcast_shapes(x0.shape[:-1], p.shape[:-2])
    x = x0.expand(shape + (3,))
    xd = xd0.expand(shape + (3,))
    xs, xds = [x], [xd]
    # One unbind instead of a select per step: each select's backward fills a full-size
    # zero gradient, which made the backward pass quadratic in the horizon.
    p, v, a = (value.expand(shape + value.shape[-2:]).unbind(-2) for value in (p, v, a))
    for k in range(len(p) - 1):
        xdd, held = accel_fn(x, xd, p[k], v[k], a[k], k)
        xd_next = xd + dt * xdd
        x_next = x + dt * xd_next
        if length is not None:
            x_next, xd_next = _inextensible(x, xd, xdd, x_next, xd_next, p[k], v[k], a[k],
                                            p[k + 1], v[k + 1], length, held, dt)
        x, xd = x_next, xd_next
        xs.append(x)
        xds.append(xd)
    return torch.stack(xs, dim=-2), torch.stack(xds, dim=-2)


def _inextensible(x: Tensor, xd: Tensor, xdd: Tensor, x_next: Tensor, xd_next: Tensor,
                  p: Tensor, v: Tensor, a: Tensor, p_next: Tensor, v_next: Tensor,
                  length: Tensor, held: Tensor, dt: float) -> Tuple[Tensor, Tensor]:
    """Return the step's end on the sphere where it is held or overshoots (see the module)."""
    d = x_next - p_next
    r = d.norm(dim=-1, keepdim=True).clamp_min(1e-9)
    n_next = d / r
    over = r > length
    x_next = torch.where(held | over, p_next + length * n_next, x_next)
    # Overshoot of a slack string: an inelastic jerk removes the outward relative velocity.
    radial = ((xd_next - v_next) * n_next).sum(-1, keepdim=True).clamp_min(0.0)
    jerked = xd_next - radial * n_next
    # Held: the relative velocity's tangential part, carried from n to n_next by the rotation
    # between them (R u = u - (n_next . u) (n + n_next) / (1 + n . n_next) for u normal to n).
    n = x - p
    n = n / n.norm(dim=-1, keepdim=True).clamp_min(1e-9)
    u = xd - v + dt * (xdd - a)
    u = u - n * (n * u).sum(-1, keepdim=True)
    cos = (n * n_next).sum(-1, keepdim=True).clamp_min(-0.5)
    u = u - (n_next * u).sum(-1, keepdim=True) / (1.0 + cos) * (n + n_next)
    xd_next = torch.where(held, v_next + u, torch.where(over, jerked, xd_next))
    return x_next, xd_next


class StringModel(nn.Module):
    """
    Cup on a robot link plus a ball on a string; learnable cup transform, length and friction.

    Parameters (all ``torch.nn.Parameter``): ``cup_xyz`` (m) and ``cup_rpy`` (rad) of the cup
    frame in ``link``; ``log_length`` (``string_length = exp``, m); ``log_friction``
    (``friction = exp``, 1/s). The robot model is only read (its kinematics up to ``link``).

    :param robot: fixed-base robot model (e.g. ``load_urdf(robots.urdf_path('wam4'))``).
    :param string_length: l (m), > 0.
    :param cup_xyz: cup origin (the string's anchor) in ``link`` (m).
    :param cup_rpy: cup orientation in ``link`` (rad, URDF roll-pitch-yaw).
    :param friction: the ball's viscous friction c (1/s) relative to the anchor, > 0.
    :param link: the link the cup is fixed to.
    :param gravity: world gravity (m/s^2).
    """

    def __init__(self, robot: RobotModel, string_length: float = NOMINAL_STRING_LENGTH,
                 cup_xyz: Sequence[float] = NOMINAL_CUP_XYZ,
                 cup_rpy: Sequence[float] = NOMINAL_CUP_RPY,
                 friction: float = NOMINAL_FRICTION, link: str = CUP_LINK,
                 gravity: Sequence[float] = GRAVITY) -> None:
        """Build the model (see the class); raises ValueError on invalid values."""
        super().__init__()
        if robot.tree.floating:
            raise ValueError('StringModel: the robot must have a fixed base')
        if not string_length > 0 or not friction > 0:
            raise ValueError(f'StringModel: string_length and friction must be positive, got '
                             f'{string_length} and {friction}')
        robot.link_index(link)
        dtype = robot.tree.axis.dtype
        self.robot = robot
        self.link = link
        self.cup_xyz = nn.Parameter(torch.tensor(cup_xyz, dtype=dtype))
        self.cup_rpy = nn.Parameter(torch.tensor(cup_rpy, dtype=dtype))
        self.log_length = nn.Parameter(torch.tensor(math.log(string_length), dtype=dtype))
        self.log_friction = nn.Parameter(torch.tensor(math.log(friction), dtype=dtype))
        self.register_buffer('gravity', torch.tensor(gravity, dtype=dtype))

    @property
    def string_length(self) -> Tensor:
        """Return the string length l (m), a 0-dim tensor."""
        return self.log_length.exp()

    @property
    def friction(self) -> Tensor:
        """Return the ball's viscous friction c (1/s), a 0-dim tensor."""
        return self.log_friction.exp()

    def parameters_dict(self) -> Dict[str, Any]:
        """
        Return the physical parameters as plain numbers.

        :return: ``string_length`` (m), ``cup_xyz`` (m), ``cup_rpy`` (rad), ``friction`` (1/s).
        """
        with torch.no_grad():
            return {'string_length': float(self.string_length),
                    'cup_xyz': [float(c) for c in self.cup_xyz],
                    'cup_rpy': [float(c) for c in self.cup_rpy],
                    'friction': float(self.friction)}

    def link_motion(self, q: Tensor, qd: Tensor, qdd: Tensor) -> LinkMotion:
        """
        Return the cup link's world motion (no learnable parameter enters it).

        :param q: joint positions ``(..., n)``; :param qd: velocities; :param qdd: accelerations.
        :return: :class:`LinkMotion` with the leading dims of ``q``.
        """
        shape = torch.broadcast_shapes(q.shape, qd.shape, qdd.shape)
        flat = [value.expand(shape).reshape(-1, shape[-1]) for value in (q, qd, qdd)]
        if flat[0].shape[0] <= LINK_MOTION_CHUNK:
            return link_motion(self.robot, self.link, q, qd, qdd)
        # Chunks keep the per-joint 4x4 temporaries in cache: 2.3 M samples (1500 rollouts
        # of 1500 steps) took 77 s in one piece and about 13 s in chunks (one busy core).
        parts = [link_motion(self.robot, self.link, *(value[i:i + LINK_MOTION_CHUNK]
                                                      for value in flat))
                 for i in range(0, flat[0].shape[0], LINK_MOTION_CHUNK)]
        fields = ('R', 'o', 'omega', 'v0', 'alpha', 'a0')
        joined = {name: torch.cat([getattr(part, name) for part in parts]) for name in fields}
        lead = shape[:-1]
        return LinkMotion(joined['R'].reshape(lead + (3, 3)),
                          *(joined[name].reshape(lead + (3,)) for name in fields[1:]))

    def cup_motion(self, q: Tensor, qd: Tensor, qdd: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """
        Return the world motion of the cup frame's origin (the string's anchor).

        :param q: joint positions ``(..., n)`` (rad), e.g. ``(B, T, 4)``.
        :param qd: joint velocities ``(..., n)`` (rad/s).
        :param qdd: joint accelerations ``(..., n)`` (rad/s^2).
        :return: ``(p, v, a)`` each ``(..., 3)``: world position (m), velocity (m/s) and
            acceleration (m/s^2), differentiable in ``cup_xyz``.
        """
        return point_motion(self.link_motion(q, qd, qdd), self.cup_xyz)

    def cup_frame(self, q: Tensor) -> Tuple[Tensor, Tensor]:
        """
        Return the world pose of the cup frame.

        :param q: joint positions ``(..., n)`` (rad).
        :return: ``(p, R)``: origin ``(..., 3)`` (m) and orientation ``(..., 3, 3)`` (columns:
            the cup's axes in world; +z out of the opening).
        """
        zero = torch.zeros_like(q)
        motion = self.link_motion(q, zero, zero)
        p = motion.o + small_matvec(motion.R, self.cup_xyz.expand(motion.o.shape))
        return p, motion.R @ rpy_to_matrix(self.cup_rpy)

    def cup_state(self, q: Tensor, qd: Tensor, qdd: Tensor
                  ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        """
        Return :meth:`cup_motion` and :meth:`cup_frame`'s orientation from one link motion.

        :param q: joint positions ``(..., n)`` (rad); :param qd: rad/s; :param qdd: rad/s^2.
        :return: ``(p, v, a, R)``: the anchor's ``(..., 3)`` world position, velocity and
            acceleration, and the cup's axes in world ``(..., 3, 3)``.
        """
        motion = self.link_motion(q, qd, qdd)
        return point_motion(motion, self.cup_xyz) + (motion.R @ rpy_to_matrix(self.cup_rpy),)

    def ball_acceleration(self, x: Tensor, xd: Tensor, p: Tensor, v: Tensor,
                          a: Tensor) -> Tensor:
        """
        Return the ball's acceleration: gravity, friction relative to the anchor, the pull.

        :param x: ball positions ``(..., 3)`` (m, world).
        :param xd: ball velocities ``(..., 3)`` (m/s).
        :param p: anchor positions ``(..., 3)``; :param v: velocities; :param a: accelerations.
        :return: ``(..., 3)`` in m/s^2 (the closed-form tension of the module's derivation,
            zero while the string is slack or going slack).
        """
        return string_acceleration(x, xd, p, v, a, self.string_length, self.friction,
                                   self.gravity)[0]

    def rollout(self, x0: Tensor, xd0: Tensor, p: Tensor, v: Tensor, a: Tensor,
                dt: float) -> Tuple[Tensor, Tensor]:
        """
        Simulate the ball along given anchor motions (semi-implicit Euler, see the module).

        :param x0: initial ball positions ``(B, 3)`` (m, world); any leading dims broadcast.
        :param xd0: initial ball velocities ``(B, 3)`` (m/s).
        :param p: anchor positions ``(B, T, 3)`` at the step times; :param v: velocities;
            :param a: accelerations (from :meth:`cup_motion`).
        :param dt: time step (s).
        :return: ``(x, xd)`` each ``(B, T, 3)``; ``x[:, 0] = x0``.
        """
        length = self.string_length
        friction = self.friction

        def accel(x, xd, p_k, v_k, a_k, k):
            return string_acceleration(x, xd, p_k, v_k, a_k, length, friction, self.gravity)

        return integrate_ball(accel, x0, xd0, p, v, a, dt, length)


def string_acceleration(x: Tensor, xd: Tensor, p: Tensor, v: Tensor, a: Tensor, length: Tensor,
                        friction: Tensor, gravity: Tensor) -> Tuple[Tensor, Tensor]:
    """
    Return the acceleration of a ball on a string (the module's closed-form constraint force).

    :param x: ball positions ``(..., 3)`` (m); :param xd: velocities (m/s).
    :param p: anchor positions ``(..., 3)``; :param v: velocities; :param a: accelerations.
    :param length: string length l (m), broadcast.
    :param friction: viscous friction c (1/s) on ``xd - v``, broadcast.
    :param gravity: ``(3,)`` (m/s^2).
    :return: ``(xdd, held)``: ``(..., 3)`` (m/s^2) and ``(..., 1)`` bool, True where the
        string pulls (taut and ``T > 0``).
    """
    w = xd - v
    free = gravity - friction * w
    d = x - p
    r = d.norm(dim=-1, keepdim=True).clamp_min(1e-9)
    n = d / r
    radial = (n * w).sum(-1, keepdim=True)
    tension = ((w * w).sum(-1, keepdim=True) - radial * radial) / r \
        + (n * (free - a)).sum(-1, keepdim=True)
    taut = (r >= length - SLACK_TOLERANCE_M) & (radial >= -SLACK_TOLERANCE_MPS)
    held = taut & (tension > 0)
    tension = torch.where(held, tension, torch.zeros_like(tension))
    return free - tension * n, held


@dataclass(frozen=True)
class BallRecording:
    """
    One run of the arm swinging the ball: joint states and the ball's measured position.

    :param t: ``(T,)`` times (s), uniform.
    :param q: ``(T, n)`` joint positions (rad), model order; :param qd: velocities (rad/s);
    :param qdd: accelerations (rad/s^2).
    :param ball: ``(T, 3)`` measured ball centre (m, world).
    :param ball_velocity: ``(T, 3)`` its smoothed derivative (m/s).
    :param ball_acceleration: ``(T, 3)`` its smoothed second derivative (m/s^2).
    """

    t: Tensor
    q: Tensor
    qd: Tensor
    qdd: Tensor
    ball: Tensor
    ball_velocity: Tensor
    ball_acceleration: Tensor

    @property
    def dt(self) -> float:
        """Return the sample interval (s)."""
        return float((self.t[-1] - self.t[0]) / (self.t.shape[0] - 1))


def ball_recording(run: Any, cutoff_hz: float = 15.0,
                   dtype: torch.dtype = torch.float64) -> BallRecording:
    """
    Return a :class:`BallRecording` from any run with ``t``, ``q``, ``qd`` and ``ball``.

    ``qdd`` is taken from the run when it has one, else differentiated from ``qd``; the
    ball's velocity and acceleration are Savitzky-Golay derivatives of its positions
    (:func:`~diffsim_ros.sysid.filters.savgol_derivative`, cutoff ``cutoff_hz``).

    :param run: e.g. a ``CupRecording`` of :mod:`diffsim_ros.sim.cup` (arrays or tensors).
    :param cutoff_hz: smoothing cutoff of the derivatives (Hz).
    :param dtype: tensor dtype.
    :return: the recording.
    :raises ValueError: a missing field or mismatched lengths.
    """
    for name in ('t', 'q', 'qd', 'ball'):
        if getattr(run, name, None) is None:
            raise ValueError(f'ball_recording: the run has no {name!r}')

    def tensor(value):
        return torch.as_tensor(value).to(dtype)

    t, q, qd, ball = (tensor(getattr(run, name)) for name in ('t', 'q', 'qd', 'ball'))
    if not (q.shape[0] == qd.shape[0] == ball.shape[0] == t.shape[0]) or ball.shape[-1] != 3:
        raise ValueError(f'ball_recording: lengths differ or ball is not (T, 3): t '
                         f'{tuple(t.shape)}, q {tuple(q.shape)}, qd {tuple(qd.shape)}, ball '
                         f'{tuple(ball.shape)}')
    qdd = getattr(run, 'qdd', None)
    qdd = savgol_derivative(qd, t, 1, cutoff_hz=cutoff_hz) if qdd is None else tensor(qdd)
    return BallRecording(t, q, qd, qdd, ball,
                         savgol_derivative(ball, t, 1, cutoff_hz=cutoff_hz).to(dtype),
                         savgol_derivative(ball, t, 2, cutoff_hz=cutoff_hz).to(dtype))


def _softplus(z: Tensor, sharpness: float) -> Tensor:
    return F.softplus(z * sharpness) / sharpness


class _Samples:
    """The recordings concatenated in time, with the cup link's motion (no parameter in it)."""

    def __init__(self, model: StringModel, runs: Sequence[BallRecording], horizon: int,
                 stride: int) -> None:
        self.dt = runs[0].dt
        for run in runs:
            if abs(run.dt - self.dt) > 1e-6 * self.dt:
                raise ValueError(f'fit_string: recordings have different sample intervals '
                                 f'({run.dt} s and {self.dt} s)')
        cat = torch.cat
        self.ball = cat([run.ball for run in runs])
        self.ball_velocity = cat([run.ball_velocity for run in runs])
        self.ball_acceleration = cat([run.ball_acceleration for run in runs])
        with torch.no_grad():
            self.motion = model.link_motion(cat([run.q for run in runs]),
                                            cat([run.qd for run in runs]),
                                            cat([run.qdd for run in runs]))
        self.lengths = [run.t.shape[0] for run in runs]
        self.starts = self.windows(horizon, stride)
        self.steps = torch.arange(horizon + 1)

    def windows(self, horizon: int, stride: int) -> Tensor:
        """Return the starts of all windows of ``horizon`` steps within one run."""
        starts, offset = [], 0
        for T in self.lengths:
            starts.extend(range(offset, offset + T - horizon, stride))
            offset += T
        return torch.tensor(starts, dtype=torch.long)


def _geometry_loss(model: StringModel, samples: _Samples) -> Tensor:
    """Stage 1 of :func:`fit_string`: tension-weighted sphere residual (m^2)."""
    p, _, _ = point_motion(samples.motion, model.cup_xyz)
    d = samples.ball - p
    r = d.norm(dim=-1)
    n = (d / r.unsqueeze(-1)).detach()
    # The ball's measured acceleration is g - T n where the string pulls (friction is small).
    tension = -(n * (samples.ball_acceleration - model.gravity)).sum(-1)
    w = torch.sigmoid((tension - TAUT_TENSION) / TAUT_SOFTNESS)
    return (w * (r - model.string_length) ** 2).sum() / w.sum().clamp_min(1.0)


def anchor_from_pulls(model: StringModel, motion: LinkMotion, ball: Tensor,
                      ball_acceleration: Tensor) -> Optional[Tuple[Tensor, Tensor]]:
    """
    Return the anchor and the string length from the directions of the string's pull.

    Stage 0 of :func:`fit_string` (the module's "Fit"): weighted linear least squares for
    ``cup_xyz`` on the lines through the ball along ``xdd - g``, a Cauchy-reweighted second
    solve, and the taut distance's mean with the second solve's weights.

    :param model: gives the start ``cup_xyz`` (the ridge's centre), the gravity and dtype.
    :param motion: the cup link's motion at the samples ``(T, ...)``.
    :param ball: ``(T, 3)`` measured ball positions (m, world).
    :param ball_acceleration: ``(T, 3)`` their second derivative (m/s^2).
    :return: ``(cup_xyz (3,), string_length ())``, or None when fewer than 3 samples are
        pulled.
    """
    with torch.no_grad():
        pull = ball_acceleration - model.gravity
        magnitude = pull.norm(dim=-1)
        # The sigmoid's tail is cut where the pull is too small to have a direction.
        weight = torch.sigmoid((magnitude - TAUT_TENSION) / TAUT_SOFTNESS) * \
            (magnitude > 0.5 * TAUT_TENSION)
        pulled = weight > 0.5
        if int(pulled.sum()) < 3:
            return None
        u = pull / magnitude.clamp_min(1e-9).unsqueeze(-1)
        # P R with P = I - u u^T: the anchor's distance from the line is P (o + R c - x).
        PR = motion.R - u.unsqueeze(-1) * (u.unsqueeze(-2) @ motion.R)
        offset = ball - motion.o
        Pb = offset - u * (u * offset).sum(-1, keepdim=True)
        start = model.cup_xyz.detach()
        eye = torch.eye(3, dtype=start.dtype)
        cup_xyz = start
        for robust in (False, True):
            w = weight
            if robust:
                r = (small_matvec(PR, cup_xyz.expand_as(Pb)) - Pb).norm(dim=-1)
                scale = max(3.0 * float(r[pulled].median()), ROBUST_FLOOR_M)
                w = weight / (1.0 + (r / scale) ** 2)
            ridge = RIDGE * float(w.sum())
            A = (w[:, None, None] * (PR.mT @ PR)).sum(0) + ridge * eye
            b = (w[:, None] * small_matvec(PR.mT, Pb)).sum(0) + ridge * start
            cup_xyz = torch.linalg.solve(A, b)
        distance = (ball - motion.o - small_matvec(motion.R, cup_xyz.expand_as(ball))).norm(dim=-1)
        return cup_xyz, (w * distance).sum() / w.sum()


def _rollout_loss(model: StringModel, samples: _Samples, starts: Tensor,
                  penalty_weight: float) -> Tuple[Tensor, Tensor]:
    """Stage 2 of :func:`fit_string`: mean squared position error and the penalty (m^2)."""
    p, v, a = point_motion(samples.motion, model.cup_xyz)
    index = starts.unsqueeze(-1) + samples.steps
    x, _ = model.rollout(samples.ball[starts], samples.ball_velocity[starts], p[index],
                         v[index], a[index], samples.dt)
    error = ((x - samples.ball[index]) ** 2).sum(-1).mean()
    excess = (samples.ball - p).norm(dim=-1) - model.string_length
    penalty = (_softplus(excess, PENALTY_SHARPNESS) ** 2).mean()
    return error, penalty_weight * penalty


def _damping_stage(model: StringModel, samples: _Samples, seconds: float,
                   windows: int) -> Optional[List[float]]:
    """
    Stage 3 of :func:`fit_string`: set the friction from long windows (see the module).

    :return: the mean squared error (m^2) per :data:`DAMPING_GRID` value, or None (skipped).
    """
    horizon = int(round(seconds / samples.dt))
    starts = samples.windows(horizon, 1)
    if horizon < 2 or starts.numel() == 0 or windows < 1:
        return None
    pick = torch.linspace(0, starts.numel() - 1, min(windows, starts.numel()))
    starts = starts[pick.round().long()]
    dtype = model.cup_xyz.dtype
    grid = torch.tensor(DAMPING_GRID, dtype=dtype)
    with torch.no_grad():
        p, v, a = point_motion(samples.motion, model.cup_xyz)
        index = starts.unsqueeze(-1) + torch.arange(horizon + 1)
        length = model.string_length
        friction = grid.reshape(-1, 1, 1)

        def accel(x, xd, p_k, v_k, a_k, k):
            return string_acceleration(x, xd, p_k, v_k, a_k, length, friction, model.gravity)

        x0 = samples.ball[starts].expand(grid.numel(), -1, -1)
        xd0 = samples.ball_velocity[starts].expand(grid.numel(), -1, -1)
        x, _ = integrate_ball(accel, x0, xd0, p[index], v[index], a[index], samples.dt,
                              length)
        error = ((x - samples.ball[index]) ** 2).sum(-1).mean((-2, -1))
        best = int(error.argmin())
        log_c = float(grid[best].log())
        if 0 < best < grid.numel() - 1:
            # Vertex of the parabola through the best value and its neighbours (equal steps).
            e0, e1, e2 = (float(e) for e in error[best - 1:best + 2])
            step = float(grid[1].log() - grid[0].log())
            curvature = e0 - 2.0 * e1 + e2
            if curvature > 0:
                log_c += 0.5 * step * (e0 - e2) / curvature
        model.log_friction.fill_(log_c)
    return error.tolist()


def fit_string(recordings: Sequence[Any], model: StringModel, horizon: int = 100,
               stride: int = 20, batch_windows: int = 128, geometry_iterations: int = 300,
               iterations: int = 150, penalty_weight: float = 1.0, cutoff_hz: float = 15.0,
               seed: int = 0, damping_seconds: float = 1.5,
               damping_windows: int = 48,
               anchor: bool = True) -> Tuple[StringModel, Dict[str, List[float]]]:
    """
    Identify string length, cup transform and ball friction from ball positions.

    The four stages and the penalty are the module's "Fit" section: linear least squares
    for ``cup_xyz`` and the length in the first (:func:`anchor_from_pulls`), Adam in the
    next two, on ``cup_xyz`` (m), ``log_length`` and ``log_friction``, a batched line search
    on ``log_friction`` in the last; ``cup_rpy`` is not learned (the ball does not observe
    it). The arm's joint trajectory is taken as known.

    :param recordings: runs with ``t``, ``q``, ``qd`` (``qdd`` optional) and ``ball``
        (``(T, 3)`` world, m), or :class:`BallRecording` s; one sample interval.
    :param model: start model (copied, not modified).
    :param horizon: rollout window of stage 2 (steps).
    :param stride: spacing of the windows' starts (steps).
    :param batch_windows: windows drawn per stage-2 iteration.
    :param geometry_iterations: Adam steps of stage 1.
    :param iterations: Adam steps of stage 2.
    :param penalty_weight: weight of the inequality penalty in stage 2.
    :param cutoff_hz: derivative smoothing cutoff (:func:`ball_recording`).
    :param seed: seed of the local generator drawing the windows.
    :param damping_seconds: window of stage 3 (s); 0 skips the stage.
    :param damping_windows: windows of stage 3 (evenly spaced over the recordings).
    :param anchor: run stage 0; False starts stage 1 at ``model`` (e.g. to rerun the later
        stages on a fitted model).
    :return: ``(fitted model, losses)``; losses maps ``'anchor'`` to stage 0's
        ``[string_length]`` (m; empty when skipped), ``'geometry'`` (m^2 per sample),
        ``'rollout'`` and ``'penalty'`` (m^2 per step) to lists, ``'damping'`` to stage 3's
        error per :data:`DAMPING_GRID` value (m^2 per step; empty when skipped),
        ``'seconds'`` to the wall time.
    :raises ValueError: no recording long enough for one window, differing sample intervals.
    """
    started = time.perf_counter()
    fitted = _copy_model(model)
    dtype = fitted.cup_xyz.dtype
    runs = [run if isinstance(run, BallRecording) else ball_recording(run, cutoff_hz, dtype)
            for run in recordings]
    samples = _Samples(fitted, runs, horizon, stride)
    if samples.starts.numel() == 0:
        raise ValueError(f'fit_string: no recording is longer than horizon={horizon} steps')
    fitted.cup_rpy.requires_grad_(False)
    losses: Dict[str, List[float]] = {'anchor': [], 'geometry': [], 'rollout': [],
                                      'penalty': []}
    found = anchor_from_pulls(fitted, samples.motion, samples.ball,
                              samples.ball_acceleration) if anchor else None
    if found is not None:
        with torch.no_grad():
            fitted.cup_xyz.copy_(found[0])
            fitted.log_length.fill_(float(found[1].log()))
        losses['anchor'].append(float(found[1]))
    geometry = torch.optim.Adam([{'params': [fitted.cup_xyz], 'lr': 2e-3},
                                 {'params': [fitted.log_length], 'lr': 1e-2}])
    for _ in range(geometry_iterations):
        geometry.zero_grad()
        loss = _geometry_loss(fitted, samples)
        loss.backward()
        geometry.step()
        losses['geometry'].append(loss.item())
    dynamics = torch.optim.Adam([{'params': [fitted.cup_xyz], 'lr': 3e-4},
                                 {'params': [fitted.log_length], 'lr': 1e-3},
                                 {'params': [fitted.log_friction], 'lr': 5e-2}])
    generator = torch.Generator().manual_seed(seed)
    for _ in range(iterations):
        pick = torch.randperm(samples.starts.numel(), generator=generator)[:batch_windows]
        dynamics.zero_grad()
        error, penalty = _rollout_loss(fitted, samples, samples.starts[pick], penalty_weight)
        (error + penalty).backward()
        dynamics.step()
        losses['rollout'].append(error.item())
        losses['penalty'].append(penalty.item())
    damping = _damping_stage(fitted, samples, damping_seconds, damping_windows) \
        if damping_seconds > 0 else None
    losses['damping'] = damping or []
    fitted.cup_rpy.requires_grad_(True)
    losses['seconds'] = [time.perf_counter() - started]
    return fitted, losses


def _copy_model(model: StringModel) -> StringModel:
    """Return an independent copy of a string model (same robot, copied parameters)."""
    params = model.parameters_dict()
    copy = StringModel(model.robot, params['string_length'], params['cup_xyz'],
                       params['cup_rpy'], params['friction'], model.link,
                       model.gravity.tolist())
    return copy


def arm_trajectory(run: Any, robot: RobotModel, cutoff_hz: float = 20.0) -> Trajectory:
    """
    Return a :class:`~diffsim_ros.sysid.dataset.Trajectory` of an arm run for identification.

    A run without ``qdd`` gets it from its measured velocities, the torques filtered alike
    (:func:`~diffsim_ros.sysid.filters.accelerations_from_velocity`).

    :param run: a ``Trajectory`` or any run with ``t``, ``q``, ``qd``, ``tau`` (``qdd``
        optional), columns in model order.
    :param robot: the arm (joint names, dtype).
    :param cutoff_hz: low-pass cutoff of the derivative (Hz).
    :return: the trajectory, with ``qdd``.
    """
    if not isinstance(run, Trajectory):
        def tensor(name):
            value = getattr(run, name, None)
            return None if value is None else torch.as_tensor(value).to(robot.dtype)

        run = Trajectory(t=tensor('t'), q=tensor('q'), qd=tensor('qd'), qdd=tensor('qdd'),
                         tau=tensor('tau'), joint_names=tuple(robot.joint_names), run='arm')
    if run.qdd is None:
        run = accelerations_from_velocity(run, cutoff_hz)
    return run


def fit_cup_model(arm_recordings: Data, string_recordings: Sequence[Any], robot: RobotModel,
                  arm_estimator: str = 'diffnea',
                  arm_config: Optional[Mapping[str, Any]] = None,
                  start: Optional[StringModel] = None,
                  **string_options: Any) -> Tuple[RobotModel, StringModel]:
    """
    Identify the arm (rigid-body dynamics) and the cup-and-string model, the paper's way.

    The arm by the existing fixed-base identification
    (:func:`diffsim_ros.sysid.estimators.fit`, ``arm_estimator``) on the high-acceleration
    sinusoid; the string by :func:`fit_string` on the slow swings, with the catalogue
    kinematics up to the cup link (the cup transform is learned, the arm's kinematics not).

    :param arm_recordings: arm run(s): ``Trajectory`` s or runs with ``t``, ``q``, ``qd``,
        ``tau`` (see :func:`arm_trajectory`).
    :param string_recordings: swing runs with ``t``, ``q``, ``qd``, ``ball``.
    :param robot: the nominal arm model (e.g. the catalogue WAM-4).
    :param arm_estimator: estimator name (``'nea'``, ``'diffnea'``...).
    :param arm_config: its configuration mapping.
    :param start: the string model to start from (default: nominal values on ``robot``).
    :param string_options: keyword arguments of :func:`fit_string`.
    :return: ``(identified arm model, fitted string model)``.
    """
    runs = [arm_trajectory(run, robot) for run in
            (arm_recordings if isinstance(arm_recordings, (list, tuple)) else [arm_recordings])]
    arm = fit_arm(arm_estimator, robot, runs, config=arm_config).model
    start = StringModel(robot) if start is None else start
    string, _ = fit_string(string_recordings, start, **string_options)
    return arm, string


class BallNetwork(nn.Module):
    """
    Black-box ball model: a network maps the cup's motion and the ball's state to ``xdd``.

    Inputs per step, in world axes: ``x - p``, ``xd - v``, ``v``, ``a`` (12 numbers, the
    cup's task-space motion and the ball's state relative to it), standardised with the
    training data's mean and spread; the output is de-standardised to m/s^2. No constraint:
    whatever the network predicts is integrated by the same semi-implicit Euler step as
    :meth:`StringModel.rollout`, without its length correction.

    The network computes in its own dtype (float32 by default, as networks usually do; it
    trains and rolls out about twice as fast as in float64) on the standardised inputs; the
    states, the standardisation and the accelerations stay in the caller's dtype.
    """

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        """Create the standardisation buffers (identity until :func:`fit_ball_network`)."""
        super().__init__()
        self.register_buffer('input_mean', torch.zeros(12, dtype=dtype))
        self.register_buffer('input_std', torch.ones(12, dtype=dtype))
        self.register_buffer('output_mean', torch.zeros(3, dtype=dtype))
        self.register_buffer('output_std', torch.ones(3, dtype=dtype))

    def features(self, x: Tensor, xd: Tensor, p: Tensor, v: Tensor, a: Tensor) -> Tensor:
        """
        Return the standardised network inputs.

        :param x: ball positions ``(..., 3)`` (m); :param xd: velocities (m/s).
        :param p: cup positions ``(..., 3)``; :param v: velocities; :param a: accelerations.
        :return: ``(..., 12)``.
        """
        raw = torch.cat((x - p, xd - v, v, a), dim=-1)
        return ((raw - self.input_mean) / self.input_std).to(self.input_mean.dtype)

    def to_acceleration(self, output: Tensor, like: Tensor) -> Tensor:
        """Return ``output`` (standardised, ``(..., 3)``) in m/s^2, in ``like``'s dtype."""
        output = output.to(like.dtype)
        return output * self.output_std + self.output_mean


class BallFFNN(BallNetwork):
    """
    Feed-forward network ``xdd = f(x - p, xd - v, v, a)`` (the paper's FF-NN baseline).

    :param hidden: hidden layer widths (tanh).
    :param dtype: parameter dtype.
    """

    def __init__(self, hidden: Sequence[int] = (128, 128),
                 dtype: torch.dtype = torch.float32) -> None:
        """Build the layers (see the class)."""
        super().__init__(dtype)
        layers: List[nn.Module] = []
        width = 12
        for size in hidden:
            layers += [nn.Linear(width, size, dtype=dtype), nn.Tanh()]
            width = size
        layers.append(nn.Linear(width, 3, dtype=dtype))
        self.net = nn.Sequential(*layers)

    def ball_acceleration(self, x: Tensor, xd: Tensor, p: Tensor, v: Tensor,
                          a: Tensor) -> Tensor:
        """
        Return the predicted ball acceleration.

        :param x: ball positions ``(..., 3)`` (m); :param xd: velocities (m/s).
        :param p: cup positions ``(..., 3)``; :param v: velocities; :param a: accelerations.
        :return: ``(..., 3)`` (m/s^2).
        """
        return self.to_acceleration(self.net(self.features(x, xd, p, v, a)), x)

    def rollout(self, x0: Tensor, xd0: Tensor, p: Tensor, v: Tensor, a: Tensor,
                dt: float) -> Tuple[Tensor, Tensor]:
        """
        Simulate the ball along given cup motions (as :meth:`StringModel.rollout`).

        :param x0: ``(B, 3)`` (m); :param xd0: ``(B, 3)`` (m/s).
        :param p: ``(B, T, 3)`` cup positions; :param v: velocities; :param a: accelerations.
        :param dt: time step (s).
        :return: ``(x, xd)`` each ``(B, T, 3)``.
        """
        def accel(x, xd, p_k, v_k, a_k, k):
            return self.ball_acceleration(x, xd, p_k, v_k, a_k), None

        return integrate_ball(accel, x0, xd0, p, v, a, dt)


class BallLSTM(BallNetwork):
    """
    Recurrent network over the same inputs (the paper's LSTM baseline).

    :param hidden: LSTM state size.
    :param dtype: parameter dtype.
    """

    def __init__(self, hidden: int = 64, dtype: torch.dtype = torch.float32) -> None:
        """Build the layers (see the class)."""
        super().__init__(dtype)
        self.cell = nn.LSTMCell(12, hidden, dtype=dtype)
        self.head = nn.Linear(hidden, 3, dtype=dtype)

    def sequence_acceleration(self, x: Tensor, xd: Tensor, p: Tensor, v: Tensor,
                              a: Tensor) -> Tensor:
        """
        Return the accelerations along given sequences (teacher forcing, state from zero).

        :param x: ``(B, T, 3)`` ball positions (m); :param xd: velocities.
        :param p: ``(B, T, 3)`` cup positions; :param v: velocities; :param a: accelerations.
        :return: ``(B, T, 3)`` (m/s^2).
        """
        features = self.features(x, xd, p, v, a).unbind(-2)
        state = None
        out = []
        for feature in features:
            state = self.cell(feature, state)
            out.append(self.head(state[0]))
        return self.to_acceleration(torch.stack(out, dim=-2), x)

    def rollout(self, x0: Tensor, xd0: Tensor, p: Tensor, v: Tensor, a: Tensor,
                dt: float) -> Tuple[Tensor, Tensor]:
        """
        Simulate the ball along given cup motions, the LSTM fed its own predictions.

        :param x0: ``(B, 3)`` (m); :param xd0: ``(B, 3)`` (m/s).
        :param p: ``(B, T, 3)`` cup positions; :param v: velocities; :param a: accelerations.
        :param dt: time step (s).
        :return: ``(x, xd)`` each ``(B, T, 3)``.
        """
        memory: List[Any] = [None]

        def accel(x, xd, p_k, v_k, a_k, k):
            feature = self.features(x, xd, p_k, v_k, a_k)
            flat = feature.reshape(-1, 12)
            memory[0] = self.cell(flat, memory[0])
            out = self.head(memory[0][0]).reshape(feature.shape[:-1] + (3,))
            return self.to_acceleration(out, x), None

        return integrate_ball(accel, x0, xd0, p, v, a, dt)


def fit_ball_network(recordings: Sequence[Any], network: BallNetwork, cup: StringModel,
                     iterations: int = 2000, lr: float = 3e-3, batch: int = 256,
                     sequence: int = 50, cutoff_hz: float = 15.0,
                     seed: int = 0) -> Tuple[BallNetwork, Dict[str, List[float]]]:
    """
    Train a black-box ball model on the recordings' ball accelerations.

    The targets are the Savitzky-Golay second derivatives of the measured ball positions;
    the inputs the measured ball state and the cup motion of ``cup`` (its transform is not
    learned here: the network has to absorb the difference). Adam on the mean squared
    standardised acceleration error; the LSTM sees windows of ``sequence`` steps with
    teacher forcing.

    :param recordings: runs with ``t``, ``q``, ``qd`` and ``ball`` (see :func:`fit_string`).
    :param network: a :class:`BallFFNN` or :class:`BallLSTM` (trained in place).
    :param cup: the string model whose :meth:`~StringModel.cup_motion` gives the inputs.
    :param iterations: Adam steps.
    :param lr: learning rate.
    :param batch: samples (FF-NN) or windows (LSTM) per step.
    :param sequence: LSTM window length (steps).
    :param cutoff_hz: derivative smoothing cutoff (Hz).
    :param seed: seed of the local generator (initial weights are PyTorch's).
    :return: ``(network, {'train': losses})``.
    """
    dtype = cup.cup_xyz.dtype
    runs = [run if isinstance(run, BallRecording) else ball_recording(run, cutoff_hz, dtype)
            for run in recordings]
    samples = _Samples(cup, runs, sequence, 1)
    with torch.no_grad():
        p, v, a = point_motion(samples.motion, cup.cup_xyz)
        x, xd, target = samples.ball, samples.ball_velocity, samples.ball_acceleration
        raw = torch.cat((x - p, xd - v, v, a), dim=-1)
        network.input_mean.copy_(raw.mean(0))
        network.input_std.copy_(raw.std(0).clamp_min(1e-6))
        network.output_mean.copy_(target.mean(0))
        network.output_std.copy_(target.std(0).clamp_min(1e-6))
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(network.parameters(), lr=lr)
    losses: List[float] = []
    steps = torch.arange(sequence)
    for _ in range(iterations):
        optimizer.zero_grad()
        if isinstance(network, BallLSTM):
            pick = samples.starts[torch.randint(samples.starts.numel(), (batch,),
                                                generator=generator)]
            index = pick[:, None] + steps
            predicted = network.sequence_acceleration(x[index], xd[index], p[index], v[index],
                                                      a[index])
            wanted = target[index]
        else:
            index = torch.randint(x.shape[0], (batch,), generator=generator)
            predicted = network.ball_acceleration(x[index], xd[index], p[index], v[index],
                                                  a[index])
            wanted = target[index]
        loss = (((predicted - wanted) / network.output_std) ** 2).mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return network, {'train': losses}


def ball_prediction_error(ball_model: nn.Module, cup: StringModel, recording: Any,
                          seconds: float = 1.0, stride: int = 250,
                          cutoff_hz: float = 15.0) -> Dict[str, float]:
    """
    Return the ball's open-loop prediction error over windows of a recording.

    Each window starts from the measured ball position and its smoothed velocity
    (:func:`ball_recording`) and runs ``ball_model.rollout`` along the cup motion of ``cup``
    for ``seconds``; windows start every ``stride`` samples.

    :param ball_model: a :class:`StringModel`, :class:`BallFFNN` or :class:`BallLSTM`.
    :param cup: the string model whose :meth:`~StringModel.cup_motion` drives the rollout
        (for a string model, itself).
    :param recording: a run with ``t``, ``q``, ``qd``, ``ball`` or a :class:`BallRecording`.
    :param seconds: prediction horizon (s).
    :param stride: spacing of the windows (samples).
    :param cutoff_hz: derivative smoothing cutoff (Hz).
    :return: ``mean_m`` (position error averaged over the horizon and windows, m),
        ``final_m`` (at the horizon's end, m) and ``windows``.
    :raises ValueError: the recording is shorter than the horizon.
    """
    dtype = cup.cup_xyz.dtype
    run = recording if isinstance(recording, BallRecording) else \
        ball_recording(recording, cutoff_hz, dtype)
    T = int(round(seconds / run.dt))
    starts = torch.arange(1, run.t.shape[0] - T - 1, stride)
    if starts.numel() == 0:
        raise ValueError(f'ball_prediction_error: the recording is shorter than {seconds} s')
    index = starts[:, None] + torch.arange(T + 1)
    with torch.no_grad():
        p, v, a = cup.cup_motion(run.q, run.qd, run.qdd)
        x, _ = ball_model.rollout(run.ball[starts], run.ball_velocity[starts], p[index],
                                  v[index], a[index], run.dt)
        error = (x - run.ball[index]).norm(dim=-1)
    return {'mean_m': float(error.mean()), 'final_m': float(error[:, -1].mean()),
            'windows': int(starts.numel())}
