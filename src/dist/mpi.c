/* tlm_train_hooks over MPI: ZeRO-1 data parallelism (see dist.h). */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "core/core.h"
#include "dist/dist.h"

static int env_int(const char *name, int fallback) {
    const char *v = getenv(name);
    if (!v || !*v) return fallback;
    char *end;
    long x = strtol(v, &end, 10);
    return *end || x < 0 || x > 1 << 24 ? fallback : (int)x;
}

int dist_launched(int *world, int *rank) {
    /* Open MPI, then PMIx (Open MPI 5, Slurm), then MPICH's Hydra and Slurm's PMI. */
    static const char *const sizes[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE"};
    static const char *const ranks[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"};
    for (int i = 0; i < 3; i++)
        if (getenv(sizes[i]) || getenv(ranks[i])) {
            *world = env_int(sizes[i], 1);
            *rank = env_int(ranks[i], 0);
            return 1;
        }
    *world = 1;
    *rank = 0;
    return 0;
}

int dist_local_size(void) {
    int n = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 0);
    if (!n) n = env_int("MPI_LOCALNRANKS", 0);
    return n > 0 ? n : 1;
}

#ifndef TLM_HAVE_MPI

int dist_available(void) { return 0; }
tlm_status dist_init(dist_state **out) {
    *out = NULL;
    return core_err(TLM_ERR_UNSUPPORTED,
                    "this tlm was built without MPI, so it cannot train across processes; install "
                    "libopenmpi-dev (scripts/setup.sh) and rebuild, or run without mpirun");
}
int dist_rank(const dist_state *d) { return 0; }
int dist_world(const dist_state *d) { return 1; }
tlm_status dist_hooks(dist_state *d, size_t n, tlm_train_hooks *h) {
    return core_err(TLM_ERR_UNSUPPORTED, "built without MPI");
}
int dist_any(dist_state *d, int failed) { return failed != 0; }
tlm_status dist_gather_double(dist_state *d, double x, double *all) {
    if (all) all[0] = x;
    return TLM_OK;
}
double dist_comm_seconds(const dist_state *d) { return 0; }
void dist_finish(dist_state *d, int ok, int code) {}

#else

#include <mpi.h>

struct dist_state {
    MPI_Comm comm;
    int rank, world;
    size_t n;             /* parameters */
    int *counts, *displs; /* every rank's range of the flat buffer */
    float *part;          /* this rank's reduced range before scaling */
    double comm_s;
};

static tlm_status mpi_fail(const dist_state *d, const char *what, int rc) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "code %d", rc);
    return core_err(TLM_ERR_IO, "rank %d of %d: %s failed: %s", d->rank, d->world, what, msg);
}

int dist_available(void) { return 1; }

tlm_status dist_init(dist_state **out) {
    *out = NULL;
#ifdef __GLIBC__
    /* Open MPI's reductions take temporary buffers the size of the message at every call. glibc
     * serves such sizes with fresh mappings and unmaps them on free, so each step would fault in
     * hundreds of MB of new pages, which dominated the communication time (bench/mpi/run.sh);
     * keeping the buffers in the heap and the heap unshrunk avoids that. Our own big arrays are
     * mmapped directly (core/mem.c) and are not affected. */
    mallopt(M_MMAP_MAX, 0);
    mallopt(M_TRIM_THRESHOLD, INT_MAX);
#endif
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited && MPI_Init(NULL, NULL) != MPI_SUCCESS)
        return core_err(TLM_ERR_IO, "MPI_Init failed");
    dist_state *d = calloc(1, sizeof *d);
    if (!d) return core_err(TLM_ERR_NOMEM, "out of memory");
    d->comm = MPI_COMM_WORLD;
    /* Errors come back to us, so a broken peer gives a message instead of a silent abort. */
    MPI_Comm_set_errhandler(d->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(d->comm, &d->rank);
    MPI_Comm_size(d->comm, &d->world);
    *out = d;
    return TLM_OK;
}

int dist_rank(const dist_state *d) { return d->rank; }
int dist_world(const dist_state *d) { return d->world; }
double dist_comm_seconds(const dist_state *d) { return d->comm_s; }

