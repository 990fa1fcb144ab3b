#!/bin/sh
# test/test_races_emu.sh: deliberate bugs in the multi-GPU path, each of which
# the emulation (asynchronous streams, the race detector, the emulated NCCL)
# must catch. In a scratch copy of the sources (test/out/races.XXXX; never the
# main tree) each bug is patched in, test/train_nccl_emu rebuilt (one object
# and the link: the emulated kernels come from the main tree's build) and a
# small layout run over the emulated NCCL in the stream timing that exposes
# the bug. A bug is caught when the run stops with the emulation's message
# (a race, a mismatch, a deadlock) or when its losses differ from the run
# without the bug; the line says which. Races are also run with the detector
# off (EMU_RACECHECK=0), to show what a GPU would have done with the bug:
# different numbers, silently, or nothing in this timing.
#
# The bugs: a bucket's all-reduce without its wait for the compute stream;
# the parameter server's add without its wait for the receive (the race the
# issue found by reading); ZeRO-3's prefetched gather used without its
# wait; offload's copy up without the wait that orders it before the
# parameters' all-gather; two ranks issuing two communicators' collectives in
# opposite orders; a pipeline's send/recv pair moved out of its group; a
# collective with a mismatched count; sequence parallelism's reduce-scatter
# with its output equal to its input (not NCCL's in-place form, undefined
# for tp ranks above 0: how the code was before the emulation found it; the
# row linear now writes its partial sums to the scratch, out of place).
cd "$(dirname "$0")/.." || exit 2
SCRATCH=races
. test/emu/scratch.sh

# bug ID NAME FILE OLD NEW TIMING EXPECT FLAGS...: EXPECT is race (also run with the detector off) or nccl
bug() {
    id=$1 name=$2 file=$3 old=$4 new=$5 timing=$6 expect=$7
    shift 7
    run "$id.ref" "$timing" "$@"
    ref=$(losses "$S/$id.ref.log")
    if [ $rc -ne 0 ] || [ -z "$ref" ]; then
        echo "FAIL $name: the run without the bug failed (exit $rc): $(grep -m1 -i error "$S/$id.ref.log")"
        fail=$((fail + 1)); return
    fi
    cp "$S/$file" "$S/$file.orig"
    if ! patch_in "$file" "$old" "$new" || ! rebuild; then
        echo "FAIL $name: could not patch $file or rebuild: $(grep -m1 error "$S/build.log")"
        fail=$((fail + 1)); mv "$S/$file.orig" "$S/$file"; return
    fi
    run "$id" "$timing" "$@"
    got=$(losses "$S/$id.log")
    said=$(grep -m1 -E 'emu: |emulated NCCL: rank [0-9]+: ' "$S/$id.log" | cut -c1-230)
    how=""
    [ $rc -ne 0 ] && [ -n "$said" ] && how="stopped (exit $rc): $said"
    [ -z "$how" ] && [ "$got" != "$ref" ] && how="losses changed: \"$got\" instead of \"$ref\""
    quiet=""
    if [ "$expect" = race ]; then
        EMU_RACECHECK=0 run "$id.off" "$timing" "$@"
        q=$(losses "$S/$id.off.log")
        quiet=$( [ "$q" != "$ref" ] && echo "; detector off: losses \"$q\" instead of \"$ref\"" ||
                 echo "; detector off: the same losses in this timing")
    fi
    if [ -n "$how" ]; then
        echo "PASS $name ($timing): caught: $how$quiet"
        pass=$((pass + 1))
    else
        echo "FAIL $name ($timing): not caught (exit $rc, losses \"$got\", the same as without the bug)$quiet"
        fail=$((fail + 1))
    fi
    mv "$S/$file.orig" "$S/$file"
    touch "$S/$file"
    rebuild   # the next bug's run without its bug must not have this one
}

