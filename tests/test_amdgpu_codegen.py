"""The AMDGPU code path without a GPU (qd_numba/targets/amdgpu, docs/amdgpu.md).

Every kernel here compiles for AMDGPU (gfx942) through the CUDA target's task kernels, the
NVVM-IR-to-amdgcn table of codegen.py and LLVM's AMDGPU back end; the tests read the emitted LLVM
IR, assembly and ELF to show each kind of task (range-for, serial, reduction) is real device code
with the AMDGPU kernel ABI. Where an ld.lld is found (``QD_AMDGPU_LLD``, PATH, the ``ziglang``
wheel of the ``amdgpu`` extra) they also check the linked code object. Numerics come from the CPU
run of the same kernels; tests marked ``amdgpu`` run them on an AMD GPU (``--arch=amdgpu``).
"""

from __future__ import annotations

import ctypes
import re
import warnings

import numpy as np
import pytest
from numba.core import types

import qd_numba as qd
from qd_numba import config
from qd_numba.errors import QuadrantsCompilationError, QuadrantsConfigError, QuadrantsRuntimeError, QuadrantsWarning
from qd_numba.targets.amdgpu import codegen
from qd_numba.targets.amdgpu.plan import Toolchain, compile_check
from qd_numba.targets.cuda.compile import numba_cuda_importable

if not numba_cuda_importable():  # pragma: no cover - CI without the cuda extra
    pytest.skip("the AMDGPU target lowers through numba-cuda (the 'cuda' extra)", allow_module_level=True)

F32 = types.float32[::1]
F64 = types.float64[::1]
LLD = Toolchain.current().lld


def _compile(kernel, param_types, templates=None):
    """{task kind: CompiledAmdgpuTask for gfx942}, tasks in order."""
    tasks = compile_check(kernel, param_types, templates or {}, keep_text=True)
    return [t["gfx942"] for t in tasks]


def _instructions(asm):
    return [line.split()[0] for line in asm.splitlines() if line.startswith("\t") and not line.startswith("\t.")]


def _check_device_code(task):
    """An amdgpu_kernel entry with a kernel descriptor, compiled to scalar and vector ISA."""
    assert re.search(r"define amdgpu_kernel void @\"?" + re.escape(task.entry_name), task.llvm_ir)
    assert "nvvm" not in task.llvm_ir and "__nv_" not in task.llvm_ir
    assert f".amdhsa_kernel {task.entry_name}" in task.asm
    ops = _instructions(task.asm)
    assert any(op.startswith("s_") for op in ops) and any(op.startswith("v_") for op in ops)
    assert ops[-1] == "s_endpgm" or "s_endpgm" in ops
    info = codegen.elf_info(task.obj)
    assert info.machine == codegen.EM_AMDGPU and info.type == 1     # a relocatable object
    assert task.entry_name in info.kernels
    if task.code_object is not None:
        linked = codegen.elf_info(task.code_object)
        assert linked.machine == codegen.EM_AMDGPU and linked.type == 3 and task.entry_name in linked.kernels
    return ops


def test_range_for_task_is_a_workitem_loop(rng):
    @qd.kernel
    def scale(a: qd.types.ndarray(dtype=qd.f32, ndim=1), b: qd.types.ndarray(dtype=qd.f32, ndim=1), s: qd.f32):
        for i in range(a.shape[0]):
            b[i] = qd.sqrt(a[i]) * s + qd.abs(a[i])

    (task,) = _compile(scale, {"a": F32, "b": F32, "s": types.float32})
    ops = _check_device_code(task)
    ir = task.llvm_ir
    assert "llvm.amdgcn.workitem.id.x" in ir and "llvm.amdgcn.workgroup.id.x" in ir
    assert "llvm.amdgcn.dispatch.ptr" in ir          # the block and grid sizes
    assert not task.unresolved                       # sqrt, fabs: exact intrinsics, no device library
    assert any("load" in op for op in ops) and any("store" in op for op in ops)
    assert any(op.startswith("v_sqrt_f32") or op.startswith("v_rsq") or op == "v_sqrt_f32_e32" for op in ops)
    a = rng.random(100).astype(np.float32)
    b = np.zeros_like(a)
    scale(a, b, 1.5)
    np.testing.assert_allclose(b, np.sqrt(a) * 1.5 + np.abs(a), rtol=1e-6)


