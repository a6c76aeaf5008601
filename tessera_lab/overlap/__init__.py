"""tessera_lab.overlap."""
