# Makefile: make (train_llama), make test, make test-asan, make native, make bench.
CC ?= gcc
BLAS_INC := /usr/include/x86_64-linux-gnu/openblas-openmp
BLAS_LIB := /usr/lib/x86_64-linux-gnu/openblas-openmp
CFLAGS ?= -O3 -g
override CFLAGS += -pthread -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -fopenmp -I. -Illmc \
          -I/usr/include/stb -I$(BLAS_INC)
MPI_CFLAGS := $(shell mpicc --showme:compile 2>/dev/null)
MPI_LIBS := $(shell mpicc --showme:link 2>/dev/null)
override CFLAGS += $(MPI_CFLAGS)
LDLIBS := -L$(BLAS_LIB) -Wl,-rpath,$(BLAS_LIB) -lopenblas -lyaml -lcjson -lm $(MPI_LIBS)
BUILD ?= build

LIB_SRC := llmc/util.c llmc/config.c llmc/model.c llmc/actstore.c llmc/diskio.c llmc/plan.c llmc/weights.c llmc/comm.c llmc/quantize.c llmc/gpt2_io.c llmc/train.c llmc/optim.c llmc/data.c llmc/checkpoint.c \
           llmc/safetensors.c llmc/hf.c llmc/nf4.c llmc/stb_ds_impl.c llmc/cpu/backend_cpu.c \
           llmc/cpu/kernels_f32.c llmc/cpu/kernels_f64.c
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o)
HDRS := $(wildcard llmc/*.h llmc/cpu/*.h llmc/cpu/*.inc)
TESTS := $(BUILD)/test_ops $(BUILD)/test_safetensors $(BUILD)/test_nf4

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

$(BUILD)/%.o: %.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/train_llama: $(BUILD)/train_llama.o $(LIB_OBJ)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/test_%: $(BUILD)/test/test_%.o $(LIB_OBJ)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

# -march=native only on request: the default binary must run on any x86-64.
native:
	$(MAKE) BUILD=build-native CFLAGS="-O3 -g -march=native" build-native/train_llama
	rm -f train_llama && cp build-native/train_llama train_llama

test: $(BUILD)/train_llama $(BUILD)/train_gpt $(TESTS)
	/usr/bin/python3 test/run_tests.py --build $(BUILD)

# The whole suite under AddressSanitizer + UndefinedBehaviorSanitizer.
test-asan:
	$(MAKE) BUILD=build-asan CFLAGS="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
	  build-asan/train_llama build-asan/train_gpt $(subst $(BUILD),build-asan,$(TESTS))
	ASAN_OPTIONS=detect_leaks=0 /usr/bin/python3 test/run_tests.py --build build-asan --asan

bench: train_llama
	bash dev/bench_cpu.sh

clean:
	rm -rf build build-asan build-native train_llama train_gpt

.PHONY: all native test test-asan bench clean train_llama train_gpt
.SECONDARY:
