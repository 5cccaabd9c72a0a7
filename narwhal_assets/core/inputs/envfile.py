"""POSIX-shell assignment files (`.env`, `config/deployment.env`, role files) without a shell.

The parser accepts exactly the assignments whose value bash would take literally: optional `export`,
single quotes, double quotes without expansions, backslash escapes, comments and blank lines. Anything
that needs a shell to evaluate (command substitution, parameter expansion, tilde or brace expansion,
several words, line continuation outside quotes) is refused with `file:line` and the variable name, and
so is any carriage return (a CRLF file). Files, line counts and values are bounded (`core/limits.py`).
Error messages never contain a value.
"""

from __future__ import annotations

import re
from pathlib import Path

from narwhal_assets.core import limits
from narwhal_assets.core.errors import InputError

NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Unquoted characters bash keeps literally inside an assignment value (no globbing happens there).
# '{' is missing on purpose: after `export`, bash brace-expands `V={a,b}` to `V=b`. Everything else must
# be quoted.
_PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-./:,@%+=^!*?[]}#")
_DQ_ESCAPABLE = frozenset('$`"\\\n')
_PLAIN_CLASS = "[" + re.escape("".join(sorted(_PLAIN))) + "]"
_PLAIN_RUN = re.compile(_PLAIN_CLASS + "+")
_NAME_RUN = re.compile(r"[A-Za-z0-9_]+")
_BLANK_RUN = re.compile(r"[ \t\n]+")
_DQ_RUN = re.compile(r'[^"$`\\\r]+')  # what a double-quoted value keeps as it is
# The line render_exports writes (and most hand-written ones): read in one match. Any other line, and any
# line with a CR, a comment or a quote inside, does not match and goes through the full reader below.
_SIMPLE_LINE = re.compile(
    r"(?:export[ \t]+)?(" + NAME_RE.pattern + r")=(?:'([^'\r\n]*)'|(" + _PLAIN_CLASS + r"*))[ \t]*(?=\n|\Z)"
)


class _Cursor:
    """A position in the text. Runs of ordinary characters are skipped with one regex or `find` each, so a
    file costs C-speed scanning per line, not Python calls per character (role files grow with the fleet)."""

    def __init__(self, text: str, source: str) -> None:
        self.text = text
        self.source = source
        self.pos = 0
        self.line = 1
        # The assignment being read (for errors about a carriage return met anywhere in it).
        self.name: str | None = None
        self.start = 1

    def peek(self) -> str:
        ch = self.text[self.pos] if self.pos < len(self.text) else ""
        if ch == "\r":
            raise self._carriage_return()
        return ch

    def take(self) -> str:
        ch = self.peek()
        self.pos += 1
        if ch == "\n":
            self.line += 1
        return ch

    def take_run(self, pattern: re.Pattern[str]) -> str:
        """The (possibly empty) run `pattern` matches here, taken; no pattern given matches a CR."""
        match = pattern.match(self.text, self.pos)
        run = match.group() if match else ""
        self.pos += len(run)
        self.line += run.count("\n")
        return run

    def take_until(self, end: int) -> str:
        """Everything up to `end` (exclusive), taken; a CR in it fails as `peek` would have."""
        if self.text.find("\r", self.pos, end) >= 0:
            raise self._carriage_return()
        run = self.text[self.pos : end]
        self.pos = end
        self.line += run.count("\n")
        return run

    def fail(self, line: int, name: str | None, reason: str) -> InputError:
        where = f"{self.source}:{line}"
        return InputError([f"{where}: {name}: {reason}" if name else f"{where}: {reason}"])

    def _carriage_return(self) -> InputError:
        line = self.start if self.name else self.line
        return self.fail(line, self.name, "carriage return (CR) found; save the file with LF line endings")


def parse_env_text(text: str, source: str) -> dict[str, str]:
    """Parse assignment text; `source` names the file in errors. Later assignments win, as in bash."""
    if "\x00" in text:
        raise InputError([f"{source}: contains a NUL byte"])
    if text.count("\n") + (not text.endswith("\n")) > limits.ENV_FILE_LINES:
        raise InputError([f"{source}: more than {limits.ENV_FILE_LINES} lines (see {limits.DOCS})"])
    cur = _Cursor(text, source)
    values: dict[str, str] = {}
    while cur.peek():
        cur.name = None
        _skip_blank(cur)
        if not cur.peek():
            break
        if cur.peek() == "#":
            _skip_comment(cur)
            continue
        start_line = cur.start = cur.line
        simple = _SIMPLE_LINE.match(text, cur.pos)
        if simple:
            word, value = simple.group(1), simple.group(2) if simple.group(2) is not None else simple.group(3)
            values[word] = value
            if problem := limits.too_long(word, value):
                raise cur.fail(start_line, None, problem)
            cur.pos = simple.end()
            continue
        word = _read_name(cur)
        if word == "export" and cur.peek() in (" ", "\t"):
            while cur.peek() in (" ", "\t"):
                cur.take()
            word = _read_name(cur)
        if not word or not NAME_RE.fullmatch(word):
            raise cur.fail(start_line, None, "expected NAME=value (an assignment with a valid variable name)")
        cur.name = word
        if cur.peek() != "=":
            raise cur.fail(start_line, word, "expected '=' right after the variable name")
        cur.take()
        values[word] = _read_value(cur, word, start_line)
        problem = limits.too_long(word, values[word])
        if problem:
            raise cur.fail(start_line, None, problem)
        _finish_line(cur, word, start_line)
    return values


