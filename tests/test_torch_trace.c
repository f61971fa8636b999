/* test_torch_trace: PyTorch profiler traces (Kineto's Chrome-trace JSON) written here in Kineto's
 * format, read into kernel classes and tables exactly; bad traces refused or read in bounded work. */
#include "cli_torchtrace.h"
#include "zp_hw.h"
#include "zp_jsonstream.h"
#include "zp_kernrate.h"
#include "zp_torchtrace.h"
#include "zp_util.h"

#include "testutil.h"

#include <glib/gstdio.h>
#include <jansson.h>
#include <string.h>
#include <zlib.h>

static char *tmp_dir;

/* ---- a trace as torch.profiler exports it (record_shapes=True) ---- */

typedef struct {
    json_t *events;
    gint64 ext, corr;
    gboolean no_correlation; /* kernels and launches without "correlation" */
    gboolean old_format;     /* "External id" of launches and kernels = their correlation id,
                              * as PyTorch wrote it before 1.13 */
} Trace;

static Trace trace_new(void)
{
    return (Trace){json_array(), 100, 5000, FALSE, FALSE};
}

/* A CPU op at ts with its shapes (dims, types: new references), returning its External id. */
static gint64 cpu_op(Trace *t, const char *name, double ts, json_t *dims, json_t *types)
{
    const gint64 ext = t->ext++;
    json_array_append_new(t->events,
        json_pack("{s:s, s:s, s:s, s:i, s:i, s:f, s:f, s:{s:I, s:I, s:o, s:o}}", "ph", "X", "cat",
                  "cpu_op", "name", name, "pid", 7, "tid", 7, "ts", ts, "dur", 50.0, "args",
                  "External id", (json_int_t)ext, "Record function id", (json_int_t)0,
                  "Input Dims", dims, "Input type", types));
    return ext;
}

/* The launch of a kernel by op `ext` (-1: none) at ts, and the kernel (cat, name, dur) on
 * the GPU 2 us later; `args` (a new reference or NULL) joins the kernel's args. */
static void kernel(Trace *t, gint64 ext, double ts, const char *cat, const char *name,
                   double dur, json_t *args)
{
    const gint64 corr = t->corr++;
    if (t->old_format)
        ext = corr;
    json_t *launch_args = json_pack("{s:I, s:I}", "External id", (json_int_t)ext, "cbid",
                                    (json_int_t)211);
    json_t *kernel_args = json_pack("{s:I, s:i, s:i}", "External id", (json_int_t)ext,
                                    "device", 0, "stream", 7);
    if (!t->no_correlation) {
        json_object_set_new(launch_args, "correlation", json_integer(corr));
        json_object_set_new(kernel_args, "correlation", json_integer(corr));
    }
    if (args)
        json_object_update(kernel_args, args);
    json_decref(args);
    json_array_append_new(t->events,
        json_pack("{s:s, s:s, s:s, s:i, s:i, s:f, s:f, s:o}", "ph", "X", "cat", "cuda_runtime",
                  "name", "cudaLaunchKernel", "pid", 7, "tid", 7, "ts", ts + 1, "dur", 3.0,
                  "args", launch_args));
    json_array_append_new(t->events,
        json_pack("{s:s, s:s, s:s, s:i, s:i, s:f, s:f, s:o}", "ph", "X", "cat", cat, "name",
                  name, "pid", 0, "tid", 7, "ts", ts + 2, "dur", dur, "args", kernel_args));
    json_array_append_new(t->events,
        json_pack("{s:s, s:I, s:i, s:i, s:f, s:s, s:s}", "ph", "s", "id", (json_int_t)corr,
                  "pid", 7, "tid", 7, "ts", ts + 1, "cat", "ac2g", "name", "ac2g"));
}

static void step(Trace *t, int n, double ts, double dur)
{
    char name[32];
    g_snprintf(name, sizeof name, "ProfilerStep#%d", n);
    json_array_append_new(t->events,
        json_pack("{s:s, s:s, s:s, s:i, s:i, s:f, s:f, s:{}}", "ph", "X", "cat",
                  "user_annotation", "name", name, "pid", 7, "tid", 7, "ts", ts, "dur", dur,
                  "args"));
}

static const char *const bf16 = "c10::BFloat16";
#define GEMM_KERNEL "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1"
#define SPLITK_KERNEL "void splitKreduce_kernel<32, 16, int, float, __nv_bfloat16>(cublasSplitKParams<float>)"
#define NEW_GEMM_KERNEL "sm100_new_family_tn_128x256"
#define FLASH_KERNEL "void flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false>, true>(Flash_fwd_params)"
/* As ATen names it, with a lambda: not the optimizer's "lamb". */
#define ADD_KERNEL "void at::native::vectorized_elementwise_kernel<4, at::native::add_kernel(at::TensorIteratorBase&, c10::Scalar const&)::{lambda()#1}::operator()() const::{lambda(c10::BFloat16, c10::BFloat16)#1}, std::array<char*, 3ul>>(int, at::native::add_kernel(at::TensorIteratorBase&, c10::Scalar const&)::{lambda()#1}, std::array<char*, 3ul>)"
#define NCCL_KERNEL "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
#define ADAM_KERNEL "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4>>(T1, T2, T3...)"
#define CUSTOM_KERNEL "void my_custom_scan_kernel<float>(float const*, float*, int)"

