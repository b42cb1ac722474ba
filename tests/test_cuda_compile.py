"""Tests of the numba-cuda adapter (qd_numba/targets/cuda/compile.py).

Unmarked tests need no GPU: they compile numba-cuda FunctionIR to cubins through NVVM and
nvJitLink and inspect the ELF and PTX.  Tests marked ``cuda`` load those cubins with cuda.core and
launch them through ``cuda.bindings.driver.cuLaunchKernel`` with a pre-packed argument buffer,
comparing with numpy on random data (run with ``-m cuda`` on a GPU machine).
"""

from __future__ import annotations

import ctypes
import importlib
import math
import operator
import struct
import threading

import numpy as np
import pytest
from llvmlite import ir as llir
from numba.core import cgutils, types
from numba.extending import intrinsic, models, overload, register_model

from qd_numba.errors import QuadrantsCompilationError
from qd_numba.lowering import device
from qd_numba.targets.cuda import compile as cc

if not cc.numba_cuda_importable():  # pragma: no cover - CI without the cuda extra
    pytest.skip("numba-cuda (the 'cuda' extra) is not importable", allow_module_level=True)

import numba  # noqa: E402
from numba import cuda  # noqa: E402

from qd_numba.passes.base import IRTools  # noqa: E402

CUDA_IR = IRTools.for_cuda()

CC = (9, 0)


# ---------------------------------------------------------------------------------------------
# Extensions written against plain numba.extending (no target): the way qd_numba registers its
# types once for every backend.


class _HandleType(types.Type):
    """A minimal field handle: {data: dtype*, n: int64}."""

    def __init__(self, dtype):
        self.dtype = dtype
        super().__init__(name=f"QdTestHandle({dtype})")


@register_model(_HandleType)
class _HandleModel(models.StructModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, [("data", types.CPointer(fe_type.dtype)), ("n", types.int64)])


@intrinsic
def _handle_from_array(typingctx, arr):
    if not (isinstance(arr, types.Array) and arr.ndim == 1):
        return None
    hty = _HandleType(arr.dtype)

    def codegen(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        h = cgutils.create_struct_proxy(sig.return_type)(context, builder)
        h.data = ary.data
        h.n = ary.nitems
        return h._getvalue()

    return hty(arr), codegen


@intrinsic
def _handle_load(typingctx, h, i):
    if not isinstance(h, _HandleType):
        return None

    def codegen(context, builder, sig, args):
        s = cgutils.create_struct_proxy(sig.args[0])(context, builder, value=args[0])
        idx = context.cast(builder, args[1], sig.args[1], types.int64)
        return builder.load(builder.gep(s.data, [idx]))

    return h.dtype(h, i), codegen


@intrinsic
def _handle_store(typingctx, h, i, v):
    if not isinstance(h, _HandleType):
        return None

    def codegen(context, builder, sig, args):
        s = cgutils.create_struct_proxy(sig.args[0])(context, builder, value=args[0])
        idx = context.cast(builder, args[1], sig.args[1], types.int64)
        builder.store(args[2], builder.gep(s.data, [idx]))
        return context.get_dummy_value()

    return types.void(h, i, h.dtype), codegen


@intrinsic
def _handle_len(typingctx, h):
    if not isinstance(h, _HandleType):
        return None

    def codegen(context, builder, sig, args):
        return cgutils.create_struct_proxy(sig.args[0])(context, builder, value=args[0]).n

    return types.int64(h), codegen


@overload(operator.getitem)
def _handle_getitem(h, i):
    if isinstance(h, _HandleType) and isinstance(i, types.Integer):
        return lambda h, i: _handle_load(h, i)


@overload(operator.setitem)
def _handle_setitem(h, i, v):
    if isinstance(h, _HandleType) and isinstance(i, types.Integer):
        return lambda h, i, v: _handle_store(h, i, v)


@overload(len)
def _handle_len_ov(h):
    if isinstance(h, _HandleType):
        return lambda h: _handle_len(h)


def _make_atomic_intrinsic(op):
    @intrinsic
    def _atomic(typingctx, arr, idx, val):
        """``arr[idx] = op(arr[idx], val)`` atomically; returns the old value."""
        if not (isinstance(arr, types.Array) and arr.ndim == 1 and isinstance(idx, types.Integer)):
            return None
        dtype = arr.dtype

        def codegen(context, builder, sig, args):
            assert device.is_cuda_context(context)
            aryty = sig.args[0]
            ary = context.make_array(aryty)(context, builder, args[0])
            i = context.cast(builder, args[1], sig.args[1], types.intp)
            ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [i], wraparound=False)
            signed = not (isinstance(dtype, types.Integer) and not dtype.signed)
            return device.cuda_atomic_rmw(builder, op, ptr, args[2], signed=signed)

        return dtype(arr, idx, dtype), codegen

    return _atomic


_atomic_add = _make_atomic_intrinsic("add")
_atomic_sub = _make_atomic_intrinsic("sub")
_atomic_max = _make_atomic_intrinsic("max")
_atomic_min = _make_atomic_intrinsic("min")


