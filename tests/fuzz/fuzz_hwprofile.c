/* fuzz_hwprofile: the hardware-profile loader (hwprofiles/NAME.json, --cluster PATH.json) on
 * arbitrary bytes; what it accepts is used for a GEMM-efficiency lookup and its collective
 * table's rows are read at sizes below, inside and beyond them. */
#include "fuzz.h"
#include "zp_hw.h"

#include <glib.h>

int fuzz_hwprofile(const uint8_t *data, size_t size)
{
    ZpHw hw;
    GError *error = NULL;
    if (zp_hw_load(fuzz_input_path("hwprofile", data, size), &hw, &error)) {
        volatile double e = zp_hw_gemm_efficiency(&hw, 1e9) + zp_hw_memory_bytes_per_s(&hw, 0);
        for (int i = 0; i < hw.collective_table.n_rows; i++)
            for (double bytes = 1; bytes < 1e16; bytes *= 7)
                e += zp_colltab_time_s(&hw.collective_table.rows[i], bytes);
        (void)e;
    }
    g_clear_error(&error);
    return 0;
}
FUZZ_ENTRY(fuzz_hwprofile)
