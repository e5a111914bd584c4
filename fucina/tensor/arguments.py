"""Argument coercion shared by every op: ints, counts, sizes, shapes and real numbers.

Each helper takes the value and the parameter's name and either returns the
value in canonical form (a Python ``int``, ``float`` or tuple of ints) or
raises: ``TypeError`` for a value of the wrong kind, naming the method, the
parameter and what was passed; a fucina error (``InvalidShape``) or
``ValueError`` for a value of the right kind that is out of range. Nothing
here lets Python's own conversion messages (``invalid literal for int()``,
``'bool' object is not iterable``, a bare ``OverflowError``) reach the user.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..argnames import bad_argument
from ..errors import InvalidShape, TagError
from ..runtime.raw import MAX_ELEMENTS, MAX_ELEMENTS_TEXT


def is_int(v: object) -> bool:
    """A Python or numpy integer that is not a bool."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def choice_arg(v: Any, allowed: tuple[str, ...], what: str) -> str:
    """``v`` if it is one of the strings ``allowed``, else :class:`TagError` naming
    ``what``. Checks the type first: ``array in tuple`` would compare elementwise and
    raise numpy's ambiguous-truth error instead."""
    if not isinstance(v, str) or v not in allowed:
        raise TagError(f"{what} must be one of {allowed}, got {v!r}")
    return v


def flag_arg(v: Any, name: str) -> bool:
    """A yes/no argument: a Python or numpy bool, or the ints 0 and 1, as a bool
    (an array's truth value would be numpy's ambiguous-truth error)."""
    if isinstance(v, (bool, np.bool_)) or (is_int(v) and v in (0, 1)):
        return bool(v)
    raise TypeError(bad_argument(name, v, "a bool"))


def int_arg(v: Any, name: str) -> int:
    """An integer argument (Python or numpy int, never bool or float) as a Python int."""
    if not is_int(v):
        raise TypeError(bad_argument(name, v, "an int"))
    return int(v)


def count_arg(v: Any, name: str, minimum: int = 1) -> int:
    """An integer count of at least ``minimum`` (InvalidShape below it or past
    :data:`MAX_ELEMENTS`)."""
    n = int_arg(v, name)
    if n < minimum:
        raise InvalidShape(bad_argument(name, v, f"an int >= {minimum}"))
    if n > MAX_ELEMENTS:
        raise InvalidShape(bad_argument(name, v,
                                        f"an int <= {MAX_ELEMENTS_TEXT} (no tensor holds more)"))
    return n


def int_seq_arg(v: Any, name: str) -> tuple[int, ...]:
    """A sequence (tuple, list, numpy array) of integers as a tuple of Python ints."""
    if isinstance(v, np.ndarray):
        if v.ndim != 1:
            raise TypeError(bad_argument(name, v, "a flat sequence of ints"))
        v = v.tolist()
    if isinstance(v, (str, bytes)) or not isinstance(v, Sequence):
        raise TypeError(bad_argument(name, v, "a sequence of ints"))
    for d in v:
        if not is_int(d):
            raise TypeError(bad_argument(name, v, "a sequence of ints"))
    return tuple(int(d) for d in v)


def sizes_arg(v: Any, name: str, count: int | None = None) -> tuple[int, ...]:
    """Axis sizes: a sequence of positive ints (``count`` of them when given) whose
    product fits a tensor. TypeError for the wrong kind, InvalidShape for bad values."""
    sizes = int_seq_arg(v, name)
    if count is not None and len(sizes) != count:
        raise InvalidShape(bad_argument(name, v, f"{count} sizes"))
    for d in sizes:
        if d <= 0:
            raise InvalidShape(bad_argument(name, v, "positive sizes"))
    if math.prod(sizes) > MAX_ELEMENTS:
        raise InvalidShape(bad_argument(name, v, "sizes whose product is at most 2**62"))
    return sizes


def real_value(v: Any) -> float | None:
    """``v`` as a Python float when it is a real number (Python or numpy; bool is not),
    else None; an integer too large for a float is inf. The shared first step of the
    checks of real-valued options (each raises its own error)."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        return None
    try:
        return float(v)
    except OverflowError:
        return math.inf


def real_arg(v: Any, name: str) -> float:
    """A real number (Python or numpy; bool rejected) as a Python float. An integer too
    large for a float is a ValueError naming the argument."""
    x = real_value(v)
    if x is None:
        raise TypeError(bad_argument(name, v, "a real number"))
    if math.isinf(x) and isinstance(v, numbers.Integral):
        raise ValueError(bad_argument(name, v, "a number within the float range"))
    return x


def optional_real_arg(v: Any, name: str) -> float | None:
    """:func:`real_arg`, or None."""
    return None if v is None else real_arg(v, name)


def optional_int_arg(v: Any, name: str) -> int | None:
    """:func:`int_arg`, or None."""
    return None if v is None else int_arg(v, name)
