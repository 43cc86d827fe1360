"""
Tests of ``diffsim-fit`` (:mod:`diffsim_ros.io.fit_cli`) on recordings of the simulated robot.

The data come from the MuJoCo plant (:mod:`diffsim_ros.sim`) with true parameters about 30 %
off the nominal ones, driven open loop by multisine voltages: a Qube (voltage-commanded, fitted
through its DC motor) written as an ``.mcap`` bag and as a two-run CSV, and a double pendulum
(torque-commanded, given as a URDF file) written as NPZ.  The plants run at 100 Hz without
joint limits or encoder quantisation so that every fit stays within a few seconds and the
zero-phase derivative filter is accurate; accelerations are never given to the command, so it
estimates them.  "Toward the truth" means: the rigid-body and joint-friction torques of the
written ``model.urdf`` on held-out true states are closer to the true plant's than the nominal
model's are.
"""

import argparse
import json
import math
import os
from pathlib import Path

from diffsim_ros import robots
from diffsim_ros.core import load_urdf, rnea
from diffsim_ros.io import load_qube_runs, write_bag, write_csv, write_npz
from diffsim_ros.io.fit_cli import main
from diffsim_ros.io.fit_inputs import away_from_limits, split
from diffsim_ros.io.fit_options import (EXIT_NOT_EXCITED, EXIT_USAGE, EXIT_WORSE,
                                        MAX_CONDITION, PROG)
from diffsim_ros.io.progress import Progress
from diffsim_ros.sim import excitation_for, MujocoPlant, PlantConfig
from diffsim_ros.sim.parameters import nominal_model
from diffsim_ros.sysid.dataset import Trajectory
import numpy as np
import pinocchio as pin
import pytest
import torch
import yaml

RATE_HZ = 100.0
COMMANDS = '/effort_controller/commands'
OUTPUTS = ('params.yaml', 'model.urdf', 'metrics.json', 'report.png')


def _record(robot: str, runs: int, seed: int):
    plant = MujocoPlant(PlantConfig(robot=robot, rate_hz=RATE_HZ, param_error=0.3, seed=seed,
                                    joint_limits=False, encoder_counts_per_rev=0))
    out = []
    for k in range(runs):
        u = excitation_for(plant, 'multisine', duration=6.0, fraction=0.3, band=(0.2, 2.0),
                           generator=torch.Generator().manual_seed(10 * seed + k))
        out.append(plant.run(u, run=f'run{k}', true_acceleration=True).replace(poses={}))
    return plant.true_model, out


@pytest.fixture(scope='module')
def qube(tmp_path_factory):
    """Qube recordings: a one-run bag (voltages on the command topic) and a two-run CSV."""
    folder = tmp_path_factory.mktemp('qube')
    true, runs = _record('qube', 3, seed=3)
    bag = write_bag(folder / 'qube.mcap', runs[0].replace(qdd=None), command_topic=COMMANDS)
    table = write_csv(folder / 'qube.csv', [run.replace(qdd=None) for run in runs[:2]])
    no_commands = write_bag(folder / 'no_commands.mcap', runs[0].replace(qdd=None))
    return {'true': true, 'held_out': runs[2], 'bag': bag, 'csv': table,
            'no_commands': no_commands, 'folder': folder}


@pytest.fixture(scope='module')
def pendulum(tmp_path_factory):
    """Double-pendulum recording (torques) as NPZ, and its URDF as a file."""
    folder = tmp_path_factory.mktemp('double_pendulum')
    true, runs = _record('double_pendulum', 2, seed=5)
    urdf = folder / 'double_pendulum.urdf'
    urdf.write_text(robots.urdf_string('double_pendulum'), encoding='utf-8')
    data = write_npz(folder / 'swing.npz', runs[0].replace(qdd=None, u=None))
    return {'true': true, 'held_out': runs[1], 'npz': data, 'urdf': urdf}


def _run(capsys, *argv) -> tuple:
    # the plants run without joint limits (the Qube's arm turns past its URDF limit of
    # 2 rad): no stretch is at a stop, so none is left out
    code = main([str(a) for a in argv] + ['--limit-margin', '-1'])
    captured = capsys.readouterr()
    return code, captured.err


def _torque_error(model, true, run) -> float:
    """RMS of rigid-body + viscous torque differences to the true plant on true states."""
    def torque(m):
        return rnea(m, run.q, run.qd, run.qdd) + m.damping * run.qd
    with torch.no_grad():
        return float((torque(model) - torque(true)).square().mean().sqrt())


