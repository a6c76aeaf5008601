"""GPUs, clusters, parallel settings and rank placement.

Figures come from ``data/hardware/hardware.json`` (NVIDIA datasheets, DGX BasePOD reference architecture,
nccl-tests ``doc/PERFORMANCE.md``) and the cost-model assumptions from ``data/hardware/cost_model.json``.
Bandwidths here are **per GPU, per direction, in bytes/s** (NVLink datasheet figures are bidirectional
totals and are halved on load).

Rank placement (Megatron-style, TP innermost, then CP): ``rank = (((pp_i * dp + dp_i) * ep + ep_i) * cp + cp_i) * tp
+ tp_i``. World size is ``pp * dp * ep * tp * cp``. Experts are sharded over the ``ep`` ranks of a stage; the
non-expert part of a stage is data-parallel over ``ep * dp`` ranks, each of which runs its own micro-batches, and
each micro-batch's sequence is split over the ``cp`` ranks of a context-parallel group (docs/context-parallel.md).
A cluster's node is one NVLink domain: 8 GPUs on a DGX/HGX node, 72 on a GB200 NVL72 rack (``hardware.json``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from tessera_lab.checks import check_work
from tessera_lab.errors import ConfigError
from tessera_lab.model.layout import RankGrid, ranks_per_node
from tessera_lab.paths import read_data_json

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4}
MIB = 2**20
#: token dispatchers (:mod:`tessera_lab.cost.ep_traffic`), Megatron's recompute granularities, GEMM input
#: precisions and gradient-reduction dtypes a plan may choose
DISPATCHERS = ("alltoall", "deepep")
RECOMPUTE = ("none", "selective", "full")
PRECISIONS = ("bf16", "fp8")
GRAD_REDUCE_DTYPES = ("fp32", "bf16")
GROUPED_GEMMS = ("grouped", "sequential", "multistream")
#: Adam moment dtypes (``exp_avg``/``exp_avg_sq``): ``fp32`` (Megatron-LM's default) or ``bf16`` (Megatron-Core's
#: precision-aware optimizer, ``use_precision_aware_optimizer`` with ``exp_avg_dtype = exp_avg_sq_dtype = bf16``)
ADAM_MOMENT_DTYPES = ("fp32", "bf16")
#: Megatron-LM ``--recompute-modules`` this model knows (``recompute = selective`` with ``recompute_modules``):
#: ``core_attn`` (attention core), ``mla_up_proj`` (MLA up projections and RoPE, output-discarding), ``mlp`` (the
#: dense MLP of a dense layer), ``moe_act`` (the routed experts' SwiGLU, output-discarding), ``moe`` (the whole
#: MoE block), ``layernorm`` (the input and pre-MLP norms, output-discarding: their outputs are freed and re-made
#: in the backward), ``shared_experts`` (the shared-expert MLP, a normal checkpoint keeping its input)
#: (``megatron/core/transformer/transformer_config.py``, ``recompute_modules``, NVIDIA/Megatron-LM commit
#: 002526d81b81f6ab534e93844f9a228709887494; the GDN/GDP modules are not modelled and are refused)
RECOMPUTE_MODULES = ("core_attn", "mla_up_proj", "mlp", "moe_act", "moe", "layernorm", "shared_experts")
MOE_RECOMPUTE_MODULES = ("moe_act", "moe", "shared_experts")  # of those, the ones a model without MoE layers lacks
#: what ``recompute = selective`` without ``recompute_modules`` recomputes here: the attention core and the routed
#: experts' SwiGLU (Gated DeltaNet chunk states are always recomputed). Megatron-Core's own default is ``["core_attn"]``
#: alone (``TransformerConfig.__post_init__``, NVIDIA/Megatron-LM@d98e8a64), so every export writes the modules out
SELECTIVE_DEFAULT_MODULES = ("core_attn", "moe_act")


def selective_modules(recompute: str, modules: "tuple[str, ...] | list[str]" = (), moe: bool = True) -> tuple[str, ...]:
    """The Megatron modules recomputed selectively: ``modules`` (none given: :data:`SELECTIVE_DEFAULT_MODULES`) with
    ``recompute = selective``, less :data:`MOE_RECOMPUTE_MODULES` where ``moe`` is false (no MoE layer); else ``()``."""
    mods = (modules or SELECTIVE_DEFAULT_MODULES) if recompute == "selective" else ()
    return tuple(m for m in mods if moe or m not in MOE_RECOMPUTE_MODULES)


#: how the EP group sits on the ranks: ``grid`` (this project's RankGrid, TP innermost, so an EP group strides by tp)
#: or ``contiguous`` (Megatron-Core's expert rank generator with expert TP 1: EP innermost, ep consecutive ranks)
EP_PLACEMENTS = ("grid", "contiguous")


@lru_cache(maxsize=None)
def hardware_data() -> dict[str, Any]:
    """``data/hardware/hardware.json`` parsed."""
    return read_data_json("hardware/hardware.json", "hardware")


@lru_cache(maxsize=None)
def cost_assumptions() -> dict[str, float]:
    """Values of ``data/hardware/cost_model.json`` (each documented with its source there)."""
    raw = read_data_json("hardware/cost_model.json", "cost model inputs")
    return {k: float(v["value"]) for k, v in raw.items() if not k.startswith("_")}


_GPU_ALIASES = {"H100": "H100-SXM", "H100-SXM": "H100-SXM", "H200": "H200", "B200": "B200", "B300": "B300",
                "GB200": "GB200", "GB200-NVL72": "GB200"}


def gpu_types() -> tuple[str, ...]:
    """The GPU types of ``data/hardware/hardware.json`` (canonical names, e.g. ``H100-SXM``, ``GB200``), each a valid
    :meth:`GPUSpec.named` argument; what a layout search enumerates."""
    return tuple(hardware_data()["gpus"])


@dataclass(frozen=True)
class GPUSpec:
    """One GPU type.

    Attributes:
        name: e.g. ``"H200"``.
        peak_flops: dense bf16 peak, FLOP/s.
        memory_bytes: HBM capacity as the device reports it (nvidia-smi ``memory.total``, MiB x 2**20), bytes;
            the datasheet "141 GB" of an H200 is 143771 MiB = 140.4 GiB.
        hbm_bytes_per_s: HBM bandwidth, bytes/s.
        nvlink_bytes_per_s: NVLink bandwidth per GPU per direction, bytes/s (half the bidirectional figure).
        sms: streaming multiprocessors.
        source: datasheet reference.
        peak_fp8_flops: dense FP8 peak, FLOP/s (0 when the GPU has none listed).
        nvlink_domain: GPUs joined by NVLink switches in the system this GPU ships in (8 on a DGX/HGX node, 72 on a
            GB200 NVL72 rack); a :class:`Cluster` node is one such domain.
        nic_bytes_per_s: compute-fabric NIC bandwidth per GPU per direction across NVLink domains, bytes/s
            (400 Gb/s ConnectX-7: 50e9; 800 Gb/s ConnectX-8: 100e9).
    """

    name: str
    peak_flops: float
    memory_bytes: float
    hbm_bytes_per_s: float
    nvlink_bytes_per_s: float
    sms: int
    source: str
    peak_fp8_flops: float = 0.0
    nvlink_domain: int = 8
    nic_bytes_per_s: float = 50e9

    def peak_for(self, precision: str) -> float:
        """Dense peak FLOP/s for GEMM inputs of ``precision`` (``bf16`` or ``fp8``).

        Raises:
            ConfigError: FP8 on a GPU without an FP8 figure, or an unknown precision.
        """
        if precision == "bf16":
            return self.peak_flops
        if precision == "fp8" and self.peak_fp8_flops > 0:
            return self.peak_fp8_flops
        raise ConfigError(f"field 'precision' = {precision!r} is not available on {self.name}; allowed: "
                          f"{'bf16, fp8' if self.peak_fp8_flops else 'bf16'}")

    @classmethod
    def named(cls, name: str) -> "GPUSpec":
        """A GPU from ``data/hardware/hardware.json`` (``H100``/``H100-SXM``, ``H200``, ``B200``, ``B300``,
        ``GB200``/``GB200-NVL72``), with the NVLink domain and NIC of the system it ships in.

        Raises:
            ConfigError: unknown name (lists the known ones).
        """
        key = _GPU_ALIASES.get(str(name).upper().replace("_", "-"), None)
        gpus = hardware_data()["gpus"]
        if key is None or key not in gpus:
            raise ConfigError(f"field 'gpu' = {name!r} is unknown; allowed: {', '.join(sorted(_GPU_ALIASES))}")
        g = gpus[key]
        return cls(
            name=key,
            peak_flops=g["bf16_dense_tflops"] * 1e12,
            memory_bytes=float(g["hbm_mib_reported"]) * MIB if "hbm_mib_reported" in g else g["hbm_gb"] * 1e9,
            hbm_bytes_per_s=g["hbm_tb_per_s"] * 1e12,
            nvlink_bytes_per_s=g["nvlink_gb_per_s_bidir"] * 1e9 / 2,
            sms=int(g["sms"]),
            source=g["source"],
            peak_fp8_flops=float(g.get("fp8_dense_tflops", 0.0)) * 1e12,
            nvlink_domain=int(g.get("nvlink_domain_gpus", hardware_data()["node"]["gpus_per_node"])),
            nic_bytes_per_s=float(g.get("nic_gb_per_s_per_direction",
                                        hardware_data()["node"]["inter_node"]["gb_per_s_per_direction"])) * 1e9,
        )


@dataclass(frozen=True)
class Link:
    """A link: per-GPU bandwidth per direction (bytes/s), base latency (s), whether it leaves the NVLink domain."""

    name: str
    bytes_per_s: float
    latency_s: float
    inter_node: bool = False


@dataclass(frozen=True)
class Cluster:
    """Nodes of identical GPUs: NVLink inside a node, one InfiniBand NIC per GPU across nodes. A node is one NVLink
    domain (a DGX/HGX node of 8 GPUs, or a GB200 NVL72 rack of 72).

    Attributes: ``gpu`` the GPU type; ``num_nodes`` nodes (NVLink domains, >= 1); ``gpus_per_node`` GPUs per node
    (DGX 8, NVL72 72); ``inter_node_bytes_per_s`` per-GPU inter-node bandwidth per direction, bytes/s (NDR: 50e9);
    ``weak_link_factor`` multiplies it (1.0 = healthy; 0.5 = a link at half speed); ``memory_reserve_gib`` GiB per
    GPU held back from the HBM the memory model may fill (CUDA context, NCCL buffers, fragmentation, a margin of the
    user's); ``None``: ``memory_reserve_gib`` of ``data/hardware/cost_model.json``
    (:func:`tessera_lab.cost.memory.memory_capacity`)."""

    gpu: GPUSpec
    num_nodes: int
    gpus_per_node: int = 8
    inter_node_bytes_per_s: float = 50e9
    weak_link_factor: float = 1.0
    memory_reserve_gib: float | None = None

    def __post_init__(self) -> None:
        if self.num_nodes < 1:
            raise ConfigError(f"field 'num_nodes' = {self.num_nodes} is out of range; allowed: >= 1")
        if self.gpus_per_node < 1:
            raise ConfigError(f"field 'gpus_per_node' = {self.gpus_per_node} is out of range; allowed: >= 1")
        if not 0 < self.weak_link_factor <= 1:
            raise ConfigError(f"field 'weak_link_factor' = {self.weak_link_factor} is out of range; allowed: (0, 1]")
        if self.memory_reserve_gib is not None:
            hbm = self.gpu.memory_bytes / 2**30
            r = self.memory_reserve_gib
            if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r) or not 0 <= r < hbm:
                raise ConfigError(f"field 'memory_reserve_gib' = {r!r} is out of range; allowed: a number of GiB "
                                  f">= 0 and below the {self.gpu.name}'s {hbm:.2f} GiB")

    @classmethod
    def dgx(cls, gpu: str | GPUSpec = "H200", num_nodes: int = 1, memory_reserve_gib: float | None = None
            ) -> "Cluster":
        """``num_nodes`` NVLink domains of the GPU's system (:attr:`GPUSpec.nvlink_domain` GPUs each: a DGX/HGX node
        of 8, a GB200 NVL72 rack of 72) with its NIC per GPU across them (:attr:`GPUSpec.nic_bytes_per_s`);
        ``memory_reserve_gib`` as the attribute (``None``: the data file's)."""
        spec = gpu if isinstance(gpu, GPUSpec) else GPUSpec.named(gpu)
        return cls(gpu=spec, num_nodes=num_nodes, gpus_per_node=int(spec.nvlink_domain),
                   inter_node_bytes_per_s=float(spec.nic_bytes_per_s), memory_reserve_gib=memory_reserve_gib)

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def intra_link(self) -> Link:
        return Link("NVLink", self.gpu.nvlink_bytes_per_s, cost_assumptions()["alpha_intra_node_s"])

    def inter_link(self) -> Link:
        return Link("InfiniBand", self.inter_node_bytes_per_s * self.weak_link_factor,
                    cost_assumptions()["alpha_inter_node_s"], inter_node=True)

    def link_for(self, ranks: list[int] | tuple[int, ...]) -> Link:
        """The bottleneck link of a group: NVLink if all ranks share a node, else the inter-node link."""
        return self.intra_link() if len(ranks_per_node(ranks, self.gpus_per_node)) <= 1 else self.inter_link()


@dataclass(frozen=True)
class ParallelConfig:
    """Parallel sizes and the training batch shape.

    Attributes:
        pp: pipeline stages (ranks in the pipeline).
        vpp: virtual stages (model chunks) per pipeline rank; 1 = none.
        tp: tensor-parallel size (mixer and shared expert are split; two all-reduces per layer).
        ep: expert-parallel size (experts of a stage are sharded over ``ep`` ranks).
        dp: data-parallel replicas beyond EP (the non-expert part is data-parallel over ``ep * dp``).
        microbatches: micro-batches per iteration per pipeline (m).
        micro_batch_size: sequences per micro-batch.
        seq_len: tokens per sequence.
        dtype: ``bf16`` (default), ``fp16``, ``fp8`` or ``fp32`` for activations and communication.
        distributed_optimizer: shard optimizer state over the data-parallel ranks (6 + 12/dp bytes per
            parameter instead of 18; docs/concepts.md, "Memory per stage").
        schedule: pipeline schedule the planner simulates; default ``overlapped`` (1F1B whose steady state runs
            the forward of one micro-batch together with the backward of another, as Tessera's plans assume).
        dispatcher: ``alltoall`` (one copy per token and expert, Megatron's) or ``deepep`` (one copy per token and
            destination rank; DeepEP's kernels hold 24 SMs) (:mod:`tessera_lab.cost.ep_traffic`).
        recompute: ``none``, ``selective`` (attention core, routed-expert activations; Gated DeltaNet chunk states are
            always recomputed, as flash-linear-attention does) or ``full`` (each layer keeps only its input and
            re-runs its forward in the backward), as Megatron-LM's ``--recompute-granularity`` names them.
        precision: GEMM input precision, ``bf16`` or ``fp8`` (FP8 current scaling: linear layers and expert GEMMs
            in FP8 at the FP8 peak, attention, activations and communication in bf16).
        grad_reduce_dtype: ``fp32`` (Megatron-LM's default for bf16: fp32 gradient buffer and reduction) or
            ``bf16``; sets the gradient buffer bytes in memory and the reduce-scatter bytes of gradient sync.
        expert_load: tokens the busiest EP rank receives relative to the mean; ``None`` = the expected busiest
            rank of a balanced random router (:func:`tessera_lab.cost.ep_traffic.busiest_rank_load`).
        grouped_gemm: expert GEMM implementation, ``grouped`` (one grouped kernel), ``multistream`` (default:
            Transformer Engine's GroupedLinear as Megatron's TEGroupedMLP runs it, one cuBLAS GEMM per expert on 4
            streams, each launched by the host) or ``sequential`` (one launch
            per expert) (:mod:`tessera_lab.cost.gemm`).
        fused_cross_entropy: the loss keeps only the bf16 logits (gradient written in place, Megatron's
            cross-entropy fusion) instead of the fp32 log-softmax.
        ep_placement: ``grid`` (default: the EP group as :class:`~tessera_lab.model.layout.RankGrid` places it, strided
            by ``tp``) or ``contiguous`` (``ep`` consecutive ranks, as Megatron-Core's ``expert_decoder_rank_generator``
            builds expert groups with expert TP 1, order ``tp-cp-ep-dp-pp``, ``megatron/core/parallel_state.py``);
            only the links the EP all-to-all crosses depend on it.
        ep_spans_tp: the EP group spans the TP ranks as well as data-parallel ones (Megatron-Core's expert grid
            with expert TP 1: ``EP * EDP = TP * DP``, ``megatron/core/parallel_state.py``; what a recipe with EP
            larger than its DP runs, e.g. TP 2 x DP 16 = EP 32). Then ``ep`` counts all the EP ranks, ``tp``
            must divide it, the world is ``pp * dp * ep`` (``dp`` = expert data-parallel replicas), the dense
            part is data-parallel over ``ep / tp * dp`` ranks (:attr:`dense_dp`) and tensor-parallel over ``tp``
            with sequence parallelism (each TP rank routes ``T / tp`` tokens to the experts; Megatron requires
            sequence parallelism with TP and EP together, ``megatron/training/arguments.py``).
        sequence_parallel: with ``tp > 1``, activations outside the tensor-parallel regions are split over the
            TP ranks (Megatron-LM's ``--sequence-parallel``, on in the Megatron-Bridge recipes with TP > 1 and
            required for MoE with TP, ``megatron/core/transformer/moe/moe_layer.py``); only saved activation bytes
            depend on it (the RS + AG it uses move the bytes of the all-reduce priced).
        adam_moment_dtype: dtype of Adam's two moments (:data:`ADAM_MOMENT_DTYPES`); the fp32 master weights
            stay fp32, so optimizer state is ``4 + 2 x moment`` bytes per parameter (12 or 8).
        recompute_modules: with ``recompute = selective``, Megatron-LM's module names to recompute
            (:data:`RECOMPUTE_MODULES`); empty = this project's ``selective`` (attention core and routed-expert
            activations).
        cp: context-parallel size: each micro-batch's sequences are split over ``cp`` ranks (``seq_len / cp`` tokens
            each, Megatron's load-balanced causal split into ``2 cp`` chunks, so ``seq_len`` must be a multiple of
            ``2 cp``); CP ranks sit next to the TP ranks (Megatron's order ``tp-cp-ep-dp-pp``) and multiply the world.
            ``ep`` still counts the EP ranks of a group and the world grows by ``cp``; the EP groups span CP ranks as
            Megatron-Core's expert grid does (carved from ``tp x cp x dp``, :meth:`group_ranks`), each rank routing
            its own ``seq_len / cp`` tokens (docs/context-parallel.md).
        host_sync_s: seconds each host wait of a MoE layer exposes per micro-batch (the dropless EP dispatch's wait
            on the token counts, and GPT-OSS's expert activation's: :func:`tessera_lab.cost.sync.
            host_waits_per_layer`; applied only where :mod:`tessera_lab.cost.sync`'s rule says);
            ``None`` = the dispatcher's value fitted on published runs (``FITTED_PER_WAIT_S``), 0 = off.
        fsdp: Megatron FSDP (``--use-megatron-fsdp`` with ``optim_grads_params`` sharding): parameters, gradients
            and optimizer state all sharded over the data-parallel ranks of each part (:attr:`dense_shard_dp`,
            :attr:`expert_dp`); each layer's bf16 parameters are all-gathered before its forward and again before
            its backward, and its gradients reduce-scattered after the backward, every micro-batch
            (:mod:`tessera_lab.model.tasks`; memory in :mod:`tessera_lab.cost.memory`). Supersedes
            ``distributed_optimizer``.
    """

    pp: int = 8
    vpp: int = 1
    tp: int = 1
    ep: int = 8
    dp: int = 1
    microbatches: int = 32
    micro_batch_size: int = 1
    seq_len: int = 4096
    dtype: str = "bf16"
    distributed_optimizer: bool = True
    schedule: str = "overlapped"
    dispatcher: str = "alltoall"
    recompute: str = "none"
    precision: str = "bf16"
    grad_reduce_dtype: str = "fp32"
    expert_load: float | None = None
    grouped_gemm: str = "multistream"
    fused_cross_entropy: bool = False
    ep_placement: str = "grid"
    ep_spans_tp: bool = False
    sequence_parallel: bool = True
    adam_moment_dtype: str = "fp32"
    recompute_modules: tuple[str, ...] = ()
    host_sync_s: float | None = None
    cp: int = 1
    fsdp: bool = False

    def __post_init__(self) -> None:
        for name in ("pp", "vpp", "tp", "ep", "dp", "microbatches", "micro_batch_size", "seq_len", "cp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"field '{name}' = {value!r} is out of range; allowed: an integer >= 1")
            check_work(name, value, field=f"field '{name}'")  # work limits of tessera_lab.checks
        if self.ep_spans_tp and (self.tp < 2 or self.ep % self.tp):
            raise ConfigError(f"field 'ep_spans_tp' needs tp >= 2 dividing ep; got tp = {self.tp}, ep = {self.ep}; "
                              "allowed: ep a multiple of tp (the EP group spans the TP ranks)")
        if self.cp > 1 and self.seq_len % (2 * self.cp):
            raise ConfigError(f"field 'cp' = {self.cp} does not split field 'seq_len' = {self.seq_len}; allowed: cp with "
                              f"seq_len a multiple of 2 x cp (Megatron's load-balanced split into 2 x cp chunks)")
        check_work("world_size", self.world_size, field="field 'pp x dp x ep x tp x cp'")
        if self.dtype not in DTYPE_BYTES:
            raise ConfigError(f"field 'dtype' = {self.dtype!r} is unknown; allowed: {', '.join(DTYPE_BYTES)}")
        for name, allowed in (("dispatcher", DISPATCHERS), ("recompute", RECOMPUTE), ("precision", PRECISIONS),
                              ("grad_reduce_dtype", GRAD_REDUCE_DTYPES), ("grouped_gemm", GROUPED_GEMMS),
                              ("ep_placement", EP_PLACEMENTS)):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"field '{name}' = {getattr(self, name)!r} is unknown; allowed: {', '.join(allowed)}")
        if self.expert_load is not None and (isinstance(self.expert_load, bool) or not self.expert_load >= 1.0):
            raise ConfigError(f"field 'expert_load' = {self.expert_load!r} is out of range; allowed: a number >= 1 "
                              "(busiest EP rank over the mean)")
        if self.host_sync_s is not None and (isinstance(self.host_sync_s, bool) or not isinstance(
                self.host_sync_s, (int, float)) or not 0.0 <= self.host_sync_s < 1e3):
            raise ConfigError(f"field 'host_sync_s' = {self.host_sync_s!r} is out of range; allowed: seconds >= 0 "
                              "(per MoE layer and micro-batch), or null for the fitted value")
        if self.adam_moment_dtype not in ADAM_MOMENT_DTYPES:
            raise ConfigError(f"field 'adam_moment_dtype' = {self.adam_moment_dtype!r} is unknown; allowed: "
                              f"{', '.join(ADAM_MOMENT_DTYPES)}")
        if isinstance(self.recompute_modules, (str, bytes)) or not all(
                m in RECOMPUTE_MODULES for m in self.recompute_modules):
            raise ConfigError(f"field 'recompute_modules' = {self.recompute_modules!r} is unknown; allowed: a list of "
                              f"{', '.join(RECOMPUTE_MODULES)}")
        object.__setattr__(self, "recompute_modules", tuple(self.recompute_modules))
        if not isinstance(self.fsdp, bool):
            raise ConfigError(f"field 'fsdp' = {self.fsdp!r} is out of range; allowed: true or false")
        if self.recompute_modules and self.recompute != "selective":
            raise ConfigError(f"field 'recompute_modules' needs recompute = 'selective'; got {self.recompute!r}")

    @property
    def world_size(self) -> int:
        """GPUs: ``pp * dp * ep * tp * cp``, or ``pp * dp * ep * cp`` when the EP group spans the TP ranks (Megatron's
        ``tp x cp x pp x`` data-parallel replicas)."""
        return self.pp * self.dp * self.ep * (1 if self.ep_spans_tp else self.tp) * self.cp

    @property
    def dense_dp(self) -> int:
        """Data-parallel degree of the non-expert parameters (the pipelines that run their own micro-batches):
        ``ep * dp``, or ``ep / tp * dp`` when the EP group spans the TP ranks."""
        return self.ep * self.dp // (self.tp if self.ep_spans_tp else 1)

    @property
    def expert_dp(self) -> int:
        """Data-parallel degree of the routed experts (the ranks holding the same experts, over which a
        distributed optimizer shards their state): ``tp * dp`` (each TP rank is in its own EP group, expert TP 1,
        Megatron-Core's ``EP * EDP = TP * CP * DP``), or ``dp`` when the EP group spans the TP ranks; times ``cp``
        (each CP rank holds the same experts)."""
        return self.dp * (1 if self.ep_spans_tp else self.tp) * self.cp

    @property
    def dense_shard_dp(self) -> int:
        """Ranks holding the same dense (TP-sharded) parameters, over which their gradients are reduced and a
        distributed optimizer shards their state: :attr:`dense_dp` x ``cp`` (Megatron-Core's data-parallel group
        with CP, ``get_data_parallel_group(with_context_parallel=True)``)."""
        return self.dense_dp * self.cp

    @property
    def tokens_per_rank(self) -> int:
        """Tokens one rank holds per micro-batch: ``micro_batch_size * seq_len / cp``."""
        return self.micro_batch_size * self.seq_len // self.cp

    @property
    def optimizer_state_bytes(self) -> float:
        """Optimizer-state bytes per parameter: fp32 master weights plus Adam's two moments, ``4 + 2 x moment``
        (12 with fp32 moments, 8 with bf16)."""
        return 4.0 + 2.0 * DTYPE_BYTES[self.adam_moment_dtype]

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def grad_bytes(self) -> int:
        """Bytes of one gradient element in the gradient buffer and its reduction (``grad_reduce_dtype``)."""
        return DTYPE_BYTES[self.grad_reduce_dtype]

    @property
    def grad_sync_bytes_per_param(self) -> float:
        """All-reduce-equivalent bytes per parameter of the end-of-iteration gradient sync: with a distributed
        optimizer a reduce-scatter of gradients plus an all-gather of bf16 parameters, ``(grad + 2) / 2`` (each
        half the bus volume of an all-reduce); else an all-reduce of the gradients, ``grad`` bytes."""
        if self.distributed_optimizer:
            return (self.grad_bytes + 2) / 2
        return float(self.grad_bytes)

    @property
    def tokens_per_microbatch(self) -> int:
        """Tokens one rank processes per micro-batch (``micro_batch_size * seq_len``)."""
        return self.micro_batch_size * self.seq_len

    @property
    def tokens_per_iteration(self) -> int:
        """Global batch in tokens: every one of the :attr:`dense_dp` data-parallel pipelines runs ``m``
        micro-batches."""
        return self.microbatches * self.tokens_per_microbatch * self.dense_dp

    def replace(self, **changes: Any) -> "ParallelConfig":
        return dataclasses.replace(self, **changes)

    # ---------------------------------------------------------------- placement
    @property
    def grid(self) -> RankGrid:
        """The rank layout (:class:`~tessera_lab.model.layout.RankGrid`: TP innermost, then EP, DP, PP); when the EP
        group spans the TP ranks the grid's ep axis holds ``ep / tp`` (the EP group is then a whole ep x tp block,
        :meth:`group_ranks`). With ``cp > 1`` the grid's tp axis holds the ``tp x cp`` block (CP ranks next to the
        TP ranks, Megatron's ``tp-cp-ep-dp-pp``): position ``cp_i * tp + tp_i``."""
        return RankGrid(pp=self.pp, dp=self.dp, ep=self.ep // (self.tp if self.ep_spans_tp else 1),
                        tp=self.tp * self.cp)

    def rank(self, pp_i: int, dp_i: int = 0, ep_i: int = 0, tp_i: int = 0, cp_i: int = 0) -> int:
        """Global rank of a coordinate (see :class:`~tessera_lab.model.layout.RankGrid`; ``cp_i`` the CP index)."""
        return self.grid.rank(pp_i, dp_i, ep_i, cp_i * self.tp + tp_i)

    def group_ranks(self, kind: str, pp_i: int = 0, dp_i: int = 0, ep_i: int = 0, tp_i: int = 0) -> list[int]:
        """Ranks of the ``tp``, ``cp``, ``ep``, ``dp``, ``edp`` or ``pp`` group containing the coordinate (CP index 0)
        (:meth:`~tessera_lab.model.layout.RankGrid.group_ranks`); with ``ep_spans_tp`` the ``ep`` group is the
        ``ep / tp`` x ``tp`` block of consecutive ranks (expert TP 1) and ``edp`` the dense data-parallel group;
        the ``cp`` group is the ``cp`` ranks ``tp`` apart; ``edp`` takes every CP rank (:attr:`dense_shard_dp`);
        with ``cp > 1`` an ``ep`` group spans CP ranks (:meth:`_ep_group_across_cp`)."""
        g = self.grid
        if kind == "ep" and self.cp > 1:
            return self._ep_group_across_cp(pp_i, dp_i, ep_i, tp_i)
        if kind == "cp":
            return [g.rank(pp_i, dp_i, ep_i, c * self.tp + tp_i) for c in range(self.cp)]
        if kind == "tp" and self.cp > 1:
            return [g.rank(pp_i, dp_i, ep_i, t) for t in range(self.tp)]
        if kind == "ep" and self.ep_spans_tp:
            return sorted(r for t in range(self.tp) for r in g.group_ranks("ep", pp_i, dp_i, ep_i, t))
        if kind == "edp" and self.cp > 1:
            return sorted(r for c in range(self.cp) for r in g.group_ranks("edp", pp_i, dp_i, ep_i, c * self.tp + tp_i))
        return g.group_ranks(kind, pp_i, dp_i, ep_i, tp_i)

    def _ep_group_across_cp(self, pp_i: int, dp_i: int, ep_i: int, tp_i: int) -> list[int]:
        """The EP group of a coordinate (CP index 0) when ``cp > 1``: as Megatron-Core's expert grid carves EP groups
        from the ``tp x cp x dp`` ranks of a stage (``megatron/core/parallel_state.py``, expert order ``tp-ep-dp-pp``
        with expert TP 1), the ``ep x cp`` candidate ranks of the coordinate's ``dp`` index (its TP rank only, or every
        TP rank with ``ep_spans_tp``) in rank order, cut into ``cp`` groups of ``ep``: an EP group takes CP ranks
        first. With ``tp = 1`` the group of rank 0 is ranks ``0 .. ep-1``."""
        g = self.grid
        tps = range(self.tp) if self.ep_spans_tp else (tp_i,)
        ranks = sorted(g.rank(pp_i, dp_i, e, c * self.tp + t) for e in range(g.ep) for c in range(self.cp) for t in tps)
        block = ranks.index(g.rank(pp_i, dp_i, ep_i, tp_i)) // self.ep
        return ranks[block * self.ep:(block + 1) * self.ep]

    def ep_span_text(self) -> str:
        """What one EP group is made of when it spans the TP ranks (``ep_spans_tp``): ``"TP 2 x DP 16"``,
        ``"TP 4 x CP 2"`` or ``"TP 2 x CP 2 x DP 2"``: the ``ep / tp`` ranks beyond a TP group are CP ranks first,
        then data-parallel ones, as Megatron-Core's expert grid (order ``tp-ep-dp`` over ranks ordered
        ``tp-cp-dp``) and :meth:`group_ranks` take them."""
        rest = self.ep // self.tp
        cp_part = math.gcd(rest, self.cp)
        dp_part = rest // cp_part
        parts = [f"TP {self.tp}", f"CP {cp_part}" if cp_part > 1 else "", f"DP {dp_part}" if dp_part > 1 else ""]
        return " x ".join(x for x in parts if x)

    def ep_link_ranks(self) -> list[int]:
        """Ranks of the first EP group as the links see them: :meth:`group_ranks` (``ep_placement = grid``) or the
        ``ep`` consecutive ranks ``0 .. ep-1`` (``contiguous``, Megatron-Core's expert grid with expert TP 1)."""
        if self.ep_placement == "contiguous" or self.ep_spans_tp:
            return list(range(self.ep))
        return self.group_ranks("ep")


def cluster_for(parallel: ParallelConfig, gpu: str | GPUSpec = "H200", memory_reserve_gib: float | None = None
                ) -> Cluster:
    """The smallest cluster of the GPU's NVLink domains (8 GPUs a DGX/HGX node, 72 a GB200 NVL72 rack) that holds
    ``parallel.world_size`` ranks (``memory_reserve_gib``: :attr:`Cluster.memory_reserve_gib`)."""
    spec = gpu if isinstance(gpu, GPUSpec) else GPUSpec.named(gpu)
    nodes = max(1, -(-parallel.world_size // spec.nvlink_domain))
    return Cluster.dgx(spec, nodes, memory_reserve_gib)


def check_fits(parallel: ParallelConfig, cluster: Cluster) -> None:
    """Raise ConfigError if the parallel sizes need more GPUs than the cluster has."""
    if parallel.world_size > cluster.num_gpus:
        sizes = ("pp*dp*ep" if parallel.ep_spans_tp else "pp*dp*ep*tp") + ("*cp" if parallel.cp > 1 else "")
        raise ConfigError(f"field 'world_size' = {sizes} = {parallel.world_size} exceeds the cluster's "
                          f"{cluster.num_gpus} GPUs; allowed: at most {cluster.num_gpus}")


def layout_text(p: "ParallelConfig", moe: bool = True) -> str:
    """``pp=8 ep=8 tp=1 dp=1 (64 GPUs), Megatron DP 8, 8 pipelines' micro-batches per iteration (1,048,576 tokens)`` (each
    data-parallel replica of a stage, Megatron's DP, runs its own micro-batches); with ``ep_spans_tp`` the world, the dense and the expert data-parallel
    sizes spelled out, so that pp x dp x ep x tp is not read as the world size. A model without routed experts
    (``moe`` false) has no EP group: ``pp=8 tp=1 dp=8 (64 GPUs; no MoE, ep 8 counts as data-parallel replicas)``,
    dp being the dense data-parallel size (:attr:`~tessera_lab.model.hardware.ParallelConfig.dense_dp`)."""
    vpp = f" vpp={p.vpp}" if p.vpp > 1 else ""
    vpp += f" cp={p.cp}" if p.cp > 1 else ""
    pipes = p.dense_dp
    per_iter = (f", {pipes} pipelines' micro-batches per iteration" if pipes != 1
                else ", 1 pipeline's micro-batches per iteration") + f" ({p.tokens_per_iteration:,} tokens)"
    if moe and not p.ep_spans_tp:  # the pipelines are the stage's data-parallel replicas, ep x dp: Megatron's DP
        per_iter = f", Megatron DP {pipes}" + per_iter
    if not moe:
        as_dp = f", ep {p.ep} counts as data-parallel replicas" if p.ep > 1 else ""
        return f"pp={p.pp} tp={p.tp} dp={p.dense_dp}{vpp} ({p.world_size} GPUs; no MoE{as_dp}){per_iter}"
    if not p.ep_spans_tp:
        return f"pp={p.pp} ep={p.ep} tp={p.tp} dp={p.dp}{vpp} ({p.world_size} GPUs){per_iter}"
    return (f"pp={p.pp} x {p.world_size // p.pp} GPUs per stage = {p.world_size} GPUs{vpp}; EP spans TP: each "
            f"stage's EP group of {p.ep} = {p.ep_span_text()} (expert TP 1, expert DP {p.expert_dp}); dense part TP "
            f"{p.tp} with sequence parallelism x DP {p.dense_dp}, so {p.dense_dp} pipelines' micro-batches per "
            f"iteration ({p.tokens_per_iteration:,} tokens)")


VPP_RULE = "virtual pipeline stages when pp > 1"  # the rule this project's one-chunk `overlapped` does not keep


def overlap_rule_breaks(lay: Any) -> list[str]:
    """The rules of Megatron-Core's ``TransformerConfig.__post_init__`` for ``overlap_moe_expert_parallel_comm``
    (the EP-overlap schedules) that ``lay`` breaks (NVIDIA/Megatron-LM ``transformer_config.py`` at d2c5e8b4): expert
    parallelism > 1, no full recomputation, no ``moe`` recompute module, and virtual pipeline stages when pp > 1
    (:data:`VPP_RULE`; its dispatcher rule, alltoall or flex, holds for both dispatchers). Empty when it runs."""
    mods = selective_modules(lay.recompute, getattr(lay, "recompute_modules", None) or ())
    rules = [(lay.ep <= 1, "expert parallelism > 1"), (lay.recompute == "full", "a recompute granularity other than full"),
             ("moe" in mods, "no moe recompute module"), (lay.pp > 1 and lay.vpp <= 1, VPP_RULE)]
    return [why for bad, why in rules if bad]


def gpu_step(nvlink_domain: int) -> int:
    """The GPU counts the search accepts are the multiples of this: the GPUs of an 8-GPU node (``hardware.json``'s
    ``node.gpus_per_node``) where the NVLink domain is one node (H100, H200, B200, B300), and on a rack-scale domain
    (GB200 NVL72: 72 GPUs) the same 8-GPU steps, the last rack partial as ``plan`` places it
    (:func:`tessera_lab.plan.search.search_cluster`): ``gcd(nvlink_domain, 8)``."""
    return math.gcd(int(nvlink_domain), int(hardware_data()["node"]["gpus_per_node"]))


def gpu_count_ok(gpus: int, nvlink_domain: int) -> bool:
    """Whether the search accepts ``gpus``: a multiple of :func:`gpu_step`, or a count dividing it (1, 2 or 4 GPUs:
    part of one node, a workstation, placed on one node as ``plan`` places it)."""
    step = gpu_step(nvlink_domain)
    return gpus >= 1 and (gpus % step == 0 or step % gpus == 0)


def dp_for_gpus(gpus: int | None, dp: int | None, per_replica: int, sizes: str = "", hint: str = "") -> int:
    """Data-parallel replicas: ``gpus / per_replica`` when ``gpus`` is given (``per_replica``: the GPUs of one
    replica, pp x ep x tp x cp with tp once when EP spans it, :attr:`ParallelConfig.world_size` at dp 1), else ``dp``
    (1 when not given). ``sizes``: those sizes as the caller's options set them (``"pp 8 x ep 8"``), named in the
    refusal; ``hint``: appended to it (``"; ..."``).

    Raises:
        ConfigError: ``gpus`` not a multiple of ``per_replica``, or ``dp`` given and ``dp x per_replica != gpus``.
    """
    if gpus is None:
        return dp or 1
    if gpus % per_replica:
        lo = per_replica
        made = f"{sizes} = {lo}" if sizes else "pp x ep x tp x cp, tp once when EP spans it"
        search = (f" (tessera-lab search --gpus {gpus} lists layouts of {gpus} GPUs)"
                  if gpu_count_ok(gpus, int(hardware_data()["node"]["gpus_per_node"])) else "")
        raise ConfigError(f"--gpus = {gpus} is not a multiple of the {lo} GPUs of one data-parallel replica ({made}); "
                          f"allowed: {lo}, {2 * lo}, {3 * lo}, ..., or --pp/--ep/--tp/--cp whose product divides "
                          f"{gpus}{search}{hint}")
    if dp is not None and dp * per_replica != gpus:
        raise ConfigError(f"--dp = {dp} gives {dp * per_replica} GPUs, not --gpus = {gpus}; allowed: --dp "
                          f"{gpus // per_replica}, or leave --dp out (--gpus sets it)")
    return gpus // per_replica
