"""
A simulated study where the truth is known: a hidden asymmetric object, with and without a vortex.

The contact-learning paper's vortex scenario (section 5, Fig. 4/5), with MuJoCo as the world.
The object (``--object-seed``): six random points in convex position, scaled so that their
convex hull has the volume of one elbow link (0.10 x 0.05 x 0.05 m), 0.25 kg of uniform
density (its CoM, the body origin, and inertia are the hull's), friction drawn in
0.2-0.4. Its spec (``ObjectSpec``, through ``io.object_urdf.urdf_object_spec`` of a URDF with
one radius-0 sphere per vertex) is the truth: ``start_parameters(perturb=True)`` draws every
method's start 0.5-1.5x around it, and volume, friction and inertia errors are against it
(inertia error 13c with the hull's radius of gyration as the length). MuJoCo collides the
hull as a mesh (``sim.contact_scenes.free_body_scene``, ``--substeps`` steps per sample).
Tosses: released from random poses 0.1-0.3 m above the plane (lowest vertex), horizontal
velocity up to 1 m/s, vertical -0.5..1 m/s, spin up to 8 rad/s per axis, recorded at 148 Hz
for ``--samples`` samples as the real cube tosses are (``q (T, 7)``, ``v (T, 6)``: the backward
differences of the poses, ``sysid.object_online.pose_velocities`` without its median).

Two conditions on the same releases: ``none`` (no field: every method should recover the
truth) and ``vortex``: every MuJoCo step adds the world force ``m a(p)`` at the CoM
(``xfrc_applied``), ``a = -pull r + swirl e_z x r`` with ``r`` the horizontal offset of the
CoM from the vertical line through the origin: pulled towards and swirling around it, the
object's model knows nothing of it. For each condition, method (``--methods``), training-set
size (``--sizes``) and seed (``--seeds K``: seeds ``--seed .. --seed + K - 1``) one fit through
``sysid.object_learning.fit_object`` with Table 2's weights of ``--regime`` (default ``sim``:
the residual's ``w_res`` 1e-3, ``w_res_w`` 0), split as ``benchmarks/contact_learning.py``
(fixed test and validation tosses; a smaller training set is a subset of a larger), rolled out
on the test tosses from their second sample. Beside them, in the same run on the same test
tosses: the truth rolled out in our contact step (``ours_truth``: the object exactly, no
field) and, with the vortex, the truth plus the exact field as a residual force
(``ours_truth_field``): the floor our step can reach on MuJoCo's data; and the physical
methods' perturbed start (``perturbed_start``, mean over the seeds): what learning improves
on. The recovered parameters table gives, per physical method and size, the learned friction
and each parameter error at the start and after the fit (means over seeds).
"""

from dataclasses import dataclass, replace
import math
import os
from pathlib import Path
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

try:
    from benchmarks import _common, contact_learning as curves
except ImportError:  # run as ``python benchmarks/contact_vortex.py``
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks import _common, contact_learning as curves

from diffsim_ros.core.dispatch import crba  # noqa: I100
from diffsim_ros.core.spatial import quat_conjugate, quat_rotate, quat_to_matrix
from diffsim_ros.io.object_urdf import urdf_object_spec
from diffsim_ros.sim.contact_scenes import free_body_scene, GeomSpec
from diffsim_ros.sysid import contact_learning as cl
from diffsim_ros.sysid.object_learning import fit_object, METHODS
from diffsim_ros.sysid.object_online import pose_velocities

MASS_KG = 0.25
#: Volume of one DAIR elbow link (0.10 x 0.05 x 0.05 m), the paper's size of the object.
VOLUME_M3 = 0.10 * 0.05 * 0.05
DT = 1.0 / 148.0
CONDITIONS = ('none', 'vortex')
DEFAULT_SIZES = (8, 32, 128)
#: Per-run parameter errors, also reported at the start each fit was drawn at.
PARAMETERS = ('volume_error', 'friction_error', 'inertia_error')


