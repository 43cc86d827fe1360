"""Bad toss files get one clear error, or a repair with a log line (no shared data needed)."""

import logging

from diffsim_ros.io.tosses import (CUBE_COLUMNS, CUBE_FILE, ELBOW_COLUMNS, ELBOW_FILE,
                                   load_cube_tosses, load_elbow_tosses)
import numpy as np
import pytest
import torch


def _write(root, file, columns, tosses, quat):
    rows = []
    for length in tosses:
        toss = np.zeros((length, len(columns)))
        toss[:, quat.start] = 1.0                       # identity, real part first
        rows.append(toss)
    states = np.concatenate(rows) if rows else np.zeros((0, len(columns)))
    offsets = np.cumsum([0] + list(tosses))
    path = root / file
    path.parent.mkdir(parents=True, exist_ok=True)
    return path, states, offsets


def _save(path, states, offsets, columns):
    np.savez(path, states=states, toss_offsets=offsets, toss_ids=np.arange(len(offsets) - 1),
             columns=np.array(columns), dt=np.array(1 / 148))


CASES = [(load_cube_tosses, CUBE_FILE, CUBE_COLUMNS, slice(3, 7)),
         (load_elbow_tosses, ELBOW_FILE, ELBOW_COLUMNS, slice(0, 4))]


@pytest.mark.parametrize('load, file, columns, quat', CASES)
def test_a_toss_of_one_sample_is_refused(tmp_path, load, file, columns, quat):
    path, states, offsets = _write(tmp_path, file, columns, [5, 1], quat)
    _save(path, states, offsets, columns)
    with pytest.raises(ValueError, match=r'toss 1 has 1 sample\(s\); a toss needs at least two'):
        load(tmp_path)


@pytest.mark.parametrize('load, file, columns, quat', CASES)
def test_a_nan_pose_is_refused_with_its_row(tmp_path, load, file, columns, quat):
    path, states, offsets = _write(tmp_path, file, columns, [4, 6], quat)
    states[4 + 3, quat.start + 1] = np.nan
    _save(path, states, offsets, columns)
    with pytest.raises(ValueError, match=r'toss 1 has a non-finite entry in row 3 \(of 6\)'):
        load(tmp_path)


@pytest.mark.parametrize('load, file, columns, quat', CASES)
def test_slightly_off_unit_quaternions_are_repaired_with_a_log_line(tmp_path, caplog, load,
                                                                    file, columns, quat):
    path, states, offsets = _write(tmp_path, file, columns, [4], quat)
    states[2, quat] = [0.999, 0.0, 0.0, 0.003]           # norm 0.999005: stored roughly
    _save(path, states, offsets, columns)
    with caplog.at_level(logging.WARNING, logger='diffsim_ros.io.tosses'):
        tosses = load(tmp_path)
    assert 'toss 0: renormalised 1 quaternion(s)' in caplog.text
    torch.testing.assert_close(tosses.q[0][2, 3:7].norm(), torch.tensor(1.0, dtype=torch.float64))


@pytest.mark.parametrize('load, file, columns, quat', CASES)
def test_numbers_that_are_not_a_quaternion_are_refused(tmp_path, load, file, columns, quat):
    path, states, offsets = _write(tmp_path, file, columns, [4], quat)
    states[1, quat] = [0.3, 0.2, 0.1, 0.0]                # Euler angles in the wrong place
    _save(path, states, offsets, columns)
    with pytest.raises(ValueError, match=r'toss 0 row 1: quaternion norm 0\.374166 is not a '
                                         r'unit quaternion'):
        load(tmp_path)


def test_a_wrapped_hinge_angle_is_unwrapped_with_a_log_line(tmp_path, caplog):
    path, states, offsets = _write(tmp_path, ELBOW_FILE, ELBOW_COLUMNS, [3, 4], slice(0, 4))
    states[3:, 7] = [3.0, 3.1, -3.1, -3.0]                # toss 1 crosses +-pi going up
    _save(path, states, offsets, ELBOW_COLUMNS)
    with caplog.at_level(logging.INFO, logger='diffsim_ros.io.tosses'):
        tosses = load_elbow_tosses(tmp_path)
    hinge = tosses.q[1][:, 7]
    assert bool((hinge.diff() > 0).all()) and float(hinge[-1]) > 3.2
    torch.testing.assert_close(hinge[:2], torch.tensor([3.0, 3.1], dtype=torch.float64))
    assert 'unwrapped the hinge angle' in caplog.text
    assert 'in 1 of 2 tosses; first: toss 1 from row 2' in caplog.text


def test_a_hinge_angle_that_never_wraps_is_left_alone_without_a_log_line(tmp_path, caplog):
    path, states, offsets = _write(tmp_path, ELBOW_FILE, ELBOW_COLUMNS, [4], slice(0, 4))
    states[:, 7] = [-3.0, -1.0, 1.0, 3.0]                 # large steps, no wrap
    _save(path, states, offsets, ELBOW_COLUMNS)
    with caplog.at_level(logging.INFO, logger='diffsim_ros.io.tosses'):
        hinge = load_elbow_tosses(tmp_path).q[0][:, 7]
    torch.testing.assert_close(hinge, torch.tensor([-3.0, -1.0, 1.0, 3.0], dtype=torch.float64))
    assert 'unwrapped' not in caplog.text
