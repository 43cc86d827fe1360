"""
Gaussian trajectory likelihoods for particle-based inference (SVGD / constrained SVGD).

After Heiden et al., "Probabilistic Inference of Simulation Parameters via Parallel
Differentiable Simulation" (ICRA 2022, CSVGD):

- :class:`SingleShooting`: every particle (a vector of physical parameters) is simulated over
  the whole horizon from each reference trajectory's first state; the states are compared
  with a diagonal Gaussian of standard deviation ``sigma`` per state coordinate.
- :class:`MultipleShooting`: the horizon is cut into ``W`` equal windows; the start states of
  windows ``2..W`` become decision variables appended to the particle, every window is
  simulated from its own start and :meth:`MultipleShooting.defects` returns the continuity
  defects (end of window ``w`` minus start of window ``w + 1``) that constrained SVGD drives
  to zero with its augmented-Lagrangian update.
- Sets of reference trajectories (CSVGD appendix 1.2): ``combine='sum'`` is the equal-weight
  mixture (sum of Gaussians, log-sum-exp over references), which keeps one mode per
  reference; ``combine='product'`` multiplies the per-reference likelihoods (sum of logs),
  whose mode lies between the references.
- Normalisation (appendix 1.3): particles live in a normalised space; parameters are mapped
  from ``[low, high]`` to ``[-1, 1]`` and states by ``(x - state_offset) / state_scale``.

All particles (and all references and windows) are simulated in ONE batched call of
:func:`diffsim_ros.core.rollout`: the batched model's parameter dim ``P`` broadcasts against
the state batch, so :meth:`log_prob` maps ``(P, D)`` to ``(P,)`` and :meth:`defects`
``(P, D)`` to ``(P, k)``; both are differentiable plain callables for ``svgd.py``.
"""

import math
from typing import Callable, Optional, Sequence, Tuple, Union

import torch

from ..core.errors import ShapeError
from ..core.integrators import INTEGRATORS, rollout, with_joint_friction
from ..core.model import PARAMETER_FIELDS, RobotModel

Tensor = torch.Tensor
TorqueFn = Callable[[Tensor, Tensor, Tensor], Tensor]
ParamsToModel = Callable[[Tensor], RobotModel]

#: Ways of combining the likelihoods of several reference trajectories.
COMBINE = ('sum', 'product')


def gaussian_log_likelihood(simulated: Tensor, reference: Tensor, sigma: Tensor) -> Tensor:
    """
    Return the diagonal-Gaussian log density of ``reference`` around ``simulated``.

    :param simulated: states ``(..., T, s)``.
    :param reference: states ``(..., T, s)`` (broadcast against ``simulated``).
    :param sigma: standard deviation ``(s,)`` or scalar, in state units.
    :return: log-likelihood summed over time and state coordinates ``(...)``.
    """
    sigma = torch.as_tensor(sigma, dtype=simulated.dtype, device=simulated.device)
    z = (reference - simulated) * sigma.reciprocal()
    # The normalising constant is summed on the small (s,) vector, not per element.
    T = max(simulated.shape[-2], reference.shape[-2])
    log_norm = T * (torch.log(sigma) + 0.5 * math.log(2.0 * math.pi)).expand(
        simulated.shape[-1]).sum()
    return -0.5 * z.square().sum(dim=(-2, -1)) - log_norm


