/* tlm imatrix: an importance matrix for tlm quantize --imatrix (and llama-quantize), computed as
 * llama.cpp's llama-imatrix computes it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "core/core.h"

// clang-format off
static const char *imatrix_help =
    "usage: tlm imatrix -m MODEL -f TEXT [-o FILE] [-c N] [--chunks N] [--process-output]\n"
    "                   [--in-file FILE ...] [--output-format gguf|dat] [--no-ppl]\n"
    "                   [-z TOKENIZER] [-b B] [-t THREADS]\n"
    "       tlm imatrix --in-file A --in-file B ... -o FILE [-c N]     (merge only)\n"
    "       tlm imatrix --in-file FILE --show-statistics\n\n"
    "Computes an importance matrix, as llama.cpp's llama-imatrix does: the text is cut into\n"
    "chunks of N tokens (a BOS first where the vocabulary adds one), each chunk goes through the\n"
    "model, and for every weight matrix of the blocks the squared activations that meet each of\n"
    "its input columns are summed, with the number of tokens. tlm quantize --imatrix FILE (or\n"
    "llama-quantize --imatrix FILE) then weighs each column's rounding error by their mean,\n"
    "which matters most for the 2- to 4-bit types. Writes llama-imatrix's GGUF layout. Prints\n"
    "the perplexity of each chunk's second half, as llama-imatrix does.\n\n"
    "  -m, --model PATH      model (any format tlm reads; Llama-style)\n"
    "  -f, --file TEXT       calibration text\n"
    "  -o, --output FILE     where to write it (default imatrix.gguf)\n"
    "  -c, --ctx-size N      tokens per chunk (default 512, or the model's context if shorter)\n"
    "  --chunks N            at most N chunks (default: all the text holds)\n"
    "  --process-output      collect output.weight too (llama-imatrix's flag; off by default)\n"
    "  -z, --tokenizer PATH  tokenizer (default: the model's own)\n"
    "  --in-file FILE        start from this matrix (repeatable: their sums and token counts\n"
    "                        add up, their datasets are listed; llama-imatrix's files too)\n"
    "  --output-format F     gguf (default) or dat (llama.cpp's legacy layout)\n"
    "  --no-ppl              do not compute the chunks' perplexity\n"
    "  --show-statistics     print llama-imatrix's statistics of the one --in-file matrix per\n"
    "                        tensor (sum, min, max, mean, deviation of the mean squared\n"
    "                        activations, % active, entropy, ZD score, cosine similarity with\n"
    "                        the layer below) and per layer, then exit\n"
    "  -b, --batch B         chunks per forward pass (default 1)\n"
    "  -t, --threads N       threads (default: all cores)\n";
// clang-format on

/* Per-layer sums of llama-imatrix's weighted figures (by the tensors' elements), in floats. */
typedef struct {
    int layer, elements;
    float bias, zd, cossim;
} layer_stats;

