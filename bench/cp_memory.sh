#!/bin/sh
# bench/cp_memory.sh (make bench-cp): context parallelism's memory at T 4096
# on the CPU (issue 41, "How it must be shown"): a GPT-2 124M-shaped model
# (width 768, 12 heads, GPT-2's vocabulary of 50257, whose logits at 4096
# tokens weigh about as much as a layer's activations; LAYERS layers, 4 by
# default rather than 12, so that cp 1 needs about 7 GB and the three runs
# take about two minutes on two cores) trained one step of batch 1 x 4096 tokens at
# --cp 1, 2 and 4 (--ranks N --cp N), and for each rank:
#   - the activations train counts (its "memory rank r: ... activations X MB"
#     line: gpt.c's buffers of a set of activations);
#   - the other buffers whose size follows the tokens a rank holds, counted
#     from the code that allocates them: the backward's row scratch (gpt.c's
#     scratch_rows: dx, dln, datty, dqkv, dfch, dfchg, full, 15 C floats a
#     token), attention's backward scratch on one rank (ops.c's
#     cpu_attention_floats: the gradient of the B NH T T probabilities), and
#     under cp the ring's buffers (cp.c: kv and dkv twice, [B,Tl,2C] each,
#     D [B,NH,Tl], the positions and their gradient [Tl,C] each);
#   - its peak resident memory, VmHWM from /proc/self/status read as each
#     process exits, by a small library preloaded into train (LD_PRELOAD,
#     built here; train's code is unchanged). Each process writes its pid,
#     its parent's and its VmHWM to a file; the ranks are the processes whose
#     parent is the --ranks supervisor, in the order it forks them (rank 0
#     first, so in pid order).
# Then the table: the resident memory a rank saves against cp 1 beside the
# counted saving (activations plus those buffers), their ratio, and the
# saving in activations alone; the planner's activations a rank
# (--plan-layout) beside train's.
# Environment: LAYERS (4), SEQ (4096), VOCAB (50257; empty: the data's,
# 256 for bytes), OUT (test/out/cp_memory).
set -u
cd "$(dirname "$0")/.." || exit 2
LAYERS=${LAYERS:-4} SEQ=${SEQ:-4096} VOCAB=${VOCAB-50257}
OUT=${OUT:-test/out/cp_memory}
DATA=data/tinyshakespeare_train.txt
[ -x ./train ] || { echo "bench-cp: build ./train first (make build)"; exit 2; }
[ -f "$DATA" ] || make --no-print-directory "$DATA" > /dev/null || exit 1
rm -rf "$OUT"; mkdir -p "$OUT/peak" || exit 1
cat > "$OUT/peak_rss.c" <<'EOF'
/* Preloaded into train by bench/cp_memory.sh: at exit, this process's pid,
 * its parent's and its peak resident set (VmHWM, kB) into $CP_MEMORY_DIR/<pid>. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
__attribute__((destructor)) static void peak_rss_report(void) {
    const char *dir = getenv("CP_MEMORY_DIR");
    char line[256], path[4096];
    long kb = -1;
    FILE *f = fopen("/proc/self/status", "r");
    if (!dir || !f) return;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kb = strtol(line + 6, NULL, 10);
    fclose(f);
    snprintf(path, sizeof path, "%s/%d", dir, (int)getpid());
    if ((f = fopen(path, "w"))) { fprintf(f, "%d %d %ld\n", (int)getpid(), (int)getppid(), kb); fclose(f); }
}
EOF
${CC:-cc} -O2 -shared -fPIC -o "$OUT/peak_rss.so" "$OUT/peak_rss.c" || exit 1
C=768 NH=12 B=1
MODEL="--device cpu --data $DATA --dim $C --heads $NH --layers $LAYERS --seq $SEQ --max-seq $SEQ --batch $B --steps 1${VOCAB:+ --vocab $VOCAB}"
host=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
echo "bench-cp: ./train $MODEL --ranks N --cp N, N = 1 2 4"
echo "machine: $host, $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.1f GB", $2 / 1e6}' /proc/meminfo)"
for N in 1 2 4; do
    mkdir -p "$OUT/peak/$N"
    start=$(date +%s)
    if ! CP_MEMORY_DIR="$PWD/$OUT/peak/$N" LD_PRELOAD="$PWD/$OUT/peak_rss.so" \
         ./train $MODEL --ranks $N --cp $N > "$OUT/train_$N.log" 2>&1; then
        echo "bench-cp: cp $N failed:"; tail -n 5 "$OUT/train_$N.log"; exit 1
    fi
    echo "cp $N: trained in $(( $(date +%s) - start )) s ($(grep -m1 '^step 1' "$OUT/train_$N.log" | sed 's/.*| loss \([0-9.]*\).*/loss \1/'))"
    ./train $MODEL --ranks $N --cp $N --plan-layout > "$OUT/plan_$N.log" 2>&1
    # rank, activations MB
    sed -n 's/^.*memory rank \([0-9]*\): .*activations \([0-9.e+]*\) MB.*$/\1 \2/p' "$OUT/train_$N.log" | sort -n > "$OUT/acts_$N"
    # the ranks' peaks: processes whose parent also reported (the supervisor), in pid order; one process: itself
    cat "$OUT"/peak/$N/* > "$OUT/procs_$N"
    awk 'NR == FNR { pid[$1] = 1; next } ($2 in pid) { print $1, $3 }' "$OUT/procs_$N" "$OUT/procs_$N" | sort -n > "$OUT/ranks_$N"
    [ -s "$OUT/ranks_$N" ] || awk '{ print $1, $3 }' "$OUT/procs_$N" > "$OUT/ranks_$N"
    awk '{ print NR - 1, $2 }' "$OUT/ranks_$N" > "$OUT/rss_$N"
    sed -n 's/^plan rank 0: .*activations \([0-9.e+]*\) MB.*$/\1/p' "$OUT/plan_$N.log" | head -n 1 > "$OUT/planacts_$N"
done
echo
awk -v C=$C -v NH=$NH -v B=$B -v T=$SEQ -v out="$OUT" 'BEGIN {
    printf "| cp | rank | activations counted (MB) | planner activations (MB) | + scratch counted (MB) | peak RSS (MB) | RSS saved vs cp 1 (MB) | counted saved vs cp 1 (MB) | ratio | activations saved (MB) |\n"
    printf "|---|---|---|---|---|---|---|---|---|---|\n"
    for (N = 1; N <= 4; N *= 2) {
        Tl = T / N
        scratch = 15 * C * B * Tl * 4                                 # gpt.c scratch_rows
        if (N == 1) scratch += B * NH * T * T * 4                     # ops.c: the probabilities gradient
        else scratch += (4 * B * Tl * 2 * C + B * NH * Tl + 2 * Tl * C) * 4   # cp.c: the ring, the positions
        plan = "?"
        f = out "/planacts_" N; if ((getline p < f) > 0) plan = p; close(f)
        f = out "/acts_" N
        while ((getline line < f) > 0) {
            split(line, a, " "); r = a[1]; acts[N, r] = a[2]; nr[N] = r + 1
        }
        close(f)
        f = out "/rss_" N
        while ((getline line < f) > 0) { split(line, a, " "); rss[N, a[1]] = a[2] }
        close(f)
        for (r = 0; r < nr[N]; r++) {
            counted = acts[N, r] + scratch / 1e6
            rssmb = rss[N, r] * 1024 / 1e6   # kB of 1024 bytes to MB of 1e6
            if (N == 1) { base_c = counted; base_r = rssmb; base_a = acts[N, r] }
            dr = base_r - rssmb; dc = base_c - counted
            printf "| %d | %d | %.1f | %s | %.1f | %.1f | %s | %s | %s | %s |\n", N, r, acts[N, r], plan, counted, rssmb,
                   N == 1 ? "-" : sprintf("%.1f", dr), N == 1 ? "-" : sprintf("%.1f", dc),
                   N == 1 ? "-" : sprintf("%.3f", dr / dc), N == 1 ? "-" : sprintf("%.1f", base_a - acts[N, r])
        }
    }
}'
