"""Python and numpy interop (API.md section 7): from_numpy, np.asarray, bool/float/int,
len/ndim/size, operators on the integer and bool branches, shape checks, repr."""

import numpy as np
import pytest

import fucina as F


@pytest.fixture
def x(ctx):
    return F.Tensor("a", "b").from_slice(ctx, (2, 3), [1, 2, 3, 4, 5, 6])


# -- from_numpy and the shape rule ----------------------------------------------------


def test_from_numpy_takes_shape_and_values_from_the_array(ctx):
    arr = np.arange(12, dtype=np.float64).reshape(3, 4) / 4
    t = F.Tensor("r", "c").from_numpy(ctx, arr)
    assert t.shape == (3, 4) and t.dtype is F.f32
    np.testing.assert_array_equal(t.numpy(), arr.astype(np.float32))
    arr[0, 0] = 99  # a copy: later edits to the array do not show through
    assert t.numpy()[0, 0] == 0


@pytest.mark.parametrize("dtype,np_dtype", [("i64", np.int64), ("i32", np.int32),
                                            ("u8", np.uint8), ("bool", np.bool_),
                                            ("f64", np.float64), ("f16", np.float16)])
def test_from_numpy_on_typed_branches(ctx, dtype, np_dtype):
    arr = (np.arange(6).reshape(2, 3) % 3).astype(np_dtype)
    t = F.Tensor("r", "c", dtype=dtype).from_numpy(ctx, arr)
    assert t.numpy().dtype == np_dtype
    np.testing.assert_array_equal(t.numpy(), arr)


def test_from_numpy_bf16_converts_values(ctx):
    t = F.Tensor("d", dtype="bf16").from_numpy(ctx, np.array([1.5, -2.0, 3.0e4]))
    np.testing.assert_array_equal(t.to("f32").numpy(), [1.5, -2.0, 29952.0])


def test_from_numpy_scalar_type_takes_a_0d_array(ctx):
    s = F.Tensor().from_numpy(ctx, np.array(2.5))
    assert s.item() == 2.5 and s.shape == (1,)


def test_from_numpy_rejects_wrong_rank_and_type(ctx):
    T = F.Tensor("r", "c")
    with pytest.raises(F.ShapeMismatch, match="2 axes, the array has 1"):
        T.from_numpy(ctx, np.zeros(4))
    with pytest.raises(TypeError, match="argument 'array' expects a numpy array, got list"):
        T.from_numpy(ctx, [[1.0, 2.0]])
    with pytest.raises(TypeError, match="expects an ExecContext"):
        T.from_numpy(np.zeros((1, 1)), ctx)
    with pytest.raises(F.InvalidShape):
        T.from_numpy(ctx, np.zeros((0, 3)))
    assert not hasattr(F.Tensor("r", "c", dtype="q8_0"), "from_numpy")


def test_multidimensional_array_of_another_shape_is_shape_mismatch(ctx):
    T = F.Tensor("r", "c")
    arr = np.arange(6, dtype=np.float32).reshape(3, 2)
    with pytest.raises(F.ShapeMismatch, match=r"\(3, 2\).*\(2, 3\)"):
        T.from_slice(ctx, (2, 3), arr)
    with pytest.raises(F.ShapeMismatch):
        T.variable_from_slice(ctx, (2, 3), arr)
    with pytest.raises(F.ShapeMismatch):
        T.from_slice(ctx, (2, 3), [[1, 2], [3, 4], [5, 6]])
    with pytest.raises(F.ShapeMismatch):
        T.from_borrowed_slice(ctx, (2, 3), arr)
    with pytest.raises(F.ShapeMismatch):
        T.from_borrowed_const_slice(ctx, (2, 3), arr)
    # the exact shape, a flat array and a flat list of the right length are all fine
    for values in (arr.reshape(2, 3), arr.reshape(-1), list(range(6))):
        t = T.from_slice(ctx, (2, 3), values)
        np.testing.assert_array_equal(t.numpy(), np.arange(6).reshape(2, 3))
    b = T.from_borrowed_slice(ctx, (2, 3), arr.reshape(2, 3))
    assert np.shares_memory(b.data_const(), arr)


# -- np.asarray ------------------------------------------------------------------------


def test_asarray_is_a_read_only_view_without_conversion(x):
    a = np.asarray(x)
    np.testing.assert_array_equal(a, [[1, 2, 3], [4, 5, 6]])
    assert a.dtype == np.float32 and not a.flags.writeable
    assert np.shares_memory(a, x.data_const())


def test_asarray_copies_when_asked_or_converting(x):
    c = np.array(x)  # np.array copies by default
    assert c.flags.writeable and not np.shares_memory(c, x.data_const())
    c[0, 0] = 42
    assert x.numpy()[0, 0] == 1
    d = np.asarray(x, dtype=np.float64)
    assert d.dtype == np.float64 and d[1, 2] == 6
    with pytest.raises(ValueError, match="without a copy"):
        np.asarray(x, dtype=np.float64, copy=False)


