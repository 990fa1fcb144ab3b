#!/bin/sh
# bench/bench_pipeline.sh (make bench-pipeline): the pipeline bubble, measured.
# P = 4 stages, M = 4, 8, 16 micro-batches, 1F1B and GPipe, on the CPU with
# each rank pinned to its own cores when the host has enough; each stage's
# idle fraction over the steps after the first, read from the Chrome trace
# (compute = forward and backward spans less the waits for neighbours inside
# them), beside the articles' (P-1)/(M+P-1). With fewer cores than ranks the
# ranks time-share cores and the figures mean little: the table says so.
cd "$(dirname "$0")/.." || exit 2
DATA=${DATA:-../shared/data/tinyshakespeare.txt}
[ -f "$DATA" ] || DATA=data/tinyshakespeare_train.txt
P=4
STEPS=${STEPS:-4}
MODEL="--layers 8 --heads 4 --dim 128 --seq 64 --batch 2 --vocab 256 --device cpu"
echo "bench-pipeline: P=$P, $(nproc) cores, model: $MODEL, $STEPS steps (the first not counted)"
[ "$(nproc)" -lt $P ] && echo "note: $(nproc) cores for $P ranks: stages share cores, so idle time is not a bubble measurement"
printf "%-8s %4s %10s %s\n" schedule M formula "measured idle per stage (0..3), mean"
for sched in 1f1b gpipe; do
    for M in 4 8 16; do
        out=test/out/bench_pipeline_${sched}_$M.json
        ./train --data "$DATA" $MODEL --ranks $P --pp $P --schedule $sched --micro-batches $M \
            --steps "$STEPS" --pin-cores --trace "$out" > /dev/null || exit 1
        python3 bench/pipeline_idle.py "$out" $P $M $sched
    done
done
