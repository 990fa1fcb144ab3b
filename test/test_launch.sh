#!/bin/sh
# test/test_launch.sh: how `train` tells which launcher started it (comm.h,
# comm_launch_plan). A tiny model trains under each launcher's variables: the
# fork launcher (--ranks), torchrun (one rank, and a world of two processes
# started here with the variables set), an srun task, the shell of an sbatch
# script (Slurm's variables but no step: one process, never a wait for
# peers), mpirun (Open MPI's and MPICH's variables), each world with its
# launcher's job identity (or TRAIN_JOB_TOKEN, MPICH's Hydra having none),
# from which its ranks derive the job token of the rendezvous. Bad variables
# each give one line on stderr naming the variable, exit status 2, at once.
# Run from the repository root.
T=./train
OUT=test/out/launch
DATA=test/fixtures/ref_tokens.bin
mkdir -p $OUT
rm -f $OUT/*
SMALL="--layers 1 --heads 2 --dim 8 --max-seq 16 --batch 2 --seq 8 --steps 2 --device cpu --data $DATA"
# every variable a launcher may have left in this shell: each case starts from none
LAUNCH_VARS="RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT TORCHELASTIC_USE_AGENT_STORE
  SLURM_PROCID SLURM_NTASKS SLURM_LOCALID SLURM_NTASKS_PER_NODE SLURM_STEP_ID SLURM_STEPID
  SLURM_STEP_NUM_TASKS SLURM_JOB_ID ENVIRONMENT OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE
  OMPI_COMM_WORLD_LOCAL_RANK OMPI_COMM_WORLD_LOCAL_SIZE PMI_RANK PMI_SIZE MPI_LOCALRANKID MPI_LOCALNRANKS
  TORCHELASTIC_RUN_ID TRAIN_JOB_TOKEN OMPI_MCA_ess_base_jobid PMIX_NAMESPACE"
UNSET=$(for v in $LAUNCH_VARS; do printf -- '-u %s ' "$v"; done)
# a port nobody listens on (test/test_rdzv asks the kernel), else one from this shell's pid
free_port() { ./test/test_rdzv --free-port 2>/dev/null || echo $((30000 + ($$ + $1) % 20000)); }
port=$(free_port 0)

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
# clean VAR=VALUE... -- ARGS: ./train with only these launcher variables, 30 s at most
clean() {
    vars=""
    while [ "$1" != "--" ]; do vars="$vars $1"; shift; done
    shift
    # shellcheck disable=SC2086
    env $UNSET $vars timeout 30 "$T" "$@"
}
losses() { sed -n 's/^step \([0-9]*\)\/[0-9]* | loss \([0-9.]*\).*/\2/p' "$1" | tr '\n' ' ' | sed 's/ $//'; }

# the reference: the fork launcher's two ranks
t0=$(now)
clean -- $SMALL --ranks 2 > $OUT/fork.log 2>&1
rc=$?
ref=$(losses $OUT/fork.log)
if [ $rc -eq 0 ] && grep -q '^ranks: 2 (--ranks)' $OUT/fork.log && [ -n "$ref" ]; then
    echo "PASS fork: --ranks 2 trained as 2 ranks in $(secs "$t0" "$(now)") s, losses $ref"
else
    echo "FAIL fork: exit $rc, losses '$ref' (see $OUT/fork.log)"
fi

# one ENV...: trains as one process (no wait for peers)
one() {
    name=$1; want=$2; shift 2
    t0=$(now)
    clean "$@" > $OUT/$name.log 2>&1
    rc=$?
    got=$(losses $OUT/$name.log)
    line=$(grep '^ranks:' $OUT/$name.log | cut -d'|' -f1 | sed 's/ $//')
    if [ $rc -eq 0 ] && grep -q "^ranks: $want" $OUT/$name.log && [ -n "$got" ]; then
        echo "PASS $name: \"$line\" in $(secs "$t0" "$(now)") s, exit 0"
    else
        echo "FAIL $name: exit $rc$([ $rc -eq 124 ] && echo ' (timed out: waited for peers?)'), \"$line\" (want \"ranks: $want\"; see $OUT/$name.log)"
    fi
}