@intrinsic
def _raw_atomicrmw_fadd(typingctx, arr, idx, val):
    """The naive lowering (LLVM ``atomicrmw fadd``), which libNVVM rejects."""
    if not (isinstance(arr, types.Array) and isinstance(arr.dtype, types.Float)):
        return None

    def codegen(context, builder, sig, args):
        aryty = sig.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        i = context.cast(builder, args[1], sig.args[1], types.intp)
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [i], wraparound=False)
        return builder.atomic_rmw("fadd", ptr, args[2], "monotonic")

    return arr.dtype(arr, idx, arr.dtype), codegen


@intrinsic
def _rt_field_ptr(typingctx, ctx, slot, dtype_ref):
    """Base pointer of field ``slot`` read from the runtime context: ``ctx`` is a u64 holding the
    device address of a table of u64 field base pointers."""
    if not (isinstance(ctx, types.Integer) and isinstance(slot, types.Integer)):
        return None
    if not isinstance(dtype_ref, (types.NumberClass, types.DType)):
        return None
    dtype = dtype_ref.instance_type if isinstance(dtype_ref, types.NumberClass) else dtype_ref.dtype
    rtype = types.CPointer(dtype)

    def codegen(context, builder, sig, args):
        i64 = llir.IntType(64)
        table = builder.inttoptr(args[0], i64.as_pointer())
        s = context.cast(builder, args[1], sig.args[1], types.intp)
        base = builder.load(builder.gep(table, [s]))
        base.set_metadata("invariant.load", builder.module.add_metadata([]))
        return builder.inttoptr(base, context.get_value_type(sig.return_type))

    return rtype(ctx, slot, dtype_ref), codegen


@intrinsic
def _ptr_atomic_add(typingctx, ptr, idx, val):
    if not (isinstance(ptr, types.CPointer) and isinstance(idx, types.Integer)):
        return None
    dtype = ptr.dtype

    def codegen(context, builder, sig, args):
        i = context.cast(builder, args[1], sig.args[1], types.intp)
        return device.cuda_atomic_rmw(builder, "add", builder.gep(args[0], [i]), args[2])

    return dtype(ptr, idx, dtype), codegen


@numba.njit
def _njit_inner(x):
    acc = 0.0
    for k in range(3):
        acc += x * (k + 1.5)
    return acc


@numba.njit(fastmath=True)
def _njit_axpy(a, x, y):
    return a * _njit_inner(x) + y * 7.25


# ---------------------------------------------------------------------------------------------
# Kernels (Python bodies go through numba-cuda's frontend, then compile_task_to_cubin)


def _k_njit(x, y, out, a):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = _njit_axpy(a, x[i], y[i])


def _k_handle(h, x, out):
    # h arrives as a 2-param struct; g is built in the kernel from an array
    i = cuda.grid(1)
    g = _handle_from_array(x)
    if i < len(h):
        out[i] = h[i] * 2.0 + g[i]
        h[i] = h[i] + 1.0


def _k_atomic_add(vals, out):
    i = cuda.grid(1)
    if i < vals.shape[0]:
        _atomic_add(out, i % out.shape[0], vals[i])


def _k_atomic_sub(vals, out):
    i = cuda.grid(1)
    if i < vals.shape[0]:
        _atomic_sub(out, i % out.shape[0], vals[i])


def _k_atomic_max(vals, out):
    i = cuda.grid(1)
    if i < vals.shape[0]:
        _atomic_max(out, i % out.shape[0], vals[i])


def _k_atomic_min(vals, out):
    i = cuda.grid(1)
    if i < vals.shape[0]:
        _atomic_min(out, i % out.shape[0], vals[i])


def _k_raw_fadd(vals, out):
    i = cuda.grid(1)
    if i < vals.shape[0]:
        _raw_atomicrmw_fadd(out, 0, vals[i])


def _k_atomic_cuda(vals, out):
    i = cuda.grid(1)
    if i < vals.shape[0]:
        cuda.atomic.add(out, i % out.shape[0], vals[i])


def _k_rtctx(ctx, n):
    # field 0: float32 input, field 1: float32 output, field 2: float64 accumulator[1]
    i = cuda.grid(1)
    if i < n:
        a = _rt_field_ptr(ctx, 0, numba.float32)
        b = _rt_field_ptr(ctx, 1, numba.float32)
        acc = _rt_field_ptr(ctx, 2, numba.float64)
        b[i] = a[i] * 2.0 + 1.0
        _ptr_atomic_add(acc, 0, numba.float64(a[i]))


def _compile_py(fn, argtypes, **kw):
    return cc.compile_task_to_cubin(CUDA_IR.run_frontend(fn), argtypes, **kw)


# Empty task functions: their IR binds the arguments and returns None (what an offload pass starts from)


def _axpy_task(x, y, n):
    return None


def _task_one(a):
    return None


def _task_two(a, b):
    return None


