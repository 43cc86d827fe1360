"""diffsim-demo: the node graph over DDS on a simulated Qube, its bag, report and plot."""

import contextlib
import json
import math
import re
import threading

from diffsim_ros import demo
from diffsim_ros.io import bag_topics, read_bag
from diffsim_ros.nodes.params import config_path, load_yaml_params
import pytest
from ros_helpers import reserved_domain_id


def _domain_id() -> int:
    # away from the ids of test/ros_helpers.py (1-100), test_node_recorder.py (101-189),
    # test_ros_helpers.py (190-191) and the foreign-driver test below (230-232)
    return reserved_domain_id(200, 30)


@pytest.mark.slow
def test_demo_swings_up_with_the_identified_model_and_writes_bag_report_and_plot(
        tmp_path, capsys):
    # the defaults: a hidden plant whose balance point the nominal model gets wrong
    out = tmp_path / 'out'
    code = demo.main(['--robot', 'qube', '--domain-id', str(_domain_id()), '--out', str(out)])
    report = json.loads((out / 'report.json').read_text())
    for key in ('success', 'swing_up_time_s', 'parameters', 'prediction_nmse'):
        assert key in report
    # closed loop over DDS in simulated time: swung up and balanced within the arm's travel,
    # on models the identifier published while it ran, which predict better than the URDF
    assert report['success'] and report['task']['within_limit'], report['task']
    assert report['models_accepted'] >= 1
    assert report['prediction_nmse'] < report['prediction_nmse_nominal']
    assert report['median_parameter_error'] < 0.1   # base parameters; the URDF is 30 % off
    # diffsim-fit on the recorded bag finds the same parameters offline
    assert report['offline_fit_median_parameter_error'] < 0.1
    assert code == 0
    for entry in report['parameters'].values():
        assert math.isfinite(entry['estimate']) and math.isfinite(entry['true'])
    topics = bag_topics(out / 'recording.mcap')
    for topic in ('/joint_states', '/effort_controller/commands', '/identifier/robot_description',
                  '/monitor/markers', '/predicted/joint_states'):
        assert topic in topics, sorted(topics)
    assert '/clock' not in topics
    joints = ('arm_joint', 'pendulum_joint')
    (states,) = read_bag(out / 'recording.mcap', joint_names=joints)
    assert float(states.t[-1]) > 7.5   # the plant's stream is recorded from its start
    (run,) = read_bag(out / 'recording.mcap', command_topic='/effort_controller/commands',
                      command_joints=('arm_joint',), joint_names=joints)
    # every command the mpc node sent was finite and within the Qube's voltage limit
    assert bool(run.u.isfinite().all()) and float(run.u.abs().max()) <= 10.0
    assert (out / 'prediction.png').stat().st_size > 0
    assert (out / 'fit' / 'model.urdf').is_file()
    # in lockstep simulated time waited for every command and every due refit: each model
    # was published at a refit's due time, whatever the load of the machine
    lockstep = report['lockstep']
    assert lockstep['command_waits_timed_out'] == 0 and lockstep['controller_lost'] == 0
    assert lockstep['peer_timeouts'] == 0 and lockstep['peers_lost'] == 0
    assert lockstep['peer_holds'] >= report['models_accepted']
    period = load_yaml_params(config_path('qube'), 'identifier')['refit_period']
    for stamp in report['model_times_s']:
        assert abs(stamp / period - round(stamp / period)) < 1e-6, report['model_times_s']
    assert len(report['model_times_s']) == report['models_accepted']
    printed = capsys.readouterr().out
    assert 't =   2.0 s' in printed and 'report.json' in printed
    # progress and result lines: numbers rounded, models counted as the identifier published
    shown = [line for line in printed.splitlines()
             if line.startswith(('  t =', '  task:', '  1 s prediction'))]
    # at most 4 significant digits (a raw float such as 2.21705596560012 has 15)
    digits = [number.replace('.', '').lstrip('0') for line in shown
              for number in re.findall(r'\d+\.\d+', line)]
    assert digits and max(len(d) for d in digits) <= 4, shown
    counts = [int(n) for line in shown for n in re.findall(r'models accepted (\d+)', line)]
    assert counts == sorted(counts) and counts[-1] == report['models_accepted'], shown
    assert f'models accepted online: {report["models_accepted"]}' in printed


@pytest.mark.parametrize('argv', [
    ['--robot', 'no_such_robot'],
    ['--duration', '0'],
    ['--param-error', '1.5'],
    ['--real-time-factor', '0'],
    ['--domain-id', '999'],
])
def test_demo_rejects_bad_arguments(argv, tmp_path, capsys):
    with pytest.raises(SystemExit) as excinfo:
        demo.main(argv + ['--out', str(tmp_path)])
    assert excinfo.value.code == 2
    assert 'error' in capsys.readouterr().err


@contextlib.contextmanager
def _robot_driver(domain: int):
    """Run a robot's driver (another participant) on ``domain``; yield the commands it got."""
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from std_msgs.msg import Float64MultiArray

    context = rclpy.Context()
    rclpy.init(context=context, domain_id=domain)
    driver = rclpy.create_node('qube_driver', namespace='/lab', context=context)
    received = []
    driver.create_subscription(Float64MultiArray, '/effort_controller/commands',
                               received.append, 10)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(driver)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    try:
        yield received
    finally:
        executor.shutdown(timeout_sec=2.0)
        spinner.join(timeout=5.0)
        driver.destroy_node()
        rclpy.shutdown(context=context)


def test_demo_refuses_a_domain_where_a_robot_driver_takes_commands(tmp_path, capsys):
    # a robot's driver (another participant on the demo's domain) waiting for torques
    domain = reserved_domain_id(230, 3)
    out = tmp_path / 'out'
    with _robot_driver(domain) as received:
        code = demo.main(['--robot', 'qube', '--domain-id', str(domain), '--out', str(out),
                          '--no-fit'])
    assert code == 2
    error = capsys.readouterr().err
    assert 'subscribers of /effort_controller/commands: /lab/qube_driver' in error, error
    assert '--domain-id' in error
    # refused before any node started: no command sent, nothing recorded
    assert received == [] and not (out / 'recording.mcap').exists()


def test_demo_auto_domain_goes_past_a_domain_with_a_robot(tmp_path, capsys, monkeypatch):
    # a robot's driver on the first of the two ids --domain-id auto may take: the demo runs on
    # the other one and the driver never hears a command
    domain = reserved_domain_id(230, 3)
    other = next(d for d in range(230, 233) if d != domain)
    monkeypatch.setattr(demo, 'AUTO_DOMAIN_IDS', (domain, other))
    out = tmp_path / 'out'
    with _robot_driver(domain) as received:
        code = demo.main(['--robot', 'qube', '--domain-id', 'auto', '--duration', '0.5',
                          '--out', str(out), '--no-fit'])
    printed = capsys.readouterr().out
    assert code in (0, 1), printed   # ran (too short to swing up), not refused
    assert f'ROS domain {other} (--domain-id auto' in printed
    assert (out / 'recording.mcap').exists() and received == []
    with pytest.raises(SystemExit):
        demo.parse_args(['--domain-id', '233'])
    with pytest.raises(SystemExit):
        demo.parse_args(['--domain-id', 'free'])
