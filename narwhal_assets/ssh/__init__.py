"""SSH adapters: destination resolution, the checkout-local trust store, paramiko transport, OpenSSH exec."""
