"""
RNEA, ABA and CRBA as users call them: the fastest path that gives the same result and gradients.

Two implementations compute the same quantities (they agree to 1e-12 relative in float64):

* ``'native'``: the fused per-sample C++ kernels of :mod:`diffsim_ros.core.native`, on the
  CPU in float32/float64, for fixed-base and floating-base (free-flyer) models alike,
  differentiable w.r.t. ``q`` (all ``nq`` entries, a free-flyer's quaternion through its
  normalisation), ``qd``, ``qdd``/``tau`` and the parameters ``inertial`` and ``armature``
  (CRBA: the parameters only).  They cannot give gradients w.r.t. the kinematic parameters
  (``origin_xyz``, ``origin_rpy``, ``gravity``) nor CRBA's w.r.t. ``q``, and do not run CUDA
  tensors or other dtypes.
* ``'torch'``: the batched torch algorithms (:mod:`~diffsim_ros.core.rnea`,
  :mod:`~diffsim_ros.core.aba`, :mod:`~diffsim_ros.core.crba`): every case, every device.
  On CUDA this is eager torch; :func:`~diffsim_ros.core.compile_algorithm` is the explicit
  way to ``torch.compile`` it (compilation costs tens of seconds per shape).

``'auto'`` (the default) takes ``'native'`` wherever the call allows it, else ``'torch'``,
deciding per call from what is asked (device, dtype, model, which inputs require grad);
code being traced by ``torch.compile`` gets ``'torch'``, which compiles into its graph.
A path is forced, in this order of precedence, by the ``backend=`` argument of a call, by
:func:`set_backend` for the process, or by the environment variable ``DIFFSIM_BACKEND``
(``auto``, ``native`` or ``torch``; read when this module is imported and again by
``set_backend(None)``: the one environment variable the core reads, so that a user can
switch a whole program without editing it).  A forced ``'native'`` that cannot run raises
:class:`BackendError` with the reason instead of silently using torch.  The same choice
serves :func:`~diffsim_ros.core.rnea_derivatives` and :func:`~diffsim_ros.core.aba_derivatives`
(:mod:`diffsim_ros.core.derivatives`: Jacobians without autograd).
"""

import os
from typing import Optional

import torch

from . import native
from .aba import aba as aba_torch
from .crba import crba as crba_torch
from .errors import DiffsimError
from .model import RobotModel
from .rnea import rnea as rnea_torch

Tensor = torch.Tensor

#: Valid backend names.
BACKENDS = ('auto', 'native', 'torch')
#: Environment variable giving the process-wide default when :func:`set_backend` did not.
ENV_VAR = 'DIFFSIM_BACKEND'

_default = {'backend': None, 'env': None}


class BackendError(DiffsimError, RuntimeError):
    """A forced backend cannot run the call (the message says why)."""


def _valid(name: str, source: str) -> str:
    if name not in BACKENDS:
        raise ValueError(f'{source}: unknown backend {name!r}; valid: {", ".join(BACKENDS)}')
    return name


def set_backend(backend: Optional[str]) -> None:
    """
    Set the process-wide default backend of the dynamics functions.

    :func:`rnea`, :func:`aba`, :func:`crba` and the derivative functions
    (:mod:`diffsim_ros.core.derivatives`) take it when called without ``backend=``.

    :param backend: ``'auto'``, ``'native'`` or ``'torch'``; None to go back to
        ``$DIFFSIM_BACKEND`` (read again now; ``'auto'`` when unset).
    """
    _default['backend'] = None if backend is None else _valid(backend, 'set_backend')
    if backend is None:
        _default['env'] = os.environ.get(ENV_VAR) or None


def get_backend() -> str:
    """
    Return the backend a call without ``backend=`` uses.

    :return: ``'auto'``, ``'native'`` or ``'torch'``.
    """
    return _choice(None, 'get_backend')


set_backend(None)  # read $DIFFSIM_BACKEND


