"""
Differentiable rigid-body dynamics in PyTorch (no ROS, no files beyond URDF text).

Functions take ``(model, state...)`` and return new tensors; see docs/conventions.md for
frames, units and batching rules.  :func:`rnea_derivatives` and :func:`aba_derivatives`
return the Jacobians of inverse and forward dynamics from one call without autograd
(Pinocchio's ``computeRNEADerivatives`` / ``computeABADerivatives``; :mod:`.derivatives`).
"""

from .actuators import (CoulombFriction, DCMotor, FFNN, FrictionModel, make_friction,
                        NNFriction, NNResidual, NoFriction, SigmoidFriction, StribeckFriction,
                        ViscousFriction)
from .compiled import compile_algorithm
from .configuration import (check_configuration, configuration_sizes, difference,
                            free_joint_from_mujoco, free_joint_to_mujoco, from_mujoco,
                            from_ros_pose, from_ros_twist, integrate, momentum_hold, normalize,
                            QUATERNION_NORM_TOLERANCE, root_configuration, root_pose_matrix,
                            semi_implicit_update, to_mujoco, to_ros_pose, to_ros_twist)
from .contact import (box_vertices, compliant_contact_force, contact_kinematics,
                      CONTACT_METHODS, CONTACT_PARAMETER_UNITS, contact_parameters_from_theta,
                      contact_parameters_to_theta, contact_step, ContactFrame, ContactModel,
                      ContactStep, ground_frame)
from .contact_solver import contact_residual, project_friction_cone, solve_contact_impulses
from .energy import kinetic_energy, potential_energy
from .errors import DiffsimError, ShapeError, UnsupportedJointError, URDFError
from .integrators import (forward_dynamics, INTEGRATORS, joint_friction, rk4, rollout,
                          semi_implicit_euler, with_joint_friction)
from .kinematics import body_poses, forward_kinematics, jacobian, joint_transforms
from .model import KinematicTree, PARAMETER_FIELDS, RobotModel
from .native import aba_native, crba_native, feedback_rollout_native, native_available, \
    rnea_native
from .parameterization import (DiffNEAParameterization, inertial_from_mass_com_inertia,
                               inertial_from_pseudo_inertia,
                               InertialParameterization, is_physically_consistent,
                               KinematicParameterization, LogCholeskyParameterization,
                               make_parameterization, mass_com_inertia, pseudo_inertia,
                               RawParameterization,
                               regularize_inertial)
from .regressor import joint_torque_regressor
from .spatial import (matrix_to_quat, quat_conjugate, quat_exp, quat_log, quat_multiply,
                      quat_rotate, quat_to_matrix)
from .urdf import load_urdf
# Last: the public rnea/aba/crba are the dispatching functions (the names would otherwise
# be bound to their submodules, which the imports above load).
from .dispatch import aba, BackendError, crba, get_backend, rnea, set_backend  # noqa: I100
from .derivatives import aba_derivatives, rnea_derivatives  # noqa: I100

__all__ = [
    'BackendError', 'CONTACT_METHODS', 'CONTACT_PARAMETER_UNITS', 'ContactFrame',
    'ContactModel', 'ContactStep', 'box_vertices', 'compliant_contact_force',
    'contact_kinematics', 'contact_parameters_from_theta', 'contact_parameters_to_theta',
    'contact_residual', 'contact_step', 'ground_frame', 'project_friction_cone',
    'solve_contact_impulses',
    'CoulombFriction', 'DCMotor', 'DiffNEAParameterization', 'DiffsimError', 'FFNN',
    'FrictionModel', 'INTEGRATORS', 'InertialParameterization', 'KinematicParameterization',
    'KinematicTree', 'LogCholeskyParameterization', 'NNFriction', 'NNResidual', 'NoFriction',
    'PARAMETER_FIELDS', 'QUATERNION_NORM_TOLERANCE', 'RawParameterization', 'RobotModel',
    'ShapeError', 'SigmoidFriction',
    'StribeckFriction',
    'URDFError', 'UnsupportedJointError', 'ViscousFriction', 'aba', 'aba_derivatives',
    'aba_native', 'body_poses',
    'check_configuration', 'compile_algorithm', 'configuration_sizes', 'crba', 'crba_native',
    'difference', 'feedback_rollout_native', 'forward_dynamics', 'forward_kinematics',
    'free_joint_from_mujoco', 'free_joint_to_mujoco',
    'from_mujoco', 'from_ros_pose', 'from_ros_twist', 'get_backend', 'integrate',
    'inertial_from_mass_com_inertia', 'inertial_from_pseudo_inertia',
    'is_physically_consistent', 'jacobian', 'joint_friction', 'joint_torque_regressor',
    'joint_transforms', 'kinetic_energy', 'load_urdf', 'make_friction', 'native_available',
    'make_parameterization', 'momentum_hold', 'mass_com_inertia', 'matrix_to_quat', 'normalize',
    'potential_energy', 'pseudo_inertia', 'quat_conjugate', 'quat_exp', 'quat_log',
    'quat_multiply', 'quat_rotate', 'quat_to_matrix',
    'regularize_inertial', 'rk4', 'rnea', 'rnea_derivatives', 'rnea_native', 'rollout',
    'root_configuration',
    'root_pose_matrix', 'semi_implicit_euler', 'semi_implicit_update', 'set_backend',
    'to_mujoco', 'to_ros_pose', 'to_ros_twist',
    'with_joint_friction',
]
