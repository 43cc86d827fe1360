"""Learning an object from a pose stream, without ROS: velocities, the toss rule, the engine."""

import dataclasses
import math

from diffsim_ros.core import load_urdf
from diffsim_ros.core.configuration import from_mujoco
from diffsim_ros.core.spatial import quat_rotate
from diffsim_ros.io.object_urdf import learned_urdf, read_object_urdf
from diffsim_ros.robots import object_urdf_path
from diffsim_ros.sim.tosser import hidden_box, Tosser
from diffsim_ros.sysid.contact_learning import cube_spec
from diffsim_ros.sysid.object_online import (object_parameters, ObjectEngine, ObjectOnlineConfig,
                                             pose_velocities, SegmenterConfig, TossSegmenter)
import mujoco
import numpy as np
import pytest
import torch


@pytest.fixture(scope='module')
def cube():
    """Return the catalogue cube's floating model."""
    return load_urdf(str(object_urdf_path('cube_toss')), floating_base=True, dtype=torch.float64)


def stream(cube, seed=0, seconds=6.0, **box):
    """Return the rig's tracked samples ``(t, q)`` and the rig."""
    rig = Tosser(cube, hidden_box(cube, seed, nominal_half_width=0.0524, **box), seed=seed)
    samples = []
    while rig.time < seconds:
        q = rig.step()
        if q is not None:
            samples.append((rig.time, q))
    return samples, rig


def test_velocities_are_the_backward_difference_in_free_flight(cube):
    # free flight: the backward difference of the position is the velocity at mid-interval
    rig = Tosser(cube, hidden_box(cube, 0, nominal_half_width=0.0524), seed=0)
    data, model = rig.scene.mj_data, rig.scene.mj_model
    t, q, v_world = [], [], []
    for k in range(12):   # ~80 ms, well before the first impact (released >= 0.15 m up)
        qk, vk = from_mujoco(rig.scene.model, torch.tensor(data.qpos.copy()),
                             torch.tensor(data.qvel.copy()))
        t.append(k * rig.period)
        q.append(qk)
        v_world.append(data.qvel[:3].copy())
        for _ in range(rig.substeps):
            mujoco.mj_step(model, data)
    t, q = torch.tensor(t, dtype=torch.float64), torch.stack(q)
    v = pose_velocities(t, q)
    v_world = np.array(v_world)
    linear_world = quat_rotate(q[:, 3:7], v[:, :3]).numpy()
    midpoint = 0.5 * (v_world[1:] + v_world[:-1])
    # MuJoCo's semi-implicit Euler moves the position with the new velocity: the backward
    # difference over one sample is the mean of the velocities of its substeps
    np.testing.assert_allclose(linear_world[2:-1], midpoint[1:-1], atol=0.05 * 9.81 *
                               rig.period)
    assert v.shape == (12, 6) and bool(v.isfinite().all())


def test_the_segmenter_finds_every_toss_from_release_to_rest(cube):
    samples, rig = stream(cube, seconds=8.0)
    segmenter = TossSegmenter()
    tosses = [toss for toss in (segmenter.add(t, q) for t, q in samples) if toss is not None]
    completed = rig.tosses - 1   # the last one is still under way
    assert len(tosses) == completed >= 4
    h = rig.box.half_width
    for toss in tosses:
        assert float(toss.q[0, 2]) > math.sqrt(3) * h   # released in the air
        assert float(toss.q[-1, 2]) == pytest.approx(h, abs=2e-3)   # resting on a face
        assert float(toss.v[-1, :3].norm()) < SegmenterConfig().rest_speed


def test_a_gap_aborts_the_toss_under_way(cube):
    samples, _ = stream(cube, seconds=3.0)
    segmenter = TossSegmenter()
    cut = 20   # inside the first toss: leave out 10 samples (68 ms > max_gap)
    for t, q in samples[:cut] + samples[cut + 10:]:
        segmenter.add(t, q)
    assert segmenter.counts['aborted_gap'] == 1


def engine_and_tosses(cube):
    """Return an inline engine (a refit per two tosses from four on), the tosses, the stream."""
    samples, _ = stream(cube, seconds=10.0)
    segmenter = TossSegmenter()
    tosses = [toss for toss in (segmenter.add(t, q) for t, q in samples) if toss is not None]
    spec = cube_spec(cube, 0.0524, 0.18, 0.37, known=False)
    engine = ObjectEngine(spec, ObjectOnlineConfig(min_tosses=4, refit_every=2,
                                                   execution='inline'))
    return engine, tosses, samples


def test_engine_snapshots_in_order_and_splits_train_validation_heldout(cube):
    engine, tosses, _ = engine_and_tosses(cube)
    due = [engine.add_toss(toss) for toss in tosses[:6]]
    assert due == [False, False, False, True, False, True]
    job = engine.prepare()
    assert job.train == tuple(tosses[:2]) and job.validation == (tosses[2],)
    assert job.heldout == (tosses[3],) and job.seed == 0
    assert job.dt == pytest.approx(1 / 148)
    job = engine.prepare()
    assert job.heldout == (tosses[5],) and job.seed == 1 and len(job.train) == 4
    assert engine.prepare().outcome == 'waiting'


