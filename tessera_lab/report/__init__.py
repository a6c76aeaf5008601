"""tessera_lab.report."""
