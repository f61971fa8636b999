/* zp_optable: the op-level cost table of a hardware profile ("op_costs"): measured rates of the
 * very kernels a step runs — a GEMM efficiency surface per GEMM form, eager attention, every
 * elementwise op class, the optimizer, a launch cost and the compute/communication contention. */
#ifndef ZP_OPTABLE_H
#define ZP_OPTABLE_H

#include "zp_colltab.h"

#include <glib.h>

/* Heads levels an eager-attention table may hold. */
#define ZP_ATTN_MAX_LEVELS 4

/* A rate on a 2-D grid, bilinear between grid points and clamped at the edges: exact at the
 * points, and between two neighbours it moves monotonically from one value to the other. */
#define ZP_GRID_MAX_X 16
#define ZP_GRID_MAX_Y 8
typedef struct {
    int nx, ny;
    double x[ZP_GRID_MAX_X], y[ZP_GRID_MAX_Y]; /* increasing */
    double v[ZP_GRID_MAX_X][ZP_GRID_MAX_Y];    /* v[i][j] at (x[i], y[j]), all > 0 */
} ZpGrid;

/* The three GEMMs of a linear layer, as zreal issues them (layouts and operand dtypes fixed
 * per form, see real_gpt.c): y = x W, dx = dy W^T, dW += x^T dy. */
typedef enum { ZP_GEMM_FORWARD, ZP_GEMM_INPUT_GRAD, ZP_GEMM_WEIGHT_GRAD, ZP_GEMM_N } ZpGemmForm;

/* Whose GEMM: a block linear's, or the LM head's (its own layouts and dtypes, real_gpt_ends.c),
 * the latter apart where a dimension is no multiple of 8 (a vocabulary such as GPT-2's 50,257,
 * for which cuBLAS has only its slower kernels). */
typedef enum { ZP_GEMM_BLOCK, ZP_GEMM_HEAD, ZP_GEMM_HEAD_ODD, ZP_GEMM_VARIANTS } ZpGemmVariant;

/* The variant of a GEMM of that kind and shape. */
ZpGemmVariant zp_gemm_variant(gboolean head, double m, double n, double k);

/* Elementwise op classes: each kernel of a step is one of these, costed by the bytes it really
 * moves (as the backends in real/ read and write them) at its class's measured rate. */
typedef enum {
    ZP_EW_NORM_FWD,  /* LayerNorm / RMSNorm forward */
    ZP_EW_NORM_BWD,  /* their backward */
    ZP_EW_ACT_FWD,   /* GELU or SwiGLU forward */
    ZP_EW_ACT_BWD,   /* their backward */
    ZP_EW_ADD,       /* residual add */
    ZP_EW_BIAS_FWD,  /* bias add */
    ZP_EW_BIAS_BWD,  /* bias gradient (column sums) */
    ZP_EW_ROPE,      /* rotary embedding, forward or backward */
    ZP_EW_CONVERT,   /* bf16 <-> fp32 conversions, rounding, copies, fills, accumulations */
    ZP_EW_LOSS,      /* softmax cross-entropy over the vocabulary, with its gradient */
    ZP_EW_EMBED,     /* embedding lookup or its scatter-add backward */
    ZP_EW_N
} ZpEwClass;

/* One compute op timed whole (every kernel in real_gpt.c's order, each reading what the one
 * before wrote) at one shape, while `ranks` ranks ran the same sequence at once on the machine:
 * zp_cost takes it before the sum of the op's kernels. */
#define ZP_OPTABLE_MAX_OPS 256
#define ZP_OPTABLE_SHAPE_LEN 160
typedef struct {
    char op[16];                       /* zp_sched_compute_name: "block_fwd", "head", ... */
    char shape[ZP_OPTABLE_SHAPE_LEN];  /* zp_cost_op_shape of the model and plan (the
                                        * optimizer's: zp_cost_optimizer_shape) */
    int ranks;                         /* ranks running at once on the machine */
    double time_s;
} ZpOpTime;

/* One GEMM timed at its exact shape, as real_gpt issues it (real_microbench's model-shaped
 * GEMMs): zp_cost takes it before the GEMM surface, which is timed at powers of two in a
 * block linear's layouts and dtypes and so misses the LM head's (a vocabulary such as GPT-2's
 * 50,257 is no multiple of 8, and dwte multiplies two fp32 operands). */
#define ZP_OPTABLE_MAX_GEMM_SHAPES 256
typedef struct {
    int form;       /* ZpGemmForm */
    gboolean head;  /* the LM head's GEMM (ZpKernel head) */
    double m, n, k;
    double time_s;  /* timed alone, its launch included */
} ZpGemmShape;

