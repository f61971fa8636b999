/* sim_coll: NCCL's own tuning model (src/graph/tuning.cc), reduced to the pieces a ZeRO step
 * needs, so the simulator picks the algorithm and protocol NCCL would pick for each size.
 *
 * What is left out, and why: NCCL's bus bandwidth is nChannels x the per-channel bandwidth
 * its topology search finds; here it is the profile's per-level bus bandwidth (measured
 * nccl-tests busbw where the profile has it, line rate otherwise), so the per-channel ceilings
 * (llMaxBws, perChMax*Bws) and the ring's "plateau" latency (x1.4 when bytes / (nChannels x
 * nRanks) >= 64), which need the channel count, are not applied. NVLS, CollNet and PAT need
 * hardware (NVLink SHARP, SHARP switches, one GPU per node) the profiles do not describe. */
#include "sim_coll.h"
#include "zp_ep.h"
#include "zp_util.h"

#include <float.h>
#include <stdlib.h>
#include <string.h>

#define US 1e-6

/* NCCL's tuning model as src/graph/tuning.cc has it (NVIDIA/nccl master 5067397, 2026-06,
 * ncclTunerConstantsDefaults and ncclTopoTuneModel), for the ring and tree algorithms:
 * baseLatencies[algo][proto], seconds. */
static const double base_latency_s[SIM_ALGO_N][SIM_PROTO_N] = {
    [SIM_ALGO_RING] = {6.6 * US, 14.0 * US, 8.4 * US},
    [SIM_ALGO_TREE] = {6.8 * US, 14.0 * US, 8.4 * US},
};

/* hwLatencies[NVLINK or NET][algo][proto]: NVLink ring 0.6 / 1.9 / 3.4 us, tree 0.6 / 1.25 /
 * 4.0; network ring 2.7 / 4.0 / 14, tree 5.0 / 8.5 / 14. The hwprofile holds each level's
 * ring LL hop (what the link itself costs: 0.6 and 2.7 us in the shipped profiles, NCCL's
 * own); the other entries keep NCCL's proportion to it, so a shipped profile gives NCCL's
 * table exactly. */
static const double hw_latency_us[SIM_LINK_N][SIM_ALGO_N][SIM_PROTO_N] = {
    [SIM_LINK_INTRA] = {[SIM_ALGO_RING] = {0.6, 1.9, 3.4}, [SIM_ALGO_TREE] = {0.6, 1.25, 4.0}},
    [SIM_LINK_INTER] = {[SIM_ALGO_RING] = {2.7, 4.0, 14.0}, [SIM_ALGO_TREE] = {5.0, 8.5, 14.0}},
};

/* getNetOverhead: posting a network send costs 1 us on Intel x86 hosts (2 on AMD; the
 * profiles' DGX hosts are Intel), three times that with Simple; a multi-node ring pays at
 * least this at every step. */
#define NET_OVERHEAD_S (1.0 * US)

/* Share of the bus bandwidth each protocol gets: ring LL x .5, LL128 x .92, Simple x 1; the
 * tree x .92, then LL x 1/3.8 and LL128 x 7/9 in one node or 120/128 across nodes. */
static const double ring_bw_factor[SIM_PROTO_N] = {0.5, 0.92, 1.0};
#define TREE_BW_FACTOR 0.92

/* treeCorrectionFactor[proto][log2(bytes / 64)]: trees fall short of the model at medium
 * sizes (64 B to 256 MiB; 1 above). */
static const double tree_correction[SIM_PROTO_N][23] = {
    {1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0,
     1.0},
    {1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0,
     1.0},
    {.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9},
};

static const char *const algo_names[SIM_ALGO_N] = {"ring", "tree", "p2p"};
static const char *const proto_names[SIM_PROTO_N] = {"LL", "LL128", "Simple"};

gboolean sim_coll_check_placement(const ZpHw *hw, int mp, GError **error)
{
    if (mp < 1 || (hw->gpus_per_node % mp != 0 && mp % hw->gpus_per_node != 0)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "tensor-parallel degree %d must divide the %d GPUs per node of %s, or be a "
                    "multiple of them, so that tensor-parallel groups tile the nodes",
                    mp, hw->gpus_per_node, hw->name);
        return FALSE;
    }
    return TRUE;
}