class ParameterMap:
    """
    Map a particle batch of physical parameters ``(P, d)`` to a batched :class:`RobotModel`.

    Parameter ``j`` acts on the entries ``model.<field>[index]`` of ``entries[j]``: with
    ``mode='scale'`` it multiplies the nominal values (e.g. ``('inertial', (0,))`` scales the
    whole inertial vector of body 0: its mass with the same CoM and shape), with
    ``mode='value'`` it replaces them (e.g. ``('damping', (0,))``).
    """

    def __init__(self, model: RobotModel, entries: Sequence[Tuple[str, tuple]],
                 mode: str = 'scale'):
        """
        Build the map.

        :param model: nominal robot (unbatched parameters).
        :param entries: one ``(field, index)`` per parameter; ``index`` indexes the field's
            unbatched tensor, e.g. ``(0,)`` or ``(1, 0)``.
        :param mode: ``'scale'`` or ``'value'``.
        """
        if mode not in ('scale', 'value'):
            raise ValueError(f"unknown mode {mode!r}; valid: 'scale', 'value'")
        self.model = model
        self.mode = mode
        self.entries = tuple((field, tuple(index)) for field, index in entries)
        self.masks = {}
        for j, (field, index) in enumerate(self.entries):
            if field not in PARAMETER_FIELDS:
                raise ValueError(f'unknown parameter field {field!r}; valid: '
                                 f'{", ".join(PARAMETER_FIELDS)}')
            nominal = getattr(model, field)
            mask = self.masks.setdefault(field, torch.zeros(
                (len(self.entries),) + tuple(nominal.shape), dtype=nominal.dtype,
                device=nominal.device))
            mask[(j,) + self.entries[j][1]] = 1.0

    @property
    def dim(self) -> int:
        """Return the number of parameters ``d``."""
        return len(self.entries)

    def __call__(self, params: Tensor) -> RobotModel:
        """
        Return the model with parameter batch dims ``(P,)``.

        :param params: ``(P, d)`` physical parameters (scale factors or values).
        :return: model whose mapped fields have shape ``(P, *field_shape)``.
        """
        if params.dim() != 2 or params.shape[-1] != self.dim:
            raise ShapeError(f'params: expected shape (P, {self.dim}), got {tuple(params.shape)}')
        changes = {}
        for field, mask in self.masks.items():
            nominal = getattr(self.model, field)
            # (P, d) x (d, *shape) -> (P, *shape)
            weights = torch.tensordot(params, mask, dims=1)
            covered = mask.sum(0)
            if self.mode == 'scale':
                changes[field] = nominal * (1.0 - covered + weights)
            else:
                changes[field] = nominal * (1.0 - covered) + weights
        return self.model.replace(**changes)


class TrajectorySimulator:
    """Simulate a particle batch of parameters with one batched :func:`rollout` call."""

    def __init__(self, params_to_model: ParamsToModel, dt: float, method: str = 'rk4',
                 torque_fn: Optional[TorqueFn] = None, joint_friction: bool = False,
                 velocity_scale: float = 1e-2):
        """
        Build the simulator.

        :param params_to_model: ``(P, d) -> RobotModel`` with parameter batch dims ``(P,)``,
            e.g. a :class:`ParameterMap`.
        :param dt: step in s.
        :param method: integrator name (``'rk4'`` or ``'semi_implicit_euler'``).
        :param torque_fn: ``(q, qd, u) -> tau`` command-to-torque map (joint torques if None).
        :param joint_friction: also apply the particle models' URDF damping and friction
            (so that ``damping``/``friction`` particles act on the dynamics).
        :param velocity_scale: Coulomb ramp of the joint friction (rad/s or m/s).
        """
        if method not in INTEGRATORS:
            raise ValueError(f'unknown integrator {method!r}; valid: {", ".join(INTEGRATORS)}')
        self.params_to_model = params_to_model
        self.dt = float(dt)
        self.method = method
        self.torque_fn = torque_fn
        self.joint_friction = joint_friction
        self.velocity_scale = velocity_scale

    def simulate(self, params: Tensor, x0: Tensor, controls: Tensor) -> Tensor:
        """
        Simulate every particle from every start state.

        :param params: ``(P, d)`` physical parameters.
        :param x0: start states ``(..., P or 1, 2n)``; the second-to-last dim is the particle
            dim (use size 1 to share a start across particles).
        :param controls: ``(..., 1, T, m)`` commands, batch dims broadcasting against ``x0``'s.
        :return: states ``(..., P, T + 1, 2n)`` including the start states.
        """
        model = self.params_to_model(params)
        torque_fn = self.torque_fn
        if self.joint_friction:
            torque_fn = with_joint_friction(model, torque_fn, self.velocity_scale)
        # Every state must carry the particle dim from the first step on.
        x0 = x0.expand(x0.shape[:-2] + (params.shape[0], x0.shape[-1]))
        return rollout(model, x0, controls, self.dt, self.method, torque_fn)


