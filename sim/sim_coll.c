/* sim_coll: NCCL's own tuning model (src/graph/tuning.cc), reduced to the pieces a ZeRO step
 * needs, so the simulator picks the algorithm and protocol NCCL would pick for each size. */
#include "sim_coll.h"
#include "zp_zeropp.h"
#include "zp_util.h"

#include <float.h>

#define US 1e-6

/* NCCL's base latencies per algorithm and protocol (tuning.cc baseLat, v2.30), seconds. */
static const double base_latency_s[SIM_ALGO_N][SIM_PROTO_N] = {
    [SIM_ALGO_RING] = {6.6 * US, 14.0 * US, 8.4 * US},
    [SIM_ALGO_TREE] = {6.8 * US, 14.0 * US, 8.4 * US},
};

/* Per-hop latency of each protocol relative to LL's, from NCCL's ring hwLat table: NVLink
 * 0.6 / 1.9 / 3.4 us and network 2.7 / 4.0 / 14 us. The hwprofile holds the LL hop (what the
 * link itself costs); the slower protocols wait for larger chunks, in NCCL's proportions.
 * The tree reuses these ratios: the profile has one hop latency per link class. */
static const double hop_ratio[SIM_LINK_N][SIM_PROTO_N] = {
    [SIM_LINK_INTRA] = {1.0, 1.9 / 0.6, 3.4 / 0.6},
    [SIM_LINK_INTER] = {1.0, 4.0 / 2.7, 14.0 / 2.7},
};

/* Fraction of the link's bandwidth that carries data. LL sends each 8 bytes of data with
 * an 8-byte flag in the same store (half the bandwidth); LL128 spends 8 bytes of flag per
 * 128-byte line (120/128); Simple moves bare data and synchronises by separate fences. */
static const double proto_fraction[SIM_PROTO_N] = {0.5, 120.0 / 128.0, 1.0};

static const char *const algo_names[SIM_ALGO_N] = {"ring", "tree"};
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

SimCollGroup sim_coll_group(const ZpHw *hw, int dp, int mp, ZpGroup group)
{
    SimCollGroup g = {
        .intra_hop_s = hw->intra_node_latency_s,
        .inter_hop_s = hw->inter_node_latency_s,
        .bus_bytes_per_s = hw->intra_node_bytes_per_s,
        .bottleneck = SIM_LINK_INTRA,
        .nodes = 1,
    };
    if (hw->has_collective_fit) {
        g.fit_base_s = hw->collective_base_latency_s;
        for (int k = 0; k < (int)G_N_ELEMENTS(hw->collective_bytes_per_s); k++)
            g.fit_bytes_per_s[k] = hw->collective_bytes_per_s[k];
        /* No fit of its own: an all-to-all moves what an all-gather does. */
        g.fit_bytes_per_s[ZP_COLL_ALLTOALL] = hw->collective_bytes_per_s[ZP_COLL_ALLGATHER];
    }
    if (group == ZP_GROUP_TP) {
        g.ranks = mp;
        g.ranks_per_node = MIN(mp, hw->gpus_per_node);
        g.nodes = mp / g.ranks_per_node;
        /* Across nodes (Megatron's TP of 16-256 in the ZeRO paper's baselines) the group is
         * alone on its nodes' NICs: one ring per NIC, as for DP below. */
        if (g.nodes > 1 && hw->inter_node_bytes_per_s < g.bus_bytes_per_s) {
            g.bus_bytes_per_s = hw->inter_node_bytes_per_s;
            g.bottleneck = SIM_LINK_INTER;
        }
        return g;
    }
    /* Ranks are tp-fastest, so a node's gpus_per_node consecutive ranks hold gpus_per_node/mp
     * members of each of the mp DP groups (mp here is the DP members' stride: tp x pp with
     * pipeline stages); with a stride of a node or more, one member of each of gpus_per_node
     * DP groups. */
    const int members_per_node = MAX(1, hw->gpus_per_node / mp);
    g.ranks = dp;
    g.nodes = (dp + members_per_node - 1) / members_per_node;
    g.ranks_per_node = dp / g.nodes;
    if (g.nodes > 1) {
        /* With one ring per NIC (c rings), each ring carries S/c and crosses every node
         * boundary once, so the boundary moves 2(n-1)/n S/c per ring and 2(n-1)/n S in all:
         * the busbw of the node's NICs together is inter_node_bytes_per_s. The mp DP groups
         * with members on a node run at once and split it. */
        const double nic_share = hw->inter_node_bytes_per_s / MIN(mp, hw->gpus_per_node);
        if (nic_share < g.bus_bytes_per_s) {
            g.bus_bytes_per_s = nic_share;
            g.bottleneck = SIM_LINK_INTER;
        }
    }
    return g;
}

