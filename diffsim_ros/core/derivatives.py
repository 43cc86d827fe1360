"""
Jacobians of inverse and forward dynamics without autograd (Pinocchio's derivative API).

For callers that need the Jacobians themselves (iLQR linearisation, identification):
:func:`rnea_derivatives` is Pinocchio's ``computeRNEADerivatives`` (``dtau_dqdd = M``),
optionally with the regressor ``dtau/d inertial``; :func:`aba_derivatives` is
``computeABADerivatives`` (``dqdd/dx = -M^-1 dtau/dx`` at ``qdd``, ``dqdd/dtau = M^-1``).
A reverse-mode pass through :func:`~diffsim_ros.core.rnea` gives one vector-Jacobian
product per call and pays an autograd node (tens of microseconds) each time; these return
the whole Jacobians from one call.

Paths, chosen like :mod:`diffsim_ros.core.dispatch` (``backend=``, :func:`set_backend`,
``$DIFFSIM_BACKEND``):

* ``'native'``: one C++ call per batch (``rnea_derivatives`` / ``aba_derivatives`` in
  ``native/rnea.cpp``): per sample, one RNEA (or ABA) pass, then row ``j`` of every
  Jacobian from one adjoint sweep of the unit vector ``e_j`` (ABA: ``lam_j = M^-1 e_j``
  solved from the articulated-body factors, then one RNEA adjoint sweep of ``-lam_j``):
  ``nv`` sweeps of ``O(n)``.  Fixed-base and floating-base models, CPU, float32/float64;
  on a floating base ``dtau_dq`` is w.r.t. the coordinates of ``q``, as on the torch path.
* ``'torch'``: the torch algorithms, one batched reverse pass per row (``n`` passes), and
  :func:`~diffsim_ros.core.joint_torque_regressor` for the regressor: every model, device
  and dtype.  On a floating-base model ``dtau_dq`` is taken w.r.t. the coordinates of ``q``
  (``(..., nv, nq)``, quaternion included), not Pinocchio's tangent-space derivative.

The results carry no autograd graph: they are values, whatever requires grad.
"""

from typing import Optional, Tuple

import torch

from . import native
from .aba import aba as aba_torch
from .dispatch import _choice, BackendError
from .kinematics import check_state
from .model import RobotModel
from .regressor import joint_torque_regressor
from .rnea import rnea as rnea_torch

Tensor = torch.Tensor


def _native(name: str, backend: Optional[str], model: RobotModel, q: Tensor, qd: Tensor,
            x: Tensor, regressor: bool = False) -> Optional[Tuple[Tensor, ...]]:
    """Return the kernels' result, or None for the torch path (a forced native raises)."""
    choice = _choice(backend, name)
    if choice == 'torch':
        return None
    out = native.try_derivatives(name == 'rnea_derivatives', model, q, qd, x, regressor)
    if out is None and choice == 'native':
        with torch.no_grad():   # no gradient flows: what requires grad does not matter
            reason = native.kernels_for(model, q, qd, x)[1]
        raise BackendError(f"{name}: backend 'native' cannot run this call: {reason}")
    return out


def _batch_shape(model: RobotModel, *states: Tensor) -> torch.Size:
    """Return the broadcast batch shape of the states and the model's parameters."""
    params = ((model.inertial, 2), (model.armature, 1), (model.origin_xyz, 2),
              (model.origin_rpy, 2), (model.gravity, 1))
    return torch.broadcast_shapes(*(t.shape[:-1] for t in states),
                                  *(t.shape[:t.dim() - k] for t, k in params))


