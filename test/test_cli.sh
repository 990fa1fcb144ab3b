#!/bin/sh
# test/test_cli.sh: the command line. Bad flags, layouts and files each give
# one line on stderr naming the problem, exit status 2 and nothing written;
# good ones train, save and load. Run from the repository root.
T=./train
OUT=test/out/cli
FIX=test/fixtures
mkdir -p $OUT
rm -f $OUT/*
DATA=$FIX/ref_tokens.bin
SAVE=$OUT/never_written.bin
# small but valid model flags, so each case breaks exactly one rule
SMALL="--layers 1 --heads 2 --dim 8 --max-seq 16 --batch 2 --seq 8 --steps 2 --device cpu"

pass=0
# bad NAME EXPECTED_TEXT ARGS...: exit 2, one stderr line containing the text, no file written
bad() {
    name=$1; want=$2; shift 2
    "$T" "$@" > $OUT/stdout 2> $OUT/stderr
    rc=$?
    lines=$(wc -l < $OUT/stderr)
    msg=$(head -n 1 $OUT/stderr)
    if [ $rc -eq 2 ] && [ "$lines" -eq 1 ] && grep -qF -- "$want" $OUT/stderr && [ ! -e $SAVE ] && [ ! -e $SAVE.tmp ]; then
        echo "PASS bad input: $name: exit $rc, \"$msg\""
    else
        echo "FAIL bad input: $name: exit $rc, $lines stderr lines, \"$msg\" (want exit 2 and \"$want\"; saved file exists: $([ -e $SAVE ] && echo yes || echo no))"
    fi
}

bad "unknown flag" "unknown flag --frobnicate" --data $DATA $SMALL --save $SAVE --frobnicate
bad "missing value" "--steps needs a value" --data $DATA $SMALL --save $SAVE --steps
bad "not a number" "--batch expects an integer, got 'four'" --data $DATA $SMALL --save $SAVE --batch four
bad "out of range" "--batch must be between 1 and" --data $DATA $SMALL --save $SAVE --batch 0
bad "negative lr" "--lr must be between" --data $DATA $SMALL --save $SAVE --lr -1
bad "bad lr-decay" "--lr-decay must be cosine or none, got 'linear'" --data $DATA $SMALL --save $SAVE --lr-decay linear
bad "bad device" "--device must be cpu or cuda, got 'gpu'" --data $DATA $SMALL --save $SAVE --device gpu
bad "bad dtype" "--dtype must be bf16 or fp32, got 'fp16'" --data $DATA $SMALL --save $SAVE --dtype fp16
bad "bad peak" "--peak-tflops must be between" --data $DATA $SMALL --save $SAVE --peak-tflops 0
bad "no data flag" "--data FILE is required" $SMALL --save $SAVE
bad "stray argument" "unexpected argument 'extra'" --data $DATA $SMALL --save $SAVE extra
bad "dim not divisible by heads" "--dim 10 is not divisible by --heads 3" --data $DATA $SMALL --save $SAVE --dim 10 --heads 3
bad "seq beyond max-seq" "--seq 32 exceeds the model's max sequence length 16" --data $DATA $SMALL --save $SAVE --seq 32
bad "missing data file" "cannot open data file $OUT/nope.bin" --data $OUT/nope.bin $SMALL --save $SAVE
head -c 1100 $DATA > $OUT/truncated_tokens.bin
bad "truncated token file" "truncated or corrupt token file" --data $OUT/truncated_tokens.bin $SMALL --save $SAVE
bad "token id >= vocab" "token id 60 >= vocab 50" --data $DATA $SMALL --save $SAVE --vocab 50
printf 'short' > $OUT/short.txt
bad "data shorter than a sequence" "has 5 tokens, fewer than --seq 8 + 1" --data $OUT/short.txt $SMALL --save $SAVE
bad "missing model file" "cannot open model file $OUT/nope.model" --data $DATA --init $OUT/nope.model --seq 8 --steps 1 --device cpu --save $SAVE
bad "foreign model file" "not an llm.c model file" --data $DATA --init $FIX/ref_tokens.bin --seq 8 --steps 1 --device cpu --save $SAVE
head -c 5000 $FIX/ref_model.bin > $OUT/truncated_model.bin
bad "truncated model file" "truncated or corrupt model file" --data $DATA --init $OUT/truncated_model.bin --seq 8 --steps 1 --device cpu --save $SAVE
bad "init with model flags that disagree" "--layers 3, but $FIX/ref_model.bin holds layers 2" --data $DATA --init $FIX/ref_model.bin --layers 3 --seq 8 --device cpu --save $SAVE
bad "save into a missing directory" "--save $OUT/no/such/dir/m.bin: directory $OUT/no/such/dir does not exist" --data $DATA $SMALL --save $OUT/no/such/dir/m.bin
bad "mesh does not multiply" "--dp 2 --tp 2 --pp 2 multiply to 8, not the 4 ranks" --data $DATA $SMALL --save $SAVE --ranks 4 --dp 2 --tp 2 --pp 2
bad "tp does not divide heads" "--tp 3 does not divide 2 heads" --data $DATA $SMALL --save $SAVE --ranks 3 --tp 3
bad "pp beyond layers" "--pp 2 exceeds the model's 1 layers" --data $DATA $SMALL --save $SAVE --ranks 2 --pp 2
bad "stage-layers do not add up" "--stage-layers adds up to 3 layers, the model has 1" --data $DATA $SMALL --save $SAVE --ranks 2 --pp 2 --stage-layers 2,1
bad "bad schedule" "--schedule must be naive, gpipe, 1f1b, interleaved, zb-h1 or zb-h2, got 'zigzag'" --data $DATA $SMALL --save $SAVE --schedule zigzag
bad "virtual without interleaved" "--virtual 2 needs --schedule interleaved" --data $DATA $SMALL --save $SAVE --ranks 2 --pp 2 --virtual 2
bad "virtual out of range" "--virtual must be between 1 and 32, got 0" --data $DATA $SMALL --save $SAVE --virtual 0
bad "interleaved micro-batches" "--schedule interleaved needs the micro-batches (M 3) to be a multiple of the stages (P 2)" --data $DATA $SMALL --save $SAVE --layers 4 --ranks 2 --pp 2 --schedule interleaved --virtual 2 --micro-batches 3
bad "chunks do not divide layers" "--pp 2 x --virtual 2 = 4 chunks: the model's 6 layers do not divide into them" --data $DATA $SMALL --save $SAVE --layers 6 --ranks 2 --pp 2 --schedule interleaved --virtual 2 --micro-batches 2
bad "stage-layers ranges with virtual" "--stage-layers gives 2 ranges, --pp 2 x --virtual 2 needs 4" --data $DATA $SMALL --save $SAVE --layers 4 --ranks 2 --pp 2 --schedule interleaved --virtual 2 --micro-batches 2 --stage-layers 2,2
bad "ps with zero" "--dp-mode ps keeps the whole optimizer on rank 0: it takes no --zero" --data $DATA $SMALL --save $SAVE --dp-mode ps --zero 1
bad "foreign tokenizer file" "not an llm.c tokenizer file" --data $DATA $SMALL --save $SAVE --tokenizer $FIX/ref_model.bin
bad "too many ranks" "--ranks must be between 1 and 64, got 65" --data $DATA $SMALL --save $SAVE --ranks 65
if [ "$(./train --data $DATA $SMALL --device cuda --steps 0 2>&1 >/dev/null | grep -c 'no CUDA GPU is visible\|has no CUDA')" -eq 1 ]; then
    bad "cuda without a GPU" "--device cuda:" --data $DATA $SMALL --save $SAVE --device cuda
else
    echo "SKIP bad input: cuda without a GPU: a GPU is visible here"
fi

# --help is not an error
if ./train --help | grep -q -- "--micro-batches"; then echo "PASS --help: lists the flags, exit 0"; else echo "FAIL --help"; fi

# a checkpoint survives a round trip byte for byte
./train --data $DATA $SMALL --steps 3 --save $OUT/a.bin > $OUT/log_a 2>&1
./train --data $DATA --init $OUT/a.bin --seq 8 --batch 2 --steps 0 --device cpu --save $OUT/b.bin > $OUT/log_b 2>&1
if cmp -s $OUT/a.bin $OUT/b.bin && [ ! -e $OUT/a.bin.tmp ]; then
    echo "PASS checkpoint round trip: $(wc -c < $OUT/a.bin) bytes identical after load and save"
else
    echo "FAIL checkpoint round trip: files differ or missing"
fi

# a byte-level model learns: the loss falls, and the step line has its fields
./train --data ../shared/data/tinyshakespeare.txt --layers 2 --heads 2 --dim 32 --batch 4 --seq 32 \
    --steps 40 --lr 3e-3 --device cpu --val $FIX/ref_tokens.bin --vocab 256 --sample 40 > $OUT/learn.log 2>&1
first=$(grep '^step 1/40 ' $OUT/learn.log | sed 's/.*loss \([0-9.]*\).*/\1/')
last=$(grep '^step 40/40 ' $OUT/learn.log | sed 's/.*loss \([0-9.]*\).*/\1/')
if [ -n "$first" ] && [ -n "$last" ] && awk "BEGIN{exit !($last < $first - 1.0)}"; then
    echo "PASS learning: byte-level loss $first -> $last in 40 steps"
