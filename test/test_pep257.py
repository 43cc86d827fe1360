"""Check docstrings the way ROS packages do (ament_pep257, the 'ament' convention)."""

import os
from pathlib import Path

from ament_pep257.main import main
import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
LINTED = ('diffsim_ros', 'test', 'benchmarks', 'launch', 'setup.py')


@pytest.mark.linter
@pytest.mark.pep257
def test_pep257(monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    paths = [path for path in LINTED if os.path.exists(path)]
    rc = main(argv=paths)
    assert rc == 0, 'Found code style errors / warnings'
