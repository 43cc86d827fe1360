"""
Ball in a cup: the reward, the model-side episode and the eREPS policy search over ProMPs.

The arm follows a :class:`~diffsim_ros.control.promp.ProMP` joint trajectory, executed
exactly in the model (the tracking controller's error is measured on the MuJoCo ground truth
instead; see ``benchmarks/ball_in_a_cup.py``).  The cup's motion comes from a *kinematics*
object and the ball's from a *ball model*, both duck-typed so the DiffNEA
:class:`~diffsim_ros.sysid.string_model.StringModel` serves as both and a black-box ball
model (FF-NN, LSTM) can be paired with the identified cup kinematics:

- ``kinematics.cup_state(q, qd, qdd) -> (p, v, a, R)``: world position, velocity and
  acceleration of the cup frame's origin (the string's anchor) ``(..., T, 3)`` and the cup's
  axes in world ``R`` ``(..., T, 3, 3)``, from one evaluation of the link's motion;
  ``kinematics.string_length`` (m);
- ``ball_model.rollout(x0, xd0, p, v, a, dt) -> (x, xd)`` ``(B, T, 3)``.

The ball starts hanging at rest, ``x0 = p(0) - l e_z``.

Cost: forward kinematics of ``B`` samples at every step dominates an episode, so the cup's
motion is evaluated on a grid ``kinematics_stride`` steps apart (``H = stride dt``, 20 ms by
default; the ProMP's basis functions are about 0.2 s wide) and carried to the rollout's
steps by cubic Hermite interpolation: ``p`` with its derivative ``v``, ``v`` with ``a``,
``a`` and the cup's orientation ``R`` linearly.  :func:`hermite_upsample` states the error;
the tests measure it against the exact kinematics.

Reward (one number per episode; ``r_t = R_t^T (x_t - p_t)`` the ball's centre in the cup
frame, ``h`` the cup's height, ``rho`` its inner radius, ``rho_b`` the ball's radius, means
over the ``T`` steps of the episode)::

    R = mean_t psi~_t + w_peak aim - w_home mean_t |q_t - q_home|^2
        - w_limit mean_t |relu(q_t - (q_upper - m)) + relu((q_lower + m) - q_t)|^2
        - w_velocity mean_t |relu(|qd_t| - qd_max)|^2
        - w_acceleration mean_t |relu(|qdd_t| - qdd_max)|^2
        - w_torque mean_t' |relu(|tau_t'| - f tau_max) / tau_max|^2
        - w_upright (1 - e_z . z_cup(T))

The task term is DiffNEA's dense "electric dipole" idea: a dipole at the cup's centre
``c = (0, 0, h / 2)`` pointing out of the opening, softened by ``delta = h``, scaled to
``[-1, 1]``::

    psi(r) = (3 sqrt(3) / 2) delta^2 d_z / (|d|^2 + delta^2)^(3/2),   d = r - c,

positive above the cup (largest on its axis, ``d_z = delta / sqrt(2)``), negative below it,
so it pulls the ball up and onto the cup's axis from anywhere.  The string model has no cup
walls, so a ball that enters the cup falls through its bottom in the model; the episode
therefore treats the cup as absorbing.  The ball *entered* when its centre crossed the rim
plane ``r_z = h`` downward inside the opening, ``|r_xy| < rho - rho_b``; it stays entered
while it is in the cup's *shaft*, ``|r_xy| < rho`` and ``r_z < h`` (a centre beyond ``rho -
rho_b`` touches the wall, which the real cup would stop; beyond ``rho`` the ball would be
half through it); it is *caught* once an entered ball reaches the bottom (``r_z <= rho_b``);
from then on ``psi~_t = 1`` (``psi~_t = psi(r_t)`` before).  (The first criterion, the rim
crossing alone, accepted balls that crossed the opening at 2 m/s sideways: 10 of 30 searches
caught in the model and 0 of those 10 stayed in the MuJoCo cup, they hit the wall and
bounced out.)  Without walls the model also lets the ball into the cup through its bottom or
side, which the ground truth forbids, and the policy search found exactly that (a ball
passing up through the bottom scores the dipole's peak): a ball inside the cup's volume
(``|r_xy| < rho``, ``-rho_b < r_z < h``) that is neither entered nor caught scores ``psi~_t
= -1``.  The aim term rewards bringing the ball down into the cup's opening: ``aim`` is the
largest ``psi(r_t)`` at a step where the ball's centre has just crossed the rim plane
downward (``r_z`` from ``>= h`` to ``< h``) before any arm touch (below), 0 without one;
``psi`` there is 0.93 on the axis, 0.75 at the rim and falls off outside it (the mean alone
favours a ball swinging at the cup's height, where ``psi = 0``).  It replaces ``max_t
psi~_t``, the dipole's peak along the episode, which paid 0.8-0.9 for a ball that merely
passed over the opening sideways: on development plant 1 the 10 searches the model ranked
highest transferred 0 of 10 where 10 of its 30 searches succeeded on the plant, and on the
oracle model of plant 2 the swing-up ranked highest passed over the opening and came down
through the rim plane 39 cm from the axis.  A catch is the model-side success; on the MuJoCo
ground truth the walls decide (``in_cup`` of :mod:`diffsim_ros.sim.cup`).  The penalties keep
the arm near home and within its joint limits (margin ``m``), bound joint speeds and
accelerations, keep the inverse-dynamics torque of the arm model, ``tau = RNEA(q, qd, qdd)``
on the kinematics grid ``t'`` (below), inside a fraction ``f`` of the drives' command limits
``tau_max`` (the plant clips at the limits, so a trajectory beyond them cannot be tracked;
the rest is left to the tracking controller's feedback and the model's error: with ``f = 1``
and ``w_torque = 1``, 2 of 8 searched swing-ups saturated the plant's drives for 16-36 % of
the time and missed their reference by 0.5-2.3 rad), and ask for a cup that ends upright so
a caught ball stays.

Nor has the string model the arm or the cup's outside, and the ball of the searched
swing-ups went straight through them: along the same arm motion, the MuJoCo plant's ball
touched the arm 0.75-0.85 s into 9 of 12 swing-ups searched on the plant's own (oracle)
string model (the upper arm in the 5 of them whose contacts were named), and every one of
the 12 touched the arm or the cup before 1.7 s; after the touch at 0.75-0.85 s the two balls
were 8-45 cm apart at 1 s, against 1.6-3.5 cm with the plant's ball contacts switched off
(``benchmarks/cup_divergence.py``).  What a ball does
after such a hit the model cannot say, so a hit ends the episode as a failure: from the
first step the ball *touches* the arm or the cup from outside on, ``psi~_t = -1`` and
nothing is caught (the aim term still credits a ball that meets the rim on its way down
into the opening: on the plant such balls sometimes go in).  Holding ``psi`` at the value
where the ball met the cup instead paid a touch of the rim from above almost like a catch,
and the searches on the oracle model of plant 2 converged on rim touches (6 of 8; 1 of 8
succeeded on the plant).  It touches the arm when its centre comes within ``rho_b`` of one of
``task.obstacles`` (the links' contact shapes, spheres and finite cylinders, the same shapes
the plant collides with; :func:`arm_contact`), and the cup when it is not entered and its
centre comes within ``rho_b`` of the cup's solid: in the cup frame's ``(|r_xy|, r_z)`` the
union of the bottom ``[0, rho + w] x [-w, 0]`` and the wall ``[rho, rho + w] x [0, h]``
(``w`` the wall's thickness; :func:`cup_contact`), which covers its rim.

Robustness to model error (:class:`StringEnsemble`, DiffNEA's own suggestion): the
identification cannot see the cup's orientation (it moves the walls, not the string's
anchor) and leaves millimetres of error on the string's length, so a policy can be searched
on ``K`` members of the identified model that differ in exactly those (cup tilt, length).
An ensemble's :meth:`~StringEnsemble.cup_state` and :meth:`~StringEnsemble.rollout` carry a
leading member dimension ``(K, B, ...)``; :func:`model_episode` then scores each member and
returns the *mean* reward over the members (what the search optimises and the best 10 are
chosen by) and a catch only where every member catches.
"""

