#!/bin/sh
# test/test_fault.sh: a rank that dies takes its job down within 30 s with a
# line naming it; SIGINT on the launcher stops every rank; killing the
# launcher kills its ranks; nothing (process or /dev/shm segment) outlives a
# job. Jobs are `test/test_comm --soak`: collectives in a loop, each rank
# printing "rank r pid P" first. Prints PASS/FAIL lines (test/check.h) with
# the seconds measured. Run from the repository root (test/run.sh does).
cd "$(dirname "$0")/.." || exit 2
T=./test/test_comm
LIMIT=30
out=test/out/fault
mkdir -p "$out"
fails=0

pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; fails=$((fails + 1)); }
now() { t=$(date +%s.%N); case $t in *N) cut -d' ' -f1 /proc/uptime ;; *) echo "$t" ;; esac; }
secs() { echo "$1 $2" | awk '{ printf "%.2f", $2 - $1 }'; }
# A process that exists and is not a zombie (the shell reaps only at `wait`).
alive() { s=$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null) && [ "$s" != Z ] && [ "$s" != X ]; }
shm_ours() { for f in /dev/shm/train-*; do [ -e "$f" ] && echo "$f"; done; }   # comm.c's names

# rank_pid LOG R: the pid rank R printed ("rank R pid P", maybe "[rank R] " first)
rank_pid() { sed -n "s/^\(\[rank $2\] \)\{0,1\}rank $2 pid \([0-9][0-9]*\)\$/\2/p" "$1" | head -n 1; }

# until_clock SECS CMD...: runs CMD every 0.1 s until it succeeds (0) or SECS seconds have
# passed by the clock (1). A deadline for a failure, not a race a loaded machine can lose;
# counted by the clock, not by iterations, so a sleep that returns early cannot cut it short.
until_clock() {
    lim=$1; shift
    t0=$(now)
    while :; do
        "$@" && return 0
        [ "$(echo "$(now) $t0 $lim" | awk '{ print ($1 - $2 > $3) }')" = 1 ] && return 1
        sleep 0.1
    done
}
# has_pids LOG N: N ranks have printed their pid
has_pids() { n=$(grep -c ' pid [0-9][0-9]*$' "$1" 2>/dev/null); [ "${n:-0}" -ge "$2" ]; }
# wait_pids LOG N: until N ranks have printed their pid (120 s at most)
wait_pids() { until_clock 120 has_pids "$1" "$2"; }

# wait_gone LIMIT PID...: until every PID is gone; 1 if some outlived LIMIT s
wait_gone() {
    lim=$1; shift
    t0=$(now)
    while :; do
        left=""
        for p in "$@"; do alive "$p" && left="$left $p"; done
        [ -z "$left" ] && return 0
        [ "$(echo "$(now) $t0 $lim" | awk '{ print ($1 - $2 > $3) }')" = 1 ] && return 1
        sleep 0.05
    done
}

# all_pids LOG N: the pids of ranks 0..N-1
all_pids() { r=0; ps=""; while [ "$r" -lt "$2" ]; do ps="$ps $(rank_pid "$1" "$r")"; r=$((r + 1)); done; echo $ps; }

cleanup() { for p in "$@"; do alive "$p" && kill -9 "$p" 2>/dev/null; done; }

if [ ! -x "$T" ]; then echo "FAIL fault_setup: $T is not built"; exit 1; fi
shm_before=$(shm_ours)

# --- 1. kill -9 one rank of 4 -------------------------------------------------------
log=$out/kill9.log
"$T" --soak 120 --ranks 4 > "$log" 2>&1 &
job=$!
if wait_pids "$log" 4; then
    pids=$(all_pids "$log" 4)
    victim=$(rank_pid "$log" 2)
    sleep 0.5
    t0=$(now)
    kill -9 "$victim"
    if wait_gone $LIMIT $job $pids; then
        wait $job; rc=$?
        took=$(secs "$t0" "$(now)")
        # occurrences, not lines: rank 0 writes straight to the terminal while the
        # others' lines come through the launcher, so two can share a line
        stops=$(grep -o 'rank [013] stops: rank 2 died (killed by signal 9)' "$log" | wc -l)
        if [ "$rc" -ne 0 ] && grep -q 'rank 2 died (killed by signal 9)' "$log" && [ "$stops" -eq 3 ]; then
            pass "fault_kill9: rank 2 killed -9, job exited $rc after ${took} s; ranks 0, 1, 3 each printed 'stops: rank 2 died (killed by signal 9)'; all 5 processes gone"
        else
            fail "fault_kill9: exit status $rc after ${took} s, $stops of 3 ranks named rank 2 (see $log)"
        fi
    else
        fail "fault_kill9: processes still running $LIMIT s after the kill:$left"
        cleanup $job $pids
    fi
