#!/bin/sh
# test/test_gemm_mutants.sh: matmul.cu's ping-pong wgmma kernel (TC_WGMMA)
# and its cluster form (TC_WGMMA_CLUSTER) under the CPU emulation must be
# caught with each of twenty-eight bugs planted in a copy of it, one a copy
# (the copies built and run one a core):
#   - in the kernel: a consumer warpgroup that does not count the other's
#     k-blocks into its position in the stage ring (it then waits on, reads
#     and frees the other's stages);
#   - in the kernel: the second m64 half of the tile stored from the first
#     half's accumulators (rows 64-127 of every tile wrong);
#   - in the use of the named barriers: the waiting warpgroup's bar.sync with
#     count 128 while the signalling one's bar.arrive says 256 (the PTX ISA
#     leaves mismatched counts undefined; on hardware the waiter can go
#     through on its own 128 threads, the ordering silently lost, every
#     value still right, so only the emulation's check can show it); a
#     warpgroup arriving at its own barrier instead of the other's (a hang
#     on hardware); an arrival after the block's last item, which nobody
#     waits for (left open when the block ends);
#   - in the cluster kernel: the remote release dropped (each consumer warp
#     arrives twice at its own CTA's empty barrier instead of once there and
#     once at the peer's, so a CTA frees a stage on its own consumers alone
#     and its producer's multicast of B overwrites the peer's copy of the
#     stage while the peer still reads it: NaN under late copies, a FAIL);
#     the barrier.cluster before exit removed (a CTA may exit while its peer
#     still multicasts into it or arrives on its barriers: the emulation's
#     exit check stops it); the remote arrival sent to a CTA rank outside
#     the cluster (mapa stops it); a grid that is not a multiple of the
#     cluster (cudaLaunchKernelEx returns cudaErrorInvalidValue, a GPU
#     refuses it too, and matmul.cu's check exits with "CUDA error");
#   - in the TMA-store epilogue (the forward's bf16 D, written): the staging
#     buffer written again before cp.async.bulk.wait_group.read has retired
#     the stores that read it (under late copies the emulation reads the
#     buffer only at that wait, so rows of one half land with the other's
#     values); the store map's row pitch 16 bytes short, or its box 32 rows
#     instead of 64 (rows land in the wrong place or are never written, and
#     written outputs start as NaN); in the cluster kernel, each CTA storing
#     its peer's tile (so the cluster's TMA-store path is shown to run);
#   - in the tile order (bands of m-tiles): the last band, narrower where
#     the m-tiles are not a multiple of the band, decoded as a whole one
#     (tiles past M computed, tiles inside M never: test_gemm's "tile
#     order" checks, bands of 2 over 3 m-tiles);
#   - in the GELU-backward epilogue (fcproj's input gradient times gelu'
#     of fch, tc_gemm_gelu_back): the derivative applied to the unrounded
#     accumulator (the bits of the two passes lost: test_gemm's
#     "dinp+gelu'" checks compare bits); fch read from the next row; the
#     fused product sent through the TMA-store epilogue, which knows no
#     GELU; in the bias sums that epilogue takes for fc's bias gradient
#     (tc_gemm_gelu_back's dbias, mm_wg_bias_sums): the 8 row lanes of a
#     chunk added 7..0 (test_gemm's "bias sums" checks compare bits with
#     tc_bias_grad of the stored D), a tile's sums written to the next
#     chunk's row (the last chunk's row stays the NaN work starts with),
#     the named barrier before the re-read dropped (the emulation's
#     warp-greedy schedule runs warp 0 on into its column sums before
#     warps 1-3 have stored their rows, which are still the NaN the
#     output starts as); in the GELU-forward epilogue (fc's product and GELU of it,
#     tc_gemm_gelu): GELU computed from the unrounded pre-activation (test_gemm's
#     "fwd+gelu" compares bits); the TMA-store path taken (no GELU output:
#     it stays NaN);
#   - in stream-K (the float32 D's last wave shared out by k-blocks, a
#     fix-up kernel adding the shared tiles' parts in walker order): a
#     shared tile's last part dropped; its first part in work added twice;
#     the parts added last to first (the same bits every run, but not the
#     plan's order: test_gemm's stream-K checks compare the bits against
#     the walkers' parts computed apart and added in walker order); a
#     walker's k-blocks running one past its share (a block counted twice);
#     a segment that starts inside a tile sent to D (overwriting the part
#     that started it); the fix-up finding its tiles in the m-fastest order
#     while the walk went in bands of 2 (the last wave's tiles differ).
# A kernel bug must make test_gemm print a FAIL (or the emulation stop); a
# barrier bug must stop the run with the emulation's own message about a
# named barrier ("emu: bar.sync ...", "emu: bar.arrive ...", "... named
# barrier ..."), since the numbers stay right. Each mutant is test/test_gemm.c
# linked with the mutated matmul.cu through test/emu/emu_transform, run
# (only the part of test_gemm that watches the bug: TEST_GEMM_PARTS, the
# forced stream-K checks without the 20-second shape whose plan takes it) on
# an emulated sm_90a with one SM (one block walks every tile, so both
# warpgroups take turns), copies landing late; the cluster mutants with two
# SMs (one cluster of two CTAs walks every column of tiles; one SM cannot
# hold a cluster, and TC_WGMMA_CLUSTER refuses it). The unmutated source
# runs both ways first and must pass. A mutant that no longer applies (matmul.cu
# changed) is a failure too, so the test cannot go stale.
cd "$(dirname "$0")/.." || exit 2
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
if [ ! -x test/test_gemm_emu ] || [ ! -x test/emu/emu_transform ] || [ ! -f test/emu/emu_rt.o ] ||
   [ ! -f test/emu/emu_dev.o ]; then
    echo "SKIP gemm mutants (cpu emulation): test/test_gemm_emu not built (no \$CUDA_HOME/include/cuda_bf16.h where make ran)"
    exit 0
