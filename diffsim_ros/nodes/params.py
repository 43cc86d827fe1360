"""
ROS parameters <-> frozen dataclass configurations, and the per-robot YAML files.

Configuration flows one way: ``config/<robot>.yaml`` (``ros__parameters`` per node name) ->
declared ROS parameters (with descriptors) -> a frozen dataclass validated in its
``__post_init__`` -> pure constructors.  A config dataclass describes each field in its
metadata::

    refit_period: float = field(default=0.5, metadata={'description': 'refit every ... s'})

``metadata['read_only']`` defaults to True: the nodes read their configuration once at
start-up, so a parameter that may change at run time must say ``'read_only': False`` and
the node must handle the change.
"""

import collections.abc
import dataclasses
from dataclasses import dataclass, field
import inspect
from pathlib import Path
import re
import typing
from typing import Any, Dict, Iterable, Mapping, Optional

from rcl_interfaces.msg import ParameterDescriptor
from rclpy.exceptions import ParameterException
from rclpy.parameter import Parameter
import yaml

from .. import robots

__all__ = ['RobotSelection', 'config_path', 'declare_config', 'declare_robot',
           'docstring_params', 'flatten', 'load_yaml_params', 'parameter_overrides']

_PACKAGE = 'diffsim_ros'
_REPO_CONFIG = Path(__file__).resolve().parent.parent.parent / 'config'

_SCALARS = {bool: Parameter.Type.BOOL, int: Parameter.Type.INTEGER,
            float: Parameter.Type.DOUBLE, str: Parameter.Type.STRING}
_ARRAYS = {bool: Parameter.Type.BOOL_ARRAY, int: Parameter.Type.INTEGER_ARRAY,
           float: Parameter.Type.DOUBLE_ARRAY, str: Parameter.Type.STRING_ARRAY}
#: Marks a mapping field: a STRING parameter holding YAML (flow style) text.
_MAPPING = 'mapping'


def _parameter_type(annotation) -> tuple:
    """Return ``(Parameter.Type, element type, or _MAPPING, or None)`` of an annotation."""
    if annotation in _SCALARS:
        return _SCALARS[annotation], None
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (tuple, list) and args and args[0] in _ARRAYS and (
            len(args) == 1 or args[1:] == (Ellipsis,)):
        return _ARRAYS[args[0]], args[0]
    if origin in (dict, Mapping, collections.abc.Mapping) or annotation in (dict, Mapping):
        return Parameter.Type.STRING, _MAPPING
    raise TypeError(f'cannot map annotation {annotation!r} to a ROS parameter type '
                    '(use bool, int, float, str, tuple[<one of them>, ...] or a Mapping)')


def _coerce(value: Any, annotation) -> Any:
    """Convert a YAML/ROS value to the field's Python type (ints to floats, lists to tuples)."""
    _, element = _parameter_type(annotation)
    if element == _MAPPING:
        if isinstance(value, str):
            value = yaml.safe_load(value) if value.strip() else None
        if value is not None and not isinstance(value, Mapping):
            raise ValueError(f'expected a mapping (YAML text such as "{{a: 1}}"), got '
                             f'{value!r}')
        return value
    if element is None:
        if annotation is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        return value
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ValueError(f'expected a list of {element.__name__}, got {value!r}')
    items = list(value)
    if element is float:
        items = [float(v) if isinstance(v, int) and not isinstance(v, bool) else v
                 for v in items]
    return tuple(items)


def _check_type(name: str, value: Any, annotation) -> Any:
    """Return ``value`` if it has the field's type (after :func:`_coerce`), else raise."""
    _, element = _parameter_type(annotation)
    if value is None or element == _MAPPING:
        return value
    expected = annotation if element is None else element
    items = (value,) if element is None else value
    for item in items:
        if not isinstance(item, expected) or (expected is int and isinstance(item, bool)):
            kind = expected.__name__ if element is None else f'list of {expected.__name__}'
            raise ValueError(f'parameter {name!r} must be a {kind}, got {value!r}')
    return value


def _to_parameter_value(value: Any, annotation) -> Any:
    """Return the value in the form rclpy stores (lists, YAML text for mappings)."""
    _, element = _parameter_type(annotation)
    if element == _MAPPING:
        return '' if value is None else yaml.safe_dump(dict(value), default_flow_style=True,
                                                       width=1 << 16).strip()
    return list(value) if isinstance(value, tuple) else value


def _field_default(item: dataclasses.Field) -> Any:
    """Return a dataclass field's default value, or ``dataclasses.MISSING``."""
    if item.default is not dataclasses.MISSING:
        return item.default
    if item.default_factory is not dataclasses.MISSING:
        return item.default_factory()
    return dataclasses.MISSING


