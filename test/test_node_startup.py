"""
What a user meets when starting a node: bad parameters, unknown names, ``--help``.

The node executables run as a user runs them (a child process, the console script's
``main`` with ``--ros-args``); each case must end in one ``[ERROR]`` line naming the
parameter, the value given and what is allowed, exit status 1 and no traceback; ``--help``
prints the parameters and exits 0 without starting the node.  The parameter checks run
before a node builds anything expensive, so each case takes the interpreter's start-up
(importing torch) and no more.  The range mechanism and the shipped configs are checked
in-process.  Last, ``scripts/dev.sh test``, the other command a new user runs first.
"""

import dataclasses
from dataclasses import dataclass, field
import math
import os
from pathlib import Path
import re
import signal
import subprocess
import sys
from typing import Dict, List, Tuple

from diagnostic_msgs.msg import DiagnosticArray
from diffsim_ros.nodes.foreign_graph import READY_QOS
from diffsim_ros.nodes.params import (check_unknown_parameters, config_path, declare_config,
                                      declare_robot, describe_parameters, load_yaml_params,
                                      parameter_overrides, parameter_sections, ParameterError)
import pytest
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data
from ros_helpers import reserved_domain_id, wait_for
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import JointState
from std_msgs.msg import Empty, Float64MultiArray

pytest_plugins = ['ros_helpers']

REPO = Path(__file__).resolve().parent.parent
NODES = ('identifier', 'mpc', 'monitor', 'sim_driver')
ROBOTS = ('qube', 'cartpole', 'wam4', 'wam7', 'panda')
#: A child that has not exited by then has started the node instead of refusing it.
HANG_S = 180.0


def node_command(executable: str, *arguments: str) -> Tuple[List[str], Dict[str, str]]:
    """
    Return the command line and environment of a node executable as ``ros2 run`` starts it.

    The console script's ``main``, on this test run's DDS domain (the ``ros_domain``
    fixture's), discovery limited to localhost.

    :param executable: ``identifier``, ``mpc``, ``monitor`` or ``sim_driver``.
    :param arguments: the command line after the executable's name.
    :return: ``(argv, environment)``.
    """
    script = (f'import sys; from diffsim_ros.nodes.{executable} import main; '
              'sys.exit(main())')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO)] + [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p]),
        ROS_DOMAIN_ID=str(reserved_domain_id()),
        ROS_AUTOMATIC_DISCOVERY_RANGE='LOCALHOST', RCUTILS_COLORIZED_OUTPUT='0')
    return [sys.executable, '-c', script, *arguments], env


def start(executable: str, *arguments: str) -> Tuple[int, str, str]:
    """
    Run a node executable as ``ros2 run`` does (its console script's ``main``) to its end.

    :param executable: ``identifier``, ``mpc``, ``monitor`` or ``sim_driver``.
    :param arguments: the command line after the executable's name.
    :return: ``(exit status, stdout, stderr)``.
    """
    argv, env = node_command(executable, *arguments)
    try:
        done = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True,
                              timeout=HANG_S)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f'{executable} {" ".join(arguments)} was still running after {HANG_S} s: '
                    f'it started instead of refusing its arguments\n{error.stderr}')
    return done.returncode, done.stdout, done.stderr


def assert_refused(executable: str, arguments, *expected: str) -> str:
    """Start a node, expect one error line holding ``expected``; return that line."""
    status, stdout, stderr = start(executable, *arguments)
    output = stdout + stderr
    errors = [line for line in output.splitlines() if '[ERROR]' in line]
    assert status == 1, output
    assert 'Traceback' not in output, output
    assert len(errors) == 1, output
    for text in expected:
        assert text in errors[0], errors[0]
    return errors[0]


