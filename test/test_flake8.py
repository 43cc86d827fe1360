"""Run flake8 the way ROS packages do (ament_flake8: 99 columns, single quotes, ...)."""

import os
from pathlib import Path

from ament_flake8.main import main_with_errors
import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
LINTED = ('diffsim_ros', 'test', 'benchmarks', 'launch', 'setup.py')


@pytest.mark.flake8
@pytest.mark.linter
def test_flake8(monkeypatch):
    # ament_flake8 collects its exclude list by walking the working directory.
    monkeypatch.chdir(REPO_ROOT)
    paths = [path for path in LINTED if os.path.exists(path)]
    rc, errors = main_with_errors(argv=paths)
    assert rc == 0, \
        'Found %d code style errors / warnings:\n' % len(errors) + \
        '\n'.join(errors)
