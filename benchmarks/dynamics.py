"""
Time RNEA, ABA and CRBA on the Panda against Pinocchio and differentiable-robot-model.

For each algorithm and batch size B the script times, per call and per sample:

* ours (``diffsim_ros.core``), float64 and float32, forward only and forward+backward with
  respect to the inertial parameters (``model.inertial`` as a leaf tensor, loss
  ``out.square().sum()``), and a compiled variant when the core exposes one;
* Pinocchio: a Python loop of ``pin.rnea``/``pin.aba``/``pin.crba``, its native batched
  calls (``rneaInParallel``/``abaInParallel`` with a ``ModelPool``; there is no batched
  CRBA), the exact inertial-parameter Jacobian from ``computeJointTorqueRegressor`` (the peer
  of our forward+backward) and the state derivatives ``computeRNEADerivatives`` /
  ``computeABADerivatives`` (the closest native analogue of a backward pass, but with
  respect to the state, not the inertial parameters);
* differentiable-robot-model (float32 only: it hard-codes float32), forward and
  forward+backward with every link's mass, CoM and inertia learnable;
* the core's fused C++ kernels (``diffsim_ros.core.native``: ``rnea_native``,
  ``aba_native``, ``crba_native``), float64, forward and forward+backward, when they
  compile here.

``ours`` is the public API (``diffsim_ros.core.rnea`` etc., which take the native kernels
where they apply); ``torch64`` forces the eager torch path with ``backend='torch'``.  The
"fast by default" section then times what a user calls, through the public API, beside
Pinocchio in the same run: RNEA forward+backward at B = 1024 (gradients w.r.t. q and the
inertial parameters) per sample against Pinocchio's forward-only ``rnea`` loop, ABA at
B = 1 against ``pin.aba``, and RNEA forward+backward at B = 1 (gradients w.r.t. q, qd and
the inertial parameters) against ``computeRNEADerivatives``, with the floor of any
autograd call of that shape; and the Jacobians without autograd at B = 1,
``rnea_derivatives`` against ``computeRNEADerivatives`` and ``aba_derivatives`` against
``computeABADerivatives``.  The floating-base section (:func:`floating_base`) times the
Panda on a free base and a single free body at B = 1 and 1024 through the public API
(``auto``, which takes the native kernels, and ``torch``) beside Pinocchio's free-flyer
(``rnea``, ``aba``, ``crba``, ``computeRNEADerivatives``) in the same run.
``--device cuda`` runs the public API on the GPU at B = 1 to 65536 beside the CPU instead
of the tables (and says so where there is no GPU).

Run ``python benchmarks/dynamics.py [--quick] [--json PATH] [--markdown PATH]
[--device cuda] [--fast-only] [--floating-only]``; ``benchmarks/README.md`` explains the
columns.
"""

import atexit
import contextlib
import io
import os
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple
from xml.etree import ElementTree

import numpy as np
import torch

try:
    from benchmarks import _common
except ImportError:  # run as ``python benchmarks/dynamics.py``: put the repository on the path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks import _common

ALGORITHMS = ('rnea', 'aba', 'crba')
SIZES = (1, 64, 1024, 8192)
QUICK_SIZES = (1, 64, 1024)
#: Compiling takes tens of seconds per shape and grad mode: the compiled variant is timed
#: at these sizes only, and not at all with ``--quick`` or ``--no-compile``.
COMPILED_SIZES = (1, 1024)
TARGET_BATCH = 1024
ABA_B1_LIMIT_US = 150.0
#: Fast-by-default targets (ratios to Pinocchio in the same run): ABA at B = 1 against
#: ``pin.aba``; RNEA forward+backward at B = 1 against ``computeRNEADerivatives``.
ABA_B1_RATIO_LIMIT = 2.0
FB_B1_RATIO_LIMIT = 3.0
#: Batch sizes of ``--device cuda`` (``--quick``: the first, middle and last).
CUDA_SIZES = (1, 16, 256, 4096, 65536)
DRM_SPEEDUP_TARGET = 25.0
SEED = 0
PACKAGES = ('torch', 'numpy', 'pin', 'differentiable-robot-model')

#: (key, header) of the timed columns, in table order.
COLUMNS = (
    ('ours_fwd_f64', 'ours64 fwd'),
    ('ours_fb_f64', 'ours64 f+b'),
    ('ours_fwd_f32', 'ours32 fwd'),
    ('ours_fb_f32', 'ours32 f+b'),
    ('ours_compiled_fwd_f64', 'comp64 fwd'),
    ('ours_compiled_fb_f64', 'comp64 f+b'),
    ('ours_native_fwd_f64', 'native64 fwd'),
    ('ours_native_fb_f64', 'native64 f+b'),
    ('ours_torch_fwd_f64', 'torch64 fwd'),
    ('ours_torch_fb_f64', 'torch64 f+b'),
    ('pin_loop', 'pin loop'),
    ('pin_batched', 'pin batch'),
    ('pin_dpi_loop', 'pin d/dpi'),
    ('pin_dstate_loop', 'pin d/dx'),
    ('drm_fwd_f32', 'drm32 fwd'),
    ('drm_fb_f32', 'drm32 f+b'),
)
#: (key, header) of the ratio columns (per-sample figures, same B).
RATIOS = (
    ('fb64_over_pin_rnea_loop', 'f+b64/pinRNEA'),
    ('fb64_over_pin_rnea_batched', 'f+b64/pinRNEAbatch'),
    ('drm_fb_over_ours_fb_f32', 'drm/ours32 f+b'),
    ('drm_fb_over_ours_fb_f64', 'drm/ours64 f+b'),
    ('native_fb64_over_pin_rnea_loop', 'nat f+b64/pinRNEA'),
    ('native_fb64_over_pin_rnea_batched', 'nat f+b64/pinRNEAbatch'),
)
#: Algorithms with a fused native kernel (``diffsim_ros.core.native``).
NATIVE_ALGORITHMS = ('rnea', 'aba', 'crba')

Inputs = Dict[str, np.ndarray]
Results = Dict[str, Dict[str, Dict[int, _common.Timing]]]


def make_inputs(n: int, batch: int, seed: int = SEED) -> Inputs:
    """
    Draw a batch of states, accelerations and torques with a local generator.

    :param n: number of joints.
    :param batch: batch size B.
    :param seed: seed of the local :class:`numpy.random.Generator`.
    :return: float64 arrays ``q``, ``qd``, ``qdd``, ``tau``, each ``(B, n)``, C-contiguous.
    """
    rng = np.random.default_rng(seed)
    return {
        'q': rng.uniform(-1.0, 1.0, (batch, n)),
        'qd': rng.uniform(-1.0, 1.0, (batch, n)),
        'qdd': rng.uniform(-1.0, 1.0, (batch, n)),
        'tau': rng.uniform(-10.0, 10.0, (batch, n)),
    }


def resolve_urdf(given: Optional[str]) -> Tuple[str, str]:
    """
    Find the Panda URDF file all three engines load.

    :param given: path from ``--urdf``, or ``None``.
    :return: the path and a note on where it came from.
    """
    if given:
        return given, 'given with --urdf'
    try:
        from diffsim_ros.robots import urdf_path
    except ImportError:
        pass
    else:
        return str(urdf_path('panda')), "diffsim_ros.robots.urdf_path('panda')"
    try:
        import diff_robot_data
    except ImportError:
        sys.exit('no Panda URDF: diffsim_ros.robots is missing; pass --urdf PATH')
    bundled = os.path.join(diff_robot_data.__path__[0], 'panda_description', 'urdf',
                           'panda_no_gripper.urdf')
    return _without_massless_leaves(bundled), (
        'diffsim_ros.robots not importable: fallback to the Panda URDF bundled with '
        'differentiable-robot-model (diff_robot_data), massless leaf links removed, '
        'in a temporary file')


