"""Activation checkpointing: values, memory shape, re-run in backward, errors, compile."""

from __future__ import annotations

import numpy as np
import pytest

import fucina as F
from fucina.ir.graph import topo_order

XB = F.Tensor("batch", "in")
WO = F.Tensor("out", "in")


def ckpt_layer(x, w):
    return x.dot(w, "in").tanh()


def test_reference_checkpointed_layer(ctx):
    x = XB.variable_from_slice(ctx, (1, 2), [1, 2])
    w = WO.variable_from_slice(ctx, (1, 2), [0.5, -0.25])
    y = F.checkpoint(ckpt_layer, (x, w))
    assert type(y) is F.Tensor("batch", "out") and y.requires_grad
    np.testing.assert_array_equal(y.numpy(), [[0.0]])
    y.sum_all().backward()
    # z = 0, tanh'(0) = 1 -> dL/dw = x, dL/dx = w
    np.testing.assert_array_equal(w.grad().numpy(), [[1, 2]])
    np.testing.assert_array_equal(x.grad().numpy(), [[0.5, -0.25]])


def test_reference_frozen_state_through_extra(ctx):
    x = XB.variable_from_slice(ctx, (1, 2), [1, 2])
    w = WO.from_slice(ctx, (1, 2), [3, 4])

    def frozen(extra, x):
        return x.dot(extra["w"], "in").scale(extra["alpha"])

    y = F.checkpoint_with_context(frozen, {"w": w, "alpha": 0.5}, (x,))
    y.sum_all().backward()
    np.testing.assert_array_equal(x.grad().numpy(), [[1.5, 2.0]])  # alpha * w


def test_extra_and_closure_variables_get_no_gradient(ctx):
    # Trainable tensors must travel through inputs; anything else is a constant.
    x = XB.variable_from_slice(ctx, (1, 2), [1, 2])
    w = WO.variable_from_slice(ctx, (1, 2), [3, 4])
    b = F.Tensor("out").variable_from_slice(ctx, (1,), [1.0])
    y = F.checkpoint_with_context(lambda e, x: x.dot(e, "in").add(b), w, (x,))
    y.sum_all().backward()
    np.testing.assert_array_equal(x.grad().numpy(), [[3, 4]])
    assert w.grad() is None and b.grad() is None


def _block(x, w1, w2):
    h = x.dot(w1, "in").gelu()
    return h.dot(w2, "hid").softmax("out").mul(h.sum("hid"))


def _mlp_inputs(ctx, seed=0):
    rng = np.random.default_rng(seed)
    x = XB.variable_from_slice(ctx, (4, 6), rng.standard_normal((4, 6)))
    w1 = F.Tensor("hid", "in").variable_from_slice(ctx, (5, 6), rng.standard_normal((5, 6)))
    w2 = F.Tensor("out", "hid").variable_from_slice(ctx, (3, 5), rng.standard_normal((3, 5)))
    return x, w1, w2


def test_gradients_bitwise_equal_to_plain_forward(ctx):
    plain, ckpt = _mlp_inputs(ctx), _mlp_inputs(ctx)
    rng = np.random.default_rng(1)
    seed = rng.standard_normal((4, 3)).astype(np.float32)
    g = F.Tensor("batch", "out").from_slice(ctx, (4, 3), seed)
    y0 = _block(*plain)
    y1 = F.checkpoint(_block, ckpt)
    np.testing.assert_array_equal(y1.numpy(), y0.numpy())
    y0.backward_with_grad(g)
    y1.backward_with_grad(g)
    for a, b in zip(plain, ckpt):
        np.testing.assert_array_equal(b.grad().numpy(), a.grad().numpy())


def test_only_inputs_and_output_are_kept_and_the_block_reruns(ctx):
    calls = []

    def block(x, w1, w2):
        calls.append(1)
        return _block(x, w1, w2)

    ins = _mlp_inputs(ctx)
    y = F.checkpoint(block, ins)
    assert len(calls) == 1
    # The graph below the result: the checkpoint node, the stored output, the inputs.
    nodes = topo_order([y._node])
    assert len(nodes) == 2 + len(ins)
    assert {id(n) for n in nodes} >= {id(x._node) for x in ins}
    plain_nodes = topo_order([_block(*ins)._node])
    assert len(plain_nodes) > len(nodes) + 5
    y.sum_all().backward()
    assert len(calls) == 2  # re-run once, in backward


def test_no_grad_inputs_give_a_plain_result(ctx):
    calls = []
    x = XB.from_slice(ctx, (1, 2), [1, 2])
    w = WO.from_slice(ctx, (1, 2), [1, 1])
    y = F.checkpoint(lambda x, w: (calls.append(1), ckpt_layer(x, w))[1], (x, w))
    assert not y.requires_grad and len(calls) == 1
    np.testing.assert_allclose(y.numpy(), [[np.tanh(3.0)]], rtol=1e-6)
    with pytest.raises(F.NoGradientGraph):
        y.sum_all().backward()


def test_identity_block_returns_a_no_grad_alias_for_constants(ctx):
    x = XB.from_slice(ctx, (1, 2), [1, 2])
    y = F.checkpoint(lambda x: x, (x,))
    np.testing.assert_array_equal(y.numpy(), [[1, 2]])
    xv = XB.variable_from_slice(ctx, (1, 2), [1, 2])
    yv = F.checkpoint(lambda x: x, (xv,))
    yv.scale(3.0).sum_all().backward()
    np.testing.assert_array_equal(xv.grad().numpy(), [[3, 3]])


