"""
Black-box baseline: a feed-forward network forward model (DiffNEA paper, section 4.1.2).

``qdd = g(q, qd, tau_in)`` with :class:`~diffsim_ros.core.FFNN` (tanh MLP) on standardised
inputs, ``tau_in = B u`` the commands placed on their joints (zero on passive joints); the
output is de-standardised with the training accelerations' mean and standard deviation.
Trained with the forward (acceleration) loss or the multi-step rollout loss of
:mod:`diffsim_ros.sysid.losses`, Adam, L2 weight regularisation and the same early stopping as
DiffNEA (:func:`diffsim_ros.sysid.diffnea.optimize`).

The result has no physical parameters: ``parameters`` is empty, ``model`` is the nominal model
it was given (unchanged; only its joint names and kinematics are meaningful) and ``network``
holds the trained :class:`BlackBoxModel`. Joint angles enter the network as they are (no
``sin``/``cos`` features), so it does not know that angles are periodic.
"""

import copy
from dataclasses import dataclass
import time
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch
from torch import nn

from .diffnea import optimize, reset_linear, StagePlan, StopRules
from .losses import (as_trajectories, command_joints_for, command_matrix, Data, error_metrics,
                     integrate, make_windows, normalized_mse, resolve_source, SampleBatch,
                     stack_samples, state_loss, state_scale, variance_scale, WindowBatch)
from .result import check_choice, check_positive, EstimatorConfig, IdentificationResult
from ..core.actuators import FFNN
from ..core.model import RobotModel

Tensor = torch.Tensor
_DTYPES = {'float64': torch.float64, 'float32': torch.float32}


@dataclass(frozen=True)
class FFNNConfig(EstimatorConfig):
    """
    Configuration of :func:`fit_ffnn` (frozen; :meth:`from_dict` rejects unknown keys).

    :param hidden: hidden layer widths.
    :param loss: ``'forward'`` (accelerations) or ``'rollout'``.
    :param iterations: Adam steps.
    :param lr: Adam learning rate.
    :param weight_decay: weight of the sum of squared network weights in the objective.
    :param batch_size: samples (or windows) per step drawn with a local generator
        (0: full batch).
    :param horizon: rollout window length in samples.
    :param window_stride: samples between window starts (0: ``horizon``).
    :param integrator: ``'rk4'`` or ``'semi_implicit_euler'``.
    :param wrap_angles: wrap revolute angle errors in the rollout loss.
    :param eval_every: Adam steps between validation evaluations.
    :param patience: evaluations without improvement before stopping (0: never).
    :param min_delta: relative improvement that counts.
    :param loss_tolerance: stop once the training objective is below this.
    :param max_seconds: wall-time budget (0: none).
    :param source: where the applied effort comes from: ``'auto'``, ``'tau'`` or ``'u'``.
    :param command_joints: joints driven by the columns of ``u``.
    :param seed: seed of the local generator (initial weights, minibatches).
    :param dtype: ``'float64'`` or ``'float32'``.
    """

    hidden: Tuple[int, ...] = (128, 128)
    loss: str = 'forward'
    iterations: int = 2000
    lr: float = 1e-3
    weight_decay: float = 1e-6
    batch_size: int = 0
    horizon: int = 10
    window_stride: int = 0
    integrator: str = 'rk4'
    wrap_angles: bool = True
    eval_every: int = 10
    patience: int = 20
    min_delta: float = 0.0
    loss_tolerance: float = 0.0
    max_seconds: float = 0.0
    source: str = 'auto'
    command_joints: Tuple[str, ...] = ()
    seed: int = 0
    dtype: str = 'float64'

    def __post_init__(self) -> None:
        """Validate the fields."""
        object.__setattr__(self, 'hidden', tuple(self.hidden))
        object.__setattr__(self, 'command_joints', tuple(self.command_joints))
        for width in self.hidden:
            check_positive('hidden', width, integer=True)
        check_choice('loss', self.loss, ('forward', 'rollout'))
        check_choice('integrator', self.integrator, ('rk4', 'semi_implicit_euler'))
        check_choice('source', self.source, ('auto', 'tau', 'u'))
        check_choice('dtype', self.dtype, tuple(_DTYPES))
        for name in ('iterations', 'batch_size', 'window_stride', 'patience', 'seed'):
            check_positive(name, getattr(self, name), allow_zero=True, integer=True)
        for name in ('horizon', 'eval_every'):
            check_positive(name, getattr(self, name), integer=True)
        check_positive('lr', self.lr)
        for name in ('weight_decay', 'min_delta', 'loss_tolerance', 'max_seconds'):
            check_positive(name, getattr(self, name), allow_zero=True)
        if not isinstance(self.wrap_angles, bool):
            raise ValueError(f'wrap_angles must be a bool, got {self.wrap_angles!r}')


