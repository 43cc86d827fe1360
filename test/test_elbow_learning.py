"""
Learning the two-link DAIR elbow: its spec, the multi-body parameterization, the violation loss.

Identities first (the spec is the URDF's boxes; parameters map back to the model exactly; the
violation loss vanishes on transitions our contact step made with the true two-link model and
grows when a parameter is wrong), then the elbow benchmark run as a user would (slow, skipped
without the shared data).
"""

import dataclasses
import json
import math
from pathlib import Path
import subprocess
import sys
from types import SimpleNamespace

from diffsim_ros import core
from diffsim_ros.io.object_urdf import (ELBOW_SMOOTH_WINDOW, elbow_spec, ELBOW_WEIGHTS,
                                        object_spec, urdf_object_spec)
from diffsim_ros.robots import object_urdf_path
from diffsim_ros.sysid import contact_learning as cl
from diffsim_ros.sysid.object_learning import fit_object
import pytest
import torch

DT = 0.0068
REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope='module')
def spec():
    """Return the elbow's spec from the shipped URDF (no recordings needed)."""
    return elbow_spec(SimpleNamespace(urdf_path=object_urdf_path('elbow_toss'), friction=0.3,
                                      q=(torch.zeros(1, 8, dtype=torch.float64),)))


def _tosses(model, contact, n, steps, seed):
    # Elbows released tumbling 12-15 cm above the table (elbow_1's frame; the far corner of
    # elbow_2 is at most 12 cm from it), hinge swinging, stepped by contact_step.
    g = torch.Generator().manual_seed(seed)

    def uniform(*shape, scale=1.0):
        return (torch.rand(*shape, generator=g, dtype=torch.float64) * 2 - 1) * scale

    quat = torch.randn(n, 4, generator=g, dtype=torch.float64)
    quat = quat / quat.norm(dim=-1, keepdim=True)
    lift = 0.135 + uniform(n, 1, scale=0.015)
    q = torch.cat((torch.zeros(n, 2, dtype=torch.float64), lift, quat, uniform(n, 1, scale=2.0)),
                  -1)
    v = torch.cat((uniform(n, 2), -torch.rand(n, 1, generator=g, dtype=torch.float64),
                   uniform(n, 3, scale=6.0), uniform(n, 1, scale=5.0)), -1)
    x0 = torch.cat((q, v), -1)
    states = cl.rollout(model, contact, x0, steps, DT)
    # transitions() skips sample 0 (a repeated velocity in the recordings): prepend a copy.
    states = torch.cat((x0.unsqueeze(1), x0.unsqueeze(1), states), 1)
    return [s[:, :8] for s in states], [s[:, 8:] for s in states]


def test_elbow_spec_is_the_urdf_boxes_and_masses(spec):
    assert spec.name == 'elbow' and spec.masses == (0.37, 0.37) and spec.mass == 0.74
    assert spec.contact.vertex_links == ('elbow_1', 'elbow_2') == spec.model.tree.body_links
    assert spec.half_widths == ((0.05, 0.025, 0.025),) * 2
    first, second = spec.contact.vertices
    assert first.shape == second.shape == (8, 3)
    torch.testing.assert_close(first.amax(0), torch.tensor([0.05, 0.025, 0.025],
                                                           dtype=torch.float64))
    torch.testing.assert_close(second.amin(0), torch.tensor([-0.015, -0.025, -0.025],
                                                            dtype=torch.float64))
    torch.testing.assert_close(second.amax(0), torch.tensor([0.085, 0.025, 0.025],
                                                            dtype=torch.float64))
    assert spec.true_vertices is not None and spec.true_inertial is None
    assert float(spec.contact.friction) == pytest.approx(0.3)


def test_collision_box_origin_rotates_and_shifts_the_corners(tmp_path):
    path = tmp_path / 'slab.urdf'
    path.write_text('<robot name="slab"><link name="a"><inertial><mass value="1"/><inertia '
                    'ixx="1" ixy="0" ixz="0" iyy="1" iyz="0" izz="1"/></inertial><collision>'
                    '<origin xyz="0.1 0 0" rpy="0 0 1.5707963267948966"/><geometry><box '
                    'size="0.2 0.04 0.02"/></geometry></collision></link></robot>',
                    encoding='utf-8')
    spec = urdf_object_spec(path, 0.5)
    vertices = spec.contact.vertices[0]
    # yawed 90 degrees: the 0.2 m side lies along y, the box centred at x = 0.1
    torch.testing.assert_close(vertices.amax(0) - vertices.amin(0),
                               torch.tensor([0.04, 0.2, 0.02], dtype=torch.float64))
    torch.testing.assert_close(vertices.mean(0), torch.tensor([0.1, 0.0, 0.0],
                                                              dtype=torch.float64))
    assert spec.half_widths[0] == pytest.approx((0.02, 0.1, 0.01))


