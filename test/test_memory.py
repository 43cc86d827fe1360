"""The identifier's memory of informative data (``sysid.memory``)."""

import math

from diffsim_ros import robots
from diffsim_ros.core import load_urdf
from diffsim_ros.sim import excitation_for, MujocoPlant, PlantConfig
from diffsim_ros.sysid.dataset import Trajectory
from diffsim_ros.sysid.filters import estimate_derivatives
from diffsim_ros.sysid.memory import SegmentMemory
import pytest
import torch


@pytest.fixture(scope='module')
def qube():
    return load_urdf(xml=robots.urdf_string('qube'), dtype=torch.float64)


@pytest.fixture(scope='module')
def swinging():
    """Four seconds of a multisine on a Qube 30 % off nominal, at 100 Hz, from t = 10 s."""
    plant = MujocoPlant(PlantConfig(robot='qube', rate_hz=100.0, param_error=0.3, seed=1))
    traj = plant.run(excitation_for(plant, 'multisine', duration=4.0))
    traj = estimate_derivatives(traj, 'filtfilt', 20.0)
    return traj.replace(t=traj.t + 10.0)


def still(start, seconds=4.0, rate=100.0):
    """Return the Qube resting (pendulum down), as a balanced pendulum's window looks to a fit."""
    t = start + torch.arange(int(seconds * rate), dtype=torch.float64) / rate
    zeros = torch.zeros(t.shape[0], 2, dtype=torch.float64)
    return Trajectory(t=t, q=zeros, qd=zeros, qdd=zeros, tau=zeros, u=zeros[:, :1],
                      joint_names=('arm_joint', 'pendulum_joint'))


def test_moving_data_displace_still_data_whatever_the_order(qube, swinging):
    for order in ((still(0.0), swinging), (swinging, still(20.0))):
        memory = SegmentMemory(qube, capacity=3, segment=1.0)
        for traj in order:
            memory.offer([traj])
        # the three cells kept are all from the swinging run (t in [10, 14))
        assert len(memory) == 3
        assert all(10.0 <= start and end < 14.0 for start, end in memory.spans()), \
            memory.spans()
        kept = [memory.information(run) for run in memory.runs()]
        nothing = memory.value([])
        assert memory.value(kept) > nothing + 1.0
        # still data tell only the gravity terms: a tenth of what the swinging cells tell
        rest = memory.value([memory.information(still(0.0))])
        assert rest - nothing < 0.1 * (memory.value(kept) - nothing)


def test_each_swap_raises_the_value_of_the_set(qube, swinging):
    memory = SegmentMemory(qube, capacity=2, segment=0.5)
    values = []
    for k in range(8):   # offered one half-second at a time, as refits see a sliding window
        piece = swinging.crop(k * 50, (k + 1) * 50)
        memory.offer([piece])
        values.append(memory.value([memory.information(run) for run in memory.runs()]))
    assert len(memory) == 2
    assert all(b >= a - 1e-9 for a, b in zip(values[1:], values[2:])), values


def test_runs_before_a_time_leave_out_the_cells_a_window_still_holds(qube, swinging):
    memory = SegmentMemory(qube, capacity=8, segment=1.0)
    memory.offer([swinging])
    assert [run.run for run in memory.runs()] == [f'memory/{s:.3f}' for s in (10, 11, 12, 13)]
    assert len(memory.runs(before=12.0)) == 2
    for run in memory.runs():
        assert run.qd is not None and run.qdd is not None and run.u is not None
    # a cell the data cover only partly is not kept
    partial = SegmentMemory(qube, capacity=8, segment=1.0)
    partial.offer([swinging.crop(50, 250)])   # t in [10.5, 12.5)
    assert partial.spans() == [(11.0, pytest.approx(11.99))]


def test_old_cells_are_forgotten_and_clear_empties(qube, swinging):
    memory = SegmentMemory(qube, capacity=4, segment=1.0, max_age=30.0)
    memory.offer([swinging])
    assert len(memory) == 4
    memory.offer([still(38.0, 2.0)])   # the swinging cells are now 26-30 s old: kept
    assert all(start >= 10.0 for start, _ in memory.spans()) and len(memory) == 4
    memory.offer([still(45.0, 1.0)])   # now more than 30 s old: gone, the still cells stay
    assert memory.spans() == [(45.0, pytest.approx(45.99))], memory.spans()
    memory.clear()
    assert len(memory) == 0 and memory.runs() == []
    none = SegmentMemory(qube, capacity=0)
    none.offer([swinging])
    assert len(none) == 0


@pytest.mark.parametrize('kwargs', [{'capacity': -1}, {'segment': 0.0},
                                    {'segment': math.nan}, {'max_age': 0.0},
                                    {'coverage': 1.5}])
def test_bad_settings_are_refused(qube, kwargs):
    with pytest.raises(ValueError):
        SegmentMemory(qube, **kwargs)


def test_data_without_derivatives_are_refused(qube, swinging):
    memory = SegmentMemory(qube)
    with pytest.raises(ValueError, match='velocities and accelerations'):
        memory.offer([swinging.replace(qdd=None)])


def test_a_sliding_window_has_each_cell_weighed_once(qube, swinging, monkeypatch):
    memory = SegmentMemory(qube, capacity=2, segment=1.0)
    weighed = []
    real = memory.information

    def counting(traj):
        weighed.append(float(traj.t[0]))
        return real(traj)
    monkeypatch.setattr(memory, 'information', counting)
    for start in range(0, 201, 50):   # a 2 s window sliding by 0.5 s over the run
        memory.offer([swinging.crop(start, start + 200)])
    assert sorted(weighed) == [10.0, 11.0, 12.0, 13.0]
    memory.clear()                    # forgets what it weighed, too
    memory.offer([swinging])
    assert len(weighed) == 8 and len(memory) == 2
