#!/bin/sh
# tools/make_docs.sh (make docs): what the docs show that the program makes.
#   docs/cli.md's --help block       exact: ./train --help (test/test_docs.sh compares)
#   docs/schedule-1f1b.svg           exact: the 1F1B schedule, P 4, M 8 (test/test_docs.sh compares)
#   docs/ring-cp4.svg                exact: context parallelism's ring, cp 4, 64 tokens (compared too)
# and with --figures (make docs FIGURES=1) the two illustrations, which change on every run:
#   docs/loss.svg                    a short CPU run's loss curve (timing-free, but it moves
#                                    with any change to the arithmetic)
#   docs/trace.svg                   a measured trace of 4 CPU ranks in a 1F1B pipeline (its
#                                    widths are this machine's timings)
cd "$(dirname "$0")/.." || exit 2
set -e
case "${1:-}" in
    "") figures=0 ;;
    --figures) figures=1 ;;
    *) echo "usage: tools/make_docs.sh [--figures]" >&2; exit 2 ;;
esac
tmp=docs/.cli.md.$$
awk -v help="$(./train --help)" '
    /^<!-- begin: .\/train --help -->$/ { print; print "```"; print help; print "```"; skip = 1; next }
    /^<!-- end: .\/train --help -->$/ { skip = 0 }
    !skip { print }' docs/cli.md > $tmp
mv $tmp docs/cli.md
./train --show-schedule --pp 4 --micro-batches 8 --schedule 1f1b --schedule-svg docs/schedule-1f1b.svg > /dev/null
./train --show-schedule --cp 4 --seq 64 --schedule-svg docs/ring-cp4.svg > /dev/null
if [ $figures = 0 ]; then
    echo "docs: docs/cli.md (--help), docs/schedule-1f1b.svg, docs/ring-cp4.svg (--figures also redraws docs/loss.svg, docs/trace.svg)"
    exit 0
fi
./train --data data/tinyshakespeare_train.txt --val data/tinyshakespeare_val.txt --val-every 50 \
    --device cpu --layers 4 --heads 4 --dim 128 --batch 16 --seq 64 --steps 300 --lr 3e-3 --lr-min 3e-4 \
    --warmup 30 --beta2 0.99 --plot docs/loss.svg > /dev/null
./train --data data/tinyshakespeare_train.txt --device cpu --layers 4 --heads 4 --dim 128 --batch 8 --seq 64 \
    --steps 3 --ranks 4 --pp 4 --micro-batches 8 --schedule 1f1b --trace docs/.trace.json > /dev/null
mv docs/.trace.svg docs/trace.svg
rm -f docs/.trace.json
echo "docs: docs/cli.md (--help), docs/schedule-1f1b.svg, docs/ring-cp4.svg, docs/loss.svg, docs/trace.svg"
