#!/bin/sh
# test/test_docs.sh: the README and docs/ say what the program does.
#   1. docs/cli.md's --help block is ./train --help (args.c's one table), byte for byte;
#   2. every flag any page names exists (train's table, or the planner's in plan.c, or
#      another program's on the list below), and every planner flag is in docs/cli.md;
#   3. every relative link in README.md and docs/*.md resolves to a file;
#   4. the committed schedule figure equals a fresh one (make docs remakes it);
#   5. the README's reading order: each file exists, defines the function named, and
#      the test named exists;
#   6. every `sh` block of README.md and docs/*.md runs and exits 0, in a scratch
#      directory, with --steps above 10 cut to 3 (training commands at a few steps),
#      unless its first line is "# needs: ..." (a GPU, a download, a cluster, a
#      benchmark's time), which is reported as a SKIP;
#   7. docs/files.md's table names every file git tracks outside test/, bench/, fuzz/ and
#      docs/, and every top-level folder (`folder/`); and each name there exists.
. "$(dirname "$0")/lib.sh"
t_init docs
t_need_python3 "docs" "to read the markdown"

ROOT=$(pwd)
# 1. the --help block
./train --help > $OUT/help.txt
awk '/^<!-- begin: .\/train --help -->$/ { on = 1; next } /^<!-- end: .\/train --help -->$/ { on = 0 }
     on && !/^```$/' docs/cli.md > $OUT/help_doc.txt
if cmp -s $OUT/help.txt $OUT/help_doc.txt; then ok "docs/cli.md's --help block is ./train --help ($(wc -l < $OUT/help.txt) lines)"
else bad "docs/cli.md's --help block differs from ./train --help (make docs): $(diff $OUT/help_doc.txt $OUT/help.txt | head -n 3 | tr '\n' ' ')"; fi

# 2. flags: train's (from --help, made from args.c's table) and the planner's (plan.c's options)
grep -o -- '--[a-z][a-z0-9-]*' $OUT/help.txt | sort -u > $OUT/train_flags.txt
sed -n '/static const struct option opts\[\] = {/,/{0, 0, 0, 0}/p' plan.c | grep -o '{"[a-z0-9-]*"' |
    sed 's/{"/--/; s/"//' | sort -u > $OUT/plan_flags.txt
# flags of other programs that the pages show (sbatch, srun, torchrun, make, duplicates; test_comm's --nccl;
# the CPU benchmarks' --cpu-clock, bench_ops' --cold, bench_gemm's --rounds and --split, gemm_ab.sh's --splits and --flags,
# perf report's --sort)
cat > $OUT/foreign_flags.txt <<'EOF'
--signal
--open-mode
--requeue
--kill-on-bad-exit
--ntasks-per-node
--gpus-per-node
--nnodes
--nproc-per-node
--node-rank
--master-addr
--master-port
--no-python
--no-print-directory
--change
--ntasks
--gpus-per-task
--nccl
--cpu-clock
--cold
--rounds
--split
--splits
--flags
--sort
EOF
sort -u $OUT/train_flags.txt $OUT/plan_flags.txt $OUT/foreign_flags.txt > $OUT/known_flags.txt
grep -o -h -- '--[a-z][a-z0-9-]*' README.md docs/*.md | sort -u > $OUT/doc_flags.txt
unknown=$(comm -23 $OUT/doc_flags.txt $OUT/known_flags.txt | tr '\n' ' ')
if [ -z "$unknown" ]; then ok "every flag the README and docs name exists ($(wc -l < $OUT/doc_flags.txt) flags)"
else bad "flags named in the docs that train does not accept: $unknown"; fi
grep -o -- '--[a-z][a-z0-9-]*' docs/cli.md | sort -u > $OUT/cli_flags.txt
missing=$(comm -23 $OUT/plan_flags.txt $OUT/cli_flags.txt | tr '\n' ' ')
if [ -z "$missing" ]; then ok "every planner flag ($(wc -l < $OUT/plan_flags.txt)) is in docs/cli.md"
else bad "planner flags missing from docs/cli.md: $missing"; fi
# every flag of the table is accepted by the parser (the table makes getopt's options: a
# flag that reached --help but not the parser would say "unknown flag")
rejected=""
for f in $(cat $OUT/train_flags.txt); do
    [ "$f" = --help ] || [ "$f" = --version ] || [ "$f" = --plan ] && continue
    (cd $OUT && $ROOT/train $f x 2>&1) | grep -q "unknown flag $f" && rejected="$rejected $f"
done
if [ -z "$rejected" ]; then ok "every flag of --help is accepted by the parser"
else bad "flags in --help the parser refuses:$rejected"; fi

# 3. relative links
python3 - README.md docs/*.md > $OUT/links.txt 2>&1 <<'PY'
import os, re, sys
bad, n = [], 0
for f in sys.argv[1:]:
    text = re.sub(r'```.*?```', '', open(f).read(), flags=re.S)
    for m in re.finditer(r'\]\(([^)\s]+)\)', text):
        url = m.group(1)
        if re.match(r'[a-z]+://', url) or url.startswith('mailto:'): continue
        path = url.split('#')[0]
        if not path: continue
        n += 1
        if not os.path.exists(os.path.normpath(os.path.join(os.path.dirname(f), path))): bad.append(f + ': ' + url)
print(n, len(bad))
for b in bad: print(b)
PY
read nlinks nbad < $OUT/links.txt
if [ "$nbad" = 0 ]; then ok "every relative link in README.md and docs/ resolves ($nlinks links)"
else bad "links that do not resolve: $(tail -n +2 $OUT/links.txt | tr '\n' ' ')"; fi

# 4. the schedule figure
./train --show-schedule --pp 4 --micro-batches 8 --schedule 1f1b --schedule-svg $OUT/schedule.svg > /dev/null
if cmp -s $OUT/schedule.svg docs/schedule-1f1b.svg; then ok "docs/schedule-1f1b.svg equals a fresh drawing"
else bad "docs/schedule-1f1b.svg is stale: run make docs"; fi
./train --show-schedule --cp 4 --seq 64 --schedule-svg $OUT/ring.svg > /dev/null
if cmp -s $OUT/ring.svg docs/ring-cp4.svg; then ok "docs/ring-cp4.svg equals a fresh drawing"
else bad "docs/ring-cp4.svg is stale: run make docs"; fi

# 5. the reading order
python3 - > $OUT/order.txt 2>&1 <<'PY'
import os, re
rows, bad = 0, []
for line in open('README.md'):
    cells = [c.strip() for c in line.strip().strip('|').split('|')]
    if len(cells) != 4 or not cells[1].startswith('`'): continue
    f, fn, t = (c.strip('`') for c in cells[1:])
    rows += 1
    if not os.path.exists(f): bad.append('no file ' + f); continue
    if not re.search(r'\b%s\b' % re.escape(fn), open(f).read()): bad.append('%s defines no %s' % (f, fn))
    if not os.path.exists(t): bad.append('no test ' + t)
