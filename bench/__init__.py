"""Side-by-side benchmark of raygen against a plain asyncio client and ray.data.llm.

    python -m bench --prompts 10000 --replicas 4 --time-scale 0.1
    python -m bench --prompts 100000 --replicas 4 --zero-latency --modes raygen,plain

One run drives the same prompt file through the same simulated engine processes
(the Serve replicas' own engines), one mode after the other, and reports output
tok/s, engine saturation (from the engines' own counters), the tail, control-plane
CPU per row and peak RSS. ``python -m bench scale`` (bench/resume_scale.py) is the
scale benchmark: a resume of a run holding 90K/900K rows next to a fresh run of the
same new prompts, on loopback and behind a ~30 ms S3 latency proxy. See
BENCHMARKS.md for the method and the results.
"""
