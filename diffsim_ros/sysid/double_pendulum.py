"""
The 11-parameter planar double pendulum of the IBM video data set (CSVGD, Heiden et al. 2022).

The model follows the compound pendulum of tiny-differentiable-simulator that CSVGD fits to
the IBM "double pendulum chaotic" recordings, with the centre of mass of link 1 freed so that
a bar-shaped first arm does not bias its length.  Angles are measured from the downward
vertical, ``q2`` relative to link 1; the arm swings in the world x-z plane (z up) with the
elbow at ``l1 (sin q1, 0, -cos q1)`` (joint axes ``-y``, as the shipped ``double_pendulum``
robot); in the IBM videos gravity points along image +x, so world x = image y and world
z = -image x (see :func:`diffsim_ros.io.datasets.load_ibm_double_pendulum`).

The 11 parameters (:data:`PARAMETER_NAMES`, SI units):

===  =====================  ============================================================
 #   name                   meaning
===  =====================  ============================================================
 1   ``link_1/length``      ``l1``: pivot to elbow (the joint-2 offset), m
 2   ``link_2/length``      ``l2``: elbow to tip marker = centre of mass of link 2, m
 3   ``link_1/mass``        ``m1``, kg
 4   ``link_2/mass``        ``m2``, kg
 5   ``link_1/com``         ``c1``: centre of mass of link 1 from the pivot, m
 6   ``link_1/inertia``     ``I1``: moment of link 1 about its centre of mass, kg m^2
 7   ``link_2/inertia``     ``I2``: moment of link 2 about its centre of mass, kg m^2
 8   ``joint_1/damping``    viscous ``d1``, N m s/rad
 9   ``joint_2/damping``    viscous ``d2``, N m s/rad
10   ``joint_1/friction``   Coulomb ``f1``, N m (``f tanh(qd / velocity_scale)``)
11   ``joint_2/friction``   Coulomb ``f2``, N m
===  =====================  ============================================================

An unactuated pendulum observed through its angles alone determines its parameters only up
to one common scale of all masses, inertias and friction, and ``l2`` only together with
``I2`` (``l2 <= (I2 + m2 l2^2) / (m2 l2)``); ``l1`` is identifiable (the ratio of the
coupling inertia ``m2 l1 l2`` to the gravity term ``m2 l2 g``).

:func:`double_pendulum_urdf` / :func:`double_pendulum_model` build the same system as a URDF
and a (particle-batched) :class:`~diffsim_ros.core.model.RobotModel`, which the tests compare
with the closed-form dynamics of :func:`forward_dynamics`.  :class:`DoublePendulumSimulator`
simulates a particle batch with the closed form (a few dozen tensor operations per step
instead of a general ABA) and plugs into :mod:`diffsim_ros.sysid.likelihoods` as a
``TrajectorySimulator``; its parameters are the unconstrained coordinates ``z`` of a
:class:`~diffsim_ros.sysid.svgd.ParameterMap`, so every particle is a valid pendulum.
"""

from typing import Callable, Dict, Mapping, Optional, Sequence, Tuple, Union

import torch

from .consistency import knn_kl_divergence, mmd
from .dataset import Trajectory
from .likelihoods import MultipleShooting, SingleShooting
from .svgd import ParameterMap, sobol_particles
from ..core.errors import ShapeError
from ..core.model import RobotModel
from ..core.urdf import load_urdf

Tensor = torch.Tensor

