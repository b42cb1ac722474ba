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
VEC3 = qd.types.vector(3, qd.f32)
MAT2 = qd.types.matrix(2, 2, qd.f64)
PARTICLE = qd.types.struct(m=qd.f32, v=VEC3, id=qd.i32)


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
    # the grid-stride loop as on CUDA: no 64-bit trip count, its back edge marked not to unroll
    assert "udiv i64" not in ir and "sdiv i64" not in ir and '!"llvm.loop.unroll.disable"' in ir
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
        def open_(cfg=None):
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
    hipStreamNonBlocking = 1

    def __init__(self):
        self.buffers, self.launches = [], []
        self.calls = []             # ("launch", entry, stream) and the stream/event calls, in order
        self.flags = {}             # stream handle -> its creation flags
        self.handles = iter(range(0x1000, 0x2000))
        self.timing = set()         # events made by hipEventCreate (timing enabled)
        self.stamps = iter(())      # the device times (ms) timing events get, in record order
        self.stamped = {}           # timing event -> its time at its last record

    def hipStreamCreate(self):
        handle = next(self.handles)
        self.flags[handle] = 0
        self.calls.append(("hipStreamCreate", handle))
        return (0, handle)

    def hipStreamCreateWithFlags(self, flags):
        handle = next(self.handles)
        self.flags[handle] = flags
        self.calls.append(("hipStreamCreateWithFlags", handle, flags))
        return (0, handle)

    def hipStreamGetFlags(self, stream):
        return (0, self.flags[stream])

    def hipEventCreateWithFlags(self, flags):
        handle = next(self.handles)
        self.calls.append(("hipEventCreate", handle))
        return (0, handle)

    def hipEventCreate(self):
        handle = next(self.handles)
        self.timing.add(handle)
        self.calls.append(("hipEventCreate", handle))
        return (0, handle)

    def hipEventRecord(self, event, stream):
        self.calls.append(("hipEventRecord", event, stream or 0))
        if event in self.timing:
            self.stamped[event] = next(self.stamps)
        return (0,)

    def hipEventElapsedTime(self, start, end):
        return (0, self.stamped[end] - self.stamped[start])

    def hipStreamWaitEvent(self, stream, event, flags):
        self.calls.append(("hipStreamWaitEvent", stream or 0, event))
        return (0,)

    def _call(self, name, *handles):
        self.calls.append((name, *handles))
        return (0,)

    def hipStreamSynchronize(self, stream):
        return self._call("hipStreamSynchronize", stream)

    def hipStreamDestroy(self, stream):
        return self._call("hipStreamDestroy", stream)

    def hipEventSynchronize(self, event):
        return self._call("hipEventSynchronize", event)

    def hipEventDestroy(self, event):
        return self._call("hipEventDestroy", event)

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

    def hipMemcpyDtoD(self, dst, src, nbytes):
        self.calls.append(("hipMemcpyDtoD", dst, src, nbytes))
        ctypes.memmove(dst, src, nbytes)
        return (0,)

    def hipMemcpyDtoH(self, dst, src, nbytes):
        ctypes.memmove(dst.ctypes.data, src, nbytes)
        return (0,)

    def hipModuleLoadData(self, image):
        self.calls.append(("hipModuleLoadData", image))
        return (0, ("module", image))

    def hipModuleGetFunction(self, module, name):
        return (0, name.decode())

    def hipModuleOccupancyMaxPotentialBlockSize(self, fn, shared, limit):
        return (0, 1216, 256)

    def hipModuleLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        self.launches.append((fn, gx, bx, params))
        self.calls.append(("launch", fn, stream or 0))
        return (0,)


@pytest.fixture
def fake_hip(monkeypatch):
    """The AMDGPU runtime over :class:`_FakeHip` (no linker needed: modules are not loaded)."""
    from qd_numba.targets.amdgpu import runtime as amd_runtime

    fake = _FakeHip()
    monkeypatch.setattr(amd_runtime, "_hip_python", lambda: fake)
    monkeypatch.setattr(amd_runtime, "_hip_library_loads", lambda: True)
    monkeypatch.setattr(amd_runtime.HipRuntime, "_instance", None)
    monkeypatch.setattr(Toolchain, "require_linker", lambda self: None)
    return fake


