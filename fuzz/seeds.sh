#!/bin/sh
# fuzz/seeds.sh DIR: the seed corpora, made by train and by hand: DIR/model
# (a tiny model saved by train), DIR/tokens (a token file, a text file),
# DIR/tokenizer (a 4-token tokenizer file), DIR/args (command lines, one
# argument a line). Run from the repository root after `make build`.
D=$1
mkdir -p $D/model $D/tokens $D/tokenizer $D/args
printf 'To be, or not to be: that is the question.\n' > $D/tokens/text.txt
./train --data $D/tokens/text.txt --layers 1 --heads 1 --dim 4 --max-seq 8 --vocab 128 --batch 1 --seq 8 \
        --steps 1 --device cpu --save $D/model/tiny.bin > /dev/null || exit 1
head -c 1024 $D/model/tiny.bin > $D/model/header_only.bin
python3 - "$D" <<'PY'
import struct, sys
d = sys.argv[1]
def header(*w): return struct.pack("<256i", *(list(w) + [0] * (256 - len(w))))
toks = [1, 2, 3, 50256, 7, 0, 9, 11, 65535, 4, 5, 6]
open(d + "/tokens/tokens.bin", "wb").write(header(20240520, 1, len(toks)) + struct.pack("<%dH" % len(toks), *toks))
words = [b"a", b"bc", b"", b"\xff\xfe"]
open(d + "/tokenizer/tok.bin", "wb").write(header(20240328, 2, len(words), 3) + b"".join(bytes([len(w)]) + w for w in words))
lines = [
    "--data\nx\n--layers\n2\n--heads\n2\n--dim\n16\n--batch\n4\n--seq\n8\n--steps\n3",
    "--data\nx\n--ranks\n4\n--dp\n2\n--tp\n2\n--zero\n1\n--micro-batches\n2",
    "--data\nx\n--pp\n2\n--stage-layers\n1,3\n--schedule\ngpipe\n--lr\n1e-3\n--lr-decay\nnone",
    "--data=x\n--save\nm.bin\n--trace\nt.json\n--dump-grads\ng.bin\n--device\ncpu\n--dtype\nbf16",
    "--help",
]
for i, l in enumerate(lines):
    open(d + "/args/line%d" % i, "w").write(l)
PY
