"""Load URDF documents into :class:`RobotModel` (fixed joints merged, validated once here)."""

import math
import os
import stat
from typing import Optional, Union
import warnings
import xml.etree.ElementTree as ET

import torch

from .errors import UnsupportedJointError, URDFError
from .model import (build_tree, CONTINUOUS, FLOATING, PRISMATIC, REVOLUTE, RobotModel,
                    ROOT_JOINT)
from .parameterization import inertial_from_mass_com_inertia
from .spatial import homogeneous, rpy_to_matrix, transform_inertial

_MOVABLE = (REVOLUTE, CONTINUOUS, PRISMATIC)
_UNSUPPORTED = ('planar',)


#: Largest URDF file :func:`load_urdf` reads, bytes (the Panda's is 20 kB).
MAX_URDF_BYTES = 16 * 2 ** 20


def load_urdf(path: Optional[Union[str, os.PathLike]] = None,
              dtype: torch.dtype = torch.float64, device: Optional[torch.device] = None,
              gravity: tuple = (0.0, 0.0, -9.81), *, xml: Optional[str] = None,
              floating_base: bool = False) -> RobotModel:
    """
    Parse a URDF file, or URDF XML text, into a :class:`RobotModel`.

    Revolute, continuous and prismatic joints become degrees of freedom; fixed joints are
    merged into their parent body (inertia included).  The root link is fixed to the world,
    unless ``floating_base`` is set or the URDF's root joint is ``type="floating"`` (from a
    parentless dummy link to the real root link): then joint 0 is the free-flyer
    ``'root_joint'`` (6 DOF, Pinocchio's ``JointModelFreeFlyer``) and body 0 the root link.
    The dummy link of a URDF floating joint stays fixed to the world (its inertia, if any,
    is ignored, as in Pinocchio).  A one-link URDF with ``floating_base=True`` is a single
    free rigid body.

    The file and the text come through separate arguments, so that text received from
    elsewhere (a topic, a parameter) is never taken for a path: ``load_urdf(path)`` reads a
    regular file of at most :data:`MAX_URDF_BYTES` (a FIFO, a device or a directory is
    refused without blocking), ``load_urdf(xml=text)`` parses text.  A ``str`` path that
    holds XML is refused with a message saying to pass it as ``xml``.

    :param path: path of a ``.urdf`` file.
    :param dtype: floating dtype of the model tensors.
    :param device: device of the model tensors.
    :param gravity: gravity vector in the world frame, m/s^2.
    :param xml: the URDF document itself (instead of ``path``).
    :param floating_base: mount the root link on a free-flyer joint.
    :return: the model.
    :raises URDFError: neither or both sources given, an unreadable or oversized file,
        malformed document or infeasible inertial data (message names the offending link or
        joint).
    :raises UnsupportedJointError: planar/unknown joint types, ``<mimic>``, or a floating
        joint anywhere but at the root (the message names the joint).
    """
    if (path is None) == (xml is None):
        raise URDFError('load_urdf needs exactly one of path (a file) and xml (the text)')
    if xml is not None:
        if not isinstance(xml, str):
            raise URDFError(f'xml must be the URDF text as str, got {type(xml).__name__}')
        text = xml
    else:
        text = _read_file(path)
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise URDFError(f'URDF is not well-formed XML: {exc}') from None
    if root.tag != 'robot':
        raise URDFError(f'URDF root element must be <robot>, got <{root.tag}>')
    links = _parse_links(root)
    joints = _parse_joints(root, links)
    model = _assemble(root.get('name', 'robot'), links, joints, text, gravity, floating_base)
    _check_mass_matrix(model)
    return model.to(dtype=dtype, device=device)


