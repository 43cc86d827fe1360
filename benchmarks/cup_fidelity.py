"""
Is the plant's capsule string a faithful string?  Measured against an ideal string (issue 18).

An ideal string is massless, inextensible, folds freely when slack and pulls only along
itself.  With the cup held still (computed torque on the true arm) and the ball's contacts
off, ``python benchmarks/cup_fidelity.py [--strings legacy,plant] [--json PATH]`` measures
per string build of :mod:`diffsim_ros.sim.cup` (``StringBuild``), with nothing of the
learned string model in it:

a. slack flights: the string released pointing 15 degrees off straight up, folded zig-zag
   so that the ball starts at 98.5 % of the length from the anchor (a straight chain of
   rigid capsules can push, a string cannot), the ball at rest
   (``drop``) or thrown sideways at 1.5 m/s by a rigid turn (``throw``): an ideal string's ball
   flies the analytic parabola until it is a string's length from the anchor again; the
   ball's error against the parabola at 0.1, 0.2 and 0.3 s, and when it comes taut;
b. the snap that ends each flight: an ideal (inelastic) snap removes the ball's radial
   speed and keeps its tangential one; the radial restitution (-v_r after / v_r before),
   the share of the tangential speed kept, the ball's mechanical energy lost in the snap
   against the ideal ``m v_r^2 / 2``;
c. a pendulum: the straight string released horizontally at rest against the ideal
   point-mass pendulum of the string's length (``theta'' = -(g/l) sin theta``, RK4 at
   0.1 ms), ball error at 0.1, 0.2, 0.3, 0.5 and 1.0 s;
d. a small swing: released 20 degrees from hanging, the swing amplitude over the last
   period of 7 s (ideal: 20 degrees);
e. the snap against an ideal string *and the learned string model*: the ``drop`` and
   ``throw`` flights run on to 0.8 s and are compared after the snap with the ideal
   inelastic string (:func:`ideal_string`: the parabola to the exact snap, the outward
   speed removed, then the taut spherical pendulum, slack again where its tension would
   push) and with ``sysid.string_model.StringModel`` (the plant's true geometry, its
   nominal friction) rolled out from the plant's start at the policy search's 4 ms step
   and at 0.5 ms: ball errors (cm) 0.05, 0.1, 0.2 and 0.3 s after the ideal snap;

and, with ``--flailing N``, the stability criterion of ``benchmarks/cup_sim.py`` (N flailing
4 s runs that must never diverge) and the plant's cost (simulated s per CPU s with the
torques precomputed).  The 25-capsule string of 2 g and the ball of the plant drawn by
``--seed`` (default: the nominal plant at 0.40 m), with ``--override FIELD=VALUE`` replacing
fields of its truth as in ``benchmarks/cup_divergence.py`` (e.g. ``ball_mass=0.0222``).
"""

import dataclasses
import math
import os
import sys
import time
from typing import Any, Dict, Optional, Sequence, Tuple

import mujoco
import numpy as np
import torch

try:
    from benchmarks import _common
except ImportError:  # run as ``python benchmarks/cup_fidelity.py``
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks import _common

from benchmarks import cup_divergence, cup_sim  # noqa: I100
from diffsim_ros.sim import cup, cup_swing

#: Where the cup is held: the identification posture (the opening points forward).
POSTURE = cup.IDENTIFICATION_POSTURE
#: Flight checks, s; pendulum checks, s.
FLIGHT_TIMES = (0.1, 0.2, 0.3)
PENDULUM_TIMES = (0.1, 0.2, 0.3, 0.5, 1.0)
GRAVITY = 9.81
#: The slack flights start with the ball this fraction of the string length from the anchor,
#: the capsules folded zig-zag: a straight chain of rigid capsules can push, a string cannot.
REACH = 0.985
#: The snap check: its flights' duration, s; errors this long after the ideal snap, s; the
#: model steps compared, s (the policy search's and the plant's).
SNAP_SECONDS = 0.8
AFTER_SNAP = (0.05, 0.1, 0.2, 0.3)
MODEL_STEPS = (cup_swing.MODEL_DT, cup.TIMESTEP)
#: The snap check starts the ideal string and the model this long before the plant's snap, s.
BEFORE_SNAP = 0.01
#: Armature added to the arm's joints in the snap check (kg m^2): the ball cannot move them.
STILL_ARMATURE = 1e3
#: The builds measured by name (``--strings``).
STRINGS = {'legacy': cup.LEGACY_STRING, 'plant': cup.PLANT_STRING}


