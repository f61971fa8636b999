/* fuzz: one harness per loader of an input file, each a function of the input's bytes, run
 * by libFuzzer (`make fuzz`, clang) or by the corpus replay test (`make test`). */
#ifndef FUZZ_H
#define FUZZ_H

#include <stddef.h>
#include <stdint.h>

typedef int (*FuzzTarget)(const uint8_t *data, size_t size);

/* Writes the input to this process's scratch file, NAME.json in a private temporary
 * directory (removed at exit), and returns its path. */
const char *fuzz_input_path(const char *name, const uint8_t *data, size_t size);

/* A path in the same scratch directory for an output a loader writes. */
const char *fuzz_scratch_path(const char *name);

/* Runs a zplan subcommand (cli_validate, ...) on argv with stdout and stderr sent to
 * /dev/null: the command-line loaders print reports and one-line errors, which would flood
 * the fuzzer's and the test's output. */
void fuzz_run_quiet(int (*command)(int argc, char **argv), int argc, char **argv);

/* The repository's data directory (models/, tests/data/). */
#ifndef ZP_DATA_DIR
#define ZP_DATA_DIR "."
#endif

/* Every target, by name; the replay test runs each over its corpus. */
int fuzz_model(const uint8_t *data, size_t size);
int fuzz_hfconfig(const uint8_t *data, size_t size);
int fuzz_hwprofile(const uint8_t *data, size_t size);
int fuzz_dsconfig(const uint8_t *data, size_t size);
int fuzz_schedule(const uint8_t *data, size_t size);
int fuzz_measured(const uint8_t *data, size_t size);
int fuzz_predicted(const uint8_t *data, size_t size);
int fuzz_microbench(const uint8_t *data, size_t size);
int fuzz_torchtrace(const uint8_t *data, size_t size);
int fuzz_megatronargs(const uint8_t *data, size_t size);

/* Under libFuzzer (ZP_LIBFUZZER), each harness file is also the fuzzer's entry point. */
#ifdef ZP_LIBFUZZER
#define FUZZ_ENTRY(target)                                                                      \
    int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);                              \
    int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return target(data, size); }
#else
#define FUZZ_ENTRY(target)
#endif

#endif