def test_a_restart_forgets_the_window_and_keeps_the_object_a_reset_forgets_both(cube):
    engine, tosses, samples = engine_and_tosses(cube)
    learned = object()   # stands for a learned object in use
    engine.current = learned
    assert [engine.add_toss(toss) for toss in tosses[:4]][-1] and engine.snapshots
    engine.restart()   # time started over: no data of the old timeline left, the object kept
    assert not engine.tosses and not engine.snapshots and engine.current is learned
    assert engine.prepare().outcome == 'waiting'
    assert not engine.add_toss(tosses[4]) and len(engine.tosses) == 1
    engine.reset()   # ~/reset: the nominal object as well
    assert not engine.tosses and engine.current is None
    # the segmenter counts a toss cut by a restart; one between tosses is no loss
    segmenter = TossSegmenter()
    for t, q in samples[:20]:
        segmenter.add(t, q)
    assert segmenter.in_toss
    segmenter.restart()
    segmenter.restart()
    assert not segmenter.in_toss and segmenter.counts['aborted_restart'] == 1


def test_named_parameters_and_urdf_of_the_nominal_cube(cube):
    spec = cube_spec(cube, 0.0524, 0.18, 0.37, known=False)
    values = object_parameters(spec.model, spec.contact)
    assert values['size_x'] == values['size_y'] == values['size_z'] == pytest.approx(0.1048)
    assert values['volume'] == pytest.approx(0.1048 ** 3)
    assert values['ixx'] == pytest.approx(0.00081) and values['friction'] == pytest.approx(0.18)
    urdf, files = learned_urdf(spec.model, spec.contact, spec.model.urdf, files=False)
    back = load_urdf(xml=urdf, floating_base=True, dtype=torch.float64)
    torch.testing.assert_close(back.inertial, spec.model.inertial)
    assert '<box size="0.1048 0.1048 0.1048"' in urdf and not files


def test_a_learned_shape_that_is_not_a_box_goes_on_the_topic_as_vertex_spheres(cube, tmp_path):
    # the node's robot_description carries no files: bounds for RViz, the vertices as spheres
    # of radius 0, read back as the same contact vertices
    spec = cube_spec(cube, 0.0524, 0.18, 0.37, known=False)
    vertices = spec.contact.vertices[0] * torch.linspace(0.9, 1.1, 8, dtype=torch.float64)[:, None]
    contact = dataclasses.replace(spec.contact, vertices=(vertices,))
    urdf, files = learned_urdf(spec.model, contact, spec.model.urdf, files=False)
    assert not files and urdf.count('radius="0.0"') == 8 and 'learned_bounds' in urdf
    (tmp_path / 'learned.urdf').write_text(urdf, encoding='utf-8')
    _, read, _ = read_object_urdf(tmp_path / 'learned.urdf')
    torch.testing.assert_close(read.vertices[0], vertices, rtol=0, atol=1e-15)


def test_velocities_reproduce_the_recorded_cube_tosses(data_dir):
    # the shared cube tosses store velocities made from their poses (SOURCE.md): backward
    # differences, then a 3-tap median.  From the same poses on the file's 1/148 s grid the
    # node's velocities agree to ~0.1 % (median 0.8 mm/s and 1.5 mrad/s; the residual is
    # not explained: the original's own stamps are not in the file); without the median
    # the angular agreement is 5x worse, so the median is part of the convention
    from diffsim_ros.io.tosses import load_cube_tosses
    tosses = load_cube_tosses(data_dir, limit=20)
    for q, v in zip(tosses.q, tosses.v):
        t = torch.arange(len(q), dtype=torch.float64) * tosses.dt
        difference = (pose_velocities(t, q) - v)[1:].abs()
        assert float(difference[:, :3].median()) < 3e-3   # m/s
        assert float(difference[:, 3:].median()) < 6e-3   # rad/s
        assert float(difference[:, :3].max()) < 0.05 and float(difference[:, 3:].max()) < 0.5


def test_a_refit_runs_in_a_child_process_and_comes_back_whole(cube):
    # the node's default execution: the job and the learned object cross the process border
    samples, _ = stream(cube, seconds=6.0)
    segmenter = TossSegmenter()
    tosses = [toss for toss in (segmenter.add(t, q) for t, q in samples) if toss is not None]
    spec = cube_spec(cube, 0.0524, 0.18, 0.37, known=False)
    engine = ObjectEngine(spec, ObjectOnlineConfig(min_tosses=3, refit_every=3, steps=2,
                                                   bootstrap=2, bootstrap_steps=1,
                                                   execution='process'))
    try:
        for toss in tosses[:3]:
            engine.add_toss(toss)
        decision = engine.refit()
    finally:
        engine.close()
    assert decision.outcome in ('accepted', 'refused'), decision.reason
    result = decision.result
    assert set(result.std) == set(result.values) - {'mass'}
    assert result.to_dict()['parameters']['friction']['unit'] == ''
    assert math.isfinite(decision.losses['nominal'])
