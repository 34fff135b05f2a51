"""The documentation site builds with `mkdocs build --strict` (a broken link or a missing page
fails it), and its reference pages come from the code: a flag without help text, a setting or a
fail point without a comment fails the build rather than leaving a gap in the reference."""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference",
                                                  ROOT / "docs" / "hooks" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_site_builds_strictly_with_every_command_setting_and_fail_point(
        tmp_path: Path) -> None:
    from orchestrator.failpoints import POINTS
    from orchestrator.settings import Settings

    done = subprocess.run([str(Path(sys.executable).with_name("mkdocs")), "build", "--strict",
                           "--site-dir", str(tmp_path / "site")], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    pages = _reference().pages()
    for command in ("deploy", "cutover", "archive restore", "metric define", "dev"):
        assert f"## `kappa {command}`" in pages["reference/cli.md"], command
    for name in Settings.__dataclass_fields__:
        assert f"`KAPPA_{name.upper()}`" in pages["reference/settings.md"], name
    for point in POINTS:
        assert f"| `{point}` |" in pages["reference/fail-points.md"], point
    for metric in ("kappa_lag_records", "kappa_archive_lag_seconds", "kappa_dead_letters_total",
                   "kappa_alias_split_percent"):
        assert f"| `{metric}` |" in pages["reference/metrics.md"], metric
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").is_file()


def test_a_flag_without_help_text_fails_the_reference() -> None:
    reference = _reference()
    parser = argparse.ArgumentParser(prog="kappa")
    commands = parser.add_subparsers()
    deploy = commands.add_parser("deploy", help="register a job version")
    deploy.add_argument("--wait", action="store_true", help="wait until it has caught up")
    reference.cli_page(parser)  # documented: fine
    deploy.add_argument("--fast", action="store_true")
    with pytest.raises(reference.UndocumentedError, match="--fast has no help text"):
        reference.cli_page(parser)


def test_a_setting_or_fail_point_without_a_comment_fails_the_reference() -> None:
    from dataclasses import dataclass

    reference = _reference()

    @dataclass(frozen=True)
    class Settings:
        documented: int = 1  # what it means
        bare: int = 2

    source = ("class Settings:\n    documented: int = 1  # what it means\n"
              "    bare: int = 2\n")
    with pytest.raises(reference.UndocumentedError, match="bare has no comment"):
        reference.settings_page(Settings, source)
    points_source = 'POINTS = (\n    "a.b",  # where a is\n    "c.d",\n)\n'
    with pytest.raises(reference.UndocumentedError, match=r"c\.d has no comment"):
        reference.fail_points_page(("a.b", "c.d"), points_source)
