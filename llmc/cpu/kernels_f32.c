// kernels_f32.c: the float kernels the CPU backend runs, picked once per process for the CPU.
// kernels.inc is compiled three times over float (kernels_f32_{base,avx2,avx512}.c, the last
// two with their instruction sets enabled in the Makefile), and each name_f32 here is a GNU
// indirect function: the dynamic loader calls its resolver once and binds the widest variant
// the CPU supports. The default binary still runs on any x86-64, and the variants give the same
// bits: contraction is off (-std=c11), reductions are scalar and ordered, and vexpf (vexpv in
// the AVX2 and AVX-512 exponential loops) is the same float arithmetic at every width, fmaf
// rounding once with or without FMA (test_cpu_variants compares each variant with the base).
#include "kernels.h"

#if defined(__x86_64__) && defined(__ELF__)
// Resolvers run while the loader relocates, before sanitizers are initialised.
#define RESOLVER static __attribute__((no_sanitize("address", "undefined"), used))

RESOLVER int cpu_level(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return 2;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 1;
    return 0;
}

int kernels_f32_level(void) { return cpu_level(); }

#define DISPATCH(name)                                                                          \
    RESOLVER __typeof__(name##_f32_base) *name##_f32_resolve(void) {                            \
        int l = cpu_level();                                                            \
        return l == 2 ? name##_f32_avx512 : l == 1 ? name##_f32_avx2 : name##_f32_base;         \
    }                                                                                           \
    __typeof__(name##_f32_base) name##_f32 __attribute__((ifunc(#name "_f32_resolve")));
#else
#error "kernels_f32.c: the variant dispatch is written for x86-64 ELF (GNU ifunc)"
#endif

KERNEL_NAMES(DISPATCH)
