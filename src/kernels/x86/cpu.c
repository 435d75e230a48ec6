/* syscall(), for AMX's arch_prctl */
#define _GNU_SOURCE
#include "kernels/cpu.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <pthread.h>
#include <stdint.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

k_cpu_info k_cpu_detected;
_Atomic int k_cpu_ready;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static uint64_t xcr0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (uint64_t)hi << 32 | lo;
}

static int amx_permit(void) {
#if defined(__linux__) && defined(SYS_arch_prctl)
    /* ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, for the whole process */
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
#else
    return 0;
#endif
}

static void detect(void) {
    unsigned a, b, c, d;
    int lvl = K_ISA_REF;
    /* "AuthenticAMD" as cpuid leaf 0 spells it across ebx, edx, ecx. */
    if (__get_cpuid(0, &a, &b, &c, &d))
        k_cpu_detected.amd = b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;
    if (__get_cpuid(1, &a, &b, &c, &d)) {
        int fma = (c >> 12) & 1, osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, f16c = (c >> 29) & 1;
        uint64_t x = osxsave ? xcr0() : 0;
        if (fma && avx && f16c && (x & 6) == 6 && __get_cpuid_max(0, NULL) >= 7) {
            __cpuid_count(7, 0, a, b, c, d);
            int avx2 = (b >> 5) & 1, f = (b >> 16) & 1, dq = (b >> 17) & 1, bw = (b >> 30) & 1,
                vl = (b >> 31) & 1, vnni = (c >> 11) & 1;
            if (avx2) {
                lvl = K_ISA_AVX2;
                unsigned a1, b1, c1, d1;
                __cpuid_count(7, 1, a1, b1, c1, d1);
                k_cpu_detected.avxvnni = (a1 >> 4) & 1;
                (void)b1, (void)c1, (void)d1;
            }
            int amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1, amx_int8 = (d >> 25) & 1;
            /* the OS must save the opmask and upper ZMM state (XCR0 bits 5-7) */
            if (f && dq && bw && vl && vnni && (x & 0xE0) == 0xE0) {
                lvl = K_ISA_AVX512;
                __cpuid_count(7, 1, a, b, c, d);
                k_cpu_detected.avx512bf16 = (a >> 5) & 1;
                /* AMX: the OS saves the tile state (XCR0 bits 17, 18) and lets this process use
                 * the tile data, which Linux grants only on request. */
                int tiles =
                    amx_tile && (x & 0x60000) == 0x60000 && (amx_bf16 || amx_int8) && amx_permit();
                k_cpu_detected.amx_bf16 = tiles && k_cpu_detected.avx512bf16 && amx_bf16;
                k_cpu_detected.amx_int8 = tiles && amx_int8;
            }
        }
    }
    k_cpu_detected.isa = lvl;
    k_cpu_ready = 1;
}

void k_cpu_detect(void) { pthread_once(&once, detect); }

#endif
