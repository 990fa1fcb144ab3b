#!/bin/sh
# test/test_build.sh: the Makefile's NCCL search and its flag stamps. In a
# scratch copy of the sources (test/out/build.XXXX; never the main tree) it
# builds train against NCCL laid out as Debian does (a fake root with
# usr/include/nccl.h and usr/lib/<multiarch>/libnccl.so*), as pip's wheel
# does (a fake site-packages/nvidia/nccl found through python3, lib holding
# libnccl.so.2 only) and with none (empty roots, then NO_NCCL=1); each
# build must say in its one NCCL line what it used, and each binary's
# --version must agree. Then a plain build after those flag changes must
# relink with NCCL and run, a second plain build compile nothing, and a
# CUDA_ARCH change rebuild the three .cu objects (checked with make -n).
#
# Cheap by reuse: nvcc's objects (kernels.o, matmul.o, attention.o) and
# their stamp come from the main tree's `make build`, mtimes kept, so only
# the C objects and the link are redone (NCCL never reaches nvcc's flags).
# The fake trees hold symlinks to the real nccl.h and libnccl (CUDA_HOME's);
# the fake CUDA_HOME links every entry of the real one but NCCL's, so NCCL
# is found only where each case puts it. What this does not prove: that
# real Debian or pip installs look exactly like these trees, that NCCL
# works at run time (no GPU here: --version calls ncclGetVersion only), or
# that nvcc's objects build (make build does that).
cd "$(dirname "$0")/.." || exit 2
MAIN=$(pwd)
unset NCCL_HOME NCCL_SYSROOT NCCL_PIP_DIR NO_NCCL NO_CUDA CUDA_ARCH CFLAGS NVFLAGS MAKEFLAGS MFLAGS
CUDA=${CUDA_HOME:-/usr/local/cuda}
NVCC=$(command -v nvcc 2>/dev/null || ls $CUDA/bin/nvcc 2>/dev/null)
if [ -z "$NVCC" ]; then echo "SKIP build: nvcc not found (NCCL needs a CUDA build)"; exit 0; fi
INC=$CUDA/include/nccl.h
LIB=$(ls $CUDA/lib64/libnccl.so.2 $CUDA/lib/libnccl.so.2 2>/dev/null | head -n 1)
if [ ! -f "$INC" ] || [ -z "$LIB" ]; then echo "SKIP build: no nccl.h and libnccl.so.2 under $CUDA to lay out"; exit 0; fi
CU_OBJS=$(ls *.cu | sed 's/\.cu$/.o/')   # every .cu file's object (kernels.o, matmul.o, ...)
NCU=$(echo $CU_OBJS | wc -w)
for o in $CU_OBJS .flags-cu; do
    if [ ! -e "$o" ]; then echo "SKIP build: no $o in the main tree: run make build first"; exit 0; fi
done
WANT=$(awk '/^#define NCCL_(MAJOR|MINOR|PATCH) /{v = v (v == "" ? "" : ".") $3} END{print v}' "$INC")
MA=$(gcc -print-multiarch 2>/dev/null)

mkdir -p test/out
S=$(mktemp -d "$MAIN/test/out/build.XXXX")
T=$S/fake
git ls-files -z --cached --others --exclude-standard | tar --null -cf - --ignore-failed-read -T - 2>/dev/null |
    tar -xf - -C "$S"
cp -p $CU_OBJS .flags-cu "$S/"

# CUDA_HOME without NCCL: every entry of the real one linked, NCCL's left out
mkdir -p $T/cuda/include $T/cuda/lib64
for f in $CUDA/include/*; do case ${f##*/} in nccl*) ;; *) ln -s "$f" $T/cuda/include/ ;; esac; done
for f in $CUDA/lib64/*; do case ${f##*/} in libnccl*) ;; *) ln -s "$f" $T/cuda/lib64/ ;; esac; done
# Debian, Ubuntu, NGC: libnccl-dev's header and .so link, libnccl2's .so.2
mkdir -p $T/deb/usr/include $T/deb/usr/lib/$MA
ln -s "$INC" $T/deb/usr/include/nccl.h
ln -s "$LIB" $T/deb/usr/lib/$MA/libnccl.so
ln -s "$LIB" $T/deb/usr/lib/$MA/libnccl.so.2
# pip install nvidia-nccl-cu13: site-packages/nvidia/nccl/{include,lib}, no libnccl.so
mkdir -p $T/site/nvidia/nccl/include $T/site/nvidia/nccl/lib $T/empty
touch $T/site/nvidia/__init__.py $T/site/nvidia/nccl/__init__.py
ln -s "$INC" $T/site/nvidia/nccl/include/nccl.h
ln -s "$LIB" $T/site/nvidia/nccl/lib/libnccl.so.2