def _plant(truth: cup.CupTruth, build: cup.StringBuild) -> cup.CupPlant:
    """Return a plant whose ball touches nothing."""
    plant = cup.CupPlant(truth, string=build)
    m = plant.mj_model
    g = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_GEOM, 'ball')
    m.geom_contype[g] = 0
    m.geom_conaffinity[g] = 0
    return plant


class _Run:
    """A still-cup run at the driver rate: ``t``, ``ball``, its velocity, ``cup_pos``, ``v0``."""

    def __init__(self, t, ball, ball_velocity, cup_pos, v0):
        self.t, self.ball, self.cup_pos, self.v0 = t, ball, cup_pos, v0
        self.ball_velocity = ball_velocity


def _run(plant: cup.CupPlant, seconds: float, direction, velocity=None,
         reach: float = 1.0) -> _Run:
    """
    Hold the arm at :data:`POSTURE` and release the string (``CupPlant.reset``'s arguments).

    :param plant: the plant.
    :param seconds: duration, s.
    :param direction: world direction from the anchor to the ball.
    :param velocity: ball velocity relative to the anchor, m/s, by a rigid turn of the string
        about the anchor; None: at rest.
    :param reach: the ball's start distance from the anchor over the string length.
    :return: the samples.
    """
    controller = cup_sim._hold(plant.truth, POSTURE)
    plant.reset(POSTURE, string_direction=direction, ball_velocity=velocity, reach=reach)
    v0 = _ball_velocity(plant)
    steps = int(round(seconds * cup.RATE_HZ))
    t = np.arange(steps) / cup.RATE_HZ
    ball, velocity, cup_pos = np.zeros((steps, 3)), np.zeros((steps, 3)), np.zeros((steps, 3))
    for k in range(steps):
        ball[k], cup_pos[k] = plant.ball_position(), plant.anchor()[0]
        velocity[k] = _ball_velocity(plant)
        q, qd = plant.joint_state()
        plant.apply(controller(float(t[k]), q, qd), float(t[k]))
    return _Run(t, ball, velocity, cup_pos, v0)


def _ball_velocity(plant: cup.CupPlant) -> np.ndarray:
    """Return the ball's world velocity now, m/s."""
    out = np.zeros(6)
    ball = mujoco.mj_name2id(plant.mj_model, mujoco.mjtObj.mjOBJ_BODY, 'ball')
    mujoco.mj_objectVelocity(plant.mj_model, plant.mj_data, mujoco.mjtObj.mjOBJ_BODY, ball,
                             out, 0)
    return out[3:]


def _velocity(recording: cup.CupRecording) -> np.ndarray:
    """Return the ball's world velocity by central differences, m/s."""
    return np.gradient(recording.ball, recording.t, axis=0)


def flight(plant: cup.CupPlant, direction: Sequence[float],
           velocity: Sequence[float]) -> Dict[str, Any]:
    """
    Release a slack flight; return its errors against the parabola and the snap's figures.

    :param plant: the plant (ball contacts off).
    :param direction: world direction of the straight string at the release.
    :param velocity: the ball's start velocity (its part along the string is dropped), m/s.
    :return: ``error_m`` at :data:`FLIGHT_TIMES`, ``taut_s`` ideal and plant, and the snap's
        ``restitution``, ``tangential_kept``, ``energy_lost_mj`` plant and ideal.
    """
    length = plant.truth.string_length
    rec = _run(plant, 0.6, direction, velocity, reach=REACH)
    anchor, x0, v0 = rec.cup_pos[0], rec.ball[0], rec.v0
    g = np.array([0.0, 0.0, -GRAVITY])
    ideal = x0 + rec.t[:, None] * v0 + 0.5 * rec.t[:, None] ** 2 * g
    reach = np.linalg.norm(ideal - anchor, axis=1)
    # the first time after the release that the parabola is a string's length away again
    beyond = np.nonzero((reach >= length) & (rec.t > 0.02))[0]
    k_ideal = int(beyond[0]) if beyond.size else rec.t.size - 1
    error = np.linalg.norm(rec.ball - ideal, axis=1)
    distance = np.linalg.norm(rec.ball - rec.cup_pos, axis=1)
    # the plant's snap: the first sample near the ideal one where the ball is nearly at l
    after = np.nonzero((distance >= length - 2e-3) & (rec.t > 0.5 * rec.t[k_ideal]))[0]
    k_snap = int(after[0]) if after.size else k_ideal
    v = _velocity(rec)
    before_k, after_k = max(k_snap - 5, 0), min(k_snap + 10, rec.t.size - 1)

    def split(k: int) -> tuple:
        # the ball's speed along the string (outward) and across it at sample k
        radial = (rec.ball[k] - anchor) / np.linalg.norm(rec.ball[k] - anchor)
        along = float(v[k] @ radial)
        return along, float(np.linalg.norm(v[k] - along * radial))

    (vr_before, vt_before), (vr_after, vt_after) = split(before_k), split(after_k)
    # no snap to speak of where the ball did not fly outward (a chain that held it back)
    snapped = vr_before > 0.1
    mass = plant.truth.ball_mass

    def energy(k: int) -> float:
        return 0.5 * mass * float(v[k] @ v[k]) + mass * GRAVITY * rec.ball[k, 2]

    # past the ideal snap the parabola is no longer the ideal string's path
    return {'error_m': [float(np.interp(s, rec.t, error)) if s < rec.t[k_ideal] else None
                        for s in FLIGHT_TIMES],
            'taut_s': {'ideal': float(rec.t[k_ideal]), 'plant': float(rec.t[k_snap])},
            'restitution': -vr_after / vr_before if snapped else math.nan,
            'tangential_kept': float(vt_after / vt_before) if snapped else math.nan,
            'energy_lost_mj': ({'plant': 1e3 * (energy(before_k) - energy(after_k)),
                                'ideal': 1e3 * 0.5 * mass * vr_before ** 2} if snapped
                               else None)}


