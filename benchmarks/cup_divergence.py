"""
Ball in a cup: where the string model and the MuJoCo plant part ways on swing-ups (issue 18).

A short eREPS search on the *oracle* string model (the plant's true arm, cup transform and
string length: no identification error at all) gives a few swing-ups; each is then executed

a. in the model (``model_episode``, the ball at the search's model step, and at 1 ms);
b. on the plant (``sim.cup.CupPlant``) by computed torque on the *true* arm model, so the
   arm's tracking error is as small as the controller makes it (reported);
c. in the model again, but driven by the arm motion the plant really executed (the recorded
   joint positions and velocities, accelerations by central differences): the difference
   b - c is the string and the ball alone, c - a the arm's tracking;

and on plant variants that each switch one thing of the capsule string off (its joint
damping, its mass, the ball's contacts with the cup and the arm, the chain's tie to the ball:
``untied_chain`` leaves the ball on the tendon alone, an ideal massless string) or rebuild
the string of before 2026-11-27 evening (``legacy_string``: the damped 25-capsule chain without a
tendon).  Printed per swing-up and variant: the ball position error against the plant at
0.25, 0.5, 1.0, 1.5, 2.0 and 2.5 s, the first time it exceeds 2 cm, whether the plant
succeeded and the model caught, the plant ball's contact periods, and the plant's slack
(``l - |ball - anchor|`` > 5 mm) share.
``--replay-friction C ...`` adds replays (c) of the oracle string with the ball friction
``C`` (1/s, on the velocity relative to the anchor) instead of the nominal one: e.g. 0.16, what
the plant's string dissipates and ``fit_string``'s damping stage identifies.

Run (development plants only; never a plant the benchmark reports on)::

    python benchmarks/cup_divergence.py --seed 1 --searches 6 --json div.json
    python benchmarks/cup_divergence.py --seed 2 --searches 8 --variants plant \
        --replay-friction 0.16 --json div.json
    python benchmarks/cup_divergence.py --seed 2 --searches 8 \
        --variants plant,legacy_string --json div.json     # old string against new
    python benchmarks/cup_divergence.py --quick        # a smoke run, about a minute
    python benchmarks/cup_divergence.py --seed 2 --variants plant \
        --override ball_mass=0.0222 cup_rpy=-0.06,-0.08,-0.09   # one property changed

``--override FIELD=VALUE`` replaces one field of the development plant's hidden truth
(``sim.cup.CupTruth``: ``string_length``, ``cup_xyz``, ``cup_rpy``, ``ball_mass``, SI units,
vectors comma-separated; ``arm_of=S``: the arm of the benchmark's plant ``--seed S``) before
anything is searched, so that one property of another plant can be studied on a development
plant.
"""

import dataclasses
import os
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

import mujoco
import numpy as np
import torch

try:
    from benchmarks import _common
except ImportError:  # run as ``python benchmarks/cup_divergence.py``
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks import _common

from benchmarks import ball_in_a_cup as bench  # noqa: I100
from diffsim_ros.control.ball_in_cup import (BallInCupTask, model_episode, policy_search,
                                             SearchConfig)
from diffsim_ros.sim import cup
from diffsim_ros.sysid.string_model import StringModel

#: Times after the start at which the ball errors are reported, s.
CHECK_TIMES = (0.25, 0.5, 1.0, 1.5, 2.0, 2.5)
#: Ball error that counts as diverged, m.
DIVERGED_M = 0.02
#: Plant variants: what is switched off (``a+b`` switches off both); ``legacy_string`` is
#: the plant with the string of before 2026-11-27 evening (``sim.cup.LEGACY_STRING``).
VARIANTS = ('plant', 'no_string_damping', 'massless_string', 'no_ball_contact',
            'untied_chain', 'legacy_string')


#: The truth fields ``--override`` may replace; ``arm_of`` takes the arm of another plant.
OVERRIDABLE = ('string_length', 'cup_xyz', 'cup_rpy', 'ball_mass', 'arm_of')


