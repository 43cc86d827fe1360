"""
Fused per-sample C++ kernels for RNEA, ABA and CRBA, with state and inertial gradients.

Fixed-base and floating-base trees alike: a free-flyer root (joint type code 2 in the
kernels' structure) reads ``q[:7] = [p, quaternion (x, y, z, w)]`` and ``v[:6] = [linear;
angular]`` in root axes, the root body's own spatial velocity, so the recursions run in body
coordinates as for a fixed base; RNEA returns the root wrench ``S0^T F_0``, ABA solves the
root's 6x6 articulated inertia (Cholesky) after the backward sweep, CRBA adds the root block
and coupling rows.  In body coordinates only gravity sees the root's pose, so the position
adjoint of the root is the quaternion gradient of ``abar_0 . X_0 a_g`` (through ``q / |q|``,
like the torch code: tangent to the sphere), and zero for its position.

:func:`diffsim_ros.core.rnea`, :func:`~diffsim_ros.core.aba` and
:func:`~diffsim_ros.core.crba` (:mod:`diffsim_ros.core.dispatch`) run these kernels by
themselves wherever a call allows it; :func:`rnea_native` and friends are the explicit
entry points, which fall back to torch instead of raising.
:func:`feedback_rollout_native` also runs whole closed-loop rollouts (semi-implicit Euler
ABA steps under a clipped affine feedback law) for the controllers, without gradients: MPC
on small robots is bound by per-step call overhead, which one call per horizon removes.

The batched torch algorithms (:mod:`diffsim_ros.core.rnea`, :mod:`diffsim_ros.core.aba`,
:mod:`diffsim_ros.core.crba`) run a few hundred full-batch tensor operations, each streaming
``(B, n, ...)`` intermediates through memory.  The kernels here (``native/rnea.cpp``) run one
sample's whole recursion in a workspace that stays in cache.  They are compiled on first use
with :func:`torch.utils.cpp_extension.load` with ``-march=native``, once per source text,
flags and toolchain: the build is cached in ``TORCH_EXTENSIONS_DIR`` (by default
``~/.cache/torch_extensions``) under ``diffsim_ros_native_dynamics_<key>``, the key hashing
``native/rnea.cpp``'s text, :data:`CFLAGS`, :data:`LDFLAGS`, the compiler, the torch version,
the Python ABI and the CPU model, so checkouts with the same source share one build.  Loaders
that start together wait for one build (logged), and a lock left by a killed build is
removed with a warning (:mod:`diffsim_ros.core.native_build`).

Threads: a call is split over threads only where each thread gets at least 2048
joint-samples (batch x joints, a few hundred microseconds of work: ``kMinWorkPerThread`` in
the source), and over at most ``torch.get_num_threads()``; smaller calls (every MPC-size
call) run on the calling thread alone.  Split calls start their helper threads per call and
hand out chunks of samples from a shared counter, so a thread the scheduler takes away on a
busy machine delays the call by the one chunk it holds, and nothing spins between calls
(an OpenMP team did, and its 2-thread calls ran 10-35x slower under load).

Gradients: :func:`rnea_native` and :func:`aba_native` are differentiable w.r.t. ``q``,
``qd``, ``qdd``/``tau``, ``model.inertial`` and ``model.armature``; :func:`crba_native`
w.r.t. ``model.inertial`` and ``model.armature``.  When a gradient is needed, the forward
kernels save each sample's poses, velocities and accelerations (RNEA also its transmitted
forces, ABA its articulated-inertia terms ``U = IA S`` and ``D``), so a backward pass
recomputes no pose.  RNEA's backward is one reverse sweep of the recursion per sample, its
hand-written adjoint (``rnea_adjoint_sample``): the upstream gradient ``g`` propagates from
the root like a velocity (``w_i = X_i w_parent + S_i g_i``), giving ``d/d pi_j = phi(w_j,
a_j) - phi(v_j x w_j, v_j)`` and, swept back from the leaves, the acceleration and velocity
adjoints that give ``M g`` (``qdd``), ``qd`` and, through ``dX_i/dq_i = -S_i x X_i``,
``q``.  ABA's backward solves ``lam = M^-1 g`` from the saved ``U`` and ``D``; with
``M qdd + h = tau``, ``g . d qdd = lam . d tau - lam . d rnea(q, qd, qdd)``, so the
gradients w.r.t. ``q``, ``qd`` and the parameters are one RNEA adjoint of ``-lam`` at the
saved solution.  CRBA is linear in the parameters, ``M = sum_k J_k^T I(pi_k) J_k``, so
``d<G, M>/d pi_k = sum_ij G_ij phi(c_i, c_j)`` over the columns ``c`` of ``J_k``.
Parameters without batch dims go to the kernels as they are and the kernels return their
gradients summed over the batch, so a call adds no view or reduction to the autograd graph.

Per-call work at small batches is what bounds MPC-size calls, so what the kernels need of a
model (checks, tree structure, parameters as the kernels read them) is prepared once per
model and again only when a parameter is changed in place, and bound in C++ (the
extension's ``BoundModel``): a call without gradients then converts three tensors, and the
checks that make it the common call run in C++, which returns None for any other call.

Jacobians without autograd (:func:`run_derivatives`, behind
:func:`diffsim_ros.core.rnea_derivatives` and :func:`~diffsim_ros.core.aba_derivatives`):
per sample one RNEA (or ABA) pass, then row ``j`` of every Jacobian from one adjoint sweep
of the unit vector ``e_j`` (ABA: of ``-M^-1 e_j``, solved from the saved ``U`` and ``D``).

Whenever a kinematic parameter (``origin_xyz``, ``origin_rpy``, ``gravity``; CRBA does not
read ``gravity``) or CRBA's ``q`` requires grad, the call falls back to the torch
implementation, as it does on CUDA, for dtypes other than
float32/float64, without a C++ compiler, or after :func:`set_enabled` ``(False)``; each
reason is logged once.
"""

