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
