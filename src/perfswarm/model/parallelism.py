"""Parallel layouts of a model's training step: memory per device, communication per
step, step time, and the best layout for a device count and topology (as Calculon and Lumos
search them, in far fewer terms).

A layout is data parallel `dp` (with ZeRO stage 0-3; stage 3 is FSDP's full sharding) x
tensor parallel `tp` (Megatron-LM) x pipeline parallel `pp` (1F1B schedule; with `chunks`
v > 1 Narayanan et al.'s interleaved 1F1B, each device holding v chunks of l/(p*v) layers),
dp*tp*pp devices.

Memory (ZeRO, Rajbhandari et al., SC'20, section 3.1 and 5): mixed-precision Adam keeps 2
bytes of fp16 parameters, 2 of fp16 gradients and K = 12 of optimizer state (fp32 parameters,
momentum, variance) per parameter (fp32 training: 4 + 4 + 8); stage 1 shards the optimizer
state over dp, stage 2 the gradients too, stage 3 the parameters too. Each device holds
Psi/(tp*pp) parameters first.
Activations (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
Models", 2022, eq. 2 with tensor parallelism, no sequence parallelism or recomputation):
s*b*h*(10 + 24/t + 5*a*s/(h*t)) bytes per layer and micro-batch; under 1F1B the first stage
holds pp micro-batches in flight. With full recomputation (a layout's `recompute`, as
Megatron-LM trains) a layer keeps only its input, 2*s*b*h bytes (Korthikanti et al. section
4.1), plus one layer's full activations while it is recomputed, and the step's compute grows by
a forward pass: 4/3. Korthikanti et al.'s two alternatives (sections 4.2.2 and 5): sequence
parallelism (`sequence_parallel`, with tp > 1) splits the layer norms and dropouts of the
residual stream over the tensor-parallel ranks too (eq. 4: 34/t + 5as/(ht); their all-reduces
become a reduce-scatter and an all-gather, the same traffic and ring time), and selective
recomputation (`selective`) keeps everything but the attention core (its 5as/(ht), eq. 6),
recomputing its forward: the s x s products (a third of the attention's FLOPs) and the softmax
and dropout over them.

Communication per step and device, in the ZeRO paper's accounting (an all-reduce of n bytes
moves 2n, an all-gather or a reduce-scatter n; Rajbhandari et al. section 7): the gradients
are 2*Psi/(tp*pp) bytes in fp16 (G). Data parallel without ZeRO all-reduces them once a step
(2G); stage 1 reduce-scatters them once and all-gathers the updated parameters after the
optimizer step (2G); stage 2 keeps only its shard of the gradients, so it reduce-scatters them
after every micro-batch's backward pass, and all-gathers the parameters once (m+1)G; stage 3
(FSDP) also gathers each layer's parameters before its forward and again before its backward,
every micro-batch (3mG: 1.5x plain data parallel at m = 1, ZeRO section 7.2.2). Tensor parallel
all-reduces the b*s*h activations twice in the forward and twice in the backward pass of every
layer (Megatron-LM, Shoeybi et al., 2019, section 3), twice more with recomputation (the forward
runs again), per micro-batch; pipeline parallel sends b*s*h activations forward and their
gradients back at each stage boundary per micro-batch.

Step time: the step's compute on one device (`work_s`: measured on a Run, see
optimize.layouts, or 6 * Psi * tokens FLOPs at a share of the device's peak; Kaplan et al.,
2020) split evenly over the devices, except its memory-bound part (`memory_s`: the layer norms,
softmax, dropout and activation functions between the GEMMs, `memory_bound_s`), of which
tensor parallelism splits only what Korthikanti et al.'s eq. 2 divides by t: the layer norms
and dropouts on the residual stream (10 s b h of the 34) run on every tensor-parallel rank, so
a wide tensor-parallel group spends a larger share of its time there and a wide model (h >> s)
a smaller one; stretched by the pipeline bubble (p-1)/m, (p-1)/(v*m) interleaved (Narayanan
et al., SC'21, sections 2.2.1-2.2.2: bubble time over ideal time); tensor-parallel and pipeline
traffic is exposed (it sits between dependent ops). Interleaving sends each micro-batch across
p*v - 1 chunk boundaries rather than p - 1; a boundary between nodes with tp > 1 sends 1/tp of
the activations over each rank's NIC and all-gathers them inside the node (their scatter/gather
optimization, section 4.1). Data-parallel traffic overlaps only the compute that
can run beside it: gradients are reduced as the backward pass produces them, but a step's
all-reduce (stage 0) or reduce-scatter (stage 1) waits for the last micro-batch's backward (the
earlier ones only accumulate), so only that backward hides it; stage 2's reduce-scatter hides
under each micro-batch's backward; stages 1 and 2 gather the updated parameters after the
optimizer step, exposed; stage 3 gathers a layer's parameters while the layer before it
computes (prefetching one layer ahead, as FSDP and DeepSpeed do), so the forward exposes the
first layer's gather and whatever of each other gather outlasts a layer's forward, and the
backward whatever of a layer's gather and gradient reduce-scatter (on the same links) outlasts
its backward; stage 3 also holds two layers' full parameters (the one computing, the one
prefetched) and one layer's full gradients before they are scattered. Collectives take the
alpha-beta time of model.collectives on the topology their group spans: a tensor-parallel group
inside one node, or over whole nodes (its all-reduces then cross the inter-node network every
layer, which Megatron-LM measured to cost more than pipelining across nodes, Narayanan et al.
5.4.1), pipeline and data-parallel groups across nodes when the layout needs more than one.
A model whose layers are unknown (not a transformer the Run's shapes describe) gets
data-parallel layouts only, and its stage-3 gathers are of the whole model at once.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Literal

from perfswarm.errors import PerfswarmError
from perfswarm.model.collectives import collective_time
from perfswarm.model.topology import Link, Topology

PASSES = 4  # memory traffic of a stored activation: written in the forward, read in the
# backward, and a gradient of its size written and read there
OPTIMIZER_BYTES = 12  # K: fp32 parameters, momentum and variance (Adam, mixed precision)
HALF = 2  # bytes of an fp16/bf16 value
FULL = 4  # bytes of an fp32 value
Stage = Literal[0, 1, 2, 3]


@dataclass(frozen=True)
class Blocks:
    """A transformer's repeated layers: what tensor and pipeline parallelism split."""

    layers: int
    hidden: int
    heads: int
    seq: int

    def activation_bytes(self, micro_batch: int, tp: int, sequence: bool = False,
                         selective: bool = False, value_bytes: int = HALF) -> float:
        """One layer's stored activations for one micro-batch (Korthikanti et al. eq. 2; with
        sequence parallelism eq. 4; selective recomputation drops the attention core's), of
        `value_bytes` values. The paper's bytes are of 16-bit values and 1-byte dropout masks:
        its 10 = 8 in values + 2 in masks, 24 all values, 5as/h = 4 in values + 1 in the mask;
        the values' terms scale with their width (fp32: 18 + 48/t + 9as/(ht))."""
        s, b, h, a = self.seq, micro_batch, self.hidden, self.heads
        v = value_bytes / HALF
        core = 0.0 if selective else (4 * v + 1) * a * s / (h * tp)
        return s * b * h * ((8 * v + 2) / (tp if sequence else 1) + 24 * v / tp + core)

    def attention_core(self, value_bytes: int = HALF) -> float:
        """The attention core's share of a layer's stored activations without tensor
        parallelism (eq. 1's 5as/h of 34 + 5as/h at 16 bits): what selective recomputation
        redoes."""
        whole = self.activation_bytes(1, 1, value_bytes=value_bytes)
        return 1 - self.activation_bytes(1, 1, selective=True, value_bytes=value_bytes) / whole


