/* fuzz_microbench: zplan calibrate's reader of zreal --microbench runs on arbitrary bytes,
 * through the command: the fit, the loader's check of the fitted profile, and the write. */
#include "cli.h"
#include "fuzz.h"

int fuzz_microbench(const uint8_t *data, size_t size)
{
    const char *input = fuzz_input_path("microbench", data, size);
    char *argv[] = {"calibrate", (char *)input, "--out",
                    (char *)fuzz_scratch_path("profile.json"), NULL};
    fuzz_run_quiet(cli_calibrate, 4, argv);
    return 0;
}
FUZZ_ENTRY(fuzz_microbench)
