"""
The input gate every node puts in front of ``joint_states``: what may reach a model or a motor.

One :class:`StateGate` per node (mpc, identifier, monitor) checks each message, in this order,
and refuses it with one reason, counted per reason, logged throttled and reported on
``/diagnostics`` (level WARN while refusals are recent):

* ``invalid``: the message does not convert (missing or duplicate joints, lengths, NaN/Inf:
  :func:`~diffsim_ros.nodes.convert.joint_state_arrays`);
* ``future_stamp``: the header stamp is ahead of the node's clock by more than
  ``max_stamp_lead`` (a stamp from the future is never adopted: adopted, it would make the
  real states that follow look out of order);
* ``position_limit``: a position beyond the model's joint limits by more than
  ``position_margin`` times the joint's travel (joints without finite limits are not
  checked);
* ``velocity_limit``: a speed above ``velocity_factor`` times the model's velocity limit
  (``unlimited_velocity`` for joints without a finite limit; ``velocity_limits`` replaces the
  description's limits when a configuration gives them, e.g. ``config/wam4_cup.yaml``);
* ``stamp_back``: a stamp behind the last accepted one (``duplicate_stamp`` for an equal
  stamp where the node needs strictly increasing stamps).

A stamp behind the last accepted one that starts a new timeline (a simulation reset, a bag
played in a loop, a driver restarting its counter) is accepted under the one rule of the
gates, :class:`~diffsim_ros.nodes.timeline.Timeline` (``gate.resync_time``,
``gate.resync_messages``), and marked ``restart``: the node then forgets the old timeline.

Limits come from the nominal model the node starts with (the robot description), or from the
operator's configuration (``velocity_limits``), never from an identified model on the wire.
The gate only decides; the node keeps its data.
"""

from dataclasses import dataclass, field
import math
from typing import Dict, NamedTuple, Optional, Sequence, Tuple

import numpy as np
from sensor_msgs.msg import JointState

from .convert import joint_state_arrays, MessageError, stamp_to_ns, ThrottledLogger
from .params import meta
from .timeline import Timeline, TimelineConfig

__all__ = ['configured_velocity_limits', 'StateGateConfig', 'REASONS', 'StateGate',
           'StateSample']

#: Refusal reasons, in the order the gate checks them.
REASONS = ('invalid', 'future_stamp', 'position_limit', 'velocity_limit', 'duplicate_stamp',
           'stamp_back')


@dataclass(frozen=True)
class StateGateConfig(TimelineConfig):
    """Parameters of the ``joint_states`` gate (``gate.*`` of each node; module docstring)."""

    max_stamp_lead: float = field(default=0.1, metadata=meta(
        'joint_states stamped further ahead of this node clock (s) are refused (sync the '
        "clocks of the driver's and this machine, e.g. chrony)"))
    position_margin: float = field(default=0.1, metadata=meta(
        'positions beyond a joint limit by more than this fraction of its travel are refused'))
    velocity_factor: float = field(default=2.0, metadata=meta(
        'speeds above this multiple of the velocity limit are refused'))
    unlimited_velocity: float = field(default=100.0, metadata=meta(
        'velocity limit (rad/s or m/s) of joints whose description has none'))
    velocity_limits: Tuple[float, ...] = field(default=(), metadata=meta(
        "velocity limits (rad/s or m/s) replacing the robot description's, one per joint in "
        "the robot's joint order; [] = the description's. The mpc checks a reference_file "
        'against the same limits. Raise them only with a source (config/wam4_cup.yaml)'))
    refusal_hold: float = field(default=5.0, metadata=meta(
        'diagnostics stay WARN this long (s, node clock) after a refused joint_states'))

    def __post_init__(self) -> None:
        """Reject non-finite or non-positive values."""
        super().__post_init__()
        for name in ('max_stamp_lead', 'velocity_factor', 'unlimited_velocity',
                     'refusal_hold'):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0.0):
                raise ValueError(f'{name} must be finite and > 0, got {value!r}')
        if not all(math.isfinite(v) and v > 0.0 for v in self.velocity_limits):
            raise ValueError(f'velocity_limits must be finite and > 0, got '
                             f'{list(self.velocity_limits)}')
        if not (math.isfinite(self.position_margin) and self.position_margin >= 0.0):
            raise ValueError(f'position_margin must be finite and >= 0, got '
                             f'{self.position_margin!r}')


