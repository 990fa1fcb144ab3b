#!/bin/sh
# test/test_trace_svg.sh: the measured timeline --trace draws beside the
# trace (trace.c; trace.h describes the picture). Tiny CPU runs with
# --trace: a 4-stage 1F1B pipeline, ZB-H1 (W spans) and interleaved
# (F3c1 spans) where this build has them, a dp run with a trace path not
# ending in .json, and a run long enough to pass the 4000-box cap. For each:
# the JSON still parses and keeps the Trace Event Format Perfetto and
# chrome://tracing load (pid, tid, ph "X", numeric ts and dur), the SVG
# parses as XML; every complete event of the JSON is exactly one
# <rect class="span"> with the same rank, name, ts and dur (compared as
# exact decimals), and nothing else is; the F/B(/W) spans are 2M (3M) a
# rank and step and carry their micro-batch (and chunk) in data-; boxes of
# one rank, lane and depth do not overlap, in time or on the page; one row
# a rank; each row's idle fraction equals the one recomputed from the JSON
# and the title prints it. Then: past the cap the earliest 4000 spans are
# drawn and the title says so; an unwritable --trace is refused before any
# work (exit 2) with one line and no picture. The pipeline's SVG is
# rendered to PNG with rsvg-convert where installed
# (test/out/trace_svg/pipeline.png, to look at).
cd "$(dirname "$0")/.." || exit 2
. test/lib.sh
t_init trace_svg
t_need_python3 "trace svg" "to parse the SVG"
MODEL="--device cpu --data test/fixtures/ref_tokens.bin --layers 4 --heads 4 --dim 32 --max-seq 16 --vocab 61 --seq 8 --batch 1"

cat > $OUT/check.py <<'PY'
# check.py TRACE SVG RANKS STEPS M KINDS LOG: prints one line of what held, or fails.
import json, re, sys, xml.etree.ElementTree as E
from decimal import Decimal
trace, svg, ranks, steps, M, kinds, log = sys.argv[1:8]
ranks, steps, M = int(ranks), int(steps), int(M)
ns = "{http://www.w3.org/2000/svg}"
doc = json.load(open(trace), parse_float=Decimal)
ev = doc["traceEvents"]
xs = [e for e in ev if e.get("ph") == "X"]
for e in xs:   # what Perfetto and chrome://tracing need of a complete event
    assert isinstance(e["name"], str) and isinstance(e["pid"], int) and e["tid"] in (0, 1), e
    assert isinstance(e["ts"], Decimal) and isinstance(e["dur"], Decimal) and e["dur"] >= 0, e
assert {e["pid"] for e in ev} == set(range(ranks)), "pids %s" % sorted({e["pid"] for e in ev})
root = E.parse(svg).getroot()
boxes = [r for r in root.iter(ns + "rect") if r.get("class") == "span"]
want = sorted((e["pid"], e["name"], e["ts"], e["dur"]) for e in xs)
got = sorted((int(b.get("data-rank")), b.get("data-name"), Decimal(b.get("data-ts")), Decimal(b.get("data-dur")))
             for b in boxes)
assert int(root.get("data-spans")) == len(xs), "data-spans %s, JSON %d" % (root.get("data-spans"), len(xs))
assert len(xs) <= int(root.get("data-cap")), "past the cap: see the cap run"
assert got == want, "boxes differ from the JSON's events: missing %s, extra %s" % (
    sorted(set(want) - set(got))[:3], sorted(set(got) - set(want))[:3])
# the micro-batch spans: F, B (W) of every micro-batch once a step on every rank
pat = re.compile(r"^([FBW])(\d+)(?:c(\d+))?$")
counts = {}
for b in boxes:
    m = pat.match(b.get("data-name"))
    if not m or b.get("data-lane") != "compute":
        assert b.get("data-kind") is None, "kind on %s" % b.get("data-name")
        continue
    assert (b.get("data-kind"), int(b.get("data-micro")), int(b.get("data-chunk"))) == \
        (m.group(1), int(m.group(2)), int(m.group(3) or -1)), "data- of %s" % b.get("data-name")
    counts[b.get("data-rank")] = counts.get(b.get("data-rank"), 0) + 1
if kinds != "-":
    letters = kinds.replace("c", "")
    per = len(letters) * M * steps * (2 if "c" in kinds else 1)   # --virtual 2: two chunks
    assert all(counts.get(str(r), 0) == per for r in range(ranks)), "micro-batch spans a rank %s, want %d" % (counts, per)
    assert {b.get("data-kind") for b in boxes if b.get("data-kind")} == set(letters), "kinds"
    if "c" in kinds:
        assert {b.get("data-chunk") for b in boxes if b.get("data-kind")} == {"0", "1"}, "chunks"
# no overlap within a rank's lane at one depth: in time, and on the page
lanes = {}
for b in boxes:
    key = (b.get("data-rank"), b.get("data-lane"), b.get("data-depth"))
    lanes.setdefault(key, []).append((Decimal(b.get("data-ts")), Decimal(b.get("data-dur")),
                                      float(b.get("x")), float(b.get("width"))))
for key, bs in lanes.items():
    bs.sort()
    for a, c in zip(bs, bs[1:]):
        assert a[0] + a[1] <= c[0], "%s overlap in time: %s, %s" % (key, a[:2], c[:2])
        assert a[2] + a[3] <= c[2] + 0.02, "%s overlap on the page: %s, %s" % (key, a[2:], c[2:])
# one row a rank, its idle fraction as recomputed from the JSON, printed in the title
rows = [g for g in root.iter(ns + "g") if g.get("class") == "rank"]
assert [int(g.get("data-rank")) for g in rows] == list(range(ranks)) == \
    list(range(int(root.get("data-ranks")))), "rows %s" % [g.get("data-rank") for g in rows]
texts = ["".join(t.itertext()) for t in root.iter(ns + "text")]
for r in range(ranks):
    assert "rank %d" % r in texts, "no label rank %d" % r
title = [t for t in texts if t.startswith("idle (")][0]
worst = 0
for g in rows:
    r = int(g.get("data-rank"))
    mine = sorted((e["ts"], e["ts"] + e["dur"], e["tid"]) for e in xs if e["pid"] == r)
    t0, t1 = mine[0][0], max(e[1] for e in mine)
    covered, to = Decimal(0), t0
    for s, e, tid in mine:
        if tid == 0 and e > to:
            covered += e - max(s, to)
            to = e
    idle = float(1 - covered / (t1 - t0))
    worst = max(worst, abs(idle - float(g.get("data-idle"))))
    assert abs(idle - float(g.get("data-idle"))) < 1e-5, "rank %d idle %s, JSON says %.6f" % (r, g.get("data-idle"), idle)
    if ranks <= 8:   # the title rounds to 0.1% what data-idle gives to 1e-6: equal within half a digit
        said = re.search(r"rank %d ([0-9.]+)%%" % r, title)
        assert said and abs(float(said.group(1)) - 100 * float(g.get("data-idle"))) <= 0.05 + 1e-4, "title %r" % title
out = open(log).read()
assert out.count("trace drawn in %s\n" % svg) == 1, "'trace drawn in %s' not printed once" % svg
print("%d spans = %d boxes, micro-batch spans a rank %s, %d lanes without overlap, %d rows, idle %s (JSON agrees to %.1g)"
      % (len(xs), len(boxes), sorted(set(counts.values())) or "none", len(lanes), len(rows),
         " ".join("%.3f" % float(g.get("data-idle")) for g in rows), worst))
PY

# run NAME RANKS STEPS M KINDS TRACE FLAGS...: a traced run and its checks
run() {
    name=$1 ranks=$2 steps=$3 M=$4 kinds=$5 trace=$6
    shift 6
    log=$OUT/$name.log
    timeout 300 ./train $MODEL --ranks $ranks --steps $steps --trace $trace "$@" > $log 2>&1
    rc=$?
    if [ $rc -ne 0 ]; then
        if grep -q "^error: --schedule must be\|unrecognized option\|--schedule must be" $log; then
            echo "SKIP $name: this build has no such schedule: $(grep -m1 schedule $log)"
        else bad "$name: train exited $rc: $(tail -n 2 $log | tr '\n' ' ')"; fi
        return
    fi
    svg=$(sed -n 's/^trace drawn in //p' $log)
    if python3 $OUT/check.py $trace "$svg" $ranks $steps $M $kinds $log > $OUT/$name.txt 2>&1
    then ok "$name: $(cat $OUT/$name.txt)"
    else bad "$name: $(tail -n 1 $OUT/$name.txt)"; fi
    if ls $trace.*.part $trace.tmp.* "$svg".tmp.* > /dev/null 2>&1; then bad "$name: a part or temporary left behind"; fi
}

