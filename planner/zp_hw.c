/* zp_hw: reads hardware profiles strictly: every number present, positive and in a sane
 * range, every key known, so a typo cannot silently turn into a default. */
#include "zp_hw.h"
#include "zp_util.h"

#include <jansson.h>
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
    F(host_link_bytes_per_s, 1e6, 1e14, TRUE),
    F(cpu_memory_bytes, 1e6, 1e16, TRUE),
    F(nvme_bytes_per_s, 1e6, 1e14, FALSE), /* absent on a measured machine without offload */
    F(nvme_bytes, 1e6, 1e17, FALSE),
    F(runtime_reserve_bytes, 0, 1e12, TRUE),
    F(elementwise_bytes_per_s, 1e6, 1e15, FALSE),
    F(gemm_efficiency_max, 0.01, 1, TRUE),
    F(gemm_half_efficiency_flops, 0, 1e18, TRUE),
};
#undef F

static const char *const hw_keys[] = {"name", "gpu", "gpus_per_node", "notes",
                                      "gpu_memory_bytes", "peak_fp16_flops", "peak_bf16_flops",
                                      "peak_fp32_flops", "hbm_bytes_per_s",
                                      "intra_node_bytes_per_s", "intra_node_latency_s",
                                      "inter_node_bytes_per_s", "inter_node_latency_s",
                                      "host_link_bytes_per_s", "cpu_memory_bytes",
                                      "nvme_bytes_per_s", "nvme_bytes", "runtime_reserve_bytes",
                                      "gemm_efficiency_max", "gemm_half_efficiency_flops",
                                      "elementwise_bytes_per_s", "collective_fit",
                                      "calibration", NULL};

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
    if (!collective_fit(obj, what, hw, error))
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

double zp_hw_gemm_efficiency(const ZpHw *hw, double flops)
{
    if (flops <= 0)
        return hw->gemm_efficiency_max;
    return hw->gemm_efficiency_max * flops / (flops + hw->gemm_half_efficiency_flops);
}
