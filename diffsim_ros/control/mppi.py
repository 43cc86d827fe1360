"""
Model-predictive path integral control (MPPI), sampled in one batched rollout.

Each iteration perturbs the nominal command sequence with Gaussian noise, rolls out all samples
at once (the sample axis is a leading batch dim of the state), and averages the sampled
sequences with weights ``softmax(-J / lambda)``.  When the model's parameters carry a leading
particle dim ``P`` (posterior particles of the identifier), every sample is rolled out under
every particle and its cost is the mean over particles, which makes the plan robust to the
remaining model uncertainty.

Reference: G. Williams, A. Aldrich, E. Theodorou, "Model Predictive Path Integral Control
using Covariance Variable Importance Sampling", arXiv:1509.01149, 2015.
"""

from dataclasses import dataclass
import time
from typing import Optional, Sequence, Tuple, Union

import torch
from torch import nn

from .costs import QuadraticCost
from .dynamics import KEEP, ModelDynamics
from .policy import FeedbackPolicy, warm_start
from ..core.model import PARAMETER_FIELDS, RobotModel

Tensor = torch.Tensor


@dataclass(frozen=True)
class MPPIConfig:
    """
    Options of :class:`MPPI`.

    :param horizon: number of steps ``H``, >= 1.
    :param samples: sampled command sequences per iteration, >= 2 (one of them is the
        unperturbed nominal sequence).
    :param lambda_: temperature ``lambda > 0`` of the weights ``softmax(-J / lambda)``, in
        cost units.
    :param noise_std: standard deviation of the command noise, scalar or one per command.
    :param iters: sampling iterations per solve, >= 1.
    :param seed: seed of the controller's own :class:`torch.Generator`.
    :param dtype: dtype of the rollouts (float32 is faster for many samples).
    :raises ValueError: invalid values.
    """

    horizon: int = 50
    samples: int = 256
    lambda_: float = 1.0
    noise_std: Union[float, Sequence[float]] = 1.0
    iters: int = 1
    seed: int = 0
    dtype: torch.dtype = torch.float64

    def __post_init__(self) -> None:
        """Validate the options."""
        for name, minimum in (('horizon', 1), ('samples', 2), ('iters', 1)):
            value = getattr(self, name)
            if int(value) != value or value < minimum:
                raise ValueError(f'{name} must be an int >= {minimum}, got {value}')
        if not self.lambda_ > 0:
            raise ValueError(f'lambda_ must be > 0, got {self.lambda_}')
        std = torch.as_tensor(self.noise_std, dtype=torch.float64)
        if std.dim() > 1 or not bool((std > 0).all()) or not bool(torch.isfinite(std).all()):
            raise ValueError(f'noise_std must be positive and finite, got {self.noise_std}')
        if self.dtype not in (torch.float32, torch.float64):
            raise ValueError(f'dtype must be torch.float32 or torch.float64, got {self.dtype}')


def particles_first(model: RobotModel) -> RobotModel:
    """
    Insert a unit dim after the parameters' batch dims, so they broadcast against samples.

    A model with ``inertial (P, n, 10)`` becomes ``(P, 1, n, 10)``: states ``(S, nx)`` then
    give results ``(P, S, ...)``.  Fields without batch dims are left alone.

    :param model: the model.
    :return: the reshaped model (the same object when it has no batch dims).
    """
    if not len(model.batch_shape):
        return model
    changes = {}
    for name, trailing in PARAMETER_FIELDS.items():
        value = getattr(model, name)
        batch = value.dim() - trailing
        if batch > 0:
            changes[name] = value.unsqueeze(batch)
    return model.replace(**changes)