from dataclasses import dataclass, field
import math
import time
from typing import Any, Optional, Sequence, Tuple

import torch

from .promp import ProMP
from .reps import Gaussian, reps_update
from ..core.dispatch import rnea
from ..core.kinematics import forward_kinematics
from ..core.model import RobotModel
from ..core.spatial import rpy_to_matrix
from ..sysid.string_model import integrate_ball, point_motion, string_acceleration

Tensor = torch.Tensor

__all__ = ['BallInCupTask', 'CupGeometry', 'Episode', 'LinkShape', 'RewardWeights',
           'SearchConfig', 'SearchResult', 'StringEnsemble', 'arm_contact', 'caught_mask',
           'cup_contact', 'cup_coordinates', 'dipole_potential', 'hermite_upsample',
           'link_poses', 'model_episode', 'policy_search', 'shape_axes', 'task_reward']

#: Scale of :func:`dipole_potential`: its largest value is 1.
DIPOLE_SCALE = 1.5 * math.sqrt(3.0)


@dataclass(frozen=True)
class CupGeometry:
    """
    The cup and the ball (the ground truth's constants, passed in from ``sim.cup``).

    :param radius: inner radius of the cup, m.
    :param height: height of the cup along its +z, m.
    :param ball_radius: radius of the ball, m.
    :param wall: thickness of the cup's wall and bottom, m (0: a thin shell).
    """

    radius: float
    height: float
    ball_radius: float
    wall: float = 0.0


