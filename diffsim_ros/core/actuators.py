"""
Joint friction and actuator models (DiffNEA section 3.4) as small pure ``torch.nn.Module`` s.

Sign convention (``docs/conventions.md``): a friction model returns ``tau_f`` with
``M qdd + h = tau_motor - tau_f``, so ``tau_f`` points along the velocity and the friction
force the joint feels, ``-tau_f``, opposes motion. A passive model satisfies
``tau_f . qd >= 0`` (it only removes energy). Torques are in N m for revolute and N for
prismatic joints, velocities in rad/s or m/s.

Every ``forward`` is a pure function of its inputs and the module's parameters (nothing is
written to the module). The physical models keep their learnable coefficients as unconstrained
``nn.Parameter`` s of shape ``(*batch_shape, n)`` mapped through ``softplus`` (friction) or
``exp`` (motor constants), so the coefficients are non-negative for every parameter value;
``batch_shape`` such as ``(P, 1)`` gives one model per particle, broadcasting against states
``(B, n)`` to ``(P, B, n)``.

Reference: Lutter, Silberbauer, Watson and Peters, "Differentiable Physics Models for Real-world
Offline Model-based Reinforcement Learning", ICRA 2021.
"""

from typing import Dict, Optional, Sequence, Type, Union

import torch
from torch import nn, Tensor
import torch.nn.functional as F

from .errors import check_trailing_shape, ShapeError

__all__ = [
    'FrictionModel',
    'NoFriction',
    'ViscousFriction',
    'CoulombFriction',
    'StribeckFriction',
    'SigmoidFriction',
    'NNFriction',
    'NNResidual',
    'FFNN',
    'DCMotor',
    'make_friction',
]

TensorLike = Union[float, Sequence[float], Tensor]

# A softplus-parameterised coefficient cannot be exactly 0; a requested 0 is stored as this
# value (in the coefficient's own units), far below any physical friction.
_MIN_COEFFICIENT = 1e-12
# softplus(x) == x to float64 precision above this (exp(-40) ~ 4e-18).
_SOFTPLUS_THRESHOLD = 40.0


def _softplus(x: Tensor) -> Tensor:
    return F.softplus(x, beta=1.0, threshold=_SOFTPLUS_THRESHOLD)


def _softplus_inverse(y: Tensor) -> Tensor:
    return y + torch.log(-torch.expm1(-y))


def _coefficient(value: TensorLike, n: int, batch_shape: Sequence[int],
                 dtype: Optional[torch.dtype], device: Optional[torch.device],
                 name: str) -> Tensor:
    """Validate a physical coefficient and broadcast it to ``(*batch, n)``."""
    dtype = dtype if dtype is not None else torch.get_default_dtype()
    tensor = torch.as_tensor(value, dtype=dtype, device=device)
    try:
        shape = torch.broadcast_shapes(tensor.shape, (*batch_shape, n))
    except RuntimeError:
        raise ShapeError(f'{name}: expected a value broadcastable to (..., {n}), '
                         f'got shape {tuple(tensor.shape)}') from None
    if shape[-1] != n:
        raise ShapeError(f'{name}: expected shape (..., {n}), got {tuple(tensor.shape)}')
    if not bool(torch.isfinite(tensor).all()) or bool((tensor < 0).any()):
        raise ValueError(f'{name} must be finite and >= 0, got {value}')
    return tensor.expand(shape).clone()


def _softplus_parameter(value: TensorLike, n: int, batch_shape: Sequence[int],
                        dtype: Optional[torch.dtype], device: Optional[torch.device],
                        name: str) -> nn.Parameter:
    tensor = _coefficient(value, n, batch_shape, dtype, device, name)
    return nn.Parameter(_softplus_inverse(tensor.clamp_min(_MIN_COEFFICIENT)))


def _mlp(in_features: int, out_features: int, hidden: Sequence[int],
         dtype: Optional[torch.dtype], device: Optional[torch.device]) -> nn.Sequential:
    layers = []
    width = in_features
    for size in hidden:
        layers += [nn.Linear(width, size, dtype=dtype, device=device), nn.Tanh()]
        width = size
    layers.append(nn.Linear(width, out_features, dtype=dtype, device=device))
    return nn.Sequential(*layers)