def _as_state_vector(value: Union[float, Tensor, None], default: Tensor, name: str) -> Tensor:
    if value is None:
        return default
    out = torch.as_tensor(value, dtype=default.dtype, device=default.device)
    out = out.expand(default.shape).clone()
    if bool((out <= 0).any()):
        raise ValueError(f'{name} must be positive')
    return out


class SingleShooting:
    """Single-shooting Gaussian trajectory likelihood of a set of reference trajectories."""

    def __init__(self, simulator: TrajectorySimulator, references: Tensor, controls: Tensor,
                 sigma: Union[float, Tensor], combine: str = 'sum',
                 param_low: Optional[Tensor] = None, param_high: Optional[Tensor] = None,
                 state_offset: Optional[Tensor] = None,
                 state_scale: Optional[Tensor] = None):
        """
        Build the likelihood.

        :param simulator: the batched simulator.
        :param references: reference states ``(R, T + 1, s)`` (or ``(T + 1, s)``), ``s = 2n``.
        :param controls: commands ``(T, m)`` shared by all references or ``(R, T, m)``.
        :param sigma: observation standard deviation, scalar or ``(s,)``, in state units.
        :param combine: ``'sum'`` (mixture) or ``'product'`` over references.
        :param param_low: lower parameter bounds ``(d,)``; with ``param_high`` the particles
            hold normalised parameters in ``[-1, 1]``; physical parameters if both None.
        :param param_high: upper parameter bounds ``(d,)``.
        :param state_offset: offset of the state normalisation ``(s,)`` (reference mean if None).
        :param state_scale: scale of the state normalisation ``(s,)`` (reference standard
            deviation, floored at 1e-3 of its largest entry, if None).
        """
        if combine not in COMBINE:
            raise ValueError(f'unknown combine {combine!r}; valid: {", ".join(COMBINE)}')
        if references.dim() == 2:
            references = references.unsqueeze(0)
        if references.dim() != 3:
            raise ShapeError(f'references: expected shape (R, T + 1, s), got '
                             f'{tuple(references.shape)}')
        R, T1, s = references.shape
        if controls.dim() == 2:
            controls = controls.expand(R, *controls.shape)
        if controls.dim() != 3 or controls.shape[:2] != (R, T1 - 1):
            raise ShapeError(f'controls: expected shape ({T1 - 1}, m) or ({R}, {T1 - 1}, m), '
                             f'got {tuple(controls.shape)}')
        if (param_low is None) != (param_high is None):
            raise ValueError('give both param_low and param_high or neither')
        self.simulator = simulator
        self.references = references
        self.controls = controls
        self.combine = combine
        ref = references.reshape(-1, s)
        self.sigma = _as_state_vector(sigma, torch.ones_like(ref[0]), 'sigma')
        self.state_offset = (ref.mean(0) if state_offset is None else
                             torch.as_tensor(state_offset, dtype=ref.dtype).expand(s).clone())
        std = ref.std(0) if ref.shape[0] > 1 else torch.ones_like(ref[0])
        std = torch.clamp(std, min=1e-3 * float(std.max().clamp(min=1e-12)))
        self.state_scale = _as_state_vector(state_scale, std, 'state_scale')
        self.param_low = None if param_low is None else torch.as_tensor(param_low, dtype=ref.dtype)
        self.param_high = (None if param_high is None else
                           torch.as_tensor(param_high, dtype=ref.dtype))

    # -- normalisation ----------------------------------------------------------------------
    def normalize_params(self, params: Tensor) -> Tensor:
        """
        Map physical parameters ``(..., d)`` to particle coordinates.

        :param params: ``(..., d)`` physical parameters.
        :return: ``(..., d)`` in ``[-1, 1]`` inside the bounds (unchanged without bounds).
        """
        if self.param_low is None:
            return params
        return 2.0 * (params - self.param_low) / (self.param_high - self.param_low) - 1.0

    def denormalize_params(self, z: Tensor) -> Tensor:
        """
        Map particle coordinates ``(..., d)`` back to physical parameters.

        :param z: ``(..., d)`` normalised parameters.
        :return: ``(..., d)`` physical parameters.
        """
        if self.param_low is None:
            return z
        return self.param_low + 0.5 * (z + 1.0) * (self.param_high - self.param_low)

    def normalize_states(self, x: Tensor) -> Tensor:
        """
        Return ``(x - state_offset) / state_scale`` for states ``(..., s)``.

        :param x: states ``(..., s)``.
        :return: ``(..., s)`` dimensionless.
        """
        return (x - self.state_offset) / self.state_scale

    def denormalize_states(self, z: Tensor) -> Tensor:
        """
        Invert :meth:`normalize_states`.

        :param z: normalised states ``(..., s)``.
        :return: states ``(..., s)``.
        """
        return z * self.state_scale + self.state_offset

    # -- particles --------------------------------------------------------------------------
    @property
    def num_references(self) -> int:
        """Return ``R``."""
        return self.references.shape[0]

    @property
    def particle_dim(self) -> int:
        """Return the length ``D`` of a particle vector."""
        return self._param_dim()

    def _param_dim(self) -> int:
        mapper = self.simulator.params_to_model
        if hasattr(mapper, 'dim'):
            return int(mapper.dim)
        if self.param_low is not None:
            return int(self.param_low.numel())
        raise AttributeError('parameter dimension unknown: give bounds or a ParameterMap')

    def pack(self, params: Tensor) -> Tensor:
        """
        Return particles ``(P, D)`` for physical parameters ``(P, d)``.

        :param params: ``(P, d)`` physical parameters.
        :return: ``(P, d)`` normalised particles.
        """
        return self.normalize_params(params)

    def unpack(self, particles: Tensor) -> Tensor:
        """
        Return the physical parameters ``(P, d)`` of particles ``(P, D)``.

        :param particles: ``(P, D)``.
        :return: ``(P, d)``.
        """
        return self.denormalize_params(particles)

    # -- likelihood -------------------------------------------------------------------------
    def simulate(self, particles: Tensor) -> Tensor:
        """
        Simulate every particle from every reference's first state.

        :param particles: ``(P, D)``.
        :return: states ``(R, P, T + 1, s)``.
        """
        return self.simulate_horizon(self.unpack(particles))

    def simulate_horizon(self, params: Tensor) -> Tensor:
        """
        Simulate physical parameters over the whole horizon from each reference's first state.

        :param params: ``(P, d)`` physical parameters.
        :return: states ``(R, P, T + 1, s)``.
        """
        x0 = self.references[:, None, 0]
        return self.simulator.simulate(params, x0, self.controls[:, None])

    def per_reference(self, particles: Tensor) -> Tensor:
        """
        Return the log-likelihood of each reference under each particle.

        The given first state is excluded: it is not predicted.

        :param particles: ``(P, D)``.
        :return: ``(P, R)``.
        """
        states = self.simulate(particles)
        ll = gaussian_log_likelihood(states[..., 1:, :], self.references[:, None, 1:],
                                     self.sigma)
        return ll.transpose(0, 1)

    def combine_references(self, per_reference: Tensor) -> Tensor:
        """
        Combine ``(P, R)`` per-reference log-likelihoods into ``(P,)``.

        :param per_reference: ``(P, R)``.
        :return: ``(P,)``: ``logsumexp - log R`` (``'sum'``) or the sum (``'product'``).
        """
        if self.combine == 'sum':
            return torch.logsumexp(per_reference, dim=-1) - math.log(per_reference.shape[-1])
        return per_reference.sum(-1)

    def log_prob(self, particles: Tensor) -> Tensor:
        """
        Return the log-likelihood of the reference set for each particle.

        :param particles: ``(P, D)``.
        :return: ``(P,)``, differentiable w.r.t. ``particles``.
        """
        return self.combine_references(self.per_reference(particles))

    __call__ = log_prob


