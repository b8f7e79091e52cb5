# cozystack.gpu: one entry point for setting up, testing and running the local platform.
#   make test      set everything up on a fresh machine and run the whole suite (CI runs this)
#   make cluster   start a real local control plane (and, as root, a real node); print `export KUBECONFIG=...`
#   make demo      the whole story on a local control plane, act by act; leaves it up
SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := test

PYTHON ?= python3.11
VENV ?= .venv
BIN := $(abspath $(VENV))/bin
CACHE := .cache
# The environment is rebuilt when the pinned requirements or the package metadata change.
STAMP := $(VENV)/.installed-$(shell cat requirements/dev.txt controller/pyproject.toml | sha256sum | cut -c1-12)
BIN_DIR_FILE := $(CACHE)/bin-dir

.PHONY: help test-unit test setup binaries image lint alerts pytest pytest-and-checks sanity units ansible-lint galaxy-import molecule cluster cluster-down demo demo-down build docs release release-rebuild soak

test: setup binaries image lint alerts pytest-and-checks molecule ## set up everything on a fresh machine and run the whole suite (CI runs this)
	@echo "== make test passed == ($$(date -u +%T))" >&2

# `make help`: every target with the text after its `##`.
help: ## list the targets
	@awk -F':.*## ' '/^[a-z-]+:.*## / {printf "  make %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# The unit tests alone (no API server, no binaries), for quick loops: a minute or two.
test-unit: setup ## the unit tests alone, a minute or two (no binaries, no API server)
	cd controller && $(BIN)/pytest -p no:cacheprovider -q tests/unit

PROTO := controller/cozystack_gpu/agent/podresources/api.proto
PROTO_OUT := $(PROTO:.proto=_pb2.py)

setup: $(STAMP) $(PROTO_OUT) ## the Python environment (.venv) and the generated pod-resources messages

# kubelet's pod-resources messages are compiled from the .proto, never written by hand.
$(PROTO_OUT): $(PROTO) $(STAMP)
	$(BIN)/python controller/gen_protos.py

$(STAMP):
	@echo "== python environment ($(PYTHON)) == ($$(date -u +%T))" >&2
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements/dev.txt
	$(BIN)/pip install -q --no-deps -e controller
	touch $@

# kube-apiserver, etcd, kubectl and helm built from source once per machine (cached in
# ~/.cache/cozystack-gpu); prints progress while a first build runs. Also the real node's
# kubelet, containerd and pause image, after the Debian packages it takes from the
# distribution (runc, the CNI plugins, podman: tools/node-packages.sh, apt-get only when one
# is missing).
binaries: ## build the control plane, the real node, helm, KubeVirt and Prometheus from source, once per machine
	@echo "== control plane binaries == ($$(date -u +%T))" >&2
	tools/node-packages.sh
	mkdir -p $(CACHE)
	tools/build-binaries.sh > $(BIN_DIR_FILE).tmp && mv $(BIN_DIR_FILE).tmp $(BIN_DIR_FILE)
	@echo "using $$(cat $(BIN_DIR_FILE))" >&2

# The controller image (controller/Containerfile) built with podman from a local Debian base
# and host-built wheels, once per machine for a given tree (tools/build-image.sh); the
# image tests in pytest run it. Needs root; a first build takes about 3.5 minutes.
image: setup ## build the controller's OCI image with podman (needs root)
	@echo "== controller image == ($$(date -u +%T))" >&2
	tools/build-image.sh >/dev/null

