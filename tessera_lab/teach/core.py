"""Teaching helpers in one namespace (kept for notebooks and scripts written against ``tessera_lab.teach.core``).

The code lives in modules of one job each:

* :mod:`tessera_lab.teach.collectives`: the five collectives on local gloo processes, their plain-Python
  reference and their alpha-beta cost on NVLink vs InfiniBand (notebook 01);
* :mod:`tessera_lab.teach.tp_pp`: tensor vs pipeline parallelism volumes and links (notebook 02);
* :mod:`tessera_lab.teach.moe`: MoE dispatch/combine all-to-all and routing skew (notebook 04);
* :mod:`tessera_lab.teach.figures`: their figures;
* :mod:`tessera_lab.teach.panels`: their widget panels (and notebook 03's and 05's).
"""

from __future__ import annotations

from tessera_lab.teach.collectives import (
    COLLECTIVES, CollectiveRun, collective_cost_sweep, collective_cost_table, collective_inputs, collectives_frame,
    expected_collective, link_bandwidths, reference_collectives, run_collectives,
)
from tessera_lab.teach.figures import (
    plot_a2a_vs_topk, plot_collectives, plot_cost_bars, plot_cost_vs_size, plot_moe, plot_skew_sweep, plot_tp_sweep,
)
from tessera_lab.teach.moe import (
    AllToAllVolumes, a2a_volume_vs_topk, all_to_all_volumes, moe_all_to_all, sample_routing, skew_sweep,
)
from tessera_lab.teach.panels import bubble_panel, collective_cost_panel, moe_panel, overlap_panel, tp_pp_panel
from tessera_lab.teach.tp_pp import TpPpVolumes, tp_link_sweep, tp_pp_layouts, tp_vs_pp_volumes

__all__ = [
    "COLLECTIVES", "CollectiveRun", "collective_inputs", "expected_collective", "run_collectives",
    "collectives_frame", "collective_cost_table", "collective_cost_sweep", "link_bandwidths",
    "TpPpVolumes", "tp_vs_pp_volumes", "tp_pp_layouts", "tp_link_sweep",
    "sample_routing", "AllToAllVolumes", "all_to_all_volumes", "moe_all_to_all",
    "a2a_volume_vs_topk", "skew_sweep",
    "plot_collectives", "plot_cost_bars", "plot_cost_vs_size", "plot_tp_sweep", "plot_moe", "plot_a2a_vs_topk",
    "plot_skew_sweep", "reference_collectives",
    "collective_cost_panel", "tp_pp_panel", "moe_panel", "bubble_panel", "overlap_panel",
]
