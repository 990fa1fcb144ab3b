# reference.py: an independent float64 PyTorch GPT-2 that writes the fixture the C trainer is
# tested against. Same model, parameter layout, data order, clipping and AdamW as `train`, tiny
# config (maxT=16, V=61, Vp=64, L=2, NH=4, C=32), 5 steps of B=2, T=8.
#
# Run:    /usr/bin/python3 test/reference.py      (Debian's python3-torch; any cwd)
# Writes: test/fixtures/ref_model.bin     llm.c checkpoint, initial parameters as float32
#         test/fixtures/ref_tokens.bin    llm.c token file, 200 uint16 tokens
#         test/fixtures/ref_expected.bin  step-0 gradient, per-step loss/norm/lr, final parameters
# Layout of ref_expected.bin is in write_expected(). Output is byte-identical from run to run.
#
# Second mode, HellaSwag as llm.c scores it, for the C scorer (eval.c) to be checked against:
#   /usr/bin/python3 test/reference.py hellaswag MODEL.bin EVAL.bin
# MODEL: an llm.c model file (float32, version 3, any shape); EVAL: llm.c's eval file (eval.h).
# Prints "hellaswag: C/N correct" then, for each example, "example I label L choice K gap G": G is
# the gap between the two lowest mean completion losses (float64), so a caller can skip examples
# whose two best lie within 1e-4 of each other.
#
# Everything the C side reads as float32 (initial parameters, lr, betas, eps, wd, clip) is first
# rounded to float32 here, so the float64 reference starts from exactly the numbers the C code sees.

import math
import os

import numpy as np
import torch
import torch.nn.functional as F

torch.set_num_threads(1)  # one thread: the same reduction order, hence the same bytes, every run
DT = torch.float64

# model
MAX_T, V, VP, L, NH, C = 16, 61, 64, 2, 4, 32
# data and training
NTOKENS, B, T, M = 200, 2, 8, 1
STEPS, WARMUP = 5, 2


def f32(x):
    """The float32 value nearest x, as a Python float."""
    return float(np.float32(x))


LR, LR_MIN = f32(1e-2), 0.0
BETA1, BETA2, EPS, WD = f32(0.9), f32(0.95), f32(1e-8), f32(0.1)

# (name, shape, init kind) in llm.c's order; kind is "w" N(0,0.1), "b" N(0,0.05),
# "lnw" 1+N(0,0.1), "lnb" N(0,0.05). Weight decay applies to the "w" tensors only.
PARAM_SPECS = [
    ("wte", (VP, C), "w"),
    ("wpe", (MAX_T, C), "w"),
    ("ln1w", (L, C), "lnw"),
    ("ln1b", (L, C), "lnb"),
    ("qkvw", (L, 3 * C, C), "w"),
    ("qkvb", (L, 3 * C), "b"),
    ("attprojw", (L, C, C), "w"),
    ("attprojb", (L, C), "b"),
    ("ln2w", (L, C), "lnw"),
    ("ln2b", (L, C), "lnb"),
    ("fcw", (L, 4 * C, C), "w"),
    ("fcb", (L, 4 * C), "b"),
    ("fcprojw", (L, C, 4 * C), "w"),
    ("fcprojb", (L, C), "b"),
    ("lnfw", (C,), "lnw"),
    ("lnfb", (C,), "lnb"),
]
DECAYED = {name for name, _, kind in PARAM_SPECS if kind == "w"}


def init_params(seed):
    """Seeded parameters as float64 leaf tensors, rounded to float32 values. All Vp rows of wte
    are drawn, so the padded rows are nonzero too."""
    g = torch.Generator().manual_seed(seed)
    params = {}
    for name, shape, kind in PARAM_SPECS:
        std = {"w": 0.1, "b": 0.05, "lnw": 0.1, "lnb": 0.05}[kind]
        t = torch.randn(shape, generator=g, dtype=DT) * std
        if kind == "lnw":
            t = t + 1.0
        t = t.to(torch.float32).to(DT)
        params[name] = t.requires_grad_(True)
    return params


