"""
``diffsim-fit --object`` and ``diffsim-predict`` run as a user runs them.

Inputs: a few real cube tosses (the shared ``.npz`` layout, cut short so that the rollouts of
the loaded test machine stay short; written to a temporary file, never into the repository),
simulated tosses of the nominal cube written as a rosbag2 of PoseStamped (with gaps between
tosses), as TransformStamped, and as CSV, and a simulated Qube bag for a robot fit. The
commands run in subprocesses; bad inputs go through ``main`` (they fail before any fit).
"""

import dataclasses
import json
import os
from pathlib import Path
import subprocess
import sys

from diffsim_ros.core import load_urdf
from diffsim_ros.core.configuration import root_pose_matrix
from diffsim_ros.io.bags import BagWriter, read_bag
from diffsim_ros.io.fit_cli import main as fit_main
from diffsim_ros.io.fit_options import EXIT_USAGE
from diffsim_ros.io.object_data import (ObjectDataError, pose_rows, poses_to_states,
                                        read_tosses, segment)
from diffsim_ros.io.object_urdf import learned_urdf, object_spec, read_object_urdf
from diffsim_ros.io.tosses import load_cube_tosses
from diffsim_ros.sysid.contact_learning import rollout, rollout_errors
import numpy as np
import pytest
import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
TOSS_SAMPLES = 24
SIM_TOSSES = 4


def _command(module: str, *argv, timeout: float = 1800.0) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get('PYTHONPATH', ''))
    return subprocess.run([sys.executable, '-m', module] + [str(a) for a in argv], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=timeout)


def _fit(*argv) -> subprocess.CompletedProcess:
    return _command('diffsim_ros.io.fit_cli', *argv)


def _predict(*argv) -> subprocess.CompletedProcess:
    return _command('diffsim_ros.io.predict_cli', *argv)


@pytest.fixture(scope='module')
def short_cube(data_dir, tmp_path_factory):
    """Return the first six real cube tosses cut to their first samples, in the shared layout."""
    with np.load(data_dir / 'contactnets_cube_toss' / 'cube_tosses.npz') as archive:
        data = {key: archive[key] for key in archive.files}
    offsets = data['toss_offsets']
    parts = [data['states'][offsets[i]:offsets[i] + TOSS_SAMPLES] for i in range(6)]
    data['states'] = np.concatenate(parts)
    data['toss_offsets'] = np.arange(7) * TOSS_SAMPLES
    data['toss_ids'] = data['toss_ids'][:6]
    path = tmp_path_factory.mktemp('cube') / 'cube_tosses.npz'
    np.savez(path, **data)
    return path


@pytest.fixture(scope='module')
def simulated(tmp_path_factory):
    """Return tosses of the nominal cube (our contact step) as PoseStamped and TF bags and CSV."""
    spec = object_spec('cube')
    generator = torch.Generator().manual_seed(4)
    x0 = torch.zeros(SIM_TOSSES, 13, dtype=torch.float64)
    x0[:, 2] = 0.2 + 0.1 * torch.rand(SIM_TOSSES, generator=generator, dtype=torch.float64)
    axis = torch.randn(SIM_TOSSES, 3, generator=generator, dtype=torch.float64)
    x0[:, 3:7] = torch.cat((0.3 * axis, torch.ones(SIM_TOSSES, 1, dtype=torch.float64)), -1)
    x0[:, 3:7] /= x0[:, 3:7].norm(dim=-1, keepdim=True)
    x0[:, 7:13] = torch.randn(SIM_TOSSES, 6, generator=generator, dtype=torch.float64)
    dt = 1.0 / 148.0
    states = torch.cat((x0[:, None], rollout(spec.model, spec.contact, x0, 29, dt)), 1)
    folder = tmp_path_factory.mktemp('simulated')
    times = [k * (30 * dt + 0.5) + dt * np.arange(30) for k in range(SIM_TOSSES)]
    poses = [pose_rows(s[:, :7]) for s in states]
    bag, tf_bag = folder / 'tosses.mcap', folder / 'tf.mcap'
    with BagWriter(bag, t0_ns=10 ** 18) as writer, BagWriter(tf_bag, t0_ns=10 ** 18) as tf:
        writer.string('/robot_description', 0.0, 'not a pose')
        for t, s in zip(times, states):
            for tk, qk in zip(t, s[:, :7]):
                writer.pose('/mocap/cube/pose', tk, root_pose_matrix(qk))
                tf.transform('/tracker/cube', tk, root_pose_matrix(qk))
    csv = folder / 'tosses.csv'
    lines = ['# simulated tosses of the nominal cube', 't,x,y,z,qw,qx,qy,qz,toss']
    for k, (t, rows) in enumerate(zip(times, poses)):
        lines += [','.join(repr(float(x)) for x in (tk, *row, k)) for tk, row in zip(t, rows)]
    csv.write_text('\n'.join(lines) + '\n', encoding='utf-8')
    return {'bag': bag, 'tf': tf_bag, 'csv': csv, 'times': times, 'poses': poses, 'dt': dt,
            'folder': folder}


