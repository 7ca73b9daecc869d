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
        run demo-scale cluster cluster-node down down-node status build-k8s bench faults clean

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) on PATH" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,report]'
	@touch $@

setup: $(STAMP) ## create .venv with the project (editable) and its dev deps

lint: setup ## ruff + mypy --strict + the layering contracts + the CRD matches the API models
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python -m api.crd --check

manifests: setup ## generate the CRD (manifests/crd) from the pydantic models in api/
	$(BIN)/python -m api.crd

# The pinned kubectl from the cache (built on first use); KUBECONFIG says which cluster.
KUBECTL = $(BIN)/localcluster kubectl --

# What a controller run from this checkout (`make run`) needs in the cluster: the CRD, the
# ClusterRole its agents are bound to in each namespace that runs a GangJob, and the admission
# policy that narrows their pod patches. (`kubectl apply -k manifests/default` deploys all of
# it with the controller itself.)
install: setup ## the CRD, the agents' ClusterRole and the admission policy into $KUBECONFIG's cluster
	$(KUBECTL) apply --server-side --force-conflicts -k manifests/crd
	$(KUBECTL) apply --server-side --force-conflicts -f manifests/rbac/worker_role.yaml
	$(KUBECTL) apply --server-side --force-conflicts -k manifests/policy
	@# Retried: a CRD just created on a fresh apiserver has `conditions: null` for a moment,
	@# which `kubectl wait` takes for an error rather than for "not yet".
	@for try in 1 2 3 4 5; do \
		$(KUBECTL) wait --for condition=Established crd/gangjobs.gangjob.io --timeout=60s \
			&& exit 0; sleep 1; \
	done; exit 1

uninstall: setup ## remove what `install` applied (with the CRD, every GangJob)
	$(KUBECTL) delete --ignore-not-found -k manifests/policy
	$(KUBECTL) delete --ignore-not-found -f manifests/rbac/worker_role.yaml
	$(KUBECTL) delete --ignore-not-found -k manifests/crd

# `make run` runs the controller on this host. Its agents report arrivals to it at
# ARRIVAL_ADDRESS (host:port), which must be an address of this host that the pods reach: for a
# local `node` cluster, the host address `localcluster status` shows (e.g. 10.81.0.1:8082).
# Left empty, agents arrive by annotating their pod instead (it works, at a higher API cost).
# AGENT_IMAGE: the agent image the pods can get (`Dockerfile.agent`, pushed to your registry).
ARRIVAL_ADDRESS ?=
AGENT_IMAGE ?= localhost/gangjob-agent:dev
METRICS_ADDRESS ?= 127.0.0.1:8080
HEALTH_ADDRESS ?= 127.0.0.1:8081

run: setup ## the controller from this checkout against $KUBECONFIG's cluster (ARRIVAL_ADDRESS=)
	$(BIN)/gangjob-controller --log-format text --agent-image $(AGENT_IMAGE) \
		--metrics-bind-address $(METRICS_ADDRESS) --health-probe-bind-address $(HEALTH_ADDRESS) \
		$(if $(ARRIVAL_ADDRESS),--arrival-bind-address $(ARRIVAL_ADDRESS) \
		--arrival-url http://$(ARRIVAL_ADDRESS))

demo: setup ## a PyTorch DDP gang survives a killed worker on a local real kubelet (root)
	$(BIN)/python -m localcluster.demo

demo-scale: setup ## 1000 workers on the sim cluster with agents: one killed, the gang restarts in place
	$(BIN)/python -m localcluster.demoscale

# The unit tier is pure CPU: one process per core. The cluster tiers share clusters and wait on
# them, so they run one test at a time.
test: lint ## lint and every test tier (unit, integration on sim, e2e on a real node)
	$(BIN)/pytest -n auto tests/unit
	$(BIN)/pytest tests/integration tests/e2e

test-unit: setup ## pure tests only (no cluster)
	$(BIN)/pytest -n auto tests/unit

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
	$(BIN)/python -m benchmarks.scale --sizes 100,1000 $(BENCH_ARGS)

# The fault campaign (docs/reliability.md, which it rewrites): 105 seeded faults, 7 of each of 15
# kinds, on four gangs on the local `faults` sim cluster (started if down, stopped after), about
# 40 minutes. FAULTS_ARGS=--seed=7 for another schedule; the short campaign (10 faults) runs in
# `make test-integration`.
faults: setup ## the fault campaign: 105 seeded faults, checked invariants (docs/reliability.md)
	$(BIN)/python -m benchmarks.faults --seed 1 --faults 105 $(FAULTS_ARGS)

build-k8s: setup ## build the pinned Kubernetes, etcd and KWOK binaries into the cache
	$(BIN)/localcluster build

cluster: setup ## start the local cluster (CLUSTER_PROFILE=sim|node, NODES=3)
	$(BIN)/localcluster up --profile $(CLUSTER_PROFILE) --nodes $(NODES)

cluster-node: setup ## start the local cluster with one real kubelet
	$(BIN)/localcluster up --profile node

down: setup ## stop the local cluster (CLUSTER_PROFILE=sim|node)
	$(BIN)/localcluster down --profile $(CLUSTER_PROFILE)

down-node: setup ## stop the local cluster with the real kubelet
	$(BIN)/localcluster down --profile node

status: setup ## what the local clusters run
	$(BIN)/localcluster status

clean: ## remove the virtualenv and caches in the tree (not the Kubernetes binaries)
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
