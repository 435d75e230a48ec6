/* LoRA adapter files: GGUF (llama.cpp's adapter) and PEFT round trips bit for bit, conversion
 * between them with Llama's q/k row order, and malformed files refused with a message naming the
 * problem. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/half.h"
#include "formats/formats.h"
#include "formats/lora.h"
#include "harness.h"
#include "io/gguf.h"
#include "io/gguf_writer.h"
#include "io/safetensors.h"
#include "tlm.h"

/* A tiny Llama: d 32, 4 heads of 8, 2 KV heads, FFN 48, vocab 50, 2 layers. */
enum { D = 32, HD = 8, KV = 16, FF = 48, VOCAB = 50, LAYERS = 2, RANK = 4 };

static const char *const kinds[] = {"attn_q",   "attn_k", "attn_v",  "attn_output",
                                    "ffn_gate", "ffn_up", "ffn_down"};

static void shape_of(int k, int64_t *in, int64_t *out) {
    static const int64_t ins[] = {D, D, D, D, D, D, FF}, outs[] = {D, KV, KV, D, FF, FF, D};
    *in = ins[k];
    *out = outs[k];
}

static void make_adapter(fmt_lora *a) {
    memset(a, 0, sizeof *a);
    snprintf(a->arch, sizeof a->arch, "llama");
    snprintf(a->base_model, sizeof a->base_model, "tiny-llama");
    a->rank = RANK;
    a->alpha = 8.0f;
    a->dropout = 0.05f;
    for (int l = 0; l < LAYERS; l++)
        for (int k = 0; k < 7; k++) {
            char nm[64];
            int64_t in, out;
            shape_of(k, &in, &out);
            snprintf(nm, sizeof nm, "blk.%d.%s.weight", l, kinds[k]);
            CHECK_OK(fmt_lora_add(a, nm, in, out, NULL, NULL));
        }
    CHECK_OK(fmt_lora_add(a, "output.weight", D, VOCAB, NULL, NULL));
    for (int i = 0; i < a->n; i++) {
        for (int64_t j = 0; j < RANK * a->m[i].in; j++) a->m[i].a[j] = t_unif();
        for (int64_t j = 0; j < RANK * a->m[i].out; j++) a->m[i].b[j] = t_unif();
    }
}

/* 1 if x and y hold the same matrices bit for bit (B rows of q/k compared only when same_qk). */
static int same(const fmt_lora *x, const fmt_lora *y, int same_qk) {
    if (x->n != y->n || x->rank != y->rank || strcmp(x->arch, y->arch)) return 0;
    for (int i = 0; i < x->n; i++) {
        const fmt_lora_mat *e = &x->m[i], *f = fmt_lora_find(y, e->name);
        if (!f || f->in != e->in || f->out != e->out) return 0;
        if (memcmp(e->a, f->a, sizeof(float) * (size_t)(RANK * e->in))) return 0;
        int qk = strstr(e->name, "attn_q.") || strstr(e->name, "attn_k.");
        if ((same_qk || !qk) && memcmp(e->b, f->b, sizeof(float) * (size_t)(RANK * e->out)))
            return 0;
    }
    return 1;
}