#: Movable joints of the model and of the IBM trajectories, in model order.
JOINT_NAMES = ('joint_1', 'joint_2')
#: The 11 identified parameters, in particle order.
PARAMETER_NAMES = (
    'link_1/length', 'link_2/length', 'link_1/mass', 'link_2/mass', 'link_1/com',
    'link_1/inertia', 'link_2/inertia', 'joint_1/damping', 'joint_2/damping',
    'joint_1/friction', 'joint_2/friction',
)
#: Published arm lengths (Asseman et al. 2018): pivot-elbow, elbow-tip marker distances, m.
TRUE_LENGTHS = (0.091, 0.070)
#: Prior box of the parameters (uniform), in :data:`PARAMETER_NAMES` order.
LOWER = (0.04, 0.04, 0.02, 0.02, 0.005, 1e-7, 1e-7, 1e-7, 1e-7, 1e-7, 1e-7)
UPPER = (0.15, 0.15, 0.4, 0.4, 0.15, 3e-4, 3e-4, 5e-4, 5e-4, 5e-4, 5e-4)
#: A plausible pendulum inside the prior (aluminium bars of about 0.1 m), for simulation.
NOMINAL = (0.091, 0.070, 0.1, 0.08, 0.05, 8e-5, 4e-5, 2e-5, 1e-5, 2e-5, 1e-5)
#: Speed over which Coulomb friction ramps up, rad/s.
VELOCITY_SCALE = 0.1
GRAVITY = 9.81
METHODS = ('semi_implicit_euler', 'rk4')


def parameter_map(bounds: Optional[Mapping[str, Tuple[float, float]]] = None) -> ParameterMap:
    """
    Return the named map between the 11 physical parameters and unconstrained coordinates.

    :param bounds: ``{name: (lower, upper)}`` replacing the prior box of some parameters,
        e.g. ``{'link_1/length': (0.0905, 0.0915)}`` to pin a measured arm length.
    :return: :class:`~diffsim_ros.sysid.svgd.ParameterMap` over the box ``[LOWER, UPPER]``.
    :raises ValueError: unknown names or an empty or reversed box.
    """
    lower, upper = list(LOWER), list(UPPER)
    for name, box in (bounds or {}).items():
        if name not in PARAMETER_NAMES:
            raise ValueError(f'unknown double-pendulum parameter {name!r}; valid: '
                             f'{", ".join(PARAMETER_NAMES)}')
        lo, hi = (float(v) for v in box)
        if not lo < hi:
            raise ValueError(f'{name}: need lower < upper, got ({lo}, {hi})')
        index = PARAMETER_NAMES.index(name)
        lower[index], upper[index] = lo, hi
    return ParameterMap(PARAMETER_NAMES, lower, upper)


def _check_params(params: Tensor) -> None:
    if params.dim() < 1 or params.shape[-1] != len(PARAMETER_NAMES):
        raise ShapeError(f'params: expected shape (..., {len(PARAMETER_NAMES)}), got '
                         f'{tuple(params.shape)}')


def double_pendulum_urdf(params: Optional[Mapping[str, float]] = None) -> str:
    """
    Return the URDF of one pendulum.

    :param params: physical values by :data:`PARAMETER_NAMES` (missing ones: :data:`NOMINAL`).
    :return: URDF text with joints ``joint_1``, ``joint_2`` (axes ``-y``, angles from the
        downward vertical), damping and Coulomb friction in ``<dynamics>``.
    """
    values = dict(zip(PARAMETER_NAMES, NOMINAL))
    unknown = sorted(set(params or {}) - set(values))
    if unknown:
        raise ValueError(f'unknown double-pendulum parameter(s) {unknown}; valid: '
                         f'{", ".join(PARAMETER_NAMES)}')
    values.update({k: float(v) for k, v in (params or {}).items()})
    v = values

    def inertial(mass: float, com: float, moment: float) -> str:
        return (f'<inertial><origin xyz="0 0 {-com!r}" rpy="0 0 0"/><mass value="{mass!r}"/>'
                f'<inertia ixx="{moment!r}" ixy="0" ixz="0" iyy="{moment!r}" iyz="0" '
                f'izz="{moment!r}"/></inertial>')

    def joint(k: int, parent: str, child: str, z: float) -> str:
        return (f'<joint name="joint_{k}" type="continuous"><parent link="{parent}"/>'
                f'<child link="{child}"/><origin xyz="0 0 {z!r}" rpy="0 0 0"/>'
                f'<axis xyz="0 -1 0"/><dynamics damping="{v[f"joint_{k}/damping"]!r}" '
                f'friction="{v[f"joint_{k}/friction"]!r}"/></joint>')

    return '\n'.join([
        '<?xml version="1.0"?>', '<robot name="ibm_double_pendulum">',
        '<link name="base_link"/>',
        joint(1, 'base_link', 'link_1', 0.0),
        '<link name="link_1">' + inertial(v['link_1/mass'], v['link_1/com'],
                                          v['link_1/inertia']) + '</link>',
        joint(2, 'link_1', 'link_2', -v['link_1/length']),
        '<link name="link_2">' + inertial(v['link_2/mass'], v['link_2/length'],
                                          v['link_2/inertia']) + '</link>',
        '<joint name="tip_joint" type="fixed"><parent link="link_2"/><child link="tip"/>'
        f'<origin xyz="0 0 {-v["link_2/length"]!r}" rpy="0 0 0"/></joint>',
        '<link name="tip"/>', '</robot>', ''])


