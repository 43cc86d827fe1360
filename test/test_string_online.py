"""The string's refit engine (the identifier's cup mode) on data of a known string."""

import math

from diffsim_ros import robots
from diffsim_ros.core import load_urdf
from diffsim_ros.sysid.string_model import StringModel
from diffsim_ros.sysid.string_online import (ball_prediction_error, ball_runs, StringEngine,
                                             StringOnlineConfig, UNITS)
import numpy as np
import pytest
import torch

RATE = 500.0
TRUTH = {'length': 0.43, 'xyz': (0.01, -0.015, 0.07), 'friction': 0.02}


@pytest.fixture(scope='module')
def robot():
    return load_urdf(str(robots.urdf_path('wam4')), dtype=torch.float64)


def swing(robot, seconds):
    """Return t, q, qd and the ball of slow cosines swinging a known string (no swing-up)."""
    truth = StringModel(robot, TRUTH['length'], TRUTH['xyz'], (0.0, 0.0, 0.0),
                        TRUTH['friction'])
    t = torch.arange(0.0, seconds, 1.0 / RATE, dtype=torch.float64)
    amplitude = torch.tensor([0.3, 0.15, 0.25, 0.2], dtype=torch.float64)
    omega = 2 * math.pi * torch.tensor([0.35, 0.5, 0.6, 0.45], dtype=torch.float64)
    ramp = (t / 2.0).clamp(max=1.0)[:, None]
    q = torch.tensor([0.0, 0.0, 0.0, 1.2], dtype=torch.float64) + \
        ramp * amplitude * (1.0 - torch.cos(omega * t[:, None]))
    qd = torch.gradient(q, spacing=(t,), dim=0)[0]
    qdd = torch.gradient(qd, spacing=(t,), dim=0)[0]
    with torch.no_grad():
        p, v, a = truth.cup_motion(q, qd, qdd)
        x0 = p[0] - torch.tensor([0.0, 0.0, TRUTH['length']], dtype=torch.float64)
        ball, _ = truth.rollout(x0[None], torch.zeros(1, 3, dtype=torch.float64), p[None],
                                v[None], a[None], 1.0 / RATE)
    return t.numpy(), q.numpy(), qd.numpy(), ball[0].numpy()


def test_runs_are_cut_at_gaps_and_resampled_on_the_states():
    states = [(0.01 * k, np.full(2, 0.01 * k), np.ones(2)) for k in range(300)]
    balls = [(0.01 * k + 0.003, np.array([0.01 * k, 0.0, 1.0])) for k in range(300)
             if not 100 <= k < 110]
    runs = ball_runs(states, balls, max_gap=0.05)
    assert [len(r) for r in runs] == [100, 189]   # the last ball is after the last state
    for run in runs:
        assert np.allclose(np.diff(run.t), 0.01)
        # the states interpolated onto the ball's stamps, the ball kept where it was
        assert np.allclose(run.q[:, 0], run.t) and np.allclose(run.ball[:, 0], run.t - 0.003)


def test_the_engine_learns_a_known_string_and_its_spread(robot):
    t, q, qd, ball = swing(robot, 15.0)
    nominal = StringModel(robot)
    config = StringOnlineConfig(window=15.0, min_window=14.0, refit_every=10.0,
                                iterations=20, bootstrap=3, execution='inline')
    engine = StringEngine(robot, nominal, config)
    decisions = []
    for k in range(len(t)):
        engine.add_state(t[k], q[k], qd[k])
        if engine.add_ball(t[k], ball[k]):
            decisions.append(engine.refit())
    assert [d.outcome for d in decisions] == ['accepted'], [d.reason for d in decisions]
    decision = decisions[0]
    values = engine.values()
    assert abs(values['string_length'] - TRUTH['length']) < 0.003, values
    assert np.allclose([values[f'cup_{c}'] for c in 'xyz'], TRUTH['xyz'], atol=0.003), values
    # the candidate predicts the held-out ball far better than the nominal string
    assert decision.losses['candidate'] < 0.01 * decision.losses['nominal'], decision.losses
    document = decision.result.to_dict()
    assert set(document['parameters']) == set(UNITS)
    assert document['parameters']['string_length']['unit'] == 'm'
    assert 0.0 < document['parameters']['string_length']['std'] < 0.01
    # nothing left to fit: waiting, and a restart forgets the window but keeps the string
    assert engine.refit().outcome == 'waiting'
    engine.restart()
    assert not engine.states and not engine.balls and engine.values() == values


def test_prediction_error_is_zero_for_the_truth_and_not_for_another(robot):
    t, q, qd, ball = swing(robot, 4.0)
    runs = ball_runs(list(zip(t, q, qd)), list(zip(t, ball)), 0.05)
    truth = StringModel(robot, TRUTH['length'], TRUTH['xyz'], (0.0, 0.0, 0.0),
                        TRUTH['friction'])
    exact = ball_prediction_error(truth, runs, 250)
    off = ball_prediction_error(StringModel(robot), runs, 250)
    # from smoothed observed velocities the truth is not exact, but 2 orders below
    assert exact < 1e-2 * off, (exact, off)


@pytest.mark.parametrize('change, message', [
    ({'min_window': 50.0}, 'exceeds window'), ({'holdout_fraction': 1.0}, 'holdout'),
    ({'execution': 'gpu'}, 'execution'), ({'bootstrap_scale': 0.0}, 'bootstrap_scale'),
    ({'max_gap': math.nan}, 'max_gap'), ({'horizon': 0}, 'horizon'),
])
def test_config_refuses_bad_values(change, message):
    with pytest.raises(ValueError, match=message):
        StringOnlineConfig(**change)


def test_a_refit_in_a_child_process_gives_the_same_string(robot):
    # the production path (config/wam4_cup.yaml: execution process): the job pickles
    t, q, qd, ball = swing(robot, 13.0)
    found = {}
    for execution in ('inline', 'process'):
        config = StringOnlineConfig(window=13.0, min_window=12.0, geometry_iterations=50,
                                    iterations=5, bootstrap=2, execution=execution)
        engine = StringEngine(robot, StringModel(robot), config)
        for k in range(0, len(t), 5):
            engine.add_state(t[k], q[k], qd[k])
            if engine.add_ball(t[k], ball[k]):
                assert engine.refit().outcome == 'accepted'
        engine.close()
        found[execution] = engine.values()
    assert found['process'] == pytest.approx(found['inline'], rel=1e-9, abs=1e-12)
