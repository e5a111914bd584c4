"""The tag algebra: pure functions on tuples of axis names.

Every rule about result tags lives here and nowhere else: spec
normalization, uniqueness and rank checks, alignment maps, pointwise and dot
result tags, einsum roles, split/merge rewrites. Nothing here knows about
sizes, strides, dtypes or data; every violation is a :class:`TagError` whose
message names the offending tag and the tags that were available.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .argnames import explain
from .errors import TagError

MAX_RANK = 8

#: Axis-map sentinel: "no source axis here, inject a size-1 stride-0 axis".
INSERTED = -1

Tags = tuple[str, ...]


def _fmt(tags: Sequence[str]) -> str:
    return "(" + ", ".join(repr(t) for t in tags) + ")"


def auto_tags(rank: int) -> Tags:
    """Tags of a numeric-rank spec: ``('_0', '_1', ...)``."""
    if isinstance(rank, bool) or not isinstance(rank, int):
        raise TagError(f"tensor tags must be a tag tuple or a rank, got {rank!r}")
    if rank < 0:
        raise TagError(f"tensor rank must be non-negative, got {rank}")
    if rank > MAX_RANK:
        raise TagError(f"too many tensor tags: rank {rank} exceeds the maximum {MAX_RANK}")
    return tuple(f"_{i}" for i in range(rank))


def check_tag(tag: object) -> str:
    """Validate one tag: a string that is a Python identifier."""
    if not isinstance(tag, str):
        raise TagError(explain(tag, "a tag name (str)"))
    if not tag.isidentifier():
        raise TagError(f"a tensor tag must be a Python identifier string, got {tag!r}")
    return tag


def normalize_tags(spec: object) -> Tags:
    """Normalize a tag spec (a tuple/list of names, one name, or a rank) to a tuple."""
    if isinstance(spec, str):
        return check_tags((spec,))
    if isinstance(spec, int) and not isinstance(spec, bool):
        return auto_tags(spec)
    if isinstance(spec, (tuple, list)):
        return check_tags(tuple(spec))
    raise TagError(explain(spec, "a tag tuple or a rank"))


def check_tags(tags: Iterable[object]) -> Tags:
    """Validate a tag tuple: identifiers, unique, at most MAX_RANK."""
    out = tuple(check_tag(t) for t in tags)
    seen: set[str] = set()
    for t in out:
        if t in seen:
            raise TagError(f"duplicate tensor tag {t!r} in {_fmt(out)}")
        seen.add(t)
    if len(out) > MAX_RANK:
        raise TagError(
            f"too many tensor tags: {len(out)} in {_fmt(out)} (the maximum is {MAX_RANK})"
        )
    return out


def raw_rank(tag_count: int) -> int:
    """Raw storage rank: scalars (no tags) are stored as rank-1 ``[1]``."""
    return 1 if tag_count == 0 else tag_count


def index(tags: Sequence[str], tag: str) -> int:
    """Axis position of ``tag``; TagError naming the available tags if absent."""
    try:
        return tags.index(tag)
    except ValueError:
        if not isinstance(tag, str):
            raise TagError(explain(tag, "a tag name (str)")) from None
        raise TagError(f"tensor tag not found: {tag!r} (available: {_fmt(tags)})") from None


def find(tags: Sequence[str], tag: str) -> int | None:
    """Axis position of ``tag`` or None."""
    try:
        return tags.index(tag)
    except ValueError:
        return None


def check_same_set(source: Sequence[str], target: Sequence[str]) -> None:
    """Permutation precondition: the same tags, in any order."""
    if len(source) != len(target):
        raise TagError(
            f"permutation requires the same rank: {_fmt(target)} vs tensor tags {_fmt(source)}"
        )
    for t in target:
        if t not in source:
            raise TagError(
                f"permutation target must contain the same tags: {t!r} is not in {_fmt(source)}"
            )


def align_axes(source: Sequence[str], target: Sequence[str]) -> tuple[int, ...]:
    """For each target tag, its source axis or INSERTED; target must cover source."""
    target = check_tags(target)
    for t in source:
        if t not in target:
            raise TagError(
                f"target tags must include all source tags: {t!r} is missing from {_fmt(target)}"
            )
    return tuple(source.index(t) if t in source else INSERTED for t in target)


def remove_tags(tags: Sequence[str], removed: Sequence[str]) -> Tags:
    """``tags`` without ``removed`` (each must exist, no repeats)."""
    removed = check_tags(removed) if removed else ()
    for t in removed:
        index(tags, t)
    return tuple(t for t in tags if t not in removed)


def replace_tag(tags: Sequence[str], old: str, new: str) -> Tags:
    """Rename ``old`` to ``new`` in place."""
    i = index(tags, old)
    check_tag(new)
    if new != old and new in tags:
        raise TagError(f"replacement tensor tag already exists: {new!r} in {_fmt(tags)}")
    return tuple(tags[:i]) + (new,) + tuple(tags[i + 1 :])


def insert_tag(tags: Sequence[str], tag: str, axis_index: int) -> Tags:
    """Insert a new tag at position ``axis_index`` (0..rank)."""
    check_tag(tag)
    if not 0 <= axis_index <= len(tags):
        raise TagError(
            f"insert axis out of bounds: index {axis_index} for tags {_fmt(tags)}"
        )
    if tag in tags:
        raise TagError(f"inserted tensor tag already exists: {tag!r} in {_fmt(tags)}")
    return check_tags(tuple(tags[:axis_index]) + (tag,) + tuple(tags[axis_index:]))


def split_tags(tags: Sequence[str], tag: str, parts: Sequence[str]) -> Tags:
    """Replace ``tag`` by the factor tags ``parts``."""
    i = index(tags, tag)
    parts = check_tags(parts)
    if not parts:
        raise TagError(f"split of {tag!r} needs at least one output tag")
    for p in parts:
        if p != tag and p in tags:
            raise TagError(f"split output tag already exists: {p!r} in {_fmt(tags)}")
    return check_tags(tuple(tags[:i]) + parts + tuple(tags[i + 1 :]))


def merge_start(tags: Sequence[str], merged: Sequence[str]) -> int:
    """First axis of a contiguous, in-order run of ``merged`` tags."""
    merged = check_tags(merged)
    if not merged:
        raise TagError("merge needs at least one tag")
    start = index(tags, merged[0])
    if start + len(merged) > len(tags):
        raise TagError(
            f"merge tags must be contiguous: {_fmt(merged)} runs past the end of {_fmt(tags)}"
        )
    for k, t in enumerate(merged):
        if tags[start + k] != t:
            index(tags, t)
            raise TagError(
                f"merge tags must be contiguous and in tensor order: {_fmt(merged)} in {_fmt(tags)}"
            )
    return start


def merge_tags(tags: Sequence[str], out_tag: str, merged: Sequence[str]) -> Tags:
    """Replace the contiguous run ``merged`` by ``out_tag``."""
    start = merge_start(tags, merged)
    check_tag(out_tag)
    kept = tuple(tags[:start]) + tuple(tags[start + len(merged) :])
    if out_tag in kept:
        raise TagError(f"merge output tag already exists: {out_tag!r} in {_fmt(tags)}")
    return tuple(tags[:start]) + (out_tag,) + tuple(tags[start + len(merged) :])


def union(left: Sequence[str], right: Sequence[str]) -> Tags:
    """Left tags, then right-only tags (a set union kept in operand order)."""
    return tuple(left) + tuple(t for t in right if t not in left)


def pointwise_result(left: Sequence[str], right: Sequence[str]) -> Tags:
    """Pointwise result tags: the union in operand order, capped at MAX_RANK."""
    out = union(left, right)
    if len(out) > MAX_RANK:
        raise TagError(
            f"too many tensor tags: pointwise result {_fmt(out)} exceeds rank {MAX_RANK}"
        )
    return out


def dot_parts(left: Sequence[str], right: Sequence[str], contract: str) -> tuple[Tags, Tags, Tags]:
    """(batch, left free, right free) tags of a contraction over ``contract``."""
    index(left, contract)
    index(right, contract)
    batch = tuple(t for t in left if t != contract and t in right)
    lfree = tuple(t for t in left if t != contract and t not in right)
    rfree = tuple(t for t in right if t != contract and t not in left)
    return batch, lfree, rfree


def dot_result(left: Sequence[str], right: Sequence[str], contract: str) -> Tags:
    """Dot result tags: batch ++ left free ++ right free."""
    batch, lfree, rfree = dot_parts(left, right, contract)
    out = batch + lfree + rfree
    if len(out) > MAX_RANK:
        raise TagError(f"too many tensor tags: dot result {_fmt(out)} exceeds rank {MAX_RANK}")
    return out


def einsum_validate(left: Sequence[str], right: Sequence[str], out: Sequence[str]) -> Tags:
    """Check an einsum's output tags: unique, each present in an operand, within rank."""
    out = check_tags(out)
    for t in out:
        if t not in left and t not in right:
            raise TagError(
                f"einsum output tag {t!r} is in neither operand "
                f"(left {_fmt(left)}, right {_fmt(right)})"
            )
    return out


