"""Gated activations, snake and prelu without torch: the reference's snippet, hand values,
the f16/bf16 branch and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest

import fucina as F


def _t(ctx, tags, values, dtype=None):
    v = np.asarray(values, dtype=np.float32)
    T = F.Tensor(*tags, dtype=dtype) if dtype else F.Tensor(*tags)
    return T.from_slice(ctx, v.shape, v)


def _sigmoid(v):
    return 1 / (1 + math.exp(-v))


def test_reference_snippet_gated_pointwise_and_split(ctx):
    up = _t(ctx, ("d",), [2])
    gate = _t(ctx, ("d",), [1])
    y = up.swiglu(gate)  # up * silu(gate)
    assert abs(y.data_const()[0] - 2 * 0.7310586) <= 1e-6
    fused = _t(ctx, ("ff",), [1, 2])
    z = fused.split_gated("swiglu", "ff", "d")  # silu(first half) * second half
    assert type(z) is F.Tensor("d")
    assert abs(z.data_const()[0] - 0.7310586 * 2) <= 1e-6


def test_hand_values(ctx):
    up, gate = _t(ctx, ("d",), [2.0, -1.0]), _t(ctx, ("d",), [0.5, 3.0])
    np.testing.assert_allclose(up.glu(gate).numpy(), [2 * _sigmoid(0.5), -_sigmoid(3)],
                               rtol=1e-6)
    np.testing.assert_allclose(up.gated(gate, "glu").numpy(), up.glu(gate).numpy())
    situ = [25 * math.tanh(u / 25) * 4 * math.tanh(g / 4) * _sigmoid(g)
            for u, g in ((2.0, 0.5), (-1.0, 3.0))]
    np.testing.assert_allclose(up.situ(gate).numpy(), situ, rtol=1e-6)
    # split glu gates the first half with the second
    np.testing.assert_allclose(_t(ctx, ("f",), [2.0, 0.5]).split_gated("glu", "f", "f")
                               .numpy(), [2 * _sigmoid(0.5)], rtol=1e-6)
    x = _t(ctx, ("t", "c"), [[1.0, -2.0]])
    s = x.snake("c", _t(ctx, ("c",), [2.0, 0.5]), _t(ctx, ("c",), [0.5, 4.0]))
    np.testing.assert_allclose(s.numpy(), [[1 + 0.5 * math.sin(2) ** 2,
                                            -2 + 4 * math.sin(-1) ** 2]], rtol=1e-6)
    p = x.prelu(_t(ctx, ("c",), [0.1, 0.25]))
    np.testing.assert_allclose(p.numpy(), [[1.0, -0.5]])


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_half_branch(ctx, dtype):
    rng = np.random.default_rng(2)
    u0, g0 = rng.standard_normal((2, 6)), rng.standard_normal((2, 6))
    u = _t(ctx, ("t", "d"), u0).to(dtype)
    g = _t(ctx, ("t", "d"), g0).to(dtype)
    for op in ("glu", "swiglu", "geglu"):
        got = getattr(u, op)(g)
        assert got.dtype is F.DType(dtype)
        want = u.to("f32").gated(g.to("f32"), op).to(dtype)
        np.testing.assert_array_equal(got.to("f32").numpy(), want.to("f32").numpy())
    with pytest.raises(F.TagError, match="situ"):
        u.gated(g, "situ")
    for name in ("situ", "split_gated", "snake", "prelu", "elemental_unary"):
        assert not hasattr(u, name)


def test_gated_errors(ctx):
    x = _t(ctx, ("t", "d"), np.ones((2, 4)))
    with pytest.raises(F.TagError, match="unknown gated op"):
        x.gated(x, "reglu")
    with pytest.raises(F.TagError, match="inference-only"):
        x.gated(x, "swiglu_clamp10")
    with pytest.raises(F.TagError, match="inference-only"):
        x.split_gated("swiglu_clamp10", "d", "d")
    for op in ("geglu", "situ"):
        with pytest.raises(F.TagError, match="split_gated"):
            x.split_gated(op, "d", "h")
    with pytest.raises(F.InvalidShape, match="odd"):
        _t(ctx, ("d",), np.ones(3)).split_gated("glu", "d", "d")
    with pytest.raises(F.TagError):
        x.split_gated("glu", "d", "t")  # the new tag already exists
    with pytest.raises(F.ShapeMismatch):
        x.swiglu(_t(ctx, ("d",), np.ones(3)))
    with pytest.raises(F.TagError, match="dtype"):
        x.swiglu(x.to("f16"))
    with pytest.raises(TypeError):
        x.swiglu(2.0)


def test_activation_errors(ctx):
    x = _t(ctx, ("t", "c"), np.ones((2, 3)))
    with pytest.raises(F.TagError, match="innermost"):
        x.prelu(_t(ctx, ("t",), np.ones(2)))
    with pytest.raises(F.ShapeMismatch):
        x.prelu(_t(ctx, ("c",), np.ones(2)))
    with pytest.raises(F.TagError):
        x.prelu(_t(ctx, ("a", "c"), np.ones((1, 3))))
    with pytest.raises(F.TagError):
        F.Tensor().scalar(ctx, 1.0).prelu(_t(ctx, ("c",), [1.0]))
    with pytest.raises(F.TagError, match="tagged"):
        x.snake("c", _t(ctx, ("t",), np.ones(2)), _t(ctx, ("c",), np.ones(3)))
    with pytest.raises(F.ShapeMismatch):
        x.snake("c", _t(ctx, ("c",), np.ones(2)), _t(ctx, ("c",), np.ones(3)))
