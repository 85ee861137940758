"""What one in-process session costs on a cluster set up as the suite's: the machine's busy
CPU seconds and the wall time per session, after one warm-up session.

    python -m tests.support.session_cost --sessions 4 --rows 240

Most integration trials are a few sessions each, so this is the suite's unit of cost:
run it with and without a Ray or test setting (an environment variable such as
RAY_num_workers_soft_limit) to see what the setting saves. Starts its own moto S3 server
and local Ray cluster (as tests/integration/conftest.py does) and stops both; the
machine must be otherwise idle for the figures to mean anything.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from tests.support.cpu_profile import busy_cpu_s


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--rows", type=int, default=240)
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="a config override of every session (a YAML value), e.g. "
                             "--set engine.simulator.length_median_tokens=284")
    args = parser.parse_args(argv)
    os.environ.setdefault("RAYGEN_WARM_START", "0")  # as the suite runs
    import ray

    from cluster.local_stack import create_bucket, start_s3
    from serve_apps.engine_process import free_port
    from tests.integration import helpers

    tmp = Path(tempfile.mkdtemp(prefix="session-cost-"))
    port = free_port()
    s3 = start_s3(port, log_dir=tmp)
    try:
        create_bucket(helpers.BUCKET, port)
        endpoint = f"http://127.0.0.1:{port}"
        os.environ["RAYGEN_S3_ENDPOINT"] = endpoint
        ctx = ray.init(address="local", num_cpus=8, include_dashboard=True,
                       dashboard_host="127.0.0.1", dashboard_port=free_port(),
                       log_to_driver=False)
        os.environ["RAY_ADDRESS"] = ctx.address_info["gcs_address"]
        rows = helpers.write_prompts(tmp / "p.jsonl", args.rows)

        def session() -> None:
            tree = helpers.run_config(tmp, endpoint, rows_file=str(rows),
                                      job={"rows_per_file": 16, "batch_size": 8})
            for override in args.set:
                _apply(tree, override)
            status = helpers.run(tree).status
            if status != "succeeded":
                raise SystemExit(f"a session ended {status}")
        session()  # deploys the app, warms the cluster
        busy0, t0 = busy_cpu_s(), time.monotonic()
        for _ in range(args.sessions):
            session()
        busy, wall = busy_cpu_s() - busy0, time.monotonic() - t0
        knobs = {k: v for k, v in os.environ.items() if k.startswith("RAY_") and k not in
                 ("RAY_ADDRESS", "RAY_USAGE_STATS_ENABLED")}
        print(f"{args.sessions} sessions of {args.rows} rows: {busy / args.sessions:.1f} "
              f"busy CPU-s and {wall / args.sessions:.1f} s wall per session; settings "
              f"{knobs or 'Ray defaults'}; overrides {args.set or 'none'}")
    finally:
        from ray import serve
        if ray.is_initialized():
            serve.shutdown()
            ray.shutdown()
        if s3 is not None:
            s3.terminate()
            s3.wait(timeout=10)
    return 0


def _apply(tree: dict, override: str) -> None:
    """``section.key=value`` into the config tree (the value read as YAML)."""
    import yaml
    path, sep, value = override.partition("=")
    if not sep or not path:
        raise SystemExit(f"--set {override!r}: expected SECTION.KEY=VALUE")
    *parents, last = path.split(".")
    node = tree
    for name in parents:
        node = node.setdefault(name, {})
    node[last] = yaml.safe_load(value)


if __name__ == "__main__":
    sys.exit(main())
