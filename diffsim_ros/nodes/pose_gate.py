"""
The input gate in front of a tracked object's ``PoseStamped`` stream (vrpn_mocap style).

:class:`PoseGate` checks each message, in this order, and refuses it with one reason,
counted per reason, logged throttled and reported on ``/diagnostics`` (WARN while refusals
are recent), as :class:`~diffsim_ros.nodes.gates.StateGate` does for ``joint_states``:

* ``invalid``: a non-finite entry;
* ``not_unit``: a quaternion whose norm is off 1 by more than ``quaternion_tolerance``
  (one within it is renormalised and counted as ``renormalised``);
* ``frame_id``: a ``header.frame_id`` other than ``frame_id`` (when one is configured);
* ``future_stamp``: stamped more than ``max_stamp_lead`` s ahead of the node's clock;
* ``stamp_back``: a stamp not after the last accepted one (equal included), unless it
  starts a new timeline under the gates' one rule (:class:`~diffsim_ros.nodes.timeline.
  Timeline`: the node's clock jumped back, or the old stream went silent for
  ``resync_time`` s while ``resync_messages`` poses with increasing stamps arrived behind
  it; a simulation reset, a bag played in a loop); such a pose is accepted, marked
  ``restart``, counted as ``timeline_restarts`` and logged;
* ``jump``: a position that moved faster than ``max_speed`` m/s since the last accepted
  pose (a swapped marker set, a tracking glitch);
* ``rate``: closer than half the expected period ``1 / rate_hz`` to the last accepted pose
  (a second publisher on the topic).

The first pose of a new timeline has no last pose to be checked against (``jump``,
``rate``).  Accepted poses come back as :class:`PoseSample` ``(stamp ns, q = [p, quat (x, y,
z, w)], restart)``; the gate only decides.  The received rate (accepted poses over the last
second of stamps) is reported.
"""

from collections import deque
from dataclasses import dataclass, field
import math
from typing import Dict, NamedTuple, Optional

from geometry_msgs.msg import PoseStamped
import numpy as np

from .convert import stamp_to_ns, ThrottledLogger
from .params import meta
from .timeline import Timeline, TimelineConfig

__all__ = ['POSE_REASONS', 'PoseGate', 'PoseGateConfig', 'PoseSample']

#: Refusal reasons, in the order the gate checks them.
POSE_REASONS = ('invalid', 'not_unit', 'frame_id', 'future_stamp', 'stamp_back', 'jump', 'rate')


@dataclass(frozen=True)
class PoseGateConfig(TimelineConfig):
    """Parameters of the pose gate (``pose_gate.*``; module docstring)."""

    frame_id: str = field(default='world', metadata=meta(
        "the poses' header.frame_id; others are refused ('' accepts any)"))
    rate_hz: float = field(default=148.0, metadata=meta(
        'expected pose rate, Hz: poses closer than half its period are refused',
        range=(0.0, 100000.0)))
    quaternion_tolerance: float = field(default=0.01, metadata=meta(
        'quaternions off unit norm by at most this are renormalised (and counted); more is '
        'refused'))
    max_speed: float = field(default=20.0, metadata=meta(
        'poses implying a faster motion since the last accepted one are refused, m/s'))
    max_stamp_lead: float = field(default=0.1, metadata=meta(
        'poses stamped further ahead of the node clock are refused, s'))
    refusal_hold: float = field(default=5.0, metadata=meta(
        'diagnostics stay WARN this long (s, node clock) after a refusal'))

    def __post_init__(self) -> None:
        """Reject non-finite or non-positive thresholds."""
        super().__post_init__()
        for name in ('rate_hz', 'quaternion_tolerance', 'max_speed', 'max_stamp_lead',
                     'refusal_hold'):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0.0):
                raise ValueError(f'{name} must be finite and > 0, got {value!r}')


class PoseSample(NamedTuple):
    """An accepted pose; ``restart`` says that a new timeline starts with it."""

    stamp_ns: int
    q: np.ndarray
    restart: bool


