"""The mpc node's controller and receding-horizon loop, without ROS (control/planner.py)."""

import math

from diffsim_ros import robots
from diffsim_ros.control.controller import (command_limit, ControllerConfig, make_controller,
                                            safe_command)
from diffsim_ros.control.planner import Planner
from diffsim_ros.control.tasks import get_task, start_state
from diffsim_ros.sysid.losses import command_matrix
import numpy as np
import pytest
import torch

STALE, PLAN = 0.1, 0.5
#: Small, eager solves: a loaded test machine runs each in well under a second.
QUICK = {'controller': 'ilqr', 'horizon': 5, 'iterations': 1, 'compile': False,
         'native': False}


class Log:
    """Collects what the planner warns about."""

    def __init__(self):
        self.lines = []

    def warn(self, key, text):
        self.lines.append((key, text))


def planner_for(robot, **overrides):
    info = robots.get(robot)
    log = Log()
    planner = Planner(info, ControllerConfig(**{**QUICK, **overrides}),
                      robots.interface(robot).nominal_model(), log, STALE, PLAN)
    return planner, log


def start_of_task(robot):
    """Return ``(q, qd)`` where the robot's task starts (on the reference: small commands)."""
    q, qd = start_state(get_task(robot), robots.interface(robot).nominal_model())
    return q.numpy(), qd.numpy()


def test_config_limits_and_safe_command_are_checked_against_the_robot():
    qube = robots.get('qube')
    with pytest.raises(ValueError, match='unknown controller'):
        ControllerConfig(controller='pid')
    with pytest.raises(ValueError, match='mppi_samples'):
        ControllerConfig(mppi_samples=0)
    with pytest.raises(ValueError, match='command_limit needs 1 values'):
        command_limit(qube, ControllerConfig(command_limit=(1.0, 2.0)))
    with pytest.raises(ValueError, match='safe_command needs 1 finite values'):
        safe_command(qube, ControllerConfig(safe_command=(math.nan,)))
    np.testing.assert_array_equal(command_limit(qube, ControllerConfig()), [4.0])
    np.testing.assert_array_equal(safe_command(qube, ControllerConfig(safe_command=(9.0,))),
                                  [4.0])   # clipped to the catalog's 4 V
    with pytest.raises(ValueError, match='no baseline'):
        make_controller(robots.get('wam7'), robots.interface('wam7').nominal_model(),
                        ControllerConfig(controller='baseline'))


@pytest.mark.parametrize('robot', ['wam4', 'panda'])
def test_the_arms_baseline_tracks_its_reference(robot):
    # an arm's baseline is computed torque on the task's gains (it raised KeyError before)
    planner, _ = planner_for(robot, controller='baseline')
    task = get_task(robot)
    model = robots.interface(robot).nominal_model()
    q, qd = start_state(task, model)
    planner.observe(q.numpy(), qd.numpy(), stamp=0.0, received=0.0)
    planner.solve(0.0)
    on_reference, stale = planner.command(0.0)
    assert not stale and np.all(np.isfinite(on_reference))
    # pushed off the reference on the first joint, the command pushes it back
    q_off = q.clone()
    q_off[0] += 0.1
    planner.observe(q_off.numpy(), qd.numpy(), stamp=0.001, received=0.001)
    planner.solve(0.001)
    pushed, _ = planner.command(0.001)
    assert pushed[0] < on_reference[0] - 1.0


def test_safe_command_while_stale_without_a_plan_or_after_the_plan_ended():
    planner, _ = planner_for('qube')
    safe = planner.safe_command
    command, stale = planner.command(0.0)
    assert stale and np.array_equal(command, safe)           # no state yet
    q, qd = np.array([0.3, 0.2]), np.array([0.0, 0.5])
    planner.observe(q, qd, stamp=1.0, received=1.0)
    command, stale = planner.command(1.0)
    assert not stale and np.array_equal(command, safe)       # no plan yet
    assert planner.solve(1.0) is None and planner.stats['solves'] == 1
    policy = planner.policy
    command, stale = planner.command(1.02)
    x = torch.as_tensor(np.concatenate((q, qd)))
    expected = np.clip(policy(0.02, x).numpy(), -4.0, 4.0)   # time from the first state
    assert not stale and np.allclose(command, expected) and np.any(command != safe)
    command, stale = planner.command(1.0 + STALE + 0.01)
    assert stale and np.array_equal(command, safe)
    # fresh again, but the plan ended more than plan_timeout ago: not applied
    later = 1.0 + policy.t0 + policy.horizon * policy.dt + PLAN + 0.05
    planner.observe(q, qd, stamp=later, received=later)
    command, stale = planner.command(later)
    assert not stale and planner.plan_expired and np.array_equal(command, safe)
    # time starts over: the plan is dropped and the next state is the new origin
    planner.restart()
    assert planner.policy is None
    planner.observe(q, qd, stamp=0.5, received=10.0)
    planner.solve(10.0)
    assert planner.policy.t0 == pytest.approx(0.0)
    assert not np.array_equal(planner.command(10.0)[0], safe)


