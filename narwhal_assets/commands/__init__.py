"""`deploy-hosts` subcommands; each is a thin layer over the core, the adapters and the assets."""
