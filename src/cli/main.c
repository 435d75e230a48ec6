#include <cblas.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "cli.h"

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *summary;
} command;

static const command commands[] = {
    {"info", cmd_info, "show a model's architecture and parameter counts"},
    {"train", cmd_train, "train a model on a text file (AdamW, checkpoints, --resume)"},
    {"finetune", cmd_finetune, "adapt a model to a text: LoRA, QLoRA on quantized bases, --full"},
    {"eval", cmd_eval, "loss, perplexity and bits per byte of a model on a text"},
    {"imatrix", cmd_imatrix, "an importance matrix for quantize --imatrix, as llama-imatrix"},
    {"generate", cmd_generate, "sample text from a model (KV cache, streaming)"},
    {"tokenize", cmd_tokenize, "text on stdin -> token ids on stdout"},
    {"tokenizer", cmd_tokenizer, "tokenizer tools: `tlm tokenizer train`"},
    {"bench", cmd_bench, "prompt and generation speed, measured as llama-bench does"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server (continuous batching, a chat page)"},
    {"convert", cmd_convert, "convert a model between formats (gguf, safetensors, hf, llama2c)"},
    {"export-lora", cmd_export_lora, "merge LoRA adapters into a model, as llama-export-lora"},
    {"quantize", cmd_quantize, "write a quantized GGUF (q8_0, q4_k_m, ...) as llama-quantize does"},
};

static void usage(FILE *f) {
    fprintf(f, "tlm %s: a decoder-only Transformer language model in C\n\n", TLM_VERSION);
    fprintf(f, "usage: tlm COMMAND [options]   (tlm COMMAND --help for its options)\n\n");
    fprintf(f, "commands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
}

/* libgomp's default is to spin for milliseconds at every barrier (300000 rounds of `pause`); when
 * another process shares the cores, spinning threads steal each other's time and throughput
 * collapses. Purely passive waits cost a futex sleep and wake-up at each of the dozens of parallel
 * regions of a decode step instead. The middle: spin about as long as the serial work between two
 * regions of a step takes (a norm, RoPE, attention, sampling: up to tens of microseconds), then
 * sleep, so a step's regions start without a wake-up while a waiting thread gives its core back
 * well within a scheduler slice. TLM_SPINCOUNT rounds of `pause` are tens of microseconds on
 * current cores. bench/quant/two_decoders.sh measures it against passive and active waits, alone
 * and with two processes sharing the cores. Returns 1 if it set the variable. */
#define TLM_SPINCOUNT "3000"
static int bounded_spin(void) {
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return 0;
    setenv("GOMP_SPINCOUNT", TLM_SPINCOUNT, 1);
    return 1;
}

/* OpenBLAS (Debian's 0.3.21) picks its kernels from the CPU model and falls back to its SSE3
 * kernels ("Prescott") on models it does not know: CPUs newer than it, and virtual CPUs that
 * report a generic model. fp32 training's products then run at a fraction of the CPU's speed.
 * Unless the user chose (OPENBLAS_CORETYPE), name the kernels of what the CPU runs instead.
 * Returns 1 if it set the variable. */
static int openblas_kernels(void) {
    if (getenv("OPENBLAS_CORETYPE")) return 0;
    const char *core = openblas_get_corename();
    if (!core || strcasecmp(core, "prescott") != 0) return 0;
    const char *isa = tlm_cpu_kernels();
    const char *want = strstr(isa, "avx512") ? "SkylakeX" : strstr(isa, "avx2") ? "Haswell" : NULL;
    if (!want) return 0;
    setenv("OPENBLAS_CORETYPE", want, 1);
    return 1;
}

/* libgomp and OpenBLAS read their settings when they load, before main: the program re-executes
 * itself once with what it set. If re-execution is impossible, it carries on with the defaults. */
static void settle_environment(char **argv) {
    int spin = bounded_spin(), blas = openblas_kernels();
    if (spin || blas) execv("/proc/self/exe", argv);
}

int main(int argc, char **argv) {
    settle_environment(argv);
    if (argc < 2) {
        usage(stderr);
        return 1;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-v")) {
        printf("tlm %s\n", TLM_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    return cli_fail("unknown command '%s' (see tlm --help)", argv[1]);
}