class BlackBoxModel(nn.Module):
    """
    Standardised FF-NN forward model ``(q, qd, u) -> qdd``.

    :param n: number of joints.
    :param B: command-to-joint selection ``(n, m)``.
    :param hidden: hidden layer widths.
    :param batch: training samples; their means and standard deviations standardise the
        inputs and outputs.
    :param qdd: training accelerations ``(N, n)`` (measured or finite differences).
    """

    def __init__(self, n: int, B: Tensor, hidden: Sequence[int], batch: SampleBatch,
                 qdd: Tensor) -> None:
        super().__init__()
        self.net = FFNN(n, hidden, dtype=B.dtype, device=B.device)
        tau = batch.u @ B.mT
        self.register_buffer('B', B.detach().clone())
        for name, value in (('q', batch.q), ('qd', batch.qd), ('tau', tau), ('qdd', qdd)):
            self.register_buffer(f'{name}_mean', value.detach().mean(0))
            self.register_buffer(f'{name}_std', variance_scale(value).sqrt())

    def forward(self, q: Tensor, qd: Tensor, u: Tensor) -> Tensor:
        """
        Predict joint accelerations.

        :param q: ``(..., n)`` positions.
        :param qd: ``(..., n)`` velocities.
        :param u: ``(..., m)`` commands (joint torques when ``B`` is the identity).
        :return: ``qdd (..., n)``.
        """
        tau = u @ self.B.mT
        z = self.net((q - self.q_mean) / self.q_std, (qd - self.qd_mean) / self.qd_std,
                     (tau - self.tau_mean) / self.tau_std)
        return self.qdd_mean + self.qdd_std * z

    def weight_l2(self) -> Tensor:
        """Return the sum of squared network weights and biases."""
        return sum(p.square().sum() for p in self.net.parameters())


def _accelerations(runs: Sequence[Any], batch: SampleBatch, dtype: torch.dtype) -> Tensor:
    if batch.qdd is not None:
        return batch.qdd
    parts = []
    for run in runs:
        qd, t = run.qd.to(dtype), run.t.to(dtype)
        step = torch.diff(qd, dim=0) / torch.diff(t)[:, None]
        parts.append(torch.cat((step, step[-1:])))
    return torch.cat(parts)


def _subset(generator: torch.Generator, size: int, batch_size: int) -> Optional[Tensor]:
    if batch_size <= 0 or batch_size >= size:
        return None
    return torch.randint(size, (batch_size,), generator=generator)


def _forward_objective(network: BlackBoxModel, batch: SampleBatch, scale: Tensor,
                       indices: Optional[Tensor] = None) -> Tensor:
    q, qd, u, qdd = batch.q, batch.qd, batch.u, batch.qdd
    if indices is not None:
        q, qd, u, qdd = q[indices], qd[indices], u[indices], qdd[indices]
    return normalized_mse(network(q, qd, u) - qdd, scale)


def _rollout_objective(network: BlackBoxModel, windows: WindowBatch, scale: Tensor,
                       method: str, wrap_mask: Optional[Tensor],
                       indices: Optional[Tensor] = None) -> Tensor:
    x0, controls, targets = windows.x0, windows.controls, windows.targets
    if indices is not None:
        x0, controls, targets = x0[indices], controls[indices], targets[indices]
    states = integrate(network, x0, controls, windows.dt, method)
    return state_loss(states[..., 1:, :], targets, scale, wrap_mask)