def _read_file(path) -> str:
    """Read a regular file of at most ``MAX_URDF_BYTES`` without blocking on special files."""
    if not isinstance(path, (str, os.PathLike)):
        raise URDFError(f'path must be a str or os.PathLike, got {type(path).__name__}')
    if isinstance(path, str) and path.lstrip().startswith('<'):
        raise URDFError('path holds XML text, not a file name: pass the text as '
                        'load_urdf(xml=...)')
    name = os.fspath(path)
    try:
        # O_NONBLOCK: opening a FIFO for reading must not wait for a writer
        fd = os.open(name, os.O_RDONLY | getattr(os, 'O_NONBLOCK', 0))
    except OSError as exc:
        raise URDFError(f'cannot read URDF file {name!r}: {exc.strerror}') from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise URDFError(f'cannot read URDF file {name!r}: not a regular file')
        data = os.read(fd, MAX_URDF_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_URDF_BYTES:
        raise URDFError(f'URDF file {name!r} is larger than {MAX_URDF_BYTES} bytes')
    try:
        return data.decode('utf-8')
    except UnicodeDecodeError as exc:
        raise URDFError(f'URDF file {name!r} is not UTF-8 text: {exc}') from None


def _floats(element, attribute: str, default: str, count: int, where: str) -> list:
    raw = default if element is None else element.get(attribute, default)
    try:
        values = [float(v) for v in raw.split()]
    except ValueError:
        raise URDFError(f'{where}: attribute {attribute}={raw!r} is not numeric') from None
    if len(values) != count or not all(math.isfinite(v) for v in values):
        raise URDFError(f'{where}: attribute {attribute}={raw!r} must be {count} finite numbers')
    return values


def _parse_origin(element, where: str) -> torch.Tensor:
    origin = None if element is None else element.find('origin')
    xyz = _floats(origin, 'xyz', '0 0 0', 3, where + ' <origin>')
    rpy = _floats(origin, 'rpy', '0 0 0', 3, where + ' <origin>')
    return torch.tensor(xyz, dtype=torch.float64), torch.tensor(rpy, dtype=torch.float64)


def _parse_links(root) -> dict:
    links = {}
    for element in root.findall('link'):
        name = element.get('name')
        if not name:
            raise URDFError('a <link> has no name attribute')
        if name in links:
            raise URDFError(f'link {name!r} is defined twice')
        links[name] = _parse_inertial(element.find('inertial'), f'link {name!r}')
    if not links:
        raise URDFError('URDF defines no <link>')
    return links


def _parse_inertial(inertial, where: str) -> torch.Tensor:
    """Return pi (10,) about the link origin in link axes; zeros for a massless link."""
    if inertial is None:
        return torch.zeros(10, dtype=torch.float64)
    mass_element = inertial.find('mass')
    if mass_element is None:
        raise URDFError(f'{where}: <inertial> has no <mass>')
    (mass,) = _floats(mass_element, 'value', '', 1, where + ' <mass>')
    if mass <= 0.0:
        raise URDFError(f'{where}: mass must be positive, got {mass} kg')
    inertia_element = inertial.find('inertia')
    if inertia_element is None:
        raise URDFError(f'{where}: <inertial> has no <inertia>')
    ixx, ixy, ixz, iyy, iyz, izz = (
        _floats(inertia_element, key, '0', 1, where + ' <inertia>')[0]
        for key in ('ixx', 'ixy', 'ixz', 'iyy', 'iyz', 'izz'))
    I_frame = torch.tensor([[ixx, ixy, ixz], [ixy, iyy, iyz], [ixz, iyz, izz]],
                           dtype=torch.float64)
    moments = torch.linalg.eigvalsh(I_frame)
    scale = max(float(moments.abs().max()), 1e-12)
    if float(moments.min()) < -1e-9 * scale:
        raise URDFError(f'{where}: inertia tensor is not positive semi-definite '
                        f'(principal moments {moments.tolist()})')
    lo, mid, hi = moments.tolist()
    if lo + mid < hi - 1e-6 * scale:
        warnings.warn(f'{where}: principal moments {moments.tolist()} violate the triangle '
                      'inequality; the body is not physically realizable', stacklevel=4)
    xyz, rpy = _parse_origin(inertial, where + ' <inertial>')
    R = rpy_to_matrix(rpy)
    return inertial_from_mass_com_inertia(torch.tensor(mass, dtype=torch.float64), xyz,
                                          R @ I_frame @ R.T)


def _parse_joints(root, links: dict) -> list:
    joints = []
    children = set()
    for element in root.findall('joint'):
        name = element.get('name')
        if not name:
            raise URDFError('a <joint> has no name attribute')
        where = f'joint {name!r}'
        jtype = element.get('type')
        if jtype in _UNSUPPORTED:
            raise UnsupportedJointError(
                f'{where}: joint type {jtype!r} is not supported (trees with revolute, '
                'continuous, prismatic and fixed joints, and a floating joint at the root only)')
        if jtype not in _MOVABLE + ('fixed', FLOATING):
            raise UnsupportedJointError(f'{where}: unknown joint type {jtype!r}; valid types: '
                                        'revolute, continuous, prismatic, fixed, floating')
        if element.find('mimic') is not None:
            raise UnsupportedJointError(f'{where}: <mimic> joints are not supported')
        parent = _link_ref(element, 'parent', where, links)
        child = _link_ref(element, 'child', where, links)
        if child in children:
            raise URDFError(f'{where}: link {child!r} has more than one parent joint')
        children.add(child)
        xyz, rpy = _parse_origin(element, where)
        axis = torch.tensor(_floats(element.find('axis'), 'xyz', '1 0 0', 3, where + ' <axis>'),
                            dtype=torch.float64)
        norm = float(axis.norm())
        if jtype in _MOVABLE and norm < 1e-12:
            raise URDFError(f'{where}: joint axis must be non-zero')
        limit = element.find('limit')
        dynamics = element.find('dynamics')
        inf = float('inf')
        bounded = jtype in (REVOLUTE, PRISMATIC) and limit is not None
        joints.append({
            'name': name, 'type': jtype, 'parent': parent, 'child': child, 'xyz': xyz, 'rpy': rpy,
            'axis': axis / max(norm, 1e-12),
            'lower': _floats(limit, 'lower', '0', 1, where + ' <limit>')[0] if bounded else -inf,
            'upper': _floats(limit, 'upper', '0', 1, where + ' <limit>')[0] if bounded else inf,
            'effort': _floats(limit, 'effort', 'inf', 1, where + ' <limit>')[0]
            if limit is not None else inf,
            'velocity': _floats(limit, 'velocity', 'inf', 1, where + ' <limit>')[0]
            if limit is not None else inf,
            'damping': _floats(dynamics, 'damping', '0', 1, where + ' <dynamics>')[0],
            'friction': _floats(dynamics, 'friction', '0', 1, where + ' <dynamics>')[0]})
    names = [j['name'] for j in joints]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise URDFError(f'joint name(s) defined more than once: {duplicates}')
    return joints


def _link_ref(element, tag: str, where: str, links: dict) -> str:
    ref = element.find(tag)
    name = None if ref is None else ref.get('link')
    if not name:
        raise URDFError(f'{where}: missing <{tag} link="..."/>')
    if name not in links:
        raise URDFError(f'{where}: {tag} link {name!r} is not defined')
    return name


def _root_joint(root: str, joints: list, floating_base: bool) -> Optional[dict]:
    """
    Return the free-flyer joint of a floating-base tree, or ``None`` for a fixed base.

    A URDF floating joint must leave the root link; it becomes ``'root_joint'`` with its
    ``<origin>`` as placement.  ``floating_base`` without one mounts ``root`` on a free-flyer
    at the world origin.
    """
    floating = [j for j in joints if j['type'] == FLOATING]
    for joint in floating:
        if joint['parent'] != root:
            raise UnsupportedJointError(
                f'joint {joint["name"]!r}: a floating joint is supported only at the root '
                f'(from the parentless link {root!r}); it leaves link {joint["parent"]!r}')
    if floating:
        others = [j['name'] for j in joints if j['parent'] == root and j['type'] != 'fixed'
                  and j is not floating[0]]
        if len(floating) > 1 or others:
            raise UnsupportedJointError(
                f'joint {(floating[1:] and floating[1]["name"]) or others[0]!r}: the root link '
                f'{root!r} of a floating-base URDF may carry only its floating joint '
                f'{floating[0]["name"]!r} and fixed joints')
        return dict(floating[0], name=ROOT_JOINT)
    if not floating_base:
        return None
    zero = torch.zeros(3, dtype=torch.float64)
    return {'name': ROOT_JOINT, 'type': FLOATING, 'parent': None, 'child': root, 'xyz': zero,
            'rpy': zero}


def _assemble(robot_name: str, links: dict, joints: list, text: str, gravity,
              floating_base: bool = False) -> RobotModel:
    child_links = {j['child'] for j in joints}
    roots = [name for name in links if name not in child_links]
    if len(roots) != 1:
        raise URDFError(f'URDF must have exactly one root link, found {roots or "none (cycle)"}')
    by_parent = {}
    for joint in joints:
        by_parent.setdefault(joint['parent'], []).append(joint)

    eye = torch.eye(4, dtype=torch.float64)
    link_order, link_body, link_offset = [roots[0]], {roots[0]: -1}, {roots[0]: eye}
    movable, stack = [], list(reversed(by_parent.get(roots[0], [])))
    root_joint = _root_joint(roots[0], joints, floating_base)
    if root_joint is not None and root_joint['parent'] is None:
        # floating_base=True: the root link itself is body 0 of the free-flyer.
        link_body[roots[0]] = 0
        movable.append(dict(root_joint, parent_body=-1, T_body_parentlink=eye))
    while stack:  # depth-first pre-order: parents always precede children
        joint = stack.pop()
        parent, child = joint['parent'], joint['child']
        T_origin = homogeneous(rpy_to_matrix(joint['rpy']), joint['xyz'])
        if joint['type'] == FLOATING:
            joint = dict(joint, name=ROOT_JOINT)
        if joint['type'] == 'fixed':
            link_body[child] = link_body[parent]
            link_offset[child] = link_offset[parent] @ T_origin
        else:
            joint['parent_body'] = link_body[parent]
            joint['T_body_parentlink'] = link_offset[parent]
            link_body[child] = len(movable)
            link_offset[child] = eye
            movable.append(joint)
        link_order.append(child)
        stack.extend(reversed(by_parent.get(child, [])))
    if len(link_order) != len(links):
        unreachable = sorted(set(links) - set(link_order))
        raise URDFError(f'links not connected to the root {roots[0]!r}: {unreachable}')
    if not movable:
        raise URDFError('URDF has no movable (revolute, continuous, prismatic) joint')

    n = len(movable)
    floating = root_joint is not None
    inertial = torch.zeros(n, 10, dtype=torch.float64)
    for link in link_order:
        body = link_body[link]
        if body >= 0:
            inertial[body] += transform_inertial(links[link], link_offset[link])
    zero3 = torch.zeros(3, dtype=torch.float64)
    tree = build_tree(
        joint_names=[j['name'] for j in movable], joint_types=[j['type'] for j in movable],
        parents=[j['parent_body'] for j in movable], body_links=[j['child'] for j in movable],
        link_names=link_order, link_bodies=[link_body[name] for name in link_order],
        axis=torch.stack([zero3 if j['type'] == FLOATING else j['axis'] for j in movable]),
        T_body_parentlink=torch.stack([j['T_body_parentlink'] for j in movable]),
        T_body_link=torch.stack([link_offset[name] for name in link_order]),
        floating=floating)
    # Per-DOF columns: the free-flyer's six entries first (no damping, friction or limits).
    inf = float('inf')
    root = {'damping': 0.0, 'friction': 0.0, 'lower': -inf, 'upper': inf, 'velocity': inf,
            'effort': inf}

    def column(key, root_size=6):
        values = [j[key] for j in movable[1:]] if floating else [j[key] for j in movable]
        return torch.tensor([root[key]] * root_size * floating + values, dtype=torch.float64)

    return RobotModel(
        name=robot_name, tree=tree, origin_xyz=torch.stack([j['xyz'] for j in movable]),
        origin_rpy=torch.stack([j['rpy'] for j in movable]), inertial=inertial,
        damping=column('damping'), friction=column('friction'),
        armature=torch.zeros(tree.nv, dtype=torch.float64),
        gravity=torch.tensor(gravity, dtype=torch.float64), lower=column('lower', 7),
        upper=column('upper', 7), velocity_limit=column('velocity'),
        effort_limit=column('effort'), urdf=text)


def _check_mass_matrix(model: RobotModel) -> None:
    """Reject trees where some joint moves no inertia (singular mass matrix)."""
    from .crba import crba
    q = torch.zeros(model.nq, dtype=model.dtype)
    if model.floating_base:
        q[6] = 1.0  # identity quaternion (x, y, z, w)
    M = crba(model, q)
    diagonal = torch.diagonal(M)
    offset = 5 if model.floating_base else 0
    for i, value in enumerate(diagonal.tolist()):
        if value <= 1e-12:
            name = model.joint_names[max(i - offset, 0)]
            raise URDFError(f'joint {name!r} moves no mass or inertia (its '
                            'subtree is massless along the joint axis): mass matrix is singular')
    if torch.linalg.cholesky_ex(M).info != 0:
        raise URDFError('mass matrix is singular at q = 0; check for massless bodies')