. test/lib.sh
# build NAME ARGS...: make build in the scratch copy; $said is its NCCL line, $secs its time
build() {
    name=$1; shift
    start=$(date +%s)
    make -C "$S" --no-print-directory -j2 build NVCC="$NVCC" "$@" > $S/$name.log 2>&1
    rc=$?
    secs=$(( $(date +%s) - start ))
    said=$(grep '^train: NCCL' $S/$name.log)
    nv=$(grep -c 'nvcc' $S/$name.log)
    if [ $rc -ne 0 ]; then bad "$name: make build exited $rc: $(grep -m1 -i 'error' $S/$name.log)"; return 1; fi
    [ "$nv" -eq 0 ] || bad "$name: nvcc ran $nv times (the .cu objects should be reused)"
    return 0
}
# check NAME SAID_PATTERN VERSION_PATTERN: the build's line and the binary's --version
check() {
    v=$("$S/train" --version 2>&1)
    line=$(echo "$v" | grep '^NCCL')
    if ! echo "$said" | grep -q "$2"; then bad "$1: build said \"$said\", want /$2/"
    elif ! echo "$line" | grep -q "$3"; then bad "$1: --version says \"$line\", want /$3/"
    else ok "$1: \"$said\"; --version \"$line\" (${secs}s)"; fi
}
needs_nccl() { readelf -d "$S/train" 2>/dev/null | grep -q 'NEEDED.*libnccl'; }

if build debian CUDA_HOME=$T/cuda NCCL_SYSROOT=$T/deb NCCL_PIP_DIR=; then
    check "Debian layout" "NCCL $WANT: $T/deb/usr/include/nccl.h, $T/deb/usr/lib/$MA/libnccl.so" \
          "library $WANT ($T/deb/usr/lib/$MA/libnccl.so.2)"
fi
if command -v python3 > /dev/null; then
    if PYTHONPATH=$T/site build pip CUDA_HOME=$T/cuda NCCL_SYSROOT=$T/empty; then
        check "pip wheel (found by python3)" "NCCL $WANT: $T/site/nvidia/nccl/include/nccl.h, $T/site/nvidia/nccl/lib/libnccl.so.2" \
              "library $WANT ($T/site/nvidia/nccl/lib/libnccl.so.2)"
    fi
else
    echo "SKIP pip wheel: no python3 to find site-packages"
fi
if build none CUDA_HOME=$T/cuda NCCL_SYSROOT=$T/empty NCCL_PIP_DIR=; then
    check "no NCCL (empty roots)" "NCCL: none, not found" "not compiled in"
    if needs_nccl; then bad "no NCCL: train still needs libnccl (objects of the NCCL build were linked)"
    else ok "no NCCL after an NCCL build: C objects rebuilt, train links without libnccl"; fi
fi
if build no_nccl CUDA_HOME=$T/cuda NO_NCCL=1; then
    check "NO_NCCL=1" "NCCL: none, NO_NCCL=1" "not compiled in"
fi
# the plain build after all that: CUDA_HOME's NCCL, every C object rebuilt with it
if build plain; then
    if "$S/train" --version > $S/version.txt 2>&1 && needs_nccl; then
        check "plain build after NO_NCCL=1" "NCCL $WANT: $CUDA/include/nccl.h" "nccl.h $WANT, library $WANT"
    else
        bad "plain build after NO_NCCL=1: ./train --version failed or train lacks libnccl: $(head -n 3 $S/version.txt)"
    fi
    again=$(make -C "$S" --no-print-directory -n build NVCC="$NVCC" | grep -c -- ' -c ')
    if [ "$again" -eq 0 ]; then ok "same flags again: nothing recompiled (the stamps were left alone)"
    else bad "same flags again: $again objects would be recompiled"; fi
    arch=$(make -C "$S" --no-print-directory -n build NVCC="$NVCC" CUDA_ARCH='-gencode arch=compute_90a,code=sm_90a' |
           grep -c 'nvcc.* -c ')
    if [ "$arch" -eq "$NCU" ]; then ok "CUDA_ARCH changed: make -n would rebuild the $NCU .cu objects"
    else bad "CUDA_ARCH changed: make -n would run nvcc $arch times, want $NCU"; fi
fi
t_summary build "scratch copy: $S"
[ $fail -eq 0 ] && rm -rf "$S"
exit 0
