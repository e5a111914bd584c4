"""rope against a torch implementation of each mode (values and input gradients, eager and
compiled), with tables, on-the-fly factors and partial rotary spans."""

from __future__ import annotations

import numpy as np
import pytest

import fucina as F

torch = pytest.importorskip("torch")


def torch_rope(x, pa, fa, cos, sin, mode):
    """Reference rotation of ``x`` (torch) with cos/sin [positions, span/2]."""
    xt = x.movedim((pa, fa), (-2, -1))
    D = xt.shape[-1]
    h = cos.shape[1]
    r = 2 * h
    c, s = cos, sin

    def interleave(seg):
        xe, xo = seg[..., 0::2], seg[..., 1::2]
        return torch.stack((xe * c - xo * s, xe * s + xo * c), dim=-1).flatten(-2)

    if mode == "half":
        x1, x2 = xt[..., :h], xt[..., h:r]
        out = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s, xt[..., r:]), dim=-1)
    elif mode == "interleaved":
        out = torch.cat((interleave(xt[..., :r]), xt[..., r:]), dim=-1)
    else:
        out = torch.cat((xt[..., :D - r], interleave(xt[..., D - r:])), dim=-1)
    return out.movedim((-2, -1), (pa, fa))


def torch_factors(positions, dim, base):
    """HF-style on-the-fly factors, computed independently in torch."""
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    ang = torch.tensor(positions, dtype=torch.float32)[:, None] * inv.float()[None, :]
    return torch.cos(ang), torch.sin(ang)


