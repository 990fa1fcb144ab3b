#!/usr/bin/env python3
"""tools/tokenize.py: a text file as GPT-2 token files in llm.c's format.

    python3 tools/tokenize.py TEXT OUT [--val-fraction 0.1]

writes OUT_train.bin and OUT_val.bin (the last fraction of the text; 0: no
val file): each a 1024-byte header of 256 int32 (magic 20240520, version 1,
the number of tokens) followed by the tokens as uint16, as llm.c's
dev/data/*.py write them and train's --data/--val read them. The text is
one document: <|endoftext|> (50256) first, as llm.c puts before each.

Needs tiktoken (pip install tiktoken), which fetches GPT-2's vocabulary on
first use (or finds it in TIKTOKEN_CACHE_DIR). Neither make train nor make
test needs this script.
"""
import argparse
import struct
import sys

MAGIC, VERSION = 20240520, 1


def write_tokens(path, tokens):
    if any(t < 0 or t > 0xFFFF for t in tokens):
        sys.exit(f"tokenize.py: a token does not fit in uint16 ({path})")
    header = struct.pack("<256i", MAGIC, VERSION, len(tokens), *([0] * 253))
    with open(path, "wb") as f:
        f.write(header)
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))
    print(f"{path}: {len(tokens)} tokens")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("text")
    ap.add_argument("out", help="prefix: writes OUT_train.bin and OUT_val.bin")
    ap.add_argument("--val-fraction", type=float, default=0.1)
    a = ap.parse_args()
    try:
        import tiktoken
    except ImportError:
        sys.exit("tokenize.py: needs tiktoken (pip install tiktoken)")
    enc = tiktoken.get_encoding("gpt2")
    with open(a.text, encoding="utf-8", errors="replace") as f:
        text = f.read()
    eot = enc._special_tokens["<|endoftext|>"]
    tokens = [eot] + enc.encode_ordinary(text)
    n_val = int(len(tokens) * a.val_fraction)
    write_tokens(a.out + "_train.bin", tokens[: len(tokens) - n_val])
    if n_val:
        write_tokens(a.out + "_val.bin", tokens[len(tokens) - n_val :])


if __name__ == "__main__":
    main()