@pytest.mark.parametrize('executable, arguments, expected', [
    ('mpc', ['-p', 'command_rate:=-1.0'], ["'command_rate' = -1.0", 'in [0.0, 10000.0]']),
    ('mpc', ['-p', 'controller:=lqr'], ["'controller' = 'lqr'", 'ilqr, mppi, baseline']),
    ('mpc', ['-p', 'horizon:=abc'], ["'horizon' = 'abc'", 'must be an integer']),
    ('mpc', ['-p', 'robot:=wam4', '-p', 'reference_file:=/nonexistent/excitation.yaml'],
     ["'reference_file' = '/nonexistent/excitation.yaml'", 'No such file']),
    ('identifier', ['-p', 'diffnea.lr:=-1.0'], ["'diffnea.lr' = -1.0", 'lr must be > 0']),
    ('monitor', ['-p', 'integrator:=euler'], ["'integrator' = 'euler'", 'rk4']),
    ('sim_driver', ['-p', 'clock_mode:=fast'], ["'clock_mode' = 'fast'", 'lockstep']),
    ('sim_driver', ['-p', 'config_file:=/nonexistent/qube.yaml'],
     ["'config_file' = '/nonexistent/qube.yaml'", 'does not exist']),
    ('mpc', ['-p', 'robot:=wam4', '-p', 'gate.velocity_limits:=[5.0, 5.0]'],
     ["'gate.velocity_limits' = [5.0, 5.0]", 'one value per joint']),
    ('sim_driver', ['-p', 'scene:=cup'], ["scene 'cup'", 'wam4']),
    ('sim_driver', ['-p', 'robot:=wam4', '-p', 'scene:=basket'], ["'scene' = 'basket'", 'cup']),
], ids=lambda value: value if isinstance(value, str) else None)
def test_a_bad_value_is_one_error_line(executable, arguments, expected):
    assert_refused(executable, ['--ros-args', *arguments], *expected)


@pytest.mark.parametrize('executable, name, close', [
    ('mpc', 'comand_rate', 'command_rate'),
    ('identifier', 'diffnea.lrr', 'diffnea.lr'),
])
def test_an_unknown_name_on_the_command_line_is_refused(executable, name, close):
    line = assert_refused(executable, ['--ros-args', '-p', f'{name}:=5.0'],
                          f"'{name}' = 5.0", 'no such parameter', close, '--help')
    assert f'[{executable}]' in line


def test_an_unknown_name_in_a_parameter_file_is_refused(tmp_path):
    """The same check covers --params-file (launch files) and the YAML that config_file names."""
    given = tmp_path / 'params.yaml'
    given.write_text('mpc:\n  ros__parameters:\n    controller: baseline\n'
                     '    stale_timout: 0.2\n', encoding='utf-8')
    assert_refused('mpc', ['--ros-args', '--params-file', str(given)],
                   "'stale_timout' = 0.2", 'stale_timeout')
    own = tmp_path / 'own.yaml'
    own.write_text('monitor:\n  ros__parameters:\n    horizon: 1.0\n    hroizon: 2.0\n',
                   encoding='utf-8')
    assert_refused('monitor', ['--ros-args', '-p', f'config_file:={own}'],
                   "'hroizon' = 2.0", 'horizon')


def test_a_malformed_ros_argument_is_one_error_line():
    assert_refused('mpc', ['--ros-args', '-p', 'command_rate'], "'-p command_rate'")


def test_an_argument_outside_ros_args_is_a_usage_error():
    status, stdout, stderr = start('monitor', 'horizon:=2.0')
    assert status == 2, stdout + stderr
    assert 'horizon:=2.0' in stderr and '--ros-args' in stderr
    assert 'Traceback' not in stdout + stderr


def robot_graph(executor, publishes):
    """
    Start nodes already on the domain, and a controller that records ``/joint_states``.

    :param executor: the test's executor (on the domain the node executables use).
    :param publishes: ``(node name, topic, type)`` of each foreign publisher; a
        ``JointState`` one publishes the Qube's joints at 100 Hz with frame ``lab``.
    :return: the ``/joint_states`` messages the controller received (a growing list).
    """
    context = executor.executor.context
    for name, topic, kind in publishes:
        node = executor.add_node(Node(name, namespace='/lab', context=context))
        publisher = node.create_publisher(kind, topic, qos_profile_sensor_data)
        if kind is JointState:
            real = JointState(name=['arm_joint', 'pendulum_joint'], position=[0.0, 0.0])
            real.header.frame_id = 'lab'
            node.create_timer(0.01, lambda p=publisher, m=real: p.publish(m))
    heard = []
    controller = executor.add_node(Node('controller', namespace='/lab', context=context))
    controller.create_subscription(JointState, '/joint_states', heard.append,
                                   qos_profile_sensor_data)
    return heard


