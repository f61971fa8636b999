/* zp_hw: cluster hardware profiles (hwprofiles/NAME.json) — the constants the memory model,
 * the simulator's cost model and the planner read. Every constant's source is in "notes". */
#ifndef ZP_HW_H
#define ZP_HW_H

#include "zp_colltab.h"
#include "zp_kernrate.h"
#include "zp_optable.h"
#include "zp_plan.h"

#include <glib.h>

/* One fused attention kernel's measured rate: forward + backward FLOP/s, causal, FLOPs
 * counted as its benchmarks count them (4 b s^2 a d forward x 3.5 for forward and backward,
 * halved for causal), by head dimension (rows) and sequence length (columns). */
#define ZP_HW_ATTN_MAX_DIMS 4
#define ZP_HW_ATTN_MAX_SEQS 16
typedef struct {
    gboolean present;
    int n_head_dims, n_seq_lens;
    double head_dims[ZP_HW_ATTN_MAX_DIMS];
    double seq_lens[ZP_HW_ATTN_MAX_SEQS];
    double flops_per_s[ZP_HW_ATTN_MAX_DIMS][ZP_HW_ATTN_MAX_SEQS];
} ZpHwAttention;

typedef struct {
    char name[64];
    char gpu[64];                    /* marketing name, e.g. "V100-SXM3-32GB" */
    double gpu_memory_bytes;         /* device memory per GPU */
    double peak_fp16_flops;          /* dense tensor-core peak per GPU */
    double peak_bf16_flops;          /* 0 where the GPU has no bf16 tensor cores */
    double peak_fp32_flops;          /* non-tensor fp32 peak per GPU */
    double hbm_bytes_per_s;          /* device memory bandwidth per GPU */
    int gpus_per_node;
    double intra_node_bytes_per_s;   /* per GPU, one direction (NVLink/NVSwitch) */
    double intra_node_latency_s;     /* per hop inside a node */
    double inter_node_bytes_per_s;   /* per node, one direction, all NICs together */
    double inter_node_latency_s;     /* per network hop */
    /* Optional: the bus bandwidth collectives reach at each level, as nccl-tests reports it
     * (busbw of a large ring all-reduce): inside a node per GPU, across nodes per node. 0
     * when absent: the simulator then takes the line rates above. */
    double intra_node_bus_bytes_per_s;
    double inter_node_bus_bytes_per_s;
    double host_link_bytes_per_s;    /* host<->GPU per GPU (PCIe), one direction */
    double cpu_memory_bytes;         /* host memory per node */
    double nvme_bytes_per_s;         /* per node */
    double nvme_bytes;               /* per node */
    /* Optional, for offload: the host's cores and the rate one core runs CPU Adam at, in the
     * bytes the update moves (zp_offload_cpu_adam_bytes); a rank gets cores/gpus_per_node. */
    double cpu_cores_per_node;
    double cpu_adam_bytes_per_s_per_core;
    double runtime_reserve_bytes;    /* CUDA context, library workspaces, allocator slack */
    /* Optional: the rate (in the schedule's bytes) of the kernels inside a block (norms,
     * GELU, softmax, residual adds). On a GPU they are memory-bound and this is the HBM
     * bandwidth (the default, when absent); on a CPU their transcendentals make them
     * compute-bound, and `zplan calibrate` measures it. The optimizer uses hbm_bytes_per_s. */
    double elementwise_bytes_per_s;
    double gemm_efficiency_max;      /* achieved/peak for very large GEMMs */
    /* Optional: the GPU's CUDA compute capability (8.0 for an A100, 9.0 for an H100), which
     * decides the attention kernels it can launch (zp_hw_attention_check); 0 when absent,
     * and then no kernel is refused for it. */
    double compute_capability;
    double gemm_half_efficiency_flops; /* GEMM size (FLOPs) that reaches half of the max */
    /* Optional "collective_fit" {"base_latency_s", "bus_bytes_per_s": {"allreduce",
     * "reduce_scatter", "allgather"}}: collectives measured on this machine (`zplan
     * calibrate`), where NCCL's protocol table does not apply (MPI on CPU ranks, say). A ring
     * then costs base + steps x intra_node_latency_s + bytes sent / bus_bytes_per_s[kind]. */
    gboolean has_collective_fit;
    double collective_base_latency_s;
    double collective_bytes_per_s[3]; /* all-reduce, reduce-scatter, all-gather */
    /* Optional "collective_table" (zp_colltab): each collective's measured time against its
     * size at a rank count on one machine (`zplan calibrate`); where it has a group's rank
     * count, the simulator reads collectives off it before collective_fit. */
    ZpCollTable collective_table;
    /* Optional "attention" {"default": NAME, "kernels": {NAME: {"source", "head_dims",
     * "seq_lens", "flops_per_s": [[...] per head dim]}}}: the fused kernels this GPU runs,
     * each with its published or measured rate and that figure's source, and the one PyTorch's
     * scaled-dot-product attention picks in fp16/bf16 (ZP_ATTN_EAGER when none is listed). */
    ZpHwAttention attention[ZP_ATTN_N];
    ZpAttention attention_default;
    /* Optional "op_costs" (zp_optable): the op-level cost table `zplan calibrate` fits from
     * microbenchmarks of the step's own kernels; zp_cost uses it instead of the roofline
     * above (peak x GEMM efficiency, elementwise and HBM rates) where present. */
    ZpOpTable op_costs;
    /* Optional "kernel_rates" (zp_kernrate): per-class rates of a GPU's kernels, each with its
     * published source in notes; zp_cost prices the plan's kernel inventory with them where
     * the profile has no op table. */
    ZpKernRates kernel_rates;
} ZpHw;

/* Resolves a name in DATA_DIR/hwprofiles/ or a PATH.json. An unknown name lists the
 * profiles that exist. */