# ----------------------------------------------------------------------------------------------
# forward


def layernorm(x, w, b, eps=1e-5):
    """(x - mean) / sqrt(var + eps) * w + b over the last axis, biased variance."""
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * w + b


def gelu_tanh(u):
    return 0.5 * u * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (u + 0.044715 * u ** 3)))


def attention(qkv):
    """Causal multi-head attention. qkv (B,T,3C) -> (B,T,C). q, k, v are the three C-wide
    chunks; head h owns channels [h*hs, (h+1)*hs) of each."""
    b, t, _ = qkv.shape
    hs = C // NH
    q, k, v = qkv.split(C, dim=-1)                          # each (B,T,C)
    q = q.view(b, t, NH, hs).transpose(1, 2)                # (B,NH,T,hs)
    k = k.view(b, t, NH, hs).transpose(1, 2)
    v = v.view(b, t, NH, hs).transpose(1, 2)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B,NH,T,T)
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
    y = att @ v                                             # (B,NH,T,hs)
    return y.transpose(1, 2).reshape(b, t, C)               # heads concatenated back


def gpt2_loss(p, idx, targets):
    """Mean cross-entropy over all B*T positions. idx, targets (B,T) int64."""
    t = idx.shape[1]
    x = p["wte"][idx] + p["wpe"][:t]                        # (B,T,C)
    for l in range(L):
        h = layernorm(x, p["ln1w"][l], p["ln1b"][l])
        qkv = h @ p["qkvw"][l].T + p["qkvb"][l]             # (B,T,3C)
        x = x + attention(qkv) @ p["attprojw"][l].T + p["attprojb"][l]
        h = layernorm(x, p["ln2w"][l], p["ln2b"][l])
        u = h @ p["fcw"][l].T + p["fcb"][l]                 # (B,T,4C)
        x = x + gelu_tanh(u) @ p["fcprojw"][l].T + p["fcprojb"][l]
    x = layernorm(x, p["lnfw"], p["lnfb"])
    logits = x @ p["wte"][:V].T                             # (B,T,V): padded rows never predicted
    # F.cross_entropy with mean reduction is mean over positions of logsumexp(logits) - logits[target]
    return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))


# ----------------------------------------------------------------------------------------------
# data, schedule, optimizer


def batch(tokens, step):
    """Step s's global batch of G = B*M sequences; sequence j starts at ((s*G + j) mod n) * T."""
    g = B * M
    n = (len(tokens) - 1) // T
    starts = [((step * g + j) % n) * T for j in range(g)]
    idx = torch.stack([tokens[s:s + T] for s in starts])
    targets = torch.stack([tokens[s + 1:s + T + 1] for s in starts])
    return idx, targets


def lr_at(step):
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    progress = (step - WARMUP) / (STEPS - WARMUP)
    return LR_MIN + 0.5 * (LR - LR_MIN) * (1.0 + math.cos(math.pi * progress))


def loss_and_grads(params, idx, targets):
    for p in params.values():
        p.grad = None
    loss = gpt2_loss(params, idx, targets)
    loss.backward()
    grads = {k: p.grad.detach().clone() for k, p in params.items()}
    return loss.item(), grads


def global_norm(grads):
    return math.sqrt(sum(float((g * g).sum()) for g in grads.values()))


def adamw_step(params, grads, m, v, t, lr):
    """torch.optim.AdamW's arithmetic, by hand. t is the 1-based step count."""
    with torch.no_grad():
        for name, p in params.items():
            g = grads[name]
            if name in DECAYED:
                p -= lr * WD * p
            m[name].mul_(BETA1).add_((1 - BETA1) * g)
            v[name].mul_(BETA2).add_((1 - BETA2) * g * g)
            m_hat = m[name] / (1 - BETA1 ** t)
            v_hat = v[name] / (1 - BETA2 ** t)
            p -= lr * m_hat / (torch.sqrt(v_hat) + EPS)


