# The two commands a newcomer runs on a fresh machine: `make serve` and `make test`.
VENV := .venv
PODIUM := $(VENV)/bin/podium

.PHONY: install serve test test-fast lint

install:  ## create .venv with podium and the platform-pinned engine (idempotent)
	bash scripts/install.sh

serve: install  ## materialize the default model and serve it: OpenAI API on :8000, gRPC :8001
	$(PODIUM) materialize
	$(PODIUM) serve --http-port 8000 --grpc-port 8001

test: install  ## the whole suite: lint, unit tests, real-engine and real-database tests (CI)
	bash scripts/test.sh

test-fast: install  ## the fast tier: lint and every test but engine/postgres/ray (tests/README.md)
	bash scripts/test.sh --fast

lint:
	$(VENV)/bin/ruff check src tests bench
