/* zp_schedsize: a schedule's size estimated before it exists (a plan's ops, a file's ops) and
 * refused past its cap or the machine's memory, so no request aborts in an allocator. */
#include "zp_schedsize.h"

#include "zp_budget.h"
#include "zp_util.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* Ops a unit makes a micro-step, with room: DeepSpeed's stage 3 with checkpointing makes 46
 * (its fetches, releases, module computes), and a gradient bucket takes a few more for each
 * of a unit's dozen tensors (a bucket never holds less than a tensor: reduce_bucket_size at
 * 100 elements gave one bucket a tensor, tiny at 20 layers, every implementation and stage). */
#define OPS_PER_UNIT 128.0
/* Ops an all-gather chunk or an optimizer sub-group makes (the paper's stage 1-2 makes 3 per
 * allgather_bucket_size chunk of the whole model: 31,526 ops at 100 elements for tiny). */
#define OPS_PER_CHUNK 4.0

/* Chunks of at most `size` elements that `elems` make (a size below one element: one each). */
static double chunks(double elems, double size)
{
    return ceil(elems / fmax(size, 1.0));
}

double zp_schedsize_estimate_ops(const ZpModel *model, const ZpPlan *plan)
{
    const double micro = fmax(plan->grad_accum, 1);
    const double elems = (double)zp_model_param_count(model) / fmax(plan->mp, 1);
    const ZpZeroConfig *z = &plan->zero;
    double once = 0; /* per step, not per micro-step */
    if (z->stage == 1 || z->stage == 2)
        once += chunks(elems, z->allgather_bucket_size);
    if (z->stage == 3 && z->sub_group_size > 0)
        once += chunks(elems / fmax(plan->dp, 1), z->sub_group_size);
    return micro * OPS_PER_UNIT * zp_model_n_units(model) + OPS_PER_CHUNK * once + OPS_PER_UNIT;
}

double zp_schedsize_max_ops(void)
{
    return fmin(ZP_SCHED_MAX_OPS, zp_budget_available_bytes() / ZP_SCHED_OP_BYTES);
}

gboolean zp_schedsize_check_plan(const ZpModel *model, const ZpPlan *plan, GError **error)
{
    const double ops = zp_schedsize_estimate_ops(model, plan);
    char *what = g_strdup_printf("the schedule of %s (%.3g parameters, %d units, %d micro-steps)",
                                 model->name, (double)zp_model_param_count(model),
                                 zp_model_n_units(model), plan->grad_accum);
    const gboolean ok = zp_budget_check(what, ops, "ops", ZP_SCHED_MAX_OPS, "ZP_SCHED_MAX_OPS",
                                        ops * ZP_SCHED_OP_BYTES, error);
    g_free(what);
    return ok;
}

/* Occurrences of `key` in the file, read a block at a time; a key split across two blocks is
 * caught by keeping the last strlen(key) - 1 bytes. */
static gboolean count_key(FILE *f, const char *key, double *count)
{
    const size_t klen = strlen(key), block = 1 << 20;
    char *buf = g_malloc(block + klen);
    size_t kept = 0, n;
    *count = 0;
    while ((n = fread(buf + kept, 1, block, f)) > 0) {
        const size_t len = kept + n;
        /* A plain scan: memmem from each match would restart over the rest of the block
         * (AddressSanitizer checks that whole range on every call). */
        for (size_t i = 0; i + klen <= len; i++)
            if (buf[i] == key[0] && memcmp(buf + i, key, klen) == 0)
                *count += 1, i += klen - 1;
        kept = MIN(klen - 1, len);
        memmove(buf, buf + len - kept, kept);
    }
    const gboolean ok = !ferror(f);
    g_free(buf);
    return ok;
}

gboolean zp_schedsize_check_file(const char *path, GError **error)
{
    /* A regular file only: a FIFO read here would be empty for the loader, and what is not
     * there or not a file the loader names. */
    if (!g_file_test(path, G_FILE_TEST_IS_REGULAR))
        return TRUE;
    FILE *f = fopen(path, "rb");
    if (!f)
        return TRUE;
    double ops = 0;
    const gboolean read = count_key(f, "\"kind\"", &ops);
    fclose(f);
    if (!read) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "%s: %s", path, g_strerror(errno));
        return FALSE;
    }
    return zp_budget_check(path, ops, "ops", ZP_SCHED_FILE_MAX_OPS, "ZP_SCHED_FILE_MAX_OPS",
                           ops * ZP_SCHED_FILE_OP_BYTES, error);
}

double zp_schedsize_peak_bytes(const ZpSchedule *s)
{
    double total = 0;
    for (int c = 0; c < ZP_MEM_N; c++)
        total += s->state_bytes[c];
    double peak = total;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->kind == ZP_OP_ALLOC)
            peak = fmax(peak, total += op->bytes);
        else if (op->kind == ZP_OP_FREE)
            total -= op->bytes;
    }
    return peak;
}
