#!/bin/sh
# test/test_ckpt_faults.sh: checkpoints against bad files, signals and kill -9
# (checkpoint.c).
#
#   bad checkpoints  each kind, with no other checkpoint to fall back on:
#                    exit 2 and one line on stderr naming the file and the
#                    problem
#   fallback         a damaged latest beside an intact older checkpoint: one
#                    line naming the damaged one, the run continues from the
#                    older one and ends on the straight run's model, bitwise
#   one run a dir    a run without --resume into a directory holding
#                    checkpoints: exit 2, the directory byte for byte as it was
#   long names       a data file whose escaped name is past 512 bytes resumes
#   signals          SIGTERM finishes the step, checkpoints, exits 0, and
#                    --resume ends on the straight run's model (1 rank and
#                    --ranks 2); a second signal stops at once
#   kill -9          20 trials: a rank, the supervisor or the whole job killed
#                    at a random moment (saves every step, so some kills land
#                    in one); each time --resume continues, and the final model
#                    is the straight run's, bitwise
cd "$(dirname "$0")/.." || exit 2
. test/lib.sh
OUT=test/out/ckpt_faults
rm -rf "$OUT"; mkdir -p "$OUT"
M="--data test/fixtures/ref_tokens.bin --layers 4 --heads 4 --dim 32 --max-seq 16 --vocab 61 --seq 8 --device cpu --clip 0.5 --lr 0.005"

# ---- bad checkpoints ---------------------------------------------------------
good=$OUT/good
timeout 120 ./train $M --batch 4 --steps 4 --checkpoint-dir $good --checkpoint-every 2 --keep 5 > $OUT/good.log 2>&1
timeout 120 ./train $M --ranks 2 --zero 1 --batch 2 --steps 2 --checkpoint-dir $OUT/good2 > $OUT/good2.log 2>&1

fresh() {   # a copy of the good checkpoint's step $2 alone (nothing to fall back on), to spoil
    rm -rf "$OUT/bad"; mkdir -p "$OUT/bad"; cp -r "$1/step-$2" "$OUT/bad/"; echo "step-$2" > "$OUT/bad/latest"
    echo "$OUT/bad/step-$2"
}

bad() {   # name, expected words in the message, extra flags
    name=$1; want=$2; flags=$3
    timeout 120 ./train $M --batch 4 --steps 4 --checkpoint-dir $OUT/bad --resume $flags \
        > $OUT/bad.out 2> $OUT/bad.err
    rc=$?
    lines=$(wc -l < $OUT/bad.err)
    msg=$(head -n 1 $OUT/bad.err)
    if [ $rc -eq 2 ] && [ "$lines" -eq 1 ] && grep -q -- "$want" $OUT/bad.err; then
        echo "PASS bad checkpoint, $name: exit 2, '$msg'"
    else
        echo "FAIL bad checkpoint, $name: exit $rc, $lines lines on stderr, wanted '$want': $(cat $OUT/bad.err)"
    fi
}

# A NaN at element $2 of shard $1, its block's hash made to match again (so only the value is wrong).
put_nan() {
    python3 - "$1" "$2" <<'PY'
import struct, sys
path, at = sys.argv[1], int(sys.argv[2])
b = bytearray(open(path, "rb").read())
K = struct.unpack_from("<Q", b, 16)[0]
BW = 1 << 18
struct.pack_into("<I", b, 64 + 4 * at, 0x7fc00000)
blk = at // BW
words = min(BW, 3 * K - blk * BW)
h = 0xcbf29ce484222325
for (w,) in struct.iter_unpack("<I", bytes(b[64 + 4 * blk * BW: 64 + 4 * (blk * BW + words)])):
    h = ((h ^ w) * 0x100000001b3) & 0xffffffffffffffff
struct.pack_into("<Q", b, 64 + 12 * K + 8 * blk, h)
open(path, "wb").write(b)
PY
}

