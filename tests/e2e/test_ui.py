"""The Dagster UI in headless Chromium: `dagster dev` on a checkout wired to the simulated fleet, driven as an
operator would: the asset catalog, Materialize on the discovery group and on `deployment_manifest` (prepare),
a backfill of `host_installation` over every host's partition (one run: the fleet operation), its per-host
outcome and the fleet table it leaves on the asset, a backfill where one host fails (that partition, and only
it, Failed), the Automation page.

Screenshots go to `NARWHAL_UI_SCREENSHOTS` when set (scripts/ui-screenshots.sh: docs/ui), else the test's tmp dir.
Every expectation comes from the definitions (`defs`), not from a hard-coded list.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
from fleetsim import SimFleet
from helpers.dagster_dev import CHROMIUM, dagster_dev, require_browser, tail
from helpers.files import assert_nowhere
from helpers.fleet_checkout import DESTINATIONS, PASSWORD, set_env
from helpers.git_repo import git_checkout
from helpers.install import OFFLINE_CHECK, OFFLINE_INSTALL, manifest_of, partition_metadata, remote_dir
from playwright.sync_api import Browser, Locator, Page, expect, sync_playwright

from narwhal_assets.cli.main import main
from narwhal_assets.core.inputs.envfile import shell_quote
from narwhal_assets.core.prepared_run.manifest import DeploymentManifest
from narwhal_assets.definitions import defs as code_location
from narwhal_assets.defs.installation.assets import FLEET_COLUMNS
from narwhal_assets.defs.installation.status import CHECK_NAME as LIVE_CHECK
from narwhal_assets.defs.keys import DEPLOYMENT_MANIFEST, INSTALLATION
from narwhal_assets.defs.partitions import HOSTS_PARTITIONS_NAME, host_partitions
from narwhal_assets.defs.prepare.assets import latest_out
from narwhal_assets.local.privatefiles import write_private
from narwhal_assets.runtime.runner import DAGSTER_HOME_DEFAULT, instance_yaml

defs = code_location()  # the code location as Dagster loads it

pytestmark = pytest.mark.fleet
RUN_S = 600.0  # a run launched from the UI (discovery, prepare, the fleet install) on 2 busy cores
BACKFILL_S = 900.0  # the daemon's backfill: one run over every host, on the same 2 cores
LAUNCH_S = 180.0  # from the click until the launched run or backfill is in the instance
VIEWPORT = {"width": 1600, "height": 1000}  # the catalog renders only the rows in view
FLEET_VIEWPORT = {"width": 1280, "height": 800}  # the fleet table must be readable in a 1280 px window
GROUP_LINK = "a[starts-with(@href, '/asset-groups~group')]"  # XPath: a catalog row's link to its group
# Read before the fixtures clear NARWHAL_* from the environment.
SCREENSHOTS_DIR = os.environ.get("NARWHAL_UI_SCREENSHOTS")
# No name resolves: the browser reaches the webserver's 127.0.0.1 address and nothing else.
LOOPBACK_ONLY = "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"
GRAPH_VIEWPORT = {"width": 2400, "height": 760}  # the lineage graph draws full nodes only when zoomed in this far
GRAPH_NODE = "[class*='AssetNode_assetName']"  # one per asset drawn in a lineage graph
LOCATION = "narwhal_assets.definitions"  # workspace.yaml's python_module names the code location
RUN_DONE = re.compile(r"^(Success|Failure|Canceled)$")  # a run page's final status tag
BACKFILL_DONE = re.compile(r"^(Succeeded|Completed|Failed|Canceled)$")  # a backfill page's final status tag
NOT_A_LINK = "xpath=self::*[not(ancestor-or-self::a)]"  # the backfill page's column headers are links
AUTOMATION_ROW = "xpath=ancestor::div[.//input[@type='checkbox']][1]"  # the Automation page's row of a name


@pytest.fixture
def browser() -> Iterator[Browser]:
    require_browser()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=[LOOPBACK_ONLY])
        yield browser
        browser.close()


@pytest.fixture
def screenshots(tmp_path: Path) -> Path:
    directory = Path(SCREENSHOTS_DIR or tmp_path / "screenshots")
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def catalog_row(page: Page, asset: str) -> Locator:
    """The catalog's row of `asset`: the nearest element around its link that also holds a group link."""
    link = page.locator(f'a[href="/assets/{asset}"]')
    return link.locator(f"xpath=ancestor::div[.//{GROUP_LINK}][1]")


