"""The AMDGPU target (``qd.amdgpu``): the CUDA target's task kernels retargeted to amdgcn, run
through HIP (docs/amdgpu.md).

Compilation needs no GPU and no ROCm: numba-cuda types and lowers each task kernel as for CUDA,
:mod:`.codegen` rewrites the NVPTX-specific parts of that LLVM IR by a closed table and LLVM's
AMDGPU back end (in llvmlite) emits the object, which ``ld.lld`` links into an HSA code object.
Running needs ROCm's HIP runtime (``libamdhip64``), hip-python and an AMD GPU (:mod:`.runtime`).

Modules, by job:

- :mod:`.codegen`: NVVM IR -> amdgcn (the translation table and its helpers), the target machine,
  ROCm's device library, the linker, ELF inspection.
- :mod:`.plan`: a kernel instance compiled for AMDGPU (the CUDA target's ``compile_tasks`` with
  this codegen); ``compile_check`` for GPU-less machines.
- :mod:`.runtime`: HIP through hip-python: device, memory, modules, pre-packed launches, streams,
  events; what ``qd.init(arch=qd.amdgpu)`` checks.
- :mod:`.kernel`: :class:`~.kernel.AmdgpuTarget` and its kernel backend.
"""

from .kernel import AmdgpuTarget

__all__ = ["AmdgpuTarget"]
