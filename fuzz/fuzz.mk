# fuzz/fuzz.mk: libFuzzer targets and the sanitized build (included by the Makefile).
#
#   make fuzz [FUZZ_SECONDS=60]   each target of fuzz/ for that long, from a seed corpus made by train
#   make sanitize                 the CPU program and tests with -fsanitize=address,undefined, in a
#                                 scratch copy (build/sanitize), then the CPU suite under them
#
# The fuzz objects are clang's, in fuzz/build: the main tree's objects are never touched.
FUZZ_SECONDS ?= 60
FUZZ_CC      ?= clang
FUZZ_TARGETS := model tokens tokenizer args eval manifest log
FUZZ_DIR     := fuzz/build
FUZZ_SRCS    := $(filter-out $(basename $(wildcard *.cu)),$(basename $(OBJS)))   # the C objects: every .cu file's left out
FUZZ_OBJS    := $(FUZZ_SRCS:%=$(FUZZ_DIR)/%.o)
FUZZ_CFLAGS  := -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined \
                -fno-sanitize-recover=undefined -fopenmp -std=gnu11 -I. -w
FUZZ_BINS    := $(FUZZ_TARGETS:%=$(FUZZ_DIR)/fuzz_%)

$(FUZZ_DIR)/%.o: %.c *.h
	@mkdir -p $(FUZZ_DIR)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -c $< -o $@

$(FUZZ_DIR)/fuzz_%: fuzz/fuzz_%.c $(FUZZ_OBJS)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< $(FUZZ_OBJS) -lm -lpthread -lrt

.PHONY: fuzz fuzz-build sanitize
fuzz-build: $(FUZZ_BINS)

fuzz: build fuzz-build
	@sh fuzz/run.sh $(FUZZ_SECONDS)

# A copy of the sources (no objects) built with NO_CUDA=1 and the sanitizers;
# its test/run.sh runs the CPU suite there.
SANITIZE_DIR := build/sanitize
SANITIZE_TESTS := test/test_ops test/test_cpu_gemm test/test_model test/test_comm test/test_dp test/test_tp test/test_pp test/test_3d \
                  test/test_data $(if $(SIMDE_H),test/test_cpu_gemm_simde)
SANITIZE_CC  := gcc -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
sanitize:
	@rm -rf $(SANITIZE_DIR) && mkdir -p $(SANITIZE_DIR)
	@git ls-files -co --exclude-standard -- '*.c' '*.h' '*.cpp' '*.cu' '*.sh' '*.mk' '*.py' Makefile \
	    test/fixtures | tar -cf - -T - | tar -xf - -C $(SANITIZE_DIR)
	@ln -s $(abspath ../shared) $(SANITIZE_DIR)/../shared 2>/dev/null || true
	$(MAKE) --no-print-directory -C $(SANITIZE_DIR) -j$(NPROC) NO_CUDA=1 CC="$(SANITIZE_CC)" \
	    CFLAGS="-O1 -g -fopenmp -Wall -Wno-unused-parameter -Wno-psabi -std=gnu11" build $(SANITIZE_TESTS)
	cd $(SANITIZE_DIR) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
	    sh fuzz/sanitize_run.sh