# ----------------------------------------------------------------------------------------------
# checks


def finite_difference_check(params, idx, targets, grads, seed, h=1e-6):
    """Central differences on one random entry of every parameter tensor (wte: a real row).
    Returns the worst relative error against autograd."""
    g = torch.Generator().manual_seed(seed)
    worst = 0.0
    with torch.no_grad():
        for name, p in params.items():
            numel = p.numel() if name != "wte" else V * C
            i = int(torch.randint(numel, (1,), generator=g))
            flat = p.view(-1)
            saved = flat[i].item()
            flat[i] = saved + h
            up = gpt2_loss(params, idx, targets).item()
            flat[i] = saved - h
            down = gpt2_loss(params, idx, targets).item()
            flat[i] = saved
            fd = (up - down) / (2 * h)
            ad = grads[name].view(-1)[i].item()
            rel = abs(fd - ad) / max(abs(fd), abs(ad), 1e-12)
            worst = max(worst, rel)
    return worst


# ----------------------------------------------------------------------------------------------
# files


def write_model(path, params):
    header = np.zeros(256, dtype="<i4")
    header[:8] = [20240326, 3, MAX_T, V, L, NH, C, VP]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(flat32(params).tobytes())


def write_tokens(path, tokens):
    header = np.zeros(256, dtype="<i4")
    header[:3] = [20240520, 1, len(tokens)]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.numpy().astype("<u2").tobytes())


def flat32(tensors):
    """All tensors, in PARAM_SPECS order, flattened row-major into one float32 array."""
    return np.concatenate([tensors[n].detach().reshape(-1).numpy() for n, _, _ in PARAM_SPECS]
                          ).astype("<f4")


def write_expected(path, clip, grads0, losses, norms, lrs, final_params):
    """int32[256]  header: magic 20261122, version 1, B, T, steps, warmup, num_params, M
    float32[256] hyper: lr, lr_min, beta1, beta2, eps, wd, clip, loss_0, norm_0
    float32[num_params] step-0 gradient (before clipping)
    float32[steps] loss_s, float32[steps] norm_s (before clipping), float32[steps] lr_s
    float32[num_params] parameters after the last update"""
    num_params = sum(int(np.prod(s)) for _, s, _ in PARAM_SPECS)
    header = np.zeros(256, dtype="<i4")
    header[:8] = [20261122, 1, B, T, STEPS, WARMUP, num_params, M]
    hyper = np.zeros(256, dtype="<f4")
    hyper[:9] = [LR, LR_MIN, BETA1, BETA2, EPS, WD, clip, losses[0], norms[0]]
    with open(path, "wb") as f:
        for block in (header, hyper, flat32(grads0),
                      np.array(losses, dtype="<f4"), np.array(norms, dtype="<f4"),
                      np.array(lrs, dtype="<f4"), flat32(final_params)):
            f.write(block.tobytes())
    return num_params


# ----------------------------------------------------------------------------------------------