def docstring_params(cls) -> Dict[str, str]:
    """
    Return the ``:param name: text`` entries of a class docstring.

    :param cls: a documented class (config dataclasses document their fields this way).
    :return: ``{name: text}`` with continuation lines joined by single spaces.
    """
    found = {}
    pattern = re.compile(r':param (\w+):(.*?)(?=\n\s*:\w|\Z)', re.S)
    for name, text in pattern.findall(inspect.getdoc(cls) or ''):
        found[name] = ' '.join(text.split())
    return found


def _mapping_default(defaults: Mapping[str, Any], name: str) -> Any:
    """Collect ``name.key`` entries of flattened defaults into a mapping (or MISSING)."""
    nested = {key[len(name) + 1:]: value for key, value in defaults.items()
              if key.startswith(name + '.')}
    return nested or dataclasses.MISSING


def declare_config(node, config_cls, prefix: str = '',
                   defaults: Optional[Mapping[str, Any]] = None,
                   skip_unsupported: bool = False):
    """
    Declare every field of a config dataclass as a ROS parameter and build the config.

    Each field ``f`` becomes parameter ``prefix + f`` with a ``ParameterDescriptor`` whose
    description is ``field.metadata['description']`` (else the class docstring's
    ``:param f:`` text) and which is read-only unless ``field.metadata['read_only']`` is
    False.  Types: ``bool``, ``int``, ``float``, ``str``, ``tuple[X, ...]`` of those, and
    mappings, which are STRING parameters holding YAML text (``'{gear_efficiency: 1.0}'``;
    in ``defaults`` a nested mapping works too).  Values come, in order of precedence,
    from the node's parameter overrides (``--ros-args -p``/``--params-file``,
    ``parameter_overrides``), ``defaults`` (e.g. :func:`load_yaml_params` of
    ``config/<robot>.yaml``), the dataclass default.  Fields with
    ``metadata['ros'] = False`` are not declared.

    :param node: the ``rclpy.node.Node`` declaring the parameters.
    :param config_cls: a dataclass type whose ``__post_init__`` validates the values.
    :param prefix: parameter-name prefix, e.g. ``'diffnea.'``.
    :param defaults: values by parameter name (with prefix) that replace dataclass defaults.
    :param skip_unsupported: leave fields of other types (with defaults) undeclared, at
        their defaults, instead of raising (for configs defined outside the nodes).
    :return: the validated ``config_cls`` instance.
    :raises ValueError: a value of the wrong type, a required parameter without a value, or a
        config the dataclass rejects (the reason is also logged as an error).
    """
    defaults = dict(defaults or {})
    hints = typing.get_type_hints(config_cls)
    documented = docstring_params(config_cls)
    values = {}
    try:
        for item in dataclasses.fields(config_cls):
            if not item.init or not item.metadata.get('ros', True):
                continue
            name = prefix + item.name
            annotation = hints[item.name]
            try:
                ptype, element = _parameter_type(annotation)
            except TypeError:
                if skip_unsupported and _field_default(item) is not dataclasses.MISSING:
                    continue
                raise
            default = defaults.get(name, dataclasses.MISSING)
            if default is dataclasses.MISSING and element == _MAPPING:
                default = _mapping_default(defaults, name)
            if default is dataclasses.MISSING:
                default = _field_default(item)
            if default is not dataclasses.MISSING and default is not None:
                default = _coerce(default, annotation)
            # YAML writes 1 for 1.0: floats accept integers (checked by _check_type below).
            floating = ptype in (Parameter.Type.DOUBLE, Parameter.Type.DOUBLE_ARRAY)
            descriptor = ParameterDescriptor(
                name=name, type=Parameter.Type.NOT_SET.value if floating else ptype.value,
                description=str(item.metadata.get('description', documented.get(item.name, ''))),
                read_only=bool(item.metadata.get('read_only', True)),
                dynamic_typing=floating)
            stored = None if default is dataclasses.MISSING else _to_parameter_value(
                default, annotation)
            if stored is None or stored == []:
                # rclpy infers a byte array from an empty list: declare by type instead
                # (dynamically typed parameters are declared unset).
                stored = None if floating else ptype
            parameter = node.declare_parameter(name, stored, descriptor)
            value = parameter.value
            if value is None:
                if default is dataclasses.MISSING:
                    raise ValueError(f'parameter {name!r} is required and has no value')
                value = default
            values[item.name] = _check_type(name, _coerce(value, annotation), annotation)
        return config_cls(**values)
    except (ValueError, TypeError, ParameterException, yaml.YAMLError) as error:
        node.get_logger().error(f'invalid {config_cls.__name__} parameters: {error}')
        raise ValueError(f'invalid {config_cls.__name__} parameters: {error}') from error


