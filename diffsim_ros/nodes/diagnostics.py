"""
What the nodes publish on ``/diagnostics``: one status, its level and message, its values.

Each node decides its own level and message; :func:`with_warnings` adds the warnings that
hold whatever the node's state (a slow command loop, refused ``joint_states``), and
:func:`diagnostics_msg` turns the result and the node's counters into the message.
"""

from typing import Any, Iterable, Mapping, Tuple

from builtin_interfaces.msg import Time
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from std_msgs.msg import Header

__all__ = ['diagnostics_msg', 'with_warnings']


def with_warnings(level: bytes, message: str,
                  warnings: Iterable[str]) -> Tuple[bytes, str]:
    """
    Add warnings to a status: an OK status becomes WARN and says them instead.

    :param level: ``DiagnosticStatus`` level of the node's own state.
    :param message: its message.
    :param warnings: warning texts; empty ones are left out.
    :return: ``(level, message)``: unchanged without warnings; WARN and the warnings joined
        by ``'; '`` for an OK status; otherwise the level kept and the warnings appended.
    """
    texts = [text for text in warnings if text]
    if not texts:
        return level, message
    if level == DiagnosticStatus.OK:
        return DiagnosticStatus.WARN, '; '.join(texts)
    return level, '; '.join([message] + texts)


def diagnostics_msg(stamp: Time, name: str, hardware_id: str, level: bytes, message: str,
                    values: Mapping[str, Any]) -> DiagnosticArray:
    """
    Return a ``DiagnosticArray`` holding one status.

    :param stamp: header stamp (the node clock).
    :param name: status name, ``'<node>: <what>'``.
    :param hardware_id: the robot's name.
    :param level: ``DiagnosticStatus`` level.
    :param message: one line.
    :param values: key/value pairs, each value shown as ``str(value)``.
    :return: the message.
    """
    status = DiagnosticStatus(level=level, name=name, message=message,
                              hardware_id=hardware_id,
                              values=[KeyValue(key=str(k), value=str(v))
                                      for k, v in values.items()])
    return DiagnosticArray(header=Header(stamp=stamp), status=[status])
