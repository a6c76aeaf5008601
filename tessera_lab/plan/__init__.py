"""tessera_lab.plan."""
