# Makefile: make (train_llama), make test, make test-asan, make native, make bench,
#           make test-cuda (GPU), make test-cuda-emu (the CUDA kernels on the CPU emulator),
#           make fuzz / make fuzz-quick (libFuzzer targets in fuzz/, needs clang).
CC ?= gcc
BLAS_INC := /usr/include/x86_64-linux-gnu/openblas-openmp
BLAS_LIB := /usr/lib/x86_64-linux-gnu/openblas-openmp
CFLAGS ?= -O3 -g
# Neither changes a value: no code here reads errno after a math call or enables FP traps; they
# let loops with sqrt and selects (vexpf, AdamW) vectorize.
override CFLAGS += -fno-math-errno -fno-trapping-math
override CFLAGS += -pthread -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -fopenmp -I. -Illmc \
          -I/usr/include/stb -I$(BLAS_INC)
MPI_CFLAGS := $(shell mpicc --showme:compile 2>/dev/null)
MPI_LIBS := $(shell mpicc --showme:link 2>/dev/null)
override CFLAGS += $(MPI_CFLAGS)
LDLIBS := -L$(BLAS_LIB) -Wl,-rpath,$(BLAS_LIB) -lopenblas -lyaml -lcjson -lm $(MPI_LIBS)
BUILD ?= build