gboolean zp_hw_load(const char *name_or_path, ZpHw *hw, GError **error);

/* Parses a profile object; `what` names its file in messages. */
gboolean zp_hw_from_json(void *json_object, const char *what, ZpHw *hw, GError **error);

/* A profile with only GPU memory known (maxmodel --gpu-memory). */
void zp_hw_from_gpu_memory(double gpu_memory_bytes, ZpHw *hw);

/* The tensor-core (or, for fp32, plain) peak for a precision; 0 when the GPU has none (bf16
 * on a V100). */
double zp_hw_peak_flops(const ZpHw *hw, ZpPrecision precision);

/* The rate at which a compute op's memory-bound bytes move: HBM bandwidth for the optimizer,
 * elementwise_bytes_per_s (or, when absent, HBM bandwidth) for the kernels inside a block. */
double zp_hw_memory_bytes_per_s(const ZpHw *hw, gboolean optimizer);

/* The bus bandwidth of a level as nccl-tests define it: the profile's published or measured
 * figure (intra_node_bus_bytes_per_s, inter_node_bus_bytes_per_s: a node's NICs together), the
 * line rate where it has none. NCCL moves data at it, collectives and pipeline sends alike:
 * its kernels' 128-byte payloads take about 20% of an NVLink's line rate (nccl-tests issues
 * 149 and 212). */
double zp_hw_intra_bus_bytes_per_s(const ZpHw *hw);
double zp_hw_inter_bus_bytes_per_s(const ZpHw *hw);

/* Fraction of peak a GEMM of `flops` reaches: max * F / (F + F_half). Small GEMMs cannot
 * fill the machine's SMs; the saturating form is the simplest with the right limits. */
double zp_hw_gemm_efficiency(const ZpHw *hw, double flops);

/* Whether `kernel` runs in `precision` on this GPU, by its own source's checks: FlashAttention
 * (1, 2, 3, Triton) takes fp16/bf16 only; FA1 needs sm75 to sm90, FA2 and FA3 sm80 on; the
 * memory-efficient kernel takes fp32 too, on sm50 to sm121; bf16 needs sm80 throughout. The
 * GPU checks apply where the profile gives its compute_capability (hw may be NULL: dtype only).
 * Fails in one line naming the flag, the kernel and the source's reason. */
gboolean zp_hw_attention_check(const ZpHw *hw, ZpAttention kernel, ZpPrecision precision,
                               const char *flag, GError **error);

/* The kernel PyTorch's SDPA runs where no flag names one (sdp_utils.cpp select_sdp_backend:
 * flash, else memory-efficient, else math): in fp16/bf16 the profile's default; in fp32 on a
 * GPU profile memory-efficient, at its rate where the profile has one, else sized as a fused
 * kernel and priced as eager attention's work (zp_hw_attention_unrated); fp16 on a GPU flash
 * cannot run on (the V100) memory-efficient where rated, else eager. `why` gets the reason in
 * words for the output's defaults line. hw may be NULL (no --cluster: eager in fp32). */
ZpAttention zp_hw_attention_default(const ZpHw *hw, ZpPrecision precision, char *why,
                                    size_t why_size);

/* Whether `kernel` runs on hw without a rate, its work counted as eager attention's
 * (ZpPlan.attention_unrated): a kernel that may (zp_attention_eager_work_unrated:
 * mem-efficient) where hw is NULL or its attention table does not rate it. */
gboolean zp_hw_attention_unrated(const ZpHw *hw, ZpAttention kernel);

/* The kernel a flag names: NULL (flag absent) is zp_hw_attention_default's choice ("eager" for
 * fp16/bf16 with no hw); "flash" the profile's default fused kernel; "eager"; or a kernel the
 * profile lists, each refused where zp_hw_attention_check refuses it. hw may be NULL (memory
 * without --cluster): then "flash" is FlashAttention-2, whose memory every fused kernel
 * shares. Fails naming the flag. */
gboolean zp_hw_attention_choose(const ZpHw *hw, const char *text, ZpPrecision precision,
                                const char *flag, ZpAttention *out, GError **error);

/* Whether `kernel` runs in `precision` on hw (zp_hw_attention_check) and hw can time it: a
 * fused kernel its attention table rates, eager, or one whose work is priced as eager's
 * (zp_hw_attention_unrated). A kernel a config file names (--megatron-args' --use-flash-attn,
 * a ds_config's attention_kernel) is checked here as --attention's is. Fails naming the flag
 * and the kernels hw can time. */
gboolean zp_hw_attention_runs(const ZpHw *hw, ZpAttention kernel, ZpPrecision precision,
                              const char *flag, GError **error);

/* The rate at which a fused kernel does the model's attention FLOPs (4 b s^2 h forward,
 * twice that backward, the s^2 counted whole as in Megatron's count) on this profile: the
 * table's figure at the nearest head dimension, interpolated in log2 of the sequence length
 * (clamped at the table's ends), times 12/7 — the table counts 3.5 x 2 b s^2 h per forward
 * and backward where the model counts 12 b s^2 h. 0 when the kernel is not listed. */
double zp_hw_attention_flops_per_s(const ZpHw *hw, ZpAttention attention, double head_dim,
                                   double seq_len);

/* Seconds of one compute op with `flops` of which `attn_flops` run in the fused attention
 * kernel at attn_flops_per_s: the rest at peak x GEMM efficiency at gemm_flops, plus mem_bytes
 * at the memory rate (HBM for the optimizer, the elementwise rate for the rest). */
double zp_hw_compute_time_s(const ZpHw *hw, double peak_flops, double flops, double gemm_flops,
                            double attn_flops, double attn_flops_per_s, double mem_bytes,
                            gboolean optimizer);

#endif
