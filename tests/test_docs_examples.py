"""Every fenced example in README.md and docs/*.md runs as written.

Collected: the ```python, ```bash, ```sh and ```console blocks of README.md and
docs/*.md, one test per block, named FILE:LINE (the line of the opening fence). ```text
blocks are output shown to the reader and are not run.

How a block runs:
- A python block runs alone in a fresh interpreter: nothing carries over from an earlier
  block, so each block imports what it uses (as a reader who copies one block needs).
- A shell block runs with `bash -euo pipefail`; in a ```console block the lines that
  start with "$ " are the commands and the rest is output. `flashsim`, `python3` and
  `python` on PATH run this checkout with the interpreter running the tests.
- The blocks of one file share one temporary working directory (nothing is written into
  the tree) and run in file order, so a block may read a file that an earlier block of
  the same page wrote; the page says so in its prose.
- Without a CUDA GPU, NUMBA_ENABLE_CUDASIM=1: kernels run in Numba's CUDA simulator.
- A block that cannot run here (set-up commands, commands that need a CUDA GPU, torch or
  a cluster) carries `<!-- example: not run (REASON) -->` on the line just before its
  fence; a marker without a reason, or a malformed one, fails.
- A python block that imports an optional package (torch, transformers: OPTIONAL) skips,
  saying which, where that package is not installed (CI installs them; see .ci/run).

The blocks are subprocess work: each page's blocks run, in order, as one background job
(tests/_background.py, started after collection beside the simulator tests); each test
reads its block's result from it. With FLASHSIM_PRESTART=0 the same job runs in the
page's first test instead: the same commands and checks, only when they start differs.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import _background

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
RUN = {"python": "python", "bash": "shell", "sh": "shell", "console": "console"}
FENCE = re.compile(r"^```(\S*)\s*$")
MARKER = re.compile(r"^<!--\s*example:(?P<body>.*?)-->\s*$")
NOT_RUN = re.compile(r"^\s*not run \((?P<reason>[^()]*\S[^()]*)\)\s*$")
TIMEOUT_S = 300
#: optional packages: a python block importing one skips where it is not installed
OPTIONAL = ("torch", "transformers")
IMPORTS = re.compile(r"^\s*(?:import|from)\s+(" + "|".join(OPTIONAL) + r")\b", re.M)


def _missing(block) -> list:
    """The optional packages a python block imports that are not installed here."""
    if RUN.get(block["lang"]) != "python":
        return []
    return sorted({m for m in IMPORTS.findall(block["code"])
                   if importlib.util.find_spec(m) is None})


def blocks(path: Path) -> list[dict]:
    """Fenced blocks of one page: {lang, line (1-based, the opening fence), code, skip
    (the reason of a not-run marker, or None), marker_error (or None)}."""
    lines = path.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        lang, start = m.group(1).lower(), i
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        skip = marker_error = None
        prev = lines[start - 1] if start else ""
        mk = MARKER.match(prev.strip())
        if mk:
            nr = NOT_RUN.match(mk.group("body"))
            if nr:
                skip = nr.group("reason").strip()
            else:
                marker_error = (f"{path.name}:{start}: malformed example marker {prev.strip()!r}; "
                                f"allowed: <!-- example: not run (REASON) -->")
        elif "<!-- example" in prev:
            marker_error = f"{path.name}:{start}: malformed example marker {prev.strip()!r}"
        out.append({"lang": lang, "line": start + 1, "code": "\n".join(lines[start + 1:j]) + "\n",
                    "skip": skip, "marker_error": marker_error})
        i = j + 1
    return out


def _example_env():
    """Environment of every block: `flashsim`, `python3`, `python` on PATH running this
    checkout; the simulator when no GPU is here. From the environment before the first
    test (_background.environ): a test's monkeypatching does not leak into the blocks."""
    bin_dir = Path(_background.mkdtemp("docs-bin"))
    for name, args in (("flashsim", "-m analysis.cli"), ("python3", ""), ("python", "")):
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\nexec "{sys.executable}" {args} "$@"\n')
        script.chmod(0o755)
    env = _background.environ()
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in
                                                      env.get("PYTHONPATH", "").split(os.pathsep)
                                                      if p])
    env["MPLBACKEND"] = "Agg"
    if not _has_cuda_gpu():
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    return env


_TREE: dict = {}


def _tree_status():
    """`git status --porcelain` of the checkout (None where git or the repository is
    missing)."""
    try:
        r = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout if r.returncode == 0 else None


def _has_cuda_gpu() -> bool:
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return False
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _console_commands(code: str) -> str:
    return "\n".join(ln[2:] for ln in code.splitlines() if ln.startswith("$ ")) + "\n"


def _run_block(block, cwd, env):
    """One block as the module docstring says; the CompletedProcess."""
    kind = RUN[block["lang"]]
    if kind == "python":
        cmd = [sys.executable, "-c", block["code"]]
    else:
        code = _console_commands(block["code"]) if kind == "console" else block["code"]
        cmd = ["bash", "-euo", "pipefail", "-c", code]
    return _background.run(cmd, cwd=cwd, env=env, timeout=TIMEOUT_S)


