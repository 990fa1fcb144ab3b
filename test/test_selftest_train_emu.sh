#!/bin/sh
# test/test_selftest_train_emu.sh: the self-test stops a run whose GPU kernel
# is wrong, before step 1, naming the kernel. In a scratch copy of the
# sources (test/emu/scratch.sh) the GPU's GELU (gelu.cuh, kernels.cu's pass
# and matmul.cu's fused epilogue alike) loses a factor (x^2 for x^3 in its
# cubic term: a typo no compiler sees), test/train_emu is rebuilt
# over the emulated kernels and trains on --device cuda; the run must exit
# 1 with "error: self-test: kernel gelu_forward ..." (or matmul_forward_gelu,
# fc's product with GELU in its epilogue, which the self-test's matmul group
# checks first) and no step line, and
# with --no-self-test it must train (the check is what stopped it).
# test_selftest_emu checks the self-test itself op by op. (Its tolerances,
# 1e-4 in fp32 and 1e-2 in bf16 of the largest value, let small slips pass:
# 0.045 for 0.044715 moves GELU by about 1e-4 and was not seen by it.)
cd "$(dirname "$0")/.." || exit 2
if [ ! -x test/train_emu ]; then
    echo "SKIP selftest_train (cpu emulation): test/train_emu not built (no CUDA headers where make ran)"
    exit 0
fi
SCRATCH=selftest
. test/emu/scratch.sh
tar -cf - test/emu/train test/train_emu 2>/dev/null | tar -xf - -C "$S"
M="--data test/fixtures/ref_tokens.bin --layers 2 --heads 2 --dim 32 --max-seq 16 --vocab 61 --seq 8 --steps 2 --device cuda"
if ! patch_in gelu.cuh 'return 0.5f * x * (1.0f + tanhf(GELU_S * (x + 0.044715f * x * x * x)));' \
                       'return 0.5f * x * (1.0f + tanhf(GELU_S * (x + 0.044715f * x * x)));' ||
   ! make -C "$S" --no-print-directory test/train_emu > "$S/build.log" 2>&1; then
    echo "FAIL selftest_train: could not patch gelu.cuh or rebuild: $(grep -m1 error "$S/build.log")"
    exit 1
fi
for dt in fp32 bf16; do
    (cd "$S" && timeout 120 ./test/train_emu $M --dtype $dt) > "$S/run.log" 2>&1
    rc=$?
    line=$(grep -m1 -e 'error: self-test: kernel gelu_forward' -e 'error: self-test: kernel matmul_forward_gelu' \
        "$S/run.log")
    steps=$(grep -c '^step ' "$S/run.log")
    if [ $rc -eq 1 ] && [ -n "$line" ] && [ "$steps" -eq 0 ]; then
        echo "PASS selftest_train: a wrong GELU ($dt) stops the run before step 1: $line"
        pass=$((pass + 1))
    else
        echo "FAIL selftest_train: a wrong GELU ($dt): exit $rc, $steps step lines, line \"$line\""
        fail=$((fail + 1))
    fi
done
(cd "$S" && timeout 120 ./test/train_emu $M --dtype fp32 --no-self-test) > "$S/run.log" 2>&1
rc=$?
steps=$(grep -c '^step ' "$S/run.log")
if [ $rc -eq 0 ] && [ "$steps" -eq 2 ]; then
    echo "PASS selftest_train: with --no-self-test the same binary trains ($steps steps): the self-test stopped it"
    pass=$((pass + 1))
else
    echo "FAIL selftest_train: with --no-self-test: exit $rc, $steps step lines"
    fail=$((fail + 1))
fi
rm -rf "$S"
[ $fail -eq 0 ]
