"""Identified models written back to URDF load again with the same dynamics."""

from diffsim_ros import robots
from diffsim_ros.core import load_urdf, rnea, URDFError
from diffsim_ros.io.urdf_export import model_to_urdf, write_identified
import pinocchio as pin
import pytest
import torch


def _perturbed(name):
    model = load_urdf(xml=robots.urdf_string(name))
    g = torch.Generator().manual_seed(0)
    scale = 1.0 + 0.2 * torch.rand(model.n, 1, generator=g, dtype=torch.float64)
    return model.replace(
        inertial=model.inertial * scale,
        origin_xyz=model.origin_xyz
        + 0.01 * torch.rand(model.n, 3, generator=g, dtype=torch.float64),
        damping=torch.rand(model.n, generator=g, dtype=torch.float64),
        friction=torch.rand(model.n, generator=g, dtype=torch.float64))


@pytest.mark.parametrize('name', robots.names())
def test_round_trip_preserves_dynamics(name):
    model = _perturbed(name)
    text = model_to_urdf(model)
    back = load_urdf(xml=text)
    assert back.joint_names == model.joint_names and back.link_names == model.link_names
    g = torch.Generator().manual_seed(1)
    q, qd, qdd = (torch.randn(4, model.n, generator=g, dtype=torch.float64) for _ in range(3))
    torch.testing.assert_close(rnea(back, q, qd, qdd), rnea(model, q, qd, qdd),
                               rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(back.damping, model.damping)
    torch.testing.assert_close(back.friction, model.friction)
    # An independent parser agrees too.
    pin_model = pin.buildModelFromXML(text)
    assert abs(sum(pin_model.inertias[i].mass for i in range(1, pin_model.njoints))
               - float(model.mass.sum())) < 1e-9


def test_comments_and_limits_are_kept():
    model = _perturbed('qube')
    text = model_to_urdf(model)
    assert '<!--' in text and 'limit' in text


def test_batched_or_infeasible_models_are_rejected():
    model = load_urdf(xml=robots.urdf_string('wam4'))
    with pytest.raises(URDFError, match='batched'):
        model_to_urdf(model.replace(inertial=model.inertial.expand(3, 4, 10)))
    bad = model.inertial.clone()
    bad[2, 0] = -1.0
    with pytest.raises(URDFError, match='wam/forearm_link|not physically consistent'):
        model_to_urdf(model.replace(inertial=bad))


def test_write_identified_writes_only_plain_file_names_into_its_folder(tmp_path):
    model = load_urdf(xml=robots.urdf_string('qube'))
    urdf, params = write_identified(tmp_path / 'out', 'qube', model, {'method': 'nominal'})
    assert load_urdf(urdf).n == model.n and params.read_text() == 'method: nominal\n'
    # URDF text and the files it names (a learned object's meshes) go beside it
    urdf, _ = write_identified(tmp_path / 'out', 'cube', '<robot name="c"/>', {},
                               {'cube_identified_cube.obj': 'v 0 0 0\n'})
    assert (tmp_path / 'out' / 'cube_identified_cube.obj').read_text() == 'v 0 0 0\n'
    for name, files in (('../qube', {}), ('cube', {'../escape.obj': ''}),
                        ('cube', {'..': ''}), ('a/b', {})):
        with pytest.raises(ValueError, match='plain file name'):
            write_identified(tmp_path / 'elsewhere', name, '<robot/>', {}, files)
    assert not (tmp_path / 'elsewhere').exists() and not (tmp_path / 'escape.obj').exists()
