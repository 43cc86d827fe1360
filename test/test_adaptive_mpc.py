"""
Adaptive MPC loop: the online engine's window, refits, and what it accepts and refuses.

Data come from the MuJoCo plant (never our own engine) with parameters 30 % off the nominal
model, driven by a cheap controller (the energy swing-up baseline) so the file stays fast; the
iLQR-wrapped loop is exercised end to end by ``test_sim_eval.py``.
"""

import dataclasses
import math

from diffsim_ros.control.adaptive import (AdaptiveConfig, AdaptiveMPC,
                                          default_estimator_config, parameter_error,
                                          SAMPLE_LOOP)
from diffsim_ros.control.baselines import SwingUpLQR
from diffsim_ros.control.dynamics import ModelDynamics
from diffsim_ros.sim import MujocoPlant, nominal_model, PlantConfig
from diffsim_ros.sysid import estimators
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
    kwargs = {'min_samples': 150, 'max_samples': 500, **kwargs}
    adaptive = AdaptiveMPC(baseline, 'nea', refit_every=200,
                           estimator_config=default_estimator_config('qube', 'nea'),
                           truth=lambda: plant.true_model, **kwargs)
    return plant, model, adaptive


def test_refit_on_plant_data_reduces_the_parameter_error_quickly():
    plant, model, adaptive = _qube_loop(seed=21)
    _drive(plant, adaptive, 1.0)
    assert adaptive.attempts >= 1 and adaptive.refits >= 1
    first = next(h for h in adaptive.history if h['accepted'])
    assert first['fit_s'] < 5.0
    before = parameter_error(model, plant.true_model)
    after = parameter_error(adaptive.current_model, plant.true_model)
    assert after < 0.5 * before, (before, after)
    assert adaptive.controller.dynamics.model is adaptive.current_model
    assert adaptive.history[-1]['param_error'] == pytest.approx(after)


def test_a_wrong_candidate_is_refused_and_a_good_one_accepted(monkeypatch):
    # The estimator is replaced by one that returns a chosen model, so the test decides
    # what the engine is offered: the plant's true model (good: it must replace the nominal
    # model, 30 % off), then wrong ones that the nominal model would not beat but the truth
    # in use does (three times the rotational inertias; a third of the pendulum, what a
    # hostile peer's commands made the identifier accept).  Only the engine's judgement on
    # the simulated data decides.
    plant, model, adaptive = _qube_loop(seed=22)
    offered = []

    def offer(name, model, train, validation, config, warm_start=None):
        result = real_fit(name, model, train, validation, config, warm_start=warm_start)
        return dataclasses.replace(result, model=offered[-1])
    real_fit = estimators.fit
    monkeypatch.setattr(estimators, 'fit', offer)
    truth = plant.true_model
    offered.append(truth)
    _drive(plant, adaptive, 0.45)               # one refit, at 200 samples
    assert [h['outcome'] for h in adaptive.history] == ['accepted']
    assert adaptive.current_model is not model
    assert parameter_error(adaptive.current_model, truth) < 1e-9
    pi = truth.inertial
    for wrong in (torch.cat((pi[:, :4], 3.0 * pi[:, 4:]), -1),        # rotational inertias
                  torch.cat((pi[:1], pi[1:] / 3.0))):                 # a third of the pendulum
        offered.append(truth.replace(inertial=wrong))
        _drive(plant, adaptive, 0.45)           # a new episode: one more refit
        assert adaptive.history[-1]['outcome'] == 'refused', adaptive.history[-1]
        assert adaptive.history[-1]['candidate_heldout_loss'] > 0.0
    assert adaptive.refits == 1
    assert parameter_error(adaptive.current_model, truth) < 1e-9


def test_window_runs_episodes_and_split():
    from diffsim_ros.sysid.online import split_newest, usable_runs, window_runs
    model = nominal_model('qube')
    dynamics = ModelDynamics.for_robot('qube', model, 0.002)
    adaptive = AdaptiveMPC(Recorder(dynamics), refit_every=10 ** 6, min_samples=10,
                           max_samples=500, holdout_fraction=0.25)
    for episode in range(2):
        adaptive.reset()
        for k in range(300):
            t = 0.002 * k
            q = torch.tensor([0.1 * t, 0.0], dtype=F64)
            qd = torch.tensor([0.1 + t, 0.0], dtype=F64)
            adaptive.observe(t, q, qd, torch.tensor([0.5], dtype=F64))
    assert adaptive.samples == 500 and adaptive.controller.resets == 2
    config = adaptive.engine.config
    runs = window_runs(adaptive.engine.window, model.joint_names, config)
    # two episodes are two runs, never differentiated across
    assert len(runs) == 2
    assert float(runs[1].t[0]) - float(runs[0].t[-1]) > 0.2
    for run in runs:
        torch.testing.assert_close(run.qdd[:, 0], torch.ones(len(run), dtype=F64))
        torch.testing.assert_close(run.u, torch.full((len(run), 1), 0.5, dtype=F64))
    usable = usable_runs(runs, model, config)
    # the derivative filter's edge transient (2 / cutoff s) is left out at both ends of a run
    pad = 2.0 / config.derivative_cutoff_hz
    for run, part in zip(runs, usable):
        assert float(part.t[0]) - float(run.t[0]) == pytest.approx(pad, abs=0.0021)
        assert float(run.t[-1]) - float(part.t[-1]) == pytest.approx(pad, abs=0.0021)
    train, heldout = split_newest(usable, 0.25, 11)
    assert float(heldout[0].t[0]) > float(train[-1].t[-1])
    assert sum(len(r) for r in heldout) == round(0.25 * sum(len(r) for r in usable))
    # non-finite samples are not buffered; a sample at a joint limit is, but refits leave
    # it out with the filter transient around it
    adaptive.observe(1.0, torch.tensor([math.nan, 0.0]), torch.zeros(2), torch.zeros(1))
    assert adaptive.samples == 500
    for k in range(200):
        arm = 2.0 if k == 100 else 0.5
        adaptive.observe(2.0 + 0.002 * k, torch.tensor([arm, 0.0]), torch.zeros(2),
                         torch.zeros(1))
    runs = window_runs(adaptive.engine.window, model.joint_names, config)
    kept = torch.cat([r.t for r in usable_runs(runs, model, config)])
    [stop] = [s[0] for s in adaptive.engine.window.states if s[1][0] == 2.0]
    near = (torch.cat([r.t for r in runs]) - stop).abs() <= 0.1
    assert bool(near.any()) and not bool(((kept - stop).abs() <= 0.1).any())


