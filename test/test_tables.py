"""Tests of ``diffsim_ros.io.tables``: CSV/NPZ round trips and the errors of the column spec."""

import math

from diffsim_ros.core import DiffsimError
from diffsim_ros.io import load_trajectories, TableError
from diffsim_ros.io.tables import read_csv, read_npz, write_csv, write_npz
from diffsim_ros.sysid.dataset import Trajectory
import numpy as np
import pytest
import torch

JOINTS = ('shoulder_joint', 'elbow_joint')


def _trajectory(run: str, seed: int, poses: bool = True) -> Trajectory:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.uniform(1e-3, 3e-3, 50))
    q = rng.standard_normal((50, 2))
    extra = {}
    if poses:
        T = np.tile(np.eye(4), (50, 1, 1))
        angle = rng.uniform(-3, 3, 50)
        T[:, 0, 0], T[:, 0, 1], T[:, 1, 0], T[:, 1, 1] = (np.cos(angle), -np.sin(angle),
                                                          np.sin(angle), np.cos(angle))
        T[:, :3, 3] = rng.standard_normal((50, 3))
        extra['poses'] = {'ball': torch.as_tensor(T)}
    return Trajectory(t=torch.as_tensor(t), q=torch.as_tensor(q), joint_names=JOINTS,
                      qd=torch.as_tensor(q / 3), qdd=torch.as_tensor(q * math.pi),
                      tau=torch.as_tensor(-q), u=torch.as_tensor(q[:, ::-1].copy()), run=run,
                      **extra)


def _assert_same(a: Trajectory, b: Trajectory, exact: bool = True) -> None:
    assert a.joint_names == b.joint_names and a.run == b.run
    for name in ('t', 'q', 'qd', 'qdd', 'tau', 'u'):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert torch.equal(x, y) if exact else torch.allclose(x, y), name
    assert a.poses.keys() == b.poses.keys()
    for body in a.poses:
        assert torch.allclose(a.poses[body], b.poses[body], atol=1e-12)


def test_csv_round_trip_several_runs(tmp_path):
    runs = [_trajectory('first', 0), _trajectory('second', 1)]
    path = write_csv(tmp_path / 'data.csv', runs, command_names=('elbow', 'shoulder'))
    header = path.read_text().splitlines()[0].split(',')
    assert header[:4] == ['run', 't', 'q:shoulder_joint', 'q:elbow_joint']
    assert 'u:elbow' in header and 'pose:ball:qw' in header
    back = read_csv(path)
    assert len(back) == 2
    for a, b in zip(runs, back):
        _assert_same(a, b)            # 17 significant digits: exact


def test_csv_minimal_columns_comments_and_joint_selection(tmp_path):
    path = tmp_path / 'minimal.csv'
    path.write_text('# recorded by hand\n'
                    't,q:b,q:a,tau:b,tau:a\n'
                    '0.0,1.0,2.0,3.0,4.0\n'
                    '# a comment between rows\n'
                    '0.5,1.5,2.5,3.5,4.5\n')
    (traj,) = read_csv(path, joint_names=('a', 'b'))
    assert traj.run == 'minimal' and traj.joint_names == ('a', 'b')
    assert traj.q.tolist() == [[2.0, 1.0], [2.5, 1.5]]
    assert traj.tau.tolist() == [[4.0, 3.0], [4.5, 3.5]]
    assert traj.qd is None and traj.u is None and traj.poses == {}
    (only_b,) = read_csv(path, joint_names=('b',))
    assert only_b.q.tolist() == [[1.0], [1.5]]


