"""Write an identified :class:`RobotModel` back into its URDF (inertials, origins, friction)."""

from pathlib import Path
from typing import Any, Mapping, Optional, Tuple, Union
import xml.etree.ElementTree as ET

import torch
import yaml

from ..core.errors import URDFError
from ..core.model import RobotModel
from ..core.parameterization import is_physically_consistent, mass_com_inertia

#: Where the identifier's ``~/save`` writes when no ``save_directory`` is set (relative to the
#: node's working directory).
SAVE_DIRECTORY = 'diffsim_identified'


def _fmt(values) -> str:
    return ' '.join(repr(float(v)) for v in values)


def model_to_urdf(model: RobotModel, source: Optional[str] = None) -> str:
    """
    Return URDF text describing ``model``, edited from the URDF it was loaded from.

    Each body's identified inertia (fixed children included, as the core merges them) is
    written to the link of its joint and removed from the links merged into it; movable
    joints get their identified ``<origin>`` and ``<dynamics damping friction>``.  Visuals,
    collisions, limits and comments are kept.  URDF has no armature field, so armature is
    recorded in a comment next to each joint (``diffsim-fit`` also writes it to params.yaml).

    :param model: an unbatched model (``model.batch_shape == ()``).
    :param source: URDF text to edit; defaults to ``model.urdf``.
    :return: the URDF document.
    :raises URDFError: if the model is batched, has no source URDF, or a body is not
        physically consistent (it would not load back).
    """
    if model.batch_shape != torch.Size([]):
        raise URDFError(f'cannot export a batched model (batch shape '
                        f'{tuple(model.batch_shape)}); select one particle first')
    source = source if source is not None else model.urdf
    if not source:
        raise URDFError('model has no source URDF to edit; pass source=')
    pi = model.inertial.detach().to(torch.float64).cpu()
    consistent = is_physically_consistent(pi)
    if not bool(consistent.all()):
        bad = [model.tree.body_links[i] for i in range(model.n) if not bool(consistent[i])]
        raise URDFError(f'identified inertial parameters are not physically consistent for '
                        f'link(s) {bad}; use a consistent parameterization before exporting')
    root = ET.fromstring(source, parser=ET.XMLParser(target=ET.TreeBuilder(insert_comments=True)))
    links = {link.get('name'): link for link in root.findall('link')}
    body_of = dict(zip(model.tree.link_names, model.tree.link_bodies))
    mass, com, inertia = mass_com_inertia(pi)
    for name, link in links.items():
        body = body_of.get(name, -1)
        if body < 0:
            continue
        for old in link.findall('inertial'):
            link.remove(old)
        if name != model.tree.body_links[body]:
            link.insert(0, ET.Comment(f' inertia merged into {model.tree.body_links[body]} '
                                      'by diffsim_ros identification '))
            continue
        inertial = ET.Element('inertial')
        ET.SubElement(inertial, 'origin', xyz=_fmt(com[body]), rpy='0 0 0')
        ET.SubElement(inertial, 'mass', value=repr(float(mass[body])))
        I_com = inertia[body]
        ET.SubElement(inertial, 'inertia', ixx=repr(float(I_com[0, 0])),
                      ixy=repr(float(I_com[0, 1])), ixz=repr(float(I_com[0, 2])),
                      iyy=repr(float(I_com[1, 1])), iyz=repr(float(I_com[1, 2])),
                      izz=repr(float(I_com[2, 2])))
        link.insert(0, inertial)
    joints = {joint.get('name'): joint for joint in root.findall('joint')}
    xyz = model.origin_xyz.detach().double().cpu()
    rpy = model.origin_rpy.detach().double().cpu()
    for i, name in enumerate(model.joint_names):
        if name not in joints:   # the free-flyer of floating_base=True has no URDF joint
            continue
        joint = joints[name]
        origin = joint.find('origin')
        if origin is None:
            origin = ET.SubElement(joint, 'origin')
        origin.set('xyz', _fmt(xyz[i]))
        origin.set('rpy', _fmt(rpy[i]))
        dynamics = joint.find('dynamics')
        if dynamics is None:
            dynamics = ET.SubElement(joint, 'dynamics')
        # per-DOF columns: a floating base's free-flyer (joint 0) holds the first six
        dof = i + 5 if model.floating_base else i
        dynamics.set('damping', repr(float(model.damping[dof])))
        dynamics.set('friction', repr(float(model.friction[dof])))
        armature = float(model.armature[dof])
        if armature:
            joint.append(ET.Comment(f' armature (reflected rotor inertia): {armature!r} '))
    ET.indent(root)
    return ET.tostring(root, encoding='unicode') + '\n'


def write_identified(directory: Union[str, Path], name: str, model: Union[RobotModel, str],
                     parameters: Mapping[str, Any],
                     files: Optional[Mapping[str, str]] = None) -> Tuple[Path, Path]:
    """
    Write a model's URDF and its parameters as ``<name>_identified.urdf`` / ``.yaml``.

    The identifier's ``~/save`` (robot and object modes).  Every name is a plain file name
    in ``directory`` (no folder, no ``..``): the files can only land there.

    :param directory: the folder (created, parents included; ``''``:
        :data:`SAVE_DIRECTORY`).
    :param name: file name stem (the robot's or the object's name).
    :param model: the model (see :func:`model_to_urdf`), or URDF text already made (a
        learned object's, :func:`~diffsim_ros.io.object_urdf.learned_urdf`).
    :param parameters: the YAML document (an identification result's ``to_dict()``).
    :param files: more files the URDF names, written beside it: ``{file name: text}`` (a
        learned object's meshes).
    :return: the URDF and YAML paths.
    :raises OSError: the folder or a file cannot be written.
    :raises URDFError: the model cannot be exported.
    :raises ValueError: a name that is not a plain file name.
    """
    directory = Path(directory or SAVE_DIRECTORY).expanduser()
    files = dict(files or {})
    stems = (f'{name}_identified.urdf', f'{name}_identified.yaml', *files)
    for filename in stems:
        if Path(filename).name != filename or filename in ('.', '..'):
            raise ValueError(f'{filename!r} is not a plain file name')
    urdf_text = model_to_urdf(model) if isinstance(model, RobotModel) else model
    text = yaml.safe_dump(dict(parameters), sort_keys=False)   # before touching the disk
    directory.mkdir(parents=True, exist_ok=True)
    urdf, params = directory / stems[0], directory / stems[1]
    for filename, content in files.items():
        (directory / filename).write_text(content, encoding='utf-8')
    urdf.write_text(urdf_text, encoding='utf-8')
    params.write_text(text, encoding='utf-8')
    return urdf, params
