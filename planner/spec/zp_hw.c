/* zp_hw: reads hardware profiles strictly: every number present, positive and in a sane
 * range, every key known, so a typo cannot silently turn into a default. */
#include "zp_hw.h"
#include "zp_kclass.h"
#include "zp_util.h"

#include <jansson.h>
#include <math.h>
#include <string.h>

typedef struct {
    const char *key;
    size_t offset;
    double min, max;
    gboolean required;
} HwField;

#define F(k, lo, hi, req) {#k, G_STRUCT_OFFSET(ZpHw, k), lo, hi, req}
/* Ranges: loose physical bounds (no GPU has 1 PB of memory or an exaFLOP of peak). */
static const HwField hw_fields[] = {
    F(gpu_memory_bytes, 1e6, 1e14, TRUE),
    F(peak_fp16_flops, 1e9, 1e17, TRUE),
    F(peak_bf16_flops, 1e9, 1e17, FALSE),
    F(peak_fp32_flops, 1e9, 1e17, TRUE),
    F(hbm_bytes_per_s, 1e8, 1e15, TRUE),
    F(intra_node_bytes_per_s, 1e6, 1e15, TRUE),
    F(intra_node_latency_s, 0, 1, TRUE),
    F(inter_node_bytes_per_s, 1e6, 1e15, TRUE),
    F(inter_node_latency_s, 0, 1, TRUE),
    F(intra_node_bus_bytes_per_s, 1e6, 1e15, FALSE),
    F(inter_node_bus_bytes_per_s, 1e6, 1e15, FALSE),
    F(host_link_bytes_per_s, 1e6, 1e14, TRUE),
    F(cpu_memory_bytes, 1e6, 1e16, TRUE),
    F(nvme_bytes_per_s, 1e6, 1e14, FALSE), /* absent on a measured machine without offload */
    F(nvme_bytes, 1e6, 1e17, FALSE),
    F(runtime_reserve_bytes, 0, 1e12, TRUE),
    F(elementwise_bytes_per_s, 1e6, 1e15, FALSE),
    F(cpu_cores_per_node, 1, 1e5, FALSE),
    F(cpu_adam_bytes_per_s_per_core, 1e6, 1e13, FALSE),
    F(gemm_efficiency_max, 0.01, 1, TRUE),
    F(gemm_half_efficiency_flops, 0, 1e18, TRUE),
    F(compute_capability, 1, 20, FALSE),
};
#undef F

static const char *const hw_keys[] = {"name", "gpu", "gpus_per_node", "notes",
                                      "gpu_memory_bytes", "peak_fp16_flops", "peak_bf16_flops",
                                      "peak_fp32_flops", "hbm_bytes_per_s",
                                      "intra_node_bytes_per_s", "intra_node_latency_s",
                                      "inter_node_bytes_per_s", "inter_node_latency_s",
                                      "intra_node_bus_bytes_per_s",
                                      "inter_node_bus_bytes_per_s",
                                      "host_link_bytes_per_s", "cpu_memory_bytes",
                                      "nvme_bytes_per_s", "nvme_bytes", "runtime_reserve_bytes",
                                      "gemm_efficiency_max", "gemm_half_efficiency_flops",
                                      "elementwise_bytes_per_s", "collective_fit",
                                      "collective_table",
                                      "cpu_cores_per_node", "cpu_adam_bytes_per_s_per_core",
                                      "calibration", "attention", "op_costs",
                                      "kernel_rates", "kernel_tables", "compute_capability",
                                      NULL};

static gboolean copy_name(char *dst, size_t size, const char *src, const char *what,
                          const char *key, GError **error)
{
    if (strlen(src) == 0 || strlen(src) >= size) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: key \"%s\" must be 1 to %zu characters",
                    what, key, size - 1);
        return FALSE;
    }
    g_strlcpy(dst, src, size);
    return TRUE;
}

