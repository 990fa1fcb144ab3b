#!/bin/sh
# bench/gemm_blockings.sh: our CPU GEMM's blocking (kc, mc, nc; gemm_kernel.h)
# tried side by side on this machine, each against OpenBLAS in the same run.
#
#   sh bench/gemm_blockings.sh "KC MC NC" ["KC MC NC" ...]
#
# For the kernel train picks here (TRAIN_GEMM=avx2 for the AVX2 one on an
# AVX-512 machine), each blocking in turn: gemm_<kernel>.c compiled again
# with -D<KERNEL>_KC=.. -D.._MC=.. -D.._NC=.. (the defaults are in that
# file), bench/bench_gemm relinked and run at GPT-2 124M's shapes (256 rows),
# ROUNDS times (default 2) with the blockings interleaved, so that a slow
# minute of a shared machine falls on all of them. A line a run (the step's
# ratio to OpenBLAS over a step's matmuls, our GFLOP/s, the worst shape),
# then a table: each blocking's ratios and rates, round by round. OpenBLAS's rate moves from run to run
# on a shared machine; our rate beside the ratio says which side moved.
# kc changes the order of each sum (a result's bits), mc and nc only speed.
# The default objects are rebuilt at the end. REPS (default 5), BLAS=path
# and OMP_NUM_THREADS as for make bench-cpu.
cd "$(dirname "$0")/.." || exit 2
[ $# -ge 1 ] || { echo "usage: sh bench/gemm_blockings.sh \"KC MC NC\" [\"KC MC NC\" ...]"; exit 2; }
ROUNDS=${ROUNDS:-2}
REPS=${REPS:-5}
list=""  # the blockings, comma-separated ("$@" is reused below)
for b in "$@"; do list="$list${list:+,}$b"; done
for b in "$@"; do
    set -- $b
    [ $# -eq 3 ] && [ "$1" -ge 1 ] 2>/dev/null && [ "$2" -ge 1 ] 2>/dev/null && [ "$3" -ge 1 ] 2>/dev/null ||
        { echo "gemm_blockings: '$b': want three counts, KC MC NC"; exit 2; }
done
make -s build bench/bench_gemm > /dev/null || exit 2
. bench/blas.sh
blas_find gemm_blockings || exit 2
kernel=$(./train --version | sed -n 's/^CPU GEMM: \([a-z0-9]*\) kernel.*/\1/p')
case "$kernel" in
    avx512) P=AVX512 ;;
    avx2) P=AVX2 ;;
    *) echo "gemm_blockings: the $kernel kernel has no blocking to try"; exit 2 ;;
esac
compile=$(make -s -n -W gemm_$kernel.c gemm_$kernel.o | grep "gemm_$kernel\.c")
[ -n "$compile" ] || { echo "gemm_blockings: cannot find gemm_$kernel.o's compile line"; exit 2; }
out=$(mktemp)
restore() { rm -f "$out" "$out.run" gemm_$kernel.o; make -s build bench/bench_gemm > /dev/null; }
trap 'restore' EXIT
trap 'exit 130' INT TERM
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
echo "gemm_blockings: the $kernel kernel, $OMP_NUM_THREADS threads, best of $REPS, $ROUNDS rounds; $(./train --version | grep '^CPU GEMM')"
one() {  # one KC MC NC ROUND: compile, link, measure, keep a line in $out and print it
    eval "$compile -D${P}_KC=$1 -D${P}_MC=$2 -D${P}_NC=$3" && make -s bench/bench_gemm > /dev/null || exit 1
    ./bench/bench_gemm --blas "$BLAS" --rows 256 --reps "$REPS" --rounds 1 > "$out.run" || { cat "$out.run"; exit 1; }
    # the step's ratio, our rate, the worst shape's ratio and name
    awk -v b="$1 $2 $3" -v r="$4" '$1 == "step" { step = $4; ours = $2 }
        NF == 8 && $8 + 0 > 0 && (worst == "" || $8 < worst) { worst = $8; shape = $1 " " $2 }
        END { print b "|" r "|" step "|" ours "|" worst " " shape }' "$out.run" >> "$out"
    tail -n 1 "$out" | awk -F'|' '{ printf "  kc mc nc %s, round %s: step %s (ours %s GFLOP/s), worst %s\n", $1, $2, $3, $4, $5 }'
}
for r in $(seq "$ROUNDS"); do
    IFS=,
    for b in $list; do
        IFS=' '
        one $b "$r"
    done
    IFS=' '
done
echo "gemm_blockings: kc mc nc | the step's ratio to OpenBLAS, each round | our GFLOP/s, each round"
awk -F'|' '{ k = $1; if (!(k in seen)) { seen[k] = 1; order[++n] = k }
             ratio[k] = ratio[k] " " $3; ours[k] = ours[k] " " $4 }
     END { for (i = 1; i <= n; i++) printf "  %-16s |%s |%s\n", order[i], ratio[order[i]], ours[order[i]] }' "$out"
