"""Losses and similarity (REFERENCE §4.15) against torch: values and the gradients of a
random-weighted sum with respect to every differentiable operand, eager and compiled."""

from __future__ import annotations

import numpy as np
import pytest
from oracle_grads import check_op

import fucina as F

torch = pytest.importorskip("torch")
TF = torch.nn.functional
RED = ["mean", "sum", "none"]


def _rng(seed=0):
    return np.random.default_rng(seed)


@pytest.mark.parametrize("reduction", RED)
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
@pytest.mark.parametrize("ignore", [None, 1, -100])
def test_cross_entropy_matches_torch(ctx, reduction, smoothing, ignore):
    rng = _rng()
    x0 = rng.standard_normal((4, 3, 5)).astype(np.float32)  # batch, class, seq
    labels = rng.integers(0, 3, (4, 5))
    if ignore == -100:
        labels[0, :2] = -100
    kw = {"reduction": reduction, "label_smoothing": smoothing}
    if ignore is not None:
        kw["ignore_index"] = ignore
    check_op(ctx, [(("batch", "class", "seq"), x0, True)],
             lambda x: x.cross_entropy("class", labels.reshape(-1), reduction=reduction,
                                       ignore_index=ignore, label_smoothing=smoothing),
             lambda x: TF.cross_entropy(x, torch.tensor(labels), **kw), grad_rtol=1e-4)


def test_cross_entropy_class_last_and_tags(ctx):
    rng = _rng(1)
    x0 = rng.standard_normal((6, 11)).astype(np.float32) * 4
    labels = rng.integers(0, 11, 6)
    check_op(ctx, [(("t", "vocab"), x0, True)],
             lambda x: x.cross_entropy("vocab", labels, reduction="none"),
             lambda x: TF.cross_entropy(x, torch.tensor(labels), reduction="none"))
    x = F.Tensor("t", "vocab").from_slice(ctx, x0.shape, x0)
    per = x.cross_entropy("vocab", labels, reduction="none")
    assert per.axis_tags == ("t",) and per.is_contiguous()
    assert x.cross_entropy_ext("vocab", labels).axis_tags == ()


@pytest.mark.parametrize("reduction", RED)
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("ignore", [None, 2])
def test_linear_cross_entropy_matches_torch(ctx, reduction, smoothing, ignore):
    rng = _rng(2)
    x0 = rng.standard_normal((7, 5)).astype(np.float32)
    w0 = rng.standard_normal((9, 5)).astype(np.float32)
    labels = rng.integers(0, 9, 7)
    labels[3] = 2
    kw = {"reduction": reduction, "label_smoothing": smoothing}
    if ignore is not None:
        kw["ignore_index"] = ignore
    check_op(ctx, [(("row", "d"), x0, True), (("cls", "d"), w0, True)],
             lambda x, w: x.linear_cross_entropy(w, labels, reduction=reduction,
                                                 ignore_index=ignore, label_smoothing=smoothing),
             lambda x, w: TF.cross_entropy(x @ w.T, torch.tensor(labels), **kw),
             rtol=1e-5, atol=1e-5, grad_rtol=1e-4)


@pytest.mark.parametrize("grad_x", [True, False])
def test_linear_cross_entropy_one_operand_differentiable(ctx, grad_x):
    rng = _rng(3)
    x0 = rng.standard_normal((4, 3)).astype(np.float32)
    w0 = rng.standard_normal((6, 3)).astype(np.float32)
    labels = [5, 0, 2, 2]
    check_op(ctx, [(("row", "d"), x0, grad_x), (("cls", "d"), w0, not grad_x)],
             lambda x, w: x.linear_cross_entropy_ext(w, labels, reduction="sum"),
             lambda x, w: TF.cross_entropy(x @ w.T, torch.tensor(labels), reduction="sum"),
             atol=1e-5, grad_rtol=1e-4, grad_atol=1e-5)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_linear_distill_matches_torch(ctx, reduction):
    rng = _rng(4)
    x0 = rng.standard_normal((6, 4)).astype(np.float32)
    w0 = rng.standard_normal((8, 4)).astype(np.float32)
    rows = [0, 0, 2, 5, 2, 0]  # rows 1, 3, 4 have no entries; duplicates accumulate
    classes = [1, 7, 3, 3, 0, 1]
    probs = np.array([0.5, 0.25, 0.6, 1.0, 0.3, 0.2], np.float32)
    scale = 0.75

    def th(x, w):
        logits = x @ w.T
        sel = logits[torch.tensor(rows)]
        per = torch.tensor(probs) * (torch.logsumexp(sel, -1)
                                     - sel[torch.arange(len(rows)), torch.tensor(classes)])
        return (per.mean() if reduction == "mean" else per.sum()) * scale

    check_op(ctx, [(("row", "d"), x0, True), (("cls", "d"), w0, True)],
             lambda x, w: x.linear_distill(w, rows, classes, probs, reduction=reduction,
                                           loss_scale=scale),
             th, atol=1e-5, grad_rtol=1e-4, grad_atol=1e-6)


