"""The qd.linalg example programs run at small sizes and pass their own checks: examples/fem_cg.py
(implicit FEM steps by matrix-free CG, against numpy and SparseSolver) and examples/poisson.py
(Jacobi and CG on a qd.root.dense grid, against numpy's direct solve). Each runs in a fresh
interpreter on the suite's arch (``QD_ARCH`` is inherited under ``pytest --arch=cuda``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


@pytest.mark.parametrize("name,args", [("fem_cg", ["--nx", "8", "--ny", "3", "--steps", "2"]),
                                       ("poisson", ["--n", "12"])])
def test_linalg_program_runs_and_checks_itself(name, args):
    out = subprocess.run([sys.executable, os.path.join(EXAMPLES, f"{name}.py"), *args], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert "OK" in out.stdout, out.stdout[-2000:]
    assert "FAILED" not in out.stdout