import logging
from pathlib import Path
import shutil
import threading
from typing import Optional, Tuple
import weakref

import torch

from .aba import aba
from .crba import crba
from .errors import check_trailing_shape
from .model import FLOATING, PRISMATIC, RobotModel
from .native_build import compiler, load_cached
from .rnea import rnea

Tensor = torch.Tensor

#: ``(k, K, (dv1, dv2))`` of :func:`riccati_backward_native`.
BackwardResult = Tuple[Tensor, Tensor, Tuple[float, float]]
#: The reason logged while the kernels are switched off with :func:`set_enabled`.
DISABLED = 'disabled by set_enabled(False)'
SOURCE = Path(__file__).resolve().parent / 'native' / 'rnea.cpp'
EXTENSION_NAME = 'diffsim_ros_native_dynamics'
#: Compiler and linker flags of the kernels (part of their build cache key).
CFLAGS = ('-O3', '-march=native', '-pthread')
LDFLAGS = ('-pthread',)
_DTYPES = (torch.float32, torch.float64)
#: Trailing (non-batch) dims of inertial, armature, joint origins and gravity.
_TRAILING = (2, 1, 3, 1)

_logger = logging.getLogger(__name__)
_lock = threading.Lock()
_state = {'module': None, 'reason': None, 'tried': False, 'enabled': True}
_logged = set()
_structures = weakref.WeakKeyDictionary()
_models = weakref.WeakKeyDictionary()


def log_fallback(reason: str, level: int = logging.INFO) -> None:
    """
    Log once per process that some work falls back from the kernels to torch, and why.

    :param reason: the reason (each distinct reason is logged once).
    :param level: logging level.
    """
    if reason not in _logged:
        _logged.add(reason)
        _logger.log(level, 'native dynamics: falling back to torch: %s', reason)


def _compile(source: Path = SOURCE, name: str = EXTENSION_NAME):
    """Build or load an extension; return ``(module, None)`` or ``(None, reason)``."""
    # torch.utils.cpp_extension builds with $CXX (default c++); check the same program
    program = compiler()
    if shutil.which(program) is None:
        return None, f'no C++ compiler ({program!r} not found on PATH)'
    if not source.is_file():
        return None, f'kernel source {source} is missing'
    try:
        module = load_cached(name, [source], CFLAGS, LDFLAGS)
    except Exception as error:  # any build failure means: use the torch code
        return None, f'building the kernel failed: {error!r}'
    return module, None


def _extension():
    """Return the compiled extension module, or ``None`` (the reason is logged once)."""
    if not _state['enabled']:
        log_fallback(DISABLED, logging.WARNING)
        return None
    if not _state['tried']:
        with _lock:
            if not _state['tried']:
                _state['module'], _state['reason'] = _compile()
                _state['tried'] = True
    if _state['module'] is None:
        log_fallback(_state['reason'], logging.WARNING)
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


#: Joint type codes of the kernels' ``prismatic`` tensor (``kFreeFlyer`` in the source).
_JOINT_CODES = {PRISMATIC: 1, FLOATING: 2}


def _structure(model: RobotModel) -> Tuple[Tensor, Tensor, Tensor]:
    """
    Return ``(axis (n, 3), parent (n,) int64, joint type (n,) int64)`` of the tree.

    Joint type: 0 revolute/continuous, 1 prismatic, 2 the free-flyer root of a floating base.
    """
    tree = model.tree
    key = (model.dtype, model.device)
    per_tree = _structures.setdefault(tree, {})
    if key not in per_tree:
        parent = torch.tensor(tree.parents, dtype=torch.int64)
        prismatic = torch.tensor([_JOINT_CODES.get(t, 0) for t in tree.joint_types],
                                 dtype=torch.int64)
        axis = tree.axis.to(dtype=model.dtype).contiguous()
        per_tree[key] = (axis, parent, prismatic)
    return per_tree[key]


