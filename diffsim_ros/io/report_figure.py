"""
The figures of ``diffsim-fit``: ``report.png`` (one glance) and ``report_validation.pdf``.

``report.png`` has one row per joint and, left to right,

* the joint torque: measured (black) against the torque of the identified model (red) and of
  the catalogue model (blue, dashed), each curve's NMSE over all validation data in the
  legend (the ``torque`` metric of ``metrics.json``);
* one column per rollout horizon: the measured position against open-loop rollouts restarted
  from the measured state at every window start (windows of that horizon, back to back);
* the key metrics with the catalogue model's beside the fit's, and the parameter table
  (catalogue value beside the identified one; rows the data cannot determine are greyed and
  marked ``*``, see :mod:`diffsim_ros.io.identifiability`).

It shows every validation run (block) side by side, separated by gaps, when together they last
at most :data:`SUMMARY_SECONDS`; otherwise the longest one.  ``report_validation.pdf`` has the
same torque and rollout panels for every validation run, one page per run (long runs split
into pages of :data:`PAGE_SECONDS`), with each curve's RMSE on that page in the legend.

Torque: the measured torque is the nominal model's actuator torque (:attr:`Predictor.drive`):
the recorded effort for torque inputs, the command through the catalogued DC motor model for
voltage-commanded robots.  Each model's curve is that torque minus the model's
inverse-dynamics residual (``tau_applied - rnea``, :func:`~diffsim_ros.io.report.torque_metrics`),
i.e. rigid-body plus friction torque (plus, for a fit that identified the motor, the
difference of its motor model to the catalogue's), so the gap between a curve and the
measured one is exactly the error the metric averages.

Rollout y-limits come from the measured positions on the panel with a margin of
:data:`Y_MARGIN` of their range, never from the predictions: a prediction that leaves them is
drawn up to the frame and ends in a marker (triangle up / down; a cross where it became
non-finite), and the panel notes how many windows left the axes and when the first did.

Drawn with Matplotlib's object API on an Agg canvas (no display, global ``pyplot`` state
untouched).
"""

from dataclasses import dataclass
import math
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.backends.backend_pdf import PdfPages
from matplotlib.figure import Figure
import numpy as np
import torch

from .report import Predictor
from ..core.dispatch import rnea
from ..sysid.dataset import Trajectory
from ..sysid.losses import stack_samples

__all__ = ['Block', 'exit_point', 'PAGE_SECONDS', 'report_content', 'ReportContent',
           'summary_figure', 'SUMMARY_SECONDS', 'validation_blocks', 'validation_pages',
           'write_report']

PathLike = Union[str, Path]
#: Validation data up to this length (all runs together) are drawn whole in report.png, s.
SUMMARY_SECONDS = 30.0
#: Longest stretch of a run on one page of report_validation.pdf, s.
PAGE_SECONDS = 20.0
#: Margin around the measured range of a rollout panel, as a fraction of that range.
Y_MARGIN = 0.25
#: Extra room above the curves for the legend, as a fraction of their range.
LEGEND_ROOM = 0.35
#: Rows of the parameter table in the figure before it is cut (the rest is in params.yaml).
TABLE_ROWS = 30
MEASURED_STYLE = {'color': 'black', 'linewidth': 1.3}
#: Styles of the identified (first) and nominal (second) model.
MODEL_STYLES = ({'color': 'tab:red', 'linewidth': 1.0},
                {'color': 'tab:blue', 'linewidth': 1.0, 'linestyle': '--'})

Window = Tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True)
class Block:
    """
    One validation run as drawn.

    :param name: run name.
    :param t: ``(T,)`` s.
    :param q: ``(T, n)`` measured positions.
    :param torque: ``(T, n)`` measured torque (module docstring), ``None`` without
        accelerations or a physical nominal model.
    :param predicted_torque: ``{label: (T, n)}`` per physical model.
    :param windows: ``{label: {'<h>s': [(t (k + 1,), q (k + 1, n)), ...]}}``: back-to-back
        rollout windows of each horizon, cut at the end of the run.
    """

    name: str
    t: np.ndarray
    q: np.ndarray
    torque: Optional[np.ndarray]
    predicted_torque: Mapping[str, np.ndarray]
    windows: Mapping[str, Mapping[str, List[Window]]]


