"""URDF parsing: supported features, fixed-joint merging, and one clear error per bad input."""

import os
from pathlib import Path
import time

from diffsim_ros import robots
from diffsim_ros.core import (aba, crba, load_urdf, rnea, ShapeError, UnsupportedJointError,
                              URDFError)
from diffsim_ros.core.urdf import MAX_URDF_BYTES
import pytest
import torch

LINK = ('<link name="{name}"><inertial><origin xyz="0.1 0 0"/><mass value="{mass}"/>'
        '<inertia ixx="0.01" ixy="0" ixz="0" iyy="0.02" iyz="0" izz="0.02"/></inertial></link>')


def _robot(joint_type='revolute', mass='1.0', extra_joint='', extra_links=''):
    return (f'<robot name="r"><link name="base"/>{LINK.format(name="l1", mass=mass)}'
            f'<joint name="j1" type="{joint_type}"><parent link="base"/><child link="l1"/>'
            '<axis xyz="0 0 1"/><limit lower="-1" upper="1" effort="5" velocity="2"/>'
            f'{extra_joint}</joint>{extra_links}</robot>')


def test_file_path_and_string_give_the_same_model(tmp_path):
    path = robots.urdf_path('panda')
    from_file = load_urdf(path)
    from_text = load_urdf(xml=path.read_text())
    assert from_file.joint_names == from_text.joint_names == tuple(
        f'panda_joint{i}' for i in range(1, 8))
    assert torch.equal(from_file.inertial, from_text.inertial)


def test_fixed_child_is_merged_into_parent_body():
    fixed = ('<joint name="tool" type="fixed"><parent link="l1"/><child link="tool_link"/>'
             '<origin xyz="0.3 0 0" rpy="0 1.0 0"/></joint>')
    merged = load_urdf(xml=_robot(extra_links=fixed + LINK.format(name='tool_link', mass='2.0')))
    assert merged.n == 1 and merged.link_names == ('base', 'l1', 'tool_link')
    assert float(merged.mass[0]) == pytest.approx(3.0)
    # Mass-weighted CoM of the two links along x: (1 * 0.1 + 2 * (0.3 + 0.1 cos 1)) / 3.
    expected = (0.1 + 2.0 * (0.3 + 0.1 * torch.cos(torch.tensor(1.0)))) / 3.0
    assert float(merged.com[0, 0]) == pytest.approx(float(expected))


def test_continuous_joint_has_no_position_limits():
    model = load_urdf(xml=_robot('continuous'))
    assert model.lower[0] == -float('inf') and model.upper[0] == float('inf')
    assert model.effort_limit[0] == 5.0 and model.velocity_limit[0] == 2.0


def test_massless_link_without_inertial_is_allowed_between_bodies():
    xml = ('<robot name="r"><link name="base"/><link name="virtual"/>'
           + LINK.format(name='l2', mass='1.0')
           + '<joint name="j1" type="revolute"><parent link="base"/><child link="virtual"/>'
           '<axis xyz="0 1 0"/></joint>'
           '<joint name="j2" type="revolute"><parent link="virtual"/><child link="l2"/>'
           '<origin xyz="0 0 0.2"/><axis xyz="1 0 0"/></joint></robot>')
    model = load_urdf(xml=xml)
    assert model.n == 2 and float(model.mass[0]) == 0.0


