#!/bin/sh
# test/test_waits_emu.sh: which waits the compute stream has, per operation
# (now) and per stream (before), seen by the emulated runtime
# (EMU_TRACE_WAITS=1 prints every cudaStreamWaitEvent as it is issued, with
# the op it waits for and how many later ops of that stream it leaves in
# flight). Rank 0's compute stream (stream 1), one training step:
#  - ZeRO-3 (dp 2): each unit's compute waits for its own gather and leaves
#    the prefetch of the next unit in flight; before, it waited for the
#    whole communication stream, prefetch included;
#  - dp 2 x tp 2 with gradient buckets: a tensor-parallel all-reduce is
#    waited for alone, the dp group's buckets stay in flight under backward;
#    before, every tp collective waited for every group.
# "Before" is the same source with the per-operation wait put back to
# comm_wait (patched into a scratch copy, as test_races_emu.sh does). The
# checks: more of ZeRO-3's waits leave the next gather in flight, and fewer
# of tp's waits are for another group's operations (the buckets).
cd "$(dirname "$0")/.." || exit 2
SCRATCH=waits
. test/emu/scratch.sh

# trace LOG FLAGS...: one step with the waits traced, rank 0's compute stream: $nwait waits,
# $ahead of them on an all-gather leaving the next gather in flight, $other of them on an
# operation of another communicator than the first one waited for (the tp group's, in tp runs)
trace() {
    log=$1
    shift
    (cd "$S" && EMU_GPUS=8 EMU_TRACE_WAITS=1 timeout 60 ./test/train_nccl_emu $MODEL --steps 1 "$@") > "$S/$log.log" 2>&1
    rc=$?
    grep '^emu: wait: stream 1 waits' "$S/$log.log" > "$S/$log.waits"
    nwait=$(wc -l < "$S/$log.waits")
    ahead=$(grep -c 'through ncclAllGather.*leaving [1-9]' "$S/$log.waits")
    first=$(sed -n '1s/.* on comm \([0-9]*\) #.*/\1/p' "$S/$log.waits")
    other=$(grep -vc " on comm $first #" "$S/$log.waits")
}

# compare NAME METRIC FILE OLD NEW FLAGS...: now against the source with OLD -> NEW (the per-stream
# wait of before); METRIC ahead must grow, METRIC other must shrink
compare() {
    name=$1 metric=$2 file=$3 old=$4 new=$5
    shift 5
    trace now "$@"
    if [ $rc -ne 0 ]; then echo "FAIL waits: $name: the run failed (exit $rc)"; fail=$((fail + 1)); return; fi
    w1=$nwait a1=$ahead o1=$other
    cp "$S/$file" "$S/$file.orig"
    if ! patch_in "$file" "$old" "$new" || ! rebuild; then
        echo "FAIL waits: $name: could not patch $file"; fail=$((fail + 1)); return
    fi
    trace before "$@"
    w0=$nwait a0=$ahead o0=$other
    mv "$S/$file.orig" "$S/$file"
    touch "$S/$file"
    rebuild
    if [ "$metric" = ahead ]; then
        say="$a1 of $w1 waits leave the next gather in flight; before (a wait for the whole stream): $a0 of $w0"
        ok=$( [ $rc -eq 0 ] && [ "$a1" -gt "$a0" ] && echo 1)
    else
        say="$o1 of $w1 waits are for another group than tp's; before (a wait for every group): $o0 of $w0"
        ok=$( [ $rc -eq 0 ] && [ "$o1" -lt "$o0" ] && echo 1)
    fi
    if [ -n "$ok" ]; then
        echo "PASS waits: $name: $say"
        pass=$((pass + 1))
    else
        echo "FAIL waits: $name: $say (exit $rc)"
        fail=$((fail + 1))
    fi
}

compare "ZeRO-3, dp 2: a unit's compute waits for its own gather" ahead zero.c \
    '    comm_op_wait(op, z->dev);  /* u'"'"'s gather, not the prefetch queued behind it */' \
    '    comm_wait(z->g->comm, z->dev);' \
    --ranks 2 --batch 4 --zero 3
compare "dp 2 x tp 2, buckets: a tp all-reduce is waited for alone" other tp.c \
    'comm_op_wait(comm_all_reduce(g->g, g->dev, buf, n, comm_type(t), COMM_SUM), g->dev);' \
    'comm_all_reduce(g->g, g->dev, buf, n, comm_type(t), COMM_SUM); comm_wait(g->g->comm, g->dev);' \
    --ranks 4 --dp 2 --tp 2 --batch 2 --bucket-mb 0.01
echo "waits: $pass passed, $fail failed"
rm -rf "$S"
[ $fail -eq 0 ]
