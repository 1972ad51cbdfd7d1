"""Times a PyTorch training step on the CPU of the two networks that
`jetfabric train` trains (eval_mnist.py builds them), at batch 128 with
Adam 1e-3 on synthetic data of MNIST's shapes, as the anchor of jetfabric's
CPU step time: run it on the same cores as the fabric.

usage: python3 step_time.py mlp|cnn [THREADS] [STEPS]

Prints one JSON line: the model, the threads and the mean step in ms
after 10 warm-up steps.
"""
import json, os, sys, time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from eval_mnist import model  # noqa: E402


def main():
    kind = sys.argv[1]
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else (20 if kind == "cnn" else 200)
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    m = model(kind)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    x, y = torch.randn(128, 1, 28, 28), torch.randint(0, 10, (128,))

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(m(x), y)
        loss.backward()
        opt.step()

    for _ in range(10):
        step()
    t = time.perf_counter()
    for _ in range(steps):
        step()
    ms = (time.perf_counter() - t) / steps * 1e3
    print(json.dumps({"model": kind, "threads": threads, "step_ms": round(ms, 3), "torch": torch.__version__}))


if __name__ == "__main__":
    main()