/* The addmm's GEMM kernel in each of the three steps (its split-K reduction adds 5 us). */
static const double gemm_us[3] = {55, 75, 65};

/* One step of a GPT block's kinds of work, at t0. */
static void block_step(Trace *t, int n, double t0)
{
    step(t, n, t0, 9000);
    gint64 e = cpu_op(t, "aten::addmm", t0 + 10,
                      json_pack("[[i], [i, i], [i, i], [], []]", 3072, 8192, 768, 768, 3072),
                      json_pack("[s, s, s, s, s]", bf16, bf16, bf16, "Scalar", "Scalar"));
    kernel(t, e, t0 + 10, "kernel", GEMM_KERNEL, gemm_us[n], NULL);
    kernel(t, e, t0 + 20, "kernel", SPLITK_KERNEL, 5, NULL);
    e = cpu_op(t, "aten::mm", t0 + 100, json_pack("[[i, i], [i, i]]", 8192, 3072, 3072, 768),
               json_pack("[s, s]", bf16, bf16));
    kernel(t, e, t0 + 100, "kernel", NEW_GEMM_KERNEL, 40, NULL);
    e = cpu_op(t, "aten::_flash_attention_forward", t0 + 200,
               json_pack("[[i, i, i, i], [i, i, i, i], [i, i, i, i], [], [], [], [], []]", 8, 1024,
                         12, 64, 8, 1024, 12, 64, 8, 1024, 12, 64),
               json_pack("[s, s, s, s, s, s, s, s]", bf16, bf16, bf16, "", "", "", "", ""));
    kernel(t, e, t0 + 200, "kernel", FLASH_KERNEL, 30, NULL);
    e = cpu_op(t, "aten::add", t0 + 300,
               json_pack("[[i, i, i], [i, i, i], []]", 8, 1024, 768, 8, 1024, 768),
               json_pack("[s, s, s]", bf16, bf16, "Scalar"));
    kernel(t, e, t0 + 300, "kernel", ADD_KERNEL, 10, NULL);
    kernel(t, -1, t0 + 350, "gpu_memcpy", "Memcpy DtoD (Device -> Device)", 4,
           json_pack("{s:i}", "bytes", 4194304));
    e = cpu_op(t, "record_param_comms", t0 + 400, json_pack("[[i]]", 1048576),
               json_pack("[s]", bf16));
    kernel(t, e, t0 + 400, "kernel", NCCL_KERNEL, 100,
           json_pack("{s:s, s:i, s:i, s:i, s:s}", "Collective name", "allreduce",
                     "In msg nelems", 1048576, "Out msg nelems", 1048576, "Group size", 8,
                     "dtype", "BFloat16"));
    e = cpu_op(t, "aten::_fused_adamw_", t0 + 500,
               json_pack("[[[i, i], [i]], [[i, i], [i]]]", 768, 3072, 3072, 768, 3072, 3072),
               json_pack("[s, s]", "TensorList", "TensorList"));
    kernel(t, e, t0 + 500, "kernel", ADAM_KERNEL, 20, NULL);
    kernel(t, -1, t0 + 600, "kernel", CUSTOM_KERNEL, 7 + n, NULL);
}

static char *write_trace(const char *name, Trace *t, int rank)
{
    json_t *root = json_pack("{s:i, s:[], s:{s:s, s:i, s:i}, s:o, s:s}", "schemaVersion", 1,
                             "deviceProperties", "distributedInfo", "backend", "nccl", "rank",
                             rank, "world_size", 8, "traceEvents", t->events, "traceName", name);
    char *path = g_build_filename(tmp_dir, name, NULL);
    g_assert_cmpint(json_dump_file(root, path, JSON_INDENT(1)), ==, 0);
    json_decref(root);
    return path;
}

static char *block_trace(const char *name, int steps)
{
    Trace t = trace_new();
    for (int n = 0; n < steps; n++)
        block_step(&t, n, 10000.0 * n);
    return write_trace(name, &t, 0);
}

static json_t *row_of(json_t *tables, const char *klass, const char *key, json_t *value)
{
    json_t *rows = json_object_get(tables, klass);
    for (size_t i = 0; i < json_array_size(rows); i++)
        if (json_equal(json_object_get(json_array_get(rows, i), key), value)) {
            json_decref(value);
            return json_array_get(rows, i);
        }
    json_decref(value);
    g_assert_not_reached();
    return NULL;
}

static double num(json_t *row, const char *key)
{
    return json_number_value(json_object_get(row, key));
}

