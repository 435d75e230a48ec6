/* tlm convert: any model we can read into any format we can write. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "cli.h"
#include "core/core.h"
#include "core/dtype.h"

static const char *convert_help =
    "usage: tlm convert IN OUT --to gguf|safetensors|hf|llama2c [--dtype f32|f16|bf16]\n"
    "                   [--type TYPE [--imatrix FILE]] [-z TOKENIZER] [--llama2c-version 0|1]\n\n"
    "Reads IN (tlm checkpoint, llama2.c .bin, .gguf, Hugging Face directory) and writes OUT:\n"
    "  gguf         GGUF v3, arch llama, with the vocabulary (llama.cpp loads it)\n"
    "  safetensors  a tlm checkpoint: OUT.safetensors, or a directory OUT with\n"
    "               model.safetensors and the tokenizer\n"
    "  hf           a Hugging Face directory (LlamaForCausalLM or GPT2LMHeadModel)\n"
    "  llama2c      llama2.c .bin (legacy by default: what run.c reads)\n\n"
    "  --dtype T           element type of matrices (gguf, hf): f32 (default), f16, bf16\n"
    "  --type TYPE         GGUF as llama-quantize writes it (implies --to gguf; see\n"
    "                      tlm quantize --help for the types)\n"
    "  -z, --tokenizer P   tokenizer to embed (default: the one IN carries, if any)\n";

static const char *quantize_help =
    "usage: tlm quantize IN OUT --type TYPE [--imatrix FILE] [-z TOKENIZER] [--pure]\n"
    "                    [--leave-output-tensor] [--output-tensor-type T]\n"
    "                    [--token-embedding-type T] [--tensor-type PATTERN=T ...] [--dry-run]\n"
    "                    [--include-weights NAME ... | --exclude-weights NAME ...]\n"
    "                    [--prune-layers L0,L1,...] [--override-kv KEY=TYPE:VALUE ...]\n\n"
    "Writes any model tlm reads (tlm checkpoint, llama2.c .bin, .gguf, Hugging Face directory) as\n"
    "a GGUF file of TYPE, the bytes llama.cpp's llama-quantize writes from the same F32 weights\n"
    "(with the same importance matrix, if any): the same type per tensor, the same quantized\n"
    "blocks.\n\n"
    "  --type TYPE  q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k_s, q3_k_m, q3_k_l, q4_k_s,\n"
    "               q4_k_m, q5_k_s, q5_k_m, q6_k, iq4_nl, iq4_xs, f16, bf16, f32. The mixes\n"
    "               give some layers' attn_v and ffn_down more bits (q4_k_m, q5_k_m: Q6_K;\n"
    "               q3_k_m, q3_k_l: Q4_K/Q5_K, and attn_output too; q2_k: Q3_K, attn_output\n"
    "               too; iq4_*: Q5_K for the first eighth's ffn_down, and attn_v from four\n"
    "               query heads per kv head); output.weight (or a tied token_embd) is Q6_K\n"
    "               except for q8_0; 1-D tensors stay F32; matrices whose rows are not whole\n"
    "               256-blocks fall back (IQ4_XS to IQ4_NL, Q2_K and Q3_K to Q4_0, Q4_K to\n"
    "               Q5_0, Q5_K to Q5_1, Q6_K to Q8_0).\n"
    "  --imatrix FILE  an importance matrix (tlm imatrix, or llama.cpp's llama-imatrix: GGUF or\n"
    "               the legacy .dat): each matrix's rounding error is weighed by how strongly\n"
    "               the calibration text drove its input columns, as llama-quantize --imatrix\n"
    "               does (every type but q8_0, f16, bf16, f32 uses it; q4_0 and q5_0 give the\n"
    "               first eighth's ffn_down Q4_1 / Q5_1 with one, iq4_* keep it IQ4)\n"
    "  --pure         every matrix TYPE, no mix (rows that are not whole blocks still fall back)\n"
    "  --leave-output-tensor     output.weight stays F32\n"
    "  --output-tensor-type T    output.weight's type (a tied token_embd too); T a block type\n"
    "                 (q8_0, q4_k, q6_k, iq4_nl, ...), f16, bf16 or f32\n"
    "  --token-embedding-type T  token_embd.weight's type\n"
    "  --tensor-type PATTERN=T   matrices whose name matches PATTERN (a regular expression, e.g.\n"
    "                 attn_v or 'blk\\.[0-3]\\.ffn_down') get type T instead of the mix's;\n"
    "                 repeatable, the first match wins (--tensor-type-file F: one per word)\n"
    "  -z, --tokenizer P   tokenizer to embed (default: the one IN carries, if any)\n"
    "  --dry-run      list every tensor's type and size and the file's total; write nothing\n"
    "  --include-weights NAME  use the --imatrix only for matrices whose names contain NAME\n"
    "               (repeatable); --exclude-weights NAME: not for those\n"
    "  --prune-layers L0,L1,...  leave these blocks out, the others renumbered from 0\n"
    "  --override-kv KEY=TYPE:VALUE  set metadata KEY (TYPE int, float, bool or str) in the\n"
    "               file, e.g. general.name=str:my-model (repeatable)\n"
    "These are llama-quantize's options of the same names, with its results.\n";

/* A ggml type name (q8_0, Q4_K, f16, ...) for the per-tensor overrides, any case: F32, F16, BF16
 * or a block type. */
