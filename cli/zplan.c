/* zplan: the command-line front end, one table row per subcommand (cli_NAME.c); it lives in
 * cli/ with zreal's main, above planner/, sim/ and real/, which never include cli/. */
#include "cli.h"
#include "zp_util.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    const char *name;
    CliCommand run;
    const char *summary;
} Command;

static const Command commands[] = {
    {"memory", cli_memory, "model-state and residual memory per GPU (ZeRO paper Table 1)"},
    {"maxmodel", cli_maxmodel, "largest model whose states fit per stage (Table 2)"},
    {"plan", cli_plan, "search stage, batch, checkpointing, TP and buckets; rank by simulation"},
    {"sweep", cli_sweep, "vary GPUs, size, micro-batch or stage; write a CSV and an SVG plot"},
    {"simulate", cli_simulate, "simulate one training step: time, MFU, breakdown, memory"},
    {"schedule", cli_schedule, "one step's per-rank op list as JSON (for zreal --schedule)"},
    {"validate", cli_validate, "predicted (simulate --json) against measured (zreal --out)"},
    {"calibrate", cli_calibrate, "fit a hwprofile from zreal --microbench runs"},
    {"report", cli_report, "simulate one step and write it as an HTML page (--html OUT.html)"},
};

/* What a flag left out means, in every command that takes it (cli.c sets them, and each
 * command states the ones it took in its output's first lines). */
static const struct {
    const char *flag, *meaning;
} defaults[] = {
    {"--seq", "the model's, at most 4096 (a config's max_position_embeddings is a maximum)"},
    {"--precision", "config.json's torch_dtype where the GPU has it (bf16 not on V100), else fp16"},
    {"--optimizer", "adam"},
    {"--attention", "PyTorch SDPA's choice for the dtype on the cluster (no FlashAttention in fp32); flash2 without one"},
    {"--reduce-dtype", "the gradients' own dtype"},
    {"--impl", "deepspeed"},
    {"--mp", "1 (plan: searched)"},
    {"--micro-batch", "1 (plan, sweep tflops: searched; simulate: required)"},
    {"--checkpoint", "off (plan: searched)"},
    {"--offload-*", "none (plan: searched when nothing fits on the GPUs)"},
    {"--zeropp", "lossless: plan searches hpZ; the lossy qwZ and qgZ only with --zeropp lossy"},
    {"--tokens", "none: with it (or --steps), the days, GPU-hours and, with --gpu-hour-price, cost"},
    {"--gpu-memory", "the cluster's; with --cluster, its GPUs with that memory"},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: zplan COMMAND [OPTIONS]   (zplan COMMAND --help for its options)\n\n");
    for (size_t i = 0; i < G_N_ELEMENTS(commands); i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\nDefaults (what a flag left out means):\n");
    for (size_t i = 0; i < G_N_ELEMENTS(defaults); i++)
        fprintf(out, "  %-14s %s\n", defaults[i].flag, defaults[i].meaning);
    fprintf(out, "\nExit status: 0 an answer, 1 bad input or usage, 2 does not fit, 3 validate "
                 "over --tolerance.\n");
}

/* Standard output is flushed, checked and closed before exit: output lost to a full disk or
 * a closed pipe fails the command (one line, status 1) instead of passing for success. */
static int close_stdout(const char *command, int status)
{
    errno = 0;
    const gboolean flushed = fflush(stdout) == 0;
    const int flush_errno = errno;
    const gboolean clean = flushed && !ferror(stdout);
    if (fclose(stdout) == 0 && clean)
        return status;
    if (status == 0)
        fprintf(stderr, "zplan%s%s: writing to standard output: %s\n", command ? " " : "",
                command ? command : "",
                flush_errno ? g_strerror(flush_errno) : errno ? g_strerror(errno) : "write error");
    return status ? status : 1;
}

static int run(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 1; /* usage: 2 is "does not fit" */
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    GError *error = NULL;
    if (!zp_check_args_utf8(argc, argv, &error))
        return cli_fail(g_utf8_validate(argv[1], -1, NULL) ? argv[1] : "", error);
    for (size_t i = 0; i < G_N_ELEMENTS(commands); i++)
        if (strcmp(argv[1], commands[i].name) == 0) {
            char *prgname = g_strdup_printf("zplan %s", argv[1]);
            g_set_prgname(prgname); /* GLib copies it */
            g_free(prgname);
            return commands[i].run(argc - 1, argv + 1);
        }
    const char *names[G_N_ELEMENTS(commands)];
    for (size_t i = 0; i < G_N_ELEMENTS(commands); i++)
        names[i] = commands[i].name;
    const char *closest = zp_closest_name(argv[1], names, G_N_ELEMENTS(commands));
    fprintf(stderr, "zplan: unknown command '%s' (see zplan --help)%s%s%s\n", argv[1],
            closest ? ". Did you mean '" : "", closest ? closest : "", closest ? "'?" : "");
    return 1;
}

/* OpenBLAS (linked for GSL's fits; zplan multiplies no large matrices) starts a worker per
 * core when loaded, and an idle worker spins on sched_yield for 2^28 cycles before it sleeps
 * (driver/others/blas_server.c blas_thread_server, thread_timeout): about 0.1 s of CPU on a
 * second core in every zplan run that lasts that long. Stopped here; a later BLAS call (the
 * collective fit's) starts them again (exec_blas -> blas_thread_init). Weak: a BLAS without
 * the call (a serial build) leaves it NULL. */
extern int blas_thread_shutdown_(void) __attribute__((weak));

int main(int argc, char **argv)
{
    zp_malloc_keep_freed(); /* an evaluation's phases reuse each other's pages */
    if (blas_thread_shutdown_)
        blas_thread_shutdown_();
    return close_stdout(argc > 1 ? argv[1] : NULL, run(argc, argv));
}
