/* test_real_model: zreal's GPT-2 model against double-precision references and finite
 * differences (layout, initialisation, errors, gradients, bit-identical recompute, module by
 * module blocks, memory, training), and the op sequence's rows. */
#include "real_model_common.h"

static void fx_adam(Fixture *fx, int64_t step, float lr)
{
    RealAdamHyper hyper = {.lr = lr, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                           .weight_decay = 0.0f, .grad_scale = 1.0f, .step = step};
    for (int u = 0; u < fx->n_units; u++)
        fx->be->adam_step(fx->be, &hyper, fx->elems[u], fx->master[u], fx->adam_m[u],
                          fx->adam_v[u], fx->grads[u], fx->params[u]);
}

/* ---- (c) checkpointing and recompute reproduce the gradients bit for bit ---- */

static void test_recompute_bit_identical(void)
{
    RealGptDims dims = real_gpt_dims_make(3, 32, 4, 16, 48, 2);
    Fixture save, ckpt;
    fx_init(&save, &dims, 3);
    fx_init(&ckpt, &dims, 3);
    int *tokens, *targets;
    make_batch(&dims, 5, 40, &tokens, &targets);
    /* Two micro-batches, so accumulation into non-zero bf16 gradients is covered too. */
    float loss_save = fx_micro_batch(&save, tokens, targets, FALSE, FALSE);
    float loss_ckpt = fx_micro_batch(&ckpt, tokens, targets, TRUE, TRUE);
    g_assert_cmpfloat(loss_save, ==, loss_ckpt);
    g_free(tokens);
    g_free(targets);
    make_batch(&dims, 5, 42, &tokens, &targets);
    loss_save = fx_micro_batch(&save, tokens, targets, FALSE, TRUE);
    loss_ckpt = fx_micro_batch(&ckpt, tokens, targets, TRUE, FALSE);
    g_assert_cmpfloat(loss_save, ==, loss_ckpt);
    for (int u = 0; u < save.n_units; u++) {
        g_assert_cmpmem(save.grads[u], save.elems[u] * sizeof(RealBf16), ckpt.grads[u],
                        ckpt.elems[u] * sizeof(RealBf16));
        gboolean nonzero = FALSE;
        for (size_t i = 0; i < save.elems[u]; i++)
            nonzero |= save.grads[u][i] != 0;
        g_assert_true(nonzero);
    }
    g_free(tokens), g_free(targets);
    fx_free(&save);
    fx_free(&ckpt);
}

/* A view of block unit u's tensors in `base` holding only module m's (the rest NULL), as
 * DeepSpeed's stage 3 has only the module's own parameters gathered. */
static void module_view(const RealGptDims *dims, RealBf16 *base, int m, RealGptTensors *v)
{
    real_gpt_tensors_at(dims, 1, base, v);
    const uint32_t bits = real_gpt_module_tensors(dims, m);
    for (int k = 0; k < REAL_GPT_MAX_UNIT_TENSORS; k++)
        if (!(bits >> k & 1))
            v->at[k] = NULL;
}

/* A block forward and backward run module by module, each call seeing only its module's
 * tensors (parameters, and in backward the gradients it hands on), gives the whole-block
 * calls' output, input gradient and parameter gradients bit for bit (GPT-2, Llama, NeoX's
 * parallel residual, fused attention); calls out of order are refused. */
