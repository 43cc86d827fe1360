"""Ahead-of-use compilation of the core algorithms for small, fixed-shape hot loops (MPC)."""

from typing import Callable

import torch

from .aba import aba
from .crba import crba
from .rnea import rnea

ALGORITHMS = {'aba': aba, 'rnea': rnea, 'crba': crba}


def compile_algorithm(name: str, dynamic: bool = False) -> Callable:
    """
    Return a ``torch.compile``-d core algorithm with the same signature.

    The model is an argument of the compiled function, so refitted models with the same
    shapes, dtype and device reuse the compiled code.  Compilation happens on the first
    call (tens of seconds); use it where one process calls the same shapes many times
    (the MPC node), not in short scripts.  Inductor's C++ wrapper is enabled because it
    removes most of the per-call Python overhead at batch size 1.

    :param name: ``'aba'``, ``'rnea'`` or ``'crba'``.
    :param dynamic: allow dynamic batch sizes (fewer recompilations, slower calls).
    :return: the compiled function.
    """
    try:
        fn = ALGORITHMS[name]
    except KeyError:
        raise ValueError(f'unknown algorithm {name!r}; valid: {", ".join(ALGORITHMS)}') from None
    return torch.compile(fn, dynamic=dynamic, options={'cpp_wrapper': True})
