#!/usr/bin/env python3
"""tools/tokenize.py: GPT-2 token files in llm.c's formats, for train's --data, --val and
--eval-hellaswag.

    python3 tools/tokenize.py TEXT OUT [--val-fraction 0.1]
        a text file as OUT_train.bin and OUT_val.bin (the last fraction of the text; 0: no
        val file). The text is one document: <|endoftext|> (50256) first.

    python3 tools/tokenize.py fineweb OUTDIR [--sample 10BT] [--shard-tokens 100000000]
        FineWeb (HuggingFace's HuggingFaceFW/fineweb, the sample-10BT subset; 100BT: sample-100BT)
        as llm.c's dev/data/fineweb.py writes it: OUTDIR/fineweb_val_000000.bin (the first shard)
        and OUTDIR/fineweb_train_000001.bin, ..._000002.bin, ... of --shard-tokens each (the last
        one shorter), every document behind an <|endoftext|>. Train on them with
        --data 'OUTDIR/fineweb_train_*.bin' --val OUTDIR/fineweb_val_000000.bin.

    python3 tools/tokenize.py hellaswag OUT.bin [--split val]
        HellaSwag's validation set (rowanz/hellaswag on GitHub, 10042 examples) as llm.c's
        dev/data/hellaswag.py writes it, for --eval-hellaswag OUT.bin.

Token files: a 1024-byte header of 256 int32 (magic 20240520, version 1, the number of tokens)
then the tokens as uint16. Eval files: a header of 256 int32 (magic 20240522, version 1, the
number of examples, the longest example's bytes), then each example as uint16: 65535, its length
in bytes, its index, the label, 4, the context's length and tokens, then each completion's
length and tokens (" " + ending, as GPT-2 tokenizes a following word).

Needs Python packages and a download: tiktoken (pip install tiktoken; it fetches GPT-2's
vocabulary on first use, or finds it in TIKTOKEN_CACHE_DIR) for every mode; the fineweb mode
also needs datasets (pip install datasets) and downloads about 30 GB for 10BT (about 20 GB of
shards written); hellaswag downloads 11 MB from raw.githubusercontent.com. Neither make train
nor make test needs this script.
"""
import argparse
import json
import os
import struct
import sys
import urllib.request

MAGIC, VERSION = 20240520, 1
EVAL_MAGIC = 20240522
HELLASWAG_URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_{}.jsonl"


def need(module, pip_name):
    try:
        return __import__(module)
    except ImportError:
        sys.exit(f"tokenize.py: needs {pip_name} (pip install {pip_name})")


def write_tokens(path, tokens):
    if any(t < 0 or t > 0xFFFF for t in tokens):
        sys.exit(f"tokenize.py: a token does not fit in uint16 ({path})")
    header = struct.pack("<256i", MAGIC, VERSION, len(tokens), *([0] * 253))
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header)
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))
    os.replace(tmp, path)   # a killed run never leaves a short shard under the real name
    print(f"{path}: {len(tokens)} tokens")


def text_mode(argv):
    ap = argparse.ArgumentParser(prog="tokenize.py TEXT OUT")
    ap.add_argument("text")
    ap.add_argument("out", help="prefix: writes OUT_train.bin and OUT_val.bin")
    ap.add_argument("--val-fraction", type=float, default=0.1)
    a = ap.parse_args(argv)
    enc = need("tiktoken", "tiktoken").get_encoding("gpt2")
    with open(a.text, encoding="utf-8", errors="replace") as f:
        text = f.read()
    eot = enc._special_tokens["<|endoftext|>"]
    tokens = [eot] + enc.encode_ordinary(text)
    n_val = int(len(tokens) * a.val_fraction)
    write_tokens(a.out + "_train.bin", tokens[: len(tokens) - n_val])
    if n_val:
        write_tokens(a.out + "_val.bin", tokens[len(tokens) - n_val :])


