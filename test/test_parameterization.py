"""Tests of the inertial and kinematic parameterizations (diffsim_ros.core.parameterization)."""

from diffsim_ros.core.errors import ShapeError
from diffsim_ros.core.parameterization import (
    inertial_from_mass_com_inertia, inertial_from_pseudo_inertia, is_physically_consistent,
    KinematicParameterization, make_parameterization, mass_com_inertia, pseudo_inertia,
    regularize_inertial)
import pytest
import torch
from torch.autograd import gradcheck

F64 = torch.float64
CONSTRAINED = ('diffnea', 'log_cholesky')
ALL = CONSTRAINED + ('raw',)


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_rotation(n: int, gen: torch.Generator) -> torch.Tensor:
    Q, R = torch.linalg.qr(torch.randn(n, 3, 3, generator=gen, dtype=F64))
    Q = Q * torch.sign(R.diagonal(dim1=-2, dim2=-1))[..., None, :]
    return torch.where(torch.linalg.det(Q)[:, None, None] < 0, -Q, Q)


def body(mass, com, second_moments, rotation) -> torch.Tensor:
    """Feasible pi from mass, CoM and the principal second moments b of the mass distribution."""
    sigma = (rotation * second_moments[..., None, :]) @ rotation.transpose(-1, -2)
    inertia_com = second_moments.sum(-1)[..., None, None] * torch.eye(3, dtype=F64) - sigma
    return inertial_from_mass_com_inertia(mass, com, inertia_com)


def random_bodies(n: int, seed: int) -> torch.Tensor:
    gen = generator(seed)
    mass = 10 ** (3 * torch.rand(n, generator=gen, dtype=F64) - 1)            # 0.1 .. 100 kg
    com = 0.3 * torch.randn(n, 3, generator=gen, dtype=F64)
    b = 10 ** (4 * torch.rand(n, 3, generator=gen, dtype=F64) - 4)            # 1e-4 .. 1 kg m^2
    return body(mass, com, b, random_rotation(n, gen))


def degenerate_bodies() -> torch.Tensor:
    """Bodies at the edge of feasibility that still satisfy the strict inequalities."""
    gen = generator(7)
    eye = torch.eye(3, dtype=F64)
    pi_x = torch.tensor([[1.0, 0.0, 0.0], [0.0, -1.0, 0.0], [0.0, 0.0, -1.0]], dtype=F64)
    cases = [
        # (mass, com, b, rotation)
        (1.0, [0.1, -0.2, 0.05], [1e-9, 1e-2, 1e-2], eye),          # nearly a lamina
        (1.0, [0.1, -0.2, 0.05], [1e-10, 1e-10, 1e-2], eye),        # nearly a thin rod
        (2.0, [0.0, 0.0, 0.0], [1e-3, 1e-3, 1e-3], eye),            # sphere: any frame
        (2.0, [0.3, 0.0, 0.0], [1e-3, 1e-3, 5e-3], pi_x),           # axisymmetric, 180 deg
        (1e-6, [0.01, 0.02, 0.03], [1e-14, 2e-14, 3e-14], eye),     # tiny body
        (50.0, [1.0, -1.0, 2.0], [1e-6, 3.0, 3.0 + 1e-9], pi_x),    # huge CoM offset
    ]
    pis = [body(torch.tensor(m, dtype=F64), torch.tensor(c, dtype=F64),
                torch.tensor(b, dtype=F64), R) for m, c, b, R in cases]
    pis.append(body(torch.tensor(0.5, dtype=F64), torch.zeros(3, dtype=F64),
                    torch.tensor([1e-8, 2e-4, 3e-4], dtype=F64), random_rotation(1, gen)[0]))
    return torch.stack(pis)


def unit_diagonal_min_eig(pi: torch.Tensor) -> torch.Tensor:
    J = pseudo_inertia(pi)
    scale = J.diagonal(dim1=-2, dim2=-1).rsqrt()
    return torch.linalg.eigvalsh(scale[..., :, None] * J * scale[..., None, :])[..., 0]


