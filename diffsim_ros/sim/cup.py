"""
Ball in a cup: the MuJoCo ground truth of DiffNEA's headline experiment.

The catalogue WAM-4 (``robots.get('wam4')``, 500 Hz) carries a cup on ``wam/tool_link``; a
ball hangs from the centre of the cup's bottom on a string.  As in the DiffNEA paper the
string's body is a chain of small capsules joined by ball joints (it carries the string's
2 g); its length is a MuJoCo spatial tendon from the anchor to the free ball's centre,
limited to the string length, so the string is inextensible when taut, pulls only along
itself and folds freely when slack -- MuJoCo's soft unilateral constraint, not the
closed-form constraint force the learned model uses (:class:`StringBuild`).

Frames and geometry (the contract of issue 18):

* World: the WAM's base frame, z up, gravity -9.81 m/s^2.
* Cup frame: ``T_tool_cup = (rpy_to_matrix(cup_rpy), cup_xyz)`` in ``wam/tool_link``.  Its
  origin is the string's anchor at the centre of the cup's bottom, its +z axis points out
  of the opening.  The cup is an open cylinder of inner radius :data:`CUP_RADIUS` and
  inner height :data:`CUP_HEIGHT` along +z: a bottom disc filling ``z in [-CUP_WALL, 0]``
  and :data:`CUP_WALL_SEGMENTS` boxes of thickness :data:`CUP_WALL` around it (a polygon
  whose inner corners lie 1 mm inside ``CUP_RADIUS``).
* The string's length is the anchor-to-ball-centre distance when taut; the string has no
  contacts (it may pass through the bottom, a knot in a hole would), the ball (radius
  :data:`BALL_RADIUS`) touches the cup and the arm's links (their URDF visual shapes, which
  the catalogue marks as cosmetic: a coarse stand-in for the arm's surface).  There is no
  floor or table.
* Success (:func:`in_cup`): over the last :data:`HOLD_S` s of a recording the ball's centre,
  in the cup frame, has radial distance < ``CUP_RADIUS - BALL_RADIUS`` and height in
  ``(0, CUP_HEIGHT)``.

The arm's true parameters come from the simulator's usual hidden-parameter machinery
(:meth:`~diffsim_ros.sim.parameters.TrueParameters.sample`), the MuJoCo model from
:func:`~diffsim_ros.sim.builder.build_mujoco_model` (the cup and the string are added to its
``MjSpec``).  The cup is massless: its inertia is part of the arm's last body as far as
identification is concerned.

Joint speeds: the URDF's velocity limits (0.5 rad/s, 0.2 rad/s at the elbow) are
libbarrett's conservative defaults, far below what the physical WAM does in the paper's
swing-ups; MuJoCo ignores them, and so do these experiments.  The identification
trajectories stay below :data:`SPEED_LIMIT` (3 rad/s); torques are clipped at the
catalogue's command limits (25, 20, 15, 15 N m), as libbarrett's driver does.

Numerics (measured, ``benchmarks/cup_sim.py``, ``benchmarks/cup_fidelity.py``;
``benchmarks/README.md``): MuJoCo's implicit-fast integrator at :data:`TIMESTEP` (4 steps
per driver period), the chain's joints damped by :data:`STRING_DAMPING` (without it a
flailing arm makes MuJoCo diverge), contacts and the tendon's limit stiffened to
:data:`CONTACT_SOLREF` and :data:`STRING_SOLREF`.  Until 2026-11-27 evening the chain alone
was the string (:data:`LEGACY_STRING`): its joints' damping, 1e-3 N m s/rad for stability,
made the slack string a stiff damper (a slack ball fell 3.9 cm short of free fall in
0.1 s, a 20-degree swing kept 13.4 degrees after 7 s); see :data:`PLANT_STRING` for what
the tendon string measures.  A run that still diverges raises :class:`RuntimeError` (count
it as a failed episode and report how many).
"""

import dataclasses
from dataclasses import dataclass, field
import math
from typing import Callable, List, Optional, Sequence, Tuple, Union
import xml.etree.ElementTree as ET

import mujoco
import numpy as np
import torch

from .builder import build_mujoco_model
from .parameters import finite_vector, nominal_model, TrueParameters
from .. import robots
from ..control.ball_in_cup import LinkShape
from ..control.baselines import ComputedTorque
from ..control.dynamics import ModelDynamics
from ..control.tasks import TASKS
from ..core import RobotModel
from ..core.spatial import rpy_to_matrix
from ..sysid.dataset import Trajectory
from ..sysid.excitation import FourierTrajectory, JointLimits, limit_check

__all__ = [
    'ARM_POSTURE', 'BALL_RADIUS', 'CAPSULES', 'CHAIN_SLACK', 'CONTACT_SOLREF', 'CUP_HEIGHT',
    'CUP_LINK', 'CUP_RADIUS', 'CUP_WALL', 'CUP_WALL_SEGMENTS', 'CupNoise', 'CupPlant',
    'CupRecording', 'CupTruth', 'HOLD_S', 'IDENTIFICATION_POSTURE', 'LEGACY_STRING',
    'NOMINAL_BALL_MASS', 'NOMINAL_CUP_RPY', 'NOMINAL_CUP_XYZ', 'NOMINAL_STRING_LENGTH',
    'PLANT_STRING', 'RATE_HZ', 'ROBOT', 'SENSOR_NOISE', 'SPEED_LIMIT', 'STRING_DAMPING',
    'STRING_SOLREF', 'StringBuild', 'TIMESTEP', 'TRACKING_KD', 'TRACKING_KP', 'arm_reference',
    'arm_shapes', 'cosine_reference', 'draw_truth', 'identification_recordings', 'in_cup',
    'nominal_truth', 'string_references', 'tracking_controller',
]

Tensor = torch.Tensor
Controller = Callable[[float, np.ndarray, np.ndarray], Union[np.ndarray, Tensor, Sequence]]
ReferenceFn = Callable[[Tensor], Tuple[Tensor, Tensor, Tensor]]

