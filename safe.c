/* safe.c: checked sizes and allocations, whole-file reads and atomic
 * writes (safe.h). No article section: DESIGN.md, "Errors".
 *
 * What a parser of downloaded files needs and nothing more. Sizes are
 * products of dimensions read from files, so every product is checked
 * (__builtin_mul_overflow) before it becomes an allocation or a file size.
 * Files are read whole by what fstat says they are: a regular file by its
 * size, a pipe or FIFO as a stream with a ceiling, anything else refused.
 * Outputs are checked before any work (safe_check_output) and written
 * through a temporary beside the target whose name is the target's plus
 * ".tmp.<pid>": never equal to the target, never shared by two processes,
 * created with O_EXCL | O_NOFOLLOW after removing any stale file of that
 * name (a killed run's leftover is replaced, never read or appended to).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "safe.h"

/* ".tmp." and the longest pid (10 digits): what a target's name must leave room for. */
#define TMP_SUFFIX_MAX 16

int safe_mul(size_t a, size_t b, size_t *out) {
    return __builtin_mul_overflow(a, b, out) ? -1 : 0;
}

int safe_add(size_t a, size_t b, size_t *out) {
    return __builtin_add_overflow(a, b, out) ? -1 : 0;
}

int safe_mul_n(size_t *out, int n, ...) {
    va_list ap;
    va_start(ap, n);
    size_t p = 1;
    int rc = 0;
    for (int i = 0; i < n; i++)
        if (safe_mul(p, va_arg(ap, size_t), &p) != 0) rc = -1;
    va_end(ap);
    *out = rc == 0 ? p : 0;
    return rc;
}

int safe_fail(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || !errlen) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

void safe_die_usage(const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "train: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    exit(EXIT_USAGE);
}

int safe_range(const char *what, long long v, long long lo, long long hi, char *err, size_t errlen) {
    if (v >= lo && v <= hi) return 0;
    snprintf(err, errlen, "%s %lld is outside %lld..%lld", what, v, lo, hi);
    return -1;
}

void *safe_malloc(size_t bytes, const char *what) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "error: out of memory allocating %s (%zu bytes)\n", what, bytes);
        exit(1);
    }
    return p;
}

void *safe_realloc(void *p, size_t bytes, const char *what) {
    void *q = realloc(p, bytes ? bytes : 1);
    if (!q) {
        fprintf(stderr, "error: out of memory allocating %s (%zu bytes)\n", what, bytes);
        exit(1);
    }
    return q;
}

void *safe_calloc(size_t n, size_t size, const char *what) {
    size_t bytes;
    if (safe_mul(n, size, &bytes)) {
        fprintf(stderr, "error: out of memory allocating %s (%zu x %zu bytes)\n", what, n, size);
        exit(1);
    }
    void *p = bytes ? calloc(n, size) : calloc(1, 1);
    if (!p) {
        fprintf(stderr, "error: out of memory allocating %s (%zu bytes)\n", what, bytes);
        exit(1);
    }
    return p;
}