static void test_gguf_roundtrip(void) {
    fmt_lora a, r;
    make_adapter(&a);
    a.qk_interleaved = 1; /* already in the file's order: nothing moves */
    CHECK_OK(fmt_lora_write_gguf("a.gguf", &a, 0));
    CHECK_OK(fmt_lora_read_gguf("a.gguf", &r));
    CHECK(same(&a, &r, 1), "GGUF round trip differs");
    CHECK(r.alpha == 8.0f && r.rank == RANK && r.qk_interleaved == 1 && !r.use_rslora,
          "alpha %g rank %d qk %d", (double)r.alpha, r.rank, r.qk_interleaved);
    CHECK(r.n == LAYERS * 7 + 1, "%d matrices", r.n);
    CHECK_NEAR(fmt_lora_scale(&r), 2.0, 0);

    /* what llama.cpp checks: the keys, and ne = {in, rank} / {rank, out} */
    io_gguf *g = NULL;
    CHECK_OK(io_gguf_open("a.gguf", &g));
    if (g) {
        const char *s;
        size_t len;
        CHECK(!io_gguf_get_str(g, "general.type", &s, &len) && len == 7 && !memcmp(s, "adapter", 7),
              "general.type");
        CHECK(!io_gguf_get_str(g, "adapter.type", &s, &len) && len == 4 && !memcmp(s, "lora", 4),
              "adapter.type");
        CHECK(!io_gguf_get_str(g, "general.architecture", &s, &len) && len == 5, "arch");
        const io_gguf_kv *kv = io_gguf_find(g, "adapter.lora.alpha");
        CHECK(kv && kv->type == IO_GGUF_F32, "alpha is not f32");
        const io_gguf_tensor *ta = io_gguf_find_tensor(g, "blk.1.attn_k.weight.lora_a");
        const io_gguf_tensor *tb = io_gguf_find_tensor(g, "blk.1.attn_k.weight.lora_b");
        CHECK(ta && ta->dims[0] == D && ta->dims[1] == RANK && ta->type == 0, "lora_a ne");
        CHECK(tb && tb->dims[0] == RANK && tb->dims[1] == KV && tb->type == 0, "lora_b ne");
        const io_gguf_tensor *to = io_gguf_find_tensor(g, "output.weight.lora_b");
        CHECK(to && to->dims[1] == VOCAB, "output lora_b");
        if (tb)
            CHECK(!memcmp(tb->data, fmt_lora_find(&a, "blk.1.attn_k.weight")->b,
                          sizeof(float) * RANK * KV),
                  "lora_b data is not B row-major");
        io_gguf_close(g);
    }
    fmt_lora_free(&r);

    /* rsLoRA folds into alpha: the same scale under llama.cpp's alpha / rank */
    a.use_rslora = 1;
    CHECK_OK(fmt_lora_write_gguf("rs.gguf", &a, 0));
    CHECK_OK(fmt_lora_read_gguf("rs.gguf", &r));
    CHECK(!r.use_rslora && r.alpha == 16.0f, "rslora read as alpha %g", (double)r.alpha);
    CHECK_NEAR(fmt_lora_scale(&r), fmt_lora_scale(&a), 1e-6);
    CHECK_NEAR(fmt_lora_scale(&a), 4.0, 1e-6);
    fmt_lora_free(&r);
    fmt_lora_free(&a);
}

static void test_peft_roundtrip(void) {
    fmt_lora a, r;
    make_adapter(&a);
    CHECK_OK(fmt_lora_write_peft("peft", &a, 0));
    CHECK_OK(fmt_lora_read_peft("peft", "llama", &r));
    CHECK(same(&a, &r, 1), "PEFT round trip differs");
    CHECK(r.alpha == 8.0f && r.rank == RANK && r.qk_interleaved == 0 && !r.use_rslora &&
              r.dropout == 0.05f && !strcmp(r.base_model, "tiny-llama"),
          "config read back: alpha %g rank %d dropout %g base %s", (double)r.alpha, r.rank,
          (double)r.dropout, r.base_model);
    fmt_lora_free(&r);

    cJSON *j = t_read_json("peft/adapter_config.json");
    if (j) {
        const cJSON *t = cJSON_GetObjectItem(j, "target_modules");
        CHECK(cJSON_GetArraySize(t) == 8, "%d target_modules", cJSON_GetArraySize(t));
        int q = 0, head = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, t) {
            q += !strcmp(e->valuestring, "q_proj");
            head += !strcmp(e->valuestring, "lm_head");
        }
        CHECK(q == 1 && head == 1, "target_modules lack q_proj or lm_head");
        CHECK(!strcmp(cJSON_GetObjectItem(j, "peft_type")->valuestring, "LORA"), "peft_type");
        CHECK(!strcmp(cJSON_GetObjectItem(j, "task_type")->valuestring, "CAUSAL_LM"), "task");
        CHECK(!strcmp(cJSON_GetObjectItem(j, "bias")->valuestring, "none"), "bias");
        CHECK(cJSON_GetObjectItem(j, "r")->valuedouble == RANK, "r");
        CHECK(cJSON_GetObjectItem(j, "lora_alpha")->valuedouble == 8, "lora_alpha");
        CHECK(cJSON_IsFalse(cJSON_GetObjectItem(j, "use_rslora")), "use_rslora");
        CHECK(cJSON_IsFalse(cJSON_GetObjectItem(j, "fan_in_fan_out")), "fan_in_fan_out");
        /* LoraConfig(**config) must take every key: booleans where PEFT has them */
        CHECK(cJSON_IsTrue(cJSON_GetObjectItem(j, "init_lora_weights")), "init_lora_weights");
        CHECK(cJSON_IsNull(cJSON_GetObjectItem(j, "modules_to_save")), "modules_to_save");
        CHECK(!strcmp(cJSON_GetObjectItem(j, "base_model_name_or_path")->valuestring, "tiny-llama"),
              "base_model_name_or_path");
        cJSON_Delete(j);
    }
    io_st_file f;
    memset(&f, 0, sizeof f);
    CHECK_OK(io_st_open(&f, "peft/adapter_model.safetensors"));
    if (f.tensors) {
        const io_st_tensor *t =
            io_st_find(&f, "base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight");
        CHECK(t && t->ndim == 2 && t->shape[0] == KV && t->shape[1] == RANK, "k_proj lora_B");
        t = io_st_find(&f, "base_model.model.model.layers.0.mlp.down_proj.lora_A.weight");
        CHECK(t && t->shape[0] == RANK && t->shape[1] == FF, "down_proj lora_A");
        t = io_st_find(&f, "base_model.model.lm_head.lora_B.weight");
        CHECK(t && t->shape[0] == VOCAB, "lm_head lora_B");
        CHECK(io_st_meta(&f, "format") && !strcmp(io_st_meta(&f, "format"), "pt"), "format");
        io_st_close(&f);
    }

    a.use_rslora = 1;
    CHECK_OK(fmt_lora_write_peft("peft_rs", &a, 0));
    CHECK_OK(fmt_lora_read_peft("peft_rs", NULL, &r));
    CHECK(r.use_rslora && r.alpha == 8.0f, "rslora lost");
    fmt_lora_free(&r);
    fmt_lora_free(&a);
}