class _ModelEntry:
    """
    What the kernels need of one model, worked out once per model.

    Calls at B = 1 are bound by per-call Python work, so this keeps why the model itself
    cannot run (dtype, device, floating base, no joint), the tree structure, and its
    parameters as the kernels read them when they carry no batch dims, re-prepared only when
    a parameter is changed in place.
    """

    __slots__ = ('__weakref__', 'reason', 'dtype', 'n', 'nq', 'structure', 'stamp', 'params',
                 'args', 'bound')

    def __init__(self, model: RobotModel) -> None:
        self.reason = _model_reason(model)
        self.dtype = model.dtype
        self.n = model.nv
        self.nq = model.nq
        self.structure = None if self.reason else _structure(model)
        self.stamp = None
        self.params = None
        self.args = None
        self.bound = None

    def plain_params(self, model: RobotModel) -> Optional[Tuple[Tensor, ...]]:
        """Return ``(inertial, armature, origins, gravity)`` without batch dims, or None."""
        # The model's tensors are fixed (a frozen dataclass) and passed as they are, so an
        # in-place change of one reaches the kernels by itself, except for the joint
        # origins computed from origin_xyz and origin_rpy.
        stamp = (model.origin_xyz._version, model.origin_rpy._version)
        if stamp != self.stamp:
            params = (model.inertial, model.armature, model.joint_origins(), model.gravity)
            plain = all(t.dim() == k and t.is_contiguous() for t, k in zip(params, _TRAILING))
            self.params = params if plain else None
            # the kernels' arguments after the states, ``save`` excepted
            self.args = params + self.structure if plain else None
            self.bound = None
            self.stamp = stamp
        return self.params

    def bind(self, ext: object, model: RobotModel) -> Optional[object]:
        """
        Return the extension's ``BoundModel`` of this model (made when missing), or None.

        Calls at B = 1 go through it first: it converts three tensors per call instead of
        ten and decides in C++ whether the call is the common one (None otherwise).
        """
        if self.plain_params(model) is None:
            return None
        if self.bound is None:
            self.bound = ext.BoundModel(*self.args, model.origin_xyz, model.origin_rpy)
        return self.bound


def _model_reason(model: RobotModel) -> Optional[str]:
    """Return why no call on this model can use the kernels, or ``None``."""
    dtype = model.dtype
    if dtype not in _DTYPES:
        return 'dtype is not float32/float64 throughout'
    if not model.n:
        return 'the model has no movable joint'
    params = (model.inertial, model.armature, model.origin_xyz, model.origin_rpy,
              model.gravity)
    if any(t.device.type != 'cpu' for t in params):
        return 'tensors are not on the CPU'
    if any(t.dtype != dtype for t in params):
        return 'dtype is not float32/float64 throughout'
    return None


def _entry(model: RobotModel) -> _ModelEntry:
    entry = _models.get(model)
    if entry is None:
        entry = _models[model] = _ModelEntry(model)
    return entry


def _unsupported(model: RobotModel, positions: Tuple[Tensor, ...], states: Tuple[Tensor, ...],
                 kinematic: Tuple[Tensor, ...]) -> Optional[str]:
    """
    Return why a call cannot use the kernels, or ``None`` when it can.

    ``positions`` may not require grad (CRBA's ``q``: no adjoint), ``states`` (q, qd, qdd,
    tau) may; ``kinematic`` are the kinematic parameters the algorithm reads.
    """
    entry = _entry(model)
    if entry.reason:
        return entry.reason
    dtype = entry.dtype
    tensors = positions + states
    for t in tensors:
        if t.dtype is not dtype or not t.is_cpu:
            if any(not t.is_cpu for t in tensors):
                return 'tensors are not on the CPU'
            return 'dtype is not float32/float64 throughout'
    if torch.is_grad_enabled():
        for t in positions:
            if t.requires_grad:
                return 'q requires grad in CRBA (no native position adjoint)'
        for t in kinematic:
            if t.requires_grad:
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


def _param(value: Tensor, batch: tuple, trailing: int) -> Tensor:
    """
    Return a parameter as the kernels read it: one shared row, or ``(B, ...)``, contiguous.

    Without batch dims (or with only size-1 ones) the tensor is passed as it is (a view
    without the size-1 dims), so the kernels sum its gradient over the batch themselves.
    """
    if value.dim() == trailing:
        return value.contiguous()
    item = value.shape[value.dim() - trailing:]
    if value.numel() == item.numel():
        return value.reshape(item).contiguous()
    if value.shape != batch + item:
        value = value.expand(batch + item)
    return value.reshape((-1,) + item).contiguous()


def _is_plain(states: Tuple[Tensor, ...], batch: torch.Size, params: Tuple[Tensor, ...],
              trailing: Tuple[int, ...]) -> bool:
    """Say whether the kernels take the arguments as they are (the common call)."""
    for t in states:
        if t.shape[:-1] != batch or not t.is_contiguous():
            return False
    for t, k in zip(params, trailing):
        if t.dim() != k or not t.is_contiguous():
            return False
    return True


def _prepare(model: RobotModel, states: Tuple[Tensor, ...], params: Tuple[Tensor, ...],
             trailing: Tuple[int, ...]) -> Tuple[Tuple[Tensor, ...], Tuple[Tensor, ...], tuple]:
    """
    Broadcast states and parameters to one flat batch.

    :return: ``(states, params, batch)``: states of one batch shape ``batch + (nq or nv,)``
        (or flattened), contiguous; parameters as :func:`_param` returns them; the batch shape.
    """
    shape = states[0].shape[:-1]
    if _is_plain(states, shape, params, trailing):
        return states, params, shape
    batch = _broadcast(*(t.shape[:-1] for t in states),
                       *(t.shape[:t.dim() - k] for t, k in zip(params, trailing)))
    states = tuple((t if t.shape[:-1] == batch else t.expand(batch + t.shape[-1:]))
                   .reshape(-1, t.shape[-1]).contiguous() for t in states)
    return states, tuple(_param(t, batch, k) for t, k in zip(params, trailing)), batch


