# Makefile: builds `train` and its tests from the flat sources.
#
#   make train        build, fetch or find data, train a small model, sample
#   make test         build and run every test (what CI runs); ends "N passed, N failed"
#   make bench-cpu    GPT-2 124M step time on the CPU, beside OpenBLAS, and where it goes op by op
#   make bench-comm   all-reduce bus bandwidth of the shared-memory backend
#   make bench-plan   the planner's predicted step times beside measured ones on 4 CPU ranks
#   make bench-data   the data loader: RSS, PSS and tokens/s with 1 and 30 shards
#   make bench-pipeline  the pipeline bubble measured from a trace under each schedule, beside its formula
#   make bench-cp     context parallelism's memory at T 4096: planner and resident, cp 1, 2, 4, each --recompute-mode
#   make bench        (GPU) every kernel at GPT-2 124M's shapes against cuBLAS, the copy
#                     bandwidth and PyTorch's SDPA; then GPT-2 124M end to end beside PyTorch
#
# CUDA is compiled in when nvcc is found (NO_CUDA=1 to leave it out); NCCL
# when nccl.h and libnccl are found (NO_NCCL=1 to leave it out), looking in
# NCCL_HOME if given, then CUDA_HOME, then the system's /usr/include and
# /usr/lib/<multiarch> (Debian, Ubuntu, NGC), then pip's nvidia-nccl wheel.
# `make build` says in one line which NCCL it linked, or why none. A CUDA
# build still runs on a machine without a GPU with --device cpu.

ifeq ($(origin CC),default)
CC       := gcc
endif
ARCH     ?= -march=native
CFLAGS   ?= -O3 $(ARCH) -fopenmp -Wall -Wextra -Wno-unused-parameter -Wno-psabi -std=gnu11
LDLIBS   := -lm -fopenmp -lpthread -lrt

CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(shell command -v nvcc 2>/dev/null || ls $(CUDA_HOME)/bin/nvcc 2>/dev/null)
# The runtime loads the code built for the GPU it finds: sm_80 for Ampere
# (A100; sm_86/87 run it too), sm_89 for Ada (L4, L40S), sm_90a for Hopper
# (wgmma and setmaxnreg: matmul.cu's fastest GEMM, compiled for this target
# only), and compute_80 PTX, which the driver compiles for anything newer
# (Blackwell). Each target costs nvcc time: CUDA_ARCH='-gencode
# arch=compute_90a,code=sm_90a' builds for an H100 alone.
CUDA_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_89,code=sm_89 \
             -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_80,code=compute_80
NVFLAGS   ?= -O3 -std=c++17 $(CUDA_ARCH) -Xcompiler -Wall,-Wno-unused-parameter

# The CPU GEMM (gemm.c): the driver and plain kernel, and a micro-kernel a
# file for each vector ISA, compiled with that ISA's flags whatever ARCH is
# (the AVX2 one without AVX-512, so it gets exactly the 16 registers it
# will run with); gemm.c picks one at run time. Off x86-64 they compile to
# nothing and the plain kernel runs.
GEMM_OBJS := gemm.o gemm_avx2.o gemm_avx512.o
ifneq ($(findstring x86_64,$(shell $(CC) -dumpmachine 2>/dev/null)),)
GEMM_AVX2_FLAGS   := -mavx2 -mfma -mno-avx512f
GEMM_AVX512_FLAGS := -mavx512f -mavx2 -mfma
endif
# override: also when CFLAGS comes from the command line (make sanitize)
gemm_avx2.o: override CFLAGS += $(GEMM_AVX2_FLAGS)
gemm_avx512.o: override CFLAGS += $(GEMM_AVX512_FLAGS)
# sqrtf as one instruction, so that AdamW's loop vectorises (nothing reads errno)
ops.o: override CFLAGS += -fno-math-errno

OBJS := args.o layout.o setup.o runlog.o score.o stop.o tensor.o ops.o $(GEMM_OBJS) ops_bf16.o gpt.o data.o eval.o ckpt.o checkpoint.o safe.o optim.o comm.o comm_launch.o comm_shm.o comm_nccl.o rendezvous.o dp.o cp.o zero.o tp.o pp.o pp_sched.o plan.o trace.o selftest.o version.o plot.o

ifeq ($(NO_CUDA),)
ifneq ($(NVCC),)
USE_CUDA := 1
endif
endif