@dataclass(frozen=True)
class ReportContent:
    """
    What the figures show besides the blocks: names, units and the metrics of all blocks.

    :param joints: joint names, model order.
    :param position_units: per joint (``'rad'``, ``'m'``).
    :param torque_units: per joint (``'N m'``, ``'N'``).
    :param labels: ``(identified label, nominal label)``: keys of the predictions.
    :param names: the same as shown in legends (the nominal model is "catalogue").
    :param horizons: rollout keys (``'0.5s'``, ...).
    :param measured_label: legend name of the measured torque.
    :param data_label: which data the blocks are (``'validation'``, or ``'training'``).
    :param torque_nmse: ``{label: {joint: NMSE}}`` over all blocks.
    :param rollout_nmse: ``{label: {'<h>s': NMSE}}`` over all blocks (``inf``: diverged).
    :param rollout_rmse: ``{label: {'<h>s': {joint: RMSE at the horizon}}}``.
    """

    joints: Tuple[str, ...]
    position_units: Tuple[str, ...]
    torque_units: Tuple[str, ...]
    labels: Tuple[str, str]
    names: Tuple[str, str]
    horizons: Tuple[str, ...]
    measured_label: str
    data_label: str
    torque_nmse: Mapping[str, Mapping[str, Optional[float]]]
    rollout_nmse: Mapping[str, Mapping[str, Optional[float]]]
    rollout_rmse: Mapping[str, Mapping[str, Mapping[str, Optional[float]]]]


# --------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------
def _numpy(value: torch.Tensor) -> np.ndarray:
    return value.detach().cpu().double().numpy()


def _torques(models: Sequence[Predictor], run: Trajectory,
             source: str) -> Tuple[Optional[np.ndarray], Dict[str, np.ndarray]]:
    """Return the measured torque of a run and each physical model's (module docstring)."""
    reference = models[-1]
    if reference.drive is None or run.qdd is None:
        return None, {}
    with torch.no_grad():
        batch = stack_samples([run], reference.model, source, need_qdd=True)
        measured = reference.drive(batch.q, batch.qd, batch.u)
        predicted = {}
        for model in models:
            if model.torque is None:
                continue
            residual = model.torque(batch.q, batch.qd, batch.u) - rnea(
                model.model, batch.q, batch.qd, batch.qdd)
            predicted[model.label] = _numpy(measured - residual)
    return _numpy(measured), predicted


def _back_to_back(traces: Mapping[str, Any], index: int, length: int) -> Dict[str, List[Window]]:
    """Return the windows of run ``index`` that tile it without overlap, per horizon."""
    mine = np.flatnonzero(traces['run'] == index)
    out: Dict[str, List[Window]] = {}
    for key, steps in traces['steps'].items():
        chosen, next_start = [], 0
        for position, w in enumerate(mine):
            start = position * traces['stride']
            if start < next_start:
                continue
            points = min(steps + 1, length - start)
            chosen.append((traces['t'][w, :points], traces['q'][w, :points]))
            next_start = start + steps
        out[key] = chosen
    return out


