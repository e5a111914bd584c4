"""fucina.optim against torch.optim, step by step over many steps."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import numpy as np  # noqa: E402

import fucina as F  # noqa: E402

RNG = np.random.default_rng(0)
W0 = RNG.standard_normal((8, 5)).astype(np.float32)
B0 = RNG.standard_normal(8).astype(np.float32)
V0 = RNG.standard_normal(3).astype(np.float32)
X = RNG.standard_normal((16, 5)).astype(np.float32)
Y = RNG.standard_normal((16, 8)).astype(np.float32)


class Pair:
    """The same three parameters and loss in fucina and torch."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.w = F.Tensor("out", "in").variable_from_slice(ctx, W0.shape, W0)
        self.b = F.Tensor("out").variable_from_slice(ctx, B0.shape, B0)
        self.v = F.Tensor("k").variable_from_slice(ctx, V0.shape, V0)  # never gets a grad
        self.tw = torch.tensor(W0, requires_grad=True)
        self.tb = torch.tensor(B0, requires_grad=True)
        self.tv = torch.tensor(V0, requires_grad=True)
        self.x = F.Tensor("batch", "in").from_slice(ctx, X.shape, X)
        self.y = F.Tensor("batch", "out").from_slice(ctx, Y.shape, Y)

    def params(self):
        return [self.w, self.b, self.v]

    def tparams(self):
        return [self.tw, self.tb, self.tv]

    def backward(self):
        d = self.x.dot(self.w, "in").add(self.b).tanh().sub(self.y)
        loss = d.mul(d).mean("batch").sum_all()
        loss.backward()
        td = torch.tanh(torch.from_numpy(X) @ self.tw.T + self.tb) - torch.from_numpy(Y)
        tloss = (td * td).mean(0).sum()
        tloss.backward()
        return loss.item(), tloss.item()

    def check(self, rtol=1e-5, atol=1e-5):
        for p, tp in zip(self.params(), self.tparams()):
            np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=rtol, atol=atol)


def _train(pair, opt, topt, steps, scheds=(), tscheds=()):
    for _ in range(steps):
        opt.zero_grad()
        topt.zero_grad()
        loss, tloss = pair.backward()
        np.testing.assert_allclose(loss, tloss, rtol=1e-4)
        opt.step()
        topt.step()
        for s in scheds:
            s.step()
        for s in tscheds:
            s.step()
        pair.check()


SGD_CASES = [
    {"lr": 0.05},
    {"lr": 0.05, "momentum": 0.9},
    {"lr": 0.05, "momentum": 0.9, "dampening": 0.3, "weight_decay": 1e-2},
    {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-3},
]


@pytest.mark.parametrize("kw", SGD_CASES)
def test_sgd_matches_torch(ctx, kw):
    pair = Pair(ctx)
    _train(pair, F.optim.SGD(pair.params(), **kw), torch.optim.SGD(pair.tparams(), **kw), 150)
    assert np.array_equal(pair.v.numpy(), V0)  # no gradient: untouched


@pytest.mark.parametrize("cls,kw", [
    ("Adam", {}),
    ("Adam", {"lr": 1e-2, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 1e-2}),
    ("AdamW", {}),
    ("AdamW", {"lr": 3e-2, "weight_decay": 0.1}),
])
def test_adam_family_matches_torch(ctx, cls, kw):
    pair = Pair(ctx)
    opt = getattr(F.optim, cls)(pair.params(), **kw)
    topt = getattr(torch.optim, cls)(pair.tparams(), **kw)
    _train(pair, opt, topt, 200)
    assert opt.defaults["weight_decay"] == topt.defaults["weight_decay"]