def test_registry():
    for name in ALL:
        param = make_parameterization(name)
        assert param.name == name
        assert param.size == 10
    with pytest.raises(ValueError) as info:
        make_parameterization('cholesky')
    for name in ALL:
        assert repr(name) in str(info.value)


@pytest.mark.parametrize('name', CONSTRAINED)
@pytest.mark.parametrize('scale', [1.0, 2.0])
def test_every_random_theta_is_consistent(name, scale):
    theta = scale * torch.randn(20000, 10, generator=generator(1), dtype=F64)
    pi = make_parameterization(name).to_inertial(theta)
    assert bool(is_physically_consistent(pi).all())


# Large magnitudes, one group of parameters at a time: (columns, scale, lower clamp, common).
# Making every entry huge at once does not test the parameterization: pi stores the inertia
# about the link origin, so a body whose spread is below ~1e-13 of m |c|^2, or with an aspect
# ratio beyond ~1e7, is lost to round-off in pi itself, whatever produced it (see the module
# docstring). The clamps keep the second moments above ~1e-11 of the CoM term; 'common' scales
# all columns of the group by one shared draw (an isotropic change of size).
LARGE = {
    'diffnea': {
        'mass': (slice(0, 1), 40.0, None, False),        # m from ~1e-50 to ~1e2 kg
        'com': (slice(1, 4), 30.0, None, False),
        'moments': (slice(4, 7), 1000.0, -25.0, False),  # b from ~1e-11 to ~1e3 kg m^2
        'moments_common': (slice(4, 7), 1e6, -25.0, True),
        'rotation': (slice(7, 10), 1000.0, None, False),  # wraps around many times
    },
    'log_cholesky': {
        'alpha': (slice(0, 1), 50.0, None, False),       # pure scaling of J by exp(2 alpha)
        'log_diagonal': (slice(1, 4), 4.0, -3.0, False),
        'log_diagonal_common': (slice(1, 4), 50.0, -3.0, True),
        'shear': (slice(4, 7), 30.0, None, False),
        'offset': (slice(7, 10), 30.0, None, False),
    },
}


@pytest.mark.parametrize('name,group', [(n, g) for n in LARGE for g in LARGE[n]])
def test_large_magnitudes_are_consistent(name, group):
    index, scale, lower, common = LARGE[name][group]
    gen = generator(2)
    theta = torch.randn(5000, 10, generator=gen, dtype=F64)
    if common:
        theta[:, index] += scale * torch.randn(5000, 1, generator=gen, dtype=F64)
    else:
        theta[:, index] *= scale
    if lower is not None:
        theta[:, index] = theta[:, index].clamp_min(lower)
    pi = make_parameterization(name).to_inertial(theta)
    assert bool(torch.isfinite(pi).all())
    assert bool(is_physically_consistent(pi).all())


