"""The CUDA target: compile a kernel's tasks to cubins and launch them through the driver.

Compilation (once per kernel and argument spec): the untyped pipeline runs on numba-cuda's IR
classes, :mod:`.tasks` splits the result into task kernels, :mod:`.compile` turns each into a
cubin, and the cubins are loaded with ``cuModuleLoadData``. The result is a
:class:`~.plan.LaunchPlan`: one ``CUfunction`` per task, its grid and block, and a pre-packed
``void*[]`` parameter array per task whose cells are shared by all tasks of the kernel.

A call then only (1) checks the argument spec (type, dtype, ndim, contiguity per ndarray
argument), (2) writes the cells of arguments that changed (a new pointer, a scalar value),
(3) computes iteration counts that depend on argument shapes (generated Python, no device
round trip) and (4) calls ``cuLaunchKernel`` once per task on the legacy default stream. No
typing, no ``typeof``, no allocation, no numba-cuda dispatcher on that path.

Fields live in device memory; every task kernel receives one pointer to its instance's field
table (data pointers of the fields it uses, in kernel-local slots) instead of one parameter per
field (lowering/device.py).

Modules, by job:

- :mod:`.runtime`: the driver (``_driver``, ``_check``), the packed-launch layout and the native
  launchers, :class:`~.runtime.CudaRuntime` (device, occupancy, module loading, field tables),
  ``ensure_device``.
- :mod:`.arrays`: kernel arguments as :class:`~.arrays.ArrayView` (numpy, qd.ndarray, torch,
  ``__cuda_array_interface__``, DLPack) and their Numba types.
- :mod:`.plan`: compiling a kernel instance and its :class:`~.plan.LaunchPlan` (cells, grids,
  the generated runner, return values); ``compile_check`` for GPU-less machines.
- :mod:`.kernel`: :class:`~.kernel.CudaTarget` and :class:`~.kernel.CudaKernel`, the generated
  call path of a kernel (argument checks, spec key, plan lookup).
- :mod:`.tasks`: the task kernels' numba-cuda IR and the host iteration counts.
- :mod:`.compile`: the numba-cuda adapter (every private numba-cuda touch point): IR to cubin.
"""

from .kernel import CudaTarget

__all__ = ["CudaTarget"]
