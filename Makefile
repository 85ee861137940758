# raygen: the two commands a fresh machine needs are `make run` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export AWS_ACCESS_KEY_ID ?= raygen-local
export AWS_SECRET_ACCESS_KEY ?= raygen-local
export AWS_DEFAULT_REGION ?= us-east-1
export AWS_EC2_METADATA_DISABLED := true
export RAY_USAGE_STATS_ENABLED := 0
export RAYGEN_S3_ENDPOINT ?= http://127.0.0.1:9330
# Python caches what it compiles (__pycache__): the suite and a run start hundreds of
# processes (Ray workers, engines, drivers) that import the project's own modules, and an
# environment that turns the cache off would have each compile them again (~0.4 CPU-s a
# process on a 2-core machine).
unexport PYTHONDONTWRITEBYTECODE
DEMO_ROWS ?= 300
DEMO_SIM_ROWS ?= 2400
# Extra pytest options for the test targets, e.g. make test PYTEST_FLAGS=--durations=50
PYTEST_FLAGS ?=

.PHONY: setup prometheus run run-sim test test-fast stack-up stack-down clean

setup: $(VENV)/.installed
# The project and its test extra: all the unit tier needs. uv (pinned) installs it: on this
# 2-core machine ~30 s against pip's ~75 s, downloads in parallel and the bytecode compiled
# at once (every Ray worker then loads it, none compiles it). pip stays in the venv for
# SGLang's scripts below (they read pip's own configuration: a local CPU torch wheel).
UV_VERSION := 0.13.9
$(VENV)/.base: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q uv==$(UV_VERSION)
	$(PY) -m uv pip install -q --python $(PY) --compile-bytecode --upgrade pip -e ".[test]"
	touch $@
$(VENV)/.installed: $(VENV)/.base cluster/install_sglang_oracle.sh
	# SGLang 0.5.23's parser, CPU request path and real CPU engine (no GPU stack): the
	# contract tests against SGLang's code, the real-engine tests and the demo.
	bash cluster/install_sglang_oracle.sh $(VENV)
	touch $@

# Debian's prometheus package brings prometheus and promtool (alert rule tests).
prometheus:
	@command -v promtool >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; \
	  else echo "promtool missing: sudo apt-get install prometheus" >&2; exit 1; fi; }
	@systemctl disable --now prometheus >/dev/null 2>&1 || true

stack-up: setup
	$(PY) -m cluster.local_stack up

stack-down:
	-$(PY) -m cluster.local_stack down

# The demo on SGLang's real engine (CPU, a tiny sampled model built here): generate at a
# 256-token budget, then continue the truncated rows to 512, token-exactly.
run: stack-up
	mkdir -p .local
	$(PY) -m serve_apps.engines.sglang_cpu.models sampled
	$(PY) -m jobs.demo_prompts --rows $(DEMO_ROWS) --out .local/demo_prompts.jsonl \
	  --upload s3://raygen-demo/prompts/demo.jsonl
	$(PY) -m jobs.generate --config jobs/configs/demo.yaml
	$(PY) -m jobs.generate --config jobs/configs/demo.yaml --continue-truncated --max-total-tokens 512

# The story-scale demo on the simulator: 2,400 prompts, ~18% cut at 4096.
run-sim: stack-up
	mkdir -p .local
	$(PY) -m jobs.demo_prompts --rows $(DEMO_SIM_ROWS) --out .local/demo_sim_prompts.jsonl \
	  --upload s3://raygen-demo/prompts/demo-sim.jsonl
	$(PY) -m jobs.generate --config jobs/configs/demo-sim.yaml

# Three tiers (tests/README.md): the pure unit tier in parallel, then contract and
# integration on TEST_WORKERS xdist workers; each worker starts its own Ray cluster and
# S3 server and shares them across its tests (loadscope: tests sharing a module or folder
# fixture stay on one worker, tests/support/xdist_scopes.py).
# The unit tier but its few tests of the SGLang set's tokenizer libraries (marked
# sglang_set) needs only the base install: it runs while SGLang's (network- and disk-bound)
# install goes on beside it; the sglang_set tests and the rest wait for that install, then
# run side by side.
TEST_WORKERS ?= 2
test: $(VENV)/.base prometheus
	@$(MAKE) --no-print-directory $(VENV)/.installed > $(VENV)/install.log 2>&1 & install=$$!; \
	  $(PY) -m pytest tests/unit -q -n auto -m "not sglang_set" $(PYTEST_FLAGS); unit=$$?; \
	  wait $$install; installed=$$?; cat $(VENV)/install.log; \
	  [ $$unit = 0 ] && [ $$installed = 0 ] || { echo "make test: unit tier exit $$unit, SGLang install exit $$installed" >&2; exit 1; }
	@# beside contract and integration, in one process: the sglang_set unit tests (~7 s) and
	@# the tests marked pypi (pip's resolver against PyPI, ~60 s of which ~20 CPU-s: it
	@# waits on the network, so it would hold an xdist worker while using a third of a core)
	@RAYGEN_TEST_TIMES= $(PY) -m pytest tests/unit tests/contract/cluster -q -m "sglang_set or pypi" $(PYTEST_FLAGS) > $(VENV)/beside.log 2>&1 & beside=$$!; \
	  $(PY) -m pytest tests/contract tests/integration -q -n $(TEST_WORKERS) --dist loadscope -m "not pypi" $(PYTEST_FLAGS); rest=$$?; \
	  wait $$beside; besides=$$?; echo "--- sglang_set unit tests and pypi tests (beside):"; cat $(VENV)/beside.log; \
	  [ $$rest = 0 ] && [ $$besides = 0 ] || { echo "make test: contract + integration exit $$rest, sglang_set + pypi tests exit $$besides" >&2; exit 1; }

# The unit tier alone: no services, no SGLang engine, no promtool; seconds (its
# sglang_set tests use the SGLang set's tokenizer libraries: installed by setup).
test-fast: setup
	$(PY) -m pytest tests/unit -q -n auto $(PYTEST_FLAGS)

clean: stack-down
	rm -rf .local
