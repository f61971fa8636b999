/* zp_dsconfig_engine: a ds_config's optimizer.type and data_types.grad_accum_dtype as
 * DeepSpeed's engine takes them, read into a plan or refused (zp_dsconfig's sections). */
#ifndef ZP_DSCONFIG_ENGINE_H
#define ZP_DSCONFIG_ENGINE_H

#include "zp_plan.h"

#include <glib.h>
#include <jansson.h>

/* The sections `data_types` and `optimizer` of the config `what` (NULL where absent), after
 * its precision and ZeRO section are in *p: sets p->optimizer from optimizer.type (Adam,
 * AdamW, torch.optim's SGD with or without momentum), and refuses, naming the key, a type
 * whose states zplan does not model, a grad_accum_dtype DeepSpeed raises for, and fp32
 * accumulation under bf16 at stage 1 (BF16_Optimizer, not modeled). */
gboolean zp_dsconfig_engine_read(json_t *data_types, json_t *optimizer, const char *what,
                                 ZpPlan *p, GError **error);

#endif