def double_pendulum_model(params: Tensor, dtype: torch.dtype = torch.float64) -> RobotModel:
    """
    Return the pendulum(s) as a :class:`RobotModel`, differentiable in the parameters.

    :param params: physical parameters ``(..., 11)`` in :data:`PARAMETER_NAMES` order.
    :param dtype: dtype of the model.
    :return: model whose ``origin_xyz``, ``inertial``, ``damping`` and ``friction`` carry the
        batch dims ``(...)`` of ``params`` (joint friction is applied by
        :func:`~diffsim_ros.core.integrators.with_joint_friction`, not by ABA).
    """
    _check_params(params)
    base = load_urdf(xml=double_pendulum_urdf(), dtype=dtype)
    p = params.to(dtype)
    l1, l2, m1, m2, c1, i1, i2, d1, d2, f1, f2 = p.unbind(-1)
    zero = torch.zeros_like(l1)
    # Joint origins relative to the parent link: joint 2 sits l1 below the pivot along link 1.
    origin = torch.stack([torch.stack([zero, zero, zero], -1),
                          torch.stack([zero, zero, -l1], -1)], -2)

    def body(mass: Tensor, com: Tensor, moment: Tensor) -> Tensor:
        # pi = [m, m c, I about the link origin]; c = (0, 0, -com), I_com isotropic
        shifted = moment + mass * com.square()
        return torch.stack([mass, zero, zero, -mass * com, shifted, zero, zero, shifted, zero,
                            moment], -1)

    inertial = torch.stack([body(m1, c1, i1), body(m2, l2, i2)], -2)
    return base.replace(origin_xyz=origin, inertial=inertial,
                        damping=torch.stack([d1, d2], -1), friction=torch.stack([f1, f2], -1))


def _coefficients(params: Tensor, gravity: float) -> Tuple[Tensor, ...]:
    """Return the closed-form coefficients ``A, B, C, G1, G2, d1, d2, f1, f2`` ``(...)``."""
    l1, l2, m1, m2, c1, i1, i2, d1, d2, f1, f2 = params.unbind(-1)
    B = m2 * l1 * l2
    C = i2 + m2 * l2.square()
    A = i1 + m1 * c1.square() + C + m2 * l1.square()
    return A, B, C, gravity * (m1 * c1 + m2 * l1), gravity * m2 * l2, d1, d2, f1, f2


def _accelerations(coefficients: Sequence[Tensor], q1: Tensor, q2: Tensor, w1: Tensor,
                   w2: Tensor, velocity_scale: float) -> Tuple[Tensor, Tensor]:
    A, B, C, G1, G2, d1, d2, f1, f2 = coefficients
    cos2, sin2 = torch.cos(q2), torch.sin(q2)
    Bc, Bs = B * cos2, B * sin2
    M11 = A + 2.0 * Bc
    M12 = C + Bc
    gravity2 = G2 * torch.sin(q1 + q2)
    # generalized forces: friction minus Coriolis/centrifugal minus gravity
    r1 = Bs * w2 * (2.0 * w1 + w2) - G1 * torch.sin(q1) - gravity2 - d1 * w1 \
        - f1 * torch.tanh(w1 / velocity_scale)
    r2 = -Bs * w1.square() - gravity2 - d2 * w2 - f2 * torch.tanh(w2 / velocity_scale)
    inv_det = 1.0 / (M11 * C - M12.square())
    return (C * r1 - M12 * r2) * inv_det, (M11 * r2 - M12 * r1) * inv_det


