/* fuzz_predicted: zplan validate's reader of a predicted file (zplan simulate --json) on
 * arbitrary bytes, beside a good measurement, through the command, report included. */
#include "cli.h"
#include "fuzz.h"

int fuzz_predicted(const uint8_t *data, size_t size)
{
    char *argv[] = {"validate", (char *)fuzz_input_path("predicted", data, size),
                    ZP_DATA_DIR "/tests/fuzz/corpus/measured/measured-tiny.json", NULL};
    fuzz_run_quiet(cli_validate, 3, argv);
    return 0;
}
FUZZ_ENTRY(fuzz_predicted)
