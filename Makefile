# gpufleet.nvidia: one entry point for the demo and the test suite.
#
#   make demo   bring up the simulated fleet and run the main job on it
#   make test   everything CI runs: ansible-lint, ansible-test sanity, unit, integration and molecule
#
# Each target installs what it needs: Debian packages (as root), a virtualenv in .venv, and the
# simulated fleet's base root filesystem (cached in .cache/simfleet).

SHELL := /bin/bash
PYTHON ?= python3
VENV := $(CURDIR)/.venv
PY := $(VENV)/bin/python
# awx.awx (shipped in the ansible package) for awx/configure.yml, in a virtualenv of its own.
VENV_AWX := $(CURDIR)/.venv-awx
AWX_COLLECTIONS := $(CURDIR)/.build/awx-collections
export ANSIBLE_COLLECTIONS_PATH := $(CURDIR)/.build/collections
export ANSIBLE_CONFIG := $(CURDIR)/tests/ansible.cfg
export PATH := $(VENV)/bin:$(PATH)
export PYTHONDONTWRITEBYTECODE := 1

# Debian packages the simulated fleet and the tests need on the control host (slurmctld,
# slurm-client and munge: the host side of `simfleet up --slurm`; chromium: the HTML reports'
# browser test, which pulls in libxnvctrl0, an X client library and no NVIDIA driver).
HOST_PACKAGES := debootstrap debian-archive-keyring systemd-container kmod binutils dpkg-dev \
	apt-utils gnupg openssh-client python3-venv iproute2 procps mount git shellcheck prometheus \
	slurmctld slurm-client munge chromium

# Molecule scenarios, each on a simulated fleet of its own.
MOLECULE_SCENARIOS := $(sort $(notdir $(wildcard molecule/*)))

# The parts of `make test`, in the order they run.
TEST_PARTS := lint sanity unit integration molecule

.PHONY: test timed demo deps host-packages venv venv-awx collection lint sanity unit integration molecule clean

test: deps
	@$(MAKE) --no-print-directory timed PARTS="$(TEST_PARTS)"

# Run the targets in PARTS one after the other and print how long each took (wall-clock seconds);
# stop at the first that fails.
timed:
	@summary=""; begin=$$(date +%s); \
	for part in $(PARTS); do \
	  start=$$(date +%s); \
	  if $(MAKE) --no-print-directory $$part; then status=ok; else status=FAILED; fi; \
	  line=$$(printf '%-12s %-6s %6d s' "$$part" "$$status" $$(( $$(date +%s) - start ))); \
	  echo "== $$line"; summary="$$summary$$line\n"; \
	  if [ "$$status" = FAILED ]; then printf '== durations\n%b' "$$summary"; exit 1; fi; \
	done; \
	printf '== durations\n%b%-19s %6d s\n' "$$summary" "total" $$(( $$(date +%s) - begin ))

deps: host-packages venv collection

host-packages:
	@missing=""; for p in $(HOST_PACKAGES); do \
	  dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then echo "missing Debian packages:$$missing (run as root, or: apt-get install$$missing)"; exit 1; fi; \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

venv: $(VENV)/.installed

$(VENV)/.installed: requirements-test.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-test.txt
	touch $@

# awx.awx is linked into .build/awx-collections so that ansible-lint (from .venv) resolves its modules.
venv-awx: $(VENV_AWX)/.installed
	@mkdir -p $(AWX_COLLECTIONS)/ansible_collections/awx
	@ln -sfn "$$($(VENV_AWX)/bin/python -c 'import ansible_collections, os; print(os.path.join(list(ansible_collections.__path__)[0], "awx", "awx"))')" \
	  $(AWX_COLLECTIONS)/ansible_collections/awx/awx

$(VENV_AWX)/.installed: requirements-awx.txt
	$(PYTHON) -m venv $(VENV_AWX)
	$(VENV_AWX)/bin/python -m pip install -q --upgrade pip
	$(VENV_AWX)/bin/python -m pip install -q -r requirements-awx.txt
	touch $@

collection:
	@mkdir -p .build/collections/ansible_collections/gpufleet
	@ln -sfn $(CURDIR) .build/collections/ansible_collections/gpufleet/nvidia

lint: venv venv-awx collection
	ANSIBLE_COLLECTIONS_PATH=$(ANSIBLE_COLLECTIONS_PATH):$(AWX_COLLECTIONS) $(VENV)/bin/ansible-lint --profile production
	$(VENV)/bin/antsibull-changelog lint

sanity: venv collection
	PYTHON=$(PYTHON) bash tests/sanity/run-sanity.sh

unit: venv venv-awx collection
	GPUFLEET_REQUIRE_AWX=1 $(PY) -m pytest -q tests/unit

# Integration modules run in INTEGRATION_WORKERS pytest-xdist workers, a whole module (and its fleet)
# in one worker, the longest first (tests/integration/conftest.py): most of a fleet test's time is
# spent waiting for boots, drains and jobs, not on the controller's CPU.
INTEGRATION_WORKERS ?= 3

integration: deps
	$(PY) -m pytest -q -n $(INTEGRATION_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25 tests/integration

molecule: deps
	@set -e; for scenario in $(MOLECULE_SCENARIOS); do \
	  echo "== molecule test -s $$scenario"; \
	  $(VENV)/bin/molecule test -s $$scenario; \
	done

demo: deps
	$(PY) tools/demo.py

clean:
	-tests/simfleet/bin/simfleet down --purge 2>/dev/null
	rm -rf .build .venv .venv-awx .venv-sanity tests/output