def forward_dynamics(params: Tensor, x: Tensor, gravity: float = GRAVITY,
                     velocity_scale: float = VELOCITY_SCALE) -> Tensor:
    """
    Return the joint accelerations of the unactuated pendulum, in closed form.

    :param params: physical parameters ``(..., 11)``, broadcasting against ``x[..., 0]``.
    :param x: states ``(..., 4)`` = ``[q1, q2, qd1, qd2]`` (rad, rad/s).
    :param gravity: gravitational acceleration, m/s^2.
    :param velocity_scale: Coulomb ramp, rad/s.
    :return: ``(..., 2)`` accelerations, rad/s^2, with joint damping and friction.
    """
    _check_params(params)
    a1, a2 = _accelerations(_coefficients(params, gravity), *x.unbind(-1), velocity_scale)
    return torch.stack((a1, a2), -1)


class _ModelMap:
    """``z (P, 11) -> RobotModel`` with the ``dim`` that the likelihoods ask for."""

    def __init__(self, parameters: ParameterMap) -> None:
        self.parameters = parameters
        self.dim = parameters.dim

    def __call__(self, z: Tensor) -> RobotModel:
        return double_pendulum_model(self.parameters.physical(z), z.dtype)


def _rk4_step(coefficients: Sequence[Tensor], q1: Tensor, q2: Tensor, w1: Tensor, w2: Tensor,
              h: float, vs: float) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    k1 = _accelerations(coefficients, q1, q2, w1, w2, vs)
    k2 = _accelerations(coefficients, q1 + 0.5 * h * w1, q2 + 0.5 * h * w2,
                        w1 + 0.5 * h * k1[0], w2 + 0.5 * h * k1[1], vs)
    k3 = _accelerations(coefficients, q1 + 0.5 * h * (w1 + 0.5 * h * k1[0]),
                        q2 + 0.5 * h * (w2 + 0.5 * h * k1[1]),
                        w1 + 0.5 * h * k2[0], w2 + 0.5 * h * k2[1], vs)
    k4 = _accelerations(coefficients, q1 + h * (w1 + 0.5 * h * k2[0]),
                        q2 + h * (w2 + 0.5 * h * k2[1]), w1 + h * k3[0], w2 + h * k3[1], vs)
    # q' = qd, so the velocity stages of RK4 are the w of each stage
    dq1 = w1 + 2.0 * (w1 + 0.5 * h * k1[0]) + 2.0 * (w1 + 0.5 * h * k2[0]) + (w1 + h * k3[0])
    dq2 = w2 + 2.0 * (w2 + 0.5 * h * k1[1]) + 2.0 * (w2 + 0.5 * h * k2[1]) + (w2 + h * k3[1])
    return (q1 + h / 6.0 * dq1, q2 + h / 6.0 * dq2,
            w1 + h / 6.0 * (k1[0] + 2.0 * k2[0] + 2.0 * k3[0] + k4[0]),
            w2 + h / 6.0 * (k1[1] + 2.0 * k2[1] + 2.0 * k3[1] + k4[1]))


def _sample_period(method: str, substeps: int, h: float, vs: float) -> Callable:
    """Return ``step(coefficients, q1, q2, w1, w2) -> (q1, q2, w1, w2, state)``."""

    def step(coefficients: Sequence[Tensor], q1: Tensor, q2: Tensor, w1: Tensor,
             w2: Tensor) -> Tuple[Tensor, ...]:
        for _ in range(substeps):
            if method == 'semi_implicit_euler':
                a1, a2 = _accelerations(coefficients, q1, q2, w1, w2, vs)
                w1, w2 = w1 + h * a1, w2 + h * a2
                q1, q2 = q1 + h * w1, q2 + h * w2
            else:
                q1, q2, w1, w2 = _rk4_step(coefficients, q1, q2, w1, w2, h, vs)
        return q1, q2, w1, w2, torch.stack((q1, q2, w1, w2), -1)
    return step


