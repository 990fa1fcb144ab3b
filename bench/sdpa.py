#!/usr/bin/env python3
"""bench/sdpa.py: PyTorch's scaled_dot_product_attention at GPT-2 124M's
attention shape, the yardstick of bench_gpu's attention rows.

    python3 bench/sdpa.py [--out FILE] [--batch 16] [--heads 12] [--seq 1024]
                          [--head-dim 64] [--reps 30] [--warmup 5]

q, k, v are bf16 [B, NH, T, hs] = [16, 12, 1024, 64], random normal, and
F.scaled_dot_product_attention(q, k, v, is_causal=True) runs forward, and
forward + backward (torch.autograd.grad of the output against a random
dout, so no .grad accumulation is timed). Each time is the median of --reps
runs after --warmup, each bracketed by its own pair of CUDA events, with
the L2 cache flushed (a 256 MB write) before each, as bench_gpu does.

Rows, each timed the same way:
  default      what F.scaled_dot_product_attention dispatches to by itself:
               the yardstick, written to --out. The backend it picked is
               named from the kernels a profiler sees.
  flash / efficient / cudnn
               the same call forced to one backend with
               torch.nn.attention.sdpa_kernel (a backend that refuses the
               shape or is not built prints "n/a").
  default, qkv the default dispatch with q, k, v as views of one
               [B, T, 3C] tensor, as a GPT-2 block makes them (nanoGPT's
               split + view + transpose; backward includes the copy back
               into the [B, T, 3C] gradient) -- bench_gpu's kernels read
               and write exactly that layout.

--out FILE gets "fwd_ms X\\nfwdbwd_ms Y\\nbackend NAME\\n" for the default
dispatch on [B, NH, T, hs], then best_fwd_ms, best_fwdbwd_ms and
best_backend over every row, for information.
"""
import argparse
import statistics
import sys


def time_ms(torch, fn, reps, warmup, flush):
    """Median ms of fn() over reps runs after warmup, CUDA events, L2 flushed."""
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        flush.zero_()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def which_backend(torch, fn):
    """Names the SDPA backend from the CUDA kernels one call launches."""
    try:
        from torch.profiler import profile, ProfilerActivity
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        names = [e.key for e in prof.key_averages()]
    except Exception as e:  # the profiler is optional here
        return "unknown (profiler: %s)" % type(e).__name__
    low = " ".join(names).lower()
    if "cudnn" in low or "fprop" in low or "sm90_flash" in low:
        return "cudnn"
    if "flash" in low:
        return "flash"
    if "fmha" in low or "efficient" in low or "cutlass" in low:
        return "efficient"
    if "bmm" in low or "gemm" in low or "softmax" in low:
        return "math"
    return "unknown (%s)" % ", ".join(names[:4])


