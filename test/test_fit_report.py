"""
Tests of ``diffsim-fit``'s figures (:mod:`diffsim_ros.io.report_figure`) and identifiability flags.

The figures are built from a small synthetic fit: a double pendulum driven by known torques
(the catalogue model is the truth), and an "identified" model whose accelerations carry a
constant offset, so that its open-loop rollouts run away from the measured positions.  The
Matplotlib objects are inspected: one torque panel per joint, one rollout panel per joint and
horizon, fit and catalogue curves in each, y-limits that stay with the measured positions and
exits that are marked.
"""

import math

from diffsim_ros import robots
from diffsim_ros.core import load_urdf
from diffsim_ros.io.identifiability import (mark_unidentifiable, NO_BASE_PARAMETER,
                                            unidentifiable)
from diffsim_ros.io.report import evaluate, physical_predictor, Predictor
from diffsim_ros.io.report_figure import (exit_point, LEGEND_ROOM, report_content,
                                          summary_figure, validation_blocks, validation_pages,
                                          write_report, Y_MARGIN)
from diffsim_ros.sysid.dataset import Trajectory
from diffsim_ros.sysid.losses import integrate
from diffsim_ros.sysid.nea import NEAConfig
import numpy as np
import pytest
import torch

F64 = torch.float64
DT = 0.01
#: Acceleration offset of the diverging "fit", rad/s^2: 1 rad off after 0.2 s.
RUNAWAY = 50.0


def _run(model, name: str, seconds: float, phase: float) -> Trajectory:
    t = torch.arange(0.0, seconds, DT, dtype=F64)
    tau = torch.stack((0.6 * torch.sin(2.1 * t + phase), 0.3 * torch.sin(3.3 * t + 2 * phase)),
                      -1)
    nominal = physical_predictor('nominal', model, model.joint_names)
    x = integrate(nominal.accel, torch.zeros(4, dtype=F64), tau[:-1], DT)
    q, qd = x[:, :2], x[:, 2:]
    with torch.no_grad():
        qdd = nominal.accel(q, qd, tau)
    return Trajectory(t=t, q=q, joint_names=model.joint_names, qd=qd, qdd=qdd, tau=tau, run=name)


@pytest.fixture(scope='module')
def synthetic():
    """Return a catalogue model that is the truth, a runaway fit and two validation runs."""
    model = load_urdf(xml=robots.urdf_string('double_pendulum'), dtype=F64)
    base = physical_predictor('nominal', model, model.joint_names)
    heavier = physical_predictor('heavier', model.replace(inertial=1.3 * model.inertial),
                                 model.joint_names)

    def runaway(q, qd, u):
        return base.accel(q, qd, u) + RUNAWAY

    fitted = Predictor(label='identified (test)', model=heavier.model, accel=runaway,
                       torque=heavier.torque, drive=heavier.drive)
    train = [_run(model, 'train', 3.0, 0.0)]
    validation = [_run(model, 'held_a', 3.0, 1.0), _run(model, 'held_b', 2.5, 2.0)]
    with torch.no_grad():
        scores, traces = evaluate(fitted, base, train, validation, 'tau', (0.5, 1.0))
    blocks = validation_blocks((fitted, base), validation, 'tau', traces)
    content = report_content((fitted, base), scores, ['rad', 'rad'])
    return {'model': model, 'scores': scores, 'blocks': blocks, 'content': content,
            'validation': validation, 'fitted': fitted, 'base': base}


def _legend(axis) -> list:
    return [text.get_text() for text in axis.get_legend().get_texts()]


def _colored(axis, color: str) -> list:
    return [line for line in axis.get_lines()
            if line.get_color() == color and len(line.get_xdata()) > 1]


def test_summary_has_torque_and_rollout_panels_per_joint(synthetic):
    figure, axes = summary_figure(synthetic['blocks'], synthetic['content'], 'test',
                                  {}, ['a summary line'])
    assert set(axes) == {'torque', '0.5s', '1s'}
    assert all(len(column) == 2 for column in axes.values())
    scores = synthetic['scores']
    for j, joint in enumerate(('shoulder_joint', 'elbow_joint')):
        legend = _legend(axes['torque'][j])
        fit_nmse = scores['torque']['validation']['nmse'][joint]
        base_nmse = scores['nominal']['torque']['validation']['nmse'][joint]
        assert legend[0] == 'measured'
        assert legend[1] == f'identified (test): NMSE {fit_nmse:.3g}'
        assert legend[2] == f'catalogue: NMSE {base_nmse:.3g}'
        # the catalogue is the truth: its torque lies on the measured one; the heavier fit's
        # does not
        assert base_nmse < 1e-20 < fit_nmse
        # both validation runs are drawn (end to end, with a run separator)
        assert len(_colored(axes['torque'][j], 'tab:red')) == 2
        for key in ('0.5s', '1s'):
            assert len(_colored(axes[key][j], 'tab:blue')) > 4
            assert len(_colored(axes[key][j], 'tab:red')) > 4


