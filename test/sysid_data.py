"""
Data from our own simulator for the estimator tests (NEA, DiffNEA).

Multisine-driven rollouts (semi-implicit Euler) with accelerations from ABA at every sample,
so ``q, qd, qdd`` and the torques are exact and the losses vanish at the true parameters.
"""

import math

from diffsim_ros import robots
from diffsim_ros.core import aba, load_urdf, make_parameterization, rollout
from diffsim_ros.sysid.dataset import Trajectory
from diffsim_ros.sysid.losses import command_matrix, make_torque_fn
import torch

F64 = torch.float64


def load(name):
    return load_urdf(xml=robots.urdf_string(name), dtype=F64)


def multisine(steps, columns, dt, amplitude, generator, components=5):
    t = torch.arange(steps, dtype=F64) * dt
    freq = 0.3 + 2.7 * torch.rand(columns, components, generator=generator, dtype=F64)
    phase = 2 * math.pi * torch.rand(columns, components, generator=generator, dtype=F64)
    waves = torch.sin(2 * math.pi * freq * t[:, None, None] + phase).sum(-1)
    return t, waves / math.sqrt(components) * torch.as_tensor(amplitude, dtype=F64)


def simulate(model, steps, dt, amplitude, generator, actuator=None, command_joints=None,
             coulomb_eps=1e-2, friction=None, run='run'):
    """Return a run of ``model`` driven by a multisine (torques, or voltages via a motor)."""
    joints = tuple(command_joints or model.joint_names)
    B = command_matrix(model, joints)
    torque_fn = make_torque_fn(model, B, actuator, friction, coulomb_eps)
    t, u = multisine(steps, len(joints), dt, amplitude, generator)
    with torch.no_grad():
        x = rollout(model, torch.zeros(2 * model.n, dtype=F64), u[:-1], dt,
                    'semi_implicit_euler', torque_fn)
        q, qd = x.chunk(2, -1)
        qdd = aba(model, q, qd, torque_fn(q, qd, u))
    if actuator is None:
        return Trajectory(t=t, q=q, qd=qd, qdd=qdd, tau=u @ B.T, joint_names=model.joint_names,
                          run=run)
    return Trajectory(t=t, q=q, qd=qd, qdd=qdd, u=u, joint_names=model.joint_names, run=run)


def perturbed(model, generator, relative=0.1):
    """Return the model with feasible random changes of every body (about ``relative``)."""
    p = make_parameterization('diffnea')
    theta = p.from_inertial(model.inertial)
    scale = torch.tensor([relative, 0.2 * relative, 0.2 * relative, 0.2 * relative]
                         + [relative] * 6, dtype=F64)
    theta = theta + scale * torch.randn(theta.shape, generator=generator, dtype=F64)
    return model.replace(inertial=p.to_inertial(theta))