static gboolean collective_fit(json_t *obj, const char *what, ZpHw *hw, GError **error)
{
    static const char *const kinds[] = {"allreduce", "reduce_scatter", "allgather"};
    static const char *const keys[] = {"base_latency_s", "bus_bytes_per_s", NULL};
    json_t *fit = json_object_get(obj, "collective_fit");
    if (!fit)
        return TRUE;
    json_t *bw = json_object_get(fit, "bus_bytes_per_s");
    if (!json_is_object(fit) || !json_is_object(bw)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY,
                    "%s: key \"collective_fit\" must be an object with \"bus_bytes_per_s\" "
                    "an object", what);
        return FALSE;
    }
    char *inner = g_strdup_printf("%s: collective_fit", what);
    gboolean ok = zp_json_check_keys(fit, inner, keys, error) &&
                  zp_json_get_number(fit, inner, "base_latency_s", TRUE, 0, 1,
                                     &hw->collective_base_latency_s, error);
    for (size_t k = 0; ok && k < G_N_ELEMENTS(kinds); k++)
        ok = zp_json_get_number(bw, inner, kinds[k], TRUE, 1e3, 1e15,
                                &hw->collective_bytes_per_s[k], error);
    g_free(inner);
    hw->has_collective_fit = ok;
    return ok;
}

/* A JSON array of up to `max` increasing positive numbers into out. */
static gboolean number_row(json_t *array, const char *what, const char *key, int max,
                           double *out, int *count, GError **error)
{
    const size_t n = json_array_size(array);
    gboolean ok = json_is_array(array) && n >= 1 && n <= (size_t)max;
    for (size_t i = 0; ok && i < n; i++) {
        json_t *v = json_array_get(array, i);
        out[i] = json_is_number(v) ? json_number_value(v) : 0;
        ok = out[i] > 0 && out[i] < 1e18 && (i == 0 || out[i] > out[i - 1]);
    }
    if (!ok)
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: key \"%s\" must be an array of 1 to %d increasing positive numbers",
                    what, key, max);
    *count = (int)n;
    return ok;
}

static gboolean attention_kernel(json_t *k, const char *what, ZpHwAttention *t, GError **error)
{
    static const char *const keys[] = {"source", "head_dims", "seq_lens", "flops_per_s", NULL};
    const char *source = NULL;
    if (!json_is_object(k)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: must be an object", what);
        return FALSE;
    }
    if (!zp_json_check_keys(k, what, keys, error) ||
        !zp_json_get_string(k, what, "source", TRUE, &source, error) ||
        !number_row(json_object_get(k, "head_dims"), what, "head_dims", ZP_HW_ATTN_MAX_DIMS,
                    t->head_dims, &t->n_head_dims, error) ||
        !number_row(json_object_get(k, "seq_lens"), what, "seq_lens", ZP_HW_ATTN_MAX_SEQS,
                    t->seq_lens, &t->n_seq_lens, error))
        return FALSE;
    json_t *rows = json_object_get(k, "flops_per_s");
    if (!json_is_array(rows) || json_array_size(rows) != (size_t)t->n_head_dims) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: key \"flops_per_s\" must hold one row per head dimension", what);
        return FALSE;
    }
    for (int d = 0; d < t->n_head_dims; d++) {
        json_t *row = json_array_get(rows, (size_t)d);
        gboolean ok = json_is_array(row) && json_array_size(row) == (size_t)t->n_seq_lens;
        for (int i = 0; ok && i < t->n_seq_lens; i++) {
            json_t *v = json_array_get(row, (size_t)i);
            t->flops_per_s[d][i] = json_is_number(v) ? json_number_value(v) : 0;
            ok = t->flops_per_s[d][i] >= 1e9 && t->flops_per_s[d][i] <= 1e17;
        }
        if (!ok) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                        "%s: flops_per_s[%d] must hold %d rates in [1e9, 1e17], one per "
                        "sequence length", what, d, t->n_seq_lens);
            return FALSE;
        }
    }
    t->present = TRUE;
    return TRUE;
}

