"""Vectorizable float32 transcendental functions for Numba kernels.

Numba lowers ``np.exp``/``np.tanh``/``math.exp`` inside a loop to scalar libm
calls (the pip llvmlite has no SVML), so a loop over them does not vectorize.
The functions here are written only in float arithmetic, comparisons, selects,
``np.rint``/``abs``, fused multiply-add and integer bit tricks on the float32
bit pattern, so LLVM inlines them into a caller's loop and vectorizes it
(AVX2/AVX-512 ``vfmadd...ps`` on ``ymm``/``zmm`` registers).

Scalar functions (float32 -> float32): :func:`exp_f32`, :func:`expm1_f32`,
:func:`log_f32`, :func:`log1p_f32`, :func:`tanh_f32`, :func:`sigmoid_f32`,
:func:`silu_f32`, :func:`erf_f32`, :func:`erfc_f32`, :func:`sin_f32`,
:func:`cos_f32`, :func:`gelu_tanh_f32`, :func:`gelu_erf_f32`.
Array wrappers (flat float32 loops, any shape, returns a new float32 array):
:func:`vexp`, :func:`vexpm1`, :func:`vlog`, :func:`vlog1p`, :func:`vtanh`,
:func:`vsigmoid`, :func:`vsilu`, :func:`verf`, :func:`verfc`, :func:`vsin`,
:func:`vcos`, :func:`vgelu_tanh`, :func:`vgelu_erf`.

How to call them from a kernel
------------------------------
Call the scalar functions from any ``@njit`` function; do NOT wrap them with
``inline="always"``. Each is compiled on its own with the fast-math flag set
:data:`FASTMATH` (``contract``, ``nsz``, ``afn``: FMA contraction allowed, but
no ``nnan``/``ninf``/``reassoc``/``arcp``), and LLVM inlines it into the
caller's loop keeping those per-instruction flags. So a caller compiled with
``fastmath=True`` can neither drop the NaN/inf handling (``nnan``/``ninf``)
nor re-associate the Cody-Waite range reductions (``reassoc``). Numba-level
``inline="always"`` would instead re-lower the body under the caller's flags.
The test suite checks both vectorization and edge cases inside a
``fastmath=True`` caller. Arguments must be float32 (``np.float32(v)``);
float64 arguments compile a separate float64-typed specialization.

Accuracy (measured by ``tests/test_vecmath.py`` against float64 numpy/scipy
references rounded to float32; ulp = distance in representable float32 values,
with -0 == +0; the test bounds add a small margin):

==============  ==========  ==================================================
function        max ulp     notes
==============  ==========  ==================================================
exp_f32         1           whole range, incl. denormal results
expm1_f32       1
log_f32         1           incl. denormal inputs
log1p_f32       2
tanh_f32        2
sigmoid_f32     2           incl. denormal results for x < -87
silu_f32        2           (x * sigmoid(x))
erf_f32         1
erfc_f32        2           relative; denormal results for x > 9.2 less precise
sin_f32         1           |x| <= 2**22 (see below)
cos_f32         1           |x| <= 2**22
gelu_tanh_f32   3           whole range, tails included (see below)
gelu_erf_f32    3           whole range, tails included
==============  ==========  ==================================================

(The exact per-function figures are in :data:`ULP_BOUNDS`; absolute errors are
at most ``ulp_bound * ulp(y)``.)

Edge semantics follow numpy/torch float32: ``exp`` overflows to inf above
88.7228 and underflows through the denormals to 0 below -103.97; NaN in gives
NaN out everywhere; ``log(0) = -inf``, ``log(x<0) = nan``, ``log(inf) = inf``;
``log1p(-1) = -inf``; ``tanh``/``erf`` saturate to +-1 at +-inf; ``sigmoid``
is 0 at -inf and 1 at +inf and stays in [0, 1]; ``sin``/``cos`` of +-inf are
NaN. ``silu``/``gelu_*`` at -inf give NaN like torch's ``-inf * 0``. The sign
of a zero result is not guaranteed (``nsz``).

Design notes
------------
* ``exp``: ``n = rint(x / ln2)``, Cody-Waite ``r = x - n ln2`` with two FMAs,
  Cephes degree-6 polynomial, and ``2**n`` built from exponent bits in two
  halves so denormal results are rounded once and overflow gives inf.
* ``log``: mantissa/exponent split by integer ops on the bit pattern (denormal
  inputs pre-scaled by 2**23), Cephes polynomial on ``[sqrt(1/2), sqrt(2))``.
* ``erf``/``erfc``: odd polynomial below 0.75; above, ``erfc(a) =
  exp(-a*a) * erfcx(a)`` with ``a*a`` split exactly into ``hi + lo`` by an FMA
  (so the huge condition number of ``exp(-a*a)`` is not hit) and ``erfcx`` a
  degree-9 polynomial in ``(a - 2) / (a + 2)`` divided by ``1 + 2a``
  (coefficients fitted for this module, relative error 4.4e-9 on [0.5, 10.5]).
* ``sin``/``cos``: the reduction ``x - j pi/2`` runs in float64 (x is exact in
  float64, ``j = rint(x 2/pi)``, two-constant Cody-Waite with FMAs); the
  reduced argument is rounded to float32 for the Cephes polynomials. It is
  accurate while ``j`` times the 2**-107 residual of the two constants stays
  far below the reduced argument: the tests check <= 1 ulp for ``|x| <=
  2**22`` (4.2e6) and the same bound holds in random samples up to 2**30;
  beyond that the error grows (no Payne-Hanek reduction), results stay in
  [-1, 1].
* ``gelu_tanh``: ``x * sigmoid(2 sqrt(2/pi) (x + 0.044715 x**3))``; the
  argument ``v`` is computed in float64 and split into float32 ``hi + lo`` so
  that ``exp(v) = exp(hi) (1 + lo)`` keeps full relative accuracy in the tail
  (``v`` reaches -87, where a float32 ``v`` alone would cost ~100 ulp).
* ``gelu_erf``: ``x * Phi(x)`` with ``Phi`` from the ``erf`` polynomial near 0
  and from ``erfc`` (``x*x/2`` split exactly) in both tails.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

__all__ = [
    "FASTMATH",
    "ULP_BOUNDS",
    "cos_f32",
    "erf_f32",
    "erfc_f32",
    "exp_f32",
    "expm1_f32",
    "fma_f32",
    "gelu_erf_f32",
    "gelu_tanh_f32",
    "log1p_f32",
    "log_f32",
    "sigmoid_f32",
    "silu_f32",
    "sin_f32",
    "tanh_f32",
    "vcos",
    "verf",
    "verfc",
    "vexp",
    "vexpm1",
    "vgelu_erf",
    "vgelu_tanh",
    "vlog",
    "vlog1p",
    "vsigmoid",
    "vsilu",
    "vsin",
    "vtanh",
]

FASTMATH: set[str] = {"contract", "nsz", "afn"}
"""LLVM fast-math flags every function here is compiled with (no nnan/ninf/reassoc/arcp)."""

ULP_BOUNDS: dict[str, int] = {
    "exp": 1,
    "expm1": 1,
    "log": 1,
    "log1p": 2,
    "tanh": 2,
    "sigmoid": 2,
    "silu": 2,
    "erf": 1,
    "erfc": 2,
    "sin": 1,
    "cos": 1,
    "gelu_tanh": 3,
    "gelu_erf": 3,
}
"""Max error in float32 ulps reached on the tested domains (see module docstring)."""

_jit = njit(fastmath=FASTMATH, cache=True)

_F = np.float32
_I = np.int32
_ZERO = _F(0.0)
_HALF = _F(0.5)
_ONE = _F(1.0)
_TWO = _F(2.0)
_INF = _F(np.inf)
_NAN = _F(np.nan)
_SIGN = _I(-(2**31))
_ABSM = _I(0x7FFFFFFF)


@intrinsic
def fma_f32(typingctx, a, b, c):
    """Fused ``a * b + c`` on float32 with a single rounding (``llvm.fma.f32``).

    Signature: ``fma_f32(a: float32, b: float32, c: float32) -> float32``.
    """
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        return builder.fma(*args)

    return sig, codegen


@intrinsic
def _fma_f64(typingctx, a, b, c):
    """Fused ``a * b + c`` on float64 (``llvm.fma.f64``)."""
    sig = types.float64(types.float64, types.float64, types.float64)

    def codegen(context, builder, signature, args):
        return builder.fma(*args)

    return sig, codegen


@_jit
def _bits(x):
    """float32 -> its int32 bit pattern."""
    return _F(x).view(np.int32)


@_jit
def _float(i):
    """int32 bit pattern -> float32."""
    return _I(i).view(np.float32)


@_jit
def _pow2(n):
    """2**n as float32 for integer ``-126 <= n <= 127``."""
    return _I((n + 127) << 23).view(np.float32)


@_jit
def _copysign(mag, sgn):
    """``|mag|`` with the sign bit of ``sgn`` (both float32)."""
    return _I((_bits(mag) & _ABSM) | (_bits(sgn) & _SIGN)).view(np.float32)


# ---------------------------------------------------------------- exp family

_LOG2E = _F(1.44269504088896341)
_LN2_HI = _F(0.693359375)
_LN2_LO = _F(-2.12194440e-4)
# Cephes expf: exp(r) = 1 + r + r^2 * P(r) on [-ln2/2, ln2/2].
_EP0 = _F(1.9875691500e-4)
_EP1 = _F(1.3981999507e-3)
_EP2 = _F(8.3334519073e-3)
_EP3 = _F(4.1665795894e-2)
_EP4 = _F(1.6666665459e-1)
_EP5 = _F(5.0000001201e-1)
_EXP_HI = _F(89.0)
_EXP_LO = _F(-104.0)


@_jit
def _exp_poly(r):
    """``expm1(r) - r`` for ``|r| <= ln2/2`` (Cephes coefficients)."""
    p = fma_f32(_EP0, r, _EP1)
    p = fma_f32(p, r, _EP2)
    p = fma_f32(p, r, _EP3)
    p = fma_f32(p, r, _EP4)
    p = fma_f32(p, r, _EP5)
    return p * r * r


@_jit
def exp_f32(x):
    """``exp(x)`` for float32 ``x`` (max error 1 ulp; inf/0 outside range, NaN kept).

    Signature: ``exp_f32(x: float32) -> float32``.
    """
    xc = _EXP_HI if x > _EXP_HI else x
    xc = _EXP_LO if xc < _EXP_LO else xc  # NaN passes both clamps
    nf = np.rint(xc * _LOG2E)
    r = fma_f32(nf, -_LN2_HI, xc)
    r = fma_f32(nf, -_LN2_LO, r)
    p = _exp_poly(r) + r + _ONE
    n = _I(nf)  # in [-150, 128]
    n1 = n >> 1
    return p * _pow2(n1) * _pow2(n - n1)


_EXPM1_HI = _F(88.8)
_EXPM1_LO = _F(-25.0)


@_jit
def expm1_f32(x):
    """``exp(x) - 1`` for float32 ``x``, accurate near 0 (max error 1 ulp).

    Signature: ``expm1_f32(x: float32) -> float32``.
    """
    xc = _EXPM1_HI if x > _EXPM1_HI else x
    xc = _EXPM1_LO if xc < _EXPM1_LO else xc
    nf = np.rint(xc * _LOG2E)
    r = fma_f32(nf, -_LN2_HI, xc)
    r = fma_f32(nf, -_LN2_LO, r)
    u = _exp_poly(r) + r  # expm1(r)
    n = _I(nf)  # in [-36, 128]
    na = n if n < 127 else _I(127)
    t = _pow2(na)
    y = fma_f32(u, t, t - _ONE)  # t * (1 + u) - 1, t - 1 exact for small n
    return y * _pow2(n - na)


# ---------------------------------------------------------------- log family

_SQRTH_BITS = _I(0x3F3504F3)  # bits of sqrt(0.5)
_MANT = _I(0x007FFFFF)
_TINY = _F(1.17549435e-38)
_TWO23 = _F(8388608.0)
# Cephes logf: log(1 + f) = f - f^2/2 + f^3 P(f) on [sqrt(1/2) - 1, sqrt(2) - 1].
_LP0 = _F(7.0376836292e-2)
_LP1 = _F(-1.1514610310e-1)
_LP2 = _F(1.1676998740e-1)
_LP3 = _F(-1.2420140846e-1)
_LP4 = _F(1.4249322787e-1)
_LP5 = _F(-1.6668057665e-1)
_LP6 = _F(2.0000714765e-1)
_LP7 = _F(-2.4999993993e-1)
_LP8 = _F(3.3333331174e-1)


@_jit
def log_f32(x):
    """Natural log of float32 ``x`` (max error 1 ulp).

    ``log(0) = -inf``, ``log(x < 0) = nan``, ``log(inf) = inf``, NaN kept;
    denormal inputs are handled. Signature: ``log_f32(x: float32) -> float32``.
    """
    small = x < _TINY
    xs = x * _TWO23 if small else x
    ix = _bits(xs) - _SQRTH_BITS
    e = (ix >> 23) - (_I(23) if small else _I(0))
    m = _float((ix & _MANT) + _SQRTH_BITS)  # in [sqrt(1/2), sqrt(2))
    f = m - _ONE
    ef = _F(e)
    z = f * f
    p = fma_f32(_LP0, f, _LP1)
    p = fma_f32(p, f, _LP2)
    p = fma_f32(p, f, _LP3)
    p = fma_f32(p, f, _LP4)
    p = fma_f32(p, f, _LP5)
    p = fma_f32(p, f, _LP6)
    p = fma_f32(p, f, _LP7)
    p = fma_f32(p, f, _LP8)
    y = f * z * p
    y = fma_f32(ef, _LN2_LO, y)
    y = fma_f32(_F(-0.5), z, y)
    r = f + y
    r = fma_f32(ef, _LN2_HI, r)
    r = _INF if x == _INF else r
    r = -_INF if x == _ZERO else r
    r = _NAN if x < _ZERO else r
    return x if x != x else r


@_jit
def log1p_f32(x):
    """``log(1 + x)`` for float32 ``x``, accurate near 0 (max error 2 ulp).

    ``log1p(-1) = -inf``, ``log1p(x < -1) = nan``, ``log1p(inf) = inf``.
    Signature: ``log1p_f32(x: float32) -> float32``.
    """
    u = x + _ONE
    # log(u) plus the first-order correction for the rounding of 1 + x.
    c = (x - (u - _ONE)) / u
    c = c if (u > _ZERO) & (u < _INF) else _ZERO
    return log_f32(u) + c


# ---------------------------------------------------------------- tanh, sigmoid

# Cephes tanhf: tanh(x) = x + x^3 P(x^2) for |x| < 0.625.
_TP0 = _F(-5.70498872745e-3)
_TP1 = _F(2.06390887954e-2)
_TP2 = _F(-5.37397155531e-2)
_TP3 = _F(1.33314422036e-1)
_TP4 = _F(-3.33332819422e-1)
_TANH_SMALL = _F(0.625)
_TANH_CLAMP = _F(10.0)


@_jit
def tanh_f32(x):
    """``tanh(x)`` for float32 ``x`` (max error 2 ulp; +-1 at +-inf, NaN kept).

    Signature: ``tanh_f32(x: float32) -> float32``.
    """
    a = abs(x)
    z = x * x
    p = fma_f32(_TP0, z, _TP1)
    p = fma_f32(p, z, _TP2)
    p = fma_f32(p, z, _TP3)
    p = fma_f32(p, z, _TP4)
    small = fma_f32(x * z, p, x)
    ac = _TANH_CLAMP if a > _TANH_CLAMP else a  # tanh rounds to 1 beyond 9.01
    e = expm1_f32(_TWO * ac)
    big = _copysign(e / (e + _TWO), x)
    return small if a < _TANH_SMALL else big


@_jit
def _sigmoid_parts(hi, lo):
    """``sigmoid(hi + lo)`` for float32 ``hi`` and a small correction ``lo``."""
    neg = hi < _ZERO
    # e = exp(-|v|) (1 - sign(v) lo): accurate even when |hi| is large.
    e0 = exp_f32(-abs(hi))
    e = fma_f32(e0, lo if neg else -lo, e0)
    d = _ONE + e
    return e / d if neg else _ONE / d


@_jit
def sigmoid_f32(x):
    """Logistic ``1 / (1 + exp(-x))`` for float32 ``x`` (max error 2 ulp).

    Stays in [0, 1], is 0 at -inf and 1 at +inf, keeps relative accuracy for
    very negative ``x`` (denormal results). Signature:
    ``sigmoid_f32(x: float32) -> float32``.
    """
    return _sigmoid_parts(x, _ZERO)


@_jit
def silu_f32(x):
    """SiLU / swish ``x * sigmoid(x)`` for float32 ``x`` (max error 2 ulp).

    Signature: ``silu_f32(x: float32) -> float32``.
    """
    return x * sigmoid_f32(x)


# ---------------------------------------------------------------- erf family

# erf(x) = x + x Q(x^2) for |x| <= 0.75 (fitted, relative error 1.4e-9).
_EQ0 = _F(0.12837916612625122)
_EQ1 = _F(-0.3761261999607086)
_EQ2 = _F(0.11283376812934875)
_EQ3 = _F(-0.026834623888134956)
_EQ4 = _F(0.005114345345646143)
_EQ5 = _F(-0.0006749512976966798)
_ERF_SMALL = _F(0.75)
# erfcx(a) (1 + 2a) = R(s), s = (a - 2) / (a + 2), a in [0.5, 10.5]
# (fitted, relative error 4.4e-9).
_XR0 = _F(1.2769783735275269)
_XR1 = _F(-0.0927637591958046)
_XR2 = _F(-0.16603082418441772)
_XR3 = _F(0.1640484780073166)
_XR4 = _F(-0.0542113296687603)
_XR5 = _F(-0.008003090508282185)
_XR6 = _F(0.008659761399030685)
_XR7 = _F(0.0011371931759640574)
_XR8 = _F(-0.0012667656410485506)
_XR9 = _F(-0.0002143781748600304)
_ERFC_CLAMP = _F(10.5)


@_jit
def _erf_small(x):
    """``erf(x)`` for ``|x| <= 0.75``."""
    z = x * x
    q = fma_f32(_EQ5, z, _EQ4)
    q = fma_f32(q, z, _EQ3)
    q = fma_f32(q, z, _EQ2)
    q = fma_f32(q, z, _EQ1)
    q = fma_f32(q, z, _EQ0)
    return fma_f32(x, q, x)


@_jit
def _erfcx(a):
    """``exp(a*a) erfc(a)`` for ``0.5 <= a <= 10.5``."""
    s = (a - _TWO) / (a + _TWO)
    r = fma_f32(_XR9, s, _XR8)
    r = fma_f32(r, s, _XR7)
    r = fma_f32(r, s, _XR6)
    r = fma_f32(r, s, _XR5)
    r = fma_f32(r, s, _XR4)
    r = fma_f32(r, s, _XR3)
    r = fma_f32(r, s, _XR2)
    r = fma_f32(r, s, _XR1)
    r = fma_f32(r, s, _XR0)
    return r / fma_f32(_TWO, a, _ONE)


@_jit
def _exp_neg_sq(a, scale):
    """``exp(-scale * a * a)`` with ``a * a`` split exactly (scale = 1 or 1/2)."""
    hi = a * a
    lo = fma_f32(a, a, -hi)
    e = exp_f32(-scale * hi)
    return fma_f32(e, -scale * lo, e)


@_jit
def _erfc_pos(a):
    """``erfc(a)`` for ``a >= 0.5`` (a clamped to 10.5, where erfc underflows)."""
    a = _ERFC_CLAMP if a > _ERFC_CLAMP else a
    return _exp_neg_sq(a, _ONE) * _erfcx(a)


@_jit
def erf_f32(x):
    """Error function of float32 ``x`` (max error 1 ulp; +-1 at +-inf, NaN kept).

    Signature: ``erf_f32(x: float32) -> float32``.
    """
    a = abs(x)
    big = _copysign(_ONE - _erfc_pos(a), x)
    return _erf_small(x) if a < _ERF_SMALL else big


@_jit
def erfc_f32(x):
    """Complementary error function ``1 - erf(x)`` of float32 ``x`` (max error 2 ulp).

    Relative accuracy is kept in the right tail down to the denormals
    (``erfc(x) = 0`` for ``x > 10.05``). Signature: ``erfc_f32(x: float32) -> float32``.
    """
    a = abs(x)
    ca = _erfc_pos(a)
    big = _TWO - ca if x < _ZERO else ca
    return _ONE - _erf_small(x) if a < _ERF_SMALL else big


# ---------------------------------------------------------------- sin, cos

_TWO_OVER_PI = 0.6366197723675814
_PIO2_HI = 1.5707963267948966
_PIO2_LO = 6.123233995736766e-17
# Cephes sinf / cosf on [-pi/4, pi/4].
_SP0 = _F(-1.9515295891e-4)
_SP1 = _F(8.3321608736e-3)
_SP2 = _F(-1.6666654611e-1)
_CP0 = _F(2.443315711809948e-5)
_CP1 = _F(-1.388731625493765e-3)
_CP2 = _F(4.166664568298827e-2)


@_jit
def _sincos_quadrant(x, shift):
    """sin(x + shift * pi/2) for float32 x, shift in {0, 1}."""
    xd = np.float64(x)
    jd = np.rint(xd * _TWO_OVER_PI)
    rd = _fma_f64(jd, -_PIO2_HI, xd)
    rd = _fma_f64(jd, -_PIO2_LO, rd)
    r = _F(rd)
    q = _I(jd - 4.0 * np.floor(jd * 0.25)) + shift  # quadrant, exact for |j| < 2**53
    z = r * r
    s = fma_f32(_SP0, z, _SP1)
    s = fma_f32(s, z, _SP2)
    s = fma_f32(s * z, r, r)
    c = fma_f32(_CP0, z, _CP1)
    c = fma_f32(c, z, _CP2)
    c = fma_f32(c * z, z, fma_f32(_F(-0.5), z, _ONE))
    y = c if (q & 1) != 0 else s
    y = _float(_bits(y) ^ ((q & 2) << 30))
    y = _ONE if y > _ONE else y
    y = -_ONE if y < -_ONE else y
    return y if abs(x) < _INF else _NAN


@_jit
def sin_f32(x):
    """``sin(x)`` for float32 ``x`` (max error 1 ulp for ``|x| <= 2**22``; inf -> NaN).

    Signature: ``sin_f32(x: float32) -> float32``.
    """
    return _sincos_quadrant(x, _I(0))


@_jit
def cos_f32(x):
    """``cos(x)`` for float32 ``x`` (max error 1 ulp for ``|x| <= 2**22``; inf -> NaN).

    Signature: ``cos_f32(x: float32) -> float32``.
    """
    return _sincos_quadrant(x, _I(1))


# ---------------------------------------------------------------- GELU

_GELU_K2 = 2.0 * 0.7978845608028654  # 2 sqrt(2/pi)
_GELU_C = 0.044715
_RSQRT2 = _F(0.7071067811865476)


@_jit
def gelu_tanh_f32(x):
    """Tanh-approximated GELU ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``.

    Computed as ``x * sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3))`` with the
    argument in float64 (max error 3 ulp including the negative tail).
    Signature: ``gelu_tanh_f32(x: float32) -> float32``.
    """
    xd = np.float64(x)
    vd = _GELU_K2 * xd * (1.0 + _GELU_C * xd * xd)
    hi = _F(vd)
    lo = _F(vd - np.float64(hi))
    return x * _sigmoid_parts(hi, lo)


@_jit
def gelu_erf_f32(x):
    """Exact GELU ``0.5 x (1 + erf(x / sqrt(2)))`` = ``x Phi(x)`` (max error 3 ulp).

    Signature: ``gelu_erf_f32(x: float32) -> float32``.
    """
    t = x * _RSQRT2
    a = abs(t)
    ac = _ERFC_CLAMP if a > _ERFC_CLAMP else a
    ax = abs(x)
    axc = _ERFC_CLAMP * _F(1.4142135) if ax > _ERFC_CLAMP * _F(1.4142135) else ax
    q = _HALF * _exp_neg_sq(axc, _HALF) * _erfcx(ac)  # Phi(-|x|)
    tail = q if x < _ZERO else _ONE - q
    mid = fma_f32(_HALF, _erf_small(t), _HALF)
    mid_range = (t > _F(-0.5)) & (t < _ERF_SMALL)
    return x * (mid if mid_range else tail)


# ---------------------------------------------------------------- array wrappers
# One explicit loop per function (a closure factory would share one cache entry).


def _wrap(loop, name, fn_name):
    def wrapper(x: np.ndarray) -> np.ndarray:
        xf = np.ascontiguousarray(x, dtype=np.float32)
        out = np.empty_like(xf)
        loop(xf.reshape(-1), out.reshape(-1))
        return out

    wrapper.__name__ = name
    wrapper.__qualname__ = name
    wrapper.__doc__ = (
        f"Apply :func:`{fn_name}` elementwise to a float32 copy of ``x``.\n\n"
        f"Signature: ``{name}(x: np.ndarray) -> np.ndarray`` (float32, same shape)."
    )
    wrapper.kernel = loop
    return wrapper


@njit(fastmath=True, cache=True)
def _loop_exp(x, out):
    for i in range(x.size):
        out[i] = exp_f32(x[i])


vexp = _wrap(_loop_exp, "vexp", "exp_f32")

@njit(fastmath=True, cache=True)
def _loop_expm1(x, out):
    for i in range(x.size):
        out[i] = expm1_f32(x[i])


vexpm1 = _wrap(_loop_expm1, "vexpm1", "expm1_f32")

@njit(fastmath=True, cache=True)
def _loop_log(x, out):
    for i in range(x.size):
        out[i] = log_f32(x[i])


vlog = _wrap(_loop_log, "vlog", "log_f32")

@njit(fastmath=True, cache=True)
def _loop_log1p(x, out):
    for i in range(x.size):
        out[i] = log1p_f32(x[i])


vlog1p = _wrap(_loop_log1p, "vlog1p", "log1p_f32")

@njit(fastmath=True, cache=True)
def _loop_tanh(x, out):
    for i in range(x.size):
        out[i] = tanh_f32(x[i])


vtanh = _wrap(_loop_tanh, "vtanh", "tanh_f32")

@njit(fastmath=True, cache=True)
def _loop_sigmoid(x, out):
    for i in range(x.size):
        out[i] = sigmoid_f32(x[i])


vsigmoid = _wrap(_loop_sigmoid, "vsigmoid", "sigmoid_f32")

@njit(fastmath=True, cache=True)
def _loop_silu(x, out):
    for i in range(x.size):
        out[i] = silu_f32(x[i])


vsilu = _wrap(_loop_silu, "vsilu", "silu_f32")

@njit(fastmath=True, cache=True)
def _loop_erf(x, out):
    for i in range(x.size):
        out[i] = erf_f32(x[i])


verf = _wrap(_loop_erf, "verf", "erf_f32")

@njit(fastmath=True, cache=True)
def _loop_erfc(x, out):
    for i in range(x.size):
        out[i] = erfc_f32(x[i])


verfc = _wrap(_loop_erfc, "verfc", "erfc_f32")

@njit(fastmath=True, cache=True)
def _loop_sin(x, out):
    for i in range(x.size):
        out[i] = sin_f32(x[i])


vsin = _wrap(_loop_sin, "vsin", "sin_f32")

@njit(fastmath=True, cache=True)
def _loop_cos(x, out):
    for i in range(x.size):
        out[i] = cos_f32(x[i])


vcos = _wrap(_loop_cos, "vcos", "cos_f32")

@njit(fastmath=True, cache=True)
def _loop_gelu_tanh(x, out):
    for i in range(x.size):
        out[i] = gelu_tanh_f32(x[i])


vgelu_tanh = _wrap(_loop_gelu_tanh, "vgelu_tanh", "gelu_tanh_f32")

@njit(fastmath=True, cache=True)
def _loop_gelu_erf(x, out):
    for i in range(x.size):
        out[i] = gelu_erf_f32(x[i])


vgelu_erf = _wrap(_loop_gelu_erf, "vgelu_erf", "gelu_erf_f32")