def _without_massless_leaves(path: str) -> str:
    """
    Copy a URDF to a temporary file without its massless leaf links and their fixed joints.

    The bundled Panda ends in a zero-mass virtual end-effector link that a loader requiring
    positive masses rejects; dropping it changes no dynamics.

    :param path: URDF file path.
    :return: path of the temporary copy, removed when the process exits.
    """
    tree = ElementTree.parse(path)
    robot = tree.getroot()
    child_links = {joint.find('child').get('link') for joint in robot.iter('joint')}
    parent_links = {joint.find('parent').get('link') for joint in robot.iter('joint')}
    for link in list(robot.findall('link')):
        mass = link.find('inertial/mass')
        name = link.get('name')
        if (mass is not None and float(mass.get('value')) == 0.0 and name in child_links
                and name not in parent_links):
            robot.remove(link)
            for joint in list(robot.findall('joint')):
                if joint.find('child').get('link') == name:
                    robot.remove(joint)
    handle, copy = tempfile.mkstemp(prefix='bench_panda_', suffix='.urdf')
    with os.fdopen(handle, 'wb') as out:
        tree.write(out)
    atexit.register(os.remove, copy)
    return copy


class OursEngine:
    """Callables for ``diffsim_ros.core`` on one URDF."""

    def __init__(self, urdf: str, compile_variant: bool = True) -> None:
        """
        Load the model in float64 and float32 and look for a compiled variant.

        :param urdf: URDF file path.
        :param compile_variant: look for the core's compiled variant at all.
        """
        from diffsim_ros import core
        missing = [name for name in ('load_urdf',) + ALGORITHMS if not hasattr(core, name)]
        if missing:
            raise ImportError(f'diffsim_ros.core lacks {", ".join(missing)}')
        self.core = core
        self.models = {dtype: core.load_urdf(urdf, dtype=dtype)
                       for dtype in (torch.float64, torch.float32)}
        self.n = self.models[torch.float64].n
        self.native, self.native_note = self._find_native()
        if compile_variant:
            self.compiled, self.compiled_note = self._find_compiled()
        else:
            self.compiled = None
            self.compiled_note = 'compiled variant not timed (--quick or --no-compile)'

    def _find_compiled(self) -> Tuple[Optional[Dict[str, Callable[..., torch.Tensor]]], str]:
        names = [name for name in getattr(self.core, '__all__', ()) if 'compile' in name]
        if not names:
            return None, 'diffsim_ros.core exposes no compiled variant: columns skipped'
        factory = getattr(self.core, names[0])
        compiled = {}
        for alg in ALGORITHMS:
            try:  # by name, as compile_algorithm('rnea') takes it, else by function
                compiled[alg] = factory(alg)
            except (TypeError, ValueError, KeyError):
                try:
                    compiled[alg] = factory(getattr(self.core, alg))
                except (TypeError, ValueError, KeyError, AttributeError) as error:
                    return None, f'core.{names[0]} could not wrap {alg}: {error!r}'
        # every size and grad mode is one more compiled entry of the same function
        import torch._dynamo
        dynamo_config = torch._dynamo.config
        dynamo_config.recompile_limit = max(getattr(dynamo_config, 'recompile_limit', 8), 64)
        return compiled, (f'compiled variant: core.{names[0]}, timed at B in '
                          f'{COMPILED_SIZES} after 3 warm-up calls (first-call seconds, '
                          'compilation included, are in the JSON)')

    def _find_native(self) -> Tuple[Optional[Dict[str, Callable[..., torch.Tensor]]], str]:
        try:
            from diffsim_ros.core import native
        except ImportError as error:
            return None, f'native kernels: not importable ({error}); columns skipped'
        start = time.perf_counter()
        available, reason = native.native_available()
        if not available:
            return None, f'native kernels unavailable ({reason}); columns skipped'
        return ({'rnea': native.rnea_native, 'aba': native.aba_native,
                 'crba': native.crba_native},
                'native kernels: diffsim_ros.core.native (fused C++, up to '
                f'{torch.get_num_threads()} threads), built or loaded in '
                f'{time.perf_counter() - start:.1f} s')

    def _function(self, alg: str, compiled: bool, native: bool = False,
                  backend: Optional[str] = None) -> Callable[..., torch.Tensor]:
        if native and self.native is not None:
            return self.native[alg]
        if compiled and self.compiled is not None:
            return self.compiled[alg]
        fn = getattr(self.core, alg)
        if backend is None:
            return fn
        return lambda *args: fn(*args, backend=backend)

    def call(self, alg: str, dtype: torch.dtype, inputs: Inputs, backward: bool,
             compiled: bool = False, native: bool = False, backend: Optional[str] = None,
             state_grads: Sequence[str] = (), device: str = 'cpu') -> Callable[[], Any]:
        """
        Return a no-argument callable running one batched call.

        :param alg: ``'rnea'``, ``'aba'`` or ``'crba'``.
        :param dtype: torch dtype of model and inputs.
        :param inputs: arrays from :func:`make_inputs`.
        :param backward: also back-propagate ``out.square().sum()`` to ``model.inertial``.
        :param compiled: use the core's compiled variant.
        :param native: use the fused native kernel.
        :param backend: the public functions' ``backend=`` (None: their default).
        :param state_grads: with ``backward``, also these of ``'q'``, ``'qd'`` as leaves.
        :param device: ``'cpu'`` or ``'cuda'`` (synchronised after each call).
        :return: the callable.
        """
        fn = self._function(alg, compiled, native, backend)
        tensors = {k: torch.as_tensor(v, dtype=dtype, device=device) for k, v in inputs.items()}
        model = self.models[dtype].to(device=device)
        inertial = model.inertial.detach().clone()
        leaves = [inertial]
        if backward:
            for key in state_grads:
                tensors[key].requires_grad_(True)
                leaves.append(tensors[key])
            inertial.requires_grad_(True)
        model = model.replace(inertial=inertial)
        q, qd, qdd, tau = tensors['q'], tensors['qd'], tensors['qdd'], tensors['tau']
        forward = {
            'rnea': lambda: fn(model, q, qd, qdd),
            'aba': lambda: fn(model, q, qd, tau),
            'crba': lambda: fn(model, q),
        }[alg]
        sync = torch.cuda.synchronize if device != 'cpu' else (lambda: None)
        if not backward:
            def run_forward() -> torch.Tensor:
                with torch.no_grad():
                    out = forward()
                sync()
                return out
            return run_forward

        def run_backward() -> None:
            for leaf in leaves:
                leaf.grad = None
            forward().square().sum().backward()
            sync()
        return run_backward

    def outputs(self, inputs: Inputs) -> Dict[str, np.ndarray]:
        """
        Evaluate the three algorithms in float64 for the agreement check.

        :param inputs: arrays from :func:`make_inputs`.
        :return: ``rnea``, ``aba`` ``(B, n)`` and ``crba`` ``(B, n, n)`` as arrays.
        """
        return {alg: self.call(alg, torch.float64, inputs, False)().numpy()
                for alg in ALGORITHMS}

    def native_outputs(self, inputs: Inputs) -> Dict[str, np.ndarray]:
        """
        Evaluate the native kernels in float64 for the agreement check.

        :param inputs: arrays from :func:`make_inputs`.
        :return: ``rnea``, ``aba`` ``(B, n)`` and ``crba`` ``(B, n, n)`` as arrays (empty
            without the kernels).
        """
        if self.native is None:
            return {}
        return {alg: self.call(alg, torch.float64, inputs, False, native=True)().numpy()
                for alg in NATIVE_ALGORITHMS}


