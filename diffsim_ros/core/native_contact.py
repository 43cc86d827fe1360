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
import threading
from typing import Optional, Tuple, TYPE_CHECKING
import weakref

import torch

from . import native
from .configuration import check_configuration, QUATERNION_NORM_TOLERANCE
from .model import RobotModel

if TYPE_CHECKING:  # contact imports this module
    from .contact import ContactModel

Tensor = torch.Tensor

SOURCE = Path(__file__).resolve().parent / 'native' / 'contact.cpp'
EXTENSION_NAME = 'diffsim_ros_native_contact'

_lock = threading.Lock()
_state = {'module': None, 'reason': None, 'tried': False}


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
                _state['module'], _state['reason'] = native._compile(SOURCE, EXTENSION_NAME)
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


_PARAMETERS = ('friction', 'restitution', 'ground_height', 'ground_tilt', 'stiffness',
               'damping', 'slip_velocity')
#: Trailing (non-batch) dims of the kernel's parameters, in its argument order.
_TRAILING = (1, 1, 1, 2, 1, 0, 0, 0, 1, 0, 0, 0)
_prepared = {}


class _FreeBody:
    """
    What the step kernel needs of one (model, contact) pair, worked out once.

    At B = 1 a step costs what its Python costs, so the checks that do not depend on the
    state and the parameters as the kernel reads them are kept, keyed on the parameter
    tensors' identities, versions and ``requires_grad``, and redone only when one changes.
    """

    __slots__ = ('model', 'contact', 'stamp', 'reason', 'grad', 'params', 'batch')

    def __init__(self, model: RobotModel, contact: 'ContactModel', stamp: tuple) -> None:
        self.model, self.contact, self.stamp = weakref.ref(model), weakref.ref(contact), stamp
        self.reason = _static_reason(model, contact)
        self.grad = any(t.requires_grad for t in _parameter_tensors(model, contact))
        if self.reason:
            return
        points, radii = _points(contact)
        params = (model.inertial[..., 0, :], model.armature, model.gravity, points,
                  radii) + tuple(getattr(contact, name) for name in _PARAMETERS)
        self.batch = torch.broadcast_shapes(*[p.shape[:p.dim() - t]
                                              for p, t in zip(params, _TRAILING)])
        # shared parameters go to the kernel as they are; batched ones per call (_row)
        self.params = tuple(p.contiguous() if not self.batch else p for p in params)


def _parameter_tensors(model: RobotModel, contact: 'ContactModel') -> tuple:
    """Return every tensor the step kernel reads of the model and the contact model."""
    return (model.inertial, model.armature, model.gravity, model.origin_xyz,
            model.origin_rpy) + tuple(getattr(contact, name) for name in _PARAMETERS) + (
        contact.vertices + tuple(x for x in (contact.sphere_centers, contact.sphere_radii,
                                             contact.capsule_ends, contact.capsule_radii)
                                 if x is not None))


def _static_reason(model: RobotModel, contact: 'ContactModel') -> Optional[str]:
    """Say why the kernel cannot step this pair whatever the state (None when it can)."""
    if not contact.ground or contact.pairs:
        return 'the step kernel runs ground contact alone (no pairs)'
    if not model.floating_base or model.njoints != 1:
        return 'the step kernel runs single free bodies (one floating link)'
    if any(link != model.tree.body_links[0] for link in contact.links):
        return 'the step kernel runs shapes on the free body itself'
    tensors = _parameter_tensors(model, contact)
    if any(t.device.type != 'cpu' or t.dtype != model.dtype for t in tensors):
        return "the step kernel runs CPU tensors of the model's dtype"
    if model.dtype not in (torch.float32, torch.float64):
        return f'the step kernel runs float32/float64, not {model.dtype}'
    identity = torch.eye(4, dtype=model.dtype)
    placed = model.joint_origins()[..., 0, :, :]
    offset = model.tree.T_body_link[model.link_index(model.tree.body_links[0])]
    if not (torch.equal(placed, identity.expand_as(placed))
            and torch.equal(offset.to(identity), identity)):
        return 'the step kernel runs free bodies whose root joint has no origin offset'
    return None


def _free_body(model: RobotModel, contact: 'ContactModel') -> _FreeBody:
    """Return the prepared pair, prepared again when a parameter tensor has changed."""
    stamp = tuple((id(t), t._version, t.requires_grad)
                  for t in _parameter_tensors(model, contact))
    key = (id(model), id(contact))
    entry = _prepared.get(key)
    if (entry is None or entry.stamp != stamp or entry.model() is not model
            or entry.contact() is not contact):
        if len(_prepared) >= 64:  # models of a finished computation: forget them all
            _prepared.clear()
        entry = _prepared[key] = _FreeBody(model, contact, stamp)
    return entry


