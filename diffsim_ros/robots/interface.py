"""
One interface per robot: nominal model, command <-> torque map, limits, plausibility bounds.

Everything that needs the nominal model of a catalog robot or the map between what its
driver is sent and the joint torque that results asks a :class:`RobotInterface`:

>>> from diffsim_ros import robots
>>> qube = robots.interface('qube')
>>> model = qube.nominal_model()            # URDF + catalog armature, float64, CPU, cached
>>> torque = qube.torque_fn(model)          # (q, qd, u [V]) -> net joint torque [N m]

The command map (``docs/conventions.md``)::

    tau_motor = B a(u, B^T qd) [+ g(q) when the driver adds gravity, as libfranka does]
    tau_net   = tau_motor - damping qd - coulomb tanh(qd / eps)

``B`` selects the command joints, ``a`` is the DC motor of voltage-commanded robots
(identity for effort-commanded ones); :meth:`RobotInterface.command` inverts ``tau_motor``.

Plausibility bounds (:meth:`RobotInterface.parameter_bounds`), per named parameter (the names
of :func:`diffsim_ros.sysid.result.inertial_parameters` and ``joint_parameters``), from the
nominal value ``x0`` and the robot's ``plausibility`` entry in the catalog
(:data:`~diffsim_ros.robots.catalog.PLAUSIBILITY_DEFAULTS`):

* ``<body>/m`` within ``[m0 / f_m, m0 f_m]`` (relative: masses are known to a few tens of %);
* ``<body>/mx|my|mz``: ``|m c| <= f_m m0 (|c0| + r0)``, the CoM no farther from the joint
  than the nominal CoM plus the body's radius of gyration ``r0 = sqrt(tr I_c0 / m0)``;
* ``<body>/ixx|iyy|izz|ixy|ixz|iyz`` (about the body origin): magnitude at most ``f_I``
  times the body's largest nominal moment (a thin rod's axial moment is not identifiable,
  so no axis gets its own relative bound; too small a body is caught by its mass, and
  the consistency check below keeps the moments of one body physical);
* ``<joint>/damping|coulomb|armature`` within ``[0, max(f_f x0, absolute)]``: relative where
  the nominal is informative, absolute (catalog ``*_max``, else half the joint's effort limit
  at 1 rad/s or 1 m/s for friction, the robot's own summed inertia for armature) where the
  nominal is 0 or known to be far below what a refit may find;
* ``<joint>/origin_*`` within ``origin_shift_m`` / ``origin_turn_rad`` of the nominal;
* ``gravity/x|y|z`` equal to the nominal (gravity is never identified);
* ``<joint>/motor_constant|resistance`` (DC motors) within ``[x0 / f_a, x0 f_a]``.

:meth:`RobotInterface.check_model` adds physical consistency (positive masses, positive
definite pseudo-inertia, i.e. the triangle inequalities of the inertia, finite dynamics) and
the joint structure of the nominal model, and returns every problem found.
"""

import functools
import math
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

from .catalog import RobotInfo, ROBOTS
from ..core.actuators import DCMotor, SigmoidFriction
from ..core.dispatch import aba, rnea
from ..core.integrators import FRICTION_VELOCITY_SCALE
from ..core.model import PRISMATIC, RobotModel
from ..core.parameterization import is_physically_consistent, mass_com_inertia
from ..core.urdf import load_urdf
from ..sysid.losses import command_matrix, make_torque_fn
from ..sysid.result import inertial_parameters, joint_parameters

__all__ = ['ACTUATOR_UNITS', 'RobotInterface', 'interface', 'model_parameters']

Tensor = torch.Tensor
TorqueFn = Callable[[Tensor, Tensor, Tensor], Tensor]
#: Units of the DC-motor constants carried by a model message and bounded here.
ACTUATOR_UNITS = {'motor_constant': 'N m/A', 'resistance': 'Ohm'}
_ORIGIN_AXES = ('x', 'y', 'z')
_ORIGIN_TURNS = ('roll', 'pitch', 'yaw')