class PinocchioEngine:
    """Callables for Pinocchio (float64) on one URDF."""

    def __init__(self, urdf: str, threads: int) -> None:
        """
        Build the model, a gravity-free copy for the CRBA Jacobian, data and a pool.

        :param urdf: URDF file path.
        :param threads: threads for the native parallel calls.
        """
        import pinocchio as pin
        self.pin = pin
        self.model = pin.buildModelFromUrdf(urdf)
        self.data = self.model.createData()
        self.model_no_gravity = pin.Model(self.model)
        self.model_no_gravity.gravity = pin.Motion.Zero()
        self.data_no_gravity = self.model_no_gravity.createData()
        self.n = self.model.nv
        self.threads = threads
        has_parallel = hasattr(pin, 'ModelPool') and hasattr(pin, 'rneaInParallel')
        self.pool = pin.ModelPool(self.model, threads) if has_parallel else None
        self.batched_note = (
            'pin batched: rneaInParallel/abaInParallel with a ModelPool of '
            f'{threads} threads; Pinocchio has no batched CRBA'
            if has_parallel else 'pin batched: this Pinocchio has no rneaInParallel')

    def _rows(self, inputs: Inputs, second: str) -> List[Tuple[np.ndarray, ...]]:
        return list(zip(inputs['q'], inputs['qd'], inputs[second]))

    def loop(self, alg: str, inputs: Inputs) -> Callable[[], Any]:
        """
        Return a Python loop of the single-sample call over the batch.

        :param alg: ``'rnea'``, ``'aba'`` or ``'crba'``.
        :param inputs: arrays from :func:`make_inputs`.
        :return: the callable.
        """
        pin, model, data = self.pin, self.model, self.data
        if alg == 'crba':
            qs = list(inputs['q'])

            def run_crba() -> None:
                for q in qs:
                    pin.crba(model, data, q)
            return run_crba
        fn = pin.rnea if alg == 'rnea' else pin.aba
        rows = self._rows(inputs, 'qdd' if alg == 'rnea' else 'tau')

        def run() -> None:
            for q, qd, x in rows:
                fn(model, data, q, qd, x)
        return run

    def batched(self, alg: str, inputs: Inputs) -> Optional[Callable[[], Any]]:
        """
        Return Pinocchio's native batched call, or ``None`` where it has none.

        :param alg: ``'rnea'``, ``'aba'`` or ``'crba'``.
        :param inputs: arrays from :func:`make_inputs`.
        :return: the callable or ``None``.
        """
        if self.pool is None or alg == 'crba':
            return None
        fn = self.pin.rneaInParallel if alg == 'rnea' else self.pin.abaInParallel
        q, qd = (np.asfortranarray(inputs[k].T) for k in ('q', 'qd'))
        x = np.asfortranarray(inputs['qdd' if alg == 'rnea' else 'tau'].T)
        out = np.zeros_like(q, order='F')
        threads, pool = self.threads, self.pool
        return lambda: fn(threads, pool, q, qd, x, out)

    def inertial_jacobian(self, alg: str, inputs: Inputs) -> Callable[[], Any]:
        """
        Return a loop computing the exact Jacobian of the output w.r.t. the inertial params.

        RNEA: the joint-torque regressor ``Y`` (``tau = Y pi``). ABA: ``-M^-1 Y(q, qd, qdd)``
        after an ABA call. CRBA: column j of M is ``Y(q, 0, e_j) pi`` without gravity, so n
        regressor calls. This is more than a backward pass needs (a full Jacobian, not one
        vector-Jacobian product), and it is Pinocchio's own way to these gradients.

        :param alg: ``'rnea'``, ``'aba'`` or ``'crba'``.
        :param inputs: arrays from :func:`make_inputs`.
        :return: the callable.
        """
        pin, model, data = self.pin, self.model, self.data
        regressor = pin.computeJointTorqueRegressor
        if alg == 'rnea':
            rows = self._rows(inputs, 'qdd')

            def run_rnea() -> None:
                for q, qd, qdd in rows:
                    regressor(model, data, q, qd, qdd)
            return run_rnea
        if alg == 'aba':
            rows = self._rows(inputs, 'tau')

            def run_aba() -> None:
                for q, qd, tau in rows:
                    qdd = pin.aba(model, data, q, qd, tau)
                    minv = pin.computeMinverse(model, data, q)
                    -minv @ regressor(model, data, q, qd, qdd)
            return run_aba
        model0, data0 = self.model_no_gravity, self.data_no_gravity
        zero = np.zeros(self.n)
        units = list(np.eye(self.n))
        qs = list(inputs['q'])

        def run_crba() -> None:
            for q in qs:
                for unit in units:
                    regressor(model0, data0, q, zero, unit)
        return run_crba

    def state_derivatives(self, alg: str, inputs: Inputs) -> Optional[Callable[[], Any]]:
        """
        Return a loop of ``computeRNEADerivatives``/``computeABADerivatives`` (w.r.t. state).

        :param alg: ``'rnea'``, ``'aba'`` or ``'crba'`` (none for CRBA).
        :param inputs: arrays from :func:`make_inputs`.
        :return: the callable or ``None``.
        """
        if alg == 'crba':
            return None
        pin, model, data = self.pin, self.model, self.data
        fn = pin.computeRNEADerivatives if alg == 'rnea' else pin.computeABADerivatives
        rows = self._rows(inputs, 'qdd' if alg == 'rnea' else 'tau')

        def run() -> None:
            for q, qd, x in rows:
                fn(model, data, q, qd, x)
        return run

    def outputs(self, inputs: Inputs) -> Dict[str, np.ndarray]:
        """
        Evaluate the three algorithms for the agreement check.

        :param inputs: arrays from :func:`make_inputs`.
        :return: ``rnea``, ``aba`` ``(B, n)`` and ``crba`` ``(B, n, n)``.
        """
        pin, model, data = self.pin, self.model, self.data
        rnea, aba, crba = [], [], []
        for q, qd, qdd, tau in zip(inputs['q'], inputs['qd'], inputs['qdd'], inputs['tau']):
            rnea.append(pin.rnea(model, data, q, qd, qdd).copy())
            aba.append(pin.aba(model, data, q, qd, tau).copy())
            upper = np.triu(pin.crba(model, data, q))
            crba.append(upper + np.triu(upper, 1).T)
        return {'rnea': np.stack(rnea), 'aba': np.stack(aba), 'crba': np.stack(crba)}


class DrmEngine:
    """Callables for differentiable-robot-model (float32 only) on one URDF."""

    def __init__(self, urdf: str) -> None:
        """
        Load the model and make every non-root link's mass, CoM and inertia learnable.

        The plainest parametrisations (``UnconstrainedScalar``/``UnconstrainedTensor``
        initialised at the URDF values) keep its backward as cheap as it can be.  A link
        without ``<inertial>`` (a flange frame) starts at zero mass and inertia, as in the
        URDF spec and the other engines; the package itself would give it 1 kg and 1 kg m^2.

        :param urdf: URDF file path.
        """
        from differentiable_robot_model.rigid_body_params import (
            UnconstrainedScalar, UnconstrainedTensor)
        from differentiable_robot_model.robot_model import DifferentiableRobotModel
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):  # its per-link warnings, answered below
            self.robot = DifferentiableRobotModel(urdf, 'panda')
        self.load_messages = [line for line in printed.getvalue().splitlines() if line]
        self.n = self.robot._n_dofs
        links = {link.name: link for link in self.robot._urdf_model.robot.links}
        for body in list(self.robot._bodies)[1:]:
            mass, com, inertia = (v.detach().clone()
                                  for v in body.inertia._get_parameter_values())
            if links[body.name].inertial is None:
                mass, com, inertia = (torch.zeros_like(v) for v in (mass, com, inertia))
            self.robot.make_link_param_learnable(body.name, 'mass', UnconstrainedScalar(mass))
            self.robot.make_link_param_learnable(
                body.name, 'com', UnconstrainedTensor(1, 3, com.reshape(1, 3)))
            self.robot.make_link_param_learnable(
                body.name, 'inertia_mat', UnconstrainedTensor(3, 3, inertia.reshape(3, 3)))
        self.parameters = list(self.robot.parameters())

    def _forward(self, alg: str, inputs: Inputs) -> Callable[[], torch.Tensor]:
        robot = self.robot
        t = {k: torch.as_tensor(v, dtype=torch.float32) for k, v in inputs.items()}
        if alg == 'rnea':
            return lambda: robot.compute_inverse_dynamics(
                t['q'], t['qd'], t['qdd'], include_gravity=True, use_damping=False)
        if alg == 'aba':
            return lambda: robot.compute_forward_dynamics(
                t['q'], t['qd'], t['tau'], include_gravity=True, use_damping=False)
        # gravity cancels out of M: leaving it out saves DRM one inverse-dynamics call
        return lambda: robot.compute_lagrangian_inertia_matrix(
            t['q'], include_gravity=False, use_damping=False)

    def call(self, alg: str, inputs: Inputs, backward: bool) -> Callable[[], Any]:
        """
        Return a no-argument callable running one batched call.

        :param alg: ``'rnea'``, ``'aba'`` or ``'crba'``.
        :param inputs: arrays from :func:`make_inputs`.
        :param backward: also back-propagate ``out.square().sum()`` to the link parameters.
        :return: the callable.
        """
        forward = self._forward(alg, inputs)
        if not backward:
            def run_forward() -> torch.Tensor:
                with torch.no_grad():
                    return forward()
            return run_forward
        parameters = self.parameters

        def run_backward() -> None:
            for parameter in parameters:
                parameter.grad = None
            forward().square().sum().backward()
        return run_backward

    def outputs(self, inputs: Inputs) -> Dict[str, np.ndarray]:
        """
        Evaluate the three algorithms for the agreement check.

        :param inputs: arrays from :func:`make_inputs`.
        :return: ``rnea``, ``aba`` ``(B, n)`` and ``crba`` ``(B, n, n)`` as float64 arrays.
        """
        return {alg: self.call(alg, inputs, False)().double().numpy() for alg in ALGORITHMS}


