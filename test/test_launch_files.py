"""
Static checks of the launch files and the RViz configuration.

``launch`` and ``launch_ros`` are not installable here, so the files are read with
:mod:`ast`: they must parse, define ``generate_launch_description``, start only executables
that exist, refer only to files that exist, describe every argument and offer only robots
that have a parameter file.
"""

import ast
from pathlib import Path
import re
from typing import Any, Dict, List

from diffsim_ros import robots
import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
LAUNCH_DIR = REPO / 'launch'
CONFIG_DIR = REPO / 'config'
LAUNCH_FILES = sorted(LAUNCH_DIR.glob('*.launch.py'))
PACKAGE = 'diffsim_ros'
#: Executables the nodes layer provides (``diffsim_ros/nodes/<name>.py`` with ``main``).
PLANNED_EXECUTABLES = ('identifier', 'mpc', 'monitor', 'sim_driver')
#: Robots the launch files must offer (issue #6).
LAUNCH_ROBOTS = {'wam4', 'wam7', 'qube', 'cartpole', 'panda'}


def module_constants(tree: ast.Module) -> Dict[str, Any]:
    """Return the module-level ``NAME = <literal>`` assignments of a parsed file."""
    constants = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                isinstance(node.targets[0], ast.Name):
            try:
                constants[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return constants


def resolve(node: ast.AST, constants: Dict[str, Any]) -> Any:
    """Evaluate a literal, a module constant or ``list(<constant>)``; None otherwise."""
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    if isinstance(node, ast.Call) and getattr(node.func, 'id', None) in ('list', 'tuple') \
            and len(node.args) == 1:
        value = resolve(node.args[0], constants)
        return None if value is None else list(value)
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


def calls(tree: ast.AST, name: str) -> List[ast.Call]:
    """Return every call of ``name(...)`` or ``<module>.name(...)`` in a tree."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, 'id', None)
            if called == name:
                found.append(node)
    return found


def keyword(call: ast.Call, name: str, position: int = -1):
    """Return the AST of a call's keyword argument (or positional ``position``), or None."""
    for item in call.keywords:
        if item.arg == name:
            return item.value
    if 0 <= position < len(call.args):
        return call.args[position]
    return None


def parsed(path: Path):
    tree = ast.parse(path.read_text(encoding='utf-8'), filename=str(path))
    return tree, module_constants(tree)


def declared_arguments(path: Path) -> Dict[str, ast.Call]:
    tree, constants = parsed(path)
    return {resolve(keyword(call, 'name', 0), constants): call
            for call in calls(tree, 'DeclareLaunchArgument')}


def entry_points() -> Dict[str, str]:
    """Return ``{executable: 'module:function'}`` of setup.py's console scripts."""
    tree = ast.parse((REPO / 'setup.py').read_text(encoding='utf-8'))
    scripts = {}
    for call in calls(tree, 'setup'):
        points = resolve(keyword(call, 'entry_points'), {}) or {}
        for line in points.get('console_scripts', []):
            name, target = (part.strip() for part in line.split('=', 1))
            scripts[name] = target
    return scripts


def defines_function(module: str, function: str) -> bool:
    path = REPO / (module.replace('.', '/') + '.py')
    if not path.is_file():
        return False
    tree = ast.parse(path.read_text(encoding='utf-8'))
    return any(isinstance(node, ast.FunctionDef) and node.name == function
               for node in tree.body)


def test_the_three_launch_files_exist():
    assert {path.name for path in LAUNCH_FILES} >= {
        'identify.launch.py', 'sim.launch.py', 'replay.launch.py'}


@pytest.mark.parametrize('path', LAUNCH_FILES, ids=lambda p: p.name)
def test_defines_generate_launch_description(path):
    tree, _ = parsed(path)
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert 'generate_launch_description' in functions
    assert not functions['generate_launch_description'].args.args


@pytest.mark.parametrize('path', LAUNCH_FILES, ids=lambda p: p.name)
def test_arguments_are_described_and_used_ones_declared(path):
    tree, constants = parsed(path)
    declared = declared_arguments(path)
    assert declared, 'no DeclareLaunchArgument'
    for name, call in declared.items():
        assert isinstance(name, str), ast.dump(call)
        description = resolve(keyword(call, 'description'), constants)
        assert isinstance(description, str) and len(description) > 10, name
    # Names built at run time (helpers, comprehensions) resolve to None and are skipped.
    used = {resolve(keyword(call, 'variable_name', 0), constants)
            for call in calls(tree, 'LaunchConfiguration')} - {None}
    assert used, 'no LaunchConfiguration with a literal name'
    assert used <= set(declared), f'undeclared arguments {used - set(declared)}'


@pytest.mark.parametrize('path', LAUNCH_FILES, ids=lambda p: p.name)
def test_robot_choices_have_configs(path):
    _, constants = parsed(path)
    if 'object' in declared_arguments(path):   # object.launch.py: a tracked object, no robot
        call = declared_arguments(path)['object']
        choices = resolve(keyword(call, 'choices'), constants)
        assert all((CONFIG_DIR / f'{name}.yaml').is_file() for name in choices), choices
        return
    if 'robot' not in declared_arguments(path):   # cup.launch.py: one configuration, CONFIG
        assert (CONFIG_DIR / constants['CONFIG']).is_file(), constants.get('CONFIG')
        return
    call = declared_arguments(path)['robot']
    choices = resolve(keyword(call, 'choices'), constants)
    assert set(choices) == LAUNCH_ROBOTS
    assert set(choices) <= set(robots.names())
    assert resolve(keyword(call, 'default_value'), constants) in choices
    missing = [robot for robot in choices if not (CONFIG_DIR / f'{robot}.yaml').is_file()]
    assert not missing, f'no config/<robot>.yaml for {missing}'


@pytest.mark.parametrize('path', LAUNCH_FILES, ids=lambda p: p.name)
def test_executables_exist(path):
    tree, constants = parsed(path)
    scripts = entry_points()
    for call in calls(tree, 'Node'):
        package = resolve(keyword(call, 'package'), constants)
        executable = resolve(keyword(call, 'executable'), constants)
        assert isinstance(package, str) and isinstance(executable, str), ast.dump(call)
        if package != PACKAGE:
            continue
        if executable in scripts:
            module, function = scripts[executable].split(':')
        else:
            assert executable in PLANNED_EXECUTABLES, f'{executable} is no entry point'
            module, function = f'{PACKAGE}.nodes.{executable}', 'main'
        assert defines_function(module, function), f'{executable}: {module}:{function}'


@pytest.mark.parametrize('path', LAUNCH_FILES, ids=lambda p: p.name)
def test_referenced_files_exist(path):
    text = path.read_text(encoding='utf-8')
    for name in re.findall(r"'([\w.-]+\.(?:rviz|yaml))'", text):
        assert (CONFIG_DIR / name).is_file(), name
    for name in re.findall(r"'([\w.-]+\.launch\.py)'", text):
        assert (LAUNCH_DIR / name).is_file(), name


def test_included_launch_arguments_are_declared():
    identify = set(declared_arguments(LAUNCH_DIR / 'identify.launch.py'))
    for path in LAUNCH_FILES:
        tree, constants = parsed(path)
        for call in calls(tree, 'IncludeLaunchDescription'):
            arguments = keyword(call, 'launch_arguments')
            for node in ast.walk(arguments):
                if isinstance(node, ast.Dict):
                    names = {resolve(key, constants) for key in node.keys if key is not None}
                    assert names <= identify, f'{path.name}: {names - identify}'


def test_external_packages_are_exec_depends():
    package_xml = (REPO / 'package.xml').read_text(encoding='utf-8')
    depends = set(re.findall(r'<exec_depend>([\w-]+)</exec_depend>', package_xml))
    needed = set()
    for path in LAUNCH_FILES:
        tree, constants = parsed(path)
        needed |= {resolve(keyword(call, 'package'), constants) for call in calls(tree, 'Node')}
        for call in calls(tree, 'ExecuteProcess'):
            command = keyword(call, 'cmd')
            words = [resolve(word, constants) for word in getattr(command, 'elts', [])]
            if words[:2] == ['ros2', 'bag']:
                needed.add('ros2bag')
    needed.discard(PACKAGE)
    assert needed <= depends, f'add <exec_depend> for {sorted(needed - depends)} to package.xml'


def _rviz_displays() -> List[dict]:
    config = yaml.safe_load((CONFIG_DIR / 'monitor.rviz').read_text(encoding='utf-8'))
    manager = config['Visualization Manager']
    assert manager['Global Options']['Fixed Frame']
    return manager['Displays']


def test_rviz_config_shows_real_and_ghost_robot_and_paths():
    displays = _rviz_displays()
    models = [d for d in displays if d['Class'] == 'rviz_default_plugins/RobotModel']
    topics = {d['Description Topic']['Value']: d for d in models}
    assert set(topics) == {'/robot_description', '/predicted/robot_description'}
    assert topics['/predicted/robot_description']['TF Prefix'] == 'predicted'
    assert topics['/robot_description']['TF Prefix'] == ''
    markers = [d for d in displays if d['Class'] == 'rviz_default_plugins/MarkerArray']
    assert len(markers) == 1 and markers[0]['Topic']['Value'] == '/monitor/markers'


def test_rviz_namespaces_match_the_monitor():
    pytest.importorskip('rclpy', reason='the monitor node needs rclpy')
    from diffsim_ros.nodes import monitor
    (markers,) = [d for d in _rviz_displays()
                  if d['Class'] == 'rviz_default_plugins/MarkerArray']
    assert set(markers['Namespaces']) == {monitor.MEASURED_NS, monitor.PREDICTED_NS}


def _nodes_of(tree: ast.AST, constants: Dict[str, Any], executable: str) -> List[ast.Call]:
    return [call for call in calls(tree, 'Node')
            if resolve(keyword(call, 'executable'), constants) == executable]


def _include_arguments(path: Path) -> Dict[str, ast.AST]:
    """Return ``{name: value AST}`` of the arguments a file passes to identify.launch.py."""
    tree, constants = parsed(path)
    passed = {}
    for call in calls(tree, 'IncludeLaunchDescription'):
        for node in ast.walk(keyword(call, 'launch_arguments')):
            if isinstance(node, ast.Dict):
                passed.update({resolve(key, constants): value
                               for key, value in zip(node.keys, node.values) if key})
    return passed


def test_identify_commands_the_robot_only_with_control_true():
    """identify.launch.py is for the physical robot: identification alone by default."""
    path = LAUNCH_DIR / 'identify.launch.py'
    tree, constants = parsed(path)
    declared = declared_arguments(path)
    assert 'mpc' not in declared
    control = declared['control']
    assert resolve(keyword(control, 'default_value'), constants) == 'false'
    assert set(resolve(keyword(control, 'choices'), constants)) == {'true', 'false'}
    mpc = _nodes_of(tree, constants, 'mpc')
    assert mpc, 'identify.launch.py no longer offers the mpc'
    guarded = set()
    for branch in ast.walk(tree):
        if isinstance(branch, ast.If) and any(
                isinstance(node, ast.Constant) and node.value == 'control'
                for node in ast.walk(branch.test)):
            guarded |= {id(call) for statement in branch.body
                        for call in ast.walk(statement) if isinstance(call, ast.Call)}
    assert {id(call) for call in mpc} <= guarded, 'an mpc node starts without control:=true'
    # The only executables that publish commands are the mpc (and sim_driver, which is no
    # part of this file).
    assert not _nodes_of(tree, constants, 'sim_driver')


@pytest.mark.parametrize('name', ['sim.launch.py', 'cup.launch.py', 'object.launch.py'])
def test_the_launch_ends_when_the_simulated_driver_exits(name):
    """It refuses a domain where a robot runs: the mpc beside it must not go on there."""
    tree, constants = parsed(LAUNCH_DIR / name)
    drivers = _nodes_of(tree, constants, 'sim_driver')
    assert drivers
    for driver in drivers:
        on_exit = keyword(driver, 'on_exit')
        assert isinstance(on_exit, ast.Call) and getattr(on_exit.func, 'id', None) == \
            'Shutdown', ast.dump(driver)


def test_sim_controls_by_default_and_replay_never():
    sim = _include_arguments(LAUNCH_DIR / 'sim.launch.py')
    _, constants = parsed(LAUNCH_DIR / 'sim.launch.py')
    assert resolve(keyword(sim['control'], 'variable_name', 0), constants) == 'control'
    default = keyword(declared_arguments(LAUNCH_DIR / 'sim.launch.py')['control'],
                      'default_value')
    assert resolve(default, constants) == 'true'
    replay = _include_arguments(LAUNCH_DIR / 'replay.launch.py')
    assert resolve(replay['control'], {}) == 'false'


def _mentions(call: ast.AST, text: str) -> bool:
    """Return whether a string constant ``text`` occurs anywhere in a call's AST."""
    return any(isinstance(node, ast.Constant) and node.value == text for node in ast.walk(call))


def test_a_simulated_launchs_mpc_commands_nothing_before_its_drivers_ready():
    """sim_driver says on ``~/ready`` that its domain probe passed; the mpc beside it waits."""
    for name in ('sim.launch.py', 'cup.launch.py'):
        tree, constants = parsed(LAUNCH_DIR / name)
        (driver,) = _nodes_of(tree, constants, 'sim_driver')
        ready = f'/{resolve(keyword(driver, "name"), constants)}/ready'
        assert constants['READY_TOPIC'] == ready, name
    sim = _include_arguments(LAUNCH_DIR / 'sim.launch.py')
    assert resolve(sim['start_after'], parsed(LAUNCH_DIR / 'sim.launch.py')[1]) == \
        '/sim_driver/ready'
    # identify.launch.py hands it to its mpc; on a physical robot nothing is waited for
    identify = LAUNCH_DIR / 'identify.launch.py'
    tree, constants = parsed(identify)
    default = keyword(declared_arguments(identify)['start_after'], 'default_value')
    assert resolve(default, constants) == ''
    (mpc,) = _nodes_of(tree, constants, 'mpc')
    assert _mentions(keyword(mpc, 'parameters'), 'start_after')
    # cup.launch.py's mpc: the driver's topic when simulated, nothing on the physical WAM
    tree, constants = parsed(LAUNCH_DIR / 'cup.launch.py')
    settings = [node for node in ast.walk(tree) if isinstance(node, ast.Dict)
                and any(resolve(key, constants) == 'start_after' for key in node.keys if key)]
    (setting,) = settings
    value = setting.values[[resolve(key, constants) for key in setting.keys].index('start_after')]
    assert isinstance(value, ast.IfExp) and getattr(value.test, 'id', None) == 'simulate'
    assert resolve(value.body, constants) == '/sim_driver/ready'
    assert resolve(value.orelse, constants) == ''
