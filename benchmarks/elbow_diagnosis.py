"""
Why CCN predicts the real elbow worse than its nominal URDF: five measurements.

On tosses of ``benchmarks/elbow_learning.py``'s split (never its test tosses):

1. **Hinge friction in free flight** (training tosses): per transition ``k`` whose samples
   ``k-3 .. k+3`` all keep every vertex of the nominal elbow ``--clearance`` above the table,
   the hinge component of the generalised force the nominal model misses,
   ``r_h = [M (v_{k+1} - v_free) / dt]_hinge`` (``v_free`` the contact-free step from
   ``(q_k, v_k)``), regressed on the hinge rate two ways: on the recorded ``v_k`` (a backward
   difference: its angle noise enters ``v_{k+1} - v_k`` with the opposite sign, so this slope
   reads noise as damping), and with the centred rate ``(theta_{k+3} - theta_{k-3}) / 6 dt``
   as instrument (no angle shared with ``v_k`` or ``v_{k+1}``). A viscous hinge damping
   ``b`` makes ``r_h = -b rate``; the instrumental slope with its standard error is ``-b``.
2. **The violation loss by term and by transition class** (training tosses), at the nominal
   URDF and at CCN learned from them (``--seed``, the spec's weights and smoothing): the
   prediction, complementarity, dissipation and penetration terms
   (``sysid.contact_learning``'s definitions, at the inner optimum), split by the nominal
   elbow's lowest vertex height (free above 2 cm, near 0.5-2 cm, contact below); with each
   class's share of the gradient of the mean loss with respect to mu (in its softplus coordinate).
3. **Which learned parameters hurt**: the nominal URDF with one learned group (mu, both
   inertias, both vertex sets) put in at a time, rolled out over 16-sample horizons on the
   weight search's selection tosses (``benchmarks/contact_weights.py --object elbow``).
4. **Velocity noise read as friction** (training tosses): in free flight (as in 1), the RMS
   of the recorded poses and velocities about their local polynomial fits
   (``sysid.pose_smoothing``, ``--smooth-window``); then the friction coefficient that
   minimises the violation loss of the nominal elbow, everything else held (a grid), on the
   recorded transitions, on the smoothed ones, and on the nominal elbow's own rollouts from
   the same first states (mu 0.3 by construction): clean, with pose noise of the measured
   size and backward-difference velocities as in the recordings, and that smoothed.
5. **What pulls the corners** (training tosses): at the nominal elbow, the derivative of each
   term of the violation loss, by transition class as in 2, when both boxes scale about their
   centroids, and the loss's derivative in the ground's height; on the recorded transitions,
   on the spec's smoothing (windows spanning impacts) and on smoothing between impacts
   (``ObjectSpec.impact_jump``, ``--impact-jump``): is it the smoother that moves them?
"""

import dataclasses
import math
import os
from pathlib import Path
import sys
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch

try:
    from benchmarks import _common, contact_weights, elbow_learning as elbow
except ImportError:  # run as ``python benchmarks/elbow_diagnosis.py``
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks import _common, contact_weights, elbow_learning as elbow

from diffsim_ros.core.contact import (contact_kinematics, contact_rows,  # noqa: I100
                                      free_velocity)
from diffsim_ros.core.dispatch import crba
from diffsim_ros.core.integrators import joint_friction
from diffsim_ros.core.spatial import quat_conjugate, quat_exp, quat_log, quat_multiply
from diffsim_ros.sysid import contact_learning as cl
from diffsim_ros.sysid.object_learning import fit_object, smooth_for_learning
from diffsim_ros.sysid.pose_smoothing import (backward_velocities, impact_samples,
                                              local_polynomial_weights, smooth_trajectories)

#: Lowest-vertex heights [m] that split transitions into free / near / contact.
FREE_M, CONTACT_M = 0.02, 0.005
#: Samples on each side of a free-flight transition that must be free too (the instrument's).
REACH = 3
#: Friction coefficients of measure 4's grid.
FRICTION_GRID = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0)
#: Default window of measure 4's local polynomial fits.
SMOOTH_WINDOW = 7
#: Measure 5's impact threshold [m/s]: three times the RMS (0.17 m/s) of the statistic
#: ``max_i (u_ik - u_i(k-1)) + g dt`` (``sysid.pose_smoothing.impact_samples``) in free flight
#: on the 64 training tosses, i.e. its noise.
IMPACT_JUMP = 0.5


