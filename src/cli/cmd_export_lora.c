/* tlm export-lora: a base model with LoRA adapters merged in, written as a GGUF, as llama.cpp's
 * llama-export-lora makes it. */
#include <stdlib.h>
#include <string.h>

#include "cli.h"

// clang-format off
static const char *export_help =
    "usage: tlm export-lora -m BASE --lora FILE[:SCALE] [--lora ...] -o OUT.gguf [--type T]\n"
    "                       [-z TOKENIZER] [-t THREADS]\n\n"
    "Merges LoRA adapters into a model: each adapted matrix becomes W + SCALE * s * B A, computed\n"
    "in F32 (a quantized base is widened first), and the model is written as a GGUF.\n\n"
    "  -m, --model BASE      the model the adapters were made for (any format tlm loads)\n"
    CLI_LORA_HELP
    "  -o, --output FILE     the merged model (GGUF)\n"
    "  --type T              f32, f16, bf16, or a quantization (q8_0, q4_k_m, ... as tlm\n"
    "                        quantize); default: the base's type when it is f32, f16 or bf16,\n"
    "                        else f16 (as llama-export-lora)\n"
    "  -z, --tokenizer PATH  vocabulary to write (default: the base's own)\n"
    "  -t, --threads N       threads (default: all cores)\n";
// clang-format on

/* The type of the base's matrices when all are one plain type, else F16. */
static tlm_dtype default_type(const char *base) {
    tlm_file_tensor *ft = NULL;
    int n = 0;
    tlm_dtype t = TLM_DTYPE_F16;
    if (tlm_model_file_tensors(base, &ft, &n)) return t;
    const char *first = NULL;
    int same = 1;
    for (int i = 0; i < n; i++) {
        if (!strstr(ft[i].name, ".weight") || strstr(ft[i].name, "norm")) continue;
        if (!first) first = ft[i].dtype;
        same &= !strcmp(first, ft[i].dtype);
    }
    if (first && same && !strcmp(first, "F32")) t = TLM_DTYPE_F32;
    if (first && same && !strcmp(first, "BF16")) t = TLM_DTYPE_BF16;
    free(ft);
    return t;
}

static int export_main(int argc, char **argv, cli_lora *lora) {
    const char *base = NULL, *out = NULL, *type = NULL, *tok_path = NULL;
    long threads = 0;
    int ck;
    for (int i = 1; i < argc; i++) {
        const char *v, *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(export_help, stdout);
            return 0;
        }
        if ((ck = cli_lora_flag("export-lora", argc, argv, &i, lora)) != 0) {
            if (ck < 0) return 1;
            continue;
        }
        const char **dst = NULL;
        if (cli_flag_value(argc, argv, &i, "-m", "--model", &v))
            dst = &base;
        else if (cli_flag_value(argc, argv, &i, "-o", "--output", &v))
            dst = &out;
        else if (cli_flag_value(argc, argv, &i, "--type", NULL, &v))
            dst = &type;
        else if (cli_flag_value(argc, argv, &i, "-z", "--tokenizer", &v))
            dst = &tok_path;
        else if (cli_flag_value(argc, argv, &i, "-t", "--threads", &v)) {
            if (!v || !cli_parse_int(v, &threads) || threads < 1 || threads > 4096)
                return cli_fail("export-lora: -t wants a thread count >= 1, got '%s'", v ? v : "");
            continue;
        } else
            return cli_fail("export-lora: unknown option '%s' (see tlm export-lora --help)", a);
        if (!v) return cli_fail("export-lora: %s needs a value", a);
        *dst = v;
    }
    if (!base) return cli_fail("export-lora: -m BASE is required");
    if (!out) return cli_fail("export-lora: -o OUT.gguf is required");
    if (!lora->n) return cli_fail("export-lora: give at least one --lora FILE");
    tlm_ftype ftype = TLM_FTYPE_F32;
    tlm_dtype dt = TLM_DTYPE_F32;
    int quant = 0;
    if (type) {
        if (tlm_ftype_parse(type, &ftype))
            return cli_fail("export-lora: unknown --type '%s' (f32, f16, bf16, q8_0, q4_k_m, ...)",
                            type);
        if (ftype == TLM_FTYPE_F16)
            dt = TLM_DTYPE_F16;
        else if (ftype == TLM_FTYPE_BF16)
            dt = TLM_DTYPE_BF16;
        else
            quant = ftype != TLM_FTYPE_F32;
    } else {
        dt = default_type(base);
    }
    if (threads) tlm_threads_set((int)threads);
    tlm_model *m = NULL, *merged = NULL;
    tlm_tokenizer *tok = NULL;
    if (tlm_model_load(base, 0, &m)) return cli_fail_status("export-lora");
    int rc = 0;
    if (cli_lora_load("export-lora", lora, m))
        rc = 1;
    else if (tlm_lora_merge(m, (const tlm_lora *const *)lora->lora, lora->scale, lora->n, &merged))
        rc = cli_fail_status("export-lora");
    else if (tok_path ? tlm_tokenizer_load(tok_path, &tok) : cli_model_tokenizer(base, &tok))
        rc = cli_fail_status("export-lora: tokenizer");
    if (!rc) {
        if (!tok)
            fprintf(stderr, "tlm: warning: no tokenizer (give -z): %s will have no vocabulary\n",
                    out);
        tlm_status s;
        if (quant) {
            tlm_quantize_opts qo;
            tlm_quantize_opts_defaults(&qo);
            qo.ftype = ftype;
            s = tlm_model_quantize_gguf(merged, tok, out, &qo);
        } else {
            s = tlm_model_save_gguf(merged, tok, out, dt);
        }
        if (s)
            rc = cli_fail_status("export-lora");
        else
            fprintf(stderr, "wrote %s: %s with %d adapter%s merged (%s)\n", out, base, lora->n,
                    lora->n > 1 ? "s" : "", quant ? tlm_ftype_name(ftype) : tlm_dtype_name(dt));
    }
    tlm_tokenizer_free(tok);
    tlm_model_free(merged);
    tlm_model_free(m);
    return rc;
}

int cmd_export_lora(int argc, char **argv) {
    cli_lora lora = {0};
    int rc = export_main(argc, argv, &lora);
    cli_lora_free(&lora);
    return rc;
}