def load_env_file(path: Path) -> dict[str, str]:
    """Parse one assignment file; a missing file is empty, an unreadable one is an error naming it."""
    try:
        # Bytes, not read_text(): universal newlines would turn a CR into LF and hide it from the parser.
        with path.open("rb") as handle:
            raw = handle.read(limits.ENV_FILE_BYTES + 1)
        if len(raw) > limits.ENV_FILE_BYTES:
            raise InputError([f"{path}: larger than {limits.ENV_FILE_BYTES} bytes (see {limits.DOCS})"])
        text = raw.decode("utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError([f"{path}: cannot read ({type(exc).__name__})"]) from None
    return parse_env_text(text, str(path))


def shell_quote(value: str) -> str:
    """Single-quote a value so that bash reads back exactly the same string."""
    return "'" + value.replace("'", "'\\''") + "'"


def render_exports(values: dict[str, str]) -> str:
    """`export NAME='literal'` lines, sorted by name: the role-file format."""
    for name, value in values.items():
        if not NAME_RE.fullmatch(name):
            raise InputError([f"role export: invalid variable name {name!r}"])
        if "\x00" in value or "\r" in value:
            # bash cannot hold a NUL, and parse_env_text refuses a CR: the file could not be read back.
            raise InputError([f"role export: {name}: value contains a NUL or carriage return character"])
    return "".join(f"export {name}={shell_quote(values[name])}\n" for name in sorted(values))


def _skip_blank(cur: _Cursor) -> None:
    cur.take_run(_BLANK_RUN)


def _skip_comment(cur: _Cursor) -> None:
    end = cur.text.find("\n", cur.pos)
    cur.take_until(len(cur.text) if end < 0 else end)


def _read_name(cur: _Cursor) -> str:
    name = cur.take_run(_NAME_RUN)
    cur.peek()  # a CR right after the name fails before the name is known
    return name


def _read_value(cur: _Cursor, name: str, line: int) -> str:
    out: list[str] = []
    while True:
        ch = cur.peek()
        if ch in ("", "\n", " ", "\t"):
            return "".join(out)
        if ch == "'":
            cur.take()
            out.append(_read_until_quote(cur, name, line))
        elif ch == '"':
            cur.take()
            out.append(_read_double_quoted(cur, name, line))
        elif ch == "\\":
            cur.take()
            nxt = cur.peek()
            if nxt in ("", "\n"):
                raise cur.fail(line, name, "line continuation outside quotes is not supported")
            out.append(cur.take())
        elif ch == "~" and (not out or out[-1].endswith(":")):
            raise cur.fail(line, name, "unquoted '~' would be expanded by the shell; quote the value")
        elif ch in _PLAIN:
            out.append(cur.take_run(_PLAIN_RUN))
        elif ch == "~":
            out.append(cur.take())
        elif ch in "$`":
            raise cur.fail(line, name, "needs a shell to evaluate (expansion or command substitution)")
        else:
            raise cur.fail(line, name, f"unquoted special character {ch!r}; quote the value")


def _read_until_quote(cur: _Cursor, name: str, line: int) -> str:
    end = cur.text.find("'", cur.pos)
    if end < 0:
        raise cur.fail(line, name, "unterminated single quote")
    value = cur.take_until(end)
    cur.take()
    return value


def _read_double_quoted(cur: _Cursor, name: str, line: int) -> str:
    out: list[str] = []
    while True:
        out.append(cur.take_run(_DQ_RUN))
        ch = cur.peek()
        if ch == "":
            raise cur.fail(line, name, "unterminated double quote")
        cur.take()
        if ch == '"':
            return "".join(out)
        if ch in "$`":
            raise cur.fail(line, name, "needs a shell to evaluate (expansion or command substitution)")
        if ch == "\\":
            nxt = cur.peek()
            if nxt == "":
                raise cur.fail(line, name, "unterminated double quote")
            if nxt in _DQ_ESCAPABLE:
                cur.take()
                if nxt != "\n":
                    out.append(nxt)
                continue
        out.append(ch)


def _finish_line(cur: _Cursor, name: str, line: int) -> None:
    while cur.peek() in (" ", "\t"):
        cur.take()
    ch = cur.peek()
    if ch == "#":
        _skip_comment(cur)
    elif ch not in ("", "\n"):
        raise cur.fail(line, name, "more than one word after '='; quote the value")