class MPPI:
    """
    Sampling-based MPC; returns zero-gain feedback policies (see the module docstring).

    :param dynamics: the model; parameter batch dims are particles.
    :param cost: task cost.
    :param config: options.
    """

    def __init__(self, dynamics: ModelDynamics, cost: QuadraticCost,
                 config: Optional[MPPIConfig] = None) -> None:
        self.config = MPPIConfig() if config is None else config
        self.cost = cost.to(dtype=self.config.dtype, device=dynamics.model.device)
        self.generator = torch.Generator(device=dynamics.model.device)
        self.generator.manual_seed(int(self.config.seed))
        self.info: dict = {}
        self.set_model(dynamics.model, dynamics)
        self.reset()

    def set_model(self, model: RobotModel, dynamics: Optional[ModelDynamics] = None,
                  friction_model: Optional[nn.Module] = KEEP) -> None:
        """
        Use another model (possibly with a particle dim) from the next solve on.

        :param model: the new model; leading parameter dims are particles.
        :param dynamics: dynamics to take the settings from (the current ones when None).
        :param friction_model: its extra friction module (None: none); :data:`KEEP`: the
            one of the dynamics.
        """
        base = self.dynamics if dynamics is None else dynamics
        model = particles_first(model.to(dtype=self.config.dtype))
        self.dynamics = base.with_model(model, friction_model=friction_model)
        self.particles = model.batch_shape.numel()
        std = torch.as_tensor(self.config.noise_std, dtype=self.config.dtype,
                              device=model.device)
        self.noise_std = std.expand(self.dynamics.nu)

    def reset(self) -> None:
        """Forget the warm start (the generator keeps its state)."""
        self._controls: Optional[Tensor] = None
        self._u_prev: Optional[Tensor] = None
        self._t: Optional[float] = None

    def _initial_controls(self, t: float) -> Tuple[Tensor, Optional[Tensor]]:
        dyn = self.dynamics
        return warm_start(self._controls, self._u_prev, self._t, t, dyn.dt, self.config.horizon,
                          dyn.u_min, dyn.u_max)

    def evaluate(self, x0: Tensor, controls: Tensor, u_prev: Optional[Tensor] = None,
                 cost: Optional[QuadraticCost] = None) -> Tuple[Tensor, Tensor]:
        """
        Roll out command sequences and return their particle-averaged costs.

        :param x0: initial state ``(nx,)``.
        :param controls: sequences ``(S, H, nu)``.
        :param u_prev: command before the horizon ``(nu,)`` for the rate term.
        :param cost: the cost bound to the horizon (``self.cost`` when None).
        :return: costs ``(S,)`` and the particle-mean states ``(S, H + 1, nx)``.
        """
        cost = self.cost if cost is None else cost
        states = self.dynamics.rollout(x0.expand(controls.shape[0], x0.shape[-1]), controls)
        values = cost.total(states, controls, u_prev)
        lead = values.dim() - 1
        if lead:
            values = values.mean(tuple(range(lead)))
            states = states.mean(tuple(range(lead)))
        return values, states

    def solve(self, x0: Tensor, t: float = 0.0) -> FeedbackPolicy:
        """
        Improve the command sequence from ``x0`` at time ``t`` by ``iters`` sampling rounds.

        :param x0: current state ``(nx,)``.
        :param t: current time in s (shifts the warm start).
        :return: zero-gain policy of the weighted-mean sequence.
        """
        start = time.perf_counter()
        cfg, dyn = self.config, self.dynamics
        x0 = torch.as_tensor(x0).to(dtype=cfg.dtype, device=dyn.model.device).reshape(dyn.nx)
        controls, u_prev = self._initial_controls(t)
        if not bool(torch.isfinite(x0).all()):
            self.info = {'iterations': 0, 'reason': 'non-finite state'}
            return FeedbackPolicy(t0=float(t), dt=dyn.dt, u_ff=controls,
                                  K=controls.new_zeros(cfg.horizon, dyn.nu, dyn.nx),
                                  x_ref=x0.new_zeros(cfg.horizon + 1, dyn.nx).nan_to_num(),
                                  u_min=dyn.u_min, u_max=dyn.u_max,
                                  angle_mask=self.cost.angle_mask)
        cost = self.cost.bind(t, dyn.dt, cfg.horizon)
        costs = []
        with torch.no_grad():
            for _ in range(cfg.iters):
                noise = torch.randn((cfg.samples, cfg.horizon, dyn.nu), generator=self.generator,
                                    dtype=cfg.dtype, device=x0.device) * self.noise_std
                noise[0] = 0.0
                samples = torch.minimum(torch.maximum(controls + noise, dyn.u_min), dyn.u_max)
                values, _ = self.evaluate(x0, samples, u_prev, cost)
                values = torch.nan_to_num(values, nan=float('inf'))
                costs.append(float(values[0]))
                weights = torch.softmax(-(values - values.min()) / cfg.lambda_, dim=0)
                if not bool(torch.isfinite(weights).all()):
                    weights = torch.zeros_like(values)
                    weights[0] = 1.0
                controls = (weights[:, None, None] * samples).sum(0)
            values, states = self.evaluate(x0, controls.unsqueeze(0), u_prev, cost)
        costs.append(float(values[0]))
        self._controls, self._u_prev, self._t = controls, u_prev, float(t)
        self.info = {'iterations': cfg.iters, 'cost': costs[-1], 'costs': costs,
                     'solve_time': time.perf_counter() - start}
        return FeedbackPolicy(t0=float(t), dt=dyn.dt, u_ff=controls,
                              K=controls.new_zeros(cfg.horizon, dyn.nu, dyn.nx),
                              x_ref=torch.nan_to_num(states[0]), u_min=dyn.u_min,
                              u_max=dyn.u_max, angle_mask=cost.angle_mask)
