"""
The simulated robot: a MuJoCo plant with "true" parameters, actuators and a driver's sensors.

>>> plant = MujocoPlant(PlantConfig(robot='qube', param_error=0.3, seed=1))
>>> m = plant.reset(q0=[0.0, 0.1])
>>> m = plant.step([1.5])            # 1.5 V on arm_joint for one driver period (2 ms)
>>> traj = plant.run(excitation_for(plant, 'multisine', duration=5.0), steps=2500)

Timing: tick ``k`` is time ``k / rate_hz``.  ``step(u)`` holds ``u`` (after ``command_delay``
ticks) for one period, integrating ``substeps`` MuJoCo steps, and returns the measurement of
the new tick (sampled ``measurement_delay`` ticks earlier).  The plant is deterministic given
the configuration and the commands.
"""

from collections import deque
from dataclasses import dataclass
import math
from types import MappingProxyType
from typing import Callable, Mapping, Optional, Sequence, Union

import mujoco
import numpy as np
import torch

from .builder import build_mujoco_model
from .config import MAX_TIMESTEP, PlantConfig
from .parameters import add_payload, attach_tool, nominal_model, TrueParameters
from .. import robots
from ..core import DCMotor, DiffsimError, RobotModel
from ..sysid.dataset import Trajectory

__all__ = ['CommandError', 'Measurement', 'MujocoPlant', 'PlantState']

Command = Union[Sequence[float], np.ndarray, torch.Tensor, Mapping[str, float]]


class CommandError(DiffsimError, ValueError):
    """A command has the wrong shape, unknown joint names or non-finite values."""