def _page_job(page: str):
    """The job of one page: its runnable blocks in file order in one fresh working
    directory; {line: CompletedProcess or the exception it raised}. The tree's status
    before and after the page's blocks goes to _TREE (test_examples_left_the_tree_alone)."""
    def job():
        before = _tree_status()
        env = _example_env()
        cwd = _background.mkdtemp("docs-" + re.sub(r"\W", "_", page))
        out = {}
        for b in blocks(ROOT / page):
            if b["lang"] not in RUN or b["skip"] or b["marker_error"] or _missing(b):
                continue
            try:
                out[b["line"]] = _run_block(b, cwd, env)
            except Exception as exc:        # noqa: BLE001 (reported by the block's test)
                out[b["line"]] = exc
        _TREE[page] = (before, _tree_status())
        return out
    job.__name__ = job.__qualname__ = f"docs_job[{page}]"
    return job


#: one background job per page (collection order: README first)
PAGE_JOBS = {page.relative_to(ROOT).as_posix(): _page_job(page.relative_to(ROOT).as_posix())
             for page in PAGES}


def _collect():
    params = []
    for page in PAGES:
        rel = page.relative_to(ROOT).as_posix()
        for b in blocks(page):
            if b["lang"] in RUN or b["marker_error"]:
                params.append(pytest.param(rel, b, id=f"{rel}:{b['line']}",
                                           marks=pytest.mark.prestart(job=PAGE_JOBS[rel])))
    return params


EXAMPLES = _collect()


@pytest.mark.parametrize("page,block", EXAMPLES)
def test_example_runs(page, block):
    assert block["marker_error"] is None, block["marker_error"]
    if block["skip"]:
        pytest.skip(f"not run: {block['skip']}")
    missing = _missing(block)
    if missing:
        pytest.skip(f"needs {', '.join(missing)}, not installed here (optional; .ci/run "
                    f"installs it)")
    r = _background.result(PAGE_JOBS[page])[block["line"]]
    if isinstance(r, Exception):
        raise r
    assert r.returncode == 0, (f"{page}:{block['line']} ({block['lang']}) exited {r.returncode}"
                               f"\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}")


def test_every_page_is_collected():
    """README and the docs pages have runnable examples, and few are marked not run."""
    found = {p: blocks(ROOT / p) for p in ("README.md",)}
    assert any(b["lang"] in RUN and not b["skip"] for b in found["README.md"])
    every = [b for page in PAGES for b in blocks(page) if b["lang"] in RUN]
    skipped = [b for b in every if b["skip"]]
    assert len(skipped) <= len(every) // 4, f"{len(skipped)} of {len(every)} blocks not run"


def test_marker_rules(tmp_path):
    """The marker reader: a reason is required; other comments are not markers."""
    page = tmp_path / "p.md"
    page.write_text("<!-- example: not run (needs a CUDA GPU) -->\n```bash\nnvidia-smi\n```\n"
                    "<!-- example: not run () -->\n```bash\ntrue\n```\n"
                    "<!-- example: skipped -->\n```python\npass\n```\n"
                    "<!-- results:x -->\n```text\nout\n```\n")
    b = blocks(page)
    assert [x["lang"] for x in b] == ["bash", "bash", "python", "text"]
    assert b[0]["skip"] == "needs a CUDA GPU" and b[0]["marker_error"] is None
    assert b[1]["skip"] is None and "malformed" in b[1]["marker_error"]
    assert b[2]["marker_error"] and b[3]["marker_error"] is None and b[3]["skip"] is None
    assert b[0]["line"] == 2 and b[0]["code"] == "nvidia-smi\n"


def test_relative_links_resolve():
    """Every relative Markdown link of README.md and docs/*.md names a file that exists."""
    missing = []
    for page in PAGES:
        for m in re.finditer(r"\]\(([^)#\s]+)(#[^)]*)?\)", page.read_text()):
            target = m.group(1)
            if re.match(r"[a-z]+:", target):
                continue
            path = (page.parent / target).resolve()
            if not path.exists():
                missing.append(f"{page.relative_to(ROOT)}: {target}")
    assert not missing, missing


def _results_page_job():
    """`flashsim results tables --check` on docs/results.md (a background job)."""
    return _background.run([sys.executable, "-m", "analysis.cli", "results", "tables",
                            "--check", "--page", str(ROOT / "docs" / "results.md")],
                           cwd=ROOT, timeout=TIMEOUT_S,
                           env=dict(_background.environ(), PYTHONPATH=str(ROOT)))


@pytest.mark.prestart(job=_results_page_job)
def test_results_page_is_up_to_date():
    """docs/results.md's generated tables equal what the data set gives."""
    r = _background.result(_results_page_job)
    assert r.returncode == 0 and "tables up to date" in r.stdout, r.stdout + r.stderr


def _after_every_page(test):
    """Marks `test` with every page's job: it runs them (when run alone), waits for them,
    and, like the examples, runs after the tests without a job (conftest.py)."""
    for job in PAGE_JOBS.values():
        test = pytest.mark.prestart(job=job)(test)
    return test


@_after_every_page
def test_examples_left_the_tree_alone():
    """The examples wrote nothing into the checkout (they run in temporary directories):
    the tree's status after each page's blocks equals that before them. Last in this
    file, after the examples."""
    for job in PAGE_JOBS.values():
        _background.result(job)
    ran = {page: st for page, st in _TREE.items() if st[0] is not None}
    if not ran:
        pytest.skip("no examples ran here, or no git")
    changed = {page: after for page, (before, after) in ran.items() if after != before}
    assert not changed, changed
