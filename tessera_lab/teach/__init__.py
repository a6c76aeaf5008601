"""tessera_lab.teach."""