def _check_states(n: int, **tensors: Tensor) -> None:
    for name, tensor in tensors.items():
        check_trailing_shape(name, tensor, (n,))


class FrictionModel(nn.Module):
    """
    Base class: joint friction ``tau_f = f(q, qd)`` for ``n`` joints.

    ``M qdd + h = tau_motor - tau_f``: the returned torque is subtracted from the applied
    torque, so a positive ``tau_f . qd`` dissipates energy. Subclasses implement
    :meth:`torque`; :meth:`forward` checks the trailing joint dimension first.

    :param n: number of joints.
    """

    def __init__(self, n: int) -> None:
        super().__init__()
        if not isinstance(n, int) or n < 1:
            raise ValueError(f'n must be a positive int, got {n!r}')
        self.n = n

    def forward(self, q: Tensor, qd: Tensor) -> Tensor:
        """
        Friction torque of joint positions and velocities.

        :param q: joint positions ``(..., n)`` in rad or m.
        :param qd: joint velocities ``(..., n)`` in rad/s or m/s.
        :return: ``tau_f (..., n)`` in N m or N, the broadcast of the state's leading dims
            with the model's ``batch_shape``.
        """
        _check_states(self.n, q=q, qd=qd)
        return self.torque(q, qd)

    def torque(self, q: Tensor, qd: Tensor) -> Tensor:
        """Friction torque without shape checks (see :meth:`forward`)."""
        raise NotImplementedError

    def extra_repr(self) -> str:
        """Return the joint count for ``repr``."""
        return f'n={self.n}'


class NoFriction(FrictionModel):
    """
    Zero friction: ``tau_f = 0`` (shape and dtype of ``qd``).

    :param n: number of joints.
    :param batch_shape: accepted for a uniform registry signature; unused.
    :param dtype: accepted for a uniform registry signature; unused.
    :param device: accepted for a uniform registry signature; unused.
    """

    def __init__(self, n: int, batch_shape: Sequence[int] = (),
                 dtype: Optional[torch.dtype] = None,
                 device: Optional[torch.device] = None) -> None:
        super().__init__(n)

    def torque(self, q: Tensor, qd: Tensor) -> Tensor:
        """Return zeros like ``qd``."""
        return torch.zeros_like(qd)


class ViscousFriction(FrictionModel):
    """
    Viscous friction ``tau_f = d * qd`` with ``d = softplus(raw_damping) >= 0``.

    Passive per joint: ``tau_f,i qd_i = d_i qd_i^2 >= 0``.

    :param n: number of joints.
    :param damping: initial damping ``d`` (N m s/rad or N s/m), broadcastable to
        ``(*batch_shape, n)``, >= 0.
    :param batch_shape: leading parameter dims (particles, ensembles), e.g. ``(P, 1)``.
    :param dtype: parameter dtype (default: torch's default dtype).
    :param device: parameter device.
    """

    def __init__(self, n: int, damping: TensorLike = 1e-2, batch_shape: Sequence[int] = (),
                 dtype: Optional[torch.dtype] = None,
                 device: Optional[torch.device] = None) -> None:
        super().__init__(n)
        self.raw_damping = _softplus_parameter(damping, n, batch_shape, dtype, device,
                                               'damping')

    @property
    def damping(self) -> Tensor:
        """Damping coefficients ``(*batch_shape, n)``, >= 0."""
        return _softplus(self.raw_damping)

    @property
    def coefficients(self) -> Dict[str, Tensor]:
        """Physical coefficients by constructor name: ``damping``."""
        return {'damping': self.damping}

    def torque(self, q: Tensor, qd: Tensor) -> Tensor:
        """Return ``d * qd``."""
        return self.damping * qd


