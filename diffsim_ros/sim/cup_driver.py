"""
The ball-in-a-cup plant behind the simulated driver, stepped one driver period per command.

:class:`~diffsim_ros.sim.cup.CupPlant` with the stepping interface of
:class:`~diffsim_ros.sim.plant.MujocoPlant` that ``nodes/sim_driver.py`` uses.  Each
:meth:`CupDriverPlant.step` applies the command (``command_joints`` order, N m, clipped at
the catalogue's torque limits, held one 2 ms period: :meth:`CupPlant.apply`) and returns the
:class:`~diffsim_ros.sim.plant.Measurement` of the new tick: joint positions and velocities
with the configured noise, ``tau_applied`` the torque the hidden actuator gains make of the
command, and one tracked "body", ``ball``: the ball's centre (plus its mocap noise) with the
identity orientation, in the world (the WAM's base) frame.  :meth:`CupDriverPlant.in_cup` is
:func:`~diffsim_ros.sim.cup.in_cup` over the last :data:`~diffsim_ros.sim.cup.HOLD_S` s of
ticks (the true, noiseless ball).
"""

from collections import deque
from typing import Deque, Optional, Sequence

import numpy as np

from .cup import ARM_POSTURE, CupNoise, CupPlant, CupRecording, CupTruth, HOLD_S, in_cup, \
    RATE_HZ
from .plant import Measurement
from .. import robots

__all__ = ['BALL', 'CupDriverPlant']

#: Name of the ball's tracked "body" (its topic: ``<mocap_topic_prefix>/ball``).
BALL = 'ball'


class CupDriverPlant:
    """
    A :class:`CupPlant` stepped by a driver (module docstring).

    :param truth: the hidden plant.
    :param noise: sensor noise (joint positions and velocities, ball position).
    :param seed: seed of the noise.
    """

    def __init__(self, truth: CupTruth, noise: CupNoise = CupNoise(), seed: int = 0) -> None:
        """Build the plant, at rest in :data:`ARM_POSTURE` with the ball hanging."""
        self.plant = CupPlant(truth)
        self.truth, self.noise = truth, noise
        self.joint_names = tuple(self.plant.joint_names)
        self.command_joints = tuple(robots.get('wam4').command_joints)
        self._order = [self.command_joints.index(j) for j in self.joint_names]
        gain = truth.arm.actuator_gain
        self._gain = np.array([gain.get(j, 1.0) for j in self.joint_names])
        self.rate_hz = RATE_HZ
        self.period = 1.0 / RATE_HZ
        self.tracked_bodies = (BALL,)
        self.command_limit = self.plant.command_limit[
            [self.joint_names.index(j) for j in self.command_joints]]
        self._rng = np.random.default_rng([int(seed), 18, 1])
        self._tick = 0
        # one tick more than HOLD_S: in_cup needs a span of at least HOLD_S in rounded stamps
        self._history: Deque[tuple] = deque(maxlen=int(round(HOLD_S * RATE_HZ)) + 2)
        self.reset()

    @property
    def time(self) -> float:
        """Return the plant time, s."""
        return self._tick * self.period

    @property
    def tick(self) -> int:
        """Return the number of driver periods since the last reset."""
        return self._tick

    def reset(self, q0: Optional[Sequence[float]] = None) -> Measurement:
        """
        Put the arm at rest at ``q0`` (default :data:`ARM_POSTURE`), the ball hanging, t = 0.

        :param q0: ``(4,)`` joint positions in :attr:`joint_names` order, rad.
        :return: the measurement at time 0.
        """
        self.plant.reset(ARM_POSTURE if q0 is None or not len(q0) else q0)
        self._tick = 0
        self._history.clear()
        return self._measure(np.zeros(4))

    def step(self, command: Sequence[float]) -> Measurement:
        """
        Apply a command for one period and measure the new tick.

        :param command: ``(4,)`` torques in :attr:`command_joints` order, N m.
        :return: the measurement.
        :raises ValueError: a non-finite or wrongly shaped command (nothing applied).
        :raises RuntimeError: MuJoCo diverged.
        """
        u = np.asarray(command, dtype=np.float64).reshape(-1)
        if u.shape != (4,):
            raise ValueError(f'expected 4 torques for {list(self.command_joints)}, got {u}')
        tau, _ = self.plant.apply(u[self._order], self.time)
        self._tick += 1
        return self._measure(self._gain * tau)

    def _measure(self, tau_applied: np.ndarray) -> Measurement:
        """Sample the sensors now and remember the true ball for :meth:`in_cup`."""
        rng, noise = self._rng, self.noise
        q_true, qd_true = self.plant.joint_state()
        ball = self.plant.ball_position()
        cup_pos, cup_rot = self.plant.anchor()
        self._history.append((self.time, q_true, qd_true, ball, cup_pos, cup_rot))
        T = np.eye(4)
        T[:3, 3] = ball + noise.ball * rng.standard_normal(3)
        return Measurement(t=self.time, q=q_true + noise.q * rng.standard_normal(4),
                           qd=qd_true + noise.qd * rng.standard_normal(4),
                           tau_applied=tau_applied, poses={BALL: T}, t_sample=self.time,
                           joint_names=self.joint_names)

    def in_cup(self) -> bool:
        """
        Return the success rule over the last :data:`HOLD_S` s (False before that long).

        :return: whether the ball has been in the cup for the last ``HOLD_S`` s.
        """
        if len(self._history) < self._history.maxlen:
            return False
        t, q, qd, ball, cup_pos, cup_rot = (np.array(x) for x in zip(*self._history))
        return in_cup(CupRecording(t=t, q=q, qd=qd, tau=np.zeros_like(q), ball=ball,
                                   cup_pos=cup_pos, cup_rot=cup_rot,
                                   joint_names=self.joint_names))

    def __repr__(self) -> str:
        """Return a one-line summary."""
        return f'{self.plant!r} driven at {self.rate_hz:g} Hz'
