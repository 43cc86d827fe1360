"""
A command loop that never waits behind message processing.

rclpy executors run every callback on one interpreter: a 10 kHz ``joint_states`` burst kept
the mpc node's single-threaded executor busy with subscription callbacks (about 0.1 ms of
Python each), and its 500 Hz command timer fired at 141-159 Hz.  Two pieces remove the
dependency of the command rate on the message rate:

* :class:`PolledGroup`: a callback group that executors never run.  A subscription in it is
  not waited on by the node's executor; its owner takes the messages itself
  (:func:`take_messages`), at most the subscription's queue depth per call: the middleware
  drops older messages of a burst without any Python work.
* :class:`DeadlineLoop`: a thread that calls a function at absolute deadlines on the node's
  clock (simulated time under ``use_sim_time``, woken by every ``/clock`` step), so the
  command tick, the joint-state take included, costs the same whatever arrives.  On the wall
  clock the thread asks for real-time scheduling (``SCHED_FIFO``, as ros2_control's
  controller manager does): on a machine whose cores other processes keep busy, a 500 Hz
  loop at normal priority got 129 Hz (2 cores, load 10) whatever the node did.  Without
  the permission (``rtprio`` in ``/etc/security/limits.conf``, or root) it runs at normal
  priority and says so once.

A real-time command thread still waits on two locks that normal-priority threads hold: the
interpreter's (GIL) and the middleware's reader and writer locks (``take``, ``publish``).  On
2 cores at load 9-18 (test_case5, two spinners beside the test) the command thread, never
short of a core (run-queue wait 0), waited 6-139 ms for the GIL while the executor's thread,
holding it, sat preempted by the spinners, and 17-90 ms in ``take``/``publish`` on a Fast DDS
lock whose holder was preempted the same way: priority inversion, once or twice a second,
whatever the message rate.  So the loop also raises the threads it waits on, one priority
below itself: the executor's thread (:meth:`DeadlineLoop.add_helper`) and the middleware's
threads (named ``dds.*``), never torch's worker pools, which spin.  The node's other threads
wait for work without a polling timeout (the model gate's thread, polling at 10 Hz, was the
preempted GIL holder of a 68 ms stall).  Their work itself (judging a model, an iLQR solve)
still holds the GIL at normal priority.

Two more waits hold every thread of the process or of the core:

* The interpreter's cyclic garbage collector: a full collection walks every object the
  process holds (about 240 000 once torch, rclpy and MuJoCo are imported) with the GIL held,
  170-210 ms on the 2-core development machine, in whichever thread's allocation triggers
  it.  :func:`freeze_heap` moves what the node built at start-up (imports, models, compiled
  code) out of the collector's reach (``gc.freeze``); the mpc node's longest collection in
  test_case5 is then 0.3-2 ms (wall time, on 2 busy cores).
* The kernel's real-time budget: real-time threads that keep a core busy are all stopped
  for 50 ms of each second there (:meth:`DeadlineLoop.busy`).  A loaded CI run showed a
  164 ms gap and 336 Hz with the loop at real-time priority and no burst: the Qube's
  swing-up tick cost more CPU than its 2 ms period.  The loop reports how busy it is, and
  its owner does less when it is (the mpc node's inline solve).

:class:`DeadlineLoop` also reports the longest wake-up delay and tick of each diagnostics
period, and :class:`CollectorPauses` the longest collection, so that a slow second says
whose wait it was.
"""

from collections import deque
import gc
import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from rclpy.callback_groups import CallbackGroup
from rclpy.clock import JumpThreshold
from rclpy.duration import Duration

__all__ = ['BUSY_SMOOTHING', 'CollectorPauses', 'DeadlineLoop', 'freeze_heap', 'PolledGroup',
           'take_messages']


def freeze_heap() -> None:
    """
    Keep the objects alive now out of every later garbage collection (``gc.freeze``).

    Call it once a node is built and its controller warmed up: start-up's objects (imported
    modules, the model, compiled code) are what a full collection would otherwise walk with
    the GIL held.  The few cyclic leftovers of start-up frozen with them are never freed.
    """
    gc.freeze()


