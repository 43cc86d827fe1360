"""
Compare rigid-body dynamics with MuJoCo, a second independent engine.

MuJoCo imports the same URDF (geometry dropped, static bodies kept, inertias as written);
joint damping, friction loss, armature, springs, limits and contacts are switched off so
that ``qacc = M^-1 (tau - qfrc_bias)``.  Joints are matched by name.

Two groups of tests:

* Pinocchio vs MuJoCo on the seeded random trees: proves the generated robots mean the
  same thing to two unrelated URDF parsers (needs no diffsim_ros code).
* diffsim_ros.core vs MuJoCo on every shipped robot and some random trees: forward
  dynamics, mass matrix and bias forces.
"""

import functools

import numpy as np
import pytest
import torch
from urdf_factory import (
    as_tensor, assert_close, case_urdf, joint_types_of, mujoco_dynamics, mujoco_model,
    MujocoMap, pinocchio_model, PinocchioMap, RANDOM_SEEDS, random_state, reference_cases,
    require_core, robot_to_urdf, seeded_robot, state_rng)

mujoco = pytest.importorskip('mujoco')

N_STATES = 4


def test_mujoco_setup_removes_passive_effects():
    """The URDF's damping/friction reach MuJoCo and are then zeroed; gravity is standard."""
    xml = robot_to_urdf(seeded_robot(1))
    raw = mujoco.MjModel.from_xml_string(
        xml.replace('<robot name="random_1">', '<robot name="random_1"><mujoco><compiler '
                    'discardvisual="true" fusestatic="false"/></mujoco>'))
    assert np.all(raw.dof_damping > 0.0) and np.all(raw.dof_frictionloss > 0.0)
    mj_model, _ = mujoco_model(xml)
    assert not mj_model.dof_damping.any() and not mj_model.dof_frictionloss.any()
    assert not mj_model.dof_armature.any()
    np.testing.assert_array_equal(mj_model.opt.gravity, [0.0, 0.0, -9.81])
    assert mj_model.opt.disableflags & mujoco.mjtDisableBit.mjDSBL_CONTACT
    assert mj_model.nbody == len(seeded_robot(1).links) + 1  # static links kept


@pytest.mark.parametrize('seed', RANDOM_SEEDS)
def test_random_tree_pinocchio_matches_mujoco(seed):
    """Generator check: Pinocchio and MuJoCo agree on every random tree."""
    import pinocchio as pin
    spec = seeded_robot(seed)
    xml = robot_to_urdf(spec)
    names = spec.movable_joint_names
    mj_model, mj_data = mujoco_model(xml)
    mj_map = MujocoMap(mj_model, names)
    pin_model, pin_data = pinocchio_model(xml)
    pmap = PinocchioMap(pin_model, names)
    q, qd, tau = random_state(state_rng(f'pin-mj{seed}'), joint_types_of(xml, names),
                              batch=(N_STATES,))
    for b in range(N_STATES):
        qdd_mj, mass_mj, bias_mj = mujoco_dynamics(mj_model, mj_data, mj_map, q[b], qd[b],
                                                   tau[b])
        q_pin, v_pin = pmap.q(q[b]), pmap.v(qd[b])
        upper = np.triu(pin.crba(pin_model, pin_data, q_pin))
        mass_pin = pmap.matrix_from_pin(upper + np.triu(upper, 1).T)
        bias_pin = pmap.v_from_pin(pin.rnea(pin_model, pin_data, q_pin, v_pin, 0.0 * v_pin))
        qdd_pin = pmap.v_from_pin(pin.aba(pin_model, pin_data, q_pin, v_pin, pmap.v(tau[b])))
        assert_close(mass_pin, mass_mj, f'mass matrix sample {b}')
        assert_close(bias_pin, bias_mj, f'bias sample {b}')
        assert_close(qdd_pin, qdd_mj, f'qacc sample {b}')


@functools.lru_cache(maxsize=None)
def _load(case: tuple) -> tuple:
    core = require_core()
    xml = case_urdf(case)
    model = core.load_urdf(xml=xml, dtype=torch.float64)
    mj_model, mj_data = mujoco_model(xml)
    return (f'{case[0]}:{case[1]}', xml, model, mj_model, mj_data,
            MujocoMap(mj_model, model.joint_names))


@pytest.mark.parametrize('case', reference_cases(RANDOM_SEEDS[::3]))
def test_core_matches_mujoco(case):
    """Forward dynamics, mass matrix and bias forces (``rnea`` with qdd = 0) match MuJoCo."""
    core = require_core()
    label, xml, model, mj_model, mj_data, mj_map = _load(case)
    q, qd, tau = random_state(state_rng(label + 'mujoco'),
                              joint_types_of(xml, model.joint_names), batch=(N_STATES,))
    qd[0] = 0.0
    qdd = core.aba(model, as_tensor(q), as_tensor(qd), as_tensor(tau))
    mass = core.crba(model, as_tensor(q))
    bias = core.rnea(model, as_tensor(q), as_tensor(qd),
                     torch.zeros(N_STATES, model.n, dtype=torch.float64))
    for b in range(N_STATES):
        qdd_mj, mass_mj, bias_mj = mujoco_dynamics(mj_model, mj_data, mj_map, q[b], qd[b],
                                                   tau[b])
        assert_close(mass[b], mass_mj, f'{label} mass matrix sample {b}')
        assert_close(bias[b], bias_mj, f'{label} bias sample {b}')
        assert_close(qdd[b], qdd_mj, f'{label} qacc sample {b}')
