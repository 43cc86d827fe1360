"""
The contact-learning paper's baselines: DiffSim, DiffSim-R and the end-to-end MLP.

Bianchini, Halm, Posa et al., "Simultaneous Learning of Contact and Continuous Dynamics"
(CoRL 2023), Table 1 and appendix A.2-A.3. Each is a fit function with
:func:`~diffsim_ros.sysid.contact_learning.fit_ccn`'s signature, registered in
:data:`~diffsim_ros.sysid.object_learning.METHODS`.

DiffSim (:func:`fit_diffsim`) learns CCN's parameters
(:func:`~.contact_learning.object_parameters`: vertices, friction, inertia with the mass
fixed; :data:`~.contact_learning.LEARNED`, the ground held; the same 0.5-1.5x start) with a
*prediction* loss: from every recorded state ``x_k`` of a training toss the model is rolled
``horizon`` steps with :func:`~diffsim_ros.core.contact_step` (Anitescu's step; gradients by
implicit differentiation of the cone solver's optimum) and compared with the recorded
``x_{k+1} .. x_{k+horizon}``. The loss of one window is the mean over its steps of

    w_p ||p - p_rec||^2 / l^2 + w_o angle(R_rec^T R)^2
        + w_v (||v_lin - v_lin,rec||^2 dt^2 / l^2 + ||w - w_rec||^2 dt^2),

``l`` = :data:`~.contact_learning.LENGTH_SCALE` (5 cm), ``angle`` the geodesic angle [rad]:
dimensionless, the velocities counted as the displacement (in ``l``) or turn (rad) they make in
one sample. DiffSim-R (:func:`fit_diffsim_r`) adds a
:class:`~.contact_learning.ResidualNetwork` entering each step as ``tau = M(q) delta``,
regularised by ``w_res mean ||delta||^2 + w_res_w sum ||W||^2`` (Table 2, DiffSim real:
1000 and 1; ``delta`` in m/s^2, our loss dimensionless: the paper does not say in which units
its loss weighs them, so the scale is ours).

The MLP (:func:`fit_mlp`, appendix A.3): 4 hidden layers of 256 tanh units from the state with
the rotation as its 3x3 matrix ``[p, R, joints, v]`` to the next velocity, written as ``v +``
the network's output (it learns the velocity change; inputs and outputs standardised with the
training transitions' statistics). The configuration follows from the predicted velocity with
:func:`~diffsim_ros.core.semi_implicit_update`, the update the recordings' backward differences
and the contact step use (``core.integrate``'s SE(3) exponential would not reproduce a recorded
``q_{k+1}`` from the recorded ``v_{k+1}``). Trained on single transitions (MSE), early stopping
on the validation tosses' transitions; it has no physical parameters (``model``/``contact``
None, ``summary()`` empty).
"""

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from .contact_learning import (LEARNED, LENGTH_SCALE, object_models, ObjectFit, ObjectSpec,
                               physical_summary, regime_weights, ResidualNetwork, rollout,
                               start_parameters, step_velocity, Trajectories, transitions)
from ..core.configuration import semi_implicit_update
from ..core.contact import contact_step, ContactModel
from ..core.model import RobotModel
from ..core.spatial import quat_conjugate, quat_multiply, quat_to_matrix

__all__ = ['DiffSimConfig', 'MlpConfig', 'prediction_windows', 'prediction_loss',
           'train_prediction', 'EndToEndNetwork', 'mlp_rollout', 'train_mlp', 'fit_diffsim',
           'fit_diffsim_r', 'fit_mlp']


