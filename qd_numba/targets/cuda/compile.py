"""The numba-cuda adapter: every private numba-cuda touch point of qd_numba lives here.

numba-cuda 0.30 vendors its own copy of Numba's core (``numba.cuda.core``: IR classes, pass
manager, type inference); ``qd_numba.passes.base.IRTools.for_cuda()`` is that module set for
qd_numba's IR passes.  :func:`compile_task_to_cubin` turns a (rewritten) numba-cuda
``FunctionIR`` plus Numba argument types into a cubin through NVVM and nvJitLink, with no driver
and no GPU needed, and reports how the Numba arguments flatten into the kernel's ``.param`` list
so that a launcher (``targets/cuda/plan.py``'s ``LaunchPlan``) can pre-pack them.

Pinned stack: ``numba-cuda==0.30.4`` (cu13 wheels) on ``numba 0.68``; the private names used are
listed in ``docs/cuda_internals.md``.  numba-cuda is imported lazily: importing this module never
fails, calling into it raises ``ImportError`` when numba-cuda is missing.

GPU-less compilation of device functions (``@numba.njit`` callees and ``@overload``
implementations) needs ``get_current_device()``; without a driver it raises.  When, and only
when, no usable driver exists, a wrapper is installed once over
``numba.cuda.dispatcher.get_current_device`` that answers a fake device carrying the compute
capability being compiled for, but only on the thread that is inside
:func:`compile_task_to_cubin`; every other call goes to the original function.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import struct
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ... import profiler
from ...errors import QuadrantsCompilationError
from ...lowering import device
from ...lowering.array_struct import remember_abi_sizes

__all__ = [
    "CompiledCudaTask",
    "DeviceCodegen",
    "LoweredTask",
    "ParamSlot",
    "compile_task_to_cubin",
    "cuda_available",
    "install_cuda_ufunc_math_fallbacks",
    "lower_task",
    "numba_cuda_importable",
]


# ---------------------------------------------------------------------------------------------
# Availability


def numba_cuda_importable() -> bool:
    """True when ``numba.cuda`` (numba-cuda) imports; never raises."""
    try:
        # numba-cuda itself: Numba's older built-in numba.cuda (no numba.cuda.core) is not enough
        from numba.cuda.compiler import run_frontend  # noqa: F401
        from numba.cuda.core import ir  # noqa: F401
    except Exception:
        return False
    return True


@functools.cache
def cuda_available() -> bool:
    """True when a CUDA driver is present and sees at least one device; never raises.

    Cached per process (driver availability does not change while a process runs).
    """
    try:
        from numba import cuda

        if not cuda.is_available():
            return False
        return len(cuda.gpus) > 0
    except BaseException:  # CudaSupportError, ImportError, OSError from dlopen, ...
        return False


# ---------------------------------------------------------------------------------------------
# Kernel parameter layout


_PTR_SLOT = ("ptr", 8, "Q")


@dataclass(frozen=True)
class ParamSlot:
    """One kernel ``.param`` produced by flattening a Numba argument.

    ``path`` names the member inside the argument (``("data",)``, ``("shape", 1)``, ``(0,)`` for a
    tuple element, ``()`` for a scalar).  ``kind`` is ``"int"``, ``"uint"``, ``"float"`` or ``"ptr"``;
    ``fmt`` is the :mod:`struct` code to pack the value; ``offset`` is its byte offset in the
    kernel's parameter buffer (natural alignment, as ptxas lays out ``.param`` space)."""

    index: int
    arg_index: int
    arg_name: str
    path: tuple[Any, ...]
    numba_type: str
    llvm_type: str
    kind: str
    size: int
    fmt: str
    offset: int


