"""Losses (REFERENCE §4.15) without torch: the reference's snippets, values against
numpy formulas, gradients against finite differences, the reference's deliberate
divergences, index data forms, compile behaviour and errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fucina as F


def _var(ctx, tags, values):
    v = np.asarray(values, dtype=np.float32)
    return F.Tensor(*tags).variable_from_slice(ctx, v.shape, v)


def _const(ctx, tags, values, dtype=None):
    v = np.asarray(values)
    T = F.Tensor(*tags, dtype=dtype) if dtype else F.Tensor(*tags)
    return T.from_slice(ctx, v.shape, v)


def _fd_grads(ctx, specs, build, eps=1e-3):
    """Central differences (float64 sums) of build(*tensors).sum_all() per operand."""
    arrays = [np.asarray(a, np.float64) for _, a in specs]

    def f(vals):
        with F.no_grad():
            xs = [_const(ctx, tags, v.astype(np.float32)) for (tags, _), v in zip(specs, vals)]
            return float(build(*xs).numpy().astype(np.float64).sum())

    out = []
    for k, a in enumerate(arrays):
        g = np.zeros(a.size)
        for i in range(a.size):
            p = [x.copy() for x in arrays]
            m = [x.copy() for x in arrays]
            p[k].reshape(-1)[i] += eps
            m[k].reshape(-1)[i] -= eps
            g[i] = (f(p) - f(m)) / (2 * eps)
        out.append(g.reshape(a.shape))
    return out


def _check_fd(ctx, specs, build, tol=2e-2):
    xs = [_var(ctx, tags, a) for tags, a in specs]
    build(*xs).sum_all().backward()
    for x, want in zip(xs, _fd_grads(ctx, specs, build)):
        np.testing.assert_allclose(x.grad().numpy(), want, atol=tol, rtol=tol)


# -- the reference's snippets -------------------------------------------------------------


def test_cross_entropy_on_uniform_logits_is_ln_k(ctx):
    logits = F.Tensor("batch", "class").zeros(ctx, (1, 4))
    loss = logits.cross_entropy("class", [2])
    assert loss.item() == pytest.approx(math.log(4), abs=1e-6)
    per_pos = logits.cross_entropy("class", [2], reduction="none")
    assert per_pos.axis_tags == ("batch",)  # class tag removed
    assert per_pos.data_const()[0] == pytest.approx(math.log(4), abs=1e-6)


def test_mse_loss_mean_over_all_elements(ctx):
    x = F.Tensor("d").from_slice(ctx, (2,), [1, 2])
    t = F.Tensor("d").from_slice(ctx, (2,), [3, 2])
    assert x.mse_loss(t).item() == pytest.approx(2.0, abs=1e-6)  # ((-2)^2 + 0) / 2


# -- values against numpy ------------------------------------------------------------------


def _np_ce(x, labels, smooth=0.0, ignore=None):
    m = x.max(axis=1, keepdims=True)
    lse = (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))[:, 0]
    k = x.shape[1]
    safe = np.where(labels == ignore, 0, labels) if ignore is not None else labels
    per = lse - (1 - smooth) * x[np.arange(len(labels)), safe] - smooth / k * x.sum(axis=1)
    if ignore is not None:
        per = np.where(labels == ignore, 0.0, per)
    return per


def test_cross_entropy_values_against_numpy(ctx):
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal((5, 7)).astype(np.float32) * 3
    labels = np.array([0, 6, 3, 3, 1])
    x = _const(ctx, ("t", "c"), x0)
    per = _np_ce(x0.astype(np.float64), labels, 0.25, 3)
    np.testing.assert_allclose(x.cross_entropy("c", labels, "none", 3, 0.25).numpy(), per,
                               rtol=1e-5, atol=1e-6)
    assert x.cross_entropy("c", labels, "mean", 3, 0.25).item() == pytest.approx(
        per.sum() / 3, rel=1e-5)
    assert x.cross_entropy("c", labels, "sum").item() == pytest.approx(
        _np_ce(x0.astype(np.float64), labels).sum(), rel=1e-5)


def test_every_position_ignored_gives_zero_loss_and_gradient(ctx):
    x = _var(ctx, ("t", "c"), [[1.0, 2.0], [3.0, -1.0]])
    loss = x.cross_entropy("c", [1, 1], ignore_index=1)
    assert loss.item() == 0.0  # the reference's choice (torch: NaN)
    loss.backward()
    np.testing.assert_array_equal(x.grad().numpy(), np.zeros((2, 2)))
    w = _var(ctx, ("k", "c"), [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    lin = x.linear_cross_entropy(w, [2, 2], ignore_index=2)
    assert lin.item() == 0.0
    lin.backward()
    np.testing.assert_array_equal(w.grad().numpy(), np.zeros((3, 2)))


def test_linear_cross_entropy_equals_cross_entropy_of_the_product(ctx):
    rng = np.random.default_rng(1)
    x0 = rng.standard_normal((6, 4)).astype(np.float32)
    w0 = rng.standard_normal((5, 4)).astype(np.float32)
    labels = [4, 0, 1, 1, 3, 2]
    x, w = _const(ctx, ("r", "d"), x0), _const(ctx, ("k", "d"), w0)
    want = _np_ce((x0 @ w0.T).astype(np.float64), np.array(labels), 0.1)
    got = x.linear_cross_entropy(w, labels, reduction="none", label_smoothing=0.1)
    assert got.axis_tags == ("r",)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)


def test_linear_distill_values_against_numpy(ctx):
    rng = np.random.default_rng(2)
    x0 = rng.standard_normal((5, 3)).astype(np.float32)
    w0 = rng.standard_normal((6, 3)).astype(np.float32)
    rows, classes = [4, 0, 4], [5, 2, 0]
    probs = [0.7, 0.2, 0.1]  # a truncated teacher tail: used as given, not renormalized
    z = (x0 @ w0.T).astype(np.float64)
    lse = np.log(np.exp(z).sum(axis=1))
    per = np.array(probs) * (lse[rows] - z[rows, classes])
    x, w = _const(ctx, ("r", "d"), x0), _const(ctx, ("k", "d"), w0)
    assert x.linear_distill(w, rows, classes, probs).item() == pytest.approx(per.mean(), 1e-5)
    assert x.linear_distill_ext(w, rows, classes, probs, "sum", 2.0).item() == pytest.approx(
        2 * per.sum(), 1e-5)


def test_elementwise_losses_against_numpy(ctx):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((3, 4))
    b = rng.standard_normal((3, 4))
    x, t = _const(ctx, ("r", "c"), a), _const(ctx, ("r", "c"), b)
    a, b = a.astype(np.float32).astype(np.float64), b.astype(np.float32).astype(np.float64)
    d = a - b
    np.testing.assert_allclose(x.mse_loss(t, "none").numpy(), d * d, rtol=1e-5)
    hub = np.where(np.abs(d) <= 0.7, 0.5 * d * d, 0.7 * (np.abs(d) - 0.35))
    np.testing.assert_allclose(x.huber_loss(t, 0.7, "none").numpy(), hub, rtol=1e-5, atol=1e-7)
    assert x.huber_loss(t, 0.7, "sum").item() == pytest.approx(hub.sum(), rel=1e-5)
    y = 1 / (1 + np.exp(-b))  # targets in (0, 1)
    ty = _const(ctx, ("r", "c"), y)
    y = y.astype(np.float32).astype(np.float64)
    logit = np.maximum(a, 0) - a * y + np.log1p(np.exp(-np.abs(a)))
    np.testing.assert_allclose(x.bce_loss(ty, "none", from_logits=True).numpy(), logit,
                               rtol=1e-5, atol=1e-6)
    p = 1 / (1 + np.exp(-a))
    xp = _const(ctx, ("r", "c"), p)
    p = p.astype(np.float32).astype(np.float64)
    prob = -(y * np.log(p) + (1 - y) * np.log(1 - p))
    assert xp.bce_loss(ty).item() == pytest.approx(prob.mean(), rel=1e-5)
    lp = np.log(p)
    xl = _const(ctx, ("r", "c"), lp)
    lp = lp.astype(np.float32).astype(np.float64)
    kl = y * (np.log(y) - lp)
    assert xl.kl_div_loss(ty, "sum").item() == pytest.approx(kl.sum(), rel=1e-5)
    tl = _const(ctx, ("r", "c"), np.log(y))
    ly = np.log(y).astype(np.float32).astype(np.float64)
    klog = np.exp(ly) * (ly - lp)
    np.testing.assert_allclose(xl.kl_div_loss(tl, "none", log_target=True).numpy(), klog,
                               rtol=1e-4, atol=1e-6)


def test_target_is_aligned_by_tag_name(ctx):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    x = _const(ctx, ("r", "c"), a)
    t = _const(ctx, ("c", "r"), (a + 1).T)  # same tags, other order
    np.testing.assert_allclose(x.mse_loss(t, "none").numpy(), np.ones((2, 3)))


def test_nll_loss_and_cosine_similarity_values(ctx):
    with np.errstate(divide="ignore"):  # a -inf entry
        lp = np.log(np.array([[0.2, 0.8, 0.0], [0.5, 0.25, 0.25]], np.float32))
    x = _const(ctx, ("t", "c"), lp)
    np.testing.assert_allclose(x.nll_loss("c", [1, 0], "none").numpy(),
                               [-np.log(0.8), -np.log(0.5)], rtol=1e-6)
    assert x.nll_loss("c", [1, 2]).item() == pytest.approx(
        (-np.log(0.8) - np.log(0.25)) / 2, rel=1e-6)
    a = _const(ctx, ("n", "d"), [[1.0, 0.0], [3.0, 4.0], [0.0, 0.0]])
    b = _const(ctx, ("d",), [0.0, 2.0])
    np.testing.assert_allclose(a.cosine_similarity(b, "d").numpy(), [0.0, 0.8, 0.0],
                               rtol=1e-6, atol=1e-7)


# -- gradients against finite differences ------------------------------------------------------


def test_gradients_against_finite_differences(ctx):
    rng = np.random.default_rng(4)
    a = rng.standard_normal((2, 3)).astype(np.float32)
    b = rng.standard_normal((2, 3)).astype(np.float32)
    y = rng.uniform(0.1, 0.9, (2, 3)).astype(np.float32)
    p = rng.uniform(0.1, 0.9, (2, 3)).astype(np.float32)
    rc = ("r", "c")
    _check_fd(ctx, [(rc, a), (rc, b)], lambda x, t: x.mse_loss(t, "none"))
    _check_fd(ctx, [(rc, a * 3), (rc, b)], lambda x, t: x.huber_loss(t, 1.0, "none"))
    _check_fd(ctx, [(rc, a), (rc, y)], lambda x, t: x.bce_loss(t, "none", from_logits=True))
    _check_fd(ctx, [(rc, p), (rc, y)], lambda x, t: x.bce_loss(t, "none"))
    _check_fd(ctx, [(rc, np.log(p)), (rc, y)], lambda x, t: x.kl_div_loss(t, "none"))
    _check_fd(ctx, [(rc, a), (("c",), b[0])], lambda x, t: x.cosine_similarity(t, "c"))
    _check_fd(ctx, [(rc, a)], lambda x: x.cross_entropy("c", [2, 0], "none", None, 0.3))
    _check_fd(ctx, [(rc, a)], lambda x: x.nll_loss("c", [1, 2], "none"))
    w = rng.standard_normal((4, 3)).astype(np.float32)
    _check_fd(ctx, [(rc, a), (("k", "c"), w)],
              lambda x, v: x.linear_cross_entropy(v, [3, 1], "none"))
    _check_fd(ctx, [(rc, a), (("k", "c"), w)],
              lambda x, v: x.linear_distill(v, [1, 1, 0], [0, 3, 3], [0.5, 0.5, 1.0]))


# -- the reference's deliberate divergences ------------------------------------------------------


def test_bce_on_probabilities_clamps_and_zeroes_the_boundary_gradient(ctx):
    x = _var(ctx, ("d",), [0.0, 1.0, 0.5])
    t = _const(ctx, ("d",), [1.0, 0.0, 1.0])
    loss = x.bce_loss(t, "none")
    eps = np.float32(1e-7)
    np.testing.assert_allclose(loss.numpy(), [-np.log(eps), -np.log1p(-np.float32(1 - eps)),
                                              np.log(2)], rtol=1e-4)
    loss.sum_all().backward()
    g = x.grad().numpy()
    assert g[0] == 0.0 and g[1] == 0.0  # torch: about -1e12 and +1e12
    assert g[2] == pytest.approx(-2.0, rel=1e-5)


def test_kl_div_zero_target_contributes_nothing(ctx):
    x = _var(ctx, ("d",), [-1.0, -0.5])
    t = _var(ctx, ("d",), [0.0, 0.5])
    loss = x.kl_div_loss(t, "sum")
    assert loss.item() == pytest.approx(0.5 * (np.log(0.5) + 0.5), rel=1e-6)
    loss.backward()
    np.testing.assert_allclose(x.grad().numpy(), [0.0, -0.5])
    # d/dt at t = 0 is -x (finite; torch gives NaN there), log t + 1 - x elsewhere
    np.testing.assert_allclose(t.grad().numpy(), [1.0, np.log(0.5) + 1 + 0.5], rtol=1e-6)


# -- index data forms, compile ---------------------------------------------------------------


def test_labels_accept_sequences_arrays_and_integer_tensors(ctx):
    x = _const(ctx, ("t", "c"), np.random.default_rng(5).standard_normal((3, 4)))
    want = x.cross_entropy("c", [3, 0, 1]).item()
    for labels in (np.array([3, 0, 1], np.uint8), (3, 0, 1),
                   _const(ctx, ("t",), [3, 0, 1], "i64"), _const(ctx, ("t",), [3, 0, 1], "i32"),
                   _const(ctx, ("a", "b"), [[3, 0, 1]], "i16")):
        assert x.cross_entropy("c", labels).item() == want
        assert x.nll_loss("c", labels).item() == x.nll_loss("c", [3, 0, 1]).item()


def test_compiled_cross_entropy_traces_labels_once_and_checks_them(ctx):
    rng = np.random.default_rng(6)
    x = _var(ctx, ("t", "c"), rng.standard_normal((4, 5)))
    L = F.Tensor("t", dtype="i64")

    def step(x, labels):
        loss = x.cross_entropy("c", labels, label_smoothing=0.1)
        loss.backward()
        return loss

    fast = F.compile(step)
    for labels in ([0, 1, 2, 3], [4, 4, 0, 1]):
        lab = L.from_slice(ctx, (4,), labels)
        x.zero_grad()
        got = fast(x, lab).item()
        g_fast = x.grad().numpy()
        x.zero_grad()
        assert step(x, lab).item() == pytest.approx(got, rel=1e-6)
        np.testing.assert_allclose(g_fast, x.grad().numpy(), rtol=1e-6, atol=1e-7)
    assert fast.cache_size() == 1  # index data is a traced input: no retrace
    bad = L.from_slice(ctx, (4,), [0, 1, 5, 2])
    with pytest.raises(F.IndexOutOfBounds, match="index 5 out of range for .c. of size 5"):
        fast(x, bad)
    with pytest.raises(F.IndexOutOfBounds, match="index 5 out of range for .c. of size 5"):
        step(x, bad)
    nll = F.compile(lambda x, lab: x.nll_loss("c", lab))
    with pytest.raises(F.IndexOutOfBounds, match="index 5 out of range for .c. of size 5"):
        nll(x.detach(), bad)
    assert nll(x.detach(), L.from_slice(ctx, (4,), [1, 1, 1, 1])).item() == pytest.approx(
        x.detach().nll_loss("c", [1, 1, 1, 1]).item(), rel=1e-6)


def test_compiled_cross_entropy_is_two_row_kernels(ctx):
    x = _var(ctx, ("t", "c"), np.zeros((3, 6)))

    def step(x):
        loss = x.cross_entropy("c", [1, 2, 3])
        loss.backward()
        return loss

    text = F.compile(step).ir(x)
    assert "ce_rows(" in text and "ce_rows_grad(" in text
    assert text.count("[3x6]") == 1  # the logits are read in place; one gradient buffer


def test_linear_cross_entropy_never_holds_a_second_logit_buffer(ctx):
    x = _var(ctx, ("r", "d"), np.ones((4, 3)))
    w = _var(ctx, ("k", "d"), np.ones((7, 3)))

    def step(x, w):
        loss = x.linear_cross_entropy(w, [0, 1, 2, 6])
        loss.backward()
        return loss

    text = F.compile(step).ir(x, w)
    # the panel (the saved logits turned into their gradient in place) is the only
    # [rows x classes] value; both operand gradients are GEMMs on it
    assert text.count("[4x7]") == 1 and text.count("gemm") == 2


def test_fused_linear_losses_are_single_use(ctx):
    rng = np.random.default_rng(7)
    x = _var(ctx, ("r", "d"), rng.standard_normal((3, 2)))
    w = _var(ctx, ("k", "d"), rng.standard_normal((4, 2)))
    loss = x.linear_cross_entropy(w, [0, 3, 1])
    loss.backward()
    g = x.grad().numpy()
    with pytest.raises(F.LinearCrossEntropyBackwardConsumed):
        loss.backward()
    x.zero_grad()
    x.linear_cross_entropy(w, [0, 3, 1]).backward()  # a fresh loss works
    np.testing.assert_array_equal(x.grad().numpy(), g)
    d = x.linear_distill(w, [0], [1], [1.0])
    d.backward()
    with pytest.raises(F.LinearDistillBackwardConsumed):
        d.backward()
    assert issubclass(F.LinearDistillBackwardConsumed, F.TensorError)

    def twice(x, w):
        loss = x.linear_cross_entropy(w, [0, 3, 1])
        loss.backward()
        loss.backward()
        return loss

    with pytest.raises(F.LinearCrossEntropyBackwardConsumed):
        F.compile(twice)(x, w)


def test_compiled_fused_linear_losses_repeat_and_match_eager(ctx):
    rng = np.random.default_rng(8)
    x = _var(ctx, ("r", "d"), rng.standard_normal((5, 3)))
    w = _var(ctx, ("k", "d"), rng.standard_normal((6, 3)))
    rows = F.Tensor("e", dtype="i64").from_slice(ctx, (3,), [4, 0, 4])

    def step(x, w, rows):
        loss = x.linear_cross_entropy(w, [5, 0, 1, 1, 2]).add(
            x.linear_distill(w, rows, [1, 2, 3], [0.5, 0.3, 0.2]))
        loss.backward()
        return loss

    fast = F.compile(step)
    for _ in range(3):  # the record's buffer is reused run after run
        x.zero_grad()
        w.zero_grad()
        got = fast(x, w, rows).item()
        gx, gw = x.grad().numpy(), w.grad().numpy()
        x.zero_grad()
        w.zero_grad()
        assert step(x, w, rows).item() == pytest.approx(got, rel=1e-6)
        np.testing.assert_allclose(gx, x.grad().numpy(), rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(gw, w.grad().numpy(), rtol=1e-6, atol=1e-7)
    with pytest.raises(F.IndexOutOfBounds, match="index 9 out of range for .r. of size 5"):
        fast(x, w, F.Tensor("e", dtype="i64").from_slice(ctx, (3,), [4, 9, 4]))


def test_forward_only_fused_losses_keep_nothing(ctx, monkeypatch):
    from fucina.ir import fused_losses

    made = []
    real = fused_losses.new_record
    monkeypatch.setattr(fused_losses, "new_record",
                        lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    x = _const(ctx, ("r", "d"), np.ones((2, 3)))
    w = _var(ctx, ("k", "d"), np.ones((5, 3)))
    with F.no_grad():
        loss = x.linear_cross_entropy(w, [0, 4])
    assert not loss.requires_grad and made[0].logits is None
    assert loss.item() == pytest.approx(math.log(5), abs=1e-6)
    kept = x.linear_cross_entropy(w, [0, 4])  # w requires grad: the logits are kept
    assert made[1].logits is not None and made[1].logits.shape == (2, 5)
    kept.backward()
    assert made[1].logits is None and made[1].buffer is None  # consumed and dropped


# -- errors ------------------------------------------------------------------------------------


def test_loss_argument_errors(ctx):
    x = _var(ctx, ("t", "c"), np.zeros((2, 3)))
    with pytest.raises(F.IndexOutOfBounds, match="index 3 out of range for .c. of size 3"):
        x.cross_entropy("c", [3, 0])
    with pytest.raises(F.IndexOutOfBounds):
        x.cross_entropy("c", [-1, 0])
    with pytest.raises(F.InvalidShape):
        x.cross_entropy("c", [1])
    with pytest.raises(F.InvalidDataLength):
        x.cross_entropy("c", [0.5, 1.0])
    with pytest.raises(F.TagError):
        x.cross_entropy("nope", [1, 0])
    with pytest.raises(F.TagError):
        x.cross_entropy("c", [1, 0], reduction="batchmean")
    with pytest.raises(F.InvalidShape):
        x.cross_entropy("c", [1, 0], label_smoothing=1.0)
    with pytest.raises(TypeError):
        x.cross_entropy("c", [1, 0], ignore_index=1.5)
    with pytest.raises(F.InvalidDataLength):
        x.cross_entropy("c", _const(ctx, ("t",), [1.0, 0.0]))
    with pytest.raises(F.IndexOutOfBounds):
        x.nll_loss("c", [0, 7])
    t = _const(ctx, ("t", "d"), np.zeros((2, 3)))
    with pytest.raises(F.TagError):
        x.mse_loss(t)
    with pytest.raises(F.ShapeMismatch):
        x.mse_loss(_const(ctx, ("t", "c"), np.zeros((2, 2))))
    with pytest.raises(F.InvalidShape):
        x.huber_loss(x, delta=0.0)
    w = _var(ctx, ("k", "c"), np.zeros((4, 3)))
    with pytest.raises(F.TagError):  # the shared tag must be last on both
        x.linear_cross_entropy(_var(ctx, ("c", "k"), np.zeros((3, 4))), [0, 1])
    with pytest.raises(F.TagError):  # the class tag must not be an input tag
        x.linear_cross_entropy(_var(ctx, ("t", "c"), np.zeros((2, 3))), [0, 1])
    with pytest.raises(F.ShapeMismatch):
        x.linear_cross_entropy(_var(ctx, ("k", "c"), np.zeros((4, 2))), [0, 1])
    with pytest.raises(F.TagError):
        _var(ctx, ("a", "b", "c"), np.zeros((1, 1, 3))).linear_cross_entropy(w, [0])
    with pytest.raises(F.IndexOutOfBounds):
        x.linear_cross_entropy(w, [0, 4])
    with pytest.raises(F.InvalidShape):
        x.linear_distill(w, [0, 1], [0], [1.0, 1.0])
    with pytest.raises(F.IndexOutOfBounds):
        x.linear_distill(w, [0, 2], [0, 0], [1.0, 1.0])
    with pytest.raises(F.TagError):
        x.linear_distill(w, [0], [0], [1.0], reduction="none")
    with pytest.raises(F.UnsupportedGradient):
        x.linear_distill(w, [0], [0], _var(ctx, ("e",), [1.0]))
    with pytest.raises(F.InvalidShape):
        x.cosine_similarity(x, "c", eps=0.0)


# -- eager == compiled on random programs through the loss and selection ops -------------

_SIZES = {"a": 3, "b": 4, "c": 5}
_LOSS_OPS = ["cross_entropy", "nll_loss", "mse_loss", "huber_loss", "bce_logits", "bce_probs",
             "kl_div", "cosine", "top_k", "sort", "linear_ce", "linear_distill"]


@st.composite
def _loss_program(draw):
    tags = tuple(draw(st.permutations(["a", "b", "c"])))[:draw(st.integers(2, 3))]
    pre = draw(st.lists(st.sampled_from(["tanh", "neg", "scale", "sigmoid", "none"]),
                        max_size=2))
    op = draw(st.sampled_from(_LOSS_OPS))
    red = draw(st.sampled_from(["mean", "sum", "none"]))
    return tags, pre, op, red, draw(st.integers(0, 10**6))


def _loss_step(tags, pre, op, red, seed, x, y, w):
    rng = np.random.default_rng(seed)
    for p in pre:
        x = x.scale(1.5) if p == "scale" else x if p == "none" else getattr(x, p)()
    tag = tags[rng.integers(len(tags))]
    n = x.dim(tag)
    positions = x.size // n
    labels = rng.integers(0, n, positions)
    if op == "cross_entropy":
        out = x.cross_entropy(tag, labels, red, int(labels[0]), float(rng.uniform(0, 0.5)))
    elif op == "nll_loss":
        out = x.log_softmax(tag).nll_loss(tag, labels, red)
    elif op in ("mse_loss", "huber_loss"):
        out = x.mse_loss(y, red) if op == "mse_loss" else x.huber_loss(y, 0.5, red)
    elif op == "bce_logits":
        out = x.bce_loss(y.sigmoid(), red, from_logits=True)
    elif op == "bce_probs":
        out = x.sigmoid().bce_loss(y.sigmoid(), red)
    elif op == "kl_div":
        out = x.log_softmax(tag).kl_div_loss(y.softmax(tag), red)
    elif op == "cosine":
        out = x.cosine_similarity(y, tag)
    elif op == "top_k":
        out = x.top_k(tag, int(rng.integers(1, n + 1)), "k").values
    elif op == "sort":
        out = x.sort(tag, bool(rng.integers(2))).values
    else:
        flat = x.merge("rows", tuple(t for t in tags if t != tags[-1])) if len(tags) == 3 \
            else x
        rows = flat.dim(flat.axis_tags[0])
        if op == "linear_ce":
            out = flat.linear_cross_entropy(w, rng.integers(0, 6, rows), red)
        else:
            e = int(rng.integers(1, 6))
            out = flat.linear_distill(w, rng.integers(0, rows, e), rng.integers(0, 6, e),
                                      rng.uniform(0, 1, e), "sum" if red == "sum" else "mean")
    loss = out.mul(out).sum_all()
    loss.backward()
    return loss


@settings(max_examples=40, deadline=None)
@given(_loss_program())
def test_compiled_equals_eager_through_losses_and_selection(prog):
    tags, pre, op, red, seed = prog
    ctx = F.ExecContext()
    shape = tuple(_SIZES[t] for t in tags)
    rng = np.random.default_rng(seed)
    x0 = rng.standard_normal(shape).astype(np.float32)
    y0 = rng.standard_normal(shape).astype(np.float32)
    w0 = rng.standard_normal((6, shape[-1])).astype(np.float32)

    def operands():
        return (_var(ctx, tags, x0), _var(ctx, tags, y0), _var(ctx, ("k", tags[-1]), w0))

    eager, compiled = operands(), operands()
    want = _loss_step(tags, pre, op, red, seed, *eager)
    got = F.compile(lambda *a: _loss_step(tags, pre, op, red, seed, *a))(*compiled)
    np.testing.assert_allclose(got.item(), want.item(), rtol=1e-5, atol=1e-6)
    for a, b in zip(compiled, eager):
        ga, gb = a.grad(), b.grad()
        assert (ga is None) == (gb is None)
        if ga is not None:
            np.testing.assert_allclose(ga.numpy(), gb.numpy(), rtol=1e-4, atol=1e-6)


def test_compiled_losses_differentiated_by_the_caller(ctx):
    rng = np.random.default_rng(9)
    x = _var(ctx, ("r", "d"), rng.standard_normal((5, 3)))
    w = _var(ctx, ("k", "d"), rng.standard_normal((6, 3)))
    for f in (lambda x, w: x.linear_cross_entropy(w, [0, 1, 2, 3, 5]),
              lambda x, w: x.linear_distill(w, [0, 4], [1, 5], [0.5, 0.5]),
              lambda x, w: x.dot(w, "d").cross_entropy("k", [0, 1, 2, 3, 5], "sum"),
              lambda x, w: x.dot(w, "d").top_k("k", 2, "j").values.sum_all()):
        fast = F.compile(f)
        for _ in range(2):  # the backward program recomputes its forward each time
            grads = []
            for fn in (fast, f):
                x.zero_grad()
                w.zero_grad()
                loss = fn(x, w)
                loss.backward()
                grads.append((loss.item(), x.grad().numpy(), w.grad().numpy()))
            assert grads[0][0] == pytest.approx(grads[1][0], rel=1e-6)
            np.testing.assert_allclose(grads[0][1], grads[1][1], rtol=1e-6, atol=1e-7)
            np.testing.assert_allclose(grads[0][2], grads[1][2], rtol=1e-6, atol=1e-7)
