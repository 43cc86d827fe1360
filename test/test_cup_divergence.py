"""
Ball contacts: the model-side check against MuJoCo, and ``benchmarks/cup_divergence.py``.

The diagnosis script is run as a user runs it.

The plant's ball collides with the arm's URDF shapes (``sim.cup.arm_shapes``); the policy
search's episodes end where the model's ball touches the same shapes
(``control.ball_in_cup.arm_contact``).  For the MuJoCo ball dropped from a straight,
horizontal string beside the still arm, MuJoCo's contacts and the model's test on the same
recorded positions must agree.
"""

import json
import os
from pathlib import Path
import subprocess
import sys

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / 'benchmarks' / 'cup_divergence.py'
HOME = (0.0, 0.2, 0.0, 0.4)


def _first_touch(direction):
    """
    Drop the ball from a straight string beside the still arm; return the touch indices.

    :return: ``(plant, model)``: the first driver period in which MuJoCo reports a contact,
        and the first recorded ball position that ``arm_contact`` calls touching (with the
        link poses of the recorded joint positions); None where there is none.
    """
    cup = pytest.importorskip('diffsim_ros.sim.cup')
    from diffsim_ros.control.ball_in_cup import arm_contact, link_poses, shape_axes
    truth = cup.nominal_truth()
    arm = truth.arm_model()
    plant = cup.CupPlant(truth)
    q_home = torch.tensor(HOME, dtype=torch.float64)

    def hold(times):
        q = q_home.expand(times.shape + (4,))
        return q, torch.zeros_like(q), torch.zeros_like(q)

    rec = plant.run(cup.tracking_controller(arm, hold), HOME, 0.8, string_direction=direction)
    plant_touch = int(rec.contact.argmax()) if rec.contact.any() else None
    shapes = cup.arm_shapes()
    T = link_poses(arm, shapes, torch.from_numpy(rec.q))
    touch = arm_contact(torch.from_numpy(rec.ball), shape_axes(T, shapes), shapes,
                        cup.BALL_RADIUS)
    model_touch = int(touch.int().argmax()) if bool(touch.any()) else None
    return plant_touch, model_touch


def test_model_and_plant_see_the_ball_touch_the_arm_at_the_same_place():
    """
    Swinging down onto the elbow: MuJoCo's contact and the model's test agree.

    The plant flags period ``k`` when a contact arises during it (between samples ``k`` and
    ``k + 1``), so the first touching sample is ``k`` or ``k + 1``.
    """
    plant_touch, model_touch = _first_touch((-1.0, 0.0, 0.0))
    assert plant_touch is not None and model_touch is not None
    assert 25 < plant_touch < 350
    assert model_touch in (plant_touch, plant_touch + 1)


def test_a_swing_beside_the_arm_touches_nothing_in_either():
    assert _first_touch((0.0, 1.0, 0.0)) == (None, None)


def test_help_names_the_options():
    out = subprocess.run([sys.executable, str(SCRIPT), '--help'], capture_output=True,
                         text=True, timeout=300, check=True).stdout
    for option in ('--seed', '--json', '--quick', '--searches', '--variants',
                   '--replay-friction', '--override'):
        assert option in out


def test_overrides_parse_into_truth_fields_and_reject_the_rest():
    sys.path.insert(0, str(ROOT))
    from benchmarks.cup_divergence import parse_overrides
    assert parse_overrides(['ball_mass=0.02', 'cup_rpy=0.1,-0.2,0.3']) == {
        'ball_mass': 0.02, 'cup_rpy': (0.1, -0.2, 0.3)}
    for bad in (['arm=1'], ['ball_mass'], ['cup_rpy=0.1,0.2'], ['ball_mass=heavy']):
        with pytest.raises(ValueError):
            parse_overrides(bad)
    out = subprocess.run([sys.executable, str(SCRIPT), '--override', 'cup_rpy=1'],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and 'cup_rpy takes 3 value(s)' in out.stderr


@pytest.mark.slow
def test_quick_run_compares_model_replay_and_plant(tmp_path):
    """The model agrees with the plant early on; without ball contacts nothing is touched."""
    pytest.importorskip('mujoco')
    path = tmp_path / 'div.json'
    env = dict(os.environ, OMP_NUM_THREADS='1')
    subprocess.run([sys.executable, str(SCRIPT), '--quick', '--seed', '2', '--threads', '1',
                    '--variants', 'plant,no_ball_contact', '--replay-friction', '0.16',
                    '--json', str(path)], check=True,
                   timeout=1800, env=env, cwd=ROOT)
    report = json.loads(path.read_text())
    assert len(report['swing_ups']) == 2
    for row in report['swing_ups']:
        plant = row['plant']
        # 0.25 s in, the oracle model's ball is within 1 cm of the plant's.
        assert plant['model']['at'][0] < 0.01
        assert plant['replay']['at'][0] < 0.01
        assert plant['replay_friction_0.16']['at'][0] < 0.01
        assert row['no_ball_contact']['contact_s'] == 0.0
        assert row['no_ball_contact']['touched'] == []