def test_defaults_are_torchs():
    ours = {"SGD": F.optim.SGD, "Adam": F.optim.Adam, "AdamW": F.optim.AdamW}
    ctx = F.ExecContext()
    p = F.Tensor("d").variable_from_slice(ctx, (2,), [1, 2])
    tp = torch.zeros(2, requires_grad=True)
    for name, cls in ours.items():
        mine = cls([p]).defaults
        theirs = getattr(torch.optim, name)([tp]).defaults
        for k, v in mine.items():
            assert theirs[k] == v, (name, k)


def test_param_groups_with_per_group_options(ctx):
    pair = Pair(ctx)
    groups = [{"params": [pair.w], "weight_decay": 0.1}, {"params": [pair.b, pair.v]}]
    tgroups = [{"params": [pair.tw], "weight_decay": 0.1}, {"params": [pair.tb, pair.tv]}]
    opt = F.optim.AdamW(groups, lr=2e-2, weight_decay=0.0)
    topt = torch.optim.AdamW(tgroups, lr=2e-2, weight_decay=0.0)
    assert opt.param_groups[0]["weight_decay"] == 0.1
    assert opt.param_groups[1]["weight_decay"] == 0.0
    _train(pair, opt, topt, 60)


def _torch_state(topt):
    sd = topt.state_dict()
    return sd["state"], sd["param_groups"]


def test_state_dict_has_torchs_structure_and_values(ctx):
    pair = Pair(ctx)
    opt = F.optim.Adam(pair.params(), lr=1e-2)
    topt = torch.optim.Adam(pair.tparams(), lr=1e-2)
    _train(pair, opt, topt, 5)
    sd = opt.state_dict()
    tstate, tgroups = _torch_state(topt)
    assert sorted(sd["state"]) == sorted(tstate) == [0, 1]  # v never stepped
    for i, st in sd["state"].items():
        assert set(st) == set(tstate[i])
        assert st["step"] == int(tstate[i]["step"]) == 5
        for name in ("exp_avg", "exp_avg_sq"):
            np.testing.assert_allclose(st[name].numpy(), tstate[i][name].numpy(), rtol=1e-4,
                                       atol=1e-7)
    assert sd["param_groups"][0]["params"] == tgroups[0]["params"] == [0, 1, 2]
    for k, v in sd["param_groups"][0].items():
        assert tgroups[0][k] == v, k


def test_load_torch_state_dict_and_continue(ctx):
    pair = Pair(ctx)
    topt = torch.optim.SGD(pair.tparams(), lr=0.05, momentum=0.9)
    for _ in range(4):
        topt.zero_grad()
        pair.backward()
        topt.step()
    with F.no_grad():
        for p, tp in zip(pair.params(), pair.tparams()):
            p.as_raw_tensor().array()[...] = tp.detach().numpy()
    opt = F.optim.SGD(pair.params(), lr=0.05, momentum=0.9)
    opt.load_state_dict(topt.state_dict())
    for p in pair.params():
        p.zero_grad()
    _train(pair, opt, topt, 30)


def test_own_state_dict_resumes_identically(ctx):
    def make(pair):
        return F.optim.AdamW([{"params": [pair.w]}, {"params": [pair.b], "lr": 5e-3}],
                             lr=1e-2)

    straight, resumed = Pair(ctx), Pair(ctx)
    a, b = make(straight), make(resumed)
    for pair, opt in ((straight, a), (resumed, b)):
        for _ in range(7):
            opt.zero_grad()
            pair.backward()
            opt.step()
    sd = b.state_dict()
    fresh = make(resumed)
    fresh.load_state_dict(sd)
    for pair, opt in ((straight, a), (resumed, fresh)):
        for _ in range(10):
            opt.zero_grad()
            pair.backward()
            opt.step()
    for p, q in zip(straight.params(), resumed.params()):
        np.testing.assert_array_equal(q.numpy(), p.numpy())


