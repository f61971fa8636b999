/* zp_budget: the machine's available memory and the one up-front check every command makes
 * before it allocates for a request (schedule ops, a timeline, zreal's buffers, sweep values). */
#include "zp_budget.h"

#include "zp_util.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* ZPLAN_MEMORY_AVAILABLE (bytes, with KB..TB or KiB..TiB), where it is set: *bytes, else
 * untouched. A value that is not a size is an error naming the variable. */
static gboolean env_available(double *bytes, GError **error)
{
    const char *text = g_getenv("ZPLAN_MEMORY_AVAILABLE");
    return !text || zp_parse_size(text, "ZPLAN_MEMORY_AVAILABLE", ZP_SIZE_BYTES, 1, 1e18, FALSE,
                                  bytes, error);
}

double zp_budget_available_bytes(void)
{
    double bytes = -1;
    if (env_available(&bytes, NULL) && bytes > 0)
        return bytes;
    /* MemAvailable counts the page cache and reclaimable slabs a new allocation can take
     * (proc(5)); free memory alone undercounts it by the cache. */
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    double kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lf kB", &kib) == 1)
            break;
    if (f)
        fclose(f);
    if (kib >= 0)
        return kib * 1024.0;
    return (double)sysconf(_SC_AVPHYS_PAGES) * (double)sysconf(_SC_PAGE_SIZE);
}

gboolean zp_budget_check(const char *what, double count, const char *unit, double cap,
                         const char *cap_name, double bytes, GError **error)
{
    if (cap > 0 && count > cap) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: about %.3g %s (%.1f GB), past the cap of %.3g %s (%s)", what, count, unit,
                    bytes / 1e9, cap, unit, cap_name);
        return FALSE;
    }
    double told = -1;
    if (!env_available(&told, error))
        return FALSE;
    const double available = zp_budget_available_bytes();
    if (bytes > available) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: about %.3g %s need %.3g GB, more than the %.3g GB this machine has "
                    "available (%s)", what, count, unit, bytes / 1e9, available / 1e9,
                    told > 0 ? "ZPLAN_MEMORY_AVAILABLE" : "MemAvailable");
        return FALSE;
    }
    return TRUE;
}