/* Each class's table from three steps of one block: every shape's median time, exactly. */
static void test_tables(void)
{
    char *path = block_trace("block.json", 3);
    GError *error = NULL;
    ZpTorchTrace *t = zp_torch_trace_new();
    g_assert_true(zp_torch_trace_read(t, path, &error));
    g_assert_no_error(error);
    json_t *tables = zp_torch_trace_tables(t, "test");
    g_assert_true(zp_kclass_tables_check(tables, "tables", &error));
    /* The addmm: its GEMM and split-K kernels are one instance, 60, 80 and 70 us. */
    json_t *r = row_of(tables, "gemm", "n", json_real(3072));
    g_assert_cmpfloat(num(r, "m"), ==, 8192);
    g_assert_cmpfloat(num(r, "k"), ==, 768);
    g_assert_cmpfloat(num(r, "batch"), ==, 1);
    g_assert_cmpstr(json_string_value(json_object_get(r, "dtype")), ==, "bf16");
    g_assert_cmpfloat_with_epsilon(num(r, "time_s"), 70e-6, 1e-15);
    g_assert_cmpint(json_integer_value(json_object_get(r, "count")), ==, 3);
    /* A kernel whose name no pattern knows is a GEMM by the op that launched it. */
    r = row_of(tables, "gemm", "n", json_real(768));
    g_assert_cmpfloat(num(r, "k"), ==, 3072);
    g_assert_cmpfloat_with_epsilon(num(r, "time_s"), 40e-6, 1e-15);
    r = row_of(tables, "attention", "direction", json_string("forward"));
    g_assert_cmpfloat(num(r, "batch"), ==, 8);
    g_assert_cmpfloat(num(r, "heads"), ==, 12);
    g_assert_cmpfloat(num(r, "seq"), ==, 1024);
    g_assert_cmpfloat(num(r, "head_dim"), ==, 64);
    /* The add reads two bf16 tensors of 8 x 1024 x 768 and writes one. */
    r = row_of(tables, "memory", "op", json_string("aten::add"));
    g_assert_cmpfloat(num(r, "bytes"), ==, 3.0 * 8 * 1024 * 768 * 2);
    g_assert_cmpfloat_with_epsilon(num(r, "time_s"), 10e-6, 1e-15);
    /* A device-to-device copy reads and writes its 4 MiB. */
    r = row_of(tables, "memory", "op", json_string("Memcpy DtoD (Device -> Device)"));
    g_assert_cmpfloat(num(r, "bytes"), ==, 2 * 4194304.0);
    r = row_of(tables, "collective", "op", json_string("allreduce"));
    g_assert_cmpfloat(num(r, "ranks"), ==, 8);
    g_assert_cmpfloat(num(r, "bytes"), ==, 1048576.0 * 2);
    g_assert_cmpfloat_with_epsilon(num(r, "time_s"), 100e-6, 1e-15);
    r = row_of(tables, "optimizer", "op", json_string("aten::_fused_adamw_"));
    g_assert_cmpfloat_with_epsilon(num(r, "time_s"), 20e-6, 1e-15);
    for (int c = 0; c < ZP_KCLASS_N; c++)
        g_assert_cmpuint(json_array_size(json_object_get(tables, zp_kclass_name(c))), ==,
                         c == ZP_KCLASS_GEMM || c == ZP_KCLASS_MEMORY ? 2 : 1);
    /* The unknown kernel is listed with its total time, 7 + 8 + 9 us. */
    json_t *unknown = zp_torch_trace_unknown(t);
    g_assert_cmpuint(json_array_size(unknown), ==, 1);
    g_assert_cmpstr(json_string_value(json_object_get(json_array_get(unknown, 0), "name")), ==,
                    CUSTOM_KERNEL);
    g_assert_cmpfloat_with_epsilon(num(json_array_get(unknown, 0), "total_s"), 24e-6, 1e-15);
    ZpTraceSummary s;
    zp_torch_trace_summary(t, &s);
    g_assert_cmpint(s.steps, ==, 3);
    g_assert_cmpint(s.world_size, ==, 8);
    g_assert_cmpuint(s.kernels, ==, 3 * 9);
    g_assert_cmpuint(s.unlinked, ==, 0);
    g_assert_cmpfloat_with_epsilon(s.step_s, 9000e-6, 1e-12);
    /* Per step: the median of 60+40, 80+40 and 70+40 us of GEMMs; 14 us of memory-bound work. */
    g_assert_cmpfloat_with_epsilon(s.class_step_s[ZP_KCLASS_GEMM], 110e-6, 1e-12);
    g_assert_cmpfloat_with_epsilon(s.class_step_s[ZP_KCLASS_MEMORY], 14e-6, 1e-12);
    g_assert_cmpfloat_with_epsilon(s.class_step_s[ZP_KCLASS_UNKNOWN], 8e-6, 1e-12);
    json_decref(unknown);
    json_decref(tables);
    zp_torch_trace_free(t);
    g_free(path);
}

/* Ranks combine by median: three files whose GEMM differs, the middle one's time wins. */
static void test_ranks_median(void)
{
    ZpTorchTrace *t = zp_torch_trace_new();
    const double us[3] = {30, 10, 20};
    for (int rank = 0; rank < 3; rank++) {
        Trace tr = trace_new();
        step(&tr, 0, 0, 1000);
        gint64 e = cpu_op(&tr, "aten::bmm", 10,
                          json_pack("[[i, i, i], [i, i, i]]", 96, 1024, 64, 96, 64, 1024),
                          json_pack("[s, s]", "c10::Half", "c10::Half"));
        kernel(&tr, e, 10, "kernel", "ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_nn", us[rank],
               NULL);
        char *name = g_strdup_printf("rank-%d.json", rank);
        char *path = write_trace(name, &tr, rank);
        g_assert_true(zp_torch_trace_read(t, path, NULL));
        g_free(name), g_free(path);
    }
    json_t *tables = zp_torch_trace_tables(t, "test");
    json_t *r = row_of(tables, "gemm", "batch", json_real(96));
    g_assert_cmpfloat(num(r, "m"), ==, 1024);
    g_assert_cmpfloat(num(r, "n"), ==, 1024);
    g_assert_cmpfloat(num(r, "k"), ==, 64);
    g_assert_cmpstr(json_string_value(json_object_get(r, "dtype")), ==, "fp16");
    g_assert_cmpfloat_with_epsilon(num(r, "time_s"), 20e-6, 1e-15);
    g_assert_cmpint(json_integer_value(json_object_get(r, "count")), ==, 3);
    ZpTraceSummary s;
    zp_torch_trace_summary(t, &s);
    g_assert_cmpint(s.files, ==, 3);
    g_assert_cmpfloat_with_epsilon(s.class_step_s[ZP_KCLASS_GEMM], 20e-6, 1e-15);
    json_decref(tables);
    zp_torch_trace_free(t);
}