rm -rf "$OUT/bad"; mkdir -p "$OUT/bad/step-2"
bad "step directories but no latest" "bad/latest is missing"
s=$(fresh $OUT/good2 2); rm $s/shard-00001.bin
bad "missing shard" "shard-00001.bin: missing shard" "--ranks 2 --zero 1 --batch 2"
s=$(fresh $good 2); head -c 1000 $s/shard-00000.bin > $OUT/x && mv $OUT/x $s/shard-00000.bin
bad "truncated shard" "shard-00000.bin: truncated or corrupt shard"
s=$(fresh $good 2); cp test/fixtures/ref_model.bin $s/shard-00000.bin
bad "foreign file as a shard" "shard-00000.bin: not a train checkpoint shard"
s=$(fresh $good 2); printf '\377' | dd of=$s/shard-00000.bin bs=1 seek=5000 conv=notrunc 2>/dev/null
bad "a flipped byte in the data (checksum)" "shard-00000.bin: checksum mismatch in block 0"
s=$(fresh $good 2); printf '\007' | dd of=$s/shard-00000.bin bs=1 seek=12 conv=notrunc 2>/dev/null
bad "a flipped byte in a shard header" "checksum mismatch in the shard header"
s=$(fresh $good 2); cp $good/step-4/shard-00000.bin $s/shard-00000.bin
bad "a shard of another checkpoint" "shard of another checkpoint"
s=$(fresh $good 2); put_nan $s/shard-00000.bin 60000
bad "a NaN in Adam's m (its checksum right)" "shard-00000.bin: a non-finite value in Adam's m"
s=$(fresh $good 2)
bad "the flags name another model" "--layers 2, but the checkpoint .* holds layers 4" "--layers 2"
s=$(fresh $good 2); sed -i 's/^model layers 4/model layers 3/' $s/manifest.txt
bad "a manifest whose model does not match its shards" "does not have the"
s=$(fresh $good 2); sed -i 's/^train checkpoint 2/train checkpoint 3/' $s/manifest.txt
bad "a manifest of another format version" "format version 3, this build reads 2"
s=$(fresh $good 2); echo "hello" > $s/manifest.txt
bad "a foreign manifest" "not a train checkpoint manifest"
s=$(fresh $good 2); head -n 12 $s/manifest.txt > $OUT/x && mv $OUT/x $s/manifest.txt
bad "a truncated manifest" "incomplete manifest"
s=$(fresh $good 2); sed -i 's/^stage_layers 4/stage_layers 5/' $s/manifest.txt
bad "a manifest layout the model cannot take" "its layout is not one this model runs: --stage-layers adds up to"
s=$(fresh $good 2); sed -i 's/^range \([0-9]*\) \([0-9]*\)/range \1 18446744073709551615/' $s/manifest.txt
bad "a range whose length would wrap" "malformed manifest (line"
s=$(fresh $good 2); sed -i 's/ ranges \([0-9]*\)$/ ranges 1/' $s/manifest.txt
bad "a shard whose ranges do not add up to its elements" "malformed manifest (line"
s=$(fresh $good 2); sed -i 's/^shards 1$/shards 1\nshards 1/' $s/manifest.txt
bad "a second shards line" "malformed manifest (line"
s=$(fresh $good 2)
bad "resumed under a layout the model cannot take" "--tp 3" "--ranks 3 --tp 3 --batch 4"

# ---- a damaged latest falls back to the newest intact checkpoint ----------------
timeout 120 ./train $M --batch 4 --steps 4 --save $OUT/straight4.bin > $OUT/straight4.log 2>&1
fallback() {   # name, what spoils step-4 (the latest; step-2 intact), the damage's words
    name=$1; spoil=$2; want=$3; d=$OUT/fb
    rm -rf $d; cp -r $good $d; rm -f $d/.lock
    eval "$spoil"
    timeout 120 ./train $M --batch 4 --steps 4 --checkpoint-dir $d --resume --save $OUT/fb.bin > $OUT/fb.out 2> $OUT/fb.err
    rc=$?
    timeout 120 ./train $M --batch 4 --steps 4 --checkpoint-dir $d --resume > $OUT/fb2.out 2> $OUT/fb2.err
    rc2=$?
    if [ $rc -eq 0 ] && [ "$(wc -l < $OUT/fb.err)" -eq 1 ] && grep -q -- "$want" $OUT/fb.err &&
       grep -q "continuing from $d/step-2" $OUT/fb.err && grep -q "^resumed from $d/step-2 at step 2" $OUT/fb.out &&
       cmp -s $OUT/fb.bin $OUT/straight4.bin && [ $rc2 -eq 0 ] && [ ! -s $OUT/fb2.err ] &&
       grep -q "^resumed from $d/step-4 at step 4" $OUT/fb2.out && [ "$(cat $d/latest)" = step-4 ]; then
        echo "PASS fallback, $name: one line ('$(cut -c 1-90 $OUT/fb.err)...'), continued from step-2, model equals the straight run's bit for bit; step-4 rewritten whole and resumable"
    else
        echo "FAIL fallback, $name: exit $rc, then $rc2: $(cat $OUT/fb.err $OUT/fb2.err) (see $OUT/fb.out)"
    fi
}
fallback "a flipped byte in latest's shard" \
    "printf '\\377' | dd of=\$d/step-4/shard-00000.bin bs=1 seek=5000 conv=notrunc 2>/dev/null" \
    "step-4/shard-00000.bin: checksum mismatch in block 0"