class _RneaFunction(torch.autograd.Function):
    """RNEA kernel with gradients w.r.t. ``q``, ``qd``, ``qdd``, ``inertial``, ``armature``."""

    @staticmethod
    def forward(ctx, q, qd, qdd, inertial, armature, origins, gravity, structure, ext):
        # the kernel saves every sample's poses, velocities and accelerations for backward
        tau, kinematics = ext.rnea_forward(q, qd, qdd, inertial, armature, origins, gravity,
                                           *structure, True)
        ctx.save_for_backward(q, qd, qdd, inertial, armature, kinematics)
        ctx.structure, ctx.ext = structure, ext
        return tau

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_tau):
        # one reverse sweep of the recursion per sample (rnea_adjoint_sample): d/d qdd is
        # M g (armature included), the parameter gradients are summed in the kernel where
        # shared.
        q, qd, qdd, inertial, armature, kinematics = ctx.saved_tensors
        needs = ctx.needs_input_grad
        grads = ctx.ext.rnea_backward(kinematics, grad_tau.contiguous(), q, qd, qdd, inertial,
                                      armature, *ctx.structure, *needs[:5])
        return (*grads, None, None, None, None)


class _AbaFunction(torch.autograd.Function):
    """ABA kernel with gradients w.r.t. ``q``, ``qd``, ``tau``, ``inertial``, ``armature``."""

    @staticmethod
    def forward(ctx, q, qd, tau, inertial, armature, origins, gravity, structure, ext):
        # the kernel saves the kinematics and the articulated-inertia terms U, D for backward
        qdd, rows = ext.aba_forward(q, qd, tau, inertial, armature, origins, gravity,
                                    *structure, True)
        ctx.save_for_backward(q, qd, qdd, inertial, armature, rows)
        ctx.structure, ctx.ext = structure, ext
        return qdd

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_qdd):
        # M qdd + h(q, qd, pi) = tau: d qdd = M^-1 (d tau - d rnea(q, qd, qdd)), so every
        # gradient goes through lam = M^-1 g, solved from the saved rows in the same pass
        # that accumulates -Y^T lam, then one RNEA adjoint of -lam gives q and qd.
        q, qd, qdd, inertial, armature, rows = ctx.saved_tensors
        needs = ctx.needs_input_grad
        grads = ctx.ext.aba_backward(rows, grad_qdd.contiguous(), q, qd, qdd, inertial,
                                     armature, *ctx.structure, *needs[:5])
        return (*grads, None, None, None, None)


class _CrbaFunction(torch.autograd.Function):
    """CRBA kernel with gradients w.r.t. ``inertial`` and ``armature``."""

    @staticmethod
    def forward(ctx, q, inertial, armature, origins, structure, ext):
        # the kernel saves every sample's poses for backward
        M, poses = ext.crba_forward(q, inertial, armature, origins, *structure, True)
        ctx.save_for_backward(inertial, armature, poses)
        ctx.structure, ctx.ext = structure, ext
        return M

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_M):
        # M is linear in pi: sum_k J_k^T I(pi_k) J_k, and diag(armature)
        inertial, armature, poses = ctx.saved_tensors
        needs = ctx.needs_input_grad
        grad_pi, grad_arm = ctx.ext.crba_backward(poses, grad_M.contiguous(), inertial,
                                                  armature, *ctx.structure, needs[1],
                                                  needs[2])
        return None, grad_pi, grad_arm, None, None, None


def _check_states(model: RobotModel, states: Tuple[Tensor, ...], names: Tuple[str, ...]):
    for name, value in zip(names, states):
        n = model.nq if name == 'q' else model.nv   # they differ on a floating base
        shape = value.shape
        if not shape or shape[-1] != n:
            size_name = ('nq' if name == 'q' else 'nv') if model.floating_base else ''
            check_trailing_shape(name, value, (n,), size_name)


def kernels_for(model: RobotModel, q: Tensor, qd: Optional[Tensor] = None,
                x: Optional[Tensor] = None) -> Tuple[Optional[object], Optional[str]]:
    """
    Say whether the kernels can run one call of RNEA/ABA (``qd`` and ``x`` given) or CRBA.

    Compiles the kernels on first use.  Shapes are not checked here (the run does).

    :param model: the robot.
    :param q: joint positions.
    :param qd: joint velocities, None for CRBA.
    :param x: ``qdd`` (RNEA) or ``tau`` (ABA), None for CRBA.
    :return: ``(extension, None)`` when they can, else ``(None, reason)``.
    """
    entry = _entry(model)
    dtype = entry.dtype
    # the common call first, in as few Python operations as possible (B = 1 pays them)
    common = qd is not None and not entry.reason and q.dtype is dtype and qd.dtype is dtype \
        and x.dtype is dtype and q.is_cpu and qd.is_cpu and x.is_cpu and not (
            torch.is_grad_enabled() and (model.origin_xyz.requires_grad
                                         or model.origin_rpy.requires_grad
                                         or model.gravity.requires_grad))
    if not common:
        if qd is None:
            reason = _unsupported(model, (q,), (), (model.origin_xyz, model.origin_rpy))
        else:
            reason = _unsupported(model, (), (q, qd, x),
                                  (model.origin_xyz, model.origin_rpy, model.gravity))
        if reason is not None:
            return None, reason
    ext = _extension()
    if ext is None:
        return None, native_available()[1]
    return ext, None