else
    echo "FAIL learning: loss '$first' -> '$last' (want a fall of more than 1.0 nats)"
fi
if grep -q '^step 40/40 | loss [0-9.]* | norm [0-9.]* | lr [0-9.e+-]* | [0-9.]* ms | [0-9]* tok/s | elapsed [0-9.hms]* | eta [0-9.hms]*$' $OUT/learn.log &&
   grep -q '^val loss [0-9.]*$' $OUT/learn.log && grep -q '^sample (40 tokens' $OUT/learn.log; then
    echo "PASS step line: step S/N, loss, norm, lr, ms, tok/s, elapsed, eta; val loss; sample printed"
else
    echo "FAIL step line format: $(grep '^step 40' $OUT/learn.log)"
fi

# threads a rank: --threads, else OMP_NUM_THREADS, else the CPUs this process may run on
# (taskset, a container's cpuset), never more: 16 threads on 2 allowed cores ran 60% slower
threads_of() { "$@" --data $DATA $SMALL --steps 0 2>&1 | sed -n 's/.*, \([0-9]*\) threads a rank.*/\1/p'; }
n=$(OMP_NUM_THREADS=3 threads_of ./train)
m=$(OMP_NUM_THREADS=3 threads_of ./train --threads 2)
if [ "$n" = 3 ] && [ "$m" = 2 ]; then echo "PASS threads: OMP_NUM_THREADS=3 gives 3 a rank, --threads 2 overrides it"
else echo "FAIL threads: OMP_NUM_THREADS=3 gave '$n' (want 3), with --threads 2 '$m' (want 2)"; fi
# the first CPU this shell may run on (a container's cpuset need not hold CPU 0)
cpu=$(taskset -pc $$ 2>/dev/null | sed 's/.*: *//' | cut -d, -f1 | cut -d- -f1)
if [ -n "$cpu" ] && taskset -c "$cpu" true 2>/dev/null; then
    n=$(env -u OMP_NUM_THREADS taskset -c "$cpu" ./train --data $DATA $SMALL --steps 0 2>&1 | sed -n 's/.*, \([0-9]*\) threads a rank.*/\1/p')
    if [ "$n" = 1 ]; then echo "PASS threads: under taskset -c $cpu (one allowed CPU of $(nproc --all)), 1 a rank"
    else echo "FAIL threads: under taskset -c $cpu, '$n' threads a rank (want 1, the CPUs it may run on)"; fi
else
    echo "SKIP threads under taskset: no taskset, or it cannot pin here"
fi
