"""
Velocities of recorded free-body poses from local polynomial fits instead of raw differences.

Motion-capture tosses store velocities as backward differences of noisy poses. A pose error
enters ``v_k`` and ``v_{k+1} - v_k`` with opposite signs, so a one-step loss (the violation
loss, a one-step prediction) sees velocity changes that no force made and explains them with
whatever dissipates: on the real elbow the violation loss holds its friction at twice the
URDF's (``benchmarks/elbow_diagnosis.py``, measure 4). :func:`smooth_trajectories` replaces
every pose by its local polynomial fit (Savitzky-Golay; positions and joint angles directly,
the orientation in the tangent space of each sample) and every velocity by the backward
difference of the smoothed poses, in the recordings' own convention (:func:`backward_velocities`),
so the transitions stay consistent: ``q_{k+1}`` is ``q_k`` moved by ``v_{k+1}`` in a
semi-implicit step. A learning step, chosen per object (``ObjectSpec.smooth_window``); rollouts
are judged on the recorded states.

A fit across a table impact blurs the velocity jump over the window: the smoothed toss slows
before its vertex reaches the table and ends the bounce after it, which a one-step contact loss
can only explain by contact at a distance. :func:`impact_samples` finds the impacts in the
recorded poses with the *nominal* geometry (never the learned one, so the smoothing does not
depend on what it is used to learn): a sample ``k`` whose backward-difference velocity rises,
at some contact candidate, by more than a threshold beyond gravity's ``g dt`` over the
previous sample's while the lowest candidate is within a margin of the ground. The trajectory
is then smoothed per segment between impacts (``breaks``), one-sided fits at each segment's
ends, so the velocity jump stays at the recorded sample.
"""

from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..core.contact import contact_kinematics, ContactModel
from ..core.model import RobotModel
from ..core.spatial import quat_conjugate, quat_exp, quat_log, quat_multiply, quat_rotate

Tensor = torch.Tensor

__all__ = ['backward_velocities', 'IMPACT_MARGIN_M', 'impact_samples',
           'local_polynomial_weights', 'smooth_configurations', 'smooth_trajectories']

#: Lowest contact candidate's height [m] at or below which a velocity jump counts as an impact:
#: a centimetre covers the pose noise (0.4 mm, 4 mrad on the elbow's 5-10 cm lever arms) and
#: real boxes whose edges the nominal corners do not match exactly.
IMPACT_MARGIN_M = 0.01


def impact_samples(model: RobotModel, contact: ContactModel, q: Tensor, dt: float,
                   jump: float, margin: float = IMPACT_MARGIN_M,
                   gravity: float = 9.81) -> List[int]:
    """
    Return the samples of a recorded trajectory at which an impact changed the velocity.

    With ``h_ik`` the signed distance of contact candidate ``i`` at the recorded ``q_k``
    (``core.contact.contact_kinematics``: the geometry given, meant to be the nominal one) and
    ``u_ik = (h_ik - h_i(k-1)) / dt`` its backward-difference normal velocity, sample ``k`` is
    an impact when ``max_i (u_ik - u_i(k-1)) + gravity dt > jump`` and the lowest candidate at
    ``k - 1`` or ``k`` is at most ``margin`` above the ground: ``v_k`` is the first
    post-impact velocity of the recording's backward differences.

    :param model: the object's (nominal) floating model.
    :param contact: its (nominal) contact model with a ground.
    :param q: ``(T, nq)`` recorded configurations.
    :param dt: sample period [s].
    :param jump: rise of a candidate's normal velocity [m/s] that counts as an impact.
    :param margin: height [m] of the lowest candidate within which a rise can be an impact.
    :param gravity: gravity's magnitude [m/s^2] (free flight lowers every ``u`` by ``g dt``).
    :return: ascending samples ``k`` (``2 <= k < T``).
    """
    with torch.no_grad():
        phi = contact_kinematics(model, q, contact).phi
    if len(q) < 3:
        return []
    rate = (phi[1:] - phi[:-1]) / dt
    rise = (rate[1:] - rate[:-1]).amax(-1) + gravity * dt
    low = phi.amin(-1)
    near = torch.minimum(low[1:-1], low[2:]) <= margin
    return [int(k) + 2 for k in torch.nonzero((rise > jump) & near).flatten()]


def local_polynomial_weights(length: int, window: int, order: int = 2) -> np.ndarray:
    """
    Return the matrix that smooths a signal by local polynomial fits (Savitzky-Golay).

    Row ``k`` holds the weights that evaluate, at sample ``k``, the least-squares polynomial
    of degree ``order`` fitted to the ``window`` samples centred on ``k`` (near the ends, to
    the first or last ``window`` samples, as scipy's ``mode='interp'``).

    :param length: samples ``T`` of the signal.
    :param window: odd number of samples per fit, ``order < window <= length``.
    :param order: polynomial degree.
    :return: ``(T, T)`` weights ``S``; ``S @ x`` smooths ``x (T, ...)``.
    :raises ValueError: an even window, one not above ``order``, or one longer than the signal.
    """
    if window % 2 == 0 or window <= order or window > length:
        raise ValueError(f'smoothing window {window}: need an odd window above the order '
                         f'{order} and at most the trajectory length {length}')
    half = window // 2
    weights = np.zeros((length, length))
    for k in range(length):
        start = min(max(k - half, 0), length - window)
        times = np.arange(start, start + window, dtype=float) - k
        weights[k, start:start + window] = np.linalg.pinv(
            np.vander(times, order + 1, increasing=True))[0]
    return weights


