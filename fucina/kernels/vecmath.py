"""Vectorizable float32 transcendental functions for Numba kernels.

Numba lowers ``np.exp``/``np.tanh``/``math.exp`` inside a loop to scalar libm
calls (the pip llvmlite has no SVML), so a loop over them does not vectorize.
The functions here are written only in float arithmetic, comparisons, selects,
``np.rint``/``np.floor``/``abs``, fused multiply-add (``llvm.fma``) and integer
bit tricks on the float32 bit pattern, so LLVM inlines them into the caller's
loop and vectorizes it (packed ``vfmadd...ps``/``pd`` on ``ymm``, or ``zmm``
where the CPU and LLVM pick 512-bit vectors).

Scalar functions (float32 -> float32): :func:`exp_f32`, :func:`expm1_f32`,
:func:`log_f32`, :func:`log1p_f32`, :func:`tanh_f32`, :func:`sigmoid_f32`,
:func:`silu_f32`, :func:`erf_f32`, :func:`erfc_f32`, :func:`sin_f32`,
:func:`cos_f32`, :func:`gelu_tanh_f32`, :func:`gelu_erf_f32`; plus
:func:`fma_f32`. Array wrappers (a flat Numba loop over a float32 copy, any
shape, returning float32): :func:`vexp`, :func:`vexpm1`, :func:`vlog`,
:func:`vlog1p`, :func:`vtanh`, :func:`vsigmoid`, :func:`vsilu`, :func:`verf`,
:func:`verfc`, :func:`vsin`, :func:`vcos`, :func:`vgelu_tanh`,
:func:`vgelu_erf`; each has a ``.kernel(x, out)`` attribute (1-D float32 in,
preallocated 1-D float32 out).

How to call them from a kernel
------------------------------
Call ``name_f32(x)`` on a float32 scalar from any ``@njit`` function, with any
``fastmath`` setting, ``parallel=True`` included. Each function is built in
three layers: the body ``_name`` (helpers Numba-inlined into it), ``_name_impl``
(the body compiled on its own with the flags :data:`FASTMATH` = ``contract``
and ``afn``: FMA contraction, but no ``nnan``/``ninf``/``reassoc``/``arcp``/
``nsz``) and the public ``name_f32``, a Numba-inlined one-liner whose only
code is a call to ``_name_impl`` carrying LLVM's ``alwaysinline`` attribute.
So LLVM always inlines the body into the caller's loop, however large it is,
and the body's instructions keep their own fast-math flags: a caller compiled
with ``fastmath=True`` can neither drop the NaN/inf handling (``nnan``/
``ninf``) nor fold the Cody-Waite reductions and error-compensation steps
(``reassoc``). (Numba's ``inline="always"`` on a body would re-lower it under
the caller's flags; plain LLVM inlining of a large callee is refused by the
inliner's cost model and the loop stays scalar.) The tests check
vectorization and the edge cases inside ``fastmath=True`` callers. A float64
argument is converted to float32 first.

Accuracy
--------
Measured by ``tests/test_vecmath.py`` against float64 references (numpy;
``math.erf``/``math.erfc``) rounded to float32, on dense sweeps, 1M random bit
patterns and edge cases; ulp = distance between representable float32 values
(-0 == +0, denormals count as ulps). "vs exact" is the error against the
unrounded float64 value in units of the float32 ulp of the result.

==============  ========  ==========  ========================================
function        max ulp   vs exact    domain / notes
==============  ========  ==========  ========================================
exp_f32         1         1.02        all floats; denormal results rounded once
expm1_f32       1         1.44        all floats
log_f32         1         0.79        all floats, denormal inputs included
log1p_f32       1         1.44        all floats
tanh_f32        1         1.49        all floats
sigmoid_f32     2         1.50        all floats; relative accuracy kept in the
                                      denormal tail (x < -87.3); 1 ulp but at
                                      one input, x = -5.834932 (below)
silu_f32        2         1.73        all floats
erf_f32         1         1.46        all floats
erfc_f32        2         1.70        all floats; relative accuracy kept down to
                                      the denormals (0 beyond x = 10.05)
sin_f32         1         0.50        ``|x| < 2**50``; beyond, see below
cos_f32         1         0.50        ``|x| < 2**50``
gelu_tanh_f32   2         1.72        all floats, negative tail included
gelu_erf_f32    1         0.96        all floats, negative tail included
==============  ========  ==========  ========================================

:data:`ULP_BOUNDS` holds the "max ulp" column; the tests assert it plus one ulp
of margin. Absolute errors are therefore at most ``2 * ulp(y)``: <= 6e-8 for
tanh/sigmoid/erf/sin/cos (|y| <= 1), <= 2.4e-7 for the GELUs on |x| <= 4.

Edge semantics follow numpy/torch float32: ``exp`` overflows to inf above
88.72283 and underflows through the denormals to 0 below -103.97; NaN in gives
NaN out everywhere; ``log(+-0) = -inf``, ``log(x < 0) = nan``,
``log(inf) = inf``; ``log1p(-1) = -inf``, ``log1p(x < -1) = nan``;
``expm1(-inf) = -1``; ``tanh``/``erf`` are +-1 at +-inf; ``erfc`` is 0 / 2 at
+inf / -inf; ``sigmoid`` is 0 at -inf, 1 at +inf, stays in [0, 1] and is
monotone (checked on dense sweeps and runs of consecutive floats); ``sin``/
``cos`` of +-inf are NaN; ``silu``/``gelu_*`` are inf at +inf and NaN at -inf
(torch's ``-inf * 0``). Odd functions keep the sign of zero (``f(-0) = -0``).

Design notes
------------
* ``exp``: ``n = rint(x / ln2)``, Cody-Waite ``r = x - n ln2`` with two FMAs,
  Cephes degree-6 polynomial, then ``* 2**n`` rounded once (denormal results
  included; overflow gives inf): one ``vscalefps`` with AVX-512F, else two powers
  of two built from exponent bits, the same bits either way.
* ``expm1``: same reduction, ``t (1 + u) - 1`` with ``u = expm1(r)`` by FMA.
* ``log``: exponent/mantissa split by integer ops on the bit pattern
  (denormal inputs pre-scaled by 2**23), Cephes polynomial on
  ``[sqrt(1/2), sqrt(2))`` in Estrin's form; ``log1p(x) = log(1 + x)`` plus the first-order
  correction ``(x - ((1 + x) - 1)) / (1 + x)``.
* ``tanh``: Cephes odd polynomial below 0.625, ``e / (e + 2)`` with
  ``e = expm1(2|x|)`` above (|x| clamped to 10, so only the steps of ``expm1``
  that range needs are emitted: both run in every lane).
* ``sigmoid``/``silu``: float32 only. ``e = exp(-|x|) = p 2**n`` exactly
  (scaled by 2**96 where it is below 2**-59, so denormal results keep their
  relative accuracy), ``1 + e`` as an exact pair ``s + t``, ``1 / (s + t) =
  w (1 + d)`` with ``w = 1 / s`` and ``d`` from FMA residuals, and the products
  with ``e`` (and ``x`` for silu) as exact FMA pairs; only ``p``'s error and one
  final rounding reach the result. Checked exhaustively on the 5.9e8 floats
  with ``2**-27 <= |x| < 256`` (and exact on ``256 <= |x| < 2**13``): sigmoid is within 1
  ulp but at ``x = -5.834932`` (2 ulp, 1.50 vs exact: the error of ``p``,
  the same value as the float64 form this replaced), silu within 2 ulp (2365
  inputs at 2, as before).
* ``gelu_tanh``: ``m * sigmoid(v)`` with ``exp(-|v|) = p 2**n`` from the
  float32 kernel and ``1 + e``, the quotient, the product with ``m`` and the
  power of two in float64, rounded once. For
  ``gelu_tanh = x sigmoid(2 sqrt(2/pi) (x + 0.044715 x**3))`` the argument
  ``v`` is computed in float64 and split into float32 ``hi + lo`` with
  ``exp(v) = exp(hi) (1 + lo)``: ``v`` reaches -87 in the tail, where rounding
  it to float32 alone would cost ~100 ulp.
* ``erf``: odd polynomial ``x + x Q(x**2)`` below 0.75, ``1 - exp(L(a))``
  above with ``L`` a degree-7 fit of ``log(erfc(a))`` on [0.75, 3.93].
* ``erfc``: ``erfc(a) = exp(-a**2) erfcx(a)`` with ``a**2`` exact in float64
  and split into float32 ``hi + lo`` for the float32 exp kernel, and ``erfcx``
  a degree-10 polynomial in ``(a - 2) / (a + 2)`` over ``1 + 2a`` evaluated in
  float64 (fitted for this module: relative error 5.7e-10 on [0.5, 10.5]).
* ``gelu_erf = x Phi(x)`` has one branch-free float32 path for every x:
  ``q = Phi(-|x|) = exp(-x**2/2) M(s) / (|x| + 2)``, ``x q`` for x < 0 and
  ``x - x q`` above, with ``M`` (flat, in [0.45, 1]) a degree-11 polynomial in
  ``s = (|x| - 2) / (|x| + 2)`` fitted on [0, 14.6] (relative error 7e-9),
  evaluated by Estrin's scheme. There is no float64: the roundings that would
  reach the result (``|x| + 2``, its reciprocal, ``x**2/2``, exp's reduction,
  the first two terms of ``M``, the products, ``x - x q``) are carried as
  float32 ``hi + lo`` pairs by error-free FMA transforms and summed last.
* ``sin``/``cos``: the reduction ``r = x - j pi/2`` runs in float64 (x is exact
  there, ``j = rint(x 2/pi)``, two-constant Cody-Waite with FMAs, exact first
  step), then one float64 polynomial whose coefficients are chosen per lane
  (sin or cos by quadrant), rounded once to float32. The reduction stays exact
  enough while ``j`` times the 2**-107 residual of the two constants is far
  below ``|r|``: measured <= 1 ulp for ``|x| < 2**50`` (1.1e15). Beyond that
  the result is wrong but finite and in [-1, 1] (there is no Payne-Hanek
  reduction; float32 inputs that large are integers spaced >= 2**27 apart).

Speed (this machine: 2-core AMD EPYC, znver3, AVX2 only, so ``ymm`` vectors;
4M float32, single thread, preallocated output): exp 3.2 ms vs numpy 12.6 ms,
tanh 4.7 ms vs np.tanh 11.3 ms (and 80 ms for a Numba loop calling
``np.tanh``), log 3.6 vs 13.5 ms, sin/cos ~8 ms vs 9.5-10 ms. In-cache
throughput: exp/expm1 ~0.55 ns/element, log ~0.85, tanh ~1.0, erf ~1.2-1.5,
sigmoid/silu ~1.7, sin/cos ~1.9, gelu_tanh ~2.6, erfc ~3.4, gelu_erf ~2.4
(the float64 steps and error-free float32 pairs are the price of the <= 2 ulp tails).
Issue 13 (docs/BENCHMARKS.md; in-cache thread CPU time on a loaded Zen 3):
tanh 1.22 -> 1.13 ns/element (same values), gelu_erf 4.63 -> 4.42 (now <= 1 ulp).
Issue 13, second pass: gelu_erf in float32 only, 4.3 -> 2.2-2.6 ns/element in
cache (4M, one thread: 2.65 ns/element against torch's 1.07, whose erf form
loses the negative tail), still <= 1 ulp.
Issue 13, stop 26: sigmoid and silu in float32 only (they had a float64
quotient, two 8-lane halves and a float64 division per 16-lane vector on
AVX-512): in cache, one thread, AMD EPYC Zen 5, 0.49-0.51 -> 0.34-0.36
ns/element (sigmoid) and 0.52-0.54 -> 0.45 (silu). Of 6.1e8 inputs spread over
every binade, 0.15% (sigmoid) and 0.001% (silu) changed, by one ulp, within the
same bounds.

Vector width: LLVM's tuning for most AVX-512 CPUs prefers 256-bit vectors.
Every function here marks its caller's LLVM function (and generated kernels
call :func:`wide_hint`) with ``"prefer-vector-width"="512"`` when, and only
when, the compile target has AVX-512F (:func:`wide_vectors`, from the features
Numba compiles for); :func:`target_key` names the target for kernel caches.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

import numpy as np
from llvmlite import ir
from llvmlite.ir import CallInstr
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .isa import vector_bits

__all__ = [
    "FASTMATH",
    "ULP_BOUNDS",
    "cos_f32",
    "erf_f32",
    "erfc_f32",
    "exp_f32",
    "exp_gate_f32",
    "expm1_f32",
    "fma_f32",
    "codegen_target",
    "target_key",
    "wide_hint",
    "wide_vectors",
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

FASTMATH: set[str] = {"contract", "afn"}
"""LLVM fast-math flags of every body here (no nnan/ninf/reassoc/arcp/nsz)."""

ULP_BOUNDS: dict[str, int] = {
    "exp": 1,
    "expm1": 1,
    "log": 1,
    "log1p": 1,
    "tanh": 1,
    "sigmoid": 2,  # 1 but at x = -5.834932 (tests/test_vecmath.py holds the rest to 1)
    "silu": 2,
    "erf": 1,
    "erfc": 2,
    "sin": 1,
    "cos": 1,
    "gelu_tanh": 2,
    "gelu_erf": 1,
}
"""Max error in float32 ulps reached on the tested domains (table in the module docstring)."""

# Three layers per function: ``_name`` (body; helpers are inlined at the Numba IR
# level, so everything in a body is lowered under FASTMATH), ``_name_impl``
# (the body compiled on its own with FASTMATH) and the public ``name_f32``, whose
# only statement is a call to ``_name_impl`` marked ``alwaysinline`` for LLVM.
_inl = njit(inline="always", fastmath=FASTMATH, error_model="numpy", cache=True)
_jit = njit(fastmath=FASTMATH, error_model="numpy", cache=True)
_pub = njit(inline="always", error_model="numpy", cache=True)

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


@lru_cache(maxsize=1)
def codegen_target() -> tuple[str, str, str]:
    """(triple, CPU name, feature string) Numba compiles for (host, or NUMBA_CPU_* overrides)."""
    from numba.core.registry import cpu_target

    triple, cpu, features = cpu_target.target_context.codegen().magic_tuple()
    return str(triple), str(cpu), str(features)


def wide_vectors() -> bool:
    """Whether kernels here are emitted with 512-bit vectors: iff the target has AVX-512F.

    LLVM's tuning for most AVX-512 CPUs prefers 256-bit vectors; these bodies are
    compute-bound, and 512-bit vectors halve their instruction count. The answer
    comes from the features Numba compiles for, never from a fixed CPU list.
    """
    return vector_bits(codegen_target()[2]) == 512


def target_key() -> str:
    """Short key of the compile target (triple, CPU, features) for kernel cache keys.

    Code built for one vector path (AVX2, AVX-512) is never reused on the other.
    """
    triple, cpu, features = codegen_target()
    digest = hashlib.sha256(features.encode()).hexdigest()[:12]
    return f"{triple}-{cpu}-{digest}"


_WIDE_ATTR = '"prefer-vector-width"="512"'


def _mark_wide(fn) -> None:
    """Give the LLVM function ``fn`` the 512-bit vector preference when :func:`wide_vectors`."""
    if wide_vectors():
        # llvmlite's attribute set only knows bare keywords; a key="value" string
        # attribute prints verbatim into the function's definition.
        set.add(fn.attributes, _WIDE_ATTR)


@intrinsic
def wide_hint(typingctx):
    """No-op a kernel calls so that its loop is vectorized with :func:`wide_vectors` width.

    Emits no instruction; marks the enclosing LLVM function (a ``prange`` body
    is its own function, so call it inside the loop). Signature: ``wide_hint() -> None``.
    """
    sig = types.none()

    def codegen(context, builder, signature, args):
        _mark_wide(builder.function)
        return context.get_dummy_value()

    return sig, codegen


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


def _always_inline(impl):
    """Intrinsic ``call(x)`` that calls the compiled ``impl`` with an ``alwaysinline`` call site.

    LLVM then inlines ``impl`` into the caller however large it is (so the
    caller's loop can vectorize) while ``impl``'s instructions keep their own
    fast-math flags; only the call (which returns a status code, not a float)
    is emitted in the caller.
    """

    def call(typingctx, x):
        fnty = typingctx.resolve_value_type(impl)
        sig = typingctx.resolve_function_type(fnty, (x,), {})
        if sig is None:
            return None
        target = impl.overloads[sig.args].fndesc.mangled_name

        def codegen(context, builder, signature, args):
            _mark_wide(builder.function)
            res = context.get_function(fnty, sig)(builder, args)
            for block in builder.function.blocks:
                for instr in block.instructions:
                    # (an inline asm callee, as lanes.hidden emits, has no name)
                    if isinstance(instr, CallInstr) and \
                            getattr(instr.callee, "name", None) == target:
                        instr.attributes.add("alwaysinline")
            return res

        return sig, codegen

    call.__name__ = f"call{impl.py_func.__name__}"
    return intrinsic(call)


@_inl
def _bits(x):
    """float32 -> its int32 bit pattern."""
    return _F(x).view(np.int32)


@_inl
def _float(i):
    """int32 bit pattern -> float32."""
    return _I(i).view(np.float32)


@_inl
def _pow2(n):
    """2**n as float32 for integer ``-126 <= n <= 127``."""
    return _I((n + 127) << 23).view(np.float32)


@_inl
def _pow2_64(n):
    """2**n as float64 for integer ``-1022 <= n <= 1023``."""
    return np.int64((np.int64(n) + 1023) << 52).view(np.float64)


@_inl
def _copysign(mag, sgn):
    """``|mag|`` with the sign bit of ``sgn`` (both float32)."""
    return _I((_bits(mag) & _ABSM) | (_bits(sgn) & _SIGN)).view(np.float32)


# ---------------------------------------------------------------- exp family

_LOG2E = _F(1.44269504088896341)
_LN2_HI = _F(0.693359375)
_LN2_LO = _F(-2.12194440e-4)
# Cephes expf: exp(r) = 1 + r + r^2 P(r) on [-ln2/2, ln2/2].
_EP0 = _F(1.9875691500e-4)
_EP1 = _F(1.3981999507e-3)
_EP2 = _F(8.3334519073e-3)
_EP3 = _F(4.1665795894e-2)
_EP4 = _F(1.6666665459e-1)
_EP5 = _F(5.0000001201e-1)
_EXP_HI = _F(89.0)
_EXP_LO = _F(-170.0)


@_inl
def _exp_poly(r):
    """``expm1(r) - r`` for ``|r| <= ln2/2`` (Cephes coefficients)."""
    p = fma_f32(_EP0, r, _EP1)
    p = fma_f32(p, r, _EP2)
    p = fma_f32(p, r, _EP3)
    p = fma_f32(p, r, _EP4)
    p = fma_f32(p, r, _EP5)
    return p * r * r


@_inl
def _exp_reduce(xc):
    """Cody-Waite reduction for exp: ``(r, nf)`` with ``xc = nf ln2 + r``, ``nf`` a whole
    float32 and ``|r| <= ln2/2`` (``xc`` already clamped by the caller; NaN passes)."""
    nf = np.rint(xc * _LOG2E)
    r = fma_f32(nf, -_LN2_HI, xc)
    return fma_f32(nf, -_LN2_LO, r), nf


@_inl
def _exp_pn(x):
    """``exp(x) = p * 2**n`` with ``p`` in [0.7, 1.42] and integer ``n`` in [-245, 128].

    ``x`` is clamped to [-170, 89] first (both ends are far outside float32's
    range); NaN propagates into ``p``.
    """
    xc = _EXP_HI if x > _EXP_HI else x
    xc = _EXP_LO if xc < _EXP_LO else xc  # NaN passes both clamps
    r, nf = _exp_reduce(xc)
    return _exp_poly(r) + r + _ONE, _I(nf)


@intrinsic
def _scalef(typingctx, y, n):
    """``llvm.ldexp(y, n)`` on float32 ``y`` and int32 ``n``: one ``vscalefps`` with
    AVX-512F. Only :func:`_ldexp` calls it, and only there: without AVX-512F, LLVM lowers
    a vector ``llvm.ldexp`` to a call of libm's ``ldexpf`` per lane."""
    if y != types.float32 or n != types.int32:
        return None
    sig = types.float32(types.float32, types.int32)

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.FloatType(), [ir.FloatType(), ir.IntType(32)])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.ldexp.f32.i32")
        return builder.call(fn, args)

    return sig, codegen