_FMT_CTYPES = {"Q": ctypes.c_uint64, "q": ctypes.c_int64, "i": ctypes.c_int32, "f": ctypes.c_float,
               "d": ctypes.c_double}


def _cell_values(binary, argv):
    """(argument name, value) per kernel parameter slot of a recorded launch's void*[]."""
    pointers = (ctypes.c_void_p * len(binary.slots)).from_address(argv)
    return [(name, _FMT_CTYPES[fmt].from_address(p).value) for (name, fmt), p in zip(binary.slots, pointers)]


def test_launch_plan_packs_hip_arguments(fake_hip, rng):
    """The AMDGPU launch plan over a stand-in for hip-python: one hipModuleLaunchKernel per task
    with the task's grid and block and a void*[] whose cells hold the kernel's arguments in the
    kernarg layout (field table, temporaries, then each array as meminfo, parent, nitems,
    itemsize, data, shape, strides, and the scalars)."""
    from qd_numba.targets.amdgpu import kernel as amd_kernel

    fake = fake_hip

    @qd.kernel
    def axpy(x: qd.types.ndarray(dtype=qd.f32, ndim=1), y: qd.types.ndarray(dtype=qd.f32, ndim=1), a: qd.f32):
        for i in range(x.shape[0]):
            y[i] = a * x[i] + y[i]

    x, y = rng.random(5000).astype(np.float32), rng.random(5000).astype(np.float32)
    backend = amd_kernel.AmdgpuKernel(axpy)
    plan, _args, views = backend._plan((x, y, 2.5))
    (launch,) = plan.launches
    assert launch.binary.kind == "range_for" and launch.block == 256
    assert launch.grid == 304 * 2048 // 256                 # the saturating grid
    plan.run((x, y, 2.5), views)
    (fn, grid, block, argv) = fake.launches[-1]
    assert fn == launch.binary.entry_name and block == 256 and grid == -(-5000 // 256)
    values = [value for _name, value in _cell_values(launch.binary, argv)]
    x_words, y_words = [0, 0, 5000, 4, views["x"][0], 5000, 4], [0, 0, 5000, 4, views["y"][0], 5000, 4]
    assert values[0] == plan.field_table.address and values[1] == plan.tmp.address
    assert values[2:] == x_words + y_words + [2.5]
    device_x = np.ctypeslib.as_array((ctypes.c_float * 5000).from_address(views["x"][0]))
    assert np.array_equal(device_x, x)      # x's device copy


def test_matrix_and_struct_arguments_fill_their_cells(fake_hip, rng):
    """Vector, matrix and struct arguments on qd.amdgpu: checked as on CUDA (a list becomes the
    parameter's type; a wrong value names the argument) and written one cell per element, in the
    data model's order (structs depth first, matrices row-major), at every call."""
    from qd_numba.targets.amdgpu import kernel as amd_kernel

    @qd.kernel
    def move(out: qd.types.ndarray(dtype=qd.f64, ndim=1), v: VEC3, m: MAT2, p: PARTICLE):
        for i in range(out.shape[0]):
            out[i] = v[0] * m[0, 1] + p.v[2] * p.m + p.id

    out = np.zeros(100)
    backend = amd_kernel.AmdgpuKernel(move)
    for _ in range(2):      # the cells are rewritten at every call
        vv, mm = rng.standard_normal(3).astype(np.float32), rng.standard_normal((2, 2))
        pm, pid = np.float32(rng.standard_normal()), int(rng.integers(99))
        pv = rng.standard_normal(3).astype(np.float32)
        args = (out, vv.tolist(), mm.tolist(), PARTICLE(m=float(pm), v=pv.tolist(), id=pid))
        plan, args, views = backend._plan(args)
        plan.run(args, views)
        (launch,) = plan.launches
        cells = _cell_values(launch.binary, fake_hip.launches[-1][3])
        by_name = {name: [value for n, value in cells if n == name] for name in ("v", "m", "p")}
        assert by_name["v"] == vv.tolist()
        assert by_name["m"] == mm.reshape(-1).tolist()
        assert by_name["p"] == [float(pm), *pv.tolist(), pid]
    with pytest.raises(qd.QuadrantsTypeError, match="argument 'p'"):
        backend.call(out, vv.tolist(), mm.tolist(), 3.0)


@pytest.fixture
def on_fake_amdgpu(fake_hip, monkeypatch):
    """``qd.init(arch=qd.amdgpu)`` over :class:`_FakeHip` (launches are recorded, not run)."""
    from qd_numba.targets.base import target_for

    monkeypatch.setattr(target_for("amdgpu"), "open", lambda cfg=None: None)
    qd.init(arch=qd.amdgpu)
    yield fake_hip
    qd.init(arch=qd.cpu)


def _device_bytes(address, nbytes):
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address)).copy()


def test_fields_of_snode_trees(on_fake_amdgpu, rng):
    """Fields placed in SNode trees on qd.amdgpu: each tree is one HIP buffer, the field table
    holds each field's address in it (AoS fields interleaved, a second tree apart), python-scope
    writes reach the device bytes and what the device wrote is what python scope reads."""
    a, b, c = qd.field(qd.f32), qd.field(qd.i32), qd.field(qd.f64)
    qd.root.dense(qd.i, 16).place(a, b)
    fb = qd.FieldsBuilder()
    fb.dense(qd.i, 8).place(c)
    fb.finalize()

    @qd.kernel
    def add():
        for i in range(16):
            a[i] += b[i] + c[i % 8]

    av, bv, cv = rng.random(16).astype(np.float32), rng.integers(-50, 50, 16).astype(np.int32), rng.random(8)
    a.from_numpy(av)
    b.from_numpy(bv)
    c.from_numpy(cv)
    generations = a._gen, b._gen, c._gen
    add()
    # a launch gives what it writes (a, not b or c) a new write generation (adstack sizes are cached on them)
    assert a._gen > max(generations) and (b._gen, c._gen) == generations[1:]
    (plan,) = add.backend().plans.values()
    fields = plan.fields
    assert {id(f) for f in fields} == {id(a), id(b), id(c)}
    table = np.ctypeslib.as_array((ctypes.c_uint64 * 3).from_address(plan.field_table.address)).tolist()
    for f, address in zip(fields, table):
        tree = f._tree
        assert address == tree._dev.address + (f._arr.ctypes.data - tree.base.ctypes.data)
    assert a._tree is b._tree and c._tree is not a._tree
    assert table[[id(f) for f in fields].index(id(b))] - table[[id(f) for f in fields].index(id(a))] == 4   # AoS
    for tree in (a._tree, c._tree):     # python-scope writes were pushed
        assert np.array_equal(_device_bytes(tree._dev.address, tree.base.nbytes), tree.base)
    (launch,) = on_fake_amdgpu.launches
    # the loop's count (16) is known when the kernel compiles: one block of the occupancy size
    assert launch[0] == plan.launches[0].binary.entry_name and launch[1:3] == (1, 256)
    # what "the device" writes (here: into its bytes directly) is what python scope reads
    new = rng.random(16).astype(np.float32)
    stride = a._arr.strides[0]
    address_a = table[[id(f) for f in fields].index(id(a))]
    for i, x in enumerate(new):
        ctypes.c_float.from_address(address_a + i * stride).value = x
    np.testing.assert_array_equal(a.to_numpy(), new)
    np.testing.assert_array_equal(b.to_numpy(), bv)
    assert c[3] == cv[3]


F32_1D = qd.types.ndarray(dtype=qd.f32, ndim=1)


