"""The benchmark harness: ``python -m fucina.bench`` (``--json`` for machines).

Runs a standard suite side by side in one process (fucina eager, fucina
compiled, numpy and, when importable, torch eager) and prints a header (CPU,
ISA, threading layer, BLAS core, versions), each case's best time with the
min/median/max over repeats, and the ratios against fucina compiled. Progress
goes to stderr as cases run. Every run is saved as JSON (by default under
``bench-results/<timestamp>.json``; ``--out`` picks the file) with, when
matplotlib is installed (the ``plot`` extra), a PNG of the ratios beside it;
``--compare A B`` compares two saved runs (two ``--paired-load`` runs also by
their loaded/quiet ratios); ``--busy N`` runs the suite under
load, with N helper processes spinning on a core each (recorded as
``busy_procs``); ``--paired-load N`` times every repeat twice, quiet and with N
helpers spinning, and reports each row's loaded/quiet ratio (recorded as
``paired_load``); ``--isa avx2`` reruns it with AVX-512 turned off for fucina's
kernels, torch and OpenBLAS (the AVX2 path on an AVX-512 machine; recorded as
``isa_level``, and the header's ``kernels`` line gives the compile target's vector
width). Times are the minimum over repeats of the mean over a batch
of calls. Each row but the model rows takes its repeats in alternation, one batch
of each implementation in turn (:func:`side_by_side`), so a slow spell of a shared
host falls on every side of a ratio; still, compare ratios from one run rather than
absolute times across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import fucina as F

from .bench_busy import busy_processes, load_compare, load_ratios, load_table, paired_load
from .bench_dispatch import dispatch_cases
from .kernels import isa
from .kernels import vecmath as vm

try:  # torch is an optional comparison point
    import torch
except ImportError:  # pragma: no cover - depends on the machine
    torch = None  # type: ignore[assignment]


IMPLS = ("eager", "compiled", "numpy", "torch")
#: Where runs are saved unless ``--out`` says otherwise (kept out of git).
RESULTS_DIR = Path("bench-results")
#: Progress lines go to stderr while this is set (the command line sets it).
PROGRESS: list[bool] = [False]
#: While set (``--paired-load``), best_time also times each repeat under this load
#: (a :class:`fucina.bench_busy.PausedLoad`).
LOAD: list[Any] = [None]


@dataclass
class Case:
    """One benchmark row: seconds per call for each implementation (None: not run)."""

    name: str
    eager: float | None = None
    compiled: float | None = None
    numpy: float | None = None
    torch: float | None = None
    notes: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Every row names its Case before timing it: the natural progress point.
        if PROGRESS[0]:
            print(f"[bench] {time.strftime('%H:%M:%S')} {self.name} ...", file=sys.stderr,
                  flush=True)

    def spread(self) -> dict[str, dict[str, float]]:
        """min/median/max seconds per call for each implementation timed by best_time
        (and ``busy_min``/``busy_median``/``busy_max`` for the paired loaded repeats)."""
        out = {}
        for k in IMPLS:
            if isinstance(v := getattr(self, k), Timing):
                out[k] = {"min": float(v), "median": v.median, "max": v.max}
                if v.busy is not None:
                    out[k].update(busy_min=float(v.busy), busy_median=v.busy.median,
                                  busy_max=v.busy.max)
        return out


class Timing(float):
    """Seconds per call (the minimum over repeats) that also carries the median and max,
    and with ``--paired-load`` the same under load (``busy``, a Timing)."""

    median: float
    max: float
    busy: Timing | None = None

    def __new__(cls, samples: list[float], busy: Timing | None = None) -> Timing:
        t = super().__new__(cls, min(samples))
        t.median = statistics.median(samples)
        t.max = max(samples)
        t.busy = busy
        return t

    def __reduce__(self) -> tuple[Any, ...]:  # copies (dataclasses.asdict) keep the spread
        return (_timing, (float(self), self.median, self.max, self.busy))


def _timing(lo: float, med: float, hi: float, busy: Timing | None = None) -> Timing:
    return Timing([lo, med, hi], busy)


def best_time(fn: Callable[[], Any], min_time: float = 0.2, repeats: int = 5) -> Timing:
    """Minimum over ``repeats`` of the mean time per call (seconds), with the median
    and maximum of the repeats attached (:class:`Timing`).

    Under ``--paired-load`` (:data:`LOAD` set) each quiet repeat is followed by one
    with the helper processes spinning, attached as the Timing's ``busy``.
    """
    return paired_samples(_sampler(fn, min_time / repeats), repeats)


def _sampler(fn: Callable[[], Any], batch_time: float) -> Callable[[], float]:
    """A function that times one batch of calls of ``fn`` (seconds per call), the batch
    grown until it takes ``batch_time`` (up to 2**20 calls); ``fn`` runs once first."""
    fn()
    t = timeit.Timer(fn)
    n, elapsed = 1, 0.0
    while True:
        elapsed = t.timeit(n)
        if elapsed >= batch_time or n >= 1 << 20:
            break
        n *= 2 if elapsed == 0 else max(2, int(batch_time / max(elapsed, 1e-9)))
    return lambda: t.timeit(n) / n


def side_by_side(case: Case, min_time: float = 0.2, repeats: int = 5, /,
                 **impls: Callable[[], Any] | None) -> dict[str, Timing]:
    """Time ``case``'s implementations (keywords from :data:`IMPLS`; None skips one) in
    alternation and set each as :func:`best_time` would: every repeat takes one batch of
    each in turn, so a slow spell of a shared host (the same kernel moved 2x between
    seconds on these machines) falls on every side of a ratio, not on whichever ran
    then. Under ``--paired-load`` each quiet batch is followed by a loaded one. Returns
    the Timings set, by implementation."""
    unknown = sorted(set(impls) - set(IMPLS))
    if unknown:
        raise ValueError(f"side_by_side: unknown implementation(s) {unknown}; "
                         f"expected some of {list(IMPLS)}")
    got = _alternate({k: _sampler(fn, min_time / repeats) for k, fn in impls.items()
                      if fn is not None}, repeats)
    for k, t in got.items():
        setattr(case, k, t)
    return got


def paired_samples(sample: Callable[[], float], repeats: int) -> Timing:
    """``repeats`` samples (seconds per call) as a :class:`Timing`; under
    ``--paired-load`` (:data:`LOAD` set) each is followed by one taken with the helper
    processes spinning, attached as the Timing's ``busy``."""
    return _alternate({"": sample}, repeats)[""]


def _alternate(samplers: dict[str, Callable[[], float]], repeats: int) -> dict[str, Timing]:
    """``repeats`` rounds of one sample of each sampler in turn, as Timings by name; under
    ``--paired-load`` each sample is followed by one taken under load (the ``busy``)."""
    load = LOAD[0]
    quiet: dict[str, list[float]] = {k: [] for k in samplers}
    busy: dict[str, list[float]] = {k: [] for k in samplers}
    for _ in range(repeats):
        for k, sample in samplers.items():
            quiet[k].append(sample())
            if load is not None:
                with load.running():
                    busy[k].append(sample())
    return {k: Timing(quiet[k], Timing(busy[k]) if busy[k] else None) for k in samplers}