def _leaf_info(llty: Any, fe_type: Any) -> tuple[str, int, str]:
    from llvmlite import ir as llir
    from numba.core import types

    if isinstance(llty, llir.PointerType):
        return _PTR_SLOT
    if isinstance(llty, llir.IntType):
        width = llty.width
        size = max(1, width // 8)
        signed = True
        if isinstance(fe_type, types.Boolean) or width == 1:
            signed = False
        elif isinstance(fe_type, types.Integer):
            signed = fe_type.signed
        elif isinstance(fe_type, (types.RawPointer, types.CPointer, types.MemInfoPointer)):
            return ("ptr", size, "Q")
        codes = {1: "b", 2: "h", 4: "i", 8: "q"}
        code = codes[size]
        return ("int" if signed else "uint", size, code if signed else code.upper())
    if isinstance(llty, llir.HalfType):
        return ("float", 2, "e")
    if isinstance(llty, llir.FloatType):
        return ("float", 4, "f")
    if isinstance(llty, llir.DoubleType):
        return ("float", 8, "d")
    raise TypeError(f"unsupported kernel parameter LLVM type {llty} (Numba type {fe_type})")


def _flatten_model(
    model: Any, argty: Any, path: tuple[Any, ...]
) -> Iterator[tuple[tuple[Any, ...], Any, Any]]:
    """Yield (path, llvm type, numba type) for each primitive param of one data model."""
    if isinstance(argty, (tuple, list)):
        if len(argty) == 0:
            return
        fields: Sequence[Any] | None = None
        submodels: Sequence[Any] | None = None
        if hasattr(model, "_fields") and hasattr(model, "_models") and len(model._models) == len(argty):
            fields, submodels = model._fields, model._models
        elif hasattr(model, "_elem_model") and getattr(model, "_count", None) == len(argty):
            fields, submodels = range(len(argty)), [model._elem_model] * len(argty)
        elif hasattr(model, "_proxied_model"):
            yield from _flatten_model(model._proxied_model, argty, path)
            return
        if submodels is None:
            for i, sub in enumerate(argty):
                yield from _flatten_model(None, sub, path + (i,))
            return
        for name, sub_model, sub in zip(fields, submodels, argty, strict=True):
            yield from _flatten_model(sub_model, sub, path + (name,))
        return
    yield path, argty, getattr(model, "fe_type", None)


def _param_layout(target_context: Any, argtypes: Sequence[Any], arg_names: Sequence[str]) -> list[ParamSlot]:
    dmm = target_context.data_model_manager
    slots: list[ParamSlot] = []
    offset = 0
    for ai, (ty, aname) in enumerate(zip(argtypes, arg_names, strict=True)):
        model = dmm.lookup(ty)
        for path, llty, fe in _flatten_model(model, model.get_argument_type(), ()):
            kind, size, fmt = _leaf_info(llty, fe)
            offset = (offset + size - 1) // size * size
            slots.append(
                ParamSlot(
                    index=len(slots),
                    arg_index=ai,
                    arg_name=aname,
                    path=path,
                    numba_type=str(fe if fe is not None else ty),
                    llvm_type=str(llty),
                    kind=kind,
                    size=size,
                    fmt=fmt,
                    offset=offset,
                )
            )
            offset += size
    return slots


# ---------------------------------------------------------------------------------------------
# cubin inspection (a minimal ELF64 reader)


def _elf_sections(blob: bytes) -> list[tuple[str, int, int, int, int, int]]:
    """(name, type, offset, size, link, info) of each section of an ELF64 little-endian image."""
    if blob[:4] != b"\x7fELF" or blob[4] != 2 or blob[5] != 1:
        raise ValueError("not an ELF64 little-endian image")
    e_shoff = struct.unpack_from("<Q", blob, 0x28)[0]
    e_shentsize, e_shnum, e_shstrndx = struct.unpack_from("<HHH", blob, 0x3A)
    raw = []
    for i in range(e_shnum):
        off = e_shoff + i * e_shentsize
        sh_name, sh_type, _fl, _addr, sh_offset, sh_size, sh_link, sh_info = struct.unpack_from(
            "<IIQQQQII", blob, off
        )
        raw.append((sh_name, sh_type, sh_offset, sh_size, sh_link, sh_info))
    strtab_off = raw[e_shstrndx][2]

    def cstr(base: int, idx: int) -> str:
        end = blob.index(b"\0", base + idx)
        return blob[base + idx : end].decode("ascii", "replace")

    return [(cstr(strtab_off, r[0]), *r[1:]) for r in raw]


def _elf_symbol_names(cubin: bytes) -> list[str]:
    """The name of each ``.symtab`` entry of a cubin, indexed by symbol index."""
    secs = _elf_sections(cubin)
    out: list[str] = []
    for _name, typ, off, size, link, _info in secs:
        if typ != 2:  # SHT_SYMTAB
            continue
        stroff = secs[link][2]
        for k in range(size // 24):
            st_name = struct.unpack_from("<I", cubin, off + 24 * k)[0]
            end = cubin.index(b"\0", stroff + st_name)
            out.append(cubin[stroff + st_name : end].decode("ascii", "replace"))
    return out


def _nv_info_records(cubin: bytes, section: str) -> Iterator[tuple[int, int, bytes]]:
    """(format, attribute, payload) records of an ``.nv.info*`` section (EIFMT_SVAL carries a
    2-byte size and a payload; the other formats carry a 2-byte value, returned as payload)."""
    for name, _t, off, size, _l, _i in _elf_sections(cubin):
        if name != section:
            continue
        pos, end = off, off + size
        while pos + 4 <= end:
            fmt, attr = cubin[pos], cubin[pos + 1]
            if fmt == 0x04:  # EIFMT_SVAL
                n = struct.unpack_from("<H", cubin, pos + 2)[0]
                yield fmt, attr, cubin[pos + 4 : pos + 4 + n]
                pos += 4 + n
            else:
                yield fmt, attr, cubin[pos + 2 : pos + 4]
                pos += 4


def _cubin_nregs(cubin: bytes, entry: str) -> int | None:
    """Registers per thread of ``entry``: the EIATTR_REGCOUNT (0x2f) record of ``.nv.info``,
    keyed by the entry's symbol index (what cuobjdump reports as REG)."""
    try:
        names = _elf_symbol_names(cubin)
        if entry not in names:
            return None
        sym = names.index(entry)
        for fmt, attr, payload in _nv_info_records(cubin, ".nv.info"):
            if fmt == 0x04 and attr == 0x2F and len(payload) >= 8:
                idx, value = struct.unpack_from("<II", payload)
                if idx == sym:
                    return value
    except (ValueError, struct.error, IndexError):
        return None
    return None


def _cubin_kparams(cubin: bytes, entry: str) -> list[tuple[int, int, int]] | None:
    """(ordinal, offset, size) of each kernel parameter from the EIATTR_KPARAM_INFO (0x17)
    records of ``.nv.info.<entry>``, sorted by ordinal; None when the cubin cannot be read."""
    try:
        params = []
        for fmt, attr, payload in _nv_info_records(cubin, f".nv.info.{entry}"):
            if fmt == 0x04 and attr == 0x17 and len(payload) >= 12:
                _index, ordinal, poff, flags = struct.unpack_from("<IHHI", payload)
                params.append((ordinal, poff, (flags >> 18) & 0x3FFF))
    except (ValueError, struct.error, IndexError):
        return None
    return sorted(params)


# ---------------------------------------------------------------------------------------------
# Codegen helpers for intrinsics lowered by numba-cuda


_UFUNC_MATH = {"sqrt": "sqrt", "exp": "exp", "expm1": "expm1", "log1p": "log1p", "fabs": "fabs"}
_ufunc_lock = threading.Lock()


@functools.cache
def install_cuda_extensions() -> None:
    """Register with numba-cuda's own registries the qd_numba extensions Numba's do not reach.

    * ``typeof``: numba-cuda's (``numba.cuda.typing.typeof.typeof_impl``) falls back to Numba's
      for plain objects but dispatches every class object to its own ``type`` handler, which does
      not know ``qd.Vector``/``qd.Matrix`` (classes with the ``_MatrixMeta`` metaclass), and every
      Numba type to its own ``TypeRef`` handler, so ``vec3 = qd.types.vector(3, qd.f32)`` would
      be a plain ``TypeRef`` whose call ``vec3(a, b, c)`` numba-cuda cannot lower
      (``numba_typeref_ctor``) instead of our ``MatrixTypeRef``.
    * the before-inference rewrite of matrix literal lists (typing/matrix.py), on numba-cuda's
      IR classes.

    * ``typeof`` of a ``@qd.real_func``: its numba-cuda device function (frontend/real_func.py).
    * the target context remembers ABI sizes (lowering/array_struct.py ``remember_abi_sizes``).

    Without them ``qd.Vector([...])`` in a kernel or device function failed CUDA typing.
    Idempotent."""
    from numba.core import types
    from numba.core.typing.typeof import typeof_impl as core_typeof_impl
    from numba.cuda.core import ir as cuda_ir
    from numba.cuda.core.rewrites.registry import Rewrite, register_rewrite
    from numba.cuda.typing.typeof import typeof_impl as cuda_typeof_impl

    from ...frontend.real_func import CompiledRealFunc, QdRealFunc
    from ...matrix import _MatrixMeta
    from ...typing import intrinsics
    from ...typing.matrix import MatrixType, matrix_literal_rewrite
    from ...typing.struct import StructType

    intrinsics.install_cuda()
    _skip_the_blas_probe()
    from numba.cuda.descriptor import cuda_target

    remember_abi_sizes(cuda_target.target_context)
    for cls in (_MatrixMeta, MatrixType, StructType):
        cuda_typeof_impl.register(cls)(core_typeof_impl.dispatch(cls))
    cuda_typeof_impl.register(QdRealFunc)(lambda val, c: types.Dispatcher(val.dispatcher("cuda")))
    cuda_typeof_impl.register(CompiledRealFunc)(lambda val, c: types.Dispatcher(val.func.compiled("cuda")))
    register_rewrite("before-inference")(matrix_literal_rewrite(cuda_ir, Rewrite))


def _skip_the_blas_probe() -> None:
    """Import numba-cuda's ``np.arraymath`` (its target context does at the first kernel) with
    its BLAS probe answering "none". The probe imports ``scipy.linalg`` to decide whether device
    code may call BLAS for ``np.dot``, which device code never can: 374 ms of a process's first
    CUDA kernel on the H100 host (scipy, and numpy's f2py through it). Without BLAS the device
    implementations take their loop (``np.dot`` of 1-d arrays, ``np.vdot``...), which is what
    runs on a GPU. numba-cuda's linear-algebra helpers keep their own check."""
    import sys

    if "numba.cuda.np.arraymath" in sys.modules:
        return
    from numba.cuda.np import linalg

    def no_device_blas():
        raise ImportError("device code cannot call BLAS")

    probe, linalg.ensure_blas = linalg.ensure_blas, no_device_blas
    try:
        import numba.cuda.np.arraymath  # noqa: F401
    finally:
        linalg.ensure_blas = probe


def install_cuda_ufunc_math_fallbacks() -> list[str]:
    """Teach numba-cuda to lower scalar ``np.sqrt/exp/expm1/log1p/fabs`` on the device.

    numba-cuda 0.30.4 types every NumPy ufunc but its CUDA ufunc table
    (``numba.cuda.ufuncs.ufunc_db()``) holds only 44 of them, so ``np.sqrt(x)`` in device code (an
    ``@numba.njit`` callee, say) fails in lowering with ``KeyError: <ufunc 'sqrt'>``; the CPU table
    (``numba.cuda.np.ufunc_db``) does not fit NVVM either.  This adds float32/float64 loops that
    reuse numba-cuda's ``math.*`` lowering (libdevice).  Only missing entries are added;
    idempotent; returns the names added."""
    import math

    import numpy as np
    from numba.cuda import ufuncs
    from numba.cuda.mathimpl import get_unary_impl_for_fn_and_ty

    def make(fn: Any) -> Callable[..., Any]:
        def impl(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            return get_unary_impl_for_fn_and_ty(fn, sig.args[0])(context, builder, sig, args)

        return impl

    added = []
    with _ufunc_lock:
        db = ufuncs.ufunc_db()
        for np_name, math_name in _UFUNC_MATH.items():
            uf = getattr(np, np_name)
            if uf in db:
                continue
            impl = make(getattr(math, math_name))
            db[uf] = {"f->f": impl, "d->d": impl}
            added.append(np_name)
    return added


# ---------------------------------------------------------------------------------------------
# The offline-device patch


class _OfflineDevice:
    """Stands in for ``numba.cuda``'s Device when no driver exists (compile only)."""

    id = 0
    name = b"qd_numba offline compile device"
    uuid = "offline"

    def __init__(self, cc: tuple[int, ...]):
        self.compute_capability = tuple(cc[:2])

    def __repr__(self) -> str:
        return f"<qd_numba offline device cc={self.compute_capability}>"


_offline = threading.local()
_patch_lock = threading.Lock()
_patch_installed = False


def _install_offline_device_patch() -> None:
    """Wrap ``numba.cuda.dispatcher.get_current_device`` once (only called when no driver)."""
    global _patch_installed
    if _patch_installed:
        return
    with _patch_lock:
        if _patch_installed:
            return
        import numba.cuda.dispatcher as cuda_dispatcher

        original = cuda_dispatcher.get_current_device

        @functools.wraps(original)
        def get_current_device() -> Any:
            cc = getattr(_offline, "cc", None)
            if cc is not None:
                return _OfflineDevice(cc)
            return original()

        get_current_device.__qd_numba_original__ = original  # type: ignore[attr-defined]
        cuda_dispatcher.get_current_device = get_current_device
        _patch_installed = True


@contextlib.contextmanager
def _offline_device(cc: tuple[int, ...]) -> Iterator[None]:
    if cuda_available():
        yield
        return
    _install_offline_device_patch()
    previous = getattr(_offline, "cc", None)
    _offline.cc = tuple(cc)
    try:
        yield
    finally:
        _offline.cc = previous


# ---------------------------------------------------------------------------------------------
# Compilation


@dataclass
class CompiledCudaTask:
    """A compiled task: a cubin holding one ``__global__`` entry plus its parameter layout."""

    cubin: bytes
    entry_name: str
    param_layout: list[ParamSlot]
    ptx: str | None
    nregs: int | None
    cc: tuple[Any, ...]
    argtypes: tuple[Any, ...]
    compile_seconds: float
    linker_log: str = ""
    kparams: list[tuple[int, int, int]] | None = field(default=None, repr=False)
    typemap: dict | None = field(default=None, repr=False)   # IR variable name -> Numba type
    # exceptions=True: the int32 global holding the first exception code a thread raised
    # (0: none), and code -> (exception class, args, location)
    error_symbol: str | None = None
    exception_of: Callable[[int], tuple] | None = field(default=None, repr=False)

    @property
    def param_buffer_size(self) -> int:
        """Bytes of the packed ``.param`` buffer (the last slot's end, 8-aligned)."""
        if not self.param_layout:
            return 0
        last = self.param_layout[-1]
        return (last.offset + last.size + 7) // 8 * 8


def _normalise_cc(cc: Sequence[Any]) -> tuple[Any, ...]:
    if len(cc) == 2:
        return (int(cc[0]), int(cc[1]))
    if len(cc) == 3:
        return (int(cc[0]), int(cc[1]), str(cc[2]))
    raise ValueError(f"compute capability must be (major, minor) or (major, minor, suffix): {cc!r}")


def compile_task_to_cubin(func_ir: Any, argtypes: Sequence[Any], **options: Any) -> CompiledCudaTask:
    """Compile a numba-cuda ``FunctionIR`` into a kernel cubin for ``cc`` without a GPU:
    :func:`lower_task` (whose keyword options it takes) then :meth:`LoweredTask.finish`, on this
    thread.

    ``func_ir`` must be numba-cuda IR (``IRTools.for_cuda().run_frontend``, or derived from it as
    tasks.py does), possibly rewritten; it is consumed (Numba's passes mutate it; pass
    ``func_ir.copy()`` to keep the original).  ``argtypes`` are Numba types, one per IR argument.
    The kernel returns nothing.  ``launch_bounds`` is numba-cuda's ``(max_threads[, min_blocks
    [, max_cluster]])``.  ``exceptions`` (implied by ``debug``): the kernel records the first
    exception a thread raises (qd_numba's bounds checks, ``raise`` in user code) in its
    ``<entry>__errcode__`` global, as numba-cuda's debug kernels do
    (:attr:`CompiledCudaTask.error_symbol`, ``exception_of``).
    Thread-safe: the lowering runs under Numba's and numba-cuda's global compiler lock."""
    return lower_task(func_ir, argtypes, **options).finish()


@dataclass
class LoweredTask:
    """A task kernel lowered to NVVM IR (text) by Numba: what :meth:`finish` turns into a cubin.

    :meth:`finish` touches no Numba state and holds no lock: NVVM and nvJitLink release the GIL,
    so several tasks can finish at once on a thread pool (:class:`DeviceCodegen`) while the
    compiling thread lowers the next one.  ``typemap`` is known here already (a later task's IR
    may need an earlier task's types).  ``seconds`` holds the time of each stage of
    :meth:`finish` once it ran."""

    library: Any                # numba-cuda's CUDACodeLibrary, its LLVM IR text already rendered
    entry_name: str
    ccn: tuple[Any, ...]
    argtypes: tuple[Any, ...]
    param_layout: list[ParamSlot]
    keep_ptx: bool
    nrt: bool                   # NRT on in the target context: link its library when the PTX uses it
    lowering_seconds: float
    typemap: dict = field(repr=False)
    blocks: dict = field(repr=False)          # the typed IR's blocks (SSA versions), what typemap types
    error_symbol: str | None = None
    exception_of: Callable[[int], tuple] | None = field(default=None, repr=False)
    seconds: dict[str, float] = field(default_factory=dict)

    def finish(self) -> CompiledCudaTask:
        """NVVM (LLVM IR -> PTX) and nvJitLink (PTX -> cubin); callable from any thread, once."""
        lib, ccn = self.library, self.ccn
        t0 = time.perf_counter()
        with profiler.stage("NVVM"):
            ptx = task_ptx(lib, ccn)
        t1 = time.perf_counter()
        _link_helpers(lib, self.nrt, ptx)
        with profiler.stage("nvJitLink"):
            obj = lib.get_cubin(cc=ccn)
        t2 = time.perf_counter()
        self.seconds = {"NVVM": t1 - t0, "nvJitLink": t2 - t1}
        cubin = bytes(obj.code) if hasattr(obj, "code") else bytes(obj)
        try:
            log = lib.get_linkerinfo(ccn) or ""
        except KeyError:
            log = ""
        name = self.entry_name
        return CompiledCudaTask(
            cubin=cubin,
            entry_name=name,
            param_layout=self.param_layout,
            ptx=ptx if self.keep_ptx else None,
            nregs=_cubin_nregs(cubin, name),
            cc=ccn,
            argtypes=self.argtypes,
            compile_seconds=self.lowering_seconds + t2 - t0,
            linker_log=log if isinstance(log, str) else str(log),
            kparams=_cubin_kparams(cubin, name),
            typemap=self.typemap,
            error_symbol=self.error_symbol,
            exception_of=self.exception_of,
        )


def ship_lowered(task: LoweredTask) -> dict:
    """What a worker process sends of a lowered task (fork_lowering.py): plain data, the Numba types
    of the arguments and variables, and the code library's NVVM IR and link settings; the typed IR
    stays there (non-debug tasks only: their exception table would too)."""
    lib = task.library
    return dict(
        library=dict(name=lib.name, entry_name=lib._entry_name, llvm_strs=list(lib.llvm_strs),
                     max_registers=lib._max_registers, nvvm_options=dict(lib._nvvm_options),
                     needs_cudadevrt=lib.needs_cudadevrt, use_cooperative=lib.use_cooperative,
                     lto=lib._lto, linking_files=[f for f in lib._linking_files if isinstance(f, str)]),
        entry_name=task.entry_name, ccn=task.ccn, argtypes=task.argtypes, param_layout=task.param_layout,
        keep_ptx=task.keep_ptx, nrt=task.nrt, lowering_seconds=task.lowering_seconds, typemap=dict(task.typemap),
    )


def rebuild_lowered(shipped: dict) -> LoweredTask:
    """The :class:`LoweredTask` of a worker's :func:`ship_lowered`: :meth:`LoweredTask.finish`
    makes the same cubin from it; ``blocks`` is empty (the typed IR stayed in the worker; what
    the Tasks' types need of it arrives as ``TaskTyper.label_types``)."""
    from numba.cuda.codegen import CUDACodeLibrary

    state = dict(shipped["library"])
    files = state.pop("linking_files")
    lib = CUDACodeLibrary._rebuild(None, ptx_cache={}, cubin_cache={}, linkerinfo_cache={}, nrt=False, **state)
    lib._linking_files = set(files)
    return LoweredTask(library=lib, blocks={},
                       **{k: v for k, v in shipped.items() if k != "library"})


@functools.cache
def _task_compiler():
    """numba-cuda's pipeline with the passes a task rarely needs gated (targets/task_pipeline.py)."""
    from numba.cuda import compiler as cc_mod

    from ..task_pipeline import gate

    class TaskCompiler(cc_mod.CUDACompiler):
        def define_pipelines(self):
            return [gate(pm, "numba.cuda.core") for pm in super().define_pipelines()]

    return TaskCompiler


def lower_task(
    func_ir: Any,
    argtypes: Sequence[Any],
    *,
    cc: Sequence[Any] = (9, 0),
    fastmath: bool = False,
    debug: bool = False,
    lineinfo: bool = False,
    max_registers: int | None = None,
    opt: bool = True,
    launch_bounds: int | tuple[int, ...] | None = None,
    keep_ptx: bool = True,
    exceptions: bool = False,
) -> LoweredTask:
    """The first half of :func:`compile_task_to_cubin` (same arguments): Numba's typing and
    lowering down to NVVM IR text, under the global compiler lock (it needs the GIL throughout)."""
    from numba.core import types as core_types
    from numba.cuda import compiler as cc_mod
    from numba.cuda import utils as cuda_utils
    from numba.cuda.core import ir as cuda_ir
    from numba.cuda.core.callconv import CUDACallConv
    from numba.cuda.core.compiler_lock import global_compiler_lock
    from numba.cuda.core.errors import NumbaDebugInfoWarning
    from numba.cuda.cudadrv import nvvm
    from numba.cuda.descriptor import cuda_target
    from numba.cuda.flags import CUDAFlags

    from ..task_pipeline import lean_flags

    install_cuda_extensions()
    ccn = _normalise_cc(cc)
    argtypes = tuple(argtypes)
    for t in argtypes:
        if not isinstance(t, core_types.Type):
            raise TypeError(f"argtypes must be Numba types, got {t!r}")
    if not isinstance(func_ir, cuda_ir.FunctionIR):
        raise TypeError(
            f"func_ir must be a numba.cuda.core.ir.FunctionIR (numba-cuda's frontend), got {type(func_ir)!r}"
        )
    if func_ir.arg_count != len(argtypes):
        raise TypeError(f"FunctionIR takes {func_ir.arg_count} arguments, {len(argtypes)} types given")

    flags = lean_flags(CUDAFlags)()
    flags.no_compile = True
    flags.no_cpython_wrapper = True
    flags.no_cfunc_wrapper = True
    flags.inline = "never"
    if debug or lineinfo:
        flags.debuginfo = True
    if lineinfo:
        flags.dbg_directives_only = True
    if debug:
        flags.error_model = "python"
        flags.dbg_extend_lifetimes = True
    else:
        flags.error_model = "numpy"
    if fastmath:
        flags.fastmath = True
    nvvm_options: dict[str, Any] = {"fastmath": fastmath, "opt": 3 if opt else 0}
    if debug:
        nvvm_options["g"] = None
    flags.nvvm_options = nvvm_options
    flags.compute_capability = ccn
    flags.max_registers = max_registers
    flags.lto = False

    arg_names = list(func_ir.arg_names)
    with global_compiler_lock, warnings.catch_warnings():
        # line info of generated task stubs: their locations point into the user's source, but
        # the stub function itself has none, which numba-cuda warns about once per task
        warnings.simplefilter("ignore", NumbaDebugInfoWarning)
        t0 = time.perf_counter()
        with _offline_device(ccn), cuda_utils.numba_target_override():
            tctx = cuda_target.typing_context
            gctx = cuda_target.target_context
            pipeline = _task_compiler()(
                tctx, gctx, None, argtypes, core_types.void, flags, {}, CUDACallConv(gctx), {}
            )
            with profiler.stage("typing + lowering"):  # compile records (profiler.py)
                cres = pipeline.compile_ir(func_ir=func_ir)
                lib = cres.library
                lib.finalize()
                entry = cres.fndesc.llvm_func_name
                kernel = lib.get_function(entry)
                lib._entry_name = entry
                cc_mod.kernel_fixup(kernel, debug or exceptions)
                device.keep_grid_loops_rolled(kernel)
                nvvm.set_launch_bounds(kernel, launch_bounds)
                if lib.use_cooperative:
                    lib.needs_cudadevrt = True
                lib.get_llvm_str()  # renders (and caches) the IR text here: Python work, needs the GIL
            layout = _param_layout(gctx, argtypes, arg_names)
            if len(layout) != len(kernel.args):
                raise AssertionError(
                    f"param layout has {len(layout)} slots but the kernel has {len(kernel.args)} params"
                )
        seconds = time.perf_counter() - t0
    return LoweredTask(
        library=lib,
        entry_name=kernel.name,
        ccn=ccn,
        argtypes=argtypes,
        param_layout=layout,
        keep_ptx=keep_ptx,
        nrt=bool(getattr(cres.target_context, "enable_nrt", False)),
        lowering_seconds=seconds,
        typemap=dict(getattr(cres.fndesc, "typemap", None) or {}),
        blocks=cres.type_annotation.blocks,
        error_symbol=kernel.name + "__errcode__" if debug or exceptions else None,
        exception_of=cres.call_helper.get_exception if debug or exceptions else None,
    )


class DeviceCodegen:
    """NVVM and nvJitLink of a kernel's tasks on a thread pool, overlapped with the lowering of
    the next task on the compiling thread.

    ``submit`` the :class:`LoweredTask` of each task in program order, then ``results()`` gives
    their :class:`CompiledCudaTask` in that order.  Both libraries release the GIL and compile one
    task each, so the cubins are those of the serial path, byte for byte.  ``threads`` is
    ``qd.init(compile_threads=...)`` (0: ``os.cpu_count()``); with 1 every task finishes on the
    compiling thread at ``submit``, as before.  An error is the one the serial path raises first:
    a task's NVVM/nvJitLink error before a later task's lowering error (used as a context
    manager).  The compile record (profiler.py) gets the time the compiling thread waited on the
    pool as stages "NVVM" and "nvJitLink", in the proportion the pool spent in each, and the
    pool's own seconds in ``CompileRecord.threads``."""

    def __init__(self, threads: int):
        self.threads = threads if threads > 0 else os.cpu_count() or 1
        self.pending: list[tuple[LoweredTask, Any]] = []   # (task, its CompiledCudaTask or future)

    def __enter__(self) -> DeviceCodegen:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc is None:
            return
        # a later task's lowering failed: an earlier task's NVVM/nvJitLink error comes first
        for _task, item in self.pending:
            if isinstance(item, Future):
                error = item.exception()
                if error is not None:
                    raise error from None

    def start(self, lowered: LoweredTask) -> Any:
        """Start finishing ``lowered`` now (on the pool; with one thread, here), before its turn:
        what :meth:`submit` takes as ``started`` when the task's turn comes."""
        return lowered.finish() if self.threads == 1 else _pool(self.threads).submit(lowered.finish)

    def submit(self, lowered: LoweredTask, started: Any = None) -> None:
        self.pending.append((lowered, self.start(lowered) if started is None else started))

    def results(self) -> list[CompiledCudaTask]:
        out = []
        for task, item in self.pending:
            if isinstance(item, Future):
                start = time.perf_counter()
                item = item.result()
                _record_pool_stages(task.seconds, time.perf_counter() - start)
            out.append(item)
        return out


def _record_pool_stages(seconds: dict[str, float], waited: float) -> None:
    total = sum(seconds.values())
    for name, spent in seconds.items():
        profiler.add_stage_time(name, waited * spent / total if total > 0 else 0.0, background=spent)


_pools: dict[int, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def _pool(threads: int) -> ThreadPoolExecutor:
    """The process's device-codegen pool of ``threads`` workers (started at its first use)."""
    with _pools_lock:
        pool = _pools.get(threads)
        if pool is None:
            pool = _pools[threads] = ThreadPoolExecutor(threads, thread_name_prefix="qd_numba-device-codegen")
        return pool


_NRT_EXTERN = re.compile(r"\.extern\s+\.func\s+(?:\s*\(.+\)\s*)?(NRT_\w+)\s*\([^)]*\)\s*;")


# what a task's NVVM IR may declare and still need nothing from libdevice: NVVM's own intrinsics and
# LLVM intrinsics that PTX has instructions for
_NO_LIBDEVICE = ("llvm.nvvm.", "llvm.memcpy.", "llvm.memset.", "llvm.memmove.", "llvm.lifetime.", "llvm.assume",
                 "llvm.dbg.", "llvm.expect.", "llvm.ctpop.", "llvm.ctlz.", "llvm.cttz.", "llvm.bswap.",
                 "llvm.smax.", "llvm.smin.", "llvm.umax.", "llvm.umin.", "llvm.abs.", "llvm.fabs.", "llvm.fma.",
                 "llvm.sadd.with.overflow.", "llvm.uadd.with.overflow.", "llvm.ssub.with.overflow.",
                 "llvm.usub.with.overflow.", "llvm.smul.with.overflow.", "llvm.umul.with.overflow.")
_DECLARED = re.compile(r'^declare\b[^@\n]*@"?([^"(\s]+)', re.MULTILINE)


def needs_libdevice(irs: Sequence[str]) -> bool:
    """Whether NVVM IR modules declare a function that libdevice could define (anything but the
    intrinsics of ``_NO_LIBDEVICE``)."""
    return any(not name.startswith(_NO_LIBDEVICE) for ir in irs for name in _DECLARED.findall(ir))


def task_ptx(lib: Any, ccn: tuple) -> str:
    """``lib.get_asm_str(cc=ccn)`` (cached in the library as numba-cuda does, so its link reuses
    it) without handing NVVM libdevice when the IR calls nothing of it: numba-cuda adds libdevice
    to every compilation (lazily, so the PTX is the same), and reading it is ~15% of NVVM's time
    for a small task. Debug, LTO and assembly-dump compiles take numba-cuda's path."""
    from numba.cuda.core import config as cuda_config
    from numba.cuda.cudadrv import nvrtc, nvvm

    options = dict(lib._nvvm_options)
    irs = lib.llvm_strs
    if "g" in options or lib._lto or cuda_config.DUMP_ASSEMBLY or needs_libdevice(irs):
        return lib.get_asm_str(cc=ccn)
    options["arch"] = nvrtc.get_arch_option(*ccn)
    if options.pop("fastmath", False):   # as numba-cuda's nvvm.compile_ir
        options.update({"ftz": True, "fma": True, "prec_div": False, "prec_sqrt": False})
    unit = nvvm.CompilationUnit(options)
    for ir in irs:
        unit.add_module(nvvm.llvm_replace(ir).encode("utf8"))
    # no separate nvvmVerifyProgram: NVVM's compile runs its verifier too (rejecting what it
    # rejects) and a second parse of the module costs ~8% of a small task's NVVM time
    try:
        ptx = unit.compile().decode().strip("\x00").strip()
    except Exception as e:
        raise QuadrantsCompilationError(f"NVVM rejected a task's IR: {unit.get_log().strip() or e}") from e
    lib._ptx_cache[ccn] = [ptx]
    return ptx


def _link_helpers(lib: Any, nrt: bool, ptx: str) -> None:
    """Add what ``numba.cuda.dispatcher._Kernel`` links beside the kernel: the reshape helpers
    (``reshape_funcs.cu``) when referenced, and the NRT library when NRT is on and used."""
    from numba.cuda import dispatcher as cuda_dispatcher

    if any(fn in ptx for fn in cuda_dispatcher.reshape_funcs):
        lib.add_linking_file(os.path.join(os.path.dirname(cuda_dispatcher.__file__), "reshape_funcs.cu"))
    if nrt and _NRT_EXTERN.search(ptx):
        from numba.cuda.memory_management.nrt import NRT_LIBRARY

        lib.add_linking_file(NRT_LIBRARY)