@qd.kernel
def _scale(x: F32_1D, a: qd.f32):
    for i in range(x.shape[0]):
        x[i] *= a


@qd.kernel
def _pair(x: F32_1D, y: F32_1D):
    with qd.stream_parallel():
        for i in range(x.shape[0]):
            x[i] += 1.0
    with qd.stream_parallel():
        for i in range(y.shape[0]):
            y[i] *= 2.0


def _since(fake, mark, names=("launch", "hipEventRecord", "hipStreamWaitEvent")):
    return [c for c in fake.calls[mark:] if c[0] in names]


def test_streams_and_events_through_hip(on_fake_amdgpu, rng):
    """qd.create_stream/create_event and qd_stream= on qd.amdgpu: HIP streams and events with the
    handles qd_numba holds; a created (blocking) stream launches with no fence, a foreign
    non-blocking one is fenced with the null stream on both sides of the launch."""
    fake = on_fake_amdgpu
    x = qd.ndarray(qd.f32, 300)
    x.from_numpy(rng.random(300).astype(np.float32))
    _scale(x, 2.0)
    entry = fake.calls[-1][1]
    assert fake.calls[-1] == ("launch", entry, 0)
    with qd.create_stream() as s, qd.create_stream() as other:
        handles = s.handle, other.handle
        assert ("hipStreamCreate", s.handle) in fake.calls and s.handle != other.handle != 0
        mark = len(fake.calls)
        _scale(x, 2.0, qd_stream=s)
        assert _since(fake, mark) == [("launch", entry, s.handle)]
        done = qd.create_event()
        event = done.handle
        assert fake.calls[-1] == ("hipEventCreate", event)
        mark = len(fake.calls)
        done.record(s)
        done.wait(qd_stream=other)
        done.synchronize()
        other.synchronize()
        done.destroy()
        assert fake.calls[mark:] == [("hipEventRecord", event, s.handle), ("hipStreamWaitEvent", other.handle, event),
                                     ("hipEventSynchronize", event), ("hipStreamSynchronize", other.handle),
                                     ("hipEventDestroy", event)]
    assert fake.calls[-2:] == [("hipStreamDestroy", handles[1]), ("hipStreamDestroy", handles[0])]
    foreign = fake.hipStreamCreateWithFlags(fake.hipStreamNonBlocking)[1]
    mark = len(fake.calls)
    _scale(x, 0.5, qd_stream=foreign)
    (record, wait, launch, record2, wait2) = _since(fake, mark)
    fence = record[1]
    assert record == ("hipEventRecord", fence, 0) and wait == ("hipStreamWaitEvent", foreign, fence)
    assert launch == ("launch", entry, foreign)
    assert record2 == ("hipEventRecord", fence, foreign) and wait2 == ("hipStreamWaitEvent", 0, fence)


def test_stream_parallel_forks_and_joins_over_hip(on_fake_amdgpu, rng):
    """Two qd.stream_parallel() blocks on qd.amdgpu: the first on the caller's stream, the second
    on a non-blocking pool stream, forked and joined by events (as CUDA's StreamBlocks)."""
    fake = on_fake_amdgpu
    x, y = rng.random(1000).astype(np.float32), rng.random(500).astype(np.float32)
    mark = len(fake.calls)
    _pair(x, y)
    (pool,) = [c[1] for c in fake.calls[mark:] if c[0] == "hipStreamCreateWithFlags"]
    assert fake.flags[pool] == fake.hipStreamNonBlocking
    (plan,) = _pair.backend().plans.values()
    fork, join = plan.events
    first, second = (launch.binary.entry_name for launch in plan.launches)

    def fork_join(caller):
        return [("hipEventRecord", fork, caller), ("launch", first, caller), ("hipStreamWaitEvent", pool, fork),
                ("launch", second, pool), ("hipEventRecord", join, pool), ("hipStreamWaitEvent", caller, join)]

    assert _since(fake, mark) == fork_join(0)
    with qd.create_stream() as s:    # on a caller's stream: forked from and joined to it; the pool is reused
        mark = len(fake.calls)
        _pair(x, y, qd_stream=s)
        assert _since(fake, mark) == fork_join(s.handle)
    assert len([c for c in fake.calls if c[0] == "hipStreamCreateWithFlags"]) == 1