class MultipleShooting(SingleShooting):
    """
    Multiple-shooting Gaussian trajectory likelihood with defect constraints.

    A particle is ``[z_params (d), z_starts (R, W - 1, s) flattened]``: the normalised
    parameters followed by the normalised start states of windows ``2..W`` of every reference.
    """

    def __init__(self, simulator: TrajectorySimulator, references: Tensor, controls: Tensor,
                 sigma: Union[float, Tensor], windows: int, combine: str = 'sum', **kwargs):
        """
        Build the likelihood.

        :param simulator: the batched simulator.
        :param references: reference states ``(R, T + 1, s)``; ``T`` must be divisible by
            ``windows``.
        :param controls: commands ``(T, m)`` or ``(R, T, m)``.
        :param sigma: observation standard deviation, scalar or ``(s,)``.
        :param windows: number of shooting windows ``W >= 1``.
        :param combine: ``'sum'`` or ``'product'`` over references.
        :param kwargs: normalisation options of :class:`SingleShooting`.
        """
        super().__init__(simulator, references, controls, sigma, combine, **kwargs)
        T = self.references.shape[1] - 1
        if int(windows) != windows or windows < 1 or T % int(windows):
            raise ValueError(f'windows must be a positive divisor of the horizon T = {T}, '
                             f'got {windows}')
        self.windows = int(windows)
        self.window_length = T // self.windows

    @property
    def state_dim(self) -> int:
        """Return the state size ``s``."""
        return self.references.shape[-1]

    @property
    def num_shooting_states(self) -> int:
        """Return the number of start-state entries ``R (W - 1) s`` in a particle."""
        return self.num_references * (self.windows - 1) * self.state_dim

    @property
    def particle_dim(self) -> int:
        """Return the length ``D = d + R (W - 1) s`` of a particle vector."""
        return self._param_dim() + self.num_shooting_states

    def reference_starts(self) -> Tensor:
        """
        Return the reference states at the starts of windows ``2..W``.

        :return: ``(R, W - 1, s)``.
        """
        L = self.window_length
        return self.references[:, L:-1:L][:, :self.windows - 1]

    def simulated_starts(self, params: Tensor) -> Tensor:
        """
        Return window start states that make the defects zero (single-shooting states).

        :param params: ``(P, d)`` physical parameters.
        :return: ``(P, R, W - 1, s)``: each particle's full-horizon simulation at the window
            boundaries.
        """
        states = self.simulate_horizon(params)
        L = self.window_length
        return states[:, :, L:-1:L].transpose(0, 1)

    def pack(self, params: Tensor, starts: Optional[Tensor] = None) -> Tensor:
        """
        Return particles ``(P, D)`` from parameters and window start states.

        :param params: ``(P, d)`` physical parameters.
        :param starts: start states of windows ``2..W``, ``(P, R, W - 1, s)`` or
            ``(R, W - 1, s)``; the reference states there when None.
        :return: ``(P, D)`` normalised particles.
        """
        P = params.shape[0]
        if starts is None:
            starts = self.reference_starts()
        starts = starts.expand(P, self.num_references, self.windows - 1, self.state_dim)
        z = self.normalize_states(starts).reshape(P, -1)
        return torch.cat((self.normalize_params(params), z.to(params.dtype)), dim=-1)

    def unpack(self, particles: Tensor) -> Tensor:
        """
        Return the physical parameters ``(P, d)`` of particles ``(P, D)``.

        :param particles: ``(P, D)``.
        :return: ``(P, d)``.
        """
        d = particles.shape[-1] - self.num_shooting_states
        return self.denormalize_params(particles[..., :d])

    def unpack_starts(self, particles: Tensor) -> Tensor:
        """
        Return the start states of windows ``2..W`` held by particles ``(P, D)``.

        :param particles: ``(P, D)``.
        :return: ``(P, R, W - 1, s)`` in state units.
        """
        k = self.num_shooting_states
        z = particles[..., particles.shape[-1] - k:]
        z = z.reshape(particles.shape[0], self.num_references, self.windows - 1, self.state_dim)
        return self.denormalize_states(z)

    def simulate(self, particles: Tensor) -> Tensor:
        """
        Simulate every window of every reference for every particle in one rollout call.

        :param particles: ``(P, D)``.
        :return: window states ``(R, W, P, L + 1, s)`` with ``L = T / W``.
        """
        P = particles.shape[0]
        R, W, L, s = self.num_references, self.windows, self.window_length, self.state_dim
        params = self.unpack(particles)
        first = self.references[:, 0].reshape(R, 1, 1, s).expand(R, 1, P, s)
        starts = self.unpack_starts(particles).permute(1, 2, 0, 3)   # (R, W - 1, P, s)
        x0 = torch.cat((first.to(starts.dtype), starts), dim=1)
        controls = self.controls.reshape(R, W, 1, L, -1)
        return self.simulator.simulate(params, x0, controls)

    def per_reference(self, particles: Tensor) -> Tensor:
        """
        Return the log-likelihood of each reference under each particle (all windows).

        Window starts are not compared (the first is given, the others are variables), so with
        zero defects this equals :meth:`SingleShooting.per_reference`.

        :param particles: ``(P, D)``.
        :return: ``(P, R)``.
        """
        states = self.simulate(particles)
        R, W, L, s = self.num_references, self.windows, self.window_length, self.state_dim
        targets = self.references[:, 1:].reshape(R, W, 1, L, s)
        ll = gaussian_log_likelihood(states[..., 1:, :], targets, self.sigma)   # (R, W, P)
        return ll.sum(1).transpose(0, 1)

    def defects(self, particles: Tensor) -> Tensor:
        """
        Return the normalised continuity defects, the equality constraints ``c = 0``.

        :param particles: ``(P, D)``.
        :return: ``(P, R (W - 1) s)``: ``(end of window w - start of window w + 1) / scale``.
        """
        if self.windows == 1:
            return particles.new_zeros(particles.shape[0], 0)
        states = self.simulate(particles)
        ends = states[:, :-1, :, -1]                      # (R, W - 1, P, s)
        starts = states[:, 1:, :, 0]
        gap = (ends - starts) / self.state_scale
        return gap.permute(2, 0, 1, 3).reshape(particles.shape[0], -1)

    constraints = defects

    def log_prob_and_defects(self, particles: Tensor) -> Tuple[Tensor, Tensor]:
        """
        Return :meth:`log_prob` and :meth:`defects` from one simulation.

        :param particles: ``(P, D)``.
        :return: ``(P,)`` log-likelihoods and ``(P, k)`` defects.
        """
        states = self.simulate(particles)
        R, W, L, s = self.num_references, self.windows, self.window_length, self.state_dim
        targets = self.references[:, 1:].reshape(R, W, 1, L, s)
        ll = gaussian_log_likelihood(states[..., 1:, :], targets, self.sigma)
        log_prob = self.combine_references(ll.sum(1).transpose(0, 1))
        gap = (states[:, :-1, :, -1] - states[:, 1:, :, 0]) / self.state_scale
        return log_prob, gap.permute(2, 0, 1, 3).reshape(particles.shape[0], -1)