@pytest.mark.parametrize("max_norm", [0.5, 1e3])
def test_clip_grad_norm_matches_torch(ctx, max_norm):
    pair = Pair(ctx)
    pair.backward()
    total = F.optim.clip_grad_norm(pair.params(), max_norm)
    ttotal = torch.nn.utils.clip_grad_norm_(pair.tparams(), max_norm)
    assert isinstance(total, float)
    np.testing.assert_allclose(total, float(ttotal), rtol=1e-5)
    for p, tp in zip(pair.params()[:2], pair.tparams()[:2]):
        np.testing.assert_allclose(p.grad().numpy(), tp.grad.numpy(), rtol=1e-5, atol=1e-7)


def test_clip_then_adam_matches_torch(ctx):
    pair = Pair(ctx)
    opt = F.optim.Adam(pair.params(), lr=1e-2)
    topt = torch.optim.Adam(pair.tparams(), lr=1e-2)
    for _ in range(40):
        opt.zero_grad()
        topt.zero_grad()
        pair.backward()
        F.optim.clip_grad_norm(pair.params(), 0.3)
        torch.nn.utils.clip_grad_norm_(pair.tparams(), 0.3)
        opt.step()
        topt.step()
        pair.check()


def _lr_pair(ctx):
    p = F.Tensor("d").variable_from_slice(ctx, (2,), [1, 2])
    q = F.Tensor("d").variable_from_slice(ctx, (2,), [1, 2])
    tp, tq = torch.zeros(2, requires_grad=True), torch.zeros(2, requires_grad=True)
    opt = F.optim.SGD([{"params": [p]}, {"params": [q], "lr": 0.3}], lr=0.1)
    topt = torch.optim.SGD([{"params": [tp]}, {"params": [tq], "lr": 0.3}], lr=0.1)
    return opt, topt


@pytest.mark.parametrize("name,kw", [
    ("StepLR", {"step_size": 3, "gamma": 0.5}),
    ("StepLR", {"step_size": 1}),
    ("CosineAnnealingLR", {"T_max": 10}),
    ("CosineAnnealingLR", {"T_max": 7, "eta_min": 0.01}),
    ("LinearLR", {}),
    ("LinearLR", {"start_factor": 0.1, "end_factor": 0.9, "total_iters": 8}),
])
def test_schedulers_follow_torchs_sequence(ctx, name, kw):
    opt, topt = _lr_pair(ctx)
    sched = getattr(F.optim.lr, name)(opt, **kw)
    tsched = getattr(torch.optim.lr_scheduler, name)(topt, **kw)
    assert sched.get_last_lr() == pytest.approx(tsched.get_last_lr(), rel=1e-12)
    for _ in range(30):  # past T_max: the cosine comes back up, as in torch
        opt.step()
        topt.step()
        sched.step()
        tsched.step()
        assert sched.get_last_lr() == pytest.approx(tsched.get_last_lr(), rel=1e-12, abs=1e-15)
        assert [g["lr"] for g in opt.param_groups] == sched.get_last_lr()
    assert sched.last_epoch == tsched.last_epoch == 30


def test_scheduled_training_matches_torch(ctx):
    pair = Pair(ctx)
    opt = F.optim.SGD(pair.params(), lr=0.1, momentum=0.9)
    topt = torch.optim.SGD(pair.tparams(), lr=0.1, momentum=0.9)
    scheds = [F.optim.lr.CosineAnnealingLR(opt, T_max=20)]
    tscheds = [torch.optim.lr_scheduler.CosineAnnealingLR(topt, T_max=20)]
    _train(pair, opt, topt, 25, scheds, tscheds)


def test_zero_grad_matches_torch_semantics(ctx):
    pair = Pair(ctx)
    opt = F.optim.SGD(pair.params(), lr=0.1)
    pair.backward()
    held = pair.w.grad_view()
    opt.zero_grad(set_to_none=False)
    np.testing.assert_array_equal(pair.w.grad().numpy(), np.zeros_like(W0))
    np.testing.assert_array_equal(held.numpy(), np.zeros_like(W0))  # zeroed in place
    opt.zero_grad()
    assert pair.w.grad() is None and pair.b.grad() is None