static gboolean attention_table(json_t *obj, const char *what, ZpHw *hw, GError **error)
{
    static const char *const keys[] = {"default", "kernels", NULL};
    json_t *a = json_object_get(obj, "attention");
    hw->attention_default = ZP_ATTN_EAGER;
    if (!a)
        return TRUE;
    json_t *kernels = json_object_get(a, "kernels");
    char *inner = g_strdup_printf("%s: attention", what);
    const char *fallback = NULL;
    gboolean ok = json_is_object(a) && json_is_object(kernels);
    if (!ok)
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY,
                    "%s: key \"attention\" must be an object with \"kernels\" an object", what);
    ok = ok && zp_json_check_keys(a, inner, keys, error) &&
         zp_json_get_string(a, inner, "default", TRUE, &fallback, error);
    const char *name;
    json_t *k;
    json_object_foreach(ok ? kernels : NULL, name, k)
    {
        char *flag = g_strdup_printf("%s: kernels", inner);
        char *where = g_strdup_printf("%s.kernels.%s", inner, name);
        ZpAttention kind = ZP_ATTN_EAGER;
        ok = zp_attention_parse(name, flag, &kind, error) && kind != ZP_ATTN_EAGER &&
             attention_kernel(k, where, &hw->attention[kind], error);
        if (ok == FALSE && error && !*error)
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: eager has no table", where);
        g_free(flag);
        g_free(where);
        if (!ok)
            break;
    }
    ZpAttention chosen = ZP_ATTN_EAGER;
    if (ok && (!zp_attention_parse(fallback, inner, &chosen, error) ||
               !hw->attention[chosen].present)) {
        if (error && !*error)
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                        "%s: key \"default\" = \"%s\" is not one of its kernels", inner, fallback);
        ok = FALSE;
    }
    hw->attention_default = chosen;
    /* A profile cannot list a kernel its own GPU cannot launch (in fp16, the widest case). */
    for (int k = 1; ok && k < ZP_ATTN_N; k++)
        ok = !hw->attention[k].present ||
             zp_hw_attention_check(hw, (ZpAttention)k, ZP_PREC_FP16, inner, error);
    g_free(inner);
    return ok;
}

gboolean zp_hw_from_json(void *json_object, const char *what, ZpHw *hw, GError **error)
{
    json_t *obj = json_object;
    memset(hw, 0, sizeof *hw);
    const char *name = NULL, *gpu = NULL;
    int64_t gpn = 0;
    if (!zp_json_check_keys(obj, what, hw_keys, error) ||
        !zp_json_get_string(obj, what, "name", TRUE, &name, error) ||
        !zp_json_get_string(obj, what, "gpu", TRUE, &gpu, error) ||
        !copy_name(hw->name, sizeof hw->name, name, what, "name", error) ||
        !copy_name(hw->gpu, sizeof hw->gpu, gpu, what, "gpu", error) ||
        !zp_json_get_int(obj, what, "gpus_per_node", TRUE, 1, 1024, &gpn, error))
        return FALSE;
    hw->gpus_per_node = (int)gpn;
    for (size_t i = 0; i < G_N_ELEMENTS(hw_fields); i++) {
        const HwField *f = &hw_fields[i];
        double *slot = G_STRUCT_MEMBER_P(hw, f->offset);
        if (!zp_json_get_number(obj, what, f->key, f->required, f->min, f->max, slot, error))
            return FALSE;
    }
    json_t *op_costs = json_object_get(obj, "op_costs");
    json_t *coll_table = json_object_get(obj, "collective_table");
    json_t *kernel_rates = json_object_get(obj, "kernel_rates");
    json_t *kernel_tables = json_object_get(obj, "kernel_tables");
    if (!collective_fit(obj, what, hw, error) || !attention_table(obj, what, hw, error) ||
        (kernel_rates && !zp_kernrate_from_json(kernel_rates, what, &hw->kernel_rates, error)) ||
        (coll_table && !zp_colltab_from_json(coll_table, what, &hw->collective_table, error)) ||
        (op_costs && !zp_optable_from_json(op_costs, what, &hw->op_costs, error)) ||
        (kernel_tables && !zp_kclass_tables_check(kernel_tables, what, error)))
        return FALSE;
    json_t *notes = json_object_get(obj, "notes");
    if (notes && !json_is_object(notes)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY,
                    "%s: key \"notes\" must be an object of key -> source", what);
        return FALSE;
    }
    return TRUE;
}

gboolean zp_hw_load(const char *name_or_path, ZpHw *hw, GError **error)
{
    char *path = zp_resolve_spec(name_or_path, "hwprofiles", "--cluster", "cluster", error);
    json_t *root = path ? zp_json_load_object(path, error) : NULL;
    gboolean ok = root && zp_hw_from_json(root, path, hw, error);
    json_decref(root);
    g_free(path);
    return ok;
}