def try_dynamics(inverse: bool, model: RobotModel, q: Tensor, qd: Tensor,
                 x: Tensor) -> Optional[Tensor]:
    """
    Run RNEA (``inverse``) or ABA in the kernels when the call allows it.

    :param inverse: True for RNEA (``x`` is ``qdd``), False for ABA (``x`` is ``tau``).
    :param model: the robot.
    :param q: joint positions ``(..., n)``.
    :param qd: joint velocities ``(..., n)``.
    :param x: ``qdd`` or ``tau`` ``(..., n)``.
    :return: ``tau`` or ``qdd`` ``(..., n)``, or None when the kernels cannot run this call
        (:func:`kernels_for` says why).
    """
    entry = _models.get(model)
    # the common call: the bound model checks it in C++ (B = 1 pays each Python operation)
    if entry is not None and entry.bound is not None and _state['enabled']:
        out = (entry.bound.rnea if inverse else entry.bound.aba)(q, qd, x)
        if out is not None:
            return out
    entry = _entry(model)
    dtype = entry.dtype
    grad = torch.is_grad_enabled()
    if entry.reason or q.dtype is not dtype or qd.dtype is not dtype or x.dtype is not dtype \
            or not (q.is_cpu and qd.is_cpu and x.is_cpu) or (grad and (
                model.origin_xyz.requires_grad or model.origin_rpy.requires_grad
                or model.gravity.requires_grad)):
        return None
    ext = _extension()
    if ext is None:
        return None
    entry.bind(ext, model)
    params = entry.plain_params(model)
    shape = qd.shape
    if params is not None and x.shape == shape and shape and shape[-1] == entry.n \
            and q.shape[:-1] == shape[:-1] and q.shape[-1] == entry.nq \
            and q.is_contiguous() and qd.is_contiguous() \
            and x.is_contiguous() and not (grad and (
                q.requires_grad or qd.requires_grad or x.requires_grad
                or params[0].requires_grad or params[1].requires_grad)):
        kernel = ext.rnea_forward if inverse else ext.aba_forward
        return kernel(q, qd, x, *entry.args, False)[0]
    return _run_dynamics(entry, ext, inverse, model, q, qd, x)


def run_dynamics(ext: object, inverse: bool, model: RobotModel, q: Tensor, qd: Tensor,
                 x: Tensor) -> Tensor:
    """
    Run the RNEA (``inverse``) or ABA kernel on a call :func:`kernels_for` accepted.

    :param ext: the extension :func:`kernels_for` returned.
    :param inverse: True for RNEA (``x`` is ``qdd``), False for ABA (``x`` is ``tau``).
    :param model: the robot.
    :param q: joint positions ``(..., n)``.
    :param qd: joint velocities ``(..., n)``.
    :param x: ``qdd`` or ``tau`` ``(..., n)``.
    :return: ``tau`` or ``qdd`` ``(..., n)``, differentiable as the module docstring says.
    """
    return _run_dynamics(_entry(model), ext, inverse, model, q, qd, x)


def _flat_call(entry: _ModelEntry, inverse: bool, model: RobotModel, q: Tensor, qd: Tensor,
               x: Tensor) -> Tuple[Tuple[Tensor, ...], Tuple[Tensor, ...], Optional[tuple]]:
    """
    Return ``(states, params, batch)`` of an RNEA/ABA-shaped call as the kernels take it.

    ``batch`` is None for the common call (arguments as they are), else the broadcast batch
    shape of the flattened states and parameters (:func:`_prepare`).
    """
    params = entry.plain_params(model)
    shape = qd.shape
    states = (q, qd, x)
    if params is None or not shape or shape[-1] != entry.n or x.shape != shape \
            or q.shape[:-1] != shape[:-1] or q.shape[-1] != entry.nq \
            or not (q.is_contiguous() and qd.is_contiguous() and x.is_contiguous()):
        # the general call: broadcast states and parameters to one flat batch
        _check_states(model, states, ('q', 'qd', 'qdd' if inverse else 'tau'))
        return _prepare(
            model, states,
            (model.inertial, model.armature, model.joint_origins(), model.gravity), _TRAILING)
    return states, params, None


def _run_dynamics(entry: _ModelEntry, ext: object, inverse: bool, model: RobotModel,
                  q: Tensor, qd: Tensor, x: Tensor) -> Tensor:
    states, params, batch = _flat_call(entry, inverse, model, q, qd, x)
    if torch.is_grad_enabled() and (states[0].requires_grad or states[1].requires_grad
                                    or states[2].requires_grad or params[0].requires_grad
                                    or params[1].requires_grad):
        function = _RneaFunction if inverse else _AbaFunction
        out = function.apply(*states, *params, entry.structure, ext)
    else:
        kernel = ext.rnea_forward if inverse else ext.aba_forward
        out = kernel(*states, *params, *entry.structure, False)[0]
    if batch is None:
        return out
    full = batch + (model.nv,)
    return out if out.shape == full else out.reshape(full)


