/* real_cpu: the host implementation of RealBackend (OpenBLAS GEMMs, plain C loops).
 * It lets zreal train and be tested on any machine; a GPU backend fills the same table. */
#ifndef REAL_CPU_H
#define REAL_CPU_H

#include "real_backend.h"

/* A new CPU backend with its own tracker; every buffer, its GEMM/attention staging
 * included, is counted there. Release it with be->destroy(be). Never returns NULL.
 * Its staging buffers make it single-threaded: one backend per thread (per rank). */
RealBackend *real_cpu_backend_new(void);

#endif