@dataclass(frozen=True)
class LinkShape:
    """
    A contact shape of an arm link (what the ball must not touch).

    :param link: the link's name in the arm model.
    :param kind: ``'sphere'`` or ``'cylinder'`` (axis along the shape frame's z).
    :param radius: m.
    :param half_length: half the cylinder's length, m (ignored for a sphere).
    :param xyz: the shape frame's origin in the link, m (URDF ``origin``).
    :param rpy: its rotation in the link, rad (URDF roll-pitch-yaw).
    """

    link: str
    kind: str
    radius: float
    half_length: float = 0.0
    xyz: Tuple[float, float, float] = (0.0, 0.0, 0.0)
    rpy: Tuple[float, float, float] = (0.0, 0.0, 0.0)

    def __post_init__(self) -> None:
        """Check the kind and the sizes."""
        if self.kind not in ('sphere', 'cylinder'):
            raise ValueError(f'LinkShape.kind must be sphere or cylinder, got {self.kind!r}')
        if not (self.radius > 0 and self.half_length >= 0):
            raise ValueError(f'LinkShape: radius must be > 0 and half_length >= 0, got '
                             f'{self.radius}, {self.half_length}')


@dataclass(frozen=True)
class RewardWeights:
    """
    Weights and bounds of the reward's penalties (module docstring).

    :param peak: ``w_peak``, the weight of the aim term.
    :param home: ``w_home``, 1/rad^2.
    :param limit: ``w_limit``, 1/rad^2.
    :param limit_margin: ``m``, rad.
    :param velocity: ``w_velocity``, s^2/rad^2.
    :param velocity_max: ``qd_max``, rad/s (the WAM moves at several rad/s in swing-ups; the
        catalogue URDF's 0.5 rad/s are libbarrett's conservative defaults).
    :param acceleration: ``w_acceleration``, s^4/rad^2.
    :param acceleration_max: ``qdd_max``, rad/s^2.
    :param torque: ``w_torque`` (on torques relative to their limit).
    :param torque_fraction: ``f``, the share of the command limits the feedforward may use.
    :param upright: ``w_upright``.
    """

    peak: float = 1.0
    home: float = 0.02
    limit: float = 10.0
    limit_margin: float = 0.1
    velocity: float = 1.0
    velocity_max: float = 4.0
    acceleration: float = 1e-3
    acceleration_max: float = 40.0
    torque: float = 100.0
    torque_fraction: float = 0.8
    upright: float = 0.5


@dataclass(frozen=True, eq=False)
class BallInCupTask:
    """
    Everything an episode needs besides the models.

    :param promp: the movement primitive (home, duration, basis).
    :param geometry: cup and ball sizes.
    :param q_lower: joint lower limits ``(n,)``, rad.
    :param q_upper: joint upper limits ``(n,)``, rad.
    :param dt: step of the model rollout, s.
    :param hold: time at rest after the movement, s (the ball must stay in the cup).
    :param kinematics_stride: rollout steps between cup-kinematics evaluations (module
        docstring); must divide the episode's number of steps.
    :param torque_max: command limits ``(n,)``, N m.
    :param arm: the arm model whose inverse dynamics the torque penalty uses (None: no
        torque penalty).
    :param weights: the reward's penalties.
    :param obstacles: the arm's contact shapes the ball must not touch (module docstring;
        needs ``arm`` for their kinematics; empty: the ball may pass through the arm).
    """

    promp: ProMP
    geometry: CupGeometry
    q_lower: Tuple[float, ...]
    q_upper: Tuple[float, ...]
    torque_max: Tuple[float, ...] = ()
    arm: Optional[RobotModel] = None
    dt: float = 0.002
    hold: float = 0.5
    kinematics_stride: int = 10
    weights: RewardWeights = field(default_factory=RewardWeights)
    obstacles: Tuple[LinkShape, ...] = ()

    def __post_init__(self) -> None:
        """Check that the kinematics grid fits the episode."""
        steps = self.times().numel() - 1
        if self.kinematics_stride < 1 or steps % self.kinematics_stride:
            raise ValueError(f'kinematics_stride {self.kinematics_stride} must divide the '
                             f'episode of {steps} steps')
        n = self.promp.n_joints
        for name in ('q_lower', 'q_upper'):
            if len(getattr(self, name)) != n:
                raise ValueError(f'{name}: expected {n} values, got {getattr(self, name)}')
        if self.arm is not None and len(self.torque_max) != n:
            raise ValueError(f'torque_max: expected {n} values, got {self.torque_max}')
        if self.obstacles and self.arm is None:
            raise ValueError('obstacles need the arm model (arm=None)')
        for shape in self.obstacles:
            self.arm.link_index(shape.link)

    def times(self, dtype: torch.dtype = torch.float64) -> Tensor:
        """
        Return the episode's sample times.

        :param dtype: dtype.
        :return: ``(T,)`` s.
        """
        return self.promp.time_grid(self.dt, self.hold, dtype)


