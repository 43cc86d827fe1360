"""
The C++ kernels of the contact cone problem (``native/contact.cpp``), and when they run.

:func:`~diffsim_ros.core.contact_solver.solve_contact_impulses` (behind
:func:`~diffsim_ros.core.contact_step`) takes these kernels by itself where they run, with
the backend rules of :mod:`diffsim_ros.core.dispatch` (``backend=``, :func:`set_backend`,
``$DIFFSIM_BACKEND``).  They run the solver of :mod:`~diffsim_ros.core.contact_solver`
step for step, one sample at a time: APGD with adaptive restart, convergence checked every
ten iterations, semismooth Newton where it left a sample open, and the implicit backward
(one LU solve with the transposed fixed-point Jacobian at the solution, never the
iterations).  They agree with the torch solver to rounding (1e-10 in float64 in the tests).

Built and cached like the dynamics kernels (:mod:`diffsim_ros.core.native_build`) under
``diffsim_ros_native_contact_<key>``; switched off with the dynamics kernels by
:func:`diffsim_ros.core.native.set_enabled`.  They run on CPU tensors of float32/float64;
anything else takes torch (logged once), or raises under a forced ``'native'``.

Threads: a call is split only where each thread gets at least 64 cube-size problems (24
rows) of work, over at most ``torch.get_num_threads()`` threads started per call, taking
chunks from a shared counter (``native/rnea.cpp``'s rule: nothing spins between calls, so
a busy machine slows a call by the chunk a descheduled thread holds, not by 10-35x).
"""

import logging
from pathlib import Path
import shutil
import threading
from typing import Optional, Tuple

import torch

from . import native
from .native_build import compiler, load_cached

Tensor = torch.Tensor

SOURCE = Path(__file__).resolve().parent / 'native' / 'contact.cpp'
EXTENSION_NAME = 'diffsim_ros_native_contact'
#: Compiler and linker flags (the dynamics kernels' flags; part of the build cache key).
CFLAGS = native.CFLAGS
LDFLAGS = native.LDFLAGS

_lock = threading.Lock()
_state = {'module': None, 'reason': None, 'tried': False}


def _compile():
    """Build or load the extension; return ``(module, None)`` or ``(None, reason)``."""
    program = compiler()
    if shutil.which(program) is None:
        return None, f'no C++ compiler ({program!r} not found on PATH)'
    if not SOURCE.is_file():
        return None, f'kernel source {SOURCE} is missing'
    try:
        return load_cached(EXTENSION_NAME, [SOURCE], CFLAGS, LDFLAGS), None
    except Exception as error:  # any build failure means: use the torch code
        return None, f'building the contact kernel failed: {error!r}'


def extension() -> Tuple[Optional[object], Optional[str]]:
    """
    Return the compiled contact extension, building or loading it on first use.

    :return: ``(module, None)``, or ``(None, reason)`` when the kernels cannot run.
    """
    if not native._state['enabled']:
        return None, native.DISABLED
    if not _state['tried']:
        with _lock:
            if not _state['tried']:
                _state['module'], _state['reason'] = _compile()
                _state['tried'] = True
    return _state['module'], _state['reason']


def kernels_for(*tensors: Tensor) -> Tuple[Optional[object], Optional[str]]:
    """
    Return the extension when it can solve a problem made of these tensors, else the reason.

    :param tensors: the problem's tensors (``A``, ``b``, ``mu``).
    :return: ``(module, None)`` or ``(None, reason)``.
    """
    dtype = tensors[0].dtype
    for tensor in tensors:
        if tensor.device.type != 'cpu':
            return None, f'contact kernels run on the CPU, got a {tensor.device.type} tensor'
        if tensor.dtype != dtype or dtype not in (torch.float32, torch.float64):
            return None, f'contact kernels run float32/float64 alone, got {tensor.dtype}'
    return extension()


def log_fallback(reason: str) -> None:
    """
    Log once per process that contact problems fall back to the torch solver, and why.

    :param reason: the reason.
    """
    native.log_fallback(f'contact solver: {reason}', logging.INFO)


class NativeContactImpulses(torch.autograd.Function):
    """The cone problems solved by the kernels, with the kernels' implicit backward."""

    @staticmethod
    def forward(ctx, ext, A, b, mu, tol, max_iter):
        """
        Solve flattened problems.

        :param ctx: autograd context.
        :param ext: the extension module.
        :param A: ``(N, m, m)`` contiguous.
        :param b: ``(N, m)`` contiguous.
        :param mu: ``(N, m / 3)`` contiguous.
        :param tol: solver tolerance.
        :param max_iter: APGD iteration cap.
        :return: ``(N, m)`` impulses.
        """
        lam = ext.cone_solve(A, b, mu, float(tol), int(max_iter))
        ctx.ext = ext
        ctx.save_for_backward(A, b, mu, lam)
        return lam

    @staticmethod
    def backward(ctx, grad_lam):
        """
        Return the implicit gradients w.r.t. ``A``, ``b`` and ``mu``.

        :param ctx: autograd context.
        :param grad_lam: ``(N, m)`` upstream gradient.
        :return: gradients in the order of ``forward``'s arguments.
        """
        A, b, mu, lam = ctx.saved_tensors
        grad_A, grad_b, grad_mu = ctx.ext.cone_backward(A, b, mu, lam, grad_lam.contiguous())
        return None, grad_A, grad_b, grad_mu, None, None


def solve(ext: object, A: Tensor, b: Tensor, mu: Tensor, tol: float, max_iter: int) -> Tensor:
    """
    Solve broadcast cone problems with the kernels (differentiable w.r.t. A, b, mu).

    :param ext: the extension (from :func:`kernels_for`).
    :param A: ``(..., m, m)``.
    :param b: ``(..., m)``.
    :param mu: ``(..., m / 3)``.
    :param tol: solver tolerance (velocity units, relative to ``1 + max |b|``).
    :param max_iter: APGD iteration cap.
    :return: ``(..., m)`` impulses.
    """
    m = b.shape[-1]
    lam = NativeContactImpulses.apply(ext, A.reshape(-1, m, m).contiguous(),
                                      b.reshape(-1, m).contiguous(),
                                      mu.reshape(-1, m // 3).contiguous(), tol, max_iter)
    return lam.reshape(b.shape)
