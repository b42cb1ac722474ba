"""AMDGPU code generation: a task kernel lowered by numba-cuda, retargeted to amdgcn, to an HSA
code object.

The task kernels are the CUDA target's (same passes, same Tasks, same task ABI, same Numba
typing and lowering); what differs is the last step. The LLVM IR numba-cuda hands to NVVM is
standard LLVM IR plus a closed set of NVPTX-specific pieces, each rewritten here by a table:

* the ``llvm.nvvm.*`` intrinsics: special registers -> ``llvm.amdgcn.workitem/workgroup.id``
  and the dispatch packet's sizes; ``shfl.sync`` -> ``ds_bpermute``; float atomic adds ->
  ``atomicrmw fadd``; barriers and fences;
* libdevice's ``__nv_*`` math: exact operations (sqrt, fabs, floor, fma, ...) -> LLVM intrinsics
  the AMDGPU back end selects; every other function -> ROCm's device library (``__ocml_*``),
  linked when it is installed (:func:`device_library`);
* the one inline PTX statement numba-cuda emits (``activemask.b32``) -> a wave ballot;
* ``nvvm.annotations`` (the kernel marker) -> the ``amdgpu_kernel`` calling convention;
* address spaces: NVPTX's and AMDGPU's numbers agree (1 global, 3 shared/LDS, 4 constant,
  5 local/private) except that AMDGPU's allocas live in address space 5, so every ``alloca``
  moves there behind an ``addrspacecast`` (InferAddressSpaces removes the casts).

Anything else NVPTX-specific (an intrinsic, a libdevice function, inline PTX) is a
:class:`~qd_numba.errors.QuadrantsCompilationError` naming it, never a silent miscompile.

Warps: CUDA code here assumes 32-lane warps (the warp reduction of passes/reductions.py). A
wave64 runs as two 32-lane halves: ``laneid`` is the lane within its half, ``activemask`` the
half's ballot, and shuffles stay inside the half, so the reduction's arithmetic is the CUDA one.

llvmlite carries LLVM's AMDGPU back end (relocatable ELF object); ``ld.lld -shared`` makes the
loadable code object (:func:`find_lld`: ``QD_AMDGPU_LLD``, an ``ld.lld`` on PATH, or the
``ziglang`` wheel's ``zig ld.lld``). Codegen mutates an LLVM module, so every emit parses a
fresh one.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ... import profiler
from ...errors import QuadrantsCompilationError, QuadrantsConfigError

TRIPLE = "amdgcn-amd-amdhsa"

# -- the translation table ---------------------------------------------------------------------------

# NVVM intrinsic -> what replaces it: the name of an AMDGPU intrinsic or of a helper of _HELPERS
_NVVM = {
    "llvm.nvvm.read.ptx.sreg.tid.x": "llvm.amdgcn.workitem.id.x",
    "llvm.nvvm.read.ptx.sreg.tid.y": "llvm.amdgcn.workitem.id.y",
    "llvm.nvvm.read.ptx.sreg.tid.z": "llvm.amdgcn.workitem.id.z",
    "llvm.nvvm.read.ptx.sreg.ctaid.x": "llvm.amdgcn.workgroup.id.x",
    "llvm.nvvm.read.ptx.sreg.ctaid.y": "llvm.amdgcn.workgroup.id.y",
    "llvm.nvvm.read.ptx.sreg.ctaid.z": "llvm.amdgcn.workgroup.id.z",
    "llvm.nvvm.read.ptx.sreg.ntid.x": "qd.amdgpu.ntid.x",
    "llvm.nvvm.read.ptx.sreg.ntid.y": "qd.amdgpu.ntid.y",
    "llvm.nvvm.read.ptx.sreg.ntid.z": "qd.amdgpu.ntid.z",
    "llvm.nvvm.read.ptx.sreg.nctaid.x": "qd.amdgpu.nctaid.x",
    "llvm.nvvm.read.ptx.sreg.nctaid.y": "qd.amdgpu.nctaid.y",
    "llvm.nvvm.read.ptx.sreg.nctaid.z": "qd.amdgpu.nctaid.z",
    "llvm.nvvm.read.ptx.sreg.laneid": "qd.amdgpu.laneid",
    "llvm.nvvm.read.ptx.sreg.warpsize": "qd.amdgpu.warpsize",
    "llvm.nvvm.shfl.sync.i32": "qd.amdgpu.shfl.sync.i32",
    "llvm.nvvm.atomic.load.add.f32.p0f32": "qd.amdgpu.atomic.fadd.f32",
    "llvm.nvvm.atomic.load.add.f64.p0f64": "qd.amdgpu.atomic.fadd.f64",
    "llvm.nvvm.barrier0": "qd.amdgpu.barrier",
    "llvm.nvvm.barrier.sync": "qd.amdgpu.barrier.sync",
    "llvm.nvvm.membar.cta": "qd.amdgpu.fence.workgroup",
    "llvm.nvvm.membar.gl": "qd.amdgpu.fence.agent",
    "llvm.nvvm.membar.sys": "qd.amdgpu.fence.system",
}

# the one inline PTX numba-cuda emits for us (warp reductions) -> a helper call
_INLINE_PTX = {'asm sideeffect "activemask.b32 $0;", "=r"()': "@qd.amdgpu.activemask()"}   # all i32 ()

# libdevice functions whose results are exact: LLVM intrinsics the AMDGPU back end selects
_EXACT = {"sqrt": "sqrt", "fabs": "fabs", "floor": "floor", "ceil": "ceil", "trunc": "trunc", "rint": "rint",
          "nearbyint": "nearbyint", "round": "round", "copysign": "copysign", "fmin": "minnum",
          "fmax": "maxnum", "fma": "fma"}
# libdevice functions -> ROCm's device library (ocml), same signature
_OCML = {"sin", "cos", "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh",
         "exp", "exp2", "exp10", "expm1", "log", "log2", "log10", "log1p", "pow", "hypot", "cbrt", "erf",
         "erfc", "erfinv", "erfcinv", "lgamma", "tgamma", "fmod", "remainder", "rsqrt", "sinpi", "cospi", "fdim",
         "logb", "nextafter", "ldexp", "ilogb", "j0", "j1", "y0", "y1", "rcbrt", "scalbn"}
_OCML_RENAMED = {"powi": "pown"}
# integer and classification libdevice functions -> helpers of _HELPERS
_NV_HELPERS = {"__nv_isnanf": "qd.amdgpu.isnan.f32", "__nv_isnand": "qd.amdgpu.isnan.f64",
               "__nv_isinff": "qd.amdgpu.isinf.f32", "__nv_isinfd": "qd.amdgpu.isinf.f64",
               "__nv_finitef": "qd.amdgpu.isfinite.f32", "__nv_isfinited": "qd.amdgpu.isfinite.f64",
               "__nv_popc": "llvm.ctpop.i32", "__nv_popcll": "llvm.ctpop.i64",
               "__nv_brev": "llvm.bitreverse.i32", "__nv_brevll": "llvm.bitreverse.i64",
               "__nv_clz": "qd.amdgpu.clz.i32", "__nv_clzll": "qd.amdgpu.clz.i64"}


def _libdevice(name: str) -> str | None:
    """What replaces the libdevice function ``name`` (``__nv_...``), or None (not supported)."""
    if name in _NV_HELPERS:
        return _NV_HELPERS[name]
    base = name[len("__nv_"):]
    for stem, width, suffix in ((base, "f64", ""), (base[:-1], "f32", "f")):
        if stem + suffix != base:
            continue
        if stem in _EXACT:
            return f"llvm.{_EXACT[stem]}.{width}"
        if stem in _OCML or stem in _OCML_RENAMED:
            return f"__ocml_{_OCML_RENAMED.get(stem, stem)}_{width}"
    return None


# helpers the table names, in LLVM IR (opaque pointers), linked into every task module
_HELPERS = r"""
declare i32 @llvm.amdgcn.mbcnt.lo(i32, i32)
declare i32 @llvm.amdgcn.mbcnt.hi(i32, i32)
declare i64 @llvm.amdgcn.ballot.i64(i1)
declare i32 @llvm.amdgcn.ds.bpermute(i32, i32)
declare ptr addrspace(4) @llvm.amdgcn.dispatch.ptr()
declare void @llvm.amdgcn.s.barrier()
declare i32 @llvm.ctlz.i32(i32, i1)
declare i64 @llvm.ctlz.i64(i64, i1)
declare float @llvm.fabs.f32(float)
declare double @llvm.fabs.f64(double)