ifeq ($(USE_CUDA),1)
CFLAGS  += -DUSE_CUDA -I$(CUDA_HOME)/include
OBJS    += kernels.o matmul.o attention.o attention_sm90.o
LDLIBS  += -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lstdc++
endif

# NCCL: the first place that has both nccl.h and libnccl.so (or, as in pip's
# wheel, only libnccl.so.2: linked by its full path, either way). Tests move
# the system's root (NCCL_SYSROOT) and the wheel's directory (NCCL_PIP_DIR)
# to trees of their own.
comma := ,
space := $() $()
NCCL_SYSROOT ?= /
NCCL_SYS     := $(patsubst %/,%,$(NCCL_SYSROOT))
MULTIARCH    := $(shell $(CC) -print-multiarch 2>/dev/null)
# $(1): include directory, $(2): library directories; the library if both are there
nccl_lib = $(if $(wildcard $(1)/nccl.h),$(firstword $(wildcard $(foreach d,$(2),$(d)/libnccl.so $(d)/libnccl.so.2))))
# $(3) names the place; sets NCCL_INC_DIR and NCCL_LIB unless an earlier place had NCCL
define nccl_look
ifeq ($$(NCCL_LIB),)
NCCL_LIB     := $$(call nccl_lib,$(1),$(2))
NCCL_INC_DIR := $$(if $$(NCCL_LIB),$(1))
NCCL_LOOKED  += $(3)
endif
endef
ifeq ($(USE_CUDA),)
NCCL_WHY := no CUDA ($(if $(NO_CUDA),NO_CUDA=1,nvcc not found))
else ifneq ($(NO_NCCL),)
NCCL_WHY := NO_NCCL=1
else
ifneq ($(NCCL_HOME),)
$(eval $(call nccl_look,$(NCCL_HOME)/include,$(NCCL_HOME)/lib64 $(NCCL_HOME)/lib,NCCL_HOME=$(NCCL_HOME)))
endif
$(eval $(call nccl_look,$(CUDA_HOME)/include,$(CUDA_HOME)/lib64 $(CUDA_HOME)/lib,$(CUDA_HOME)))
$(eval $(call nccl_look,$(NCCL_SYS)/usr/include,$(NCCL_SYS)/usr/lib/$(MULTIARCH) $(NCCL_SYS)/usr/lib64 \
                        $(NCCL_SYS)/usr/lib,$(NCCL_SYS)/usr/include+lib/$(MULTIARCH)))
ifeq ($(NCCL_LIB),)
NCCL_PIP_DIR ?= $(firstword $(shell python3 -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null) \
                            $(wildcard $(HOME)/.local/lib/python3*/site-packages/nvidia/nccl \
                                       /usr/local/lib/python3*/dist-packages/nvidia/nccl))
endif
ifneq ($(NCCL_PIP_DIR),)
$(eval $(call nccl_look,$(NCCL_PIP_DIR)/include,$(NCCL_PIP_DIR)/lib,$(NCCL_PIP_DIR)))
else
NCCL_LOOKED += no-pip-nvidia-nccl
endif
NCCL_WHY := not found (looked in $(subst $(space),$(comma)$(space),$(strip $(NCCL_LOOKED))))
endif
ifneq ($(NCCL_LIB),)
USE_NCCL     := 1
NCCL_VERSION := $(shell awk '/^\#define NCCL_(MAJOR|MINOR|PATCH) /{v = v (v == "" ? "" : ".") $$3} END{print v}' \
                  $(NCCL_INC_DIR)/nccl.h)
CFLAGS       += -DUSE_NCCL -I$(NCCL_INC_DIR)
LDLIBS       += $(NCCL_LIB) -Wl,-rpath,$(dir $(NCCL_LIB))
NCCL_SAYS    := NCCL $(NCCL_VERSION): $(NCCL_INC_DIR)/nccl.h, $(NCCL_LIB)
else
NCCL_SAYS    := NCCL: none, $(NCCL_WHY)
endif