#: ``torch.compile``-d sample periods by ``(method, substeps, h, velocity_scale)``.
_COMPILED: Dict[tuple, Callable] = {}


def _compiled_sample_period(method: str, substeps: int, h: float, vs: float) -> Callable:
    key = (method, substeps, h, vs)
    if key not in _COMPILED:
        # One fused C++ kernel per sample period, forward and backward: the step is a few
        # dozen elementwise operations whose per-call overhead dominates in eager mode.
        _COMPILED[key] = torch.compile(_sample_period(method, substeps, h, vs),
                                       dynamic=False, options={'cpp_wrapper': True})
    return _COMPILED[key]


class DoublePendulumSimulator:
    """
    Batched closed-form simulator of the unactuated pendulum (``TrajectorySimulator`` API).

    Particles hold the unconstrained coordinates ``z`` of :func:`parameter_map`; use
    ``physical(z)`` of :attr:`parameters` for the physical values.
    """

    def __init__(self, dt: float, method: str = 'semi_implicit_euler', substeps: int = 1,
                 parameters: Optional[ParameterMap] = None, gravity: float = GRAVITY,
                 velocity_scale: float = VELOCITY_SCALE, compiled: bool = False) -> None:
        """
        Build the simulator.

        :param dt: sample period of the states it returns, s.
        :param method: ``'semi_implicit_euler'`` (as tiny-differentiable-simulator) or
            ``'rk4'``.
        :param substeps: integration steps per sample period.
        :param parameters: the parameter map (default :func:`parameter_map`).
        :param gravity: gravitational acceleration, m/s^2.
        :param velocity_scale: Coulomb ramp, rad/s.
        :param compiled: run each sample period through a ``torch.compile``-d step (one
            fused kernel forward and backward; several times faster for repeated calls
            with the same shapes, but each new shape compiles first, tens of seconds).
        """
        if method not in METHODS:
            raise ValueError(f'unknown integrator {method!r}; valid: {", ".join(METHODS)}')
        if not dt > 0 or int(substeps) != substeps or substeps < 1:
            raise ValueError(f'need dt > 0 and a positive integer substeps, got dt={dt}, '
                             f'substeps={substeps}')
        self.parameters = parameters or parameter_map()
        self.params_to_model = _ModelMap(self.parameters)
        self.dt = float(dt)
        self.method = method
        self.substeps = int(substeps)
        self.gravity = float(gravity)
        self.velocity_scale = float(velocity_scale)
        self.compiled = bool(compiled)

    def simulate(self, params: Tensor, x0: Tensor, controls: Tensor) -> Tensor:
        """
        Simulate every particle from every start state.

        :param params: ``(P, 11)`` unconstrained coordinates of the parameters.
        :param x0: start states ``(..., P or 1, 4)``; the second-to-last dim is the particle
            dim.
        :param controls: ``(..., 1, T, m)``; only ``T`` is used (the pendulum is unactuated).
        :return: states ``(..., P, T + 1, 4)`` including the start states.
        """
        if params.dim() != 2:
            raise ShapeError(f'params: expected shape (P, 11), got {tuple(params.shape)}')
        return self.simulate_physical(self.parameters.physical(params), x0, controls.shape[-2])

    def simulate_physical(self, physical: Tensor, x0: Tensor, steps: int) -> Tensor:
        """
        Simulate physical parameters ``(P, 11)`` for ``steps`` sample periods.

        :param physical: ``(P, 11)`` physical parameters.
        :param x0: start states ``(..., P or 1, 4)``.
        :param steps: number of sample periods ``T``.
        :return: states ``(..., P, T + 1, 4)``.
        """
        _check_params(physical)
        if x0.shape[-1] != 4:
            raise ShapeError(f'x0: expected shape (..., P, 4), got {tuple(x0.shape)}')
        coefficients = _coefficients(physical.to(x0.dtype), self.gravity)
        x0 = x0.expand(x0.shape[:-2] + (physical.shape[0], 4))
        # contiguous operands: the compiled step would otherwise compile again for strides
        q1, q2, w1, w2 = (v.contiguous() for v in x0.unbind(-1))
        h = self.dt / self.substeps
        factory = _compiled_sample_period if self.compiled else _sample_period
        step = factory(self.method, self.substeps, h, self.velocity_scale)
        out = [x0]
        for _ in range(steps):
            q1, q2, w1, w2, state = step(coefficients, q1, q2, w1, w2)
            out.append(state)
        return torch.stack(out, -2)