def test_a_body_without_a_contact_shape_is_refused(tmp_path):
    path = tmp_path / 'r.urdf'
    path.write_text('<robot name="r"><link name="a"><inertial><mass value="1"/><inertia '
                    'ixx="1" ixy="0" ixz="0" iyy="1" iyz="0" izz="1"/></inertial><collision>'
                    '<geometry><sphere radius="0.1"/></geometry></collision></link></robot>',
                    encoding='utf-8')
    with pytest.raises(ValueError, match="link 'a': collision 'sphere' is not supported"):
        urdf_object_spec(path, 0.5)


def test_the_elbow_by_name_is_the_elbow_of_the_tosses():
    spec = object_spec('elbow')
    assert spec.name == 'elbow' and spec.contact.vertex_links == ('elbow_1', 'elbow_2')
    assert spec.half_widths == ((0.05, 0.025, 0.025),) * 2


def test_the_elbow_learns_with_its_own_weights_and_the_cube_with_the_defaults(spec):
    # Chosen per object on each one's held-out tosses (contact_weights.py --object): the
    # elbow's by name and from its tosses are the same; the cube keeps ViolationWeights'.
    for elbow in (spec, object_spec('elbow')):
        weights = elbow.violation_weights()
        assert (weights.w_comp, weights.w_pen) == (ELBOW_WEIGHTS['w_comp'],
                                                   ELBOW_WEIGHTS['w_pen'])
    assert ELBOW_WEIGHTS != {'w_comp': cl.ViolationWeights().w_comp,
                             'w_pen': cl.ViolationWeights().w_pen}
    assert object_spec('cube').violation_weights() == cl.ViolationWeights()


def test_parameters_map_back_to_the_model_exactly(spec):
    theta = cl.object_parameters(spec.contact.vertices, 0.3, spec.model.inertial)
    assert theta['vertices'].shape == (16, 3) and theta['inertia'].shape == (18,)
    model, contact = cl.object_models(spec.model, spec.contact, theta, spec.masses)
    torch.testing.assert_close(model.inertial, spec.model.inertial)
    for learned, nominal in zip(contact.vertices, spec.contact.vertices):
        torch.testing.assert_close(learned, nominal)
    assert cl.volume_error(contact.vertices, spec.true_vertices) == pytest.approx(0, abs=1e-9)
    assert cl.inertia_error(model.inertial, spec.model.inertial, 0.035) < 1e-9


def test_paper_start_keeps_each_mass_and_puts_each_com_in_its_box(spec):
    for seed in range(5):
        theta = cl.initial_object_parameters(spec.contact.vertices, 0.3, spec.half_widths,
                                             spec.masses, torch.Generator().manual_seed(seed))
        model, contact = cl.object_models(spec.model, spec.contact, theta, spec.masses)
        pi = model.inertial
        torch.testing.assert_close(pi[:, 0], torch.tensor(spec.masses, dtype=pi.dtype))
        com = pi[:, 1:4] / pi[:, :1]
        # inner half of a box at most 1.5x the true one, around each true box's centre
        centre = torch.tensor([[0.0, 0, 0], [0.035, 0, 0]], dtype=pi.dtype)
        half = torch.tensor(spec.half_widths, dtype=pi.dtype)
        assert bool(((com - centre).abs() <= 0.75 * half + 1e-12).all()), seed
        assert 0.15 < float(contact.friction) < 0.45
        for learned, nominal in zip(contact.vertices, spec.contact.vertices):
            ratio = learned / nominal
            assert bool(((ratio >= 0.5) & (ratio <= 1.5)).all())
        # physically consistent: the 4x4 pseudo-inertia of each body is positive definite
        assert bool(core.parameterization.is_physically_consistent(pi).all())


def test_violation_loss_vanishes_on_two_link_transitions_and_grows_with_wrong_parameters(spec):
    # Two tosses of 30 steps: 60 transitions, each an inner cone QP of 16 contacts.
    model, contact = spec.model, spec.contact
    q, v = _tosses(model, contact, 2, 30, seed=0)
    data = cl.transitions(q, v)
    weights = cl.ViolationWeights(max_iter=2000)
    loss, impulses = cl.violation_loss(model, contact, *data, DT, weights,
                                       return_impulses=True)
    in_contact = (impulses[..., 0] > 0).any(-1)
    assert float(in_contact.double().mean()) > 0.3
    # both links touch the table at some transition (the hinge's Jacobian is exercised)
    assert bool((impulses[..., :8, 0] > 0).any()) and bool((impulses[..., 8:, 0] > 0).any())
    # What is left at the truth is the complementarity cost of Anitescu's hop (w_comp dt mu
    # lambda_n |v_t| where a contact slides, test_contact_learning's test): without that
    # term the loss vanishes and every wrong parameter costs ten times more; with it, every
    # wrong parameter still costs more than the truth.
    hopless_weights = cl.ViolationWeights(w_comp=0.0, max_iter=2000)
    hopless = cl.violation_loss(model, contact, *data, DT, hopless_weights)
    assert float(hopless.min()) > -1e-12 and float(hopless.mean()) < 1e-6
    assert float(loss.min()) > -1e-12
    base, hopless_base = float(loss.mean()), float(hopless.mean())
    pi = model.inertial
    link2_com = torch.zeros_like(pi)
    link2_com[1, 1] = 0.37 * 0.01
    wrong = {
        'friction x0.5': cl.object_parameters(contact.vertices, 0.15, pi),
        'vertices x1.2': cl.object_parameters([1.2 * x for x in contact.vertices], 0.3, pi),
        'elbow_2 vertices x0.8': cl.object_parameters(
            [contact.vertices[0], 0.8 * contact.vertices[1]], 0.3, pi),
        'ground +5 mm': cl.object_parameters(contact.vertices, 0.3, pi, 0.005),
        'inertia x2': cl.object_parameters(
            contact.vertices, 0.3, pi * torch.tensor([1.0] * 4 + [2.0] * 6, dtype=pi.dtype)),
        'elbow_2 CoM +1 cm': cl.object_parameters(contact.vertices, 0.3, pi + link2_com)}
    for name, theta in wrong.items():
        m, k = cl.object_models(model, contact, theta, spec.masses)
        value = float(cl.violation_loss(m, k, *data, DT, hopless_weights).mean())
        assert value > 10 * hopless_base, f'{name}: {value} vs true {hopless_base}'
        value = float(cl.violation_loss(m, k, *data, DT, weights).mean())
        assert value > base, f'{name}: {value} vs true {base}'