def test_adstacks_of_gradient_kernels(on_fake_amdgpu, rng):
    """A gradient kernel with a loop inside its task on qd.amdgpu: before each launch its adstack
    descriptor on the device holds a HIP heap of depth x rows words (rows: the task's saturating
    grid), re-sized when the loop bound grows; an overflow flag the device set raises, naming the
    kernel, and is cleared for the next launch."""
    x = qd.field(qd.f64, shape=(8,), needs_grad=True)
    n = qd.field(qd.i32, shape=())
    loss = qd.field(qd.f64, shape=(), needs_grad=True)

    @qd.kernel
    def anchor():
        for i in x:
            v = x[i]
            for _ in range(n[None]):
                v = qd.sin(v) * 1.01
            loss[None] += v

    x.from_numpy(rng.uniform(-2, 2, 8))
    depths = []
    for steps in (3, 9):
        n[None] = steps
        anchor.grad()
        (stack,) = anchor.grad.adstacks
        (plan,) = anchor.grad.backend().plans.values()
        (launch,) = [la for la in plan.launches if la.binary.task.uid == stack.task_uid]
        desc = np.ctypeslib.as_array((ctypes.c_int64 * 4).from_address(stack.desc._dev.address)).tolist()
        assert desc == [stack.heap.address, stack.depth, launch.grid * launch.block, 0]
        assert stack.heap.size >= stack.depth * launch.grid * launch.block and stack.depth >= steps
        depths.append(stack.depth)
    assert depths[1] > depths[0]
    ctypes.c_int64.from_address(stack.desc._dev.address + 24).value = 1      # the device's overflow flag
    with pytest.raises(qd.QuadrantsRuntimeError, match="adstack overflow"):
        anchor.grad()
    anchor.grad()
    assert ctypes.c_int64.from_address(stack.desc._dev.address + 24).value == 0


CACHED_SOURCE = """
@qd.kernel
def scale(a: qd.f32):
    for i in x:
        y[i] = x[i] * a
"""


def test_offline_cache_of_code_objects(fake_hip, monkeypatch, tmp_path, rng):
    """The offline cache on qd.amdgpu: a kernel compiled once is, in a fresh process (nothing
    loaded, new fields of the same layout), loaded from its entry: no compile, the same code
    objects handed to hipModuleLoadData, the new fields in the field table. Keys differ by
    processor."""
    import textwrap

    from qd_numba import offline_cache
    from qd_numba.targets.base import target_for

    monkeypatch.setattr(target_for("amdgpu"), "open", lambda cfg=None: None)
    options = {"arch": qd.amdgpu, "offline_cache": True, "offline_cache_file_path": str(tmp_path)}

    def define():
        ns = {"qd": qd, "x": qd.field(qd.f32, shape=64), "y": qd.field(qd.f32, shape=64), "__name__": "amd_cached"}
        exec(compile(textwrap.dedent(CACHED_SOURCE), "<cell>", "exec"), ns)
        ns["x"].from_numpy(rng.random(64).astype(np.float32))
        return ns

    def loads(mark):
        return [c[1] for c in fake_hip.calls[mark:] if c[0] == "hipModuleLoadData"]

    try:
        qd.init(**options)
        offline_cache.stats.__init__()
        ns = define()
        ns["scale"](2.0)
        compiled_images = loads(0)
        assert ns["scale"].compile_count == 1 and len(compiled_images) == 1
        assert len(list(tmp_path.rglob("*" + offline_cache.SUFFIX))) == 1
        offline_cache._loaded.clear()       # a fresh process
        qd.init(**options)
        offline_cache.stats.__init__()
        mark = len(fake_hip.calls)
        ns = define()
        ns["scale"](3.0)
        assert ns["scale"].compile_count == 0 and offline_cache.stats.hits == 1
        assert loads(mark) == compiled_images
        (plan,) = ns["scale"].backend().plans.values()
        table = np.ctypeslib.as_array((ctypes.c_uint64 * 2).from_address(plan.field_table.address)).tolist()
        assert sorted(table) == sorted([ns["x"]._dev.address, ns["y"]._dev.address])
    finally:
        offline_cache._loaded.clear()
        qd.init(arch=qd.cpu)
    toolchain = Toolchain.current()
    assert toolchain.cache_target("gfx942") != toolchain.cache_target("gfx90a")
    assert toolchain.cache_target("gfx942").startswith("amdgpu-gfx942-llvm")