@dataclass(frozen=True)
class Model:
    """What the layouts need of a model and its batch. Without `blocks` (a model that is not a
    transformer the layouts know the layers of) only data-parallel layouts are tried and the
    activations' memory is unknown."""

    params: float  # Psi
    global_batch: int  # samples (sequences) per step
    micro_batch: int = 1
    blocks: Blocks | None = None
    value_bytes: int = HALF  # of a parameter, gradient or activation: 2 mixed precision, 4 fp32

    def __post_init__(self) -> None:
        sizes = (self.params, self.global_batch, self.micro_batch, self.value_bytes,
                 *(vars(self.blocks).values() if self.blocks else ()))
        if min(sizes) <= 0:
            raise PerfswarmError("model: every size must be positive")

    def training_flops(self) -> float:
        """FLOPs of one step: 6 * Psi per token (forward 2, backward 4 per parameter; Kaplan et
        al., 2020) plus, in a transformer, the attention's two s x s products: 4*s*h per token
        and layer forward, 12*s*h with the backward (Narayanan et al., SC'21, section 5.1)."""
        tokens = self.global_batch * (self.blocks.seq if self.blocks else 1)
        b = self.blocks
        return tokens * (6 * self.params + (12 * b.layers * b.seq * b.hidden if b else 0))


