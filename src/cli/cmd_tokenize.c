/* tlm tokenize / tlm tokenizer: thin wrappers over the tokenizer API. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void tokenize_usage(FILE *f) {
    fprintf(
        f,
        "usage: tlm tokenize -z TOKENIZER [--allow-special] [--bos] [--eos] [--pieces]\n"
        "       tlm tokenize -z TOKENIZER --decode [--skip-special]\n\n"
        "Reads stdin exactly as it is (no trimming) and prints the token ids space-separated\n"
        "on one line. TOKENIZER: a llama2.c tokenizer.bin, a directory (or file) with GPT-2's\n"
        "encoder.json + vocab.bpe, a .gguf with a vocabulary, or a tlm tokenizer directory.\n\n"
        "  --allow-special  encode special tokens such as <|endoftext|> atomically\n"
        "                   (otherwise they are plain text)\n"
        "  --bos, --eos     add the BOS / EOS token\n"
        "  --pieces         print one token per line: id, a tab, the piece (escaped)\n"
        "  --decode         read ids from stdin and print the text they decode to\n"
        "  --skip-special   with --decode: special tokens print nothing\n\n"
        "       tlm tokenize -z TOKENIZER -o DIR [--shard-tokens N] [--chunk-kib K] [-t THREADS]\n"
        "                    FILE...\n\n"
        "Token shards for tlm train --data DIR: the files, in order, into DIR/shard_NNNNNN.bin\n"
        "of N tokens each (default 100000000), on every core, K KiB per core at a time\n"
        "(default 4096; any corpus size), cut only at line breaks GPT-2-style tokenizers split\n"
        "at anyway (in a line longer than K/2 KiB, between characters), with progress (MB/s,\n"
        "ETA) on stderr. SentencePiece-style tokenizers add their leading space per chunk.\n");
}

/* Reads all of stdin; refuses more than the encoder accepts. */
static int read_stdin(char **out, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) return cli_fail("tokenize: out of memory");
    for (;;) {
        if (n + 1 >= cap) { /* room for a terminating NUL */
            if (cap > TLM_TOKENIZER_MAX_INPUT) {
                free(buf);
                return cli_fail("tokenize: input is larger than the limit of %zu bytes",
                                (size_t)TLM_TOKENIZER_MAX_INPUT);
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                return cli_fail("tokenize: out of memory reading stdin");
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, stdin);
        n += got;
        if (got == 0) break;
    }
    if (ferror(stdin)) {
        free(buf);
        return cli_fail("tokenize: error reading stdin");
    }
    if (n > TLM_TOKENIZER_MAX_INPUT) {
        free(buf);
        return cli_fail("tokenize: input of %zu bytes is larger than the limit of %zu bytes", n,
                        (size_t)TLM_TOKENIZER_MAX_INPUT);
    }
    buf[n] = 0;
    *out = buf;
    *len = n;
    return 0;
}

static void print_escaped(const char *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == '\\')
            fputs("\\\\", stdout);
        else if (c == '\n')
            fputs("\\n", stdout);
        else if (c == '\t')
            fputs("\\t", stdout);
        else if (c == '\r')
            fputs("\\r", stdout);
        else if (c < 0x20 || c == 0x7F)
            printf("\\x%02X", c);
        else
            putchar(c);
    }
}

