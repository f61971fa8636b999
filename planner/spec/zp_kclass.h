/* zp_kclass: zplan's kernel classes (GEMM with m, n, k; attention; memory-bound with bytes;
 * collective; optimizer) and the "kernel_tables" section of a hwprofile that holds their times. */
#ifndef ZP_KCLASS_H
#define ZP_KCLASS_H

#include <glib.h>

/* Every GPU kernel of a step is one of these; ZP_KCLASS_UNKNOWN only while being placed (a
 * reader lists such kernels by name, it never drops them). A framework's kernel inventory
 * (zp_inventory) lists the first ZP_KCLASS_INVENTORY_N; a trace also times the optimizer's
 * kernels apart, which an inventory counts as memory-bound (multi-tensor Adam moves its
 * bytes). */
typedef enum {
    ZP_KCLASS_GEMM,       /* a matrix product: m, n, k (and a batch) */
    ZP_KCLASS_ATTENTION,  /* a fused attention kernel (flash, memory-efficient, cuDNN) */
    ZP_KCLASS_MEMORY,     /* memory-bound: elementwise, norms, reductions, copies; its bytes */
    ZP_KCLASS_COLLECTIVE, /* NCCL: the collective, its bytes and its ranks */
    ZP_KCLASS_OPTIMIZER,  /* the optimizer step (fused Adam, multi_tensor_apply) */
    ZP_KCLASS_N,
    ZP_KCLASS_UNKNOWN = ZP_KCLASS_N
} ZpKClass;

/* The classes an inventory's kernels take: GEMM, attention, memory-bound, collective. */
#define ZP_KCLASS_INVENTORY_N ZP_KCLASS_OPTIMIZER

/* "gemm", "attention", "memory", "collective", "optimizer" ("unknown" past them). */
const char *zp_kclass_name(ZpKClass c);

/* The "kernel_tables" object of a hwprofile: measured kernel times by class, each row the
 * median of `count` timed instances of one shape, each class's source in "sources":
 *   gemm:       {m, n, k, batch, dtype, time_s, count}
 *   attention:  {direction: forward|backward, batch, heads, seq, head_dim, time_s, count}
 *   memory:     {op, bytes, time_s, count}        (op: the framework op, e.g. aten::add)
 *   collective: {op: allreduce|reduce_scatter|allgather|broadcast|alltoall|sendrecv,
 *                ranks, bytes, time_s, count}     (bytes: the whole array, as nccl-tests)
 *   optimizer:  {op, time_s, count}
 * Checks it (every key known, every size and time positive and finite), naming `what` and
 * the row in messages. */
gboolean zp_kclass_tables_check(void *json_object, const char *what, GError **error);

/* The row keys of class c's table (NULL-terminated), and the keys that identify a row (the
 * rest: time_s and count), for merging two tables. */
const char *const *zp_kclass_row_keys(ZpKClass c);
const char *const *zp_kclass_row_id_keys(ZpKClass c);

/* Merges `update` into `base` (both "kernel_tables" objects; base is changed): a row of
 * update replaces base's row with the same identifying keys, other rows are added, and each
 * class update has rows for takes update's source. */
void zp_kclass_tables_merge(void *base, void *update);

#endif
