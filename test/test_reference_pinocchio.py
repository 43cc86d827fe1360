"""
Compare the differentiable core with Pinocchio, an independent rigid-body engine.

Cases: every robot shipped in ``diffsim_ros.robots`` and 30 seeded random trees from
``urdf_factory`` (revolute, continuous, prismatic and fixed joints, arbitrary axes, origins
and inertias).  Joints are matched by name, links by name (Pinocchio BODY frames).
Everything is float64; the tolerance is 1e-9, relative to the largest expected entry when
that exceeds 1.
"""

import dataclasses
from dataclasses import dataclass
import functools

import numpy as np
import pytest
import torch
from urdf_factory import (
    as_tensor, assert_close, case_urdf, joint_types_of, MOVABLE_TYPES, pinocchio_model,
    PinocchioMap, random_link, RANDOM_SEEDS, random_state, reference_cases, require_core,
    robot_to_urdf, seeded_robot, state_rng)

pin = pytest.importorskip('pinocchio')

N_STATES = 4
# Our spatial vectors are [angular; linear], Pinocchio's are [linear; angular].
PIN_TO_OURS_ROWS = [3, 4, 5, 0, 1, 2]


@dataclass(frozen=True)
class Reference:
    """One robot loaded by both engines."""

    label: str
    xml: str
    model: object
    pin_model: object
    pmap: PinocchioMap
    joint_types: tuple


@functools.lru_cache(maxsize=None)
def _load(case: tuple) -> Reference:
    core = require_core()
    xml = case_urdf(case)
    model = core.load_urdf(xml=xml, dtype=torch.float64)
    pin_model, _ = pinocchio_model(xml)
    pmap = PinocchioMap(pin_model, model.joint_names)
    return Reference(label=f'{case[0]}:{case[1]}', xml=xml, model=model, pin_model=pin_model,
                     pmap=pmap, joint_types=tuple(joint_types_of(xml, model.joint_names)))


@pytest.fixture(params=reference_cases())
def ref(request) -> Reference:
    """Return the reference pair of the current case (skips until the core exists)."""
    return _load(request.param)


def _states(ref: Reference, label: str) -> tuple:
    """Draw a batch of states; the first has zero velocity (gravity-only terms)."""
    q, qd, x = random_state(state_rng(ref.label + label), ref.joint_types, batch=(N_STATES,))
    qd[0] = 0.0
    return q, qd, x


def pin_rnea(pin_model, pmap: PinocchioMap, q, qd, qdd) -> np.ndarray:
    """Pinocchio inverse dynamics in our joint order."""
    data = pin_model.createData()
    return pmap.v_from_pin(pin.rnea(pin_model, data, pmap.q(q), pmap.v(qd), pmap.v(qdd))).copy()


def pin_aba(pin_model, pmap: PinocchioMap, q, qd, tau) -> np.ndarray:
    """Pinocchio forward dynamics in our joint order."""
    data = pin_model.createData()
    return pmap.v_from_pin(pin.aba(pin_model, data, pmap.q(q), pmap.v(qd), pmap.v(tau))).copy()


def pin_crba(pin_model, pmap: PinocchioMap, q) -> np.ndarray:
    """Pinocchio joint-space inertia (full symmetric) in our joint order."""
    data = pin_model.createData()
    upper = np.triu(pin.crba(pin_model, data, pmap.q(q)))
    return pmap.matrix_from_pin(upper + np.triu(upper, 1).T)


# --------------------------------------------------------------------------------------
# Structure and conventions
# --------------------------------------------------------------------------------------