lint: setup ## ruff, mypy, the import layers and the changelog fragments
	@echo "== ruff + mypy + import layers + changelog fragments == ($$(date -u +%T))" >&2
	$(BIN)/antsibull-changelog lint
	cd controller && $(BIN)/ruff check . && $(BIN)/ruff format --check .
	$(BIN)/ruff check --config controller/pyproject.toml plugins/module_utils plugins/action
	$(BIN)/ruff format --check --config controller/pyproject.toml plugins/module_utils plugins/action
	$(BIN)/ruff check --config controller/pyproject.toml tools/release.py
	$(BIN)/ruff format --check --config controller/pyproject.toml tools/release.py
	$(BIN)/mypy --config-file controller/pyproject.toml tools/release.py
	cd controller && $(BIN)/mypy cozystack_gpu cozystack_gpu_testkit
	cd controller && $(BIN)/lint-imports --no-cache
	BIN=$(BIN) tools/module-utils-imports.sh
	$(BIN)/mypy --config-file controller/pyproject.toml plugins/module_utils

# The chart's alerting rules as it renders them: promtool check rules, then the rules' unit
# tests (controller/tests/alerts); about a second.
alerts: setup binaries ## promtool: check and unit-test the chart's alerting rules
	@echo "== promtool: the chart's alerting rules == ($$(date -u +%T))" >&2
	PYTHON=$(BIN)/python COZYSTACK_GPU_BIN_DIR=$$(cat $(BIN_DIR_FILE)) tools/check-alerts.sh

# Two pytest processes at once (tools/pytest-lanes.sh): the tests that bring their own plane,
# node or image (marked own_plane) beside those that share the session's plane.
pytest: setup binaries ## unit, integration, chart, image and e2e tests against a real API server
	@echo "== pytest (unit + integration against a real kube-apiserver) == ($$(date -u +%T))" >&2
	cd controller && COZYSTACK_GPU_BIN_DIR=$$(cat ../$(BIN_DIR_FILE)) PYTEST=$(BIN)/pytest \
	  ../tools/pytest-lanes.sh --durations=25

# pytest with the collection's checks (sanity, units, ansible-lint, galaxy-import) beside it
# at the lowest CPU priority: they fill what pytest leaves idle instead of adding four
# minutes after it (tools/beside-pytest.sh). Molecule is not among them: its two lanes keep
# both cores busy.
pytest-and-checks: setup binaries build ## pytest, and the collection's checks beside it (niced)
	MAKE="$(MAKE)" tools/beside-pytest.sh

# The fault suite again and again beside a CPU load (controller/benchmarks/soak.py): each
# run's outcome and figures, then the tally; RUNS=10 and BURNERS=4 by default. Not in `test`.
soak: setup binaries ## the fault suite RUNS times on a loaded machine (BURNERS CPU spinners)
	cd controller && COZYSTACK_GPU_BIN_DIR=$$(cat ../$(BIN_DIR_FILE)) $(BIN)/python \
	  benchmarks/soak.py --runs $(or $(RUNS),10) --burners $(or $(BURNERS),4) \
	  $(if $(TESTS),--tests $(TESTS))

sanity: setup ## ansible-test sanity, offline
	@echo "== ansible-test sanity (offline, no ignore file) == ($$(date -u +%T))" >&2
	tools/ansible-test.sh sanity --python 3.11

units: setup ## ansible-test units (modules and module_utils)
	@echo "== ansible-test units (modules and module_utils) == ($$(date -u +%T))" >&2
	tools/ansible-test.sh units --python 3.11 --local

ansible-lint: setup ## ansible-lint, production profile
	@echo "== ansible-lint (production profile, offline) == ($$(date -u +%T))" >&2
	tools/molecule-lint.sh

# Roles in podman containers with real systemd; the platform (podman, runc, a debootstrapped
# image) is prepared once per machine by tools/molecule-platform.sh. Needs root.
molecule: setup binaries ## the roles in podman containers with real systemd (needs root)
	@echo "== molecule scenarios == ($$(date -u +%T))" >&2
	COZYSTACK_GPU_BIN_DIR=$$(cat $(BIN_DIR_FILE)) tools/molecule-test.sh

# docs/api.md is generated from the CRDs (a unit test fails while it is stale).
docs: setup ## regenerate docs/api.md from the CRDs
	$(BIN)/python tools/gen_api_docs.py