#: Catalogue robot and the link the cup is fixed to.
ROBOT = 'wam4'
CUP_LINK = 'wam/tool_link'
#: Driver rate, Hz (the WAM's 500 Hz).
RATE_HZ = 500.0
#: Cup: inner radius and inner height (m), wall and bottom thickness (m), wall boxes.
CUP_RADIUS = 0.045
CUP_HEIGHT = 0.09
CUP_WALL = 0.005
CUP_WALL_SEGMENTS = 24
#: Ball radius, m.
BALL_RADIUS = 0.02
#: Capsule radius (m) and mass of the whole string (kg).
STRING_RADIUS = 0.0015
STRING_MASS = 0.002
#: Viscous damping of each of the string's capsule joints, N m s/rad: only the chain's own
#: stability needs it (the tendon carries the ball).  Over 64 flailing 4 s runs (zero torque
#: from random postures, unfollowable cosines; seeds 0-3 of ``benchmarks/cup_sim.py``) with
#: 10 capsules on the tendon: 1e-4 diverged in none (1 of 128 on seeds 0-7, where the old
#: string diverged in 3), 3e-5 in 3; 25 capsules at 1e-4 in 2, at 1e-5 with a 1e-7 armature
#: in 12 (``benchmarks/README.md``, "A faithful string").
STRING_DAMPING = 1e-4
#: The chain is this much longer than the tendon (relative), so it is never straight: a
#: straight chain of rigid capsules is a singular configuration (a string's snap there drove
#: MuJoCo's joint accelerations to divergence without the old 1e-3 damping) and it can push.
CHAIN_SLACK = 0.02
#: The tendon limit's ``solref`` (time constant s, damping ratio): a stiff, critically damped
#: (inelastic) snap at twice the timestep, the stiffest MuJoCo advises; a flailing arm that
#: whips the ball round stretched the string by 0.58 mm (2.1 mm at 0.002 s).
STRING_SOLREF = (0.001, 1.0)
#: Contact stiffness of every geom (MuJoCo ``solref``: time constant s, damping ratio; MuJoCo
#: averages the two geoms' values, so the cup and the arm carry it too): stiffer
#: than MuJoCo's 0.02 s default, under which a ball dropped 0.4 m into the cup sinks 11 mm
#: into its bottom (1.5 mm with this; 0.3 um at rest); at least twice the timestep, as
#: MuJoCo asks.
CONTACT_SOLREF = (0.002, 1.0)
#: The wall's inner corners stand this far inside CUP_RADIUS, m.
_WALL_MARGIN = 0.001
#: Number of capsules of the string's chain (4 cm each on a 0.40 m string): with 25 (16 mm,
#: 0.08 g each) the chain diverged in 2 of 64 flailing runs at the same damping.
CAPSULES = 10
#: Success: the ball must stay inside for the last ``HOLD_S`` seconds.
HOLD_S = 0.2
#: Nominal (catalogue / tape-measure) values of the cup and string.
NOMINAL_STRING_LENGTH = 0.40
NOMINAL_CUP_XYZ = (0.0, 0.0, 0.06)
NOMINAL_CUP_RPY = (0.0, 0.0, 0.0)
NOMINAL_BALL_MASS = 0.025
#: MuJoCo timestep, s (4 substeps per 2 ms driver period).
TIMESTEP = 0.0005
#: Joint speed the identification trajectories stay below, rad/s.
SPEED_LIMIT = 3.0

# Contact filters: the ball collides with the cup and the arm, nothing else collides.
_SOLID, _BALL = 2, 0


@dataclass(frozen=True)
class CupTruth:
    """
    The hidden parameters of a ball-in-a-cup plant.

    :param arm: the WAM-4's true parameters (inertials, joint friction) relative to the
        catalogue model.
    :param string_length: anchor-to-ball-centre distance of the taut string, m.
    :param cup_xyz: translation of the cup frame in ``wam/tool_link``, m.
    :param cup_rpy: rotation of the cup frame, URDF roll-pitch-yaw, rad.
    :param ball_mass: kg.
    """

    arm: TrueParameters = field(default_factory=lambda: TrueParameters(robot=ROBOT))
    string_length: float = NOMINAL_STRING_LENGTH
    cup_xyz: tuple = NOMINAL_CUP_XYZ
    cup_rpy: tuple = NOMINAL_CUP_RPY
    ball_mass: float = NOMINAL_BALL_MASS

    def __post_init__(self) -> None:
        """Validate the numbers."""
        if not isinstance(self.arm, TrueParameters) or self.arm.robot != ROBOT:
            raise ValueError(f'CupTruth.arm must be TrueParameters of {ROBOT!r}, '
                             f'got {self.arm!r}')
        for name in ('string_length', 'ball_mass'):
            value = float(getattr(self, name))
            if not (math.isfinite(value) and value > 0.0):
                raise ValueError(f'CupTruth.{name} must be > 0, got {getattr(self, name)!r}')
            object.__setattr__(self, name, value)
        if self.string_length <= BALL_RADIUS + CUP_HEIGHT:
            raise ValueError(f'CupTruth.string_length must exceed the cup height plus the ball '
                             f'radius ({CUP_HEIGHT + BALL_RADIUS} m), got {self.string_length}')
        object.__setattr__(self, 'cup_xyz', finite_vector(self.cup_xyz, 3, 'CupTruth.cup_xyz'))
        object.__setattr__(self, 'cup_rpy', finite_vector(self.cup_rpy, 3, 'CupTruth.cup_rpy'))

    def arm_model(self) -> RobotModel:
        """
        Return the model that describes the plant's arm exactly (no cup, no ball).

        :return: float64 :class:`RobotModel` of the WAM-4.
        """
        return self.arm.as_model(nominal_model(ROBOT))

    def T_tool_cup(self) -> np.ndarray:
        """
        Return the cup frame in ``wam/tool_link``.

        :return: ``(4, 4)`` homogeneous transform.
        """
        T = np.eye(4)
        T[:3, :3] = rpy_to_matrix(torch.tensor(self.cup_rpy, dtype=torch.float64)).numpy()
        T[:3, 3] = self.cup_xyz
        return T


@dataclass(frozen=True)
class StringBuild:
    """
    How the plant's string is built and integrated (numerics, not hidden truth).

    The default is the plant's string: a free ball held at the string's length from the
    anchor by a limited MuJoCo tendon (pulls, never pushes, folds freely), and a chain of
    capsules of the string's mass from the anchor to the ball's centre, slightly longer than
    the tendon.  ``tendon=False`` is the string of the plant before 2026-11-27 evening
    (:data:`LEGACY_STRING`): the chain alone, as long as the string, the ball welded to its
    last capsule.

    :param capsules: number of capsules of the chain.
    :param damping: viscous damping of every capsule joint, N m s/rad.
    :param armature: inertia added to every capsule joint's three dofs, kg m^2.
    :param integrator: MuJoCo integrator (``sim.builder.INTEGRATORS`` key).
    :param timestep: MuJoCo timestep, s; must divide the 2 ms driver period.
    :param tendon: hold the string's length by a spatial tendon from the anchor to the
        ball's centre, limited to the string length; the ball is then a free body tied to the
        chain's tip, the chain ``1 + chain_slack`` times as long as the string.
    :param chain_slack: the chain's extra length with a tendon, relative.
    :param tendon_solref: the tendon limit's MuJoCo ``solref`` (time constant s, damping
        ratio); also the tie of the chain's tip to the ball.
    """

    capsules: int = CAPSULES
    damping: float = STRING_DAMPING
    armature: float = 0.0
    integrator: str = 'implicitfast'
    timestep: float = TIMESTEP
    tendon: bool = True
    chain_slack: float = CHAIN_SLACK
    tendon_solref: tuple = STRING_SOLREF

    def __post_init__(self) -> None:
        """Validate the numbers."""
        if isinstance(self.capsules, bool) or not isinstance(self.capsules, int) or \
                self.capsules < 2:
            raise ValueError(f'StringBuild.capsules must be an int >= 2, got {self.capsules!r}')
        for name in ('damping', 'armature', 'chain_slack'):
            value = float(getattr(self, name))
            if not (math.isfinite(value) and value >= 0.0):
                raise ValueError(f'StringBuild.{name} must be finite and >= 0, got {value!r}')
            object.__setattr__(self, name, value)
        substeps = (1.0 / RATE_HZ) / self.timestep if self.timestep > 0 else math.nan
        if not abs(substeps - round(substeps)) < 1e-9:
            raise ValueError(f'timestep must divide the driver period {1.0 / RATE_HZ} s, '
                             f'got {self.timestep!r}')

    def chain_length(self, string_length: float) -> float:
        """
        Return the capsule chain's length for a string of ``string_length``, m.

        :param string_length: anchor-to-ball-centre distance of the taut string, m.
        :return: m.
        """
        return string_length * (1.0 + self.chain_slack) if self.tendon else string_length


