/* real_watch: a zreal rank's whole-process watchdog under mpirun, from before MPI_Init to after
 * MPI_Finalize: per-rank heartbeat files in the job's session directory name the rank that stopped. */
#include "real_watch.h"
#include "zp_util.h"

#include <errno.h>
#include <fcntl.h>
#include <glib/gstdio.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A rank's heartbeat is its file's modification time, rewritten every period_s by its watchdog
 * thread (which a SIGSTOP stops with the rest of the process); the file holds its phase. The
 * files live in the directory Open MPI's mpirun makes for the job on each node and removes when
 * the job ends, whatever way it ends (OMPI_MCA_orte_jobfam_session_dir; PMIx's server directory
 * elsewhere), so nothing is left behind. Ranks on other nodes would not see them: the watch is
 * on only when the whole world is on this node (OMPI_COMM_WORLD_LOCAL_SIZE = SIZE); a job over
 * several nodes keeps the collectives' own deadlines (real_comm_mpi.c). */
typedef struct {
    gboolean on;
    int rank, size;
    double silence_s, period_s;
    char *dir, *own_path;
    GThread *thread;
    GMutex lock; /* guards phase and the writes of the own file */
    GCond wake;
    RealWatchPhase phase;
    gint64 started_us, done_us; /* wall clock: the files' times are wall clock too */
} Watch;

static Watch watch;

static const char *const phase_places[REAL_WATCH_N] = {
    "before MPI_Init returned", "during the run", "inside MPI_Finalize", "after finishing"};

static char *rank_path(int rank)
{
    char name[32];
    snprintf(name, sizeof name, "rank.%d", rank);
    return g_build_filename(watch.dir, name, NULL);
}

/* Ends the process with status 1 and, on the one rank that claims the report, one line. */
static void G_GNUC_PRINTF(1, 2) fail_job(const char *format, ...)
{
    va_list args;
    va_start(args, format);
    char *message = g_strdup_vprintf(format, args);
    va_end(args);
    if (real_watch_claim_report())
        fprintf(stderr, "zreal rank %d: %s\n", watch.rank, message);
    else /* the rank that reports it may see it a moment later: let it say it first */
        g_usleep((gulong)(watch.period_s * 2 * G_USEC_PER_SEC));
    _exit(1);
}

/* Rewrites this rank's file: its phase, and by the write its heartbeat (lock held). */
static void beat(void)
{
    char text[8];
    snprintf(text, sizeof text, "%d\n", (int)watch.phase);
    GError *error = NULL;
    /* Written beside and renamed over: a reader sees the old phase or the new, never half. */
    if (!g_file_set_contents_full(watch.own_path, text, -1, G_FILE_SET_CONTENTS_CONSISTENT, 0600,
                                  &error))
        fail_job("the watchdog cannot write its heartbeat: %s", error->message);
}

/* A peer's phase and how long its heartbeat has been silent (a peer with no file yet: silent
 * since this rank started, and in MPI_Init). */
static RealWatchPhase peer_state(int rank, gint64 now_us, double *silent_s)
{
    char *path = rank_path(rank), *text = NULL;
    GStatBuf st;
    RealWatchPhase phase = REAL_WATCH_INIT;
    gint64 beat_us = watch.started_us;
    if (g_stat(path, &st) == 0) {
        beat_us = (gint64)st.st_mtim.tv_sec * G_USEC_PER_SEC + st.st_mtim.tv_nsec / 1000;
        if (g_file_get_contents(path, &text, NULL, NULL))
            phase = (RealWatchPhase)CLAMP(atoi(text), 0, REAL_WATCH_N - 1);
    }
    *silent_s = (double)(now_us - beat_us) / G_USEC_PER_SEC;
    g_free(text);
    g_free(path);
    return phase;
}

/* One look at the peers: fails the job for a silent or unfinished one; TRUE once every peer
 * has finished. While this rank runs, the collectives wait with the same deadline and name the
 * op they were in, so the watchdog gives them the first word (twice the silence). */