def _chain_case(n: int, quick: bool) -> Case:
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal(n).astype(np.float32)
    w0 = rng.standard_normal(n).astype(np.float32)
    ctx = F.ExecContext()
    T = F.Tensor("i")
    x = T.from_slice(ctx, (n,), x0)
    w = T.from_slice(ctx, (n,), w0)

    def chain(x: Any, w: Any) -> Any:
        return (x.mul(w).add_scalar(1.0).tanh().mul(x)).sigmoid()

    fast = F.compile(chain)
    c = Case(f"sigmoid(tanh(x*w+1)*x) [{n}] f32")
    mt = 0.05 if quick else 0.3

    def np_chain() -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-(np.tanh(x0 * w0 + np.float32(1.0)) * x0)))

    torch_chain = None
    if torch is not None:
        tx, tw = torch.from_numpy(x0), torch.from_numpy(w0)

        def torch_chain() -> Any:
            return torch.sigmoid(torch.tanh(tx * tw + 1) * tx)

    side_by_side(c, mt, eager=lambda: chain(x, w), compiled=lambda: fast(x, w),
                 numpy=np_chain, torch=torch_chain)
    c.notes["kernels"] = len(fast.kernels(x, w))
    err = float(np.max(np.abs(fast(x, w).numpy() - np_chain())))
    c.notes["max_abs_err_vs_numpy"] = err
    return c


def _five_op_case(quick: bool) -> Case:
    ctx = F.ExecContext()
    x = F.Tensor("r", "c").randn(ctx, (512, 512), 1)
    b = F.Tensor("c").randn(ctx, (512,), 2)

    def five(x: Any, b: Any) -> Any:
        return x.add(b).scale(0.5).maximum(x).sub(b).mul(x)

    fast = F.compile(five)
    c = Case("5-op chain with broadcast [512,512]")
    mt = 0.05 if quick else 0.2
    x0, b0 = x.numpy(), b.numpy()
    side_by_side(c, mt, eager=lambda: five(x, b), compiled=lambda: fast(x, b),
                 numpy=lambda: (np.maximum((x0 + b0) * np.float32(0.5), x0) - b0) * x0)
    c.notes["kernels"] = len(fast.kernels(x, b))
    return c