def groups_of_assets() -> dict[str, str]:
    graph = defs.resolve_asset_graph()
    return {key.to_user_string(): graph.get(key).group_name for key in graph.get_all_asset_keys()}


def checks_of_assets() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for check in defs.resolve_asset_graph().asset_check_keys:
        found.setdefault(check.asset_key.to_user_string(), []).append(check.name)
    return found


def automations() -> list[str]:
    return sorted([s.name for s in defs.sensors or ()] + [s.name for s in defs.schedules or ()])


def launched_run(instance: dg.DagsterInstance, before: set[str], page: Page, screenshots: Path,
                 log: Path) -> dg.DagsterRun:  # fmt: skip
    """The run a click launched: the instance's only run not in `before`."""
    deadline = time.monotonic() + LAUNCH_S
    while time.monotonic() < deadline:
        runs = [run for run in instance.get_runs(limit=len(before) + 2) if run.run_id not in before]
        if runs:
            assert len(runs) == 1, "one click, one run"
            return runs[0]
        page.wait_for_timeout(1000)
    page.screenshot(path=screenshots / "no-run.png")
    pytest.fail(f"Materialize launched no run (see no-run.png):\n{tail(log)}", pytrace=False)


def follow_run(page: Page, base: str, instance: dg.DagsterInstance, run: dg.DagsterRun, log: Path) -> None:
    """The run's page until it shows a final status; the run must have succeeded. Then the page once more: its
    live event log can stop at RUN_STARTING while the status tag moves on, and a screenshot is of the whole log."""
    page.goto(f"{base}/runs/{run.run_id}")
    expect(page.get_by_text(RUN_DONE).first).to_be_visible(timeout=RUN_S * 1000)
    finished = instance.get_run_by_id(run.run_id)
    assert finished is not None
    if finished.status != dg.DagsterRunStatus.SUCCESS:
        pytest.fail(f"run {run.run_id} ({run.job_name}) ended {finished.status.value}:\n{tail(log)}", pytrace=False)
    page.reload()
    expect(page.get_by_text("RUN_SUCCESS", exact=True)).to_be_visible(timeout=60_000)


def run_ids(instance: dg.DagsterInstance) -> set[str]:
    return {run.run_id for run in instance.get_runs()}


def expect_description(page: Page, asset: dg.AssetKey) -> None:
    """The asset page shows each path of the asset's description literally: the UI renders descriptions as
    Markdown, where an unquoted `<out>` would be taken for an HTML tag and vanish."""
    description = defs.resolve_asset_graph().get(asset).description or ""
    for path in re.findall(r"`([^`]+)`", description):
        expect(page.get_by_text(path, exact=True)).to_be_visible(timeout=60_000)


def multi_asset_siblings(asset: dg.AssetKey) -> list[str]:
    """The other assets of `asset`'s multi-asset: the UI says a click materializes them too."""
    return sorted(key.to_user_string() for key in defs.resolve_assets_def(asset).keys - {asset})


def deployable_checkout(checkout: Path) -> None:
    """A git checkout whose .env names its revision and the offline install and check the hosts can run."""
    set_env(checkout, NARWHAL_DEPLOYMENT_REVISION=git_checkout(checkout))
    with (checkout / ".env").open("a", encoding="utf-8") as env:
        env.write(f"NARWHAL_REMOTE_INSTALL={shell_quote(OFFLINE_INSTALL)}\n"
                  f"NARWHAL_REMOTE_CHECK={shell_quote(OFFLINE_CHECK)}\n")  # fmt: skip


def launched_backfill(instance: dg.DagsterInstance, page: Page, screenshots: Path, log: Path,
                      before: set[str]) -> str:  # fmt: skip
    """The id of the backfill a click launched (the one not among `before`)."""
    deadline = time.monotonic() + LAUNCH_S
    while time.monotonic() < deadline:
        backfills = [b for b in instance.get_backfills() if b.backfill_id not in before]
        if backfills:
            assert len(backfills) == 1, "one click, one backfill"
            return backfills[0].backfill_id
        page.wait_for_timeout(1000)
    page.screenshot(path=screenshots / "no-backfill.png")
    pytest.fail(f"Launch backfill launched nothing (see no-backfill.png):\n{tail(log)}", pytrace=False)


