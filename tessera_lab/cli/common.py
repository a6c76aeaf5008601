"""Helpers shared by the ``tessera-lab`` subcommands: the argparse class with one-line errors, output
(``--json``, tables), the plan options and their readers, and the up-front output-path checks.

Every subcommand module under :mod:`tessera_lab.cli` has ``add_parser(sub)``; nothing outside ``cli/`` imports
this package.
"""

from __future__ import annotations

import argparse
from typing import Any

from tessera_lab.argtypes import Switch, float_at_least, float_in, module_list, positive_int
from tessera_lab.model.hardware import RECOMPUTE_MODULES
from tessera_lab.pipeline.schedules import default_ep_overlap, default_schedule

GIB = 2**30


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors and exit status 2."""

    def error(self, message: str) -> None:  # noqa: D401 - argparse API
        self.exit(2, f"{self.prog}: error: {message}\n")


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="PATH", help="write the result as JSON to PATH ('-' for stdout)")


#: the largest ``--ilp-max-binaries`` / ``--ilp-max-nodes`` accepted (a count of binaries or nodes)
ILP_COUNT_MAX = 10**7


def add_ilp_limit_options(p: argparse.ArgumentParser) -> None:
    """The ILP's limit options: ``--ilp-max-binaries`` and ``--ilp-max-nodes`` (the deterministic work budget, default
    :data:`~tessera_lab.plan.ilp.DEFAULT_ILP_BUDGET`) and ``--time-limit`` (opt-in wall-clock seconds in place of
    the budget; load-dependent). :func:`ilp_limit_from_args` reads them."""
    from tessera_lab.argtypes import int_in, positive_float
    from tessera_lab.plan.ilp import DEFAULT_ILP_BUDGET

    p.add_argument("--ilp-max-binaries", type=int_in("ilp_max_binaries", 0, ILP_COUNT_MAX), default=None,
                   metavar="N", help="ILP work budget: a model with more segment binaries keeps the best heuristic "
                                     f"plan (default {DEFAULT_ILP_BUDGET.max_binaries}; deterministic)")
    p.add_argument("--ilp-max-nodes", type=int_in("ilp_max_nodes", 0, ILP_COUNT_MAX), default=None, metavar="N",
                   help="ILP work budget: HiGHS branch-and-bound nodes per pass (default "
                        f"{DEFAULT_ILP_BUDGET.max_nodes}; deterministic)")
    p.add_argument("--time-limit", type=positive_float("time_limit"), default=None, metavar="S",
                   help="ILP wall-clock limit in seconds instead of the work budget; where the solver stops, and so "
                        "the plan, then depends on the machine's load")


def ilp_limit_from_args(args: argparse.Namespace, default=None):
    """The ILP ``limit`` the options of :func:`add_ilp_limit_options` ask for: ``--time-limit`` seconds (float), else
    an :class:`~tessera_lab.plan.ilp.IlpBudget` when ``--ilp-max-*`` is given (the other count from ``default``,
    :data:`~tessera_lab.plan.ilp.DEFAULT_ILP_BUDGET` when None), else ``None`` (the callee's default budget).

    Raises:
        ConfigError: ``--time-limit`` together with ``--ilp-max-*`` (a clock or a budget, not both).
    """
    from dataclasses import replace

    from tessera_lab.errors import ConfigError
    from tessera_lab.plan.ilp import DEFAULT_ILP_BUDGET

    counts = {k: v for k, v in (("max_binaries", args.ilp_max_binaries), ("max_nodes", args.ilp_max_nodes))
              if v is not None}
    if args.time_limit is not None:
        if counts:
            name, value = next(iter(counts.items()))
            raise ConfigError(f"time_limit = {args.time_limit:g} cannot be combined with ilp_{name} = {value}; "
                              "allowed: either a wall-clock --time-limit or a work budget (--ilp-max-binaries / "
                              "--ilp-max-nodes), not both")
        return args.time_limit
    return replace(default or DEFAULT_ILP_BUDGET, **counts) if counts else None


def table(rows: list[dict[str, Any]], floatfmt: "str | tuple[str, ...]" = ".4g") -> str:
    from tessera_lab.textable import simple_table

    return simple_table(rows, floatfmt=floatfmt)


def emit(args: argparse.Namespace, result: Any, text: str) -> None:
    from tessera_lab.io import write_json

    if getattr(args, "json", None) == "-":
        write_json("-", result)
        return
    print(text)
    if getattr(args, "json", None):
        import sys

        print(f"result: {write_json(args.json, result)}", file=sys.stderr)


def _attention_ratio(text: str) -> int:
    """``--attention-ratio``: an integer >= 0 (linear-attention layers per full-attention layer)."""
    from tessera_lab.argtypes import int_in

    try:
        return int_in("attention_ratio", 0)(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (linear-attention layers per full-attention layer; 0: every layer "
                                         "full attention)") from None


def _knob_type(kw: str, *, check_low: bool = True):
    """argparse ``type=`` of a model knob option: an integer in the knob's range, upper end stated
    (:func:`tessera_lab.model.knobs.parse_knob`)."""
    from tessera_lab.model.knobs import parse_knob

    def parse(text: str) -> int:
        from tessera_lab.errors import ConfigError

        try:
            return parse_knob(kw, text, _KNOB_LABELS.get(kw, kw), check_low=check_low)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


_KNOB_LABELS = {"moe_intermediate_size": "expert_width", "num_experts_per_tok": "top_k", "num_layers": "layers"}
#: the knob options -> their ``args`` attribute and ``with_changes`` keyword
_KNOB_ARGS = {"--attention-ratio": ("attention_ratio", "attention_ratio"),
              "--expert-width": ("expert_width", "moe_intermediate_size"),
              "--top-k": ("top_k", "num_experts_per_tok"), "--experts": ("num_experts", "num_experts"),
              "--layers": ("layers", "num_layers"), "--shared-experts": ("shared_experts", "shared_experts"),
              "--moe-every": ("moe_every", "moe_every"), "--window": ("window", "window")}
_MOE_OPTIONS = ("--expert-width", "--top-k", "--experts", "--shared-experts")


def check_knob_options(m: Any, args: argparse.Namespace) -> None:
    """Refuse knob options the model cannot take, naming the option and the model: a window on a model without
    sliding-window or chunked attention, an expert option on a dense model, ``--experts`` below the model's top-k
    (without ``--top-k``), ``--top-k`` outside 1 to the (new) number of experts.

    Raises:
        ConfigError: one line with the option, its value, the model and what is allowed.
    """
    from tessera_lab.errors import ConfigError
    from tessera_lab.model.families import READERS, family_name

    given = {opt: getattr(args, attr, None) for opt, (attr, _) in _KNOB_ARGS.items()}
    given = {k: v for k, v in given.items() if v is not None}
    if not given:
        return
    reader = next((r for r in READERS if family_name(r) == m.family), None)
    knobs = set(getattr(reader, "KNOBS", {}) or {})
    with_window = sorted(family_name(r) for r in READERS if "window" in (getattr(r, "KNOBS", {}) or {}))
    if "--window" in given and "window" not in knobs:
        raise ConfigError(f"option --window = {given['--window']}: model {m.name} (family {m.family}) has no "
                          "sliding-window or chunked-attention layers; allowed: leave --window out (it sets the "
                          f"window of the families {', '.join(with_window)})")
    if "--attention-ratio" in given and "attention_ratio" not in knobs:
        raise ConfigError(f"option --attention-ratio = {given['--attention-ratio']}: model {m.name} (family "
                          f"{m.family}) has no linear-attention layers to trade against full attention; allowed: leave "
                          "--attention-ratio out, or plan a hybrid model (tessera-lab models lists each family's options)")
    if m.moe.num_experts > 0 or not any(o in given for o in _MOE_OPTIONS):
        for opt, v in given.items():
            kw = _KNOB_ARGS[opt][1]
            if kw != "num_layers" and kw not in knobs:
                from tessera_lab.model.knobs import KNOB_OPTIONS

                has = ", ".join(sorted(KNOB_OPTIONS.get(k) or k for k in knobs | {"num_layers"}))
                raise ConfigError(f"option {opt} = {v}: the {m.family} family of {m.name} has no {kw} to change; "
                                  f"allowed: leave {opt} out (this family's options: {has})")
    if "--window" in given:  # the low end after the family check: a window on a model without one says so
        from tessera_lab.model.knobs import parse_knob

        parse_knob("window", given["--window"], "option --window")
    if m.moe.num_experts == 0:
        for opt in _MOE_OPTIONS:
            if opt in given:
                raise ConfigError(f"option {opt} = {given[opt]}: model {m.name} has no routed experts (a dense "
                                  f"model); allowed: leave {opt} out, or plan a MoE model")
    ne = given.get("--experts") or m.moe.num_experts
    k = given.get("--top-k")
    if k is not None and not 1 <= k <= max(ne, 1):  # checked here, against the experts of this model
        raise ConfigError(f"--top-k = {k} is out of range; allowed: an integer 1 to num_experts = {ne} "
                          "(routed experts per token)")
    if "--experts" in given and k is None and given["--experts"] < m.moe.num_experts_per_tok:
        e = given["--experts"]
        raise ConfigError(f"option --experts = {e} is below the model's top-k = {m.moe.num_experts_per_tok} "
                          f"(num_experts_per_tok, routed experts per token of {m.name}); allowed: --experts "
                          f"{m.moe.num_experts_per_tok} or more, or lower the top-k as well with --top-k K (1 to {e})")


def check_mtp_option(m: Any) -> None:
    """Refuse ``--mtp`` on a model whose config declares no MTP layers, naming the model and the fields its family's
    reader looks for (``READS`` entries naming MTP or next-n prediction layers).

    Raises:
        ConfigError: one line with the model, the fields looked for and what is allowed.
    """
    from tessera_lab.errors import ConfigError
    from tessera_lab.model.families import READERS, family_name

    if m.stack.mtp_layers:
        return
    reader = next((r for r in READERS if family_name(r) == m.family), None)
    def mtp_fields(r) -> set[str]:
        return {f for f in getattr(r, "READS", ()) if ("mtp" in f or "nextn" in f) and "embedding" not in f}

    fields = sorted(mtp_fields(reader))
    looked = (f"looked for {', '.join(fields)}: absent or 0" if fields
              else f"the {m.family} family's reader knows no MTP field")
    with_mtp = sorted(set().union(*(mtp_fields(r) for r in READERS)))
    raise ConfigError(f"option --mtp: model {m.name}'s config declares no MTP layers ({looked}); allowed: leave "
                      f"--mtp out, or a config that declares them ({', '.join(with_mtp)})")


def model_from_args(args: argparse.Namespace):
    from tessera_lab.model.knobs import model_changes
    from tessera_lab.model.spec import load_model

    structural = bool(getattr(args, "allow_structural_fields", False))
    m = load_model(args.model, allow_unknown_fields=structural or bool(getattr(args, "allow_unknown_fields", False)),
                   plan_mtp=bool(getattr(args, "mtp", False)), allow_structural_fields=structural)
    if getattr(args, "mtp", False):
        check_mtp_option(m)
    check_knob_options(m, args)
    changes = model_changes({k: getattr(args, k, None) for k in ("attention_ratio", "expert_width", "top_k",
                                                                 "num_experts", "layers", "shared_experts",
                                                                 "moe_every", "window")})
    if changes and getattr(args, "allow_no_full_attention", False):
        changes["allow_no_full_attention"] = True
    return m.with_changes(**changes) if changes else m


def parallel_from_args(args: argparse.Namespace, model=None):
    """The :class:`~tessera_lab.model.hardware.ParallelConfig` of the options; ``--gpus`` sets the data-parallel
    replicas (:func:`dp_for_gpus`). ``model``: the planned model, whose lack of routed experts a ``--gpus`` refusal
    then names (``--ep`` counts as data-parallel replicas there).

    Raises:
        ConfigError: ``--gpus`` that the other sizes do not divide, or that disagrees with ``--dp``.
    """
    from tessera_lab.model.hardware import ParallelConfig, dp_for_gpus

    if args.ep is None:  # the default: EP 8 for a MoE model, 1 for a dense one (it has no experts to shard)
        args.ep = 8 if model is None or model.has_moe else 1
    one = ParallelConfig(pp=args.pp, tp=args.tp, ep=args.ep, dp=1, cp=getattr(args, "cp", 1),
                         ep_spans_tp=bool(getattr(args, "ep_spans_tp", False)))
    sizes = " x ".join(f"{k} {v}" for k, v in (("pp", one.pp), ("ep", one.ep), ("tp", one.tp), ("cp", one.cp))
                       if v > 1 and not (k == "tp" and one.ep_spans_tp)) or "1"
    hint = (f"; {model.name} has no MoE, so ep {one.ep} counts as data-parallel replicas (--ep 1 takes it out)"
            if model is not None and not model.has_moe and one.ep > 1 else "")
    dp = dp_for_gpus(getattr(args, "gpus", None), args.dp, one.world_size, sizes, hint=hint)
    return ParallelConfig(
        pp=args.pp, vpp=args.vpp, tp=args.tp, ep=args.ep, dp=dp, microbatches=args.microbatches,
        **({"cp": args.cp} if getattr(args, "cp", 1) != 1 else {}),
        **({"grouped_gemm": args.grouped_gemm} if getattr(args, "grouped_gemm", None) else {}),
        micro_batch_size=args.micro_batch_size, seq_len=args.seq_len, schedule=default_schedule(args.schedule, args.vpp,
                                   ep_overlap=default_ep_overlap(args, model)),
        distributed_optimizer=not args.no_distributed_optimizer,
        **{k: getattr(args, k) for k in ("dispatcher", "recompute", "precision", "grad_reduce_dtype", "expert_load",
                                         "adam_moment_dtype") if getattr(args, k, None) is not None},
        **({"ep_spans_tp": True} if getattr(args, "ep_spans_tp", False) else {}),
        **({"recompute_modules": tuple(args.recompute_modules)} if getattr(args, "recompute_modules", None) else {}),
        **({"host_sync_s": args.host_sync_ms / 1e3} if getattr(args, "host_sync_ms", None) is not None else {}),
        **({"fsdp": True} if getattr(args, "fsdp", False) else {}),
    )


def split_from_args(args: argparse.Namespace, model, parallel) -> list[int] | None:
    """The decoder-layer boundaries Megatron's ``--account-for-{embedding,loss}-in-pipeline-split`` give
    (:func:`tessera_lab.plan.stages.accounted_boundaries`), or ``None`` when neither option is set."""
    emb = bool(getattr(args, "account_for_embedding_in_pipeline_split", False))
    loss = bool(getattr(args, "account_for_loss_in_pipeline_split", False))
    if not (emb or loss):
        return None
    from tessera_lab.plan.stages import accounted_boundaries

    return accounted_boundaries(model.num_layers, parallel.pp * parallel.vpp, embedding=emb, loss=loss)


def add_memory_reserve_option(p: argparse.ArgumentParser) -> None:
    """``--memory-reserve-gib G`` (``plan``, ``report``, ``search``): GiB per GPU the memory model leaves free."""
    from tessera_lab.cost.memory import memory_reserve_gib

    p.add_argument("--memory-reserve-gib", type=float_in("memory_reserve_gib", 0.0, 1e4,
                                                         allowed="a number of GiB >= 0 and below the GPU's HBM"),
                   default=None, metavar="G",
                   help=f"GiB per GPU held back from the HBM the plan may fill (CUDA context, NCCL buffers, "
                        f"fragmentation, your margin; default {memory_reserve_gib():g}, data/hardware/cost_model.json)")


def check_memory_reserve(args: argparse.Namespace) -> float | None:
    """``--memory-reserve-gib`` checked against ``--gpu``'s HBM (the option's own parser checks the sign); returns it.

    Raises:
        ConfigError: a reserve not below the GPU's HBM, named as the option (one line, before any work).
    """
    from tessera_lab.errors import ConfigError
    from tessera_lab.model.hardware import GPUSpec

    reserve = getattr(args, "memory_reserve_gib", None)
    if reserve is not None:
        spec = GPUSpec.named(args.gpu)
        hbm = spec.memory_bytes / 2**30
        if reserve >= hbm:
            raise ConfigError(f"--memory-reserve-gib = {reserve:g} is out of range; allowed: >= 0 and below the "
                              f"{spec.name}'s {hbm:.2f} GiB of HBM")
    return reserve


def cluster_from_args(args: argparse.Namespace, parallel):
    """The cluster ``--gpu``, ``--nodes`` and ``--memory-reserve-gib`` ask for, or ``None`` (the planner's default:
    the fewest NVLink domains holding ``parallel``, the data file's reserve). Raises ConfigError for a reserve not
    below the GPU's HBM, before any planning."""
    from tessera_lab.model.hardware import Cluster, cluster_for

    reserve = check_memory_reserve(args)
    if args.nodes:
        return Cluster.dgx(args.gpu, args.nodes, reserve)
    return cluster_for(parallel, args.gpu, reserve) if reserve is not None else None


def add_plan_options(p: argparse.ArgumentParser, default_model: str, default_gpu: str) -> None:
    """The model, hardware, parallel and partition options that build a plan (``plan`` and ``report``; read
    by :func:`model_from_args`, :func:`parallel_from_args` and ``Cluster.dgx(gpu, nodes)``)."""
    p.add_argument("--model", default=default_model,
                   help=f"shipped model, config.json, or a model folder holding one (default {default_model})")
    p.add_argument("--gpu", default=default_gpu,
                   help=f"H100, H200, B200, B300 (DGX/HGX nodes of 8) or GB200 (NVL72 racks of 72) (default {default_gpu})")
    p.add_argument("--nodes", type=positive_int("nodes"), default=None,
                   help="NVLink domains: nodes of 8 GPUs, or GB200 NVL72 racks of 72 (default: the fewest that hold "
                        "pp*dp*ep*tp*cp)")
    add_memory_reserve_option(p)
    p.add_argument("--pp", type=positive_int("pp"), default=8)
    p.add_argument("--vpp", type=positive_int("vpp"), default=1, help="virtual stages (model chunks) per pipeline rank")
    p.add_argument("--ep", type=positive_int("ep"), default=None, help="expert parallelism (default 8; dense: 1)")
    p.add_argument("--tp", type=positive_int("tp"), default=1)
    p.add_argument("--dp", type=positive_int("dp"), default=None,
                   help="data-parallel replicas of one EP group (default 1, or what --gpus leaves)")
    p.add_argument("--gpus", type=positive_int("gpus"), default=None,
                   help="GPUs in all: sets --dp to gpus / (pp x ep x tp x cp; tp once with --ep-spans-tp)")
    p.add_argument("--cp", type=positive_int("cp"), default=1,
                   help="context parallelism: each sequence split over cp ranks (seq-len a multiple of 2 x cp); "
                        "multiplies the GPUs (docs/context-parallel.md)")
    p.add_argument("--microbatches", "-m", type=positive_int("microbatches"), default=32)
    p.add_argument("--micro-batch-size", type=positive_int("micro_batch_size"), default=1)
    p.add_argument("--seq-len", type=positive_int("seq_len"), default=4096)
    p.add_argument("--schedule", default=None,
                   help="overlapped (F of one micro-batch with B of another: Megatron-Core's EP overlap), 1f1b, "
                        "gpipe, zb-h1, zb-h2, zb-auto, interleaved or interleaved-overlapped (--vpp >= 2), or auto "
                        "(each that fits memory, the fastest kept); default: overlapped where Megatron-Core runs its EP "
                        "overlap (MoE, EP > 1, no full or moe-module recompute), else 1f1b; interleaved forms with --vpp >= 2")
    p.add_argument("--method", default="ilp", choices=["ilp", "dp", "uniform"])
    p.add_argument("--no-distributed-optimizer", action=Switch)
    p.add_argument("--dispatcher", choices=["alltoall", "deepep"], default=None,
                   help="EP token dispatcher: alltoall (one copy per token and expert; default) or deepep "
                        "(one copy per token and destination rank, 24 SMs)")
    p.add_argument("--recompute", choices=["none", "selective", "full"], default=None,
                   help="activation recomputation, Megatron's granularities (default none)")
    p.add_argument("--recompute-modules", default=None, metavar="LIST",
                   type=module_list("recompute_modules", RECOMPUTE_MODULES),
                   help="with --recompute selective: Megatron's module names, comma-separated (core_attn, mla_up_proj, "
                        "mlp, moe_act, moe, layernorm, shared_experts); not given: core_attn,moe_act (Megatron-Core's "
                        "own default is core_attn alone)")
    p.add_argument("--fsdp", action=Switch,
                   help="Megatron FSDP: parameters, gradients and optimizer state sharded over the data-parallel "
                        "ranks; each layer's parameters all-gathered before its forward and backward and its gradients "
                        "reduce-scattered, every micro-batch")
    p.add_argument("--account-for-embedding-in-pipeline-split", action=Switch,
                   help="the embedding counts as one layer in the split (Megatron's option): the first virtual stage "
                        "gets one decoder layer less; the split is then Megatron's even one, not searched")
    p.add_argument("--account-for-loss-in-pipeline-split", action=Switch,
                   help="the loss counts as one layer in the split (Megatron's option): the last virtual stage gets "
                        "one decoder layer less; the split is then Megatron's even one, not searched")
    p.add_argument("--ep-spans-tp", action=Switch,
                   help="the EP group spans the TP ranks too (Megatron's expert grid with expert TP 1, as recipes with "
                        "EP > DP run); world pp*dp*ep")
    p.add_argument("--adam-moment-dtype", choices=["fp32", "bf16"], default=None,
                   help="dtype of Adam's moments (bf16: Megatron's precision-aware optimizer; default fp32)")
    p.add_argument("--precision", choices=["bf16", "fp8"], default=None,
                   help="GEMM precision (fp8: FP8 current scaling for linear and expert GEMMs; default bf16)")
    p.add_argument("--grouped-gemm", choices=["multistream", "grouped", "sequential"], default=None,
                   help="expert GEMMs: multistream (default: Transformer Engine's GroupedLinear, one cuBLAS GEMM per "
                        "expert on 4 streams, each launched by the host), grouped (one grouped kernel) or sequential")
    p.add_argument("--grad-reduce-dtype", choices=["fp32", "bf16"], default=None,
                   help="gradient buffer and reduction dtype (default fp32, Megatron-LM's for bf16)")
    p.add_argument("--expert-load", type=float_at_least("expert_load", 1.0, what="busiest EP rank's tokens over the mean"),
                   default=None, metavar="X",
                   help="busiest EP rank's tokens over the mean (>= 1; default: expected busiest rank of a "
                        "balanced random router)")
    from tessera_lab.cost.sync import FITTED_PER_WAIT_S, FITTED_PROVENANCE

    p.add_argument("--host-sync-ms", type=float_in("host_sync_ms", 0.0, 1e5, allowed="milliseconds, 0 to 100000"),
                   default=None, metavar="MS",
                   help="host/device sync exposed per host wait of a MoE layer and micro-batch, in ms, where the dropless "
                        "dispatch waits on the host (with or without EP, analytic costs; one wait per MoE layer, run again "
                        "where the MoE block is recomputed; GPT-OSS's expert activation waits too; every forward run "
                        "apart carries it; a forward an EP-overlap schedule pairs with a backward carries what the "
                        "paired backward's expert (mlp) node, queued before the wait, does not hide; "
                        "default per dispatcher: " + ", ".join(f"{d} {v * 1e3:.2f}" for d, v in FITTED_PER_WAIT_S.items())
                        + f", {FITTED_PROVENANCE}; 0 turns it off)")
    add_model_knobs(p)


def add_model_knobs(p: argparse.ArgumentParser) -> None:
    """The model knobs (``plan``, ``report``, ``params``), applied by the family's rule
    (:meth:`~tessera_lab.model.spec.ModelSpec.with_changes`), and how the config is read."""
    p.add_argument("--attention-ratio", type=_attention_ratio, default=None, metavar="R",
                   help="linear-mixer layers per full-attention layer on any linear+full hybrid, placed by the "
                        "family's rule (an integer >= 0; 0: every mixer full attention; Qwen3-Next: 3)")
    p.add_argument("--allow-no-full-attention", action=Switch,
                   help="accept an --attention-ratio that leaves no full-attention layer")
    p.add_argument("--expert-width", type=_knob_type("moe_intermediate_size"), default=None, metavar="W",
                   help="routed expert intermediate size (an integer >= 1)")
    p.add_argument("--top-k", type=_knob_type("num_experts_per_tok", check_low=False), default=None, metavar="K",
                   help="routed experts per token (1 to the model's number of routed experts)")
    p.add_argument("--num-experts", "--experts", dest="num_experts", type=_knob_type("num_experts"), default=None,
                   metavar="E", help="routed experts per MoE layer")
    p.add_argument("--shared-experts", type=_knob_type("shared_experts"), default=None, metavar="N",
                   help="shared experts per MoE layer (each of the routed experts' width; 0 removes them)")
    p.add_argument("--moe-every", type=_knob_type("moe_every"), default=None, metavar="N",
                   help="MoE every N-th layer by the family's rule (decoder_sparse_step, moe_layer_freq, "
                        "expert_layer_period, interleave_moe_layer_step)")
    p.add_argument("--window", type=_knob_type("window", check_low=False), default=None, metavar="TOKENS",
                   help="sliding window (gpt-oss, Mixtral) or attention chunk (Llama-4) in tokens")
    p.add_argument("--layers", type=_knob_type("num_layers"), default=None, metavar="N",
                   help="decoder layers (the family's layer pattern is re-derived; every family)")
    p.add_argument("--mtp", action=Switch, help="plan the config's MTP layers after the last decoder layer (last stage)")
    p.add_argument("--allow-unknown-fields", action=Switch,
                   help="plan an approximate model without the config fields its family reader does not know "
                        "(the plan's first line lists them); fields named like shapes or layer kinds stay refused")
    p.add_argument("--allow-structural-fields", action=Switch,
                   help="with --allow-unknown-fields: also plan without unknown fields named like shapes or layer "
                        "kinds (*_size, *_layers, *_experts, *_pattern, *_type*; the plan says approximate)")


#: options that name an output file, and the commands whose ``--out`` is a folder
_FILE_OUTPUTS = ("json", "plot", "export", "trace", "profile_store", "csv")
_DIR_OUT_COMMANDS = ("reproduce", "run")
_PLOT_SUFFIXES = ("", ".png", ".pdf", ".svg", ".jpg", ".jpeg")


def check_output_paths(args: argparse.Namespace) -> None:
    """Refuse unusable output paths before any work is done (an empty path, a folder where a file goes, a file
    where a folder goes, a folder this user may not write in, an unknown figure format), so that a long
    measurement never ends in a failed write.

    Raises:
        ConfigError: naming the option and what is allowed.
    """
    from pathlib import Path

    from tessera_lab.errors import ConfigError

    def blocked_by_file(path: Path) -> Path | None:
        for parent in path.parents:
            if parent.exists():
                return None if parent.is_dir() else parent
        return None

    def unwritable(opt: str, value: str, path: Path, folder: bool) -> None:
        """An empty path, or a nearest existing folder (the output itself for a folder output) not writable."""
        if not str(value).strip():
            raise ConfigError(f"option {opt} = {value!r} is {'blank' if value else 'empty'}; allowed: a {'folder' if folder else 'file'} path")
        import os

        here = next((q for q in ([path] if folder else []) + list(path.absolute().parents) if q.exists()), None)
        if here is not None and here.is_dir() and not os.access(here, os.W_OK | os.X_OK):
            raise ConfigError(f"option {opt} = '{value}': folder '{here}' is not writable; allowed: a path where "
                              "this user may create files")

    outputs = [(name, getattr(args, name, None)) for name in _FILE_OUTPUTS]
    out = getattr(args, "out", None)
    if out is not None and args.command not in _DIR_OUT_COMMANDS:
        outputs.append(("out", out))
    for name, value in outputs:
        if value is None or value == "-":
            continue
        path, opt = Path(value), "--" + name.replace("_", "-")
        unwritable(opt, value, path, False)
        if path.is_dir():
            raise ConfigError(f"option {opt} = '{value}' is a folder; allowed: a file path")
        bad = blocked_by_file(path)
        if bad is not None:
            raise ConfigError(f"option {opt} = '{value}': '{bad}' is a file, not a folder")
        if name == "plot" and path.suffix.lower() not in _PLOT_SUFFIXES:
            raise ConfigError(f"option --plot = '{value}' has an unknown figure format '{path.suffix}'; "
                              f"allowed: .png, .pdf, .svg, .jpg")
    if out is not None and args.command in _DIR_OUT_COMMANDS:
        path = Path(out)
        unwritable("--out", out, path, True)
        if path.exists() and not path.is_dir():
            raise ConfigError(f"option --out = '{out}' is a file; allowed: a folder")
        bad = blocked_by_file(path)
        if bad is not None:
            raise ConfigError(f"option --out = '{out}': '{bad}' is a file, not a folder")
