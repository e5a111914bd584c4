"""Optimizer steps inside fucina.compile: one program per training step, equal to eager."""

from __future__ import annotations

import numpy as np
import pytest

import fucina as F

RNG = np.random.default_rng(0)
H = 16
W1 = RNG.standard_normal((H, 2)).astype(np.float32)
W2 = (RNG.standard_normal((2, H)) / 4).astype(np.float32)
BATCHES = [(RNG.standard_normal((32, 2)).astype(np.float32),
            np.eye(2, dtype=np.float32)[RNG.integers(0, 2, 32)]) for _ in range(100)]


class Net:
    """A small MLP, its optimizer and a training step that zeroes, backprops and steps."""

    def __init__(self, ctx, make_opt, zero_inside=True):
        self.ctx = ctx
        self.w1 = F.Tensor("h", "in").variable_from_slice(ctx, W1.shape, W1)
        self.b1 = F.Tensor("h").variable_from_slice(ctx, (H,), np.zeros(H))
        self.w2 = F.Tensor("c", "h").variable_from_slice(ctx, W2.shape, W2)
        self.opt = make_opt(self.params())
        self.zero_inside = zero_inside

    def params(self):
        return [self.w1, self.b1, self.w2]

    def step(self, x, y):
        if self.zero_inside:
            self.opt.zero_grad()
        logits = x.dot(self.w1, "in").add(self.b1).tanh().dot(self.w2, "h")
        loss = logits.logsumexp("c").sub(logits.mul(y).sum("c")).mean("b")
        loss.backward()
        self.opt.step()
        return loss

    def batch(self, k):
        x, y = BATCHES[k % len(BATCHES)]
        return (F.Tensor("b", "in").from_slice(self.ctx, x.shape, x),
                F.Tensor("b", "c").from_slice(self.ctx, y.shape, y))


def _close(a, b, rtol=1e-5, atol=1e-6):
    for p, q in zip(a.params(), b.params()):
        np.testing.assert_allclose(q.numpy(), p.numpy(), rtol=rtol, atol=atol)


OPTIMIZERS = [
    ("SGD", {"lr": 0.1}),
    ("SGD", {"lr": 0.1, "momentum": 0.9, "dampening": 0.2, "weight_decay": 1e-3}),
    ("SGD", {"lr": 0.05, "momentum": 0.9, "nesterov": True}),
    ("Adam", {"lr": 1e-2}),
    ("Adam", {"lr": 1e-2, "weight_decay": 1e-2}),
    ("AdamW", {"lr": 1e-2}),
]


@pytest.mark.parametrize("name,kw", OPTIMIZERS)
def test_100_compiled_steps_equal_100_eager_steps(ctx, name, kw):
    def make(params):
        return getattr(F.optim, name)(params, **kw)

    eager, comp = Net(ctx, make), Net(ctx, make)
    fast = F.compile(comp.step)
    buffers = [p.as_raw_tensor().storage.buf for p in comp.params()]
    for k in range(100):
        want = eager.step(*eager.batch(k)).item()
        got = fast(*comp.batch(k)).item()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    _close(eager, comp)
    assert fast.cache_size() == 1  # 100 new batches, one trace
    # Parameters were updated where they live: same buffers, written by the kernels.
    assert all(p.as_raw_tensor().storage.buf is b for p, b in zip(comp.params(), buffers))
    text = fast.ir(*comp.batch(0))
    assert "copied after the last step" not in text
    assert text.count("stored in place by its kernel") == 3 + 3 * len(comp.opt._slots[comp.w1])
    # The optimizer's own state matches: step counts and moments.
    se, sc = eager.opt.state_dict(), comp.opt.state_dict()
    assert se["param_groups"] == sc["param_groups"]
    for i in se["state"]:
        for key, v in se["state"][i].items():
            if key == "step":
                assert sc["state"][i][key] == v == 100
            else:
                np.testing.assert_allclose(sc["state"][i][key].numpy(), v.numpy(), rtol=1e-4,
                                           atol=1e-6)


def test_schedules_change_the_lr_without_retracing(ctx):
    def make(params):
        return F.optim.Adam(params, lr=2e-2)

    eager, comp = Net(ctx, make), Net(ctx, make)
    scheds = [F.optim.lr.CosineAnnealingLR(n.opt, T_max=30) for n in (eager, comp)]
    fast = F.compile(comp.step)
    for k in range(40):
        eager.step(*eager.batch(k))
        fast(*comp.batch(k))
        for s in scheds:
            s.step()
    assert comp.opt.param_groups[0]["lr"] == eager.opt.param_groups[0]["lr"] != 2e-2
    _close(eager, comp)
    assert fast.cache_size() == 1


def test_gradients_accumulated_outside_are_read_by_the_compiled_step(ctx):
    # No zero_grad inside: the step uses what the parameters held at call time plus this
    # call's gradient, as eager does. The program reads that gradient as an input (a
    # second trace covers "a gradient is present").
    def make(params):
        return F.optim.SGD(params, lr=0.1, momentum=0.5)

    eager, comp = Net(ctx, make, zero_inside=False), Net(ctx, make, zero_inside=False)
    fast = F.compile(comp.step)
    for k in range(6):
        if k % 3 == 0:
            eager.opt.zero_grad()
            comp.opt.zero_grad()
        eager.step(*eager.batch(k))
        fast(*comp.batch(k))
        for p, q in zip(eager.params(), comp.params()):
            np.testing.assert_allclose(q.grad().numpy(), p.grad().numpy(), rtol=1e-5,
                                       atol=1e-7)
    _close(eager, comp)
    assert fast.cache_size() == 2


