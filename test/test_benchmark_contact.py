"""Run ``benchmarks/contact.py`` as a user would: every engine timed, bad sizes refused."""

import json
from pathlib import Path
import subprocess
import sys

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_contact_benchmark_runs_and_writes_every_engine(tmp_path):
    script = REPO_ROOT / 'benchmarks' / 'contact.py'
    help_text = subprocess.run([sys.executable, str(script), '--help'], check=True,
                               capture_output=True, text=True, cwd=REPO_ROOT).stdout
    assert '--batches' in help_text and '--profile' in help_text
    out = tmp_path / 'contact.json'
    result = subprocess.run([sys.executable, str(script), '--quick', '--batches', '1,2',
                             '--threads', '1', '--json', str(out)], capture_output=True,
                            text=True, cwd=REPO_ROOT, timeout=600)
    assert result.returncode == 0, result.stderr
    assert '| 2 |' in result.stdout and 'load (1, 5, 15 min) before' in result.stdout
    rows = json.loads(out.read_text())['rows']
    assert [row['batch'] for row in rows] == [1, 2]
    engines = {f'{method}{backward}{backend}' for method in ('complementarity', 'compliant')
               for backward in ('', '_backward') for backend in ('', '_torch')} | {'mujoco'}
    assert all(engines <= set(row) for row in rows)
    bad = subprocess.run([sys.executable, str(script), '--batches', '0'], capture_output=True,
                         text=True, cwd=REPO_ROOT)
    assert bad.returncode == 2 and 'batch sizes must be >= 1' in bad.stderr
