"""Shared fixtures: qd.init once per test module, and a seeded numpy RNG."""

from __future__ import annotations

import numpy as np
import pytest

import qd_numba as qd


@pytest.fixture(scope="module", autouse=True)
def qd_init():
    qd.init(arch=qd.cpu)
    yield


@pytest.fixture
def rng(request):
    seed = abs(hash(request.node.nodeid)) % (2**32)
    return np.random.default_rng(seed)