def main():
    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
    os.makedirs(out_dir, exist_ok=True)

    params = init_params(1234)
    initial = {k: p.detach().clone() for k, p in params.items()}
    tokens = torch.randint(0, V, (NTOKENS,), generator=torch.Generator().manual_seed(4321))

    # step 0's gradient first: it fixes the clip value and is checked by finite differences
    idx0, tgt0 = batch(tokens, 0)
    loss0, grads0 = loss_and_grads(params, idx0, tgt0)
    norm0 = global_norm(grads0)
    clip = f32(round(0.6 * norm0, 4))
    fd_err = finite_difference_check(params, idx0, tgt0, grads0, seed=99)
    assert fd_err < 1e-5, f"finite-difference check failed: {fd_err:.3e}"
    assert float(grads0["wte"][V:].abs().max()) == 0.0, "padded wte rows got a gradient"

    # torch.optim.AdamW on a copy, fed the same clipped gradients, to check the hand-written one
    shadow = {k: p.detach().clone().requires_grad_(True) for k, p in params.items()}
    torch_opt = torch.optim.AdamW(
        [{"params": [shadow[n] for n in shadow if n in DECAYED], "weight_decay": WD},
         {"params": [shadow[n] for n in shadow if n not in DECAYED], "weight_decay": 0.0}],
        lr=LR, betas=(BETA1, BETA2), eps=EPS)

    m = {k: torch.zeros_like(p) for k, p in initial.items()}
    v = {k: torch.zeros_like(p) for k, p in initial.items()}
    losses, norms, lrs = [], [], []
    worst_opt_diff = 0.0
    for step in range(STEPS):
        idx, tgt = batch(tokens, step)
        loss, grads = loss_and_grads(params, idx, tgt)
        norm = global_norm(grads)
        scale = min(1.0, clip / (norm + 1e-6))  # clip_grad_norm_'s arithmetic
        grads = {k: g * scale for k, g in grads.items()}
        lr = lr_at(step)
        adamw_step(params, grads, m, v, step + 1, lr)

        for group in torch_opt.param_groups:
            group["lr"] = lr
        for k, p in shadow.items():
            p.grad = grads[k].clone()
        torch_opt.step()
        for k in params:
            diff = (params[k] - shadow[k]).abs().max().item()
            worst_opt_diff = max(worst_opt_diff, diff)
        losses.append(loss)
        norms.append(norm)
        lrs.append(lr)
    assert worst_opt_diff < 1e-12, f"hand AdamW differs from torch.optim.AdamW: {worst_opt_diff:.3e}"
    assert losses[0] == loss0 and norms[0] == norm0

    paths = [os.path.join(out_dir, n) for n in ("ref_model.bin", "ref_tokens.bin", "ref_expected.bin")]
    write_model(paths[0], initial)
    write_tokens(paths[1], tokens)
    num_params = write_expected(paths[2], clip, grads0, losses, norms, lrs, params)

    print(f"reference GPT-2: maxT={MAX_T} V={V} Vp={VP} L={L} NH={NH} C={C}, "
          f"{num_params} params; B={B} T={T} M={M}, {STEPS} steps, warmup {WARMUP}")
    print("loss   " + " ".join(f"{x:.6f}" for x in losses))
    print("norm   " + " ".join(f"{x:.6f}" for x in norms))
    print("lr     " + " ".join(f"{x:.6e}" for x in lrs))
    print(f"clip   {clip:.6f}  (0.6 * norm_0 rounded to 4 places, as float32)")
    print(f"finite differences vs autograd, worst relative error: {fd_err:.3e} (16 entries)")
    print(f"hand AdamW vs torch.optim.AdamW, worst abs difference:  {worst_opt_diff:.3e}")
    for path in paths:
        print(f"wrote {os.path.relpath(path)}: {os.path.getsize(path)} bytes")


# ----------------------------------------------------------------------------------------------
# hellaswag mode: any model shape, read from the file


def read_model(path):
    """An llm.c float32 model file: (config dict, parameters as float64 tensors by name)."""
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(1024), dtype="<i4")
        assert header[0] == 20240326 and header[1] == 3, f"{path}: not an llm.c float32 model (version 3)"
        cfg = dict(zip(("max_t", "v", "l", "nh", "c", "vp"), (int(x) for x in header[2:8])))
        data = np.frombuffer(f.read(), dtype="<f4")
    l, c, vp, max_t = cfg["l"], cfg["c"], cfg["vp"], cfg["max_t"]
    shapes = [("wte", (vp, c)), ("wpe", (max_t, c)), ("ln1w", (l, c)), ("ln1b", (l, c)),
              ("qkvw", (l, 3 * c, c)), ("qkvb", (l, 3 * c)), ("attprojw", (l, c, c)), ("attprojb", (l, c)),
              ("ln2w", (l, c)), ("ln2b", (l, c)), ("fcw", (l, 4 * c, c)), ("fcb", (l, 4 * c)),
              ("fcprojw", (l, c, 4 * c)), ("fcprojb", (l, c)), ("lnfw", (c,)), ("lnfb", (c,))]
    params, at = {}, 0
    for name, shape in shapes:
        n = int(np.prod(shape))
        params[name] = torch.from_numpy(data[at:at + n].astype(np.float64)).reshape(shape)
        at += n
    assert at == len(data), f"{path}: {len(data)} floats, the header's model has {at}"
    return cfg, params