static int parse_type(const char *name, tlm_dtype *out) {
    for (int t = 0; t < TLM_DTYPE_COUNT; t++)
        if (!strcasecmp(name, tlm_dtype_name((tlm_dtype)t))) {
            const core_dtype_info *d = core_dtype_get((tlm_dtype)t);
            if (!d->is_float || t == TLM_DTYPE_F64) return 0;
            *out = (tlm_dtype)t;
            return 1;
        }
    return 0;
}

/* --output-tensor-type / --token-embedding-type's value into *t (and *set); 1 after a refusal. */
static int type_flag(const char *flag, const char *v, tlm_dtype *t, int *set) {
    if (!v || !parse_type(v, t))
        return cli_fail("quantize: %s wants a type (a block type such as q8_0 or q6_k, f16, bf16 "
                        "or f32), got '%s'",
                        flag, v ? v : "nothing");
    *set = 1;
    return 0;
}

#define MAX_TENSOR_TYPES 64
#define MAX_KV_OVERRIDES 64
#define MAX_WEIGHT_NAMES 64
#define MAX_PRUNE 1024

/* One --tensor-type PATTERN=TYPE, as llama-quantize reads it (the pattern lower-cased). */
static int add_tensor_type(const char *arg, tlm_tensor_type *tt, char pats[][128], int *n) {
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg || !eq[1])
        return cli_fail("quantize: --tensor-type wants PATTERN=TYPE, got '%s'", arg);
    if (*n == MAX_TENSOR_TYPES)
        return cli_fail("quantize: more than %d --tensor-type patterns", MAX_TENSOR_TYPES);
    if (eq - arg >= 128) return cli_fail("quantize: --tensor-type pattern over 127 bytes");
    tlm_dtype t;
    if (!parse_type(eq + 1, &t))
        return cli_fail("quantize: --tensor-type %s: unknown type '%s' (a block type such as q4_k "
                        "or q8_0, f16, bf16 or f32)",
                        arg, eq + 1);
    char *p = pats[*n];
    for (size_t i = 0; i < (size_t)(eq - arg); i++)
        p[i] = (char)(arg[i] >= 'A' && arg[i] <= 'Z' ? arg[i] - 'A' + 'a' : arg[i]);
    p[eq - arg] = 0;
    tt[*n] = (tlm_tensor_type){p, t};
    ++*n;
    return 0;
}

static int ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && !strcmp(s + n - m, suf);
}

/* One line per tensor on stderr while a quantized file is written; the bytes summed in *user. */
static void quantize_progress(void *user, int i, int n, const char *name, tlm_dtype type,
                              size_t bytes) {
    *(size_t *)user += bytes;
    fprintf(stderr, "[%4d/%4d] %-32s %-5s %10.3f MiB\n", i + 1, n, name, tlm_dtype_name(type),
            (double)bytes / (1024.0 * 1024.0));
}

