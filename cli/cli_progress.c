/* cli_progress: one self-redrawing stderr line per long command ("what: 45% (3.1 s)"), kept off
 * stdout so that --json stays clean, and off pipes and files unless asked for. */
#include "cli_progress.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Work shorter than this shows nothing; redraws come at most this often. */
#define PROGRESS_AFTER_US (2 * G_USEC_PER_SEC)
#define PROGRESS_EVERY_US (G_USEC_PER_SEC / 4)

struct CliProgress {
    char *what;
    gint64 start_us, last_us, after_us;
    gboolean enabled, drawn, terminal;
};

CliProgress *cli_progress_new(const char *what)
{
    CliProgress *p = g_new0(CliProgress, 1);
    const char *mode = g_getenv("ZPLAN_PROGRESS");
    p->what = g_strdup(what);
    p->start_us = g_get_monotonic_time();
    p->terminal = isatty(STDERR_FILENO);
    p->enabled = mode && strcmp(mode, "always") == 0   ? TRUE
                 : mode && strcmp(mode, "never") == 0 ? FALSE
                                                      : p->terminal;
    p->after_us = mode && strcmp(mode, "always") == 0 ? 0 : PROGRESS_AFTER_US;
    return p;
}

void cli_progress_update(double fraction, void *ctx)
{
    CliProgress *p = ctx;
    const gint64 now = g_get_monotonic_time();
    if (!p->enabled || now - p->start_us < p->after_us ||
        (p->drawn && now - p->last_us < PROGRESS_EVERY_US))
        return;
    /* A terminal gets one line redrawn in place; anything else one line per update. */
    fprintf(stderr, "%s%s: %3.0f%% (%.1f s)%s", p->terminal ? "\r" : "", p->what,
            100 * CLAMP(fraction, 0.0, 1.0), (double)(now - p->start_us) / G_USEC_PER_SEC,
            p->terminal ? "\033[K" : "\n");
    fflush(stderr);
    p->drawn = TRUE;
    p->last_us = now;
}

void cli_progress_free(CliProgress *p)
{
    if (!p)
        return;
    if (p->drawn && p->terminal)
        fputs("\r\033[K", stderr); /* the answer follows on a clean line */
    g_free(p->what);
    g_free(p);
}