def _check_outputs(out: Path, method: str, joints) -> dict:
    for name in OUTPUTS:
        assert (out / name).is_file(), name
    params = yaml.safe_load((out / 'params.yaml').read_text())
    assert params['method'] == method
    assert params['joint_names'] == list(joints)
    assert set(params['armature']) == set(joints)
    metrics = json.loads((out / 'metrics.json').read_text())
    for key in ('torque', 'acceleration', 'rollout', 'nominal', 'wall_time_s', 'iterations',
                'method', 'versions', 'urdf', 'runs', 'preprocessing'):
        assert key in metrics, key
    assert set(metrics['rollout']) == {'0.5s', '1s'} and metrics['horizons_s'] == [0.5, 1.0]
    assert set(metrics['better_than_nominal']) == {'torque', 'rollout_0.5s', 'rollout_1s'}
    assert metrics['wall_time_s']['total'] >= metrics['wall_time_s']['fit'] > 0
    # the recordings are excited: no warning, and the measure is in the metrics
    assert metrics['warning'] is None and metrics['excitation']['sufficient']
    assert metrics['excitation']['condition_number'] < MAX_CONDITION
    assert metrics['versions']['diffsim_ros']
    text = (out / 'model.urdf').read_text()
    model = load_urdf(xml=text, dtype=torch.float64)
    assert model.joint_names == tuple(joints)
    reference = pin.buildModelFromXML(text)
    assert reference.nv == model.n
    masses = sum(inertia.mass for inertia in reference.inertias)
    assert masses == pytest.approx(float(model.inertial[:, 0].sum()), rel=1e-9)
    with (out / 'report.png').open('rb') as stream:
        assert stream.read(8) == b'\x89PNG\r\n\x1a\n'
    with (out / 'report_validation.pdf').open('rb') as stream:
        assert stream.read(5) == b'%PDF-'
    # every flag in metrics.json is on its params.yaml entry, and only those
    flagged = {name for name, entry in params['parameters'].items()
               if entry.get('identifiable') is False}
    assert flagged == set(metrics['unidentifiable'])
    return {'params': params, 'metrics': metrics, 'model': model}


def _moved_toward_truth(model, true, held_out, robot: str) -> None:
    nominal = nominal_model(robot)
    fitted_error = _torque_error(model.replace(armature=nominal.armature), true, held_out)
    nominal_error = _torque_error(nominal, true, held_out)
    assert fitted_error < 0.3 * nominal_error, (fitted_error, nominal_error)


# --------------------------------------------------------------------------------------
# Fits
# --------------------------------------------------------------------------------------
def test_nea_on_a_bag_of_the_voltage_driven_qube(qube, tmp_path, capsys):
    out = tmp_path / 'nea'
    code, err = _run(capsys, qube['bag'], '--robot', 'qube', '--method', 'nea', '--out', out,
                     '--validation', '0.4')
    assert code == 0, err
    result = _check_outputs(out, 'nea', robots.get('qube').joint_names)
    params, metrics = result['params'], result['metrics']
    assert params['input'] == 'u' and params['actuator'] == 'dc_motor'
    assert params['command_joints'] == ['arm_joint']
    base = [name for name in params['parameters'] if name.startswith('base/')]
    assert base and all('std' in params['parameters'][n] and 'expression' in
                        params['parameters'][n] for n in base)
    entry = params['parameters']['pendulum_link/m']
    assert entry['unit'] == 'kg' and entry['nominal'] == pytest.approx(0.024)
    # a single run is cut into 2 s blocks; 40 % of three holds out the middle one, which
    # leaves room for both rollout horizons
    assert metrics['runs'] == {'train': ['qube#train0', 'qube#train2'],
                               'validation': ['qube#validation1']}
    # the bag has velocities: accelerations come from them, the commands filtered alike
    assert metrics['preprocessing']['derivatives'] == 'filtfilt of measured qd'
    for horizon in ('0.5s', '1s'):
        fitted = metrics['rollout'][horizon]['nmse']
        assert fitted is not None
        assert fitted < 0.2 * metrics['nominal']['rollout'][horizon]['nmse']
    val = metrics['torque']['validation']['nmse_mean']
    assert val < 0.1 * metrics['nominal']['torque']['validation']['nmse_mean']
    # a fit that simulates the held-out data better than the catalogue model says so
    assert metrics['better_than_nominal'] == {'torque': True, 'rollout_0.5s': True,
                                              'rollout_1s': True}
    assert metrics['exit_status'] == 0 and metrics['worse_than_nominal'] is None
    _moved_toward_truth(result['model'], qube['true'], qube['held_out'], 'qube')
    # progress went to stderr as whole lines, without terminal control characters
    assert 'fit done' in err and 'wrote params.yaml' in err and '\r' not in err