/* ---- bad traces ---- */

static char *expect_error(const char *name, const char *contents, const char *message)
{
    char *path = g_build_filename(tmp_dir, name, NULL);
    g_assert_true(g_file_set_contents(path, contents, -1, NULL));
    ZpTorchTrace *t = zp_torch_trace_new();
    GError *error = NULL;
    g_assert_false(zp_torch_trace_read(t, path, &error));
    g_assert_nonnull(error);
    g_test_message("%s", error->message);
    g_assert_nonnull(strstr(error->message, path));
    g_assert_nonnull(strstr(error->message, message));
    g_error_free(error);
    zp_torch_trace_free(t);
    return path;
}

static void test_truncated(void)
{
    char *path = block_trace("whole.json", 1), *text = NULL;
    gsize len = 0;
    g_assert_true(g_file_get_contents(path, &text, &len, NULL));
    /* Cut inside an event, and after the last event before the array closes. */
    text[len / 2] = '\0';
    g_free(expect_error("cut.json", text, "truncated JSON"));
    g_free(expect_error("open.json", "{\"traceEvents\": [{\"ph\": \"X\"},", "truncated JSON"));
    g_free(expect_error("none.json", "{\"schemaVersion\": 1}", "no \"traceEvents\" array"));
    g_free(expect_error("array.json", "[1, 2]", "top level must be a JSON object"));
    g_free(expect_error("events.json", "{\"traceEvents\": {}}", "must be an array"));
    g_free(expect_error("bad.json", "{\"traceEvents\": [{\"ph\": X}]}", "malformed JSON"));
    g_free(expect_error("dur.json",
                        "{\"traceEvents\": [{\"ph\": \"X\", \"cat\": \"kernel\", \"ts\": 1, "
                        "\"dur\": -4}]}", "traceEvents[0]"));
    g_free(expect_error("long.json",
                        "{\"traceEvents\": [{}, {\"ph\": \"X\", \"cat\": \"kernel\", \"ts\": 1, "
                        "\"dur\": 1e12}]}", "traceEvents[1]"));
    GString *huge = g_string_new("{\"traceEvents\": [{\"name\": \"");
    for (int i = 0; i < (2 << 20); i++)
        g_string_append_c(huge, 'x');
    g_string_append(huge, "\"}]}");
    g_free(expect_error("huge.json", huge->str, "a value of more than"));
    g_string_free(huge, TRUE);
    g_free(text);
    g_free(path);
}

/* Kernels without correlation ids are still placed by name (and counted as unlinked); a
 * GEMM among them has no shape and no row. Zero-length kernels are counted, not tabled. */
static void test_unlinked_and_zero(void)
{
    Trace t = trace_new();
    t.no_correlation = TRUE;
    step(&t, 0, 0, 1000);
    gint64 e = cpu_op(&t, "aten::mm", 10, json_pack("[[i, i], [i, i]]", 64, 64, 64, 64),
                      json_pack("[s, s]", bf16, bf16));
    kernel(&t, e, 10, "kernel", GEMM_KERNEL, 12, NULL);
    t.no_correlation = FALSE;
    kernel(&t, e, 20, "kernel", GEMM_KERNEL, 0, NULL);
    char *path = write_trace("unlinked.json", &t, 0);
    ZpTorchTrace *tr = zp_torch_trace_new();
    g_assert_true(zp_torch_trace_read(tr, path, NULL));
    ZpTraceSummary s;
    zp_torch_trace_summary(tr, &s);
    g_assert_cmpuint(s.kernels, ==, 2);
    g_assert_cmpuint(s.zero_length, ==, 1);
    /* The kernel's own External id equals its op's in this format: linked that way. */
    g_assert_cmpuint(s.unlinked, ==, 0);
    g_assert_cmpfloat_with_epsilon(s.class_step_s[ZP_KCLASS_GEMM], 12e-6, 1e-15);
    json_t *tables = zp_torch_trace_tables(tr, "test");
    g_assert_cmpuint(json_array_size(json_object_get(tables, "gemm")), ==, 1);
    json_decref(tables);
    zp_torch_trace_free(tr);
    g_free(path);
    /* Neither a correlation nor an External id: placed by name alone, without a shape. */
    const char *bare = "{\"traceEvents\": [{\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \""
                       GEMM_KERNEL "\", \"pid\": 0, \"tid\": 7, \"ts\": 5, \"dur\": 3, "
                       "\"args\": {}}]}";
    path = g_build_filename(tmp_dir, "bare.json", NULL);
    g_assert_true(g_file_set_contents(path, bare, -1, NULL));
    tr = zp_torch_trace_new();
    g_assert_true(zp_torch_trace_read(tr, path, NULL));
    zp_torch_trace_summary(tr, &s);
    g_assert_cmpuint(s.unlinked, ==, 1);
    g_assert_cmpuint(s.shapeless, ==, 1);
    g_assert_cmpuint(s.instances[ZP_KCLASS_GEMM], ==, 1);
    g_assert_cmpfloat_with_epsilon(s.class_step_s[ZP_KCLASS_GEMM], 3e-6, 1e-15);
    zp_torch_trace_free(tr);
    g_free(path);
}