def try_derivatives(inverse: bool, model: RobotModel, q: Tensor, qd: Tensor, x: Tensor,
                    regressor: bool = False) -> Optional[Tuple[Tensor, ...]]:
    """
    Run the RNEA (``inverse``) or ABA derivative kernel when the call allows it.

    Arguments and result as :func:`run_derivatives`; None when the kernels cannot run this
    call (:func:`kernels_for` under ``torch.no_grad()`` says why: no gradient flows here, so
    what requires grad does not matter).
    """
    entry = _models.get(model)
    if entry is not None and entry.bound is not None and _state['enabled']:
        out = entry.bound.rnea_jacobians(q, qd, x, regressor) if inverse \
            else entry.bound.aba_jacobians(q, qd, x)
        if out is not None:
            return out
    with torch.no_grad():
        ext = kernels_for(model, q, qd, x)[0]
    if ext is None:
        return None
    _entry(model).bind(ext, model)
    return run_derivatives(ext, inverse, model, q, qd, x, regressor)


def run_derivatives(ext: object, inverse: bool, model: RobotModel, q: Tensor, qd: Tensor,
                    x: Tensor, regressor: bool = False) -> Tuple[Tensor, ...]:
    """
    Run the RNEA (``inverse``) or ABA derivative kernel on a call :func:`kernels_for` accepted.

    No autograd graph is recorded (the Jacobians are the result): see
    :func:`diffsim_ros.core.rnea_derivatives` and :func:`~diffsim_ros.core.aba_derivatives`.

    :param ext: the extension :func:`kernels_for` returned.
    :param inverse: True for RNEA (``x`` is ``qdd``), False for ABA (``x`` is ``tau``).
    :param model: the robot; its parameters may carry leading batch dims.
    :param q: joint positions ``(..., n)``.
    :param qd: joint velocities ``(..., n)``.
    :param x: ``qdd`` or ``tau`` ``(..., n)``.
    :param regressor: RNEA only: also return ``dtau/d inertial`` ``(..., n, 10 n)``.
    :return: RNEA: ``(tau, dtau_dq, dtau_dqd, M)`` and ``Y`` when ``regressor``; ABA:
        ``(qdd, dqdd_dq, dqdd_dqd, M^-1)``; Jacobians ``(..., n, n)``.
    """
    entry = _entry(model)
    with torch.no_grad():   # nothing is recorded: the broadcast copies need no graph either
        states, params, batch = _flat_call(entry, inverse, model, q, qd, x)
        if inverse:
            out = ext.rnea_derivatives(*states, *params, *entry.structure, regressor)
            out = out if regressor else out[:4]
        else:
            out = ext.aba_derivatives(*states, *params, *entry.structure)
    if batch is None:
        return tuple(out)
    return tuple(t.reshape(batch + t.shape[t.dim() - (1 if k == 0 else 2):])
                 for k, t in enumerate(out))


def run_crba(ext: object, model: RobotModel, q: Tensor) -> Tensor:
    """
    Run the CRBA kernel on a call :func:`kernels_for` accepted.

    :param ext: the extension :func:`kernels_for` returned.
    :param model: the robot.
    :param q: joint positions ``(..., n)``.
    :return: ``(..., n, n)``, differentiable w.r.t. ``inertial`` and ``armature``.
    """
    states = (q,)
    _check_states(model, states, ('q',))
    states, params, batch = _prepare(
        model, states, (model.inertial, model.armature, model.joint_origins()), _TRAILING[:3])
    structure = _structure(model)
    if torch.is_grad_enabled() and (params[0].requires_grad or params[1].requires_grad):
        out = _CrbaFunction.apply(*states, *params, structure, ext)
    else:
        out = ext.crba_forward(*states, *params, *structure, False)[0]
    full = batch + (model.nv, model.nv)
    return out if out.shape == full else out.reshape(full)


def rnea_native(model: RobotModel, q: Tensor, qd: Tensor, qdd: Tensor) -> Tensor:
    """
    Compute inverse dynamics like :func:`diffsim_ros.core.rnea` with the fused C++ kernel.

    Same semantics, shapes and broadcasting (model parameters may carry batch dims), rigid
    body terms plus ``armature * qdd``.  Differentiable w.r.t. ``q``, ``qd``, ``qdd``,
    ``model.inertial`` and ``model.armature``; falls back to the torch implementation in the
    cases listed in the module docstring.  :func:`diffsim_ros.core.rnea` chooses this path
    by itself where it applies.

    :param model: the robot; its parameters may carry leading batch dims.
    :param q: joint positions ``(..., n)`` [rad or m].
    :param qd: joint velocities ``(..., n)``.
    :param qdd: joint accelerations ``(..., n)``.
    :return: joint torques/forces ``(..., n)`` [N m or N].
    """
    ext, reason = kernels_for(model, q, qd, qdd)
    if ext is None:
        log_fallback(reason)
        return rnea(model, q, qd, qdd)
    return run_dynamics(ext, True, model, q, qd, qdd)