def test_cutoff_zero_differences_the_measured_velocities(qube, tmp_path, capsys):
    out = tmp_path / 'raw'
    code, err = _run(capsys, qube['bag'], '--robot', 'qube', '--method', 'nea', '--out', out,
                     '--cutoff', '0', '--quiet')
    assert code == 0, err
    result = _check_outputs(out, 'nea', robots.get('qube').joint_names)
    preprocessing = result['metrics']['preprocessing']
    assert preprocessing['derivatives'] == 'central differences of measured qd'
    assert preprocessing['cutoff_hz'] is None
    assert preprocessing['edge_crop_s'] == pytest.approx(1.0 / RATE_HZ)
    _moved_toward_truth(result['model'], qube['true'], qube['held_out'], 'qube')


def test_stretches_at_a_position_limit_are_left_out():
    nominal = nominal_model('qube')
    upper = float(nominal.upper[0])
    t = torch.arange(0.0, 4.0, 0.01, dtype=torch.float64)
    q = torch.stack((upper * torch.sin(0.5 * math.pi * t), torch.zeros_like(t)), -1)
    run = Trajectory(t=t, q=q, qd=torch.zeros_like(q), joint_names=nominal.joint_names,
                     run='r')
    args = argparse.Namespace(limit_margin=0.05, cutoff=20.0)
    train, validation, dropped = away_from_limits([run], [], nominal, args)
    kept = torch.cat([part.q[:, 0] for part in train])
    assert dropped > 0 and len(kept) == len(t) - dropped and validation == []
    assert float(kept.abs().max()) < upper - 0.05
    assert len(train) == 3   # around the visits to the upper (t = 1 s) and lower stop
    args.limit_margin = -1.0
    assert away_from_limits([run], [], nominal, args) == ([run], [], 0)


def test_a_short_single_run_holds_out_its_end():
    t = torch.arange(0.0, 3.0, 0.01, dtype=torch.float64)
    run = Trajectory(t=t, q=torch.zeros(len(t), 2, dtype=torch.float64),
                     joint_names=('a', 'b'), run='short')
    train, validation = split([run], None)   # 2 s blocks: the first held out would be the 3rd
    assert [r.run for r in train] == ['short#train'] and len(validation) == 1
    assert float(validation[0].t[0]) == pytest.approx(2.4, abs=0.011)


def test_a_recording_all_at_a_limit_says_so(tmp_path, capsys):
    t = torch.arange(0.0, 3.0, 0.01, dtype=torch.float64)
    q = torch.zeros(len(t), 2, dtype=torch.float64)
    q[:, 0] = 2.0                                        # the arm at its 2.007 rad stop
    run = Trajectory(t=t, q=q, qd=torch.zeros_like(q), u=torch.zeros(len(t), 1,
                     dtype=torch.float64), joint_names=('arm_joint', 'pendulum_joint'),
                     run='stuck')
    table = write_csv(tmp_path / 'stuck.csv', [run])
    code = main([str(table), '--robot', 'qube', '--out', str(tmp_path / 'out'), '--quiet'])
    message = capsys.readouterr().err
    assert code == 2 and 'position limits' in message and '--limit-margin' in message


def test_cutoff_zero_needs_measured_velocities(qube, tmp_path, capsys):
    message = _error(capsys, qube['bag'], '--robot', 'qube', '--derivatives', 'filter',
                     '--cutoff', '0', '--out', tmp_path)
    assert '--cutoff 0' in message and 'velocities' in message


def test_diffnea_on_a_two_run_csv_with_a_config_file(qube, tmp_path, capsys):
    config = tmp_path / 'diffnea.yaml'
    config.write_text('lbfgs_iterations: 3\nlearn: [inertial, damping]\n')
    out = tmp_path / 'diffnea'
    code, err = _run(capsys, qube['csv'], '--robot', 'qube', '--out', out, '--max-iter', '80',
                     '--config', config, '--seed', '2', '--quiet')
    assert code == 0, err
    assert err == ''
    result = _check_outputs(out, 'diffnea', robots.get('qube').joint_names)
    metrics = result['metrics']
    assert metrics['runs'] == {'train': ['run0'], 'validation': ['run1']}
    assert metrics['config']['adam_iterations'] == 80
    assert metrics['config']['lbfgs_iterations'] == 3
    assert metrics['config']['learn'] == ['inertial', 'damping']
    assert metrics['config']['seed'] == 2
    assert metrics['iterations'] <= 83
    assert metrics['urdf']['source'] == 'identified'
    params = result['params']['parameters']
    assert params['arm_joint/damping']['unit'] == 'N m s/rad'
    assert 'std' not in params['arm_joint/damping']
    assert all(result['model'].damping > 0)
    _moved_toward_truth(result['model'], qube['true'], qube['held_out'], 'qube')
    rollout = metrics['rollout']['1s']
    assert rollout['windows'] >= 5 and rollout['nmse'] < metrics['nominal']['rollout']['1s'][
        'nmse']