static gboolean check_peers(RealWatchPhase mine)
{
    const gint64 now_us = g_get_real_time();
    const double limit_s = mine == REAL_WATCH_RUN ? 2 * watch.silence_s : watch.silence_s;
    gboolean all_done = TRUE;
    for (int q = 0; q < watch.size; q++) {
        double silent_s;
        const RealWatchPhase phase = q == watch.rank ? REAL_WATCH_DONE
                                                     : peer_state(q, now_us, &silent_s);
        if (phase == REAL_WATCH_DONE)
            continue;
        all_done = FALSE;
        if (silent_s >= limit_s)
            fail_job("rank %d stopped answering %s: no heartbeat for %.1f s (ZREAL_COMM_TIMEOUT_S "
                     "%g s); ending the job", q, phase_places[phase], silent_s, watch.silence_s);
        if (mine == REAL_WATCH_DONE &&
            (double)(now_us - watch.done_us) / G_USEC_PER_SEC >= watch.silence_s)
            fail_job("rank %d did not finish within %g s (ZREAL_COMM_TIMEOUT_S) of its peers: "
                     "it is still %s; ending the job", q, watch.silence_s, phase_places[phase]);
    }
    return all_done;
}

/* How often a rank that has finished looks for its peers' DONE, for its first second. The
 * ranks leave MPI_Finalize moments apart, and mpirun ends the job when the last rank exits: a
 * finished rank that slept a whole period (0.5 s at the default timeout) before looking again
 * kept the job that much longer, in most runs of two ranks or more (`mpirun -np 2 zreal
 * --model tiny --steps 20`: 0.88-0.91 s in 8 of 10 runs, 0.37-0.39 s in the rest; at 5 ms,
 * 0.35-0.38 s in 5 of 5; -np 4: 1.21-1.23 s, then 0.67-0.76 s). A look is a stat and a read
 * of a few bytes a peer; past the first second (a peer slow or stuck in MPI_Finalize, which
 * the timeout judges) the rank looks once a period again. */
#define REAL_WATCH_DONE_POLL_S 0.005
#define REAL_WATCH_DONE_POLL_FOR_S 1.0

static gpointer watch_thread(gpointer data)
{
    (void)data;
    for (;;) {
        g_mutex_lock(&watch.lock);
        beat();
        const RealWatchPhase mine = watch.phase;
        g_mutex_unlock(&watch.lock);
        if (check_peers(mine) && mine == REAL_WATCH_DONE)
            return NULL;
        const double done_s = (double)(g_get_real_time() - watch.done_us) / G_USEC_PER_SEC;
        const double wait_s = mine == REAL_WATCH_DONE && done_s < REAL_WATCH_DONE_POLL_FOR_S
                                  ? MIN(watch.period_s, REAL_WATCH_DONE_POLL_S)
                                  : watch.period_s;
        g_mutex_lock(&watch.lock);
        /* A new phase wakes the thread early, so DONE is published at once. */
        if (watch.phase == mine)
            g_cond_wait_until(&watch.wake, &watch.lock,
                              g_get_monotonic_time() + (gint64)(wait_s * G_USEC_PER_SEC));
        g_mutex_unlock(&watch.lock);
    }
}

/* An integer environment variable Open MPI sets for each rank; -1 when absent. */
static int env_int(const char *name)
{
    const char *text = g_getenv(name);
    return text && *text ? atoi(text) : -1;
}