def test_asarray_follows_the_logical_layout(x):
    t = x.permute_to("b", "a")
    np.testing.assert_array_equal(np.asarray(t), [[1, 4], [2, 5], [3, 6]])
    s = x.slice(b=slice(None, None, 2))
    np.testing.assert_array_equal(np.asarray(s), [[1, 3], [4, 6]])


def test_numpy_functions_accept_tensors(x):
    assert np.sum(np.asarray(x)) == 21
    assert float(np.max(np.asarray(x))) == 6.0
    # Directly, as any array-like: numpy's reductions called the tensor's own sum/max/
    # squeeze with its axis= keyword (TypeError "unexpected keyword argument 'axis'").
    assert np.sum(x) == 21 and np.mean(x) == 3.5 and np.max(x) == 6.0 and np.min(x) == 1.0
    np.testing.assert_array_equal(np.sum(x, axis=1), np.asarray(x).sum(axis=1))
    np.testing.assert_array_equal(np.squeeze(x), np.asarray(x))
    np.testing.assert_array_equal(np.concatenate([x, x]), np.vstack([np.asarray(x)] * 2))
    assert np.any(x > 5.0) and not np.all(x > 5.0)
    with pytest.raises(TypeError, match="does not support ufuncs"):
        np.add(x, 1.0)  # ufuncs still defer to the tensor's operators (__array_ufunc__)


# -- bool / float / int / len / ndim / size -------------------------------------------------


def test_one_element_conversions(x):
    loss = x.sum_all()
    assert float(loss) == 21.0 and int(loss) == 21 and bool(loss) is True
    assert bool(loss < 0) is False  # `if loss < 0:` no longer always takes the branch
    taken = "yes" if loss > 20 else "no"
    assert taken == "yes"
    half = x.scale(0.45).sum_all()  # 9.45
    assert int(half) == 9 and int(x.scale(-0.45).sum_all()) == -9
    z = F.Tensor("d").from_slice(x._ctx, (1,), [0.0])
    assert bool(z) is False and bool(F.Tensor().scalar(x._ctx, float("nan"))) is True


def test_conversions_of_other_dtypes(ctx):
    b = F.Tensor("d", dtype="bf16").from_slice(ctx, (1,), [2.5])
    assert float(b) == 2.5 and b.item() == 2.5
    i = F.Tensor(dtype="i64", rank=0).from_slice(ctx, (1,), [-7])
    assert int(i) == -7 and float(i) == -7.0
    m = F.Tensor("d", dtype="bool").from_slice(ctx, (1,), [True])
    assert bool(m) is True and int(m) == 1


def test_conversions_need_one_element(x):
    for conv in (bool, float, int):
        with pytest.raises(ValueError, match="one-element tensor.*6 elements"):
            conv(x)
    with pytest.raises(ValueError, match="non-finite"):
        int(F.Tensor().scalar(x._ctx, float("inf")))


def test_len_ndim_size(ctx, x):
    assert len(x) == 2 and x.ndim == 2 and x.size == 6
    s = x.sum_all()
    assert s.ndim == 0 and s.size == 1
    with pytest.raises(TypeError, match="len\\(\\) of a scalar"):
        len(s)
    q = F.Tensor("r", "c", dtype="q8_0").from_blocks(ctx, (2, 32), np.zeros(2, F.BlockQ8_0))
    assert len(q) == 2 and q.size == 64 and q.ndim == 2
    with pytest.raises(ValueError):
        bool(q)


# -- operators on the integer and bool branches ---------------------------------------------


def _ints(ctx, dtype, values):
    return F.Tensor("k", dtype=dtype).from_slice(ctx, (len(values),), values)