def validation_blocks(models: Sequence[Predictor], runs: Sequence[Trajectory], source: str,
                      traces: Mapping[str, Mapping[str, Any]]) -> List[Block]:
    """
    Return the drawn content of each run.

    :param models: ``(identified, nominal)`` predictors; the last one's ``drive`` gives the
        measured torque.
    :param runs: the runs :func:`~diffsim_ros.io.report.rollout_study` simulated, in its order.
    :param source: input signal, ``'tau'`` or ``'u'``.
    :param traces: ``{label: traces}`` from :func:`~diffsim_ros.io.report.evaluate`.
    :return: one block per run of at least two samples.
    """
    joints = models[-1].model.joint_names
    blocks = []
    for index, run in enumerate(runs):
        if len(run) < 2:
            continue
        run = run.reorder(joints) if tuple(run.joint_names) != tuple(joints) else run
        torque, predicted = _torques(models, run, source)
        windows = {label: _back_to_back(trace, index, len(run))
                   for label, trace in traces.items() if trace is not None}
        blocks.append(Block(name=run.run, t=_numpy(run.t), q=_numpy(run.q), torque=torque,
                            predicted_torque=predicted, windows=windows))
    return blocks


def report_content(models: Sequence[Predictor], scores: Mapping[str, Any],
                   position_units: Sequence[str], measured_label: str = 'measured',
                   data_label: str = 'validation') -> ReportContent:
    """
    Collect names, units and the metrics of :func:`~diffsim_ros.io.report.evaluate`.

    :param models: ``(identified, nominal)`` predictors.
    :param scores: ``evaluate``'s metrics (``'nominal'`` holds the nominal model's).
    :param position_units: per joint.
    :param measured_label: legend name of the measured torque.
    :param data_label: ``'validation'`` or ``'training'`` (runs without validation data).
    :return: the content.
    """
    split = 'validation' if data_label == 'validation' else 'train'
    labels = (models[0].label, models[-1].label)
    torque, nmse, rmse = {}, {}, {}
    for label, section in zip(labels, (scores, scores.get('nominal', {}))):
        torque[label] = ((section.get('torque') or {}).get(split) or {}).get('nmse') or {}
        rollout = section.get('rollout') or {}
        nmse[label] = {key: math.inf if entry.get('diverged') else entry.get('nmse')
                       for key, entry in rollout.items()}
        rmse[label] = {key: entry.get('q_rmse') or {} for key, entry in rollout.items()}
    position_units = tuple(position_units)
    return ReportContent(
        joints=tuple(models[-1].model.joint_names), position_units=position_units,
        torque_units=tuple('N' if unit == 'm' else 'N m' for unit in position_units),
        labels=labels, names=(labels[0], 'catalogue'), horizons=tuple(scores.get('rollout') or ()),
        measured_label=measured_label, data_label=data_label, torque_nmse=torque,
        rollout_nmse=nmse, rollout_rmse=rmse)


# --------------------------------------------------------------------------------------
# Panels
# --------------------------------------------------------------------------------------
def exit_point(x: np.ndarray, values: np.ndarray, low: float,
               high: float) -> Tuple[np.ndarray, np.ndarray, Optional[Tuple[float, float, str]]]:
    """
    Cut a curve where it first leaves ``[low, high]`` or becomes non-finite.

    :param x: ``(K,)`` abscissae.
    :param values: ``(K,)`` ordinates.
    :param low: lower axis limit.
    :param high: upper axis limit.
    :return: ``(x, values, exit)``: the curve up to the exit, ending on the limit it crossed
        (linearly interpolated), and ``(x, y, kind)`` of the exit with ``kind`` ``'above'``,
        ``'below'`` or ``'non-finite'``; ``exit`` is ``None`` for a curve that stays inside.
    """
    outside = ~np.isfinite(values) | (values < low) | (values > high)
    if not outside.any():
        return x, values, None
    e = int(np.argmax(outside))
    previous = values[e - 1] if e > 0 else 0.5 * (low + high)
    if np.isfinite(values[e]):
        kind = 'above' if values[e] > high else 'below'
        bound = high if kind == 'above' else low
        fraction = (bound - previous) / (values[e] - previous) if e > 0 else 0.0
        x_exit = x[e - 1] + fraction * (x[e] - x[e - 1]) if e > 0 else x[0]
    else:
        kind = 'non-finite'
        bound, x_exit = previous, x[e]
    return (np.append(x[:e], x_exit), np.append(values[:e], bound),
            (float(x_exit), float(bound), kind))