@dataclass(frozen=True)
class DiffSimConfig:
    """
    DiffSim's prediction loss and optimiser (module docstring).

    :ivar horizon: contact steps per window (4 samples, 27 ms at 148 Hz).
    :ivar w_position: weight of the position term.
    :ivar w_orientation: weight of the geodesic orientation term.
    :ivar w_velocity: weight of the velocity term.
    :ivar batch_size: windows per Adam step.
    :ivar lr: Adam step size of the physical parameters (CCN's), cosine to ``lr_final``.
    :ivar lr_final: the step size at the last step.
    :ivar residual_lr: Adam step size of the residual network (DiffSim-R).
    :ivar eval_every: steps between validation losses.
    :ivar patience: validations without improvement before stopping.
    :ivar validation_stride: start samples between validation windows.
    :ivar w_res: residual output regularisation ``mean ||delta||^2`` [s^4/m^2].
    :ivar w_res_w: residual weight regularisation ``sum ||W||^2``.
    """

    horizon: int = 4
    w_position: float = 1.0
    w_orientation: float = 1.0
    w_velocity: float = 1.0
    batch_size: int = 64
    lr: float = 1e-2
    lr_final: float = 1e-3
    residual_lr: float = 1e-3
    eval_every: int = 25
    patience: int = 4
    validation_stride: int = 4
    w_res: float = 1000.0
    w_res_w: float = 1.0


#: Table 2's DiffSim residual weights by data regime (as CCN's ``contact_learning.REGIMES``):
#: real data 1000 and 1 (the defaults), simulation 1 and 0.
DIFFSIM_REGIMES = {'real': DiffSimConfig(), 'sim': DiffSimConfig(w_res=1.0, w_res_w=0.0)}


def prediction_windows(q: Sequence[Tensor], v: Sequence[Tensor], horizon: int,
                       stride: int = 1) -> Tuple[Tensor, Tensor]:
    """
    Cut recorded trajectories into start states and the ``horizon`` states that follow.

    Sample 0 is skipped (its velocity repeats the first backward difference), as in
    :func:`~.contact_learning.transitions`.

    :param q: one ``(T_i, nq)`` tensor per trajectory.
    :param v: one ``(T_i, nv)`` tensor per trajectory.
    :param horizon: states after each start.
    :param stride: samples between window starts.
    :return: ``x0`` ``(W, nq + nv)`` and targets ``(W, horizon, nq + nv)``; empty when no
        trajectory is long enough.
    """
    starts, targets = [], []
    for qi, vi in zip(q, v):
        x = torch.cat((qi, vi), -1)
        for k in range(1, len(x) - horizon, stride):
            starts.append(x[k])
            targets.append(x[k + 1:k + 1 + horizon])
    if not starts:
        width = q[0].shape[-1] + v[0].shape[-1]
        return q[0].new_zeros(0, width), q[0].new_zeros(0, horizon, width)
    return torch.stack(starts), torch.stack(targets)


def _safe_norm(x: Tensor) -> Tensor:
    # ||x|| with a zero (not NaN) gradient at x = 0.
    s2 = (x * x).sum(-1)
    positive = s2 > 0
    return torch.where(positive, torch.sqrt(torch.where(positive, s2, torch.ones_like(s2))),
                       torch.zeros_like(s2))


def _step_error(nq: int, predicted: Tensor, recorded: Tensor, dt: float,
                config: DiffSimConfig) -> Tensor:
    # One step's weighted squared error (module docstring), over the leading dims.
    position = ((predicted[..., :3] - recorded[..., :3]) ** 2).sum(-1) / LENGTH_SCALE ** 2
    relative = quat_multiply(quat_conjugate(predicted[..., 3:7]), recorded[..., 3:7])
    angle = 2.0 * torch.atan2(_safe_norm(relative[..., :3]), relative[..., 3].abs())
    dv = predicted[..., nq:] - recorded[..., nq:]
    velocity = dt ** 2 * (((dv[..., :3] ** 2).sum(-1) / LENGTH_SCALE ** 2)
                          + (dv[..., 3:] ** 2).sum(-1))
    return (config.w_position * position + config.w_orientation * angle ** 2
            + config.w_velocity * velocity)


