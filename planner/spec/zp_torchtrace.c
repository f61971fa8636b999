/* zp_torchtrace: a PyTorch profiler trace, event by event (zp_jsonstream), into timed kernel
 * instances of zplan's classes (zp_kclass), linked to their CPU op's shapes by correlation id.
 *
 * Kineto's trace (pytorch/kineto libkineto/src/output_json.cpp, ChromeTraceLogger): events
 * "ph": "X" with "cat" cpu_op (args "External id", with record_shapes "Input Dims" and
 * "Input type"), cuda_runtime / cuda_driver (the launch: args "correlation" and the CPU op's
 * "External id") and kernel / gpu_memcpy / gpu_memset (args "correlation", "External id",
 * NCCL kernels "Collective name", "In msg nelems", "Out msg nelems", "Group size", "dtype");
 * user_annotation "ProfilerStep#N" spans each step; ts and dur in microseconds. */
#include "zp_torchtrace.h"
#include "zp_jsonstream.h"
#include "zp_util.h"

#include <gsl/gsl_sort.h>
#include <gsl/gsl_statistics_double.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The longest event (us): no kernel, op or step of a profiled training step runs 1,000 s. */
#define MAX_EVENT_US 1e9
/* The shortest kernel timed (us): Kineto writes nanoseconds at most (older traces whole
 * microseconds, where a short kernel reads 0); below that it is zero length. */
#define MIN_KERNEL_US 1e-3
/* Sizes beyond any GPU's (a dim over 2^40, bytes over 1e18) are no shape at all. */
#define MAX_DIM 1099511627776.0
#define MAX_BYTES 1e18

/* ---- what one file's events leave ---- */

typedef enum { COLL_ALLREDUCE, COLL_REDUCE_SCATTER, COLL_ALLGATHER, COLL_BROADCAST,
               COLL_ALLTOALL, COLL_SENDRECV, COLL_N } Coll;
static const char *const coll_names[] = {"allreduce", "reduce_scatter", "allgather",
                                         "broadcast", "alltoall", "sendrecv"};

/* A collective's arguments as NCCL's kernels (or the record_param_comms op) carry them. */
typedef struct {
    gint8 kind;          /* Coll, -1 unknown */
    int ranks;           /* 0 unknown */
    double bytes;        /* the whole array; 0 unknown */
} CollArgs;

typedef struct {
    guint32 name;        /* interned */
    gboolean copy;       /* gpu_memcpy / gpu_memset: memory-bound with its own bytes */
    double ts_us, dur_us;
    gint64 corr, ext;    /* -1 when absent */
    double bytes;        /* a copy's or fill's */
    CollArgs coll;
} Kernel;

typedef struct {
    gint64 corr, ext, tid;
    double ts_us;
} Launch;

typedef enum { OP_OTHER, OP_GEMM, OP_ATTENTION } OpKind;

typedef struct {
    gint64 ext, tid;     /* tid: the CPU thread it ran on, -1 when not a number */
    double ts_us, end_us;
    guint32 name;
    gint8 kind;          /* OpKind */
    gint8 backward;      /* attention */
    char dtype[6];       /* a GEMM's first operand: bf16, fp16, fp32, fp8, ... */
    double d[4];         /* GEMM m, n, k, batch; attention batch, heads, seq, head_dim */
    double bytes;        /* tensors read plus the largest written again; 0 unknown */
    CollArgs coll;
} Op;

typedef struct {
    double ts_us, end_us;
} Step;

typedef struct {
    ZpTorchTrace *t;
    const char *path;
    GHashTable *name_ids;  /* name -> id + 1 */
    GPtrArray *names;
    GArray *kernels, *launches, *ops, *steps;
    GArray *by_thread;     /* indices of ops, by thread and then start (finish_file) */
    guint64 records;
} File;

/* ---- across files ---- */

typedef struct {
    json_t *id;          /* the row's identifying keys */
    GArray *time_s;      /* double, one per instance */
} Row;

typedef struct {
    double total_s;
    guint64 count;
} Unknown;

/* One step's kernel time per class (and unknown). */
typedef struct {
    double s[ZP_KCLASS_N + 1];
} ClassTimes;

struct ZpTorchTrace {
    GHashTable *rows[ZP_KCLASS_N]; /* key text -> Row */
    GHashTable *unknown;           /* kernel name -> Unknown */
    GArray *step_class_s;          /* ClassTimes per step */
    GArray *step_s;                /* ProfilerStep durations */
    GArray *coll_kind, *coll_ranks, *coll_bytes, *coll_s;
    ZpTraceSummary sum;
};

static void row_free(gpointer p)
{
    Row *r = p;
    json_decref(r->id);
    g_array_unref(r->time_s);
    g_free(r);
}

ZpTorchTrace *zp_torch_trace_new(void)
{
    ZpTorchTrace *t = g_new0(ZpTorchTrace, 1);
    for (int c = 0; c < ZP_KCLASS_N; c++)
        t->rows[c] = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, row_free);
    t->unknown = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
    t->step_class_s = g_array_new(FALSE, FALSE, sizeof(ClassTimes));
    t->step_s = g_array_new(FALSE, FALSE, sizeof(double));
    t->coll_kind = g_array_new(FALSE, FALSE, sizeof(int));
    t->coll_ranks = g_array_new(FALSE, FALSE, sizeof(int));
    t->coll_bytes = g_array_new(FALSE, FALSE, sizeof(double));
    t->coll_s = g_array_new(FALSE, FALSE, sizeof(double));
    return t;
}