typedef struct {
    gboolean present;
    char source[256];
    char backend[16];                    /* zreal's backend the runs measured ("cpu", "cuda");
                                          * "" when not recorded */
    double launch_s;                     /* fixed cost of one kernel launch or dispatch, a
                                          * kernel timed alone (its rates are net of it) */
    double launch_stream_s;              /* a kernel's fixed cost among others in a stream,
                                          * its launch overlapping the one before; launch_s
                                          * where not measured */
    ZpGrid gemm[ZP_GEMM_N];              /* FLOP/s over x = log2(m n k), y = log2(aspect) */
    gboolean has_gemm_head;              /* "gemm_head", "gemm_head_odd" (optional, both) */
    ZpGrid gemm_head[2][ZP_GEMM_N];      /* the head's, aligned and odd, as `gemm` */
    int n_gemm_shapes;                   /* "gemm_shapes" (optional) */
    ZpGemmShape gemm_shapes[ZP_OPTABLE_MAX_GEMM_SHAPES];
    /* Eager attention as zreal runs it (real_cuda_attention.cu, real_cpu.c): one call a
     * micro-batch, its samples one after another, each sample's heads at once. A call of b
     * samples takes attn_fixed_s[pass] + b x (one sample's model FLOPs) / rate, the rate a
     * sample's (4 s^2 h per forward, 8 backward, h its heads x head dimension) read from the
     * grid of the heads level at or around the call's heads per sample (linear in log2 heads
     * between levels, clamped outside): zp_optable_attention_s. */
    gboolean has_eager_attention;
    int attn_levels;                                /* heads levels, 1 to ZP_ATTN_MAX_LEVELS */
    double attn_log2_heads[ZP_ATTN_MAX_LEVELS];     /* increasing; 3 (8 heads) without a
                                                     * "log2_heads" axis, the grid's old heads */
    ZpGrid eager_attention[ZP_ATTN_MAX_LEVELS][2];  /* per level, forward and backward: a
                                                     * sample's FLOP/s over x = log2 seq,
                                                     * y = log2 head dimension */
    double attn_fixed_s[2];                         /* a call's fixed time, forward and
                                                     * backward; launch_s without "fixed_s" */
    double ew_bytes_per_s[ZP_EW_N];
    double optimizer_bytes_per_s;        /* in the schedule's optimizer bytes */
    double contention;                   /* >= 1: compute slowdown while a collective runs */
    int n_ops;                           /* whole-op times ("ops", optional) */
    ZpOpTime ops[ZP_OPTABLE_MAX_OPS];
    /* "copy" (optional; copy.n == 0 without): the time of one copy of an array against its
     * bytes, every rank copying at once (the collectives' own copies: zp_cost). A plain
     * memory copy streams where the convert class's kernels widen or round each element:
     * on this host gpt2-124m's 248 MB copied at 20.3 GB/s moved (20.8 with 2 ranks at once),
     * where that class's rate was 12.0. */
    ZpCollRow copy;
} ZpOpTable;

/* Parses the "op_costs" object (a json_t *) into t; `what` names the file in messages. Every
 * key is required but "eager_attention" (its "log2_heads" axis and "fixed_s" optional: one
 * level of 8 heads and the launch without them; with the axis, "forward" and "backward" are
 * [heads][seq][head_dim] arrays), "launch_stream_s" (default launch_s), "gemm_shapes" (an
 * array of {form, head, m, n, k, time_s}, none by default), "gemm_head" and "gemm_head_odd"
 * (both or neither, each as "gemm"), "contention" (default 1), "ops"
 * (an array of
 * {op, shape, ranks, time_s}, none by default) and "copy" ({bytes, time_s}, none by
 * default); every rate and time positive. */
gboolean zp_optable_from_json(void *json, const char *what, ZpOpTable *t, GError **error);

/* The table as an "op_costs" object (a new json_t *), which zp_optable_from_json reads back
 * to the same table. */
void *zp_optable_to_json(const ZpOpTable *t);

/* A GEMM's rate on its variant's surface (the block surface for a head's where the table has
 * none). */
double zp_optable_gemm_rate(const ZpOpTable *t, int form, gboolean head, double m, double n,
                            double k);

/* The GEMM timed at exactly this form, kind and shape; NULL when none was. */
const ZpGemmShape *zp_optable_gemm_shape(const ZpOpTable *t, int form, gboolean head, double m,
                                         double n, double k);

/* The whole-op time of op `op` at `shape` with `ranks` ranks at once; NULL when none. */
const ZpOpTime *zp_optable_op(const ZpOpTable *t, const char *op, const char *shape, int ranks);

/* One eager-attention call's time: `flops` the call's model FLOPs (every sample's),
 * `backward` its pass, at log2 of the sequence, head dimension and heads per sample. */
double zp_optable_attention_s(const ZpOpTable *t, int backward, double flops, double log2_seq,
                              double log2_head_dim, double log2_heads);

/* What a kernel saves of its fixed cost in a stream of others, launch_s - launch_stream_s
 * (negative where kernels back to back wait on the host's issue): a time the table gives for
 * a kernel timed alone, less this, is its time in a step. */
double zp_optable_stream_saving_s(const ZpOpTable *t);

/* The grid's value at (x, y): bilinear inside, clamped to the edges outside. */
double zp_grid_at(const ZpGrid *g, double x, double y);

/* Where a GEMM lies on the surface: log2(m n k) and log2(longest / shortest dimension). */
void zp_gemm_coords(double m, double n, double k, double *log2_mnk, double *log2_aspect);

const char *zp_gemm_form_name(ZpGemmForm form);

/* Bytes an elementwise class's kernel moves per element as zp_cost_kernels counts them (the
 * rotary kernel's elements are the rotated q and k values, the activation's its outputs);
 * `gated` for SwiGLU's activation. */
double zp_ew_class_bytes_per_elem(ZpEwClass c, gboolean gated);
const char *zp_ew_class_name(ZpEwClass ew);

#endif
