"""Hypothesis drives random sequences of public API calls (tests/fuzz_api.py draws them).

- Valid and invalid calls (bad values, tags, dtypes, indices, NaN/inf, deinit'ed
  tensors, closed and mixed contexts): only documented exceptions escape, and
  the interpreter survives (a crash would end the run).
- Valid programs: ``fucina.compile`` of the program equals running it eagerly,
  errors included (the same exception class), on the inputs it was traced with,
  on new shapes, after a retrace, and with inputs from another or a closed
  context or deinit'ed.

CI runs the derandomized profile (a fixed few thousand examples); FUCINA_FUZZ=long
runs ``FUCINA_FUZZ_SCALE`` times more, randomized.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from fuzz_api import (
    Call,
    Gen,
    InputSpec,
    MissingResult,
    assert_same_tensors,
    build_input,
    check_documented,
    compact,
    compiled_program,
    draw_call,
    draw_constructor,
    fuzz_settings,
    hypothesis_ints,
    operator_call,
    outcome,
    replay,
)
from hypothesis import given
from hypothesis import strategies as st

import fucina as F


def _check_result(call: Call, res: object) -> None:
    """A returned tensor is usable: its class, shape and values agree."""
    for t in res if isinstance(res, list) else [res]:
        if not isinstance(t, F.Tensor):
            continue
        assert len(t.shape) == max(t.tag_count, 1), call
        if t.dtype.is_block:
            continue
        arr = t.numpy()
        assert arr.shape == (t.shape if t.tag_count else (1,)), call
        assert arr.dtype == t.dtype.storage, call


def _library_still_works(ctx: F.ExecContext) -> None:
    x = F.Tensor("z").from_slice(ctx, (3,), [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(x.add_scalar(1.0).sum("z").numpy(), [9.0])


@fuzz_settings(2000)
@given(st.data())
def test_random_calls_raise_only_documented_errors(data):
    random_calls(hypothesis_ints(data))


def random_calls(ints: Callable[[int, int], int]) -> None:
    """A random sequence of valid and invalid calls (see the module docstring)."""
    ctxs = [F.ExecContext(), F.ExecContext()]
    g = Gen(ints, ctxs, invalid=0.35, host=True)
    for _ in range(g.int(1, 10)):
        what = g.int(0, 19)
        if what == 0:  # lifetime events: a tensor deinit'ed, the second context closed
            live = g.pool()
            if live and g.chance(0.7):
                g.value(g.pick(live)).deinit()
            else:
                ctxs[1].deinit()
            continue
        if what <= 3:
            call, status, res = draw_constructor(g, valid=g.chance(0.6))
        else:
            call, status, res = draw_call(g)
        if status == "err":
            check_documented(res, repr(call), operator_call(call))
        else:
            _check_result(call, res)
            g.accept(call, res)
    _library_still_works(ctxs[0])


def _valid_program(g: Gen, steps: int, keep_error: bool) -> tuple[list[Call], str]:
    """Calls that ran eagerly without error; with ``keep_error`` the first failing call
    stays as the last one. Returns the calls and "ok"/"err"."""
    for _ in range(steps):
        if g.chance(0.1):
            call, status, res = draw_constructor(g, valid=True, deterministic=True)
        else:
            call, status, res = draw_call(g)
        if status == "ok":
            g.accept(call, res)
        else:
            check_documented(res, repr(call), operator_call(call))
            if keep_error:
                g.calls.append(call)
                return g.calls, "err"
    return g.calls, "ok"


def _same_outcome(calls: list[Call], ins: list, fast: object, ctxs: list, what: str) -> None:
    """Eager replay and the compiled function agree: equal results or the same error."""
    e_status, e_res = outcome(lambda: replay(calls, ins, ctxs))
    c_status, c_res = outcome(lambda: fast(*ins))  # type: ignore[operator]
    ops = any(operator_call(c) for c in calls)
    what = f"{what} {calls}"
    if isinstance(e_res, MissingResult):  # the program does not apply to these shapes
        assert isinstance(c_res, MissingResult), f"{what}: compiled gave {c_res!r}"
        return
    if e_status == "err":
        check_documented(e_res, f"{what} eager", ops)
    if c_status == "err":
        check_documented(c_res, f"{what} compiled", ops)
    assert e_status == c_status, (
        f"{what}: eager {e_status} {e_res!r} but compiled {c_status} {c_res!r}\n{calls}")
    if e_status == "err":
        assert type(e_res) is type(c_res), (
            f"{what}: eager raised {type(e_res).__name__}: {e_res}, compiled "
            f"{type(c_res).__name__}: {c_res}\n{calls}")
    else:
        assert_same_tensors(e_res, c_res, f"{what}\n{calls}")


def _new_shape_inputs(g: Gen, specs: list[InputSpec], ctxs: list) -> list:
    sizes = {t: g.int(1, 4) for t in g.sizes}
    out = []
    for s in specs:
        shape = tuple(sizes[t] for t in s.tags)
        out.append(build_input(dataclasses.replace(s, shape=shape, seed=s.seed + 1), ctxs))
    return out


@fuzz_settings(250)
@given(st.data())
def test_compiled_program_equals_eager(data):
    compiled_equals_eager(hypothesis_ints(data))


def compiled_equals_eager(ints: Callable[[int, int], int]) -> None:
    """A valid program, compiled, on its inputs, again, and on new shapes."""
    ctxs = [F.ExecContext(), F.ExecContext()]
    g = Gen(ints, ctxs)
    calls, _ = _valid_program(g, g.int(1, 5), keep_error=g.chance(0.3))
    calls, ins, specs = compact(calls, g.ins, g.specs)
    fast = compiled_program(calls, ctxs)
    _same_outcome(calls, ins, fast, ctxs, "traced inputs")
    _same_outcome(calls, ins, fast, ctxs, "cached call")
    if g.chance(0.6):  # the same function on new shapes: a retrace, never a stale program
        other = _new_shape_inputs(g, specs, ctxs)
        _same_outcome(calls, other, fast, ctxs, "new shapes")
        _same_outcome(calls, ins, fast, ctxs, "first shapes again")


@fuzz_settings(120)
@given(st.data())
def test_compiled_gradients_equal_eager(data):
    compiled_gradients_equal(hypothesis_ints(data))


def _loss(outs: tuple[Any, ...]) -> Any:
    """A scalar over every result that requires grad (each weighted differently), or None."""
    loss = None
    for k, o in enumerate(outs):
        if not o.requires_grad:
            continue
        term = (o if o.dtype is F.f32 else o.to("f32")).sum_all().scale(0.5 + k)
        loss = term if loss is None else loss + term
    return loss


def compiled_gradients_equal(ints: Callable[[int, int], int]) -> None:
    """A valid program over variables, its results summed into a loss and run backward:
    eagerly, and as one compiled program (forward and backward), give the same gradients
    (or the same error)."""
    ctxs = [F.ExecContext(), F.ExecContext()]
    g = Gen(ints, ctxs)
    calls, _ = _valid_program(g, g.int(1, 5), keep_error=False)
    calls, ins, specs = compact(calls, g.ins, g.specs)
    # Most float inputs become variables (the program was drawn on constants: ops that
    # refuse operands requiring grad must refuse them the same way in both modes).
    specs = [dataclasses.replace(s, variable=True, layout="dense")
             if s.dtype in ("f32", "f16", "bf16") and g.chance(0.7) else s for s in specs]
    if not any(s.variable for s in specs):
        return

    def step(*xs: Any) -> Any:
        loss = _loss(replay(calls, list(xs), ctxs))
        if loss is not None:
            loss.backward()
        return loss

    grads = []
    twice = g.chance(0.3)  # a second call accumulates into the same gradients
    for run in (step, F.compile(step)):
        fresh = [build_input(s, ctxs) for s in specs]  # variables without gradients
        status, res = outcome(lambda run=run, fresh=fresh: run(*fresh))
        if status == "ok" and twice:
            status, res = outcome(lambda run=run, fresh=fresh: run(*fresh))
        if status == "err":
            check_documented(res, f"{calls} ({'compiled' if run is not step else 'eager'})",
                             any(operator_call(c) for c in calls))
        grads.append((status, res, [x.grad() if s.variable else None
                                    for x, s in zip(fresh, specs)]))
    (e_status, e_res, e_grads), (c_status, c_res, c_grads) = grads
    what = f"gradients of {calls}"
    assert e_status == c_status, f"{what}: eager {e_status} {e_res!r}, compiled {c_res!r}"
    if e_status == "err":
        assert type(e_res) is type(c_res), f"{what}: eager {e_res!r}, compiled {c_res!r}"
        return
    for k, (eg, cg) in enumerate(zip(e_grads, c_grads)):
        assert (eg is None) == (cg is None), f"{what}: input {k} has a gradient in one mode"
        if eg is not None:
            assert_same_tensors((eg,), (cg,), f"{what}: gradient of input {k}")


@fuzz_settings(120)
@given(st.data())
def test_compiled_program_refuses_what_eager_refuses(data):
    compiled_refuses(hypothesis_ints(data))


def compiled_refuses(ints: Callable[[int, int], int]) -> None:
    """A valid program, compiled, then called with one bad input."""
    ctxs = [F.ExecContext(), F.ExecContext()]
    g = Gen(ints, ctxs)
    calls, _ = _valid_program(g, g.int(1, 4), keep_error=False)
    calls, ins, specs = compact(calls, g.ins, g.specs)
    if not ins:
        return
    fast = compiled_program(calls, ctxs)
    _same_outcome(calls, ins, fast, ctxs, "valid inputs")
    k = g.int(0, len(ins) - 1)
    how = g.pick(("other context", "dtype", "tags", "deinit", "closed context"))
    bad = list(ins)
    if how == "other context":
        bad[k] = build_input(dataclasses.replace(specs[k], ctx=1 - specs[k].ctx), ctxs)
    elif how == "dtype":
        dt = g.pick([d for d in ("f32", "f16", "f64", "i32", "i64", "bool")
                     if d != specs[k].dtype])
        bad[k] = build_input(dataclasses.replace(specs[k], dtype=dt, variable=False,
                                                 index_range=0), ctxs)
    elif how == "tags":
        tags = tuple(reversed(specs[k].tags)) if g.chance(0.5) else specs[k].tags[1:]
        shape = tuple(g.sizes[t] for t in tags)
        bad[k] = build_input(dataclasses.replace(specs[k], tags=tags, shape=shape,
                                                 layout="dense"), ctxs)
    elif how == "deinit":
        bad[k] = build_input(specs[k], ctxs)
        bad[k].deinit()
    else:
        closed = F.ExecContext()
        ctxs.append(closed)
        bad[k] = build_input(dataclasses.replace(specs[k], ctx=len(ctxs) - 1), ctxs)
        closed.deinit()
    _same_outcome(calls, bad, fast, ctxs, how)
    _same_outcome(calls, ins, fast, ctxs, f"valid inputs after {how}")


def test_host_reads_under_compile_raise_a_clear_error(ctx):
    x = F.Tensor("a").from_slice(ctx, (3,), [1.0, -2.0, 3.0])
    m = x > 0.0
    cases = [
        # a traced mask decides which positions exist: the message names the supported form
        (lambda x, m: x.masked_select(m, "k"), "masked_select: the mask's values are read while "
         "tracing .* capture the mask from a closure"),
        (lambda x, m: x.nonzero(), "no data until the compiled program runs"),
        (lambda x, m: x.sum_all().item(), "no data until the compiled program runs"),
    ]
    for fn, message in cases:
        with pytest.raises(F.UnsupportedView, match=message):
            F.compile(fn)(x, m)
