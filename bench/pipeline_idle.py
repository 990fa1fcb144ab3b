# bench/pipeline_idle.py TRACE P M SCHEDULE [V]: one row of make bench-pipeline.
# Per stage and step (steps end with the "optimizer" span; the first is not
# counted), idle = 1 - compute / window, where window runs from the step's
# first forward on any stage to its last backward or weight gradient on any
# stage, and compute is the stage's forward, backward and weight-gradient
# spans less the comm spans inside them. Beside it, the schedule's bubble in
# unit slots, as pp_sched.c's pp_bubble_formula gives it.
import json, sys

path, P, M, sched = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
V = int(sys.argv[5]) if len(sys.argv) > 5 else 1
COMPUTE = ("forward", "backward", "weight", "wgrad")
events = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
by_rank = {}
for e in events:
    by_rank.setdefault(e["pid"], []).append(e)
steps = {}  # step -> rank -> (first start, last end, compute)
for rank, evs in by_rank.items():
    evs.sort(key=lambda e: e["ts"])
    step, comm = 0, []
    for e in evs:
        if e["name"] == "optimizer":
            step += 1
            continue
        if e["cat"] == "comm":
            comm.append(e)
            continue
        if e["cat"] not in COMPUTE:
            continue
        s = steps.setdefault(step, {}).setdefault(rank, [e["ts"], e["ts"], 0.0])
        inside = sum(c["dur"] for c in comm if c["ts"] >= e["ts"] and c["ts"] + c["dur"] <= e["ts"] + e["dur"])
        s[0] = min(s[0], e["ts"]); s[1] = max(s[1], e["ts"] + e["dur"]); s[2] += e["dur"] - inside
idle = [[] for _ in range(P)]
for step, ranks in steps.items():
    if step == 0 or len(ranks) < P:
        continue
    t0 = min(v[0] for v in ranks.values()); t1 = max(v[1] for v in ranks.values())
    for rank, v in ranks.items():
        idle[rank].append(1 - v[2] / (t1 - t0))
per = [sum(x) / len(x) if x else float("nan") for x in idle]


def formula():
    """pp_bubble_formula: the idle fraction of the unit-slot timeline."""
    if sched == "naive":
        return "(P-1)/P", (P - 1) / P
    if sched == "interleaved":
        return "(P-1)/(VM+P-1)", (P - 1) / (V * M + P - 1)
    if sched in ("zb-h1", "zb-h2"):
        if M >= P:
            return "(P-1)/(3M+P-1)", (P - 1) / (3 * M + P - 1)
        return "(2P-M-1)/(2M+2P-1)", (2 * P - M - 1) / (2 * M + 2 * P - 1)
    return "(P-1)/(M+P-1)", (P - 1) / (M + P - 1)


text, value = formula()
label = sched + (" V=%d" % V if V > 1 else "")
print("%-16s %4d %-26s %s  mean %.3f" % (label, M, "%s = %.3f" % (text, value), " ".join("%.3f" % v for v in per),
                                         sum(per) / P))