void zp_torch_trace_free(ZpTorchTrace *t)
{
    if (!t)
        return;
    for (int c = 0; c < ZP_KCLASS_N; c++)
        g_hash_table_unref(t->rows[c]);
    g_hash_table_unref(t->unknown);
    GArray *arrays[] = {t->step_class_s, t->step_s, t->coll_kind, t->coll_ranks,
                        t->coll_bytes, t->coll_s};
    for (size_t i = 0; i < G_N_ELEMENTS(arrays); i++)
        g_array_unref(arrays[i]);
    g_free(t);
}

/* ---- reading an event's fields ---- */

static const char *str_of(json_t *obj, const char *key)
{
    return json_string_value(json_object_get(obj, key));
}

static gint64 int_of(json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    return json_is_integer(v) ? json_integer_value(v) : -1;
}

static double num_of(json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

static guint32 intern(File *f, const char *name)
{
    gpointer id = g_hash_table_lookup(f->name_ids, name);
    if (id)
        return GPOINTER_TO_UINT(id) - 1;
    char *copy = g_strdup(name);
    g_ptr_array_add(f->names, copy);
    g_hash_table_insert(f->name_ids, copy, GUINT_TO_POINTER(f->names->len));
    return f->names->len - 1;
}

/* Bytes of one element of a dtype as the profiler names it: "Input type" (c10's names,
 * "float", "c10::BFloat16") or an NCCL kernel's "dtype" ("Float", "BFloat16"); 0 unknown. */
static const struct {
    const char *name, *short_name;
    int bytes;
} dtypes[] = {
    {"float", "fp32", 4}, {"c10::BFloat16", "bf16", 2}, {"c10::Half", "fp16", 2},
    {"double", "fp64", 8}, {"c10::Float8_e4m3fn", "fp8", 1}, {"c10::Float8_e5m2", "fp8", 1},
    {"long int", "i64", 8}, {"int", "i32", 4}, {"bool", "bool", 1},
    {"unsigned char", "u8", 1}, {"signed char", "i8", 1}, {"short int", "i16", 2},
    {"Float", "fp32", 4}, {"BFloat16", "bf16", 2}, {"Half", "fp16", 2}, {"Double", "fp64", 8},
    {"Long", "i64", 8}, {"Int", "i32", 4}, {"Byte", "u8", 1}, {"Char", "i8", 1},
    {"Bool", "bool", 1}, {"Float8_e4m3fn", "fp8", 1}, {"Float8_e5m2", "fp8", 1},
};

static int dtype_index(const char *name)
{
    for (size_t i = 0; name && i < G_N_ELEMENTS(dtypes); i++)
        if (strcmp(dtypes[i].name, name) == 0)
            return (int)i;
    return -1;
}

/* A tensor's dims ([d0, d1, ...], whole non-negative numbers) into d; its rank, or -1. */
#define MAX_DIMS 8
static int tensor_dims(json_t *dims, double d[MAX_DIMS])
{
    const size_t n = json_array_size(dims);
    if (!json_is_array(dims) || n > MAX_DIMS)
        return -1;
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(dims, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) > (INT64_C(1) << 40))
            return -1;
        d[i] = (double)json_integer_value(v);
    }
    return (int)n;
}

static double numel(const double *d, int n)
{
    double e = 1;
    for (int i = 0; i < n; i++)
        e *= d[i];
    return e;
}

/* ---- CPU ops: what their recorded shapes say ---- */

/* The GEMM ops (ATen's, as the innermost op that launches the kernel): where the two operands
 * are among the inputs, and whether the second is a weight [n, k] (aten::linear). */
static const struct {
    const char *name;
    int a, b;
    gboolean b_transposed;
} gemm_ops[] = {
    {"aten::mm", 0, 1, FALSE},        {"aten::addmm", 1, 2, FALSE},
    {"aten::addmm_", 1, 2, FALSE},    {"aten::_addmm_activation", 1, 2, FALSE},
    {"aten::bmm", 0, 1, FALSE},       {"aten::baddbmm", 1, 2, FALSE},
    {"aten::matmul", 0, 1, FALSE},    {"aten::_scaled_mm", 0, 1, FALSE},
    {"aten::linear", 0, 1, TRUE},
};

/* The attention ops: the query's (or, backward, the output gradient's) input and its layout,
 * [batch, seq, heads, dim] (flash-attention's own) or [batch, heads, seq, dim] (SDPA's). */
static const struct {
    const char *name;
    gboolean bshd, backward;
} attention_ops[] = {
    {"aten::_flash_attention_forward", TRUE, FALSE},
    {"aten::_flash_attention_backward", TRUE, TRUE},
    {"aten::_efficient_attention_forward", TRUE, FALSE},
    {"aten::_efficient_attention_backward", TRUE, TRUE},
    {"aten::_scaled_dot_product_flash_attention", FALSE, FALSE},
    {"aten::_scaled_dot_product_flash_attention_backward", FALSE, TRUE},
    {"aten::_scaled_dot_product_efficient_attention", FALSE, FALSE},
    {"aten::_scaled_dot_product_efficient_attention_backward", FALSE, TRUE},
    {"aten::_scaled_dot_product_cudnn_attention", FALSE, FALSE},
    {"aten::_scaled_dot_product_cudnn_attention_backward", FALSE, TRUE},
    {"aten::scaled_dot_product_attention", FALSE, FALSE},
    {"flash_attn::_flash_attn_forward", TRUE, FALSE},
    {"flash_attn::_flash_attn_backward", TRUE, TRUE},
};

