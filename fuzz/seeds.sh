#!/bin/sh
# fuzz/seeds.sh DIR: the seed corpora, made by train and by hand: DIR/model
# (a tiny model saved by train), DIR/tokens (a token file, a text file),
# DIR/tokenizer (a 4-token tokenizer file), DIR/args (command lines, one
# argument a line), DIR/eval (a two-example HellaSwag file, eval.c),
# DIR/manifest (tiny sharded checkpoints saved by train: a manifest and its
# shards, one after the other), DIR/log (train's --log of a short run). Run
# from the repository root after `make build`.
D=$1
mkdir -p $D/model $D/tokens $D/tokenizer $D/args $D/eval $D/manifest $D/log
printf 'To be, or not to be: that is the question.\n' > $D/tokens/text.txt
./train --data $D/tokens/text.txt --layers 1 --heads 1 --dim 4 --max-seq 8 --vocab 128 --batch 1 --seq 8 \
        --steps 1 --device cpu --save $D/model/tiny.bin > /dev/null || exit 1
head -c 1024 $D/model/tiny.bin > $D/model/header_only.bin
T="--data $D/tokens/text.txt --heads 1 --dim 4 --max-seq 8 --vocab 128 --batch 1 --seq 8 --device cpu"
for layout in "one:--layers 1" "zero:--layers 1 --ranks 2 --zero 1" "pp:--layers 2 --ranks 2 --pp 2"; do
    name=${layout%%:*}; ck=$D/ck_$name
    rm -rf $ck
    ./train $T ${layout#*:} --steps 2 --checkpoint-dir $ck --log $D/log/$name.jsonl > /dev/null || exit 1
    cat $ck/step-2/manifest.txt $ck/step-2/shard-*.bin > $D/manifest/$name.bin
    rm -rf $ck
done
python3 - "$D" <<'PY'
import struct, sys
d = sys.argv[1]
def header(*w): return struct.pack("<256i", *(list(w) + [0] * (256 - len(w))))
toks = [1, 2, 3, 50256, 7, 0, 9, 11, 65535, 4, 5, 6]
open(d + "/tokens/tokens.bin", "wb").write(header(20240520, 1, len(toks)) + struct.pack("<%dH" % len(toks), *toks))
words = [b"a", b"bc", b"", b"\xff\xfe"]
open(d + "/tokenizer/tok.bin", "wb").write(header(20240328, 2, len(words), 3) + b"".join(bytes([len(w)]) + w for w in words))
def example(i, label, ctx, ends):
    w = [65535, 0, i, label, len(ends), len(ctx)] + ctx
    for e in ends:
        w += [len(e)] + e
    w[1] = 2 * len(w)
    return w
exs = [example(0, 2, [50256, 17, 4], [[5], [6, 7], [8, 9, 10], [11]]),
       example(1, 0, [3], [[1, 2], [50256], [0], [12, 13, 14, 15]])]
longest = max(2 * len(e) for e in exs)
open(d + "/eval/two.bin", "wb").write(struct.pack("<256i", *([20240522, 1, len(exs), longest] + [0] * 252)) +
                                      b"".join(struct.pack("<%dH" % len(e), *e) for e in exs))
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