def backfill_every_host(page: Page, base: str, instance: dg.DagsterInstance, hosts: list[str], screenshots: Path,
                        log: Path, *, ends: str = "Succeeded", shot: str = "install-backfill.png") -> None:  # fmt: skip
    """Materialize… on `host_installation`, All partitions, Launch backfill; its page until it ended as `ends`,
    then its Runs tab: ONE run over every host (the single-run backfill policy: one fleet operation)."""
    asset = INSTALLATION.to_user_string()
    page.goto(f"{base}/assets/{asset}")
    expect_description(page, INSTALLATION)
    page.get_by_role("button", name="Materialize…").click()
    dialog = page.get_by_role("dialog")
    expect(dialog.get_by_text(f"Launch runs to materialize {asset}", exact=True)).to_be_visible(timeout=60_000)
    dialog.get_by_role("button", name="All", exact=True).click()
    expect(dialog.get_by_text(f"{len(hosts)} partitions", exact=True)).to_be_visible(timeout=60_000)
    for host in hosts:
        expect(dialog.get_by_text(host, exact=True).first).to_be_visible()
    page.screenshot(path=screenshots / "install-launch.png")
    before = {b.backfill_id for b in instance.get_backfills()}
    dialog.get_by_role("button", name="Launch backfill").click()
    backfill = launched_backfill(instance, page, screenshots, log, before)

    page.goto(f"{base}/runs/b/{backfill}")
    status = page.get_by_text(BACKFILL_DONE).locator(NOT_A_LINK)
    expect(status).to_be_visible(timeout=BACKFILL_S * 1000)
    if status.inner_text() != ends:
        page.screenshot(path=screenshots / shot)
        pytest.fail(f"backfill {backfill} ended {status.inner_text()}, not {ends} (see {shot}):\n{tail(log)}",
                    pytrace=False)  # fmt: skip
    for host in hosts:  # the backfill's partition selection names every host
        expect(page.get_by_text(host, exact=True).first).to_be_visible()
    runs = instance.get_runs(filters=dg.RunsFilter(tags={"dagster/backfill": backfill}))
    assert len(runs) == 1, [r.tags for r in runs]
    [run] = runs
    assert (run.tags["dagster/asset_partition_range_start"], run.tags["dagster/asset_partition_range_end"]) == (
        hosts[0], hosts[-1]), run.tags  # fmt: skip
    page.get_by_role("tab", name="Runs").click()
    word = "Success" if ends == "Succeeded" else "Failure"
    expect(page.get_by_text(word, exact=True).first).to_be_visible(timeout=60_000)
    page.screenshot(path=screenshots / shot)


def assert_partitions_installed(page: Page, base: str, hosts: list[str], screenshots: Path) -> None:
    """The asset's Partitions tab: every host materialized, none missing or failed, and each host's own
    materialization (its log file) with outcome `installed`."""
    page.goto(f"{base}/assets/{INSTALLATION.to_user_string()}?view=partitions")
    for label in (f"Materialized ({len(hosts)})", "Missing (0)", "Failed (0)", "Materializing (0)"):
        expect(page.get_by_text(label, exact=True)).to_be_visible(timeout=60_000)  # the status filters' counts
    for host in hosts:
        page.get_by_text(host, exact=True).first.click()
        its_log = page.get_by_role("row", name=re.compile(rf"logs\/{host}\.log"))  # "\/": Playwright sends /source/
        expect(its_log).to_be_visible(timeout=60_000)
        expect(page.get_by_role("row", name="outcome installed")).to_be_visible()
    page.screenshot(path=screenshots / "host-installation-partitions.png")