# -- DLPack and the kernel profiler on qd.amdgpu (over the stand-in) ------------------------------------

_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))


def _dl_tensor(capsule, versioned=False):
    """The DLTensor of an exported capsule (not consumed: valid while the capsule lives)."""
    from qd_numba import dlpack

    managed = dlpack.DLManagedTensorVersioned if versioned else dlpack.DLManagedTensor
    name = b"dltensor_versioned" if versioned else b"dltensor"
    return ctypes.cast(_get_pointer(capsule, name), ctypes.POINTER(managed)).contents.dl_tensor


def _described(t):
    """(data, (device type, id), shape, strides, (type code, bits, lanes)) of a DLTensor."""
    return (t.data, (t.device.device_type, t.device.device_id), tuple(t.shape[k] for k in range(t.ndim)),
            tuple(t.strides[k] for k in range(t.ndim)), (t.dtype.code, t.dtype.bits, t.dtype.lanes))


def test_dlpack_export_of_hip_memory(on_fake_amdgpu, rng):
    """qd.ndarray and field exports on qd.amdgpu: DLPack device type kDLROCM (10) with the HIP
    device id and the HipArray's address (zero-copy), shape and strides in elements; ordered for
    the consumer's stream by DLPack's ROCm rules (None/0/-1 and a blocking stream: no call; a
    non-blocking one waits on the null stream through an event; CUDA's 1 refused); copy=True a
    device-to-device copy; a dl_device other than (10, 0) our error."""
    fake = on_fake_amdgpu
    host = rng.random((5, 7)).astype(np.float32)
    x = qd.ndarray(qd.f32, (5, 7))
    x.from_numpy(host)
    f = qd.field(qd.f64, shape=6)
    fh = rng.random(6)
    f.from_numpy(fh)
    assert x.__dlpack_device__() == (10, 0) and f.__dlpack_device__() == (10, 0)
    mark = len(fake.calls)
    for stream in (None, 0, -1):
        capsule = x.__dlpack__(stream=stream)
        t = _dl_tensor(capsule)
        assert _described(t) == (x._dev.address, (10, 0), (5, 7), (7, 1), (2, 32, 1))
    with qd.create_stream() as s:
        x.__dlpack__(stream=s.handle)
    capsule = f.__dlpack__(max_version=(1, 0))
    t = _dl_tensor(capsule, versioned=True)
    assert _described(t) == (f._dev.address, (10, 0), (6,), (1,), (2, 64, 1))
    assert _since(fake, mark, ("hipEventRecord", "hipStreamWaitEvent", "hipMemcpyDtoD")) == []
    np.testing.assert_array_equal(np.ctypeslib.as_array((ctypes.c_float * 35).from_address(x._dev.address)),
                                  host.reshape(-1))
    foreign = fake.hipStreamCreateWithFlags(fake.hipStreamNonBlocking)[1]
    mark = len(fake.calls)
    x.__dlpack__(stream=foreign)
    (record, wait) = _since(fake, mark)
    assert record == ("hipEventRecord", record[1], 0) and wait == ("hipStreamWaitEvent", foreign, record[1])
    with pytest.raises(qd.QuadrantsTypeError, match="stream 1 is not a ROCm stream"):
        x.__dlpack__(stream=1)
    mark = len(fake.calls)
    copied = x.__dlpack__(copy=True)
    t = _dl_tensor(copied)
    assert t.data != x._dev.address and _described(t)[1:] == ((10, 0), (5, 7), (7, 1), (2, 32, 1))
    assert _since(fake, mark, ("hipMemcpyDtoD",)) == [("hipMemcpyDtoD", t.data, x._dev.address, host.nbytes)]
    np.testing.assert_array_equal(np.ctypeslib.as_array((ctypes.c_float * 35).from_address(t.data)),
                                  host.reshape(-1))
    with pytest.raises(qd.QuadrantsTypeError, match=r"is on DLPack device \(10, 0\), not \(2, 0\)"):
        x.__dlpack__(dl_device=(2, 0))
    assert x.__dlpack__(dl_device=(10, 0)) is not None


