"""
When time may start over: the one timeline rule of the input gates (``joint_states``, poses).

Time may legitimately start over (a simulation reset, a bag played in a loop, a driver that
restarts its counter).  A gate (:class:`~diffsim_ros.nodes.gates.StateGate`,
:class:`~diffsim_ros.nodes.pose_gate.PoseGate`) refuses a stamp behind the last accepted
one (``stamp_back``) unless its :class:`Timeline` adopts it as the start of a new timeline,
which it does only in one of two ways that no single message can trigger:

1. the node's own clock jumped back since the last accepted message (``/clock`` of a reset
   simulation or a looping bag under ``use_sim_time``): the first plausible message behind
   the old timeline starts the new one;
2. the old timeline went silent: no message accepted for ``resync_time`` s of the node's
   clock while ``resync_messages`` plausible messages with increasing stamps arrived behind
   it.  As long as the real stream lives, its accepted messages keep the old timeline alive,
   so a peer injecting stamps, even alternately, cannot make the node start over.

*Plausible* means that the message passed every check the gate makes before the stamp's
order.  A new timeline is counted (``timeline_restarts`` on ``/diagnostics``) and logged
once per restart (throttled per topic); the gate marks the message that starts it, and the
node then forgets what it had of the old timeline.
"""

from dataclasses import dataclass, field
import math
from typing import Optional

from .convert import ThrottledLogger
from .params import meta

__all__ = ['Timeline', 'TimelineConfig']


@dataclass(frozen=True)
class TimelineConfig:
    """The timeline rule's parameters (module docstring); a base of each gate's config."""

    resync_time: float = field(default=0.5, metadata=meta(
        'silence (s, node clock) of the accepted stream after which a new timeline of stamps '
        'behind it may be adopted'))
    resync_messages: int = field(default=10, metadata=meta(
        'consecutive plausible messages with increasing stamps a new timeline needs'))

    def __post_init__(self) -> None:
        """Reject a non-positive silence or message count."""
        if not (math.isfinite(self.resync_time) and self.resync_time > 0.0):
            raise ValueError(f'resync_time must be finite and > 0, got {self.resync_time!r}')
        if self.resync_messages < 1:
            raise ValueError(f'resync_messages must be >= 1, got {self.resync_messages}')


class Timeline:
    """
    The stamps a gate accepted, and whether one behind them starts a new timeline.

    :param config: the rule's thresholds.
    :param log: where a restart is logged, keyed ``<topic>/restart``.
    :param topic: the topic, for the log line.
    """

    def __init__(self, config: TimelineConfig, log: ThrottledLogger, topic: str) -> None:
        """Start with nothing accepted."""
        self._log, self._topic = log, topic
        self._resync_ns = int(round(config.resync_time * 1e9))
        self._messages = config.resync_messages
        #: Stamp of the last accepted message, ns (None: none yet).
        self.last_stamp_ns: Optional[int] = None
        #: The node's clock when it was accepted, ns.
        self.accepted_at_ns: Optional[int] = None
        #: New timelines adopted.
        self.restarts = 0
        self._candidate: Optional[list] = None   # [last stamp, count] of a new timeline

    def behind(self, stamp_ns: int) -> bool:
        """
        Return whether a stamp lies strictly behind the last accepted one.

        :param stamp_ns: the message's stamp, ns.
        :return: True when it is earlier than the last accepted stamp.
        """
        return self.last_stamp_ns is not None and stamp_ns < self.last_stamp_ns

    def starts_over(self, stamp_ns: int, now_ns: int) -> bool:
        """
        Take a plausible stamp behind the timeline: return whether it starts a new one.

        :param stamp_ns: the stamp, ns, behind the last accepted one (:meth:`behind`).
        :param now_ns: the node clock, ns.
        :return: True when the gate should accept it as the first of a new timeline (then
            call :meth:`accept` with ``restart=True``); False: refuse it as ``stamp_back``.
        """
        if now_ns < self.accepted_at_ns:
            return True   # this node's clock jumped back too (simulation reset, bag loop)
        candidate = self._candidate
        if candidate is not None and stamp_ns > candidate[0]:
            candidate[0], candidate[1] = stamp_ns, candidate[1] + 1
        else:
            self._candidate = candidate = [stamp_ns, 1]
        silent = now_ns - self.accepted_at_ns >= self._resync_ns
        return silent and candidate[1] >= self._messages

    def accept(self, stamp_ns: int, now_ns: int, restart: bool = False) -> None:
        """
        Record an accepted message; a restart is counted and logged.

        :param stamp_ns: its stamp, ns.
        :param now_ns: the node clock, ns.
        :param restart: it starts a new timeline (:meth:`starts_over` said so).
        """
        self._candidate = None
        self.last_stamp_ns, self.accepted_at_ns = stamp_ns, now_ns
        if restart:
            self.restarts += 1
            self._log.warn(f'{self._topic}/restart', f'time starts over at '
                           f'{stamp_ns * 1e-9:.6f} s: the node forgets the old timeline')
