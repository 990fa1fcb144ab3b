# test/emu/emu.mk: the rules that build the CPU emulation of CUDA (and of
# NCCL) and the test programs that run over it; included by the Makefile,
# whose variables (CC, CFLAGS, CUDA_HOME, TESTS, ...) it uses.
#
# The CUDA kernels under the CPU emulation (test/emu/emu.h, run by
# test/test_emu.sh): built wherever CUDA's headers are, GPU or not, nvcc or
# not. emu_transform rewrites each .cu (its inline PTX, shared memory and
# launches) into C++ for the host compiler; the kernels themselves are the
# real source.
EMU_CUDA_INC := $(wildcard $(CUDA_HOME)/include/cuda_bf16.h)
ifneq ($(EMU_CUDA_INC),)
TESTS += test/test_flash_emu test/test_gemm_emu test/test_kernels_emu test/test_streams_emu
endif
# -fno-strict-aliasing: device code reinterprets freely (kernels.cu's 16-byte
# vectors store through uint4 into float and bf16 arrays); nvcc compiles
# that as meant, and g++ must too. -DMM_EMU_SM90A builds matmul.cu's sm_90a
# kernel (wgmma, TMA) for the host too; it runs where the emulated device
# says 9.0 (EMU_ARCH=sm_90a), as on an H100.
EMU_CXXFLAGS := -O2 -std=c++17 -fno-strict-aliasing -DMM_EMU_SM90A -Itest/emu -I. -I$(CUDA_HOME)/include -Wall \
                -Wno-unknown-pragmas -Wno-unused-parameter -Wno-unused-function -Wno-psabi
EMU_OBJS := test/emu/emu_rt.o test/emu/emu_dev.o

.SECONDARY: test/emu/attention_emu.cpp test/emu/attention_sm90_emu.cpp test/emu/matmul_emu.cpp test/emu/kernels_emu.cpp

test/emu/emu_transform: test/emu/emu_transform.cpp
	$(CXX) -O2 -std=c++17 -o $@ $<

test/emu/%_emu.cpp: %.cu test/emu/emu_transform
	test/emu/emu_transform $< $< $@

# *.cuh: sm90.cuh, which matmul.cu and attention_sm90.cu include (its plain helpers
# compile here; emu.h stands in for its PTX).
test/emu/%_emu.o: test/emu/%_emu.cpp test/emu/emu.h test/emu/emu_stream.h tc.h *.cuh
	$(CXX) $(EMU_CXXFLAGS) -c $< -o $@

test/emu/emu_rt.o: test/emu/emu_rt.cpp test/emu/emu.h test/emu/emu_stream.h
	$(CXX) $(EMU_CXXFLAGS) -c $< -o $@

test/emu/emu_dev.o: test/emu/emu_dev.c tensor.h
	$(CC) $(CFLAGS) -I. -c $< -o $@

# The runtime's streams, timings and race detector, proved with deliberate
# bugs (test/test_emu.sh runs it in each EMU_STREAMS timing).
test/test_streams_emu: test/test_streams_emu.cpp test/check.h test/emu/emu.h test/emu/emu_stream.h test/emu/emu_rt.o
	$(CXX) $(EMU_CXXFLAGS) -o $@ $< test/emu/emu_rt.o -lpthread

# test_flash_emu holds attention_sm90.cu too (its sm_90a forward runs where
# EMU_ARCH=sm_90a; test/test_flash_sm90_emu.sh runs that and its mutants).
FLASH_EMU_OBJS := test/emu/attention_emu.o test/emu/attention_sm90_emu.o
test/test_flash_emu: test/test_flash.c test/check.h tensor.h tc.h $(FLASH_EMU_OBJS) $(EMU_OBJS)
	$(CC) $(CFLAGS) -DUSE_CUDA -DFLASH_EMU -I. -o $@ $< $(FLASH_EMU_OBJS) $(EMU_OBJS) -lm -fopenmp -lstdc++

test/test_gemm_emu: test/test_gemm.c test/check.h tensor.h tc.h test/emu/matmul_emu.o $(EMU_OBJS)
	$(CC) $(CFLAGS) -DUSE_CUDA -DGEMM_EMU -I. -I$(CUDA_HOME)/include -o $@ $< test/emu/matmul_emu.o $(EMU_OBJS) -lm -fopenmp -lstdc++

# test_kernels against kernels.cu (both tables; the bf16 one reaches
# attention.cu and matmul.cu through tc.h) over the real tensor.c, built with
# USE_CUDA so that its Dev goes through kernels.cu's cuda_* functions and
# they through emu_rt.cpp's emulated runtime (host memory, synchronous): no
# emu_dev.o here. The CPU reference is ops.o and ops_bf16.o as built above
# (they hold no USE_CUDA code).
KERNELS_EMU_OBJS := test/emu/kernels_emu.o test/emu/attention_emu.o test/emu/attention_sm90_emu.o test/emu/matmul_emu.o \
                    test/emu/emu_rt.o test/emu/tensor_cuda.o ops.o $(GEMM_OBJS) ops_bf16.o