/* llama-imatrix --show-statistics: the same table, figures and layout. */
static int show_statistics(const char *path, int chunk_size) {
    tlm_imatrix *im = NULL;
    tlm_imatrix_stat *st = NULL;
    int n = 0;
    if (tlm_imatrix_load(path, &im)) return cli_fail("imatrix: %s", tlm_last_error());
    tlm_status s = tlm_imatrix_statistics(im, chunk_size, &st, &n);
    tlm_imatrix_free(im);
    if (s) return cli_fail_status("imatrix");
    if (!n) {
        free(st);
        return cli_fail("imatrix: %s has no entry with tokens to compute statistics of", path);
    }
    layer_stats *ls = calloc((size_t)n, sizeof *ls);
    int nl = 0;
    if (!ls) {
        free(st);
        return cli_fail("imatrix: out of memory");
    }
    printf("\nComputing statistics for %s (%d tensors)\n", path, n);
    printf("\n%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", " Layer", "       Tensor",
           "          \u03a3(Act\u00b2)", "  Min", "            Max", "           \u03bc",
           "   \u03c3", " % Active", "N", "   Entropy", "E (norm)", "ZD", "  CosSim");
    for (int k = 0; k < 169; k++) putchar('=');
    putchar('\n');
    for (int i = 0; i < n; i++) {
        const tlm_imatrix_stat *t = &st[i];
        printf("%5s\t%-20s\t%10.2f\t%8.4f\t%11.4f\t%6.2f\t%6.2f\t%8.2f%%\t%6d\t%10.4f\t%6.2f%%\t%"
               "10.2f%%\t%8.4f\n",
               t->layer, t->tensor, (double)t->sum, (double)t->min, (double)t->max, (double)t->mean,
               (double)t->stddev, (double)(t->active * 100.0f), t->elements, (double)t->entropy,
               (double)t->entropy_norm, (double)(100.0f * t->zd), (double)t->cossim);
        char *end;
        long l = strtol(t->layer, &end, 10);
        int layer = end != t->layer && !*end ? (int)l : -1;
        int j = 0;
        while (j < nl && ls[j].layer != layer) j++;
        if (j == nl) ls[nl++] = (layer_stats){layer, 0, 0, 0, 0};
        ls[j].bias += (float)t->elements * t->sum;
        ls[j].zd += (float)t->elements * t->zd;
        ls[j].cossim += (float)t->elements * t->cossim;
        ls[j].elements += t->elements;
    }
    int layers = 0;
    for (int j = 0; j < nl; j++) layers += ls[j].layer >= 0;
    printf("\nComputing weighted average statistics per layer (%d layers)\n", layers);
    printf("\n%s\t%s\t%s\t%s\n", "  Layer", "     \u03bc\u03a3(Act\u00b2)", "      \u03bcZD",
           "\u03bcCosSim");
    printf("================================================\n");
    for (int done = 0; done < nl; done++) { /* by layer number, as llama-imatrix's map */
        int best = -1;
        for (int j = 0; j < nl; j++)
            if (ls[j].elements >= 0 && (best < 0 || ls[j].layer < ls[best].layer)) best = j;
        layer_stats *b = &ls[best];
        if (b->layer >= 0 && b->elements > 0)
            printf("%5d\t%14.2f\t%10.4f%%\t%6.4f\n", b->layer,
                   (double)(b->bias / (float)b->elements),
                   (double)(100.0f * (b->zd / (float)b->elements)),
                   (double)(b->cossim / (float)b->elements));
        b->elements = -1;
    }
    printf("\n");
    free(ls);
    free(st);
    return 0;
}