def test_nea_on_npz_with_a_urdf_file_uses_the_measured_torques(pendulum, tmp_path, capsys):
    out = tmp_path / 'npz'
    # viscous friction only, on a double pendulum whose true joints also have Coulomb
    # friction: the torques move toward the truth, yet the 1 s rollouts of the chaotic
    # pendulum lose to the nominal model's (measured 1.95 against 1.09): said on stderr and
    # in metrics.json, exit status 4 unless --allow-worse
    argv = (pendulum['npz'], '--robot', pendulum['urdf'], '--method', 'nea', '--actuator',
            'viscous', '--out', out, '--quiet')
    code, err = _run(capsys, *argv)
    assert code == EXIT_WORSE and 'simulates worse than the nominal model' in err, err
    code, err = _run(capsys, *argv, '--allow-worse')
    assert code == 0 and 'rollout 1s NMSE' in err and '(allowed by --allow-worse)' in err
    result = _check_outputs(out, 'nea', ('shoulder_joint', 'elbow_joint'))
    assert result['metrics']['better_than_nominal']['rollout_1s'] is False
    assert result['metrics']['better_than_nominal']['torque'] is True
    assert result['params']['input'] == 'tau'
    assert result['params']['robot'] == str(pendulum['urdf'].resolve())
    assert result['metrics']['config']['friction'] == ['viscous']
    parameters = result['params']['parameters']
    for joint in ('shoulder_joint', 'elbow_joint'):     # Coulomb stays nominal
        coulomb = parameters[f'{joint}/coulomb']
        assert coulomb['value'] == pytest.approx(coulomb['nominal'])
    # the upper link's mass sits on the shoulder axis: no torque depends on it
    assert 'enters no base parameter' in result['metrics']['unidentifiable']['upper_link/m']
    assert 'lower_link/m' not in result['metrics']['unidentifiable']
    _moved_toward_truth(result['model'], pendulum['true'], pendulum['held_out'],
                        'double_pendulum')


def test_multistep_loss_refines_the_inverse_fit_on_rollouts(qube, tmp_path, capsys):
    out = tmp_path / 'multistep'
    code, err = _run(capsys, qube['csv'], '--robot', 'qube', '--out', out, '--max-iter', '10',
                     '--loss', 'multistep', '--horizon', '0.1', '--quiet')
    assert code in (0, EXIT_WORSE), err
    config = json.loads((out / 'metrics.json').read_text())['config']
    # 0.1 s at 100 Hz: 10-step shooting windows after an inverse-dynamics warm start
    assert config['loss'] == 'rollout' and config['horizon'] == 10
    assert [(s['loss'], s['horizon']) for s in config['stages']][-1] == ('rollout', 10)
    assert {s['loss'] for s in config['stages'][:-1]} == {'inverse_dynamics'}
    message = _error(capsys, qube['csv'], '--robot', 'qube', '--method', 'nea', '--loss',
                     'multistep', '--out', tmp_path / 'nea')
    assert 'nea is least squares' in message
    message = _error(capsys, qube['csv'], '--robot', 'qube', '--loss', 'multistep',
                     '--horizon', '60', '--out', tmp_path / 'long')
    assert 'shortest training run' in message


def test_ffnn_writes_the_nominal_urdf(qube, tmp_path, capsys):
    out = tmp_path / 'ffnn'
    # five iterations of a black box do not simulate better than the catalogue model
    code, err = _run(capsys, qube['csv'], '--robot', 'qube', '--method', 'ffnn', '--out', out,
                     '--max-iter', '5', '--quiet', '--allow-worse')
    assert code == 0, err
    result = _check_outputs(out, 'ffnn', robots.get('qube').joint_names)
    metrics = result['metrics']
    assert metrics['better_than_nominal'] == {'torque': None, 'rollout_0.5s': False,
                                              'rollout_1s': False}
    assert metrics['urdf']['source'] == 'nominal' and metrics['urdf']['notes']
    assert metrics['physical_parameters'] is False and metrics['torque'] is None
    assert metrics['acceleration']['validation']['nmse_mean'] is not None
    assert result['params']['parameters'] == {}
    assert (out / 'modules.pt').is_file()
    nominal = load_urdf(xml=robots.urdf_string('qube'), dtype=torch.float64)
    torch.testing.assert_close(result['model'].inertial, nominal.inertial)


