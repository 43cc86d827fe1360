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
import difflib
import inspect
import math
from pathlib import Path
import re
import sys
import textwrap
import typing
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor
from rclpy.exceptions import InvalidParameterTypeException, InvalidParameterValueException
from rclpy.exceptions import ParameterException
from rclpy.parameter import Parameter
import yaml

from .. import robots

__all__ = ['ParameterError', 'meta', 'RobotSelection', 'build_config',
           'check_unknown_parameters', 'config_path', 'declare_config', 'declare_robot',
           'describe_parameters', 'docstring_params',
           'executable_name', 'flatten', 'load_yaml_params', 'parameter_overrides',
           'parameter_sections']

_PACKAGE = 'diffsim_ros'
_REPO_CONFIG = Path(__file__).resolve().parent.parent.parent / 'config'

_SCALARS = {bool: Parameter.Type.BOOL, int: Parameter.Type.INTEGER,
            float: Parameter.Type.DOUBLE, str: Parameter.Type.STRING}
_ARRAYS = {bool: Parameter.Type.BOOL_ARRAY, int: Parameter.Type.INTEGER_ARRAY,
           float: Parameter.Type.DOUBLE_ARRAY, str: Parameter.Type.STRING_ARRAY}
_TYPE_NAMES = {Parameter.Type.BOOL: 'bool', Parameter.Type.INTEGER: 'integer',
               Parameter.Type.DOUBLE: 'double', Parameter.Type.STRING: 'string',
               Parameter.Type.BOOL_ARRAY: 'bool[]', Parameter.Type.INTEGER_ARRAY: 'integer[]',
               Parameter.Type.DOUBLE_ARRAY: 'double[]', Parameter.Type.STRING_ARRAY: 'string[]'}
#: Marks a mapping field: a STRING parameter holding YAML (flow style) text.
_MAPPING = 'mapping'


def meta(description: str, **extra: Any) -> Dict[str, Any]:
    """
    Return the metadata of a node config field: its description and optional range.

    :param description: what the parameter means, with its unit (``--help``, descriptors).
    :param extra: ``range=(low, high)``, inclusive, None for an open side.
    :return: the ``dataclasses.field(metadata=...)`` mapping.
    """
    return {'description': description, **extra}


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


def _check_type(value: Any, annotation) -> Any:
    """Return ``value`` if it has the field's type (after :func:`_coerce`), else raise."""
    _, element = _parameter_type(annotation)
    if value is None or element == _MAPPING:
        return value
    expected = annotation if element is None else element
    items = (value,) if element is None else value
    for item in items:
        if not isinstance(item, expected) or (expected is int and isinstance(item, bool)):
            kind = expected.__name__ if element is None else f'list of {expected.__name__}'
            raise ValueError(f'must be a {kind}')
    return value


class ParameterError(ValueError):
    """
    A parameter a node refuses at start-up: its name, the value given and why.

    :param name: full parameter name (``'diffnea.lr'``), or the config section when the
        dataclass's message names none of its fields.
    :param value: the value given (None when there is none to show).
    :param reason: what is allowed, e.g. ``'must lie in [0, 10000]'``.
    """

    def __init__(self, name: str, value: Any, reason: str) -> None:
        """Store the parts and build the one-line message."""
        self.name, self.value, self.reason = name, value, reason
        shown = '' if value is None else f' = {value!r}'
        super().__init__(f'parameter {name!r}{shown} refused: {reason}')


#: Parameters every rclpy node may be given besides its own (QoS overrides of its topics).
_ROS_PREFIXES = ('qos_overrides.',)


def _kind(ptype, element) -> str:
    """Return ``'an integer'``-style text of a parameter type, for error messages."""
    if element == _MAPPING:
        return 'YAML mapping text such as "{a: 1}"'
    name = _TYPE_NAMES[ptype]
    if name.endswith('[]'):
        return f'a list of {name[:-2]} values'
    return f'an {name}' if name[0] in 'aeiou' else f'a {name}'