def configured_velocity_limits(config: StateGateConfig, joint_names: Sequence[str],
                               description) -> Sequence[float]:
    """
    Return the velocity limits a node checks: the configured ones, else the description's.

    :param config: the gate's parameters (``velocity_limits``).
    :param joint_names: the robot's joints, in the order of ``velocity_limits``.
    :param description: ``(n,)`` the robot description's limits, rad/s or m/s.
    :return: ``(n,)`` limits.
    :raises ValueError: ``velocity_limits`` of another length than the joints.
    """
    if not config.velocity_limits:
        return description
    if len(config.velocity_limits) != len(joint_names):
        raise ValueError(f'velocity_limits needs one value per joint {list(joint_names)}, got '
                         f'{list(config.velocity_limits)}')
    return tuple(config.velocity_limits)


class StateSample(NamedTuple):
    """An accepted joint state; ``restart`` says that a new timeline starts with it."""

    stamp_ns: int
    q: np.ndarray
    qd: Optional[np.ndarray]
    effort: Optional[np.ndarray]
    restart: bool

    @property
    def t(self) -> float:
        """
        Return the stamp in seconds.

        :return: ``stamp_ns * 1e-9``.
        """
        return self.stamp_ns * 1e-9


class StateGate:
    """
    Check ``joint_states`` messages before a node uses them (module docstring).

    :param joint_names: the model's joints, in the order of the returned arrays.
    :param lower: ``(n,)`` lower position limits (``-inf``: none).
    :param upper: ``(n,)`` upper position limits (``inf``: none).
    :param velocity_limit: ``(n,)`` velocity limits (non-finite or <= 0: none), replaced by
        ``config.velocity_limits`` when that is not empty.
    :param config: thresholds.
    :param log: where refusals are counted and logged (throttled), keyed ``<topic>/<reason>``.
    :param topic: the topic name used in log lines.
    :param require_velocity: refuse messages without velocities (``invalid``).
    :param strictly_increasing: refuse equal stamps (``duplicate_stamp``); otherwise a
        repeated stamp is accepted (the newest state of a driver that does not stamp).
    """

    def __init__(self, joint_names: Sequence[str], lower, upper, velocity_limit,
                 config: StateGateConfig, log: ThrottledLogger, topic: str = 'joint_states',
                 require_velocity: bool = True, strictly_increasing: bool = True) -> None:
        """Store the limits; see the class docstring."""
        self.joint_names = tuple(joint_names)
        self.config = config
        self._log, self._topic = log, topic
        self._require_velocity = require_velocity
        self._strict = strictly_increasing
        lower, upper = (np.asarray(v, dtype=np.float64).reshape(-1) for v in (lower, upper))
        margin = config.position_margin * (upper - lower)
        bounded = np.isfinite(lower) & np.isfinite(upper)
        self._lower = np.where(bounded, lower - margin, -np.inf)
        self._upper = np.where(bounded, upper + margin, np.inf)
        speed = np.asarray(configured_velocity_limits(config, self.joint_names, velocity_limit),
                           dtype=np.float64).reshape(-1)
        speed = np.where(np.isfinite(speed) & (speed > 0), speed, config.unlimited_velocity)
        self._speed = config.velocity_factor * speed
        self._lead_ns = int(round(config.max_stamp_lead * 1e9))
        self._hold_ns = int(round(config.refusal_hold * 1e9))
        #: Refused messages per reason (every reason present, zero included).
        self.refused: Dict[str, int] = dict.fromkeys(REASONS, 0)
        self.accepted = 0
        #: The accepted stamps and the restart rule (``last_stamp_ns``, ``restarts``).
        self.timeline = Timeline(config, log, topic)
        self._refused_at_ns: Optional[int] = None
        self._last_reason = ''

    @property
    def restarts(self) -> int:
        """Return the number of new timelines adopted."""
        return self.timeline.restarts

    def admit(self, msg: JointState, now_ns: int) -> Optional[StateSample]:
        """
        Check one message against the node's clock.

        :param msg: the incoming message.
        :param now_ns: the node clock, integer ns (simulated time under ``use_sim_time``).
        :return: the accepted sample, or None when the message was refused (counted, logged).
        """
        try:
            _, q, qd, effort = joint_state_arrays(msg, self.joint_names,
                                                  require_velocity=self._require_velocity)
        except MessageError as error:
            return self._refuse('invalid', str(error), now_ns)
        stamp = stamp_to_ns(msg.header)
        if stamp > now_ns + self._lead_ns:
            return self._refuse('future_stamp', f'stamp {stamp * 1e-9:.6f} s is '
                                f'{(stamp - now_ns) * 1e-9:.3f} s ahead of the clock', now_ns)
        outside = (q < self._lower) | (q > self._upper)
        if np.any(outside):
            j = int(np.argmax(outside))
            return self._refuse('position_limit', f'{self.joint_names[j]} at {q[j]:.4g} '
                                f'(limits with margin [{self._lower[j]:.4g}, '
                                f'{self._upper[j]:.4g}])', now_ns)
        if qd is not None and np.any(np.abs(qd) > self._speed):
            j = int(np.argmax(np.abs(qd) > self._speed))
            return self._refuse('velocity_limit', f'{self.joint_names[j]} at {qd[j]:.4g}/s '
                                f'(limit {self._speed[j]:.4g}/s)', now_ns)
        timeline, restart = self.timeline, False
        last = timeline.last_stamp_ns
        if self._strict and stamp == last:
            return self._refuse('duplicate_stamp', f'stamp {stamp * 1e-9:.6f} s repeated',
                                now_ns)
        if timeline.behind(stamp):
            restart = timeline.starts_over(stamp, now_ns)
            if not restart:
                return self._refuse('stamp_back', f'stamp {stamp * 1e-9:.6f} s behind the '
                                    f'last accepted {last * 1e-9:.6f} s', now_ns)
        timeline.accept(stamp, now_ns, restart)
        self.accepted += 1
        return StateSample(stamp, q, qd, effort, restart)

    def _refuse(self, reason: str, detail: str, now_ns: int) -> None:
        """Count, log (throttled) and remember one refusal; return None."""
        self.refused[reason] += 1
        self._refused_at_ns, self._last_reason = now_ns, reason
        self._log.warn(f'{self._topic}/{reason}', f'refused: {detail}')
        return None

    def refusing(self, now_ns: int) -> bool:
        """
        Return whether a message was refused within ``refusal_hold`` of ``now_ns``.

        :param now_ns: the node clock, ns (a clock that jumped back counts as recent).
        :return: True while refusals are recent.
        """
        at = self._refused_at_ns
        return at is not None and abs(now_ns - at) < self._hold_ns

    def status(self, now_ns: int) -> Optional[str]:
        """
        Return a one-line diagnostics message while refusals are recent, else None.

        :param now_ns: the node clock, ns.
        :return: e.g. ``'joint_states refused (future_stamp: 3, velocity_limit: 1)'``.
        """
        if not self.refusing(now_ns):
            return None
        counts = ', '.join(f'{reason}: {count}' for reason, count in self.refused.items()
                           if count)
        return f'{self._topic} refused ({counts}; last: {self._last_reason})'

    def values(self) -> Dict[str, int]:
        """
        Return the counters for ``/diagnostics``.

        :return: ``{'refused/<reason>': count, 'refused': total, 'timeline_restarts': n}``.
        """
        return {'refused': sum(self.refused.values()),
                **{f'refused/{reason}': count for reason, count in self.refused.items()},
                'timeline_restarts': self.restarts}