def model_parameters(model: RobotModel, actuator: Optional[nn.Module] = None,
                     command_joints: Tuple[str, ...] = ()) -> Dict[str, Tuple[float, str]]:
    """
    Return every physical parameter of an unbatched model by name, with its unit.

    :param model: the robot (``inertial (n, 10)``).
    :param actuator: a :class:`~diffsim_ros.core.DCMotor` (one motor per command joint) or
        ``None``.
    :param command_joints: the joints the motors drive, in motor order.
    :return: ``{name: (value, unit)}``: inertials, ``<joint>/damping|coulomb|armature``,
        ``<joint>/origin_x..yaw``, ``gravity/x..z`` and the motors' constants.
    """
    out = dict(inertial_parameters(model))
    for kind, values in (('damping', model.damping), ('coulomb', model.friction),
                         ('armature', model.armature)):
        out.update(joint_parameters(model, kind, values))
    xyz = model.origin_xyz.detach().reshape(model.n, 3).tolist()
    rpy = model.origin_rpy.detach().reshape(model.n, 3).tolist()
    for joint, shift, turn in zip(model.joint_names, xyz, rpy):
        out.update({f'{joint}/origin_{a}': (v, 'm') for a, v in zip(_ORIGIN_AXES, shift)})
        out.update({f'{joint}/origin_{a}': (v, 'rad') for a, v in zip(_ORIGIN_TURNS, turn)})
    out.update({f'gravity/{a}': (v, 'm/s^2') for a, v in
                zip(_ORIGIN_AXES, model.gravity.detach().reshape(3).tolist())})
    if isinstance(actuator, DCMotor):
        for key, unit in ACTUATOR_UNITS.items():
            values = getattr(actuator, key).detach().reshape(-1).tolist()
            out.update({f'{joint}/{key}': (v, unit) for joint, v in zip(command_joints, values)})
    return out