void zp_hw_from_gpu_memory(double gpu_memory_bytes, ZpHw *hw)
{
    memset(hw, 0, sizeof *hw);
    g_snprintf(hw->name, sizeof hw->name, "%.4g-byte GPU", gpu_memory_bytes);
    g_strlcpy(hw->gpu, "unspecified", sizeof hw->gpu);
    hw->gpu_memory_bytes = gpu_memory_bytes;
    hw->gpus_per_node = 1;
}

double zp_hw_peak_flops(const ZpHw *hw, ZpPrecision precision)
{
    const double peaks[] = {
        [ZP_PREC_FP16] = hw->peak_fp16_flops,
        [ZP_PREC_BF16] = hw->peak_bf16_flops,
        [ZP_PREC_FP32] = hw->peak_fp32_flops,
    };
    return peaks[precision];
}

double zp_hw_memory_bytes_per_s(const ZpHw *hw, gboolean optimizer)
{
    return optimizer || hw->elementwise_bytes_per_s <= 0 ? hw->hbm_bytes_per_s
                                                          : hw->elementwise_bytes_per_s;
}

double zp_hw_intra_bus_bytes_per_s(const ZpHw *hw)
{
    return hw->intra_node_bus_bytes_per_s > 0 ? hw->intra_node_bus_bytes_per_s
                                              : hw->intra_node_bytes_per_s;
}

double zp_hw_inter_bus_bytes_per_s(const ZpHw *hw)
{
    return hw->inter_node_bus_bytes_per_s > 0 ? hw->inter_node_bus_bytes_per_s
                                              : hw->inter_node_bytes_per_s;
}

double zp_hw_gemm_efficiency(const ZpHw *hw, double flops)
{
    if (flops <= 0)
        return hw->gemm_efficiency_max;
    return hw->gemm_efficiency_max * flops / (flops + hw->gemm_half_efficiency_flops);
}

/* What each kernel's own entry point accepts, from its source: whether it takes fp32 inputs,
 * and the compute capabilities (x 10) it launches on (0: its source checks none). A kernel is
 * refused where its entry would raise, so no plan prices a step that cannot run. */
typedef struct {
    gboolean fp32;
    int min_sm, max_sm;
    const char *dtypes_source, *gpus_source; /* file, function and its words */
} ZpAttnNeeds;

static const ZpAttnNeeds attn_needs[ZP_ATTN_N] = {
    [ZP_ATTN_EAGER] = {TRUE, 0, 0, NULL, NULL},
    /* flash-attention v1 (4f285b3^, the parent of the FlashAttention-2 release)
     * csrc/flash_attn/fmha_api.cpp mha_fwd and mha_bwd: TORCH_CHECK(is_sm90 || is_sm8x ||
     * is_sm75); q_dtype kFloat16, or kBFloat16 on sm8x and sm90. */
    [ZP_ATTN_FLASH1] = {FALSE, 75, 90,
                        "flash-attention v1 csrc/flash_attn/fmha_api.cpp mha_fwd: q_dtype "
                        "kFloat16 or kBFloat16",
                        "flash-attention v1 csrc/flash_attn/fmha_api.cpp mha_fwd: "
                        "TORCH_CHECK(is_sm90 || is_sm8x || is_sm75)"},
    /* flash_attn/flash_attn_triton.py _flash_attn_forward: assert q.dtype in [torch.float16,
     * torch.bfloat16]; it checks no architecture. */
    [ZP_ATTN_FLASH1_TRITON] = {FALSE, 0, 0,
                               "flash_attn/flash_attn_triton.py _flash_attn_forward: \"Only "
                               "support fp16 and bf16\"",
                               NULL},
    /* csrc/flash_attn/flash_api.cpp mha_fwd and mha_bwd: is_sm8x_min = cc_major >= 8;
     * q_dtype kFloat16 or kBFloat16. */
    [ZP_ATTN_FLASH2] = {FALSE, 80, 0,
                        "csrc/flash_attn/flash_api.cpp mha_fwd: \"FlashAttention only support "
                        "fp16 and bf16 data type\"",
                        "csrc/flash_attn/flash_api.cpp mha_fwd: \"FlashAttention only supports "
                        "Ampere GPUs or newer.\""},
    /* hopper/flash_api.cpp mha_fwd: dprops->major >= 8; fp16, bf16 or (sm90) fp8_e4m3;
     * mha_bwd: fp16 or bf16 only. Its sm80 path came after the Hopper-only release; no A100
     * profile has a rate for it, so it is refused there for want of one. */
    [ZP_ATTN_FLASH3] = {FALSE, 80, 0,
                        "hopper/flash_api.cpp mha_bwd: q_type kFloat16 or kBFloat16 (fp8 in the "
                        "forward only)",
                        "hopper/flash_api.cpp mha_fwd: \"FlashAttention only supports Ampere "
                        "GPUs or newer.\""},
    /* PyTorch aten/src/ATen/native/transformers/cuda/sdp_utils.cpp
     * can_use_mem_efficient_attention: kHalf and kFloat (kBFloat16 too from sm80);
     * check_mem_efficient_hardware_support: sm50 to sm121. */
    [ZP_ATTN_MEM_EFFICIENT] = {TRUE, 50, 121,
                               "PyTorch sdp_utils.cpp can_use_mem_efficient_attention: kHalf, "
                               "kFloat, kBFloat16 from sm80",
                               "PyTorch sdp_utils.cpp check_mem_efficient_hardware_support: "
                               "sm50 to sm121"},
};