def load_engines(urdf: str, threads: int,
                 compile_variant: bool = True) -> Tuple[Dict[str, Any], List[str]]:
    """
    Load every engine that imports; note the ones that do not.

    :param urdf: URDF file path.
    :param threads: threads for Pinocchio's parallel calls.
    :param compile_variant: time the core's compiled variant if it has one.
    :return: engines by name (``ours``, ``pin``, ``drm``) and notes.
    """
    engines: Dict[str, Any] = {}
    notes: List[str] = []
    loaders = (('ours', lambda: OursEngine(urdf, compile_variant)),
               ('pin', lambda: PinocchioEngine(urdf, threads)),
               ('drm', lambda: DrmEngine(urdf)))
    for name, loader in loaders:
        try:
            engines[name] = loader()
        except ImportError as error:
            notes.append(f'{name}: not importable ({error}); its columns are skipped')
    sizes = {name: engine.n for name, engine in engines.items()}
    if len(set(sizes.values())) > 1:
        sys.exit(f'engines disagree on the number of joints: {sizes}')
    if 'ours' in engines:
        notes.append(engines['ours'].compiled_note)
        notes.append(engines['ours'].native_note)
    if 'pin' in engines:
        notes.append(engines['pin'].batched_note)
    if 'drm' in engines and engines['drm'].load_messages:
        notes.append('differentiable-robot-model said at load: '
                     + ' / '.join(engines['drm'].load_messages)
                     + ' -- the benchmark sets links without <inertial> to zero inertia')
    return engines, notes


def measure(engines: Dict[str, Any], sizes: Sequence[int], quick: bool,
            progress: Callable[[str], None]) -> Tuple[Results, Dict[str, Dict[str, float]]]:
    """
    Time every available column for every algorithm and batch size.

    :param engines: from :func:`load_engines`.
    :param sizes: batch sizes B.
    :param quick: short budgets; one timed repeat for differentiable-robot-model.
    :param progress: called with a short status line before each batch size.
    :return: ``results[alg][column][B]``, and the compiled variant's first-call seconds
        (compilation included) as ``{'alg column B': seconds}`` by algorithm.
    """
    n = next(iter(engines.values())).n
    results: Results = {alg: {key: {} for key, _ in COLUMNS} for alg in ALGORITHMS}
    first_calls: Dict[str, Dict[str, float]] = {alg: {} for alg in ALGORITHMS}
    for batch in sizes:
        inputs = make_inputs(n, batch)
        progress(f'B={batch}')
        for alg in ALGORITHMS:
            for key, fn, repeats in _cases(engines, alg, inputs, quick):
                warmup = 1 if quick or key.startswith('drm') else 2
                if 'compiled' in key:
                    if batch not in COMPILED_SIZES:
                        continue
                    start = time.perf_counter()
                    fn()
                    first_calls[alg][f'{key} B={batch}'] = time.perf_counter() - start
                    warmup = 3  # the first calls may recompile once more
                results[alg][key][batch] = _common.time_call(
                    fn, quick=quick, min_repeats=repeats, warmup=warmup)
    return results, first_calls


def _cases(engines: Dict[str, Any], alg: str, inputs: Inputs,
           quick: bool) -> List[Tuple[str, Callable[[], Any], int]]:
    cases: List[Tuple[str, Optional[Callable[[], Any]], int]] = []
    ours = engines.get('ours')
    if ours is not None:
        for dtype, tag in ((torch.float64, 'f64'), (torch.float32, 'f32')):
            cases.append((f'ours_fwd_{tag}', ours.call(alg, dtype, inputs, False), 3))
            cases.append((f'ours_fb_{tag}', ours.call(alg, dtype, inputs, True), 3))
        if ours.compiled is not None:
            cases.append(('ours_compiled_fwd_f64',
                          ours.call(alg, torch.float64, inputs, False, compiled=True), 3))
            cases.append(('ours_compiled_fb_f64',
                          ours.call(alg, torch.float64, inputs, True, compiled=True), 3))
        cases.append(('ours_torch_fwd_f64',
                      ours.call(alg, torch.float64, inputs, False, backend='torch'), 3))
        cases.append(('ours_torch_fb_f64',
                      ours.call(alg, torch.float64, inputs, True, backend='torch'), 3))
        if ours.native is not None and alg in NATIVE_ALGORITHMS:
            cases.append(('ours_native_fwd_f64',
                          ours.call(alg, torch.float64, inputs, False, native=True), 3))
            cases.append(('ours_native_fb_f64',
                          ours.call(alg, torch.float64, inputs, True, native=True), 3))
    pin = engines.get('pin')
    if pin is not None:
        cases.append(('pin_loop', pin.loop(alg, inputs), 3))
        cases.append(('pin_batched', pin.batched(alg, inputs), 3))
        cases.append(('pin_dpi_loop', pin.inertial_jacobian(alg, inputs), 3))
        cases.append(('pin_dstate_loop', pin.state_derivatives(alg, inputs), 3))
    drm = engines.get('drm')
    if drm is not None:
        repeats = 1 if quick else 3
        cases.append(('drm_fwd_f32', drm.call(alg, inputs, False), repeats))
        cases.append(('drm_fb_f32', drm.call(alg, inputs, True), repeats))
    return [(key, fn, repeats) for key, fn, repeats in cases if fn is not None]


def per_sample_us(results: Results, alg: str, key: str, batch: int) -> Optional[float]:
    """
    Return microseconds per sample of one column, or ``None`` if it was not measured.

    :param results: from :func:`measure`.
    :param alg: algorithm name.
    :param key: column key.
    :param batch: batch size B.
    :return: microseconds per sample.
    """
    timing = results[alg][key].get(batch)
    return None if timing is None else timing.seconds * 1e6 / batch


def _quotient(numerator: Optional[float], denominator: Optional[float]) -> Optional[float]:
    if numerator is None or denominator is None or denominator <= 0.0:
        return None
    return numerator / denominator