static int decode_stdin(tlm_tokenizer *tok, unsigned flags) {
    char *in;
    size_t n;
    if (read_stdin(&in, &n)) return 1;
    size_t cap = 1024, k = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    char *p = in, *end = in + n;
    int rc = 0;
    while (ids && !rc) {
        while (p < end && (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r' || *p == ',')) p++;
        if (p >= end) break;
        char *e;
        long v = strtol(p, &e, 10);
        if (e == p || v < INT32_MIN || v > INT32_MAX) {
            char word[24];
            size_t w = 0;
            while (w < sizeof word - 1 && p + w < end && p[w] > ' ' && p[w] < 0x7F) {
                word[w] = p[w];
                w++;
            }
            word[w] = 0;
            rc = cli_fail("tokenize --decode: '%s' (byte %zu of the input) is not a token id", word,
                          (size_t)(p - in));
            break;
        }
        if (k == cap) {
            int32_t *ni = realloc(ids, cap * 2 * sizeof *ids);
            if (!ni) break;
            ids = ni;
            cap *= 2;
        }
        ids[k++] = (int32_t)v;
        p = e;
    }
    if (!ids) rc = cli_fail("tokenize: out of memory");
    char *text = NULL;
    size_t tl = 0;
    if (!rc && tlm_tokenizer_decode(tok, ids, k, flags, &text, &tl) != TLM_OK)
        rc = cli_fail_status("tokenize --decode");
    if (!rc) fwrite(text, 1, tl, stdout);
    free(text);
    free(ids);
    free(in);
    return rc;
}

static int tokenize_args(int argc, char **argv, const char **zpath, const char **out,
                         unsigned *flags, unsigned *dflags, int *pieces, int *decode,
                         long *per_shard, long *chunk_kib, int *threads, char **files,
                         int *n_files);
static int encode_or_decode(tlm_tokenizer *tok, unsigned flags, unsigned dflags, int pieces,
                            int decode);

int cmd_tokenize(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        tokenize_usage(stdout);
        return 0;
    }
    const char *zpath = NULL, *out = NULL;
    unsigned flags = 0, dflags = 0;
    int pieces = 0, decode = 0, n_files = 0, threads = 0;
    long per_shard = 100000000, chunk_kib = 4096;
    char **files = calloc((size_t)argc, sizeof *files);
    if (!files) return cli_fail("tokenize: out of memory");
    int rc = tokenize_args(argc, argv, &zpath, &out, &flags, &dflags, &pieces, &decode, &per_shard,
                           &chunk_kib, &threads, files, &n_files);
    if (!rc && out) {
        if (decode || pieces || (flags & (TLM_ENCODE_ADD_BOS | TLM_ENCODE_ADD_EOS)))
            rc = cli_fail("tokenize: -o writes shards of ids; --decode, --pieces, --bos and --eos "
                          "do not apply");
    } else if (!rc && n_files > 0) {
        rc = cli_fail("tokenize: '%s': files are read with -o DIR (shards); without it, stdin",
                      files[0]);
    }
    if (!rc && !zpath)
        rc = cli_fail("tokenize: -z TOKENIZER is required (see tlm tokenize --help)");
    tlm_tokenizer *tok = NULL;
    if (!rc && tlm_tokenizer_load(zpath, &tok) != TLM_OK) rc = cli_fail_status("tokenize");
    if (!rc && out) {
        tlm_threads_set(threads);
        rc = cli_tokenize_shards(tok, out, per_shard, (size_t)chunk_kib << 10, files, n_files,
                                 flags);
    }
    free(files);
    if (rc || out) {
        tlm_tokenizer_free(tok);
        return rc;
    }
    return encode_or_decode(tok, flags, dflags, pieces, decode);
}

static int tokenize_args(int argc, char **argv, const char **zpath, const char **out,
                         unsigned *flags, unsigned *dflags, int *pieces, int *decode,
                         long *per_shard, long *chunk_kib, int *threads, char **files,
                         int *n_files) {
    for (int i = 1; i < argc; i++) {
        const char *v;
        long k;
        if (cli_flag_value(argc, argv, &i, "-o", "--out", &v)) {
            if (!v) return cli_fail("tokenize: -o needs a directory");
            *out = v;
        } else if (cli_flag_value(argc, argv, &i, "--shard-tokens", NULL, &v)) {
            if (!v || !cli_parse_int(v, &k) || k < 1 || k > (1L << 31))
                return cli_fail("tokenize: --shard-tokens must be an integer in [1, 2^31]");
            *per_shard = k;
        } else if (cli_flag_value(argc, argv, &i, "--chunk-kib", NULL, &v)) {
            if (!v || !cli_parse_int(v, &k) || k < 1 || k > (1L << 20))
                return cli_fail("tokenize: --chunk-kib must be an integer in [1, 1048576]");
            *chunk_kib = k;
        } else if (cli_flag_value(argc, argv, &i, "-t", "--threads", &v)) {
            if (!v || !cli_parse_int(v, &k) || k < 1 || k > 4096)
                return cli_fail("tokenize: -t must be an integer >= 1");
            *threads = (int)k;
        } else if (argv[i][0] != '-') {
            files[(*n_files)++] = argv[i];
        } else if (cli_flag_value(argc, argv, &i, "-z", "--tokenizer", &v)) {
            if (!v) return cli_fail("tokenize: -z needs a tokenizer path");
            *zpath = v;
        } else if (!strcmp(argv[i], "--allow-special")) {
            *flags |= TLM_ENCODE_ALLOW_SPECIAL;
        } else if (!strcmp(argv[i], "--bos")) {
            *flags |= TLM_ENCODE_ADD_BOS;
        } else if (!strcmp(argv[i], "--eos")) {
            *flags |= TLM_ENCODE_ADD_EOS;
        } else if (!strcmp(argv[i], "--pieces")) {
            *pieces = 1;
        } else if (!strcmp(argv[i], "--decode")) {
            *decode = 1;
        } else if (!strcmp(argv[i], "--skip-special")) {
            *dflags |= TLM_DECODE_SKIP_SPECIAL;
        } else {
            return cli_fail("tokenize: unknown option '%s' (see tlm tokenize --help)", argv[i]);
        }
    }
    return 0;
}

static int encode_or_decode(tlm_tokenizer *tok, unsigned flags, unsigned dflags, int pieces,
                            int decode) {
    if (decode) {
        int rc = decode_stdin(tok, dflags);
        tlm_tokenizer_free(tok);
        return rc;
    }
    char *in;
    size_t n;
    if (read_stdin(&in, &n)) {
        tlm_tokenizer_free(tok);
        return 1;
    }
    int32_t *ids;
    size_t k;
    int rc = 0;
    if (tlm_tokenizer_encode(tok, in, n, flags, &ids, &k) != TLM_OK) {
        rc = cli_fail_status("tokenize");
    } else if (pieces) {
        for (size_t i = 0; i < k; i++) {
            const char *p;
            size_t l;
            tlm_tokenizer_piece(tok, ids[i], &p, &l);
            printf("%ld\t", (long)ids[i]);
            print_escaped(p, l);
            putchar('\n');
        }
    } else {
        for (size_t i = 0; i < k; i++) printf(i ? " %ld" : "%ld", (long)ids[i]);
        putchar('\n');
    }
    if (fflush(stdout) != 0) rc = cli_fail("tokenize: cannot write stdout");
    free(ids);
    free(in);
    tlm_tokenizer_free(tok);
    return rc;
}

/* ---- tlm tokenizer ... --------------------------------------------------------------------- */

static void tokenizer_usage(FILE *f) {
    fprintf(f, "usage: tlm tokenizer train -i FILE [FILE...] [-i FILE ...] --vocab-size N\n"
               "                           [--special TOKEN ...] -o DIR [-t THREADS]\n"
               "       tlm tokenizer info -z TOKENIZER\n\n"
               "train: learns a byte-level BPE (GPT-2 pre-tokenization) on the files and writes\n"
               "       DIR/encoder.json, DIR/vocab.bpe and DIR/tokenizer.json. The vocabulary is\n"
               "       the special tokens, the 256 bytes, then one token per merge.\n"
               "info:  prints the kind, vocabulary size and special ids of a tokenizer.\n");
}

static int progress_cb(void *user, int32_t done, int32_t total) {
    (void)user;
    fprintf(stderr, "\rtlm: merges %ld/%ld", (long)done, (long)total);
    if (done == total) fputc('\n', stderr);
    return 0;
}

static int tokenizer_train(int argc, char **argv) {
    const char **files = calloc((size_t)argc, sizeof *files);
    const char **specials = calloc((size_t)argc, sizeof *specials);
    int nf = 0, ns = 0, rc = 0, quiet = 0;
    long vocab = 0, threads = 0;
    const char *outdir = NULL;
    if (!files || !specials) rc = cli_fail("tokenizer train: out of memory");
    for (int i = 2; i < argc && !rc; i++) {
        const char *v;
        if (!strcmp(argv[i], "-i") || !strcmp(argv[i], "--input")) {
            if (i + 1 >= argc) rc = cli_fail("tokenizer train: -i needs a file");
            while (i + 1 < argc && argv[i + 1][0] != '-') files[nf++] = argv[++i];
        } else if (!strcmp(argv[i], "--special")) {
            if (i + 1 >= argc) rc = cli_fail("tokenizer train: --special needs a token");
            while (i + 1 < argc && argv[i + 1][0] != '-') specials[ns++] = argv[++i];
        } else if (cli_flag_value(argc, argv, &i, "--vocab-size", NULL, &v)) {
            if (!cli_parse_int(v, &vocab) || vocab <= 0 || vocab > 0x1000000)
                rc = cli_fail("tokenizer train: --vocab-size needs a positive integer");
        } else if (cli_flag_value(argc, argv, &i, "-t", "--threads", &v)) {
            if (!cli_parse_int(v, &threads) || threads < 0 || threads > 1024)
                rc = cli_fail("tokenizer train: -t needs a thread count");
        } else if (cli_flag_value(argc, argv, &i, "-o", "--output", &v)) {
            if (!v) rc = cli_fail("tokenizer train: -o needs a directory");
            outdir = v;
        } else if (!strcmp(argv[i], "-q") || !strcmp(argv[i], "--quiet")) {
            quiet = 1;
        } else {
            rc = cli_fail("tokenizer train: unknown option '%s' (see tlm tokenizer --help)",
                          argv[i]);
        }
    }
    if (!rc && nf == 0) rc = cli_fail("tokenizer train: give at least one input with -i FILE");
    if (!rc && vocab == 0) rc = cli_fail("tokenizer train: --vocab-size N is required");
    if (!rc && !outdir) rc = cli_fail("tokenizer train: -o DIR is required");
    tlm_tokenizer *tok = NULL;
    if (!rc) {
        tlm_bpe_train_opts o = {0};
        o.vocab_size = (int32_t)vocab;
        o.specials = specials;
        o.n_specials = ns;
        o.threads = (int)threads;
        o.progress = quiet ? NULL : progress_cb;
        if (tlm_tokenizer_train_bpe(files, nf, &o, &tok) != TLM_OK)
            rc = cli_fail_status("tokenizer train");
        else if (tlm_tokenizer_save(tok, outdir) != TLM_OK)
            rc = cli_fail_status("tokenizer train");
        else if (!quiet)
            fprintf(stderr, "tlm: wrote %s (vocabulary %ld)\n", outdir,
                    (long)tlm_tokenizer_vocab_size(tok));
    }
    tlm_tokenizer_free(tok);
    free(files);
    free(specials);
    return rc;
}

static int tokenizer_info(int argc, char **argv) {
    const char *zpath = NULL;
    for (int i = 2; i < argc; i++) {
        const char *v;
        if (cli_flag_value(argc, argv, &i, "-z", "--tokenizer", &v)) {
            if (!v) return cli_fail("tokenizer info: -z needs a tokenizer path");
            zpath = v;
        } else {
            return cli_fail("tokenizer info: unknown option '%s'", argv[i]);
        }
    }
    if (!zpath) return cli_fail("tokenizer info: -z TOKENIZER is required");
    tlm_tokenizer *tok;
    if (tlm_tokenizer_load(zpath, &tok) != TLM_OK) return cli_fail_status("tokenizer info");
    printf("kind %s\nvocab_size %ld\nbos %ld\neos %ld\n",
           tlm_tokenizer_kind_name(tlm_tokenizer_get_kind(tok)),
           (long)tlm_tokenizer_vocab_size(tok), (long)tlm_tokenizer_bos(tok),
           (long)tlm_tokenizer_eos(tok));
    tlm_tokenizer_free(tok);
    return 0;
}

int cmd_tokenizer(int argc, char **argv) {
    if (argc < 2 || (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        tokenizer_usage(argc < 2 ? stderr : stdout);
        return argc < 2;
    }
    if (cli_wants_help(argc, argv)) {
        tokenizer_usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "train")) return tokenizer_train(argc, argv);
    if (!strcmp(argv[1], "info")) return tokenizer_info(argc, argv);
    return cli_fail("tokenizer: unknown subcommand '%s' (train, info)", argv[1]);
}
