#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core.h"

#define CORE_ERR_LEN 1024

static _Thread_local char g_msg[CORE_ERR_LEN];

const char *tlm_last_error(void) { return g_msg; }

tlm_status core_err(tlm_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_msg, sizeof g_msg, fmt, ap);
    va_end(ap);
    return s;
}

tlm_status core_err_context(tlm_status s, const char *fmt, ...) {
    char prefix[CORE_ERR_LEN];
    char old[CORE_ERR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, g_msg, sizeof old);
    /* Truncation of an over-long message is acceptable; build it piecewise to say so. */
    size_t n = strlen(prefix);
    if (n > sizeof g_msg - 3) n = sizeof g_msg - 3;
    memcpy(g_msg, prefix, n);
    memcpy(g_msg + n, ": ", 2);
    size_t rest = sizeof g_msg - n - 3;
    size_t m = strlen(old);
    if (m > rest) m = rest;
    memcpy(g_msg + n + 2, old, m);
    g_msg[n + 2 + m] = 0;
    return s;
}

const char *tlm_status_name(tlm_status s) {
    switch (s) {
    case TLM_OK: return "ok";
    case TLM_ERR_ARG: return "invalid argument";
    case TLM_ERR_CONFIG: return "config error";
    case TLM_ERR_IO: return "I/O error";
    case TLM_ERR_FORMAT: return "format error";
    case TLM_ERR_NOMEM: return "out of memory";
    case TLM_ERR_RANGE: return "out of range";
    case TLM_ERR_UNSUPPORTED: return "unsupported";
    case TLM_ERR_NUMERIC: return "numeric error";
    case TLM_ERR_INTERRUPTED: return "interrupted";
    }
    return "unknown error";
}
