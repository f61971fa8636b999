/* zp_sched_json: what the schedule file's writer (zp_sched_json.c) shares with its reader
 * (zp_sched_read.c). */
#ifndef ZP_SCHED_JSON_H
#define ZP_SCHED_JSON_H

#include "zp_sched_graph.h"

#include <jansson.h>

ZpStream zp_sched_json_default_stream(int kind, int sub, int group);
json_t *zp_sched_json_stages_json(const ZpSchedule *s);

#endif
