"""Latency-bandwidth (alpha-beta) models of collectives on a link and on a two-level topology.

Sizes follow nccl-tests: `nbytes` is the per-rank buffer of all_reduce and broadcast, the total
(gathered) buffer of all_gather and reduce_scatter, and the per-rank send buffer of all_to_all.
Every model is t = a(p) * alpha + b(p) * nbytes * beta; `coefficients` gives (a, b), so one sweep of
measured times fits a link's alpha and beta by linear least squares (see collective_fit.fit_link).

References: Thakur, Rabenseifner, Gropp, "Optimization of Collective Communication Operations in
MPICH" (IJHPCA 2005) for ring, recursive doubling/halving and binomial trees; Sanders, Speck,
Träff, "Two-tree algorithms for full bandwidth broadcast, reduction and scan" (Parallel Computing
2009) for the pipelined (double binary) tree NCCL uses; Li et al., "Scaling Distributed Machine
Learning with the Parameter Server" (OSDI 2014) for push/pull.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

from perfswarm.defaults import Scheme
from perfswarm.errors import ParameterError, PerfswarmError
from perfswarm.model.topology import Link, Topology

Op = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "push_pull"]
OPS: tuple[Op, ...] = get_args(Op)
SCHEMES: tuple[Scheme, ...] = get_args(Scheme)
PS_OPS: tuple[Op, ...] = ("all_reduce", "push_pull", "broadcast")  # what scheme ps models

def bus_factor(op: Op, p: int) -> float:
    """nccl-tests' bus-bandwidth factor: busbw = algbw * factor, comparable to link bandwidth."""
    if p <= 1 or op == "broadcast":
        return 1.0
    return 2 * (p - 1) / p if op in ("all_reduce", "push_pull") else (p - 1) / p


def _log2(p: int) -> int:
    return math.ceil(math.log2(p)) if p > 1 else 0


@dataclass(frozen=True)
class CollectiveConfig:
    scheme: Scheme = "ring"
    servers: int = 1    # parameter servers (scheme ps), each holding 1/servers of the model


RING = CollectiveConfig()


def coefficients(op: Op, p: int, config: CollectiveConfig = RING) -> tuple[float, float]:
    """(latency steps a, byte multiplier b) of `op` among p ranks: t = a*alpha + b*nbytes*beta."""
    if p <= 1:
        return 0.0, 0.0
    q, lg = (p - 1) / p, float(_log2(p))
    scheme = config.scheme
    if scheme == "ps" or op == "push_pull":
        # Workers push gradients to the servers and pull parameters back; each server's link
        # carries p shards of nbytes/servers in each direction, the bottleneck at scale.
        if op not in PS_OPS:
            raise PerfswarmError(f"scheme ps: models all_reduce (push/pull) and broadcast, "
                                 f"not {op}")
        if config.servers < 1:
            raise ParameterError("servers", f"must be at least 1, got {config.servers}")
        per_server = p / config.servers
        return (1.0, per_server) if op == "broadcast" else (2.0, 2 * per_server)
    table: dict[str, tuple[float, float]]
    if scheme == "ring":
        table = {"all_reduce": (2 * (p - 1), 2 * q), "all_gather": (p - 1, q),
                 "reduce_scatter": (p - 1, q), "all_to_all": (p - 1, q),
                 "broadcast": (p - 1, 1.0)}          # pipelined chain
    else:
        table = {"all_reduce": (2 * lg, 2.0),        # pipelined tree reduce + broadcast
                 "all_gather": (lg, q),              # recursive doubling
                 "reduce_scatter": (lg, q),          # recursive halving
                 "all_to_all": (lg, lg / 2),         # Bruck
                 "broadcast": (lg, 1.0)}             # pipelined binary tree
    return table[op]


def link_time(op: Op, nbytes: float, p: int, link: Link,
              config: CollectiveConfig = RING) -> float:
    """Seconds for `op` of `nbytes` among p ranks on one level of `link`."""
    a, b = coefficients(op, p, config)
    if link.fabric != "switch" and op == "all_to_all" and p > 2:
        # Without a switch, all-to-all traffic crosses a shared uplink (bus) or relays through
        # neighbours (p2p): the bisection carries p/2 times what one link would.
        b *= p / 2
    return a * link.alpha_s + b * nbytes * link.beta_s_per_byte


def collective_time(op: Op, nbytes: float, topology: Topology,
                    config: CollectiveConfig = RING) -> float:
    """Seconds for `op` of `nbytes` on a two-level topology.

    Across nodes the classic hierarchical decomposition: reduce-scatter inside each node, the
    inter-node collective on each device's 1/local shard over its own NIC, all-gather inside.
    """
    g, n = topology.local, topology.nodes
    if n == 1 or config.scheme == "ps":
        link = topology.intra if n == 1 else topology.inter
        return link_time(op, nbytes, topology.devices, link, config)
    intra, inter = topology.intra, topology.inter
    if op == "all_reduce":
        return (link_time("reduce_scatter", nbytes, g, intra, config)
                + link_time("all_reduce", nbytes / g, n, inter, config)
                + link_time("all_gather", nbytes, g, intra, config))
    if op in ("all_gather", "reduce_scatter"):
        # nbytes is the full buffer: each node's devices move their node's share inter-node.
        return (link_time(op, nbytes, n, inter, config) / g
                + link_time(op, nbytes, g, intra, config))
    if op == "broadcast":
        return (link_time("broadcast", nbytes / g, n, inter, config)
                + link_time("all_gather", nbytes, g, intra, config))
    if op == "all_to_all":
        p = topology.devices
        a_intra, _ = coefficients(op, g, config)
        a_inter, _ = coefficients(op, n, config)
        return (a_intra * intra.alpha_s + a_inter * inter.alpha_s
                + nbytes * (g - 1) / p * intra.beta_s_per_byte
                + nbytes * (p - g) / p * inter.beta_s_per_byte)
    raise PerfswarmError(f"collective {op}: no hierarchical model (use scheme ps)")


def all_to_allv_time(send_bytes: list[list[float]], link: Link) -> float:
    """Seconds of an all-to-allv on a switch: the busiest rank's larger of sent and received bytes.

    `send_bytes[i][j]` is what rank i sends to rank j. Pairwise exchange takes p-1 steps.
    """
    p = len(send_bytes)
    if p <= 1:
        return 0.0
    if any(len(row) != p for row in send_bytes):
        raise PerfswarmError("all_to_allv: send matrix must be square")
    busiest = max(max(sum(send_bytes[i][j] for j in range(p) if j != i),
                      sum(send_bytes[j][i] for j in range(p) if j != i)) for i in range(p))
    return (p - 1) * link.alpha_s + busiest * link.beta_s_per_byte