def transformer(params: float, layers: int, hidden: int, heads: int, seq: int,
                global_batch: int, micro_batch: int = 1) -> Model:
    """A mixed-precision transformer of these sizes."""
    return Model(params, global_batch, micro_batch, Blocks(layers, hidden, heads, seq))


def memory_bound_s(model: Model, bandwidth: float) -> float:
    """Seconds of a step's memory-bound ops on one device without tensor parallelism: PASSES x
    the activations every layer stores for every micro-batch (Korthikanti et al. eq. 1, s b h
    (34 + 5 a s / h) bytes at 16 bits: Blocks.activation_bytes) at `bandwidth` bytes/s; 0
    without the model's layers."""
    b = model.blocks
    if b is None:
        return 0.0
    micro = model.global_batch // model.micro_batch
    return (PASSES * b.activation_bytes(model.micro_batch, 1, value_bytes=model.value_bytes)
            * b.layers * micro / bandwidth)


@dataclass(frozen=True)
class Layout:
    dp: int
    tp: int
    pp: int
    zero: Stage
    recompute: bool = False  # full activation recomputation, every layer
    chunks: int = 1  # model chunks per pipeline stage: over 1, the interleaved 1F1B schedule
    sequence_parallel: bool = False  # Korthikanti et al. 4.2.2 (with tp > 1)
    selective: bool = False  # selective recomputation: the attention core only (their 5)

    @property
    def devices(self) -> int:
        return self.dp * self.tp * self.pp

    def describe(self) -> str:
        return (f"dp{self.dp} x tp{self.tp} x pp{self.pp}, ZeRO-{self.zero}"
                + (f", interleaved x{self.chunks}" if self.chunks > 1 else "")
                + (", sequence parallel" if self.sequence_parallel else "")
                + (", recompute" if self.recompute else "")
                + (", selective recompute" if self.selective else ""))


def model_state_bytes(params: float, dp: int, zero: Stage, value_bytes: int = HALF) -> float:
    """Parameters, gradients and optimizer state per device for `params` on one model-parallel
    rank, sharded over `dp` by ZeRO stage `zero` (ZeRO section 5.1-5.3). Adam keeps fp32
    momentum and variance; mixed precision (2-byte values) adds an fp32 master copy."""
    p, g = value_bytes * params, value_bytes * params
    o = (OPTIMIZER_BYTES if value_bytes < FULL else 2 * FULL) * params
    if zero >= 1:
        o /= dp
    if zero >= 2:
        g /= dp
    if zero >= 3:
        p /= dp
    return p + g + o


