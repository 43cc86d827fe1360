"""
The nodes over real DDS: identifier ingest at 1 kHz, and joint_states -> command latency.

Two measurements, each on an isolated ``ROS_DOMAIN_ID`` (discovery limited to localhost),
with the node under test in this process and the robot side in a separate process (spawned,
so that it does not share the GIL with the node):

* **ingest**: a publisher sends ``sensor_msgs/JointState`` for the Panda (7 joints, header
  stamps ``k / 1000`` s, positions, velocities and inverse-dynamics efforts of a periodic
  excitation) at 1 kHz with the sensor-data QoS, for ``--duration`` s, to an
  ``identifier`` node (robot ``panda``, its ``config/panda.yaml`` settings, refits running).
  A probe subclass of :class:`~diffsim_ros.nodes.identifier.Identifier` counts the
  messages its callback receives and times each call; accepted = appended to the window.
  Drops = sent - received, plus the node's own drops.  The RSS of this process is sampled
  every few seconds; its slope after warm-up (least squares, MB/min) and its maximum are
  reported.
* **latency**: a fake Qube publishes ``joint_states`` at 500 Hz (stamp = send time) and
  receives ``/effort_controller/commands`` from an ``mpc`` node (``baseline`` and ``ilqr``).
  A probe subclass records which state stamp each command was computed from and tags the
  command (``layout.data_offset``, ignored by ros2_control).  Latency of a joint state =
  receive time of the first command computed from it or a newer state, minus its send
  time (one clock, ``time.time``, in the robot process).  The command timer period
  (``1 / command_rate``) is the floor of its average: a state waits up to one period.

Run ``python benchmarks/ros_loop.py [--quick] [--duration S] [--json PATH] [--threads N]``.
"""

import math
import multiprocessing
import os
import sys
import threading
import time
from typing import Any, Dict, List, Optional

import numpy as np

try:
    from benchmarks import _common
except ImportError:  # run as a script: benchmarks/ is not a package on the path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks import _common

fmt_number, format_table, Target = _common.fmt_number, _common.format_table, _common.Target

INGEST_RATE_HZ = 1000.0
QUBE_RATE_HZ = 500.0
PANDA_READY = (0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785)
#: Receive gaps longer than this (s) count as stalls of the node's executor.
STALL_S = 0.005
#: Callback durations kept for percentiles (a preallocated ring, so RSS is not skewed).
RING = 50000
#: The claim on this run's domain (:func:`isolate_domain`), held until the process exits.
_CLAIMS = []


def rss_mb() -> float:
    """
    Return this process's resident set size, MB (``/proc/self/status`` ``VmRSS``).

    :return: RSS in MB (1e6 bytes), NaN where ``/proc`` is unavailable.
    """
    try:
        with open('/proc/self/status', encoding='ascii') as status:
            for line in status:
                if line.startswith('VmRSS:'):
                    return int(line.split()[1]) * 1024 / 1e6
    except OSError:
        pass
    return math.nan


def isolate_domain() -> int:
    """
    Put this process (and the processes it spawns) on a DDS domain no one else uses.

    A random id in ``[101, 200]`` (tests reserve ``[1, 100]`` first) that a claim
    (:func:`~diffsim_ros.nodes.foreign_graph.claim_quiet_domain`) found quiet; the claim's
    node (idle, no endpoints of the measured topics) stays for the run, so that another run
    on the host keeps off it.

    :return: the domain id.
    :raises SystemExit: when every id of the range has nodes on it.
    """
    from diffsim_ros.nodes.foreign_graph import claim_a_quiet_domain, ForeignGraphError

    os.environ['ROS_AUTOMATIC_DISCOVERY_RANGE'] = 'LOCALHOST'
    try:
        claim = claim_a_quiet_domain(range(101, 201), name='ros_loop')
    except ForeignGraphError as error:
        raise SystemExit(f'ros_loop: {error}') from error
    _CLAIMS.append(claim)
    os.environ['ROS_DOMAIN_ID'] = str(claim.domain)
    return claim.domain


def percentile(values, q: float) -> Optional[float]:
    """
    Return the ``q``-th percentile of finite values, or None when there are none.

    :param values: numbers.
    :param q: percentile in [0, 100].
    :return: the percentile or None.
    """
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    return float(np.percentile(values, q)) if values.size else None


