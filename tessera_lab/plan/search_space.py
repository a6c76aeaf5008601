"""The layouts the search (:mod:`tessera_lab.plan.search`) tries (:class:`Layout`, :func:`enumerate_layouts`) and
the sizes per dimension: TP (:func:`tp_choices`), CP (:func:`cp_choices`), recompute (:func:`recompute_choices`),
each by Megatron-Core's rules as ``plan`` checks them, and the EP-overlap rules of Megatron-Core's
``TransformerConfig`` (:func:`overlap_rule_breaks`) (docs/search.md, "What is enumerated"); the parameter state of a
layout (:func:`param_memory_bytes`), the GPU counts searched (:func:`gpu_step`) and the fewest that hold a model's
parameter state (:func:`fewest_gpus`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from tessera_lab.errors import ConfigError, TooFewGPUsError
from tessera_lab.model.hardware import (ParallelConfig, gpu_count_ok, gpu_step,  # noqa: F401  (re-exported)
                                        overlap_rule_breaks)
from tessera_lab.model.spec import ModelSpec
from tessera_lab.plan.make import VIRTUAL_SCHEDULES

#: context parallelism is tried only where each CP rank keeps at least this many tokens of a sequence (the search's
#: limit: below it the per-rank attention is short and the KV exchange is not hidden; ``plan --cp`` takes any size)
CP_MIN_TOKENS = 4096


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def tp_choices(model: ModelSpec, gpus_per_node: int) -> list[int]:
    """TP sizes Megatron can run: divisors of every attention, key-value and linear-attention head count and of
    the GPUs of a node (the rule of :func:`tessera_lab.plan.make.check_parallel_for_model`)."""
    heads = [model.attention.num_attention_heads, model.attention.num_key_value_heads] + (
        [model.linear.linear_num_key_heads] if model.linear.linear_num_key_heads else [])
    return _divisors(math.gcd(gpus_per_node, *heads))


def cp_choices(model: ModelSpec, seq_len: int, tp: int) -> list[int]:
    """CP sizes the search tries with ``tp``: powers of two that Megatron-Core can run (``seq_len`` a multiple of
    ``2 cp``; the heads of every head-sharded mixer per TP rank a multiple of ``cp``,
    :func:`tessera_lab.model.context_parallel.check_heads`) and at least :data:`CP_MIN_TOKENS` tokens of a sequence
    per CP rank (the search's limit, docs/search.md). The CP group may span NVLink domains (its ring then crosses
    the NIC), as Megatron-Core runs it (the Megatron-MoE-ModelZoo's Qwen3-235B-A22B long-context runs: TP 4 x CP 4
    and TP 4 x CP 8 on nodes of 8)."""
    from tessera_lab.model.context_parallel import check_heads

    out, cp = [], 1
    while seq_len % (2 * cp if cp > 1 else 1) == 0 and (cp == 1 or seq_len // cp >= CP_MIN_TOKENS):
        try:
            for attention in {layer.attention for layer in model.stack.layers}:
                check_heads(model, attention, tp, cp)
            out.append(cp)
        except ConfigError:
            pass
        cp *= 2
    return out


#: one-chunk schedules the search tries at pp > 1 (``gpipe`` holds every micro-batch: never faster than 1F1B at more
#: memory; ``zb-auto`` runs a schedule search per plan; ``overlapped`` needs virtual stages in Megatron-Core at
#: pp > 1, so it is tried at pp 1 only, beside ``1f1b``)
SEARCH_SCHEDULES = ("1f1b", "zb-h1", "zb-h2")
#: virtual stages per rank tried with the interleaved schedules
SEARCH_VPP = (2, 3, 4)
SEARCH_RECOMPUTE = ("none", "selective", "full")
#: Megatron ``--recompute-modules`` sets tried with ``recompute = selective`` besides the default set (attention
#: core and routed-expert activations, SELECTIVE_DEFAULT_MODULES), each where the model has every module
#: (:func:`recompute_choices`): the norms with the routed-expert activations (Megatron-MoE-ModelZoo's Qwen3 recipes), plus the shared expert, plus MLA's up
#: projections
SEARCH_RECOMPUTE_MODULES = (("layernorm", "moe_act"), ("layernorm", "moe_act", "shared_experts"),
                            ("layernorm", "mla_up_proj", "moe_act"))
SEARCH_DISPATCHERS = ("alltoall", "deepep")
SEARCH_MICRO_BATCH_SIZES = (1, 2, 4)


@dataclass(frozen=True, order=True)
class Layout:
    """One parallel layout (sizes as :class:`~tessera_lab.model.hardware.ParallelConfig` counts them)."""

    pp: int
    vpp: int
    ep: int
    tp: int
    dp: int
    microbatches: int
    micro_batch_size: int
    schedule: str
    recompute: str
    dispatcher: str
    ep_spans_tp: bool = False
    cp: int = 1
    #: Megatron ``--recompute-modules`` with ``recompute = selective`` (empty: SELECTIVE_DEFAULT_MODULES, core_attn
    #: and moe_act)
    recompute_modules: tuple[str, ...] = ()
    #: Megatron FSDP instead of the distributed optimizer
    fsdp: bool = False

    def parallel(self, seq_len: int) -> ParallelConfig:
        """The :class:`ParallelConfig` of this layout at ``seq_len`` tokens per sequence."""
        return ParallelConfig(pp=self.pp, vpp=self.vpp, ep=self.ep, tp=self.tp, dp=self.dp,
                              microbatches=self.microbatches, micro_batch_size=self.micro_batch_size,
                              seq_len=seq_len, schedule=self.schedule, recompute=self.recompute,
                              dispatcher=self.dispatcher, ep_spans_tp=self.ep_spans_tp, cp=self.cp,
                              recompute_modules=self.recompute_modules, fsdp=self.fsdp)

    @property
    def megatron_dp(self) -> int:
        """Megatron's data-parallel size: GPUs / (TP x CP x PP) (``dp`` here counts the replicas of one EP group,
        as :class:`ParallelConfig` does: GPUs = PP x DP x EP x TP x CP, TP counted once when EP spans it)."""
        return self.ep * self.dp // (self.tp if self.ep_spans_tp else 1)

    def cost_group(self) -> tuple:
        """What the per-layer costs and saved activations see (not PP, VPP, schedule or micro-batches; DP only
        with FSDP, whose per-layer gathers run over it)."""
        return (self.tp, self.ep, self.ep_spans_tp, self.micro_batch_size, self.recompute, self.dispatcher, self.cp,
                self.recompute_modules, self.fsdp, self.dp if self.fsdp else 0)

    def recompute_text(self) -> str:
        """``none``, ``full``, ``selective`` or ``selective(modules)``."""
        return f"{self.recompute}({','.join(self.recompute_modules)})" if self.recompute_modules else self.recompute

    def columns(self, moe: bool = True) -> dict[str, object]:
        """The layout as table columns (the search's text table, CSV and notebook 11's table): ``tp``, ``cp``,
        ``pp``, ``vpp``, ``ep`` (``N*`` when EP spans TP), ``dp``, ``DP (Megatron)``, ``optimizer``, ``m x mbs``,
        ``schedule``, ``recompute``, ``dispatcher``; ``moe`` False leaves out ``ep``, ``dp`` and ``dispatcher``
        (a dense model's replicas are Megatron's DP)."""
        cols: dict[str, object] = {
            "tp": self.tp, "cp": self.cp, "pp": self.pp, "vpp": self.vpp,
            "ep": f"{self.ep}*" if self.ep_spans_tp else self.ep, "dp": self.dp, "DP (Megatron)": self.megatron_dp,
            "optimizer": "fsdp" if self.fsdp else "dist-opt", "m x mbs": f"{self.microbatches} x {self.micro_batch_size}",
            "schedule": self.schedule, "recompute": self.recompute_text(), "dispatcher": self.dispatcher}
        if not moe:
            del cols["ep"], cols["dp"], cols["dispatcher"]
        return cols

    def text(self, moe: bool = True) -> str:
        """One line; ``moe`` False leaves out EP and the dispatcher (a dense model has neither)."""
        vpp = f" vpp {self.vpp}" if self.vpp > 1 else ""
        spans = " (EP spans TP)" if self.ep_spans_tp else ""
        cp = f" cp {self.cp}" if self.cp > 1 else ""
        ep = f" ep {self.ep}{spans}" if moe else ""
        return (f"tp {self.tp}{cp} pp {self.pp}{vpp}{ep} dp {self.dp} (Megatron DP {self.megatron_dp})"
                f"{', FSDP' if self.fsdp else ''}, {self.microbatches} x {self.micro_batch_size}, {self.schedule}, "
                f"recompute {self.recompute_text()}" + (f", {self.dispatcher}" if moe else ""))


def recompute_choices(model: ModelSpec, recomputes: Sequence[str] = SEARCH_RECOMPUTE,
                      module_sets: Sequence[tuple[str, ...]] = SEARCH_RECOMPUTE_MODULES) -> list[tuple[str, tuple]]:
    """``(recompute, recompute_modules)`` pairs the search tries: each of ``recomputes`` (selective with the
    default module set, :data:`~tessera_lab.model.hardware.SELECTIVE_DEFAULT_MODULES`), plus selective with each of
    ``module_sets`` whose every module ``model`` has (:func:`tessera_lab.plan.make.model_has_module`)."""
    from tessera_lab.plan.make import model_has_module

    out = [(rc, ()) for rc in recomputes]
    if "selective" in recomputes:
        out += [("selective", tuple(ms)) for ms in module_sets if all(model_has_module(model, m) for m in ms)]
    return out


def enumerate_layouts(model: ModelSpec, gpus: int, global_batch: int, *, gpus_per_node: int = 8,
                      schedules: Sequence[str] = SEARCH_SCHEDULES, vpps: Sequence[int] = SEARCH_VPP,
                      recomputes: Sequence[str] = SEARCH_RECOMPUTE, dispatchers: Sequence[str] = SEARCH_DISPATCHERS,
                      micro_batch_sizes: Sequence[int] = SEARCH_MICRO_BATCH_SIZES, seq_len: int = 4096
                      ) -> list[Layout]:
    """Every layout of ``gpus`` GPUs making a global batch of ``global_batch`` sequences of ``seq_len`` tokens under
    the structural rules (module docstring; CP sizes from :func:`cp_choices`, recompute from
    :func:`recompute_choices`, the distributed optimizer and, with more than one data-parallel rank, Megatron FSDP);
    a dense model takes EP 1 and the alltoall dispatcher only. The EP-overlap schedules need two micro-batches or
    more: with one, nothing pairs and Megatron-Core runs plain 1F1B (the 1F1B candidate is that layout).
    Sorted (deterministic)."""
    out = []
    for pp, ep, tp, dp, spans, cp, dense_dp in _structures(model, gpus, gpus_per_node, seq_len):
        space = {"schedules": schedules, "vpps": vpps, "recomputes": recompute_choices(model, recomputes),
                 "dispatchers": dispatchers if model.has_moe and ep > 1 else ("alltoall",),
                 "micro_batch_sizes": micro_batch_sizes}
        out += _batch_layouts(model, (pp, ep, tp, dp, spans, cp), dense_dp, global_batch, space)
    return sorted(out)


def _structures(model: ModelSpec, gpus: int, gpus_per_node: int, seq_len: int):
    """Every ``(pp, ep, tp, dp, spans, cp, dense_dp)`` of ``gpus`` GPUs under the structural rules (module docstring),
    ``dense_dp`` Megatron's data-parallel size (the replicas a global batch is split over)."""
    moe = model.has_moe
    eps = [e for e in _divisors(model.moe.num_experts) if gpus % e == 0] if moe else [1]
    for tp in tp_choices(model, gpus_per_node):
        for cp in cp_choices(model, seq_len, tp):
            for ep in eps:
                for spans in ((False, True) if moe and tp > 1 else (False,)):
                    if spans and ep % tp:
                        continue
                    per_stage = ep * (1 if spans else tp) * cp
                    if gpus % per_stage:
                        continue
                    for pp in _divisors(gpus // per_stage):
                        if pp <= model.num_layers:
                            dp = gpus // per_stage // pp
                            yield pp, ep, tp, dp, spans, cp, ep * dp // (tp if spans else 1)


def nearest_global_batch(model: ModelSpec, gpus: int, sequences: float, *, gpus_per_node: int = 8,
                         seq_len: int = 4096) -> int | None:
    """The global batch in sequences nearest ``sequences`` (ties: the larger; at least 1) that some layout of
    :func:`enumerate_layouts` makes: a multiple of a structure's data-parallel size with at least ``pp``
    micro-batches of one sequence (the search's smallest micro-batch size). ``None`` when no structure exists."""
    best = None
    for pp, *_, dense_dp in _structures(model, gpus, gpus_per_node, seq_len):
        least = dense_dp * (pp if pp > 1 else 1)
        for k in (max(least, math.floor(sequences / dense_dp) * dense_dp),
                  max(least, math.ceil(sequences / dense_dp) * dense_dp)):
            key = (abs(k - sequences), -k)
            if best is None or key < best[0]:
                best = (key, k)
    return None if best is None else best[1]


def _batch_layouts(model, sizes: tuple, dense_dp: int, global_batch: int, space: dict) -> list[Layout]:
    """The layouts of one structure ``(pp, ep, tp, dp, spans)``: every micro-batching, schedule, recompute and
    dispatcher of ``space`` the structural rules allow."""
    pp, ep, tp, dp, spans, cp = sizes
    schedules, vpps, recomputes, dispatchers = (space[k] for k in ("schedules", "vpps", "recomputes", "dispatchers"))
    out = []
    for mbs in space["micro_batch_sizes"]:
        if global_batch % (mbs * dense_dp):
            continue
        m = global_batch // (mbs * dense_dp)
        if pp > 1 and m < pp:
            continue
        scheds = [(s, 1) for s in schedules] if pp > 1 else [("1f1b", 1), ("overlapped", 1)]
        if pp > 1 and m % pp == 0:
            scheds += [(s, v) for s in VIRTUAL_SCHEDULES for v in vpps if pp * v <= model.num_layers]
        for sched, vpp in scheds:
            for rc, mods in recomputes:
                for fsdp in ((False, True) if dense_dp > 1 else (False,)):
                    for disp in dispatchers:
                        lay = Layout(pp, vpp, ep, tp, dp, m, mbs, sched, rc, disp, spans, cp, mods, fsdp)
                        if not (sched.endswith("overlapped") and (m < 2 or overlap_rule_breaks(lay))):
                            out.append(lay)
    return out


def param_memory_bytes(model: ModelSpec, layout: Layout, seq_len: int) -> float:
    """Training-state bytes of every parameter the ``pp`` ranks of one pipeline hold together (weights, gradients,
    optimizer state as :func:`tessera_lab.cost.memory.bytes_per_param` counts them for each part's data-parallel
    degree); the busiest rank holds at least ``1 / pp`` of it whatever the partition."""
    from tessera_lab.cost.memory import bytes_per_param, gpu_params

    p = layout.parallel(seq_len)
    dense_bpp, expert_bpp = bytes_per_param(p, p.dense_shard_dp), bytes_per_param(p, p.expert_dp)
    total = 0.0
    for idx in range(-1, model.num_layers + 1):
        dense, expert = gpu_params(model, p, idx)
        total += dense * dense_bpp + expert * expert_bpp
    return total


def param_key(layout: Layout) -> tuple:
    """The dimensions a layout's parameter state per GPU depends on (:func:`param_memory_bytes` / pp)."""
    return (layout.tp, layout.ep, layout.ep_spans_tp, layout.pp, layout.dp, layout.fsdp)


def param_shares(model: ModelSpec, layouts: Sequence[Layout], seq_len: int) -> dict[tuple, float]:
    """Parameter state per GPU (bytes, :func:`param_memory_bytes` / pp; the busiest rank's floor whatever the
    partition) of the layouts, by :func:`param_key` (computed once per key)."""
    shares: dict[tuple, float] = {}
    for lay in layouts:
        if (key := param_key(lay)) not in shares:
            shares[key] = param_memory_bytes(model, lay, seq_len) / lay.pp
    return shares


def gpu_counts_above(gpus: int, nvlink_domain: int, limit: int) -> list[int]:
    """The counts :func:`gpu_count_ok` accepts above ``gpus`` and at most ``limit``, ascending."""
    step = gpu_step(nvlink_domain)
    small = [n for n in range(gpus + 1, min(step, limit + 1)) if step % n == 0]
    return small + list(range((gpus // step + 1) * step, limit + 1, step))


def fewest_gpus(model: ModelSpec, gpus: int, seqs: int, seq_len: int, nvlink_domain: int, capacity: float,
                limit: int, memory_bound=None) -> tuple[int, float] | None:
    """The fewest GPUs above ``gpus`` the search accepts (:func:`gpu_counts_above`), at most ``limit``, for which some
    layout :func:`enumerate_layouts` gives for ``seqs`` sequences of ``seq_len`` tokens passes the parameter-memory
    rule of :func:`tessera_lab.plan.search._first_pass` (its parameter state per GPU, :func:`param_memory_bytes` /
    pp, at most ``capacity`` bytes) and, given ``memory_bound`` (layout -> bytes: the search's lower bound on the
    busiest rank's memory, parameter state and saved activations), that bound too; with the lightest parameter
    share of that count (bytes). ``None`` when no count up to ``limit`` does."""
    for n in gpu_counts_above(gpus, nvlink_domain, limit):
        layouts = enumerate_layouts(model, n, seqs, gpus_per_node=nvlink_domain, seq_len=seq_len)
        shares = param_shares(model, layouts, seq_len)
        lightest = min(shares.values(), default=math.inf)
        if lightest <= capacity and (memory_bound is None or any(
                shares[param_key(lay)] <= capacity and memory_bound(lay) <= capacity for lay in layouts)):
            return n, lightest
    return None


def too_few_gpus(model: ModelSpec, gpus: int, seqs: int, seq_len: int, nvlink_domain: int, capacity: float,
                 lightest: float, memory_bound=None) -> TooFewGPUsError:
    """The refusal of a search whose every layout fails the parameter-memory rule (``lightest``: the lightest
    parameter state per GPU seen, bytes): one line naming the fewest GPUs at which some layout passes that rule and
    ``memory_bound`` (:func:`fewest_gpus`, looked for up to 4x the GPUs a linear scaling of ``lightest`` asks for,
    and 16 GPU steps at least), with that count as ``needed`` (``None`` when none up to the limit). The planner's
    partitions may need more, so the count is a floor ("at least")."""
    text, needed = _too_few(model, gpus, seqs, seq_len, nvlink_domain, capacity, lightest, memory_bound)
    return TooFewGPUsError(text, needed)


def _too_few(model, gpus, seqs, seq_len, nvlink_domain, capacity, lightest, memory_bound=None
             ) -> tuple[str, int | None]:
    head = (f"--gpus = {gpus} is too small for {model.name}: the lightest layout holds {lightest / 2**30:.1f} GiB of "
            f"parameter state per GPU against {capacity / 2**30:.1f} GiB; allowed: ")
    clause, n = _fewest_clause(model, gpus, seqs, seq_len, nvlink_domain, capacity, lightest, memory_bound)
    return head + clause, n


def _fewest_clause(model, gpus, seqs, seq_len, nvlink_domain, capacity, lightest, memory_bound=None
                   ) -> tuple[str, int | None]:
    """``("at least N GPUs (...)", N)`` from :func:`fewest_gpus`, or ``("more than L GPUs or ...", None)``."""
    step = gpu_step(nvlink_domain)
    linear = -(-math.ceil(gpus * lightest / capacity) // step) * step
    limit = max(4 * linear, gpus + 16 * step)
    got = fewest_gpus(model, gpus, seqs, seq_len, nvlink_domain, capacity, limit, memory_bound)
    what = "its parameter state" + (" and saved activations" if memory_bound is not None else "")
    if got is None:
        return (f"more than {limit} GPUs or a larger --global-batch-tokens (no count of GPUs the search accepts "
                f"up to {limit} holds {what} with {seqs:,} sequence{'s' if seqs != 1 else ''} per iteration)"), None
    n, share = got
    unit = f"a multiple of {step}" if n % step == 0 else f"part of one {step}-GPU node"
    fit = ("some layout passes both memory bounds (parameter state, then saved activations)" if memory_bound
           is not None else "the lightest layout's parameter state fits")
    return (f"at least {n} GPUs ({unit}; the fewest at which {fit}: lightest parameter state "
            f"{share / 2**30:.1f} GiB per GPU, computed; the planner may need more)"), n


def parameter_state_hint(model: ModelSpec, gpus: int, seqs: int, seq_len: int, nvlink_domain: int,
                         capacity: float, memory_bound=None, command: str | None = None) -> str:
    """For a plan refused for memory on ``gpus`` GPUs (``seqs`` sequences of ``seq_len`` tokens an iteration,
    ``capacity`` bytes a GPU): ``""`` when some layout :func:`enumerate_layouts` gives for that count holds the
    model's parameter state (:func:`param_memory_bytes` / pp, the busiest rank's floor whatever the partition), or
    when the search does not take that count; else ``"; no layout of N GPUs holds ...: at least M GPUs ..."``:
    the refusal's recompute, schedule and sequence advice cannot close that gap, only more GPUs can. M is the
    fewest count at which some layout passes the parameter rule and, given ``memory_bound`` (layout -> bytes, the
    search's bound with saved activations), that bound too (:func:`fewest_gpus`), as the search names it.
    ``command``: the search command for the same model and GPU (``"tessera-lab search --model M"``), named with
    ``--gpus M`` at the end; ``None``: none named (a panel has its own button)."""
    if not gpu_count_ok(gpus, nvlink_domain):
        return ""
    layouts = enumerate_layouts(model, gpus, seqs, gpus_per_node=nvlink_domain, seq_len=seq_len)
    lightest = min(param_shares(model, layouts, seq_len).values(), default=0.0)
    if lightest <= capacity:
        return ""
    clause, n = _fewest_clause(model, gpus, seqs, seq_len, nvlink_domain, capacity, lightest, memory_bound)
    return (f"; no layout of {gpus} GPU{'s' if gpus > 1 else ''} holds {model.name}'s parameter state (weights, gradients and optimizer "
            f"state: the lightest layout {lightest / 2**30:.1f} GiB per GPU against {capacity / 2**30:.1f} GiB, "
            "computed), which no recompute, schedule or sequence length changes: "
            + clause + (f"; {command} --gpus {n} lists layouts" if n and command else ""))
