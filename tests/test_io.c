/* The io layer's containers: a file built with the GGUF writer reads back through the GGUF
 * reader with every value, shape, offset and alignment as written, and the writer refuses misuse
 * (array lengths or element types that differ from the declaration) instead of writing a corrupt
 * file. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "io/gguf.h"
#include "io/gguf_writer.h"
#include "tlm.h"

/* Header + data of a writer whose tensors hold the given bytes; NULL on failure. */
static uint8_t *finish(io_gguf_writer *w, const uint8_t *const *data, const uint64_t *bytes, int n,
                       size_t *len) {
    uint8_t *head;
    size_t hl;
    if (io_gguf_writer_header(w, &head, &hl)) return NULL;
    size_t total = hl;
    for (int i = 0; i < n; i++) total += bytes[i] + io_gguf_writer_pad(w, bytes[i]);
    uint8_t *f = calloc(1, total);
    memcpy(f, head, hl);
    size_t at = hl;
    for (int i = 0; i < n; i++) {
        memcpy(f + at, data[i], bytes[i]);
        at += bytes[i] + io_gguf_writer_pad(w, bytes[i]);
    }
    free(head);
    *len = total;
    return f;
}

static void test_writer_roundtrip(void) {
    io_gguf_writer w;
    io_gguf_writer_init(&w, 64);
    CHECK_OK(io_gguf_write_str(&w, "general.architecture", "test"));
    CHECK_OK(io_gguf_write_u32(&w, "general.alignment", 64));
    CHECK_OK(io_gguf_write_f32(&w, "x.eps", 1e-6f));
    CHECK_OK(io_gguf_write_bool(&w, "x.flag", 1));
    CHECK_OK(io_gguf_write_array(&w, "x.words", IO_GGUF_STRING, 3));
    CHECK_OK(io_gguf_write_elem_str(&w, "alpha", 5));
    CHECK_OK(io_gguf_write_elem_str(&w, "", 0));
    CHECK_OK(io_gguf_write_elem_str(&w, "a\0b", 3));
    CHECK_OK(io_gguf_write_array(&w, "x.scores", IO_GGUF_F32, 2));
    CHECK_OK(io_gguf_write_elem_f32(&w, -1.5f));
    CHECK_OK(io_gguf_write_elem_f32(&w, 3.25f));
    CHECK_OK(io_gguf_write_array(&w, "x.types", IO_GGUF_I32, 1));
    CHECK_OK(io_gguf_write_elem_i32(&w, -7));
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint16_t b[3] = {0x3C00, 0x4000, 0xC000};
    uint64_t da[2] = {3, 2}, db[1] = {3};
    CHECK_OK(io_gguf_write_tensor(&w, "a", 2, da, 0, sizeof a));
    CHECK_OK(io_gguf_write_tensor(&w, "b", 1, db, 1, sizeof b));
    const uint8_t *data[2] = {(const uint8_t *)a, (const uint8_t *)b};
    uint64_t bytes[2] = {sizeof a, sizeof b};
    size_t len = 0;
    uint8_t *f = finish(&w, data, bytes, 2, &len);
    io_gguf_writer_free(&w);
    CHECK(f != NULL, "header: %s", tlm_last_error());
    if (!f) return;
    io_gguf *g = NULL;
    CHECK_OK(io_gguf_open_memory(f, len, "written.gguf", &g));
    if (g) {
        CHECK(g->version == 3 && g->n_kv == 7 && g->n_tensors == 2 && g->alignment == 64,
              "version %u, %llu keys, %llu tensors, alignment %llu", g->version,
              (unsigned long long)g->n_kv, (unsigned long long)g->n_tensors,
              (unsigned long long)g->alignment);
        CHECK(g->data_offset % 64 == 0, "data at %llu", (unsigned long long)g->data_offset);
        const char *s;
        size_t sl;
        CHECK_OK(io_gguf_get_str(g, "general.architecture", &s, &sl));
        CHECK(sl == 4 && !memcmp(s, "test", 4), "architecture");
        double eps = 0;
        int flag = 0;
        CHECK_OK(io_gguf_get_float(g, "x.eps", &eps));
        CHECK(eps == (double)1e-6f, "eps %g", eps);
        CHECK_OK(io_gguf_get_bool(g, "x.flag", &flag));
        CHECK(flag == 1, "flag");
        const io_gguf_kv *kv = NULL;
        CHECK_OK(io_gguf_get_array(g, "x.words", IO_GGUF_STRING, &kv));
        if (kv) {
            CHECK(kv->len == 3, "%llu words", (unsigned long long)kv->len);
            CHECK_OK(io_gguf_arr_str(kv, 2, &s, &sl));
            CHECK(sl == 3 && !memcmp(s, "a\0b", 3), "word with a NUL byte");
            CHECK_OK(io_gguf_arr_str(kv, 1, &s, &sl));
            CHECK(sl == 0, "empty word");
        }
        double v = 0;
        CHECK_OK(io_gguf_get_array(g, "x.scores", IO_GGUF_F64, &kv));
        if (kv) CHECK_OK(io_gguf_arr_float(kv, 1, &v));
        CHECK(v == 3.25, "score %g", v);
        int64_t iv = 0;
        CHECK_OK(io_gguf_get_array(g, "x.types", IO_GGUF_I64, &kv));
        if (kv) CHECK_OK(io_gguf_arr_int(kv, 0, &iv));
        CHECK(iv == -7, "type %lld", (long long)iv);
        const io_gguf_tensor *ta = io_gguf_find_tensor(g, "a");
        const io_gguf_tensor *tb = io_gguf_find_tensor(g, "b");
        CHECK(ta && ta->n_dims == 2 && ta->dims[0] == 3 && ta->dims[1] == 2 && ta->offset == 0 &&
                  ta->data && !memcmp(ta->data, a, sizeof a),
              "tensor a");
        CHECK(tb && tb->n_dims == 1 && tb->type == 1 && tb->offset == 64 && tb->data &&
                  !memcmp(tb->data, b, sizeof b),
              "tensor b (offset %llu)", tb ? (unsigned long long)tb->offset : 0ull);
        io_gguf_close(g);
    }
    free(f);
}

