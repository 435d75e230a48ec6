/* The continuous-batching scheduler. One thread owns one tlm_session of `parallel` sequences
 * (slots). Each turn of its loop it admits queued jobs into free slots (choosing the slot whose
 * cached tokens share the longest prefix with the prompt, and truncating the cache to it),
 * then runs one pass (tlm_session_step) that advances every decoding slot by one token and
 * prefills chunks of waiting prompts (a bounded number of tokens while others decode), so each
 * weight is read once per step for all of them, as llama-server's one batch per step does. Jobs
 * join and leave between steps. The lock guards the queue, the jobs' outputs and
 * the counters; the model is never touched under it. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"
#include "serve/serve.h"

double srv_now(void) { return core_now_s(); }

size_t srv_stop_scan(const char *buf, size_t len, char *const *stops, int n_stops, int *hit) {
    *hit = 0;
    size_t first = len;
    for (int i = 0; i < n_stops; i++) {
        size_t sl = strlen(stops[i]);
        if (!sl || sl > len) continue;
        for (size_t p = 0; p + sl <= len && p < first; p++)
            if (!memcmp(buf + p, stops[i], sl)) {
                first = p;
                *hit = i + 1;
                break;
            }
    }
    if (*hit) return first;
    /* Hold back the longest tail that is a proper prefix of some stop string. */
    size_t hold = 0;
    for (int i = 0; i < n_stops; i++) {
        size_t sl = strlen(stops[i]);
        for (size_t k = sl - 1 < len ? sl - 1 : len; k > hold; k--)
            if (!memcmp(buf + len - k, stops[i], k)) {
                hold = k;
                break;
            }
    }
    return len - hold;
}

srv_job *srv_job_new(const int32_t *ids, int n) {
    srv_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->ids = malloc((size_t)(n > 0 ? n : 1) * sizeof *j->ids);
    if (!j->ids) {
        free(j);
        return NULL;
    }
    if (n > 0) memcpy(j->ids, ids, (size_t)n * sizeof *ids);
    j->n_ids = n;
    j->max_tokens = -1;
    j->end_id = -1;
    j->stop_word = -1;
    j->slot = -1;
    j->spec_n_max = j->spec_n_min = -1;
    j->spec_p_min = -1.0f;
    tlm_sampler_opts_defaults(&j->sampling);
    return j;
}

void srv_job_free(srv_job *j) {
    if (!j) return;
    free(j->ids);
    free(j->text);
    free(j->lps);
    free(j->out_ids);
    free(j->pend);
    free(j);
}

enum { SLOT_FREE = 0, SLOT_PREFILL, SLOT_DECODE };

typedef struct {
    srv_job *job;
    int state;
    int32_t *toks; /* [ctx] ids whose keys and values the cache holds, kept after the job leaves */
    int n_toks;
    int fed;      /* prompt ids in the cache */
    int32_t next; /* sampled, to be fed by the next decode step */
    uint64_t last_used;
    tlm_sampler *samp;
    tlm_decoder *dec;
    tlm_grammar_state *gram;        /* the job's grammar, NULL: none */
    float lora_scale[SRV_MAX_LORA]; /* the adapters' scales its cached keys and values saw */
    /* Speculative decoding: the job's limits, the adaptive length (spec_adapt), this step's
     * proposal (k ids, after the next id) and the ids its rows emitted. */
    int n_max, n_min;
    float p_min;
    int kcur, kmax, k, pause, gap, misses, probing;
    int32_t *prop; /* [kbuf] */
    int32_t *em;   /* [kbuf + 1] */
    int n_em;
    int32_t *dtoks; /* [ctx + 1] the ids whose keys and values the draft's sequence holds */
    int d_len;
} slot;

/* A slot's cached prefix kept in memory after another request took the slot over. */
typedef struct {
    int32_t *toks;
    int n;
    void *kv; /* tlm_session_save_prefix's form, n positions */
    size_t bytes;
    uint64_t used;
    int pinned; /* being loaded by the admission in progress: not to be dropped */
    float lora_scale[SRV_MAX_LORA];
} pc_entry;

/* Fewer tokens than this are not worth an entry (nor a load). */
#define PC_MIN_TOKENS 16

struct srv_sched {
    const tlm_model *m;
    const tlm_tokenizer *tok;
    tlm_session *sess;
    int B, ctx, V, queue_max, chunk;
    int n_lora; /* adapters on the session */
    slot *slots;
    float *logits;  /* [B, V] */
    int32_t *ids;   /* [B + max(chunk, ctx)] the step's new ids, sequence by sequence */
    int *step_n;    /* [B] new ids of each slot this step */
    uint8_t *want;  /* [B] slots whose logits the step must produce */
    int32_t *pf_id; /* [B] id sampled this step, -1 none, -2 the sampler (or grammar) failed, -3
                     * the grammar is complete and allows no more */
    tlm_grammar_vocab *gvocab; /* made with the first job that has a grammar */
    int32_t *eog;              /* the vocabulary's ends of generation (ignore_eos) */
    int n_eog;
    uint64_t clock;
    int rr; /* prefill round robin */
    /* speculative decoding (spec_on): the draft model's session of B sequences (NULL: lookup) */
    int spec_on, kbuf, dcap;
    tlm_spec_opts sp;
    tlm_session *dsess;
    int *rows;      /* [B] rows of logits each slot takes from a speculative step */
    float *vlogits; /* [B * (kbuf + 1), V] their logits */
    float *dlogits; /* [B, V] the draft's */
    int32_t *dids;  /* [B * (ctx + 1)] the draft's new ids of one pass */
    int *dn;        /* [B] */
    uint8_t *dwant; /* [B] */

    pthread_t thread;
    int started, ready;
    pthread_mutex_t mu;
    pthread_cond_t work;     /* scheduler waits: new jobs, cancellations, stop */
    pthread_cond_t progress; /* submitters wait: output, completion */
    srv_job *qhead, *qtail;
    int queued, closed, quit;
    srv_slot_op *ops;     /* slot actions waiting for the loop */
    tlm_session *emb;     /* embeddings' own session (srv_sched_opts.embeddings), NULL: none */
    srv_embed_op *embeds; /* embeddings waiting for the loop */
    srv_stats st;
    pc_entry *pc; /* the prompt cache (scheduler thread only, under the lock) */
    int n_pc, cap_pc;
    size_t pc_max;
};

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 1;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return 0;
    *p = q;
    *cap = c;
    return 1;
}

static void append_text(srv_job *j, const char *b, size_t n) {
    if (!n) return;
    if (!grow((void **)&j->text, &j->text_cap, j->text_len + n + 1, 1)) {
        j->finish = SRV_FINISH_ERROR;
        snprintf(j->error, sizeof j->error, "out of memory");
        return;
    }
    memcpy(j->text + j->text_len, b, n);
    j->text_len += n;
    j->text[j->text_len] = 0;
}

/* Moves what the stop strings allow from pend to the job's text; 1 when a stop string hit. */
static int release_pending(srv_job *j, int all) {
    int hit = 0;
    size_t n = srv_stop_scan(j->pend, j->pend_len, j->stop, j->n_stop, &hit);
    if (all && !hit) n = j->pend_len; /* at the end, a partial stop string is just text */
    append_text(j, j->pend, n);
    if (hit) {
        j->stop_word = hit - 1;
        j->pend_len = 0;
    } else if (n) {
        memmove(j->pend, j->pend + n, j->pend_len - n);
        j->pend_len -= n;
    }
    return hit;
}

