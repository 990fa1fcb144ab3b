#!/bin/sh
# test/test_flash_mutants.sh: test_flash (under the CPU emulation) must catch
# each of two bugs planted in a copy of attention.cu's ring-step kernels
# (tc_flash_pair_*), one at a time:
#   - a wrong causal mask on one chunk pair: in the pair (r 1, s 0), the
#     keys of rank 0's first chunk (chunk 0, which both of rank 1's chunks
#     see whole) placed after every query, so masked away; the checks of
#     the "earlier keys s < r" kind must fail;
#   - the log-sum-exp merge without its rescale of the output so far
#     (acc e^(lse - lse') made acc): the ring merge's checks must fail.
# Each mutant is built as test_flash_emu is (emu_transform, the host
# compiler, test/emu's runtime); a mutant that no longer applies
# (attention.cu changed) is a failure too, so the test cannot go stale.
# Needs CUDA's headers ($CUDA_HOME, default /usr/local/cuda) and
# test/emu/emu_transform, emu_rt.o, emu_dev.o (make test/test_flash_emu).
cd "$(dirname "$0")/.." || exit 2
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
if [ ! -f "$CUDA_HOME/include/cuda_bf16.h" ] || [ ! -x test/emu/emu_transform ] || [ ! -f test/emu/emu_rt.o ] || [ ! -f test/emu/attention_sm90_emu.o ]; then
    echo "SKIP flash mutants: needs CUDA's headers and make test/test_flash_emu first"
    exit 0
fi
dir=test/out/flash_mutant
mkdir -p "$dir"
status=0
mutant() {   # mutant NAME OLD NEW WHAT: WHAT, a text every catching check's name holds
    python3 - "$2" "$3" "$dir/attention.cu" <<'PY' || { echo "FAIL flash mutant $1: the planted change no longer applies to attention.cu"; status=1; return; }
import sys
s = open("attention.cu").read()
old, new, out = sys.argv[1], sys.argv[2], sys.argv[3]
if s.count(old) != 1: sys.exit(1)
open(out, "w").write(s.replace(old, new))
PY
    if ! { test/emu/emu_transform "$dir/attention.cu" attention.cu "$dir/attention_emu.cpp" &&
           ${CXX:-g++} -O2 -std=c++17 -fno-strict-aliasing -Itest/emu -I. -I"$CUDA_HOME/include" -w \
               -c "$dir/attention_emu.cpp" -o "$dir/attention_emu.o" &&
           ${CC:-cc} -O2 -fopenmp -std=gnu11 -DUSE_CUDA -DFLASH_EMU -I. -I"$CUDA_HOME/include" -o "$dir/test_flash" \
               test/test_flash.c "$dir/attention_emu.o" test/emu/attention_sm90_emu.o test/emu/emu_rt.o test/emu/emu_dev.o \
               -lm -lstdc++; } \
         > "$dir/build.log" 2>&1; then
        echo "FAIL flash mutant $1: did not build: $(tail -n 1 "$dir/build.log")"; status=1; return
    fi
    "./$dir/test_flash" > "$dir/run.log" 2>&1
    rc=$?
    n=$(grep -c '^FAIL ' "$dir/run.log")
    if ! grep '^FAIL ' "$dir/run.log" | grep -q "$4"; then
        echo "FAIL flash mutant $1: no check of the $4 caught it (exit $rc, $n other failing checks)"; status=1
    elif [ "$rc" -ne 0 ]; then
        echo "PASS flash mutant $1: caught by $n check(s), first: $(grep -m1 '^FAIL ' "$dir/run.log" | cut -c6- | cut -d'(' -f1)"
    else
        echo "FAIL flash mutant $1: test_flash passed with the bug planted (exit $rc)"; status=1
    fi
}
mutant "wrong causal mask on one chunk pair" \
    '__device__ __forceinline__ int fa_kpos(const FaPair &p, int j, int T) { return fa_pos(p, p.rk, j, T); }' \
    '__device__ __forceinline__ int fa_kpos(const FaPair &p, int j, int T) { return p.rq == 1 && p.rk == 0 && j < p.tc && j < T ? FA_FAR - 1 : fa_pos(p, p.rk, j, T); }' \
    'earlier keys s < r'
mutant "log-sum-exp merge without the rescale" \
    '*p = make_float2(a.x * keep + o[dt][2 * r] * take, a.y * keep + o[dt][2 * r + 1] * take);' \
    '*p = make_float2(a.x + o[dt][2 * r] * take, a.y + o[dt][2 * r + 1] * take);' \
    'ring merge'
exit $status
