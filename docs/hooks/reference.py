"""Reference pages generated from the code at each build, so that they cannot drift from it:
every `kappa` command and flag (from the argparse parsers), every setting (from the Settings
dataclass and its comments), every metric (from the exporter's collector) and every fail point
(from orchestrator/failpoints.py). A flag without help text, a setting or fail point without
a comment, or a metric without help, fails the build."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import io
import tokenize
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


class UndocumentedError(ValueError):
    """Something the reference must explain has no text in the code."""


def cli_page(parser: argparse.ArgumentParser) -> str:
    out = ["# Command line", "",
           "Every `kappa` command and flag, generated from the parsers "
           "(`orchestrator/cli/`). `kappa COMMAND --help` prints the same.", ""]
    out += _arguments(parser, "kappa", level=2)
    for path, sub in _commands(parser, ["kappa"]):
        out += [f"## `{' '.join(path)}`", "", (sub.description or "").strip(), ""]
        out += _arguments(sub, " ".join(path), level=3)
    return "\n".join(out) + "\n"


def _commands(parser: argparse.ArgumentParser, path: list[str]
              ) -> list[tuple[list[str], argparse.ArgumentParser]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                if not sub.description:
                    sub.description = helps.get(name)
                if not sub.description:
                    raise UndocumentedError(f"{' '.join(path)} {name} has no help text")
                found.append(([*path, name], sub))
                found += _commands(sub, [*path, name])
    return found


def _arguments(parser: argparse.ArgumentParser, where: str, level: int) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if not action.help:
            name = "/".join(action.option_strings) or action.dest
            raise UndocumentedError(f"`{where}` {name} has no help text: give it help=...")
        name = ", ".join(f"`{o}`" for o in action.option_strings) or f"`{action.dest.upper()}`"
        default = action.default
        shown = "" if default in (None, False, argparse.SUPPRESS) else f"`{default}`"
        choices = ", ".join(f"`{c}`" for c in action.choices) if action.choices else ""
        text = action.help.replace("%%", "%").replace("|", "\\|").replace("\n", " ")
        rows.append(f"| {name} | {text} | {choices} | {shown} |")
    if not rows:
        return []
    return ["| argument | meaning | choices | default |", "| --- | --- | --- | --- |",
            *rows, ""]


def settings_page(settings_class: type, source: str) -> str:
    comments = _field_comments(source, settings_class.__name__)
    out = ["# Settings", "",
           "Every setting, generated from `orchestrator/settings.py`. Each is read, in this "
           "order, from a flag, the environment (`KAPPA_` and its name in capitals), "
           "`kappa.toml`, `kappa dev up`'s state, and the default.", "",
           "| setting | environment | default | meaning |", "| --- | --- | --- | --- |"]
    for field in dataclasses.fields(settings_class):
        text = comments.get(field.name)
        if not text:
            raise UndocumentedError(f"setting {field.name} has no comment in settings.py: say "
                                    "what it means, on its line or the lines above it")
        default = field.default if field.default is not dataclasses.MISSING else (
            "" if field.default_factory is dataclasses.MISSING else field.default_factory())
        shown = "" if default in ("", None, ()) else f"`{default}`"
        escaped = text.replace("|", "\\|")
        out.append(f"| `{field.name}` | `KAPPA_{field.name.upper()}` | {shown} | {escaped} |")
    return "\n".join(out) + "\n"


def _field_comments(source: str, class_name: str) -> dict[str, str]:
    """name -> the comment on the field's line, after the comment lines right above it."""
    lines = source.splitlines()
    trailing: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            trailing[token.start[0]] = token.string.lstrip("#").strip()
    (cls,) = [n for n in ast.parse(source).body
              if isinstance(n, ast.ClassDef) and n.name == class_name]
    found = {}
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above: list[str] = []
        number = node.lineno - 1
        while number >= 1 and lines[number - 1].strip().startswith("#"):
            above.insert(0, trailing.get(number, ""))
            number -= 1
        own = trailing.get(node.lineno) if not lines[node.lineno - 1].strip().startswith(
            "#") and "#" in lines[node.lineno - 1] else None
        found[node.target.id] = " ".join([*above, *([own] if own else [])]).strip()
    return found


def fail_points_page(points: tuple[str, ...], source: str) -> str:
    described = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            line = source.splitlines()[token.start[0] - 1]
            for point in points:
                if line.strip().startswith(f'"{point}"'):
                    described[point] = token.string.lstrip("#").strip()
    out = ["# Fail points", "",
           "Named places where a test makes a process exit, raise or pause "
           "(`KAPPA_FAIL_POINTS`), generated from `orchestrator/failpoints.py`; its docstring "
           "gives the actions.", "", "| point | where |", "| --- | --- |"]
    for point in points:
        if point not in described:
            raise UndocumentedError(f"fail point {point} has no comment in failpoints.py")
        out.append(f"| `{point}` | {described[point]} |")
    return "\n".join(out) + "\n"


def metrics_page(families: list[Any]) -> str:
    """``families``: what the exporter's collector yields (with no data, every family is there
    with no samples)."""
    out = ["# Metrics", "",
           "Every metric `kappa agent` and `kappa metrics serve` export, generated from the "
           "exporter's collector (`orchestrator/metrics/`). An unknown figure is no series, "
           "never 0.", "", "| metric | type | labels | meaning |", "| --- | --- | --- | --- |"]
    for family in sorted(families, key=lambda f: f.name):
        if not family.documentation:
            raise UndocumentedError(f"metric {family.name} has no help text")
        name = f"{family.name}_total" if family.type == "counter" else family.name
        labels = ", ".join(f"`{label}`" for label in getattr(family, "_labelnames", ()))
        out.append(f"| `{name}` | {family.type} | {labels} | {family.documentation} |")
    return "\n".join(out) + "\n"


def pages() -> dict[str, str]:
    from orchestrator import failpoints, settings
    from orchestrator.cli.main import build_parser
    from orchestrator.metrics.exporter import KappaCollector, Sampler, Snapshot

    return {
        "reference/cli.md": cli_page(build_parser()),
        "reference/settings.md": settings_page(
            settings.Settings, (ROOT / "orchestrator" / "settings.py").read_text()),
        "reference/metrics.md": metrics_page(
            list(KappaCollector(Sampler(take=Snapshot)).collect())),
        "reference/fail-points.md": fail_points_page(
            failpoints.POINTS, (ROOT / "orchestrator" / "failpoints.py").read_text()),
    }


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for uri, text in pages().items():
        files.append(File.generated(config, uri, content=text))
    return files