#: The plant's string.
PLANT_STRING = StringBuild()
#: The string of the plant before 2026-11-27 evening, kept to measure old against new: 25
#: capsules as long as the string, every joint damped by 1e-3 N m s/rad, the ball welded to
#: the last one.  Measured against an ideal string (``benchmarks/cup_fidelity.py``): a damped
#: chain of rigid capsules resists folding (near the ball ``b / (m s^2)`` ~ 150 1/s) and a
#: straight one pushes, so a slack ball falls 3.9 cm short of free fall in 0.1 s.
LEGACY_STRING = StringBuild(capsules=25, damping=1e-3, tendon=False, chain_slack=0.0)


def nominal_truth(string_length: float = NOMINAL_STRING_LENGTH) -> CupTruth:
    """
    Return the plant a user would build from the catalogue and a tape measure.

    :param string_length: m.
    :return: catalogue arm, nominal cup transform and ball mass.
    """
    return CupTruth(string_length=string_length)


def draw_truth(seed: int, string_length: float = NOMINAL_STRING_LENGTH,
               param_error: float = 0.3, length_error: float = 0.01) -> CupTruth:
    """
    Draw a hidden plant around the nominal one, deterministically from ``seed``.

    Spreads (independent, uniform unless stated): the arm's parameters as
    :meth:`TrueParameters.sample` draws them with ``param_error``; the cup's position
    +-2.5 cm per axis and its rotation +-5 degrees per angle off the nominal transform; the
    ball's mass +-30 %; the string's length ``string_length +- length_error`` (a knot and
    the ball's eyelet make the effective length differ from the tape measure's).

    :param seed: integer seed of a local generator.
    :param string_length: nominal (measured) string length, m.
    :param param_error: relative error of the arm's parameters.
    :param length_error: largest deviation of the true string length, m.
    :return: the hidden truth.
    """
    generator = torch.Generator().manual_seed(int(seed))
    arm = TrueParameters.sample(ROBOT, param_error, generator)

    def uniform(count: int, half_width: float) -> list:
        u = torch.rand(count, generator=generator, dtype=torch.float64)
        return ((2.0 * u - 1.0) * half_width).tolist()

    xyz = [n + d for n, d in zip(NOMINAL_CUP_XYZ, uniform(3, 0.025))]
    rpy = [n + d for n, d in zip(NOMINAL_CUP_RPY, uniform(3, math.radians(5.0)))]
    mass = NOMINAL_BALL_MASS * (1.0 + uniform(1, 0.3)[0])
    length = string_length + uniform(1, length_error)[0]
    return CupTruth(arm=arm, string_length=length, cup_xyz=tuple(xyz), cup_rpy=tuple(rpy),
                    ball_mass=mass)


@dataclass(frozen=True)
class CupNoise:
    """
    Sensor noise of a run (zero-mean Gaussian, independent per sample).

    :param q: joint-position std, rad (the controller sees it too).
    :param qd: joint-velocity std, rad/s (the controller sees it too).
    :param ball: ball motion-capture position std, m.
    """

    q: float = 0.0
    qd: float = 0.0
    ball: float = 0.0

    def __post_init__(self) -> None:
        """Validate the numbers."""
        for name in ('q', 'qd', 'ball'):
            value = float(getattr(self, name))
            if not (math.isfinite(value) and value >= 0.0):
                raise ValueError(f'CupNoise.{name} must be finite and >= 0, got {value!r}')
            object.__setattr__(self, name, value)


#: Noise of repeated executions: encoder-level position noise, a filtered velocity's noise,
#: sub-millimetre motion capture.
SENSOR_NOISE = CupNoise(q=2e-4, qd=0.02, ball=5e-4)


@dataclass(frozen=True, eq=False)
class CupRecording:
    """
    One run of a :class:`CupPlant`, sampled at the driver rate.

    Sample ``k`` is what the sensors read at ``t[k]`` and the torque applied from then on.

    :param t: ``(T,)`` s, ``t[k] = k / RATE_HZ``.
    :param q: ``(T, 4)`` measured joint positions, rad, ``joint_names`` order.
    :param qd: ``(T, 4)`` measured joint velocities, rad/s.
    :param tau: ``(T, 4)`` applied joint torques (the controller's, clipped), N m.
    :param ball: ``(T, 3)`` measured ball centre in the world frame, m; None when the plant
        has no ball.
    :param cup_pos: ``(T, 3)`` true cup-frame origin (the anchor) in the world frame, m.
    :param cup_rot: ``(T, 3, 3)`` true ``R_world_cup``.
    :param joint_names: the arm's joints.
    :param contact: ``(T,)`` bool, the ball touched the cup or the arm during period ``k``
        (None without a ball).
    :param saturated: fraction of samples where a torque was at its limit (clipped by the
        plant, or by the controller itself).
    """

    t: np.ndarray
    q: np.ndarray
    qd: np.ndarray
    tau: np.ndarray
    ball: Optional[np.ndarray]
    cup_pos: np.ndarray
    cup_rot: np.ndarray
    joint_names: tuple
    contact: Optional[np.ndarray] = None
    saturated: float = 0.0

    def ball_in_cup_frame(self) -> np.ndarray:
        """
        Return the ball's centre in the cup frame.

        :return: ``(T, 3)`` m.
        :raises ValueError: the recording has no ball.
        """
        if self.ball is None:
            raise ValueError('this recording has no ball (a plant built with ball=False)')
        return np.einsum('tji,tj->ti', self.cup_rot, self.ball - self.cup_pos)

    def trajectory(self, run: str = 'cup') -> Trajectory:
        """
        Return the arm's part as a sysid :class:`Trajectory` (for the fixed-base fits).

        :param run: run name.
        :return: float64 trajectory with ``t``, ``q``, ``qd``, ``tau``.
        """
        return Trajectory(t=torch.from_numpy(self.t), q=torch.from_numpy(self.q),
                          qd=torch.from_numpy(self.qd), tau=torch.from_numpy(self.tau),
                          joint_names=self.joint_names, run=run)