@dataclass(frozen=True)
class Vortex:
    """
    A horizontal acceleration field about the vertical line through the world origin.

    ``a(p) = -pull r + swirl e_z x r`` with ``r = (p_x, p_y, 0)`` [m]: pulled towards the
    line and swirling around it (counter-clockwise seen from above), growing with the
    distance; no vertical part.

    :ivar pull: radial stiffness [1/s^2].
    :ivar swirl: tangential gain [1/s^2].
    """

    pull: float = 8.0
    swirl: float = 12.0

    def acceleration(self, p_world: torch.Tensor) -> torch.Tensor:
        """
        Return the field's acceleration at world points.

        :param p_world: ``(..., 3)`` positions [m].
        :return: ``(..., 3)`` world accelerations [m/s^2].
        """
        x, y = p_world[..., 0], p_world[..., 1]
        return torch.stack((-self.pull * x - self.swirl * y, -self.pull * y + self.swirl * x,
                            torch.zeros_like(x)), -1)

    def generalized_force(self, model, q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """
        Return the field on a free body as the generalised force of our step (``M [R^T a; 0]``).

        A uniform acceleration of every mass element is the force ``m a`` at the CoM; with
        the linear velocity in root axes that is ``M(q) [R^T a; 0]`` whatever the CoM offset
        (as a residual network's ``M delta``), so :func:`~diffsim_ros.sysid.contact_learning
        .rollout` takes this object as its ``residual``. The field is evaluated at the body
        origin (the CoM of this study's object).

        :param model: the floating one-body model.
        :param q: ``(..., 7)`` configurations.
        :param v: ``(..., 6)`` velocities (unused: the field depends on position only).
        :return: ``(..., 6)`` generalised forces.
        """
        linear = quat_rotate(quat_conjugate(q[..., 3:7]), self.acceleration(q[..., :3]))
        delta = torch.cat((linear, torch.zeros_like(linear)), -1)
        return (crba(model, q) @ delta.unsqueeze(-1)).squeeze(-1)


def hull_inertia(vertices: np.ndarray, mass: float) -> Tuple[float, np.ndarray, np.ndarray]:
    """
    Return the volume, centroid and inertia of a uniform convex hull.

    Tetrahedra from an interior point to every hull triangle; each tetrahedron's second
    moment ``V / 20 (sum_i v_i v_i^T + s s^T)`` (``s`` the sum of its four vertices).

    :param vertices: ``(k, 3)`` points [m].
    :param mass: total mass [kg].
    :return: ``(volume [m^3], centroid (3,) [m], inertia about the centroid (3, 3)
        [kg m^2])``.
    """
    from scipy.spatial import ConvexHull
    hull = ConvexHull(vertices)
    inside = vertices[hull.vertices].mean(0)
    volume, first, second = 0.0, np.zeros(3), np.zeros((3, 3))
    for simplex in hull.simplices:
        tet = np.vstack((inside, vertices[simplex]))
        size = abs(np.linalg.det(tet[1:] - tet[0])) / 6.0
        total = tet.sum(0)
        volume += size
        first += size * total / 4.0
        second += size / 20.0 * (tet.T @ tet + np.outer(total, total))
    centroid = first / volume
    second = second - volume * np.outer(centroid, centroid)
    density = mass / volume
    inertia = density * (np.trace(second) * np.eye(3) - second)
    return volume, centroid, inertia


def asymmetric_object(seed: int, n_vertices: int = 6) -> Dict[str, Any]:
    """
    Draw the hidden object (module docstring) from a seed.

    Points on an ellipsoid of semi-axes (6, 3.5, 3) cm in random directions, redrawn until
    all are hull vertices and the hull is not a sliver (smallest principal moment above a
    third of the largest), scaled to :data:`VOLUME_M3` and moved so the CoM is the origin.

    :param seed: seed of the draw.
    :param n_vertices: vertices of the hull.
    :return: ``vertices`` ``(k, 3)`` [m], ``friction``, ``inertia`` ``(3, 3)`` about the
        CoM [kg m^2], ``volume_m3``.
    :raises RuntimeError: when no draw qualifies (not seen for six vertices).
    """
    from scipy.spatial import ConvexHull
    rng = np.random.default_rng(seed)
    friction = float(rng.uniform(0.2, 0.4))
    for _ in range(1000):
        directions = rng.normal(size=(n_vertices, 3))
        points = directions / np.linalg.norm(directions, axis=1, keepdims=True)
        points = points * np.array([0.06, 0.035, 0.03])
        if len(ConvexHull(points).vertices) < n_vertices:
            continue
        volume, centroid, inertia = hull_inertia(points, MASS_KG)
        moments = np.linalg.eigvalsh(inertia)
        if moments[0] < moments[-1] / 3.0:
            continue
        points = (points - centroid) * (VOLUME_M3 / volume) ** (1.0 / 3.0)
        volume, centroid, inertia = hull_inertia(points, MASS_KG)
        return {'vertices': points - centroid, 'friction': friction, 'inertia': inertia,
                'volume_m3': volume}
    raise RuntimeError(f'no {n_vertices}-vertex hull qualified for seed {seed}')


def object_spec(truth: Dict[str, Any]) -> cl.ObjectSpec:
    """
    Return the spec of the hidden object: its URDF read by ``urdf_object_spec``, truth known.

    :param truth: what :func:`asymmetric_object` returns.
    :return: the spec (true vertices, true inertial, characteristic length the hull's radius
        of gyration ``sqrt(tr I / (3 m))``).
    """
    inertia = np.asarray(truth['inertia'], float).tolist()
    spheres = ''.join(
        f'<collision name="vertex_{k}"><origin xyz="{x!r} {y!r} {z!r}" rpy="0 0 0"/>'
        f'<geometry><sphere radius="0.0"/></geometry></collision>'
        for k, (x, y, z) in enumerate(truth['vertices'].tolist()))
    urdf = (f'<robot name="asymmetric"><link name="body"><inertial>'
            f'<origin xyz="0 0 0" rpy="0 0 0"/><mass value="{MASS_KG!r}"/>'
            f'<inertia ixx="{inertia[0][0]!r}" ixy="{inertia[0][1]!r}" '
            f'ixz="{inertia[0][2]!r}" iyy="{inertia[1][1]!r}" iyz="{inertia[1][2]!r}" '
            f'izz="{inertia[2][2]!r}"/></inertial>'
            f'{spheres}</link></robot>')
    length = math.sqrt(float(np.trace(truth['inertia'])) / (3.0 * MASS_KG))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / 'asymmetric.urdf'
        path.write_text(urdf, encoding='utf-8')
        spec = urdf_object_spec(path, truth['friction'], name='asymmetric',
                                known_geometry=True, length=length)
    return replace(spec, true_inertial=spec.model.inertial.detach().clone())


def _release(rng: np.random.Generator, reach: float) -> Tuple[torch.Tensor, torch.Tensor]:
    # A random free-flight state (the sim tosser's ranges): lowest vertex 0.1-0.3 m up.
    quat = rng.normal(size=4)
    quat = torch.tensor(quat / np.linalg.norm(quat), dtype=torch.float64)
    position = np.r_[rng.uniform(-0.2, 0.2, 2), rng.uniform(0.1, 0.3) + reach]
    v_world = torch.tensor(np.r_[rng.uniform(-1.0, 1.0, 2), rng.uniform(-0.5, 1.0)],
                           dtype=torch.float64)
    R = quat_to_matrix(quat)
    v = torch.cat((R.T @ v_world, torch.tensor(rng.uniform(-8.0, 8.0, 3))))
    return torch.cat((torch.tensor(position), quat)), v


def simulate_tosses(spec: cl.ObjectSpec, vortex: Optional[Vortex], n: int, samples: int,
                    seed: int, substeps: int = 20) -> Tuple[List[torch.Tensor],
                                                            List[torch.Tensor]]:
    """
    Toss the true object in MuJoCo and record it as the real tosses are (module docstring).

    :param spec: the object's spec (its true model, vertices and friction).
    :param vortex: the field applied at every MuJoCo step, or None.
    :param n: tosses.
    :param samples: samples per toss (the release is the first).
    :param seed: seed of the releases (the same seed gives the same releases with or without
        the field).
    :param substeps: MuJoCo steps per sample.
    :return: ``(q list, v list)``, ``(samples, 7)`` and ``(samples, 6)`` each.
    """
    import mujoco
    vertices = spec.true_vertices[0]
    scene = free_body_scene(spec.model, [GeomSpec('hull', tuple(vertices.reshape(-1).tolist()))],
                            float(spec.contact.friction), timestep=DT / substeps)
    m, d = scene.mj_model, scene.mj_data
    body = m.nbody - 1
    reach = float(vertices.norm(dim=-1).max())
    rng = np.random.default_rng(seed)
    stamps = torch.arange(samples, dtype=torch.float64) * DT
    qs, vs = [], []
    for _ in range(n):
        scene.set_state(*_release(rng, reach))
        rows = [scene.state()[0]]
        for _ in range(samples - 1):
            for _ in range(substeps):
                if vortex is not None:
                    p = torch.from_numpy(d.qpos[:3].copy())
                    d.xfrc_applied[body, :3] = MASS_KG * vortex.acceleration(p).numpy()
                mujoco.mj_step(m, d)
            rows.append(scene.state()[0])
        q = torch.stack(rows)
        qs.append(q)
        vs.append(pose_velocities(stamps, q, median=False))
    return qs, vs


def _nominal(spec, vortex, x0, lengths, recorded) -> Dict[str, Any]:
    rows = {'ours_truth': cl.rollout(spec.model, spec.contact, x0, max(lengths), DT)}
    if vortex is not None:
        rows['ours_truth_field'] = cl.rollout(spec.model, spec.contact, x0, max(lengths), DT,
                                              residual=vortex)
    out = {}
    for name, batch in rows.items():
        out[name] = curves._test_errors([batch[k, :n, :7] for k, n in enumerate(lengths)],
                                        recorded)
        out[name].update(volume_error=0.0, friction_error=0.0, inertia_error=0.0)
    return out


def _starts(spec, seeds, x0, lengths, recorded) -> Dict[str, Any]:
    # The physical methods' start of each seed (start_parameters, as fit_object draws it)
    # rolled out on the test tosses: what learning has to improve on.
    out = {}
    for seed in seeds:
        theta = cl.start_parameters(spec, seed, perturb=True)
        model, contact = cl.object_models(spec.model, spec.contact, theta, spec.masses)
        batch = cl.rollout(model, contact, x0, max(lengths), DT)
        row = curves._test_errors([batch[k, :n, :7] for k, n in enumerate(lengths)],
                                  recorded)
        summary = cl.physical_summary(spec, model, contact)
        row.update({key: summary[key] for key in PARAMETERS})
        out[str(seed)] = row
    return out


def residual_errors(residual, vortex: Optional[Vortex], q: torch.Tensor,
                    v: torch.Tensor) -> Dict[str, float]:
    """
    Return how well a learned residual's linear part matches the field on given states.

    :param residual: a ``ResidualNetwork`` (``fit.extra['residual']``).
    :param vortex: the true field, or None (zero).
    :param q: ``(N, 7)`` configurations.
    :param v: ``(N, 6)`` velocities.
    :return: ``field_rms`` (the field's RMS) and ``residual_rms_error`` (RMS of the residual's
        world linear acceleration minus the field), m/s^2; also ``residual_vertical_rms``.
    """
    with torch.no_grad():
        linear = quat_rotate(q[:, 3:7], residual(q, v)[:, :3])
        field = (torch.zeros_like(linear) if vortex is None
                 else vortex.acceleration(q[:, :3]))
    return {'field_rms': _rms(field), 'residual_rms_error': _rms(linear - field),
            'residual_vertical_rms': _rms(linear[:, 2:])}


def _rms(x: torch.Tensor) -> float:
    return float(x.pow(2).sum(-1).mean().sqrt())


def run_condition(spec: cl.ObjectSpec, vortex: Optional[Vortex], methods: Sequence[str],
                  sizes: Sequence[int], seeds: Sequence[int], n_val: int, n_test: int,
                  samples: int, steps: int, regime: str, toss_seed: int, split_seed: int = 0,
                  substeps: int = 20, log=None) -> Dict[str, Any]:
    """
    Simulate one condition's tosses, fit every method at every size and seed, evaluate.

    :param spec: the true object.
    :param vortex: the field, or None.
    :param methods: keys of ``METHODS``.
    :param sizes: training-set sizes.
    :param seeds: initialisation seeds.
    :param n_val: validation tosses.
    :param n_test: test tosses.
    :param samples: samples per toss.
    :param steps: maximum optimiser steps per fit.
    :param regime: ``fit_object``'s weights (``'sim'`` or ``'real'``).
    :param toss_seed: seed of the releases.
    :param split_seed: seed of the split.
    :param substeps: MuJoCo steps per sample.
    :param log: called with a line after each fit, or None.
    :return: a payload shaped as ``benchmarks/contact_learning.py``'s (``runs``, ``curves``,
        ``nominal`` ...; a residual method's runs add :func:`residual_errors` on the test
        tosses' states); ``starts``: per seed, the errors of the physical methods' start
        (also each physical run's ``start_*`` keys), their mean over seeds the ``nominal``
        row ``perturbed_start``.
    """
    n_total = max(sizes) + n_val + n_test
    start = time.perf_counter()
    q, v = simulate_tosses(spec, vortex, n_total, samples, toss_seed, substeps)
    simulate_s = time.perf_counter() - start
    train_i, val_i, test_i = curves.split(n_total, max(sizes), n_val, n_test, split_seed)
    x0 = torch.stack([torch.cat((q[i][1], v[i][1])) for i in test_i])
    lengths = [len(q[i]) - 2 for i in test_i]
    recorded = [q[i][2:] for i in test_i]
    nominal = _nominal(spec, vortex, x0, lengths, recorded)
    starts = _starts(spec, seeds, x0, lengths, recorded)
    nominal['perturbed_start'] = {key: float(np.mean([row[key] for row in starts.values()]))
                                  for key in curves.METRICS}
    validation = ([q[i] for i in val_i], [v[i] for i in val_i])
    test_states = cl.transitions([q[i] for i in test_i], [v[i] for i in test_i])[:2]
    runs = []
    for method in methods:
        for size in sizes:
            train = ([q[i] for i in train_i[:size]], [v[i] for i in train_i[:size]])
            for seed in seeds:
                begin = time.perf_counter()
                fit = fit_object(spec, method, train, validation, DT, seed=seed, steps=steps,
                                 regime=regime)
                train_s = time.perf_counter() - begin
                batch = fit.predict(x0, max(lengths), DT)
                row = curves._test_errors([batch[k, :n, :7] for k, n in enumerate(lengths)],
                                          recorded)
                summary = fit.summary()
                row.update({key: summary.get(key) for key in PARAMETERS})
                start_row = starts[str(seed)] if summary else {}
                row.update({'start_' + key: start_row.get(key)
                            for key in ('position_m', 'orientation_rad') + PARAMETERS})
                row.update(method=method, size=int(size), seed=int(seed), train_s=train_s,
                           last_step=int(fit.history['step'][-1]),
                           friction=summary.get('friction'),
                           start_friction=fit.start.get('friction'))
                if 'residual' in fit.extra:
                    row.update(residual_errors(fit.extra['residual'], vortex, *test_states))
                runs.append(row)
                if log is not None:
                    log(f'{"vortex" if vortex else "none"} {method} N={size} seed={seed}: '
                        f'position {1e3 * row["position_m"]:.1f} mm, orientation '
                        f'{math.degrees(row["orientation_rad"]):.1f} deg, {train_s:.0f} s')
    metrics = curves.METRICS
    table = {method: {str(size): {
        metric: curves.t_interval([r[metric] for r in runs
                                   if r['method'] == method and r['size'] == size])
        for metric in metrics} for size in sizes} for method in methods}
    return {'methods': list(methods), 'sizes': [int(s) for s in sizes],
            'seeds': [int(s) for s in seeds], 'split_seed': split_seed,
            'validation_tosses': len(val_i), 'test_tosses': len(test_i),
            'test_toss_ids': [int(i) for i in test_i], 'dt': DT, 'steps': steps,
            'samples': samples, 'regime': regime, 'metrics': list(metrics),
            'nominal': nominal, 'starts': starts, 'runs': runs, 'curves': table,
            'seconds': {'simulate_s': simulate_s,
                        'fits_s': float(sum(r['train_s'] for r in runs))}}


def run(object_seed: int, methods: Sequence[str], sizes: Sequence[int], seeds: Sequence[int],
        n_val: int, n_test: int, samples: int, steps: int, regime: str = 'sim',
        conditions: Sequence[str] = CONDITIONS, vortex: Vortex = Vortex(),
        substeps: int = 20, log=None) -> Dict[str, Any]:
    """
    Draw the object and run every condition on the same releases.

    :param object_seed: seed of the object and of the releases.
    :param methods: keys of ``METHODS``.
    :param sizes: training-set sizes.
    :param seeds: initialisation seeds.
    :param n_val: validation tosses.
    :param n_test: test tosses.
    :param samples: samples per toss.
    :param steps: maximum optimiser steps per fit.
    :param regime: ``fit_object``'s weights.
    :param conditions: of :data:`CONDITIONS`.
    :param vortex: the field of the ``'vortex'`` condition.
    :param substeps: MuJoCo steps per sample.
    :param log: progress callback, or None.
    :return: ``object``, ``vortex`` and one :func:`run_condition` payload per condition.
    :raises ValueError: unknown methods or conditions.
    """
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f'unknown methods {unknown}; valid: {", ".join(METHODS)}')
    if set(conditions) - set(CONDITIONS):
        raise ValueError(f'unknown conditions {conditions}; valid: {", ".join(CONDITIONS)}')
    truth = asymmetric_object(object_seed)
    spec = object_spec(truth)
    out = {'object': {'seed': object_seed, 'vertices_m': truth['vertices'].tolist(),
                      'friction': truth['friction'], 'mass_kg': MASS_KG,
                      'volume_m3': truth['volume_m3'], 'inertia_kg_m2': truth['inertia'].tolist(),
                      'inertia_length_m': spec.length},
           'vortex': {'pull_per_s2': vortex.pull, 'swirl_per_s2': vortex.swirl},
           'conditions': {}}
    for name in conditions:
        out['conditions'][name] = run_condition(
            spec, vortex if name == 'vortex' else None, methods, sizes, seeds, n_val, n_test,
            samples, steps, regime, toss_seed=object_seed + 1, substeps=substeps, log=log)
    return out


