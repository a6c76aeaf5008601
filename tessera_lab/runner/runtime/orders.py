"""Issue orders of an overlapped pair's nodes (torch-free).

A runner layer is five nodes, named as the task decomposition names them (docs/concepts.md):

* forward ``pre`` (input norm, mixer, residual, post-attention norm, router, top-k, permute), ``dispatch``
  (count exchange and the dispatch all-to-all), ``experts`` (one GEMM per local expert), ``combine`` (the
  combine all-to-all), ``post`` (unpermute, shared expert, residual);
* backward mirrored: ``post``, ``combine`` (reverse all-to-all), ``experts``, ``dispatch`` (reverse
  all-to-all), ``pre`` (with the weight gradients unless W is deferred).

An overlapped pair ``(F(stage a, mb i); B(stage b, mb j))`` pairs the k-th layer of the forward (walking up)
with the k-th layer of the backward (walking down). The issue order of one layer pair is a **template**: a
permutation of the ten keys ``f.pre f.dispatch f.experts f.combine f.post b.post b.combine b.experts
b.dispatch b.pre`` that respects each side's chain. The executor repeats it for every layer pair; the
forward's embedding and the backward's LM head go first, the forward's LM head and the backward's embedding
last, unpaired layers run after, in program order.

Semantics on CPU (:func:`host_issue_makespan`): one host thread walks the order; a compute node runs when
the host reaches it and its inputs are there (waiting on an all-to-all it depends on); a communication node
is *issued* (asynchronously: gloo/NCCL work handles) when the host reaches it and runs on its side's lane
(forward and backward use separate EP process groups). On a GPU the host also does not block on compute, so
the ``streams`` semantics of :func:`tessera_lab.cost.lanes.pair_makespan` applies instead.

Named candidates (:data:`NAMED_ORDERS`; :data:`ORDER_SOURCES` says where each comes from): ``program`` (forward
layer, then backward layer: what a runtime without overlap issues), ``megatron`` (Megatron-Core's combined 1F1B
order, pinned: :data:`MEGATRON_SOURCE`) and ``comm-first`` (tessera-lab's own heuristic: issue every all-to-all
as soon as its input exists).

Megatron-Core's ``TransformerLayerSchedulePlan.run`` (:data:`MEGATRON_SOURCE`) issues, for a forward layer
``f`` and a backward layer ``b``: ``b.mtp_post_process.backward``, ``b.moe_combine.backward``;
``f.attn.forward``, ``f.post_attn.forward``; ``b.mlp.backward``; ``f.moe_dispatch.forward``;
``b.mlp.backward_dw``, ``b.moe_dispatch.backward``; ``f.mlp.forward``; ``f.moe_combine.forward``,
``f.mtp_post_process.forward``; ``b.post_attn.backward``, ``b.attn.backward`` (:data:`MEGATRON_UPSTREAM_CALLS`).
Mapped onto the ten keys (:data:`MEGATRON_KEY_OF`): ``attn`` + ``post_attn`` = ``pre``; ``moe_dispatch`` =
``dispatch``; ``mlp`` = ``experts``; ``moe_combine`` = ``combine`` followed (forward) or preceded (backward) by
our ``post`` (unpermute, shared expert, residual), which Megatron's combine node holds; the MTP and
weight-gradient (``backward_dw``) calls have no key of their own (W is a separate action here).
"""

from __future__ import annotations

from typing import Mapping, Sequence

from tessera_lab.errors import ConfigError
from tessera_lab.overlap.bundles import COMM, COMPUTE, PairGraph

__all__ = ["F_NODES", "B_NODES", "TEMPLATE_KEYS", "NAMED_ORDERS", "ORDER_SOURCES", "MEGATRON_SOURCE",
           "MEGATRON_UPSTREAM_CALLS", "megatron_order", "template_graph", "check_template",
           "resolve_order", "host_issue_makespan", "search_template", "all_templates", "nominal_durations",
           "durations_from_events"]

F_NODES = ("pre", "dispatch", "experts", "combine", "post")
B_NODES = ("post", "combine", "experts", "dispatch", "pre")
COMM_NODES = frozenset({"dispatch", "combine"})
TEMPLATE_KEYS = tuple(f"f.{n}" for n in F_NODES) + tuple(f"b.{n}" for n in B_NODES)

#: the pinned upstream file the ``megatron`` order is read from
MEGATRON_SOURCE = {"repo": "NVIDIA/Megatron-LM", "commit": "d428de40c139dd091d3a91baf041e9128811a4d7",
                   "file": "megatron/core/models/common/model_chunk_schedule_plan.py",
                   "function": "TransformerLayerSchedulePlan.run"}
