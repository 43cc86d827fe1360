"""
Tests of the data formats, run selection, conventions, losses and verdict of ``diffsim-fit``.

The verdict is the comparison of the fit with the catalogue model.
The formats are tested on the shared real recordings (skipped with the reason when
``$DIFFSIM_DATA`` / ``<repo>/../shared/data`` is absent); the rest on small synthetic runs.
The end-to-end commands a user runs on the real data are in ``test_fit_real_data.py``.
"""

import argparse
import math

from diffsim_ros.io import run_kind
from diffsim_ros.io.conventions import (delay_commands, delay_samples, offset_angles,
                                        parse_delay, parse_offsets)
from diffsim_ros.io.fit_cli import _exit_status
from diffsim_ros.io.fit_options import EXIT_NOT_EXCITED, EXIT_WORSE
from diffsim_ros.io.formats import FormatError, FORMATS, in_model_order, LoadOptions, resolve
from diffsim_ros.io.loss_options import apply_loss, horizon_steps
from diffsim_ros.io.selection import parse_validation, select_runs, SelectionError, split
from diffsim_ros.io.verdict import better_than_nominal, worse_rollouts
from diffsim_ros.sysid.dataset import Trajectory
from diffsim_ros.sysid.estimators import make_config
import pytest
import torch

F64 = torch.float64


def _run(name: str, samples: int = 100, rate: float = 100.0, u: bool = True) -> Trajectory:
    t = torch.arange(samples, dtype=F64) / rate
    q = torch.stack((torch.sin(t), torch.cos(t)), -1)
    return Trajectory(t=t, q=q, joint_names=('a', 'b'), tau=torch.zeros_like(q),
                      u=torch.arange(samples, dtype=F64)[:, None] if u else None, run=name)


# --------------------------------------------------------------------------------------
# Formats and detection on the shared recordings
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize('folder,name,robot', [
    ('quanser_qube_pyrado', 'quanser', 'qube'),
    ('quanser_cartpole_pyrado', 'quanser', 'cartpole'),
    ('panda_gaz2019_excitation', 'panda-gaz', 'panda'),
    ('dfki_double_pendulum', 'dfki', 'double_pendulum'),
    ('dfki_simple_pendulum', 'dfki', 'simple_pendulum'),
])
def test_each_shared_data_set_is_detected_with_its_robot(data_dir, folder, name, robot):
    fmt = resolve('auto', data_dir / folder)
    assert fmt.name == name and fmt.robot(data_dir / folder) == robot
    recording = fmt.load(data_dir / folder, LoadOptions())
    assert recording.runs and recording.defaults['validation']


def test_qube_default_split_is_the_benchmarks(data_dir):
    # train on the ten 250 Hz chirps, validate on the 25 swing-ups at 250 Hz
    recording = FORMATS['quanser'].load(data_dir / 'quanser_qube_pyrado', LoadOptions())
    runs = select_runs(recording.runs, recording.defaults['runs'])
    train, validation = split(runs, recording.defaults['validation'])
    assert {run_kind(r.run) for r in train} == {'chirp'} and len(train) == 10
    assert {run_kind(r.run) for r in validation} == {'swingup'} and len(validation) == 25
    assert recording.defaults['input_delay'] == '2'


def test_a_group_folder_or_one_rollout_file_loads_just_that(data_dir):
    group = data_dir / 'quanser_qube_pyrado' / 'qq_chrip_10to0Hz_pos1.5V_250Hz_10s'
    runs = resolve('auto', group).load(group, LoadOptions()).runs
    assert len(runs) == 5 and all(group.name in r.run for r in runs)
    one = sorted(group.glob('*.csv'))[0]
    recording = resolve('quanser', one).load(one, LoadOptions())
    assert [r.run.split('/')[-1] for r in recording.runs] == [one.stem]
    assert 'validation' not in recording.defaults   # one kind: the generic split


def test_the_data_root_and_unknown_paths_are_refused(data_dir, tmp_path):
    with pytest.raises(FormatError, match='shared data root'):
        resolve('auto', data_dir)
    with pytest.raises(FormatError, match='unknown --format'):
        resolve('matlab', tmp_path)
    with pytest.raises(FormatError, match='--format panda-gaz'):
        resolve('panda-gaz', data_dir / 'quanser_qube_pyrado')
    text = tmp_path / 'notes.txt'
    text.write_text('x')
    with pytest.raises(FormatError, match='unknown data format'):
        resolve('auto', text)


def test_generic_files_keep_their_formats(tmp_path):
    assert resolve('auto', tmp_path / 'x.csv').name == 'table'
    assert resolve('auto', tmp_path / 'x.mcap').name == 'bag'
    assert resolve('auto', tmp_path).name == 'bag'


def test_columns_are_matched_to_the_model_by_name():
    run = _run('r')
    swapped, = in_model_order([run], ('b', 'a'))
    torch.testing.assert_close(swapped.q, run.q.flip(-1))
    with pytest.raises(FormatError, match='no joint'):
        in_model_order([run], ('a', 'c'))