@pytest.mark.parametrize('publishes, arguments, expected', [
    ([('qube_driver', '/joint_states', JointState)], [],
     'publishers of /joint_states: /lab/qube_driver'),
    ([('rosbag2_player', '/clock', Clock)], ['-p', 'clock_mode:=lockstep'],
     'publishers of /clock: /lab/rosbag2_player'),
], ids=['real_driver', 'lockstep_beside_a_clock'])
def test_the_simulated_driver_refuses_a_domain_where_a_robot_driver_publishes(
        executor, publishes, arguments, expected):
    """Its simulated states would reach the real robot's controllers."""
    heard = robot_graph(executor, publishes)
    line = assert_refused('sim_driver', ['--ros-args', '-p', 'robot:=qube', *arguments],
                          '[sim_driver]', 'another ROS graph runs on this domain', expected,
                          f'ROS_DOMAIN_ID {reserved_domain_id()}', 'ROS_DOMAIN_ID=<free id>')
    assert line.count('publishers of') == 1, line
    # the controller heard the real driver (if any), never a simulated state
    assert {m.header.frame_id for m in heard} == ({'lab'} if 'joint_states' in expected
                                                  else set())


def test_the_simulated_driver_starts_beside_its_own_graph_and_a_foreign_clock(executor):
    """
    What the driver's own launch puts on the domain does not stop it.

    Its controller publishes the commands and subscribes ``joint_states`` (the mpc), and in
    real-time mode a ``/clock`` (a bag played elsewhere on the domain) is not its stream.
    """
    heard = robot_graph(executor, [('mpc', '/effort_controller/commands', Float64MultiArray),
                                   ('rosbag2_player', '/clock', Clock)])
    ready = []   # its word that the probe passed, which a simulated launch's mpc waits for
    executor.add_node(Node('mpc_start', namespace='/lab', context=executor.executor.context)) \
        .create_subscription(Empty, '/sim_driver/ready', ready.append, READY_QOS)
    argv, env = node_command('sim_driver', '--ros-args', '-p', 'robot:=qube')
    driver = subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        started = wait_for(lambda: heard or driver.poll() is not None, timeout=HANG_S,
                           period=0.1)
        assert started and driver.poll() is None, driver.communicate(timeout=10)[0]
        assert list(heard[0].name) == ['arm_joint', 'pendulum_joint'], heard[0]
        assert wait_for(lambda: ready, timeout=30.0, period=0.1)
        driver.send_signal(signal.SIGINT)
        output = driver.communicate(timeout=30)[0]
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()
    assert '[ERROR]' not in output, output


def mpc_diagnostics(executor):
    """Return the mpc's ``/diagnostics`` statuses as heard (a growing list of dicts)."""
    heard = []

    def keep(msg):
        for status in msg.status:
            if status.name.startswith('mpc:'):
                heard.append({'message': status.message,
                              **{pair.key: pair.value for pair in status.values}})
    listener = executor.add_node(Node('rqt_monitor', namespace='/lab',
                                      context=executor.executor.context))
    listener.create_subscription(DiagnosticArray, '/diagnostics', keep, 10)
    return heard


