"""
A fit's friction module travels whole: model document, ``params.yaml``, every consumer.

``diffsim-fit --actuator sigmoid`` (Gaz et al.'s offset sigmoids, which a URDF cannot carry)
writes the model document into ``params.yaml``; :func:`~diffsim_ros.io.fits.load_fit` reads
it back with the same torques to 1e-12, hostile documents are refused, the controllers'
dynamics, the monitor's prediction and the model gate apply the module, the nodes start from
``model_file`` (real DDS traffic, composed in one process) and refuse a bad one with one
``[ERROR]`` line, and ``diffsim-sim-eval --model`` runs an episode on it.
"""

import json
from pathlib import Path

from diffsim_ros import robots
from diffsim_ros.control.dynamics import ModelDynamics
from diffsim_ros.core import aba, rollout
from diffsim_ros.core.actuators import make_friction, NNFriction, SigmoidFriction
from diffsim_ros.io import write_csv
from diffsim_ros.io.fit_cli import main as fit_main
from diffsim_ros.io.fits import FitFileError, load_fit, write_model_document
from diffsim_ros.nodes.identifier import Identifier
from diffsim_ros.nodes.model_file import load_model_file
from diffsim_ros.nodes.monitor import MonitorNode
from diffsim_ros.nodes.mpc import MpcNode
from diffsim_ros.nodes.params import parameter_overrides, ParameterError
from diffsim_ros.robots.gate import judge_model, ModelGateConfig, prediction_error
from diffsim_ros.robots.message import load_model_message, model_message, ModelMessageError
from diffsim_ros.robots.prediction import predict_window
from diffsim_ros.sim import excitation_for, MujocoPlant, PlantConfig
from diffsim_ros.sim_eval import main as sim_eval_main
from diffsim_ros.sysid.losses import state_scale
import numpy as np
import pytest
import rclpy
from rclpy.parameter import Parameter
from rclpy.qos import DurabilityPolicy, QoSProfile
from ros_helpers import wait_for
from std_msgs.msg import String
from test_node_startup import assert_refused
import torch
import yaml

pytest_plugins = ['ros_helpers']


class Result:
    """Stands in for an identification result: what model_message reads of one."""

    def __init__(self, model, friction, actuator=None):
        self.model, self.friction, self.actuator = model, friction, actuator
        self.std, self.method, self.coulomb_eps = {}, 'diffnea', 0.01


def sigmoid(n, seed=0):
    """Return a sigmoid friction with per-joint coefficients of Gaz et al.'s magnitude."""
    generator = torch.Generator().manual_seed(seed)

    def draw(low, high):
        return low + (high - low) * torch.rand(n, generator=generator, dtype=torch.float64)
    return SigmoidFriction(n, phi1=draw(0.05, 0.5), phi2=draw(5.0, 20.0),
                           phi3=draw(-0.05, 0.05), dtype=torch.float64)


