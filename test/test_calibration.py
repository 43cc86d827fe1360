"""
Task-space calibration and payload identification on a simulated Barrett WAM (MuJoCo plant).

The plant (``diffsim_ros.sim``) is the ground truth: a tool frame attached with
:class:`~diffsim_ros.sim.ToolOffset` and tracked by a simulated mocap system with 0.3 mm /
3 mrad noise, and a payload attached with :class:`~diffsim_ros.sim.Payload`. The arm is moved
by a joint PD controller around a smooth multisine reference with computed-torque feedforward
(``rnea`` of the known model without the payload); open-loop torque excitation drives the WAM
into its joint limits.
"""

import math

from diffsim_ros.core import forward_kinematics
from diffsim_ros.core.rnea import rnea
from diffsim_ros.core.spatial import transform_inverse
from diffsim_ros.sim import MujocoPlant, nominal_model, Payload, PlantConfig, ToolOffset
from diffsim_ros.sysid.calibration import (_perturb, _tool_residuals, calibrate_tool,
                                           CalibrationConfig, identify_payload, PayloadConfig,
                                           pose_errors, pose_loss, predict_tool_poses, so3_exp,
                                           so3_log, tool_transform)
from diffsim_ros.sysid.dataset import Trajectory
import numpy as np
import pytest
import torch

F64 = torch.float64
LINK = 'wam/tool_link'
TOOL = ToolOffset(link=LINK, xyz=(0.03, -0.02, 0.035), rpy=(0.05, -0.1, 0.15), name='marker')
PAYLOAD = Payload(link=LINK, mass=1.5, com=(0.02, -0.03, 0.06),
                  inertia=(0.004, 0.0, 0.0, 0.005, 0.0, 0.003))
# PD gains (N m/rad, N m s/rad) and reference centre / amplitude (rad) per WAM-4 joint; the
# shoulder stays near upright so the payload's gravity torque stays within its 20 N m limit.
KP = np.array([200.0, 300.0, 100.0, 100.0])
KD = np.array([20.0, 20.0, 10.0, 10.0])
CENTER = [0.0, 0.0, 0.0, 0.5]
AMPLITUDE = [1.2, 0.35, 1.2, 0.5]


def reference(steps, rate_hz, generator, components=4):
    """Return a smooth multisine joint reference ``(q, qd, qdd)``, each ``(steps, 4)``."""
    t = torch.arange(steps, dtype=F64) / rate_hz
    n = len(CENTER)
    omega = 2 * math.pi * (0.1 + 0.5 * torch.rand(n, components, generator=generator,
                                                  dtype=F64))
    phase = 2 * math.pi * torch.rand(n, components, generator=generator, dtype=F64)
    arg = omega * t[:, None, None] + phase
    a = torch.tensor(AMPLITUDE, dtype=F64)[:, None] / components
    q = torch.tensor(CENTER, dtype=F64) + (a * torch.sin(arg)).sum(-1)
    qd = (a * omega * torch.cos(arg)).sum(-1)
    qdd = (-a * omega * omega * torch.sin(arg)).sum(-1)
    return q, qd, qdd


def run_pd(plant, duration, seed, **kwargs):
    """Track the reference with PD + computed-torque feedforward on the nominal model."""
    steps = int(duration * plant.rate_hz)
    q_ref, qd_ref, qdd_ref = reference(steps, plant.rate_hz, torch.Generator().manual_seed(seed))
    feedforward = rnea(plant.nominal_model, q_ref, qd_ref, qdd_ref).numpy()
    q_ref, qd_ref = q_ref.numpy(), qd_ref.numpy()

    def controller(measurement):
        k = min(int(round(measurement.t * plant.rate_hz)), steps - 1)
        return feedforward[k] + KP * (q_ref[k] - measurement.q) + KD * (qd_ref[k] - measurement.qd)
    traj = plant.run(controller, steps=steps, q0=q_ref[0], qd0=qd_ref[0], **kwargs)
    # the arm must have stayed on the reference, far from its joint limits
    assert float((traj.q - torch.from_numpy(q_ref)).abs().max()) < 0.1
    return traj