def aba_native(model: RobotModel, q: Tensor, qd: Tensor, tau: Tensor) -> Tensor:
    """
    Compute forward dynamics like :func:`diffsim_ros.core.aba` with the fused C++ kernel.

    Same semantics, shapes and broadcasting as the torch version.  Differentiable w.r.t.
    ``q``, ``qd``, ``tau``, ``model.inertial`` and ``model.armature``; falls back to the
    torch implementation in the cases listed in the module docstring.
    :func:`diffsim_ros.core.aba` chooses this path by itself where it applies.

    :param model: the robot; its parameters may carry leading batch dims.
    :param q: joint positions ``(..., n)``.
    :param qd: joint velocities ``(..., n)``.
    :param tau: applied joint torques/forces ``(..., n)`` (damping/friction not included).
    :return: joint accelerations ``(..., n)``.
    """
    ext, reason = kernels_for(model, q, qd, tau)
    if ext is None:
        log_fallback(reason)
        return aba(model, q, qd, tau)
    return run_dynamics(ext, False, model, q, qd, tau)


def crba_native(model: RobotModel, q: Tensor) -> Tensor:
    """
    Compute the joint-space inertia matrix like :func:`diffsim_ros.core.crba` with C++.

    Same semantics, shapes and broadcasting (model parameters may carry batch dims),
    armature on the diagonal.  Differentiable w.r.t. ``model.inertial`` and
    ``model.armature``; falls back to the torch implementation in the cases listed in the
    module docstring (``gravity`` plays no part here).

    :param model: the robot; its parameters may carry leading batch dims.
    :param q: joint positions ``(..., n)``.
    :return: symmetric positive-definite ``(..., n, n)`` [kg m^2, kg, kg m].
    """
    ext, reason = kernels_for(model, q)
    if ext is None:
        log_fallback(reason)
        return crba(model, q)
    return run_crba(ext, model, q)


class RolloutKernel:
    """
    The rollout kernel of :func:`feedback_rollout_native` bound to one model and torque map.

    The model's tensors and the torque map are prepared (dtype, contiguous, joint origins)
    once, so a call converts only the states and commands: the controllers call it a few
    times per solve, where per-call Python overhead is what counts.  Build it with
    :func:`rollout_kernel`.
    """

    def __init__(self, ext: object, model: RobotModel, torque: Tuple[Tensor, ...],
                 velocity_scale: float) -> None:
        self._ext = ext
        self.dtype = model.dtype
        with torch.no_grad():
            self._torque = tuple(self._arg(t) for t in torque)
            self._model = tuple(self._arg(t) for t in (
                model.inertial, model.armature, model.joint_origins(), model.gravity)) + \
                _structure(model)
        self._scale = float(velocity_scale)
        self._empty = torch.empty(0, dtype=self.dtype)

    def _arg(self, value: Tensor) -> Tensor:
        if value.dtype == self.dtype and value.is_contiguous() and not value.requires_grad:
            return value
        return value.detach().to(self.dtype).contiguous()

    def __call__(self, x0: Tensor, x_nom: Tensor, u_open: Tensor, gains: Tensor,
                 previous: Optional[Tensor], lower: Tensor, upper: Tensor, dt: float,
                 substeps: int) -> Tuple[Tensor, Tensor]:
        """Run the kernel (arguments and result as :func:`feedback_rollout_native`)."""
        arg = self._arg
        return self._ext.feedback_rollout(
            arg(x0), arg(x_nom), arg(u_open), arg(gains),
            self._empty if previous is None else arg(previous), arg(lower), arg(upper),
            *self._torque, self._scale, float(dt) / int(substeps), int(substeps), *self._model)


def rollout_kernel(model: RobotModel, command: Tensor, emf: Tensor, damping: Tensor,
                   friction: Tensor, velocity_scale: float) -> Optional[RolloutKernel]:
    """
    Return the rollout kernel for a model and an affine torque map, or None.

    :param model: the robot, without parameter batch dims, on the CPU.
    :param command: command-to-torque matrix ``(n, nu)``.
    :param emf: back-EMF damping ``(n,)`` (motor torque ``-emf qd``).
    :param damping: viscous friction ``(n,)``.
    :param friction: Coulomb friction ``(n,)``.
    :param velocity_scale: Coulomb ramp velocity, > 0.
    :return: the bound kernel, or None when it cannot run (the reason is logged once): the
        dtype, a floating base, parameter batch dims, tensors off the CPU, or no extension.
    """
    reason = None
    torque = (command, emf, damping, friction)
    if model.dtype not in _DTYPES:
        reason = 'dtype is not float32/float64 throughout'
    elif model.floating_base:
        reason = 'rollout: the closed-loop rollout kernel is fixed-base only'
    elif model.inertial.dim() != 2 or model.armature.dim() != 1 or model.gravity.dim() != 1 \
            or model.origin_xyz.dim() != 2 or model.origin_rpy.dim() != 2:
        reason = 'rollout: the model has parameter batch dims'
    elif any(not t.is_cpu for t in torque) or not model.inertial.is_cpu:
        reason = 'tensors are not on the CPU'
    ext = None if reason else _extension()
    if reason:
        log_fallback(reason)
    if ext is None:
        return None
    return RolloutKernel(ext, model, torque, velocity_scale)


