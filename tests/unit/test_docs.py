"""Docs that must match the code: the output schema (docs/rows-and-schema.md), the config
reference, the commands the README and docs/ name, the links between them, and a run's
layout and format versions (docs/run-layout.md, jobs/io/run_store.py)."""

import re
from pathlib import Path

import pytest

from jobs import config_doc, generate
from jobs.analysis import export_journal
from jobs.io import condemned, index_compact, part_summary, run_store
from jobs.io.schema import DATA, KINDS, LATER_COLUMNS
from jobs.pipeline import admission_cache
from jobs.runs import provenance

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


def _table_rows(text: str, heading: str) -> dict[str, list[str]]:
    """The body of the first table under ``heading``: first cell (backticks dropped) ->
    the others."""
    lines = text.split(f"## {heading}\n", 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    table = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        table.append(line)
    rows = {}
    for line in table[2:]:  # after the header and its |---| line
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0].replace("`", "")] = cells[1:]
    return rows


def test_the_formats_table_has_the_versions_the_code_writes_and_reads():
    versions = {  # file -> (the version written, the versions read)
        "run.json": (run_store.RUN_FORMAT, run_store.READABLE_RUN_FORMATS),
        "index/<kind>/part-*.arrow": (part_summary.FORMAT, part_summary.READABLE_FORMATS),
        "index/compact/<n>.arrow": (index_compact.FORMAT, index_compact.READABLE_FORMATS),
        "index/compact/<n>.stats.arrow": (index_compact.STATS_FORMAT,
                                          (index_compact.STATS_FORMAT,)),
        "admission/keys.arrow": (admission_cache.FORMAT, (admission_cache.FORMAT,)),
        "condemned/<replica>.json": (condemned.FORMAT, condemned.READABLE_FORMATS),
        "provenance.json": (provenance.FORMAT, (provenance.FORMAT,)),
        "OUT/batch-*.manifest (incremental export)": (export_journal.JOURNAL_FORMAT,
                                                      (export_journal.JOURNAL_FORMAT,)),
    }
    rows = _table_rows((ROOT / "docs" / "run-layout.md").read_text(),
                       "Formats and their versions")
    documented = {name: (cells[1], cells[2]) for name, cells in rows.items()
                  if name in versions}
    assert documented == {name: (str(w), ", ".join(map(str, r)))
                          for name, (w, r) in versions.items()}
    parts = rows["data/, failures/, rejects/ parts"][3]
    assert set(re.findall(r"`(\w+)`", parts)) == LATER_COLUMNS
    assert len(rows) == len(versions) + 1  # a new versioned file needs its line above


def test_the_layout_names_every_file_and_folder_of_a_run():
    names = [run_store.RUN_FILE, run_store.LEASE_FILE, run_store.INPUTS_FILE,
             "/".join(run_store.ADMISSION_KEYS), run_store.PROVENANCE_FILE,
             run_store.CONDEMNED + "/", "/".join(run_store.COMPACT) + "/<n>.arrow",
             "/".join(run_store.COMPACT) + "/<n>.stats.arrow", part_summary.INDEX + "/<kind>/",
             run_store.QUARANTINE + "/<kind>/", "progress.json", "context_check.json",
             "final/", *(f"{kind}/part-*.parquet" for kind in KINDS)]
    layout = _table_rows((ROOT / "docs" / "run-layout.md").read_text(), "Layout")
    source = run_store.__doc__
    for name in names:
        assert name in source, f"jobs/io/run_store.py's layout lacks {name}"
        assert any(name in row for row in layout), f"docs/run-layout.md lacks {name}"