SimCollGroup sim_coll_plan_group(const ZpHw *hw, const ZpPlan *plan, ZpGroup group)
{
    if (group == ZP_GROUP_DP || group == ZP_GROUP_TP)
        return sim_coll_group(hw, plan->dp, plan->mp, group);
    SimCollGroup g = sim_coll_group(hw, plan->dp, plan->mp, ZP_GROUP_TP);
    g.ranks = zp_zeropp_group_ranks(plan, group);
    g.ranks_per_node = g.ranks;
    if (group == ZP_GROUP_XNODE && g.ranks > 1) {
        g.nodes = g.ranks;
        g.ranks_per_node = 1;
        const double nic_share = hw->inter_node_bytes_per_s / hw->gpus_per_node;
        if (nic_share < g.bus_bytes_per_s) {
            g.bus_bytes_per_s = nic_share;
            g.bottleneck = SIM_LINK_INTER;
        }
    }
    return g;
}

static double hop_s(const SimCollGroup *g, SimLink link, SimProto proto)
{
    const double ll_hop = link == SIM_LINK_INTRA ? g->intra_hop_s : g->inter_hop_s;
    return ll_hop * hop_ratio[link][proto];
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
    c.latency_s = base_latency_s[SIM_ALGO_RING][proto] +
                  (steps - inter_steps) * hop_s(group, SIM_LINK_INTRA, proto) +
                  inter_steps * hop_s(group, SIM_LINK_INTER, proto);
    c.transfer_s = sim_coll_bytes_sent(kind, bytes, n) /
                   (group->bus_bytes_per_s * proto_fraction[proto]);
    return c;
}

double sim_coll_ring_time_s(ZpCollKind kind, double bytes, const SimCollGroup *group,
                            SimProto proto)
{
    const SimCollCost c = sim_coll_ring_cost(kind, bytes, group, proto);
    return c.latency_s + c.transfer_s;
}

static int floor_log2(int value)
{
    int log = 0;
    while (value >>= 1)
        log++;
    return log;
}

SimCollCost sim_coll_tree_cost(double bytes, const SimCollGroup *group, SimProto proto)
{
    SimCollCost c = {.algo = SIM_ALGO_TREE, .proto = proto};
    if (group->ranks <= 1)
        return c;
    /* Up the tree and down again: inside a node a chain of ppn ranks, across nodes a
     * binary tree of depth log2(nodes) (NCCL uses the integer log). */
    c.latency_s = base_latency_s[SIM_ALGO_TREE][proto] +
                  2.0 * ((group->ranks_per_node - 1) * hop_s(group, SIM_LINK_INTRA, proto) +
                         floor_log2(group->nodes) * hop_s(group, SIM_LINK_INTER, proto));
    /* NCCL's tree algorithm bandwidth is half the bus bandwidth (tuning.cc ratio .5). */
    c.transfer_s = bytes / (0.5 * group->bus_bytes_per_s * proto_fraction[proto]);
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

SimCollCost sim_coll_cost(ZpCollKind kind, double bytes, const SimCollGroup *group)
{
    if (group->fit_bytes_per_s[kind] > 0)
        return fitted_cost(kind, bytes, group);
    SimCollCost best = {0};
    double best_s = DBL_MAX;
    for (int algo = 0; algo < SIM_ALGO_N; algo++) {
        if (algo == SIM_ALGO_TREE && !is_allreduce(kind))
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

const char *sim_coll_algo_name(SimAlgo algo)
{
    return algo_names[algo];
}

const char *sim_coll_proto_name(SimProto proto)
{
    return proto_names[proto];
}
