/* fuzz_util: what the harnesses share — a private scratch directory for the input file the
 * loaders read, and silencing the command-line loaders' output. */
#include "fuzz.h"

#include <fcntl.h>
#include <glib.h>
#include <glib/gstdio.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static char *scratch_dir;
static GPtrArray *scratch_files;

static void remove_scratch(void)
{
    for (guint i = 0; i < scratch_files->len; i++)
        g_remove(g_ptr_array_index(scratch_files, i));
    g_rmdir(scratch_dir);
    g_ptr_array_unref(scratch_files);
    g_free(scratch_dir);
}

const char *fuzz_scratch_path(const char *name)
{
    if (!scratch_dir) {
        scratch_dir = g_dir_make_tmp("zplan-fuzz-XXXXXX", NULL);
        if (!scratch_dir)
            abort();
        scratch_files = g_ptr_array_new_with_free_func(g_free);
        atexit(remove_scratch);
    }
    for (guint i = 0; i < scratch_files->len; i++) {
        char *base = g_path_get_basename(g_ptr_array_index(scratch_files, i));
        const int same = g_str_equal(base, name);
        g_free(base);
        if (same)
            return g_ptr_array_index(scratch_files, i);
    }
    g_ptr_array_add(scratch_files, g_build_filename(scratch_dir, name, NULL));
    return g_ptr_array_index(scratch_files, scratch_files->len - 1);
}

const char *fuzz_input_path(const char *name, const uint8_t *data, size_t size)
{
    char *file = g_strconcat(name, ".json", NULL);
    const char *path = fuzz_scratch_path(file);
    g_free(file);
    if (!g_file_set_contents(path, (const char *)data, (gssize)size, NULL))
        abort(); /* the harness itself failed: not a finding */
    return path;
}

void fuzz_run_quiet(int (*command)(int argc, char **argv), int argc, char **argv)
{
    fflush(stdout);
    fflush(stderr);
    const int saved_out = dup(STDOUT_FILENO), saved_err = dup(STDERR_FILENO);
    const int null = open("/dev/null", O_WRONLY);
    dup2(null, STDOUT_FILENO);
    dup2(null, STDERR_FILENO);
    close(null);
    command(argc, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(saved_out, STDOUT_FILENO);
    dup2(saved_err, STDERR_FILENO);
    close(saved_out);
    close(saved_err);
}