def test_help_exits_zero_and_says_what_the_exit_statuses_mean(capsys):
    assert main(['--help']) == 0
    text = capsys.readouterr().out
    assert 'diffsim-fit' in text and 'exit status' in text
    for status in (0, EXIT_USAGE, EXIT_NOT_EXCITED, EXIT_WORSE, 130):
        assert f'\n  {status} ' in text, status
    assert '--max-condition' in text and '--allow-worse' in text
    assert 'report_validation.pdf' in text and 'not identifiable' in text


# --------------------------------------------------------------------------------------
# Excitation: data that cannot determine the parameters say so (exit status 3)
# --------------------------------------------------------------------------------------
PENDULUM_JOINTS = ('shoulder_joint', 'elbow_joint')


def _synthetic_npz(path: Path, q: np.ndarray, noise: float = 0.0, seed: int = 0) -> Path:
    """
    Write a double-pendulum recording whose torques are the nominal model's own.

    Velocities and accelerations are left to the command's derivative filter, as in a real
    recording; ``noise`` is the standard deviation of the position noise (rad), a tenth of
    it in N m on the torques.
    """
    t = np.arange(len(q)) / RATE_HZ
    model = nominal_model('double_pendulum')
    qt = torch.from_numpy(q)
    qd = torch.gradient(qt, spacing=(torch.from_numpy(t),), dim=0)[0]
    qdd = torch.gradient(qd, spacing=(torch.from_numpy(t),), dim=0)[0]
    with torch.no_grad():
        tau = rnea(model, qt, qd, qdd) + model.damping * qd + model.friction * torch.tanh(
            qd / 0.01)
    generator = np.random.default_rng(seed)
    np.savez(path, t=t, q=q + noise * generator.standard_normal(q.shape),
             tau=tau.numpy() + 0.1 * noise * generator.standard_normal(q.shape),
             joint_names=np.array(PENDULUM_JOINTS))
    return path


def _motion(kind: str) -> np.ndarray:
    t = np.arange(0.0, 6.0, 1.0 / RATE_HZ)[:, None]
    if kind == 'chirp':
        rate = np.array([0.3, 0.4])          # Hz, sweeping up by 20 % per second
        return 0.5 * np.sin(2 * math.pi * rate * t * (1.0 + 0.2 * t))
    if kind == 'rest':
        return np.broadcast_to(np.array([0.3, -0.2]), (len(t), 2)).copy()
    return np.array([0.3, -0.2]) + np.array([0.8, -0.5]) * t    # constant velocity


@pytest.mark.parametrize('kind,noise', [('rest', 0.0), ('rest', 1e-4),
                                        ('constant velocity', 0.0),
                                        ('constant velocity', 1e-4)])
def test_motionless_data_warn_and_exit_3(tmp_path, capsys, kind, noise):
    data = _synthetic_npz(tmp_path / 'still.npz', _motion(kind), noise)
    out = tmp_path / 'out'
    code = main([str(data), '--robot', 'double_pendulum', '--method', 'nea', '--out', str(out),
                 '--quiet'])
    err = capsys.readouterr().err
    assert code == EXIT_NOT_EXCITED, err
    assert 'Traceback' not in err and 'do not excite the dynamics' in err
    assert f'exit status {EXIT_NOT_EXCITED}' in err
    for name in OUTPUTS:                      # the fit still ran and wrote its outputs
        assert (out / name).is_file(), name
    metrics = json.loads((out / 'metrics.json').read_text())
    excitation = metrics['excitation']
    assert not excitation['sufficient'] and excitation['max_condition'] == MAX_CONDITION
    assert excitation['condition_number'] is None or \
        excitation['condition_number'] > MAX_CONDITION
    assert excitation['base_parameters'] == 10 and excitation['least_excited']
    assert 'do not excite' in metrics['warning']


def test_a_chirp_excites_the_dynamics_and_exits_0(tmp_path, capsys):
    data = _synthetic_npz(tmp_path / 'chirp.npz', _motion('chirp'), noise=1e-4)
    out = tmp_path / 'out'
    # the data are the nominal model's own torques: the catalogue model is the truth here and
    # a fit to noisy data can only lose to it (exit status 4), hence --allow-worse
    code = main([str(data), '--robot', 'double_pendulum', '--method', 'nea', '--out', str(out),
                 '--allow-worse'])
    err = capsys.readouterr().err
    assert code == 0, err
    assert 'do not excite' not in err and 'excitation: condition number' in err
    metrics = json.loads((out / 'metrics.json').read_text())
    assert metrics['warning'] is None and metrics['excitation']['sufficient']
    assert metrics['excitation']['rank'] == metrics['excitation']['base_parameters'] == 10
    assert metrics['excitation']['condition_number'] < 0.1 * MAX_CONDITION


