# Entry points. Each target does its own set-up (scripts/setup.sh is quick when
# everything is current), so any of them works on a fresh Debian 12 machine as root.
SHELL := /bin/bash
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
export PATH := $(BIN):$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
SCENARIO ?= fleet
# Scenarios `make test` runs, in order: llama_cpp compiles first, so the
# scenarios after it install its artifact (the controller keeps it) instead of compiling.
SCENARIOS ?= nvidia_stack gpu_tuning llama_cpp model fleet
TIMED := scripts/timed.sh
# CI's 90 minutes on 2 cores hold every scenario but not every slow day-two test (whole
# rollouts, rebuilds, uninstall/redeploy, split plans: marked day_two): `make test` leaves
# them out, `make test DAY_TWO=1` and `make molecule SCENARIO=...` run them too.
DAY_TWO ?=
TEST_MARKS := $(if $(DAY_TWO),,not day_two)

.PHONY: setup demo demo-down test lint unit molecule molecule-all syntax cuda-build-check

setup:
	@scripts/setup.sh

## The main job on the embedded demo fleet: four simulated V100 hosts, then site.yml.
demo: setup
	ansible-playbook -i inventories/demo tests/harness/fleet.yml
	ansible-playbook -i inventories/demo site.yml

demo-down: setup
	ansible-playbook -i inventories/demo tests/harness/fleet.yml -e fleet_state=absent

## Everything CI runs, with the time each part took.
test: setup
	@$(TIMED) test "$(MAKE) --no-print-directory lint unit molecule-all"

lint: setup
	@$(TIMED) lint "yamllint --strict . && ansible-lint && ansible-playbook --syntax-check -i inventories/production site.yml"

unit: setup
	@$(TIMED) unit "python -m pytest -q -n auto tests/unit"

molecule: setup
	@$(TIMED) "molecule $(SCENARIO)" "molecule test -s $(SCENARIO)"

molecule-all: setup
	@export PYTEST_ADDOPTS="-m '$(TEST_MARKS)'"; for s in $(SCENARIOS); do $(TIMED) "molecule $$s" "molecule test -s $$s" || exit 1; done

## Not in CI (slow: ~21 min on 2 cores with an empty ccache; needs Debian's archive): llama.cpp's CUDA
## backend compiled for sm_70 with a real CUDA 11.8 toolchain, checked with cuobjdump.
cuda-build-check: setup
	@$(TIMED) cuda-build-check scripts/cuda-build-check.sh
