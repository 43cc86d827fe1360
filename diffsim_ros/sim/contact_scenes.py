"""
MuJoCo scenes of free rigid bodies on a ground plane, the reference for the contact core.

One free body (boxes, spheres, capsules or the convex hull of given vertices) with the mass,
centre of mass and inertia of a one-link floating :class:`~diffsim_ros.core.RobotModel`,
above a plane with a given height
and normal, and the same Coulomb friction coefficient.  MuJoCo's contacts are soft: the
scene sets a stiff, critically damped ``solref`` and a ``solimp`` close to 1, so that its
steady penetration is far below the millimetre tolerances the comparisons use, and an
elliptic friction cone with ``impratio = 1`` (the physical cone).  States cross between the
engines with :func:`~diffsim_ros.core.to_mujoco` / :func:`~diffsim_ros.core.from_mujoco`.
"""

from dataclasses import dataclass
from typing import Sequence, Tuple

import mujoco
import numpy as np
import torch

from .builder import principal_inertia
from ..core import mass_com_inertia, RobotModel
from ..core.configuration import from_mujoco, to_mujoco

__all__ = ['FreeBodyScene', 'GeomSpec', 'free_body_scene']

Tensor = torch.Tensor

#: Contact time constant [s] and damping ratio of the scenes (MuJoCo ``solref``).
SOLREF = (0.002, 1.0)
#: MuJoCo ``solimp``: impedance close to 1 at any depth (a nearly hard contact).
SOLIMP = (0.99, 0.999, 1e-4)


@dataclass(frozen=True)
class GeomSpec:
    """
    One collision geometry of the free body, in its body frame.

    :param kind: ``'box'`` (``size`` = half extents), ``'sphere'`` (``size`` = (radius,)),
        ``'capsule'`` (``size`` = (radius, half length), axis along body z) or ``'hull'``
        (``size`` = the vertices ``x0 y0 z0 x1 ...``: a MuJoCo mesh, collided as their
        convex hull).
    :param size: MuJoCo geom size, m (a hull's vertices, m).
    :param pos: centre in the body frame, m.
    """

    kind: str
    size: Tuple[float, ...]
    pos: Tuple[float, float, float] = (0.0, 0.0, 0.0)

    def xml(self, mu: float, name: str = 'hull') -> str:
        """
        Return the MJCF ``<geom>`` element.

        :param mu: sliding friction coefficient.
        :param name: the mesh asset of a ``'hull'`` (:meth:`asset`).
        :return: XML text.
        """
        if self.kind not in ('box', 'sphere', 'capsule', 'hull'):
            raise ValueError(f'unknown geom kind {self.kind!r}; valid: box, sphere, capsule, '
                             'hull')
        shape = (f'type="mesh" mesh="{name}"' if self.kind == 'hull'
                 else f'type="{self.kind}" size="{_fmt(self.size)}"')
        return (f'<geom {shape} pos="{_fmt(self.pos)}" '
                f'friction="{mu!r} 0 0" condim="3" solref="{_fmt(SOLREF)}" '
                f'solimp="{_fmt(SOLIMP)}"/>')

    def asset(self, name: str = 'hull') -> str:
        """
        Return the MJCF ``<mesh>`` asset of a ``'hull'`` (empty for other kinds).

        :param name: the asset's name.
        :return: XML text.
        """
        if self.kind != 'hull':
            return ''
        if len(self.size) % 3 or len(self.size) < 12:
            raise ValueError(f'a hull needs four vertices or more as x y z triples, got '
                             f'{len(self.size)} numbers')
        return f'<mesh name="{name}" vertex="{_fmt(self.size)}"/>'


def _fmt(values: Sequence[float]) -> str:
    return ' '.join(repr(float(v)) for v in values)


