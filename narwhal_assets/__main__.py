"""`python -m narwhal_assets` is the `deploy-hosts` command line."""

from narwhal_assets.cli import main

raise SystemExit(main())