fi
D=test/out/gemm_mutant
rm -rf "$D"; mkdir -p "$D/ref"

# build SRC DIR: test_gemm over matmul.cu's copy SRC into DIR/test_gemm_mutant; 0 when it built
build() {
    test/emu/emu_transform "$1" matmul.cu "$2/matmul_emu.cpp" &&
    ${CXX:-g++} -O1 -std=c++17 -fno-strict-aliasing -DMM_EMU_SM90A -Itest/emu -I. -I"$CUDA_HOME/include" -w \
        -c "$2/matmul_emu.cpp" -o "$2/matmul_emu.o" &&
    ${CC:-gcc} -O1 -std=gnu11 -fopenmp -DUSE_CUDA -DGEMM_EMU -I. -I"$CUDA_HOME/include" -w -o "$2/test_gemm_mutant" \
        test/test_gemm.c "$2/matmul_emu.o" test/emu/emu_rt.o test/emu/emu_dev.o -lm -lstdc++
}
# run LOG SMS PARTS DIR: DIR's test on an emulated sm_90a with SMS SMs, only test_gemm's
# PARTS (TEST_GEMM_PARTS), one thread; $rc, $nfail
run() {
    TEST_GEMM_PARTS=$3 EMU_ARCH=sm_90a EMU_SMS=$2 EMU_CP=late EMU_ORDER=up OMP_NUM_THREADS=1 \
        timeout 600 "./$4/test_gemm_mutant" > "$1" 2>&1
    rc=$?
    nfail=$(grep -c '^FAIL ' "$1")
}

if ! build matmul.cu "$D/ref" > "$D/ref/build.log" 2>&1; then
    echo "FAIL gemm mutants: the unmutated matmul.cu did not build: $(tail -n 1 "$D/ref/build.log")"
    exit 1
