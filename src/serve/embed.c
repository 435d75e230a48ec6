/* Embeddings (llama-server's --embeddings): request bodies of POST /v1/embeddings and
 * /embeddings, pooling a prompt's hidden rows into one vector, llama.cpp's normalizations, and
 * both answers' JSON. The hidden rows themselves come from the scheduler (srv_sched_embed). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "serve/serve.h"

static const char *const pool_names[] = {"none", "mean", "cls", "last"};

int srv_pooling_parse(const char *s) {
    for (int i = 0; i < 4; i++)
        if (s && !strcmp(s, pool_names[i])) return i;
    return -1;
}

const char *srv_pooling_name(srv_pooling p) {
    return p >= SRV_POOL_NONE && p <= SRV_POOL_LAST ? pool_names[p] : "?";
}

void srv_embed_request_free(srv_embed_request *r) {
    for (int i = 0; r->inputs && i < r->n_inputs; i++) {
        free(r->inputs[i].text);
        free(r->inputs[i].ids);
    }
    free(r->inputs);
    free(r->model);
    memset(r, 0, sizeof *r);
}

/* 1 if every element of a is a number (an array of ids: one prompt). */
static int all_numbers(const cJSON *a) {
    const cJSON *x;
    cJSON_ArrayForEach(x, a) if (!cJSON_IsNumber(x)) return 0;
    return 1;
}

static int read_ids(const cJSON *a, srv_embed_input *in, const char *param, srv_error *e) {
    int n = cJSON_GetArraySize(a);
    if (n == 0) return srv_fail(e, param, "an input holds no tokens");
    in->ids = malloc((size_t)n * sizeof *in->ids);
    if (!in->ids) return srv_fail(e, param, "out of memory");
    const cJSON *x;
    cJSON_ArrayForEach(x, a) {
        double v = x->valuedouble;
        if (!cJSON_IsNumber(x) || v != floor(v) || v < 0 || v > 2147483647.0)
            return srv_fail(e, param, "token ids must be integers in [0, 2^31)");
        in->ids[in->n_ids++] = (int32_t)v;
    }
    return 0;
}

static int read_text(const cJSON *s, srv_embed_input *in, const char *param, srv_error *e) {
    size_t n = strlen(s->valuestring);
    if (!srv_utf8_valid(s->valuestring, n))
        return srv_fail(e, param, "'%s' is not valid UTF-8", param);
    if (!(in->text = malloc(n + 1))) return srv_fail(e, param, "out of memory");
    memcpy(in->text, s->valuestring, n + 1);
    return 0;
}

int srv_embed_parse(const char *body, size_t len, int oai, int normalize, srv_embed_request *r,
                    srv_error *e) {
    memset(r, 0, sizeof *r);
    memset(e, 0, sizeof *e);
    r->normalize = normalize;
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return srv_fail(e, "", "the body is not a JSON object");
    }
    /* llama-server reads "input" first; "content" is its own field and always answers in its own
     * shape, whichever endpoint it came to. */
    const char *param = "input";
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(root, "input");
    if (!in || cJSON_IsNull(in)) {
        param = "content";
        in = cJSON_GetObjectItemCaseSensitive(root, "content");
        oai = 0;
    }
    r->oai = oai;
    int st = 0;
    if (!in || cJSON_IsNull(in)) {
        st = srv_fail(e, "input", "\"input\" or \"content\" must be provided");
        goto done;
    }
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(root, "encoding_format");
    if (f && !cJSON_IsNull(f)) {
        if (cJSON_IsString(f) && !strcmp(f->valuestring, "base64"))
            r->base64 = 1;
        else if (!cJSON_IsString(f) || strcmp(f->valuestring, "float")) {
            st =
                srv_fail(e, "encoding_format", "'encoding_format' must be \"float\" or \"base64\"");
            goto done;
        }
    }
    f = cJSON_GetObjectItemCaseSensitive(root, "embd_normalize");
    if (f && !cJSON_IsNull(f)) {
        double v = f->valuedouble;
        if (!cJSON_IsNumber(f) || v != floor(v) || v < -1 || v > 64) {
            st = srv_fail(e, "embd_normalize", "'embd_normalize' must be an integer in [-1, 64]");
            goto done;
        }
        r->normalize = (int)v;
    }
    f = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (cJSON_IsString(f) && srv_utf8_valid(f->valuestring, strlen(f->valuestring)) &&
        !(r->model = strdup(f->valuestring))) {
        st = srv_fail(e, "model", "out of memory");
        goto done;
    }
    /* a string, an array of ids (one input), or an array of strings and arrays of ids */
    int one =
        cJSON_IsString(in) || (cJSON_IsArray(in) && cJSON_GetArraySize(in) > 0 && all_numbers(in));
    if (!one && (!cJSON_IsArray(in) || cJSON_GetArraySize(in) == 0)) {
        st = srv_fail(e, param,
                      cJSON_IsArray(in)
                          ? "'%s' is an empty array"
                          : "'%s' must be a string, an array of token ids, or an array "
                            "of strings and arrays of token ids",
                      param);
        goto done;
    }
    int n = one ? 1 : cJSON_GetArraySize(in);
    if (n > SRV_MAX_EMBED_INPUTS) {
        st = srv_fail(e, param, "%d inputs (at most %d)", n, SRV_MAX_EMBED_INPUTS);
        goto done;
    }
    if (!(r->inputs = calloc((size_t)n, sizeof *r->inputs))) {
        st = srv_fail(e, param, "out of memory");
        goto done;
    }
    r->n_inputs = n;
    if (one) {
        st = cJSON_IsString(in) ? read_text(in, &r->inputs[0], param, e)
                                : read_ids(in, &r->inputs[0], param, e);
        goto done;
    }
    int i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, in) {
        if (cJSON_IsString(x))
            st = read_text(x, &r->inputs[i], param, e);
        else if (cJSON_IsArray(x))
            st = read_ids(x, &r->inputs[i], param, e);
        else
            st = srv_fail(e, param,
                          "element %d of '%s' is neither a string nor an array of token ids "
                          "(strings and ids mixed in one array are not read as one input)",
                          i, param);
        if (st) break;
        i++;
    }