static void test_block_modules(void)
{
    const int kinds[] = {GRAD_GPT2, GRAD_LLAMA, GRAD_NEOX_FLASH};
    for (size_t ki = 0; ki < G_N_ELEMENTS(kinds); ki++) {
        const RealGptDims dims = gradient_dims(kinds[ki]);
        Fixture fx;
        fx_init(&fx, &dims, 7);
        GError *error = NULL;
        const size_t th = (size_t)dims.micro_batch * dims.seq_len * dims.hidden;
        int *tokens, *targets;
        make_batch(&dims, 5, 40, &tokens, &targets);
        RealBf16 *x[2] = {g_new(RealBf16, th), g_new(RealBf16, th)};
        float *dx[2] = {g_new(float, th), g_new(float, th)};
        RealBf16 *grads[2] = {g_new0(RealBf16, fx.elems[1]), g_new0(RealBf16, fx.elems[1])};
        for (int run = 0; run < 2; run++) {
            g_assert_true(real_gpt_embed_forward(fx.gpt, fx.params[0], tokens, x[run], &error));
            for (size_t i = 0; i < th; i++)
                dx[run][i] = (float)((i * 37) % 11) / 11.0f - 0.5f;
            if (run == 0) {
                g_assert_true(real_gpt_block_forward(fx.gpt, 0, fx.params[1], x[0], x[0], TRUE,
                                                     &error));
                g_assert_true(real_gpt_block_backward(fx.gpt, 0, fx.params[1], dx[0], dx[0],
                                                      grads[0], &error));
                continue;
            }
            RealGptTensors v, g;
            for (int m = 0; m < REAL_GPT_N_MODULES; m++) {
                module_view(&dims, fx.params[1], m, &v);
                g_assert_true(real_gpt_block_forward_module_t(fx.gpt, 0, m, &v, x[1], x[1],
                                                              TRUE, &error));
            }
            for (int m = REAL_GPT_N_MODULES - 1; m >= 0; m--) {
                module_view(&dims, fx.params[1], m, &v);
                module_view(&dims, grads[1], m, &g);
                g_assert_true(real_gpt_block_backward_module_t(fx.gpt, 0, m, &v, dx[1], dx[1],
                                                               &g, &error));
            }
        }
        g_assert_no_error(error);
        g_assert_cmpmem(x[0], th * sizeof(RealBf16), x[1], th * sizeof(RealBf16));
        g_assert_cmpmem(dx[0], th * sizeof(float), dx[1], th * sizeof(float));
        g_assert_cmpmem(grads[0], fx.elems[1] * sizeof(RealBf16), grads[1],
                        fx.elems[1] * sizeof(RealBf16));
        /* Out of order: a forward not begun at ln1, a backward not begun at fc2. */
        RealGptTensors v;
        module_view(&dims, fx.params[1], REAL_GPT_MOD_PROJ, &v);
        g_assert_false(real_gpt_block_forward_module_t(fx.gpt, 0, REAL_GPT_MOD_PROJ, &v, x[1],
                                                       x[1], TRUE, &error));
        g_assert_error(error, REAL_GPT_ERROR, REAL_GPT_ERROR_STATE);
        g_clear_error(&error);
        module_view(&dims, fx.params[1], REAL_GPT_MOD_LN1, &v);
        g_assert_true(real_gpt_block_forward_module_t(fx.gpt, 0, REAL_GPT_MOD_LN1, &v, x[1],
                                                      x[1], FALSE, &error));
        g_assert_false(real_gpt_block_backward_module_t(fx.gpt, 0, REAL_GPT_MOD_FC2, &v, dx[1],
                                                        dx[1], NULL, &error));
        g_assert_error(error, REAL_GPT_ERROR, REAL_GPT_ERROR_STATE);
        g_clear_error(&error);
        for (int run = 0; run < 2; run++)
            g_free(x[run]), g_free(dx[run]), g_free(grads[run]);
        g_free(tokens), g_free(targets);
        fx_free(&fx); /* frees the run's workspace still held */
    }
}