class CoulombFriction(FrictionModel):
    """
    Smoothed Coulomb friction ``tau_f = f_c * tanh(qd / eps)``, ``f_c = softplus(raw) >= 0``.

    ``tanh(qd / eps)`` replaces ``sign(qd)`` so the model is differentiable; ``eps`` (rad/s or
    m/s, fixed, not learned) is the velocity below which friction ramps linearly.
    Passive per joint since ``qd tanh(qd / eps) >= 0``.

    :param n: number of joints.
    :param coulomb: initial Coulomb torque ``f_c`` (N m or N), >= 0.
    :param eps: smoothing velocity, > 0.
    :param batch_shape: leading parameter dims.
    :param dtype: parameter dtype.
    :param device: parameter device.
    """

    def __init__(self, n: int, coulomb: TensorLike = 1e-2, eps: float = 1e-2,
                 batch_shape: Sequence[int] = (), dtype: Optional[torch.dtype] = None,
                 device: Optional[torch.device] = None) -> None:
        super().__init__(n)
        if not eps > 0:
            raise ValueError(f'eps must be > 0, got {eps}')
        self.eps = float(eps)
        self.raw_coulomb = _softplus_parameter(coulomb, n, batch_shape, dtype, device,
                                               'coulomb')

    @property
    def coulomb(self) -> Tensor:
        """Coulomb torques ``(*batch_shape, n)``, >= 0."""
        return _softplus(self.raw_coulomb)

    @property
    def coefficients(self) -> Dict[str, Tensor]:
        """Physical coefficients by constructor name: ``coulomb``."""
        return {'coulomb': self.coulomb}

    def torque(self, q: Tensor, qd: Tensor) -> Tensor:
        """Return ``f_c * tanh(qd / eps)``."""
        return self.coulomb * torch.tanh(qd / self.eps)


class StribeckFriction(FrictionModel):
    """
    Smoothed Stribeck friction with viscous term.

    ``tau_f = (f_c + (f_s - f_c) exp(-(qd / v_s)^2)) tanh(qd / eps) + f_v qd`` with
    ``f_c, f_s, v_s, f_v = softplus(raw) >= 0`` (``v_s`` > 0). ``f_c`` and ``f_s`` are
    independent: the bracket is a convex combination of them, hence >= 0, so the model is passive
    per joint for every parameter value; ``f_s > f_c`` gives the usual breakaway peak.

    :param n: number of joints.
    :param coulomb: initial Coulomb torque ``f_c`` (N m or N), >= 0.
    :param static: initial static (breakaway) torque ``f_s`` (N m or N), >= 0.
    :param stribeck_velocity: initial Stribeck velocity ``v_s`` (rad/s or m/s), > 0.
    :param viscous: initial viscous coefficient ``f_v`` (N m s/rad or N s/m), >= 0.
    :param eps: smoothing velocity of the sign function, > 0, fixed.
    :param batch_shape: leading parameter dims.
    :param dtype: parameter dtype.
    :param device: parameter device.
    """

    def __init__(self, n: int, coulomb: TensorLike = 1e-2, static: TensorLike = 2e-2,
                 stribeck_velocity: TensorLike = 1e-1, viscous: TensorLike = 1e-2,
                 eps: float = 1e-2, batch_shape: Sequence[int] = (),
                 dtype: Optional[torch.dtype] = None,
                 device: Optional[torch.device] = None) -> None:
        super().__init__(n)
        if not eps > 0:
            raise ValueError(f'eps must be > 0, got {eps}')
        if not bool((torch.as_tensor(stribeck_velocity) > 0).all()):
            raise ValueError(f'stribeck_velocity must be > 0, got {stribeck_velocity}')
        self.eps = float(eps)
        args = (n, batch_shape, dtype, device)
        self.raw_coulomb = _softplus_parameter(coulomb, *args, 'coulomb')
        self.raw_static = _softplus_parameter(static, *args, 'static')
        self.raw_stribeck_velocity = _softplus_parameter(stribeck_velocity, *args,
                                                         'stribeck_velocity')
        self.raw_viscous = _softplus_parameter(viscous, *args, 'viscous')

    @property
    def coefficients(self) -> Dict[str, Tensor]:
        """Physical coefficients by constructor name: ``coulomb, static, ...``."""
        return {'coulomb': _softplus(self.raw_coulomb), 'static': _softplus(self.raw_static),
                'stribeck_velocity': _softplus(self.raw_stribeck_velocity),
                'viscous': _softplus(self.raw_viscous)}

    def torque(self, q: Tensor, qd: Tensor) -> Tensor:
        """Return the Stribeck friction of the class docstring."""
        c = self.coefficients
        bump = torch.exp(-(qd / c['stribeck_velocity']) ** 2)
        level = c['coulomb'] + (c['static'] - c['coulomb']) * bump
        return level * torch.tanh(qd / self.eps) + c['viscous'] * qd


