#!/bin/sh
# test/test_rendezvous.sh: rank 0 serves its job's ranks and no one else
# (rendezvous.c; the threat model: docs/hostile-input.md). Ranks of a 2-rank
# torchrun world are started here with the launcher's variables (as
# test/test_launch.sh does), each case on a port the kernel says is free:
#   - SHA-256 and HMAC against published vectors (test/test_rdzv);
#   - a client without the token (the old protocol, then a made-up HMAC)
#     gets nothing a rank needs, and the job completes;
#   - a rank of another job (another TORCHELASTIC_RUN_ID) is turned away at
#     once, and the job completes with the losses of --ranks 2;
#   - a rank of this job with another model stops itself and rank 0 within
#     seconds, exit 2 on both, one line each naming the item;
#   - two processes started as rank 1: one is refused (exit 2), the job
#     completes with the other;
#   - 20 clients that connect and say nothing delay the start by at most 2 s;
#   - rank 0 listens on the address MASTER_ADDR names (127.0.0.1), not on all;
#   - no /dev/shm segment of any of these jobs is left.
# Run from the repository root.
cd "$(dirname "$0")/.." || exit 2
. test/lib.sh
t_init rendezvous
T=./train
C=./test/test_rdzv
DATA=test/fixtures/ref_tokens.bin
SMALL="--layers 1 --heads 2 --dim 8 --max-seq 16 --batch 2 --seq 8 --steps 2 --device cpu --data $DATA"
LAUNCH_VARS="RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT TORCHELASTIC_USE_AGENT_STORE
  TORCHELASTIC_RUN_ID TRAIN_JOB_TOKEN SLURM_PROCID SLURM_NTASKS SLURM_LOCALID SLURM_NTASKS_PER_NODE SLURM_STEP_ID
  SLURM_STEPID SLURM_STEP_NUM_TASKS SLURM_JOB_ID OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_LOCAL_RANK
  OMPI_COMM_WORLD_LOCAL_SIZE OMPI_MCA_ess_base_jobid PMIX_NAMESPACE PMI_RANK PMI_SIZE MPI_LOCALRANKID MPI_LOCALNRANKS"
UNSET=$(for v in $LAUNCH_VARS; do printf -- '-u %s ' "$v"; done)
for b in $T $C; do [ -x "$b" ] || { echo "FAIL setup: $b is not built"; exit 1; }; done

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
losses() { sed -n 's/^step \([0-9]*\)\/[0-9]* | loss \([0-9.]*\).*/\2/p' "$1" | tr '\n' ' ' | sed 's/ $//'; }
# rank NAME R JOB PORT [FLAGS...]: rank R of a world of $WORLD (2) torchrun ranks of job JOB at
# 127.0.0.1:PORT, in the background (60 s at most); stdout NAME.out, stderr NAME.err; $! its pid
rank() {
    name=$1; r=$2; job=$3; p=$4; shift 4
    # shellcheck disable=SC2086
    env $UNSET RANK=$r WORLD_SIZE="${WORLD:-2}" LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$p \
        TORCHELASTIC_RUN_ID=$job timeout 60 "$T" $SMALL "$@" > "$OUT/$name.out" 2> "$OUT/$name.err" &
}
# shm_left PORT: the segments a job on PORT left in /dev/shm (rank 0's names: /train-<pid>-<port>)
shm_left() { ls /dev/shm 2>/dev/null | grep -- "^train-[0-9]*-$1\$" | tr '\n' ' '; }
# listening PORT: waits until something accepts connections on PORT (20 s at most)
listening() { $C --silent 127.0.0.1 "$1" 1 0 > /dev/null; }

# --- SHA-256 and HMAC-SHA256 against published vectors --------------------------------------
$C > "$OUT/vectors.log" 2>&1
while IFS= read -r line; do
    case $line in PASS\ *) ok "${line#PASS }" ;; FAIL\ *) bad "${line#FAIL }" ;; esac
done < "$OUT/vectors.log"

# --- the reference: --ranks 2 ----------------------------------------------------------------
# shellcheck disable=SC2086
env $UNSET timeout 60 "$T" $SMALL --ranks 2 > "$OUT/fork.out" 2>&1
ref=$(losses "$OUT/fork.out")
[ -n "$ref" ] || bad "reference: --ranks 2 printed no losses (see $OUT/fork.out)"

