#!/bin/sh
# bench/bench_cpu.sh (make bench-cpu): GPT-2 124M (12 layers, 12 heads, 768
# wide, vocabulary 50257 padded to 50304) training on the CPU at batch 4,
# sequence 64. Prints each step and the median of the steps after the first
# (the first pays for page faults). STEPS=n to change the count.
cd "$(dirname "$0")/.." || exit 2
STEPS=${STEPS:-6}
DATA=${DATA:-../shared/data/tinyshakespeare.txt}
[ -f "$DATA" ] || DATA=data/tinyshakespeare_train.txt
[ -f "$DATA" ] || { echo "bench-cpu: no text at $DATA; pass DATA=path"; exit 2; }
echo "bench-cpu: GPT-2 124M, batch 4 x seq 64, $STEPS steps, $(nproc) cores, data $DATA"
./train --data "$DATA" --vocab 50257 --layers 12 --heads 12 --dim 768 --max-seq 1024 \
    --batch 4 --seq 64 --steps "$STEPS" --device cpu --lr 1e-4 | tee /tmp/bench_cpu.$$ || exit 1
grep '^step ' /tmp/bench_cpu.$$ | tail -n +2 | sed 's/.*| \([0-9.]*\) ms.*/\1/' | sort -n |
    awk '{v[NR]=$1} END {m = (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2;
         printf "bench-cpu: median %.1f ms a step, %.0f tokens/s (256 tokens a step, %d steps)\n", m, 256000 / m, NR}'
rm -f /tmp/bench_cpu.$$