def test_integer_operators_match_numpy(ctx):
    a_np = np.array([7, -7, 5, 3, -8], np.int32)
    b_np = np.array([2, 2, -3, 3, 3], np.int32)
    a, b = _ints(ctx, "i32", a_np), _ints(ctx, "i32", b_np)
    for got, want in [(a + b, a_np + b_np), (a - b, a_np - b_np), (a * b, a_np * b_np),
                      (a // b, a_np // b_np), (a % b, a_np % b_np), (a & b, a_np & b_np),
                      (a | b, a_np | b_np), (a ^ b, a_np ^ b_np), (a < b, a_np < b_np),
                      (a >= b, a_np >= b_np)]:
        np.testing.assert_array_equal(got.numpy(), want)
    assert (a + b).dtype is F.i32 and (a < b).dtype is F.bool_


def test_integer_operators_wrap(ctx):
    a = _ints(ctx, "i8", [100, -100])
    np.testing.assert_array_equal((a + a).numpy(), [-56, 56])
    u = _ints(ctx, "u8", [250, 3])
    np.testing.assert_array_equal((u * u).numpy(), [36, 9])


def test_integer_operators_reject_numbers_and_absent_ops(ctx):
    a = _ints(ctx, "i64", [1, 2])
    with pytest.raises(TypeError, match="'\\+' on i64 tensors takes another i64 tensor"):
        a + 1
    with pytest.raises(TypeError):
        a / a  # no true division on integers
    with pytest.raises(TypeError):
        _ = ~a  # no bitwise not on the integer branch
    with pytest.raises(TypeError):
        _ = -a


def test_bool_operators_are_the_logical_ops(ctx):
    p_np = np.array([True, True, False, False])
    q_np = np.array([True, False, True, False])
    p = F.Tensor("k", dtype="bool").from_slice(ctx, (4,), p_np)
    q = F.Tensor("k", dtype="bool").from_slice(ctx, (4,), q_np)
    for got, want in [(~p, ~p_np), (p & q, p_np & q_np), (p | q, p_np | q_np),
                      (p ^ q, p_np ^ q_np)]:
        assert got.dtype is F.bool_
        np.testing.assert_array_equal(got.numpy(), want)
    with pytest.raises(TypeError, match="bool tensor"):
        p & True
    with pytest.raises(TypeError):
        p + q  # no arithmetic on masks


def test_masks_from_comparisons_combine(ctx, x):
    m = (x > 1) & (x < 6)
    np.testing.assert_array_equal(m.numpy(), [[False, True, True], [True, True, False]])
    np.testing.assert_array_equal((~m).numpy(), ~m.numpy())


# -- float operators and numpy operands --------------------------------------------------------


def test_numpy_scalars_are_numbers_and_arrays_are_refused(x):
    np.testing.assert_array_equal((np.float32(2) * x).numpy(), 2 * x.numpy())
    np.testing.assert_array_equal((x - np.float64(1)).numpy(), x.numpy() - 1)
    with pytest.raises(TypeError, match="T.from_numpy"):
        np.ones((2, 3), np.float32) + x
    with pytest.raises(TypeError, match="T.from_numpy"):
        x * np.ones(3)
    with pytest.raises(TypeError, match="unsupported operand"):
        x + [1, 2, 3]
    with pytest.raises(TypeError, match="must name its tag"):
        x @ x


# -- repr --------------------------------------------------------------------------------------


def test_repr_small_tensor(x):
    assert repr(x) == ("tensor([[1., 2., 3.],\n"
                       "        [4., 5., 6.]], tags=('a', 'b'), shape=(2, 3), "
                       "requires_grad=False)")


def test_repr_shows_requires_grad_and_dtype(ctx):
    w = F.Tensor("o").variable_from_slice(ctx, (2,), [0.5, -1])
    assert repr(w) == "tensor([ 0.5, -1. ], tags=('o',), shape=(2,), requires_grad=True)"
    i = F.Tensor("k", dtype="i64").from_slice(ctx, (3,), [1, -2, 3])
    assert repr(i) == ("tensor([ 1, -2,  3], tags=('k',), shape=(3,), dtype='i64', "
                       "requires_grad=False)")
    s = F.Tensor().scalar(ctx, 3.5)
    assert repr(s) == "tensor(3.5, tags=(), shape=(1,), requires_grad=False)"


def test_repr_half_and_fp8_show_values_not_bits(ctx):
    vals = [1.5, -2.25, 448.0]
    b = F.Tensor("d", dtype="bf16").from_slice(ctx, (3,), vals)
    h = F.Tensor("d", dtype="f16").from_slice(ctx, (3,), vals)
    e = F.Tensor("d").from_slice(ctx, (3,), vals).to("f8_e4m3")
    for t in (b, h, e):
        assert repr(t).startswith("tensor([  1.5 ,  -2.25, 448.  ]"), repr(t)
        assert f"dtype='{t.dtype.value}'" in repr(t)


def test_repr_summarizes_large_tensors_like_numpy(ctx):
    arr = np.arange(5000, dtype=np.float32).reshape(50, 100)
    t = F.Tensor("r", "c").from_numpy(ctx, arr)
    text = repr(t)
    body = text[len("tensor("):text.index(", tags=")]
    assert body == np.array2string(arr, separator=", ", prefix="tensor(")
    assert "..." in text and len(text) < 2000
    big = F.Tensor("r", "c", dtype="bf16").from_numpy(ctx, arr)
    rounded = big.to("f32").numpy()  # bf16 keeps 8 significant bits: 4999 -> 4992
    text = repr(big)
    assert text[len("tensor("):text.index(", tags=")] == np.array2string(
        rounded, separator=", ", prefix="tensor(")
    assert "4.992e+03" in text


def test_repr_of_released_traced_and_block_tensors(ctx, x):
    y = x.scale(1.0)
    y.deinit()
    assert repr(y) == "tensor(<deinit'ed>, tags=('a', 'b'))"
    seen = []

    def fn(t):
        seen.append(repr(t))
        return t.scale(2.0)

    F.compile(fn)(x)
    assert seen[0].startswith("tensor(<traced>, tags=('a', 'b'), shape=(2, 3)")
    q = F.Tensor("r", "c", dtype="q8_0").from_blocks(ctx, (2, 64), np.zeros(4, F.BlockQ8_0))
    assert repr(q).startswith("tensor(<4 q8_0 blocks>, tags=('r', 'c'), shape=(2, 64)")
