"""Docs that must match the code: the output schema (docs/rows-and-schema.md), the config
reference, the commands the README and docs/ name, and the links between them."""

import re
from pathlib import Path

import pytest

from jobs import config_doc, generate
from jobs.io.schema import DATA

ROOT = Path(__file__).resolve().parents[2]
# The README and the docs its sections moved to (issue 38): read as one for commands.
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_output_schema_documents_every_output_column_in_order():
    doc = (ROOT / "docs" / "rows-and-schema.md").read_text()
    section = doc.split("## Output schema", 1)[1].split("\n## ", 1)[0]
    documented = re.findall(r"^\| `([a-z_]+)` \|", section, flags=re.M)
    assert documented == DATA.names
    assert "](docs/rows-and-schema.md)" in (ROOT / "README.md").read_text()


def test_config_reference_is_generated_from_the_code(capsys):
    assert config_doc.main(["--check"]) == 0, capsys.readouterr().err


def test_readme_commands_exist(capsys):
    text = "\n".join(path.read_text() for path in DOCS)
    for module in set(re.findall(r"python -m (jobs(?:\.[a-z_]+)+)", text)):
        assert (ROOT / (module.replace(".", "/") + ".py")).exists(), module
    with pytest.raises(SystemExit):
        generate.parse_args(["--help"])
    out = capsys.readouterr().out
    for flag in ("--retry-failed", "--continue-truncated", "--max-total-tokens", "--pilot"):
        assert flag in out


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lowercased, punctuation but - and _ dropped, spaces
    to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    seen: dict[str, int] = {}
    anchors = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.M):
        base = _anchor(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        anchors.add(base if n == 0 else f"{base}-{n}")
    return anchors


def test_the_readme_and_the_docs_link_to_what_exists():
    """Every relative link of the README and docs/ names a file of the repository and, with
    a #fragment, one of that file's headings; the README links every doc in docs/."""
    readme = (ROOT / "README.md").read_text()
    problems = []
    for path in [*DOCS, ROOT / "BENCHMARKS.md"]:
        for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # http(s):, mailto: ...
            file, _, fragment = target.partition("#")
            linked = (path.parent / file).resolve() if file else path
            if not linked.exists():
                problems.append(f"{path.name}: {target}: no such file")
            elif fragment and fragment not in _anchors(linked):
                problems.append(f"{path.name}: {target}: no such heading")
    assert not problems, "\n".join(problems)
    for doc in sorted((ROOT / "docs").glob("*.md")):
        assert f"](docs/{doc.name})" in readme, doc.name
