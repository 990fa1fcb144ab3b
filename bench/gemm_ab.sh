#!/bin/sh
# bench/gemm_ab.sh: our CPU GEMM against another build of itself, in one
# process, calls in turn (bench/gemm_ab.c says why: on a shared VM it is the
# one comparison that sees a few percent).
#
#   sh bench/gemm_ab.sh REV [PAIRS]   A: gemm.c, gemm.h, gemm_kernel.h and the
#                                     kernels' files at git revision REV;
#                                     B: the working tree's
#   B_FLAGS='-DAVX2_MC=264' sh bench/gemm_ab.sh HEAD
#                                     B built with more flags (a blocking, say)
#   sh bench/gemm_ab.sh --splits [PAIRS]
#                                     the working tree's gemm with C split by rows (A)
#                                     and by columns (B); needs no git history
#   A_FLAGS='-DGEMM_A_WHOLE_BYTES=0' sh bench/gemm_ab.sh --flags [PAIRS]
#                                     the working tree twice, A built with A_FLAGS and B
#                                     with B_FLAGS; needs no git history either
#
# PAIRS (default 10) calls of each a product; ROWS (default 256) and
# OMP_NUM_THREADS as for bench_gemm; CC and ARCH (default -march=native) as
# for make. Builds in a temporary folder: the project's objects stay as they
# are.
cd "$(dirname "$0")/.." || exit 2
[ $# -ge 1 ] && [ $# -le 2 ] || { echo "usage: sh bench/gemm_ab.sh REV|--splits|--flags [PAIRS]"; exit 2; }
rev=$1
pairs=${2:-10}
[ "$rev" = --splits ] || [ "$rev" = --flags ] || git rev-parse --verify -q "$rev^{commit}" > /dev/null ||
    { echo "gemm_ab: '$rev' is not a revision here"; exit 2; }
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM
mkdir "$tmp/a" "$tmp/b"
for f in gemm.c gemm.h gemm_kernel.h gemm_avx2.c gemm_avx512.c; do
    if [ "$rev" = --splits ] || [ "$rev" = --flags ]; then cp "$f" "$tmp/a/$f" || exit 2
    else git show "$rev:$f" > "$tmp/a/$f" 2> /dev/null || { echo "gemm_ab: $rev has no $f"; exit 2; }
    fi
    cp "$f" "$tmp/b/$f" || exit 2
done
CC=${CC:-gcc}
CFLAGS="-O3 ${ARCH--march=native} -fopenmp"
# every name gemm.c and the kernels' files export, given a _b in B
RENAME="-Dgemm=gemm_b -Dgemm_split=gemm_b_split -Dgemm_reference=gemm_b_reference
 -Dgemm_kernel_name=gemm_b_kernel_name -Dgemm_cpu_describe=gemm_b_cpu_describe
 -Dgemm_avx2_kernel=gemm_b_avx2_kernel -Dgemm_avx2_pack_t=gemm_b_avx2_pack_t
 -Dgemm_avx512_kernel=gemm_b_avx512_kernel"
build() {  # build DIR FLAGS...: DIR's gemm objects, each kernel with its ISA flags (as the Makefile)
    d=$1
    shift
    $CC $CFLAGS "$@" -c "$d/gemm.c" -o "$d/gemm.o" &&
        $CC $CFLAGS -mavx2 -mfma -mno-avx512f "$@" -c "$d/gemm_avx2.c" -o "$d/gemm_avx2.o" &&
        $CC $CFLAGS -mavx512f -mavx2 -mfma "$@" -c "$d/gemm_avx512.c" -o "$d/gemm_avx512.o"
}
# shellcheck disable=SC2086 # RENAME, A_FLAGS and B_FLAGS are lists of flags
build "$tmp/a" ${A_FLAGS:-} && build "$tmp/b" $RENAME ${B_FLAGS:-} &&
    $CC $CFLAGS -I"$tmp/b" bench/gemm_ab.c "$tmp"/a/*.o "$tmp"/b/*.o -o "$tmp/gemm_ab" || exit 1
if [ "$rev" = --splits ]; then
    echo "gemm_ab: the working tree${B_FLAGS:+ with $B_FLAGS}, C split by rows (A) and by columns (B)"
    "$tmp/gemm_ab" --pairs "$pairs" --rows "${ROWS:-256}" --splits
elif [ "$rev" = --flags ]; then
    echo "gemm_ab: A is the working tree with '${A_FLAGS:-}', B with '${B_FLAGS:-}'"
    "$tmp/gemm_ab" --pairs "$pairs" --rows "${ROWS:-256}"
else
    echo "gemm_ab: A is $rev ($(git rev-parse --short "$rev")), B the working tree${B_FLAGS:+ with $B_FLAGS}"
    "$tmp/gemm_ab" --pairs "$pairs" --rows "${ROWS:-256}"
fi