def _mean(values) -> Optional[float]:
    values = [x for x in values if x is not None]
    return float(np.mean(values)) if values else None


def parameter_table(payload: Dict[str, Any]) -> str:
    """
    Return the recovered parameters per condition, method and size (mean over seeds).

    :param payload: what :func:`run` returns.
    :return: a markdown table: learned friction (the truth in the header) and each parameter
        error at the start and after the fit.
    """
    headers = ['condition', 'method', 'N', 'friction', 'friction err start -> fit',
               'volume err start -> fit', 'inertia err start -> fit']
    rows = []
    for name, condition in payload['conditions'].items():
        for method in condition['methods']:
            for size in condition['sizes']:
                runs = [r for r in condition['runs']
                        if r['method'] == method and r['size'] == size]
                if _mean(r['friction'] for r in runs) is None:
                    continue
                cells = [_common.fmt_number(_mean(r['friction'] for r in runs))]
                for key in PARAMETERS[1:2] + PARAMETERS[:1] + PARAMETERS[2:]:
                    cells.append(f'{_common.fmt_number(_mean(r["start_" + key] for r in runs))}'
                                 f' -> {_common.fmt_number(_mean(r[key] for r in runs))}')
                rows.append([name, method, str(size)] + cells)
    head = f'true friction {_common.fmt_number(payload["object"]["friction"])}\n\n'
    return head + _common.format_markdown_table(headers, rows) + '\n'