def cup_coordinates(x: Tensor, p: Tensor, R: Tensor) -> Tensor:
    """
    Return ball positions in the cup frame.

    :param x: ball centres ``(..., 3)``, world, m.
    :param p: cup frame origins ``(..., 3)``, world, m.
    :param R: cup frame orientations ``(..., 3, 3)`` (columns: cup axes in world).
    :return: ``R^T (x - p)`` ``(..., 3)``, m.
    """
    return ((x - p)[..., :, None] * R).sum(-2)


def dipole_potential(r_cup: Tensor, geometry: CupGeometry) -> Tensor:
    """
    Return the scaled dipole potential ``psi`` of the module docstring.

    :param r_cup: ball centres in the cup frame ``(..., 3)``, m.
    :param geometry: the cup.
    :return: ``(...)`` in ``[-1, 1]``.
    """
    delta = geometry.height
    d = r_cup - r_cup.new_tensor([0.0, 0.0, 0.5 * geometry.height])
    return DIPOLE_SCALE * delta ** 2 * d[..., 2] / ((d * d).sum(-1) + delta ** 2) ** 1.5


def caught_mask(r_cup: Tensor, geometry: CupGeometry) -> Tuple[Tensor, Tensor]:
    """
    Return where the ball is in the cup's shaft after entering it, and where it is caught.

    See the module docstring.  With ``inside_t`` the shaft test (entries also need
    ``|r_xy| < rho - rho_b`` at the crossing), the shaft's visits are the
    runs of consecutive ``inside`` steps, numbered by ``seg_t = cumsum(not inside_t)``; a
    step is *entered* when an entry (a downward rim crossing into the shaft) happened in its
    own run at or before it, i.e. the running maximum of the entries' run numbers equals
    ``seg_t``.

    :param r_cup: ball centres in the cup frame ``(..., T, 3)``, m.
    :param geometry: the cup.
    :return: ``(entered, caught)`` each ``(..., T)`` bool; ``caught`` is True from the first
        step an entered ball reaches the bottom on.
    """
    z = r_cup[..., 2]
    radial = r_cup[..., :2].norm(dim=-1)
    inside = (radial < geometry.radius) & (z < geometry.height)
    opening = radial < geometry.radius - geometry.ball_radius
    crossing = (z[..., :-1] >= geometry.height) & inside[..., 1:] & opening[..., 1:]
    crossing = torch.cat((torch.zeros_like(crossing[..., :1]), crossing), -1)
    seg = torch.cumsum((~inside).to(torch.int64), -1)
    last_entry = torch.cummax(torch.where(crossing, seg, torch.full_like(seg, -1)), -1)[0]
    entered = inside & (last_entry == seg)
    bottom = entered & (z <= geometry.ball_radius)
    return entered, torch.cummax(bottom.to(torch.uint8), -1)[0].bool()


def _box_distance(u: Tensor, v: Tensor, u0: float, u1: float, v0: Any, v1: Any) -> Tensor:
    """Return the distance of points ``(u, v)`` from the rectangles ``[u0, u1] x [v0, v1]``."""
    du = torch.relu(u0 - u) + torch.relu(u - u1)
    dv = torch.relu(v0 - v) + torch.relu(v - v1)
    return torch.sqrt(du * du + dv * dv)


def cup_contact(r_cup: Tensor, geometry: CupGeometry) -> Tensor:
    """
    Return where the ball touches the cup's solid (bottom, wall, rim), from in- or outside.

    :param r_cup: ball centres in the cup frame ``(..., 3)``, m.
    :param geometry: the cup.
    :return: ``(...)`` bool: the centre lies within ``rho_b`` of the solid (module docstring).
    """
    rho, h, w = geometry.radius, geometry.height, geometry.wall
    radial = r_cup[..., :2].norm(dim=-1)
    z = r_cup[..., 2]
    distance = torch.minimum(_box_distance(radial, z, 0.0, rho + w, -w, 0.0),
                             _box_distance(radial, z, rho, rho + w, 0.0, h))
    return distance < geometry.ball_radius


