/* zp_mem: the exact per-rank memory model — model states per term (params, grads,
 * optimizer states) for ZeRO stages 0-3 (zp_mem_terms.h), and each residual term beside them. */
#ifndef ZP_MEM_H
#define ZP_MEM_H

#include "zp_hw.h"
#include "zp_mem_terms.h"
#include "zp_model.h"
#include "zp_plan.h"

/* Every residual term for a plan, the buffer terms by its implementation's rules (zp_impl.h);
 * hw may be NULL (no reserve). The model must have an
 * architecture for activation terms; a params-only model reports buffers and reserve. */
ZpResidual zp_mem_residual(const ZpModel *model, const ZpPlan *plan, const ZpHw *hw);

#endif