@pytest.mark.parametrize('text,message', [
    ('q:a\n1.0\n', "missing the time column 't'"),
    ('t,tau:a\n0,1\n', 'no position columns'),
    ('t,q:a,speed\n0,1,2\n', "unknown column 'speed'"),
    ('t,q:a,q:b,qd:a\n0,1,2,3\n', 'qd columns are incomplete: missing qd:b'),
    ('t,q:a,pose:box:x\n0,1,2\n', "pose of 'box' lacks column"),
    ('t,q:a\n0,1\n0.1,\n', "line 3, column 'q:a': not a number"),
    ('t,q:a\n0,1\n0.1,nan\n', "line 3, column 'q:a': non-finite"),
    ('t,q:a\n0,1\n0.1,2,3\n', 'line 3: 3 cells, expected 2'),
    ('t,q:a\n0,1\n0,2\n', 'line 3: time 0.0 does not increase'),
    ('t,q:a,t\n0,1,2\n', "column 't' appears twice"),
    ('t,q:a\n', 'no data rows'),
    ('', 'empty file'),
])
def test_csv_errors(tmp_path, text, message):
    path = tmp_path / 'bad.csv'
    path.write_text(text)
    with pytest.raises(TableError, match=message):
        read_csv(path)


def test_csv_missing_joint_and_file(tmp_path):
    path = write_csv(tmp_path / 'data.csv', _trajectory('', 0, poses=False))
    assert 'run' not in path.read_text().splitlines()[0]
    with pytest.raises(TableError, match=r"joint\(s\) \['wrist'\]; the table has joints"):
        read_csv(path, joint_names=('shoulder_joint', 'wrist'))
    with pytest.raises(TableError, match='does not exist'):
        read_csv(tmp_path / 'nope.csv')
    with pytest.raises(TableError, match='joints/signals'):
        write_csv(tmp_path / 'mixed.csv', [_trajectory('a', 0), _trajectory('b', 1, False)])


def test_npz_round_trip_and_reorder(tmp_path):
    traj = _trajectory('run7', 3)
    path = write_npz(tmp_path / 'run7', traj)
    assert path.suffix == '.npz'
    _assert_same(read_npz(path), traj)
    with np.load(path, allow_pickle=False) as archive:     # plain arrays, no pickles
        assert archive['joint_names'].tolist() == list(JOINTS)
    flipped = read_npz(path, joint_names=JOINTS[::-1])
    assert torch.equal(flipped.q, traj.q.flip(-1))
    with pytest.raises(TableError, match='no joint'):
        read_npz(path, joint_names=('wrist',))


def test_npz_errors(tmp_path):
    good = {'t': np.arange(3.0), 'q': np.zeros((3, 1)), 'joint_names': np.array(['a'])}
    cases = {
        'missing': ({k: v for k, v in good.items() if k != 'q'}, r"missing array\(s\) \['q'\]"),
        'nan': (dict(good, q=np.array([[0.0], [math.nan], [0.0]])), "'q' holds NaN"),
        'shape': (dict(good, tau=np.zeros((3, 2))), r'Trajectory.tau: expected shape \(3, 1\)'),
        'order': (dict(good, t=np.array([0.0, 2.0, 1.0])), 'strictly increasing'),
        'poses': (dict(good, poses=np.zeros((2, 3, 4, 4)), pose_names=np.array(['x'])),
                  'matching pose_names'),
    }
    for name, (arrays, message) in cases.items():
        path = tmp_path / f'{name}.npz'
        np.savez(path, **arrays)
        with pytest.raises(TableError, match=message):
            read_npz(path)
    pickled = tmp_path / 'pickled.npz'
    np.savez(pickled, **dict(good, joint_names=np.array([object()], dtype=object)))
    with pytest.raises(TableError, match='not a readable'):
        read_npz(pickled)
    (tmp_path / 'text.npz').write_text('hello')
    with pytest.raises(TableError) as info:
        read_npz(tmp_path / 'text.npz')
    assert isinstance(info.value, DiffsimError) and isinstance(info.value, ValueError)


def test_load_trajectories_dispatch(tmp_path):
    traj = _trajectory('r', 4, poses=False)
    csv_runs = load_trajectories(write_csv(tmp_path / 'a.csv', traj))
    npz_runs = load_trajectories(write_npz(tmp_path / 'b.npz', traj))
    _assert_same(csv_runs[0], traj)
    _assert_same(npz_runs[0], traj)
    (tmp_path / 'c.parquet').write_text('x')
    with pytest.raises(TableError, match='unknown data format'):
        load_trajectories(tmp_path / 'c.parquet')
    with pytest.raises(TableError, match='does not exist'):
        load_trajectories(tmp_path / 'd.parquet')
