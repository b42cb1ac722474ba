"""The real programs of examples/ (MPM88, the particle list on dynamic SNodes) at small sizes,
against numpy: conservation laws, one MPM substep against an independent numpy step, the same
result for every particle layout (AoS, SoA, blocked), and per-cell lists against numpy; and the
cases of bench/sparse_bench.py at a small size (the bench's results are right).
The ``cuda``-marked variants run them at larger sizes on the device.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

import qd_numba as qd

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _example(name: str, folder: str = "examples"):
    spec = importlib.util.spec_from_file_location(f"qd_{folder}_{name}", os.path.join(ROOT, folder, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


mpm88 = _example("mpm88")
particle_list = _example("particle_list")
sparse_bench = _example("sparse_bench", "bench")


@pytest.fixture
def cuda_arch(arch):
    """On the GPU for the test, then back on the suite's arch."""
    qd.init(arch=qd.cuda)
    yield
    qd.init(arch=qd.cuda if arch == "cuda" else qd.cpu)


def _mpm_checks(n_particles, n_grid, seed):
    failed = [(name, detail) for name, ok, detail in mpm88.check(n_particles, n_grid, seed) if not ok]
    assert not failed, failed


def test_mpm88_conserves_mass_and_momentum_and_matches_numpy():
    _mpm_checks(256, 32, seed=3)


def test_mpm88_layouts_give_the_same_run(rng):
    """AoS, SoA and blocked particle records: the same kernels, the same numbers (after a
    substep: atomic adds on the grid may sum in another order, so within float rounding)."""
    init = rng.uniform(0.3, 0.6, (128, 2)).astype(np.float32), rng.uniform(-1, 1, (128, 2)).astype(np.float32)
    results = {}
    for layout in ("aos", "soa", "blocked"):
        sim = mpm88.MPM88(128, 32, layout=layout)
        sim.x.from_numpy(init[0])
        sim.v.from_numpy(init[1])
        sim.C.fill(0.0)
        sim.J.fill(1.0)
        for _ in range(5):
            sim.substep()
        results[layout] = sim.x.to_numpy(), sim.v.to_numpy(), sim.J.to_numpy()
    for layout in ("soa", "blocked"):
        for got, ref in zip(results[layout], results["aos"]):
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    assert np.abs(results["aos"][0] - init[0]).max() > 1e-4     # the particles moved


def test_mpm88_run_keeps_particles_in_the_domain():
    sim = mpm88.run(512, 32, 150)
    x = sim.x.to_numpy()
    assert np.isfinite(x).all() and ((x > 0) & (x < 1)).all()
    assert x[:, 1].min() < 0.15 - 0.02            # the block fell (it starts at y >= 0.15)


def test_particle_list_matches_numpy():
    sim, problems = particle_list.run(600, 8, steps=3, seed=5)
    assert not problems, problems
    assert sim.neighbours.to_numpy().sum() > 0 and sim.lengths.to_numpy().sum() == 600


def test_particle_list_radius_above_a_cell_is_refused():
    with pytest.raises(ValueError, match="radius"):
        particle_list.ParticleList(10, 4, 8, radius=0.3)


@pytest.mark.parametrize("layout, fraction", [("dense", 1.0), ("bitmasked", 0.1), ("pointer", 0.1)])
def test_sparse_bench_case_is_right(layout, fraction):
    """The bench's struct-for visits exactly the written cells (its own check against numpy)."""
    r = sparse_bench.child(qd, layout, 64, fraction, timed=False)
    assert r["ok"], r
    want = {"dense": 64 * 64, "bitmasked": round(0.1 * 64 * 64), "pointer": round(0.1 * 8 * 8) * 64}[layout]
    assert r["active_cells"] == want


@pytest.mark.cuda
def test_mpm88_on_gpu(cuda_arch):
    _mpm_checks(8192, 128, seed=4)
    sim = mpm88.run(8192, 128, 500)
    x = sim.x.to_numpy()
    assert np.isfinite(x).all() and ((x > 0) & (x < 1)).all()


@pytest.mark.cuda
def test_particle_list_on_gpu(cuda_arch):
    sim, problems = particle_list.run(20_000, 64, steps=4, seed=6)
    assert not problems, problems