done:
    cJSON_Delete(root);
    if (st) srv_embed_request_free(r);
    return st;
}

void srv_embed_pool(srv_pooling p, const float *hidden, int n, int d, float *out) {
    if (p == SRV_POOL_CLS || p == SRV_POOL_LAST) {
        memcpy(out, hidden + (size_t)(p == SRV_POOL_CLS ? 0 : n - 1) * (size_t)d,
               (size_t)d * sizeof(float));
        return;
    }
    /* mean, summed in double so that a long prompt's rows are not lost to rounding */
    for (int j = 0; j < d; j++) {
        double sum = 0;
        for (int i = 0; i < n; i++) sum += hidden[(size_t)i * (size_t)d + (size_t)j];
        out[j] = (float)(sum / n);
    }
}

void srv_embed_normalize(float *v, int d, int norm) {
    double sum = 0;
    if (norm < 0) return;
    if (norm == 0) {
        /* llama.cpp's "max absolute": the largest magnitude scaled to the int16 range */
        for (int i = 0; i < d; i++) sum = fabs(v[i]) > sum ? fabs(v[i]) : sum;
        sum /= 32760.0;
    } else if (norm == 2) {
        for (int i = 0; i < d; i++) sum += (double)v[i] * v[i];
        sum = sqrt(sum);
    } else {
        for (int i = 0; i < d; i++) sum += pow(fabs(v[i]), norm);
        sum = pow(sum, 1.0 / norm);
    }
    double k = sum > 0 ? 1.0 / sum : 0;
    for (int i = 0; i < d; i++) v[i] = (float)(v[i] * k);
}

static cJSON *vector(const float *v, int d) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < d; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
    return a;
}

/* The floats' bytes (little-endian, as OpenAI's clients decode them) in base64. */
static char *base64(const float *v, int d) {
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t n = (size_t)d * 4, o = 0;
    unsigned char *b = malloc(n ? n : 1);
    char *s = malloc((n + 2) / 3 * 4 + 1);
    if (!b || !s) {
        free(b);
        free(s);
        return NULL;
    }
    for (int i = 0; i < d; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        for (int k = 0; k < 4; k++) b[(size_t)i * 4 + (size_t)k] = (unsigned char)(u >> (8 * k));
    }
    for (size_t i = 0; i < n; i += 3) {
        uint32_t w = (uint32_t)b[i] << 16;
        if (i + 1 < n) w |= (uint32_t)b[i + 1] << 8;
        if (i + 2 < n) w |= b[i + 2];
        s[o++] = tab[(w >> 18) & 63];
        s[o++] = tab[(w >> 12) & 63];
        s[o++] = i + 1 < n ? tab[(w >> 6) & 63] : '=';
        s[o++] = i + 2 < n ? tab[w & 63] : '=';
    }
    s[o] = 0;
    free(b);
    return s;
}

char *srv_embed_response(const srv_embed_request *r, srv_pooling pool, float *const *vecs,
                         const int *n_rows, int d, const char *model_id) {
    cJSON *root, *list;
    long long tokens = 0;
    for (int i = 0; i < r->n_inputs; i++) tokens += n_rows[i];
    if (r->oai) {
        root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "object", "list");
        list = cJSON_AddArrayToObject(root, "data");
        cJSON_AddStringToObject(root, "model", r->model ? r->model : model_id);
        cJSON *u = cJSON_AddObjectToObject(root, "usage");
        cJSON_AddNumberToObject(u, "prompt_tokens", (double)tokens);
        cJSON_AddNumberToObject(u, "total_tokens", (double)tokens);
    } else {
        root = list = cJSON_CreateArray();
    }
    for (int i = 0; root && i < r->n_inputs; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "index", i);
        if (r->oai) {
            cJSON_AddStringToObject(o, "object", "embedding");
            if (r->base64) {
                char *s = base64(vecs[i], d);
                if (!s) {
                    cJSON_Delete(o);
                    cJSON_Delete(root);
                    return NULL;
                }
                cJSON_AddStringToObject(o, "embedding", s);
                cJSON_AddStringToObject(o, "encoding_format", "base64");
                free(s);
            } else {
                cJSON_AddItemToObject(o, "embedding", vector(vecs[i], d));
            }
        } else {
            /* llama-server's own shape: a list of vectors, one per token without pooling */
            int rows = pool == SRV_POOL_NONE ? n_rows[i] : 1;
            cJSON *a = cJSON_AddArrayToObject(o, "embedding");
            for (int k = 0; a && k < rows; k++)
                cJSON_AddItemToArray(a, vector(vecs[i] + (size_t)k * (size_t)d, d));
        }
        cJSON_AddItemToArray(list, o);
    }
    char *s = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return s;
}