# Flag stamps: each object depends on the stamp of the flags that built it,
# rewritten (here, as the Makefile is read) only when those flags change, so
# that changing NCCL_HOME, NO_NCCL, CFLAGS or CUDA_ARCH rebuilds what they
# reach and nothing else. The C objects' stamp holds the NCCL decision (it
# is in CFLAGS and LDLIBS); nvcc's objects have their own, which NCCL never
# touches. version.o also depends on the git describe of the sources.
GIT_DESCRIBE := $(or $(shell git describe --always --dirty --tags 2>/dev/null),unknown)
CUDA_CODES   := $(if $(USE_CUDA),$(patsubst code=%,%,$(filter code=%,$(subst $(comma), ,$(CUDA_ARCH)))),none)
STAMP_C      := CC=$(CC) CFLAGS=$(CFLAGS) LDLIBS=$(LDLIBS) USE_CUDA=$(USE_CUDA) USE_NCCL=$(USE_NCCL) CUDA_HOME=$(CUDA_HOME)
STAMP_CU     := NVCC=$(NVCC) NVFLAGS=$(NVFLAGS)
STAMP_GIT    := $(GIT_DESCRIBE) $(CUDA_CODES)
# $(1): the stamp file, $(2): the name of the variable it holds. make -n
# writes nothing: the stamp only counts as changed.
DRY_RUN := $(findstring n,$(firstword -$(MAKEFLAGS)))
define stamp
ifneq ($$(file <$(1)),$$($(2)))
ifeq ($$(DRY_RUN),)
$$(file >$(1),$$($(2)))
else
$(1): stamp-changed
endif
endif
endef
.PHONY: stamp-changed
$(eval $(call stamp,.flags-c,STAMP_C))
$(eval $(call stamp,.flags-cu,STAMP_CU))
$(eval $(call stamp,.flags-version,STAMP_GIT))
.flags-c .flags-cu .flags-version: ;
version.o: CFLAGS += -DBUILD_GIT='"$(GIT_DESCRIBE)"' -DBUILD_CUDA_ARCH='"$(CUDA_CODES)"'
version.o: .flags-version

TESTS := test/test_ops test/test_cp test/test_cpu_gemm test/test_model test/test_kernels test/test_gemm test/test_flash test/test_comm test/test_rdzv test/test_layout \
         test/test_dp test/test_tp test/test_pp test/test_3d test/test_data

# The CPU emulation of CUDA and the programs that run over it: test/emu/emu.mk.
# (Its rules come before `all`: name the default goal.)
.DEFAULT_GOAL := all
include test/emu/emu.mk
# The emulation's C objects are compiled with CFLAGS too (emu.mk's
# EMU_CFLAGS): they follow the same stamp. Its C++ objects have flags of
# their own, EMU_CXXFLAGS, and no stamp.
$(EMU_TRAIN_SRCS:%=test/emu/train/%.o) test/emu/train/main.o test/emu/tensor_cuda.o test/emu/emu_dev.o: .flags-c


.PHONY: all build tests train test docs bench bench-cpu bench-comm bench-data bench-pipeline bench-plan bench-ckpt bench-cp compare-layouts clean

all: build

# `make train` is the demo; the binary it builds is also called train, so
# it is linked by the phony `build` (objects are cached; linking is cheap).
build: main.o $(OBJS)
	@echo "train: $(NCCL_SAYS)"
	$(CC) -o train main.o $(OBJS) $(LDLIBS)

# The demo's data: tinyshakespeare, split 90/10 into training and validation
# text. DATA=path trains on your own file instead (no validation split).
SHAKESPEARE_URL := https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt
ifeq ($(origin DATA),undefined)
DATA := data/tinyshakespeare_train.txt
VAL  := data/tinyshakespeare_val.txt
endif
GPUS := $(shell nvidia-smi -L 2>/dev/null | grep -c '^GPU')
# The layout for the GPUs found: the planner's choice (--layout auto, plan.c)
# for a global batch of 32 sequences. The model: 6 layers, 6 heads, 384 wide.
GPU_MODEL := --device cuda --layers 6 --heads 6 --dim 384 --seq 256 --steps 800 --shuffle \
             --lr 1e-3 --lr-min 1e-4 --warmup 50 --beta2 0.99
ifeq ($(GPUS),0)
TRAIN_DEFAULTS := --device cpu --layers 3 --heads 4 --dim 128 --batch 8 --seq 128 --steps 3600 \
                  --lr 6e-3 --lr-min 3e-4 --warmup 50 --beta2 0.99 --shuffle
