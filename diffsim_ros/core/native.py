"""
Fused per-sample C++ kernels for large-batch RNEA and ABA, with inertial-parameter gradients.

The batched torch algorithms (:func:`diffsim_ros.core.rnea`, :func:`diffsim_ros.core.aba`)
run a few hundred full-batch tensor operations, each streaming ``(B, n, ...)`` intermediates
through memory.  The kernels here (``native/rnea.cpp``) run one sample's whole recursion in a
workspace that stays in cache, OpenMP-parallel over the batch with at most
``torch.get_num_threads()`` threads.  They are compiled on first use with
:func:`torch.utils.cpp_extension.load` with ``-march=native`` (cached in
``TORCH_EXTENSIONS_DIR``, by default ``~/.cache/torch_extensions``, under a name tagged with
the CPU model and flags).

Gradients: both functions are differentiable w.r.t. ``model.inertial`` and
``model.armature``.  When a gradient is needed, the forward kernels save each sample's poses,
velocities and accelerations (ABA also its articulated-inertia terms ``U = IA S`` and ``D``),
so the backward pass recomputes no pose and, for ABA, solves ``M^-1 g`` from ``U`` and ``D``
in the same sweep that accumulates the parameter gradient.  RNEA is linear in the inertial
parameters, so ``d(g . tau)/d pi_j = phi(w_j, a_j) - phi(v_j x w_j, v_j)`` with ``w`` the
upstream gradient propagated like a velocity.  :func:`rnea_native` is also differentiable
w.r.t. ``qdd`` (``M g``) and :func:`aba_native` w.r.t. ``tau`` (``M^-1 g``).

Whenever ``q`` or ``qd`` or a kinematic parameter (``origin_xyz``, ``origin_rpy``,
``gravity``) requires grad, the call falls back to the torch implementation, as it does on
CUDA, for dtypes other than float32/float64, without a C++ compiler, or after
:func:`set_enabled` ``(False)``; each reason is logged once.
"""

import hashlib
import logging
import os
from pathlib import Path
import platform
import shutil
import threading
from typing import Callable, Optional, Tuple
import weakref

import torch

from .aba import aba
from .errors import check_trailing_shape
from .model import PRISMATIC, RobotModel
from .rnea import rnea

Tensor = torch.Tensor

#: The reason logged while the kernels are switched off with :func:`set_enabled`.
DISABLED = 'disabled by set_enabled(False)'
SOURCE = Path(__file__).resolve().parent / 'native' / 'rnea.cpp'
EXTENSION_NAME = 'diffsim_ros_native_dynamics'
_KINEMATIC_FIELDS = ('origin_xyz', 'origin_rpy', 'gravity')

_logger = logging.getLogger(__name__)
_lock = threading.Lock()
_state = {'module': None, 'reason': None, 'tried': False, 'enabled': True}
_logged = set()
_structures = weakref.WeakKeyDictionary()


def _log_once(reason: str, level: int = logging.INFO) -> None:
    if reason not in _logged:
        _logged.add(reason)
        _logger.log(level, 'native dynamics: falling back to torch: %s', reason)