def _same_pose(a: np.ndarray, b: np.ndarray, tol: float) -> None:
    assert np.abs(a[:, :3] - b[:, :3]).max() < tol
    dot = np.abs((a[:, 3:] * b[:, 3:]).sum(-1))
    assert np.abs(dot - 1.0).max() < tol   # same rotation (q and -q alike)


def test_help_of_both_commands():
    """``--help`` documents the object mode and the prediction."""
    fit = _fit('--help')
    assert fit.returncode == 0, fit.stderr
    for text in ('--object', 'cube|elbow|URDF', 'TransformStamped', '--steps', 'diffsim-predict',
                 '--smooth-window', '--restarts'):
        assert text in fit.stdout
    predict = _predict('--help')
    assert predict.returncode == 0, predict.stderr
    for text in ('DIR DATA --out PRED.npz', '--topic', '--command-topic'):
        assert text in predict.stdout


def test_velocities_follow_the_shared_convention(data_dir):
    """Backward differences and a 3-tap median give the stored cube velocities; forward do not."""
    tosses = load_cube_tosses(data_dir, limit=20)
    ours, forward, scale = [], [], []
    for q, v in zip(tosses.q, tosses.v):
        _, v_ours = poses_to_states(pose_rows(q), tosses.dt)
        ours.append((v_ours - v)[2:-2])
        rows = pose_rows(q)
        _, v_shift = poses_to_states(np.concatenate((rows[1:], rows[-1:])), tosses.dt)
        forward.append((v_shift - v)[2:-2])
        scale.append(v[2:-2])

    def rms(parts, cols):
        return float(torch.cat([p[:, cols] for p in parts]).square().mean().sqrt())
    # measured on the first 20 tosses: ours 0.7 % of the velocities' rms (linear and
    # angular; the stored ones differ in rounding of the original pipeline), forward
    # differences 15 % and 32 %
    for cols in (slice(0, 3), slice(3, 6)):
        assert rms(ours, cols) < 0.01 * rms(scale, cols)
        assert rms(forward, cols) > 10.0 * rms(ours, cols)


