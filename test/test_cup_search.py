"""
``diffsim-cup-search``: simulated recordings in, a swing-up the mpc accepts out.

The command runs as a user runs it (``main([...])``): ``--record-sim`` writes a short simulated
recording of a hidden plant (arm excitation without the ball, two ball swings), the search
fits and searches on it with a small budget, and what it writes is checked by the mpc's own
reference loader, against ``config/wam4_cup.yaml``'s speed limits, against the hidden plant
(the identified string beside the nominal one) and by executing it on that plant.
"""

import json
from pathlib import Path

from diffsim_ros import robots
from diffsim_ros.cup_search import load_runs, main
from diffsim_ros.io.fits import load_fit
from diffsim_ros.io.tables import read_npz, write_npz
from diffsim_ros.nodes.params import load_yaml_params
from diffsim_ros.nodes.reference import load_reference_task
from diffsim_ros.sim import cup
from diffsim_ros.sim.cup_swing import HOME
from diffsim_ros.sysid.sampled import SampledTrajectory
import numpy as np
import pytest
import torch
import yaml

CONFIG = Path(__file__).resolve().parent.parent / 'config' / 'wam4_cup.yaml'
PLANT_SEED = 3
#: A small budget: 6 s of arm excitation, two 9 s swings (14.4 s to fit on after holding out
#: the last 20 %: above the 12 s the string fit asks for), two short searches (15 updates:
#: with the search's arm-contact rule, 5 updates left the ball hanging low: it rose 2.4 cm
#: on the plant; 15 lift it 0.44 m, to 0.11 m above the cup's anchor, 0.15 m in the model).
RECORD = ['--plant-seed', str(PLANT_SEED), '--arm-seconds', '6', '--swing-runs', '2',
          '--swing-seconds', '9', '--threads', '1']
SEARCH = ['--searches', '2', '--iterations', '15', '--samples', '8', '--arm-iterations', '30',
          '--string-iterations', '40', '--geometry-iterations', '100', '--threads', '1']


@pytest.fixture(scope='module')
def recorded(tmp_path_factory):
    """Record the simulated identification data once, as a user without a robot does."""
    data = tmp_path_factory.mktemp('cup') / 'data'
    assert main(['--record-sim', str(data), *RECORD]) == 0
    return data


@pytest.fixture(scope='module')
def searched(recorded, tmp_path_factory):
    """Run the search on the recording; return its output folder."""
    out = tmp_path_factory.mktemp('cup') / 'search'
    assert main([str(recorded), '--out', str(out), *SEARCH]) == 0
    return out


def _speed_limits():
    return [float(v) for v in load_yaml_params(CONFIG, 'mpc')['gate.velocity_limits']]


def test_help_says_what_goes_in_and_what_comes_out(capsys):
    with pytest.raises(SystemExit) as excinfo:
        main(['--help'])
    text = ' '.join(capsys.readouterr().out.split())
    assert excinfo.value.code == 0
    for words in ('--ball-topic', '/mocap/ball', 'swing_up.yaml', 'reference_file:=',
                  'params.yaml', 'report.json', 'exit status: 0 written', '--record-sim'):
        assert words in text, words


def test_the_written_swing_up_is_what_the_mpc_accepts(searched):
    path = searched / 'swing_up.yaml'
    document = yaml.safe_load(path.read_text())
    assert document['kind'] == 'sampled' and document['robot'] == 'wam4'
    model = robots.interface('wam4').nominal_model()
    # the mpc node's own loader, with the speed limits config/wam4_cup.yaml gives the mpc
    task = load_reference_task(path, 'wam4', model, _speed_limits())
    assert task.duration_s == pytest.approx(2.5)
    trajectory = SampledTrajectory.from_document(document).reorder(model.joint_names)
    assert trajectory.rate_hz == robots.get('wam4').driver_rate_hz
    qd, _ = trajectory.derivatives()
    assert (np.abs(qd) <= np.array(_speed_limits())).all()
    # it starts at rest at HOME, where the swing-up's ProMP starts
    assert np.allclose(trajectory.q[0], HOME, atol=1e-9)
    assert np.abs(qd[0]).max() < 1e-3
    # the report names it and its search
    report = json.loads((searched / 'report.json').read_text())
    written = report['written']
    assert written['search_seed'] == document['search_seed']
    chosen = [s for s in report['search']['searches'] if s['seed'] == written['search_seed']]
    assert chosen[0]['reference_check'] == 'accepted'
    assert (searched / 'report.png').stat().st_size > 10000
    rewards = [s['model_reward'] for s in report['search']['searches']]
    assert len(rewards) == 2 and np.isfinite(rewards).all()


