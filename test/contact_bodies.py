"""
Free rigid bodies for the contact tests: one-link URDFs loaded with ``floating_base=True``.

``q = [position (3), quaternion (x, y, z, w)]``, ``v = [linear, angular velocity in body
axes]`` (Pinocchio's free-flyer). ``two_link`` adds a revolute arm, for body-body pairs.
"""

from diffsim_ros.core import ContactModel, load_urdf
from diffsim_ros.core.contact import box_vertices
import torch

GRAVITY = 9.81


def _inertial(mass: float, inertia: tuple) -> str:
    ixx, iyy, izz = inertia
    return (f'<inertial><mass value="{mass!r}"/><origin xyz="0 0 0"/><inertia ixx="{ixx!r}" '
            f'iyy="{iyy!r}" izz="{izz!r}" ixy="0" ixz="0" iyz="0"/></inertial>')


def free_body(mass: float, inertia: tuple):
    """
    Return a single free rigid body.

    :param mass: body mass [kg].
    :param inertia: principal inertia ``(ixx, iyy, izz)`` about the CoM [kg m^2].
    :return: the floating model; its link is ``'body'``.
    """
    xml = f'<robot name="free_body"><link name="body">{_inertial(mass, inertia)}</link></robot>'
    return load_urdf(xml=xml, dtype=torch.float64, floating_base=True)


def two_link():
    """
    Return a free body with an arm on a revolute joint (nq = 8, nv = 7).

    :return: the floating model; links ``'body'`` and ``'arm'``.
    """
    xml = ('<robot name="two_link">'
           f'<link name="body">{_inertial(1.0, (0.01, 0.02, 0.015))}</link>'
           f'<link name="arm">{_inertial(0.3, (0.002, 0.003, 0.001))}</link>'
           '<joint name="hinge" type="revolute"><parent link="body"/><child link="arm"/>'
           '<origin xyz="0.1 0.05 0.2" rpy="0.2 -0.1 0.3"/><axis xyz="0 0 1"/>'
           '<limit lower="-3" upper="3" effort="10" velocity="10"/></joint></robot>')
    return load_urdf(xml=xml, dtype=torch.float64, floating_base=True)


def cube(side: float = 0.1048, mass: float = 0.37, mu: float = 0.18, **kwargs):
    """
    Return a cube with vertex contact, and its contact model.

    :param side: edge length [m] (default: the ContactNets cube).
    :param mass: mass [kg].
    :param mu: friction coefficient.
    :param kwargs: further :meth:`ContactModel.create` arguments.
    :return: ``(model, contact)``.
    """
    model = free_body(mass, (mass * side ** 2 / 6.0,) * 3)
    contact = ContactModel.create(friction=mu, vertex_links=('body',),
                                  vertices=(box_vertices((side,) * 3),), **kwargs)
    return model, contact


def sphere(radius: float = 0.05, mass: float = 0.2, mu: float = 0.5, **kwargs):
    """
    Return a solid sphere and its contact model.

    :param radius: radius [m].
    :param mass: mass [kg].
    :param mu: friction coefficient.
    :param kwargs: further :meth:`ContactModel.create` arguments.
    :return: ``(model, contact)``.
    """
    model = free_body(mass, (0.4 * mass * radius ** 2,) * 3)
    contact = ContactModel.create(friction=mu, sphere_links=('body',),
                                  sphere_centers=[[0.0, 0.0, 0.0]], sphere_radii=[radius],
                                  **kwargs)
    return model, contact