def test_random_trees_cover_features():
    """The seeded random robots exercise every feature the references are meant to test."""
    seen = dict.fromkeys(MOVABLE_TYPES, 0)
    fixed_middle = fixed_leaf = branching = unaligned = inertial_rpy = 0
    sizes = set()
    for seed in RANDOM_SEEDS:
        spec = seeded_robot(seed)
        parents = [j.parent for j in spec.joints]
        for joint in spec.joints:
            if joint.kind == 'fixed':
                if joint.child in parents:
                    fixed_middle += 1
                else:
                    fixed_leaf += 1
            else:
                seen[joint.kind] += 1
                unaligned += int(np.count_nonzero(joint.axis) > 1)
        branching += int(any(parents.count(p) > 1 for p in parents))
        inertial_rpy += sum(bool(np.any(link.rpy)) for link in spec.links)
        sizes.add(len(spec.movable_joint_names))
    assert all(count >= 10 for count in seen.values()), seen
    assert fixed_middle >= 5 and fixed_leaf >= 5, (fixed_middle, fixed_leaf)
    assert branching >= 10 and unaligned >= 30 and inertial_rpy >= 30
    assert 1 in sizes and max(sizes) >= 6, sizes


def test_factory_maps_continuous_joints_to_cos_sin():
    """Pinocchio's continuous joints (nq = 2) receive (cos q, sin q)."""
    spec = seeded_robot(0, n_movable=3)
    spec = dataclasses.replace(spec, joints=tuple(
        dataclasses.replace(j, kind='continuous') if j.kind != 'fixed' else j
        for j in spec.joints))
    pin_model, _ = pinocchio_model(robot_to_urdf(spec))
    pmap = PinocchioMap(pin_model, spec.movable_joint_names)
    assert pin_model.nq == 6 and pin_model.nv == 3 and pmap.continuous.all()
    q_pin = pmap.q(np.array([0.3, -2.0, 1.0]))
    np.testing.assert_allclose(q_pin[pmap.idx_q], np.cos([0.3, -2.0, 1.0]))
    np.testing.assert_allclose(q_pin[pmap.idx_q + 1], np.sin([0.3, -2.0, 1.0]))


@pytest.mark.parametrize('seed', RANDOM_SEEDS[:10])
def test_joint_attributes_match_urdf(seed):
    """Limits, damping and friction are read exactly; continuous joints are unbounded."""
    core = require_core()
    spec = seeded_robot(seed)
    model = core.load_urdf(xml=robot_to_urdf(spec), dtype=torch.float64)
    joints = {j.name: j for j in spec.joints}
    for i, name in enumerate(model.joint_names):
        joint = joints[name]
        for field, expected in (('damping', joint.damping), ('friction', joint.friction),
                                ('effort_limit', joint.effort),
                                ('velocity_limit', joint.velocity)):
            assert float(getattr(model, field)[i]) == expected, (name, field)
        if joint.kind == 'continuous':
            assert float(model.lower[i]) == -np.inf and float(model.upper[i]) == np.inf, name
        else:
            assert (float(model.lower[i]), float(model.upper[i])) == (joint.lower, joint.upper)
        assert float(model.armature[i]) == 0.0


def test_same_joints_links_and_gravity(ref):
    """Both engines see the same movable joints, links and gravity [0, 0, -9.81]."""
    pin_joints = set(ref.pin_model.names[1:])
    assert set(ref.model.joint_names) == pin_joints
    pin_links = {f.name for f in ref.pin_model.frames if f.type == pin.FrameType.BODY}
    assert set(ref.model.link_names) == pin_links
    np.testing.assert_array_equal(ref.pin_model.gravity.linear, [0.0, 0.0, -9.81])
    assert_close(ref.model.gravity, ref.pin_model.gravity.linear, 'gravity', tol=0.0)


# --------------------------------------------------------------------------------------
# Dynamics and kinematics
# --------------------------------------------------------------------------------------

def test_rnea(ref):
    """Inverse dynamics, batched and single, equals Pinocchio's rnea."""
    core = require_core()
    q, qd, qdd = _states(ref, 'rnea')
    tau = core.rnea(ref.model, as_tensor(q), as_tensor(qd), as_tensor(qdd))
    for b in range(N_STATES):
        expected = pin_rnea(ref.pin_model, ref.pmap, q[b], qd[b], qdd[b])
        assert_close(tau[b], expected, f'rnea sample {b}')
    single = core.rnea(ref.model, as_tensor(q[1]), as_tensor(qd[1]), as_tensor(qdd[1]))
    assert_close(single, pin_rnea(ref.pin_model, ref.pmap, q[1], qd[1], qdd[1]), 'rnea single')


