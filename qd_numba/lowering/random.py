"""``qd.random``: one counter-based generator, the same function on every target.

Every number is a pure function of five values, so it does not depend on threads, chunking,
the grid, or the backend (docs/guide/random.md):

* ``key``     64 bits per kernel launch: ``splitmix64(splitmix64(seed) + launch)``, where
  ``launch`` counts the earlier launches, since ``qd.init``, of kernels that call qd.random;
* ``index``   the flat index of the loop iteration (row-major over the iteration space;
  0 in serial code);
* ``stream``  0 for serial code, ``k + 1`` for the k-th top-level loop of the kernel (before
  fusion, so fusing loops does not change their numbers); ``PYTHON_STREAM`` for Python scope;
* ``counter`` how many qd.random calls the same iteration (serial code: the same launch) made
  before this one.

They go through Philox-4x32-10 (Salmon, Moraes, Dror, Shaw, SC'11; the Random123 and cuRAND
generator): counter block ``(index lo, index hi, counter, stream)``, key ``(key lo, key hi)``.
A float uses the first output word (f16: 11 bits, f32: 24 bits) or the first two (f64: 53
bits), scaled into [0, 1) exactly; an integer dtype gets the first word as an int32, cast.

The ``host_*`` functions are the same arithmetic in numpy (Python-scope ``qd.random`` and the
tests); the intrinsics emit it as LLVM IR for the CPU and CUDA targets. The passes insert the
calls (passes/random_streams.py); users never call these directly.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir as llir
from numba.core import cgutils, types
from numba.extending import intrinsic

from ..typing.field import FieldType
from .array_struct import array_struct

PHILOX_M = (0xD2511F53, 0xCD9E8D57)
PHILOX_W = (0x9E3779B9, 0xBB67AE85)
PHILOX_ROUNDS = 10
SPLITMIX_GAMMA = 0x9E3779B97F4A7C15
SPLITMIX_MULS = (0xBF58476D1CE4E5B9, 0x94D049BB133111EB)
PYTHON_STREAM = 0xFFFFFFFF
MASK32, MASK64 = (1 << 32) - 1, (1 << 64) - 1


# -- host (numpy) ----------------------------------------------------------------------------------

def splitmix64(x: int) -> int:
    """The splitmix64 output function of ``x + gamma`` (a bijection of 64-bit words)."""
    z = (x + SPLITMIX_GAMMA) & MASK64
    z = ((z ^ (z >> 30)) * SPLITMIX_MULS[0]) & MASK64
    z = ((z ^ (z >> 27)) * SPLITMIX_MULS[1]) & MASK64
    return z ^ (z >> 31)


def seed_word(seed: int) -> int:
    """What ``qd.init(random_seed=seed)`` stores: the mixed seed (any Python int)."""
    return splitmix64(int(seed) & MASK64)


def host_launch_key(seed: int, launch: int) -> int:
    return splitmix64((seed_word(seed) + launch) & MASK64)


def host_philox(counter, key):
    """Philox-4x32-10 of counter words ``(c0, c1, c2, c3)`` and key words ``(k0, k1)``
    (ints or arrays, broadcast); four uint32 arrays."""
    c = [np.asarray(w, dtype=np.uint64) & np.uint64(MASK32) for w in counter]
    k = [np.asarray(w, dtype=np.uint64) & np.uint64(MASK32) for w in key]
    m0, m1 = np.uint64(PHILOX_M[0]), np.uint64(PHILOX_M[1])
    mask, shift = np.uint64(MASK32), np.uint64(32)
    for r in range(PHILOX_ROUNDS):
        if r:
            k = [(k[0] + np.uint64(PHILOX_W[0])) & mask, (k[1] + np.uint64(PHILOX_W[1])) & mask]
        p0, p1 = m0 * c[0], m1 * c[2]
        c = [(p1 >> shift) ^ c[1] ^ k[0], p1 & mask, (p0 >> shift) ^ c[3] ^ k[1], p0 & mask]
    return [w.astype(np.uint32) for w in c]


def host_random(key: int, index, stream: int, counter, dtype):
    """The values ``qd.random(dtype)`` gives for these inputs (``index``/``counter`` may be arrays)."""
    index = np.asarray(index, dtype=np.int64).view(np.uint64)
    words = host_philox((index & np.uint64(MASK32), index >> np.uint64(32), counter, stream),
                        (key & MASK32, key >> 32))
    return host_value(words, dtype)


def host_value(words, dtype):
    """A numpy array of ``dtype`` values from Philox output words, as the compiled code makes them."""
    x0, x1 = words[0].astype(np.uint64), words[1].astype(np.uint64)
    if isinstance(dtype, types.Integer):
        return words[0].view(np.int32).astype(np.dtype(str(dtype)))
    if dtype.bitwidth == 16:
        return ((x0 >> np.uint64(21)).astype(np.float32) * np.float32(2.0 ** -11)).astype(np.float16)
    if dtype.bitwidth == 32:
        return (x0 >> np.uint64(8)).astype(np.float32) * np.float32(2.0 ** -24)
    bits = ((x0 >> np.uint64(5)) << np.uint64(26)) | (x1 >> np.uint64(6))
    return bits.astype(np.float64) * 2.0 ** -53


# -- compiled code ---------------------------------------------------------------------------------

I32, I64 = llir.IntType(32), llir.IntType(64)


def _splitmix64(builder, x):
    z = builder.add(x, I64(SPLITMIX_GAMMA))
    z = builder.mul(builder.xor(z, builder.lshr(z, I64(30))), I64(SPLITMIX_MULS[0]))
    z = builder.mul(builder.xor(z, builder.lshr(z, I64(27))), I64(SPLITMIX_MULS[1]))
    return builder.xor(z, builder.lshr(z, I64(31)))


def _mulhilo(builder, m, x):
    p = builder.mul(I64(m), builder.zext(x, I64))
    return builder.trunc(builder.lshr(p, I64(32)), I32), builder.trunc(p, I32)


def _philox(builder, c, k):
    """Philox-4x32-10 of i32 counter words ``c`` and key words ``k``: four i32 words."""
    for r in range(PHILOX_ROUNDS):
        if r:
            k = [builder.add(k[0], I32(PHILOX_W[0])), builder.add(k[1], I32(PHILOX_W[1]))]
        hi0, lo0 = _mulhilo(builder, PHILOX_M[0], c[0])
        hi1, lo1 = _mulhilo(builder, PHILOX_M[1], c[2])
        c = [builder.xor(builder.xor(hi1, c[1]), k[0]), lo1, builder.xor(builder.xor(hi0, c[3]), k[1]), lo0]
    return c


@intrinsic
def launch_key(typingctx, state):
    """This launch's key from the generator state ``[seed word, launches]`` (a uint64 field),
    which it advances by one launch. Serial code runs it once per launch, before any task."""
    if not (isinstance(state, FieldType) and state.dtype == types.uint64):
        return None

    def codegen(context, builder, sig, args):
        fty = sig.args[0]
        arr = cgutils.create_struct_proxy(fty)(context, builder, value=args[0]).arr
        data = array_struct(context, builder, fty.array_type, arr).data
        seed_ptr, launch_ptr = builder.gep(data, [I64(0)]), builder.gep(data, [I64(1)])
        launch = builder.load(launch_ptr)
        builder.store(builder.add(launch, I64(1)), launch_ptr)
        return _splitmix64(builder, builder.add(builder.load(seed_ptr), launch))

    return types.uint64(state), codegen


def _uniform(context, builder, words, fp):
    """A float of type ``fp`` in [0, 1) from Philox words (exact: the bits fit the significand)."""
    f32, f64 = llir.FloatType(), llir.DoubleType()
    if fp.bitwidth <= 32:
        bits = 11 if fp.bitwidth == 16 else 24
        value = builder.fmul(builder.uitofp(builder.lshr(words[0], I32(32 - bits)), f32), f32(2.0 ** -bits))
        return context.cast(builder, value, types.float32, fp)
    hi = builder.zext(builder.lshr(words[0], I32(5)), I64)
    lo = builder.zext(builder.lshr(words[1], I32(6)), I64)
    bits = builder.or_(builder.shl(hi, I64(26)), lo)
    return builder.fmul(builder.uitofp(bits, f64), f64(2.0 ** -53))


@intrinsic
def random_at(typingctx, key, index, stream, counter, dtype):
    """``qd.random(dtype)`` at (key, flat iteration index, stream, per-iteration call counter)."""
    if not (isinstance(key, types.Integer) and isinstance(index, types.Integer)
            and isinstance(stream, types.Integer) and isinstance(counter, types.Integer)
            and isinstance(dtype, types.NumberClass)):
        return None
    out = dtype.instance_type
    if not isinstance(out, (types.Integer, types.Float)):
        return None

    def codegen(context, builder, sig, args):
        key_v, index_v, stream_v, counter_v = (context.cast(builder, v, t, types.int64)
                                               for v, t in zip(args[:4], sig.args[:4]))
        words = _philox(builder,
                        [builder.trunc(index_v, I32), builder.trunc(builder.lshr(index_v, I64(32)), I32),
                         builder.trunc(counter_v, I32), builder.trunc(stream_v, I32)],
                        [builder.trunc(key_v, I32), builder.trunc(builder.lshr(key_v, I64(32)), I32)])
        if isinstance(out, types.Integer):
            return context.cast(builder, words[0], types.int32, out)
        return _uniform(context, builder, words, out)

    return out(key, index, stream, counter, dtype), codegen
