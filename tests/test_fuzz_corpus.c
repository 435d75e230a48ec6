/* Replays every file of every fuzz/corpus/<target>/ directory through the entry point of that
 * libFuzzer target (fuzz/fuzz_entries.h), so make test and make asan run the seeds and every
 * committed crash reproducer (crash-*) under the sanitizers without a fuzzing toolchain. Seeds
 * must load (a seed a loader refuses no longer guides the fuzzer); reproducers only must not
 * crash, leak or trip a sanitizer. A corpus directory without an entry point here is a failure,
 * so a new target cannot go unreplayed. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "../fuzz/fuzz_entries.h"
#include "core/core.h"
#include "harness.h"

static const struct {
    const char *name;
    int (*run)(const uint8_t *data, size_t size);
} targets[] = {
    {"model_load", fuzz_model_load},
    {"tokenizer_load", fuzz_tokenizer_load},
    {"gguf", fuzz_gguf},
    {"safetensors", fuzz_safetensors},
    {"llama2c", fuzz_llama2c},
    {"tokenizer_bin", fuzz_tokenizer_bin},
    {"gpt2_bpe", fuzz_gpt2_bpe},
    {"request", fuzz_request},
    {"imatrix", fuzz_imatrix},
    {"lora", fuzz_lora},
    {"examples", fuzz_examples},
    {"grammar", fuzz_grammar},
};

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorted names of the entries of dir (without . and ..); NULL when it cannot be read. */
static char **list_dir(const char *dir, int *n) {
    DIR *d = opendir(dir);
    *n = 0;
    if (!d) return NULL;
    char **names = NULL;
    int cap = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            names = realloc(names, (size_t)cap * sizeof *names);
        }
        names[(*n)++] = strdup(e->d_name);
    }
    closedir(d);
    if (*n) qsort(names, (size_t)*n, sizeof *names, cmp_str);
    return names;
}

int main(void) {
    tlm_threads_set(1);
    const char *root = TLM_SOURCE_DIR "/fuzz/corpus";
    int nd = 0, total = 0;
    char **dirs = list_dir(root, &nd);
    CHECK(dirs && nd > 0, "no corpus directories under %s", root);
    for (int i = 0; i < nd; i++) {
        int t = -1;
        for (size_t k = 0; k < sizeof targets / sizeof *targets; k++)
            if (!strcmp(targets[k].name, dirs[i])) t = (int)k;
        CHECK(t >= 0, "fuzz/corpus/%s has no entry point in test_fuzz_corpus.c", dirs[i]);
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/%s", root, dirs[i]);
        int nf = 0, seeds = 0;
        char **files = list_dir(dir, &nf);
        for (int f = 0; f < nf && t >= 0; f++) {
            char path[2048];
            snprintf(path, sizeof path, "%s/%s", dir, files[f]);
            char *data = NULL;
            size_t len = 0;
            tlm_status s = core_read_file(path, &data, &len);
            CHECK(s == TLM_OK, "%s: %s", path, tlm_last_error());
            if (s) continue;
            int loaded = targets[t].run((const uint8_t *)data, len);
            if (strncmp(files[f], "crash-", 6) != 0) {
                seeds++;
                CHECK(loaded, "seed fuzz/corpus/%s/%s does not load: %s", dirs[i], files[f],
                      tlm_last_error());
            } else {
                t_passed++; /* replayed without a crash */
            }
            free(data);
            total++;
        }
        CHECK(seeds > 0, "fuzz/corpus/%s has no seed", dirs[i]);
        for (int f = 0; f < nf; f++) free(files[f]);
        free(files);
        free(dirs[i]);
    }
    free(dirs);
    printf("replayed %d corpus files\n", total);
    return t_finish("test_fuzz_corpus");
}
