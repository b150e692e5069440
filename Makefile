# Everything a fresh machine needs: `make train` and `make test` create .venv and install into it.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
# The real MNIST files where this checkout has them beside it; elsewhere torchvision downloads into ./data.
SHARED_MNIST := $(abspath ../shared/data/mnist)
export ACCEL_MNIST_DATA_DIR ?= $(if $(wildcard $(SHARED_MNIST)/train-images-idx3-ubyte.gz),$(SHARED_MNIST),)

# Empty: `accelerate launch` uses the config the `accelerate config` wizard wrote, else its defaults.
ACCELERATE_CONFIG ?=
TRAIN_ARGS ?= --model cnn --epochs 1 --output-dir outputs/cnn --overwrite
PYTEST_ARGS ?=

.PHONY: train test lint clean
train: $(VENV)/.installed
	$(BIN)/accelerate launch $(if $(ACCELERATE_CONFIG),--config_file $(ACCELERATE_CONFIG)) -m accel_mnist train $(TRAIN_ARGS)

test: $(VENV)/.installed
	$(BIN)/pytest $(PYTEST_ARGS)

# Lint, formatting and types; the settings are in pyproject.toml ([tool.ruff], [tool.mypy]).
lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

clean:
	rm -rf $(VENV) outputs
