/* real_nvme: swap files as DeepSpeed's AsyncIO swapper keeps them (swap_tensor/utils.py
 * swap_in_tensors / swap_out_tensors through aligned pinned buffers, O_DIRECT by default in
 * aio_config), here with synchronous pread/pwrite. */
#include "real_nvme.h"
#include "zp_util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ALIGN_BYTES REAL_NVME_ALIGN_BYTES
#define BOUNCE_BYTES REAL_NVME_BOUNCE_BYTES

struct RealNvmeFile {
    char *path;
    int fd, direct_fd; /* direct_fd -1 without O_DIRECT */
    void *bounce;
    gboolean own_bounce; /* allocated here, not the caller's */
    char *buffered_reason;
    double direct_bytes;
};

static gboolean io_fail(GError **error, const char *path, const char *what, int err)
{
    g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "--nvme-path: %s %s: %s", what, path,
                g_strerror(err));
    return FALSE;
}

/* Opens the direct descriptor, or says why not. */
static void open_direct(RealNvmeFile *f)
{
    f->direct_fd = open(f->path, O_RDWR | O_DIRECT);
    if (f->direct_fd >= 0 && f->bounce)
        return;
    f->own_bounce = f->direct_fd >= 0;
    if (f->direct_fd >= 0 && posix_memalign(&f->bounce, ALIGN_BYTES, BOUNCE_BYTES) == 0)
        return;
    const int err = errno;
    if (f->direct_fd >= 0)
        close(f->direct_fd);
    f->direct_fd = -1;
    f->own_bounce = FALSE;
    f->bounce = NULL;
    f->buffered_reason = g_strdup_printf("O_DIRECT: %s", g_strerror(err));
}

RealNvmeFile *real_nvme_file_new(const char *dir, int rank, const char *name, uint64_t bytes,
                                 void *bounce, GError **error)
{
    if (!dir || !*dir) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "--nvme-path: NVMe offload needs a directory for its swap files");
        return NULL;
    }
    RealNvmeFile *f = g_new0(RealNvmeFile, 1);
    f->path = g_strdup_printf("%s/zreal-%ld-r%d-%s.swap", dir, (long)getpid(), rank, name);
    f->direct_fd = -1;
    f->bounce = bounce;
    f->fd = open(f->path, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (f->fd < 0) {
        io_fail(error, f->path, "cannot create", errno);
        g_free(f->path), g_free(f);
        return NULL;
    }
    const int err = bytes > (uint64_t)INT64_MAX ? EFBIG
                    : bytes > 0                  ? posix_fallocate(f->fd, 0, (off_t)bytes)
                                                 : 0;
    if (err) {
        io_fail(error, f->path, "cannot reserve space in", err);
        unlink(f->path);
        real_nvme_file_free(f);
        return NULL;
    }
    open_direct(f);
    /* Removed now, kept open: no swap file outlives the process, however it ends. */
    unlink(f->path);
    return f;
}

void real_nvme_file_free(RealNvmeFile *f)
{
    if (!f)
        return;
    if (f->direct_fd >= 0)
        close(f->direct_fd);
    close(f->fd);
    if (f->own_bounce)
        free(f->bounce);
    g_free(f->path), g_free(f->buffered_reason), g_free(f);
}

/* All of [offset, offset + bytes) through one descriptor, retrying short transfers. */
static gboolean whole(RealNvmeFile *f, int fd, gboolean write, void *buf, uint64_t bytes,
                      uint64_t offset, GError **error)
{
    for (uint64_t done = 0; done < bytes;) {
        const ssize_t n = write ? pwrite(fd, (char *)buf + done, bytes - done,
                                         (off_t)(offset + done))
                                : pread(fd, (char *)buf + done, bytes - done,
                                        (off_t)(offset + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return io_fail(error, f->path, write ? "cannot write" : "cannot read",
                           n < 0 ? errno : EIO);
        done += (uint64_t)n;
    }
    return TRUE;
}

/* The aligned middle through the bounce buffer and the direct descriptor. */
static gboolean direct(RealNvmeFile *f, gboolean write, char *buf, uint64_t bytes,
                       uint64_t offset, GError **error)
{
    for (uint64_t done = 0; done < bytes; done += BOUNCE_BYTES) {
        const uint64_t n = MIN((uint64_t)BOUNCE_BYTES, bytes - done);
        if (write)
            memcpy(f->bounce, buf + done, n);
        if (!whole(f, f->direct_fd, write, f->bounce, n, offset + done, error))
            return FALSE;
        if (!write)
            memcpy(buf + done, f->bounce, n);
    }
    f->direct_bytes += (double)bytes;
    return TRUE;
}

static gboolean transfer(RealNvmeFile *f, gboolean write, void *buf, uint64_t bytes,
                         uint64_t offset, GError **error)
{
    uint64_t head = bytes, middle = 0;
    if (f->direct_fd >= 0) {
        head = MIN(bytes, (ALIGN_BYTES - offset % ALIGN_BYTES) % ALIGN_BYTES);
        middle = (bytes - head) / ALIGN_BYTES * ALIGN_BYTES;
    }
    char *p = buf;
    return whole(f, f->fd, write, p, head, offset, error) &&
           (middle == 0 || direct(f, write, p + head, middle, offset + head, error)) &&
           whole(f, f->fd, write, p + head + middle, bytes - head - middle,
                 offset + head + middle, error);
}

gboolean real_nvme_write(RealNvmeFile *f, const void *buf, uint64_t bytes, uint64_t offset,
                         GError **error)
{
    return transfer(f, TRUE, (void *)buf, bytes, offset, error);
}

gboolean real_nvme_read(RealNvmeFile *f, void *buf, uint64_t bytes, uint64_t offset,
                        GError **error)
{
    return transfer(f, FALSE, buf, bytes, offset, error);
}

gboolean real_nvme_sync(RealNvmeFile *f, GError **error)
{
    return fdatasync(f->fd) == 0 || io_fail(error, f->path, "cannot sync", errno);
}

double real_nvme_direct_bytes(const RealNvmeFile *f)
{
    return f->direct_bytes;
}

const char *real_nvme_buffered_reason(const RealNvmeFile *f)
{
    return f->buffered_reason;
}
