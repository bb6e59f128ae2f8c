# mtx — the two commands a newcomer needs are `make demo` and `make test`; both install first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The CPU build of torch is installed first and pinned: an unpinned `torch` pulls a multi-GB CUDA build.
# pyproject.toml keeps the permissive torch>=2.4 for users with GPUs.
TORCH  ?= torch==2.13.0
DEMO   := runs/demo

.PHONY: install install-extras test test-fast test-slow lint coverage mutants demo docs docs-serve bench gpu-check gpu-quality clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(TORCH)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# Every optional extra, with torch kept at its pin, so that no test of them skips: export (transformers,
# safetensors, ctranslate2 for `mtx export`), report (matplotlib for `mtx report -o`), tensorboard, serve
# (FastAPI, uvicorn and Swagger UI's files for `mtx serve`), docs (MkDocs, for the site's strict build), langid
# (the language identifier of data.filter.language_id), marian (transformers and sentencepiece for `mtx import`),
# documents (sentencex for --split-sentences).
EXTRAS       := dev,export,ct2,report,tensorboard,serve,docs,langid,marian,documents
EXTRAS_STAMP := $(VENV)/.extras-installed

install-extras: $(EXTRAS_STAMP)

$(EXTRAS_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet $(TORCH) -e '.[$(EXTRAS)]'
	touch $(EXTRAS_STAMP)

# The whole suite: unit, integration (the CLI pipeline), distributed (gloo) and slow system tests. It installs
# the extras first, so that a newcomer runs the tests CI runs; -rs lists what still skips, and why (a browser or
# Graphviz that only the system's package manager installs: .ci/run does).
test: install-extras
	OMP_WAIT_POLICY=PASSIVE $(BIN)/pytest -q -rs --durations=15

test-fast: install-extras
	OMP_WAIT_POLICY=PASSIVE $(BIN)/pytest -q -rs -m "not slow and not dist"

test-slow: install-extras
	OMP_WAIT_POLICY=PASSIVE $(BIN)/pytest -q -rs -m "slow or dist"

lint: install
	$(BIN)/ruff check mtx tests bench .ci

# Line and branch coverage of mtx/ over the whole suite, subprocesses (the CLI, torchrun's workers) included:
# a summary here, the annotated source in coverage-html/index.html.
coverage: install-extras
	rm -f .coverage .coverage.*
	OMP_WAIT_POLICY=PASSIVE $(BIN)/coverage run -m pytest -q -p no:cacheprovider
	$(BIN)/coverage combine -q
	$(BIN)/coverage report --skip-covered --sort=cover
	$(BIN)/coverage html -q -d coverage-html

# Mutation testing (mutmut; TESTING.md) of the modules whose mistakes cost most: search, loss, batching,
# checkpoints and their averaging, scoring, the stopping rules, and the trainer's schedule and stop logic. A
# development target, not part of `make test`: about two hours on 2 cores. The test selection is in pyproject.toml; `$(BIN)/mutmut show NAME` shows a mutant.
MUTANTS := 'mtx.decode.search.*' 'mtx.train.loss.*' 'mtx.data.batching.*' 'mtx.checkpoint.*' 'mtx.train.average.*' \
	'mtx.score.*' 'mtx.train.stopping.*' 'mtx.train.trainer.x_learning_rate__mutmut_*' \
	'mtx.train.trainer.x_dropout_seed__mutmut_*' $(foreach m,_agree_on_the_next_update _after_update _finish _validate,\
	'mtx.train.trainer.xǁTrainerǁ$(m)__mutmut_*')

mutants: install
	OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1 $(BIN)/mutmut run --max-children 2 $(MUTANTS) > mutants.log 2>&1 || \
		{ tail -c 2000 mutants.log; exit 1; }
	$(BIN)/python .ci/mutation_summary.py $(MUTANTS)

# The extra that `mtx report -o` needs (matplotlib), for the demo's report page.
REPORT_STAMP := $(VENV)/.report-installed

$(REPORT_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet $(TORCH) -e '.[dev,report]'
	touch $(REPORT_STAMP)

# The main job on the built-in demo corpus: prepare → train → average → translate → score, then the run's report
# page. The BLEU gate, 89, sits below every test BLEU measured across machines and precisions (the lowest 90.19;
# TESTING.md).
demo: install $(REPORT_STAMP)
	$(BIN)/mtx prepare recipes/demo.yaml
	$(BIN)/mtx train recipes/demo.yaml
	$(BIN)/mtx average --dir $(DEMO)/checkpoints -o $(DEMO)/average.pt
	$(BIN)/mtx translate -m $(DEMO)/average.pt -i $(DEMO)/data/test.en -o $(DEMO)/test.hyp
	@echo; echo "A few test translations:"; echo
	@paste $(DEMO)/data/test.en $(DEMO)/test.hyp $(DEMO)/data/test.de | head -n 5 | \
		awk -F'\t' '{ print "  en:  " $$1 "\n  mtx: " $$2 "\n  ref: " $$3 "\n" }'
	$(BIN)/mtx score -r $(DEMO)/data/test.de -i $(DEMO)/test.hyp --metrics bleu,chrf --json > $(DEMO)/score.json.tmp
	mv $(DEMO)/score.json.tmp $(DEMO)/score.json
	$(BIN)/mtx score -r $(DEMO)/data/test.de -i $(DEMO)/test.hyp --metrics bleu,chrf --min-bleu 89
	$(BIN)/mtx report $(DEMO) -o $(DEMO)/report.html
	@echo "Open $(DEMO)/report.html in a browser; \`mtx report $(DEMO)\` prints the summary in the terminal."

# The documentation site (mkdocs.yml, docs/): built strictly into site/ (a broken link, an anchor that is not
# there or a failing generator stops it), or served at http://127.0.0.1:8000 with live reload. Needs Graphviz's
# `dot` for the diagrams (apt-get install graphviz).
DOCS_STAMP := $(VENV)/.docs-installed

$(DOCS_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet $(TORCH) -e '.[dev,docs,serve]'
	touch $(DOCS_STAMP)

# Material for MkDocs is maintained until May 2027; its successor, Zensical, reads the same mkdocs.yml. Until mtx
# moves, its notice on every build is turned off.
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

docs-serve: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --strict --dev-addr 127.0.0.1:8000

bench: install
	bash bench/setup_env.sh
	OMP_WAIT_POLICY=PASSIVE .bench-venv/bin/python bench/model.py
	OMP_WAIT_POLICY=PASSIVE .bench-venv/bin/python bench/train.py
	OMP_WAIT_POLICY=PASSIVE .bench-venv/bin/python bench/translate.py

# The one prepared device check (bench/gpu_check.py): JSON lines, at most 8 minutes on one GPU. It runs from the
# source tree with whatever Python has torch (a GPU machine's own, no `make install`); DEVICE=cpu runs it small.
DEVICE ?= cuda
GPU_CHECK_PYTHON := $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)

gpu-check:
	OMP_WAIT_POLICY=PASSIVE $(GPU_CHECK_PYTHON) bench/gpu_check.py --device $(DEVICE) $(if $(OUT),--out $(OUT))

# The quality grid at its GPU size (bench/quality.py --size gpu, bench/README.md): no run starts after 6 minutes
# and all stop at 8 (timeout stops the whole process group; a stopped run resumes), then the summary. On the
# real-data corpus built where Debian's mirror is reachable: runs/real_corpus/en-de and en-fr travel with the
# command. With OUT, the results and the table are copied there.
gpu-quality:
	mkdir -p runs
	-OMP_WAIT_POLICY=PASSIVE timeout 480 $(GPU_CHECK_PYTHON) bench/quality.py --size gpu --out runs/quality-gpu \
		--deadline-minutes 6 > runs/quality-gpu.jsonl
	$(GPU_CHECK_PYTHON) bench/quality.py --size gpu --out runs/quality-gpu --summary-only
	$(if $(OUT),cp runs/quality-gpu.jsonl runs/quality-gpu/summary.md $(OUT)/)

clean:
	rm -rf $(VENV) .bench-venv runs site .pytest_cache .ruff_cache mutants mutants.log .coverage .coverage.* coverage-html
