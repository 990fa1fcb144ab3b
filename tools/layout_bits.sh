#!/bin/sh
# tools/layout_bits.sh OLD_TRAIN NEW_TRAIN: trains one small model under
# twenty layouts with each binary (same data, seed, global batch) and
# compares the saved llm.c model files byte for byte; then resumes, with the
# new binary, a checkpoint the old one wrote. Used to show a refactor changes
# not one bit (issue 39's table). Prints one row a layout; exit 1 on any
# difference.
set -u
OLD=$1 NEW=$2
cd "$(dirname "$0")/.." || exit 2
DATA=data/tinyshakespeare_train.txt
[ -f "$DATA" ] || make --no-print-directory "$DATA" > /dev/null || exit 1
OUT=${OUT:-test/out/layout_bits}
rm -rf "$OUT"; mkdir -p "$OUT"
MODEL="--device cpu --data $DATA --layers 4 --heads 4 --dim 64 --seq 32 --steps 3 --lr 1e-3 --seed 7 --threads 1"
# name|flags: the global batch is 8 sequences in every layout
LAYOUTS="single|--batch 8
ddp|--ranks 2 --dp 2 --batch 4
ps|--ranks 2 --dp 2 --dp-mode ps --batch 4
zero1|--ranks 2 --dp 2 --zero 1 --batch 4
zero2|--ranks 2 --dp 2 --zero 2 --batch 4
zero3|--ranks 2 --dp 2 --zero 3 --batch 4
offload|--ranks 2 --dp 2 --zero 1 --offload --batch 4
tp2|--ranks 2 --tp 2 --batch 8
tp2-sp|--ranks 2 --tp 2 --sp --batch 8
naive|--ranks 2 --pp 2 --schedule naive --micro-batches 2 --batch 4
gpipe|--ranks 2 --pp 2 --schedule gpipe --micro-batches 2 --batch 4
1f1b-recompute|--ranks 2 --pp 2 --schedule 1f1b --micro-batches 4 --batch 2 --recompute
interleaved|--ranks 2 --pp 2 --schedule interleaved --virtual 2 --micro-batches 4 --batch 2
zb-h1|--ranks 2 --pp 2 --schedule zb-h1 --micro-batches 4 --batch 2
zb-h2|--ranks 2 --pp 2 --schedule zb-h2 --micro-batches 4 --batch 2
3d|--ranks 8 --dp 2 --tp 2 --pp 2 --micro-batches 2 --batch 2
4d-zero1-sp|--ranks 8 --dp 2 --tp 2 --pp 2 --zero 1 --sp --micro-batches 2 --batch 2
zero3-tp2|--ranks 4 --dp 2 --tp 2 --zero 3 --batch 4
bf16-single|--dtype bf16 --batch 8
bf16-tp2-sp|--ranks 2 --tp 2 --sp --dtype bf16 --batch 8"
fail=0
printf "%-16s %-10s %s\n" layout model "step losses"
echo "$LAYOUTS" | { while IFS='|' read -r name flags; do
    for b in old new; do
        bin=$OLD; [ $b = new ] && bin=$NEW
        # shellcheck disable=SC2086
        $bin $MODEL $flags --save "$OUT/$name.$b.bin" > "$OUT/$name.$b.log" 2>&1 ||
            { echo "$name: $b failed: $(tail -n 1 "$OUT/$name.$b.log")"; fail=1; }
        grep -a '^step ' "$OUT/$name.$b.log" | awk '{print $5}' | tr '\n' ' ' > "$OUT/$name.$b.loss"
    done
    if cmp -s "$OUT/$name.old.bin" "$OUT/$name.new.bin" && cmp -s "$OUT/$name.old.loss" "$OUT/$name.new.loss"; then
        printf "%-16s %-10s %s\n" "$name" identical "$(cat "$OUT/$name.new.loss")"
    else
        printf "%-16s %-10s %s | %s\n" "$name" DIFFERS "$(cat "$OUT/$name.old.loss")" "$(cat "$OUT/$name.new.loss")"; fail=1
    fi
done
# a checkpoint the old binary wrote at step 3, resumed by both to step 5
$OLD $MODEL --ranks 2 --tp 2 --batch 8 --checkpoint-dir "$OUT/ck" > "$OUT/ck.log" 2>&1 || { echo "checkpoint: old failed"; fail=1; }
cp -r "$OUT/ck" "$OUT/ck2"
for b in old new; do
    bin=$OLD; d=$OUT/ck; [ $b = new ] && { bin=$NEW; d=$OUT/ck2; }
    # shellcheck disable=SC2086
    $bin $(echo "$MODEL" | sed 's/--steps 3/--steps 5/') --ranks 2 --dp 2 --batch 4 --checkpoint-dir "$d" --resume --save "$OUT/resume.$b.bin" > "$OUT/resume.$b.log" 2>&1 ||
        { echo "resume: $b failed: $(tail -n 1 "$OUT/resume.$b.log")"; fail=1; }
done
if cmp -s "$OUT/resume.old.bin" "$OUT/resume.new.bin"; then
    printf "%-16s %-10s\n" "resume-old-ckpt" identical
else
    printf "%-16s %-10s\n" "resume-old-ckpt" DIFFERS; fail=1
fi
exit $fail; }
