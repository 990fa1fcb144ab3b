#!/bin/sh
# test/test_cp_mutants.sh: test/test_cp must catch each of three bugs planted
# in a copy of cp.c, one at a time: a wrong causal mask on one chunk pair
# (rank 1's second chunk against rank 0's first, which it should see
# whole), the log-sum-exp merge without its rescale of the output so far,
# and a chunk dealt to the wrong rank (rank r holding chunks r and N + r,
# every position still held once). cp.c computes a block twice, the fast
# path the ring runs in training (cp_block_forward / _backward, by chunk
# pairs) and the plain loops (the _naive specification): the mask and the
# merge are planted in each, one mutant at a time; the deal (cp_chunk) is
# shared by both. Each mutant is built with
# `make test/out/test_cp_mutant CP_SRC=...`; a mutant that no longer
# applies (cp.c changed) is a failure too, so the test cannot go stale.
cd "$(dirname "$0")/.." || exit 2
mkdir -p test/out/cp_mutant
status=0
mutant() {   # mutant NAME OLD NEW [PATH]: PATH, a path a failing check must name
    python3 - "$2" "$3" <<'PY' || { echo "FAIL cp mutant $1: the planted change no longer applies to cp.c"; status=1; return; }
import sys
s = open("cp.c").read()
old, new = sys.argv[1], sys.argv[2]
if s.count(old) != 1: sys.exit(1)
open("test/out/cp_mutant/cp.c", "w").write(s.replace(old, new))
PY
    if ! make --no-print-directory -s test/out/test_cp_mutant CP_SRC=test/out/cp_mutant/cp.c > test/out/cp_mutant/build.log 2>&1; then
        echo "FAIL cp mutant $1: did not build: $(tail -n 1 test/out/cp_mutant/build.log)"; status=1; return
    fi
    ./test/out/test_cp_mutant > test/out/cp_mutant/run.log 2>&1
    rc=$?
    n=$(grep -c '^FAIL ' test/out/cp_mutant/run.log)
    if [ -n "$4" ] && ! grep '^FAIL ' test/out/cp_mutant/run.log | grep -q "$4"; then
        echo "FAIL cp mutant $1: no check of the $4 caught it (exit $rc, $n other failing checks)"; status=1
    elif [ "$rc" -ne 0 ] && [ "$n" -gt 0 ]; then
        echo "PASS cp mutant $1: caught by $n check(s), first: $(grep -m1 '^FAIL ' test/out/cp_mutant/run.log | cut -c6- | cut -d: -f1)"
    else
        echo "FAIL cp mutant $1: test_cp passed with the bug planted (exit $rc)"; status=1
    fi
}
mutant "wrong causal mask on one chunk pair (fast path)" \
    'if (k.pos[kk] < q.pos[qi]) n = (kk + 1) * k.len;' \
    'if (k.pos[kk] < q.pos[qi]) n = r == 1 && s == 0 && qi == 1 && kk == 0 ? tq + 1 : (kk + 1) * k.len;' 'fast path'
mutant "wrong causal mask on one chunk pair (plain loops)" \
    'return cp_position(N, s, T, j) <= cp_position(N, r, T, t);' \
    'return (cp_position(N, s, T, j) <= cp_position(N, r, T, t)) != (r == 1 && s == 0 && j < T / N / 2 && t >= T / N / 2);' 'plain loops'
mutant "log-sum-exp merge without the rescale (fast path)" \
    'o[i] = o[i] * keep + p[i] * add;' \
    'o[i] = o[i] + p[i] * add;' 'fast path'
mutant "log-sum-exp merge without the rescale (plain loops)" \
    'o[i] = o[i] * keep + ob[i] * add;' \
    'o[i] = o[i] + ob[i] * add;' 'plain loops'
mutant "a chunk dealt to the wrong rank (both paths)" \
    'return half ? 2 * N - 1 - r : r;' \
    'return half ? N + r : r;'
exit $status