def test_rollout_axes_follow_the_measurement_and_mark_where_predictions_leave(synthetic):
    _, axes = summary_figure(synthetic['blocks'], synthetic['content'], 'test', {}, [])
    measured = np.concatenate([run.q.numpy() for run in synthetic['validation']])
    for key in ('0.5s', '1s'):
        for j, axis in enumerate(axes[key]):
            low, high = measured[:, j].min(), measured[:, j].max()
            span = high - low
            bottom, top = axis.get_ylim()
            assert bottom == pytest.approx(low - Y_MARGIN * span)
            assert top == pytest.approx(high + (Y_MARGIN + LEGEND_ROOM) * span)
            # no prediction is drawn beyond the frame
            drawn = np.concatenate([line.get_ydata() for line in _colored(axis, 'tab:red')])
            assert bottom <= drawn.min() and drawn.max() <= top
            if j == 1:
                continue
            # the shoulder of the runaway fit leaves the axes: drawn up to the frame, and its
            # exits are marked and noted
            assert drawn.max() == pytest.approx(top)
            markers = [line for line in axis.get_lines() if line.get_marker() == '^']
            assert markers and all(not line.get_clip_on() for line in markers)
            notes = [text.get_text() for text in axis.texts]
            assert any(note.startswith('identified (test): ') and 'left the axes' in note
                       for note in notes)
            # the catalogue (the truth) stays inside: no note for it
            assert not any(note.startswith('catalogue') for note in '\n'.join(notes).split('\n'))


def test_every_validation_run_has_its_page_and_the_files_are_written(synthetic, tmp_path):
    pages = list(validation_pages(synthetic['blocks'], synthetic['content'], 'test'))
    assert len(pages) == 2
    for figure, axes in pages:
        assert len(axes['torque']) == 2 and len(axes['1s']) == 2
        assert 'RMSE' in _legend(axes['torque'][0])[1]
    parameters = mark_unidentifiable(
        {'upper_link/m': {'value': 1.0, 'unit': 'kg', 'nominal': 1.0}},
        {'upper_link/m': NO_BASE_PARAMETER})
    written = write_report(tmp_path, 'test', synthetic['blocks'], synthetic['content'],
                           parameters, ['line'])
    assert [path.name for path in written] == ['report.png', 'report_validation.pdf']
    assert written[0].read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    assert written[1].read_bytes()[:5] == b'%PDF-'


def test_exit_point_cuts_at_the_limit_and_reports_non_finite_values():
    x = np.arange(5.0)
    inside = np.array([0.0, 0.5, -0.5, 0.2, 0.0])
    assert exit_point(x, inside, -1.0, 1.0)[2] is None
    xs, ys, where = exit_point(x, np.array([0.0, 0.5, 1.5, 9.0, 99.0]), -1.0, 1.0)
    assert where == (1.5, 1.0, 'above')
    assert list(xs) == [0.0, 1.0, 1.5] and list(ys) == [0.0, 0.5, 1.0]
    assert exit_point(x, np.array([0.0, -3.0, 0, 0, 0]), -1.0, 1.0)[2] == (
        pytest.approx(1.0 / 3.0), -1.0, 'below')
    assert exit_point(x, np.array([0.0, 0.2, math.nan, 0, 0]), -1.0, 1.0)[2] == (
        2.0, 0.2, 'non-finite')


def test_parameters_that_enter_no_base_parameter_are_flagged():
    pendulum = load_urdf(xml=robots.urdf_string('double_pendulum'), dtype=F64)
    table = {'upper_link/m': {'value': 1.0}, 'lower_link/m': {'value': 1.0},
             'shoulder_joint/damping': {'value': 0.1},
             'base/0': {'value': 1e-3, 'std': 2e-3}, 'base/1': {'value': -1.0, 'std': 0.1}}
    flags = unidentifiable(table, pendulum, NEAConfig())
    # the upper link's mass sits on the shoulder axis: no torque depends on it; the lower
    # link's mass swings about the shoulder
    assert flags['upper_link/m'] == NO_BASE_PARAMETER
    assert 'lower_link/m' not in flags and 'shoulder_joint/damping' not in flags
    assert flags['base/0'].startswith('std 0.002 larger than its value')
    assert 'base/1' not in flags
    marked = mark_unidentifiable(table, flags)
    assert marked['upper_link/m']['identifiable'] is False
    assert 'identifiable' not in marked['lower_link/m']


def test_the_pandas_first_link_mass_is_flagged_and_its_inertia_about_the_axis_is_not():
    panda = load_urdf(xml=robots.urdf_string('panda'), dtype=F64)
    names = ('panda_link1/m', 'panda_link1/mx', 'panda_link1/izz', 'panda_link3/m')
    flags = unidentifiable({name: {'value': 1.0} for name in names}, panda, object())
    assert set(flags) == {'panda_link1/m', 'panda_link1/mx'}


def test_a_diverged_fit_is_named_so_in_titles_and_legends(synthetic):
    scores = dict(synthetic['scores'])
    scores['rollout'] = {**scores['rollout'], '1s': {
        'nmse': None, 'diverged': True,
        'q_rmse': {'shoulder_joint': None, 'elbow_joint': None}}}
    content = report_content((synthetic['fitted'], synthetic['base']), scores, ['rad', 'rad'])
    _, axes = summary_figure(synthetic['blocks'], content, 'test', {}, [])
    assert 'identified (test) diverged, catalogue' in axes['1s'][0].get_title()
    assert 'identified (test): RMSE at 1s non-finite (diverged)' in _legend(axes['1s'][0])
    assert 'diverged' not in axes['0.5s'][0].get_title()