@dataclass(frozen=True)
class Estimate:
    layout: Layout
    memory_bytes: float  # per device: model state + activations (when known) + ZeRO-3's
    # gathered layers (when the layers are known)
    state_bytes: float
    activation_bytes: float | None  # None: the model's layers are unknown
    micro_batches: int  # per data-parallel rank and step
    bubble: float  # pipeline bubble over ideal compute time, (p-1)/m
    comm_bytes: dict[str, float]  # per device and step: dp, tp, pp
    compute_s: float
    exposed_comm_s: float
    host_s: float = 0.0  # per step with no device work (a Run's host-bound time), as measured

    @property
    def step_s(self) -> float:
        return self.compute_s * (1 + self.bubble) + self.exposed_comm_s + self.host_s

    def to_dict(self) -> dict[str, Any]:
        acts = self.activation_bytes
        return {"layout": self.layout.describe(), "dp": self.layout.dp, "tp": self.layout.tp,
                "pp": self.layout.pp, "chunks": self.layout.chunks, "zero": self.layout.zero,
                "recompute": self.layout.recompute,
                "sequence_parallel": self.layout.sequence_parallel,
                "selective_recompute": self.layout.selective,
                "memory_gb": self.memory_bytes / 1e9, "state_gb": self.state_bytes / 1e9,
                "activation_gb": None if acts is None else acts / 1e9,
                "micro_batches": self.micro_batches, "bubble": self.bubble,
                "comm_gb": {k: v / 1e9 for k, v in self.comm_bytes.items()},
                "compute_s": self.compute_s, "exposed_comm_s": self.exposed_comm_s,
                "host_s": self.host_s, "step_s": self.step_s}


def _group(devices: int, per_node: int, spans_nodes: bool, intra: Link,
           inter: Link) -> Topology:
    """The topology a group of `devices` runs on: inside one node unless it must span nodes."""
    return Topology(devices, devices if not spans_nodes else per_node, intra, inter)


def _layers(model: Model) -> int:
    return model.blocks.layers if model.blocks else 1


def _data_parallel(layout: Layout, grads: float, layers: int, m: int, compute: float,
                   group: Topology) -> tuple[float, float]:
    """Bytes a device moves for data parallelism in a step, and the seconds of it exposed:
    `grads` bytes of this device's gradients (and parameters), `layers` on its pipeline stage,
    `m` micro-batches, `compute` its step's compute (see the module's docstring)."""
    units = 4 if layout.recompute else 3  # forward 1, backward 2, recomputed forward 1
    backward = compute / m * (units - 1) / units  # of one micro-batch
    if layout.zero == 3:
        gather = collective_time("all_gather", grads / layers, group)
        scatter = collective_time("reduce_scatter", grads / layers, group)
        forward_layer, backward_layer = compute / m / units / layers, backward / layers
        exposed = (gather + (layers - 1) * max(0.0, gather - forward_layer)
                   + layers * max(0.0, gather + scatter - backward_layer))
        return 3 * m * grads, m * exposed
    if layout.zero == 2:
        scatter = collective_time("reduce_scatter", grads, group)
        return ((m + 1) * grads, m * max(0.0, scatter - backward)
                + collective_time("all_gather", grads, group))
    if layout.zero == 1:
        return 2 * grads, (max(0.0, collective_time("reduce_scatter", grads, group) - backward)
                           + collective_time("all_gather", grads, group))
    return 2 * grads, max(0.0, collective_time("all_reduce", grads, group) - backward)


