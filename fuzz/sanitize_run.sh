#!/bin/sh
# fuzz/sanitize_run.sh: the CPU test suite of a sanitized copy (make
# sanitize runs it in build/sanitize): the CPU test programs and the
# command-line scripts, counted as test/run.sh counts them. The emulated-GPU
# scripts, the build test and the fuzzing are left to the normal suite.
# Any AddressSanitizer, LeakSanitizer or UBSan report counts as a failure.
cd "$(dirname "$0")/.." || exit 2
mkdir -p test/out
passed=0; failed=0
for t in test/test_ops test/test_cpu_gemm test/test_cpu_gemm_simde.sh test/test_model test/test_comm test/test_dp test/test_tp \
         test/test_pp test/test_3d test/test_data test/test_cli.sh test/test_hostile.sh test/test_launch.sh test/test_fault.sh; do
    [ -e "$t" ] || continue
    name=$(basename "$t")
    log=test/out/$name.log
    # LeakSanitizer on for everything: train (the scripts run it) and the test programs
    case "$t" in *.sh) sh "$t" > "$log" 2>&1 ;; *) "./$t" > "$log" 2>&1 ;; esac
    rc=$?
    p=$(grep -c '^PASS ' "$log"); f=$(grep -c '^FAIL ' "$log")
    s=$(grep -c -E 'ERROR: (Address|Leak)Sanitizer|runtime error:' "$log")
    [ "$s" -gt 0 ] && { f=$((f + 1)); grep -m3 -E 'ERROR: (Address|Leak)Sanitizer|runtime error:' "$log" | sed "s/^/  [$name] /"; }
    [ "$rc" -ne 0 ] && [ "$f" -eq 0 ] && f=1
    grep '^FAIL ' "$log" | sed "s/^/  [$name] /"
    echo "sanitized $name: $p passed, $f failed"
    passed=$((passed + p)); failed=$((failed + f))
done
echo "sanitized: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
