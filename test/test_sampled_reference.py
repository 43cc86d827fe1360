"""The one-shot sampled reference (``kind: sampled``): its loader, its refusals, the mpc's use."""

import math

from diffsim_ros import robots
from diffsim_ros.control.controller import ControllerConfig, make_controller
from diffsim_ros.control.tasks import get_task, reference, start_state
from diffsim_ros.nodes.gates import configured_velocity_limits, StateGateConfig
from diffsim_ros.nodes.reference import load_reference_task, ReferenceFileError
from diffsim_ros.sysid.sampled import sampled_document, SampledTrajectory
import numpy as np
import pytest
import torch
import yaml

ROBOT = 'wam4'
RATE = 500.0
DURATION = 3.0
START = torch.tensor([0.0, 0.0, 0.0, 1.2], dtype=torch.float64)


@pytest.fixture(scope='module')
def model():
    return robots.interface(ROBOT).nominal_model()


def _minimum_jerk(t, duration, step):
    """Return q, qd, qdd of a rest-to-rest quintic from START by ``step`` (rad)."""
    s = (t / duration).clamp(0.0, 1.0)[:, None]
    blend = 10 * s ** 3 - 15 * s ** 4 + 6 * s ** 5
    rate = (30 * s ** 2 - 60 * s ** 3 + 30 * s ** 4) / duration
    accel = (60 * s - 180 * s ** 2 + 120 * s ** 3) / duration ** 2
    return START + blend * step, rate * step, accel * step


def _write(tmp_path, document, name='swing.yaml'):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(document))
    return path


def _document(scale=1.0, duration=DURATION, joints=None):
    joints = list(joints or robots.get(ROBOT).joint_names)
    t = torch.arange(0.0, duration + 0.5 / RATE, 1.0 / RATE, dtype=torch.float64)
    step = scale * torch.tensor([0.3, 0.3, -0.3, 0.2], dtype=torch.float64)
    q, _, _ = _minimum_jerk(t, duration, step)
    return sampled_document(joints, RATE, q, ROBOT), step


def test_sampled_file_is_played_once_then_held(model, tmp_path):
    document, step = _document()
    # the file lists the joints in another order: matched by name
    order = [3, 1, 0, 2]
    document['joint_names'] = [document['joint_names'][i] for i in order]
    document['q'] = [document['q'][i] for i in order]
    task = load_reference_task(_write(tmp_path, document), ROBOT, model)
    assert task.kind == 'tracking' and task.duration_s == pytest.approx(DURATION)
    assert task.state_weight == get_task(ROBOT).state_weight   # the robot's tracking settings
    t = torch.linspace(0.0, DURATION, 307, dtype=torch.float64)   # between samples too
    q, qd, qdd = _minimum_jerk(t, DURATION, step)
    q_ref, qd_ref, qdd_ref = reference(task, t)
    # linear interpolation of 2 ms samples: position within |qdd| dt^2 / 8 = 4e-7 rad;
    # derivatives by differences within dt^2 |q'''| and the interpolation's dt |q'''|
    assert torch.allclose(q_ref, q, atol=1e-6, rtol=0)
    assert torch.allclose(qd_ref, qd, atol=1e-4, rtol=0)
    assert torch.allclose(qdd_ref, qdd, atol=5e-3, rtol=0)
    # after the last sample: held there at rest
    late = torch.tensor([DURATION, DURATION + 0.01, 100.0], dtype=torch.float64)
    q_end, qd_end, qdd_end = reference(task, late)
    assert torch.allclose(q_end, (START + step).expand(3, -1), atol=1e-12)
    assert not qd_end.any() and not qdd_end.any()
    q0, qd0 = start_state(task, model)
    assert torch.allclose(q0, START, atol=1e-12) and qd0.abs().max() < 1e-5
    # float32 times (an MPC in float32) give float32 references
    assert reference(task, t.float())[0].dtype == torch.float32
    # what the mpc node's controller tracks is that trajectory
    controller, _ = make_controller(robots.get(ROBOT), model,
                                    ControllerConfig(native=False, compile=False), task)
    x_ref = controller.cost.reference_fn(t)
    assert torch.allclose(x_ref, torch.cat((q_ref, qd_ref), -1), atol=1e-12, rtol=0)