def _choice(backend: Optional[str], name: str) -> str:
    """Return the backend of one call (the argument, else the process default)."""
    if backend is None:
        backend = _default['backend'] or _default['env'] or 'auto'
        if backend not in BACKENDS:
            _valid(backend, f'${ENV_VAR}')
    elif backend not in BACKENDS:
        _valid(backend, f'{name}(backend=...)')
    if backend == 'auto' and torch.compiler.is_compiling():
        # inside torch.compile the torch code is what compiles into one graph; an opaque
        # kernel call would break the graph
        return 'torch'
    return backend


def _refuse(name: str, model: RobotModel, q: Tensor, qd: Optional[Tensor] = None,
            x: Optional[Tensor] = None) -> None:
    """Raise :class:`BackendError` saying why the kernels cannot run a forced call."""
    reason = native.kernels_for(model, q, qd, x)[1]
    raise BackendError(f"{name}: backend 'native' cannot run this call: {reason}")


def _dynamics(name: str, backend: Optional[str], model: RobotModel, q: Tensor, qd: Tensor,
              x: Tensor) -> Tensor:
    """Run RNEA (``name == 'rnea'``, ``x = qdd``) or ABA (``x = tau``) on the chosen path."""
    choice = _choice(backend, name)
    inverse = name == 'rnea'
    if choice != 'torch':
        out = native.try_dynamics(inverse, model, q, qd, x)
        if out is not None:
            return out
        if choice == 'native':
            _refuse(name, model, q, qd, x)
    return (rnea_torch if inverse else aba_torch)(model, q, qd, x)


def rnea(model: RobotModel, q: Tensor, qd: Tensor, qdd: Tensor,
         backend: Optional[str] = None) -> Tensor:
    """
    Compute inverse dynamics ``tau = M(q) qdd + C(q, qd) qd + g(q)`` on the fastest path.

    Rigid-body terms plus ``armature * qdd``; joint damping/friction are not included.  See
    :func:`diffsim_ros.core.rnea.rnea` for the algorithm and the module docstring for the
    paths.

    :param model: the robot; its parameters may carry leading batch dims.
    :param q: joint positions ``(..., n)`` [rad or m].
    :param qd: joint velocities ``(..., n)``.
    :param qdd: joint accelerations ``(..., n)``.
    :param backend: ``'auto'``, ``'native'`` or ``'torch'``; None: :func:`get_backend`.
    :return: joint torques/forces ``(..., n)`` [N m or N].
    """
    return _dynamics('rnea', backend, model, q, qd, qdd)


def aba(model: RobotModel, q: Tensor, qd: Tensor, tau: Tensor,
        backend: Optional[str] = None) -> Tensor:
    """
    Compute forward dynamics ``qdd = M(q)^-1 (tau - C(q, qd) qd - g(q))`` on the fastest path.

    See :func:`diffsim_ros.core.aba.aba` for the algorithm and the module docstring for the
    paths.

    :param model: the robot; its parameters may carry leading batch dims.
    :param q: joint positions ``(..., n)``.
    :param qd: joint velocities ``(..., n)``.
    :param tau: applied joint torques/forces ``(..., n)`` (damping/friction not included).
    :param backend: ``'auto'``, ``'native'`` or ``'torch'``; None: :func:`get_backend`.
    :return: joint accelerations ``(..., n)``.
    """
    return _dynamics('aba', backend, model, q, qd, tau)


def crba(model: RobotModel, q: Tensor, backend: Optional[str] = None) -> Tensor:
    """
    Compute the joint-space inertia matrix ``M(q)`` on the fastest path.

    Armature on the diagonal.  See :func:`diffsim_ros.core.crba.crba` for the algorithm and
    the module docstring for the paths (a gradient w.r.t. ``q`` takes torch).

    :param model: the robot; its parameters may carry leading batch dims.
    :param q: joint positions ``(..., n)``.
    :param backend: ``'auto'``, ``'native'`` or ``'torch'``; None: :func:`get_backend`.
    :return: symmetric positive-definite ``(..., n, n)`` [kg m^2, kg, kg m].
    """
    choice = _choice(backend, 'crba')
    if choice != 'torch':
        ext, reason = native.kernels_for(model, q)
        if ext is not None:
            return native.run_crba(ext, model, q)
        if choice == 'native':
            raise BackendError(f"crba: backend 'native' cannot run this call: {reason}")
    return crba_torch(model, q)