def hinge_friction(spec: cl.ObjectSpec, tosses, indices: Sequence[int],
                   clearance: float = FREE_M) -> Dict[str, float]:
    """
    Return the free-flight hinge torque residual's slope against the hinge rate (measure 1).

    :param spec: the nominal elbow.
    :param tosses: the elbow tosses.
    :param indices: which tosses.
    :param clearance: lowest vertex height [m] every sample of a transition's reach keeps.
    :return: ``transitions``; ``slope_noisy_rate`` and ``slope_centred_rate`` [N m s/rad]
        with ``slope_centred_se``; ``coulomb_n_m`` (the ``tanh(rate / 0.2)`` coefficient
        fitted beside a viscous term on the centred rate).
    """
    dt = tosses.dt
    q, v, v_next, rate = [], [], [], []
    for i in indices:
        qi, vi = tosses.q[i], tosses.v[i]
        low = contact_kinematics(spec.model, qi, spec.contact).phi.amin(-1)
        for k in range(REACH + 1, len(qi) - REACH):
            if bool(low[k - REACH:k + REACH + 1].min() > clearance):
                q.append(qi[k])
                v.append(vi[k])
                v_next.append(vi[k + 1])
                rate.append((qi[k + REACH, 7] - qi[k - REACH, 7]) / (2 * REACH * dt))
    q, v, v_next, rate = (torch.stack(x) for x in (q, v, v_next, rate))
    _, v_free = free_velocity(spec.model, q, v, torch.zeros_like(v), dt)
    step = cl.step_velocity(v_next, dt)
    residual = (crba(spec.model, q) @ ((step - v_free) / dt).unsqueeze(-1)).squeeze(-1)[:, -1]
    y, z, x = residual.numpy(), rate.numpy(), v[:, -1].numpy()
    slope = float((z * y).sum() / (z * z).sum())
    spread = float(np.sqrt(((y - slope * z) ** 2).mean() / (z * z).sum()))
    design = np.stack((z, np.tanh(z / 0.2)), -1)
    both = np.linalg.lstsq(design, y, rcond=None)[0]
    return {'transitions': int(len(y)), 'slope_noisy_rate': float((x * y).sum() / (x * x).sum()),
            'slope_centred_rate': slope, 'slope_centred_se': spread,
            'viscous_with_coulomb': float(both[0]), 'coulomb_n_m': float(both[1])}


def loss_terms(spec: cl.ObjectSpec, model, contact, data, dt: float,
               weights: cl.ViolationWeights) -> Dict[str, Dict[str, float]]:
    """
    Return the violation loss split by term and transition class (measure 2).

    :param spec: the nominal elbow (its geometry classes the transitions).
    :param model: the body model evaluated.
    :param contact: its contact model.
    :param data: ``(q, v, v_next)`` transitions.
    :param dt: sample period [s].
    :param weights: the loss's weights.
    :return: per class (``free``, ``near``, ``contact``): ``transitions`` and each term's
        sum over the class over all transitions [J] (``loss``, ``prediction``,
        ``complementarity``, ``dissipation``, ``penetration``), ``far_impulse`` (normal
        impulse at vertices more than 1 cm above the table, N s a transition) and
        ``dloss_dmu`` (the class's part of the mean loss's gradient in softplus^-1 mu).
    """
    q, v, v_next = data
    theta = cl.object_parameters(contact.vertices, float(contact.friction), model.inertial,
                                 float(contact.ground_height))
    theta['friction'].requires_grad_(True)
    m, c = cl.object_models(model, contact, theta, spec.masses)
    loss, lam = cl.violation_loss(m, c, q, v, v_next, dt, weights, return_impulses=True)
    with torch.no_grad():
        terms = _terms(m, c, data, lam, dt, weights)
        frame = contact_kinematics(m, q, c)
        far = (lam[..., 0] * (frame.phi > 0.01)).sum(-1)
    classes = _classes(spec, q)
    n = len(q)
    out = {}
    for name, mask in classes.items():
        grad, = torch.autograd.grad(loss[mask].sum() / n, theta['friction'], retain_graph=True)
        row = {'transitions': int(mask.sum()), 'loss': float(loss.detach()[mask].sum()) / n,
               'far_impulse': float(far[mask].sum()) / n, 'dloss_dmu': float(grad)}
        row.update({k: float(t[mask].sum()) / n for k, t in terms.items()})
        out[name] = row
    return out


def _classes(spec: cl.ObjectSpec, q: torch.Tensor) -> Dict[str, torch.Tensor]:
    # Transitions by the nominal elbow's lowest vertex height at q_k.
    with torch.no_grad():
        low = contact_kinematics(spec.model, q, spec.contact).phi.amin(-1)
    return {'free': low > FREE_M, 'near': (low > CONTACT_M) & (low <= FREE_M),
            'contact': low <= CONTACT_M}