def test_zero_grad_inside_leaves_only_this_calls_gradient(ctx):
    def make(params):
        return F.optim.SGD(params, lr=0.1)

    eager, comp = Net(ctx, make), Net(ctx, make)
    for n in (eager, comp):  # a stale gradient from before: zero_grad must drop it
        n.w1.mul(n.w1).sum_all().backward()
    fast = F.compile(comp.step)
    eager.step(*eager.batch(0))
    fast(*comp.batch(0))
    for p, q in zip(eager.params(), comp.params()):
        np.testing.assert_allclose(q.grad().numpy(), p.grad().numpy(), rtol=1e-5, atol=1e-7)
    _close(eager, comp)


def test_loaded_state_and_eager_steps_mix_with_compiled_ones(ctx):
    def make(params):
        return F.optim.AdamW(params, lr=1e-2, weight_decay=0.05)

    ref, comp = Net(ctx, make), Net(ctx, make)
    fast = F.compile(comp.step)
    for k in range(5):
        ref.step(*ref.batch(k))
        fast(*comp.batch(k))
    for k in range(5, 8):  # eager steps on the compiled network's optimizer
        ref.step(*ref.batch(k))
        comp.step(*comp.batch(k))
    # A state dict loaded between calls is read by the next compiled call.
    saved_params = [p.numpy() for p in ref.params()]
    saved = ref.opt.state_dict()
    for k in range(8, 12):
        ref.step(*ref.batch(k))
    with F.no_grad():
        for p, v in zip(comp.params(), saved_params):
            p.as_raw_tensor().array()[...] = v
    comp.opt.load_state_dict(saved)
    for k in range(8, 12):
        fast(*comp.batch(k))
    _close(ref, comp)
    assert comp.opt.state[comp.w1]["step"] == ref.opt.state[ref.w1]["step"] == 12
    assert fast.cache_size() == 1


def test_changing_the_update_structure_retraces(ctx):
    def make(params):
        return F.optim.SGD(params, lr=0.1)

    eager, comp = Net(ctx, make), Net(ctx, make)
    fast = F.compile(comp.step)
    for k in range(3):
        eager.step(*eager.batch(k))
        fast(*comp.batch(k))
    for n in (eager, comp):  # weight decay on: the update gains an op
        n.opt.param_groups[0]["weight_decay"] = 0.1
    for k in range(3, 6):
        eager.step(*eager.batch(k))
        fast(*comp.batch(k))
    _close(eager, comp)
    assert fast.cache_size() == 2


def test_compiled_spirals_example_trains_with_the_step_inside(capsys):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    try:
        import spirals
    finally:
        sys.path.pop(0)
    eager = spirals.train("eager", epochs=12, lr=5e-2, verbose=False)
    whole = spirals.train("compiled", epochs=12, lr=5e-2, verbose=False)
    np.testing.assert_allclose(whole.losses, eager.losses, rtol=1e-4)
    for p, q in zip(eager.model.params(), whole.model.params()):
        np.testing.assert_allclose(q.numpy(), p.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("max_norm", [0.05, 100.0])
def test_clip_grad_norm_inside_the_compiled_step(ctx, max_norm):
    def make(params):
        return F.optim.SGD(params, lr=0.1, momentum=0.9)

    eager, comp = Net(ctx, make), Net(ctx, make)

    def clipped(net):
        def step(x, y):
            net.opt.zero_grad()
            logits = x.dot(net.w1, "in").add(net.b1).tanh().dot(net.w2, "h")
            loss = logits.logsumexp("c").sub(logits.mul(y).sum("c")).mean("b")
            loss.backward()
            norm = F.optim.clip_grad_norm(net.params(), max_norm)
            net.opt.step()
            return loss, norm
        return step

    run_eager, fast = clipped(eager), F.compile(clipped(comp))
    for k in range(20):
        le, ne = run_eager(*eager.batch(k))
        lc, nc = fast(*comp.batch(k))
        assert isinstance(ne, float) and type(nc) is F.Tensor()
        # Bit for bit: the eager norm was a float64 sum on the host, 1 ulp off the program's
        assert float(nc) == ne
        assert lc.item() == le.item()
        for p, q in zip(eager.params(), comp.params()):  # the clipped gradients stay behind
            np.testing.assert_array_equal(q.grad().numpy(), p.grad().numpy())
    _close(eager, comp)
    assert fast.cache_size() == 1


def _kernel_of_writes(text):
    """Per written input, the index of the kernel that stores its value (from fast.ir)."""
    kernel, where = -1, {}
    for line in text.splitlines():
        if line.startswith("  kernel "):
            kernel += 1
        elif line.startswith("    %") and "-> stored" in line:
            where[line.split()[0]] = kernel
    return {line.split()[1]: where.get(line.split()[3]) for line in text.splitlines()
            if line.startswith("  write ")}


def test_each_parameters_update_is_one_kernel(ctx):
    comp = Net(ctx, lambda params: F.optim.AdamW(params, lr=1e-2))
    fast = F.compile(comp.step)
    writes = _kernel_of_writes(fast.ir(*comp.batch(0)))
    assert len(writes) == 9 and None not in writes.values()  # 3 parameters x (p, m, v)
    assert len(set(writes.values())) == 3  # one kernel writes each parameter and its moments
