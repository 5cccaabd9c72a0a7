"""`deploy-hosts`: argument parsing and output, one module per command group."""