def test_fit_ccn_learns_the_elbow_through_fit_object(spec):
    # A few Adam steps from the paper's start on simulated tosses: the entry the CLI and the
    # benchmark use runs on a two-body spec, keeps the masses and lowers the held-out loss.
    # (noise-free simulated tosses: the elbow's smoothing, a remedy for mocap noise, is off)
    spec = dataclasses.replace(spec, smooth_window=1)
    q, v = _tosses(spec.model, spec.contact, 3, 16, seed=1)
    fit = fit_object(spec, 'ccn', (q[:2], v[:2]), (q[2:], v[2:]), DT, seed=0, steps=6)
    torch.testing.assert_close(fit.model.inertial[:, 0],
                               torch.tensor(spec.masses, dtype=torch.float64))
    assert len(fit.contact.vertices) == 2
    history = fit.history['validation']
    assert fit.history['step'] == [0, 6] and history[1] < history[0]
    summary = fit.summary()
    assert summary['vertex_sets'] == [['elbow_1', 8], ['elbow_2', 8]]
    assert 'volume_error' in summary and 'inertia_error' not in summary
    assert summary['volume_error'] == pytest.approx(fit.start['volume_error'], rel=0.5)
    states = fit.predict(torch.cat((q[0][1], v[0][1])).unsqueeze(0), 4, DT)
    assert states.shape == (1, 4, 15)


def test_an_objects_own_violation_weights_reach_ccn_through_fit_object(spec):
    # ObjectSpec.w_comp / w_pen replace the regime's (the cube's defaults) and nothing else;
    # fit_object's CCN measures its validation loss with them (zero steps: the loss at the
    # start, the spec itself: without the learned hinge damping, whose start is not the
    # URDF's zero).
    plain = dataclasses.replace(spec, w_comp=None, w_pen=None)
    assert plain.violation_weights() == cl.ViolationWeights()
    own = dataclasses.replace(spec, w_comp=50.0, w_pen=3.0, smooth_window=1, joint_damping=False)
    sim = own.violation_weights('sim')
    assert (sim.w_comp, sim.w_pen) == (50.0, 3.0)
    assert (sim.w_res, sim.w_res_w) == (cl.REGIMES['sim'].w_res, cl.REGIMES['sim'].w_res_w)
    with pytest.raises(ValueError, match='unknown regime'):
        own.violation_weights('lab')
    q, v = _tosses(spec.model, spec.contact, 2, 16, seed=2)
    data = cl.transitions(q, v)
    expected = {}
    for name, weights in (('own', cl.ViolationWeights(w_comp=50.0, w_pen=3.0)),
                          ('default', cl.ViolationWeights())):
        expected[name] = float(cl.violation_loss(spec.model, spec.contact, *data, DT,
                                                 weights).mean())
    assert expected['own'] > 2 * expected['default']   # the hop's cost, 50x heavier
    fit = fit_object(own, 'ccn', (q, v), (q, v), DT, steps=0, perturb=False)
    assert fit.history['validation'][0] == pytest.approx(expected['own'], rel=1e-6)


def _run_script(name, data_dir, tmp_path, args, help_words):
    # A benchmark as a user runs it: its --help names help_words, then --quick with args and
    # --json; skipped without the elbow tosses. Returns the completed process and its JSON.
    if not (data_dir / 'dair_elbow_toss' / 'elbow_tosses.npz').is_file():
        pytest.skip(f'elbow tosses not found under {data_dir} (dair_elbow_toss/)')
    script = REPO_ROOT / 'benchmarks' / name
    help_text = subprocess.run([sys.executable, str(script), '--help'], check=True,
                               capture_output=True, text=True, cwd=REPO_ROOT).stdout
    assert all(word in help_text for word in help_words), help_text
    out = tmp_path / 'out.json'
    result = subprocess.run([sys.executable, str(script), '--quick', '--threads', '1',
                             '--data', str(data_dir), '--json', str(out)] + list(args),
                            capture_output=True, text=True, cwd=REPO_ROOT, timeout=3600)
    assert result.returncode == 0, result.stderr[-2000:]
    return result, json.loads(out.read_text())