else
    fail "fault_kill9: the 4 ranks did not start (see $log)"; cleanup $job
fi

# --- 2. a rank that exits non-zero by itself -------------------------------------------
log=$out/exit3.log
t0=$(now)
"$T" --soak 120 --ranks 4 --fail-rank 1 --fail-after 1 > "$log" 2>&1 &
job=$!
if wait_pids "$log" 4 && pids=$(all_pids "$log" 4) && wait_gone $((LIMIT + 2)) $job $pids; then
    wait $job; rc=$?
    took=$(secs "$t0" "$(now)")
    stops=$(grep -o 'rank [023] stops: rank 1 died (exit status 3)' "$log" | wc -l)
    if [ "$rc" -eq 3 ] && grep -q 'rank 1 died (exit status 3)' "$log" && [ "$stops" -eq 3 ]; then
        pass "fault_exit: rank 1 exited 3 after 1 s of work, job exited $rc at ${took} s from start; the 3 others named it"
    else
        fail "fault_exit: exit status $rc (want 3), $stops of 3 ranks named rank 1 (see $log)"
    fi
else
    fail "fault_exit: job did not end within $((LIMIT + 2)) s (see $log)"
    pids=$(all_pids "$log" 4); cleanup $job $pids
fi

# --- 3. SIGINT to the launcher stops every rank ----------------------------------------
log=$out/sigint.log
"$T" --soak 120 --ranks 4 > "$log" 2>&1 &
job=$!
if wait_pids "$log" 4; then
    pids=$(all_pids "$log" 4)
    sleep 0.3
    t0=$(now)
    kill -INT $job
    if wait_gone $LIMIT $job $pids; then
        wait $job; rc=$?
        took=$(secs "$t0" "$(now)")
        if [ "$rc" -eq 130 ] && grep -q 'interrupted by signal 2' "$log"; then
            pass "fault_sigint: SIGINT to the launcher, all 5 processes gone after ${took} s, exit status $rc"
        else
            fail "fault_sigint: exit status $rc (want 130) (see $log)"
        fi
    else
        fail "fault_sigint: processes still running $LIMIT s after SIGINT:$left"; cleanup $job $pids
    fi
else
    fail "fault_sigint: the 4 ranks did not start (see $log)"; cleanup $job
fi

# --- 4. the launcher killed: its ranks die with it -------------------------------------
log=$out/launcher.log
"$T" --soak 120 --ranks 4 > "$log" 2>&1 &
job=$!
if wait_pids "$log" 4; then
    pids=$(all_pids "$log" 4)
    t0=$(now)
    kill -9 $job
    if wait_gone 10 $pids; then
        wait $job
        pass "fault_launcher_killed: kill -9 of the launcher, its 4 ranks gone after $(secs "$t0" "$(now)") s"
    else
        fail "fault_launcher_killed: ranks outlived the launcher:$left"; cleanup $pids
    fi
else
    fail "fault_launcher_killed: the 4 ranks did not start (see $log)"; cleanup $job
fi

# --- 5. an external launcher (torchrun's variables), one host: runs, then leaves no segment -
port=$((20000 + $$ % 20000))
extpids=""
t0=$(now)
for r in 0 1 2; do
    TORCHELASTIC_RUN_ID=fault$$-$port RANK=$r WORLD_SIZE=3 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
        "$T" --soak 2 > "$out/env$r.log" 2>&1 &
    extpids="$extpids $!"
done
ok=1
for p in $extpids; do wait "$p" || ok=0; done
took=$(secs "$t0" "$(now)")
iters=$(sed -n 's/^soak: \([0-9]*\) iterations.*/\1/p' "$out/env0.log")
if [ "$ok" = 1 ] && [ -n "$iters" ] && [ "$(shm_ours)" = "$shm_before" ]; then
    pass "fault_env_clean: 3 ranks from RANK/WORLD_SIZE/MASTER_PORT ran $iters iterations in ${took} s, exited 0, /dev/shm clean"