/* Traces of PyTorch before 1.13 name no op in their launches: the launch's op is the innermost
 * shaped op around it on its thread. */
static void test_old_format(void)
{
    Trace t = trace_new();
    t.old_format = TRUE;
    for (int n = 0; n < 3; n++)
        block_step(&t, n, 10000.0 * n);
    char *path = write_trace("old.json", &t, 0);
    ZpTorchTrace *tr = zp_torch_trace_new();
    g_assert_true(zp_torch_trace_read(tr, path, NULL));
    json_t *tables = zp_torch_trace_tables(tr, "test");
    json_t *r = row_of(tables, "gemm", "n", json_real(3072));
    g_assert_cmpfloat(num(r, "m"), ==, 8192);
    g_assert_cmpfloat_with_epsilon(num(r, "time_s"), 70e-6, 1e-15);
    r = row_of(tables, "memory", "op", json_string("aten::add"));
    g_assert_cmpfloat(num(r, "bytes"), ==, 3.0 * 8 * 1024 * 768 * 2);
    g_assert_cmpuint(json_array_size(json_object_get(tables, "attention")), ==, 1);
    json_decref(tables);
    zp_torch_trace_free(tr);
    g_free(path);
}

/* A million events, gzip-compressed: read in one pass, memory held by the records alone. */
static void test_million_events(void)
{
    char *path = g_build_filename(tmp_dir, "million.json.gz", NULL);
    gzFile gz = gzopen(path, "wb1");
    g_assert_nonnull(gz);
    g_assert_cmpint(gzputs(gz, "{\"schemaVersion\": 1, \"traceEvents\": [\n"), >, 0);
    const int n = 1000000;
    for (int i = 0; i < n; i++)
        g_assert_cmpint(gzprintf(gz, "%s{\"ph\": \"X\", \"cat\": \"%s\", \"name\": \"k%d\", "
                                     "\"ts\": %d, \"dur\": 1, \"args\": {\"correlation\": %d}}\n",
                                 i ? "," : "", i % 2 ? "kernel" : "cpu_op", i % 8, i, i), >, 0);
    g_assert_cmpint(gzputs(gz, "]}\n"), >, 0);
    g_assert_cmpint(gzclose(gz), ==, Z_OK);
    ZpTorchTrace *t = zp_torch_trace_new();
    GError *error = NULL;
    const double t0 = zp_now_s();
    g_assert_true(zp_torch_trace_read(t, path, &error));
    g_assert_no_error(error);
    g_test_message("1e6 events read in %.2f s", zp_now_s() - t0);
    ZpTraceSummary s;
    zp_torch_trace_summary(t, &s);
    g_assert_cmpuint(s.kernels, ==, (guint64)n / 2);
    g_assert_cmpuint(s.instances[ZP_KCLASS_UNKNOWN], ==, (guint64)n / 2);
    json_t *unknown = zp_torch_trace_unknown(t);
    g_assert_cmpuint(json_array_size(unknown), ==, 4); /* k1, k3, k5, k7 */
    json_decref(unknown);
    zp_torch_trace_free(t);
    g_remove(path);
    g_free(path);
}

/* ---- the command ---- */

static json_t *load(const char *path)
{
    json_t *root = json_load_file(path, 0, NULL);
    g_assert_nonnull(root);
    return root;
}

/* calibrate --torch-trace merges the tables into the base profile and records their source;
 * a second calibration on the first's output replaces its rows rather than adding to them. */