static tlm_status reduce_grads(void *user, float *grads, size_t n, float *loss) {
    dist_state *d = user;
    double t0 = core_now_s();
    int rc = MPI_Reduce_scatter(grads, d->part, d->counts, MPI_FLOAT, MPI_SUM, d->comm);
    if (rc != MPI_SUCCESS) return mpi_fail(d, "reducing the gradients", rc);
    /* The mean over the ranks: every rank's gradient is of its own equal share of the batch. */
    float inv = 1.0f / (float)d->world, *dst = grads + d->displs[d->rank];
    long cnt = d->counts[d->rank];
#pragma omp parallel for schedule(static)
    for (long i = 0; i < cnt; i++) dst[i] = d->part[i] * inv;
    double l = *loss;
    rc = MPI_Allreduce(MPI_IN_PLACE, &l, 1, MPI_DOUBLE, MPI_SUM, d->comm);
    if (rc != MPI_SUCCESS) return mpi_fail(d, "reducing the loss", rc);
    *loss = (float)(l / d->world);
    d->comm_s += core_now_s() - t0;
    return TLM_OK;
}

static tlm_status reduce_sum(void *user, double *v, int n) {
    dist_state *d = user;
    double t0 = core_now_s();
    int rc = MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, MPI_SUM, d->comm);
    d->comm_s += core_now_s() - t0;
    return rc == MPI_SUCCESS ? TLM_OK : mpi_fail(d, "a sum over the ranks", rc);
}

static tlm_status reduce_sumsq(void *user, double *ss) { return reduce_sum(user, ss, 1); }

static tlm_status after_update(void *user, float *params, size_t n) {
    dist_state *d = user;
    double t0 = core_now_s();
    int rc = MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, params, d->counts, d->displs,
                            MPI_FLOAT, d->comm);
    d->comm_s += core_now_s() - t0;
    return rc == MPI_SUCCESS ? TLM_OK : mpi_fail(d, "gathering the parameters", rc);
}

static tlm_status gather(void *user, const float *part, size_t begin, size_t n, float *whole,
                         size_t total) {
    dist_state *d = user;
    if (total != d->n || begin != (size_t)d->displs[d->rank] || n != (size_t)d->counts[d->rank])
        return core_err(TLM_ERR_ARG, "gather: range [%zu, %zu) is not rank %d's", begin, begin + n,
                        d->rank);
    int rc =
        MPI_Gatherv(part, (int)n, MPI_FLOAT, whole, d->counts, d->displs, MPI_FLOAT, 0, d->comm);
    return rc == MPI_SUCCESS ? TLM_OK : mpi_fail(d, "gathering the optimizer state", rc);
}

tlm_status dist_hooks(dist_state *d, size_t n, tlm_train_hooks *h) {
    if (n > (size_t)0x7fffffff)
        return core_err(TLM_ERR_UNSUPPORTED,
                        "%zu parameters: MPI counts are int, so at most 2^31 - 1 are supported", n);
    if ((size_t)d->world > n)
        return core_err(TLM_ERR_ARG, "%d ranks for %zu parameters", d->world, n);
    free(d->counts);
    free(d->displs);
    free(d->part);
    d->n = n;
    d->counts = malloc((size_t)d->world * sizeof *d->counts);
    d->displs = malloc((size_t)d->world * sizeof *d->displs);
    d->part = NULL;
    if (!d->counts || !d->displs) return core_err(TLM_ERR_NOMEM, "out of memory");
    for (int r = 0; r < d->world; r++) {
        /* Even ranges; a tensor may straddle two ranks (AdamW clips tensors to the range). */
        size_t lo = n * (size_t)r / (size_t)d->world, hi = n * (size_t)(r + 1) / (size_t)d->world;
        d->displs[r] = (int)lo;
        d->counts[r] = (int)(hi - lo);
    }
    d->part = malloc((size_t)d->counts[d->rank] * sizeof *d->part);
    if (!d->part) return core_err(TLM_ERR_NOMEM, "out of memory");
    memset(h, 0, sizeof *h);
    h->reduce_grads = reduce_grads;
    h->reduce_sumsq = reduce_sumsq;
    h->after_update = after_update;
    h->reduce_sum = reduce_sum;
    h->gather = gather;
    h->user = d;
    h->begin = (size_t)d->displs[d->rank];
    h->end = h->begin + (size_t)d->counts[d->rank];
    h->rank = d->rank;
    h->world = d->world;
    return TLM_OK;
}

int dist_any(dist_state *d, int failed) {
    int v = failed != 0;
    if (MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_MAX, d->comm) != MPI_SUCCESS) return -1;
    return v;
}

tlm_status dist_gather_double(dist_state *d, double x, double *all) {
    int rc = MPI_Gather(&x, 1, MPI_DOUBLE, all, 1, MPI_DOUBLE, 0, d->comm);
    return rc == MPI_SUCCESS ? TLM_OK : mpi_fail(d, "gathering", rc);
}

void dist_finish(dist_state *d, int ok, int code) {
    if (!d) return;
    if (!ok && d->world > 1) MPI_Abort(d->comm, code ? code : 1);
    free(d->counts);
    free(d->displs);
    free(d->part);
    free(d);
    MPI_Finalize();
}

#endif
