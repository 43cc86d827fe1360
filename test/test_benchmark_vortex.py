"""
The simulated vortex study (``benchmarks/contact_vortex.py``), run as a user runs it.

The truth is known here, so the checks are against it: the hidden object's hull inertia
agrees with MuJoCo's own mesh inertia, CCN learned on field-free tosses ends closer to the
true shape and inertia than the perturbed start it was drawn at and predicts held-out tosses
better than that start, and the vortex matters (the truth rolled out without it misses the
vortex tosses by far more than the field-free ones, and with the exact field by far less).
"""

import json
import math
from pathlib import Path
import subprocess
import sys

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / 'benchmarks' / 'contact_vortex.py'


def test_hull_inertia_matches_mujoco_mesh_inertia():
    mujoco = pytest.importorskip('mujoco')
    sys.path.insert(0, str(ROOT))
    from benchmarks.contact_vortex import asymmetric_object, MASS_KG, VOLUME_M3
    truth = asymmetric_object(3)
    vertices = truth['vertices']
    assert vertices.shape == (6, 3)
    assert truth['volume_m3'] == pytest.approx(VOLUME_M3, rel=1e-9)
    text = ' '.join(repr(float(x)) for x in vertices.ravel())
    model = mujoco.MjModel.from_xml_string(
        f'<mujoco><asset><mesh name="hull" vertex="{text}"/></asset><worldbody><body>'
        f'<freejoint/><geom type="mesh" mesh="hull" mass="{MASS_KG}"/></body></worldbody>'
        '</mujoco>')
    # MuJoCo puts the body frame at the CoM and principal axes: compare the invariants.
    assert np.abs(model.body_ipos[1]).max() < 1e-9   # our CoM is the origin too
    assert np.allclose(np.sort(model.body_inertia[1]), np.linalg.eigvalsh(truth['inertia']),
                       rtol=1e-6, atol=0)


def test_benchmark_runs_quick_as_a_user_would(tmp_path):
    # Seconds: one CCN fit per condition on 4 simulated tosses, 40 steps.
    help_text = subprocess.run([sys.executable, str(SCRIPT), '--help'], check=True,
                               capture_output=True, text=True, cwd=ROOT).stdout
    for option in ('--quick', '--seed', '--seeds', '--sizes', '--methods', '--json'):
        assert option in help_text
    out = tmp_path / 'vortex.json'
    result = subprocess.run([sys.executable, str(SCRIPT), '--quick', '--threads', '1',
                             '--methods', 'ccn', '--json', str(out)],
                            capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stderr
    assert '| ccn | 4 |' in result.stdout and '| ours_truth_field |' in result.stdout
    payload = json.loads(out.read_text())
    none, vortex = payload['conditions']['none'], payload['conditions']['vortex']
    # The same releases, so the conditions differ only by the field.
    assert none['test_toss_ids'] == vortex['test_toss_ids']
    (run,) = none['runs']
    assert run['method'] == 'ccn' and run['last_step'] > 0
    for key in ('volume_error', 'inertia_error', 'position_m', 'orientation_rad'):
        assert run[key] < run['start_' + key], (key, run)
    assert 0.0 < run['friction'] and math.isfinite(run['friction'])
    truth, field = vortex['nominal']['ours_truth'], vortex['nominal']['ours_truth_field']
    assert truth['position_m'] > 3.0 * none['nominal']['ours_truth']['position_m']
    assert field['position_m'] < 0.5 * truth['position_m']


class _Stop(Exception):
    pass


def test_fit_object_threads_the_sim_weights_and_keeps_the_real_defaults(monkeypatch):
    import torch
    from diffsim_ros.sysid import contact_baselines as cb
    from diffsim_ros.sysid import contact_learning as cl
    from diffsim_ros.sysid.object_learning import fit_object
    assert cl.REGIMES['real'] == cl.ViolationWeights()
    assert (cl.REGIMES['sim'].w_res, cl.REGIMES['sim'].w_res_w) == (1e-3, 0.0)
    assert cb.DIFFSIM_REGIMES['real'] == cb.DiffSimConfig()
    assert (cb.DIFFSIM_REGIMES['sim'].w_res, cb.DIFFSIM_REGIMES['sim'].w_res_w) == (1.0, 0.0)
    seen = {}

    def spy(name, index):
        def record(*args, **kwargs):
            seen[name] = args[index]
            raise _Stop
        return record
    monkeypatch.setattr(cl, 'train_violation', spy('ccn', 7))
    monkeypatch.setattr(cb, 'train_prediction', spy('diffsim', 8))
    sys.path.insert(0, str(ROOT))
    from benchmarks.contact_vortex import asymmetric_object, DT, object_spec
    spec = object_spec(asymmetric_object(0))
    # Two resting tosses: enough to reach the training, which the spies stop.
    q = [torch.tensor([[0.0, 0.0, 0.1, 0.0, 0.0, 0.0, 1.0]] * 8, dtype=torch.float64)] * 2
    v = [torch.zeros(8, 6, dtype=torch.float64)] * 2
    with pytest.raises(ValueError, match='unknown regime .*sim'):
        fit_object(spec, 'ccn', (q, v), (q, v), DT, regime='drake')
    for regime, (w_res, w_res_w), (d_res, d_res_w) in (('real', (1.0, 0.1), (1000.0, 1.0)),
                                                       ('sim', (1e-3, 0.0), (1.0, 0.0))):
        for method in ('ccn-r', 'diffsim-r'):
            with pytest.raises(_Stop):
                fit_object(spec, method, (q, v), (q, v), DT, regime=regime)
        weights = seen['ccn'].weights
        assert (weights.w_res, weights.w_res_w) == (w_res, w_res_w)
        assert weights.w_comp == cl.ViolationWeights().w_comp
        assert (seen['diffsim'].w_res, seen['diffsim'].w_res_w) == (d_res, d_res_w)
