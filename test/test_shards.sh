#!/bin/sh
# test/test_shards.sh: --data as shards, through ./train (data.c's order,
# docs/cli.md "Data order"; test/test_data.c checks the order itself).
#   1. one shard named through a glob trains bit for bit like the file named directly;
#   2. three shards: dp 2, tp 2, pp 2 and dp 2 x tp 2 x pp 2 take the same batches as one
#      rank (every step's loss within 1e-5), with and without --shuffle;
#   3. kill -9 then --resume, mid-epoch and across shard boundaries, ends on the straight
#      run's model bit for bit; a changed shard list is said in one line on resume;
#   4. --check-data, and hostile specs: a glob matching nothing, a directory, a token
#      beyond the vocabulary: one line, exit 2.
. "$(dirname "$0")/lib.sh"
t_init shards
t_need_python3 "shards" "to write the shard files"
python3 - $OUT <<'PY'
import random, struct, sys
out = sys.argv[1]
def shard(path, n, vocab=61, bad_at=None):
    random.seed(path)
    toks = [random.randrange(vocab) for _ in range(n)]
    if bad_at is not None: toks[bad_at] = 61
    with open(path, 'wb') as f:
        f.write(struct.pack('<256i', 20240520, 1, n, *([0] * 253)))
        f.write(struct.pack('<%dH' % n, *toks))
for i, n in enumerate([403, 337, 251]):
    shard('%s/train_%06d.bin' % (out, i), n)
shard('%s/one_000000.bin' % out, 403)
shard('%s/bad_000000.bin' % out, 403, bad_at=300)
PY
set -f   # the specs below are globs for train, not for this shell
M="--layers 2 --heads 4 --dim 32 --max-seq 16 --vocab 61 --seq 8 --device cpu --clip 0.5 --lr 0.005"
losses() { grep '^step ' "$1" | sed 's/.*loss \([0-9.e+-]*\) .*/\1/'; }

# 1. a glob of one file
./train $M --data $OUT/one_000000.bin --batch 4 --steps 12 --save $OUT/direct.bin > $OUT/direct.log 2>&1
./train $M --data "$OUT/one_*.bin" --batch 4 --steps 12 --save $OUT/glob.bin > $OUT/glob.log 2>&1
if cmp -s $OUT/direct.bin $OUT/glob.bin && [ "$(losses $OUT/direct.log)" = "$(losses $OUT/glob.log)" ] &&
   [ -n "$(losses $OUT/glob.log)" ]; then ok "one shard through a glob trains bit for bit like the file named directly"
else bad "one shard through a glob differs from the file named directly"; fi

# 2. three shards on every layout
close() {   # log A, log B: every loss within 1e-5 relative
    paste -d' ' "$1" "$2" | awk 'NF == 2 { n++; d = $1 - $2; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1);
        if (r > m) m = r } END { if (n < 10 || m > 1e-5) exit 1; printf "%d steps, largest gap %.1e", n, m }'
}
for sh in "" "--shuffle"; do
    S="--data $OUT/train_*.bin $sh --steps 30"
    ./train $M $S --batch 4 --micro-batches 2 > $OUT/one$sh.log 2>&1
    losses $OUT/one$sh.log > $OUT/one$sh.loss
    for layout in "--ranks 2 --dp 2 --batch 2" "--ranks 2 --tp 2 --batch 4" "--ranks 2 --pp 2 --batch 4" \
                  "--ranks 8 --dp 2 --tp 2 --pp 2 --zero 1 --batch 2"; do
        ./train $M $S $layout --micro-batches 2 > $OUT/l.log 2>&1
        losses $OUT/l.log > $OUT/l.loss
        if got=$(close $OUT/one$sh.loss $OUT/l.loss); then ok "three shards${sh:+, $sh}: $layout takes one rank's batches ($got)"
        else bad "three shards${sh:+, $sh}: $layout differs from one rank: $(tail -n 2 $OUT/l.log | tr '\n' ' ')"; fi
    done
