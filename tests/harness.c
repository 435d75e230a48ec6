#include "harness.h"

#include <stdlib.h>
#include <sys/stat.h>

int t_passed = 0, t_failed = 0;

int t_finish(const char *name) {
    printf("%s: %d passed, %d failed\n", name, t_passed, t_failed);
    return t_failed == 0 && t_passed > 0 ? 0 : 1;
}

const char *t_shared_data(void) {
    static char buf[4096];
    const char *env = getenv("TLM_SHARED_DATA");
    if (env) return env;
    snprintf(buf, sizeof buf, "%s/../shared/data", TLM_SOURCE_DIR);
    struct stat st;
    return stat(buf, &st) == 0 ? buf : NULL;
}

const char *t_path(const char *dir, const char *name) {
    static char bufs[8][4096];
    static int i = 0;
    char *b = bufs[i++ & 7];
    snprintf(b, 4096, "%s/%s", dir, name);
    return b;
}
