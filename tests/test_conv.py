"""Convolution and channel-last vision ops (REFERENCE §4.14) against torch.

Each case runs eagerly and under ``fucina.compile`` (forward and backward in
one program) and checks the values and the gradients of a random-weighted sum
of the result w.r.t. every differentiable input against torch autograd, with
torch's operands permuted into its channel-first layouts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import fucina as F

torch = pytest.importorskip("torch")
tnf = torch.nn.functional


def _run(ctx: F.ExecContext, fu: Callable[..., Any], th: Callable[..., Any],
         inputs: list[tuple[tuple[str, ...], np.ndarray, bool]], *, rtol: float = 1e-4,
         atol: float = 1e-4, seed: int = 0) -> None:
    """``fu`` (fucina tensors) and ``th`` (torch tensors, returning the result in
    fucina's layout) agree in value and in every differentiable input's gradient,
    eagerly and compiled."""
    rng = np.random.default_rng(seed)
    tts = [torch.tensor(a, requires_grad=d) for _, a, d in inputs]
    yt = th(*tts)
    r = rng.standard_normal(tuple(yt.shape)).astype(np.float32)
    (yt * torch.tensor(r)).sum().backward()
    want_grads = [t.grad.numpy() if d else None for t, (_, _, d) in zip(tts, inputs)]

    def make() -> list[Any]:
        out = []
        for tags, a, d in inputs:
            T = F.Tensor(*tags)
            out.append(T.variable_from_slice(ctx, a.shape, a) if d else
                       T.from_slice(ctx, a.shape, a))
        return out

    for mode in ("eager", "compiled"):
        xs = make()

        def step(*xs: Any) -> Any:
            y = fu(*xs)
            w = type(y).from_slice(ctx, y.shape, r.reshape(y.shape))
            y.mul(w).sum_all().backward()
            return y

        y = step(*xs) if mode == "eager" else F.compile(step)(*xs)
        np.testing.assert_allclose(y.numpy(), yt.detach().numpy().reshape(y.shape), rtol=rtol,
                                   atol=atol, err_msg=f"{mode} forward")
        for k, (x, g) in enumerate(zip(xs, want_grads)):
            if g is not None:
                np.testing.assert_allclose(x.grad().numpy(), g, rtol=rtol, atol=atol,
                                           err_msg=f"{mode} gradient of input {k}")


def _rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _nchw(t: Any) -> Any:
    """[..., H, W, C] torch tensor -> [N, C, H, W]."""
    return t.reshape(-1, *t.shape[-3:]).permute(0, 3, 1, 2)


def _nhwc(t: Any, lead: tuple[int, ...]) -> Any:
    return t.permute(0, 2, 3, 1).reshape(*lead, *t.shape[2:], t.shape[1])


# -- conv2d ------------------------------------------------------------------------------


CONV2D_CASES = [
    # (lead, H, W, C, Cout, k, stride, pad, groups, bias)
    ((), 5, 6, 3, 4, (3, 3), (1, 1), (1, 1), 1, True),       # im2col (cin < 4)
    ((2,), 7, 6, 8, 5, (3, 3), (1, 1), (1, 1), 1, True),     # Winograd F2, odd output
    ((2,), 6, 6, 8, 6, (3, 3), (1, 1), (0, 0), 1, False),    # Winograd F2, no padding
    ((1,), 10, 9, 8, 5, (3, 3), (1, 1), (1, 1), 1, True),    # Winograd F4, partial tiles
    ((2,), 10, 11, 6, 4, (3, 3), (1, 1), (0, 1), 1, True),   # Winograd F4, mixed padding
    ((1,), 10, 9, 16, 32, (3, 3), (1, 1), (1, 1), 1, True),  # F4 fused, micro-kernel planes
    ((1,), 9, 8, 96, 96, (3, 3), (1, 1), (1, 1), 1, True),   # F4, chunked (deep channels)
    ((2,), 5, 4, 96, 96, (3, 3), (1, 1), (1, 1), 1, False),  # F2, chunked (deep channels)
    ((1,), 9, 8, 4, 3, (3, 3), (2, 2), (1, 1), 1, True),     # stride 2 (col2im grad)
    ((2,), 6, 7, 5, 3, (2, 3), (1, 2), (1, 0), 1, True),     # rectangular, mixed
    ((2,), 4, 4, 6, 7, (1, 1), (1, 1), (0, 0), 1, True),     # 1x1: one GEMM
    ((2,), 6, 5, 6, 4, (3, 3), (1, 1), (1, 1), 2, True),     # grouped
    ((2,), 6, 5, 4, 4, (3, 3), (1, 1), (1, 1), 4, True),     # depthwise
    ((1,), 7, 7, 3, 6, (3, 3), (2, 1), (1, 1), 3, False),    # depthwise x2 multiplier
    ((2, 2), 5, 5, 4, 4, (3, 3), (1, 1), (2, 2), 1, True),   # pad 2, two batch axes
]


@pytest.mark.parametrize("case", CONV2D_CASES)
def test_conv2d_matches_torch(ctx, case):
    lead, H, W, C, Co, (kh, kw), stride, pad, groups, has_bias = case
    rng = np.random.default_rng(1)
    x = _rand(rng, *lead, H, W, C)
    w = _rand(rng, Co, kh, kw, C // groups)
    b = _rand(rng, Co)
    btags = tuple(f"b{i}" for i in range(len(lead)))
    inputs = [((*btags, "h", "w", "c"), x, True), (("o", "kh", "kw", "i"), w, True)]
    if has_bias:
        inputs.append((("o",), b, True))

    def fu(x, w, b=None):
        return x.conv2d(w, b, stride, pad, groups, ("oh", "ow", "oc"))

    def th(x, w, b=None):
        y = tnf.conv2d(_nchw(x), w.permute(0, 3, 1, 2), b, stride, pad, 1, groups)
        return _nhwc(y, lead or (1,)).reshape(*lead, *y.shape[2:], Co)

    # Sums of K = kh*kw*C/groups products (Winograd reassociates them): the absolute
    # error grows like sqrt(K) with the outputs' own scale.
    tol = 1e-4 * max(1.0, np.sqrt(kh * kw * C / groups) / 8)
    _run(ctx, fu, th, inputs, atol=tol, rtol=tol)
    y = fu(*(F.Tensor(*t).from_slice(ctx, a.shape, a) for t, a, _ in inputs))
    assert y.axis_tags == (*btags, "oh", "ow", "oc")


def test_conv2d_reads_a_permuted_view(ctx):
    """An NCHW-stored image made channel-last by tags (a strided view) convolves the
    same as its contiguous copy, and the gradient lands in the NCHW layout."""
    rng = np.random.default_rng(16)
    x0 = _rand(rng, 2, 8, 5, 6)  # n, c, h, w
    w0 = _rand(rng, 4, 3, 3, 8)
    w = F.Tensor("o", "kh", "kw", "i").from_slice(ctx, w0.shape, w0)
    x = F.Tensor("n", "c", "h", "w").variable_from_slice(ctx, x0.shape, x0)
    y = x.permute_to(("n", "h", "w", "c")).conv2d(w, None, 1, 1, 1, ("oh", "ow", "oc"))
    xt = torch.tensor(x0, requires_grad=True)
    yt = tnf.conv2d(xt, torch.tensor(w0).permute(0, 3, 1, 2), None, 1, 1).permute(0, 2, 3, 1)
    np.testing.assert_allclose(y.numpy(), yt.detach().numpy(), rtol=1e-4, atol=1e-4)
    y.sum_all().backward()
    yt.sum().backward()
    np.testing.assert_allclose(x.grad().numpy(), xt.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_conv2d_relu_fused_and_composed_agree(ctx):
    rng = np.random.default_rng(2)
    x = _rand(rng, 2, 6, 6, 8)
    w = _rand(rng, 5, 3, 3, 8)
    b = _rand(rng, 5)

    def th(x, w, b):
        return tnf.relu(tnf.conv2d(_nchw(x), w.permute(0, 3, 1, 2), b, 1, 1)).permute(0, 2, 3, 1)

    # With grads: the composed path, checked against torch (eager and compiled).
    _run(ctx, lambda x, w, b: x.conv2d_relu(w, b, 1, 1, 1, ("oh", "ow", "oc")), th,
         [(("n", "h", "w", "c"), x, True), (("o", "kh", "kw", "i"), w, True),
          (("o",), b, True)])
    # Without grads: the fused epilogue gives the same values as conv2d then relu.
    xs = F.Tensor("n", "h", "w", "c").from_slice(ctx, x.shape, x)
    ws = F.Tensor("o", "kh", "kw", "i").from_slice(ctx, w.shape, w)
    bs = F.Tensor("o").from_slice(ctx, b.shape, b)
    fused = xs.conv2d_relu(ws, bs, 1, 1, 1, ("oh", "ow", "oc")).numpy()
    plain = xs.conv2d(ws, bs, 1, 1, 1, ("oh", "ow", "oc")).relu().numpy()
    np.testing.assert_array_equal(fused, plain)
    assert (fused >= 0).all() and (fused == 0).any()


def test_conv2d_prepared_is_bitwise_conv2d(ctx):
    rng = np.random.default_rng(3)
    x = F.Tensor("h", "w", "c").from_slice(ctx, (9, 8, 8), _rand(rng, 9, 8, 8))
    w = F.Tensor("o", "kh", "kw", "i").from_slice(ctx, (6, 3, 3, 8), _rand(rng, 6, 3, 3, 8))
    b = F.Tensor("o").from_slice(ctx, (6,), _rand(rng, 6))
    prep = w.prepare_conv2d_weights()
    assert isinstance(prep, F.PreparedConvWeights) and not prep.is_empty
    tags = ("oh", "ow", "oc")
    want = x.conv2d(w, b, 1, 1, 1, tags).numpy()
    np.testing.assert_array_equal(x.conv2d_prepared(w, prep, b, 1, 1, 1, tags).numpy(), want)
    np.testing.assert_array_equal(x.conv2d_prepared_relu(w, prep, b, 1, 1, 1, tags).numpy(),
                                  np.maximum(want, 0))
    fast = F.compile(lambda x: x.conv2d_prepared(w, prep, b, 1, 1, 1, tags))
    np.testing.assert_array_equal(fast(x).numpy(), want)
    as_arg = F.compile(lambda x, p: x.conv2d_prepared(w, p, b, 1, 1, 1, tags))
    np.testing.assert_array_equal(as_arg(x, prep).numpy(), want)
    # Routes that do not use the planes ignore them (stride 2 here).
    np.testing.assert_array_equal(x.conv2d_prepared(w, prep, b, 2, 1, 1, tags).numpy(),
                                  x.conv2d(w, b, 2, 1, 1, tags).numpy())
    # A weight that can never take the Winograd route prepares to the inert value.
    w5 = F.Tensor("o", "kh", "kw", "i").from_slice(ctx, (2, 5, 5, 8), _rand(rng, 2, 5, 5, 8))
    assert w5.prepare_conv2d_weights() is F.PreparedConvWeights.empty
    y5 = x.conv2d_prepared(w5, F.PreparedConvWeights.empty, None, 1, 2, 1, tags)
    np.testing.assert_array_equal(y5.numpy(), x.conv2d(w5, None, 1, 2, 1, tags).numpy())
    # A plane set of another weight's shape is rejected; deinit'ed planes too.
    with pytest.raises(F.ShapeMismatch):
        x.conv2d_prepared(w5, prep, None, 1, 1, 1, tags)
    prep.deinit()
    with pytest.raises(F.Deinitialized):
        x.conv2d_prepared(w, prep, b, 1, 1, 1, tags)


def test_prepared_conv_rejects_gradients(ctx):
    rng = np.random.default_rng(4)
    w = F.Tensor("o", "kh", "kw", "i").variable_from_slice(ctx, (4, 3, 3, 4),
                                                           _rand(rng, 4, 3, 3, 4))
    with pytest.raises(F.GradientPreparedConv2dUnsupported):
        w.prepare_conv2d_weights()
    prep = w.detach().prepare_conv2d_weights()
    x = F.Tensor("h", "w", "c").variable_from_slice(ctx, (5, 5, 4), _rand(rng, 5, 5, 4))
    with pytest.raises(F.GradientPreparedConv2dUnsupported):
        x.conv2d_prepared(w.detach(), prep, None, 1, 1, 1, ("oh", "ow", "oc"))
    with pytest.raises(F.UnsupportedGradient):  # the class is an UnsupportedGradient
        x.conv2d_prepared_relu(w.detach(), prep, None, 1, 1, 1, ("oh", "ow", "oc"))
    with F.no_grad():  # no gradient recorded: allowed
        x.conv2d_prepared(w.detach(), prep, None, 1, 1, 1, ("oh", "ow", "oc"))


@pytest.mark.parametrize("channels", [(8, 4), (96, 96)])  # fused and chunked Winograd
def test_conv2d_non_finite_inputs_stay_local(ctx, channels):
    """A NaN/inf pixel reaches exactly the outputs whose window reads it (the
    Winograd route would smear it over whole tiles, so it steps aside)."""
    cin, cout = channels
    rng = np.random.default_rng(5)
    x = _rand(rng, 1, 8, 8, cin)
    x[0, 3, 4, 2] = np.nan
    x[0, 6, 1, 5] = np.inf
    w = _rand(rng, cout, 3, 3, cin)
    want = tnf.conv2d(torch.tensor(x).permute(0, 3, 1, 2), torch.tensor(w).permute(0, 3, 1, 2),
                     None, 1, 1).permute(0, 2, 3, 1).numpy()
    got = F.Tensor("n", "h", "w", "c").from_slice(ctx, x.shape, x).conv2d(
        F.Tensor("o", "kh", "kw", "i").from_slice(ctx, w.shape, w), None, 1, 1, 1,
        ("oh", "ow", "oc")).numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    fin = np.isfinite(want)
    assert fin.sum() > 100
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-4, atol=1e-4 * max(1, cin // 16))


def test_conv2d_errors(ctx):
    x = F.Tensor("h", "w", "c").zeros(ctx, (5, 5, 4))
    w = F.Tensor("o", "kh", "kw", "i").zeros(ctx, (2, 3, 3, 4))
    tags = ("oh", "ow", "oc")
    with pytest.raises(F.ShapeMismatch, match="input channels"):
        x.conv2d(F.Tensor("o", "kh", "kw", "i").zeros(ctx, (2, 3, 3, 3)), None, 1, 0, 1, tags)
    with pytest.raises(F.ShapeMismatch, match="groups"):
        x.conv2d(F.Tensor("o", "kh", "kw", "i").zeros(ctx, (3, 3, 3, 2)), None, 1, 0, 2, tags)
    with pytest.raises(F.ShapeMismatch, match="bias"):
        x.conv2d(w, F.Tensor("o").zeros(ctx, (3,)), 1, 0, 1, tags)
    with pytest.raises(F.ShapeMismatch, match="no output"):
        x.conv2d(F.Tensor("o", "kh", "kw", "i").zeros(ctx, (2, 7, 7, 4)), None, 1, 0, 1, tags)
    with pytest.raises(ValueError, match="stride"):
        x.conv2d(w, None, 0, 0, 1, tags)
    with pytest.raises(ValueError, match="padding"):
        x.conv2d(w, None, 1, (-1, 0), 1, tags)
    with pytest.raises(TypeError, match="stride"):
        x.conv2d(w, None, 1.5, 0, 1, tags)
    with pytest.raises(F.TagError, match="rank-4"):
        x.conv2d(F.Tensor("o", "i").zeros(ctx, (2, 4)), None, 1, 0, 1, tags)
    with pytest.raises(F.TagError, match="out tags"):
        x.conv2d(w, None, 1, 0, 1, ("oh", "ow"))
    with pytest.raises(F.TagError, match="at least 3"):
        F.Tensor("w", "c").zeros(ctx, (5, 4)).conv2d(w, None, 1, 0, 1, tags)
    with pytest.raises(F.TagError, match="batch axis"):
        F.Tensor("oh", "h", "w", "c").zeros(ctx, (1, 5, 5, 4)).conv2d(w, None, 1, 0, 1, tags)
    with pytest.raises(F.TagError, match="f32"):
        x.conv2d(F.Tensor("o", "kh", "kw", "i", dtype="f16").zeros(ctx, (2, 3, 3, 4)), None,
                 1, 0, 1, tags)
    with pytest.raises(F.ContextMismatch):
        x.conv2d(F.Tensor("o", "kh", "kw", "i").zeros(F.ExecContext(), (2, 3, 3, 4)), None,
                 1, 0, 1, tags)


# -- pooling, upsampling, patches ----------------------------------------------------------------


@pytest.mark.parametrize("fn", ["max", "avg"])
@pytest.mark.parametrize("geom", [((2, 2), (2, 2), (0, 0)), ((3, 3), (2, 2), (1, 1)),
                                  ((3, 2), (1, 2), (1, 0)), ((3, 3), (1, 1), (1, 1))])
def test_pool2d_matches_torch(ctx, fn, geom):
    kernel, stride, pad = geom
    rng = np.random.default_rng(6)
    x = _rand(rng, 2, 7, 6, 5)
    x[0, 1, 1, :] = x[0, 1, 2, :]  # exact ties: the first maximum takes the gradient

    def fu(x):
        return getattr(x, f"{fn}_pool2d")(kernel, stride, pad)

    def th(x):
        if fn == "max":
            y = tnf.max_pool2d(_nchw(x), kernel, stride, pad)
        else:
            y = tnf.avg_pool2d(_nchw(x), kernel, stride, pad, count_include_pad=False)
        return y.permute(0, 2, 3, 1)

    _run(ctx, fu, th, [(("n", "h", "w", "c"), x, True)], rtol=1e-5, atol=1e-6)


def test_max_pool2d_nan_propagates_and_takes_the_gradient(ctx):
    x0 = np.array([[1.0, np.nan], [3.0, 2.0]], np.float32).reshape(2, 2, 1)
    x = F.Tensor("h", "w", "c").variable_from_slice(ctx, x0.shape, x0)
    y = x.max_pool2d(2, 2, 0)
    assert np.isnan(y.item())
    y.sum_all().backward()
    np.testing.assert_array_equal(x.grad().numpy().reshape(-1), [0, 1, 0, 0])


def test_pool2d_errors(ctx):
    x = F.Tensor("h", "w", "c").zeros(ctx, (4, 4, 2))
    with pytest.raises(ValueError, match="padding"):
        x.max_pool2d(2, 1, 2)
    with pytest.raises(F.ShapeMismatch, match="no output"):
        x.avg_pool2d(5, 1, 0)
    with pytest.raises(ValueError, match="kernel"):
        x.avg_pool2d((0, 2), 1, 0)
    with pytest.raises(F.TagError):
        F.Tensor("w", "c").zeros(ctx, (4, 2)).max_pool2d(2, 2, 0)


def test_upsample2x_nearest_matches_torch(ctx):
    rng = np.random.default_rng(7)
    x = _rand(rng, 2, 3, 4, 5)

    def th(x):
        return tnf.interpolate(_nchw(x), scale_factor=2, mode="nearest").permute(0, 2, 3, 1)

    _run(ctx, lambda x: x.upsample2x_nearest(), th, [(("n", "h", "w", "c"), x, True)],
         rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("geom", [((2, 2), (2, 2), (0, 0)), ((3, 3), (1, 1), (1, 1)),
                                  ((3, 2), (2, 1), (1, 1))])
def test_unfold_and_fold_match_torch(ctx, geom):
    kernel, stride, pad = geom
    rng = np.random.default_rng(8)
    H, W, C = 6, 5, 3
    x = _rand(rng, 2, H, W, C)
    kk = kernel[0] * kernel[1]

    def th_unfold(x):
        # torch: [N, C*kh*kw, L] with c slowest; ours: [N, L, kh*kw*C] with c fastest.
        u = tnf.unfold(_nchw(x), kernel, 1, pad, stride)
        n, _, L = u.shape
        return u.reshape(n, C, kk, L).permute(0, 3, 2, 1).reshape(n, L, kk * C)

    _run(ctx, lambda x: x.unfold(kernel, stride, pad, ("patch", "elem")), th_unfold,
         [(("n", "h", "w", "c"), x, True)], rtol=1e-6, atol=1e-6)

    oh = (H + 2 * pad[0] - kernel[0]) // stride[0] + 1
    ow = (W + 2 * pad[1] - kernel[1]) // stride[1] + 1
    cols = _rand(rng, 2, oh * ow, kk * C)

    def th_fold(c):
        n, L, _ = c.shape
        u = c.reshape(n, L, kk, C).permute(0, 3, 2, 1).reshape(n, C * kk, L)
        return tnf.fold(u, (H, W), kernel, 1, pad, stride).permute(0, 2, 3, 1)

    _run(ctx, lambda c: c.fold((H, W), kernel, stride, pad, ("h", "w", "c")), th_fold,
         [(("n", "patch", "elem"), cols, True)], rtol=1e-5, atol=1e-5)


def test_unfold_dot_is_conv2d(ctx):
    """The unfold layout is the conv2d im2col layout: unfold -> dot is a dense conv."""
    rng = np.random.default_rng(9)
    x = F.Tensor("h", "w", "c").from_slice(ctx, (6, 7, 4), _rand(rng, 6, 7, 4))
    w0 = _rand(rng, 5, 3, 3, 4)
    w = F.Tensor("oc", "kh", "kw", "ic").from_slice(ctx, w0.shape, w0)
    wm = F.Tensor("oc", "elem").from_slice(ctx, (5, 36), w0.reshape(5, 36))
    via = x.unfold(3, 1, 1, ("patch", "elem")).dot(wm, "elem").numpy()
    np.testing.assert_allclose(via.reshape(6, 7, 5),
                               x.conv2d(w, None, 1, 1, 1, ("oh", "ow", "oc")).numpy(),
                               rtol=1e-4, atol=1e-4)


def test_fold_errors(ctx):
    c = F.Tensor("patch", "elem").zeros(ctx, (4, 12))
    with pytest.raises(F.ShapeMismatch, match="patch rows"):
        c.fold((3, 3), 2, 2, 0, ("h", "w", "c"))
    with pytest.raises(F.ShapeMismatch, match="multiple"):
        F.Tensor("patch", "elem").zeros(ctx, (4, 10)).fold((4, 4), 2, 2, 0, ("h", "w", "c"))
    with pytest.raises(F.TagError, match="out tags"):
        c.fold((4, 4), 2, 2, 0, ("h", "w"))


# -- channel affine, relative shift -------------------------------------------------------------


def test_channel_affine_matches_torch(ctx):
    rng = np.random.default_rng(10)
    x, s, b = _rand(rng, 2, 3, 4, 5), _rand(rng, 5), _rand(rng, 5)
    _run(ctx, lambda x, s, b: x.channel_affine(s, b), lambda x, s, b: x * s + b,
         [(("n", "h", "w", "c"), x, True), (("c",), s, True), (("c",), b, True)],
         rtol=1e-6, atol=1e-6)
    xt = F.Tensor("h", "c").zeros(ctx, (2, 5))
    with pytest.raises(F.ShapeMismatch, match="scale"):
        xt.channel_affine(F.Tensor("c").ones(ctx, (4,)), F.Tensor("c").ones(ctx, (5,)))
    with pytest.raises(F.TagError, match="rank-1"):
        xt.channel_affine(F.Tensor("h", "c").ones(ctx, (2, 5)), F.Tensor("c").ones(ctx, (5,)))
    with pytest.raises(F.TagError, match="at least 1"):
        F.Tensor().scalar(ctx, 1.0).channel_affine(F.Tensor("c").ones(ctx, (1,)),
                                                   F.Tensor("c").ones(ctx, (1,)))


def test_relpos_shift_matches_definition(ctx):
    rng = np.random.default_rng(11)
    H, Tq, Tk = 2, 3, 4
    P = Tk + Tq  # one spare position
    x = _rand(rng, H, Tq, P)
    idx = np.arange(Tk)[None, :] + (Tq - 1) - np.arange(Tq)[:, None]  # [Tq, Tk]

    def th(x):
        return x[:, torch.arange(Tq)[:, None], torch.tensor(idx)]

    _run(ctx, lambda x: x.relpos_shift(Tk, ("h", "q", "k")), th,
         [(("h", "q", "p"), x, True)], rtol=1e-6, atol=1e-6)
    y = F.Tensor("h", "q", "p").from_slice(ctx, x.shape, x).relpos_shift(Tk, ("h", "q", "k"))
    assert y.axis_tags == ("h", "q", "k")
    assert y.numpy()[1, 0, 0] == x[1, 0, Tq - 1]
    with pytest.raises(F.ShapeMismatch, match="needs"):
        F.Tensor("h", "q", "p").zeros(ctx, (1, 3, 5)).relpos_shift(4, ("h", "q", "k"))


# -- 1-D family ------------------------------------------------------------------------------------


@pytest.mark.parametrize("cfg", [(1, 0, 1, 1), (2, 1, 1, 1), (1, 2, 2, 1), (1, 1, 1, 2),
                                 (3, 2, 2, 3)])
def test_conv1d_matches_torch(ctx, cfg):
    stride, pad, dil, groups = cfg
    rng = np.random.default_rng(12)
    T, Cin, Cout, taps = 9, 6, 3 * groups, 3
    x = _rand(rng, 2, T, Cin)
    w = _rand(rng, taps, Cin // groups, Cout)  # [tap, in/groups, out]

    def fu(x, w):
        return x.conv1d("time", "in", "tap", "out", w, stride, pad, dil, groups)

    def th(x, w):
        y = tnf.conv1d(x.permute(0, 2, 1), w.permute(2, 1, 0), None, stride, pad, dil, groups)
        return y.permute(0, 2, 1)

    _run(ctx, fu, th, [(("b", "time", "in"), x, True), (("tap", "in", "out"), w, True)])


def _causal_torch(x, w_oik, dilation, groups, state=None):
    """torch reference: left-pad (or prepend state) then a plain conv1d."""
    rows = dilation * (w_oik.shape[2] - 1)
    xc = x.permute(0, 2, 1)
    if state is None:
        xc = tnf.pad(xc, (rows, 0))
    else:
        xc = torch.cat([state.permute(0, 2, 1), xc], dim=2)
    return tnf.conv1d(xc, w_oik, None, 1, 0, dilation, groups).permute(0, 2, 1)


@pytest.mark.parametrize("dilation", [1, 2])
@pytest.mark.parametrize("with_state", [False, True])
def test_causal_conv1d_family_matches_torch(ctx, dilation, with_state):
    rng = np.random.default_rng(13)
    T, Cin, Cout, taps, groups = 5, 4, 6, 3, 2
    rows = dilation * (taps - 1)
    x = _rand(rng, 1, T, Cin)
    st = _rand(rng, 1, rows, Cin)
    state = st.reshape(-1) if with_state else None
    sts = torch.tensor(st) if with_state else None

    w = _rand(rng, taps, Cin, Cout)
    _run(ctx, lambda x, w: x.causal_conv1d("time", "in", "tap", "out", w, dilation, state),
         lambda x, w: _causal_torch(x, w.permute(2, 1, 0), dilation, 1, sts),
         [(("b", "time", "in"), x, True), (("tap", "in", "out"), w, True)])

    wg = _rand(rng, taps, Cin // groups, Cout)
    _run(ctx, lambda x, w: x.grouped_causal_conv1d("time", "in", "tap", "ipg", "out", w,
                                                   dilation, groups, state),
         lambda x, w: _causal_torch(x, w.permute(2, 1, 0), dilation, groups, sts),
         [(("b", "time", "in"), x, True), (("tap", "ipg", "out"), wg, True)])

    k = _rand(rng, Cin, taps)  # [channel, tap]
    _run(ctx, lambda x, k: x.causal_depthwise_conv1d("time", "in", "tap", k, dilation, state),
         lambda x, k: _causal_torch(x, k[:, None, :], dilation, Cin, sts),
         [(("b", "time", "in"), x, True), (("in", "tap"), k, True)])


def test_causal_depthwise_conv1d_definition(ctx):
    """y[t, c] = sum_k x[t - d*(taps-1-k), c] * w[c, k], hand-computed."""
    x0 = np.arange(1, 7, dtype=np.float32).reshape(6, 1)
    x = F.Tensor("t", "c").from_slice(ctx, x0.shape, x0)
    k = F.Tensor("c", "k").from_slice(ctx, (1, 2), [10.0, 1.0])  # tap 1 is the newest
    y = x.causal_depthwise_conv1d("t", "c", "k", k, 2).numpy().reshape(-1)
    np.testing.assert_array_equal(y, [1, 2, 13, 24, 35, 46])
    y = x.causal_depthwise_conv1d("t", "c", "k", k, 2, state=[100.0, 200.0]).numpy()
    np.testing.assert_array_equal(y.reshape(-1), [1001, 2002, 13, 24, 35, 46])


def test_causal_conv1d_state_as_tensor_streams_like_one_call(ctx):
    """Decoding in chunks with the carried rows as state equals one full call,
    eagerly and compiled (the state tensor is a traced input: no retrace, no
    stale values), and no gradient flows into the state."""
    rng = np.random.default_rng(14)
    T, C, O, taps, d = 8, 3, 2, 3, 2
    rows = d * (taps - 1)
    x0 = _rand(rng, T, C)
    w = F.Tensor("tap", "in", "out").from_slice(ctx, (taps, C, O), _rand(rng, taps, C, O))
    TT = F.Tensor("time", "in")
    full = TT.from_slice(ctx, x0.shape, x0).causal_conv1d("time", "in", "tap", "out", w, d)

    def conv(x, s):
        return x.causal_conv1d("time", "in", "tap", "out", w, d, s)

    fast = F.compile(conv)
    for f in (conv, fast):
        chunks = []
        state = F.Tensor("r", "in").zeros(ctx, (rows, C))
        for t0 in range(0, T, 4):
            xc = x0[t0:t0 + 4]
            chunks.append(f(TT.from_slice(ctx, xc.shape, xc), state).numpy())
            tail = np.concatenate([state.numpy(), xc])[-rows:]
            state = F.Tensor("r", "in").from_slice(ctx, tail.shape, tail)
        np.testing.assert_allclose(np.concatenate(chunks), full.numpy(), rtol=1e-5, atol=1e-6)
    s = F.Tensor("r", "in").variable_from_slice(ctx, (rows, C), np.ones((rows, C)))
    x = TT.variable_from_slice(ctx, (2, C), np.ones((2, C)))
    conv(x, s).sum_all().backward()
    assert x.grad() is not None and s.grad() is None


def test_causal_conv1d_errors(ctx):
    x = F.Tensor("time", "in").zeros(ctx, (4, 2))
    w = F.Tensor("tap", "in", "out").zeros(ctx, (3, 2, 2))
    with pytest.raises(F.InvalidDataLength, match="state"):
        x.causal_conv1d("time", "in", "tap", "out", w, 1, [0.0] * 3)
    with pytest.raises(F.TagError, match="weight"):
        x.causal_conv1d("time", "in", "tap", "out", F.Tensor("in", "tap", "out").zeros(
            ctx, (2, 3, 2)), 1)
    with pytest.raises(F.TagError, match="trailing"):
        F.Tensor("in", "time").zeros(ctx, (2, 4)).causal_conv1d("time", "in", "tap", "out", w)
    with pytest.raises(ValueError, match="dilation"):
        x.causal_conv1d("time", "in", "tap", "out", w, 0)
    with pytest.raises(F.ShapeMismatch):
        x.causal_depthwise_conv1d("time", "in", "tap", F.Tensor("in", "tap").zeros(ctx, (3, 2)))


@pytest.mark.parametrize("cfg", [(1, 0, 0), (2, 0, 1), (2, 1, 0), (3, 1, 2), (2, 2, 1)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_conv_transpose1d_matches_torch(ctx, cfg, with_bias):
    stride, pad, opad = cfg
    rng = np.random.default_rng(15)
    T, IC, OC, K = 5, 4, 3, 4
    x = _rand(rng, 2, T, IC)
    wt = _rand(rng, IC, OC, K)  # torch ConvTranspose1d weight
    w2 = np.ascontiguousarray(wt.transpose(1, 2, 0).reshape(OC * K, IC))  # row oc*K + k
    b = _rand(rng, OC)

    def fu(x, w2, b=None):
        return x.conv_transpose1d("time", "in", "kout", "out", w2, b, OC, K, stride, pad, opad)

    def th(x, w2, b=None):
        w = w2.reshape(OC, K, IC).permute(2, 0, 1)
        y = tnf.conv_transpose1d(x.permute(0, 2, 1), w, None, stride, pad,
                                opad if opad < stride else 0).permute(0, 2, 1)
        if opad >= stride:  # torch caps output_padding; the extra rows are bias-only
            y = torch.cat([y, y.new_zeros(y.shape[0], opad, OC)], dim=1)
        elif pad > 0 and opad:  # ggml: the output_pad rows hold only the bias
            y = torch.cat([y[:, :y.shape[1] - opad], y.new_zeros(y.shape[0], opad, OC)], 1)
        return y + b if b is not None else y

    inputs = [(("b", "time", "in"), x, True), (("kout", "in"), w2, True)]
    if with_bias:
        inputs.append((("out",), b, True))
    _run(ctx, fu, th, inputs)


def test_conv_transpose1d_errors(ctx):
    x = F.Tensor("time", "in").zeros(ctx, (3, 2))
    w2 = F.Tensor("kout", "in").zeros(ctx, (6, 2))
    with pytest.raises(F.ShapeMismatch, match="weight2"):
        x.conv_transpose1d("time", "in", "kout", "out", w2, None, 2, 2)
    with pytest.raises(F.ShapeMismatch, match="bias"):
        x.conv_transpose1d("time", "in", "kout", "out", w2, F.Tensor("out").zeros(ctx, (2,)),
                           3, 2)
    with pytest.raises(F.ShapeMismatch, match="no output"):
        F.Tensor("time", "in").zeros(ctx, (1, 2)).conv_transpose1d(
            "time", "in", "kout", "out", w2, None, 3, 2, 1, 1)


# -- the reference's §4.14 snippets ----------------------------------------------------------


def test_snippet_conv1d_computes_a_moving_weighted_sum(ctx):
    x = F.Tensor("time", "in").from_slice(ctx, (3, 1), [1, 2, 3])
    w = F.Tensor("tap", "in", "out").from_slice(ctx, (2, 1, 1), [1, 1])
    y = x.conv1d("time", "in", "tap", "out", w, 1, 0, 1, 1)
    np.testing.assert_array_equal(y.data_const(), [3, 5])


def test_snippet_conv2d_channel_last_and_max_pool2d(ctx):
    x = F.Tensor("h", "w", "c").from_slice(ctx, (2, 2, 1), [1, 2, 3, 4])
    weight = F.Tensor("oc", "kh", "kw", "ic").from_slice(ctx, (1, 1, 1, 1), [2])
    y = x.conv2d(weight, None, (1, 1), (0, 0), 1, ("oh", "ow", "oc"))
    np.testing.assert_array_equal(y.data_const(), [2, 4, 6, 8])
    pooled = x.max_pool2d((2, 2), (2, 2), (0, 0))
    np.testing.assert_array_equal(pooled.data_const(), [4])


def test_snippet_unfold_extracts_patches_and_fold_accumulates_them_back(ctx):
    x = F.Tensor("h", "w", "c").from_slice(ctx, (2, 2, 1), [1, 2, 3, 4])
    col = x.unfold((2, 2), (2, 2), (0, 0), ("patch", "elem"))
    np.testing.assert_array_equal(col.data_const(), [1, 2, 3, 4])
    img = col.fold((2, 2), (2, 2), (2, 2), (0, 0), ("h", "w", "c"))
    np.testing.assert_array_equal(img.data_const(), [1, 2, 3, 4])


def test_conv2d_winograd_planes_on_the_micro_kernel_match_numpy(ctx):
    """Output channels a multiple of 32: on 16-lane (AVX-512) targets the fused Winograd
    route multiplies its planes on the micro-kernel in whole 6-row tiles (the rows past
    a block's last tile hold stale values and must never reach the output). Checked
    against a direct float64 convolution, with NaN-free but large stale data first."""
    rng = np.random.default_rng(21)
    x0 = _rand(rng, 3, 9, 11, 16)
    w0 = _rand(rng, 64, 3, 3, 16) * np.float32(0.1)
    b0 = _rand(rng, 64)
    big = F.Tensor("b", "h", "w", "c").from_slice(ctx, (3, 9, 11, 16), x0 * np.float32(1e6))
    w = F.Tensor("o", "kh", "kw", "i").from_slice(ctx, w0.shape, w0)
    b = F.Tensor("o").from_slice(ctx, b0.shape, b0)
    big.conv2d(w, b, 1, 1, 1, ("oh", "ow", "oc")).numpy()  # leaves large values in scratch
    x = F.Tensor("b", "h", "w", "c").from_slice(ctx, x0.shape, x0)
    got = x.conv2d(w, b, 1, 1, 1, ("oh", "ow", "oc")).numpy()
    xp = np.pad(x0.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    want = np.zeros((3, 9, 11, 64)) + b0
    for ky in range(3):
        for kx in range(3):
            want += np.einsum("bhwc,oc->bhwo", xp[:, ky:ky + 9, kx:kx + 11], w0[:, ky, kx])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-4)