def test_aba(ref):
    """Forward dynamics, batched and single, equals Pinocchio's aba."""
    core = require_core()
    q, qd, tau = _states(ref, 'aba')
    qdd = core.aba(ref.model, as_tensor(q), as_tensor(qd), as_tensor(tau))
    for b in range(N_STATES):
        expected = pin_aba(ref.pin_model, ref.pmap, q[b], qd[b], tau[b])
        assert_close(qdd[b], expected, f'aba sample {b}')
    single = core.aba(ref.model, as_tensor(q[2]), as_tensor(qd[2]), as_tensor(tau[2]))
    assert_close(single, pin_aba(ref.pin_model, ref.pmap, q[2], qd[2], tau[2]), 'aba single')


def test_crba(ref):
    """The joint-space inertia matrix equals Pinocchio's crba (symmetrised)."""
    core = require_core()
    q, _, _ = _states(ref, 'crba')
    mass = core.crba(ref.model, as_tensor(q))
    for b in range(N_STATES):
        assert_close(mass[b], pin_crba(ref.pin_model, ref.pmap, q[b]), f'crba sample {b}')
    assert_close(core.crba(ref.model, as_tensor(q[0])), pin_crba(ref.pin_model, ref.pmap, q[0]),
                 'crba single')


def test_forward_kinematics(ref):
    """World poses of every link equal Pinocchio's BODY frame placements of the same name."""
    core = require_core()
    q, _, _ = _states(ref, 'fk')
    T_world_link = core.forward_kinematics(ref.model, as_tensor(q))
    n_links = len(ref.model.link_names)
    assert tuple(T_world_link.shape) == (N_STATES, n_links, 4, 4)
    frame_ids = [ref.pin_model.getFrameId(name, pin.FrameType.BODY)
                 for name in ref.model.link_names]
    data = ref.pin_model.createData()
    for b in range(N_STATES):
        pin.framesForwardKinematics(ref.pin_model, data, ref.pmap.q(q[b]))
        expected = np.stack([data.oMf[fid].homogeneous for fid in frame_ids])
        assert_close(T_world_link[b], expected, f'forward_kinematics sample {b}')
    single = core.forward_kinematics(ref.model, as_tensor(q[N_STATES - 1]))
    assert_close(single, expected, 'forward_kinematics single')


@pytest.mark.parametrize('frame', ['local', 'local_world_aligned', 'world'])
def test_jacobian(ref, frame):
    """Link Jacobians equal ``pin.computeFrameJacobian`` in the matching reference frame."""
    core = require_core('jacobian')
    pin_frame = {'local': pin.ReferenceFrame.LOCAL, 'world': pin.ReferenceFrame.WORLD,
                 'local_world_aligned': pin.ReferenceFrame.LOCAL_WORLD_ALIGNED}[frame]
    q, _, _ = _states(ref, 'jacobian')
    data = ref.pin_model.createData()
    for link in ref.model.link_names:
        jac = core.jacobian(ref.model, as_tensor(q), link, frame=frame)
        fid = ref.pin_model.getFrameId(link, pin.FrameType.BODY)
        for b in range(N_STATES):
            j_pin = pin.computeFrameJacobian(ref.pin_model, data, ref.pmap.q(q[b]), fid,
                                             pin_frame)
            expected = ref.pmap.columns_from_pin(j_pin)[PIN_TO_OURS_ROWS]
            assert_close(jac[b], expected, f'jacobian {link} {frame} sample {b}')