build: setup ## the collection tarball
	$(BIN)/ansible-galaxy collection build --force --output-path $(CACHE)/dist

# The checks Galaxy runs when the collection is uploaded (galaxy-importer, offline, in a venv
# of its own made once per machine): a collection Galaxy would refuse fails here, and
# `make release` runs the same on the release's tarball before recording it.
galaxy-import: build ## Galaxy's upload checks (galaxy-importer) on the collection tarball
	@echo "== galaxy-importer on the collection tarball == ($$(date -u +%T))" >&2
	COZYSTACK_GPU_PYTHON=$(PYTHON) tools/galaxy-import.sh \
	  $(CACHE)/dist/cozystack-gpu-$$(sed -n 's/^version: //p' galaxy.yml).tar.gz

# A release: make release VERSION=x.y.z [DRY_RUN=1] [SKIP_IMAGE=1]. Versions in lockstep,
# CHANGELOG.rst from the fragments, the release commit, the collection, the chart, the image
# as an OCI archive and SHA256SUMS in dist/<version>/, and the entry in releases.yaml
# (tools/release.py; it refuses a version that is not semver or not newer, and a dirty tree).
release: setup $(if $(DRY_RUN),,binaries) ## cut a release: make release VERSION=x.y.z [DRY_RUN=1] [SKIP_IMAGE=1]
	$(if $(VERSION),,$(error give the version: make release VERSION=x.y.z))
	COZYSTACK_GPU_BIN_DIR=$$(cat $(BIN_DIR_FILE) 2>/dev/null || true) $(BIN)/python tools/release.py \
	  cut $(VERSION) $(if $(DRY_RUN),--dry-run) $(if $(SKIP_IMAGE),--skip-image)

# A recorded release built again from its commit in releases.yaml (its collection, chart,
# image and SHA256SUMS in dist/<version>/): make release-rebuild VERSION=x.y.z [SKIP_IMAGE=1].
# `make release` cuts a new version and refuses one that exists.
release-rebuild: setup binaries ## rebuild a recorded release from its commit: make release-rebuild VERSION=x.y.z
	$(if $(VERSION),,$(error give the version: make release-rebuild VERSION=x.y.z))
	COZYSTACK_GPU_BIN_DIR=$$(cat $(BIN_DIR_FILE)) $(BIN)/python tools/release.py \
	  rebuild $(VERSION) $(if $(SKIP_IMAGE),--skip-image)

cluster: setup binaries ## a local control plane with KubeVirt and (as root) a real node, no product; prints export KUBECONFIG=...
	@COZYSTACK_GPU_BIN_DIR=$$(cat $(BIN_DIR_FILE)) $(BIN)/python -m cozystack_gpu_testkit.local_cluster up

cluster-down: setup ## stop the local control plane
	@$(BIN)/python -m cozystack_gpu_testkit.local_cluster down

# The chart's controller as pods on a real node (containerd and kubelet; where this machine
# cannot run one, or NODE=no, as a local process), three simulated GPU hosts laid out by the
# host playbook with their agents as local processes, tenants' orders, a VM's start, a node
# failure (controller/cozystack_gpu_testkit/demo). The cluster stays up; demo-down stops it.
# CLUSTER=existing runs it on the cluster $KUBECONFIG names (only where none of its objects is
# there yet; each it makes is labelled demo.cozystack.io/run, and demo-down removes only those);
# otherwise $KUBECONFIG is ignored.
demo: setup binaries ## the whole story on a local control plane (CLUSTER=existing: on $KUBECONFIG's)
	@COZYSTACK_GPU_BIN_DIR=$$(cat $(BIN_DIR_FILE)) $(BIN)/python -m cozystack_gpu_testkit.demo up \
		$(if $(filter existing,$(CLUSTER)),--existing-cluster) $(if $(NODE),--node=$(NODE))

demo-down: setup ## stop everything the demo started
	@$(BIN)/python -m cozystack_gpu_testkit.demo down
