"""
Enforce the layer rules of DESIGN.md on the source, without importing it.

``core``, ``sysid``, ``robots`` and ``control`` never import rclpy, ROS message/service
packages, launch or yaml, and every layer imports only layers below it:
``core`` < ``sysid`` < ``robots`` < ``control`` < ``io`` < ``sim`` < ``nodes`` <
``cup_search`` < ``sim_eval`` < ``demo`` (the last three are modules).  The robot catalog
(``robots/catalog.py``, standard library only, reached as ``robots.get`` and the like) may
be imported from any layer; the torch-based robot interface only from above ``robots``.
The nodes that run on the robot (all of ``nodes/`` but the simulated driver) import neither
the MuJoCo plant (``sim``) nor the bag reader of ``io``.  Imports are found with
:mod:`ast`: ``import x``, ``from x import y`` (relative ones resolved) and
``importlib.import_module('x')`` / ``__import__('x')`` with a literal name.
"""

import ast
from pathlib import Path
import subprocess
import sys
from typing import Iterator, List, Optional, Tuple

import pytest

PACKAGE = 'diffsim_ros'
PACKAGE_DIR = Path(__file__).resolve().parent.parent / PACKAGE
#: Layers from the bottom up; a layer may import only the ones before it.
LAYERS = ('core', 'sysid', 'robots', 'control', 'io', 'sim', 'nodes', 'cup_search', 'sim_eval',
          'demo')
#: Layers that must stay free of ROS and yaml.
PURE_LAYERS = ('core', 'sysid', 'robots', 'control')
#: What any layer may use of ``robots``: the standard-library catalog.
CATALOG_NAMES = frozenset({'catalog', 'get', 'names', 'urdf_path', 'urdf_string', 'RobotInfo',
                           'ROBOTS'})
#: Nodes that may import the simulator (``sim``) and the bag files of ``io``.
OFF_ROBOT_NODES = {'sim_driver': ('sim', 'io.bags'), 'recorder': ('io.bags',)}
#: Modules the robot path must not import, and the names through which they are reached.
ROBOT_PATH_FORBIDDEN = ('sim', 'io.bags', 'io.read_bag')
FORBIDDEN_TOP_LEVEL = frozenset({
    'rclpy', 'launch', 'launch_ros', 'launch_testing', 'launch_xml', 'launch_yaml', 'yaml',
    'std_srvs', 'ament_index_python', 'rosidl_runtime_py', 'message_filters', 'tf2_ros',
})
FORBIDDEN_SUFFIXES = ('_msgs', '_srvs')


def is_forbidden_external(module: str) -> bool:
    """
    Tell whether a module belongs to ROS 2 or yaml.

    :param module: absolute dotted module name.
    :return: True for rclpy, launch, yaml and message/service packages.
    """
    top = module.split('.')[0]
    return top in FORBIDDEN_TOP_LEVEL or top.endswith(FORBIDDEN_SUFFIXES)


def _resolve_relative(name: str, level: int, module: str, is_package: bool) -> str:
    """Return the absolute name of a ``from`` import with ``level`` leading dots."""
    parts = module.split('.') if is_package else module.split('.')[:-1]
    base = parts[:len(parts) - level + 1]
    return '.'.join(base + ([name] if name else []))


def _literal_import_call(node: ast.Call) -> Optional[Tuple[str, Optional[str]]]:
    """Return ``(name, package)`` of ``import_module('x')``/``__import__('x')`` calls."""
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, 'id', None)
    if called not in ('import_module', '__import__') or not node.args:
        return None
    first = node.args[0]
    if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
        return None
    package = None
    for keyword in node.keywords:
        if keyword.arg == 'package' and isinstance(keyword.value, ast.Constant):
            package = keyword.value.value
    if package is None and len(node.args) > 1 and isinstance(node.args[1], ast.Constant):
        package = node.args[1].value
    return first.value, package


def imported_modules(source: str, module: str, is_package: bool = False
                     ) -> Iterator[Tuple[int, str]]:
    """
    Yield every module a source file imports.

    :param source: Python source text.
    :param module: dotted name of the module the source belongs to (for relative imports).
    :param is_package: True when the source is the package's ``__init__.py``.
    :return: iterator of ``(line, absolute module name)``; ``from a import b`` yields both
        ``a`` and ``a.b`` since ``b`` may be a submodule.
    """
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:
                base = _resolve_relative(base, node.level, module, is_package)
            yield node.lineno, base
            for alias in node.names:
                if alias.name != '*':
                    yield node.lineno, f'{base}.{alias.name}'
        elif isinstance(node, ast.Call):
            found = _literal_import_call(node)
            if found is None:
                continue
            name, package = found
            if name.startswith('.'):
                level = len(name) - len(name.lstrip('.'))
                anchor = package or module
                name = _resolve_relative(name[level:], level, anchor, package is not None)
            yield node.lineno, name