def true_length_error(physical: Tensor) -> Tensor:
    """
    Return the error of the identified arm lengths against :data:`TRUE_LENGTHS`.

    :param physical: physical parameters ``(..., 11)``.
    :return: ``(..., 2)`` ``l - l_true`` in m.
    """
    _check_params(physical)
    return physical[..., :2] - physical.new_tensor(TRUE_LENGTHS)


#: Observation noise of the likelihood per state ``[q1, q2, qd1, qd2]`` (rad, rad/s): well above
#: the tracking noise, at the level of the model error over a shooting window.
SIGMA = (0.05, 0.05, 1.0, 1.0)


def state_references(trajectories: Sequence[Trajectory], horizon: int,
                     start: Union[int, Sequence[int]] = 0) -> Tensor:
    """
    Stack ``[q, qd]`` windows of trajectories into references for the likelihoods.

    :param trajectories: runs with ``q`` and ``qd`` in :data:`JOINT_NAMES` order.
    :param horizon: steps ``T`` after the first state.
    :param start: first sample index, or several: the windows of every start, start by start.
    :return: ``(R, T + 1, 4)``, ``R`` = runs x starts.
    """
    starts = [start] if isinstance(start, int) else list(start)
    last = max(starts) + horizon + 1
    states = []
    for traj in trajectories:
        if traj.qd is None or len(traj) < last:
            raise ValueError(f'trajectory {traj.run!r}: need qd and {last} samples, have '
                             f'{len(traj)}')
        traj = traj.reorder(JOINT_NAMES)
        states.append(torch.cat((traj.q, traj.qd), -1))
    return torch.stack([x[first:first + horizon + 1] for first in starts for x in states])


def make_likelihood(references: Tensor, dt: float, windows: int = 1,
                    sigma: Union[float, Sequence[float]] = SIGMA, combine: str = 'product',
                    method: str = 'semi_implicit_euler', substeps: int = 1,
                    compiled: bool = False, parameters: Optional[ParameterMap] = None
                    ) -> SingleShooting:
    """
    Return the single- (``windows = 1``) or multiple-shooting likelihood of references.

    :param references: ``(R, T + 1, 4)`` states, e.g. :func:`state_references`.
    :param dt: sample period, s.
    :param windows: shooting windows ``W`` (divides ``T``); 1 for single shooting.
    :param sigma: observation standard deviation per state coordinate.
    :param combine: ``'product'`` (one pendulum explains every reference) or ``'sum'``.
    :param method: integrator of :class:`DoublePendulumSimulator`.
    :param substeps: integration steps per sample.
    :param compiled: simulate with the ``torch.compile``-d step (see
        :class:`DoublePendulumSimulator`).
    :param parameters: the parameter map (default :func:`parameter_map`).
    :return: the likelihood; its particles hold the parameter coordinates ``z`` of
        ``parameters`` (then the shooting start states).
    """
    simulator = DoublePendulumSimulator(dt, method, substeps, parameters, compiled=compiled)
    controls = references.new_zeros(references.shape[0], references.shape[1] - 1, 1)
    sigma = torch.as_tensor(sigma, dtype=references.dtype)
    if windows == 1:
        return SingleShooting(simulator, references, controls, sigma, combine)
    return MultipleShooting(simulator, references, controls, sigma, windows, combine)