/* Reads fd to its end into a growing buffer, refusing more than max_bytes. */
static int read_stream(int fd, const char *path, size_t max_bytes, unsigned char **data, size_t *len,
                       char *err, size_t errlen) {
    size_t cap = 65536, n = 0;
    unsigned char *buf = malloc(cap + 1);
    if (!buf) { snprintf(err, errlen, "%s: out of memory reading the stream", path); return -1; }
    for (;;) {
        if (n == cap) {
            if (cap > max_bytes) break;   /* already read more than allowed */
            size_t next = cap * 2 > max_bytes + 1 ? max_bytes + 1 : cap * 2;
            unsigned char *b = realloc(buf, next + 1);
            if (!b) { free(buf); snprintf(err, errlen, "%s: out of memory reading the stream", path); return -1; }
            buf = b; cap = next;
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            snprintf(err, errlen, "%s: read error: %s", path, strerror(errno));
            free(buf);
            return -1;
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    if (n > max_bytes) {
        snprintf(err, errlen, "%s: stream is larger than %zu bytes, the most this file may hold", path, max_bytes);
        free(buf);
        return -1;
    }
    buf[n] = 0;
    *data = buf;
    *len = n;
    return 0;
}

int safe_read_file(const char *path, size_t max_bytes, unsigned char **data, size_t *len, char *err,
                   size_t errlen) {
    *data = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) { snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno)); return -1; }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        snprintf(err, errlen, "cannot stat %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (S_ISFIFO(st.st_mode)) {   /* a pipe, a FIFO or /dev/stdin fed by one */
        int rc = read_stream(fd, path, max_bytes, data, len, err, errlen);
        close(fd);
        return rc;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s is %s, not a regular file or a pipe", path,
                 S_ISDIR(st.st_mode) ? "a directory" : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                 : S_ISSOCK(st.st_mode) ? "a socket" : "a special file");
        close(fd);
        return -1;
    }
    if (st.st_size < 0 || (unsigned long long)st.st_size > max_bytes) {
        snprintf(err, errlen, "%s has %lld bytes, more than %zu, the most this file may hold", path,
                 (long long)st.st_size, max_bytes);
        close(fd);
        return -1;
    }
    size_t size = (size_t)st.st_size, n = 0;
    unsigned char *buf = malloc(size + 1);
    if (!buf) {
        snprintf(err, errlen, "%s: out of memory reading its %zu bytes", path, size);
        close(fd);
        return -1;
    }
    while (n < size) {
        ssize_t r = read(fd, buf + n, size - n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        n += (size_t)r;
    }
    unsigned char extra;
    ssize_t more = n == size ? read(fd, &extra, 1) : 0;
    close(fd);
    if (n != size || more != 0) {
        snprintf(err, errlen, "%s changed while being read: %zu bytes by its size, %s", path, size,
                 n != size ? "fewer read" : "more read");
        free(buf);
        return -1;
    }
    buf[size] = 0;
    *data = buf;
    *len = size;
    return 0;
}

/* The directory part of path ("." when it has none), malloc'd. */
static char *dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return strdup(".");
    if (slash == path) return strdup("/");
    return strndup(path, (size_t)(slash - path));
}

int safe_check_output(const char *flag, const char *path, char *err, size_t errlen) {
    if (!path || !*path) { snprintf(err, errlen, "%s: empty path", flag); return -1; }
    size_t plen = strlen(path);
    if (path[plen - 1] == '/') { snprintf(err, errlen, "%s %s: names a directory, not a file", flag, path); return -1; }
    if (plen + TMP_SUFFIX_MAX >= PATH_MAX) {
        snprintf(err, errlen, "%s: path of %zu bytes is too long (at most %d)", flag, plen, PATH_MAX - TMP_SUFFIX_MAX - 1);
        return -1;
    }
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (strlen(base) + TMP_SUFFIX_MAX > NAME_MAX) {
        snprintf(err, errlen, "%s %.40s...: file name of %zu bytes is too long (at most %d)", flag, path,
                 strlen(base), NAME_MAX - TMP_SUFFIX_MAX);
        return -1;
    }
    if (!strcmp(base, ".") || !strcmp(base, "..")) {
        snprintf(err, errlen, "%s %s: names a directory, not a file", flag, path);
        return -1;
    }
    struct stat st;
    if (stat(path, &st) == 0) {
        if (S_ISDIR(st.st_mode)) { snprintf(err, errlen, "%s %s: is a directory", flag, path); return -1; }
        if (!S_ISREG(st.st_mode)) {
            snprintf(err, errlen, "%s %s: exists and is not a regular file", flag, path);
            return -1;
        }
    }
    char *dir = dir_of(path);
    if (!dir) { snprintf(err, errlen, "%s: out of memory", flag); return -1; }
    int rc = 0;
    if (stat(dir, &st) != 0) {
        snprintf(err, errlen, "%s %s: directory %s %s", flag, path, dir,
                 errno == ENOENT ? "does not exist" : errno == ENOTDIR ? "is not a directory" : strerror(errno));
        rc = -1;
    } else if (!S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "%s %s: %s is not a directory", flag, path, dir);
        rc = -1;
    } else if (access(dir, W_OK | X_OK) != 0) {
        snprintf(err, errlen, "%s %s: directory %s is not writable (%s)", flag, path, dir, strerror(errno));
        rc = -1;
    }
    free(dir);
    return rc;
}

