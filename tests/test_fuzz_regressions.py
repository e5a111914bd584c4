"""Regression tests for the bugs the API fuzz suite (test_fuzz_api.py) found.

Each test names the program the fuzzer reduced the failure to.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fucina as F


def test_einsum_many_takes_the_einsum_dtypes_only(ctx):
    # einsum_many(('c', 'a'), [i64, i64, i64]) ran an integer contraction through the float
    # GEMM and cast NaN/overflowed floats back to integers (garbage, plus a numpy warning).
    I = F.Tensor("a", "c", dtype="i64")
    x = I.from_slice(ctx, (2, 2), [1, 2, 3, 4])
    with pytest.raises(F.TagError, match="einsum_many takes f32, f16 or bf16 operands.*i64"):
        F.einsum_many(("c",), [x, x])
    y = F.Tensor("a", "c", dtype="f64").from_slice(ctx, (2, 2), [1, 2, 3, 4])
    with pytest.raises(F.TagError, match="f64"):
        F.einsum_many(("c",), [y])
    a = F.Tensor("a", "c").from_slice(ctx, (2, 2), [1, 2, 3, 4])
    h = F.Tensor("c", dtype="f16").from_slice(ctx, (2,), [1, 10])
    np.testing.assert_array_equal(F.einsum_many(("a",), [a, h]).numpy(), [21, 43])


def test_contractions_with_inf_and_nan_emit_no_numpy_warnings(ctx):
    # x.dot(w, 'e') with inf in x and 0 in w: "invalid value encountered in matmul"
    x = F.Tensor("r", "e").from_slice(ctx, (2, 2), [np.inf, 1.0, 3e38, 3e38])
    w = F.Tensor("e", "c").from_slice(ctx, (2, 1), [0.0, 2.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = x.dot(w, "e").numpy()
    assert np.isnan(out[0, 0]) and out[1, 0] == np.inf  # inf * 0 and an f32 overflow


def test_linspace_to_infinity_emits_no_numpy_warnings(ctx):
    # linspace(0.001, inf, ...) warned "invalid value encountered in multiply"
    D = F.Tensor("d")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        one = D.linspace(ctx, 0.001, float("inf"), 1).numpy()
        three = D.linspace(ctx, 0.0, float("inf"), 3).numpy()
    np.testing.assert_array_equal(one, np.float32([0.001]))
    np.testing.assert_array_equal(three, [np.nan, np.inf, np.inf])  # numpy's and torch's