test/emu/tensor_cuda.o: tensor.c tensor.h
	$(CC) $(CFLAGS) -DUSE_CUDA -c $< -o $@

test/test_kernels_emu: test/test_kernels.c test/check.h tensor.h $(KERNELS_EMU_OBJS)
	$(CC) $(CFLAGS) -DUSE_CUDA -DKERNELS_EMU -I. -o $@ $< $(KERNELS_EMU_OBJS) -lm -fopenmp -lstdc++

# The whole training program's CUDA path under the emulation: test/train_emu
# is main.c and every object built with USE_CUDA (never USE_NCCL: ranks that
# share the one emulated GPU talk over shared memory, staging through
# tensor.c's Dev), the .cu files from the emulation, and emu_rt.cpp in place
# of the CUDA runtime. It reports one GPU, "CPU emulation of sm_80", so
# --device cuda runs there; each forked rank has its own emulated runtime.
# test_model_emu (-DMODEL_EMU) runs test_model's CUDA checks in-process over
# the same objects and through test/train_emu; test_3d_emu (-DTRAIN_EMU) a
# few of test_3d's CUDA layouts through it; test/test_emu.sh runs both.
EMU_TRAIN_SRCS := args layout setup runlog score stop tensor ops gemm gemm_avx2 gemm_avx512 ops_bf16 gpt data eval ckpt checkpoint safe optim comm comm_launch comm_shm comm_nccl rendezvous dp cp zero tp pp pp_sched plan trace selftest version plot
EMU_TRAIN_OBJS := $(EMU_TRAIN_SRCS:%=test/emu/train/%.o) test/emu/kernels_emu.o \
                  test/emu/attention_emu.o test/emu/attention_sm90_emu.o test/emu/matmul_emu.o test/emu/emu_rt.o
EMU_CFLAGS := $(filter-out -DUSE_NCCL,$(CFLAGS)) -DUSE_CUDA -I$(CUDA_HOME)/include
EMU_LDLIBS := -lm -fopenmp -lpthread -lrt -lstdc++
ifneq ($(EMU_CUDA_INC),)
TESTS += test/test_model_emu test/test_3d_emu test/test_selftest_emu
endif

test/emu/train/%.o: %.c *.h
	@mkdir -p test/emu/train
	$(CC) $(EMU_CFLAGS) -c $< -o $@

test/emu/train/gemm_avx2.o: EMU_CFLAGS += $(GEMM_AVX2_FLAGS)
test/emu/train/gemm_avx512.o: EMU_CFLAGS += $(GEMM_AVX512_FLAGS)
test/emu/train_nccl/gemm_avx2.o: EMU_NCCL_CFLAGS += $(GEMM_AVX2_FLAGS)
test/emu/train_nccl/gemm_avx512.o: EMU_NCCL_CFLAGS += $(GEMM_AVX512_FLAGS)

test/train_emu: test/emu/train/main.o $(EMU_TRAIN_OBJS)
	$(CC) -o $@ $^ $(EMU_LDLIBS)

test/test_model_emu: test/test_model.c test/check.h $(EMU_TRAIN_OBJS) test/train_emu
	$(CC) $(EMU_CFLAGS) -DMODEL_EMU -I. -o $@ $< $(EMU_TRAIN_OBJS) $(EMU_LDLIBS)

# test_selftest_emu: selftest.c with deliberately wrong kernels, and train_emu's line.
test/test_selftest_emu: test/test_selftest_emu.c test/check.h selftest.h $(EMU_TRAIN_OBJS) test/train_emu
	$(CC) $(EMU_CFLAGS) -I. -o $@ $< $(EMU_TRAIN_OBJS) $(EMU_LDLIBS)

test/test_3d_emu: test/test_3d.c test/check.h test/train_run.h $(EMU_TRAIN_OBJS) test/train_emu
	$(CC) $(EMU_CFLAGS) -DTRAIN_EMU -I. -o $@ $< $(EMU_TRAIN_OBJS) $(EMU_LDLIBS)

.PHONY: emu-train-clean
clean: emu-train-clean
emu-train-clean:
	rm -rf test/emu/train test/train_emu