def _pair(seed, shape=(3, 4)):
    rng = _rng(seed)
    return (rng.standard_normal(shape).astype(np.float32),
            rng.standard_normal(shape).astype(np.float32))


@pytest.mark.parametrize("reduction", RED)
def test_mse_loss_matches_torch(ctx, reduction):
    a, b = _pair(5)
    check_op(ctx, [(("r", "c"), a, True), (("r", "c"), b, True)],
             lambda x, t: x.mse_loss(t, reduction=reduction),
             lambda x, t: TF.mse_loss(x, t, reduction=reduction))


@pytest.mark.parametrize("reduction", RED)
@pytest.mark.parametrize("delta", [0.5, 1.0, 2.5])
def test_huber_loss_matches_torch(ctx, reduction, delta):
    a, b = _pair(6, (4, 5))
    a *= 2  # differences on both sides of delta
    check_op(ctx, [(("r", "c"), a, True), (("r", "c"), b, True)],
             lambda x, t: x.huber_loss(t, delta=delta, reduction=reduction),
             lambda x, t: TF.huber_loss(x, t, reduction=reduction, delta=delta))


@pytest.mark.parametrize("reduction", RED)
def test_bce_loss_on_probabilities_matches_torch(ctx, reduction):
    rng = _rng(7)
    p = rng.uniform(0.05, 0.95, (3, 4)).astype(np.float32)
    y = rng.uniform(0.0, 1.0, (3, 4)).astype(np.float32)
    check_op(ctx, [(("r", "c"), p, True), (("r", "c"), y, True)],
             lambda x, t: x.bce_loss(t, reduction=reduction),
             lambda x, t: TF.binary_cross_entropy(x, t, reduction=reduction),
             rtol=1e-5, atol=1e-6, grad_rtol=1e-4)


@pytest.mark.parametrize("reduction", RED)
def test_bce_loss_from_logits_matches_torch(ctx, reduction):
    rng = _rng(8)
    x0 = (rng.standard_normal((3, 4)) * 4).astype(np.float32)
    x0[0, 0] = 0.0  # sigmoid(0) - y exactly, where max/abs forms lose the 0.5
    x0[0, 1] = 30.0
    y = rng.uniform(0.0, 1.0, (3, 4)).astype(np.float32)
    check_op(ctx, [(("r", "c"), x0, True), (("r", "c"), y, True)],
             lambda x, t: x.bce_loss(t, reduction=reduction, from_logits=True),
             lambda x, t: TF.binary_cross_entropy_with_logits(x, t, reduction=reduction),
             rtol=1e-5, atol=1e-5)


