/* tlm generate: prompt in, text (or ids) streamed out as tokens are sampled. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "core/core.h"

// clang-format off
static const char *generate_help =
    "usage: tlm generate -m MODEL [-z TOKENIZER] [-p PROMPT | --ids \"ID ID ...\"] [-n N]\n"
    "                    [--temp T] [--top-k K] [--top-p P] [--min-p P] [--repeat-penalty R]\n"
    "                    [--presence-penalty X] [--frequency-penalty X] [--repeat-last-n N]\n"
    "                    [--seed S] [-t THREADS] [--print-ids] [--mmap|--no-mmap]\n"
    "                    [--precision auto|fp32|bf16] [--cache-type T | -ctk T -ctv T]\n"
    "                    [--grammar FILE | --json-schema FILE]\n"
    "                    [-md DRAFT [--draft-max N] [--draft-min N] [--draft-p-min P] | --lookup]\n"
    "\n"
    "Samples a continuation of the prompt and streams it to stdout (the prompt first, then the\n"
    "new text, never half a UTF-8 character). Timings go to stderr at the end.\n\n"
    "  -m, --model PATH      model (tlm checkpoint directory or .safetensors)\n"
    "  -z, --tokenizer PATH  tokenizer; default: the model's own (DIR/tokenizer of a tlm\n"
    "                        checkpoint). Without one, give --ids and get ids back.\n"
    "  -p, --prompt TEXT     prompt text (SentencePiece vocabularies get BOS prepended)\n"
    "  --ids \"I I ...\"       prompt as token ids (spaces or commas between them)\n"
    "                        without a prompt, generation starts from BOS\n"
    "  -n, --n-predict N     new tokens to generate (default 256; -1: until EOS or the\n"
    "                        context is full)\n"
    "  --temp T              temperature (default 0.8; 0 = greedy)\n"
    "  --top-k K             keep the K most likely tokens (default 40; 0 = off)\n"
    "  --top-p P             keep the smallest set with probability mass >= P (default 0.95;\n"
    "                        1 = off)\n"
    "  --min-p P             drop tokens less likely than P times the likeliest (default 0)\n"
    "  --repeat-penalty R    divide the logits of recent tokens by R (default 1 = off)\n"
    "  --presence-penalty X  subtract X from the logits of recent tokens (default 0)\n"
    "  --frequency-penalty X subtract X times their count from recent tokens' logits (default 0)\n"
    "  --repeat-last-n N     tokens the penalties look back over, prompt included (default 64)\n"
    "  --seed S              sampling seed (default 0: the same output every run)\n"
    "  -t, --threads N       threads (default: all cores)\n"
    "  --print-ids           print the whole id sequence (prompt, then generated) on one line\n"
    "                        instead of text\n"
    "  --grammar FILE        constrain the output to a GBNF grammar (llama.cpp's format; the\n"
    "                        rule 'root' is the whole output)\n"
    "  --json-schema FILE    constrain the output to JSON matching a JSON Schema\n"
    "                        (docs/structured-output.md lists the keywords supported)\n"
    "\n"
    "Speculative decoding (docs/inference.md): a cheap proposer guesses ids that the model\n"
    "checks several at a time. Greedy output is the same as without it; sampled output\n"
    "follows the same distribution. Not with --grammar or --json-schema.\n"
    "  -md, --model-draft F  draft model (any format -m takes) sharing the model's vocabulary;\n"
    "                        its cache is F32, its LoRA none\n"
    "  --draft-max N         ids proposed per pass at most (default 16)\n"
    "  --draft-min N         a shorter proposal is dropped for a plain step (default 0)\n"
    "  --draft-p-min P       the draft stops at an id it gives less probability (default 0.75)\n"
    "  --lookup              propose by n-gram lookup over the prompt and the output so far\n"
    "                        (no draft model): for output that repeats its input\n"
    CLI_MMAP_HELP
    CLI_PRECISION_HELP
    CLI_CACHE_TYPE_HELP
    CLI_LORA_HELP
    "\n"
    "Generation stops after N tokens, at the vocabulary's EOS or another end of generation (as\n"
    "llama.cpp's: <|eot_id|>, <|im_end|>, <|endoftext|>, ...), or when prompt + output reach the\n"
    "model's context_length (with a notice on stderr; no context shift).\n";
// clang-format on

typedef struct {
    tlm_decoder *dec; /* NULL: print ids */
    const tlm_tokenizer *tok;
    int ids_printed;
    int failed;
} stream;