def _task_five(p, a, q, b, r):
    return None


# ---------------------------------------------------------------------------------------------
# A hand-built IR kernel: the empty `_axpy_task(x, y, n)` plus statements an offload pass would add:
#     i = cuda.grid(1); if i < n: x[i] = x[i] * 3.0 + y[i]


def _build_axpy3_ir(scale=3.0):
    ir = CUDA_IR.ir
    fir = CUDA_IR.run_frontend(_axpy_task)
    entry_label = min(fir.blocks)
    entry = fir.blocks[entry_label]
    scope, loc = entry.scope, entry.loc
    # keep the argument bindings, drop the `return None`
    entry.body = [st for st in entry.body if isinstance(st, ir.Assign) and isinstance(st.value, ir.Arg)]
    x, y, n = (scope.get_exact(a) for a in ("x", "y", "n"))

    def emit(block, value, prefix):
        var = scope.redefine(f"$qd_{prefix}", loc)
        block.append(ir.Assign(value, var, loc))
        return var

    g = emit(entry, ir.Global("grid", cuda.grid, loc), "grid")
    one = emit(entry, ir.Const(1, loc), "one")
    i = emit(entry, ir.Expr.call(g, [one], (), loc), "i")
    cond = emit(entry, ir.Expr.binop(operator.lt, i, n, loc), "cond")
    body_label, exit_label = entry_label + 1000, entry_label + 2000
    entry.append(ir.Branch(cond, body_label, exit_label, loc))

    body = ir.Block(scope, loc)
    xi = emit(body, ir.Expr.getitem(x, i, loc), "xi")
    yi = emit(body, ir.Expr.getitem(y, i, loc), "yi")
    k = emit(body, ir.Const(scale, loc), "k")
    prod = emit(body, ir.Expr.binop(operator.mul, xi, k, loc), "prod")
    total = emit(body, ir.Expr.binop(operator.add, prod, yi, loc), "sum")
    body.append(ir.SetItem(x, i, total, loc))
    body.append(ir.Jump(exit_label, loc))

    exit_ = ir.Block(scope, loc)
    none = emit(exit_, ir.Const(None, loc), "none")
    ret = emit(exit_, ir.Expr.cast(none, loc), "ret")
    exit_.append(ir.Return(ret, loc))
    fir.blocks[body_label] = body
    fir.blocks[exit_label] = exit_
    return fir


_AXPY3_TYPES = (types.float64[::1], types.float64[::1], types.int64)