# same_losses FILE: its losses equal the reference's (relative 1e-5)
same_losses() {
    echo "$ref|$(losses "$1")" | awk -F'|' '{ n = split($1, a, " "); m = split($2, b, " "); ok = n == m && n > 0;
        for (i = 1; i <= n && ok; i++) { d = a[i] - b[i]; if (d < 0) d = -d; if (d > 1e-5 * a[i]) ok = 0 } exit !ok }'
}

# --- a client without the token gets nothing; the job completes -----------------------------
port=$($C --free-port)
rank s0 0 jobA "$port"; p0=$!
$C --stranger 127.0.0.1 "$port" 1 "$OUT/stranger.bin" > "$OUT/stranger.log" 2>&1
rank s1 1 jobA "$port"; p1=$!
wait $p0; rc0=$?
wait $p1; rc1=$?
got=$(cat "$OUT/stranger.log")
if [ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] && ! grep -aq 'train-' "$OUT/stranger.bin" && same_losses "$OUT/s0.out" &&
   grep -q 'did not prove this job' "$OUT/s0.err" && [ -z "$(shm_left "$port")" ]; then
    ok "a client without the token got no segment name ($got), rank 0 said so, and the job trained as --ranks 2 ($ref)"
else
    bad "client without the token: exits $rc0 $rc1, '$got', segment name sent: $(grep -ac 'train-' "$OUT/stranger.bin"), losses '$(losses "$OUT/s0.out")' against '$ref', /dev/shm: '$(shm_left "$port")' (see $OUT/s*.err)"
fi

# --- a rank of another job is turned away; the job completes ----------------------------------
port=$($C --free-port)
rank j0 0 jobA "$port"; p0=$!
t0=$(now)
rank x1 1 jobB "$port"; px=$!
wait $px; rcx=$?
took=$(secs "$t0" "$(now)")
rank j1 1 jobA "$port"; p1=$!
wait $p0; rc0=$?
wait $p1; rc1=$?
if [ $rcx -ne 0 ] && [ $rcx -ne 124 ] && grep -q 'turned rank 1 away' "$OUT/x1.err" && [ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] &&
   same_losses "$OUT/j0.out" && [ -z "$(shm_left "$port")" ]; then
    ok "a rank of another job was turned away (exit $rcx after $took s: \"$(head -n 1 "$OUT/x1.err")\"); the job trained as --ranks 2 ($ref)"
else
    bad "rank of another job: its exit $rcx after $took s, job exits $rc0 $rc1, losses '$(losses "$OUT/j0.out")' against '$ref', /dev/shm: '$(shm_left "$port")' (see $OUT/x1.err, $OUT/j*.err)"
fi

# --- a rank of this job with another model: both stop, exit 2 --------------------------------
port=$($C --free-port)
rank m0 0 jobA "$port"; p0=$!
listening "$port"
t0=$(now)
rank m1 1 jobA "$port" --layers 2; p1=$!
wait $p1; rc1=$?
wait $p0; rc0=$?
took=$(secs "$t0" "$(now)")
fast=$(awk -v t="$took" 'BEGIN { print t < 10 }')
if [ $rc0 -eq 2 ] && [ $rc1 -eq 2 ] && [ "$(wc -l < "$OUT/m0.err")" -eq 1 ] && [ "$(wc -l < "$OUT/m1.err")" -eq 1 ] &&
   grep -q 'on layers: rank 1 has layers=2, rank 0 has layers=1' "$OUT/m0.err" &&
   grep -q 'on layers: rank 0 has layers=1, rank 1 has layers=2' "$OUT/m1.err" && [ "$fast" = 1 ] &&
   ! grep -q '^step' "$OUT/m0.out" && [ -z "$(shm_left "$port")" ]; then
    ok "another model (--layers 2 against 1): both ranks exit 2 within $took s, one line each: \"$(cat "$OUT/m0.err")\""
else
    bad "another model: exits $rc0 $rc1 (want 2 2) after $took s, stderr lines $(wc -l < "$OUT/m0.err") $(wc -l < "$OUT/m1.err"), /dev/shm: '$(shm_left "$port")' (see $OUT/m*.err)"
fi

