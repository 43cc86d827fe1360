"""
Simulated robots: MuJoCo plants with "true" parameters that differ from the nominal model.

The plant is the ground truth of simulated experiments, of the control benchmarks and of the
simulated ROS driver, so identification is never checked against our own engine.

>>> from diffsim_ros.sim import MujocoPlant, PlantConfig, excitation_for
>>> plant = MujocoPlant(PlantConfig(robot='panda', param_error=0.3, seed=1))
>>> traj = plant.run(excitation_for(plant, 'multisine', duration=2.0))
>>> plant.true_model            # RobotModel describing the plant exactly

Modules: :mod:`.parameters` (``TrueParameters``, payload, tool frame), :mod:`.config`
(``PlantConfig``), :mod:`.builder` (URDF + RobotModel -> MuJoCo), :mod:`.plant`
(``MujocoPlant``), :mod:`.excitation` (multisine, chirp, Fourier series), :mod:`.cup` (the
WAM-4 with a cup and a ball on a capsule string: ball in a cup's ground truth; import it from
there).
"""

from .builder import build_mujoco_model, INTEGRATORS
from .config import PlantConfig
from .excitation import chirp, excitation_for, EXCITATIONS, fourier_series, multisine
from .parameters import (add_payload, attach_tool, nominal_model, Payload, ToolOffset,
                         TrueParameters)
from .plant import CommandError, Measurement, MujocoPlant, PlantState

__all__ = [
    'CommandError', 'EXCITATIONS', 'INTEGRATORS', 'Measurement', 'MujocoPlant', 'Payload',
    'PlantConfig', 'PlantState', 'ToolOffset', 'TrueParameters', 'add_payload',
    'attach_tool', 'build_mujoco_model', 'chirp', 'excitation_for', 'fourier_series',
    'multisine', 'nominal_model',
]