class _RocmProducer:
    """A DLPack producer of HIP memory (torch on ROCm, cupy, jax) made with qd_numba.dlpack's own
    structures: a C-ordered (rows, cols) float32 array of random data, exported as it is or
    transposed; it notes the streams it is asked for and when the consumer releases a tensor."""

    class Storage:
        pass

    def __init__(self, fake, data, device=(10, 0), transposed=False):
        self.data, self.device, self.transposed = data, device, transposed
        self.address = fake.hipMalloc(data.nbytes)[1]
        ctypes.memmove(self.address, data.ctypes.data, data.nbytes)
        self.streams, self.released = [], []

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None):
        import weakref

        from qd_numba import dlpack

        self.streams.append(stream)
        storage = self.Storage()
        weakref.finalize(storage, self.released.append, True)
        rows, cols = self.data.shape
        shape, strides = ((cols, rows), (1, cols)) if self.transposed else ((rows, cols), (cols, 1))
        return dlpack.capsule(self.address, shape, strides, self.data.dtype, self.device, storage)


@qd.kernel
def _shift(x: qd.types.ndarray(dtype=qd.f32, ndim=2), d: qd.f32):
    for i, j in qd.ndrange(x.shape[0], x.shape[1]):
        x[i, j] += d


def test_dlpack_import_of_rocm_arrays(on_fake_amdgpu, rng, monkeypatch):
    """A ROCm DLPack producer as a kernel argument on qd.amdgpu: viewed zero-copy (the launch's
    cells hold its address, shape and byte strides; a transposed one is strided), asked for
    ROCm's default stream (0), its tensor kept alive until the launch and released after it;
    another device type or device id is our error naming the argument, and nothing is consumed."""
    import gc

    fake = on_fake_amdgpu
    released_at_launch = []
    launch = fake.hipModuleLaunchKernel

    def noting(*args):
        released_at_launch.append(list(producer.released))
        return launch(*args)

    monkeypatch.setattr(fake, "hipModuleLaunchKernel", noting)
    for transposed in (False, True):
        data = rng.random((6, 9)).astype(np.float32)
        producer = _RocmProducer(fake, data, transposed=transposed)
        _shift(producer, 0.5)
        gc.collect()
        assert producer.streams == [0] and released_at_launch[-1] == [] and producer.released == [True]
        entry = fake.launches[-1][0]
        (plan,) = [p for p in _shift.backend().plans.values() if p.launches[0].binary.entry_name == entry]
        words = [value for name, value in _cell_values(plan.launches[0].binary, fake.launches[-1][3]) if name == "x"]
        shape, strides = ((9, 6), (4, 36)) if transposed else ((6, 9), (36, 4))
        assert words == [0, 0, 54, 4, producer.address, *shape, *strides]
    assert len(_shift.backend().plans) == 2     # contiguous ("C") and strided ("A") views
    for device, message in (((2, 0), "argument 'x': a DLPack array on device type 2 cannot be passed to a "
                                     "qd.amdgpu kernel"),
                            ((10, 3), "argument 'x': the array is on ROCm device 3, but qd_numba runs on device 0")):
        producer = _RocmProducer(fake, rng.random((2, 2)).astype(np.float32), device=device)
        with pytest.raises(qd.QuadrantsTypeError, match=re.escape(message)):
            _shift(producer, 1.0)
        assert producer.streams == []
    with pytest.raises(qd.QuadrantsTypeError, match="argument 'x': got the field"):
        _shift(qd.field(qd.f32, shape=(2, 2)), 1.0)


