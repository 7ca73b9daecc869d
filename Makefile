# GangJob developer and operator targets. Every target depends on `setup`, so a fresh clone
# needs no manual step. The local Kubernetes binaries are cached outside the repository
# (${XDG_CACHE_HOME:-~/.cache}/gangjob) and built on first use.

PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
CLUSTER_PROFILE ?= sim
NODES ?= 3

.PHONY: help setup lint test test-unit test-integration test-e2e manifests install uninstall \
        run cluster cluster-node down status build-k8s bench clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) on PATH" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $@

setup: $(STAMP) ## create .venv with the project (editable) and its dev deps

lint: setup ## ruff + mypy --strict + the committed CRD matches the API models
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m api.crd --check

manifests: setup ## generate the CRD (manifests/crd) from the pydantic models in api/
	$(BIN)/python -m api.crd

# The pinned kubectl from the cache (built on first use); KUBECONFIG says which cluster.
KUBECTL = $(BIN)/localcluster kubectl --

install: setup ## apply the CRD to the cluster of $$KUBECONFIG
	$(KUBECTL) apply --server-side --force-conflicts -k manifests/crd
	$(KUBECTL) wait --for condition=Established crd/gangjobs.gangjob.io --timeout=60s

uninstall: setup ## delete the CRD (and with it every GangJob) from the cluster of $$KUBECONFIG
	$(KUBECTL) delete -k manifests/crd --ignore-not-found

run: setup ## run the controller against the cluster of $$KUBECONFIG (from this checkout)
	$(BIN)/gangjob-controller --log-format text --metrics-bind-address 127.0.0.1:8080 \
		--health-probe-bind-address 127.0.0.1:8081

demo: setup ## a PyTorch DDP gang survives a killed worker on a local real kubelet (root)
	$(BIN)/python -m localcluster.demo

test: lint ## lint and every test tier (unit, integration on sim, e2e on a real node)
	$(BIN)/pytest tests

test-unit: setup ## pure tests only (no cluster)
	$(BIN)/pytest tests/unit

test-integration: setup ## tests on the local `sim` cluster
	$(BIN)/pytest tests/integration

test-e2e: setup ## tests on the local `node` cluster (real kubelet; needs root)
	$(BIN)/pytest tests/e2e

# `make bench BENCH_ARGS=--with-5000` adds N=5000 (long); `--scheduler-qps 500` gives the
# second set of figures with the scheduler's client rate raised.
BENCH_ARGS ?=
BENCH_STAMP := $(VENV)/.bench-installed

$(BENCH_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	@touch $@

bench: $(BENCH_STAMP) ## restart latency at scale, in place vs Recreate (N=100,1000; BENCH_ARGS=--with-5000)
	$(BIN)/python -m benchmarks.restart_scale --sizes 100,1000 $(BENCH_ARGS)

build-k8s: setup ## build the pinned Kubernetes, etcd and KWOK binaries into the cache
	$(BIN)/localcluster build

cluster: setup ## start the local cluster (CLUSTER_PROFILE=sim|node, NODES=3)
	$(BIN)/localcluster up --profile $(CLUSTER_PROFILE) --nodes $(NODES)

cluster-node: setup ## start the local cluster with one real kubelet
	$(BIN)/localcluster up --profile node

down: setup ## stop the local cluster
	$(BIN)/localcluster down --profile $(CLUSTER_PROFILE)

status: setup ## what the local clusters run
	$(BIN)/localcluster status

clean: ## remove the virtualenv and caches in the tree (not the Kubernetes binaries)
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
