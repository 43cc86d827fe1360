"""
``diffsim-sim-eval``: argument validation, the JSON record, and the acceptance claim (slow).

The fast tests run fractions of a second of simulated time; the slow one runs the issue's
acceptance experiment (adaptive MPC succeeds within 3 episodes on plants 30 % off where the
nominal MPC fails or is clearly worse) on seeds that are not the ones reported.
"""

import json
import re

from diffsim_ros import robots
from diffsim_ros.control.tasks import get_task, reference
from diffsim_ros.sim import nominal_model
from diffsim_ros.sim_eval import (control_model, main, make_controller, PARAM_ERROR_DEFINITION,
                                  parse_args)
from diffsim_ros.sysid.result import IdentificationResult
import pytest
import torch


@pytest.mark.parametrize('argv', [
    ['--robot', 'wam7'], ['--controller', 'lqr'], ['--episodes', '0'],
    ['--param-error', '1.5'], ['--seed', '-1'], ['--duration', '0'],
    ['--estimator', 'magic'],
])
def test_bad_arguments_exit_with_status_2(argv, capsys):
    with pytest.raises(SystemExit) as excinfo:
        main(argv)
    assert excinfo.value.code == 2
    assert 'error' in capsys.readouterr().err


def test_help_says_what_the_exit_statuses_mean(capsys):
    with pytest.raises(SystemExit) as excinfo:
        main(['--help'])
    text = ' '.join(capsys.readouterr().out.split())
    assert excinfo.value.code == 0
    assert 'exit status: 0 the evaluation ran' in text and '2 bad arguments' in text


def test_baseline_episode_writes_the_json_record(tmp_path, capsys):
    path = tmp_path / 'out' / 'qube.json'
    assert main(['--robot', 'qube', '--controller', 'baseline', '--episodes', '2',
                 '--duration', '0.2', '--seed', '3', '--json', str(path)]) == 0
    record = json.loads(path.read_text())
    for key in ('success_rate', 'episodes', 'mean_swing_up_time_s', 'refits',
                'final_param_error', 'param_error_definition', 'nominal_param_error'):
        assert key in record
    assert len(record['episodes']) == 2 and record['success_rate'] == 0.0
    episode = record['episodes'][0]
    for key in ('success', 'swing_up_time_s', 'refits', 'param_error', 'max_position'):
        assert key in episode
    assert record['refits'] == 0
    assert record['final_param_error'] == pytest.approx(record['nominal_param_error'])
    assert record['param_error_definition'] == PARAM_ERROR_DEFINITION
    lines = capsys.readouterr().out.splitlines()
    # what it runs, before anything runs; then the kernel, then progress in simulated time
    assert lines[0].startswith('diffsim-sim-eval: baseline on one simulated qube')
    assert '2 episode(s) of 0.2 s simulated' in lines[0] and 'seed 3' in lines[0]
    assert lines[1].startswith('preparing the native kernel')
    assert lines[2].startswith('native kernel ')
    progress = [line for line in lines if line.startswith('  episode ')]
    assert [line.split(':')[0] for line in progress] == ['  episode  0'] * 4 + \
        ['  episode  1'] * 4
    assert [line.split()[2] for line in progress[:4]] == ['0.04', '0.08', '0.12', '0.16']
    assert [line.split()[1] for line in lines if line.startswith('episode ')] == ['0', '1']
    assert lines[-1].startswith('success rate 0.00  mean swing-up time -  refits 0')
    _assert_rounded(lines)


def _assert_rounded(lines):
    """No raw float (``2.21705596560012``): at most 4 decimals, at most 4 significant digits."""
    for line in lines[1:]:
        for number in re.findall(r'\d+\.\d+', line):
            assert len(number.split('.')[1]) <= 4, line
            assert len(number.replace('.', '').lstrip('0')) <= 4, line


def test_adaptive_mpc_refits_during_a_short_episode(tmp_path):
    # the identifier's Qube settings (config/qube.yaml): DiffNEA, first refit after 2 s of
    # data, then every 0.5 s
    path = tmp_path / 'adaptive.json'
    assert main(['--robot', 'qube', '--controller', 'adaptive-mpc', '--episodes', '1',
                 '--duration', '2.6', '--quick', '--seed', '4', '--json', str(path)]) == 0
    record = json.loads(path.read_text())
    assert record['estimator'] == 'diffnea'
    fits = [entry['t'] for entry in record['refit_history']]
    assert fits and min(fits) >= 2.0 - 0.01   # nothing fit before 2 s of data
    assert record['refits'] >= 1
    assert record['final_param_error'] < 0.5 * record['nominal_param_error']
    assert record['episodes'][0]['refits'] == record['refits']