SimCollPlacement sim_coll_placement(int world, int ranks, int stride, int gpus_per_node)
{
    const int64_t span = (int64_t)ranks * stride, g = gpus_per_node;
    /* The groups with members on one node: the distinct offsets among its ranks. */
    SimCollPlacement p = {.ranks = ranks, .nodes = ranks,
                          .groups_per_node = (int)MIN((int64_t)stride, MIN(g, (int64_t)world))};
    if (stride >= g) /* members farther apart than a node: each on a node of its own */
        return p;
    /* A group whose first member is f spans floor((f mod g + (ranks - 1) stride) / g) + 1
     * nodes. First members are block * span + offset (offset < stride < g), and block * span
     * mod g repeats within g blocks: O(g^2) whatever the world, as the planner's search asks
     * this of every candidate plan. */
    int64_t most_mod = 0;
    for (int64_t block = 0; block < MIN(g, world / span); block++)
        for (int64_t offset = 0; offset < stride; offset++)
            most_mod = MAX(most_mod, (block * span + offset) % g);
    p.nodes = (int)MIN((int64_t)ranks, (most_mod + (ranks - 1) * (int64_t)stride) / g + 1);
    return p;
}

/* The residues modulo n of {x + step * j : x marked in mark, 0 <= j < count} into mark
 * (count taken modulo n's cycle: at most n shifts). */
static void add_steps(uint8_t *mark, uint8_t *scratch, int64_t n, int64_t step, int64_t count)
{
    memcpy(scratch, mark, (size_t)n);
    for (int64_t j = 1; j < MIN(count, n); j++)
        for (int64_t x = 0; x < n; x++)
            if (scratch[x])
                mark[(x + step % n * j) % n] = 1;
}