def fineweb_mode(argv):
    ap = argparse.ArgumentParser(prog="tokenize.py fineweb OUTDIR")
    ap.add_argument("outdir")
    ap.add_argument("--sample", default="10BT", choices=["10BT", "100BT"])
    ap.add_argument("--shard-tokens", type=int, default=100_000_000)
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    a = ap.parse_args(argv)
    enc = need("tiktoken", "tiktoken").get_encoding("gpt2")
    datasets = need("datasets", "datasets")
    import multiprocessing as mp
    os.makedirs(a.outdir, exist_ok=True)
    docs = datasets.load_dataset("HuggingFaceFW/fineweb", name=f"sample-{a.sample}", split="train", streaming=True)
    eot = enc._special_tokens["<|endoftext|>"]
    global _ENC, _EOT
    _ENC, _EOT = enc, eot
    shard, buf = 0, []
    with mp.Pool(a.workers) as pool:
        for toks in pool.imap(_doc_tokens, (d["text"] for d in docs), chunksize=16):
            buf.extend(toks)
            while len(buf) >= a.shard_tokens:   # a document may continue into the next shard, as llm.c's does
                split = "val" if shard == 0 else "train"
                write_tokens(os.path.join(a.outdir, f"fineweb_{split}_{shard:06d}.bin"), buf[: a.shard_tokens])
                buf, shard = buf[a.shard_tokens :], shard + 1
    if buf:
        split = "val" if shard == 0 else "train"
        write_tokens(os.path.join(a.outdir, f"fineweb_{split}_{shard:06d}.bin"), buf)


_ENC = _EOT = None


def _doc_tokens(text):
    global _ENC, _EOT
    if _ENC is None:   # a worker started by spawn
        _ENC = __import__("tiktoken").get_encoding("gpt2")
        _EOT = _ENC._special_tokens["<|endoftext|>"]
    return [_EOT] + _ENC.encode_ordinary(text)


def eval_example(i, label, ctx, ends):
    """One example's uint16 words, its length in bytes in the second."""
    if len(ends) != 4 or not 0 <= label < 4 or not ctx or any(not e for e in ends):
        sys.exit(f"tokenize.py: example {i} has {len(ends)} endings, label {label}, or an empty part")
    w = [65535, 0, i, label, 4, len(ctx)] + ctx
    for e in ends:
        w += [len(e)] + e
    w[1] = 2 * len(w)
    if w[1] > 0xFFFF or i > 0xFFFF or any(t > 0xFFFF for t in w):
        sys.exit(f"tokenize.py: example {i} does not fit llm.c's uint16 fields")
    return w


def write_eval(path, examples):
    longest = max(2 * len(w) for w in examples)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<256i", EVAL_MAGIC, 1, len(examples), longest, *([0] * 252)))
        for w in examples:
            f.write(struct.pack(f"<{len(w)}H", *w))
    os.replace(tmp, path)
    print(f"{path}: {len(examples)} examples, the longest {longest} bytes")


def hellaswag_mode(argv):
    ap = argparse.ArgumentParser(prog="tokenize.py hellaswag OUT.bin")
    ap.add_argument("out")
    ap.add_argument("--split", default="val", choices=["train", "val"])
    a = ap.parse_args(argv)
    enc = need("tiktoken", "tiktoken").get_encoding("gpt2")
    url = HELLASWAG_URL.format(a.split)
    with urllib.request.urlopen(url, timeout=120) as r:
        lines = r.read().decode("utf-8").splitlines()
    examples = []
    for i, line in enumerate(l for l in lines if l.strip()):
        ex = json.loads(line)
        ctx = enc.encode(ex["ctx"])
        ends = [enc.encode(" " + e) for e in ex["endings"]]
        examples.append(eval_example(i, int(ex["label"]), ctx, ends))
    write_eval(a.out, examples)


def main():
    modes = {"fineweb": fineweb_mode, "hellaswag": hellaswag_mode}
    if len(sys.argv) > 1 and sys.argv[1] in modes:
        modes[sys.argv[1]](sys.argv[2:])
    else:
        text_mode(sys.argv[1:])


if __name__ == "__main__":
    main()
