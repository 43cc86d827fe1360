"""
What every executable hosting a diffsim_ros node does: start-up checks and interpreter settings.

:func:`run_node` is the body of every node's ``main``.  It answers ``--help`` / ``-h`` with
the node's purpose and parameters without starting anything, and turns a start-up error (a
refused parameter, an unknown parameter name, a malformed ``--ros-args`` or parameter file, a
file that cannot be read, a simulated robot on a domain where another robot's graph runs:
:mod:`.foreign_graph`) into one ``[ERROR]`` log line and exit status 1, not a traceback
(``--ros-args --log-level debug`` adds the traceback at debug level).

The nodes run torch code (solves, refits, rollouts) in executor callbacks and worker threads
while other threads handle messages.  A torch call releases the GIL and must take it back
afterwards; with CPython's default 5 ms switch interval, a thread that wants the GIL back
while another thread holds it waits up to 5 ms, once per torch call.  A baseline solve of a
few hundred small torch calls then took 0.5-3.4 s in the mpc node instead of 6-8 ms
(test/test_node_mpc.py measured it).  A 0.2 ms interval removes that convoy at a
negligible switching cost.

The same callbacks run torch on one intra-op thread (:data:`NODE_TORCH_THREADS`) unless
``OMP_NUM_THREADS`` chooses a number.  The solves and refits are small: a second thread buys
nothing on a quiet machine and, on a busy one, waits at every parallel region for a time
slice.  With two threads beside two busy processes on 2 cores, the MPC solves of
``benchmarks/control.py --quick`` (native backend) took a median of 1.1-80 ms instead of
0.5-0.7 ms with one thread (the node's Qube solve 11-48 ms instead of 1.6-1.9 ms).
"""

import inspect
import os
import re
import sys
import threading
import traceback
from types import TracebackType
from typing import Callable, List, Optional

import rclpy
from rclpy.exceptions import NameValidationException, ParameterException
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
from rclpy.node import Node
from rclpy.utilities import remove_ros_args
import torch
import yaml

from .foreign_graph import ForeignGraphError
from .params import describe_parameters, executable_name, parameter_sections

__all__ = ['NODE_TORCH_THREADS', 'START_UP_ERRORS', 'SWITCH_INTERVAL_S', 'configure_interpreter',
           'node_usage', 'run_node']

#: GIL switch interval the nodes need, s (CPython's default is 0.005).
SWITCH_INTERVAL_S = 2e-4
#: torch intra-op threads of a node's process when ``OMP_NUM_THREADS`` is not set.
NODE_TORCH_THREADS = 1

#: Errors a node's constructor raises for what it was given (parameters, files, names of
#: links or joints that do not exist, a domain where another robot's graph runs): reported
#: as one line.  Anything else is a bug and keeps its traceback.
START_UP_ERRORS = (ValueError, LookupError, OSError, yaml.YAMLError, ParameterException,
                   NameValidationException, _rclpy.RCLError, ForeignGraphError)

#: Exit status of a node refused at start-up, and of unexpected command-line arguments.
EXIT_START_UP_ERROR, EXIT_USAGE = 1, 2


def configure_interpreter() -> None:
    """
    Set the interpreter up for torch in callbacks (see the module).

    Shortens the GIL switch interval to :data:`SWITCH_INTERVAL_S` (never lengthens it) and,
    unless ``OMP_NUM_THREADS`` is set, runs torch on :data:`NODE_TORCH_THREADS` intra-op
    threads.
    """
    if sys.getswitchinterval() > SWITCH_INTERVAL_S:
        sys.setswitchinterval(SWITCH_INTERVAL_S)
    if not os.environ.get('OMP_NUM_THREADS') and torch.get_num_threads() != NODE_TORCH_THREADS:
        torch.set_num_threads(NODE_TORCH_THREADS)


def _summary(node_cls) -> str:
    """Return the summary paragraph of the node module's docstring, and where the rest is."""
    module = sys.modules.get(getattr(node_cls, '__module__', ''))
    text = inspect.cleandoc((module.__doc__ if module else None) or node_cls.__doc__ or '')
    summary = text.split('\n\n')[0].strip()
    if module is not None and summary != text.strip():
        summary += f'\n(The whole description: python3 -m pydoc {module.__name__})'
    return summary


def node_usage(node_cls) -> str:
    """
    Return the ``--help`` text of a node: what it does and every parameter it takes.

    :param node_cls: the node class (its module docstring and :func:`parameter_sections`).
    :return: the text, ending with a newline.
    """
    name = executable_name(node_cls)
    return (f'usage: ros2 run diffsim_ros {name} [-h] [--ros-args -p NAME:=VALUE ... '
            f'--params-file FILE]\n\n{_summary(node_cls)}\n\n'
            'Parameters.  The defaults below are built in; config/<robot>.yaml, selected by '
            '`robot`,\nreplaces them, and -p or --params-file replace both:\n\n'
            f'{describe_parameters(parameter_sections(node_cls))}\n')