static gboolean gemm_shape(const char *name, json_t *dims, json_t *types, Op *op)
{
    for (size_t i = 0; i < G_N_ELEMENTS(gemm_ops); i++) {
        if (strcmp(gemm_ops[i].name, name) != 0)
            continue;
        double a[MAX_DIMS], b[MAX_DIMS];
        const int na = tensor_dims(json_array_get(dims, gemm_ops[i].a), a);
        const int nb = tensor_dims(json_array_get(dims, gemm_ops[i].b), b);
        if (na < 2 || nb < 2)
            return FALSE;
        const double k = a[na - 1], n = gemm_ops[i].b_transposed ? b[0] : b[nb - 1];
        /* A batched second operand pairs with the first's leading dims; a 2-D one takes
         * them as more rows. */
        const double batch = nb > 2 ? numel(b, nb - 2) : 1;
        const double m = numel(a, na - 1) / batch;
        if (!(m >= 1 && n >= 1 && k >= 1 && m <= MAX_DIM && n <= MAX_DIM && k <= MAX_DIM &&
              batch <= MAX_DIM))
            return FALSE;
        op->kind = OP_GEMM;
        op->d[0] = m, op->d[1] = n, op->d[2] = k, op->d[3] = batch;
        const int t = dtype_index(json_string_value(json_array_get(types, gemm_ops[i].a)));
        g_strlcpy(op->dtype, t >= 0 ? dtypes[t].short_name : "?", sizeof op->dtype);
        return TRUE;
    }
    return FALSE;
}

static gboolean attention_shape(const char *name, json_t *dims, Op *op)
{
    for (size_t i = 0; i < G_N_ELEMENTS(attention_ops); i++) {
        if (strcmp(attention_ops[i].name, name) != 0)
            continue;
        double q[MAX_DIMS];
        if (tensor_dims(json_array_get(dims, 0), q) != 4 || numel(q, 4) < 1)
            return FALSE;
        op->kind = OP_ATTENTION;
        op->backward = (gint8)attention_ops[i].backward;
        const gboolean bshd = attention_ops[i].bshd;
        op->d[0] = q[0], op->d[1] = bshd ? q[2] : q[1], op->d[2] = bshd ? q[1] : q[2];
        op->d[3] = q[3];
        return TRUE;
    }
    return FALSE;
}

/* Bytes an op's memory-bound kernels move, from its inputs: every tensor input read once,
 * and the largest written once (an elementwise op's output, or an in-place op's operand). */
static double input_bytes(json_t *dims, json_t *types)
{
    double sum = 0, largest = 0;
    for (size_t i = 0; i < json_array_size(dims); i++) {
        double d[MAX_DIMS];
        const int n = tensor_dims(json_array_get(dims, i), d);
        const int t = dtype_index(json_string_value(json_array_get(types, i)));
        if (n < 0 || t < 0)
            continue;
        const double b = numel(d, n) * dtypes[t].bytes;
        sum += b;
        largest = fmax(largest, b);
    }
    return sum + largest <= MAX_BYTES ? sum + largest : 0;
}

static int coll_kind(const char *name)
{
    if (!name)
        return -1;
    /* The name without case or underscores: "all_gather_into_tensor", "_allgather_base",
     * "allgather", NCCL's "ncclDevKernel_AllGather_RING_LL" all hold "allgather". */
    char flat[128];
    size_t n = 0;
    for (const char *p = name; *p && n + 1 < sizeof flat; p++)
        if (*p != '_')
            flat[n++] = g_ascii_tolower(*p);
    flat[n] = '\0';
    static const struct {
        const char *text;
        Coll kind;
    } kinds[] = {{"allreduce", COLL_ALLREDUCE}, {"reducescatter", COLL_REDUCE_SCATTER},
                 {"allgather", COLL_ALLGATHER}, {"broadcast", COLL_BROADCAST},
                 {"alltoall", COLL_ALLTOALL},   {"sendrecv", COLL_SENDRECV},
                 {"send", COLL_SENDRECV},       {"recv", COLL_SENDRECV}};
    for (size_t i = 0; i < G_N_ELEMENTS(kinds); i++)
        if (strstr(flat, kinds[i].text))
            return kinds[i].kind;
    return -1;
}

/* NCCL's arguments as PyTorch records them (torch/csrc/distributed/c10d/ParamCommsUtils, the
 * kernel's and record_param_comms' args). The whole array: an all-gather's output, every
 * other collective's input. */
static CollArgs coll_args(json_t *args, const char *kernel_name)
{
    CollArgs c = {(gint8)coll_kind(str_of(args, "Collective name")), 0, 0};
    if (c.kind < 0)
        c.kind = (gint8)coll_kind(kernel_name);
    const gint64 group = int_of(args, "Group size");
    c.ranks = group > 0 && group < (1 << 24) ? (int)group : 0;
    const int t = dtype_index(str_of(args, "dtype"));
    const gint64 in = int_of(args, "In msg nelems"), out = int_of(args, "Out msg nelems");
    const gint64 elems = c.kind == COLL_ALLGATHER && out > 0 ? out : in;
    if (t >= 0 && elems > 0 && elems < (INT64_C(1) << 50)) /* 8 bytes each: under MAX_BYTES */
        c.bytes = (double)elems * dtypes[t].bytes;
    return c;
}