/* PEFT (HF half order) -> GGUF (interleaved for llama) -> PEFT: q/k B rows move within each head
 * as HF's converter moves the base's rows, everything else stays. */
static void test_conversion(void) {
    fmt_lora h, g, p;
    make_adapter(&h);
    CHECK(fmt_lora_write_gguf("conv.gguf", &h, 0) == TLM_ERR_ARG, "q/k moved without head dim");
    CHECK_ERROR_HAS("head dimension");
    CHECK_OK(fmt_lora_write_gguf("conv.gguf", &h, HD));
    CHECK_OK(fmt_lora_read_gguf("conv.gguf", &g));
    CHECK(same(&h, &g, 0), "A or non-q/k B changed");
    int bad = 0, moved = 0;
    for (int l = 0; l < LAYERS; l++)
        for (int qk = 0; qk < 2; qk++) {
            char nm[64];
            snprintf(nm, sizeof nm, "blk.%d.%s.weight", l, qk ? "attn_k" : "attn_q");
            const fmt_lora_mat *x = fmt_lora_find(&h, nm), *y = fmt_lora_find(&g, nm);
            if (!x || !y) {
                bad++;
                continue;
            }
            /* GGUF row head*HD + 2i + j holds HF row head*HD + j*HD/2 + i */
            for (int64_t hh = 0; hh < x->out / HD; hh++)
                for (int i = 0; i < HD / 2; i++)
                    for (int j = 0; j < 2; j++) {
                        int64_t gr = hh * HD + 2 * i + j, hr = hh * HD + j * (HD / 2) + i;
                        bad += memcmp(y->b + gr * RANK, x->b + hr * RANK, sizeof(float) * RANK);
                        moved += gr != hr;
                    }
        }
    CHECK(bad == 0 && moved > 0, "%d q/k rows misplaced (%d moved)", bad, moved);
    CHECK_OK(fmt_lora_write_peft("conv_peft", &g, HD));
    CHECK_OK(fmt_lora_read_peft("conv_peft", "llama", &p));
    CHECK(same(&h, &p, 1), "PEFT -> GGUF -> PEFT differs");
    fmt_lora_free(&p);

    /* in memory too, and Qwen2 keeps HF's order in GGUF */
    CHECK_OK(fmt_lora_set_qk_order(&g, 0, HD));
    CHECK(same(&h, &g, 1) && g.qk_interleaved == 0, "set_qk_order does not invert");
    snprintf(h.arch, sizeof h.arch, "qwen2");
    CHECK_OK(fmt_lora_write_gguf("qwen.gguf", &h, 0));
    CHECK_OK(fmt_lora_read_gguf("qwen.gguf", &p));
    CHECK(same(&h, &p, 1) && p.qk_interleaved == 0, "qwen2 rows moved");
    fmt_lora_free(&p);
    fmt_lora_free(&g);
    fmt_lora_free(&h);
}

/* A GGUF built by hand: one kv set, then tensors (name, ne0, ne1, type, data). */
typedef struct {
    const char *name;
    uint64_t ne0, ne1;
    uint32_t type;
    const void *data;
    size_t bytes;
} raw_t;

static void write_gguf(const char *path, const char *gtype, const char *atype, const raw_t *t,
                       int n) {
    io_gguf_writer w;
    io_gguf_writer_init(&w, IO_GGUF_DEFAULT_ALIGNMENT);
    io_gguf_write_str(&w, "general.architecture", "llama");
    if (gtype) io_gguf_write_str(&w, "general.type", gtype);
    if (atype) io_gguf_write_str(&w, "adapter.type", atype);
    io_gguf_write_f32(&w, "adapter.lora.alpha", 2.0f);
    for (int i = 0; i < n; i++) {
        uint64_t d[2] = {t[i].ne0, t[i].ne1};
        io_gguf_write_tensor(&w, t[i].name, 2, d, t[i].type, t[i].bytes);
    }
    uint8_t *head;
    size_t len;
    CHECK_OK(io_gguf_writer_header(&w, &head, &len));
    FILE *f = fopen(path, "wb");
    fwrite(head, 1, len, f);
    static const uint8_t zeros[64];
    for (int i = 0; i < n; i++) {
        fwrite(t[i].data, 1, t[i].bytes, f);
        fwrite(zeros, 1, io_gguf_writer_pad(&w, t[i].bytes), f);
    }
    fclose(f);
    free(head);
    io_gguf_writer_free(&w);
}