else ifeq ($(GPUS),1)
TRAIN_DEFAULTS := $(GPU_MODEL) --batch 32
else
TRAIN_DEFAULTS := $(GPU_MODEL) --ranks $(GPUS) --layout auto --global-batch 32
endif

# The same command starts the run and continues it (--resume): after a stop
# (Ctrl-C, exit 75) `make train` again goes on from the last checkpoint.
train: build $(DATA) $(VAL)
	@rc=0; ./train --data $(DATA) $(if $(VAL),--val $(VAL) --val-every 250) $(TRAIN_DEFAULTS) \
	        --sample 400 --checkpoint-dir checkpoints --checkpoint-every 500 --resume --plot plot.svg $(TRAIN_FLAGS) || rc=$$?; \
	echo "the loss curve: plot.svg (open it in a browser; it is rewritten as the run goes)"; \
	if [ $$rc -eq 75 ]; then echo "stopped early with a checkpoint in checkpoints/; the same command continues:"; \
	    echo "  make train$(if $(TRAIN_FLAGS), TRAIN_FLAGS='$(TRAIN_FLAGS)')"; exit 75; fi; \
	[ $$rc -eq 0 ] || exit $$rc; \
	echo "checkpoints in checkpoints/ (the newest: checkpoints/$$(cat checkpoints/latest 2>/dev/null)); to train on, name more steps:"; \
	echo "  make train TRAIN_FLAGS='--steps <more steps>'   (rm -rf checkpoints to start over)"

# The repository carries it (corpus/, gzip'd: no network needed); a copy in
# ../shared or the download are the fallbacks should that file be missing.
data/tinyshakespeare.txt:
	@mkdir -p data
	@if [ -f corpus/tinyshakespeare.txt.gz ]; then gzip -dc corpus/tinyshakespeare.txt.gz > $@.tmp && mv $@.tmp $@; \
	elif [ -f ../shared/data/tinyshakespeare.txt ]; then cp ../shared/data/tinyshakespeare.txt $@; \
	elif curl -fsSL --max-time 120 -o $@.tmp $(SHAKESPEARE_URL); then mv $@.tmp $@; \
	else rm -f $@.tmp; echo "make train: no network to fetch tinyshakespeare; pass DATA=path/to/text.txt"; exit 2; fi

data/tinyshakespeare_train.txt: data/tinyshakespeare.txt
	head -c $$(( $$(wc -c < $<) * 9 / 10 )) $< > $@

data/tinyshakespeare_val.txt: data/tinyshakespeare.txt
	tail -c +$$(( $$(wc -c < $<) * 9 / 10 + 1 )) $< > $@

%.o: %.c *.h .flags-c
	$(CC) $(CFLAGS) -c $< -o $@

%.o: %.cu *.cuh tensor.h tc.h .flags-cu
	$(NVCC) $(NVFLAGS) -c $< -o $@

# The finite differences run on the CPU reference's plain loops in double:
# test_ops.c includes ops.c with OPS_REAL defined as double (ops.c's header).
test/test_ops: test/test_ops.c ops.c ops.o $(GEMM_OBJS) ops_bf16.o tensor.o test/check.h \
               $(filter kernels.o matmul.o attention.o attention_sm90.o,$(OBJS))
	$(CC) $(CFLAGS) -I. -o $@ test/test_ops.c ops.o $(GEMM_OBJS) ops_bf16.o tensor.o $(filter kernels.o matmul.o attention.o attention_sm90.o,$(OBJS)) $(LDLIBS)

# the GEMM under each kernel, and the ops on it against the float64 loops (test/exact64.c)
test/exact64.o: test/exact64.c test/exact64.h ops.c *.h .flags-c
	$(CC) $(CFLAGS) -I. -c $< -o $@
test/test_cpu_gemm: test/test_cpu_gemm.c test/exact64.o $(OBJS) test/check.h
	$(CC) $(CFLAGS) -I. -o $@ $< test/exact64.o $(OBJS) $(LDLIBS)

# the same checks of the AVX-512 kernel on a CPU without it (test/test_cpu_gemm_simde.sh):
# gemm_avx512.c compiled over SIMDe's AVX-512 header with the AVX2 flags, and a gemm.c that
# counts it runnable there; built on x86-64 where Debian's libsimde-dev is installed
SIMDE_H := $(wildcard /usr/include/simde/x86/avx512.h)
ifneq ($(and $(SIMDE_H),$(GEMM_AVX2_FLAGS)),)
TESTS += test/test_cpu_gemm_simde
endif
SIMDE_OBJS := test/emu/simde/gemm.o gemm_avx2.o test/emu/simde/gemm_avx512.o
test/emu/simde/%.o: %.c *.h .flags-c
	@mkdir -p test/emu/simde
	$(CC) $(CFLAGS) -c $< -o $@
