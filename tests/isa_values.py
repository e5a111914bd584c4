"""What ``tests/test_isa.py`` computes on two compile targets (this file is imported
by the test and by its child process, which must not import pytest or torch)."""

from __future__ import annotations

import numpy as np

import fucina as F
from fucina.kernels import vecmath as vm


def _chain(u: F.Tensor) -> F.Tensor:
    return u.mul(u).add(u).tanh().sigmoid().mul(u)


def chain_stages() -> int:
    """How many staged loops the chain's compiled kernel runs: 2 (tanh, then sigmoid) on
    every vector path, since the fused body spills at 256 bits as at 512."""
    t = F.Tensor("i").randn(F.ExecContext(), (300,), 1)
    return F.compile(_chain).kernels(t)[0].source.count("for j in range(kl):")


def values() -> dict[str, np.ndarray]:
    """Every vecmath function on sweeps and random bit patterns, and generated kernels
    (softmax, sums over the first and last axis, layer_norm, a fused chain) eager and
    compiled: what the child computes for its target and this process for the host's."""
    rng = np.random.default_rng(5)
    bits = rng.integers(0, 2**32, 60_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    # (exp's results in the denormals and at overflow: one vscalefps with AVX-512, two
    # multiplications by powers of two on AVX2, the same bits)
    x = np.concatenate([np.linspace(-20, 20, 40_001, dtype=np.float32),
                        np.geomspace(1e-30, 90, 2_000).astype(np.float32),
                        np.linspace(-104, -86, 20_001, dtype=np.float32),
                        np.linspace(88.7, 88.75, 2_001, dtype=np.float32), bits])
    out = {name: getattr(vm, f"v{name}")(x) for name in vm.ULP_BOUNDS}
    ctx = F.ExecContext()
    t = F.Tensor("a", "b", "c").randn(ctx, (4, 32, 200), 3)
    ops = {"softmax": lambda u: u.softmax("c"), "sum_a": lambda u: u.sum("a"),
           "sum_c": lambda u: u.sum("c"), "layer_norm": lambda u: u.layer_norm("c", 1e-5),
           "chain": _chain}
    for name, fn in ops.items():
        out[name] = fn(t).numpy()
        out[f"{name} compiled"] = F.compile(fn)(t).numpy()
    # short kept rows: the flat rounds and the level-by-level tree (lanes.add_into's
    # vectors and masked tails differ in width between the paths), and max's row form
    short = F.Tensor("a", "b", "c").randn(ctx, (6, 45, 9), 4)
    for name, fn in {"short sum_b": lambda u: u.sum("b"),
                     "short sq sum_b": lambda u: u.mul(u).sum("b"),
                     "short max_b": lambda u: u.max("b")}.items():
        out[name] = fn(short).numpy()
        out[f"{name} compiled"] = F.compile(fn)(short).numpy()
    # row tails through the window of the last 32 (lanes.add_last: a rotation whose
    # shuffles differ between the paths): tails of 13 and 31, plain and exp producers
    for n in (77, 95):
        rows = F.Tensor("r", "c").randn(ctx, (5, n), 6)
        for name, fn in {"rms_norm": lambda u: u.rms_norm("c", 1e-6),
                         "log_softmax": lambda u: u.log_softmax("c"),
                         "softmax": lambda u: u.softmax("c")}.items():
            out[f"tail {n} {name}"] = fn(rows).numpy()
            out[f"tail {n} {name} compiled"] = F.compile(fn)(rows).numpy()
    return out