static void expect_gguf_bad(const char *gtype, const char *atype, const raw_t *t, int n,
                            const char *needle) {
    write_gguf("bad.gguf", gtype, atype, t, n);
    fmt_lora r;
    tlm_status s = fmt_lora_read_gguf("bad.gguf", &r);
    CHECK(s != TLM_OK, "accepted a bad adapter (%s)", needle);
    CHECK_ERROR_HAS(needle);
    CHECK(r.n == 0 && r.m == NULL, "a refused adapter kept matrices");
    if (!s) fmt_lora_free(&r);
}

static void test_gguf_malformed(void) {
    static float A[RANK * D], B[D * RANK], B3[D * 3], N[RANK * D];
    for (int i = 0; i < RANK * D; i++) A[i] = N[i] = B[i] = (float)i / 64;
    N[5] = NAN;
    raw_t good[2] = {{"blk.0.attn_q.weight.lora_a", D, RANK, 0, A, sizeof A},
                     {"blk.0.attn_q.weight.lora_b", RANK, D, 0, B, sizeof B}};
    write_gguf("good.gguf", "adapter", "lora", good, 2);
    fmt_lora r;
    CHECK_OK(fmt_lora_read_gguf("good.gguf", &r));
    CHECK(r.n == 1 && r.alpha == 2.0f && r.rank == RANK, "hand-made adapter");
    fmt_lora_free(&r);

    expect_gguf_bad("model", "lora", good, 2, "general.type");
    expect_gguf_bad(NULL, "lora", good, 2, "general.type");
    expect_gguf_bad("adapter", "control_vector", good, 2, "adapter.type");
    expect_gguf_bad("adapter", "lora", good, 1, "no matching blk.0.attn_q.weight.lora_b");
    expect_gguf_bad("adapter", "lora", good + 1, 1, "no matching blk.0.attn_q.weight.lora_a");
    raw_t rk[2] = {good[0], {"blk.0.attn_q.weight.lora_b", 3, D, 0, B3, sizeof B3}};
    expect_gguf_bad("adapter", "lora", rk, 2, "rank");
    raw_t nan[2] = {{"blk.0.attn_q.weight.lora_a", D, RANK, 0, N, sizeof N}, good[1]};
    expect_gguf_bad("adapter", "lora", nan, 2, "NaN");
    raw_t unk[2] = {{"blk.0.attn_qq.weight.lora_a", D, RANK, 0, A, sizeof A},
                    {"blk.0.attn_qq.weight.lora_b", RANK, D, 0, B, sizeof B}};
    expect_gguf_bad("adapter", "lora", unk, 2, "unknown LoRA target 'blk.0.attn_qq.weight'");
    raw_t other[3] = {good[0], good[1], {"token_embd.weight", D, RANK, 0, A, sizeof A}};
    expect_gguf_bad("adapter", "lora", other, 3, "token_embd.weight");
    /* the same matrices in another order of dimensions (B transposed, as old finetune wrote) */
    raw_t tr[2] = {good[0], {"blk.0.attn_q.weight.lora_b", D, RANK, 0, B, sizeof B}};
    expect_gguf_bad("adapter", "lora", tr, 2, "rank");

    /* F16, BF16 and Q8_0 (rows of whole blocks: lora_a here) read as their values */
    static uint16_t ah[RANK * D], bb[D * RANK];
    static uint8_t q8[(D * RANK / 32) * 34];
    for (int i = 0; i < RANK * D; i++) {
        ah[i] = core_f32_to_f16((float)(i % 17) / 8);
        bb[i] = core_f32_to_bf16((float)(i % 13) / 4 - 1);
    }
    for (int b = 0; b < D * RANK / 32; b++) {
        q8[b * 34] = 0x00;
        q8[b * 34 + 1] = 0x38; /* f16 0.5 */
        for (int j = 0; j < 32; j++) q8[b * 34 + 2 + j] = (uint8_t)(int8_t)(j - 16 + b);
    }
    raw_t half[2] = {{"blk.0.ffn_up.weight.lora_a", D, RANK, 1, ah, sizeof ah},
                     {"blk.0.ffn_up.weight.lora_b", RANK, D, 30, bb, sizeof bb}};
    raw_t q[2] = {{"blk.0.attn_q.weight.lora_a", D, RANK, 8, q8, sizeof q8}, good[1]};
    write_gguf("half.gguf", "adapter", "lora", half, 2);
    CHECK_OK(fmt_lora_read_gguf("half.gguf", &r));
    if (r.n == 1) {
        int bad = 0;
        for (int i = 0; i < RANK * D; i++)
            bad += r.m[0].a[i] != (float)(i % 17) / 8 || r.m[0].b[i] != (float)(i % 13) / 4 - 1;
        CHECK(bad == 0, "%d F16/BF16 values differ", bad);
    }
    fmt_lora_free(&r);
    write_gguf("q8.gguf", "adapter", "lora", q, 2);
    CHECK_OK(fmt_lora_read_gguf("q8.gguf", &r));
    if (r.n == 1) {
        int bad = 0;
        for (int i = 0; i < RANK * D; i++)
            bad += r.m[0].a[i] != 0.5f * (float)(i % 32 - 16 + i / 32);
        CHECK(bad == 0, "%d Q8_0 values differ", bad);
    }
    fmt_lora_free(&r);
}

