"""The docs match the tree: every repository path, module, `deploy-hosts` command and option that README.md and
docs/*.md name exists, every option of every command is documented, no link leaves the repository, and the
package's own text cites no issue or spec section (the project documents itself).

What counts as a name (so a new page is checked as it is written):
- a path is a code span of path characters holding a `/` or ending in .py, .md, .sh, .toml or .txt (in a code
  block or a longer span: a word whose first folder is one of the repository's); it is found relative to the
  repository root, the page's own folder or any folder of the package (`ssh/transport.py`,
  `inputs/envfile.py`: how docs/architecture.md names modules), or it is a file git ignores (what the tools
  generate in a checkout: `config/fleet.json`, `runs/discovery/<run>/`). Absolute paths, home paths (`~/...`),
  paths that start with a placeholder (`<run>/...`, `MODEL_DIR/...`) or with a folder of a deployment, run
  directory or virtualenv (`checkout/.venv`, `logs/<host-id>.log`: ELSEWHERE), run tags (`narwhal/...`) and
  git refs (`refs/...`) are about hosts, runs or git, not the repository. `<...>` and `*` match like a glob.
- a module is a dotted code span starting with `narwhal_assets` or one of its modules (`core.jsonfile`,
  `runtime.runner.run_job`): the module must be a file of the package and the names after it defined there.
- a command is `deploy-hosts SUBCOMMAND ...` (or a span `SUBCOMMAND --option ...`); its options are the
  `--words` up to the end of the span, line or shell command.
"""

from __future__ import annotations

import argparse
import ast
import functools
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pytest

from narwhal_assets.cli.main import build_parser
from narwhal_assets.core.launch.models import Runtime

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "narwhal_assets"
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
PACKAGE_FOLDERS = sorted({path.parent for path in PACKAGE.rglob("*.py")})
# Where a bare file name (`bench_cli.py`, `test_*.py`, `launch_engine.py`) may live: every folder of code.
CODE_FOLDERS = sorted({path.parent for root in ("narwhal_assets", "tests", "benchmarks", "scripts", "fleet-sim")
                       for path in (REPO / root).rglob("*") if path.suffix in {".py", ".sh"}})
# The first folder of the paths the docs name inside a deployment, a run directory, a model directory or a
# virtualenv, relative to it (`checkout/.venv`, `logs/<host-id>.log`): none is a folder of this repository.
ELSEWHERE = {"checkout", "logs", "previous-config", ".cache", "bin", ".install-lock", "Narwhal-deploy"}
MODULE_ROOTS = {path.stem for path in PACKAGE.iterdir() if path.suffix == ".py" or (path / "__init__.py").is_file()}
TOP_LEVEL = {path.name for path in REPO.iterdir()} - {".git"}

_FENCE = "```"
_SPAN_RE = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)")
_LINK_RE = re.compile(r"\]\(([^)\s]*)[^)]*\)|^\[[^\]]+\]:\s*(\S+)")
_URL_RE = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+|\bwww\.\S+|\bmailto:\S+", re.IGNORECASE)
_PATH_RE = re.compile(r"[A-Za-z0-9_.*<>-]+(?:/[A-Za-z0-9_.*<>-]+)*/?")
_BARE_SUFFIXES = {".py", ".md", ".sh", ".toml", ".txt"}
_DOTTED_RE = re.compile(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\(.*\))?")
_COMMAND_RE = re.compile(r"(?:^|[\s/])(?:deploy-hosts|python -m narwhal_assets)\s+(.*)")
_OPTION_RE = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
_SHELL_END_RE = re.compile(r"\s(?:&&|\|\||;|\||#)\s")
_PLACEHOLDER_RE = re.compile(r"<[^>]*>")
# What docs/architecture.md and the package's docstrings may not cite: the project documents itself.
_CITATION_RE = re.compile(r"\b(?:issues?|spec(?:ification)?|section|§)\s*#?\d+(?:\.\d+)*\b|§\s*\d|\bthe spec\b", re.I)