class SigmoidFriction(FrictionModel):
    """
    Asymmetric smooth Coulomb friction of Gaz et al. (RA-L 2019, the Panda's Table I).

    ``tau_f = phi1 (sigma(phi2 (qd + phi3)) - sigma(phi2 phi3))`` with the logistic
    ``sigma``, ``phi1 = softplus(raw) >= 0`` (N m or N), ``phi2 = softplus(raw) > 0`` (s/rad
    or s/m) and ``phi3`` free (rad/s or m/s).  It is zero at rest and saturates at
    ``phi1 (1 - sigma(phi2 phi3))`` forward and ``-phi1 sigma(phi2 phi3)`` backward: the two
    directions may differ, which a URDF's symmetric ``friction`` field cannot carry.  Passive
    per joint for every parameter value (``sigma`` increases, so the bracket has the sign
    of ``qd``).  A viscous term, if wanted, is the model's ``damping`` field.

    :param n: number of joints.
    :param phi1: initial amplitude (N m or N), >= 0.
    :param phi2: initial slope (s/rad or s/m), > 0.
    :param phi3: initial velocity offset (rad/s or m/s), any sign.
    :param batch_shape: leading parameter dims.
    :param dtype: parameter dtype.
    :param device: parameter device.
    """

    def __init__(self, n: int, phi1: TensorLike = 1e-2, phi2: TensorLike = 10.0,
                 phi3: TensorLike = 0.0, batch_shape: Sequence[int] = (),
                 dtype: Optional[torch.dtype] = None,
                 device: Optional[torch.device] = None) -> None:
        super().__init__(n)
        if not bool((torch.as_tensor(phi2) > 0).all()):
            raise ValueError(f'phi2 must be > 0, got {phi2}')
        args = (n, batch_shape, dtype, device)
        self.raw_phi1 = _softplus_parameter(phi1, *args, 'phi1')
        self.raw_phi2 = _softplus_parameter(phi2, *args, 'phi2')
        shift = torch.as_tensor(phi3, dtype=dtype if dtype is not None
                                else torch.get_default_dtype(), device=device)
        if not bool(torch.isfinite(shift).all()):
            raise ValueError(f'phi3 must be finite, got {phi3}')
        try:
            shape = torch.broadcast_shapes(shift.shape, (*batch_shape, n))
        except RuntimeError:
            raise ShapeError(f'phi3: expected a value broadcastable to (..., {n}), '
                             f'got shape {tuple(shift.shape)}') from None
        self.phi3 = nn.Parameter(shift.expand(shape).clone())

    @property
    def coefficients(self) -> Dict[str, Tensor]:
        """Physical coefficients ``phi1, phi2, phi3`` (Gaz et al.'s names)."""
        return {'phi1': _softplus(self.raw_phi1), 'phi2': _softplus(self.raw_phi2),
                'phi3': self.phi3}

    def torque(self, q: Tensor, qd: Tensor) -> Tensor:
        """Return the sigmoid friction of the class docstring."""
        c = self.coefficients
        return c['phi1'] * (torch.sigmoid(c['phi2'] * (qd + c['phi3']))
                            - torch.sigmoid(c['phi2'] * c['phi3']))


