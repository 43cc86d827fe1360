"""
The ``model_file`` parameter: a node starts from an offline fit instead of the catalogue model.

``model_file:=fits/panda`` (a ``diffsim-fit --out`` folder, or its ``params.yaml``) is read
once at start-up by :func:`~diffsim_ros.io.fits.load_fit` and checked by the robot
interface's :meth:`~diffsim_ros.robots.interface.RobotInterface.check_model` (bounds,
physical consistency, the friction module's size); a fit that does not load or is refused
stops the node with one ``[ERROR]`` line and exit status 1, like every refused parameter.
The path comes from the operator (launch argument or YAML), never from a topic.  The
identifier takes the fit as its nominal model (prior and fallback), the mpc and the monitor
as the model in use until the model gate accepts a newer one; each applies the fit's
friction module.
"""

from typing import Optional

from .params import ParameterError
from ..io.fits import Fit, FitFileError, load_fit
from ..robots.interface import RobotInterface

__all__ = ['MODEL_FILE_DESCRIPTION', 'load_model_file']

#: Description of the ``model_file`` parameter of the identifier, mpc and monitor.
MODEL_FILE_DESCRIPTION = (
    'model to start from: a diffsim-fit --out folder or its params.yaml (model, motor and '
    "friction module, sigmoid included); '' = the catalogue's nominal model")


def load_model_file(interface: RobotInterface, value: str) -> Optional[Fit]:
    """
    Load and check the fit a node is told to start from.

    :param interface: the node's robot.
    :param value: the ``model_file`` parameter (``''``: none).
    :return: the fit, or ``None`` for ``''``.
    :raises ParameterError: the fit does not load or is not plausible (the first problems).
    """
    if not value:
        return None
    try:
        fit = load_fit(value, interface)
    except FitFileError as error:
        raise ParameterError('model_file', value, str(error)) from None
    problems = interface.check_model(fit.model, fit.actuator, fit.friction)
    if problems:
        more = f' (and {len(problems) - 2} more)' if len(problems) > 2 else ''
        raise ParameterError('model_file', value, f'the fit is refused by the {interface.name} '
                             f'robot interface: {"; ".join(problems[:2])}{more}')
    return fit
