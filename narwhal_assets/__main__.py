"""`python -m narwhal_assets` is the `deploy-hosts` command line."""

from narwhal_assets.cli.main import main

raise SystemExit(main())