def _half_built_nodes(trace: Optional[TracebackType]) -> List[Node]:
    """Return the nodes whose constructor a traceback passes through (``self`` of a frame)."""
    found = []
    while trace is not None:
        candidate = trace.tb_frame.f_locals.get('self')
        if isinstance(candidate, Node) and not any(candidate is n for n in found):
            found.append(candidate)
        trace = trace.tb_next
    return found


def _release(nodes: List[Node]) -> None:
    """
    Destroy half-built nodes before the context does.

    The context destroys every node it tracks at shutdown through the node's own
    ``destroy_node``, which expects a complete node (its worker threads, its timers): on a
    half-built one that raised an AttributeError after the real error.  Their own method is
    tried first (it stops whatever they did start), rclpy's is the fallback.
    """
    for node in nodes:
        try:
            node.destroy_node()
        except Exception:  # noqa: B902 - half-built: rclpy's own teardown still runs
            try:
                Node.destroy_node(node)
            except Exception:  # noqa: B902 - already destroyed, or handles never made
                pass


def _logger(nodes: List[Node], name: str):
    """Return the logger of the first half-built node that has one, else ``name``'s."""
    for node in nodes:
        try:
            return node.get_logger()
        except Exception:  # noqa: B902 - its rclpy constructor failed before the logger
            continue
    return rclpy.logging.get_logger(name)


def run_node(node_factory: Callable[[], Node], args: Optional[List[str]] = None) -> None:
    """
    Run one node until Ctrl-C or shutdown: the body of every executable's ``main``.

    ``-h``/``--help`` (before ``--ros-args``) prints :func:`node_usage` and returns without
    starting ROS.  Other arguments outside ``--ros-args`` are refused (exit status 2: a
    ``name:=value`` there would otherwise be ignored).  A start-up error
    (:data:`START_UP_ERRORS`: a refused or unknown parameter, a malformed ``--ros-args``)
    is logged as one ``[ERROR]`` line and ends the process with status 1.

    A single-threaded executor: the nodes keep their heavy work (refits, MPC solves,
    rollouts) on their own worker threads, and the multi-threaded executor costs ~2.4x the
    CPU per message (``benchmarks/ros_loop.py``).

    :param node_factory: builds the node (after ``rclpy.init``), e.g. the node class; its
        class (or the class it wraps, ``functools.partial``) provides the help text.
    :param args: the command line, program name first (default ``sys.argv``).
    :raises SystemExit: status 1 after a start-up error, 2 after unexpected arguments.
    """
    argv = list(sys.argv if args is None else args)
    node_cls = getattr(node_factory, 'func', node_factory)
    name = executable_name(node_cls)
    try:
        extra = remove_ros_args(argv)[1:]
    except START_UP_ERRORS as error:   # rcl could not parse --ros-args
        rclpy.logging.get_logger(name).error(f'cannot start: {_one_line(error)}')
        raise SystemExit(EXIT_START_UP_ERROR) from None
    if '-h' in extra or '--help' in extra:
        sys.stdout.write(node_usage(node_cls))
        return
    if extra:
        sys.stderr.write(f'{name}: unexpected argument(s) {" ".join(extra)}; parameters go '
                         f'after --ros-args, e.g. {name} --ros-args -p robot:=qube '
                         f'(see {name} --help)\n')
        raise SystemExit(EXIT_USAGE)
    try:
        rclpy.init(args=argv)
    except START_UP_ERRORS as error:
        rclpy.logging.get_logger(name).error(f'cannot start: {_one_line(error)}')
        raise SystemExit(EXIT_START_UP_ERROR) from None
    node, status = None, 0
    try:
        try:
            node = node_factory()
        except BaseException as error:  # noqa: B902 - every case releases the half-built node
            half_built = _half_built_nodes(error.__traceback__)
            if isinstance(error, START_UP_ERRORS):
                logger = _logger(half_built, name)
                logger.error(_one_line(error))
                logger.debug(''.join(traceback.format_exception(error)))
                status = EXIT_START_UP_ERROR
            _release(half_built)
            if not status:
                raise
        else:
            executor = SingleThreadedExecutor()
            executor.add_node(node)
            spun_on = getattr(node, 'spun_on', None)
            if spun_on is not None:   # a node whose real-time thread waits on this one's GIL
                spun_on(threading.get_native_id())
            executor.spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()
    if status:
        raise SystemExit(status)


def _one_line(error: BaseException) -> str:
    """Return an error's message on one line (rcl's messages span several)."""
    message = error.args[0] if isinstance(error, KeyError) and error.args else error
    text = ' '.join(str(message).split()) or type(error).__name__
    # rcl appends the C source locations of its parse errors: of no use to a user
    text = re.sub(r'(, at \S+\.c:\d+)+', '', text)
    if isinstance(error, (ValueError, KeyError, ForeignGraphError)):
        return text
    return f'{type(error).__name__}: {text}'