_EXIT_MARKERS = {'above': '^', 'below': 'v', 'non-finite': 'X'}


def _y_limits(values: Sequence[np.ndarray]) -> Tuple[float, float]:
    low = min(float(np.nanmin(v)) for v in values)
    high = max(float(np.nanmax(v)) for v in values)
    span = max(high - low, 1e-3)
    return low - Y_MARGIN * span, high + (Y_MARGIN + LEGEND_ROOM) * span


def _fmt(value: Optional[float]) -> str:
    return f'{value:.3g}' if isinstance(value, float) and math.isfinite(value) else '-'


def _nmse(value: Optional[float]) -> str:
    return 'diverged' if value == math.inf else _fmt(value)


def _rmse(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.nanmean(np.square(a - b))))


Part = Tuple[Block, float, float, float]   # block, shift (added to its t), start, end


def _torque_panel(axis: Axes, parts: Sequence[Part], j: int, content: ReportContent,
                  per_page: bool) -> None:
    shown = [(block, shift, (block.t >= start) & (block.t <= end))
             for block, shift, start, end in parts if block.torque is not None]
    if not shown:
        axis.text(0.5, 0.5, 'no torque: the data have no accelerations or the models no '
                  'torque', ha='center', va='center', fontsize=8, transform=axis.transAxes)
        return
    for k, (block, shift, rows) in enumerate(shown):
        axis.plot(block.t[rows] + shift, block.torque[rows, j], **MEASURED_STYLE,
                  label=content.measured_label if k == 0 else None)
    joint = content.joints[j]
    for label, name, style in zip(content.labels, content.names, MODEL_STYLES):
        pairs = [(block, shift, rows) for block, shift, rows in shown
                 if label in block.predicted_torque]
        if not pairs:
            axis.plot([], [], **style, label=f'{name}: black box, no torque')
            continue
        if per_page:
            measured = np.concatenate([b.torque[rows, j] for b, _, rows in pairs])
            predicted = np.concatenate([b.predicted_torque[label][rows, j]
                                        for b, _, rows in pairs])
            metric = f'RMSE {_fmt(_rmse(predicted, measured))} {content.torque_units[j]}'
        else:
            metric = f'NMSE {_fmt(content.torque_nmse.get(label, {}).get(joint))}'
        for k, (block, shift, rows) in enumerate(pairs):
            axis.plot(block.t[rows] + shift, block.predicted_torque[label][rows, j], **style,
                      label=f'{name}: {metric}' if k == 0 else None)
    curves = [block.torque[rows, j] for block, _, rows in shown] + [
        block.predicted_torque[label][rows, j] for block, _, rows in shown
        for label in block.predicted_torque]
    axis.set_ylim(*_y_limits([c[np.isfinite(c)] for c in curves if np.isfinite(c).any()]))
    axis.legend(loc='upper right', fontsize=7, framealpha=0.75)


