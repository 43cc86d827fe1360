"""
Adaptive MPC loop: replay buffer, refits accepted only when they predict held-out data better.

Data come from the MuJoCo plant (never our own engine) with parameters 30 % off the nominal
model, driven by a cheap controller (the energy swing-up baseline) so the file stays fast; the
iLQR-wrapped loop is exercised end to end by ``test_sim_eval.py``.
"""

import math

from diffsim_ros.control.adaptive import (AdaptiveConfig, AdaptiveMPC,
                                          default_estimator_config, parameter_error)
from diffsim_ros.control.baselines import SwingUpLQR
from diffsim_ros.control.dynamics import ModelDynamics
from diffsim_ros.sim import MujocoPlant, nominal_model, PlantConfig
import pytest
import torch

F64 = torch.float64


class Recorder:
    """A controller stub that counts calls and applies a constant command."""

    def __init__(self, dynamics):
        self.dynamics = dynamics
        self.models, self.resets = [], 0

    def solve(self, x0, t=0.0):
        from diffsim_ros.control.policy import FeedbackPolicy
        return FeedbackPolicy.constant(0.5, self.dynamics.nx, self.dynamics.u_min,
                                       self.dynamics.u_max, t0=t, dt=self.dynamics.dt)

    def set_model(self, model):
        self.models.append(model)
        self.dynamics = self.dynamics.with_model(model)

    def reset(self):
        self.resets += 1


def _drive(plant, controller, seconds, every=5):
    measurement = plant.reset()
    policy = None
    for k in range(int(round(seconds * plant.rate_hz))):
        x = torch.cat((torch.tensor(measurement.q), torch.tensor(measurement.qd)))
        if policy is None or k % every == 0:
            policy = controller.solve(x, measurement.t)
        u = policy(measurement.t, x)
        controller.observe(measurement.t, x[:plant.n], x[plant.n:], u)
        measurement = plant.step(u.numpy())


def _qube_loop(seed, **kwargs):
    plant = MujocoPlant(PlantConfig(robot='qube', param_error=0.3, seed=seed))
    model = nominal_model('qube')
    dynamics = ModelDynamics.for_robot('qube', model, 1.0 / plant.rate_hz)
    baseline = SwingUpLQR(dynamics, 'pendulum_joint', 'arm_joint', energy_gain=150.0,
                          max_acceleration=60.0, centering=(1.0, 0.3), energy_target=0.2)
    adaptive = AdaptiveMPC(baseline, 'nea', refit_every=200, min_samples=150, buffer_size=500,
                           estimator_config=default_estimator_config('qube', 'nea'),
                           truth=lambda: plant.true_model, **kwargs)
    return plant, model, adaptive


def test_refit_on_plant_data_reduces_the_parameter_error_quickly():
    plant, model, adaptive = _qube_loop(seed=21)
    _drive(plant, adaptive, 1.0)
    assert adaptive.attempts >= 1 and adaptive.refits >= 1
    first = next(h for h in adaptive.history if h['accepted'])
    assert first['error_new'] < first['error_current']
    assert first['fit_time_s'] < 5.0
    before = parameter_error(model, plant.true_model)
    after = parameter_error(adaptive.current_model, plant.true_model)
    assert after < 0.5 * before, (before, after)
    assert adaptive.controller.dynamics.model is adaptive.current_model
    assert adaptive.history[-1]['param_error'] == pytest.approx(after)


def test_a_worse_fit_is_rejected_and_the_model_kept():
    plant, model, adaptive = _qube_loop(seed=22)
    # Make the candidate useless: an estimator that learns nothing but friction columns
    # from a nominal start cannot beat a current model that already is the truth.
    adaptive.set_model(plant.true_model)
    _drive(plant, adaptive, 0.6)
    assert adaptive.attempts >= 1
    rejected = [h for h in adaptive.history if not h['accepted']]
    assert rejected and adaptive.current_model is plant.true_model
    assert adaptive.refits == len(adaptive.history) - len(rejected)


