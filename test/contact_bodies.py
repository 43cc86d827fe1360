"""
Free rigid bodies for the contact tests, built as fixed-base models the core loads today.

A body hangs from the world by three prismatic joints (x, y, z) and three revolute joints
(z, y, x) through massless links, so ``q = [position, yaw, pitch, roll]`` and ``v`` are the
rates of those coordinates. The real ``crba``, ``rnea`` and ``jacobian`` apply unchanged;
away from pitch = +-90 deg the mass matrix is positive definite.
"""

from diffsim_ros.core import ContactModel, load_urdf
from diffsim_ros.core.contact import box_vertices
import torch

GRAVITY = 9.81
AXES = {'x': '1 0 0', 'y': '0 1 0', 'z': '0 0 1'}


def free_body_urdf(mass: float, inertia: tuple) -> str:
    """
    Return the URDF of a body on a six-joint chain.

    :param mass: body mass [kg].
    :param inertia: principal inertia ``(ixx, iyy, izz)`` about the CoM [kg m^2].
    :return: URDF text; the body link is ``'body'``.
    """
    joints = [('px', 'prismatic', 'x'), ('py', 'prismatic', 'y'), ('pz', 'prismatic', 'z'),
              ('rz', 'revolute', 'z'), ('ry', 'revolute', 'y'), ('rx', 'revolute', 'x')]
    links = ['world'] + [f'l_{name}' for name, _, _ in joints[:-1]] + ['body']
    text = ['<robot name="free_body">']
    for link in links[:-1]:
        text.append(f'<link name="{link}"/>')
    ixx, iyy, izz = inertia
    text.append(f'<link name="body"><inertial><mass value="{mass!r}"/><origin xyz="0 0 0"/>'
                f'<inertia ixx="{ixx!r}" iyy="{iyy!r}" izz="{izz!r}" ixy="0" ixz="0" iyz="0"/>'
                '</inertial></link>')
    for (name, kind, axis), parent, child in zip(joints, links[:-1], links[1:]):
        text.append(f'<joint name="{name}" type="{kind}"><parent link="{parent}"/>'
                    f'<child link="{child}"/><axis xyz="{AXES[axis]}"/>'
                    '<limit lower="-1e3" upper="1e3" effort="1e3" velocity="1e3"/></joint>')
    text.append('</robot>')
    return '\n'.join(text)


def cube(side: float = 0.1048, mass: float = 0.37, mu: float = 0.18, **kwargs):
    """
    Return a cube model (vertex contact) and its contact model.

    :param side: edge length [m] (default: the ContactNets cube).
    :param mass: mass [kg].
    :param mu: friction coefficient.
    :param kwargs: further :meth:`ContactModel.create` arguments.
    :return: ``(model, contact)``.
    """
    inertia = mass * side ** 2 / 6.0
    model = load_urdf(xml=free_body_urdf(mass, (inertia,) * 3), dtype=torch.float64)
    contact = ContactModel.create(friction=mu, vertex_links=('body',),
                                  vertices=(box_vertices((side,) * 3),), **kwargs)
    return model, contact


def sphere(radius: float = 0.05, mass: float = 0.2, mu: float = 0.5, **kwargs):
    """
    Return a solid sphere model and its contact model.

    :param radius: radius [m].
    :param mass: mass [kg].
    :param mu: friction coefficient.
    :param kwargs: further :meth:`ContactModel.create` arguments.
    :return: ``(model, contact)``.
    """
    inertia = 0.4 * mass * radius ** 2
    model = load_urdf(xml=free_body_urdf(mass, (inertia,) * 3), dtype=torch.float64)
    contact = ContactModel.create(friction=mu, sphere_links=('body',),
                                  sphere_centers=[[0.0, 0.0, 0.0]], sphere_radii=[radius],
                                  **kwargs)
    return model, contact