def parse_overrides(items: Sequence[str]) -> Dict[str, Any]:
    """
    Parse ``FIELD=VALUE`` items into :class:`~diffsim_ros.sim.cup.CupTruth` field values.

    :param items: e.g. ``['ball_mass=0.0222', 'cup_rpy=-0.06,-0.08,-0.09', 'arm_of=3']``.
    :return: field name -> float (scalars) or tuple of floats (vectors); ``arm`` -> the
        ``TrueParameters`` of ``draw_truth(100 S, 0.40)`` for ``arm_of=S``.
    :raises ValueError: an unknown field, a malformed item or a wrong number of values.
    """
    out: Dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition('=')
        if not sep or name not in OVERRIDABLE:
            raise ValueError(f'override {item!r}: expected FIELD=VALUE with FIELD among '
                             f'{", ".join(OVERRIDABLE)}')
        try:
            values = tuple(float(v) for v in text.split(','))
        except ValueError:
            raise ValueError(f'override {item!r}: the value must be numbers') from None
        size = 3 if name in ('cup_xyz', 'cup_rpy') else 1
        if len(values) != size:
            raise ValueError(f'override {item!r}: {name} takes {size} value(s), got '
                             f'{len(values)}')
        if name == 'arm_of':
            if values[0] != int(values[0]):
                raise ValueError(f'override {item!r}: arm_of takes a plant seed (an integer)')
            out['arm'] = cup.draw_truth(100 * int(values[0]), 0.40).arm
        else:
            out[name] = values if size == 3 else values[0]
    return out


def oracle_model(truth: cup.CupTruth) -> StringModel:
    """
    Return the string model with the plant's true arm, cup transform and string length.

    :param truth: the hidden plant.
    :return: the model (nominal friction: the plant's string damping has no true value in it).
    """
    return StringModel(truth.arm_model(), string_length=truth.string_length,
                       cup_xyz=truth.cup_xyz, cup_rpy=truth.cup_rpy)


def variant_plant(truth: cup.CupTruth, name: str) -> cup.CupPlant:
    """
    Return the plant with one property of the string or the ball switched off.

    :param truth: the hidden plant.
    :param name: one of :data:`VARIANTS`, or several joined by ``+``.
    :return: the plant (its MuJoCo model edited in place).
    """
    parts = set(name.split('+'))
    if not parts <= set(VARIANTS):
        raise ValueError(f'unknown variant {name!r}; valid: {", ".join(VARIANTS)} (joined by +)')
    string = cup.LEGACY_STRING if 'legacy_string' in parts else cup.PLANT_STRING
    # Without damping the capsule chain needs a finer step to stay stable (sim/cup.py).
    plant = cup.CupPlant(truth, string=string,
                         timestep=string.timestep / 4 if 'no_string_damping' in parts
                         else string.timestep)
    m = plant.mj_model
    body, joint = mujoco.mjtObj.mjOBJ_BODY, mujoco.mjtObj.mjOBJ_JOINT
    for k in range(plant.string.capsules):
        j = mujoco.mj_name2id(m, joint, f'string_joint_{k}')
        b = mujoco.mj_name2id(m, body, f'string_{k}')
        if 'no_string_damping' in parts:
            m.dof_damping[m.jnt_dofadr[j]:m.jnt_dofadr[j] + 3] = 0.0
        if 'massless_string' in parts:
            # 1 % of the mass: MuJoCo needs some inertia per free ball joint.
            m.body_mass[b] *= 0.01
            m.body_inertia[b] *= 0.01
    if 'untied_chain' in parts:
        if not plant.string.tendon:
            raise ValueError('untied_chain needs the tendon string (not legacy_string)')
        # the connect that ties the chain's tip to the ball (the plant's only equality)
        m.eq_active0[:] = 0
    if 'no_ball_contact' in parts:
        g = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_GEOM, 'ball')
        m.geom_conaffinity[g] = 0
        m.geom_contype[g] = 0
    return plant


def record_contacts(plant: cup.CupPlant) -> List[Any]:
    """
    Make a plant log what its ball touches: ``(t, body name)`` once per driver period.

    :param plant: the plant (its ``apply`` is wrapped on this instance only).
    :return: the list the runs append to.
    """
    log: List[Any] = []
    apply = plant.apply
    m, d = plant.mj_model, plant.mj_data

    def logged(command, t=float('nan')):
        result = apply(command, t)
        for c in d.contact[:d.ncon]:
            for geom in (c.geom1, c.geom2):
                body = mujoco.mj_id2name(m, mujoco.mjtObj.mjOBJ_BODY, m.geom_bodyid[geom])
                if body != 'ball':
                    log.append((round(t, 3), body))
        return result

    plant.apply = logged
    return log


def replay(model: StringModel, recording: cup.CupRecording, dt: float) -> np.ndarray:
    """
    Roll the string model along the arm motion a plant recording shows.

    :param model: the string model.
    :param recording: a noiseless plant run (joint states at the driver rate).
    :param dt: the recording's period, s.
    :return: ball positions ``(T, 3)``, world, m, started where the plant's ball was.
    """
    q = torch.from_numpy(recording.q)
    qd = torch.from_numpy(recording.qd)
    qdd = torch.zeros_like(qd)
    qdd[1:-1] = (qd[2:] - qd[:-2]) / (2 * dt)
    with torch.no_grad():
        p, v, a = model.cup_motion(q, qd, qdd)
        x0 = torch.from_numpy(recording.ball[0])
        x, _ = model.rollout(x0, torch.zeros(3, dtype=torch.float64), p, v, a, dt)
    return x.numpy()


