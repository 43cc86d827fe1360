"""
Object specs (what contact learning starts from) read from a URDF's collision boxes.

A tossed object described by a URDF (a floating tree, ``load_urdf(..., floating_base=True)``)
becomes an :class:`~diffsim_ros.sysid.contact_learning.ObjectSpec`: its model, one vertex set
per body (the eight corners of the body's ``<collision>`` box, in the body's frame), the
masses of its ``<inertial>`` elements and a nominal friction. :func:`elbow_spec` is the DAIR
elbow's (two boxes on a hinge); the cube's is
:func:`~diffsim_ros.sysid.contact_learning.cube_spec`.
"""

from typing import Dict, Tuple
import xml.etree.ElementTree as ET

import torch

from ..core import load_urdf
from ..core.contact import box_vertices, ContactModel
from ..core.spatial import rpy_to_matrix
from ..sysid.contact_learning import ObjectSpec

__all__ = ['collision_boxes', 'urdf_object_spec', 'elbow_spec', 'ELBOW_LENGTH_M']

#: Characteristic length [m] of the elbow's inertia error: the paper's 3.5 cm (appendix B.2).
ELBOW_LENGTH_M = 0.035


def _numbers(text: str, count: int, what: str):
    values = [float(x) for x in text.split()]
    if len(values) != count:
        raise ValueError(f'URDF: {what} needs {count} numbers, found {text!r}')
    return values


def collision_boxes(xml: str) -> Dict[str, Tuple[Tuple[float, ...], Tuple[float, ...],
                                                 Tuple[float, ...]]]:
    """
    Return the collision box of every link that has one.

    :param xml: the URDF text.
    :return: link name -> ``(size (3,) [m], origin xyz (3,) [m], origin rpy (3,) [rad])`` in
        the link's frame.
    :raises ValueError: a link with a non-box collision or more than one collision element
        (a vertex set per body is what contact learning takes).
    """
    boxes = {}
    for link in ET.fromstring(xml).iter('link'):
        name = link.get('name')
        collisions = link.findall('collision')
        if not collisions:
            continue
        if len(collisions) > 1:
            raise ValueError(f'URDF link {name!r}: {len(collisions)} collision elements; one '
                             'box per link is supported')
        box = collisions[0].find('geometry/box')
        if box is None:
            raise ValueError(f'URDF link {name!r}: its collision is not a box')
        origin = collisions[0].find('origin')
        xyz = origin.get('xyz', '0 0 0') if origin is not None else '0 0 0'
        rpy = origin.get('rpy', '0 0 0') if origin is not None else '0 0 0'
        boxes[name] = (tuple(_numbers(box.get('size', ''), 3, f'{name} box size')),
                       tuple(_numbers(xyz, 3, f'{name} collision xyz')),
                       tuple(_numbers(rpy, 3, f'{name} collision rpy')))
    return boxes


def urdf_object_spec(xml: str, friction: float, name: str = '', known_geometry: bool = True,
                     length: float = ELBOW_LENGTH_M,
                     dtype: torch.dtype = torch.float64) -> ObjectSpec:
    """
    Return the spec of a floating object whose every body has one collision box.

    :param xml: the URDF text.
    :param friction: nominal Coulomb coefficient.
    :param name: the spec's name (default: the URDF's robot name).
    :param known_geometry: whether the boxes are the true shapes (reported ``volume_error``
        is against them); the inertias are never taken as truth (``true_inertial`` None).
    :param length: characteristic length [m] of the inertia error.
    :param dtype: tensor dtype.
    :return: the spec; ``half_widths`` the boxes' half sizes.
    :raises ValueError: a body without a collision box (see also :func:`collision_boxes`).
    """
    model = load_urdf(xml=xml, dtype=dtype, floating_base=True)
    boxes = collision_boxes(xml)
    bodies = tuple(model.tree.body_links)
    missing = [link for link in bodies if link not in boxes]
    if missing:
        raise ValueError(f'URDF: bodies {missing} have no collision box; contact learning '
                         'needs one per body')
    vertices = []
    for link in bodies:
        size, xyz, rpy = boxes[link]
        R = rpy_to_matrix(torch.tensor(rpy, dtype=dtype))
        vertices.append(box_vertices(size, dtype=dtype) @ R.mT + torch.tensor(xyz, dtype=dtype))
    contact = ContactModel.create(friction=friction, restitution=0.0, dtype=dtype,
                                  vertex_links=bodies, vertices=tuple(vertices))
    return ObjectSpec(name=name or ET.fromstring(xml).get('name', 'object'), model=model,
                      contact=contact, mass=float(model.inertial[:, 0].sum()),
                      half_widths=tuple(tuple(0.5 * s for s in boxes[link][0])
                                        for link in bodies),
                      true_vertices=tuple(vertices) if known_geometry else None,
                      true_inertial=None, length=length)


def elbow_spec(tosses) -> ObjectSpec:
    """
    Return the DAIR elbow's spec: its URDF's two boxes, masses and the authors' friction.

    The boxes (0.10 x 0.05 x 0.05 m, the second centred 3.5 cm past the hinge) are the true
    shapes (the paper's geometry error is against them); the URDF inertias are the authors'
    nominal values, not a measurement (SOURCE.md), so no inertia truth is given. Learning
    starts from it as the paper's appendix A.4 (0.5-1.5x, random box inertias).

    :param tosses: the elbow :class:`~diffsim_ros.io.tosses.TossSet` (its URDF and friction).
    :return: the spec, named ``'elbow'``.
    """
    return urdf_object_spec(tosses.urdf_path.read_text(encoding='utf-8'), tosses.friction,
                            name='elbow', dtype=tosses.q[0].dtype if tosses.q else torch.float64)