static void finish_job(srv_sched *s, slot *sl, srv_finish why) {
    srv_job *j = sl->job;
    if (sl->dec && why != SRV_FINISH_ERROR) {
        const char *b;
        size_t n;
        tlm_decoder_flush(sl->dec, &b, &n);
        if (n && grow((void **)&j->pend, &j->pend_cap, j->pend_len + n, 1)) {
            memcpy(j->pend + j->pend_len, b, n);
            j->pend_len += n;
        }
    }
    if (why != SRV_FINISH_ERROR && release_pending(j, 1)) why = SRV_FINISH_STOP;
    if (j->finish != SRV_FINISH_ERROR) j->finish = why;
    j->t_done = srv_now();
    j->done = 1;
    j->slot = -1;
    sl->job = NULL;
    sl->state = SLOT_FREE;
    sl->last_used = ++s->clock;
    tlm_sampler_free(sl->samp);
    sl->samp = NULL;
    tlm_decoder_free(sl->dec);
    sl->dec = NULL;
    tlm_grammar_state_free(sl->gram);
    sl->gram = NULL;
    s->st.jobs_done++;
    s->st.busy--;
}

static void fail_job(srv_sched *s, slot *sl, const char *what) {
    snprintf(sl->job->error, sizeof sl->job->error, "%s: %s", what, tlm_last_error());
    sl->job->finish = SRV_FINISH_ERROR;
    /* The cache may hold part of a pass: forget it rather than reuse it. */
    sl->n_toks = 0;
    tlm_session_reset(s->sess, (int)(sl - s->slots));
    finish_job(s, sl, SRV_FINISH_ERROR);
}

/* Log-probabilities of the sampled id and the best others, from the raw logits. */
static void token_logprobs(const float *l, int V, int32_t id, int top, srv_token_lp *out) {
    float mx = l[0];
    for (int i = 1; i < V; i++) mx = l[i] > mx ? l[i] : mx;
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)(l[i] - mx));
    float lse = mx + (float)log(sum);
    out->id = id;
    out->logprob = l[id] - lse;
    out->n_top = 0;
    for (int i = 0; i < V; i++) {
        if (l[i] == -INFINITY) continue; /* masked out by a grammar */
        int k = out->n_top;
        if (k == top && (k == 0 || l[i] <= out->top_lp[k - 1] + lse)) continue;
        if (k < top)
            out->n_top++;
        else
            k--;
        /* insertion into the descending list */
        while (k > 0 && l[i] - lse > out->top_lp[k - 1]) {
            out->top_lp[k] = out->top_lp[k - 1];
            out->top_id[k] = out->top_id[k - 1];
            k--;
        }
        out->top_lp[k] = l[i] - lse;
        out->top_id[k] = i;
    }
}

/* Samples from one slot's logits and hands the token to its job (lock held). */
static void take_token(srv_sched *s, slot *sl, const float *logits, int32_t id) {
    srv_job *j = sl->job;
    if (!j->t_first) j->t_first = srv_now();
    if (j->max_tokens == 0) { /* a prompt-only request (usage, cache warming) */
        finish_job(s, sl, SRV_FINISH_LENGTH);
        return;
    }
    /* EOS and the vocabulary's other ends of a turn, or the template's */
    int end = tlm_tokenizer_is_eog(s->tok, id) || (j->end_id >= 0 && id == j->end_id);
    if (end) {
        j->eos = 1;
        finish_job(s, sl, SRV_FINISH_STOP);
        return;
    }
    j->completion_tokens++;
    if (j->keep_ids &&
        grow((void **)&j->out_ids, &j->out_ids_cap, (size_t)j->n_out_ids + 1, sizeof *j->out_ids))
        j->out_ids[j->n_out_ids++] = id;
    s->st.completion_tokens++;
    if (j->logprobs) {
        if (grow((void **)&j->lps, &j->lps_cap, (size_t)j->n_lps + 1, sizeof *j->lps))
            token_logprobs(logits, s->V, id, j->top_logprobs, &j->lps[j->n_lps++]);
    }
    const char *b;
    size_t n;
    if (tlm_decoder_push(sl->dec, id, &b, &n)) {
        fail_job(s, sl, "decoding a token");
        return;
    }
    if (n) {
        if (!grow((void **)&j->pend, &j->pend_cap, j->pend_len + n, 1)) {
            core_err(TLM_ERR_NOMEM, "out of memory");
            fail_job(s, sl, "generation");
            return;
        }
        memcpy(j->pend + j->pend_len, b, n);
        j->pend_len += n;
    }
    if (release_pending(j, 0)) {
        finish_job(s, sl, SRV_FINISH_STOP);
        return;
    }
    if (j->max_tokens >= 0 && j->completion_tokens >= j->max_tokens) {
        finish_job(s, sl, SRV_FINISH_LENGTH);
        return;
    }
    if (sl->n_toks >= s->ctx) { /* no position left to feed the token at */
        finish_job(s, sl, SRV_FINISH_LENGTH);
        return;
    }
    sl->next = id;
    sl->state = SLOT_DECODE;
}

static size_t common_prefix(const int32_t *a, int na, const int32_t *b, int nb) {
    int n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i]) i++;
    return (size_t)i;
}

/* Cached keys and values computed with other adapter scales are another model's: no prefix. */
static size_t shared_prefix(const srv_sched *s, const float *la, const int32_t *a, int na,
                            const float *lb, const int32_t *b, int nb) {
    if (s->n_lora && memcmp(la, lb, (size_t)s->n_lora * sizeof(float)) != 0) return 0;
    return common_prefix(a, na, b, nb);
}

/* ---- the prompt cache ------------------------------------------------------------------------ */

static void pc_drop(srv_sched *s, int i) {
    free(s->pc[i].toks);
    free(s->pc[i].kv);
    s->st.cache_bytes -= s->pc[i].bytes;
    s->pc[i] = s->pc[--s->n_pc];
    s->st.cache_entries = s->n_pc;
}

/* Keeps what slot b holds in the prompt cache before it is cut to its first `keep` positions for
 * another request: when more than a few positions would be lost and no entry holds them already.
 * Least recently used entries make room. Best effort: without memory nothing is kept. */
static void pc_save(srv_sched *s, int b, size_t keep) {
    slot *sl = &s->slots[b];
    int n = sl->n_toks, len = tlm_session_length(s->sess, b);
    if (len < n) n = len;
    if (!s->pc_max || n < PC_MIN_TOKENS || (size_t)n < keep + PC_MIN_TOKENS) return;
    for (int i = 0; i < s->n_pc; i++) {
        size_t c = shared_prefix(s, s->pc[i].lora_scale, s->pc[i].toks, s->pc[i].n, sl->lora_scale,
                                 sl->toks, n);
        if (c == (size_t)n) { /* an entry holds all of it already */
            s->pc[i].used = ++s->clock;
            return;
        }
    }
    /* entries that are prefixes of this one are superseded by it */
    for (int i = 0; i < s->n_pc;) {
        if (!s->pc[i].pinned && shared_prefix(s, s->pc[i].lora_scale, s->pc[i].toks, s->pc[i].n,
                                              sl->lora_scale, sl->toks, n) == (size_t)s->pc[i].n)
            pc_drop(s, i);
        else
            i++;
    }
    size_t kv_bytes = tlm_session_prefix_bytes(s->sess, n);
    size_t bytes = kv_bytes + (size_t)n * sizeof(int32_t);
    if (bytes > s->pc_max) return;
    while (s->st.cache_bytes + bytes > s->pc_max) {
        int lru = -1;
        for (int i = 0; i < s->n_pc; i++)
            if (!s->pc[i].pinned && (lru < 0 || s->pc[i].used < s->pc[lru].used)) lru = i;
        if (lru < 0) return;
        pc_drop(s, lru);
    }
    if (s->n_pc == s->cap_pc) {
        int cap = s->cap_pc ? 2 * s->cap_pc : 16;
        pc_entry *np = realloc(s->pc, (size_t)cap * sizeof *np);
        if (!np) return;
        s->pc = np;
        s->cap_pc = cap;
    }
    pc_entry e = {
        malloc((size_t)n * sizeof(int32_t)), n, malloc(kv_bytes), bytes, ++s->clock, 0, {0}};
    memcpy(e.lora_scale, sl->lora_scale, sizeof e.lora_scale);
    if (!e.toks || !e.kv || tlm_session_save_prefix(s->sess, b, n, e.kv)) {
        free(e.toks);
        free(e.kv);
        return;
    }
    memcpy(e.toks, sl->toks, (size_t)n * sizeof(int32_t));
    s->pc[s->n_pc++] = e;
    s->st.cache_bytes += bytes;
    s->st.cache_entries = s->n_pc;
}

/* ---- speculative decoding ----------------------------------------------------------------- *
 *
 * A decoding slot's step carries its next id and up to k drafted ids; the rows of the pass are
 * sampled in order with the slot's own sampler (bias, grammar, penalties) exactly as plain steps
 * would, and each drafted id is kept while it equals what its row sampled. Every emitted id is
 * thus the id a plain step would have drawn at that point from the same random stream, greedy or
 * not, and a grammar is checked on every row; rejected positions are cut from the cache. */

/* Plain steps between probes of a proposer that keeps missing, and the first proposal length:
 * tlm_session_generate_spec's adaptive rule. */
#define SPEC_GAP_MIN 8
#define SPEC_GAP_MAX 256
#define SPEC_START 4
#define SPEC_KBUF 16

static void spec_start(srv_sched *s, slot *sl, const srv_job *j) {
    sl->n_max = 0;
    if (!s->spec_on) return;
    sl->n_max = j->spec_n_max >= 0 ? j->spec_n_max : s->sp.draft_max;
    if (sl->n_max > s->kbuf) sl->n_max = s->kbuf;
    sl->n_min = j->spec_n_min >= 0 ? j->spec_n_min : s->sp.draft_min;
    if (sl->n_min > sl->n_max) sl->n_min = sl->n_max;
    sl->p_min = j->spec_p_min >= 0.0f ? j->spec_p_min : s->sp.draft_p_min;
    sl->kcur = SPEC_START > sl->n_min ? SPEC_START : sl->n_min;
    sl->pause = sl->misses = sl->probing = 0;
    sl->gap = SPEC_GAP_MIN;
}

/* How many ids slot sl may draft this step: its adaptive length, within what the job may still
 * emit and the cache can hold (the pass appends the next id and the k drafted ones). */
static int spec_kmax(const srv_sched *s, const slot *sl) {
    if (!sl->n_max || sl->pause > 0) return 0;
    int k = sl->kcur < sl->n_max ? sl->kcur : sl->n_max;
    const srv_job *j = sl->job;
    if (j->max_tokens >= 0 && k > j->max_tokens - j->completion_tokens - 1)
        k = j->max_tokens - j->completion_tokens - 1;
    if (k > s->ctx - sl->n_toks - 1) k = s->ctx - sl->n_toks - 1;
    return k > 0 ? k : 0;
}

/* After a step that drafted k ids (kmax asked) of which a were accepted. */
static void spec_adapt(slot *sl, int k, int a, int draft_model) {
    if (!sl->n_max) return;
    if (sl->pause > 0) {
        if (--sl->pause == 0) {
            sl->kcur = sl->n_min > 1 ? sl->n_min : 1;
            sl->probing = 1;
        }
        return;
    }
    /* A draft model that proposes nothing paid for its pass; a lookup without a match did not. */
    int missed = k > 0 ? a == 0 : draft_model && sl->kmax > 0;
    if (!missed) {
        sl->misses = sl->probing = 0;
        sl->gap = SPEC_GAP_MIN;
        if (k > 0 && a == k && k >= sl->kcur)
            sl->kcur = 2 * sl->kcur < sl->n_max ? 2 * sl->kcur : sl->n_max;
        else if (k > 0 && a < k)
            sl->kcur = a + 1 > sl->n_min ? a + 1 : sl->n_min;
        if (sl->kcur < 1) sl->kcur = 1;
        return;
    }
    sl->misses++;
    if (sl->n_min == 0 && (sl->probing || sl->misses >= 2)) {
        sl->pause = sl->gap;
        sl->gap = 2 * sl->gap < SPEC_GAP_MAX ? 2 * sl->gap : SPEC_GAP_MAX;
        sl->misses = sl->probing = 0;
    } else if (k > 0) {
        sl->kcur = sl->n_min > 1 ? sl->n_min : 1;
    }
}

/* The draft's greedy id and its probability (softmax at temperature 1). */
static int32_t draft_pick(const float *l, int V, float *conf) {
    int32_t best = 0;
    for (int v = 1; v < V; v++)
        if (l[v] > l[best]) best = v;
    double z = 0.0;
    for (int v = 0; v < V; v++) z += exp((double)l[v] - l[best]);
    *conf = (float)(1.0 / z);
    return best;
}

/* The draft model's proposals for every slot with sl->kmax > 0, in batched passes of the draft
 * session: first each slot's ids the draft has not seen (its sequence is cut back to what still
 * matches the slot's ids), then one id per drafting slot per pass. Sets sl->k. */
static tlm_status draft_all(srv_sched *s) {
    size_t V = (size_t)s->V;
    int at = 0, any = 0;
    for (int b = 0; b < s->B; b++) {
        slot *sl = &s->slots[b];
        s->dn[b] = 0;
        s->dwant[b] = 0;
        int k = sl->kmax;
        if (k > s->dcap - sl->n_toks) k = s->dcap - sl->n_toks; /* the draft holds n_toks + k */
        if (k <= 0) continue;
        sl->k = k;
        sl->toks[sl->n_toks] = sl->next;
        int keep = (int)common_prefix(sl->dtoks, sl->d_len, sl->toks, sl->n_toks);
        /* a draft whose sliding-window rings overwrote the window of `keep` starts over */
        tlm_status err = tlm_session_truncate(s->dsess, b, keep);
        if (err) err = tlm_session_truncate(s->dsess, b, keep = 0);
        if (err) return err;
        int need = sl->n_toks + 1 - keep;
        memcpy(s->dids + at, sl->toks + keep, (size_t)need * sizeof(int32_t));
        memcpy(sl->dtoks + keep, sl->toks + keep, (size_t)need * sizeof(int32_t));
        sl->d_len = sl->n_toks + 1;
        at += need;
        s->dn[b] = need;
        s->dwant[b] = 1;
        any = 1;
    }
    for (int i = 0; any; i++) {
        tlm_status err = tlm_session_step(s->dsess, s->dids, s->dn, s->dwant, s->dlogits);
        if (err) return err;
        any = 0;
        at = 0;
        for (int b = 0; b < s->B; b++) {
            slot *sl = &s->slots[b];
            s->dn[b] = 0;
            if (!s->dwant[b]) continue;
            float conf;
            int32_t id = draft_pick(s->dlogits + (size_t)b * V, s->V, &conf);
            if (conf < sl->p_min) {
                sl->k = i;
                s->dwant[b] = 0;
                continue;
            }
            sl->prop[i] = id;
            if (i + 1 == sl->k) {
                s->dwant[b] = 0;
                continue;
            }
            s->dn[b] = 1;
            s->dids[at++] = id;
            sl->dtoks[sl->d_len++] = id;
            any = 1;
        }
    }
    return TLM_OK;
}

/* This step's proposals of the decoding slots (sl->k ids in sl->prop). A failing draft pass
 * costs only the speculation: the draft's caches are forgotten and the step runs plain. */
static void propose(srv_sched *s) {
    int drafting = 0;
    for (int b = 0; b < s->B; b++) {
        slot *sl = &s->slots[b];
        sl->k = sl->kmax = 0;
        if (sl->state != SLOT_DECODE) continue;
        sl->kmax = spec_kmax(s, sl);
        if (!sl->kmax) continue;
        if (s->dsess) {
            drafting = 1;
            continue;
        }
        sl->toks[sl->n_toks] = sl->next;
        sl->k = tlm_spec_lookup(sl->toks, sl->n_toks + 1, s->sp.lookup_ngram_min,
                                s->sp.lookup_ngram_max, sl->kmax, sl->prop);
    }
    if (drafting && draft_all(s)) {
        tlm_session_reset(s->dsess, -1);
        for (int b = 0; b < s->B; b++) s->slots[b].k = s->slots[b].d_len = 0;
    }
    for (int b = 0; b < s->B; b++)
        if (s->slots[b].k < s->slots[b].n_min) s->slots[b].k = 0; /* too short to pay */
}

/* Samples a slot's rows in order (nr of them from row0): each row gets the job's logit biases
 * and grammar before the slot's sampler, and the next row counts only while the id sampled is
 * the drafted one. sl->em receives the ids (sl->n_em); the return is 0, or -2 (the sampler or
 * grammar failed) or -3 (the grammar is complete and allows no more) at the row after them. */
static int sample_rows(srv_sched *s, slot *sl, float *row0, int nr) {
    size_t V = (size_t)s->V;
    const srv_job *jb = sl->job;
    sl->n_em = 0;
    for (int i = 0; i < nr; i++) {
        float *row = row0 + (size_t)i * V;
        /* logit_bias, then ignore_eos: before the grammar, so that it still decides */
        for (int k = 0; k < jb->n_bias; k++) row[jb->bias_id[k]] += jb->bias[k];
        for (int k = 0; jb->ignore_eos && k < s->n_eog; k++) row[s->eog[k]] = -INFINITY;
        if (sl->gram) {
            /* this row's own grammar state masks it before its sampler sees it */
            int n_ok = 0;
            if (tlm_grammar_state_mask(sl->gram, row, s->V, &n_ok)) return -2;
            if (!n_ok) {
                if (tlm_grammar_state_complete(sl->gram)) return -3;
                core_err(TLM_ERR_RANGE, "no token of the vocabulary continues the grammar");
                return -2;
            }
        }
        int32_t id;
        /* (accepted here, once: the penalties count each generated id once) */
        if (tlm_sampler_sample(sl->samp, row, &id) ||
            (sl->gram && tlm_grammar_state_accept(sl->gram, id)))
            return -2;
        tlm_sampler_accept(sl->samp, id);
        sl->em[sl->n_em++] = id;
        int end = tlm_tokenizer_is_eog(s->tok, id) || (jb->end_id >= 0 && id == jb->end_id);
        if (end || i + 1 == nr || id != sl->prop[i]) return 0;
    }
    return 0;
}

/* Queued jobs into free slots (lock held). */
static void admit(srv_sched *s) {
    while (s->qhead) {
        srv_job *j = s->qhead;
        int best = -1;
        size_t best_lcp = 0;
        for (int b = 0; b < s->B; b++) {
            slot *sl = &s->slots[b];
            if (sl->state != SLOT_FREE) continue;
            size_t lcp = shared_prefix(s, sl->lora_scale, sl->toks, sl->n_toks, j->lora_scale,
                                       j->ids, j->n_ids);
            if (best < 0 || lcp > best_lcp ||
                (lcp == best_lcp && sl->last_used < s->slots[best].last_used)) {
                best = b;
                best_lcp = lcp;
            }
        }
        if (best < 0) return;
        /* Reuse pays when most of the prompt is cached (llama-server's similarity rule);
         * otherwise the least recently used slot goes, keeping fresher caches for later turns. */
        if (best_lcp * 2 < (size_t)j->n_ids) {
            for (int b = 0; b < s->B; b++)
                if (s->slots[b].state == SLOT_FREE &&
                    s->slots[b].last_used < s->slots[best].last_used)
                    best = b;
            best_lcp = shared_prefix(s, s->slots[best].lora_scale, s->slots[best].toks,
                                     s->slots[best].n_toks, j->lora_scale, j->ids, j->n_ids);
        }
        /* A longer prefix in the prompt cache than in any free slot: loaded into the slot. */
        int ce = -1;
        size_t ce_lcp = 0;
        for (int i = 0; i < s->n_pc; i++) {
            size_t c = shared_prefix(s, s->pc[i].lora_scale, s->pc[i].toks, s->pc[i].n,
                                     j->lora_scale, j->ids, j->n_ids);
            if (c > ce_lcp) ce = i, ce_lcp = c;
        }
        if (ce_lcp >= (size_t)j->n_ids) ce_lcp = (size_t)j->n_ids - 1;
        if (ce >= 0 &&
            (ce_lcp <= best_lcp || ce_lcp < PC_MIN_TOKENS || ce_lcp * 2 < (size_t)j->n_ids))
            ce = -1;
        s->qhead = j->next;
        if (!s->qhead) s->qtail = NULL;
        s->queued--;
        j->queued = 0;
        j->next = NULL;
        slot *sl = &s->slots[best];
        /* The last prompt id is always prefilled again: its logits give the first new token. */
        if (best_lcp >= (size_t)j->n_ids) best_lcp = (size_t)j->n_ids - 1;
        if (ce >= 0) s->pc[ce].pinned = 1;
        pc_save(s, best, ce >= 0 ? 0 : best_lcp);
        if (ce >= 0) {
            ce = 0; /* pc_save may have moved the pinned entry (never dropped it) */
            while (!s->pc[ce].pinned) ce++;
            pc_entry *e = &s->pc[ce];
            e->pinned = 0;
            e->used = ++s->clock;
            if (tlm_session_load_prefix(s->sess, best, e->kv, e->n, (int)ce_lcp)) {
                best_lcp = 0;
                tlm_session_truncate(s->sess, best, 0);
            } else {
                memcpy(sl->toks, e->toks, ce_lcp * sizeof(int32_t));
                best_lcp = ce_lcp;
                s->st.cache_hits++;
            }
        } else if (tlm_session_truncate(s->sess, best, (int)best_lcp)) {
            /* the slot's sliding-window rings overwrote the window of the shared prefix's end */
            best_lcp = 0;
            tlm_session_truncate(s->sess, best, 0);
        }
        sl->n_toks = (int)best_lcp;
        sl->fed = (int)best_lcp;
        sl->job = j;
        memcpy(sl->lora_scale, j->lora_scale, sizeof sl->lora_scale);
        if (s->n_lora) tlm_session_set_seq_lora_scales(s->sess, best, j->lora_scale);
        sl->state = SLOT_PREFILL;
        sl->last_used = ++s->clock;
        spec_start(s, sl, j);
        j->slot = best;
        j->slot_used = best;
        j->cached_tokens = (int)best_lcp;
        j->prompt_tokens = j->n_ids;
        s->st.busy++;
        s->st.cached_tokens += best_lcp;
        tlm_sampler_opts so = j->sampling;
        if (tlm_sampler_new(&so, s->V, &sl->samp) ||
            tlm_decoder_new(s->tok, TLM_DECODE_SKIP_SPECIAL, &sl->dec)) {
            fail_job(s, sl, "starting a job");
            continue;
        }
        if (j->grammar && ((!s->gvocab && tlm_grammar_vocab_new(s->tok, s->V, &s->gvocab)) ||
                           tlm_grammar_state_new(j->grammar, s->gvocab, &sl->gram))) {
            fail_job(s, sl, "starting a job's grammar");
            continue;
        }
        for (int i = 0; i < j->n_ids; i++) tlm_sampler_accept(sl->samp, j->ids[i]);
        /* The decoder sees the prompt so that the first new piece decodes in context (the
         * SentencePiece leading space). */
        for (int i = 0; i < j->n_ids; i++) {
            const char *bb;
            size_t nn;
            tlm_decoder_push(sl->dec, j->ids[i], &bb, &nn);
        }
        const char *bb;
        size_t nn;
        tlm_decoder_flush(sl->dec, &bb, &nn);
    }
}

static void drop_cancelled(srv_sched *s) {
    for (int b = 0; b < s->B; b++)
        if (s->slots[b].job && s->slots[b].job->cancelled) {
            /* Half-prefilled caches stay usable: n_toks only counts what is in. */
            finish_job(s, &s->slots[b], SRV_FINISH_STOP);
        }
}

/* ---- slot actions (llama-server's /slots) -------------------------------------------------- */

/* A saved slot: this header, the adapters' scales, the ids, then tlm_session_save_prefix's bytes.
 */
typedef struct {
    char magic[8]; /* "TLMSLOT" */
    uint32_t version, kv_type, v_type;
    int32_t n_tokens, n_lora, vocab;
    uint64_t kv_bytes;
} slot_file;

static void op_fail(srv_slot_op *op, const char *fmt, const char *what) {
    op->status = 400;
    snprintf(op->error, sizeof op->error, fmt, what);
}

static void slot_save(srv_sched *s, srv_slot_op *op) {
    slot *sl = &s->slots[op->slot];
    size_t kv = tlm_session_prefix_bytes(s->sess, sl->n_toks);
    slot_file h = {"TLMSLOT",
                   1,
                   (uint32_t)srv_sched_kv_type(s),
                   (uint32_t)srv_sched_v_type(s),
                   sl->n_toks,
                   s->n_lora,
                   s->V,
                   kv};
    size_t n =
        sizeof h + (size_t)s->n_lora * sizeof(float) + (size_t)sl->n_toks * sizeof(int32_t) + kv;
    char *buf = malloc(n), *w = buf;
    if (!buf) {
        op_fail(op, "%s", "out of memory");
        return;
    }
    memcpy(w, &h, sizeof h), w += sizeof h;
    memcpy(w, sl->lora_scale, (size_t)s->n_lora * sizeof(float)), w += s->n_lora * sizeof(float);
    memcpy(w, sl->toks, (size_t)sl->n_toks * sizeof(int32_t)), w += sl->n_toks * sizeof(int32_t);
    tlm_status st = sl->n_toks ? tlm_session_save_prefix(s->sess, op->slot, sl->n_toks, w) : TLM_OK;
    if (!st) st = core_write_file_atomic(op->path, buf, n);
    free(buf);
    if (st) {
        op_fail(op, "saving the slot: %s", tlm_last_error());
        return;
    }
    op->n_tokens = sl->n_toks;
    op->bytes = n;
}

static void slot_restore(srv_sched *s, srv_slot_op *op) {
    slot *sl = &s->slots[op->slot];
    char *buf = NULL;
    size_t n = 0;
    if (core_read_file(op->path, &buf, &n)) {
        op_fail(op, "%s", tlm_last_error());
        return;
    }
    slot_file h;
    if (n < sizeof h) {
        free(buf);
        op_fail(op, "%s is not a saved slot (too short)", op->path);
        return;
    }
    memcpy(&h, buf, sizeof h);
    const char *bad =
        memcmp(h.magic, "TLMSLOT", 8) || h.version != 1 ? "not a saved slot"
        : h.n_tokens < 0 || h.n_tokens > s->ctx         ? "more positions than a slot has"
        : h.vocab != s->V || h.n_lora != s->n_lora ? "saved with another model or other adapters"
        : h.kv_type != (uint32_t)srv_sched_kv_type(s) || h.v_type != (uint32_t)srv_sched_v_type(s)
            ? "saved with other KV cache types"
        : h.kv_bytes != tlm_session_prefix_bytes(s->sess, h.n_tokens) ||
                n != sizeof h + (size_t)h.n_lora * sizeof(float) +
                         (size_t)h.n_tokens * sizeof(int32_t) + h.kv_bytes
            ? "its size does not match its header"
            : NULL;
    if (bad) {
        free(buf);
        snprintf(op->error, sizeof op->error, "%.200s: %s", op->path, bad);
        op->status = 400;
        return;
    }
    const char *r = buf + sizeof h;
    const float *scales = (const float *)r;
    const int32_t *toks = (const int32_t *)(r + (size_t)h.n_lora * sizeof(float));
    for (int i = 0; i < h.n_tokens; i++)
        if (toks[i] < 0 || toks[i] >= s->V) {
            free(buf);
            op_fail(op, "%s holds a token id outside the vocabulary", op->path);
            return;
        }
    const char *kv = (const char *)(toks + h.n_tokens);
    tlm_session_reset(s->sess, op->slot);
    sl->n_toks = 0;
    if (h.n_tokens && tlm_session_load_prefix(s->sess, op->slot, kv, h.n_tokens, h.n_tokens)) {
        free(buf);
        op_fail(op, "restoring the slot: %s", tlm_last_error());
        return;
    }
    memcpy(sl->toks, toks, (size_t)h.n_tokens * sizeof(int32_t));
    memcpy(sl->lora_scale, scales, (size_t)h.n_lora * sizeof(float));
    if (s->n_lora) tlm_session_set_seq_lora_scales(s->sess, op->slot, sl->lora_scale);
    sl->n_toks = h.n_tokens;
    sl->last_used = ++s->clock;
    op->n_tokens = h.n_tokens;
    op->bytes = n;
    free(buf);
}

/* Every queued slot action, between steps (lock held: nothing else touches the session). */
static void run_slot_ops(srv_sched *s) {
    while (s->ops) {
        srv_slot_op *op = s->ops;
        s->ops = op->next;
        double t0 = srv_now();
        slot *sl = &s->slots[op->slot];
        if (sl->job) {
            op->status = 400;
            snprintf(op->error, sizeof op->error, "slot %d is processing a request", op->slot);
        } else if (op->action == SRV_SLOT_SAVE) {
            slot_save(s, op);
        } else if (op->action == SRV_SLOT_RESTORE) {
            slot_restore(s, op);
        } else {
            op->n_tokens = sl->n_toks;
            sl->n_toks = 0;
            tlm_session_reset(s->sess, op->slot);
        }
        op->seconds = srv_now() - t0;
        op->done = 1;
    }
    pthread_cond_broadcast(&s->progress);
}

tlm_status srv_sched_slot_op(srv_sched *s, srv_slot_op *op) {
    if (!s || !op || op->slot < 0 || op->slot >= s->B)
        return core_err(TLM_ERR_ARG, "slot action: no slot %d", op ? op->slot : -1);
    pthread_mutex_lock(&s->mu);
    op->done = 0;
    op->status = 0;
    op->next = s->ops;
    s->ops = op;
    pthread_cond_signal(&s->work);
    while (!op->done) pthread_cond_wait(&s->progress, &s->mu);
    pthread_mutex_unlock(&s->mu);
    return TLM_OK;
}

void srv_sched_slot_info(srv_sched *s, int b, srv_slot_info *out) {
    memset(out, 0, sizeof *out);
    if (!s || b < 0 || b >= s->B) return;
    pthread_mutex_lock(&s->mu);
    const slot *sl = &s->slots[b];
    out->busy = sl->job != NULL;
    out->n_tokens = sl->n_toks;
    if (sl->job) {
        out->prompt_tokens = sl->job->n_ids;
        out->decoded = sl->job->completion_tokens;
    }
    pthread_mutex_unlock(&s->mu);
}

/* Every queued embedding, between steps. The lock is let go while one computes: only this
 * thread touches the sessions, and streams waiting on the lock would stall. */
static void run_embeds(srv_sched *s) {
    while (s->embeds) {
        srv_embed_op *op = s->embeds;
        s->embeds = op->next;
        pthread_mutex_unlock(&s->mu);
        tlm_session_reset(s->emb, 0);
        tlm_status st = tlm_session_prefill_hidden(s->emb, 0, op->ids, op->n, op->hidden);
        pthread_mutex_lock(&s->mu);
        if (st) {
            op->status = 400;
            snprintf(op->error, sizeof op->error, "%s", tlm_last_error());
        }
        op->done = 1;
        pthread_cond_broadcast(&s->progress);
    }
}

tlm_status srv_sched_embed(srv_sched *s, srv_embed_op *op) {
    if (!s || !op || !op->ids || !op->hidden)
        return core_err(TLM_ERR_ARG, "embedding: NULL argument");
    if (!s->emb) return core_err(TLM_ERR_ARG, "embedding: the scheduler has no embeddings session");
    pthread_mutex_lock(&s->mu);
    if (s->closed) {
        pthread_mutex_unlock(&s->mu);
        return core_err(TLM_ERR_INTERRUPTED, "embedding: the server is shutting down");
    }
    op->done = 0;
    op->status = 0;
    op->error[0] = 0;
    op->next = s->embeds;
    s->embeds = op;
    pthread_cond_signal(&s->work);
    while (!op->done) pthread_cond_wait(&s->progress, &s->mu);
    pthread_mutex_unlock(&s->mu);
    return TLM_OK;
}