@pytest.mark.slow
def test_elbow_benchmark_runs_quick_as_a_user_would(data_dir, tmp_path):
    # Slow: a few Adam steps of the violation loss on two real tosses and the test rollouts.
    result, payload = _run_script('elbow_learning.py', data_dir, tmp_path, [],
                                  ('--horizon', '--quick', '--seeds', '--combine',
                                   '--smooth-window'))
    assert payload['quick'] and payload['horizon'] == 16
    assert payload['smooth_window'] == ELBOW_SMOOTH_WINDOW
    for name in ('ccn', 'ours_nominal', 'mujoco_nominal'):
        for window in ('horizon', 'full'):
            row = payload['errors'][window][name]
            for key in ('position_m', 'orientation_rad', 'hinge_rad'):
                assert math.isfinite(row[key]['mean']), (window, name, key)
    # the fit saw none of the test tosses
    assert not set(payload['test_toss_ids']) & set(payload['train_toss_ids'])
    assert '| ccn |' in result.stdout and '| mujoco_nominal |' in result.stdout
    # --rescore: the fits rebuilt from the JSON, on the fresh tosses (three in a smoke run)
    saved = tmp_path / 'out.json'
    out = tmp_path / 'fresh.json'
    rescored = subprocess.run([sys.executable, str(REPO_ROOT / 'benchmarks' / 'elbow_learning.py'),
                               '--rescore', str(saved), '--quick', '--threads', '1', '--data',
                               str(data_dir), '--json', str(out)], capture_output=True, text=True,
                              cwd=REPO_ROOT, timeout=3600)
    assert rescored.returncode == 0, rescored.stderr[-2000:]
    fresh = json.loads(out.read_text())
    assert fresh['test_tosses'] == 3 and len(fresh['runs']) == len(payload['runs'])
    assert not set(fresh['fresh_tosses']) & set(payload['test_toss_ids'])
    for name in ('ccn', 'ours_nominal', 'mujoco_nominal'):
        assert math.isfinite(fresh['errors']['horizon'][name]['hinge_rad']['mean'])


@pytest.mark.slow
def test_elbow_weight_search_runs_quick_and_judges_on_tosses_the_elbow_split_leaves(
        data_dir, tmp_path):
    # ``contact_weights.py --object elbow --quick``: the elbow's horizon errors (hinge too),
    # judged on tosses outside the elbow benchmark's training (up to 256), validation and
    # test tosses.
    result, payload = _run_script('contact_weights.py', data_dir, tmp_path,
                                  ['--object', 'elbow'], ('--object', 'elbow'))
    assert payload['object'] == 'elbow'
    assert payload['error_keys'] == ['position_m', 'orientation_rad', 'hinge_rad']
    assert {(p['w_comp'], p['w_pen']) for p in payload['pairs']} == {(1.0, 10.0), (1.0, 100.0)}
    for row in payload['runs'] + [payload['nominal']]:
        assert 0.0 < row['position_m'] < 1.0
        assert 0.0 < row['orientation_rad'] < math.pi and 0.0 < row['hinge_rad'] < math.pi
    sys.path.insert(0, str(REPO_ROOT))
    try:
        from benchmarks import contact_learning as curves, elbow_learning as bench
    finally:
        sys.path.remove(str(REPO_ROOT))
    train, val, test = curves.split(541, bench.LARGEST_TRAINING, bench.VALIDATION_TOSSES,
                                    bench.TEST_TOSSES, 0)
    judged = set(payload['selection_tosses'])
    assert len(judged) == 4 and not judged & (set(train) | set(val) | set(test))
    assert '| 1 | - | 1 | 10 |' in result.stdout and 'hinge deg' in result.stdout
    # smoothing spans impacts unless --impact-jumps says otherwise; the shape is the elbow's
    assert {p['impact_jump'] for p in payload['pairs']} == {None}
    assert payload['shape'] == 'boxes'