/* ---- events ---- */

static gboolean too_many(File *f, GError **error)
{
    if (++f->records <= ZP_TRACE_MAX_RECORDS)
        return FALSE;
    g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                "%s: more than %u kernels, launches and shaped CPU ops: profile fewer steps "
                "(torch.profiler.schedule(active=1)) or split the trace", f->path,
                ZP_TRACE_MAX_RECORDS);
    return TRUE;
}

static gboolean on_kernel(File *f, json_t *e, json_t *args, const char *cat, double ts,
                          double dur, GError **error)
{
    const char *name = str_of(e, "name");
    /* A copy's or fill's bytes as device memory moves them: a device-to-device copy reads and
     * writes its "bytes", a fill writes them; a copy to or from the host runs at the host
     * link's rate and is timed without bytes. */
    const gboolean on_device = !strcmp(cat, "gpu_memset") || (name && strstr(name, "DtoD"));
    const double bytes = on_device ? num_of(args, "bytes") * (strcmp(cat, "gpu_memcpy") ? 1 : 2)
                                   : 0;
    Kernel k = {intern(f, name ? name : "(no name)"), strcmp(cat, "kernel") != 0, ts, dur,
                int_of(args, "correlation"), int_of(args, "External id"),
                bytes >= 1 && bytes <= MAX_BYTES ? bytes : 0, coll_args(args, name)};
    g_array_append_val(f->kernels, k);
    return !too_many(f, error);
}

static gboolean on_op(File *f, json_t *e, json_t *args, double ts, double dur, GError **error)
{
    const char *name = str_of(e, "name");
    json_t *dims = json_object_get(args, "Input Dims"), *types = json_object_get(args, "Input type");
    const gint64 ext = int_of(args, "External id");
    CollArgs coll = coll_args(args, NULL);
    if (!name || ext < 0 || (!json_is_array(dims) && coll.bytes <= 0))
        return TRUE; /* nothing a kernel could take from it */
    Op op = {.ext = ext, .tid = int_of(e, "tid"), .ts_us = ts, .end_us = ts + dur,
             .name = intern(f, name), .kind = OP_OTHER, .coll = coll};
    if (!gemm_shape(name, dims, types, &op) && !attention_shape(name, dims, &op))
        op.bytes = input_bytes(dims, types);
    g_array_append_val(f->ops, op);
    return !too_many(f, error);
}

static gboolean on_event(const char *key, void *value, gint64 index, guint64 offset, void *ctx,
                         GError **error)
{
    File *f = ctx;
    json_t *e = value;
    if (index < 0) { /* distributedInfo */
        const gint64 world = int_of(e, "world_size");
        if (world > 0 && world < (1 << 24))
            f->t->sum.world_size = MAX(f->t->sum.world_size, (int)world);
        return TRUE;
    }
    (void)key;
    const char *ph = str_of(e, "ph"), *cat = str_of(e, "cat");
    if (!json_is_object(e) || !ph || strcmp(ph, "X") != 0 || !cat)
        return TRUE;
    const double ts = num_of(e, "ts"), dur = num_of(e, "dur");
    if (!isfinite(ts) || !isfinite(dur) || dur < 0 || dur > MAX_EVENT_US) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: traceEvents[%" G_GINT64_FORMAT "] (byte %" G_GUINT64_FORMAT "): "
                    "\"ts\" and \"dur\" must be numbers, \"dur\" from 0 to %.0f us", f->path,
                    index, offset, MAX_EVENT_US);
        return FALSE;
    }
    json_t *args = json_object_get(e, "args");
    if (!strcmp(cat, "kernel") || !strcmp(cat, "gpu_memcpy") || !strcmp(cat, "gpu_memset"))
        return on_kernel(f, e, args, cat, ts, dur, error);
    if (!strcmp(cat, "cuda_runtime") || !strcmp(cat, "cuda_driver")) {
        Launch l = {int_of(args, "correlation"), int_of(args, "External id"), int_of(e, "tid"),
                    ts};
        if (l.corr < 0)
            return TRUE;
        g_array_append_val(f->launches, l);
        return !too_many(f, error);
    }
    if (!strcmp(cat, "cpu_op"))
        return on_op(f, e, args, ts, dur, error);
    const char *name = str_of(e, "name");
    if (!strcmp(cat, "user_annotation") && name && g_str_has_prefix(name, "ProfilerStep#")) {
        Step s = {ts, ts + dur};
        g_array_append_val(f->steps, s);
    }
    return TRUE;
}

/* ---- placing a kernel ---- */

/* Kernel names by class, first match wins (lower-cased substrings): NCCL's kernels, then the
 * optimizer's (ATen's multi_tensor_apply.cuh and FusedAdamKernel.cu; apex's multi_tensor_adam
 * and _lamb; DeepSpeed's lamb_cuda_kernel: not "adam" or "lamb" alone, which "hadamard" and
 * every "{lambda()#1}" of ATen's elementwise kernels hold), fused attention (flash-attention's flash_fwd/bwd, PyTorch's
 * memory-efficient fmha_cutlassF/B and AttentionKernel, cuDNN's sdpa), GEMMs (cuBLAS's
 * *gemm*, Hopper's nvjet_*, CUTLASS, split-K reductions, cuBLASLt's epilogues), then
 * memory-bound kernels (ATen's elementwise, reduce, norm (GammaBeta: layer norm's backward),
 * softmax, loss, embedding, copy and fill kernels, CUB's sorts and scans, Triton's pointwise
 * and reduction kernels). */