LIB_SRC := llmc/util.c llmc/hfcache.c llmc/json.c llmc/metrics.c llmc/export.c llmc/peft.c llmc/config.c llmc/config_rules.c llmc/model.c llmc/forward_backward.c llmc/family.c llmc/actstore.c llmc/diskio.c llmc/plan.c llmc/weights.c llmc/comm.c llmc/quantize.c llmc/gpt2_io.c llmc/gpt2_cli.c llmc/train.c llmc/optim.c llmc/data.c llmc/rows.c llmc/preference.c llmc/prepare.c llmc/seqpar.c llmc/checkpoint.c llmc/opprof.c \
           llmc/safetensors.c llmc/hf.c llmc/nf4.c llmc/int8.c llmc/freeze.c llmc/lisa.c llmc/deepspeed.c llmc/stb_ds_impl.c llmc/cpu/backend_cpu.c \
           llmc/cpu/kernels_f32.c llmc/cpu/kernels_f32_base.c llmc/cpu/kernels_f32_avx2.c \
           llmc/cpu/kernels_f32_avx512.c llmc/cpu/kernels_f64.c
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o)
C_LIB_OBJ := $(LIB_OBJ)
HDRS := $(wildcard llmc/*.h llmc/cpu/*.h llmc/cpu/*.inc)
TESTS := $(BUILD)/test_ops $(BUILD)/test_cpu_variants $(BUILD)/test_safetensors $(BUILD)/test_nf4 $(BUILD)/test_comm $(BUILD)/test_seqpar

# ---- CUDA backend (llmc/cuda), built into the same binary when nvcc is found ----------------
# USE_CUDA=0 forces a CPU-only build (test-asan does: sanitizers and nvcc objects do not mix);
# without CUDA the program links llmc/cuda/backend_cuda_stub.c, whose backend_cuda_available()
# says why there is no GPU backend. CUDA_GENCODE picks the GPU architectures (default: sm_90
# machine code plus compute_90 PTX; add e.g. -gencode arch=compute_80,code=sm_80 for A100).
NVCC ?= $(shell command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)
USE_CUDA ?= $(if $(wildcard $(NVCC)),1,0)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(realpath $(NVCC)))
CUDA_LIB ?= $(CUDA_HOME)/lib64
CUDA_GENCODE ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
NVCCFLAGS ?= -O3 -std=c++17 $(CUDA_GENCODE)
CU_SRC := $(wildcard llmc/cuda/*.cu)
CU_HDRS := $(wildcard llmc/cuda/*.cuh)
DEV_CUDA := $(patsubst dev/cuda/%.cu,%,$(wildcard dev/cuda/*.cu))
BASE_LDLIBS := $(LDLIBS)
ifeq ($(USE_CUDA),1)
LIB_OBJ += $(CU_SRC:%.cu=$(BUILD)/%.o)
override CFLAGS += -DLLMC_CUDA
LDLIBS += -L$(CUDA_LIB) -Wl,-rpath,$(CUDA_LIB) -lcublasLt -lcudart -lnccl -lstdc++
else
LIB_OBJ += $(BUILD)/llmc/cuda/backend_cuda_stub.o
endif

all: train_llama train_gpt
train_llama: $(BUILD)/train_llama
	rm -f $@ && cp $< $@
train_gpt: $(BUILD)/train_gpt
	rm -f $@ && cp $< $@

# train_gpt.cu is host code: compiled as C here so a machine without nvcc builds it too.
$(BUILD)/train_gpt.o: train_gpt.cu $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -x c -c $< -o $@

$(BUILD)/train_gpt: $(BUILD)/train_gpt.o $(LIB_OBJ)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

# The float kernels once per instruction set; kernels_f32.c binds the widest the CPU has.
# Kernels are optimized in every build: at the sanitizer build's -O1 nothing vectorizes, and
# attention's hand-written products (att_mm) ran its long-context tests many times slower.
$(BUILD)/llmc/cpu/kernels_f32_base.o $(BUILD)/llmc/cpu/kernels_f64.o: override CFLAGS += -O3
$(BUILD)/llmc/cpu/kernels_f32_avx2.o: override CFLAGS += -O3 -mavx2 -mfma
$(BUILD)/llmc/cpu/kernels_f32_avx512.o: override CFLAGS += -O3 -mavx2 -mfma -mavx512f -mavx512bw -mavx512dq \
    -mavx512vl -mprefer-vector-width=512

$(BUILD)/%.o: %.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/train_llama: $(BUILD)/train_llama.o $(LIB_OBJ)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/test_%: $(BUILD)/test/test_%.o $(LIB_OBJ)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/llmc/cuda/%.o: llmc/cuda/%.cu $(CU_HDRS) $(HDRS)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -I. -Illmc -c $< -o $@

# dev/cuda: one test + benchmark program per kernel (see dev/cuda/README.md); they need a GPU.
$(BUILD)/dev/cuda/%.o: dev/cuda/%.cu dev/cuda/dev_common.cuh $(CU_HDRS) $(HDRS)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -I. -Illmc -c $< -o $@

$(BUILD)/dev/cuda/%: $(BUILD)/dev/cuda/%.o $(LIB_OBJ)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

cuda-dev: $(DEV_CUDA:%=$(BUILD)/dev/cuda/%)

test-cuda:
	@if [ "$(USE_CUDA)" != 1 ]; then echo "test-cuda: nvcc not found ($(NVCC)); no CUDA build"; exit 1; fi
	$(MAKE) cuda-dev
	@st=0; for t in $(DEV_CUDA); do echo "== dev/cuda/$$t"; $(BUILD)/dev/cuda/$$t $(CUDA_TEST_ARGS) || st=1; done; exit $$st

# The CUDA kernels and dev/cuda programs compiled by g++ against dev/cuda/emu (a SIMT emulator
# on CPU threads) and run with --quick: checks kernel logic without a GPU (not speed, not
# tensor-core layouts, not real cuBLASLt). Needs the CUDA headers only.
EMU := build-emu
CXX ?= g++
EMU_CXXFLAGS := -std=c++17 -O2 -g -pthread -fno-strict-aliasing -DLLMC_EMU -Wall -Wno-unknown-pragmas -Wno-unused-function \
                -I. -Illmc -Idev/cuda/emu -I$(CUDA_HOME)/include -I$(BLAS_INC)
EMU_OBJ := $(CU_SRC:llmc/cuda/%.cu=$(EMU)/cuda/%.o) $(EMU)/cuda/cuda_emu.o

$(EMU)/cuda/%.o: llmc/cuda/%.cu $(CU_HDRS) $(HDRS) dev/cuda/emu/cuda_emu.h
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -x c++ -c $< -o $@

$(EMU)/cuda/cuda_emu.o: dev/cuda/emu/cuda_emu.cpp dev/cuda/emu/cuda_emu.h
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -c $< -o $@

$(EMU)/dev/%.o: dev/cuda/%.cu dev/cuda/dev_common.cuh $(CU_HDRS) $(HDRS) dev/cuda/emu/cuda_emu.h
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -x c++ -c $< -o $@

$(EMU)/dev/%: $(EMU)/dev/%.o $(EMU_OBJ) $(C_LIB_OBJ)
	$(CXX) -fopenmp -pthread $^ -o $@ $(BASE_LDLIBS)

# The whole trainer over the emulated CUDA backend (device: cuda runs on the CPU, ~10^4 times
# slower than a GPU): test_cuda_emu_train.py compares its bf16 training with the CPU backend
# (train_gpt's through scripts/gpu_train_check.py gpt --tiny).
$(EMU)/train_llama: $(BUILD)/train_llama.o $(EMU_OBJ) $(C_LIB_OBJ)
	$(CXX) -fopenmp -pthread $^ -o $@ $(BASE_LDLIBS)
$(EMU)/train_gpt: $(BUILD)/train_gpt.o $(EMU_OBJ) $(C_LIB_OBJ)
	$(CXX) -fopenmp -pthread $^ -o $@ $(BASE_LDLIBS)

test-cuda-emu: $(DEV_CUDA:%=$(EMU)/dev/%)
	@st=0; for t in $(DEV_CUDA); do echo "== emulated dev/cuda/$$t"; $(EMU)/dev/$$t --quick || st=1; done; exit $$st

# -march=native only on request: the default binary must run on any x86-64.
native:
	$(MAKE) BUILD=build-native CFLAGS="-O3 -g -march=native" build-native/train_llama
	rm -f train_llama && cp build-native/train_llama train_llama

test: $(BUILD)/train_llama $(BUILD)/train_gpt $(TESTS)
	/usr/bin/python3 test/run_tests.py --build $(BUILD)

# The whole suite under AddressSanitizer + UndefinedBehaviorSanitizer.
test-asan:
	$(MAKE) BUILD=build-asan USE_CUDA=0 CFLAGS="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
	  build-asan/train_llama build-asan/train_gpt $(subst $(BUILD),build-asan,$(TESTS))
	ASAN_OPTIONS=detect_leaks=0 /usr/bin/python3 test/run_tests.py --build build-asan --asan

# ---- Fuzzing (clang + libFuzzer under ASan + UBSan; README.md, "Fuzzing") ------------------
# make fuzz [FUZZ_SECONDS=600]: each target for FUZZ_SECONDS; make fuzz-quick: 20 s each.
# Objects and fuzzers go to build/fuzz; crashes land in build/fuzz/crashes/TARGET/.
FUZZ_CC ?= clang
FUZZ_BUILD := build/fuzz
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := safetensors hf_config yaml_config shard trainer_state adapter_config rows hellaswag gpt2_bin
FUZZ_CFLAGS := -O1 -g -fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined

$(BUILD)/fuzz/%.o: fuzz/%.c $(wildcard fuzz/*.h) $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/fuzz_%: $(BUILD)/fuzz/fuzz_%.o $(LIB_OBJ)
	$(CC) $(CFLAGS) -fsanitize=fuzzer $^ -o $@ $(LDLIBS)

fuzz-build:
	$(MAKE) BUILD=$(FUZZ_BUILD) USE_CUDA=0 CC=$(FUZZ_CC) CFLAGS="$(FUZZ_CFLAGS)" $(FUZZ_TARGETS:%=$(FUZZ_BUILD)/fuzz_%)

fuzz: fuzz-build
	bash fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_SECONDS) $(FUZZ_TARGETS)

fuzz-quick: fuzz-build
	bash fuzz/run.sh $(FUZZ_BUILD) 20 $(FUZZ_TARGETS)

bench: train_llama $(BUILD)/sgemm_roofline
	bash dev/bench_cpu.sh

# The SGEMM-only time of a training step, with the OpenBLAS the trainer links (dev/bench_cpu.sh).
$(BUILD)/sgemm_roofline: dev/sgemm_roofline.c
	@mkdir -p $(dir $@)
	$(CC) -O2 -Wall -fopenmp -I$(BLAS_INC) $< -o $@ -L$(BLAS_LIB) -Wl,-rpath,$(BLAS_LIB) -lopenblas

# The CPU attention kernels alone: float vs double check, then forward/backward times.
$(BUILD)/bench_attention: dev/bench_attention.c $(BUILD)/llmc/cpu/kernels_f32.o $(BUILD)/llmc/cpu/kernels_f32_base.o \
    $(BUILD)/llmc/cpu/kernels_f32_avx2.o $(BUILD)/llmc/cpu/kernels_f32_avx512.o $(BUILD)/llmc/cpu/kernels_f64.o \
    $(BUILD)/llmc/util.o
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

clean:
	rm -rf build build-asan build-native build-emu train_llama train_gpt

.PHONY: all native test test-asan test-cuda test-cuda-emu cuda-dev bench clean train_llama train_gpt fuzz fuzz-quick fuzz-build
.SECONDARY:
