/* zp_kernrate: parsing a profile's per-class kernel rates and the times they give: the GEMM
 * surface (waves of tiles under a best rate), the memory curve, the interference factor. */
#include "zp_kernrate.h"
#include "zp_util.h"

#include <jansson.h>
#include <math.h>
#include <string.h>

const char *zp_link_class_name(ZpLinkClass link)
{
    static const char *const names[ZP_LINK_N] = {"nvlink", "network"};
    return link < ZP_LINK_N ? names[link] : "?";
}

static gboolean parse_gemm(json_t *g, const char *what, ZpKernRates *r, GError **error)
{
    static const char *const keys[] = {"best_flops_per_s", "sms", "tile_m", "tile_n", "tile_k",
                                       NULL};
    char *inner = g_strdup_printf("%s: kernel_rates.gemm", what);
    const gboolean ok =
        json_is_object(g) && zp_json_check_keys(g, inner, keys, error) &&
        zp_json_get_number(g, inner, "best_flops_per_s", TRUE, 1e9, 1e18,
                           &r->gemm_best_flops_per_s, error) &&
        zp_json_get_number(g, inner, "sms", TRUE, 1, 1e4, &r->sms, error) &&
        zp_json_get_number(g, inner, "tile_m", TRUE, 1, 4096, &r->tile_m, error) &&
        zp_json_get_number(g, inner, "tile_n", TRUE, 1, 4096, &r->tile_n, error) &&
        zp_json_get_number(g, inner, "tile_k", TRUE, 1, 4096, &r->tile_k, error);
    if (!json_is_object(g))
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: must be an object", inner);
    g_free(inner);
    r->has_gemm = ok;
    return ok;
}

/* [[min_bytes, efficiency], ...]: min_bytes strictly decreasing, the last 0; efficiency in
 * (0, 1]. */
static gboolean parse_memory(json_t *a, const char *what, ZpKernRates *r, GError **error)
{
    const size_t n = json_is_array(a) ? json_array_size(a) : 0;
    if (n < 1 || n > ZP_KERNRATE_MAX_STEPS) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY,
                    "%s: kernel_rates.memory_efficiency must be an array of 1 to %d "
                    "[min_bytes, efficiency] pairs", what, ZP_KERNRATE_MAX_STEPS);
        return FALSE;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *p = json_array_get(a, i);
        const double lo = json_number_value(json_array_get(p, 0));
        const double eff = json_number_value(json_array_get(p, 1));
        const gboolean last = i + 1 == n;
        if (!json_is_array(p) || json_array_size(p) != 2 || !json_is_number(json_array_get(p, 0)) ||
            !json_is_number(json_array_get(p, 1)) || !(eff > 0 && eff <= 1) ||
            !(lo >= 0 && lo < 1e15) || (last && lo != 0) ||
            (i > 0 && !(lo < r->memory_min_bytes[i - 1]))) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                        "%s: kernel_rates.memory_efficiency[%zu] must be [min_bytes, efficiency]"
                        " with min_bytes decreasing to 0 and efficiency in (0, 1]", what, i);
            return FALSE;
        }
        r->memory_min_bytes[i] = lo;
        r->memory_efficiency[i] = eff;
    }
    r->n_memory = (int)n;
    return TRUE;
}

static gboolean parse_interference(json_t *o, const char *what, ZpKernRates *r, GError **error)
{
    static const char *const keys[] = {"nvlink", "network", NULL};
    char *inner = g_strdup_printf("%s: kernel_rates.interference", what);
    gboolean ok = json_is_object(o) && zp_json_check_keys(o, inner, keys, error);
    for (int l = 0; ok && l < ZP_LINK_N; l++)
        ok = zp_json_get_number(o, inner, zp_link_class_name(l), TRUE, 0, 0.9,
                                &r->processor_usage[l], error);
    if (!json_is_object(o))
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: must be an object", inner);
    g_free(inner);
    return ok;
}

gboolean zp_kernrate_from_json(void *json, const char *what, ZpKernRates *r, GError **error)
{
    static const char *const keys[] = {"gemm", "memory_efficiency", "launch_host_s",
                                       "interference", NULL};
    json_t *o = json;
    memset(r, 0, sizeof *r);
    char *inner = g_strdup_printf("%s: kernel_rates", what);
    if (!json_is_object(o)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s must be an object", inner);
        g_free(inner);
        return FALSE;
    }
    json_t *g = json_object_get(o, "gemm"), *m = json_object_get(o, "memory_efficiency");
    json_t *i = json_object_get(o, "interference");
    gboolean ok = zp_json_check_keys(o, inner, keys, error) &&
                  (!g || parse_gemm(g, what, r, error)) && parse_memory(m, what, r, error) &&
                  zp_json_get_number(o, inner, "launch_host_s", FALSE, 0, 1e-2,
                                     &r->launch_host_s, error);
    if (ok && !i) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: missing key \"interference\"", inner);
        ok = FALSE;
    }
    ok = ok && parse_interference(i, what, r, error);
    g_free(inner);
    r->present = ok;
    return ok;
}

double zp_kernrate_memory_efficiency(const ZpKernRates *r, double bytes)
{
    for (int i = 0; i < r->n_memory; i++)
        if (bytes >= r->memory_min_bytes[i])
            return r->memory_efficiency[i];
    return r->n_memory > 0 ? r->memory_efficiency[r->n_memory - 1] : 1.0;
}

double zp_kernrate_memory_s(const ZpKernRates *r, double hbm_bytes_per_s, double bytes,
                            double launches)
{
    if (bytes <= 0)
        return 0;
    const double each = bytes / MAX(launches, 1.0);
    return bytes / (hbm_bytes_per_s * zp_kernrate_memory_efficiency(r, each));
}

double zp_kernrate_gemm_s(const ZpKernRates *r, double hbm_bytes_per_s, double batch, double m,
                          double n, double k, double bytes)
{
    const double tiles = batch * ceil(m / r->tile_m) * ceil(n / r->tile_n);
    const double waves = ceil(tiles / r->sms);
    const double k_padded = ceil(k / r->tile_k) * r->tile_k;
    const double sm_flops_per_s = r->gemm_best_flops_per_s / r->sms;
    const double tile_s = 2 * r->tile_m * r->tile_n * k_padded / sm_flops_per_s;
    return MAX(waves * tile_s, zp_kernrate_memory_s(r, hbm_bytes_per_s, bytes, 1));
}

double zp_kernrate_interference(const ZpKernRates *r, ZpLinkClass link, int overlapping)
{
    if (!r->present || overlapping <= 0 || link >= ZP_LINK_N)
        return 1.0;
    return 1.0 / (1.0 - r->processor_usage[link]);
}