# --------------------------------------------------------------------------------------
# Selection and split
# --------------------------------------------------------------------------------------
GROUPS = [('chirp', 'g_250Hz'), ('chirp', 'g_250Hz'), ('swingup', 'su_250Hz'),
          ('swingup', 'su_500Hz')]
RUNS = [_run(f'qube/{kind}/{group}/r{i}') for i, (kind, group) in enumerate(GROUPS)]


@pytest.mark.parametrize('spec,expected', [
    ('chirp', ['r0', 'r1']), ('swingup', ['r2', 'r3']), ('*250Hz*', ['r0', 'r1', 'r2']),
    ('su_500Hz', ['r3']), ('r1, r3', ['r1', 'r3']), ('qube/chirp/g_250Hz/r0', ['r0']),
])
def test_runs_are_picked_by_name_kind_group_or_pattern(spec, expected):
    assert [r.run.split('/')[-1] for r in select_runs(RUNS, spec)] == expected


def test_a_selector_that_picks_nothing_lists_the_kinds():
    with pytest.raises(SelectionError, match='nothing matches swing.*kinds: chirp, swingup'):
        select_runs(RUNS, 'swing')


def test_validation_by_kind_and_by_trailing_fraction():
    train, validation = split(RUNS, 'swingup')
    assert [r.run[-2:] for r in train] == ['r0', 'r1']
    assert [r.run[-2:] for r in validation] == ['r2', 'r3']
    train, validation = split(RUNS[:1], 'last:0.3')
    assert len(train[0]) + len(validation[0]) == 100
    assert float(validation[0].t[0]) == pytest.approx(0.7, abs=0.011)
    assert parse_validation(None) == 0.2 and parse_validation('0.25') == 0.25
    for bad in ('last:0', 'last:1', 'last:x', '1.5'):
        with pytest.raises(SelectionError):
            parse_validation(bad)


# --------------------------------------------------------------------------------------
# Conventions
# --------------------------------------------------------------------------------------
def test_input_delay_in_samples_or_seconds():
    run = _run('r', rate=250.0)
    assert parse_delay('2') == (2.0, 'samples') and parse_delay('8ms') == (0.008, 's')
    assert delay_samples(parse_delay('0.008s'), run) == 2
    delayed = delay_commands(run, 2)
    assert delayed.u[:3, 0].tolist() == [0.0, 0.0, 0.0] and delayed.u[5, 0] == 3.0
    assert delay_commands(run, 0) is run and delay_commands(_run('r', u=False), 2).u is None
    for bad in ('-1', '1.5', 'two', '2 min'):
        with pytest.raises(ValueError):
            parse_delay(bad)


def test_angle_offsets_shift_one_joint():
    run = _run('r')
    shifted = offset_angles(run, parse_offsets(['b=3.14159'], run.joint_names))
    torch.testing.assert_close(shifted.q[:, 1] - run.q[:, 1],
                               torch.full((100,), 3.14159, dtype=F64))
    torch.testing.assert_close(shifted.q[:, 0], run.q[:, 0])
    for bad, message in (('c=1', 'unknown joint'), ('b', 'JOINT=VALUE'), ('b=x', 'number'),
                         ('b=inf', 'finite')):
        with pytest.raises(ValueError, match=message):
            parse_offsets([bad], run.joint_names)


# --------------------------------------------------------------------------------------
# --loss / --horizon
# --------------------------------------------------------------------------------------
def test_multistep_warm_starts_with_the_inverse_fit_then_refines_on_rollouts():
    config = make_config('diffnea', {'adam_iterations': 30, 'lbfgs_iterations': 2})
    multistep = apply_loss('diffnea', config, 'multistep', 25)
    stages = multistep.schedule()
    assert [s.loss for s in stages] == ['inverse_dynamics', 'rollout']
    assert stages[-1].horizon == 25 and multistep.loss == 'rollout'
    assert stages[-1].adam_iterations == 30 and stages[-1].lbfgs_iterations == 2
    # an existing rollout schedule keeps its stages; --horizon sets their windows
    again = apply_loss('diffnea', multistep, None, 12)
    assert [s.horizon for s in again.schedule() if s.loss == 'rollout'] == [12]
    assert [s.loss for s in apply_loss('diffnea', multistep, 'inverse', None).schedule()] == \
        ['inverse_dynamics', 'inverse_dynamics']
    assert apply_loss('diffnea', config, 'forward', None).loss == 'forward'
    assert apply_loss('diffnea', config, None, None) is config