@pytest.mark.filterwarnings("ignore:reduction. 'mean' divides")  # torch's batchmean hint
@pytest.mark.parametrize("reduction", RED)
@pytest.mark.parametrize("log_target", [False, True])
def test_kl_div_loss_matches_torch(ctx, reduction, log_target):
    rng = _rng(9)
    x0 = np.log(rng.dirichlet(np.ones(5), 3)).astype(np.float32)
    t0 = rng.dirichlet(np.ones(5), 3).astype(np.float32)
    if log_target:
        t0 = np.log(t0)
    check_op(ctx, [(("r", "c"), x0, True), (("r", "c"), t0, True)],
             lambda x, t: x.kl_div_loss(t, reduction=reduction, log_target=log_target),
             lambda x, t: TF.kl_div(x, t, reduction=reduction, log_target=log_target),
             rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("reduction", RED)
def test_nll_loss_matches_torch(ctx, reduction):
    rng = _rng(10)
    x0 = torch.log_softmax(torch.tensor(rng.standard_normal((4, 3, 5))), 1).numpy()
    x0[0, 1, 0] = -np.inf  # a zero probability the label does not pick
    labels = rng.integers(0, 3, (4, 5))
    labels[0, 0] = 2
    check_op(ctx, [(("b", "c", "s"), x0, True)],
             lambda x: x.nll_loss("c", labels, reduction=reduction),
             lambda x: TF.nll_loss(x, torch.tensor(labels), reduction=reduction))


def test_cosine_similarity_matches_torch(ctx):
    rng = _rng(11)
    a = rng.standard_normal((3, 5)).astype(np.float32)
    b = rng.standard_normal((5,)).astype(np.float32)
    check_op(ctx, [(("n", "d"), a, True), (("d",), b, True)],
             lambda x, y: x.cosine_similarity(y, "d"),
             lambda x, y: TF.cosine_similarity(x, y[None, :], dim=1), rtol=1e-5, atol=1e-6)
    c = rng.standard_normal((5, 3)).astype(np.float32)
    check_op(ctx, [(("n", "d"), a, True), (("d", "n"), c, True)],
             lambda x, y: x.cosine_similarity(y, "d", eps=1e-6),
             lambda x, y: TF.cosine_similarity(x, y.T, dim=1, eps=1e-6), rtol=1e-5, atol=1e-6)


def test_softmax_family_matches_torch():
    rng = np.random.default_rng(2)
    x0 = rng.standard_normal((3, 4, 5)).astype(np.float32) * 3
    m0 = np.where(rng.random((4, 5)) < 0.3, -1e4, 0.0).astype(np.float32)
    ctx = F.ExecContext()
    x = F.Tensor("h", "q", "k").variable_from_slice(ctx, x0.shape, x0)
    mask = F.Tensor("q", "k").from_slice(ctx, m0.shape, m0)
    g0 = rng.standard_normal(x0.shape).astype(np.float32)
    for name, fu, tf in [
        ("softmax", lambda t: t.softmax("k"), lambda t: torch.softmax(t, -1)),
        ("scaled masked", lambda t: t.softmax("k", scale=0.5, mask=mask),
         lambda t: torch.softmax(t * 0.5 + torch.tensor(m0), -1)),
        ("over q", lambda t: t.softmax("q"), lambda t: torch.softmax(t, 1)),
        ("log_softmax", lambda t: t.log_softmax("k"), lambda t: torch.log_softmax(t, -1)),
    ]:
        x.zero_grad()
        y = fu(x)
        y.backward_with_grad(type(y).from_slice(ctx, y.shape, g0))
        xt = torch.tensor(x0, requires_grad=True)
        yt = tf(xt)
        yt.backward(torch.tensor(g0))
        np.testing.assert_allclose(y.numpy(), yt.detach().numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=name)
        np.testing.assert_allclose(x.grad().numpy(), xt.grad.numpy(), rtol=1e-4, atol=1e-5,
                                   err_msg=name)
    fast = F.compile(lambda t: t.softmax("k"))
    np.testing.assert_allclose(fast(x.detach()).numpy(), torch.softmax(torch.tensor(x0), -1),
                               rtol=1e-5, atol=1e-6)
    assert len(fast.kernels(x.detach())) == 1
    inf_row = F.Tensor("k").from_slice(ctx, (3,), [-np.inf, 0.0, np.inf])
    np.testing.assert_array_equal(inf_row.softmax("k").numpy()[:1], [0.0])
    half = x.detach().to("bf16").softmax("k")
    assert half.dtype is F.bf16
    widened = x.detach().to("bf16").to("f32")  # the same inputs, widened once
    np.testing.assert_array_equal(half.data_const(),
                                  widened.softmax("k").to("bf16").data_const())


@pytest.mark.parametrize("bad, err", [(None, TypeError), ("0.1", TypeError), (True, TypeError),
                                      (10**400, ValueError), (1.5, F.InvalidShape)])
def test_cross_entropy_label_smoothing_is_checked_by_name(bad, err):
    """Found by the API fuzzer: None reached ``float()`` and raised Python's own message."""
    ctx = F.ExecContext()
    x = F.Tensor("n", "c").from_slice(ctx, (2, 3), np.zeros((2, 3), np.float32))
    with pytest.raises(err, match="label_smoothing"):
        x.cross_entropy("c", [0, 1], reduction="mean", label_smoothing=bad)
    np.testing.assert_allclose(x.cross_entropy("c", [0, 1], reduction="mean").numpy(),
                               np.log(3.0), rtol=1e-6)


def test_huber_delta_and_cosine_eps_are_checked_by_name():
    """The same unchecked ``float()`` as label_smoothing, in huber_loss and
    cosine_similarity."""
    ctx = F.ExecContext()
    x = F.Tensor("n", "c").from_slice(ctx, (2, 3), np.ones((2, 3), np.float32))
    for bad in (None, "1"):
        with pytest.raises(TypeError, match="delta"):
            x.huber_loss(x, delta=bad)
        with pytest.raises(TypeError, match="eps"):
            x.cosine_similarity(x, "c", eps=bad)
    np.testing.assert_allclose(x.huber_loss(x, delta=2).numpy(), 0.0)
    np.testing.assert_allclose(x.cosine_similarity(x, "c", eps=1e-8).numpy(), [1.0, 1.0],
                               rtol=1e-6)
