"""The inverse -> multi-step schedule, its use as diffsim-fit's default, and command delays."""

from diffsim_ros import robots
from diffsim_ros.io.fit_estimator import estimator_config
from diffsim_ros.io.fit_options import build_parser
from diffsim_ros.sysid.dataset import Trajectory
from diffsim_ros.sysid.diffnea import DiffNEAConfig, simulation_schedule
from diffsim_ros.sysid.preprocess import delay_commands
import pytest
import torch

F64 = torch.float64


def _run(rate_hz: float = 250.0, samples: int = 50) -> Trajectory:
    t = torch.arange(samples, dtype=F64) / rate_hz
    q = torch.zeros(samples, 2, dtype=F64)
    u = torch.arange(samples, dtype=F64)[:, None]
    return Trajectory(t=t, q=q, qd=q.clone(), u=u, joint_names=('arm_joint', 'pendulum_joint'),
                      run='r')


def test_schedule_is_an_inverse_stage_then_a_rollout_stage_over_short_windows():
    keys = simulation_schedule(250.0, ['inertial', 'damping'], ['actuator'], window_s=0.1)
    config = DiffNEAConfig(actuator='qube_servo2', command_joints=('arm_joint',), **keys)
    first, second = config.schedule()
    assert (first.loss, first.groups) == ('inverse_dynamics', ('inertial', 'damping'))
    assert (second.loss, second.groups) == ('rollout', ('inertial', 'damping', 'actuator'))
    assert config.loss == 'rollout' and config.horizon == 25 == second.horizon
    assert config.window_stride == 100
    with pytest.raises(ValueError, match='groups'):
        simulation_schedule(250.0, ['inertia'])
    with pytest.raises(ValueError, match='rate_hz'):
        simulation_schedule(0.0, ['inertial'])


def test_diffsim_fit_defaults_to_the_schedule_unless_a_loss_is_configured(tmp_path):
    info = robots.get('qube')
    parser = build_parser()
    args = parser.parse_args(['x.csv', '--robot', 'qube', '--out', str(tmp_path / 'o')])
    config, _ = estimator_config(args, info, [_run(500.0)])
    assert [s.loss for s in config.schedule()] == ['inverse_dynamics', 'rollout']
    assert config.horizon == 50 and 'actuator' in config.schedule()[1].groups

    for text in ('loss: inverse_dynamics\n', 'adam_iterations: 50\n'):
        chosen = tmp_path / 'single.yaml'
        chosen.write_text(text, encoding='utf-8')
        args = parser.parse_args(['x.csv', '--robot', 'qube', '--out', str(tmp_path / 'o'),
                                  '--config', str(chosen)])
        config, _ = estimator_config(args, info, [_run()])
        assert config.stages == () and config.loss == 'inverse_dynamics'

    chosen.write_text('learn: [inertial]\n', encoding='utf-8')
    config, _ = estimator_config(args, info, [_run()])
    assert [s.groups for s in config.schedule()] == [('inertial',), ('inertial',)]

    args = parser.parse_args(['x.csv', '--robot', 'qube', '--out', str(tmp_path / 'o'),
                              '--max-iter', '7'])
    config, _ = estimator_config(args, info, [_run()])
    assert all(s.adam_iterations <= 7 for s in config.schedule())


def test_delay_commands_holds_the_first_command():
    run = _run(samples=6)
    late = delay_commands(run, 2)
    assert late.u[:, 0].tolist() == [0.0, 0.0, 0.0, 1.0, 2.0, 3.0]
    assert delay_commands(run, 0) is run
    assert delay_commands(run, 10).u[:, 0].tolist() == [0.0] * 6
    with pytest.raises(ValueError, match='>= 0'):
        delay_commands(run, -1)


def test_torque_weight_adds_the_inverse_dynamics_loss_to_a_rollout_stage():
    from diffsim_ros.sysid.diffnea import fit_diffnea, Stage
    model = robots.interface('double_pendulum').nominal_model()
    t = torch.arange(200, dtype=F64) / 200.0
    q = torch.stack((0.5 * torch.sin(3 * t), 0.4 * torch.cos(2 * t)), -1)
    qd = torch.stack((1.5 * torch.cos(3 * t), -0.8 * torch.sin(2 * t)), -1)
    qdd = torch.stack((-4.5 * torch.sin(3 * t), -1.6 * torch.cos(2 * t)), -1)
    tau = torch.randn(200, 2, generator=torch.Generator().manual_seed(0), dtype=F64)
    run = Trajectory(t=t, q=q, qd=qd, qdd=qdd, tau=tau, joint_names=model.joint_names,
                     run='r')
    losses = {}
    for weight in (0.0, 2.0):
        stage = Stage(groups=('damping',), loss='rollout', adam_iterations=1, lr=1e-12,
                      torque_weight=weight)
        config = DiffNEAConfig(learn=('damping',), loss='rollout', horizon=10,
                               stages=(stage,), eval_every=1)
        result = fit_diffnea(model, run, config=config)
        losses[weight] = result.history['train'][0]
    inverse = fit_diffnea(model, run, config=DiffNEAConfig(
        learn=('damping',), adam_iterations=1, lr=1e-12)).history['train'][0]
    # the objective of the weighted stage is the rollout loss plus twice the torque loss
    assert losses[2.0] == pytest.approx(losses[0.0] + 2.0 * inverse, rel=1e-9)
    assert inverse > 0.1
    assert DiffNEAConfig(**simulation_schedule(200.0, ['inertial'], torque_weight=1.0)
                         ).schedule()[1].torque_weight == 1.0
    with pytest.raises(ValueError, match='torque_weight'):
        Stage(torque_weight=-1.0)


def test_diffsim_fit_keeps_measured_torques_in_the_refinement_of_torque_sensing_robots(
        tmp_path):
    parser = build_parser()
    weights = {}
    for robot, run in (('panda', None), ('qube', _run(500.0))):
        args = parser.parse_args(['x.csv', '--robot', robot, '--out', str(tmp_path / 'o')])
        if run is None:
            names = robots.interface('panda').nominal_model().joint_names
            t = torch.arange(50, dtype=F64) / 200.0
            zeros = torch.zeros(50, 7, dtype=F64)
            run = Trajectory(t=t, q=zeros, qd=zeros, tau=zeros, joint_names=names, run='r')
        config, _ = estimator_config(args, robots.get(robot), [run])
        weights[robot] = config.schedule()[1].torque_weight
    assert weights == {'panda': 1.0, 'qube': 0.0}


def test_a_data_sets_friction_model_yields_to_a_config_that_names_one(tmp_path):
    parser = build_parser()
    names = robots.interface('panda').nominal_model().joint_names
    t = torch.arange(50, dtype=F64) / 200.0
    zeros = torch.zeros(50, 7, dtype=F64)
    run = Trajectory(t=t, q=zeros, qd=zeros, tau=zeros, joint_names=names, run='r')
    config_file = tmp_path / 'c.yaml'
    config_file.write_text('friction_model: stribeck\n')
    chosen = {}
    for label, extra in (('data set', []), ('config', ['--config', str(config_file)])):
        args = parser.parse_args(['x.csv', '--robot', 'panda', '--out', str(tmp_path / 'o'),
                                  *extra])
        args.actuator = 'sigmoid'   # what apply_defaults sets for the Panda data set
        config, _ = estimator_config(args, robots.get('panda'), [run], ('actuator',))
        chosen[label] = config.friction_model
    assert chosen == {'data set': 'sigmoid', 'config': 'stribeck'}
