"""
The native build cache: keyed by source text and flags, safe against killed and parallel builds.

Builds here use a tiny CPython extension (no torch headers, a few seconds to build) through
the same :func:`~diffsim_ros.core.native_build.load_cached` that builds the kernels; lock
holders are real processes that take the same lock.
"""

import logging
import os
from pathlib import Path
import shutil
import subprocess
import sys
import threading

from diffsim_ros.core import native_build
from diffsim_ros.core.native_build import cache_key, key_inputs, load_cached
import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
PREFIX = 'diffsim_ros_cache_test'
CFLAGS = ('-O1',)
#: A module with one function, ``answer()``; its name is the one torch defines.
TINY_SOURCE = """// a CPython module without torch headers, so that it builds in seconds
#include <Python.h>
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
#define STR2(a) #a
#define STR(a) STR2(a)
static PyObject *answer(PyObject *, PyObject *) {{ return PyLong_FromLong({answer}); }}
static PyMethodDef methods[] = {{
    {{"answer", answer, METH_NOARGS, nullptr}}, {{nullptr, nullptr, 0, nullptr}}}};
static PyModuleDef module = {{PyModuleDef_HEAD_INIT, STR(TORCH_EXTENSION_NAME), nullptr, -1,
                             methods}};
PyMODINIT_FUNC CAT(PyInit_, TORCH_EXTENSION_NAME)(void) {{ return PyModule_Create(&module); }}
"""
#: A process that takes the build lock of a directory and leaves a baton as torch does while
#: it builds; after 'ready' it waits for a line on stdin, says whether its baton is intact,
#: and releases both, as a finished build would.
HOLDER = """
import os, sys
from pathlib import Path
from diffsim_ros.core import native_build
directory = Path(sys.argv[1])
with native_build.build_lock(directory, 'a test build'):
    os.close(os.open(directory / native_build.TORCH_BATON, os.O_CREAT | os.O_EXCL))
    print('ready', flush=True)
    sys.stdin.readline()
    baton = directory / native_build.TORCH_BATON
    print('intact' if baton.exists() else 'gone', flush=True)
    baton.unlink(missing_ok=True)
"""
#: How long a test waits for something that takes well under a second before failing.
DEADLINE_S = 120.0

pytestmark = pytest.mark.skipif(shutil.which(native_build.compiler()) is None,
                                reason='no C++ compiler')


def _checkout(parent: Path, answer: int = 42) -> Path:
    """Write the tiny source into ``parent`` (a checkout of it); return the source file."""
    parent.mkdir(parents=True, exist_ok=True)
    source = parent / 'tiny.cpp'
    source.write_text(TINY_SOURCE.format(answer=answer))
    return source


def _directory(root: Path, source: Path, cflags=CFLAGS) -> Path:
    return root / f'{PREFIX}_{cache_key([source], cflags, ())}'