def residual_table(payload: Dict[str, Any]) -> str:
    """
    Return, per condition, residual method and size, the residual against the true field.

    :param payload: what :func:`run` returns.
    :return: a markdown table (means over seeds, m/s^2), empty without residual methods.
    """
    headers = ['condition', 'method', 'N', 'field RMS', 'residual - field RMS',
               'residual vertical RMS']
    rows = []
    for name, condition in payload['conditions'].items():
        for method in condition['methods']:
            for size in condition['sizes']:
                runs = [r for r in condition['runs'] if r['method'] == method
                        and r['size'] == size and 'residual_rms_error' in r]
                if runs:
                    rows.append([name, method, str(size)] + [
                        _common.fmt_number(_mean(r[key] for r in runs))
                        for key in ('field_rms', 'residual_rms_error',
                                    'residual_vertical_rms')])
    return _common.format_markdown_table(headers, rows) + '\n' if rows else ''


def markdown(payload: Dict[str, Any]) -> str:
    """Return the learning curves of each condition, the parameters and the residuals."""
    parts = []
    for name, condition in payload['conditions'].items():
        parts.append(f'### {name}\n\n' + curves.markdown(condition))
    parts.append('### recovered parameters\n\n' + parameter_table(payload))
    residuals = residual_table(payload)
    if residuals:
        parts.append("### learned residual against the true field (test tosses' states)\n\n"
                     + residuals)
    return '\n'.join(parts)