#: Whether :func:`_ldexp` scales with ``vscalefps`` (the compile target has AVX-512F).
_SCALEF = wide_vectors()


@_inl
def _ldexp(y, n):
    """``y * 2**n`` for ``-252 <= n <= 254``, one rounding.

    With AVX-512F one ``vscalefps`` (exp on Zen 4, one thread, in cache: 0.333 -> 0.255
    ns/element); elsewhere two multiplications by exact powers of two, the first exact
    while ``|y|`` is near 1 (its product stays normal), so the second rounds once, as
    ``vscalefps`` does. The two give the same bits (every 31st float32 through exp and
    erf compared, both paths).
    """
    if _SCALEF:
        return _scalef(y, n)
    n1 = n >> 1
    return y * _pow2(n1) * _pow2(n - n1)


@_inl
def _exp(x):
    """Body of :func:`exp_f32`."""
    p, n = _exp_pn(x)
    return _ldexp(p, n)


@_jit
def _exp_impl(x):
    return _exp(x)


_call_exp = _always_inline(_exp_impl)


@_pub
def exp_f32(x):
    """``exp(x)`` for float32 ``x`` (inf above 88.72, 0 below -103.97, NaN kept).

    Signature: ``exp_f32(x: float32) -> float32``.
    """
    return _call_exp(np.float32(x))


