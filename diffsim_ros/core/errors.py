"""Exceptions raised by diffsim_ros at its boundaries (URDF, shapes, configuration)."""


class DiffsimError(Exception):
    """Base class of every error diffsim_ros raises on purpose."""


class ShapeError(DiffsimError, ValueError):
    """A tensor argument has the wrong shape; the message prints expected vs actual."""


class URDFError(DiffsimError, ValueError):
    """A URDF document is malformed or describes an infeasible robot."""


class UnsupportedJointError(URDFError):
    """A URDF joint uses a feature the core does not model (floating, planar, mimic)."""


def check_trailing_shape(name: str, tensor, expected: tuple, size_name: str = '') -> None:
    """
    Raise :class:`ShapeError` unless ``tensor.shape`` ends with ``expected``.

    :param name: argument name used in the message.
    :param tensor: the tensor to check.
    :param expected: required trailing dimensions.
    :param size_name: what the last expected size is, e.g. ``'nq'`` or ``'nv'``, printed as
        ``(..., nq=12)`` so that a floating-base user sees which size was meant.
    """
    shape = tuple(tensor.shape)
    if len(shape) < len(expected) or shape[len(shape) - len(expected):] != tuple(expected):
        sizes = [str(d) for d in expected]
        if size_name:
            sizes[-1] = f'{size_name}={sizes[-1]}'
        raise ShapeError(f'{name}: expected shape (..., {", ".join(sizes)}), got {shape}')
