#!/bin/sh
# test/run.sh: runs every test program and script under test/, counts their
# PASS / FAIL / SKIP lines (see test/check.h) and ends with "N passed, N failed".
# A test that exits non-zero without printing FAIL counts as one failure.
cd "$(dirname "$0")/.." || exit 2
mkdir -p test/out
passed=0; failed=0; skipped=0
for t in test/test_ops test/test_cp test/test_cpu_gemm test/test_model test/test_kernels test/test_gemm test/test_flash test/test_comm test/test_dp test/test_tp test/test_layout test/test_pp test/test_3d test/test_data test/test_*.sh; do
    [ -e "$t" ] || continue
    name=$(basename "$t")
    log="test/out/$name.log"
    start=$(date +%s)
    case "$t" in
        *.sh) sh "$t" > "$log" 2>&1 ;;
        *)    "./$t" > "$log" 2>&1 ;;
    esac
    rc=$?
    secs=$(( $(date +%s) - start ))
    p=$(grep -c '^PASS ' "$log"); f=$(grep -c '^FAIL ' "$log"); s=$(grep -c '^SKIP ' "$log")
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        f=1; echo "FAIL $name: exited with status $rc and no FAIL line" >> "$log"
    fi
    grep -E '^(FAIL|SKIP) ' "$log" | sed "s/^/  [$name] /"
    echo "$name: $p passed, $f failed, $s skipped (${secs}s)"
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
done
echo "$skipped skipped"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
