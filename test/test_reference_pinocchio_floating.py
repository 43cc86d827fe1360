"""
Compare the floating-base core with Pinocchio's free-flyer (``JointModelFreeFlyer``).

Cases: every robot shipped in ``diffsim_ros.robots`` mounted on a free base, the seeded
random trees of ``urdf_factory`` on a free base (seeds 0-29, not used while the floating
base was written, which used seeds 100-103), and single free rigid bodies (one link, with
and without links fixed to it).  Our ``q = [p, quaternion (x, y, z, w), joints]`` and
``v = [linear, angular (root axes), joint rates]`` are Pinocchio's layouts, so the free-flyer
coordinates are passed unchanged.  float64; tolerance 1e-9 relative to the largest expected
entry when that exceeds 1, as in test_reference_pinocchio.py.
"""

from dataclasses import dataclass
import functools
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import torch
from urdf_factory import (
    as_tensor, assert_close, case_urdf, FREE_FLYER, joint_types_of, pinocchio_model,
    PinocchioMap, random_floating_state, random_link, RANDOM_SEEDS, reference_cases,
    require_core, robot_to_urdf, seeded_robot, state_rng)

pin = pytest.importorskip('pinocchio')

N_STATES = 3
# Our spatial vectors are [angular; linear], Pinocchio's are [linear; angular].
PIN_TO_OURS_ROWS = [3, 4, 5, 0, 1, 2]
FREE_BODY_SEEDS = (40, 41, 42, 43)


@dataclass(frozen=True)
class Reference:
    """One floating-base robot loaded by both engines."""

    label: str
    xml: str
    model: object
    pin_model: object
    pmap: PinocchioMap
    joint_types: tuple


def _cases() -> list:
    cases = reference_cases(RANDOM_SEEDS)
    cases += [pytest.param(('free_body', seed), id=f'free_body{seed}') for seed in FREE_BODY_SEEDS]
    return cases


def _urdf(case: tuple) -> str:
    if case[0] == 'free_body':
        # One link; odd seeds add two links fixed to it (merged into body 0).
        seed = case[1]
        return robot_to_urdf(seeded_robot(seed, n_movable=0, n_fixed=seed % 2 * 2))
    return with_massive_root(case_urdf(case))


ROOT_INERTIAL = ('<inertial><origin xyz="0.01 -0.02 0.03" rpy="0.1 0.2 0.3"/>'
                 '<mass value="3.5"/><inertia ixx="0.05" ixy="0.001" ixz="-0.002" iyy="0.04"'
                 ' iyz="0.003" izz="0.06"/></inertial>')


def with_massive_root(xml: str) -> str:
    """
    Give a massless root link an inertial, so that it can float.

    The shipped arms have massless base links; on a free base the first joint would then
    move nothing the free-flyer does not (a singular mass matrix, refused by ``load_urdf``).

    :param xml: URDF XML.
    :return: URDF XML whose root link has mass.
    """
    root = ET.fromstring(xml.split('?>', 1)[-1] if xml.lstrip().startswith('<?') else xml)
    children = {j.find('child').get('link') for j in root.iter('joint')}
    link = next(k for k in root.iter('link') if k.get('name') not in children)
    if link.find('inertial') is None:
        link.insert(0, ET.fromstring(ROOT_INERTIAL))
    return ET.tostring(root, encoding='unicode')


@functools.lru_cache(maxsize=None)
def _load(case: tuple) -> Reference:
    core = require_core()
    xml = _urdf(case)
    model = core.load_urdf(xml=xml, dtype=torch.float64, floating_base=True)
    pin_model, _ = pinocchio_model(xml, floating_base=True)
    pmap = PinocchioMap(pin_model, model.joint_names)
    return Reference(label=f'floating:{case[0]}:{case[1]}', xml=xml, model=model,
                     pin_model=pin_model, pmap=pmap,
                     joint_types=tuple(joint_types_of(xml, model.joint_names[1:])))


@pytest.fixture(params=_cases())
def ref(request) -> Reference:
    """Return the reference pair of the current case."""
    return _load(request.param)


def _states(ref: Reference, label: str, batch: int = N_STATES) -> tuple:
    """Draw states; the first has zero velocity (gravity-only terms)."""
    q, v, x = random_floating_state(state_rng(ref.label + label), ref.joint_types,
                                    batch=(batch,))
    v[0] = 0.0
    return q, v, x