_GATE_LO = _F(-86.5)  # n >= -125, so 2**(n-1) is a normal float


@_inl
def _exp_gate(x):
    """Body of :func:`exp_gate_f32`."""
    xc = _EXP_HI if x > _EXP_HI else x
    xc = _GATE_LO if xc < _GATE_LO else xc  # NaN passes both clamps
    r, nf = _exp_reduce(xc)  # nf in [-125, 128]
    p = _exp_poly(r) + r + _ONE
    # (2p) 2**(n-1): both scalings exact while the result is normal, as in _ldexp.
    return (p + p) * _pow2(_I(nf) - _I(1))


@_jit
def _exp_gate_impl(x):
    return _exp_gate(x)


_call_exp_gate = _always_inline(_exp_gate_impl)


@_pub
def exp_gate_f32(x):
    """``exp(x)`` for gates such as ``1 / (1 + exp(x))``: :func:`exp_f32`'s value for
    ``x >= -86.5`` (inf above 88.72); below, ``exp(-86.5)`` (2.7e-38) stands in for
    the smaller results, which leave ``1 + e`` at 1 all the same.
    Cheaper than :func:`exp_f32` (one power of two). Signature:
    ``exp_gate_f32(x: float32) -> float32``.
    """
    return _call_exp_gate(np.float32(x))