def estimate(model: Model, layout: Layout, *, per_node: int, intra: Link, inter: Link,
             work_s: float, memory_s: float = 0.0, host_s: float = 0.0) -> Estimate:
    """Memory, traffic and step time of `model` under `layout`; `work_s` is the step's compute
    on one device (all of the global batch), split evenly over the layout's devices but for
    `memory_s` of it (memory-bound ops, see memory_bound_s), which tensor parallelism splits
    only in part; `host_s` the time of a step in which no device works (a host-bound Run's),
    added to every layout as it is (weak scaling keeps each device's host work)."""
    dp, tp, pp, v = layout.dp, layout.tp, layout.pp, layout.chunks
    blocks = model.blocks
    m = model.global_batch // (dp * model.micro_batch)
    if (model.global_batch % (dp * model.micro_batch) or _layers(model) % (pp * v)
            or (tp % per_node if tp > per_node else per_node % tp)
            or (blocks.heads % tp if blocks else tp * pp > 1)
            or (v > 1 and (pp == 1 or m % pp))):
        raise PerfswarmError(f"{layout.describe()}: the batch, layers, heads or node size do "
                             "not divide as the layout needs")
    shard = model.params / (tp * pp)
    value = model.value_bytes
    state = model_state_bytes(shard, dp, layout.zero, value)
    comm = {"dp": 0.0, "tp": 0.0, "pp": 0.0}
    if not 0 <= memory_s <= work_s:
        raise PerfswarmError(f"memory-bound time {memory_s} s: outside 0 to the step's "
                             f"compute {work_s} s")
    sp = layout.sequence_parallel
    # a tensor-parallel rank runs 1/tp of the GEMMs but (without sequence parallelism) more
    # than 1/tp of the rest
    split = (blocks.activation_bytes(model.micro_batch, tp, sp, value_bytes=model.value_bytes)
             / blocks.activation_bytes(model.micro_batch, 1, value_bytes=model.value_bytes)
             if blocks else 1 / tp)
    compute = (work_s - memory_s) / layout.devices + memory_s * split / (dp * pp)
    if layout.selective and blocks:  # the attention core's forward again, split by tp
        tokens = model.global_batch * blocks.seq
        attention = 12 * blocks.layers * blocks.seq * blocks.hidden * tokens
        compute += ((work_s - memory_s) * attention / model.training_flops() / 3
                    + memory_s * blocks.attention_core(model.value_bytes) / PASSES
                    ) / layout.devices
    # recomputation runs each layer's forward again in the backward: 4/3 of the work
    compute *= 4 / 3 if layout.recompute else 1
    exposed = 0.0
    acts = None
    gathered = 0.0  # stage 3's working copies of whole layers (known only with the layers)
    stage_layers = _layers(model) // pp
    if blocks is not None:
        layer = blocks.activation_bytes(model.micro_batch, tp, sp, layout.selective,
                                        model.value_bytes)
        # with recomputation a layer keeps only its input (Korthikanti 4.1), split by sequence
        # parallelism; the full layer is held while it is recomputed
        kept = (value * model.micro_batch * blocks.seq * blocks.hidden / (tp if sp else 1)
                if layout.recompute else layer)
        # 1F1B: the first stage holds p micro-batches; interleaved, (v+1)p - 1 chunks of
        # stage/v layers (Megatron-LM's warm-up, (p-1)*2 + (v-1)*p forward chunks, plus one)
        held = min(pp, m) if v == 1 else min(m * v, (v + 1) * pp - 1) / v
        acts = kept * stage_layers * held + (
            blocks.activation_bytes(model.micro_batch, tp, sp, value_bytes=model.value_bytes)
            if layout.recompute else 0.0)
        if layout.zero == 3 and dp > 1:  # two layers' parameters and one's gradients, whole
            gathered = 3 * value * shard / stage_layers
        bsh = value * model.micro_batch * blocks.seq * blocks.hidden
        t = _group(tp, per_node, tp > per_node, intra, inter)  # whole nodes past one
        if tp > 1:
            per_layer = 6 if layout.recompute else 4  # the recomputed forward's two again
            comm["tp"] = 2 * per_layer * bsh * stage_layers * m
            exposed += per_layer * stage_layers * m * collective_time("all_reduce", bsh, t)
        if pp > 1:  # each micro-batch crosses pp*v - 1 chunk boundaries each way
            sends = 2 * m * (pp * v - 1) / pp
            comm["pp"] = sends * bsh
            if tp * pp <= per_node:  # the model's ranks fit in one node
                send = intra.alpha_s + bsh * intra.beta_s_per_byte
            else:  # scatter/gather (Narayanan et al. 4.1): each tensor-parallel rank sends
                # 1/tp over its own NIC, and the group all-gathers the rest over the node's links
                send = (inter.alpha_s + bsh / tp * inter.beta_s_per_byte
                        + collective_time("all_gather", bsh, t))
            exposed += sends * send
    if dp > 1:
        model_group = tp * pp
        d = _group(dp, max(1, per_node // model_group), model_group * dp > per_node, intra,
                   inter)
        comm["dp"], dp_exposed = _data_parallel(layout, value * shard, stage_layers, m,
                                                compute, d)
        exposed += dp_exposed
    return Estimate(layout, state + (acts or 0.0) + gathered, state, acts, m,
                    (pp - 1) / (m * v), comm, compute, exposed, host_s)


def divisors(n: int) -> list[int]:
    """The divisors of n, ascending (a walk to its square root, not to n: a million devices
    took a second, a billion ran out of memory)."""
    low = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return low + [n // d for d in reversed(low) if d * d != n]


def layouts(model: Model, devices: int, per_node: int) -> list[Layout]:
    """Every layout of `devices` the model divides into: tp dividing a node, or whole nodes,
    and the heads (each rank computes whole heads), pp dividing the layers, dp dividing the batch,
    ZeRO 0-3 (ZeRO only with dp > 1), no, full or selective recomputation, each pipeline also
    interleaved in every number of chunks dividing its stage's layers (where the micro-batches
    are a multiple of pp, as Megatron-LM needs), tensor parallelism with and without sequence
    parallelism; data parallel only without the model's layers."""
    out = []
    degrees = [t for t in divisors(devices)
               if (t % per_node if t > per_node else per_node % t) == 0]
    splits = (itertools.product(degrees, divisors(_layers(model))) if model.blocks else [(1, 1)])
    for tp, pp in splits:
        if (_layers(model) % pp or devices % (tp * pp)
                or (model.blocks and model.blocks.heads % tp)):
            continue
        dp = devices // (tp * pp)
        if model.global_batch % (dp * model.micro_batch):
            continue
        stage = _layers(model) // pp
        m = model.global_batch // (dp * model.micro_batch)
        chunks = [v for v in range(1, stage + 1)
                  if not stage % v and (v == 1 or (pp > 1 and not m % pp))]
        recomputes = ([(False, False), (True, False), (False, True)] if model.blocks
                      else [(False, False)])
        out += [Layout(dp, tp, pp, z, full, v, sp, selective)
                for z in ((0, 1, 2, 3) if dp > 1 else (0,)) for full, selective in recomputes
                for v in chunks for sp in ((False, True) if tp > 1 else (False,))]
    return out


def best_layout(model: Model, devices: int, *, per_node: int, intra: Link, inter: Link,
                work_s: float, memory_bytes: float, memory_s: float = 0.0, host_s: float = 0.0
                ) -> tuple[Estimate | None, list[Estimate]]:
    """The fastest layout that fits in `memory_bytes` per device (None when none fits), and
    every layout's estimate, fastest first (ties: less memory, then fewer model-parallel
    ranks)."""
    found = sorted((estimate(model, lay, per_node=per_node, intra=intra, inter=inter,
                             work_s=work_s, memory_s=memory_s, host_s=host_s)
                    for lay in layouts(model, devices, per_node)),
                   key=lambda e: (round(e.step_s, 9), e.memory_bytes, e.layout.tp * e.layout.pp,
                                  e.layout.zero))
    fits = [e for e in found if e.memory_bytes <= memory_bytes]
    return (fits[0] if fits else None), found