def link_poses(arm: RobotModel, shapes: Sequence[LinkShape], q: Tensor) -> Tensor:
    """
    Return the world poses of the links that carry the contact shapes.

    :param arm: the arm model.
    :param shapes: the ``S`` shapes.
    :param q: joint positions ``(..., n)``, rad.
    :return: ``(..., S, 4, 4)``, one pose per shape.
    """
    index = torch.tensor([arm.link_index(shape.link) for shape in shapes], dtype=torch.long)
    return forward_kinematics(arm, q).index_select(-3, index)


def shape_axes(T_world_link: Tensor, shapes: Sequence[LinkShape]) -> Tensor:
    """
    Return the contact shapes' centres and axes in world (what :func:`arm_contact` needs).

    :param T_world_link: the shapes' link poses ``(..., S, 4, 4)``, one per shape in
        ``shapes`` order.
    :param shapes: the ``S`` shapes.
    :return: ``(..., S, 6)``: each shape frame's origin, then its z axis (a cylinder's axis).
    """
    dtype = T_world_link.dtype
    xyz = torch.tensor([s.xyz for s in shapes], dtype=dtype).reshape(-1, 3)
    R_link_shape = rpy_to_matrix(torch.tensor([s.rpy for s in shapes],
                                              dtype=dtype).reshape(-1, 3))
    R = T_world_link[..., :3, :3]
    centre = (R @ xyz[:, :, None])[..., 0] + T_world_link[..., :3, 3]
    return torch.cat((centre, (R @ R_link_shape[:, :, 2:])[..., 0]), -1)


def arm_contact(x: Tensor, axes: Tensor, shapes: Sequence[LinkShape],
                ball_radius: float) -> Tensor:
    """
    Return where the ball touches one of the arm's contact shapes.

    :param x: ball centres ``(..., 3)``, world, m.
    :param axes: the shapes' centres and axes ``(..., S, 6)`` (:func:`shape_axes` of their
        :func:`link_poses`; the policy search interpolates these, 6 numbers a shape instead
        of a 4x4 pose), one per shape in ``shapes`` order (leading dims broadcast against
        ``x``'s).
    :param shapes: the ``S`` shapes.
    :param ball_radius: m.
    :return: ``(...)`` bool: the centre lies within ``ball_radius`` of a shape (the exact
        distance to a sphere or to a finite solid cylinder).
    """
    if not shapes:
        return torch.zeros(x.shape[:-1], dtype=torch.bool, device=x.device)
    centre, axis = axes[..., :3], axes[..., 3:]
    radius = x.new_tensor([s.radius for s in shapes])
    half = x.new_tensor([s.half_length for s in shapes])
    sphere = torch.tensor([s.kind == 'sphere' for s in shapes])
    d = x[..., None, :] - centre
    along = (d * axis).sum(-1)
    across = (d - along[..., None] * axis).norm(dim=-1)
    cylinder = _box_distance(across, along, 0.0, radius, -half, half)
    ball = torch.relu(d.norm(dim=-1) - radius)
    return (torch.where(sphere, ball, cylinder) < ball_radius).any(-1)