def errors(t_model: np.ndarray, x_model: np.ndarray, t_plant: np.ndarray,
           x_plant: np.ndarray) -> Dict[str, Any]:
    """
    Return ball position errors of a model run against a plant run.

    :param t_model: ``(T,)`` s; :param x_model: ``(T, 3)`` m.
    :param t_plant: ``(T',)`` s; :param x_plant: ``(T', 3)`` m.
    :return: ``at`` (error at :data:`CHECK_TIMES`, m) and ``diverged_s`` (first time the
        error exceeds :data:`DIVERGED_M`, None if never).
    """
    x = np.stack([np.interp(t_plant, t_model, x_model[:, i]) for i in range(3)], -1)
    e = np.linalg.norm(x - x_plant, axis=-1)
    at = [float(np.interp(s, t_plant, e)) for s in CHECK_TIMES]
    over = np.nonzero(e > DIVERGED_M)[0]
    return {'at': at, 'diverged_s': float(t_plant[over[0]]) if over.size else None}


def fine_task(task: BallInCupTask, dt: float) -> BallInCupTask:
    """
    Return the task with a finer model step (the same 20 ms kinematics grid).

    :param task: the task.
    :param dt: the new step, s.
    :return: the task.
    """
    stride = int(round(task.dt * task.kinematics_stride / dt))
    return dataclasses.replace(task, dt=dt, kinematics_stride=stride)


