"""
The identifier's cup mode: the ball on its string learned beside the arm (ball in a cup).

Configured with a ``string_topic`` (``geometry_msgs/PoseStamped`` of the ball's centre, world
frame, e.g. ``mocap/ball``), the robot identifier (``nodes/identifier.py``) keeps refitting the
arm from ``joint_states`` as always and, through this helper, the string too: each ball pose
passes the :class:`~diffsim_ros.nodes.pose_gate.PoseGate` (parameters ``string_gate.*``; the
orientation is checked, then ignored), each joint state its usual
:class:`~diffsim_ros.nodes.gates.StateGate`; the accepted ones feed the string side of the one
refit engine (:class:`~diffsim_ros.sysid.string_online.StringEngine`, parameters
``string.*``), whose refits run on the identifier's worker thread after the arm's.  The
learned string (``string_length``, ``cup_x/y/z`` and ``cup_roll/pitch/yaw`` of the cup frame
in ``wam/tool_link``, the ball's ``friction``) joins the arm's entries of ``~/parameters``
as ``string/<name>`` with value, unit and std, and the ``string`` entry of that document
gives the string's method, held-out error (m^2) and accepted refits.  ``~/reset`` returns the
string to its nominal values too.
"""

import math
import threading
import time
from typing import Any, Dict, List, Optional

from geometry_msgs.msg import PoseStamped

from .convert import ThrottledLogger
from .pose_gate import PoseGate, PoseGateConfig
from ..core.model import RobotModel
from ..sysid.online import Decision, DecisionLog
from ..sysid.string_model import StringModel
from ..sysid.string_online import StringEngine, StringOnlineConfig, StringResult

__all__ = ['StringIdentification']


class StringIdentification:
    """
    Ball poses gated, the string's engine fed and refitted (module docstring).

    :param robot: the arm's nominal model (its kinematics carry the cup).
    :param string_length: nominal string length, m (the fits' first start).
    :param gate_config: the ball poses' gate.
    :param config: the string engine's options.
    :param log: where refusals and refit warnings go (throttled).
    :param topic: the ball's topic (log lines).
    """

    def __init__(self, robot: RobotModel, string_length: float, gate_config: PoseGateConfig,
                 config: StringOnlineConfig, log: ThrottledLogger, topic: str) -> None:
        """Build the gate and the engine; nothing is fit yet."""
        self.gate = PoseGate(gate_config, log, topic)
        self.engine = StringEngine(robot, StringModel(robot, string_length), config)
        self.log = DecisionLog()
        self._warnings = log
        self._lock = threading.Lock()

    def add_state(self, t: float, q, qd) -> None:
        """
        Feed an accepted joint state (one with velocities; others are not used here).

        :param t: stamp, s; :param q: ``(n,)`` rad; :param qd: ``(n,)`` rad/s or None.
        """
        if qd is not None:
            with self._lock:
                self.engine.add_state(t, q, qd)

    def on_pose(self, msg: PoseStamped, now_ns: int) -> bool:
        """
        Gate a ball pose and feed it.

        :param msg: the message.
        :param now_ns: the node clock, ns.
        :return: True when a string refit became due.
        """
        sample = self.gate.admit(msg, now_ns)
        if sample is None:
            return False
        with self._lock:
            if sample.restart:   # time started over: no window spans two timelines
                self.engine.restart()
            return self.engine.add_ball(sample.stamp_ns * 1e-9, sample.q[:3])

    def restart(self) -> None:
        """Forget the window (the joint states' timeline started over); keep the string."""
        with self._lock:
            self.engine.restart()

    def reset(self) -> None:
        """Forget the window and go back to the nominal string."""
        with self._lock:
            self.engine.reset()
            self.log.clear()

    def refit_due(self) -> List[Decision]:
        """
        Run the due string refits in their order (the worker thread).

        :return: their decisions (recorded; warnings logged).
        """
        decisions = []
        while self.engine.snapshots:
            decision = self.engine.refit()
            self.log.record(decision, time.monotonic())
            if decision.warn:
                self._warnings.warn('string_refit', self.log.last['status'])
            decisions.append(decision)
        return decisions

    def parameters(self) -> Dict[str, Any]:
        """
        Return the string's entries of ``~/parameters``.

        :return: ``{'parameters': {'string/<name>': {...}}, 'string': {'method',
            'heldout_loss', 'refits'}}``.
        """
        current = self.engine.current
        if current is not None:
            document = current.to_dict()
        else:
            document = StringResult(self.engine.nominal, method='nominal').to_dict()
        loss = self.log.heldout_loss
        return {'parameters': {f'string/{k}': v for k, v in document['parameters'].items()},
                'string': {'method': document['method'],
                           'heldout_loss': loss if math.isfinite(loss) else None,
                           'refits': self.engine.counts['accepted']}}

    def values(self, now_ns: int) -> Dict[str, Any]:
        """
        Return the string's diagnostics values.

        :param now_ns: the node clock, ns.
        :return: gate counts, refits and the string in use, keys prefixed ``string/``.
        """
        return {**{f'string/{k}': v for k, v in self.gate.values().items()},
                **{f'string/refits/{k}': v for k, v in self.engine.counts.items()},
                **{f'string/{k}': v for k, v in self.engine.values().items()}}

    def status(self, now_ns: int) -> Optional[str]:
        """
        Return the gate's refusal line while refusals are recent.

        :param now_ns: the node clock, ns.
        :return: the line, or None.
        """
        return self.gate.status(now_ns)

    def close(self) -> None:
        """Stop the engine's execution strategy."""
        self.engine.close()