def pin_rnea(pin_model, pmap, q, v, a) -> np.ndarray:
    """Pinocchio inverse dynamics in our order."""
    data = pin_model.createData()
    return pmap.v_from_pin(pin.rnea(pin_model, data, pmap.q(q), pmap.v(v), pmap.v(a))).copy()


def pin_aba(pin_model, pmap, q, v, tau) -> np.ndarray:
    """Pinocchio forward dynamics in our order."""
    data = pin_model.createData()
    return pmap.v_from_pin(pin.aba(pin_model, data, pmap.q(q), pmap.v(v), pmap.v(tau))).copy()


def pin_crba(pin_model, pmap, q) -> np.ndarray:
    """Pinocchio joint-space inertia (full symmetric) in our order."""
    data = pin_model.createData()
    upper = np.triu(pin.crba(pin_model, data, pmap.q(q)))
    return pmap.matrix_from_pin(upper + np.triu(upper, 1).T)


# --------------------------------------------------------------------------------------
# Structure
# --------------------------------------------------------------------------------------

def test_layout_matches_the_contract(ref):
    """root_joint first; nq = njoints + 6, nv = njoints + 5; per-DOF arrays have nv rows."""
    model = ref.model
    assert model.floating_base and model.tree.joint_names[0] == FREE_FLYER
    assert model.tree.joint_types[0] == 'floating' and model.tree.parents[0] == -1
    assert all(p >= 0 for p in model.tree.parents[1:])
    assert model.njoints == model.tree.n == len(ref.joint_types) + 1
    assert (model.nq, model.nv, model.n) == (ref.pin_model.nq - int(
        sum(ref.pmap.continuous)), ref.pin_model.nv, ref.pin_model.nv)
    assert model.nq == model.njoints + 6 and model.nv == model.njoints + 5
    for name in ('damping', 'friction', 'armature', 'velocity_limit', 'effort_limit'):
        assert tuple(getattr(model, name).shape) == (model.nv,), name
    assert torch.all(model.damping[:6] == 0) and torch.all(model.friction[:6] == 0)
    assert torch.all(torch.isinf(model.effort_limit[:6]))
    assert tuple(model.lower.shape) == (model.nq,) and torch.all(model.lower[:7] == -np.inf)
    assert tuple(model.inertial.shape) == (model.njoints, 10)
    assert torch.all(model.origin_xyz[0] == 0) and torch.all(model.origin_rpy[0] == 0)
    # body 0 is the URDF root link with the links fixed to it merged in
    assert model.tree.body_links[0] == model.link_names[0]
    pin_mass = sum(inertia.mass for inertia in ref.pin_model.inertias)
    assert float(model.mass.sum()) == pytest.approx(pin_mass, rel=1e-12)


# --------------------------------------------------------------------------------------
# Dynamics and kinematics
# --------------------------------------------------------------------------------------

def test_rnea(ref):
    """Inverse dynamics (root wrench [force; torque] in root axes first) equals Pinocchio's."""
    core = require_core()
    q, v, a = _states(ref, 'rnea')
    tau = core.rnea(ref.model, as_tensor(q), as_tensor(v), as_tensor(a))
    for b in range(N_STATES):
        assert_close(tau[b], pin_rnea(ref.pin_model, ref.pmap, q[b], v[b], a[b]), f'rnea {b}')
    single = core.rnea(ref.model, as_tensor(q[1]), as_tensor(v[1]), as_tensor(a[1]))
    assert_close(single, pin_rnea(ref.pin_model, ref.pmap, q[1], v[1], a[1]), 'rnea single')


def test_aba(ref):
    """Forward dynamics equals Pinocchio's aba."""
    core = require_core()
    q, v, tau = _states(ref, 'aba')
    a = core.aba(ref.model, as_tensor(q), as_tensor(v), as_tensor(tau))
    for b in range(N_STATES):
        assert_close(a[b], pin_aba(ref.pin_model, ref.pmap, q[b], v[b], tau[b]), f'aba {b}')
    single = core.aba(ref.model, as_tensor(q[2]), as_tensor(v[2]), as_tensor(tau[2]))
    assert_close(single, pin_aba(ref.pin_model, ref.pmap, q[2], v[2], tau[2]), 'aba single')


