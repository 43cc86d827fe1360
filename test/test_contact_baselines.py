"""
The contact-learning paper's baselines (DiffSim, DiffSim-R, end-to-end MLP) and the benchmark.

Identities first (DiffSim's prediction loss vanishes on tosses our contact step made with the
true parameters; a perfect velocity predictor replays recorded configurations through the
MLP's update), then recovery from simulated tosses with a hidden truth, the t-intervals of
the learning curves, and the benchmark run as a user runs it (slow, on the shared real cube
tosses; skipped when they are absent).
"""

import json
import math
from pathlib import Path
import subprocess
import sys

from diffsim_ros import core
from diffsim_ros.sysid import contact_baselines as cb
from diffsim_ros.sysid import contact_learning as cl
from diffsim_ros.sysid.object_learning import fit_object, METHODS
import pytest
from test_contact_learning import _cube, _tosses, DT, HALF, MASS
import torch

ROOT = Path(__file__).resolve().parent.parent


def test_baselines_are_registered():
    assert {'ccn', 'diffsim', 'diffsim-r', 'mlp'} <= set(METHODS)


def test_prediction_loss_vanishes_at_the_truth_and_grows_with_wrong_parameters():
    model, contact = _cube(friction=0.3)
    spec = cl.cube_spec(model, HALF, 0.3, MASS)
    q, v = _tosses(model, contact, 4, 30, seed=3, height=(0.1, 0.1), speed=1.5, spin=10.0)
    windows = cb.prediction_windows(q, v, 4)
    assert windows[0].shape == (4 * (32 - 5), 13) and windows[1].shape == (4 * 27, 4, 13)
    truth = cl.cube_models(model, spec.contact, cl.start_parameters(spec, 0, False), MASS)
    loss, delta2 = cb.prediction_loss(*truth, *windows, DT)
    assert float(loss.max()) < 1e-20 and float(delta2) == 0.0
    for mu in (0.15, 0.6):
        wrong = cl.cube_models(model, spec.contact, cl.cube_parameters(
            contact.vertices[0], mu, model.inertial.reshape(-1)), MASS)
        assert float(cb.prediction_loss(*wrong, *windows, DT)[0].mean()) > 1e-6, mu


def test_diffsim_without_steps_returns_the_spec_and_replays_its_tosses():
    model, contact = _cube(friction=0.3)
    spec = cl.cube_spec(model, HALF, 0.3, MASS)
    q, v = _tosses(model, contact, 2, 12, seed=1)
    x0 = torch.stack([torch.cat((q[k][1], v[k][1])) for k in range(2)])
    for method in ('diffsim', 'diffsim-r'):
        fit = fit_object(spec, method, (q, v), (q, v), DT, steps=0, perturb=False)
        summary = fit.summary()
        assert summary['volume_error'] == pytest.approx(0.0, abs=1e-9)
        assert summary['friction_error'] == pytest.approx(0.0, abs=1e-12)
        predicted = fit.predict(x0, 12, DT)
        assert torch.allclose(predicted[:, :, :7], torch.stack([x[2:] for x in q]),
                              atol=1e-9), method


def test_a_perfect_velocity_predictor_replays_recorded_configurations():
    # The MLP's configuration update (semi_implicit_update of step_velocity(v_next)) is the
    # one the recordings' backward differences and the contact step use.
    model, contact = _cube(friction=0.3)
    q, v = _tosses(model, contact, 3, 20, seed=4, height=(0.1, 0.1), speed=1.5, spin=10.0)
    for qi, vi in zip(q, v):
        q_next, v_next = core.semi_implicit_update(model, qi[1:-1],
                                                   cl.step_velocity(vi[2:], DT), DT)
        assert torch.allclose(q_next, qi[2:], atol=1e-12)
        assert torch.allclose(v_next, vi[2:], atol=1e-12)


def test_t_interval_of_identical_values_is_zero_wide_and_of_known_values_is_the_table_one():
    from benchmarks.contact_learning import t_interval
    same = t_interval([0.25, 0.25, 0.25])
    assert same['mean'] == 0.25 and same['half_width'] == 0.0 and same['n'] == 3
    # 1, 2, 3: mean 2, sample sd 1. Student's t with 2 dof has the closed-form CDF
    # 1/2 + t / (2 sqrt(2 + t^2)), so its 97.5 % point solves t / sqrt(2 + t^2) = 0.95.
    t975 = math.sqrt(2 * 0.95 ** 2 / (1 - 0.95 ** 2))
    known = t_interval([1.0, 2.0, 3.0])
    assert known['half_width'] == pytest.approx(t975 / math.sqrt(3), rel=1e-12)
    assert known['lower'] == pytest.approx(2.0 - known['half_width'], rel=1e-12)
    # The MLP has no volume: None entries drop out; one value has no interval.
    assert t_interval([None, None])['mean'] is None
    single = t_interval([0.5, None])
    assert single['mean'] == 0.5 and single['half_width'] is None


