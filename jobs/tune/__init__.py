"""`raygen tune --config FILE`: a short sweep of one engine of the config, recommending
its running-request cap and the rows in flight per engine.

Layout: ``plan.py`` (the sweep's shape from the config and the flags; what cannot be
tuned), ``prompts.py`` (a sample of the run's own prompts), ``measure.py`` (the config's
engine started at each cap, a closed-loop client at each concurrency, the engine's own
counters over each point), ``recommend.py`` (the best point that does not retract, the
settings it means, the table), ``command.py`` (the command). docs/tuning.md says how to
read it.

Why jobs/ and not bench/: it is a user command on the run's own config and prompts, run
inside the GPU image, which ships contract/, serve_apps/, jobs/ and cluster/ but not
bench/ (cluster/Dockerfile). It needs no Ray and no S3 server: one engine process on
this machine, as a replica would start it (serve_apps/engine_process.py), spoken to as a
replica does (serve_apps/generation.py).
"""