def einsum_role(tag: str, own: Sequence[str], other: Sequence[str], out: Sequence[str]) -> str:
    """Role of an operand axis from the shared x kept table.

    shared & kept: 'batch'; shared & dropped: 'contract'; private & kept:
    'free'; private & dropped: 'summed'.
    """
    shared = tag in other
    kept = tag in out
    if shared:
        return "batch" if kept else "contract"
    return "free" if kept else "summed"


def einsum_many_validate(operands: Sequence[Sequence[str]], out: Sequence[str]) -> Tags:
    """Check an N-ary einsum's output tags against the union of operand tags."""
    out = check_tags(out)
    for t in out:
        if not any(t in tags for tags in operands):
            raise TagError(
                f"einsum output tag {t!r} is in no operand "
                f"({', '.join(_fmt(t2) for t2 in operands)})"
            )
    return out


#: The tags ``grouped_attention`` requires of its query and of its keys/values.
ATTENTION_Q_TAGS: Tags = ("seq", "head", "d")
ATTENTION_KV_TAGS: Tags = ("seq", "kv_head", "d")


def attention_result(q: Sequence[str], out_tag: str) -> Tags:
    """``grouped_attention`` result tags ``(seq, out_tag)``; q is exactly (seq, head, d)."""
    if tuple(q) != ATTENTION_Q_TAGS:
        raise TagError(f"grouped_attention: the query must be tagged {_fmt(ATTENTION_Q_TAGS)}, "
                       f"got {_fmt(q)}")
    return check_tags(("seq", out_tag))


