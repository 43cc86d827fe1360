"""
The online identification engine (``sysid.online``): one loop for the node and the MPC.

Data come from the MuJoCo plant (never our own engine), 30 % off the nominal model.  The
identifier node's path (messages, node clock) and the adaptive MPC's path (``observe``) are
fed the same samples and must take the same decisions; commands a hostile peer scaled by
-3 must be refused before any fit.
"""

import math

from diffsim_ros import robots
from diffsim_ros.control.adaptive import AdaptiveMPC, default_estimator_config
from diffsim_ros.control.dynamics import ModelDynamics
from diffsim_ros.core import load_urdf
from diffsim_ros.nodes.convert import joint_state_msg, sec_to_stamp, stamp_to_sec
from diffsim_ros.nodes.identifier import Identifier
from diffsim_ros.nodes.params import parameter_overrides
from diffsim_ros.sim import excitation_for, MujocoPlant, PlantConfig
from diffsim_ros.sysid import estimators
from diffsim_ros.sysid.online import (driver_check, nominal_result, OnlineConfig,
                                      OnlineEngine, window_runs)
import numpy as np
import pytest
from rclpy.time import Time
from std_msgs.msg import Float64MultiArray
import torch

pytest_plugins = ['ros_helpers']

JOINTS = ('arm_joint', 'pendulum_joint')
HOSTILE = (3.5, 5.5)   # seconds of the run whose recorded commands are scaled by -3


@pytest.fixture(scope='module')
def qube():
    return load_urdf(robots.urdf_path('qube'), dtype=torch.float64)


@pytest.fixture(scope='module')
def run():
    """Seven seconds of a multisine on a Qube 30 % off nominal, at 100 Hz."""
    plant = MujocoPlant(PlantConfig(robot='qube', rate_hz=100.0, param_error=0.3, seed=1))
    return plant.run(excitation_for(plant, 'multisine', duration=7.0))


def recorded_command(run, k, hostile):
    """Return the command the identifier sees at sample k (scaled by -3 when hostile)."""
    u = run.u[k].numpy().copy()
    t = float(run.t[k])
    return -3.0 * u if hostile and HOSTILE[0] <= t < HOSTILE[1] else u


def nea_config(**changes):
    config = {**default_estimator_config('qube', 'nea'), **changes}
    return OnlineConfig(estimator='nea', estimator_config=config, window=5.0, min_window=1.0)


def feed(engine, run, hostile, stop=None):
    for k in range(len(run) if stop is None else stop):
        t = float(run.t[k])
        engine.window.add_command(t, recorded_command(run, k, hostile))
        engine.window.add_state(t, run.q[k].numpy(), run.qd[k].numpy())


@pytest.fixture
def counted_fits(monkeypatch):
    calls = []
    real = estimators.fit

    def counting(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)
    monkeypatch.setattr(estimators, 'fit', counting)
    return calls


def test_commands_scaled_by_minus_three_are_refused_before_a_fit(qube, run, counted_fits):
    clean = OnlineEngine(qube, nea_config())
    feed(clean, run, hostile=False, stop=500)   # 0 .. 5 s
    decision = clean.refit()
    assert decision.accepted, decision
    assert decision.driver.startswith('inputs explain the motion')
    assert len(counted_fits) == 1
    attacked = OnlineEngine(qube, nea_config())
    feed(attacked, run, hostile=True, stop=500)
    decision = attacked.refit()
    assert decision.outcome == 'refused' and decision.warn
    assert 'unexplained' in decision.reason and 'from t = 3.50 s' in decision.reason
    assert len(counted_fits) == 1   # no fit ran on those data
    assert attacked.current is None and len(attacked.memory) == 0
    # a model accepted from clean data does not make the check accept the attack either
    attacked.current = clean.current
    assert attacked.refit().outcome == 'refused'


def test_the_driver_check_says_when_it_cannot_tell(qube):
    engine = OnlineEngine(qube, nea_config())
    for stamp in np.arange(0.0, 3.0, 0.01):   # hanging still, no commands
        engine.window.add_command(stamp, np.zeros(1))
        engine.window.add_state(stamp, np.zeros(2), np.zeros(2))
    decision = engine.refit()
    assert decision.driver.startswith('could not tell'), decision
    assert 'refused before fitting' not in decision.reason   # judged on the held-out data
    runs = window_runs(engine.window, qube.joint_names, engine.config)
    nominal = nominal_result(qube, engine.config.estimator_config, 'u')
    check = driver_check(runs, [nominal], 'u', 0.5, 1.0)
    assert check.verdict == 'unknown' and check.blocks == 0 and math.isnan(check.worst)