/* Misuse is reported, not crashed on. */
static void test_model_errors(void)
{
    RealGptDims dims = real_gpt_dims_make(1, 16, 2, 4, 8, 1);
    Fixture fx;
    fx_init(&fx, &dims, 1);
    GError *error = NULL;
    RealBf16 x[4 * 16] = {0};
    float dx[4 * 16] = {0};
    int tokens[4] = {0, 1, 8, 2};
    g_assert_false(real_gpt_embed_forward(fx.gpt, fx.params[0], tokens, x, &error));
    g_assert_error(error, REAL_GPT_ERROR, REAL_GPT_ERROR_INVALID);
    g_clear_error(&error);
    g_assert_false(real_gpt_block_backward(fx.gpt, 0, fx.params[1], dx, dx, fx.grads[1], &error));
    g_assert_error(error, REAL_GPT_ERROR, REAL_GPT_ERROR_STATE);
    g_clear_error(&error);
    g_assert_true(real_gpt_block_forward(fx.gpt, 0, fx.params[1], x, x, TRUE, &error));
    g_assert_false(real_gpt_block_forward(fx.gpt, 0, fx.params[1], x, x, TRUE, &error));
    g_assert_error(error, REAL_GPT_ERROR, REAL_GPT_ERROR_STATE);
    g_clear_error(&error);
    g_assert_false(real_gpt_block_forward(fx.gpt, 1, fx.params[1], x, x, FALSE, &error));
    g_assert_error(error, REAL_GPT_ERROR, REAL_GPT_ERROR_INVALID);
    g_clear_error(&error);
    g_assert_false(real_gpt_init_params(&dims, 1, 3, fx.params[0], &error));
    g_assert_error(error, REAL_GPT_ERROR, REAL_GPT_ERROR_INVALID);
    g_clear_error(&error);
    RealGptDims bad = real_gpt_dims_make(1, 18, 4, 4, 8, 1);
    g_assert_null(real_gpt_new(fx.be, &bad, &error));
    g_assert_error(error, REAL_GPT_ERROR, REAL_GPT_ERROR_INVALID);
    g_clear_error(&error);
    fx_free(&fx); /* frees the activations block 0 still holds */
}

/* ---- (d) the tiny model learns the synthetic data ---- */

static RealGptDims tiny_dims(int micro_batch)
{
    GError *error = NULL;
    ZpModel model;
    g_assert_true(zp_model_load("tiny", &model, &error));
    g_assert_no_error(error);
    return real_gpt_dims_make((int)model.layers, (int)model.hidden, (int)model.heads,
                              (int)model.seq_len, (int)model.vocab, micro_batch);
}

static void test_training_loss_falls(void)
{
    const int steps = 30;
    RealGptDims dims = tiny_dims(8);
    Fixture fx;
    fx_init(&fx, &dims, 1234);
    float first = 0.0f, last = 0.0f;
    for (int step = 0; step < steps; step++) {
        int *tokens, *targets;
        make_batch(&dims, 99, real_data_first_sample(step, 0, 1, 0, 1, dims.micro_batch),
                   &tokens, &targets);
        fx_zero_grads(&fx);
        last = fx_micro_batch(&fx, tokens, targets, step % 2 == 1, FALSE);
        first = step == 0 ? last : first;
        fx_adam(&fx, step + 1, 3e-3f);
        g_free(tokens), g_free(targets);
    }
    double ln_v = log(dims.vocab);
    g_test_message("loss %.4f -> %.4f over %d steps (ln V = %.4f, data entropy <= %.4f)", first,
                   last, steps, ln_v, real_data_entropy_nats());
    g_assert_cmpfloat(fabs(first - ln_v), <, 0.05); /* N(0, 0.02) init: near-uniform logits */
    g_assert_cmpfloat(last, <, 0.8 * first);
    fx_free(&fx);
}