run pipeline 4 2 4 FB $OUT/pipeline.json --pp 4 --micro-batches 4 --schedule 1f1b
if [ -f $OUT/pipeline.svg ]; then ok "trace pipeline.json drawn in pipeline.svg (.json replaced)"
else bad "no $OUT/pipeline.svg beside pipeline.json"; fi
run zb-h1 2 2 4 FBW $OUT/zb.json --pp 2 --micro-batches 4 --schedule zb-h1
run interleaved 2 2 4 FBc $OUT/inter.json --pp 2 --virtual 2 --micro-batches 4 --schedule interleaved
run dp 2 3 1 - $OUT/dp.trace --dp 2
if [ -f $OUT/dp.trace.svg ]; then ok "trace dp.trace drawn in dp.trace.svg (.svg appended)"
else bad "no $OUT/dp.trace.svg beside dp.trace"; fi

# past the cap: 80 steps of P 2, M 8 record some 4160 spans
timeout 300 ./train $MODEL --ranks 2 --pp 2 --micro-batches 8 --steps 80 --trace $OUT/big.json > $OUT/big.log 2>&1
rc=$?
if [ $rc -eq 0 ] && python3 - $OUT/big.json $OUT/big.svg > $OUT/big.txt 2>&1 <<'PY'
import json, sys, xml.etree.ElementTree as E
from decimal import Decimal
ns = "{http://www.w3.org/2000/svg}"
xs = [e for e in json.load(open(sys.argv[1]), parse_float=Decimal)["traceEvents"] if e["ph"] == "X"]
root = E.parse(sys.argv[2]).getroot()
cap, drawn = int(root.get("data-cap")), int(root.get("data-drawn"))
boxes = [r for r in root.iter(ns + "rect") if r.get("class") == "span"]
assert len(xs) > cap, "only %d spans: no cut to check" % len(xs)
assert int(root.get("data-spans")) == len(xs) and drawn == cap == len(boxes), "drawn %d, cap %d, boxes %d" % (drawn, cap, len(boxes))
got = {(int(b.get("data-rank")), b.get("data-name"), Decimal(b.get("data-ts"))) for b in boxes}
left = [e for e in xs if (e["pid"], e["name"], e["ts"]) not in got]
assert len(left) == len(xs) - cap, "%d left out" % len(left)
last = max(Decimal(b.get("data-ts")) for b in boxes)
assert all(e["ts"] >= last for e in left), "a later span drawn before an earlier one"
cut = [("".join(t.itertext())) for t in root.iter(ns + "text") if t.get("class") == "cut"]
assert cut and ("first %d of %d spans" % (cap, len(xs))) in cut[0], "no cut line: %s" % cut
print("%d spans, the earliest %d drawn; the title: %s" % (len(xs), cap, cut[0]))
PY
then ok "cap: $(cat $OUT/big.txt)"
else bad "cap: exit $rc: $(tail -n 1 $OUT/big.txt 2>/dev/null) $(tail -n 1 $OUT/big.log)"; fi

# refused up front, as before the timeline
./train $MODEL --steps 1 --ranks 2 --pp 2 --trace $OUT/no/such/dir/t.json > $OUT/refused.log 2>&1
rc=$?
if [ $rc -eq 2 ] && [ "$(wc -l < $OUT/refused.log)" -eq 1 ] && grep -q -- "--trace" $OUT/refused.log &&
   ! ls $OUT/no > /dev/null 2>&1
then ok "an unwritable --trace is refused before any work (exit 2): $(cat $OUT/refused.log)"
else bad "unwritable --trace: exit $rc: $(head -n 2 $OUT/refused.log | tr '\n' ' ')"; fi

t_render $OUT/pipeline.svg $OUT/pipeline.png "the 1f1b P 4 M 4 timeline"
t_end "trace svg"