static void test_calibrate_command(void)
{
    char *trace = block_trace("cal.json", 3);
    char *out = g_build_filename(tmp_dir, "h100-torch.json", NULL);
    char *args = g_strdup_printf("calibrate --torch-trace %s --cluster dgx-h100 --out %s", trace,
                                 out);
    TuRun run = tu_zplan(args);
    g_assert_true(g_spawn_check_wait_status(run.status, NULL));
    g_assert_nonnull(strstr(run.out, "gemm"));
    g_assert_nonnull(strstr(run.out, "my_custom_scan_kernel"));
    tu_free(&run);
    ZpHw hw = tu_load_hw(out);
    const ZpCollRow *row = zp_colltab_find(&hw.collective_table, 0, 8);
    g_assert_nonnull(row);
    g_assert_cmpint(row->n, ==, 1);
    g_assert_cmpfloat(row->bytes[0], ==, 2097152);
    g_assert_cmpfloat_with_epsilon(row->time_s[0], 100e-6, 1e-15);
    json_t *p = load(out);
    json_t *tables = json_object_get(p, "kernel_tables");
    g_assert_cmpuint(json_array_size(json_object_get(tables, "gemm")), ==, 2);
    g_assert_nonnull(strstr(json_string_value(json_object_get(json_object_get(tables, "sources"),
                                                              "gemm")), "cal.json"));
    g_assert_nonnull(json_object_get(json_object_get(p, "notes"), "kernel_tables"));
    /* kernel_rates fitted: the GEMM best rate that gives the time-weighted median shape its
     * measured time on the wave model (both 16-bit GEMMs are compute-bound there), each
     * memory step its shapes' bytes / (time x HBM bandwidth), at most 1. */
    const ZpHw base = tu_load_hw("dgx-h100");
    const ZpKernRates *kr = &base.kernel_rates;
    const double shapes[2][4] = {{8192, 3072, 768, 70e-6}, {8192, 768, 3072, 40e-6}};
    double want[2];
    for (int i = 0; i < 2; i++) {
        const double *g = shapes[i];
        const double waves_s = zp_kernrate_gemm_s(kr, base.hbm_bytes_per_s, 1, g[0], g[1], g[2], 0);
        const double bytes = 2 * (g[0] * g[2] + g[2] * g[1] + g[0] * g[1]);
        g_assert_cmpfloat(waves_s, >=, zp_kernrate_gemm_s(kr, base.hbm_bytes_per_s, 1, g[0], g[1],
                                                          g[2], bytes));
        want[i] = kr->gemm_best_flops_per_s * waves_s / g[3];
    }
    /* weights 3 x 70 and 3 x 40 us: the heavier row holds the median */
    g_assert_cmpfloat_with_epsilon(hw.kernel_rates.gemm_best_flops_per_s, want[0],
                                   1e-9 * want[0]);
    g_assert_cmpfloat(want[0], !=, want[1]);
    g_assert_cmpfloat(hw.kernel_rates.memory_efficiency[0], ==, kr->memory_efficiency[0]);
    g_assert_cmpfloat(hw.kernel_rates.memory_efficiency[1], ==, kr->memory_efficiency[1]);
    g_assert_cmpfloat(hw.kernel_rates.memory_efficiency[2], ==, 1.0); /* the add, 37.7 MB */
    g_assert_cmpfloat_with_epsilon(hw.kernel_rates.memory_efficiency[3],
                                   2 * 4194304.0 / (4e-6 * base.hbm_bytes_per_s), 1e-12);
    g_assert_nonnull(strstr(json_string_value(json_object_get(json_object_get(p, "notes"),
                                                              "kernel_rates.gemm")),
                            "calibrate --torch-trace cal.json"));
    json_t *summary = json_object_get(json_object_get(p, "calibration"), "torch_trace");
    g_assert_cmpuint(json_array_size(json_object_get(summary, "unknown_kernels")), ==, 1);
    json_decref(p);
    g_free(args);
    char *again = g_build_filename(tmp_dir, "again.json", NULL);
    args = g_strdup_printf("calibrate --torch-trace %s --cluster %s --out %s", trace, out, again);
    run = tu_zplan(args);
    g_assert_true(g_spawn_check_wait_status(run.status, NULL));
    tu_free(&run);
    p = load(again);
    g_assert_cmpuint(json_array_size(json_object_get(json_object_get(p, "kernel_tables"), "gemm")),
                     ==, 2);
    json_decref(p);
    g_free(args);
    /* Bad input: one line naming the fault, nothing written. */
    static const struct {
        const char *args, *message;
    } bad[] = {
        {"calibrate --torch-trace %s --out {OUT}", "needs --cluster"},
        {"calibrate --torch-trace {DIR}/nothing.json --cluster dgx-h100 --out {OUT}",
         "nothing.json"},
        {"calibrate --torch-trace %s --cluster dgx-h100", "give --out"},
        {"calibrate --torch-trace %s --cluster nosuch --out {OUT}", "--cluster: unknown"},
        {"calibrate x.json --torch-trace %s --cluster dgx-h100 --out {OUT}", "not both"},
        {"calibrate --torch-trace %s --torch-trace {DIR}/cpu-only.json --cluster dgx-h100 "
         "--out {OUT}", "cpu-only.json: no GPU kernels"},
    };
    Trace cpu = trace_new();
    step(&cpu, 0, 0, 1000);
    cpu_op(&cpu, "aten::mm", 10, json_pack("[[i, i], [i, i]]", 4, 4, 4, 4),
           json_pack("[s, s]", "float", "float"));
    char *cpu_only = write_trace("cpu-only.json", &cpu, 0);
    char *bad_out = g_build_filename(tmp_dir, "bad-out.json", NULL);
    for (size_t i = 0; i < G_N_ELEMENTS(bad); i++) {
        char *a = g_strdup_printf(bad[i].args, trace);
        GString *s = g_string_new(a);
        g_string_replace(s, "{OUT}", bad_out, 0);
        g_string_replace(s, "{DIR}", tmp_dir, 0);
        run = tu_zplan(s->str);
        g_assert_false(g_spawn_check_wait_status(run.status, NULL));
        g_test_message("%s -> %s", s->str, run.err);
        g_assert_nonnull(strstr(run.err, bad[i].message));
        g_assert_false(g_file_test(bad_out, G_FILE_TEST_EXISTS));
        tu_free(&run);
        g_string_free(s, TRUE);
        g_free(a);
    }
    g_free(bad_out);
    g_free(cpu_only);
    g_free(again);
    g_free(trace);
    g_free(out);
}

/* validate --torch-trace: the trace's classes measured exactly, the prediction's classes
 * summing to the simulated rank's op times (simulate --json's "ops"), and with the run's
 * steps file its step time and peak memory; a steps file of another configuration refused. */