@pytest.mark.parametrize('kind', ['chirp', 'swingup'])
def test_recorded_qube_runs_are_excited(data_dir, tmp_path, capsys, kind):
    # a real Qube recording (Pyrado, 10 s), fitted whole through the DC motor.  (Its first 4 s
    # of chirp alone, 10 Hz down to 6 Hz, barely move the pendulum: condition number 5e3.)
    run = load_qube_runs(data_dir, kinds=(kind,))[0]
    table = write_csv(tmp_path / 'qube.csv', [run.replace(run=kind)])
    code = main([str(table), '--robot', 'qube', '--method', 'nea', '--validation', '0',
                 '--out', str(tmp_path / 'out'), '--quiet'])
    err = capsys.readouterr().err
    assert code == 0 and 'excite' not in err, err
    excitation = json.loads((tmp_path / 'out' / 'metrics.json').read_text())['excitation']
    assert excitation['sufficient'] and excitation['condition_number'] < 0.2 * MAX_CONDITION


def test_max_condition_sets_what_counts_as_excited(tmp_path, capsys):
    data = _synthetic_npz(tmp_path / 'chirp.npz', _motion('chirp'))
    code = main([str(data), '--robot', 'double_pendulum', '--method', 'nea', '--out',
                 str(tmp_path / 'out'), '--max-condition', '1.5', '--quiet'])
    assert code == EXIT_NOT_EXCITED and '--max-condition 1.5' in capsys.readouterr().err


# --------------------------------------------------------------------------------------
# Errors: exit code 2, one line naming the problem, no traceback
# --------------------------------------------------------------------------------------
def _error(capsys, *argv) -> str:
    code, err = _run(capsys, *argv, '--quiet')
    assert code == 2, err
    assert 'Traceback' not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('diffsim-fit: error: '), err
    return lines[0]


def test_unwritable_out_is_reported_before_anything_is_loaded(pendulum, tmp_path, capsys):
    blocker = tmp_path / 'a_file'
    blocker.write_text('')
    code = main([str(pendulum['npz']), '--robot', 'double_pendulum', '--method', 'nea',
                 '--out', str(blocker / 'sub')])
    err = capsys.readouterr().err
    # not --quiet: the error is the only line, so no stage (loading, fitting) ran before it
    assert code == EXIT_USAGE and err.count('\n') == 1, err
    assert err.startswith('diffsim-fit: error: --out ') and 'cannot be created' in err


@pytest.mark.skipif(os.geteuid() == 0, reason='root writes into read-only folders')
def test_read_only_out(pendulum, tmp_path, capsys):
    folder = tmp_path / 'read_only'
    folder.mkdir()
    folder.chmod(0o555)
    message = _error(capsys, pendulum['npz'], '--robot', 'double_pendulum', '--out', folder)
    assert 'not writable' in message


def _npz(path: Path, **arrays) -> Path:
    t = np.arange(0.0, 2.0, 0.01)
    base = {'t': t, 'q': np.zeros((len(t), 2)), 'tau': np.zeros((len(t), 2)),
            'joint_names': np.array(PENDULUM_JOINTS)}
    base.update(arrays)
    np.savez(path, **{k: v for k, v in base.items() if v is not None})
    return path


@pytest.mark.parametrize('case,expected', [
    ('empty file', 'empty (0 bytes)'),
    ('empty archive', 'missing array'),
    ('truncated archive', 'not a readable .npz'),
    ('no positions', "missing array(s) ['q']"),
    ('positions 1-D', 'expected shape (200, 2), got (200,)'),
    ('three position columns', 'got (200, 3)'),
    ('NaN', 'NaN'),
    ('complex', 'not real numbers'),
    ('unknown joints', "no joint(s) ['shoulder_joint', 'elbow_joint']"),
    ('times in nanoseconds', 'times must be in seconds'),
    ('one sample', 'no run has 20 samples'),
])
def test_bad_npz_is_one_line(tmp_path, capsys, case, expected):
    path = tmp_path / 'data.npz'
    t = np.arange(0.0, 2.0, 0.01)
    if case == 'empty file':
        path.write_bytes(b'')
    elif case == 'empty archive':
        np.savez(path)
    elif case == 'truncated archive':
        path.write_bytes(_npz(tmp_path / 'whole.npz').read_bytes()[:300])
    else:
        _npz(path, **{
            'no positions': {'q': None},
            'positions 1-D': {'q': t},
            'three position columns': {'q': np.zeros((len(t), 3))},
            'NaN': {'q': np.where(t[:, None] > 1.0, np.nan, 0.0) * np.ones(2)},
            'complex': {'q': np.zeros((len(t), 2), dtype=complex)},
            'unknown joints': {'joint_names': np.array(['a', 'b'])},
            'times in nanoseconds': {'t': 1e9 * t},
            'one sample': {'t': t[:1], 'q': np.zeros((1, 2)), 'tau': np.zeros((1, 2))},
        }[case])
    message = _error(capsys, path, '--robot', 'double_pendulum', '--out', tmp_path / 'out')
    assert expected in message