def attention_kv(name: str, tags: Sequence[str]) -> None:
    """Keys and values of ``grouped_attention`` are exactly (seq, kv_head, d)."""
    if tuple(tags) != ATTENTION_KV_TAGS:
        raise TagError(f"grouped_attention: {name} must be tagged {_fmt(ATTENTION_KV_TAGS)}, "
                       f"got {_fmt(tags)}")


def rope_axes(tags: Sequence[str], position_tag: str, feature_tag: str) -> tuple[int, int]:
    """Axis positions of a RoPE's position and feature tags (distinct, both present)."""
    p, f = index(tags, position_tag), index(tags, feature_tag)
    if p == f:
        raise TagError(f"rope: the position and feature tags are both {position_tag!r}")
    return p, f


def softmax_query_axis(tags: Sequence[str], tag: str, query_tag: str) -> int:
    """Axis of a fused causal softmax's query tag (present, not the softmax tag)."""
    q = index(tags, query_tag)
    if query_tag == tag:
        raise TagError(f"softmax causal: query_tag {query_tag!r} is the softmax tag itself")
    return q
# -- convolution windows: the trailing axes are the window's, the rest are batch -----------


def check_window_rank(tags: Sequence[str], n_in: int, op: str) -> None:
    """A windowed op needs its ``n_in`` window axes at the end of ``tags``."""
    if len(tags) < n_in:
        raise TagError(f"{op} needs at least {n_in} axes (the trailing ones are its window "
                       f"axes), got {_fmt(tags)}")


def window_result(tags: Sequence[str], n_in: int, out_tags: object, n_out: int,
                  op: str) -> Tags:
    """Result tags of a windowed op over the last ``n_in`` axes (channel-last).

    Leading axes are batch axes and keep their tags; the window axes become
    ``out_tags`` (``n_out`` of them). Example: conv2d maps ``(b, h, w, c)``
    with out tags ``(oh, ow, oc)`` to ``(b, oh, ow, oc)``.
    """
    tags = tuple(tags)
    check_window_rank(tags, n_in, op)
    out = normalize_tags(out_tags)
    if len(out) != n_out:
        raise TagError(f"{op} takes {n_out} out tags, got {_fmt(out)}")
    lead = tags[: len(tags) - n_in]
    for t in out:
        if t in lead:
            raise TagError(f"{op} out tag {t!r} is already a batch axis of {_fmt(tags)}")
    return check_tags(lead + out)


def check_trailing(tags: Sequence[str], trailing: Sequence[str], op: str) -> None:
    """The last axes of ``tags`` must be ``trailing``, in order (channel-last storage)."""
    tags, trailing = tuple(tags), tuple(trailing)
    for t in trailing:
        index(tags, t)
    if tags[len(tags) - len(trailing):] != trailing:
        raise TagError(f"{op} needs {_fmt(trailing)} as the trailing axes, in that order; "
                       f"got {_fmt(tags)}")


def check_exact(tags: Sequence[str], expected: Sequence[str], what: str) -> None:
    """An operand whose type the op fixes (a conv weight) must carry exactly ``expected``."""
    expected = tuple(check_tag(t) for t in expected)  # an array compared with == is ambiguous
    if tuple(tags) != expected:
        raise TagError(f"{what} must be tagged {_fmt(expected)}, got {_fmt(tags)}")


def conv1d_result(tags: Sequence[str], time_tag: str, in_tag: str, out_tag: str,
                  op: str) -> Tags:
    """A 1-D conv over ``(..., time, in)``: the channel axis becomes ``out_tag``."""
    check_trailing(tags, (time_tag, in_tag), op)
    lead = tuple(tags)[:-1]
    check_tag(out_tag)
    if out_tag in lead:
        raise TagError(f"{op} out tag {out_tag!r} is already an axis of {_fmt(tags)}")
    return lead + (out_tag,)
