"""
A MuJoCo box with hidden parameters, tossed again and again: the mocap stream of a toss rig.

:class:`HiddenBox` draws the hidden object from a seed: half width, friction and principal
inertia offsets around the nominal object's; :class:`Tosser` drops it from random states
(position, orientation, linear and angular velocity) onto the ground plane, steps MuJoCo
(:func:`~diffsim_ros.sim.contact_scenes.free_body_scene`) between samples, and after the
box has rested ``rest_time`` s leaves it untracked for ``pickup_time`` s (a hand picks it
up) before the next release.  Each sample is ``(t, q)`` with ``q = [p_world, quat (x, y, z,
w)]``; time is the simulation's own, so the stream does not depend on the machine's speed.
"""

from dataclasses import dataclass
import math
from typing import Optional, Tuple

import numpy as np
import torch

from .contact_scenes import free_body_scene, GeomSpec
from ..core import RobotModel
from ..core.contact import box_vertices
from ..core.parameterization import is_physically_consistent, mass_com_inertia
from ..core.spatial import quat_to_matrix

__all__ = ['HiddenBox', 'Tosser', 'hidden_box']


@dataclass(frozen=True)
class HiddenBox:
    """
    The true object of a simulated toss rig.

    :ivar half_width: half side length, m.
    :ivar friction: Coulomb coefficient.
    :ivar inertial: ``(10,)`` inertial vector (mass kept, inertia offset), float64.
    """

    half_width: float
    friction: float
    inertial: Tuple[float, ...]

    def vertices(self) -> torch.Tensor:
        """
        Return the eight corners in the body frame, m.

        :return: ``(8, 3)`` float64.
        """
        return box_vertices((2.0 * self.half_width,) * 3, dtype=torch.float64)


def hidden_box(model: RobotModel, seed: int, half_width: float = 0.0, friction: float = 0.0,
               size_range: Tuple[float, float] = (0.8, 1.25),
               friction_range: Tuple[float, float] = (0.1, 0.5),
               inertia_error: float = 0.1, nominal_half_width: float = 0.05) -> HiddenBox:
    """
    Draw the hidden box from a seed (explicit values win over the draw).

    The inertia is a uniform box's of the hidden size and the nominal mass, each principal
    moment scaled by ``1 + U(-inertia_error, inertia_error)``, kept physically consistent
    (redrawn otherwise).

    :param model: the nominal one-link floating model (its mass is kept).
    :param seed: seed of the draw.
    :param half_width: the hidden half width, m; 0 draws ``nominal_half_width * U(size_range)``.
    :param friction: the hidden friction; 0 draws ``U(friction_range)``.
    :param size_range: factor range of the drawn half width.
    :param friction_range: range of the drawn friction.
    :param inertia_error: relative range of the principal inertia offsets.
    :param nominal_half_width: the nominal half width, m.
    :return: the hidden box.
    """
    rng = np.random.default_rng(seed)
    drawn_size = nominal_half_width * rng.uniform(*size_range)
    drawn_friction = rng.uniform(*friction_range)
    h = half_width or drawn_size
    mass = float(mass_com_inertia(model.inertial.reshape(-1, 10))[0][0])
    for _ in range(100):
        offsets = rng.uniform(-inertia_error, inertia_error, 3)
        moments = mass * (2 * h) ** 2 / 6.0 * (1.0 + offsets)
        pi = torch.tensor([mass, 0, 0, 0, moments[0], 0, 0, moments[1], 0, moments[2]],
                          dtype=torch.float64)
        if bool(is_physically_consistent(pi)):
            break
    return HiddenBox(float(h), float(friction or drawn_friction), tuple(pi.tolist()))


class Tosser:
    """
    Toss a hidden box repeatedly and sample its pose (module docstring).

    :param model: the nominal one-link floating model (its URDF and gravity).
    :param box: the hidden box.
    :param rate_hz: pose rate, Hz.
    :param seed: seed of the release states.
    :param substeps: MuJoCo steps per sample.
    :param rest_time: rest after which the box is picked up, s.
    :param pickup_time: untracked time between rest and the next release, s.
    :param max_toss_time: a toss still moving after this long is picked up anyway, s.
    """

    def __init__(self, model: RobotModel, box: HiddenBox, rate_hz: float = 148.0,
                 seed: int = 0, substeps: int = 40, rest_time: float = 0.3,
                 pickup_time: float = 0.3, max_toss_time: float = 3.0) -> None:
        """Build the scene of the hidden box; the first toss starts at once."""
        hidden = model.replace(inertial=torch.tensor(box.inertial, dtype=torch.float64)
                               .reshape(model.inertial.shape))
        self.box, self.period = box, 1.0 / float(rate_hz)
        self.scene = free_body_scene(hidden, [GeomSpec('box', (box.half_width,) * 3)],
                                     box.friction, timestep=self.period / substeps)
        self.substeps = int(substeps)
        self.rest_time, self.pickup_time = float(rest_time), float(pickup_time)
        self.max_toss_time = float(max_toss_time)
        self.rng = np.random.default_rng(seed)
        self.tick = 0          # samples so far (tracked or not): time = tick * period
        self.tosses = 0
        self._resting = 0.0
        self._untracked_until: Optional[int] = None
        self._release_tick = 0
        self._release()

    @property
    def time(self) -> float:
        """Return the simulated time of the last sample, s."""
        return self.tick * self.period

    def _release(self) -> None:
        """Put the box in a random free-flight state above the ground."""
        rng = self.rng
        axis = rng.normal(size=3)
        angle = rng.uniform(0.0, math.pi)
        axis = axis / np.linalg.norm(axis)
        quat = np.r_[axis * math.sin(angle / 2), math.cos(angle / 2)]   # x, y, z, w
        position = np.r_[rng.uniform(-0.2, 0.2, 2),
                         rng.uniform(0.15, 0.35) + math.sqrt(3) * self.box.half_width]
        v_world = np.r_[rng.uniform(-1.0, 1.0, 2), rng.uniform(-0.5, 1.0)]
        w_body = rng.uniform(-8.0, 8.0, 3)
        q = torch.tensor(np.r_[position, quat], dtype=torch.float64)
        R = quat_to_matrix(torch.tensor(quat, dtype=torch.float64)).numpy()
        v = torch.tensor(np.r_[R.T @ v_world, w_body], dtype=torch.float64)
        self.scene.set_state(q, v)
        self._resting, self._release_tick = 0.0, self.tick
        self.tosses += 1

    def step(self) -> Optional[np.ndarray]:
        """
        Advance one sample period.

        :return: ``(7,)`` pose at the new time, or None while the box is untracked.
        """
        self.tick += 1
        if self._untracked_until is not None:
            if self.tick < self._untracked_until:
                return None
            self._untracked_until = None
            self._release()
            return self.scene.state()[0].numpy()
        q, v = self.scene.simulate(self.substeps * self.scene.timestep)
        still = float(v[:3].norm()) < 0.005 and float(v[3:].norm()) < 0.05
        self._resting = self._resting + self.period if still else 0.0
        moving_too_long = (self.tick - self._release_tick) * self.period > self.max_toss_time
        if self._resting >= self.rest_time or moving_too_long:
            self._untracked_until = self.tick + max(1, round(self.pickup_time / self.period))
        return q.numpy()