@pytest.mark.parametrize('option,value,expected', [
    ('--cutoff', 'nan', 'must be finite'), ('--cutoff', '-5', '>= 0'),
    ('--cutoff', '80', 'Nyquist'), ('--limit-margin', 'inf', 'must be finite'),
    ('--max-iter', '0', '>= 1'), ('--max-iter', '2.5', 'not an integer'),
    ('--seed', '-1', '>= 0'), ('--seed', str(2 ** 70), '<= 9223372036854775807'),
    ('--max-condition', '0.5', '>= 1'), ('--validation', 'nan', '[0, 1)'),
    ('--validation', 'swing', 'single run'), ('--out', '', 'empty path'),
])
def test_bad_option_values_are_one_line(pendulum, tmp_path, capsys, option, value, expected):
    argv = [pendulum['npz'], '--robot', 'double_pendulum', '--method', 'nea',
            '--out', tmp_path / 'out', option, value]
    message = _error(capsys, *argv)
    assert expected in message and option in message


def test_empty_data_path(tmp_path, capsys):
    assert 'empty path' in _error(capsys, '', '--robot', 'qube', '--out', tmp_path)


@pytest.mark.parametrize('content,expected', [
    (b'\xff\xfe garbage', 'cannot read --config'),
    (b'stages: [5]\n', 'invalid diffnea configuration'),
    (b'adam_iterations: -3\n', 'adam_iterations must be >= 0'),
])
def test_bad_config_files_are_one_line(pendulum, tmp_path, capsys, content, expected):
    config = tmp_path / 'config.yaml'
    config.write_bytes(content)
    message = _error(capsys, pendulum['npz'], '--robot', 'double_pendulum', '--config', config,
                     '--max-iter', '3', '--out', tmp_path / 'out')
    assert expected in message


def test_a_fifo_is_never_opened(pendulum, tmp_path, capsys):
    # a named pipe would block the read forever: data, URDF and config are refused at once
    fifo = tmp_path / 'pipe.csv'
    os.mkfifo(fifo)
    for argv, what in (([fifo, '--robot', 'qube'], 'data file'),
                       ([pendulum['npz'], '--robot', fifo], 'URDF file'),
                       ([pendulum['npz'], '--robot', 'double_pendulum', '--config', fifo],
                        '--config')):
        message = _error(capsys, *argv, '--out', tmp_path / 'out')
        assert what in message and 'not a regular file' in message


def test_an_empty_urdf_file(pendulum, tmp_path, capsys):
    urdf = tmp_path / 'robot.urdf'
    urdf.write_text('')
    assert 'empty' in _error(capsys, pendulum['npz'], '--robot', urdf, '--out', tmp_path)
    urdf.write_text('robot.urdf')     # text that is not XML is never read as a path
    assert 'does not hold XML' in _error(capsys, pendulum['npz'], '--robot', urdf, '--out',
                                         tmp_path)


def test_missing_data(tmp_path, capsys):
    message = _error(capsys, tmp_path / 'nothing.mcap', '--robot', 'qube', '--out', tmp_path)
    assert 'does not exist' in message


def test_empty_table(tmp_path, capsys):
    empty = tmp_path / 'empty.csv'
    empty.write_text('')
    assert 'empty' in _error(capsys, empty, '--robot', 'qube', '--out', tmp_path)


