/* tlm tokenize -o DIR FILE...: text files into token shards, in parallel and streaming. */
#include <fcntl.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "core/core.h"

/* Text is read in blocks of one chunk per thread; a chunk ends at a line break that GPT-2-style
 * tokenizers split at anyway (see cut_point), so the shards hold the ids the whole text would
 * give. (SentencePiece-style tokenizers add their dummy-prefix space to every chunk.) */

typedef struct {
    char *text;
    size_t len;
    int32_t *ids;
    size_t n;
    tlm_status st;
    char err[256];
} chunk;

typedef struct {
    const char *dir;
    int32_t vocab;
    size_t per_shard;
    int32_t *buf;
    size_t n;
    int index;
    size_t total;
} shard_writer;

static int is_space(unsigned char c) {
    return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\f' || c == '\v';
}

/* Where to end a chunk of text[0, len) (more follows): just after a lone '\n' between two
 * non-space bytes, the one place where GPT-2's pre-tokenizer (and SentencePiece's byte pieces)
 * end a token whatever follows; failing that, at a UTF-8 character boundary, never inside a
 * character. */
static size_t cut_point(const char *text, size_t len) {
    const unsigned char *t = (const unsigned char *)text; /* t[len] exists: more text follows */
    for (size_t p = len - 1; p > len / 2 && p >= 2; p--)
        if (t[p - 1] == '\n' && !is_space(t[p - 2]) && !is_space(t[p])) return p;
    size_t c = len;
    while (c > 0 && (t[c] & 0xC0) == 0x80) c--; /* the next chunk starts at a lead byte */
    return c > 0 ? c : len;
}

static int flush_shard(shard_writer *w) {
    if (w->n == 0) return 0;
    char name[64];
    snprintf(name, sizeof name, "shard_%06d.bin", w->index);
    char *path = core_path_join(w->dir, name);
    if (!path) return cli_fail("tokenize: out of memory");
    tlm_status s = tlm_dataset_write_tokens(path, w->buf, w->n, w->vocab);
    free(path);
    if (s) return cli_fail_status("tokenize: writing a shard");
    w->index++;
    w->total += w->n;
    w->n = 0;
    return 0;
}

static int add_ids(shard_writer *w, const int32_t *ids, size_t n) {
    while (n > 0) {
        size_t take = w->per_shard - w->n < n ? w->per_shard - w->n : n;
        memcpy(w->buf + w->n, ids, take * sizeof *ids);
        w->n += take;
        ids += take;
        n -= take;
        if (w->n == w->per_shard && flush_shard(w)) return 1;
    }
    return 0;
}

static void progress(double done, double total, double t0, int tty, int final) {
    double dt = cli_now() - t0, rate = dt > 0 ? done / dt : 0;
    long eta = rate > 0 ? (long)((total - done) / rate) : 0;
    fprintf(stderr, "%s%.1f / %.1f MB (%.0f%%) | %.1f MB/s | ETA %ld:%02ld%s",
            tty ? "\r\033[K" : "", done / 1e6, total / 1e6, total > 0 ? 100 * done / total : 100.0,
            rate / 1e6, eta / 60, eta % 60, tty && !final ? "" : "\n");
    fflush(stderr);
}

int cli_tokenize_shards(const tlm_tokenizer *tok, const char *dir, long per_shard,
                        size_t chunk_bytes, char *const *files, int n_files, unsigned flags) {
    const size_t CHUNK = chunk_bytes;
    if (n_files == 0) return cli_fail("tokenize: -o DIR needs text files to read");
    double total = 0;
    for (int i = 0; i < n_files; i++) {
        struct stat st;
        if (stat(files[i], &st) != 0 || !S_ISREG(st.st_mode))
            return cli_fail("tokenize: cannot read '%s'", files[i]);
        total += (double)st.st_size;
    }
    if (mkdir(dir, 0755) != 0 && access(dir, W_OK) != 0)
        return cli_fail("tokenize: cannot create directory '%s'", dir);
    int threads = tlm_threads_get();
    chunk *ch = calloc((size_t)threads, sizeof *ch);
    size_t cap = ((size_t)threads + 1) * CHUNK; /* a block: one chunk per thread, and one more */
    char *block = malloc(cap);
    shard_writer w = {dir, tlm_tokenizer_vocab_size(tok), (size_t)per_shard, NULL, 0, 0, 0};
    w.buf = malloc(w.per_shard * sizeof *w.buf);
    if (!ch || !block || !w.buf) {
        free(ch);
        free(block);
        free(w.buf);
        return cli_fail("tokenize: out of memory (shards of %ld tokens)", per_shard);
    }
    int rc = 0, tty = isatty(2);
    double done = 0, t0 = cli_now(), shown = t0;
    for (int f = 0; f < n_files && !rc; f++) {
        FILE *in = fopen(files[f], "rb");
        if (!in) {
            rc = cli_fail("tokenize: cannot read '%s'", files[f]);
            break;
        }
        size_t carry = 0; /* bytes after the last cut, kept for the next block */
        int eof = 0;
        while (!rc) {
            size_t got = eof ? 0 : fread(block + carry, 1, cap - carry, in);
            if (ferror(in)) {
                rc = cli_fail("tokenize: error reading '%s'", files[f]);
                break;
            }
            if (carry + got < cap) eof = 1;
            size_t have = carry + got, pos = 0;
            if (have == 0) break;
            /* Up to `threads` chunks; until the file ends, at least a chunk's worth of text stays
             * after the last cut, so every cut sees what follows it. */
            int k = 0;
            while (k < threads && pos < have) {
                size_t rem = have - pos, len;
                if (rem > CHUNK)
                    len = cut_point(block + pos, CHUNK);
                else if (eof)
                    len = rem;
                else
                    break;
                ch[k++] = (chunk){block + pos, len, NULL, 0, TLM_OK, ""};
                pos += len;
            }
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
            for (int i = 0; i < k; i++) {
                ch[i].st =
                    tlm_tokenizer_encode(tok, ch[i].text, ch[i].len, flags, &ch[i].ids, &ch[i].n);
                if (ch[i].st) snprintf(ch[i].err, sizeof ch[i].err, "%s", tlm_last_error());
            }
            for (int i = 0; i < k; i++) {
                if (!rc && ch[i].st) rc = cli_fail("tokenize: '%s': %s", files[f], ch[i].err);
                if (!rc) rc = add_ids(&w, ch[i].ids, ch[i].n);
                free(ch[i].ids);
                done += (double)ch[i].len;
            }
            carry = have - pos;
            memmove(block, block + pos, carry);
            if (cli_now() - shown > (tty ? 0.2 : 5.0)) {
                progress(done, total, t0, tty, 0);
                shown = cli_now();
            }
        }
        fclose(in);
    }
    if (!rc) rc = flush_shard(&w);
    if (!rc) {
        progress(done, total, t0, tty, 1);
        fprintf(stderr, "%zu tokens in %d shard%s in %s (%.2f bytes per token)\n", w.total, w.index,
                w.index == 1 ? "" : "s", dir, w.total ? total / (double)w.total : 0.0);
    }
    free(ch);
    free(block);
    free(w.buf);
    return rc;
}
