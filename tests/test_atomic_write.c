/* Crash-safe writes: the data is synced before the rename and the directory after it, since the
 * rename is an entry in the directory and a crash before that entry reaches the disk can bring
 * back the old file (or none). This executable is linked with -Wl,--wrap=fsync (CMakeLists.txt)
 * and the library is a static archive, so every fsync the library makes lands in __wrap_fsync,
 * which records the path behind the descriptor and can fail on request. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"
#include "harness.h"

int __real_fsync(int fd);
int __wrap_fsync(int fd);

enum { MAX_SYNCS = 8 };
static char synced[MAX_SYNCS][PATH_MAX];
static int n_synced;
static int fail_directories; /* errno to fail directory syncs with; 0: don't */

int __wrap_fsync(int fd) {
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    if (n_synced < MAX_SYNCS) {
        ssize_t n = readlink(link, synced[n_synced], PATH_MAX - 1);
        synced[n_synced][n > 0 ? n : 0] = 0;
    }
    n_synced++;
    struct stat st;
    if (fail_directories && fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
        errno = fail_directories;
        return -1;
    }
    return __real_fsync(fd);
}

static int file_is(const char *path, const char *want) {
    char *got = NULL;
    size_t n = 0;
    int same =
        core_read_file(path, &got, &n) == TLM_OK && n == strlen(want) && !memcmp(got, want, n);
    free(got);
    return same;
}

static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* Writes path (whose directory's absolute name is dir) and checks the syncs: the temporary file
 * first, then the directory. */
static void check_write(const char *path, const char *dir, const char *text) {
    char tmp_name[PATH_MAX];
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    snprintf(tmp_name, sizeof tmp_name, "%s/%s.tmp.%ld", dir, base, (long)getpid());
    n_synced = 0;
    CHECK_OK(core_write_file_atomic(path, text, strlen(text)));
    CHECK(file_is(path, text), "%s holds the new text", path);
    CHECK(n_synced == 2, "%s: %d fsyncs (want the file, then its directory)", path, n_synced);
    CHECK(n_synced >= 1 && !strcmp(synced[0], tmp_name), "first sync '%s', want '%s'", synced[0],
          tmp_name);
    CHECK(n_synced >= 2 && !strcmp(synced[1], dir), "second sync '%s', want the directory '%s'",
          synced[1], dir);
}

int main(void) {
    char tmpl[] = "test_atomic_write.XXXXXX";
    char *d = mkdtemp(tmpl);
    CHECK(d != NULL, "mkdtemp: %s", strerror(errno));
    if (!d) return t_finish("test_atomic_write");
    /* getcwd gives the physical path, as /proc/self/fd links do. */
    char cwd[PATH_MAX], dir[PATH_MAX + 32];
    CHECK(getcwd(cwd, sizeof cwd) != NULL, "getcwd: %s", strerror(errno));
    snprintf(dir, sizeof dir, "%s/%s", cwd, d);

    /* A path with a directory part, written twice (the second replaces the first). */
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/out.txt", d);
    check_write(path, dir, "first\n");
    check_write(path, dir, "second version\n");

    /* A bare name lives in the working directory. */
    CHECK(chdir(d) == 0, "chdir: %s", strerror(errno));
    check_write("bare.txt", dir, "bare\n");
    CHECK(chdir(cwd) == 0, "chdir back: %s", strerror(errno));

    /* A failed directory sync is an I/O error naming the directory. The rename has happened (the
     * new text is in place, no temporary is left), but it is not known to be durable. */
    fail_directories = EIO;
    n_synced = 0;
    tlm_status s = core_write_file_atomic(path, "third\n", 6);
    CHECK(s == TLM_ERR_IO, "failed directory sync: status %d", (int)s);
    CHECK(strstr(tlm_last_error(), d) != NULL && strstr(tlm_last_error(), "directory"),
          "message names the directory: %s", tlm_last_error());
    CHECK(file_is(path, "third\n"), "renamed before the directory sync failed");
    char tmp_name[PATH_MAX + 32];
    snprintf(tmp_name, sizeof tmp_name, "%s.tmp.%ld", path, (long)getpid());
    CHECK(!exists(tmp_name), "no temporary file left behind");
    fail_directories = 0;

    remove(path);
    char bare[PATH_MAX + 16];
    snprintf(bare, sizeof bare, "%s/bare.txt", d);
    remove(bare);
    CHECK(rmdir(d) == 0, "the directory holds nothing else: %s", strerror(errno));
    return t_finish("test_atomic_write");
}
