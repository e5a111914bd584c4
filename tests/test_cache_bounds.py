"""Every cache is bounded (least recently used entries dropped) and reported."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import fucina as F
from fucina.ir import eager
from fucina.kernels import cache as kcache
from fucina.runtime.lru import LRU
from fucina.tensor import fast
from fucina.tensor import math as tmath

compile_mod = importlib.import_module("fucina.compile")  # fucina.compile is the function


def test_lru_drops_the_least_recently_used():
    c = LRU(2)
    c.put("a", 1)
    c.put("b", 2)
    assert c.get("a") == 1  # "b" is now the least recently used
    assert c.put("c", 3) == [2]
    assert "b" not in c and c.get("a") == 1 and c.get("c") == 3
    assert len(c) == 2 and c.evictions == 1
    assert c.get("b", "missing") == "missing"
    with pytest.raises(ValueError):
        LRU(0)


def test_cache_info_reports_every_cache():
    info = F.cache_info()
    for name in ("kernel_cache", "plan_cache", "binary_plan_cache", "gemm_plan_cache",
                 "program_cache"):
        size, bound = getattr(info, name)
        assert 0 <= size <= bound or name == "program_cache"
        assert bound >= 1
    assert info.kernel_cache[1] == kcache.KERNEL_CACHE_SIZE
    assert info.plan_cache[1] == eager.PLAN_CACHE_SIZE
    assert info.binary_plan_cache[1] == tmath.BIN_PLAN_CACHE_SIZE
    assert info.program_cache[1] == compile_mod.PROGRAM_CACHE_SIZE
    assert "plan_cache=" in repr(info)


def test_program_cache_keeps_the_most_recent_signatures(ctx, monkeypatch):
    monkeypatch.setattr(compile_mod, "PROGRAM_CACHE_SIZE", 3)
    fast = F.compile(lambda x: x.mul(x).add_scalar(1.0))
    xs = [F.Tensor("d").from_slice(ctx, (n,), np.arange(n, dtype=np.float32))
          for n in range(2, 7)]
    before = F.cache_info().program_cache[0]
    for x in xs:
        np.testing.assert_array_equal(fast(x).numpy(), x.numpy() ** 2 + 1)
    assert fast.cache_size() == 3
    assert F.cache_info().program_cache[0] == before + 3
    np.testing.assert_array_equal(fast(xs[0]).numpy(), xs[0].numpy() ** 2 + 1)  # retraced
    assert fast.cache_size() == 3


def test_plan_cache_is_bounded(ctx, monkeypatch):
    monkeypatch.setattr(eager, "PLANS", LRU(4))
    for n in range(2, 12):
        x = F.Tensor("d").from_slice(ctx, (n,), np.arange(n, dtype=np.float32))
        np.testing.assert_array_equal(x.add(x).numpy(), 2 * np.arange(n))
    assert len(eager.PLANS) == 4
    assert F.cache_info().plan_cache == (4, 4)


def test_kernel_cache_is_bounded_and_held_kernels_keep_working(ctx, monkeypatch):
    monkeypatch.setattr(kcache, "_MEMORY", LRU(1))
    x = F.Tensor("d").from_slice(ctx, (4,), [1.0, 2.0, 3.0, 4.0])
    f = F.compile(lambda x: x.mul(x).add_scalar(3.0))
    g = F.compile(lambda x: x.sub(x.scale(0.5)).exp())
    f(x)
    g(x)  # a second kernel source: the first one leaves the memory cache
    assert F.cache_info().kernel_cache == (1, 1)
    np.testing.assert_allclose(f(x).numpy(), x.numpy() ** 2 + 3)  # its program still holds it
    np.testing.assert_allclose(g(x).numpy(), np.exp(x.numpy() / 2), rtol=1e-6)


def test_gemm_plans_are_cached_per_signature_and_bounded(ctx, monkeypatch):
    from fucina.kernels import gemm

    monkeypatch.setattr(gemm, "PLANS", LRU(3))
    rng = np.random.default_rng(3)
    for n in range(2, 8):
        av = rng.standard_normal((3, n)).astype(np.float32)
        bv = rng.standard_normal((n, 5)).astype(np.float32)
        a = F.Tensor("m", "k").from_slice(ctx, av.shape, av)
        b = F.Tensor("k", "n").from_slice(ctx, bv.shape, bv)
        for _ in range(2):  # the second call reuses the plan: same values
            np.testing.assert_allclose(a.dot(b, "k").numpy(), av @ bv, rtol=1e-5, atol=1e-6)
        # A transposed right operand is another signature with its own plan.
        bt = F.Tensor("n", "k").from_slice(ctx, bv.T.shape, np.ascontiguousarray(bv.T))
        np.testing.assert_allclose(a.dot(bt, "k").numpy(), av @ bv, rtol=1e-5, atol=1e-6)
    assert len(gemm.PLANS) == 3 and gemm.PLANS.evictions > 0
    assert F.cache_info().gemm_plan_cache == (3, 3)
    assert "gemm_plan_cache=(3, 3)" in repr(F.cache_info())


def test_binary_plan_cache_is_bounded(ctx, monkeypatch):
    monkeypatch.setattr(tmath, "BIN_PLANS", LRU(3))
    # Signatures earlier tests taught the eager fast path skip the plan cache: start empty.
    monkeypatch.setattr(fast, "_FAST", {})
    for n in range(2, 12):  # ten distinct shapes, each a new signature
        a = np.arange(n, dtype=np.float32)
        x = F.Tensor("d").from_slice(ctx, (n,), a)
        y = F.Tensor("e").from_slice(ctx, (2,), [1.0, 2.0])
        np.testing.assert_array_equal(x.add(x).numpy(), 2 * a)
        np.testing.assert_array_equal(x.mul(y).numpy(), a[:, None] * [1.0, 2.0])
    assert len(tmath.BIN_PLANS) == 3 and tmath.BIN_PLANS.evictions == 17
    assert F.cache_info().binary_plan_cache == (3, 3)
    assert "binary_plan_cache=(3, 3)" in repr(F.cache_info())
    x = F.Tensor("d").from_slice(ctx, (2,), [1.0, 2.0])  # an evicted signature plans again
    np.testing.assert_array_equal(x.sub(x).numpy(), [0.0, 0.0])


def test_kernel_cache_key_covers_every_module_kernels_inline(monkeypatch):
    """Each module the generated source imports (and the files those inline: stack rows,
    the counter-based random numbers) is hashed into the kernel key, so an upgrade of
    any of them recompiles cached kernels instead of loading stale machine code."""
    import re
    from pathlib import Path

    from fucina.kernels import codegen

    here = Path(kcache.__file__).parent
    imported = set(re.findall(r"from fucina\.kernels import (\w+) as",
                              Path(codegen.__file__).read_text()))
    assert {"scalar_fns", "vecmath", "lanes", "stack_rows", "atomics", "user_fns"} <= imported
    assert {f"{m}.py" for m in imported} <= set(kcache.DEPS)
    assert {"codegen.py", "../rng.py"} <= set(kcache.DEPS)
    assert all((here / name).exists() for name in kcache.DEPS)
    before = kcache._deps_hash()
    monkeypatch.setattr(kcache, "DEPS", kcache.DEPS[:-1])  # without rng.py
    assert kcache._deps_hash() != before
