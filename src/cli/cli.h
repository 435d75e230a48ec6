/* The tlm command line: one function per subcommand, each thin over the library. */
#ifndef TLM_CLI_H
#define TLM_CLI_H

#include <stdio.h>

#include "tlm.h"

/* Each returns the process exit status. argv[0] is the subcommand name. */
int cmd_info(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_finetune(int argc, char **argv);
int cmd_export_lora(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_imatrix(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_tokenizer(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_bench(int argc, char **argv);

/* Prints "tlm: <msg>" on stderr and returns 1. */
int cli_fail(const char *fmt, ...);
/* Prints "tlm: <what>: <tlm_last_error()>" and returns 1. */
int cli_fail_status(const char *what);
/* True when argv[i] is name; fetches the value that follows into *val (error if missing). */
int cli_flag_value(int argc, char **argv, int *i, const char *name, const char *alt,
                   const char **val);
/* Strict number parsing: whole string must be a number; returns 0 on error. */
int cli_parse_int(const char *s, long *out);
int cli_parse_float(const char *s, double *out);
/* "a,b,c": integers in [lo, hi] into out (at most cap); the count, 0 on a malformed list. */
int cli_parse_int_list(const char *s, long lo, long hi, long *out, int cap);
/* The tokenizer that travels with a model (a tlm checkpoint's DIR/tokenizer, a GGUF or Hugging
 * Face vocabulary); *out is NULL when there is none. */
tlm_status cli_model_tokenizer(const char *model, tlm_tokenizer **out);
/* The chat template family a GGUF's tokenizer.chat_template names: 1 and *t when recognised; 0
 * otherwise, *present saying whether the file has one (tlm serve and finetune then use chatml). */
int cli_gguf_template(const char *model, tlm_chat_template *t, int *present);
/* The GGUF file's <architecture>.pooling_type (llama.cpp's numbers: 0 none, 1 mean, 2 cls, 3 last,
 * 4 rank), -1 when absent or not a GGUF file. */
int cli_gguf_pooling(const char *model);
/* Text files into token shards DIR/shard_NNNNNN.bin of per_shard tokens (tlm token files), on
 * every thread, reading a chunk of chunk_bytes per thread at a time (src/cli/tok_shards.c). */
int cli_tokenize_shards(const tlm_tokenizer *tok, const char *dir, long per_shard,
                        size_t chunk_bytes, char *const *files, int n_files, unsigned flags);
/* Load flags for reading the file into memory (read: TLM_LOAD_READ, else mapped) and --precision
 * auto|fp32|bf16 (NULL: auto); 0 and a message on stderr for another precision name. */
int cli_load_flags(const char *cmd, int read, const char *precision, unsigned *flags);
/* --mmap / --no-mmap, or neither (CLI_MAP_AUTO: the command's default). */
enum { CLI_MAP_AUTO, CLI_MAP_FILE, CLI_MAP_READ };
/* 1 and *mode set when arg is --mmap or --no-mmap, else 0. */
int cli_map_flag(const char *arg, int *mode);
/* Whether to read the model at path into memory: as --mmap / --no-mmap say, else (auto) when the
 * file takes at most half the memory available now. Long-running commands (serve, bench) read by
 * default: their decoding runs on huge pages (TLM_LOAD_READ); generate and eval map. */
int cli_read_mode(const char *path, int mode);
/* generate's and eval's; serve and bench read by default and say so themselves */
#define CLI_MMAP_HELP                                                                              \
    "  --mmap, --no-mmap     map the file (the default: loads at once, pages shared with\n"        \
    "                        other processes) or read it into memory on 2 MiB pages (loads\n"      \
    "                        in about 0.3 s per GiB; memory-bound decoding 10-25% faster)\n"
#define CLI_PRECISION_HELP                                                                         \
    "  --precision P         auto (default): products in the weights' own type (BF16 weights\n"    \
    "                        meet activations rounded to BF16, as llama.cpp computes them);\n"     \
    "                        bf16: F32/F16 matrices rounded to BF16 at load (half the memory\n"    \
    "                        of F32, faster decode, prompts on vdpbf16ps); fp32: BF16 matrices\n"  \
    "                        widened to F32 at load (exact fp32 products)\n"
#define CLI_CACHE_TYPE_HELP                                                                        \
    "  --cache-type T        the KV cache's type for keys and values: f16 (default, as\n"          \
    "                        llama.cpp's), q8_0, q5_1, q5_0, iq4_nl, q4_1, q4_0, bf16 or f32.\n"   \
    "                        f16: half the memory and attention traffic of f32; q8_0 about\n"      \
    "                        half of f16's, q4_0 about a quarter; the block types need a head\n"   \
    "                        size that is a multiple of 32\n"                                      \
    "  -ctk, --cache-type-k T\n"                                                                   \
    "  -ctv, --cache-type-v T  the keys' and the values' types apart, as llama.cpp's flags\n"
/* A llama.cpp KV cache type's name (f16, q8_0, ..., any case) into *t; else prints an error naming
 * cmd and returns 0. */
int cli_cache_type(const char *cmd, const char *v, tlm_dtype *t);
/* The name cli_cache_type reads for t. */
const char *cli_cache_type_name(tlm_dtype t);
/* The cache types given so far: keys' and values' (both F16 at first). */
typedef struct {
    tlm_dtype k, v;
} cli_cache;
#define CLI_CACHE_DEFAULT                                                                          \
    { TLM_DTYPE_F16, TLM_DTYPE_F16 }
/* --cache-type T (keys and values), -ctk/--cache-type-k T, -ctv/--cache-type-v T at argv[*i]:
 * 1 when it was one of them (its value consumed), 0 when not, -1 on a bad value (printed). */
int cli_cache_flag(const char *cmd, int argc, char **argv, int *i, cli_cache *c);
/* The types given into a session's options (keys' kv_type, values' v_type where they differ). */
void cli_cache_opts(const cli_cache *c, tlm_session_opts *o);
/* LoRA adapters asked for with --lora FILE[:SCALE] (repeatable) and --lora-scaled FILE SCALE, as
 * llama.cpp's flags; loaded over a model with cli_lora_load. */
#define CLI_LORA_MAX 32
typedef struct {
    int n;
    const char *path[CLI_LORA_MAX];
    char *owned[CLI_LORA_MAX]; /* paths cut from FILE:SCALE */
    float scale[CLI_LORA_MAX];
    tlm_lora *lora[CLI_LORA_MAX];
} cli_lora;
#define CLI_LORA_HELP                                                                              \
    "  --lora FILE[:SCALE]   apply a LoRA adapter (repeatable), unmerged: a GGUF adapter "         \
    "(tlm's,\n"                                                                                    \
    "                        llama.cpp's) or a PEFT directory; SCALE multiplies it (default 1)\n"  \
    "  --lora-scaled FILE S  the same with scale S, as llama.cpp's flag\n"
/* --lora / --lora-scaled at argv[*i]: 1 when one was (consumed), 0 when not, -1 on a bad value. */
int cli_lora_flag(const char *cmd, int argc, char **argv, int *i, cli_lora *l);
/* Loads every adapter for m; prints the failure naming cmd and returns 1. */
int cli_lora_load(const char *cmd, cli_lora *l, const tlm_model *m);
void cli_lora_free(cli_lora *l);
/* Monotonic seconds. */
double cli_now(void);
/* True if argv contains -h or --help. */
int cli_wants_help(int argc, char **argv);

#endif
