/* The registry of weights repacked once for a model's life (qgemm.h: k_qgemm_register). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "core/knob.h"
#include "kernels/gemm_traits.h"
#include "kernels/qgemm.h"

/* Once turned on (k_qgemm_cache_enable), weights whose data lies in a registered range (a model's
 * mapped file) are repacked once, on the first product that needs them, and kept until the range is
 * forgotten (the model is freed). By default, and for weights not owned by a model, every call
 * repacks group by group. Entries are immutable once published, and every access holds the lock, so
 * the model stays shareable. */
typedef struct qc_range {
    const char *base;
    size_t len;
    struct qc_range *next;
} qc_range;

typedef struct qc_entry {
    const void *data;
    tlm_dtype t;
    int64_t rows, cols;
    size_t row_bytes, bytes;
    void *packed; /* groups of pack_bytes, back to back */
    struct qc_entry *next;
} qc_entry;

static pthread_mutex_t qc_lock = PTHREAD_MUTEX_INITIALIZER;
static qc_range *qc_ranges;
static qc_entry *qc_entries;

void k_qgemm_register(const void *base, size_t len) {
    qc_range *r = malloc(sizeof *r);
    if (!r) return; /* then its weights are repacked per call */
    pthread_mutex_lock(&qc_lock);
    *r = (qc_range){base, len, qc_ranges};
    qc_ranges = r;
    pthread_mutex_unlock(&qc_lock);
}

static int in_range(const void *p, const char *base, size_t len) {
    return (const char *)p >= base && (size_t)((const char *)p - base) < len;
}

void k_qgemm_forget(const void *base, size_t len) {
    pthread_mutex_lock(&qc_lock);
    for (qc_range **r = &qc_ranges; *r;) {
        if ((*r)->base == base && (*r)->len == len) {
            qc_range *dead = *r;
            *r = dead->next;
            free(dead);
        } else {
            r = &(*r)->next;
        }
    }
    for (qc_entry **e = &qc_entries; *e;) {
        if (in_range((*e)->data, base, len)) {
            qc_entry *dead = *e;
            *e = dead->next;
            core_big_free(dead->packed, dead->bytes);
            free(dead);
        } else {
            e = &(*e)->next;
        }
    }
    pthread_mutex_unlock(&qc_lock);
}

size_t k_qgemm_cached_bytes(const void *base, size_t len) {
    size_t n = 0;
    pthread_mutex_lock(&qc_lock);
    for (qc_entry *e = qc_entries; e; e = e->next)
        if (in_range(e->data, base, len)) n += e->bytes;
    pthread_mutex_unlock(&qc_lock);
    return n;
}

/* The pack cache is off unless turned on: repacking per call (the AVX-512 pack) costs about what
 * reading a kept copy saves, while the copy takes 1.25 bytes per weight (more than a Q4 file),
 * makes a one-shot prompt pay for building it, and slows the prompts right after it is built
 * (bench/quant/prefill_paths.sh run both ways in a benchmark build, TLM_QCACHE=on, compares
 * them). */
static atomic_int cache_state = -1; /* -1: not read yet; 0: off; 1: on */

static int cache_on(void) {
    int st = atomic_load_explicit(&cache_state, memory_order_relaxed);
    if (st < 0) {
        const char *e = core_bench_knob("TLM_QCACHE");
        st = e && !strcmp(e, "on");
        atomic_store_explicit(&cache_state, st, memory_order_relaxed);
    }
    return st;
}

void k_qgemm_cache_enable(int on) {
    atomic_store_explicit(&cache_state, on ? 1 : 0, memory_order_relaxed);
}

/* The whole weight repacked, from the cache or built now; NULL when w is not in a registered
 * range or there is no memory for it. */
const char *k_qgemm_cache_get(const tlm_weight *w, size_t pack_bytes, int isa) {
    if (!cache_on()) return NULL;
    const char *found = NULL;
    pthread_mutex_lock(&qc_lock);
    for (qc_entry *e = qc_entries; e && !found; e = e->next)
        if (e->data == w->data && e->t == w->dtype && e->rows == w->rows && e->cols == w->cols &&
            e->row_bytes == w->row_bytes)
            found = e->packed;
    int ours = 0;
    for (qc_range *r = qc_ranges; r && !ours; r = r->next)
        ours = in_range(w->data, r->base, r->len);
    if (!found && ours) {
        /* Built under the lock: a second caller waits for this copy rather than making its own. */
        int groups = (int)((w->rows + K_QG_ROWS - 1) / K_QG_ROWS), nsb = 0;
        size_t bytes = (size_t)groups * pack_bytes;
        qc_entry *e = malloc(sizeof *e);
        /* huge pages where the system gives them: far fewer faults on the first touch */
        void *p = e ? core_big_alloc(bytes) : NULL;
        if (p) {
            nsb = (int)(w->cols / k_qgemm_sub(w->dtype));
#pragma omp parallel for schedule(static)
            for (int g = 0; g < groups; g++) {
                float *ps = (float *)((char *)p + (size_t)g * pack_bytes),
                      *pm = ps + nsb * K_QG_ROWS;
                int r0 = g * K_QG_ROWS;
                int nr = w->rows - r0 < K_QG_ROWS ? (int)(w->rows - r0) : K_QG_ROWS;
                k_qgemm_pack_isa(isa, w, r0, nr, (uint8_t *)(pm + nsb * K_QG_ROWS), ps, pm);
            }
            *e =
                (qc_entry){w->data, w->dtype, w->rows, w->cols, w->row_bytes, bytes, p, qc_entries};
            qc_entries = e;
            found = p;
        } else {
            free(e);
        }
    }
    pthread_mutex_unlock(&qc_lock);
    return found;
}