@pytest.fixture(scope='module')
def tool_data():
    plant = MujocoPlant(PlantConfig(robot='wam4', tool=TOOL, pose_noise_std=(3e-4, 3e-3),
                                    seed=3))
    traj = run_pd(plant, 3.0, seed=0)
    return plant.nominal_model, traj


@pytest.fixture(scope='module')
def payload_data():
    plant = MujocoPlant(PlantConfig(robot='wam4', payload=PAYLOAD, q_noise_std=1e-4,
                                    qd_noise_std=1e-3, seed=4))
    traj = run_pd(plant, 6.0, seed=1, true_acceleration=True)
    generator = torch.Generator().manual_seed(5)
    noisy_tau = traj.tau + 0.05 * torch.randn(traj.tau.shape, generator=generator, dtype=F64)
    return plant, traj.replace(tau=noisy_tau)


def tool_errors(T_estimate, T_true):
    """Return ``(position error m, rotation error rad)`` between two tool transforms."""
    position, angle = pose_errors(T_estimate, T_true)
    return float(position), float(angle)


# -- observation model ---------------------------------------------------------------------------
def test_so3_exp_log_roundtrip_and_small_angles():
    generator = torch.Generator().manual_seed(0)
    rotvec = torch.randn(50, 3, generator=generator, dtype=F64)
    angle = torch.linspace(0, 3.0, 50, dtype=F64)[:, None]
    rotvec = rotvec / rotvec.norm(dim=-1, keepdim=True) * angle
    R = so3_exp(rotvec)
    assert torch.allclose(R @ R.mT, torch.eye(3, dtype=F64).expand(50, 3, 3), atol=1e-13)
    assert torch.allclose(so3_log(R), rotvec, atol=1e-10)
    tiny = torch.tensor([1e-9, -2e-9, 3e-10], dtype=F64)
    assert torch.allclose(so3_log(so3_exp(tiny)), tiny, rtol=1e-6, atol=0)


def test_pose_loss_is_zero_at_truth_and_differentiable():
    model = nominal_model('wam4')
    generator = torch.Generator().manual_seed(1)
    q = 0.5 * torch.randn(20, model.n, generator=generator, dtype=F64)
    xyz = torch.tensor([0.03, -0.02, 0.035], dtype=F64)
    rotvec = torch.tensor([0.05, -0.1, 0.15], dtype=F64)
    T_world_mocap = tool_transform(torch.tensor([0.5, 0.1, -0.2], dtype=F64),
                                   torch.tensor([0.0, 0.2, 1.0], dtype=F64))
    measured = predict_tool_poses(model, q, LINK, tool_transform(xyz, rotvec), T_world_mocap)
    world = forward_kinematics(model, q)[:, model.link_index(LINK)] @ tool_transform(xyz, rotvec)
    assert torch.allclose(transform_inverse(T_world_mocap) @ world, measured, atol=1e-14)
    loss = pose_loss(model, q, measured, LINK, xyz, rotvec, T_world_mocap=T_world_mocap)
    assert float(loss) < 1e-20

    def f(xyz_, rotvec_, mocap_xyz):
        T_wm = tool_transform(mocap_xyz, torch.tensor([0.0, 0.2, 1.0], dtype=F64))
        return pose_loss(model, q, measured, LINK, xyz_, rotvec_, T_world_mocap=T_wm)
    args = tuple(x.detach().clone().requires_grad_(True) for x in
                 (xyz + 0.01, rotvec - 0.02, torch.tensor([0.49, 0.12, -0.2], dtype=F64)))
    assert torch.autograd.gradcheck(f, args)


def test_levenberg_marquardt_jacobian_matches_finite_differences():
    generator = torch.Generator().manual_seed(2)

    def random_pose(*shape, angle=1.0):
        return tool_transform(torch.randn(*shape, 3, generator=generator, dtype=F64),
                              angle * torch.randn(*shape, 3, generator=generator, dtype=F64))
    T_A, T_tool, T_world_mocap = random_pose(6), random_pose(), random_pose()
    # measured poses off the model by up to ~1 rad, where J_l^-1 differs from identity
    T_B = transform_inverse(T_world_mocap) @ T_A @ T_tool @ random_pose(6, angle=0.5)
    scales = (1e-3, 1e-2)
    for mocap in (None, T_world_mocap):
        _, J = _tool_residuals(T_A, T_B, T_tool, mocap, scales)
        k, h = J.shape[1], 1e-6

        def residuals(delta):
            moved = None if mocap is None else _perturb(mocap, delta[6:])
            return _tool_residuals(T_A, T_B, _perturb(T_tool, delta[:6]), moved, scales)[0]
        numeric = torch.stack([(residuals(h * e) - residuals(-h * e)) / (2 * h)
                               for e in torch.eye(k, dtype=F64)], -1)
        assert torch.allclose(J, numeric, rtol=1e-6, atol=1e-4)


