# Makefile: builds `train` and its tests from the flat sources.
#
#   make train        build, fetch or find data, train a small model, sample
#   make test         build and run every test (what CI runs); ends "N passed, N failed"
#   make bench-cpu    GPT-2 124M step time on the CPU
#   make bench-comm   all-reduce bus bandwidth of the shared-memory backend
#   make bench-pipeline  the pipeline bubble measured from a trace, beside (P-1)/(M+P-1)
#   make bench        (GPU) every kernel at GPT-2 124M's shapes against cuBLAS, the copy
#                     bandwidth and PyTorch's SDPA; then GPT-2 124M end to end beside PyTorch
#
# CUDA is compiled in when nvcc is found (NO_CUDA=1 to leave it out); NCCL
# when nccl.h is found under NCCL_HOME (NO_NCCL=1 to leave it out). A CUDA
# build still runs on a machine without a GPU with --device cpu.

ifeq ($(origin CC),default)
CC       := gcc
endif
ARCH     ?= -march=native
CFLAGS   ?= -O3 $(ARCH) -fopenmp -Wall -Wextra -Wno-unused-parameter -Wno-psabi -std=gnu11
LDLIBS   := -lm -fopenmp -lpthread -lrt

CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(shell command -v nvcc 2>/dev/null || ls $(CUDA_HOME)/bin/nvcc 2>/dev/null)
# sm_90a: Hopper with wgmma and setmaxnreg (matmul.cu's fastest GEMM); sm_80
# for Ampere and as the mma.sync path's baseline.
CUDA_ARCH ?= -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_80,code=sm_80
NVFLAGS   ?= -O3 -std=c++17 $(CUDA_ARCH) -Xcompiler -Wall,-Wno-unused-parameter
NCCL_HOME ?= $(CUDA_HOME)

OBJS := tensor.o ops.o ops_bf16.o gpt.o data.o ckpt.o optim.o comm.o dp.o zero.o tp.o pp.o trace.o

ifeq ($(NO_CUDA),)
ifneq ($(NVCC),)
USE_CUDA := 1
endif
endif

ifeq ($(USE_CUDA),1)
CFLAGS  += -DUSE_CUDA -I$(CUDA_HOME)/include
OBJS    += kernels.o matmul.o attention.o
LDLIBS  += -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lstdc++
NCCL_INC := $(wildcard $(NCCL_HOME)/include/nccl.h)
NCCL_LIB := $(firstword $(wildcard $(NCCL_HOME)/lib64/libnccl.so $(NCCL_HOME)/lib/libnccl.so \
                                   $(NCCL_HOME)/lib64/libnccl.so.2 $(NCCL_HOME)/lib/libnccl.so.2))
ifeq ($(NO_NCCL),)
ifneq ($(NCCL_INC),)
ifneq ($(NCCL_LIB),)
USE_NCCL := 1
CFLAGS   += -DUSE_NCCL -I$(NCCL_HOME)/include
LDLIBS   += $(NCCL_LIB) -Wl,-rpath,$(dir $(NCCL_LIB))
endif
endif
endif
endif

TESTS := test/test_ops test/test_model test/test_kernels test/test_gemm test/test_flash test/test_comm \
         test/test_dp test/test_tp test/test_pp test/test_3d

# The CPU emulation of CUDA and the programs that run over it: test/emu/emu.mk.
# (Its rules come before `all`: name the default goal.)
.DEFAULT_GOAL := all
include test/emu/emu.mk


.PHONY: all build tests train test bench bench-cpu bench-comm bench-pipeline clean

all: build

# `make train` is the demo; the binary it builds is also called train, so
# it is linked by the phony `build` (objects are cached; linking is cheap).
build: main.o $(OBJS)
	$(CC) -o train main.o $(OBJS) $(LDLIBS)

# The demo's data: tinyshakespeare, split 90/10 into training and validation
# text. DATA=path trains on your own file instead (no validation split).
SHAKESPEARE_URL := https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt
ifeq ($(origin DATA),undefined)
DATA := data/tinyshakespeare_train.txt
VAL  := data/tinyshakespeare_val.txt
endif
GPUS := $(shell nvidia-smi -L 2>/dev/null | grep -c '^GPU')
# The layout for the GPUs found: 8 is the articles' 3D (+ZeRO-1: 4D), 4 is
# DP x TP, others data parallel. The model: 6 layers, 6 heads, 384 wide.
GPU_MODEL := --device cuda --layers 6 --heads 6 --dim 384 --seq 256 --steps 800 \
             --lr 1e-3 --lr-min 1e-4 --warmup 50 --beta2 0.99
