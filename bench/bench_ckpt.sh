#!/bin/sh
# bench/bench_ckpt.sh (make bench-ckpt): save and load of GPT-2 124M's full
# training state (float32 master weights and Adam m, v: 12 bytes a parameter,
# 1.49 GB) on 1 rank and on 4 ranks (dp 4, ZeRO-1: each rank writes a quarter),
# as MB/s beside the disk's sequential write speed; then the step's stall
# while a checkpoint is written, with and without --checkpoint-async: the
# same 7 steps with no checkpoint, with one every 2 steps written in line,
# and written in the background (the stall: the extra wall time a save, and
# the line's own figure, the time the training thread was held). Not a timed test.
cd "$(dirname "$0")/.." || exit 2
D=${BENCH_CKPT_DIR:-bench/out/ckpt}
rm -rf "$D"; mkdir -p "$D"
M="--data test/fixtures/ref_tokens.bin --layers 12 --heads 12 --dim 768 --max-seq 1024 --vocab 50257 --seq 8 --device cpu --steps 1"
disk=$(dd if=/dev/zero of="$D/dd.bin" bs=1M count=1024 conv=fdatasync 2>&1 | sed -n 's/.*, \([0-9.]* [MG]B\/s\)$/\1/p')
rm -f "$D/dd.bin"
echo "disk: sequential write (dd, 1 GiB, fdatasync): $disk"
for layout in "--batch 4" "--ranks 4 --zero 1 --batch 1"; do
    rm -rf "$D/c"
    ./train $M $layout --checkpoint-dir "$D/c" > "$D/save.log" 2>&1 || { tail -n 3 "$D/save.log"; exit 1; }
    bytes=$(du -sb "$D/c/step-1" | cut -f1)
    save_ms=$(sed -n 's/^checkpoint .* (\([0-9]*\) ms)$/\1/p' "$D/save.log" | tail -n 1)
    sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null
    ./train $M $layout --checkpoint-dir "$D/c" --resume > "$D/load.log" 2>&1 || { tail -n 3 "$D/load.log"; exit 1; }
    load_ms=$(sed -n 's/.*loaded in \([0-9]*\) ms.*/\1/p' "$D/load.log")
    awk -v l="$layout" -v b="$bytes" -v s="$save_ms" -v r="$load_ms" 'BEGIN {
        printf "%-28s %.0f MB on disk | save %6.0f ms = %6.0f MB/s | load %6.0f ms = %6.0f MB/s\n",
               l, b / 1e6, s, b / 1e3 / s, r, b / 1e3 / r }'
done

# the stall: 7 steps, a checkpoint after steps 2, 4 and 6 (the final one, at 7, is left out)
now_ms() { date +%s%N | cut -c1-13; }
echo "stall: 7 steps, a checkpoint after steps 2, 4 and 6"
for layout in "--batch 4" "--ranks 4 --zero 1 --batch 1"; do
    base=0
    for mode in none sync async; do
        rm -rf "$D/s"
        case $mode in
            none)  ck="" ;;
            sync)  ck="--checkpoint-dir $D/s --checkpoint-every 2" ;;
            async) ck="--checkpoint-dir $D/s --checkpoint-every 2 --checkpoint-async" ;;
        esac
        t0=$(now_ms)
        ./train $M $layout --steps 7 $ck > "$D/stall.log" 2>&1 || { tail -n 3 "$D/stall.log"; exit 1; }
        steps_ms=$(grep '^step ' "$D/stall.log" | sed 's/.*| \([0-9.]*\) ms |.*/\1/' | awk '{s += $1} END {printf "%.0f", s}')
        held=$(sed -n 's/^checkpoint .*step-[246] (\([0-9]*\) ms.*/\1/p' "$D/stall.log" | awk '{s += $1; n++} END {printf "%.0f", n ? s / n : 0}')
        train_ms=$((steps_ms + held * 3))
        [ $mode = none ] && { base=$steps_ms; train_ms=$steps_ms; }
        awk -v l="$layout" -v m=$mode -v t=$train_ms -v b=$base -v h=$held 'BEGIN {
            printf "%-28s %-5s steps + saves %6.0f ms | stall a save %6.0f ms (the training thread held %6.0f ms)\n",
                   l, m, t, (t - b) / 3, h }'
    done
done
rm -rf "$D"
