/* tlm: decoder-only Transformer language models in C. The public API of libtlm.
 *
 * Programs include this header; it includes the parts in tlm/, one per area: base.h (status codes,
 * errors, runtime, element types), tokenizer.h, model.h (configs, models, model files), train.h
 * (batched passes, AdamW, datasets, the trainer), generate.h (sessions, samplers, generation) and
 * quantize.h (quantized GGUF, importance matrices). Link with `pkg-config --libs tlm`.
 *
 * Conventions:
 * - Names are tlm_<object>_<verb>. Every object is an opaque handle made by tlm_<object>_new (from
 *   values) or tlm_<object>_load (from a file or directory) and destroyed by tlm_<object>_free,
 *   which accepts NULL; tlm_tokenizer_train_bpe also makes one (by training). tlm_<object>_save
 *   writes an object to a file, tlm_<object>_read fills an existing one from a file. Enum values
 *   have a tlm_<enum>_name, and parsers of names are tlm_<enum>_parse.
 * - Options are plain structs: tlm_<struct>_defaults(&o) sets every field (tlm_config_defaults,
 *   tlm_session_opts_defaults, ...), then the caller changes what it needs. Where a comment says
 *   so, NULL options mean the defaults.
 * - Errors: a call that can fail returns a tlm_status, TLM_OK (0) or an error code, and on failure
 *   leaves a one-line message naming the problem in tlm_last_error() (per thread). A constructor
 *   that fails leaves *out NULL. The library never prints, exits or aborts on bad input.
 * - Ownership: the caller owns what a constructor makes and frees it with the matching _free. An
 *   object made over another (a session or training context over a model, a decoder over a
 *   tokenizer, a trainer over a model and a dataset) keeps a pointer to it, and the other must
 *   outlive it. Pointers a getter returns point into the object and stay valid while it lives (or
 *   as the comment says); buffers made for the caller are malloc'd, freed with free().
 * - Threads: models, tokenizers and datasets are read-only once made (but for a writable model's
 *   parameters while its owner updates them), and any number of threads may use one at once; any
 *   other object is used by one thread at a time. A call runs its loops on the threads that
 *   tlm_threads_set asks for (OpenMP and BLAS).
 * - Token ids are int32_t; arrays are row-major, weight matrices [out, in]. */
#ifndef TLM_H
#define TLM_H

#include "tlm/base.h"
#include "tlm/generate.h"
#include "tlm/lora.h"
#include "tlm/model.h"
#include "tlm/quantize.h"
#include "tlm/tokenizer.h"
#include "tlm/train.h"

#endif