def prediction_loss(model: RobotModel, contact: ContactModel, x0: Tensor, target: Tensor,
                    dt: float, config: DiffSimConfig = DiffSimConfig(),
                    residual: Optional[ResidualNetwork] = None) -> Tuple[Tensor, Tensor]:
    """
    Roll windows out with ``core.contact_step`` and return their prediction losses.

    Differentiable in the models' parameters and the residual's weights (the contact solver's
    gradients are implicit).

    :param model: the body's floating model.
    :param contact: its contact model.
    :param x0: ``(W, nq + nv)`` recorded start states.
    :param target: ``(W, H, nq + nv)`` the recorded states that follow.
    :param dt: sample period [s].
    :param config: the loss weights.
    :param residual: a residual entering every step as ``tau`` (DiffSim-R).
    :return: ``(W,)`` losses (mean over the window's steps) and the mean ``||delta||^2``
        [m^2/s^4] of the residual over the steps (zero without one).
    """
    nq = int(model.nq)
    q, v = x0[:, :nq], x0[:, nq:]
    tau = torch.zeros_like(v)
    loss = x0.new_zeros(x0.shape[0])
    delta2 = x0.new_zeros(())
    horizon = target.shape[1]
    for k in range(horizon):
        if residual is not None:
            delta = residual(q, v)
            delta2 = delta2 + (delta ** 2).sum(-1).mean() / horizon
            tau = residual.generalized_force(model, q, v)
        step = contact_step(model, q, v, tau, dt, contact)
        q, v = step.q, step.v
        loss = loss + _step_error(nq, torch.cat((q, v), -1), target[:, k], dt, config) / horizon
    return loss, delta2


def _mean_prediction_loss(model, contact, windows, dt, config, residual, chunk=512) -> float:
    x0, target = windows
    total = 0.0
    with torch.no_grad():
        for i in range(0, len(x0), chunk):
            loss, _ = prediction_loss(model, contact, x0[i:i + chunk], target[i:i + chunk], dt,
                                      config, residual)
            total += float(loss.sum())
    return total / max(len(x0), 1)


def train_prediction(spec: ObjectSpec, theta: Dict[str, Tensor],
                     residual: Optional[ResidualNetwork], train: Tuple[Tensor, Tensor],
                     validation: Tuple[Tensor, Tensor], dt: float, steps: int, seed: int,
                     config: DiffSimConfig = DiffSimConfig()):
    """
    Minimise the mean prediction loss over training windows; keep the best validation.

    :param spec: the object (its model and contact template, the fixed mass).
    :param theta: start parameters (:func:`~.contact_learning.object_parameters`); not modified.
    :param residual: a residual network trained alongside (DiffSim-R), or None; modified in
        place to the best validation's weights.
    :param train: ``(x0, target)`` training windows (:func:`prediction_windows`).
    :param validation: held-out windows (other tosses) for early stopping.
    :param dt: sample period [s].
    :param steps: maximum Adam steps.
    :param seed: seed of the mini-batches.
    :param config: loss weights and optimiser settings.
    :return: the parameters with the lowest validation loss and a history (``step``,
        ``train``, ``validation`` lists).
    """
    theta = {k: t.detach().clone().requires_grad_(k in LEARNED) for k, t in theta.items()}
    groups = [{'params': [t for k, t in theta.items() if k in LEARNED], 'lr': config.lr}]
    if residual is not None:
        groups.append({'params': list(residual.parameters()), 'lr': config.residual_lr})
    optimiser = torch.optim.Adam(groups)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(
        optimiser, max(steps, 1), eta_min=config.lr_final)
    generator = torch.Generator().manual_seed(seed)

    def evaluate():
        m, c = object_models(spec.model, spec.contact, theta, spec.masses)
        return _mean_prediction_loss(m, c, validation, dt, config, residual)

    def snapshot():
        return ({k: t.detach().clone() for k, t in theta.items()},
                None if residual is None else
                {k: t.detach().clone() for k, t in residual.state_dict().items()})

    best = evaluate()
    best_state = snapshot()
    history = {'step': [0], 'train': [None], 'validation': [best]}
    stale, running, n = 0, [], len(train[0])
    for step in range(1, steps + 1):
        index = torch.randint(n, (min(config.batch_size, n),), generator=generator)
        m, c = object_models(spec.model, spec.contact, theta, spec.masses)
        loss, delta2 = prediction_loss(m, c, train[0][index], train[1][index], dt, config,
                                       residual)
        total = loss.mean()
        if residual is not None:
            total = total + config.w_res * delta2 + config.w_res_w * residual.weight_norm()
        optimiser.zero_grad()
        total.backward()
        optimiser.step()
        schedule.step()
        running.append(float(loss.mean().detach()))
        if step % config.eval_every == 0 or step == steps:
            value = evaluate()
            history['step'].append(step)
            history['train'].append(float(np.mean(running)))
            history['validation'].append(value)
            running = []
            if value < best:
                best, stale, best_state = value, 0, snapshot()
            else:
                stale += 1
                if stale >= config.patience:
                    break
    if residual is not None:
        residual.load_state_dict(best_state[1])
    return best_state[0], history


