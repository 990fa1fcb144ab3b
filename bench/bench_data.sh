#!/bin/sh
# bench/bench_data.sh (make bench-data): the data loader of one rank, as issue 26 asks: 1 and
# 30 shards of 4M tokens (llm.c token files), read through to the end by data_batch at T 1024,
# 8 sequences a call, in order and with --shuffle: tokens a second beside the ~1.2M tokens/s one
# H100 consumes at 100% MFU for GPT-2 124M, and the process's RSS and PSS afterwards
# (/proc/self/smaps_rollup) and its peak RSS. The shards (240 MB) go to BENCH_DATA_DIR
# (test/out/bench_data) and are removed at the end. 4M tokens x 1 is under data.h's
# DATA_SCAN_MAX_TOKENS (scanned at load); 30 x 4M is over it (ids checked per sequence).
cd "$(dirname "$0")/.." || exit 2
D=${BENCH_DATA_DIR:-test/out/bench_data}
rm -rf "$D" && mkdir -p "$D" || exit 2
./bench/bench_data make "$D" 30 4194304 || exit 1
sync
# the page cache warm for every run: the loader, not the disk, is measured
cat "$D"/shard_*.bin > /dev/null
echo "bench-data: one rank, T 1024, 8 sequences a data_batch call; $(nproc) cores, $(uname -r)"
./bench/bench_data read "$D/shard_000000.bin" 1024 8 || exit 1
./bench/bench_data read "$D/shard_*.bin" 1024 8 || exit 1
./bench/bench_data read "$D/shard_000000.bin" 1024 8 shuffle || exit 1
./bench/bench_data read "$D/shard_*.bin" 1024 8 shuffle || exit 1
rm -rf "$D"