def _rollout_panel(axis: Axes, parts: Sequence[Part], j: int, key: str,
                   content: ReportContent, per_page: bool) -> None:
    measured = [(block, shift, (block.t >= start) & (block.t <= end))
                for block, shift, start, end in parts]
    low, high = _y_limits([block.q[rows, j] for block, _, rows in measured])
    for k, (block, shift, rows) in enumerate(measured):
        axis.plot(block.t[rows] + shift, block.q[rows, j], **MEASURED_STYLE,
                  label='measured' if k == 0 else None)
    notes = []
    joint, unit = content.joints[j], content.position_units[j]
    for label, name, style in zip(content.labels, content.names, MODEL_STYLES):
        exits, count, errors = [], 0, []
        for block, shift, start, end in parts:
            for t, q in block.windows.get(label, {}).get(key, ()):
                if t[0] < start or t[0] > end:
                    continue
                count += 1
                x, y, exit_ = exit_point(t + shift, q[:, j], low, high)
                axis.plot(x, y, **style)
                if exit_ is not None:
                    exits.append(exit_)
                    axis.plot(exit_[0], exit_[1], marker=_EXIT_MARKERS[exit_[2]],
                              color=style['color'], markersize=7, clip_on=False,
                              linestyle='none')
                if per_page:
                    first = int(np.argmin(np.abs(block.t - t[0])))
                    rows = np.arange(first, min(first + len(t), len(block.t)))
                    errors.append(np.square(q[:len(rows), j] - block.q[rows, j]))
        if per_page:
            value = float(np.sqrt(np.mean(np.concatenate(errors)))) if errors else math.nan
            metric = f'RMSE {_fmt(value)} {unit}' if math.isfinite(value) or not errors else \
                'RMSE non-finite (diverged)'
        else:
            per_joint = content.rollout_rmse.get(label, {}).get(key) or {}
            value = per_joint.get(joint)
            metric = f'RMSE at {key} ' + (
                f'{_fmt(value)} {unit}' if value is not None else
                'non-finite (diverged)' if per_joint else '- (no run this long)')
        axis.plot([], [], **style, label=f'{name}: {metric}')
        if exits:
            first = min(where[0] for where in exits)
            notes.append(f'{name}: {len(exits)} of {count} windows left the axes '
                         f'(first at t={first:.3g} s)')
    axis.set_ylim(low, high)
    axis.legend(loc='upper right', fontsize=7, framealpha=0.75)
    if notes:
        axis.text(0.01, 0.02, '\n'.join(notes), fontsize=7, va='bottom', ha='left',
                  transform=axis.transAxes, color='darkred',
                  bbox={'facecolor': 'white', 'alpha': 0.75, 'edgecolor': 'none'})


def _panels(figure: Figure, grid: Any, parts: Sequence[Part], content: ReportContent,
            per_page: bool) -> Dict[str, List[Axes]]:
    """Draw the torque column and one rollout column per horizon; return the axes."""
    n = len(content.joints)
    axes: Dict[str, List[Axes]] = {'torque': []}
    axes.update({key: [] for key in content.horizons})
    fit, base = content.labels
    fit_name, base_name = content.names
    for c, column in enumerate(('torque',) + content.horizons):
        for j in range(n):
            axis = figure.add_subplot(grid[j, c])
            if column == 'torque':
                _torque_panel(axis, parts, j, content, per_page)
                axis.set_ylabel(f'{content.joints[j]}\ntorque [{content.torque_units[j]}]',
                                fontsize=8)
            else:
                _rollout_panel(axis, parts, j, column, content, per_page)
                axis.set_ylabel(f'position [{content.position_units[j]}]', fontsize=8)
            axis.tick_params(labelsize=7)
            axis.grid(True, alpha=0.3)
            for _, shift, start, end in parts[1:]:
                axis.axvline(start + shift, color='0.6', linewidth=0.8, linestyle=':')
            if j == 0:
                if column == 'torque':
                    head = 'joint torque (inverse dynamics on measured states)\n' + (
                        'legend: RMSE on this page' if per_page else
                        f'legend: NMSE over all {content.data_label} runs')
                else:
                    nmse = content.rollout_nmse
                    head = f'open-loop rollouts from measured states, {column} windows\n' + (
                        'legend: RMSE on this page' if per_page else
                        f'NMSE all runs: {fit_name} {_nmse(nmse[fit].get(column))}, '
                        f'{base_name} {_nmse(nmse[base].get(column))}')
                axis.set_title(head, fontsize=8.5)
            if j == n - 1:
                axis.set_xlabel('time [s]' if len(parts) == 1 else
                                f'time [s], {len(parts)} runs end to end (dotted: run starts)',
                                fontsize=8)
            axes[column].append(axis)
    return axes