def test_energies(ref):
    """Kinetic and potential energy equal Pinocchio's."""
    core = require_core('kinetic_energy', 'potential_energy')
    q, qd, _ = _states(ref, 'energy')
    kinetic = core.kinetic_energy(ref.model, as_tensor(q), as_tensor(qd))
    potential = core.potential_energy(ref.model, as_tensor(q))
    data = ref.pin_model.createData()
    for b in range(N_STATES):
        q_pin, v_pin = ref.pmap.q(q[b]), ref.pmap.v(qd[b])
        assert_close(kinetic[b], pin.computeKineticEnergy(ref.pin_model, data, q_pin, v_pin),
                     f'kinetic energy sample {b}')
        assert_close(potential[b], pin.computePotentialEnergy(ref.pin_model, data, q_pin),
                     f'potential energy sample {b}')


# --------------------------------------------------------------------------------------
# Armature, gravity and parameter batches
# --------------------------------------------------------------------------------------

def test_armature_and_custom_gravity(ref):
    """Non-zero armature and an arbitrary gravity vector match Pinocchio's."""
    core = require_core()
    rng = state_rng(ref.label + 'armature')
    armature = rng.uniform(0.01, 0.5, ref.model.n)
    gravity = np.array([1.5, -2.0, -7.0])
    model = ref.model.replace(armature=as_tensor(armature), gravity=as_tensor(gravity))
    pin_model = ref.pin_model.copy()
    pin_model.armature[:] = ref.pmap.v(armature)
    pin_model.gravity.linear = gravity
    q, qd, x = _states(ref, 'armature')
    tau = core.rnea(model, as_tensor(q), as_tensor(qd), as_tensor(x))
    qdd = core.aba(model, as_tensor(q), as_tensor(qd), as_tensor(x))
    mass = core.crba(model, as_tensor(q))
    for b in range(N_STATES):
        assert_close(tau[b], pin_rnea(pin_model, ref.pmap, q[b], qd[b], x[b]), f'rnea {b}')
        assert_close(qdd[b], pin_aba(pin_model, ref.pmap, q[b], qd[b], x[b]), f'aba {b}')
        assert_close(mass[b], pin_crba(pin_model, ref.pmap, q[b]), f'crba {b}')


@pytest.mark.parametrize('seed', RANDOM_SEEDS[:6])
def test_parameter_batch_matches_each_robot(seed):
    """A model holding two robots' inertials, shape (2, 1, n, 10), matches both references."""
    core = require_core()
    spec = seeded_robot(seed)
    rng = state_rng(f'variant{seed}')
    variant = dataclasses.replace(
        spec, links=tuple(random_link(rng, link.name) for link in spec.links))
    xmls = [robot_to_urdf(spec), robot_to_urdf(variant)]
    models = [core.load_urdf(xml=xml, dtype=torch.float64) for xml in xmls]
    assert models[0].joint_names == models[1].joint_names
    model = models[0].replace(inertial=torch.stack([m.inertial for m in models])[:, None])
    references = [pinocchio_model(xml)[0] for xml in xmls]
    pmaps = [PinocchioMap(p, model.joint_names) for p in references]
    q, qd, x = random_state(rng, joint_types_of(xmls[0], model.joint_names), batch=(3,))
    tau = core.rnea(model, as_tensor(q), as_tensor(qd), as_tensor(x))
    qdd = core.aba(model, as_tensor(q), as_tensor(qd), as_tensor(x))
    mass = core.crba(model, as_tensor(q))
    assert tuple(tau.shape) == (2, 3, model.n) and tuple(mass.shape) == (2, 3, model.n, model.n)
    for p, (pin_model, pmap) in enumerate(zip(references, pmaps)):
        for b in range(3):
            assert_close(tau[p, b], pin_rnea(pin_model, pmap, q[b], qd[b], x[b]), f'rnea {p} {b}')
            assert_close(qdd[p, b], pin_aba(pin_model, pmap, q[b], qd[b], x[b]), f'aba {p} {b}')
            assert_close(mass[p, b], pin_crba(pin_model, pmap, q[b]), f'crba {p} {b}')