def test_free_flight_hinge_damping_is_recovered_by_the_centred_rate_not_the_noisy_one(spec):
    # elbow_diagnosis.hinge_friction on elbows tumbling 1.5 m above the table with a known
    # viscous hinge damping b (tau = -b rate in the contact step) and hinge angles read with
    # 1 mrad noise, their rates backward differences as in the recordings: the slope on the
    # centred rate is -b within its standard error; the slope on the recorded rate reads the
    # angle noise as several times more damping.
    sys.path.insert(0, str(REPO_ROOT))
    try:
        from benchmarks import elbow_diagnosis
    finally:
        sys.path.remove(str(REPO_ROOT))
    g = torch.Generator().manual_seed(0)
    n, steps, damping = 8, 60, 0.01

    def uniform(*shape, scale):
        return (torch.rand(*shape, generator=g, dtype=torch.float64) * 2 - 1) * scale

    quat = torch.randn(n, 4, generator=g, dtype=torch.float64)
    q = torch.cat((torch.zeros(n, 2, dtype=torch.float64),
                   torch.full((n, 1), 1.5, dtype=torch.float64),
                   quat / quat.norm(dim=-1, keepdim=True), torch.zeros(n, 1, dtype=torch.float64)),
                  -1)
    v = torch.cat((torch.zeros(n, 2, dtype=torch.float64),
                   torch.full((n, 1), 2.0, dtype=torch.float64), uniform(n, 3, scale=4.0),
                   uniform(n, 1, scale=8.0)), -1)
    qs, vs = [q], [v]
    for _ in range(steps):
        tau = torch.zeros_like(v)
        tau[:, -1] = -damping * v[:, -1]
        step = core.contact_step(spec.model, q, v, tau, DT, spec.contact)
        q, v = step.q, step.v
        qs.append(q)
        vs.append(v)
    q, v = torch.stack(qs, 1), torch.stack(vs, 1)
    q[..., 7] += 1e-3 * torch.randn(q.shape[:2], generator=g, dtype=torch.float64)
    v[:, 1:, 6] = (q[:, 1:, 7] - q[:, :-1, 7]) / DT
    tosses = SimpleNamespace(q=list(q), v=list(v), dt=DT)
    found = elbow_diagnosis.hinge_friction(spec, tosses, range(n))
    assert found['transitions'] > 300
    assert found['slope_centred_se'] < 0.5 * damping
    assert abs(found['slope_centred_rate'] + damping) < 3 * found['slope_centred_se']
    assert found['slope_noisy_rate'] < -2 * damping


@pytest.mark.slow
def test_elbow_diagnosis_runs_quick_as_a_user_would(data_dir, tmp_path):
    # Slow: a 5-step CCN fit on 4 real tosses, the loss terms and 4 selection tosses' windows.
    result, payload = _run_script('elbow_diagnosis.py', data_dir, tmp_path, [],
                                  ('--selection-tosses', '--quick'))
    assert payload['hinge_friction']['transitions'] > 0
    for model in ('nominal', 'ccn'):
        classes = payload['loss_terms'][model]
        assert set(classes) == {'free', 'near', 'contact'}
        total = sum(row['transitions'] for row in classes.values())
        assert total == payload['train_tosses'] * 119
        for row in classes.values():
            parts = sum(row[k] for k in ('prediction', 'complementarity', 'dissipation',
                                         'penetration'))
            assert row['loss'] == pytest.approx(parts, rel=1e-6, abs=1e-12)
    assert set(payload['transplants']) >= {'nominal', 'learned'}
    assert '| nominal + learned inertia |' in result.stdout
    # measure 4: on the nominal elbow's own noise-free rollouts the violation loss is lowest
    # at the friction they were made with; every data set has a minimiser on the grid
    four = payload['noise_as_friction']
    assert four['friction']['simulated']['mu'] == pytest.approx(0.3)
    assert set(four['friction']) == {'recorded', 'smoothed', 'simulated', 'simulated_noisy',
                                     'simulated_noisy_smoothed'}
    for row in four['friction'].values():
        assert min(row['relative']) == 1.0 and len(row['relative']) == len(four['grid'])
    assert 0.0 < four['noise']['position_m'] < 0.01 and four['noise']['samples'] > 0
    assert '| simulated_noisy |' in result.stdout
    _check_vertex_pull(payload, result.stdout)


def _check_vertex_pull(payload, stdout):
    # measure 5: the terms' derivatives add up to the loss's (envelope theorem at the inner
    # optimum) and the classes to all transitions, on every data set
    five = payload['vertex_pull']
    assert len(five['pull']) == 3 and five['impacts_per_toss'] > 0
    for classes in five['pull'].values():
        assert classes['all']['transitions'] == payload['train_tosses'] * 119
        for row in classes.values():
            parts = sum(row[k] for k in ('prediction', 'complementarity', 'dissipation',
                                         'penetration'))
            assert row['loss'] == pytest.approx(parts, rel=1e-9, abs=1e-15)
        for key in ('loss', 'loss_dz', 'transitions'):
            assert classes['all'][key] == pytest.approx(
                sum(classes[c][key] for c in ('free', 'near', 'contact')), rel=1e-9, abs=1e-15)
    assert '| recorded | contact |' in stdout


def test_elbow_diagnosis_pull_only_runs_as_a_user_would(data_dir, tmp_path):
    result, payload = _run_script('elbow_diagnosis.py', data_dir, tmp_path, ['--pull-only'],
                                  ('--pull-only', '--impact-jump'))
    assert 'noise_as_friction' not in payload and 'loss_terms' not in payload
    _check_vertex_pull(payload, result.stdout)


