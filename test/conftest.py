"""Shared pytest set-up: marker registration and the recorded-data fixture."""

import os
from pathlib import Path
import sys

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

# One torch (OpenMP) intra-op thread per test process, unless the caller chose a number.  The
# suite's tensors are small, and on a busy machine a second thread spins at every parallel
# region until the scheduler gives it a time slice: at a load of 9 on 2 cores,
# test_ccn_r_residual_learns_an_unmodelled_force_field took 18 s with one thread and 203 s
# with two (CI runs on machines busy with other work).  Set here, before any test module
# imports torch, so that spawned processes (nodes, commands run as a user would) inherit it.
os.environ.setdefault('OMP_NUM_THREADS', '1')
if 'torch' in sys.modules:   # imported by a plugin before this file: set it directly
    sys.modules['torch'].set_num_threads(max(1, int(os.environ['OMP_NUM_THREADS'].split(',')[0])))

_MARKERS = (
    'slow: statistical or long-running tests (deselect with -m "not slow")',
    'flake8: marks tests checking for flake8 compliance',
    'linter: marks tests as linter checks',
    'pep257: marks tests checking for PEP 257 compliance',
    'ros: tests that create rclpy contexts, nodes or executors',
)


def pytest_configure(config: pytest.Config) -> None:
    """Register the project's markers (pytest runs with --strict-markers)."""
    for marker in _MARKERS:
        config.addinivalue_line('markers', marker)


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    """
    Run the files that hold slow tests first, each file's tests still together and in order.

    ``scripts/dev.sh test`` hands whole files to pytest-xdist workers in collection order;
    a long file handed out last leaves the other workers idle until it ends (on the local
    CI in alphabetical order the last 2 % of the tests took 9 of the 31 minutes).  Started
    first, the long files overlap the short ones.
    """
    slow_files = {item.path for item in items if item.get_closest_marker('slow')}
    items.sort(key=lambda item: item.path not in slow_files)   # stable: files stay whole


def resolve_data_dir() -> Path:
    """
    Return the directory holding the recorded robot data.

    :return: ``$DIFFSIM_DATA`` when set, else ``<repo>/../shared/data``; the path may
        not exist.
    """
    env = os.environ.get('DIFFSIM_DATA')
    if env:
        return Path(env).expanduser().resolve()
    return (REPO_ROOT.parent / 'shared' / 'data').resolve()


@pytest.fixture(scope='session')
def data_dir() -> Path:
    """
    Provide the recorded-data directory, skipping the test when it is absent.

    :return: the existing data directory (see :func:`resolve_data_dir`).
    """
    path = resolve_data_dir()
    if not path.is_dir():
        source = '$DIFFSIM_DATA' if os.environ.get('DIFFSIM_DATA') else '<repo>/../shared/data'
        pytest.skip(f'recorded data not found at {path} ({source}); set DIFFSIM_DATA '
                    'to the directory holding INDEX.md to run this test')
    return path


@pytest.fixture(scope='session')
def kernels() -> bool:
    """Compile (or load the cached) native kernels once per session; skip when impossible."""
    from diffsim_ros.core import native
    available, reason = native.native_available()
    if not available:
        pytest.skip(f'native kernels unavailable: {reason}')
    return True
