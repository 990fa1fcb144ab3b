#!/bin/sh
# test/test_schedule_svg.sh: --show-schedule's SVG (plot.c's
# plot_schedule_svg, fed pp_sched.c's timeline). For P = 2, 4 stages and
# M = 4, 8 micro-batches under naive, gpipe, 1f1b, interleaved (--virtual
# 2), zb-h1 and zb-h2, a tiny CPU pipeline runs one step with
# --show-schedule --schedule-svg FILE; the SVG must parse as XML, its boxes
# (<rect class="slot">, data-stage/-slot/-kind/-micro/-chunk) must be
# exactly the filled cells of the text figure the same run printed ("F3",
# "B3", "W3", "F3.1" = micro-batch 3 on chunk 1), its title must carry the
# printed title and bubble lines, and it must mark one send per exchange
# by pp_sched.h's dependencies: 2(VP-1)M lines, F to the next stage (the
# last stage's to stage 0's next chunk), B to the one before (stage 0's to
# the last stage's previous chunk), none after W. A schedule that ./train
# does not run yet is a SKIP, not a FAIL. Without --schedule-svg the
# picture goes to schedule.svg; an output that cannot be written is refused
# before any work (exit 2). One is rendered to PNG with rsvg-convert where
# installed (test/out/schedule_svg/schedule.png).
cd "$(dirname "$0")/.." || exit 2
. test/lib.sh
t_init schedule_svg
t_need_python3 "schedule svg" "to parse the SVG"
MODEL="--device cpu --data test/fixtures/ref_tokens.bin --layers 4 --heads 4 --dim 32 --max-seq 16 --vocab 61 --seq 8 --batch 1 --steps 1"

for P in 2 4; do
    for M in 4 8; do
        for S in naive gpipe 1f1b interleaved zb-h1 zb-h2; do
            V=1
            EXTRA=""
            # interleaved: P x V chunks of layers (4 layers cannot make P 4 x V 2 = 8 chunks)
            if [ $S = interleaved ]; then V=2; EXTRA="--virtual 2 --layers $((P * 2))"; fi
            name="P $P, M $M, $S"
            [ $V -gt 1 ] && name="$name, V $V"
            svg=$OUT/p${P}_m${M}_$S.svg
            log=$OUT/p${P}_m${M}_$S.log
            timeout 120 ./train $MODEL --ranks $P --pp $P --schedule $S $EXTRA --micro-batches $M \
                --show-schedule --schedule-svg $svg > $log 2>&1
            rc=$?
            if [ $rc -ne 0 ]; then
                case $S in
                interleaved|zb-h1|zb-h2)
                    if grep -q -i -e "not built yet" -e "unknown flag" -e "unrecognized" -e "no $S schedule" $log; then
                        echo "SKIP $name: not supported by ./train yet (exit $rc: $(grep -i -m 1 -e "not built yet" -e "unknown flag" -e "unrecognized" -e "no $S schedule" $log))"
                        continue
                    fi ;;
                esac
                bad "$name: train exited $rc: $(tail -n 2 $log)"
                continue
            fi
            if python3 - $svg $log $P $M $S $V > $OUT/check.txt 2>&1 <<'PY'
import re, sys, xml.etree.ElementTree as E
svg, log, P, M, sched, V = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], int(sys.argv[6])
split = sched.startswith("zb-")
ns = "{http://www.w3.org/2000/svg}"
root = E.parse(svg).getroot()
lines = open(log).read().splitlines()
# the text figure: "stage s |F0|  |B0|W0|F3.1|..." rows under the title line
want, bubble, title = set(), None, None
for l in lines:
    if l.startswith(sched + " schedule: P = %d stages, M = %d micro-batches" % (P, M)): title = l
    if l.startswith("stage ") and "|" in l:
        cells = l.split("|")
        s = int(cells[0].split()[1])
        for t, c in enumerate(cells[1:-1]):
            c = c.strip()
            if not c: continue
            g = re.fullmatch(r"([FBW])(\d+)(?:\.(\d+))?", c)
            assert g, "cell %r" % c
            want.add((s, t, g.group(1), int(g.group(2)), int(g.group(3) or 0)))
    if l.startswith("bubble: "): bubble = l