LAYOUTS = [
    # tags, shape, position tag, feature tag
    (("b", "seq", "head", "d"), (2, 9, 3, 16), "seq", "d"),
    (("d", "seq"), (12, 7), "seq", "d"),
    (("seq", "head", "d"), (5, 2, 8), "seq", "d"),
]


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("span_frac", [1.0, 0.5])
@pytest.mark.parametrize("mode", ["half", "interleaved", "interleaved_tail"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_rope_table_matches_torch(layout, mode, span_frac, compiled, ctx):
    tags, shape, ptag, ftag = layout
    pa, fa = tags.index(ptag), tags.index(ftag)
    D, P = shape[fa], shape[pa]
    span = int(D * span_frac) // 2 * 2
    rng = np.random.default_rng(D + P + len(mode))
    x0 = rng.standard_normal(shape).astype(np.float32)
    w0 = rng.standard_normal(shape).astype(np.float32)
    positions = rng.integers(-3, 40, P)
    table = ctx.prepare_rope_table(positions, span, 500.0)
    x = F.Tensor(*tags).variable_from_slice(ctx, shape, x0)
    w = F.Tensor(*tags).from_slice(ctx, shape, w0)

    def step(x, w):
        y = x.rope(ptag, ftag, table, mode)
        y.mul(w).sum_all().backward()
        return y

    y = (F.compile(step) if compiled else step)(x, w)
    xt = torch.tensor(x0, requires_grad=True)
    yt = torch_rope(xt, pa, fa, torch.tensor(table.cos), torch.tensor(table.sin), mode)
    (yt * torch.tensor(w0)).sum().backward()
    assert y.axis_tags == tags
    np.testing.assert_allclose(y.numpy(), yt.detach().numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(x.grad().numpy(), xt.grad.numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("mode", ["half", "interleaved"])
def test_rope_theta_matches_torch(mode, compiled, ctx):
    rng = np.random.default_rng(11)
    x0 = rng.standard_normal((6, 4, 32)).astype(np.float32)
    w0 = rng.standard_normal((6, 4, 32)).astype(np.float32)
    positions = [0, 1, 2, 50, 51, 1000]
    x = F.Tensor("seq", "head", "d").variable_from_slice(ctx, x0.shape, x0)
    w = F.Tensor("seq", "head", "d").from_slice(ctx, x0.shape, w0)
    pos_t = F.Tensor("seq", dtype="i32").from_slice(ctx, (6,), positions)
    cos, sin = torch_factors(positions, 32, 10000.0)
    xt = torch.tensor(x0, requires_grad=True)
    yt = torch_rope(xt, 0, 2, cos, sin, mode)
    (yt * torch.tensor(w0)).sum().backward()
    for source in (F.RopeTheta(positions=positions, theta_base=10000.0),
                   {"positions": np.array(positions), "theta_base": 10000},
                   F.RopeTheta(positions=pos_t, theta_base=10000.0)):
        x.zero_grad()

        def step(x, w, source=source):
            y = x.rope("seq", "d", source, mode)
            y.mul(w).sum_all().backward()
            return y

        y = (F.compile(step) if compiled else step)(x, w)
        np.testing.assert_allclose(y.numpy(), yt.detach().numpy(), rtol=1e-5, atol=2e-5)
        np.testing.assert_allclose(x.grad().numpy(), xt.grad.numpy(), rtol=1e-5, atol=2e-5)


def test_positions_tensor_is_a_traced_input(ctx):
    """Integer positions under compile: new values, same program, never stale."""
    x0 = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)
    x = F.Tensor("seq", "d").from_slice(ctx, x0.shape, x0)
    P = F.Tensor("seq", dtype="i64")
    fast = F.compile(lambda x, p: x.rope("seq", "d", F.RopeTheta(positions=p, theta_base=100.0),
                                         "interleaved"))
    for start in (0, 17, 400):
        pos = list(range(start, start + 4))
        cos, sin = torch_factors(pos, 8, 100.0)
        want = torch_rope(torch.tensor(x0), 0, 1, cos, sin, "interleaved").numpy()
        got = fast(x, P.from_slice(ctx, (4,), pos)).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-5)
    assert len(fast._cache) == 1


def test_table_values_match_torch_factors(ctx):
    positions = np.arange(0, 300, 7)
    table = ctx.prepare_rope_table(positions, 64, 10000.0)
    cos, sin = torch_factors(positions.tolist(), 64, 10000.0)
    np.testing.assert_allclose(table.cos, cos.numpy(), atol=2e-6)
    np.testing.assert_allclose(table.sin, sin.numpy(), atol=2e-6)
    ff = np.linspace(1.0, 8.0, 32)
    scaled = ctx.prepare_rope_table_factors(positions, 64, 10000.0, False, ff)
    inv = 1.0 / (10000.0 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64)) / \
        torch.tensor(ff)
    ang = torch.tensor(positions, dtype=torch.float32)[:, None] * inv.float()[None, :]
    np.testing.assert_allclose(scaled.cos, torch.cos(ang).numpy(), atol=2e-6)
    np.testing.assert_allclose(scaled.sin, torch.sin(ang).numpy(), atol=2e-6)


@pytest.mark.parametrize("compiled", [False, True])
def test_rms_norm_mul_rope_half_prepared_matches_torch(compiled, ctx):
    rng = np.random.default_rng(21)
    x0 = rng.standard_normal((7, 3, 16)).astype(np.float32)
    w0 = rng.standard_normal(16).astype(np.float32)
    g0 = rng.standard_normal((7, 3, 16)).astype(np.float32)
    table = ctx.prepare_rope_table(np.arange(4, 11), 16, 1e4)
    x = F.Tensor("seq", "head", "d").variable_from_slice(ctx, x0.shape, x0)
    w = F.Tensor("d").variable_from_slice(ctx, (16,), w0)
    g = F.Tensor("seq", "head", "d").from_slice(ctx, g0.shape, g0)

    def step(x, w, g):
        y = x.rms_norm_mul_rope_half_prepared("seq", "d", w, 1e-5, table)
        y.mul(g).sum_all().backward()
        return y

    y = (F.compile(step) if compiled else step)(x, w, g)
    xt = torch.tensor(x0, requires_grad=True)
    wt = torch.tensor(w0, requires_grad=True)
    normed = xt * torch.rsqrt((xt * xt).mean(-1, keepdim=True) + 1e-5) * wt
    yt = torch_rope(normed, 0, 2, torch.tensor(table.cos), torch.tensor(table.sin), "half")
    (yt * torch.tensor(g0)).sum().backward()
    np.testing.assert_allclose(y.numpy(), yt.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(x.grad().numpy(), xt.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(w.grad().numpy(), wt.grad.numpy(), rtol=1e-4, atol=1e-5)