def ratios(results: Results, alg: str, batch: int) -> Dict[str, Optional[float]]:
    """
    Compute the ratio columns of one algorithm at one batch size (per-sample figures).

    :param results: from :func:`measure`.
    :param alg: algorithm name.
    :param batch: batch size B.
    :return: ratio by key (see :data:`RATIOS`); ``None`` where a side is missing.
    """
    def sample(a: str, key: str) -> Optional[float]:
        return per_sample_us(results, a, key, batch)
    fb64 = sample(alg, 'ours_fb_f64')
    native_fb64 = sample(alg, 'ours_native_fb_f64')
    drm_fb = sample(alg, 'drm_fb_f32')
    return {
        'fb64_over_pin_rnea_loop': _quotient(fb64, sample('rnea', 'pin_loop')),
        'fb64_over_pin_rnea_batched': _quotient(fb64, sample('rnea', 'pin_batched')),
        'drm_fb_over_ours_fb_f32': _quotient(drm_fb, sample(alg, 'ours_fb_f32')),
        'drm_fb_over_ours_fb_f64': _quotient(drm_fb, fb64),
        'native_fb64_over_pin_rnea_loop': _quotient(native_fb64, sample('rnea', 'pin_loop')),
        'native_fb64_over_pin_rnea_batched': _quotient(native_fb64,
                                                       sample('rnea', 'pin_batched')),
    }


def targets(results: Results) -> List[_common.Target]:
    """
    Evaluate the issue's targets.

    :param results: from :func:`measure`.
    :return: one :class:`_common.Target` per line.
    """
    lines = []
    b = TARGET_BATCH
    for alg in ALGORITHMS:
        for tag in ('f64', 'f32'):
            fb = per_sample_us(results, alg, f'ours_fb_{tag}', b)
            for pin_key, label in (('pin_loop', 'loop'), ('pin_batched', 'batched')):
                lines.append(_common.Target(
                    f'{alg} {tag} fwd+bwd/sample at B={b} vs pin RNEA fwd/sample ({label})',
                    _quotient(fb, per_sample_us(results, 'rnea', pin_key, b)), 1.0, 'x'))
    for alg in NATIVE_ALGORITHMS:
        fb = per_sample_us(results, alg, 'ours_native_fb_f64', b)
        if fb is None:
            continue
        for pin_key, label in (('pin_loop', 'loop'), ('pin_batched', 'batched')):
            lines.append(_common.Target(
                f'{alg} native f64 fwd+bwd/sample at B={b} vs pin RNEA fwd/sample ({label})',
                _quotient(fb, per_sample_us(results, 'rnea', pin_key, b)), 1.0, 'x'))
        drm_fb = per_sample_us(results, alg, 'drm_fb_f32', b)
        lines.append(_common.Target(
            f'{alg} drm f+b / ours native f64 f+b per sample at B={b}',
            _quotient(drm_fb, fb), DRM_SPEEDUP_TARGET, 'x', at_most=False))
    for alg in ALGORITHMS:
        for tag in ('f32', 'f64'):
            lines.append(_common.Target(
                f'{alg} drm f+b / ours {tag} f+b per sample at B={b}',
                ratios(results, alg, b)[f'drm_fb_over_ours_fb_{tag}'],
                DRM_SPEEDUP_TARGET, 'x', at_most=False))
    for key in ('ours_fwd_f64', 'ours_fwd_f32', 'ours_compiled_fwd_f64', 'ours_native_fwd_f64'):
        timing = results['aba'][key].get(1)
        if timing is None and ('compiled' in key or 'native' in key):
            continue
        lines.append(_common.Target(
            f'aba {key} at B=1 per call', None if timing is None else timing.seconds * 1e6,
            ABA_B1_LIMIT_US, 'us'))
    return lines