def _rnea_jacobians_torch(model: RobotModel, q: Tensor, qd: Tensor,
                          qdd: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Return ``(tau, dtau_dq, dtau_dqd, dtau_dqdd)`` by one batched reverse pass per row."""
    batch = _batch_shape(model, q, qd, qdd)
    # expanded to the full batch so that each sample's gradient stays its own
    inputs = tuple(t.detach().expand(batch + t.shape[-1:]).clone().requires_grad_()
                   for t in (q, qd, qdd))
    with torch.enable_grad():
        tau = rnea_torch(model, *inputs)
        rows = [torch.autograd.grad(tau[..., j].sum(), inputs, retain_graph=True)
                for j in range(tau.shape[-1])]
    jacobians = (torch.stack([row[k] for row in rows], dim=-2) for k in range(3))
    return (tau.detach(), *jacobians)


def rnea_derivatives(model: RobotModel, q: Tensor, qd: Tensor, qdd: Tensor,
                     backend: Optional[str] = None,
                     regressor: bool = False) -> Tuple[Tensor, ...]:
    """
    Compute inverse dynamics and its Jacobians (Pinocchio's ``computeRNEADerivatives``).

    ``tau = rnea(model, q, qd, qdd)`` (armature included) with ``dtau/dq``, ``dtau/dqd``
    and ``dtau/dqdd = M(q)`` in one call, without autograd; see the module docstring for the
    paths.

    :param model: the robot; its parameters may carry leading batch dims (particles).
    :param q: joint positions ``(..., nq)`` [rad or m].
    :param qd: joint velocities ``(..., nv)``.
    :param qdd: joint accelerations ``(..., nv)``.
    :param backend: ``'auto'``, ``'native'`` or ``'torch'``; None: :func:`get_backend`.
    :param regressor: also return ``dtau/d inertial`` ``(..., nv, 10 n)`` (column ``10 i +
        k``: parameter ``k`` of body ``i``), the :func:`joint_torque_regressor` ``Y``.
    :return: ``(tau (..., nv), dtau_dq (..., nv, nq), dtau_dqd (..., nv, nv), M (..., nv,
        nv))``, then ``Y`` when ``regressor``; the batch dims broadcast states and
        parameters.
    """
    out = _native('rnea_derivatives', backend, model, q, qd, qdd, regressor)
    if out is not None:
        return out
    check_state(model, q, qd=qd, qdd=qdd)
    out = _rnea_jacobians_torch(model, q, qd, qdd)
    if not regressor:
        return out
    with torch.no_grad():
        Y = joint_torque_regressor(model, q, qd, qdd)
    return (*out, Y.expand(out[0].shape[:-1] + Y.shape[-2:]))


def aba_derivatives(model: RobotModel, q: Tensor, qd: Tensor, tau: Tensor,
                    backend: Optional[str] = None) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """
    Compute forward dynamics and its Jacobians (Pinocchio's ``computeABADerivatives``).

    ``qdd = aba(model, q, qd, tau)`` with ``dqdd/dq = -M^-1 dtau/dq`` and ``dqdd/dqd =
    -M^-1 dtau/dqd`` (RNEA's Jacobians at ``qdd``) and ``dqdd/dtau = M^-1``, in one call,
    without autograd; see the module docstring for the paths.

    :param model: the robot; its parameters may carry leading batch dims (particles).
    :param q: joint positions ``(..., nq)``.
    :param qd: joint velocities ``(..., nv)``.
    :param tau: applied joint torques/forces ``(..., nv)`` (damping/friction not included).
    :param backend: ``'auto'``, ``'native'`` or ``'torch'``; None: :func:`get_backend`.
    :return: ``(qdd (..., nv), dqdd_dq (..., nv, nq), dqdd_dqd (..., nv, nv), M^-1 (..., nv,
        nv))``; the batch dims broadcast states and parameters.
    """
    out = _native('aba_derivatives', backend, model, q, qd, tau)
    if out is not None:
        return out
    check_state(model, q, qd=qd, tau=tau)
    with torch.no_grad():
        qdd = aba_torch(model, q, qd, tau)
    _, dtau_dq, dtau_dqd, M = _rnea_jacobians_torch(model, q, qd, qdd)
    M_inv = torch.cholesky_inverse(torch.linalg.cholesky(M))
    return qdd.expand(M.shape[:-1]), -M_inv @ dtau_dq, -M_inv @ dtau_dqd, M_inv
