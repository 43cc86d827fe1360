"""
``benchmarks/dynamics.py --fast-only --quick`` and ``--floating-only`` run as a user runs them.

It checks that the command works and prints every fast-by-default row and target line,
the Jacobians without autograd included; the figures themselves are the benchmark's
business (``benchmarks/README.md``), never a timed test.
"""

from pathlib import Path
import re
import subprocess
import sys

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPT = REPO_ROOT / 'benchmarks' / 'dynamics.py'


def _run_section(flag: str) -> str:
    """Check that ``--help`` names ``flag``, run ``flag --quick`` and return its stdout."""
    pytest.importorskip('pinocchio')
    help_text = subprocess.run([sys.executable, str(SCRIPT), '--help'], check=True,
                               capture_output=True, text=True, cwd=REPO_ROOT).stdout
    assert flag in help_text
    result = subprocess.run([sys.executable, str(SCRIPT), flag, '--quick'],
                            capture_output=True, text=True, cwd=REPO_ROOT, timeout=600)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_fast_only_section_runs_as_a_user_would():
    """``--help`` names ``--fast-only``; the section prints each row and each target."""
    out = _run_section('--fast-only')
    for row in ('pin computeRNEADerivatives B=1', 'pin computeABADerivatives B=1',
                'auto: rnea_derivatives B=1', 'auto: aba_derivatives B=1',
                'torch: rnea_derivatives B=1', 'auto: aba B=1'):
        assert re.search(re.escape(row) + r': [0-9.e+]+ us', out), row
    for target in ('public rnea_derivatives at B=1 / pin computeRNEADerivatives',
                   'public aba_derivatives at B=1 / pin computeABADerivatives',
                   'public aba at B=1 / pin.aba'):
        assert re.search(r'(PASS|MISS)  ' + re.escape(target) + r': [0-9.]+ x', out), target
    assert 'load_average_1_5_15_min' in out


def test_floating_only_section_runs_as_a_user_would():
    """``--floating-only --quick`` times both free-base models beside Pinocchio's free-flyer."""
    out = _run_section('--floating-only')
    for label in ('panda free base', 'free body'):
        # the two engines agree on the model before anything is timed
        match = re.search(re.escape(label) + r': nq=\d+, nv=\d+; rnea max \|ours - pin\| = '
                          r'([0-9.e+-]+)', out)
        assert match and float(match.group(1)) < 1e-9, label
        for batch in (1, 1024):
            for name in ('pin rnea', 'pin aba', 'pin crba', 'pin computeRNEADerivatives',
                         'auto rnea', 'auto aba', 'auto crba', 'auto rnea f+b (q, qd, pi)',
                         'torch rnea f+b (q, qd, pi)'):
                row = f'{label} B={batch}: {name}'
                assert re.search(re.escape(row) + r': [0-9.e+]+ us/sample', out), row
            assert f'{label} B={batch}: aba: auto / pin aba = ' in out
    assert 'load_average_1_5_15_min' in out
