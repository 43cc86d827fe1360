"""
Data conventions of a recording, applied before identification.

What a lab's recording does differently from the model, given as options rather than code:

* an input delay (:func:`delay_commands`): the command of row ``k`` acted later than its time
  stamp says (the real Qube fits best with its voltages two samples, 8 ms, late);
* per-joint angle offsets (:func:`offset_angles`): the data's zero is not the URDF's zero;
* angles a driver wrapped to ``[-pi, pi)`` (:func:`~diffsim_ros.sysid.preprocess.
  unwrap_angles`), made continuous again.

The functions take and return :class:`~diffsim_ros.sysid.dataset.Trajectory` objects and
never modify their input.
"""

import math
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from ..sysid.dataset import Trajectory
from ..sysid.preprocess import delay_commands, unwrap_angles   # delay_commands: re-exported

__all__ = ['Delay', 'apply_conventions', 'delay_commands', 'delay_samples', 'offset_angles',
           'parse_delay', 'parse_offsets']

#: ``--input-delay`` as ``(value, unit)``, unit ``'samples'`` or ``'s'``.
Delay = Tuple[float, str]


def parse_delay(text: str) -> Delay:
    """
    Parse an input delay: whole samples (``'2'``) or seconds (``'0.008s'``, ``'8ms'``).

    :param text: the option value.
    :return: ``(value, 'samples' | 's')``.
    :raises ValueError: anything else, or a negative delay.
    """
    match = re.fullmatch(r'\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ms|s)?\s*', text)
    if not match:
        raise ValueError(f'expected whole samples (2) or a time (0.008s, 8ms), got {text!r}')
    value, unit = float(match.group(1)), match.group(2)
    if unit is None:
        if value != int(value):
            raise ValueError(f'a delay in samples must be a whole number, got {text!r} '
                             '(add s or ms for a time)')
        return float(int(value)), 'samples'
    return (value / 1000.0 if unit == 'ms' else value), 's'


def delay_samples(delay: Optional[Delay], traj: Trajectory) -> int:
    """
    Return a delay in whole samples of ``traj`` (seconds are rounded at its median rate).

    :param delay: a parsed delay or ``None``.
    :param traj: the run it applies to.
    :return: samples (0 for ``None``).
    """
    if delay is None:
        return 0
    value, unit = delay
    if unit == 'samples':
        return int(value)
    dt = float(traj.t.diff().median()) if len(traj) > 1 else math.inf
    return int(round(value / dt))


def parse_offsets(specs: Sequence[str], joints: Sequence[str]) -> Dict[str, float]:
    """
    Parse ``JOINT=VALUE`` angle offsets (radians, or metres for prismatic joints).

    :param specs: the option values, e.g. ``['pendulum_joint=3.14159']``.
    :param joints: the model's joints (names are checked against them).
    :return: ``{joint: offset}``.
    :raises ValueError: a malformed entry, an unknown joint or a non-finite value.
    """
    out: Dict[str, float] = {}
    for spec in specs:
        name, sep, value = spec.partition('=')
        name = name.strip()
        if not sep or not name:
            raise ValueError(f'expected JOINT=VALUE, got {spec!r}')
        if name not in joints:
            raise ValueError(f'unknown joint {name!r}; the robot has {", ".join(joints)}')
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f'{spec!r}: {value!r} is not a number') from None
        if not math.isfinite(number):
            raise ValueError(f'{spec!r}: the offset must be finite')
        out[name] = number
    return out


def offset_angles(traj: Trajectory, offsets: Mapping[str, float]) -> Trajectory:
    """
    Add a constant to joint positions: ``q_model = q_data + offset``.

    :param traj: the run.
    :param offsets: ``{joint: offset}`` in rad (m for prismatic joints).
    :return: the run with shifted ``q`` (velocities and torques unchanged).
    :raises KeyError: a joint the run lacks.
    """
    if not offsets:
        return traj
    shift = torch.zeros(len(traj.joint_names), dtype=traj.q.dtype, device=traj.q.device)
    for name, value in offsets.items():
        if name not in traj.joint_names:
            raise KeyError(f'run {traj.run!r} has no joint {name!r}')
        shift[traj.joint_names.index(name)] = value
    return traj.replace(q=traj.q + shift)


def apply_conventions(runs: Sequence[Trajectory], joints: Sequence[str],
                      delay: Optional[Delay] = None, offsets: Sequence[str] = (),
                      unwrap: Sequence[str] = ()) -> Tuple[List[Trajectory], Dict[str, Any]]:
    """
    Unwrap, offset and delay every run (``--unwrap``, ``--offset``, ``--input-delay``).

    :param runs: the runs, joints named.
    :param joints: the model's joints (names are checked against them).
    :param delay: the parsed input delay or ``None``.
    :param offsets: ``JOINT=VALUE`` entries.
    :param unwrap: joints to unwrap.
    :return: ``(runs, {'offsets', 'unwrapped', 'input_delay'})`` for ``metrics.json``.
    :raises ValueError: unknown joints, malformed offsets, a delay without commands.
    """
    shifts = parse_offsets(offsets, joints)
    unknown = [j for j in unwrap if j not in joints]
    if unknown:
        raise ValueError(f'--unwrap: unknown joint(s) {", ".join(unknown)}; the robot has '
                         f'{", ".join(joints)}')
    delays = [delay_samples(delay, run) for run in runs]
    if any(delays) and all(run.u is None for run in runs):
        raise ValueError('--input-delay delays the commands u, but the data carry none')
    out = [delay_commands(offset_angles(unwrap_angles(run, unwrap), shifts), samples)
           for run, samples in zip(runs, delays)]
    return out, {'offsets': shifts, 'unwrapped': list(unwrap),
                 'input_delay': None if delay is None else {
                     'value': delay[0], 'unit': delay[1], 'samples': sorted(set(delays))}}