; HSA dispatch packet: workgroup_size_x/y/z (u16) at 4/6/8, grid_size_x/y/z (u32, work-items) at 12/16/20
define linkonce_odr hidden i32 @qd.amdgpu.ntid(i64 %k) alwaysinline {
  %p = call ptr addrspace(4) @llvm.amdgcn.dispatch.ptr()
  %off = add i64 4, %k
  %q = getelementptr i8, ptr addrspace(4) %p, i64 %off
  %s = load i16, ptr addrspace(4) %q, align 2, !invariant.load !0
  %r = zext i16 %s to i32
  ret i32 %r
}
define linkonce_odr hidden i32 @qd.amdgpu.nctaid(i64 %k) alwaysinline {
  %p = call ptr addrspace(4) @llvm.amdgcn.dispatch.ptr()
  %k2 = mul i64 %k, 2
  %off = add i64 12, %k2
  %q = getelementptr i8, ptr addrspace(4) %p, i64 %off
  %g = load i32, ptr addrspace(4) %q, align 4, !invariant.load !0
  %b = call i32 @qd.amdgpu.ntid(i64 %k)
  %b1 = sub i32 %b, 1
  %g1 = add i32 %g, %b1
  %r = udiv i32 %g1, %b
  ret i32 %r
}
define linkonce_odr hidden i32 @qd.amdgpu.ntid.x() alwaysinline {
  %r = call i32 @qd.amdgpu.ntid(i64 0)
  ret i32 %r
}
define linkonce_odr hidden i32 @qd.amdgpu.ntid.y() alwaysinline {
  %r = call i32 @qd.amdgpu.ntid(i64 2)
  ret i32 %r
}
define linkonce_odr hidden i32 @qd.amdgpu.ntid.z() alwaysinline {
  %r = call i32 @qd.amdgpu.ntid(i64 4)
  ret i32 %r
}
define linkonce_odr hidden i32 @qd.amdgpu.nctaid.x() alwaysinline {
  %r = call i32 @qd.amdgpu.nctaid(i64 0)
  ret i32 %r
}
define linkonce_odr hidden i32 @qd.amdgpu.nctaid.y() alwaysinline {
  %r = call i32 @qd.amdgpu.nctaid(i64 2)
  ret i32 %r
}
define linkonce_odr hidden i32 @qd.amdgpu.nctaid.z() alwaysinline {
  %r = call i32 @qd.amdgpu.nctaid(i64 4)
  ret i32 %r
}