fi
# the parts the mutants run with that many SMs (the cluster's: products), side by side
(run "$D/ref/1.log" 1 products,streamk,gelu,bias "$D/ref"; echo "$rc" > "$D/ref/1.rc") &
(run "$D/ref/2.log" 2 products "$D/ref"; echo "$rc" > "$D/ref/2.rc") &
wait
for sms in 1 2; do
    rc=$(cat "$D/ref/$sms.rc"); nfail=$(grep -c '^FAIL ' "$D/ref/$sms.log")
    if [ "$rc" -ne 0 ] || [ "$nfail" -ne 0 ]; then
        echo "FAIL gemm mutants: the unmutated matmul.cu failed with $sms SM(s) (exit $rc, $nfail FAIL lines): $(grep -m1 -E '^FAIL |emu: ' "$D/ref/$sms.log" | cut -c1-200)"
        exit 1
    fi
    echo "PASS gemm mutants: the unmutated kernels pass the same run with $sms SM(s) ($(grep -c '^PASS ' "$D/ref/$sms.log") checks)"
done

# mutant NAME OLD NEW EXPECT [SMS [PARTS]]: EXPECT is check (a FAIL line or a stop), emu (the emulation's
# message about a named barrier), cluster (its message about the cluster) or cuda (matmul.cu's "CUDA
# error" exit); PARTS the part of test_gemm that watches the bug (products unless given: each part
# runs 5-30 s under the emulation, all of them about 30, and a mutant's build and run are its cost).
# The mutants run one a core, each in its own directory $D/N, and print in this file's order at the end.
nproc=$(nproc 2>/dev/null || echo 2)
n=0
mutant() {
    n=$((n + 1))
    mkdir -p "$D/$n"
    (mutant_one "$D/$n" "$@" > "$D/$n/out" 2>&1) &
    [ $((n % nproc)) -eq 0 ] && wait
}
# mutant_one DIR NAME OLD NEW EXPECT [SMS [PARTS]]: plants, builds, runs and judges one mutant in DIR
mutant_one() {
    M=$1; shift
    python3 - "$2" "$3" "$M/matmul.cu" <<'PY' || { echo "FAIL gemm mutant $1: the planted change no longer applies to matmul.cu"; return; }
import sys
s = open("matmul.cu").read()
old, new = sys.argv[1], sys.argv[2]
if s.count(old) != 1: sys.exit(1)
open(sys.argv[3], "w").write(s.replace(old, new))
PY
    if ! build "$M/matmul.cu" "$M" > "$M/build.log" 2>&1; then
        echo "FAIL gemm mutant $1: did not build: $(tail -n 1 "$M/build.log")"; return
    fi
    run "$M/run.log" "${5:-1}" "${6:-products}" "$M"
    said=$(grep -m1 '^emu: ' "$M/run.log" | cut -c1-220)
    first=$(grep -m1 '^FAIL ' "$M/run.log" | cut -c6- | cut -c1-160)
    if [ "$4" = emu ]; then
        if [ "$rc" -ne 0 ] && echo "$said" | grep -q -e 'bar\.' -e 'named barrier'; then
            echo "PASS gemm mutant $1: stopped by the emulation (exit $rc): $said"
        else
            echo "FAIL gemm mutant $1: the emulation did not stop it at a named barrier (exit $rc, $nfail FAIL lines${said:+, said: $said})"
        fi
    elif [ "$4" = cluster ]; then
        if [ "$rc" -ne 0 ] && echo "$said" | grep -q -e 'cluster'; then
            echo "PASS gemm mutant $1: stopped by the emulation (exit $rc): $said"
        else
            echo "FAIL gemm mutant $1: the emulation did not stop it with a message about the cluster (exit $rc, $nfail FAIL lines${said:+, said: $said})"
        fi
    elif [ "$4" = cuda ]; then
        cuda=$(grep -m1 '^CUDA error: ' "$M/run.log" | cut -c1-220)
        if [ "$rc" -ne 0 ] && [ -n "$cuda" ]; then
            echo "PASS gemm mutant $1: the launch was refused (exit $rc): $cuda"
        else
            echo "FAIL gemm mutant $1: no launch error (exit $rc, $nfail FAIL lines${said:+, said: $said})"
        fi
    elif [ "$nfail" -gt 0 ]; then
        echo "PASS gemm mutant $1: caught by $nfail check(s), first: $first"
    elif [ "$rc" -ne 0 ] && [ -n "$said" ]; then
        echo "PASS gemm mutant $1: stopped by the emulation (exit $rc): $said"
    else
        echo "FAIL gemm mutant $1: test_gemm passed with the bug planted (exit $rc)"
    fi
}
mutant "ring position without the other warpgroup's k-blocks (kernel)" \
    'it += kb1 - kb0;
            continue;' \
    'continue;' check