fallback "a NaN in latest's master weights" "put_nan \$d/step-4/shard-00000.bin 7" "step-4/shard-00000.bin: a non-finite value in the master weights"
fallback "latest's manifest missing" "rm \$d/step-4/manifest.txt" "step-4/manifest.txt: missing"

# ---- a checkpoint directory belongs to one run ----------------------------------
listing() { (cd "$1" && find . -printf '%p %y %s %m\n' | sort && find . -type f -exec sha256sum {} + | sort); }
d=$OUT/used; rm -rf $d; cp -r $good $d; rm -f $d/.lock
before=$(listing $d)
timeout 120 ./train $M --batch 4 --steps 4 --checkpoint-dir $d > $OUT/used.out 2> $OUT/used.err
rc=$?
after=$(listing $d)
if [ $rc -eq 2 ] && [ "$(wc -l < $OUT/used.err)" -eq 1 ] && grep -q -- "--resume" $OUT/used.err &&
   grep -q -- "$d" $OUT/used.err && [ "$before" = "$after" ]; then
    echo "PASS a fresh run into a used directory: exit 2, '$(cat $OUT/used.err)'; the directory byte for byte as it was ($(echo "$before" | wc -l) lines of listing, no lock taken)"
else
    echo "FAIL a fresh run into a used directory: exit $rc, $(cat $OUT/used.err); listing $( [ "$before" = "$after" ] && echo same || echo changed)"
fi

# ---- a data file whose escaped name is past 512 bytes ---------------------------
name=$(python3 -c 'print("\u00e9" * 100, end="")')
long=$OUT/$name.bin; cp test/fixtures/ref_tokens.bin "$long"
L=$(echo "$M" | sed "s|--data test/fixtures/ref_tokens.bin||")
d=$OUT/longname; rm -rf $d
timeout 120 ./train $L --data "$long" --batch 4 --steps 4 --checkpoint-dir $d --checkpoint-every 2 > $OUT/long1.log 2>&1
rc1=$?
rm -rf $d/step-4; echo step-2 > $d/latest   # as if stopped at step 2
timeout 120 ./train $L --data "$long" --batch 4 --steps 4 --checkpoint-dir $d --resume --save $OUT/long.bin > $OUT/long2.log 2>&1
rc2=$?
width=$(awk '/^data_shard / { print length($0) }' $d/step-4/manifest.txt 2>/dev/null | sort -n | tail -n 1)
if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && grep -q "^resumed from $d/step-2 at step 2" $OUT/long2.log &&
   [ "${width:-0}" -gt 512 ] && cmp -s $OUT/long.bin $OUT/straight4.bin; then
    echo "PASS a data file named with 100 'é': its manifest line is $width bytes; --resume continues and ends on the straight run's model"
else
    echo "FAIL a data file named with 100 'é': exit $rc1 then $rc2, manifest line ${width:-?} bytes (see $OUT/long2.log)"
fi

