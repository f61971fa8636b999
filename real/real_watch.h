/* real_watch: a zreal rank's whole-process watchdog under mpirun, from before MPI_Init to after
 * MPI_Finalize: per-rank heartbeat files in the job's session directory name the rank that stopped. */
#ifndef REAL_WATCH_H
#define REAL_WATCH_H

#include <glib.h>

/* Where a rank is; a rank's heartbeat file carries it. */
typedef enum {
    REAL_WATCH_INIT,     /* started, before or inside MPI_Init */
    REAL_WATCH_RUN,      /* between MPI_Init and MPI_Finalize */
    REAL_WATCH_FINALIZE, /* inside MPI_Finalize */
    REAL_WATCH_DONE,     /* past MPI_Finalize: finished, no longer beats */
    REAL_WATCH_N
} RealWatchPhase;

/* Starts this process's watchdog thread when it runs as one rank of several under Open MPI's
 * mpirun on one node (OMPI_COMM_WORLD_RANK/SIZE and the job's session directory in the
 * environment, known before MPI_Init); elsewhere the watch is off and every call below is
 * harmless. A rank whose heartbeat stays silent for timeout_s (ZREAL_COMM_TIMEOUT_S, at least
 * REAL_WATCH_MIN_SILENCE_S) while this rank waits outside the collectives, or that has not
 * finished timeout_s after this one did, is named in one line (real_watch_claim_report: one rank
 * of the job prints it) and this process exits with status 1, which ends the job. */
#define REAL_WATCH_MIN_SILENCE_S 1.0
gboolean real_watch_start(double timeout_s, GError **error);

/* This rank has reached `phase`; its heartbeat says so from now on. */
void real_watch_phase(RealWatchPhase phase);

/* "rank 1" or "ranks 1, 3": the peers whose heartbeat has been silent for at least `silent_s`
 * seconds (a stopped process beats no more) and that have not finished; NULL when none is, or
 * the watch is off. Free with g_free. */
char *real_watch_silent_ranks(double silent_s);

/* TRUE for the one rank of the job that reports a failure every rank sees (the first to ask);
 * FALSE for the others, which end without repeating it. TRUE when the watch is off. */
gboolean real_watch_claim_report(void);

/* After MPI_Finalize: marks this rank done and returns once every peer is, or ends the process
 * (status 1, one line naming the rank) when a peer falls silent or has not finished timeout_s
 * after this rank. */
void real_watch_finish(void);

/* The test hook ZREAL_TEST_STOP_AT=init:R or finalize:R: rank R stops itself (SIGSTOP, as
 * `kill -STOP` would) just before MPI_Init or MPI_Finalize, where the tests need a rank stopped
 * and no flag can reach. Does nothing for another phase or rank, or when unset; fails naming the
 * variable when it is malformed. */
gboolean real_watch_test_stop(RealWatchPhase phase, GError **error);

#endif