# --- two processes started as rank 1 (3 ranks): one is refused, the job completes ----------
port=$($C --free-port)
WORLD=3
rank d0 0 jobA "$port"; p0=$!
rank d1 1 jobA "$port"; p1=$!
rank dd 1 jobA "$port"; pd=$!
# the first rank 1 served waits for rank 2; the other is refused: wait for whichever ends
i=0
while [ $i -lt 600 ] && kill -0 $p1 2>/dev/null && kill -0 $pd 2>/dev/null; do sleep 0.05; i=$((i + 1)); done
rank d2 2 jobA "$port"; p2=$!
wait $p0; rc0=$?; wait $p1; rc1=$?; wait $pd; rcd=$?; wait $p2; rc2=$?
WORLD=2
refused=$(cat "$OUT/d1.err" "$OUT/dd.err" | grep -c 'two processes of this job were started as rank 1')
if [ $rc0 -eq 0 ] && [ $rc2 -eq 0 ] && { [ "$rc1$rcd" = 02 ] || [ "$rc1$rcd" = 20 ]; } && [ "$refused" -eq 1 ] &&
   grep -q '^step 2/2' "$OUT/d0.out" && [ -z "$(shm_left "$port")" ]; then
    ok "two processes as rank 1: one served, the other refused (exit 2: \"$(cat "$OUT/d1.err" "$OUT/dd.err" | head -n 1)\"), the 3 ranks trained"
else
    bad "two processes as rank 1: exits $rc0 $rc1 $rcd $rc2 (want 0, one 0 and one 2, 0), $refused refusals, /dev/shm: '$(shm_left "$port")' (see $OUT/d*.err)"
fi

# --- 20 silent clients delay the start by at most 2 s ----------------------------------------
# start(NAME PORT N): rank 0, then N silent clients (held 60 s), then rank 1; the seconds from
# rank 1's start to the job's start (rank 0 prints its header, after joining) in $took
start() {
    port=$2
    rank "$1.0" 0 jobA "$port"; p0=$!
    $C --silent 127.0.0.1 "$port" "$3" 60 > "$OUT/$1.silent" 2>&1 & ps=$!
    i=0
    while [ $i -lt 400 ] && ! grep -q connected "$OUT/$1.silent"; do sleep 0.05; i=$((i + 1)); done
    # the address rank 0 listens on, from the kernel's table (state 0A: listening)
    bound=$(awk -v p="$(printf '%04X' "$port")" '$4 == "0A" { split($2, a, ":"); if (a[2] == p) print a[1] }' \
        /proc/net/tcp | head -n 1)
    t0=$(now)
    rank "$1.1" 1 jobA "$port"; p1=$!
    i=0
    while [ $i -lt 1200 ] && ! grep -q '^comm:' "$OUT/$1.0.out" && kill -0 $p0 2>/dev/null; do sleep 0.05; i=$((i + 1)); done
    took=$(secs "$t0" "$(now)")
    wait $p0; rc0=$?
    wait $p1; rc1=$?
    kill $ps 2>/dev/null; wait $ps 2>/dev/null
}
start quiet "$($C --free-port)" 1; base=$took; brc="$rc0 $rc1"
start silent "$($C --free-port)" 20
delay=$(awk -v a="$base" -v b="$took" 'BEGIN { printf "%.1f", b - a }')
if [ "$brc" = "0 0" ] && [ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] && grep -q '20 clients connected' "$OUT/silent.silent" &&
   [ "$(awk -v d="$delay" 'BEGIN { print d <= 2 }')" = 1 ] && same_losses "$OUT/silent.0.out" &&
   [ -z "$(shm_left "$port")" ]; then
    ok "20 silent clients held on: the job started $took s after rank 1, $delay s later than with none ($base s)"
else
    bad "20 silent clients: exits $brc / $rc0 $rc1, $took s against $base s (delay $delay s, at most 2), /dev/shm: '$(shm_left "$port")' (see $OUT/silent.*)"
fi

# 127.0.0.1 is 0100007F in /proc/net/tcp's order; every address is 00000000
if [ "$bound" = 0100007F ]; then
    ok "rank 0 listens on MASTER_ADDR=127.0.0.1, one of its host's addresses, not on every address"
else
    bad "rank 0 listens on '$bound' (/proc/net/tcp), not on MASTER_ADDR=127.0.0.1 (0100007F)"
fi

t_end test_rendezvous