# -- tool calibration ----------------------------------------------------------------------------
def test_calibrate_tool_recovers_offset_from_noisy_mocap(tool_data):
    model, traj = tool_data
    assert traj.poses['marker'].shape == (len(traj), 4, 4)
    result = calibrate_tool(model, traj, LINK, 'marker')
    position, angle = tool_errors(result.T_link_tool, TOOL.transform())
    assert position < 1e-3          # the validation target: 1 mm on a 5 cm offset
    assert position < 1e-4          # what 1500 samples of 0.3 mm noise actually give
    assert angle < 1e-3
    # residuals are the mocap noise: 0.3 mm per axis, 3 mrad per axis
    assert result.rms_position == pytest.approx(3e-4 * math.sqrt(3), rel=0.1)
    assert result.rms_angle == pytest.approx(3e-3 * math.sqrt(3), rel=0.1)
    assert result.converged and result.samples == len(traj)
    assert result.xyz == pytest.approx(TOOL.xyz, abs=1e-4)
    assert result.rpy == pytest.approx(TOOL.rpy, abs=2e-3)
    assert result.parameters['tool/x'] == (pytest.approx(TOOL.xyz[0], abs=1e-4), 'm')
    assert result.parameters['tool/yaw'][1] == 'rad'
    assert 'mocap/x' not in result.parameters
    assert result.to_dict()['body'] == 'marker'


def test_calibrate_tool_estimates_mocap_frame(tool_data):
    model, traj = tool_data
    T_world_mocap = tool_transform(torch.tensor([1.2, -0.4, 0.1], dtype=F64),
                                   torch.tensor([0.3, -0.2, 2.0], dtype=F64))
    in_mocap = {'marker': transform_inverse(T_world_mocap) @ traj.poses['marker']}
    shifted = traj.replace(poses=in_mocap)
    config = CalibrationConfig(estimate_mocap_frame=True)
    for init in (True, False):
        result = calibrate_tool(model, [shifted], LINK, 'marker',
                                config.replace(closed_form_init=init))
        position, angle = tool_errors(result.T_link_tool, TOOL.transform())
        assert position < 1e-3 and angle < 2e-3
        frame_position, frame_angle = tool_errors(result.T_world_mocap, T_world_mocap)
        assert frame_position < 1e-3 and frame_angle < 1e-3
        assert result.rms_position == pytest.approx(3e-4 * math.sqrt(3), rel=0.1)
        assert 'mocap/yaw' in result.parameters
    # ignoring the frame offset cannot explain the data
    wrong = calibrate_tool(model, shifted, LINK, 'marker')
    assert wrong.rms_position > 0.1


def test_calibrate_tool_skips_dropouts(tool_data):
    model, traj = tool_data
    poses = traj.poses['marker'].clone()
    poses[::7] = float('nan')
    result = calibrate_tool(model, traj.replace(poses={'marker': poses}), LINK, 'marker')
    assert result.samples == len(traj) - len(range(0, len(traj), 7))
    assert tool_errors(result.T_link_tool, TOOL.transform())[0] < 1e-3