def _softmax_case(rows: int, cols: int, quick: bool) -> Case:
    ctx = F.ExecContext()
    x = F.Tensor("row", "col").randn(ctx, (rows, cols), 3)

    def softmax(x: Any) -> Any:
        return x.softmax("col")

    fast = F.compile(softmax)
    c = Case(f"row softmax [{rows},{cols}] f32")
    mt = 0.05 if quick else 0.3
    x0 = x.numpy()

    def np_softmax() -> np.ndarray:
        e = np.exp(x0 - x0.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    tx = torch.from_numpy(x0) if torch is not None else None
    side_by_side(c, mt, eager=lambda: softmax(x), compiled=lambda: fast(x), numpy=np_softmax,
                 torch=(lambda: torch.softmax(tx, dim=1)) if tx is not None else None)
    c.notes["kernels"] = len(fast.kernels(x))
    c.notes["max_abs_err_vs_numpy"] = float(np.max(np.abs(fast(x).numpy() - np_softmax())))
    return c


def _gemm_trans_b_case(n: int, quick: bool) -> Case:
    ctx = F.ExecContext()
    a = F.Tensor("m", "k").randn(ctx, (n, n), 4)
    w = F.Tensor("n", "k").randn(ctx, (n, n), 5)  # weight stored [n, k]: a trans-B GEMM
    fast = F.compile(lambda a, w: a.dot(w, "k"))
    c = Case(f"dot [{n},{n}] x weight[n,k] (trans-B)")
    mt = 0.1 if quick else 0.5
    a0, w0 = a.numpy(), w.numpy()
    tt = (torch.from_numpy(a0), torch.from_numpy(w0)) if torch is not None else None
    side_by_side(c, mt, eager=lambda: a.dot(w, "k"), compiled=lambda: fast(a, w),
                 numpy=lambda: a0 @ w0.T,
                 torch=(lambda: tt[0] @ tt[1].T) if tt is not None else None)
    c.notes["gemm"] = fast.ir(a, w).split("(gemm ")[1].split(")")[0]
    return c


def _attention_case(quick: bool) -> Case:
    ctx = F.ExecContext()
    b, h, s, d = (2, 4, 128, 64) if quick else (8, 8, 256, 64)
    q = F.Tensor("b", "h", "q", "d").randn(ctx, (b, h, s, d), 6)
    k = F.Tensor("b", "h", "k", "d").randn(ctx, (b, h, s, d), 7)
    fast = F.compile(lambda q, k: q.dot(k, "d"))
    c = Case(f"attention scores [{b},{h},{s},{d}] . k over d")
    mt = 0.1 if quick else 0.5
    q0 = q.numpy()
    kt = np.ascontiguousarray(np.swapaxes(k.numpy(), 2, 3))  # numpy gets it pre-transposed
    tt = (torch.from_numpy(q0), torch.from_numpy(kt)) if torch is not None else None
    side_by_side(c, mt, eager=lambda: q.dot(k, "d"), compiled=lambda: fast(q, k),
                 numpy=lambda: np.matmul(q0, kt),
                 torch=(lambda: torch.matmul(*tt)) if tt is not None else None)
    c.notes["gemm"] = fast.ir(q, k).split("(gemm ")[1].split(")")[0]
    return c


def _linear_gelu_case(quick: bool) -> Case:
    ctx = F.ExecContext()
    rows, din, dout = (512, 128, 256) if quick else (4096, 256, 1024)
    x = F.Tensor("t", "in").randn(ctx, (rows, din), 8)
    w = F.Tensor("out", "in").randn(ctx, (dout, din), 9)
    bias = F.Tensor("out").randn(ctx, (dout,), 10)

    def linear(x: Any, w: Any, bias: Any) -> Any:
        return x.dot(w, "in").add(bias).gelu()

    fast = F.compile(linear)
    c = Case(f"linear+bias+gelu [{rows},{din}]x[{dout},{din}]")
    mt = 0.1 if quick else 0.5
    x0, w0, b0 = x.numpy(), w.numpy(), bias.numpy()
    k0, k1 = np.float32(0.7978845608028654), np.float32(0.044715)

    def np_linear() -> np.ndarray:
        y = x0 @ w0.T + b0
        return np.float32(0.5) * y * (np.float32(1) + np.tanh(k0 * (y + k1 * y * y * y)))

    torch_linear = None
    if torch is not None:
        tx, tw, tb = torch.from_numpy(x0), torch.from_numpy(w0), torch.from_numpy(b0)

        def torch_linear() -> Any:
            return torch.nn.functional.gelu(torch.addmm(tb, tx, tw.T), approximate="tanh")

    side_by_side(c, mt, eager=lambda: linear(x, w, bias), compiled=lambda: fast(x, w, bias),
                 numpy=np_linear, torch=torch_linear)
    c.notes["kernels"] = len(fast.kernels(x, w, bias))
    # Relative to the largest output: fucina's own GEMM (AVX-512 hosts) sums in another
    # order than OpenBLAS, both within a few float32 ulps of the largest partial sum.
    want = np_linear()
    c.notes["max_rel_err_vs_numpy"] = float(np.max(np.abs(fast(x, w, bias).numpy() - want))
                                            / np.max(np.abs(want)))
    return c


def _norm_case(kind: str, rows: int, cols: int, quick: bool) -> Case:
    """layer_norm / rms_norm over the last axis: one compiled row kernel vs torch eager."""
    ctx = F.ExecContext()
    x = F.Tensor("t", "d").randn(ctx, (rows, cols), 11)
    eps = 1e-5

    def norm(x: Any) -> Any:
        return x.layer_norm("d", eps) if kind == "layer_norm" else x.rms_norm("d", eps)

    fast = F.compile(norm)
    c = Case(f"{kind} [{rows},{cols}] f32")
    mt = 0.05 if quick else 0.3
    x0 = x.numpy()

    def np_norm() -> np.ndarray:
        if kind == "layer_norm":
            d = x0 - x0.mean(axis=1, keepdims=True)
            return d / np.sqrt((d * d).mean(axis=1, keepdims=True) + np.float32(eps))
        return x0 / np.sqrt((x0 * x0).mean(axis=1, keepdims=True) + np.float32(eps))

    torch_norm = None
    if torch is not None:
        tx = torch.from_numpy(x0)
        tnorm = torch.nn.functional.layer_norm if kind == "layer_norm" else \
            torch.nn.functional.rms_norm

        def torch_norm() -> Any:
            return tnorm(tx, (cols,), eps=eps)

    side_by_side(c, mt, eager=lambda: norm(x), compiled=lambda: fast(x), numpy=np_norm,
                 torch=torch_norm)
    c.notes["kernels"] = len(fast.kernels(x))
    c.notes["max_abs_err_vs_numpy"] = float(np.max(np.abs(fast(x).numpy() - np_norm())))
    return c


def _conv2d_case(quick: bool) -> Case:
    """conv2d 3x3 64->64, channel-last by tags, vs torch in its faster layout."""
    ctx = F.ExecContext()
    b, hw, ch = (2, 28, 64) if quick else (8, 56, 64)
    x = F.Tensor("b", "h", "w", "c").randn(ctx, (b, hw, hw, ch), 11)
    w = F.Tensor("oc", "kh", "kw", "ic").randn(ctx, (ch, 3, 3, ch), 12).scale(0.05)
    bias = F.Tensor("oc").randn(ctx, (ch,), 13)

    def conv(x: Any, w: Any, bias: Any) -> Any:
        return x.conv2d(w, bias, 1, 1, 1, ("oh", "ow", "oc"))

    fast = F.compile(conv)
    c = Case(f"conv2d 3x3 [{b},{hw},{hw},{ch}]->{ch} NHWC")
    mt = 0.2 if quick else 1.0
    torch_conv = None
    if torch is not None:
        tx = torch.from_numpy(x.numpy()).permute(0, 3, 1, 2)  # channels_last memory
        tw = torch.from_numpy(w.numpy()).permute(0, 3, 1, 2)
        tb = torch.from_numpy(bias.numpy())
        nchw, wn = tx.contiguous(), tw.contiguous()

        def conv_in(inp: Any, ker: Any) -> Callable[[], Any]:
            def run() -> Any:
                with torch.no_grad():
                    return torch.nn.functional.conv2d(inp, ker, tb, 1, 1)
            return run

        # torch's faster layout, picked by a short probe; the row then times that one
        layouts = {"channels_last": conv_in(tx, tw), "NCHW": conv_in(nchw, wn)}
        probe = {k: best_time(fn, mt / 4, 3) for k, fn in layouts.items()}
        layout = min(probe, key=lambda k: probe[k])
        c.notes["torch_layout"] = layout
        torch_conv = layouts[layout]
        with torch.no_grad():
            want = torch.nn.functional.conv2d(tx, tw, tb, 1, 1).permute(0, 2, 3, 1).numpy()

    side_by_side(c, mt, eager=lambda: conv(x, w, bias), compiled=lambda: fast(x, w, bias),
                 torch=torch_conv)
    if torch is not None:
        c.notes["max_abs_err_vs_torch"] = float(np.max(np.abs(fast(x, w, bias).numpy()
                                                              - want)))
    return c


def _cross_entropy_case(quick: bool) -> Case:
    """cross_entropy forward + backward over a vocabulary-sized class axis."""
    rows, classes = (512, 4000) if quick else (4096, 32000)
    rng = np.random.default_rng(11)
    x0 = rng.standard_normal((rows, classes), dtype=np.float32)
    lab0 = rng.integers(0, classes, rows)
    ctx = F.ExecContext()
    x = F.Tensor("t", "vocab").variable_from_slice(ctx, (rows, classes), x0)
    lab = F.Tensor("t", dtype="i64").from_slice(ctx, (rows,), lab0)

    def step(x: Any, lab: Any) -> Any:
        loss = x.cross_entropy("vocab", lab)
        loss.backward()
        return loss

    fast = F.compile(step)

    def run(fn: Callable[[Any, Any], Any]) -> Any:
        x.zero_grad()  # every call produces a fresh gradient, as torch's below
        return fn(x, lab)

    c = Case(f"cross_entropy fwd+bwd [{rows},{classes}]")
    mt = 0.3 if quick else 2.0
    torch_step = None
    if torch is not None:
        tx, tl = torch.from_numpy(x0).clone().requires_grad_(True), torch.from_numpy(lab0)

        def torch_step() -> None:
            tx.grad = None
            torch.nn.functional.cross_entropy(tx, tl).backward()

    side_by_side(c, mt, 3, eager=lambda: run(step), compiled=lambda: run(fast),
                 torch=torch_step)
    loss = run(fast).item()
    g = x.grad()
    assert g is not None  # the compiled step delivered the gradient
    grad = g.numpy()
    if torch_step is not None:
        torch_step()
        assert tx.grad is not None
        c.notes["max_abs_grad_err_vs_torch"] = float(np.max(np.abs(grad - tx.grad.numpy())))
        c.notes["loss_err_vs_torch"] = abs(
            loss - float(torch.nn.functional.cross_entropy(tx.detach(), tl)))
    c.notes["kernels"] = len(fast.kernels(x, lab))
    return c


def _tiny_case(quick: bool) -> Case:
    ctx = F.ExecContext()
    a = F.Tensor("d").from_slice(ctx, (8,), np.arange(8))
    b = F.Tensor("d").from_slice(ctx, (8,), np.arange(8))
    c = Case("tiny eager add [8]")
    mt = 0.05 if quick else 0.3
    a0, b0 = a.numpy(), b.numpy()
    tt = (torch.from_numpy(a0), torch.from_numpy(b0)) if torch is not None else None
    side_by_side(c, mt, eager=lambda: a.add(b), numpy=lambda: np.add(a0, b0),
                 torch=(lambda: torch.add(*tt)) if tt is not None else None)
    return c


def _flash_attention_cases(quick: bool) -> list[Case]:
    """Causal grouped attention vs torch SDPA: forward, and forward + backward.

    fucina takes the [seq, batch * heads, d] layout (batch folded into the heads by
    the head map), torch its [batch, heads, seq, d]; both from the same values.
    """
    b, h, s, d = (1, 4, 128, 64) if quick else (4, 8, 512, 64)
    heads = b * h
    rng = np.random.default_rng(11)
    q0, k0, v0, w0 = (rng.standard_normal((s, heads, d)).astype(np.float32) for _ in range(4))
    ctx = F.ExecContext()
    Q, KV = F.Tensor("seq", "head", "d"), F.Tensor("seq", "kv_head", "d")
    kvmap = list(range(heads))
    scale = 1.0 / float(np.sqrt(d))
    q, k, v = Q.from_slice(ctx, q0.shape, q0), KV.from_slice(ctx, k0.shape, k0), \
        KV.from_slice(ctx, v0.shape, v0)

    def attend(q: Any, k: Any, v: Any) -> Any:
        return q.grouped_attention(k, v, kvmap, "o", scale)

    mt = 0.1 if quick else 0.5
    fwd = Case(f"causal attention fwd b={b} h={h} q=k={s} d={d}")
    fast = F.compile(attend)
    qv, kv_, vv = (Q.variable_from_slice(ctx, q0.shape, q0), KV.variable_from_slice(
        ctx, k0.shape, k0), KV.variable_from_slice(ctx, v0.shape, v0))
    w = F.Tensor("seq", "o").from_slice(ctx, (s, heads * d), w0.reshape(s, heads * d))

    def train(q: Any, k: Any, v: Any, w: Any) -> Any:
        loss = attend(q, k, v).mul(w).sum_all()
        loss.backward()
        return loss

    both = Case(f"causal attention fwd+bwd b={b} h={h} q=k={s} d={d}")
    fast_train = F.compile(train)
    torch_fwd = torch_train = None
    if torch is not None:
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def bhsd(a: np.ndarray) -> Any:
            return torch.from_numpy(a).view(s, b, h, d).permute(1, 2, 0, 3).contiguous()

        tq, tk, tv, tw = (bhsd(a) for a in (q0, k0, v0, w0))

        def torch_fwd() -> Any:
            return sdpa(tq, tk, tv, is_causal=True)

        want = torch_fwd().permute(2, 0, 1, 3).reshape(s, -1).numpy()
        fwd.notes["max_abs_err_vs_torch"] = float(np.max(np.abs(fast(q, k, v).numpy() - want)))
        gq, gk, gv = (t.clone().requires_grad_() for t in (tq, tk, tv))

        def torch_train() -> None:
            (sdpa(gq, gk, gv, is_causal=True) * tw).sum().backward()

    side_by_side(fwd, mt, eager=lambda: attend(q, k, v), compiled=lambda: fast(q, k, v),
                 torch=torch_fwd)
    side_by_side(both, mt, eager=lambda: train(qv, kv_, vv, w),
                 compiled=lambda: fast_train(qv, kv_, vv, w), torch=torch_train)
    return [fwd, both]


def _rope_case(quick: bool) -> Case:
    """RoPE (half mode, prepared table) vs torch's rotate_half formulation."""
    b, s, h, d = (2, 128, 4, 64) if quick else (4, 512, 8, 64)
    ctx = F.ExecContext()
    x = F.Tensor("b", "seq", "h", "d").randn(ctx, (b, s, h, d), 12)
    table = ctx.prepare_rope_table(np.arange(s), d, 10000.0)

    def rope(x: Any) -> Any:
        return x.rope("seq", "d", table, "half")

    fast = F.compile(rope)
    c = Case(f"rope half [{b},{s},{h},{d}] (table)")
    mt = 0.05 if quick else 0.3
    torch_rope = None
    if torch is not None:
        tx = torch.from_numpy(x.numpy())
        cos = torch.from_numpy(np.concatenate([table.cos, table.cos], -1))[None, :, None, :]
        sin = torch.from_numpy(np.concatenate([table.sin, table.sin], -1))[None, :, None, :]

        def torch_rope() -> Any:
            x1, x2 = tx[..., :d // 2], tx[..., d // 2:]
            return tx * cos + torch.cat((-x2, x1), dim=-1) * sin

    side_by_side(c, mt, eager=lambda: rope(x), compiled=lambda: fast(x), torch=torch_rope)
    if torch_rope is not None:
        c.notes["max_abs_err_vs_torch"] = float(np.max(np.abs(fast(x).numpy()
                                                              - torch_rope().numpy())))
    c.notes["kernels"] = len(fast.kernels(x))
    return c


_ATTN_MEMORY = """
import resource, sys
import numpy as np
impl, b, h, s, kv, d = sys.argv[1], *map(int, sys.argv[2:])
rng = np.random.default_rng(0)
q0 = rng.standard_normal((s, b * h, d)).astype(np.float32)
k0 = rng.standard_normal((kv, b * h, d)).astype(np.float32)
v0 = rng.standard_normal((kv, b * h, d)).astype(np.float32)

def vm(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

if impl == "fucina":
    import fucina as F
    ctx = F.ExecContext()
    Q, KV = F.Tensor("seq", "head", "d"), F.Tensor("seq", "kv_head", "d")
    args = [(Q.from_slice(ctx, a.shape, a) if n == 0 else KV.from_slice(ctx, a.shape, a))
            for n, a in enumerate((q0, k0, v0))]
    small = [Q.from_slice(ctx, (4, b * h, d), q0[:4]), KV.from_slice(ctx, (8, b * h, d), k0[:8]),
             KV.from_slice(ctx, (8, b * h, d), v0[:8])]
    fn = lambda q, k, v: q.grouped_attention(k, v, list(range(b * h)), "o", 0.125,
                                             mask="bidirectional")
else:
    import torch
    torch.set_num_threads(2)
    def bhsd(a):
        return torch.from_numpy(a).view(a.shape[0], b, h, d).permute(1, 2, 0, 3).contiguous()
    args = [bhsd(a) for a in (q0, k0, v0)]
    small = [bhsd(q0[:4]), bhsd(k0[:8]), bhsd(v0[:8])]
    fn = torch.nn.functional.scaled_dot_product_attention
del q0, k0, v0
fn(*small)  # kernels compiled / loaded before the measurement
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak resident set to the current one
before = vm("VmRSS")
out = fn(*args)
print(vm("VmHWM") - before)
"""


def _attention_memory_case(quick: bool) -> Case:
    """Peak resident memory one attention forward adds (bidirectional, long kv), per
    implementation, each in a fresh process (Linux: /proc peak-RSS reset)."""
    b, h, s, kv, d = (1, 4, 64, 1024, 64) if quick else (4, 8, 512, 4096, 64)
    c = Case(f"attention fwd peak memory b={b} h={h} q={s} k={kv} d={d}")
    if not os.path.exists("/proc/self/clear_refs"):
        c.notes["skipped"] = "needs Linux /proc"
        return c
    impls = ["fucina"] + (["torch"] if torch is not None else [])
    for impl in impls:
        out = subprocess.run([sys.executable, "-c", _ATTN_MEMORY, impl, str(b), str(h), str(s),
                              str(kv), str(d)], check=True, capture_output=True, text=True)
        c.notes[f"{impl}_peak_MiB"] = int(out.stdout.strip().splitlines()[-1]) / 2**20
    c.notes["output_MiB"] = b * h * s * d * 4 / 2**20
    c.notes["scores_would_be_MiB"] = b * h * s * kv * 4 / 2**20
    return c


_FIRST_RESULT = """
import time
import numpy as np
import fucina as F
ctx = F.ExecContext()
x = F.Tensor("r", "c").randn(ctx, (256, 256), 1)
t0 = time.perf_counter()
f = F.compile(lambda x: (x.mul(x).add_scalar(1.0).tanh().mul(x)).sigmoid())
e = F.compile(lambda x: x.sub(x.max("c")).exp())
f(x).numpy(); e(x).numpy()
print(time.perf_counter() - t0)
"""


def _new_process_cold_warm(script: str) -> tuple[float, float]:
    """Seconds ``script`` reports (its last stdout line) in a new interpreter: once with an
    empty kernel cache (cold), then the best of two runs over the cache it left (warm)."""
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, FUCINA_CACHE_DIR=d)

        def run() -> float:
            out = subprocess.run([sys.executable, "-c", script], env=env, check=True,
                                 capture_output=True, text=True)
            return float(out.stdout.strip().splitlines()[-1])

        cold = run()
        warm = min(run() for _ in range(2))
    return cold, warm


def _cold_warm_case() -> Case:
    """Time from compile() to the first results in a fresh process, empty vs warm cache.

    Both processes pay the same interpreter and import start-up, which is not
    counted; the library's own helper kernels (RNG, vector math) cache in the
    installed package as soon as any process has used them.
    """
    c = Case("first compiled result, new process")
    cold, warm = _new_process_cold_warm(_FIRST_RESULT)
    c.notes["cold_s"] = cold
    c.notes["warm_s"] = warm
    c.notes["cold_over_warm"] = cold / warm
    return c


# -- training steps: forward, backward and an optimizer step --------------------------


def _fucina_mlp(ctx: Any, sizes: tuple[int, ...], act: str, seed: int) -> list[Any]:
    """Variables [w0, b0, w1, b1, ...] of an MLP; layer k maps tag l{k} -> l{k+1}."""
    params = []
    for k in range(len(sizes) - 1):
        W = F.Tensor(f"l{k + 1}", f"l{k}")
        w = W.normal(ctx, (sizes[k + 1], sizes[k]), seed + k, 0.0, 1.0 / sizes[k] ** 0.5)
        params.append(W.variable(ctx, w.as_raw_tensor()))
        params.append(F.Tensor(f"l{k + 1}").variable_from_slice(
            ctx, (sizes[k + 1],), np.zeros(sizes[k + 1], np.float32)))
    return params


def _fucina_loss(params: list[Any], x: Any, y: Any, act: str) -> Any:
    """Mean cross-entropy of the MLP's logits against one-hot ``y``; runs backward."""
    h = x
    layers = len(params) // 2
    for k in range(layers):
        h = h.dot(params[2 * k], f"l{k}").add(params[2 * k + 1])
        if k < layers - 1:
            h = h.tanh() if act == "tanh" else h.relu()
    last = f"l{layers}"
    loss = h.logsumexp(last).sub(h.mul(y).sum(last)).mean("batch")
    loss.backward()
    return loss


def _training_case(name: str, sizes: tuple[int, ...], batch: int, act: str, opt_name: str,
                   lr: float, quick: bool, torch_compile: bool) -> Case:
    """One optimizer step (zero_grad, forward, backward, step) timed four ways.

    fucina "compiled" is the whole step under ``fucina.compile``: one program
    that also updates the parameters and the optimizer state in place.
    """
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    labels = rng.integers(0, sizes[-1], batch)
    y0 = np.eye(sizes[-1], dtype=np.float32)[labels]
    ctx = F.ExecContext()
    X, Y = F.Tensor("batch", "l0"), F.Tensor("batch", f"l{len(sizes) - 1}")
    x, y = X.from_slice(ctx, x0.shape, x0), Y.from_slice(ctx, y0.shape, y0)
    c = Case(name)
    mt = 0.1 if quick else 1.0
    steps: dict[str, Callable[[], Any]] = {}
    for mode in ("eager", "compiled"):
        params = _fucina_mlp(ctx, sizes, act, 1)
        opt = getattr(F.optim, opt_name)(params, lr=lr)

        def train_step(x: Any, y: Any, params: list[Any] = params, opt: Any = opt) -> Any:
            opt.zero_grad()
            loss = _fucina_loss(params, x, y, act)
            opt.step()
            return loss

        fast = F.compile(train_step)
        run: Callable[..., Any] = fast if mode == "compiled" else train_step
        def call(run: Callable[..., Any] = run) -> Any:
            return run(x, y)

        steps[mode] = call
        if mode == "compiled":
            c.notes["kernels"] = len(fast.kernels(x, y))
            text = fast.ir(x, y)
            c.notes["in_place_writes"] = text.count("stored in place by its kernel")
            c.notes["copied_writes"] = text.count("copied after the last step")
    repeats = 3 if quick else 5
    torch_step = None
    if torch is not None:
        tx, tl = torch.from_numpy(x0), torch.from_numpy(labels)
        layers: list[Any] = []
        for k in range(len(sizes) - 1):
            layers.append(torch.nn.Linear(sizes[k], sizes[k + 1]))
            if k < len(sizes) - 2:
                layers.append(torch.nn.Tanh() if act == "tanh" else torch.nn.ReLU())
        model = torch.nn.Sequential(*layers)
        topt = getattr(torch.optim, opt_name)(model.parameters(), lr=lr)

        def torch_step(net: Any) -> Callable[[], Any]:
            def step() -> Any:
                topt.zero_grad()
                loss = torch.nn.functional.cross_entropy(net(tx), tl)
                loss.backward()
                topt.step()
                return loss
            return step

        steps["torch"] = torch_step(model)
    side_by_side(c, mt, repeats, **steps)
    # torch.compile is a note, timed after the row (its first call compiles for seconds)
    if torch_step is not None and torch_compile:
        try:
            t0 = time.perf_counter()
            cmodel = torch.compile(model)
            torch_step(cmodel)()
            c.notes["torch.compile_first_step_s"] = time.perf_counter() - t0
            c.notes["torch.compile"] = best_time(torch_step(cmodel), mt)
        except Exception as e:  # torch.compile needs a working C++ toolchain
            c.notes["torch.compile"] = f"unavailable ({type(e).__name__})"
    return c


_FIRST_STEP = """
import time
import numpy as np
import fucina as F
from fucina.bench import _fucina_loss, _fucina_mlp
ctx = F.ExecContext()
rng = np.random.default_rng(0)
x = F.Tensor("batch", "l0").from_slice(ctx, (256, 2), rng.standard_normal((256, 2)))
y = F.Tensor("batch", "l3").from_slice(ctx, (256, 2), np.eye(2)[rng.integers(0, 2, 256)])
params = _fucina_mlp(ctx, (2, 64, 64, 2), "tanh", 1)
opt = F.optim.Adam(params, lr=1e-2)


def train_step(x, y):
    opt.zero_grad()
    loss = _fucina_loss(params, x, y, "tanh")
    opt.step()
    return loss


t0 = time.perf_counter()
step = F.compile(train_step)
step(x, y).item()
print(time.perf_counter() - t0)
"""


def _first_step_case() -> Case:
    """Time from ``compile()`` to the end of the first spirals training step (forward,
    backward, Adam) in a fresh process, with an empty kernel cache (cold) and with the
    cache it left (warm); imports and model set-up are not counted."""
    c = Case("first compiled spirals step, new process")
    cold, warm = _new_process_cold_warm(_FIRST_STEP)
    c.notes["cold_s"] = cold
    c.notes["warm_s"] = warm
    return c


def run_training_suite(quick: bool = False, torch_compile: bool = True,
                       first_step: bool = True) -> list[Case]:
    """Training-step rows: the spirals MLP (Adam), a 784-1024-1024-10 MLP (AdamW), a
    784-512-10 MLP (SGD) and the time to a first compiled step in a new process (not in
    quick runs)."""
    spirals = _training_case("spirals step, batch 256, 2-64-64-2 tanh, Adam", (2, 64, 64, 2),
                             256, "tanh", "Adam", 1e-2, quick, torch_compile and not quick)
    big = (784, 256, 256, 10) if quick else (784, 1024, 1024, 10)
    mlp = _training_case(f"MLP {'-'.join(map(str, big))} relu, batch 256, AdamW", big, 256,
                         "relu", "AdamW", 1e-3, quick, torch_compile and not quick)
    cases = [spirals, mlp, _training_case("MLP 784-512-10 relu, batch 256, SGD", (784, 512, 10),
                                          256, "relu", "SGD", 1e-2, quick,
                                          torch_compile and not quick)]
    if first_step and not quick:
        cases.append(_first_step_case())
    return cases


def _quant_weight(ctx: Any, fmt: str, n: int, k: int, seed: int) -> tuple[Any, np.ndarray]:
    """A [n, k] block-quantized weight and its f32 dequantization (numpy's operand)."""
    import fucina.gguf as G

    w = (np.random.default_rng(seed).standard_normal((n, k)) * 0.02).astype(np.float32)
    blocks = G.encode_f32(fmt, w)
    wq = F.Tensor("out", "in", dtype=fmt).from_blocks(ctx, (n, k), blocks)
    return wq, G.decode_f32(fmt, blocks)


def _qmatmul_case(fmt: str, m: int, n: int, k: int, quick: bool) -> Case:
    """x[m, k] . W_q[n, k]: fucina on the blocks vs numpy on the dequantized f32 weight.

    Notes: the bytes one call reads from the weight (per token for a GEMV: the
    quantized blocks, which is what the weight takes in a GGUF file) against
    the f32 bytes numpy reads, and the GB/s each achieved; ``at_numpy_GBps_ms``
    is the time the quantized bytes would take at numpy's bandwidth (the bound
    a bandwidth-limited GEMV can reach).
    """
    ctx = F.ExecContext()
    wq, wd = _quant_weight(ctx, fmt, n, k, 10 + m)
    x0 = np.random.default_rng(m).standard_normal((m, k)).astype(np.float32)
    x = F.Tensor("t", "in").from_slice(ctx, (m, k), x0)
    fast = F.compile(lambda x: x.dot(wq, "in"))
    kind = "GEMV" if m == 1 else "GEMM"
    c = Case(f"{kind} [{m}x{k}]x[{n}x{k}] {fmt}")
    mt = 0.05 if quick else 0.3
    t = side_by_side(c, mt, eager=lambda: x.dot(wq, "in"), compiled=lambda: fast(x),
                     numpy=lambda: x0 @ wd.T)
    qbytes = wq.as_raw_tensor().array().nbytes
    c.notes["weight_MB"] = qbytes / 1e6
    c.notes["f32_MB"] = wd.nbytes / 1e6
    c.notes["GBps"] = qbytes / t["compiled"] / 1e9
    c.notes["numpy_GBps"] = wd.nbytes / t["numpy"] / 1e9
    c.notes["at_numpy_GBps_ms"] = qbytes / (wd.nbytes / t["numpy"]) * 1e3
    ref = x0.astype(np.float64) @ wd.T.astype(np.float64)
    c.notes["max_rel_err"] = float(np.abs(fast(x).numpy() - ref).max() / np.abs(ref).max())
    return c


def run_quant_suite(quick: bool = False) -> list[Case]:
    """Quantized-weight rows: GEMV for q8_0/q4_1/q4_k, GEMM for q4_k (issue sizes)."""
    if quick:
        return [_qmatmul_case(f, 1, 1024, 512, True) for f in ("q8_0", "q4_1", "q4_k")] + [
            _qmatmul_case("q4_k", 32, 512, 512, True)]
    return [_qmatmul_case(f, 1, 11008, 4096, False) for f in ("q8_0", "q4_1", "q4_k")] + [
        _qmatmul_case("q4_k", 32, 4096, 4096, False)]


def run_suite(quick: bool = False, cold_warm: bool = True, models: bool = False,
              dask_sentences: int = 20_000) -> list[Case]:
    """Run the standard suite and return its rows (``models``: the real-model rows too,
    incl. the Dask rows embedding ``dask_sentences`` sentences when dask is installed)."""
    n = 1 << 18 if quick else 1 << 22
    cases = [_chain_case(n, quick), _five_op_case(quick),
             _softmax_case(512 if quick else 4096, 1024, quick), _tiny_case(quick),
             _gemm_trans_b_case(256 if quick else 1024, quick), _attention_case(quick),
             _linear_gelu_case(quick), _conv2d_case(quick), *_flash_attention_cases(quick),
             _attention_memory_case(quick), _rope_case(quick)]
    cases += run_quant_suite(quick)
    rows = 512 if quick else 8192
    cases += [_norm_case("layer_norm", rows, 1024, quick), _norm_case("rms_norm", rows, 1024,
                                                                       quick)]
    cases.append(_cross_entropy_case(quick))
    # issue 13 rows; these modules import this one, so they are imported when run
    from .bench_blocks import block_cases
    from .bench_rows import row_cases
    from .bench_unary import proxy_case, unary_cases

    cases += row_cases(quick)
    cases += dispatch_cases(Case, side_by_side, quick)
    cases += [proxy_case(cases[0], quick), *unary_cases(n, quick)]
    cases += block_cases(quick, cold_warm)
    if cold_warm:
        cases.append(_cold_warm_case())
    if models:
        cases += _model_cases(dask_sentences)
    return cases


def _model_cases(dask_sentences: int) -> list[Case]:
    from .bench_bert import minilm_case
    from .bench_dask import dask_cases
    from .bench_llama import llama_cases

    return [minilm_case(Case), *llama_cases(Case),
            *(dask_cases(Case, dask_sentences) if dask_sentences else [])]


def _fmt(t: float | None) -> str:
    if t is None:
        return "-"
    if t < 1e-3:
        return f"{t * 1e6:8.2f} us"
    return f"{t * 1e3:8.3f} ms"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a / b:6.2f}x"


