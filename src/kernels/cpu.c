/* Architectures without a folder of their own under src/kernels run the plain C kernels. */
#include "cpu.h"

#if !defined(__x86_64__) && !defined(__i386__)
k_cpu_info k_cpu_detected = {K_ISA_REF, 0, 0, 0, 0, 0};
_Atomic int k_cpu_ready = 1;
void k_cpu_detect(void) {}
#endif
