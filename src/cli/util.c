#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <dirent.h>
#include <sys/stat.h>
#include <time.h>

#include "cli.h"
#include "core/core.h"
#include "io/gguf.h"

int cli_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("tlm: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

int cli_fail_status(const char *what) { return cli_fail("%s: %s", what, tlm_last_error()); }

int cli_flag_value(int argc, char **argv, int *i, const char *name, const char *alt,
                   const char **val) {
    const char *a = argv[*i];
    if (strcmp(a, name) != 0 && !(alt && strcmp(a, alt) == 0)) return 0;
    if (*i + 1 >= argc) {
        *val = NULL;
        return 1;
    }
    *val = argv[++*i];
    return 1;
}

int cli_parse_int(const char *s, long *out) {
    if (!s || !*s) return 0;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end) return 0;
    *out = v;
    return 1;
}

int cli_parse_int_list(const char *s, long lo, long hi, long *out, int cap) {
    char *buf = s ? strdup(s) : NULL;
    int n = 0;
    if (!buf) return 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        long v;
        if (n == cap || !cli_parse_int(tok, &v) || v < lo || v > hi) {
            n = 0;
            break;
        }
        out[n++] = v;
    }
    free(buf);
    return n;
}

int cli_parse_float(const char *s, double *out) {
    if (!s || !*s) return 0;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end) return 0;
    *out = v;
    return 1;
}

int cli_wants_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return 1;
    return 0;
}

static int is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* The tokenizer that travels with a model: a tlm checkpoint's DIR/tokenizer, or a model file or
 * directory that holds a vocabulary itself (GGUF, Hugging Face directories). Absent is not an
 * error; a tokenizer that is there but broken is. */
tlm_status cli_model_tokenizer(const char *model, tlm_tokenizer **out) {
    *out = NULL;
    if (is_dir(model)) {
        size_t n = strlen(model) + 16;
        char *p = malloc(n);
        if (!p) return TLM_ERR_NOMEM;
        snprintf(p, n, "%s/tokenizer", model);
        tlm_status s = is_dir(p) ? tlm_tokenizer_load(p, out) : TLM_OK;
        free(p);
        if (s || *out) return s;
        if (tlm_tokenizer_load(model, out) != TLM_OK) *out = NULL;
        return TLM_OK;
    }
    size_t n = strlen(model);
    if (n > 5 && !strcmp(model + n - 5, ".gguf") && tlm_tokenizer_load(model, out) != TLM_OK)
        *out = NULL;
    return TLM_OK;
}

double cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* llama.cpp's names of its KV cache types (common/arg.cpp), all of which tlm's cache takes */
static const struct {
    const char *name;
    tlm_dtype t;
} cache_types[] = {
    {"f32", TLM_DTYPE_F32},       {"f16", TLM_DTYPE_F16},   {"bf16", TLM_DTYPE_BF16},
    {"q8_0", TLM_DTYPE_Q8_0},     {"q4_0", TLM_DTYPE_Q4_0}, {"q4_1", TLM_DTYPE_Q4_1},
    {"iq4_nl", TLM_DTYPE_IQ4_NL}, {"q5_0", TLM_DTYPE_Q5_0}, {"q5_1", TLM_DTYPE_Q5_1}};
#define N_CACHE_TYPES (sizeof cache_types / sizeof cache_types[0])

int cli_cache_type(const char *cmd, const char *v, tlm_dtype *t) {
    for (size_t i = 0; v && i < N_CACHE_TYPES; i++)
        if (!strcasecmp(v, cache_types[i].name)) {
            *t = cache_types[i].t;
            return 1;
        }
    fprintf(stderr,
            "tlm: %s: --cache-type must be one of f16, f32, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, "
            "q5_1 (got '%s')\n",
            cmd, v ? v : "");
    return 0;
}

const char *cli_cache_type_name(tlm_dtype t) {
    for (size_t i = 0; i < N_CACHE_TYPES; i++)
        if (cache_types[i].t == t) return cache_types[i].name;
    return "?";
}