def task_reward(task: BallInCupTask, q: Tensor, qd: Tensor, qdd: Tensor, r_cup: Tensor,
                z_cup_final: Tensor, tau: Optional[Tensor] = None,
                arm_touch: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """
    Return the episode reward of the module docstring and whether the ball was caught.

    :param task: the task.
    :param q: joint positions ``(..., T, n)``, rad; :param qd: rad/s; :param qdd: rad/s^2.
    :param r_cup: ball centres in the cup frame ``(..., T, 3)``, m.
    :param z_cup_final: the cup's +z axis in world at the end ``(..., 3)``.
    :param tau: the arm's inverse-dynamics torques on the kinematics grid ``(..., T', n)``,
        N m (None: no torque term).
    :param arm_touch: ``(..., T)`` bool, the ball touches the arm (:func:`arm_contact`;
        None: never).
    :return: ``(reward (...), caught (...) bool)``.
    """
    w, geometry = task.weights, task.geometry
    entered, caught = caught_mask(r_cup, geometry)
    z = r_cup[..., 2]
    inside = (r_cup[..., :2].norm(dim=-1) < geometry.radius) & (z > -geometry.ball_radius) & (
        z < geometry.height)
    raw = dipole_potential(r_cup, geometry)
    psi = torch.where(inside & ~entered, -torch.ones_like(z), raw)
    touch = cup_contact(r_cup, geometry) & ~entered
    arm_hit = torch.zeros_like(touch)
    if arm_touch is not None:
        touch = touch | arm_touch
        arm_hit = torch.cummax(arm_touch.to(torch.uint8), -1)[0].bool()
    hit = torch.cummax(touch.to(torch.uint8), -1)[0].bool()
    caught = caught & ~hit
    psi = torch.where(caught, torch.ones_like(z), psi)
    psi = torch.where(hit, -torch.ones_like(z), psi)
    down = (z[..., :-1] >= geometry.height) & (z[..., 1:] < geometry.height)
    down = torch.cat((torch.zeros_like(down[..., :1]), down), -1) & ~arm_hit
    aim = torch.where(down, raw, torch.zeros_like(raw)).amax(-1)
    home = q.new_tensor(task.promp.q_home)
    lower, upper = q.new_tensor(task.q_lower), q.new_tensor(task.q_upper)
    violation = (torch.relu(q - (upper - w.limit_margin))
                 + torch.relu((lower + w.limit_margin) - q))
    fast = torch.relu(qd.abs() - w.velocity_max)
    hard = torch.relu(qdd.abs() - w.acceleration_max)
    penalty = (w.home * ((q - home) ** 2).sum(-1).mean(-1)
               + w.limit * (violation ** 2).sum(-1).mean(-1)
               + w.velocity * (fast ** 2).sum(-1).mean(-1)
               + w.acceleration * (hard ** 2).sum(-1).mean(-1)
               + w.upright * (1.0 - z_cup_final[..., 2]))
    if tau is not None:
        limit = q.new_tensor(task.torque_max)
        over = torch.relu(tau.abs() - w.torque_fraction * limit) / limit
        penalty = penalty + w.torque * (over ** 2).sum(-1).mean(-1)
    return psi.mean(-1) + w.peak * aim - penalty, caught[..., -1]


def hermite_upsample(y: Tensor, dy: Optional[Tensor], stride: int, H: float) -> Tensor:
    """
    Return samples ``stride`` times denser than the knots: cubic Hermite, or linear.

    Between knots ``k`` and ``k + 1`` at ``s = j / stride``:
    ``y = h00 y_k + h10 H dy_k + h01 y_k+1 + h11 H dy_k+1`` with the Hermite cubics
    ``h00 = 2s^3 - 3s^2 + 1``, ``h10 = s^3 - 2s^2 + s``, ``h01 = 3s^2 - 2s^3``,
    ``h11 = s^3 - s^2``; its error is ``H^4 max|y''''| / 384``.  Without ``dy`` the
    interpolation is linear (error ``H^2 max|y''| / 8``).

    :param y: knots ``(..., K, m)``.
    :param dy: their time derivatives ``(..., K, m)`` or None.
    :param stride: fine samples per knot interval.
    :param H: knot spacing, s.
    :return: ``(..., (K - 1) stride + 1, m)``, equal to ``y`` at the knots.
    """
    s = torch.arange(stride, dtype=y.dtype, device=y.device) / stride
    y0, y1 = y[..., :-1, None, :], y[..., 1:, None, :]
    s = s[:, None]
    if dy is None:
        fine = y0 + s * (y1 - y0)
    else:
        d0, d1 = H * dy[..., :-1, None, :], H * dy[..., 1:, None, :]
        s2, s3 = s * s, s * s * s
        fine = ((2 * s3 - 3 * s2 + 1) * y0 + (s3 - 2 * s2 + s) * d0
                + (3 * s2 - 2 * s3) * y1 + (s3 - s2) * d1)
    fine = fine.flatten(-3, -2)
    return torch.cat((fine, y[..., -1:, :]), -2)


@dataclass(frozen=True)
class Episode:
    """
    A batch of model-side episodes.

    :param reward: ``(B,)``.
    :param caught: ``(B,)`` bool, the ball entered the cup in the model.
    :param ball: ball positions ``(B, T, 3)``, world, m.
    :param cup: cup origins ``(B, T, 3)``, world, m.
    :param q: joint positions ``(B, T, n)``, rad.
    """

    reward: Tensor
    caught: Tensor
    ball: Tensor
    cup: Tensor
    q: Tensor


def model_episode(task: BallInCupTask, theta: Tensor, kinematics: Any,
                  ball_model: Optional[Any] = None, chunk: int = 256) -> Episode:
    """
    Run ProMP parameter vectors through the model: trajectory, cup motion, ball, reward.

    :param task: the task.
    :param theta: ProMP parameters ``(B, dim)``.
    :param kinematics: cup kinematics and string length (module docstring), or a
        :class:`StringEnsemble` (then ``ball_model`` must be None).
    :param ball_model: the ball's rollout (module docstring); ``kinematics`` when None.
    :param chunk: samples per kinematics evaluation (bounds the memory of the FK).
    :return: the episodes; for an ensemble the reward is the members' mean, ``caught`` holds
        where every member catches, and ``ball``/``cup`` are the first member's.
    """
    ensemble = isinstance(kinematics, StringEnsemble)
    if ensemble and ball_model is not None:
        raise ValueError('model_episode: a StringEnsemble is its own ball model')
    ball_model = kinematics if ball_model is None else ball_model
    stride, B = task.kinematics_stride, theta.shape[0]
    with torch.no_grad():
        q, qd, qdd = task.promp.trajectory(theta, task.times(theta.dtype))
        grid = (q[:, ::stride], qd[:, ::stride], qdd[:, ::stride])
        parts = []
        for i in range(0, B, chunk):
            qc, qdc, qddc = (g[i:i + chunk] for g in grid)
            pc, vc, ac, Rc = kinematics.cup_state(qc, qdc, qddc)
            tau = None if task.arm is None else rnea(task.arm, qc, qdc, qddc)
            axes = None
            if task.obstacles:
                axes = shape_axes(link_poses(task.arm, task.obstacles, qc), task.obstacles)
            parts.append((pc, vc, ac, Rc, tau, axes))
        # The batch is the dim before (T, 3) (an ensemble's members lead).
        pc, vc, ac = (torch.cat([part[k] for part in parts], -3) for k in range(3))
        Rc = torch.cat([part[3] for part in parts], -4)
        tau = None if task.arm is None else torch.cat([part[4] for part in parts])
        H = stride * task.dt
        p = hermite_upsample(pc, vc, stride, H)
        v = hermite_upsample(vc, ac, stride, H)
        a = hermite_upsample(ac, None, stride, H)
        R = hermite_upsample(Rc.flatten(-2), None, stride, H).unflatten(-1, (3, 3))
        length = torch.as_tensor(kinematics.string_length, dtype=p.dtype)
        x0 = p[..., 0, :] - length * p.new_tensor([0.0, 0.0, 1.0])
        x, _ = ball_model.rollout(x0, torch.zeros_like(x0), p, v, a, task.dt)
        arm_touch = None
        if task.obstacles:
            # The shapes' centres and axes carried linearly to the rollout's steps, like R.
            axes = torch.cat([part[5] for part in parts])
            fine = hermite_upsample(axes.flatten(-2), None, stride, H)
            arm_touch = arm_contact(x, fine.unflatten(-1, axes.shape[-2:]), task.obstacles,
                                    task.geometry.ball_radius)
        reward, caught = task_reward(task, q, qd, qdd, cup_coordinates(x, p, R),
                                     Rc[..., -1, :, 2], tau, arm_touch)
        if ensemble:
            reward, caught = reward.mean(0), caught.all(0)
            x, p = x[0], p[0]
    return Episode(reward=reward, caught=caught, ball=x, cup=p, q=q)


class StringEnsemble:
    """
    Members of a string model that differ in cup orientation and string length.

    The members share the identified arm, anchor and friction; each has its own cup rotation
    (an extra rotation ``rpy_k`` after the model's, in the cup frame) and its own string
    length ``l + dl_k``.  Outputs carry the member dimension first (module docstring).

    :param model: the identified string model (a
        :class:`~diffsim_ros.sysid.string_model.StringModel`); only read.
    :param tilts: extra cup rotations ``(K, 3)``, rad (URDF roll-pitch-yaw).
    :param length_offsets: string length changes ``(K,)``, m.
    :raises ValueError: shapes that disagree, or a member with a non-positive length.
    """

    def __init__(self, model: Any, tilts: Tensor, length_offsets: Tensor) -> None:
        """Store the members (see the class)."""
        dtype = model.cup_xyz.dtype
        tilts = torch.as_tensor(tilts, dtype=dtype)
        offsets = torch.as_tensor(length_offsets, dtype=dtype)
        if tilts.dim() != 2 or tilts.shape[-1] != 3 or offsets.shape != tilts.shape[:1]:
            raise ValueError(f'StringEnsemble: expected tilts (K, 3) and length_offsets (K,), '
                             f'got {tuple(tilts.shape)} and {tuple(offsets.shape)}')
        with torch.no_grad():
            self.model = model
            self.cup_xyz = model.cup_xyz.detach().clone()
            self.friction = model.friction.detach().clone()
            lengths = model.string_length.detach() + offsets
            if not bool((lengths > 0).all()):
                raise ValueError(f'StringEnsemble: non-positive string lengths {lengths}')
            self.lengths = lengths
            self.R_link_cup = rpy_to_matrix(model.cup_rpy.detach()) @ rpy_to_matrix(tilts)

    @property
    def members(self) -> int:
        """Return the number of members ``K``."""
        return int(self.lengths.numel())

    @property
    def string_length(self) -> Tensor:
        """Return the members' string lengths ``(K, 1, 1)``, m (broadcasts on ``(K, B, 3)``)."""
        return self.lengths[:, None, None]

    def cup_state(self, q: Tensor, qd: Tensor, qdd: Tensor
                  ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        """
        Return the anchor's world motion (the same for every member) and each member's cup axes.

        :param q: joint positions ``(B, T, n)``, rad; :param qd: rad/s; :param qdd: rad/s^2.
        :return: ``(p, v, a, R)``: ``(K, B, T, 3)`` each and ``(K, B, T, 3, 3)``.
        """
        motion = self.model.link_motion(q, qd, qdd)
        K = self.members
        p, v, a = (value.expand((K,) + value.shape)
                   for value in point_motion(motion, self.cup_xyz))
        R = motion.R[None] @ self.R_link_cup.reshape((-1,) + (1,) * (q.dim() - 1) + (3, 3))
        return p, v, a, R

    def rollout(self, x0: Tensor, xd0: Tensor, p: Tensor, v: Tensor, a: Tensor,
                dt: float) -> Tuple[Tensor, Tensor]:
        """
        Simulate every member's ball (the string model's rollout at the member's length).

        :param x0: initial ball positions ``(K, B, 3)``, m; :param xd0: velocities, m/s.
        :param p: anchor positions ``(K, B, T, 3)``; :param v: velocities; :param a:
            accelerations.
        :param dt: step, s.
        :return: ``(x, xd)`` each ``(K, B, T, 3)``.
        """
        length = self.lengths[:, None, None]
        gravity = self.model.gravity

        def accel(x, xd, p_k, v_k, a_k, k):
            return string_acceleration(x, xd, p_k, v_k, a_k, length, self.friction, gravity)

        return integrate_ball(accel, x0, xd0, p, v, a, dt, length)


@dataclass(frozen=True)
class SearchConfig:
    """
    eREPS settings of :func:`policy_search`.

    :param iterations: REPS updates.
    :param samples: episodes per update and search.
    :param epsilon: REPS bound on the sample weights' KL, nats.
    :param kl_bound: bound on the ML update's ``KL(new || old)``, nats.
    :param init_std: initial standard deviation of the ProMP parameters, rad.
    :param min_std: floor of the standard deviation, rad.
    """

    iterations: int = 60
    samples: int = 32
    epsilon: float = 1.0
    kl_bound: float = 0.5
    init_std: float = 0.8
    min_std: float = 0.01


@dataclass(frozen=True)
class SearchResult:
    """
    Outcome of independent searches (one per seed).

    :param distribution: the final search distribution ``(S, dim)``.
    :param reward: the final mean's model reward ``(S,)``.
    :param caught: the final mean catches the ball in the model ``(S,)`` bool.
    :param history: mean sample reward per iteration ``(iterations, S)``.
    :param seconds: wall time of the whole search, s.
    """

    distribution: Gaussian
    reward: Tensor
    caught: Tensor
    history: Tensor
    seconds: float


def policy_search(task: BallInCupTask, kinematics: Any, seeds: Sequence[int],
                  config: SearchConfig = SearchConfig(), ball_model: Optional[Any] = None,
                  mean: Optional[Tensor] = None) -> SearchResult:
    """
    Optimise a Gaussian over ProMP parameters with eREPS on the model, one search per seed.

    The searches share every rollout batch (``len(seeds) * samples`` episodes per update) but
    nothing else: each seed has its own generator, distribution and REPS update.

    :param task: the task.
    :param kinematics: cup kinematics (see the module).
    :param seeds: one independent search per seed.
    :param config: eREPS settings.
    :param ball_model: the ball's rollout; ``kinematics`` when None.
    :param mean: initial mean ``(dim,)``; zeros (the arm resting at home) when None.
    :return: the searches' outcome.
    """
    start = time.perf_counter()
    S, d, N = len(seeds), task.promp.dim, config.samples
    generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
    mu = torch.zeros(S, d, dtype=torch.float64) if mean is None else \
        mean.to(torch.float64).expand(S, d).clone()
    dist = Gaussian.isotropic(mu, config.init_std)
    history = []
    for _ in range(config.iterations):
        samples = torch.stack([Gaussian(dist.mean[i], dist.cov[i]).sample(N, generators[i])
                               for i in range(S)])
        episode = model_episode(task, samples.reshape(S * N, d), kinematics, ball_model)
        returns = episode.reward.reshape(S, N)
        history.append(returns.mean(-1))
        dist = reps_update(dist, samples, returns, config.epsilon, config.kl_bound,
                           config.min_std).distribution
    final = model_episode(task, dist.mean, kinematics, ball_model)
    return SearchResult(distribution=dist, reward=final.reward, caught=final.caught,
                        history=torch.stack(history) if history else torch.zeros(0, S),
                        seconds=time.perf_counter() - start)
