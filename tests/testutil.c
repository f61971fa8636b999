/* testutil: spawning the programs under test for the end-to-end tests, synchronously, with
 * their output captured; a failure to spawn at all fails the test on the spot. */
#include "testutil.h"

#ifndef ZP_BUILD_DIR
#define ZP_BUILD_DIR "build"
#endif

TuRun tu_run(const char *command, char **envp)
{
    char **argv = NULL;
    TuRun r = {0};
    g_assert_true(g_shell_parse_argv(command, NULL, &argv, NULL));
    g_assert_true(g_spawn_sync(NULL, argv, envp, G_SPAWN_SEARCH_PATH, NULL, NULL, &r.out,
                               &r.err, &r.status, NULL));
    g_strfreev(argv);
    return r;
}

TuRun tu_zplan(const char *args)
{
    char *command = g_strdup_printf("%s/zplan %s", ZP_BUILD_DIR, args);
    TuRun r = tu_run(command, NULL);
    g_free(command);
    return r;
}

void tu_free(TuRun *run)
{
    g_free(run->out);
    g_free(run->err);
}
