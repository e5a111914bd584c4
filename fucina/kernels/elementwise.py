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
from numba import njit

from ..rng import uniform53_jit


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

# -- unary numpy implementations ---------------------------------------------------
#
# Inputs arrive in the compute dtype (f32 for every float branch that has these
# ops). Compositions of several transcendentals are evaluated in f64 and rounded
# once, so the reference lowering is the accurate side of every comparison.


def _in_f64(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    """Evaluate ``fn`` in f64 and round once to the input dtype."""

    def run(x: np.ndarray, *params: float) -> np.ndarray:
        return np.asarray(fn(np.asarray(x, dtype=np.float64), *params)).astype(x.dtype)

    return run


def _typed(x: np.ndarray, v: float) -> np.generic:
    return x.dtype.type(v)


def _sigmoid64(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _relu(x: np.ndarray) -> np.ndarray:
    return np.where((x > 0) | (x != x), x, _typed(x, 0))


def _softplus64(x: np.ndarray) -> np.ndarray:
    return np.where(x > 0, x + np.log1p(np.exp(-x)), np.log1p(np.exp(x)))


_FT = (2.45550750702956, 0.893229853513558, 0.821226666969744, 2.44506634652299,
       0.814642734961073)


_FT_SAT = 8.561566231624852  # where the rational reaches 1 (see scalar_fns.fast_tanh)


def _fast_tanh64(x: np.ndarray) -> np.ndarray:
    a, b, c, d, e = _FT
    ax = np.abs(x)
    x2 = x * x
    r = (x * (a + a * ax + (b + c * ax) * x2)) / (d + (d + x2) * np.abs(x + e * x * ax))
    return np.where(ax > _FT_SAT, np.sign(x), r)


def _fast_tanh_grad64(x: np.ndarray) -> np.ndarray:
    a, b, c, d, e = _FT
    ax = np.abs(x)
    dax = np.sign(x)
    x2 = x * x
    p = a + a * ax + (b + c * ax) * x2
    dp = a * dax + c * dax * x2 + (b + c * ax) * 2.0 * x
    q = x + e * x * ax
    dq = 1.0 + e * (ax + x * dax)
    r = np.abs(q)
    dr = np.sign(q) * dq
    den = d + (d + x2) * r
    dden = 2.0 * x * r + (d + x2) * dr
    return np.where(ax > _FT_SAT, 0.0, ((p + x * dp) * den - x * p * dden) / (den * den))


_K = 0.7978845608028654  # sqrt(2 / pi)
_GC = 0.044715


def _gelu64(x: np.ndarray) -> np.ndarray:
    # 0.5 x (1 + tanh(u)) == x sigmoid(2u): the sigmoid form keeps the negative tail.
    return x * _sigmoid64(2.0 * _K * (x + _GC * x * x * x))


def _gelu_grad64(x: np.ndarray) -> np.ndarray:
    x2 = x * x
    s = _sigmoid64(2.0 * _K * (x + _GC * x * x2))
    g = s + 2.0 * x * (s * (1.0 - s)) * (_K * (1.0 + 3.0 * _GC * x2))
    return np.where(x >= 10, 1.0, np.where(x <= -10, 0.0, g))  # saturated (as sf.gelu_grad)


def _quick_gelu_grad64(x: np.ndarray) -> np.ndarray:
    s = _sigmoid64(1.702 * x)
    return s + x * (1.702 * s * (1.0 - s))


def _phi64(x: np.ndarray) -> np.ndarray:
    """Standard normal CDF via erfc (accurate in both tails)."""
    from .scalar_fns import erfc_np

    return 0.5 * erfc_np(-x * 0.7071067811865476)


def _gelu_erf64(x: np.ndarray) -> np.ndarray:
    return x * _phi64(x)


def _gelu_erf_grad64(x: np.ndarray) -> np.ndarray:
    return _phi64(x) + x * (np.exp(-0.5 * x * x) * 0.3989422804014327)


def _silu_grad64(x: np.ndarray) -> np.ndarray:
    s = _sigmoid64(x)
    return s * (1.0 + x * (1.0 - s))


def _round_f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(x.dtype)


def _gelu_quant(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    g = _round_f16(_gelu64(_round_f16(x).astype(np.float64)).astype(np.float32))
    return np.where(x <= -10, np.float32(0), np.where(x >= 10, x, g))


def _elu(x: np.ndarray) -> np.ndarray:
    return np.where(x > 0, x, np.expm1(x))


def _sign(x: np.ndarray) -> np.ndarray:
    return np.where(x > 0, _typed(x, 1), np.where(x < 0, _typed(x, -1), x))


def _clamp(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    return np.minimum(np.maximum(x, _typed(x, lo)), _typed(x, hi))


def _clamp_grad(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    return ((x >= _typed(x, lo)) & (x <= _typed(x, hi))).astype(x.dtype)


@njit(cache=True)
def _keep_kernel(seed: np.uint64, threshold: float, out: np.ndarray) -> None:
    for i in range(out.shape[0]):
        out[i] = uniform53_jit(seed, np.uint64(i)) < threshold


def dropout_keep_mask(seed: int, p: float, shape: tuple[int, ...]) -> np.ndarray:
    """Keep mask of dropout over ``shape``: element i (row-major) is kept iff the
    53-bit uniform of ``rng.at(seed, i)`` is below ``1 - p`` (p taken as f32)."""
    out = np.empty(int(np.prod(shape)), dtype=np.bool_)
    _keep_kernel(np.uint64(seed), 1.0 - np.float64(np.float32(p)), out)
    return out.reshape(shape)


def _dropout(x: np.ndarray, seed: int, p: float) -> np.ndarray:
    one = np.float32(1)
    scale = one / (one - np.float32(p))
    keep = dropout_keep_mask(seed, p, x.shape)
    return np.where(keep, x * x.dtype.type(scale), _typed(x, 0))


def _grad_from(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    return _in_f64(fn)


#: The public ``unary(op)`` names (the reference's closed UnaryOp enum).
PUBLIC_UNARY = (
    "relu", "exp", "sqrt", "rsqrt", "sigmoid", "silu", "log", "log1p", "softplus", "neg",
    "abs", "sin", "cos", "tanh", "fast_tanh", "gelu", "quick_gelu", "softcap_30",
    "softcap_15", "gelu_quant", "elu", "gelu_erf", "floor", "ceil", "round", "sign",
    "reciprocal",
)

UNARY: dict[str, EwDef] = {
    "neg": EwDef(np.negative, "(-{x})"),
    "abs": EwDef(np.abs, "abs({x})"),
    "logical_not": EwDef(np.logical_not, "(not {x})", out_bool=True),
    # activations and math (UnaryOp)
    "relu": EwDef(_relu, "sf.relu({x})"),
    "exp": EwDef(np.exp, "sf.exp({x})"),
    "sqrt": EwDef(np.sqrt, "sf.sqrt({x})"),
    "rsqrt": EwDef(lambda x: 1 / np.sqrt(x), "sf.rsqrt({x})"),
    "sigmoid": EwDef(_in_f64(_sigmoid64), "sf.sigmoid({x})"),
    "silu": EwDef(_in_f64(lambda x: x / (1.0 + np.exp(-x))), "sf.silu({x})"),
    "log": EwDef(np.log, "sf.log({x})"),
    "log1p": EwDef(np.log1p, "sf.log1p({x})"),
    "softplus": EwDef(_in_f64(_softplus64), "sf.softplus({x})"),
    "sin": EwDef(np.sin, "sf.sin({x})"),
    "cos": EwDef(np.cos, "sf.cos({x})"),
    "tanh": EwDef(np.tanh, "sf.tanh({x})"),
    "fast_tanh": EwDef(_in_f64(_fast_tanh64), "sf.fast_tanh({x})"),
    "gelu": EwDef(_in_f64(_gelu64), "sf.gelu({x})"),
    "quick_gelu": EwDef(_in_f64(lambda x: x * _sigmoid64(1.702 * x)), "sf.quick_gelu({x})"),
    "softcap_30": EwDef(lambda x: 30 * np.tanh(x / 30), "sf.softcap30({x})"),
    "softcap_15": EwDef(lambda x: 15 * np.tanh(x / 15), "sf.softcap15({x})"),
    "gelu_quant": EwDef(_gelu_quant, "sf.gelu_quant({x})"),
    "elu": EwDef(_elu, "sf.elu({x})"),
    "gelu_erf": EwDef(_in_f64(_gelu_erf64), "sf.gelu_erf({x})"),
    "floor": EwDef(np.floor, "np.floor({x})"),
    "ceil": EwDef(np.ceil, "np.ceil({x})"),
    "round": EwDef(np.rint, "sf.round_half_even({x})"),
    "sign": EwDef(_sign, "sf.sign({x})"),
    "reciprocal": EwDef(lambda x: 1 / x, "sf.reciprocal({x})"),
    # parameterized elementwise ops
    "leaky_relu": EwDef(lambda x, s: np.where(x > 0, x, x * _typed(x, s)),
                        "sf.leaky_relu({x}, {p0})", 1),
    "clamp": EwDef(_clamp, "sf.clamp({x}, {p0}, {p1})", 2),
    # params (seed, p); {i} is the element's row-major flat index
    "dropout": EwDef(_dropout, "sf.dropout_apply({x}, {i}, {p0}, {p1})", 2),
    # float predicates (IEEE compare semantics)
    "isnan": EwDef(np.isnan, "sf.is_nan({x})", out_bool=True),
    "isinf": EwDef(np.isinf, "sf.is_inf({x})", out_bool=True),
    "isfinite": EwDef(np.isfinite, "sf.is_finite({x})", out_bool=True),
    # derivatives used by the VJP rules (``_out`` forms take the forward output)
    "d_relu": EwDef(lambda x: (x > 0).astype(x.dtype), "sf.step({x})"),
    "d_leaky_relu": EwDef(lambda x, s: np.where(x > 0, _typed(x, 1), _typed(x, s)),
                          "sf.leaky_relu_grad({x}, {p0})", 1),
    "d_sigmoid_out": EwDef(lambda y: y * (1 - y), "sf.sigmoid_grad_out({x})"),
    "d_silu": EwDef(_grad_from(_silu_grad64), "sf.silu_grad({x})"),
    "d_softplus": EwDef(_in_f64(_sigmoid64), "sf.sigmoid({x})"),
    "d_tanh_out": EwDef(lambda t: 1 - t * t, "sf.tanh_grad_out({x})"),
    "d_softcap_out": EwDef(lambda y, c: 1 - (y / _typed(y, c)) ** 2,
                           "sf.softcap_grad_out({x}, {p0})", 1),
    "d_sqrt_out": EwDef(lambda y: 0.5 / y, "sf.sqrt_grad_out({x})"),
    "d_rsqrt_out": EwDef(lambda y: -0.5 * y * y * y, "sf.rsqrt_grad_out({x})"),
    "d_log1p": EwDef(lambda x: 1 / (1 + x), "sf.log1p_grad({x})"),
    "d_cos": EwDef(lambda x: -np.sin(x), "sf.neg_sin({x})"),
    "d_fast_tanh": EwDef(_grad_from(_fast_tanh_grad64), "sf.fast_tanh_grad({x})"),
    "d_gelu": EwDef(_grad_from(_gelu_grad64), "sf.gelu_grad({x})"),
    "d_quick_gelu": EwDef(_grad_from(_quick_gelu_grad64), "sf.quick_gelu_grad({x})"),
    "d_elu": EwDef(lambda x: np.where(x > 0, _typed(x, 1), np.exp(x)), "sf.elu_grad({x})"),
    "d_gelu_erf": EwDef(_grad_from(_gelu_erf_grad64), "sf.gelu_erf_grad({x})"),
    "d_reciprocal_out": EwDef(lambda t: -(t * t), "sf.reciprocal_grad_out({x})"),
    "d_clamp": EwDef(_clamp_grad, "sf.clamp_grad({x}, {p0}, {p1})", 2),
}