; 32-lane warps: a wave64 is two of them
define linkonce_odr hidden i32 @qd.amdgpu.lane64() alwaysinline {
  %lo = call i32 @llvm.amdgcn.mbcnt.lo(i32 -1, i32 0)
  %r = call i32 @llvm.amdgcn.mbcnt.hi(i32 -1, i32 %lo)
  ret i32 %r
}
define linkonce_odr hidden i32 @qd.amdgpu.laneid() alwaysinline {
  %l = call i32 @qd.amdgpu.lane64()
  %r = and i32 %l, 31
  ret i32 %r
}
define linkonce_odr hidden i32 @qd.amdgpu.warpsize() alwaysinline {
  ret i32 32
}
define linkonce_odr hidden i32 @qd.amdgpu.activemask() alwaysinline {
  %l = call i32 @qd.amdgpu.lane64()
  %half = and i32 %l, 32
  %h = zext i32 %half to i64
  %b = call i64 @llvm.amdgcn.ballot.i64(i1 true)
  %s = lshr i64 %b, %h
  %r = trunc i64 %s to i32
  ret i32 %r
}
; PTX shfl.sync: c = segmask << 8 | clamp; mode 0 idx, 1 up, 2 down, 3 bfly; {value, in range}
define linkonce_odr hidden {i32, i1} @qd.amdgpu.shfl.sync.i32(i32 %mask, i32 %mode, i32 %v, i32 %b, i32 %c)
    alwaysinline {
  %l = call i32 @qd.amdgpu.lane64()
  %half = and i32 %l, 32
  %lane = and i32 %l, 31
  %seg0 = lshr i32 %c, 8
  %seg = and i32 %seg0, 31
  %notseg = xor i32 %seg, -1
  %clamp = and i32 %c, 31
  %minl = and i32 %lane, %seg
  %cns = and i32 %clamp, %notseg
  %maxl = or i32 %minl, %cns
  %b5 = and i32 %b, 31
  %bns = and i32 %b5, %notseg
  %jidx = or i32 %minl, %bns
  %jup = sub i32 %lane, %b
  %jdown = add i32 %lane, %b
  %jbfly = xor i32 %lane, %b
  %isup = icmp eq i32 %mode, 1
  %isdown = icmp eq i32 %mode, 2
  %isbfly = icmp eq i32 %mode, 3
  %j0 = select i1 %isbfly, i32 %jbfly, i32 %jidx
  %j1 = select i1 %isdown, i32 %jdown, i32 %j0
  %j = select i1 %isup, i32 %jup, i32 %j1
  %pup = icmp sge i32 %j, %maxl
  %pother = icmp sle i32 %j, %maxl
  %p = select i1 %isup, i1 %pup, i1 %pother
  %src = select i1 %p, i32 %j, i32 %lane
  %src64 = or i32 %src, %half
  %addr = shl i32 %src64, 2
  %r = call i32 @llvm.amdgcn.ds.bpermute(i32 %addr, i32 %v)
  %s0 = insertvalue {i32, i1} undef, i32 %r, 0
  %s1 = insertvalue {i32, i1} %s0, i1 %p, 1
  ret {i32, i1} %s1
}