def _summary_parts(blocks: Sequence[Block]) -> Tuple[List[Part], str]:
    total = sum(float(b.t[-1] - b.t[0]) for b in blocks)
    if total <= SUMMARY_SECONDS:
        parts, offset = [], 0.0
        gap = 0.02 * total
        for block in blocks:
            parts.append((block, offset - float(block.t[0]), float(block.t[0]),
                          float(block.t[-1])))
            offset += float(block.t[-1] - block.t[0]) + gap
        names = ', '.join(b.name for b in blocks) if len(blocks) <= 4 else f'{len(blocks)} runs'
        return parts, names
    longest = max(blocks, key=lambda b: float(b.t[-1] - b.t[0]))
    return ([(longest, 0.0, float(longest.t[0]), float(longest.t[-1]))],
            f'{longest.name} (longest of {len(blocks)}; all in report_validation.pdf)')


# --------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------
def _table_order(names: Sequence[str]) -> List[str]:
    """Joint-level parameters first, then masses, then base parameters, then the rest."""
    inertial = ('/m', '/mx', '/my', '/mz', '/ixx', '/ixy', '/ixz', '/iyy', '/iyz', '/izz')

    def rank(name: str) -> int:
        if name.startswith('base/'):
            return 2
        if name.endswith('/m'):
            return 1
        if name.endswith(inertial):
            return 3
        return 0
    return sorted(names, key=lambda name: (rank(name), names.index(name)))


def _value(value: Any) -> str:
    if value is None:
        return '-'
    if isinstance(value, float):
        return f'{value:.4g}' if math.isfinite(value) else str(value)
    return str(value)


def _table_rows(parameters: Mapping[str, Mapping[str, Any]],
                limit: int = TABLE_ROWS) -> Tuple[List[List[str]], List[bool], int]:
    names = _table_order(list(parameters))
    rows, flagged = [], []
    for name in names[:limit]:
        entry = parameters[name]
        identified = _value(entry.get('value'))
        if entry.get('std') is not None:
            identified += f' ± {entry["std"]:.2g}'
        unknown = entry.get('identifiable') is False
        rows.append([name + (' *' if unknown else ''), _value(entry.get('nominal')), identified,
                     entry.get('unit', '')])
        flagged.append(unknown)
    return rows, flagged, max(0, len(names) - limit)


def _side(figure: Figure, grid: Any, parameters: Mapping[str, Mapping[str, Any]],
          summary: Sequence[str], note: str) -> None:
    side = figure.add_subplot(grid)
    side.axis('off')
    side.text(0.0, 1.0, '\n'.join(summary), va='top', ha='left', fontsize=8,
              family='monospace', transform=side.transAxes)
    top = 1.0 - 0.03 * (len(summary) + 1)
    if not parameters:
        side.text(0.0, top, note or 'no physical parameters', va='top', fontsize=9, wrap=True,
                  transform=side.transAxes)
        return
    rows, flagged, hidden = _table_rows(parameters)
    height = min(top - 0.08, 0.024 * (len(rows) + 1))
    table = side.table(cellText=rows, colLabels=['parameter', 'catalogue', 'identified',
                                                 'unit'],
                       colWidths=[0.38, 0.15, 0.34, 0.13], cellLoc='left',
                       bbox=[0.0, top - height, 1.0, height])
    table.auto_set_font_size(False)
    table.set_fontsize(7)
    for r, unknown in enumerate(flagged, start=1):
        if unknown:
            for c in range(4):
                table[r, c].get_text().set_color('0.5')
    unknown = sum(entry.get('identifiable') is False for entry in parameters.values())
    lines = [f'* not identifiable from these data ({unknown} of {len(parameters)} '
             'parameters; reasons in metrics.json "unidentifiable")'] if unknown else []
    if hidden:
        lines.append(f'... {hidden} more parameter(s) in params.yaml')
    side.text(0.0, top - height - 0.01, '\n'.join(lines), va='top', fontsize=7, wrap=True,
              transform=side.transAxes)


