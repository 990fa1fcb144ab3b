#!/bin/sh
# test/test_offline.sh: `make train` on a fresh clone, offline, with nothing
# beside it. It clones the repository's committed HEAD (`git
# clone` of this tree: only what is committed is seen, so a file not yet
# committed, corpus/tinyshakespeare.txt.gz included, is missing here) into a
# temporary directory that has no ../shared beside it, cuts the network off
# (every proxy variable points at 127.0.0.1:9, where nothing listens, and
# curl is told to use it) and runs `make train TRAIN_FLAGS="--steps 20"`. It
# must unpack the text the repository carries, train, print a sample and
# exit 0.
#
# Cheap by reuse: nvcc's objects (every .cu file's: kernels.o, matmul.o, ...) and
# their stamp come from the main tree's `make build` and are touched newer
# than the clone's sources, so nvcc does not run again (as in
# test/test_build.sh); the C objects are compiled from the clone's sources.
# What this does not prove: that the download fallback works (it is the
# path cut off here), or that a GPU run works offline.
cd "$(dirname "$0")/.." || exit 2
MAIN=$(pwd)
unset MAKEFLAGS MFLAGS DATA VAL TRAIN_FLAGS
. test/lib.sh
if ! git rev-parse --verify -q HEAD > /dev/null 2>&1; then echo "SKIP offline: not a git checkout"; exit 0; fi
if ! git cat-file -e HEAD:corpus/tinyshakespeare.txt.gz 2>/dev/null; then
    echo "FAIL offline: corpus/tinyshakespeare.txt.gz is not committed (the clone sees HEAD only)"
    exit 0
fi

W=$(mktemp -d "${TMPDIR:-/tmp}/offline.XXXX")
R=$W/train
git clone -q "$MAIN" "$R" || { echo "FAIL offline: git clone failed"; exit 0; }
[ -e "$W/../shared" ] && [ "$(cd "$W/.." && pwd)" = "$(cd "$MAIN/.." && pwd)" ] &&
    { echo "FAIL offline: $W has ../shared beside it"; exit 0; }
NV=""
CU_OBJS=$(ls *.cu | sed 's/\.cu$/.o/')   # every .cu file's object
if ls $CU_OBJS .flags-cu > /dev/null 2>&1; then
    cp -p $CU_OBJS .flags-cu "$R/"
    (cd "$R" && touch $CU_OBJS)
else
    NV="NO_CUDA=1"      # nothing of nvcc's to reuse: a CPU build, as a machine without CUDA makes
fi

PROXY=http://127.0.0.1:9
start=$(date +%s)
(cd "$R" && env http_proxy=$PROXY https_proxy=$PROXY HTTP_PROXY=$PROXY HTTPS_PROXY=$PROXY \
    ALL_PROXY=$PROXY all_proxy=$PROXY no_proxy= NO_PROXY= CUDA_VISIBLE_DEVICES= \
    make --no-print-directory -j2 train $NV TRAIN_FLAGS="--steps 20") > "$W/make.log" 2>&1
rc=$?
secs=$(( $(date +%s) - start ))
if [ $rc -eq 0 ]; then ok "make train on a fresh offline clone exited 0 (${secs}s)"
else bad "make train on a fresh offline clone exited $rc: $(tail -n 3 "$W/make.log" | tr '\n' ' ')"; fi
n=$(grep -ac 'nvcc' "$W/make.log")
[ -n "$NV" ] || { [ "$n" -eq 0 ] && ok "nvcc's objects reused (nvcc ran 0 times)" ||
    bad "nvcc ran $n times (its objects should have been reused)"; }
if cmp -s "$R/data/tinyshakespeare.txt" "$R/corpus/tinyshakespeare.txt.gz" ||
   ! gzip -dc "$R/corpus/tinyshakespeare.txt.gz" | cmp -s - "$R/data/tinyshakespeare.txt"; then
    bad "data/tinyshakespeare.txt is not the unpacked corpus/tinyshakespeare.txt.gz"
else
    ok "data/tinyshakespeare.txt unpacked from the repository ($(wc -c < "$R/data/tinyshakespeare.txt") bytes)"
fi
if grep -aq '^step 20/20 | loss ' "$W/make.log"; then ok "trained 20 steps: $(grep '^step 20/20' "$W/make.log" | cut -d'|' -f1-2)"
else bad "no step 20/20 line"; fi
# the sample: text printed after the last val loss line, before the checkpoint note
chars=$(awk '/^val loss/{s=1; next} /^checkpoints in|^summary/{s=0} s' "$W/make.log" | grep -av '^memory\|^sample' | wc -c)
if grep -aq '^sample' "$W/make.log" && [ "$chars" -ge 100 ]; then ok "sampled text ($chars characters after the val loss)"
else bad "no sample ($chars characters after the val loss)"; fi
t_summary offline "log: $W/make.log"
[ $fail -eq 0 ] && rm -rf "$W"
exit 0