def test_fit_and_predict_on_shared_cube_layout(short_cube, tmp_path):
    """A fit of real tosses writes every output; predict lines up with the input row for row."""
    out = tmp_path / 'fit'
    fit = _fit(short_cube, '--object', 'cube', '--method', 'ccn', '--steps', '2', '--seed', '1',
               '--validation', '0.34', '--out', out, '--allow-worse')
    assert fit.returncode == 0, fit.stderr
    for name in ('params.yaml', 'cube_learned.urdf', 'cube_learned_cube.obj', 'metrics.json',
                 'report.png'):
        assert (out / name).is_file(), name
    metrics = json.loads((out / 'metrics.json').read_text())
    for key in ('volume_error', 'friction', 'inertia_error', 'method', 'seed', 'data'):
        assert metrics[key] is not None, key
    assert metrics['method'] == 'ccn' and metrics['seed'] == 1
    assert len(metrics['tosses']['held_out']) == 2
    for which in ('fit', 'nominal'):
        assert metrics['held_out'][which]['tosses'] == 2
    params = yaml.safe_load((out / 'params.yaml').read_text())
    assert params['parameters']['friction']['unit'] == '-'
    assert params['parameters']['friction']['value'] == metrics['friction']

    # the URDF and its mesh load back as the same object
    model, contact, _ = read_object_urdf(out / 'cube_learned.urdf')
    assert float(contact.friction) == metrics['friction']
    vertices = [params['parameters'][f'cube.vertex_{k}']['value'] for k in range(8)]
    assert torch.equal(contact.vertices[0], torch.tensor(vertices, dtype=torch.float64))
    plain = load_urdf(out / 'cube_learned.urdf', floating_base=True)
    assert torch.allclose(plain.inertial, model.inertial, rtol=0, atol=0)
    assert abs(float(plain.inertial[0, 0]) - 0.37) < 1e-12

    pred = tmp_path / 'pred.npz'
    run = _predict(out, short_cube, '--out', pred)
    assert run.returncode == 0, run.stderr
    with np.load(short_cube) as source, np.load(pred) as predicted:
        assert sorted(source.files) == sorted(predicted.files)
        for key in source.files:
            if key != 'states':
                assert np.array_equal(source[key], predicted[key]), key
        measured, states = source['states'], predicted['states']
        assert states.shape == measured.shape
        offsets = source['toss_offsets']
    tosses = read_tosses(short_cube)
    for i, (lo, hi) in enumerate(zip(offsets[:-1], offsets[1:])):
        # rows 0 and 1 are the recorded ones written back (round trip of the layout)
        assert np.allclose(states[lo:lo + 2, :7], measured[lo:lo + 2, :7], atol=1e-12)
        assert np.abs(states[lo + 2:hi, :3] - measured[lo + 2:hi, :3]).max() > 0
    # the held-out errors recomputed from the written prediction are the fit's own:
    # the model read back from the URDF is the one that was fitted
    held = [tosses.toss_ids.index(t) for t in metrics['tosses']['held_out']]
    predicted_q = [load_cube_rows(states[offsets[i] + 2:offsets[i + 1]]) for i in held]
    errors = rollout_errors(predicted_q, [tosses.q[i][2:] for i in held])
    assert np.allclose(errors['position_m'],
                       metrics['held_out']['fit']['position_m']['per_toss'], rtol=1e-9)


def load_cube_rows(rows: np.ndarray) -> torch.Tensor:
    """Return our ``q`` of rows in the cube layout (half-widths)."""
    scaled = torch.as_tensor(rows[:, :7].copy())
    scaled[:, :3] *= 0.0524
    return torch.cat((scaled[:, :3], scaled[:, 4:7], scaled[:, 3:4]), -1)


def test_pose_readers_and_segmentation(simulated):
    """Bag (PoseStamped, TransformStamped) and CSV give the same tosses, cut at the gaps."""
    bag = read_tosses(simulated['bag'])
    tf = read_tosses(simulated['tf'])
    csv = read_tosses(simulated['csv'])
    assert bag.topic == '/mocap/cube/pose' and tf.topic == '/tracker/cube'
    for recording in (bag, tf, csv):
        assert len(recording) == SIM_TOSSES
        assert abs(recording.dt - simulated['dt']) < 1e-9
        for k in range(SIM_TOSSES):
            _same_pose(pose_rows(recording.q[k]), simulated['poses'][k], 1e-9)
            assert torch.allclose(recording.v[k], csv.v[k], atol=1e-6)
    # rest periods cut a gap-free stream: two throws separated by 0.5 s lying still
    t = np.arange(200) / 100.0
    p = np.zeros((200, 3))
    p[20:60, 0] = np.linspace(0.0, 0.4, 40)
    p[60:120, 0] = 0.4
    p[120:150, 0] = np.linspace(0.4, 0.7, 30)
    p[150:, 0] = 0.7
    ranges = segment(t, p, rest_s=0.2)
    assert len(ranges) == 2
    # each toss starts at the last resting row before the motion
    assert ranges[0][0] == 20 and ranges[1][0] == 120
    assert t[ranges[0][1] - 1] - t[60] == pytest.approx(0.2, abs=0.011)