def in_cup(recording: CupRecording, hold_s: float = HOLD_S) -> bool:
    """
    Say whether the ball ends in the cup (the success rule of issue 18).

    :param recording: a run with a ball, at least ``hold_s`` long.
    :param hold_s: how long before the end the ball must already be inside, s.
    :return: True when over the last ``hold_s`` every sample has the ball's centre at radial
        distance < ``CUP_RADIUS - BALL_RADIUS`` from the cup's axis and height in
        ``(0, CUP_HEIGHT)`` in the cup frame.
    """
    t = recording.t
    if t.size == 0 or t[-1] - t[0] < hold_s:
        raise ValueError(f'the recording lasts {t[-1] - t[0] if t.size else 0.0:.3f} s, '
                         f'shorter than hold_s={hold_s}')
    last = t >= t[-1] - hold_s + 1e-9
    ball = recording.ball_in_cup_frame()[last]
    radial = np.hypot(ball[:, 0], ball[:, 1])
    return bool(np.all((radial < CUP_RADIUS - BALL_RADIUS) & (ball[:, 2] > 0.0)
                       & (ball[:, 2] < CUP_HEIGHT)))


# -- the MuJoCo model ------------------------------------------------------------------------
def arm_shapes(urdf: Optional[str] = None) -> Tuple[LinkShape, ...]:
    """
    Return the arm's contact shapes: its URDF visual spheres and cylinders.

    The plant's ball collides with exactly these (:class:`CupPlant`), and the policy search's
    episodes end where the model's ball touches them (``control.ball_in_cup``).

    :param urdf: URDF text (None: the catalogue WAM-4's).
    :return: one :class:`~diffsim_ros.control.ball_in_cup.LinkShape` per visual.
    :raises ValueError: a visual of another kind (box, mesh), which neither side models.
    """
    root = ET.fromstring((robots.urdf_string(ROBOT) if urdf is None else urdf).strip().encode())
    shapes = []
    for link in root.findall('link'):
        for visual in link.findall('visual'):
            origin = visual.find('origin')
            xyz, rpy = ((tuple(float(v) for v in origin.get(key, '0 0 0').split())
                         if origin is not None else (0.0, 0.0, 0.0)) for key in ('xyz', 'rpy'))
            child = visual.find('geometry')[0]
            if child.tag == 'sphere':
                shapes.append(LinkShape(link.get('name'), 'sphere', float(child.get('radius')),
                                        0.0, xyz, rpy))
            elif child.tag == 'cylinder':
                shapes.append(LinkShape(link.get('name'), 'cylinder',
                                        float(child.get('radius')),
                                        0.5 * float(child.get('length')), xyz, rpy))
            else:
                raise ValueError(f'arm_shapes: link {link.get("name")!r} has a {child.tag} '
                                 'visual; only spheres and cylinders are contact shapes')
    return tuple(shapes)


def _solid_geoms_from_visuals(spec: mujoco.MjSpec, urdf: str) -> None:
    """Give the arm's links their contact shapes (:func:`arm_shapes`) as massless geoms."""
    for shape in arm_shapes(urdf):
        quat = np.zeros(4)
        R = rpy_to_matrix(torch.tensor(shape.rpy, dtype=torch.float64)).numpy()
        mujoco.mju_mat2Quat(quat, R.reshape(9))
        kind = (mujoco.mjtGeom.mjGEOM_SPHERE if shape.kind == 'sphere'
                else mujoco.mjtGeom.mjGEOM_CYLINDER)
        spec.body(shape.link).add_geom(
            type=kind, size=[shape.radius, shape.half_length, 0], pos=list(shape.xyz),
            quat=quat, contype=_SOLID, conaffinity=0, mass=0.0, density=0.0,
            solref=list(CONTACT_SOLREF))


def _add_cup(parent, truth: CupTruth):
    """Add the cup body (massless, welded) to ``parent``; return it."""
    T = truth.T_tool_cup()
    quat = np.zeros(4)
    mujoco.mju_mat2Quat(quat, T[:3, :3].reshape(9))
    cup = parent.add_body(name='cup', pos=T[:3, 3], quat=quat, mass=0.0)
    solid = {'contype': _SOLID, 'conaffinity': 0, 'rgba': [0.8, 0.3, 0.2, 1.0],
             'solref': list(CONTACT_SOLREF)}
    cup.add_geom(name='cup_bottom', type=mujoco.mjtGeom.mjGEOM_CYLINDER,
                 size=[CUP_RADIUS + CUP_WALL, 0.5 * CUP_WALL, 0], pos=[0, 0, -0.5 * CUP_WALL],
                 **solid)
    # The wall is a polygon of boxes whose inner corners lie on the circle of radius
    # CUP_RADIUS - _WALL_MARGIN: every place a resting ball can take is then inside the
    # success rule's cylinder (the margin covers the contact's penetration at rest).
    n = CUP_WALL_SEGMENTS
    corner = CUP_RADIUS - _WALL_MARGIN
    inner = corner * math.cos(math.pi / n)
    width = 2.0 * (inner + CUP_WALL) * math.tan(math.pi / n)
    half_height = 0.5 * (CUP_HEIGHT + CUP_WALL)
    for k in range(n):
        angle = 2.0 * math.pi * k / n
        centre = inner + 0.5 * CUP_WALL
        cup.add_geom(name=f'cup_wall_{k}', type=mujoco.mjtGeom.mjGEOM_BOX,
                     size=[0.5 * CUP_WALL, 0.5 * width, half_height],
                     pos=[centre * math.cos(angle), centre * math.sin(angle),
                          half_height - CUP_WALL],
                     quat=[math.cos(0.5 * angle), 0.0, 0.0, math.sin(0.5 * angle)], **solid)
    return cup