def test_an_offered_model_is_swapped_in_by_the_next_solve():
    planner, _ = planner_for('qube')
    nominal = planner.model
    heavier = nominal.replace(inertial=nominal.inertial * 1.05)
    planner.offer(nominal.replace(inertial=nominal.inertial * 1.5))
    planner.offer(heavier)   # the newer offer replaces one not yet swapped in
    assert planner.model is nominal
    assert planner.solve(0.0) is heavier   # swapped even before the first state
    assert planner.model is heavier and planner.controller.dynamics.model is heavier
    assert planner.stats['models_accepted'] == 1 and planner.solve(0.0) is None


def test_a_gravity_adding_driver_is_sent_what_makes_it_apply_the_planned_torque():
    """Panda: the driver adds g(q); what it then applies must be the plan's torque."""
    planner, _ = planner_for('panda')
    interface, model = robots.interface('panda'), planner.model
    q, qd = start_of_task('panda')
    planner.observe(q, qd, stamp=0.0, received=0.0)
    planner.solve(0.0)
    command, stale = planner.command(0.0)
    assert not stale and np.all(np.abs(command) < planner.limit)   # not clipped
    x = torch.as_tensor(np.concatenate((q, qd)))
    planned = planner.policy(0.0, x) @ command_matrix(model, interface.command_joints).mT
    q_t, qd_t = torch.as_tensor(q), torch.as_tensor(qd)
    applied = interface.motor_torque(model, q_t, qd_t, torch.as_tensor(command))
    torch.testing.assert_close(applied, planned, rtol=1e-9, atol=1e-9)
    gravity = interface.motor_torque(model, q_t, qd_t, torch.zeros(7, dtype=torch.float64))
    assert float(gravity.abs().max()) > 1.0   # the posture holds a real gravity load


def test_a_non_finite_command_is_replaced_by_the_safe_command_counted_and_logged():
    planner, log = planner_for('panda')
    q, qd = start_of_task('panda')
    planner.observe(q, qd, stamp=0.0, received=0.0)
    planner.solve(0.0)
    assert np.all(np.isfinite(planner.command(0.0)[0]))
    broken = planner.model.replace(inertial=planner.model.inertial * math.nan)
    planner.offer(broken)
    planner.solve(0.0)   # the model is in use, whether its solve fails or not
    command, _ = planner.command(0.0)
    assert np.array_equal(command, planner.safe_command)
    assert planner.stats['unsafe_commands'] == 1 and ('command', 'non-finite command '
                                                      'replaced by the safe command') in log.lines


def test_the_baseline_plans_from_the_state_predicted_one_tick_ahead():
    planner, _ = planner_for('qube', controller='baseline', predict_latency=True)
    assert planner.inline
    q, qd = np.array([0.0, math.pi - 0.05]), np.array([0.0, 0.5])   # balancing: LQR
    planner.observe(q, qd, stamp=0.0, received=0.0)
    planner.solve(0.0)   # the state is fresh: one driver tick of 2 ms ahead
    policy = planner.policy
    assert policy.t0 == pytest.approx(1.0 / robots.get('qube').driver_rate_hz)
    x = torch.as_tensor(np.concatenate((q, qd)))
    predicted = planner.controller.dynamics.step(x, torch.zeros(1, dtype=torch.float64))
    command, _ = planner.command(0.0)
    expected = np.clip(policy(0.0, predicted).numpy(), -4.0, 4.0)
    assert np.allclose(command, expected) and not np.allclose(
        command, np.clip(policy(0.0, x).numpy(), -4.0, 4.0))


def test_a_command_without_its_solve_acts_on_the_newest_state_not_the_last_prediction():
    # The mpc node skips an inline solve when its command thread runs late (nodes/mpc.py):
    # the command then evaluates the last law on the newest measured state.
    planner, _ = planner_for('qube', controller='baseline', predict_latency=True)
    q, qd = np.array([0.0, math.pi - 0.05]), np.array([0.0, 0.5])   # balancing: LQR
    planner.observe(q, qd, stamp=0.0, received=0.0)
    planner.solve(0.0)
    policy = planner.policy
    newer_q, newer_qd = np.array([0.02, math.pi - 0.03]), np.array([0.1, 0.4])
    planner.observe(newer_q, newer_qd, stamp=0.002, received=0.002)   # no solve for it
    command, _ = planner.command(0.002)
    newest = torch.as_tensor(np.concatenate((newer_q, newer_qd)))
    assert np.allclose(command, np.clip(policy(0.002, newest).numpy(), -4.0, 4.0))
    assert not np.allclose(command, np.clip(policy(0.002, planner._x_solved).numpy(),
                                            -4.0, 4.0))