@pytest.mark.slow
def test_elbow_diagnosis_group_seeds_runs_as_a_user_would(data_dir, tmp_path):
    # Measure 6: one 5-step fit; the learned row and the row with every group put back
    # bracket the single swaps, and the all-nominal row is measure 3's nominal elbow.
    result, payload = _run_script('elbow_diagnosis.py', data_dir, tmp_path,
                                  ['--group-seeds', '1'], ('--group-seeds',))
    (run,) = payload['seeds']
    assert run['seed'] == 1 and run['validation_loss'] > 0
    assert set(run['groups']) == {'learned', 'nominal'} | {
        f'learned, nominal {g}' for g in ('mu', 'box 1', 'box 2', 'inertia 1', 'inertia 2')}
    assert len(run['links']) == 2 and len(payload['nominal_links']) == 2
    nominal = payload['nominal_links']
    assert nominal[1]['com_m'] == pytest.approx([0.035, 0.0, 0.0], abs=1e-12)
    assert nominal[0]['principal_kg_m2'] == pytest.approx([6.167e-4] * 3, rel=1e-9)
    assert sum(link['mass_kg'] for link in run['links']) == pytest.approx(0.74, rel=1e-12)
    assert all(v > 0 for v in run['validation_rollout'].values())
    assert '| 1 |' in result.stdout and 'learned, nominal inertia 2' in result.stdout


def test_runs_of_several_methods_combine_only_on_the_same_tosses():
    # One process per method, merged into one table (elbow_learning.py --combine): rows and
    # runs of both, the nominal rows once, the CCN weights of the violation-loss run.
    sys.path.insert(0, str(REPO_ROOT))
    try:
        from benchmarks import elbow_learning as bench
    finally:
        sys.path.remove(str(REPO_ROOT))
    stats = {key: {'mean': 0.01, 'half_width': None} for key in bench.ERROR_KEYS}

    def payload(method, weights):
        rows = {'ours_nominal': {k: {'mean': 0.006, 'median': 0.006, 'p90': 0.009}
                                 for k in bench.ERROR_KEYS}, method: stats}
        return {'test_toss_ids': [3, 1], 'train_toss_ids': [5], 'horizon': 16,
                'window_stride': 4, 'windows': 2, 'methods': [method], 'seeds': [0],
                'runs': [{'method': method, 'seed': 0, 'learned': {}, 'start': {}}],
                'errors': {'horizon': dict(rows), 'full': dict(rows)},
                'violation_weights': weights, 'train_tosses': 1, 'start_from': 'paper',
                'test_tosses': 2}

    ccn = payload('ccn', {'w_comp': 10.0, 'w_pen': 100.0})
    diffsim = payload('diffsim', {'w_comp': 1.0, 'w_pen': 10.0})
    merged = bench.combine([diffsim, ccn])
    assert merged['methods'] == ['diffsim', 'ccn'] and len(merged['runs']) == 2
    assert set(merged['errors']['horizon']) == {'ours_nominal', 'diffsim', 'ccn'}
    assert merged['violation_weights'] == {'w_comp': 10.0, 'w_pen': 100.0}
    assert '| ccn | 10 | 0.573 | 0.573 |' in bench.markdown(merged)   # mm, deg, deg
    with pytest.raises(ValueError, match='different tosses'):
        bench.combine([ccn, dict(diffsim, test_toss_ids=[3, 2])])
    with pytest.raises(ValueError, match='repeated'):
        bench.combine([ccn, ccn])

    # one method's seeds from two processes: its rows from both runs' errors
    def seeded(seed, value):
        one = {key: {'mean': value} for key in bench.ERROR_KEYS}
        return dict(ccn, seeds=[seed], runs=[{'method': 'ccn', 'seed': seed, 'learned': {},
                                              'start': {},
                                              'errors': {'horizon': one, 'full': one}}])
    merged = bench.combine([seeded(0, 0.01), seeded(1, 0.03)])
    assert merged['seeds'] == [0, 1] and len(merged['runs']) == 2
    row = merged['errors']['horizon']['ccn']['hinge_rad']
    assert row['mean'] == pytest.approx(0.02) and row['half_width'] > 0
    with pytest.raises(ValueError, match='different settings'):
        bench.combine([seeded(0, 0.01), dict(seeded(1, 0.03), restarts=3)])


def _split_model(spec, split):
    # The nominal elbow's parameters with a given mass split (log m_2 / m_1).
    theta = cl.object_parameters(spec.contact.vertices, 0.3, spec.model.inertial)
    theta['mass_split'] = torch.tensor([split], dtype=torch.float64)
    return theta


def test_a_learned_mass_split_keeps_the_total_mass_and_each_com_and_is_differentiable(spec):
    # ObjectSpec.mass_split: the split moves mass between the links, never the total; each
    # link's CoM stays and its inertia scales with its mass (the paper's "proportionally").
    nominal, _ = cl.object_models(spec.model, spec.contact, _split_model(spec, 0.0),
                                  spec.masses)
    torch.testing.assert_close(nominal.inertial, spec.model.inertial, rtol=1e-12, atol=1e-15)
    for split in (-2.0, -0.3, 0.7, 3.0):
        model, _ = cl.object_models(spec.model, spec.contact, _split_model(spec, split),
                                    spec.masses)
        masses = model.inertial[:, 0]
        assert float(masses.sum()) == pytest.approx(spec.mass, rel=1e-14)
        assert float(torch.log(masses[1] / masses[0])) == pytest.approx(split, rel=1e-12)
        ratio = (masses / nominal.inertial[:, 0]).unsqueeze(-1)
        torch.testing.assert_close(model.inertial, nominal.inertial * ratio, rtol=1e-12,
                                   atol=1e-15)
    split = torch.tensor([0.4], dtype=torch.float64, requires_grad=True)

    def inertials(s):
        theta = dict(_split_model(spec, 0.0), mass_split=s)
        return cl.object_models(spec.model, spec.contact, theta, spec.masses)[0].inertial

    assert torch.autograd.gradcheck(inertials, (split,))
    torch.testing.assert_close(cl.mass_shares(cl.mass_split_parameters([0.2, 0.6])),
                               torch.tensor([0.25, 0.75], dtype=torch.float64))


