/* What this CPU and operating system run, read once (cpuid, xgetbv, and Linux's permission for AMX
 * tiles). The kernels' vector code is compiled with per-function target attributes (x86/simd.h),
 * so one binary runs on any x86-64; these answers pick which versions run. Other architectures
 * report K_ISA_REF and nothing else (the plain C kernels). */
#ifndef TLM_KERNELS_CPU_H
#define TLM_KERNELS_CPU_H

/* Instruction-set levels of the kernels, in increasing order. K_ISA_AVX2 means AVX2 with FMA and
 * F16C; K_ISA_AVX512 means AVX-512 F, BW, VL, DQ and VNNI (Ice Lake, Zen 4 and later). */
enum { K_ISA_REF, K_ISA_AVX2, K_ISA_AVX512, K_ISA_COUNT };

typedef struct {
    int isa;     /* the highest K_ISA_* level */
    int avxvnni; /* 256-bit VEX vpdpbusd without AVX-512 (Intel's client cores since Alder Lake) */
    int avx512bf16; /* at K_ISA_AVX512, also vdpbf16ps */
    int amx_bf16;   /* AMX tiles with BF16 products, granted to this process by the OS */
    int amx_int8;   /* AMX tiles with int8 products, likewise */
    int amd;        /* cpuid's vendor is AMD (some decode choices measured differently there) */
} k_cpu_info;

/* The answers for this machine, read on the first call (thread-safe). Inline, because kernels
 * ask inside their calls: after the first, it is one load and a branch. */
extern k_cpu_info k_cpu_detected;
extern _Atomic int k_cpu_ready;
void k_cpu_detect(void);
static inline const k_cpu_info *k_cpu(void) {
    if (!k_cpu_ready) k_cpu_detect();
    return &k_cpu_detected;
}

#endif
