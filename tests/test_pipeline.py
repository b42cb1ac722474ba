"""The pipeline is data: its stages can be listed and printed, and QD_DUMP_IR prints them."""

from __future__ import annotations

import numpy as np

import qd_numba as qd
from qd_numba import config
from qd_numba.passes.pipeline import UNTYPED_PIPELINE, describe
from qd_numba.targets import cpu


def test_pipeline_lists_every_pass_once_per_stage():
    names = [p.name for stage in UNTYPED_PIPELINE for p in stage.passes]
    assert names[0] == "bind_arguments"
    assert names[-10:] == ["offload", "bind_random_streams", "fuse_adjacent_tasks", "reduce_atomics", "plan_tasks",
                           "tag_serial_stream_groups", "cfg_optimize", "reverse_mode", "forward_mode", "ad_validation"]
    assert names.count("mark_stream_blocks") == 1 and names.index("mark_stream_blocks") < names.index("offload")
    text = describe(UNTYPED_PIPELINE, cpu.CODEGEN_STAGES)
    lines = text.splitlines()
    assert len(lines) == len(UNTYPED_PIPELINE) + len(cpu.CODEGEN_STAGES)
    assert "(to a fixed point)" in lines[1] and "inline_funcs" in lines[1]


def test_dump_ir_prints_the_pipeline(capsys, rng, arch):
    @qd.kernel
    def double(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            a[i] *= 2.0

    saved = config.current.print_ir
    config.current.print_ir = True
    try:
        a = rng.random(8).astype(np.float32)
        expected = a * 2
        double(a)
    finally:
        config.current.print_ir = saved
    np.testing.assert_allclose(a, expected)
    err = capsys.readouterr().err
    if arch == "cuda":
        from qd_numba.targets.cuda import plan

        stages = plan.CODEGEN_STAGES
    else:
        stages = cpu.CODEGEN_STAGES
    assert f"=== qd_numba pipeline of kernel 'double' ===\n{describe(UNTYPED_PIPELINE, stages)}" in err
    assert "after offload ===" in err