test/emu/simde/gemm.o: override CFLAGS += -DGEMM_AVX512_EMULATED
test/emu/simde/gemm_avx512.o: override CFLAGS += $(GEMM_AVX2_FLAGS) -DGEMM_AVX512_SIMDE
test/test_cpu_gemm_simde: test/test_cpu_gemm.c test/exact64.o $(filter-out $(GEMM_OBJS),$(OBJS)) $(SIMDE_OBJS) test/check.h
	$(CC) $(CFLAGS) -DGEMM_AVX512_EMULATED -I. -o $@ $< test/exact64.o $(filter-out $(GEMM_OBJS),$(OBJS)) $(SIMDE_OBJS) $(LDLIBS)

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

# bench_gemm loads OpenBLAS with dlopen: it is the yardstick, never linked into train
bench/bench_gemm: bench/bench_gemm.c $(OBJS)
	$(CC) $(CFLAGS) -I. -o $@ $< $(OBJS) $(LDLIBS) -ldl

# bench_ops: each float32 op of a CPU training step, timed at the step's shapes
bench/bench_ops: bench/bench_ops.c $(OBJS)
	$(CC) $(CFLAGS) -I. -o $@ $< $(OBJS) $(LDLIBS)

bench-cpu: build bench/bench_gemm bench/bench_ops
	@sh bench/bench_cpu.sh

bench-comm: bench/bench_comm
	./bench/bench_comm

# one rank's loader: memory with 1 and 30 shards of 4M tokens, tokens/s (bench/bench_data.sh)
bench-data: bench/bench_data
	@sh bench/bench_data.sh

bench-pipeline: build
	@sh bench/bench_pipeline.sh

bench-plan: build bench/bench_comm
	@sh bench/plan_calibrate.sh

bench-ckpt: build
	@sh bench/bench_ckpt.sh

# a 124M-shaped model at T 4096 on cp 1, 2, 4: activations counted, peak RSS, the planner's (bench/cp_memory.sh)
bench-cp: build data/tinyshakespeare_train.txt
	@sh bench/cp_memory.sh

# one small model under 1 rank, DDP, ZeRO-3, TP, PP and 4D on the CPU: their
# loss curves on one plot, test/out/layouts.svg (STEPS=300)
compare-layouts: build
	@sh bench/compare_layouts.sh

clean:
	rm -f *.o test/exact64.o train $(TESTS) bench/bench_comm bench/bench_gpu bench/bench_gemm bench/bench_ops bench/bench_data
	rm -f test/emu/*.o test/emu/*_emu.cpp test/emu/emu_transform
	rm -rf test/emu/simde test/test_cpu_gemm_simde
	rm -rf test/out .flags-c .flags-cu .flags-version

# make fuzz, make sanitize
include fuzz/fuzz.mk
$(FUZZ_DIR)/gemm_avx2.o: FUZZ_CFLAGS += $(GEMM_AVX2_FLAGS)
$(FUZZ_DIR)/gemm_avx512.o: FUZZ_CFLAGS += $(GEMM_AVX512_FLAGS)

# The pictures and the generated part of the docs (docs/README.md says which
# are exact and which are illustrations): the --help block of docs/cli.md,
# the 1F1B schedule; with FIGURES=1 also a short run's loss curve and trace,
# which differ on every run.
docs: build data/tinyshakespeare_train.txt data/tinyshakespeare_val.txt
	@sh tools/make_docs.sh $(if $(FIGURES),--figures)

# test/test_cp_mutants.sh: test_cp built over a copy of cp.c with one bug planted (CP_SRC)
test/out/test_cp_mutant: test/test_cp.c $(filter-out cp.o,$(OBJS)) FORCE
	@mkdir -p test/out
	$(CC) $(CFLAGS) -I. -o $@ test/test_cp.c $(CP_SRC) $(filter-out cp.o,$(OBJS)) $(LDLIBS)
.PHONY: FORCE
FORCE:
