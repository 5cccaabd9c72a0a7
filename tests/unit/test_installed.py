"""The rule shared by the installed-from-latest check and the re-verification schedule."""

from narwhal_assets.core.deployment.installed import CURRENT, NEVER, OUTDATED, HostState, Installed, compare_installed


def test_hosts_are_current_outdated_or_never_installed_in_host_order() -> None:
    old, new = Installed("a" * 32, "r1"), Installed("b" * 32, "r2")
    states = compare_installed("b" * 32, {"node-3": None, "node-1": new, "node-2": old})
    assert states == [HostState("node-1", CURRENT, new), HostState("node-2", OUTDATED, old),
                      HostState("node-3", NEVER, None)]  # fmt: skip
    assert compare_installed("b" * 32, {}) == []