def states(n, count=64, seed=1):
    """Return random ``(q, qd)`` of ``count`` rows, velocities up to 2 rad/s."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.rand(count, n, generator=generator, dtype=torch.float64) - 0.5
    qd = 4.0 * torch.rand(count, n, generator=generator, dtype=torch.float64) - 2.0
    return q, qd


# -- the document ----------------------------------------------------------------------------
@pytest.mark.parametrize('name', ['qube', 'panda'])
def test_sigmoid_friction_round_trips_through_the_document_and_params_yaml(name, tmp_path):
    interface = robots.interface(name)
    model = interface.nominal_model()
    friction = sigmoid(model.n)
    document = model_message(Result(model, friction, interface.actuator()), interface)
    assert document['version'] == 2 and document['omitted'] == []
    assert document['friction_model']['name'] == 'sigmoid'
    params = tmp_path / 'params.yaml'
    params.write_text('method: diffnea\n', encoding='utf-8')
    write_model_document(params, document)
    loaded = [load_model_message(json.dumps(document), interface), load_fit(tmp_path, interface)]
    q, qd = states(model.n)
    u = torch.rand(len(q), len(interface.command_joints), dtype=torch.float64)
    expected = interface.torque_fn(model, interface.actuator(), friction=friction)(q, qd, u)
    without = interface.torque_fn(model, interface.actuator())(q, qd, u)
    assert float((expected - without).detach().abs().max()) > 1e-3   # the module matters
    for got in loaded:
        model_2, actuator_2, friction_2 = (got.model, got.actuator, got.friction) \
            if hasattr(got, 'model') else got
        assert isinstance(friction_2, SigmoidFriction)
        torque = interface.torque_fn(model_2, actuator_2, friction=friction_2)(q, qd, u)
        assert torch.allclose(torque, expected, rtol=0.0, atol=1e-12)
    assert loaded[1].path == params and loaded[1].method == 'diffnea'


def test_stribeck_keeps_its_smoothing_velocity_and_networks_stay_omitted():
    qube = robots.interface('qube')
    model = qube.nominal_model()
    stribeck = make_friction('stribeck', 2, coulomb=[0.01, 0.002], static=[0.02, 0.003],
                             viscous=[1e-4, 1e-5], stribeck_velocity=[0.1, 0.2], eps=0.05,
                             dtype=torch.float64)
    document = model_message(Result(model, stribeck), qube)
    assert document['friction_model']['eps'] == 0.05
    _, _, loaded = load_model_message(json.dumps(document), qube)
    q, qd = states(2)
    assert torch.allclose(loaded(q, qd), stribeck(q, qd), rtol=0.0, atol=1e-12)
    network = model_message(Result(model, NNFriction(2, dtype=torch.float64)), qube)
    assert network['friction_model'] is None and network['omitted'] == ['friction NNFriction']
    assert load_model_message(json.dumps(network), qube)[2] is None
    version_1 = {key: value for key, value in network.items() if key != 'friction_model'}
    version_1['version'] = 1   # a document of the previous version still loads
    assert load_model_message(json.dumps(version_1), qube)[0] is not None


def test_hostile_friction_documents_are_refused():
    qube = robots.interface('qube')
    good = model_message(Result(qube.nominal_model(), sigmoid(2)), qube)
    load_model_message(json.dumps(good), qube)

    def changed(edit):
        document = json.loads(json.dumps(good))
        edit(document['friction_model'] if 'friction_model' in document else document)
        return json.dumps(document)

    def coefficient(key, values):
        return changed(lambda f: f['coefficients'].update({key: values}))
    bad = {
        'unknown name': changed(lambda f: f.update(name='magic')),
        'neural name': changed(lambda f: f.update(name='nn-friction')),
        'no name': changed(lambda f: f.pop('name')),
        'not an object': json.dumps({**good, 'friction_model': 'sigmoid'}),
        'NaN': json.dumps(good).replace(str(good['friction_model']['coefficients']['phi1'][0]),
                                        'NaN', 1),
        'null': coefficient('phi1', [None, 0.1]),
        'too short': coefficient('phi1', [0.1]),
        'too long': coefficient('phi3', [0.0, 0.0, 0.0]),
        'negative phi1': coefficient('phi1', [-0.1, 0.1]),
        'negative phi2': coefficient('phi2', [-5.0, 5.0]),
        'zero phi2': coefficient('phi2', [0.0, 5.0]),
        'text': coefficient('phi3', ['0.0', 0.0]),
        'bool': coefficient('phi3', [True, 0.0]),
        'nested': coefficient('phi1', [[0.1], [0.1]]),
        'missing coefficient': changed(lambda f: f['coefficients'].pop('phi3')),
        'extra coefficient': coefficient('phi4', [0.0, 0.0]),
        'extra key': changed(lambda f: f.update(eps=0.01)),   # a sigmoid has no eps
        'version 1 with friction': json.dumps({**good, 'version': 1}),
    }
    for what, text in bad.items():
        with pytest.raises(ModelMessageError):
            load_model_message(text, qube)
            pytest.fail(f'{what} was loaded')


def test_check_model_bounds_the_friction_module():
    qube = robots.interface('qube')
    model = qube.nominal_model()
    plausible = SigmoidFriction(2, phi1=[0.01, 0.001], phi2=[10.0, 10.0], phi3=[0.01, 0.0],
                                dtype=torch.float64)
    assert qube.check_model(model, None, plausible) == []
    absurd = SigmoidFriction(2, phi1=[1e3, 1e3], dtype=torch.float64)
    problems = qube.check_model(model, None, absurd)
    assert len(problems) == 2 and 'SigmoidFriction friction' in problems[0]
    assert 'has 3 joints' in qube.check_model(model, None, sigmoid(3))[0]


# -- every consumer applies it ------------------------------------------------------------------
@pytest.mark.parametrize('name', ['qube', 'panda'])
def test_model_dynamics_step_differs_by_exactly_the_friction_torque(name):
    interface = robots.interface(name)
    model = interface.nominal_model()
    friction = sigmoid(model.n)
    dt = 0.01
    plain = ModelDynamics.for_robot(name, model, dt, native=True)
    with_module = ModelDynamics.for_robot(name, model, dt, native=True, friction_model=friction)
    assert not with_module.native   # the C++ kernel has the URDF fields only
    q, qd = states(model.n, 8)
    u = 0.1 * torch.randn(8, plain.nu, dtype=torch.float64,
                          generator=torch.Generator().manual_seed(2))
    x = torch.cat((q, qd), -1)
    with torch.no_grad():
        step_plain, step_module = plain.step(x, u), with_module.step(x, u)
        tau = plain.torque(q, qd, u)
        # semi-implicit Euler: qd' = qd + dt aba(q, qd, tau), q' = q + dt qd'
        expected_qd = qd + dt * aba(model, q, qd, tau - friction(q, qd))
    assert torch.allclose(step_module[:, model.n:], expected_qd, rtol=0.0, atol=1e-12)
    assert torch.allclose(step_module[:, :model.n], q + dt * expected_qd, rtol=0.0, atol=1e-12)
    assert float((step_module - step_plain).abs().max()) > 1e-5
    # with_model keeps the module unless told otherwise; a float32 copy leaves it untouched
    assert with_module.with_model(model).friction_model is friction
    assert with_module.with_model(model, friction_model=None).friction_model is None
    single = with_module.with_model(model.to(dtype=torch.float32))
    assert single.friction_model is not friction
    assert next(single.friction_model.parameters()).dtype == torch.float32
    assert next(friction.parameters()).dtype == torch.float64


def test_monitor_prediction_and_model_gate_use_the_friction_module():
    qube = robots.interface('qube')
    info, model = robots.get('qube'), qube.nominal_model()
    friction = SigmoidFriction(2, phi1=[0.02, 0.002], phi2=[10.0, 10.0], phi3=[0.01, 0.0],
                               dtype=torch.float64)
    dt, steps = 0.01, 100
    u = 2.0 * torch.sin(torch.arange(steps, dtype=torch.float64) * 0.2)[:, None]
    x0 = torch.tensor([0.0, 0.1, 0.0, 0.0], dtype=torch.float64)
    with torch.no_grad():   # the robot: the model with the module
        x = rollout(model, x0, u, dt, 'rk4', qube.torque_fn(model, friction=friction)).numpy()
    t = dt * np.arange(steps + 1)
    with_module = predict_window(model, info, t, x[:, :2], x[:, 2:], t[:-1], u.numpy(), 0.5,
                                 dt, 'rk4', friction=friction)
    without = predict_window(model, info, t, x[:, :2], x[:, 2:], t[:-1], u.numpy(), 0.5, dt,
                             'rk4')
    assert with_module['nmse'] < 1e-20 < 1e-4 < without['nmse']
    data = {'t': t, 'q': x[:, :2], 'qd': x[:, 2:], 't_cmd': t[:-1], 'u': u.numpy()}
    scale = state_scale(torch.as_tensor(x[:, :2]), torch.as_tensor(x[:, 2:]),
                        model.tree.revolute_mask.to(torch.float64))
    assert prediction_error(qube, model, None, data, 0.2, dt, scale, friction) < 1e-20
    # the same model with the module predicts better than the one in use without it
    config = ModelGateConfig(duration=1.0, horizon=0.2, dt=dt)
    decision = judge_model(qube, model, None, model, None, data, config,
                           candidate_friction=friction)
    assert decision.accepted and decision.compared
    assert decision.candidate_error < 1e-20 < decision.current_error
    refused = judge_model(qube, model, None, model, None, data, config,
                          current_friction=friction)
    assert not refused.accepted


# -- diffsim-fit, the nodes and diffsim-sim-eval -----------------------------------------------
@pytest.fixture(scope='module')
def fit_folder(tmp_path_factory) -> Path:
    """Fit a Qube recording (two 4 s multisine runs at 100 Hz) with sigmoid friction."""
    folder = tmp_path_factory.mktemp('fit')
    plant = MujocoPlant(PlantConfig(robot='qube', rate_hz=100.0, param_error=0.3, seed=3,
                                    joint_limits=False, encoder_counts_per_rev=0))
    runs = []
    for k in range(2):
        u = excitation_for(plant, 'multisine', duration=4.0, fraction=0.3, band=(0.2, 2.0),
                           generator=torch.Generator().manual_seed(30 + k))
        runs.append(plant.run(u, run=f'run{k}').replace(poses={}))
    data = write_csv(folder / 'qube.csv', runs)
    out = folder / 'fit'
    code = fit_main([str(data), '--robot', 'qube', '--actuator', 'sigmoid', '--max-iter', '30',
                     '--out', str(out), '--limit-margin', '-1', '--allow-worse'])
    assert code == 0
    return out


def test_diffsim_fit_exports_what_load_fit_reads_back(fit_folder):
    qube = robots.interface('qube')
    fit = load_fit(fit_folder, qube)
    assert isinstance(fit.friction, SigmoidFriction) and fit.method == 'diffnea'
    assert qube.check_model(fit.model, fit.actuator, fit.friction) == []
    # the module as the fit saved it (modules.pt) gives the same torque
    saved = SigmoidFriction(2, dtype=torch.float64)
    saved.load_state_dict(torch.load(fit_folder / 'modules.pt')['friction'])
    q, qd = states(2)
    assert torch.allclose(fit.friction(q, qd), saved(q, qd), rtol=0.0, atol=1e-12)
    params = yaml.safe_load((fit_folder / 'params.yaml').read_text(encoding='utf-8'))
    assert params['model']['friction_model']['name'] == 'sigmoid'
    metrics = json.loads((fit_folder / 'metrics.json').read_text(encoding='utf-8'))
    assert metrics['model_document'] == 'params.yaml model'
    with pytest.raises(FitFileError, match='not a file'):
        load_fit(fit_folder / 'missing', qube)
    with pytest.raises(FitFileError, match='model'):
        load_fit(fit_folder / 'metrics.json', qube)   # JSON is YAML, but has no document
    with pytest.raises(FitFileError, match='robot is'):
        load_fit(fit_folder, robots.interface('cartpole'))


@pytest.mark.ros
def test_nodes_start_from_model_file_and_pass_its_friction_on(fit_folder, ros_context,
                                                              executor):
    qube = robots.interface('qube')
    fit = load_fit(fit_folder, qube)
    given = {'robot': 'qube', 'model_file': str(fit_folder / 'params.yaml')}
    identifier = executor.add_node(Identifier(context=ros_context, parameter_overrides=(
        parameter_overrides(given))))
    mpc = executor.add_node(MpcNode(context=ros_context, parameter_overrides=[
        Parameter(name, value=value) for name, value in {
            **given, 'controller': 'ilqr', 'horizon': 10, 'iterations': 1, 'compile': False,
            'native': False}.items()]))
    monitor = executor.add_node(MonitorNode(context=ros_context, parameter_overrides=[
        Parameter(name, value=value) for name, value in given.items()]))
    # each starts from the fit: its model and its friction module
    assert torch.equal(identifier.nominal.inertial, fit.model.inertial)
    assert torch.equal(mpc.model.inertial, fit.model.inertial)
    assert torch.equal(monitor.model.inertial, fit.model.inertial)
    assert isinstance(mpc.controller.dynamics.friction_model, SigmoidFriction)
    assert isinstance(monitor.friction, SigmoidFriction)
    probe = executor.add_node(rclpy.create_node('probe', context=ros_context))
    inbox = []
    probe.create_subscription(String, '/identifier/model', inbox.append, QoSProfile(
        depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL))
    assert wait_for(lambda: inbox, 10.0)
    document = json.loads(inbox[-1].data)
    assert document['friction_model']['name'] == 'sigmoid' and document['omitted'] == []
    # the identifier's document reaches the mpc and the monitor with the module
    assert wait_for(lambda: mpc.stats['models_accepted'] >= 1
                    and monitor.models_accepted >= 1, 20.0)
    q, qd = states(2)
    for friction in (mpc.controller.dynamics.friction_model, monitor.friction):
        assert torch.allclose(friction(q, qd), fit.friction(q, qd), rtol=0.0, atol=1e-12)


def test_a_model_file_that_does_not_load_is_refused(tmp_path, fit_folder):
    qube = robots.interface('qube')
    with pytest.raises(ParameterError, match='model_file'):
        load_model_file(qube, str(tmp_path))   # a folder without params.yaml
    # an implausible friction (1000 N m) in an otherwise good fit
    params = yaml.safe_load((fit_folder / 'params.yaml').read_text(encoding='utf-8'))
    params['model']['friction_model']['coefficients']['phi1'] = [1000.0, 1000.0]
    absurd = tmp_path / 'params.yaml'
    absurd.write_text(yaml.safe_dump(params), encoding='utf-8')
    with pytest.raises(ParameterError, match='refused by the qube robot interface'):
        load_model_file(qube, str(absurd))
    # as a user meets it: one [ERROR] line, exit status 1
    assert_refused('monitor', ['--ros-args', '-p', 'robot:=qube', '-p',
                               f'model_file:={tmp_path / "missing"}'],
                   "'model_file'", 'is not a file')
    assert_refused('mpc', ['--ros-args', '-p', 'robot:=qube', '-p', f'model_file:={absurd}'],
                   "'model_file'", 'SigmoidFriction friction')


def test_sim_eval_runs_an_episode_on_the_fit(fit_folder, tmp_path, capsys):
    out = tmp_path / 'eval.json'
    code = sim_eval_main(['--robot', 'qube', '--controller', 'baseline', '--episodes', '1',
                          '--duration', '0.4', '--model', str(fit_folder), '--json', str(out)])
    assert code == 0
    summary = json.loads(out.read_text(encoding='utf-8'))
    assert summary['model'] == str(fit_folder / 'params.yaml')
    assert summary['friction_model'] == 'SigmoidFriction'
    assert len(summary['episodes']) == 1
    with pytest.raises(SystemExit) as refused:
        sim_eval_main(['--robot', 'cartpole', '--controller', 'baseline', '--model',
                       str(fit_folder)])
    assert refused.value.code == 2 and 'robot is' in capsys.readouterr().err