def test_buffer_segments_and_split():
    model = nominal_model('qube')
    dynamics = ModelDynamics.for_robot('qube', model, 0.002)
    adaptive = AdaptiveMPC(Recorder(dynamics), refit_every=10 ** 6, min_samples=10,
                           buffer_size=40, validation_fraction=0.5)
    for episode in range(2):
        adaptive.reset()
        for k in range(30):
            t = 0.002 * k
            q = torch.tensor([0.1 * t, 0.0], dtype=F64)
            qd = torch.tensor([0.1 + t, 0.0], dtype=F64)
            adaptive.observe(t, q, qd, torch.tensor([0.5], dtype=F64))
    assert adaptive.samples == 40 and adaptive.controller.resets == 2
    runs = adaptive.trajectories()
    assert [len(r) for r in runs] == [9, 29]      # two segments, last sample dropped
    torch.testing.assert_close(runs[1].qdd[:, 0], torch.ones(29, dtype=F64))
    train, validation = adaptive.split()
    assert [len(r) for r in train] == [9, 10] and [len(r) for r in validation] == [19]
    assert float(validation[0].t[0]) > float(train[-1].t[-1])
    # Non-finite samples and samples at a joint limit are not buffered.
    adaptive.observe(1.0, torch.tensor([math.nan, 0.0]), torch.zeros(2), torch.zeros(1))
    adaptive.observe(1.0, torch.tensor([2.0, 0.0]), torch.zeros(2), torch.zeros(1))
    assert adaptive.samples == 40


def test_informative_cells_outlive_the_buffer_and_join_the_fits(monkeypatch):
    from diffsim_ros.control import adaptive as adaptive_module
    plant, model, adaptive = _qube_loop(seed=21, config=AdaptiveConfig(
        estimator='nea', memory_segments=2, memory_segment=0.5))
    seen = []
    real_fit = adaptive_module.estimators.fit

    def recording(name, model, train, validation, config, warm_start=None):
        seen.append([run.run for run in train])
        return real_fit(name, model, train, validation, config, warm_start=warm_start)
    monkeypatch.setattr(adaptive_module.estimators, 'fit', recording)
    _drive(plant, adaptive, 1.5)                  # the swing-up: informative
    swing_end = adaptive._buffer[-1][0]
    assert len(adaptive.memory) == 2
    # a second episode (its clock restarts at 0) holding still for twice the buffer
    adaptive.reset()
    for k in range(1000):
        adaptive.observe(0.002 * k, torch.zeros(2, dtype=F64), torch.zeros(2, dtype=F64),
                         torch.zeros(1, dtype=F64))
    times = [sample[0] for sample in adaptive._buffer]
    assert times == sorted(times) and times[0] > swing_end
    # the swing's cells are kept (still data tell only the gravity terms), and the last fit,
    # on a buffer of still data only, saw them
    assert all(end <= swing_end for _, end in adaptive.memory.spans()), adaptive.memory.spans()
    assert sum(name.startswith('memory/') for name in seen[-1]) == 2


def test_background_refit_swaps_the_model_later():
    plant, model, adaptive = _qube_loop(seed=21, config=AdaptiveConfig(
        estimator='nea', estimator_config=default_estimator_config('qube', 'nea'),
        refit_every=200, min_samples=150, buffer_size=500, background=True))
    _drive(plant, adaptive, 0.6)
    adaptive.close()
    assert adaptive.attempts >= 1
    assert adaptive.refits >= 1 and adaptive.current_model is not model


def test_parameter_error_is_zero_for_the_truth_and_scales_with_the_error():
    model = nominal_model('wam4')
    assert parameter_error(model, model) == 0.0
    scaled = model.replace(inertial=model.inertial * 1.3)
    assert parameter_error(scaled, model) == pytest.approx(0.3, rel=0.05)


def test_invalid_options_raise():
    with pytest.raises(ValueError, match='unknown estimator'):
        AdaptiveConfig(estimator='magic')
    with pytest.raises(ValueError, match='refit_every'):
        AdaptiveConfig(refit_every=0)
    with pytest.raises(ValueError, match='validation_fraction'):
        AdaptiveConfig(validation_fraction=1.0)
    with pytest.raises(ValueError, match='buffer_size'):
        AdaptiveConfig(min_samples=100, buffer_size=50)
    with pytest.raises(ValueError):
        AdaptiveConfig(estimator='nea', estimator_config={'no_such_key': 1})
    with pytest.raises(ValueError, match='memory_segments'):
        AdaptiveConfig(memory_segments=-1)
    with pytest.raises(ValueError, match='memory_segment'):
        AdaptiveConfig(memory_segment=0.0)
