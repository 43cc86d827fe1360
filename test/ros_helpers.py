"""
Helpers for tests that run real rclpy nodes over DDS on loopback.

Fixtures (load them in a test module with ``pytest_plugins = ['ros_helpers']``; importing
them by name would trip flake8's F811 at every test that takes one):

* ``ros_domain`` (session): an isolated ``ROS_DOMAIN_ID`` (:func:`reserved_domain_id`: no
  other test run on this machine, in this container or another, holds or uses it), set in
  the environment before any context starts, with discovery limited to localhost;
* ``ros_context``: a fresh ``rclpy`` context on that domain, shut down after the test;
* ``executor``: a multi-threaded executor of that context spinning in a background thread;
  add nodes with ``executor.add_node(node)``; nodes are destroyed after the test.

:func:`wait_for` polls a predicate until it holds or a timeout passes; :func:`settled` waits
for a counter to stop changing; :func:`call` calls a service.  (PYTEST_DONT_REWRITE:
the module has no asserts, and test modules import it before pytest loads it as a plugin.)
"""

import fcntl
import os
import tempfile
import threading
import time
from types import SimpleNamespace

from diffsim_ros.nodes.foreign_graph import (claim_a_quiet_domain, FOREIGN_PROBE_S,
                                             ForeignGraphError)
import pytest
import rclpy
from rclpy.context import Context
from rclpy.executors import MultiThreadedExecutor


#: What this process holds, by ``(first, count)`` range: ``(domain, lock file, claim)``.
_RESERVED = {}


def reserved_domain_id(first: int = 1, count: int = 100,
                       listen_s: float = FOREIGN_PROBE_S) -> int:
    """
    Return a DDS domain id in ``[first, first + count)`` that no other test run uses.

    Two test runs on one machine share loopback DDS: on one domain they hear each other's
    ``joint_states`` and commands, and a node test reads another run's robot (a monitor
    NMSE of 6 where 0.1 was due; a simulated driver refusing to start beside another
    run's ``/sim_driver``).  Two guards, both held until this process exits:

    * an exclusive ``flock`` on a file in the temporary directory, for the runs that share
      it (a CI clone beside a developer's run, two worktrees);
    * a claim (:func:`~diffsim_ros.nodes.foreign_graph.claim_a_quiet_domain`, ids in a
      random order): a node of ours listens on the id for ``listen_s`` and stays there,
      for the runs that do not (another container on the host: its own ``/tmp``, its own
      pids, the same loopback).

    The same range asked twice returns the same id.  Fast DDS port arithmetic stays valid
    up to 232.

    :param first: lowest id of the range.
    :param count: ids in the range.
    :param listen_s: how long to listen for other nodes on an id [s]; 0 = the lock only
        (for ids no participant can use).
    :return: the reserved id.
    :raises RuntimeError: when other runs hold or use every id of the range.
    """
    key = (first, count)
    if key in _RESERVED:
        return _RESERVED[key][0]
    handles = {}

    def lock(domain: int) -> bool:
        path = os.path.join(tempfile.gettempdir(), f'diffsim_ros_dds_domain_{domain}.lock')
        handle = open(path, 'a')
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            return False
        handles[domain] = handle
        return True

    ids = range(first, first + count)
    if listen_s > 0:
        try:
            claim = _claim(ids, listen_s, lock)
        except ForeignGraphError as error:
            for handle in handles.values():
                handle.close()
            raise RuntimeError(f'every DDS domain id in [{first}, {first + count}) is held by '
                               f'another test run on this machine or has nodes on it: {error}'
                               ) from error
        domain = claim.domain
    else:
        claim, domain = None, next((d for d in ids if lock(d)), None)
        if domain is None:
            raise RuntimeError(f'every DDS domain id in [{first}, {first + count}) is held by '
                               'another test run on this machine')
    for other, handle in handles.items():
        if other != domain:
            handle.close()
    _RESERVED[key] = (domain, handles[domain], claim)
    return domain


def _claim(ids, listen_s: float, admit):
    """Claim one of ``ids`` with the discovery range the node tests use (localhost)."""
    saved = os.environ.get('ROS_AUTOMATIC_DISCOVERY_RANGE')
    os.environ['ROS_AUTOMATIC_DISCOVERY_RANGE'] = 'LOCALHOST'
    try:
        return claim_a_quiet_domain(ids, listen_s, 'test_run', admit)
    finally:
        if saved is None:
            os.environ.pop('ROS_AUTOMATIC_DISCOVERY_RANGE')
        else:
            os.environ['ROS_AUTOMATIC_DISCOVERY_RANGE'] = saved


def realtime_process(priority: int = 40) -> None:
    """
    Ask for ``SCHED_FIFO`` before any thread exists: DDS threads inherit it.

    For the spawned processes that play a robot's driver or record its commands in node
    tests: a test process's thread at normal priority paused 0.1-0.4 s on a loaded machine,
    which a robot's driver does not. Without the permission (not root, no rtprio) it stays
    at normal priority.

    :param priority: ``SCHED_FIFO`` priority (the mpc's command thread runs at 50).
    """
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except (AttributeError, OSError):
        pass


