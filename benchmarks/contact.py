"""
Contact time steps per second: B cubes on the ground, ours beside MuJoCo in the same run.

Every cube (0.37 kg, edge 0.1048 m, mu 0.18, the ContactNets cube) starts resting on the
ground with a random horizontal velocity of up to 1 m/s, so every step has sliding and
sticking contacts.  Ours: :func:`diffsim_ros.core.contact_step` on a batch of B independent
cubes (one floating model, the batch in the leading dim of ``q``/``v``), float64, at
dt = 1 ms, for the complementarity step (Anitescu, the batched cone solver) and the compliant
one, forward only and forward + backward (gradients of the next state w.r.t. the state, the
friction coefficient and the vertices), each on the default path (``backend='auto'``: the
C++ kernels of :mod:`diffsim_ros.core.native_contact`, the whole step without gradients, the
cone solver and its implicit backward with them) and forced onto torch
(``backend='torch'``), in the same run.  MuJoCo: ``mj_step`` in a loop on one scene holding
B cubes (cubes collide only with the ground), same dt, its default Newton solver.  MJX is
not measured: it needs JAX and a matching ``mujoco-mjx`` release, which do not install
beside MuJoCo 4.0 here.  ``--profile`` prints where a complementarity step with backward
spends its time on the default path.  The machine's load (``/proc/loadavg``) before and
after is printed and written with the figures.
"""

import dataclasses
import os
import sys
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch

try:
    from benchmarks import _common
except ImportError:  # run as ``python benchmarks/contact.py``
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks import _common

from diffsim_ros.core import box_vertices, contact_step, ContactModel, load_urdf  # noqa: I100
from diffsim_ros.core import native_contact
from diffsim_ros.robots import object_urdf_path

DT = 1e-3
EDGE = 0.1048
MU = 0.18
BATCHES = (1, 64, 1024)
QUICK_BATCHES = (1, 16)


def cube_batch(batch: int, seed: int = 0):
    """
    Return the cube model, its contact model and a batch of resting, sliding states.

    :param batch: number of cubes B.
    :param seed: seed of the horizontal velocities.
    :return: ``(model, contact, q (B, 7), v (B, 6))``.
    """
    model = load_urdf(object_urdf_path('cube_toss'), floating_base=True)
    contact = ContactModel.create(friction=MU, vertex_links=('cube',),
                                  vertices=(box_vertices((EDGE,) * 3),))
    generator = torch.Generator().manual_seed(seed)
    q = torch.zeros(batch, 7, dtype=torch.float64)
    q[:, 2] = EDGE / 2
    q[:, 6] = 1.0
    v = torch.zeros(batch, 6, dtype=torch.float64)
    v[:, :2] = 2 * torch.rand(batch, 2, generator=generator, dtype=torch.float64) - 1
    return model, contact, q, v


def ours(batch: int, method: str, backward: bool, quick: bool,
         backend: str = 'auto') -> _common.Timing:
    """
    Time one contact step of B cubes.

    :param batch: B.
    :param method: ``'complementarity'`` or ``'compliant'``.
    :param backward: also back-propagate a scalar of the next state.
    :param quick: short timing budget.
    :param backend: ``'auto'`` (the default path) or ``'torch'``.
    :return: the timing of one step.
    """
    model, contact, q, v = cube_batch(batch)
    tau = torch.zeros_like(v)
    if backward:
        q.requires_grad_(True)
        v.requires_grad_(True)
        contact = dataclasses.replace(
            contact, friction=contact.friction.clone().requires_grad_(),
            vertices=(contact.vertices[0].clone().requires_grad_(),))

    def call():
        step = contact_step(model, q, v, tau, DT, contact, method=method, backend=backend)
        if backward:
            (step.q.sum() + step.v.sum()).backward()
    return _common.time_call(call, quick=quick, min_repeats=3)