def position_losses(cfg, p, row):
    """Per-position cross-entropy of one row (list of ids): loss[t] predicts row[t + 1]."""
    nh, c, v, t = cfg["nh"], cfg["c"], cfg["v"], len(row)
    hs = c // nh
    idx = torch.tensor(row, dtype=torch.long)
    x = p["wte"][idx] + p["wpe"][:t]                        # (T,C)
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    for l in range(cfg["l"]):
        h = layernorm(x, p["ln1w"][l], p["ln1b"][l])
        qkv = h @ p["qkvw"][l].T + p["qkvb"][l]             # (T,3C)
        q, k, vv = (z.view(t, nh, hs).transpose(0, 1) for z in qkv.split(c, dim=-1))   # (NH,T,hs)
        att = ((q @ k.transpose(-2, -1)) / math.sqrt(hs)).masked_fill(~causal, float("-inf")).softmax(-1)
        y = (att @ vv).transpose(0, 1).reshape(t, c)
        x = x + y @ p["attprojw"][l].T + p["attprojb"][l]
        h = layernorm(x, p["ln2w"][l], p["ln2b"][l])
        x = x + gelu_tanh(h @ p["fcw"][l].T + p["fcb"][l]) @ p["fcprojw"][l].T + p["fcprojb"][l]
    logits = layernorm(x, p["lnfw"], p["lnfb"]) @ p["wte"][:v].T   # (T,V)
    return F.cross_entropy(logits[:-1], idx[1:], reduction="none")  # (T-1,)


def read_eval(path):
    """llm.c's eval file: a list of (label, context, [4 completions])."""
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(1024), dtype="<i4")
        words = np.frombuffer(f.read(), dtype="<u2").tolist()
    assert header[0] == 20240522 and header[1] == 1, f"{path}: not an llm.c eval file"
    examples, at = [], 0
    for i in range(int(header[2])):
        delim, nbytes, index, label, ncomp, ctx_len = words[at:at + 6]
        assert delim == 65535 and index == i and ncomp == 4 and label < 4, f"{path}: example {i} is malformed"
        w, at = words[at:at + nbytes // 2], at + nbytes // 2
        ctx, k, ends = w[6:6 + ctx_len], 6 + ctx_len, []
        for _ in range(4):
            ends.append(w[k + 1:k + 1 + w[k]])
            k += 1 + w[k]
        examples.append((label, ctx, ends))
    assert at == len(words), f"{path}: bytes after the last example"
    return examples


def hellaswag(model_path, eval_path):
    cfg, p = read_model(model_path)
    examples = read_eval(eval_path)
    correct, lines = 0, []
    with torch.no_grad():
        for i, (label, ctx, ends) in enumerate(examples):
            means = []
            for end in ends:
                losses = position_losses(cfg, p, ctx + end)
                means.append(float(losses[len(ctx) - 1:len(ctx) + len(end) - 1].mean()))
            choice = min(range(4), key=lambda c: (means[c], c))   # the lowest mean; the first of equal ones
            best = sorted(means)
            correct += choice == label
            lines.append(f"example {i} label {label} choice {choice} gap {best[1] - best[0]:.6e}")
    print(f"hellaswag: {correct}/{len(examples)} correct")
    print("\n".join(lines))


if __name__ == "__main__":
    import sys
    if len(sys.argv) == 4 and sys.argv[1] == "hellaswag":
        hellaswag(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 1:
        main()
    else:
        sys.exit("usage: reference.py  |  reference.py hellaswag MODEL.bin EVAL.bin")
