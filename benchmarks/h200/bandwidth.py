#!/usr/bin/env python3
"""Measure the GPU's memory read bandwidth with torch (the way FACTS.md did):
time a sum over an 8 GiB tensor (reads every byte once) and a device-to-device
copy, with CUDA events, after warm-ups. Prints JSON."""
import json
import sys

import torch


def timed(fn, reps):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1000.0 / reps


def main():
    gib = 1 << 30
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    x = torch.ones(size * gib // 4, dtype=torch.float32, device="cuda")
    read_s = timed(lambda: x.sum(), 20)
    y = torch.empty_like(x)
    copy_s = timed(lambda: y.copy_(x), 10)
    out = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "bytes": x.numel() * 4,
        "read_gbs": round(x.numel() * 4 / read_s / 1e9, 1),
        "copy_gbs_read_plus_write": round(2 * x.numel() * 4 / copy_s / 1e9, 1),
        "method": "torch sum over %d GiB f32 (20 reps) and copy_ (10 reps), CUDA events, after 3 warm-ups" % size,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