def ideal_string(x0: np.ndarray, v0: np.ndarray, anchor: np.ndarray, length: float,
                 times: np.ndarray, dt: float = 1e-4) -> Dict[str, Any]:
    """
    Return the ball of an ideal inelastic string on a still anchor.

    Slack (inside the sphere, or on it with a tension that would push), the ball flies the
    exact parabola; its snap time is found by bisection on the parabola (to 1e-9 s), the
    outward speed is removed there and the ball swings as a spherical pendulum (RK4 of
    ``xdd = g - T n``, ``T = |v|^2 / l + n . g`` for the still anchor, projected back onto
    the sphere after each step) until ``T`` turns negative.

    :param x0: ``(3,)`` start position, m, within ``length`` of the anchor.
    :param v0: ``(3,)`` start velocity, m/s.
    :param anchor: ``(3,)`` m.
    :param length: m.
    :param times: ``(T,)`` increasing sample times from 0, s.
    :param dt: the pendulum's RK4 step, s.
    :return: ``ball`` ``(T, 3)`` m and ``snaps`` (the snap times, s).
    """
    g = np.array([0.0, 0.0, -GRAVITY])

    def parabola(x, v, h):
        return x + h * v + 0.5 * h * h * g, v + h * g

    def taut_accel(x, v):
        n = (x - anchor) / length
        return g - (float(v @ v) / length + float(n @ g)) * n

    x, v, t = np.array(x0, float), np.array(v0, float), 0.0
    taut = np.linalg.norm(x - anchor) >= length * (1.0 - 1e-9) and \
        float(v @ v) / length + float((x - anchor) @ g) / length >= 0.0
    out, snaps = [], []
    for target in times:
        while t < target - 1e-12:
            h = min(dt, target - t)
            if not taut:
                y, w = parabola(x, v, h)
                if np.linalg.norm(y - anchor) <= length:
                    x, v, t = y, w, t + h
                    continue
                low, high = 0.0, h
                while high - low > 1e-9:
                    middle = 0.5 * (low + high)
                    inside = np.linalg.norm(parabola(x, v, middle)[0] - anchor) <= length
                    low, high = (middle, high) if inside else (low, middle)
                x, v = parabola(x, v, low)
                n = (x - anchor) / np.linalg.norm(x - anchor)
                x, v, t = anchor + length * n, v - float(v @ n) * n, t + low
                snaps.append(t)
                taut = True
                continue
            k1x, k1v = v, taut_accel(x, v)
            k2x, k2v = v + 0.5 * h * k1v, taut_accel(x + 0.5 * h * k1x, v + 0.5 * h * k1v)
            k3x, k3v = v + 0.5 * h * k2v, taut_accel(x + 0.5 * h * k2x, v + 0.5 * h * k2v)
            k4x, k4v = v + h * k3v, taut_accel(x + h * k3x, v + h * k3v)
            x = x + h / 6.0 * (k1x + 2 * k2x + 2 * k3x + k4x)
            v = v + h / 6.0 * (k1v + 2 * k2v + 2 * k3v + k4v)
            n = (x - anchor) / np.linalg.norm(x - anchor)
            x, v, t = anchor + length * n, v - float(v @ n) * n, t + h
            taut = float(v @ v) / length + float(n @ g) > 0.0
        out.append(x.copy())
    return {'ball': np.array(out), 'snaps': snaps}


