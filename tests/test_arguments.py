"""Constructors convert values or raise; bad arguments raise TypeError/ValueError (or a
fucina error) naming the method and the argument, never a bare Python message.

Regression tests for the facade-validation items of issue 8.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import fucina as F

T2 = F.Tensor("a", "b")
T1 = F.Tensor("d")


def naming(fn: str, arg: str) -> str:
    """The start of a message that names method ``fn`` and its argument ``arg``."""
    return re.escape(f"{fn}(): argument '{arg}'")


@pytest.fixture
def x(ctx):
    return T2.from_slice(ctx, (2, 6), np.arange(12, dtype=np.float32))


# -- values convert to the dtype, or raise ---------------------------------------------


def test_f8_from_slice_converts_values_like_the_cast(ctx):
    values = [1.0, 1.5, 300.0, -0.1, 1e-3]
    for name, expected in (("f8_e4m3", [1.0, 1.5, 288.0]), ("f8_e5m2", [1.0, 1.5, 320.0])):
        t = F.Tensor("d", dtype=name).from_slice(ctx, (5,), values)
        # the same bits as casting the f32 values, and the round-to-nearest grid values
        via_cast = T1.from_slice(ctx, (5,), values).to(name)
        np.testing.assert_array_equal(t.numpy(), via_cast.numpy())
        np.testing.assert_array_equal(t.to("f32").numpy()[:3], expected)
        np.testing.assert_array_equal(F.Tensor("d", dtype=name).ones(ctx, (2,)).to("f32").numpy(),
                                      [1.0, 1.0])


def test_f8_and_bf16_take_storage_bits_from_matching_unsigned_arrays(ctx):
    e4 = F.Tensor("d", dtype="f8_e4m3").from_slice(ctx, (2,), np.array([0x38, 0xB8], np.uint8))
    np.testing.assert_array_equal(e4.to("f32").numpy(), [1.0, -1.0])
    bf = F.Tensor("d", dtype="bf16").from_slice(ctx, (1,), np.array([0x3F80], np.uint16))
    assert bf.item() == 1.0
    # a round trip through numpy() (bits) is lossless
    again = F.Tensor("d", dtype="f8_e4m3").from_numpy(ctx, e4.numpy())
    np.testing.assert_array_equal(again.numpy(), e4.numpy())


@pytest.mark.parametrize(("dtype", "values", "bad"), [
    ("u8", [-1, 256], -1),
    ("u8", [0, 256], 256),
    ("i8", [127, 128], 128),
    ("i16", [-32769], -32769),
    ("u16", [65536], 65536),
    ("i32", [2**31], 2**31),
    ("i64", [2**63], 2**63),
    ("i64", [1, 2**70], 2**70),
    ("i64", [-(2**63) - 1], -(2**63) - 1),
])
def test_integer_values_out_of_range_are_value_errors_naming_them(ctx, dtype, values, bad):
    T = F.Tensor("d", dtype=dtype)
    with pytest.raises(ValueError, match=naming("from_slice", "values") + r".*range.*got int "
                       + re.escape(str(bad))):
        T.from_slice(ctx, (len(values),), values)
    with pytest.raises(ValueError, match=naming("from_numpy", "array")):
        T.from_numpy(ctx, np.array(values, dtype=object))
    with pytest.raises(ValueError, match=re.escape(str(bad))):
        ctx.full_typed(dtype, (2,), bad)


def test_integer_values_must_be_exact_integers(ctx):
    I32 = F.Tensor("d", dtype="i32")
    for bad in (1.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=naming("from_slice", "values") + ".*integers"):
            I32.from_slice(ctx, (2,), [1.0, bad])
    np.testing.assert_array_equal(I32.from_slice(ctx, (3,), np.array([1.0, -2.0, 3.0])).numpy(),
                                  [1, -2, 3])
    edge = F.Tensor("d", dtype="i64").from_slice(ctx, (2,), [2**63 - 1, -(2**63)])
    np.testing.assert_array_equal(edge.numpy(), [2**63 - 1, -(2**63)])


def test_wrapping_is_an_explicit_cast(ctx):
    wide = F.Tensor("d", dtype="i64").from_slice(ctx, (3,), [-1, 256, 300])
    np.testing.assert_array_equal(wide.to("u8").numpy(), [255, 0, 44])


def test_fill_values_must_be_real_numbers(ctx):
    with pytest.raises(TypeError, match=naming("full", "value") + ".*got str '3'"):
        T2.full(ctx, (2, 3), "3")
    with pytest.raises(TypeError, match=naming("scalar", "value") + ".*got str 'x'"):
        F.Tensor().scalar(ctx, "x")
    with pytest.raises(TypeError, match=naming("full", "value")):
        T2.full(ctx, (2, 3), True)
    with pytest.raises(ValueError, match=naming("full", "value") + ".*float range"):
        T2.full(ctx, (1, 1), 10**400)
    with pytest.raises(TypeError, match=naming("full_like", "value")):
        T2.zeros(ctx, (1, 1)).full_like(None)
    np.testing.assert_array_equal(T2.full(ctx, (1, 2), np.float64(2.5)).numpy(), [[2.5, 2.5]])
    assert F.Tensor().scalar(ctx, 2**70).item() == np.float32(2.0**70)


def test_values_must_be_numbers(ctx):
    with pytest.raises(TypeError, match=naming("from_slice", "values")):
        T1.from_slice(ctx, (2,), ["1", "2"])
    with pytest.raises(TypeError, match=naming("from_slice", "values")):
        T1.from_slice(ctx, (1,), 3.0)
    with pytest.raises(TypeError, match=naming("from_slice", "values")):
        T1.from_slice(ctx, (1,), [1 + 2j])
    with pytest.raises(F.InvalidDataLength):
        T2.from_slice(ctx, (2, 2), [[1, 2], [3]])


# -- shapes, sizes, counts ----------------------------------------------------------------


def test_shapes_are_sequences_of_positive_ints(ctx):
    for bad in (None, 3, "ab", (2.0, 1), (True, 1), (1, "2")):
        with pytest.raises(TypeError, match=naming("zeros", "shape")):
            T2.zeros(ctx, bad)
    with pytest.raises(F.InvalidShape):
        T2.zeros(ctx, (2, 0))
    with pytest.raises(F.InvalidShape, match="2\\*\\*59"):
        T2.zeros(ctx, (2**40, 2**40))  # refused before any allocation is attempted
    assert T2.zeros(ctx, np.array([2, 3])).shape == (2, 3)
    with pytest.raises(TypeError, match=naming("zeros_typed", "shape")):
        ctx.zeros_typed("f32", None)


def test_split_concat_broadcast_and_roll_arguments(ctx, x):
    with pytest.raises(TypeError, match=naming("split", "sizes") + ".*got bool True"):
        x.split("b", ("p", "q"), True)
    with pytest.raises(F.InvalidShape, match=naming("split", "sizes")):
        x.split("b", ("p", "q"), (2, 0))
    with pytest.raises(TypeError, match=naming("concat", "others") + ".*NoneType"):
        x.concat("a", None)
    for bad in (("x", 6), None, 6, (2, 6.0)):
        with pytest.raises(TypeError, match=naming("broadcast_to", "shape")):
            x.broadcast_to(("a", "b"), bad)
    with pytest.raises(F.InvalidShape, match=naming("broadcast_to", "shape")):
        x.broadcast_to(("a", "b", "c"), (2, 6))
    with pytest.raises(F.InvalidShape, match=naming("broadcast_to", "shape")):
        x.broadcast_to(("a", "b"), (2, -6))
    with pytest.raises(TypeError, match=naming("roll", "shift")):
        x.roll("b", 1.0)
    ref = np.arange(12, dtype=np.float32).reshape(2, 6)
    for shift in (2**70, -(2**70) - 1, np.int64(-7)):
        np.testing.assert_array_equal(x.roll("b", shift).numpy(),
                                      np.roll(ref, int(shift) % 6, axis=1))


def test_view_and_copy_arguments(ctx, x):
    with pytest.raises(TypeError, match=naming("reshape", "new_shape")):
        x.reshape(("r",), "12")
    with pytest.raises(TypeError, match=naming("reshape", "new_shape")):
        x.reshape(("r",), None)
    with pytest.raises(TypeError, match=naming("insert_axis", "axis_index")):
        x.insert_axis("c", None)
    with pytest.raises(TypeError, match=naming("view_with_strides", "strides")):
        x.view_with_strides(("z",), (3,), None)
    with pytest.raises(TypeError, match=naming("slice", "b")):
        x.slice(b=slice("1", None))
    with pytest.raises(TypeError, match=naming("unbind_into", "out")):
        x.unbind_into("a", None)
    with pytest.raises(F.TagError, match="two out_tags"):
        x.select("a", 0).diag_embed("b", ("r",))
    with pytest.raises(F.InvalidShape, match=naming("repeat_axis", "n")):
        x.repeat_axis("a", 2**70)
    with pytest.raises(F.InvalidShape, match=naming("pad", "before")):
        x.pad("a", 2**70, 0)
    with pytest.raises(TypeError, match=naming("pad", "fill")):
        x.pad("a", 1, 1, "x")
    for bad in (None, True, 1.5, (1, 2, "3", 4)):
        with pytest.raises(TypeError, match=naming("zero_pad2d", "padding")):
            x.zero_pad2d("a", "b", bad)
    with pytest.raises(F.InvalidShape):
        x.zero_pad2d("a", "b", 2**62)
    with pytest.raises(TypeError, match=naming("set_slice", "start")):
        x.set_slice("b", 1.0, x.narrow("b", 0, 2))
    with pytest.raises(TypeError, match=naming("zero_slice", "start")):
        x.zero_slice("b", None, 1)
    np.testing.assert_array_equal(x.roll_by("b", [2**62, -(2**63)]).numpy(),
                                  [np.roll(np.arange(6), 2**62 % 6), np.roll(np.arange(6, 12),
                                                                             -(2**63) % 6)])


def test_constructor_arguments(ctx):
    D = F.Tensor("d")
    with pytest.raises(TypeError, match=naming("arange", "end")):
        D.arange(ctx, 0, "3")
    with pytest.raises(F.InvalidShape):
        D.arange(ctx, 0, 1e300, 1e-300)
    with pytest.raises(TypeError, match=naming("linspace", "steps")):
        D.linspace(ctx, 0, 1, 2.0)
    with pytest.raises(TypeError, match=naming("eye", "n")):
        T2.eye(ctx, True)
    with pytest.raises(F.InvalidShape, match=naming("eye", "n")):
        T2.eye(ctx, 2**70)
    with pytest.raises(F.InvalidShape, match=naming("one_hot", "depth")):
        T2.one_hot(ctx, [0], 2**70)
    with pytest.raises(TypeError, match=naming("rand", "seed")):
        T2.rand(ctx, (2, 2), 1.5)
    with pytest.raises(TypeError, match=naming("uniform", "hi")):
        T2.uniform(ctx, (2, 2), 1, 0.0, "1")
    with pytest.raises(TypeError, match=naming("randint", "high")):
        F.Tensor("d", dtype="i64").randint(ctx, (2,), 1, 0, None)
    with pytest.raises(TypeError, match=naming("randperm", "n")):
        F.Tensor("d", dtype="i64").randperm(ctx, "4", 1)
    with pytest.raises(TypeError, match=naming("band_mask", "lower")):
        F.Tensor("r", "c", dtype="bool").band_mask(ctx, (2, 2), 0.5, None)


@pytest.mark.parametrize("make", [
    lambda ctx, n: F.Tensor("d").arange(ctx, 0, n, 1),
    lambda ctx, n: F.Tensor("d").zeros(ctx, (n,)),
    lambda ctx, n: F.Tensor("d").full(ctx, (n,), 1.0),
    lambda ctx, n: F.Tensor("d", dtype="f64").zeros(ctx, (n,)),
    lambda ctx, n: F.Tensor("d").randn(ctx, (n,), 1),
    lambda ctx, n: F.Tensor("d").linspace(ctx, 0, 1, n),
])
def test_huge_constructors_are_shape_or_memory_errors(ctx, make):
    # Fuzzer regression: arange(0, 2**62) passed the element limit (then 2**62), and its
    # float64 temporary of 2**65 bytes was numpy's "array is too big" ValueError.
    for n in (2**62, 2**60):
        with pytest.raises(F.InvalidShape, match="2\\*\\*59|more than any tensor"):
            make(ctx, n)
    for n in (2**59, 2**58):
        with pytest.raises(MemoryError):
            make(ctx, n)


# -- numbers --------------------------------------------------------------------------------


def test_scalar_arguments_name_the_argument(ctx, x):
    with pytest.raises(TypeError, match=naming("scale", "s") + ".*got str '2'"):
        x.scale("2")
    with pytest.raises(ValueError, match=naming("add_scalar", "s")):
        x.add_scalar(10**400)
    with pytest.raises(TypeError, match=naming("sub_scalar", "s")):
        x.sub_scalar(True)
    with pytest.raises(TypeError, match="'\\*\\*' takes a Python number exponent"):
        x ** x
    with pytest.raises(TypeError, match=naming("clamp", "min_value")):
        x.clamp("0", None)
    with pytest.raises(F.TagError, match="ddof"):
        x.variance("a", np.array([0, 1]))
    np.testing.assert_allclose((x * 2**70).numpy(), np.arange(12).reshape(2, 6) * 2.0**70,
                               rtol=1e-6)


def test_integer_operators_have_no_scalar_forms(ctx):
    i = F.Tensor("d", dtype="i32").from_slice(ctx, (3,), [1, 2, 3])
    m = F.Tensor("d", dtype="bool").from_slice(ctx, (3,), [True, False, True])
    no_scalar = "the i32 branch has no scalar forms"
    for use in (lambda: i + 1, lambda: 1 + i, lambda: i * 2.5, lambda: 2 * i, lambda: 7 - i,
                lambda: 7 // i, lambda: 7 % i, lambda: 1 & i, lambda: 1 | i, lambda: 1 ^ i,
                lambda: i + True):
        with pytest.raises(TypeError, match=no_scalar):
            use()
    for use in (lambda: m & True, lambda: True | m, lambda: 1 ^ m):
        with pytest.raises(TypeError, match="the bool branch has no scalar forms"):
            use()
    with pytest.raises(TypeError, match="unsupported operand"):
        i + "1"
    with pytest.raises(TypeError, match="numpy array"):
        i + np.ones(3, np.int32)
    np.testing.assert_array_equal((i + i).numpy(), [2, 4, 6])


def test_integer_compare_with_numbers_is_exact_at_any_magnitude(ctx):
    u = F.Tensor("d", dtype="u8").from_slice(ctx, (3,), [0, 100, 255])
    i = F.Tensor("d", dtype="i64").from_slice(ctx, (3,), [-(2**63), 2, 2**63 - 1])
    nan, inf = float("nan"), float("inf")
    cases = [
        (u, "lt", 300, [True] * 3), (u, "gt", -1, [True] * 3), (u, "eq", 256, [False] * 3),
        (u, "ne", -1, [True] * 3), (u, "le", 254.5, [True, True, False]),
        (u, "gt", 99.5, [False, True, True]), (u, "eq", 100.0, [False, True, False]),
        (u, "eq", 99.5, [False] * 3), (u, "ne", 99.5, [True] * 3),
        (i, "lt", 2**70, [True] * 3), (i, "ge", 2.0**63, [False] * 3),
        (i, "gt", -(2**63) - 1, [True] * 3), (i, "eq", 2**63 - 1, [False, False, True]),
        (i, "lt", 2.5, [True, True, False]), (i, "ge", 2.5, [False, False, True]),
        (i, "lt", nan, [False] * 3), (i, "ne", nan, [True] * 3), (i, "eq", nan, [False] * 3),
        (i, "lt", inf, [True] * 3), (i, "le", -inf, [False] * 3), (i, "gt", -inf, [True] * 3),
    ]
    for t, op, v, want in cases:
        got = t.compare(op, v).numpy()
        np.testing.assert_array_equal(got, want, err_msg=f"{t.dtype} {op} {v}")
        fast = F.compile(lambda t, op=op, v=v: t.compare(op, v))
        np.testing.assert_array_equal(fast(t).numpy(), want, err_msg=f"compiled {op} {v}")
    with pytest.raises(ValueError, match=naming("compare", "other")):
        F.Tensor("d").from_slice(ctx, (1,), [1.0]).compare("lt", 10**400)


def test_half_compare_with_a_number_goes_through_f32(ctx):
    h = F.Tensor("d", dtype="f16").from_slice(ctx, (2,), [65504.0, 1.0])
    # 65519 rounds to 65504 in f16 but not in f32: the comparison must see 65519
    np.testing.assert_array_equal((h < 65519.0).numpy(), [True, True])
    np.testing.assert_array_equal((h >= 65504.5).numpy(), [False, False])
    fast = F.compile(lambda t: t < 65519.0)
    np.testing.assert_array_equal(fast(h).numpy(), [True, True])


# -- a closed context refuses use on every constructor path -----------------------------------


def _constructors(ctx):
    I64 = F.Tensor("d", dtype="i64")
    B = F.Tensor("r", "c", dtype="bool")
    Q = F.Tensor("o", "i", dtype="q8_0")
    raw = F.ExecContext().from_slice((1, 1), [1.0])
    blocks = np.zeros(1, dtype=F.BlockQ8_0)
    arr = np.ones((1, 1), np.float32)
    calls = {
        "from_slice": lambda: T2.from_slice(ctx, (1, 1), [1.0]),
        "from_numpy": lambda: T2.from_numpy(ctx, arr),
        "from_borrowed_slice": lambda: T2.from_borrowed_slice(ctx, (1, 1), arr),
        "from_borrowed_const_slice": lambda: T2.from_borrowed_const_slice(ctx, (1, 1), arr),
        "constant": lambda: T2.constant(ctx, raw),
        "from_tensor": lambda: T2.from_tensor(ctx, raw),
        "variable": lambda: T2.variable(ctx, raw),
        "variable_from_slice": lambda: T2.variable_from_slice(ctx, (1, 1), [1.0]),
        "empty": lambda: T2.empty(ctx, (1, 1)),
        "zeros": lambda: T2.zeros(ctx, (1, 1)),
        "ones": lambda: T2.ones(ctx, (1, 1)),
        "full": lambda: T2.full(ctx, (1, 1), 2.0),
        "scalar": lambda: F.Tensor().scalar(ctx, 2.0),
        "arange": lambda: T1.arange(ctx, 0, 3),
        "linspace": lambda: T1.linspace(ctx, 0, 1, 3),
        "one_hot": lambda: T2.one_hot(ctx, [0], 2),
        "eye": lambda: T2.eye(ctx, 2),
        "rand": lambda: T2.rand(ctx, (1, 1), 1),
        "uniform": lambda: T2.uniform(ctx, (1, 1), 1, 0.0, 1.0),
        "randn": lambda: T2.randn(ctx, (1, 1), 1),
        "normal": lambda: T2.normal(ctx, (1, 1), 1, 0.0, 1.0),
        "bernoulli": lambda: T2.bernoulli(ctx, (1, 1), 1, 0.5),
        "gumbel": lambda: T2.gumbel(ctx, (1, 1), 1),
        "randint": lambda: I64.randint(ctx, (2,), 1, 0, 4),
        "randperm": lambda: I64.randperm(ctx, 3, 1),
        "band_mask": lambda: B.band_mask(ctx, (2, 2), 0, 0),
        "from_blocks": lambda: Q.from_blocks(ctx, (1, 32), blocks),
        "from_storage_slice": lambda: Q.from_storage_slice(ctx, (1, 32), blocks),
        "from_borrowed_blocks": lambda: Q.from_borrowed_blocks(ctx, (1, 32), blocks),
        "ctx.from_slice": lambda: ctx.from_slice((1,), [1.0]),
        "ctx.full_typed": lambda: ctx.full_typed("i32", (1,), 1),
        "ctx.empty_typed": lambda: ctx.empty_typed("u8", (1,)),
    }
    return calls


def test_every_constructor_works_on_an_open_context(ctx):
    for name, make in _constructors(ctx).items():
        assert make() is not None, name


def test_a_closed_context_refuses_every_constructor():
    ctx = F.ExecContext()
    x = T2.ones(ctx, (1, 1))
    ctx.deinit()
    for name, make in _constructors(ctx).items():
        with pytest.raises(F.Deinitialized):
            make()
            pytest.fail(f"{name} built a tensor on a closed context")
    for use in (x.empty_like, x.zeros_like, x.ones_like, lambda: x.full_like(1.0)):
        with pytest.raises(F.Deinitialized):
            use()
