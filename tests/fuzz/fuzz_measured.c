/* fuzz_measured: zplan validate's reader of a measured file (zreal --out) on arbitrary bytes,
 * beside a good prediction, through the command, report included. */
#include "cli.h"
#include "fuzz.h"

int fuzz_measured(const uint8_t *data, size_t size)
{
    char *argv[] = {"validate", ZP_DATA_DIR "/tests/fuzz/corpus/predicted/predicted-tiny.json",
                    (char *)fuzz_input_path("measured", data, size), NULL};
    fuzz_run_quiet(cli_validate, 3, argv);
    return 0;
}
FUZZ_ENTRY(fuzz_measured)
