/* fuzz_hwprofile: the hardware-profile loader (hwprofiles/NAME.json, --cluster PATH.json) on
 * arbitrary bytes; what it accepts is used for a GEMM-efficiency lookup. */
#include "fuzz.h"
#include "zp_hw.h"

#include <glib.h>

int fuzz_hwprofile(const uint8_t *data, size_t size)
{
    ZpHw hw;
    GError *error = NULL;
    if (zp_hw_load(fuzz_input_path("hwprofile", data, size), &hw, &error)) {
        volatile double e = zp_hw_gemm_efficiency(&hw, 1e9) + zp_hw_memory_bytes_per_s(&hw, 0);
        (void)e;
    }
    g_clear_error(&error);
    return 0;
}
FUZZ_ENTRY(fuzz_hwprofile)