static void write_text(const char *path, const char *s) {
    CHECK(t_write_file(path, s, strlen(s)), "cannot write %s", path);
}

static void expect_peft_bad(const char *dir, const char *needle) {
    fmt_lora r;
    tlm_status s = fmt_lora_read_peft(dir, "llama", &r);
    CHECK(s != TLM_OK, "accepted a bad PEFT directory (%s)", needle);
    CHECK_ERROR_HAS(needle);
    if (!s) fmt_lora_free(&r);
}

static void test_peft_malformed(void) {
    fmt_lora a;
    make_adapter(&a);
    CHECK_OK(fmt_lora_write_peft("pbad", &a, 0));
    const char *cfg = "pbad/adapter_config.json";
    const char *base = "{\"peft_type\":\"LORA\",\"r\":4,\"lora_alpha\":8,\"bias\":\"none\","
                       "\"target_modules\":[\"q_proj\",\"k_proj\",\"v_proj\",\"o_proj\","
                       "\"gate_proj\",\"up_proj\",\"down_proj\",\"lm_head\"]";
    char buf[1024];
    snprintf(buf, sizeof buf, "%s}", base);
    write_text(cfg, buf);
    fmt_lora r;
    CHECK_OK(fmt_lora_read_peft("pbad", "llama", &r));
    CHECK(same(&a, &r, 1), "minimal config");
    fmt_lora_free(&r);
    snprintf(buf, sizeof buf, "%s,\"rank_pattern\":{\"q_proj\":8}}", base);
    write_text(cfg, buf);
    expect_peft_bad("pbad", "rank_pattern");
    snprintf(buf, sizeof buf, "%s,\"alpha_pattern\":{\"q_proj\":8}}", base);
    write_text(cfg, buf);
    expect_peft_bad("pbad", "alpha_pattern");
    write_text(cfg, "{\"peft_type\":\"IA3\",\"r\":4,\"lora_alpha\":8}");
    expect_peft_bad("pbad", "peft_type");
    write_text(cfg, "{\"peft_type\":\"LORA\",\"r\":8,\"lora_alpha\":8}");
    expect_peft_bad("pbad", "r = 8");
    write_text(cfg, "{\"peft_type\":\"LORA\",\"lora_alpha\":8}");
    expect_peft_bad("pbad", "r is missing");
    write_text(cfg, "{\"r\":4,\"lora_alpha\":8,\"target_modules\":[\"v_proj\"]}");
    expect_peft_bad("pbad", "target_modules");
    write_text(cfg, "{\"r\":4,\"lora_alpha\":8,\"use_dora\":true}");
    expect_peft_bad("pbad", "use_dora");
    write_text(cfg, "{\"r\":4,\"lora_alpha\":8,\"fan_in_fan_out\":true}");
    expect_peft_bad("pbad", "fan_in_fan_out");
    write_text(cfg, "{\"r\":4,\"lora_alpha\":8,\"bias\":\"all\"}");
    expect_peft_bad("pbad", "bias");
    write_text(cfg, "{\"r\":4,");
    expect_peft_bad("pbad", "JSON");

    /* tensors: a lone lora_A, a NaN, an unknown module */
    write_text(cfg, "{\"r\":4,\"lora_alpha\":8}");
    static float A[RANK * D], B[D * RANK];
    for (int i = 0; i < RANK * D; i++) A[i] = B[i] = (float)i;
    io_st_out_tensor t[2] = {{"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
                              TLM_DTYPE_F32,
                              2,
                              {RANK, D},
                              A},
                             {"base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight",
                              TLM_DTYPE_F32,
                              2,
                              {D, RANK},
                              B}};
    const char *st = "pbad/adapter_model.safetensors";
    CHECK_OK(io_st_write(st, t, 2, NULL, NULL, 0));
    CHECK_OK(fmt_lora_read_peft("pbad", "llama", &r));
    CHECK(r.n == 1 && r.m[0].a[7] == 7.0f, "hand-made PEFT adapter");
    fmt_lora_free(&r);
    CHECK_OK(io_st_write(st, t, 1, NULL, NULL, 0));
    expect_peft_bad("pbad", "no matching");
    B[9] = INFINITY;
    CHECK_OK(io_st_write(st, t, 2, NULL, NULL, 0));
    expect_peft_bad("pbad", "Inf");
    B[9] = 0;
    t[0].name = "base_model.model.model.layers.0.self_attn.rotary.lora_A.weight";
    t[1].name = "base_model.model.model.layers.0.self_attn.rotary.lora_B.weight";
    CHECK_OK(io_st_write(st, t, 2, NULL, NULL, 0));
    expect_peft_bad("pbad", "unknown LoRA target 'model.layers.0.self_attn.rotary'");
    t[0].name = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight";
    t[1].name = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight";
    t[1].shape[0] = RANK;
    t[1].shape[1] = D; /* B transposed */
    CHECK_OK(io_st_write(st, t, 2, NULL, NULL, 0));
    expect_peft_bad("pbad", "rank does not match");
    CHECK(rename(st, "pbad/adapter_model.bin") == 0, "rename");
    expect_peft_bad("pbad", "adapter_model.bin (a PyTorch pickle) is not read");
    remove("pbad/adapter_model.bin");
    expect_peft_bad("pbad", "no adapter_model.safetensors");
    expect_peft_bad("no_such_dir", "adapter_config.json");
    fmt_lora_free(&a);
}

