#!/bin/sh
# test/test_flash_sm90_emu.sh: attention_sm90.cu's forward and backward
# (TMA, mbarriers, wgmma with P from registers) under the CPU emulation of an H100
# (EMU_ARCH=sm_90a): test_flash_emu's "flash sm90" block in the four
# settings (TMA and wgmma landing early or late, warps up or down), then
# seven bugs planted in a copy of attention_sm90.cu, one at a time, each of
# which the block must catch:
#   - O not rescaled when the running max grows (the online softmax's
#     correction dropped): wrong out from the second key tile on;
#   - the causal mask off by one on the diagonal tile (each query also sees
#     the next key);
#   - a pipeline misuse: the consumers release a V stage (v_empty) as soon
#     as its tile has landed, before the window whose wgmma reads it has
#     retired, so the producer refills V under a wgmma still in flight.
#     Run with EMU_CP=late, where a wgmma reads shared memory only when
#     wait_group retires it and a TMA box is NaN until it lands: O += P V
#     then reads the next tile's V (or NaN) and out is wrong (early, the
#     emulation runs each wgmma at issue and cannot see it);
#   - in the backward's dK/dV kernel, the causal mask without its diagonal
#     (each key's own query left out of dK and dV);
#   - in the same kernel, the registers of dS^T (wgmma's A operand)
#     rewritten before the wait_group that retires the wgmma reading them
#     (EMU_CP=late: the emulation compares them with what they held at
#     issue and stops; a GPU may read either);
#   - the ping-pong without its first arrival (consumer 1 never lets
#     consumer 0 take the first window): a hang on a GPU, a deadlock report
#     here;
#   - heads of 128 only: in the dK/dV kernel, dK += dS^T Q with Q's
#     descriptor stepping to the second 64-channel box by an own tile's
#     box (LBO 16384) instead of a ring tile's (8192), so dK's channels
#     64..127 are dS^T times dO's first 64 channels (at hs 64 the product
#     has one box and the LBO is never used).
# A mutant whose change no longer applies (attention_sm90.cu changed) is a
# failure too, so the test cannot go stale. Without the emulation's build
# (no CUDA headers) it prints one SKIP line.
cd "$(dirname "$0")/.." || exit 2
if [ ! -x test/test_flash_emu ]; then
    echo "SKIP flash sm90 (cpu emulation): test/test_flash_emu not built (no \$CUDA_HOME/include/cuda_bf16.h where make ran)"
    exit 0
fi
mkdir -p test/out/f3_mutant
status=0
for cp in early late; do
    for order in up down; do
        env OMP_NUM_THREADS=1 FLASH_ONLY=sm90 EMU_ARCH=sm_90a EMU_CP=$cp EMU_ORDER=$order ./test/test_flash_emu \
            > test/out/f3_mutant/clean.log 2>&1
        rc=$?
        cat test/out/f3_mutant/clean.log
        if [ $rc -ne 0 ] || ! grep -q '^PASS flash sm90 forward out' test/out/f3_mutant/clean.log; then
            grep -q '^FAIL ' test/out/f3_mutant/clean.log || echo "FAIL flash sm90 (EMU_CP=$cp EMU_ORDER=$order): exit $rc, no PASS line"
            status=1
        fi
    done