static void test_validate_command(void)
{
    char *trace = block_trace("val.json", 3);
    const char *plan = "--model gpt2-124m --cluster dgx-h100 --gpus 1 --stage 0 "
                       "--micro-batch 2 --seq 512 --precision bf16";
    char *steps = g_build_filename(tmp_dir, "steps-rank0.json", NULL);
    json_t *run = json_pack("{s:s, s:i, s:i, s:i, s:f, s:f, s:f}", "format",
                            "zplan-torch-profile-1", "micro_batch", 2, "seq", 512, "world", 1,
                            "median_step_time_s", 0.05, "max_memory_allocated_bytes", 3e9,
                            "max_memory_reserved_bytes", 4e9);
    g_assert_cmpint(json_dump_file(run, steps, 0), ==, 0);
    char *args = g_strdup_printf("validate --torch-trace %s --torch-steps %s %s --json", trace,
                                 steps, plan);
    json_t *v = tu_zplan_json(args);
    char *sim_args = g_strdup_printf("simulate %s --json", plan);
    json_t *sim = tu_zplan_json(sim_args);
    double ops_s = 0, classes_s = 0;
    const char *op;
    json_t *o;
    json_object_foreach(json_object_get(sim, "ops"), op, o)
        ops_s += num(o, "total_s");
    json_t *rows = json_object_get(v, "rows");
    for (size_t i = 0; i < json_array_size(rows); i++) {
        json_t *r = json_array_get(rows, i);
        const char *q = json_string_value(json_object_get(r, "quantity"));
        if (strstr(q, "kernels per step"))
            classes_s += num(r, "predicted");
        if (strcmp(q, "gemm kernels per step (ms)") == 0)
            g_assert_cmpfloat_with_epsilon(num(r, "measured"), 110e-6, 1e-12);
        if (strcmp(q, "step time (ms)") == 0) {
            g_assert_cmpfloat(num(r, "measured"), ==, 0.05);
            g_assert_cmpfloat(num(r, "predicted"), ==, num(sim, "step_time_s"));
        }
        if (strcmp(q, "peak reserved (GB)") == 0)
            g_assert_cmpfloat(num(r, "measured"), ==, 4e9);
    }
    g_assert_cmpuint(json_array_size(rows), ==, 1 + ZP_KCLASS_N + 1 + 2);
    g_assert_cmpfloat_with_epsilon(classes_s, ops_s, 1e-9 * ops_s);
    json_decref(v), json_decref(sim);
    g_free(args), g_free(sim_args);
    /* The steps file of micro-batch 2 against a plan of 4. */
    args = g_strdup_printf("validate --torch-trace %s --torch-steps %s --model gpt2-124m "
                           "--cluster dgx-h100 --gpus 1 --stage 0 --micro-batch 4 --seq 512",
                           trace, steps);
    TuRun bad = tu_zplan(args);
    g_assert_false(g_spawn_check_wait_status(bad.status, NULL));
    g_assert_nonnull(strstr(bad.err, "ran another configuration: micro-batch 2"));
    tu_free(&bad);
    g_free(args);
    /* A plan flag's fault is named as validate's, not simulate's. */
    args = g_strdup_printf("validate --torch-trace %s --model gpt2-124m --gpus 1 --stage 0 "
                           "--micro-batch 2", trace);
    bad = tu_zplan(args);
    g_assert_false(g_spawn_check_wait_status(bad.status, NULL));
    g_assert_nonnull(strstr(bad.err, "zplan validate: --cluster"));
    tu_free(&bad);
    g_free(args);
    json_decref(run);
    g_free(steps);
    g_free(trace);
}

/* ---- public traces, when present ---- */

/* Kineto traces from a trace-analysis project's tests (facebookresearch/HolisticTraceAnalysis
 * tests/data, fetched for the run, never committed) in $ZP_PUBLIC_TRACES: each is read and
 * what was recognised is reported. Skipped without them. */
static void test_public_traces(void)
{
    const char *dir = g_getenv("ZP_PUBLIC_TRACES");
    GDir *d = dir ? g_dir_open(dir, 0, NULL) : NULL;
    if (!d) {
        g_test_skip("no public traces: set ZP_PUBLIC_TRACES to a folder of Kineto traces "
                    "(e.g. HolisticTraceAnalysis tests/data)");
        return;
    }
    const char *entry;
    int read = 0;
    while ((entry = g_dir_read_name(d))) {
        if (!g_str_has_suffix(entry, ".json") && !g_str_has_suffix(entry, ".json.gz"))
            continue;
        char *path = g_build_filename(dir, entry, NULL);
        ZpTorchTrace *t = zp_torch_trace_new();
        GError *error = NULL;
        if (zp_torch_trace_read(t, path, &error)) {
            ZpTraceSummary s;
            zp_torch_trace_summary(t, &s);
            GString *line = g_string_new(NULL);
            for (int c = 0; c <= ZP_KCLASS_N; c++)
                g_string_append_printf(line, " %s %.3f ms", zp_kclass_name(c),
                                       1e3 * s.class_step_s[c]);
            g_test_message("%s: %" G_GUINT64_FORMAT " kernels, %d steps, per step:%s", entry,
                           s.kernels, s.steps, line->str);
            g_string_free(line, TRUE);
            read++;
        } else {
            g_test_message("%s: %s", entry, error->message);
            g_error_free(error);
        }
        zp_torch_trace_free(t);
        g_free(path);
    }
    g_dir_close(d);
    g_assert_cmpint(read, >, 0);
}