_EXPM1_HI = _F(88.8)
_EXPM1_LO = _F(-25.0)


@_inl
def _expm1(x):
    """Body of :func:`expm1_f32`."""
    xc = _EXPM1_HI if x > _EXPM1_HI else x
    xc = _EXPM1_LO if xc < _EXPM1_LO else xc
    r, nf = _exp_reduce(xc)
    u = _exp_poly(r) + r  # expm1(r)
    n = _I(nf)  # in [-36, 128]
    na = n if n < 127 else _I(127)
    t = _pow2(na)
    y = fma_f32(u, t, t - _ONE)  # t (1 + u) - 1; t - 1 is exact while it matters
    y = y * _pow2(n - na)
    return x if x == _ZERO else y  # keeps the sign of -0


@_jit
def _expm1_impl(x):
    return _expm1(x)


_call_expm1 = _always_inline(_expm1_impl)


@_pub
def expm1_f32(x):
    """``exp(x) - 1`` for float32 ``x``, accurate near 0 (-1 at -inf, NaN kept).

    Signature: ``expm1_f32(x: float32) -> float32``.
    """
    return _call_expm1(np.float32(x))


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


@_inl
def _log(x):
    """Body of :func:`log_f32`."""
    small = x < _TINY
    xs = x * _TWO23 if small else x
    ix = _I(_bits(xs) - _SQRTH_BITS)  # _I(...) keeps the integer lanes 32-bit
    e = _I(_I(ix >> _I(23)) - (_I(23) if small else _I(0)))
    m = _float(_I(ix & _MANT) + _SQRTH_BITS)  # in [sqrt(1/2), sqrt(2))
    f = m - _ONE
    ef = _F(e)
    z = f * f
    # P in Estrin's form: four independent pairs, then z and z^2 join them: 4
    # dependent operations instead of Horner's 8, at the same throughput. A row's
    # single log (log_softmax, logsumexp) waits on that latency.
    z2 = z * z
    p01 = fma_f32(_LP0, f, _LP1)
    p23 = fma_f32(_LP2, f, _LP3)
    p45 = fma_f32(_LP4, f, _LP5)
    p67 = fma_f32(_LP6, f, _LP7)
    p = fma_f32(fma_f32(p01, z, p23), z2, fma_f32(p45, z, p67))
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
def _log_impl(x):
    return _log(x)


_call_log = _always_inline(_log_impl)


@_pub
def log_f32(x):
    """Natural log of float32 ``x`` (denormal inputs handled).

    ``log(0) = -inf``, ``log(x < 0) = nan``, ``log(inf) = inf``, NaN kept.
    Signature: ``log_f32(x: float32) -> float32``.
    """
    return _call_log(np.float32(x))


@_inl
def _log1p(x):
    """Body of :func:`log1p_f32`."""
    u = x + _ONE
    # log(u) plus the first-order correction for the rounding of 1 + x.
    c = (x - (u - _ONE)) / u
    c = c if (u > _ZERO) & (u < _INF) else _ZERO
    y = _log(u) + c
    return x if x == _ZERO else y  # keeps the sign of -0


@_jit
def _log1p_impl(x):
    return _log1p(x)


