"""tessera-lab: a Jupyter-first workbench for pipeline-parallel training of hybrid MoE models.

Data flows one way: ``models`` -> ``tasks`` -> ``costs`` -> ``partition`` -> ``schedules`` ->
``simulate`` -> ``plan``/reports; the ``runner`` and the notebooks sit on top. Planning never imports
torch.
"""

from tessera_lab.errors import ConfigError, DeadlockError, InfeasiblePlanError, PartitionError, ScheduleError, TesseraError

__version__ = "0.1.0"

__all__ = [
    "ConfigError", "DeadlockError", "InfeasiblePlanError", "PartitionError", "ScheduleError", "TesseraError",
    "__version__",
]