mutant "rows 64-127 stored from rows 0-63's accumulators (kernel)" \
    'mm_wg_epilogue<4, 64, true>(d, ep, o.p,' \
    'mm_wg_epilogue<4, 0, true>(d, ep, o.p,' check
mutant "bar.sync count 128 against bar.arrive's 256 (named barriers)" \
    'sm90_bar_sync(PP_BAR_MATH + c, 256);' \
    'sm90_bar_sync(PP_BAR_MATH + c, 128);' emu
mutant "bar.arrive at its own barrier, not the other warpgroup's (named barriers)" \
    'sm90_bar_arrive(PP_BAR_MATH + (1 - c), 256);' \
    'sm90_bar_arrive(PP_BAR_MATH + c, 256);' emu
mutant "bar.arrive after the block's last item too, never waited for (named barriers)" \
    'if (mm_wg_walk<PP_BM, PP_BN, CL, !TS>(g.walk, b, W, j + 1, rank, next))' \
    'if (mm_wg_walk<PP_BM, PP_BN, CL, !TS>(g.walk, b, W, j, rank, next))' emu
mutant "remote release dropped: a CTA frees a stage on its own consumers alone (cluster kernel)" \
    'sm90_mbar_arrive_cluster(sm90_mapa(a, sm90_cluster_ctarank() ^ 1u));' \
    'sm90_mbar_arrive(a);' check 2
mutant "no barrier.cluster before exit (cluster kernel)" \
    '         * or arrive on its empty barriers */
        sm90_cluster_sync();' \
    '         * or arrive on its empty barriers */' cluster 2
mutant "remote arrival at a CTA rank outside the cluster (cluster kernel)" \
    'sm90_mapa(a, sm90_cluster_ctarank() ^ 1u)' \
    'sm90_mapa(a, sm90_cluster_ctarank() + 2u)' cluster 2
mutant "a grid that is not a multiple of the cluster (cluster launch)" \
    'const int grid = (sp->sk_len ? sp->sk_walkers : (int)(items < slots ? items : slots)) * cl;' \
    'const int grid = (sp->sk_len ? sp->sk_walkers : (int)(items < slots ? items : slots)) * cl + (cl > 1);' cuda 2
mutant "TMA store: the staging buffer written again before wait_group.read frees it (epilogue)" \
    'if (issuer) sm90_bulk_wait_read<0>();  /* the staging buffer is free again */' \
    '/* no wait: the staging buffer is written under the previous stores */' check
mutant "TMA store: the store map's row pitch 16 bytes short (host)" \
    'sm90_encode_2d(&td, D, N, M, 64, 64)' \
    'sm90_encode_2d(&td, D, N - 8, M, 64, 64)' check
mutant "TMA store: the store map's box 32 rows, not 64 (host)" \
    'sm90_encode_2d(&td, D, N, M, 64, 64)' \
    'sm90_encode_2d(&td, D, N, M, 64, 32)' check
mutant "TMA store: the cluster kernel's CTAs store each other's tile (epilogue)" \
    'mm_wg_epilogue_tma(d, g.stg, g.stg_s, g.tmD, g.bias, g.M, g.N, m0, n0,' \
    'mm_wg_epilogue_tma(d, g.stg, g.stg_s, g.tmD, g.bias, g.M, g.N, CL > 1 ? m0 ^ 128 : m0, n0,' check 2
mutant "tile order: a narrower last band decoded as a whole one (walk)" \
    'return make_int2(first + r % g, r / g);' \
    'return make_int2(first + r % group, r / group);' check
mutant "stream-K: a shared tile's last part dropped (fix-up)" \
    'for (int b = b0 + 1; b < b1; b++) s +=' \
    'for (int b = b0 + 1; b < b1 - 1; b++) s +=' check 1 streamk