static void test_memory_accounting(void)
{
    RealGptDims dims = tiny_dims(4);
    uint64_t s = dims.seq_len, b = dims.micro_batch, h = dims.hidden, a = dims.heads;
    uint64_t f = dims.ffn_hidden, t = s * b, L = dims.layers;
    uint64_t act = real_gpt_block_activation_bytes(&dims);
    /* The documented tensor list, and the closed form for f = 4h. */
    g_assert_cmpuint(act, ==, 2 * t * (8 * h + 2 * f) + 2 * a * b * s * s + 16 * t);
    g_assert_cmpuint(act * h, ==, s * b * h * (32 * h + 2 * a * s) + 16 * s * b * h);
    g_assert_cmpuint(real_gpt_checkpoint_bytes(&dims), ==, 2 * s * b * h);
    g_assert_cmpuint(real_gpt_residual_grad_bytes(&dims), ==, 4 * s * b * h);
    g_assert_cmpuint(real_gpt_logits_bytes(&dims), ==, 4 * s * b * dims.vocab);

    Fixture fx;
    fx_init(&fx, &dims, 8);
    RealAllocStats st;
    real_alloc_stats(fx.be->tracker, &st);
    uint64_t params = real_gpt_param_elems(&dims);
    g_assert_cmpuint(st.live_bytes[REAL_MEM_PARAMS], ==, 2 * params);
    g_assert_cmpuint(st.live_bytes[REAL_MEM_GRADS], ==, 2 * params);
    g_assert_cmpuint(st.live_bytes[REAL_MEM_MASTER], ==, 4 * params);
    int *tokens, *targets;
    make_batch(&dims, 1, 0, &tokens, &targets);
    for (int checkpoint = 0; checkpoint <= 1; checkpoint++) {
        real_alloc_reset_peaks(fx.be->tracker);
        fx_micro_batch(&fx, tokens, targets, checkpoint, FALSE);
        real_alloc_stats(fx.be->tracker, &st);
        /* Without checkpointing all L blocks' activations are live at the head; with it,
         * only the block being recomputed, while the L checkpoints are held. */
        g_assert_cmpuint(st.peak_bytes[REAL_MEM_ACTIVATIONS], ==, checkpoint ? act : L * act);
        g_assert_cmpuint(st.peak_bytes[REAL_MEM_CHECKPOINTS], ==,
                         checkpoint ? L * real_gpt_checkpoint_bytes(&dims) : 0);
        g_assert_cmpuint(st.live_bytes[REAL_MEM_ACTIVATIONS], ==, 0);
        g_assert_cmpuint(st.live_bytes[REAL_MEM_CHECKPOINTS], ==, 0);
        g_assert_cmpuint(st.peak_bytes[REAL_MEM_WORKSPACE], >=, real_gpt_logits_bytes(&dims));
        uint64_t sum = 0;
        for (int c = 0; c < REAL_MEM_N_CATEGORIES; c++)
            sum += st.at_peak_bytes[c];
        g_assert_cmpuint(sum, ==, st.peak_total_bytes);
    }
    g_free(tokens), g_free(targets);
    fx_free(&fx);
}

/* The parameter layout and memory terms agree with the planner's (zp_model, zp_mem). */
static void test_layout_matches_planner(void)
{
    const char *models[] = {"tiny", "gpt2-124m"};
    for (size_t m = 0; m < G_N_ELEMENTS(models); m++) {
        GError *error = NULL;
        ZpModel model;
        g_assert_true(zp_model_load(models[m], &model, &error));
        g_assert_no_error(error);
        RealGptDims dims = real_gpt_dims_make((int)model.layers, (int)model.hidden,
                                              (int)model.heads, (int)model.seq_len,
                                              (int)model.vocab, 2);
        dims.ffn_hidden = (int)model.ffn_hidden;
        g_assert_cmpint(real_gpt_n_units(&dims), ==, zp_model_n_units(&model));
        for (int u = 0; u < real_gpt_n_units(&dims); u++)
            g_assert_cmpuint(real_gpt_unit_elems(&dims, u), ==, zp_model_unit_elems(&model, u));
        g_assert_cmpuint(real_gpt_param_elems(&dims), ==, zp_model_param_count(&model));
        GArray *tensors = zp_model_tensors(&model);
        guint k = 0;
        for (int u = 0; u < real_gpt_n_units(&dims); u++) {
            RealGptTensor t[REAL_GPT_MAX_UNIT_TENSORS];
            int n = real_gpt_unit_tensors(&dims, u, t);
            for (int i = 0; i < n; i++, k++) {
                const ZpTensor *zt = &g_array_index(tensors, ZpTensor, k);
                g_assert_cmpstr(t[i].name, ==, zt->name);
                g_assert_cmpint(zt->unit, ==, u);
                g_assert_cmpuint(t[i].elems, ==, zt->elems);
            }
        }
        g_assert_cmpuint(k, ==, tensors->len);
        g_array_unref(tensors);
        /* zreal trains without dropout; tiny.json, its CI model, says so to the planner. */
        if (strcmp(models[m], "tiny") == 0)
            g_assert_false(model.dropout);
        model.dropout = FALSE;
        /* The planner's s b h (32 + 2 a s / h) in 16 bits with the fp32 LN statistics. */
        double planner_act = zp_mem_activation_block_bytes(&model, 2, 1, 2.0, ZP_ATTN_EAGER);
        g_assert_cmpfloat(fabs((double)real_gpt_block_activation_bytes(&dims) - planner_act),
                          <, 0.5);
    }
}

static void test_init_deterministic(void)
{
    RealGptDims dims = real_gpt_dims_make(4, 32, 4, 16, 40, 1);
    GError *error = NULL;
    size_t n = real_gpt_unit_elems(&dims, 2);
    RealBf16 *a = g_new(RealBf16, n), *b = g_new(RealBf16, n);
    g_assert_true(real_gpt_init_params(&dims, 77, 2, a, &error));
    g_assert_true(real_gpt_init_params(&dims, 77, 2, b, &error));
    g_assert_cmpmem(a, n * sizeof *a, b, n * sizeof *b);
    g_assert_true(real_gpt_init_params(&dims, 77, 3, b, &error));
    g_assert_cmpint(memcmp(a, b, n * sizeof *a), !=, 0);
    g_assert_no_error(error);
    /* Gains 1, biases 0, weights with the GPT-2 standard deviations. */
    RealGptTensor t[REAL_GPT_MAX_UNIT_TENSORS];
    int nt = real_gpt_unit_tensors(&dims, 2, t);
    for (int i = 0; i < nt; i++) {
        double sum2 = 0.0;
        for (size_t e = 0; e < t[i].elems; e++) {
            double v = real_bf16_to_f32(a[t[i].offset_elems + e]);
            sum2 += v * v;
        }
        double rms = sqrt(sum2 / t[i].elems);
        double expect = g_str_has_suffix(t[i].name, ".bias")      ? 0.0
                        : g_str_has_prefix(t[i].name, "ln")       ? 1.0
                        : g_str_has_prefix(t[i].name, "proj") ||
                                  g_str_has_prefix(t[i].name, "fc2") ? 0.02 / sqrt(8.0)
                                                                     : 0.02;
        g_assert_cmpfloat(fabs(rms - expect), <=, 0.1 * expect);
    }
    /* Any slice, across tensor boundaries and into ZeRO padding, is that slice of the whole:
     * what lets a ZeRO-3 rank draw only its own partition. */
    const size_t slices[][2] = {{0, 1}, {31, 70}, {n / 3, n / 2}, {n - 5, 5}, {n - 3, 11}};
    for (size_t i = 0; i < G_N_ELEMENTS(slices); i++) {
        const size_t first = slices[i][0], count = slices[i][1];
        RealBf16 *part = g_new(RealBf16, count);
        g_assert_true(real_gpt_init_params_range(&dims, 77, 2, first, count, part, &error));
        for (size_t e = 0; e < count; e++)
            g_assert_cmpuint(part[e], ==, first + e < n ? a[first + e] : 0);
        g_free(part);
    }
    g_free(a), g_free(b);
}

/* The timed steps of each mode in an op sequence: the embedding forward's calls, between
 * real_opseq.c's least and most. */
static int opseq_timed_steps(json_t *rows)
{
    size_t i;
    json_t *row;
    int timed = 0;
    json_array_foreach(rows, i, row)
        if (strcmp(json_string_value(json_object_get(row, "op")), "embed_fwd") == 0)
            timed = (int)json_integer_value(json_object_get(row, "calls"));
    g_assert_cmpint(timed, >=, 3);
    g_assert_cmpint(timed, <=, 15);
    return timed;
}

/* The optimizer's rows of an op sequence on `dp` ranks: one per distinct element count of
 * stages 0-3 (zp_sched_optimizer_elems), keyed by it, their calls both modes' timed steps. */