/* The profile's compute capability x 10 (90 for 9.0); 0 when the profile has none. */
static int hw_sm(const ZpHw *hw)
{
    return hw ? (int)lround(hw->compute_capability * 10) : 0;
}

/* zp_hw_attention_check, naming the kernel as the user did (`shown`). */
static gboolean attention_check(const ZpHw *hw, ZpAttention kernel, const char *shown,
                                ZpPrecision precision, const char *flag, GError **error)
{
    const ZpAttnNeeds *n = &attn_needs[kernel];
    const int sm = hw_sm(hw);
    if (precision == ZP_PREC_FP32 && !n->fp32) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: %s takes only fp16 or bf16 inputs, not fp32 (%s)%s", flag, shown,
                    n->dtypes_source,
                    g_str_has_suffix(flag, "--attention")
                        ? "; use --attention eager, or leave it out for PyTorch SDPA's choice"
                        : "");
        return FALSE;
    }
    /* bf16 needs sm80's tensor cores: check_dtypes_low_precision (flash) and
     * can_use_mem_efficient_attention both take kBFloat16 only where dprop->major >= 8. */
    const int need = precision == ZP_PREC_BF16 && kernel != ZP_ATTN_EAGER && n->min_sm < 80
                         ? 80 : n->min_sm;
    if (sm > 0 && ((need > 0 && sm < need) || (n->max_sm > 0 && sm > n->max_sm))) {
        char range[64];
        if (n->max_sm > 0)
            g_snprintf(range, sizeof range, "%d.%d to %d.%d", need / 10, need % 10,
                       n->max_sm / 10, n->max_sm % 10);
        else
            g_snprintf(range, sizeof range, "%d.%d or newer", need / 10, need % 10);
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: %s in %s needs compute capability %s (%s); %s's %s is %d.%d", flag,
                    shown, zp_precision_name(precision), range,
                    sm < need && need > n->min_sm ? "bf16 needs sm80: PyTorch sdp_utils.cpp "
                                                    "check_dtypes_low_precision and "
                                                    "can_use_mem_efficient_attention"
                                                  : n->gpus_source,
                    hw->name, hw->gpu,
                    sm / 10, sm % 10);
        return FALSE;
    }
    return TRUE;
}

gboolean zp_hw_attention_check(const ZpHw *hw, ZpAttention kernel, ZpPrecision precision,
                               const char *flag, GError **error)
{
    return attention_check(hw, kernel, zp_attention_name(kernel), precision, flag, error);
}

