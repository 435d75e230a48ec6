/* Internal pieces of training shared between the data loader, checkpoints and the loop. */
#ifndef TLM_TRAIN_INTERNAL_H
#define TLM_TRAIN_INTERNAL_H

#include "core/core.h"

/* The optimizer's state (opaque in tlm.h): moments m and v of params [begin, begin + n), and the
 * steps taken. */
struct tlm_adamw {
    size_t begin, n;
    float *m, *v;
    long step;
};

/* What a trainer updates: the model's flat parameters, or an adapter's. */
typedef struct {
    float *params;
    size_t n;
    const tlm_tensor_info *tensors; /* offsets into params; decay flags */
    int n_tensors;
} trn_params;

/* Moments for [begin, end) of any parameter set. */
tlm_status trn_adamw_alloc(size_t begin, size_t end, tlm_adamw **out);
/* tlm_adamw_step_scaled over ps (the optimizer's range of it). */
void trn_adamw_update(tlm_adamw *o, const trn_params *ps, const float *grads, float grad_scale,
                      double lr, const tlm_adamw_opts *h);

/* B windows of T tokens of a split: windows first .. first + B - 1 of stream `stream` (see
 * tlm_dataset_window), ids and the next-token targets. */
tlm_status trn_dataset_windows(const tlm_dataset *d, tlm_split split, uint64_t seed,
                               uint64_t stream, uint64_t first, int B, int T, int32_t *ids,
                               int32_t *targets);

/* Rows of examples for a trainer: one example a row (a preference pair's sides in rows 2i and
 * 2i + 1, moving together), or packed (best fit, longest first) into rows of T. Epochs follow one
 * another, each in an order shuffled by (seed, epoch). */
typedef struct {
    const tlm_examples *e;
    int T, pack;
    size_t rows;
    int unit;       /* rows that move together: 1, or 2 for pairs */
    size_t *first;  /* [rows + 1]: row r holds ex[first[r] .. first[r + 1]) */
    uint32_t *ex;   /* examples, row after row */
    uint32_t *perm; /* the current epoch's order of units */
    long epoch;     /* whose order perm holds (-1: none) */
} trn_plan;

tlm_status trn_plan_make(const tlm_examples *e, int T, int pack, trn_plan *p);
void trn_plan_free(trn_plan *p);
/* Rows first .. first + B - 1 of the stream (shuffled per epoch, or in order; ids NULL: only
 * count them): ids, next-token
 * targets (masked where the token is not trained, and across examples), positions from 0 at each
 * example; *T_out the rows' length (packed: T; else the longest example among them). *tokens
 * counts the examples' tokens (no padding), *counted the targets. */
tlm_status trn_plan_rows(trn_plan *p, uint64_t seed, int shuffle, uint64_t first, int B,
                         int32_t *ids, int32_t *tg, int32_t *pos, int *T_out, long *tokens,
                         long *counted);
/* The example each of those rows starts with (unpacked: the one it holds). */
tlm_status trn_plan_row_examples(trn_plan *p, uint64_t seed, int shuffle, uint64_t first, int B,
                                 uint32_t *ex);

/* Everything needed to continue a run bit for bit. */
typedef struct {
    long step; /* steps completed */
    /* Draws nothing (a step's windows are a hash of seed and step); kept and seeded from the seed
     * so that every checkpoint, written by any version, has the keys rng_state and rng_inc that
     * the loader reads. */
    core_rng rng;
    uint64_t seed;
} trn_state;

/* OUTDIR/checkpoint.safetensors: parameters, AdamW moments, step and RNG; one atomic write. */
tlm_status trn_checkpoint_save(const char *path, const tlm_model *m, const tlm_adamw *opt,
                               const trn_state *st);
tlm_status trn_checkpoint_load(const char *path, tlm_model *m, tlm_adamw *opt, trn_state *st);
/* The same for an adapter trained over base config c: its tensors, the moments, the state, and
 * the adapter's options (a resumed run must ask for the same). */
tlm_status trn_lora_checkpoint_save(const char *path, const tlm_lora *a, const tlm_adamw *opt,
                                    const trn_state *st);
tlm_status trn_lora_checkpoint_load(const char *path, tlm_lora *a, tlm_adamw *opt, trn_state *st);

#endif
