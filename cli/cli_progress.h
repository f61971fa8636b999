/* cli_progress: progress of long commands on stderr (never stdout), shown only when stderr is
 * a terminal and the work has run for more than two seconds; ZPLAN_PROGRESS overrides. */
#ifndef CLI_PROGRESS_H
#define CLI_PROGRESS_H

#include <glib.h>

typedef struct CliProgress CliProgress;

/* Starts timing `what` ("zplan simulate: simulating 512 ranks"). ZPLAN_PROGRESS=always shows
 * progress from the start whatever stderr is (for tests), =never hides it. */
CliProgress *cli_progress_new(const char *what);

/* A ZpProgressFn: `fraction` of the work is done; ctx is the CliProgress. Redraws one line at
 * most four times a second. */
void cli_progress_update(double fraction, void *ctx);

/* Ends the line it drew, if any, and frees. NULL is ignored. */
void cli_progress_free(CliProgress *progress);

#endif