# The emulated NCCL (test/emu/emu_nccl.cpp, NCCL's own nccl.h for every type
# and prototype): a program links $(EMU_NCCL_OBJS) in place of libnccl, with
# the emulated runtime test/emu/emu_rt.o whose streams its operations run on.
# test/test_nccl_emu checks it (forked ranks, one emulated GPU each); built
# where nccl.h is ($(NCCL_INC_DIR) when the Makefile found NCCL, else CUDA's
# include directory), and run by test/test_emu.sh.
EMU_NCCL_H := $(firstword $(wildcard $(NCCL_INC_DIR)/nccl.h $(CUDA_HOME)/include/nccl.h))
EMU_NCCL_OBJS := test/emu/emu_nccl.o
ifneq ($(and $(EMU_CUDA_INC),$(EMU_NCCL_H)),)
TESTS += test/test_nccl_emu
endif

test/emu/emu_nccl.o: test/emu/emu_nccl.cpp test/emu/emu_stream.h
	$(CXX) $(EMU_CXXFLAGS) -I$(dir $(EMU_NCCL_H)) -c $< -o $@

test/test_nccl_emu: test/test_nccl_emu.c test/check.h $(EMU_NCCL_OBJS) test/emu/emu_rt.o
	$(CC) $(CFLAGS) -I. -I$(CUDA_HOME)/include -I$(dir $(EMU_NCCL_H)) -o $@ $< $(EMU_NCCL_OBJS) test/emu/emu_rt.o \
	      -lpthread -lstdc++

# The multi-GPU path under the emulation: test/train_nccl_emu is train_emu
# built with USE_NCCL (comm_nccl.c: a communicator and a stream a group,
# the watchdog) and linked with the emulated NCCL in place of libnccl, each
# forked rank its own emulated GPU (EMU_GPUS). test_3d_nccl_emu runs the
# layouts of a GPU box through it in two stream timings; test_comm_nccl_emu
# is test_comm's table over comm_nccl.c (test/test_emu.sh runs both).
EMU_NCCL_CFLAGS := $(EMU_CFLAGS) -DUSE_NCCL -I$(dir $(EMU_NCCL_H))
EMU_NCCL_TRAIN_OBJS := $(EMU_TRAIN_SRCS:%=test/emu/train_nccl/%.o) test/emu/kernels_emu.o \
                       test/emu/attention_emu.o test/emu/attention_sm90_emu.o test/emu/matmul_emu.o test/emu/emu_rt.o $(EMU_NCCL_OBJS)
ifneq ($(and $(EMU_CUDA_INC),$(EMU_NCCL_H)),)
TESTS += test/train_nccl_emu test/test_3d_nccl_emu test/test_comm_nccl_emu
endif

test/emu/train_nccl/%.o: %.c *.h
	@mkdir -p test/emu/train_nccl
	$(CC) $(EMU_NCCL_CFLAGS) -c $< -o $@

test/train_nccl_emu: test/emu/train_nccl/main.o $(EMU_NCCL_TRAIN_OBJS)
	$(CC) -o $@ $^ $(EMU_LDLIBS)

test/test_3d_nccl_emu: test/test_3d.c test/check.h test/train_run.h $(EMU_NCCL_TRAIN_OBJS) test/train_nccl_emu
	$(CC) $(EMU_NCCL_CFLAGS) -DTRAIN_NCCL_EMU -I. -o $@ $< $(EMU_NCCL_TRAIN_OBJS) $(EMU_LDLIBS)

test/test_comm_nccl_emu: test/test_comm.c test/check.h $(EMU_NCCL_TRAIN_OBJS)
	$(CC) $(EMU_NCCL_CFLAGS) -I. -o $@ $< $(EMU_NCCL_TRAIN_OBJS) $(EMU_LDLIBS)

clean: emu-nccl-clean
.PHONY: emu-nccl-clean
emu-nccl-clean:
	rm -rf test/emu/train_nccl test/train_nccl_emu test/test_3d_nccl_emu test/test_comm_nccl_emu

# test/test_flash_sm90_emu.sh: test_flash_emu over a copy of attention_sm90.cu
# with one bug planted (F3_SRC), transformed and built here.
test/out/test_flash_sm90_mutant: test/test_flash.c test/check.h tensor.h tc.h *.cuh test/emu/attention_emu.o \
                                 $(EMU_OBJS) test/emu/emu_transform FORCE
	@mkdir -p test/out/f3_mutant
	test/emu/emu_transform $(F3_SRC) attention_sm90.cu test/out/f3_mutant/attention_sm90_emu.cpp
	$(CXX) $(EMU_CXXFLAGS) -c test/out/f3_mutant/attention_sm90_emu.cpp -o test/out/f3_mutant/attention_sm90_emu.o
	$(CC) $(CFLAGS) -DUSE_CUDA -DFLASH_EMU -I. -o $@ $< test/emu/attention_emu.o \
	      test/out/f3_mutant/attention_sm90_emu.o $(EMU_OBJS) -lm -fopenmp -lstdc++
