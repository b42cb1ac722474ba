"""The example programs run and pass their own checks against numpy (each exits non-zero when
its result is wrong). They run in a fresh interpreter, on the arch the suite runs on (the
subprocess inherits ``QD_ARCH`` under ``pytest --arch=cuda``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


@pytest.mark.parametrize("name", ["heat_diffusion", "monte_carlo_pi", "particles", "diff_projectile",
                                  "distributed_jacobi"])
def test_example_runs_and_checks_itself(name):
    out = subprocess.run([sys.executable, os.path.join(EXAMPLES, f"{name}.py")], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert "OK" in out.stdout, out.stdout[-2000:]
