"""Float64 gradchecks of every differentiable core primitive w.r.t. states and parameters."""

from diffsim_ros import robots
from diffsim_ros.core import (aba, crba, forward_kinematics, jacobian, joint_friction,
                              kinetic_energy, load_urdf, potential_energy, rnea, rollout,
                              with_joint_friction)
from diffsim_ros.core.regressor import joint_torque_regressor
import pytest
import torch
from torch.autograd import gradcheck
from urdf_factory import robot_to_urdf, seeded_robot

PARAMETERS = ('origin_xyz', 'origin_rpy', 'inertial', 'armature', 'gravity')


def _tree():
    # A branching tree with prismatic and fixed joints exercises every code path.
    for seed in range(100):
        spec = seeded_robot(seed)
        model = load_urdf(xml=robot_to_urdf(spec))
        if 3 <= model.n <= 5 and len(set(model.tree.parents)) < model.n:
            return model
    raise RuntimeError('no branching random tree found')


def _floating_tree():
    # A small free-flying branching tree: the root's 7/6 coordinates and two joints.
    for seed in range(100):
        model = load_urdf(xml=robot_to_urdf(seeded_robot(seed, n_movable=3)),
                          floating_base=True)
        if len(set(model.tree.parents)) < model.njoints:
            return model
    raise RuntimeError('no branching random tree found')


MODELS = {'tree': _tree(), 'wam4': load_urdf(xml=robots.urdf_string('wam4')),
          'floating': _floating_tree()}


def _inputs(model, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(model.nq, generator=g, dtype=torch.float64)
    if model.floating_base:
        # a unit quaternion; gradcheck then perturbs all four entries (q[3:7]) freely
        q[3:7] = q[3:7] / q[3:7].norm()
    return [q.requires_grad_()] + [
        torch.randn(model.nv, generator=g, dtype=torch.float64, requires_grad=True)
        for _ in range(2)]


def _with_parameters(model, values):
    return model.replace(**dict(zip(PARAMETERS, values)))


def _parameter_leaves(model):
    return [getattr(model, name).detach().clone().requires_grad_() for name in PARAMETERS]


ALGORITHMS = {
    'rnea': lambda m, q, qd, a: rnea(m, q, qd, a),
    'aba': lambda m, q, qd, a: aba(m, q, qd, a),
    'crba': lambda m, q, qd, a: crba(m, q),
    'fk': lambda m, q, qd, a: forward_kinematics(m, q),
    'regressor': lambda m, q, qd, a: joint_torque_regressor(m, q, qd, a),
    'energy': lambda m, q, qd, a: kinetic_energy(m, q, qd) + potential_energy(m, q),
    'jacobian': lambda m, q, qd, a: jacobian(m, q, m.link_names[-1], 'local'),
}


@pytest.mark.parametrize('model_name', MODELS)
@pytest.mark.parametrize('algorithm', ALGORITHMS)
def test_gradcheck_states(model_name, algorithm):
    model = MODELS[model_name]
    fn = ALGORITHMS[algorithm]
    q, qd, a = _inputs(model, 0)
    assert gradcheck(lambda q, qd, a: fn(model, q, qd, a), (q, qd, a), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize('model_name', MODELS)
@pytest.mark.parametrize('algorithm', ['rnea', 'aba', 'crba', 'fk', 'energy'])
def test_gradcheck_parameters(model_name, algorithm):
    model = MODELS[model_name]
    fn = ALGORITHMS[algorithm]
    q, qd, a = (x.detach() for x in _inputs(model, 1))
    leaves = _parameter_leaves(model)
    assert gradcheck(lambda *p: fn(_with_parameters(model, p), q, qd, a), tuple(leaves),
                     eps=1e-6, atol=1e-6)


def test_gradcheck_rollout_controls_and_inertia():
    model = MODELS['wam4']
    g = torch.Generator().manual_seed(2)
    x0 = torch.randn(2 * model.n, generator=g, dtype=torch.float64, requires_grad=True)
    controls = torch.randn(5, model.n, generator=g, dtype=torch.float64, requires_grad=True)
    pi = model.inertial.detach().clone().requires_grad_()

    def simulate(x0, controls, pi):
        return rollout(model.replace(inertial=pi), x0, controls, 1e-2)[-1]

    assert gradcheck(simulate, (x0, controls, pi), eps=1e-6, atol=1e-6)


def test_gradcheck_joint_friction_parameters():
    model = MODELS['wam4']
    g = torch.Generator().manual_seed(3)
    x0 = torch.randn(2 * model.n, generator=g, dtype=torch.float64)
    controls = torch.randn(4, model.n, generator=g, dtype=torch.float64)
    damping = torch.full((model.n,), 0.3, dtype=torch.float64, requires_grad=True)
    friction = torch.full((model.n,), 0.2, dtype=torch.float64, requires_grad=True)

    def simulate(damping, friction):
        m = model.replace(damping=damping, friction=friction)
        return rollout(m, x0, controls, 1e-2, torque_fn=with_joint_friction(m))[-1]

    assert gradcheck(simulate, (damping, friction), eps=1e-6, atol=1e-6)


def test_joint_friction_dissipates():
    model = MODELS['wam4'].replace(damping=torch.full((4,), 0.5, dtype=torch.float64),
                                   friction=torch.full((4,), 0.1, dtype=torch.float64))
    qd = torch.randn(100, 4, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    assert bool(((joint_friction(model, qd) * qd) >= 0).all())