def _fit_physical(name: str, spec: ObjectSpec, train: Trajectories, validation: Trajectories,
                  dt: float, seed: int, steps: int, perturb: bool,
                  residual: Optional[ResidualNetwork],
                  config: DiffSimConfig = DiffSimConfig()) -> ObjectFit:
    theta0 = start_parameters(spec, seed, perturb)
    windows = prediction_windows(*train, config.horizon)
    held_out = prediction_windows(*validation, config.horizon, config.validation_stride)
    if not len(windows[0]):
        raise ValueError(f'{name}: no training toss longer than {config.horizon + 1} samples')
    if not len(held_out[0]):
        held_out = windows
    theta, history = train_prediction(spec, theta0, residual, windows, held_out, dt, steps,
                                      seed, config)
    model, contact = object_models(spec.model, spec.contact, theta, spec.masses)
    start_model, start_contact = object_models(spec.model, spec.contact, theta0, spec.masses)
    extra = {'horizon': config.horizon}

    def with_residual(x0, n, step_dt):
        return rollout(model, contact, x0, n, step_dt, residual=residual)
    if residual is not None:
        residual.eval()
        extra['residual'] = residual
    return ObjectFit(method=name, spec=spec, model=model, contact=contact, history=history,
                     start=physical_summary(spec, start_model, start_contact),
                     predictor=None if residual is None else with_residual, extra=extra)


def fit_diffsim(spec: ObjectSpec, train: Trajectories, validation: Trajectories, dt: float,
                seed: int = 0, steps: int = 400, perturb: bool = True,
                regime: str = 'real') -> ObjectFit:
    """
    Learn the object with DiffSim: a multi-step prediction loss through ``contact_step``.

    :param spec: the object (one vertex set).
    :param train: training trajectories.
    :param validation: held-out trajectories for early stopping.
    :param dt: sample period [s].
    :param seed: seed of the initialisation and the mini-batches.
    :param steps: maximum Adam steps.
    :param perturb: start 0.5-1.5x the spec (the paper's protocol) instead of at it.
    :param regime: ``'real'`` or ``'sim'`` (:data:`DIFFSIM_REGIMES`; only the residual's
        weights differ, which DiffSim has not).
    :return: the learned object.
    :raises ValueError: when no training trajectory is longer than the horizon.
    """
    regime_weights(regime)   # refuses an unknown regime as the other methods do
    return _fit_physical('diffsim', spec, train, validation, dt, seed, steps, perturb, None,
                         DIFFSIM_REGIMES[regime])


def fit_diffsim_r(spec: ObjectSpec, train: Trajectories, validation: Trajectories, dt: float,
                  seed: int = 0, steps: int = 400, perturb: bool = True,
                  regime: str = 'real') -> ObjectFit:
    """
    Learn the object with DiffSim-R: DiffSim plus a continuous residual network.

    The residual (:class:`~.contact_learning.ResidualNetwork`, its hidden layers drawn from
    ``seed``, its last layer zero) enters every step as ``tau = M(q) delta``; it is in
    ``fit.extra['residual']`` and in ``fit.predict``.

    :param spec: the object (one vertex set).
    :param train: training trajectories.
    :param validation: held-out trajectories for early stopping.
    :param dt: sample period [s].
    :param seed: seed of the initialisation, the network and the mini-batches.
    :param steps: maximum Adam steps.
    :param perturb: start 0.5-1.5x the spec (the paper's protocol) instead of at it.
    :param regime: ``'real'`` or ``'sim'``: the residual's weights (:data:`DIFFSIM_REGIMES`).
    :return: the learned object.
    :raises ValueError: when no training trajectory is longer than the horizon.
    """
    regime_weights(regime)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        residual = ResidualNetwork(int(spec.model.nq), int(spec.model.nv),
                                   dtype=spec.model.inertial.dtype)
    return _fit_physical('diffsim-r', spec, train, validation, dt, seed, steps, perturb,
                         residual, DIFFSIM_REGIMES[regime])


