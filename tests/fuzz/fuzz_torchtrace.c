/* fuzz_torchtrace: the PyTorch profiler trace reader (zp_torchtrace over zp_jsonstream) on
 * arbitrary bytes, plain or gzip: the streaming scan, the linking, the tables and the summary. */
#include "fuzz.h"
#include "zp_torchtrace.h"

#include <jansson.h>

int fuzz_torchtrace(const uint8_t *data, size_t size)
{
    ZpTorchTrace *t = zp_torch_trace_new();
    GError *error = NULL;
    if (zp_torch_trace_read(t, fuzz_input_path("torchtrace", data, size), &error)) {
        ZpTraceSummary s;
        zp_torch_trace_summary(t, &s);
        json_t *tables = zp_torch_trace_tables(t, "fuzz");
        /* What the reader builds, its own check accepts. */
        if (!zp_kclass_tables_check(tables, "fuzz", NULL))
            __builtin_trap();
        json_decref(tables);
        json_decref(zp_torch_trace_unknown(t));
    }
    g_clear_error(&error);
    zp_torch_trace_free(t);
    return 0;
}
FUZZ_ENTRY(fuzz_torchtrace)
