#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core.h"

tlm_status core_read_file(const char *path, char **data, size_t *len) {
    *data = NULL;
    if (len) *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return core_err(TLM_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) {
        fclose(f);
        return core_err(TLM_ERR_NOMEM, "out of memory reading '%s'", path);
    }
    for (;;) {
        if (n + 1 >= cap) {
            char *nb = cap > SIZE_MAX / 2 ? NULL : realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                fclose(f);
                return core_err(TLM_ERR_NOMEM, "out of memory reading '%s'", path);
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return core_err(TLM_ERR_IO, "error reading '%s'", path);
    }
    buf[n] = 0;
    *data = buf;
    if (len) *len = n;
    return TLM_OK;
}

tlm_status core_atomic_open(core_atomic_file *a, const char *path) {
    memset(a, 0, sizeof *a);
    size_t n = strlen(path);
    a->path = malloc(n + 1);
    a->tmp = malloc(n + 32);
    if (!a->path || !a->tmp) {
        free(a->path);
        free(a->tmp);
        return core_err(TLM_ERR_NOMEM, "out of memory");
    }
    memcpy(a->path, path, n + 1);
    snprintf(a->tmp, n + 32, "%s.tmp.%ld", path, (long)getpid());
    a->f = fopen(a->tmp, "wb");
    if (!a->f) {
        tlm_status s = core_err(TLM_ERR_IO, "cannot create '%s': %s", a->tmp, strerror(errno));
        free(a->path);
        free(a->tmp);
        memset(a, 0, sizeof *a);
        return s;
    }
    return TLM_OK;
}

tlm_status core_atomic_write(core_atomic_file *a, const void *data, size_t n) {
    if (n && fwrite(data, 1, n, a->f) != n)
        return core_err(TLM_ERR_IO, "cannot write '%s': %s", a->tmp, strerror(errno));
    return TLM_OK;
}

void core_atomic_abort(core_atomic_file *a) {
    if (a->f) fclose(a->f);
    if (a->tmp) unlink(a->tmp);
    free(a->path);
    free(a->tmp);
    memset(a, 0, sizeof *a);
}

/* A rename is an entry in the directory: until the directory reaches the disk, a crash can bring
 * back the old file (or none) although the new file's data is safe. */
static tlm_status sync_parent_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    size_t n = slash && slash != path ? (size_t)(slash - path) : 1;
    char *dir = malloc(n + 1);
    if (!dir) return core_err(TLM_ERR_NOMEM, "out of memory");
    memcpy(dir, slash ? path : ".", n);
    dir[n] = 0;
    tlm_status s = TLM_OK;
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0)
        s = core_err(TLM_ERR_IO, "cannot open directory '%s' to sync '%s' into it: %s", dir, path,
                     strerror(errno));
    /* EINVAL: this file system cannot sync directories at all, so there is nothing to wait for. */
    else if (fsync(fd) != 0 && errno != EINVAL)
        s = core_err(TLM_ERR_IO, "cannot sync directory '%s' after renaming '%s' into it: %s", dir,
                     path, strerror(errno));
    if (fd >= 0) close(fd);
    free(dir);
    return s;
}

tlm_status core_atomic_commit(core_atomic_file *a) {
    tlm_status s = TLM_OK;
    if (fflush(a->f) != 0 || fsync(fileno(a->f)) != 0)
        s = core_err(TLM_ERR_IO, "cannot flush '%s': %s", a->tmp, strerror(errno));
    if (fclose(a->f) != 0 && s == TLM_OK)
        s = core_err(TLM_ERR_IO, "cannot close '%s': %s", a->tmp, strerror(errno));
    a->f = NULL;
    if (s == TLM_OK && rename(a->tmp, a->path) != 0)
        s = core_err(TLM_ERR_IO, "cannot rename '%s' to '%s': %s", a->tmp, a->path,
                     strerror(errno));
    if (s != TLM_OK)
        unlink(a->tmp);
    else
        s = sync_parent_dir(a->path);
    free(a->path);
    free(a->tmp);
    memset(a, 0, sizeof *a);
    return s;
}

tlm_status core_write_file_atomic(const char *path, const void *data, size_t n) {
    core_atomic_file a;
    tlm_status s = core_atomic_open(&a, path);
    if (s) return s;
    s = core_atomic_write(&a, data, n);
    if (s) {
        core_atomic_abort(&a);
        return s;
    }
    return core_atomic_commit(&a);
}

/* Set by tlm_model_load around one loader call on its own thread (the loaders open their files
 * several calls deep), so a concurrent load on another thread keeps its own mode. */
static _Thread_local int read_mode;

void core_mmap_read_mode(int on) { read_mode = on; }

/* The file's bytes copied into private anonymous memory on 2 MiB pages, then made read-only. A
 * file mapping gets 4 KiB pages (ext4's page cache has no huge pages, not even with MADV_HUGEPAGE
 * on an aligned mapping), and decoding, which streams every weight once per token, is measurably
 * slower from them on the larger types (bench/formats/load_memory.sh): TLB walks, and hardware
 * prefetchers that stop at each 4 KiB boundary. */
static tlm_status read_whole(int fd, size_t len, const char *path, void **out) {
    uint8_t *a = core_big_alloc(len); /* 2 MiB-aligned huge pages from 2 MiB on */
    if (!a) return core_err(TLM_ERR_NOMEM, "out of memory reading '%s' (%zu MiB)", path, len >> 20);
    size_t got = 0;
    while (got < len) {
        ssize_t n = pread(fd, a + got, len - got, (off_t)got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            int e = errno;
            core_big_free(a, len);
            return core_err(TLM_ERR_IO, "cannot read '%s': %s", path,
                            n < 0 ? strerror(e) : "the file got shorter");
        }
        got += (size_t)n;
    }
    /* read-only, as a mapping would be: the model is immutable and shared by its callers */
    core_big_seal(a, len);
    *out = a;
    return TLM_OK;
}

tlm_status core_mmap_open(core_mmap *m, const char *path) {
    m->data = NULL;
    m->size = 0;
    m->copy = 0;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return core_err(TLM_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return core_err(TLM_ERR_IO, "'%s' is not a regular file", path);
    }
    if (st.st_size == 0) {
        close(fd);
        m->data = (const uint8_t *)"";
        return TLM_OK;
    }
    if (read_mode) {
        void *p = NULL;
        tlm_status s = read_whole(fd, (size_t)st.st_size, path, &p);
        close(fd);
        if (s) return s;
        m->data = p;
        m->size = (size_t)st.st_size;
        m->copy = 1;
        return TLM_OK;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return core_err(TLM_ERR_IO, "cannot map '%s': %s", path, strerror(errno));
    m->data = p;
    m->size = (size_t)st.st_size;
    return TLM_OK;
}

void core_mmap_release(const void *p, size_t n) {
    /* Only whole pages inside [p, p + n): a page shared with a neighbour that is still to be read
     * would just be faulted in again, but keep it mapped anyway. */
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + page - 1) & ~(page - 1), b = ((uintptr_t)p + n) & ~(page - 1);
    if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
}

void core_mmap_close(core_mmap *m) {
    if (m->data && m->size) {
        if (m->copy)
            core_big_free((void *)m->data, m->size);
        else
            munmap((void *)m->data, m->size);
    }
    m->data = NULL;
    m->size = 0;
    m->copy = 0;
}

char *core_path_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}