def test_serial_task_runs_on_one_workitem(rng):
    x = qd.field(qd.f64, shape=())

    @qd.kernel
    def serial(a: qd.types.ndarray(dtype=qd.f64, ndim=1)):
        t = 0.0
        k = 0
        while k < a.shape[0]:
            t += a[k] * a[k]
            k += 1
        x[None] = t

    (task,) = _compile(serial, {"a": F64})
    _check_device_code(task)
    assert "workitem.id" not in task.llvm_ir        # a serial task does not index by work-item
    a = rng.random(17)
    serial(a)
    assert x[None] == pytest.approx(float(a @ a))


def test_reduction_combines_half_waves_with_bpermute(rng):
    total = qd.field(qd.f32, shape=())

    @qd.kernel
    def reduce(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            total[None] += a[i]

    tasks = _compile(reduce, {"a": F32})
    ops = [op for task in tasks for op in _check_device_code(task)]
    assert any(op.startswith("ds_bpermute") for op in ops)          # the 32-lane shuffles
    assert any("atomic" in op for op in ops)                         # one atomic per half-wave
    a = rng.random(1000).astype(np.float32)
    total[None] = 0.0
    reduce(a)
    assert total[None] == pytest.approx(float(a.sum()), rel=1e-5)


def test_float_and_integer_atomics():
    @qd.kernel
    def hist(a: qd.types.ndarray(dtype=qd.f64, ndim=1), h: qd.types.ndarray(dtype=qd.f64, ndim=1),
             c: qd.types.ndarray(dtype=qd.i32, ndim=1)):
        for i in range(a.shape[0]):
            k = int(a[i] * 4)
            qd.atomic_add(h[k], a[i])
            qd.atomic_max(c[k], i)

    (task,) = _compile(hist, {"a": F64, "h": F64, "c": types.int32[::1]})
    _check_device_code(task)
    assert re.search(r"atomicrmw fadd ptr\b.* double", task.llvm_ir) or "global_atomic" in task.asm \
        or "flat_atomic" in task.asm
    assert re.search(r"(flat|global)_atomic_(smax|cmpswap)", task.asm)


def test_math_through_the_device_library():
    @qd.kernel
    def waves(a: qd.types.ndarray(dtype=qd.f64, ndim=1), b: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            a[i] = qd.sin(a[i]) + qd.exp(a[i]) ** 1.5
            b[i] = qd.cos(b[i])

    (task,) = _compile(waves, {"a": F64, "b": F32})
    _check_device_code(task)
    wanted = {"__ocml_sin_f64", "__ocml_exp_f64", "__ocml_pow_f64", "__ocml_cos_f32"}
    if Toolchain.current().device_libs["gfx942"] is None:
        assert set(task.unresolved) == wanted       # left to ROCm's device library, named
    else:
        assert not task.unresolved


def test_bounds_checks_in_debug_mode(rng):
    qd.init(arch=qd.cpu, debug=True)
    try:
        @qd.kernel
        def shift(a: qd.types.ndarray(dtype=qd.f32, ndim=1), b: qd.types.ndarray(dtype=qd.f32, ndim=1)):
            for i in range(a.shape[0]):
                b[i] = a[i + 1]

        (task,) = _compile(shift, {"a": F32, "b": F32})
        _check_device_code(task)
        assert task.error_symbol and task.error_symbol in codegen.elf_info(task.obj).defined
        with pytest.raises(QuadrantsRuntimeError, match="out of bound|index"):
            shift(rng.random(8).astype(np.float32), np.zeros(8, np.float32))
    finally:
        qd.init(arch=qd.cpu)


def test_arch_list_compiles_each_processor(monkeypatch):
    monkeypatch.setattr(config.current, "amdgpu_arch", "gfx942, gfx90a")

    @qd.kernel
    def fill(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            a[i] = i

    (task,) = compile_check(fill, {"a": F32}, {}, keep_text=True)
    assert sorted(task) == ["gfx90a", "gfx942"]
    assert '.amdgcn_target "amdgcn-amd-amdhsa--gfx90a' in task["gfx90a"].asm


def test_bad_arch_is_a_config_error(monkeypatch):
    monkeypatch.setattr(config.current, "amdgpu_arch", "sm_90")
    with pytest.raises(QuadrantsConfigError, match="sm_90.*gfx942"):
        Toolchain.current()


def test_unmapped_nvptx_operations_are_named():
    text = ('declare i32 @"llvm.nvvm.read.ptx.sreg.clock"()\n'
            'declare double @"__nv_jn"(i32, double)\n'
            'define void @"k"() {\n  %".1" = call i32 @"llvm.nvvm.read.ptx.sreg.clock"()\n'
            '  %".2" = call i32 asm sideeffect "mov.u32 $0, %smid;", "=r"()\n  ret void\n}\n')
    with pytest.raises(QuadrantsCompilationError) as info:
        codegen.retarget_ir(text, "k", "test")
    message = str(info.value)
    assert "llvm.nvvm.read.ptx.sreg.clock" in message and "__nv_jn" in message and "%smid" in message


def test_retarget_moves_allocas_to_private_memory():
    text = 'define void @"k"(i64 %"n") {\nentry:\n  %"x" = alloca {i64, double}, align 8\n  ret void\n}\n'
    out = codegen.retarget_ir(text, "k", "test")
    assert 'define amdgpu_kernel void @"k"' in out
    assert '%"x.qd_p5" = alloca {i64, double}, align 8, addrspace(5)' in out
    assert '%"x" = addrspacecast ptr addrspace(5) %"x.qd_p5" to ptr' in out


def test_libdevice_table():
    assert codegen._libdevice("__nv_sqrtf") == "llvm.sqrt.f32"
    assert codegen._libdevice("__nv_fmax") == "llvm.maxnum.f64"
    assert codegen._libdevice("__nv_powf") == "__ocml_pow_f32"
    assert codegen._libdevice("__nv_powi") == "__ocml_pown_f64"
    assert codegen._libdevice("__nv_modf") is None       # a pointer result: not in the table
    assert codegen._libdevice("__nv_isnand") == "qd.amdgpu.isnan.f64"


@pytest.mark.skipif(LLD is None, reason="no ld.lld here (install the 'amdgpu' extra: the ziglang wheel)")
def test_code_object_is_loadable_shape():
    @qd.kernel
    def add(a: qd.types.ndarray(dtype=qd.f32, ndim=1), b: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            a[i] += b[i]

    (task,) = _compile(add, {"a": F32, "b": F32})
    blob = task.code_object
    assert blob[:4] == b"\x7fELF" and blob[4] == 2
    info = codegen.elf_info(blob)
    assert info.type == 3 and not info.undefined
    assert task.entry_name + ".kd" in info.defined
    assert b"amdhsa.kernels" in blob            # the code object's metadata note (msgpack)


def test_init_amdgpu_without_rocm_names_what_is_missing():
    with pytest.raises(QuadrantsRuntimeError, match="qd.init\\(arch=amdgpu\\)") as info:
        qd.init(arch=qd.amdgpu)
    assert re.search(r"hip-python|libamdhip64|no AMD GPU", str(info.value))
    qd.init(arch=qd.cpu)


def test_gpu_fallback_order(monkeypatch):
    from qd_numba.targets.base import target_for

    opened = []

    def fails(name):
        def open_():
            opened.append(name)
            raise QuadrantsRuntimeError(f"no {name}")
        return open_

    monkeypatch.setattr(target_for("cuda"), "open", fails("cuda"))
    monkeypatch.setattr(target_for("amdgpu"), "open", fails("amdgpu"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        qd.init(arch=qd.gpu)
    assert opened == ["cuda", "amdgpu"] and config.current.arch == "cpu"
    assert any(issubclass(w.category, QuadrantsWarning) and "no cuda" in str(w.message)
               and "no amdgpu" in str(w.message) for w in caught)
    with pytest.raises(QuadrantsRuntimeError, match="no cuda"):
        qd.init(arch=qd.gpu, enable_fallback=False)
    qd.init(arch=qd.cpu)


class _FakeHip:
    """hip-python's calls that the runtime makes, over host memory: launches are recorded, not run."""

    class hipError_t:  # noqa: N801 - hip-python's name
        hipSuccess = 0

    class hipDeviceProp_t:  # noqa: N801
        gcnArchName = b"gfx942:sramecc+:xnack-"
        multiProcessorCount = 304
        maxThreadsPerMultiProcessor = 2048

    hipEventDisableTiming = 2

    def __init__(self):
        self.buffers, self.launches = [], []

    def hipGetErrorString(self, err):
        return b"hipErrorFake"

    def hipInit(self, flags):
        return (0,)

    def hipSetDevice(self, device):
        return (0,)

    def hipGetDeviceCount(self):
        return (0, 1)

    def hipGetDeviceProperties(self, props, device):
        return (0,)

    def hipMalloc(self, nbytes):
        buf = np.zeros(nbytes, np.uint8)
        self.buffers.append(buf)
        return (0, buf.ctypes.data)

    def hipFree(self, address):
        return (0,)

    def hipMemcpyHtoD(self, dst, src, nbytes):
        ctypes.memmove(dst, np.ascontiguousarray(src).ctypes.data, nbytes)
        return (0,)

    def hipMemcpyDtoH(self, dst, src, nbytes):
        ctypes.memmove(dst.ctypes.data, src, nbytes)
        return (0,)

    def hipModuleLoadData(self, image):
        return (0, ("module", image))

    def hipModuleGetFunction(self, module, name):
        return (0, name.decode())

    def hipModuleOccupancyMaxPotentialBlockSize(self, fn, shared, limit):
        return (0, 1216, 256)

    def hipModuleLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        self.launches.append((fn, gx, bx, params))
        return (0,)


def test_launch_plan_packs_hip_arguments(monkeypatch, rng):
    """The AMDGPU launch plan over a stand-in for hip-python: one hipModuleLaunchKernel per task
    with the task's grid and block and a void*[] whose cells hold the kernel's arguments in the
    kernarg layout (field table, temporaries, then each array as meminfo, parent, nitems,
    itemsize, data, shape, strides, and the scalars)."""
    from qd_numba.targets.amdgpu import kernel as amd_kernel
    from qd_numba.targets.amdgpu import runtime as amd_runtime

    fake = _FakeHip()
    monkeypatch.setattr(amd_runtime, "_hip_python", lambda: fake)
    monkeypatch.setattr(amd_runtime, "_hip_library_loads", lambda: True)
    monkeypatch.setattr(amd_runtime.HipRuntime, "_instance", None)
    monkeypatch.setattr(Toolchain, "require_linker", lambda self: None)

    @qd.kernel
    def axpy(x: qd.types.ndarray(dtype=qd.f32, ndim=1), y: qd.types.ndarray(dtype=qd.f32, ndim=1), a: qd.f32):
        for i in range(x.shape[0]):
            y[i] = a * x[i] + y[i]

    x, y = rng.random(5000).astype(np.float32), rng.random(5000).astype(np.float32)
    backend = amd_kernel.AmdgpuKernel(axpy)
    plan, views = backend._plan((x, y, 2.5))
    (launch,) = plan.launches
    assert launch.binary.kind == "range_for" and launch.block == 256
    assert launch.grid == 304 * 2048 // 256                 # the saturating grid
    plan.run((x, y, 2.5), views)
    (fn, grid, block, argv) = fake.launches[-1]
    assert fn == launch.binary.entry_name and block == 256 and grid == -(-5000 // 256)
    slots = launch.binary.slots
    pointers = (ctypes.c_void_p * len(slots)).from_address(argv)
    fmt_ctypes = {"Q": ctypes.c_uint64, "q": ctypes.c_int64, "f": ctypes.c_float}
    values = [fmt_ctypes[fmt].from_address(p).value for (_name, fmt), p in zip(slots, pointers)]
    x_words, y_words = [0, 0, 5000, 4, views["x"][0], 5000, 4], [0, 0, 5000, 4, views["y"][0], 5000, 4]
    assert values[0] == plan.field_table.address and values[1] == plan.tmp.address
    assert values[2:] == x_words + y_words + [2.5]
    device_x = np.ctypeslib.as_array((ctypes.c_float * 5000).from_address(views["x"][0]))
    assert np.array_equal(device_x, x)      # x's device copy
