/* real_nvme: zreal's NVMe tier (ZeRO-Infinity) — one swap file per offloaded state under
 * --nvme-path, written and read with real pwrite/pread, O_DIRECT where the file system takes it. */
#ifndef REAL_NVME_H
#define REAL_NVME_H

#include "zp_offload.h"

#include <glib.h>
#include <stdint.h>

typedef struct RealNvmeFile RealNvmeFile;

/* O_DIRECT's alignment of offsets, lengths and memory (a page, which covers every logical
 * block size Linux file systems use), and the bounce buffer direct I/O goes through (the
 * planner's ZP_OFFLOAD_BOUNCE_BYTES, which the host tier counts). */
#define REAL_NVME_ALIGN_BYTES ZP_OFFLOAD_PAGE_BYTES
#define REAL_NVME_BOUNCE_BYTES ZP_OFFLOAD_BOUNCE_BYTES

/* Creates `dir`/zreal-PID-rRANK-NAME.swap (it must not exist) of `bytes` bytes, opened for
 * buffered I/O and, where the file system allows it, a second time with O_DIRECT, and
 * removes its name at once (the open descriptors keep it), so that it goes at exit however
 * the process ends. Direct I/O goes through `bounce`, REAL_NVME_BOUNCE_BYTES aligned to
 * REAL_NVME_ALIGN_BYTES that the caller owns and may share between files used one at a
 * time, or with NULL a buffer of the file's own. A missing, unwritable or full directory
 * fails with one line naming --nvme-path. */
RealNvmeFile *real_nvme_file_new(const char *dir, int rank, const char *name, uint64_t bytes,
                                 void *bounce, GError **error);
/* Closes the file, which frees its space. NULL is ignored. */
void real_nvme_file_free(RealNvmeFile *f);

/* `bytes` at byte `offset` of the file from / into host memory `buf` (any alignment). With
 * O_DIRECT the 4 KiB-aligned middle of the range goes through an aligned bounce buffer and
 * the file's direct descriptor, the unaligned ends through the buffered one (Linux keeps
 * the page cache coherent with direct I/O). Short transfers are retried; errors name the
 * file. */
gboolean real_nvme_write(RealNvmeFile *f, const void *buf, uint64_t bytes, uint64_t offset,
                         GError **error);
gboolean real_nvme_read(RealNvmeFile *f, void *buf, uint64_t bytes, uint64_t offset,
                        GError **error);

/* Waits until what was written is on the device (fdatasync). */
gboolean real_nvme_sync(RealNvmeFile *f, GError **error);

/* Bytes this file moved with O_DIRECT so far. */
double real_nvme_direct_bytes(const RealNvmeFile *f);

/* NULL when the file is opened with O_DIRECT; else why not ("O_DIRECT: Invalid argument"). */
const char *real_nvme_buffered_reason(const RealNvmeFile *f);

#endif