# -- payload identification ----------------------------------------------------------------------
def test_identify_payload_recovers_mass_and_com(payload_data):
    plant, traj = payload_data
    result = identify_payload(plant.nominal_model, traj, LINK)
    assert result.method == 'payload'
    mass = result.value('payload/mass')
    com = np.array([result.value(f'payload/com_{axis}') for axis in 'xyz'])
    assert abs(mass - PAYLOAD.mass) / PAYLOAD.mass < 0.02
    com_error = np.linalg.norm(com - np.array(PAYLOAD.com)) / np.linalg.norm(PAYLOAD.com)
    assert com_error < 0.02
    assert result.unit('payload/mass') == 'kg' and result.unit('payload/com_x') == 'm'
    assert result.unit('payload/ixx') == 'kg m^2'
    assert result.metrics['consistent']
    # the fitted model explains the torques down to their noise (0.05 N m)
    assert max(result.metrics['torque_rmse']) < 0.06
    assert max(result.metrics['torque_rmse_before']) > 1.0
    body = plant.true_model.tree.link_bodies[plant.true_model.link_index(LINK)]
    assert torch.allclose(result.model.inertial[body, :4], plant.true_model.inertial[body, :4],
                          rtol=0.02, atol=2e-3)
    assert result.to_dict()['parameters']['payload/mass']['unit'] == 'kg'


def test_identify_payload_is_exact_on_noiseless_torques(payload_data):
    plant, traj = payload_data
    exact = rnea(plant.true_model, traj.q, traj.qd, traj.qdd)
    result = identify_payload(plant.nominal_model, traj.crop(0, 1500).replace(tau=exact[:1500]),
                              LINK)
    assert result.value('payload/mass') == pytest.approx(PAYLOAD.mass, rel=1e-8)
    com = [result.value(f'payload/com_{axis}') for axis in 'xyz']
    assert com == pytest.approx(PAYLOAD.com, abs=1e-9)
    inertia = [result.value(f'payload/{name}') for name in
               ('ixx', 'ixy', 'ixz', 'iyy', 'iyz', 'izz')]
    assert inertia == pytest.approx(PAYLOAD.inertia, abs=1e-7)
    assert result.metrics['least_squares_consistent'] and result.metrics['loss'] < 1e-12
    assert torch.allclose(result.model.inertial, plant.true_model.inertial, atol=1e-7)


def test_identify_payload_diffnea_parameterization(payload_data):
    plant, traj = payload_data
    result = identify_payload(plant.nominal_model, traj.crop(0, 1000), LINK,
                              PayloadConfig.from_dict({'parameterization': 'diffnea'}))
    assert abs(result.value('payload/mass') - PAYLOAD.mass) / PAYLOAD.mass < 0.05
    assert result.metrics['consistent']


# -- errors --------------------------------------------------------------------------------------
def test_unknown_link_and_body_list_valid_names(tool_data):
    model, traj = tool_data
    with pytest.raises(KeyError, match='wam/forearm_link'):
        calibrate_tool(model, traj, 'wam/no_such_link', 'marker')
    with pytest.raises(KeyError, match='tracked bodies: marker, wam/tool_link'):
        calibrate_tool(model, traj, LINK, 'no_such_body')
    with pytest.raises(KeyError, match='wam/forearm_link'):
        identify_payload(model, traj, 'wam/no_such_link')


def test_missing_data_errors(tool_data):
    model, traj = tool_data
    with pytest.raises(ValueError, match='no tracked poses'):
        calibrate_tool(model, traj.replace(poses={}), LINK, 'marker')
    short = Trajectory(t=traj.t[:2], q=traj.q[:2], joint_names=traj.joint_names,
                       poses={'marker': traj.poses['marker'][:2]}, run='short')
    with pytest.raises(ValueError, match='at least 3'):
        calibrate_tool(model, short, LINK, 'marker')
    with pytest.raises(ValueError, match="no 'qdd'"):
        identify_payload(model, traj, LINK)
    with pytest.raises(ValueError, match="no 'tau'"):
        identify_payload(model, traj.replace(qdd=traj.qd, tau=None), LINK)
    with pytest.raises(ValueError, match='fixed to the base'):
        identify_payload(model, traj.replace(qdd=traj.qd), 'wam/base_link')
    with pytest.raises(ValueError, match='at least one Trajectory'):
        calibrate_tool(model, [], LINK, 'marker')


def test_configs_reject_unknown_keys_and_bad_values():
    with pytest.raises(ValueError, match='valid keys'):
        CalibrationConfig.from_dict({'position_std': 1e-3})
    with pytest.raises(ValueError, match='position_scale'):
        CalibrationConfig(position_scale=0.0)
    with pytest.raises(ValueError, match="'log_cholesky'"):
        PayloadConfig(parameterization='raw')
    assert CalibrationConfig.from_dict({'estimate_mocap_frame': True}).estimate_mocap_frame