def test_crba(ref):
    """The (nv, nv) inertia matrix equals Pinocchio's crba."""
    core = require_core()
    q, _, _ = _states(ref, 'crba')
    mass = core.crba(ref.model, as_tensor(q))
    for b in range(N_STATES):
        assert_close(mass[b], pin_crba(ref.pin_model, ref.pmap, q[b]), f'crba {b}')


def test_forward_kinematics(ref):
    """World poses of every link equal Pinocchio's BODY frames under the free-flyer."""
    core = require_core()
    q, _, _ = _states(ref, 'fk')
    T_world_link = core.forward_kinematics(ref.model, as_tensor(q))
    frame_ids = [ref.pin_model.getFrameId(name, pin.FrameType.BODY)
                 for name in ref.model.link_names]
    data = ref.pin_model.createData()
    for b in range(N_STATES):
        pin.framesForwardKinematics(ref.pin_model, data, ref.pmap.q(q[b]))
        expected = np.stack([data.oMf[fid].homogeneous for fid in frame_ids])
        assert_close(T_world_link[b], expected, f'forward_kinematics {b}')


@pytest.mark.parametrize('frame', ['local', 'local_world_aligned', 'world'])
def test_jacobian(ref, frame):
    """Link Jacobians (..., 6, nv) equal ``pin.computeFrameJacobian``."""
    core = require_core('jacobian')
    pin_frame = {'local': pin.ReferenceFrame.LOCAL, 'world': pin.ReferenceFrame.WORLD,
                 'local_world_aligned': pin.ReferenceFrame.LOCAL_WORLD_ALIGNED}[frame]
    q, _, _ = _states(ref, 'jacobian')
    data = ref.pin_model.createData()
    for link in ref.model.link_names:
        jac = core.jacobian(ref.model, as_tensor(q), link, frame=frame)
        assert tuple(jac.shape) == (N_STATES, 6, ref.model.nv)
        fid = ref.pin_model.getFrameId(link, pin.FrameType.BODY)
        for b in range(N_STATES):
            j_pin = pin.computeFrameJacobian(ref.pin_model, data, ref.pmap.q(q[b]), fid,
                                             pin_frame)
            expected = ref.pmap.columns_from_pin(j_pin)[PIN_TO_OURS_ROWS]
            assert_close(jac[b], expected, f'jacobian {link} {frame} {b}')


def test_energies(ref):
    """Kinetic and potential energy (the root body included) equal Pinocchio's."""
    core = require_core('kinetic_energy', 'potential_energy')
    q, v, _ = _states(ref, 'energy')
    kinetic = core.kinetic_energy(ref.model, as_tensor(q), as_tensor(v))
    potential = core.potential_energy(ref.model, as_tensor(q))
    data = ref.pin_model.createData()
    for b in range(N_STATES):
        q_pin, v_pin = ref.pmap.q(q[b]), ref.pmap.v(v[b])
        assert_close(kinetic[b], pin.computeKineticEnergy(ref.pin_model, data, q_pin, v_pin),
                     f'kinetic energy {b}')
        assert_close(potential[b], pin.computePotentialEnergy(ref.pin_model, data, q_pin),
                     f'potential energy {b}')


def test_regressor(ref):
    """``Y pi`` equals Pinocchio's rnea, and ``Y`` equals Pinocchio's joint-torque regressor."""
    core = require_core('joint_torque_regressor')
    q, v, a = _states(ref, 'regressor')
    Y = core.joint_torque_regressor(ref.model, as_tensor(q), as_tensor(v), as_tensor(a))
    assert tuple(Y.shape) == (N_STATES, ref.model.nv, 10 * ref.model.njoints)
    tau = Y @ ref.model.inertial.flatten(-2)
    # Pinocchio's columns per joint: m, mc, then Ixx, Ixy, Iyy, Ixz, Iyz, Izz (ours: Ixx, Ixy,
    # Ixz, Iyy, Iyz, Izz), both about the joint (body) frame origin.
    order = [0, 1, 2, 3, 4, 5, 7, 6, 8, 9]
    columns = [10 * (ref.pin_model.getJointId(name) - 1) + k
               for name in ref.model.joint_names for k in order]
    data = ref.pin_model.createData()
    for b in range(N_STATES):
        assert_close(tau[b], pin_rnea(ref.pin_model, ref.pmap, q[b], v[b], a[b]),
                     f'regressor {b}')
        Y_pin = pin.computeJointTorqueRegressor(ref.pin_model, data, ref.pmap.q(q[b]),
                                                ref.pmap.v(v[b]), ref.pmap.v(a[b]))
        assert_close(Y[b], np.asarray(Y_pin)[ref.pmap.idx_v][:, columns], f'Y {b}')