static const struct {
    const char *text;
    ZpKClass klass;
} name_patterns[] = {
    {"nccl", ZP_KCLASS_COLLECTIVE},
    {"multi_tensor_apply", ZP_KCLASS_OPTIMIZER}, {"fusedadam", ZP_KCLASS_OPTIMIZER},
    {"fused_adam", ZP_KCLASS_OPTIMIZER}, {"adamfunctor", ZP_KCLASS_OPTIMIZER},
    {"multi_tensor_adam", ZP_KCLASS_OPTIMIZER}, {"multi_tensor_lamb", ZP_KCLASS_OPTIMIZER},
    {"lamb_cuda", ZP_KCLASS_OPTIMIZER},
    {"flash", ZP_KCLASS_ATTENTION}, {"fmha", ZP_KCLASS_ATTENTION},
    {"attention", ZP_KCLASS_ATTENTION}, {"sdpa", ZP_KCLASS_ATTENTION},
    {"gemm", ZP_KCLASS_GEMM}, {"gemv", ZP_KCLASS_GEMM}, {"nvjet", ZP_KCLASS_GEMM},
    {"cutlass", ZP_KCLASS_GEMM}, {"splitkreduce", ZP_KCLASS_GEMM}, {"xmma", ZP_KCLASS_GEMM},
    {"cublas", ZP_KCLASS_GEMM},
    {"triton_tem", ZP_KCLASS_GEMM},
    {"elementwise", ZP_KCLASS_MEMORY}, {"reduce_kernel", ZP_KCLASS_MEMORY},
    {"norm", ZP_KCLASS_MEMORY}, {"softmax", ZP_KCLASS_MEMORY}, {"cross_entropy", ZP_KCLASS_MEMORY},
    {"nll_loss", ZP_KCLASS_MEMORY}, {"embedding", ZP_KCLASS_MEMORY}, {"index", ZP_KCLASS_MEMORY},
    {"gather", ZP_KCLASS_MEMORY}, {"scatter", ZP_KCLASS_MEMORY}, {"catarray", ZP_KCLASS_MEMORY},
    {"copy", ZP_KCLASS_MEMORY}, {"fill", ZP_KCLASS_MEMORY}, {"dropout", ZP_KCLASS_MEMORY},
    {"triton_poi", ZP_KCLASS_MEMORY}, {"triton_red", ZP_KCLASS_MEMORY},
    {"triton_per", ZP_KCLASS_MEMORY}, {"bn_fw", ZP_KCLASS_MEMORY}, {"bn_bw", ZP_KCLASS_MEMORY},
    {"gammabeta", ZP_KCLASS_MEMORY}, {"cub::device", ZP_KCLASS_MEMORY},
};

static ZpKClass class_by_name(const char *name)
{
    char *lower = g_ascii_strdown(name, -1);
    ZpKClass c = ZP_KCLASS_UNKNOWN;
    for (size_t i = 0; c == ZP_KCLASS_UNKNOWN && i < G_N_ELEMENTS(name_patterns); i++)
        if (strstr(lower, name_patterns[i].text))
            c = name_patterns[i].klass;
    g_free(lower);
    return c;
}

/* A kernel's class: a copy or fill is memory-bound; then its name; then the op that launched
 * it (a GEMM op's kernel of a name not listed, such as a new cuBLAS family, is a GEMM). */
static ZpKClass place(const Kernel *k, ZpKClass by_name, const Op *op)
{
    if (k->copy)
        return ZP_KCLASS_MEMORY;
    if (by_name != ZP_KCLASS_UNKNOWN || !op)
        return by_name;
    return op->kind == OP_GEMM        ? ZP_KCLASS_GEMM
           : op->kind == OP_ATTENTION ? ZP_KCLASS_ATTENTION
                                      : ZP_KCLASS_UNKNOWN;
}

static int cmp_launch(const void *a, const void *b)
{
    const gint64 x = ((const Launch *)a)->corr, y = ((const Launch *)b)->corr;
    return (x > y) - (x < y);
}

static int cmp_op(const void *a, const void *b)
{
    const gint64 x = ((const Op *)a)->ext, y = ((const Op *)b)->ext;
    return (x > y) - (x < y);
}

static int cmp_step(const void *a, const void *b)
{
    const double x = ((const Step *)a)->ts_us, y = ((const Step *)b)->ts_us;
    return (x > y) - (x < y);
}

static const Launch *find_launch(const File *f, gint64 corr)
{
    const Launch key = {corr, 0, 0, 0};
    return corr < 0 || f->launches->len == 0 /* no data to search (NULL) */
               ? NULL
               : bsearch(&key, f->launches->data, f->launches->len, sizeof key, cmp_launch);
}

static const Op *find_op(const File *f, gint64 ext)
{
    const Op key = {.ext = ext};
    return ext < 0 || f->ops->len == 0
               ? NULL
               : bsearch(&key, f->ops->data, f->ops->len, sizeof key, cmp_op);
}