def model_ball(truth: cup.CupTruth, x0: np.ndarray, v0: np.ndarray, anchor: np.ndarray,
               seconds: float, dt: float) -> Tuple[np.ndarray, np.ndarray]:
    """
    Roll the learned string model out from a ball state under the still anchor.

    :param truth: the plant (its true string length and cup transform; nominal friction).
    :param x0: ``(3,)`` m; :param v0: ``(3,)`` m/s; :param anchor: ``(3,)`` m.
    :param seconds: duration, s.
    :param dt: the model's step, s.
    :return: ``(t (T,), ball (T, 3))``.
    """
    model = cup_divergence.oracle_model(truth)
    steps = int(round(seconds / dt)) + 1
    p = torch.from_numpy(np.asarray(anchor, float)).expand(1, steps, 3)
    zero = torch.zeros_like(p)
    with torch.no_grad():
        x, _ = model.rollout(torch.from_numpy(np.asarray(x0, float))[None],
                             torch.from_numpy(np.asarray(v0, float))[None], p, zero, zero, dt)
    return np.arange(steps) * dt, x[0].numpy()


def _still_plant(truth: cup.CupTruth, build: cup.StringBuild) -> cup.CupPlant:
    """Return a plant whose ball touches nothing and whose arm the ball cannot move."""
    plant = _plant(truth, build)
    m = plant.mj_model
    for name in plant.joint_names:
        joint = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_JOINT, name)
        m.dof_armature[m.jnt_dofadr[joint]] += STILL_ARMATURE
    return plant


def snap_check(truth: cup.CupTruth, build: cup.StringBuild, direction: Sequence[float],
               velocity: Sequence[float]) -> Dict[str, Any]:
    """
    Throw the ball into a slack flight that ends in a snap; plant, ideal and model after it.

    The arm gets :data:`STILL_ARMATURE` on every joint, so the cup stays still (with the
    plain hold the snap moves it 5-12 mm); the ideal string and the model start from the
    plant's ball :data:`BEFORE_SNAP` s before the plant's string comes taut (its ball
    ``l - 2 mm`` from the anchor), so the slack flight's own error is not counted.

    :param truth: the plant.
    :param build: the string build.
    :param direction: world direction of the string at the release.
    :param velocity: the ball's start velocity by a rigid turn, m/s.
    :return: ``snap_s`` (the ideal's snap after the start), ``anchor_moved_m`` (the cup's
        largest displacement), and errors (m) at :data:`AFTER_SNAP` after the snap:
        ``plant`` (plant vs ideal), ``model_<dt>`` (model vs ideal) and
        ``model_<dt>_vs_plant``.
    """
    plant = _still_plant(truth, build)
    length = truth.string_length
    rec = _run(plant, SNAP_SECONDS, direction, velocity, reach=REACH)
    anchor = rec.cup_pos[0]
    distance = np.linalg.norm(rec.ball - anchor, axis=1)
    taut = np.nonzero((distance >= length - 2e-3) & (rec.t > 0.05))[0]
    if not taut.size:
        raise ValueError("snap_check: the plant's string never came taut; throw harder")
    k0 = max(int(taut[0]) - int(round(BEFORE_SNAP * cup.RATE_HZ)), 0)
    t = rec.t[k0:] - rec.t[k0]
    ideal = ideal_string(rec.ball[k0], rec.ball_velocity[k0], anchor, length, t)
    if not ideal['snaps']:
        raise ValueError('snap_check: the ideal string never snapped taut')
    snap = ideal['snaps'][0]
    checks = [snap + s for s in AFTER_SNAP if snap + s <= t[-1]]
    plant_ball = rec.ball[k0:]

    def at(t_x: np.ndarray, x: np.ndarray, reference: np.ndarray) -> list:
        e = np.linalg.norm(np.stack([np.interp(t, t_x, x[:, i]) for i in range(3)], -1)
                           - reference, axis=1)
        return [float(np.interp(s, t, e)) for s in checks]

    out = {'snap_s': snap, 'snaps': ideal['snaps'],
           'radial_speed_mps': float(rec.ball_velocity[k0] @ (rec.ball[k0] - anchor)
                                     / np.linalg.norm(rec.ball[k0] - anchor)),
           'anchor_moved_m': float(np.linalg.norm(rec.cup_pos - anchor, axis=1).max()),
           'plant': at(t, plant_ball, ideal['ball'])}
    for dt in MODEL_STEPS:
        t_x, x = model_ball(truth, rec.ball[k0], rec.ball_velocity[k0], anchor, t[-1], dt)
        out[f'model_{dt:g}'] = at(t_x, x, ideal['ball'])
        out[f'model_{dt:g}_vs_plant'] = at(t_x, x, plant_ball)
    return out


