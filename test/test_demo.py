"""diffsim-demo: simulate a robot with hidden parameters, record a bag, refit it, score it."""

import json

from diffsim_ros import demo
from diffsim_ros.io import read_bag
import pytest


def test_demo_identifies_the_hidden_qube_better_than_nominal(tmp_path, capsys):
    out = tmp_path / 'out'
    assert demo.main(['--robot', 'qube', '--duration', '8', '--out', str(out)]) == 0
    report = json.loads((out / 'report.json').read_text())
    assert report['success'] is True
    for horizon, nmse in report['prediction_nmse'].items():
        assert nmse['identified'] < 0.1 * nmse['nominal'], horizon
    errors = [p['relative_error'] for p in report['parameters'].values()]
    nominal_errors = [p['nominal_relative_error'] for p in report['parameters'].values()]
    assert sorted(errors)[len(errors) // 2] < sorted(nominal_errors)[len(errors) // 2]
    for name in ('params.yaml', 'model.urdf', 'metrics.json', 'report.png'):
        assert (out / 'fit' / name).is_file()
    # The recorded bag reads back with the same number of samples the report states.
    (run,) = read_bag(out / 'recording.mcap', command_topic='/effort_controller/commands',
                      command_joints=('arm_joint',))
    assert len(run) == report['samples']
    printed = capsys.readouterr().out
    assert '[4/4]' in printed and 'report.json' in printed


@pytest.mark.parametrize('argv', [
    ['--robot', 'no_such_robot'],
    ['--duration', '0'],
    ['--param-error', '1.5'],
])
def test_demo_rejects_bad_arguments(argv, tmp_path, capsys):
    with pytest.raises(SystemExit) as excinfo:
        demo.main(argv + ['--out', str(tmp_path)])
    assert excinfo.value.code == 2
    assert 'error' in capsys.readouterr().err
