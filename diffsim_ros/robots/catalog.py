"""
Metadata of the shipped robots: driver interface, actuators, friction, and their sources.

The rigid-body parameters (masses, centres of mass, inertias, joint limits, viscous and
Coulomb friction levels) live in the URDF files next to this module, each number cited there.
This module holds what a URDF cannot express: how the driver is commanded (rate, unit, limit,
ros2_control controller), the motor models that turn a voltage into a joint force, the
published friction models in their original form, and sensor facts the identifier needs.

Conventions
-----------
* ``joint_names`` lists every movable joint in URDF order (the order of
  ``diffsim_ros.core.load_urdf(...).joint_names``).
* ``command_limit`` has one entry per joint in ``joint_names`` order, in ``command_unit``;
  passive (unactuated) joints have limit 0.  ``command_joints`` lists, in command-vector order,
  the joints the forward command controller drives.
* ``motor['armature']`` is the reflected rotor inertia per joint (kg m^2, or kg for a
  prismatic joint) that belongs on the diagonal of the mass matrix but is not in the URDF.
* ``motor['driver_adds_gravity']`` tells whether the robot's driver adds gravity compensation
  to the commanded effort by itself (libfranka does: commands exclude gravity).
* ``plausibility`` overrides the factors and absolute bounds that
  ``diffsim_ros.robots.interface`` turns into a plausible range per named parameter (keys
  and defaults: :data:`PLAUSIBILITY_DEFAULTS`).  Joint-level absolute bounds are tuples
  with one entry per joint, for joints whose nominal value is 0 or far below what a
  refit may legitimately find (the Qube's identified damping is 300x below Quanser's).

Only the standard library is used here so that the catalog is cheap to import.
"""

from dataclasses import dataclass, field
import math
from types import MappingProxyType
from typing import Any, Mapping

__all__ = ['PLAUSIBILITY_DEFAULTS', 'RobotInfo', 'ROBOTS']

#: Default plausibility factors (dimensionless) and absolute bounds; see the interface.
PLAUSIBILITY_DEFAULTS = MappingProxyType({
    'mass_factor': 3.0,        # body mass within [m0 / f, m0 f]
    'inertia_factor': 10.0,    # inertia diagonal within [d0 / f, d0 f] (about the body origin)
    'friction_factor': 10.0,   # damping, Coulomb, armature within [0, max(f x0, absolute)]
    'actuator_factor': 2.0,    # DC-motor k_m and R_m within [x0 / f, x0 f]
    'origin_shift_m': 0.02,    # identified joint origins within this of the nominal, m
    'origin_turn_rad': 0.05,   # and this in roll, pitch and yaw, rad
    'damping_max': (),         # per joint, N m s/rad or N s/m (empty: no absolute bound)
    'coulomb_max': (),         # per joint, N m or N
    'armature_max': (),        # per joint, kg m^2 or kg
})


