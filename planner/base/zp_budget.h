/* zp_budget: what a request may take of this machine, said before anything is allocated: the
 * memory available (/proc/meminfo's MemAvailable) and one check against it and a named cap. */
#ifndef ZP_BUDGET_H
#define ZP_BUDGET_H

#include <glib.h>

/* The memory a new allocation can take without swapping: $ZPLAN_MEMORY_AVAILABLE where set
 * (a size: 16GB, 512MiB; for a container, whose /proc/meminfo shows the host's, or to keep
 * zplan to a share of a shared machine), else MemAvailable from /proc/meminfo (Linux 3.14+),
 * else the free physical pages (sysconf _SC_AVPHYS_PAGES). */
double zp_budget_available_bytes(void);

/* Refuses a request of `count` items (`unit`: "ops", "values") needing about `bytes`: past
 * `cap` (named `cap_name` in the message; <= 0: no cap) or past the memory available. The
 * message says `what`, the figure and the cap or the memory available, in one line. */
gboolean zp_budget_check(const char *what, double count, const char *unit, double cap,
                         const char *cap_name, double bytes, GError **error);

#endif