def test_the_report_beats_the_nominal_model_on_held_out_data_and_the_truth(recorded,
                                                                           searched):
    report = json.loads((searched / 'report.json').read_text())
    truth = json.loads((recorded / 'truth.json').read_text())
    identified = report['string']['identified']
    nominal = report['string']['nominal']
    assert nominal['string_length'] == pytest.approx(cup.NOMINAL_STRING_LENGTH)
    error = abs(identified['string_length'] - truth['string_length'])
    nominal_error = abs(nominal['string_length'] - truth['string_length'])
    print(f'string length {identified["string_length"]:.4f} m, truth '
          f'{truth["string_length"]:.4f}, nominal {nominal["string_length"]:.4f}')
    assert error < nominal_error
    anchor = np.subtract([identified[k] for k in ('cup_x', 'cup_y', 'cup_z')], truth['cup_xyz'])
    nominal_anchor = np.subtract([nominal[k] for k in ('cup_x', 'cup_y', 'cup_z')],
                                 truth['cup_xyz'])
    assert np.linalg.norm(anchor) < np.linalg.norm(nominal_anchor)
    # on the last 20 % of each run, which the fit never saw
    heldout = report['heldout']
    print('held out:', heldout)
    assert heldout['ball_1s_m']['fitted'] < heldout['ball_1s_m']['nominal']
    torque = heldout['torque_rms_nm']
    assert np.linalg.norm(torque['fitted']) < np.linalg.norm(torque['nominal'])


def test_the_swing_up_moves_the_ball_up_on_the_simulated_plant(searched):
    """Executed by the tracking controller on the hidden plant, the ball rises; held, not."""
    document = yaml.safe_load((searched / 'swing_up.yaml').read_text())
    trajectory = SampledTrajectory.from_document(document)
    arm = load_fit(searched, robots.interface('wam4')).model
    plant = cup.CupPlant(cup.draw_truth(PLANT_SEED, cup.NOMINAL_STRING_LENGTH))
    seconds = trajectory.duration_s + 0.2

    def rise(reference):
        recording = plant.run(cup.tracking_controller(arm, reference), HOME, seconds)
        z = recording.ball_in_cup_frame()[:, 2]
        return float(z.max() - z[0]), float(z.max())

    def still(t):
        q = torch.tensor(HOME, dtype=torch.float64).expand(t.shape + (4,))
        return q, torch.zeros_like(q), torch.zeros_like(q)

    (searched_rise, searched_peak), (held_rise, _) = rise(trajectory.evaluate), rise(still)
    report = json.loads((searched / 'report.json').read_text())
    print(f'ball rise on the plant: searched {searched_rise:.3f} m, held at HOME '
          f'{held_rise:.4f} m; the peak along the cup axis: plant {searched_peak:.3f} m, '
          f'models {report["written"]["model_ball_peak_m"]}')
    # holding HOME leaves the ball hanging (millimetres: the string settles); the searched
    # motion lifts it by centimetres along the cup's axis
    assert held_rise < 0.005
    assert searched_rise > 0.05
    # and brings it up above the string's anchor in the cup, as the model said it would
    assert searched_peak > 0.0 and min(report['written']['model_ball_peak_m'].values()) > 0.0


def test_model_folder_is_reused_without_data(searched, tmp_path):
    out = tmp_path / 'again'
    assert main(['--model', str(searched), '--out', str(out), *SEARCH]) == 0
    first = json.loads((searched / 'report.json').read_text())
    second = json.loads((out / 'report.json').read_text())
    assert second['fitted']['arm'] is False and second['fitted']['string'] is False
    assert second['string']['identified'] == pytest.approx(first['string']['identified'])
    # the same model and seeds: the same searches
    assert [s['model_reward'] for s in second['search']['searches']] == pytest.approx(
        [s['model_reward'] for s in first['search']['searches']])


def test_bags_read_as_the_tables_do(recorded, tmp_path):
    from diffsim_ros.io.bags import write_bag
    from types import SimpleNamespace
    model = robots.interface('wam4').nominal_model()
    tables = sorted(recorded.glob('*.npz'))
    bags = []
    for table in tables:
        run = read_npz(table)
        if not run.poses:   # the ball taken off: the tracker publishes NaN, an arm run still
            lost = torch.eye(4, dtype=torch.float64).repeat(len(run), 1, 1)
            lost[:, :3, 3] = float('nan')
            run = run.replace(poses={'ball': lost})
        bags.append(write_bag(tmp_path / table.stem, run, pose_topics={'ball': '/mocap/ball'},
                              t0_ns=10 ** 18))
    args = SimpleNamespace(ball_topic='/mocap/ball', topic=None, command_topic=None)
    from_tables = load_runs(SimpleNamespace(data=[recorded], **vars(args)), model)
    from_bags = load_runs(SimpleNamespace(data=bags, **vars(args)), model)
    for kind in (0, 1):   # arm runs, swing runs
        assert len(from_bags[kind]) == len(from_tables[kind]) > 0
        for bag, table in zip(from_bags[kind], from_tables[kind]):
            assert torch.allclose(bag.q, table.q) and torch.allclose(bag.tau, table.tau)
            assert set(bag.poses) == set(table.poses)
            for body in table.poses:
                assert torch.allclose(bag.poses[body], table.poses[body], atol=1e-9)


