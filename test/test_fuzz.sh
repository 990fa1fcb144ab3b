#!/bin/sh
# test/test_fuzz.sh: each libFuzzer target of fuzz/ (model file, token file,
# tokenizer file, command line, HellaSwag eval file, a sharded checkpoint's
# manifest with its shards, an earlier --log read on resume) runs from its seed corpus for FUZZ_SECONDS
# (10 here; CI sets 60) without a finding: one PASS line a target with its
# executions. Needs clang (Debian's clang package); SKIP without it.
cd "$(dirname "$0")/.." || exit 2
if ! command -v clang > /dev/null; then
    echo "SKIP fuzz: clang is not installed (apt-get install clang)"
    exit 0
fi
mkdir -p test/out
if ! make --no-print-directory fuzz-build > test/out/fuzz_build.log 2>&1; then
    echo "FAIL fuzz: the targets do not build (see test/out/fuzz_build.log)"
    exit 1
fi
sh fuzz/run.sh "${FUZZ_SECONDS:-10}"
