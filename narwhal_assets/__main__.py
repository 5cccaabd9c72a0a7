"""`python -m narwhal_assets` is the `deploy-hosts` command line."""

from narwhal_assets.cli.entry import command

raise SystemExit(command())
