"""tessera_lab.dynamic."""
