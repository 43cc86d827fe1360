"""
Shared helpers for the scripts in ``benchmarks/``: timing, tables, CLI, JSON, machine info.

Every benchmark script takes ``--quick`` (finishes in under a minute) and ``--json PATH``
(writes its figures); :func:`make_parser` adds both, plus ``--threads``.
"""

import argparse
from dataclasses import asdict, dataclass
import importlib.metadata
import json
import os
from pathlib import Path
import platform
import statistics
import sys
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

#: Seconds one measurement aims to spend in its timed repeats (full run, ``--quick`` run).
BUDGET_S = 0.6
QUICK_BUDGET_S = 0.08
#: Seconds above which a measurement takes fewer than ``min_repeats`` repeats (at least one).
CAP_S = 20.0
QUICK_CAP_S = 0.5
#: A timed repeat is at least this long; faster calls are looped inside one repeat.
MIN_REPEAT_S = 2e-3


@dataclass(frozen=True)
class Timing:
    """
    Wall time of one call, from ``repeats`` timed repeats of ``inner`` calls each.

    ``seconds`` is the median over repeats (the reported figure); ``min_seconds`` the
    fastest repeat, a check on how much other work on the machine disturbed the run.
    """

    seconds: float
    min_seconds: float
    repeats: int
    inner: int

    def to_dict(self) -> Dict[str, Any]:
        """
        Return the timing as a JSON-ready dict.

        :return: ``seconds``, ``min_seconds``, ``repeats`` and ``inner`` keys.
        """
        return asdict(self)


def time_call(fn: Callable[[], Any], quick: bool = False, min_repeats: int = 3,
              max_repeats: int = 100, warmup: int = 1,
              budget_s: Optional[float] = None) -> Timing:
    """
    Time ``fn()`` with :func:`time.perf_counter`: warm-up, then the median of repeats.

    One untimed warm-up estimates the cost; calls shorter than :data:`MIN_REPEAT_S` are
    looped ``inner`` times inside each timed repeat so that timer resolution and the loop
    do not dominate; the number of repeats fills ``budget_s`` within
    ``[min_repeats, max_repeats]``, but calls so slow that ``min_repeats`` would take more
    than :data:`CAP_S` (:data:`QUICK_CAP_S` with ``quick``) get fewer, at least one.

    :param fn: the call to time, with no arguments; its result is discarded.
    :param quick: use the short ``--quick`` budget.
    :param min_repeats: fewest timed repeats, whatever the budget.
    :param max_repeats: most timed repeats.
    :param warmup: untimed calls before timing (at least one is always made).
    :param budget_s: seconds to spend in timed repeats; default from ``quick``.
    :return: the median seconds per call and how it was measured.
    """
    budget = budget_s if budget_s is not None else (QUICK_BUDGET_S if quick else BUDGET_S)
    estimate = float('inf')
    for _ in range(max(1, warmup)):
        start = time.perf_counter()
        fn()
        estimate = min(estimate, time.perf_counter() - start)
    inner = max(1, int(MIN_REPEAT_S / max(estimate, 1e-9)))
    cost = max(estimate * inner, 1e-9)
    repeats = min(max_repeats, max(min_repeats, int(budget / cost)))
    # ``min_repeats`` must not blow the time limits on very slow calls
    repeats = max(1, min(repeats, int((QUICK_CAP_S if quick else CAP_S) / cost)))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - start) / inner)
    return Timing(statistics.median(samples), min(samples), repeats, inner)


def cpu_model() -> str:
    """
    Return the CPU model name from ``/proc/cpuinfo``, or :func:`platform.processor`.

    :return: a human-readable CPU name.
    """
    try:
        with open('/proc/cpuinfo', encoding='utf-8') as cpuinfo:
            for line in cpuinfo:
                if line.lower().startswith('model name'):
                    return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def package_version(name: str) -> Optional[str]:
    """
    Return the installed version of a distribution, or ``None`` when absent.

    :param name: distribution name as pip knows it (``'torch'``, ``'pin'``).
    :return: version string or ``None``.
    """
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_info(packages: Iterable[str] = ()) -> Dict[str, Any]:
    """
    Describe the machine a benchmark ran on.

    :param packages: distributions whose versions to record.
    :return: CPU model, logical cores, cores usable by this process, load average (other
        work on the machine skews timings), Python, OS and versions.
    """
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {
        'cpu_model': cpu_model(),
        'logical_cores': os.cpu_count(),
        'usable_cores': usable,
        'load_average_1_5_15_min': list(os.getloadavg()) if hasattr(os, 'getloadavg') else None,
        'python': platform.python_version(),
        'platform': platform.platform(),
        'versions': {name: package_version(name) for name in packages},
    }