static void test_base_checks(void) {
    fmt_lora a;
    make_adapter(&a);
    fmt_lora_base base[LAYERS * 7 + 1];
    char names[LAYERS * 7 + 1][64];
    int n = 0;
    for (int l = 0; l < LAYERS; l++)
        for (int k = 0; k < 7; k++, n++) {
            snprintf(names[n], 64, "blk.%d.%s.weight", l, kinds[k]);
            base[n].name = names[n];
            shape_of(k, &base[n].in, &base[n].out);
        }
    base[n++] = (fmt_lora_base){"output.weight", D, VOCAB};
    CHECK_OK(fmt_lora_check_base(&a, "llama", base, n));
    CHECK(fmt_lora_check_base(&a, "qwen2", base, n) != TLM_OK, "another architecture");
    CHECK_ERROR_HAS("architecture 'llama' but the model is 'qwen2'");
    CHECK(fmt_lora_check_base(&a, NULL, base, n - 1) != TLM_OK, "missing target");
    CHECK_ERROR_HAS("output.weight, which the model does not have");
    base[13].in = 64;
    CHECK(fmt_lora_check_base(&a, NULL, base, n) != TLM_OK, "shape");
    CHECK_ERROR_HAS("blk.1.ffn_down.weight is for a [32, 48] matrix but the model's is [32, 64]");

    /* building and validating */
    CHECK(fmt_lora_add(&a, "blk.0.attn_q.weight", D, D, NULL, NULL) != TLM_OK, "duplicate");
    CHECK_ERROR_HAS("twice");
    CHECK(fmt_lora_add(&a, "blk.0.attn_norm.weight", D, 1, NULL, NULL) != TLM_OK, "norm");
    CHECK_ERROR_HAS("blk.0.attn_norm.weight");
    CHECK(fmt_lora_add(&a, "blk.01.attn_q.weight", D, D, NULL, NULL) != TLM_OK, "leading zero");
    a.m[3].b[2] = NAN;
    CHECK(fmt_lora_write_gguf("nan.gguf", &a, 0) == TLM_ERR_NUMERIC, "wrote a NaN");
    CHECK_ERROR_HAS("blk.0.attn_output.weight lora_b holds NaN");
    CHECK(fmt_lora_write_peft("nan_peft", &a, 0) == TLM_ERR_NUMERIC, "wrote a NaN");
    fmt_lora_free(&a);
}

/* Damaged copies of a good adapter (bytes changed in the header, the file cut short) are read or
 * refused, never crash; a refusal leaves the adapter empty. */