# --------------------------------------------------------------------------------------
# Armature, gravity, parameter batches, the URDF floating joint
# --------------------------------------------------------------------------------------

def test_armature_and_custom_gravity(ref):
    """Armature on every DOF (the root's six included) and any gravity match Pinocchio."""
    core = require_core()
    rng = state_rng(ref.label + 'armature')
    armature = rng.uniform(0.01, 0.5, ref.model.nv)
    gravity = np.array([1.5, -2.0, -7.0])
    model = ref.model.replace(armature=as_tensor(armature), gravity=as_tensor(gravity))
    pin_model = ref.pin_model.copy()
    pin_model.armature[:] = ref.pmap.v(armature)
    pin_model.gravity.linear = gravity
    q, v, x = _states(ref, 'armature')
    tau = core.rnea(model, as_tensor(q), as_tensor(v), as_tensor(x))
    a = core.aba(model, as_tensor(q), as_tensor(v), as_tensor(x))
    mass = core.crba(model, as_tensor(q))
    for b in range(N_STATES):
        assert_close(tau[b], pin_rnea(pin_model, ref.pmap, q[b], v[b], x[b]), f'rnea {b}')
        assert_close(a[b], pin_aba(pin_model, ref.pmap, q[b], v[b], x[b]), f'aba {b}')
        assert_close(mass[b], pin_crba(pin_model, ref.pmap, q[b]), f'crba {b}')


@pytest.mark.parametrize('seed', RANDOM_SEEDS[:4] + FREE_BODY_SEEDS[:1])
def test_parameter_batch_matches_each_robot(seed):
    """Inertials of two robots stacked ``(2, 1, njoints, 10)`` broadcast against 3 states."""
    core = require_core()
    spec = seeded_robot(seed, **({'n_movable': 0} if seed in FREE_BODY_SEEDS else {}))
    rng = state_rng(f'floating variant{seed}')
    variant = spec.__class__(spec.name, tuple(random_link(rng, link.name)
                                              for link in spec.links), spec.joints)
    xmls = [robot_to_urdf(spec), robot_to_urdf(variant)]
    models = [core.load_urdf(xml=xml, floating_base=True) for xml in xmls]
    model = models[0].replace(inertial=torch.stack([m.inertial for m in models])[:, None])
    references = [pinocchio_model(xml, floating_base=True)[0] for xml in xmls]
    pmaps = [PinocchioMap(p, model.joint_names) for p in references]
    q, v, x = random_floating_state(rng, joint_types_of(xmls[0], model.joint_names[1:]),
                                    batch=(3,))
    tau = core.rnea(model, as_tensor(q), as_tensor(v), as_tensor(x))
    a = core.aba(model, as_tensor(q), as_tensor(v), as_tensor(x))
    mass = core.crba(model, as_tensor(q))
    assert tuple(tau.shape) == (2, 3, model.nv) and tuple(mass.shape) == (2, 3, model.nv,
                                                                          model.nv)
    for p, (pin_model, pmap) in enumerate(zip(references, pmaps)):
        for b in range(3):
            assert_close(tau[p, b], pin_rnea(pin_model, pmap, q[b], v[b], x[b]), f'rnea {p}{b}')
            assert_close(a[p, b], pin_aba(pin_model, pmap, q[b], v[b], x[b]), f'aba {p}{b}')
            assert_close(mass[p, b], pin_crba(pin_model, pmap, q[b]), f'crba {p}{b}')


