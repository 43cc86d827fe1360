"""The node tests' own isolation: two test runs on one machine never share a DDS domain."""

import os
from pathlib import Path
import subprocess
import sys

import pytest
from ros_helpers import reserved_domain_id

HERE = Path(__file__).resolve().parent
# ids no DDS participant can use (Fast DDS stops at 232), so only the lock files are touched
FIRST, COUNT = 300, 30
# ids of no other range the tests reserve (ros_helpers 1-100, test_node_recorder 101-189,
# test_demo 200-232)
LISTENED = 190


def test_a_domain_another_run_holds_is_never_handed_out():
    # another test run (a subprocess) holds every id of the range but the last one
    holder = subprocess.Popen(
        [sys.executable, '-c', 'import sys; from ros_helpers import reserved_domain_id as r; '
         f'print(sorted(r(d, 1, 0) for d in range({FIRST}, {FIRST + COUNT - 1})), flush=True); '
         'sys.stdin.read()'],
        cwd=HERE, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == str(list(range(FIRST, FIRST + COUNT - 1)))
        domain = reserved_domain_id(FIRST, COUNT, listen_s=0)
        assert domain == FIRST + COUNT - 1
        assert reserved_domain_id(FIRST, COUNT, listen_s=0) == domain   # held for the run
        with pytest.raises(RuntimeError, match='held by another test run'):
            reserved_domain_id(FIRST, 1, listen_s=0)
    finally:
        holder.communicate('', timeout=10.0)
    # once the other run has exited, its ids are free again
    assert reserved_domain_id(FIRST, 1, listen_s=0) == FIRST


def test_a_domain_where_another_container_runs_a_graph_is_never_handed_out(tmp_path):
    # another container's test run on this host: a temporary directory of its own (no lock
    # file to meet), pids of its own, the same loopback DDS; its driver is on the first id
    script = ('import sys, rclpy; from rclpy.context import Context; c = Context(); '
              f'rclpy.init(context=c, domain_id={LISTENED}); '
              "node = rclpy.create_node('sim_driver', context=c); "
              "print('up', flush=True); sys.stdin.read()")
    other = subprocess.Popen(
        [sys.executable, '-c', script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env=dict(os.environ, TMPDIR=str(tmp_path), ROS_AUTOMATIC_DISCOVERY_RANGE='LOCALHOST'))
    try:
        assert other.stdout.readline().strip() == 'up'
        with pytest.raises(RuntimeError, match=rf'has nodes on it: .*nodes on \[{LISTENED}\]'):
            reserved_domain_id(LISTENED, 1)
        # the next id is quiet: it is ours, and our claim keeps the other run off it
        assert reserved_domain_id(LISTENED, 2) == LISTENED + 1
        probe = subprocess.run(
            [sys.executable, '-c', 'from diffsim_ros.nodes.foreign_graph import '
             f'claim_quiet_domain as c; print(c({LISTENED + 1}) is None)'],
            capture_output=True, text=True, timeout=60.0,
            env=dict(os.environ, TMPDIR=str(tmp_path), ROS_AUTOMATIC_DISCOVERY_RANGE='LOCALHOST'))
        assert probe.stdout.strip() == 'True', probe.stderr
    finally:
        other.communicate('', timeout=10.0)
