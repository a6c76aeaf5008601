"""tessera_lab.cost."""