@dataclass(frozen=True)
class MlpConfig:
    """
    The end-to-end network and its training (appendix A.3).

    :ivar hidden: hidden width.
    :ivar layers: hidden layers.
    :ivar batch_size: transitions per Adam step.
    :ivar lr: Adam step size.
    :ivar eval_every: steps between validation losses.
    :ivar patience: validations without improvement before stopping.
    :ivar steps_per_step: Adam steps per ``steps`` unit of ``fit_object`` (an MLP step costs
        a small fraction of a physical method's, so the same budget buys more of them).
    """

    hidden: int = 256
    layers: int = 4
    batch_size: int = 256
    lr: float = 1e-3
    eval_every: int = 25
    patience: int = 20
    steps_per_step: int = 10


def _features(q: Tensor, v: Tensor) -> Tensor:
    rotation = quat_to_matrix(q[..., 3:7]).flatten(-2)
    return torch.cat((q[..., :3], rotation, q[..., 7:], v), -1)


class EndToEndNetwork(torch.nn.Module):
    """
    The end-to-end baseline: ``v_{k+1} = v_k + f(p, R, joints, v_k)``, ``f`` an MLP.

    Inputs and outputs are standardised by buffers set from training data
    (:meth:`set_normalisation`); ``layers`` hidden layers of ``hidden`` tanh units, the last
    (linear) layer zero at the start.

    :param nq: configuration size (floating: ``7 + joints``).
    :param nv: velocity size.
    :param hidden: hidden width.
    :param layers: hidden layers.
    :param dtype: parameter dtype.
    """

    def __init__(self, nq: int, nv: int, hidden: int = 256, layers: int = 4,
                 dtype=torch.float64):
        """Build the network (see the class docstring)."""
        super().__init__()
        width = nq + 5 + nv
        stack: List[torch.nn.Module] = []
        for i in range(layers):
            stack += [torch.nn.Linear(width if i == 0 else hidden, hidden, dtype=dtype),
                      torch.nn.Tanh()]
        stack.append(torch.nn.Linear(hidden, nv, dtype=dtype))
        self.layers = torch.nn.Sequential(*stack)
        # The last layer starts at zero: the untrained network predicts the training set's
        # mean velocity change (gravity, mostly), not noise of the outputs' spread.
        torch.nn.init.zeros_(self.layers[-1].weight)
        torch.nn.init.zeros_(self.layers[-1].bias)
        for name, size in (('in_mean', width), ('in_std', width), ('out_mean', nv),
                           ('out_std', nv)):
            fill = torch.zeros if name.endswith('mean') else torch.ones
            self.register_buffer(name, fill(size, dtype=dtype))

    def set_normalisation(self, q: Tensor, v: Tensor, v_next: Tensor) -> None:
        """
        Set the standardisation from training transitions.

        :param q: ``(N, nq)`` configurations.
        :param v: ``(N, nv)`` velocities.
        :param v_next: ``(N, nv)`` next velocities.
        """
        x, y = _features(q, v), v_next - v
        self.in_mean.copy_(x.mean(0))
        self.in_std.copy_(x.std(0).clamp(min=1e-6) if len(x) > 1 else torch.ones_like(x[0]))
        self.out_mean.copy_(y.mean(0))
        self.out_std.copy_(y.std(0).clamp(min=1e-6) if len(y) > 1 else torch.ones_like(y[0]))

    def normalised_change(self, q: Tensor, v: Tensor) -> Tensor:
        """
        Return the standardised velocity change the network predicts.

        :param q: ``(..., nq)`` configurations.
        :param v: ``(..., nv)`` velocities.
        :return: ``(..., nv)``.
        """
        return self.layers((_features(q, v) - self.in_mean) / self.in_std)

    def forward(self, q: Tensor, v: Tensor) -> Tensor:
        """
        Return the predicted next velocity.

        :param q: ``(..., nq)`` configurations.
        :param v: ``(..., nv)`` velocities (root-frame linear, body angular).
        :return: ``(..., nv)`` next velocities, in the recordings' convention.
        """
        return v + self.out_mean + self.out_std * self.normalised_change(q, v)


