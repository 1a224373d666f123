"""Where W4's per-client time goes: the weight gradient of a 1024 x 1024 linear
layer at a small batch is a matrix product with an inner dimension of the batch size,
``grad_out.T @ inputs`` ((1024, K) @ (K, 1024)). This times torch's ``mm`` for that shape on one
thread, beside the time to write its 4 MiB result (``fill_``), the forward product
(K, 1024) @ (1024, 1024), and a 1024^3 product (the machine's compute rate). Prints one JSON line
per K.

    python experiments/benchmarks/small_batch_gemm.py [--batch 4 8 16 32 64] [--repeats 200]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import torch


def microseconds(work: Callable[[], object], repeats: int) -> float:
    """Mean wall time of ``work()`` after 10 warm-up calls, in microseconds."""
    for _ in range(10):
        work()
    started = time.perf_counter()
    for _ in range(repeats):
        work()
    return (time.perf_counter() - started) / repeats * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[4, 8, 16, 32, 64])
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    weight = torch.randn(1024, 1024)
    result = torch.empty(1024, 1024)
    square = microseconds(lambda: torch.mm(weight, weight), max(args.repeats // 10, 5))
    for batch in args.batch:
        grad_out, inputs = torch.randn(batch, 1024), torch.randn(batch, 1024)
        gradient = microseconds(
            lambda g=grad_out, x=inputs: torch.mm(g.t(), x, out=result), args.repeats)
        print(json.dumps({
            "batch": batch, "torch": torch.__version__,
            "weight_gradient_us": round(gradient, 1),
            "write_result_us": round(microseconds(lambda: result.fill_(1.0), args.repeats), 1),
            "forward_us": round(microseconds(lambda g=grad_out: g @ weight, args.repeats), 1),
            "weight_gradient_gflops": round(2 * batch * 1024 * 1024 / gradient / 1e3, 1),
            "square_product_gflops": round(2 * 1024 ** 3 / square / 1e3, 1)}), flush=True)


if __name__ == "__main__":
    main()