mutant "stream-K: a shared tile's first part in work summed twice (fix-up)" \
    'for (int b = b0 + 1; b < b1; b++) s +=' \
    'for (int b = b0; b < b1; b++) s +=' check 1 streamk
mutant "stream-K: the parts summed last to first, not in walker order (fix-up)" \
    'float s = p[0];
        for (int b = b0 + 1; b < b1; b++) s += p[(size_t)(b - b0) * area];' \
    'float s = p[(size_t)(b1 - 1 - b0) * area];
        for (int b = b1 - 2; b >= b0; b--) s += p[(size_t)(b - b0) * area];' check 1 streamk
mutant "stream-K: a walker's k-blocks one past its share's end (walk)" \
    'kb1 = (int)min(g1 - t0, (long long)k.nk);' \
    'kb1 = (int)min(g1 - t0 + 1, (long long)k.nk);' check 1 streamk
mutant "stream-K: a segment that starts inside a tile sent to D, not work (walk)" \
    'part = kb0 == 0 ? 0 : b;' \
    'part = 0;' check 1 streamk
mutant "stream-K: the fix-up's tiles decoded m-fastest, not in the walk's bands (fix-up)" \
    'mm_wg_tile(sk_dp + (int)blockIdx.x, tiles_m, tiles, group)' \
    'mm_wg_tile(sk_dp + (int)blockIdx.x, tiles_m, tiles, tiles_m)' check 1 streamk
mutant "GELU backward: the derivative times the unrounded accumulator, not its bf16 (epilogue)" \
    'const float g = __bfloat162float(__float2bfloat16_rn(v + 0.0f));' \
    'const float g = v + 0.0f;' check 1 gelu
mutant "GELU backward: the derivative read from the next row of fch (ping-pong epilogue's reads)" \
    '(gpre ? gpre : (const bf16 *)D) + at)' \
    '(gpre ? gpre + (size_t)((row ^ 1) - row) * N : (const bf16 *)D) + at)' check 1 gelu
mutant "GELU backward: the fused product stored through TMA, whose epilogue has no GELU (host)" \
    'const bool ts = pp && !d_fp32 && !accumulate && !gpre && !gout &&' \
    'const bool ts = pp && !d_fp32 && !accumulate && !gout &&' check 1 gelu
mutant "bias sums: the 8 row lanes added 7..0, not in the split kernel's order (epilogue)" \
    'const int m = m0 + y + 8 * i;' \
    'const int m = m0 + (7 - y) + 8 * i;' check 1 gelu
mutant "bias sums: a tile's sums written to the next chunk's row of work (epilogue)" \
    'bgw[(size_t)(m0 / MM_BG_ROWS) * N + n] = tot;' \
    'bgw[(size_t)(m0 / MM_BG_ROWS + 1) * N + n] = tot;' check 1 gelu
mutant "bias sums: no named barrier between the tile's stores and their re-read (epilogue)" \
    '    sm90_bar_sync(bar, nt);
    const int n = n0 + t;' \
    '    const int n = n0 + t;' check 1 gelu
mutant "GELU forward: GELU of the unrounded pre-activation, not of the stored bf16 (epilogue)" \
    'for (int k = 0; k < 4; k++) g2[k] = mm_gelu_fwd2(w2[k]);' \
    'for (int k = 0; k < 4; k++) g2[k] = __floats2bfloat162_rn(gelu_f(x[2 * k]), gelu_f(x[2 * k + 1]));' check 1 gelu
mutant "GELU forward: the fused product stored through TMA, which writes no GELU output (host)" \
    'const bool ts = pp && !d_fp32 && !accumulate && !gpre && !gout &&' \
    'const bool ts = pp && !d_fp32 && !accumulate && !gpre &&' check 1 gelu
wait
status=0
i=0
while [ $i -lt $n ]; do
    i=$((i + 1))
    cat "$D/$i/out"
    grep -q '^FAIL ' "$D/$i/out" && status=1
done
exit $status