def test_informative_cells_outlive_the_buffer_and_join_the_fits(monkeypatch):
    plant, model, adaptive = _qube_loop(seed=21, memory_segments=2, memory_segment=0.5)
    seen = []
    real_fit = estimators.fit

    def recording(name, model, train, validation, config, warm_start=None):
        seen.append([run.run for run in train])
        return real_fit(name, model, train, validation, config, warm_start=warm_start)
    monkeypatch.setattr(estimators, 'fit', recording)
    _drive(plant, adaptive, 1.8)                  # the swing-up: informative
    swing_end = adaptive.engine.window.states[-1][0]
    assert len(adaptive.memory) == 2
    # a second episode (its clock restarts at 0) holding still for twice the buffer
    adaptive.reset()
    for k in range(1000):
        adaptive.observe(0.002 * k, torch.zeros(2, dtype=F64), torch.zeros(2, dtype=F64),
                         torch.zeros(1, dtype=F64))
    times = [sample[0] for sample in adaptive.engine.window.states]
    assert times == sorted(times) and times[0] > swing_end
    # the swing's cells are kept (still data tell only the gravity terms), and the last fit,
    # on a buffer of still data only, saw them
    assert all(end <= swing_end for _, end in adaptive.memory.spans()), adaptive.memory.spans()
    assert sum(name.startswith('memory/') for name in seen[-1]) == 2


def test_background_refit_swaps_the_model_later():
    plant, model, adaptive = _qube_loop(seed=21, execution='thread')
    measurement = plant.reset()
    for k in range(500):   # refits due at 200 and 400 (0.1 s at each window end is left out)
        x = torch.cat((torch.tensor(measurement.q), torch.tensor(measurement.qd)))
        u = adaptive.solve(x, measurement.t)(measurement.t, x)
        adaptive.observe(measurement.t, x[:plant.n], x[plant.n:], u)
        if k == 199:
            # the refit due now (refit_every) was handed to the worker thread: its decision
            # is taken at a later observe or solve, never in the call that started it
            assert adaptive.engine.busy and adaptive.attempts == 0
        measurement = plant.step(u.numpy())
    adaptive.close()
    assert not adaptive.engine.busy and adaptive.attempts >= 1
    assert adaptive.refits >= 1 and adaptive.current_model is not model


def test_parameter_error_is_zero_for_the_truth_and_scales_with_the_error():
    model = nominal_model('wam4')
    assert parameter_error(model, model) == 0.0
    scaled = model.replace(inertial=model.inertial * 1.3)
    assert parameter_error(scaled, model) == pytest.approx(0.3, rel=0.05)


def test_invalid_options_raise():
    with pytest.raises(ValueError, match='refit_every'):
        AdaptiveConfig(refit_every=0)
    with pytest.raises(ValueError, match='OnlineConfig'):
        AdaptiveConfig(online={'window': 5.0})
    # the engine's options given to the loop reach the engine's own checks
    dynamics = ModelDynamics.for_robot('qube', nominal_model('qube'), 0.002)
    for options, message in (({'estimator': 'magic'}, 'unknown estimator'),
                             ({'holdout_fraction': 1.0}, 'holdout_fraction'),
                             ({'min_samples': 100, 'max_samples': 50}, 'max_samples'),
                             ({'estimator_config': {'no_such_key': 1}}, 'no_such_key'),
                             ({'memory_segments': -1}, 'memory_segments'),
                             ({'memory_segment': 0.0}, 'memory_segment')):
        with pytest.raises(ValueError, match=message):
            AdaptiveMPC(Recorder(dynamics), **options)
    with pytest.raises(TypeError, match='buffer_size'):   # not an option of the engine
        AdaptiveMPC(Recorder(dynamics), buffer_size=500)


def test_the_loop_runs_the_engine_options_it_is_given():
    dynamics = ModelDynamics.for_robot('qube', nominal_model('qube'), 0.002)
    adaptive = AdaptiveMPC(Recorder(dynamics))
    assert adaptive.engine.config == SAMPLE_LOOP and adaptive.config.refit_every == 100
    # another estimator starts from its own defaults, not from the configuration of 'nea'
    other = AdaptiveMPC(Recorder(dynamics), 'diffnea', refit_every=7, max_samples=300)
    assert other.engine.config == SAMPLE_LOOP.replace(estimator='diffnea',
                                                      estimator_config=None, max_samples=300)
    assert other.config.refit_every == 7