def smooth_configurations(q: Tensor, window: int, order: int = 2) -> Tensor:
    """
    Smooth one free-body configuration trajectory by local polynomial fits.

    Positions and joint angles (unwrapped) are fitted directly; the orientation in the
    tangent space at each sample, ``R_k exp(sum_j S_kj log(R_k^T R_j))`` with the weights
    ``S`` of :func:`local_polynomial_weights` (exact for a constant body rate).

    :param q: ``(T, nq)`` configurations ``[p, quat (x, y, z, w), joints]``.
    :param window: odd samples per local fit.
    :param order: polynomial degree.
    :return: ``(T, nq)`` smoothed configurations with unit quaternions.
    """
    weights = torch.as_tensor(local_polynomial_weights(len(q), window, order),
                              dtype=q.dtype, device=q.device)
    flat = weights @ torch.cat((q[:, :3], q[:, 7:]), dim=-1)
    quat = q[:, 3:7]
    relative = quat_log(quat_multiply(quat_conjugate(quat)[:, None], quat[None, :]))
    smooth = quat_multiply(quat, quat_exp((weights[..., None] * relative).sum(1)))
    smooth = smooth / smooth.norm(dim=-1, keepdim=True)
    return torch.cat((flat[:, :3], smooth, flat[:, 3:]), dim=-1)


def backward_velocities(q: Tensor, dt: float) -> Tensor:
    """
    Return the backward-difference velocities of a configuration trajectory.

    ``v_k`` moves ``q_{k-1}`` to ``q_k`` in a semi-implicit step: body angular
    ``log(R_{k-1}^T R_k) / dt``, linear ``R_k^T (p_k - p_{k-1}) / dt`` (root axes at ``k``),
    joint rates ``(theta_k - theta_{k-1}) / dt``; ``v_0`` repeats ``v_1``, as the recordings'.

    :param q: ``(T, nq)`` configurations, ``T >= 2``.
    :param dt: sample period [s].
    :return: ``(T, nv)`` velocities ``[linear (root axes), angular (body), joint rates]``.
    """
    quat = q[:, 3:7]
    angular = quat_log(quat_multiply(quat_conjugate(quat[:-1]), quat[1:])) / dt
    linear = quat_rotate(quat_conjugate(quat[1:]), q[1:, :3] - q[:-1, :3]) / dt
    v = torch.cat((linear, angular, (q[1:, 7:] - q[:-1, 7:]) / dt), dim=-1)
    return torch.cat((v[:1], v), dim=0)


def smooth_trajectories(trajectories: Tuple[Sequence[Tensor], Sequence[Tensor]], dt: float,
                        window: int, order: int = 2,
                        breaks: Optional[Sequence[Sequence[int]]] = None
                        ) -> Tuple[List[Tensor], List[Tensor]]:
    """
    Return recorded trajectories with smoothed poses and their backward-difference velocities.

    :param trajectories: ``(q list, v list)``, one ``(T_i, nq)`` / ``(T_i, nv)`` pair each
        (the recorded velocities are replaced).
    :param dt: sample period [s].
    :param window: odd samples per local fit; 1 returns the trajectories as they are. A
        trajectory shorter than ``window`` is fitted over the longest odd window it holds
        (one too short for a fit above ``order`` is kept as recorded).
    :param order: polynomial degree of the local fits.
    :param breaks: per trajectory, the samples that start a new segment (e.g. from
        :func:`impact_samples`); no window spans a break, each segment is fitted on its own
        (one-sided fits at its ends) and the velocities are the backward differences of the
        joined poses, so ``v_k`` at a break keeps the recorded jump. None: one segment each.
    :return: ``(q list, v list)``.
    :raises ValueError: an even window or one not above ``order``, or one break list per
        trajectory not given.
    """
    qs, vs = trajectories
    if window == 1:
        return list(qs), list(vs)
    if window % 2 == 0 or window <= order:
        raise ValueError(f'smoothing window {window}: need an odd window above the order '
                         f'{order}')
    if breaks is not None and len(breaks) != len(qs):
        raise ValueError(f'{len(breaks)} break lists for {len(qs)} trajectories')
    out_q, out_v = [], []
    for i, (q, v) in enumerate(zip(qs, vs)):
        cuts = sorted({int(k) for k in (breaks[i] if breaks is not None else ())
                       if 0 < int(k) < len(q)})
        bounds = [0] + cuts + [len(q)]
        parts, smoothed = [], False
        for start, stop in zip(bounds[:-1], bounds[1:]):
            n = stop - start
            fits = min(window, n - 1 + n % 2)
            if fits <= order:
                parts.append(q[start:stop])
                continue
            parts.append(smooth_configurations(q[start:stop], fits, order))
            smoothed = True
        if not smoothed:
            out_q.append(q)
            out_v.append(v)
            continue
        smooth = torch.cat(parts, dim=0)
        out_q.append(smooth)
        out_v.append(backward_velocities(smooth, dt))
    return out_q, out_v
