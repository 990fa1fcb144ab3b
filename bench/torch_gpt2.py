#!/usr/bin/env python3
"""bench/torch_gpt2.py: GPT-2 124M training steps in PyTorch, the end-to-end
yardstick of `train` (make bench runs both in the same call).

    python3 bench/torch_gpt2.py [--batch 16] [--steps 30] [--warmup-steps 10]
                                [--seq 1024] [--peak 989.4e12] [--no-compile]

The model is nanoGPT's GPT-2, the shape `train` gets from --layers 12
--heads 12 --dim 768 --vocab 50257 --max-seq 1024:
  - 12 layers, 12 heads of 64, C = 768, T = 1024 positions;
  - vocabulary 50257 padded to 50304 (the embedding and the head have 50304
    rows, as train's; the loss is over all 50304 logits, nanoGPT's way --
    train's ignores the 47 padding columns; the FLOPs are the same);
  - the head tied to the token embedding; LayerNorm; GELU, tanh form;
    F.scaled_dot_product_attention(is_causal=True) (flash attention);
  - N = 124,475,904 parameters: every parameter, the tied matrix once,
    position embeddings included; this is the N of the MFU.
Training: float32 master weights, bf16 autocast, torch.compile(model),
torch.optim.AdamW(fused=True, lr 6e-4, betas (0.9, 0.95), eps 1e-8, weight
decay 0.1 on the 2-D weights), gradient clipping at 1.0 as train's default
--clip does. Random token ids below 50257 (new ones each step, made on the
GPU before the timing).

A step is zero_grad, forward, backward, clip, optimizer step, then
torch.cuda.synchronize(); its time is wall clock around all of it, as
train's step line. Steps 1..--warmup-steps (compilation, allocator warm-up)
are printed but not counted; tokens/s is B*T over the median of the rest.
MFU = tokens/s * (6N + 6*L*C*T) / peak, the issue's formula: 6N for the
parameters' matmuls forward and backward, 6LCT for attention's QK^T and AV
(causal, so half of 12LCT); peak = 989.4e12, H100 SXM's bf16 dense figure.

Last line: "torch tokens/s X mfu Y%" (bench/bench_gpu.sh parses it). Exit 3
when the batch does not fit in GPU memory, 1 on other errors.
"""
import argparse
import math
import statistics
import sys
import time


def build(torch, L, NH, C, T, Vp):
    nn = torch.nn
    F = torch.nn.functional

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(C, 3 * C)
            self.c_proj = nn.Linear(C, C)

        def forward(self, x):
            B, T_, _ = x.shape
            q, k, v = self.c_attn(x).split(C, dim=2)
            q, k, v = (t.view(B, T_, NH, C // NH).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).contiguous().view(B, T_, C))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc = nn.Linear(C, 4 * C)
            self.c_proj = nn.Linear(4 * C, C)

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(C)
            self.attn = Attention()
            self.ln_2 = nn.LayerNorm(C)
            self.mlp = MLP()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(Vp, C)
            self.wpe = nn.Embedding(T, C)
            self.h = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = nn.LayerNorm(C)
            self.lm_head = nn.Linear(C, Vp, bias=False)
            self.lm_head.weight = self.wte.weight   # tied
            for name, p in self.named_parameters():
                if p.dim() == 2:
                    std = 0.02 / math.sqrt(2 * L) if name.endswith("c_proj.weight") else 0.02
                    nn.init.normal_(p, 0.0, std)
                elif name.endswith("bias"):
                    nn.init.zeros_(p)

        def forward(self, idx, targets):
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for blk in self.h:
                x = blk(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))

    return GPT()


def main():
    ap = argparse.ArgumentParser(description="GPT-2 124M training throughput in PyTorch")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup-steps", type=int, default=10, help="first steps not counted (default 10)")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--peak", type=float, default=989.4e12, help="bf16 dense FLOP/s of the GPU")
    ap.add_argument("--no-compile", action="store_true", help="eager mode (no torch.compile)")
    a = ap.parse_args()
    if not 1 <= a.seq <= 1024:
        print("torch_gpt2: --seq must be 1..1024 (the model's positions)", file=sys.stderr)
        return 1
    if a.steps <= a.warmup_steps:
        print("torch_gpt2: --steps must exceed --warmup-steps", file=sys.stderr)
        return 1
    try:
        import torch
    except ImportError:
        print("torch_gpt2: python3 has no torch", file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("torch_gpt2: torch sees no CUDA GPU", file=sys.stderr)
        return 1

    L, NH, C, T, V, Vp = 12, 12, 768, a.seq, 50257, 50304
    B = a.batch
    dev = torch.device("cuda")
    torch.manual_seed(1337)
    model = build(torch, L, NH, C, 1024, Vp).to(dev)
    nparams = sum(p.numel() for p in model.parameters())   # the tied matrix once
    flops_per_token = 6 * nparams + 6 * L * C * T
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    step_model = model if a.no_compile else torch.compile(model)
    # [steps, B, T+1] random token ids: inputs are [:, :-1], targets [:, 1:]
    data = torch.randint(0, V, (a.steps, B, T + 1), device=dev)
    print("torch_gpt2: torch %s, %s; %d layers, %d heads, dim %d, vocab %d padded to %d, T %d, batch %d"
          % (torch.__version__, torch.cuda.get_device_name(0), L, NH, C, V, Vp, T, B))
    print("torch_gpt2: N = %d parameters (all, tied matrix once); 6N + 6LCT = %d FLOPs a token; peak %.1f TFLOP/s; %s"
          % (nparams, flops_per_token, a.peak / 1e12, "eager" if a.no_compile else "torch.compile"))
    sys.stdout.flush()
    times = []
    try:
        for s in range(a.steps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            x, y = data[s, :, :-1], data[s, :, 1:]
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                loss = step_model(x, y)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            times.append(dt)
            tps = B * T / dt
            print("step %d/%d | loss %.6f | norm %.4f | %.1f ms | %.0f tok/s | mfu %.1f%%%s"
                  % (s + 1, a.steps, loss.item(), norm.item(), dt * 1e3, tps,
                     100.0 * tps * flops_per_token / a.peak, " (warm-up)" if s < a.warmup_steps else ""))
            sys.stdout.flush()
    except torch.cuda.OutOfMemoryError:
        print("torch_gpt2: batch %d x %d does not fit in GPU memory" % (B, T), file=sys.stderr)
        return 3
    med = statistics.median(times[a.warmup_steps:])
    tps = B * T / med
    mfu = tps * flops_per_token / a.peak
    print("torch_gpt2: median %.2f ms a step over steps %d..%d, peak memory %.2f GiB"
          % (med * 1e3, a.warmup_steps + 1, a.steps, torch.cuda.max_memory_allocated() / 2**30))
    print("torch tokens/s %.0f mfu %.1f%%" % (tps, 100.0 * mfu))
    return 0


if __name__ == "__main__":
    sys.exit(main())