_call_log1p = _always_inline(_log1p_impl)


@_pub
def log1p_f32(x):
    """``log(1 + x)`` for float32 ``x``, accurate near 0.

    ``log1p(-1) = -inf``, ``log1p(x < -1) = nan``, ``log1p(inf) = inf``.
    Signature: ``log1p_f32(x: float32) -> float32``.
    """
    return _call_log1p(np.float32(x))


# ---------------------------------------------------------------- tanh, sigmoid

# Cephes tanhf: tanh(x) = x + x^3 P(x^2) for |x| < 0.625.
_TP0 = _F(-5.70498872745e-3)
_TP1 = _F(2.06390887954e-2)
_TP2 = _F(-5.37397155531e-2)
_TP3 = _F(1.33314422036e-1)
_TP4 = _F(-3.33332819422e-1)
_TANH_SMALL = _F(0.625)
_TANH_CLAMP = _F(10.0)


@_inl
def _tanh(x):
    """Body of :func:`tanh_f32`."""
    a = abs(x)
    z = x * x
    p = fma_f32(_TP0, z, _TP1)
    p = fma_f32(p, z, _TP2)
    p = fma_f32(p, z, _TP3)
    p = fma_f32(p, z, _TP4)
    small = _copysign(fma_f32(x * z, p, x), x)  # odd; keeps -0
    ac = _TANH_CLAMP if a > _TANH_CLAMP else a  # tanh rounds to 1 beyond 9.01
    # e = expm1(2 ac) with 0 <= 2 ac <= 20: the steps of _expm1 its range needs
    # (no clamps, no second power of two, no -0 case), same values.
    r, nf = _exp_reduce(_TWO * ac)
    t = _pow2(_I(nf))
    e = fma_f32(_exp_poly(r) + r, t, t - _ONE)
    big = _copysign(e / (e + _TWO), x)
    return small if a < _TANH_SMALL else big


@_jit
def _tanh_impl(x):
    return _tanh(x)


_call_tanh = _always_inline(_tanh_impl)


@_pub
def tanh_f32(x):
    """``tanh(x)`` for float32 ``x`` (+-1 at +-inf, NaN kept).

    Signature: ``tanh_f32(x: float32) -> float32``.
    """
    return _call_tanh(np.float32(x))


@_inl
def _mul_sigmoid(m, hi, lo):
    """``m * sigmoid(hi + lo)`` (``lo`` a small correction to ``hi``), one final rounding.

    ``exp(-|v|) = p 2**n`` comes from the float32 kernel; ``1 + e``, the
    quotient, the product with ``m`` and the power of two run in float64, so
    denormal results and very negative ``v`` keep full relative accuracy.
    """
    neg = hi < _ZERO
    p, n = _exp_pn(-abs(hi))
    pd = np.float64(p) * (1.0 + np.float64(lo if neg else -lo))  # exp(-|v|) / 2**n
    e = pd * _pow2_64(n)
    e = 0.0 if abs(hi) >= -_EXP_LO else e  # exp(-170) times any float32 m underflows
    num = e if neg else 1.0
    return _F(np.float64(m) * num / (1.0 + e))


_SIG_TAIL = _F(41.0)  # |x| above: e = exp(-|x|) < 2**-59, 1 + e rounds to 1 exactly
_SIG_SHIFT = _I(96)  # scales such an e into the normal range
_SIG_UNSHIFT = _F(2.0**-96)
_SIG_CLAMP = _F(150.0)


@_inl
def _sigmoid_parts(x):
    """``sigmoid(x) = num * w * (1 + d) * scale`` in float32 only, for sigmoid and silu.

    ``e = exp(-|x|) = p 2**n`` is exact in float32 (times 2**96 in the tail, where
    ``scale`` is 2**-96 for negative x, so denormal results keep their relative
    accuracy); ``1 + e = s + t`` exactly (Fast2Sum); ``1 / (s + t) = w (1 + d)``
    with ``w = 1 / s`` rounded and ``d`` from FMA residuals (to 2**-48); ``num`` is
    ``e`` for negative x, else 1. Only ``p``'s error and the caller's last rounding
    reach the result. (The float64 form it replaced computed 16-lane vectors as
    two 8-lane halves with a float64 division: sigmoid 1.41x slower in cache, one
    thread, Zen 5.)
    """
    a = abs(x)
    # exp(-min(|x|, 150)): one clamp instead of _exp_pn's two keeps 2**(n + 96) normal,
    # and beyond it the result is 0 or 1 either way (NaN passes the comparison).
    xc = -a
    xc = -_SIG_CLAMP if xc < -_SIG_CLAMP else xc
    r, nf = _exp_reduce(xc)
    p = _exp_poly(r) + r + _ONE
    n = _I(nf)
    tail = a > _SIG_TAIL  # False for NaN, which then runs through e
    e = p * _pow2(n + _SIG_SHIFT if tail else n)
    eh = _ZERO if tail else e
    s = _ONE + eh
    t = (_ONE - s) + eh
    w = _ONE / s
    d = fma_f32(-w, s, _ONE)  # exact: 1 - w s
    d = fma_f32(-w, t, d)
    neg = x < _ZERO
    num = e if neg else _ONE
    scale = _SIG_UNSHIFT if tail & neg else _ONE
    return num, w, d, scale


@_inl
def _sigmoid(x):
    """Body of :func:`sigmoid_f32` (see :func:`_sigmoid_parts`)."""
    num, w, d, scale = _sigmoid_parts(x)
    q = num * w
    qe = fma_f32(num, w, -q)  # num * w = q + qe
    return (q + fma_f32(q, d, qe)) * scale


@_jit
def _sigmoid_impl(x):
    return _sigmoid(x)


_call_sigmoid = _always_inline(_sigmoid_impl)


@_pub
def sigmoid_f32(x):
    """Logistic ``1 / (1 + exp(-x))`` for float32 ``x``.

    Stays in [0, 1], is 0 at -inf and 1 at +inf and keeps relative accuracy for
    very negative ``x`` (denormal results). Signature:
    ``sigmoid_f32(x: float32) -> float32``.
    """
    return _call_sigmoid(np.float32(x))


@_inl
def _silu(x):
    """Body of :func:`silu_f32`."""
    num, w, d, scale = _sigmoid_parts(x)
    num = _ZERO if x <= -_SIG_CLAMP else num  # x exp(x) underflows; |x| may be huge
    pm = x * num
    pe = fma_f32(x, num, -pm)  # x * num = pm + pe
    q = pm * w
    qe = fma_f32(pm, w, -q)  # pm * w = q + qe
    y = (q + fma_f32(q, d, fma_f32(pe, w, qe))) * scale
    # +inf: inf (not inf * 0 in the corrections); -inf: -inf * 0 = NaN, torch's value
    y = q if abs(x) == _INF else y
    return pm if pm == _ZERO else y  # x = +-0 or x <= -150: keeps the sign of zero