#: the node calls of that function, in its order (``side.node.direction``)
MEGATRON_UPSTREAM_CALLS = ("b.mtp_post_process.backward", "b.moe_combine.backward", "f.attn.forward",
                           "f.post_attn.forward", "b.mlp.backward", "f.moe_dispatch.forward", "b.mlp.backward_dw",
                           "b.moe_dispatch.backward", "f.mlp.forward", "f.moe_combine.forward",
                           "f.mtp_post_process.forward", "b.post_attn.backward", "b.attn.backward")
#: upstream node -> our keys, in issue order (empty: no key of its own; ``attn`` stands for ``attn`` + ``post_attn``)
MEGATRON_KEY_OF = {"attn": ("pre",), "post_attn": (), "moe_dispatch": ("dispatch",), "mlp": ("experts",),
                   "moe_combine": {"f": ("combine", "post"), "b": ("post", "combine")}, "mtp_post_process": ()}


def megatron_order(calls: Sequence[str] = MEGATRON_UPSTREAM_CALLS) -> tuple[str, ...]:
    """Our template from Megatron-Core's call sequence (see the module docstring for the mapping)."""
    out: list[str] = []
    for c in calls:
        side, node, direction = c.split(".")
        if direction == "backward_dw":
            continue
        keys = MEGATRON_KEY_OF[node]
        keys = keys[side] if isinstance(keys, dict) else keys
        out.extend(f"{side}.{k}" for k in keys if f"{side}.{k}" not in out)
    return tuple(out)


NAMED_ORDERS: dict[str, tuple[str, ...]] = {
    "program": TEMPLATE_KEYS,
    "megatron": ("b.post", "b.combine", "f.pre", "b.experts", "f.dispatch", "b.dispatch", "f.experts",
                 "f.combine", "f.post", "b.pre"),
    "comm-first": ("b.post", "b.combine", "f.pre", "f.dispatch", "b.experts", "b.dispatch", "f.experts",
                   "f.combine", "b.pre", "f.post"),
}
#: where each named order comes from
ORDER_SOURCES = {
    "program": "program order: the forward layer, then the backward layer (a runtime without overlap)",
    "megatron": (f"Megatron-Core {MEGATRON_SOURCE['repo']}@{MEGATRON_SOURCE['commit'][:12]} "
                 f"{MEGATRON_SOURCE['file']} {MEGATRON_SOURCE['function']}"),
    "comm-first": "tessera-lab heuristic: every all-to-all issued as soon as its input exists",
}


def template_graph() -> PairGraph:
    """The ten template keys as a :class:`~tessera_lab.overlap.bundles.PairGraph` (``f`` = bundle a)."""
    keys = TEMPLATE_KEYS
    lanes = {k: (COMM if k.split(".")[1] in COMM_NODES else COMPUTE) for k in keys}
    deps: dict[str, tuple[str, ...]] = {}
    for side, chain in (("f", F_NODES), ("b", B_NODES)):
        for n, name in enumerate(chain):
            deps[f"{side}.{name}"] = (f"{side}.{chain[n - 1]}",) if n else ()
    owner = {k: ("a" if k.startswith("f.") else "b") for k in keys}
    return PairGraph(keys, lanes, deps, owner)


def check_template(order: Sequence[str]) -> tuple[str, ...]:
    """Validate a template order (every key once, each side's chain kept).

    Raises:
        ConfigError: naming the offending key.
    """
    order = tuple(order)
    if sorted(order) != sorted(TEMPLATE_KEYS):
        missing = sorted(set(TEMPLATE_KEYS) - set(order))
        extra = sorted(set(order) - set(TEMPLATE_KEYS))
        raise ConfigError(f"field 'pair_order' must list each of {', '.join(TEMPLATE_KEYS)} once; missing {missing}, "
                          f"unknown {extra}")
    pos = {k: i for i, k in enumerate(order)}
    for k, ds in template_graph().deps.items():
        for d in ds:
            if pos[d] > pos[k]:
                raise ConfigError(f"field 'pair_order' puts {k} before {d}, which it depends on")
    return order


def nominal_durations(ep: int) -> dict[str, float]:
    """A torch-free guess of node times (relative units) used when nothing was measured: pre 3, experts 2,
    post 2, each all-to-all 1 (0 when ``ep == 1``); backward nodes twice their forward."""
    base = {"pre": 3.0, "dispatch": 1.0 if ep > 1 else 0.0, "experts": 2.0, "combine": 1.0 if ep > 1 else 0.0,
            "post": 2.0}
    out = {f"f.{k}": v for k, v in base.items()}
    out.update({f"b.{k}": (v if k in COMM_NODES else 2 * v) for k, v in base.items()})
    return out


def host_issue_makespan(order: Sequence[str], durations: Mapping[str, float], *, issue_overhead: float = 0.0,
                        graph: PairGraph | None = None) -> float:
    """Makespan of ``order`` under the CPU executor's semantics (module docstring): the ``host_issue`` semantics of
    the one pair-makespan function :func:`tessera_lab.cost.lanes.pair_makespan`.

    ``durations``: seconds (or any unit) per key; communication keys run on their side's lane (``f`` and
    ``b`` have separate lanes, as they use separate process groups); ``issue_overhead``: host time to issue
    one communication.
    """
    from tessera_lab.cost.lanes import pair_makespan

    g = graph or template_graph()
    return pair_makespan(order, durations, g.lanes, g.deps, semantics="host_issue",
                         issue_overhead=issue_overhead).makespan