; CUDA's atomicAdd on floats: relaxed, device scope
define linkonce_odr hidden float @qd.amdgpu.atomic.fadd.f32(ptr %p, float %v) alwaysinline {
  %r = atomicrmw fadd ptr %p, float %v syncscope("agent") monotonic, align 4
  ret float %r
}
define linkonce_odr hidden double @qd.amdgpu.atomic.fadd.f64(ptr %p, double %v) alwaysinline {
  %r = atomicrmw fadd ptr %p, double %v syncscope("agent") monotonic, align 8
  ret double %r
}

define linkonce_odr hidden void @qd.amdgpu.barrier() alwaysinline convergent {
  fence syncscope("workgroup") release
  call void @llvm.amdgcn.s.barrier()
  fence syncscope("workgroup") acquire
  ret void
}
define linkonce_odr hidden void @qd.amdgpu.barrier.sync(i32 %id, i32 %n) alwaysinline convergent {
  call void @qd.amdgpu.barrier()
  ret void
}
define linkonce_odr hidden void @qd.amdgpu.fence.workgroup() alwaysinline {
  fence syncscope("workgroup") seq_cst
  ret void
}
define linkonce_odr hidden void @qd.amdgpu.fence.agent() alwaysinline {
  fence syncscope("agent") seq_cst
  ret void
}
define linkonce_odr hidden void @qd.amdgpu.fence.system() alwaysinline {
  fence seq_cst
  ret void
}

define linkonce_odr hidden i32 @qd.amdgpu.isnan.f32(float %x) alwaysinline {
  %c = fcmp uno float %x, 0.0
  %r = zext i1 %c to i32
  ret i32 %r
}
define linkonce_odr hidden i32 @qd.amdgpu.isnan.f64(double %x) alwaysinline {
  %c = fcmp uno double %x, 0.0
  %r = zext i1 %c to i32
  ret i32 %r
}
define linkonce_odr hidden i32 @qd.amdgpu.isinf.f32(float %x) alwaysinline {
  %a = call float @llvm.fabs.f32(float %x)
  %c = fcmp oeq float %a, 0x7FF0000000000000
  %r = zext i1 %c to i32
  ret i32 %r
}
define linkonce_odr hidden i32 @qd.amdgpu.isinf.f64(double %x) alwaysinline {
  %a = call double @llvm.fabs.f64(double %x)
  %c = fcmp oeq double %a, 0x7FF0000000000000
  %r = zext i1 %c to i32
  ret i32 %r
}
define linkonce_odr hidden i32 @qd.amdgpu.isfinite.f32(float %x) alwaysinline {
  %a = call float @llvm.fabs.f32(float %x)
  %c = fcmp olt float %a, 0x7FF0000000000000
  %r = zext i1 %c to i32
  ret i32 %r
}
define linkonce_odr hidden i32 @qd.amdgpu.isfinite.f64(double %x) alwaysinline {
  %a = call double @llvm.fabs.f64(double %x)
  %c = fcmp olt double %a, 0x7FF0000000000000
  %r = zext i1 %c to i32
  ret i32 %r
}
define linkonce_odr hidden i32 @qd.amdgpu.clz.i32(i32 %x) alwaysinline {
  %r = call i32 @llvm.ctlz.i32(i32 %x, i1 false)
  ret i32 %r
}
define linkonce_odr hidden i32 @qd.amdgpu.clz.i64(i64 %x) alwaysinline {
  %c = call i64 @llvm.ctlz.i64(i64 %x, i1 false)
  %r = trunc i64 %c to i32
  ret i32 %r
}