static void test_gguf_damaged(void) {
    fmt_lora a, r;
    make_adapter(&a);
    a.qk_interleaved = 1;
    CHECK_OK(fmt_lora_write_gguf("dmg.gguf", &a, 0));
    fmt_lora_free(&a);
    FILE *f = fopen("dmg.gguf", "rb");
    static uint8_t buf[1 << 17];
    size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f) fclose(f);
    CHECK(n > 2048 && n < sizeof buf, "adapter of %zu bytes", n);
    if (n <= 2048 || n >= sizeof buf) return;
    int refused = 0, empty = 1;
    for (int it = 0; it < 300; it++) {
        static uint8_t bad[1 << 17];
        memcpy(bad, buf, n);
        size_t len = n;
        if (it % 3 == 2)
            len = t_rnd() % n;
        else
            for (int k = 0; k < 1 + it % 4; k++)
                bad[t_rnd() % 2048] ^= (uint8_t)(1 + t_rnd() % 255);
        t_write_file("dmg_bad.gguf", bad, len);
        tlm_status s = fmt_lora_read_gguf("dmg_bad.gguf", &r);
        refused += s != TLM_OK;
        if (s) empty &= r.n == 0 && r.m == NULL;
        fmt_lora_free(&r);
    }
    CHECK(refused > 100 && empty, "%d of 300 damaged files refused", refused);
}

/* A PEFT directory written by PyTorch (tests/reference/lora_peft.py, rsLoRA, layer 1 in bf16):
 * tlm reads it, and in GGUF's order its q/k B rows and every update s * B * A equal what
 * llama.cpp's converters make of it. */
static void test_torch_peft(void) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/tests/reference/lora_peft.py torch_lora",
             TLM_SOURCE_DIR);
    int rc = system(cmd);
    CHECK(rc == 0, "lora_peft.py failed (%d)", rc);
    if (rc) return;
    fmt_lora a, g;
    CHECK_OK(fmt_lora_read_peft("torch_lora/peft", "llama", &a));
    if (a.n == 0) return;
    CHECK(a.n == LAYERS * 7 + 1 && a.rank == RANK && a.use_rslora && a.alpha == 8.0f &&
              !strcmp(a.base_model, "tiny-llama"),
          "PyTorch's adapter read as n %d rank %d rslora %d alpha %g", a.n, a.rank, a.use_rslora,
          (double)a.alpha);
    CHECK_NEAR(fmt_lora_scale(&a), 4.0, 1e-6);
    CHECK_OK(fmt_lora_write_gguf("torch_lora/adapter.gguf", &a, HD));
    CHECK_OK(fmt_lora_read_gguf("torch_lora/adapter.gguf", &g));
    CHECK_OK(fmt_lora_set_qk_order(&a, 1, HD));
    io_st_file f;
    memset(&f, 0, sizeof f);
    CHECK_OK(io_st_open(&f, "torch_lora/expected.safetensors"));
    int checked = 0;
    for (int i = 0; i < a.n && f.tensors; i++) {
        for (int k = 0; k < 2; k++) {
            const fmt_lora *x = k ? &g : &a;
            const fmt_lora_mat *e = fmt_lora_find(x, a.m[i].name);
            if (!e) continue;
            char nm[96];
            size_t nb = (size_t)(e->out * RANK), nd = (size_t)(e->out * e->in);
            float *b = malloc(sizeof(float) * nb), *d = malloc(sizeof(float) * nd);
            snprintf(nm, sizeof nm, "%s.lora_b", e->name);
            const io_st_tensor *t = io_st_find(&f, nm);
            CHECK(t && !io_st_read_f32(&f, t, b, nb), "expected %s", nm);
            if (t) CHECK(!memcmp(b, e->b, sizeof(float) * nb), "%s differs from PyTorch's", nm);
            snprintf(nm, sizeof nm, "%s.delta", e->name);
            t = io_st_find(&f, nm);
            CHECK(t && !io_st_read_f32(&f, t, d, nd), "expected %s", nm);
            double worst = 0;
            float s = fmt_lora_scale(x);
            for (int64_t r = 0; t && r < e->out; r++)
                for (int64_t c = 0; c < e->in; c++) {
                    double acc = 0;
                    for (int j = 0; j < RANK; j++)
                        acc += (double)e->b[r * RANK + j] * (double)e->a[j * e->in + c];
                    worst = fmax(worst, fabs((double)s * acc - (double)d[r * e->in + c]));
                }
            CHECK(t && worst < 1e-5, "%s: s * B * A differs from PyTorch's by %g (%s)", e->name,
                  worst, k ? "via GGUF" : "in memory");
            checked++;
            free(b);
            free(d);
        }
    }
    CHECK(checked == 2 * (LAYERS * 7 + 1), "%d matrices checked", checked);
    if (f.tensors) io_st_close(&f);
    fmt_lora_free(&g);
    fmt_lora_free(&a);
}

/* llama.cpp (node-llama-cpp) loads tlm's GGUF adapter on stories260K.gguf, and its greedy
 * continuation with the adapter applied unmerged equals its continuation of the model with
 * s * B * A merged in by tlm (and differs from the base's): llama.cpp takes the file's keys, ne
 * order and alpha as tlm means them. (The merge uses the file's own q/k rows, so the direction
 * of their move is test_torch_peft's to check.) */
