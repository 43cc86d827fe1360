"""
The plant's string against an ideal string: ``benchmarks/cup_fidelity.py``, run as a user.

The ideal string's ball flies a parabola while slack, stops its outward motion in an
inelastic snap and swings as a point-mass pendulum; the plant's string (``sim.cup``) must be
close to that, and the string it replaced (``LEGACY_STRING``) measurably was not.
"""

import json
import math
import os
from pathlib import Path
import subprocess
import sys

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / 'benchmarks' / 'cup_fidelity.py'


def test_ideal_pendulum_is_the_small_angle_cosine():
    sys.path.insert(0, str(ROOT))
    from benchmarks.cup_fidelity import ideal_pendulum
    length, theta0 = 0.4, 1e-3
    t = np.linspace(0.0, 2.0, 21)
    omega = math.sqrt(9.81 / length)
    np.testing.assert_allclose(ideal_pendulum(length, theta0, t), theta0 * np.cos(omega * t),
                               atol=1e-9)
    # at 90 degrees the quarter period is 1.18 times the small-angle one (2 K(1/sqrt 2) / pi)
    quarter = 1.8540747 * math.sqrt(length / 9.81)
    assert abs(ideal_pendulum(length, 0.5 * math.pi, np.array([quarter]))[0]) < 1e-6


def test_ideal_string_drops_straight_down_then_stops_dead():
    """A ball released half a length below the anchor falls freely, snaps, and hangs."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.cup_fidelity import ideal_string
    length, anchor = 0.4, np.zeros(3)
    t = np.linspace(0.0, 0.5, 251)
    out = ideal_string(np.array([0.0, 0.0, -0.5 * length]), np.zeros(3), anchor, length, t)
    snap = math.sqrt(2 * 0.5 * length / 9.81)
    assert len(out['snaps']) == 1 and abs(out['snaps'][0] - snap) < 1e-8
    falling = t < snap
    np.testing.assert_allclose(out['ball'][falling, 2], -0.5 * length - 0.5 * 9.81
                               * t[falling] ** 2, atol=1e-12)
    np.testing.assert_allclose(out['ball'][t > snap], [[0.0, 0.0, -length]] * int(
        (t > snap).sum()), atol=1e-9)


def test_ideal_string_taut_from_horizontal_is_the_pendulum():
    sys.path.insert(0, str(ROOT))
    from benchmarks.cup_fidelity import ideal_pendulum, ideal_string
    length = 0.4
    t = np.linspace(0.0, 1.0, 101)
    out = ideal_string(np.array([length, 0.0, 0.0]), np.zeros(3), np.zeros(3), length, t)
    theta = ideal_pendulum(length, 0.5 * math.pi, t)
    expected = length * np.stack([np.sin(theta), np.zeros_like(theta), -np.cos(theta)], -1)
    assert out['snaps'] == []
    np.testing.assert_allclose(out['ball'], expected, atol=2e-5)


def test_help_names_the_options():
    out = subprocess.run([sys.executable, str(SCRIPT), '--help'], capture_output=True,
                         text=True, timeout=300, check=True).stdout
    for option in ('--strings', '--seed', '--flailing', '--json', '--override'):
        assert option in out


def test_the_plant_string_is_close_to_an_ideal_string_and_the_old_one_was_not(tmp_path):
    pytest.importorskip('mujoco')
    path = tmp_path / 'fidelity.json'
    env = dict(os.environ, OMP_NUM_THREADS='1')
    subprocess.run([sys.executable, str(SCRIPT), '--strings', 'legacy,plant', '--json',
                    str(path)], check=True, timeout=900, env=env, cwd=ROOT,
                   capture_output=True)
    report = json.loads(path.read_text())
    plant, legacy = report['plant'], report['legacy']
    # slack: free fall puts the ball 4.9 cm lower after 0.1 s; the plant's ball is within
    # 1 cm of it (0.8 cm measured: the chain's damping), the old chain held it 3.9 cm up
    assert plant['drop']['error_m'][0] < 0.01
    assert legacy['drop']['error_m'][0] > 0.03
    assert plant['throw']['error_m'][1] < 0.5 * legacy['throw']['error_m'][1]
    # the plant's string comes taut within 30 ms of the ideal one (18 ms late measured on
    # the drop, its ball a little behind) and the snap is inelastic: the outward speed is
    # gone, the speed across the string kept
    for case in ('drop', 'throw'):
        snap = plant[case]
        assert abs(snap['taut_s']['plant'] - snap['taut_s']['ideal']) <= 0.03
        assert abs(snap['restitution']) < 0.2
        assert 0.9 < snap['tangential_kept'] < 1.15
    # taut: the horizontal release follows the point-mass pendulum to 1 cm over its first
    # half swing (the chain's 2 g make it a slightly different pendulum after that)
    # (the old chain: 3.7 cm at 0.5 s with the cup held at the tracking controller's
    # 50 rad/s, 4.6 cm when the hold was the old 20 rad/s one and let the cup move more)
    assert max(plant['pendulum']['error_m'][:4]) < 0.01
    assert max(legacy['pendulum']['error_m'][:4]) > 0.03
    # the snap from a 3.4 m/s outward fall (drop) and a 0.7 m/s one (throw), started from
    # the plant's ball 10 ms before it: plant and the string model at the search's 4 ms
    # both stay within 1 cm of the ideal inelastic string for 0.3 s after it (0.4 cm
    # measured for each), so neither the plant's soft tendon limit nor the model's
    # projection is what parts them on swing-ups
    for case in ('snap_drop', 'snap_throw'):
        snap = plant[case]
        assert len(snap['plant']) == 4
        assert max(snap['plant']) < 0.01
        assert max(snap['model_0.004']) < 0.01
        assert snap['anchor_moved_m'] < 1e-3
    assert plant['snap_drop']['radial_speed_mps'] > 2.0
    # a 20-degree swing loses little in 7 s (the old chain's joints took 6.6 degrees)
    assert plant['swing']['end_deg'] > 18.0
    assert legacy['swing']['end_deg'] < 14.0