/* convert and quantize share everything: quantize is convert --to gguf --type. */
static int convert(int argc, char **argv, int quantize) {
    const char *in = NULL, *out = NULL, *to = quantize ? "gguf" : NULL, *dtype = "f32",
               *tokp = NULL, *qtype = NULL, *imp = NULL;
    const char *cmd = quantize ? "quantize" : "convert";
    long l2c_version = 0;
    tlm_tensor_type tts[MAX_TENSOR_TYPES];
    char pats[MAX_TENSOR_TYPES][128];
    int ntt = 0, pure = 0, leave_output = 0, out_set = 0, embd_set = 0, dry = 0;
    tlm_dtype out_type = TLM_DTYPE_F32, embd_type = TLM_DTYPE_F32;
    tlm_kv_override kvs[MAX_KV_OVERRIDES];
    const char *incl[MAX_WEIGHT_NAMES], *excl[MAX_WEIGHT_NAMES];
    int nkv = 0, nincl = 0, nexcl = 0, prune[MAX_PRUNE], nprune = 0;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(quantize ? quantize_help : convert_help, stdout);
            return 0;
        } else if (cli_flag_value(argc, argv, &i, "--type", NULL, &v)) {
            if (!v) return cli_fail("%s: --type needs a value", cmd);
            qtype = v;
        } else if (quantize && !strcmp(argv[i], "--pure")) {
            pure = 1;
        } else if (quantize && !strcmp(argv[i], "--dry-run")) {
            dry = 1;
        } else if (quantize && !strcmp(argv[i], "--leave-output-tensor")) {
            leave_output = 1;
        } else if (quantize && cli_flag_value(argc, argv, &i, "--output-tensor-type", NULL, &v)) {
            if (type_flag("--output-tensor-type", v, &out_type, &out_set)) return 1;
        } else if (quantize && cli_flag_value(argc, argv, &i, "--token-embedding-type", NULL, &v)) {
            if (type_flag("--token-embedding-type", v, &embd_type, &embd_set)) return 1;
        } else if (quantize && cli_flag_value(argc, argv, &i, "--tensor-type", NULL, &v)) {
            if (!v) return cli_fail("quantize: --tensor-type wants PATTERN=TYPE");
            if (add_tensor_type(v, tts, pats, &ntt)) return 1;
        } else if (quantize && cli_flag_value(argc, argv, &i, "--tensor-type-file", NULL, &v)) {
            char *txt = NULL;
            size_t tl = 0;
            if (!v) return cli_fail("quantize: --tensor-type-file wants a file");
            if (core_read_file(v, &txt, &tl))
                return cli_fail_status("quantize: --tensor-type-file");
            int bad = 0;
            for (char *w = strtok(txt, " \t\r\n"); w && !bad; w = strtok(NULL, " \t\r\n"))
                bad = add_tensor_type(w, tts, pats, &ntt);
            free(txt);
            if (bad) return 1;
        } else if (quantize && cli_flag_value(argc, argv, &i, "--override-kv", NULL, &v)) {
            if (!v) return cli_fail("quantize: --override-kv wants KEY=TYPE:VALUE");
            if (nkv == MAX_KV_OVERRIDES)
                return cli_fail("quantize: more than %d --override-kv", MAX_KV_OVERRIDES);
            if (tlm_kv_override_parse(v, &kvs[nkv++])) return cli_fail_status("quantize");
        } else if (quantize && cli_flag_value(argc, argv, &i, "--prune-layers", NULL, &v)) {
            if (!v) return cli_fail("quantize: --prune-layers wants layer numbers L0,L1,...");
            long ls[MAX_PRUNE];
            nprune = cli_parse_int_list(v, 0, INT_MAX, ls, MAX_PRUNE);
            if (!nprune)
                return cli_fail("quantize: --prune-layers wants layer numbers L0,L1,... (at most "
                                "%d), got '%s'",
                                MAX_PRUNE, v);
            for (int k = 0; k < nprune; k++) prune[k] = (int)ls[k];
        } else if (quantize && (!strcmp(argv[i], "--include-weights") ||
                                !strcmp(argv[i], "--exclude-weights"))) {
            const char *flag = argv[i];
            int inc = flag[2] == 'i';
            cli_flag_value(argc, argv, &i, flag, NULL, &v);
            if (!v) return cli_fail("quantize: %s wants a tensor name", flag);
            if ((inc ? nincl : nexcl) == MAX_WEIGHT_NAMES)
                return cli_fail("quantize: more than %d weight names", MAX_WEIGHT_NAMES);
            if (inc)
                incl[nincl++] = v;
            else
                excl[nexcl++] = v;
        } else if (cli_flag_value(argc, argv, &i, "--imatrix", NULL, &v)) {
            if (!v) return cli_fail("%s: --imatrix needs a file", cmd);
            imp = v;
        } else if (!quantize && cli_flag_value(argc, argv, &i, "--to", NULL, &v)) {
            if (!v) return cli_fail("convert: --to needs a value");
            to = v;
        } else if (!quantize && cli_flag_value(argc, argv, &i, "--dtype", NULL, &v)) {
            if (!v) return cli_fail("convert: --dtype needs a value");
            dtype = v;
        } else if (cli_flag_value(argc, argv, &i, "-z", "--tokenizer", &v)) {
            if (!v) return cli_fail("%s: %s needs a value", cmd, argv[i]);
            tokp = v;
        } else if (!quantize && cli_flag_value(argc, argv, &i, "--llama2c-version", NULL, &v)) {
            if (!v || !cli_parse_int(v, &l2c_version) || l2c_version < 0 || l2c_version > 1)
                return cli_fail("convert: --llama2c-version must be 0 or 1");
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return cli_fail("%s: unknown option '%s' (see tlm %s --help)", cmd, argv[i], cmd);
        } else if (!in) {
            in = argv[i];
        } else if (!out) {
            out = argv[i];
        } else {
            return cli_fail("%s: unexpected argument '%s'", cmd, argv[i]);
        }
    }
    if (qtype && !to) to = "gguf";
    if (quantize && (!in || !out || !qtype))
        return cli_fail("quantize: usage: tlm quantize IN OUT --type TYPE");
    if (!in || !out || !to) return cli_fail("convert: usage: tlm convert IN OUT --to FORMAT");
    if (imp && !qtype) return cli_fail("%s: --imatrix goes with --type", cmd);
    if ((nincl || nexcl) && !imp)
        return cli_fail("quantize: --include-weights and --exclude-weights select the entries of "
                        "an --imatrix");
    if (nincl && nexcl)
        return cli_fail(
            "quantize: --include-weights and --exclude-weights cannot be used together");
    tlm_ftype ftype = TLM_FTYPE_F32;
    if (qtype) {
        if (tlm_ftype_parse(qtype, &ftype))
            return cli_fail("%s: unknown --type '%s' (q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, "
                            "q3_k_s, q3_k_m, q3_k_l, q4_k_s, q4_k_m, q5_k_s, q5_k_m, q6_k, "
                            "iq4_nl, iq4_xs, f16, bf16, f32)",
                            cmd, qtype);
        if (strcmp(to, "gguf")) return cli_fail("convert: --type writes GGUF (--to gguf)");
    }
    tlm_dtype dt;
    if (!strcmp(dtype, "f32"))
        dt = TLM_DTYPE_F32;
    else if (!strcmp(dtype, "f16"))
        dt = TLM_DTYPE_F16;
    else if (!strcmp(dtype, "bf16"))
        dt = TLM_DTYPE_BF16;
    else
        return cli_fail("convert: --dtype must be f32, f16 or bf16 (got '%s')", dtype);
    int fmt = !strcmp(to, "gguf")          ? 1
              : !strcmp(to, "safetensors") ? 2
              : !strcmp(to, "hf")          ? 3
              : !strcmp(to, "llama2c")     ? 4
                                           : 0;
    if (!fmt) return cli_fail("convert: --to must be gguf, safetensors, hf or llama2c");
    if ((fmt == 2 || fmt == 4) && dt != TLM_DTYPE_F32)
        return cli_fail("convert: --to %s stores f32 only", to);

    /* A GGUF is written from F32 views without touching them (q and k rows are permuted in a
     * copy): an F32 file is read where it lies rather than copied, since first touching the
     * copy's pages costs a large share of a quantization (bench/quant/quantize_speed.sh). */
    int all_f32 = 0;
    {
        tlm_file_tensor *ft = NULL;
        int nft = 0;
        if (fmt == 1 && !tlm_model_file_tensors(in, &ft, &nft)) {
            all_f32 = nft > 0;
            for (int i = 0; i < nft; i++) all_f32 &= !strcmp(ft[i].dtype, "F32");
            free(ft);
        }
    }
    if (qtype) {
        /* llama-quantize refuses to requantize (--allow-requantize); tlm widens and warns. */
        tlm_file_tensor *ft = NULL;
        int nft = 0;
        if (!tlm_model_file_tensors(in, &ft, &nft)) {
            for (int i = 0; i < nft; i++) {
                tlm_dtype d;
                if (core_dtype_from_name(ft[i].dtype, &d) && core_dtype_get(d)->block_elems > 1) {
                    fprintf(stderr,
                            "tlm: warning: %s holds %s blocks ('%s'): they are widened and "
                            "quantized again, which loses more than quantizing the original\n",
                            in, ft[i].dtype, ft[i].name);
                    break;
                }
            }
            free(ft);
        }
    }
    tlm_imatrix *im = NULL;
    if (imp) {
        if (tlm_imatrix_load(imp, &im)) return cli_fail("%s: --imatrix: %s", cmd, tlm_last_error());
        if (nexcl) tlm_imatrix_filter(im, excl, nexcl, 0);
        if (nincl) tlm_imatrix_filter(im, incl, nincl, 1);
        fprintf(stderr, "%s: %d importance matrix entries from %s computed on %d chunks\n", cmd,
                tlm_imatrix_entries(im), imp, tlm_imatrix_chunks(im));
    }
    tlm_model *m;
    /* Writers read F32 weights: a writable copy widens whatever the file holds. */
    if (tlm_model_load(in, all_f32 ? 0u : TLM_LOAD_WRITABLE, &m)) {
        tlm_imatrix_free(im);
        return cli_fail_status(cmd);
    }
    tlm_tokenizer *tok = NULL;
    if (tokp) {
        if (tlm_tokenizer_load(tokp, &tok)) {
            tlm_model_free(m);
            tlm_imatrix_free(im);
            return cli_fail("%s: tokenizer: %s", cmd, tlm_last_error());
        }
    } else if (tlm_tokenizer_load(in, &tok)) {
        /* A tlm checkpoint keeps it in DIR/tokenizer; llama2.c .bin and HF directories carry none
         * that we read: then the weights go alone. */
        size_t n = strlen(in) + 16;
        char *p = malloc(n);
        tok = NULL;
        if (p) {
            snprintf(p, n, "%s/tokenizer", in);
            struct stat st;
            if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode) || tlm_tokenizer_load(p, &tok))
                tok = NULL;
            free(p);
        }
    }
    tlm_status s = TLM_OK;
    size_t dry_total = 0;
    switch (fmt) {
    case 1:
        if (!tok)
            fprintf(stderr, "tlm: warning: no tokenizer (give -z): %s will have no vocabulary\n",
                    out);
        if (qtype) {
            tlm_quantize_opts qo = {ftype,      im,       quantize_progress,
                                    &dry_total, pure,     leave_output,
                                    out_set,    embd_set, out_type,
                                    embd_type,  tts,      ntt,
                                    dry,        kvs,      nkv,
                                    prune,      nprune};
            s = tlm_model_quantize_gguf(m, tok, out, &qo);
        } else {
            s = tlm_model_save_gguf(m, tok, out, dt);
        }
        break;
    case 2:
        if (ends_with(out, ".safetensors")) {
            s = tlm_model_save_safetensors(m, out);
        } else {
            if (mkdir(out, 0777) != 0 && errno != EEXIST) {
                tlm_tokenizer_free(tok);
                tlm_model_free(m);
                tlm_imatrix_free(im);
                return cli_fail("convert: cannot create '%s': %s", out, strerror(errno));
            }
            size_t n = strlen(out) + 32;
            char *p = malloc(n);
            snprintf(p, n, "%s/model.safetensors", out);
            s = tlm_model_save_safetensors(m, p);
            free(p);
            if (!s && tok) s = tlm_tokenizer_save(tok, out);
        }
        break;
    case 3:
        s = tlm_model_save_hf(m, out, dt);
        /* the tokenizer directory layout includes HF's tokenizer.json (+ vocab.json/merges.txt) */
        if (!s && tok) s = tlm_tokenizer_save(tok, out);
        break;
    case 4: s = tlm_model_save_llama2c(m, out, (int)l2c_version); break;
    }
    tlm_tokenizer_free(tok);
    tlm_model_free(m);
    tlm_imatrix_free(im);
    if (s) return cli_fail_status(cmd);
    if (qtype && dry)
        fprintf(stderr, "dry run: %s would hold %.2f MiB of tensors (%s); nothing written\n", out,
                (double)dry_total / 1048576.0, tlm_ftype_name(ftype));
    else if (qtype)
        fprintf(stderr, "wrote %s (gguf, %s)\n", out, tlm_ftype_name(ftype));
    else
        fprintf(stderr, "wrote %s (%s)\n", out, to);
    return 0;
}

int cmd_convert(int argc, char **argv) { return convert(argc, argv, 0); }
int cmd_quantize(int argc, char **argv) { return convert(argc, argv, 1); }