def _readonly(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


@dataclass(frozen=True, eq=False)
class Measurement:
    """
    What the robot's driver reports at one tick (noise, quantisation and delay applied).

    :param t: delivery time, s (the tick at which the driver publishes it).
    :param q: ``(n,)`` measured positions in ``joint_names`` order, rad or m.
    :param qd: ``(n,)`` measured velocities, rad/s or m/s.
    :param tau_applied: ``(n,)`` joint torque the actuators produce at the sampling instant
        under the command then held (motor model, gain and driver gravity compensation
        included; friction and limit forces excluded), N m or N.  Not noisy.
    :param poses: tracked link -> ``(4, 4)`` world pose ``T_world_link`` (mocap).
    :param t_sample: time at which the content was sampled (``t`` minus the delay), s.
    :param joint_names: names of the columns of ``q``, ``qd``, ``tau_applied``.
    """

    t: float
    q: np.ndarray
    qd: np.ndarray
    tau_applied: np.ndarray
    poses: Mapping[str, np.ndarray]
    t_sample: float
    joint_names: tuple


@dataclass(frozen=True, eq=False)
class PlantState:
    """
    The true, noiseless state of the plant.

    :param t: time, s.
    :param q: ``(n,)`` positions in ``joint_names`` order.
    :param qd: ``(n,)`` velocities.
    """

    t: float
    q: np.ndarray
    qd: np.ndarray


def _rotation_noise(std: float, rng: np.random.Generator) -> np.ndarray:
    """Rodrigues' formula for ``exp(skew(w))`` with ``w ~ N(0, std^2 E)``."""
    w = std * rng.standard_normal(3)
    angle = float(np.linalg.norm(w))
    if angle < 1e-15:
        return np.eye(3)
    k = w / angle
    K = np.array([[0.0, -k[2], k[1]], [k[2], 0.0, -k[0]], [-k[1], k[0], 0.0]])
    return np.eye(3) + np.sin(angle) * K + (1.0 - np.cos(angle)) * (K @ K)


class MujocoPlant:
    """
    Ground-truth robot for simulated experiments and the simulated driver.

    :param config: the plant configuration (default: ``PlantConfig()``, the Qube).
    """

    def __init__(self, config: Optional[PlantConfig] = None) -> None:
        self.config = config = PlantConfig() if config is None else config
        self.info = robots.get(config.robot) if config.robot else None
        base_urdf = config.urdf if config.urdf is not None else robots.urdf_string(config.robot)
        urdf = attach_tool(base_urdf, config.tool) if config.tool is not None else base_urdf
        base = nominal_model(config.robot, config.urdf)
        #: The nominal model the experiment starts from (URDF + catalog armature).
        self.nominal_model: RobotModel = base
        true_parameters = config.true_parameters
        if true_parameters is None:
            true_parameters = TrueParameters.sample(
                base, config.param_error, torch.Generator().manual_seed(config.seed),
                actuator_error=config.actuator_error)
        #: The true parameters of this plant (sampled or given).
        self.true_parameters: TrueParameters = true_parameters
        model = true_parameters.as_model(nominal_model(config.robot, urdf))
        if config.payload is not None:
            model = add_payload(model, config.payload)
        #: Model that describes the plant exactly (payload and tool link included).
        self.true_model: RobotModel = model
        self._setup_interface()
        self._setup_actuators()
        self.gravity_compensation = bool(
            config.gravity_compensation if config.gravity_compensation is not None
            else (self.info is not None and robots.interface(self.info.name).driver_adds_gravity))
        if self.gravity_compensation and len(self.command_joints) != model.n:
            raise ValueError('gravity_compensation needs every joint actuated; passive joints: '
                             f'{sorted(set(model.joint_names) - set(self.command_joints))}')
        extra = np.zeros(model.n)
        extra[self._command_index] = self._back_emf
        #: Physics steps per driver period.
        self.substeps = config.substeps or max(
            1, math.ceil(1.0 / (self.rate_hz * MAX_TIMESTEP) - 1e-9))
        self.mj_model, self._index = build_mujoco_model(
            urdf, model, 1.0 / (self.rate_hz * self.substeps), config.integrator,
            config.joint_limits, self.gravity_compensation, extra)
        self.mj_data = mujoco.MjData(self.mj_model)
        self._command_dof = self._index.dof[self._command_index]
        self._setup_sensors()
        self._rng = np.random.default_rng([config.seed, 1])
        self.reset()

    # -- set-up ------------------------------------------------------------------------------
    def _setup_interface(self) -> None:
        config, model, info = self.config, self.true_model, self.info
        if info is not None:
            missing = [j for j in info.joint_names if j not in model.joint_names]
            if missing:
                raise ValueError(f'the URDF lacks catalog joints {missing} of {info.name!r}')
            self.command_joints = tuple(info.command_joints)
            self.command_unit = info.command_unit
            limits = dict(zip(info.joint_names, info.command_limit))
            self.command_limit = np.array([limits[j] for j in self.command_joints])
        else:
            self.command_joints = tuple(model.joint_names)
            self.command_unit = 'N m'
            self.command_limit = model.effort_limit.detach().cpu().double().numpy().copy()
        _readonly(self.command_limit)
        self._lower_limit = -self.command_limit
        self._command_index = np.array([model.joint_index(j) for j in self.command_joints],
                                       dtype=np.intp)
        self.rate_hz = float(config.rate_hz if config.rate_hz is not None
                             else info.driver_rate_hz)
        self.period = 1.0 / self.rate_hz
        tracked = config.tracked_bodies
        if tracked is None:
            tracked = (info.end_effector_link,) if info is not None else ()
            if config.tool is not None:
                tracked = tracked + (config.tool.name,)
        for link in tracked:
            model.link_index(link)
        self.tracked_bodies = tuple(tracked)

    def _setup_actuators(self) -> None:
        """Torque per command unit and back-EMF damping (voltage robots) per command joint."""
        params, joints = self.true_parameters, self.command_joints
        for what, mapping in (('actuator_gain', params.actuator_gain),
                              ('motor_constant', params.motor_constant),
                              ('motor_resistance', params.motor_resistance)):
            unknown = sorted(set(mapping) - set(joints))
            if unknown:
                raise KeyError(f'TrueParameters.{what} names {unknown}, which are not command '
                               f'joints ({", ".join(joints)})')
        gain = np.array([params.actuator_gain.get(j, 1.0) for j in joints])
        #: True DC motor model (voltage robots), else None.
        self.motor: Optional[DCMotor] = None
        if self.command_unit != 'V':
            if params.motor_constant or params.motor_resistance:
                raise ValueError('motor_constant/motor_resistance apply to voltage-commanded '
                                 'robots only')
            self._per_command = gain
            self._back_emf = np.zeros(len(joints))
            return
        nominal = self.info.dc_motor_kwargs()
        k_m = torch.tensor([params.motor_constant.get(j, nominal['motor_constant'])
                            for j in joints], dtype=torch.float64)
        r_m = torch.tensor([params.motor_resistance.get(j, nominal['resistance'])
                            for j in joints], dtype=torch.float64)
        self.motor = DCMotor(len(joints), **{**nominal, 'motor_constant': k_m,
                                             'resistance': r_m}, dtype=torch.float64)
        zeros = torch.zeros(len(joints), dtype=torch.float64)
        with torch.no_grad():
            per_volt = self.motor(torch.ones_like(zeros), zeros).numpy()
            back_emf = -self.motor(zeros, torch.ones_like(zeros)).numpy()
        # tau = gain (a V - b qd): b qd is passed to MuJoCo as damping (integrated implicitly).
        self._per_command = gain * per_volt
        self._back_emf = gain * back_emf

    def _setup_sensors(self) -> None:
        config, model, n = self.config, self.true_model, self.true_model.n
        if config.encoder_resolution is not None:
            if len(config.encoder_resolution) != n:
                raise ValueError(f'PlantConfig.encoder_resolution has '
                                 f'{len(config.encoder_resolution)} entries, expected {n} '
                                 f'({", ".join(model.joint_names)})')
            resolution = np.array(config.encoder_resolution, dtype=np.float64)
        else:
            sensor = self.info.sensor if self.info is not None else {}
            counts = config.encoder_counts_per_rev
            rotary = (2.0 * np.pi / counts if counts else 0.0) if counts is not None else (
                sensor.get('pole_encoder_rad_per_count')
                or (2.0 * np.pi / sensor['encoder_counts_per_rev']
                    if 'encoder_counts_per_rev' in sensor else 0.0))
            linear = 0.0 if counts == 0 else sensor.get('cart_encoder_m_per_count', 0.0)
            resolution = np.array([linear if kind == 'prismatic' else rotary
                                   for kind in model.tree.joint_types], dtype=np.float64)
        #: Quantisation step per joint (rad or m), 0 = none.
        self.position_resolution = _readonly(resolution)
        self._q_std = self._per_joint(config.q_noise_std, 'q_noise_std')
        self._qd_std = self._per_joint(config.qd_noise_std, 'qd_noise_std')
        self._q_noisy, self._qd_noisy = bool(self._q_std.any()), bool(self._qd_std.any())
        self._quantise = bool((resolution > 0).any())
        self._quantised = np.flatnonzero(resolution > 0)
        self._quantised_res = resolution[self._quantised]
        self._tracked_ids = [self._index.bodies[b] for b in self.tracked_bodies]

    def _per_joint(self, value, what: str) -> np.ndarray:
        array = np.asarray(value, dtype=np.float64)
        if array.ndim and array.shape != (self.n,):
            raise ValueError(f'PlantConfig.{what} has {array.size} entries, expected one per '
                             f'joint ({", ".join(self.joint_names)})')
        return np.broadcast_to(array, (self.n,)).copy()

    # -- properties --------------------------------------------------------------------------
    @property
    def joint_names(self) -> tuple:
        """Return the movable joints, in the order of every ``(n,)`` array."""
        return self.true_model.joint_names

    @property
    def home(self) -> np.ndarray:
        """Return the default reset positions: 0, or mid-range where 0 violates a limit."""
        lower = self.true_model.lower.detach().cpu().double().numpy()
        upper = self.true_model.upper.detach().cpu().double().numpy()
        outside = (lower > 0.0) | (upper < 0.0)   # then both limits are finite
        home = np.zeros(self.n)
        home[outside] = 0.5 * (lower[outside] + upper[outside])
        return home

    @property
    def n(self) -> int:
        """Return the number of joints."""
        return self.true_model.n

    @property
    def time(self) -> float:
        """Return the current time, s."""
        return self._tick * self.period

    @property
    def tick(self) -> int:
        """Return the number of driver periods since the last reset."""
        return self._tick

    @property
    def state(self) -> PlantState:
        """Return the true, noiseless time, positions and velocities (copies)."""
        return PlantState(self.time, self.mj_data.qpos[self._index.qpos].copy(),
                          self.mj_data.qvel[self._index.dof].copy())

    # -- commands ----------------------------------------------------------------------------
    def command_vector(self, command: Command) -> np.ndarray:
        """
        Validate a command and return it saturated, in ``command_joints`` order.

        :param command: ``(m,)`` values in ``command_joints`` order (what the forward command
            controller receives), or a mapping naming every command joint; in
            ``command_unit`` (N m, N or V).
        :return: ``(m,)`` float64 array clamped to ``command_limit``.
        :raises CommandError: wrong shape, wrong names or non-finite values.
        """
        m = len(self.command_joints)
        if type(command) is not np.ndarray and isinstance(command, Mapping):
            names = set(command)
            if names != set(self.command_joints):
                expected = set(self.command_joints)
                raise CommandError(
                    f'command names {sorted(names)} do not match the command joints '
                    f'{list(self.command_joints)} (missing {sorted(expected - names)}, '
                    f'unknown {sorted(names - expected)})')
            command = [command[j] for j in self.command_joints]
        if isinstance(command, torch.Tensor):
            command = command.detach().cpu().numpy()
        try:
            u = np.array(command, dtype=np.float64)  # a copy: callers may reuse theirs
        except (TypeError, ValueError) as exc:
            raise CommandError(f'command must be {m} numbers for {list(self.command_joints)}, '
                               f'got {command!r} ({exc})') from None
        if u.shape != (m,):
            raise CommandError(f'command must have shape ({m},) for '
                               f'{list(self.command_joints)}, got shape {u.shape}')
        if not np.isfinite(u).all():
            raise CommandError(f'command has non-finite values {u.tolist()} for '
                               f'{list(self.command_joints)}')
        return np.minimum(np.maximum(u, self._lower_limit), self.command_limit)

    def _set_command(self, u: np.ndarray) -> None:
        self._held = u
        self.mj_data.qfrc_applied[self._command_dof] = self._per_command * u

    def _applied_torque(self) -> np.ndarray:
        """Actuator joint torque now, for the held command (valid after ``mj_forward``)."""
        tau = np.zeros(self.n)
        qd = self.mj_data.qvel[self._command_dof]
        tau[self._command_index] = self._per_command * self._held - self._back_emf * qd
        if self.gravity_compensation:
            tau += self.mj_data.qfrc_gravcomp[self._index.dof]
        return tau

    # -- simulation --------------------------------------------------------------------------
    def reset(self, q0: Optional[Union[Sequence[float], Mapping[str, float]]] = None,
              qd0: Optional[Union[Sequence[float], Mapping[str, float]]] = None,
              seed: Optional[int] = None) -> Measurement:
        """
        Put the plant at rest (or at a given state) at time 0 and clear the delay lines.

        :param q0: ``(n,)`` positions in ``joint_names`` order or a name -> value mapping;
            default (and for names a mapping omits) :attr:`home`.
        :param qd0: velocities, same forms; default all zero.
        :param seed: reseed the sensor noise (default: keep the running noise stream).
        :return: the measurement at time 0 (also what a delayed sensor repeats until its
            first real sample arrives).
        """
        if seed is not None:
            self._rng = np.random.default_rng([seed, 1])
        d = self.mj_data
        mujoco.mj_resetData(self.mj_model, d)
        d.qpos[self._index.qpos] = self._joint_vector(q0, 'q0', self.home)
        d.qvel[self._index.dof] = self._joint_vector(qd0, 'qd0', np.zeros(self.n))
        self._tick = 0
        zero = np.zeros(len(self.command_joints))
        self._commands = deque([zero] * self.config.command_delay)
        self._received = zero
        self._set_command(zero)
        self._tau_start = np.zeros(self.n)
        mujoco.mj_forward(self.mj_model, d)
        sample = self._sample()
        self._samples = deque([sample] * (self.config.measurement_delay + 1),
                              maxlen=self.config.measurement_delay + 1)
        self._last = self._deliver()
        return self._last

    def _joint_vector(self, value, what: str, default: np.ndarray) -> np.ndarray:
        if value is None:
            return default.copy()
        if isinstance(value, Mapping):
            out = default.copy()
            for name, item in value.items():
                out[self.true_model.joint_index(name)] = float(item)
            return out
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu().numpy()
        array = np.array(value, dtype=np.float64)
        if array.shape != (self.n,) or not np.isfinite(array).all():
            raise ValueError(f'{what} must be {self.n} finite numbers for '
                             f'{list(self.joint_names)}, got {value!r}')
        return array

    def step(self, command: Optional[Command] = None) -> Measurement:
        """
        Advance one driver period.

        :param command: new command (see :meth:`command_vector`); None holds the previous one
            (as a forward command controller does between messages).
        :return: the measurement delivered at the new tick.
        :raises CommandError: invalid command (the plant is left unchanged).
        """
        return self._advance(self._received if command is None else self.command_vector(command))

    def _advance(self, u: np.ndarray) -> Measurement:
        """Step with a validated, saturated command."""
        self._received = u
        if self.config.command_delay:
            self._commands.append(u)
            u = self._commands.popleft()
        self._set_command(u)
        self._tau_start = self._applied_torque()
        mujoco.mj_step(self.mj_model, self.mj_data, nstep=self.substeps)
        mujoco.mj_forward(self.mj_model, self.mj_data)
        self._tick += 1
        self._samples.append(self._sample())
        self._last = self._deliver()
        return self._last

    def forward(self, command: Command) -> tuple:
        """
        Return the true accelerations and actuator torques at the current state.

        Nothing advances and the delay lines are bypassed: ``command`` acts immediately.

        :param command: command as in :meth:`command_vector`.
        :return: ``(qdd, tau_applied)``, both ``(n,)`` in ``joint_names`` order.
        """
        held = self._held
        self._set_command(self.command_vector(command))
        mujoco.mj_forward(self.mj_model, self.mj_data)
        qdd, tau = self.mj_data.qacc[self._index.dof].copy(), self._applied_torque()
        self._set_command(held)
        mujoco.mj_forward(self.mj_model, self.mj_data)
        return qdd, tau

    def _sample(self) -> tuple:
        """Sample the sensors now: ``(t, q, qd, tau, poses)`` with noise and quantisation."""
        d, rng = self.mj_data, self._rng
        q = d.qpos[self._index.qpos].copy()
        qd = d.qvel[self._index.dof].copy()
        if self._q_noisy:
            q += self._q_std * rng.standard_normal(self.n)
        if self._quantise:
            index, res = self._quantised, self._quantised_res
            q[index] = np.round(q[index] / res) * res
        if self._qd_noisy:
            qd += self._qd_std * rng.standard_normal(self.n)
        poses = {}
        position_std, rotation_std = self.config.pose_noise_std
        for name, bid in zip(self.tracked_bodies, self._tracked_ids):
            T = np.empty((4, 4))
            T[3] = (0.0, 0.0, 0.0, 1.0)
            T[:3, :3] = d.xmat[bid].reshape(3, 3)
            T[:3, 3] = d.xpos[bid]
            if position_std:
                T[:3, 3] += position_std * rng.standard_normal(3)
            if rotation_std:
                T[:3, :3] = T[:3, :3] @ _rotation_noise(rotation_std, rng)
            poses[name] = _readonly(T)
        return (self.time, _readonly(q), _readonly(qd), _readonly(self._applied_torque()),
                MappingProxyType(poses))

    def _deliver(self) -> Measurement:
        t_sample, q, qd, tau, poses = self._samples[0]
        return Measurement(self.time, q, qd, tau, poses, t_sample, self.joint_names)

    # -- experiments -------------------------------------------------------------------------
    def run(self, controller: Union[Callable[[Measurement], Command], np.ndarray, torch.Tensor],
            steps: Optional[int] = None, q0=None, qd0=None, reset: bool = True,
            true_acceleration: bool = False, run: str = 'sim') -> Trajectory:
        """
        Drive the plant and record a :class:`~diffsim_ros.sysid.dataset.Trajectory`.

        Sample ``j`` holds the measurement delivered at tick ``j`` (``t``, ``q``, ``qd``,
        ``poses``: noisy, quantised, delayed), the command sent then (``u``, saturated, in
        ``command_joints`` order) and the true actuator joint torque applied from that instant
        on (``tau``, motor model and gravity compensation included; friction excluded).

        :param controller: ``controller(measurement) -> command``, or precomputed commands
            ``(T, m)`` (see :mod:`diffsim_ros.sim.excitation`).
        :param steps: number of samples; default ``len(commands)``.
        :param q0: initial positions for the reset.
        :param qd0: initial velocities for the reset.
        :param reset: reset first (otherwise continue from the current state and clock).
        :param true_acceleration: also record the true ``qdd`` at each sample (noiseless and
            undelayed, consistent with ``tau``); costs one extra MuJoCo evaluation per step.
        :param run: run name stored in the trajectory.
        :return: float64 trajectory with ``T = steps`` samples, columns in ``joint_names``.
        """
        table = None
        if not callable(controller):
            table = controller.detach().cpu().numpy() if isinstance(controller, torch.Tensor) \
                else np.asarray(controller, dtype=np.float64)
            if table.ndim != 2 or table.shape[1] != len(self.command_joints):
                raise CommandError(f'command table must have shape (T, '
                                   f'{len(self.command_joints)}), got {table.shape}')
            steps = table.shape[0] if steps is None else steps
            if steps > table.shape[0]:
                raise ValueError(f'steps={steps} exceeds the {table.shape[0]} commands given')
        if steps is None or steps < 1:
            raise ValueError(f'steps must be a positive int, got {steps!r}')
        measurement = self.reset(q0, qd0) if reset else self._last
        n, m = self.n, len(self.command_joints)
        t, q, qd, tau = (np.zeros(steps), np.zeros((steps, n)), np.zeros((steps, n)),
                         np.zeros((steps, n)))
        u = np.zeros((steps, m))
        qdd = np.zeros((steps, n)) if true_acceleration else None
        poses = {b: np.zeros((steps, 4, 4)) for b in self.tracked_bodies}
        for j in range(steps):
            command = table[j] if table is not None else controller(measurement)
            u[j] = self.command_vector(command)
            t[j], q[j], qd[j] = measurement.t, measurement.q, measurement.qd
            for body, pose in measurement.poses.items():
                poses[body][j] = pose
            if true_acceleration:
                delayed = self._commands[0] if self.config.command_delay else u[j]
                qdd[j] = self.forward(delayed)[0]
            measurement = self._advance(u[j].copy())
            tau[j] = self._tau_start

        def tensor(x):
            return None if x is None else torch.from_numpy(x)
        return Trajectory(t=tensor(t), q=tensor(q), qd=tensor(qd), qdd=tensor(qdd),
                          tau=tensor(tau), u=tensor(u), joint_names=self.joint_names,
                          poses={b: tensor(p) for b, p in poses.items()}, run=run)

    def __repr__(self) -> str:
        """Return a one-line summary."""
        return (f'MujocoPlant({self.true_model.name!r}, {self.rate_hz:g} Hz x '
                f'{self.substeps}, {self.config.integrator}, commands '
                f'{list(self.command_joints)} in {self.command_unit})')