def test_fit_and_predict_on_a_pose_bag_and_a_csv(simulated, tmp_path):
    """The user's path with a mocap bag: fit, then predict; a CSV fits the same way."""
    out = tmp_path / 'bag_fit'
    fit = _fit(simulated['bag'], '--object', 'cube', '--steps', '1', '--validation', '0.25',
               '--out', out, '--allow-worse')
    assert fit.returncode == 0, fit.stderr
    metrics = json.loads((out / 'metrics.json').read_text())
    assert metrics['topic'] == '/mocap/cube/pose' and metrics['layout'] == 'poses'
    assert metrics['smooth_window'] == 1   # the cube's own: its tosses as recorded
    pred = tmp_path / 'bag_pred.npz'
    run = _predict(out, simulated['bag'], '--out', pred)
    assert run.returncode == 0, run.stderr
    with np.load(pred) as predicted:
        assert list(predicted['columns']) == ['t', 'x', 'y', 'z', 'qw', 'qx', 'qy', 'qz',
                                              'toss']
        states, measured = predicted['states'], predicted['measured']
        offsets = predicted['toss_offsets']
    assert states.shape == measured.shape == (30 * SIM_TOSSES, 9)
    assert np.array_equal(states[:, 0], measured[:, 0])
    assert np.array_equal(states[:, 8], measured[:, 8])
    for k in range(SIM_TOSSES):
        rows = measured[offsets[k]:offsets[k + 1]]
        assert np.allclose(rows[:, 0] - rows[0, 0], simulated['times'][k] -
                           simulated['times'][k][0], atol=1e-9)
        _same_pose(rows[:, 1:8], simulated['poses'][k], 1e-9)
        assert np.array_equal(states[offsets[k]:offsets[k] + 2], rows[:2])
    csv_out = tmp_path / 'csv_fit'
    fit = _fit(simulated['csv'], '--object', 'cube', '--steps', '1', '--out', csv_out,
               '--allow-worse', '--smooth-window', '5')
    assert fit.returncode == 0, fit.stderr
    metrics = json.loads((csv_out / 'metrics.json').read_text())
    assert metrics['layout'] == 'poses' and metrics['smooth_window'] == 5


def test_learned_urdf_of_a_box_is_a_box(tmp_path):
    """A learned shape that is a box is written as a box and reads back as the same model."""
    spec = object_spec('cube')
    text, meshes = learned_urdf(spec.model, spec.contact, spec.model.urdf, 'cube')
    assert meshes == {} and '<box size=' in text
    (tmp_path / 'cube.urdf').write_text(text)
    model, contact, _ = read_object_urdf(tmp_path / 'cube.urdf')
    assert torch.equal(model.inertial, spec.model.inertial)
    ours = sorted(map(tuple, contact.vertices[0].tolist()))
    assert ours == sorted(map(tuple, spec.contact.vertices[0].tolist()))
    assert float(contact.friction) == pytest.approx(float(spec.contact.friction), abs=1e-15)


def _csv(path: Path, rows) -> Path:
    path.write_text('t,x,y,z,qw,qx,qy,qz,toss\n' + '\n'.join(
        ','.join(str(x) for x in row) for row in rows) + '\n')
    return path