def test_candidate_checks_refuse_with_their_reasons(qube, run):
    reasons = []

    def check(candidate):
        reasons.append(candidate.method)
        return ['pendulum_link/m out of its bounds']
    engine = OnlineEngine(qube, nea_config(), check=check)
    feed(engine, run, hostile=False, stop=500)
    decision = engine.refit()
    assert decision.outcome == 'refused' and reasons == ['nea']
    assert decision.checks == ('pendulum_link/m out of its bounds',)
    assert engine.current is None


def test_a_reset_during_a_background_fit_discards_it(qube, run):
    engine = OnlineEngine(qube, nea_config().replace(execution='thread'))
    feed(engine, run, hostile=False, stop=500)
    assert engine.start() is None and engine.busy
    engine.reset()
    decision = engine.refit()   # waits for the running fit
    assert decision.outcome == 'discarded' and engine.current is None
    engine.close()


def test_invalid_options_name_the_field():
    for changes, name in (({'execution': 'cluster'}, 'execution'),
                          ({'prediction_steps': 0}, 'prediction_steps'),
                          ({'holdout_fraction': 1.0}, 'holdout_fraction'),
                          ({'max_unexplained': math.nan}, 'max_unexplained'),
                          ({'estimator': 'magic'}, 'estimator')):
        with pytest.raises(ValueError, match=name):
            OnlineConfig(**changes)


class _Planner:
    """The adaptive MPC's wrapped controller; only its model matters here."""

    def __init__(self, dynamics):
        self.dynamics = dynamics

    def set_model(self, model, friction_model=None):
        self.dynamics = self.dynamics.with_model(model, friction_model=friction_model)

    def reset(self):
        pass


@pytest.fixture
def one_thread():
    """Fit on one torch thread, as the node's refit process does (sysid/online.py)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.ros
def test_node_and_adaptive_paths_take_the_same_decisions(executor, run, one_thread):
    node = executor.add_node(Identifier(
        context=executor.executor.context, node_name='identifier_same',
        parameter_overrides=parameter_overrides({
            # the robot's estimator and its plausibility checks; no wall-time budget, so that
            # both paths run the same iterations however busy the machine is
            'robot': 'qube', 'estimator': 'diffnea', 'window': 3.0, 'min_window': 1.0,
            'refit_process': False, 'use_sim_time': True, 'diffnea.source': 'u',
            'diffnea.actuator': 'qube_servo2', 'diffnea.learn': ['inertial', 'damping', 'coulomb'],
            'diffnea.adam_iterations': 40, 'diffnea.lbfgs_iterations': 2,
            'diffnea.max_seconds': 0.0, 'diffnea.prior_weight': 1e-3})))
    node.frozen = True   # refits only where this test calls them
    config = node.engine.config
    # the adaptive MPC runs exactly the node's engine configuration
    dynamics = ModelDynamics.for_robot('qube', node.nominal, 0.01)
    adaptive = AdaptiveMPC(_Planner(dynamics), refit_every=100, online=config,
                           check=node.engine.check)
    assert adaptive.engine.config == config
    clock = node.get_clock()
    node_status, adaptive_status = [], []
    for k in range(len(run)):
        stamp = sec_to_stamp(1.0 + float(run.t[k]))
        t = stamp_to_sec(stamp)   # the time the node reads from the message
        u = recorded_command(run, k, hostile=True)
        # the command arrives 1 us before the state it acts from, each message when its stamp
        # says (the node times the command 1 us before that state on the states' timeline)
        ns = stamp.sec * 10 ** 9 + stamp.nanosec
        clock.set_ros_time_override(Time(nanoseconds=ns - 1000))
        node._on_command(Float64MultiArray(data=u.tolist()))
        clock.set_ros_time_override(Time(nanoseconds=ns))
        node._on_joint_state(joint_state_msg(JOINTS, run.q[k].numpy(), run.qd[k].numpy(),
                                             None, t))
        before = len(adaptive.decisions)
        adaptive.observe(t, run.q[k], run.qd[k], torch.as_tensor(u))
        if len(adaptive.decisions) > before:
            node.refit()
            node_status.append(node.last)
            adaptive_status.append(adaptive.decisions[-1])
    assert len(adaptive_status) >= 5
    # the same decisions for the same reasons, to the bit: the same engine on the same data
    assert [(d.outcome, d.reason) for d in adaptive_status] == [
        (s['status'].split(':')[0].split()[1], s['status'].split(': ', 1)[1])
        for s in node_status]
    for decision, status in zip(adaptive_status, node_status):
        for key, value in decision.losses.items():
            assert status[f'{key}_heldout_loss'] == pytest.approx(value, rel=1e-9)
    kinds = {d.outcome for d in adaptive_status}
    assert 'accepted' in kinds
    assert any('unexplained' in d.reason for d in adaptive_status)
    torch.testing.assert_close(node.best.model.inertial, adaptive.current_model.inertial)
