"""What the paramiko transport does with an `ssh -G` answer's options (`ssh/policy.py`): every option the config
sets that these connections override or do not use is listed, so an operator sees what is not applied."""

from __future__ import annotations

from pathlib import Path

from narwhal_assets.ssh.destination import resolve_endpoint


def test_not_applied_lists_what_the_config_sets_and_these_connections_override(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text("Host a\n  HostName 10.0.0.1\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n"
                      "  ForwardAgent yes\n  SendEnv LANG LC_*\n  GSSAPIAuthentication yes\n")  # fmt: skip
    endpoint = resolve_endpoint("a", config)
    assert endpoint.refusal() is None
    listed = {(n.option, n.value) for n in endpoint.not_applied}
    # OpenSSH turns UpdateHostKeys off itself when UserKnownHostsFile is not its default
    assert listed == {("StrictHostKeyChecking", "false"), ("UserKnownHostsFile", "/dev/null"),
                      ("UpdateHostKeys", "false"),
                      ("ForwardAgent", "yes"), ("SendEnv", "LANG"), ("SendEnv", "LC_*"),
                      ("GSSAPIAuthentication", "yes")}  # fmt: skip
