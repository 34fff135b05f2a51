"""A decoding's fingerprint covers the parser's code (#60): a commit that changes what becomes a
row or a dead letter gives new decodings, so segments decoded before it are never read as if
current. DECODER_VERSION, kept by hand, was once not bumped where it had to be."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.archive_model import decoding as decoding_module
from orchestrator.archive_model.decoding import PARSER_MODULES, Decoding, parser_digest
from orchestrator.models import TopicInput

ROOT = Path(__file__).resolve().parents[2]
_PRINT = ("from orchestrator.archive_model.decoding import Decoding; "
          "from orchestrator.models import TopicInput; "
          "print(Decoding.of(TopicInput('t', 'url string', (), 'dead_letter')).fingerprint)")


def _fingerprint_in(root: Path) -> str:
    return subprocess.run([sys.executable, "-c", _PRINT], cwd=root, env={"PYTHONPATH": str(root)},
                          capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.parametrize(("module", "old", "new", "changes"), [
    # The nesting depth past which JSON is a dead letter: the change that went unbumped.
    ("orchestrator/spark/read/arrow_events.py", "", "\n_ANOTHER_RULE = 1\n", True),
    ("orchestrator/parsing.py", "", "\n# only a comment\n\n", False),
])
def test_a_parser_change_gives_new_fingerprints_and_a_comment_does_not(
        tmp_path: Path, module: str, old: str, new: str, changes: bool) -> None:
    shutil.copytree(ROOT / "orchestrator", tmp_path / "orchestrator",
                    ignore=shutil.ignore_patterns("__pycache__"))
    edited = tmp_path / module
    edited.write_text(edited.read_text() + new)
    assert (_fingerprint_in(tmp_path) != _fingerprint_in(ROOT)) is changes


def test_the_digest_reads_every_parser_module_by_its_code() -> None:
    sources = {m: (ROOT / m).read_text() for m in PARSER_MODULES}
    digest = parser_digest(sources)
    assert Decoding.of(TopicInput("t", "url string", (), "dead_letter")).decoder == digest
    for module in PARSER_MODULES:
        assert parser_digest({**sources, module: sources[module] + "\nx = 1\n"}) != digest
        reworded = f"# a comment\n{sources[module]}\n\n# and another\n"
        assert parser_digest({**sources, module: reworded}) == digest, module
    assert len(digest) == 16 and int(digest, 16) >= 0


def test_a_decoding_recorded_by_the_hand_kept_version_is_not_the_current_one() -> None:
    current = Decoding.of(TopicInput("t", "url string", (), "dead_letter"))
    recorded = {**current.to_json(), "decoder": 1}  # what the catalog holds from before
    old = Decoding.from_json(recorded)
    assert old.fingerprint != current.fingerprint
    assert Decoding.from_json(current.to_json()) == current
    assert decoding_module.decoder_digest() == current.decoder


def test_a_sample_of_decoded_segments_spreads_from_the_first_to_the_last() -> None:
    from orchestrator.archive.decoded_check import spread

    items = list(range(10))
    assert spread(items, None) == spread(items, 0) == spread(items, 10) == items  # type: ignore[arg-type]
    assert spread(items, 1) == [0]  # type: ignore[arg-type]
    assert spread(items, 2) == [0, 9]  # type: ignore[arg-type]
    assert spread(items, 4) == [0, 3, 6, 9]  # type: ignore[arg-type]


def _imported_modules(module: str) -> set[str]:
    import ast

    found = set()
    for node in ast.walk(ast.parse((ROOT / module).read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("orchestrator"):
            base = ROOT / node.module.replace(".", "/")  # type: ignore[union-attr]
            names = [base / f"{alias.name}.py" for alias in node.names] + [base.with_suffix(".py")]
            found |= {str(p.relative_to(ROOT)) for p in names if p.is_file()}
    return found


def test_every_module_the_parser_reads_with_is_in_the_digest() -> None:
    """What decides a record's row or dead letter: each format's parser and every module of
    ours it imports, the errors and the domain's dataclasses aside (their words are not a row).
    formats/checks.py, which the JSON parser's decimals and NON_NEGATIVE came to share, was once
    left out."""
    left_out = {"orchestrator/errors.py", "orchestrator/models.py"}
    seen, todo = set(), ["orchestrator/parsing.py", "orchestrator/record_parsers.py"]
    while todo:
        module = todo.pop()
        if module not in seen | left_out:
            seen.add(module)
            todo.extend(_imported_modules(module))
    missing = seen - set(PARSER_MODULES)
    assert not missing, missing