def _figure(n: int, columns: int, side: bool) -> Tuple[Figure, Any]:
    width = 4.6 * columns + (6.0 if side else 0.0)
    height = max(7.5 if side else 4.5, 2.2 * n + 1.6)
    figure = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(figure)
    ratios = (1.0,) * columns + ((1.3,) if side else ())
    # fixed room in inches for the two-line title, the column titles and the time axis
    grid = figure.add_gridspec(n, columns + int(side), width_ratios=ratios, left=0.75 / width,
                               right=0.99, top=1.0 - 1.3 / height, bottom=0.55 / height,
                               hspace=0.45, wspace=0.22)
    return figure, grid


def summary_figure(blocks: Sequence[Block], content: ReportContent, title: str,
                   parameters: Mapping[str, Mapping[str, Any]], summary: Sequence[str],
                   note: str = '') -> Tuple[Figure, Dict[str, List[Axes]]]:
    """
    Draw ``report.png`` (module docstring).

    :param blocks: :func:`validation_blocks`.
    :param content: :func:`report_content`.
    :param title: figure title.
    :param parameters: ``{name: {'value', 'unit', 'nominal'[, 'std'][, 'identifiable']}}``.
    :param summary: lines of key metrics printed above the table.
    :param note: text shown instead of the table when there are no parameters.
    :return: ``(figure, {'torque': [axes per joint], '<h>s': [axes per joint], ...})``.
    """
    n = len(content.joints)
    columns = 1 + len(content.horizons)
    figure, grid = _figure(n, columns, side=True)
    axes: Dict[str, List[Axes]] = {}
    names = 'no runs to draw'
    if blocks:
        parts, names = _summary_parts(blocks)
        axes = _panels(figure, grid, parts, content, per_page=False)
    figure.suptitle(f'{title}\n{content.data_label} data drawn: {names}', fontsize=11)
    _side(figure, grid[:, columns], parameters, summary, note)
    return figure, axes


def validation_pages(blocks: Sequence[Block], content: ReportContent,
                     title: str) -> Iterator[Tuple[Figure, Dict[str, List[Axes]]]]:
    """
    Draw every block, one page per :data:`PAGE_SECONDS` of each (``report_validation.pdf``).

    :param blocks: :func:`validation_blocks`.
    :param content: :func:`report_content`.
    :param title: title prefix.
    :return: an iterator of ``(figure, axes)`` as :func:`summary_figure`'s.
    """
    n = len(content.joints)
    columns = 1 + len(content.horizons)
    for index, block in enumerate(blocks):
        start, end = float(block.t[0]), float(block.t[-1])
        pages = max(1, math.ceil((end - start) / PAGE_SECONDS - 1e-9))
        for page in range(pages):
            low = start + page * PAGE_SECONDS
            high = min(end, low + PAGE_SECONDS)
            figure, grid = _figure(n, columns, side=False)
            part = f', part {page + 1} of {pages}' if pages > 1 else ''
            figure.suptitle(f'{title}\n{content.data_label} run {index + 1} of {len(blocks)}: '
                            f'{block.name}{part}', fontsize=11)
            axes = _panels(figure, grid, [(block, 0.0, low, high)], content, per_page=True)
            yield figure, axes


def write_report(folder: PathLike, title: str, blocks: Sequence[Block],
                 content: ReportContent, parameters: Mapping[str, Mapping[str, Any]],
                 summary: Sequence[str], note: str = '') -> List[Path]:
    """
    Write ``report.png`` and, when there are blocks, ``report_validation.pdf``.

    :param folder: output folder.
    :param title: figure title.
    :param blocks: :func:`validation_blocks`.
    :param content: :func:`report_content`.
    :param parameters: the parameter table (with the identifiability flags).
    :param summary: key-metric lines.
    :param note: text instead of the table when there are no parameters.
    :return: the written paths.
    """
    folder = Path(folder)
    figure, _ = summary_figure(blocks, content, title, parameters, summary, note)
    written = [folder / 'report.png']
    figure.savefig(written[0])
    if blocks:
        written.append(folder / 'report_validation.pdf')
        with PdfPages(written[-1]) as pdf:
            for page, _ in validation_pages(blocks, content, title):
                pdf.savefig(page)
    return written
