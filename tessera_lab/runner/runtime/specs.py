"""Run specifications (torch-free, so the spawner can validate a job before any process starts).

:class:`TinyConfig` (size knobs of the runner's tiny model), :class:`WorldSpec` (the ``pp x ep x dp`` grid and
its timeouts), :class:`RunSpec` (one training job) and :class:`RunnerError`. Bad values raise
:class:`~tessera_lab.errors.ConfigError` naming the field and the allowed range.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from tessera_lab.errors import ConfigError, TesseraError
from tessera_lab.pipeline.passes import split_backward
from tessera_lab.pipeline.schedules import Schedule, build_schedule, canonical_name

from .orders import resolve_order
from .pairs import get_pair_handler

__all__ = ["TinyConfig", "WorldSpec", "RunSpec", "RunnerError"]

_MAX_WORLD = 64


class RunnerError(TesseraError, RuntimeError):
    """A runner process failed or timed out.

    Attributes:
        exit_codes: global rank -> exit status (negative: killed by that signal; None: never started).
        logs: global rank -> path of that rank's log file.
        pids: global rank -> process id (all reaped when the error is raised).
        peer_failed / failed_rank / cause / detected_at: set by the spawner when a rank failed and its peers
            were shut down (the root-cause rank, how it failed, wall-clock time of detection).
    """

    peer_failed: bool = False
    failed_rank: int | None = None
    cause: str | None = None
    detected_at: float | None = None

    def __init__(self, message: str, exit_codes: dict[int, int | None] | None = None,
                 logs: dict[int, str] | None = None, pids: dict[int, int] | None = None):
        super().__init__(message)
        self.exit_codes = dict(exit_codes or {})
        self.logs = dict(logs or {})
        self.pids = dict(pids or {})


def _int_field(where: str, name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{where} field '{name}' = {value!r} is out of range; allowed: an integer >= {low}")
    return value


# ----------------------------------------------------------------------------------------------
# specs
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TinyConfig:
    """Size knobs of the tiny model (the defaults train a step in a fraction of a second on 2 CPU cores).

    Attributes:
        vocab_size: V tokens.
        hidden_size: H.
        num_layers: decoder layers.
        attention_ratio: linear-attention layers per full-attention layer (3 in Qwen3-Next; 0: all full).
        num_heads: attention heads (both mixers); head_dim: per-head width.
        num_kv_heads: key/value heads of full attention (GQA; divides ``num_heads``).
        num_experts: routed experts E; top_k: experts per token.
        expert_width: routed expert intermediate size; shared_expert_width: shared expert intermediate size
            (0: no shared expert).
        seq_len: tokens per sequence T.
        linear_chunk: chunk length of the chunked delta rule.
        capacity_factor: per-expert capacity factor (None: no drops).
        ep_dispatch: how EP dispatch sizes its all-to-alls (:mod:`tessera_lab.runner.runtime.moe`):
            ``"uneven"`` (exact splits from a count exchange read on the host), ``"capacity"`` (fixed
            per-destination capacity, indices built on the device, counts sent with the data: no host read) or
            ``"auto"`` (capacity on CUDA while padding costs at most 4x the routed expert rows, else uneven;
            uneven on CPU). The single-process reference pads its expert GEMMs as a
            capacity dispatch does, so both modes stay bitwise comparable.
        router_bias: optional fixed logit offsets (not trained): ``[E]`` for every layer or ``[layers][E]``
            per layer (``run --routing``), e.g. to force skewed routing or leave an EP rank without tokens.
        seed: initialisation seed.
    """

    vocab_size: int = 64
    hidden_size: int = 32
    num_layers: int = 4
    attention_ratio: int = 1
    num_heads: int = 2
    head_dim: int = 16
    num_kv_heads: int = 1
    num_experts: int = 4
    top_k: int = 2
    expert_width: int = 16
    shared_expert_width: int = 32
    seq_len: int = 16
    linear_chunk: int = 8
    capacity_factor: float | None = None
    ep_dispatch: str = "auto"
    router_bias: tuple[float, ...] | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        ints = {
            "vocab_size": 2, "hidden_size": 1, "num_layers": 1, "attention_ratio": 0, "num_heads": 1,
            "head_dim": 1, "num_kv_heads": 1, "num_experts": 1, "top_k": 1, "expert_width": 1,
            "shared_expert_width": 0, "seq_len": 1, "linear_chunk": 1,
        }
        for name, low in ints.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ConfigError(f"model field '{name}' = {v!r} is out of range; allowed: an integer >= {low}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"model field 'num_kv_heads' = {self.num_kv_heads} must divide num_heads = {self.num_heads}")
        if self.top_k > self.num_experts:
            raise ConfigError(
                f"model field 'top_k' = {self.top_k} is out of range; allowed: 1..num_experts ({self.num_experts})")
        cf = self.capacity_factor
        if cf is not None and (isinstance(cf, bool) or not isinstance(cf, (int, float)) or not math.isfinite(cf)
                               or not cf > 0):
            raise ConfigError(
                f"model field 'capacity_factor' = {cf} is out of range; allowed: a finite number > 0, or None")
        if self.ep_dispatch not in ("auto", "uneven", "capacity"):
            raise ConfigError(f"model field 'ep_dispatch' = {self.ep_dispatch!r} is unknown; allowed: auto, uneven, "
                              "capacity")
        if self.router_bias is not None:
            rb = self.router_bias
            per_layer = len(rb) > 0 and isinstance(rb[0], (list, tuple))
            rows = rb if per_layer else [rb]
            if (per_layer and len(rb) != self.num_layers) or any(len(r) != self.num_experts for r in rows):
                raise ConfigError(
                    f"model field 'router_bias' has shape {[len(r) for r in rows]}; allowed: num_experts "
                    f"({self.num_experts}) floats, or num_layers ({self.num_layers}) rows of num_experts floats")
            norm = tuple(tuple(float(x) for x in r) for r in rb) if per_layer else tuple(float(x) for x in rb)
            object.__setattr__(self, "router_bias", norm)

    def layer_kinds(self) -> list[str]:
        """Mixer of each layer: ``"linear_attention"`` or ``"full_attention"``."""
        r = self.attention_ratio + 1
        return ["full_attention" if (i + 1) % r == 0 else "linear_attention" for i in range(self.num_layers)]

    def with_changes(self, **changes) -> "TinyConfig":
        """A copy with some fields changed (validated)."""
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise ConfigError(f"unknown model field(s) {sorted(unknown)}; allowed: {[f.name for f in fields(self)]}")
        d = asdict(self)
        d.update(changes)
        return TinyConfig(**d)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if d["ep_dispatch"] == "auto":  # the default is omitted: stored configs without the field read the same
            del d["ep_dispatch"]
        if d["router_bias"] is not None:
            d["router_bias"] = _bias_lists(d["router_bias"])
        return d

    def to_hf_config(self, name: str = "tiny-runner") -> dict[str, Any]:
        """This config as a Qwen3-Next ``config.json`` dict that :class:`~tessera_lab.model.spec.ModelSpec`
        loads (the planner plans what the runner runs). Runner-only fields (sequence length, chunk, seed,
        capacity factor, router bias) go under ``"tessera_runner"``. The runner has no short convolution, so
        ``linear_conv_kernel_dim`` is 1, and one head count serves q/k and v of linear attention."""
        return {
            "_source": f"tessera-lab runner model {name} (runner/runtime/specs.py TinyConfig.to_hf_config)",
            "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
            "vocab_size": self.vocab_size, "hidden_size": self.hidden_size, "num_hidden_layers": self.num_layers,
            "full_attention_interval": self.attention_ratio + 1, "layer_types": self.layer_kinds(),
            "num_attention_heads": self.num_heads, "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim, "attention_bias": False,
            "linear_num_key_heads": self.num_heads, "linear_num_value_heads": self.num_heads,
            "linear_key_head_dim": self.head_dim, "linear_value_head_dim": self.head_dim,
            "linear_conv_kernel_dim": 1, "intermediate_size": 0, "moe_intermediate_size": self.expert_width,
            "shared_expert_intermediate_size": self.shared_expert_width, "num_experts": self.num_experts,
            "num_experts_per_tok": self.top_k, "norm_topk_prob": True, "decoder_sparse_step": 1,
            "mlp_only_layers": [], "hidden_act": "silu", "rms_norm_eps": 1e-06, "tie_word_embeddings": False,
            "max_position_embeddings": self.seq_len,
            "tessera_runner": {"seq_len": self.seq_len, "linear_chunk": self.linear_chunk, "seed": self.seed,
                               "capacity_factor": self.capacity_factor,
                               "router_bias": _bias_lists(self.router_bias) if self.router_bias is not None else None},
        }

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> "TinyConfig":
        """Inverse of :meth:`to_hf_config` (a ``config.json`` dict with a ``"tessera_runner"`` block): the config is
        read by :class:`~tessera_lab.model.spec.ModelSpec` (the one reader of Hugging Face configs), then
        :meth:`from_model_spec`.

        Raises:
            ConfigError: the dict is not a runner model (no ``tessera_runner`` block, a config ``ModelSpec``
                refuses, or q/k and v head counts or sizes that the runner cannot build).
        """
        from tessera_lab.model.spec import ModelSpec

        if not isinstance(cfg.get("tessera_runner"), dict):
            raise ConfigError("model config has no field 'tessera_runner'; the runner runs only its tiny models "
                              "(data/models/tiny-*.json)")
        return cls.from_model_spec(ModelSpec.from_hf_config(cfg))

    @classmethod
    def from_model_spec(cls, spec: Any) -> "TinyConfig":
        """The runner's model of a :class:`~tessera_lab.model.spec.ModelSpec` read from a runner config (its
        ``tessera_runner`` block gives sequence length, chunk, seed, capacity factor and router bias).

        Raises:
            ConfigError: no ``tessera_runner`` block, or linear-attention head counts or sizes other than the
                full-attention ones (the runner uses one head count and size for both mixers).
        """
        extra = spec.raw.get("tessera_runner")
        if not isinstance(extra, dict):
            raise ConfigError("model config has no field 'tessera_runner'; the runner runs only its tiny models "
                              "(data/models/tiny-*.json)")
        if (spec.linear.linear_num_key_heads != spec.attention.num_attention_heads
                or spec.linear.linear_num_value_heads != spec.attention.num_attention_heads
                or spec.linear.linear_key_head_dim != spec.attention.head_dim or spec.linear.linear_value_head_dim != spec.attention.head_dim):
            raise ConfigError("runner model: linear-attention head counts and sizes must equal the full-attention "
                              "ones (fields 'linear_num_key_heads', 'linear_key_head_dim', ...)")
        d = {"vocab_size": spec.vocab.vocab_size, "hidden_size": spec.hidden_size, "num_layers": spec.num_decoder_layers,
             "attention_ratio": spec.attention_ratio, "num_heads": spec.attention.num_attention_heads,
             "head_dim": spec.attention.head_dim, "num_kv_heads": spec.attention.num_key_value_heads, "num_experts": spec.moe.num_experts,
             "top_k": spec.moe.num_experts_per_tok, "expert_width": spec.moe.moe_intermediate_size,
             "shared_expert_width": spec.moe.shared_expert_intermediate_size}
        d.update({k: v for k, v in extra.items() if k in ("seq_len", "linear_chunk", "seed", "capacity_factor",
                                                          "router_bias")})
        return cls.from_dict(d)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TinyConfig":
        d = dict(d)
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise ConfigError(f"unknown model field(s) {sorted(unknown)}; allowed: {[f.name for f in fields(cls)]}")
        if d.get("router_bias") is not None:
            d["router_bias"] = tuple(d["router_bias"])
        return cls(**d)


def _bias_lists(rb) -> list:
    """``router_bias`` as (nested) lists for JSON."""
    return [list(r) if isinstance(r, (list, tuple)) else r for r in rb]


@dataclass
class WorldSpec:
    """The process grid and its limits.

    Attributes:
        pp, ep, dp: pipeline, expert and data parallel sizes (world size ``pp * ep * dp``).
        backend: ``"auto"`` (NCCL with CUDA, else gloo), ``"gloo"`` or ``"nccl"``.
        timeout_s: seconds a collective or p2p operation may wait before it fails.
        grace_s: after one rank fails, seconds the others get to exit on their own before being killed.
        interleave: run the launch's jobs a step of each in turn (:func:`tessera_lab.runner.runtime.train.run_jobs`)
            instead of one after the other.
        p2p: pipeline transfers (:mod:`tessera_lab.runner.runtime.transport`): ``batch`` (``batch_isend_irecv``,
            one Work per batch; on gloo through the CPU layer :mod:`~tessera_lab.runner.runtime.nccl_cpu`),
            ``nccl-order`` (gloo only: the same with a key check per transfer) or ``auto`` (nccl-order on gloo,
            batch on NCCL).
    """

    pp: int = 2
    ep: int = 2
    dp: int = 1
    backend: str = "auto"
    timeout_s: float = 60.0
    grace_s: float = 1.0
    interleave: bool = False
    p2p: str = "auto"

    def __post_init__(self) -> None:
        if self.p2p not in ("auto", "nccl-order", "batch"):
            raise ConfigError(f"run field 'p2p' = {self.p2p!r} is unknown; allowed: auto, nccl-order, batch")
        if self.p2p == "nccl-order" and self.backend == "nccl":
            raise ConfigError("run field 'p2p' = 'nccl-order' is the CPU layer with NCCL's semantics; allowed with "
                              "backend gloo only (on NCCL use batch or auto)")
        for name in ("pp", "ep", "dp"):
            _int_field("run", name, getattr(self, name), 1)
        if self.world_size > _MAX_WORLD:
            raise ConfigError(f"run: pp x ep x dp = {self.world_size} is out of range; allowed: <= {_MAX_WORLD}")
        if self.backend not in ("auto", "gloo", "nccl"):
            raise ConfigError(f"run field 'backend' = {self.backend!r} is unknown; allowed: auto, gloo, nccl")
        if not self.timeout_s > 0 or not self.grace_s >= 0:
            raise ConfigError("run fields 'timeout_s' (> 0) and 'grace_s' (>= 0) are out of range")

    @property
    def world_size(self) -> int:
        return self.pp * self.ep * self.dp

    def check_world_size(self, world_size: int) -> None:
        """Raise :class:`ConfigError` unless ``world_size == pp * ep * dp`` (call before any collective)."""
        if world_size != self.world_size:
            raise ConfigError(
                f"world size {world_size} does not equal pp x ep x dp = {self.pp} x {self.ep} x {self.dp} = "
                f"{self.world_size}; launch {self.world_size} processes (torchrun --nproc-per-node) or change "
                "--pp/--ep/--dp")


@dataclass
class RunSpec:
    """One training job on the world (several jobs can share one launch).

    Attributes:
        name: label (results and gradient files use it).
        model: model config as a dict of :class:`TinyConfig` fields (defaults for the rest).
        schedule: ``gpipe|1f1b|interleaved|zb-h1|zb-h2|dualpipev|overlapped``.
        vpp: chunks per rank (None: 2 for interleaved / DualPipeV, else 1).
        microbatches: m per step; micro_batch_size: sequences per micro-batch per replica.
        steps: optimizer steps; lr: AdamW learning rate; data_seed: seed of :func:`~tessera_lab.runner.runtime.model.
            make_batch`.
        boundaries: stage boundaries (a plan's ``boundaries``); None: uniform.
        defer_w: split every backward into I now and W later (:func:`tessera_lab.pipeline.passes.split_backward`); w_lag: see there.
        deterministic: one intra-op thread and deterministic algorithms (bitwise reproducible on CPU).
        grad_sync: ``"ordered"`` (deterministic replica sum) or ``"allreduce"``.
        pair_exec: how the two halves of an overlapped pair run: a pair handler of
            :mod:`tessera_lab.runner.runtime.pairs` (``serial``, ``threads``, ``scheduled``, or one registered
            later); None: :func:`~tessera_lab.runner.runtime.pairs.default_pair_exec` (``scheduled`` on CUDA for a
            schedule with pairs, else ``threads``).
        pair_order: issue order of the ``scheduled`` handler: ``"searched"`` / None, a name of
            :data:`tessera_lab.runner.runtime.orders.NAMED_ORDERS` (``program``, ``megatron``, ``comm-first``) or a list
            of the ten template keys.
        save_grads: write each rank's step-0 gradients (tests).
        check_reference: rank 0 also runs the single-process reference and reports the comparison.
        fault: ``{"rank": r, "step": s, "action": k}`` raises on rank r before its k-th action of step s.
        gaps: ``"fill"``: dynamic W filling (:mod:`tessera_lab.runner.runtime.gaps`; W deferred to the end of each rank's
            list and pulled into receive waits by the rank's controller; needs ``defer_w``); ``"observe"``: only
            record the waits and predictions (the static side of ``run --dynamic``); None: neither.
        w_cap: with ``gaps="fill"``, deferred micro-batches a rank may hold before a forward (None: ``pp``).
        plan_prediction: the runner plan's prediction (``predicted_s``, ``stage_f_s``, ``stage_b_s``, ``costs``),
            made before the run; the result then reports it against the observation (``plan_vs_observed``).
    """

    name: str = "job"
    model: dict = field(default_factory=dict)
    schedule: str = "1f1b"
    vpp: int | None = None
    microbatches: int = 4
    micro_batch_size: int = 2
    steps: int = 3
    lr: float = 1e-2
    data_seed: int = 1234
    boundaries: list[int] | None = None
    defer_w: bool = False
    w_lag: int | None = None
    deterministic: bool = True
    grad_sync: str = "ordered"
    pair_exec: str | None = None
    pair_order: Any = None
    gaps: str | None = None
    w_cap: int | None = None
    plan_prediction: dict | None = None
    save_grads: bool = False
    check_reference: bool = False
    fault: dict | None = None

    def __post_init__(self) -> None:
        self.schedule = canonical_name(self.schedule)
        if self.vpp is None:
            self.vpp = 2 if self.schedule in ("interleaved", "dualpipev") else 1

    @property
    def model_config(self) -> TinyConfig:
        """The job's :class:`TinyConfig` (validated)."""
        return TinyConfig.from_dict(self.model)

    def build_schedule(self, pp: int) -> Schedule:
        """The schedule for ``pp`` ranks (with W deferral if ``defer_w``)."""
        sched = build_schedule(self.schedule, pp, self.microbatches, self.vpp)
        return split_backward(sched, self.w_lag) if self.defer_w else sched

    def _check_pair_order_used(self, sched: Schedule, w: str) -> None:
        """A ``pair_order`` is read only by the ``scheduled`` handler on overlapped pairs: refuse it elsewhere
        (it would be ignored)."""
        if self.pair_order is None or self.pair_order == "searched":
            return
        from tessera_lab.pipeline.actions import ActionType

        pairs = any(a.type is ActionType.OVERLAP_F_B for acts in sched.actions.values() for a in acts)
        if self.pair_exec != "scheduled" or not pairs:
            why = (f"schedule {self.schedule!r} has no overlapped pairs" if not pairs else
                   f"field 'pair_exec' = {self.pair_exec!r} does not read it")
            raise ConfigError(f"{w} field 'pair_order' = {self.pair_order!r} would be ignored: {why}; allowed: "
                              "with pair_exec 'scheduled' (--pair-exec scheduled) and a schedule with overlapped "
                              "pairs (overlapped, dualpipev)")

    def validate(self, world: WorldSpec) -> Schedule:
        """Check the job against the world without torch; returns its schedule.

        Raises:
            ConfigError / ScheduleError: naming the field and the allowed range.
        """
        w = f"job {self.name!r}"
        for name in ("microbatches", "micro_batch_size", "steps"):
            _int_field(w, name, getattr(self, name), 1)
        if not (isinstance(self.lr, (int, float)) and self.lr > 0 and math.isfinite(self.lr)):
            raise ConfigError(f"{w} field 'lr' = {self.lr!r} is out of range; allowed: a finite number > 0")
        if self.grad_sync not in ("ordered", "allreduce"):
            raise ConfigError(f"{w} field 'grad_sync' = {self.grad_sync!r} is unknown; allowed: ordered, allreduce")
        if self.w_lag is not None:
            _int_field(w, "w_lag", self.w_lag, 0)
        if self.gaps not in (None, "fill", "observe"):
            raise ConfigError(f"{w} field 'gaps' = {self.gaps!r} is unknown; allowed: fill, observe, None")
        if self.gaps == "fill" and not self.defer_w:
            raise ConfigError(f"{w} field 'gaps' = 'fill' needs defer_w (W split from the backward)")
        if self.w_cap is not None:
            _int_field(w, "w_cap", self.w_cap, 1)
        if self.pair_exec is not None:
            get_pair_handler(self.pair_exec)
        resolve_order(self.pair_order, world.ep)
        from .schemas import check_runner_work

        check_runner_work(self.model_config, world.pp, self.vpp or 1, self.microbatches, self.micro_batch_size,
                          where=w)  # before the schedule is built: its size grows with pp x vpp x microbatches
        sched = self.build_schedule(world.pp)
        self._check_pair_order_used(sched, w)
        cfg = self.model_config
        layers, experts = cfg.num_layers, cfg.num_experts
        if experts % world.ep:
            raise ConfigError(f"{w}: model field 'num_experts' = {experts} must be a multiple of ep = {world.ep}")
        if layers < sched.num_stages:
            raise ConfigError(
                f"{w}: model field 'num_layers' = {layers} is out of range; allowed: >= the number of stages "
                f"({sched.num_stages} = pp x vpp)")
        if self.boundaries is not None:
            b = list(self.boundaries)
            if (len(b) != sched.num_stages + 1 or b[0] != 0 or b[-1] != layers
                    or any(b[s + 1] <= b[s] for s in range(sched.num_stages))):
                per_rank = sched.num_stages // max(1, world.pp)
                raise ConfigError(
                    f"{w}: plan field 'boundaries' = {b} is not allowed; need {sched.num_stages + 1} strictly "
                    f"increasing layer indices from 0 to num_layers = {layers}: the run has {sched.num_stages} "
                    f"stages (pp {world.pp} x {per_rank} per rank), the plan {len(b) - 1}"
                    + (f" (run it with --pp {(len(b) - 1) // per_rank})" if len(b) - 1 != sched.num_stages
                       and (len(b) - 1) % per_rank == 0 else ""))
        if self.fault is not None and not isinstance(self.fault, dict):
            raise ConfigError(f"{w} field 'fault' must be a dict with rank, step, action")
        return sched

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunSpec":
        """The job of a dict of its fields.

        Raises:
            ConfigError: a field that is not one of the job's (``overlap`` names its replacement, ``pair_exec``).
        """
        if "overlap" in d:
            raise ConfigError(f"job field 'overlap' = {d['overlap']!r} is replaced by 'pair_exec'; allowed: "
                              "pair_exec 'threads' (for overlap 'thread'), 'serial' or 'scheduled'")
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise ConfigError(f"unknown job field(s) {sorted(unknown)}; allowed: {[f.name for f in fields(cls)]}")
        return cls(**d)