one torchrun_single "1 (single)" RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$port -- $SMALL
# sbatch --ntasks=8: the script's shell carries SLURM_PROCID=0 and SLURM_NTASKS=8 but no step id
# (and the script exported MASTER_ADDR/MASTER_PORT for its srun): taken for rank 0 of 8, it would
# wait for 7 peers that never come
BATCH="SLURM_JOB_ID=4242 ENVIRONMENT=BATCH SLURM_PROCID=0 SLURM_NTASKS=8 SLURM_LOCALID=0 SLURM_NTASKS_PER_NODE=8
       MASTER_ADDR=127.0.0.1 MASTER_PORT=$((port + 1))"
# shellcheck disable=SC2086
one sbatch_shell "1 (single)" $BATCH -- $SMALL
# shellcheck disable=SC2086
one sbatch_shell_batch_step_id "1 (single)" $BATCH SLURM_STEP_ID=4294967291 -- $SMALL
# shellcheck disable=SC2086
one sbatch_shell_ranks "2 (--ranks)" $BATCH -- $SMALL --ranks 2

# world NAME SOURCE VARS_OF_RANK_0 -- VARS_OF_RANK_1: two processes started here, one world
world() {
    name=$1; want=$2; shift 2
    v0=""; while [ "$1" != "--" ]; do v0="$v0 $1"; shift; done; shift
    v1="$*"
    port=$(free_port 2)
    t0=$(now)
    # shellcheck disable=SC2086
    clean $v0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port -- $SMALL > $OUT/$name.0.log 2>&1 &
    p0=$!
    # shellcheck disable=SC2086
    clean $v1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port -- $SMALL > $OUT/$name.1.log 2>&1 &
    p1=$!
    wait $p0; rc0=$?
    wait $p1; rc1=$?
    got=$(losses $OUT/$name.0.log)
    close=$(echo "$ref|$got" | awk -F'|' '{ n = split($1, a, " "); m = split($2, b, " "); ok = n == m && n > 0;
        for (i = 1; i <= n && ok; i++) { d = a[i] - b[i]; if (d < 0) d = -d; if (d > 1e-5 * a[i]) ok = 0 } print ok }')
    if [ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] && grep -q "^ranks: 2 ($want)" $OUT/$name.0.log && [ "$close" = 1 ]; then
        echo "PASS $name: 2 processes, one world \"ranks: 2 ($want)\", in $(secs "$t0" "$(now)") s, losses $got as --ranks 2"
    else
        echo "FAIL $name: exits $rc0 $rc1, losses '$got' against '$ref' (see $OUT/$name.*.log)"
    fi
}

world torchrun torchrun TORCHELASTIC_RUN_ID=run$$ RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 -- \
    TORCHELASTIC_RUN_ID=run$$ RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2
world srun slurm SLURM_JOB_ID=$$ SLURM_PROCID=0 SLURM_NTASKS=2 SLURM_STEP_ID=0 SLURM_STEP_NUM_TASKS=2 SLURM_LOCALID=0 -- \
    SLURM_JOB_ID=$$ SLURM_PROCID=1 SLURM_NTASKS=2 SLURM_STEP_ID=0 SLURM_STEP_NUM_TASKS=2 SLURM_LOCALID=1
# mpirun inside a Slurm job: its ranks also inherit the step of the daemon srun started (or, on
# mpirun's own host, the batch step's: none), so the job is Open MPI's, not Slurm's
world mpirun_openmpi openmpi OMPI_MCA_ess_base_jobid=$$ OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=2 \
    OMPI_COMM_WORLD_LOCAL_RANK=0 OMPI_COMM_WORLD_LOCAL_SIZE=2 SLURM_JOB_ID=7 SLURM_PROCID=0 SLURM_NTASKS=1 -- \
    OMPI_MCA_ess_base_jobid=$$ OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_RANK=1 \
    OMPI_COMM_WORLD_LOCAL_SIZE=2 SLURM_JOB_ID=7 SLURM_PROCID=0 SLURM_NTASKS=1 SLURM_STEP_ID=1
world mpirun_pmix openmpi PMIX_NAMESPACE=prterun-host-$$@1 OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=2 -- \
    PMIX_NAMESPACE=prterun-host-$$@1 OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2
world mpirun_mpich mpich TRAIN_JOB_TOKEN=secret$$ PMI_RANK=0 PMI_SIZE=2 MPI_LOCALRANKID=0 MPI_LOCALNRANKS=2 -- \
    TRAIN_JOB_TOKEN=secret$$ PMI_RANK=1 PMI_SIZE=2 MPI_LOCALRANKID=1 MPI_LOCALNRANKS=2