@_jit
def _silu_impl(x):
    return _silu(x)


_call_silu = _always_inline(_silu_impl)


@_pub
def silu_f32(x):
    """SiLU / swish ``x * sigmoid(x)`` for float32 ``x`` (NaN at -inf, like torch).

    Signature: ``silu_f32(x: float32) -> float32``.
    """
    return _call_silu(np.float32(x))


# ---------------------------------------------------------------- erf family

# erf(x) = x + x Q(x^2) for |x| <= 0.75 (fitted, relative error 1.4e-9).
_EQ0 = _F(0.12837916612625122)
_EQ1 = _F(-0.3761261999607086)
_EQ2 = _F(0.11283376812934875)
_EQ3 = _F(-0.026834623888134956)
_EQ4 = _F(0.005114345345646143)
_EQ5 = _F(-0.0006749512976966798)
_ERF_SMALL = _F(0.75)
# log(erfc(a)) = L(a) for a in [0.75, 3.93] (fitted; erf = 1 - exp(L) within
# 0.006 ulp before rounding); erf(a) rounds to 1 beyond 3.92.
_EL0 = _F(0.00012203442490559845)
_EL1 = _F(-1.129246067167526)
_EL2 = _F(-0.63392249015834)
_EL3 = _F(-0.10761120183559642)
_EL4 = _F(0.024664163535723593)
_EL5 = _F(-0.003989728978039675)
_EL6 = _F(0.0003953522046293845)
_EL7 = _F(-1.7573053707142794e-05)
_ERF_ONE = _F(3.93)
# erfcx(a) (1 + 2a) = R(s), s = (a - 2) / (a + 2), for a in [0.5, 10.5], in
# float64 (fitted, relative error 5.7e-10).
_XR0 = 1.2769783811797821
_XR1 = -0.09276381584937682
_XR2 = -0.166030342591587
_XR3 = 0.16405073444009932
_XR4 = -0.05422126094791967
_XR5 = -0.008026093966494112
_XR6 = 0.008732468348808621
_XR7 = 0.0012231823991792502
_XR8 = -0.0014868864767052532
_XR9 = -0.0003208463054299258
_XR10 = 0.00023592372643026953
_ERFCX_MAX = 10.5
_HALF_SQ_MAX = 170.0


@_inl
def _erf_small(x):
    """``erf(x)`` for float32 ``|x| <= 0.75``."""
    z = x * x
    q = fma_f32(_EQ5, z, _EQ4)
    q = fma_f32(q, z, _EQ3)
    q = fma_f32(q, z, _EQ2)
    q = fma_f32(q, z, _EQ1)
    q = fma_f32(q, z, _EQ0)
    return fma_f32(x, q, x)


@_inl
def _erfcx64(a):
    """``exp(a*a) erfc(a)`` in float64 for ``0.5 <= a <= 10.5`` (one division)."""
    a = _ERFCX_MAX if a > _ERFCX_MAX else a
    d = 1.0 / ((a + 2.0) * (1.0 + 2.0 * a))
    s = (a - 2.0) * (1.0 + 2.0 * a) * d
    r = _fma_f64(_XR10, s, _XR9)
    r = _fma_f64(r, s, _XR8)
    r = _fma_f64(r, s, _XR7)
    r = _fma_f64(r, s, _XR6)
    r = _fma_f64(r, s, _XR5)
    r = _fma_f64(r, s, _XR4)
    r = _fma_f64(r, s, _XR3)
    r = _fma_f64(r, s, _XR2)
    r = _fma_f64(r, s, _XR1)
    r = _fma_f64(r, s, _XR0)
    return r * (a + 2.0) * d


@_inl
def _exp_neg64(w):
    """``exp(-w)`` in float64 for float64 ``w >= 0`` known to ~float32 relative accuracy.

    ``w`` is split into float32 ``hi + lo`` so only the float32 kernel's error
    and no argument rounding enters (``w`` is clamped to 170, far past underflow).
    """
    big = w >= _HALF_SQ_MAX
    w = _HALF_SQ_MAX if big else w
    hi = _F(w)
    lo = w - np.float64(hi)
    p, n = _exp_pn(-hi)
    e = np.float64(p) * (1.0 - lo) * _pow2_64(n)
    return 0.0 if big else e


@_inl
def _erfc64(x):
    """``erfc(|x|)`` in float64 for float32 ``|x| >= 0.5`` (``x * x`` is exact in float64)."""
    xd = np.float64(x)
    return _exp_neg64(xd * xd) * _erfcx64(abs(xd))


@_inl
def _erf(x):
    """Body of :func:`erf_f32`."""
    a = abs(x)
    ac = _ERF_ONE if a > _ERF_ONE else a
    r = fma_f32(_EL7, ac, _EL6)
    r = fma_f32(r, ac, _EL5)
    r = fma_f32(r, ac, _EL4)
    r = fma_f32(r, ac, _EL3)
    r = fma_f32(r, ac, _EL2)
    r = fma_f32(r, ac, _EL1)
    r = fma_f32(r, ac, _EL0)  # log(erfc(a))
    big = _copysign(_ONE - _exp(r), x)
    return _erf_small(x) if a < _ERF_SMALL else big


@_jit
def _erf_impl(x):
    return _erf(x)


_call_erf = _always_inline(_erf_impl)


@_pub
def erf_f32(x):
    """Error function of float32 ``x`` (+-1 at +-inf, NaN kept).

    Signature: ``erf_f32(x: float32) -> float32``.
    """
    return _call_erf(np.float32(x))


@_inl
def _erfc(x):
    """Body of :func:`erfc_f32`."""
    ca = _erfc64(x)
    big = _F(2.0 - ca) if x < _ZERO else _F(ca)
    return _ONE - _erf_small(x) if abs(x) < _ERF_SMALL else big


@_jit
def _erfc_impl(x):
    return _erfc(x)


_call_erfc = _always_inline(_erfc_impl)


@_pub
def erfc_f32(x):
    """Complementary error function ``1 - erf(x)`` of float32 ``x``.

    Relative accuracy holds in the right tail down to the denormals
    (``erfc(x) = 0`` beyond 10.05). Signature: ``erfc_f32(x: float32) -> float32``.
    """
    return _call_erfc(np.float32(x))


# ---------------------------------------------------------------- sin, cos