def _good_rows(toss: int, n: int, t0: float = 0.0):
    return [(t0 + k * 0.01, 0.01 * k, 0.0, 0.2, 1.0, 0.0, 0.0, 0.0, toss) for k in range(n)]


@pytest.mark.parametrize('case, expected', [
    ('short', 'toss 1 (t = 0.5 s) has 1 sample(s)'),
    ('nan', 'row 2 has a non-finite entry'),
    ('quaternion', 'is not a unit quaternion'),
    ('column', "unknown ['speed']"),
    ('topic', "pose topic '/nope' not found"),
    ('empty', 'is empty (no messages)'),
    ('elbow', 'the object elbow has 8'),
    ('robot-method', 'give --object'),
    ('smooth-window', 'smooth_window 4 must be odd'),
])
def test_bad_inputs_get_one_line(case, expected, tmp_path, capsys, simulated):
    """Each bad input: exit status 2 and one precise line, before any fit."""
    argv = ['--object', 'cube', '--out', str(tmp_path / 'out')]
    if case == 'short':
        data = _csv(tmp_path / 'a.csv', _good_rows(0, 5) + _good_rows(1, 1, 0.5))
    elif case == 'nan':
        rows = _good_rows(0, 5)
        rows[2] = rows[2][:2] + (float('nan'),) + rows[2][3:]
        data = _csv(tmp_path / 'a.csv', rows)
    elif case == 'quaternion':
        rows = _good_rows(0, 5)
        rows[3] = rows[3][:4] + (1.5,) + rows[3][5:]
        data = _csv(tmp_path / 'a.csv', rows)
    elif case == 'column':
        data = tmp_path / 'a.csv'
        data.write_text('t,x,y,z,qw,qx,qy,qz,speed\n0,0,0,0,1,0,0,0,0\n')
    elif case == 'topic':
        data, argv = simulated['bag'], argv + ['--topic', '/nope']
    elif case == 'empty':
        data = tmp_path / 'empty.mcap'
        BagWriter(data).close()
    elif case == 'elbow':
        data, argv = simulated['csv'], ['--object', 'elbow', '--out', str(tmp_path / 'o')]
    elif case == 'smooth-window':
        data, argv = simulated['csv'], argv + ['--smooth-window', '4']
    else:
        data, argv = simulated['csv'], ['--method', 'ccn', '--robot', 'qube', '--out',
                                        str(tmp_path / 'o')]
    code = fit_main([str(data)] + argv)
    err = capsys.readouterr().err.strip()
    assert code == EXIT_USAGE, err
    assert len(err.splitlines()) == 1 and expected in err, err


def test_reader_errors_name_the_problem(tmp_path):
    """The reader's own error type (used by the node too) for a folder that is no input."""
    with pytest.raises(ObjectDataError, match='neither a rosbag2 recording'):
        read_tosses(tmp_path)


def test_predict_a_robot_bag_from_its_commands(tmp_path):
    """A fixed-base fit predicts a bag's joint trajectories from its commands, row for row."""
    from diffsim_ros.io import write_bag
    from diffsim_ros.sim import excitation_for, MujocoPlant, PlantConfig
    plant = MujocoPlant(PlantConfig(robot='qube', rate_hz=100.0, param_error=0.3, seed=3,
                                    joint_limits=False, encoder_counts_per_rev=0))
    runs = []
    for k in range(2):
        u = excitation_for(plant, 'multisine', duration=3.0, fraction=0.3, band=(0.2, 2.0),
                           generator=torch.Generator().manual_seed(k))
        runs.append(plant.run(u, run=f'run{k}').replace(poses={}, qdd=None))
    commands = '/effort_controller/commands'
    fit_bag = write_bag(tmp_path / 'fit.mcap', runs[0], command_topic=commands)
    new_bag = write_bag(tmp_path / 'new.mcap', runs[1], command_topic=commands)
    out = tmp_path / 'qube_fit'
    fit = _fit(fit_bag, '--robot', 'qube', '--method', 'nea', '--out', out, '--allow-worse',
               '--limit-margin', '-1')
    assert fit.returncode in (0, 3), fit.stderr
    pred = tmp_path / 'qube_pred.npz'
    run = _predict(out, new_bag, '--out', pred)
    assert run.returncode == 0, run.stderr
    (recorded,) = read_bag(new_bag, command_topic=commands)
    with np.load(pred) as predicted:
        assert list(predicted['joint_names']) == list(recorded.joint_names)
        assert np.array_equal(predicted['t'], recorded.t.numpy())
        assert np.array_equal(predicted['u'], recorded.u.numpy())
        q = predicted['q']
        assert q.shape == tuple(recorded.q.shape)
        assert np.array_equal(q[0], recorded.q[0].numpy())
        assert np.isfinite(q).all()
        # open loop for 3 s drifts, but the first 0.1 s follows the recording
        assert np.abs(q[:10] - recorded.q[:10].numpy()).max() < 0.05