print(rows, len(bad))
for b in bad: print(b)
PY
read nrows nbad < $OUT/order.txt
if [ "$nrows" -ge 15 ] && [ "$nbad" = 0 ]; then ok "the reading order: $nrows rows, every file, function and test exists"
else bad "the reading order ($nrows rows): $(tail -n +2 $OUT/order.txt | tr '\n' ' ')"; fi

# 6. every sh block, in a scratch directory
python3 - README.md docs/*.md > $OUT/all_blocks.sh.txt <<'PY'
import re, sys
n = 0
for f in sys.argv[1:]:
    for m in re.finditer(r'```sh\n(.*?)```', open(f).read(), re.S):
        body = m.group(1)
        n += 1
        first = body.split('\n', 1)[0]
        need = first[len('# needs:'):].strip() if first.startswith('# needs:') else ''
        body = re.sub(r'--steps (\d+)', lambda s: '--steps ' + (s.group(1) if int(s.group(1)) <= 10 else '3'), body)
        print('@@ %s %d %s' % (f, n, need))
        print(body, end='')
PY
RUN=$OUT/run
rm -rf $RUN && mkdir -p $RUN/data
for f in train corpus test tools; do ln -s $ROOT/$f $RUN/$f; done
for f in data/tinyshakespeare_train.txt data/tinyshakespeare_val.txt data/tinyshakespeare.txt; do
    [ -f $f ] || make --no-print-directory $f > /dev/null
    ln -s $ROOT/$f $RUN/$f
done
awk -v dir=$OUT '/^@@ /{ n++; f = dir "/block" n ".txt"; print > f; next } { print > f }' $OUT/all_blocks.sh.txt
for b in $OUT/block*.txt; do
    head=$(head -n 1 $b)
    set -- $head
    where="$2 block $3"
    shift 3
    if [ $# -gt 0 ]; then echo "SKIP $where: needs $*"; continue; fi
    tail -n +2 $b > $b.sh
    if (cd $RUN && timeout 300 sh -e $b.sh > $b.log 2>&1); then ok "$where runs ($(grep -c . $b.sh) lines)"
    else bad "$where: exit $?: $(tail -n 2 $b.log | tr '\n' ' ')"; fi
done

# 7. docs/files.md against git ls-files: a file added without its row fails here
if git ls-files > $OUT/tracked.txt 2> /dev/null && [ -s $OUT/tracked.txt ]; then
    python3 - docs/files.md $OUT/tracked.txt > $OUT/files_md.txt 2>&1 <<'PY'
import os, re, sys
named = set()  # the backquoted names of the table's first column
for line in open(sys.argv[1]):
    if line.startswith('| `'):
        named.update(re.findall(r'`([^`]+)`', line.strip().strip('|').split('|')[0]))
want = set()
for f in (l.rstrip('\n') for l in open(sys.argv[2])):
    if not f or not os.path.exists(f): continue  # deleted in the working tree
    top = f.split('/')[0]
    if '/' in f: want.add(top + '/')
    if top not in ('test', 'bench', 'fuzz', 'docs'): want.add(f)
missing = sorted(want - named)
stale = sorted(n for n in named if not os.path.exists(n))
print(len(want), len(missing), len(stale))
for m in missing: print('no row for ' + m)
for s in stale: print('a row for ' + s + ', which does not exist')
PY
    read nwant nmiss nstale < $OUT/files_md.txt
    if [ "$nmiss" = 0 ] && [ "$nstale" = 0 ]; then
        ok "docs/files.md names every tracked file outside test/, bench/, fuzz/, docs/ and every top-level folder ($nwant names)"
    else bad "docs/files.md: $(tail -n +2 $OUT/files_md.txt | tr '\n' ';' | sed 's/;$//; s/;/; /g')"; fi
else
    echo "SKIP docs/files.md against git ls-files: not a git checkout"
fi

t_end docs