@pytest.mark.slow
def test_diffsim_moves_the_shape_toward_a_hidden_truth_from_a_perturbed_start():
    # Slow: 150 Adam steps of 64 four-step windows through contact_step (about a minute on an
    # idle core). Hidden truth: mu 0.3, a 10 cm cube; 6 training and 2 validation tosses made
    # by contact_step (no noise); the start 0.5-1.5x the truth (seed 0: volume error 0.30,
    # mu 0.23). Claims: the held-out prediction loss falls to under half its start and the
    # learned shape is closer to the truth (volume error below 95 % of the start's). Friction
    # is not claimed: from this start it moved away from 0.3 (to about 0.20) while the
    # ground sank and the vertices grew, the trade the prediction loss cannot tell apart on
    # six tosses (the paper's "DiffSim struggles").
    model, contact = _cube(friction=0.3)
    spec = cl.cube_spec(model, HALF, 0.3, MASS)
    q, v = _tosses(model, contact, 8, 40, seed=0, height=(0.1, 0.1), speed=1.5, spin=10.0)
    theta0 = cl.start_parameters(spec, 0, True)
    windows = cb.prediction_windows(q[:6], v[:6], 4)
    held_out = cb.prediction_windows(q[6:], v[6:], 4, 4)
    theta, history = cb.train_prediction(spec, theta0, None, windows, held_out, DT, 150, 0)
    start = cl.physical_summary(spec, *cl.cube_models(model, spec.contact, theta0, MASS))
    learned = cl.physical_summary(spec, *cl.cube_models(model, spec.contact, theta, MASS))
    assert min(history['validation']) < 0.5 * history['validation'][0], history
    assert learned['volume_error'] < 0.95 * start['volume_error'], (start, learned)


@pytest.mark.slow
def test_mlp_learns_free_flight_better_than_constant_velocity_on_held_out_tosses():
    # Slow: 300 Adam steps of the 4x256 network. Tosses released 1-1.2 m up never reach the
    # table in 12 samples, so the next velocity is a known smooth function of the state
    # (gravity in body axes and the turning frame, -w x v dt), which constant velocity misses
    # (g dt = 6.6 cm/s per sample). 64 training tosses: each toss shows the network one spin
    # only, and with 16 (of 30 samples) it did not generalise at all (held-out error equal to
    # the untrained net's, early stopping at step 0). Measured here: mean held-out error
    # 0.080 m/s against 0.105 for constant velocity and 0.104 untrained; the claim leaves
    # room for another seed's draw: better than 90 % of both.
    model, contact = _cube(friction=0.3)
    spec = cl.cube_spec(model, HALF, 0.3, MASS)
    q, v = _tosses(model, contact, 96, 12, seed=6, height=(1.0, 0.2), speed=1.5, spin=10.0)
    assert min(float(x[:, 2].min()) for x in q) > 0.2
    fit = fit_object(spec, 'mlp', (q[:64], v[:64]), (q[64:80], v[64:80]), DT, seed=0,
                     steps=30)
    assert fit.model is None and fit.summary() == {}
    network = fit.extra['network']
    q_k, v_k, v_next = cl.transitions(q[80:], v[80:])
    with torch.no_grad():
        learned = float((network(q_k, v_k) - v_next).norm(dim=-1).mean())
        untrained = float((v_k + network.out_mean - v_next).norm(dim=-1).mean())
    constant = float((v_k - v_next).norm(dim=-1).mean())
    assert learned < 0.9 * constant and learned < 0.9 * untrained, (learned, constant,
                                                                    untrained)
    x0 = torch.stack([torch.cat((q[k][1], v[k][1])) for k in range(80, 84)])
    predicted = fit.predict(x0, 12, DT)
    assert predicted.shape == (4, 12, 13) and bool(torch.isfinite(predicted).all())


@pytest.mark.slow
def test_learning_curve_benchmark_runs_quick_as_a_user_would(data_dir, tmp_path):
    """Run ``python benchmarks/contact_learning.py --quick`` and check its payload."""
    script = ROOT / 'benchmarks' / 'contact_learning.py'
    help_text = subprocess.run([sys.executable, str(script), '--help'], check=True,
                               capture_output=True, text=True, cwd=ROOT).stdout
    for option in ('--methods', '--sizes', '--seeds', '--plot', '--train-tosses', '--json'):
        assert option in help_text, option
    out, png = tmp_path / 'curves.json', tmp_path / 'curves.png'
    result = subprocess.run([sys.executable, str(script), '--quick', '--threads', '1',
                             '--methods', 'ccn,diffsim,mlp', '--data', str(data_dir),
                             '--json', str(out), '--plot', str(png)],
                            capture_output=True, text=True, cwd=ROOT, timeout=1200)
    assert result.returncode == 0, result.stderr
    assert '| mujoco_nominal |' in result.stdout and '| diffsim | 4 |' in result.stdout
    payload = json.loads(out.read_text())
    assert png.stat().st_size > 10000
    assert payload['sizes'] == [2, 4] and payload['seeds'] == [0, 1]
    assert set(payload['curves']) == {'ccn', 'diffsim', 'mlp'}
    assert set(payload['nominal']) == {'ours_nominal', 'mujoco_nominal'}
    assert len(payload['runs']) == 3 * 2 * 2
    for method, curve in payload['curves'].items():
        for size in ('2', '4'):
            stats = curve[size]['position_m']
            values = [r['position_m'] for r in payload['runs']
                      if r['method'] == method and r['size'] == int(size)]
            assert stats['n'] == 2 and stats['mean'] == pytest.approx(sum(values) / 2)
            assert stats['lower'] <= stats['mean'] <= stats['upper']
            assert 0.0 < stats['mean'] < 1.0
            assert 0.0 < curve[size]['orientation_rad']['mean'] < math.pi
    assert payload['curves']['mlp']['4']['volume_error']['mean'] is None
    assert 0.0 <= payload['curves']['ccn']['4']['volume_error']['mean'] < 2.0