static void expect_misuse(io_gguf_writer *w, const char *needle) {
    uint8_t *head = NULL;
    size_t hl = 0;
    tlm_status s = io_gguf_writer_header(w, &head, &hl);
    CHECK(s == TLM_ERR_ARG && head == NULL, "misuse (%s) gave status %d", needle, (int)s);
    CHECK_ERROR_HAS(needle);
    free(head);
    io_gguf_writer_free(w);
}

static void test_writer_misuse(void) {
    io_gguf_writer w;
    io_gguf_writer_init(&w, 32);
    io_gguf_write_array(&w, "short", IO_GGUF_I32, 2);
    io_gguf_write_elem_i32(&w, 1);
    expect_misuse(&w, "open array");

    io_gguf_writer_init(&w, 32);
    io_gguf_write_array(&w, "short", IO_GGUF_I32, 2);
    io_gguf_write_elem_i32(&w, 1);
    CHECK(io_gguf_write_u32(&w, "next", 1) == TLM_ERR_ARG, "key inside an open array");
    /* the first failure sticks: later calls do not hide it */
    CHECK(io_gguf_write_u32(&w, "later", 2) == TLM_ERR_ARG, "sticky error");
    expect_misuse(&w, "'next'");

    io_gguf_writer_init(&w, 32);
    io_gguf_write_array(&w, "one", IO_GGUF_STRING, 1);
    io_gguf_write_elem_str(&w, "x", 1);
    CHECK(io_gguf_write_elem_str(&w, "y", 1) == TLM_ERR_ARG, "element beyond the length");
    expect_misuse(&w, "more array elements");

    io_gguf_writer_init(&w, 32);
    io_gguf_write_array(&w, "f", IO_GGUF_F32, 1);
    CHECK(io_gguf_write_elem_i32(&w, 1) == TLM_ERR_ARG, "element of another type");
    expect_misuse(&w, "another type");

    io_gguf_writer_init(&w, 24);
    expect_misuse(&w, "power of two");
}

int main(void) {
    test_writer_roundtrip();
    test_writer_misuse();
    return t_finish("test_io");
}