static void test_llamacpp(void) {
    const char *dir = t_require_shared_data();
    if (!dir) return;
    char base[512];
    snprintf(base, sizeof base, "%s/models/stories260K.gguf", dir);
    tlm_model *m = NULL;
    tlm_tokenizer *tok = NULL;
    CHECK_OK(tlm_model_load(base, TLM_LOAD_WRITABLE, &m));
    CHECK_OK(tlm_tokenizer_load(base, &tok));
    if (!m || !tok) goto done;
    const tlm_config *c = tlm_model_config(m);
    int hd = c->d_model / c->n_heads, nt = 0;
    const tlm_tensor_info *ti = tlm_model_tensors(m, &nt);
    fmt_lora a, g;
    memset(&a, 0, sizeof a);
    memset(&g, 0, sizeof g);
    snprintf(a.arch, sizeof a.arch, "llama");
    a.rank = 2;
    a.alpha = 4.0f;
    fmt_lora_base *bl = calloc((size_t)nt, sizeof *bl);
    int nb = 0;
    for (int i = 0; i < nt && bl; i++) {
        if (!fmt_lora_known_target(ti[i].name) || ti[i].ndim != 2) continue;
        bl[nb++] = (fmt_lora_base){ti[i].name, ti[i].shape[1], ti[i].shape[0]};
        CHECK_OK(fmt_lora_add(&a, ti[i].name, ti[i].shape[1], ti[i].shape[0], NULL, NULL));
        fmt_lora_mat *e = &a.m[a.n - 1];
        for (int64_t j = 0; j < 2 * e->in; j++) e->a[j] = t_unif() * 0.5f;
        for (int64_t j = 0; j < 2 * e->out; j++) e->b[j] = t_unif() * 0.2f;
    }
    CHECK(a.n >= 7 * c->n_layers, "%d targets in %s", a.n, base);
    CHECK_OK(fmt_lora_check_base(&a, "llama", bl, nb));
    CHECK_OK(fmt_lora_write_gguf("stories_lora.gguf", &a, hd));
    /* read back: in the file's (and this model's) interleaved order, merged into the weights */
    CHECK_OK(fmt_lora_read_gguf("stories_lora.gguf", &g));
    float s = fmt_lora_scale(&g);
    for (int i = 0; i < g.n; i++) {
        const fmt_lora_mat *e = &g.m[i];
        float *w = fmt_tensor(m, e->name);
        CHECK(w != NULL, "no %s", e->name);
        for (int64_t r = 0; w && r < e->out; r++)
            for (int64_t col = 0; col < e->in; col++) {
                float acc = 0;
                for (int j = 0; j < g.rank; j++)
                    acc += e->b[r * g.rank + j] * e->a[j * e->in + col];
                w[r * e->in + col] += s * acc;
            }
    }
    CHECK_OK(tlm_model_save_gguf(m, tok, "stories_merged.gguf", TLM_DTYPE_F32));
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "cd %s/tests/node && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true node llama_lora.mjs "
             "\"1 403 407\" 12 %s %s/stories_lora.gguf %s/stories_merged.gguf 2>&1",
             TLM_SOURCE_DIR, base, t_out_dir(), t_out_dir());
    FILE *f = popen(cmd, "r");
    CHECK(f != NULL, "cannot run node");
    char out[3][512] = {{0}}, line[4096];
    int k = 0;
    while (f && fgets(line, sizeof line, f)) {
        const char *ids = strstr(line, "\"ids\":[");
        CHECK(ids != NULL, "llama.cpp: %s", line);
        if (ids && k < 3) snprintf(out[k++], sizeof out[0], "%s", ids);
    }
    if (f) pclose(f);
    CHECK(k == 3, "llama.cpp ran %d of 3", k);
    if (k == 3) {
        CHECK(!strcmp(out[1], out[2]), "llama.cpp with tlm's adapter %s, merged %s", out[1],
              out[2]);
        CHECK(strcmp(out[0], out[1]), "the adapter changed nothing: %s", out[0]);
        printf("llama.cpp: base %slora   %smerged %s", out[0], out[1], out[2]);
    }
    fmt_lora_free(&g);
    fmt_lora_free(&a);
    free(bl);
done:
    tlm_tokenizer_free(tok);
    tlm_model_free(m);
}

int main(void) {
    test_gguf_roundtrip();
    test_peft_roundtrip();
    test_conversion();
    test_gguf_malformed();
    test_gguf_damaged();
    test_peft_malformed();
    test_base_checks();
    test_torch_peft();
    test_llamacpp();
    return t_finish("test_lora_files");
}