@pytest.mark.parametrize('name', ALL)
def test_round_trip_random_bodies(name):
    pi = random_bodies(5000, seed=3)
    param = make_parameterization(name)
    back = param.to_inertial(param.from_inertial(pi))
    torch.testing.assert_close(back, pi, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize('name', CONSTRAINED)
def test_round_trip_degenerate_bodies(name):
    pi = degenerate_bodies()
    assert bool(is_physically_consistent(pi).all())
    param = make_parameterization(name)
    theta = param.from_inertial(pi)
    assert bool(torch.isfinite(theta).all())
    torch.testing.assert_close(param.to_inertial(theta), pi, rtol=1e-9, atol=1e-9)


def test_log_cholesky_theta_round_trip():
    # The log-Cholesky map is a bijection, so theta itself is recovered.
    param = make_parameterization('log_cholesky')
    theta = torch.randn(2000, 10, generator=generator(4), dtype=F64)
    torch.testing.assert_close(param.from_inertial(param.to_inertial(theta)), theta,
                               rtol=1e-9, atol=1e-9)


def test_diffnea_rotation_log_stays_below_120_degrees():
    param = make_parameterization('diffnea')
    theta = param.from_inertial(random_bodies(2000, seed=5))
    angle = theta[:, 7:10].norm(dim=-1)
    assert float(angle.max()) <= 2 * torch.pi / 3 + 1e-9


@pytest.mark.parametrize('name', ALL)
def test_gradcheck(name):
    param = make_parameterization(name)
    theta = torch.randn(3, 10, generator=generator(6), dtype=F64, requires_grad=True)
    assert gradcheck(param.to_inertial, (theta,))


def test_gradcheck_diffnea_at_identity_rotation():
    param = make_parameterization('diffnea')
    theta = torch.randn(2, 10, generator=generator(8), dtype=F64)
    theta[:, 7:10] = 0.0
    theta.requires_grad_(True)
    assert gradcheck(param.to_inertial, (theta,))


@pytest.mark.parametrize('name', ALL)
def test_batch_broadcasting_matches_loop(name):
    param = make_parameterization(name)
    n_particles, n_bodies = 4, 3
    theta = torch.randn(n_particles, 1, n_bodies, 10, generator=generator(9), dtype=F64)
    pi = param.to_inertial(theta)
    assert pi.shape == (n_particles, 1, n_bodies, 10)
    for p in range(n_particles):
        for b in range(n_bodies):
            torch.testing.assert_close(pi[p, 0, b], param.to_inertial(theta[p, 0, b]),
                                       rtol=1e-12, atol=1e-12)
    theta_back = param.from_inertial(pi)
    assert theta_back.shape == theta.shape


@pytest.mark.parametrize('name', ALL)
def test_float32_keeps_dtype(name):
    theta = torch.randn(5, 10, generator=generator(10)).to(torch.float32)
    pi = make_parameterization(name).to_inertial(theta)
    assert pi.dtype == torch.float32


@pytest.mark.parametrize('name', ALL)
def test_bad_shapes_raise_shape_error(name):
    param = make_parameterization(name)
    with pytest.raises(ShapeError, match=r'expected shape \(\.\.\., 10\), got \(3, 9\)'):
        param.to_inertial(torch.zeros(3, 9, dtype=F64))
    with pytest.raises(ShapeError, match=r'got \(3, 4\)'):
        param.from_inertial(torch.zeros(3, 4, dtype=F64))


@pytest.mark.parametrize('name', CONSTRAINED)
def test_point_mass_and_thin_rod_need_regularization(name):
    """Degenerate bodies have no finite preimage; regularize_inertial makes them feasible."""
    mass = torch.tensor([0.2, 0.127], dtype=F64)
    com = torch.tensor([[0.0, 0.0, 0.1], [0.0, 0.0, 0.168]], dtype=F64)
    length = 0.3365
    inertia_com = torch.zeros(2, 3, 3, dtype=F64)
    rod = 0.127 * length ** 2 / 12
    inertia_com[1] = torch.diag(torch.tensor([rod, rod, 0.0], dtype=F64))
    pi = inertial_from_mass_com_inertia(mass, com, inertia_com)
    param = make_parameterization(name)
    assert not bool(is_physically_consistent(pi).any())
    with pytest.raises(ValueError, match='regularize_inertial'):
        param.from_inertial(pi)

    radius = 1e-3
    regular = regularize_inertial(pi, radius)
    expected = pi.clone()
    for k in (4, 7, 9):
        expected[:, k] += 2 * mass * radius ** 2
    torch.testing.assert_close(regular, expected, rtol=0, atol=1e-15)
    theta = param.from_inertial(regular)
    torch.testing.assert_close(param.to_inertial(theta), regular, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize('name', CONSTRAINED)
def test_from_inertial_rejects_infeasible(name):
    triangle = inertial_from_mass_com_inertia(
        torch.tensor(1.0, dtype=F64), torch.zeros(3, dtype=F64),
        torch.diag(torch.tensor([1.0, 1.0, 2.5], dtype=F64)))
    negative_mass = torch.tensor([-1.0, 0, 0, 0, 1, 0, 0, 1, 0, 1], dtype=F64)
    for pi in (triangle, negative_mass):
        with pytest.raises(ValueError, match='not strictly physically consistent'):
            make_parameterization(name).from_inertial(pi[None])


def test_pseudo_inertia_of_uniform_box():
    mass, sides = 3.0, torch.tensor([0.1, 0.2, 0.4], dtype=F64)
    com = torch.tensor([0.5, -0.25, 1.0], dtype=F64)
    second = mass * sides ** 2 / 12
    inertia_com = torch.diag(second.sum() - second)
    pi = inertial_from_mass_com_inertia(torch.tensor(mass, dtype=F64), com, inertia_com)
    J = pseudo_inertia(pi)
    expected = torch.zeros(4, 4, dtype=F64)
    expected[:3, :3] = torch.diag(second) + mass * torch.outer(com, com)
    expected[:3, 3] = expected[3, :3] = mass * com
    expected[3, 3] = mass
    torch.testing.assert_close(J, expected, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(inertial_from_pseudo_inertia(J), pi, rtol=1e-14, atol=1e-14)


def test_mass_com_inertia_inverts_parallel_axis():
    pi = random_bodies(100, seed=11)
    mass, com, inertia_com = mass_com_inertia(pi)
    torch.testing.assert_close(inertial_from_mass_com_inertia(mass, com, inertia_com), pi,
                               rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(inertia_com, inertia_com.transpose(-1, -2))


def test_is_physically_consistent_margin_and_batch():
    pi = degenerate_bodies()[:2]                      # near lamina, near rod
    assert bool(is_physically_consistent(pi).all())
    assert not bool(is_physically_consistent(pi, eps=1e-4).any())
    batch = random_bodies(6, seed=12).reshape(2, 3, 10)
    assert is_physically_consistent(batch).shape == (2, 3)
    assert float(unit_diagonal_min_eig(batch).min()) > 0


def test_kinematic_identity_and_nominal():
    theta = torch.randn(2, 4, 6, generator=generator(13), dtype=F64)
    xyz, rpy = KinematicParameterization().to_xyz_rpy(theta)
    assert torch.equal(xyz, theta[..., :3]) and torch.equal(rpy, theta[..., 3:])

    xyz0 = torch.randn(4, 3, generator=generator(14), dtype=F64)
    rpy0 = torch.randn(4, 3, generator=generator(15), dtype=F64)
    kin = KinematicParameterization(xyz0, rpy0)
    xyz, rpy = kin.to_xyz_rpy(torch.zeros(4, 6, dtype=F64))
    torch.testing.assert_close(xyz, xyz0)
    torch.testing.assert_close(rpy, rpy0)
    torch.testing.assert_close(kin.from_xyz_rpy(*kin.to_xyz_rpy(theta)), theta)


def test_kinematic_bounded():
    xyz0 = torch.tensor([[0.0, 0.0, 0.3], [0.1, 0.0, 0.0]], dtype=F64)
    kin = KinematicParameterization(xyz0, None, xyz_radius=0.01, rpy_radius=0.05)
    theta = 100 * torch.randn(3, 2, 6, generator=generator(16), dtype=F64)
    xyz, rpy = kin.to_xyz_rpy(theta)
    assert float((xyz - xyz0).abs().max()) <= 0.01 + 1e-15
    assert float(rpy.abs().max()) <= 0.05
    small = 0.5 * torch.randn(3, 2, 6, generator=generator(17), dtype=F64)
    torch.testing.assert_close(kin.from_xyz_rpy(*kin.to_xyz_rpy(small)), small)
    with pytest.raises(ValueError, match='bound'):
        kin.from_xyz_rpy(xyz0 + 0.02, torch.zeros(2, 3, dtype=F64))
    with pytest.raises(ShapeError):
        kin.to_xyz_rpy(torch.zeros(2, 5, dtype=F64))
    with pytest.raises(ValueError, match='xyz_radius'):
        KinematicParameterization(xyz_radius=0.0)
    gradcheck(lambda t: kin.to_xyz_rpy(t), (small.requires_grad_(True),))