static gint thread_order(gconstpointer a, gconstpointer b, gpointer ops)
{
    const Op *x = &g_array_index((GArray *)ops, Op, *(const guint *)a);
    const Op *y = &g_array_index((GArray *)ops, Op, *(const guint *)b);
    if (x->tid != y->tid)
        return (x->tid > y->tid) - (x->tid < y->tid);
    return (x->ts_us > y->ts_us) - (x->ts_us < y->ts_us);
}

/* How far back among a thread's earlier ops the innermost enclosing one is looked for: the
 * siblings that ended before the launch are passed over, so a launch after many of them in one
 * op (an optimizer's thousands of small ops) may find none. */
#define ENCLOSING_LOOKBACK 256

/* The innermost shaped op on thread tid whose span holds ts: the launch's op in traces whose
 * launches carry no External id of their op (PyTorch before 1.13 wrote the correlation id
 * there). NULL when none. */
static const Op *find_enclosing(const File *f, gint64 tid, double ts)
{
    const guint n = f->by_thread->len;
    guint lo = 0, hi = n; /* the first op after (tid, ts) */
    while (lo < hi) {
        const guint mid = (lo + hi) / 2;
        const Op *o = &g_array_index(f->ops, Op, g_array_index(f->by_thread, guint, mid));
        if (o->tid < tid || (o->tid == tid && o->ts_us <= ts))
            lo = mid + 1;
        else
            hi = mid;
    }
    for (guint i = lo, seen = 0; i-- > 0 && seen < ENCLOSING_LOOKBACK; seen++) {
        const Op *o = &g_array_index(f->ops, Op, g_array_index(f->by_thread, guint, i));
        if (o->tid != tid)
            break;
        if (o->end_us >= ts)
            return o;
    }
    return NULL;
}

/* The step a launch at ts falls in (steps sorted), -1 outside every one. */
static int step_of(const File *f, double ts)
{
    int lo = 0, hi = (int)f->steps->len - 1, found = -1;
    while (lo <= hi) {
        const int mid = (lo + hi) / 2;
        const Step *s = &g_array_index(f->steps, Step, mid);
        if (s->ts_us <= ts)
            found = mid, lo = mid + 1;
        else
            hi = mid - 1;
    }
    return found >= 0 && ts <= g_array_index(f->steps, Step, found).end_us ? found : -1;
}

/* One timed instance: a CPU op's kernels of one class, summed (or a kernel alone). */
typedef struct {
    ZpKClass klass;
    const Op *op;
    const Kernel *first;
    double dur_us;
    int step;
} Instance;

static void add_row(ZpTorchTrace *t, ZpKClass c, json_t *id, double time_s)
{
    char *key = json_dumps(id, JSON_COMPACT | JSON_SORT_KEYS);
    Row *r = g_hash_table_lookup(t->rows[c], key);
    if (!r) {
        r = g_new0(Row, 1);
        r->id = json_incref(id);
        r->time_s = g_array_new(FALSE, FALSE, sizeof(double));
        g_hash_table_insert(t->rows[c], key, r);
    } else {
        g_free(key);
    }
    g_array_append_val(r->time_s, time_s);
    json_decref(id);
}

/* The instance's table row, when its shape is known; FALSE when not. */
static gboolean table_row(ZpTorchTrace *t, const File *f, const Instance *in)
{
    const Op *op = in->op;
    const double s = in->dur_us * 1e-6;
    if (s > 1e6) /* thousands of kernels of 1,000 s in one op: not a training step */
        return FALSE;
    const CollArgs *c = &in->first->coll;
    switch (in->klass) {
    case ZP_KCLASS_GEMM:
        if (!op || op->kind != OP_GEMM)
            return FALSE;
        add_row(t, in->klass, json_pack("{s:f, s:f, s:f, s:f, s:s}", "m", op->d[0], "n", op->d[1],
                                        "k", op->d[2], "batch", op->d[3], "dtype", op->dtype), s);
        return TRUE;
    case ZP_KCLASS_ATTENTION:
        if (!op || op->kind != OP_ATTENTION)
            return FALSE;
        add_row(t, in->klass, json_pack("{s:s, s:f, s:f, s:f, s:f}", "direction",
                                        op->backward ? "backward" : "forward", "batch", op->d[0],
                                        "heads", op->d[1], "seq", op->d[2], "head_dim", op->d[3]),
                s);
        return TRUE;
    case ZP_KCLASS_MEMORY: {
        const double bytes = in->first->copy ? in->first->bytes : op ? op->bytes : 0;
        if (!(bytes >= 1))
            return FALSE;
        const char *name = g_ptr_array_index(f->names, in->first->copy ? in->first->name
                                                                         : op->name);
        add_row(t, in->klass, json_pack("{s:s, s:f}", "op", name, "bytes", bytes), s);
        return TRUE;
    }
    case ZP_KCLASS_COLLECTIVE: {
        const CollArgs *a = c->bytes > 0 || !op ? c : &op->coll;
        const int ranks = a->ranks > 0 ? a->ranks : t->sum.world_size;
        if (a->kind < 0 || !(a->bytes >= 1) || ranks < 2)
            return FALSE; /* timed in its class, no row: nothing says its size */
        add_row(t, in->klass, json_pack("{s:s, s:i, s:f}", "op", coll_names[(int)a->kind],
                                        "ranks", ranks, "bytes", a->bytes), s);
        if (a->kind <= COLL_ALLGATHER) { /* ZpCollKind's order */
            const int kind = a->kind;
            g_array_append_val(t->coll_kind, kind);
            g_array_append_val(t->coll_ranks, ranks);
            g_array_append_val(t->coll_bytes, a->bytes);
            g_array_append_val(t->coll_s, s);
        }
        return TRUE;
    }
    case ZP_KCLASS_OPTIMIZER: {
        const char *name = g_ptr_array_index(f->names, op ? op->name : in->first->name);
        add_row(t, in->klass, json_pack("{s:s}", "op", name), s);
        return TRUE;
    }
    default:
        return FALSE;
    }
}