done
# mutant NAME EMU_CP OLD NEW [OLD2 NEW2]: with $expect set, a run the
# emulation stops must say so in its "emu:" line.
expect=
mutant() {
    name=$1; timing=$2; shift 2
    python3 - "$@" <<'PY' || { echo "FAIL flash sm90 mutant $name: the planted change no longer applies to attention_sm90.cu"; status=1; return; }
import sys
s = open("attention_sm90.cu").read()
for old, new in zip(sys.argv[1::2], sys.argv[2::2]):
    if s.count(old) != 1: sys.exit(1)
    s = s.replace(old, new)
open("test/out/f3_mutant/attention_sm90.cu", "w").write(s)
PY
    if ! make --no-print-directory -s test/out/test_flash_sm90_mutant F3_SRC=test/out/f3_mutant/attention_sm90.cu \
            > test/out/f3_mutant/build.log 2>&1; then
        echo "FAIL flash sm90 mutant $name: did not build: $(tail -n 1 test/out/f3_mutant/build.log)"; status=1; return
    fi
    env OMP_NUM_THREADS=1 FLASH_ONLY=sm90 EMU_ARCH=sm_90a EMU_CP=$timing EMU_ORDER=up ./test/out/test_flash_sm90_mutant \
        > test/out/f3_mutant/run.log 2>&1
    rc=$?
    n=$(grep -c '^FAIL ' test/out/f3_mutant/run.log)
    if [ "$n" -gt 0 ]; then
        echo "PASS flash sm90 mutant $name (EMU_CP=$timing): caught by $n check(s), first: $(grep -m1 '^FAIL ' test/out/f3_mutant/run.log | cut -c6- | cut -d: -f1)"
    elif [ $rc -ne 0 ] && [ -n "$expect" ] && ! grep -q "^emu:.*$expect" test/out/f3_mutant/run.log; then
        echo "FAIL flash sm90 mutant $name (EMU_CP=$timing): stopped (exit $rc) without the emulation's \"$expect\": $(grep -m1 '^emu:' test/out/f3_mutant/run.log)"; status=1
    elif [ $rc -ne 0 ]; then
        echo "PASS flash sm90 mutant $name (EMU_CP=$timing): the emulation stopped it (exit $rc): $(grep -m1 '^emu:' test/out/f3_mutant/run.log)"
    else
        echo "FAIL flash sm90 mutant $name (EMU_CP=$timing): the sm90 block passed with the bug planted"; status=1
    fi
}
mutant "no rescale of O when the running max grows" early \
'                o[4 * dt] *= alpha[0];
                o[4 * dt + 1] *= alpha[0];
                o[4 * dt + 2] *= alpha[1];
                o[4 * dt + 3] *= alpha[1];
' ''
mutant "causal mask off by one on the diagonal tile" early \
    'if (col > row) sc[4 * nt + e] = -INFINITY;' \
    'if (col > row + 1) sc[4 * nt + e] = -INFINITY;'
mutant "V stage released once landed, before the window that reads it" late \
'            if (has_pv) sm90_mbar_wait(sm90_smem_u32(&v_full[ps]), (uint32_t)((j - 1) / F3_STAGES) & 1u);
' \
'            if (has_pv) sm90_mbar_wait(sm90_smem_u32(&v_full[ps]), (uint32_t)((j - 1) / F3_STAGES) & 1u);
            if (has_pv && lane == 0) sm90_mbar_arrive(sm90_smem_u32(&v_empty[ps]));
' \
'                if (has_pv) sm90_mbar_arrive(sm90_smem_u32(&v_empty[ps]));
' ''
mutant "backward: the diagonal dropped from dK and dV (query > key for query >= key)" early \
    'const bool ok = in && q >= key_r + 8 * r;' \
    'const bool ok = in && q > key_r + 8 * r;'
expect='changed its A registers'
mutant "backward: dS^T's registers rewritten while the wgmma reading them is in flight" late \
    'sm90_wgmma_wait<0>();  /* Q, dO, pp and pd read: the stage may be refilled */' \
    'f3_pack64(pd, st);
            sm90_wgmma_wait<0>();'
expect='deadlock'
mutant "ping-pong without its first arrival (a hang on a GPU)" early \
    'if (c == 1) sm90_bar_arrive(F3_BAR + 0, 256);' ''
expect=
mutant "backward, hs 128: dK's second 64-channel half read through the wrong box stride" early \
    'sm90_wgmma_rs<HS>(dk, pd[kk], sm90_desc(sq + 2048u * kk, F3B_TILE64, 1024));' \
    'sm90_wgmma_rs<HS>(dk, pd[kk], sm90_desc(sq + 2048u * kk, F3B_TILE128, 1024));'
exit $status
