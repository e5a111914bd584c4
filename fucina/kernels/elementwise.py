"""The elementwise op table: one definition per scalar function, two lowerings.

Each entry gives the numpy implementation (the reference kernels use it) and
a scalar expression template for generated Numba kernels. Templates are
Python expressions over ``{x}`` (unary), ``{a}``/``{b}`` (binary) and
parameters ``{p0}``, ``{p1}`` ... (runtime kernel arguments, so a new
constant never compiles a new kernel). Templates may call the vectorizable
f32 math in ``vm`` (``fucina.kernels.vecmath``) and the helpers in ``sf``
(``fucina.kernels.scalar_fns``); ``math`` is also available. Templates see
values already widened to the compute dtype (f32 for f16/bf16 inputs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class EwDef:
    """One elementwise function."""

    numpy: Callable[..., np.ndarray]
    template: str
    nparams: int = 0
    out_bool: bool = False


def _trunc_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    q = a // b
    fix = ((a % b) != 0) & ((a < 0) != (b < 0))
    return q + fix.astype(q.dtype)


def _trunc_rem(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a - _trunc_div(a, b) * b


BINARY: dict[str, EwDef] = {
    "add": EwDef(np.add, "({a} + {b})"),
    "sub": EwDef(np.subtract, "({a} - {b})"),
    "mul": EwDef(np.multiply, "({a} * {b})"),
    "div": EwDef(np.true_divide, "({a} / {b})"),
    "maximum": EwDef(np.maximum, "sf.maximum_nan({a}, {b})"),
    "minimum": EwDef(np.minimum, "sf.minimum_nan({a}, {b})"),
    "pow": EwDef(np.power, "sf.pow_f({a}, {b})"),
    "div_trunc": EwDef(_trunc_div, "sf.div_trunc({a}, {b})"),
    "div_floor": EwDef(np.floor_divide, "sf.div_floor({a}, {b})"),
    "rem": EwDef(_trunc_rem, "sf.rem_trunc({a}, {b})"),
    "mod": EwDef(np.mod, "sf.mod_floor({a}, {b})"),
    "bit_and": EwDef(np.bitwise_and, "({a} & {b})"),
    "bit_or": EwDef(np.bitwise_or, "({a} | {b})"),
    "bit_xor": EwDef(np.bitwise_xor, "({a} ^ {b})"),
    "logical_and": EwDef(np.logical_and, "({a} and {b})", out_bool=True),
    "logical_or": EwDef(np.logical_or, "({a} or {b})", out_bool=True),
    "logical_xor": EwDef(np.logical_xor, "({a} != {b})", out_bool=True),
}

COMPARE: dict[str, EwDef] = {
    "lt": EwDef(np.less, "({a} < {b})", out_bool=True),
    "le": EwDef(np.less_equal, "({a} <= {b})", out_bool=True),
    "gt": EwDef(np.greater, "({a} > {b})", out_bool=True),
    "ge": EwDef(np.greater_equal, "({a} >= {b})", out_bool=True),
    "eq": EwDef(np.equal, "({a} == {b})", out_bool=True),
    "ne": EwDef(np.not_equal, "({a} != {b})", out_bool=True),
}

# Scalar variants: x (fn) p0, with p0 a runtime parameter.
SCALAR: dict[str, EwDef] = {
    "add": EwDef(lambda x, v: x + v, "({x} + {p0})", 1),
    "mul": EwDef(lambda x, v: x * v, "({x} * {p0})", 1),
    "rsub": EwDef(lambda x, v: v - x, "({p0} - {x})", 1),
    "div": EwDef(lambda x, v: x / v, "({x} / {p0})", 1),
    "rdiv": EwDef(lambda x, v: v / x, "({p0} / {x})", 1),
    "pow": EwDef(lambda x, v: np.power(x, v), "sf.pow_f({x}, {p0})", 1),
}

UNARY: dict[str, EwDef] = {
    "neg": EwDef(np.negative, "(-{x})"),
    "abs": EwDef(np.abs, "abs({x})"),
    "logical_not": EwDef(np.logical_not, "(not {x})", out_bool=True),
}