def _terms(model, contact, data, lam: torch.Tensor, dt: float,
           weights: cl.ViolationWeights) -> Dict[str, torch.Tensor]:
    # The violation loss's terms per transition at the impulses ``lam`` (its inner optimum):
    # sum to the loss; differentiable in the models, so at fixed ``lam`` their gradients sum
    # to the loss's (envelope theorem).
    q, v, v_next = data
    step = cl.step_velocity(v_next, dt)
    frame = contact_kinematics(model, q, contact)
    # the joints' own friction (a learned hinge damping) as the loss applies it
    L, v_free = free_velocity(model, q, v, -joint_friction(model, v), dt)
    miss = step - v_free - (torch.cholesky_solve(contact_rows(frame).mT, L)
                            @ lam.flatten(-2).unsqueeze(-1)).squeeze(-1)
    scale = 0.5 if weights.half_prediction else 1.0
    terms = {'prediction': scale * (miss.unsqueeze(-2) @ L @ L.mT
                                    @ miss.unsqueeze(-1)).squeeze(-1).squeeze(-1)}
    gap = frame.phi + dt * (frame.J_n @ step.unsqueeze(-1)).squeeze(-1)
    terms['complementarity'] = weights.w_comp * (lam[..., 0] * gap.abs()).sum(-1)
    slide = (frame.J_t @ step.unsqueeze(-1).unsqueeze(-3)).squeeze(-1)
    w_diss = weights.w_diss * (dt if weights.dissipation_dt else 1.0)
    terms['dissipation'] = w_diss * (lam[..., 0] * contact.friction * slide.norm(dim=-1)
                                     + (lam[..., 1:] * slide).sum(-1)).sum(-1)
    terms['penetration'] = weights.w_pen * (gap.clamp(max=0.0) ** 2).sum(-1)
    return terms


def vertex_pull(spec: cl.ObjectSpec, trajectories, dt: float,
                weights: cl.ViolationWeights) -> Dict[str, Dict[str, Dict[str, float]]]:
    """
    Return which transitions and terms pull the nominal elbow's corners, and which way (measure 5).

    Each link's vertices scaled about their centroid by ``1 + s``; the derivative in ``s`` at
    0 of each term's sum over a transition class over all transitions (at the impulses of the
    inner optimum, so the terms' derivatives add up to the mean loss's): negative, the loss
    falls as the boxes grow. Beside it the loss's derivative in the ground's height ``z``
    [m] (positive up): what moving every corner down by as much would do.

    :param spec: the nominal elbow (its geometry classes the transitions).
    :param trajectories: ``(q list, v list)``.
    :param dt: sample period [s].
    :param weights: the loss's weights.
    :return: per class (``free``, ``near``, ``contact``, ``all``): ``transitions``, per
        term (and ``loss``) ``d/ds`` [J per unit scale] and ``loss_dz`` [J/m].
    """
    data = cl.transitions(*trajectories)
    grow = torch.zeros((), dtype=data[0].dtype, requires_grad=True)
    sets = [vs + grow * (vs - vs.mean(-2, keepdim=True)) for vs in spec.contact.vertices]
    theta = cl.object_parameters(sets, float(spec.contact.friction), spec.model.inertial)
    theta['ground_height'].requires_grad_(True)
    m, c = cl.object_models(spec.model, spec.contact, theta, spec.masses)
    _, lam = cl.violation_loss(m, c, *data, dt, weights, return_impulses=True)
    terms = _terms(m, c, data, lam, dt, weights)
    terms['loss'] = sum(terms.values())
    classes = _classes(spec, data[0])
    classes['all'] = torch.ones_like(classes['free'])
    n, out = len(data[0]), {}
    for name, mask in classes.items():
        row = {'transitions': int(mask.sum())}
        for term, values in terms.items():
            grad, = torch.autograd.grad(values[mask].sum() / n, grow, retain_graph=True)
            row[term] = float(grad)
        grad, = torch.autograd.grad(terms['loss'][mask].sum() / n, theta['ground_height'],
                                    retain_graph=True)
        row['loss_dz'] = float(grad) / cl.LENGTH_SCALE
        out[name] = row
    return out


def vertex_pulls(spec: cl.ObjectSpec, trajectories, dt: float, weights: cl.ViolationWeights,
                 impact_jump: float) -> Dict[str, Any]:
    """
    Return :func:`vertex_pull` on recorded, smoothed and impact-aware smoothed transitions.

    :param spec: the nominal elbow (its ``smooth_window``).
    :param trajectories: ``(q list, v list)`` recorded tosses.
    :param dt: sample period [s].
    :param weights: the loss's weights.
    :param impact_jump: ``ObjectSpec.impact_jump`` of the impact-aware smoothing [m/s].
    :return: ``impact_jump``, ``impacts`` (found per toss, mean) and per data set the pull.
    """
    spanning = dataclasses.replace(spec, impact_jump=None)
    aware = dataclasses.replace(spec, impact_jump=impact_jump)
    impacts = [len(impact_samples(spec.model, spec.contact, q, dt, impact_jump))
               for q in trajectories[0]]
    sets = {'recorded': trajectories,
            f'smoothed ({spec.smooth_window}), spanning impacts':
                smooth_for_learning(spanning, trajectories, dt),
            f'smoothed ({spec.smooth_window}), between impacts':
                smooth_for_learning(aware, trajectories, dt)}
    return {'impact_jump': impact_jump, 'impacts_per_toss': float(np.mean(impacts)),
            'pull': {name: vertex_pull(spec, data, dt, weights) for name, data in sets.items()}}