@pytest.mark.parametrize('start_after', ['/sim_driver/ready', ''], ids=['handshake', 'none'])
def test_a_simulated_graphs_mpc_commands_nothing_where_its_driver_refuses_the_domain(
        executor, start_after):
    """
    ``sim.launch.py`` (``lockstep:=false``) started on a real robot's domain.

    The launch starts the mpc and ``sim_driver`` together; the driver listens for 4 s, finds
    the real driver and exits, and the launch ends.  Meanwhile the mpc takes the real
    robot's ``joint_states``: without the handshake it commands the real robot (the
    'none' case, the race this closes); with ``start_after:=/sim_driver/ready`` (what
    the launch sets) not once.
    """
    robot_graph(executor, [('qube_driver', '/joint_states', JointState)])
    commands = []
    manager = executor.add_node(Node('controller_manager', namespace='/lab',
                                     context=executor.executor.context))
    manager.create_subscription(Float64MultiArray, '/effort_controller/commands',
                                commands.append, 10)
    diagnostics = mpc_diagnostics(executor)
    argv, env = node_command('mpc', '--ros-args', '-p', 'robot:=qube', '-p', 'compile:=false',
                             *(('-p', f'start_after:={start_after}') if start_after else ()))
    mpc = subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        assert wait_for(lambda: diagnostics or mpc.poll() is not None, timeout=HANG_S,
                        period=0.1) and mpc.poll() is None, mpc.communicate(timeout=10)[0]
        assert_refused('sim_driver', ['--ros-args', '-p', 'robot:=qube',
                                      '-p', 'clock_mode:=realtime'],
                       'publishers of /joint_states: /lab/qube_driver')
        # the mpc ran through the driver's whole probe; one more second of its commands
        wait_for(lambda: commands, timeout=1.0, period=0.1)
        assert mpc.poll() is None
        if not start_after:
            assert commands, diagnostics[-1]
            return
        assert not commands, commands[0]
        last = diagnostics[-1]
        assert last['started'] == 'False' and last['commands'] == '0', last
        assert last['message'].startswith('no command before a message on /sim_driver/ready'), \
            last
    finally:
        if mpc.poll() is None:
            mpc.send_signal(signal.SIGINT)
            try:
                mpc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                mpc.kill()
                mpc.communicate()


def node_class(module, name=None):
    """Return the node class of a node module: ``name``, else its robot node (not TossRig)."""
    (node_cls,) = {value for value in vars(module).values() if isinstance(value, type)
                   and issubclass(value, Node) and value.__module__ == module.__name__
                   and (value.__name__ == name if name else value.__name__ != 'TossRig')}
    return node_cls


@pytest.mark.parametrize('executable, flags, mode', [
    (name, ('--help',), None) for name in NODES if name != 'sim_driver'] + [
    ('sim_driver', ('-h',), 'SimDriver'),   # it would otherwise start a real-time robot
    ('sim_driver', ('-h', '--ros-args', '-p', 'object:=cube'), 'TossRig'),
    ('object_identifier', ('--help',), None)])
def test_help_prints_the_parameters_without_starting_the_node(executable, flags, mode):
    module = __import__(f'diffsim_ros.nodes.{executable}', fromlist=['main'])
    status, stdout, stderr = start(executable, *flags)
    assert status == 0, stdout + stderr
    assert '[INFO]' not in stdout + stderr and '[ERROR]' not in stdout + stderr
    assert stdout.startswith(f'usage: ros2 run diffsim_ros {executable}')
    assert module.__doc__.strip().splitlines()[0] in stdout
    node_cls = node_class(module, mode)   # sim_driver given an object: the toss rig
    for prefix, config_cls in parameter_sections(node_cls):
        for item in dataclasses.fields(config_cls):
            description = item.metadata.get('description')
            if description and item.metadata.get('ros', True):
                assert f'  {prefix}{item.name} (' in stdout, item.name
                assert description.split()[0] in stdout


@pytest.mark.parametrize('robot', ROBOTS)
@pytest.mark.parametrize('executable', NODES)
def test_shipped_configs_hold_only_known_names(ros_context, robot, executable):
    """Launch files pass config/<robot>.yaml whole: a name a node lacks would stop it."""
    module = __import__(f'diffsim_ros.nodes.{executable}', fromlist=['main'])
    node_cls = node_class(module)
    given = load_yaml_params(config_path(robot), executable)
    assert given, f'config/{robot}.yaml has no {executable} section'
    node = Node(executable, context=ros_context)
    try:
        check_unknown_parameters(node, given, parameter_sections(node_cls))
        with pytest.raises(ParameterError, match='no such parameter'):
            check_unknown_parameters(node, {**given, 'not_a_parameter': 1},
                                     parameter_sections(node_cls))
    finally:
        node.destroy_node()


