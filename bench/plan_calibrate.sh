#!/bin/sh
# bench/plan_calibrate.sh (make bench-plan): does the planner's time model
# rank layouts the way they really fall on this machine?
#
# 1. Calibrate: one rank on one thread (--threads 1) trains the model below
#    at the batch a rank holds in most layouts; the planner's 6N + 12LTC
#    flops a token over its median step is a core's float32 rate.
#    bench/bench_comm over 4 ranks gives the shared-memory backend's bus
#    bandwidth at 1 MB and its latency (the time of a 1 KB all-reduce).
# 2. Plan: ./train --plan --device cpu --gpus 4 --cpu-cores <this host's
#    cores>: 4 single-threaded ranks sharing the cores, every layout listed
#    with its predicted step time. The planner lays each rank's compute on
#    the schedule's slots and lets a slot with more busy ranks than cores
#    last busy / cores times longer: a rank waiting in a pipeline's bubble
#    lends its core to another.
# 3. Measure: the same layouts trained for real on 4 CPU ranks, a thread
#    each (median step of steps 3-12), REPS passes (default 3) in turn;
#    a layout's figure is the median of its passes.
# 4. Report both columns and Spearman's rank correlation between them.
# A benchmark, not a test: the figures depend on the host and its load.
cd "$(dirname "$0")/.." || exit 2
command -v python3 >/dev/null || { echo "bench-plan: needs python3"; exit 2; }
make -s build bench/bench_comm >/dev/null || exit 2
mkdir -p bench/out
DATA=data/tinyshakespeare_train.txt
[ -f $DATA ] || make -s $DATA >/dev/null || exit 2
MODEL="--layers 4 --heads 4 --dim 128 --seq 64 --vocab 256 --max-seq 64"
G=16
REPS=${REPS:-3}
CORES=$(getconf _NPROCESSORS_ONLN 2>/dev/null || nproc)
RUN="--data $DATA $MODEL --device cpu --threads 1 --steps 12 --lr 1e-4"

median_ms() {   # the median step time of steps 3.. of a run's output
    grep '^step ' | awk -F'|' 'NR >= 3 { split($5, w, " "); print w[1] }' | sort -n |
        awk '{ a[NR] = $1 } END { print (NR ? a[int((NR + 1) / 2)] : -1) }'
}

B1=4
one=$(./train $RUN --batch $B1 2>&1 | median_ms)
tflops=$(python3 -c "
L, C, T, V = 4, 128, 64, 256
N = V * C + 64 * C + L * (12 * C * C + 13 * C) + 2 * C
flops = (6 * N + 12 * L * T * C) * $B1 * T
print('%.6f' % (flops / ($one / 1e3) / 1e12))")
./bench/bench_comm --ranks 4 --max-mb 1 > bench/out/plan_calibrate.comm 2>/dev/null
bw=$(awk '$1 == 1048576 { print $5 }' bench/out/plan_calibrate.comm)
lat=$(awk '$1 == 1024 { print $3 }' bench/out/plan_calibrate.comm)
[ -n "$bw" ] || bw=4
[ -n "$lat" ] || lat=20
echo "calibration: one rank, one thread, $B1 x 64 tokens: $one ms a step = $tflops TFLOP/s a core (float32);" \
     "shm all-reduce over 4 ranks: $bw GB/s busbw at 1 MB, $lat us at 1 KB; $CORES cores"
# the planner takes MFU 0.5 of the peak it is given
peak=$(python3 -c "print('%.6f' % ($tflops / 0.5))")
./train --plan --device cpu $MODEL --gpus 4 --gpus-per-node 4 --cpu-cores $CORES --gpu-mem 64 --gpu-tflops $peak \
    --intra-gbs $bw --inter-gbs $bw --latency-us $lat --global-batch $G --top 100000 > bench/out/plan_calibrate.plan || exit 2

# dp tp pp zero M schedule recompute: pipelines short and long, naive's one
# stage at a time, tp's collectives, ZeRO's gathers, recompute's extra forward
LAYOUTS="4 1 1 0 1 1f1b 0|4 1 1 3 1 1f1b 0|4 1 1 0 1 1f1b 1|2 2 1 0 1 1f1b 0|2 2 1 1 1 1f1b 1|1 4 1 0 1 1f1b 0|\
2 1 2 0 2 1f1b 0|2 1 2 0 8 gpipe 0|2 1 2 0 2 naive 0|2 1 2 0 4 1f1b 1|1 1 4 0 4 1f1b 0|1 1 4 0 4 gpipe 1|\
1 1 4 0 16 1f1b 0|1 1 4 0 4 naive 0|1 1 4 0 16 naive 0|1 2 2 0 4 1f1b 0|1 2 2 1 8 1f1b 0|1 1 4 0 8 naive 1"
rm -f bench/out/plan_calibrate.runs
rep=1
while [ $rep -le $REPS ]; do
    echo "$LAYOUTS" | tr '|' '\n' | while read dp tp pp z M s rc; do
        b=$((G / dp / M))
        flag=; [ "$rc" = 1 ] && flag=--recompute
        ms=$(./train $RUN --ranks 4 --dp $dp --tp $tp --pp $pp --zero $z --micro-batches $M --batch $b \
             --schedule $s $flag 2>&1 | median_ms)
        echo "$dp $tp $pp $z $M $s $rc	$ms" >> bench/out/plan_calibrate.runs
    done
    echo "pass $rep of $REPS measured"
    rep=$((rep + 1))
done
: > bench/out/plan_calibrate.tsv
echo "$LAYOUTS" | tr '|' '\n' | while read dp tp pp z M s rc; do
    b=$((G / dp / M))
    ms=$(awk -F'\t' -v k="$dp $tp $pp $z $M $s $rc" '$1 == k { print $2 }' bench/out/plan_calibrate.runs | sort -n |
         awk '{ a[NR] = $1 } END { print (NR ? a[int((NR + 1) / 2)] : -1) }')
    want=$([ "$rc" = 1 ] && echo recompute || echo "|")
    pred=$(awk -v dp=$dp -v tp=$tp -v pp=$pp -v z=$z -v M=$M -v s=$s -v w="$want" -v rc=$rc '
        $1 == "dp" && $2 == dp && $4 == tp && $6 == pp && $8 == z && $10 == M && $13 == s && $14 == w &&
        (rc == 0 || $15 == "|") {
            for (i = 1; i <= NF; i++) if ($i == "step") { print $(i + 1) * 1000; exit } }' bench/out/plan_calibrate.plan)
    name="dp $dp tp $tp pp $pp zero $z M $M b $b $s"
    [ "$rc" = 1 ] && name="$name recompute"
    echo "$name	${pred:-?}	$ms" >> bench/out/plan_calibrate.tsv
done
python3 - bench/out/plan_calibrate.tsv <<'EOF'
import sys
rows = [l.rstrip('\n').split('\t') for l in open(sys.argv[1]) if l.strip()]
missing = [n for n, p, m in rows if p in ('?', '') or float(m) <= 0]
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
print("%-50s %11s %11s %5s %5s" % ("layout (4 CPU ranks, global batch 16 x 64)", "planned ms", "measured ms", "rank", "rank"))
for (name, pr, me), a, b in sorted(zip(rows, p, m), key=lambda t: t[0][2]):
    print("%-50s %11.1f %11.1f %5.1f %5.1f" % (name, pr, me, a, b))
for name in missing: print("%-50s not planned or not measured" % name)
print("Spearman rank correlation, planned vs measured, %d layouts: %.3f" % (n, cov / sd if sd else float('nan')))
EOF