def _field_range(item: dataclasses.Field, config_cls) -> Optional[tuple]:
    """Return a field's ``metadata['range']`` as ``(low, high)`` (None = open), or None."""
    bounds = item.metadata.get('range')
    if bounds is None:
        return None
    if len(bounds) != 2 or any(b is not None and not isinstance(b, (int, float))
                               for b in bounds):
        raise TypeError(f'{config_cls.__name__}.{item.name}: range must be (low, high), '
                        f'got {bounds!r}')
    return tuple(bounds)


def _range_text(bounds: tuple) -> str:
    """Return ``'in [0, 10000]'``-style text of a range (open sides as >= / <=)."""
    low, high = bounds
    if low is None:
        return f'<= {high}'
    if high is None:
        return f'>= {low}'
    return f'in [{low}, {high}]'


def _describe_range(descriptor: ParameterDescriptor, ptype, bounds: Optional[tuple]) -> None:
    """Put a field's range into its descriptor (scalars; ROS ranges are closed)."""
    if bounds is None:
        return
    low, high = bounds
    if ptype == Parameter.Type.DOUBLE:
        descriptor.floating_point_range = [FloatingPointRange(
            from_value=-math.inf if low is None else float(low),
            to_value=math.inf if high is None else float(high), step=0.0)]
    elif ptype == Parameter.Type.INTEGER:
        descriptor.integer_range = [IntegerRange(
            from_value=-(1 << 63) if low is None else int(low),
            to_value=(1 << 63) - 1 if high is None else int(high), step=0)]


def _check_range(value: Any, bounds: Optional[tuple]) -> None:
    """Raise ValueError if a value (or an element of a list) lies outside its range."""
    if bounds is None or value is None:
        return
    low, high = bounds
    for item in value if isinstance(value, tuple) else (value,):
        if isinstance(item, (int, float)) and not (
                (low is None or item >= low) and (high is None or item <= high)):
            raise ValueError(f'must lie {_range_text(bounds)}')


def _parameter_overrides(node) -> Dict[str, Any]:
    """Return ``{name: value}`` of the overrides that reach a node (CLI, files, kwargs)."""
    # rclpy keeps them in Node._parameter_overrides (Foxy to Kilted) and offers no public
    # accessor; they are what --ros-args -p / --params-file gave for this node's name.
    return {name: parameter.value
            for name, parameter in getattr(node, '_parameter_overrides', {}).items()}


def _given_value(node, name: str, default: Any) -> Any:
    """Return the value a parameter was given: its override, else ``default``."""
    overrides = _parameter_overrides(node)
    if name in overrides:
        return overrides[name]
    return None if default is dataclasses.MISSING else default


def _reason(error: Exception) -> str:
    """Return an error's message without a trailing ``', got <value>'`` (shown already)."""
    text = str(error).strip()
    stripped = re.sub(r',? got .*$', '', text, flags=re.S).strip()
    return stripped or text