int cli_cache_flag(const char *cmd, int argc, char **argv, int *i, cli_cache *c) {
    const char *v;
    tlm_dtype t;
    int which = cli_flag_value(argc, argv, i, "--cache-type", NULL, &v)       ? 3
                : cli_flag_value(argc, argv, i, "-ctk", "--cache-type-k", &v) ? 1
                : cli_flag_value(argc, argv, i, "-ctv", "--cache-type-v", &v) ? 2
                                                                              : 0;
    if (!which) return 0;
    if (!cli_cache_type(cmd, v, &t)) return -1;
    if (which & 1) c->k = t;
    if (which & 2) c->v = t;
    return 1;
}

void cli_cache_opts(const cli_cache *c, tlm_session_opts *o) {
    o->kv_type = c->k;
    o->v_type_set = c->v != c->k;
    o->v_type = c->v;
}

/* Bytes the kernel says could be given to a process now without swapping (0: unknown). */
static unsigned long long mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kib = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) break;
    fclose(f);
    return kib * 1024ull;
}

/* Bytes of the model at path: the file, or a directory's .safetensors files (0: unknown). */
static unsigned long long model_bytes(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) return 0;
    if (!S_ISDIR(st.st_mode)) return (unsigned long long)st.st_size;
    unsigned long long sum = 0;
    DIR *d = opendir(path);
    if (!d) return 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        if (n < 12 || strcmp(e->d_name + n - 12, ".safetensors")) continue;
        char *p = core_path_join(path, e->d_name);
        if (p && stat(p, &st) == 0) sum += (unsigned long long)st.st_size;
        free(p);
    }
    closedir(d);
    return sum;
}

int cli_map_flag(const char *arg, int *mode) {
    if (strcmp(arg, "--mmap") && strcmp(arg, "--no-mmap")) return 0;
    *mode = arg[2] == 'n' ? CLI_MAP_READ : CLI_MAP_FILE;
    return 1;
}

int cli_read_mode(const char *path, int mode) {
    if (mode != CLI_MAP_AUTO) return mode == CLI_MAP_READ;
    /* a copy that would crowd out the rest (and the file's own page cache) is not worth it */
    unsigned long long avail = mem_available();
    return !avail || model_bytes(path) <= avail / 2;
}

int cli_load_flags(const char *cmd, int read, const char *precision, unsigned *flags) {
    *flags = read ? TLM_LOAD_READ : 0;
    if (!precision || !strcmp(precision, "auto")) return 1;
    if (!strcmp(precision, "bf16")) {
        /* the matrices become copies either way: the rest stays in the mapped file */
        *flags = TLM_LOAD_BF16;
        return 1;
    }
    if (!strcmp(precision, "fp32")) {
        *flags |= TLM_LOAD_FP32;
        return 1;
    }
    fprintf(stderr, "tlm: %s: --precision must be auto, fp32 or bf16 (got '%s')\n", cmd, precision);
    return 0;
}

int cli_gguf_template(const char *model, tlm_chat_template *t, int *present) {
    *present = 0;
    tlm_model_format f;
    if (tlm_model_detect(model, &f) || f != TLM_FORMAT_GGUF) return 0;
    io_gguf *g = NULL;
    if (io_gguf_open(model, &g)) return 0;
    const char *s = NULL;
    size_t n = 0;
    int ok = 0;
    if (!io_gguf_get_str(g, "tokenizer.chat_template", &s, &n)) {
        *present = 1;
        char *z = malloc(n + 1);
        if (z) {
            memcpy(z, s, n);
            z[n] = 0;
            ok = tlm_chat_template_detect(z, t);
            free(z);
        }
    }
    io_gguf_close(g);
    return ok;
}

int cli_gguf_pooling(const char *model) {
    tlm_model_format f;
    if (tlm_model_detect(model, &f) || f != TLM_FORMAT_GGUF) return -1;
    io_gguf *g = NULL;
    if (io_gguf_open(model, &g)) return -1;
    const char *arch = NULL;
    size_t n = 0;
    int64_t v = -1;
    char key[160];
    if (!io_gguf_get_str(g, "general.architecture", &arch, &n) && n < 100) {
        snprintf(key, sizeof key, "%.*s.pooling_type", (int)n, arch);
        if (io_gguf_get_int(g, key, &v) || v < 0 || v > 1000) v = -1;
    }
    io_gguf_close(g);
    return (int)v;
}