def table(cases: list[Case]) -> str:
    """Human-readable table; ratios are other/compiled (or other/eager without compiled)."""
    head = (f"{'case':44} {'eager':>11} {'compiled':>11} {'numpy':>11} {'torch':>11} "
            f"{'numpy/fast':>10} {'torch/fast':>10}  notes")
    lines = [head, "-" * len(head)]
    for c in cases:
        ref = c.compiled if c.compiled is not None else c.eager
        notes = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                          for k, v in c.notes.items())
        lines.append(f"{c.name:44} {_fmt(c.eager):>11} {_fmt(c.compiled):>11} "
                     f"{_fmt(c.numpy):>11} {_fmt(c.torch):>11} {_ratio(c.numpy, ref):>10} "
                     f"{_ratio(c.torch, ref):>10}  {notes}")
    return "\n".join(lines)


_ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
              "avx512_vnni", "avx512_bf16", "amx_tile", "neon", "asimd", "sve")


def cpu_model() -> str:
    """The CPU's marketing name (/proc/cpuinfo, else the platform's processor string)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def isa_flags() -> list[str]:
    """The vector ISA extensions of this CPU that matter for kernels (as LLVM sees them)."""
    import llvmlite.binding as llvm

    feats = llvm.get_host_cpu_features()
    have = {k.replace("-", "_") for k, on in feats.items() if on}
    names = {"sse4.2": "sse4_2", "avx512vnni": "avx512_vnni", "avx512bf16": "avx512_bf16",
             "amx-tile": "amx_tile"}
    have |= {v for k, v in names.items() if feats.get(k)}
    return [f for f in _ISA_FLAGS if f in have]


def blas_core() -> str:
    """The BLAS numpy calls (library, kernel core, threads) via threadpoolctl if installed."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        cfg = getattr(np, "show_config", None)
        return "unknown (install threadpoolctl)" if cfg is None else _numpy_blas_name()
    parts = [f"{i.get('internal_api')} {i.get('version') or ''} core={i.get('architecture')} "
             f"threads={i.get('num_threads')}".replace("  ", " ")
             for i in threadpool_info() if i.get("user_api") == "blas"]
    return "; ".join(parts) or "none found"