int cmd_imatrix(int argc, char **argv) {
    const char *model = NULL, *tokenizer = NULL, *data = NULL, *outp = "imatrix.gguf";
    long nctx = 0, max_chunks = -1, batch = 1, threads = 0;
    int output = 0, no_ppl = 0, dat = 0, n_in = 0, stats = 0;
    const char *in_files[16];
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(imatrix_help, stdout);
            return 0;
        } else if (cli_flag_value(argc, argv, &i, "-m", "--model", &v)) {
            if (!v) return cli_fail("imatrix: %s needs a value", argv[i]);
            model = v;
        } else if (cli_flag_value(argc, argv, &i, "-f", "--file", &v)) {
            if (!v) return cli_fail("imatrix: %s needs a value", argv[i]);
            data = v;
        } else if (cli_flag_value(argc, argv, &i, "-o", "--output", &v)) {
            if (!v) return cli_fail("imatrix: %s needs a value", argv[i]);
            outp = v;
        } else if (cli_flag_value(argc, argv, &i, "-z", "--tokenizer", &v)) {
            if (!v) return cli_fail("imatrix: %s needs a value", argv[i]);
            tokenizer = v;
        } else if (cli_flag_value(argc, argv, &i, "-c", "--ctx-size", &v)) {
            if (!cli_parse_int(v, &nctx) || nctx < 16)
                return cli_fail("imatrix: %s must be an integer of at least 16", argv[i]);
        } else if (cli_flag_value(argc, argv, &i, "--chunks", NULL, &v)) {
            if (!cli_parse_int(v, &max_chunks) || max_chunks < 1)
                return cli_fail("imatrix: --chunks must be a positive integer");
        } else if (cli_flag_value(argc, argv, &i, "-b", "--batch", &v)) {
            if (!cli_parse_int(v, &batch) || batch < 1)
                return cli_fail("imatrix: %s must be a positive integer", argv[i]);
        } else if (cli_flag_value(argc, argv, &i, "-t", "--threads", &v)) {
            if (!cli_parse_int(v, &threads) || threads < 1)
                return cli_fail("imatrix: %s must be a positive integer", argv[i]);
        } else if (!strcmp(argv[i], "--process-output")) {
            output = 1;
        } else if (!strcmp(argv[i], "--no-ppl")) {
            no_ppl = 1;
        } else if (cli_flag_value(argc, argv, &i, "--in-file", NULL, &v)) {
            if (!v) return cli_fail("imatrix: --in-file needs a file");
            if (n_in == 16) return cli_fail("imatrix: at most 16 --in-file matrices");
            in_files[n_in++] = v;
        } else if (!strcmp(argv[i], "--show-statistics")) {
            stats = 1;
        } else if (cli_flag_value(argc, argv, &i, "--output-format", NULL, &v)) {
            if (!v || (strcmp(v, "gguf") && strcmp(v, "dat")))
                return cli_fail("imatrix: --output-format must be gguf or dat");
            dat = !strcmp(v, "dat");
        } else {
            return cli_fail("imatrix: unknown option '%s' (see tlm imatrix --help)", argv[i]);
        }
    }
    if (stats) {
        if (n_in != 1 || data)
            return cli_fail("imatrix: --show-statistics reads one matrix: --in-file FILE");
        return show_statistics(in_files[0], nctx ? (int)nctx : 512);
    }
    if (!data && !n_in) return cli_fail("imatrix: -f TEXT is required (or --in-file to merge)");
    if (data && !model) return cli_fail("imatrix: -m MODEL is required");
    tlm_threads_set((int)threads);
    tlm_model *m = NULL;
    tlm_tokenizer *tok = NULL;
    tlm_imatrix *im = NULL;
    tlm_train_ctx *ctx = NULL;
    char *text = NULL;
    int32_t *ids = NULL, *x = NULL;
    size_t len = 0, n = 0;
    int rc = 0;
    if (tlm_imatrix_new(&im)) return cli_fail_status("imatrix");
    /* the chunk size: -c, else llama-imatrix's default (512), or the model's context if shorter */
    int T = nctx ? (int)nctx : 512;
    if (!rc && data) {
        if (tlm_model_load(model, 0, &m)) {
            rc = cli_fail_status("imatrix");
        } else if (tokenizer) {
            if (tlm_tokenizer_load(tokenizer, &tok))
                rc = cli_fail_status("imatrix: loading tokenizer");
        } else if (cli_model_tokenizer(model, &tok)) {
            rc = cli_fail_status("imatrix: loading the model's tokenizer");
        } else if (!tok) {
            rc = cli_fail("imatrix: no tokenizer travels with '%s'; give -z TOKENIZER", model);
        }
    }
    if (!rc && data && core_read_file(data, &text, &len)) rc = cli_fail_status("imatrix");
    /* llama-imatrix tokenizes as llama-perplexity does: BOS where the GGUF vocabulary adds one
     * (tlm writes that for SentencePiece vocabularies), special tokens read as plain text */
    int add_bos = tok && tlm_tokenizer_add_bos(tok);
    int bos = tok ? tlm_tokenizer_bos(tok) : -1;
    if (!rc && data &&
        tlm_tokenizer_encode(tok, text, len, add_bos ? TLM_ENCODE_ADD_BOS : 0u, &ids, &n))
        rc = cli_fail_status("imatrix: tokenizing");
    const tlm_config *c = rc || !m ? NULL : tlm_model_config(m);
    if (c) {
        T = nctx ? (int)nctx : c->context_length < 512 ? c->context_length : 512;
        if (T > c->context_length)
            rc = cli_fail("imatrix: -c %d is longer than the model's context (%d)", T,
                          c->context_length);
        else if (n < 2 * (size_t)T)
            rc = cli_fail("imatrix: the text has %zu tokens; at least two chunks of %d are needed",
                          n, T);
        for (size_t i = 0; !rc && i < n; i++)
            if (ids[i] >= c->vocab_size)
                rc = cli_fail("imatrix: token %d is outside the model's vocabulary (%d)", ids[i],
                              c->vocab_size);
    }
    /* merged with the chunk size the text is cut by (a legacy matrix counts calls of a chunk) */
    for (int k = 0; k < n_in && !rc; k++) {
        tlm_imatrix *in = NULL;
        if (tlm_imatrix_load(in_files[k], &in) || tlm_imatrix_merge(im, in, T))
            rc = cli_fail("imatrix: --in-file: %s", tlm_last_error());
        else
            fprintf(stderr, "%s: %d entries\n", in_files[k], tlm_imatrix_entries(in));
        tlm_imatrix_free(in);
    }
    size_t chunks = rc || !c ? 0 : n / (size_t)T;
    if (max_chunks > 0 && (size_t)max_chunks < chunks) chunks = (size_t)max_chunks;
    if (!rc && chunks && tlm_train_ctx_new(m, &ctx)) rc = cli_fail_status("imatrix");
    if (!rc && chunks && !(x = malloc(sizeof *x * (size_t)batch * T)))
        rc = cli_fail("imatrix: out of memory");
    double nll = 0;
    size_t scored = 0;
    for (size_t c0 = 0; !rc && c0 < chunks; c0 += (size_t)batch) {
        int nb = (int)(chunks - c0 < (size_t)batch ? chunks - c0 : (size_t)batch);
        memcpy(x, ids + c0 * T, sizeof *x * (size_t)nb * T);
        for (int b = 0; b < nb && add_bos; b++) x[(size_t)b * T] = bos;
        const float *lg = NULL;
        if (tlm_imatrix_collect(im, ctx, x, nb, T, output, &lg)) {
            rc = cli_fail_status("imatrix");
            break;
        }
        if (no_ppl) {
            fprintf(stderr, "[%zu/%zu]\n", c0 + nb, chunks);
            continue;
        }
        /* the second half of each chunk scored, as llama-imatrix reports it */
        int V = c->vocab_size;
        for (int b = 0; b < nb; b++)
            for (int t = T / 2; t < T - 1; t++) {
                const float *r = lg + ((size_t)b * T + t) * V;
                double mx = r[0], z = 0;
                for (int j = 1; j < V; j++) mx = r[j] > mx ? r[j] : mx;
                for (int j = 0; j < V; j++) z += exp((double)r[j] - mx);
                nll += mx + log(z) - r[ids[(c0 + b) * T + t + 1]];
                scored++;
            }
        fprintf(stderr, "[%zu/%zu] perplexity so far %.4f\n", c0 + nb, chunks,
                exp(nll / (double)scored));
    }
    /* chunks as llama-imatrix counts them: the most tokens any matrix saw, in chunks */
    int total = (int)(tlm_imatrix_tokens(im) / T);
    if (!rc && (dat ? tlm_imatrix_save_legacy(im, outp, data, total, T)
                    : tlm_imatrix_save(im, outp, data, total, T)))
        rc = cli_fail_status("imatrix");
    if (!rc)
        fprintf(stderr, "wrote %s: %d matrices, %d chunks of %d tokens\n", outp,
                tlm_imatrix_entries(im), total, T);
    free(x);
    free(ids);
    free(text);
    tlm_train_ctx_free(ctx);
    tlm_imatrix_free(im);
    tlm_tokenizer_free(tok);
    tlm_model_free(m);
    return rc;
}
