"""One-off for merging branches that still edit the retired ``notebooks/_build_NN.py`` generators (issue 17).

    python notebooks/tools/port_build.py PATH/_build_NN.py

runs the generator in a temporary folder, converts its notebook to the jupytext percent script
``notebooks/NN_name.py`` (overwriting it) and, for 07, re-applies what issue 17 changed there (the panel from
``tessera_lab.ui.dynamic_panel``, the dynamic-gain headline of section 6, the ``panel``/``panel-setup`` tags). Then
run ``python notebooks/regenerate.py NN``. Delete this file once no branch edits a ``_build_NN.py``.
"""
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parents[1]
build = Path(sys.argv[1]).resolve()
num = build.stem.split("_")[-1]
with tempfile.TemporaryDirectory() as tmp:
    shutil.copy(build, Path(tmp) / build.name)
    subprocess.run([sys.executable, build.name], check=True, cwd=tmp)
    nb = next(Path(tmp).glob(f"{num}_*.ipynb"))
    out = NOTEBOOKS / nb.with_suffix(".py").name
    subprocess.run([sys.executable, "-m", "jupytext", "--update-metadata", '{"jupytext": {"formats": "ipynb,py:percent"}}',
                    "--to", "py:percent", "-o", str(out), str(nb)], check=True)
if num != "07":
    print("ported", out)
    sys.exit(0)
t = out.read_text()
# 1. the panel cell
i = t.index("# %%\nimport ipywidgets as widgets")
j = t.index("# %% [markdown]", i)
t = t[:i] + '''# %% tags=["panel"]
from tessera_lab.ui.dynamic_panel import dynamic_panel

panel, controls, state = dynamic_panel(costs, ep=EP, microbatches=MICROBATCHES, skew=SKEW, seed=SEEDS[0])
panel

''' + t[j:]
t = re.sub(r"INTERACTIVE = True *# show the skew slider\n", "", t)
t = t.replace("The callback only calls `run_dynamic`", "The panel only calls `run_dynamic`")
# 2. section 6: the headline
i = t.index("# %%\nif USE_MODEL:\n    model_costs, model_res = costs, res")
j = t.index("cmp = pd.DataFrame(", i)
t = t[:i] + '''# %%
from tessera_lab.report import headline

model_res = headline.dynamic_headline()
print(f"dynamic gain (headline): {headline.dynamic_gain(model_res):+.2%}")
''' + t[j:]
t = re.sub(r'print\("reported: Tessera paper, dynamic-only ablation \(data/paper/tessera_paper_reported.json\); "\n'
           r'\s+f"simulated: \{model_costs.description\}.*?\n\s+"static plan 1F1B"\)',
           'print("reported: Tessera paper, dynamic-only ablation (data/paper/tessera_paper_reported.json); "\n'
           '      f"simulated: {headline.DYNAMIC_HEADLINE}, analytic stage costs")', t, flags=re.S)
md_old = t[t.index("# The paper's numbers come from a 6,144-GPU production job"):t.index("# %%\nfrom tessera_lab.report import headline")]
t = t.replace(md_old, '''# The paper's numbers come from a 6,144-GPU production job on an internal model. The synthetic stage times above
# (F = 1 s) are not in any real unit, so milliseconds from them mean nothing beside the paper's 641 ms, and their
# gains are those of a **toy pipeline**. The comparison with the paper is the library's one dynamic-gain headline,
# `tessera_lab.report.headline.dynamic_headline` (the same call `tessera-lab reproduce` makes): Qwen3-Next-80B-A3B
# stage costs from the analytic cost model (H200, default parallel sizes), `zipf:0.5` routing, static plan 1F1B,
# 16 micro-batches; gain `T_static / T_dynamic - 1` (`headline.dynamic_gain`). Compare the shape (a few percent,
# from filling gaps with deferrable work), not the digits.

''')
# 3. the panel's setup cell
lines = t.split("\n")
s = next(k for k, l in enumerate(lines) if "costs = " in l and "StageCosts.synthetic" in l)
h = max(k for k in range(s) if lines[k].startswith("# %%"))
lines[h] = '# %% tags=["panel-setup"]'
out.write_text("\n".join(lines))
print("ported", out)
