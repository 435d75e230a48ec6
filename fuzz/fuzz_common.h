/* Shared by the libFuzzer targets: the loaders under test take paths (they mmap files), so each
 * input is written to a per-process temporary file first. */
#ifndef TLM_FUZZ_COMMON_H
#define TLM_FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static const char *fuzz_file(const char *suffix, const uint8_t *data, size_t size) {
    static char path[8][256];
    static int k = 0;
    char *p = path[k++ & 7];
    snprintf(p, 256, "/tmp/tlm_fuzz_%ld_%d%s", (long)getpid(), k, suffix);
    FILE *f = fopen(p, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    fclose(f);
    return p;
}

#endif