def feedback_rollout_native(model: RobotModel, x0: Tensor, x_nom: Tensor, u_open: Tensor,
                            gains: Tensor, previous: Optional[Tensor], lower: Tensor,
                            upper: Tensor, command: Tensor, emf: Tensor, damping: Tensor,
                            friction: Tensor, velocity_scale: float, dt: float,
                            substeps: int) -> Optional[Tuple[Tensor, Tensor]]:
    """
    Roll out a clipped affine feedback law through the semi-implicit Euler ABA step in C++.

    For every sample ``b`` and step ``t``: ``dz = [x - x_nom[t]; u[t-1] - previous[t]]`` (the
    second block only for ``nx + nu`` gain columns, zero at ``t = 0``), ``u[t] = clip(
    u_open[t, b] + gains[t] dz, lower, upper)``, held over ``substeps`` steps of ``h = dt /
    substeps`` with the affine torque ``tau = command u - (emf + damping) qd - friction
    tanh(qd / velocity_scale)``: ``qd += h ABA(q, qd, tau)``, ``q += h qd``.  The whole
    horizon of every sample runs in one call (no per-step Python), which is what bounds MPC
    on small robots.  No gradients.  Callers that roll out repeatedly keep a
    :func:`rollout_kernel` instead (what :class:`~diffsim_ros.control.ModelDynamics` does).

    :param model: the robot, without parameter batch dims.
    :param x0: initial states ``(B, 2n)``.
    :param x_nom: nominal states ``(>= H, 2n)``.
    :param u_open: open-loop commands ``(H, B, nu)``.
    :param gains: ``(H, nu, 2n)`` or ``(H, nu, 2n + nu)`` (rate-augmented state).
    :param previous: nominal previous commands ``(H, nu)`` for augmented gains, else None.
    :param lower: command lower limits ``(nu,)``.
    :param upper: command upper limits ``(nu,)``.
    :param command: command-to-torque matrix ``(n, nu)``.
    :param emf: back-EMF damping ``(n,)`` (motor torque ``-emf qd``).
    :param damping: viscous friction ``(n,)``.
    :param friction: Coulomb friction ``(n,)``.
    :param velocity_scale: Coulomb ramp velocity, > 0.
    :param dt: control step, s.
    :param substeps: integrator steps per control step.
    :return: ``(states (B, H + 1, 2n), commands (B, H, nu))``, or None when the kernel
        cannot run (reason logged once; the caller uses torch).
    """
    tensors = (x0, x_nom, u_open, gains, lower, upper) + (
        () if previous is None else (previous,))
    if any(not t.is_cpu for t in tensors):
        log_fallback('tensors are not on the CPU')
        return None
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors + (
            model.inertial, model.armature)):
        log_fallback('rollout: an input requires grad (the rollout kernel has no adjoint)')
        return None
    kernel = rollout_kernel(model, command, emf, damping, friction, velocity_scale)
    if kernel is None:
        return None
    return kernel(x0, x_nom, u_open, gains, previous, lower, upper, dt, substeps)


def riccati_backward_native(F: Tensor, l_grad: Tensor, l_hess: Tensor, vz: Tensor, vzz: Tensor,
                            controls: Tensor, u_min: Tensor, u_max: Tensor,
                            mu: float) -> Tuple[bool, Optional[BackwardResult]]:
    """
    Run the box-constrained Riccati recursion of control-limited iLQR in C++ (float64).

    The same recursion as the numpy backward pass of :mod:`diffsim_ros.control.ilqr`
    (Tassa et al. 2014: projected-Newton box QP per step, gains on the free commands only),
    which it replaces when available: per-step numpy calls bound a solve once the rollouts
    run natively.

    :param F: ``[fz | fu]`` per step ``(H, nz, nz + nu)``.
    :param l_grad: stage gradients ``(H, nz + nu)``.
    :param l_hess: stage Hessians ``(H, nz + nu, nz + nu)``.
    :param vz: terminal value gradient ``(nz,)``.
    :param vzz: terminal value Hessian ``(nz, nz)``.
    :param controls: nominal commands ``(H, nu)``.
    :param u_min: command lower limits ``(nu,)``.
    :param u_max: command upper limits ``(nu,)``.
    :param mu: regularisation added to ``Quu``.
    :return: ``(ran, result)``: ``ran`` is False when the kernels are unavailable (reason
        logged once); ``result`` is ``(k (H, nu), K (H, nu, nz), (dv1, dv2))``, or None when
        a regularised free block of ``Quu`` is not positive definite.
    """
    ext = _extension()
    if ext is None:
        return False, None

    def prepared(value: Tensor) -> Tensor:
        return value.detach().to('cpu', torch.float64).contiguous()

    inputs = (F, l_grad, l_hess, vz, vzz, controls, u_min, u_max)
    out = ext.riccati_backward(*(prepared(t) for t in inputs), float(mu))
    if not out:
        return True, None
    k, K, dv = out
    return True, (k, K, (float(dv[0]), float(dv[1])))
