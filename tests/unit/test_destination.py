"""Destination values resolved into endpoints (`ssh/destination.py`): ProxyJump hops, `user@` and
`[host]:port` forms, the name a host key is stored under, and bad destinations refused without echoing them."""

from __future__ import annotations

from pathlib import Path

import pytest

from narwhal_assets.core.errors import InputError
from narwhal_assets.ssh.destination import resolve_endpoint


def test_destination_resolution_follows_config_include_and_proxyjump(tmp_path: Path) -> None:
    included = tmp_path / "conf.d" / "fleet.conf"
    included.parent.mkdir()
    included.write_text("Host gpu2\n  HostName 10.1.0.2\n  User svc\n  Port 2202\n  ProxyJump bastion\n")
    config = tmp_path / "config"
    config.write_text(
        f"Include {tmp_path}/conf.d/*.conf\n"
        f"Host bastion\n  HostName 10.1.0.1\n  User jump\n  IdentityFile {tmp_path}/id\n  IdentitiesOnly yes\n"
    )
    endpoint = resolve_endpoint("gpu2", config)
    assert (endpoint.host, endpoint.port, endpoint.user) == ("10.1.0.2", 2202, "svc")
    [jump] = endpoint.hops()
    assert (jump.host, jump.user, jump.identities_only, jump.identity_files) == (
        "10.1.0.1", "jump", True, (f"{tmp_path}/id",),
    )  # fmt: skip
    assert resolve_endpoint("ops@gpu2", config).user == "ops"
    plain = resolve_endpoint("root@[198.18.0.9]:2200", None)
    assert (plain.host, plain.port, plain.user, plain.hops()) == ("198.18.0.9", 2200, "root", [])


@pytest.mark.parametrize("bad", ["-oProxyCommand=x", "a b", "", "h@[x]:99999"])
def test_bad_destinations_are_refused_without_echoing_them(bad: str) -> None:
    with pytest.raises(InputError) as caught:
        resolve_endpoint(bad, None)
    assert bad not in str(caught.value) or bad == ""


def test_host_key_alias_names_the_store_entry_whatever_the_port(tmp_path: Path) -> None:
    """What real ssh records (checked by hand with OpenSSH 9.2 and in tests/fleet): the lowercased alias
    alone, never `[alias]:port`; without an alias, `[host]:port` off port 22."""
    config = tmp_path / "config"
    config.write_text("Host a\n  HostName 10.0.0.1\n  Port 2222\n  HostKeyAlias Gpu-Alias\nHost b\n  HostName 10.0.0.2"
                      "\n  Port 2222\n")  # fmt: skip
    aliased, plain = resolve_endpoint("a", config), resolve_endpoint("b", config)
    assert (aliased.known_host, aliased.known_hosts_names) == (("gpu-alias", 22), ("gpu-alias",))
    assert plain.known_hosts_names == ("[10.0.0.2]:2222",)