def test_document_round_trip_and_batched_evaluation():
    q = np.random.default_rng(0).normal(size=(7, 2))
    trajectory = SampledTrajectory(('a', 'b'), 10.0, q)
    again = SampledTrajectory.from_document(sampled_document(('a', 'b'), 10.0, q, 'x'))
    assert np.array_equal(again.q, trajectory.q) and again.duration_s == 0.6
    t = torch.tensor([[0.0, 0.25], [0.6, 0.05]], dtype=torch.float64)
    batched = trajectory.evaluate(t)
    for row in range(2):
        for got, want in zip(batched, trajectory.evaluate(t[row])):
            assert torch.equal(got[row], want)
    # at the samples the positions are the samples themselves
    assert torch.equal(trajectory.evaluate(torch.tensor([0.3], dtype=torch.float64))[0][0],
                       torch.as_tensor(q[3]))


def _hostile(document, change):
    change(document)
    return document


@pytest.mark.parametrize('change, message', [
    (lambda d: d['q'][1].__setitem__(5, float('nan')), 'finite'),
    (lambda d: d['q'][0].__setitem__(5, float('inf')), 'finite'),
    (lambda d: d.update(joint_names=['wam/j1'] + d['joint_names'][1:]), 'missing'),
    (lambda d: d['q'][2].pop(), 'same number of samples'),
    (lambda d: d.update(q=d['q'][:3]), 'one list of positions per joint'),
    (lambda d: d['q'][0].__setitem__(3, 'far'), 'numbers'),
    (lambda d: d['q'][0].__setitem__(3, True), 'numbers'),
    (lambda d: d.update(rate_hz=0.0), 'rate_hz'),
    (lambda d: d.update(rate_hz='fast'), 'rate_hz'),
    (lambda d: d.update(q=[row[:1] for row in d['q']], duration_s=0.0), 'at least 2 samples'),
    (lambda d: d.pop('q'), 'missing keys'),
    (lambda d: d.update(kind='spline'), 'kind'),
    (lambda d: d.update(duration_s=9.0), 'duration_s'),
    # the elbow's motion shifted by 1.8 rad: from 3.0 to 3.2 rad, past its limit (3.1 rad)
    (lambda d: d['q'].__setitem__(3, [v + 1.8 for v in d['q'][3]]), 'position limit'),
    # one sample off by 0.05 rad: 12.5 rad/s and 1.25e4 rad/s^2 in the differences (the
    # torque the spike needs is named first); velocities alone: the test below
    (lambda d: d['q'][1].__setitem__(700, d['q'][1][700] + 0.05), 'leaves the limits'),
])
def test_hostile_sampled_files_are_refused_in_one_line(model, tmp_path, change, message):
    document, _ = _document()
    path = _write(tmp_path, _hostile(document, change), 'hostile.yaml')
    with pytest.raises(ReferenceFileError, match=message) as error:
        load_reference_task(path, ROBOT, model)
    assert '\n' not in str(error.value) and 'hostile.yaml' in str(error.value)


def test_swing_up_speeds_need_configured_limits(model, tmp_path):
    # a quintic peaks at 1.875 step / duration: 2 rad/s on the shoulder joints, four times
    # the URDF's 0.5 rad/s, and 1.33 rad/s on the elbow, 6.7 times its 0.2 rad/s
    document, step = _document(scale=16.0 / 3.0, duration=1.5)
    assert torch.allclose(1.875 * step.abs() / 1.5,
                          torch.tensor([2.0, 2.0, 2.0, 4.0 / 3.0], dtype=torch.float64))
    path = _write(tmp_path, document)
    with pytest.raises(ReferenceFileError, match='times its velocity limit'):
        load_reference_task(path, ROBOT, model)
    config = StateGateConfig(velocity_limits=(3.0, 3.0, 3.0, 3.0))
    speeds = configured_velocity_limits(config, model.joint_names, model.velocity_limit)
    task = load_reference_task(path, ROBOT, model, speeds)
    assert task.trajectory is not None
    # the configured limits bind too: 1 rad/s is below the trajectory's peak
    with pytest.raises(ReferenceFileError, match='velocity limit'):
        load_reference_task(path, ROBOT, model, (1.0,) * 4)


def test_configured_velocity_limits_are_checked():
    names = robots.get(ROBOT).joint_names
    assert configured_velocity_limits(StateGateConfig(), names, (0.5,) * 4) == (0.5,) * 4
    with pytest.raises(ValueError, match='one value per joint'):
        configured_velocity_limits(StateGateConfig(velocity_limits=(3.0,)), names, (0.5,) * 4)
    for bad in ((3.0, 0.0, 3.0, 3.0), (3.0, math.inf, 3.0, 3.0), (-1.0,) * 4):
        with pytest.raises(ValueError, match='velocity_limits'):
            StateGateConfig(velocity_limits=bad)