def diagnose(seed: int, searches: int, config: SearchConfig,
             variants: Sequence[str] = VARIANTS,
             replay_frictions: Sequence[float] = (),
             overrides: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """
    Search swing-ups on the oracle model of plant ``seed`` and compare model and plant.

    :param seed: the development plant (``draw_truth(100 seed, 0.40)``, the benchmark's).
    :param searches: policy searches (one swing-up each).
    :param config: eREPS settings.
    :param variants: plant variants to run.
    :param replay_frictions: extra replays on the plant's run with these frictions (1/s).
    :param overrides: truth fields replaced before the search (:func:`parse_overrides`).
    :return: per swing-up and variant the figures of the module docstring.
    """
    truth = dataclasses.replace(cup.draw_truth(seed * 100, 0.40), **(overrides or {}))
    model = oracle_model(truth)
    arm = truth.arm_model()
    task = bench.make_task(arm)
    result = policy_search(task, model, [seed * 10000 + 500 + k for k in range(searches)],
                           config)
    plants = {name: variant_plant(truth, name) for name in variants}
    logs = {name: record_contacts(plant) for name, plant in plants.items()}
    seconds = task.promp.duration + task.hold
    dt_plant = 1.0 / cup.RATE_HZ
    out: List[Dict[str, Any]] = []
    for i, theta in enumerate(result.distribution.mean):
        episode = model_episode(task, theta[None], model)
        fine = model_episode(fine_task(task, 0.001), theta[None], model)
        t_model = task.times().numpy()
        row: Dict[str, Any] = {'theta': theta.tolist(), 'reward': float(result.reward[i]),
                               'caught_in_model': bool(result.caught[i]),
                               'caught_in_model_1ms': bool(fine.caught[0])}
        for name, plant in plants.items():
            controller = cup.tracking_controller(arm, task.promp.reference(theta))
            logs[name].clear()
            try:
                rec = plant.run(controller, bench.HOME, seconds)
            except RuntimeError as error:
                row[name] = {'diverged': str(error)}
                continue
            q_ref = task.promp.reference(theta)(torch.from_numpy(rec.t))[0].numpy()
            distance = np.linalg.norm(rec.ball - rec.cup_pos, axis=-1)
            figures = {'success': cup.in_cup(rec),
                       'tracking_error_rad': float(np.abs(rec.q - q_ref).max()),
                       'contact_s': float(rec.contact.sum() * dt_plant),
                       'first_contact_s': (float(rec.t[np.argmax(rec.contact)])
                                           if rec.contact.any() else None),
                       'touched': sorted({body for _, body in logs[name]}),
                       'slack_share': float(np.mean(truth.string_length - distance > 5e-3)),
                       'model': errors(t_model, episode.ball[0].numpy(), rec.t, rec.ball),
                       'model_1ms': errors(fine_task(task, 0.001).times().numpy(),
                                           fine.ball[0].numpy(), rec.t, rec.ball)}
            if name == 'plant':
                figures['replay'] = errors(rec.t, replay(model, rec, dt_plant), rec.t, rec.ball)
                figures['arm_only'] = errors(t_model, episode.ball[0].numpy(), rec.t,
                                             replay(model, rec, dt_plant))
                for c in replay_frictions:
                    damped = oracle_model(truth)
                    with torch.no_grad():
                        damped.log_friction.fill_(float(np.log(c)))
                    figures[f'replay_friction_{c:g}'] = errors(
                        rec.t, replay(damped, rec, dt_plant), rec.t, rec.ball)
            row[name] = figures
        out.append(row)
    shown = {k: (v if k != 'arm' else 'replaced') for k, v in (overrides or {}).items()}
    return {'seed': seed, 'overrides': shown, 'truth_length_m': truth.string_length,
            'swing_ups': out,
            'search_s': result.seconds}


def _line(name: str, e: Dict[str, Any]) -> str:
    """Return one printed row of errors (cm)."""
    at = ' '.join(f'{100 * v:6.1f}' for v in e['at'])
    div = '-' if e['diverged_s'] is None else f'{e["diverged_s"]:.2f}'
    return f'    {name:22s} {at}   diverged at {div} s'


def main(argv: Optional[Sequence[str]] = None) -> int:
    """
    Run the diagnosis (see the module docstring).

    :param argv: command-line arguments (None: ``sys.argv``).
    :return: exit status.
    """
    parser = _common.make_parser('Ball in a cup: where the string model and the MuJoCo plant '
                                 'diverge along the same searched swing-ups (issue 18).')
    parser.add_argument('--seed', type=int, default=1,
                        help='development plant (draw_truth(100 seed, 0.40 m)); default 1')
    parser.add_argument('--searches', type=int, default=6,
                        help='searched swing-ups to compare (default 6)')
    parser.add_argument('--iterations', type=int, default=SearchConfig.iterations,
                        help='eREPS updates per search')
    parser.add_argument('--variants', default=','.join(VARIANTS),
                        help=f'plant variants among {",".join(VARIANTS)}')
    parser.add_argument('--replay-friction', type=float, nargs='*', default=[],
                        help='also replay the oracle string with these ball frictions (1/s, '
                        'relative to the anchor), e.g. 0.16')
    parser.add_argument('--override', nargs='*', default=[], metavar='FIELD=VALUE',
                        help="replace fields of the plant's hidden truth before the search, "
                        f'among {", ".join(OVERRIDABLE)} (SI units, vectors comma-separated; '
                        'arm_of=S: the arm of plant --seed S), '
                        'e.g. ball_mass=0.0222 cup_rpy=-0.06,-0.08,-0.09')
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if not all(c > 0 for c in args.replay_friction):
        parser.error('--replay-friction values must be positive')
    variants = [v for v in args.variants.split(',') if v]
    unknown = sorted({v for name in variants for v in name.split('+')} - set(VARIANTS))
    if unknown:
        parser.error(f'unknown variants {unknown}; valid: {", ".join(VARIANTS)}')
    try:
        overrides = parse_overrides(args.override)
    except ValueError as error:
        parser.error(str(error))
    searches, iterations = (2, 5) if args.quick else (args.searches, args.iterations)
    start = time.perf_counter()
    report = diagnose(args.seed, searches, SearchConfig(iterations=iterations),
                      variants, args.replay_friction, overrides)
    print(f'plant seed {args.seed} (overrides {report["overrides"] or "none"}), true length '
          f'{report["truth_length_m"]:.4f} m; ball error '
          f'(cm) at {", ".join(f"{s:g}" for s in CHECK_TIMES)} s')
    for i, row in enumerate(report['swing_ups']):
        print(f'swing-up {i}: model reward {row["reward"]:.3f}, caught in model '
              f'{row["caught_in_model"]} (1 ms: {row["caught_in_model_1ms"]})')
        for name in variants:
            f = row[name]
            if 'diverged' in f:
                print(f'  {name}: {f["diverged"]}')
                continue
            print(f'  {name}: success {f["success"]}, tracking {f["tracking_error_rad"]:.4f} '
                  f'rad, ball contact {f["contact_s"]:.3f} s (first '
                  f'{f["first_contact_s"]}: {",".join(f["touched"])}), '
                  f'slack share {f["slack_share"]:.2f}')
            print(_line('model (4 ms) vs plant', f['model']))
            print(_line('model (1 ms) vs plant', f['model_1ms']))
            if 'replay' in f:
                print(_line('replay vs plant', f['replay']))
                print(_line('model vs replay (arm)', f['arm_only']))
                for c in args.replay_friction:
                    print(_line(f'replay c={c:g} vs plant', f[f'replay_friction_{c:g}']))
    report['total_s'] = time.perf_counter() - start
    report['machine'] = _common.machine_info(('torch', 'mujoco'))
    if args.json:
        _common.write_json(args.json, report)
    return 0


if __name__ == '__main__':
    sys.exit(main())