@dataclass(frozen=True)
class Mention:
    """One piece of a page: a code span, a code-block line or a line of prose (code spans removed)."""

    page: Path
    line: int
    text: str
    kind: str  # "span", "code" or "prose"

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def mentions(page: Path) -> Iterator[Mention]:
    in_fence = False
    previous = ""
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
        if line.lstrip().startswith(_FENCE):
            in_fence = not in_fence
        elif in_fence or (line.startswith("    ") and (not previous.strip() or previous.startswith("    "))):
            yield Mention(page, number, line.strip(), "code")
        else:
            text = line.replace("\\|", "|")  # a pipe escaped inside a table cell
            for match in _SPAN_RE.finditer(text):
                yield Mention(page, number, match.group(2).strip(), "span")
            yield Mention(page, number, _SPAN_RE.sub(" ", text), "prose")
        previous = line if not line.lstrip().startswith(_FENCE) else "x"


@functools.cache
def all_mentions() -> tuple[Mention, ...]:
    return tuple(mention for page in DOCS for mention in mentions(page))


# ----------------------------------------------------------------------------------------------------- paths


def is_about_something_else(path: str) -> bool:
    """Paths on hosts, in run directories, of git or Dagster: named in the docs, not files of this repository."""
    first = path.split("/", 1)[0]
    return (
        path.startswith(("/", "~", "$", "-", "<", "./", "narwhal/", "refs/"))
        or first.isupper()
        or first in ELSEWHERE
    )


def path_candidates(mention: Mention) -> Iterator[str]:
    if mention.kind == "span" and _PATH_RE.fullmatch(mention.text):
        path = mention.text
        if "/" in path or PurePosixPath(path).suffix in _BARE_SUFFIXES:
            yield path
        return
    if mention.kind == "prose":
        return
    for word in mention.text.split():
        word = word.rsplit("=", 1)[-1].strip("'\",;:()")
        if "/" in word and word.split("/", 1)[0] in TOP_LEVEL and _PATH_RE.fullmatch(word):
            yield word


def _matches(base: Path, path: str) -> bool:
    pattern = _PLACEHOLDER_RE.sub("*", path.rstrip("/"))
    found = list(base.glob(pattern)) if "*" in pattern else [base / pattern] if (base / pattern).exists() else []
    return any(hit.is_dir() for hit in found) if path.endswith("/") else bool(found)


@functools.cache
def git_ignores(path: str) -> bool:
    """Whether git ignores `path` in this checkout: a file the tools write (`.gitignore` lists every one)."""
    done = subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=REPO, check=False)
    return done.returncode == 0


def path_exists(path: str, page: Path) -> bool:
    bases = [REPO, page.parent, *PACKAGE_FOLDERS] if "/" in path.rstrip("/") else [REPO, page.parent, *CODE_FOLDERS]
    return any(_matches(base, path) for base in bases) or git_ignores(path)


def test_every_repository_path_the_docs_name_exists() -> None:
    missing = [
        f"{mention.where}: {path}"
        for mention in all_mentions()
        for path in path_candidates(mention)
        if not is_about_something_else(path) and not path_exists(path, mention.page)
    ]
    assert not missing, "\n".join(missing)


# --------------------------------------------------------------------------------------------------- modules


