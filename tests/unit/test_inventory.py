"""Host inventory: grouping by destination, validation rules with their messages, the file format."""

from __future__ import annotations

import hashlib
import json
import stat
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from narwhal_assets.core.errors import InputError
from narwhal_assets.core.inputs.inventory import (
    HostEntry,
    Inventory,
    derive_inventory,
    destination_variables,
    engine_number,
    load_inventory,
    validate_inventory,
)
from narwhal_assets.core.inputs.settings import Settings
from narwhal_assets.local.checkout import Checkout

# Destination values and passwords are sentinels: none may ever appear in a file or message.
A = "SENTINEL-DEST-a@mgmt-a.example"
B = "SENTINEL-DEST-b@mgmt-b.example"
C = "SENTINEL-DEST-c-alias"
PW = "SENTINEL-PW-hunter2"
SRC = "hosts.json"


def load(tmp_path: Path, variables: dict[str, str], dotenv: bool = True) -> Settings:
    """Settings for a checkout whose `.env` (or process environment) holds `variables`."""
    if dotenv:
        text = "".join(f"{name}='{value}'\n" for name, value in variables.items())
        (tmp_path / ".env").write_text(text, encoding="utf-8")
        return Settings.load(tmp_path, environ={})
    return Settings.load(tmp_path, environ=variables)


def layout(inventory: Inventory) -> list[tuple[str, str, str | None, list[str]]]:
    return [(h.id, h.ssh_env, h.password_env, h.roles) for h in inventory.hosts]


def host(id_: str, ssh_env: str, roles: list[str], password_env: str | None = None) -> HostEntry:
    return HostEntry(id=id_, ssh_env=ssh_env, password_env=password_env, roles=roles)


def problems_of(inventory: Inventory, s: Settings) -> list[str]:
    with pytest.raises(InputError) as info:
        validate_inventory(inventory, s, SRC)
    return info.value.problems


# --- derive_inventory -----------------------------------------------------------------------------------


def test_example_router_and_engine_1_on_one_machine_engine_2_on_another(tmp_path: Path) -> None:
    s = load(tmp_path, {"NARWHAL_NODE_1_SSH": A, "NARWHAL_NODE_2_SSH": B})
    inv = derive_inventory(s)
    assert layout(inv) == [
        ("node-1", "NARWHAL_NODE_1_SSH", None, ["router", "engine-1"]),
        ("node-2", "NARWHAL_NODE_2_SSH", None, ["engine-2"]),
    ]
    validate_inventory(inv, s, SRC)
    assert inv.host_for_role("router").id == "node-1"
    assert inv.host_for_role("engine-2").id == "node-2"


def test_router_equal_to_engine_1_is_colocated(tmp_path: Path) -> None:
    s = load(tmp_path, {"NARWHAL_ROUTER_SSH": A, "NARWHAL_NODE_1_SSH": A, "NARWHAL_NODE_2_SSH": B})
    assert layout(derive_inventory(s)) == [
        ("node-1", "NARWHAL_NODE_1_SSH", None, ["router", "engine-1"]),
        ("node-2", "NARWHAL_NODE_2_SSH", None, ["engine-2"]),
    ]


def test_router_follows_its_destination_not_engine_1(tmp_path: Path) -> None:
    s = load(tmp_path, {"NARWHAL_ROUTER_SSH": B, "NARWHAL_NODE_1_SSH": A, "NARWHAL_NODE_2_SSH": B})
    assert layout(derive_inventory(s)) == [
        ("node-1", "NARWHAL_NODE_1_SSH", None, ["engine-1"]),
        ("node-2", "NARWHAL_NODE_2_SSH", None, ["router", "engine-2"]),
    ]


def test_router_only_host(tmp_path: Path) -> None:
    s = load(tmp_path, {"NARWHAL_ROUTER_SSH": C, "NARWHAL_NODE_1_SSH": A, "NARWHAL_NODE_2_SSH": B})
    inv = derive_inventory(s)
    assert layout(inv) == [
        ("router", "NARWHAL_ROUTER_SSH", None, ["router"]),
        ("node-1", "NARWHAL_NODE_1_SSH", None, ["engine-1"]),
        ("node-2", "NARWHAL_NODE_2_SSH", None, ["engine-2"]),
    ]
    validate_inventory(inv, s, SRC)