done
if [ "$(cat $OUT/one.loss)" != "$(cat $OUT/one--shuffle.loss)" ]; then ok "--shuffle changes the order of the shards' sequences"
else bad "--shuffle trains the same losses as the file order"; fi

# 3. kill -9 and resume: 3 shards of 50, 42 and 31 sequences of 8, G = 8: an epoch is 15.4 steps
for sh in "" "--shuffle"; do
    S="--data $OUT/train_*.bin $sh --batch 4 --micro-batches 2 --steps 40"
    d=$OUT/kill$sh; at=""
    ./train $M $S --save $d.straight.bin > $d.straight.log 2>&1
    # killed twice: after 7 steps (inside the first shard), and about 10 steps later (past the
    # first two shard boundaries, at 6.3 and 11.5 steps, and the epoch's end at 15.4)
    for k in 1 2; do
        ./train $M $S --checkpoint-dir $d --checkpoint-every 1 --resume > $d.$k.log 2>&1 &
        pid=$!
        for i in $(seq 1 600); do [ "$(grep -c '^step ' $d.$k.log)" -ge $((k == 1 ? 7 : 10)) ] && break; sleep 0.02; done
        kill -9 $pid; wait $pid 2>/dev/null
        at="$at${at:+, }$(cat $d/latest)"
    done
    ./train $M $S --checkpoint-dir $d --resume --save $d.bin > $d.3.log 2>&1
    if cmp -s $d.bin $d.straight.bin && grep -q '^resumed from' $d.3.log; then
        ok "${sh:+$sh: }killed at $at and resumed each time (40 steps, 2.6 epochs, every shard boundary): the straight run's model"
    else bad "${sh:+$sh: }killed at $at and resumed: the model differs from the straight run's"; fi
done
cp $OUT/train_000002.bin $OUT/train_000003.bin
./train $M --data "$OUT/train_*.bin" --batch 4 --micro-batches 2 --steps 41 --checkpoint-dir $OUT/kill --resume > $OUT/changed.log 2>&1
if grep -q '^resume: the data changed since .*' $OUT/changed.log && [ "$(grep -c '^resume: the data' $OUT/changed.log)" = 1 ]; then
    ok "a changed shard list is said in one line on resume: $(grep '^resume: the data' $OUT/changed.log | cut -c1-120)"
else bad "a changed shard list on resume: $(grep -m1 resume $OUT/changed.log)"; fi
rm -f $OUT/train_000003.bin

# 4. --check-data and hostile specs
./train $M --data "$OUT/train_*.bin" --check-data > $OUT/check.log 2>&1
if [ $? -eq 0 ] && grep -q 'check-data: .*3 shards, 991 tokens, largest id [0-9]* < vocab 61: ok' $OUT/check.log &&
   ! grep -q '^step ' $OUT/check.log; then ok "--check-data reads every shard and exits 0: $(cat $OUT/check.log)"
else bad "--check-data: $(cat $OUT/check.log)"; fi
refused() {   # name, expected words, flags
    name=$1; want=$2; shift 2
    timeout 60 ./train $M --batch 4 --steps 2 "$@" > $OUT/r.out 2> $OUT/r.err
    rc=$?
    if [ $rc -eq 2 ] && [ "$(wc -l < $OUT/r.err)" -eq 1 ] && grep -q -- "$want" $OUT/r.err && ! grep -q '^step ' $OUT/r.out
    then ok "$name: exit 2, '$(cat $OUT/r.err)'"; else bad "$name: exit $rc: $(cat $OUT/r.err)"; fi
}
refused "a glob matching nothing" "no file matches" --data "$OUT/none_*.bin"
refused "a directory" "$OUT" --data $OUT
refused "a token beyond the vocabulary (--check-data)" "bad_000000.bin" --data $OUT/bad_000000.bin --check-data
refused "a token beyond the vocabulary (training)" "bad_000000.bin" --data $OUT/bad_000000.bin
t_end shards