static void check_optimizer_rows(json_t *rows, const ZpModel *m, const ZpPlan *p, int dp,
                                 int expect_rows)
{
    int found = 0, calls = 0;
    size_t i;
    json_t *row;
    json_array_foreach(rows, i, row)
    {
        if (strcmp(json_string_value(json_object_get(row, "op")), "optimizer") != 0)
            continue;
        const char *shape = json_string_value(json_object_get(row, "shape"));
        gboolean known = FALSE;
        for (int stage = 0; stage < 4; stage++) {
            ZpPlan at = *p;
            at.zero.stage = stage, at.dp = dp;
            char key[ZP_OPTABLE_SHAPE_LEN];
            zp_cost_optimizer_shape((double)zp_sched_optimizer_elems(m, &at), key);
            known = known || strcmp(key, shape) == 0;
        }
        g_assert_true(known);
        g_assert_null(json_object_get(row, "checkpoint"));
        g_assert_cmpfloat(json_number_value(json_object_get(row, "time_s")), >, 0);
        calls += (int)json_integer_value(json_object_get(row, "calls"));
        found++;
    }
    g_assert_cmpint(found, ==, expect_rows);
    g_assert_cmpint(calls, ==, 2 * opseq_timed_steps(rows));
}

/* The op sequence's cycle: its timed steps on `ranks` ranks, a factor of 1 at least, and rows
 * that share out the cycle: each row's time is its calls' mean times the factor, so the rows'
 * times by their calls sum to the calls' time times the factor (a median, or any figure but
 * the mean, would not). */
static void check_cycle(json_t *root, json_t *rows, int ranks, int steps)
{
    json_t *c = json_object_get(root, "op_sequence_cycle");
    g_assert_nonnull(c);
    g_assert_cmpint(json_integer_value(json_object_get(c, "ranks")), ==, ranks);
    g_assert_cmpint(json_integer_value(json_object_get(c, "steps")), ==, steps);
    const double cycle_s = json_number_value(json_object_get(c, "cycle_s")),
                 calls_s = json_number_value(json_object_get(c, "calls_s")),
                 factor = json_number_value(json_object_get(c, "cycle_factor"));
    g_assert_cmpfloat(calls_s, >, 0);
    g_assert_cmpfloat(cycle_s, >=, calls_s);
    g_assert_cmpfloat(json_number_value(json_object_get(c, "line_up_s")), >=, 0);
    g_assert_cmpfloat(factor, >=, 1);
    double shared_s = 0;
    size_t i;
    json_t *row;
    json_array_foreach(rows, i, row)
        shared_s += json_number_value(json_object_get(row, "time_s")) *
                    (double)json_integer_value(json_object_get(row, "calls"));
    g_assert_cmpfloat(fabs(shared_s - calls_s * factor), <=, 1e-9 * shared_s);
}

/* The op sequence times every compute op of tiny's steps as real_gpt runs them: one row per op
 * and mode, as many calls as its timed steps make (the same number in both modes), keyed by
 * zp_cost's shape of that mode, and the
 * optimizer at each stage's partition; every buffer freed after; nothing at a tensor degree
 * zreal does not run. */
