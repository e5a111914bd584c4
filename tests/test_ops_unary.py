"""Unary and parameterized elementwise ops: templates, forward and gradients.

The first group compiles every elementwise template (the scalar Numba
lowering of each table entry) and checks it against the entry's numpy
implementation on edge values, independently of any code generator. The rest
check the f16/bf16 widened forms bit for bit against "cast to f32, run the
f32 op, cast back". Comparisons with PyTorch are in test_ops_unary_torch.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import fucina as F
from fucina.kernels import scalar_fns as sf
from fucina.kernels import vecmath as vm
from fucina.kernels.elementwise import BINARY, PUBLIC_UNARY, UNARY
from fucina.kernels.elementwise import dropout_keep_mask as np_keep_mask

RNG = np.random.default_rng(7)

try:
    from fucina.kernels.codegen import FASTMATH as _FM_TEXT

    FASTMATH = eval(_FM_TEXT)
except Exception:
    FASTMATH = {"nsz", "arcp", "contract", "afn", "reassoc"}

EDGE = np.array([
    np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30, -1e30, 3e38, -3e38, 1e-40, -1e-40, 1e-6, -1e-6,
    0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 1.0, -1.0, 3.7, -3.7, 9.99, 10.0, -10.0, 20.0, -20.0,
    88.0, -88.0, 100.0, -100.0, 65519.0, 65521.0, 8388609.0, -8388609.0,
], dtype=np.float32)
X = np.concatenate([EDGE, (RNG.standard_normal(300) * 4).astype(np.float32)])

PARAMS = {
    "leaky_relu": (0.1,), "d_leaky_relu": (0.1,), "clamp": (-1.0, 2.0), "d_clamp": (-1.0, 2.0),
    "dropout": (1234, 0.3), "d_softcap_out": (30.0,),
}
# vecmath's sin/cos reduce the argument accurately for |x| <= 2**22 (documented range).
LIMITED = {"sin": 2.0**22, "cos": 2.0**22, "d_cos": 2.0**22}


def _template_kernel(entries: list[tuple[str, int]]):
    """One njit kernel evaluating every template into row k of a float64 output."""
    from numba import njit

    args, lines = ["x", "out"], []
    for k, (fn, nparams) in enumerate(entries):
        names = {f"p{j}": f"p_{k}_{j}" for j in range(nparams)}
        args += list(names.values())
        expr = UNARY[fn].template.format(x="v", i="i", **names)
        lines.append(f"        out[{k}, i] = np.float64(np.float32({expr}))")
    src = (f"def kern({', '.join(args)}):\n    for i in range(x.shape[0]):\n"
           "        v = x[i]\n" + "\n".join(lines) + "\n")
    env = {"math": math, "np": np, "sf": sf, "vm": vm}
    exec(src, env)
    return njit(fastmath=FASTMATH)(env["kern"])


def test_every_unary_template_matches_its_numpy_implementation():
    fns = [fn for fn in UNARY if fn != "logical_not"]
    entries = [(fn, UNARY[fn].nparams) for fn in fns]
    kern = _template_kernel(entries)
    out = np.empty((len(fns), X.size), dtype=np.float64)
    params = [p for fn in fns for p in PARAMS.get(fn, ())]
    assert all(UNARY[fn].nparams == len(PARAMS.get(fn, ())) for fn in fns)
    kern(X, out, *params)
    failures = []
    for k, fn in enumerate(fns):
        d = UNARY[fn]
        with np.errstate(all="ignore"):
            ref = np.asarray(d.numpy(X, *PARAMS.get(fn, ())), dtype=np.float64)
        got = out[k] if not d.out_bool else out[k] != 0
        sel = np.abs(X) <= LIMITED.get(fn, np.inf)
        sel |= np.isnan(X)
        if fn in LIMITED:
            sel &= np.isfinite(X)
        if d.out_bool:
            ok = np.array_equal(got[sel], ref[sel].astype(bool))
        else:
            rtol = 1e-3 if fn == "gelu_quant" else (3e-5 if fn.startswith("d_") else 1e-5)
            atol = 3e-7 if fn.startswith("d_") else 1e-37
            ok = np.allclose(got[sel], ref[sel], rtol=rtol, atol=atol, equal_nan=True)
        if not ok:
            bad = ~np.isclose(got, ref, rtol=1e-5, atol=1e-37, equal_nan=True) & sel
            failures.append((fn, X[bad][:5], got[bad][:5], ref[bad][:5]))
    assert not failures, failures


def test_binary_scalar_helpers_match_numpy():
    from numba import njit

    def compile_binary(fn: str):
        src = ("def kern(a, b, out):\n    for i in range(a.shape[0]):\n"
               f"        out[i] = {BINARY[fn].template.format(a='a[i]', b='b[i]')}\n")
        env = {"math": math, "np": np, "sf": sf, "vm": vm}
        exec(src, env)
        return njit(fastmath=FASTMATH)(env["kern"])

    a = np.concatenate([EDGE, RNG.standard_normal(50).astype(np.float32) * 3])
    b = np.roll(a, 7)
    a = np.concatenate([a, [0, 0, -2, -2, 4, 0.5]]).astype(np.float32)
    b = np.concatenate([b, [0, -1, 0.5, 3, 0.5, -2]]).astype(np.float32)
    for fn in ("maximum", "minimum", "pow"):
        out = np.empty_like(a)
        compile_binary(fn)(a, b, out)
        with np.errstate(all="ignore"):
            ref = BINARY[fn].numpy(a, b)
        np.testing.assert_allclose(out, ref, rtol=1e-6, equal_nan=True, err_msg=fn)
    ia = np.array([7, -7, 7, -7, 0, -128, 127, -128, 5, -5], dtype=np.int8)
    ib = np.array([2, 2, -2, -2, 3, -1, -1, 3, 5, 3], dtype=np.int8)
    for fn in ("div_trunc", "div_floor", "rem", "mod"):
        out = np.empty_like(ia)
        compile_binary(fn)(ia, ib, out)
        with np.errstate(all="ignore"):
            ref = BINARY[fn].numpy(ia, ib).astype(np.int8)
        np.testing.assert_array_equal(out, ref, err_msg=fn)


def test_public_unary_names_all_have_table_entries():
    assert set(PUBLIC_UNARY) <= set(UNARY)
    assert len(PUBLIC_UNARY) == 27


# -- numpy-only facade checks -------------------------------------------------------------




def _vec(ctx, values, dtype="f32"):
    v = np.asarray(values, dtype=np.float32)
    return F.Tensor("d").from_slice(ctx, (v.size,), v).to(dtype) if dtype != "f32" else \
        F.Tensor("d").from_slice(ctx, (v.size,), v)


def test_reference_snippet_unary(ctx):
    x = F.Tensor("d").from_slice(ctx, (3,), [-1, 0, 1])
    np.testing.assert_array_equal(x.relu().numpy(), [0, 0, 1])
    s = x.silu()
    assert abs(s.numpy()[2] - 0.7310586) < 1e-6
    np.testing.assert_array_equal(x.unary("silu").numpy(), s.numpy())


def test_round_is_half_to_even_and_sign_keeps_nan_and_zero_sign(ctx):
    x = _vec(ctx, [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, 8388609.0, np.nan, np.inf])
    np.testing.assert_array_equal(x.round().numpy(),
                                  [0, 2, 2, -0.0, -2, -2, 0, 8388609.0, np.nan, np.inf])
    assert np.signbit(x.round().numpy()[3])
    s = _vec(ctx, [3.0, -2.0, 0.0, -0.0, np.nan, -np.inf]).sign().numpy()
    np.testing.assert_array_equal(s, [1, -1, 0, -0.0, np.nan, -1])
    assert np.signbit(s[3]) and not np.signbit(s[2])


def test_fast_tanh_softcap_gelu_quant_values(ctx):
    v = np.array([-12.0, -3.0, -0.7, 0.0, 0.2, 1.0, 4.0, 30.0, 1e10], dtype=np.float32)
    x = _vec(ctx, v)
    a, b, c, d, e = 2.45550750702956, 0.893229853513558, 0.821226666969744, \
        2.44506634652299, 0.814642734961073
    w = v.astype(np.float64)
    aw = abs(w)
    ref = w * (a + a * aw + (b + c * aw) * w * w) / (d + (d + w * w) * abs(w + e * w * aw))
    ref = np.clip(ref, -1.0, 1.0)  # the rational passes 1 beyond |x| = 8.56: saturated
    np.testing.assert_allclose(x.fast_tanh().numpy(), ref, rtol=1e-6)
    np.testing.assert_allclose(x.softcap30().numpy(), 30 * np.tanh(w / 30), rtol=2e-6)
    np.testing.assert_allclose(x.softcap15().numpy(), 15 * np.tanh(w / 15), rtol=2e-6)
    # gelu_quant: f16-rounded input and output, hard clamps at +-10
    q = x.unary("gelu_quant").numpy()
    with np.errstate(over="ignore"):
        xr = v.astype(np.float16).astype(np.float64)
    g = 0.5 * xr * (1 + np.tanh(0.7978845608028654 * (xr + 0.044715 * xr ** 3)))
    with np.errstate(over="ignore", invalid="ignore"):
        g16 = g.astype(np.float16).astype(np.float32)
    ref_q = np.where(v <= -10, 0, np.where(v >= 10, v, g16))
    np.testing.assert_allclose(q, ref_q, rtol=1e-3, atol=1e-7)
    assert q[0] == 0 and q[-2] == 30.0


def test_clamp_forms_and_leaky_relu(ctx):
    x = _vec(ctx, [-3.0, -1.0, 0.0, 1.0, 3.0, np.nan])
    np.testing.assert_array_equal(x.clamp(-1, 1).numpy(), [-1, -1, 0, 1, 1, np.nan])
    np.testing.assert_array_equal(x.clamp_min(0).numpy(), [0, 0, 0, 1, 3, np.nan])
    np.testing.assert_array_equal(x.clamp_max(0).numpy(), [-3, -1, 0, 0, 0, np.nan])
    np.testing.assert_array_equal(x.clamp(None, 1).numpy(), x.clamp_max(1).numpy())
    np.testing.assert_allclose(x.leaky_relu(0.2).numpy(), [-0.6, -0.2, 0, 1, 3, np.nan],
                               rtol=1e-6)
    np.testing.assert_allclose(x.leaky_relu().numpy()[0], -0.03, rtol=1e-6)


def test_unary_errors_and_branch_surfaces(ctx):
    x = _vec(ctx, [1.0, 2.0])
    with pytest.raises(F.TagError):
        x.unary("bogus")
    with pytest.raises(F.TagError):
        x.unary("leaky_relu")  # parameterized: not a UnaryOp
    with pytest.raises(F.InvalidShape):
        x.clamp(2.0, 1.0)
    with pytest.raises(F.InvalidShape):
        x.clamp(float("nan"), 1.0)
    with pytest.raises(TypeError):
        x.clamp("a", 1.0)
    with pytest.raises(TypeError):
        x.leaky_relu(True)
    with pytest.raises(TypeError):
        x.pow_scalar("2")
    assert abs(x).numpy().tolist() == [1.0, 2.0]
    for dt in ("i32", "i64", "bool", "f64", "u8"):
        T = F.Tensor("d", dtype=dt)
        for name in ("relu", "unary", "exp", "clamp", "dropout", "pow"):
            assert not hasattr(T, name), (dt, name)
    H = F.Tensor("d", dtype="f16")
    for name in ("relu", "unary", "leaky_relu", "clamp", "pow_scalar", "gelu_erf", "round"):
        assert hasattr(H, name)
    for name in ("dropout", "pow", "clamp_min", "isnan"):
        assert not hasattr(H, name)


# -- dropout ------------------------------------------------------------------------


def test_dropout_mask_is_the_counter_stream(ctx):
    shape, p, seed = (4, 50), 0.3, 99
    x = F.Tensor("r", "c").from_slice(ctx, shape, np.ones(shape, np.float32))
    y = x.dropout(p, seed).numpy()
    # element i is kept iff the 53-bit uniform of rng.at(seed, i) is below 1 - p
    u = np.array([(F.rng.at(seed, i) >> 11) * 2.0**-53 for i in range(200)]).reshape(shape)
    keep = u < 1 - np.float64(np.float32(p))
    np.testing.assert_array_equal(keep, np_keep_mask(seed, p, shape))
    scale = np.float32(1) / (np.float32(1) - np.float32(p))
    np.testing.assert_array_equal(y, np.where(keep, scale, 0).astype(np.float32))
    np.testing.assert_array_equal(x.dropout(p, seed).numpy(), y)  # same seed, same mask
    assert not np.array_equal(x.dropout(p, seed + 1).numpy(), y)
    big = F.Tensor("n").from_slice(ctx, (20000,), np.ones(20000, np.float32))
    kept = np.count_nonzero(big.dropout(0.25, 5).numpy()) / 20000
    assert abs(kept - 0.75) < 0.02


def test_dropout_index_is_logical_row_major(ctx):
    v = RNG.standard_normal((3, 5)).astype(np.float32)
    x = F.Tensor("r", "c").from_slice(ctx, (3, 5), v)
    direct = F.Tensor("c", "r").from_slice(ctx, (5, 3), np.ascontiguousarray(v.T))
    # a permuted view drops by its own logical order, like a materialized copy
    view = x.permute_to(("c", "r"))
    np.testing.assert_array_equal(view.dropout(0.5, 3).numpy(), direct.dropout(0.5, 3).numpy())


def test_dropout_gradient_is_mask_times_scale(ctx):
    shape, p, seed = (3, 7), 0.4, 2024
    x = F.Tensor("r", "c").variable_from_slice(ctx, shape, RNG.standard_normal(shape))
    with ctx.exec_scope():
        x.dropout(p, seed).sum_all().backward()
    keep = np_keep_mask(seed, p, shape)
    scale = np.float32(1) / (np.float32(1) - np.float32(p))
    np.testing.assert_array_equal(x.grad().numpy(), np.where(keep, scale, 0))


def test_dropout_p_zero_and_errors(ctx):
    x = F.Tensor("d").variable_from_slice(ctx, (3,), [1.0, -2.0, 3.0])
    y = x.dropout(0.0, 1)
    np.testing.assert_array_equal(y.numpy(), [1.0, -2.0, 3.0])
    assert y.requires_grad
    for bad in (1.0, -0.1, 1.5, float("nan"), 0.99999999999):
        with pytest.raises(F.InvalidShape):
            x.dropout(bad, 1)
    with pytest.raises(TypeError):
        x.dropout("0.5", 1)
    with pytest.raises(TypeError):
        x.dropout(0.5, 1.5)
    with pytest.raises(TypeError):
        x.dropout(0.5, True)
    x.dropout(0.5, -1)  # any integer seed (reduced mod 2**64)
    x.dropout(0.5, 2**64 + 5)


def test_compiled_elementwise_chains_match_eager(ctx):
    v = (RNG.standard_normal((4, 6)) * 2).astype(np.float32)
    x = F.Tensor("r", "c").from_slice(ctx, (4, 6), v)
    fns = [
        lambda t: t.dropout(0.3, 11),
        lambda t: t.gelu().dropout(0.5, 3).add_scalar(1.0),
        lambda t: t.silu().mul(t.sigmoid()).clamp(-0.5, 0.5).leaky_relu(0.1),
        lambda t: t.abs().pow(t).round().sign(),
        lambda t: t.unary("softplus").rsqrt().fast_tanh().gelu_erf(),
    ]
    for fn in fns:
        np.testing.assert_allclose(F.compile(fn)(x).numpy(), fn(x).numpy(), rtol=1e-5,
                                   atol=1e-6, equal_nan=True)


def test_compiled_dropout_fused_into_a_reduction(ctx):
    v = RNG.standard_normal((4, 6)).astype(np.float32)
    x = F.Tensor("r", "c").from_slice(ctx, (4, 6), v)

    def fn(t):
        return t.dropout(0.3, 11).sum("c")

    np.testing.assert_allclose(F.compile(fn)(x).numpy(), fn(x).numpy(), rtol=1e-5)


# -- f16 / bf16: widen, run the f32 op, narrow once ------------------------------------


def _bits(t):
    return t.data_const().view(np.uint16).copy()


_HALF_UNARY = ["relu", "exp", "sqrt", "rsqrt", "sigmoid", "silu", "log", "log1p", "abs", "sin",
               "cos", "tanh", "fast_tanh", "softcap30", "softcap15", "gelu", "quick_gelu", "elu",
               "gelu_erf", "floor", "ceil", "round", "sign", "reciprocal"]


@pytest.mark.parametrize("dt", ["f16", "bf16"])
def test_half_unary_parity_with_f32_cast_op_cast(ctx, dt):
    v = np.concatenate([RNG.standard_normal(40) * 3, [0.0, -0.0, 2.5, -2.5, 1e-3, np.inf,
                                                      -np.inf, np.nan, 70000.0]])
    h = F.Tensor("d").from_slice(ctx, (v.size,), v.astype(np.float32)).to(dt)
    wide = h.to("f32")
    for name in _HALF_UNARY:
        got = getattr(h, name)()
        assert got.dtype is F.DType(dt), name
        want = getattr(wide, name)().to(dt)
        np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=name)
    for op in PUBLIC_UNARY:
        np.testing.assert_array_equal(_bits(h.unary(op)), _bits(wide.unary(op).to(dt)),
                                      err_msg=op)
    cases = [(lambda t: t.leaky_relu(0.3)), (lambda t: t.clamp(-0.7, 1.3)),
             (lambda t: t.pow_scalar(0.1)), (lambda t: t.pow_scalar(3))]
    for f in cases:
        np.testing.assert_array_equal(_bits(f(h)), _bits(f(wide).to(dt)))


def test_half_math_is_forward_only(ctx):
    h = F.Tensor("d", dtype="bf16").variable_from_slice(ctx, (2,), [1.0, 2.0])
    with pytest.raises(F.UnsupportedGradient):
        h.relu()
    with pytest.raises(F.UnsupportedGradient):
        h.clamp(0, 1)
    assert h.detach().exp().dtype is F.bf16


#: Each op at (NaN, +inf, -inf) by its defining formula in IEEE arithmetic, the
#: reference's semantics. torch's own results at non-finite inputs depend on the CPU's
#: vector path (gelu_erf(+inf) is NaN under AVX-512), so they are not the oracle here.
NON_FINITE = {
    "relu": (np.nan, np.inf, 0.0), "exp": (np.nan, np.inf, 0.0),
    "sigmoid": (np.nan, 1.0, 0.0), "silu": (np.nan, np.inf, np.nan),  # -inf * 0
    "tanh": (np.nan, 1.0, -1.0), "gelu": (np.nan, np.inf, np.nan),
    "gelu_erf": (np.nan, np.inf, np.nan), "elu": (np.nan, np.inf, -1.0),
    "floor": (np.nan, np.inf, -np.inf), "ceil": (np.nan, np.inf, -np.inf),
    "round": (np.nan, np.inf, -np.inf), "abs": (np.nan, np.inf, np.inf),
    "reciprocal": (np.nan, 0.0, -0.0), "rsqrt": (np.nan, 0.0, np.nan),
    "log1p": (np.nan, np.inf, np.nan), "sqrt": (np.nan, np.inf, np.nan),
    "log": (np.nan, np.inf, np.nan), "softcap30": (np.nan, 30.0, -30.0),
}


def test_unary_non_finite_values_follow_the_reference(ctx):
    v = np.array([np.nan, np.inf, -np.inf], dtype=np.float32)
    # 3 values take the scalar loop; 96 (the same, tiled) the vector loop too.
    for n in (1, 32):
        x = F.Tensor("d").from_slice(ctx, (3 * n,), np.tile(v, n))
        for name, want in NON_FINITE.items():
            expect = np.tile(np.float32(want), n)
            eager = getattr(x, name)().numpy()
            compiled = F.compile(lambda x, name=name: getattr(x, name)())(x).numpy()
            for got in (eager, compiled):
                np.testing.assert_array_equal(got, expect, err_msg=name)
                if want[2] == 0:  # reciprocal(-inf) is -0, relu(-inf) +0
                    assert np.signbit(got[2]) == np.signbit(want[2]), name
        np.testing.assert_array_equal(x.unary("softplus").numpy(),
                                      np.tile(np.float32([np.nan, np.inf, 0.0]), n))
