"""Checks made after admission and before any engine is deployed: the reject guard
(job.max_reject_fraction) and the plan `--dry-run` prints. GPU hours are only spent on
an input that mostly parses."""

from __future__ import annotations

import collections
import re
from typing import TYPE_CHECKING, Any, Iterable, Optional

if TYPE_CHECKING:
    from jobs.pipeline.admission import Admission
    from jobs.config import RunConfig
    from jobs.io.run_store import RunStore

TOP_REASONS = 3
# Row-specific values (numbers, quoted ids and values) removed, a reason names its kind
# of fault; quoted field names ('messages', 'tools') stay.
_QUOTED = re.compile(r"(?<=\bid )'[^']*'|'(?![a-z_]+')[^']*'|\"[^\"]*\"")
_NUMBER = re.compile(r"\d+")


def reason_kind(reason: str) -> str:
    """E.g. 'not valid JSON: Expecting value at column 17' -> '... at column N'."""
    if (reason or "").startswith("duplicate id "):
        return "duplicate id"
    return _NUMBER.sub("N", _QUOTED.sub("'…'", reason or "unknown"))


class RejectTally:
    """Rejects counted by kind of reason, with the first file:line of each kind."""

    def __init__(self) -> None:
        self.counts: collections.Counter = collections.Counter()
        self.examples: dict[str, str] = {}

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def add(self, records: Iterable[dict[str, Any]]) -> None:
        for r in records:
            kind = reason_kind(r["reason"])
            self.counts[kind] += 1
            self.examples.setdefault(kind, f"{r['source']}:{r['line']}")

    def add_known(self, store: "RunStore") -> None:
        """The rejects earlier sessions wrote (admission hands over only new ones)."""
        table = store.read_kind("rejects", ["source", "line", "reason"])
        self.add(table.to_pylist())

    def top(self, n: int = TOP_REASONS) -> str:
        shown = [f"{count} x {kind} (e.g. {self.examples[kind]})"
                 for kind, count in self.counts.most_common(n)]
        more = len(self.counts) - n
        return "; ".join(shown + ([f"{more} more kinds"] if more > 0 else [])) or "none"


def reject_fraction(admission: "Admission") -> float:
    return admission.rejects / admission.total if admission.total else 0.0


def reject_problem(admission: "Admission", limit: float, tally: RejectTally,
                   dry_run: bool = False) -> Optional[str]:
    """Why the run must not deploy for this input (None when the rejects are within limit)."""
    fraction = reject_fraction(admission)
    if limit >= 1 or fraction <= limit:
        return None
    listed = ("a run writes every rejected row with its reason to rejects/" if dry_run
              else "rejects/ lists every rejected row with its reason")
    return (f"{admission.rejects} of {admission.total} input rows ({fraction:.1%}) were "
            f"rejected, more than job.max_reject_fraction={limit:g}: {tally.top()}. No engine "
            f"was deployed. Fix the input ({listed}) or raise job.max_reject_fraction (1.0 "
            f"disables this check)")


def plan_text(cfg: "RunConfig", store: "RunStore", admission: "Admission", tally: RejectTally,
              done: int, failed: int, retry_failed: bool) -> str:
    """What `jobs.generate` would do with this config and input, for --dry-run."""
    job, serve, scale = cfg.job, cfg.serve, cfg.serve.autoscaling
    mode = " --retry-failed" if retry_failed else ""
    limit = f" (job.limit={job.limit} per file)" if job.limit else ""
    verdict = "off" if job.max_reject_fraction >= 1 else (
        "WOULD STOP before deploying" if reject_problem(admission, job.max_reject_fraction,
                                                        tally) else "ok")
    guard = (f"{reject_fraction(admission):.1%} rejected, limit job.max_reject_fraction="
             f"{job.max_reject_fraction:g}: {verdict}")
    return "\n".join([
        f"dry run{mode} of run {job.run_name}: nothing deployed, nothing written",
        f"  run:       {store.uri}",
        f"  input:     {admission.total} rows in {len(admission.fingerprints)} file(s){limit}, "
        f"{admission.valid_keys} distinct valid ids",
        f"  rejects:   {admission.rejects} ({admission.new_rejects} not yet in rejects/): "
        f"{tally.top()}",
        f"  guard:     {guard}",
        f"  done:      {done} ids already in data/, {failed} open failures in failures/"
        + ("" if retry_failed else " (sent again only with --retry-failed)"),
        f"  generate:  {len(admission.table)} prompts now",
        f"  budget:    job.max_new_tokens={job.max_new_tokens}, "
        f"job.context_policy={job.context_policy}, "
        f"engine.context_length={cfg.engine.context_length}",
        f"  replicas:  {scale.min_replicas}..{scale.max_replicas} "
        f"(serve.autoscaling min/max) of {cfg.engine.kind} engine "
        f"{cfg.engine.model_name!r}, Serve app {serve.app_name!r}",
    ])