def _host_tag() -> str:
    """
    Return a short tag of this CPU's model and instruction-set flags.

    The kernel is built with ``-march=native``; the tag in the extension's name keeps a build
    cache shared between different machines (a networked home directory) from loading a
    binary with instructions this CPU lacks.
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


def _compile():
    """Build or load the extension; return ``(module, None)`` or ``(None, reason)``."""
    # torch.utils.cpp_extension builds with $CXX (default c++); check the same program
    compiler = os.environ.get('CXX', 'c++')
    if shutil.which(compiler) is None:
        return None, f'no C++ compiler ({compiler!r} not found on PATH)'
    if not SOURCE.is_file():
        return None, f'kernel source {SOURCE} is missing'
    try:
        from torch.utils import cpp_extension
        module = cpp_extension.load(
            name=f'{EXTENSION_NAME}_{_host_tag()}', sources=[str(SOURCE)],
            extra_cflags=['-O3', '-march=native', '-fopenmp'], extra_ldflags=['-fopenmp'],
            verbose=False)
    except Exception as error:  # any build failure means: use the torch code
        return None, f'building the kernel failed: {error!r}'
    return module, None


def _extension():
    """Return the compiled extension module, or ``None`` (the reason is logged once)."""
    if not _state['enabled']:
        _log_once(DISABLED, logging.WARNING)
        return None
    with _lock:
        if not _state['tried']:
            _state['module'], _state['reason'] = _compile()
            _state['tried'] = True
    if _state['module'] is None:
        _log_once(_state['reason'], logging.WARNING)
    return _state['module']


def set_enabled(enabled: bool) -> None:
    """
    Switch the native kernels on or off for this process (off: every call uses torch).

    :param enabled: ``False`` to force the torch implementation, ``True`` to allow the kernels.
    """
    _state['enabled'] = bool(enabled)


def native_available() -> Tuple[bool, Optional[str]]:
    """
    Compile the kernels if needed and say whether they can be used.

    :return: ``(True, None)``, or ``(False, reason)`` when calls fall back to torch.
    """
    module = _extension()
    if module is None:
        return False, DISABLED if not _state['enabled'] else _state['reason']
    return True, None


def _structure(model: RobotModel) -> Tuple[Tensor, Tensor, Tensor]:
    """Return ``(axis (n, 3), parent (n,) int64, prismatic (n,) int64)`` of the tree."""
    tree = model.tree
    key = (model.dtype, model.device)
    per_tree = _structures.setdefault(tree, {})
    if key not in per_tree:
        parent = torch.tensor(tree.parents, dtype=torch.int64)
        prismatic = torch.tensor([t == PRISMATIC for t in tree.joint_types], dtype=torch.int64)
        axis = tree.axis.to(dtype=model.dtype).contiguous()
        per_tree[key] = (axis, parent, prismatic)
    return per_tree[key]


def _unsupported(model: RobotModel, q: Tensor, qd: Tensor, x: Tensor) -> Optional[str]:
    """Return why a call cannot use the kernels, or ``None`` when it can."""
    tensors = (q, qd, x, model.inertial, model.armature, model.origin_xyz, model.origin_rpy,
               model.gravity)
    if any(t.device.type != 'cpu' for t in tensors):
        return 'tensors are not on the CPU'
    if model.dtype not in (torch.float32, torch.float64) or any(
            t.dtype != model.dtype for t in tensors):
        return 'dtype is not float32/float64 throughout'
    if torch.is_grad_enabled():
        if q.requires_grad or qd.requires_grad:
            return 'q or qd requires grad (no native state adjoint)'
        if any(getattr(model, name).requires_grad for name in _KINEMATIC_FIELDS):
            return 'a kinematic parameter (origin_xyz/origin_rpy/gravity) requires grad'
    return None


def _broadcast(*shapes: tuple) -> tuple:
    """Broadcast shapes like :func:`torch.broadcast_shapes`, without its per-call overhead."""
    ndim = max(len(shape) for shape in shapes)
    out = [1] * ndim
    for shape in shapes:
        for k, size in enumerate(shape, ndim - len(shape)):
            if size != 1:
                if out[k] not in (1, size):
                    raise RuntimeError(f'shapes {shapes} cannot be broadcast together')
                out[k] = size
    return tuple(out)


def _flat(value: Tensor, batch: tuple, trailing: int) -> Tensor:
    """Return ``value`` as ``(1, ...)`` when it has no batch dims, else ``(B, ...)``."""
    if value.dim() == trailing:
        return value.unsqueeze(0).contiguous()
    item = tuple(value.shape[value.dim() - trailing:])
    if tuple(value.shape) != batch + item:
        value = value.expand(batch + item)
    return value.reshape((-1,) + item).contiguous()


def _prepare(model: RobotModel, q: Tensor, qd: Tensor, x: Tensor):
    """Broadcast states and parameters to one flat batch; return kernel args and the shape."""
    origins = model.joint_origins()
    batch = _broadcast(q.shape[:-1], qd.shape[:-1], x.shape[:-1], model.inertial.shape[:-2],
                       model.armature.shape[:-1], origins.shape[:-3], model.gravity.shape[:-1])
    states = tuple(_flat(t, batch, 1) for t in (q, qd, x))
    params = (_flat(model.inertial, batch, 2), _flat(model.armature, batch, 1),
              _flat(origins.detach(), batch, 3), _flat(model.gravity.detach(), batch, 1))
    return states, params, batch


def _reduce_to(grad: Tensor, like: Tensor) -> Tensor:
    """Sum a per-sample gradient ``(B, ...)`` to a parameter given as ``(1, ...)``."""
    return grad.sum(0, keepdim=True) if like.shape[0] == 1 and grad.shape[0] != 1 else grad


class _RneaFunction(torch.autograd.Function):
    """RNEA kernel with gradients w.r.t. ``qdd``, ``inertial`` and ``armature``."""

    @staticmethod
    def forward(ctx, q, qd, qdd, inertial, armature, origins, gravity, structure, ext):
        # the kernel saves every sample's poses, velocities and accelerations for backward
        tau, kinematics = ext.rnea_forward(q, qd, qdd, inertial, armature, origins, gravity,
                                           *structure, True)
        ctx.save_for_backward(q, qdd, inertial, armature, origins, gravity, kinematics)
        ctx.structure, ctx.ext = structure, ext
        return tau

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_tau):
        q, qdd, inertial, armature, origins, gravity, kinematics = ctx.saved_tensors
        ext, structure = ctx.ext, ctx.structure
        g = grad_tau.contiguous()
        grad_qdd = grad_pi = grad_arm = None
        if ctx.needs_input_grad[2]:
            # d tau / d qdd = M(q) + diag(armature): one RNEA without velocity and gravity.
            grad_qdd = ext.rnea_forward(q, torch.zeros_like(q), g, inertial, armature,
                                        origins, torch.zeros_like(gravity), *structure,
                                        False)[0]
        if ctx.needs_input_grad[3]:
            grad_pi = ext.rnea_inertial_adjoint(kinematics, g, *structure,
                                                inertial.shape[0] != 1 or q.shape[0] == 1)
            grad_pi = grad_pi.reshape(inertial.shape)
        if ctx.needs_input_grad[4]:
            grad_arm = _reduce_to(g * qdd, armature)
        return None, None, grad_qdd, grad_pi, grad_arm, None, None, None, None


class _AbaFunction(torch.autograd.Function):
    """ABA kernel with gradients w.r.t. ``tau``, ``inertial`` and ``armature``."""

    @staticmethod
    def forward(ctx, q, qd, tau, inertial, armature, origins, gravity, structure, ext):
        # the kernel saves the kinematics and the articulated-inertia terms U, D for backward
        qdd, rows = ext.aba_forward(q, qd, tau, inertial, armature, origins, gravity,
                                    *structure, True)
        ctx.save_for_backward(q, qdd, inertial, armature, rows)
        ctx.structure, ctx.ext = structure, ext
        return qdd

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_qdd):
        q, qdd, inertial, armature, rows = ctx.saved_tensors
        # M qdd + h(pi) = tau: d qdd = M^-1 (d tau - Y d pi - diag(qdd) d armature), so every
        # gradient goes through lam = M^-1 g, solved from the saved rows in the same pass
        # that accumulates -Y^T lam.
        lam, grad_pi = ctx.ext.aba_backward(rows, grad_qdd.contiguous(), *ctx.structure,
                                            ctx.needs_input_grad[3],
                                            inertial.shape[0] != 1 or q.shape[0] == 1)
        grad_pi = grad_pi.reshape(inertial.shape) if ctx.needs_input_grad[3] else None
        grad_arm = _reduce_to(-lam * qdd, armature) if ctx.needs_input_grad[4] else None
        grad_tau = lam if ctx.needs_input_grad[2] else None
        return None, None, grad_tau, grad_pi, grad_arm, None, None, None, None


def _dispatch(function: type, fallback: Callable, model: RobotModel, q: Tensor, qd: Tensor,
              x: Tensor, x_name: str) -> Tensor:
    for name, value in (('q', q), ('qd', qd), (x_name, x)):
        check_trailing_shape(name, value, (model.n,))
    reason = _unsupported(model, q, qd, x)
    ext = None if reason else _extension()
    if reason:
        _log_once(reason)
    if ext is None:
        return fallback(model, q, qd, x)
    states, params, batch = _prepare(model, q, qd, x)
    structure = _structure(model)
    if torch.is_grad_enabled() and any(t.requires_grad for t in states[2:] + params[:2]):
        out = function.apply(*states, *params, structure, ext)
    else:
        kernel = ext.rnea_forward if function is _RneaFunction else ext.aba_forward
        out = kernel(*states, *params, *structure, False)[0]
    return out.reshape(batch + (model.n,))


def rnea_native(model: RobotModel, q: Tensor, qd: Tensor, qdd: Tensor) -> Tensor:
    """
    Compute inverse dynamics like :func:`diffsim_ros.core.rnea` with the fused C++ kernel.

    Same semantics, shapes and broadcasting (model parameters may carry batch dims), rigid
    body terms plus ``armature * qdd``.  Differentiable w.r.t. ``model.inertial``,
    ``model.armature`` and ``qdd``; falls back to :func:`diffsim_ros.core.rnea` in the cases
    listed in the module docstring.

    :param model: the robot; its parameters may carry leading batch dims.
    :param q: joint positions ``(..., n)`` [rad or m].
    :param qd: joint velocities ``(..., n)``.
    :param qdd: joint accelerations ``(..., n)``.
    :return: joint torques/forces ``(..., n)`` [N m or N].
    """
    return _dispatch(_RneaFunction, rnea, model, q, qd, qdd, 'qdd')


def aba_native(model: RobotModel, q: Tensor, qd: Tensor, tau: Tensor) -> Tensor:
    """
    Compute forward dynamics like :func:`diffsim_ros.core.aba` with the fused C++ kernel.

    Same semantics, shapes and broadcasting as the torch version.  Differentiable w.r.t.
    ``model.inertial``, ``model.armature`` and ``tau``; falls back to
    :func:`diffsim_ros.core.aba` in the cases listed in the module docstring.

    :param model: the robot; its parameters may carry leading batch dims.
    :param q: joint positions ``(..., n)``.
    :param qd: joint velocities ``(..., n)``.
    :param tau: applied joint torques/forces ``(..., n)`` (damping/friction not included).
    :return: joint accelerations ``(..., n)``.
    """
    return _dispatch(_AbaFunction, aba, model, q, qd, tau, 'tau')
