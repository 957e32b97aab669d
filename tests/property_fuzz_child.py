"""Child process of tests/test_property_fuzz.py: a hypothesis search over one public
function's inputs (shapes with zero and huge extents, zero/negative strides, dtypes,
read-only flags, NumPy or fastmetal.Array, out=). Prints each case before running it, so
that when the process dies the parent can say which case killed it.

Properties: only TypeError / ValueError / MemoryError come out; memory the caller gave
read-only is never written; exact ops (negative, add) give NumPy's values."""
from __future__ import annotations

import os
import sys

import numpy as np
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

import fastmetal as fm

ALLOWED = (TypeError, ValueError, MemoryError)
HUGE = (2**38, 2**40, 2**62)  # never allocatable: fails fast instead of filling memory
DTYPES = (np.float32, np.float16, np.float64, np.int32, np.bool_)


@st.composite
def arrays(draw, max_dims=4, allow_huge=True):
    """(array, description): a view of a small base with any strides, or a zero-stride view
    with small, zero or huge extents; sometimes read-only, sometimes a fastmetal.Array."""
    ndim = draw(st.integers(0, max_dims))
    dtype = draw(st.sampled_from(DTYPES))
    kind = draw(st.sampled_from(["view", "view", "view", "broadcast"]))
    if kind == "broadcast":
        extents = [draw(st.sampled_from((0, 1, 3) + (HUGE if allow_huge else ()))) for _ in range(ndim)]
        try:  # NumPy refuses views whose element count overflows
            arr = np.broadcast_to(np.asarray(1.5).astype(dtype), tuple(extents))
            if draw(st.booleans()):  # a writable zero-stride view (as_strided lets one exist)
                base = np.ones(1, dtype)
                arr = np.lib.stride_tricks.as_strided(base, shape=tuple(extents),
                                                      strides=(0,) * ndim, writeable=True)
        except ValueError:
            reject()
    else:
        extents = [draw(st.sampled_from((0, 1, 2, 3, 5))) for _ in range(ndim)]
        steps = [draw(st.sampled_from((1, 1, 2, -1, -2))) for _ in range(ndim)]
        base = (np.arange(int(np.prod([e * abs(s) or 1 for e, s in zip(extents, steps)])))
                % 7 - 3).astype(dtype)
        base = base.reshape([e * abs(s) or 1 for e, s in zip(extents, steps)])
        arr = base[tuple(slice(None, None, s) if e else slice(0, 0) for e, s in zip(extents, steps))]
        arr = arr[tuple(slice(0, e) for e in extents)]
        if ndim > 1 and draw(st.booleans()):
            arr = arr.transpose(draw(st.permutations(range(ndim))))
    readonly = draw(st.booleans())
    if readonly and arr.flags.writeable:
        arr = arr.view()
        arr.flags.writeable = False
    as_fm = draw(st.booleans()) and arr.dtype in (np.float32, np.float16)
    desc = f"{'Array' if as_fm else 'ndarray'}{arr.shape} {arr.dtype} strides={arr.strides} ro={not arr.flags.writeable}"
    return arr, as_fm, desc


def snapshot(arr):
    return None if arr.size > 10_000 or arr.size == 0 else (arr.copy(), arr)


def unchanged(snap):
    if snap is None:
        return True
    before, arr = snap
    return np.array_equal(before, arr, equal_nan=True)


def wrap(arr, as_fm):
    return fm.asarray(arr) if as_fm else arr


def call(name, draw):
    """Draws the arguments of `name`, calls it, checks the properties."""
    fn = getattr(fm, name)
    if name in ("empty", "zeros", "ones"):
        shape = draw(st.lists(st.sampled_from((0, 1, 3) + HUGE + (-1,)), max_size=4))
        dtype = draw(st.sampled_from(("float32", "float16", "float64", "int8")))
        print("CASE", name, shape, dtype, flush=True)
        try:
            a = fn(tuple(shape), dtype=dtype)
        except ALLOWED:
            return
        assert a.shape == tuple(shape) and a.nbytes == int(np.prod(shape)) * a.dtype.itemsize
        return
    x, xfm, xd = draw(arrays())
    snaps = [snapshot(x)]
    try:  # fm.asarray is public too: a size the device cannot hold may raise here
        args = [wrap(x, xfm)]
    except ALLOWED:
        return
    desc = [xd]
    kwargs = {}
    out_writable = None
    if name in BINARY:
        y, yfm, yd = draw(arrays())
        snaps.append(snapshot(y))
        try:
            args.append(wrap(y, yfm))
        except ALLOWED:
            return
        desc.append(yd)
    if name in UNARY + BINARY and draw(st.booleans()):
        o, ofm, od = draw(arrays(allow_huge=False))
        out_writable = o.flags.writeable and all(s != 0 or n <= 1 for s, n in zip(o.strides, o.shape))
        if not out_writable:
            snaps.append(snapshot(o))
        kwargs["out"] = wrap(o, ofm)
        desc.append("out=" + od)
    if name == "fourier_series":
        args += [[0.0, 1.0, 0.5], [0.0, -1.0, 0.25]]
    if name in ("conv2d",):
        args.append(draw(st.sampled_from([np.ones((1, 1, 1, 1), np.float32),
                                          np.ones((2, 1, 2, 2), np.float32)])))
    if name == "conv2d_backward":
        g, gfm, gd = draw(arrays())
        try:
            args = [wrap(g, gfm)] + args
        except ALLOWED:
            return + [np.ones((1, 1, 1, 1), np.float32)]
        desc.insert(0, gd)
    print("CASE", name, " | ".join(desc), flush=True)
    try:
        result = fn(*args, **kwargs)
    except ALLOWED:
        result = None
    for s in snaps:
        assert unchanged(s), f"{name} wrote into memory given read-only: {desc}"
    if result is not None and name in ("negative", "add") and "out" not in kwargs:
        # NumPy's own result (bool + bool is logical or; integers wrap), then as float64
        with np.errstate(all="ignore"):
            ref = (np.negative(x) if name == "negative" else np.add(x, y)).astype(np.float64)
        if ref.size <= 10_000:
            np.testing.assert_allclose(np.asarray(result, np.float64), ref, rtol=1e-3)


from fastmetal.ops.elementwise import BINARY, UNARY  # noqa: E402 (the op table's names)


def main(name: str, examples: int) -> None:
    @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def run(data):
        call(name, data.draw)

    with np.errstate(all="ignore"):
        run()
    print("DONE", name, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