def test_the_mass_split_start_draws_each_mass_and_leaves_the_other_draws(spec):
    # Appendix A.4 step 3 (each link's mass 0.5-1.5x, the total kept) from a generator of its
    # own: friction, inertia and boxes start where they start without the split.
    split = dataclasses.replace(spec, mass_split=True)
    for seed in range(3):
        theta, learn = cl.violation_start(split, seed, True)
        plain, plain_learn = cl.violation_start(spec, seed, True)
        assert learn == plain_learn + ('mass_split',)
        for key, value in plain.items():
            torch.testing.assert_close(theta[key], value)
        model, _ = cl.object_models(split.model, split.contact, theta, split.masses)
        masses = model.inertial[:, 0]
        assert float(masses.sum()) == pytest.approx(spec.mass, rel=1e-14)
        assert abs(float(theta['mass_split'])) > 1e-3
        assert 1 / 3 < float(masses[1] / masses[0]) < 3
    theta, _ = cl.violation_start(split, 0, False)
    assert float(theta['mass_split']) == 0.0
    with pytest.raises(ValueError, match='two bodies'):
        dataclasses.replace(object_spec('cube'), mass_split=True)


def test_ccn_recovers_the_mass_split_the_tosses_were_made_with(spec):
    # Tosses of an elbow whose second link carries 0.45 of its 0.74 kg (each link's inertia
    # scaled with its mass): from the equal split, the violation loss finds the truth's split
    # (log 0.45 / 0.29 = 0.44) with everything else at the truth.
    truth = 0.44
    true_model, _ = cl.object_models(spec.model, spec.contact, _split_model(spec, truth),
                                     spec.masses)
    q, v = _tosses(true_model, spec.contact, 6, 24, seed=3)
    theta = _split_model(spec, 0.0)
    config = cl.TrainConfig(steps=150, learn=('mass_split',), lr=2e-2, lr_final=2e-2,
                            eval_every=150, weights=spec.violation_weights())
    learned, history = cl.train_violation(spec.model, spec.contact, theta, spec.masses,
                                          cl.transitions(q[:4], v[:4]),
                                          cl.transitions(q[4:], v[4:]), DT, config)
    assert history['validation'][-1] < history['validation'][0]
    assert float(learned['mass_split']) == pytest.approx(truth, abs=0.03)


def test_fresh_tosses_are_outside_every_set_the_elbow_used_and_fits_rebuild_from_json(spec):
    # elbow_learning.py --rescore: the tosses after the weight search's 100 are disjoint from
    # the split's largest training set, validation and test tosses and the selection tosses;
    # a fit's summary (its JSON) rebuilds the same model and contact.
    sys.path.insert(0, str(REPO_ROOT))
    try:
        from benchmarks import contact_learning as curves, contact_weights, elbow_learning as bench
    finally:
        sys.path.remove(str(REPO_ROOT))
    fresh = set(bench.fresh_indices(541, 0).tolist())
    train, val, test = curves.split(541, 256, 8, 20, 0)
    select = contact_weights.selection_indices(541, 256, 8, 20, 100, 0)
    assert len(fresh) == 541 - 256 - 8 - 20 - 100
    assert not fresh & (set(train) | set(val) | set(test) | set(select))
    theta, _ = cl.violation_start(spec, 4, True)
    model, contact = cl.object_models(spec.model, spec.contact, theta, spec.masses)
    learned = json.loads(json.dumps(cl.learned_summary(model, contact)))
    rebuilt, rebuilt_contact = bench.learned_models(spec, learned)
    torch.testing.assert_close(rebuilt.inertial, model.inertial, rtol=1e-12, atol=1e-15)
    for a, b in zip(rebuilt_contact.vertices, contact.vertices):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-15)
    assert float(rebuilt_contact.friction) == pytest.approx(float(contact.friction), rel=1e-14)


def _damped(spec, damping):
    # The nominal elbow's parameters with a given hinge damping [N m s/rad].
    theta = cl.object_parameters(spec.contact.vertices, 0.3, spec.model.inertial)
    theta['joint_damping'] = cl.joint_damping_parameters(
        torch.tensor([damping], dtype=torch.float64))
    return theta


