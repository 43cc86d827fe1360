"""Run the README's Python API examples as a user would paste them, in one namespace."""

from pathlib import Path
import re

import torch

README = Path(__file__).resolve().parent.parent / 'README.md'


def _python_api_blocks() -> list:
    text = README.read_text(encoding='utf-8')
    section = text[text.index('## Python API'):]
    section = section[:section.index('\n## ', 1)]
    return re.findall(r'```python\n(.*?)```', section, flags=re.S)


def test_python_api_examples_run():
    blocks = _python_api_blocks()
    assert len(blocks) >= 2, 'the Python API section lost its examples'
    namespace = {}
    for block in blocks:
        exec(compile(block, str(README), 'exec'), namespace)  # noqa: S102
    # What the comments promise: gravity compensated, gradients reach the parameters, and
    # 64 cubes dropped from 0.3 m are still falling freely after one step.
    assert float(namespace['qdd'].abs().max()) < 1e-9
    assert namespace['pi'].grad is not None and bool(namespace['pi'].grad.abs().sum() > 0)
    step = namespace['step']
    assert step.q.shape == (64, 7)
    assert float(step.impulses.abs().max()) == 0.0
    torch.testing.assert_close(step.v[:, 2], torch.full((64,), -9.81e-3, dtype=torch.float64))