def test_engines_with_identical_destinations_share_a_host_named_after_the_lowest(tmp_path: Path) -> None:
    s = load(
        tmp_path,
        {"NARWHAL_NODE_10_SSH": B, "NARWHAL_NODE_3_SSH": A, "NARWHAL_NODE_2_SSH": B, "NARWHAL_NODE_4_SSH": A},
        dotenv=False,
    )
    inv = derive_inventory(s)
    # The router joins the lowest engine (engine-2) when NARWHAL_ROUTER_SSH is unset.
    assert layout(inv) == [
        ("node-2", "NARWHAL_NODE_2_SSH", None, ["router", "engine-2", "engine-10"]),
        ("node-3", "NARWHAL_NODE_3_SSH", None, ["engine-3", "engine-4"]),
    ]
    assert inv.host_for_role("router").id == "node-2"
    assert inv.engine_numbers() == [2, 3, 4, 10]
    assert inv.host_ids() == ["node-2", "node-3"]
    validate_inventory(inv, s, SRC)


def test_empty_and_malformed_destination_variables_are_errors_not_dropped_engines(tmp_path: Path) -> None:
    """An empty `NARWHAL_NODE_2_SSH=` used to drop engine-2 silently; so did a misspelt engine number."""
    variables = {
        "NARWHAL_NODE_1_SSH": A,
        "NARWHAL_NODE_2_SSH": "",
        "NARWHAL_NODE_03_SSH": B,
        "NARWHAL_NODE_X_SSH": B,
        "NARWHAL_NODE_1234567_SSH": B,
        "NARWHAL_NODE_1_SSH_PASSWORD": PW,
    }
    s = load(tmp_path, variables)
    assert destination_variables(s) == {"engine-1": "NARWHAL_NODE_1_SSH"}
    env = tmp_path.resolve() / ".env"
    bad_name = (
        "is not a destination variable (NARWHAL_ROUTER_SSH or NARWHAL_NODE_<n>_SSH, n in 1..999999 without "
        "leading zeros); rename or remove it"
    )
    expected = [
        f"{env}: NARWHAL_NODE_03_SSH {bad_name}",
        f"{env}: NARWHAL_NODE_1234567_SSH {bad_name}",
        f"{env}: NARWHAL_NODE_2_SSH is set but empty, which would drop role engine-2; give it a destination or "
        "remove it",
        f"{env}: NARWHAL_NODE_X_SSH {bad_name}",
    ]
    with pytest.raises(InputError) as info:
        derive_inventory(s)
    assert info.value.problems == expected
    # A saved inventory is held to the same rule, and the process environment is named as the source.
    saved = Inventory(hosts=[host("node-1", "NARWHAL_NODE_1_SSH", ["router", "engine-1"])])
    (tmp_path / "process").mkdir()
    s = load(tmp_path / "process", {"NARWHAL_NODE_1_SSH": A, "NARWHAL_NODE_2_SSH": ""}, dotenv=False)
    assert problems_of(saved, s) == [
        "process environment: NARWHAL_NODE_2_SSH is set but empty, which would drop role engine-2; give it a "
        "destination or remove it"
    ]
    assert "SENTINEL" not in str(info.value)


def test_password_env_is_set_when_the_password_variable_exists(tmp_path: Path) -> None:
    s = load(
        tmp_path,
        {
            "NARWHAL_ROUTER_SSH": C,
            "NARWHAL_ROUTER_SSH_PASSWORD": PW,
            "NARWHAL_NODE_1_SSH": A,
            "NARWHAL_NODE_1_SSH_PASSWORD": PW,
            "NARWHAL_NODE_2_SSH": B,
        },
    )
    assert [(h.id, h.password_env) for h in derive_inventory(s).hosts] == [
        ("router", "NARWHAL_ROUTER_SSH_PASSWORD"),
        ("node-1", "NARWHAL_NODE_1_SSH_PASSWORD"),
        ("node-2", None),
    ]