def transplants(spec: cl.ObjectSpec, fit: cl.ObjectFit, tosses, windows
                ) -> Dict[str, Dict[str, float]]:
    """
    Return 16-sample errors of the nominal URDF with one learned group put in (measure 3).

    :param spec: the nominal elbow.
    :param fit: a CCN fit.
    :param tosses: the tosses.
    :param windows: ``(toss, start)`` horizon windows.
    :return: per variant, the mean over tosses of each error (``elbow_learning``'s keys).
    """
    nominal = cl.object_parameters(spec.contact.vertices, float(spec.contact.friction),
                                   spec.model.inertial)
    learned = cl.object_parameters(fit.contact.vertices, float(fit.contact.friction),
                                   fit.model.inertial, float(fit.contact.ground_height))
    variants = {'nominal': (), 'nominal + learned mu': ('friction',),
                'nominal + learned inertia': ('inertia',),
                'nominal + learned vertices': ('vertices',),
                'learned': ('friction', 'inertia', 'vertices', 'ground_height')}
    out = {}
    for name, keys in variants.items():
        theta = {k: learned[k] if k in keys else t for k, t in nominal.items()}
        m, c = cl.object_models(spec.model, spec.contact, theta, spec.masses)
        out[name] = elbow.horizon_means(m, c, tosses, windows)
    return out


def link_inertias(model) -> List[Dict[str, Any]]:
    """
    Return each link's mass, CoM and principal moments about its CoM (measure 6).

    :param model: an elbow model (its ``inertial`` rows: ``[m, m c, Ixx, Ixy, Ixz, Iyy, Iyz,
        Izz]`` about the link's origin, docs/conventions.md).
    :return: per link ``mass_kg``, ``com_m`` (3, link frame), ``principal_kg_m2`` (ascending)
        and ``inertia_com_kg_m2`` (the 3x3 about the CoM, link axes).
    """
    out = []
    for row in model.inertial.detach().reshape(-1, 10).to(torch.float64):
        m, c = float(row[0]), row[1:4] / row[0]
        i = row[4:]
        origin = torch.stack((torch.stack((i[0], i[1], i[2])), torch.stack((i[1], i[3], i[4])),
                              torch.stack((i[2], i[4], i[5]))))
        com = origin - m * (c.dot(c) * torch.eye(3, dtype=row.dtype) - torch.outer(c, c))
        out.append({'mass_kg': m, 'com_m': c.tolist(),
                    'principal_kg_m2': torch.linalg.eigvalsh(com).tolist(),
                    'inertia_com_kg_m2': com.tolist()})
    return out


#: Measure 6's groups: name -> the parameter entry and, for per-link entries, the link index.
GROUPS = {'mu': ('friction', None), 'box 1': ('box', 0), 'box 2': ('box', 1),
          'inertia 1': ('inertia', 0), 'inertia 2': ('inertia', 1)}


def seed_groups(spec: cl.ObjectSpec, fit: cl.ObjectFit, tosses, windows
                ) -> Dict[str, Dict[str, float]]:
    """
    Return 16-sample errors of a CCN fit with one learned group put back to the nominal one.

    The converse of measure 3 (:func:`transplants`): which of a seed's learned groups costs
    its hinge error (the groups of :data:`GROUPS`: mu, each link's box, each link's inertia
    and CoM).

    :param spec: the nominal elbow (``shape`` ``'boxes'``).
    :param fit: a CCN fit of it.
    :param tosses: the tosses.
    :param windows: ``(toss, start)`` horizon windows (never test tosses).
    :return: per variant (``learned``, ``nominal``, ``learned, nominal <group>``), the mean
        over tosses of each error.
    """
    def parameters(model, contact):
        theta = cl.object_parameters(contact.vertices, float(contact.friction),
                                     model.inertial)
        theta['box'] = cl.box_parameters(contact.vertices)
        return theta

    nominal, learned = parameters(spec.model, spec.contact), parameters(fit.model, fit.contact)
    variants = {'learned': None, 'nominal': 'all', **{f'learned, nominal {g}': g
                                                      for g in GROUPS}}
    out = {}
    for name, group in variants.items():
        theta = {k: t.clone() for k, t in (nominal if group == 'all' else learned).items()}
        if group not in (None, 'all'):
            key, link = GROUPS[group]
            if link is None:
                theta[key] = nominal[key].clone()
            elif key == 'box':
                theta[key][link] = nominal[key][link]
            else:
                theta[key][9 * link:9 * (link + 1)] = nominal[key][9 * link:9 * (link + 1)]
        del theta['vertices']
        m, c = cl.object_models(spec.model, spec.contact, theta, spec.masses)
        out[name] = elbow.horizon_means(m, c, tosses, windows)
    return out


def _free_samples(spec: cl.ObjectSpec, q: torch.Tensor, reach: int) -> torch.Tensor:
    # Samples whose neighbours within ``reach`` keep every vertex FREE_M above the table.
    low = contact_kinematics(spec.model, q, spec.contact).phi.amin(-1)
    free = torch.zeros(len(q), dtype=torch.bool)
    for k in range(reach + 1, len(q) - reach):
        free[k] = bool(low[k - reach:k + reach + 1].min() > FREE_M)
    return free