def flatten(params: Mapping[str, Any], prefix: str = '') -> Dict[str, Any]:
    """
    Flatten nested parameter dictionaries to dotted names, as ROS does.

    :param params: ``{'estimator': {'lr': 0.01}}``-style mapping.
    :param prefix: prefix for the produced names.
    :return: ``{'estimator.lr': 0.01}``-style flat dictionary.
    """
    flat = {}
    for key, value in params.items():
        if isinstance(value, Mapping):
            flat.update(flatten(value, f'{prefix}{key}.'))
        else:
            flat[f'{prefix}{key}'] = value
    return flat


def load_yaml_params(path, node_name: str) -> Dict[str, Any]:
    """
    Read the ``ros__parameters`` of one node from a ROS 2 parameter file.

    Wildcard sections (``/**`` or ``**``) apply first, then the node's own section (keyed
    ``node_name`` or ``/node_name``, optionally nested under a namespace key).

    :param path: the YAML file, e.g. :func:`config_path` ``(robot)``.
    :param node_name: node name without namespace, e.g. ``'identifier'``.
    :return: flat ``{parameter name: value}`` (nested names joined with ``.``); empty when the
        file has no section for the node.
    :raises ValueError: the file is not a mapping of node sections.
    """
    document = yaml.safe_load(Path(path).read_text(encoding='utf-8')) or {}
    if not isinstance(document, Mapping):
        raise ValueError(f'{path}: expected a mapping of node names, got '
                         f'{type(document).__name__}')
    found: Dict[str, Any] = {}

    def visit(section: Mapping[str, Any], depth: int) -> None:
        for key in ('/**', '**'):
            if isinstance(section.get(key), Mapping):
                found.update(flatten(section[key].get('ros__parameters', {}) or {}))
        for key, value in section.items():
            if not isinstance(value, Mapping):
                continue
            if key.strip('/') == node_name and 'ros__parameters' in value:
                found.update(flatten(value['ros__parameters'] or {}))
            elif depth < 3 and 'ros__parameters' not in value and key not in ('/**', '**'):
                visit(value, depth + 1)

    visit(document, 0)
    return found


def parameter_overrides(values: Mapping[str, Any]) -> list:
    """
    Turn a flat parameter dictionary into ``rclpy`` parameter overrides.

    :param values: ``{name: value}``, e.g. from :func:`load_yaml_params`.
    :return: list of ``rclpy.parameter.Parameter`` for ``Node(parameter_overrides=...)``.
    """
    return [Parameter(name, value=list(value) if isinstance(value, tuple) else value)
            for name, value in flatten(values).items()]


def config_path(robot: str) -> Path:
    """
    Return the path of ``<robot>.yaml``.

    The installed share directory wins when ament knows the package (colcon install);
    otherwise the repository's ``config/`` (source checkout, editable pip install).

    :param robot: robot name, e.g. ``'qube'``.
    :return: the path (it may not exist for a robot without a config file).
    """
    try:
        from ament_index_python.packages import get_package_share_directory
        installed = Path(get_package_share_directory(_PACKAGE)) / 'config' / f'{robot}.yaml'
        if installed.is_file():
            return installed
    except (ImportError, LookupError, ValueError, OSError):
        pass
    return _REPO_CONFIG / f'{robot}.yaml'


@dataclass(frozen=True)
class RobotSelection:
    """
    Which robot a node serves and where its parameter file is.

    :param robot: catalog robot name (``diffsim_ros.robots.names()``).
    :param config_file: parameter file to read defaults from; '' = :func:`config_path`.
    """

    robot: str = field(default='qube', metadata={
        'description': 'robot name from the diffsim_ros catalog (qube, cartpole, wam4, wam7, '
                       'panda, ...); selects config/<robot>.yaml'})
    config_file: str = field(default='', metadata={
        'description': "YAML parameter file with a section per node; '' = the package's "
                       'config/<robot>.yaml'})

    def __post_init__(self) -> None:
        """Reject unknown robots (the message lists the valid names)."""
        robots.get(self.robot)


def declare_robot(node) -> tuple:
    """
    Declare ``robot`` and ``config_file`` and read the node's section of the robot's YAML.

    Nodes call this first, then pass the returned defaults to :func:`declare_config`, so
    ``ros2 run diffsim_ros <node> --ros-args -p robot:=wam7`` picks up ``config/wam7.yaml``
    without a ``--params-file``; explicit parameters still win.

    :param node: the node (its name selects the YAML section).
    :return: ``(robot name, {parameter: value})``; the mapping is empty when the default
        file does not exist.
    :raises ValueError: unknown robot, or an explicit ``config_file`` that does not exist.
    """
    selection = declare_config(node, RobotSelection)
    path = Path(selection.config_file) if selection.config_file else config_path(
        selection.robot)
    if not path.is_file():
        if selection.config_file:
            node.get_logger().error(f'config_file {path} does not exist')
            raise ValueError(f'config_file {path} does not exist')
        return selection.robot, {}
    defaults = load_yaml_params(path, node.get_name())
    for key in ('robot', 'config_file', 'use_sim_time'):
        defaults.pop(key, None)
    return selection.robot, defaults