def _frozen(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    """Return a read-only copy of a mapping, freezing nested mappings and lists as well."""
    def freeze(value):
        if isinstance(value, Mapping):
            return MappingProxyType({key: freeze(item) for key, item in value.items()})
        if isinstance(value, (list, tuple)):
            return tuple(freeze(item) for item in value)
        return value
    return freeze(dict(mapping))


@dataclass(frozen=True)
class RobotInfo:
    """
    Static description of one robot besides its URDF.

    :param name: robot name used everywhere (``config/<name>.yaml``, ``--robot``).
    :param urdf_file: file name of the URDF in ``diffsim_ros/robots/urdf``.
    :param joint_names: movable joints in URDF (model) order.
    :param command_joints: joints driven by the forward command controller, in command order.
    :param driver_rate_hz: rate of the driver's ``joint_states`` and command loop, Hz.
    :param command_unit: unit of the command values: ``'N m'``, ``'N'`` or ``'V'``.
    :param command_limit: symmetric command limit per joint of ``joint_names`` (0 = passive).
    :param controller_name: ros2_control forward command controller name; commands go to
        ``/<controller_name>/commands``.
    :param base_link: root link, fixed to the world.
    :param end_effector_link: link whose pose is tracked (predicted vs measured paths).
    :param motor: actuator model and constants (see the module docstring).
    :param friction: the published friction model, per joint, in its original form.
    :param sensor: encoder and velocity-estimation facts of the driver.
    :param citations: sources of the numbers in this entry and in the URDF.
    :param description: one-line description.
    :param plausibility: overrides of :data:`PLAUSIBILITY_DEFAULTS` (module docstring).
    :raises ValueError: inconsistent lengths or unknown command joints.
    """

    name: str
    urdf_file: str
    joint_names: tuple[str, ...]
    command_joints: tuple[str, ...]
    driver_rate_hz: float
    command_unit: str
    command_limit: tuple[float, ...]
    controller_name: str
    base_link: str
    end_effector_link: str
    motor: Mapping[str, Any] = field(default_factory=dict, hash=False)
    friction: Mapping[str, Any] = field(default_factory=dict, hash=False)
    sensor: Mapping[str, Any] = field(default_factory=dict, hash=False)
    citations: tuple[str, ...] = ()
    description: str = ''
    plausibility: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        """Validate lengths and freeze the mappings."""
        n = len(self.joint_names)
        if len(self.command_limit) != n:
            raise ValueError(f'{self.name}: command_limit has {len(self.command_limit)} '
                             f'entries, expected one per joint ({n})')
        unknown = [j for j in self.command_joints if j not in self.joint_names]
        if unknown:
            raise ValueError(f'{self.name}: command_joints {unknown} are not in joint_names '
                             f'{list(self.joint_names)}')
        if self.command_unit not in ('N m', 'N', 'V'):
            raise ValueError(f"{self.name}: command_unit must be 'N m', 'N' or 'V', "
                             f'got {self.command_unit!r}')
        armature = self.motor.get('armature', (0.0,) * n)
        if len(armature) != n:
            raise ValueError(f"{self.name}: motor['armature'] has {len(armature)} entries, "
                             f'expected {n}')
        unknown = sorted(set(self.plausibility) - set(PLAUSIBILITY_DEFAULTS))
        if unknown:
            raise ValueError(f'{self.name}: unknown plausibility keys {unknown}; valid: '
                             f'{", ".join(PLAUSIBILITY_DEFAULTS)}')
        for key in ('damping_max', 'coulomb_max', 'armature_max'):
            if len(self.plausibility.get(key, ())) not in (0, n):
                raise ValueError(f"{self.name}: plausibility['{key}'] needs one entry per "
                                 f'joint ({n})')
        object.__setattr__(self, 'plausibility',
                           _frozen({**PLAUSIBILITY_DEFAULTS, **self.plausibility}))
        for key in ('motor', 'friction', 'sensor'):
            object.__setattr__(self, key, _frozen(getattr(self, key)))

    @property
    def n_joints(self) -> int:
        """
        Return the number of movable joints.

        :return: ``len(joint_names)``.
        """
        return len(self.joint_names)

    @property
    def command_indices(self) -> tuple[int, ...]:
        """
        Return the position of each command joint in ``joint_names``.

        :return: tuple of ints, one per entry of ``command_joints``.
        """
        return tuple(self.joint_names.index(j) for j in self.command_joints)

    def dc_motor_kwargs(self) -> dict:
        """
        Return the constructor arguments of ``diffsim_ros.core.DCMotor`` for this robot.

        The single source of the motor constants: the MuJoCo plant and the estimators both
        build their voltage-to-torque model from it, so simulated data and fits agree.

        :return: ``motor_constant``, ``resistance``, ``gear_ratio``, ``gear_efficiency``,
            ``motor_efficiency``, ``voltage_efficiency`` and ``pinion_radius`` as floats.
        :raises ValueError: if the robot is not voltage-commanded.
        """
        spec = self.motor
        if 'k_m' not in spec or 'R_m' not in spec:
            raise ValueError(f'robot {self.name!r} has no DC-motor model (commands in '
                             f'{self.command_unit})')
        rack = spec.get('type') == 'dc_motor_rack_and_pinion'
        return {
            'motor_constant': float(spec['k_m']), 'resistance': float(spec['R_m']),
            'gear_ratio': float(spec.get('gear_ratio', spec.get('K_g', 1.0))),
            'gear_efficiency': float(spec.get('eta_g', 1.0)),
            'motor_efficiency': float(spec.get('eta_m', 1.0)),
            # The rack-and-pinion equation applies eta_m to the voltage too (see 'equation').
            'voltage_efficiency': float(spec.get('eta_m', 1.0)) if rack else 1.0,
            'pinion_radius': float(spec.get('r_mp', 1.0)),
        }


# --------------------------------------------------------------------------------------
# Citations (full references; the URDF headers use the same sources)
# --------------------------------------------------------------------------------------
_PYRADO = ('F. Muratore et al., Pyrado/SimuRLacra (BSD-3), github.com/famura/SimuRLacra: '
           'Pyrado/pyrado/environments/pysim/quanser_qube.py (commit 64bee335c5d8), '
           'quanser_cartpole.py (commit 9c5507d6dd86), environments/quanser/__init__.py '
           '(commit a76d5b060a4f, max_act_qq = 4 V, max_act_qcp = 8 V)')
_QUBE_MANUAL = ('Quanser, QUBE-Servo 2 user manual, system parameters table, and courseware '
                'qube2_rotpen_param.m, as quoted in shared data quanser_qube_pyrado/SOURCE.md')
_IP02 = ('Quanser, config_ip02.m (2012), copy in SimuRLacra Pyrado/pyrado/environments/'
         'quanser/servers/cartpole/config_ip02.m (commit 5952fca32bf4)')
_NPDR = ('F. Muratore, T. Gruner, F. Wiese, B. Belousov, M. Gienger, J. Peters, "Neural '
         'Posterior Domain Randomization", CoRL 2021 (recorded Qube / cart-pole rollouts)')
_LIBBARRETT = ('Barrett Technology, libbarrett (GPL-3.0) commit 109faf6066b3, config/wam4.conf '
               'and config/wam7w.conf: standard DH table, inertial specifications Sept 2008, '
               'j2mp transmission matrices, joint_position_control control_signal_limit')
_BARRETT_MODEL = ('jhu-lcsr/barrett_model models/components.urdf.xacro (commit 00f07a7fba82): '
                  'link/joint names, base height 0.346 m, effort and velocity limits')
_WAM_MANUAL = ("Barrett Technology, WAM Arm User's Manual, document D1001 version AH.00 "
               '(2008), Table 6 Joint Limits')
_GAZ = ('C. Gaz, M. Cognetti, A. Oliva, P. Robuffo Giordano, A. De Luca, "Dynamic '
        'Identification of the Franka Emika Panda Robot With Retrieval of Feasible Parameters '
        'Using Penalty-Based Optimization", IEEE RA-L 4(4):4147-4154, 2019, and supplementary '
        'material (rev. 15 Oct 2019), Tables I, III, VIII, IX '
        '(github.com/marcocognetti/FrankaEmikaPandaDynModel commit 24d85ce4e648)')
_FRANKA_DESC = ('Franka Robotics, franka_description robots/fer/kinematics.yaml and '
                'inertials.yaml (commits 1ddff9ba71ab, 4bb824f21dc5); franka_ros '
                'franka_description/robots/panda/joint_limits.yaml (commit b2a62ff6052d)')
_LIBFRANKA = ('Franka Robotics, libfranka API documentation, franka::Torques: "Desired '
              'joint-level torques without gravity and friction"')
_DFKI_DP = ('F. Wiebe, S. Kumar, L. J. Shala, S. Vyas, M. Javadi, F. Kirchner, "Open Source '
            'Dual-Purpose Acrobot and Pendubot Platform: Benchmarking Control Algorithms for '
            'Underactuated Robotics", IEEE RAM 31(2), 2024; github.com/dfki-ric-underactuated-lab/'
            'double_pendulum (BSD-3) commit 1e8544e67f3d: identified_parameters/design_A.0/'
            'model_2.0/model_parameters.yml, docs/text/dynamics.rst, docs/text/hardware.rst')
_DFKI_SP = ('F. Wiebe, J. Babel, S. Kumar, S. Vyas, D. Harnack, M. Boukheddimi, M. Popescu, '
            'F. Kirchner, "Torque-limited simple pendulum: A toolkit for getting familiar with '
            'control algorithms in underactuated robotics", JOSS 2022; github.com/'
            'dfki-ric-underactuated-lab/torque_limited_simple_pendulum (BSD-3) commit '
            'ed17ea2d32a3: results/control_method_pd/system_identification/'
            'system_identification.txt, hardware/testbench_description.md')

# --------------------------------------------------------------------------------------
# Quanser QUBE-Servo 2 (Furuta pendulum)
# --------------------------------------------------------------------------------------
_QUBE_KM = 0.042          # V s/rad = N m/A, [QM] / Pyrado motor_back_emf
_QUBE_RM = 8.4            # ohm, [QM] / Pyrado motor_resistance
_QUBE_VMAX = 4.0          # V, Pyrado max_act_qq (comment there: "original: 5")

QUBE = RobotInfo(
    name='qube',
    urdf_file='qube.urdf',
    joint_names=('arm_joint', 'pendulum_joint'),
    command_joints=('arm_joint',),
    driver_rate_hz=500.0,   # fastest recorded rate (qq-su_ectrl_500Hz_5s); others at 250 Hz
    command_unit='V',
    command_limit=(_QUBE_VMAX, 0.0),
    controller_name='effort_controller',
    base_link='base_link',
    end_effector_link='pendulum_tip',
    motor={
        'type': 'dc_motor_direct_drive',
        'equation': 'tau_arm = k_m * (V - k_m * qd_arm) / R_m',
        'k_m': _QUBE_KM,                  # back-EMF constant, V s/rad [QM]
        'k_t': _QUBE_KM,                  # torque constant, N m/A [QM]
        'R_m': _QUBE_RM,                  # armature resistance, ohm [QM]
        'L_m': 1.16e-3,                   # armature inductance, H [QM] (neglected)
        'rotor_inertia': 4.0e-6,          # kg m^2 [QM]; not in Pyrado's model, not in armature
        'hub_inertia': 0.6e-6,            # kg m^2, load hub m_h r_h^2 / 2 [QM]; not modelled
        'gear_ratio': 1.0,                # direct drive
        'armature': (0.0, 0.0),           # Pyrado's model of the recorded data has none
        'max_torque_nm': _QUBE_KM * _QUBE_VMAX / _QUBE_RM,   # = URDF effort of arm_joint
        'driver_adds_gravity': False,
    },
    friction={
        'model': 'viscous: tau_f = d * qd',
        'viscous': (5e-6, 1e-6),          # N m s/rad, Pyrado identified Dr, Dp (= URDF damping)
        'viscous_quanser_default': (0.0015, 0.0005),   # N m s/rad, Quanser nominal Dr, Dp
    },
    sensor={
        'encoder_counts_per_rev': 2048,   # 512 lines x 4 [QM]
        'velocity_filter': '50 s / (s + 50) applied to the angles in the QUARC model',
        'velocity_filter_rad_s': 50.0,
    },
    citations=(_PYRADO, _QUBE_MANUAL, _NPDR),
    description='Quanser QUBE-Servo 2 rotary (Furuta) pendulum, voltage-commanded.',
    # 10x Quanser's nominal damping (the URDF's identified values are 300x below it); the
    # arm's Coulomb friction up to the torque of 1 V, the pendulum bearing's a tenth of it.
    plausibility={'damping_max': (0.015, 0.005),
                  'coulomb_max': (_QUBE_KM / _QUBE_RM, 0.1 * _QUBE_KM / _QUBE_RM),
                  'armature_max': (1e-4, 1e-5)},
)

# --------------------------------------------------------------------------------------
# Quanser IP02 cart-pole (12-inch pole)
# --------------------------------------------------------------------------------------
_IP02_KG, _IP02_KM, _IP02_RM, _IP02_RMP, _IP02_JM = 3.71, 7.67e-3, 2.6, 6.35e-3, 3.9e-7
_IP02_ETA_G, _IP02_ETA_M = 1.0, 1.0   # config_ip02.m (Pyrado nominal: 0.9 each)
_IP02_VMAX = 8.0                      # V, Pyrado max_act_qcp (VoltPAQ amplifier: 24 V)

CARTPOLE = RobotInfo(
    name='cartpole',
    urdf_file='cartpole.urdf',
    joint_names=('cart_joint', 'pole_joint'),
    command_joints=('cart_joint',),
    driver_rate_hz=250.0,
    command_unit='V',
    command_limit=(_IP02_VMAX, 0.0),
    controller_name='effort_controller',
    base_link='base_link',
    end_effector_link='pole_tip',
    motor={
        'type': 'dc_motor_rack_and_pinion',
        'equation': ('f_cart = eta_g * K_g * eta_m * k_m / (R_m * r_mp) '
                     '* (eta_m * V - K_g * k_m * qd_cart / r_mp)'),
        'k_m': _IP02_KM,                  # back-EMF constant, V s/rad [IP]
        'k_t': _IP02_KM,                  # torque constant, N m/A [IP]
        'R_m': _IP02_RM,                  # ohm [IP]
        'L_m': 180e-6,                    # H [IP] (neglected)
        'K_g': _IP02_KG,                  # planetary gearbox ratio [IP]
        'r_mp': _IP02_RMP,                # motor pinion radius, m [IP]
        'eta_m': _IP02_ETA_M,             # motor efficiency [IP]
        'eta_g': _IP02_ETA_G,             # gearbox efficiency [IP]
        'rotor_inertia': _IP02_JM,        # kg m^2 [IP]
        # reflected rotor mass eta_g K_g^2 J_m / r_mp^2 = 0.1331 kg on the cart joint [IP][PY]
        'armature': (_IP02_ETA_G * _IP02_KG ** 2 * _IP02_JM / _IP02_RMP ** 2, 0.0),
        'max_force_n': _IP02_KG * _IP02_KM * _IP02_VMAX / (_IP02_RM * _IP02_RMP),
        'driver_adds_gravity': False,
        'pyrado_nominal': {               # Pyrado QCartPoleSim.get_nominal_domain_param
            'cart_mass': 0.38, 'B_eq': 5.4, 'eta_m': 0.9, 'eta_g': 0.9},
    },
    friction={
        'model': ('cart: tau_f = B_eq * qd + mu * N * sign(qd), N = normal force on the rail; '
                  'pole: tau_f = B_pole * qd'),
        'viscous': (4.3, 0.0024),          # N s/m [IP] (NO_LOAD), N m s/rad [PY]
        'viscous_with_weight': (5.4, 0.0024),   # [IP] configuration WEIGHT (cart 0.94 kg)
        'coulomb_coefficient': (0.02, 0.0),      # [PY] cart_friction_coeff
        # URDF <dynamics friction> = mu (M_cart + m_pole) g with the static normal force
        'coulomb': (0.02 * (0.57 + 0.127) * 9.81, 0.0),
    },
    sensor={
        'cart_encoder_m_per_count': 0.01 / 6.01 * 56 / 4096,   # K_EC = Pr N_pp / 4096 [IP]
        'pole_encoder_rad_per_count': 2 * math.pi / 4096,       # K_EP [IP]
        'velocity_filter': '50 s / (s + 50) applied to the positions in the QUARC model',
        'velocity_filter_rad_s': 50.0,
        'pole_angle_wrapped': True,        # the client wraps theta to [-pi, pi)
    },
    citations=(_IP02, _PYRADO, _NPDR),
    description='Quanser IP02 linear cart with the 12-inch single pendulum, voltage-commanded.',
)

# --------------------------------------------------------------------------------------
# Barrett WAM (4-DOF and 7-DOF with wrist)
# --------------------------------------------------------------------------------------
_WAM_JOINTS = ('wam/base_yaw_joint', 'wam/shoulder_pitch_joint', 'wam/shoulder_yaw_joint',
               'wam/elbow_pitch_joint', 'wam/wrist_yaw_joint', 'wam/wrist_pitch_joint',
               'wam/palm_yaw_joint')
# libbarrett low_level.j2mp (joint-to-motor position transform: cable transmissions)
_WAM_J2MP = ((-42.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0),
             (0.0, 28.25, -16.8155, 0.0, 0.0, 0.0, 0.0),
             (0.0, -28.25, -16.8155, 0.0, 0.0, 0.0, 0.0),
             (0.0, 0.0, 0.0, -18.0, 0.0, 0.0, 0.0),
             (0.0, 0.0, 0.0, 0.0, 9.7, -9.7, 0.0),
             (0.0, 0.0, 0.0, 0.0, 9.7, 9.7, 0.0),
             (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -14.93))
# libbarrett joint_position_control.control_signal_limit, N m
_WAM_TORQUE_LIMIT = (25.0, 20.0, 15.0, 15.0, 5.0, 5.0, 5.0)


def _wam(dof: int) -> RobotInfo:
    """Build the WAM entry with ``dof`` joints (4 or 7)."""
    return RobotInfo(
        name=f'wam{dof}',
        urdf_file=f'wam{dof}.urdf',
        joint_names=_WAM_JOINTS[:dof],
        command_joints=_WAM_JOINTS[:dof],
        driver_rate_hz=500.0,
        command_unit='N m',
        command_limit=_WAM_TORQUE_LIMIT[:dof],
        controller_name='effort_controller',
        base_link='wam/base_link',
        end_effector_link='wam/tool_link',
        motor={
            'type': 'joint_torque',
            'j2mp': tuple(row[:dof] for row in _WAM_J2MP[:dof]),
            'armature': (0.0,) * dof,     # rotor inertias are not published in the sources
            'driver_adds_gravity': False,
            'note': ('URDF effort limits are barrett_model peak values; command_limit is '
                     "libbarrett's joint-space control_signal_limit"),
        },
        friction={'model': 'none published with these inertial specifications'},
        sensor={},
        citations=(_LIBBARRETT, _BARRETT_MODEL, _WAM_MANUAL),
        description=f'Barrett WAM {dof}-DOF{" with wrist" if dof == 7 else ""}, '
                    'torque-commanded.',
    )


WAM4 = _wam(4)
WAM7 = _wam(7)

# --------------------------------------------------------------------------------------
# Franka Emika Panda
# --------------------------------------------------------------------------------------
PANDA = RobotInfo(
    name='panda',
    urdf_file='panda.urdf',
    joint_names=tuple(f'panda_joint{i}' for i in range(1, 8)),
    command_joints=tuple(f'panda_joint{i}' for i in range(1, 8)),
    driver_rate_hz=1000.0,
    command_unit='N m',
    command_limit=(87.0, 87.0, 87.0, 87.0, 12.0, 12.0, 12.0),   # franka_ros joint_limits.yaml
    controller_name='effort_controller',
    base_link='panda_link0',
    end_effector_link='panda_link8',
    motor={
        'type': 'joint_torque',
        'armature': (0.0,) * 7,           # [GZ] torques are link-side sensor readings
        'driver_adds_gravity': True,      # libfranka: commanded torques exclude gravity
        'torque_sensors': True,
    },
    friction={
        'model': ('sigmoid (Gaz Table I): tau_f = phi1 / (1 + exp(-phi2 (qd + phi3))) '
                  '- phi1 / (1 + exp(-phi2 phi3)); linear (Table III): fv qd + fc sign(qd) + fo'),
        'phi1': (5.4615e-01, 0.87224, 6.4068e-01, 1.2794e+00, 8.3904e-01, 3.0301e-01,
                 5.6489e-01),                                  # N m
        'phi2': (5.1181e+00, 9.0657e+00, 1.0136e+01, 5.5903e+00, 8.3469e+00, 1.7133e+01,
                 1.0336e+01),                                  # s/rad
        'phi3': (3.9533e-02, 2.5882e-02, -4.6070e-02, 3.6194e-02, 2.6226e-02, -2.1047e-02,
                 3.5526e-03),                                  # rad/s
        # Table III, one-step identification (OSI) column = URDF damping / friction
        'viscous': (0.0628, 0.2088, 0.0361, 0.2174, 0.1021, 1.6128e-04, 0.0632),   # N m s/rad
        'coulomb': (0.2549, 0.1413, 0.1879, 0.3625, 0.2728, 0.1529, 0.2097),       # N m
        'offset': (-0.1069, -0.1601, -0.0718, -0.2562, 0.0079, 0.0935, -0.0070),   # N m
    },
    sensor={'joint_torque_sensors': True},
    citations=(_GAZ, _FRANKA_DESC, _LIBFRANKA),
    description='Franka Emika Panda (FER) arm to the flange, torque-commanded (libfranka).',
)

# --------------------------------------------------------------------------------------
# DFKI double pendulum (design A.0, model_2.0) and simple pendulum
# --------------------------------------------------------------------------------------
_DP_GR = 6.0                           # gear ratio gr [DP]
_DP_IR = 7.659297952841183e-05         # identified rotor inertia Ir, kg m^2 [DP model_2.0]

DOUBLE_PENDULUM = RobotInfo(
    name='double_pendulum',
    urdf_file='double_pendulum.urdf',
    joint_names=('shoulder_joint', 'elbow_joint'),
    command_joints=('shoulder_joint', 'elbow_joint'),
    driver_rate_hz=500.0,              # sys-id records: dt median 2.0 ms
    command_unit='N m',
    command_limit=(10.0, 10.0),        # tl1, tl2 of model_2.0 (AK80-6 peak: 12 N m)
    controller_name='effort_controller',
    base_link='base_link',
    end_effector_link='ee_link',
    motor={
        'type': 'quasi_direct_drive',
        'gear_ratio': _DP_GR,
        'rotor_inertia': _DP_IR,
        'k_t_motor_side': 0.091,       # N m/A before the transmission [HW]
        # M += [[gr^2 Ir + Ir, -gr Ir], [-gr Ir, gr^2 Ir]] (docs/text/dynamics.rst)
        'armature': (_DP_GR ** 2 * _DP_IR + _DP_IR, _DP_GR ** 2 * _DP_IR),
        'armature_coupling': -_DP_GR * _DP_IR,
        'driver_adds_gravity': False,
    },
    friction={
        'model': 'tau_f = b * qd + cf * atan(atan_gain * qd)',
        'viscous': (0.001, 0.001),     # b1, b2, N m s/rad
        'coulomb_atan': (0.093, 0.078),   # cf1, cf2, N m (URDF friction = cf * pi / 2)
        'atan_gain': 100.0,            # s/rad
    },
    sensor={},
    citations=(_DFKI_DP,),
    description='DFKI acrobot/pendubot double pendulum, design A.0, two AK80-6 drives.',
)

SIMPLE_PENDULUM = RobotInfo(
    name='simple_pendulum',
    urdf_file='simple_pendulum.urdf',
    joint_names=('pendulum_joint',),
    command_joints=('pendulum_joint',),
    driver_rate_hz=300.0,              # sys-id record: dt about 3.33 ms
    command_unit='N m',
    command_limit=(12.0,),             # AK80-6 peak torque [TB]
    controller_name='effort_controller',
    base_link='base_link',
    end_effector_link='pendulum_tip',
    motor={
        'type': 'quasi_direct_drive',
        'gear_ratio': 6.0,             # AK80-6 [TB]
        'armature': (0.0,),            # the identified J already includes the rotor
        'driver_adds_gravity': False,
    },
    friction={
        'model': 'tau_f = Fv * qd + Fc * atan(atan_gain * qd) + offset',
        'viscous': (4.707e-2,),        # Fv, N m s/rad
        'coulomb_atan': (1.839e-1,),   # Fc, N m (URDF friction = Fc * pi / 2)
        'atan_gain': 100.0,            # s/rad
        'offset': (-7.586e-2,),        # N m
    },
    sensor={},
    citations=(_DFKI_SP,),
    description='DFKI torque-limited simple pendulum, one AK80-6 drive.',
)

#: Every shipped robot by name, in a stable order.
ROBOTS = MappingProxyType({info.name: info for info in (
    QUBE, CARTPOLE, WAM4, WAM7, PANDA, DOUBLE_PENDULUM, SIMPLE_PENDULUM)})