@qd.kernel
def _two_loops(x: F32_1D, n: qd.i32):
    for i in range(x.shape[0]):
        x[i] *= 2.0
    for i in range(n):
        x[i] += 1.0


def test_kernel_profiler_times_tasks_with_hip_events(on_fake_amdgpu, rng, capsys):
    """qd.init(kernel_profiler=True) on qd.amdgpu: each task's hipModuleLaunchKernel sits between
    two timing events (hipEventCreate, recorded on the launch stream; a task with no iterations
    too), read lazily with hipEventElapsedTime: the kernel's and each task's times are the
    stand-in's device times, through qd.profiler's per-task records."""
    fake = on_fake_amdgpu
    qd.init(arch=qd.amdgpu, kernel_profiler=True)
    x = qd.ndarray(qd.f32, 100)
    x.from_numpy(rng.random(100).astype(np.float32))
    stamps = np.cumsum(rng.uniform(0.01, 3.0, 1 + 4 * 3))     # the anchor, then 4 events per call
    fake.stamps = iter(stamps.tolist())
    mark = len(fake.calls)
    _two_loops(x, 50)
    tasks = _two_loops.tasks(x, 50)
    first, second = (t.name for t in tasks)
    (plan,) = _two_loops.backend().plans.values()
    entries = [launch.binary.entry_name for launch in plan.launches]
    recorded = _since(fake, mark, ("launch", "hipEventRecord"))
    anchor, *events = [c[1] for c in recorded if c[0] == "hipEventRecord"]
    assert {anchor, *events} <= fake.timing and len(set(events)) == 4
    assert recorded[1:] == [("hipEventRecord", events[0], 0), ("launch", entries[0], 0),
                            ("hipEventRecord", events[1], 0), ("hipEventRecord", events[2], 0),
                            ("launch", entries[1], 0), ("hipEventRecord", events[3], 0)]
    with qd.create_stream() as s:
        mark = len(fake.calls)
        _two_loops(x, 0, qd_stream=s)                   # the second loop does not launch
        assert [c[0] for c in _since(fake, mark, ("launch", "hipEventRecord"))] == \
            ["hipEventRecord", "launch", "hipEventRecord", "hipEventRecord", "hipEventRecord"]
        assert {c[2] for c in _since(fake, mark)} == {s.handle}
    _two_loops(x, 100)
    assert qd.profiler.kernel_profiler.pending_gpu_calls == 3
    calls = stamps[1:].reshape(3, 4)
    kernel_ms, first_ms, second_ms = calls[:, 3] - calls[:, 0], calls[:, 1] - calls[:, 0], calls[:, 3] - calls[:, 2]
    for name, want in (("_two_loops", kernel_ms), (first, first_ms), (second, second_ms[[0, 2]])):
        got = qd.profiler.query_kernel_profiler_info(name)
        assert got.counter == len(want)
        assert (got.min, got.max, got.total) == pytest.approx((want.min(), want.max(), want.sum()), abs=1e-5)
    assert qd.profiler.kernel_profiler.pending_gpu_calls == 0
    records = qd.profiler.kernel_profiler.records()
    assert {r.device for r in records} == {"amdgpu"}
    starts = [r.start_ns for r in records if r.kind == "kernel"]
    assert np.diff(starts) == pytest.approx(np.diff(calls[:, 0]) * 1e6, abs=2)
    qd.profiler.print_kernel_profiler_info()
    out = capsys.readouterr().out
    assert "Kernel Profiler(count) @ AMDGPU" in out and first in out and second in out