def test_urdf_floating_root_joint_is_the_free_flyer():
    """A URDF ``floating`` joint from a dummy link, with an origin, matches Pinocchio's."""
    core = require_core()
    spec = seeded_robot(7)
    body = robot_to_urdf(spec)
    joint = ('<link name="world_dummy"/><joint name="base_free" type="floating">'
             '<parent link="world_dummy"/>'
             f'<child link="{spec.root}"/><origin xyz="0.1 -0.2 0.3" rpy="0.4 -0.5 0.6"/>'
             '</joint></robot>')
    xml = body.replace('</robot>', joint)
    model = core.load_urdf(xml=xml)
    assert model.floating_base and model.joint_names[0] == FREE_FLYER
    assert model.link_names[0] == 'world_dummy' and model.tree.link_bodies[0] == -1
    pin_model = pin.buildModelFromXML(xml)
    assert pin_model.nqs[1] == 7 and pin_model.names[1] == 'base_free'
    names = ('base_free',) + model.joint_names[1:]
    # Pinocchio keeps the URDF name; map it by position instead of by name.
    q, v, x = random_floating_state(state_rng('urdf floating'),
                                    joint_types_of(xml, model.joint_names[1:]), batch=(2,))
    idx_v = [pin_model.idx_vs[1] + k for k in range(6)] + [
        pin_model.idx_vs[pin_model.getJointId(n)] for n in names[1:]]
    for b in range(2):
        q_pin = np.zeros(pin_model.nq)
        q_pin[:7] = q[b, :7]
        for i, name in enumerate(names[1:]):
            jid = pin_model.getJointId(name)
            if pin_model.nqs[jid] == 2:
                q_pin[pin_model.idx_qs[jid]:pin_model.idx_qs[jid] + 2] = (
                    np.cos(q[b, 7 + i]), np.sin(q[b, 7 + i]))
            else:
                q_pin[pin_model.idx_qs[jid]] = q[b, 7 + i]
        v_pin = np.zeros(pin_model.nv)
        v_pin[idx_v] = v[b]
        a_pin = np.zeros(pin_model.nv)
        a_pin[idx_v] = x[b]
        data = pin_model.createData()
        expected = pin.rnea(pin_model, data, q_pin, v_pin, a_pin)[idx_v]
        tau = core.rnea(model, as_tensor(q[b]), as_tensor(v[b]), as_tensor(x[b]))
        assert_close(tau, expected, f'rnea {b}')
        pin.framesForwardKinematics(pin_model, data, q_pin)
        T = core.forward_kinematics(model, as_tensor(q[b]))
        for k, link in enumerate(model.link_names):
            fid = pin_model.getFrameId(link, pin.FrameType.BODY)
            assert_close(T[k], data.oMf[fid].homogeneous, f'fk {link} {b}')


# --------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------

def test_state_sizes_name_nq_and_nv():
    """A velocity of size nq, or a configuration of size nv, is one precise ShapeError."""
    core = require_core()
    model = _load(('seed', 3)).model
    q = torch.zeros(model.nq, dtype=torch.float64)
    q[6] = 1.0
    v = torch.zeros(model.nv, dtype=torch.float64)
    with pytest.raises(core.ShapeError, match=rf'qd: expected shape \(\.\.\., nv={model.nv}\), '
                       rf'got \({model.nq},\)'):
        core.rnea(model, q, q, v)
    with pytest.raises(core.ShapeError, match=rf'q: expected shape \(\.\.\., nq={model.nq}\)'):
        core.crba(model, v)
    with pytest.raises(core.ShapeError, match=rf'tau: expected shape \(\.\.\., nv={model.nv}\)'):
        core.aba(model, q, v, q)
    with pytest.raises(core.ShapeError, match='nq'):
        core.forward_kinematics(model, v)
    with pytest.raises(core.ShapeError, match=rf'armature: expected shape \(\.\.\., {model.nv}\)'):
        model.replace(armature=torch.zeros(model.njoints, dtype=torch.float64))


def test_massless_root_on_a_free_base_is_refused():
    """The WAM's massless base link on a free-flyer: its first joint is redundant."""
    core = require_core()
    xml = case_urdf(('robot', 'wam4'))
    with pytest.raises(core.URDFError, match='mass matrix is singular'):
        core.load_urdf(xml=xml, floating_base=True)
    assert core.load_urdf(xml=with_massive_root(xml), floating_base=True).nv == 10