def free_body_reason(model: RobotModel, contact: 'ContactModel', method: str,
                     tensors: Tuple[Tensor, ...]) -> Optional[str]:
    """
    Say why :func:`free_body_step` cannot run a step, or None when it can.

    It runs the steps that ask for no gradient of single free bodies (``nq = 7``,
    ``nv = 6``) whose contact shapes (vertices, spheres, capsules) lie on that body, against
    the ground, with no body-body pairs, on CPU float32/float64 tensors.

    :param model: the robot.
    :param contact: the contact model.
    :param method: ``'complementarity'`` or ``'compliant'``.
    :param tensors: the state tensors ``(q, v, tau)``.
    :return: the reason, or None.
    """
    if method not in ('complementarity', 'compliant'):
        return f'no step kernel for method {method!r}'
    entry = _free_body(model, contact)
    if entry.reason:
        return entry.reason
    if torch.is_grad_enabled() and (entry.grad or any(t.requires_grad for t in tensors)):
        return 'a gradient is asked for (the step kernel has none; the solver kernel runs)'
    if any(t.device.type != 'cpu' or t.dtype != model.dtype for t in tensors):
        return "the step kernel runs CPU tensors of the model's dtype"
    return None


def _points(contact: 'ContactModel') -> Tuple[Tensor, Tensor]:
    """Return the contact points ``(..., K, 3)`` on the body and radii ``(..., K)``."""
    points, radii = [], []
    for verts in contact.vertices:
        points.append(verts)
        radii.append(torch.zeros_like(verts[..., 0]))
    if contact.sphere_links:
        points.append(contact.sphere_centers)
        radii.append(contact.sphere_radii)
    if contact.capsule_links:
        points.append(contact.capsule_ends.flatten(-3, -2))
        radii.append(contact.capsule_radii.repeat_interleave(2, dim=-1))
    if len(points) == 1:
        return points[0], radii[0]
    batch = torch.broadcast_shapes(*[p.shape[:-2] for p in points])
    return (torch.cat([p.expand(batch + p.shape[-2:]) for p in points], -2),
            torch.cat([r.expand(batch + r.shape[-1:]) for r in radii], -1))


def _row(value: Tensor, trailing: int, batch: torch.Size) -> Tensor:
    """Return a parameter as the kernel reads it: as it is when shared, else one row a sample."""
    if value.dim() == trailing:
        return value.contiguous()
    return value.expand(batch + value.shape[value.dim() - trailing:]).contiguous()


def _as_state(x: Tensor, batch: torch.Size) -> Tensor:
    """Return a state ``(*batch, n)`` contiguous (as it is when it already is)."""
    if x.shape[:-1] == batch and x.is_contiguous():
        return x
    return x.expand(batch + x.shape[-1:]).contiguous()


def free_body_step(ext: object, model: RobotModel, q: Tensor, v: Tensor, tau: Tensor,
                   dt: float, contact: 'ContactModel', method: str, tol: float,
                   max_iter: int, regularization: float):
    """
    Run :func:`~diffsim_ros.core.contact_step` of free bodies in the step kernel.

    Call it where :func:`free_body_reason` is None.  Contact kinematics, ``M`` and ``h``,
    the free velocity, the Delassus matrix, the cone solve (or the compliant forces) and the
    configuration update per sample in C++, the arithmetic of the torch code.

    :param ext: the extension.
    :param model: a single free body.
    :param q: ``(..., 7)``.
    :param v: ``(..., 6)``.
    :param tau: ``(..., 6)``.
    :param dt: time step [s].
    :param contact: contact model.
    :param method: ``'complementarity'`` or ``'compliant'``.
    :param tol: solver tolerance.
    :param max_iter: APGD iteration cap.
    :param regularization: relative Delassus regularization.
    :return: ``(q', v', impulses, (phi, normal, tangents, point, J_n, J_t))``.
    :raises ValueError: for a non-finite configuration or a quaternion off the unit sphere
        (the error of :func:`~diffsim_ros.core.configuration.check_configuration`, which the
        kernel's own check calls only then), or a mass matrix not positive definite.
    """
    entry = _free_body(model, contact)
    batch = torch.broadcast_shapes(q.shape[:-1], v.shape[:-1], tau.shape[:-1], entry.batch)
    params = entry.params if not entry.batch else tuple(
        _row(p, t, batch) for p, t in zip(entry.params, _TRAILING))
    states = (_as_state(q, batch), _as_state(v, batch), _as_state(tau, batch))
    out, status = ext.free_body_step(*states, *params, list(batch), float(dt), float(tol),
                                     int(max_iter), float(regularization),
                                     0 if method == 'complementarity' else 1,
                                     QUATERNION_NORM_TOLERANCE)
    if status == 1:
        check_configuration(model, q)  # raises its precise error
    if status:
        raise ValueError('contact_step: the mass matrix of a free body is not positive '
                         'definite')
    q_next, v_next, impulses, *frame = out
    return q_next, v_next, impulses, tuple(frame)