# ---- signals -----------------------------------------------------------------
N=1500
sigterm() {   # name, flags
    name=$1; flags=$2; d=$OUT/sig_$(echo "$name" | tr -c 'a-z0-9\n' '_')
    timeout 300 ./train $M $flags --steps $N --save $d.straight.bin > $d.straight.log 2>&1
    nr=$(echo "$flags" | sed -n 's/.*--ranks \([0-9]*\).*/\1/p')
    signal_held TERM $d.log $d ${nr:-0} ./train $M $flags --steps $N --checkpoint-dir $d   # once it is ready: no race
    rc=$?
    at=$(sed -n 's/.*stopped by signal 15 after step \([0-9]*\).*/\1/p' $d.log)
    latest=$(cat $d/latest 2>/dev/null)
    timeout 300 ./train $M $flags --steps $N --checkpoint-dir $d --resume --save $d.bin > $d.resume.log 2>&1
    rc2=$?
    if [ $rc -eq 75 ] && [ -n "$at" ] && [ "$at" -lt $N ] && [ "$latest" = "step-$at" ] && [ $rc2 -eq 0 ] &&
       grep -q "^stopped at step $at: checkpoint .*; the same command continues" $d.log && cmp -s $d.bin $d.straight.bin; then
        echo "PASS SIGTERM, $name: stopped after step $at with a checkpoint, exit 75; --resume to $N ends on the straight run's model"
    else
        echo "FAIL SIGTERM, $name: exit $rc, stopped at '$at', latest '$latest', resume exit $rc2 (see $d.log)"
    fi
}
sigterm "one rank" "--batch 4"
sigterm "--ranks 2, zero 1 (the supervisor passes it on)" "--ranks 2 --zero 1 --batch 2"

d=$OUT/sig_twice   # steps of about a second: the second signal comes within the first's step
./train --data test/fixtures/ref_tokens.bin --layers 2 --heads 8 --dim 512 --max-seq 64 --vocab 61 --seq 64 \
    --batch 64 --device cpu --steps 1000 --checkpoint-dir $d > $d.log 2>&1 &
pid=$!
sleep 1.5
kill -INT $pid; sleep 0.1; kill -INT $pid
wait $pid
rc=$?
if [ $rc -eq 130 ] && ! grep -q "stopped by signal" $d.log; then
    echo "PASS a second SIGINT stops at once (killed by the signal, status $rc, no checkpoint)"
else echo "FAIL a second SIGINT: exit status $rc, expected 130"; fi

# ---- kill -9 at random moments -----------------------------------------------
N=2000
K="--ranks 2 --zero 1 --batch 2 --steps $N"
timeout 300 ./train $M $K --save $OUT/kill_straight.bin > $OUT/kill_straight.log 2>&1
d=$OUT/kill
rnd() { od -An -N2 -tu2 /dev/urandom | tr -d ' '; }
bad_resume=0; killed=0; during_save=0
for trial in $(seq 1 20); do
    ./train $M $K --checkpoint-dir $d --checkpoint-every 1 --keep 2 --resume > $d.trial$trial.log 2>&1 &
    pid=$!
    sleep "0.$(( $(rnd) % 6 + 1 ))$(( $(rnd) % 10 ))"
    kids=$(pgrep -P $pid | tr '\n' ' ')
    case $(( $(rnd) % 3 )) in
        0) victim=$pid ;;                                  # the supervisor
        1) victim=$(echo $kids | cut -d' ' -f1) ;;         # rank 0
        2) victim=$(echo $kids | cut -d' ' -f2) ;;         # rank 1
    esac
    ls -a $d 2>/dev/null | grep -q '^\.step-.*\.tmp$' && during_save=$((during_save + 1))
    [ -n "$victim" ] && kill -9 $victim 2>/dev/null && killed=$((killed + 1))
    wait $pid
    rc=$?
    [ $rc -eq 2 ] && { bad_resume=$((bad_resume + 1)); echo "trial $trial: exit 2: $(grep -v '^\[' $d.trial$trial.log | tail -n 2)"; }
    # the ranks of a killed supervisor die with it; the next run waits for them (the directory's lock)
    for i in $(seq 1 100); do pgrep -f -- "--checkpoint-dir $d " > /dev/null || break; sleep 0.05; done
done
timeout 300 ./train $M $K --checkpoint-dir $d --checkpoint-every 1 --keep 2 --resume --save $OUT/kill_final.bin \
    > $OUT/kill_final.log 2>&1
rc=$?
from=$(sed -n 's/.*resumed from .* at step \([0-9]*\).*/\1/p' $OUT/kill_final.log)
if [ $rc -eq 0 ] && [ $bad_resume -eq 0 ] && cmp -s $OUT/kill_final.bin $OUT/kill_straight.bin; then
    echo "PASS kill -9: 20 trials ($killed kills, $during_save with a save in flight), no resume refused; the last resumed from step $from and its model equals the straight run's"
else
    echo "FAIL kill -9: final exit $rc, $bad_resume refused resumes, models $(cmp -s $OUT/kill_final.bin $OUT/kill_straight.bin && echo equal || echo differ)"
fi