def fit_ffnn(model: RobotModel, train: Data, validation: Optional[Data] = None,
             config: Optional[FFNNConfig] = None,
             warm_start: Optional[IdentificationResult] = None) -> IdentificationResult:
    """
    Train the black-box forward-model baseline.

    :param model: nominal robot (joint order, revolute joints for angle wrapping); returned
        unchanged in the result.
    :param train: training trajectories (``q``, ``qd``, ``qdd`` or ``t`` for finite
        differences, ``tau`` or ``u``).
    :param validation: held-out trajectories for early stopping.
    :param config: :class:`FFNNConfig` (defaults when ``None``).
    :param warm_start: a previous ``'ffnn'`` result whose network is copied as the start.
    :return: result with empty ``parameters``, ``network`` set and ``metrics``: ``loss``,
        ``validation_loss``, ``qdd_rmse`` / ``qdd_nmse`` (and ``validation_*``),
        ``rollout_nmse`` with the rollout loss, ``iterations``, ``best_iteration``,
        ``stopped_early``, ``weights``, ``wall_time_s``.
    """
    start_time = time.perf_counter()
    config = config if config is not None else FFNNConfig()
    dtype = _DTYPES[config.dtype]
    nominal = model.to(dtype=dtype)
    runs = as_trajectories(train, 'train')
    val_runs = as_trajectories(validation, 'validation') if validation is not None else None
    source = resolve_source(runs, config.source, False)
    batch = stack_samples(runs, nominal, source, need_qdd=False)
    joints = command_joints_for(nominal, source, batch.u.shape[-1], config.command_joints)
    B = command_matrix(nominal, joints)
    qdd = _accelerations(runs, batch, dtype)
    batch = SampleBatch(q=batch.q, qd=batch.qd, qdd=qdd, u=batch.u, source=source)
    generator = torch.Generator(device=nominal.device).manual_seed(config.seed)
    if warm_start is not None and isinstance(warm_start.network, BlackBoxModel):
        network = copy.deepcopy(warm_start.network).to(dtype=dtype)
    else:
        network = BlackBoxModel(nominal.n, B, config.hidden, batch, qdd)
        reset_linear(network, generator)
    wrap_mask = nominal.tree.revolute_mask.to(dtype) if config.wrap_angles else None
    qdd_scale = variance_scale(qdd)
    s_scale = state_scale(batch.q, batch.qd, wrap_mask)
    stride = config.window_stride or config.horizon

    def split_objective(data_runs: Sequence[Any], data: SampleBatch,
                        sample: bool) -> Callable[[], Tensor]:
        if config.loss == 'forward':
            if data.qdd is None:
                data = SampleBatch(q=data.q, qd=data.qd, qdd=_accelerations(
                    data_runs, data, dtype), u=data.u, source=source)

            def forward_objective() -> Tensor:
                idx = _subset(generator, len(data), config.batch_size) if sample else None
                return _forward_objective(network, data, qdd_scale, idx)
            return forward_objective
        windows = make_windows(data_runs, nominal, source, config.horizon, stride)

        def rollout_objective() -> Tensor:
            idx = _subset(generator, len(windows), config.batch_size) if sample else None
            return _rollout_objective(network, windows, s_scale, config.integrator, wrap_mask,
                                      idx)
        return rollout_objective

    train_loss = split_objective(runs, batch, sample=True)

    def objective() -> Tensor:
        value = train_loss()
        if config.weight_decay > 0:
            value = value + config.weight_decay * network.weight_l2()
        return value

    validate = None
    if val_runs is not None:
        val_batch = stack_samples(val_runs, nominal, source, need_qdd=False)
        validate = split_objective(val_runs, val_batch, sample=False)
    plan = StagePlan(parameters=list(network.parameters()), objective=objective,
                     adam_iterations=config.iterations, lbfgs_iterations=0, lr=config.lr)
    rules = StopRules(eval_every=config.eval_every, patience=config.patience,
                      min_delta=config.min_delta, loss_tolerance=config.loss_tolerance,
                      max_seconds=config.max_seconds)
    report = optimize(network, [plan], validate, rules)

    metrics: Dict[str, Any] = {}
    with torch.no_grad():
        metrics['loss'] = float(split_objective(runs, batch, sample=False)())
        if validate is not None:
            metrics['validation_loss'] = float(validate())
        for prefix, split in (('', runs), ('validation_', val_runs)):
            if split is None:
                continue
            data = stack_samples(split, nominal, source, need_qdd=False)
            target = _accelerations(split, data, dtype)
            fit = error_metrics(network(data.q, data.qd, data.u) - target, qdd_scale)
            metrics[f'{prefix}qdd_rmse'], metrics[f'{prefix}qdd_nmse'] = fit['rmse'], fit['nmse']
            if config.loss == 'rollout':
                windows = make_windows(split, nominal, source, config.horizon, stride)
                metrics[f'{prefix}rollout_nmse'] = float(_rollout_objective(
                    network, windows, s_scale, config.integrator, wrap_mask))
    metrics.update({key: report[key] for key in ('iterations', 'best_iteration',
                                                 'stopped_early', 'out_of_time')})
    metrics['weights'] = sum(p.numel() for p in network.net.parameters())
    metrics['wall_time_s'] = time.perf_counter() - start_time
    return IdentificationResult(
        method='ffnn', model=nominal, parameters={}, history=report['history'],
        metrics=metrics, network=network, command_joints=joints, config=config.to_dict())


__all__ = ['BlackBoxModel', 'FFNNConfig', 'fit_ffnn']
