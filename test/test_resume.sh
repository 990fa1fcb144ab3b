#!/bin/sh
# test/test_resume.sh: exact resume on the same layout (checkpoint.c).
#
# For each layout: a straight run of N steps; a run of N steps that
# checkpoints every S steps, whose `latest` is then pointed back at step S
# (as if it had been killed after step S); and --resume from there to N.
# Every step line's loss, norm and lr after S, and the final --save model
# file, must equal the straight run's bit for bit (the CPU, float32).
cd "$(dirname "$0")/.." || exit 2
. test/lib.sh
t_ckpt_init resume

# the step lines without their timings
steps() { grep '^step ' "$1" | cut -d'|' -f1-4; }

exact() {   # name, model, flags
    name=$1
    t_stop_resume "$1" "$2" "$3" "$3" "the checkpointing run" || return 0
    steps "$d/straight.log" | tail -n $((N - S)) > "$d/straight.steps"
    steps "$d/resumed.log" > "$d/resumed.steps"
    steps "$d/first.log" > "$d/first.steps"
    steps "$d/straight.log" > "$d/straight_all.steps"
    shards=$(ls "$d/ck/step-$S" | grep -c '^shard-')
    if [ "$(wc -l < "$d/resumed.steps")" -ne $((N - S)) ]; then
        echo "FAIL $name: the resumed run printed $(wc -l < "$d/resumed.steps") step lines, expected $((N - S))"
    elif ! cmp -s "$d/straight.steps" "$d/resumed.steps"; then
        echo "FAIL $name: steps $((S + 1))..$N differ from the straight run's"; diff "$d/straight.steps" "$d/resumed.steps"
    elif ! cmp -s "$d/straight_all.steps" "$d/first.steps"; then
        echo "FAIL $name: checkpointing changed the run's steps"
    elif ! cmp -s "$d/straight.bin" "$d/resumed.bin"; then
        echo "FAIL $name: the final model differs from the straight run's"
    else
        echo "PASS $name: stop after step $S, resume to $N: $((N - S)) step lines and the model file bitwise equal ($shards shards)"
    fi
}

exact "one rank" "$SMALL" "--batch 4"
exact "dp 2, zero 1" "$SMALL" "--ranks 2 --batch 2 --micro-batches 2 --zero 1"
exact "dp 2, zero 3, offload" "$SMALL" "--ranks 2 --batch 2 --zero 3 --offload"
exact "tp 2, sp" "$SMALL" "--ranks 2 --tp 2 --sp --batch 4"
exact "pp 2, 1f1b, recompute" "$SMALL" "--ranks 2 --pp 2 --schedule 1f1b --batch 1 --micro-batches 4 --recompute"
exact "dp 2 x tp 2 x pp 2, zero 1" "$BIG" "--ranks 8 --dp 2 --tp 2 --pp 2 --zero 1 --batch 2 --micro-batches 2"
exact "ddp 2 (zero 0), parameter server" "$SMALL" "--ranks 2 --batch 2 --dp-mode ps"
exact "one rank, bf16" "$SMALL" "--batch 4 --dtype bf16"

# --keep: the oldest go only once a newer one is complete
d=$OUT/keep
timeout 300 ./train $SMALL --batch 4 --steps 5 --checkpoint-dir "$d" --checkpoint-every 1 --keep 2 > "$OUT/keep.log" 2>&1
left=$(ls "$d" | tr '\n' ' ')
if [ "$left" = "latest step-4 step-5 " ] && [ "$(cat "$d/latest")" = "step-5" ]; then
    echo "PASS --keep 2: after 5 checkpoints the directory holds $left"
else
    echo "FAIL --keep 2: the directory holds '$left', latest '$(cat "$d/latest" 2>/dev/null)'"
fi

# a checkpoint turned into an llm.c model file
timeout 300 ./train $SMALL --batch 4 --steps 5 --checkpoint-dir "$d" --resume --save "$OUT/export.bin" > "$OUT/export.log" 2>&1
timeout 300 ./train $SMALL --batch 4 --steps 5 --save "$OUT/straight5.bin" > "$OUT/straight5.log" 2>&1
if cmp -s "$OUT/export.bin" "$OUT/straight5.bin" && ! grep -q '^step ' "$OUT/export.log"; then
    echo "PASS --resume --steps 5 --save: the checkpoint of step 5 exported as the straight run's model file"
else
    echo "FAIL --resume --steps 5 --save: the export differs from the straight run's model"
fi

# The GPU path: two emulated GPUs over the emulated NCCL (test/train_nccl_emu),
# ZeRO-1, saved with the compute stream late and resumed with the
# communication streams late: the device-to-host copies of the save and the
# loads must be ordered whatever the timing.
if [ -x test/train_nccl_emu ]; then
    d=$OUT/gpu
    G="$SMALL --device cuda --dtype fp32 --no-self-test --ranks 2 --zero 1 --batch 2"
    EMU_GPUS=8 EMU_STREAMS=first-late timeout 300 ./test/train_nccl_emu $G --steps 6 --save "$OUT/gpu_straight.bin" \
        > "$OUT/gpu_straight.log" 2>&1
    # the run of 6 steps checkpoints after step 3 (and 6); resume from step 3
    EMU_GPUS=8 EMU_STREAMS=first-late timeout 300 ./test/train_nccl_emu $G --steps 6 --checkpoint-dir "$d" \
        --checkpoint-every 3 > "$OUT/gpu_stop.log" 2>&1
    echo step-3 > "$d/latest"
    EMU_GPUS=8 EMU_STREAMS=rest-late timeout 300 ./test/train_nccl_emu $G --steps 6 --checkpoint-dir "$d" --resume \
        --save "$OUT/gpu_resumed.bin" > "$OUT/gpu_resumed.log" 2>&1
    a=$(grep '^step [456]/' "$OUT/gpu_straight.log" | sed 's/ | [0-9.]* ms.*//')
    b=$(grep '^step [456]/' "$OUT/gpu_resumed.log" | sed 's/ | [0-9.]* ms.*//')
    if [ -n "$a" ] && [ "$a" = "$b" ] && cmp -s "$OUT/gpu_straight.bin" "$OUT/gpu_resumed.bin"; then
        echo "PASS emulated GPUs over NCCL, zero 1: stop after step 3, resume to 6 in the other timing: step lines and model file bitwise equal"
    else
        echo "FAIL emulated GPUs over NCCL, zero 1: the resumed run differs from the straight one (see $OUT/gpu_*.log)"
    fi
else
    echo "SKIP emulated GPUs over NCCL: test/train_nccl_emu not built (no nccl.h or CUDA headers where make ran)"
fi