class FreeBodyScene:
    """
    A MuJoCo model and data of one free body over a plane, stepped from our ``(q, v)``.

    :param xml: the MJCF text (see :func:`free_body_scene`).
    :param model: the one-link floating model the scene was built from.
    """

    def __init__(self, xml: str, model: RobotModel):
        self.xml = xml
        self.model = model
        self.mj_model = mujoco.MjModel.from_xml_string(xml)
        self.mj_data = mujoco.MjData(self.mj_model)

    @property
    def timestep(self) -> float:
        """Return MuJoCo's step in s."""
        return float(self.mj_model.opt.timestep)

    def set_state(self, q: Tensor, v: Tensor) -> None:
        """
        Put the body in our configuration ``q`` (7,) with velocity ``v`` (6,).

        :param q: ``[p_world, quaternion xyzw]``.
        :param v: ``[linear velocity in body axes, angular velocity in body axes]``.
        """
        qpos, qvel = to_mujoco(self.model, q.detach().double(), v.detach().double())
        mujoco.mj_resetData(self.mj_model, self.mj_data)
        self.mj_data.qpos[:] = qpos.numpy()
        self.mj_data.qvel[:] = qvel.numpy()
        mujoco.mj_forward(self.mj_model, self.mj_data)

    def state(self) -> Tuple[Tensor, Tensor]:
        """
        Return the current ``(q, v)`` in our layout, float64.

        :return: ``(q (7,), v (6,))``.
        """
        return from_mujoco(self.model, torch.tensor(self.mj_data.qpos.copy()),
                           torch.tensor(self.mj_data.qvel.copy()))

    def normal_force(self) -> float:
        """
        Return the summed normal force of the active contacts, N.

        :return: the sum over contacts of the first (normal) component of ``mj_contactForce``.
        """
        total, wrench = 0.0, np.zeros(6)
        for i in range(self.mj_data.ncon):
            mujoco.mj_contactForce(self.mj_model, self.mj_data, i, wrench)
            total += wrench[0]
        return total

    def simulate(self, duration: float) -> Tuple[Tensor, Tensor]:
        """
        Step for ``duration`` seconds and return the final ``(q, v)``.

        :param duration: s (rounded to whole steps).
        :return: ``(q (7,), v (6,))``.
        """
        for _ in range(int(round(duration / self.timestep))):
            mujoco.mj_step(self.mj_model, self.mj_data)
        return self.state()


def free_body_scene(model: RobotModel, geoms: Sequence[GeomSpec], mu: float,
                    timestep: float = 1e-4, ground_height: float = 0.0,
                    ground_tilt: float = 0.0) -> FreeBodyScene:
    """
    Build the MuJoCo scene of a one-link floating model with the given collision geometry.

    :param model: floating model with one body (``model.njoints == 1``), parameters unbatched.
    :param geoms: its collision geometry in the body frame.
    :param mu: Coulomb friction coefficient of body and ground (MuJoCo takes the maximum of
        the two, so both get ``mu``).
    :param timestep: MuJoCo's step in s (semi-implicit Euler).
    :param ground_height: height of the plane along world z at the origin, m.
    :param ground_tilt: rotation of the plane about world y, rad (a slope rising along -x).
    :return: the scene.
    :raises ValueError: for a fixed-base or multi-body model.
    """
    if not getattr(model, 'floating_base', False) or model.njoints != 1:
        raise ValueError('free_body_scene needs a one-link floating model '
                         '(load_urdf(..., floating_base=True) of a single link)')
    mass, com, inertia = (t.detach().double().numpy()
                          for t in mass_com_inertia(model.inertial))
    moments, quat = principal_inertia(inertia[0])
    gravity = model.gravity.detach().double().numpy()
    body = ''.join(g.xml(mu, f'hull{i}') for i, g in enumerate(geoms))
    assets = ''.join(g.asset(f'hull{i}') for i, g in enumerate(geoms))
    xml = (f'<mujoco><asset>{assets}</asset>'
           f'<option timestep="{timestep!r}" integrator="Euler" cone="elliptic" '
           f'impratio="1" gravity="{_fmt(gravity)}"/><worldbody>'
           f'<geom type="plane" size="10 10 0.1" pos="0 0 {ground_height!r}" '
           f'euler="0 {ground_tilt!r} 0" friction="{mu!r} 0 0" condim="3" '
           f'solref="{_fmt(SOLREF)}" solimp="{_fmt(SOLIMP)}"/>'
           f'<body name="body"><freejoint/><inertial pos="{_fmt(com[0])}" '
           f'quat="{_fmt(quat)}" mass="{float(mass[0])!r}" diaginertia="{_fmt(moments)}"/>'
           f'{body}</body></worldbody></mujoco>')
    return FreeBodyScene(xml, model)