bug bucket "bucket all-reduce without its wait" comm_nccl.c \
    '    after_compute(c, q, d);
    if (on_gpu(d)) {
        inplace_call' \
    '    if (on_gpu(d)) {
        inplace_call' \
    first-late race --ranks 2 --batch 4 --bucket-mb 0.02

bug ps "parameter server adds before its receive" dp.c \
    'comm_op_wait(comm_recv(dp->g, dp->dev, dp->stage, n, COMM_F32, k), dp->dev);' \
    'comm_recv(dp->g, dp->dev, dp->stage, n, COMM_F32, k);' \
    rest-late race --ranks 2 --batch 4 --dp-mode ps

bug zero3 "ZeRO-3 gather used without its wait" zero.c \
    '    comm_op_wait(op, z->dev);  /* u'"'"'s gather, not the prefetch queued behind it */' \
    '' \
    rest-late race --ranks 2 --batch 2 --micro-batches 2 --zero 3

bug offload "offload's copy up not waited for by the all-gather" comm_nccl.c \
    '    char *base = scratch_of(c, q, a + p + (host ? n * es : 0) + 1);
    after_compute(c, q, d);' \
    '    char *base = scratch_of(c, q, a + p + (host ? n * es : 0) + 1);
    if (host) after_compute(c, q, d);' \
    first-late race --ranks 2 --batch 4 --zero 1 --offload

bug orders "two communicators in opposite orders" dp.c \
    '    if (dp->pp) comm_op_wait(comm_all_reduce(dp->pp, d, x, n, COMM_I32, op), d);' \
    '    if (dp->pp) {   /* the first stage sums over the world first, the last stage last */
        float z = 0;
        if (dp->m->has_embed) comm_all_reduce(&dp->comm->world, NULL, &z, 1, COMM_F32, COMM_SUM);
        comm_op_wait(comm_all_reduce(dp->pp, d, x, n, COMM_I32, op), d);
        if (!dp->m->has_embed) comm_all_reduce(&dp->comm->world, NULL, &z, 1, COMM_F32, COMM_SUM);
    }' \
    eager nccl --ranks 2 --pp 2 --batch 2 --micro-batches 2

bug p2p "a pipeline send/recv pair out of its group" pp.c \
    '    comm_p2p_begin(s->g->comm);
    /* activations and their gradients travel in the dev'"'"'s dtype */
    CommDtype t = s->dev->dtype == DT_BF16 ? COMM_BF16 : COMM_F32;
    for (int k = 0; k < nsend; k++) comm_send(s->g, s->dev, sends[k].buf, n, t, sends[k].peer);
    if (recv_buf) comm_recv(s->g, s->dev, recv_buf, n, t, recv_peer);
    comm_op_wait(comm_p2p_end(s->g->comm), s->dev);' \
    '    CommDtype t = s->dev->dtype == DT_BF16 ? COMM_BF16 : COMM_F32;
    for (int k = 0; k < nsend; k++) comm_send(s->g, s->dev, sends[k].buf, n, t, sends[k].peer);
    if (recv_buf) comm_recv(s->g, s->dev, recv_buf, n, t, recv_peer);
    comm_wait(s->g->comm, s->dev);' \
    eager nccl --ranks 2 --pp 2 --batch 1 --micro-batches 4

bug count "a collective with a mismatched count" tp.c \
    'comm_op_wait(comm_all_reduce(g->g, g->dev, buf, n, comm_type(t), COMM_SUM), g->dev);' \
    'comm_op_wait(comm_all_reduce(g->g, g->dev, buf, n - (size_t)g->g->index, comm_type(t), COMM_SUM), g->dev);' \
    eager nccl --ranks 2 --tp 2 --batch 4

bug inplace "sp's reduce-scatter with its output equal to its input" tp.c \
    'void *partial = sp_on(m) ? m->full : out;' \
    'void *partial = out;' \
    eager nccl --ranks 2 --tp 2 --sp --batch 4

echo "races: $pass passed, $fail failed"
rm -rf "$S"
[ $fail -eq 0 ]