static void add_unknown(ZpTorchTrace *t, const char *name, double s)
{
    Unknown *u = g_hash_table_lookup(t->unknown, name);
    if (!u) {
        u = g_new0(Unknown, 1);
        g_hash_table_insert(t->unknown, g_strdup(name), u);
    }
    u->total_s += s;
    u->count++;
}

/* Links, places and groups the file's kernels, and adds them to t. */
static void finish_file(File *f)
{
    ZpTorchTrace *t = f->t;
    g_array_sort(f->launches, cmp_launch);
    g_array_sort(f->ops, cmp_op);
    g_array_sort(f->steps, cmp_step);
    f->by_thread = g_array_sized_new(FALSE, FALSE, sizeof(guint), f->ops->len);
    for (guint i = 0; i < f->ops->len; i++)
        if (g_array_index(f->ops, Op, i).tid >= 0)
            g_array_append_val(f->by_thread, i);
    g_array_sort_with_data(f->by_thread, thread_order, f->ops);
    ZpKClass *by_name = g_new(ZpKClass, f->names->len);
    for (guint i = 0; i < f->names->len; i++)
        by_name[i] = class_by_name(g_ptr_array_index(f->names, i));
    const int steps = MAX((int)f->steps->len, 1);
    ClassTimes *step_s = g_new0(ClassTimes, steps);
    GHashTable *grouped = g_hash_table_new(g_int64_hash, g_int64_equal);
    GArray *instances = g_array_new(FALSE, FALSE, sizeof(Instance));
    GArray *keys = g_array_sized_new(FALSE, FALSE, sizeof(gint64), f->kernels->len);
    for (guint i = 0; i < f->kernels->len; i++) {
        const Kernel *k = &g_array_index(f->kernels, Kernel, i);
        t->sum.kernels++;
        /* The launch's External id names the op; a kernel's own is the op's in newer traces
         * but its correlation id in older ones, where it names no op. */
        const Launch *l = find_launch(f, k->corr);
        gint64 ext = l && l->ext != l->corr ? l->ext : k->ext != k->corr ? k->ext : -1;
        const Op *op = find_op(f, ext);
        if (!op && l && l->tid >= 0 && (op = find_enclosing(f, l->tid, l->ts_us)))
            ext = op->ext;
        if (!l && !op)
            t->sum.unlinked++;
        if (k->dur_us < MIN_KERNEL_US) {
            t->sum.zero_length++;
            continue;
        }
        const ZpKClass c = place(k, by_name[k->name], op);
        const double ts = l ? l->ts_us : k->ts_us;
        const int step = f->steps->len ? step_of(f, ts) : 0;
        if (step < 0)
            t->sum.outside_steps++;
        else
            step_s[step].s[c] += k->dur_us * 1e-6;
        if (c == ZP_KCLASS_UNKNOWN) {
            add_unknown(t, g_ptr_array_index(f->names, k->name), k->dur_us * 1e-6);
            t->sum.instances[c]++;
            continue;
        }
        /* One instance per op and class; each collective kernel and unlinked kernel alone.
         * The keys live in `keys`, sized for every kernel up front so that they never move. */
        const gboolean group = op && c != ZP_KCLASS_COLLECTIVE && !k->copy;
        const gint64 key = ext * (ZP_KCLASS_N + 1) + c;
        const gpointer found = group ? g_hash_table_lookup(grouped, &key) : NULL;
        if (found) {
            g_array_index(instances, Instance, GPOINTER_TO_SIZE(found) - 1).dur_us += k->dur_us;
            continue;
        }
        Instance fresh = {c, op, k, k->dur_us, step};
        g_array_append_val(instances, fresh);
        if (group) {
            g_array_append_val(keys, key);
            g_hash_table_insert(grouped, &g_array_index(keys, gint64, keys->len - 1),
                                GSIZE_TO_POINTER(instances->len));
        }
    }
    for (guint i = 0; i < instances->len; i++) {
        const Instance *in = &g_array_index(instances, Instance, i);
        t->sum.instances[in->klass]++;
        if (!table_row(t, f, in))
            t->sum.shapeless++;
    }
    for (int s = 0; s < steps; s++)
        g_array_append_val(t->step_class_s, step_s[s]);
    for (guint s = 0; s < f->steps->len; s++) {
        const Step *st = &g_array_index(f->steps, Step, s);
        const double d = (st->end_us - st->ts_us) * 1e-6;
        g_array_append_val(t->step_s, d);
    }
    t->sum.steps += steps;
    g_hash_table_unref(grouped);
    g_array_unref(instances);
    g_array_unref(keys);
    g_array_unref(f->by_thread);
    g_free(step_s);
    g_free(by_name);
}

