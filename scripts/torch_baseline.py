#!/usr/bin/env python3
"""Vendor-library ceilings for docs/performance.md, measured on the GPU in
the same run as our kernels: device-to-device copy bandwidth, torch.matmul
(bf16) and torch._scaled_mm (fp8 e4m3, per-tensor scales) on the Flash and
Pro GEMM shapes at 1, 8, 64, 512 and 4096 tokens. Prints one JSON object per
line: {"kind": ..., "shape": ..., "m":, "n":, "k":, "us":, "gbs":, "tflops":}.
Times are CUDA-event medians of the mean of 10 back-to-back launches."""
import json
import os
import sys

import torch

# TOKENS=4096 (environment) restricts the token counts.
TOKENS = [int(t) for t in os.environ.get("TOKENS", "1,8,64,512,4096").split(",")]
# (name, N, K): the dense linears of Flash and Pro (spec §1, configs) and the
# per-expert MoE shapes (gate|up fused, down).
SHAPES = {
    "flash": [("wq_a", 1024, 4096), ("wq_b", 32768, 1024), ("wkv", 512, 4096), ("wo_b", 4096, 8192),
              ("shared_w13", 4096, 4096), ("shared_w2", 4096, 2048), ("expert_w13", 4096, 4096),
              ("expert_w2", 4096, 2048)],
    "pro": [("wq_a", 1536, 7168), ("wq_b", 65536, 1536), ("wkv", 512, 7168), ("wo_b", 7168, 16384),
            ("shared_w13", 6144, 7168), ("shared_w2", 7168, 3072), ("expert_w13", 6144, 7168),
            ("expert_w2", 7168, 3072)],
}


def timed(f, reps=20, inner=10):
    """Median over reps of the mean of inner back-to-back launches, replayed
    from a captured CUDA graph so that Python's launch latency (~20-45 us per
    call) does not stand in for the kernel's time at small shapes. Falls back
    to eager launches where capture fails."""
    f()
    torch.cuda.synchronize()
    run = None
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            f()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(inner):
                f()
        run = g.replay
    except Exception as e:  # noqa: BLE001 - any capture failure means eager timing
        print("# graph capture failed, eager timing: %s" % e, file=sys.stderr)
        torch.cuda.synchronize()

        def run():
            for _ in range(inner):
                f()
    run()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1000.0 / inner)
    ts.sort()
    return ts[len(ts) // 2]


def emit(**kw):
    print(json.dumps(kw), flush=True)


def main():
    dev = torch.device("cuda")
    print("# " + torch.cuda.get_device_name(0) + " torch " + torch.__version__, file=sys.stderr)
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    us = timed(lambda: dst.copy_(src))
    emit(kind="copy", shape="1 GiB d2d", us=us, gbs=2 * n / us / 1e3)
    del src, dst
    for model, shapes in SHAPES.items():
        for name, N, K in shapes:
            w = torch.randn(N, K, device=dev, dtype=torch.bfloat16)
            w8 = w.to(torch.float8_e4m3fn)
            one = torch.ones((), device=dev, dtype=torch.float32)
            for m in TOKENS:
                x = torch.randn(m, K, device=dev, dtype=torch.bfloat16)
                flops = 2.0 * m * N * K
                us = timed(lambda: torch.matmul(x, w.t()))
                emit(kind="bf16", model=model, shape=name, m=m, n=N, k=K, us=us,
                     gbs=(2 * (m * K + N * K + m * N)) / us / 1e3, tflops=flops / us / 1e6)
                x8 = x.to(torch.float8_e4m3fn)
                try:
                    us = timed(lambda: torch._scaled_mm(x8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
                    emit(kind="fp8", model=model, shape=name, m=m, n=N, k=K, us=us,
                         gbs=(m * K + N * K + 2 * m * N) / us / 1e3, tflops=flops / us / 1e6)
                except Exception as e:  # shape limits of the library
                    emit(kind="fp8", model=model, shape=name, m=m, n=N, k=K, error=str(e).splitlines()[0])
            del w, w8
            torch.cuda.empty_cache()
    # The anchor shape of KINDS.md: 8192^3 bf16.
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    us = timed(lambda: a @ a)
    emit(kind="bf16", model="anchor", shape="8192^3", m=8192, n=8192, k=8192, us=us, tflops=2 * 8192 ** 3 / us / 1e6)


if __name__ == "__main__":
    main()