class NNFriction(FrictionModel):
    """
    Neural friction that is passive for every weight value.

    ``tau_f = qd * softplus(g(q, qd))`` elementwise, where ``g`` is an MLP on ``[q, qd]``
    (tanh hidden layers). Each joint's gain is >= 0, so ``tau_f,i qd_i >= 0`` per joint and
    ``tau_f . qd >= 0``: the model can only dissipate energy. The gain may grow as ``qd -> 0``
    only as far as the network can represent, so stiction is approximated, not exact.

    :param n: number of joints.
    :param hidden: hidden layer widths.
    :param dtype: weight dtype.
    :param device: weight device.
    """

    def __init__(self, n: int, hidden: Sequence[int] = (32, 32),
                 dtype: Optional[torch.dtype] = None,
                 device: Optional[torch.device] = None) -> None:
        super().__init__(n)
        self.net = _mlp(2 * n, n, hidden, dtype, device)

    def torque(self, q: Tensor, qd: Tensor) -> Tensor:
        """Return ``qd * softplus(g(q, qd))``."""
        q, qd = torch.broadcast_tensors(q, qd)
        return qd * _softplus(self.net(torch.cat((q, qd), -1)))


class NNResidual(FrictionModel):
    """
    Unconstrained residual torque ``tau_f = g(q, qd)`` from an MLP (tanh hidden layers).

    Enters the dynamics like friction (``M qdd + h = tau_motor - tau_f``) but is **not**
    passive: it can inject energy, so long rollouts of a poorly fitted residual may diverge.

    :param n: number of joints.
    :param hidden: hidden layer widths.
    :param dtype: weight dtype.
    :param device: weight device.
    """

    def __init__(self, n: int, hidden: Sequence[int] = (32, 32),
                 dtype: Optional[torch.dtype] = None,
                 device: Optional[torch.device] = None) -> None:
        super().__init__(n)
        self.net = _mlp(2 * n, n, hidden, dtype, device)

    def torque(self, q: Tensor, qd: Tensor) -> Tensor:
        """Return ``g(q, qd)``."""
        q, qd = torch.broadcast_tensors(q, qd)
        return self.net(torch.cat((q, qd), -1))


class FFNN(nn.Module):
    """
    Black-box forward model ``qdd = g(q, qd, tau)``: an MLP baseline (no physics).

    :param n: number of joints.
    :param hidden: hidden layer widths (tanh activations).
    :param dtype: weight dtype.
    :param device: weight device.
    """

    def __init__(self, n: int, hidden: Sequence[int] = (128, 128),
                 dtype: Optional[torch.dtype] = None,
                 device: Optional[torch.device] = None) -> None:
        super().__init__()
        if not isinstance(n, int) or n < 1:
            raise ValueError(f'n must be a positive int, got {n!r}')
        self.n = n
        self.net = _mlp(3 * n, n, hidden, dtype, device)

    def forward(self, q: Tensor, qd: Tensor, tau: Tensor) -> Tensor:
        """
        Joint accelerations predicted by the network.

        :param q: joint positions ``(..., n)``.
        :param qd: joint velocities ``(..., n)``.
        :param tau: applied joint torques ``(..., n)``.
        :return: ``qdd (..., n)``.
        """
        _check_states(self.n, q=q, qd=qd, tau=tau)
        return self.net(torch.cat(torch.broadcast_tensors(q, qd, tau), -1))

    def extra_repr(self) -> str:
        """Return the joint count for ``repr``."""
        return f'n={self.n}'


