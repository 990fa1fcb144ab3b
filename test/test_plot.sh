#!/bin/sh
# test/test_plot.sh: --plot FILE.svg (plot.c) and the step line's elapsed
# time, ETA and closing summary. A small byte-level CPU run with validation
# every 25 steps writes a plot; while it runs, the file is read whenever it
# is there and must parse as XML every time (it is replaced whole by a
# rename, never written in place). At the end the SVG must hold a point for
# every step line the run printed, with the same loss (data-loss), and one
# for every val loss line; the summary must name the plot and agree with the
# last step's loss. An output path that cannot be written is refused before
# any work (exit 2). Where rsvg-convert is installed, the SVG is rendered to
# PNG (test/out/plot.png, to look at).
cd "$(dirname "$0")/.." || exit 2
. test/lib.sh
t_init plot
t_need_python3 plot "to parse the SVG"
head -c 200000 README.md Makefile *.c > $OUT/text.txt 2>/dev/null
head -c 20000 DESIGN.md README.md > $OUT/val.txt 2>/dev/null

./train --device cpu --data $OUT/text.txt --val $OUT/val.txt --val-every 25 --val-batches 2 \
        --layers 2 --heads 2 --dim 64 --batch 8 --seq 32 --steps 150 --lr 3e-3 --threads 1 \
        --plot $OUT/plot.svg > $OUT/run.log 2>&1 &
pid=$!
reads=0
parsed=0
while kill -0 $pid 2>/dev/null; do
    if [ -f $OUT/plot.svg ]; then
        reads=$((reads + 1))
        python3 -c 'import sys, xml.etree.ElementTree as E; E.parse(sys.argv[1])' $OUT/plot.svg 2>> $OUT/midrun.err &&
            parsed=$((parsed + 1))
    fi
    sleep 0.05
done
wait $pid
rc=$?
[ $rc -eq 0 ] && ok "train --plot exited 0" || bad "train --plot exited $rc: $(tail -n 2 $OUT/run.log)"
if [ $reads -gt 0 ] && [ $parsed -eq $reads ]; then ok "read mid-run $reads times: every read parsed as XML"
elif [ $reads -eq 0 ]; then echo "SKIP mid-run reads: the run ended before the plot was first seen"
else bad "mid-run: $parsed of $reads reads parsed: $(head -n 1 $OUT/midrun.err)"; fi
ls $OUT/plot.svg.tmp.* > /dev/null 2>&1 && bad "a temporary file was left beside the plot"

grep -a '^step \|^val loss ' $OUT/run.log > $OUT/printed.txt
python3 - $OUT/plot.svg $OUT/printed.txt > $OUT/check.txt 2>&1 <<'EOF'
import sys, xml.etree.ElementTree as E
svg, printed = sys.argv[1], sys.argv[2]
ns = "{http://www.w3.org/2000/svg}"
root = E.parse(svg).getroot()
groups = {g.get("class"): g for g in root.iter(ns + "g") if g.get("class")}
train = {int(c.get("data-step")): float(c.get("data-loss")) for c in groups["train"].iter(ns + "circle")}
val = [(int(c.get("data-step")), float(c.get("data-loss"))) for c in groups["val"].iter(ns + "circle")]
want_train, want_val, step = {}, [], 0
for line in open(printed):
    f = line.split()
    if f[0] == "step":
        step = int(f[1].split("/")[0])
        want_train[step] = float(f[4])
    else:
        want_val.append((step, float(f[2])))
bad = [s for s in want_train if s not in train or abs(train[s] - want_train[s]) > 1e-6 * abs(want_train[s])]
print("train", len(want_train), len(train), len(bad))
vbad = len(want_val) != len(val) or any(a[0] != b[0] or abs(a[1] - b[1]) > 1e-6 * abs(a[1]) for a, b in zip(want_val, val))
print("val", len(want_val), len(val), int(vbad))
EOF
read -r _ nprint nplot nbad < $OUT/check.txt 2>/dev/null
if [ "${nprint:-0}" -gt 0 ] && [ "$nprint" = "$nplot" ] && [ "$nbad" = 0 ]; then
    ok "the SVG parses and holds every printed step's loss ($nprint step lines, $nplot points, all equal)"
else bad "train points: $(head -n 3 $OUT/check.txt | tr '\n' ' ')"; fi
vline=$(grep '^val' $OUT/check.txt)
set -- $vline
if [ "$#" -eq 4 ] && [ "$2" -gt 0 ] && [ "$2" = "$3" ] && [ "$4" = 0 ]; then
    ok "and every val loss ($2 points at the printed steps and values)"
else bad "val points: '$vline'"; fi

last=$(grep '^step 150/150' $OUT/run.log)
if echo "$last" | grep -q ' | elapsed [0-9.hms]* | eta 0.0s$'; then ok "the last step line ends with elapsed and eta 0.0s: ...${last##*tok/s}"
else bad "last step line: $last"; fi
if grep -q "^summary: 150 steps, 38400 tokens in .*, mean [0-9]* tok/s" $OUT/run.log &&
   grep -q "^summary: .*plot $OUT/plot.svg" $OUT/run.log &&
   grep -q "^summary: final train loss $(echo "$last" | awk '{printf "%.4f", $5}'), val loss [0-9.]*$" $OUT/run.log; then
    ok "summary: $(grep '^summary' $OUT/run.log | tr '\n' ' ')"
else bad "summary: $(grep '^summary' $OUT/run.log | tr '\n' ' ')"; fi

./train --device cpu --data $OUT/text.txt --steps 1 --plot $OUT/no/such/dir/plot.svg > $OUT/refused.log 2>&1
rc=$?
if [ $rc -eq 2 ] && ! grep -q '^step' $OUT/refused.log && grep -q -- '--plot' $OUT/refused.log; then
    ok "an unwritable --plot path is refused before any work: $(head -n 1 $OUT/refused.log)"
else bad "unwritable --plot: exit $rc: $(head -n 2 $OUT/refused.log | tr '\n' ' ')"; fi

t_render $OUT/plot.svg test/out/plot.png "the loss plot"
t_summary plot
exit 0