@pytest.mark.parametrize('executable', ('identifier', 'monitor', 'mpc'))
def test_every_parameter_a_node_declares_is_in_its_help_and_accepted_when_given(
        ros_context, executable):
    """A section declared outside PARAMETERS would be missing from --help and refused."""
    module = __import__(f'diffsim_ros.nodes.{executable}', fromlist=['main'])
    node_cls = node_class(module)
    overrides = {'robot': 'qube'}
    if executable == 'mpc':
        overrides.update(controller='baseline', compile=False)
    node = node_cls(context=ros_context, parameter_overrides=parameter_overrides(overrides))
    try:
        declared = set(node._parameters) - {'use_sim_time', 'start_type_description_service'}
        listed = {name for prefix, config_cls in parameter_sections(node_cls)
                  for name in describe_parameters([(prefix, config_cls)]).split()}
        assert declared - listed == set()
        check_unknown_parameters(node, dict.fromkeys(declared, 0), parameter_sections(node_cls))
    finally:
        node.destroy_node()


@dataclass(frozen=True)
class _Ranged:
    """A config with ranged fields."""

    rate: float = field(default=0.0, metadata={'description': 'Hz', 'range': (0.0, 1e4)})
    count: int = field(default=1, metadata={'description': 'n', 'range': (1, None)})
    gains: Tuple[float, ...] = field(default=(), metadata={'description': 'g',
                                                           'range': (None, 5.0)})


@pytest.fixture
def make_node(ros_context):
    nodes = []

    def make(overrides):
        node = Node('ranged', context=ros_context,
                    parameter_overrides=parameter_overrides(overrides))
        nodes.append(node)
        return node
    yield make
    for node in nodes:
        node.destroy_node()


@pytest.mark.parametrize('overrides, name, shown', [
    ({'rate': 1e9}, 'rate', 'in [0.0, 10000.0]'),
    ({'rate': 1000000000}, 'rate', 'in [0.0, 10000.0]'),   # an integer for a double
    ({'rate': -0.5}, 'rate', 'in [0.0, 10000.0]'),
    ({'rate': math.nan}, 'rate', 'in [0.0, 10000.0]'),
    ({'count': 0}, 'count', '>= 1'),
    ({'gains': [1.0, 7.5]}, 'gains', '<= 5.0'),
])
def test_a_range_in_the_field_metadata_is_enforced(make_node, overrides, name, shown):
    with pytest.raises(ParameterError, match=re.escape(f'must lie {shown}')) as caught:
        declare_config(make_node(overrides), _Ranged)
    assert caught.value.name == name
    given = overrides[name]
    assert caught.value.value == given or (given != given and math.isnan(caught.value.value))


def test_an_absurd_command_rate_is_refused(make_node):
    """In-process: the range metadata of MpcConfig refuses 1 GHz before anything is built."""
    from diffsim_ros.nodes.mpc import MpcConfig
    with pytest.raises(ParameterError, match=re.escape("'command_rate' = 1000000000.0")):
        declare_config(make_node({'command_rate': 1e9}), MpcConfig)


def test_a_range_reaches_the_descriptor_and_its_bounds_pass(make_node):
    node = make_node({'rate': 1e4, 'count': 1, 'gains': [5.0, -1e6]})
    assert declare_config(node, _Ranged) == _Ranged(rate=1e4, count=1, gains=(5.0, -1e6))
    (rate,) = node.describe_parameter('rate').floating_point_range
    assert (rate.from_value, rate.to_value) == (0.0, 1e4)
    (count,) = node.describe_parameter('count').integer_range
    assert count.from_value == 1 and count.to_value == (1 << 63) - 1


