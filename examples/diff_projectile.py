"""A differentiable particle simulation optimised by gradient descent (reverse-mode autodiff).

N particles start at the origin with initial velocities ``v0`` (the parameters), fall under
gravity with linear drag for STEPS explicit Euler steps, and should land on their targets.
``qd.ad.Tape`` records the simulation and the loss kernel; each step of gradient descent uses
``v0.grad``. The program checks that the loss falls by orders of magnitude and that the
gradient matches central finite differences of a numpy version of the same simulation, then
prints OK.
"""

import sys

import numpy as np

import qd_numba as qd

qd.init()
N, STEPS, DT, DRAG, G = 64, 40, 0.02, 0.3, -9.8
v0 = qd.field(qd.f64, shape=(N, 2), needs_grad=True)
px, py, vx, vy = (qd.field(qd.f64, shape=(STEPS + 1, N), needs_grad=True) for _ in range(4))
target = qd.field(qd.f64, shape=(N, 2))
loss = qd.field(qd.f64, shape=(), needs_grad=True)


@qd.kernel
def launch():
    for i in range(N):
        vx[0, i] = v0[i, 0]
        vy[0, i] = v0[i, 1]
        px[0, i] = 0.0
        py[0, i] = 0.0


@qd.kernel
def step(t: qd.i32):
    for i in range(N):
        u = vx[t - 1, i] - DT * DRAG * vx[t - 1, i]
        w = vy[t - 1, i] + DT * (G - DRAG * vy[t - 1, i])
        vx[t, i] = u
        vy[t, i] = w
        px[t, i] = px[t - 1, i] + DT * u
        py[t, i] = py[t - 1, i] + DT * w


@qd.kernel
def compute_loss():
    for i in range(N):
        dx = px[STEPS, i] - target[i, 0]
        dy = py[STEPS, i] - target[i, 1]
        loss[None] += (dx * dx + dy * dy) / N


def simulate():
    launch()
    for t in range(1, STEPS + 1):
        step(t)
    compute_loss()


def numpy_loss(v_init, goal):
    vel, pos = v_init.copy(), np.zeros_like(v_init)
    for _ in range(STEPS):
        vel = np.stack([vel[:, 0] - DT * DRAG * vel[:, 0], vel[:, 1] + DT * (G - DRAG * vel[:, 1])], axis=1)
        pos = pos + DT * vel
    return np.sum((pos - goal) ** 2) / N


def main():
    rng = np.random.default_rng(7)
    goal = np.stack([rng.uniform(0.5, 2.0, N), rng.uniform(-0.5, 0.5, N)], axis=1)
    target.from_numpy(goal)
    v0.from_numpy(rng.uniform(-1.0, 1.0, (N, 2)))
    losses = []
    for it in range(60):
        loss[None] = 0.0
        with qd.ad.Tape(loss=loss):
            simulate()
        losses.append(loss[None])
        if it == 0:
            params = v0.to_numpy()
            eps, fd = 1e-6, np.zeros_like(params)
            for k in np.ndindex(params.shape):
                up, down = params.copy(), params.copy()
                up[k] += eps
                down[k] -= eps
                fd[k] = (numpy_loss(up, goal) - numpy_loss(down, goal)) / (2 * eps)
            if not np.allclose(v0.grad.to_numpy(), fd, rtol=1e-4, atol=1e-9):
                print("gradient differs from finite differences", file=sys.stderr)
                return 1
            if not np.isclose(losses[0], numpy_loss(params, goal), rtol=1e-10):
                print("loss differs from numpy", file=sys.stderr)
                return 1
        v0.from_numpy(v0.to_numpy() - 20.0 * v0.grad.to_numpy())
    print(f"loss {losses[0]:.4g} -> {losses[-1]:.4g}")
    if not losses[-1] < 1e-3 * losses[0]:
        print("the loss did not decrease enough", file=sys.stderr)
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
