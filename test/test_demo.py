"""Smoke test of the diffsim-demo placeholder: it runs, conserves energy, writes its report."""

import json

from diffsim_ros import demo
import pytest


def test_demo_writes_report_and_conserves_energy(tmp_path, capsys):
    out = tmp_path / 'out'
    assert demo.main(['--robot', 'qube', '--duration', '0.2', '--out', str(out)]) == 0
    report = json.loads((out / 'report.json').read_text())
    assert report['robot'] == 'qube'
    assert report['steps'] == 100
    assert set(report['final_state']['q']) == set(report['joint_names'])
    assert report['peak_kinetic_energy_J'] > 0.0
    # RK4 at 2 ms on a free Furuta pendulum: energy holds to ~1e-8 of the energy exchanged.
    assert report['energy_drift_relative_to_peak_kinetic'] < 1e-6
    assert report['wall_time_s'] > 0.0
    printed = capsys.readouterr().out
    assert 'energy change' in printed and 'report.json' in printed


@pytest.mark.parametrize('argv', [
    ['--robot', 'no_such_robot'],
    ['--duration', '0'],
    ['--dt', '-0.1'],
])
def test_demo_rejects_bad_arguments(argv, tmp_path, capsys):
    with pytest.raises(SystemExit) as excinfo:
        demo.main(argv + ['--out', str(tmp_path)])
    assert excinfo.value.code == 2
    assert 'error' in capsys.readouterr().err
