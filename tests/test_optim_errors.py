"""fucina.optim without torch: hand-computed steps, schedules and every bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest

import fucina as F
from fucina.optim.lr import warmup_cosine_factor

D = F.Tensor("d")


def _var(ctx, vals):
    return D.variable_from_slice(ctx, (len(vals),), vals)


def _grad(p, g):
    """Give ``p`` the gradient ``g`` through an ordinary backward."""
    p.mul(D.from_slice(p._ctx, p.shape, g)).sum_all().backward()


def test_sgd_momentum_by_hand(ctx):
    p = _var(ctx, [1.0, 2.0])
    opt = F.optim.SGD([p], lr=0.5, momentum=0.5, weight_decay=0.25)
    _grad(p, [1.0, -1.0])
    opt.step()  # d = g + 0.25 p = [1.25, -0.5]; buf = d; p -= 0.5 d
    np.testing.assert_allclose(p.numpy(), [0.375, 2.25])
    p.zero_grad()
    _grad(p, [1.0, -1.0])
    opt.step()  # d = [1.09375, -0.4375]; buf = 0.5 buf + d = [1.71875, -0.6875]
    np.testing.assert_allclose(p.numpy(), [0.375 - 0.859375, 2.25 + 0.34375])
    np.testing.assert_allclose(opt.state[p]["momentum_buffer"].numpy(), [1.71875, -0.6875])


def test_adam_first_step_by_hand(ctx):
    # Step 1: m = 0.1 g, v = 0.001 g^2, bias corrections give p -= lr * g / (|g| + eps').
    p = _var(ctx, [1.0, -3.0])
    opt = F.optim.Adam([p], lr=0.1)
    _grad(p, [2.0, -0.5])
    opt.step()
    np.testing.assert_allclose(p.numpy(), [0.9, -2.9], rtol=1e-6)
    assert opt.state[p]["step"] == 1


def test_parameters_without_gradient_are_skipped(ctx):
    p, q = _var(ctx, [1.0]), _var(ctx, [2.0])
    opt = F.optim.Adam([p, q], lr=0.1)
    _grad(p, [1.0])
    opt.step()
    assert q.numpy()[0] == 2.0 and q not in opt.state
    assert opt.state_dict()["state"].keys() == {0}


def test_clip_grad_norm_by_hand(ctx):
    p, q = _var(ctx, [3.0]), _var(ctx, [0.0, 0.0])
    _grad(p, [3.0])
    _grad(q, [0.0, 4.0])
    total = F.optim.clip_grad_norm([p, q], 1.0)
    assert total == pytest.approx(5.0, rel=1e-7) and isinstance(total, float)
    np.testing.assert_allclose(p.grad().numpy(), [3 / (5 + 1e-6)], rtol=1e-6)
    np.testing.assert_allclose(q.grad().numpy(), [0, 4 / (5 + 1e-6)], rtol=1e-6)
    assert F.optim.clip_grad_norm([p, q], 10.0) == pytest.approx(1.0, rel=1e-6)
    np.testing.assert_allclose(p.grad().numpy(), [3 / (5 + 1e-6)], rtol=1e-6)  # unchanged
    assert F.optim.clip_grad_norm(_var(ctx, [1.0]), 1.0) == 0.0  # no gradient at all
    with pytest.raises(ValueError, match="max_norm"):
        F.optim.clip_grad_norm([p], -1.0)
    # A tuple or None let Python's float() TypeError escape; an int beyond float, its
    # OverflowError.
    with pytest.raises(TypeError, match="max_norm must be a real number"):
        F.optim.clip_grad_norm([p], (1.0,))
    with pytest.raises(TypeError, match="params must be a tensor or an iterable"):
        F.optim.clip_grad_norm(None, 1.0)  # Python's "'NoneType' object is not iterable"
    with pytest.raises(ValueError, match="max_norm must be finite"):
        F.optim.clip_grad_norm([p], 10**400)
    for make in (lambda: F.optim.SGD([p], lr=10**400), lambda: F.optim.Adam([p], eps=10**400)):
        with pytest.raises(ValueError, match="invalid (lr|eps)"):
            make()
    with pytest.raises(TypeError, match=r"params\[0\]"):
        F.optim.clip_grad_norm([np.ones(2)], 1.0)


def test_warmup_cosine_factor_reference_endpoints():
    assert warmup_cosine_factor(0, 100, 10, 0.1) == pytest.approx(0.1, abs=1e-12)
    assert warmup_cosine_factor(9, 100, 10, 0.1) == pytest.approx(1.0, abs=1e-12)
    assert warmup_cosine_factor(100, 100, 10, 0.1) == pytest.approx(0.1, abs=1e-9)
    assert warmup_cosine_factor(3, 100, 10, 0.1) == pytest.approx(0.4, abs=1e-12)
    # halfway through the decay: min + (1 - min) / 2
    assert warmup_cosine_factor(55, 100, 10, 0.1) == pytest.approx(0.55, abs=1e-12)
    assert warmup_cosine_factor(500, 100, 10, 0.1) == pytest.approx(0.1, abs=1e-12)
    assert warmup_cosine_factor(0, 10, 0, 0.0) == pytest.approx(1.0)
    assert warmup_cosine_factor(20, 10, 10, 0.2) == 0.2  # nothing left to decay over
    for bad in ((-1, 10, 0, 0.1), (0, 10, 1.5, 0.1), (0, 10, 0, math.nan)):
        with pytest.raises(ValueError):
            warmup_cosine_factor(*bad)


def test_warmup_cosine_drives_group_lr(ctx):
    p = _var(ctx, [1.0])
    opt = F.optim.AdamW([p], lr=2e-2)
    base = opt.param_groups[0]["lr"]
    for step in range(4):
        opt.param_groups[0]["lr"] = base * warmup_cosine_factor(step, 100, 10, 0.1)
    assert opt.param_groups[0]["lr"] == pytest.approx(2e-2 * 0.4)


def test_scheduler_hand_values(ctx):
    opt = F.optim.SGD([_var(ctx, [1.0])], lr=1.0)
    s = F.optim.lr.StepLR(opt, step_size=2, gamma=0.5)
    lrs = [s.get_last_lr()[0]]
    for _ in range(5):
        s.step()
        lrs.append(s.get_last_lr()[0])
    assert lrs == [1.0, 1.0, 0.5, 0.5, 0.25, 0.25]
    opt2 = F.optim.SGD([_var(ctx, [1.0])], lr=1.0)
    lin = F.optim.lr.LinearLR(opt2, start_factor=0.5, end_factor=1.0, total_iters=2)
    seq = [lin.get_last_lr()[0]]
    for _ in range(3):
        lin.step()
        seq.append(lin.get_last_lr()[0])
    assert seq == pytest.approx([0.5, 0.75, 1.0, 1.0])
    with pytest.raises(ValueError, match="step_size"):
        F.optim.lr.StepLR(opt, step_size=0)
    with pytest.raises(ValueError, match="start_factor"):
        F.optim.lr.LinearLR(opt, start_factor=0.0)
    with pytest.raises(TypeError, match="not a fucina.optim optimizer"):
        F.optim.lr.CosineAnnealingLR(object(), T_max=3)
    fresh = F.optim.SGD([_var(ctx, [1.0])], lr=1.0)
    with pytest.raises(KeyError, match="initial_lr"):
        F.optim.lr.StepLR(fresh, step_size=2, last_epoch=3)


def test_scheduler_options_of_the_wrong_kind_are_refused_by_name(ctx):
    # LinearLR(start_factor=None) let Python's "'<' not supported" escape; gamma, eta_min
    # or T_max given an int beyond float raised OverflowError, gamma=nan made a NaN lr.
    opt = F.optim.SGD([_var(ctx, [1.0])], lr=0.1)
    L = F.optim.lr
    for make, what in ((lambda: L.LinearLR(opt, start_factor=None), "start_factor"),
                       (lambda: L.LinearLR(opt, end_factor="x"), "end_factor"),
                       (lambda: L.StepLR(opt, 2, gamma=10**400), "gamma"),
                       (lambda: L.StepLR(opt, 2, gamma=math.nan), "gamma"),
                       (lambda: L.CosineAnnealingLR(opt, T_max=10**400), "T_max"),
                       (lambda: L.CosineAnnealingLR(opt, 5, eta_min=math.inf), "eta_min"),
                       (lambda: warmup_cosine_factor(10**30, 100, 10, 0.1), "step"),
                       (lambda: warmup_cosine_factor(1, 100, 10, None), "min_factor")):
        with pytest.raises(ValueError, match=what):
            make()
    assert opt.param_groups[0]["lr"] == 0.1  # nothing half-applied


def test_scheduler_state_dict_round_trip(ctx):
    opt = F.optim.SGD([_var(ctx, [1.0])], lr=1.0)
    s = F.optim.lr.CosineAnnealingLR(opt, T_max=10)
    for _ in range(4):
        s.step()
    saved = s.state_dict()
    assert "optimizer" not in saved and saved["last_epoch"] == 4
    opt2 = F.optim.SGD([_var(ctx, [1.0])], lr=1.0)
    opt2.load_state_dict(opt.state_dict())
    s2 = F.optim.lr.CosineAnnealingLR(opt2, T_max=10, last_epoch=3)
    s2.load_state_dict(saved)
    s.step()
    s2.step()
    assert s2.get_last_lr() == s.get_last_lr()


def test_non_variables_and_bad_param_lists(ctx):
    v = _var(ctx, [1.0])
    const = D.from_slice(ctx, (1,), [1.0])
    with pytest.raises(ValueError, match=r"\[0\] is not a variable \(a constant\)"):
        F.optim.SGD([const], lr=0.1)
    with pytest.raises(ValueError, match="op result"):
        F.optim.Adam([v.scale(2.0)])
    with pytest.raises(TypeError, match="fucina variable"):
        F.optim.Adam([np.zeros(2)])
    with pytest.raises(TypeError, match="f32 variables"):
        F.optim.Adam([F.Tensor("d", dtype="f16").variable_from_slice(ctx, (2,), [1, 2])])
    with pytest.raises(ValueError, match="more than once"):
        F.optim.SGD([v, v], lr=0.1)
    with pytest.raises(ValueError, match="more than once"):
        F.optim.SGD([{"params": [v]}, {"params": [v]}], lr=0.1)
    with pytest.raises(ValueError, match="empty parameter list"):
        F.optim.SGD([], lr=0.1)
    with pytest.raises(TypeError, match="iterable"):
        F.optim.SGD(v, lr=0.1)
    with pytest.raises(TypeError, match="is a set"):
        F.optim.SGD([{"params": {v}}], lr=0.1)
    with pytest.raises(ValueError, match="'params'"):
        F.optim.SGD([{"lr": 0.1}])
    with pytest.raises(TypeError, match="abstract"):
        F.optim.Optimizer([v], {})


def test_bad_options(ctx):
    v = _var(ctx, [1.0])
    with pytest.raises(ValueError, match="invalid lr"):
        F.optim.SGD([v], lr=-0.1)
    with pytest.raises(ValueError, match="Nesterov"):
        F.optim.SGD([v], lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="Nesterov"):
        F.optim.SGD([v], lr=0.1, momentum=0.9, dampening=0.1, nesterov=True)
    with pytest.raises(ValueError, match=r"betas\[1\]"):
        F.optim.Adam([v], betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="betas must be a pair"):
        F.optim.Adam([v], betas=0.9)
    with pytest.raises(ValueError, match="eps"):
        F.optim.AdamW([v], eps=math.inf)
    with pytest.raises(ValueError, match=r"param_groups\[1\]: invalid weight_decay"):
        F.optim.AdamW([{"params": [v]}, {"params": [_var(ctx, [2.0])], "weight_decay": -1}])


def _trained(ctx):
    w = F.Tensor("r", "c").variable_from_slice(ctx, (2, 3), np.arange(6))
    b = _var(ctx, [1.0, -1.0])
    opt = F.optim.Adam([{"params": [w]}, {"params": [b], "lr": 0.5}], lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        w.mul(w).sum_all().add(b.sum_all()).backward()
        opt.step()
    return w, b, opt


def test_state_dict_round_trip_copies(ctx):
    w, b, opt = _trained(ctx)
    sd = opt.state_dict()
    assert sd["param_groups"][1]["lr"] == 0.5 and sd["param_groups"][1]["params"] == [1]
    m0 = sd["state"][0]["exp_avg"].numpy()
    opt.step()  # the state dict holds copies: later steps do not change it
    np.testing.assert_array_equal(sd["state"][0]["exp_avg"].numpy(), m0)
    numpy_sd = {"state": {i: {k: (v if k == "step" else v.numpy()) for k, v in st.items()}
                          for i, st in sd["state"].items()},
                "param_groups": sd["param_groups"]}
    opt.load_state_dict(numpy_sd)  # arrays load as well as tensors
    np.testing.assert_array_equal(opt.state[w]["exp_avg"].numpy(), m0)
    assert opt.state[w]["step"] == 2


@pytest.mark.parametrize("mutate,exc,match", [
    (lambda sd: sd.pop("state"), ValueError, "missing 'state'"),
    (lambda sd: sd["param_groups"].pop(), ValueError, "1 param groups"),
    (lambda sd: sd["param_groups"][0].pop("betas"), ValueError, "missing option 'betas'"),
    (lambda sd: sd["param_groups"][1]["params"].append(7), ValueError, "2 params"),
    (lambda sd: sd["state"][0].pop("exp_avg_sq"), ValueError, r"\[0\] is missing 'exp_avg_sq'"),
    (lambda sd: sd["state"][1].update(extra=1), ValueError, "unexpected entries"),
    (lambda sd: sd["state"][0].update(exp_avg=np.zeros((3, 2), np.float32)), ValueError,
     r"shape \(3, 2\)"),
    (lambda sd: sd["state"][0].update(exp_avg=np.zeros((2, 3))), TypeError, "float64"),
    (lambda sd: sd["state"][0].update(
        exp_avg=F.Tensor("r", "c", dtype="f16").zeros(F.ExecContext(), (2, 3))), TypeError,
     "dtype f16"),
    (lambda sd: sd["state"][0].update(step=-2), ValueError, "non-negative"),
    (lambda sd: sd["state"][0].update(step="two"), TypeError, "step count"),
    (lambda sd: sd["state"].update({5: {}}), ValueError, "parameter 5"),
    (lambda sd: sd["param_groups"][0].update(lr=-1.0), ValueError, "invalid lr"),
])
def test_bad_state_dicts_leave_everything_untouched(ctx, mutate, exc, match):
    w, b, opt = _trained(ctx)
    sd = opt.state_dict()
    mutate(sd)
    before = (w.numpy(), b.numpy(), opt.state[w]["exp_avg"].numpy(), opt.state[w]["step"],
              [dict(g) for g in opt.param_groups])
    with pytest.raises(exc, match=match):
        opt.load_state_dict(sd)
    np.testing.assert_array_equal(w.numpy(), before[0])
    np.testing.assert_array_equal(b.numpy(), before[1])
    np.testing.assert_array_equal(opt.state[w]["exp_avg"].numpy(), before[2])
    assert opt.state[w]["step"] == before[3]
    assert [dict(g) for g in opt.param_groups] == before[4]


def test_what_a_compiled_function_cannot_do_with_an_optimizer(ctx):
    w = _var(ctx, [1.0, 2.0])
    opt = F.optim.SGD([w], lr=0.1)
    x = D.from_slice(ctx, (2,), [1.0, 1.0])
    with pytest.raises(TypeError, match="outside the function"):
        F.compile(lambda x: (F.optim.Adam([w]), x.scale(1.0))[1])(x)
    with pytest.raises(TypeError, match=r"state_dict\(\) inside fucina.compile"):
        F.compile(lambda x: (opt.state_dict(), x.scale(1.0))[1])(x)
    with pytest.raises(TypeError, match=r"load_state_dict\(\) inside fucina.compile"):
        F.compile(lambda x: (opt.load_state_dict({}), x.scale(1.0))[1])(x)

    def step_on_argument(p):  # the optimizer's variable passed in as an argument
        p.mul(x).sum_all().backward()
        opt.step()
        return p

    with pytest.raises(TypeError, match="captures"):
        F.compile(step_on_argument)(w)
    np.testing.assert_array_equal(w.numpy(), [1.0, 2.0])