ZpAttention zp_hw_attention_default(const ZpHw *hw, ZpPrecision precision, char *why,
                                    size_t why_size)
{
    /* sdp_utils.cpp select_sdp_backend tries flash, then memory-efficient, then math (cuDNN
     * only where a user ranks it first). Flash takes fp16/bf16 only
     * (check_dtypes_low_precision) on sm80 and later (check_flash_attention_hardware_support):
     * the profile's default is that kernel. Where flash cannot run, memory-efficient can
     * (fp32 from sm50): it is the choice where the profile has its rate; without a rate it is
     * priced, and its memory counted, as eager (math: batched GEMMs and a softmax). */
    const gboolean fp32 = precision == ZP_PREC_FP32;
    if (!fp32 && hw && hw->attention_default != ZP_ATTN_EAGER) {
        g_snprintf(why, why_size, "%s's default", hw->name);
        return hw->attention_default;
    }
    /* A profile with neither a fused kernel nor a compute capability (a CPU's, a calibrated
     * machine's) is no GPU whose SDPA choice we know: its own default, as before. */
    if (hw && hw->attention_default == ZP_ATTN_EAGER && hw_sm(hw) == 0 &&
        !hw->attention[ZP_ATTN_MEM_EFFICIENT].present) {
        g_snprintf(why, why_size, "%s's default: it lists no fused kernel", hw->name);
        return ZP_ATTN_EAGER;
    }
    const int sm = hw_sm(hw);
    if (!fp32 && hw && (sm == 0 || sm >= 80) &&
        !hw->attention[ZP_ATTN_MEM_EFFICIENT].present) {
        /* SDPA would run flash here (or cuDNN's), but the profile rates none of them. */
        g_snprintf(why, why_size, "%s rates none of the fused kernels SDPA runs here: priced "
                   "and sized as eager, batched GEMMs and softmax, the s x s scores kept",
                   hw->name);
        return ZP_ATTN_EAGER;
    }
    const char *cause =
        fp32 ? "fp32: SDPA's flash takes only fp16/bf16 (sdp_utils.cpp "
               "check_dtypes_low_precision), so it runs its memory-efficient kernel"
        : sm > 0 && sm < 80 ? "SDPA's flash needs sm80 (sdp_utils.cpp "
                              "check_flash_attention_hardware_support), so it runs its "
                              "memory-efficient kernel"
                            : "SDPA's next choice after flash, its memory-efficient kernel";
    if (hw && hw->attention[ZP_ATTN_MEM_EFFICIENT].present &&
        zp_hw_attention_check(hw, ZP_ATTN_MEM_EFFICIENT, precision, "attention", NULL)) {
        g_snprintf(why, why_size, "%s", cause);
        return ZP_ATTN_MEM_EFFICIENT;
    }
    /* fp32 on a GPU: the kernel SDPA runs, without a rate. Its activations are a fused
     * kernel's (output and log-sum-exp, no s x s scores: mem_eff_attention keeps only those
     * for backward); its time is eager's work, as no published fp32 figure rates it. fp16
     * below sm80 keeps eager so that those outputs stay as they were. */
    if (fp32 && hw && sm > 0 &&
        zp_hw_attention_check(hw, ZP_ATTN_MEM_EFFICIENT, precision, "attention", NULL)) {
        g_snprintf(why, why_size, "%s; %s has no rate for it: sized as a fused kernel (no s x s "
                   "scores kept), priced as eager's work, batched GEMMs and softmax passes "
                   "(pessimistic)", cause, hw->name);
        return ZP_ATTN_MEM_EFFICIENT;
    }
    if (hw)
        g_snprintf(why, why_size, "%s; %s has no rate for it: priced and sized as eager, batched "
                   "GEMMs and softmax, the s x s scores kept", cause, hw->name);
    else
        g_snprintf(why, why_size, "%s; no --cluster and so no rate for it: sized as eager, "
                   "the s x s scores kept", cause);
    return ZP_ATTN_EAGER;
}

