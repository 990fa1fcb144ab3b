#!/bin/sh
# test/test_hellaswag.sh: --eval-hellaswag FILE through train (score.c).
# A small synthetic eval file in llm.c's format (eval.h: 25 examples of
# random ids below the vocabulary, each fitting --seq 16) is scored by a tiny
# model trained a few steps on test/fixtures, through --init and --steps 0
# (the score "at the end"), on one rank and on these layouts: dp 2 x tp 2,
# pp 2 (two rows a forward: --batch 2), ZeRO-3 over dp 2 (25 examples over 2
# ranks: the shorter block repeats a forward), tp 2 with --sp, and context
# parallelism (cp 2; cp 4, two rows a forward; dp 2 x cp 2, also under
# ZeRO-3, which gathers over dp x cp; cp 2 x pp 2:
# each cp rank runs its chunks of the rows, the losses put back together
# over the cp group). Each count
# must equal PyTorch's on the same model (test/reference.py hellaswag, in
# float64), except for examples whose two best completions lie within 1e-4
# of each other, and so must each choice: relabelled with PyTorch's choices,
# the file scores 25/25 but for those; without PyTorch, each count must
# equal one rank's. Under cp the choices are checked further, with or
# without PyTorch: the file relabelled with every label k (k = 0..3) counts
# the examples choosing k, and those four counts must be one rank's (summing
# to 25: each example counted once over its cp group). A run with
# --val-every 1 scores after each step and at the end, and --log records it.
# Hostile eval files (truncated, wrong magic, a label out of range, an index
# out of order, a token beyond the vocabulary, an example longer than --seq)
# each give one line on stderr and exit 2 before any step.
cd "$(dirname "$0")/.." || exit 2
. test/lib.sh
t_init hellaswag
t_need_python3 hellaswag "to write the eval file"

MODEL="--layers 2 --heads 4 --dim 32 --max-seq 16 --vocab 61"
RUN="--data test/fixtures/ref_tokens.bin --seq 16 --device cpu --threads 1"

# gen PATH [FAULT [LABELS]]: 25 examples (seeded), with one fault planted in
# example 3, or (FAULT "labels") LABELS, 25 comma-separated, as their labels
gen() {
    python3 - "$@" <<'EOF'
import random, struct, sys
path, fault = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else ""
labels = [int(x) for x in sys.argv[3].split(",")] if fault == "labels" else None
rng = random.Random(26)
body, longest = b"", 0
for i in range(25):
    ctx = [rng.randrange(61) for _ in range(rng.randint(1, 8))]
    ends = [[rng.randrange(61) for _ in range(rng.randint(1, 8))] for _ in range(4)]
    label, index = rng.randrange(4), i
    if labels: label = labels[i]
    if i == 3 and fault == "label": label = 4
    if i == 3 and fault == "index": index = 4
    if i == 3 and fault == "token": ends[2][0] = 61
    if i == 3 and fault == "long": ctx = [1] * 10; ends[1] = [2] * 7
    words = [label, 4, len(ctx)] + ctx
    for e in ends: words += [len(e)] + e
    nbytes = 2 * (3 + len(words))
    longest = max(longest, nbytes)
    body += struct.pack("<%dH" % (3 + len(words)), 65535, nbytes, index, *words)
header = struct.pack("<256i", *([20240522 if fault != "magic" else 20240326, 1, 25, longest] + [0] * 252))
data = header + body
if fault == "truncated": data = data[:len(data) - 7]
open(path, "wb").write(data)
EOF
}
gen $OUT/hs.bin || { bad "could not write the eval file"; t_end hellaswag; }

timeout 300 ./train $RUN $MODEL --batch 4 --steps 30 --lr 1e-2 --save $OUT/model.bin > $OUT/train.log 2>&1 &&
    ok "a tiny model trained 30 steps ($(grep '^step 30/' $OUT/train.log | cut -d'|' -f2 | tr -s ' '))" ||
    { bad "training the model failed: $(tail -n 1 $OUT/train.log)"; t_end hellaswag; }

# PyTorch's count and the slack: examples whose two best lie within 1e-4
PY=""
for p in /usr/bin/python3 python3; do
    if "$p" -c 'import torch, numpy' 2> /dev/null; then PY=$p; break; fi
done
ref=""; slack=0
if [ -n "$PY" ]; then
    "$PY" test/reference.py hellaswag $OUT/model.bin $OUT/hs.bin > $OUT/reference.txt 2>&1 &&
        ref=$(sed -n 's|^hellaswag: \([0-9]*\)/25 correct$|\1|p' $OUT/reference.txt)
    if [ -n "$ref" ]; then
        slack=$(awk '$1 == "example" && $NF + 0 < 1e-4 { n++ } END { print n + 0 }' $OUT/reference.txt)
        ok "PyTorch (float64): $ref/25 correct; examples whose two best lie within 1e-4 (the slack): $slack"
        # the same examples labelled with PyTorch's choices: a layout that chooses as
        # PyTorch does, example by example, gets them all (but for the slack)
        gen $OUT/hs_choices.bin labels "$(awk '$1 == "example" { printf "%s%s", s, $6; s = "," }' $OUT/reference.txt)"
    else
        bad "test/reference.py hellaswag failed: $(tail -n 1 $OUT/reference.txt)"
    fi
else
    echo "SKIP PyTorch's count: python3 -c 'import torch, numpy' fails (Debian's python3-torch); layouts are checked against one rank instead"
fi