def _named_field(message: str, names: Iterable[str]) -> Optional[str]:
    """Return the first of ``names`` that a message mentions as a word, or None."""
    names = set(names)
    for word in re.findall(r'[A-Za-z_]\w*', message):
        if word in names:
            return word
    return None


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
    ``:param f:`` text), which is read-only unless ``field.metadata['read_only']`` is
    False, and which carries ``field.metadata['range'] = (low, high)`` (inclusive; None for
    an open side) as its floating-point or integer range.  Types: ``bool``, ``int``,
    ``float``, ``str``, ``tuple[X, ...]`` of those, and mappings, which are STRING
    parameters holding YAML text (``'{gear_efficiency: 1.0}'``; in ``defaults`` a nested
    mapping works too).  Values come, in order of precedence, from the node's parameter
    overrides (``--ros-args -p``/``--params-file``, ``parameter_overrides``), ``defaults``
    (e.g. :func:`load_yaml_params` of ``config/<robot>.yaml``), the dataclass default.
    Fields with ``metadata['ros'] = False`` are not declared.

    :param node: the ``rclpy.node.Node`` declaring the parameters.
    :param config_cls: a dataclass type whose ``__post_init__`` validates the values.
    :param prefix: parameter-name prefix, e.g. ``'diffnea.'``.
    :param defaults: values by parameter name (with prefix) that replace dataclass defaults.
    :param skip_unsupported: leave fields of other types (with defaults) undeclared, at
        their defaults, instead of raising (for configs defined outside the nodes).
    :return: the validated ``config_cls`` instance.
    :raises ParameterError: a value of the wrong type or out of its range, a required
        parameter without a value, or a config the dataclass rejects (named after the
        field its message names first).  Nothing is logged: the caller reports it once
        (:func:`diffsim_ros.nodes.runtime.run_node` logs one error line).
    :raises TypeError: a field whose annotation has no ROS parameter type.
    """
    defaults = dict(defaults or {})
    hints = typing.get_type_hints(config_cls)
    documented = docstring_params(config_cls)
    values = {}
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
        bounds = _field_range(item, config_cls)
        default = defaults.get(name, dataclasses.MISSING)
        if default is dataclasses.MISSING and element == _MAPPING:
            default = _mapping_default(defaults, name)
        if default is dataclasses.MISSING:
            default = _field_default(item)
        given = _given_value(node, name, default)
        try:
            if default is not dataclasses.MISSING and default is not None:
                default = _coerce(default, annotation)
            # YAML writes 1 for 1.0: floats accept integers (checked by _check_type below).
            floating = ptype in (Parameter.Type.DOUBLE, Parameter.Type.DOUBLE_ARRAY)
            descriptor = ParameterDescriptor(
                name=name, type=Parameter.Type.NOT_SET.value if floating else ptype.value,
                description=str(item.metadata.get('description', documented.get(item.name, ''))),
                read_only=bool(item.metadata.get('read_only', True)),
                dynamic_typing=floating)
            _describe_range(descriptor, ptype, bounds)
            stored = None if default is dataclasses.MISSING else _to_parameter_value(
                default, annotation)
            if stored is None or stored == []:
                # rclpy infers a byte array from an empty list: declare by type instead
                # (dynamically typed parameters are declared unset).
                stored = None if floating else ptype
            value = node.declare_parameter(name, stored, descriptor).value
            if value is None:
                if default is dataclasses.MISSING:
                    raise ValueError('required, and no value was given')
                value = default
            value = _check_type(_coerce(value, annotation), annotation)
            _check_range(value, bounds)
        except InvalidParameterTypeException:
            raise ParameterError(name, given, f'must be {_kind(ptype, element)}') from None
        except InvalidParameterValueException as error:
            raise ParameterError(name, given, f'must lie {_range_text(bounds)}' if bounds
                                 else _reason(error)) from None
        except (ValueError, ParameterException, yaml.YAMLError) as error:
            raise ParameterError(name, given, _reason(error)) from None
        values[item.name] = value
    try:
        return config_cls(**values)
    except ValueError as error:
        field_name = _named_field(str(error), values)
        if field_name is None:
            raise ParameterError(prefix.rstrip('.') or config_cls.__name__, None,
                                 _reason(error)) from None
        raise ParameterError(prefix + field_name, values[field_name], _reason(error)) from None


def build_config(config_cls, values: Mapping[str, Any], prefix: str = '',
                 skip_unsupported: bool = False):
    """
    Build a config dataclass from parameter values the way :func:`declare_config` does.

    No node is needed: tools run a node's loop offline with it (``diffsim-sim-eval``).

    :param config_cls: a dataclass type whose ``__post_init__`` validates the values.
    :param values: values by parameter name (with prefix), e.g. :func:`load_yaml_params`;
        names of other sections are ignored, absent fields take their dataclass default.
    :param prefix: parameter-name prefix, e.g. ``'diffnea.'``.
    :param skip_unsupported: leave fields without a ROS parameter type at their defaults.
    :return: the validated ``config_cls`` instance.
    :raises ParameterError: a value of the wrong type, out of its range or refused.
    """
    hints = typing.get_type_hints(config_cls)
    built = {}
    for item in dataclasses.fields(config_cls):
        if not item.init or not item.metadata.get('ros', True):
            continue
        name = prefix + item.name
        try:
            _, element = _parameter_type(hints[item.name])
        except TypeError:
            if skip_unsupported and _field_default(item) is not dataclasses.MISSING:
                continue
            raise
        value = values.get(name, dataclasses.MISSING)
        if value is dataclasses.MISSING and element == _MAPPING:
            value = _mapping_default(values, name)
        if value is dataclasses.MISSING:
            continue   # the dataclass default
        try:
            value = _check_type(_coerce(value, hints[item.name]), hints[item.name])
            _check_range(value, _field_range(item, config_cls))
        except (ValueError, yaml.YAMLError) as error:
            raise ParameterError(name, value, _reason(error)) from None
        built[item.name] = value
    try:
        return config_cls(**built)
    except ValueError as error:
        field_name = _named_field(str(error), built)
        raise ParameterError(prefix + field_name if field_name else
                             prefix.rstrip('.') or config_cls.__name__,
                             built.get(field_name), _reason(error)) from None


def parameter_sections(node_cls) -> List[Tuple[str, type]]:
    """
    Return the ``(prefix, config dataclass)`` sections of a node class's parameters.

    A node class maps prefixes to config dataclasses in ``PARAMETERS`` (``{'': MpcConfig}``;
    the identifier adds one section per estimator, ``'diffnea.': DiffNEAConfig``); without
    it, the ``*Config`` dataclasses its module defines are taken at prefix ``''``; a
    subclass without either has its base class's.
    :class:`RobotSelection` (``robot``, ``config_file``), declared by every node through
    :func:`declare_robot`, always comes first.

    :param node_cls: a node class, e.g. ``MpcNode``.
    :return: the sections; only :class:`RobotSelection` for a class that has none.
    """
    found = []
    for cls in getattr(node_cls, '__mro__', (node_cls,)):   # a subclass has its base's
        if 'PARAMETERS' in vars(cls):
            found = [(str(prefix), config_cls) for prefix, config_cls in cls.PARAMETERS.items()]
            break
        module = sys.modules.get(getattr(cls, '__module__', ''))
        found = [('', value) for value in vars(module).values()
                 if isinstance(value, type) and dataclasses.is_dataclass(value)
                 and value.__module__ == module.__name__ and value.__name__.endswith('Config')
                 ] if module is not None else []
        if found:
            break
    return [('', RobotSelection)] + [item for item in found if item[1] is not RobotSelection]


def _section_fields(sections: Iterable[Tuple[str, type]]) -> Dict[str, tuple]:
    """Return ``{parameter name: (field, annotation)}`` of the ROS-typed fields of sections."""
    found = {}
    for prefix, config_cls in sections:
        hints = typing.get_type_hints(config_cls)
        for item in dataclasses.fields(config_cls):
            if not item.init or not item.metadata.get('ros', True):
                continue
            try:
                _parameter_type(hints[item.name])
            except TypeError:
                continue   # declare_config(skip_unsupported=True) leaves it undeclared
            found.setdefault(prefix + item.name, (item, hints[item.name], config_cls))
    return found


def executable_name(node_cls) -> str:
    """
    Return the executable of a node class: its module's name (``nodes/mpc.py`` -> ``mpc``).

    :param node_cls: a node class.
    :return: the name ``ros2 run diffsim_ros <name>`` starts.
    """
    return str(getattr(node_cls, '__module__', 'node')).rsplit('.', 1)[-1]


def check_unknown_parameters(node, given: Mapping[str, Any],
                             sections: Iterable[Tuple[str, type]]) -> None:
    """
    Refuse parameter names that none of a node's sections declares.

    Known are the sections' fields, what the node has declared already (``use_sim_time``)
    and ROS's own ``qos_overrides.*``.

    :param node: the node.
    :param given: ``{name: value}`` the node was given (overrides and its YAML section).
    :param sections: :func:`parameter_sections` of the node's class.
    :raises ParameterError: for the first unknown name (sorted), with the closest valid
        names.
    """
    known = set(_section_fields(sections))
    unknown = sorted(name for name in given if name not in known
                     and not node.has_parameter(name) and not name.startswith(_ROS_PREFIXES))
    if not unknown:
        return
    name = unknown[0]
    close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.6)
    reason = f'the {node.get_name()} node has no such parameter'
    if close:
        reason += f' (did you mean {", ".join(close)}?)'
    if len(unknown) > 1:
        reason += f'; also unknown: {", ".join(unknown[1:])}'
    reason += f'; `{executable_name(type(node))} --help` lists the valid ones'
    raise ParameterError(name, given[name], reason)


def describe_parameters(sections: Iterable[Tuple[str, type]], width: int = 92) -> str:
    """
    Return a node's parameters as help text: name, type, default, range and description.

    :param sections: :func:`parameter_sections` of the node's class.
    :param width: line width of the wrapped descriptions.
    :return: one entry per parameter, in declaration order.
    """
    lines, section = [], ''
    for name, (item, annotation, config_cls) in _section_fields(sections).items():
        prefix = name[:name.rindex('.') + 1] if '.' in name else ''
        if prefix != section:
            summary = (inspect.getdoc(config_cls) or config_cls.__name__).split('\n')[0]
            lines += ['', f'{prefix}*: {summary}']
            section = prefix
        ptype, element = _parameter_type(annotation)
        kind = 'string (YAML mapping)' if element == _MAPPING else _TYPE_NAMES[ptype]
        default = _field_default(item)
        if default is dataclasses.MISSING:
            shown = 'required'
        else:
            stored = _to_parameter_value(default, annotation)
            shown = 'default ' + (str(stored).lower() if isinstance(stored, bool)
                                  else repr(stored))
        bounds = _field_range(item, config_cls)
        extra = '' if bounds is None else f', {_range_text(bounds)}'
        lines.append(f'  {name} ({kind}, {shown}{extra})')
        text = str(item.metadata.get('description',
                                     docstring_params(config_cls).get(item.name, '')))
        lines.extend(textwrap.wrap(text, width, initial_indent=' ' * 6,
                                   subsequent_indent=' ' * 6) or [])
    return '\n'.join(lines)


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
    :raises ValueError: the file is not a mapping of node sections, or the node's section
        is not a mapping holding a ``ros__parameters`` mapping.
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
            own = str(key).strip('/') == node_name
            if own and not (isinstance(value, Mapping) and isinstance(
                    value.get('ros__parameters', {}) or {}, Mapping)):
                raise ValueError(f'{path}: the {node_name} section must be a mapping holding '
                                 f'ros__parameters: {{name: value}}, got {value!r}')
            if not isinstance(value, Mapping):
                continue
            if own and 'ros__parameters' in value:
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
    Declare ``robot`` and ``config_file``, read the node's section of the robot's YAML.

    Nodes call this first, then pass the returned defaults to :func:`declare_config`, so
    ``ros2 run diffsim_ros <node> --ros-args -p robot:=wam7`` picks up ``config/wam7.yaml``
    without a ``--params-file``; explicit parameters still win.  Before anything else is
    declared (and before a node builds anything expensive), every parameter name the node
    was given, on the command line, in a parameter file or in that YAML section, is
    checked against the sections of the node's class (:func:`parameter_sections`); a class
    without sections (a plain ``rclpy`` node) is not checked.

    :param node: the node (its name selects the YAML section).
    :return: ``(robot name, {parameter: value})``; the mapping is empty when the default
        file does not exist.
    :raises ParameterError: unknown robot, an explicit ``config_file`` that does not exist
        or does not parse, or a parameter name the node does not have.
    """
    selection = declare_config(node, RobotSelection)
    path = Path(selection.config_file) if selection.config_file else config_path(
        selection.robot)
    defaults: Dict[str, Any] = {}
    if path.is_file():
        try:
            defaults = load_yaml_params(path, node.get_name())
        except (OSError, ValueError, yaml.YAMLError) as error:
            raise ParameterError('config_file', str(path),
                                 f'not a ROS 2 parameter file: {_reason(error)}') from None
    elif selection.config_file:
        raise ParameterError('config_file', selection.config_file, 'the file does not exist')
    for key in ('robot', 'config_file', 'use_sim_time'):
        defaults.pop(key, None)
    sections = parameter_sections(type(node))
    if len(sections) > 1:
        check_unknown_parameters(node, {**defaults, **_parameter_overrides(node)}, sections)
    return selection.robot, defaults