class RobotInterface:
    """
    What the rest of the package needs to know about one catalog robot (module docstring).

    :param info: the robot's catalog entry.
    """

    def __init__(self, info: RobotInfo) -> None:
        self.info = info
        self._nominal: Optional[RobotModel] = None
        self._bounds: Optional[Dict[str, Tuple[float, float]]] = None

    # -- description -----------------------------------------------------------------------
    @property
    def name(self) -> str:
        """Return the catalog name."""
        return self.info.name

    @property
    def command_joints(self) -> Tuple[str, ...]:
        """Return the joints the driver's command vector drives, in command order."""
        return self.info.command_joints

    @property
    def driver_adds_gravity(self) -> bool:
        """Return whether the driver adds gravity to the commanded effort (libfranka)."""
        return bool(self.info.motor.get('driver_adds_gravity', False))

    @property
    def command_limit(self) -> Tensor:
        """Return the symmetric command limit per command joint ``(m,)`` in the command unit."""
        return torch.tensor([self.info.command_limit[i] for i in self.info.command_indices],
                            dtype=torch.float64)

    def nominal_model(self) -> RobotModel:
        """
        Return the nominal model: the URDF plus the catalog's rotor armature.

        Built once per interface (float64 on the CPU) and shared: models are immutable.

        :return: the model; its ``damping``/``friction`` are the URDF's (cited there).
        """
        if self._nominal is None:
            from . import urdf_path   # the package's __init__ imports this module lazily
            model = load_urdf(urdf_path(self.name), dtype=torch.float64)
            armature = self.info.motor.get('armature', (0.0,) * self.info.n_joints)
            values = model.armature.clone()
            for joint, value in zip(self.info.joint_names, armature):
                values[model.joint_index(joint)] = float(value)
            self._nominal = model.replace(armature=values)
        return self._nominal

    def published_friction(self) -> Optional[Tuple[RobotModel, nn.Module, str]]:
        """
        Return the nominal model with the catalog's published friction model in its own form.

        A URDF carries only viscous ``damping`` and a symmetric Coulomb ``friction``; where a
        robot's identification paper published a richer model (the Panda's offset sigmoids
        of Gaz et al., Table I), this is the model as its authors evaluated it: the URDF's
        damping and Coulomb fields set to zero and that friction module in their place.

        :return: ``(model, friction module, description)``, or ``None`` when the catalog
            has no friction model beyond the URDF's fields.
        """
        friction = self.info.friction
        if not all(key in friction for key in ('phi1', 'phi2', 'phi3')):
            return None
        model = self.nominal_model()
        order = [self.info.joint_names.index(joint) for joint in model.joint_names]
        module = SigmoidFriction(model.n, **{
            key: torch.tensor([friction[key][i] for i in order], dtype=torch.float64)
            for key in ('phi1', 'phi2', 'phi3')}, dtype=torch.float64)   # not the default
        bare = model.replace(damping=torch.zeros_like(model.damping),
                             friction=torch.zeros_like(model.friction))
        return bare, module, str(friction.get('model', 'published friction')).split(';')[0]

    def limits(self) -> Dict[str, Tensor]:
        """
        Return the joint limits of the nominal model (URDF), model joint order.

        :return: ``lower``, ``upper`` (rad or m), ``travel`` (``upper - lower``),
            ``velocity`` (rad/s or m/s) and ``effort`` (N m or N; 0 on passive joints).
        """
        model = self.nominal_model()
        return {'lower': model.lower, 'upper': model.upper, 'travel': model.upper - model.lower,
                'velocity': model.velocity_limit, 'effort': model.effort_limit}

    # -- command map -----------------------------------------------------------------------
    def actuator(self, dtype: torch.dtype = torch.float64,
                 device: Optional[torch.device] = None) -> Optional[DCMotor]:
        """
        Return the nominal actuator: the DC motors of a voltage-commanded robot, else None.

        :param dtype: parameter dtype.
        :param device: parameter device.
        :return: ``DCMotor`` with one motor per command joint, or ``None`` (commands are
            joint efforts).
        """
        if self.info.command_unit != 'V':
            return None
        return DCMotor(len(self.command_joints), **self.info.dc_motor_kwargs(), dtype=dtype,
                       device=device)

    def _actuator_for(self, model: RobotModel, actuator: Optional[nn.Module]):
        return self.actuator(model.dtype, model.device) if actuator is None else actuator

    def motor_torque(self, model: RobotModel, q: Tensor, qd: Tensor, u: Tensor,
                     actuator: Optional[nn.Module] = None) -> Tensor:
        """
        Return the joint torque the driver produces for commands ``u`` (friction not included).

        :param model: the robot model (gravity of a gravity-adding driver comes from it).
        :param q: positions ``(..., n)``.
        :param qd: velocities ``(..., n)``.
        :param u: commands ``(..., m)`` in the driver's unit.
        :param actuator: motor model overriding the nominal one (an identified DC motor).
        :return: ``(..., n)`` in N m or N.
        """
        B = command_matrix(model, self.command_joints)
        act = self._actuator_for(model, actuator)
        tau = (u if act is None else act(u, qd @ B)) @ B.mT
        if self.driver_adds_gravity:
            tau = tau + rnea(model, q, torch.zeros_like(q), torch.zeros_like(q))
        return tau

    def command(self, model: RobotModel, q: Tensor, qd: Tensor, tau: Tensor,
                actuator: Optional[nn.Module] = None) -> Tensor:
        """
        Return the command that makes the driver produce ``tau`` on the command joints.

        Inverse of :meth:`motor_torque` (the actuators are affine in the command).

        :param model: the robot model.
        :param q: positions ``(..., n)``.
        :param qd: velocities ``(..., n)``.
        :param tau: wanted joint torques ``(..., n)``; only the command joints' are used.
        :param actuator: motor model overriding the nominal one.
        :return: commands ``(..., m)`` in the driver's unit (not clipped).
        """
        B = command_matrix(model, self.command_joints)
        if self.driver_adds_gravity:
            tau = tau - rnea(model, q, torch.zeros_like(q), torch.zeros_like(q))
        wanted = tau @ B
        act = self._actuator_for(model, actuator)
        if act is None:
            return wanted
        qd_motor = qd @ B
        at_zero = act(torch.zeros_like(wanted), qd_motor)
        gain = act(torch.ones_like(wanted), torch.zeros_like(qd_motor)) \
            - act(torch.zeros_like(wanted), torch.zeros_like(qd_motor))
        return (wanted - at_zero) / gain

    def torque_fn(self, model: RobotModel, actuator: Optional[nn.Module] = None,
                  coulomb_eps: float = FRICTION_VELOCITY_SCALE,
                  friction: Optional[nn.Module] = None) -> TorqueFn:
        """
        Return the net applied torque ``(q, qd, u) -> tau`` for :func:`~diffsim_ros.core.rollout`.

        :param model: the robot model (its damping and Coulomb friction are subtracted).
        :param actuator: motor model overriding the nominal one.
        :param coulomb_eps: smoothing velocity of the Coulomb term.
        :param friction: extra friction module ``(q, qd) -> tau_f`` of the model (a fit's
            sigmoid or Stribeck friction), subtracted too; ``None``: none.
        :return: ``motor_torque - damping qd - coulomb tanh(qd / eps) - friction(q, qd)``.
        """
        B = command_matrix(model, self.command_joints)
        torque = make_torque_fn(model, B, self._actuator_for(model, actuator),
                                friction, coulomb_eps=coulomb_eps)
        if not self.driver_adds_gravity:
            return torque

        def with_gravity(q: Tensor, qd: Tensor, u: Tensor) -> Tensor:
            return torque(q, qd, u) + rnea(model, q, torch.zeros_like(q), torch.zeros_like(q))
        return with_gravity

    # -- plausibility ----------------------------------------------------------------------
    def parameter_bounds(self) -> Dict[str, Tuple[float, float]]:
        """
        Return the plausible range of every named parameter (module docstring).

        :return: ``{name: (low, high)}`` in the units of :func:`model_parameters`.
        """
        if self._bounds is None:
            self._bounds = self._make_bounds()
        return dict(self._bounds)

    def _make_bounds(self) -> Dict[str, Tuple[float, float]]:
        model, rules = self.nominal_model(), self.info.plausibility
        f_m, f_i = rules['mass_factor'], rules['inertia_factor']
        f_f, f_a = rules['friction_factor'], rules['actuator_factor']
        bounds: Dict[str, Tuple[float, float]] = {}
        mass, com, inertia_com = mass_com_inertia(model.inertial)
        total_mass = float(mass.sum())
        for b, link in enumerate(model.tree.body_links):
            m0 = float(mass[b])
            bounds[f'{link}/m'] = (m0 / f_m, m0 * f_m) if m0 > 0 else (0.0, f_m * total_mass)
            radius = math.sqrt(max(float(torch.trace(inertia_com[b])), 0.0) / m0) \
                if m0 > 0 else 0.0
            reach = f_m * max(m0, 0.0) * (float(com[b].norm()) + radius)
            for key in ('mx', 'my', 'mz'):
                bounds[f'{link}/{key}'] = (-reach, reach)
            pi = model.inertial[b].tolist()
            largest = max(pi[4], pi[7], pi[9])
            for key in ('ixx', 'iyy', 'izz'):
                bounds[f'{link}/{key}'] = (0.0, f_i * largest)
            for key in ('ixy', 'ixz', 'iyz'):
                bounds[f'{link}/{key}'] = (-f_i * largest, f_i * largest)
        summed_inertia = float(model.inertial[:, [4, 7, 9]].sum())
        for j, joint in enumerate(model.joint_names):
            prismatic = model.tree.joint_types[j] == PRISMATIC
            effort = 0.5 * float(model.effort_limit[j])   # at 1 rad/s (1 m/s) for damping
            defaults = {'damping': effort, 'coulomb': effort,
                        'armature': total_mass if prismatic else summed_inertia}
            for kind, nominal in (('damping', model.damping), ('coulomb', model.friction),
                                  ('armature', model.armature)):
                absolute = rules[f'{kind}_max'][j] if rules[f'{kind}_max'] else defaults[kind]
                bounds[f'{joint}/{kind}'] = (0.0, max(f_f * float(nominal[j]), absolute))
            for axes, values, tolerance in (
                    (_ORIGIN_AXES, model.origin_xyz[j], rules['origin_shift_m']),
                    (_ORIGIN_TURNS, model.origin_rpy[j], rules['origin_turn_rad'])):
                for axis, value in zip(axes, values.tolist()):
                    bounds[f'{joint}/origin_{axis}'] = (value - tolerance, value + tolerance)
        for axis, value in zip(_ORIGIN_AXES, model.gravity.tolist()):
            bounds[f'gravity/{axis}'] = (value, value)
        motor = self.actuator()
        if motor is not None:
            for key in ACTUATOR_UNITS:
                for joint, x0 in zip(self.command_joints, getattr(motor, key).tolist()):
                    bounds[f'{joint}/{key}'] = (x0 / f_a, x0 * f_a)
        return bounds

    def check_model(self, model: RobotModel, actuator: Optional[nn.Module] = None,
                    friction: Optional[nn.Module] = None) -> List[str]:
        """
        Return every reason why a model (and motor model) may not replace the nominal one.

        An extra friction module is plausible when its torque at the joint velocity limits
        (1 rad/s or 1 m/s where the URDF has none) is finite and no larger than what the
        bounds of the URDF's ``damping`` and ``coulomb`` fields allow at that velocity.

        :param model: candidate model, unbatched.
        :param actuator: candidate motor model (``DCMotor``) or ``None`` (the nominal one).
        :param friction: candidate extra friction module ``(q, qd) -> tau_f`` or ``None``.
        :return: one line per problem (empty: plausible and physically consistent).
        """
        nominal = self.nominal_model()
        if (model.joint_names != nominal.joint_names
                or model.tree.joint_types != nominal.tree.joint_types
                or model.tree.body_links != nominal.tree.body_links):
            return [f'joints {list(model.joint_names)} / bodies '
                    f'{list(model.tree.body_links)} differ from the nominal '
                    f'{list(nominal.joint_names)} / {list(nominal.tree.body_links)}']
        if model.batch_shape != torch.Size():
            return [f'the model has parameter batch dims {tuple(model.batch_shape)}']
        if actuator is not None and not (isinstance(actuator, DCMotor)
                                         and self.info.command_unit == 'V'
                                         and actuator.n == len(self.command_joints)):
            return [f'a {type(actuator).__name__} actuator does not fit the {self.name} '
                    f'driver ({self.info.command_unit} commands)']
        model = model.to(dtype=torch.float64, device=torch.device('cpu'))
        problems = []
        values = model_parameters(model, actuator, self.command_joints)
        for name, (value, unit) in values.items():
            if not math.isfinite(value):
                problems.append(f'{name} = {value} is not finite')
        if problems:
            return problems
        for b, link in enumerate(model.tree.body_links):
            if not float(model.inertial[b, 0]) > 0.0:
                problems.append(f'{link}: mass {float(model.inertial[b, 0]):.6g} kg is not > 0')
            elif not bool(is_physically_consistent(model.inertial[b])):
                problems.append(f'{link}: inertia not physically consistent (pseudo-inertia '
                                'not positive definite: a triangle inequality of the '
                                'principal moments fails)')
        for name, (low, high) in self.parameter_bounds().items():
            if name not in values:   # no actuator given: the nominal one is used
                continue
            value, unit = values[name]
            if not low <= value <= high:
                problems.append(f'{name} = {value:.6g} {unit} outside its plausible range '
                                f'[{low:.6g}, {high:.6g}]')
        if friction is not None:
            problems += self._check_friction(model, friction)
        if not problems:
            q = torch.zeros(model.n, dtype=model.dtype)
            if not bool(torch.isfinite(aba(model, q, q, q)).all()):
                problems.append('forward dynamics at rest are not finite')
        return problems

    def _check_friction(self, model: RobotModel, friction: nn.Module) -> List[str]:
        """Return the problems of an extra friction module (see :meth:`check_model`)."""
        if getattr(friction, 'n', None) != model.n:
            return [f'the {type(friction).__name__} friction has '
                    f'{getattr(friction, "n", None)} joints, the model {model.n}']
        speed = model.velocity_limit.to(torch.float64)
        speed = torch.where(torch.isfinite(speed) & (speed > 0), speed, torch.ones_like(speed))
        bounds = self.parameter_bounds()
        high = torch.tensor([bounds[f'{joint}/damping'][1] * float(v)
                             + bounds[f'{joint}/coulomb'][1]
                             for joint, v in zip(model.joint_names, speed.tolist())],
                            dtype=torch.float64)
        like = next(friction.parameters(), speed)   # evaluated where it lives, not moved
        qd = torch.stack((speed, -speed)).to(dtype=like.dtype, device=like.device)
        with torch.no_grad():
            try:
                tau = friction(torch.zeros_like(qd), qd).double().cpu()
            except (RuntimeError, ValueError) as error:
                return [f'the {type(friction).__name__} friction cannot be evaluated: {error}']
        if tuple(tau.shape) != (2, model.n) or not bool(torch.isfinite(tau).all()):
            return [f'the {type(friction).__name__} friction torque at the velocity limits '
                    'is not finite (or of another shape)']
        return [f'{joint}: {type(friction).__name__} friction {value:.6g} at the velocity '
                f'limit exceeds {limit:.6g} (damping and coulomb bounds)'
                for joint, value, limit in zip(model.joint_names,
                                               tau.abs().amax(0).tolist(), high.tolist())
                if not value <= limit]


@functools.lru_cache(maxsize=None)
def interface(name: str) -> RobotInterface:
    """
    Return the interface of a catalog robot (one shared instance per name).

    :param name: robot name, one of ``diffsim_ros.robots.names()``.
    :return: the interface.
    :raises ValueError: unknown name (the message lists the valid names).
    """
    if name not in ROBOTS:
        raise ValueError(f'unknown robot {name!r}; valid names: {", ".join(ROBOTS)}')
    return RobotInterface(ROBOTS[name])