def _swing_table(recorded):
    return read_npz(recorded / 'swing_0.npz')


@pytest.mark.parametrize('argv, message', [
    (['--out', 'x'], 'give recordings'),
    (['data'], '--out is required'),
    (['data', '--out', 'x', '--validation', '1.0'], '--validation'),
    (['data', '--out', 'x', '--searches', '0'], '--searches'),
    (['data', '--record-sim', 'y'], 'give neither DATA'),
])
def test_bad_arguments_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as excinfo:
        main(argv)
    assert excinfo.value.code == 2
    assert message in capsys.readouterr().err


def test_unusable_input_exits_2_with_one_line(recorded, tmp_path, capsys):
    from diffsim_ros.io.bags import write_bag
    out = str(tmp_path / 'out')

    def fails(argv, *words):
        assert main([*argv, '--out', out, *SEARCH]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        for word in words:
            assert word in err, err

    fails([str(tmp_path / 'missing')], 'does not exist')
    # the arm run alone: no ball anywhere
    fails([str(recorded / 'arm_0.npz')], 'no recording has ball positions')
    # a bag whose ball is on another topic: the error names the topics it has
    run = _swing_table(recorded)
    bag = write_bag(tmp_path / 'other_topic', run, pose_topics={'ball': '/vrpn/ball/pose'},
                    t0_ns=10 ** 18)
    fails([str(bag)], "'/mocap/ball'", '/vrpn/ball/pose')
    # too little swing data for the string fit
    fails([str(recorded / 'arm_0.npz'), str(recorded / 'swing_0.npz')], 'at least 12 s')
    # a tracker that lost the ball: NaN poses in a bag, and in a table
    pose = run.poses['ball'].clone()
    pose[100:110, :3, 3] = float('nan')
    broken = run.replace(poses={'ball': pose})
    bag = write_bag(tmp_path / 'lost', broken, pose_topics={'ball': '/mocap/ball'},
                    t0_ns=10 ** 18)
    fails([str(bag)], '10 of', 'not finite')
    write_npz(tmp_path / 'lost.npz', broken)
    fails([str(tmp_path / 'lost.npz')], 'NaN')
    # a --model file that holds neither an arm nor a string
    bad = tmp_path / 'params.yaml'
    bad.write_text('parameters: {}\n')
    fails(['--model', str(bad)], 'holds neither')


def test_identification_motions_for_a_physical_wam_are_references_the_mpc_accepts(tmp_path):
    refs = tmp_path / 'refs'
    assert main(['--write-references', str(refs), '--plant-seed', '4', '--swing-runs', '2']) == 0
    model = robots.interface('wam4').nominal_model()
    names = sorted(path.name for path in refs.glob('*.yaml'))
    assert names == ['arm_excitation.yaml', 'swing_0.yaml', 'swing_1.yaml']
    for name in names:
        task = load_reference_task(refs / name, 'wam4', model, _speed_limits())
        document = yaml.safe_load((refs / name).read_text())
        period = 60.0 if name.startswith('arm') else 30.0
        assert task.duration_s == document['duration_s'] == period
        assert document['ball'] == ('off' if name.startswith('arm') else 'on')
    # the swings are the motions the simulated recordings run: their start is the plant's
    swing = cup.string_references(4, cup.NOMINAL_STRING_LENGTH, 2)[1]
    q0, _, _ = swing.evaluate(torch.zeros(1, dtype=torch.float64))
    document = yaml.safe_load((refs / 'swing_1.yaml').read_text())
    assert np.allclose(document['q_start'], q0[0].tolist(), atol=1e-12)


def test_the_identifiers_saved_string_is_used_and_the_arm_fitted(recorded, tmp_path):
    from diffsim_ros.sysid.string_online import StringResult
    # what the identifier's ~/save writes in cup mode: string/<name> entries, no arm document
    values = {'string_length': 0.395, 'cup_x': 0.01, 'cup_y': -0.01, 'cup_z': 0.055,
              'cup_roll': 0.0, 'cup_pitch': 0.02, 'cup_yaw': 0.0, 'friction': 0.03}
    entries = StringResult(values).to_dict()['parameters']
    saved = tmp_path / 'wam4_identified.yaml'
    saved.write_text(yaml.safe_dump({'method': 'diffnea', 'parameters': {
        f'string/{name}': entry for name, entry in entries.items()}}))
    out = tmp_path / 'out'
    assert main([str(recorded), '--model', str(tmp_path), '--out', str(out), *SEARCH]) == 0
    report = json.loads((out / 'report.json').read_text())
    assert report['fitted']['arm'] is True and report['fitted']['string'] is False
    assert report['string']['identified'] == pytest.approx(values)
    assert (out / 'swing_up.yaml').is_file()
