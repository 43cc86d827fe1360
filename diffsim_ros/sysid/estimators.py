"""
Estimators by name: ``'nea'``, ``'diffnea'``, ``'svgd'`` and ``'ffnn'``.

``'nea'`` is least squares, ``'diffnea'`` gradient descent, ``'svgd'`` Bayesian particles
(:mod:`.bayes`) and ``'ffnn'`` a black-box network.

>>> result = fit('diffnea', model, train_runs, validation_runs,
...              {'loss': 'rollout', 'horizon': 20, 'learn': ['inertial', 'damping']})
>>> estimator = make_estimator('nea', friction=['viscous', 'coulomb'])
>>> result = estimator.fit(model, train_runs)

Configurations are plain mappings (as read from YAML / ROS parameters) or the estimator's own
frozen config dataclass; unknown names and unknown keys raise one ``ValueError`` listing the
valid ones. Every estimator returns an :class:`~diffsim_ros.sysid.result.IdentificationResult`.
"""

from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Type, Union

from .bayes import fit_svgd, SVGDEstimatorConfig
from .blackbox import FFNNConfig, fit_ffnn
from .diffnea import DiffNEAConfig, fit_diffnea
from .losses import Data
from .nea import fit_nea, NEAConfig
from .result import EstimatorConfig, IdentificationResult
from ..core.model import RobotModel

ConfigLike = Union[None, Mapping[str, Any], EstimatorConfig]


def _fit_nea(model: RobotModel, train: Data, validation: Optional[Data], config: NEAConfig,
             warm_start: Optional[IdentificationResult]) -> IdentificationResult:
    # Least squares is closed-form: a previous result has nothing to offer it.
    return fit_nea(model, train, validation, config)


#: name -> (fit function, config class)
ESTIMATORS: Dict[str, Tuple[Callable[..., IdentificationResult], Type[EstimatorConfig]]] = {
    'nea': (_fit_nea, NEAConfig),
    'diffnea': (fit_diffnea, DiffNEAConfig),
    'svgd': (fit_svgd, SVGDEstimatorConfig),
    'ffnn': (fit_ffnn, FFNNConfig),
}


def names() -> Tuple[str, ...]:
    """
    Return the registered estimator names.

    :return: ``('nea', 'diffnea', 'svgd', 'ffnn')``.
    """
    return tuple(ESTIMATORS)


def _lookup(name: str) -> Tuple[Callable[..., IdentificationResult], Type[EstimatorConfig]]:
    try:
        return ESTIMATORS[name]
    except (KeyError, TypeError):
        valid = ', '.join(repr(k) for k in ESTIMATORS)
        raise ValueError(f'unknown estimator {name!r}; valid names: {valid}') from None


def make_config(name: str, config: ConfigLike = None) -> EstimatorConfig:
    """
    Return the validated configuration of an estimator.

    :param name: estimator name.
    :param config: ``None`` (defaults), a mapping (unknown keys rejected) or an instance of the
        estimator's config class.
    :return: the frozen config.
    :raises ValueError: unknown estimator, unknown keys, invalid values or a config object of
        another estimator.
    """
    _, config_class = _lookup(name)
    if config is None:
        return config_class()
    if isinstance(config, EstimatorConfig):
        if not isinstance(config, config_class):
            raise ValueError(f'estimator {name!r} takes a {config_class.__name__}, got a '
                             f'{type(config).__name__}')
        return config
    if not isinstance(config, Mapping):
        raise ValueError(f'config must be a mapping or a {config_class.__name__}, got '
                         f'{type(config).__name__}')
    return config_class.from_dict(config)


@dataclass(frozen=True)
class Estimator:
    """
    A named estimator with its validated configuration.

    :param name: registry name.
    :param config: the estimator's frozen config.
    """

    name: str
    config: EstimatorConfig

    def fit(self, model: RobotModel, train: Data, validation: Optional[Data] = None,
            warm_start: Optional[IdentificationResult] = None) -> IdentificationResult:
        """
        Identify a model from data.

        :param model: nominal robot model.
        :param train: training trajectory or trajectories.
        :param validation: held-out trajectories (early stopping, validation metrics).
        :param warm_start: previous result to start from (ignored by ``'nea'``).
        :return: the identification result.
        """
        fit_fn, _ = _lookup(self.name)
        return fit_fn(model, train, validation, self.config, warm_start=warm_start)


def make_estimator(name: str, **config: Any) -> Estimator:
    """
    Build an estimator by name.

    :param name: ``'nea'``, ``'diffnea'``, ``'svgd'`` or ``'ffnn'``.
    :param config: configuration fields of that estimator.
    :return: the estimator.
    :raises ValueError: unknown name (listing the valid ones) or unknown keys.
    """
    return Estimator(name=name, config=make_config(name, config))


def fit(name: str, model: RobotModel, train: Data, validation: Optional[Data] = None,
        config: ConfigLike = None,
        warm_start: Optional[IdentificationResult] = None) -> IdentificationResult:
    """
    Identify a model with the named estimator.

    :param name: ``'nea'``, ``'diffnea'``, ``'svgd'`` or ``'ffnn'``.
    :param model: nominal robot model.
    :param train: training trajectory or trajectories.
    :param validation: held-out trajectories.
    :param config: mapping or config object (see :func:`make_config`).
    :param warm_start: previous result to start from (ignored by ``'nea'``).
    :return: the identification result.
    """
    estimator = Estimator(name=name, config=make_config(name, config))
    return estimator.fit(model, train, validation, warm_start)


__all__ = ['ESTIMATORS', 'Estimator', 'fit', 'make_config', 'make_estimator', 'names']