def assert_fleet_table(page: Page, base: str, manifest: DeploymentManifest, screenshots: Path) -> None:
    """The asset's Events tab in a 1280 px window: the latest event is the fleet observation, whose table has a
    row per host (roles, current deployment, short revision, state) and, with the navigation hidden, fits."""
    page.set_viewport_size(FLEET_VIEWPORT)
    page.goto(f"{base}/assets/{INSTALLATION.to_user_string()}")
    page.get_by_role("tab", name="Events").click()
    said = f"fleet after dagster of {manifest.deployment_id}"  # launched from the UI: no deploy-hosts command tag
    expect(page.get_by_text(said, exact=True)).to_be_visible(timeout=60_000)
    page.get_by_role("button", name="Hide navigation").click()
    table = page.get_by_role("columnheader", name=FLEET_COLUMNS[0], exact=True).locator("xpath=ancestor::table[1]")
    expect(table.get_by_role("columnheader")).to_have_text(FLEET_COLUMNS)
    for host in manifest.hosts:
        expected = {"host": host.id, "roles": ",".join(host.roles), "current": manifest.deployment_id[:12],
                    "revision": manifest.revision[:12], "state": "activated",  # by the backfill's one run
                    "last_action": "dagster"}  # fmt: skip
        row = table.get_by_role("row").filter(has=page.get_by_role("cell", name=host.id, exact=True))
        expect(row.get_by_role("cell")).to_have_text([expected[column] for column in FLEET_COLUMNS])
    expect(table).to_be_in_viewport(ratio=1)
    page.screenshot(path=screenshots / "fleet-table.png")
    page.get_by_role("button", name="panel_show_left").click()  # the collapsed navigation's toggle (an icon)
    expect(page.get_by_role("button", name="Hide navigation")).to_be_visible()
    page.set_viewport_size(VIEWPORT)


