/* sim_coll: the NCCL-like cost of one collective — where a group's ranks sit, the bus
 * bandwidth its bottleneck link gives it, and ring/tree x LL/LL128/Simple timing. */
#ifndef SIM_COLL_H
#define SIM_COLL_H

#include "zp_hw.h"
#include "zp_sched.h"

#include <glib.h>

/* The link class that limits a group's bandwidth; collectives crossing the same class on
 * the same rank share it. */
typedef enum { SIM_LINK_INTRA, SIM_LINK_INTER, SIM_LINK_N } SimLink;

/* SIM_ALGO_P2P: an all-to-all's sends and receives to every peer at once (ncclSend/ncclRecv
 * grouped, as NCCL runs all-to-all), a mixture of experts' dispatch and combine. */
typedef enum { SIM_ALGO_RING, SIM_ALGO_TREE, SIM_ALGO_P2P, SIM_ALGO_N } SimAlgo;
typedef enum { SIM_PROTO_LL, SIM_PROTO_LL128, SIM_PROTO_SIMPLE, SIM_PROTO_N } SimProto;

/* One communicator: its placement and the links it runs over. */
typedef struct {
    int ranks;              /* n: members */
    int nodes;              /* nodes the members span */
    int ranks_per_node;     /* NCCL's ppn = n / nodes */
    double bus_bytes_per_s; /* busbw this group gets from its bottleneck link */
    SimLink bottleneck;     /* the link class that sets bus_bytes_per_s */
    double intra_hop_s;     /* LL per-hop latency over NVLink (the hwprofile's) */
    double inter_hop_s;     /* LL per-hop latency over the network (the hwprofile's) */
    /* A measured machine (the hwprofile's collective_fit): fitted base latency and bus
     * bandwidth per collective kind replace NCCL's protocols; 0 for NCCL's model. */
    double fit_base_s;
    double fit_bytes_per_s[ZP_COLL_N];
    /* The hwprofile's measured table (collective_table) at this group's rank count, by kind,
     * for a group on one machine; NULL where it has none. Points into the profile, valid while
     * it is. Read before the fit. */
    const ZpCollRow *measured[ZP_COLL_N];
    /* For point-to-point all-to-alls (zp_ep_alltoall_time_s): the profile, and the GPUs of a
     * node that run one at once (every group's members on the node). */
    const ZpHw *hw;
    int node_ranks;
} SimCollGroup;

/* The time of one collective, split into what contention stretches and what it does not. */
typedef struct {
    SimAlgo algo;
    SimProto proto;
    double latency_s;  /* fixed part: base + hops; not shared between collectives */
    double transfer_s; /* bandwidth part at the group's full busbw; shared under contention */
} SimCollCost;

/* Where a communicator's groups sit: the world's ranks cut into world / ranks groups of
 * `ranks` members `stride` apart (members first + i * stride, first = b * ranks * stride + o
 * for o < stride), gpus_per_node consecutive ranks to a node. */
typedef struct {
    int ranks;
    int nodes;           /* the most nodes one group spans */
    int groups_per_node; /* groups with members on one node, sharing its NICs */
} SimCollPlacement;

/* The placement of groups of `ranks` members `stride` apart in a world of `world` ranks;
 * world must be a multiple of ranks x stride. O(gpus_per_node^2), whatever the world. */
SimCollPlacement sim_coll_placement(int world, int ranks, int stride, int gpus_per_node);

/* The placement of a communicator of any shape (runs too: zp_sched_graph.h), placed in the
 * world's order; g must tile the world (zp_group_tiles). One run is sim_coll_placement; runs
 * are walked, each distinct first member modulo a node once: O(gpus_per_node x span). */
SimCollPlacement sim_coll_placement_of(int world, const ZpCommGroup *g, int gpus_per_node);

/* The communicator of those groups on hw: per-level bus bandwidth (the hwprofile's measured
 * busbw, or line rate) and hop latencies; across nodes, the node's inter-node busbw split
 * among the groups on it when that is below the intra-node busbw. sim_coll_group_of: a
 * communicator of any shape, placed. */
