/* zp_runahead: DeepSpeed's stage-3 host running ahead of the GPU — how far the builder lets a
 * gather's buffer be taken before the compute ahead of it has finished (zp_sched.c gates it).
 *
 * The model, from DeepSpeed v0.19.6's source and PyTorch's caching allocator:
 * - The host issues each module's gathers from its pre-forward/backward hook
 *   (parameter_offload.py pre_sub_module_forward_function -> partitioned_param_coordinator.py
 *   fetch_sub_module), then launches the module's kernels without waiting for them; a gather's
 *   buffer is allocated at that host time (partition_parameters.py _all_gather_dtype /
 *   AllGatherCoalescedHandle.wait's torch.cat, on the allgather stream).
 * - Nothing makes the allgather stream wait on compute; the compute stream waits on it
 *   (_fetch_sub_module_impl: current_stream().wait_stream(allgather_stream)).
 * - What stops the host:
 *   (1) _fetch_sub_module_impl: before waiting for the n-th in-flight parameter, with more than
 *       __max_ongoing_fetch_events = 2 events outstanding, it synchronises the oldest: the host
 *       passes parameter n's wait only once the allgather stream has passed the event recorded
 *       after parameter n-3's wait (its gather and unpack);
 *   (2) stage3.py __reduce_and_partition_ipg_grads: before reducing the j-th bucket, with more
 *       than max_param_reduce_events = 2 outstanding, it synchronises the oldest: the host
 *       passes bucket j's launch only once bucket j-3's reduction (recorded on
 *       reduce_and_partition_stream, which waits on compute: __add_grad_to_ipg_bucket) is done;
 *       and independent_gradient_partition_epilogue synchronises that stream at the end of
 *       every backward;
 *   (3) the allocator: free_param (partition_parameters.py) records a released buffer on the
 *       compute stream (record_stream), and PyTorch's caching allocator reuses that block only
 *       once the compute stream has passed the release; a freed block is reused only by
 *       allocations on the stream it was allocated on (c10/cuda/CUDACachingAllocator.cpp, its
 *       opening comment, recordStream and process_events), so the allgather stream's gathers
 *       draw on a pool of their own. A gather that finds no free block in it must wait for the
 *       compute to release one, or take new device memory (a cudaMalloc, and at capacity a
 *       cache flush: release_cached_blocks synchronises every outstanding event first).
 *       zplan's memory figure is what the step needs, so the pool is taken to be what the
 *       gathers need without running ahead (R below): a gather waits for the compute that
 *       releases enough of it. A GPU with more memory than the step needs lets DeepSpeed run
 *       further ahead (to capacity, then a flush); zplan does not credit that.
 * - (1) and (2) are dependencies the builder adds (zp_sched.c); (3) is zp_runahead_bound. */
#ifndef ZP_RUNAHEAD_H
#define ZP_RUNAHEAD_H

#include "zp_sched_graph.h"

#include <glib.h>

/* The allocator's bound (3) on the gathered-parameter allocs `gated` (op indices, in list order,
 * of one stage-3 schedule without a pipeline), each built with its first dependency the compute
 * op before it (the schedule with no run-ahead). Every gathered-parameter buffer of the
 * micro-steps is counted: an alloc adds its bytes when the host takes it; a free returns them
 * when the compute op it waits for ends, or, one waiting for something else (a coalesced call's
 * flat buffer, after its unpack), when the next compute op ends (which waits for that). R is the
 * most the allocs find live with their first dependencies as built (an alloc not gated has no
 * compute op before it, and finds nothing returned); each gated alloc's first
 * dependency then becomes the earliest compute op after which what is live, its own bytes
 * included, is at most R (dropped where none is needed). So the gathered buffers live at any
 * alloc stay at most R, and no alloc waits for a later compute op than it did. Returns R. */
double zp_runahead_bound(ZpSchedule *s, const GArray *gated);

#endif