def test_checkpoint_records_inside_no_grad(ctx):
    # The reference keys checkpoint on its inputs alone, not on the no_grad scope.
    x = XB.variable_from_slice(ctx, (1, 2), [1, 2])
    w = WO.variable_from_slice(ctx, (1, 2), [0.5, -0.25])
    with F.no_grad():
        y = F.checkpoint(ckpt_layer, (x, w))
    assert y.requires_grad
    y.sum_all().backward()
    np.testing.assert_array_equal(w.grad().numpy(), [[1, 2]])


def test_nested_checkpoint_is_rejected_in_backward(ctx):
    x = XB.variable_from_slice(ctx, (1, 2), [1, 2])
    w = WO.variable_from_slice(ctx, (1, 2), [0.5, -0.25])

    def outer(x, w):
        return F.checkpoint(ckpt_layer, (x, w)).scale(2.0)

    y = F.checkpoint(outer, (x, w))  # the forward runs fine
    np.testing.assert_array_equal(y.numpy(), [[0.0]])
    with pytest.raises(F.NestedCheckpointRecompute, match="inside another checkpoint"):
        y.sum_all().backward()
    # The guard is released after the failure: a plain checkpoint still works.
    x.zero_grad()
    F.checkpoint(ckpt_layer, (x, w)).sum_all().backward()
    np.testing.assert_array_equal(x.grad().numpy(), [[0.5, -0.25]])


def test_output_not_differentiable_on_rerun(ctx):
    x = XB.variable_from_slice(ctx, (1, 2), [1, 2])
    const = XB.from_slice(ctx, (1, 2), [5, 6])
    y = F.checkpoint(lambda x: const.scale(1.0), (x,))
    with pytest.raises(F.CheckpointOutputNotDifferentiable):
        y.sum_all().backward()


def test_missing_input_gradient(ctx):
    x = XB.variable_from_slice(ctx, (1, 2), [1, 2])
    w = WO.variable_from_slice(ctx, (1, 2), [1, 1])
    y = F.checkpoint(lambda x, w: x.scale(2.0), (x, w))
    with pytest.raises(F.CheckpointMissingInputGradient, match="input 1"):
        y.sum_all().backward()


def test_dropout_with_explicit_seed_reruns_identically(ctx):
    def block(x, w):
        return x.dot(w, "in").dropout(0.5, 7).tanh()

    plain, ckpt = _mlp_inputs(ctx)[:2], _mlp_inputs(ctx)[:2]
    w_plain = F.Tensor("out", "in").variable_from_slice(ctx, (5, 6), np.linspace(-1, 1, 30))
    w_ckpt = F.Tensor("out", "in").variable_from_slice(ctx, (5, 6), np.linspace(-1, 1, 30))
    block(plain[0], w_plain).sum_all().backward()
    F.checkpoint(block, (ckpt[0], w_ckpt)).sum_all().backward()
    np.testing.assert_array_equal(w_ckpt.grad().numpy(), w_plain.grad().numpy())
    np.testing.assert_array_equal(ckpt[0].grad().numpy(), plain[0].grad().numpy())


def test_bad_arguments(ctx):
    x = XB.variable_from_slice(ctx, (1, 2), [1, 2])
    with pytest.raises(TypeError, match=r"\(x,\)"):
        F.checkpoint(ckpt_layer, x)
    with pytest.raises(TypeError, match=r"inputs\[1\]"):
        F.checkpoint(ckpt_layer, (x, 3.0))
    with pytest.raises(TypeError, match="callable"):
        F.checkpoint(None, (x,))
    with pytest.raises(F.TagError, match="f32"):
        F.checkpoint(lambda a: a, (F.Tensor("d", dtype="i32").from_slice(ctx, (2,), [1, 2]),))
    with pytest.raises(TypeError, match="one fucina tensor"):
        F.checkpoint(lambda a: (a, a), (x,))
    with pytest.raises(F.ContextMismatch):
        F.checkpoint(lambda a, b: a, (x, XB.from_slice(F.ExecContext(), (1, 2), [1, 2])))


def test_compiled_checkpoint_step_equals_eager(ctx):
    def step(x, w1, w2):
        y = F.checkpoint(_block, (x, w1, w2))
        loss = y.mul(y).sum_all()
        loss.backward()
        return loss

    eager, comp = _mlp_inputs(ctx), _mlp_inputs(ctx)
    want = step(*eager).item()
    fast = F.compile(step)
    got = fast(*comp).item()
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for a, b in zip(eager, comp):
        np.testing.assert_allclose(b.grad().numpy(), a.grad().numpy(), rtol=1e-4, atol=1e-6)
    # The re-run block is part of the program: 2 forward contractions, 2 re-run, 4 backward.
    assert fast.ir(*comp).count("= contract(") == 8

    def plain_step(x, w1, w2):
        y = _block(x, w1, w2)
        loss = y.mul(y).sum_all()
        loss.backward()
        return loss

    assert F.compile(plain_step).ir(*comp).count("= contract(") == 6


def test_compiled_checkpoint_over_captured_weights_equals_eager(ctx):
    # The weights are reached through the closure (captured), not passed as arguments.
    def make():
        x, w1, w2 = _mlp_inputs(ctx)

        def step(x):
            loss = F.checkpoint(_block, (x, w1, w2)).sum_all()
            loss.backward()
            return loss

        return x, (x, w1, w2), step

    x0, eager_params, eager_step = make()
    x1, comp_params, comp_step = make()
    want = [eager_step(x0).item() for _ in range(2)]
    fast = F.compile(comp_step)
    got = [fast(x1).item() for _ in range(2)]
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for a, b in zip(eager_params, comp_params):  # two accumulated backward passes
        np.testing.assert_allclose(b.grad().numpy(), a.grad().numpy(), rtol=1e-4, atol=1e-6)