static void *loop(void *arg) {
    srv_sched *s = arg;
    size_t V = (size_t)s->V;
    /* OpenMP's thread count is per thread: this one takes the count the process chose. */
    tlm_threads_set(tlm_threads_get());
    /* The cache's pages are touched here, not by the thread that made the scheduler: every
     * parallel region of the server then belongs to this thread's one OpenMP team (see
     * srv_sched_new). */
    tlm_session_prefault(s->sess);
    if (s->dsess) tlm_session_prefault(s->dsess);
    pthread_mutex_lock(&s->mu);
    s->ready = 1;
    for (;;) {
        run_slot_ops(s);
        run_embeds(s);
        drop_cancelled(s);
        admit(s);
        int prefilling = 0, decoding = 0;
        for (int b = 0; b < s->B; b++) {
            prefilling += s->slots[b].state == SLOT_PREFILL;
            decoding += s->slots[b].state == SLOT_DECODE;
        }
        pthread_cond_broadcast(&s->progress);
        if (!prefilling && !decoding) {
            if (s->quit && !s->qhead) break;
            if (!s->ops && !s->embeds) pthread_cond_wait(&s->work, &s->mu);
            continue;
        }
        pthread_mutex_unlock(&s->mu);

        /* One pass for everything: a token of every decoding slot, and prompt chunks of the
         * waiting ones, round robin from where the last turn stopped: whole prompts (up to a
         * context's worth of tokens in all) when nobody is decoding, else at most `chunk` tokens,
         * so running streams wait for one chunk per step at most. Only this thread detaches jobs
         * from slots, so the slots' jobs can be read without the lock. */
        int budget = decoding ? s->chunk : s->ctx, n_prefilled = 0, n_dec = 0, n_spec = 0;
        double t0 = srv_now();
        if (s->spec_on && decoding) propose(s);
        for (int b = 0; b < s->B; b++) {
            slot *sl = &s->slots[b];
            int dec = sl->state == SLOT_DECODE;
            s->step_n[b] = dec ? 1 + sl->k : 0;
            s->rows[b] = s->step_n[b];
            s->want[b] = (uint8_t)dec;
            s->pf_id[b] = -1;
            n_dec += dec;
            n_spec += dec && sl->k > 0;
        }
        int start = s->rr;
        for (int k = 0; k < s->B && prefilling && budget > 0; k++) {
            int b = (start + k) % s->B;
            slot *sl = &s->slots[b];
            if (sl->state != SLOT_PREFILL) continue;
            int n = sl->job->n_ids - sl->fed;
            if (n > budget) n = budget;
            s->step_n[b] = n;
            s->want[b] = sl->fed + n == sl->job->n_ids;
            s->rows[b] = s->want[b];
            budget -= n;
            n_prefilled += n;
            s->rr = (b + 1) % s->B;
        }
        int at = 0;
        for (int b = 0; b < s->B; b++) {
            slot *sl = &s->slots[b];
            if (sl->state == SLOT_DECODE) {
                s->ids[at] = sl->next;
                if (sl->k) memcpy(s->ids + at + 1, sl->prop, (size_t)sl->k * sizeof(int32_t));
            } else if (s->step_n[b]) {
                memcpy(s->ids + at, sl->job->ids + sl->fed, (size_t)s->step_n[b] * sizeof(int32_t));
            }
            at += s->step_n[b];
        }
        /* Speculative rows need every row's logits; plain steps keep one product for all. */
        tlm_status err =
            n_spec ? tlm_session_step_rows(s->sess, s->ids, s->step_n, s->rows, s->vlogits)
                   : tlm_session_step(s->sess, s->ids, s->step_n, s->want, s->logits);
        size_t off = 0;
        for (int b = 0; b < s->B && !err; b++) {
            slot *sl = &s->slots[b];
            float *row0 = n_spec ? s->vlogits + off * V : s->logits + (size_t)b * V;
            off += (size_t)s->rows[b];
            sl->n_em = 0;
            if (!s->step_n[b]) continue;
            if (sl->state == SLOT_PREFILL) {
                memcpy(sl->toks + sl->n_toks, sl->job->ids + sl->fed,
                       (size_t)s->step_n[b] * sizeof(int32_t));
                sl->n_toks += s->step_n[b];
                sl->fed += s->step_n[b];
            }
            if (s->want[b]) s->pf_id[b] = sample_rows(s, sl, row0, s->rows[b]);
        }
        double t1 = srv_now();

        pthread_mutex_lock(&s->mu);
        /* A pass that also carries prompt chunks counts as decode time: the streams waited on it.
         */
        if (n_dec) {
            s->st.decode_seconds += t1 - t0;
            s->st.decode_steps++;
        } else {
            s->st.prefill_seconds += t1 - t0;
        }
        s->st.prompt_tokens += (uint64_t)n_prefilled;
        off = 0;
        for (int b = 0; b < s->B; b++) {
            slot *sl = &s->slots[b];
            float *row0 = n_spec ? s->vlogits + off * V : s->logits + (size_t)b * V;
            off += (size_t)s->rows[b];
            if (!s->step_n[b] || !sl->job) continue;
            int dec = sl->state == SLOT_DECODE, k = dec ? sl->k : 0, a = 0;
            if (err) {
                fail_job(s, sl, dec ? "decode" : "prefill");
                continue;
            }
            while (a < k && a < sl->n_em && sl->em[a] == sl->prop[a]) a++;
            if (k) {
                s->st.drafted += (uint64_t)k;
                s->st.accepted += (uint64_t)a;
                sl->job->n_drafted += k;
                sl->job->n_accepted += a;
            }
            if (dec && !sl->n_em) sl->toks[sl->n_toks++] = sl->next;
            /* Row j's id goes out once the ids before it are in the slot's ids: the next one,
             * then the accepted drafted ones. */
            for (int j = 0; j < sl->n_em && sl->job; j++) {
                if (dec) sl->toks[sl->n_toks++] = j ? sl->prop[j - 1] : sl->next;
                take_token(s, sl, row0 + (size_t)j * V, sl->em[j]);
            }
            if (sl->job && !sl->n_em) {
                if (s->pf_id[b] == -2)
                    fail_job(s, sl, "sampling");
                else if (s->pf_id[b] == -3)
                    finish_job(s, sl, SRV_FINISH_STOP);
            }
            if (dec && sl->n_max) {
                /* The rejected rows' keys and values go; so do those past a finished job's end. */
                if (tlm_session_length(s->sess, b) > sl->n_toks)
                    tlm_session_truncate(s->sess, b, sl->n_toks);
                spec_adapt(sl, k, a, s->dsess != NULL);
            }
        }
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static size_t V_of(const srv_sched *s) { return (size_t)s->V; }

/* The proposer: a draft session of one sequence per slot over the draft model, or lookup. */
static tlm_status spec_new(srv_sched *s, const srv_sched_opts *o) {
    const tlm_spec_opts *sp = &o->spec;
    if (!o->draft && !sp->lookup) return TLM_OK;
    if (o->draft && sp->lookup)
        return core_err(TLM_ERR_ARG, "speculative: a draft model or lookup, not both");
    if (sp->draft_max < 1 || sp->draft_max > 256)
        return core_err(TLM_ERR_ARG, "speculative: draft_max %d must be in [1, 256]",
                        sp->draft_max);
    if (sp->draft_min < 0 || sp->draft_min > sp->draft_max)
        return core_err(TLM_ERR_ARG, "speculative: draft_min %d must be in [0, draft_max %d]",
                        sp->draft_min, sp->draft_max);
    if (!(sp->draft_p_min >= 0.0f && sp->draft_p_min <= 1.0f))
        return core_err(TLM_ERR_ARG, "speculative: draft_p_min %g must be in [0, 1]",
                        (double)sp->draft_p_min);
    if (sp->lookup && (sp->lookup_ngram_min < 1 || sp->lookup_ngram_max < sp->lookup_ngram_min))
        return core_err(TLM_ERR_ARG, "speculative: lookup n-grams from %d to %d",
                        sp->lookup_ngram_min, sp->lookup_ngram_max);
    s->sp = *sp;
    /* a request may ask for more than the server's draft_max, up to this */
    s->kbuf = sp->draft_max > SPEC_KBUF ? sp->draft_max : SPEC_KBUF;
    s->spec_on = 1;
    if (!o->draft) return TLM_OK;
    const tlm_config *dc = tlm_model_config(o->draft);
    if (dc->vocab_size != s->V)
        return core_err(TLM_ERR_ARG,
                        "speculative: the draft model's vocabulary has %d ids, the model's %d "
                        "(they must share one)",
                        dc->vocab_size, s->V);
    s->dcap = s->ctx < dc->context_length ? s->ctx : dc->context_length;
    /* F16 keys and values for the draft, as llama-server's default -ctkd/-ctvd: any head size */
    tlm_session_opts so = {.batch = s->B, .capacity = s->dcap, .kv_type = TLM_DTYPE_F16};
    return tlm_session_new(o->draft, &so, &s->dsess);
}

tlm_status srv_sched_new(const tlm_model *m, const tlm_tokenizer *tok, const srv_sched_opts *o,
                         srv_sched **out) {
    *out = NULL;
    if (!m || !tok || !o) return core_err(TLM_ERR_ARG, "scheduler: NULL argument");
    const tlm_config *c = tlm_model_config(m);
    if (o->parallel < 1 || o->parallel > 256)
        return core_err(TLM_ERR_ARG, "scheduler: parallel %d must be in [1, 256]", o->parallel);
    int ctx = o->ctx > 0 ? o->ctx : c->context_length;
    if (ctx > c->context_length)
        return core_err(TLM_ERR_ARG, "scheduler: ctx %d exceeds the model's context_length %d", ctx,
                        c->context_length);
    srv_sched *s = calloc(1, sizeof *s);
    if (!s) return core_err(TLM_ERR_NOMEM, "out of memory");
    s->m = m;
    s->tok = tok;
    s->B = o->parallel;
    s->ctx = ctx;
    s->V = c->vocab_size;
    s->queue_max = o->queue_max > 0 ? o->queue_max : 4 * o->parallel;
    s->pc_max = o->cache_mib > 0 ? (size_t)o->cache_mib << 20 : 0;
    s->chunk = o->prefill_chunk > 0 ? o->prefill_chunk : 64;
    s->st.slots = s->B;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work, NULL);
    pthread_cond_init(&s->progress, NULL);
    tlm_session_opts so = {.batch = s->B,
                           .capacity = ctx,
                           .kv_type = o->kv_type,
                           .v_type_set = 1,
                           .v_type = o->v_type,
                           .step_max = o->step_max};
    tlm_status st = tlm_session_new(m, &so, &s->sess);
    if (st) goto fail;
    if (o->n_lora > SRV_MAX_LORA) {
        st = core_err(TLM_ERR_ARG, "serve: at most %d LoRA adapters", SRV_MAX_LORA);
        goto fail;
    }
    s->n_lora = o->n_lora;
    if (o->n_lora && (st = tlm_session_set_loras(s->sess, o->loras, NULL, o->n_lora)) != TLM_OK)
        goto fail;
    so.batch = 1;
    if (o->embeddings && (st = tlm_session_new(m, &so, &s->emb)) != TLM_OK) goto fail;
    if ((st = spec_new(s, o)) != TLM_OK) goto fail;
    s->slots = calloc((size_t)s->B, sizeof *s->slots);
    s->logits = malloc((size_t)s->B * (size_t)s->V * sizeof(float));
    s->ids =
        calloc((size_t)s->B * (size_t)(s->kbuf + 1) + (size_t)(s->chunk > ctx ? s->chunk : ctx),
               sizeof *s->ids);
    s->step_n = calloc((size_t)s->B, sizeof *s->step_n);
    s->want = calloc((size_t)s->B, 1);
    s->pf_id = calloc((size_t)s->B, sizeof *s->pf_id);
    int tv = tlm_tokenizer_vocab_size(tok) < s->V ? tlm_tokenizer_vocab_size(tok) : s->V;
    s->eog = malloc((size_t)(tv > 0 ? tv : 1) * sizeof *s->eog);
    for (int32_t id = 0; s->eog && id < tv; id++)
        if (tlm_tokenizer_is_eog(tok, id)) s->eog[s->n_eog++] = id;
    if (!s->slots || !s->logits || !s->ids || !s->step_n || !s->want || !s->pf_id || !s->eog)
        goto nomem;
    for (int b = 0; b < s->B; b++) {
        slot *sl = &s->slots[b];
        /* one past the context: a slot's next id joins its ids for the proposers */
        if (!(sl->toks = malloc((size_t)(ctx + 1) * sizeof(int32_t)))) goto nomem;
        if (!(sl->em = malloc((size_t)(s->kbuf + 1) * sizeof(int32_t)))) goto nomem;
        if (s->spec_on && (!(sl->prop = malloc((size_t)s->kbuf * sizeof(int32_t))) ||
                           !(sl->dtoks = malloc((size_t)(ctx + 1) * sizeof(int32_t)))))
            goto nomem;
    }
    if (s->spec_on) {
        size_t B = (size_t)s->B;
        s->rows = calloc(B, sizeof *s->rows);
        s->vlogits = malloc(B * (size_t)(s->kbuf + 1) * V_of(s) * sizeof(float));
        s->dlogits = s->dsess ? malloc(B * V_of(s) * sizeof(float)) : NULL;
        s->dids = s->dsess ? malloc(B * (size_t)(ctx + 1) * sizeof(int32_t)) : NULL;
        s->dn = calloc(B, sizeof *s->dn);
        s->dwant = calloc(B, 1);
        if (!s->rows || !s->vlogits || (s->dsess && (!s->dlogits || !s->dids)) || !s->dn ||
            !s->dwant)
            goto nomem;
    } else if (!(s->rows = calloc((size_t)s->B, sizeof *s->rows))) {
        goto nomem;
    }
    if (pthread_create(&s->thread, NULL, loop, s)) {
        st = core_err(TLM_ERR_NOMEM, "scheduler: cannot start its thread");
        goto fail;
    }
    s->started = 1;
    /* Ready once the cache is in memory (a first request then does not pay its page faults). */
    pthread_mutex_lock(&s->mu);
    while (!s->ready) pthread_cond_wait(&s->progress, &s->mu);
    pthread_mutex_unlock(&s->mu);
    *out = s;
    return TLM_OK;
nomem:
    st = core_err(TLM_ERR_NOMEM, "out of memory for %d slots", s->B);
fail:
    srv_sched_free(s);
    return st;
}

void srv_sched_free(srv_sched *s) {
    if (!s) return;
    if (s->started) {
        pthread_mutex_lock(&s->mu);
        s->quit = s->closed = 1;
        pthread_cond_signal(&s->work);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    for (int b = 0; s->slots && b < s->B; b++) {
        free(s->slots[b].toks);
        free(s->slots[b].prop);
        free(s->slots[b].em);
        free(s->slots[b].dtoks);
        tlm_sampler_free(s->slots[b].samp);
        tlm_decoder_free(s->slots[b].dec);
        tlm_grammar_state_free(s->slots[b].gram);
    }
    tlm_grammar_vocab_free(s->gvocab);
    free(s->eog);
    free(s->slots);
    free(s->logits);
    free(s->ids);
    free(s->step_n);
    free(s->want);
    free(s->pf_id);
    free(s->rows);
    free(s->vlogits);
    free(s->dlogits);
    free(s->dids);
    free(s->dn);
    free(s->dwant);
    tlm_session_free(s->dsess);
    while (s->n_pc) pc_drop(s, s->n_pc - 1);
    free(s->pc);
    tlm_session_free(s->sess);
    tlm_session_free(s->emb);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->work);
    pthread_cond_destroy(&s->progress);
    free(s);
}

int srv_sched_ctx(const srv_sched *s) { return s->ctx; }
int srv_sched_parallel(const srv_sched *s) { return s->B; }
size_t srv_sched_kv_bytes(const srv_sched *s) { return tlm_session_kv_bytes(s->sess); }
tlm_dtype srv_sched_kv_type(const srv_sched *s) { return tlm_session_kv_type(s->sess); }
tlm_dtype srv_sched_v_type(const srv_sched *s) { return tlm_session_v_type(s->sess); }

tlm_status srv_sched_submit(srv_sched *s, srv_job *const *jobs, int n) {
    for (int i = 0; i < n; i++) {
        if (jobs[i]->n_ids < 1 || jobs[i]->n_ids > s->ctx)
            return core_err(TLM_ERR_RANGE, "a prompt of %d tokens does not fit a context of %d",
                            jobs[i]->n_ids, s->ctx);
        for (int k = 0; k < jobs[i]->n_ids; k++)
            if (jobs[i]->ids[k] < 0 || jobs[i]->ids[k] >= s->V)
                return core_err(TLM_ERR_RANGE, "token id %d is outside the vocabulary (%d)",
                                (int)jobs[i]->ids[k], s->V);
    }
    pthread_mutex_lock(&s->mu);
    tlm_status st = TLM_OK;
    int free_slots = s->B - s->st.busy;
    if (s->closed)
        st = core_err(TLM_ERR_INTERRUPTED, "the server is shutting down");
    else if (s->queued + n > s->queue_max + (free_slots > 0 ? free_slots : 0))
        st = core_err(TLM_ERR_RANGE, "the queue is full (%d waiting)", s->queued);
    else {
        double t = srv_now();
        for (int i = 0; i < n; i++) {
            srv_job *j = jobs[i];
            j->t_submit = t;
            j->queued = 1;
            j->next = NULL;
            if (s->qtail)
                s->qtail->next = j;
            else
                s->qhead = j;
            s->qtail = j;
            s->queued++;
        }
        pthread_cond_signal(&s->work);
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

void srv_sched_lock(srv_sched *s) { pthread_mutex_lock(&s->mu); }
void srv_sched_unlock(srv_sched *s) { pthread_mutex_unlock(&s->mu); }

void srv_sched_wait(srv_sched *s, int timeout_ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += timeout_ms / 1000;
    ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&s->progress, &s->mu, &ts);
}

void srv_sched_release(srv_sched *s, srv_job *j) {
    pthread_mutex_lock(&s->mu);
    if (j->queued) {
        srv_job **pp = &s->qhead, *prev = NULL;
        while (*pp && *pp != j) {
            prev = *pp;
            pp = &(*pp)->next;
        }
        if (*pp) {
            *pp = j->next;
            if (s->qtail == j) s->qtail = prev;
            s->queued--;
        }
        j->queued = 0;
        j->done = 1;
    }
    if (!j->done && j->slot >= 0) {
        j->cancelled = 1;
        pthread_cond_signal(&s->work);
        while (!j->done) pthread_cond_wait(&s->progress, &s->mu);
    }
    pthread_mutex_unlock(&s->mu);
}

void srv_sched_close(srv_sched *s) {
    pthread_mutex_lock(&s->mu);
    s->closed = 1;
    pthread_mutex_unlock(&s->mu);
}

void srv_sched_stats(srv_sched *s, srv_stats *st) {
    pthread_mutex_lock(&s->mu);
    *st = s->st;
    st->queued = s->queued;
    pthread_mutex_unlock(&s->mu);
}