gboolean real_watch_start(double timeout_s, GError **error)
{
    const int rank = env_int("OMPI_COMM_WORLD_RANK"), size = env_int("OMPI_COMM_WORLD_SIZE");
    const char *base = g_getenv("OMPI_MCA_orte_jobfam_session_dir");
    const char *job = g_getenv("PMIX_NAMESPACE");
    if (!base)
        base = g_getenv("PMIX_SERVER_TMPDIR");
    if (size <= 1 || rank < 0 || rank >= size || env_int("OMPI_COMM_WORLD_LOCAL_SIZE") != size ||
        !base || !job)
        return TRUE;
    char *leaf = g_strdup_printf("zreal-watch-%s", job);
    watch.dir = g_build_filename(base, leaf, NULL);
    g_free(leaf);
    if (g_mkdir_with_parents(watch.dir, 0700) != 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "the watchdog's directory %s: %s", watch.dir,
                    g_strerror(errno));
        g_clear_pointer(&watch.dir, g_free);
        return FALSE;
    }
    watch.on = TRUE;
    watch.rank = rank;
    watch.size = size;
    /* A heartbeat is judged over a few scheduler quanta at least: ranks share cores. */
    watch.silence_s = MAX(timeout_s, REAL_WATCH_MIN_SILENCE_S);
    watch.period_s = CLAMP(watch.silence_s / 10, 0.05, 0.5);
    watch.own_path = rank_path(rank);
    watch.started_us = g_get_real_time();
    watch.phase = REAL_WATCH_INIT;
    g_mutex_init(&watch.lock);
    g_cond_init(&watch.wake);
    g_mutex_lock(&watch.lock);
    beat(); /* peers see this rank from the start */
    g_mutex_unlock(&watch.lock);
    watch.thread = g_thread_new("zreal-watch", watch_thread, NULL);
    return TRUE;
}

void real_watch_phase(RealWatchPhase phase)
{
    if (!watch.on)
        return;
    g_mutex_lock(&watch.lock);
    watch.phase = phase;
    if (phase == REAL_WATCH_DONE)
        watch.done_us = g_get_real_time();
    beat();
    g_cond_signal(&watch.wake);
    g_mutex_unlock(&watch.lock);
}

char *real_watch_silent_ranks(double silent_s)
{
    if (!watch.on)
        return NULL;
    GString *names = g_string_new(NULL);
    int count = 0;
    const gint64 now_us = g_get_real_time();
    for (int q = 0; q < watch.size; q++) {
        double silent;
        if (q == watch.rank || peer_state(q, now_us, &silent) == REAL_WATCH_DONE ||
            silent < silent_s)
            continue;
        g_string_append_printf(names, "%s%d", count++ ? ", " : "", q);
    }
    if (count)
        g_string_prepend(names, count > 1 ? "ranks " : "rank ");
    return g_string_free(names, count == 0);
}

gboolean real_watch_claim_report(void)
{
    if (!watch.on)
        return TRUE;
    char *path = g_build_filename(watch.dir, "reported", NULL);
    const int fd = g_open(path, O_CREAT | O_EXCL | O_WRONLY, 0600);
    const gboolean first = fd >= 0 || errno != EEXIST; /* unsure: better said twice than never */
    if (fd >= 0)
        close(fd);
    g_free(path);
    return first;
}

void real_watch_finish(void)
{
    if (!watch.on)
        return;
    real_watch_phase(REAL_WATCH_DONE);
    g_thread_join(watch.thread); /* returns once every peer is done; else the job ends there */
    watch.thread = NULL;
    watch.on = FALSE;
    g_clear_pointer(&watch.own_path, g_free);
    g_clear_pointer(&watch.dir, g_free);
}

gboolean real_watch_test_stop(RealWatchPhase phase, GError **error)
{
    static const char *const names[REAL_WATCH_N] = {"init", NULL, "finalize", NULL};
    const char *text = g_getenv("ZREAL_TEST_STOP_AT");
    if (!text)
        return TRUE;
    const char *colon = strchr(text, ':');
    char *end = NULL;
    const long rank = colon ? strtol(colon + 1, &end, 10) : -1;
    int at = -1;
    for (int p = 0; colon && p < REAL_WATCH_N; p++)
        if (names[p] && strlen(names[p]) == (size_t)(colon - text) &&
            strncmp(text, names[p], (size_t)(colon - text)) == 0)
            at = p;
    if (at < 0 || !end || end == colon + 1 || *end || rank < 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "ZREAL_TEST_STOP_AT: '%s' is not "
                    "init:RANK or finalize:RANK", text);
        return FALSE;
    }
    if (at == (int)phase && rank == env_int("OMPI_COMM_WORLD_RANK"))
        raise(SIGSTOP);
    return TRUE;
}