def _add_string(spec: mujoco.MjSpec, cup, truth: CupTruth, build: 'StringBuild') -> None:
    """Add the capsule chain from the anchor along the cup's -z and the ball at its end."""
    count = build.capsules
    segment = build.chain_length(truth.string_length) / count
    mass = STRING_MASS / count
    bending = mass * (3.0 * STRING_RADIUS ** 2 + segment ** 2) / 12.0
    axial = 0.5 * mass * STRING_RADIUS ** 2
    parent, position = cup, [0.0, 0.0, 0.0]
    for k in range(count):
        body = parent.add_body(name=f'string_{k}', pos=position, mass=mass,
                               ipos=[0.0, 0.0, -0.5 * segment],
                               inertia=[bending, bending, axial])
        body.add_joint(name=f'string_joint_{k}', type=mujoco.mjtJoint.mjJNT_BALL,
                       damping=build.damping, armature=build.armature)
        body.add_geom(type=mujoco.mjtGeom.mjGEOM_CAPSULE, size=[STRING_RADIUS, 0, 0],
                      fromto=[0, 0, 0, 0, 0, -segment], contype=0, conaffinity=0,
                      mass=0.0, density=0.0, rgba=[0.9, 0.9, 0.8, 1.0])
        parent, position = body, [0.0, 0.0, -segment]
    moment = 0.4 * truth.ball_mass * BALL_RADIUS ** 2
    if build.tendon:
        # a free ball: the tendon holds the length, the chain's tip is tied to its centre
        ball = spec.worldbody.add_body(name='ball', mass=truth.ball_mass,
                                       inertia=[moment, moment, moment])
        ball.add_freejoint(name='ball_free')
        spec.add_equality(type=mujoco.mjtEq.mjEQ_CONNECT, objtype=mujoco.mjtObj.mjOBJ_BODY,
                          name1=f'string_{count - 1}', name2='ball',
                          data=[0.0, 0.0, -segment] + [0.0] * 9,
                          solref=list(build.tendon_solref))
    else:
        ball = parent.add_body(name='ball', pos=position, mass=truth.ball_mass,
                               inertia=[moment, moment, moment])
    ball.add_geom(name='ball', type=mujoco.mjtGeom.mjGEOM_SPHERE, size=[BALL_RADIUS, 0, 0],
                  contype=_BALL, conaffinity=_SOLID, mass=0.0, density=0.0,
                  solref=list(CONTACT_SOLREF),
                  rgba=[0.2, 0.4, 0.9, 1.0])
    if build.tendon:
        cup.add_site(name='string_anchor', pos=[0.0, 0.0, 0.0])
        ball.add_site(name='ball_centre', pos=[0.0, 0.0, 0.0])
        tendon = spec.add_tendon(name='string', limited=mujoco.mjtLimited.mjLIMITED_TRUE,
                                 range=[0.0, truth.string_length],
                                 solref_limit=list(build.tendon_solref))
        tendon.wrap_site('string_anchor')
        tendon.wrap_site('ball_centre')


def _zigzag(count: int, segment: float, distance: float) -> Tuple[float, np.ndarray]:
    """
    Return the zig-zag fold that puts a chain's end ``distance`` from its start.

    In the first capsule's frame capsule ``k`` points along ``-z`` (even ``k``) or along
    ``-z`` turned about ``y`` by ``-bend`` (odd ``k``).

    :param count: capsules.
    :param segment: capsule length, m.
    :param distance: wanted start-to-end distance, m (at most ``count * segment``).
    :return: ``(bend rad, end (3,) in the first capsule's frame)``.
    """
    def end(bend: float) -> np.ndarray:
        angles = np.where(np.arange(count) % 2 == 0, 0.0, -bend)
        return segment * np.array([-np.sin(angles).sum(), 0.0, -np.cos(angles).sum()])

    if distance >= count * segment * (1.0 - 1e-12):
        return 0.0, end(0.0)
    low, high = 0.0, math.pi
    for _ in range(60):
        middle = 0.5 * (low + high)
        low, high = (middle, high) if np.linalg.norm(end(middle)) > distance else (low, middle)
    return high, end(high)


