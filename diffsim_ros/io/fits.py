"""
A fit read back: a ``diffsim-fit --out`` folder (or its ``params.yaml``) as a model to use.

``diffsim-fit`` appends the model document of :mod:`diffsim_ros.robots.message` (every
inertial, the joint ``damping``/``coulomb``/``armature`` fields, the DC motor's constants and
an analytic extra friction module such as Gaz et al.'s offset sigmoids, which a URDF cannot
carry) to ``params.yaml`` under the key ``model`` (:func:`write_model_document`).
:func:`load_fit` reads it back through
:func:`~diffsim_ros.robots.message.load_model_message`, the loader the mpc and the monitor
use for the identifier's documents, so a fit and a published model are one format with one
loader.  ``model.urdf`` stays what RViz and MoveIt read; it holds the fit's damping and
symmetric Coulomb friction only.

Loading validates the structure and the numbers (this robot, every parameter, finite,
friction coefficients of the right sign); whether the values are plausible is the robot
interface's :meth:`~diffsim_ros.robots.interface.RobotInterface.check_model` question,
asked by the nodes before they use a fit.  A black-box fit (``ffnn``) or a fit of a URDF
outside the catalogue has no model document and is refused with a :class:`FitFileError`.
"""

from dataclasses import dataclass
import math
from pathlib import Path
from typing import Any, Mapping, Optional, Union

from torch import nn
import yaml

from ..core.integrators import FRICTION_VELOCITY_SCALE
from ..core.model import RobotModel
from ..robots.interface import RobotInterface
from ..robots.message import load_model_message, MAX_MESSAGE_CHARS, ModelMessageError

__all__ = ['Fit', 'FitFileError', 'MODEL_KEY', 'load_fit', 'write_model_document']

#: The key of ``params.yaml`` that holds the model document.
MODEL_KEY = 'model'
#: Largest ``params.yaml`` read (the parameter table of a 7-joint arm is about 60 kB).
MAX_PARAMS_BYTES = 8 * MAX_MESSAGE_CHARS


class FitFileError(ValueError):
    """A fit that cannot be loaded (the message names the file and says why)."""


@dataclass(frozen=True)
class Fit:
    """
    A fitted model loaded back: what a tool or node needs to apply it.

    :param model: float64 CPU model (inertials, joint friction fields, armature).
    :param actuator: the fit's ``DCMotor`` (voltage-commanded robots) or ``None``.
    :param friction: the fit's extra friction module (frozen) or ``None``.
    :param method: the estimator that produced it.
    :param coulomb_eps: smoothing velocity of the Coulomb term it was fitted with.
    :param path: the ``params.yaml`` read.
    """

    model: RobotModel
    actuator: Optional[nn.Module]
    friction: Optional[nn.Module]
    method: str
    coulomb_eps: float
    path: Path

    @property
    def std(self) -> dict:
        """Return no standard deviations (``model_message`` reads this of a result)."""
        return {}


def write_model_document(path: Union[str, Path], document: Mapping[str, Any]) -> Path:
    """
    Append a model document to a ``params.yaml`` under :data:`MODEL_KEY`.

    YAML writes each float with ``repr`` (``1e-05`` as ``1.0e-05``), so the values read back
    bit for bit.

    :param path: the ``params.yaml`` (written before, without a ``model`` key).
    :param document: :func:`~diffsim_ros.robots.message.model_message` of the fit.
    :return: the path.
    :raises OSError: the file cannot be written.
    """
    path = Path(path)
    text = yaml.safe_dump({MODEL_KEY: dict(document)}, sort_keys=False,
                          default_flow_style=None, width=99)
    with path.open('a', encoding='utf-8') as stream:
        stream.write('# The whole model, read back by load_fit and by model_file:=<this '
                     'folder>\n' + text)
    return path


def load_fit(path: Union[str, Path], interface: RobotInterface) -> Fit:
    """
    Read a fit back (module docstring).

    :param path: a ``diffsim-fit --out`` folder or its ``params.yaml``.
    :param interface: the robot's interface (the fit must be of this robot).
    :return: the fit; its model is not yet checked for plausibility.
    :raises FitFileError: no such file, not YAML, no model document, or a document that
        does not load (the message says which).
    """
    path = Path(path).expanduser()
    file = path / 'params.yaml' if path.is_dir() else path
    if not file.is_file():
        raise FitFileError(f'{str(file)!r} is not a file (give a diffsim-fit --out folder or '
                           'its params.yaml)')
    if file.stat().st_size > MAX_PARAMS_BYTES:
        raise FitFileError(f'{str(file)!r} exceeds {MAX_PARAMS_BYTES} bytes')
    try:
        loaded = yaml.safe_load(file.read_text(encoding='utf-8'))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise FitFileError(f'cannot read {str(file)!r}: {str(error).splitlines()[0][:120]}'
                           ) from None
    if not isinstance(loaded, Mapping) or MODEL_KEY not in loaded:
        raise FitFileError(f'{str(file)!r} has no {MODEL_KEY!r} document (a black-box fit, '
                           'a fit of a URDF outside the catalogue, or one written before '
                           'diffsim-fit exported it)')
    document = loaded[MODEL_KEY]
    try:
        model, actuator, friction = load_model_message(document, interface)
    except ModelMessageError as error:
        raise FitFileError(f'{str(file)!r}: {error}') from None
    eps = document.get('coulomb_eps', FRICTION_VELOCITY_SCALE)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) \
            or not (math.isfinite(eps) and eps > 0):
        raise FitFileError(f'{str(file)!r}: coulomb_eps must be a finite number > 0, got '
                           f'{str(eps)[:20]!r}')
    return Fit(model, actuator, friction, str(document.get('method', 'unknown'))[:40],
               float(eps), file)