static void put_id(stream *st, int32_t id) { printf(st->ids_printed++ ? " %d" : "%d", (int)id); }

static int on_token(void *user, int seq, int32_t id) {
    (void)seq;
    stream *st = user;
    if (st->dec) {
        const char *b;
        size_t n;
        if (tlm_decoder_push(st->dec, id, &b, &n)) {
            st->failed = 1;
            return 1;
        }
        fwrite(b, 1, n, stdout);
    } else {
        put_id(st, id);
    }
    fflush(stdout);
    /* an end of generation besides EOS (Llama 3's <|eot_id|>, ChatML's <|im_end|>, ...) */
    return tlm_tokenizer_is_eog(st->tok, id);
}

static int parse_ids(const char *s, int32_t **ids, int *n) {
    size_t cap = 16, len = 0;
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) return 0;
    const char *p = s;
    for (;;) {
        while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n') p++;
        if (!*p) break;
        char *end;
        long x = strtol(p, &end, 10);
        if (end == p || x < 0 || x > INT32_MAX || (*end && !strchr(" ,\t\n", *end))) {
            free(v);
            return 0;
        }
        if (len == cap) {
            int32_t *nv = realloc(v, (cap *= 2) * sizeof *v);
            if (!nv) {
                free(v);
                return 0;
            }
            v = nv;
        }
        v[len++] = (int32_t)x;
        p = end;
    }
    *ids = v;
    *n = (int)len;
    return 1;
}