# bad NAME TEXT VARS -- ARGS: one stderr line containing TEXT, a non-zero exit, within 5 s
bad() {
    name=$1; want=$2; shift 2
    t0=$(now)
    clean "$@" > $OUT/stdout 2> $OUT/stderr
    rc=$?
    took=$(secs "$t0" "$(now)")
    lines=$(wc -l < $OUT/stderr)
    msg=$(head -n 1 $OUT/stderr)
    fast=$(awk -v t="$took" 'BEGIN { print t < 5 }')
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$lines" -eq 1 ] && grep -qF -- "$want" $OUT/stderr && [ "$fast" = 1 ]; then
        echo "PASS bad env: $name: exit $rc in $took s, \"$msg\""
    else
        echo "FAIL bad env: $name: exit $rc in $took s, $lines stderr lines, \"$msg\" (want one line with \"$want\")"
    fi
}

bad "torchrun rank without MASTER_PORT" "MASTER_PORT is not set" RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 -- $SMALL
bad "rank beyond the world" "RANK=4 is not a rank of the world of WORLD_SIZE=4" RANK=4 WORLD_SIZE=4 \
    MASTER_PORT=$port -- $SMALL
bad "local rank not below local size" "LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2" RANK=2 WORLD_SIZE=4 \
    LOCAL_RANK=2 LOCAL_WORLD_SIZE=2 MASTER_PORT=$port -- $SMALL
bad "local size above the world" "LOCAL_WORLD_SIZE=8" RANK=0 WORLD_SIZE=4 LOCAL_RANK=0 LOCAL_WORLD_SIZE=8 \
    MASTER_PORT=$port -- $SMALL
bad "non-numeric world size" "WORLD_SIZE=two is not a whole number" RANK=0 WORLD_SIZE=two -- $SMALL
bad "rank without world size" "RANK is set but WORLD_SIZE is not" RANK=0 -- $SMALL
bad "non-numeric MASTER_PORT" "MASTER_PORT=http is not a whole number" RANK=0 WORLD_SIZE=2 MASTER_PORT=http -- $SMALL
bad "MASTER_PORT out of range" "MASTER_PORT=70000 is not a port" RANK=0 WORLD_SIZE=2 MASTER_PORT=70000 -- $SMALL
bad "srun step id not a number" "SLURM_STEP_ID=abc is not a step number" SLURM_PROCID=0 SLURM_NTASKS=2 \
    SLURM_STEP_ID=abc -- $SMALL
bad "srun task beyond the step" "SLURM_PROCID=3 is not a rank" SLURM_PROCID=3 SLURM_NTASKS=8 \
    SLURM_STEP_NUM_TASKS=2 SLURM_STEP_ID=0 MASTER_PORT=$port -- $SMALL
bad "openmpi rank beyond the world" "OMPI_COMM_WORLD_RANK=2 is not a rank" OMPI_COMM_WORLD_RANK=2 \
    OMPI_COMM_WORLD_SIZE=2 MASTER_PORT=$port -- $SMALL
bad "mpich empty world" "PMI_SIZE=0: a world has at least one rank" PMI_RANK=0 PMI_SIZE=0 -- $SMALL
bad "more ranks than shared memory takes" "at most 64 ranks" RANK=0 WORLD_SIZE=100 MASTER_ADDR=127.0.0.1 \
    TORCHELASTIC_RUN_ID=launch MASTER_PORT=$port -- $SMALL
bad "--ranks beside a launcher" "--ranks 4 cannot be used inside a launcher that started 2 ranks" RANK=0 \
    WORLD_SIZE=2 MASTER_PORT=$port -- $SMALL --ranks 4
# a world whose launcher names no job, and no TRAIN_JOB_TOKEN: rank 0 could not tell its ranks from
# anyone else's
bad "torchrun world without a run id" "torchrun started 2 ranks but names no job (no TORCHELASTIC_RUN_ID" \
    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port -- $SMALL
bad "torchrun world with its default run id" "names no job (no TORCHELASTIC_RUN_ID but torchrun's default 'none'" \
    RANK=0 WORLD_SIZE=2 TORCHELASTIC_RUN_ID=none MASTER_ADDR=127.0.0.1 MASTER_PORT=$port -- $SMALL
bad "srun task without a job id" "slurm started 2 ranks but names no job (no SLURM_JOB_ID)" SLURM_PROCID=1 \
    SLURM_NTASKS=2 SLURM_STEP_ID=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port -- $SMALL
bad "mpich world without TRAIN_JOB_TOKEN" "mpich started 2 ranks but names no job" PMI_RANK=1 PMI_SIZE=2 \
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$port -- $SMALL