# score NAME FILE FLAGS...: --steps 0 from the model; sets got (the count) or fails
score() {
    name=$1; file=$2; shift 2
    f=$OUT/$(echo "$name" | tr -c 'a-z0-9\n' '_').log
    got=""
    if ! timeout 300 ./train $RUN --init $OUT/model.bin --steps 0 --eval-hellaswag $file "$@" > $f 2>&1; then
        bad "$name: train failed: $(tail -n 1 $f)"; return 1
    fi
    line=$(grep '^hellaswag: ' $f)
    got=$(echo "$line" | sed -n 's|^hellaswag: \([0-9]*\)/25 correct (acc_norm [0-9.]*%)$|\1|p')
    [ -n "$got" ] && [ "$(grep -c '^hellaswag: ' $f)" -eq 1 ] || { bad "$name: no single hellaswag line: $(tail -n 1 $f)"; got=""; return 1; }
}

one=""
# the layouts: one rank, then each against PyTorch (or one rank)
for layout in "one rank|--batch 4" "dp 2 x tp 2|--ranks 4 --dp 2 --tp 2 --batch 4" \
              "pp 2, two rows a forward|--ranks 2 --pp 2 --batch 2" "ZeRO-3 over dp 2|--ranks 2 --zero 3 --batch 4" \
              "tp 2 with --sp, three rows a forward|--ranks 2 --tp 2 --sp --batch 3" \
              "cp 2|--ranks 2 --cp 2 --batch 4" "cp 4, two rows a forward|--ranks 4 --cp 4 --batch 2" \
              "dp 2 x cp 2|--ranks 4 --dp 2 --cp 2 --batch 4" "cp 2 x pp 2|--ranks 4 --cp 2 --pp 2 --batch 4" \
              "ZeRO-3 over dp 2 x cp 2|--ranks 4 --dp 2 --cp 2 --zero 3 --batch 4"; do
    name=${layout%%|*}
    score "$name" $OUT/hs.bin ${layout#*|} || continue
    [ -z "$one" ] && one=$got
    if [ -n "$ref" ]; then
        d=$((got - ref)); [ $d -lt 0 ] && d=$((-d))
        [ $d -le "$slack" ] && ok "$name: $line (PyTorch $ref/25, off by $d, slack $slack)" ||
            bad "$name: $got/25 correct, PyTorch $ref/25 (slack $slack)"
        score "$name, PyTorch's choices as labels" $OUT/hs_choices.bin ${layout#*|} || continue
        [ $((25 - got)) -le "$slack" ] && ok "$name: PyTorch's choice on $got/25 examples (slack $slack)" ||
            bad "$name: PyTorch's choice on only $got/25 examples (slack $slack)"
    else
        [ "$got" = "$one" ] && ok "$name: $line (one rank: $one/25)" || bad "$name: $got/25 correct, one rank $one/25"
    fi
done

# cp, choice by choice: with every label k, the count is how many examples
# choose k; each cp layout's four counts must be one rank's
for k in 0 1 2 3; do gen $OUT/hs_all$k.bin labels "$(awk -v k=$k 'BEGIN { for (i = 0; i < 25; i++) printf "%s%d", i ? "," : "", k }')"; done
base=""
for layout in "one rank|--batch 4" "cp 2|--ranks 2 --cp 2 --batch 4" "cp 4, two rows a forward|--ranks 4 --cp 4 --batch 2" \
              "dp 2 x cp 2|--ranks 4 --dp 2 --cp 2 --batch 4"; do
    name=${layout%%|*} counts="" sum=0
    for k in 0 1 2 3; do
        score "$name, every label $k" $OUT/hs_all$k.bin ${layout#*|} || break
        counts="$counts $got"; sum=$((sum + got))
    done
    [ -z "$base" ] && base=$counts
    [ "$counts" = "$base" ] && [ $sum -eq 25 ] && ok "$name: examples choosing completion 0, 1, 2, 3:$counts (one rank:$base)" ||
        bad "$name: examples choosing completion 0, 1, 2, 3: '$counts' (sum $sum), one rank:$base"
done

# --val-every 1 over 2 steps: after step 1 and at the end, each in --log
if timeout 300 ./train $RUN --init $OUT/model.bin --steps 2 --val-every 1 --eval-hellaswag $OUT/hs.bin \
        --log $OUT/run.jsonl > $OUT/every.log 2>&1; then
    n=$(grep -c '^hellaswag: ' $OUT/every.log); j=$(grep -c '"type":"hellaswag","step":[12],' $OUT/run.jsonl)
    [ "$n" -eq 2 ] && [ "$j" -eq 2 ] && ok "--val-every 1, 2 steps: $n hellaswag lines, $j --log records" ||
        bad "--val-every 1, 2 steps: $n hellaswag lines, $j --log records (want 2 and 2)"
else
    bad "--val-every 1: train failed: $(tail -n 1 $OUT/every.log)"
fi

# hostile files: one line on stderr, exit 2, no step
for fault in truncated magic label index token long; do
    gen $OUT/bad_$fault.bin $fault
    ./train $RUN $MODEL --steps 2 --eval-hellaswag $OUT/bad_$fault.bin > $OUT/bad_$fault.out 2> $OUT/bad_$fault.err
    rc=$?
    lines=$(wc -l < $OUT/bad_$fault.err)
    steps=$(grep -c '^step ' $OUT/bad_$fault.out)
    [ $rc -eq 2 ] && [ "$lines" -eq 1 ] && [ "$steps" -eq 0 ] &&
        ok "hostile eval file ($fault): exit 2, \"$(cat $OUT/bad_$fault.err)\"" ||
        bad "hostile eval file ($fault): exit $rc, $lines stderr lines, $steps steps: $(head -n 1 $OUT/bad_$fault.err)"
done

t_end hellaswag
