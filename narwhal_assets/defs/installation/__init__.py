"""The `installation` group: `host_installation` per host, its checks and live status."""
