#!/bin/sh
# test/test_hostile.sh: hostile input never crashes train. Each
# class of bad model file, token file, tokenizer file, flag, output path and
# launcher environment gives one line on stderr naming the problem, exit
# status 2, nothing written, and no training done (it fails in well under a
# second where training would take minutes). Streams that can be read (a
# pipe, /dev/stdin, a FIFO) train. Run from the repository root.
T=./train
OUT=test/out/hostile
FIX=test/fixtures
rm -rf $OUT
mkdir -p $OUT/w
DATA=$FIX/ref_tokens.bin
W=$OUT/w                  # outputs go here: it must stay empty after every bad case
SAVE=$W/model.bin
# small valid flags, with enough steps that training would be slow to finish
SMALL="--layers 1 --heads 2 --dim 8 --max-seq 16 --batch 2 --seq 8 --device cpu"
SLOW="$SMALL --steps 1000000"

# header WORDS...: a 1024-byte llm.c header of those int32s, zero-filled
header() {
    python3 -c 'import struct, sys
w = [int(x) for x in sys.argv[1:]]
sys.stdout.buffer.write(struct.pack("<256i", *(w + [0] * (256 - len(w)))))' "$@"
}

# bad NAME WANT ENV ARGS...: exit 2, one stderr line containing WANT, $W
# empty, no step printed, within 10 s. ENV is "-" or VAR=VALUE,VAR=VALUE.
bad() {
    name=$1; want=$2; envs=$3; shift 3
    start=$(date +%s)
    if [ "$envs" = "-" ]; then
        timeout 60 "$T" "$@" > $OUT/stdout 2> $OUT/stderr < /dev/null
    else
        timeout 60 env $(echo "$envs" | tr ',' ' ') "$T" "$@" > $OUT/stdout 2> $OUT/stderr < /dev/null
    fi
    rc=$?
    secs=$(( $(date +%s) - start ))
    lines=$(wc -l < $OUT/stderr)
    msg=$(head -n 1 $OUT/stderr)
    written=$(ls -A $W | tr '\n' ' ')
    if [ $rc -eq 2 ] && [ "$lines" -eq 1 ] && grep -qF -- "$want" $OUT/stderr && [ -z "$written" ] &&
       ! grep -q '^step ' $OUT/stdout && [ $secs -le 10 ]; then
        echo "PASS $name: exit 2 in ${secs}s, nothing written, \"$msg\""
    else
        echo "FAIL $name: exit $rc in ${secs}s, $lines stderr lines, \"$msg\", written '$written' (want exit 2, \"$want\")"
    fi
    rm -rf $W; mkdir -p $W
}

# ---- model files -------------------------------------------------------------------
# The file: 1024 bytes whose dims made the parameter count wrap to 0
# (then a 1-byte buffer was filled from the file).
header 20240326 3 1024 65536 1073741824 1 1073741824 65536 > $OUT/wrap.bin
bad "model header: dims that wrapped the size to 0" "layers 1073741824 is outside 1..1024" - \
    --data $DATA --init $OUT/wrap.bin --seq 8 --steps 1000000 --device cpu --save $SAVE
header 20240326 3 1024 50257 12 12 2147483647 50304 > $OUT/dim.bin
bad "model header: dim 2^31-1 (4 x dim overflowed int)" "dim 2147483647 is outside 1..65536" - \
    --data $DATA --init $OUT/dim.bin --seq 8 --steps 1000000 --device cpu --save $SAVE
header 20240326 3 -5 50257 12 12 768 50304 > $OUT/neg.bin
bad "model header: negative max-seq" "max-seq -5" - \
    --data $DATA --init $OUT/neg.bin --seq 8 --steps 1000000 --device cpu --save $SAVE
header 20240326 3 1048576 16777216 1024 1024 65536 16777216 > $OUT/max.bin
bad "model header: every dim at its limit, 1024 bytes" "truncated or corrupt model file: expected" - \
    --data $DATA --init $OUT/max.bin --seq 8 --steps 1000000 --device cpu --save $SAVE
header 20240326 3 16 256 1 2 8 0 > $OUT/vp0.bin
bad "model header: padded vocab 0" "padded vocab 0 is outside" - \
    --data $DATA --init $OUT/vp0.bin --seq 8 --steps 1000000 --device cpu --save $SAVE