int cmd_generate(int argc, char **argv) {
    const char *model_path = NULL, *tok_path = NULL, *prompt = NULL, *ids_arg = NULL;
    const char *precision = NULL, *grammar_path = NULL, *schema_path = NULL, *draft_path = NULL;
    cli_cache cache = CLI_CACHE_DEFAULT;
    cli_lora lora = {0};
    int ck;
    long n_new = 256, top_k = 40, seed = 0, threads = 0;
    double temp = 0.8, top_p = 0.95, min_p = 0, rep_pen = 1, pres_pen = 0, freq_pen = 0;
    long last_n = 64, num = 0;
    double p_min = 0;
    int print_ids = 0, map_mode = CLI_MAP_AUTO, lookup = 0;
    tlm_spec_opts spec;
    tlm_spec_opts_defaults(&spec);
    for (int i = 1; i < argc; i++) {
        const char *v, *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(generate_help, stdout);
            return 0;
        } else if (!strcmp(a, "--print-ids")) {
            print_ids = 1;
            continue;
        } else if (!strcmp(a, "--lookup")) {
            lookup = 1;
            continue;
        } else if (cli_map_flag(a, &map_mode)) {
            continue;
        }
        if (cli_flag_value(argc, argv, &i, "-m", "--model", &v)) {
            if (!v) return cli_fail("generate: %s needs a value", a);
            model_path = v;
        } else if (cli_flag_value(argc, argv, &i, "--precision", NULL, &v)) {
            if (!v) return cli_fail("generate: %s needs a value", a);
            precision = v;
        } else if ((ck = cli_cache_flag("generate", argc, argv, &i, &cache)) != 0) {
            if (ck < 0) return 1;
        } else if ((ck = cli_lora_flag("generate", argc, argv, &i, &lora)) != 0) {
            if (ck < 0) {
                cli_lora_free(&lora);
                return 1;
            }
        } else if (cli_flag_value(argc, argv, &i, "-z", "--tokenizer", &v)) {
            if (!v) return cli_fail("generate: %s needs a value", a);
            tok_path = v;
        } else if (cli_flag_value(argc, argv, &i, "-p", "--prompt", &v)) {
            if (!v) return cli_fail("generate: %s needs a value", a);
            prompt = v;
        } else if (cli_flag_value(argc, argv, &i, "--ids", NULL, &v)) {
            if (!v) return cli_fail("generate: %s needs a value", a);
            ids_arg = v;
        } else if (cli_flag_value(argc, argv, &i, "-n", "--n-predict", &v)) {
            if (!v) return cli_fail("generate: %s needs a value", a);
            if (!cli_parse_int(v, &n_new) || n_new < -1 || n_new > INT32_MAX)
                return cli_fail("generate: -n wants a count >= -1, got '%s'", v);
        } else if (cli_flag_value(argc, argv, &i, "--temp", NULL, &v)) {
            if (!v) return cli_fail("generate: %s needs a value", a);
            if (!cli_parse_float(v, &temp) || !(temp >= 0) || temp > 1e6)
                return cli_fail("generate: --temp wants a number >= 0, got '%s'", v);
        } else if (cli_flag_value(argc, argv, &i, "--top-k", NULL, &v)) {
            if (!v) return cli_fail("generate: %s needs a value", a);
            if (!cli_parse_int(v, &top_k) || top_k < 0 || top_k > INT32_MAX)
                return cli_fail("generate: --top-k wants a count >= 0, got '%s'", v);
        } else if (cli_flag_value(argc, argv, &i, "--top-p", NULL, &v)) {
            if (!v) return cli_fail("generate: %s needs a value", a);
            if (!cli_parse_float(v, &top_p) || !(top_p > 0 && top_p <= 1))
                return cli_fail("generate: --top-p wants a number in (0, 1], got '%s'", v);
        } else if (cli_flag_value(argc, argv, &i, "--min-p", NULL, &v)) {
            if (!v) return cli_fail("generate: %s needs a value", a);
            if (!cli_parse_float(v, &min_p) || !(min_p >= 0 && min_p <= 1))
                return cli_fail("generate: --min-p wants a number in [0, 1], got '%s'", v);
        } else if (cli_flag_value(argc, argv, &i, "--repeat-penalty", NULL, &v)) {
            if (!v) return cli_fail("generate: %s needs a value", a);
            if (!cli_parse_float(v, &rep_pen) || !(rep_pen > 0) || rep_pen > 1e6)
                return cli_fail("generate: --repeat-penalty wants a number > 0, got '%s'", v);
        } else if (cli_flag_value(argc, argv, &i, "--presence-penalty", NULL, &v)) {
            if (!v) return cli_fail("generate: %s needs a value", a);
            if (!cli_parse_float(v, &pres_pen) || !(pres_pen >= -1e6 && pres_pen <= 1e6))
                return cli_fail("generate: --presence-penalty wants a number, got '%s'", v);
        } else if (cli_flag_value(argc, argv, &i, "--frequency-penalty", NULL, &v)) {
            if (!v) return cli_fail("generate: %s needs a value", a);
            if (!cli_parse_float(v, &freq_pen) || !(freq_pen >= -1e6 && freq_pen <= 1e6))
                return cli_fail("generate: --frequency-penalty wants a number, got '%s'", v);
        } else if (cli_flag_value(argc, argv, &i, "--repeat-last-n", NULL, &v)) {
            if (!v) return cli_fail("generate: %s needs a value", a);
            if (!cli_parse_int(v, &last_n) || last_n < 1 || last_n > (1 << 20))
                return cli_fail("generate: --repeat-last-n wants a count in [1, 2^20], got '%s'",
                                v);
        } else if (cli_flag_value(argc, argv, &i, "--seed", NULL, &v)) {
            if (!v) return cli_fail("generate: %s needs a value", a);
            if (!cli_parse_int(v, &seed) || seed < 0)
                return cli_fail("generate: --seed wants an integer >= 0, got '%s'", v);
        } else if (cli_flag_value(argc, argv, &i, "--grammar", NULL, &v)) {
            if (!v) return cli_fail("generate: %s needs a value", a);
            grammar_path = v;
        } else if (cli_flag_value(argc, argv, &i, "--json-schema", NULL, &v)) {
            if (!v) return cli_fail("generate: %s needs a value", a);
            schema_path = v;
        } else if (cli_flag_value(argc, argv, &i, "-md", "--model-draft", &v)) {
            if (!v) return cli_fail("generate: %s needs a value", a);
            draft_path = v;
        } else if (cli_flag_value(argc, argv, &i, "--draft-max", "--draft", &v)) {
            if (!v) return cli_fail("generate: %s needs a value", a);
            if (!cli_parse_int(v, &num) || num < 0 || num > 256)
                return cli_fail("generate: --draft-max wants a count in [0, 256], got '%s'", v);
            spec.draft_max = (int)num;
        } else if (cli_flag_value(argc, argv, &i, "--draft-min", NULL, &v)) {
            if (!v) return cli_fail("generate: %s needs a value", a);
            if (!cli_parse_int(v, &num) || num < 0 || num > 256)
                return cli_fail("generate: --draft-min wants a count in [0, 256], got '%s'", v);
            spec.draft_min = (int)num;
        } else if (cli_flag_value(argc, argv, &i, "--draft-p-min", NULL, &v)) {
            if (!v) return cli_fail("generate: %s needs a value", a);
            if (!cli_parse_float(v, &p_min) || !(p_min >= 0 && p_min <= 1))
                return cli_fail("generate: --draft-p-min wants a number in [0, 1], got '%s'", v);
            spec.draft_p_min = (float)p_min;
        } else if (cli_flag_value(argc, argv, &i, "-t", "--threads", &v)) {
            if (!v) return cli_fail("generate: %s needs a value", a);
            if (!cli_parse_int(v, &threads) || threads <= 0 || threads > 4096)
                return cli_fail("generate: -t wants a thread count >= 1, got '%s'", v);
        } else {
            return cli_fail("generate: unknown option '%s' (see tlm generate --help)", a);
        }
    }
    if (!model_path) return cli_fail("generate: -m MODEL is required (see tlm generate --help)");
    if (prompt && ids_arg) return cli_fail("generate: give -p or --ids, not both");
    if (grammar_path && schema_path)
        return cli_fail("generate: give --grammar or --json-schema, not both");
    if (draft_path && lookup) return cli_fail("generate: give -md or --lookup, not both");
    if ((draft_path || lookup) && (grammar_path || schema_path))
        return cli_fail("generate: speculative decoding (%s) does not take %s",
                        draft_path ? "-md" : "--lookup",
                        grammar_path ? "--grammar" : "--json-schema");
    if (spec.draft_min > spec.draft_max)
        return cli_fail("generate: --draft-min %d is more than --draft-max %d", spec.draft_min,
                        spec.draft_max);
    if (threads) tlm_threads_set((int)threads);

    int rc = 1;
    tlm_model *m = NULL, *md = NULL;
    tlm_tokenizer *tok = NULL;
    tlm_session *sess = NULL, *dsess = NULL;
    tlm_grammar *grammar = NULL;
    tlm_grammar_vocab *gvocab = NULL;
    int32_t *ids = NULL;
    int n_ids = 0;
    stream st = {0};
    double t_load = cli_now();
    unsigned lf;
    if (!cli_load_flags("generate", map_mode == CLI_MAP_READ, precision, &lf)) return 1;
    if (tlm_model_load(model_path, lf, &m)) {
        rc = cli_fail_status("generate");
        goto done;
    }
    const tlm_config *c = tlm_model_config(m);
    if (draft_path) {
        if (tlm_model_load(draft_path, lf, &md)) {
            rc = cli_fail("generate: draft model %s: %s", draft_path, tlm_last_error());
            goto done;
        }
        if (tlm_model_config(md)->vocab_size != c->vocab_size) {
            rc = cli_fail("generate: the draft model %s has %d ids in its vocabulary, the model "
                          "%d: they must share one",
                          draft_path, tlm_model_config(md)->vocab_size, c->vocab_size);
            goto done;
        }
    }
    t_load = cli_now() - t_load;
    if (tok_path ? tlm_tokenizer_load(tok_path, &tok) : cli_model_tokenizer(model_path, &tok)) {
        rc = cli_fail_status("generate: tokenizer");
        goto done;
    }
    if (tok && tlm_tokenizer_vocab_size(tok) > c->vocab_size) {
        rc = cli_fail("generate: the tokenizer has %d ids but the model only %d",
                      (int)tlm_tokenizer_vocab_size(tok), c->vocab_size);
        goto done;
    }
    if (grammar_path || schema_path) {
        /* read before the model's weights are used, so that a bad file fails fast */
        const char *path = grammar_path ? grammar_path : schema_path;
        char *text = NULL;
        size_t len = 0;
        tlm_status gst = core_read_file(path, &text, &len);
        if (!gst)
            gst = grammar_path ? tlm_grammar_parse(text, len, &grammar)
                               : tlm_grammar_from_json_schema(text, len, &grammar);
        free(text);
        if (gst) {
            rc = cli_fail("generate: %s: %s", path, tlm_last_error());
            goto done;
        }
        if (!tok) {
            rc = cli_fail("generate: %s needs a tokenizer (-z)",
                          grammar_path ? "--grammar" : "--json-schema");
            goto done;
        }
        if (tlm_grammar_vocab_new(tok, c->vocab_size, &gvocab)) {
            rc = cli_fail_status("generate");
            goto done;
        }
    }
    if (!tok && !print_ids) {
        if (!ids_arg) {
            rc = cli_fail("generate: no tokenizer for '%s': give -z TOKENIZER, or --ids with "
                          "--print-ids",
                          model_path);
            goto done;
        }
        fprintf(stderr, "tlm: generate: no tokenizer, printing ids\n");
        print_ids = 1;
    }
    if (ids_arg) {
        if (!parse_ids(ids_arg, &ids, &n_ids)) {
            rc = cli_fail("generate: --ids wants integers separated by spaces or commas");
            goto done;
        }
    } else if (prompt && *prompt) {
        unsigned flags = 0;
        if (tlm_tokenizer_add_bos(tok)) flags |= TLM_ENCODE_ADD_BOS;
        size_t n = 0;
        if (tlm_tokenizer_encode(tok, prompt, strlen(prompt), flags, &ids, &n)) {
            rc = cli_fail_status("generate: prompt");
            goto done;
        }
        n_ids = (int)n;
    }
    if (n_ids == 0) {
        int32_t bos = tok ? tlm_tokenizer_bos(tok) : -1;
        if (bos < 0) {
            rc = cli_fail("generate: the vocabulary has no BOS to start from: give a prompt (-p "
                          "or --ids)");
            goto done;
        }
        free(ids);
        ids = malloc(sizeof *ids);
        if (!ids) {
            rc = cli_fail("generate: out of memory");
            goto done;
        }
        ids[0] = bos;
        n_ids = 1;
    }
    for (int i = 0; i < n_ids; i++)
        if (ids[i] >= c->vocab_size) {
            rc = cli_fail("generate: prompt id %d is outside the vocabulary (%d)", (int)ids[i],
                          c->vocab_size);
            goto done;
        }
    if (n_ids > c->context_length) {
        rc = cli_fail("generate: the prompt has %d tokens, more than context_length %d", n_ids,
                      c->context_length);
        goto done;
    }
    tlm_session_opts so = {.batch = 1};
    cli_cache_opts(&cache, &so);
    if (tlm_session_new(m, &so, &sess)) {
        rc = cli_fail_status("generate");
        goto done;
    }
    if (md && tlm_session_new(md, NULL, &dsess)) {
        rc = cli_fail_status("generate: draft model");
        goto done;
    }
    if (lora.n && cli_lora_load("generate", &lora, m)) goto done;
    if (lora.n &&
        tlm_session_set_loras(sess, (const tlm_lora *const *)lora.lora, lora.scale, lora.n)) {
        rc = cli_fail_status("generate");
        goto done;
    }

    /* The prompt goes out first: as given for -p (exact bytes), else decoded. The decoder sees the
     * prompt ids either way so that the first generated piece is decoded in context. */
    if (!print_ids) {
        if (tlm_decoder_new(tok, TLM_DECODE_SKIP_SPECIAL, &st.dec)) {
            rc = cli_fail_status("generate");
            goto done;
        }
        for (int i = 0; i < n_ids; i++) {
            const char *b;
            size_t n;
            if (tlm_decoder_push(st.dec, ids[i], &b, &n)) {
                rc = cli_fail_status("generate: prompt");
                goto done;
            }
            if (!prompt) fwrite(b, 1, n, stdout);
        }
        if (prompt) fputs(prompt, stdout);
    } else {
        for (int i = 0; i < n_ids; i++) put_id(&st, ids[i]);
    }
    fflush(stdout);

    st.tok = tok;
    tlm_generate_opts go = {.max_new_tokens = (int)n_new, .on_token = on_token, .user = &st};
    go.eos_id = tok ? tlm_tokenizer_eos(tok) : -1;
    go.grammar = grammar;
    go.grammar_vocab = gvocab;
    go.sampling = (tlm_sampler_opts){.temperature = (float)temp,
                                     .top_k = (int)top_k,
                                     .top_p = (float)top_p,
                                     .seed = (uint64_t)seed,
                                     .min_p = (float)min_p,
                                     .repeat_penalty = (float)rep_pen,
                                     .presence_penalty = (float)pres_pen,
                                     .frequency_penalty = (float)freq_pen,
                                     .penalty_last_n = (int)last_n};
    tlm_stop_reason why = TLM_STOP_NONE;
    tlm_generate_stats gs;
    const int32_t *prompts[1] = {ids};
    spec.lookup = lookup;
    tlm_status s = draft_path || lookup
                       ? tlm_session_generate_spec(sess, dsess, ids, n_ids, &go, &spec, &why, &gs)
                       : tlm_session_generate(sess, prompts, &n_ids, 1, &go, &why, &gs);
    if (st.dec) {
        const char *b;
        size_t n;
        tlm_decoder_flush(st.dec, &b, &n);
        fwrite(b, 1, n, stdout);
    }
    if (print_ids) putchar('\n');
    fflush(stdout);
    if (s || st.failed) {
        rc = cli_fail_status("generate");
        goto done;
    }
    /* Text ends without a newline (stdout is exactly prompt + continuation); on a terminal the
     * timings would otherwise start mid-line. */
    const char *nl = !print_ids && isatty(STDOUT_FILENO) ? "\n" : "";
    if (why == TLM_STOP_CONTEXT) {
        fprintf(stderr, "%stlm: generate: reached context_length %d; stopping (no context shift)\n",
                nl, c->context_length);
        nl = "";
    }
    size_t mapped, owned;
    tlm_model_memory(m, &mapped, &owned);
    fprintf(stderr, "%smodel: loaded in %.3f s (%.1f MiB of weights %s, %.1f MiB in memory)\n", nl,
            t_load, mapped / 1048576.0,
            lf & TLM_LOAD_READ ? "read into 2 MiB pages" : "used in place", owned / 1048576.0);
    /* The rate counts the ids after the first (each plain step makes one), so that it compares
     * with plain decoding's where a pass makes several. */
    int after_first = draft_path || lookup ? gs.new_tokens - 1 : gs.decode_steps;
    fprintf(stderr,
            "prompt: %d tokens in %.3f s (%.1f tok/s); generation: %d tokens, %d decode steps "
            "in %.3f s (%.1f tok/s)\n",
            gs.prompt_tokens, gs.prefill_seconds,
            gs.prefill_seconds > 0 ? gs.prompt_tokens / gs.prefill_seconds : 0.0, gs.new_tokens,
            gs.decode_steps, gs.decode_seconds,
            gs.decode_seconds > 0 && after_first > 0 ? after_first / gs.decode_seconds : 0.0);
    if (draft_path || lookup)
        fprintf(stderr,
                "speculative (%s): %d ids proposed, %d accepted (%.1f%%); %.2f ids per decode "
                "step\n",
                draft_path ? "draft model" : "lookup", gs.drafted, gs.accepted,
                gs.drafted ? 100.0 * gs.accepted / gs.drafted : 0.0,
                gs.decode_steps ? (double)(gs.new_tokens - 1) / gs.decode_steps : 0.0);
    rc = 0;
done:
    tlm_decoder_free(st.dec);
    tlm_session_free(sess);
    tlm_session_free(dsess);
    tlm_grammar_vocab_free(gvocab);
    tlm_grammar_free(grammar);
    cli_lora_free(&lora);
    tlm_tokenizer_free(tok);
    tlm_model_free(m);
    tlm_model_free(md);
    free(ids);
    return rc;
}