def layer_violations(source: str, module: str, is_package: bool = False) -> List[str]:
    """
    Return the layer-rule violations of one source file.

    :param source: Python source text.
    :param module: dotted module name, e.g. ``diffsim_ros.core.rnea``.
    :param is_package: True for a package ``__init__.py``.
    :return: one message per offending import; empty when the file obeys the rules.
    """
    layer = module.split('.')[1] if module.count('.') else None
    if layer not in LAYERS:
        return []
    higher = LAYERS[LAYERS.index(layer) + 1:]
    node = module.split('.')[2] if layer == 'nodes' and module.count('.') > 1 else None
    problems = []
    for line, imported in imported_modules(source, module, is_package):
        parts = imported.split('.')
        inside = parts[0] == PACKAGE and len(parts) > 1
        catalog = inside and parts[1] == 'robots' and (
            len(parts) == 2 or parts[2] in CATALOG_NAMES)
        if layer in PURE_LAYERS and is_forbidden_external(imported):
            problems.append(f'{module}:{line} imports {imported} (ROS/yaml in {layer})')
        elif inside and parts[1] in higher and not catalog:
            problems.append(f'{module}:{line} imports {imported} '
                            f'({layer} may not depend on {parts[1]})')
        elif inside and node is not None:
            name = '.'.join(parts[1:])
            allowed = OFF_ROBOT_NODES.get(node, ())
            for forbidden in ROBOT_PATH_FORBIDDEN:
                if (name == forbidden or name.startswith(forbidden + '.')) and not any(
                        forbidden.startswith(a) for a in allowed):
                    problems.append(f'{module}:{line} imports {imported} (the robot path '
                                    f'may not load {forbidden})')
    return sorted(set(problems))


def package_violations(package_dir: Path, layers: Tuple[str, ...] = LAYERS) -> List[str]:
    """
    Check every ``.py`` file of the given layers of a package directory.

    :param package_dir: the ``diffsim_ros`` directory (or a stand-in with the same layout).
    :param layers: layer sub-packages to scan.
    :return: all violations found.
    """
    problems = []
    for layer in layers:
        single = package_dir / f'{layer}.py'
        paths = [single] if single.is_file() else sorted((package_dir / layer).rglob('*.py'))
        for path in paths:
            relative = path.relative_to(package_dir.parent).with_suffix('')
            is_package = relative.name == '__init__'
            parts = relative.parts[:-1] if is_package else relative.parts
            problems += layer_violations(path.read_text(encoding='utf-8'), '.'.join(parts),
                                         is_package)
    return problems


@pytest.mark.parametrize('layer', LAYERS)
def test_layer_imports_point_down(layer):
    assert (PACKAGE_DIR / layer).is_dir() or (PACKAGE_DIR / f'{layer}.py').is_file(), layer
    problems = package_violations(PACKAGE_DIR, (layer,))
    assert not problems, 'Layer rule violations:\n' + '\n'.join(problems)


@pytest.mark.parametrize('snippet', [
    'import rclpy',
    'import rclpy.node as node',
    'from std_msgs.msg import String',
    'from sensor_msgs import msg',
    'import std_srvs.srv',
    'from launch_ros.actions import Node',
    'import launch',
    'import yaml',
    'import importlib\nimportlib.import_module("yaml")',
    'from importlib import import_module\nimport_module("geometry_msgs.msg")',
    'rclpy = __import__("rclpy")',
    'def lazy():\n    import visualization_msgs.msg\n',
    'from ..sysid import svgd',
    'from .. import control',
    'from diffsim_ros.io import bags',
    'import diffsim_ros.nodes.identifier',
    'import importlib\nimportlib.import_module("..control", "diffsim_ros.core")',
])
def test_checker_flags_violations_in_core(snippet):
    assert layer_violations(snippet, 'diffsim_ros.core.rnea'), snippet


@pytest.mark.parametrize('snippet', [
    'import torch\nimport numpy as np',
    'from . import spatial\nfrom .model import RobotModel',
    'from diffsim_ros.core import rnea',
    '# import rclpy\n"""import yaml"""\nx = "rclpy"',
    'import importlib\nimportlib.import_module("torch.nn")',
    'from typing import Optional',
])
def test_checker_accepts_clean_core(snippet):
    assert layer_violations(snippet, 'diffsim_ros.core.rnea') == []


