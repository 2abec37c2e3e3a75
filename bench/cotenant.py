"""A co-tenant: another process keeping one GPU busy with matrix products, so that it delivers
only part of its speed to embedx (time-slicing between processes).

    python bench/cotenant.py --device 1 --seconds 120 [--size 8192]
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--size", type=int, default=8192)
    args = parser.parse_args()
    import torch

    torch.cuda.set_device(args.device)
    a = torch.randn(args.size, args.size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(args.size, args.size, device="cuda", dtype=torch.bfloat16)
    stop = time.monotonic() + args.seconds
    while time.monotonic() < stop:
        for _ in range(20):
            a = (a @ b) / args.size**0.5
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
