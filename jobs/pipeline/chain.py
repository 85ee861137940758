"""The job's Ray Data chain: read -> validate -> admit -> generate -> write.

Each stage states the columns it reads and adds in its own module, and checks the ones it
reads once per batch (jobs/pipeline/stage_inputs.py): a batch without one fails at that
stage with one line naming the stage and the column. Generation runs
in an autoscaled pool of async actors (``actor_pool(min, max)``); Ray Data's
streaming executor keeps memory flat and back-pressures the read.
"""

from __future__ import annotations

from typing import Optional

import ray
import ray.data

from jobs.config import RunConfig
from jobs.pipeline.generate_stage import GenerateRows
from jobs.pipeline.admit_stage import admit_batch
from jobs.pipeline.settings import StageSettings
from jobs.pipeline.sink import RunSink
from jobs.io.run_store import RunStore
from jobs.io.sources import PromptFiles
from jobs.io.storage import Location
from jobs.pipeline.validate import validate_batch

# Every stage is I/O-bound or light: reserving whole CPUs would let the read and
# validate tasks starve the writer (rows then wait in memory instead of on storage).
# Capped concurrency: a fraction of a CPU would otherwise let Ray start dozens of
# Python workers at once (seconds of CPU each) for work two of them can do.
LIGHT_CPU = 0.1
LIGHT_TASKS = 2


# Ray Data's default block count for a read (DataContext.read_op_min_num_blocks).
MAX_READ_BLOCKS = 200


def read_blocks(rows: Optional[int], files: int, batch_size: int) -> Optional[int]:
    """How many blocks the read makes (``override_num_blocks``): one per generate batch,
    never more than Ray Data's default nor fewer than one per file; None (Ray Data's
    default) when the row count is not known.

    Ray Data merges what a read task yields into one block and, with no count given,
    splits it into 200: a 240-row session then validated and admitted its prompts in
    ~200 one-row tasks (~10 ms of CPU each across driver, raylet and worker, and a busier
    scheduling loop). Beyond 200 batches this is the default again."""
    if rows is None:
        return None
    batches = -(-rows // batch_size)
    return max(files, min(batches, MAX_READ_BLOCKS))


def light_tasks() -> ray.data.TaskPoolStrategy:
    """At most LIGHT_TASKS tasks of a light map stage at once (``compute=``: Ray 2.51+
    deprecates ``concurrency=`` on map stages; reads and writes still take it)."""
    return ray.data.TaskPoolStrategy(size=LIGHT_TASKS)


def actor_pool(min_actors: int, max_actors: int) -> ray.data.ActorPoolStrategy:
    """An actor pool autoscaled between ``min_actors`` and ``max_actors``."""
    return ray.data.ActorPoolStrategy(min_size=min_actors, max_size=max_actors)


def build(cfg: RunConfig, inputs: list[Location], table: list, stage: StageSettings,
          only: Optional[list] = None, rows: Optional[int] = None) -> ray.data.Dataset:
    """``table``: [ObjectRef of the driver's AdmissionTable] (jobs/pipeline/admission_table.py);
    ``only``: [ObjectRef of its sorted ordinals]: the read skips every other line;
    ``rows``: how many lines the read passes on (sizes its blocks: read_blocks)."""
    job = cfg.job
    blocks = read_blocks(rows, len(inputs), job.batch_size)
    ds = ray.data.read_datasource(PromptFiles(inputs, job.limit, job.batch_size, only,
                                              job.max_line_bytes),
                                  num_cpus=LIGHT_CPU, concurrency=LIGHT_TASKS,
                                  **({} if blocks is None else {"override_num_blocks": blocks}))
    ds = ds.map_batches(validate_batch, batch_format="pyarrow", batch_size=None,
                        num_cpus=LIGHT_CPU, compute=light_tasks())
    ds = ds.map_batches(admit_batch, batch_format="pyarrow", batch_size=None,
                        fn_kwargs={"table": table, "mix": stage.mix}, num_cpus=LIGHT_CPU,
                        compute=light_tasks())
    return generate(ds, cfg, stage)


def generate(ds: ray.data.Dataset, cfg: RunConfig, stage: StageSettings) -> ray.data.Dataset:
    """The autoscaled pool of async generate actors (also used by continuation)."""
    job = cfg.job
    store = RunStore.for_run(job.output, job.run_name, cfg.storage)  # drains recorded there
    return ds.map_batches(
        GenerateRows, batch_format="pyarrow", batch_size=job.batch_size,
        fn_constructor_args=(cfg.serve.app_name, cfg.serve.deployment_name, stage, store),
        compute=actor_pool(job.min_actors, job.max_actors),
        max_concurrency=job.max_batches_per_actor, num_cpus=LIGHT_CPU)


def write(ds: ray.data.Dataset, cfg: RunConfig, run_uri: str) -> None:
    ds.write_datasink(RunSink(run_uri, cfg.storage, cfg.job.rows_per_file),
                      ray_remote_args={"num_cpus": LIGHT_CPU}, concurrency=LIGHT_TASKS)