@pytest.mark.parametrize('xml, error, match', [
    ('<robot name="r"><link name="a">', URDFError, 'well-formed'),
    ('<model/>', URDFError, '<robot>'),
    (_robot(extra_links=LINK.format(name='l2', mass='1.0') + '<joint name="j2" type="floating">'
            '<parent link="l1"/><child link="l2"/></joint>'),
     UnsupportedJointError, "joint 'j2': a floating joint is supported only at the root"),
    (_robot('planar'), UnsupportedJointError, "joint 'j1'.*planar"),
    (_robot('ball'), UnsupportedJointError, "unknown joint type 'ball'"),
    (_robot(extra_joint='<mimic joint="j0"/>'), UnsupportedJointError, 'mimic'),
    (_robot(mass='0'), URDFError, "link 'l1'.*mass must be positive"),
    (_robot(mass='-1.5'), URDFError, "link 'l1'.*mass must be positive"),
    (_robot(mass='nan'), URDFError, 'finite'),
    (_robot().replace('ixx="0.01"', 'ixx="-0.5"'), URDFError, 'positive semi-definite'),
    (_robot().replace('<child link="l1"/>', '<child link="nowhere"/>'), URDFError,
     "child link 'nowhere' is not defined"),
    (_robot().replace('<axis xyz="0 0 1"/>', '<axis xyz="0 0 0"/>'), URDFError, 'non-zero'),
    (_robot().replace('<axis xyz="0 0 1"/>', '<axis xyz="0 0"/>'), URDFError, '3 finite'),
    (_robot(extra_links='<link name="orphan"/>'), URDFError, 'exactly one root'),
    ('<robot name="r"><link name="base"/></robot>', URDFError, 'no movable'),
    ('<robot name="r"><link name="base"/><link name="l1"/><joint name="j1" type="revolute">'
     '<parent link="base"/><child link="l1"/><axis xyz="0 0 1"/></joint></robot>', URDFError,
     'moves no mass'),
])
def test_bad_urdf_raises_one_clear_error(xml, error, match):
    with pytest.raises(error, match=match):
        load_urdf(xml=xml)


def test_missing_file_is_a_urdf_error(tmp_path):
    with pytest.raises(URDFError, match='cannot read URDF file'):
        load_urdf(tmp_path / 'missing.urdf')


def test_text_is_never_taken_for_a_path_nor_a_path_for_text(tmp_path):
    xml = robots.urdf_string('qube')
    with pytest.raises(URDFError, match=r'pass the text as load_urdf\(xml=...\)'):
        load_urdf(xml)
    with pytest.raises(URDFError, match='not well-formed'):
        load_urdf(xml=str(robots.urdf_path('qube')))   # a file name given as text
    with pytest.raises(URDFError, match='exactly one'):
        load_urdf()
    with pytest.raises(URDFError, match='exactly one'):
        load_urdf(robots.urdf_path('qube'), xml=xml)


def test_special_files_are_refused_without_blocking_or_reading_them_whole(tmp_path):
    # a FIFO with no writer would block open() and read() forever; /dev/zero never ends
    fifo = tmp_path / 'model.urdf'
    os.mkfifo(fifo)
    started = time.monotonic()
    for path in (fifo, Path('/dev/zero'), tmp_path):
        with pytest.raises(URDFError, match='not a regular file|Is a directory'):
            load_urdf(path)
    assert time.monotonic() - started < 5.0
    big = tmp_path / 'big.urdf'
    with open(big, 'wb') as f:
        f.truncate(MAX_URDF_BYTES + 1)   # sparse: costs no disk
    with pytest.raises(URDFError, match='larger than'):
        load_urdf(big)


def test_state_shape_mismatch_names_argument_and_shapes():
    model = load_urdf(xml=robots.urdf_string('wam4'))
    q = torch.zeros(4, dtype=torch.float64)
    with pytest.raises(ShapeError, match=r'qd: expected shape \(\.\.\., 4\), got \(3,\)'):
        rnea(model, q, torch.zeros(3, dtype=torch.float64), q)
    with pytest.raises(ShapeError, match='tau'):
        aba(model, q, q, torch.zeros(2, 5, dtype=torch.float64))
    with pytest.raises(ShapeError, match='q: expected'):
        crba(model, torch.zeros(7, dtype=torch.float64))


def test_replace_validates_parameter_shapes_and_names():
    model = load_urdf(xml=robots.urdf_string('wam4'))
    with pytest.raises(ShapeError, match=r'inertial: expected shape \(\.\.\., 4, 10\)'):
        model.replace(inertial=torch.zeros(4, 9, dtype=torch.float64))
    with pytest.raises(TypeError, match='no field'):
        model.replace(masses=torch.zeros(4))
    with pytest.raises(KeyError, match='movable joints: wam/base_yaw_joint'):
        model.joint_index('panda_joint1')


def test_in_place_parameter_edit_invalidates_cached_terms():
    model = load_urdf(xml=robots.urdf_string('wam4'))
    q = torch.full((4,), 0.3, dtype=torch.float64)
    before = crba(model, q)
    model.inertial[0, 9] += 1.0  # Izz of the base-yaw body; edits the shared tensor in place
    assert not torch.equal(before, crba(model, q))