SimCollGroup sim_coll_group_placed(const ZpHw *hw, int world, int ranks, int stride);
SimCollGroup sim_coll_group_of(const ZpHw *hw, int world, const ZpCommGroup *placed);

/* Placement of the DP or TP group of a world of dp*mp ranks numbered tp-fastest
 * (rank = dp_index*mp + tp_index, gpus_per_node consecutive ranks per node). mp must divide
 * hw->gpus_per_node, so that a TP group lies inside one node and a node holds
 * gpus_per_node/mp members of each DP group, or be a multiple of it, so that a TP group
 * spans mp/gpus_per_node whole nodes over their NICs and each DP group has one member per
 * node; sim_coll_check_placement says so first. With pipeline stages the DP members' stride
 * is tp x pp: pass that as mp for the DP group. */
SimCollGroup sim_coll_group(const ZpHw *hw, int dp, int mp, ZpGroup group);

/* Fails unless mp divides the node's GPUs or is a multiple of them. */
gboolean sim_coll_check_placement(const ZpHw *hw, int mp, GError **error);

/* Ring all-reduce, reduce-scatter or all-gather of `bytes` (the whole array S) with one
 * protocol, as NCCL's tuning model has it: latency = base + (nsteps - nInter) intraLat +
 * nInter interLat (nsteps 2(n-1) for all-reduce, n-1 otherwise; nInter the same in nodes;
 * across nodes intraLat is at least the network post overhead, 1 us, 3 us with Simple; with
 * one rank per node interLat is the tree's), plus factor * S / (busbw * protocol share),
 * factor 2(n-1)/n for all-reduce, (n-1)/n otherwise, share .5 LL, .92 LL128, 1 Simple. Zero
 * for a group of one. An all-to-all is timed as an all-gather: n-1 steps, (n-1)/n of S
 * sent by each rank. */
SimCollCost sim_coll_ring_cost(ZpCollKind kind, double bytes, const SimCollGroup *group,
                               SimProto proto);

/* The same as a single number of seconds, for hand checks. */
double sim_coll_ring_time_s(ZpCollKind kind, double bytes, const SimCollGroup *group,
                            SimProto proto);

/* Tree all-reduce, NCCL's two-level decomposition (a chain inside each node, a double binary
 * tree across nodes): base + 2((ppn-1) intraLat + floor(log2 nodes) interLat) with the
 * tree's hop latencies, plus S / (0.5 * busbw * .92 * protocol share * correction), share
 * 1/3.8 LL, 7/9 (one node) or 120/128 LL128, 1 Simple, correction NCCL's
 * treeCorrectionFactor at log2(S / 64). Zero for a group of one. */
SimCollCost sim_coll_tree_cost(double bytes, const SimCollGroup *group, SimProto proto);

/* NCCL's choice: the algorithm and protocol of least time (tree for all-reduce only); on a
 * measured machine its table's time (zp_colltab_time_s; latency: the time of its smallest
 * size), else the fitted ring: base + steps x hop + bytes sent / fitted busbw. */
SimCollCost sim_coll_cost(ZpCollKind kind, double bytes, const SimCollGroup *group);

/* Bytes one rank sends in a ring collective of S bytes over n ranks: 2(n-1)/n S for
 * all-reduce, (n-1)/n S for reduce-scatter and all-gather (zp_sched_comm_bytes's rule). */
double sim_coll_bytes_sent(ZpCollKind kind, double bytes, int ranks);

/* How a group costs the collective kinds in the mask `kinds` (bit k: ZpCollKind k), in words,
 * into buf: from its table's rows, by its fitted ring or by NCCL's model. */
void sim_coll_describe(const SimCollGroup *group, unsigned kinds, char *buf, size_t size);

const char *sim_coll_algo_name(SimAlgo algo);
const char *sim_coll_proto_name(SimProto proto);

#endif