header 20240326 3 16 256 1 2 8 128 > $OUT/vpsmall.bin
bad "model header: padded vocab below vocab" "padded vocabulary 128 is smaller than the vocabulary 256" - \
    --data $DATA --init $OUT/vpsmall.bin --seq 8 --steps 1000000 --device cpu --save $SAVE
head -c 100 $FIX/ref_model.bin > $OUT/short.bin
bad "model file: shorter than its header" "shorter than its 1024-byte header" - \
    --data $DATA --init $OUT/short.bin --seq 8 --steps 1000000 --device cpu --save $SAVE
bad "model file: a directory" "is a directory, not a regular file" - \
    --data $DATA --init $OUT --seq 8 --steps 1000000 --device cpu --save $SAVE
rm -f $OUT/fifo; mkfifo $OUT/fifo; (cat $FIX/ref_model.bin > $OUT/fifo 2>/dev/null &)
bad "model file: a FIFO" "is a pipe, not a regular file" - \
    --data $DATA --init $OUT/fifo --seq 8 --steps 1000000 --device cpu --save $SAVE
rm -f $OUT/fifo
# (stdin is /dev/null in bad(): a device)
bad "model file: a device" "not a regular file" - \
    --data $DATA --init /dev/null --seq 8 --steps 1000000 --device cpu --save $SAVE

# ---- token files -------------------------------------------------------------------
header 20240520 1 -7 > $OUT/negtok.bin
bad "token file: negative count" "truncated or corrupt token file: header says -7 tokens" - \
    --data $OUT/negtok.bin $SLOW --save $SAVE
header 20240520 1 2147483647 > $OUT/hugetok.bin
bad "token file: 2^31-1 tokens claimed in 1024 bytes" "header says 2147483647 tokens (4294968318 bytes)" - \
    --data $OUT/hugetok.bin $SLOW --save $SAVE
header 20240520 2 10 > $OUT/vertok.bin
bad "token file: version 2" "token file version 2, expected 1" - --data $OUT/vertok.bin $SLOW --save $SAVE
bad "token file: a directory" "$OUT is a directory" - --data $OUT $SLOW --save $SAVE
bad "token file: /dev/stdin from a device" "/dev/stdin is a device" - --data /dev/stdin $SLOW --save $SAVE
bad "token file: a device" "/dev/zero is a device" - --data /dev/zero $SLOW --save $SAVE
bad "validation file: a directory" "$OUT is a directory" - --data $DATA --val $OUT $SLOW --save $SAVE

# streams are read to their end: a pipe, /dev/stdin, a FIFO
streams_ok=0
for how in pipe stdin fifo; do
    rm -f $OUT/fifo $W/*
    case $how in
        pipe)  cat $DATA | $T --data /dev/stdin $SMALL --steps 2 --save $SAVE > $OUT/stream.log 2>&1 ;;
        stdin) $T --data /dev/stdin $SMALL --steps 2 --save $SAVE < $DATA > $OUT/stream.log 2>&1 ;;
        fifo)  mkfifo $OUT/fifo; (cat $DATA > $OUT/fifo &)
               timeout 60 $T --data $OUT/fifo $SMALL --steps 2 --save $SAVE > $OUT/stream.log 2>&1 ;;
    esac
    rc=$?
    n=$(sed -n 's/^train: .*, \([0-9]*\) tokens |.*/\1/p' $OUT/stream.log)
    want=$(( ($(wc -c < $DATA) - 1024) / 2 ))
    if [ $rc -eq 0 ] && [ "$n" = "$want" ] && grep -q '^step 2/2 ' $OUT/stream.log && [ -s $SAVE ]; then
        echo "PASS token file from a $how: $n tokens read to the end, trained and saved"
    else
        echo "FAIL token file from a $how: exit $rc, '$n' tokens (want $want): $(tail -n 1 $OUT/stream.log)"
    fi
done
rm -rf $W $OUT/fifo; mkdir -p $W