static void test_opseq_rows(void)
{
    RealBackend *be = real_cpu_backend_new();
    RealComm *comm = real_comm_emulated_new(be, 1, 0);
    ZpModel m = tu_load_model("tiny");
    ZpPlan p;
    zp_plan_defaults(&p, 0, 1, 1);
    p.micro_batch = 1;
    json_t *root = json_object();
    GError *error = NULL;
    g_assert_true(real_opseq_run(be, comm, &m, &p, root, &error));
    g_assert_no_error(error);
    json_t *rows = json_object_get(root, "op_sequence");
    /* one rank: every stage steps every parameter */
    g_assert_cmpint(json_array_size(rows), ==, 5 + 6 + 1);
    check_optimizer_rows(rows, &m, &p, 1, 1);
    const int L = (int)m.layers, timed = opseq_timed_steps(rows);
    size_t i;
    json_t *row;
    json_array_foreach(rows, i, row)
    {
        const char *op = json_string_value(json_object_get(row, "op"));
        if (strcmp(op, "optimizer") == 0)
            continue;
        ZpPlan mode = p;
        mode.checkpoint = json_is_true(json_object_get(row, "checkpoint"));
        int kind = 0;
        while (kind < ZP_COMP_N && strcmp(zp_sched_compute_name(kind), op) != 0)
            kind++;
        g_assert_cmpint(kind, <, ZP_COMP_N);
        char shape[ZP_OPTABLE_SHAPE_LEN];
        zp_cost_op_shape(&m, &mode, (ZpComputeKind)kind, shape);
        g_assert_cmpstr(json_string_value(json_object_get(row, "shape")), ==, shape);
        const gboolean block = kind == ZP_COMP_BLOCK_FWD || kind == ZP_COMP_RECOMPUTE ||
                               kind == ZP_COMP_BLOCK_BWD;
        g_assert_cmpint(json_integer_value(json_object_get(row, "calls")), ==,
                        timed * (block ? L : 1));
        g_assert_cmpfloat(json_number_value(json_object_get(row, "time_s")), >, 0);
        g_assert_true(kind != ZP_COMP_RECOMPUTE || mode.checkpoint);
    }
    check_cycle(root, rows, 1, 2 * timed);
    RealAllocStats st;
    real_alloc_stats(be->tracker, &st);
    /* The backend's own GEMM and attention staging stays (grown, never shrunk). */
    g_assert_cmpint(st.live_total_bytes, ==, st.live_bytes[REAL_MEM_WORKSPACE]);
    json_decref(root);
    /* Rank 1 of 2: stage 0's every parameter, stages 1-2's padded half and stage 3's sum of
     * padded unit halves (one row with stages 1-2's when they come out equal). */
    RealComm *two = real_comm_emulated_new(be, 2, 1);
    ZpPlan half = p;
    half.dp = 2;
    root = json_object();
    g_assert_true(real_opseq_run(be, two, &m, &half, root, &error));
    g_assert_no_error(error);
    ZpPlan s1 = half, s3 = half;
    s1.zero.stage = 1, s3.zero.stage = 3;
    const gboolean apart = zp_sched_optimizer_elems(&m, &s1) != zp_sched_optimizer_elems(&m, &s3);
    check_optimizer_rows(json_object_get(root, "op_sequence"), &m, &p, 2, apart ? 3 : 2);
    check_cycle(root, json_object_get(root, "op_sequence"), 2,
                2 * opseq_timed_steps(json_object_get(root, "op_sequence")));
    json_decref(root);
    two->destroy(two);
    real_alloc_stats(be->tracker, &st);
    g_assert_cmpint(st.live_total_bytes, ==, st.live_bytes[REAL_MEM_WORKSPACE]);
    root = json_object();
    p.mp = 2;
    g_assert_true(real_opseq_run(be, comm, &m, &p, root, &error));
    g_assert_null(json_object_get(root, "op_sequence"));
    json_decref(root);
    comm->destroy(comm);
    be->destroy(be);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/real/gpt/layout_matches_planner", test_layout_matches_planner);
    g_test_add_func("/real/gpt/init", test_init_deterministic);
    g_test_add_func("/real/gpt/errors", test_model_errors);
    g_test_add_data_func("/real/gpt/gradients", GINT_TO_POINTER(GRAD_GPT2), test_model_gradients);
    g_test_add_data_func("/real/gpt/fresh-gradients", GINT_TO_POINTER(GRAD_GPT2),
                         test_fresh_gradients);
    g_test_add_func("/real/gpt/recompute_bit_identical", test_recompute_bit_identical);
    g_test_add_func("/real/gpt/block_modules", test_block_modules);
    g_test_add_func("/real/gpt/memory_accounting", test_memory_accounting);
    g_test_add_func("/real/gpt/training", test_training_loss_falls);
    g_test_add_func("/real/opseq/rows", test_opseq_rows);
    return g_test_run();
}
