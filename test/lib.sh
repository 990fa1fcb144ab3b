# test/lib.sh: what the shell tests share. Sourced (`. test/lib.sh`) after
# the script's cd to the repository's top; POSIX sh. It starts the counters
# pass and fail at 0 and gives:
#   t_init NAME              OUT=test/out/NAME, emptied and made
#   ok TEXT, bad TEXT        a PASS or FAIL line (test/check.h's format, which
#                            test/run.sh counts), counted in pass and fail
#   t_need_python3 LABEL WHY without python3: "SKIP LABEL: no python3 WHY", exit 0
#   t_summary LABEL [NOTE]   "LABEL: P passed, F failed" (then " (NOTE)")
#   t_end LABEL              t_summary, then exit 1 if anything failed, else 0
#   t_render SVG PNG WHAT    where rsvg-convert is installed, SVG rendered to PNG
#                            (to look at): a PASS, or a FAIL if it cannot; else a SKIP
# and for the checkpoint tests (test_resume.sh, test_reshard.sh):
#   t_ckpt_init NAME         t_init, then N, S, SMALL and BIG (below)
#   t_stop_resume ...        a straight run, a run stopped after step S, and
#                            its resume (below)
pass=0
fail=0

t_init() { OUT=test/out/$1; rm -rf "$OUT"; mkdir -p "$OUT"; }
ok() { echo "PASS $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
t_need_python3() {
    command -v python3 > /dev/null || { echo "SKIP $1: no python3 $2"; exit 0; }
}
t_summary() { echo "$1: $pass passed, $fail failed${2:+ ($2)}"; }
t_end() { t_summary "$1"; [ "$fail" -eq 0 ] || exit 1; exit 0; }
t_render() {
    if ! command -v rsvg-convert > /dev/null; then echo "SKIP render: no rsvg-convert (Debian's librsvg2-bin)"; return; fi
    if rsvg-convert "$1" -o "$2" 2> "$OUT/rsvg.err" && [ -s "$2" ]; then ok "rsvg-convert renders $3 ($2)"
    else bad "rsvg-convert: $(head -n 1 "$OUT/rsvg.err")"; fi
}

# t_ckpt_init NAME: t_init NAME; runs of N = 6 steps stopped after S = 3;
# the model flags SMALL (4 layers, 4 heads) and BIG (8 layers, 8 heads),
# both tiny CPU models on test/fixtures with clipping that acts.
t_ckpt_init() {
    t_init "$1"
    N=6; S=3
    SMALL="--data test/fixtures/ref_tokens.bin --layers 4 --heads 4 --dim 32 --max-seq 16 --vocab 61 --seq 8 --device cpu --clip 0.5 --lr 0.005"
    BIG="--data test/fixtures/ref_tokens.bin --layers 8 --heads 8 --dim 32 --max-seq 16 --vocab 61 --seq 8 --device cpu --clip 0.5 --lr 0.005"
}

# t_stop_resume NAME MODEL FIRST SECOND WHAT: in d=$OUT/NAME (as a file
# name), three runs of ./train MODEL: N steps straight with the flags
# SECOND (straight.log, straight.bin); N steps with FIRST that checkpoint
# every S steps into d/ck (first.log), whose latest is then pointed back at
# step S as if killed there; --resume from it with SECOND to N (resumed.log,
# resumed.bin). 0; or, when a run fails, 1 and one FAIL line naming it
# (WHAT names the second: "the checkpointing run"). Sets d, and name,
# model, first and second as given.
t_stop_resume() {
    name=$1; model=$2; first=$3; second=$4
    d="$OUT/$(echo "$name" | tr -c 'a-z0-9\n' '_')"
    mkdir -p "$d"
    timeout 300 ./train $model $second --steps $N --save "$d/straight.bin" > "$d/straight.log" 2>&1 || {
        bad "$name: the straight run failed (see $d/straight.log)"; return 1; }
    timeout 300 ./train $model $first --steps $N --checkpoint-dir "$d/ck" --checkpoint-every $S --keep 10 \
        > "$d/first.log" 2>&1 || { bad "$name: $5 failed (see $d/first.log)"; return 1; }
    echo "step-$S" > "$d/ck/latest"
    timeout 300 ./train $model $second --steps $N --checkpoint-dir "$d/ck" --resume --save "$d/resumed.bin" \
        > "$d/resumed.log" 2>&1 || { bad "$name: the resumed run failed (see $d/resumed.log)"; return 1; }
}

# signal_held SIG LOG CKDIR RANKS CMD...: runs CMD in the background with its output held: it
# writes into a FIFO filled beforehand, so its first write (after its signal handlers are
# installed, before step one can end on any rank) blocks. Waits for the events that show it is
# ready (CKDIR/.lock names its pid: the lock is taken after the handlers are installed; its
# RANKS ranks exist, which inherit them), sends SIG to it and its ranks, then lets the output
# flow into LOG. Its exit status. (A signal sent after a fixed delay instead could come before
# the handlers on a loaded machine, and kill it with 128 + SIG; or after its first steps, when
# --time-limit's clock may already have stopped it.)
signal_held() {
    sig=$1; log=$2; ck=$3; nr=$4; shift 4
    fifo=$log.fifo
    rm -f $fifo && mkfifo $fifo
    exec 3<> $fifo                                                         # opens never block
    dd if=/dev/zero of=$fifo bs=65536 count=1 oflag=nonblock 2> /dev/null 3>&-   # the FIFO is full
    "$@" > $fifo 2>&1 3>&- &
    pid=$!
    tries=0
    until grep -q "pid $pid\$" $ck/.lock 2> /dev/null && [ "$(pgrep -P $pid | wc -l)" -ge "$nr" ]; do
        tries=$((tries + 1))
        [ $tries -lt 30000 ] && [ -d /proc/$pid ] || break   # it exited (a failure the caller reports)
        sleep 0.01
    done
    kill -$sig $pid $(pgrep -P $pid) 2> /dev/null
    tr -d '\000' < $fifo > $log 3>&- &   # ends when the run's last process does
    drain=$!
    exec 3>&-
    wait $pid
    rc=$?
    wait $drain
    rm -f $fifo
    return $rc
}
