#!/bin/sh
# bench/compare_layouts.sh (make compare-layouts): one small model trained
# under six layouts on the CPU, same global batch, same data, same seed,
# and their train-loss curves drawn on one SVG (test/out/layouts.svg): 1
# rank, DDP (dp 2), ZeRO-3 (dp 2), TP (tp 2), PP (pp 2, 1F1B, 2
# micro-batches) and 4D (dp 2 x tp 2 x pp 2, ZeRO-1; 8 ranks). The layouts
# compute the same sums in other orders, so the curves should lie on top of
# each other; the table gives each layout's final loss, its largest gap to
# one rank over the run, and its wall time (which on a 2-core host says
# little: ranks share cores). STEPS=N changes the length (300).
cd "$(dirname "$0")/.." || exit 2
STEPS=${STEPS:-300}
DATA=${DATA:-data/tinyshakespeare_train.txt}
[ -f "$DATA" ] || make --no-print-directory "$DATA" > /dev/null || exit 1
OUT=test/out/layouts
mkdir -p $OUT
MODEL="--device cpu --layers 2 --heads 4 --dim 64 --seq 64 --steps $STEPS --lr 3e-3 --lr-min 3e-4 --warmup 20 --seed 1"
# name|flags: the global batch is 16 sequences in every layout
LAYOUTS="1 rank|--batch 16
DDP|--ranks 2 --dp 2 --batch 8
ZeRO-3|--ranks 2 --dp 2 --zero 3 --batch 8
TP|--ranks 2 --tp 2 --batch 16
PP|--ranks 2 --pp 2 --micro-batches 2 --batch 8
4D|--ranks 8 --dp 2 --tp 2 --pp 2 --zero 1 --micro-batches 2 --batch 4"
echo "compare-layouts: $STEPS steps of $MODEL on $(nproc) cores"
printf "%-8s %12s %16s %8s\n" layout "final loss" "max |d| vs 1 rank" seconds
i=0
echo "$LAYOUTS" | while IFS='|' read -r name flags; do
    i=$((i + 1))
    start=$(date +%s)
    # shellcheck disable=SC2086
    ./train --data "$DATA" $MODEL $flags > $OUT/$i.log 2>&1 || { echo "$name: train failed: $(tail -n 1 $OUT/$i.log)"; exit 1; }
    secs=$(( $(date +%s) - start ))
    grep -a '^step ' $OUT/$i.log | awk -v n="$name" '{split($2, s, "/"); print n "\t" s[1] "\t" $5}' > $OUT/$i.tsv
    awk -F'\t' -v secs=$secs 'NR == FNR {ref[$2] = $3; next}
        {d = $3 - ref[$2]; if (d < 0) d = -d; if (d > m) m = d; last = $3; n = $1}
        END {printf "%-8s %12.4f %16.2e %8d\n", n, last, m, secs}' $OUT/1.tsv $OUT/$i.tsv
done || exit 1
# the plot: one polyline a layout, the loss axis from the data
cat $OUT/[1-6].tsv | awk -F'\t' -v steps=$STEPS '
    BEGIN {W = 900; H = 500; L = 70; R = 170; T = 40; B = 60
           split("#1f77b4 #ff7f0e #2ca02c #d62728 #9467bd #8c564b", col, " ")}
    { if (!($1 in idx)) {idx[$1] = ++n; name[n] = $1}
      k = idx[$1]; np[k]++; st[k, np[k]] = $2; ls[k, np[k]] = $3
      if (lo == "" || $3 < lo) lo = $3; if (hi == "" || $3 > hi) hi = $3 }
    function x(s) { return L + s / steps * (W - L - R) }
    function y(v) { return H - B - (v - lo) / (hi - lo) * (H - T - B) }
    END {
      lo = int(lo * 2) / 2; hi = int(hi * 2 + 1) / 2
      printf "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      printf "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"13\">\n", W, H
      printf "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
      printf "<text x=\"%d\" y=\"25\" font-size=\"15\">train loss of one model under six layouts (same data, seed, global batch)</text>\n", L
      printf "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#444\"/>\n", L, T, W - L - R, H - T - B
      for (v = lo; v <= hi + 1e-9; v += 0.5) printf "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/><text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", L, W - R, y(v), y(v), L - 6, y(v) + 4, v
      ds = steps >= 200 ? 50 : 10
      for (s = 0; s <= steps; s += ds) printf "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%d</text>\n", x(s), H - B + 18, s
      printf "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">step</text>\n", (L + W - R) / 2, H - 15
      for (k = 1; k <= n; k++) {
        printf "<polyline class=\"layout\" data-layout=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"%.1f\" stroke-opacity=\"0.8\" points=\"", name[k], col[k], 4.5 - 0.6 * k
        for (j = 1; j <= np[k]; j++) printf "%.1f,%.1f ", x(st[k, j]), y(ls[k, j])
        printf "\"/>\n<line x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"3\"/><text x=\"%d\" y=\"%d\">%s</text>\n", W - R + 12, W - R + 36, T + 20 * k, T + 20 * k, col[k], W - R + 42, T + 20 * k + 4, name[k]
      }
      printf "</svg>\n" }' > $OUT.svg.tmp && mv $OUT.svg.tmp test/out/layouts.svg
echo "plot: test/out/layouts.svg"
