#!/bin/sh
# bench/plan_calibrate.sh (make bench-plan): does the planner's time model
# rank layouts the way they really fall on this machine?
#
# 1. Calibrate: one rank's step of the model below gives the host's float32
#    compute rate (the planner's 6N + 12LTC flops a token over the measured
#    time); bench/bench_comm gives the shared-memory backend's bus bandwidth
#    at 1 MB for 4 ranks (the planner's latency stays its 10 us).
# 2. Plan: ./train --plan --device cpu for 4 "GPUs" of that rate (each rank
#    gets a quarter of the host: the ranks share its cores) and bandwidth,
#    every layout listed with its predicted step time.
# 3. Measure: the same layouts trained for real on 4 CPU ranks (median step
#    of steps 3-8).
# 4. Report both columns and Spearman's rank correlation between them.
# A benchmark, not a test: the figures depend on the host (a core a rank
# makes them mean more; with fewer cores the ranks' compute is serialised,
# which the model's "compute / ranks" assumes anyway).
cd "$(dirname "$0")/.." || exit 2
command -v python3 >/dev/null || { echo "bench-plan: needs python3"; exit 2; }
make -s build bench/bench_comm >/dev/null || exit 2
mkdir -p bench/out
DATA=data/tinyshakespeare_train.txt
[ -f $DATA ] || make -s $DATA >/dev/null || exit 2
MODEL="--layers 4 --heads 4 --dim 128 --seq 64 --vocab 256 --max-seq 64"
G=16
RUN="--data $DATA $MODEL --device cpu --steps 8 --lr 1e-4"

median_ms() {   # the median step time of steps 3.. of a run's output
    grep '^step ' | awk -F'|' 'NR >= 3 { split($5, w, " "); print w[1] }' | sort -n |
        awk '{ a[NR] = $1 } END { print (NR ? a[int((NR + 1) / 2)] : -1) }'
}

one=$(./train $RUN --batch $G 2>&1 | median_ms)
tflops=$(python3 -c "
L, C, T, V = 4, 128, 64, 256
N = V * C + 64 * C + L * (12 * C * C + 13 * C) + 2 * C
flops = (6 * N + 12 * L * T * C) * $G * T
print('%.6f' % (flops / ($one / 1e3) / 1e12))")
bw=$(./bench/bench_comm --ranks 4 --max-mb 1 2>/dev/null | awk '$1 == 1048576 { print $5 }')
[ -n "$bw" ] || bw=4
echo "calibration: one rank, $G x 64 tokens: $one ms a step = $tflops TFLOP/s (float32, the host); shm all-reduce busbw at 1 MB over 4 ranks: $bw GB/s"
# per rank: a quarter of the host; the planner takes MFU 0.5 of the given peak
per=$(python3 -c "print('%.6f' % ($tflops / 4 / 0.5))")
./train --plan --device cpu $MODEL --gpus 4 --gpus-per-node 4 --gpu-mem 64 --gpu-tflops $per \
    --intra-gbs $bw --inter-gbs $bw --global-batch $G --top 100000 > bench/out/plan_calibrate.plan || exit 2

LAYOUTS="4 1 1 0 1 1f1b|4 1 1 1 1 1f1b|4 1 1 2 1 1f1b|4 1 1 3 1 1f1b|2 2 1 0 1 1f1b|2 2 1 1 1 1f1b|1 4 1 0 1 1f1b|2 1 2 0 2 1f1b|2 1 2 0 8 1f1b|2 1 2 0 8 gpipe|1 1 4 0 4 1f1b|1 1 4 0 16 1f1b|1 1 4 0 16 gpipe|1 2 2 0 4 1f1b|1 2 2 1 8 1f1b"
: > bench/out/plan_calibrate.tsv
echo "$LAYOUTS" | tr '|' '\n' | while read dp tp pp z M s; do
    b=$((G / dp / M))
    ms=$(./train $RUN --ranks 4 --dp $dp --tp $tp --pp $pp --zero $z --micro-batches $M --batch $b --schedule $s 2>&1 | median_ms)
    pred=$(awk -v dp=$dp -v tp=$tp -v pp=$pp -v z=$z -v M=$M -v s=$s '
        $1 == "dp" && $2 == dp && $4 == tp && $6 == pp && $8 == z && $10 == M && $13 == s && $14 == "|" {
            for (i = 1; i <= NF; i++) if ($i == "step") { print $(i + 1) * 1000; exit } }' bench/out/plan_calibrate.plan)
    echo "dp $dp tp $tp pp $pp zero $z M $M b $b $s	${pred:-?}	$ms" | tee -a bench/out/plan_calibrate.tsv
done
python3 - bench/out/plan_calibrate.tsv <<'EOF'
import sys
rows = [l.rstrip('\n').split('\t') for l in open(sys.argv[1]) if l.strip()]
rows = [(n, float(p), float(m)) for n, p, m in rows if p not in ('?', '') and float(m) > 0]
def ranks(v):
    order = sorted(range(len(v)), key=lambda i: v[i])
    r = [0.0] * len(v)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]: j += 1
        for k in range(i, j + 1): r[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return r
p = ranks([r[1] for r in rows]); m = ranks([r[2] for r in rows])
n = len(rows)
mp, mm = sum(p) / n, sum(m) / n
cov = sum((a - mp) * (b - mm) for a, b in zip(p, m))
sd = (sum((a - mp) ** 2 for a in p) * sum((b - mm) ** 2 for b in m)) ** 0.5
print("%-44s %12s %12s %6s %6s" % ("layout (4 CPU ranks, global batch 16 x 64)", "planned ms", "measured ms", "rank", "rank"))
for (name, pr, me), a, b in sorted(zip(rows, p, m), key=lambda t: t[0][2]):
    print("%-44s %12.1f %12.1f %6.1f %6.1f" % (name, pr, me, a, b))
print("Spearman rank correlation, planned vs measured, %d layouts: %.3f" % (n, cov / sd if sd else float('nan')))
EOF
