"""
The build cache of the native kernels: one build per source text, flags and toolchain.

A C++ extension is built with :func:`torch.utils.cpp_extension.load` into
``<root>/<prefix>_<key>/``, where ``<root>`` is ``TORCH_EXTENSIONS_DIR`` (by default
``~/.cache/torch_extensions``) and ``<key>`` is :func:`cache_key`: a hash of the sources'
names and texts, the compiler and linker flags, the compiler, the torch version, the Python
ABI and, when a flag says ``native`` (``-march=native``), the CPU model and instruction
sets.  Two checkouts with the same sources share one build; different sources, flags or
toolchains never overwrite each other.  The sources are built from a copy in
``<build dir>/sources/``, so the build does not depend on where a checkout lies.  Once a
build has finished, a marker (``complete.json``) names the module file and later loads
import it directly, without running the build tool.  Old builds are not pruned: another
checkout may still use them; deleting the root is always safe.

Concurrent loaders (two nodes starting at once) are serialised by an ``fcntl`` lock on
``<build dir>/build.flock``, held for the whole build, with the holder's pid in
``build.pid``.  A loader that finds the lock taken logs once which process it waits for and
waits.  The operating system releases the lock when its holder dies, so whoever holds it
knows that no live process is building: a ``lock`` file of torch's (its ``FileBaton``, which
holds no pid and would make every later load spin forever) found then was left by a build
that was killed, and is removed with a warning.
"""

from contextlib import contextmanager
import hashlib
import importlib.util
import json
import logging
import os
from pathlib import Path
import platform
import shutil
import sys
import sysconfig
import time
from types import ModuleType
from typing import Iterator, Optional, Sequence

import torch

try:
    import fcntl
except ImportError:  # Windows: builds are refused (the torch code runs), the package imports
    fcntl = None

#: Changes whenever this module's cache layout changes.
LAYOUT = 1
#: The file (torch's ``FileBaton``) that torch creates in a build directory while building.
TORCH_BATON = 'lock'
#: Our lock file; it is never deleted, only locked.
FLOCK = 'build.flock'
#: The pid of the process holding (or last holding) :data:`FLOCK`.
PID_FILE = 'build.pid'
#: Written, atomically, after a build has loaded: the module file and what the key hashed.
MARKER = 'complete.json'

_logger = logging.getLogger(__name__)


def host_tag() -> str:
    """
    Return a short tag of this CPU's model and instruction-set flags.

    A kernel built with ``-march=native`` may use instructions another CPU lacks; the tag in
    its key keeps a build cache shared between machines (a networked home directory) from
    loading it there.

    :return: 8 hex digits.
    """
    text = platform.machine()
    try:
        with open('/proc/cpuinfo', encoding='utf-8', errors='replace') as cpuinfo:
            for line in cpuinfo:
                if line.startswith(('model name', 'flags', 'Features')):
                    text += line
                if line.strip() == '':
                    break  # the first processor describes them all
    except OSError:
        text += platform.processor()
    return hashlib.sha1(text.encode()).hexdigest()[:8]


def compiler() -> str:
    """
    Return the C++ compiler torch's extension builder runs (``$CXX``, default ``c++``).

    :return: the program name or path, as given.
    """
    return os.environ.get('CXX', 'c++')


def key_inputs(sources: Sequence[Path], cflags: Sequence[str],
               ldflags: Sequence[str]) -> dict:
    """
    Return everything a build depends on, as :func:`cache_key` hashes it.

    :param sources: the source files; their names and texts count, not their directories.
    :param cflags: extra compiler flags, in order.
    :param ldflags: extra linker flags, in order.
    :return: a JSON-serialisable dict.
    :raises OSError: when a source cannot be read.
    """
    program = compiler()
    found = shutil.which(program)
    inputs = {
        'layout': LAYOUT,
        'sources': [[Path(s).name, hashlib.sha256(Path(s).read_bytes()).hexdigest()]
                    for s in sources],
        'cflags': list(cflags), 'ldflags': list(ldflags),
        # the program and what it resolves to (/usr/bin/c++ -> g++-13)
        'compiler': [program, os.path.realpath(found) if found else None],
        'torch': [torch.__version__, getattr(torch.version, 'git_version', None)],
        'python': [sys.implementation.cache_tag, sysconfig.get_config_var('EXT_SUFFIX')],
    }
    if any('native' in flag for flag in cflags):
        inputs['host'] = host_tag()
    return inputs


