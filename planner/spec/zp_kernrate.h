/* zp_kernrate: a GPU profile's per-class kernel rates ("kernel_rates"), each from a published
 * microbenchmark or this project's own: a GEMM efficiency surface from wave and tile
 * quantisation under a published best rate, memory-bound bandwidth efficiency by size, a host
 * cost per kernel launch, and the slowdown of compute while a collective runs, by link. */
#ifndef ZP_KERNRATE_H
#define ZP_KERNRATE_H

#include <glib.h>

/* The links a collective runs over: NVLink/NVSwitch inside a node, the network across. */
typedef enum { ZP_LINK_NVLINK, ZP_LINK_NETWORK, ZP_LINK_N } ZpLinkClass;

#define ZP_KERNRATE_MAX_STEPS 8
typedef struct {
    gboolean present;
    /* "gemm" (optional): the best rate a 16-bit GEMM reaches (a published maximum achievable
     * matmul rate), shared by `sms` SMs each computing output tiles of tile_m x tile_n, K in
     * steps of tile_k. Without it GEMMs stay on the profile's roofline. */
    gboolean has_gemm;
    double gemm_best_flops_per_s;
    double sms, tile_m, tile_n, tile_k;
    /* "memory_efficiency": [[min_bytes, efficiency], ...], min_bytes decreasing to 0: the share
     * of HBM bandwidth a memory-bound kernel moving at least min_bytes (read + written)
     * reaches. */
    int n_memory;
    double memory_min_bytes[ZP_KERNRATE_MAX_STEPS], memory_efficiency[ZP_KERNRATE_MAX_STEPS];
    /* "launch_host_s" (optional, 0 when absent): host time to issue one kernel; an op takes
     * at least its kernels' issue time. */
    double launch_host_s;
    /* "interference": {"nvlink": u, "network": u}: the share of the GPU a collective over that
     * link takes from compute running beside it; compute then runs 1 / (1 - u) times slower. */
    double processor_usage[ZP_LINK_N];
} ZpKernRates;

/* Parses "kernel_rates" (a json_t *) into r; `what` names the file in messages. */
gboolean zp_kernrate_from_json(void *json, const char *what, ZpKernRates *r, GError **error);

/* Seconds of `batch` GEMMs of [m, k] x [k, n] moving `bytes` (operands read, result written):
 * the waves of output tiles over the SMs, each tile costing its padded K at one SM's share of
 * the best rate, or the bytes at HBM bandwidth (hbm_bytes_per_s) times the memory curve's
 * efficiency, whichever is longer. r must have "gemm". */
double zp_kernrate_gemm_s(const ZpKernRates *r, double hbm_bytes_per_s, double batch, double m,
                          double n, double k, double bytes);

/* The efficiency a memory-bound kernel moving `bytes` reaches (the step it falls in). */
double zp_kernrate_memory_efficiency(const ZpKernRates *r, double bytes);

/* Seconds of memory-bound kernels moving `bytes` in `launches` launches of equal size. */
double zp_kernrate_memory_s(const ZpKernRates *r, double hbm_bytes_per_s, double bytes,
                            double launches);

/* How many times slower compute runs beside a collective over `link`: 1 / (1 - u); 1 when
 * nothing overlaps (overlapping = 0) or the profile has no rates. */
double zp_kernrate_interference(const ZpKernRates *r, ZpLinkClass link, int overlapping);

const char *zp_link_class_name(ZpLinkClass link);

#endif