def test_checker_follows_layer_order():
    assert layer_violations('from ..core import rnea', 'diffsim_ros.sysid.losses') == []
    assert layer_violations('from ..sysid import svgd', 'diffsim_ros.control.mpc') == []
    assert layer_violations('from ..control import ilqr', 'diffsim_ros.sysid.losses')
    assert layer_violations('from ..io import bags', 'diffsim_ros.control.mpc')
    assert layer_violations('from .. import nodes', 'diffsim_ros.io', is_package=True)
    # io and nodes may talk to ROS; only the pure layers may not.
    assert layer_violations('import rclpy\nimport yaml', 'diffsim_ros.nodes.identifier') == []
    assert layer_violations('from rosbags.highlevel import AnyReader',
                            'diffsim_ros.io.bags') == []


def test_checker_resolves_relative_imports_in_packages():
    # In core/__init__.py one dot is core itself, two dots the top package.
    assert layer_violations('from .rnea import rnea', 'diffsim_ros.core', is_package=True) == []
    assert layer_violations('from ..sysid import losses', 'diffsim_ros.core', is_package=True)


def test_scan_fails_on_a_violating_file(tmp_path):
    package = tmp_path / PACKAGE
    (package / 'core' / 'sub').mkdir(parents=True)
    (package / '__init__.py').write_text('')
    (package / 'core' / '__init__.py').write_text('from .clean import f\n')
    (package / 'core' / 'clean.py').write_text('import torch\n\n\ndef f():\n    pass\n')
    (package / 'core' / 'sub' / '__init__.py').write_text('')
    (package / 'core' / 'sub' / 'leaky.py').write_text(
        'import torch\nfrom std_msgs.msg import Float64\nfrom ...control import mpc\n')
    problems = package_violations(package, ('core',))
    assert problems == [
        'diffsim_ros.core.sub.leaky:2 imports std_msgs.msg (ROS/yaml in core)',
        'diffsim_ros.core.sub.leaky:2 imports std_msgs.msg.Float64 (ROS/yaml in core)',
        'diffsim_ros.core.sub.leaky:3 imports diffsim_ros.control '
        '(core may not depend on control)',
        'diffsim_ros.core.sub.leaky:3 imports diffsim_ros.control.mpc '
        '(core may not depend on control)',
    ]


def test_robot_path_rules():
    for node in ('mpc', 'monitor', 'identifier', 'convert'):
        module = f'diffsim_ros.nodes.{node}'
        assert layer_violations('from ..sim.parameters import nominal_model', module), node
        assert layer_violations('from .. import sim', module), node
        assert layer_violations('from ..io import read_bag', module), node
        assert layer_violations('from ..io.bags import read_bag', module), node
        assert layer_violations('from ..io.urdf_export import model_to_urdf', module) == []
    assert layer_violations('from ..sim import MujocoPlant', 'diffsim_ros.nodes.sim_driver') \
        == []
    assert layer_violations('from ..io.bags import BagWriter', 'diffsim_ros.nodes.recorder') \
        == []
    assert layer_violations('from ..sim import MujocoPlant', 'diffsim_ros.nodes.recorder')


def test_catalog_is_reachable_from_every_layer_but_the_interface_is_not():
    assert layer_violations('from .. import robots', 'diffsim_ros.core.urdf') == []
    assert layer_violations('from ..robots import get', 'diffsim_ros.sysid.online') == []
    assert layer_violations('from ..robots.interface import interface',
                            'diffsim_ros.sysid.online')
    assert layer_violations('from ..control import tasks', 'diffsim_ros.robots.interface')
    assert layer_violations('from ..sysid.losses import make_torque_fn',
                            'diffsim_ros.robots.interface') == []
    assert layer_violations('from .demo import main', 'diffsim_ros.sim_eval')
    assert layer_violations('from .sim_eval import main', 'diffsim_ros.demo') == []


def test_catalog_uses_the_standard_library_only():
    catalog = PACKAGE_DIR / 'robots' / 'catalog.py'
    imported = {name.split('.')[0] for _, name in imported_modules(
        catalog.read_text(encoding='utf-8'), 'diffsim_ros.robots.catalog')}
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)


def test_mpc_and_monitor_load_neither_the_simulator_nor_the_bag_reader():
    code = ('import sys\nimport diffsim_ros.nodes.mpc, diffsim_ros.nodes.monitor\n'
            'from diffsim_ros import robots\nrobots.interface("qube").nominal_model()\n'
            'print(sorted(m for m in sys.modules if m.split(".")[0] in ("mujoco", "rosbags")\n'
            '             or m.startswith("diffsim_ros.sim") or m == "diffsim_ros.io.bags"))')
    done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          timeout=300, cwd=PACKAGE_DIR.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == '[]', done.stdout