def test_password_env_of_a_colocated_role_counts_for_its_host(tmp_path: Path) -> None:
    s = load(
        tmp_path,
        {
            "NARWHAL_ROUTER_SSH": A,
            "NARWHAL_ROUTER_SSH_PASSWORD": PW,
            "NARWHAL_NODE_1_SSH": A,
            "NARWHAL_NODE_2_SSH": B,
            "NARWHAL_NODE_3_SSH": B,
            "NARWHAL_NODE_3_SSH_PASSWORD": PW,
        },
    )
    assert [(h.id, h.password_env) for h in derive_inventory(s).hosts] == [
        ("node-1", "NARWHAL_ROUTER_SSH_PASSWORD"),
        ("node-2", "NARWHAL_NODE_3_SSH_PASSWORD"),
    ]


def test_the_host_s_own_password_variable_wins(tmp_path: Path) -> None:
    s = load(
        tmp_path,
        {
            "NARWHAL_NODE_1_SSH": A,
            "NARWHAL_NODE_2_SSH": A,
            "NARWHAL_NODE_2_SSH_PASSWORD": PW,
            "NARWHAL_NODE_1_SSH_PASSWORD": PW,
        },
    )
    assert derive_inventory(s).hosts[0].password_env == "NARWHAL_NODE_1_SSH_PASSWORD"


@pytest.mark.parametrize("variables", [{}, {"NARWHAL_ROUTER_SSH": A}, {"NARWHAL_NODE_1_SSH_PASSWORD": PW}])
def test_no_engine_destination_is_an_error(tmp_path: Path, variables: dict[str, str]) -> None:
    s = load(tmp_path, variables)
    with pytest.raises(InputError) as info:
        derive_inventory(s)
    assert info.value.problems == [f"{tmp_path.resolve() / '.env'}: no NARWHAL_NODE_<n>_SSH destination is set"]


def test_saved_inventory_holds_names_only_and_is_private(tmp_path: Path) -> None:
    s = load(
        tmp_path,
        {
            "NARWHAL_ROUTER_SSH": C,
            "NARWHAL_ROUTER_SSH_PASSWORD": PW,
            "NARWHAL_NODE_1_SSH": A,
            "NARWHAL_NODE_1_SSH_PASSWORD": PW + "-1",
            "NARWHAL_NODE_2_SSH": B,
        },
    )
    inv = Checkout.from_settings(s).inventory
    digest = Checkout(s, inv, False).save_inventory()
    path = tmp_path / "config" / "hosts.local.json"
    raw = path.read_bytes()
    assert b"SENTINEL" not in raw
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert digest == hashlib.sha256(raw).hexdigest()
    doc = json.loads(raw)
    assert doc["schema"] == "narwhal.hosts" and doc["schema_version"] == 1
    assert doc["hosts"][0] == {
        "id": "router",
        "ssh_env": "NARWHAL_ROUTER_SSH",
        "password_env": "NARWHAL_ROUTER_SSH_PASSWORD",
        "roles": ["router"],
    }
    assert load_inventory(path) == inv
    # Once saved, the file is what every command uses (validated against the current .env).
    assert Checkout.from_settings(Settings.load(tmp_path, environ={})).inventory == inv


def test_saved_inventory_wins_over_derivation_and_is_validated(tmp_path: Path) -> None:
    s = load(tmp_path, {"NARWHAL_NODE_1_SSH": A, "NARWHAL_NODE_2_SSH": B})
    Checkout(s, Inventory(hosts=[host("box", "NARWHAL_NODE_1_SSH", ["router", "engine-1"])]), False).save_inventory()
    path = tmp_path.resolve() / "config" / "hosts.local.json"
    with pytest.raises(InputError) as info:
        Checkout.from_settings(s)
    assert info.value.problems == [
        f"{path}: hosts: NARWHAL_NODE_2_SSH is set but no host owns role 'engine-2'; add it to the entry of "
        "its machine (or remove the file to derive the inventory again)"
    ]
    assert all("SENTINEL" not in p for p in info.value.problems)


def test_derived_inventory_problems_name_env_as_source(tmp_path: Path) -> None:
    s = load(tmp_path, {"NARWHAL_NODE_1_SSH": A, "NARWHAL_NODE_1_SSH_PASSWORD": ""})
    with pytest.raises(InputError) as info:
        Checkout.from_settings(s)
    assert info.value.problems == [
        f"{tmp_path.resolve() / '.env'} (derived inventory): hosts[0].password_env: variable "
        "NARWHAL_NODE_1_SSH_PASSWORD is unset or empty (set it in .env)"
    ]