gboolean zp_torch_trace_read(ZpTorchTrace *t, const char *path, GError **error)
{
    File f = {t, path, g_hash_table_new(g_str_hash, g_str_equal),
              g_ptr_array_new_with_free_func(g_free),
              g_array_new(FALSE, FALSE, sizeof(Kernel)), g_array_new(FALSE, FALSE, sizeof(Launch)),
              g_array_new(FALSE, FALSE, sizeof(Op)), g_array_new(FALSE, FALSE, sizeof(Step)), NULL,
              0};
    static const char *const keep[] = {"distributedInfo", NULL};
    const gboolean ok = zp_json_stream(path, "traceEvents", keep, ZP_TRACE_MAX_EVENT_BYTES,
                                       on_event, &f, error);
    if (ok) {
        finish_file(&f);
        t->sum.files++;
    }
    g_hash_table_unref(f.name_ids);
    g_ptr_array_unref(f.names);
    GArray *arrays[] = {f.kernels, f.launches, f.ops, f.steps};
    for (size_t i = 0; i < G_N_ELEMENTS(arrays); i++)
        g_array_unref(arrays[i]);
    return ok;
}

/* ---- results ---- */

static double median(double *v, size_t n)
{
    if (n == 0)
        return 0;
    gsl_sort(v, 1, n);
    return gsl_stats_median_from_sorted_data(v, 1, n);
}

void zp_torch_trace_summary(const ZpTorchTrace *t, ZpTraceSummary *s)
{
    *s = t->sum;
    const guint n = t->step_class_s->len;
    double *v = g_new(double, MAX(n, t->step_s->len) + 1);
    for (int c = 0; c <= ZP_KCLASS_N; c++) {
        for (guint i = 0; i < n; i++)
            v[i] = g_array_index(t->step_class_s, ClassTimes, i).s[c];
        s->class_step_s[c] = median(v, n);
    }
    if (t->step_s->len) /* an empty GArray's data is NULL, which memcpy must not see */
        memcpy(v, t->step_s->data, t->step_s->len * sizeof(double));
    s->step_s = median(v, t->step_s->len);
    g_free(v);
}

/* Rows in a fixed order (their identifying text), so that a table is the same whatever the
 * hash table's order. */
static gint cmp_key(gconstpointer a, gconstpointer b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

void *zp_torch_trace_tables(const ZpTorchTrace *t, const char *source)
{
    json_t *tables = json_object(), *sources = json_object();
    for (int c = 0; c < ZP_KCLASS_N; c++) {
        json_t *rows = json_array();
        GList *keys = g_hash_table_get_keys(t->rows[c]);
        GPtrArray *sorted = g_ptr_array_new();
        for (GList *k = keys; k; k = k->next)
            g_ptr_array_add(sorted, k->data);
        g_ptr_array_sort(sorted, cmp_key);
        for (guint i = 0; i < sorted->len; i++) {
            Row *r = g_hash_table_lookup(t->rows[c], g_ptr_array_index(sorted, i));
            json_t *row = json_deep_copy(r->id);
            const guint n = r->time_s->len;
            double *v = g_memdup2(r->time_s->data, n * sizeof(double));
            json_object_set_new(row, "time_s", json_real(median(v, n)));
            json_object_set_new(row, "count", json_integer(n));
            json_array_append_new(rows, row);
            g_free(v);
        }
        g_ptr_array_unref(sorted);
        g_list_free(keys);
        json_object_set_new(tables, zp_kclass_name(c), rows);
        if (json_array_size(rows))
            json_object_set_new(sources, zp_kclass_name(c), json_string(source));
    }
    json_object_set_new(tables, "sources", sources);
    return tables;
}

static gint cmp_unknown(gconstpointer a, gconstpointer b)
{
    const double x = json_number_value(json_object_get(*(json_t *const *)a, "total_s"));
    const double y = json_number_value(json_object_get(*(json_t *const *)b, "total_s"));
    return (x < y) - (x > y);
}

void *zp_torch_trace_unknown(const ZpTorchTrace *t)
{
    GPtrArray *rows = g_ptr_array_new();
    GHashTableIter it;
    gpointer name, value;
    g_hash_table_iter_init(&it, t->unknown);
    while (g_hash_table_iter_next(&it, &name, &value)) {
        const Unknown *u = value;
        g_ptr_array_add(rows, json_pack("{s:s, s:f, s:I}", "name", (const char *)name, "total_s",
                                        u->total_s, "count", (json_int_t)u->count));
    }
    g_ptr_array_sort(rows, cmp_unknown);
    json_t *out = json_array();
    for (guint i = 0; i < rows->len; i++)
        json_array_append_new(out, g_ptr_array_index(rows, i));
    g_ptr_array_unref(rows);
    return out;
}

void zp_torch_trace_collectives(const ZpTorchTrace *t, GArray *kind, GArray *ranks,
                                GArray *bytes, GArray *time_s)
{
    g_array_append_vals(kind, t->coll_kind->data, t->coll_kind->len);
    g_array_append_vals(ranks, t->coll_ranks->data, t->coll_ranks->len);
    g_array_append_vals(bytes, t->coll_bytes->data, t->coll_bytes->len);
    g_array_append_vals(time_s, t->coll_s->data, t->coll_s->len);
}
