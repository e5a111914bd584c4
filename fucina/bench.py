"""The benchmark harness: ``python -m fucina.bench`` (``--json`` for machines).

Runs a standard suite side by side in one process (fucina eager, fucina
compiled, numpy and, when importable, torch eager) and prints each case's
best time and the ratios against fucina compiled. Times are the minimum over
repeats of the mean over a batch of calls; the machine is shared and noisy,
so compare ratios from one run rather than absolute times across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

import fucina as F

try:  # torch is an optional comparison point
    import torch
except ImportError:  # pragma: no cover - depends on the machine
    torch = None  # type: ignore[assignment]


@dataclass
class Case:
    """One benchmark row: seconds per call for each implementation (None: not run)."""

    name: str
    eager: float | None = None
    compiled: float | None = None
    numpy: float | None = None
    torch: float | None = None
    notes: dict[str, Any] = field(default_factory=dict)


def best_time(fn: Callable[[], Any], min_time: float = 0.2, repeats: int = 5) -> float:
    """Minimum over ``repeats`` of the mean time per call (seconds)."""
    fn()
    t = timeit.Timer(fn)
    n, elapsed = 1, 0.0
    while True:
        elapsed = t.timeit(n)
        if elapsed >= min_time / repeats or n >= 1 << 20:
            break
        n *= 2 if elapsed == 0 else max(2, int(min_time / repeats / max(elapsed, 1e-9)))
    return min(t.repeat(repeats, n)) / n


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
    c.eager = best_time(lambda: chain(x, w), mt)
    c.compiled = best_time(lambda: fast(x, w), mt)

    def np_chain() -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-(np.tanh(x0 * w0 + np.float32(1.0)) * x0)))

    c.numpy = best_time(np_chain, mt)
    if torch is not None:
        tx, tw = torch.from_numpy(x0), torch.from_numpy(w0)
        c.torch = best_time(lambda: torch.sigmoid(torch.tanh(tx * tw + 1) * tx), mt)
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
    c.eager = best_time(lambda: five(x, b), mt)
    c.compiled = best_time(lambda: fast(x, b), mt)
    x0, b0 = x.numpy(), b.numpy()
    c.numpy = best_time(lambda: (np.maximum((x0 + b0) * np.float32(0.5), x0) - b0) * x0, mt)
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
    c.eager = best_time(lambda: softmax(x), mt)
    c.compiled = best_time(lambda: fast(x), mt)
    x0 = x.numpy()

    def np_softmax() -> np.ndarray:
        e = np.exp(x0 - x0.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    c.numpy = best_time(np_softmax, mt)
    if torch is not None:
        tx = torch.from_numpy(x0)
        c.torch = best_time(lambda: torch.softmax(tx, dim=1), mt)
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
    c.eager = best_time(lambda: a.dot(w, "k"), mt)
    c.compiled = best_time(lambda: fast(a, w), mt)
    a0, w0 = a.numpy(), w.numpy()
    c.numpy = best_time(lambda: a0 @ w0.T, mt)
    if torch is not None:
        ta, tw = torch.from_numpy(a0), torch.from_numpy(w0)
        c.torch = best_time(lambda: ta @ tw.T, mt)
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
    c.eager = best_time(lambda: q.dot(k, "d"), mt)
    c.compiled = best_time(lambda: fast(q, k), mt)
    q0 = q.numpy()
    kt = np.ascontiguousarray(np.swapaxes(k.numpy(), 2, 3))  # numpy gets it pre-transposed
    c.numpy = best_time(lambda: np.matmul(q0, kt), mt)
    if torch is not None:
        tq, tk = torch.from_numpy(q0), torch.from_numpy(kt)
        c.torch = best_time(lambda: torch.matmul(tq, tk), mt)
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
    c.eager = best_time(lambda: linear(x, w, bias), mt)
    c.compiled = best_time(lambda: fast(x, w, bias), mt)
    x0, w0, b0 = x.numpy(), w.numpy(), bias.numpy()
    k0, k1 = np.float32(0.7978845608028654), np.float32(0.044715)

    def np_linear() -> np.ndarray:
        y = x0 @ w0.T + b0
        return np.float32(0.5) * y * (np.float32(1) + np.tanh(k0 * (y + k1 * y * y * y)))

    c.numpy = best_time(np_linear, mt)
    if torch is not None:
        tx, tw, tb = torch.from_numpy(x0), torch.from_numpy(w0), torch.from_numpy(b0)
        c.torch = best_time(
            lambda: torch.nn.functional.gelu(torch.addmm(tb, tx, tw.T), approximate="tanh"), mt)
    c.notes["kernels"] = len(fast.kernels(x, w, bias))
    c.notes["max_abs_err_vs_numpy"] = float(np.max(np.abs(fast(x, w, bias).numpy()
                                                          - np_linear())))
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
    c.eager = best_time(lambda: run(step), mt, repeats=3)
    c.compiled = best_time(lambda: run(fast), mt, repeats=3)
    loss = run(fast).item()
    g = x.grad()
    assert g is not None  # the compiled step delivered the gradient
    grad = g.numpy()
    if torch is not None:
        tx, tl = torch.from_numpy(x0).clone().requires_grad_(True), torch.from_numpy(lab0)

        def torch_step() -> None:
            tx.grad = None
            torch.nn.functional.cross_entropy(tx, tl).backward()

        c.torch = best_time(torch_step, mt, repeats=3)
        torch_step()
        assert tx.grad is not None
        c.notes["max_abs_grad_err_vs_torch"] = float(np.max(np.abs(grad - tx.grad.numpy())))
        c.notes["loss_err_vs_torch"] = abs(
            loss - float(torch.nn.functional.cross_entropy(tx.detach(), tl)))
    c.notes["kernels"] = len(fast.kernels(x, lab))
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
    c.eager = best_time(lambda: norm(x), mt)
    c.compiled = best_time(lambda: fast(x), mt)
    x0 = x.numpy()

    def np_norm() -> np.ndarray:
        if kind == "layer_norm":
            d = x0 - x0.mean(axis=1, keepdims=True)
            return d / np.sqrt((d * d).mean(axis=1, keepdims=True) + np.float32(eps))
        return x0 / np.sqrt((x0 * x0).mean(axis=1, keepdims=True) + np.float32(eps))

    c.numpy = best_time(np_norm, mt)
    if torch is not None:
        tx = torch.from_numpy(x0)
        tnorm = torch.nn.functional.layer_norm if kind == "layer_norm" else \
            torch.nn.functional.rms_norm
        c.torch = best_time(lambda: tnorm(tx, (cols,), eps=eps), mt)
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
    c.eager = best_time(lambda: conv(x, w, bias), mt)
    c.compiled = best_time(lambda: fast(x, w, bias), mt)
    if torch is not None:
        tx = torch.from_numpy(x.numpy()).permute(0, 3, 1, 2)  # channels_last memory
        tw = torch.from_numpy(w.numpy()).permute(0, 3, 1, 2)
        tb = torch.from_numpy(bias.numpy())
        nchw, wn = tx.contiguous(), tw.contiguous()
        with torch.no_grad():
            t_cl = best_time(lambda: torch.nn.functional.conv2d(tx, tw, tb, 1, 1), mt)
            t_nchw = best_time(lambda: torch.nn.functional.conv2d(nchw, wn, tb, 1, 1), mt)
            want = torch.nn.functional.conv2d(tx, tw, tb, 1, 1).permute(0, 2, 3, 1).numpy()
        c.torch = min(t_cl, t_nchw)
        c.notes["torch_layout"] = "channels_last" if t_cl <= t_nchw else "NCHW"
        c.notes["max_abs_err_vs_torch"] = float(np.max(np.abs(fast(x, w, bias).numpy()
                                                              - want)))
    return c


def _tiny_case(quick: bool) -> Case:
    ctx = F.ExecContext()
    a = F.Tensor("d").from_slice(ctx, (8,), np.arange(8))
    b = F.Tensor("d").from_slice(ctx, (8,), np.arange(8))
    c = Case("tiny eager add [8]")
    mt = 0.05 if quick else 0.3
    c.eager = best_time(lambda: a.add(b), mt)
    a0, b0 = a.numpy(), b.numpy()
    c.numpy = best_time(lambda: np.add(a0, b0), mt)
    if torch is not None:
        ta, tb = torch.from_numpy(a0), torch.from_numpy(b0)
        c.torch = best_time(lambda: torch.add(ta, tb), mt)
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


def _cold_warm_case() -> Case:
    """Time from compile() to the first results in a fresh process, empty vs warm cache.

    Both processes pay the same interpreter and import start-up, which is not
    counted; the library's own helper kernels (RNG, vector math) cache in the
    installed package as soon as any process has used them.
    """
    c = Case("first compiled result, new process")
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, FUCINA_CACHE_DIR=d)

        def run() -> float:
            out = subprocess.run([sys.executable, "-c", _FIRST_RESULT], env=env, check=True,
                                 capture_output=True, text=True)
            return float(out.stdout.strip().splitlines()[-1])

        cold = run()
        warm = min(run() for _ in range(2))
    c.notes["cold_s"] = cold
    c.notes["warm_s"] = warm
    c.notes["cold_over_warm"] = cold / warm
    return c


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
    c.eager = best_time(lambda: x.dot(wq, "in"), mt)
    c.compiled = best_time(lambda: fast(x), mt)
    c.numpy = best_time(lambda: x0 @ wd.T, mt)
    qbytes = wq.as_raw_tensor().array().nbytes
    c.notes["weight_MB"] = qbytes / 1e6
    c.notes["f32_MB"] = wd.nbytes / 1e6
    c.notes["GBps"] = qbytes / c.compiled / 1e9
    c.notes["numpy_GBps"] = wd.nbytes / c.numpy / 1e9
    c.notes["at_numpy_GBps_ms"] = qbytes / (wd.nbytes / c.numpy) * 1e3
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


def run_suite(quick: bool = False, cold_warm: bool = True) -> list[Case]:
    """Run the standard suite and return its rows."""
    n = 1 << 18 if quick else 1 << 22
    cases = [_chain_case(n, quick), _five_op_case(quick),
             _softmax_case(512 if quick else 4096, 1024, quick), _tiny_case(quick),
             _gemm_trans_b_case(256 if quick else 1024, quick), _attention_case(quick),
             _linear_gelu_case(quick), _conv2d_case(quick)]
    cases += run_quant_suite(quick)
    rows = 512 if quick else 8192
    cases += [_norm_case("layer_norm", rows, 1024, quick), _norm_case("rms_norm", rows, 1024,
                                                                       quick)]
    cases.append(_cross_entropy_case(quick))
    if cold_warm:
        cases.append(_cold_warm_case())
    return cases


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


def conditions() -> dict[str, Any]:
    """The machine and library versions a run was made under."""
    import numba

    info = {"python": platform.python_version(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "numpy": np.__version__, "numba": numba.__version__,
            "fucina": F.__version__, "threading_layer": F.internal.threading_layer(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    if torch is not None:
        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
    return info


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m fucina.bench``."""
    p = argparse.ArgumentParser(prog="python -m fucina.bench", description=__doc__)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--quick", action="store_true", help="smaller sizes and shorter timing")
    p.add_argument("--no-cold-warm", action="store_true", help="skip the new-process case")
    args = p.parse_args(argv)
    cases = run_suite(quick=args.quick, cold_warm=not args.no_cold_warm)
    if args.json:
        print(json.dumps({"conditions": conditions(), "cases": [asdict(c) for c in cases]},
                         indent=2))
    else:
        print("fucina benchmark suite; " + ", ".join(f"{k}={v}" for k, v in conditions().items()))
        print(table(cases))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
