"""
The string identification benchmark, ``benchmarks/string_identification.py``, as users run it.

On a drawn MuJoCo cup plant the identified string model must predict held-out swings better
than the catalogue (nominal) model and sit closer to the hidden cup offset; the JSON carries
the figures the README reports.
"""

import json
import os
from pathlib import Path
import subprocess
import sys

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / 'benchmarks' / 'string_identification.py'


def test_help_names_the_options():
    out = subprocess.run([sys.executable, str(SCRIPT), '--help'], capture_output=True,
                         text=True, timeout=300, check=True).stdout
    for option in ('--seed', '--json', '--quick', '--string-length', '--arm-estimator',
                   '--swing-ups', '--swing-up-iterations'):
        assert option in out


@pytest.mark.slow
def test_quick_run_beats_the_nominal_model_on_held_out_swings(tmp_path):
    pytest.importorskip('mujoco')
    path = tmp_path / 'string.json'
    env = dict(os.environ, OMP_NUM_THREADS='1')
    subprocess.run([sys.executable, str(SCRIPT), '--quick', '--seed', '11', '--threads', '1',
                    '--swing-ups', '1', '--swing-up-iterations', '2', '--json', str(path)],
                   check=True, timeout=3000, env=env, cwd=ROOT)
    result = json.loads(path.read_text())['result']
    prediction = result['prediction_1s']
    assert prediction['diffnea']['mean_m'] < 0.5 * prediction['nominal']['mean_m']
    assert result['cup_offset_error_m'] < result['nominal_cup_offset_error_m']
    for name in ('diffnea', 'nominal', 'ffnn', 'lstm'):
        assert prediction[name]['mean_m'] > 0.0
    # Extrapolation: a swing-up searched on the identified model, executed on the plant.
    swing_up = result['swing_up_prediction_1s']
    assert len(swing_up['succeeded_on_plant']) == 1
    for name in ('diffnea', 'diffnea_no_damping', 'nominal', 'ffnn', 'lstm'):
        assert 0.0 < swing_up[name]['mean_m'] < float('inf')
    assert swing_up['diffnea']['mean_m'] < swing_up['nominal']['mean_m']