int safe_out_open(SafeOut *o, const char *path, char *err, size_t errlen) {
    memset(o, 0, sizeof *o);
    if (safe_check_output("output", path, err, errlen) != 0) return -1;
    size_t n = strlen(path) + TMP_SUFFIX_MAX + 1;
    o->path = strdup(path);
    o->tmp = malloc(n);
    if (!o->path || !o->tmp) {
        snprintf(err, errlen, "%s: out of memory", path);
        safe_out_abort(o);
        return -1;
    }
    int k = snprintf(o->tmp, n, "%s.tmp.%ld", path, (long)getpid());
    if (k < 0 || (size_t)k >= n || !strcmp(o->tmp, o->path)) {   /* cannot happen: the check */
        snprintf(err, errlen, "%s: no room for a temporary name", path);
        safe_out_abort(o);
        return -1;
    }
    /* A stale temporary of this name (an earlier process with our pid) is
     * removed, never reused: O_EXCL then creates ours afresh. */
    if (unlink(o->tmp) != 0 && errno != ENOENT) {
        snprintf(err, errlen, "cannot remove stale %s: %s", o->tmp, strerror(errno));
        free(o->tmp); o->tmp = NULL;
        safe_out_abort(o);
        return -1;
    }
    int fd = open(o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd < 0 || !(o->f = fdopen(fd, "wb"))) {
        snprintf(err, errlen, "cannot create %s: %s", o->tmp, strerror(errno));
        if (fd >= 0) { close(fd); unlink(o->tmp); }
        free(o->tmp); o->tmp = NULL;
        safe_out_abort(o);
        return -1;
    }
    return 0;
}

int safe_out_commit(SafeOut *o, char *err, size_t errlen) {
    if (!o->f) { snprintf(err, errlen, "%s: not open", o->path ? o->path : "output"); safe_out_abort(o); return -1; }
    int ok = fflush(o->f) == 0 && !ferror(o->f) && fsync(fileno(o->f)) == 0;
    int e = errno;
    ok = fclose(o->f) == 0 && ok;
    o->f = NULL;
    if (!ok) {
        snprintf(err, errlen, "failed writing %s: %s", o->tmp, strerror(e ? e : EIO));
        safe_out_abort(o);
        return -1;
    }
    if (rename(o->tmp, o->path) != 0) {
        snprintf(err, errlen, "cannot rename %s to %s: %s", o->tmp, o->path, strerror(errno));
        safe_out_abort(o);
        return -1;
    }
    free(o->tmp);
    o->tmp = NULL;
    /* The rename is durable only once the directory is. */
    char *dir = dir_of(o->path);
    int dfd = dir ? open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    int rc = 0;
    if (dfd < 0 || fsync(dfd) != 0) {
        if (errno != EINVAL && errno != EROFS) {  /* some filesystems cannot sync a directory */
            snprintf(err, errlen, "cannot sync the directory of %s: %s", o->path, strerror(errno));
            rc = -1;
        }
    }
    if (dfd >= 0) close(dfd);
    free(dir);
    safe_out_abort(o);
    return rc;
}

void safe_out_abort(SafeOut *o) {
    if (o->f) fclose(o->f);
    if (o->tmp) unlink(o->tmp);
    free(o->tmp);
    free(o->path);
    memset(o, 0, sizeof *o);
}

int safe_read_named(const char *path, const char *what, size_t max_bytes, unsigned char **data, size_t *len,
                    char *err, size_t errlen) {
    char why[512];
    if (safe_read_file(path, max_bytes, data, len, why, sizeof why) == 0) return 0;
    if (!strncmp(why, "cannot open ", 12)) snprintf(err, errlen, "cannot open %s file %s", what, why + 12);
    else snprintf(err, errlen, "cannot read %s file %s: %s", what, path, why);
    return -1;
}