# ---- tokenizer files ---------------------------------------------------------------
header 20240328 1 -2147483648 > $OUT/tok31.bin
bad "tokenizer: a vocabulary of 2^31" "tokenizer vocabulary 2147483648 is outside 1..16777216" - \
    --data $DATA $SLOW --save $SAVE --tokenizer $OUT/tok31.bin
{ header 20240328 1 1000000; head -c 2000 /dev/zero; } > $OUT/tokbig.bin
bad "tokenizer: more tokens than its bytes can hold" "tokenizer vocabulary 1000000 is outside 1..16777216 or larger than its 2000 bytes" - \
    --data $DATA $SLOW --save $SAVE --tokenizer $OUT/tokbig.bin
{ header 20240328 1 3; printf '\001a\001b\377c'; } > $OUT/toktrunc.bin
bad "tokenizer: a token longer than the file" "truncated at token 2 of 3" - \
    --data $DATA $SLOW --save $SAVE --tokenizer $OUT/toktrunc.bin
bad "tokenizer: a directory" "$OUT is a directory" - --data $DATA $SLOW --save $SAVE --tokenizer $OUT

# ---- flags whose products overflowed -----------------------------------------------
bad "flags: batch x seq over the int range" "tokens a micro-batch, more than 16777216" - \
    --data $DATA --layers 1 --heads 2 --dim 8 --max-seq 1048576 --batch 1048576 --seq 4096 --steps 1000000 --device cpu --save $SAVE
bad "flags: tokens a step with many micro-batches" "tokens a step is more than 2147483647" - \
    --data $DATA $SMALL --micro-batches 1048576 --batch 512 --steps 1000000 --save $SAVE
bad "flags: dim above the limit" "--dim must be between 1 and 65536" - --data $DATA $SLOW --dim 65537 --save $SAVE
bad "flags: vocab above the limit" "--vocab must be between 1 and 16777216" - --data $DATA $SLOW --vocab 16777217 --save $SAVE
bad "flags: stage layers above the limit" "--stage-layers expects positive integers" - \
    --data $DATA $SLOW --ranks 2 --pp 2 --stage-layers 2147483647,2147483647 --save $SAVE
bad "flags: layers of 2^63" "--layers expects an integer" - --data $DATA $SLOW --layers 9223372036854775808 --save $SAVE

# ---- output paths, checked before anything is read or trained ----------------------
touch $OUT/plainfile
long=$(python3 -c 'print("x/" * 2100 + "m.bin")')
longname=$(python3 -c 'print("n" * 250)')
mkdir -p $OUT/adir
bad "--save into a missing directory" "--save $W/no/such/m.bin: directory $W/no/such does not exist" - \
    --data $DATA $SLOW --save $W/no/such/m.bin
bad "--save is a directory" "--save $OUT/adir: is a directory" - --data $DATA $SLOW --save $OUT/adir
bad "--save ends in a slash" "names a directory, not a file" - --data $DATA $SLOW --save $W/
bad "--save under a regular file" "--save $OUT/plainfile/m.bin: $OUT/plainfile is not a directory" - \
    --data $DATA $SLOW --save $OUT/plainfile/m.bin
bad "--save is a device" "--save /dev/null: exists and is not a regular file" - --data $DATA $SLOW --save /dev/null
bad "--save: a path too long for its temporary" "--save: path of 4205 bytes is too long" - --data $DATA $SLOW --save $long
bad "--save: a file name too long for its temporary" "file name of 250 bytes is too long" - \
    --data $DATA $SLOW --save $W/$longname
bad "--trace into a missing directory" "--trace $W/nope/t.json: directory $W/nope does not exist" - \
    --data $DATA $SLOW --trace $W/nope/t.json
bad "--trace is a directory" "--trace $OUT/adir: is a directory" - --data $DATA $SLOW --trace $OUT/adir
bad "--dump-grads into a missing directory" "--dump-grads $W/nope/g.bin: directory $W/nope does not exist" - \
    --data $DATA $SLOW --dump-grads $W/nope/g.bin
bad "--dump-grads: a path too long" "--dump-grads: path of 4205 bytes is too long" - --data $DATA $SLOW --dump-grads $long
bad "output checked before a huge input is read" "--save $OUT/adir: is a directory" - \
    --data $OUT/hugetok.bin $SLOW --save $OUT/adir
if [ "$(id -u)" -ne 0 ]; then
    mkdir -p $OUT/ro; chmod 555 $OUT/ro
    bad "--save into a read-only directory" "directory $OUT/ro is not writable" - --data $DATA $SLOW --save $OUT/ro/m.bin
    chmod 755 $OUT/ro