def _env() -> dict:
    """Return the environment of a child process that imports this checkout."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, (str(REPO_ROOT), os.environ.get('PYTHONPATH')))))


def _holder(directory: Path) -> subprocess.Popen:
    """Start a process that holds the build lock of ``directory``; return once it does."""
    process = subprocess.Popen([sys.executable, '-c', HOLDER, str(directory)], env=_env(),
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    if line.strip() != 'ready':
        process.kill()
        pytest.fail(f'the lock holder did not start: {line!r}, exit {process.wait()}')
    return process


def test_two_checkouts_with_the_same_source_share_one_build(tmp_path, caplog):
    first, second = _checkout(tmp_path / 'a' / 'src'), _checkout(tmp_path / 'b')
    assert cache_key([first], CFLAGS, ()) == cache_key([second], CFLAGS, ())
    root = tmp_path / 'cache'
    with caplog.at_level(logging.INFO, logger=native_build.__name__):
        module = load_cached(PREFIX, [first], CFLAGS, (), root=root)
        built = [r for r in caplog.records if 'compiling' in r.getMessage()]
        shared = Path(module.__file__)
        stamp = shared.stat().st_mtime_ns
        # the other checkout, then the first again: no build, the same module file
        for source in (second, first):
            again = load_cached(PREFIX, [source], CFLAGS, (), root=root)
            assert again.answer() == 42
            assert Path(again.__file__) == shared
    assert module.answer() == 42
    assert len(built) == 1
    assert len([r for r in caplog.records if 'compiling' in r.getMessage()]) == 1
    assert shared.stat().st_mtime_ns == stamp
    assert [p.name for p in root.iterdir()] == [shared.parent.name]


def test_changed_source_flags_or_toolchain_change_the_key(tmp_path, monkeypatch):
    source = _checkout(tmp_path / 'a')
    key = cache_key([source], CFLAGS, ())
    assert cache_key([source], CFLAGS + ('-DNDEBUG',), ()) != key
    assert cache_key([source], ('-O2',), ()) != key
    assert cache_key([source], CFLAGS, ('-fopenmp',)) != key
    assert cache_key([_checkout(tmp_path / 'b', answer=43)], CFLAGS, ()) != key
    # one character, same length and file name
    source.write_text(source.read_text().replace('a CPython', 'A CPython'))
    edited = cache_key([source], CFLAGS, ())
    assert edited != key
    monkeypatch.setenv('CXX', 'g++-that-is-not-c++')
    assert cache_key([source], CFLAGS, ()) != edited
    monkeypatch.delenv('CXX')
    monkeypatch.setattr(torch, '__version__', '0.0.1+other')
    assert cache_key([source], CFLAGS, ()) != edited
    monkeypatch.undo()
    assert cache_key([source], CFLAGS, ()) == edited
    # the CPU counts only for builds tuned to it
    assert 'host' not in key_inputs([source], CFLAGS, ())
    assert key_inputs([source], ('-march=native',), ())['host'] == native_build.host_tag()


def test_different_sources_never_overwrite_each_other(tmp_path):
    root = tmp_path / 'cache'
    modules = {answer: load_cached(PREFIX, [_checkout(tmp_path / str(answer), answer)],
                                   CFLAGS, (), root=root) for answer in (42, 43)}
    assert {answer: m.answer() for answer, m in modules.items()} == {42: 42, 43: 43}
    # each build is still there, loaded from its own directory without building
    for answer in (42, 43):
        again = load_cached(PREFIX, [_checkout(tmp_path / str(answer), answer)], CFLAGS, (),
                            root=root)
        assert again.answer() == answer
    assert len(list(root.iterdir())) == 2


def test_stale_lock_of_a_killed_build_is_removed_with_a_log_line(tmp_path, caplog):
    source = _checkout(tmp_path / 'a')
    root = tmp_path / 'cache'
    directory = _directory(root, source)
    directory.mkdir(parents=True)
    holder = _holder(directory)  # a build under way ...
    holder.kill()  # ... killed: torch's baton stays, and no process holds the lock
    holder.wait()
    holder.stdout.close()
    holder.stdin.close()
    baton = directory / native_build.TORCH_BATON
    assert baton.exists()
    result = {}

    def load():
        result['module'] = load_cached(PREFIX, [source], CFLAGS, (), root=root)

    loader = threading.Thread(target=load, daemon=True)  # torch would wait on it for ever
    with caplog.at_level(logging.INFO, logger=native_build.__name__):
        loader.start()
        loader.join(DEADLINE_S)
    assert not loader.is_alive(), f'the load hangs on the stale lock {baton}'
    assert result['module'].answer() == 42
    assert not baton.exists()
    removed = [r for r in caplog.records if 'stale lock' in r.getMessage()]
    assert len(removed) == 1 and removed[0].levelno == logging.WARNING
    assert str(baton) in removed[0].getMessage()
    assert 'waiting' not in caplog.text


def test_a_live_build_is_waited_for_not_deleted(tmp_path, caplog):
    source = _checkout(tmp_path / 'a')
    root = tmp_path / 'cache'
    directory = _directory(root, source)
    directory.mkdir(parents=True)
    holder = _holder(directory)
    waiting = threading.Event()

    class Signal(logging.Handler):

        def emit(self, record):
            if 'waiting' in record.getMessage():
                waiting.set()

    signal = Signal()
    logger = logging.getLogger(native_build.__name__)
    logger.addHandler(signal)
    result = {}

    def load():
        result['module'] = load_cached(PREFIX, [source], CFLAGS, (), root=root)

    loader = threading.Thread(target=load, daemon=True)
    try:
        with caplog.at_level(logging.INFO, logger=native_build.__name__):
            loader.start()
            assert waiting.wait(DEADLINE_S), 'the loader never said it was waiting'
            assert loader.is_alive()
            holder.stdin.write('go\n')
            holder.stdin.flush()
            verdict = holder.stdout.readline().strip()
            assert holder.wait(DEADLINE_S) == 0
            loader.join(DEADLINE_S)
    finally:
        logger.removeHandler(signal)
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        holder.stdin.close()
        holder.stdout.close()
    assert verdict == 'intact'  # the waiting loader left the live holder's baton alone
    assert not loader.is_alive() and result['module'].answer() == 42
    messages = [r.getMessage() for r in caplog.records if 'waiting' in r.getMessage()]
    assert len(messages) == 1
    assert f'process {holder.pid}' in messages[0] and str(directory) in messages[0]
    assert 'stale lock' not in caplog.text


def test_a_broken_build_is_rebuilt(tmp_path):
    source = _checkout(tmp_path / 'a')
    root = tmp_path / 'cache'
    module_file = Path(load_cached(PREFIX, [source], CFLAGS, (), root=root).__file__)
    # cut short (a disk that filled up); a new file, as this process has the old one mapped
    truncated = module_file.with_name('truncated')
    truncated.write_bytes(module_file.read_bytes()[:100])
    os.replace(truncated, module_file)
    # the next start is another process (this one keeps the module it imported)
    script = ('import logging, sys; from pathlib import Path; logging.basicConfig(); '
              'from diffsim_ros.core.native_build import load_cached; '
              f'print(load_cached(sys.argv[1], [Path(sys.argv[2])], {CFLAGS!r}, (), '
              'root=Path(sys.argv[3])).answer())')
    run = subprocess.run([sys.executable, '-c', script, PREFIX, str(source), str(root)],
                         env=_env(), capture_output=True, text=True, timeout=DEADLINE_S)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == '42'
    assert 'discarded' in run.stderr and 'cannot be imported' in run.stderr


def test_without_file_locks_nothing_is_built(tmp_path, monkeypatch):
    # Where fcntl is missing a build could not be guarded: refuse it (the caller runs torch).
    monkeypatch.setattr(native_build, 'fcntl', None)
    root = tmp_path / 'cache'
    with pytest.raises(OSError, match='fcntl'):
        load_cached(PREFIX, [_checkout(tmp_path / 'a')], CFLAGS, (), root=root)
    assert not any(p.suffix == '.so' for p in root.rglob('*'))