ifeq ($(GPUS),0)
TRAIN_DEFAULTS := --device cpu --layers 4 --heads 4 --dim 128 --batch 32 --seq 64 --steps 800 \
                  --lr 3e-3 --lr-min 3e-4 --warmup 50 --beta2 0.99
else ifeq ($(GPUS),1)
TRAIN_DEFAULTS := $(GPU_MODEL) --batch 32
else ifeq ($(GPUS),8)
TRAIN_DEFAULTS := $(GPU_MODEL) --ranks 8 --dp 2 --tp 2 --pp 2 --zero 1 --batch 8 --micro-batches 2
else ifeq ($(GPUS),4)
TRAIN_DEFAULTS := $(GPU_MODEL) --ranks 4 --dp 2 --tp 2 --zero 1 --batch 16
else
TRAIN_DEFAULTS := $(GPU_MODEL) --ranks $(GPUS) --batch 16
endif

train: build $(DATA) $(VAL)
	./train --data $(DATA) $(if $(VAL),--val $(VAL) --val-every 100) $(TRAIN_DEFAULTS) \
	        --sample 400 $(TRAIN_FLAGS)

data/tinyshakespeare.txt:
	@mkdir -p data
	@if [ -f ../shared/data/tinyshakespeare.txt ]; then cp ../shared/data/tinyshakespeare.txt $@; \
	elif curl -fsSL --max-time 120 -o $@.tmp $(SHAKESPEARE_URL); then mv $@.tmp $@; \
	else rm -f $@.tmp; echo "make train: no network to fetch tinyshakespeare; pass DATA=path/to/text.txt"; exit 2; fi

data/tinyshakespeare_train.txt: data/tinyshakespeare.txt
	head -c $$(( $$(wc -c < $<) * 9 / 10 )) $< > $@

data/tinyshakespeare_val.txt: data/tinyshakespeare.txt
	tail -c +$$(( $$(wc -c < $<) * 9 / 10 + 1 )) $< > $@

%.o: %.c *.h
	$(CC) $(CFLAGS) -c $< -o $@

%.o: %.cu tensor.h tc.h
	$(NVCC) $(NVFLAGS) -c $< -o $@

# The float64 build of the CPU reference, for finite differences.
ops64.o: ops.c tensor.h
	$(CC) $(CFLAGS) -DOPS_REAL=double -c ops.c -o ops64.o

test/test_ops: test/test_ops.c ops64.o ops.o ops_bf16.o tensor.o test/check.h \
               $(filter kernels.o matmul.o attention.o,$(OBJS))
	$(CC) $(CFLAGS) -I. -o $@ test/test_ops.c ops64.o ops.o ops_bf16.o tensor.o $(filter kernels.o matmul.o attention.o,$(OBJS)) $(LDLIBS)

test/%: test/%.c $(OBJS) test/check.h test/train_run.h
	$(CC) $(CFLAGS) -I. -o $@ $< $(OBJS) $(LDLIBS)

bench/%: bench/%.c $(OBJS)
	$(CC) $(CFLAGS) -I. -o $@ $< $(OBJS) $(LDLIBS)

# the test programs, built and not run (test/gpu_session.sh builds in parallel)
tests: $(TESTS)

# The build runs on every core (CI has two: nvcc's three files take most of
# it); the tests then run one program at a time.
NPROC := $(shell nproc 2>/dev/null || echo 2)
test:
	@$(MAKE) --no-print-directory -j$(NPROC) build $(TESTS)
	@sh test/run.sh

# cuBLAS is linked into the benchmark only, never into train.
bench/bench_gpu: bench/bench_gpu.c $(OBJS)
	$(CC) $(CFLAGS) -I. -o $@ $< $(OBJS) $(LDLIBS) -L$(CUDA_HOME)/lib64 -lcublas -Wl,-rpath,$(CUDA_HOME)/lib64

bench: build bench/bench_gpu data/tinyshakespeare.txt
	@sh bench/bench_gpu.sh

bench-cpu: build
	@sh bench/bench_cpu.sh

bench-comm: bench/bench_comm
	./bench/bench_comm

bench-pipeline: build
	@sh bench/bench_pipeline.sh

clean:
	rm -f *.o train $(TESTS) bench/bench_comm bench/bench_gpu
	rm -f test/emu/*.o test/emu/*_emu.cpp test/emu/emu_transform
	rm -rf test/out
