# bench/blas.sh: sourced by bench_cpu.sh and gemm_blockings.sh. blas_find NAME
# sets BLAS to the OpenBLAS library the CPU benchmarks measure against: BLAS
# as given, else Debian's libopenblas, else the one in pip numpy's wheel
# (installed into bench/venv on first use, which needs PyPI), checked to be
# OpenBLAS by numpy's own report; bench_gemm refuses anything without
# openblas_get_config. Prints one line naming NAME and returns 2 when none.
blas_find() {
    for f in /usr/lib/*/openblas-pthread/libopenblas.so.0 /usr/lib/*/openblas-openmp/libopenblas.so.0 \
             /usr/lib/*/libopenblas.so.0; do
        [ -z "$BLAS" ] && [ -f "$f" ] && { BLAS=$f; break; }
    done
    [ -z "$BLAS" ] || [ -f "$BLAS" ] || { echo "$1: BLAS=$BLAS: no such file"; return 2; }
    if [ -z "$BLAS" ]; then
        if [ ! -x bench/venv/bin/python ] || ! bench/venv/bin/python -c 'import numpy' 2>/dev/null; then
            echo "$1: installing numpy (for its OpenBLAS) into bench/venv"
            python3 -m venv bench/venv && bench/venv/bin/pip install -q numpy ||
                { echo "$1: no OpenBLAS: apt-get install libopenblas0-pthread, or give pip a way to PyPI"; return 2; }
        fi
        # numpy's own word on its BLAS: OpenBLAS (scipy-openblas in the wheels), never netlib
        name=$(bench/venv/bin/python -c 'import numpy
print(numpy.show_config(mode="dicts")["Build Dependencies"]["blas"]["name"])' 2>/dev/null)
        case "$name" in
            *openblas*) ;;
            *) echo "$1: numpy in bench/venv uses '$name', not OpenBLAS: refusing it as the yardstick"; return 2 ;;
        esac
        BLAS=$(ls bench/venv/lib/python3*/site-packages/numpy.libs/libscipy_openblas*.so 2>/dev/null | head -1)
        [ -n "$BLAS" ] || { echo "$1: numpy reports $name but its library is not in numpy.libs"; return 2; }
    fi
    return 0
}