def test_a_learned_hinge_damping_is_the_models_and_the_loss_and_rollouts_apply_it(spec):
    # ObjectSpec.joint_damping: the hinge's damping is RobotModel.damping (the root's six
    # entries zero), and rollout and violation loss apply it alike: on free-flight
    # transitions rolled out with it (no contact: no impulse, the loss is the prediction term
    # alone) the loss vanishes at the damping that made them and not without it.
    model, contact = cl.object_models(spec.model, spec.contact, _damped(spec, 2e-3),
                                      spec.masses)
    torch.testing.assert_close(model.damping, torch.tensor([0.0] * 6 + [2e-3],
                                                           dtype=torch.float64))
    lifted = dataclasses.replace(contact, ground_height=torch.tensor(-10.0,
                                                                     dtype=torch.float64))
    q, v = _tosses(model, lifted, 4, 30, seed=3)
    data = cl.transitions(q, v)
    weights = spec.violation_weights()
    at_truth = cl.violation_loss(model, lifted, *data, DT, weights)
    undamped = cl.violation_loss(spec.model, lifted, *data, DT, weights)
    assert float(at_truth.abs().max()) < 1e-12, float(at_truth.abs().max())
    assert float(undamped.mean()) > 1e-6, float(undamped.mean())
    # the hinge swings slower with the damping than without it, from the same states
    x0 = torch.cat((q[0][1], v[0][1])).unsqueeze(0)
    free = cl.rollout(spec.model, lifted, x0, 30, DT)[0, -1, -1].abs()
    damped = cl.rollout(model, lifted, x0, 30, DT)[0, -1, -1].abs()
    assert float(damped) < float(free)
    damping = torch.tensor([0.7], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda d: cl.object_models(
        spec.model, spec.contact, dict(_damped(spec, 1e-3), joint_damping=d),
        spec.masses)[0].damping, (damping,))


def test_training_recovers_a_hidden_hinge_damping_from_simulated_tosses(spec):
    # Slow-ish: 150 Adam steps on the damping alone (everything else at the truth). Hidden:
    # 1.5e-3 N m s/rad, the start the spec's (DAMPING_SCALE ln 2 = 0.69e-3); free-flight
    # tosses (the table 10 m down) made by the damped rollout, no noise: the loss is then a
    # least squares in the damping whose minimum is the truth. Recovered to 2 %.
    truth, contact = cl.object_models(spec.model, spec.contact, _damped(spec, 1.5e-3),
                                      spec.masses)
    lifted = dataclasses.replace(contact, ground_height=torch.tensor(-10.0,
                                                                     dtype=torch.float64))
    q, v = _tosses(truth, lifted, 10, 40, seed=4)
    train, validation = cl.transitions(q[:8], v[:8]), cl.transitions(q[8:], v[8:])
    damped = dataclasses.replace(spec, joint_damping=True)
    theta0, learn = cl.violation_start(damped, 0, False)
    assert learn[-1] == 'joint_damping'
    theta0['ground_height'] = torch.tensor(-10.0 / cl.LENGTH_SCALE, dtype=torch.float64)
    theta, _ = cl.train_violation(
        spec.model, lifted, theta0, spec.masses, train, validation, DT,
        cl.TrainConfig(steps=150, lr=5e-2, lr_final=5e-3, patience=100,
                       weights=spec.violation_weights(), learn=('joint_damping',)))
    model, _ = cl.object_models(spec.model, spec.contact, theta, spec.masses)
    assert float(model.damping[-1]) == pytest.approx(1.5e-3, rel=0.02), model.damping


def test_the_joint_damping_start_draws_the_damping_and_leaves_the_other_draws(spec):
    damped = dataclasses.replace(spec, joint_damping=True)
    undamped = dataclasses.replace(spec, joint_damping=False)
    start = cl.DAMPING_SCALE * math.log(2.0)
    for seed in range(3):
        theta, learn = cl.violation_start(damped, seed, True)
        plain, plain_learn = cl.violation_start(undamped, seed, True)
        assert learn == plain_learn + ('joint_damping',)
        for key, value in plain.items():
            torch.testing.assert_close(theta[key], value)
        model, _ = cl.object_models(damped.model, damped.contact, theta, damped.masses)
        assert 0.5 * start <= float(model.damping[-1]) <= 1.5 * start
        assert float(model.damping[:6].abs().max()) == 0.0
    theta, _ = cl.violation_start(damped, 0, False)
    model, _ = cl.object_models(damped.model, damped.contact, theta, damped.masses)
    assert float(model.damping[-1]) == pytest.approx(start, rel=1e-12)
    with pytest.raises(ValueError, match='joint between'):
        dataclasses.replace(object_spec('cube'), joint_damping=True)


def test_a_learned_hinge_damping_survives_the_learned_urdf(spec, tmp_path):
    # learned_urdf writes the hinge's <dynamics damping> from its own per-DOF entry (the
    # free-flyer's six come first), and read_object_urdf gives it back to the rollouts.
    from diffsim_ros.io.object_urdf import learned_urdf, read_object_urdf
    model, contact = cl.object_models(spec.model, spec.contact, _damped(spec, 1.25e-3),
                                      spec.masses)
    text, meshes = learned_urdf(model, contact, spec.model.urdf)
    assert not meshes
    path = tmp_path / 'learned.urdf'
    path.write_text(text)
    loaded, _, _ = read_object_urdf(path)
    torch.testing.assert_close(loaded.damping, model.damping)
