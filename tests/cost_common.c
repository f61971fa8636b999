/* cost_common: the cost-model tests' synthetic table, loaders, tiny plan and step time
 * (cost_common.h). */
#include "cost_common.h"

/* A synthetic table: GEMM rates rising with size and falling with aspect ratio (a 4 x 3 grid),
 * every elementwise class at its own rate, eager attention flat. */
ZpOpTable synthetic_table(void)
{
    ZpOpTable t = {.present = TRUE, .launch_s = 1e-6, .launch_stream_s = 1e-6,
                   .optimizer_bytes_per_s = 4e9,
                   .contention = 1.5, .has_eager_attention = TRUE};
    g_strlcpy(t.source, "synthetic (test_cost)", sizeof t.source);
    for (int f = 0; f < ZP_GEMM_N; f++) {
        ZpGrid *g = &t.gemm[f];
        *g = (ZpGrid){.nx = 4, .ny = 3, .x = {12, 18, 24, 30}, .y = {0, 2, 4}};
        for (int i = 0; i < g->nx; i++)
            for (int j = 0; j < g->ny; j++)
                g->v[i][j] = (1 + f) * 1e9 * (i + 1) / (j + 1);
    }
    t.attn_levels = 1, t.attn_log2_heads[0] = 3;
    for (int p = 0; p < 2; p++) {
        t.eager_attention[0][p] = (ZpGrid){.nx = 1, .ny = 1, .x = {5}, .y = {4},
                                           .v = {{p ? 2e9 : 3e9}}};
        t.attn_fixed_s[p] = t.launch_s;
    }
    for (int c = 0; c < ZP_EW_N; c++)
        t.ew_bytes_per_s[c] = (c + 1) * 1e9;
    /* A whole-op time at a shape no model here has: read back, never used. */
    t.n_ops = 1;
    t.ops[0] = (ZpOpTime){.op = "block_fwd", .shape = "b1 s1 (none)", .ranks = 3, .time_s = 9};
    return t;
}

void load_hw(const char *name, ZpHw *hw)
{
    GError *error = NULL;
    g_assert_true(zp_hw_load(name, hw, &error));
    g_assert_no_error(error);
}

void load_model(const char *name, ZpModel *m)
{
    GError *error = NULL;
    g_assert_true(zp_model_load(name, m, &error));
    g_assert_no_error(error);
}

/* tiny on the H100 profile, with the synthetic op table when `table`, and a plan of `stage` on
 * `dp` ranks at micro-batch `micro_batch` (0: the default). */
void tiny_setup(ZpHw *hw, ZpModel *m, ZpPlan *p, int stage, int dp, int micro_batch,
                gboolean table)
{
    load_hw("dgx-h100", hw);
    load_model("tiny", m);
    hw->kernel_rates.present = FALSE; /* the op table or the roofline (test_kernrate: the rates) */
    if (table)
        hw->op_costs = synthetic_table();
    zp_plan_defaults(p, stage, dp, 1);
    if (micro_batch)
        p->micro_batch = micro_batch;
}

double step_s(const ZpModel *m, const ZpPlan *p, const ZpHw *hw)
{
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(m, p, &error);
    g_assert_no_error(error);
    const SimOptions options = {.mode = SIM_MODE_FOLDED};
    SimResult *r = sim_engine_run(s, hw, &options, &error);
    g_assert_no_error(error);
    const double t = r->step_time_s;
    g_assert_nonnull(strstr(r->cost_model, "op table"));
    sim_result_free(r);
    zp_sched_free(s);
    return t;
}
