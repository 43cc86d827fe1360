"""
Which named parameters of a fit the data cannot determine (``diffsim-fit``'s flags).

A parameter is flagged when

* it enters no base parameter of the robot's regressor
  (:meth:`diffsim_ros.sysid.nea.BaseParameters.unidentified`): no joint torque depends on it
  in any state, so no recording determines it (e.g. the mass of a first link turning about a
  vertical axis); its identified value is whatever the estimator's prior or start left there;
* or the estimator gives it a standard deviation larger than its magnitude (NEA's base
  parameters, SVGD's posterior): the data leave even its sign open.

Parameters outside the regressor layout (motor constants, Stribeck or network friction, joint
origins) are not judged.
"""

from typing import Any, Dict, Mapping

import torch

from ..core.model import RobotModel
from ..sysid.nea import base_parameters, RegressorColumns

__all__ = ['mark_unidentifiable', 'regressor_columns', 'unidentifiable']

#: Reason given for a parameter that enters no base parameter.
NO_BASE_PARAMETER = 'enters no base parameter: no joint torque depends on it'


def regressor_columns(config: Any) -> RegressorColumns:
    """
    Return the regressor layout of an estimator config (NEA's own, else every joint term).

    :param config: estimator config; NEA's ``friction``, ``armature``, ``coulomb`` and
        ``coulomb_eps`` are used when present.
    :return: the layout.
    """
    if hasattr(config, 'friction') and hasattr(config, 'coulomb'):
        return RegressorColumns(friction=tuple(config.friction), armature=config.armature,
                                coulomb=config.coulomb, coulomb_eps=config.coulomb_eps)
    return RegressorColumns(friction=('viscous', 'coulomb'), armature=True)


def unidentifiable(parameters: Mapping[str, Mapping[str, Any]], nominal: RobotModel,
                   config: Any) -> Dict[str, str]:
    """
    Return the parameters the data cannot determine, with the reason (module docstring).

    :param parameters: ``{name: {'value'[, 'std']}}`` (the parameter table of the fit).
    :param nominal: the robot (kinematics only).
    :param config: the estimator config (regressor layout, :func:`regressor_columns`).
    :return: ``{name: reason}`` in table order.
    """
    structural = nominal.to(dtype=torch.float64, device='cpu')
    absent = set(base_parameters(structural, regressor_columns(config)).unidentified())
    flags = {}
    for name, entry in parameters.items():
        value, std = entry.get('value'), entry.get('std')
        if name in absent:
            flags[name] = NO_BASE_PARAMETER
        elif value is not None and std is not None and std > abs(value):
            flags[name] = f'std {std:.3g} larger than its value {value:.3g}'
    return flags


def mark_unidentifiable(parameters: Mapping[str, Mapping[str, Any]],
                        flags: Mapping[str, str]) -> Dict[str, Dict[str, Any]]:
    """
    Return the table with ``identifiable: false`` and the reason on flagged entries.

    :param parameters: ``{name: entry}``.
    :param flags: :func:`unidentifiable`'s result.
    :return: a new table; entries not flagged are unchanged copies.
    """
    return {name: {**entry, **({'identifiable': False, 'unidentifiable': flags[name]}
                               if name in flags else {})}
            for name, entry in parameters.items()}
