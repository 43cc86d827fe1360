"""The node tests' own isolation: two test runs on one machine never share a DDS domain."""

from pathlib import Path
import subprocess
import sys

import pytest
from ros_helpers import reserved_domain_id

HERE = Path(__file__).resolve().parent
# ids no DDS participant can use (Fast DDS stops at 232), so only the lock files are touched
FIRST, COUNT = 300, 30


def test_a_domain_another_run_holds_is_never_handed_out():
    # another test run (a subprocess) holds every id of the range but the last one
    holder = subprocess.Popen(
        [sys.executable, '-c', 'import sys; from ros_helpers import reserved_domain_id as r; '
         f'print(sorted(r(d, 1) for d in range({FIRST}, {FIRST + COUNT - 1})), flush=True); '
         'sys.stdin.read()'],
        cwd=HERE, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == str(list(range(FIRST, FIRST + COUNT - 1)))
        domain = reserved_domain_id(FIRST, COUNT)
        assert domain == FIRST + COUNT - 1
        assert reserved_domain_id(FIRST, COUNT) == domain   # held for the whole run
        with pytest.raises(RuntimeError, match='held by another test run'):
            reserved_domain_id(FIRST, 1)
    finally:
        holder.communicate('', timeout=10.0)
    # once the other run has exited, its ids are free again
    assert reserved_domain_id(FIRST, 1) == FIRST