_TWO_OVER_PI = 0.6366197723675814
_PIO2_HI = 1.5707963267948966
_PIO2_LO = 6.123233995736766e-17
# sin(r) = r (1 + z S(z)), cos(r) = 1 + z C(z), z = r^2, |r| <= pi/4 (fitted, float64).
_S0 = -0.16666666666629965
_S1 = 0.008333333325008196
_S2 = -0.00019841263690893946
_S3 = 2.7555331664863396e-06
_S4 = -2.4759874980807492e-08
_C0 = -0.5
_C1 = 0.04166666661910814
_C2 = -0.001388888346735326
_C3 = 2.4799451573111306e-05
_C4 = -2.720504803381714e-07


@_inl
def _sin_quadrant(x, shift):
    """``sin(x + shift pi/2)`` for float32 ``x`` and integer ``shift``."""
    xd = np.float64(x)
    jd = np.rint(xd * _TWO_OVER_PI)
    rd = _fma_f64(jd, -_PIO2_HI, xd)  # exact for |x| < 2**53
    rd = _fma_f64(jd, -_PIO2_LO, rd)
    rd = 1.0 if rd > 1.0 else rd  # only binds far outside the accurate range
    rd = -1.0 if rd < -1.0 else rd
    q = _I(jd - 4.0 * np.floor(jd * 0.25)) + shift
    odd = (q & 1) != 0
    z = rd * rd
    # One polynomial with per-lane coefficients: cos for odd quadrants, sin otherwise.
    c = _fma_f64(_C4 if odd else _S4, z, _C3 if odd else _S3)
    c = _fma_f64(c, z, _C2 if odd else _S2)
    c = _fma_f64(c, z, _C1 if odd else _S1)
    c = _fma_f64(c, z, _C0 if odd else _S0)
    a = 1.0 if odd else rd
    y = _fma_f64(a * z, c, a)
    y = -y if (q & 2) != 0 else y
    return _F(y) if abs(x) < _INF else _NAN


@_inl
def _sin(x):
    """Body of :func:`sin_f32`."""
    y = _sin_quadrant(x, _I(0))
    return x if x == _ZERO else y  # sin(-0) = -0


@_jit
def _sin_impl(x):
    return _sin(x)


_call_sin = _always_inline(_sin_impl)


@_pub
def sin_f32(x):
    """``sin(x)`` for float32 ``x`` (inf -> NaN; <= 1 ulp for ``|x| < 2**50``).

    Signature: ``sin_f32(x: float32) -> float32``.
    """
    return _call_sin(np.float32(x))


@_inl
def _cos(x):
    """Body of :func:`cos_f32`."""
    return _sin_quadrant(x, _I(1))


@_jit
def _cos_impl(x):
    return _cos(x)


_call_cos = _always_inline(_cos_impl)


@_pub
def cos_f32(x):
    """``cos(x)`` for float32 ``x`` (inf -> NaN; <= 1 ulp for ``|x| < 2**50``).

    Signature: ``cos_f32(x: float32) -> float32``.
    """
    return _call_cos(np.float32(x))


# ---------------------------------------------------------------- GELU

_GELU_K2 = 2.0 * 0.7978845608028654  # 2 sqrt(2/pi)
_GELU_C = 0.044715
_GELU_V_MAX = 200.0


@_inl
def _gelu_tanh(x):
    """Body of :func:`gelu_tanh_f32`."""
    xd = np.float64(x)
    vd = _GELU_K2 * xd * (1.0 + _GELU_C * xd * xd)
    vd = _GELU_V_MAX if vd > _GELU_V_MAX else vd
    vd = -_GELU_V_MAX if vd < -_GELU_V_MAX else vd
    hi = _F(vd)
    lo = _F(vd - np.float64(hi))
    y = _mul_sigmoid(x, hi, lo)
    return _NAN if x == -_INF else y


@_jit
def _gelu_tanh_impl(x):
    return _gelu_tanh(x)


_call_gelu_tanh = _always_inline(_gelu_tanh_impl)


@_pub
def gelu_tanh_f32(x):
    """Tanh-approximated GELU ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``.

    Computed as ``x * sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3))`` with the
    argument in float64 and split into float32 ``hi + lo``, so the negative
    tail keeps full relative accuracy; NaN at -inf like torch.
    Signature: ``gelu_tanh_f32(x: float32) -> float32``.
    """
    return _call_gelu_tanh(np.float32(x))


# gelu_erf: Phi(-a) exp(a**2 / 2) (a + 2) = M(s), s = (a - 2) / (a + 2), fitted on
# a in [0, 14.6] (relative error 7e-9 with these float32 coefficients; M is flat,
# in [0.45, 1], so no term dominates). The constant term is kept as hi + lo.
_GM0_HI = _F(0.6724079847335815)
_GM0_LO = _F(2.0905190467601642e-08)
_GM1 = _F(-0.3314044773578644)
_GM2 = _F(0.02879738248884678)
_GM3 = _F(0.03671937435865402)
_GM4 = _F(-0.00046989708789624274)
_GM5 = _F(-0.006734408903867006)
_GM6 = _F(-0.0019509062403813004)
_GM7 = _F(0.0008235247805714607)
_GM8 = _F(0.0008353688754141331)
_GM9 = _F(0.0001326852070633322)
_GM10 = _F(-0.00014843101962469518)
_GM11 = _F(-6.518219743156806e-05)
_GC = _F(2.0)
_GA_MAX = _F(14.6)  # 14.6 Phi(-14.6) rounds to 0; gelu_erf(x) = x above