def _defined_names(body: list[ast.stmt]) -> set[str]:
    names: set[str] = set()
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(target.id for target in node.targets if isinstance(target, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names


@functools.cache
def _module_body(path: Path) -> list[ast.stmt]:
    return ast.parse(path.read_text(encoding="utf-8")).body


def module_problem(dotted: str) -> str | None:
    """Why `dotted` (a module, optionally followed by a name in it and an attribute of that) does not exist."""
    parts = dotted.split(".")
    if parts[0] == "narwhal_assets":
        parts = parts[1:]
    module: Path | None = PACKAGE / "__init__.py"
    rest = parts
    for index in range(len(parts), 0, -1):
        folder = PACKAGE.joinpath(*parts[:index])
        for candidate in (folder.with_suffix(".py"), folder / "__init__.py"):
            if candidate.is_file():
                module, rest = candidate, parts[index:]
                break
        else:
            continue
        break
    assert module is not None
    if not rest:
        return None
    body = _module_body(module)
    if rest[0] not in _defined_names(body):
        return f"{rest[0]} is not defined in {module.relative_to(REPO)}"
    if len(rest) > 1:
        classes = [node for node in body if isinstance(node, ast.ClassDef) and node.name == rest[0]]
        if classes and rest[1] not in _defined_names(classes[0].body):
            return f"{rest[0]} in {module.relative_to(REPO)} has no {rest[1]}"
    return None


def module_candidates(mention: Mention) -> Iterator[str]:
    match = _DOTTED_RE.fullmatch(mention.text) if mention.kind == "span" else None
    if match is None or match.group(1).split(".")[0] not in {"narwhal_assets", *MODULE_ROOTS}:
        return
    dotted = match.group(1)
    if dotted.rsplit(".", 1)[-1] in {"py", "md"}:
        return  # a file name (`definitions.py`): a path
    head, _, field = dotted.partition(".")
    if head == "runtime" and field in Runtime.model_fields:
        return  # a launch record's `runtime.<field>` (core/launch/models.py), not the runtime package
    yield dotted


def test_every_module_the_docs_name_exists() -> None:
    missing = [
        f"{mention.where}: {dotted}: {problem}"
        for mention in all_mentions()
        for dotted in module_candidates(mention)
        if (problem := module_problem(dotted)) is not None
    ]
    assert not missing, "\n".join(missing)


def test_every_module_the_package_docstrings_name_exists() -> None:
    """Docstrings and comments name modules the same way (`core.records.Record`); a moved module breaks them."""
    missing = []
    for source in sorted(PACKAGE.rglob("*.py")):
        for number, line in enumerate(source.read_text(encoding="utf-8").splitlines(), start=1):
            for match in _SPAN_RE.finditer(line):
                mention = Mention(source, number, match.group(2), "span")
                for dotted in module_candidates(mention):
                    if (problem := module_problem(dotted)) is not None:
                        missing.append(f"{mention.where}: {dotted}: {problem}")
    assert not missing, "\n".join(missing)


# -------------------------------------------------------------------------------------------------- commands


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    return dict(actions[0].choices) if actions else {}


@functools.cache
def command_options(*, aliases: bool = True) -> dict[str, frozenset[str]]:
    """Each `deploy-hosts` subcommand and its long options, from the real parser (an alias, such as `lock` for
    `lease`, names the same parser as the command before it)."""
    names: dict[int, str] = {}
    subparsers = _subparsers(build_parser())
    for name, sub in subparsers.items():
        names.setdefault(id(sub), name)
    return {
        name: frozenset(option for action in sub._actions for option in action.option_strings if option[:2] == "--")
        for name, sub in subparsers.items()
        if aliases or names[id(sub)] == name
    }


@dataclass(frozen=True)
class Usage:
    mention: Mention
    command: str
    options: tuple[str, ...]


def usages(mention: Mention) -> Iterator[Usage]:
    """The `deploy-hosts` commands in one code span or code-block line, with the options written after each."""
    if mention.kind == "prose":
        return
    commands = command_options()
    texts = [match.group(1) for match in _COMMAND_RE.finditer(mention.text)]
    first = mention.text.split(maxsplit=1)
    if mention.kind == "span" and len(first) == 2 and first[0] in commands and first[1].startswith("--"):
        texts.append(mention.text)  # `shell --run`, `lock --release --force`
    for text in texts:
        if mention.kind == "code":
            text = _SHELL_END_RE.split(f"{text} ", maxsplit=1)[0]
        words = text.split()
        while len(words) >= 2 and words[0] == "--root":
            words = words[2:]
        if words and re.fullmatch(r"[a-z][a-z-]*", words[0]):  # not `deploy-hosts ...` or `deploy-hosts COMMAND`
            yield Usage(mention, words[0], tuple(_OPTION_RE.findall(" ".join(words[1:]))))


@functools.cache
def all_usages() -> tuple[Usage, ...]:
    return tuple(usage for mention in all_mentions() for usage in usages(mention))


def test_the_docs_find_usages_of_every_kind() -> None:
    """The guard itself: it sees commands in spans, code blocks and subcommand spans, or it checks nothing."""
    kinds = {usage.mention.kind for usage in all_usages()}
    assert {"span", "code"} <= kinds
    assert {usage.command for usage in all_usages()} >= {"install", "rollback", "shell", "lease"}


def test_every_command_and_option_the_docs_name_exists() -> None:
    commands = command_options()
    wrong = []
    for usage in all_usages():
        if usage.command not in commands:
            wrong.append(f"{usage.mention.where}: deploy-hosts {usage.command}: no such command")
            continue
        wrong += [
            f"{usage.mention.where}: deploy-hosts {usage.command} {option}: no such option"
            for option in usage.options
            if option not in commands[usage.command]
        ]
    assert not wrong, "\n".join(wrong)


def test_an_earlier_command_name_still_runs_the_command() -> None:
    """`lock` was the lease command's name: scripts that call it keep working, with the same options."""
    parser = build_parser()
    assert parser.parse_args(["lock", "--release"]).func is parser.parse_args(["lease", "--release"]).func
    assert command_options()["lock"] == command_options()["lease"]
    assert "lock" not in command_options(aliases=False)


def test_every_option_of_every_command_is_documented() -> None:
    documented = {(usage.command, option) for usage in all_usages() for option in usage.options}
    words = {option for mention in all_mentions() for option in _OPTION_RE.findall(mention.text)}
    undocumented = [
        f"deploy-hosts {command} {option}"
        for command, options in command_options(aliases=False).items()
        for option in sorted(options - {"--help", "--root"})
        if (command, option) not in documented
    ]
    assert not undocumented, "\n".join(undocumented)
    assert "--root" in words  # every command takes it, before or after the subcommand (README: Commands)


# ----------------------------------------------------------------------------------------------------- links


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings (lines starting with `#` outside code blocks)."""
    anchors, in_fence = set(), False
    for line in page.read_text(encoding="utf-8").splitlines():
        in_fence ^= line.lstrip().startswith(_FENCE)
        if line.startswith("#") and not in_fence:
            anchors.add(re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-"))
    return anchors


def link_problem(target: str, page: Path) -> str | None:
    if _URL_RE.match(target) or target.startswith(("/", "~")):
        return "points outside the repository"
    path, _, anchor = target.partition("#")
    resolved = (page.parent / path).resolve() if path else page
    if not resolved.is_relative_to(REPO):
        return "points outside the repository"
    if not resolved.exists():
        return "no such file"
    if anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
        return f"no heading #{anchor} in {resolved.relative_to(REPO)}"
    return None


def test_every_link_stays_in_the_repository_and_finds_its_target() -> None:
    wrong = []
    for mention in all_mentions():
        if mention.kind != "prose":
            continue
        original = mention.page.read_text(encoding="utf-8").splitlines()[mention.line - 1]
        for match in _LINK_RE.finditer(original):
            target = match.group(1) or match.group(2)
            if (problem := link_problem(target, mention.page)) is not None:
                wrong.append(f"{mention.where}: ({target}) {problem}")
        wrong += [f"{mention.where}: {url} points outside the repository" for url in _URL_RE.findall(mention.text)]
    assert not wrong, "\n".join(wrong)


def test_no_page_mentions_the_workspace_outside_the_repository() -> None:
    wrong = [
        f"{mention.where}: {mention.text}"
        for mention in all_mentions()
        if re.search(r"\.\./shared\b|/work/shared\b", mention.text)
    ]
    assert not wrong, "\n".join(wrong)


# ------------------------------------------------------------------------------------------------- citations


def test_the_code_cites_no_issue_or_spec_section() -> None:
    """Code, tests, benchmarks and docstrings say why in their own words; an issue number or a spec section means
    nothing to their reader (and the issue tracker is not shipped with them). This file's own examples excepted."""
    tops = ("narwhal_assets", "tests", "benchmarks", "fleet-sim")
    sources = [path for top in tops for path in (REPO / top).rglob("*.py")]
    cited = [
        f"{source.relative_to(REPO)}:{number}: {match.group(0)}"
        for source in sorted(sources)
        if source != Path(__file__).resolve()
        for number, line in enumerate(source.read_text(encoding="utf-8").splitlines(), start=1)
        for match in _CITATION_RE.finditer(line)
    ]
    assert not cited, "\n".join(cited)


@pytest.mark.parametrize(
    ("text", "cited"),
    [
        ("(spec 13.3)", True),
        ("see issue 12", True),
        ("issue #4", True),
        ("§ 5", True),
        ("the spec's fields", True),
        ("find_spec(name)", False),
        ("an AssetSpec per host", False),
        ("one issue at a time", False),
    ],
)
def test_what_counts_as_a_citation(text: str, cited: bool) -> None:
    assert bool(_CITATION_RE.search(text)) is cited