def cache_key(sources: Sequence[Path], cflags: Sequence[str], ldflags: Sequence[str]) -> str:
    """
    Return the cache key of a build: 16 hex digits of a hash of :func:`key_inputs`.

    :param sources: the source files.
    :param cflags: extra compiler flags.
    :param ldflags: extra linker flags.
    :return: the key.
    """
    text = json.dumps(key_inputs(sources, cflags, ldflags), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def default_root() -> Path:
    """
    Return where builds are cached: ``TORCH_EXTENSIONS_DIR``, else torch's default root.

    :return: the root directory (it may not exist yet).
    """
    root = os.environ.get('TORCH_EXTENSIONS_DIR')
    if root:
        return Path(root)
    from torch.utils import cpp_extension  # a quarter of a second to import: only here
    return Path(cpp_extension.get_default_build_root())


def _holder(directory: Path) -> str:
    """Return the pid written by the lock's holder, as text ('unknown' when unreadable)."""
    try:
        return (directory / PID_FILE).read_text().strip() or 'unknown'
    except OSError:
        return 'unknown'


@contextmanager
def build_lock(directory: Path, what: str) -> Iterator[None]:
    """
    Hold the build lock of a build directory, waiting (logged once) while another has it.

    :param directory: the build directory (it must exist).
    :param what: what the lock guards, for the log (e.g. the extension's name).
    :return: a context manager; inside it this process is the only loader of the directory.
    :raises OSError: on a platform without ``fcntl`` locks.
    """
    if fcntl is None:
        raise OSError('no fcntl file locks on this platform to build the extension safely')
    fd = os.open(directory / FLOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _logger.warning('native build: waiting for process %s, which is building %s in %s',
                            _holder(directory), what, directory)
            fcntl.flock(fd, fcntl.LOCK_EX)
        (directory / PID_FILE).write_text(f'{os.getpid()}\n')
        yield
    finally:
        os.close(fd)  # closing the only descriptor releases the lock


def remove_stale_baton(directory: Path) -> bool:
    """
    Remove torch's build lock left in a directory by a build that was killed.

    Call it only while holding :func:`build_lock`: every loader builds under that lock, so a
    baton found then has no live owner.

    :param directory: the build directory.
    :return: True when a stale baton was found and removed (one warning is logged).
    """
    baton = directory / TORCH_BATON
    try:
        age = max(0.0, time.time() - baton.stat().st_mtime)
    except FileNotFoundError:
        return False
    baton.unlink(missing_ok=True)
    _logger.warning('native build: removed the stale lock %s (%.0f s old) of a build that '
                    'did not finish; no live process holds %s', baton, age, directory / FLOCK)
    return True


def _import(path: Path) -> ModuleType:
    """Import an extension module from its file (the module's name is the file's stem)."""
    spec = importlib.util.spec_from_file_location(path.name.split('.')[0], path)
    if spec is None or spec.loader is None:
        raise ImportError(f'cannot import an extension from {path}')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _load_built(directory: Path) -> Optional[ModuleType]:
    """
    Import the finished build of a directory, or return None when there is none.

    A finished build that cannot be imported (a module file truncated or deleted since) is
    logged and forgotten, so that the caller builds it again.
    """
    try:
        marker = json.loads((directory / MARKER).read_text())
        path = directory / Path(marker['module']).name
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as error:
        problem = f'its marker is unreadable: {error!r}'
    else:
        try:
            return _import(path)
        except ImportError as error:
            problem = f'it cannot be imported: {error}'
        path.unlink(missing_ok=True)  # or the build tool may find it up to date
    _logger.warning('native build: the build in %s is discarded (%s); building it again',
                    directory, problem)
    (directory / MARKER).unlink(missing_ok=True)
    return None


def _copy_sources(sources: Sequence[Path], directory: Path) -> list:
    """Copy the sources into ``directory`` where they differ (unchanged copies keep mtime)."""
    directory.mkdir(exist_ok=True)
    copies = []
    for source in sources:
        text = Path(source).read_bytes()
        copy = directory / Path(source).name
        if not copy.is_file() or copy.read_bytes() != text:
            tmp = copy.with_suffix(copy.suffix + '.tmp')
            tmp.write_bytes(text)
            os.replace(tmp, copy)
        copies.append(str(copy))
    return copies


def load_cached(prefix: str, sources: Sequence[Path], cflags: Sequence[str],
                ldflags: Sequence[str], root: Optional[Path] = None) -> ModuleType:
    """
    Load a C++ extension from the build cache, building it first when needed.

    :param prefix: the extension's name without the key (a Python identifier).
    :param sources: the C++ source files.
    :param cflags: extra compiler flags.
    :param ldflags: extra linker flags.
    :param root: the cache root; :func:`default_root` when None.
    :return: the extension module.
    :raises Exception: whatever reading the sources or building raises.
    """
    key = cache_key(sources, cflags, ldflags)
    name = f'{prefix}_{key}'
    directory = Path(root if root is not None else default_root()) / name
    module = _load_built(directory)
    if module is not None:
        return module
    directory.mkdir(parents=True, exist_ok=True)
    with build_lock(directory, name):
        module = _load_built(directory)  # built by the process we waited for
        if module is not None:
            return module
        remove_stale_baton(directory)
        copies = _copy_sources(sources, directory / 'sources')
        if cache_key(copies, cflags, ldflags) != key:  # what is built is what was hashed
            raise RuntimeError(f'the sources {list(map(str, sources))} changed while loading')
        # a warning, so that it reaches stderr without any logging set-up: the first start
        # of a node on a new machine waits about a minute here, and must say why
        _logger.warning('native build: compiling %s in %s, once per source, flags and '
                        'toolchain (about a minute)', name, directory)
        from torch.utils import cpp_extension
        module = cpp_extension.load(
            name=name, sources=copies, extra_cflags=list(cflags), extra_ldflags=list(ldflags),
            build_directory=str(directory), verbose=False)
        marker = {'module': Path(module.__file__).name,
                  'inputs': key_inputs(copies, cflags, ldflags)}
        tmp = directory / (MARKER + '.tmp')
        tmp.write_text(json.dumps(marker, indent=1, sort_keys=True))
        os.replace(tmp, directory / MARKER)
    return module