def ideal_pendulum(length: float, theta0: float, times: np.ndarray,
                   dt: float = 1e-4) -> np.ndarray:
    """
    Return the ideal point-mass pendulum's angle from hanging, released at rest.

    :param length: m.
    :param theta0: start angle, rad.
    :param times: ``(T,)`` increasing times, s.
    :param dt: RK4 step, s.
    :return: ``(T,)`` angles, rad.
    """
    def f(y):
        return np.array([y[1], -GRAVITY / length * math.sin(y[0])])

    y, t, out = np.array([theta0, 0.0]), 0.0, []
    for target in times:
        while t < target - 1e-12:
            h = min(dt, target - t)
            k1 = f(y)
            k2 = f(y + 0.5 * h * k1)
            k3 = f(y + 0.5 * h * k2)
            k4 = f(y + h * k3)
            y, t = y + h / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4), t + h
        out.append(y[0])
    return np.array(out)


def pendulum(plant: cup.CupPlant) -> Dict[str, Any]:
    """
    Release the straight string horizontally; return the ball's error against the ideal.

    :param plant: the plant (ball contacts off).
    :return: ``error_m`` at :data:`PENDULUM_TIMES`.
    """
    length = plant.truth.string_length
    rec = _run(plant, max(PENDULUM_TIMES) + 0.01, (1.0, 0.0, 0.0))
    anchor = rec.cup_pos[0]
    theta = ideal_pendulum(length, 0.5 * math.pi, rec.t)
    ideal = anchor + length * np.stack([np.sin(theta), np.zeros_like(theta), -np.cos(theta)],
                                       -1)
    error = np.linalg.norm(rec.ball - ideal, axis=1)
    return {'error_m': [float(np.interp(s, rec.t, error)) for s in PENDULUM_TIMES]}


def swing(plant: cup.CupPlant, degrees: float = 20.0, seconds: float = 7.0) -> Dict[str, float]:
    """
    Release a small swing from rest under the still cup; return its amplitude at the end.

    :param plant: the plant.
    :param degrees: start angle from hanging.
    :param seconds: duration.
    :return: ``start_deg`` and ``end_deg`` (largest angle over the last period).
    """
    angle = math.radians(degrees)
    rec = _run(plant, seconds, (math.sin(angle), 0.0, -math.cos(angle)))
    rel = rec.ball - rec.cup_pos
    theta = np.degrees(np.arccos(np.clip(-rel[:, 2] / np.linalg.norm(rel, axis=1), -1, 1)))
    period = 2.0 * math.pi * math.sqrt(plant.truth.string_length / GRAVITY)
    return {'start_deg': float(degrees), 'end_deg': float(theta[rec.t > seconds - period].max())}


def measure(truth: cup.CupTruth, build: cup.StringBuild, flailing: int = 0,
            seed: int = 0) -> Dict[str, Any]:
    """
    Return every figure of the module docstring for one string build.

    :param truth: the plant.
    :param build: the string build.
    :param flailing: flailing runs (0: none).
    :param seed: seed of the flailing runs.
    :return: the figures.
    """
    plant = _plant(truth, build)
    tilt = math.radians(15.0)
    up = (math.sin(tilt), 0.0, math.cos(tilt))
    out = {'build': dataclasses.asdict(build),
           'drop': flight(plant, up, (0.0, 0.0, 0.0)),
           'throw': flight(plant, up, (0.0, 1.5, 0.0)),
           'pendulum': pendulum(plant), 'swing': swing(plant)}
    for case, velocity in (('snap_drop', (0.0, 0.0, 0.0)), ('snap_throw', (0.0, 1.5, 0.0))):
        try:
            out[case] = snap_check(truth, build, up, velocity)
        except ValueError as error:  # a chain that never lets the ball fly free (legacy)
            out[case] = {'skipped': str(error)}
    if flailing:
        start = time.perf_counter()
        out['flailing'] = cup_sim.flailing(seed, flailing, string=build)
        out['flailing']['wall_s'] = time.perf_counter() - start
        out['cost'] = cup_sim.plant_cost(seed, build)
    return out


