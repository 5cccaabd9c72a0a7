"""narwhal_assets: deployment inputs and per-host installation for a Narwhal inference fleet."""

__version__ = "0.1.0"
