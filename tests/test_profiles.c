/* test_profiles: the hardware and models people reach for (issue 39 item 5): --gpu-memory on
 * every command, --model ORG/NAME from the local Hugging Face cache (a fake cache in a temp
 * dir), and the new shipped profiles, dgx-a100-40g, dgx-b200, a100-pcie-80g and h100-pcie. */
#include "testutil.h"

#include <glib/gstdio.h>
#include <jansson.h>
#include <string.h>
#include <sys/wait.h>

static int exit_status(const TuRun *r)
{
    return WIFEXITED(r->status) ? WEXITSTATUS(r->status) : -1;
}

/* Runs build/zplan with HF_HOME (and nothing else of the hub's variables) set to `home`. */
static TuRun zplan_with_hf_home(const char *home, const char *args)
{
    char **envp = g_get_environ();
    envp = g_environ_unsetenv(envp, "HF_HUB_CACHE");
    envp = g_environ_setenv(envp, "HF_HOME", home, TRUE);
    char *command = g_strdup_printf("%s/zplan %s", ZP_BUILD_DIR, args);
    TuRun r = tu_run(command, envp);
    g_free(command);
    g_strfreev(envp);
    return r;
}

/* A fake cache: HF_HOME/hub/models--meta-llama--Meta-Llama-3-70B/snapshots/REV/config.json with
 * refs/main naming REV (and an older snapshot beside it that refs/main does not name), as
 * huggingface_hub lays it out. --model meta-llama/Meta-Llama-3-70B reads it (it was refused);
 * absent, the error says where it looked. */
static void test_hf_cache(void)
{
    char *home = g_dir_make_tmp("zplan-hf-XXXXXX", NULL);
    char *repo = g_build_filename(home, "hub", "models--meta-llama--Meta-Llama-3-70B", NULL);
    char *snap = g_build_filename(repo, "snapshots", "b4d08b7db49d488da3ac49adf25a6b9ac01ae338",
                                  NULL);
    char *old = g_build_filename(repo, "snapshots", "0000old", NULL);
    char *refs = g_build_filename(repo, "refs", NULL);
    g_assert_cmpint(g_mkdir_with_parents(snap, 0755), ==, 0);
    g_assert_cmpint(g_mkdir_with_parents(old, 0755), ==, 0);
    g_assert_cmpint(g_mkdir_with_parents(refs, 0755), ==, 0);
    char *config = NULL, *shipped = g_build_filename(ZP_DATA_DIR, "models", "hf", "llama-3-70b",
                                                      "config.json", NULL);
    g_assert_true(g_file_get_contents(shipped, &config, NULL, NULL));
    char *in_snap = g_build_filename(snap, "config.json", NULL);
    char *in_old = g_build_filename(old, "config.json", NULL);
    char *main_ref = g_build_filename(refs, "main", NULL);
    g_assert_true(g_file_set_contents(in_snap, config, -1, NULL));
    g_assert_true(g_file_set_contents(in_old, "{\"broken\": ", -1, NULL)); /* not read */
    g_assert_true(g_file_set_contents(main_ref, "b4d08b7db49d488da3ac49adf25a6b9ac01ae338", -1,
                                      NULL));
    TuRun r = zplan_with_hf_home(home, "memory --model meta-llama/Meta-Llama-3-70B --gpus 64 "
                                       "--json");
    g_test_message("%s", r.err);
    g_assert_cmpint(exit_status(&r), ==, 0);
    json_t *root = json_loads(r.out, 0, NULL);
    g_assert_nonnull(root);
    g_assert_cmpint(json_integer_value(json_object_get(root, "params")), ==, 70553706496);
    g_assert_cmpstr(json_string_value(json_object_get(root, "model")), ==, "Meta-Llama-3-70B");
    json_decref(root);
    tu_free(&r);
    /* Another repository is not there: one line saying where zplan looked. */
    r = zplan_with_hf_home(home, "memory --model meta-llama/Llama-2-7b-hf --gpus 8");
    g_assert_cmpint(exit_status(&r), ==, 1);
    char *looked = g_strdup_printf("--model: 'meta-llama/Llama-2-7b-hf' is not in the local "
                                   "Hugging Face cache (looked for %s/hub/"
                                   "models--meta-llama--Llama-2-7b-hf/snapshots/*/config.json",
                                   home);
    g_assert_nonnull(strstr(r.err, looked));
    g_assert_null(strchr(r.err, '\n') + 1 < r.err + strlen(r.err) ? "two lines" : NULL);
    tu_free(&r);
    g_remove(in_snap), g_remove(in_old), g_remove(main_ref);
    g_rmdir(snap), g_rmdir(old), g_rmdir(refs);
    char *snapshots = g_path_get_dirname(snap), *hub = g_path_get_dirname(repo);
    g_rmdir(snapshots), g_rmdir(repo), g_rmdir(hub), g_rmdir(home);
    g_free(snapshots), g_free(hub), g_free(looked), g_free(in_snap), g_free(in_old);
    g_free(main_ref), g_free(config), g_free(shipped), g_free(refs), g_free(old), g_free(snap);
    g_free(repo), g_free(home);
}

/* --gpu-memory was refused by memory, simulate and plan. Now: memory takes it alone (a bare
 * GPU) or with --cluster; simulate and plan with --cluster (whose rates time the step), the
 * capacity in the verdict. */
static void test_gpu_memory_everywhere(void)
{
    const struct {
        const char *args, *capacity;
    } cases[] = {
        {"memory --model gpt2-1.5b --gpus 8 --gpu-memory 40GB", "of 37.25 GiB (40.0 GB)"},
        {"memory --model gpt2-1.5b --cluster dgx-a100-80g --gpus 8 --gpu-memory 40GB",
         "of 37.25 GiB (40.0 GB)"},
        {"simulate --model gpt2-1.5b --cluster dgx-a100-80g --gpus 8 --gpu-memory 40GB --stage 1 "
         "--micro-batch 8", "of 37.25 GiB (40.0 GB)"},
        {"plan --model gpt2-1.5b --cluster dgx-a100-80g --gpus 8 --gpu-memory 40GB --top 1",
         "of 37.25 GiB (40.0 GB)"},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        TuRun r = tu_zplan(cases[i].args);
        g_test_message("zplan %s: %s", cases[i].args, r.err);
        g_assert_cmpint(exit_status(&r), ==, 0);
        char **lines = g_strsplit(r.out, "\n", 2);
        g_assert_true(g_str_has_prefix(lines[0], "Fits: "));
        g_assert_nonnull(strstr(lines[0], cases[i].capacity));
        g_strfreev(lines);
        tu_free(&r);
    }
}

/* The new shipped profiles load, with the datasheets' figures (test_cli checks every figure
 * has its note): DGX A100 320GB (40 GiB at 1,555 GB/s, 1 TB host, 15.36 TB NVMe), DGX B200
 * (180 GB at 8 TB/s, 2.25 PFLOP/s bf16, 30.72 TB NVMe); Llama-3-70B fits either at stage 3
 * with checkpointing on 64 of them. */
static void test_new_profiles(void)
{
    const ZpHw a = tu_load_hw("dgx-a100-40g"), b = tu_load_hw("dgx-b200");
    g_assert_cmpfloat(a.gpu_memory_bytes, ==, 40.0 * 0x1p30);
    g_assert_cmpfloat(a.hbm_bytes_per_s, ==, 1.555e12);
    g_assert_cmpfloat(a.cpu_memory_bytes, ==, 1e12);
    g_assert_cmpfloat(a.nvme_bytes, ==, 15.36e12);
    g_assert_cmpfloat(b.gpu_memory_bytes, ==, 180e9);
    g_assert_cmpfloat(b.peak_bf16_flops, ==, 2.25e15);
    g_assert_cmpfloat(b.hbm_bytes_per_s, ==, 8e12);
    g_assert_cmpfloat(b.nvme_bytes, ==, 30.72e12);
    g_assert_cmpint(b.gpus_per_node, ==, 8);
    const char *clusters[] = {"dgx-a100-40g", "dgx-b200"};
    for (size_t i = 0; i < G_N_ELEMENTS(clusters); i++) {
        char *args = g_strdup_printf("memory --model hf/llama-3-70b --cluster %s --gpus 64 "
                                     "--checkpoint", clusters[i]);
        TuRun r = tu_zplan(args);
        g_assert_cmpint(exit_status(&r), ==, 0);
        g_assert_true(g_str_has_prefix(r.out, "Fits: stage 3 on 64 GPUs"));
        tu_free(&r);
        g_free(args);
    }
}

/* The PCIe nodes (8 GPUs on 2 sockets, NVLink bridges in pairs only): their datasheets' figures,
 * PCIe inside the node at NCCL's topology bound (24 GB/s: Gen4 x16 = 16 x 120 / 80, the
 * sockets' link for Gen5), the per-kernel-class rates (the A100 PCIe's published best GEMM,
 * 252.9 TFLOP/s on 108 SMs; the H100 PCIe none, so its GEMMs stay on the roofline and its
 * attention is eager, nothing scaled from the SXM parts), and no NVMe nobody published. */
static void test_pcie_profiles(void)
{
    const ZpHw a = tu_load_hw("a100-pcie-80g"), h = tu_load_hw("h100-pcie");
    g_assert_cmpint(a.gpus_per_node, ==, 8);
    g_assert_cmpfloat(a.hbm_bytes_per_s, ==, 1.935e12);
    g_assert_cmpfloat(a.peak_bf16_flops, ==, 312e12);
    g_assert_cmpfloat(a.intra_node_bytes_per_s, ==, 31.5e9);
    g_assert_cmpfloat(a.intra_node_bus_bytes_per_s, ==, 24e9);
    g_assert_true(a.kernel_rates.present && a.kernel_rates.has_gemm);
    g_assert_cmpfloat(a.kernel_rates.gemm_best_flops_per_s, ==, 252.9e12);
    g_assert_cmpfloat(a.kernel_rates.sms, ==, 108);
    g_assert_cmpint(a.attention_default, ==, ZP_ATTN_FLASH2);
    g_assert_cmpfloat(h.hbm_bytes_per_s, ==, 2.0e12);
    g_assert_cmpfloat(h.peak_bf16_flops, ==, 756e12);
    g_assert_cmpfloat(h.peak_fp32_flops, ==, 51e12);
    g_assert_cmpfloat(h.intra_node_bytes_per_s, ==, 63e9);
    g_assert_cmpfloat(h.intra_node_bus_bytes_per_s, ==, 24e9);
    g_assert_cmpfloat(h.gemm_half_efficiency_flops, ==, 2.0 * 114 * 128 * 128 * 1024);
    g_assert_true(h.kernel_rates.present && !h.kernel_rates.has_gemm);
    g_assert_cmpint(h.attention_default, ==, ZP_ATTN_EAGER);
    g_assert_cmpfloat(a.nvme_bytes, ==, 0);
    g_assert_cmpfloat(h.nvme_bytes, ==, 0);
    static const struct {
        const char *cluster, *costed;
    } cases[] = {
        {"a100-pcie-80g", "GEMMs on the wave and tile surface under the published best rate"},
        {"h100-pcie", "GEMMs on the roofline (the profile has no GEMM surface)"},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        char *args = g_strdup_printf("memory --model hf/llama-3-70b --cluster %s --gpus 64 "
                                     "--checkpoint", cases[i].cluster);
        TuRun r = tu_zplan(args);
        g_assert_cmpint(exit_status(&r), ==, 0);
        g_assert_true(g_str_has_prefix(r.out, "Fits: stage 3 on 64 GPUs"));
        tu_free(&r);
        g_free(args);
        args = g_strdup_printf("simulate --model hf/llama-2-7b --cluster %s --gpus 16 --stage 3 "
                               "--micro-batch 1 --checkpoint", cases[i].cluster);
        r = tu_zplan(args);
        g_assert_cmpint(exit_status(&r), ==, 0);
        g_assert_nonnull(strstr(r.out, cases[i].costed));
        tu_free(&r);
        g_free(args);
    }
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/profiles/hf-cache", test_hf_cache);
    g_test_add_func("/profiles/gpu-memory-everywhere", test_gpu_memory_everywhere);
    g_test_add_func("/profiles/new-profiles", test_new_profiles);
    g_test_add_func("/profiles/pcie-profiles", test_pcie_profiles);
    return g_test_run();
}