class _Identity(torch.autograd.Function):
    """A no-op autograd node with the public functions' inputs: the floor of any call."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, qd: torch.Tensor, x: torch.Tensor,
                inertial: torch.Tensor) -> torch.Tensor:
        ctx.shapes = inertial.shape
        return q.clone()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        return grad, grad, None, grad.new_zeros(ctx.shapes)


def _autograd_floor(ours: 'OursEngine', inputs: Inputs) -> Callable[[], Any]:
    """Return the forward+backward of :class:`_Identity` shaped like a B = 1 RNEA call."""
    model = ours.models[torch.float64]
    q, qd, qdd = (torch.as_tensor(inputs[k]).requires_grad_(k != 'qdd')
                  for k in ('q', 'qd', 'qdd'))
    inertial = model.inertial.detach().clone().requires_grad_()

    def run() -> None:
        for leaf in (q, qd, inertial):
            leaf.grad = None
        _Identity.apply(q, qd, qdd, inertial).square().sum().backward()
    return run


def _plain_call(ours: 'OursEngine', alg: str, inputs: Inputs,
                backend: str) -> Callable[[], Any]:
    """
    Return one public call as a loop would make it: grad mode on, no input requiring grad.

    (:meth:`OursEngine.call` wraps forward calls in ``torch.no_grad()``, which costs about
    1.5 us by itself: a fifth of a B = 1 call.)
    """
    fn = getattr(ours.core, alg)
    model = ours.models[torch.float64]
    last = 'qdd' if alg == 'rnea' else 'tau'
    q, qd, x = (torch.as_tensor(inputs[k]) for k in ('q', 'qd', last))
    return lambda: fn(model, q, qd, x, backend=backend)


def _derivatives_call(ours: 'OursEngine', alg: str, inputs: Inputs,
                      backend: str, **options) -> Callable[[], Any]:
    """Return one public ``rnea_derivatives``/``aba_derivatives`` call (Jacobians, no autograd)."""
    fn = getattr(ours.core, f'{alg}_derivatives')
    model = ours.models[torch.float64]
    last = 'qdd' if alg == 'rnea' else 'tau'
    q, qd, x = (torch.as_tensor(inputs[k]) for k in ('q', 'qd', last))
    return lambda: fn(model, q, qd, x, backend=backend, **options)


def fast_by_default(engines: Dict[str, Any],
                    quick: bool) -> Tuple[List[str], List[_common.Target], Dict[str, float]]:
    """
    Time the issue's three fast-by-default cases through the public API beside Pinocchio.

    The public functions run with their default backend (``auto``) and, for comparison,
    with ``backend='torch'``; forward+backward back-propagates ``out.square().sum()`` to
    ``model.inertial`` and the named states, as a fit does.

    :param engines: from :func:`load_engines` (needs ``ours`` and ``pin``).
    :param quick: short budgets.
    :return: printed lines, target lines and the figures in microseconds by name.
    """
    ours, pin = engines.get('ours'), engines.get('pin')
    if ours is None or pin is None:
        return ['needs both diffsim_ros and Pinocchio: skipped'], [], {}
    n, b = ours.n, TARGET_BATCH
    big, one = make_inputs(n, b), make_inputs(n, 1, seed=SEED + 2)
    single = {k: v[0] for k, v in one.items()}
    pm, pd = pin.model, pin.data
    q1, qd1, qdd1, tau1 = (single[k] for k in ('q', 'qd', 'qdd', 'tau'))
    cases = {
        'pin rnea loop B=1024 (per sample)': (pin.loop('rnea', big), b),
        'pin aba B=1': (lambda: pin.pin.aba(pm, pd, q1, qd1, tau1), 1),
        'pin computeRNEADerivatives B=1': (
            lambda: pin.pin.computeRNEADerivatives(pm, pd, q1, qd1, qdd1), 1),
        'pin computeABADerivatives B=1': (
            lambda: pin.pin.computeABADerivatives(pm, pd, q1, qd1, tau1), 1),
        'autograd floor f+b B=1 (no-op node)': (_autograd_floor(ours, one), 1),
    }
    for backend in ('auto', 'torch'):
        cases[f'{backend}: rnea f+b (q, pi) B=1024 (per sample)'] = (ours.call(
            'rnea', torch.float64, big, True, backend=backend, state_grads=('q',)), b)
        cases[f'{backend}: aba B=1'] = (_plain_call(ours, 'aba', one, backend), 1)
        cases[f'{backend}: rnea f+b (q, qd, pi) B=1'] = (ours.call(
            'rnea', torch.float64, one, True, backend=backend, state_grads=('q', 'qd')), 1)
        for alg in ('rnea', 'aba'):
            cases[f'{backend}: {alg}_derivatives B=1'] = (
                _derivatives_call(ours, alg, one, backend), 1)
        # The B = 1 case in full: derivatives w.r.t. q, qd and the parameters.
        cases[f'{backend}: rnea_derivatives + regressor B=1'] = (
            _derivatives_call(ours, 'rnea', one, backend, regressor=True), 1)
    figures = {name: _common.time_call(fn, quick=quick, min_repeats=5, warmup=3).seconds
               * 1e6 / per for name, (fn, per) in cases.items()}
    lines = [f'{name}: {_common.fmt_number(us)} us' for name, us in figures.items()]
    lines.insert(0, 'default backend here: ' + ours.core.get_backend())
    found = [
        _common.Target(f'public rnea f+b (q, inertial) per sample at B={b} / pin rnea loop '
                       'per sample (forward only)',
                       _quotient(figures[f'auto: rnea f+b (q, pi) B={b} (per sample)'],
                                 figures[f'pin rnea loop B={b} (per sample)']), 1.0, 'x'),
        _common.Target('public aba at B=1 / pin.aba',
                       _quotient(figures['auto: aba B=1'], figures['pin aba B=1']),
                       ABA_B1_RATIO_LIMIT, 'x'),
        _common.Target('public rnea f+b (q, qd, inertial) at B=1 / pin computeRNEADerivatives',
                       _quotient(figures['auto: rnea f+b (q, qd, pi) B=1'],
                                 figures['pin computeRNEADerivatives B=1']),
                       FB_B1_RATIO_LIMIT, 'x'),
        _common.Target('public rnea_derivatives at B=1 / pin computeRNEADerivatives',
                       _quotient(figures['auto: rnea_derivatives B=1'],
                                 figures['pin computeRNEADerivatives B=1']),
                       FB_B1_RATIO_LIMIT, 'x'),
        _common.Target('public rnea_derivatives(regressor=True) (d tau / d q, qd, qdd and '
                       'inertials) at B=1 / pin computeRNEADerivatives',
                       _quotient(figures['auto: rnea_derivatives + regressor B=1'],
                                 figures['pin computeRNEADerivatives B=1']),
                       FB_B1_RATIO_LIMIT, 'x'),
        _common.Target('public aba_derivatives at B=1 / pin computeABADerivatives',
                       _quotient(figures['auto: aba_derivatives B=1'],
                                 figures['pin computeABADerivatives B=1']),
                       FB_B1_RATIO_LIMIT, 'x'),
    ]
    return lines, found, figures


FLOATING_TITLE = 'floating base: the public API beside Pinocchio free-flyer, same run'
#: Batch sizes of the floating-base section.
FLOATING_SIZES = (1, 1024)
#: The single free body of the floating-base section: one link, its inertial off its origin.
FREE_BODY_URDF = (
    '<robot name="free_body"><link name="body"><inertial>'
    '<origin xyz="0.01 -0.02 0.03" rpy="0.1 0.2 0.3"/><mass value="0.37"/>'
    '<inertia ixx="6.8e-4" ixy="1e-5" ixz="-2e-5" iyy="6.7e-4" iyz="3e-5" izz="6.9e-4"/>'
    '</inertial></link></robot>')


def floating_states(nq: int, nv: int, batch: int, seed: int = SEED) -> Dict[str, np.ndarray]:
    """
    Draw free-flyer states ``q = [p, unit quaternion (x, y, z, w), joints]``, ``qd``, ...

    :param nq: configuration size.
    :param nv: velocity size.
    :param batch: number of samples.
    :param seed: random seed.
    :return: ``q (batch, nq)``, ``qd``, ``qdd``, ``tau`` ``(batch, nv)``, float64.
    """
    rng = np.random.default_rng(seed)
    q = rng.uniform(-1.0, 1.0, (batch, nq))
    q[:, 3:7] /= np.linalg.norm(q[:, 3:7], axis=1, keepdims=True)
    out = {'q': q}
    for key in ('qd', 'qdd', 'tau'):
        out[key] = rng.uniform(-1.0, 1.0, (batch, nv))
    return out


def _floating_case(label: str, model: Any, pin_model: Any, core: Any, pin: Any, batch: int,
                   quick: bool) -> Dict[str, float]:
    """Time one floating-base model at one batch size; return microseconds per sample."""
    states = floating_states(model.nq, model.nv, batch)
    q, qd, qdd, tau = (torch.as_tensor(states[k]) for k in ('q', 'qd', 'qdd', 'tau'))
    data = pin_model.createData()
    rows = [tuple(states[k][b] for k in ('q', 'qd', 'qdd', 'tau')) for b in range(batch)]
    inertial = model.inertial.detach().clone().requires_grad_()
    learnable = model.replace(inertial=inertial)

    def fb(backend: str) -> Callable[[], Any]:
        def run() -> None:
            leaves = (q.clone().requires_grad_(), qd.clone().requires_grad_())
            inertial.grad = None
            core.rnea(learnable, *leaves, qdd, backend=backend).square().sum().backward()
        return run

    cases: Dict[str, Callable[[], Any]] = {
        'pin rnea': lambda: [pin.rnea(pin_model, data, a, b, c) for a, b, c, _ in rows],
        'pin aba': lambda: [pin.aba(pin_model, data, a, b, d) for a, b, _, d in rows],
        'pin crba': lambda: [pin.crba(pin_model, data, a) for a, _, _, _ in rows],
        'pin computeRNEADerivatives': lambda: [
            pin.computeRNEADerivatives(pin_model, data, a, b, c) for a, b, c, _ in rows],
    }
    for backend in ('auto', 'torch'):
        cases[f'{backend} rnea'] = lambda bk=backend: core.rnea(model, q, qd, qdd, backend=bk)
        cases[f'{backend} aba'] = lambda bk=backend: core.aba(model, q, qd, tau, backend=bk)
        cases[f'{backend} crba'] = lambda bk=backend: core.crba(model, q, backend=bk)
        cases[f'{backend} rnea f+b (q, qd, pi)'] = fb(backend)
    return {f'{label} B={batch}: {name}':
            _common.time_call(fn, quick=quick, min_repeats=3, warmup=2).seconds * 1e6 / batch
            for name, fn in cases.items()}


def floating_base(urdf: str, quick: bool) -> Tuple[List[str], Dict[str, float]]:
    """
    Time floating-base RNEA, ABA, CRBA and RNEA forward+backward beside Pinocchio's free-flyer.

    The Panda mounted on a free base and a single free body (:data:`FREE_BODY_URDF`), at
    :data:`FLOATING_SIZES`: the public functions under ``auto`` (the native kernels) and
    forced to ``torch``, and Pinocchio's ``rnea``/``aba``/``crba``/``computeRNEADerivatives``
    in a Python loop over the samples (``pin.buildModel(urdf, pin.JointModelFreeFlyer())``),
    in the same run; figures per sample, with the ratios to Pinocchio.  RNEA forward+backward
    back-propagates ``out.square().sum()`` to q, qd and ``model.inertial`` (Pinocchio's
    ``computeRNEADerivatives`` gives the state Jacobians, not the parameter ones).

    :param urdf: the Panda's URDF path.
    :param quick: short budgets.
    :return: printed lines and the figures in microseconds per sample by name.
    """
    try:
        import pinocchio as pin
        from diffsim_ros import core
    except ImportError as error:
        return [f'needs diffsim_ros and Pinocchio ({error}): skipped'], {}
    with open(urdf, encoding='utf-8') as handle:
        panda = handle.read()
    models = {'panda free base': panda, 'free body': FREE_BODY_URDF}
    lines, figures = [], {}
    for label, xml in models.items():
        model = core.load_urdf(xml=xml, dtype=torch.float64, floating_base=True)
        pin_model = pin.buildModelFromXML(xml, pin.JointModelFreeFlyer())
        # same coordinates (the Panda's joints are revolute, in model order): say so by value
        check = floating_states(model.nq, model.nv, 1, seed=SEED + 1)
        ours = core.rnea(model, *(torch.as_tensor(check[k][0]) for k in ('q', 'qd', 'qdd')))
        theirs = pin.rnea(pin_model, pin_model.createData(),
                          *(check[k][0] for k in ('q', 'qd', 'qdd')))
        lines.append(f'{label}: nq={model.nq}, nv={model.nv}; rnea max |ours - pin| = '
                     f'{float(np.abs(ours.numpy() - theirs).max()):.1e}')
        for batch in FLOATING_SIZES:
            figures.update(_floating_case(label, model, pin_model, core, pin, batch, quick))
    for name, us in figures.items():
        lines.append(f'{name}: {_common.fmt_number(us)} us/sample')
    pairs = (('rnea', 'pin rnea'), ('aba', 'pin aba'), ('crba', 'pin crba'),
             ('rnea f+b (q, qd, pi)', 'pin computeRNEADerivatives'))
    for label in models:
        for batch in FLOATING_SIZES:
            key = f'{label} B={batch}: '
            for ours, theirs in pairs:
                auto, eager = figures[key + 'auto ' + ours], figures[key + 'torch ' + ours]
                lines.append(f'{key}{ours}: auto / {theirs} = '
                             f'{_common.fmt_number(_quotient(auto, figures[key + theirs]))}x, '
                             f'torch / {theirs} = '
                             f'{_common.fmt_number(_quotient(eager, figures[key + theirs]))}x, '
                             f'torch / auto = {_common.fmt_number(_quotient(eager, auto))}x')
    return lines, figures


def cuda_sweep(engines: Dict[str, Any], quick: bool) -> Tuple[List[str], Dict[str, Any]]:
    """
    Time the public RNEA and ABA on the GPU at B = 1 ... 65536 beside the CPU.

    Forward (no grad) and forward+backward (gradients w.r.t. q and the inertial
    parameters), float64 and float32 on the GPU, float64 on the CPU (the default backend).

    :param engines: from :func:`load_engines` (needs ``ours``).
    :param quick: short budgets, three sizes.
    :return: the table as text lines and the figures (us per call) by row and column.
    """
    ours = engines.get('ours')
    if ours is None:
        return ['diffsim_ros not importable: skipped'], {}
    if not torch.cuda.is_available():
        return ['no CUDA device here: --device cuda skipped'], {}
    sizes = (CUDA_SIZES[0], CUDA_SIZES[len(CUDA_SIZES) // 2], CUDA_SIZES[-1]) if quick \
        else CUDA_SIZES
    columns = [(device, dtype, backward) for device, dtype in (
        ('cpu', torch.float64), ('cuda', torch.float64), ('cuda', torch.float32))
        for backward in (False, True)]
    headers = ['alg', 'B'] + [f'{d} {str(t)[-7:]} {"f+b" if bw else "fwd"}'
                              for d, t, bw in columns]
    rows, figures = [], {}
    for alg in ('rnea', 'aba'):
        for batch in sizes:
            inputs = make_inputs(ours.n, batch)
            row = [alg, str(batch)]
            for device, dtype, backward in columns:
                fn = ours.call(alg, dtype, inputs, backward, device=device,
                               state_grads=('q',))
                us = _common.time_call(fn, quick=quick, min_repeats=3, warmup=2).seconds * 1e6
                figures[f'{alg} B={batch} {device} {dtype} {"fb" if backward else "fwd"}'] = us
                row.append(_common.fmt_number(us))
            rows.append(row)
    name = torch.cuda.get_device_name(0)
    return [f'GPU: {name}; us per call', _common.format_table(headers, rows)], figures


def tables(results: Results, sizes: Sequence[int], markdown: bool = False) -> List[str]:
    """
    Lay out per-call and per-sample tables, with ratios, for every algorithm.

    :param results: from :func:`measure`.
    :param sizes: batch sizes B, in row order.
    :param markdown: markdown tables instead of plain text.
    :return: titled tables as text blocks.
    """
    layout = _common.format_markdown_table if markdown else _common.format_table
    blocks = []
    for alg in ALGORITHMS:
        keys = [(k, h) for k, h in COLUMNS if any(results[a][k] for a in ALGORITHMS)]
        per_call, per_sample = [], []
        for batch in sizes:
            call_row, sample_row = [str(batch)], [str(batch)]
            for key, _ in keys:
                us = per_sample_us(results, alg, key, batch)
                call_row.append(_common.fmt_number(None if us is None else us * batch))
                sample_row.append(_common.fmt_number(us))
            sample_row += [_common.fmt_number(r, 2) for r in ratios(results, alg, batch).values()]
            per_call.append(call_row)
            per_sample.append(sample_row)
        headers = ['B'] + [h for _, h in keys]
        blocks.append(f'{alg.upper()}: us per call\n\n' + layout(headers, per_call))
        blocks.append(f'{alg.upper()}: us per sample, ratios of per-sample figures\n\n'
                      + layout(headers + [h for _, h in RATIOS], per_sample))
    return blocks


def markdown_report(results: Results, sizes: Sequence[int], info: Dict[str, Any],
                    notes: Sequence[str], agree: Dict[str, Dict[str, float]],
                    lines: Sequence[_common.Target]) -> str:
    """
    Lay out a run as markdown for ``benchmarks/README.md``.

    :param results: from :func:`measure`.
    :param sizes: batch sizes B.
    :param info: machine description from :func:`_common.machine_info`.
    :param notes: the run's notes (URDF, skipped engines, caps).
    :param agree: from :func:`agreement`.
    :param lines: from :func:`targets`.
    :return: markdown text.
    """
    versions = ', '.join(f'{k} {v}' for k, v in info['versions'].items())
    load = ', '.join(f'{x:.2f}' for x in info['load_average_1_5_15_min'] or ())
    parts = [f"Machine: {info['cpu_model']}, {info['usable_cores']} usable cores, "
             f"torch threads {info['torch_threads']}, Python {info['python']}, "
             f"{info['platform']}; {versions}; load average at start {load}.",
             '\n'.join(f'- {note}' for note in notes),
             '\n'.join(f'- agreement with Pinocchio, {name}: ' + ', '.join(
                 f'{alg} {diff:.1e}' for alg, diff in diffs.items())
                 for name, diffs in agree.items())]
    for block in tables(results, sizes, markdown=True):
        title, body = block.split('\n\n', 1)
        parts.append(f'**{title}**\n\n{body}')
    parts.append('\n'.join(f'- {t.line()}' for t in lines))
    return '\n\n'.join(part for part in parts if part) + '\n'


def agreement(engines: Dict[str, Any]) -> Dict[str, Dict[str, float]]:
    """
    Compare the engines' outputs on a few samples (max abs difference to Pinocchio).

    :param engines: from :func:`load_engines`.
    :return: ``{engine: {alg: max_abs_diff}}``; empty without Pinocchio.
    """
    if 'pin' not in engines:
        return {}
    inputs = make_inputs(engines['pin'].n, 4, seed=SEED + 1)
    reference = engines['pin'].outputs(inputs)
    found = {}
    for name in ('ours', 'drm'):
        if name in engines:
            out = engines[name].outputs(inputs)
            found[name] = {alg: float(np.abs(out[alg] - reference[alg]).max())
                           for alg in ALGORITHMS}
    native = engines['ours'].native_outputs(inputs) if 'ours' in engines else {}
    if native:
        found['native'] = {alg: float(np.abs(native[alg] - reference[alg]).max())
                           for alg in native}
    return found


def report(results: Results, first_calls: Dict[str, Dict[str, float]], sizes: Sequence[int],
           agree: Dict[str, Dict[str, float]], lines: List[_common.Target],
           meta: Dict[str, Any]) -> Dict[str, Any]:
    """
    Build the JSON payload: machine, settings, every timing, ratios, targets.

    :param results: from :func:`measure`.
    :param first_calls: compiled variant's first-call seconds from :func:`measure`.
    :param sizes: batch sizes B.
    :param agree: from :func:`agreement`.
    :param lines: from :func:`targets`.
    :param meta: machine description and run settings.
    :return: JSON-ready dict.
    """
    figures: Dict[str, Any] = {}
    for alg in ALGORITHMS:
        figures[alg] = {}
        for key, _ in COLUMNS:
            figures[alg][key] = {
                str(b): {'per_call_us': t.seconds * 1e6, 'per_sample_us': t.seconds * 1e6 / b,
                         'min_per_call_us': t.min_seconds * 1e6, 'repeats': t.repeats,
                         'inner': t.inner}
                for b, t in results[alg][key].items()}
        figures[alg]['ratios'] = {str(b): ratios(results, alg, b) for b in sizes}
        figures[alg]['compiled_first_call_s'] = first_calls[alg]
    return dict(meta, results=figures, agreement_max_abs_diff_vs_pin=agree,
                targets=[t.to_dict() for t in lines])


def main(argv: Optional[Sequence[str]] = None) -> int:
    """
    Run the benchmark and print the tables and target lines.

    :param argv: command-line arguments (default ``sys.argv[1:]``).
    :return: process exit status (0; a missed target is reported, not an error).
    """
    parser = _common.make_parser(__doc__.strip().splitlines()[0])
    parser.add_argument('--urdf', default=None,
                        help="URDF to load (default diffsim_ros.robots.urdf_path('panda'))")
    parser.add_argument('--markdown', metavar='PATH', default=None,
                        help='also write the tables as markdown to PATH (for the README)')
    parser.add_argument('--no-compile', action='store_true',
                        help="skip the core's compiled variant (compiling takes minutes)")
    parser.add_argument('--device', choices=('cpu', 'cuda'), default='cpu',
                        help='cuda: time the public RNEA/ABA on the GPU at B = 1 to 65536 '
                        'beside the CPU instead of the tables (skipped without a GPU)')
    parser.add_argument('--fast-only', action='store_true',
                        help='time only the fast-by-default section (public API beside '
                        'Pinocchio at B = 1 and 1024, derivatives included), not the tables')
    parser.add_argument('--floating-only', action='store_true',
                        help='time only the floating-base rows (Panda on a free base, a '
                        'free body; public API auto and torch beside Pinocchio free-flyer)')
    args = parser.parse_args(argv)
    start = time.perf_counter()
    torch.set_num_threads(args.threads)
    urdf, urdf_note = resolve_urdf(args.urdf)
    if args.device == 'cuda':
        return _main_cuda(urdf, args)
    if args.floating_only:
        return _main_floating(urdf, args)
    engines, notes = load_engines(urdf, args.threads,
                                  not (args.quick or args.no_compile or args.fast_only))
    if not engines:
        sys.exit('no engine could be loaded')
    if args.fast_only:
        return _main_fast(engines, args)
    sizes = QUICK_SIZES if args.quick else SIZES
    notes.insert(0, f'URDF: {urdf} ({urdf_note})')
    if 'drm' in engines:
        notes.append('differentiable-robot-model runs float32 only (it hard-codes it); '
                     + ('--quick: 1 timed repeat after 1 warm-up' if args.quick
                        else '3 timed repeats after 1 warm-up'))
    info = _common.machine_info(PACKAGES)
    info['torch_threads'] = torch.get_num_threads()
    _common.print_section('machine', [f'{k}: {v}' for k, v in info.items()])
    _common.print_section('notes', notes)
    agree = agreement(engines)
    _common.print_section('agreement (max abs diff to Pinocchio, 4 samples)', [
        f'{name}: ' + ', '.join(f'{alg} {diff:.2e}' for alg, diff in diffs.items())
        for name, diffs in agree.items()])

    def progress(text: str) -> None:
        print(f'[{time.perf_counter() - start:6.1f} s] timing {text}', flush=True)
    results, first_calls = measure(engines, sizes, args.quick, progress)
    compiled = [f'{alg} {key}: {seconds:.1f} s' for alg, calls in first_calls.items()
                for key, seconds in calls.items()]
    if compiled:
        _common.print_section('compiled variant: first call, compilation included', compiled)
    blocks = tables(results, sizes)
    for block in blocks:
        title, body = block.split('\n\n', 1)
        _common.print_section(title, [body])
    fast_lines, fast_targets, fast_figures = fast_by_default(engines, args.quick)
    _common.print_section('fast by default: the public API beside Pinocchio, same run',
                          fast_lines)
    floating_lines, floating_figures = floating_base(urdf, args.quick)
    _common.print_section(FLOATING_TITLE, floating_lines)
    lines = targets(results) + fast_targets
    _common.print_section('targets', [t.line() for t in lines])
    elapsed = time.perf_counter() - start
    print(f'\ntotal {elapsed:.1f} s')
    if args.markdown:
        with open(args.markdown, 'w', encoding='utf-8') as out:
            out.write(markdown_report(results, sizes, info, notes, agree, lines))
            out.write('\n**Fast by default** (public API, same run)\n\n'
                      + '\n'.join(f'- {line}' for line in fast_lines) + '\n')
            out.write('\n**Floating base** (public API, same run)\n\n'
                      + '\n'.join(f'- {line}' for line in floating_lines) + '\n')
    if args.json:
        meta = {'benchmark': 'dynamics', 'machine': info, 'quick': args.quick,
                'threads': args.threads, 'sizes': list(sizes), 'urdf': urdf,
                'notes': notes, 'elapsed_s': elapsed, 'fast_by_default_us': fast_figures,
                'floating_base_us_per_sample': floating_figures}
        _common.write_json(args.json, report(results, first_calls, sizes, agree, lines, meta))
    return 0


def _main_fast(engines: Dict[str, Any], args: Any) -> int:
    """Run ``--fast-only``: the machine, then the fast-by-default figures and targets."""
    info = _common.machine_info(PACKAGES)
    info['torch_threads'] = torch.get_num_threads()
    _common.print_section('machine', [f'{k}: {v}' for k, v in info.items()])
    fast_lines, fast_targets, _ = fast_by_default(engines, args.quick)
    _common.print_section('fast by default: the public API beside Pinocchio, same run',
                          fast_lines)
    _common.print_section('targets', [t.line() for t in fast_targets])
    return 0


def _main_floating(urdf: str, args: Any) -> int:
    """Run ``--floating-only``: the machine and load, then :func:`floating_base`."""
    info = _common.machine_info(PACKAGES)
    info['torch_threads'] = torch.get_num_threads()
    _common.print_section('machine', [f'{k}: {v}' for k, v in info.items()])
    lines, figures = floating_base(urdf, args.quick)
    _common.print_section(FLOATING_TITLE, lines)
    if args.json:
        _common.write_json(args.json, {'benchmark': 'dynamics --floating-only', 'machine': info,
                                       'urdf': urdf, 'floating_base_us_per_sample': figures})
    return 0


def _main_cuda(urdf: str, args: Any) -> int:
    """Run the ``--device cuda`` sweep (see :func:`cuda_sweep`); 0 also without a GPU."""
    engines, notes = load_engines(urdf, args.threads, False)
    info = _common.machine_info(PACKAGES)
    info['torch_threads'] = torch.get_num_threads()
    _common.print_section('machine', [f'{k}: {v}' for k, v in info.items()])
    lines, figures = cuda_sweep(engines, args.quick)
    _common.print_section('public rnea/aba on the GPU beside the CPU', lines)
    if args.json:
        _common.write_json(args.json, {'benchmark': 'dynamics --device cuda', 'machine': info,
                                       'notes': notes, 'urdf': urdf, 'results_us': figures})
    return 0


if __name__ == '__main__':
    sys.exit(main())