# -- robot side (child processes: rclpy only, no torch) -----------------------------------
def _start_ros(domain: int, name: str):
    import rclpy
    from rclpy.context import Context
    context = Context()
    rclpy.init(context=context, domain_id=domain)
    return rclpy, context, rclpy.create_node(name, context=context)


def _wait(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _sleep_until(deadline: float) -> None:
    delay = deadline - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def publish_joint_states(domain: int, names: List[str], samples: Dict[str, np.ndarray],
                         rate_hz: float, duration: float, conn) -> None:
    """
    Child process: publish a periodic trajectory as JointState at ``rate_hz``.

    Stamps are the sample times ``k / rate_hz`` (from 1000 s on); a late loop catches up
    without skipping samples.  Sends ``{'sent', 'late_max_ms', 'late_1ms', 'wall_s'}``.

    :param domain: ROS domain id.
    :param names: joint names.
    :param samples: ``q``, ``qd``, ``effort`` arrays ``(P, n)``, repeated periodically.
    :param rate_hz: publishing rate.
    :param duration: seconds to publish.
    :param conn: pipe end to the parent.
    """
    from rclpy.qos import qos_profile_sensor_data
    from sensor_msgs.msg import JointState
    rclpy, context, node = _start_ros(domain, 'ingest_publisher')
    pub = node.create_publisher(JointState, 'joint_states', qos_profile_sensor_data)
    matched = _wait(lambda: pub.get_subscription_count() > 0, 30.0)
    conn.send({'ready': matched})
    q, qd, effort = (samples[key].tolist() for key in ('q', 'qd', 'effort'))
    count, period = int(round(duration * rate_hz)), 1.0 / rate_hz
    late_max, late_1ms = 0.0, 0
    start = time.monotonic()
    for k in range(count):
        deadline = start + k * period
        _sleep_until(deadline)
        late = time.monotonic() - deadline
        late_max, late_1ms = max(late_max, late), late_1ms + (late > 1e-3)
        msg = JointState(name=names)
        stamp_ns = 1_000_000_000_000 + k * int(round(1e9 * period))
        msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(stamp_ns, 1_000_000_000)
        i = k % len(q)
        msg.position, msg.velocity, msg.effort = q[i], qd[i], effort[i]
        pub.publish(msg)
    wall = time.monotonic() - start
    conn.send({'sent': count, 'late_max_ms': 1e3 * late_max, 'late_1ms': late_1ms,
               'wall_s': wall})
    node.destroy_node()
    rclpy.shutdown(context=context)


def fake_qube(domain: int, names: List[str], rate_hz: float, duration: float, conn) -> None:
    """
    Child process: publish Qube joint states (stamp = send time) and record the commands.

    Sends ``{'sent': [stamps], 'received': [(tag, receive time)]}``, times from
    :func:`time.time`.

    :param domain: ROS domain id.
    :param names: the Qube's joint names.
    :param rate_hz: publishing rate.
    :param duration: seconds to publish.
    :param conn: pipe end to the parent.
    """
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.qos import qos_profile_sensor_data
    from sensor_msgs.msg import JointState
    from std_msgs.msg import Float64MultiArray
    rclpy, context, node = _start_ros(domain, 'fake_qube')
    received = []
    pub = node.create_publisher(JointState, 'joint_states', qos_profile_sensor_data)
    sub = node.create_subscription(
        Float64MultiArray, '/effort_controller/commands',
        lambda msg: received.append((msg.layout.data_offset, time.time())), 100)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    matched = _wait(lambda: pub.get_subscription_count() > 0 and
                    sub.get_publisher_count() > 0, 30.0)
    conn.send({'ready': matched})
    sent, period = [], 1.0 / rate_hz
    start = time.monotonic()
    for k in range(int(round(duration * rate_hz))):
        _sleep_until(start + k * period)
        phase = 2.0 * math.pi * 0.5 * k * period
        msg = JointState(name=names, position=[0.2 * math.sin(phase), 0.05 * math.cos(phase)],
                         velocity=[0.2 * math.pi * math.cos(phase),
                                   -0.05 * math.pi * math.sin(phase)])
        stamp_ns = time.time_ns()
        msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(stamp_ns, 1_000_000_000)
        sent.append(stamp_ns * 1e-9)
        pub.publish(msg)
    time.sleep(0.3)   # the last commands in flight
    executor.shutdown(timeout_sec=2.0)
    spinner.join(timeout=5.0)   # a spinning thread left at exit aborts the process
    conn.send({'sent': sent, 'received': list(received)})
    node.destroy_node()
    rclpy.shutdown(context=context)


def _spawn(target, *args):
    """Start ``target(*args, conn)`` in a spawned process; return it and the parent pipe."""
    ctx = multiprocessing.get_context('spawn')
    parent, child = ctx.Pipe()
    process = ctx.Process(target=target, args=(*args, child), daemon=True)
    process.start()
    return process, parent


def _receive(process, conn, timeout: float) -> Dict[str, Any]:
    """Return the next message of a child, or raise if it died or timed out."""
    if conn.poll(timeout):
        return conn.recv()
    raise RuntimeError(f'child process {process.pid} sent nothing in {timeout:.0f} s '
                       f'(exit code {process.exitcode})')


# -- node side ----------------------------------------------------------------------------
def panda_excitation(period_s: float = 10.0) -> Dict[str, np.ndarray]:
    """
    Return one period of a smooth Panda trajectory at 1 kHz with its RNEA torques.

    :param period_s: period, s; every joint's frequency is a multiple of ``1 / period_s``.
    :return: ``q``, ``qd``, ``effort`` arrays ``(P, 7)`` (rad, rad/s, N m).
    """
    import torch
    from diffsim_ros import robots
    from diffsim_ros.core import load_urdf, rnea
    model = load_urdf(xml=robots.urdf_string('panda'), dtype=torch.float64)
    t = torch.arange(int(round(period_s * INGEST_RATE_HZ)), dtype=torch.float64)
    t = (t / INGEST_RATE_HZ).unsqueeze(-1)
    omega = 2.0 * math.pi * torch.arange(2, 9, dtype=torch.float64) / period_s
    phase = torch.arange(7, dtype=torch.float64) * 0.9
    amplitude = 0.3
    q = torch.tensor(PANDA_READY, dtype=torch.float64) + amplitude * torch.sin(omega * t + phase)
    qd = amplitude * omega * torch.cos(omega * t + phase)
    qdd = -amplitude * omega ** 2 * torch.sin(omega * t + phase)
    with torch.no_grad():
        tau = rnea(model, q, qd, qdd) + model.damping * qd
    return {'q': q.numpy(), 'qd': qd.numpy(), 'effort': tau.numpy(),
            'joint_names': list(model.joint_names)}


def _probed_identifier_class():
    """Return a subclass of the identifier whose joint-state callback counts and times."""
    from diffsim_ros.nodes.identifier import Identifier

    class ProbedIdentifier(Identifier):
        """The identifier with a counting, timing wrapper around its joint-state callback."""

        def __init__(self, **kwargs) -> None:
            self.probe = {'received': 0, 'accepted': 0, 'stalls': 0, 'max_gap_s': 0.0,
                          'busy_s': 0.0, 'max_call_s': 0.0, 'last': None}
            self.call_s = np.full(RING, np.nan)
            super().__init__(**kwargs)

        def _on_joint_state(self, msg, info=None) -> None:
            start = time.perf_counter()
            before = self._last_ns
            super()._on_joint_state(msg, info)
            end = time.perf_counter()
            probe = self.probe
            self.call_s[probe['received'] % RING] = end - start
            probe['received'] += 1
            probe['accepted'] += self._last_ns != before
            probe['busy_s'] += end - start
            probe['max_call_s'] = max(probe['max_call_s'], end - start)
            if probe['last'] is not None:
                gap = start - probe['last']
                probe['max_gap_s'] = max(probe['max_gap_s'], gap)
                probe['stalls'] += gap > STALL_S
            probe['last'] = start

    return ProbedIdentifier


def _spin(executor) -> threading.Thread:
    def run() -> None:
        try:
            executor.spin()
        except Exception:  # noqa: BLE001 - shutdown ends the spin
            pass
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def run_ingest(domain: int, duration: float, rss_period: float, warmup: float,
               executor_cls=None) -> Dict:
    """
    Publish Panda joint states at 1 kHz to an identifier node; count, time and sample RSS.

    :param domain: ROS domain id.
    :param duration: seconds of publishing.
    :param rss_period: seconds between RSS samples.
    :param warmup: seconds excluded from the RSS slope.
    :param executor_cls: rclpy executor class (default: single-threaded, as the node's
        main, ``diffsim_ros.nodes.runtime.run_node``).
    :return: counts, callback cost, RSS samples and statistics, identifier stats.
    """
    import rclpy
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor
    from diffsim_ros.nodes.params import parameter_overrides
    samples = panda_excitation()
    names = samples.pop('joint_names')
    context = Context()
    rclpy.init(context=context, domain_id=domain)
    node = _probed_identifier_class()(context=context,
                                      parameter_overrides=parameter_overrides({'robot': 'panda'}))
    executor = (executor_cls or SingleThreadedExecutor)(context=context)
    executor.add_node(node)
    spinner = _spin(executor)
    process, conn = _spawn(publish_joint_states, domain, names, samples, INGEST_RATE_HZ,
                           duration)
    try:
        if not _receive(process, conn, 60.0)['ready']:
            raise RuntimeError('the publisher never matched the identifier')
        start, cpu_start, rss = time.monotonic(), time.process_time(), []
        while not conn.poll(0):
            rss.append((time.monotonic() - start, rss_mb()))
            conn.poll(rss_period)
        publisher = conn.recv()
        time.sleep(1.0)   # the last messages in flight
        cpu_s, wall_s = time.process_time() - cpu_start, time.monotonic() - start
        rss.append((time.monotonic() - start, rss_mb()))
    finally:
        process.join(timeout=10.0)
        executor.shutdown(timeout_sec=5.0)
        spinner.join(timeout=5.0)
        node.destroy_node()
        rclpy.shutdown(context=context)
    probe, calls = node.probe, node.call_s
    times = np.array([r[0] for r in rss])
    values = np.array([r[1] for r in rss])
    late = times >= warmup
    slope = float(np.polyfit(times[late], values[late], 1)[0] * 60.0) \
        if late.sum() >= 3 else None
    return {
        'duration_s': duration, 'rate_hz': INGEST_RATE_HZ, 'publisher': publisher,
        'sent': publisher['sent'], 'received': probe['received'],
        'accepted': probe['accepted'], 'dropped': publisher['sent'] - probe['accepted'],
        'lost_before_callback': publisher['sent'] - probe['received'],
        'node_drops': node.warnings.total, 'decimated': node.stats['decimated'],
        'callback_us': {'p50': 1e6 * percentile(calls, 50), 'p99': 1e6 * percentile(calls, 99),
                        'max': 1e6 * probe['max_call_s'],
                        'mean': 1e6 * probe['busy_s'] / max(probe['received'], 1)},
        'process_cpu_s': cpu_s, 'process_cpu_percent': 100.0 * cpu_s / wall_s,
        'executor_stalls': probe['stalls'], 'max_receive_gap_ms': 1e3 * probe['max_gap_s'],
        'identifier_stats': dict(node.stats),
        'rss_mb': {'samples': [[round(t, 2), round(v, 2)] for t, v in rss],
                   'warmup_s': warmup, 'slope_mb_per_min': slope,
                   'max': float(np.nanmax(values)), 'start': float(values[0])},
    }


def _probed_mpc_class():
    """Return a subclass of the mpc node that tags each command with the state it used."""
    from diffsim_ros.nodes.mpc import MpcNode

    class TaggingPublisher:
        """Wraps the command publisher: tags each message, records the state it used."""

        def __init__(self, node, publisher) -> None:
            self.node, self.publisher, self.used = node, publisher, []

        def publish(self, msg) -> None:
            msg.layout.data_offset = len(self.used)
            node = self.node
            active = not (node.stale or node.plan_expired or node.planner.policy is None)
            self.used.append((node._probe_stamp, active))
            self.publisher.publish(msg)

        def __getattr__(self, name):
            return getattr(self.publisher, name)

    class ProbedMpc(MpcNode):
        """The mpc node; records the newest state stamp before computing each command."""

        def __init__(self, **kwargs) -> None:
            self._probe_stamp = None
            super().__init__(**kwargs)
            self.command_pub = TaggingPublisher(self, self.command_pub)

        def compute_command(self):
            self._probe_stamp = self.planner.stamp
            return super().compute_command()

    return ProbedMpc


def run_latency(domain: int, controller: str, samples: int, warmup: float) -> Dict:
    """
    Measure joint_states -> command latency through an mpc node on the Qube.

    :param domain: ROS domain id.
    :param controller: ``'baseline'`` or ``'ilqr'``.
    :param samples: joint states to measure (after ``warmup``).
    :param warmup: seconds of publishing discarded at the start (first plan, warm-up).
    :return: latency percentiles, command period, counts and the node's solve statistics.
    """
    import rclpy
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor
    from diffsim_ros import robots
    from diffsim_ros.nodes.params import parameter_overrides
    context = Context()
    rclpy.init(context=context, domain_id=domain)
    node = _probed_mpc_class()(context=context, parameter_overrides=parameter_overrides(
        {'robot': 'qube', 'controller': controller}))
    command_rate = node.config.command_rate or robots.get('qube').driver_rate_hz
    executor = SingleThreadedExecutor(context=context)   # as the node's main
    executor.add_node(node)
    spinner = _spin(executor)
    # the node warms its controller up when it starts (the native kernel's load, or 7-9 s of
    # compilation where the kernel does not apply): measure the controller, not that
    if not node.ready.wait(180.0):
        raise RuntimeError('the mpc node did not finish its warm-up within 180 s')
    duration = warmup + samples / QUBE_RATE_HZ
    process, conn = _spawn(fake_qube, domain, list(robots.get('qube').joint_names),
                           QUBE_RATE_HZ, duration)
    try:
        if not _receive(process, conn, 60.0)['ready']:
            raise RuntimeError('the fake Qube never matched the mpc node')
        robot = _receive(process, conn, duration + 60.0)
    finally:
        process.join(timeout=10.0)
        executor.shutdown(timeout_sec=5.0)
        spinner.join(timeout=5.0)
        stats = dict(node.stats)
        used = list(node.command_pub.used)
        node.destroy_node()
        rclpy.shutdown(context=context)
    sent = np.asarray(robot['sent'])
    received = dict(robot['received'])
    # commands (in publishing order) computed from a state while a plan was applied
    tags = [j for j, (stamp, active) in enumerate(used) if active and stamp is not None]
    stamps = np.array([used[j][0] for j in tags])
    measured = sent[sent >= sent[0] + warmup]
    latency, missing = [], 0
    for s in measured:
        k = int(np.searchsorted(stamps, s - 1e-7))
        if k >= len(stamps):
            missing += 1
            continue
        tag = tags[k]
        if tag not in received:
            missing += 1
            continue
        latency.append(received[tag] - s)
    latency = 1e3 * np.asarray(latency)
    arrivals = np.sort(np.array(list(received.values())))
    return {
        'controller': controller, 'states_measured': int(len(measured)),
        'latency_samples': int(latency.size), 'unmatched': missing,
        'latency_ms': {'p50': percentile(latency, 50), 'p99': percentile(latency, 99),
                       'max': percentile(latency, 100), 'mean': float(np.mean(latency))
                       if latency.size else None},
        'command_period_ms': 1e3 / command_rate,
        'commands_published': len(used), 'commands_received': len(received),
        'commands_active': len(tags),
        'achieved_command_rate_hz': float((len(arrivals) - 1) / (arrivals[-1] - arrivals[0]))
        if len(arrivals) > 1 else None,
        'mpc_stats': stats,
    }


def main(argv=None) -> int:
    """Run both measurements, print the tables and Target lines, write the JSON."""
    from diffsim_ros.nodes.runtime import NODE_TORCH_THREADS
    parser = _common.make_parser(__doc__.strip().splitlines()[0], threads=NODE_TORCH_THREADS)
    parser.add_argument('--duration', type=float, default=None,
                        help='seconds of 1 kHz ingest (default 600, --quick 20)')
    parser.add_argument('--latency-samples', type=int, default=None,
                        help='joint states measured per controller (default 3000, --quick 1500)')
    args = parser.parse_args(argv)
    import torch
    # The nodes take their torch threads from OMP_NUM_THREADS (nodes/runtime.py); the
    # default is what a node runs with when the user sets nothing.
    os.environ['OMP_NUM_THREADS'] = str(args.threads)
    torch.set_num_threads(args.threads)
    duration = args.duration or (20.0 if args.quick else 600.0)
    samples = args.latency_samples or (1500 if args.quick else 3000)
    rss_period = 1.0 if duration <= 60 else 5.0
    warmup = min(60.0, max(10.0, 0.25 * duration))
    domain = isolate_domain()
    machine = _common.machine_info(['torch', 'numpy', 'rclpy'])
    print(f'ROS_DOMAIN_ID {domain}; load average at start (1/5/15 min): '
          f'{machine["load_average_1_5_15_min"]} on {machine["usable_cores"]} usable cores '
          '(other work on the machine makes every figure pessimistic)')
    started = time.monotonic()
    ingest = run_ingest(domain, duration, rss_period, warmup)
    latency = {name: run_latency(domain, name, samples, 1.5 if args.quick else 3.0)
               for name in ('baseline', 'ilqr')}

    cb, rss = ingest['callback_us'], ingest['rss_mb']
    title = f'ingest: Panda joint_states at 1 kHz for {duration:g} s -> identifier'
    _common.print_section(title, [
        format_table(['sent', 'received', 'accepted', 'dropped', 'node drops', 'stalls >5ms',
                      'max gap ms', 'cb p50 us', 'cb p99 us', 'cb max us'],
                     [[str(ingest['sent']), str(ingest['received']), str(ingest['accepted']),
                       str(ingest['dropped']), str(ingest['node_drops']),
                       str(ingest['executor_stalls']), fmt_number(ingest['max_receive_gap_ms']),
                       fmt_number(cb['p50']), fmt_number(cb['p99']), fmt_number(cb['max'])]]),
        f'publisher: {ingest["publisher"]["wall_s"]:.1f} s wall, '
        f'{ingest["publisher"]["late_1ms"]} sends > 1 ms late '
        f'(max {ingest["publisher"]["late_max_ms"]:.1f} ms)',
        f'refits: {ingest["identifier_stats"]}; process CPU '
        f'{ingest["process_cpu_percent"]:.0f} % of one core, '
        f'{1e6 * ingest["process_cpu_s"] / max(ingest["received"], 1):.0f} us per received '
        'message',
        f'RSS: start {rss["start"]:.0f} MB, max {rss["max"]:.0f} MB, slope after '
        f'{warmup:g} s: {fmt_number(rss["slope_mb_per_min"])} MB/min'])
    rows = [[name, str(r['latency_samples']), fmt_number(r['latency_ms']['p50']),
             fmt_number(r['latency_ms']['p99']), fmt_number(r['latency_ms']['max']),
             fmt_number(r['command_period_ms']), fmt_number(r['achieved_command_rate_hz']),
             fmt_number(r['mpc_stats']['solve_time_ms'])]
            for name, r in latency.items()]
    _common.print_section('latency: Qube joint_states (500 Hz) -> mpc -> commands', [
        format_table(['controller', 'samples', 'p50 ms', 'p99 ms', 'max ms', 'floor ms',
                      'cmd Hz', 'last solve ms'], rows)])
    targets = [Target('ingest drops at 1 kHz', float(ingest['dropped']), 0.0, 'msgs'),
               Target('RSS slope after warm-up', rss['slope_mb_per_min'], 1.0, 'MB/min')]
    for name, r in latency.items():
        targets.append(Target(f'{name}: joint_states -> command p99', r['latency_ms']['p99'],
                              10.0, 'ms'))
    _common.print_section('targets', [t.line() for t in targets])
    total = time.monotonic() - started
    print(f'\ntotal {total:.1f} s; load average at end {list(os.getloadavg())}')
    if args.json:
        _common.write_json(args.json, {
            'machine': machine, 'args': vars(args), 'ros_domain_id': domain,
            'ingest': ingest, 'latency': latency, 'total_s': total,
            'load_average_end': list(os.getloadavg()),
            'targets': [t.to_dict() for t in targets]})
    return 0


if __name__ == '__main__':
    sys.exit(main())