def test_operator_discovers_prepares_and_installs_from_the_ui(
    browser: Browser, screenshots: Path, checkout: Path, fleet: SimFleet, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    deployable_checkout(checkout)
    home = checkout / DAGSTER_HOME_DEFAULT
    write_private(home / "dagster.yaml", instance_yaml(home))
    workdir = tmp_path / "dagster-dev"
    workdir.mkdir()
    log = workdir / "dagster-dev.log"
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    with dagster_dev(checkout, home, workdir) as base, dg.DagsterInstance.get() as instance:
        page = browser.new_page(viewport=VIEWPORT)

        # The asset catalog: every asset of the definitions, each with its group; the first visit's dialog first.
        page.goto(f"{base}/assets")
        page.get_by_role("button", name="Skip").click(timeout=120_000)
        for asset, group in groups_of_assets().items():
            expect(catalog_row(page, asset).locator(f"xpath=.//{GROUP_LINK}")).to_have_text(group, timeout=60_000)
        for asset, names in checks_of_assets().items():
            page.goto(f"{base}/assets/{asset}?view=checks")
            for name in names:
                expect(page.get_by_text(name, exact=True).first).to_be_visible(timeout=60_000)

        # Materialize the discovery group from its page (once its graph is drawn) and follow the run to success.
        page.goto(f"{base}/locations/{LOCATION}/asset-groups/discovery")
        in_group = [asset for asset, group in groups_of_assets().items() if group == "discovery"]
        expect(page.locator(GRAPH_NODE)).to_have_count(len(in_group), timeout=60_000)
        page.get_by_role("button", name="Materialize all").click()
        follow_run(page, base, instance, launched_run(instance, set(), page, screenshots, log), log)
        page.screenshot(path=screenshots / "discovery-run.png")
        assert (checkout / "config" / "fleet.json").is_file() and (checkout / "config" / "deployment.env").is_file()

        page.goto(f"{base}/assets")
        for asset in in_group:  # the other groups (prepare, installation) are not part of this run
            expect(catalog_row(page, asset).get_by_text("Materialized")).to_be_visible(timeout=60_000)
        page.screenshot(path=screenshots / "catalog.png")
        # The group's graph once more, wide enough for full nodes: each with its latest event, checks passed.
        page.set_viewport_size(GRAPH_VIEWPORT)
        page.goto(f"{base}/locations/{LOCATION}/asset-groups/discovery")
        expect(page.get_by_text("Latest event", exact=True)).to_have_count(len(in_group), timeout=60_000)
        checked = [asset for asset in checks_of_assets() if asset in in_group]
        expect(page.get_by_text(re.compile(r"^(\d+) / \1 Passed$"))).to_have_count(len(checked), timeout=60_000)
        page.screenshot(path=screenshots / "asset-graph.png")
        page.set_viewport_size(VIEWPORT)

        # Prepare: Materialize on `deployment_manifest`, confirming that its multi-asset's siblings come along.
        before = run_ids(instance)
        page.goto(f"{base}/assets/{DEPLOYMENT_MANIFEST.to_user_string()}")
        expect_description(page, DEPLOYMENT_MANIFEST)
        page.get_by_role("button", name=re.compile(r"\bMaterialize$")).click()
        dialog = page.get_by_role("dialog")
        for sibling in multi_asset_siblings(DEPLOYMENT_MANIFEST):
            expect(dialog.get_by_role("link", name=sibling, exact=True)).to_be_visible(timeout=60_000)
        dialog.get_by_role("button", name="Confirm").click()
        follow_run(page, base, instance, launched_run(instance, before, page, screenshots, log), log)
        prepared = latest_out(instance, DEPLOYMENT_MANIFEST)[0]
        manifest = manifest_of(prepared)
        hosts = [host.id for host in manifest.hosts]
        assert sorted(instance.get_dynamic_partitions(HOSTS_PARTITIONS_NAME)) == sorted(hosts)

        # Install: a backfill of every host's partition, launched from the asset page and run by the daemon.
        backfill_every_host(page, base, instance, hosts, screenshots, log)
        assert_partitions_installed(page, base, hosts, screenshots)
        for host in hosts:  # found the prepared run by lineage, installed it, and the host holds the marker
            metadata = partition_metadata(host)
            assert (metadata["outcome"], metadata["revision"]) == ("installed", manifest.revision), host
            assert metadata["run_dir"] == str(prepared), host
            installed = remote_dir(fleet, host, prepared) / "installed"
            assert installed.read_bytes() == manifest.revision.encode() + b"\n", host

        # The backfill's run left the fleet table on the asset.
        assert_fleet_table(page, base, manifest, screenshots)

        # One host's installed content tampered with: a backfill ends failed, and only that host's partition is
        # Failed (the others, already current, are materialized again); its current did not move.
        bundle = remote_dir(fleet, hosts[1], prepared) / "source.bundle"
        original = bundle.read_bytes()
        bundle.write_bytes(original + b"tampered")
        try:
            backfill_every_host(page, base, instance, hosts, screenshots, log, ends="Failed",
                                shot="install-backfill-failed.png")  # fmt: skip
        finally:
            bundle.write_bytes(original)
        page.goto(f"{base}/assets/{INSTALLATION.to_user_string()}?view=partitions")
        for label in (f"Materialized ({len(hosts) - 1})", "Failed (1)", "Missing (0)"):
            expect(page.get_by_text(label, exact=True)).to_be_visible(timeout=60_000)
        page.screenshot(path=screenshots / "host-installation-failed-partition.png")
        states = instance.get_status_by_partition(INSTALLATION, hosts, host_partitions)
        assert states[hosts[1]] == dg.AssetPartitionStatus.FAILED, states

        # `deploy-hosts status` records each host's live deployment; the asset page shows the revisions per host.
        assert main(["--root", str(checkout), "status"]) == 0
        page.goto(f"{base}/assets/{INSTALLATION.to_user_string()}?view=checks")
        page.get_by_text(LIVE_CHECK, exact=True).first.click()
        expect(page.get_by_text(manifest.revision).first).to_be_visible(timeout=60_000)
        page.screenshot(path=screenshots / "live-revisions.png")

        # The Automation page lists every sensor and schedule of the definitions (and says so when there is none),
        # each with its on/off switch once its state has loaded.
        page.goto(f"{base}/automation")
        expected = automations()
        for name in expected:
            row = page.get_by_text(name, exact=True).first.locator(AUTOMATION_ROW)
            expect(row.get_by_role("checkbox")).to_have_count(2, timeout=60_000)  # its selection box and its switch
        if not expected:
            expect(page.get_by_text("No automations", exact=True)).to_be_visible(timeout=60_000)
        page.screenshot(path=screenshots / "automation.png")
        page.close()

    hosts_dirs = [remote_dir(fleet, host, prepared) for host in hosts]
    assert_nowhere([PASSWORD, *DESTINATIONS.values()], [checkout, workdir, *hosts_dirs])
