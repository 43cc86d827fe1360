"""
Model-predictive control on the identified model: dynamics, costs, iLQR, MPPI.

Every controller implements :class:`Controller`: ``solve(x0, t)`` returns a
:class:`FeedbackPolicy` that the MPC node evaluates at its own rate until the next solve, and
``set_model`` swaps in the identifier's newest model while keeping the warm start.  Torch only:
no ROS, no files.
"""

from typing import Any, Protocol, runtime_checkable

import torch

from .costs import CostDerivatives, QuadraticCost, TrackingCost
from .dynamics import KEEP, ModelDynamics, MotorActuator
from .ilqr import box_qp, closed_loop_rollout, ILQR, ILQRConfig
from .mppi import MPPI, MPPIConfig, particles_first
from .policy import FeedbackPolicy, shift_sequence, state_error, wrap_angle
from ..core.model import RobotModel


@runtime_checkable
class Controller(Protocol):
    """The interface shared by iLQR, MPPI, the baselines and the adaptive MPC loop."""

    dynamics: ModelDynamics

    def solve(self, x0: torch.Tensor, t: float = 0.0) -> FeedbackPolicy:
        """
        Plan from state ``x0 (nx,)`` at time ``t`` (s).

        :param x0: current state ``[q; qd]``.
        :param t: current time in s.
        :return: the policy to apply from ``t`` on.
        """

    def set_model(self, model: RobotModel, friction_model: Any = KEEP) -> None:
        """
        Swap the model; the next solve uses it and keeps the warm start.

        :param model: the new model.
        :param friction_model: its extra friction module (None: none); :data:`KEEP`: the
            one in use.
        """

    def reset(self) -> None:
        """Forget the warm start."""


__all__ = [
    'Controller', 'CostDerivatives', 'FeedbackPolicy', 'ILQR', 'ILQRConfig', 'KEEP', 'MPPI',
    'MPPIConfig', 'ModelDynamics', 'MotorActuator', 'QuadraticCost', 'TrackingCost', 'box_qp',
    'closed_loop_rollout', 'particles_first', 'shift_sequence', 'state_error', 'wrap_angle',
]
