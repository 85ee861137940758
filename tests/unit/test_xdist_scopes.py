"""The xdist scopes `make test` schedules contract + integration with
(tests/support/xdist_scopes.py): shared fixtures stay on one worker."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.xdist_scopes import LONGEST_FIRST, MODULE_FIXTURE_MODULES, schedule_rank, scope_of

REPO = Path(__file__).resolve().parents[2]


def test_a_contract_folder_is_one_scope():
    a = scope_of("tests/contract/sglang/test_sglang_oracle.py::test_room[1]")
    b = scope_of("tests/contract/sglang/test_sglang_contract.py::test_parse")
    assert a == b == "tests/contract/sglang"
    assert scope_of("tests/contract/simulator/test_server_runtime.py::t") != a


def test_a_module_fixture_module_is_one_scope_and_other_tests_their_own():
    assert scope_of("tests/integration/test_export.py::test_a") == \
        scope_of("tests/integration/test_export.py::test_b[x]") == "tests/integration/test_export.py"
    a = "tests/integration/test_exactly_once.py::test_sigkill_at_random_points_then_resume"
    b = "tests/integration/test_exactly_once.py::test_transient_errors_are_retried"
    assert scope_of(a) == a and scope_of(b) == b


def _module_scoped_fixtures(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef):
            for dec in node.decorator_list:
                if isinstance(dec, ast.Call) and any(
                        kw.arg == "scope" and isinstance(kw.value, ast.Constant)
                        and kw.value.value in ("module", "package", "session")
                        for kw in dec.keywords):
                    names.append(node.name)
    return names


def test_every_integration_module_with_a_module_fixture_is_listed():
    found = {str(p.relative_to(REPO)) for p in (REPO / "tests" / "integration").glob("test_*.py")
             if _module_scoped_fixtures(p)}
    assert found == set(MODULE_FIXTURE_MODULES), (
        "tests/support/xdist_scopes.py MODULE_FIXTURE_MODULES must list exactly the "
        f"integration modules with a module fixture: missing {sorted(found - MODULE_FIXTURE_MODULES)}, "
        f"stale {sorted(MODULE_FIXTURE_MODULES - found)}")


def test_an_integration_subfolder_is_one_scope():
    a = scope_of("tests/integration/sglang/test_job.py::test_rows")
    b = scope_of("tests/integration/sglang/test_replica_loss.py::test_kill")
    assert a == b == "tests/integration/sglang"


def test_the_longest_scopes_are_scheduled_first_and_exist():
    assert schedule_rank("tests/integration/sglang/test_job.py::t") == 0
    assert schedule_rank("tests/contract/sglang/test_x.py::t") == len(LONGEST_FIRST)
    for prefix in LONGEST_FIRST:
        assert (REPO / prefix).exists(), prefix