def pose_noise(spec: cl.ObjectSpec, trajectories, dt: float, window: int) -> Dict[str, float]:
    """
    Return the free-flight RMS of recorded poses and velocities about their local fits.

    :param spec: the nominal elbow (its geometry tells free flight).
    :param trajectories: ``(q list, v list)`` recorded tosses.
    :param dt: sample period [s].
    :param window: samples of the local quadratic fits.
    :return: ``samples``; ``position_m``, ``orientation_rad`` (per axis), ``hinge_rad``: RMS
        of pose minus fit, divided by ``sqrt(1 - S_cc)`` (the fit's own share of the noise
        at its centre) to estimate the noise; ``velocity_linear``, ``velocity_angular``,
        ``velocity_hinge``: RMS of recorded minus smoothed velocities (m/s, rad/s per axis).
    """
    smooth_q, smooth_v = smooth_trajectories(trajectories, dt, window)
    pose, rot, vel = [], [], []
    for q, v, sq, sv in zip(*trajectories, smooth_q, smooth_v):
        free = _free_samples(spec, q, window // 2)
        pose.append((q - sq)[free][:, [0, 1, 2, 7]])
        rot.append(quat_log(quat_multiply(quat_conjugate(sq[free, 3:7]), q[free, 3:7])))
        vel.append((v - sv)[free])
    pose, rot, vel = torch.cat(pose), torch.cat(rot), torch.cat(vel)
    centre = 1.0 - local_polynomial_weights(window, window)[window // 2, window // 2]

    def rms(x):
        return float(x.pow(2).mean().sqrt())
    return {'samples': int(len(pose)), 'window': window,
            'position_m': rms(pose[:, :3]) / math.sqrt(centre),
            'orientation_rad': rms(rot) / math.sqrt(centre),
            'hinge_rad': rms(pose[:, 3]) / math.sqrt(centre),
            'velocity_linear': rms(vel[:, :3]), 'velocity_angular': rms(vel[:, 3:6]),
            'velocity_hinge': rms(vel[:, 6])}


def friction_minimum(spec: cl.ObjectSpec, trajectories, dt: float,
                     weights: cl.ViolationWeights) -> Dict[str, Any]:
    """
    Return the violation loss of the nominal elbow over :data:`FRICTION_GRID`.

    :param spec: the nominal elbow (all but mu held).
    :param trajectories: ``(q list, v list)``.
    :param dt: sample period [s].
    :param weights: the loss's weights.
    :return: ``mu`` (the grid's minimiser) and ``relative`` (the mean loss per grid value
        over its minimum).
    """
    data = cl.transitions(*trajectories)
    losses = []
    for mu in FRICTION_GRID:
        theta = cl.object_parameters(spec.contact.vertices, mu, spec.model.inertial)
        m, c = cl.object_models(spec.model, spec.contact, theta, spec.masses)
        with torch.no_grad():
            losses.append(float(cl.violation_loss(m, c, *data, dt, weights).mean()))
    best = int(np.argmin(losses))
    return {'mu': FRICTION_GRID[best], 'relative': [x / losses[best] for x in losses]}


def noise_as_friction(spec: cl.ObjectSpec, trajectories, dt: float, window: int,
                      weights: cl.ViolationWeights, seed: int = 0) -> Dict[str, Any]:
    """
    Return measure 4: the recordings' noise and the friction the violation loss reads in.

    :param spec: the nominal elbow.
    :param trajectories: ``(q list, v list)`` recorded training tosses.
    :param dt: sample period [s].
    :param window: samples of the local quadratic fits.
    :param weights: the violation loss's weights.
    :param seed: seed of the simulated noise.
    :return: ``noise`` (:func:`pose_noise`) and ``friction``: per data set (``recorded``,
        ``smoothed``, ``simulated``, ``simulated_noisy``, ``simulated_noisy_smoothed``) the
        :func:`friction_minimum`.
    """
    noise = pose_noise(spec, trajectories, dt, window)
    qs, vs = trajectories
    nq = int(spec.model.nq)
    x0 = torch.stack([torch.cat((q[1], v[1])) for q, v in zip(qs, vs)])
    with torch.no_grad():
        states = cl.rollout(spec.model, spec.contact, x0, max(len(q) for q in qs) - 2, dt)
    sim_q = [torch.cat((x0[k:k + 1, :nq], states[k, :len(q) - 2, :nq]))
             for k, q in enumerate(qs)]
    generator = torch.Generator().manual_seed(seed)
    noisy = []
    for q in sim_q:
        n = torch.randn(len(q), 7, generator=generator, dtype=q.dtype)
        noisy.append(torch.cat((
            q[:, :3] + noise['position_m'] * n[:, :3],
            quat_multiply(q[:, 3:7], quat_exp(noise['orientation_rad'] * n[:, 3:6])),
            q[:, 7:] + noise['hinge_rad'] * n[:, 6:]), -1))
    sets = {'recorded': trajectories,
            'smoothed': smooth_trajectories(trajectories, dt, window),
            'simulated': (sim_q, [backward_velocities(q, dt) for q in sim_q]),
            'simulated_noisy': (noisy, [backward_velocities(q, dt) for q in noisy])}
    sets['simulated_noisy_smoothed'] = smooth_trajectories(sets['simulated_noisy'], dt,
                                                           window)
    return {'noise': noise, 'grid': list(FRICTION_GRID),
            'friction': {name: friction_minimum(spec, data, dt, weights)
                         for name, data in sets.items()}}


def run(data: Path, n_train: int, seed: int, steps: int, n_select: int,
        split_seed: int = 0, smooth_window: int = SMOOTH_WINDOW,
        noise_only: bool = False, impact_jump: float = IMPACT_JUMP,
        pull_only: bool = False,
        group_seeds: Optional[Sequence[int]] = None) -> Dict[str, Any]:
    """
    Run the five measurements (module docstring), only the fourth, the fifth or the sixth.

    :param data: the shared data root.
    :param n_train: training tosses (the first of the split's).
    :param seed: CCN's seed.
    :param steps: CCN's maximum Adam steps.
    :param n_select: selection tosses judged in measure 3.
    :param split_seed: the elbow benchmark's split seed.
    :param smooth_window: measure 4's local fit window.
    :param noise_only: run measure 4 alone (no CCN fit).
    :param impact_jump: measure 5's ``ObjectSpec.impact_jump`` [m/s].
    :param pull_only: run measure 5 alone (no CCN fit).
    :param group_seeds: run measure 6 alone, one CCN fit per seed.
    :return: the JSON payload.
    """
    judge = contact_weights.elbow_judge(data, n_select, split_seed)
    spec, tosses = judge.spec, judge.tosses
    train_i = judge.train[:n_train]
    train = ([tosses.q[i] for i in train_i], [tosses.v[i] for i in train_i])
    validation = ([tosses.q[i] for i in judge.validation],
                  [tosses.v[i] for i in judge.validation])
    weights = spec.violation_weights()
    payload = {'train_tosses': n_train, 'seed': seed, 'steps': steps,
               'split_seed': split_seed, 'smooth_window': spec.smooth_window,
               'weights': {'w_comp': weights.w_comp, 'w_pen': weights.w_pen}}
    if group_seeds is not None:
        windows = elbow.horizon_windows(tosses, judge.select, elbow.HORIZON,
                                        contact_weights.ELBOW_WINDOW_STRIDE)
        # the validation tosses as recorded, windows from every sample: what a restart could
        # be chosen by without touching the selection tosses
        held = elbow.horizon_windows(tosses, judge.validation, elbow.HORIZON)
        payload.update(selection_tosses=len(judge.select), windows=len(windows), seeds=[],
                       validation_windows=len(held))
        # the bar of the issue (MuJoCo with the URDF) on the same windows, beside our step's
        payload['nominal_rows'] = {name: {key: row['mean'] for key, row in elbow.horizon_errors(
            predict, tosses, windows, elbow.HORIZON).items()}
            for name, predict in elbow.nominal_predictors(spec, tosses).items()}
        for seed in group_seeds:
            fit = fit_object(spec, 'ccn', train, validation, tosses.dt, seed=seed, steps=steps)
            summary = fit.summary()
            rows = elbow.horizon_means(fit.model, fit.contact, tosses, held)
            payload['seeds'].append({
                'seed': int(seed), 'validation_loss': min(fit.history['validation']),
                'validation_rollout': rows,
                'last_step': int(fit.history['step'][-1]), 'friction': summary['friction'],
                'volume_error': summary['volume_error'], 'links': link_inertias(fit.model),
                'learned': summary, 'groups': seed_groups(spec, fit, tosses, windows)})
            print(f'seed {seed}: validation loss {payload["seeds"][-1]["validation_loss"]:.4e}'
                  ', validation 16-sample hinge '
                  f'{math.degrees(rows["hinge_rad"]):.2f} deg, selection hinge '
                  f'{math.degrees(payload["seeds"][-1]["groups"]["learned"]["hinge_rad"]):.2f}'
                  ' deg', file=sys.stderr, flush=True)
        payload['nominal_links'] = link_inertias(spec.model)
        return payload
    if not noise_only:
        payload['vertex_pull'] = vertex_pulls(spec, train, tosses.dt, weights, impact_jump)
    if pull_only:
        return payload
    payload['noise_as_friction'] = noise_as_friction(spec, train, tosses.dt, smooth_window,
                                                     weights)
    if noise_only:
        return payload
    fit = fit_object(spec, 'ccn', train, validation, tosses.dt, seed=seed, steps=steps)
    # measure 2 on the transitions CCN learned from (the spec's smoothing applied)
    transitions = cl.transitions(*smooth_trajectories(train, tosses.dt, spec.smooth_window))
    windows = elbow.horizon_windows(tosses, judge.select, elbow.HORIZON,
                                    contact_weights.ELBOW_WINDOW_STRIDE)
    return {**payload, 'selection_tosses': len(judge.select), 'windows': len(windows),
            'learned': fit.summary(),
            'hinge_friction': hinge_friction(spec, tosses, train_i),
            'loss_terms': {
                'nominal': loss_terms(spec, spec.model, spec.contact, transitions, tosses.dt,
                                      weights),
                'ccn': loss_terms(spec, fit.model, fit.contact, transitions, tosses.dt,
                                  weights)},
            'transplants': transplants(spec, fit, tosses, windows)}


def markdown(payload: Dict[str, Any]) -> str:
    """Return the measurements run as text and tables."""
    if 'seeds' in payload:
        return _groups_markdown(payload)
    if 'hinge_friction' not in payload:
        return '\n\n'.join(part(payload) for key, part in (
            ('noise_as_friction', _noise_markdown), ('vertex_pull', _pull_markdown))
            if key in payload)
    h = payload['hinge_friction']
    lines = [f'1. Free-flight hinge torque residual against the hinge rate, '
             f'{h["transitions"]} transitions of {payload["train_tosses"]} training tosses: '
             f'slope on the recorded v_k {h["slope_noisy_rate"]:.4f} N m s/rad, on the '
             f'centred rate {h["slope_centred_rate"]:.4f} ± {h["slope_centred_se"]:.4f} '
             f'(viscous {h["viscous_with_coulomb"]:.4f} with Coulomb '
             f'{h["coulomb_n_m"]:.4f} N m)', '',
             f'2. Violation loss per training transition [J] (w_comp '
             f'{payload["weights"]["w_comp"]:g}, w_pen {payload["weights"]["w_pen"]:g}; CCN '
             f'seed {payload["seed"]}: mu {payload["learned"]["friction"]:.3f}, volume error '
             f'{payload["learned"]["volume_error"]:.3f})', '',
             '| model | class | transitions | loss | prediction | complementarity | '
             'dissipation | penetration | far normal impulse N s | dloss/dmu |',
             '|---|---|---:|---:|---:|---:|---:|---:|---:|---:|']
    for model, classes in payload['loss_terms'].items():
        for name, row in classes.items():
            lines.append(f'| {model} | {name} | {row["transitions"]} | ' + ' | '.join(
                f'{row[k]:.3g}' for k in ('loss', 'prediction', 'complementarity',
                                          'dissipation', 'penetration', 'far_impulse',
                                          'dloss_dmu')) + ' |')
    lines += ['', f'3. 16-sample horizon errors on {payload["selection_tosses"]} selection '
              f'tosses ({payload["windows"]} windows)', '',
              '| model | position mm | orientation deg | hinge deg |', '|---|---:|---:|---:|']
    for name, row in payload['transplants'].items():
        lines.append(f'| {name} | {1e3 * row["position_m"]:.2f} | '
                     f'{math.degrees(row["orientation_rad"]):.2f} | '
                     f'{math.degrees(row["hinge_rad"]):.2f} |')
    return '\n'.join(lines + ['', _noise_markdown(payload), '', _pull_markdown(payload)])


def _groups_markdown(payload: Dict[str, Any]) -> str:
    # Measure 6 as text and a table.
    lines = [f'6. CCN seeds ({payload["train_tosses"]} training tosses) on '
             f'{payload["selection_tosses"]} selection tosses ({payload["windows"]} windows): '
             'the learned elbow with one group put back to the nominal; beside, its '
             f'16-sample errors on the validation tosses ({payload["validation_windows"]} '
             'windows, as recorded)', '',
             'Nominal URDF on the selection windows: ' + '; '.join(
                 f'{name} {1e3 * row["position_m"]:.2f} mm, '
                 f'{math.degrees(row["orientation_rad"]):.2f} deg, '
                 f'{math.degrees(row["hinge_rad"]):.2f} deg hinge'
                 for name, row in payload['nominal_rows'].items()), '',
             '| seed | validation loss J | validation position mm | orientation deg | '
             'hinge deg |', '|---:|---:|---:|---:|---:|']
    for run in payload['seeds']:
        row = run['validation_rollout']
        lines.append(f'| {run["seed"]} | {run["validation_loss"]:.4e} | '
                     f'{1e3 * row["position_m"]:.2f} | '
                     f'{math.degrees(row["orientation_rad"]):.2f} | '
                     f'{math.degrees(row["hinge_rad"]):.2f} |')
    lines += ['', '| seed | validation loss J | model | position mm | orientation deg | '
              'hinge deg |', '|---:|---:|---|---:|---:|---:|']
    for run in payload['seeds']:
        for name, row in run['groups'].items():
            lines.append(f'| {run["seed"]} | {run["validation_loss"]:.4e} | {name} | '
                         f'{1e3 * row["position_m"]:.2f} | '
                         f'{math.degrees(row["orientation_rad"]):.2f} | '
                         f'{math.degrees(row["hinge_rad"]):.2f} |')
    lines += ['', '| seed | link | CoM mm (link frame) | principal moments 1e-4 kg m^2 |',
              '|---|---|---|---|']
    rows = [('nominal', payload['nominal_links'])] + [
        (str(r['seed']), r['links']) for r in payload['seeds']]
    for name, links in rows:
        for k, link in enumerate(links):
            lines.append(f'| {name} | {k + 1} | '
                         + ', '.join(f'{1e3 * x:.1f}' for x in link['com_m']) + ' | '
                         + ', '.join(f'{1e4 * x:.2f}' for x in link['principal_kg_m2']) + ' |')
    return '\n'.join(lines)


def _pull_markdown(payload: Dict[str, Any]) -> str:
    # Measure 5 as text and a table.
    five = payload['vertex_pull']
    terms = ('prediction', 'complementarity', 'dissipation', 'penetration', 'loss')
    lines = ["5. Pull on the nominal elbow's corners: d/ds of each term (sum over the class "
             f'/ all {payload["train_tosses"]} training tosses transitions, J) when both boxes '
             'scale by 1 + s about their centroids (negative: the loss falls as they grow), '
             "and the loss's d/dz in the ground's height (J/m); impact-aware smoothing "
             f'with impact_jump {five["impact_jump"]:g} m/s found '
             f'{five["impacts_per_toss"]:.1f} impacts a toss', '',
             '| transitions | class | n | ' + ' | '.join(terms) + ' | loss d/dz |',
             '|---|---|---:|' + '---:|' * (len(terms) + 1)]
    for name, classes in five['pull'].items():
        for cls, row in classes.items():
            lines.append(f'| {name} | {cls} | {row["transitions"]} | '
                         + ' | '.join(f'{row[t]:.2e}' for t in terms)
                         + f' | {row["loss_dz"]:.3g} |')
    return '\n'.join(lines)


def _noise_markdown(payload: Dict[str, Any]) -> str:
    # Measure 4 as text and a table.
    four = payload['noise_as_friction']
    noise = four['noise']
    lines = [f'4. Free flight ({noise["samples"]} samples of {payload["train_tosses"]} '
             f'training tosses), about local quadratic fits over {noise["window"]} samples: '
             f'pose noise {1e3 * noise["position_m"]:.2f} mm, '
             f'{1e3 * noise["orientation_rad"]:.2f} mrad per axis, hinge '
             f'{1e3 * noise["hinge_rad"]:.2f} mrad; recorded minus smoothed velocities '
             f'{noise["velocity_linear"]:.3f} m/s, {noise["velocity_angular"]:.3f} rad/s, '
             f'hinge {noise["velocity_hinge"]:.3f} rad/s (RMS per axis). Violation loss of the '
             'nominal elbow against mu (all else held), over its minimum:', '',
             '| transitions | loss-minimising mu | ' + ' | '.join(
                 f'mu {mu:g}' for mu in four['grid']) + ' |',
             '|---|---:|' + '---:|' * len(four['grid'])]
    for name, row in four['friction'].items():
        lines.append(f'| {name} | {row["mu"]:g} | '
                     + ' | '.join(f'{x:.4f}' for x in row['relative']) + ' |')
    return '\n'.join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """
    Run the measurements and print them.

    :param argv: command-line arguments (``sys.argv[1:]`` when None).
    :return: process exit status.
    """
    parser = _common.make_parser(__doc__.strip().splitlines()[0])
    parser.add_argument('--data', default=None, help='shared data root (holding INDEX.md)')
    parser.add_argument('--train-tosses', type=int, default=64, help='training tosses')
    parser.add_argument('--seed', type=int, default=0, help="CCN's seed")
    parser.add_argument('--steps', type=int, default=400, help="CCN's maximum Adam steps")
    parser.add_argument('--selection-tosses', type=int, default=100,
                        help='tosses of the weight search judged in measure 3')
    parser.add_argument('--split-seed', type=int, default=0,
                        help="the elbow benchmark's split seed (keep it fixed)")
    parser.add_argument('--smooth-window', type=int, default=SMOOTH_WINDOW,
                        help=f'local fit window of measure 4 (default {SMOOTH_WINDOW})')
    parser.add_argument('--noise-only', action='store_true',
                        help='run measure 4 alone (no CCN fit)')
    parser.add_argument('--pull-only', action='store_true',
                        help='run measure 5 alone (no CCN fit)')
    parser.add_argument('--group-seeds', default=None,
                        help='run measure 6 alone: comma-separated CCN seeds, each fitted and '
                             'rolled out with one learned group at a time put back to the '
                             "nominal one ('': the nominal rows only)")
    parser.add_argument('--impact-jump', type=float, default=IMPACT_JUMP,
                        help='measure 5: ObjectSpec.impact_jump of the impact-aware smoothing '
                             f'[m/s] (default {IMPACT_JUMP:g})')
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    data = _common.data_root(args.data, 'elbow_diagnosis.py')
    if args.quick:
        args.train_tosses, args.steps, args.selection_tosses = 4, 5, 4
    payload = run(data, args.train_tosses, args.seed, args.steps, args.selection_tosses,
                  args.split_seed, args.smooth_window, args.noise_only, args.impact_jump,
                  args.pull_only,
                  None if args.group_seeds is None else
                  [int(x) for x in args.group_seeds.split(',') if x.strip()])
    print(markdown(payload))
    payload['machine'] = _common.machine_info(('torch', 'scipy'))
    payload['quick'] = args.quick
    if args.json:
        _common.write_json(args.json, payload)
    return 0


if __name__ == '__main__':
    sys.exit(main())