def main():
    ap = argparse.ArgumentParser(description="PyTorch SDPA at GPT-2 124M's attention shape")
    ap.add_argument("--out", help="write fwd_ms / fwdbwd_ms / backend here for bench_gpu --sdpa")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    a = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("sdpa: python3 has no torch", file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("sdpa: torch sees no CUDA GPU", file=sys.stderr)
        return 1
    try:
        from torch.nn.attention import sdpa_kernel, SDPBackend
    except ImportError:
        sdpa_kernel, SDPBackend = None, None

    B, NH, T, hs = a.batch, a.heads, a.seq, a.head_dim
    C = NH * hs
    dev = torch.device("cuda")
    torch.manual_seed(1337)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    # [B, NH, T, hs] each, contiguous
    q, k, v = (torch.randn(B, NH, T, hs, device=dev, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    dout = torch.randn(B, NH, T, hs, device=dev, dtype=torch.bfloat16)
    # [B, T, 3C]: GPT-2's qkv, and its dout [B, T, C] seen as [B, NH, T, hs]
    qkv = torch.randn(B, T, 3 * C, device=dev, dtype=torch.bfloat16, requires_grad=True)

    def views(x):
        qq, kk, vv = x.split(C, dim=2)
        return tuple(t.view(B, T, NH, hs).transpose(1, 2) for t in (qq, kk, vv))

    def fwd_sep():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def fb_sep():
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return torch.autograd.grad(o, (q, k, v), dout)

    def fwd_qkv():
        qq, kk, vv = views(qkv)
        return F.scaled_dot_product_attention(qq, kk, vv, is_causal=True)

    def fb_qkv():
        qq, kk, vv = views(qkv)
        o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True)
        return torch.autograd.grad(o, (qkv,), dout)

    flops_f = 4.0 * B * NH * T * T * hs / 2   # causal
    flops_fb = 3.5 * flops_f                  # backward 2.5x forward

    rows = []  # (name, backend, fwd ms, fwd+bwd ms)

    def run(name, fwd, fb, backend=None):
        try:
            if backend is None:
                tf = time_ms(torch, fwd, a.reps, a.warmup, flush)
                tfb = time_ms(torch, fb, a.reps, a.warmup, flush)
                picked = which_backend(torch, fwd)
            else:
                with sdpa_kernel(backend):
                    tf = time_ms(torch, fwd, a.reps, a.warmup, flush)
                    tfb = time_ms(torch, fb, a.reps, a.warmup, flush)
                picked = name
        except Exception as e:  # a backend that refuses this shape, or is not built
            print("%-22s %10s %10s %10s %10s   (%s: %s)" % (name, "n/a", "n/a", "n/a", "n/a",
                                                           type(e).__name__, str(e).split("\n")[0][:80]))
            return None
        rows.append((name, picked, tf, tfb))
        print("%-22s %10.4f %10.1f %10.4f %10.1f   backend %s" %
              (name, tf, flops_f / tf / 1e9, tfb, flops_fb / tfb / 1e9, picked))
        return tf, tfb, picked

    print("sdpa: torch %s, %s; bf16 q, k, v [%d, %d, %d, %d], causal; median of %d runs, L2 flushed"
          % (torch.__version__, torch.cuda.get_device_name(0), B, NH, T, hs, a.reps))
    print("%-22s %10s %10s %10s %10s" % ("call", "fwd ms", "TFLOP/s", "fwd+bwd ms", "TFLOP/s"))
    default = run("default", fwd_sep, fb_sep)
    if sdpa_kernel is not None:
        for nm in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION"):
            be = getattr(SDPBackend, nm, None)
            if be is None:
                print("%-22s %10s   (this torch has no SDPBackend.%s)" % (nm.split("_")[0].lower(), "n/a", nm))
                continue
            run({"FLASH_ATTENTION": "flash", "EFFICIENT_ATTENTION": "efficient",
                 "CUDNN_ATTENTION": "cudnn"}[nm], fwd_sep, fb_sep, be)
    else:
        print("sdpa: torch.nn.attention.sdpa_kernel is missing: no forced backends")
    run("default, qkv views", fwd_qkv, fb_qkv)

    if default is None:
        print("sdpa: the default dispatch failed; nothing written", file=sys.stderr)
        return 1
    best = min(rows, key=lambda r: r[3])
    print("sdpa: yardstick (default dispatch, [B,NH,T,hs]): fwd %.4f ms, fwd+bwd %.4f ms, backend %s"
          % (default[0], default[1], default[2]))
    print("sdpa: fastest fwd+bwd: %s, %.4f ms" % (best[0], best[3]))
    if a.out:
        with open(a.out, "w") as f:
            f.write("fwd_ms %.6f\nfwdbwd_ms %.6f\nbackend %s\n"
                    % (default[0], default[1], default[2].split(" ")[0]))
            f.write("best_fwd_ms %.6f\nbest_fwdbwd_ms %.6f\nbest_backend %s\n"
                    % (best[2], best[3], best[0].replace(" ", "").replace(",", "_")))
        print("sdpa: wrote %s" % a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
