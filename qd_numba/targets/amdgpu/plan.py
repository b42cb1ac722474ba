"""Compiling a kernel instance for AMDGPU: the CUDA target's task kernels, finished by
codegen.py instead of NVVM.

The untyped pipeline, the task cutter with the CUDA task ABI (``ctx``, ``tmp``, the runtime
parameters a task reads), numba-cuda's typing and lowering and the host iteration counts are the
CUDA target's (targets/cuda/plan.py ``compile_tasks``), so a kernel has the same Tasks, the same
kernel parameters (the kernarg layout is the CUDA ``.param`` layout: natural alignment) and the
same launch plan shape on both GPU targets.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass

from ... import config, profiler
from ...errors import QuadrantsRuntimeError
from ..untyped import gc_paused
from . import codegen

# what the compile of an AMDGPU kernel does after the shared untyped pipeline (QD_DUMP_IR)
CODEGEN_STAGES = ("split into task kernels as on CUDA (passes/task_ir.py with targets/cuda/tasks.py CudaTaskABI)",
                  "per task: numba-cuda typing + lowering, the NVVM IR retargeted to amdgcn "
                  "(targets/amdgpu/codegen.py), LLVM's AMDGPU back end -> object, ld.lld -> code object")


@dataclass(frozen=True)
class Toolchain:
    """What compiling for AMDGPU uses on this machine (from the configuration in force)."""

    archs: tuple[str, ...]
    lld: list[str] | None
    device_libs: dict               # arch -> ROCm device-library bitcode files, or None

    @classmethod
    def current(cls) -> Toolchain:
        cfg = config.current
        archs = tuple(codegen.check_arch(a) for a in config.amdgpu_archs(cfg))
        return cls(archs, codegen.find_lld(cfg.amdgpu_lld),
                   {a: codegen.device_library(cfg.amdgpu_device_libs, a) for a in archs})

    def codegen(self, keep_text: bool) -> codegen.AmdgpuCodegen:
        """The codegen of one kernel instance; with ``print_ir`` (QD_DUMP_IR) it prints each
        task kernel's optimised LLVM IR and assembly."""
        print_ir = config.current.print_ir
        return codegen.AmdgpuCodegen(self.archs, self.lld, self.device_libs, keep_text or print_ir,
                                     sys.stderr if print_ir else None)

    def cache_target(self, arch: str) -> str:
        """The target part of an AMDGPU kernel's offline-cache keys: the processor, the version of
        llvmlite's LLVM (its AMDGPU back end), and the files that go into the code object: ROCm's
        device-library bitcode and the linker (path, size, modification time), and numba-cuda's
        version (whose lowering the tasks go through; Numba's and llvmlite's are in every key)."""
        import llvmlite.binding as llvm
        import numba_cuda

        files = [*(self.device_libs.get(arch) or ()), *(self.lld[:1] if self.lld else ())]
        identity = []
        for path in files:
            try:
                st = os.stat(path)
                identity.append((path, st.st_size, st.st_mtime_ns))
            except OSError:
                identity.append((path, None))
        digest = hashlib.sha256(repr(identity).encode()).hexdigest()[:16]
        return (f"amdgpu-{arch}-llvm{'.'.join(map(str, llvm.llvm_version_info))}-{digest}"
                f"-numba-cuda{numba_cuda.__version__}")

    def require_linker(self) -> list[str]:
        if self.lld is None:
            raise QuadrantsRuntimeError("qd.amdgpu: no ld.lld to link AMDGPU code objects; install the 'amdgpu' "
                                        "extra (pip install 'qd_numba[amdgpu]': the ziglang wheel's ld.lld), an "
                                        "lld package, or set QD_AMDGPU_LLD")
        return self.lld


def compile_kernel(kernel, param_types, templates, toolchain: Toolchain, keep_text: bool = False):
    """(compile state, plan IR, [(unit, task IR, {arch: CompiledAmdgpuTask})], temp types) of one
    kernel instance: the CUDA target's task kernels compiled for every processor of the toolchain."""
    from ..cuda import plan as cuda_plan

    state = cuda_plan.compile_state(kernel, param_types, templates)
    gen = toolchain.codegen(keep_text)
    plan_ir, compiled, temp_types = cuda_plan.compile_tasks(kernel, state, (9, 0),
                                                            cuda_plan.kernel_field_slots(state), gen)
    return state, plan_ir, compiled, temp_types


def compile_check(kernel, param_types, templates, with_cuda=False, keep_text=False):
    """Compile every task of this kernel instance for AMDGPU down to code objects (relocatable
    objects where no ld.lld is found), without a GPU (``amdgpu_compile_check``). Returns
    ``[{arch: CompiledAmdgpuTask}]``, one per task; raises what a real AMDGPU compile raises.
    ``with_cuda``: the CUDA compile check too (``cuda_compile_check``), both from one lowering
    of each task. ``keep_text``: keep each task's optimised LLVM IR and assembly (also with
    ``QD_DUMP_IR``, which prints them)."""
    toolchain = Toolchain.current()
    gen = toolchain.codegen(keep_text)
    if with_cuda:
        from ..cuda import plan as cuda_plan
        from ..cuda.compile import DeviceCodegen

        cuda_plan.compile_check(kernel, param_types, templates,
                                codegen=codegen.TeeCodegen(DeviceCodegen(config.current.compile_threads), gen))
        tasks = gen.results()
    else:
        with gc_paused(), profiler.compiling(kernel.qualname, "amdgpu (compile check)"):
            _state, _plan_ir, compiled, _temps = compile_kernel(kernel, param_types, templates, toolchain,
                                                                keep_text)
        tasks = [c for _unit, _tk, c in compiled]
    return tasks
