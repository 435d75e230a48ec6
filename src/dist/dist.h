/* Training over several processes (data parallel, ZeRO-1) on MPI, outside the library: the
 * trainer's hooks (tlm_train_hooks) implemented with MPI collectives. Built into the command line
 * only; without MPI at build time every function here reports that and dist_launched still tells
 * when a launcher started the process. */
#ifndef TLM_DIST_H
#define TLM_DIST_H

#include <stddef.h>

#include "tlm.h"

typedef struct dist_state dist_state;

/* Whether an MPI launcher (mpirun, srun, mpiexec) started this process, read from the
 * environment alone, so that a plain run never touches MPI; *world receives the process count
 * the launcher announced (1 when unknown), *rank this process's. */
int dist_launched(int *world, int *rank);
/* Processes on this host, from the launcher's environment (1 when unknown). */
int dist_local_size(void);
/* 1 when this tlm was built with MPI. */
int dist_available(void);

/* MPI_Init and the communicator; errors come back as statuses, not aborts. */
tlm_status dist_init(dist_state **out);
int dist_rank(const dist_state *d);
int dist_world(const dist_state *d);
/* Fills h with ZeRO-1 hooks for a model of n parameters: gradients reduce-scattered (each rank
 * keeps the mean over the ranks of its range [begin, end)), the sum of squares and losses summed,
 * parameters all-gathered after the update, moments gathered to rank 0 for checkpoints. */
tlm_status dist_hooks(dist_state *d, size_t n, tlm_train_hooks *h);
/* 1 on every rank when any rank passes failed != 0 (an error status of the collective: -1). */
int dist_any(dist_state *d, int failed);
/* Every rank's value of x gathered on rank 0 into all[world] (others may pass NULL). */
tlm_status dist_gather_double(dist_state *d, double x, double *all);
/* Seconds spent in communication so far, and calls counted. */
double dist_comm_seconds(const dist_state *d);
/* Ends MPI: a normal finalize when every rank agrees to stop; otherwise MPI_Abort, which makes
 * the launcher stop the other ranks instead of leaving them waiting in a collective. */
void dist_finish(dist_state *d, int ok, int code);

#endif