def _turn(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Return the rotation by the smallest angle that takes unit vector ``a`` to ``b``."""
    axis = np.cross(a, b)
    sine, cosine = np.linalg.norm(axis), float(np.dot(a, b))
    if sine < 1e-12:
        if cosine > 0:
            return np.eye(3)
        # opposite: half a turn about any axis normal to a
        normal = np.cross(a, [1.0, 0.0, 0.0] if abs(a[0]) < 0.9 else [0.0, 1.0, 0.0])
        normal /= np.linalg.norm(normal)
        return 2.0 * np.outer(normal, normal) - np.eye(3)
    k = axis / sine
    K = np.array([[0.0, -k[2], k[1]], [k[2], 0.0, -k[0]], [-k[1], k[0], 0.0]])
    return np.eye(3) + sine * K + (1.0 - cosine) * (K @ K)


class CupPlant:
    """
    The ground truth: the WAM-4 with a cup and a ball on a string.

    The string is a length-limited tendon, and a chain of capsules carries its mass.

    :param truth: the hidden parameters.
    :param ball: build the string and the ball (False: the arm and its empty cup, for the
        arm's own identification run, done with the ball taken off).
    :param timestep: MuJoCo timestep, s; must divide the 2 ms driver period (None: the
        string build's).
    :param string: how the string is built and integrated (None: :data:`PLANT_STRING`).
    """

    def __init__(self, truth: CupTruth, ball: bool = True, timestep: Optional[float] = None,
                 string: Optional['StringBuild'] = None) -> None:
        self.truth = truth
        self.info = robots.get(ROBOT)
        build = PLANT_STRING if string is None else string
        if timestep is not None:
            build = dataclasses.replace(build, timestep=timestep)
        #: How the string is built and integrated.
        self.string = build
        timestep = build.timestep
        substeps = (1.0 / RATE_HZ) / timestep
        #: MuJoCo steps per driver period.
        self.substeps = int(round(substeps))
        #: The arm's exact model (the cup and the ball excluded).
        self.true_model: RobotModel = truth.arm_model()
        urdf = robots.urdf_string(ROBOT)
        self.has_ball = bool(ball)

        def extend(spec: mujoco.MjSpec) -> None:
            _solid_geoms_from_visuals(spec, urdf)
            cup = _add_cup(spec.body(CUP_LINK), truth)
            if self.has_ball:
                _add_string(spec, cup, truth, build)

        self.mj_model, self._index = build_mujoco_model(
            urdf, self.true_model, timestep, integrator=build.integrator, joint_limits=True,
            extend=extend, contacts=True)
        self.mj_data = mujoco.MjData(self.mj_model)
        name = mujoco.mjtObj.mjOBJ_BODY
        self._cup = mujoco.mj_name2id(self.mj_model, name, 'cup')
        self._ball = mujoco.mj_name2id(self.mj_model, name, 'ball') if ball else -1
        first = mujoco.mj_name2id(self.mj_model, mujoco.mjtObj.mjOBJ_JOINT, 'string_joint_0')
        self._string_qpos = int(self.mj_model.jnt_qposadr[first]) if ball else -1
        self._string_dof = int(self.mj_model.jnt_dofadr[first]) if ball else -1
        joint = mujoco.mjtObj.mjOBJ_JOINT
        self._capsule_qpos = [
            int(self.mj_model.jnt_qposadr[mujoco.mj_name2id(self.mj_model, joint,
                                                            f'string_joint_{k}')])
            for k in range(self.string.capsules)] if ball else []
        if self.string.tendon and ball:
            # MuJoCo sets the connect's anchor in the ball from the compile-time pose (the
            # ball at the origin): the chain's tip is tied to the ball's centre
            self.mj_model.eq_data[0, 3:6] = 0.0
        free = mujoco.mj_name2id(self.mj_model, joint, 'ball_free')
        self._ball_free_qpos = int(self.mj_model.jnt_qposadr[free]) if free >= 0 else -1
        self._ball_free_dof = int(self.mj_model.jnt_dofadr[free]) if free >= 0 else -1
        #: Length of one capsule, m.
        self._segment = self.string.chain_length(truth.string_length) / self.string.capsules
        gain = truth.arm.actuator_gain
        self._gain = np.array([gain.get(j, 1.0) for j in self.joint_names])
        limits = dict(zip(self.info.joint_names, self.info.command_limit))
        #: Torque limits per joint, N m (libbarrett's control-signal limits).
        self.command_limit = np.array([limits[j] for j in self.joint_names])

    @property
    def joint_names(self) -> tuple:
        """Return the arm's joints, the column order of every ``(4,)`` array."""
        return self.true_model.joint_names

    @property
    def period(self) -> float:
        """Return the driver period, s."""
        return 1.0 / RATE_HZ

    def reset(self, q0: Sequence[float], qd0: Optional[Sequence[float]] = None,
              string_direction: Sequence[float] = (0.0, 0.0, -1.0),
              ball_velocity: Optional[Sequence[float]] = None, reach: float = 1.0) -> None:
        """
        Put the arm at ``q0`` and the ball a string's length from the anchor, at rest.

        The capsules lie straight when the chain is as long as the string, else (a chain
        longer than its tendon, or ``reach < 1``) folded zig-zag in one plane, every other
        joint bent by the same angle.

        :param q0: ``(4,)`` joint positions, rad.
        :param qd0: ``(4,)`` joint velocities, rad/s (default 0); the string starts at rest.
        :param string_direction: world direction from the anchor to the ball (default:
            hanging down; straight up holds the ball above the cup, to drop it in).
        :param ball_velocity: ``(3,)`` world velocity, m/s, of the ball relative to the
            anchor, given by turning the whole string rigidly about the anchor (its
            component along ``string_direction`` is dropped); None: at rest.
        :param reach: the ball's distance from the anchor as a fraction of the string length
            (``< 1``: the string starts slack), in ``(0.5, 1]``.
        """
        m, d = self.mj_model, self.mj_data
        mujoco.mj_resetData(m, d)
        d.qpos[self._index.qpos] = finite_vector(q0, 4, 'q0')
        d.qvel[self._index.dof] = (0.0,) * 4 if qd0 is None else finite_vector(qd0, 4, 'qd0')
        if self.has_ball:
            mujoco.mj_kinematics(m, d)
            direction = np.array(finite_vector(string_direction, 3, 'string_direction'))
            if not np.linalg.norm(direction) > 0:
                raise ValueError('string_direction must not be zero')
            if not 0.5 < float(reach) <= 1.0:
                raise ValueError(f'reach must be in (0.5, 1], got {reach!r}')
            unit = direction / np.linalg.norm(direction)
            bend, end = _zigzag(self.string.capsules, self._segment,
                                float(reach) * self.truth.string_length)
            for k, adr in enumerate(self._capsule_qpos[1:], start=1):
                # joint k turns capsule k about its parent's y axis by -bend, +bend, ...
                half = -0.5 * bend if k % 2 else 0.5 * bend
                d.qpos[adr:adr + 4] = [math.cos(half), 0.0, math.sin(half), 0.0]
            # R_world_first turns the chain's end (in the first capsule's frame) onto the
            # direction; the joint holds R_cup_first = R_world_cup^T R_world_first.
            R_world_first = _turn(end / np.linalg.norm(end), unit)
            R_world_cup = d.xmat[self._cup].reshape(3, 3)
            quat = np.zeros(4)
            mujoco.mju_mat2Quat(quat, (R_world_cup.T @ R_world_first).reshape(9))
            d.qpos[self._string_qpos:self._string_qpos + 4] = quat
            omega = np.zeros(3)
            if ball_velocity is not None:
                # a ball joint's velocity is the child's angular velocity in its own frame
                omega = np.cross(unit, finite_vector(ball_velocity, 3, 'ball_velocity')) \
                    / np.linalg.norm(end)
                d.qvel[self._string_dof:self._string_dof + 3] = R_world_first.T @ omega
            if self._ball_free_qpos >= 0:
                # the free ball sits at the chain's tip and moves with it
                mujoco.mj_kinematics(m, d)
                anchor = d.xpos[self._cup]
                tip = anchor + R_world_first @ end
                d.qpos[self._ball_free_qpos:self._ball_free_qpos + 7] = [*tip, 1, 0, 0, 0]
                d.qvel[self._ball_free_dof:self._ball_free_dof + 3] = np.cross(omega,
                                                                               tip - anchor)
        mujoco.mj_forward(m, d)

    def anchor(self) -> Tuple[np.ndarray, np.ndarray]:
        """
        Return the cup frame now.

        :return: ``(p_world_cup (3,), R_world_cup (3, 3))``.
        """
        d = self.mj_data
        return d.xpos[self._cup].copy(), d.xmat[self._cup].reshape(3, 3).copy()

    def joint_state(self) -> Tuple[np.ndarray, np.ndarray]:
        """
        Return the arm's true joint state now.

        :return: ``(q (4,) rad, qd (4,) rad/s)`` in :attr:`joint_names` order.
        """
        d = self.mj_data
        return d.qpos[self._index.qpos].copy(), d.qvel[self._index.dof].copy()

    def ball_position(self) -> np.ndarray:
        """
        Return the ball's centre now.

        :return: ``(3,)`` world, m.
        """
        return self.mj_data.xpos[self._ball].copy()

    def run(self, controller: Controller, q0: Sequence[float], seconds: float,
            noise: Optional[CupNoise] = None, seed: int = 0,
            qd0: Optional[Sequence[float]] = None,
            string_direction: Sequence[float] = (0.0, 0.0, -1.0),
            ball_velocity: Optional[Sequence[float]] = None) -> CupRecording:
        """
        Reset to ``q0`` (string hanging at rest) and run a torque controller at 500 Hz.

        :param controller: ``controller(t, q, qd) -> tau (4,)`` N m, called once per driver
            period with the measured (noisy) state; its torque is clipped at
            :attr:`command_limit` and held for the period.
        :param q0: ``(4,)`` initial joint positions, rad.
        :param seconds: duration; ``round(seconds * 500)`` samples are recorded.
        :param noise: sensor noise (None: noiseless).
        :param seed: seed of the noise.
        :param qd0: initial joint velocities (default 0).
        :param string_direction: world direction of the straight string at the start
            (default: hanging down, at rest).
        :param ball_velocity: the ball's start velocity relative to the anchor
            (:meth:`reset`).
        :return: the recording.
        :raises ValueError: a non-finite or wrongly shaped torque.
        :raises RuntimeError: MuJoCo's integration diverged.
        """
        steps = int(round(float(seconds) * RATE_HZ))
        if steps < 1:
            raise ValueError(f'seconds must give at least one sample, got {seconds!r}')
        noise = CupNoise() if noise is None else noise
        rng = np.random.default_rng([int(seed), 18])
        self.reset(q0, qd0, string_direction, ball_velocity)
        d, qpos, dof = self.mj_data, self._index.qpos, self._index.dof
        t = np.arange(steps) / RATE_HZ
        q, qd, tau = (np.zeros((steps, 4)) for _ in range(3))
        ball = np.zeros((steps, 3)) if self.has_ball else None
        cup_pos, cup_rot = np.zeros((steps, 3)), np.zeros((steps, 3, 3))
        contact = np.zeros(steps, dtype=bool)
        clipped = 0
        for k in range(steps):
            q[k] = d.qpos[qpos] + noise.q * rng.standard_normal(4)
            qd[k] = d.qvel[dof] + noise.qd * rng.standard_normal(4)
            cup_pos[k], cup_rot[k] = d.xpos[self._cup], d.xmat[self._cup].reshape(3, 3)
            if ball is not None:
                ball[k] = d.xpos[self._ball] + noise.ball * rng.standard_normal(3)
            command = controller(float(t[k]), q[k].copy(), qd[k].copy())
            if isinstance(command, torch.Tensor):
                command = command.detach().cpu().numpy()
            tau[k], contact[k] = self.apply(command, float(t[k]))
            clipped += bool((np.abs(tau[k]) >= self.command_limit - 1e-9).any())
        return CupRecording(t=t, q=q, qd=qd, tau=tau, ball=ball, cup_pos=cup_pos,
                            cup_rot=cup_rot, joint_names=self.joint_names,
                            contact=contact if self.has_ball else None,
                            saturated=clipped / steps)

    def apply(self, command: Sequence[float], t: float = math.nan) -> Tuple[np.ndarray, bool]:
        """
        Apply joint torques for one driver period (the step of :meth:`run` and the driver).

        :param command: ``(4,)`` N m, clipped at :attr:`command_limit`, held for the period.
        :param t: the time, s, for error messages.
        :return: ``(tau (4,) applied, whether anything touched during the period)``.
        :raises ValueError: a non-finite or wrongly shaped torque (nothing is applied).
        :raises RuntimeError: MuJoCo's integration diverged.
        """
        u = np.asarray(command, dtype=np.float64)
        if u.shape != (4,) or not np.isfinite(u).all():
            raise ValueError(f'the controller must return 4 finite torques for '
                             f'{list(self.joint_names)}, got {command!r} at t={t}')
        tau = np.clip(u, -self.command_limit, self.command_limit)
        m, d = self.mj_model, self.mj_data
        d.qfrc_applied[self._index.dof] = self._gain * tau
        contact = False
        for _ in range(self.substeps):
            mujoco.mj_step(m, d)
            contact |= d.ncon > 0
        if d.warning[mujoco.mjtWarning.mjWARN_BADQACC].number:
            raise RuntimeError(f'MuJoCo diverged at t={t:.3f} s (bad acceleration)')
        return tau, bool(contact)

    def __repr__(self) -> str:
        """Return a one-line summary."""
        truth = self.truth
        return (f'CupPlant(string {truth.string_length:.4f} m in {self.string.capsules} '
                f'capsules{" on a tendon" if self.string.tendon else ""}, '
                f'ball {truth.ball_mass * 1e3:.1f} g, {RATE_HZ:g} Hz x {self.substeps})')


# -- tracking and identification runs --------------------------------------------------------
#: The tracking controller's stiffness (1/s^2) and damping (1/s): critically damped at
#: ``omega = 50`` rad/s (``omega dt = 0.1`` at the 500 Hz driver rate).  The ball's pull is a
#: disturbance the controller does not model; at ``omega = 20`` (400, 40; until 2026-11-27)
#: it pushed the arm of the plants with a light forearm 0.025-0.038 rad off the reference
#: along oracle swing-ups (0.0003 rad with the ball taken off), the cup 1-2 cm, and the oracle
#: string model's ball was 1.0-1.7 cm from the plant's at 1 s where the string alone (the
#: model replayed along the executed arm motion) accounts for 0.1-0.4 cm; none of those
#: swing-ups ended in the cup.  At 50 rad/s the arm stays within 0.005-0.006 rad
#: (``benchmarks/README.md``, "The arm, not the string").  They are the WAM-4 task's gains
#: (``control.tasks.TASKS``), which the mpc node tracks a swing-up reference with.
TRACKING_KP = float(TASKS[ROBOT].extra['computed_torque']['kp'])
TRACKING_KD = float(TASKS[ROBOT].extra['computed_torque']['kd'])


def tracking_controller(model: RobotModel, reference: ReferenceFn, kp: float = TRACKING_KP,
                        kd: float = TRACKING_KD, horizon: int = 5) -> Controller:
    """
    Wrap :class:`~diffsim_ros.control.baselines.ComputedTorque` as a plant controller.

    The law is re-solved every ``horizon`` driver periods (its feedforward and gains cover
    the periods in between) and evaluated at every period for the measured state.  The
    default gains are :data:`TRACKING_KP` and :data:`TRACKING_KD`.

    :param model: the arm model the controller believes in (catalogue, identified).
    :param reference: ``times (T,) -> (q, qd, qdd)`` each ``(T, 4)``, e.g.
        ``FourierTrajectory.evaluate``.
    :param kp: stiffness, 1/s^2 (acceleration per rad of error).
    :param kd: damping, 1/s.
    :param horizon: driver periods per solve.
    :return: ``controller(t, q, qd) -> tau (4,)``.
    """
    info = robots.get(ROBOT)
    limit = torch.tensor(info.command_limit, dtype=model.dtype)
    dynamics = ModelDynamics.for_robot(ROBOT, model, 1.0 / RATE_HZ, u_min=-limit,
                                       u_max=limit)
    law = ComputedTorque(dynamics, reference, kp=[kp] * model.n, kd=[kd] * model.n,
                         horizon=horizon, gravity_in_command=False)
    state = {'policy': None, 'until': -math.inf}

    def controller(t: float, q: np.ndarray, qd: np.ndarray) -> np.ndarray:
        x = torch.from_numpy(np.concatenate((q, qd))).to(model.dtype)
        if t >= state['until'] - 1e-9:
            state['policy'] = law.solve(x, t)
            state['until'] = t + horizon / RATE_HZ
        with torch.no_grad():
            return state['policy'](t, x).numpy()

    return controller


#: Centre of the string runs: upper arm tilted forward, forearm about horizontal, the cup's
#: opening pointing forward, the ball hanging clear below the anchor.
IDENTIFICATION_POSTURE = (0.0, 0.6, 0.0, 1.0)
#: Centre of the arm's sinusoid: near upright, where gravity leaves the torque to the motion.
ARM_POSTURE = (0.0, 0.0, 0.0, 1.2)
#: Distance of the cup from the base and the shoulder axes at the string posture, m (to
#: turn a cup displacement into a joint amplitude).
_LEVER = 0.8


def cosine_reference(centre: Sequence[float], amplitude: Sequence[float],
                     harmonic: Sequence[int], base_hz: float) -> FourierTrajectory:
    """
    Return ``q_j(t) = centre_j + amplitude_j cos(2 pi harmonic_j base_hz t)``.

    It starts at rest at ``centre + amplitude``; the whole run repeats every ``1 / base_hz``.

    :param centre: ``(4,)`` rad.
    :param amplitude: ``(4,)`` rad.
    :param harmonic: ``(4,)`` whole multiples (>= 1) of ``base_hz``.
    :param base_hz: base frequency, Hz.
    :return: the trajectory (its ``evaluate`` is a tracking reference).
    """
    info = robots.get(ROBOT)
    K = max(int(k) for k in harmonic)
    a = [[0.0] * K for _ in centre]
    b = [[0.0] * K for _ in centre]
    for j, (A, k) in enumerate(zip(amplitude, harmonic)):
        # fourier_states: q = q0 - b / (w k) cos(w k t)
        b[j][int(k) - 1] = -float(A) * 2.0 * math.pi * base_hz * int(k)
    return FourierTrajectory(tuple(info.joint_names), tuple(float(c) for c in centre),
                             tuple(map(tuple, a)), tuple(map(tuple, b)), base_hz)


def _start(reference: FourierTrajectory) -> np.ndarray:
    q, _, _ = reference.evaluate(torch.zeros(1, dtype=torch.float64))
    return q[0].numpy()


def arm_reference(seed: int, seconds: float = 60.0) -> FourierTrajectory:
    """
    Return the arm's high-acceleration sinusoid: one cosine per joint about the arm posture.

    Frequencies 0.3-0.7 Hz (whole multiples of ``1 / seconds``), amplitudes up to 0.9 rad,
    both drawn from ``seed``, then scaled down (by 10 % steps) until the catalogue model's
    torques stay within 55 % of the command limits (a true arm 30 % heavier still fits),
    the speeds below :data:`SPEED_LIMIT` and the positions 0.1 rad inside the joint limits
    (checked at 100 Hz over the period: the cosines are smooth).

    :param seed: seed of the draw.
    :param seconds: the run's duration (the base period), s.
    :return: the reference.
    """
    rng = np.random.default_rng([int(seed), 1818])
    base_hz = 1.0 / float(seconds)
    harmonic = np.maximum(1, np.round(rng.uniform(0.3, 0.7, 4) / base_hz)).astype(int)
    amplitude = rng.uniform(0.5, 0.9, 4)
    model = nominal_model(ROBOT)
    info = robots.get(ROBOT)
    limits = JointLimits(tuple(model.lower.tolist()), tuple(model.upper.tolist()),
                         (SPEED_LIMIT,) * 4, tuple(info.command_limit)).tightened(0.1, 1.0, 0.55)
    for _ in range(50):
        reference = cosine_reference(ARM_POSTURE, amplitude, harmonic, base_hz)
        if limit_check(model, limits, reference, 100.0)['satisfied']:
            return reference
        amplitude = 0.9 * amplitude
    raise ValueError('no feasible arm sinusoid about the identification posture')


def string_references(seed: int, string_length: float = NOMINAL_STRING_LENGTH,
                      runs: int = 6, seconds: float = 30.0) -> List[FourierTrajectory]:
    """
    Return slow cosine trajectories that swing the ball without touching the cup.

    Each run moves the base yaw and the shoulder pitch about :data:`IDENTIFICATION_POSTURE`,
    each at a frequency ratio ``r`` in 0.55-0.85 of the pendulum's ``sqrt(g / l) / (2 pi)``
    (drawn from ``seed``), with the cup displacement ``X = theta l (1 - r^2) / r^2`` that
    forces a steady swing of ``theta`` = 4-10 degrees (the start's free swing adds about as
    much); the other joints hold.

    :param seed: seed of the draw.
    :param string_length: the string length the design assumes, m.
    :param runs: number of runs.
    :param seconds: each run's duration (the base period), s.
    :return: the references.
    """
    rng = np.random.default_rng([int(seed), 1819])
    base_hz = 1.0 / float(seconds)
    natural_hz = math.sqrt(9.81 / string_length) / (2.0 * math.pi)
    out = []
    for _ in range(runs):
        ratio = rng.uniform(0.55, 0.85, 2)
        harmonic = np.maximum(1, np.round(ratio * natural_hz / base_hz)).astype(int)
        ratio = harmonic * base_hz / natural_hz
        swing = np.radians(rng.uniform(4.0, 10.0, 2))
        displacement = swing * string_length * (1.0 - ratio ** 2) / ratio ** 2
        amplitude = np.array([*(displacement / _LEVER), 0.0, 0.0])
        out.append(cosine_reference(IDENTIFICATION_POSTURE, amplitude,
                                    [*harmonic, 1, 1], base_hz))
    return out


def identification_recordings(truth: CupTruth, seed: int = 0,
                              controller_factory: Optional[Callable[[ReferenceFn],
                                                                    Controller]] = None,
                              arm_seconds: float = 60.0, string_runs: int = 6,
                              string_seconds: float = 30.0, noise: Optional[CupNoise] = None
                              ) -> Tuple[List[CupRecording], List[CupRecording]]:
    """
    Record the paper's identification data on a plant: no swing-up anywhere.

    * Arm (:func:`arm_reference`): the ball taken off, a high-acceleration cosine of all
      four joints about :data:`IDENTIFICATION_POSTURE`.
    * String (:func:`string_references`): slow cosines of the base and shoulder joints,
      each its own run from rest with the ball hanging, that make the ball oscillate
      without touching the cup.

    By default one minute of arm data and three of string data: the paper's four minutes.

    :param truth: the hidden plant.
    :param seed: seed of the trajectories' parameters.
    :param controller_factory: ``reference -> controller(t, q, qd)``; default
        :func:`tracking_controller` on the catalogue arm (what a user has before any fit).
    :param arm_seconds: duration of the arm's run, s.
    :param string_runs: number of string runs.
    :param string_seconds: duration of each string run, s.
    :param noise: sensor noise of the recordings (None: noiseless).
    :return: ``(arm_recordings, string_recordings)``; the arm's have ``ball=None``.
    """
    if controller_factory is None:
        catalogue = nominal_model(ROBOT)

        def controller_factory(reference: ReferenceFn) -> Controller:
            return tracking_controller(catalogue, reference)
    reference = arm_reference(seed, arm_seconds)
    arm = [CupPlant(truth, ball=False).run(controller_factory(reference.evaluate),
                                           _start(reference), arm_seconds, noise, seed)]
    plant = CupPlant(truth)
    strings = []
    references = string_references(seed, truth.string_length, string_runs, string_seconds)
    for k, reference in enumerate(references):
        strings.append(plant.run(controller_factory(reference.evaluate), _start(reference),
                                 string_seconds, noise, seed * 1000 + k + 1))
    return arm, strings