gboolean zp_hw_attention_choose(const ZpHw *hw, const char *text, ZpPrecision precision,
                                const char *flag, ZpAttention *out, GError **error)
{
    if (!text) {
        char why[512];
        *out = hw || precision == ZP_PREC_FP32 ? zp_hw_attention_default(hw, precision, why,
                                                                          sizeof why)
                                               : ZP_ATTN_EAGER;
        return TRUE;
    }
    if (strcmp(text, "flash") == 0) {
        *out = hw ? hw->attention_default : ZP_ATTN_FLASH2;
        if (*out == ZP_ATTN_EAGER) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                        "%s: %s lists no fused attention kernel in its \"attention\" table",
                        flag, hw->name);
            return FALSE;
        }
        char *shown = hw ? g_strdup_printf("flash (%s's %s)", hw->name, zp_attention_name(*out))
                         : g_strdup("flash (flash2)");
        const gboolean ok = attention_check(hw, *out, shown, precision, flag, error);
        g_free(shown);
        return ok;
    }
    return zp_attention_parse(text, flag, out, error) &&
           zp_hw_attention_runs(hw, *out, precision, flag, error);
}

gboolean zp_hw_attention_runs(const ZpHw *hw, ZpAttention kernel, ZpPrecision precision,
                              const char *flag, GError **error)
{
    if (!zp_hw_attention_check(hw, kernel, precision, flag, error))
        return FALSE;
    if (hw && kernel != ZP_ATTN_EAGER && !hw->attention[kernel].present &&
        !zp_attention_eager_work_unrated(kernel)) {
        /* Offer only what runs here in this dtype. */
        GString *listed = g_string_new("eager");
        if (hw->attention_default != ZP_ATTN_EAGER &&
            zp_hw_attention_check(hw, hw->attention_default, precision, flag, NULL))
            g_string_append(listed, ", flash");
        for (int k = 1; k < ZP_ATTN_N; k++)
            if ((hw->attention[k].present || zp_attention_eager_work_unrated((ZpAttention)k)) &&
                zp_hw_attention_check(hw, (ZpAttention)k, precision, flag, NULL))
                g_string_append_printf(listed, ", %s", zp_attention_name((ZpAttention)k));
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: %s has no rate for '%s' in its attention table (choose from %s)", flag,
                    hw->name, zp_attention_name(kernel), listed->str);
        g_string_free(listed, TRUE);
        return FALSE;
    }
    return TRUE;
}

gboolean zp_hw_attention_unrated(const ZpHw *hw, ZpAttention kernel)
{
    return zp_attention_eager_work_unrated(kernel) && (!hw || !hw->attention[kernel].present);
}

/* Interpolates row d of a table in log2 of the sequence length, clamped at both ends. */
static double attention_row_rate(const ZpHwAttention *t, int d, double seq_len)
{
    const int n = t->n_seq_lens;
    if (seq_len <= t->seq_lens[0])
        return t->flops_per_s[d][0];
    for (int i = 1; i < n; i++)
        if (seq_len <= t->seq_lens[i]) {
            const double x = log2(seq_len / t->seq_lens[i - 1]) /
                             log2(t->seq_lens[i] / t->seq_lens[i - 1]);
            return t->flops_per_s[d][i - 1] + x * (t->flops_per_s[d][i] - t->flops_per_s[d][i - 1]);
        }
    return t->flops_per_s[d][n - 1];
}

double zp_hw_attention_flops_per_s(const ZpHw *hw, ZpAttention attention, double head_dim,
                                   double seq_len)
{
    const ZpHwAttention *t = &hw->attention[attention];
    if (!t->present)
        return 0;
    int nearest = 0;
    for (int d = 1; d < t->n_head_dims; d++)
        if (fabs(t->head_dims[d] - head_dim) < fabs(t->head_dims[nearest] - head_dim))
            nearest = d;
    /* 12 b s^2 h model FLOPs per forward and backward against the table's 3.5 x 2 b s^2 h. */
    return attention_row_rate(t, nearest, seq_len) * 12.0 / 7.0;
}

double zp_hw_compute_time_s(const ZpHw *hw, double peak_flops, double flops, double gemm_flops,
                            double attn_flops, double attn_flops_per_s, double mem_bytes,
                            gboolean optimizer)
{
    const double gemm = flops - attn_flops;
    const double math_s = gemm > 0 ? gemm / (peak_flops * zp_hw_gemm_efficiency(hw, gemm_flops))
                                   : 0;
    const double attn_s = attn_flops > 0 ? attn_flops / attn_flops_per_s : 0;
    return math_s + attn_s + mem_bytes / zp_hw_memory_bytes_per_s(hw, optimizer);
}
