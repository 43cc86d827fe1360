"""
Contact time steps per second: B cubes on the ground, ours beside MuJoCo in the same run.

Every cube (0.37 kg, edge 0.1048 m, mu 0.18, the ContactNets cube) starts resting on the
ground with a random horizontal velocity of up to 1 m/s, so every step has sliding and
sticking contacts.  Ours: :func:`diffsim_ros.core.contact_step` on a batch of B independent
cubes (one floating model, the batch in the leading dim of ``q``/``v``), float64, at
dt = 1 ms, for the complementarity step (Anitescu, the batched cone solver) and the compliant
one, forward only and forward + backward (gradients of the next state w.r.t. the state, the
friction coefficient and the vertices).  MuJoCo: ``mj_step`` in a loop on one scene holding
B cubes (cubes collide only with the ground), same dt, its default Newton solver.  MJX is
not measured: it needs JAX and a matching ``mujoco-mjx`` release, which do not install
beside MuJoCo 4.0 here.  ``--profile`` prints where a complementarity step spends its time.
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


def ours(batch: int, method: str, backward: bool, quick: bool) -> _common.Timing:
    """
    Time one contact step of B cubes.

    :param batch: B.
    :param method: ``'complementarity'`` or ``'compliant'``.
    :param backward: also back-propagate a scalar of the next state.
    :param quick: short timing budget.
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
        step = contact_step(model, q, v, tau, DT, contact, method=method)
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
    Return the top of a torch profile of one complementarity step with backward.

    :param batch: B.
    :return: a table of the most expensive operators.
    """
    model, contact, q, v = cube_batch(batch)
    q.requires_grad_(True)
    tau = torch.zeros_like(v)
    with torch.profiler.profile() as prof:
        step = contact_step(model, q, v, tau, DT, contact)
        step.q.sum().backward()
    return prof.key_averages().table(sort_by='self_cpu_time_total', row_limit=12)


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
        for name, fn in (
                ('complementarity', lambda: ours(batch, 'complementarity', False, quick)),
                ('complementarity_backward',
                 lambda: ours(batch, 'complementarity', True, quick)),
                ('compliant', lambda: ours(batch, 'compliant', False, quick)),
                ('compliant_backward', lambda: ours(batch, 'compliant', True, quick)),
                ('mujoco', lambda: mujoco_step(batch, quick))):
            timing = fn()
            row[name] = {'step_s': timing.seconds, 'steps_per_s': 1.0 / timing.seconds,
                         'cube_steps_per_s': batch / timing.seconds}
        rows.append(row)
    return rows


def markdown(rows: List[Dict[str, Any]]) -> str:
    """
    Format the rows as a markdown table of cube-steps per second and ratios to MuJoCo.

    :param rows: from :func:`measure`.
    :return: the table.
    """
    columns = ('complementarity', 'complementarity_backward', 'compliant',
               'compliant_backward', 'mujoco')
    lines = ['| B | ' + ' | '.join(c.replace('_', ' + ') for c in columns)
             + ' | complementarity / MuJoCo |',
             '|---|' + '---|' * (len(columns) + 1)]
    for row in rows:
        cells = [_common.fmt_number(row[c]['cube_steps_per_s']) for c in columns]
        ratio = row['complementarity']['cube_steps_per_s'] / row['mujoco']['cube_steps_per_s']
        lines.append(f'| {row["batch"]} | ' + ' | '.join(cells) + f' | {ratio:.3g} |')
    return '\n'.join(['cube-steps per second (B cubes x steps per second), dt = 1 ms:', '']
                     + lines)


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
    rows = measure(batches, args.quick)
    payload = {'machine': _common.machine_info(('torch', 'mujoco')), 'quick': args.quick,
               'dt': DT, 'rows': rows}
    print(markdown(rows))
    if args.profile:
        print(profile(max(batches)))
    if args.json:
        _common.write_json(args.json, payload)
    return 0


if __name__ == '__main__':
    sys.exit(main())