def test_losses_a_method_cannot_take_are_refused():
    nea = make_config('nea', {})
    assert apply_loss('nea', nea, 'inverse', None) is nea
    with pytest.raises(ValueError, match='nea is least squares'):
        apply_loss('nea', nea, 'multistep', 10)
    with pytest.raises(ValueError, match='no rollout stage'):
        apply_loss('diffnea', make_config('diffnea', {}), None, 10)
    with pytest.raises(ValueError, match='applies to --loss multistep'):
        apply_loss('diffnea', make_config('diffnea', {}), 'forward', 10)
    ffnn = apply_loss('ffnn', make_config('ffnn', {}), 'multistep', 7)
    assert ffnn.loss == 'rollout' and ffnn.horizon == 7
    assert horizon_steps(0.1, 0.004, 1000) == 25
    with pytest.raises(ValueError, match='shortest training run'):
        horizon_steps(5.0, 0.004, 1000)


# --------------------------------------------------------------------------------------
# Better than the catalogue model?
# --------------------------------------------------------------------------------------
def _scores(fitted: dict, nominal: dict, torque=(0.2, 0.9)) -> dict:
    def section(rollouts, value):
        return {'torque': {'validation': {'nmse_mean': value}},
                'rollout': {key: ({'nmse': None, 'diverged': True} if v is math.inf
                                  else {'nmse': v, 'diverged': False})
                            for key, v in rollouts.items()}}
    out = section(fitted, torque[0])
    out['nominal'] = section(nominal, torque[1])
    return out


def test_better_than_nominal_per_metric():
    scores = _scores({'0.5s': 0.3, '1s': 0.8}, {'0.5s': 0.4, '1s': 0.5})
    assert better_than_nominal(scores) == {'torque': True, 'rollout_0.5s': True,
                                           'rollout_1s': False}
    diverged = _scores({'1s': math.inf}, {'1s': 0.5})
    assert better_than_nominal(diverged)['rollout_1s'] is False
    both = _scores({'1s': math.inf}, {'1s': math.inf})
    assert better_than_nominal(both)['rollout_1s'] is None
    assert worse_rollouts(better_than_nominal(scores)) == ['1s']


def test_a_tie_with_the_nominal_model_is_not_worse():
    # A fit that recovers the nominal model scores the same up to rounding: NMSE 2.28 vs
    # 2.28 (last bits apart) and torque 6.7e-27 vs 0 must not exit 4.
    tie = _scores({'0.5s': 2.28 * (1 + 1e-13)}, {'0.5s': 2.28}, torque=(6.7e-27, 0.0))
    assert better_than_nominal(tie) == {'torque': True, 'rollout_0.5s': True}
    # A real loss, one part in a million, still loses.
    worse = _scores({'0.5s': 2.28 * (1 + 1e-6)}, {'0.5s': 2.28}, torque=(1e-6, 0.0))
    assert better_than_nominal(worse) == {'torque': False, 'rollout_0.5s': False}


@pytest.mark.parametrize('allow,warning,expected', [
    (False, None, EXIT_WORSE), (True, None, 0), (False, 'not excited', EXIT_NOT_EXCITED)])
def test_worse_rollouts_exit_4_unless_allowed(allow, warning, expected):
    metrics = _scores({'0.5s': 0.3, '1s': 0.8}, {'0.5s': 0.4, '1s': 0.5})
    metrics['better_than_nominal'] = better_than_nominal(metrics)
    metrics['warning'] = warning
    assert _exit_status(metrics, allow) == expected
    assert 'rollout 1s NMSE 0.8 vs nominal 0.5' in metrics['worse_than_nominal']
    assert ('--allow-worse' in metrics['worse_than_nominal']) == allow


def test_worse_torques_alone_warn_without_changing_the_exit_status():
    metrics = _scores({'1s': 0.3}, {'1s': 0.5}, torque=(0.9, 0.2))
    metrics['better_than_nominal'] = better_than_nominal(metrics)
    metrics['warning'] = None
    assert _exit_status(metrics, False) == 0
    assert 'torque NMSE 0.9 vs nominal 0.2' in metrics['worse_than_nominal']


def test_options_parse_into_the_namespace():
    from diffsim_ros.io.fit_options import build_parser
    args = build_parser().parse_args(['d', '--out', 'o', '--horizons', '1,0.5,1',
                                      '--input-delay', '8ms', '--loss', 'multistep'])
    assert isinstance(args, argparse.Namespace)
    assert args.horizons == (0.5, 1.0) and args.input_delay == (0.008, 's')
    assert args.robot is None and args.format == 'auto'


def test_early_stopping_data_never_include_the_validation_runs_unless_asked():
    from diffsim_ros.io.selection import early_stopping_split
    train, validation = split(RUNS, 'swingup')
    fitted, stopping = early_stopping_split(train, validation, 'train')
    assert [r.run[-2:] for r in fitted] == ['r0'] and [r.run[-2:] for r in stopping] == ['r1']
    assert early_stopping_split(train, validation, 'validation') == (train, validation)
    assert early_stopping_split(train, validation, 'none') == (train, [])
    fitted, stopping = early_stopping_split(RUNS[:1], [], 'train')
    assert fitted[0].run.endswith('#train') and stopping[0].run.endswith('#validation')
    with pytest.raises(SelectionError, match='valid: validation, train, none'):
        early_stopping_split(train, validation, 'best')