def test_a_learned_urdf_is_an_object_to_start_from(tmp_path):
    """``--object learned.urdf``: the hull mesh and friction read back as the nominal object."""
    spec = object_spec('cube')
    generator = torch.Generator().manual_seed(0)
    vertices = spec.contact.vertices[0] * (0.8 + 0.4 * torch.rand(
        8, 3, generator=generator, dtype=torch.float64))
    contact = dataclasses.replace(spec.contact, vertices=(vertices,),
                                  friction=torch.tensor(0.25, dtype=torch.float64))
    text, meshes = learned_urdf(spec.model, contact, spec.model.urdf, 'learned')
    assert list(meshes) == ['learned_cube.obj']
    (tmp_path / 'learned.urdf').write_text(text)
    (tmp_path / 'learned_cube.obj').write_text(meshes['learned_cube.obj'])
    again = object_spec(str(tmp_path / 'learned.urdf'))
    assert torch.equal(again.contact.vertices[0], vertices)
    assert float(again.contact.friction) == pytest.approx(0.25, abs=1e-15)
    assert again.true_vertices is None and again.true_inertial is None
    assert torch.equal(again.model.inertial, spec.model.inertial)
    faces = [line for line in meshes['learned_cube.obj'].splitlines() if line.startswith('f ')]
    assert len(faces) >= 8   # a closed hull of 8 points in general position: 12 triangles


def test_fit_with_restarts_keeps_the_start_with_the_lowest_early_stopping_loss(simulated,
                                                                               tmp_path):
    """``--restarts K`` fits K starts and keeps the lowest loss on the early-stopping tosses."""
    out = tmp_path / 'fit'
    fit = _fit(simulated['csv'], '--object', 'cube', '--method', 'ccn', '--steps', '3',
               '--seed', '2', '--restarts', '3', '--choose-by', 'loss', '--validation', '0.34',
               '--out', out,
               '--allow-worse')
    assert fit.returncode == 0, fit.stderr
    assert '3 starts' in fit.stdout + fit.stderr
    metrics = json.loads((out / 'metrics.json').read_text())
    starts = metrics['restarts']
    assert [s['seed'] for s in starts] == [2, 1002, 2002]
    assert len({s['validation_loss'] for s in starts}) == 3
    assert min(metrics['history']['validation']) == min(s['validation_loss'] for s in starts)
    assert metrics['seed'] == 2
    # ranked by 16-sample rollouts on the early-stopping tosses (the default)
    out = tmp_path / 'rollout'
    fit = _fit(simulated['csv'], '--object', 'cube', '--method', 'ccn', '--steps', '3',
               '--seed', '2', '--restarts', '2', '--validation', '0.34', '--out', out,
               '--allow-worse')
    assert fit.returncode == 0, fit.stderr
    starts = json.loads((out / 'metrics.json').read_text())['restarts']
    assert [s['seed'] for s in starts] == [2, 1002]
    assert all(s['horizon_error'] > 0 for s in starts)
