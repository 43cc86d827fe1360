"""
The box parameterisation of a learned shape (``ObjectSpec.shape = 'boxes'``).

Identities (the parameters reproduce the nominal corners; ``box_corners`` gradchecked), the
spec's validation, and CCN learning boxes through ``fit_object``: its start and its result are
boxes with the nominal centres moved only by learning, its half extents drawn 0.5-1.5x.
"""

import dataclasses
from types import SimpleNamespace

from diffsim_ros.io.object_urdf import elbow_spec
from diffsim_ros.robots import object_urdf_path
from diffsim_ros.sysid import contact_learning as cl
from diffsim_ros.sysid.object_learning import fit_object
from diffsim_ros.sysid.pose_smoothing import backward_velocities
import pytest
import torch

DT = 0.0068


@pytest.fixture(scope='module')
def spec():
    """Return the elbow's spec from the shipped URDF (no recordings needed)."""
    return elbow_spec(SimpleNamespace(urdf_path=object_urdf_path('elbow_toss'), friction=0.3,
                                      q=(torch.zeros(1, 8, dtype=torch.float64),)))


def _as_set(corners):
    return sorted(tuple(round(float(x), 12) for x in row) for row in corners)


def test_box_parameters_reproduce_the_nominal_corners_and_gradcheck(spec):
    box = cl.box_parameters(spec.contact.vertices)
    assert box.shape == (len(spec.contact.vertices), 6)
    corners = cl.box_corners(box) * cl.LENGTH_SCALE
    for found, nominal in zip(corners, spec.contact.vertices):
        assert _as_set(found) == _as_set(nominal)
    probe = box.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(cl.box_corners, (probe,))


def test_spec_refuses_an_unknown_shape_and_boxes_of_non_box_vertices(spec):
    assert spec.shape == 'boxes'   # the elbow's own (io.object_urdf.ELBOW_SHAPE)
    spec = dataclasses.replace(spec, shape='vertices')
    assert dataclasses.replace(spec, shape='boxes').shape == 'boxes'
    with pytest.raises(ValueError, match='unknown shape'):
        dataclasses.replace(spec, shape='hull')
    bent = list(spec.contact.vertices)
    bent[0] = bent[0].clone()
    bent[0][0, 2] += 0.004
    contact = dataclasses.replace(spec.contact, vertices=tuple(bent))
    assert dataclasses.replace(spec, contact=contact).shape == 'vertices'
    with pytest.raises(ValueError, match='axis-aligned box'):
        dataclasses.replace(spec, contact=contact, shape='boxes')


def test_ccn_learns_boxes_from_a_box_start_through_fit_object(spec):
    boxes = dataclasses.replace(spec, shape='boxes')
    nominal = cl.box_parameters(spec.contact.vertices)
    theta, learn = cl.violation_start(boxes, seed=3, perturb=True)
    assert 'box' in learn and 'vertices' not in learn and 'vertices' not in theta
    torch.testing.assert_close(theta['box'][:, :3], nominal[:, :3])
    ratio = torch.exp(theta['box'][:, 3:] - nominal[:, 3:])
    assert bool((ratio >= 0.5).all() and (ratio <= 1.5).all())
    assert not torch.allclose(ratio, torch.ones_like(ratio))
    # friction and inertia are drawn as with free vertices
    free, learn_free = cl.violation_start(dataclasses.replace(spec, shape='vertices'), seed=3,
                                          perturb=True)
    assert learn_free == cl.LEARNED + ('joint_damping',) and 'box' not in free
    torch.testing.assert_close(theta['friction'], free['friction'])
    torch.testing.assert_close(theta['inertia'], free['inertia'])
    # a few steps on a toss onto the table: the learned shape is still two boxes, moved
    t = torch.arange(30, dtype=torch.float64) * DT
    q = torch.zeros(30, 8, dtype=torch.float64)
    q[:, 2] = (0.06 - 1.0 * t - 4.9 * t ** 2).clamp(min=0.025)
    q[:, 6] = 1.0
    v = backward_velocities(q, DT)
    fit = fit_object(boxes, 'ccn', ([q], [v]), ([q], [v]), DT, seed=3, steps=3)
    for vertices in fit.contact.vertices:
        assert cl._is_box(vertices)
    start = cl.box_corners(theta['box']) * cl.LENGTH_SCALE
    assert any(not torch.allclose(a, b) for a, b in zip(fit.contact.vertices, start))