def mlp_rollout(model: RobotModel, network: EndToEndNetwork, x0: Tensor, steps: int,
                dt: float) -> Tensor:
    """
    Roll the end-to-end network out from a batch of states.

    :param model: the body's floating model (its layout only).
    :param network: the trained network.
    :param x0: ``(B, nq + nv)`` start states.
    :param steps: samples after the start.
    :param dt: sample period [s].
    :return: ``(B, steps, nq + nv)``.
    """
    nq = int(model.nq)
    q, v = x0[:, :nq], x0[:, nq:]
    out = []
    with torch.no_grad():
        for _ in range(steps):
            v_next = network(q, v)
            q, v = semi_implicit_update(model, q, step_velocity(v_next, dt), dt)
            out.append(torch.cat((q, v), -1))
    return torch.stack(out, 1)


def train_mlp(network: EndToEndNetwork, train: Tuple[Tensor, Tensor, Tensor],
              validation: Tuple[Tensor, Tensor, Tensor], steps: int, seed: int,
              config: MlpConfig = MlpConfig()) -> dict:
    """
    Fit the network to transitions (standardised MSE); keep the best validation.

    :param network: the network, its normalisation set; trained in place.
    :param train: ``(q, v, v_next)`` training transitions.
    :param validation: held-out transitions for early stopping.
    :param steps: maximum Adam steps.
    :param seed: seed of the mini-batches.
    :param config: optimiser settings.
    :return: the history (``step``, ``train``, ``validation`` lists).
    """
    def mse(data):
        q, v, v_next = data
        target = (v_next - v - network.out_mean) / network.out_std
        return ((network.normalised_change(q, v) - target) ** 2).mean()

    optimiser = torch.optim.Adam(network.parameters(), lr=config.lr)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        best = float(mse(validation))
    best_state = {k: t.clone() for k, t in network.state_dict().items()}
    history = {'step': [0], 'train': [None], 'validation': [best]}
    stale, running, n = 0, [], len(train[0])
    for step in range(1, steps + 1):
        index = torch.randint(n, (min(config.batch_size, n),), generator=generator)
        loss = mse(tuple(x[index] for x in train))
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        running.append(float(loss.detach()))
        if step % config.eval_every == 0 or step == steps:
            with torch.no_grad():
                value = float(mse(validation))
            history['step'].append(step)
            history['train'].append(float(np.mean(running)))
            history['validation'].append(value)
            running = []
            if value < best:
                best, stale = value, 0
                best_state = {k: t.clone() for k, t in network.state_dict().items()}
            else:
                stale += 1
                if stale >= config.patience:
                    break
    network.load_state_dict(best_state)
    return history


def fit_mlp(spec: ObjectSpec, train: Trajectories, validation: Trajectories, dt: float,
            seed: int = 0, steps: int = 400, perturb: bool = True,
            regime: str = 'real') -> ObjectFit:
    """
    Learn the end-to-end network (no physics) from transitions.

    :param spec: the object (its model's layout only).
    :param train: training trajectories.
    :param validation: held-out trajectories for early stopping.
    :param dt: sample period [s].
    :param seed: seed of the network's initialisation and the mini-batches.
    :param steps: maximum optimiser steps in the physical methods' units: the MLP takes
        ``MlpConfig.steps_per_step`` times as many (far cheaper) Adam steps.
    :param perturb: unused (there are no physical parameters to perturb).
    :param regime: checked, else unused (Table 2 gives the MLP no regime-dependent weight).
    :return: the learned object (``model``/``contact`` None; ``extra['network']``).
    """
    regime_weights(regime)
    config = MlpConfig()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        network = EndToEndNetwork(int(spec.model.nq), int(spec.model.nv), config.hidden,
                                  config.layers, dtype=spec.model.inertial.dtype)
    data = transitions(*train)
    held_out = transitions(*validation)
    network.set_normalisation(*data)
    history = train_mlp(network, data, held_out, steps * config.steps_per_step, seed, config)
    network.eval()
    model = spec.model

    def predictor(x0, n, step_dt):
        return mlp_rollout(model, network, x0, n, step_dt)
    return ObjectFit(method='mlp', spec=spec, model=None, contact=None, history=history,
                     predictor=predictor, extra={'network': network})