#: The recorded data, when neither ``--data`` nor ``$DIFFSIM_DATA`` says otherwise: the
#: ``shared/data`` folder next to the repository, as for the tests (``test/conftest.py``).
DEFAULT_DATA = Path(__file__).resolve().parents[2] / 'shared' / 'data'


def data_root(given: Optional[str], script: str) -> Path:
    """
    Return the recorded-data root, or exit with a message when it is absent.

    :param given: ``--data`` value or ``None`` (then ``$DIFFSIM_DATA`` or :data:`DEFAULT_DATA`).
    :param script: the benchmark's file name, for the message.
    :return: the folder holding the dataset folders.
    """
    root = Path(given or os.environ.get('DIFFSIM_DATA') or DEFAULT_DATA)
    if not root.is_dir():
        sys.exit(f'{script}: real-robot data not found at {root} (set $DIFFSIM_DATA or pass '
                 '--data DIR; see the shared data INDEX.md)')
    return root


def make_parser(description: str, threads: int = 2) -> argparse.ArgumentParser:
    """
    Return an argument parser with the options every benchmark script shares.

    :param description: the script's one-line description for ``--help``.
    :param threads: default of ``--threads``.
    :return: parser with ``--quick``, ``--json PATH`` and ``--threads N``.
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument('--quick', action='store_true',
                        help='fewer sizes and repeats; finishes in under a minute')
    parser.add_argument('--json', metavar='PATH', default=None,
                        help='write every figure and the machine description to PATH')
    parser.add_argument('--threads', type=int, default=threads,
                        help=f'intra-op threads for torch and native parallel calls '
                        f'(default {threads})')
    return parser


def write_json(path: str, payload: Dict[str, Any]) -> None:
    """
    Write ``payload`` as indented JSON, creating the parent directory if needed.

    :param path: output file.
    :param payload: JSON-serialisable figures.
    """
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    with open(path, 'w', encoding='utf-8') as out:
        json.dump(payload, out, indent=2, sort_keys=False)
        out.write('\n')


def fmt_number(value: Optional[float], digits: int = 3) -> str:
    """
    Format a positive figure with ``digits`` significant digits, or ``-`` when missing.

    :param value: the figure (microseconds, a ratio) or ``None``.
    :param digits: significant digits.
    :return: short text for a table cell.
    """
    if value is None:
        return '-'
    if value >= 10 ** digits:
        return f'{value:.0f}'
    return f'{value:.{digits}g}'


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """
    Lay out a right-aligned plain-text table.

    :param headers: column titles.
    :param rows: cells as text, one sequence per row, as long as ``headers``.
    :return: the table, lines joined by newlines.
    """
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row)]
    lines = ['  '.join(h.rjust(w) for h, w in zip(headers, widths)),
             '  '.join('-' * w for w in widths)]
    lines += ['  '.join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows]
    return '\n'.join(lines)


def format_markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """
    Lay out a GitHub-flavoured markdown table (for pasting into a README).

    :param headers: column titles.
    :param rows: cells as text, one sequence per row.
    :return: the table, lines joined by newlines.
    """
    lines = ['| ' + ' | '.join(headers) + ' |',
             '|' + '|'.join('---:' for _ in headers) + '|']
    lines += ['| ' + ' | '.join(row) + ' |' for row in rows]
    return '\n'.join(lines)


@dataclass(frozen=True)
class Target:
    """One pass/miss line: ``value`` compared with ``limit``."""

    name: str
    value: Optional[float]
    limit: float
    unit: str
    at_most: bool = True

    @property
    def passed(self) -> bool:
        """Whether the figure was measured and meets the limit."""
        if self.value is None:
            return False
        return self.value <= self.limit if self.at_most else self.value >= self.limit

    def line(self) -> str:
        """
        Return the printed ``PASS``/``MISS`` line with the figures.

        :return: one line of text.
        """
        verdict = 'PASS' if self.passed else 'MISS'
        relation = '<=' if self.at_most else '>='
        shown = 'not measured' if self.value is None else f'{fmt_number(self.value)} {self.unit}'
        return f'{verdict}  {self.name}: {shown} (target {relation} {self.limit:g} {self.unit})'

    def to_dict(self) -> Dict[str, Any]:
        """
        Return the target as a JSON-ready dict.

        :return: name, value, limit, unit, direction and verdict.
        """
        return {'name': self.name, 'value': self.value, 'limit': self.limit,
                'unit': self.unit, 'at_most': self.at_most, 'passed': self.passed}


def print_section(title: str, lines: List[str]) -> None:
    """
    Print a titled block.

    :param title: heading text.
    :param lines: body lines.
    """
    print(f'\n== {title} ==')
    for line in lines:
        print(line)