def wait_for(predicate, timeout: float = 5.0, period: float = 0.01) -> bool:
    """
    Poll ``predicate`` until it returns a truthy value or ``timeout`` seconds pass.

    :param predicate: callable with no arguments.
    :param timeout: wall-clock limit, s.
    :param period: sleep between polls, s.
    :return: True when the predicate held before the timeout.
    """
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(period)


def settled(read, quiet: float = 1.0, timeout: float = 30.0, period: float = 0.05):
    """
    Return ``read()`` once its value has not changed for ``quiet`` seconds.

    For counters fed by best-effort topics: wait until the last message was counted.

    :param read: callable with no arguments returning a comparable value.
    :param quiet: seconds without change, s.
    :param timeout: wall-clock limit, s.
    :param period: sleep between reads, s.
    :return: the settled value.
    :raises AssertionError: when the value still changes after ``timeout``.
    """
    deadline = time.monotonic() + timeout
    value, since = read(), time.monotonic()
    while time.monotonic() - since < quiet:
        assert time.monotonic() < deadline, f'still changing after {timeout} s: {value}'
        time.sleep(period)
        now = read()
        if now != value:
            value, since = now, time.monotonic()
    return value


def call(node, kind, name: str, request, timeout: float = 10.0):
    """
    Call a service from ``node`` (spun by an executor) and return its response.

    :param node: the calling node.
    :param kind: the service type, e.g. ``std_srvs.srv.Trigger``.
    :param name: the service name.
    :param request: the request.
    :param timeout: wall-clock limit for the service to appear and for the answer, s.
    :return: the response.
    :raises AssertionError: no service or no answer within ``timeout``.
    """
    client = node.create_client(kind, name)
    if not client.wait_for_service(timeout_sec=timeout):
        raise AssertionError(f'no service {name} after {timeout} s')
    future = client.call_async(request)
    if not wait_for(future.done, timeout):
        raise AssertionError(f'no answer from {name} after {timeout} s')
    return future.result()


@pytest.fixture(scope='session')
def ros_domain():
    """Isolate this test run on its own DDS domain, restoring the environment afterwards."""
    saved = {key: os.environ.get(key)
             for key in ('ROS_DOMAIN_ID', 'ROS_AUTOMATIC_DISCOVERY_RANGE')}
    domain = reserved_domain_id()
    os.environ['ROS_DOMAIN_ID'] = str(domain)
    os.environ['ROS_AUTOMATIC_DISCOVERY_RANGE'] = 'LOCALHOST'
    yield domain
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def ros_context(ros_domain):
    """Start a fresh rclpy context on the test domain and shut it down afterwards."""
    context = Context()
    rclpy.init(context=context, domain_id=ros_domain)
    yield context
    if context.ok():
        rclpy.shutdown(context=context)


class SpinningExecutor:
    """A multi-threaded executor spinning in a daemon thread; it owns the nodes it gets."""

    def __init__(self, context: Context, threads: int = 4) -> None:
        """Start spinning at once on ``context``."""
        self.executor = MultiThreadedExecutor(num_threads=threads, context=context)
        self.nodes = []
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        """Spin until the executor or its context shuts down."""
        try:
            self.executor.spin()
        except Exception:  # noqa: BLE001 - an ExternalShutdownException ends the thread
            pass

    def add_node(self, node):
        """Add ``node`` to the executor; return it for chaining."""
        self.nodes.append(node)
        self.executor.add_node(node)
        self.executor.wake()
        return node

    def shutdown(self) -> None:
        """Stop spinning, then destroy the nodes."""
        self.executor.shutdown(timeout_sec=5.0)
        self._thread.join(timeout=5.0)
        for node in self.nodes:
            destroy = getattr(node, 'close', None) or node.destroy_node
            destroy()


@pytest.fixture
def executor(ros_context):
    """Provide a :class:`SpinningExecutor` on the test's context."""
    spinning = SpinningExecutor(ros_context)
    yield spinning
    spinning.shutdown()


def own_endpoints(node, topic, kind):
    """
    Return ``(type name, QoS)`` of ``node``'s own publishers or subscriptions on ``topic``.

    Asked of the node, not of the DDS graph, which may list a destroyed node of an earlier
    test (same name, same domain) for a while: discovery forgets endpoints lazily.
    """
    entities = node.publishers if kind == 'publishers' else node.subscriptions
    return [SimpleNamespace(topic_type=_type_name(e.msg_type), qos_profile=e.qos_profile)
            for e in entities if e.topic_name == topic]


def _type_name(cls):
    package, _, _ = cls.__module__.partition('.')
    return f'{package}/msg/{cls.__name__}'