def mujoco_scene(batch: int, model) -> str:
    """
    Return the MJCF of B cubes on a plane, cubes colliding only with the plane.

    :param batch: B.
    :param model: the cube's floating model, whose mass and inertia every cube gets.
    :return: XML text.
    """
    half = EDGE / 2
    mass = float(model.mass[0])
    inertia = ' '.join(repr(float(i)) for i in torch.diagonal(model.inertia_com[0]))
    side = int(np.ceil(np.sqrt(batch)))
    bodies = []
    for i in range(batch):
        x, y = (i % side) * 0.4, (i // side) * 0.4
        bodies.append(f'<body pos="{x} {y} {half}"><freejoint/><inertial pos="0 0 0" '
                      f'mass="{mass!r}" diaginertia="{inertia}"/><geom type="box" '
                      f'size="{half} {half} {half}" contype="1" conaffinity="2" '
                      f'friction="{MU} 0 0"/></body>')
    return (f'<mujoco><option timestep="{DT}" cone="elliptic"/><worldbody><geom type="plane" '
            f'size="1000 1000 0.1" contype="2" conaffinity="1" friction="{MU} 0 0"/>'
            f'{"".join(bodies)}</worldbody></mujoco>')


def mujoco_step(batch: int, quick: bool) -> _common.Timing:
    """
    Time one ``mj_step`` of the B-cube scene.

    :param batch: B.
    :param quick: short timing budget.
    :return: the timing of one step.
    """
    import mujoco
    model, _, _, v = cube_batch(batch)
    mj_model = mujoco.MjModel.from_xml_string(mujoco_scene(batch, model))
    mj_data = mujoco.MjData(mj_model)
    for i in range(batch):
        mj_data.qvel[6 * i:6 * i + 2] = v[i, :2].numpy()
    mujoco.mj_forward(mj_model, mj_data)
    return _common.time_call(lambda: mujoco.mj_step(mj_model, mj_data), quick=quick,
                             min_repeats=3)


def profile(batch: int) -> str:
    """
    Return the top of a torch profile of one complementarity step with backward (default path).

    :param batch: B.
    :return: a table of the most expensive operators.
    """
    model, contact, q, v = cube_batch(batch)
    q.requires_grad_(True)
    tau = torch.zeros_like(v)
    contact_step(model, q, v, tau, DT, contact).q.sum().backward()  # warm up
    with torch.profiler.profile() as prof:
        step = contact_step(model, q, v, tau, DT, contact)
        step.q.sum().backward()
    return prof.key_averages().table(sort_by='self_cpu_time_total', row_limit=12)


#: Our engines: key -> (method, backward, backend); the plain keys are the default path.
ENGINES = {
    f'{method}{"_backward" if backward else ""}{"" if backend == "auto" else "_torch"}':
        (method, backward, backend)
    for method in ('complementarity', 'compliant') for backward in (False, True)
    for backend in ('torch', 'auto')}


def measure(batches: Sequence[int], quick: bool) -> List[Dict[str, Any]]:
    """
    Measure every engine and batch size.

    :param batches: the batch sizes B.
    :param quick: short timing budget.
    :return: one row per B with steps per second (cube-steps per second = B x that).
    """
    rows = []
    for batch in batches:
        row: Dict[str, Any] = {'batch': batch}
        timings = {key: (lambda spec=spec: ours(batch, *spec[:2], quick, spec[2]))
                   for key, spec in ENGINES.items()}
        timings['mujoco'] = lambda: mujoco_step(batch, quick)
        for name, fn in timings.items():
            timing = fn()
            row[name] = {'step_s': timing.seconds, 'steps_per_s': 1.0 / timing.seconds,
                         'cube_steps_per_s': batch / timing.seconds}
        rows.append(row)
    return rows


def markdown(rows: List[Dict[str, Any]]) -> str:
    """
    Format the rows as markdown tables of cube-steps per second and ratios to MuJoCo.

    :param rows: from :func:`measure`.
    :return: one table forward, one forward + backward (MuJoCo: its forward step).
    """
    out = ['cube-steps per second (B cubes x steps per second), dt = 1 ms; "native" is the '
           "default path (backend='auto'), \"torch\" the path forced onto torch:"]
    for suffix, title in (('', 'forward'), ('_backward', 'forward + backward')):
        columns = [f'complementarity{suffix}_torch', f'complementarity{suffix}',
                   f'compliant{suffix}_torch', f'compliant{suffix}', 'mujoco']
        heads = ['complementarity torch', 'complementarity native', 'compliant torch',
                 'compliant native', 'MuJoCo `mj_step`']
        out += ['', f'{title}:', '',
                '| B | ' + ' | '.join(heads) + ' | native / torch | native / MuJoCo |',
                '|---|' + '---|' * (len(columns) + 2)]
        for row in rows:
            cells = [_common.fmt_number(row[c]['cube_steps_per_s']) for c in columns]
            rate = row[columns[1]]['cube_steps_per_s']
            out.append(f'| {row["batch"]} | ' + ' | '.join(cells)
                       + f' | {rate / row[columns[0]]["cube_steps_per_s"]:.3g}'
                       + f' | {rate / row["mujoco"]["cube_steps_per_s"]:.3g} |')
    return '\n'.join(out)


def load_average() -> str:
    """
    Return the machine's load averages (1, 5, 15 min) from ``/proc/loadavg``.

    :return: e.g. ``'4.20 3.10 2.00'``, or ``'unknown'`` where it cannot be read.
    """
    try:
        with open('/proc/loadavg', encoding='ascii') as f:
            return ' '.join(f.read().split()[:3])
    except OSError:
        return 'unknown'


def main(argv: Optional[Sequence[str]] = None) -> int:
    """
    Run the contact benchmark and print a markdown table.

    :param argv: command-line arguments (``sys.argv[1:]`` when None).
    :return: process exit status.
    """
    parser = _common.make_parser(__doc__.strip().splitlines()[0])
    parser.add_argument('--batches', default=None,
                        help='comma-separated batch sizes (default 1,64,1024; --quick 1,16)')
    parser.add_argument('--profile', action='store_true',
                        help='also print where one complementarity step with backward '
                             'spends its time (at the largest batch)')
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.batches:
        try:
            batches = tuple(int(b) for b in args.batches.split(','))
        except ValueError:
            parser.error(f'--batches: expected integers, got {args.batches!r}')
        if min(batches) < 1:
            parser.error('--batches: batch sizes must be >= 1')
    else:
        batches = QUICK_BATCHES if args.quick else BATCHES
    load_before = load_average()
    kernels = native_contact.extension()[1] or 'available'
    rows = measure(batches, args.quick)
    load_after = load_average()
    payload = {'machine': _common.machine_info(('torch', 'mujoco')), 'quick': args.quick,
               'dt': DT, 'rows': rows, 'native_contact_kernels': kernels,
               'load_before': load_before, 'load_after': load_after}
    print(f'load (1, 5, 15 min) before: {load_before}, after: {load_after}; '
          f'torch threads {torch.get_num_threads()}; contact kernels: {kernels}')
    print(markdown(rows))
    if args.profile:
        print(profile(max(batches)))
    if args.json:
        _common.write_json(args.json, payload)
    return 0


if __name__ == '__main__':
    sys.exit(main())
