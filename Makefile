# Everything a fresh machine needs: `make train` and `make test` create .venv and install into it.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
# The real MNIST files where this checkout has them beside it; elsewhere torchvision downloads into ./data.
SHARED_MNIST := $(abspath ../shared/data/mnist)
export ACCEL_MNIST_DATA_DIR ?= $(if $(wildcard $(SHARED_MNIST)/train-images-idx3-ubyte.gz),$(SHARED_MNIST),)

# Empty: `accelerate launch` uses the config the `accelerate config` wizard wrote, else its defaults.
ACCELERATE_CONFIG ?=
# Flags for `accelerate launch` itself, before `-m`: `LAUNCH_ARGS="-q --mixed_precision no"` runs an fp16
# config on a machine without a GPU. `--quiet` leaves out the launcher's own traceback after a run that
# stops with one `error:` line (after a launch of several processes from accelerate 1.16 on); the run's
# output is unchanged, and the launcher exits 1 either way.
LAUNCH_ARGS ?= --quiet
TRAIN_ARGS ?= --model cnn --epochs 1 --output-dir outputs/cnn --overwrite
PYTEST_ARGS ?=

.PHONY: train test test-fast test-gpu test-floors lint clean
train: $(VENV)/.installed
	$(BIN)/accelerate launch $(if $(ACCELERATE_CONFIG),--config_file $(ACCELERATE_CONFIG)) $(LAUNCH_ARGS) -m accel_mnist train $(TRAIN_ARGS)

# Every tier: tests/unit, tests/e2e, tests/launch and tests/gpu (skipped without a GPU), on
# TEST_WORKERS pytest-xdist workers: most launch tests wait on process start-up, so two workers
# keep CI's two cores busy. A module whose tests share module-scoped runs stays on one worker
# (xdist_group marks, --dist loadgroup). TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 2
test: $(VENV)/.installed $(VENV)/.deepspeed_ops
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# The unit tier alone: in process, on synthetic data, seconds.
test-fast: $(VENV)/.installed
	$(BIN)/pytest $(PYTEST_ARGS) tests/unit

# The GPU tier on a machine with a CUDA GPU, as cells sharing the card (tests/gpu_suite.py): the
# quick suite within a 530 s budget, or with SHARD=k/n shard k of the rest (SHARD=1/3, 2/3, 3/3).
# The table goes to $(GPU_OUT)/gpu_suite.md. Outside a venv (a GPU machine with the packages
# installed otherwise) it runs with python3.
GPU_OUT ?= outputs/gpu
GPU_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
SHARD ?=
test-gpu:
	$(GPU_PYTHON) -m tests.gpu_suite --out $(GPU_OUT)$(if $(SHARD), --shard $(SHARD))

# Lint, formatting and types; the settings are in pyproject.toml ([tool.ruff], [tool.mypy]).
lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

$(VENV)/.installed: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

# DeepSpeed compiles two ops of its own the first time a run on the CPU asks for them: its shared-memory
# collectives (deepspeed_shm_comm), which every DeepSpeed run on the CPU builds when it starts (a ~50 s
# ninja build, seen inside one matrix cell, with the suite's other DeepSpeed launches waiting on its
# lock meanwhile), and CPU Adam (the optimizer under offload), about 100 s on CI's two cores. `make test`
# builds both before the tests, into TORCH_EXTENSIONS_DIR (default ~/.cache/torch_extensions). Where
# they cannot build (no compiler), the tests that need them build them or say why themselves: only the
# head start is lost.
$(VENV)/.deepspeed_ops: $(VENV)/.installed
	$(BIN)/python -c "from deepspeed.accelerator import get_accelerator; \
		get_accelerator().create_op_builder('ShareMemCommBuilder').load(); \
		from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()" \
		> $(VENV)/deepspeed_ops.log 2>&1 || echo "note: DeepSpeed's ops did not build ($(VENV)/deepspeed_ops.log)"
	touch $@

# The floor job: every dependency at its pyproject.toml lower bound (.ci/floors.py pins them; needs
# Python >= 3.11 for tomllib) in a venv of its own, and the tests that exercise them.
FLOOR_VENV ?= .venv-floors
FLOOR_TESTS ?= tests/unit/test_packaging.py tests/e2e/test_packaging.py tests/launch/test_packaging.py \
	tests/unit/test_hf_data.py::test_array_columns_are_found_by_type tests/unit/test_predict.py::test_sixteen_bit_picture
# DeepSpeed's ops are built in a folder of the floor venv's own: torch 2.13 waits for as long as a
# `lock` file exists in an extension's build folder, and torch 2.14 (.venv) leaves that file there
# (it holds an OS lock on it instead), so a shared ~/.cache/torch_extensions would hang the first
# DeepSpeed launch here.
test-floors: $(FLOOR_VENV)/.installed
	TORCH_EXTENSIONS_DIR=$(abspath $(FLOOR_VENV))/torch_extensions \
	$(FLOOR_VENV)/bin/pytest $(PYTEST_ARGS) -k "not wheel" $(FLOOR_TESTS)

$(FLOOR_VENV)/.installed: pyproject.toml setup.py .ci/floors.py
	$(PYTHON) -m venv $(FLOOR_VENV)
	$(PYTHON) .ci/floors.py > $(FLOOR_VENV)/floors.txt
	$(FLOOR_VENV)/bin/python -m pip install --quiet -c $(FLOOR_VENV)/floors.txt -e . pytest
	$(FLOOR_VENV)/bin/python -m pip list --format freeze > $(FLOOR_VENV)/installed.txt
	touch $@

clean:
	rm -rf $(VENV) $(FLOOR_VENV) outputs
