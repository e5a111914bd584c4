"""linear_recurrence and segment_sum against PyTorch: forward, gradients of every operand,
eager and compiled."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import numpy as np  # noqa: E402
from multi_oracle import Arg, check_op  # noqa: E402

RNG = np.random.default_rng(8)


def _torch_scan(b, a, h0, axis):
    """h_t = a_t h_{t-1} + b_t along ``axis`` with torch autograd (a broadcasts)."""
    a = a.expand_as(b)
    bt, at = b.movedim(axis, 0), a.movedim(axis, 0)
    h = torch.zeros_like(bt[0]) if h0 is None else h0
    outs = []
    for t in range(bt.shape[0]):
        h = at[t] * h + bt[t]
        outs.append(h)
    return torch.stack(outs, 0).movedim(0, axis)


def test_linear_recurrence_per_lane_decay():
    b = RNG.standard_normal((7, 3)).astype(np.float32)
    a = RNG.uniform(0.2, 0.95, 3).astype(np.float32)
    check_op(lambda b, a: b.linear_recurrence("t", a),
             lambda b, a: _torch_scan(b, a[None, :], None, 0),
             [Arg(("t", "d"), b), Arg(("d",), a)])


def test_linear_recurrence_full_decay_and_initial_state():
    b = RNG.standard_normal((6, 4)).astype(np.float32)
    a = RNG.uniform(-0.9, 0.9, (6, 4)).astype(np.float32)
    h0 = RNG.standard_normal(4).astype(np.float32)
    check_op(lambda b, a, h: b.linear_recurrence("t", a, initial=h),
             lambda b, a, h: _torch_scan(b, a, h, 0),
             [Arg(("t", "d"), b), Arg(("t", "d"), a), Arg(("d",), h0)])


def test_linear_recurrence_shared_schedule_time_innermost():
    # time is the last axis; the decay is a per-time schedule shared by every lane
    b = RNG.standard_normal((3, 2, 9)).astype(np.float32)
    a = RNG.uniform(0.5, 1.0, 9).astype(np.float32)
    h0 = RNG.standard_normal((2, 3)).astype(np.float32)  # tags (h, b): any order
    check_op(lambda b, a, h: b.linear_recurrence("t", a, initial=h),
             lambda b, a, h: _torch_scan(b, a[None, None, :], h.T, 2),
             [Arg(("b", "h", "t"), b), Arg(("t",), a), Arg(("h", "b"), h0)])


def test_linear_recurrence_time_in_the_middle_with_state_decay():
    b = RNG.standard_normal((2, 5, 3)).astype(np.float32)
    a = RNG.uniform(0.1, 0.9, (2, 3)).astype(np.float32)  # per-state, no time tag
    check_op(lambda b, a: b.linear_recurrence("t", a),
             lambda b, a: _torch_scan(b, a[:, None, :], None, 1),
             [Arg(("h", "t", "d"), b), Arg(("h", "d"), a)])


def test_linear_recurrence_one_step():
    b = RNG.standard_normal((1, 3)).astype(np.float32)
    a = RNG.standard_normal((1, 3)).astype(np.float32)
    h0 = RNG.standard_normal(3).astype(np.float32)
    check_op(lambda b, a, h: b.linear_recurrence("t", a, initial=h),
             lambda b, a, h: _torch_scan(b, a, h, 0),
             [Arg(("t", "d"), b), Arg(("t", "d"), a), Arg(("d",), h0)])


def _torch_segment_sum(x, offsets, axis):
    ids = torch.repeat_interleave(torch.arange(len(offsets) - 1),
                                  torch.tensor(np.diff(offsets)))
    shape = list(x.shape)
    shape[axis] = len(offsets) - 1
    return torch.zeros(shape).index_add(axis, ids, x)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_segment_sum(axis):
    shape = [3, 4, 5]
    shape[axis] = 8
    x = RNG.standard_normal(shape).astype(np.float32)
    offsets = [0, 3, 3, 4, 8]  # an empty segment in the middle
    tag = ("a", "b", "c")[axis]
    check_op(lambda x: x.segment_sum(tag, offsets),
             lambda x: _torch_segment_sum(x, offsets, axis),
             [Arg(("a", "b", "c"), x)])
