/* version.c: ./train --version, what this binary was built from and with.
 *
 * The Makefile passes what only the build knows (BUILD_GIT: git describe of
 * the sources; BUILD_CUDA_ARCH: nvcc's code= targets) on version.o's command
 * line; the rest is asked at run time: the CUDA runtime linked in, the driver
 * installed (none on a machine without a GPU), and the NCCL library the
 * loader found, beside the nccl.h this file was compiled against. A header
 * and a library that disagree are the usual cause of NCCL errors at init.
 * The CPU GEMM's kernel (gemm.c) is the one this CPU runs (or TRAIN_GEMM).
 */
#define _GNU_SOURCE /* dladdr */
#include <stdio.h>
#include "version.h"
#include "gemm.h"
#ifdef USE_CUDA
#include <cuda_runtime_api.h>
#endif
#ifdef USE_NCCL
#include <dlfcn.h>
#include <nccl.h>
#endif

#ifndef BUILD_GIT
#define BUILD_GIT "unknown"
#endif
#ifndef BUILD_CUDA_ARCH
#define BUILD_CUDA_ARCH "unknown"
#endif

const char *version_source(void) { return BUILD_GIT; }

void version_print(FILE *f) {
    fprintf(f, "train %s\n", BUILD_GIT);
    char cpu[128];
    const char *isa;
    gemm_cpu_describe(cpu, sizeof cpu, &isa);
    fprintf(f, "CPU GEMM: %s kernel (%s, %s)\n", gemm_kernel_name(), cpu, isa);
#ifdef USE_CUDA
    int runtime = 0, driver = 0;
    cudaRuntimeGetVersion(&runtime);
    cudaDriverGetVersion(&driver); /* 0 when no driver is installed */
    fprintf(f, "CUDA: runtime %d.%d (static), ", runtime / 1000, runtime % 1000 / 10);
    if (driver) fprintf(f, "driver CUDA %d.%d\n", driver / 1000, driver % 1000 / 10);
    else fprintf(f, "no driver\n");
    fprintf(f, "GPU architectures: %s\n", BUILD_CUDA_ARCH);
#else
    fprintf(f, "CUDA: not compiled in\n");
#endif
#ifdef USE_NCCL
    int v = 0;
    ncclGetVersion(&v); /* major*10000 + minor*100 + patch since 2.9 */
    Dl_info where = {0};
    dladdr((void *)ncclGetVersion, &where);
    fprintf(f, "NCCL: nccl.h %d.%d.%d, library %d.%d.%d (%s)\n", NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH,
            v / 10000, v / 100 % 100, v % 100, where.dli_fname ? where.dli_fname : "?");
#else
    fprintf(f, "NCCL: not compiled in\n");
#endif
}
