"""
Interpreter settings every process hosting diffsim_ros nodes needs.

The nodes run torch code (solves, refits, rollouts) in executor callbacks and worker threads
while other threads handle messages.  A torch call releases the GIL and must take it back
afterwards; with CPython's default 5 ms switch interval, a thread that wants the GIL back
while another thread holds it waits up to 5 ms, once per torch call.  A baseline solve of a
few hundred small torch calls then took 0.5-3.4 s in the mpc node instead of 6-8 ms
(test/test_node_mpc.py measured it).  A 0.2 ms interval removes that convoy at a
negligible switching cost.
"""

import sys
from typing import Callable, List, Optional

import rclpy
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.node import Node

__all__ = ['SWITCH_INTERVAL_S', 'configure_interpreter', 'run_node']

#: GIL switch interval the nodes need, s (CPython's default is 0.005).
SWITCH_INTERVAL_S = 2e-4


def configure_interpreter() -> None:
    """Shorten the GIL switch interval to :data:`SWITCH_INTERVAL_S` (never lengthen it)."""
    if sys.getswitchinterval() > SWITCH_INTERVAL_S:
        sys.setswitchinterval(SWITCH_INTERVAL_S)


def run_node(node_factory: Callable[[], Node], args: Optional[List[str]] = None) -> None:
    """
    Run one node until Ctrl-C or shutdown: the body of every executable's ``main``.

    A single-threaded executor: the nodes keep their heavy work (refits, MPC solves,
    rollouts) on their own worker threads, and the multi-threaded executor costs ~2.4x the
    CPU per message (``benchmarks/ros_loop.py``).

    :param node_factory: builds the node (after ``rclpy.init``), e.g. the node class.
    :param args: command-line arguments for ``rclpy.init`` (ROS arguments included).
    """
    rclpy.init(args=args)
    node = None
    try:
        node = node_factory()
        executor = SingleThreadedExecutor()
        executor.add_node(node)
        executor.spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()