def test_floating_joint_below_the_root_is_refused():
    """A floating joint that does not leave the root link names itself in the error."""
    core = require_core()
    spec = seeded_robot(5)
    xml = robot_to_urdf(spec).replace('</robot>', (
        '<link name="loose"><inertial><mass value="1"/>'
        '<inertia ixx="0.1" ixy="0" ixz="0" iyy="0.1" iyz="0" izz="0.1"/></inertial></link>'
        f'<joint name="loose_free" type="floating"><parent link="{spec.links[-1].name}"/>'
        '<child link="loose"/></joint></robot>'))
    with pytest.raises(core.UnsupportedJointError, match="joint 'loose_free'.*only at the root"):
        core.load_urdf(xml=xml)
    with pytest.raises(core.UnsupportedJointError, match="joint 'loose_free'"):
        core.load_urdf(xml=xml, floating_base=True)


def test_fixed_base_layout_is_unchanged():
    """Without a free-flyer: nq == nv == n == njoints, no 'root_joint'."""
    core = require_core()
    model = core.load_urdf(xml=case_urdf(('seed', 3)))
    assert not model.floating_base and FREE_FLYER not in model.joint_names
    assert model.nq == model.nv == model.n == model.njoints == model.tree.n


def test_many_free_bodies_batch_in_the_leading_dims():
    """Five free bodies with their own inertials: one batched call equals five calls."""
    core = require_core()
    model = _load(('free_body', 40)).model
    rng = state_rng('five bodies')
    inertial = torch.stack([_load(('free_body', s)).model.inertial for s in FREE_BODY_SEEDS]
                           + [model.inertial])
    q, v, x = random_floating_state(rng, (), batch=(5,))
    batched = model.replace(inertial=inertial)
    a = core.aba(batched, as_tensor(q), as_tensor(v), as_tensor(x))
    tau = core.rnea(batched, as_tensor(q), as_tensor(v), as_tensor(a))
    assert tuple(a.shape) == (5, 6)
    for b in range(5):
        single = model.replace(inertial=inertial[b])
        assert_close(a[b], core.aba(single, as_tensor(q[b]), as_tensor(v[b]), as_tensor(x[b])),
                     f'aba body {b}')
        assert_close(tau[b], x[b], f'rnea(aba) body {b}')


def test_native_entry_points_take_nq_nv_states_on_a_floating_base():
    """rnea_native/aba_native/crba_native take (nq, nv) states and give the torch result."""
    core = require_core('rnea_native', 'aba_native', 'crba_native')
    from diffsim_ros.core.aba import aba
    from diffsim_ros.core.crba import crba
    from diffsim_ros.core.rnea import rnea
    ref = _load(('seed', 11))
    q, v, x = (as_tensor(t) for t in _states(ref, 'native'))
    for got, expected, name in (
            (core.rnea_native(ref.model, q, v, x), rnea(ref.model, q, v, x), 'rnea'),
            (core.aba_native(ref.model, q, v, x), aba(ref.model, q, v, x), 'aba'),
            (core.crba_native(ref.model, q), crba(ref.model, q), 'crba')):
        assert_close(got, expected.numpy(), name, tol=1e-12)


@pytest.mark.parametrize('seed', (50, 51))
def test_identities_with_a_parameter_batch(seed):
    """No reference needed: aba(rnea(a)) = a, M a + h = rnea, T = v M v / 2, over particles."""
    core = require_core('kinetic_energy')
    model = core.load_urdf(xml=robot_to_urdf(seeded_robot(seed)), floating_base=True)
    g = torch.Generator().manual_seed(seed)
    scale = 1.0 + 0.5 * torch.rand(4, 1, model.njoints, 1, generator=g, dtype=torch.float64)
    particles = model.replace(inertial=model.inertial * scale)          # (4, 1, njoints, 10)
    q, v, a = (as_tensor(x) for x in random_floating_state(
        state_rng(f'identities{seed}'), joint_types_of(model.urdf, model.joint_names[1:]),
        batch=(3,)))
    tau = core.rnea(particles, q, v, a)
    assert tuple(tau.shape) == (4, 3, model.nv)
    assert_close(core.aba(particles, q, v, tau), a.expand(4, 3, model.nv), 'aba(rnea)')
    M = core.crba(particles, q)
    h = core.rnea(particles, q, v, torch.zeros_like(a))
    assert_close((M @ a.unsqueeze(-1)).squeeze(-1) + h, tau, 'M a + h')
    kinetic = 0.5 * (v.unsqueeze(-2) @ M @ v.unsqueeze(-1))[..., 0, 0]
    assert_close(core.kinetic_energy(particles, q, v), kinetic, 'kinetic energy')