else
    echo "SKIP --save into a read-only directory: root writes anywhere"
fi

# a stale temporary of a killed run is never read, and the save replaces nothing but its target
printf 'stale' > $W/model.bin.tmp
printf 'stale' > $W/model.bin.tmp.1
$T --data $DATA $SMALL --steps 1 --save $SAVE > $OUT/save.log 2>&1
$T --data $DATA --init $SAVE --seq 8 --batch 2 --steps 0 --device cpu > $OUT/load.log 2>&1
rc=$?
left=$(ls -A $W | tr '\n' ' ')
if [ $rc -eq 0 ] && [ "$left" = "model.bin model.bin.tmp model.bin.tmp.1 " ] && [ "$(cat $W/model.bin.tmp)" = stale ]; then
    echo "PASS stale temporaries: a save beside model.bin.tmp and model.bin.tmp.1 loads back; they are untouched"
else
    echo "FAIL stale temporaries: load exit $rc, directory holds '$left'"
fi
rm -rf $W; mkdir -p $W

# ---- launcher environments: exit 2 before anything starts --------------------------
bad "env: a rank without MASTER_PORT" "torchrun started 2 ranks but MASTER_PORT is not set" RANK=0,WORLD_SIZE=2 \
    --data $DATA $SLOW --save $SAVE
bad "env: rank 1 without MASTER_ADDR" "torchrun started 2 ranks but MASTER_ADDR is not set" \
    RANK=1,WORLD_SIZE=2,MASTER_PORT=29999 --data $DATA $SLOW --save $SAVE
bad "env: more ranks than supported" "SLURM_STEP_NUM_TASKS=100000: at most 65536 ranks are supported" \
    SLURM_STEP_ID=0,SLURM_PROCID=0,SLURM_STEP_NUM_TASKS=100000,MASTER_PORT=29999 --data $DATA $SLOW --save $SAVE
bad "env: more ranks than shared memory takes" "takes at most 64" \
    OMPI_COMM_WORLD_RANK=0,OMPI_COMM_WORLD_SIZE=70,OMPI_MCA_ess_base_jobid=1,MASTER_PORT=29999 --data $DATA $SLOW --save $SAVE
bad "env: a rank outside the world" "RANK=3 is not a rank of the world of WORLD_SIZE=2" \
    RANK=3,WORLD_SIZE=2,MASTER_PORT=29999 --data $DATA $SLOW --save $SAVE
bad "env: a rank that is not a number" "RANK=x is not a whole number" RANK=x,WORLD_SIZE=2 --data $DATA $SLOW --save $SAVE
bad "env: a world of 0" "WORLD_SIZE=0: a world has at least one rank" RANK=0,WORLD_SIZE=0 --data $DATA $SLOW --save $SAVE
bad "env: RANK without WORLD_SIZE" "RANK is set but WORLD_SIZE is not" RANK=0 --data $DATA $SLOW --save $SAVE
bad "env: MASTER_PORT out of range" "MASTER_PORT=70000 is not a port" RANK=0,WORLD_SIZE=2,MASTER_PORT=70000 \
    --data $DATA $SLOW --save $SAVE
bad "env: a local rank beyond the local size" "LOCAL_RANK=5 is not below LOCAL_WORLD_SIZE=2" \
    RANK=0,WORLD_SIZE=2,MASTER_PORT=29999,LOCAL_RANK=5,LOCAL_WORLD_SIZE=2 --data $DATA $SLOW --save $SAVE
bad "env: --ranks inside a launcher" "--ranks 4 cannot be used inside a launcher" \
    RANK=0,WORLD_SIZE=2,MASTER_PORT=29999 --data $DATA $SLOW --ranks 4 --save $SAVE
addr=$(python3 -c 'print("h" * 300)')
bad "env: a MASTER_ADDR too long" "MASTER_ADDR of 300 bytes is too long" RANK=0,WORLD_SIZE=2,MASTER_PORT=29999,MASTER_ADDR=$addr \
    --data $DATA $SLOW --save $SAVE
bad "--backend nccl on the cpu" "--backend nccl" - --data $DATA $SLOW --backend nccl --save $SAVE