#: What the whole suite runs with on this machine: a pytest-xdist worker per core, at most 4.
WORKERS = min(len(os.sched_getaffinity(0)), 4)
SUITE = ['test'] + (['-n', str(WORKERS), '--dist', 'loadfile'] if WORKERS > 1 else [])


@pytest.mark.parametrize('arguments, selection', [
    ([], SUITE),
    (['-x'], SUITE + ['-x']),
    (['-k', 'test'], SUITE + ['-k', 'test']),   # the value of -k is no folder
    (['-x', '--deselect', 'test/test_demo.py::test_demo_runs'],
     SUITE + ['-x', '--deselect', 'test/test_demo.py::test_demo_runs']),
    (['-n', '0'], SUITE + ['-n', '0']),         # the user's -n comes last: it wins
    (['test/test_robots.py'], ['test/test_robots.py']),
    (['-q', 'test/test_robots.py::test_catalog', '-k', 'qube'],
     ['-q', 'test/test_robots.py::test_catalog', '-k', 'qube']),
])
def test_dev_sh_runs_the_named_tests_or_the_whole_suite(arguments, selection):
    """``scripts/dev.sh test FILE`` runs FILE; options alone run the whole suite with them."""
    done = subprocess.run(['bash', str(REPO / 'scripts' / 'dev.sh'), 'test', *arguments],
                          env=dict(os.environ, DIFFSIM_DRY_RUN='1'), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    command = done.stdout.splitlines()
    assert command[0].endswith('/bin/python') and command[1:3] == ['-m', 'pytest']
    assert command[3:] == selection


@pytest.mark.parametrize('text', ['monitor: 5\n', 'monitor:\n  ros__parameters: [1]\n',
                                  'monitor:\n  ros__parameters:\n    horizon: [unclosed\n'])
def test_a_malformed_config_file_is_refused(ros_context, tmp_path, text):
    """A section that is no mapping used to be skipped: the node started on defaults."""
    path = tmp_path / 'bad.yaml'
    path.write_text(text, encoding='utf-8')
    node = Node('monitor', context=ros_context,
                parameter_overrides=parameter_overrides({'config_file': str(path)}))
    try:
        with pytest.raises(ParameterError, match="'config_file' = .* refused: not a ROS 2 "):
            declare_robot(node)
    finally:
        node.destroy_node()


@pytest.mark.skipif((os.cpu_count() or 1) < 2,
                    reason='torch starts on one thread on a one-core machine: nothing to set')
@pytest.mark.parametrize('omp, expected', [(None, 1), ('2', 2)])
def test_a_node_process_runs_torch_on_one_thread_unless_omp_num_threads_chooses(omp, expected):
    # The mpc node in a fresh process, as ros2 run starts it (torch's own default there is
    # one thread per core); a user's OMP_NUM_THREADS is obeyed.
    script = ('import rclpy, torch\n'
              'from diffsim_ros.nodes.mpc import MpcNode\n'
              'print("before", torch.get_num_threads())\n'
              'rclpy.init()\n'
              'node = MpcNode()\n'
              'print("after", torch.get_num_threads())\n'
              'node.destroy_node()\n'
              'rclpy.shutdown()\n')
    env = {k: v for k, v in os.environ.items() if k != 'OMP_NUM_THREADS'}
    if omp is not None:
        env['OMP_NUM_THREADS'] = omp
    env.update(PYTHONPATH=os.pathsep.join(
        [str(REPO)] + [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p]),
        ROS_DOMAIN_ID=str(reserved_domain_id()),
        ROS_AUTOMATIC_DISCOVERY_RANGE='LOCALHOST')
    done = subprocess.run([sys.executable, '-c', script], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stdout + done.stderr
    counts = dict(line.split() for line in done.stdout.splitlines()
                  if line.startswith(('before', 'after')))
    if omp is None:
        assert int(counts['before']) >= 2, done.stdout   # torch's default: one a core
    assert int(counts['after']) == expected, done.stdout