@_inl
def _gelu_erf(x):
    """Body of :func:`gelu_erf_f32`: ``x Phi(x)``, float32 only, one branch-free path.

    ``x q`` with ``q = Phi(-|x|) = exp(-x*x/2) M(s) / (|x| + 2)`` is the result for
    x < 0 and is subtracted from x above, so the negative tail keeps relative
    accuracy (no ``1 + erf`` cancellation). Every rounding that would reach the
    result is carried as a float32 ``hi + lo`` pair (error-free transforms with
    FMA): ``|x| + 2``, the reciprocal, ``x*x/2``, exp's reduction, the first two
    terms of ``M`` and the products; the sum of the small terms is added last.
    The polynomial runs by Estrin's scheme (short dependency chains).
    """
    xs = _GA_MAX if x > _GA_MAX else x
    xs = -_GA_MAX if xs < -_GA_MAX else xs  # NaN passes
    a = abs(xs)
    # u0 = 1 / (a + 2) with e = 1 - u0 (a + 2) exactly (den + dl = a + 2 by 2Sum).
    den = a + _GC
    bb = den - a
    dl = (a - (den - bb)) + (_GC - bb)
    u0 = _ONE / den
    e = fma_f32(-u0, dl, fma_f32(-u0, den, _ONE))
    # s = 1 - 4 u0 (1 + e)
    tc = _F(-4.0) * u0
    s = fma_f32(tc, e, fma_f32(_F(-4.0), u0, _ONE))
    s2 = s * s
    s4 = s2 * s2
    g = fma_f32(s2, fma_f32(_GM5, s, _GM4), fma_f32(_GM3, s, _GM2))
    g2 = fma_f32(s2, fma_f32(_GM9, s, _GM8), fma_f32(_GM7, s, _GM6))
    g3 = fma_f32(_GM11, s, _GM10)
    g = fma_f32(s4, fma_f32(s4, g3, g2), g)
    # M = c0 + c1 s + s2 g = mh + ml
    p1h = _GM1 * s
    p1l = fma_f32(_GM1, s, -p1h)
    m1h = _GM0_HI + p1h
    m1l = (_GM0_HI - m1h) + p1h
    mt = fma_f32(s2, g, (m1l + p1l) + _GM0_LO)
    mh = m1h + mt
    ml = (m1h - mh) + mt
    # exp(-a*a/2) = 2**n (1 + rh + rest'), a*a/2 = whi + wlo exactly.
    h = a * a
    whi = _HALF * h
    wlo = _HALF * fma_f32(a, a, -h)
    nf = np.rint(whi * -_LOG2E)
    rh = fma_f32(nf, -_LN2_HI, -whi)  # exact
    rl = fma_f32(nf, -_LN2_LO, -wlo)
    rest = (rl + _exp_poly(rh + rl)) + fma_f32(e, rh, e)  # with the reciprocal's (1 + e)
    # x u0 M = zh + zl; x q 2**-n = zh + corr.
    kh = xs * u0
    kl = fma_f32(xs, u0, -kh)
    zh = kh * mh
    zl = fma_f32(kh, mh, -zh) + fma_f32(kh, ml, kl * mh)
    corr = fma_f32(zh, rh, fma_f32(zh, rest, fma_f32(zl, rh, zl)))
    n = _I(nf)  # in [-154, 0]
    n1 = n >> 1
    p1 = _pow2(n1)
    p2 = _pow2(n - n1)
    yneg = ((zh + corr) * p1) * p2  # one rounding into the denormals
    sc = p1 * p2
    y1 = fma_f32(-zh, sc, xs)
    ypos = y1 + fma_f32(-corr, sc, fma_f32(-zh, sc, xs - y1))  # xs - y1 is exact
    y = yneg if x < _ZERO else ypos
    y = x if (x == _ZERO) | (x > _GA_MAX) else y  # keeps -0; +inf
    return _NAN if x == -_INF else y


@_jit
def _gelu_erf_impl(x):
    return _gelu_erf(x)


_call_gelu_erf = _always_inline(_gelu_erf_impl)


@_pub
def gelu_erf_f32(x):
    """Exact GELU ``0.5 x (1 + erf(x / sqrt(2)))`` = ``x Phi(x)``; NaN at -inf like torch.

    Signature: ``gelu_erf_f32(x: float32) -> float32``.
    """
    return _call_gelu_erf(np.float32(x))


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
        f"Apply :func:`{fn_name}` elementwise to ``x`` (converted to float32).\n\n"
        f"Signature: ``{name}(x: np.ndarray) -> np.ndarray`` (float32, same shape)."
    )
    wrapper.kernel = loop
    return wrapper


@njit(fastmath=True, error_model="numpy", cache=True)
def _loop_exp(x, out):
    for i in range(x.size):
        out[i] = exp_f32(x[i])


vexp = _wrap(_loop_exp, "vexp", "exp_f32")


@njit(fastmath=True, error_model="numpy", cache=True)
def _loop_expm1(x, out):
    for i in range(x.size):
        out[i] = expm1_f32(x[i])


vexpm1 = _wrap(_loop_expm1, "vexpm1", "expm1_f32")


@njit(fastmath=True, error_model="numpy", cache=True)
def _loop_log(x, out):
    for i in range(x.size):
        out[i] = log_f32(x[i])


vlog = _wrap(_loop_log, "vlog", "log_f32")


@njit(fastmath=True, error_model="numpy", cache=True)
def _loop_log1p(x, out):
    for i in range(x.size):
        out[i] = log1p_f32(x[i])


vlog1p = _wrap(_loop_log1p, "vlog1p", "log1p_f32")


@njit(fastmath=True, error_model="numpy", cache=True)
def _loop_tanh(x, out):
    for i in range(x.size):
        out[i] = tanh_f32(x[i])


vtanh = _wrap(_loop_tanh, "vtanh", "tanh_f32")


@njit(fastmath=True, error_model="numpy", cache=True)
def _loop_sigmoid(x, out):
    for i in range(x.size):
        out[i] = sigmoid_f32(x[i])


vsigmoid = _wrap(_loop_sigmoid, "vsigmoid", "sigmoid_f32")


@njit(fastmath=True, error_model="numpy", cache=True)
def _loop_silu(x, out):
    for i in range(x.size):
        out[i] = silu_f32(x[i])


vsilu = _wrap(_loop_silu, "vsilu", "silu_f32")


@njit(fastmath=True, error_model="numpy", cache=True)
def _loop_erf(x, out):
    for i in range(x.size):
        out[i] = erf_f32(x[i])


verf = _wrap(_loop_erf, "verf", "erf_f32")


@njit(fastmath=True, error_model="numpy", cache=True)
def _loop_erfc(x, out):
    for i in range(x.size):
        out[i] = erfc_f32(x[i])


verfc = _wrap(_loop_erfc, "verfc", "erfc_f32")


@njit(fastmath=True, error_model="numpy", cache=True)
def _loop_sin(x, out):
    for i in range(x.size):
        out[i] = sin_f32(x[i])


vsin = _wrap(_loop_sin, "vsin", "sin_f32")


@njit(fastmath=True, error_model="numpy", cache=True)
def _loop_cos(x, out):
    for i in range(x.size):
        out[i] = cos_f32(x[i])


vcos = _wrap(_loop_cos, "vcos", "cos_f32")


@njit(fastmath=True, error_model="numpy", cache=True)
def _loop_gelu_tanh(x, out):
    for i in range(x.size):
        out[i] = gelu_tanh_f32(x[i])


vgelu_tanh = _wrap(_loop_gelu_tanh, "vgelu_tanh", "gelu_tanh_f32")


@njit(fastmath=True, error_model="numpy", cache=True)
def _loop_gelu_erf(x, out):
    for i in range(x.size):
        out[i] = gelu_erf_f32(x[i])


vgelu_erf = _wrap(_loop_gelu_erf, "vgelu_erf", "gelu_erf_f32")