def _result(model):
    return IdentificationResult(method='diffnea', model=model, parameters={}, std={},
                                history={}, metrics={})


@pytest.mark.parametrize('robot', ['qube', 'panda'])
def test_adaptive_mpc_refuses_what_the_robot_interface_refuses(robot):
    # sim-eval's loop gates candidates with the robot's checks, as the identifier node does
    task = get_task(robot)
    nominal = robots.interface(robot).nominal_model()
    model = control_model(robot, nominal)
    controller, _ = make_controller('adaptive-mpc', task, model, 500.0, quick=True)
    check = controller.engine.check
    # the Panda's control model is gravity-free (its driver adds gravity): not a reason
    assert check(_result(model)) == []
    heavy = model.replace(inertial=model.inertial * torch.tensor(
        [1000.0] + [1.0] * 9, dtype=model.dtype))
    reasons = check(_result(heavy))
    assert reasons and all('/m' in reason or 'mass' in reason for reason in reasons), reasons
    assert robots.interface(robot).check_model(heavy.replace(gravity=nominal.gravity))


def test_energy_baseline_swings_up_the_nominal_mujoco_qube(tmp_path, capsys):
    path = tmp_path / 'baseline.json'
    assert main(['--robot', 'qube', '--controller', 'baseline', '--episodes', '1',
                 '--param-error', '0.0', '--duration', '5.5', '--json', str(path)]) == 0
    record = json.loads(path.read_text())
    episode = record['episodes'][0]
    assert episode['success'] and episode['within_limit']
    assert episode['swing_up_time_s'] < 4.5
    # the summary gives the swing-up time to 3 significant digits, not the raw float
    summary = capsys.readouterr().out.splitlines()[-1]
    assert f'mean swing-up time {record["mean_swing_up_time_s"]:.3g} s' in summary, summary
    _assert_rounded([summary])


def test_tracking_json_has_the_rms(tmp_path):
    path = tmp_path / 'wam.json'
    assert main(['--robot', 'wam4', '--controller', 'baseline', '--episodes', '1',
                 '--duration', '0.3', '--seed', '2', '--json', str(path)]) == 0
    record = json.loads(path.read_text())
    assert record['tracking_rms'] == pytest.approx(record['episodes'][0]['tracking_rms'])
    assert 'tracking_rms_per_joint' in record['episodes'][0]


def test_adaptive_mpc_identifies_the_panda_behind_its_gravity_compensating_driver(tmp_path):
    # the driver adds the plant's gravity to every command, so the loop fits the
    # gravity-free control model from the commands (seed 101: not one of the reported seeds);
    # the identifier's Panda settings refit every 1 s once 3 s of data are (fits at 4, 5 and 6 s)
    path = tmp_path / 'panda.json'
    assert main(['--robot', 'panda', '--controller', 'adaptive-mpc', '--episodes', '1',
                 '--duration', '6.2', '--quick', '--seed', '101', '--json', str(path)]) == 0
    record = json.loads(path.read_text())
    assert record['refits'] >= 2 and record['success_rate'] == 1.0
    assert record['final_param_error'] < 0.25 * record['nominal_param_error']
    # every model the loop accepted (judged by its held-out prediction, not by this error)
    model_error = [entry['param_error'] for entry in record['refit_history']
                   if entry['accepted']]
    assert max(model_error) < 0.25 * record['nominal_param_error']


def test_the_panda_plans_without_gravity_since_its_driver_adds_it():
    model = control_model('panda', nominal_model('panda'))
    torch.testing.assert_close(model.gravity, torch.zeros(3, dtype=model.dtype))
    wam = nominal_model('wam4')   # its driver adds nothing: the model keeps its gravity
    torch.testing.assert_close(control_model('wam4', wam).gravity, wam.gravity)
    assert float(wam.gravity.norm()) == pytest.approx(9.81)


@pytest.mark.slow
def test_adaptive_baseline_refits_the_plant_between_and_within_episodes(tmp_path):
    # the adaptive loop around the energy baseline identifies the plant (seed 101:
    # inverse-dynamics error -> 0.009 in one episode); see the slow test below for control
    path = tmp_path / 'adaptive-baseline.json'
    assert main(['--robot', 'qube', '--controller', 'adaptive-baseline', '--episodes', '2',
                 '--param-error', '0.3', '--seed', '101', '--duration', '4.0',
                 '--json', str(path)]) == 0
    record = json.loads(path.read_text())
    assert record['episodes'][0]['refits'] >= 1 and record['refit_history']
    assert record['final_param_error'] < 0.7 * record['nominal_param_error']