/* zp_jsonstream's other keys handed over (keep_others) in the file's order, each element of
 * the streamed array with its index. */
static gboolean note_value(const char *key, void *value, gint64 index, guint64 offset, void *ctx,
                           GError **error)
{
    (void)value, (void)offset, (void)error;
    g_string_append_printf(ctx, "%s%" G_GINT64_FORMAT " ", key, index);
    return TRUE;
}

/* Streamed strictly, a file is read where zp_json_load_object reads it and refused where it
 * refuses it (the schedule reader falls back to it); without `strict` these pass. */
static void test_stream_strict(void)
{
    char *path = g_build_filename(tmp_dir, "strict.json", NULL);
    GString *seen = g_string_new(NULL);
    ZpJsonStreamOptions o = {.stream_key = "ev", .keep_others = TRUE, .max_value_bytes = 1 << 20};
    g_assert_true(g_file_set_contents(path, "{\"a\": 1, \"ev\": [{}, [2]], \"b\": {\"c\": [1]}}",
                                      -1, NULL));
    g_assert_true(zp_json_stream_with(path, &o, note_value, seen, NULL));
    g_assert_cmpstr(seen->str, ==, "a-1 ev0 ev1 b-1 ");
    char *open = g_strnfill(2100, '['), *close = g_strnfill(2100, ']');
    const struct {
        const char *text;
        gboolean loads; /* zp_json_load_object reads it */
        int depth;      /* an element nested this deep at its end, when > 0 */
    } cases[] = {
        {"{\"ev\": [1, 2]} \n\t", TRUE, 0},
        {"{\"ev\": [1, 2]} x", FALSE, 0},
        {"{\"a\": 1, \"ev\": [], \"a\": 2}", FALSE, 0},
        {"{\"ev\": [{\"x\": 1, \"x\": 2}]}", FALSE, 0},
        {"{\"ev\": [{\"x\": {\"y\": 1, \"y\": 2}}]}", FALSE, 0},
        {"{\"ev\": [", TRUE, 2000},  /* 2 + 2000 + 1 scalars deep: within 2048 */
        {"{\"ev\": [", FALSE, 2047}, /* the element's innermost at 2049 */
    };
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        char *text = cases[i].depth > 0
                         ? g_strdup_printf("%s%.*s1%.*s]}", cases[i].text, cases[i].depth, open,
                                           cases[i].depth, close)
                         : g_strdup(cases[i].text);
        g_assert_true(g_file_set_contents(path, text, -1, NULL));
        GError *error = NULL;
        json_t *root = zp_json_load_object(path, &error);
        g_assert_cmpint(root != NULL, ==, cases[i].loads);
        json_decref(root);
        g_clear_error(&error);
        o.strict = FALSE;
        g_assert_true(zp_json_stream_with(path, &o, note_value, seen, NULL));
        o.strict = TRUE;
        const gboolean streamed = zp_json_stream_with(path, &o, note_value, seen, &error);
        g_test_message("%s: %s", text, error ? error->message : "read");
        g_assert_cmpint(streamed, ==, cases[i].loads);
        g_clear_error(&error);
        g_free(text);
    }
    /* gzip: streamed plain, not strictly (zp_json_load_object reads no gzip). */
    gzFile gz = gzopen(path, "wb");
    g_assert_cmpint(gzputs(gz, "{\"ev\": []}"), >, 0);
    g_assert_cmpint(gzclose(gz), ==, Z_OK);
    o.strict = FALSE;
    g_assert_true(zp_json_stream_with(path, &o, note_value, seen, NULL));
    o.strict = TRUE;
    GError *error = NULL;
    g_assert_false(zp_json_stream_with(path, &o, note_value, seen, &error));
    g_assert_nonnull(strstr(error->message, "gzip"));
    g_clear_error(&error);
    g_assert_null(zp_json_load_object(path, &error));
    g_clear_error(&error);
    g_free(open);
    g_free(close);
    g_string_free(seen, TRUE);
    g_remove(path);
    g_free(path);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    tmp_dir = g_dir_make_tmp("zp-torch-trace-XXXXXX", NULL);
    g_test_add_func("/torch-trace/tables", test_tables);
    g_test_add_func("/torch-trace/ranks-median", test_ranks_median);
    g_test_add_func("/torch-trace/truncated", test_truncated);
    g_test_add_func("/torch-trace/unlinked-and-zero", test_unlinked_and_zero);
    g_test_add_func("/torch-trace/old-format", test_old_format);
    g_test_add_func("/torch-trace/million-events", test_million_events);
    g_test_add_func("/torch-trace/calibrate", test_calibrate_command);
    g_test_add_func("/torch-trace/validate", test_validate_command);
    g_test_add_func("/torch-trace/public-traces", test_public_traces);
    g_test_add_func("/torch-trace/stream-strict", test_stream_strict);
    const int status = g_test_run();
    char *rm = g_strdup_printf("rm -rf %s", tmp_dir);
    g_assert_cmpint(system(rm), ==, 0);
    g_free(rm);
    g_free(tmp_dir);
    return status;
}