def test_corrupt_bag(qube, tmp_path, capsys):
    corrupt = tmp_path / 'corrupt.mcap'
    data = bytearray(qube['bag'].read_bytes())
    corrupt.write_bytes(bytes(data[:len(data) // 3]) + b'\x00garbage' * 64)
    message = _error(capsys, corrupt, '--robot', 'qube', '--out', tmp_path)
    assert 'corrupt' in message or 'cannot read' in message


def test_unknown_topic_lists_the_topics(qube, tmp_path, capsys):
    message = _error(capsys, qube['bag'], '--robot', 'qube', '--topic', '/nope', '--out',
                     tmp_path)
    assert '/nope' in message and '/joint_states' in message


def test_joints_missing_in_the_data(qube, tmp_path, capsys):
    message = _error(capsys, qube['bag'], '--robot', 'double_pendulum', '--out', tmp_path)
    assert 'shoulder_joint' in message


def test_voltage_robot_without_commands(qube, tmp_path, capsys):
    message = _error(capsys, qube['no_commands'], '--robot', 'qube', '--out', tmp_path)
    assert 'command' in message


def test_unknown_robot_lists_the_names(qube, tmp_path, capsys):
    message = _error(capsys, qube['bag'], '--robot', 'robby', '--out', tmp_path)
    assert 'robby' in message and 'qube' in message and 'panda' in message


def test_invalid_urdf(qube, tmp_path, capsys):
    bad = tmp_path / 'bad.urdf'
    bad.write_text('<robot name="bad"><link name="a"/><joint name="j" type="revolute">')
    message = _error(capsys, qube['bag'], '--robot', bad, '--out', tmp_path)
    assert 'invalid URDF' in message and 'bad.urdf' in message


@pytest.mark.parametrize('option,value', [('--method', 'lstsq'), ('--actuator', 'magic')])
def test_unknown_method_or_actuator(qube, tmp_path, capsys, option, value):
    message = _error(capsys, qube['bag'], '--robot', 'qube', option, value, '--out', tmp_path)
    assert value in message and option in message


def test_actuator_the_method_cannot_fit(qube, tmp_path, capsys):
    message = _error(capsys, qube['bag'], '--robot', 'qube', '--method', 'nea', '--actuator',
                     'stribeck', '--out', tmp_path)
    assert 'stribeck' in message and 'diffnea' in message


def test_unknown_config_key(qube, tmp_path, capsys):
    config = tmp_path / 'config.yaml'
    config.write_text('adam_iterations: 5\nlearning_rate: 0.1\n')
    message = _error(capsys, qube['bag'], '--robot', 'qube', '--config', config, '--out',
                     tmp_path)
    assert 'learning_rate' in message and 'valid keys' in message


def test_unknown_validation_run(qube, tmp_path, capsys):
    message = _error(capsys, qube['csv'], '--robot', 'qube', '--validation', 'run7',
                     '--out', tmp_path)
    assert 'run7' in message and 'run1' in message


@pytest.mark.skipif(torch.cuda.is_available(), reason='CUDA is available here')
def test_cuda_without_cuda(qube, tmp_path, capsys):
    message = _error(capsys, qube['bag'], '--robot', 'qube', '--device', 'cuda', '--out',
                     tmp_path)
    assert 'CUDA' in message


# --------------------------------------------------------------------------------------
# Progress output
# --------------------------------------------------------------------------------------
class _Stream:
    """A text stream that says whether it is a terminal."""

    def __init__(self, tty: bool) -> None:
        self.text = ''
        self.tty = tty

    def write(self, text: str) -> None:
        self.text += text

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return self.tty


def test_progress_without_a_terminal_writes_plain_lines():
    stream = _Stream(tty=False)
    progress = Progress(stream, PROG, log_every_s=0.0)
    progress.stage('loaded')
    progress.begin('fitting diffnea')
    progress.update(12, 0.5, 0.75)
    progress.update({'iteration': 13, 'loss': 0.25})
    progress.end()
    assert '\r' not in stream.text and '\x1b' not in stream.text
    lines = stream.text.splitlines()
    assert any('iteration 12, loss 0.5, val loss 0.75' in line for line in lines)
    assert all(line.startswith('diffsim-fit: ') for line in lines)


def test_progress_on_a_terminal_rewrites_one_line():
    stream = _Stream(tty=True)
    progress = Progress(stream, PROG)
    progress.begin('fitting nea')
    progress.update(iteration=3, loss=1.5)
    progress._render()
    progress.end()
    assert '\rdiffsim-fit: fitting nea' in stream.text and 'iteration 3' in stream.text
    assert stream.text.endswith('\r') and '\n' not in stream.text
    quiet = _Stream(tty=True)
    silent = Progress(quiet, PROG, quiet=True)
    silent.begin('x')
    silent.stage('y')
    silent.end()
    assert quiet.text == ''


def test_nominal_reference_values_are_consistent_with_the_catalog():
    # the armature the command adds to catalog robots is the catalog's (cart-pole: rotor)
    from diffsim_ros.io.fit_inputs import load_robot
    model, info, label = load_robot('cartpole')
    expected = robots.get('cartpole').motor['armature']
    assert label == 'cartpole' and info.command_unit == 'V'
    assert model.armature.tolist() == pytest.approx(list(expected))
    assert math.isclose(float(nominal_model('cartpole').armature[0]), expected[0])
    assert np.isfinite(model.inertial.numpy()).all()
