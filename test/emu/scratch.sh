# test/emu/scratch.sh: sourced by the scripts that patch deliberate changes
# into a copy of the sources and run test/train_nccl_emu from it
# (test_races_emu.sh, test_waits_emu.sh). Run from the repository's top with
# SCRATCH set (the copy is test/out/$SCRATCH.XXXX). Sets S (the copy), pass
# and fail, MODEL, and gives: losses LOG, run LOG TIMING FLAGS..., patch_in
# FILE OLD NEW, rebuild. The copy takes the main tree's built objects with
# their times, so a patch costs one object and a link, never the kernels.
MAIN=$(pwd)
unset MAKEFLAGS MFLAGS
if [ ! -x test/train_nccl_emu ]; then
    echo "SKIP $SCRATCH (emulated NCCL): test/train_nccl_emu not built (no nccl.h or CUDA headers where make ran)"
    exit 0
fi
mkdir -p test/out
S=$(mktemp -d "$MAIN/test/out/$SCRATCH.XXXX")
git ls-files -z --cached --others --exclude-standard | tar --null -cf - --ignore-failed-read -T - 2>/dev/null |
    tar -xf - -C "$S"
tar -cf - .flags-* test/emu/*.o test/emu/*_emu.cpp test/emu/emu_transform test/emu/train_nccl test/train_nccl_emu \
    2>/dev/null | tar -xf - -C "$S"

pass=0
fail=0
MODEL="--data test/fixtures/ref_tokens.bin --layers 4 --heads 4 --dim 32 --max-seq 16 --vocab 61 --seq 8 --steps 3 --lr 0.005 --device cuda --dtype fp32 --no-self-test"

# losses LOG: the step lines' losses, one line
losses() { grep '^step ' "$1" | sed 's/.*| loss \([^ ]*\) .*/\1/' | tr '\n' ' '; }

# run LOG TIMING FLAGS...: runs train_nccl_emu in the scratch copy into $S/LOG.log; $rc
run() {
    log=$1 when=$2
    shift 2
    (cd "$S" && EMU_GPUS=8 EMU_STREAMS=$when timeout 60 ./test/train_nccl_emu $MODEL "$@") > "$S/$log.log" 2>&1
    rc=$?
}

# patch_in FILE OLD NEW: replaces OLD by NEW in the copy's FILE (OLD must be there exactly once)
patch_in() {
    python3 - "$S/$1" "$2" "$3" <<'EOF' || return 1
import sys
path, old, new = sys.argv[1], sys.argv[2], sys.argv[3]
src = open(path).read()
if src.count(old) != 1:
    sys.exit("pattern found %d times in %s" % (src.count(old), path))
open(path, "w").write(src.replace(old, new))
EOF
}

rebuild() { make -C "$S" --no-print-directory test/train_nccl_emu > "$S/build.log" 2>&1; }