assert title and bubble and want, "no text figure in the log"
got = [(int(r.get("data-stage")), int(r.get("data-slot")), r.get("data-kind"), int(r.get("data-micro")),
        int(r.get("data-chunk", "0"))) for r in root.iter(ns + "rect") if r.get("class") == "slot"]
assert len(got) == len(set(got)), "a box twice"
assert set(got) == want, "boxes differ from the text: missing %s, extra %s" % (sorted(want - set(got))[:4], sorted(set(got) - want)[:4])
n = (3 if split else 2) * P * M * V
assert len(want) == n, "%d cells, not %d" % (len(want), n)
texts = ["".join(t.itertext()) for t in root.iter(ns + "text")]
assert title in texts, "title %r not in the SVG" % title
assert bubble in texts, "bubble line %r not in the SVG" % bubble
sends = [l for l in root.iter(ns + "line") if l.get("class") == "send"]
assert len(sends) == 2 * (V * P - 1) * M, "%d sends, not 2(VP-1)M = %d" % (len(sends), 2 * (V * P - 1) * M)
cell = {(s, k, c, m): t for s, t, k, m, c in want}
wraps = 0
for l in sends:
    k, m, a, b = l.get("data-kind"), int(l.get("data-micro")), int(l.get("data-from")), int(l.get("data-to"))
    c, rc = int(l.get("data-chunk", "0")), int(l.get("data-recv-chunk", "0"))
    if k == "F": step = (b == a + 1 and rc == c) or (a == P - 1 and b == 0 and rc == c + 1)
    else: step = (b == a - 1 and rc == c) or (a == 0 and b == P - 1 and rc == c - 1)
    assert step, "send %s%d.%d from %d to %d (chunk %d)" % (k, m, c, a, b, rc)
    wraps += rc != c
    assert int(l.get("data-slot")) == cell[(a, k, c, m)] < int(l.get("data-recv-slot")) == cell[(b, k, rc, m)], "send %s%d slots" % (k, m)
print("%d boxes, %d sends (%d wrapping), %s" % (len(got), len(sends), wraps, bubble))
PY
            then ok "$name: $(cat $OUT/check.txt)"
            else bad "$name: $(tail -n 1 $OUT/check.txt)"; fi
        done
    done
done

# the default path, in the working directory
mkdir -p $OUT/cwd
(cd $OUT/cwd && timeout 120 ../../../../train $(echo "$MODEL" | sed 's|test/fixtures|../../../fixtures|') \
    --ranks 2 --pp 2 --schedule gpipe --micro-batches 4 --show-schedule > run.log 2>&1)
rc=$?
if [ $rc -eq 0 ] && python3 -c 'import sys, xml.etree.ElementTree as E; E.parse(sys.argv[1])' $OUT/cwd/schedule.svg 2>/dev/null
then ok "--show-schedule alone writes schedule.svg"
else bad "--show-schedule alone: exit $rc, schedule.svg $(ls $OUT/cwd/schedule.svg 2>&1)"; fi

# refused up front
./train $MODEL --show-schedule --schedule-svg $OUT/no/such/dir/s.svg > $OUT/refused.log 2>&1
rc=$?
if [ $rc -eq 2 ] && grep -q -- "--schedule-svg" $OUT/refused.log && ! grep -q '^step ' $OUT/refused.log
then ok "an unwritable --schedule-svg is refused before any work (exit 2)"
else bad "unwritable --schedule-svg: exit $rc: $(tail -n 1 $OUT/refused.log)"; fi

t_render $OUT/p4_m8_1f1b.svg $OUT/schedule.png "the 1f1b P 4 M 8 picture"
t_end "schedule svg"