def _numpy_blas_name() -> str:
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{blas.get('name')} {blas.get('version')} (core unknown: no threadpoolctl)"
    except Exception:  # numpy < 1.26 has no dict mode
        return "unknown (install threadpoolctl)"


def conditions(busy_procs: int = 0, paired: int = 0) -> dict[str, Any]:
    """The machine and library versions a run was made under (``busy_procs``: spinning
    helper processes started for the run, ``--busy``; ``paired``: helpers spinning in
    every other repeat, ``--paired-load``)."""
    import numba

    info = {"python": platform.python_version(), "machine": platform.machine(),
            "cpu": cpu_model(), "isa": " ".join(isa_flags()), "cpus": os.cpu_count(),
            "load_avg": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
            "numpy": np.__version__, "numba": numba.__version__,
            "fucina": F.__version__, "threading_layer": F.internal.threading_layer(),
            "threads": numba.get_num_threads(),
            "blas": blas_core(), "busy_procs": busy_procs, "paired_load": paired,
            "kernel_target": kernel_target(), "isa_level": os.environ.get(isa.MARK, "host"),
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    if torch is not None:
        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        info["torch_capability"] = _torch_capability()
    return info


def kernel_target() -> str:
    """The CPU Numba compiles fucina's kernels for and their vector width: the host's,
    or a narrowed target (``--isa``, ``NUMBA_CPU_FEATURES``)."""
    _, cpu, features = vm.codegen_target()
    return f"{cpu}, {isa.vector_bits(features)}-bit vectors"


def _torch_capability() -> str:
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except AttributeError:  # torch < 2.1
        return "unknown"


def header(cond: dict[str, Any]) -> str:
    """The lines printed above the table: machine, ISA, threading, BLAS, versions."""
    versions = ", ".join(f"{k} {cond[k]}" for k in ("fucina", "numpy", "numba", "torch",
                                                     "python") if k in cond)
    return "\n".join([
        f"fucina benchmark suite, {cond['date']}",
        f"CPU: {cond['cpu']} ({cond['machine']}, {cond['cpus']} logical CPUs, "
        f"load {cond['load_avg']})",
        f"ISA: {cond['isa'] or 'baseline'}",
        f"kernels: {cond.get('kernel_target', '?')}"
        + (f" (--isa {cond['isa_level']})" if cond.get("isa_level", "host") != "host" else "")
        + (f"; torch capability {cond['torch_capability']}" if "torch_capability" in cond
           else ""),
        f"threading: generated kernels on fucina's pool ({cond.get('threads', '?')} threads), "
        f"library kernels on numba {cond['threading_layer']}"
        + (f", torch threads {cond['torch_threads']}" if "torch_threads" in cond else ""),
        f"BLAS: {cond['blas']}",
        f"load: {_load_text(cond.get('busy_procs', 0), cond.get('paired_load', 0))}",
        f"versions: {versions}"])


def _load_text(busy: int, paired: int = 0) -> str:
    if paired:
        return (f"{paired} helper process{'es' if paired > 1 else ''} spinning in every "
                f"other repeat (--paired-load): each row timed quiet and loaded")
    if not busy:
        return "no helper processes (--busy 0)"
    return f"{busy} spinning helper process{'es' if busy > 1 else ''} during the run (--busy)"


def spread_table(cases: list[Case]) -> str:
    """min / median / max per call for every timed implementation of every row."""
    lines = [f"{'case':44} {'impl':>9} {'min':>11} {'median':>11} {'max':>11}"]
    for c in cases:
        for impl, st in c.spread().items():
            lines.append(f"{c.name:44} {impl:>9} {_fmt(st['min']):>11} "
                         f"{_fmt(st['median']):>11} {_fmt(st['max']):>11}")
    return "\n".join(lines)


def to_json(cases: list[Case], cond: dict[str, Any]) -> dict[str, Any]:
    """The saved form of a run: conditions, and per row the times and their spread."""
    rows = []
    for c in cases:
        row = asdict(c)
        for k in IMPLS:  # plain floats in the JSON
            row[k] = None if row[k] is None else float(row[k])
        row["spread"] = c.spread()
        rows.append(row)
    return {"conditions": cond, "cases": rows}


def save(doc: dict[str, Any], out: Path | None) -> Path:
    """Write a run's JSON (default ``bench-results/<timestamp>.json``); returns the path."""
    if out is None:
        out = RESULTS_DIR / (time.strftime("%Y%m%d-%H%M%S") + ".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2))
    return out


def ratios(doc: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per row, each other implementation's time over fucina's (compiled, else eager)."""
    res: dict[str, dict[str, float]] = {}
    for c in doc["cases"]:
        ref_key = "compiled" if c["compiled"] is not None else "eager"
        if c[ref_key]:
            res[c["name"]] = {k: c[k] / c[ref_key] for k in IMPLS
                              if k != ref_key and k != "compiled" and c[k] is not None}
    return res


def compare(a: dict[str, Any], b: dict[str, Any]) -> tuple[str, dict[str, dict[str, float]]]:
    """Table of run B's time over run A's per row and implementation (< 1: B is faster)."""
    rows_a = {c["name"]: c for c in a["cases"]}
    out: dict[str, dict[str, float]] = {}
    head = f"{'case':44} " + " ".join(f"{k + ' B/A':>13}" for k in IMPLS)
    lines = [f"A: {a['conditions'].get('date')} {a['conditions'].get('cpu')}",
             f"B: {b['conditions'].get('date')} {b['conditions'].get('cpu')}", head,
             "-" * len(head)]
    for cb in b["cases"]:
        ca = rows_a.get(cb["name"])
        if ca is None:
            continue
        r = {k: cb[k] / ca[k] for k in IMPLS if cb.get(k) and ca.get(k)}
        out[cb["name"]] = r
        lines.append(f"{cb['name']:44} " + " ".join(
            f"{r[k]:12.2f}x" if k in r else f"{'-':>13}" for k in IMPLS))
    missing = sorted(set(rows_a) - {c["name"] for c in b["cases"]})
    if missing:
        lines.append("only in A: " + ", ".join(missing))
    return "\n".join(lines), out


def plot(data: dict[str, dict[str, float]], path: Path, title: str) -> Path | None:
    """A horizontal bar chart of ``data`` (row -> series -> ratio) as a PNG, or None
    without matplotlib (``pip install fucina[plot]``)."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(data)
    series = sorted({k for r in data.values() for k in r})
    fig, ax = plt.subplots(figsize=(10, 0.35 * max(len(names), 4) + 1.5))
    height = 0.8 / max(len(series), 1)
    for j, s in enumerate(series):
        ys = [i + j * height for i in range(len(names))]
        ax.barh(ys, [data[n].get(s, 0.0) for n in names], height, label=s)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(names))], names, fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("ratio (log scale)")
    ax.set_title(title, fontsize=9)
    if series:  # a run with no ratios (every row skipped) has no series to name
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _saved_run(path: Path, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """A run saved by this harness, or a usage error (exit status 2) saying why not."""
    try:
        run = json.loads(path.read_text())
    except OSError as e:
        parser.error(f"--compare: cannot read {path}: {e.strerror or e}")
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        parser.error(f"--compare: {path} is not JSON ({e})")
    if not (isinstance(run, dict) and isinstance(run.get("cases"), list)
            and isinstance(run.get("conditions"), dict)
            and all(isinstance(c, dict) and "name" in c for c in run["cases"])):
        parser.error(f"--compare: {path} is not a saved run of python -m fucina.bench "
                     "(no 'conditions' and 'cases')")
    return run


def isa_relaunch(level: str, argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """The command and environment that rerun the benchmark with ``argv`` on the
    narrowed ``level`` (:func:`fucina.kernels.isa.narrowed_env`): Numba and torch read
    their targets once, at import, so the run needs a process of its own."""
    try:
        env = isa.narrowed_env(level, os.environ)
    except ValueError as e:
        raise SystemExit(f"--isa {level}: {e}") from None
    return [sys.executable, "-m", "fucina.bench", *argv], env


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m fucina.bench``."""
    p = argparse.ArgumentParser(prog="python -m fucina.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--quick", action="store_true", help="smaller sizes and shorter timing")
    p.add_argument("--no-cold-warm", action="store_true", help="skip the new-process case")
    p.add_argument("--no-models", action="store_true",
                   help="skip the real-model rows (MiniLM, SmolLM2; --quick skips them too)")
    p.add_argument("--models-only", action="store_true", help="run only the real-model rows")
    p.add_argument("--dask-sentences", type=int, default=20_000, metavar="N",
                   help="sentences the Dask rows embed (0: skip them; default 20000)")
    p.add_argument("--out", type=Path, default=None,
                   help="where to save the run's JSON (default bench-results/<timestamp>.json)")
    p.add_argument("--no-save", action="store_true", help="do not save the run")
    p.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"),
                   help="compare two saved runs (B's time over A's) instead of running")
    p.add_argument("--no-training", action="store_true", help="skip the training-step section")
    p.add_argument("--no-torch-compile", action="store_true",
                   help="skip torch.compile in the training section")
    p.add_argument("--busy", type=int, default=0, metavar="N",
                   help="run under load: N helper processes spin on a core each for the "
                        "whole run (default 0)")
    p.add_argument("--paired-load", type=int, default=0, metavar="N",
                   help="time every repeat twice, quiet and with N helper processes spinning "
                        "(paused in between), and report each row's loaded/quiet ratio")
    p.add_argument("--isa", choices=("host",) + isa.LEVELS, default="host",
                   help="the vector path to measure: host (default), or avx2 on an AVX-512 "
                        "machine (the run restarts with AVX-512 off for fucina's kernels, "
                        "torch and OpenBLAS: the code an AVX2 machine runs, on these cores)")
    args = p.parse_args(argv)
    if args.isa != "host" and os.environ.get(isa.MARK) != args.isa:
        cmd, env = isa_relaunch(args.isa, sys.argv[1:] if argv is None else argv)
        return subprocess.run(cmd, env=env).returncode
    if args.busy < 0 or args.paired_load < 0:
        p.error("--busy and --paired-load need N >= 0")
    if args.busy and args.paired_load:
        p.error("--busy and --paired-load exclude each other")
    if args.compare:
        a, b = (_saved_run(f, p) for f in args.compare)
        text, data = compare(a, b)
        print(text)
        loaded = load_compare(a, b)  # both runs made with --paired-load
        if loaded:
            print(f"\n{loaded}")
        png = plot(data, args.compare[1].with_suffix(".compare.png"),
                   f"time B/A: {args.compare[1].name} over {args.compare[0].name}")
        if png is not None:
            print(f"plot: {png}", file=sys.stderr)
        return 0
    cond = conditions(args.busy, args.paired_load)
    if not args.json:
        print(header(cond), flush=True)
    PROGRESS[0] = True
    try:
        # helpers are ended on any exit, Ctrl-C included
        with busy_processes(args.busy), paired_load(args.paired_load) as load:
            LOAD[0] = load if args.paired_load else None
            if args.models_only:
                cases = _model_cases(args.dask_sentences)
            else:
                cases = run_suite(quick=args.quick, cold_warm=not args.no_cold_warm,
                                  models=not (args.no_models or args.quick),
                                  dask_sentences=args.dask_sentences)
            training = [] if args.no_training or args.models_only else run_training_suite(
                quick=args.quick, torch_compile=not args.no_torch_compile)
    finally:
        PROGRESS[0] = False
        LOAD[0] = None
    doc = to_json(cases, cond)
    if training:
        doc["training"] = to_json(training, cond)["cases"]
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(table(cases))
        print()
        print(spread_table(cases))
        if training:
            print("\ntraining steps (zero_grad + forward + backward + optimizer step; "
                  "fucina compiled = the whole step in one program; torch.compile = the model)")
            print(table(training))
        if args.paired_load:
            print(f"\nloaded / quiet (--paired-load {args.paired_load}; paired repeats, "
                  "min and median)")
            print(load_table(cases + training, IMPLS))
    if not args.no_save:
        path = save(doc, args.out)
        print(f"saved: {path}", file=sys.stderr)
        png = plot(ratios(doc), path.with_suffix(".png"),
                   "time of each implementation over fucina's (> 1: fucina is faster)")
        if png is not None:
            print(f"plot: {png}", file=sys.stderr)
        if args.paired_load:
            png = plot(load_ratios(cases + training, IMPLS), path.with_suffix(".load.png"),
                       "loaded over quiet time, medians of paired repeats (> 2: target 8 missed)")
            if png is not None:
                print(f"plot: {png}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    # Run the imported module's main, not this __main__ copy: the row modules import
    # fucina.bench, so its PROGRESS and LOAD are the switches their rows read.
    from fucina.bench import main as _main

    raise SystemExit(_main())