def all_templates() -> list[tuple[str, ...]]:
    """Every template order: the interleavings of the two five-node chains (C(10, 5) = 252), program order
    first."""
    out: list[tuple[str, ...]] = []

    def rec(i: int, j: int, acc: list[str]) -> None:
        if i == len(F_NODES) and j == len(B_NODES):
            out.append(tuple(acc))
            return
        if i < len(F_NODES):
            rec(i + 1, j, acc + [f"f.{F_NODES[i]}"])
        if j < len(B_NODES):
            rec(i, j + 1, acc + [f"b.{B_NODES[j]}"])

    rec(0, 0, [])
    return out


def search_template(durations: Mapping[str, float], *, issue_overhead: float = 0.0,
                    keep: int = 4) -> list[tuple[float, tuple[str, ...]]]:
    """The ``keep`` best template orders under :func:`host_issue_makespan`, best first, ``(makespan, order)``,
    by exhaustive search over :func:`all_templates`; the program order wins ties (the sort is stable)."""
    g = template_graph()
    scored = [(host_issue_makespan(o, durations, issue_overhead=issue_overhead, graph=g), o) for o in all_templates()]
    scored.sort(key=lambda x: x[0])
    return scored[:keep]


def durations_from_events(events: Sequence[Mapping]) -> dict[str, float]:
    """Median measured seconds per template key from a node-level run's events (``run --json``): compute nodes
    from lane ``node``, all-to-alls from lane ``comm`` (issue to the end of the wait, so take them from a run
    that waits at once, such as plain 1F1B with ``--pair-exec scheduled``). Keys without samples get 0."""
    import statistics

    got: dict[str, list[float]] = {k: [] for k in TEMPLATE_KEYS}
    for e in events:
        key = None
        if e.get("lane") == "node" and ":" in e.get("label", ""):
            name = e["label"].split(":", 1)[1]
            if name.startswith("L") and "." in name:
                key = ("f." if e["type"] == "F" else "b.") + name.split(".")[1]
        elif e.get("lane") == "comm" and e.get("type") == "ep_a2a" and str(e.get("label", "")).startswith("L"):
            parts = e["label"].split("[")[0].split(".")
            if len(parts) >= 2 and parts[1] in COMM_NODES:
                key = ("b." if len(parts) > 2 else "f.") + parts[1]
        if key in got:
            got[key].append(float(e["end"]) - float(e["start"]))
    return {k: (statistics.median(v) if v else 0.0) for k, v in got.items()}


def _measured_order(path: str) -> tuple[str, tuple[str, ...]]:
    from tessera_lab.io import read_json

    from .schemas import check_run_result

    where = f"field 'pair_order' = 'measured:{path}'"
    data = read_json(path, where)  # UTF-8 JSON, size and depth limits
    if not isinstance(data, dict) or "jobs" not in data:
        raise ConfigError(f"{where}: not a run result with events (write one with tessera-lab run --pair-exec "
                          "scheduled --json PATH)")
    events = check_run_result(data, where)["jobs"][0]["events"]  # every event's start <= end
    d = durations_from_events(events)
    if not any(d.values()):
        raise ConfigError(f"run '{path}' has no node-level events; run it with --pair-exec scheduled")
    return f"searched (node times measured in {path})", tuple(search_template(d, keep=1)[0][1])


def resolve_order(spec: str | Sequence[str] | None, ep: int) -> tuple[str, tuple[str, ...]]:
    """``(label, template)`` for a ``pair_order`` setting: a name of :data:`NAMED_ORDERS`, ``"searched"`` /
    None (the best order of :func:`search_template` over :func:`nominal_durations`), ``"measured:RUN.json"``
    (the best order over the node times measured in that run, :func:`durations_from_events`), or an
    explicit list.

    Raises:
        ConfigError: unknown name, an unreadable run, or an invalid list.
    """
    if spec is None or spec == "searched":
        best = search_template(nominal_durations(ep), keep=1)[0][1]
        return "searched (nominal node times)", tuple(best)
    if isinstance(spec, str) and spec.startswith("measured:"):
        return _measured_order(spec[len("measured:"):])
    if isinstance(spec, str):
        if spec not in NAMED_ORDERS:
            raise ConfigError(f"field 'pair_order' = {spec!r} is unknown; allowed: searched, measured:RUN.json, "
                              f"{', '.join(NAMED_ORDERS)} or a list of the ten template keys")
        return spec, NAMED_ORDERS[spec]
    return "given", check_template(spec)