class CollectorPauses:
    """
    The longest garbage-collection pause of this process since it was last read.

    Installed once per process (:meth:`shared`) as a ``gc.callbacks`` entry: the collector
    calls it around every collection, in the thread whose allocation triggered it.
    """

    _shared: Optional['CollectorPauses'] = None
    _shared_lock = threading.Lock()

    def __init__(self) -> None:
        """Start listening to the collector."""
        self._started: Dict[int, int] = {}   # thread id -> ns the running collection began
        self._longest = 0
        self._lock = threading.Lock()
        gc.callbacks.append(self._on_collection)

    @classmethod
    def shared(cls) -> 'CollectorPauses':
        """Return the process's instance, installing it on first use."""
        with cls._shared_lock:
            if cls._shared is None:
                cls._shared = cls()
            return cls._shared

    def _on_collection(self, phase: str, _info: dict) -> None:
        now = time.perf_counter_ns()
        thread = threading.get_ident()
        if phase == 'start':
            self._started[thread] = now
            return
        began = self._started.pop(thread, None)
        if began is not None:
            with self._lock:
                self._longest = max(self._longest, now - began)

    def take_longest_ms(self) -> float:
        """
        Return the longest pause since the last call, ms, and start over.

        :return: milliseconds (0 when no collection ran).
        """
        with self._lock:
            longest, self._longest = self._longest, 0
        return longest * 1e-6


class PolledGroup(CallbackGroup):
    """A callback group whose entities no executor runs: their owner polls them."""

    def can_execute(self, entity: Any) -> bool:
        """
        Return False: the executor leaves the entity to its owner.

        :param entity: a subscription of the group.
        :return: False.
        """
        return False

    def beginning_execution(self, entity: Any) -> bool:
        """
        Return False: never executed by an executor.

        :param entity: a subscription of the group.
        :return: False.
        """
        return False

    def ending_execution(self, entity: Any) -> None:
        """
        Do nothing (never executed).

        :param entity: a subscription of the group.
        """


def take_messages(subscription, limit: int) -> List[Any]:
    """
    Take the waiting messages of a polled subscription, oldest first.

    :param subscription: an ``rclpy`` subscription in a :class:`PolledGroup`.
    :param limit: most messages taken (the subscription's queue depth).
    :return: the messages (empty when none is waiting).
    """
    taken = []
    with subscription.handle:
        for _ in range(limit):
            result = subscription.handle.take_message(subscription.msg_type, subscription.raw)
            if result is None:
                break
            taken.append(result[0])
    return taken


def middleware_threads() -> List[int]:
    """
    Return the native ids of this process's middleware threads (Fast DDS names them ``dds.*``).

    :return: thread ids (empty where ``/proc`` is absent).
    """
    found = []
    try:
        tasks = os.listdir('/proc/self/task')
    except OSError:
        return found
    for tid in tasks:
        try:
            with open(f'/proc/self/task/{tid}/comm') as comm:
                if comm.read().startswith('dds.'):
                    found.append(int(tid))
        except OSError:   # the thread ended meanwhile
            continue
    return found


def raise_threads(helpers: Sequence[int], priority: int) -> Dict[int, Tuple[int, int]]:
    """
    Give ``helpers`` and the middleware's threads ``SCHED_FIFO`` at ``priority``.

    Threads they start later get normal scheduling (``SCHED_RESET_ON_FORK``).

    :param helpers: native thread ids (``threading.get_native_id()``).
    :param priority: ``SCHED_FIFO`` priority, 1-99.
    :return: ``{id: (policy, priority) before}`` of the threads raised (a thread that ended
        or refused is left out).
    """
    raised = {}
    for tid in dict.fromkeys([*helpers, *middleware_threads()]):
        try:
            before = (os.sched_getscheduler(tid), os.sched_getparam(tid).sched_priority)
            os.sched_setscheduler(tid, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK,
                                  os.sched_param(priority))
        except (AttributeError, OSError):
            continue
        raised[tid] = before
    return raised


def restore_threads(raised: Dict[int, Tuple[int, int]]) -> None:
    """
    Give threads back the scheduling :func:`raise_threads` found (those still running).

    :param raised: what :func:`raise_threads` returned.
    """
    for tid, (policy, priority) in raised.items():
        try:
            os.sched_setscheduler(tid, policy, os.sched_param(priority))
        except OSError:   # ended meanwhile
            continue


#: Weight of the newest tick in :meth:`DeadlineLoop.busy` (an average over ~20 ticks).
BUSY_SMOOTHING = 0.05