!0 = !{}
"""


def _numba_atomics() -> tuple[dict, str]:
    """numba-cuda's atomic helpers (``___numba_atomic_*``, which NVVM compilation adds) -> ours:
    (name -> helper, their LLVM IR). Float add/sub are ``atomicrmw``; u64 inc/dec are
    ``uinc_wrap``/``udec_wrap`` (CUDA's atomicInc/atomicDec exactly); float min/max keep Numba's
    NaN rules (min/max: no update when either value is NaN; nanmin/nanmax: a NaN in memory is
    replaced) with a compare-and-swap loop."""
    names, ir = {}, []
    for ty, ity, align in (("float", "i32", 4), ("double", "i64", 8)):
        for op in ("add", "sub"):
            helper = f"qd.amdgpu.atomic.{ty}.{op}"
            names[f"___numba_atomic_{ty}_{op}"] = helper
            ir.append(f'define linkonce_odr hidden {ty} @"{helper}"(ptr %p, {ty} %v) alwaysinline {{\n'
                      f'  %r = atomicrmw f{op} ptr %p, {ty} %v syncscope("agent") monotonic, align {align}\n'
                      f"  ret {ty} %r\n}}")
        for nan, func, cmp in (("", "max", "olt"), ("", "min", "ogt"), ("nan", "max", "ult"), ("nan", "min", "ugt")):
            helper = f"qd.amdgpu.atomic.{ty}.{nan}{func}"
            names[f"___numba_atomic_{ty}_{nan}{func}"] = helper
            skip_if = "%v" if nan else "%first"
            ir.append(f'define linkonce_odr hidden {ty} @"{helper}"(ptr %p, {ty} %v) alwaysinline {{\n'
                      f"entry:\n"
                      f'  %first = load atomic {ty}, ptr %p syncscope("agent") monotonic, align {align}\n'
                      f"  %skip = fcmp uno {ty} %v, {skip_if}\n"
                      f"  br i1 %skip, label %done, label %check\n"
                      f"check:\n"
                      f"  %old = phi {ty} [ %first, %entry ], [ %seen, %retry ]\n"
                      f"  %go = fcmp {cmp} {ty} %old, %v\n"
                      f"  br i1 %go, label %retry, label %done\n"
                      f"retry:\n"
                      f"  %oi = bitcast {ty} %old to {ity}\n"
                      f"  %vi = bitcast {ty} %v to {ity}\n"
                      f'  %pair = cmpxchg ptr %p, {ity} %oi, {ity} %vi syncscope("agent") monotonic monotonic, '
                      f"align {align}\n"
                      f"  %si = extractvalue {{ {ity}, i1 }} %pair, 0\n"
                      f"  %seen = bitcast {ity} %si to {ty}\n"
                      f"  %ok = extractvalue {{ {ity}, i1 }} %pair, 1\n"
                      f"  br i1 %ok, label %done, label %check\n"
                      f"done:\n"
                      f"  ret {ty} %first\n}}")
    for op, rmw in (("inc", "uinc_wrap"), ("dec", "udec_wrap")):
        helper = f"qd.amdgpu.atomic.u64.{op}"
        names[f"___numba_atomic_u64_{op}"] = helper
        ir.append(f'define linkonce_odr hidden i64 @"{helper}"(ptr %p, i64 %v) alwaysinline {{\n'
                  f'  %r = atomicrmw {rmw} ptr %p, i64 %v syncscope("agent") monotonic, align 8\n'
                  f"  ret i64 %r\n}}")
    return names, "\n".join(ir) + "\n"


_NUMBA_ATOMICS, _NUMBA_ATOMICS_IR = _numba_atomics()

_SYMBOL = re.compile(r'@("(?:[^"\\]|\\.)*"|[-a-zA-Z$._][-a-zA-Z$._0-9]*)')
_ALLOCA = re.compile(r"^(\s*)(%\S+) = alloca (.*)$", re.M)
_ASM = re.compile(r'asm (?:sideeffect )?"[^"]*", "[^"]*"\([^)]*\)')
_DROP_LINES = re.compile(r'^(target datalayout|target triple|!nvvm.annotations|!nvvmir.version) = .*$', re.M)


def _unquote(sym: str) -> str:
    return sym[1:-1] if sym.startswith('"') else sym


def _quote(name: str) -> str:
    return f'@"{name}"'


def retarget_ir(text: str, entry: str | None, where: str) -> str:
    """One module of numba-cuda's NVVM IR rewritten for amdgcn (the table above). ``entry``: the
    kernel of this module (it gets the ``amdgpu_kernel`` calling convention), None in a library
    module. Raises QuadrantsCompilationError naming an NVPTX-specific construct it cannot map."""
    unknown: list[str] = []

    def symbol(m: re.Match) -> str:
        name = _unquote(m.group(1))
        if name.startswith("llvm.nvvm.") or name.startswith("__nvvm_"):
            new = _NVVM.get(name)
        elif name.startswith("__nv_"):
            new = _libdevice(name)
        elif name.startswith("___numba_atomic_"):
            new = _NUMBA_ATOMICS.get(name)
        else:
            return m.group(0)
        if new is None:
            unknown.append(name)
            return m.group(0)
        return _quote(new)

    text = _SYMBOL.sub(symbol, text)
    for ptx, call in _INLINE_PTX.items():
        if ptx in text:
            text = text.replace(ptx, call) + f"\ndeclare i32 {call}\n"
    unknown += [m.group(0) for m in _ASM.finditer(text)]
    if unknown:
        names = ", ".join(sorted(set(unknown)))
        raise QuadrantsCompilationError(f"{where}: no AMDGPU lowering for {names} (CUDA-specific operation; "
                                    "docs/amdgpu.md lists what the AMDGPU target supports)")
    text = _DROP_LINES.sub("", text)
    text = _ALLOCA.sub(_alloca_to_private, text)
    if entry is not None:
        pattern = re.compile(r'^define (.*?)void (@"?' + re.escape(entry) + r'"?\()', re.M)
        text, n = pattern.subn(r"define \1amdgpu_kernel void \2", text, count=1)
        if n != 1:
            raise AssertionError(f"kernel {entry} not defined in its module")
    return text


def _alloca_to_private(m: re.Match) -> str:
    indent, name, rest = m.groups()
    private = name[:-1] + '.qd_p5"' if name.endswith('"') else name + ".qd_p5"
    return (f"{indent}{private} = alloca {rest}, addrspace(5)\n"
            f"{indent}{name} = addrspacecast ptr addrspace(5) {private} to ptr")


# -- LLVM ------------------------------------------------------------------------------------------------

_llvm_lock = threading.Lock()


@functools.cache
def _llvm():
    import llvmlite.binding as llvm

    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    return llvm


@functools.cache
def target_machine(arch: str):
    """The AMDGPU target machine for ``arch`` (gfx942, gfx90a, gfx1100, ...)."""
    llvm = _llvm()
    target = llvm.Target.from_triple(TRIPLE)
    tm = target.create_target_machine(cpu=arch, opt=3, reloc="pic", codemodel="default")
    return tm


def check_arch(arch: str) -> str:
    """``arch`` if it has the form of an AMDGPU processor name (``gfx`` and 3 to 5 hex digits),
    else our error; a well-formed name LLVM does not know gets LLVM's warning at codegen."""
    if not re.fullmatch(r"gfx[0-9a-f]{3,5}", arch):
        raise QuadrantsConfigError(f"amdgpu_arch: {arch!r} is not an AMDGPU processor name (gfx942, gfx90a, "
                                   "gfx1100, ...; QD_AMDGPU_ARCH)")
    return arch


# -- ROCm's device library -----------------------------------------------------------------------------

_OCLC = ("oclc_finite_only_off", "oclc_unsafe_math_off", "oclc_correctly_rounded_sqrt_on", "oclc_daz_opt_off",
         "oclc_abi_version_500")


def device_library(directory: str, arch: str) -> list[str] | None:
    """The bitcode files of ROCm's device library for ``arch`` in ``directory`` (ocml and the
    oclc control files HIP links with it), or None when ``directory`` does not hold them."""
    if not directory:
        return None
    version = arch[3:]
    wave = "oclc_wavefrontsize64_on" if arch.startswith("gfx9") else "oclc_wavefrontsize64_off"
    names = ["ocml", *_OCLC, wave, f"oclc_isa_version_{version}"]
    paths = [os.path.join(directory, n + ".bc") for n in names]
    return paths if all(os.path.exists(p) for p in paths) else None


# -- the linker ----------------------------------------------------------------------------------------


def find_lld(configured: str) -> list[str] | None:
    """The command that runs ``ld.lld``: ``configured`` (QD_AMDGPU_LLD), else an ``ld.lld`` on PATH,
    else the ``ziglang`` wheel's (``zig ld.lld``); None when there is none."""
    if configured:
        return [configured]
    exe = shutil.which("ld.lld")
    if exe:
        return [exe]
    try:
        import importlib.util

        spec = importlib.util.find_spec("ziglang")
        if spec is not None and spec.submodule_search_locations:
            zig = os.path.join(spec.submodule_search_locations[0], "zig")
            if os.path.exists(zig):
                return [zig, "ld.lld"]
            return [sys.executable, "-m", "ziglang", "ld.lld"]
    except (ImportError, ValueError):
        pass
    return None


def link_code_object(obj: bytes, lld: list[str]) -> bytes:
    """``ld.lld -shared``: the relocatable object -> a loadable HSA code object."""
    with tempfile.TemporaryDirectory(prefix="qd_amdgpu_") as tmp:
        src, dst = os.path.join(tmp, "task.o"), os.path.join(tmp, "task.hsaco")
        with open(src, "wb") as f:
            f.write(obj)
        proc = subprocess.run([*lld, "-shared", src, "-o", dst],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise QuadrantsCompilationError(f"ld.lld failed to link the AMDGPU code object: {proc.stderr.strip()}")
        with open(dst, "rb") as f:
            return f.read()


# -- ELF inspection --------------------------------------------------------------------------------------

EM_AMDGPU = 224


@dataclass(frozen=True)
class ElfInfo:
    """What a test or a loader asks of an AMDGPU ELF image."""

    type: int                       # 1 relocatable, 3 shared object (a loadable code object)
    machine: int
    defined: tuple[str, ...]        # defined symbols
    undefined: tuple[str, ...]      # undefined (to be resolved by a linker or loader)
    kernels: tuple[str, ...]        # kernel descriptors' kernels (<name>.kd)


def elf_info(blob: bytes) -> ElfInfo:
    from ..cuda.compile import _elf_sections

    e_type, e_machine = struct.unpack_from("<HH", blob, 0x10)
    defined, undefined = [], []
    secs = _elf_sections(blob)
    for _name, typ, off, size, link, _info in secs:
        if typ not in (2, 11):      # SHT_SYMTAB, SHT_DYNSYM
            continue
        stroff = secs[link][2]
        for k in range(1, size // 24):
            st_name, _st_info, _other, st_shndx = struct.unpack_from("<IBBH", blob, off + 24 * k)
            end = blob.index(b"\0", stroff + st_name)
            name = blob[stroff + st_name:end].decode("ascii", "replace")
            if name:
                (undefined if st_shndx == 0 else defined).append(name)
    kernels = tuple(sorted({n[:-3] for n in defined if n.endswith(".kd")}))
    return ElfInfo(e_type, e_machine, tuple(sorted(set(defined))), tuple(sorted(set(undefined))), kernels)


# -- compiling one task --------------------------------------------------------------------------------


@dataclass
class CompiledAmdgpuTask:
    """One task kernel for one AMDGPU processor."""

    entry_name: str
    arch: str
    obj: bytes                      # the relocatable ELF object
    code_object: bytes | None       # the loadable code object (None: no linker here)
    param_layout: list              # the CUDA task's ParamSlots: the kernarg layout is the same
    argtypes: tuple
    llvm_ir: str = field(repr=False, default="")       # the optimised amdgcn module
    asm: str = field(repr=False, default="")           # its assembly
    unresolved: tuple[str, ...] = ()                   # device-library functions not linked here
    compile_seconds: float = 0.0
    typemap: dict | None = field(default=None, repr=False)
    error_symbol: str | None = None
    exception_of: Any = field(default=None, repr=False)

    @property
    def cubin(self) -> bytes | None:
        """The loadable image under the name the CUDA target's ``plan_binary`` reads."""
        return self.code_object


def compile_lowered(lowered, arch: str, lld: list[str] | None, device_libs: list[str] | None,
                    keep_text: bool = False) -> CompiledAmdgpuTask:
    """A task kernel lowered by numba-cuda (``targets/cuda/compile.py`` ``LoweredTask``) -> amdgcn
    object and, with a linker, the code object. Device-library calls stay unresolved when
    ``device_libs`` is None (reported in ``unresolved``; such a code object cannot load).
    ``keep_text``: also keep the optimised LLVM IR and the assembly (QD_DUMP_IR, tests)."""
    llvm = _llvm()
    t0 = time.perf_counter()
    entry = lowered.entry_name
    where = f"AMDGPU codegen of task kernel {entry}"
    texts = [retarget_ir(t, entry if k == 0 else None, where) for k, t in enumerate(lowered.library.llvm_strs)]
    tm = target_machine(arch)
    layout = str(tm.target_data)
    with _llvm_lock, profiler.stage("AMDGPU LLVM"):
        module = _parse(llvm, texts[0], layout)
        for text in texts[1:] + [_HELPERS, _NUMBA_ATOMICS_IR]:
            module.link_in(_parse(llvm, text, layout))
        if device_libs:
            for path in device_libs:
                with open(path, "rb") as f:
                    lib = llvm.parse_bitcode(f.read())
                lib.triple, lib.data_layout = TRIPLE, layout
                module.link_in(lib)
        keep = {entry} | ({lowered.error_symbol} if lowered.error_symbol else set())
        for fn in module.functions:
            if not fn.is_declaration and fn.name not in keep:
                fn.linkage = "internal"
        for gv in module.global_variables:
            if not gv.is_declaration and gv.name not in keep and not gv.name.startswith("llvm."):
                gv.linkage = "internal"
        module.verify()
        _optimise(llvm, module, tm)
        optimised = str(module)
        # codegen mutates the module: the assembly and the object each get a fresh parse (emitting
        # from ``module`` itself crashed a later garbage collection: the optimiser's analyses of it
        # are disposed after the codegen changed it)
        asm = tm.emit_assembly(_parse(llvm, optimised, layout)) if keep_text else ""
        obj = tm.emit_object(_parse(llvm, optimised, layout))
    info = elf_info(obj)
    unresolved = tuple(n for n in info.undefined if n.startswith("__ocml_"))
    others = [n for n in info.undefined if not n.startswith("__ocml_")]
    if others:
        raise QuadrantsCompilationError(f"{where}: unresolved symbols {', '.join(others)}")
    code_object = None
    if lld is not None:
        with profiler.stage("ld.lld"):
            code_object = link_code_object(obj, lld)
    return CompiledAmdgpuTask(
        entry_name=entry, arch=arch, obj=obj, code_object=code_object, param_layout=lowered.param_layout,
        argtypes=lowered.argtypes, llvm_ir=optimised if keep_text else "", asm=asm, unresolved=unresolved,
        compile_seconds=lowered.lowering_seconds + time.perf_counter() - t0, typemap=lowered.typemap,
        error_symbol=lowered.error_symbol, exception_of=lowered.exception_of)


def _parse(llvm, text: str, layout: str):
    module = llvm.parse_assembly(text)
    module.triple, module.data_layout = TRIPLE, layout
    return module


def _optimise(llvm, module, tm) -> None:
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(module, pb)


class AmdgpuCodegen:
    """``submit``/``results`` as targets/cuda/compile.py's DeviceCodegen, for AMDGPU: each lowered
    task compiles for every processor of ``archs`` (on this thread; LLVM's AMDGPU codegen holds
    the llvmlite lock); ``dump``: a text stream to print each task's IR and assembly to."""

    def __init__(self, archs: tuple[str, ...], lld: list[str] | None, device_libs: dict[str, list[str] | None],
                 keep_text: bool = False, dump=None):
        self.archs, self.lld, self.device_libs, self.keep_text = archs, lld, device_libs, keep_text
        self.dump = dump            # a text stream: print each task's IR and assembly there
        self.compiled: list[dict[str, CompiledAmdgpuTask]] = []

    def __enter__(self) -> AmdgpuCodegen:
        return self

    def __exit__(self, *exc) -> None:
        return None

    def submit(self, lowered) -> None:
        compiled = {arch: compile_lowered(lowered, arch, self.lld, self.device_libs.get(arch), self.keep_text)
                    for arch in self.archs}
        if self.dump is not None:
            for arch, c in compiled.items():
                print(f"=== qd_numba AMDGPU task kernel {c.entry_name} ({arch}) ===\n{c.llvm_ir}\n{c.asm}",
                      file=self.dump)
        self.compiled.append(compiled)

    def results(self) -> list[dict[str, CompiledAmdgpuTask]]:
        return self.compiled


class TeeCodegen:
    """Each lowered task finished by ``first`` (whose results the caller gets: the CUDA
    DeviceCodegen) and by ``second`` (an :class:`AmdgpuCodegen`), lowered once."""

    def __init__(self, first, second: AmdgpuCodegen):
        self.first, self.second = first, second

    def __enter__(self) -> TeeCodegen:
        self.first.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        return self.first.__exit__(*exc)

    def submit(self, lowered) -> None:
        self.first.submit(lowered)
        with profiler.stage("amdgpu (compile check)"):
            self.second.submit(lowered)

    def results(self) -> list:
        return self.first.results()