def _cubin_global_functions(cubin):
    """Names of the global function symbols (STB_GLOBAL, STT_FUNC) of an ELF64 little-endian cubin,
    read independently of the adapter's ELF reader."""
    assert cubin[:4] == b"\x7fELF" and cubin[4:6] == b"\x02\x01", "not an ELF64 little-endian image"
    shoff = struct.unpack_from("<Q", cubin, 0x28)[0]
    shentsize, shnum = struct.unpack_from("<HH", cubin, 0x3A)
    # (sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link, sh_info)
    sections = [struct.unpack_from("<IIQQQQII", cubin, shoff + k * shentsize) for k in range(shnum)]
    names = set()
    for _name, sh_type, _flags, _addr, offset, size, link, _info in sections:
        if sh_type != 2:  # SHT_SYMTAB
            continue
        strtab = sections[link][4]
        for k in range(size // 24):
            st_name, st_info = struct.unpack_from("<IB", cubin, offset + 24 * k)
            if st_info == 0x12:  # STB_GLOBAL << 4 | STT_FUNC
                end = cubin.index(b"\0", strtab + st_name)
                names.add(cubin[strtab + st_name : end].decode("ascii"))
    return names


def _assert_cubin(task):
    assert task.cubin[:4] == b"\x7fELF"
    assert task.entry_name in _cubin_global_functions(task.cubin), "no global function symbol for the entry"
    assert f".entry {task.entry_name}" in task.ptx


def _assert_layout_matches_cubin(task):
    assert task.kparams is not None
    got = [(p[1], p[2]) for p in task.kparams]
    want = [(s.offset, s.size) for s in task.param_layout]
    assert got == want


# ---------------------------------------------------------------------------------------------
# GPU-less tests


def test_ir_tools_are_numba_cuda_twins():
    import numba.core.bytecode as core_bytecode
    import numba.core.ir as core_ir

    m = IRTools.for_cuda()
    assert m.flavour == "numba.cuda.core"
    assert m.ir.__name__ == "numba.cuda.core.ir"
    assert m.ir is not core_ir and m.ir.FunctionIR is not core_ir.FunctionIR
    assert m.ir_utils.__name__ == "numba.cuda.core.ir_utils"
    assert m.analysis.__name__ == "numba.cuda.core.analysis"
    assert m.inline.__name__ == "numba.cuda.core.inline_closurecall"
    # derive_ir finds the FunctionIdentity of generated tasks in the flavour's bytecode module
    bytecode = importlib.import_module(m.flavour + ".bytecode")
    assert bytecode.FunctionIdentity is not core_bytecode.FunctionIdentity
    fir = m.run_frontend(_task_five)
    assert isinstance(fir, m.ir.FunctionIR) and fir.arg_count == 5
    args = [st.value.name for b in fir.blocks.values() for st in b.body if isinstance(st.value, m.ir.Arg)]
    assert args == ["p", "a", "q", "b", "r"]


def test_mutated_ir_kernel_compiles_to_cubin():
    task = cc.compile_task_to_cubin(_build_axpy3_ir(3.0), _AXPY3_TYPES, cc=CC)
    _assert_cubin(task)
    assert "axpy_task" in task.entry_name
    # the constant inserted by the "pass" reached the machine code: x*3.0 + y as an FMA
    assert "0d4008000000000000" in task.ptx and "fma.rn.f64" in task.ptx
    assert len(task.param_layout) == 7 + 7 + 1
    assert task.param_buffer_size == 15 * 8
    assert [s.path for s in task.param_layout[:7]] == [
        ("meminfo",),
        ("parent",),
        ("nitems",),
        ("itemsize",),
        ("data",),
        ("shape", 0),
        ("strides", 0),
    ]
    assert task.param_layout[-1].arg_name == "n" and task.param_layout[-1].fmt == "q"
    _assert_layout_matches_cubin(task)
    assert task.nregs is not None and 0 < task.nregs <= 255
    # a different constant gives different code (the mutation is what is compiled)
    other = cc.compile_task_to_cubin(_build_axpy3_ir(5.0), _AXPY3_TYPES, cc=CC)
    assert "0d4014000000000000" in other.ptx and "0d4008000000000000" not in other.ptx


@pytest.mark.parametrize(
    "ty, nslots",
    [
        (types.float32[:, ::1], 9),
        (types.int32[:, :, :], 11),
        (types.float64, 1),
        (types.float32, 1),
        (types.int32, 1),
        (types.uint64, 1),
        (types.boolean, 1),
        (types.int8, 1),
        (types.UniTuple(types.float64, 2), 2),
        (types.Tuple((types.int32, types.float64, types.float32)), 3),
        (_HandleType(types.float32), 2),
    ],
    ids=str,
)
def test_param_layout_matches_cubin(ty, nslots):
    # a mixed signature checks offsets/alignment against what ptxas recorded in .nv.info
    argtypes = (types.int8, ty, types.float32, ty, types.int64)
    fir = CUDA_IR.run_frontend(_task_five)
    task = cc.compile_task_to_cubin(fir, argtypes, cc=CC)
    _assert_cubin(task)
    per_arg = [sum(1 for s in task.param_layout if s.arg_index == k) for k in range(5)]
    assert per_arg == [1, nslots, 1, nslots, 1]
    _assert_layout_matches_cubin(task)


def test_handle_struct_layout_names():
    task = cc.compile_task_to_cubin(CUDA_IR.run_frontend(_task_one), (_HandleType(types.float64),), cc=CC)
    assert [(s.path, s.kind, s.size) for s in task.param_layout] == [
        (("data",), "ptr", 8),
        (("n",), "int", 8),
    ]


def test_njit_callee_compiles_as_device_function():
    sig = (types.float64[::1], types.float64[::1], types.float64[::1], types.float64)
    task = _compile_py(_k_njit, sig, cc=CC)
    _assert_cubin(task)
    # 7.25 (from the njit callee) and 1.5 (from its njit callee) are in the code
    assert "0d401D000000000000" in task.ptx.upper().replace("0D", "0d")
    assert "0d3FF8000000000000" in task.ptx.upper().replace("0D", "0d") or "0d4004000000000000" in task.ptx
    _assert_layout_matches_cubin(task)


def _libdevice_calls(ptx: str) -> bool:
    return "__nv_" in ptx


def _k_sin(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = math.sin(x[i]) * math.exp(x[i])


@pytest.mark.parametrize("fastmath", [False, True], ids=["precise", "fastmath"])
def test_nvvm_without_libdevice_gives_numba_cudas_ptx(monkeypatch, fastmath):
    """A task whose IR declares only intrinsics PTX has instructions for reaches NVVM without
    libdevice (``task_ptx``); its PTX is numba-cuda's own, with libdevice, byte for byte. A task
    calling a math function (``__nv_*``) takes numba-cuda's path, and its PTX has libdevice's code
    inlined (no call left)."""
    from numba.cuda.cudadrv import nvvm

    added = []
    original = nvvm.CompilationUnit.lazy_add_module
    monkeypatch.setattr(nvvm.CompilationUnit, "lazy_add_module",
                        lambda self, buf: (added.append(len(buf)), original(self, buf))[1])
    plain = cc.lower_task(_build_axpy3_ir(3.0), _AXPY3_TYPES, cc=CC, fastmath=fastmath)
    assert not cc.needs_libdevice(plain.library.llvm_strs)
    ours = plain.finish()
    assert added == []
    plain.library._ptx_cache.clear()
    assert plain.library.get_asm_str(cc=plain.ccn) == ours.ptx and len(added) == 1
    with_math = cc.lower_task(CUDA_IR.run_frontend(_k_sin), (types.float64[::1], types.float64[::1]), cc=CC,
                              fastmath=fastmath)
    assert cc.needs_libdevice(with_math.library.llvm_strs)
    compiled = with_math.finish()
    assert len(added) == 2 and not _libdevice_calls(compiled.ptx)
    _assert_cubin(compiled)


def test_nvvm_rejecting_a_tasks_ir_is_our_error_with_nvvms_log():
    """``task_ptx`` runs no separate verifier: NVVM's compile rejects bad IR itself, and the
    error carries its log (numba-cuda's error gives the status code alone)."""
    from types import SimpleNamespace

    plain = cc.lower_task(_build_axpy3_ir(3.0), _AXPY3_TYPES, cc=CC)
    (good,) = plain.library.llvm_strs
    bad = good + 'define void @"qd_bad"(i32* %p) {\n  %x = load i32, i32* %p\n  store i64 %x, i32* %p\n  ret void\n}\n'
    lib = SimpleNamespace(_nvvm_options=dict(plain.library._nvvm_options), llvm_strs=[bad], _lto=False,
                          _ptx_cache={})
    with pytest.raises(QuadrantsCompilationError, match="NVVM rejected a task's IR: .*'%x' defined with type 'i32'"):
        cc.task_ptx(lib, plain.ccn)
    lib.llvm_strs = [good]
    assert cc.task_ptx(lib, plain.ccn) == plain.finish().ptx


def test_libdevice_check_reads_every_declaration():
    ir = 'declare i32 @"llvm.nvvm.read.ptx.sreg.tid.x"()\ndeclare void @llvm.memset.p0i8.i64(i8*, i8, i64, i1)\n'
    assert not cc.needs_libdevice([ir])
    assert cc.needs_libdevice([ir + "declare double @__nv_sin(double)\n"])
    assert cc.needs_libdevice([ir, 'declare float @"llvm.pow.f32"(float, float)\n'])
    assert cc.needs_libdevice(["declare i32 @vprintf(i8*, i8*)\n"])
    assert not cc.needs_libdevice(['define void @"k"() {\n  call void @"__nv_x"()\n  ret void\n}\n'])


@numba.njit
def _njit_np_math(x):
    return np.sqrt(abs(x)) + np.exp(-x * x) + np.log1p(abs(x))


def _k_np_math(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = _njit_np_math(x[i])


@pytest.mark.parametrize("dtype", [types.float32, types.float64], ids=str)
def test_njit_callee_with_numpy_ufuncs(dtype):
    cc.install_cuda_ufunc_math_fallbacks()
    assert cc.install_cuda_ufunc_math_fallbacks() == []  # idempotent
    task = _compile_py(_k_np_math, (dtype[::1], dtype[::1]), cc=CC)
    _assert_cubin(task)
    assert "sqrt.rn.f" in task.ptx


def test_offline_device_patch_does_not_leak():
    _compile_py(_k_njit, (types.float64[::1],) * 3 + (types.float64,), cc=CC)
    import numba.cuda.dispatcher as d

    if cc.cuda_available():
        pytest.skip("a driver is present: no patch is installed")
    # outside compile_task_to_cubin, numba-cuda still reports that there is no device
    with pytest.raises(Exception, match="(?i)driver|cuda"):
        d.get_current_device()


def test_custom_type_with_plain_numba_extending():
    sig = (_HandleType(types.float32), types.float32[::1], types.float32[::1])
    task = _compile_py(_k_handle, sig, cc=CC)
    _assert_cubin(task)
    assert [s.arg_name for s in task.param_layout] == ["h", "h"] + ["x"] * 7 + ["out"] * 7
    _assert_layout_matches_cubin(task)


def test_overload_with_cpu_target_is_rejected():
    # negative control: the CUDA typing context filters target="cpu" registrations
    @numba.extending.overload(len, target="cpu")
    def _cpu_only_len(h):
        if isinstance(h, _CpuOnlyType):
            return lambda h: 1

    class _CpuOnlyType(types.Type):
        def __init__(self):
            super().__init__(name="QdTestCpuOnly")

    register_model(_CpuOnlyType)(models.OpaqueModel)

    def k(h, out):
        out[0] = len(h)

    with pytest.raises(numba.core.errors.TypingError):
        _compile_py(k, (_CpuOnlyType(), types.int64[::1]), cc=CC)


_ATOMIC_DTYPES = [types.float32, types.float64, types.int32, types.int64, types.uint32]
_ATOMIC_KERNELS = {
    "add": _k_atomic_add,
    "sub": _k_atomic_sub,
    "max": _k_atomic_max,
    "min": _k_atomic_min,
    "cuda.atomic.add": _k_atomic_cuda,
}
_PTX_TYPE = {
    types.float32: "f32",
    types.float64: "f64",
    types.int32: "s32",
    types.int64: "s64",
    types.uint32: "u32",
}


def _atomic_ptx_lines(ptx):
    return [
        ln.strip()
        for ln in ptx.splitlines()
        if ln.strip().startswith(("atom.", "red.", "@")) and ("atom." in ln or "red." in ln)
    ]


@pytest.mark.parametrize("dtype", _ATOMIC_DTYPES, ids=str)
@pytest.mark.parametrize("op", list(_ATOMIC_KERNELS))
def test_atomic_rmw_compiles(op, dtype):
    task = _compile_py(_ATOMIC_KERNELS[op], (dtype[::1], dtype[::1]), cc=CC)
    _assert_cubin(task)
    lines = _atomic_ptx_lines(task.ptx)
    assert lines, "no atomic instruction in the PTX"
    base = "add" if op in ("add", "sub", "cuda.atomic.add") else op  # PTX has no atom.sub: add(-v)
    pt = _PTX_TYPE[dtype]
    if base == "add" and pt.startswith("s"):
        pt = "u" + pt[1:]  # ptxas spells integer add as .u32/.u64
    if base in ("max", "min") and dtype in (types.float32, types.float64):
        # numba-cuda's float max/min helpers are CAS loops
        assert any("cas.b" in ln for ln in lines), lines
    else:
        assert any(f".{base}.{pt}" in ln for ln in lines), lines


def test_raw_atomicrmw_fadd_is_rejected_by_nvvm():
    # libNVVM's IR parser predates `atomicrmw fadd`: the reason cuda_atomic_rmw exists.  If this
    # starts passing, a newer libNVVM accepts it and cuda_atomic_rmw could emit it directly.
    with pytest.raises(QuadrantsCompilationError, match="NVVM rejected a task's IR: .*atomicrmw"):
        _compile_py(_k_raw_fadd, (types.float32[::1], types.float32[::1]), cc=CC)


def test_runtime_context_field_pointer():
    task = _compile_py(_k_rtctx, (types.uint64, types.int64), cc=CC)
    _assert_cubin(task)
    assert [(s.arg_name, s.fmt) for s in task.param_layout] == [("ctx", "Q"), ("n", "q")]
    # table loads are marked invariant: NVVM turns them into non-coherent (read-only) loads
    assert "ld.global.nc.u64" in task.ptx or "ld.global.nc.b64" in task.ptx
    assert "atom.global.add.f64" in task.ptx or "red.global.add.f64" in task.ptx


def test_compile_options_reach_the_code():
    fir = lambda: CUDA_IR.run_frontend(_k_njit)  # noqa: E731
    sig = (types.float64[::1],) * 3 + (types.float64,)
    lb = cc.compile_task_to_cubin(fir(), sig, cc=CC, launch_bounds=128)
    assert ".maxntid 128" in lb.ptx
    li = cc.compile_task_to_cubin(fir(), sig, cc=CC, lineinfo=True)
    assert ".loc" in li.ptx
    regs = cc.compile_task_to_cubin(fir(), sig, cc=CC, max_registers=24)
    assert regs.nregs is not None and regs.nregs <= 24
    sm80 = cc.compile_task_to_cubin(fir(), sig, cc=(8, 0))
    assert ".target sm_80" in sm80.ptx
    assert ".target sm_90" in cc.compile_task_to_cubin(fir(), sig, cc=CC).ptx


def test_bad_inputs_raise():
    import numba.core.compiler as core_compiler

    with pytest.raises(TypeError, match="arguments"):
        cc.compile_task_to_cubin(CUDA_IR.run_frontend(_task_two), (types.int64,), cc=CC)
    with pytest.raises(TypeError, match="FunctionIR"):
        cc.compile_task_to_cubin(core_compiler.run_frontend(_k_njit), (types.float64,) * 4, cc=CC)
    with pytest.raises(TypeError, match="Numba types"):
        cc.compile_task_to_cubin(CUDA_IR.run_frontend(_task_one), (np.float64,), cc=CC)


def test_concurrent_compiles():
    results, errors = {}, []

    def work(k):
        try:
            if k % 2:  # device-function compiles go through the offline-device patch when no driver
                sig = (types.float64[::1],) * 3 + (types.float64,)
                results[k] = _compile_py(_k_njit, sig, cc=CC)
            else:
                results[k] = cc.compile_task_to_cubin(_build_axpy3_ir(float(k + 2)), _AXPY3_TYPES, cc=CC)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(results) == 6 and all(r.cubin[:4] == b"\x7fELF" for r in results.values())


# ---------------------------------------------------------------------------------------------
# GPU tests: load the cubin with cuda.core and launch through cuLaunchKernel


def _check(res):
    err, *rest = res if isinstance(res, tuple) else (res,)
    from cuda.bindings import driver as cu

    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"CUDA driver error {err}")
    return rest[0] if len(rest) == 1 else rest


def _as_cukernel(handle):
    from cuda.bindings import driver as cu

    return handle if isinstance(handle, cu.CUkernel) else cu.CUkernel(int(handle))


def _param_info(kernel):
    return [
        (int(p.offset), int(p.size)) if hasattr(p, "offset") else (int(p[0]), int(p[1]))
        for p in kernel.arguments_info
    ]


def _pack_cells(layout, values):
    """One ctypes cell per ``.param`` slot of the production layout (typed by the slot's ``fmt``,
    with LaunchPlan's table) and the ``void*[]`` of their addresses that ``cuLaunchKernel`` takes."""
    from qd_numba.targets.cuda.plan import _CTYPES

    assert len(values) == len(layout), f"{len(layout)} kernel params, {len(values)} values"
    cells = [_CTYPES[slot.fmt](value) for slot, value in zip(layout, values, strict=True)]
    argv = (ctypes.c_void_p * max(1, len(cells)))(*map(ctypes.addressof, cells))
    return cells, argv


class _Gpu:
    """Bare cuda.bindings memory helpers on the primary context made current by cuda.core."""

    def __init__(self):
        from cuda.bindings import driver as cu
        from cuda.core import Device

        self.cu = cu
        self.dev = Device(0)
        self.dev.set_current()
        self.allocs = []

    def to_device(self, a):
        a = np.ascontiguousarray(a)
        ptr = int(_check(self.cu.cuMemAlloc(max(1, a.nbytes))))
        _check(self.cu.cuMemcpyHtoD(ptr, a.ctypes.data, a.nbytes))
        self.allocs.append(ptr)
        return ptr

    def to_host(self, ptr, like):
        out = np.empty_like(like)
        _check(self.cu.cuMemcpyDtoH(out.ctypes.data, ptr, out.nbytes))
        return out

    def launch(self, task, values, nthreads, block=128):
        from cuda.core import ObjectCode

        kernel = ObjectCode.from_cubin(task.cubin).get_kernel(task.entry_name)
        fn = _check(self.cu.cuKernelGetFunction(_as_cukernel(kernel.handle)))
        nregs = _check(
            self.cu.cuFuncGetAttribute(self.cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS, fn)
        )
        assert task.nregs == nregs
        cells, argv = _pack_cells(task.param_layout, values)
        grid = max(1, (nthreads + block - 1) // block)
        _check(self.cu.cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, self.cu.CUstream(0), ctypes.addressof(argv), 0))
        _check(self.cu.cuCtxSynchronize())
        del cells, argv  # referenced until the launch returned

    def close(self):
        for p in self.allocs:
            self.cu.cuMemFree(p)


@pytest.fixture
def gpu():
    if not cc.cuda_available():
        pytest.skip("no CUDA driver/device")
    g = _Gpu()
    yield g
    g.close()


def _arr(gpu, a):
    """The 5+2N slot values of an array argument copied to the device: meminfo, parent, nitems,
    itemsize, data, shape, strides (bytes), as LaunchPlan writes them."""
    return [0, 0, a.size, a.itemsize, gpu.to_device(a), *a.shape, *a.strides]


@pytest.mark.cuda
def test_gpu_mutated_ir_kernel(gpu):
    rng = np.random.default_rng(0)
    n = 1000
    x, y = rng.standard_normal(n + 37), rng.standard_normal(n + 37)
    task = cc.compile_task_to_cubin(_build_axpy3_ir(3.0), _AXPY3_TYPES, cc=CC)
    vx = _arr(gpu, x)
    gpu.launch(task, vx + _arr(gpu, y) + [n], n + 37)
    got = gpu.to_host(vx[4], x)
    want = x.copy()
    want[:n] = x[:n] * 3.0 + y[:n]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.cuda
def test_gpu_njit_callee(gpu):
    rng = np.random.default_rng(1)
    n = 777
    x, y = rng.standard_normal(n), rng.standard_normal(n)
    out = np.zeros(n)
    sig = (types.float64[::1],) * 3 + (types.float64,)
    task = _compile_py(_k_njit, sig, cc=CC)
    vo = _arr(gpu, out)
    gpu.launch(task, _arr(gpu, x) + _arr(gpu, y) + vo + [0.5], n)
    want = 0.5 * (x * 1.5 + x * 2.5 + x * 3.5) + y * 7.25
    np.testing.assert_allclose(gpu.to_host(vo[4], out), want, rtol=1e-10, atol=1e-10)


@pytest.mark.cuda
def test_gpu_njit_numpy_ufuncs(gpu):
    cc.install_cuda_ufunc_math_fallbacks()
    rng = np.random.default_rng(5)
    n = 500
    x = rng.standard_normal(n)
    out = np.zeros(n)
    task = _compile_py(_k_np_math, (types.float64[::1], types.float64[::1]), cc=CC)
    vo = _arr(gpu, out)
    gpu.launch(task, _arr(gpu, x) + vo, n)
    want = np.sqrt(abs(x)) + np.exp(-x * x) + np.log1p(abs(x))
    np.testing.assert_allclose(gpu.to_host(vo[4], out), want, rtol=1e-12, atol=1e-12)


@pytest.mark.cuda
def test_gpu_custom_type(gpu):
    rng = np.random.default_rng(2)
    n = 300
    h = rng.standard_normal(n).astype(np.float32)
    x = rng.standard_normal(n).astype(np.float32)
    out = np.zeros(n, np.float32)
    task = _compile_py(_k_handle, (_HandleType(types.float32), types.float32[::1], types.float32[::1]), cc=CC)
    hp = gpu.to_device(h)
    vo = _arr(gpu, out)
    gpu.launch(task, [hp, n] + _arr(gpu, x) + vo, n)
    np.testing.assert_allclose(gpu.to_host(vo[4], out), h * 2.0 + x, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(gpu.to_host(hp, h), h + 1.0, rtol=1e-6, atol=1e-6)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", _ATOMIC_DTYPES, ids=str)
@pytest.mark.parametrize("op", list(_ATOMIC_KERNELS))
def test_gpu_atomic_rmw(gpu, op, dtype):
    rng = np.random.default_rng(3)
    n, bins = 20000, 7
    np_dtype = np.dtype(str(dtype))
    if np_dtype.kind == "f":
        vals = rng.standard_normal(n).astype(np_dtype)
        init = rng.standard_normal(bins).astype(np_dtype)
    elif np_dtype.kind == "u":
        vals = rng.integers(0, 1000, n).astype(np_dtype)
        init = rng.integers(0, 10**6, bins).astype(np_dtype) + np_dtype.type(10**8)
    else:
        vals = rng.integers(-1000, 1000, n).astype(np_dtype)
        init = rng.integers(-1000, 1000, bins).astype(np_dtype)
    task = _compile_py(_ATOMIC_KERNELS[op], (dtype[::1], dtype[::1]), cc=CC)
    vo = _arr(gpu, init)
    gpu.launch(task, _arr(gpu, vals) + vo, n, block=256)
    got = gpu.to_host(vo[4], init)
    groups = [vals[k::bins] for k in range(bins)]
    if op in ("add", "cuda.atomic.add"):
        want = init.astype(np.float64) + np.array([g.astype(np.float64).sum() for g in groups])
    elif op == "sub":
        want = init.astype(np.float64) - np.array([g.astype(np.float64).sum() for g in groups])
    elif op == "max":
        want = np.maximum(init, np.array([g.max() for g in groups], np_dtype)).astype(np.float64)
    else:
        want = np.minimum(init, np.array([g.min() for g in groups], np_dtype)).astype(np.float64)
    if np_dtype.kind == "f" and op not in ("max", "min"):
        tol = 1e-3 if np_dtype == np.float32 else 1e-10
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol * 10)
    else:
        np.testing.assert_array_equal(got.astype(np.float64), want)


@pytest.mark.cuda
def test_gpu_runtime_context(gpu):
    rng = np.random.default_rng(4)
    n = 4096
    a = rng.standard_normal(n).astype(np.float32)
    b = np.zeros(n, np.float32)
    acc = np.zeros(1, np.float64)
    pa, pb, pacc = gpu.to_device(a), gpu.to_device(b), gpu.to_device(acc)
    table = np.array([pa, pb, pacc], dtype=np.uint64)
    ctx = gpu.to_device(table)
    task = _compile_py(_k_rtctx, (types.uint64, types.int64), cc=CC)
    gpu.launch(task, [ctx, n], n)
    np.testing.assert_allclose(gpu.to_host(pb, b), a * 2.0 + 1.0, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(gpu.to_host(pacc, acc)[0], a.astype(np.float64).sum(), rtol=1e-9)


@pytest.mark.cuda
def test_gpu_layout_matches_driver(gpu):
    from cuda.core import ObjectCode

    task = _compile_py(_k_handle, (_HandleType(types.float32), types.float32[::1], types.float32[::1]), cc=CC)
    kernel = ObjectCode.from_cubin(task.cubin).get_kernel(task.entry_name)
    info = _param_info(kernel)
    assert info == [(s.offset, s.size) for s in task.param_layout]


def test_all_zero_bytes_checks_every_chunk_and_the_sign_of_zero():
    from qd_numba.targets.cuda.runtime import _all_zero_bytes

    rng = np.random.default_rng(5)
    a = np.zeros((37, 11), np.float32)
    assert _all_zero_bytes(a, chunk=64)
    for flat in rng.integers(0, a.size, 5):
        b = a.copy()
        b.reshape(-1)[flat] = rng.uniform(0.5, 1.0)
        assert not _all_zero_bytes(b, chunk=64)
    a[-1, -1] = -0.0                       # equal to zero, not zero bytes
    assert not _all_zero_bytes(a, chunk=64)
    assert _all_zero_bytes(np.zeros(0, np.int64))
    assert _all_zero_bytes(np.zeros((), np.float64)) and not _all_zero_bytes(np.ones((), np.float64))