class PoseGate:
    """
    Check ``PoseStamped`` messages before they reach a toss (module docstring).

    :param config: thresholds.
    :param log: where refusals are counted and logged (throttled), keyed ``<topic>/<reason>``.
    :param topic: the topic, for log lines.
    """

    def __init__(self, config: PoseGateConfig, log: ThrottledLogger, topic: str) -> None:
        """Start with nothing accepted."""
        self.config, self._log, self._topic = config, log, topic
        self.refused: Dict[str, int] = dict.fromkeys(POSE_REASONS, 0)
        self.accepted = self.renormalised = 0
        #: The accepted stamps and the restart rule (``last_stamp_ns``, ``restarts``).
        self.timeline = Timeline(config, log, topic)
        self._last_q: Optional[np.ndarray] = None
        self._min_interval_ns = int(0.5e9 / config.rate_hz)
        self._lead_ns = int(config.max_stamp_lead * 1e9)
        self._refused_at: Optional[int] = None
        self._last_reason = ''
        self._recent: deque = deque()

    @property
    def last_stamp_ns(self) -> Optional[int]:
        """Return the stamp of the last accepted pose, ns (None: none yet)."""
        return self.timeline.last_stamp_ns

    def admit(self, msg: PoseStamped, now_ns: int) -> Optional[PoseSample]:
        """
        Check one message against the node's clock.

        :param msg: the pose.
        :param now_ns: the node clock, ns.
        :return: the accepted pose (``q``: ``(7,)``), or None when refused (counted, logged).
        """
        p, o = msg.pose.position, msg.pose.orientation
        values = np.array([p.x, p.y, p.z, o.x, o.y, o.z, o.w], dtype=np.float64)
        if not np.isfinite(values).all():
            return self._refuse('invalid', 'non-finite pose', now_ns)
        norm = float(np.linalg.norm(values[3:]))
        if abs(norm - 1.0) > self.config.quaternion_tolerance:
            return self._refuse('not_unit', f'quaternion norm {norm:.6g}', now_ns)
        frame = self.config.frame_id
        if frame and msg.header.frame_id != frame:
            return self._refuse('frame_id', f'frame {msg.header.frame_id!r}, expected '
                                f'{frame!r}', now_ns)
        stamp = stamp_to_ns(msg.header)
        if stamp > now_ns + self._lead_ns:
            return self._refuse('future_stamp', f'stamp {stamp * 1e-9:.6f} s is '
                                f'{(stamp - now_ns) * 1e-9:.3f} s ahead of the clock', now_ns)
        timeline, last_stamp = self.timeline, self.timeline.last_stamp_ns
        restart = timeline.behind(stamp) and timeline.starts_over(stamp, now_ns)
        if last_stamp is not None and not restart:
            if stamp <= last_stamp:
                return self._refuse('stamp_back', f'stamp {stamp * 1e-9:.6f} s not after '
                                    f'{last_stamp * 1e-9:.6f} s', now_ns)
            speed = np.linalg.norm(values[:3] - self._last_q[:3]) / (
                (stamp - last_stamp) * 1e-9)
            if speed > self.config.max_speed:
                return self._refuse('jump', f'moved at {speed:.3g} m/s (limit '
                                    f'{self.config.max_speed:g})', now_ns)
            if stamp - last_stamp < self._min_interval_ns:
                return self._refuse('rate', f'{(stamp - last_stamp) * 1e-9:.6f} s after the '
                                    'last pose', now_ns)
        if norm != 1.0:
            values[3:] /= norm
            if abs(norm - 1.0) > 1e-9:
                self.renormalised += 1
        timeline.accept(stamp, now_ns, restart)
        self._last_q = values
        self.accepted += 1
        if restart:
            self._recent.clear()   # the rate of the new timeline only
        self._recent.append(stamp)
        while self._recent[0] < stamp - 1_000_000_000:
            self._recent.popleft()
        return PoseSample(stamp, values, restart)

    def _refuse(self, reason: str, detail: str, now_ns: int) -> None:
        self.refused[reason] += 1
        self._refused_at, self._last_reason = now_ns, reason
        self._log.warn(f'{self._topic}/{reason}', f'refused: {detail}')
        return None

    def status(self, now_ns: int) -> Optional[str]:
        """
        Return a one-line diagnostics message while refusals are recent, else None.

        :param now_ns: the node clock, ns.
        :return: e.g. ``'mocap/cube refused (jump: 1; last: jump)'``.
        """
        at = self._refused_at
        if at is None or abs(now_ns - at) >= self.config.refusal_hold * 1e9:
            return None
        counts = ', '.join(f'{r}: {n}' for r, n in self.refused.items() if n)
        return f'{self._topic} refused ({counts}; last: {self._last_reason})'

    def values(self) -> Dict[str, float]:
        """
        Return the counters for ``/diagnostics``.

        :return: ``refused``, ``refused/<reason>``, ``accepted``, ``renormalised``,
            ``rate_hz`` (accepted poses in the last second of stamps), ``timeline_restarts``.
        """
        return {'refused': sum(self.refused.values()),
                **{f'refused/{r}': n for r, n in self.refused.items()},
                'accepted': self.accepted, 'renormalised': self.renormalised,
                'rate_hz': float(len(self._recent)),
                'timeline_restarts': self.timeline.restarts}