@pytest.mark.slow
def test_refitting_rescues_the_baseline_where_the_plants_balance_point_is_off(tmp_path):
    # Seed 6: the plant's pendulum centre of mass sits off the rod, so it balances 0.33 rad
    # from the URDF's upright. The nominal baseline catches the pendulum there but its LQR,
    # balancing at pi, pushes the arm past its travel; the refitted model knows the balance
    # point and the identified gain holds it with the arm near the centre.
    results = {}
    for controller, episodes in (('baseline', 1), ('adaptive-baseline', 2)):
        path = tmp_path / f'{controller}.json'
        assert main(['--robot', 'qube', '--controller', controller, '--episodes',
                     str(episodes), '--param-error', '0.3', '--seed', '6',
                     '--json', str(path)]) == 0
        results[controller] = json.loads(path.read_text())
    assert results['baseline']['success_rate'] == 0.0
    assert not results['baseline']['episodes'][0]['within_limit']
    adaptive = results['adaptive-baseline']['episodes']
    # the model refitted in the first episode (the identifier's loop: after 2 s of data)
    assert results['adaptive-baseline']['refits'] >= 1 and adaptive[-1]['success']
    assert adaptive[-1]['final_angle_error'] < 0.05   # measured from the plant's balance point


@pytest.mark.slow
@pytest.mark.parametrize('robot', ['qube', 'cartpole'])
def test_adaptive_mpc_succeeds_within_three_episodes_where_nominal_mpc_fails(
        robot, tmp_path):
    results = {}
    for controller in ('nominal-mpc', 'adaptive-mpc'):
        path = tmp_path / f'{controller}.json'
        main(['--robot', robot, '--controller', controller, '--episodes', '3',
              '--param-error', '0.3', '--seed', '101', '--json', str(path)])
        results[controller] = json.loads(path.read_text())
    adaptive, nominal = results['adaptive-mpc'], results['nominal-mpc']
    assert any(e['success'] for e in adaptive['episodes'])
    # it learnt the plant: the refitted model is far closer to the truth than the nominal one
    assert adaptive['final_param_error'] < 0.5 * nominal['final_param_error']
    assert adaptive['success_rate'] > nominal['success_rate'] or (
        adaptive['mean_swing_up_time_s'] is not None
        and nominal['mean_swing_up_time_s'] is not None
        and adaptive['mean_swing_up_time_s'] < 0.8 * nominal['mean_swing_up_time_s'])


def _reference_file(tmp_path, scale=1.0):
    from diffsim_ros.sysid.excitation import FourierTrajectory, trajectory_document
    import yaml
    joints = robots.get('wam4').joint_names
    # two harmonics per joint that start at rest (sum a = 0, sum k b = 0), within the limits
    trajectory = FourierTrajectory(joints, (0.0, 0.3, 0.0, 1.2),
                                   ((0.05 * scale, -0.05 * scale),) * 4,
                                   ((0.05 * scale, -0.025 * scale),) * 4, 0.5)
    path = tmp_path / 'excitation.yaml'
    path.write_text(yaml.safe_dump(trajectory_document(trajectory, 'wam4', 2.0)))
    return path, trajectory


def test_the_wam_tracks_an_excitation_file_in_simulation(tmp_path, capsys):
    path, trajectory = _reference_file(tmp_path)
    record = tmp_path / 'wam.json'
    assert main(['--robot', 'wam4', '--controller', 'baseline', '--episodes', '1',
                 '--duration', '1.0', '--param-error', '0', '--reference', str(path),
                 '--json', str(record)]) == 0
    scores = json.loads(record.read_text())
    assert scores['episode_duration_s'] == 1.0
    # the episode is scored against the file's series, which computed torque follows
    task = parse_args(['--robot', 'wam4', '--reference', str(path)]).task
    t = torch.linspace(0.0, 2.0, 21, dtype=torch.float64)
    assert torch.allclose(reference(task, t)[0], trajectory.evaluate(t)[0], atol=1e-12)
    assert scores['tracking_rms'] < 0.01, scores['tracking_rms']
    too_fast, _ = _reference_file(tmp_path, scale=10.0)
    with pytest.raises(SystemExit) as excinfo:
        main(['--robot', 'wam4', '--reference', str(too_fast)])
    assert excinfo.value.code == 2 and 'velocity limit' in capsys.readouterr().err