class DCMotor(nn.Module):
    """
    Armature-controlled DC motors behind a gearbox: voltage to joint torque (or force).

    With inductance neglected, for each of the ``n`` motors::

        omega_m = G qd / r                       motor shaft speed (rad/s)
        i       = (eta_v V - k_m omega_m) / R_m  armature current (A)
        tau     = eta_g G eta_m k_m i / r        joint torque (N m), or force (N) if r != 1

    i.e. ``tau = eta_g G eta_m k_m (eta_v V - G k_m qd / r) / (R_m r)``. ``k_m`` is both the
    torque constant (N m/A) and the back-EMF constant (V s/rad), equal in SI units. ``G`` is the
    gear ratio, ``eta_g`` / ``eta_m`` the gearbox / motor efficiencies, ``r`` the pinion radius
    in m for a linear axis driven by a rack (``r = 1``, dimensionless, for a rotary joint) and
    ``eta_v`` an efficiency on the voltage path (1 in Quanser's model; Pyrado applies ``eta_m``
    there too, see :meth:`quanser_ip02`). Without gear and efficiencies it is
    ``tau = k_m (V - k_m qd) / R_m``.

    ``k_m = exp(log_motor_constant)`` and ``R_m = exp(log_resistance)`` are learnable and
    positive for every value; ``G``, ``r`` and the efficiencies are fixed buffers.

    :param n: number of motors.
    :param motor_constant: ``k_m`` (N m/A = V s/rad), > 0, broadcastable to
        ``(*batch_shape, n)``.
    :param resistance: ``R_m`` (Ohm), > 0.
    :param gear_ratio: ``G`` (motor turns per output turn), > 0.
    :param gear_efficiency: ``eta_g`` in (0, 1].
    :param motor_efficiency: ``eta_m`` in (0, 1].
    :param voltage_efficiency: ``eta_v`` in (0, 1].
    :param pinion_radius: ``r`` in m for linear axes, or 1.
    :param batch_shape: leading parameter dims.
    :param dtype: parameter dtype.
    :param device: parameter device.
    """

    def __init__(self, n: int, motor_constant: TensorLike, resistance: TensorLike,
                 gear_ratio: TensorLike = 1.0, gear_efficiency: TensorLike = 1.0,
                 motor_efficiency: TensorLike = 1.0, voltage_efficiency: TensorLike = 1.0,
                 pinion_radius: TensorLike = 1.0, batch_shape: Sequence[int] = (),
                 dtype: Optional[torch.dtype] = None,
                 device: Optional[torch.device] = None) -> None:
        super().__init__()
        if not isinstance(n, int) or n < 1:
            raise ValueError(f'n must be a positive int, got {n!r}')
        self.n = n
        positive = {'motor_constant': motor_constant, 'resistance': resistance,
                    'gear_ratio': gear_ratio, 'pinion_radius': pinion_radius}
        efficiencies = {'gear_efficiency': gear_efficiency,
                        'motor_efficiency': motor_efficiency,
                        'voltage_efficiency': voltage_efficiency}
        values = {}
        for name, value in {**positive, **efficiencies}.items():
            shape = batch_shape if name in ('motor_constant', 'resistance') else ()
            values[name] = _coefficient(value, n, shape, dtype, device, name)
            if not bool((values[name] > 0).all()):
                raise ValueError(f'{name} must be > 0, got {value}')
            if name in efficiencies and not bool((values[name] <= 1).all()):
                raise ValueError(f'{name} must be in (0, 1], got {value}')
        self.log_motor_constant = nn.Parameter(values.pop('motor_constant').log())
        self.log_resistance = nn.Parameter(values.pop('resistance').log())
        for name, value in values.items():
            self.register_buffer(name, value)

    @property
    def motor_constant(self) -> Tensor:
        """Torque / back-EMF constant ``k_m`` ``(*batch_shape, n)`` in N m/A."""
        return self.log_motor_constant.exp()

    @property
    def resistance(self) -> Tensor:
        """Armature resistance ``R_m`` ``(*batch_shape, n)`` in Ohm."""
        return self.log_resistance.exp()

    def forward(self, voltage: Tensor, qd: Tensor) -> Tensor:
        """
        Joint torque (or rack force) produced by the motor voltages.

        :param voltage: motor voltages ``(..., n)`` in V.
        :param qd: joint velocities ``(..., n)`` in rad/s (m/s for a rack and pinion).
        :return: ``tau (..., n)`` in N m (N for a rack and pinion).
        """
        _check_states(self.n, voltage=voltage, qd=qd)
        k_m, r, gear = self.motor_constant, self.pinion_radius, self.gear_ratio
        current = (self.voltage_efficiency * voltage - k_m * gear * qd / r) / self.resistance
        return self.gear_efficiency * gear * self.motor_efficiency * k_m * current / r

    def reflected_inertia(self, rotor_inertia: TensorLike) -> Tensor:
        """
        Rotor inertia seen at the joint, ``eta_g G^2 J_m / r^2`` (Pyrado's convention).

        Add it to the joint's armature (or, for a rack, to the cart mass).

        :param rotor_inertia: ``J_m`` in kg m^2.
        :return: ``(n,)`` in kg m^2 (kg for a rack and pinion).
        """
        J_m = torch.as_tensor(rotor_inertia).to(self.gear_ratio)
        return self.gear_efficiency * self.gear_ratio ** 2 * J_m / self.pinion_radius ** 2

    @classmethod
    def qube_servo2(cls, **kwargs: object) -> 'DCMotor':
        """
        Quanser Qube-Servo 2 motor: ``k_m = 0.042`` N m/A, ``R_m = 8.4`` Ohm, direct drive.

        Matches Pyrado's ``QQubeSim``: ``tau = k_m (V - k_m qd) / R_m`` (see
        ``shared/data/quanser_qube_pyrado/SOURCE.md``). Rotor inertia ``J_m = 4.0e-6`` kg m^2.

        :param kwargs: overrides of the constructor arguments (``dtype``, ``batch_shape``...).
        :return: one motor (``n = 1``).
        """
        args = {'n': 1, 'motor_constant': 0.042, 'resistance': 8.4}
        args.update(kwargs)
        return cls(**args)

    @classmethod
    def quanser_ip02(cls, convention: str = 'pyrado', **kwargs: object) -> 'DCMotor':
        """
        Quanser IP02 cart motor, force on the cart through the rack pinion.

        Constants (Quanser ``config_ip02.m`` and Pyrado ``QCartPoleSim``, see
        ``shared/data/quanser_cartpole_pyrado/SOURCE.md``): ``R_m = 2.6`` Ohm,
        ``k_m = k_t = 7.67e-3``, ``K_g = 3.71``, ``r_mp = 6.35e-3`` m,
        ``eta_g = eta_m = 0.9``. The force is
        ``F = eta_g K_g eta_m k_m (eta_v V - K_g k_m xd / r_mp) / (R_m r_mp)`` with
        ``eta_v = eta_m`` for ``convention='pyrado'`` (``QCartPoleSim._dynamics``, the model the
        recorded cart-pole data was studied with) and ``eta_v = 1`` for ``'quanser'`` (Quanser's
        IP02 courseware). Rotor inertia ``J_m = 3.9e-7`` kg m^2
        (``reflected_inertia`` gives Pyrado's ``J_eq - m_cart``).

        :param convention: ``'pyrado'`` or ``'quanser'``.
        :param kwargs: overrides of the constructor arguments.
        :return: one motor (``n = 1``), force in N for cart velocity in m/s.
        """
        voltage_efficiency = {'pyrado': 0.9, 'quanser': 1.0}
        if convention not in voltage_efficiency:
            raise ValueError(f'unknown IP02 convention {convention!r}; valid: '
                             f"{', '.join(repr(c) for c in voltage_efficiency)}")
        args = {'n': 1, 'motor_constant': 7.67e-3, 'resistance': 2.6, 'gear_ratio': 3.71,
                'gear_efficiency': 0.9, 'motor_efficiency': 0.9,
                'voltage_efficiency': voltage_efficiency[convention], 'pinion_radius': 6.35e-3}
        args.update(kwargs)
        return cls(**args)

    def extra_repr(self) -> str:
        """Return the motor count for ``repr``."""
        return f'n={self.n}'


_FRICTION_MODELS: Dict[str, Type[FrictionModel]] = {
    'none': NoFriction,
    'viscous': ViscousFriction,
    'coulomb': CoulombFriction,
    'stribeck': StribeckFriction,
    'sigmoid': SigmoidFriction,
    'nn-friction': NNFriction,
    'nn-residual': NNResidual,
}


def make_friction(name: str, n: int, **kwargs: object) -> FrictionModel:
    """
    Friction model by registry name.

    :param name: one of ``'none'``, ``'viscous'``, ``'coulomb'``, ``'stribeck'``,
        ``'sigmoid'``, ``'nn-friction'``, ``'nn-residual'``.
    :param n: number of joints.
    :param kwargs: constructor arguments of the chosen class (initial coefficients,
        ``batch_shape``, ``hidden``, ``dtype``, ``device``).
    :return: the friction module.
    """
    try:
        cls = _FRICTION_MODELS[name]
    except (KeyError, TypeError):
        valid = ', '.join(repr(k) for k in _FRICTION_MODELS)
        raise ValueError(f'unknown friction model {name!r}; valid names: {valid}') from None
    return cls(n, **kwargs)