_DESTS = st.sampled_from([A, B, C, "SENTINEL-DEST-d"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    engines=st.dictionaries(st.integers(1, 12), _DESTS, min_size=1, max_size=6),
    router=st.one_of(st.none(), _DESTS),
    passwords=st.sets(st.integers(0, 12), max_size=3),
)
def test_derivation_groups_exactly_by_destination(
    tmp_path: Path, engines: dict[int, str], router: str | None, passwords: set[int]
) -> None:
    env = {f"NARWHAL_NODE_{n}_SSH": dest for n, dest in engines.items()}
    if router is not None:
        env["NARWHAL_ROUTER_SSH"] = router
    for n in passwords:
        env[(f"NARWHAL_NODE_{n}_SSH" if n else "NARWHAL_ROUTER_SSH") + "_PASSWORD"] = PW
    s = load(tmp_path, env, dotenv=False)
    inv = derive_inventory(s)
    validate_inventory(inv, s, SRC)
    assert "SENTINEL" not in inv.to_json()
    lowest = min(engines)
    router_dest = engines[lowest] if router is None else router

    def dest(role: str) -> str:
        number = engine_number(role)
        return router_dest if number is None else engines[number]

    assert sorted(r for h in inv.hosts for r in h.roles) == sorted(["router", *(f"engine-{n}" for n in engines)])
    seen = set()
    for entry in inv.hosts:
        destinations = {dest(r) for r in entry.roles}
        assert len(destinations) == 1  # one machine per entry ...
        assert s.get(entry.ssh_env) in destinations
        seen |= destinations
        numbers = entry.engine_numbers()
        assert entry.id == (f"node-{numbers[0]}" if numbers else "router")
        assert entry.roles == sorted(entry.roles, key=lambda r: engine_number(r) or 0)
        if entry.password_env is not None:
            assert entry.password_env in env
    assert len(seen) == len(inv.hosts)  # ... and one entry per machine
    if router is None or router == engines[lowest]:
        assert inv.host_for_role("router") is inv.host_for_role(f"engine-{lowest}")


# --- validate_inventory ---------------------------------------------------------------------------------

ENV_OK = {"NARWHAL_NODE_1_SSH": A, "NARWHAL_NODE_2_SSH": B}


def test_valid_hand_written_inventory(tmp_path: Path) -> None:
    s = load(tmp_path, {**ENV_OK, "NARWHAL_ROUTER_SSH_PASSWORD": PW, "NARWHAL_NODE_3_SSH": C, "NARWHAL_NODE_4_SSH": C})
    inv = Inventory(
        hosts=[
            # Any role's destination variable may name the host, and any of them + _PASSWORD its password.
            host("gpu-a", "NARWHAL_NODE_1_SSH", ["engine-1", "router"], password_env="NARWHAL_ROUTER_SSH_PASSWORD"),
            host("gpu-b", "NARWHAL_NODE_2_SSH", ["engine-2"]),
            host("gpu-c", "NARWHAL_NODE_4_SSH", ["engine-3", "engine-4"]),
        ]
    )
    validate_inventory(inv, s, SRC)


@pytest.mark.parametrize(
    ("hosts", "extra_env", "message"),
    [
        (
            [host("n", "NARWHAL_NODE_1_SSH", ["router", "engine-1"]), host("n", "NARWHAL_NODE_2_SSH", ["engine-2"])],
            {},
            "hosts.json: hosts[1].id: duplicate host id 'n'",
        ),
        (
            [
                host("n1", "NARWHAL_NODE_1_SSH", ["router", "engine-1", "engine-3"]),
                host("n2", "NARWHAL_NODE_2_SSH", ["engine-2", "engine-3"]),
            ],
            {},
            "hosts.json: hosts[1].roles: role 'engine-3' is already owned by host 'n1'",
        ),
        (
            [host("n1", "NARWHAL_NODE_1_SSH", ["engine-1"]), host("n2", "NARWHAL_NODE_2_SSH", ["engine-2"])],
            {},
            "hosts.json: hosts: no host owns the 'router' role",
        ),
        (
            [host("n1", "NARWHAL_ROUTER_SSH", ["router"])],
            {"NARWHAL_NODE_1_SSH": None, "NARWHAL_NODE_2_SSH": None, "NARWHAL_ROUTER_SSH": A},
            "hosts.json: hosts: no host owns an 'engine-<n>' role",
        ),
        (
            [
                host("n1", "NARWHAL_NODE_1_SSH", ["router", "engine-1", "gpu"]),
                host("n2", "NARWHAL_NODE_2_SSH", ["engine-2"]),
            ],
            {},
            "hosts.json: hosts[0].roles: 'gpu' is neither 'router' nor 'engine-<n>'",
        ),
        (
            [
                host("n1", "NARWHAL_NODE_1_SSH", ["router", "engine-1"]),
                host("n2", "NARWHAL_NODE_2_SSH", ["engine-2", "engine-02"]),
            ],
            {},
            "hosts.json: hosts[1].roles: 'engine-02' is neither 'router' nor 'engine-<n>'",
        ),
        (
            [
                host("Node_1", "NARWHAL_NODE_1_SSH", ["router", "engine-1"]),
                host("n2", "NARWHAL_NODE_2_SSH", ["engine-2"]),
            ],
            {},
            "hosts.json: hosts[0].id: 'Node_1' must be lowercase letters, digits and '-' (<= 63)",
        ),
        (
            [
                host("n1", "NARWHAL_NODE_1_SSH", ["router", "engine-1"]),
                host("x" * 64, "NARWHAL_NODE_2_SSH", ["engine-2"]),
            ],
            {},
            f"hosts.json: hosts[1].id: '{'x' * 64}' must be lowercase letters, digits and '-' (<= 63)",
        ),
        (
            [host("n1", "NARWHAL_NODE_1_SSH", ["router", "engine-1"]), host("n2", "NARWHAL_NODE_2_SSH", ["engine-2"])],
            {"NARWHAL_NODE_2_SSH": None},
            "hosts.json: hosts[1].ssh_env: variable NARWHAL_NODE_2_SSH is unset or empty (set it in .env)",
        ),
        (
            [host("n1", "NARWHAL_NODE_1_SSH", ["router", "engine-1"]), host("n2", "NARWHAL_NODE_2_SSH", ["engine-2"])],
            {"NARWHAL_NODE_2_SSH": ""},
            "{env}: NARWHAL_NODE_2_SSH is set but empty, which would drop role engine-2; give it a destination or "
            "remove it",
        ),
        # A password (or any other variable) named as a destination would travel as a host name.
        (
            [
                host("n1", "NARWHAL_NODE_1_SSH", ["router", "engine-1"]),
                host("n2", "NARWHAL_NODE_2_SSH_PASSWORD", ["engine-2"]),
            ],
            {"NARWHAL_NODE_2_SSH_PASSWORD": PW},
            "hosts.json: hosts[1].ssh_env: must be the destination variable of a role of host 'n2' "
            "(NARWHAL_NODE_2_SSH)",
        ),
        (
            [host("n1", "NARWHAL_NODE_1_SSH", ["router", "engine-1"]), host("n2", "SECRET_TOKEN", ["engine-2"])],
            {"SECRET_TOKEN": PW},
            "hosts.json: hosts[1].ssh_env: must be the destination variable of a role of host 'n2' "
            "(NARWHAL_NODE_2_SSH)",
        ),
        (
            [host("n1", "NARWHAL_ROUTER_SSH", ["engine-1"]), host("n2", "NARWHAL_NODE_2_SSH", ["router", "engine-2"])],
            {"NARWHAL_ROUTER_SSH": B},
            "hosts.json: hosts[0].ssh_env: must be the destination variable of a role of host 'n1' "
            "(NARWHAL_NODE_1_SSH)",
        ),
        (
            [host("n1", "NARWHAL_NODE_1_SSH", ["router", "engine-1"]), host("n2", "NARWHAL_NODE_1_SSH", ["engine-2"])],
            {"NARWHAL_NODE_2_SSH": None},
            "hosts.json: hosts[1].ssh_env: must be the destination variable of a role of host 'n2' "
            "(NARWHAL_NODE_2_SSH)",
        ),
        (
            [host("n1", "NARWHAL_NODE_1_SSH", ["router", "engine-1"]), host("Bad Id", "X", ["gpu"])],
            {"NARWHAL_NODE_2_SSH": None, "X": A},
            "hosts.json: hosts[1].id: 'Bad Id' must be lowercase letters, digits and '-' (<= 63)\n"
            "hosts.json: hosts[1].roles: 'gpu' is neither 'router' nor 'engine-<n>'\n"
            "hosts.json: hosts[1].ssh_env: must be the destination variable of a role of this host "
            "(none: it owns no valid role)",
        ),
        (
            [
                host("n1", "NARWHAL_NODE_1_SSH", ["router", "engine-1"], password_env="NARWHAL_NODE_1_SSH_PASSWORD"),
                host("n2", "NARWHAL_NODE_2_SSH", ["engine-2"]),
            ],
            {},
            "hosts.json: hosts[0].password_env: variable NARWHAL_NODE_1_SSH_PASSWORD is unset or empty "
            "(set it in .env)",
        ),
        (
            [
                host("n1", "NARWHAL_NODE_1_SSH", ["router", "engine-1"]),
                host("n2", "NARWHAL_NODE_2_SSH", ["engine-2"], password_env="NARWHAL_NODE_2_SSH_PASSWORD"),
            ],
            {"NARWHAL_NODE_2_SSH_PASSWORD": ""},
            "hosts.json: hosts[1].password_env: variable NARWHAL_NODE_2_SSH_PASSWORD is unset or empty "
            "(set it in .env)",
        ),
        # A password of another host, a destination, or an unrelated variable is not this host's password.
        (
            [
                host("n1", "NARWHAL_NODE_1_SSH", ["router", "engine-1"]),
                host("n2", "NARWHAL_NODE_2_SSH", ["engine-2"], password_env="NARWHAL_NODE_1_SSH_PASSWORD"),
            ],
            {"NARWHAL_NODE_1_SSH_PASSWORD": PW},
            "hosts.json: hosts[1].password_env: must be the password variable of a role of host 'n2' "
            "(NARWHAL_NODE_2_SSH_PASSWORD)",
        ),
        (
            [
                host("n1", "NARWHAL_NODE_1_SSH", ["router", "engine-1"], password_env="NARWHAL_NODE_1_SSH"),
                host("n2", "NARWHAL_NODE_2_SSH", ["engine-2"], password_env="SECRET_TOKEN"),
            ],
            {"SECRET_TOKEN": PW},
            "hosts.json: hosts[0].password_env: must be the password variable of a role of host 'n1' "
            "(NARWHAL_ROUTER_SSH_PASSWORD or NARWHAL_NODE_1_SSH_PASSWORD)\n"
            "hosts.json: hosts[1].password_env: must be the password variable of a role of host 'n2' "
            "(NARWHAL_NODE_2_SSH_PASSWORD)",
        ),
        (
            [host("n1", "NARWHAL_NODE_1_SSH", ["router", "engine-1"]), host("n2", "NARWHAL_NODE_2_SSH", ["engine-2"])],
            {"NARWHAL_NODE_2_SSH": A},
            "hosts.json: hosts[1].ssh_env: NARWHAL_NODE_2_SSH has the same destination as host 'n1'; put all "
            "roles of one machine in one entry",
        ),
        (
            [host("n1", "NARWHAL_NODE_1_SSH", ["router", "engine-1"]), host("n2", "NARWHAL_NODE_2_SSH", ["engine-2"])],
            {"NARWHAL_NODE_3_SSH": C},
            "hosts.json: hosts: NARWHAL_NODE_3_SSH is set but no host owns role 'engine-3'; add it to the entry "
            "of its machine (or remove the file to derive the inventory again)",
        ),
        (
            [host("n1", "NARWHAL_NODE_1_SSH", ["router", "engine-1", "engine-2"])],
            {},
            "hosts.json: hosts[0].roles: 'engine-2' has its own destination NARWHAL_NODE_2_SSH, which differs "
            "from the host's NARWHAL_NODE_1_SSH; move the role to its machine's entry or give both the same "
            "destination",
        ),
        (
            [host("n1", "NARWHAL_NODE_1_SSH", ["router", "engine-1"]), host("n2", "NARWHAL_NODE_2_SSH", ["engine-2"])],
            {"NARWHAL_ROUTER_SSH": C},
            "hosts.json: hosts[0].roles: 'router' has its own destination NARWHAL_ROUTER_SSH, which differs "
            "from the host's NARWHAL_NODE_1_SSH; move the role to its machine's entry or give both the same "
            "destination",
        ),
    ],
)
def test_each_rule_has_its_message(
    tmp_path: Path, hosts: list[HostEntry], extra_env: dict[str, str | None], message: str
) -> None:
    """One inventory, one problem (or several, one per line); `None` in `extra_env` unsets a variable."""
    variables = {name: value for name, value in {**ENV_OK, **extra_env}.items() if value is not None}
    s = load(tmp_path, variables)
    problems = problems_of(Inventory(hosts=hosts), s)
    assert problems == message.format(env=tmp_path.resolve() / ".env").split("\n")
    assert "SENTINEL" not in "\n".join(problems)


@pytest.mark.parametrize("field", ["ssh_env", "password_env"])
def test_a_value_pasted_instead_of_a_variable_name_is_not_echoed(tmp_path: Path, field: str) -> None:
    s = load(tmp_path, ENV_OK)
    pasted = A if field == "ssh_env" else PW
    fields = {"ssh_env": "NARWHAL_NODE_1_SSH", "password_env": None, field: pasted}
    inv = Inventory(
        hosts=[
            HostEntry(id="n1", roles=["router", "engine-1"], **fields),
            host("n2", "NARWHAL_NODE_2_SSH", ["engine-2"]),
        ]
    )
    problems = problems_of(inv, s)
    kind = "destination" if field == "ssh_env" else "password"
    suffix = "" if field == "ssh_env" else "_PASSWORD"
    assert problems == [
        f"hosts.json: hosts[0].{field}: must be the {kind} variable of a role of host 'n1' "
        f"(NARWHAL_ROUTER_SSH{suffix} or NARWHAL_NODE_1_SSH{suffix})"
    ]


def test_multiple_problems_are_reported_together(tmp_path: Path) -> None:
    s = load(tmp_path, {**ENV_OK, "NARWHAL_NODE_3_SSH": C})
    inv = Inventory(
        hosts=[
            host("n1", "NARWHAL_NODE_1_SSH", ["engine-1", "Router"]),
            host("n1", "NARWHAL_NODE_1_SSH", ["engine-1"], password_env="NARWHAL_NODE_1_SSH_PASSWORD"),
            host("n3", "NARWHAL_NODE_2_SSH", ["engine-2"]),
            host("n4", "NARWHAL_NODE_1_SSH", ["engine-4"]),
        ]
    )
    assert problems_of(inv, s) == [
        "hosts.json: hosts[0].roles: 'Router' is neither 'router' nor 'engine-<n>'",
        "hosts.json: hosts[1].id: duplicate host id 'n1'",
        "hosts.json: hosts[1].roles: role 'engine-1' is already owned by host 'n1'",
        "hosts.json: hosts[1].password_env: variable NARWHAL_NODE_1_SSH_PASSWORD is unset or empty (set it in .env)",
        "hosts.json: hosts[1].ssh_env: NARWHAL_NODE_1_SSH has the same destination as host 'n1'; put all roles "
        "of one machine in one entry",
        "hosts.json: hosts[3].ssh_env: must be the destination variable of a role of host 'n4' (NARWHAL_NODE_4_SSH)",
        "hosts.json: hosts: NARWHAL_NODE_3_SSH is set but no host owns role 'engine-3'; add it to the entry "
        "of its machine (or remove the file to derive the inventory again)",
        "hosts.json: hosts: no host owns the 'router' role",
    ]
    assert all("SENTINEL" not in p for p in problems_of(inv, s))


# --- the file format ------------------------------------------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hosts.json"
    path.write_text(text, encoding="utf-8")
    return path


def test_load_inventory_missing(tmp_path: Path) -> None:
    with pytest.raises(InputError) as info:
        load_inventory(tmp_path / "nope.json")
    assert info.value.problems == [
        f"{tmp_path / 'nope.json'}: inventory not found (run `deploy-hosts plan` to derive it)"
    ]


def test_load_inventory_invalid_json_names_position_not_content(tmp_path: Path) -> None:
    path = write(tmp_path, '{"hosts": [\n  {"id": "n1", "ssh_env": ' + A + "}\n]}\n")
    with pytest.raises(InputError) as info:
        load_inventory(path)
    assert info.value.problems == [f"{path}: line 2 column 27: not valid JSON: Expecting value"]


def test_load_inventory_reads_at_most_the_size_limit(tmp_path: Path) -> None:
    inv = Inventory(hosts=[host("node-1", "NARWHAL_NODE_1_SSH", ["router", "engine-1"])])
    text = inv.to_json()
    path = write(tmp_path, text + " " * ((1 << 20) - len(text)))
    assert load_inventory(path) == inv
    path = write(tmp_path, text + " " * ((1 << 20) - len(text) + 1))
    with pytest.raises(InputError) as info:
        load_inventory(path)
    assert info.value.problems == [f"{path}: larger than 1048576 bytes (see docs/limits.md)"]


def test_load_inventory_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "hosts.json"
    path.write_bytes(b'{"hosts": ["\xff"]}')
    with pytest.raises(InputError) as info:
        load_inventory(path)
    assert info.value.problems == [f"{path}: not a readable JSON inventory (UnicodeDecodeError)"]


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ([], ["(top level): Input should be a valid dictionary or instance of Inventory"]),
        ({}, ["hosts: Field required"]),
        ({"hosts": A}, ["hosts: Input should be a valid list"]),
        (
            {"schema": A, "schema_version": 2, "hosts": [], "destinations": {"n1": A}},
            [
                "schema: Input should be 'narwhal.hosts'",
                "schema_version: Input should be 1",
                "destinations: Extra inputs are not permitted",
            ],
        ),
        (
            {
                "hosts": [
                    {"id": "n1", "ssh_env": "NARWHAL_NODE_1_SSH", "roles": []},
                    {"id": 7, "roles": A, "password": PW},
                    {"id": "n3", "ssh_env": "X", "password_env": 5, "roles": ["router"]},
                ]
            },
            [
                "hosts[0].roles: List should have at least 1 item after validation, not 0",
                "hosts[1].id: Input should be a valid string",
                "hosts[1].ssh_env: Field required",
                "hosts[1].roles: Input should be a valid list",
                "hosts[1].password: Extra inputs are not permitted",
                "hosts[2].password_env: Input should be a valid string",
            ],
        ),
    ],
)
def test_load_inventory_wrong_schema(tmp_path: Path, doc: object, expected: list[str]) -> None:
    path = write(tmp_path, json.dumps(doc))
    with pytest.raises(InputError) as info:
        load_inventory(path)
    assert info.value.problems == [f"{path}: {line}" for line in expected]
    assert "SENTINEL" not in str(info.value)


def test_inventory_round_trip_and_helpers(tmp_path: Path) -> None:
    inv = Inventory(
        hosts=[
            host("node-1", "NARWHAL_NODE_1_SSH", ["router", "engine-1"], password_env="P"),
            host("node-2", "NARWHAL_NODE_2_SSH", ["engine-2", "engine-12"]),
        ]
    )
    path = write(tmp_path, inv.to_json())
    assert load_inventory(path) == inv
    assert inv.to_json().endswith("}\n")
    assert inv.host("node-2").engine_numbers() == [2, 12]
    assert inv.engine_numbers() == [1, 2, 12]
    with pytest.raises(InputError) as info:
        inv.host("node-9")
    assert info.value.problems == ["inventory: no host with id 'node-9' (known: node-1, node-2)"]
    with pytest.raises(InputError) as info:
        inv.host_for_role("engine-3")
    assert info.value.problems == ["inventory: no host owns role 'engine-3'"]


@pytest.mark.parametrize(
    ("role", "number"),
    [("engine-1", 1), ("engine-42", 42), ("engine-0", None), ("engine-01", None), ("router", None), ("engine-", None)],
)
def test_engine_number(role: str, number: int | None) -> None:
    assert engine_number(role) == number