static int compare_i64(const void *a, const void *b)
{
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Runs: the nodes a group spans depend only on its first member modulo a node (its members
 * are first plus fixed offsets, ascending), and first members are a + run * stride * b +
 * span * c (a < stride, b < the gaps in a span; zp_group_first), whose residues modulo a node
 * are sums of the three digits' residues: O(g^2) to list, O(g x ranks) to count. The groups on
 * one node: the distinct groups among its ranks, the most over the nodes until the node's
 * start repeats modulo the span. */
SimCollPlacement sim_coll_placement_of(int world, const ZpCommGroup *g, int gpus_per_node)
{
    if (zp_group_run(g) == g->ranks)
        return sim_coll_placement(world, g->ranks, g->stride, gpus_per_node);
    const int64_t gpn = MAX(gpus_per_node, 1), span = zp_group_span(g);
    const int64_t run_span = zp_group_run(g) * g->stride;
    SimCollPlacement p = {.ranks = g->ranks, .nodes = 1, .groups_per_node = 1};
    uint8_t *mark = g_new0(uint8_t, gpn), *scratch = g_new(uint8_t, gpn);
    mark[0] = 1;
    add_steps(mark, scratch, gpn, 1, g->stride);
    add_steps(mark, scratch, gpn, run_span, zp_group_run_stride(g) / run_span);
    add_steps(mark, scratch, gpn, span, world / span);
    for (int64_t first = 0; first < gpn; first++) {
        if (!mark[first])
            continue;
        int nodes = 1;
        for (int64_t i = 1; i < g->ranks; i++)
            nodes += zp_group_member(g, first, i) / gpn != zp_group_member(g, first, i - 1) / gpn;
        p.nodes = MAX(p.nodes, nodes);
    }
    /* nodes until a node's start repeats modulo the span; a world smaller than a node is one */
    const int64_t period = span / (int64_t)zp_gcd_u64((uint64_t)span, (uint64_t)gpn);
    const int64_t on_node = MIN(gpn, (int64_t)world);
    int64_t *index = g_new(int64_t, on_node);
    for (int64_t node = 0; node < MAX(1, MIN(period, world / gpn)); node++) {
        for (int64_t j = 0; j < on_node; j++)
            index[j] = zp_group_index(g, node * gpn + j);
        qsort(index, (size_t)on_node, sizeof *index, compare_i64);
        int distinct = 1;
        for (int64_t j = 1; j < on_node; j++)
            distinct += index[j] != index[j - 1];
        p.groups_per_node = MAX(p.groups_per_node, distinct);
    }
    g_free(index);
    g_free(mark);
    g_free(scratch);
    return p;
}

static SimCollGroup group_on(const ZpHw *hw, SimCollPlacement placement)
{
    SimCollGroup g = {
        .ranks = placement.ranks,
        .nodes = placement.nodes,
        .ranks_per_node = placement.ranks / placement.nodes,
        .intra_hop_s = hw->intra_node_latency_s,
        .inter_hop_s = hw->inter_node_latency_s,
        .bus_bytes_per_s = zp_hw_intra_bus_bytes_per_s(hw),
        .bottleneck = SIM_LINK_INTRA,
        .hw = hw,
        .node_ranks = placement.groups_per_node * (placement.ranks / placement.nodes),
    };
    if (hw->has_collective_fit) {
        g.fit_base_s = hw->collective_base_latency_s;
        for (int k = 0; k < (int)G_N_ELEMENTS(hw->collective_bytes_per_s); k++)
            g.fit_bytes_per_s[k] = hw->collective_bytes_per_s[k];
        /* No fit of its own: an all-to-all moves what an all-gather does. */
        g.fit_bytes_per_s[ZP_COLL_ALLTOALL] = hw->collective_bytes_per_s[ZP_COLL_ALLGATHER];
    }
    /* A table is measured among the ranks of one machine. An all-to-all reads the all-gather's
     * row: each rank sends what an all-gather sends. */
    for (int k = 0; k < ZP_COLL_N && g.nodes == 1; k++)
        g.measured[k] = zp_colltab_find(&hw->collective_table,
                                        k == ZP_COLL_ALLTOALL ? ZP_COLL_ALLGATHER : k, g.ranks);
    if (g.nodes > 1) {
        /* With one ring per NIC (c rings), each ring carries S/c and crosses every node
         * boundary once, so the boundary moves 2(n-1)/n S/c per ring and 2(n-1)/n S in all:
         * the busbw of the node's NICs together is the inter-node bus bandwidth. The groups
         * with members on a node run at once and split it. */
        const double nic_share = zp_hw_inter_bus_bytes_per_s(hw) / placement.groups_per_node;
        if (nic_share < g.bus_bytes_per_s) {
            g.bus_bytes_per_s = nic_share;
            g.bottleneck = SIM_LINK_INTER;
        }
    }
    return g;
}

SimCollGroup sim_coll_group_placed(const ZpHw *hw, int world, int ranks, int stride)
{
    return group_on(hw, sim_coll_placement(world, ranks, stride, hw->gpus_per_node));
}

SimCollGroup sim_coll_group_of(const ZpHw *hw, int world, const ZpCommGroup *placed)
{
    return group_on(hw, sim_coll_placement_of(world, placed, hw->gpus_per_node));
}

SimCollGroup sim_coll_group(const ZpHw *hw, int dp, int mp, ZpGroup group)
{
    /* Ranks are tp-fastest: a TP group is mp consecutive ranks, a DP group every mp-th. */
    return group == ZP_GROUP_TP ? sim_coll_group_placed(hw, dp * mp, mp, 1)
                                : sim_coll_group_placed(hw, dp * mp, dp, mp);
}

/* NCCL's hop latency of one level for an algorithm and protocol, scaled by the profile. */
static double hop_s(const SimCollGroup *g, SimLink link, SimAlgo algo, SimProto proto)
{
    const double ll_hop_s = link == SIM_LINK_INTRA ? g->intra_hop_s : g->inter_hop_s;
    return ll_hop_s * hw_latency_us[link][algo][proto] / hw_latency_us[link][SIM_ALGO_RING][0];
}

static gboolean is_allreduce(ZpCollKind kind)
{
    return kind == ZP_COLL_ALLREDUCE;
}

SimCollCost sim_coll_ring_cost(ZpCollKind kind, double bytes, const SimCollGroup *group,
                               SimProto proto)
{
    SimCollCost c = {.algo = SIM_ALGO_RING, .proto = proto};
    const int n = group->ranks;
    if (n <= 1)
        return c;
    const int passes = is_allreduce(kind) ? 2 : 1; /* reduce-scatter then all-gather */
    const int steps = passes * (n - 1), inter_steps = passes * (group->nodes - 1);
    double intra_s = hop_s(group, SIM_LINK_INTRA, SIM_ALGO_RING, proto);
    if (group->nodes > 1)
        intra_s = MAX(intra_s, NET_OVERHEAD_S * (proto == SIM_PROTO_SIMPLE ? 3 : 1));
    /* One rank per node: every step's latency is exposed; NCCL takes the tree's. */
    const double inter_s = hop_s(group, SIM_LINK_INTER,
                                 n == group->nodes ? SIM_ALGO_TREE : SIM_ALGO_RING, proto);
    c.latency_s = base_latency_s[SIM_ALGO_RING][proto] + (steps - inter_steps) * intra_s +
                  inter_steps * inter_s;
    c.transfer_s = sim_coll_bytes_sent(kind, bytes, n) /
                   (group->bus_bytes_per_s * ring_bw_factor[proto]);
    return c;
}

double sim_coll_ring_time_s(ZpCollKind kind, double bytes, const SimCollGroup *group,
                            SimProto proto)
{
    const SimCollCost c = sim_coll_ring_cost(kind, bytes, group, proto);
    return c.latency_s + c.transfer_s;
}

/* NCCL's log2i: the floor of log2 (-1 for 0). */
static int floor_log2(uint64_t value)
{
    int log = -1;
    for (; value; value >>= 1)
        log++;
    return log;
}

SimCollCost sim_coll_tree_cost(double bytes, const SimCollGroup *group, SimProto proto)
{
    SimCollCost c = {.algo = SIM_ALGO_TREE, .proto = proto};
    if (group->ranks <= 1)
        return c;
    /* Up the tree and down again: inside a node a chain of ppn ranks, across nodes a
     * double binary tree of depth log2(nodes) (the integer log). */
    c.latency_s = base_latency_s[SIM_ALGO_TREE][proto] +
                  2.0 * ((group->ranks_per_node - 1) *
                             hop_s(group, SIM_LINK_INTRA, SIM_ALGO_TREE, proto) +
                         floor_log2((uint64_t)group->nodes) *
                             hop_s(group, SIM_LINK_INTER, SIM_ALGO_TREE, proto));
    double bus = group->bus_bytes_per_s * TREE_BW_FACTOR;
    if (proto == SIM_PROTO_LL)
        bus /= 3.8;
    else if (proto == SIM_PROTO_LL128)
        bus *= group->nodes == 1 ? 7.0 / 9.0 : 120.0 / 128.0;
    /* The tree's algorithm bandwidth is half its bus bandwidth (the ratio .5). */
    double algbw = 0.5 * bus;
    const int log_size = floor_log2((uint64_t)bytes >> 6);
    if (log_size >= 0 && log_size < (int)G_N_ELEMENTS(tree_correction[0]))
        algbw *= tree_correction[proto][log_size];
    c.transfer_s = bytes / algbw;
    return c;
}

/* The fitted ring of a measured machine: one protocol, the machine's own constants. */
static SimCollCost fitted_cost(ZpCollKind kind, double bytes, const SimCollGroup *group)
{
    SimCollCost c = {.algo = SIM_ALGO_RING, .proto = SIM_PROTO_SIMPLE};
    const int n = group->ranks;
    if (n <= 1)
        return c;
    const int steps = (is_allreduce(kind) ? 2 : 1) * (n - 1);
    c.latency_s = group->fit_base_s + steps * group->intra_hop_s;
    c.transfer_s = sim_coll_bytes_sent(kind, bytes, n) / group->fit_bytes_per_s[kind];
    return c;
}

/* Read off the machine's table: what its smallest size takes is latency, the rest transfer. */
static SimCollCost measured_cost(ZpCollKind kind, double bytes, const SimCollGroup *group)
{
    SimCollCost c = {.algo = SIM_ALGO_RING, .proto = SIM_PROTO_SIMPLE};
    const ZpCollRow *row = group->measured[kind]; /* rows have 2 ranks or more */
    const double t = zp_colltab_time_s(row, bytes);
    c.latency_s = MIN(t, row->time_s[0]);
    c.transfer_s = t - c.latency_s;
    return c;
}

static gboolean is_ep_alltoall(ZpCollKind kind)
{
    return kind == ZP_COLL_EP_DISPATCH || kind == ZP_COLL_EP_COMBINE;
}

/* A mixture of experts' all-to-all as NCCL runs it (ncclSend/ncclRecv to each peer at once,
 * no ring and no tree): zp_ep's closed form on the group's placement, its latency the time of
 * an empty one. */
static SimCollCost p2p_alltoall_cost(double bytes, const SimCollGroup *g)
{
    SimCollCost c = {.algo = SIM_ALGO_P2P, .proto = SIM_PROTO_SIMPLE};
    if (g->ranks <= 1 || !g->hw)
        return c;
    const int node_ranks = MAX(g->node_ranks, g->ranks_per_node);
    c.latency_s = zp_ep_alltoall_time_s(g->hw, 0.0, g->ranks, g->ranks_per_node, node_ranks);
    c.transfer_s =
        zp_ep_alltoall_time_s(g->hw, bytes, g->ranks, g->ranks_per_node, node_ranks) -
        c.latency_s;
    return c;
}

SimCollCost sim_coll_cost(ZpCollKind kind, double bytes, const SimCollGroup *group)
{
    if (is_ep_alltoall(kind))
        return p2p_alltoall_cost(bytes, group);
    if (group->measured[kind])
        return measured_cost(kind, bytes, group);
    if (group->fit_bytes_per_s[kind] > 0)
        return fitted_cost(kind, bytes, group);
    SimCollCost best = {0};
    double best_s = DBL_MAX;
    for (int algo = 0; algo < SIM_ALGO_N; algo++) {
        if ((algo == SIM_ALGO_TREE && !is_allreduce(kind)) || algo == SIM_ALGO_P2P)
            continue;
        for (int proto = 0; proto < SIM_PROTO_N; proto++) {
            const SimCollCost c = algo == SIM_ALGO_RING
                                      ? sim_coll_ring_cost(kind, bytes, group, proto)
                                      : sim_coll_tree_cost(bytes, group, proto);
            if (c.latency_s + c.transfer_s < best_s) {
                best = c;
                best_s = c.latency_s + c.transfer_s;
            }
        }
    }
    return best;
}

double sim_coll_bytes_sent(ZpCollKind kind, double bytes, int ranks)
{
    if (ranks <= 1)
        return 0.0;
    const double passes = is_allreduce(kind) ? 2.0 : 1.0;
    return passes * (ranks - 1) / ranks * bytes;
}

void sim_coll_describe(const SimCollGroup *group, unsigned kinds, char *buf, size_t size)
{
    static const char *const names[ZP_COLL_N] = {"all-reduce", "reduce-scatter", "all-gather",
                                                 "all-to-all", "EP dispatch", "EP combine"};
    static const char *const sources[] = {"from the profile's measured table (time by size)",
                                          "by its fitted ring", "by NCCL's cost model",
                                          "point to point as NCCL's all-to-all (NVLink inside "
                                          "a node, the node's NICs across)"};
    GString *text = g_string_new(NULL);
    g_string_printf(text, "%d ranks:", group->ranks);
    gboolean any = FALSE;
    for (int source = 0; source < (int)G_N_ELEMENTS(sources); source++) {
        int listed = 0;
        for (int k = 0; k < ZP_COLL_N; k++) {
            const int own = is_ep_alltoall(k)              ? 3
                            : group->measured[k]             ? 0
                            : group->fit_bytes_per_s[k] > 0 ? 1
                                                             : 2;
            if (own == source && kinds & (1u << k))
                g_string_append_printf(text, "%s %s", listed++ ? "," : any ? ";" : "",
                                       names[k]);
        }
        if (listed)
            g_string_append_printf(text, " %s", sources[source]);
        any = any || listed;
    }
    g_strlcpy(buf, text->str, size);
    g_string_free(text, TRUE);
}

const char *sim_coll_algo_name(SimAlgo algo)
{
    return algo_names[algo];
}

const char *sim_coll_proto_name(SimProto proto)
{
    return proto_names[proto];
}