def log_posterior(likelihood: SingleShooting) -> Callable[[Tensor], Tensor]:
    """
    Return ``particles (P, D) -> log p (P,)``: the likelihood plus the uniform box prior.

    The uniform prior on the physical box is, in the coordinates ``z``, the log-Jacobian of
    the sigmoid map; the shooting start states get a flat prior.

    :param likelihood: from :func:`make_likelihood`.
    :return: the differentiable log density.
    """
    parameters = likelihood.simulator.parameters

    def log_prob(particles: Tensor) -> Tensor:
        prior = parameters.log_abs_det_jacobian(particles[:, :parameters.dim])
        return likelihood.log_prob(particles) + prior
    return log_prob


def log_posterior_and_defects(likelihood: MultipleShooting
                              ) -> Callable[[Tensor], Tuple[Tensor, Tensor]]:
    """
    Return ``particles (P, D) -> (log p (P,), defects (P, k))`` from one rollout.

    The same density as :func:`log_posterior` and the constraints of
    :func:`constraint_function`, for :meth:`SVGD.run <diffsim_ros.sysid.svgd.SVGD.run>`
    with ``with_constraints=True`` (one rollout per step instead of two).

    :param likelihood: a multiple-shooting likelihood from :func:`make_likelihood`.
    :return: the differentiable pair.
    """
    if not isinstance(likelihood, MultipleShooting):
        raise ValueError('log_posterior_and_defects needs a multiple-shooting likelihood '
                         '(windows > 1)')
    parameters = likelihood.simulator.parameters

    def evaluate(particles: Tensor) -> Tuple[Tensor, Tensor]:
        prior = parameters.log_abs_det_jacobian(particles[:, :parameters.dim])
        log_prob, defects = likelihood.log_prob_and_defects(particles)
        return log_prob + prior, defects
    return evaluate


def constraint_function(likelihood: SingleShooting) -> Optional[Callable[[Tensor], Tensor]]:
    """
    Return the shooting defects of a multiple-shooting likelihood, None for single shooting.

    :param likelihood: from :func:`make_likelihood`.
    :return: ``particles (P, D) -> c (P, k)`` or None.
    """
    return likelihood.defects if isinstance(likelihood, MultipleShooting) else None


def initial_particles(likelihood: SingleShooting, count: int, seed: int = 0,
                      spread: float = 2.0) -> Tensor:
    """
    Return Sobol-initialised particles: parameters spread over the prior, starts on the data.

    :param likelihood: from :func:`make_likelihood`.
    :param count: number of particles ``P``.
    :param seed: Sobol scrambling seed.
    :param spread: parameter coordinates fill ``[-spread, spread]`` (``z = +-2`` covers 76 %
        of each range).
    :return: ``(P, D)``.
    """
    dim = likelihood.simulator.parameters.dim
    z = sobol_particles(count, [-spread] * dim, [spread] * dim, seed=seed,
                        dtype=likelihood.references.dtype)
    return likelihood.pack(z)


def maximum_likelihood(likelihood: SingleShooting, starts: int = 8, steps: int = 800,
                       lr: float = 0.05, seed: int = 0) -> Tuple[float, Tensor]:
    """
    Fit one pendulum by maximum likelihood: Adam from Sobol starts, keep the best.

    The steps climb the posterior (likelihood plus the box prior's log-Jacobian, which keeps
    the coordinates finite); the best start is chosen, and reported, by the likelihood alone.

    :param likelihood: from :func:`make_likelihood`.
    :param starts: Sobol starts (:func:`initial_particles`).
    :param steps: Adam steps.
    :param lr: Adam step size in the coordinates ``z``.
    :param seed: Sobol scrambling seed.
    :return: ``(log-likelihood, physical parameters (11,))`` of the best start.
    """
    z = initial_particles(likelihood, starts, seed=seed).requires_grad_()
    optimizer = torch.optim.Adam([z], lr=lr)
    objective = log_posterior(likelihood)
    for _ in range(steps):
        optimizer.zero_grad()
        (-objective(z).sum()).backward()
        optimizer.step()
    with torch.no_grad():
        log_likelihood = likelihood.log_prob(z)
        best = int(log_likelihood.argmax())
        return float(log_likelihood[best]), physical_parameters(likelihood, z)[best]