def _print(name: str, f: Dict[str, Any]) -> None:
    """Print one build's figures."""
    print(f'{name}: {f["build"]}')
    for case in ('drop', 'throw'):
        c = f[case]
        print(f'  {case}: error vs parabola (cm) at {FLIGHT_TIMES} s: '
              + ' '.join('-' if e is None else f'{100 * e:.2f}' for e in c['error_m'])
              + f'; taut at {c["taut_s"]["plant"]:.3f} s (ideal {c["taut_s"]["ideal"]:.3f}); '
              f'snap restitution {c["restitution"]:.2f}, tangential kept '
              f'{c["tangential_kept"]:.2f}, energy lost '
              + ('- (no outward flight before it)' if c['energy_lost_mj'] is None else
                 f'{c["energy_lost_mj"]["plant"]:.1f} mJ (ideal '
                 f'{c["energy_lost_mj"]["ideal"]:.1f})'))
    print(f'  pendulum from horizontal: error vs ideal point mass (cm) at {PENDULUM_TIMES} s: '
          + ' '.join(f'{100 * e:.2f}' for e in f['pendulum']['error_m']))
    print(f'  20-degree swing after 7 s: {f["swing"]["end_deg"]:.1f} deg')
    for case in ('snap_drop', 'snap_throw'):
        c = f[case]
        if 'skipped' in c:
            print(f'  {case}: {c["skipped"]}')
            continue
        print(f'  {case}: outward at {c["radial_speed_mps"]:.2f} m/s {BEFORE_SNAP} s before '
              f'the snap (cup moved {1e3 * c["anchor_moved_m"]:.2f} mm); error (cm) '
              f'{AFTER_SNAP} s after it:')
        for key in [k for k in c if k == 'plant' or k.startswith('model_')]:
            name = key.replace('plant', 'plant vs ideal') if key == 'plant' else (
                key.replace('_vs_plant', ' vs plant') if key.endswith('_vs_plant')
                else key + ' vs ideal')
            print(f'    {name:24s} ' + ' '.join(f'{100 * e:.2f}' for e in c[key]))
    if 'flailing' in f:
        print(f'  flailing runs diverged: {f["flailing"]["diverged"]} of {f["flailing"]["runs"]} '
              f'({f["flailing"]["wall_s"]:.0f} s); plant alone '
              f'{f["cost"]["plant_alone_sim_s_per_cpu_s"]:.2f} sim s per CPU s')


def main(argv: Optional[Sequence[str]] = None) -> int:
    """
    Measure the string builds (see the module docstring).

    :param argv: command-line arguments (None: ``sys.argv``).
    :return: exit status.
    """
    parser = _common.make_parser(__doc__.strip().splitlines()[0], threads=1)
    parser.add_argument('--strings', default=','.join(STRINGS),
                        help=f'string builds among {",".join(STRINGS)} (default: all)')
    parser.add_argument('--seed', type=int, default=None,
                        help='draw_truth seed of the plant (default: the nominal plant)')
    parser.add_argument('--flailing', type=int, default=0,
                        help='also run this many flailing 4 s runs per build and time the '
                        'plant (cup_sim.py uses 16)')
    parser.add_argument('--override', nargs='*', default=[], metavar='FIELD=VALUE',
                        help="replace fields of the plant's truth, among "
                        f'{", ".join(cup_divergence.OVERRIDABLE)} (SI units, vectors '
                        'comma-separated), e.g. ball_mass=0.0222')
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        overrides = cup_divergence.parse_overrides(args.override)
    except ValueError as error:
        parser.error(str(error))
    names = [s for s in args.strings.split(',') if s]
    unknown = sorted(set(names) - set(STRINGS))
    if unknown:
        parser.error(f'unknown strings {unknown}; valid: {", ".join(STRINGS)}')
    truth = cup.nominal_truth() if args.seed is None else cup.draw_truth(args.seed)
    truth = dataclasses.replace(truth, **overrides)
    report: Dict[str, Any] = {'seed': args.seed, 'overrides': overrides,
                              'string_length_m': truth.string_length}
    for name in names:
        report[name] = measure(truth, STRINGS[name], args.flailing, args.seed or 0)
        _print(name, report[name])
    report['machine'] = _common.machine_info(('torch', 'mujoco'))
    if args.json:
        _common.write_json(args.json, report)
    return 0


if __name__ == '__main__':
    sys.exit(main())