else
    fail "fault_env_clean: statuses ok=$ok, iterations '$iters', /dev/shm: $(shm_ours) (see $out/env*.log)"
fi

# --- 6. the same, one rank killed: no supervisor, the others must notice by themselves --
port=$((port + 1))
extpids=""
for r in 0 1 2; do
    TORCHELASTIC_RUN_ID=fault$$-$port RANK=$r WORLD_SIZE=3 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
        "$T" --soak 120 > "$out/envkill$r.log" 2>&1 &
    extpids="$extpids $!"
done
set -- $extpids
victim=$2
started=1
for r in 0 1 2; do wait_pids "$out/envkill$r.log" 1 || started=0; done
if [ "$started" = 1 ]; then
    sleep 0.5
    t0=$(now)
    kill -9 "$victim"
    if wait_gone $LIMIT $1 $3; then
        took=$(secs "$t0" "$(now)")
        wait $1; rc0=$?
        wait $3; rc2=$?
        named=$(cat "$out/envkill0.log" "$out/envkill2.log" | grep -c 'rank 1 died')
        if [ "$rc0" -ne 0 ] && [ "$rc2" -ne 0 ] && [ "$named" -eq 2 ] && [ "$(shm_ours)" = "$shm_before" ]; then
            pass "fault_env_kill9: rank 1 killed -9 under an external launcher, ranks 0 and 2 exited $rc0, $rc2 after ${took} s naming it; /dev/shm clean"
        else
            fail "fault_env_kill9: statuses $rc0 $rc2, $named of 2 named rank 1, /dev/shm: $(shm_ours) (see $out/envkill*.log)"
        fi
    else
        fail "fault_env_kill9: ranks still running $LIMIT s after the kill:$left"; cleanup $extpids
    fi
else
    fail "fault_env_kill9: the 3 ranks did not start (see $out/envkill*.log)"; cleanup $extpids
fi
wait 2>/dev/null

# --- 7. the trainer itself: kill -9 one rank of 4 in the middle of training --------------
log=$out/train_kill9.log
./train --ranks 4 --data test/fixtures/ref_tokens.bin --layers 2 --heads 2 --dim 16 --max-seq 16 \
    --vocab 61 --batch 1 --seq 8 --steps 1000000 --device cpu > "$log" 2>&1 &
job=$!
t0=$(now)
# the job's step 5 is an event to wait for: 120 s at most (on a loaded machine 4 ranks on 2
# cores took more than the 10 s this once allowed)
until_clock 120 grep -q '^step 5/' "$log"
ranks=$(pgrep -P "$job" | tr '\n' ' ')
victim=$(echo "$ranks" | awk '{ print $3 }')
if [ -z "$victim" ] || ! grep -q '^step 5/' "$log"; then
    # what the failure looked like: once (2026-11-28, under two busy loops) this line came
    # with an empty log, the script done in 5 s; the next one says more
    if alive "$job"; then st=running; else wait "$job"; st="gone (exit $?)"; fi
    fail "train kill -9: the job did not start training after $(secs "$t0" "$(now)") s: the job $st, its ranks [$ranks], $(wc -c < "$log") bytes of log (log: $log)"
    cleanup $job $ranks
else
    t0=$(now)
    kill -9 "$victim"
    if wait_gone "$LIMIT" $job $ranks; then
        wait "$job"; rc=$?
        took=$(secs "$t0" "$(now)")
        if [ "$rc" -ne 0 ] && grep -q 'rank 2 died (killed by signal 9)' "$log"; then
            pass "train kill -9 of rank 2 of 4 mid-training: job exit $rc after ${took}s, the others name it"
        else
            fail "train kill -9: exit $rc, no line naming rank 2 (log: $log)"
        fi
    else
        fail "train kill -9: processes outlived ${LIMIT}s"
        cleanup $job $ranks
    fi
fi

# --- nothing of ours is left in /dev/shm --------------------------------------------------
if [ "$(shm_ours)" = "$shm_before" ]; then
    pass "fault_shm_clean: no /dev/shm/train-* segment left by the 6 jobs"
else
    fail "fault_shm_clean: left behind: $(shm_ours)"
fi
[ "$fails" -eq 0 ]