class DeadlineLoop:
    """
    Call ``tick()`` on a thread at the deadlines ``k * period`` of a node's clock.

    On the wall clock a tick that starts late keeps the grid when it is less than one period
    late (the next deadline comes early, so no deadline is lost to a short hiccup); a longer
    delay re-anchors the grid and counts the missed deadlines in :attr:`missed`.  Under
    simulated time there is no catching up: a tick runs for the newest deadline the clock has
    reached (one per driver tick in lockstep).  A clock that jumps back (simulation reset)
    re-anchors the grid.

    :param node: the node whose clock paces the loop.
    :param period: seconds between ticks.
    :param tick: the function called at each deadline; an exception it raises is counted in
        :attr:`errors` and logged (throttled), and the loop goes on.
    :param name: thread name.
    :param priority: ``SCHED_FIFO`` priority (1-99) of the thread on the wall clock; 0 keeps
        normal scheduling (and so does simulated time, where the loop follows ``/clock``).

    With real-time scheduling granted, the middleware's threads and the threads given to
    :meth:`add_helper` run ``SCHED_FIFO`` one priority below the loop until :meth:`stop`.
    """

    def __init__(self, node, period: float, tick: Callable[[], None], name: str,
                 priority: int = 0) -> None:
        """Start the thread at once."""
        self._priority = int(priority)
        self._helpers: List[int] = []
        self._helpers_lock = threading.Lock()
        #: Whether the thread runs with real-time scheduling (set when it starts).
        self.realtime = False
        #: Native ids of the threads raised with it and their policies before.
        self.raised: Dict[int, Tuple[int, int]] = {}
        self._node, self._clock = node, node.get_clock()
        self._period_ns = max(1, int(round(period * 1e9)))
        self._tick = tick
        self._wake = threading.Condition()
        self._stop = False
        self.missed = 0
        self.errors = 0
        self._late_max = self._tick_max = 0   # ns, since the last waits() (wall clock)
        self._serving: Optional[int] = None   # the deadline the running tick serves, ns
        self._busy, self._last_end = 0.0, None   # share of the wall clock spent ticking
        self._started = self._clock.now().nanoseconds
        self._ticks: deque = deque()   # node-clock ns at which the last second's ticks ended
        self._ticks_lock = threading.Lock()   # rate() reads them from another thread
        threshold = JumpThreshold(min_forward=Duration(nanoseconds=1),
                                  min_backward=Duration(nanoseconds=-1), on_clock_change=True)
        self._jumps = self._clock.create_jump_callback(threshold, post_callback=self._on_jump)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _on_jump(self, _jump) -> None:
        with self._wake:
            self._wake.notify_all()

    def _now(self) -> int:
        return self._clock.now().nanoseconds

    def _simulated(self) -> bool:
        return bool(getattr(self._clock, 'ros_time_is_active', False))

    def _sleep_until(self, deadline: int) -> Optional[int]:
        """
        Wait until the clock reaches ``deadline``.

        A clock that jumps back (simulation reset, ROS time switched on) moves the deadline to
        the grid time just reached on the new timeline: the loop ticks at once.

        :return: the deadline reached (as moved), None when the loop stops.
        """
        period = self._period_ns
        with self._wake:
            while not self._stop:
                now = self._now()
                if now >= deadline:
                    if self._simulated():   # once, for the newest grid time reached
                        return max(deadline, (now // period) * period)
                    return deadline
                if now < deadline - 2 * period:
                    deadline = (now // period) * period   # a tick at once for the new time
                    continue
                if self._simulated():
                    self._wake.wait(0.1)   # woken by the clock's jumps (each /clock step)
                else:
                    self._wake.wait((deadline - now) * 1e-9)
        return None

    def _schedule(self) -> None:
        """Ask for SCHED_FIFO for this thread (wall clock only), logging the outcome."""
        if self._priority <= 0 or self._simulated():
            return
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(self._priority))
        except (AttributeError, OSError) as error:
            self._node.get_logger().warning(
                f'command loop at normal priority (SCHED_FIFO {self._priority} refused: '
                f'{error}); other load on this machine can delay commands')
            return
        with self._helpers_lock:
            self.realtime = True
            self.raised = raise_threads(self._helpers, self._helper_priority)

    @property
    def _helper_priority(self) -> int:
        return max(1, self._priority - 1)

    def add_helper(self, native_id: int) -> None:
        """
        Raise a thread whose GIL holds a tick waits on with the loop (the executor's thread).

        :param native_id: ``threading.get_native_id()`` of the thread; raised at once when the
            loop already runs real-time, else when it gets real-time scheduling.
        """
        with self._helpers_lock:
            self._helpers.append(native_id)
            if self.realtime:   # (middleware threads raised again keep their first policy)
                for tid, before in raise_threads([native_id], self._helper_priority).items():
                    self.raised.setdefault(tid, before)

    def _run(self) -> None:
        self._schedule()
        period = self._period_ns
        deadline = (self._now() // period + 1) * period
        try:
            while True:
                deadline = self._sleep_until(deadline)
                if deadline is None:
                    return
                woke = self._now()
                self._serving = deadline
                try:
                    self._tick()
                except Exception as error:  # noqa: B902 - a failed tick must not end the loop
                    self.errors += 1
                    self._node.get_logger().error(f'command tick failed: {error!r}',
                                                  throttle_duration_sec=2.0)
                self._serving = None
                now = self._now()
                self._record(now)
                if not self._simulated():
                    with self._ticks_lock:
                        self._late_max = max(self._late_max, woke - deadline)
                        self._tick_max = max(self._tick_max, now - woke)
                    interval = now - self._last_end if self._last_end is not None else period
                    self._busy += BUSY_SMOOTHING * (
                        min(1.0, (now - woke) / max(interval, 1)) - self._busy)
                    self._last_end = now
                if self._simulated():
                    # the deadline after the one served, not after the clock read now: a
                    # lockstep plant that got this tick's command may already have stepped
                    # (a preempted thread reads the next tick's time here), and a grid taken
                    # from that reading skipped a tick the plant then waited for in vain
                    deadline += period
                    continue
                deadline += period
                if now - deadline >= period:
                    # more than a period late: run once for the newest deadline, skip the rest
                    skipped = (now - deadline) // period
                    self.missed += int(skipped)
                    deadline += skipped * period
        except Exception as error:  # noqa: B902 - report, then end the loop
            if self._node.context.ok():
                self._node.get_logger().error(f'command loop stopped: {error!r}')

    def _record(self, now: int) -> None:
        with self._ticks_lock:
            ticks = self._ticks
            ticks.append(now)
            while ticks and ticks[0] <= now - 1_000_000_000:
                ticks.popleft()

    def rate(self) -> tuple:
        """
        Return the tick rate and the longest gap between ticks over the last second.

        :return: ``(Hz, ms)`` on the node clock (the rate over the time since the start while
            that is shorter than a second; the gap 0 with fewer than two ticks).
        """
        now = self._now()
        span = min(1_000_000_000, now - self._started)
        with self._ticks_lock:
            recent = [t for t in self._ticks if now - t < 1_000_000_000]
        gap = max((b - a for a, b in zip(recent, recent[1:])), default=0) * 1e-6
        return (len(recent) * 1e9 / span if span > 0 else 0.0), gap

    def lateness(self) -> float:
        """
        Return how far past its deadline the running tick is now, for the tick to budget by.

        :return: seconds on the wall clock (0 under simulated time, whose clock stands still
            while a lockstep plant waits for the command, and outside a tick).
        """
        serving = self._serving
        if serving is None or self._simulated():
            return 0.0
        return max(0, self._now() - serving) * 1e-9

    def busy(self) -> float:
        """
        Return the share of the recent wall-clock time the loop spent in its ticks.

        An average over about ``1 / BUSY_SMOOTHING`` ticks, of each tick's length over the time
        since the previous tick ended.  Linux keeps 5 % of each second of a core for normal
        threads (``sched_rt_runtime_us``; the fair server since Linux 6.12): real-time threads
        that keep a core busy are all stopped for 50 ms a second there, driver and middleware
        included.  A tick can spend less by doing less (the mpc node's inline solve).

        :return: 0-1 (0 under simulated time, where the loop waits for the plant's clock).
        """
        return 0.0 if self._simulated() else self._busy

    def waits(self) -> Tuple[float, float]:
        """
        Return the longest wake-up delay and the longest tick since the last call, and reset.

        The wake-up delay (deadline to the thread running) is the scheduler's; the tick (its
        work, and its waits for the GIL and the middleware's locks) is the process's.  Both on
        the wall clock only (0 under simulated time).

        :return: ``(late ms, tick ms)``.
        """
        with self._ticks_lock:
            late, tick = self._late_max, self._tick_max
            self._late_max = self._tick_max = 0
        return late * 1e-6, tick * 1e-6

    def stop(self, timeout: float = 5.0) -> None:
        """
        Stop the loop and wait for its thread.

        :param timeout: seconds to wait for a running tick to end.
        """
        with self._wake:
            self._stop = True
            self._wake.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=timeout)
        self._jumps.unregister()
        with self._helpers_lock:
            restore_threads(self.raised)
            self.raised = {}