def _ints(text: str) -> List[int]:
    return [int(x) for x in text.split(',') if x.strip()]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """
    Run the simulated study and print markdown tables.

    :param argv: command-line arguments (``sys.argv[1:]`` when None).
    :return: process exit status.
    """
    parser = _common.make_parser(__doc__.strip().splitlines()[0])
    parser.add_argument('--methods', default=','.join(METHODS),
                        help=f'comma-separated methods (default: all of {", ".join(METHODS)})')
    parser.add_argument('--sizes', default=','.join(map(str, DEFAULT_SIZES)),
                        help='comma-separated training-set sizes (tosses)')
    parser.add_argument('--seeds', type=int, default=2,
                        help='random initialisations per method and size')
    parser.add_argument('--seed', type=int, default=0, help='the first initialisation seed')
    parser.add_argument('--object-seed', type=int, default=0,
                        help='seed of the hidden object and of the releases')
    parser.add_argument('--conditions', default=','.join(CONDITIONS),
                        help='comma-separated: none (no field), vortex (default: both)')
    parser.add_argument('--regime', default='sim', choices=sorted(cl.REGIMES),
                        help="Table 2's weights given to fit_object (default sim)")
    parser.add_argument('--pull', type=float, default=Vortex.pull,
                        help='the vortex pull towards its line, 1/s^2')
    parser.add_argument('--swirl', type=float, default=Vortex.swirl,
                        help='the vortex swirl around its line, 1/s^2')
    parser.add_argument('--samples', type=int, default=100, help='samples per toss (148 Hz)')
    parser.add_argument('--substeps', type=int, default=20, help='MuJoCo steps per sample')
    parser.add_argument('--test-tosses', type=int, default=30, help='held-out test tosses')
    parser.add_argument('--validation-tosses', type=int, default=8,
                        help='tosses for early stopping')
    parser.add_argument('--steps', type=int, default=400,
                        help='maximum optimiser steps per fit (the MLP takes 10x as many)')
    parser.add_argument('--plot', metavar='PATH', default=None,
                        help="write each condition's learning curves as PATH with the "
                             'condition before its suffix')
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    methods = [m.strip() for m in args.methods.split(',') if m.strip()]
    conditions = [c.strip() for c in args.conditions.split(',') if c.strip()]
    seeds = list(range(args.seed, args.seed + args.seeds))
    settings = {'sizes': _ints(args.sizes), 'n_val': args.validation_tosses,
                'n_test': args.test_tosses, 'samples': args.samples, 'steps': args.steps}
    if args.quick:
        settings = {'sizes': [min(4, max(settings['sizes']))], 'n_val': 2, 'n_test': 4,
                    'samples': 60, 'steps': min(args.steps, 40)}
        seeds = seeds[:1]
    start = time.perf_counter()
    payload = run(args.object_seed, methods, seeds=seeds, regime=args.regime,
                  conditions=conditions, vortex=Vortex(args.pull, args.swirl),
                  substeps=args.substeps, log=lambda line: print(line, file=sys.stderr),
                  **settings)
    payload['seconds'] = time.perf_counter() - start
    payload['machine'] = _common.machine_info(('torch', 'mujoco', 'scipy'))
    payload['quick'] = args.quick
    print(markdown(payload))
    if args.json:
        _common.write_json(args.json, payload)
    if args.plot:
        stem, suffix = os.path.splitext(args.plot)
        for name, condition in payload['conditions'].items():
            curves.plot(condition, f'{stem}_{name}{suffix or ".png"}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