def physical_parameters(likelihood: SingleShooting, particles: Tensor) -> Tensor:
    """
    Return the physical parameters ``(P, 11)`` of particles.

    :param likelihood: from :func:`make_likelihood`.
    :param particles: ``(P, D)``.
    :return: ``(P, 11)`` in :data:`PARAMETER_NAMES` order.
    """
    return likelihood.simulator.parameters.physical(likelihood.unpack(particles))


#: Ways :func:`trajectory_metrics` forms the simulated sample sets.
POOLING = ('particle', 'pooled')


def trajectory_metrics(physical: Tensor, references: Tensor, dt: float, stride: int = 10,
                       k: int = 3, method: str = 'semi_implicit_euler', substeps: int = 1,
                       pooling: str = 'particle') -> Dict[str, float]:
    """
    Compare real trajectories with the parameter samples' simulations (CSVGD Table 2).

    Every sample is simulated from each real trajectory's first state over its horizon;
    trajectories are sampled every ``stride`` steps, scaled per state coordinate by the real
    standard deviation and flattened to one vector each.

    With ``pooling='particle'`` each parameter sample ``p`` gives a simulated set of ``R``
    trajectories, one from each real start, like the real set; ``KL(real || sim_p)``,
    ``KL(sim_p || real)`` and ``MMD(real, sim_p)`` are averaged over the samples (the
    posterior expectation).  With ``'pooled'`` the real set is compared with all ``R P``
    simulations at once; then the ``P`` simulations from one start are each other's nearest
    neighbours, so the k-NN estimate of ``KL(sim || real)`` grows without bound as the
    posterior narrows, even for a perfect model (kept for comparison).

    :param physical: parameter samples ``(P, 11)``.
    :param references: held-out real states ``(R, T + 1, 4)``, ``R > k``.
    :param dt: sample period, s.
    :param stride: keep every ``stride``-th state of the trajectories.
    :param k: neighbour order of the KL estimator.
    :param method: integrator.
    :param substeps: integration steps per sample.
    :param pooling: ``'particle'`` or ``'pooled'``.
    :return: ``kl_real_sim``, ``kl_sim_real`` (nats) and ``mmd`` (squared MMD).
    """
    if pooling not in POOLING:
        raise ValueError(f'unknown pooling {pooling!r}; valid: {", ".join(POOLING)}')
    simulator = DoublePendulumSimulator(dt, method, substeps)
    with torch.no_grad():
        states = simulator.simulate_physical(physical.to(references.dtype),
                                             references[:, None, 0], references.shape[1] - 1)
        real = references[:, ::stride]
        sims = states[:, :, ::stride].transpose(0, 1)           # (P, R, T', 4)
        finite = torch.isfinite(sims).flatten(2).all(-1)
        sims = torch.where(finite[..., None, None], sims, real.new_tensor(1e6))
        scale = real.reshape(-1, real.shape[-1]).std(0)
        sets = [sims.reshape(-1, *real.shape[1:])] if pooling == 'pooled' else list(sims)
        values = torch.tensor([[float(knn_kl_divergence(real, sim, k, scale)),
                                float(knn_kl_divergence(sim, real, k, scale)),
                                float(mmd(real, sim, scale=scale))] for sim in sets])
        kl_real_sim, kl_sim_real, squared_mmd = values.mean(0).tolist()
        return {'kl_real_sim': kl_real_sim, 'kl_sim_real': kl_sim_real, 'mmd': squared_mmd}
