"""The docs cannot drift from what they describe: the generated tables equal what benchmarks/docs.py writes from the
results, every results file is cited, links resolve, the signatures in docs/api.md are the code's, printed outputs are
what the code prints, and the repository keeps its rules (README.md at most 300 lines, no dates in it, one word that
no file may hold)."""
import argparse
import ast
import contextlib
import glob
import inspect
import io
import os
import re
import subprocess

import jax.numpy as jnp
import pytest

import jax_flash_amd
from benchmarks import docs
from test_readme import python_blocks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
DOCS = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
MARKDOWN = [README, os.path.join(ROOT, "CHANGELOG.md")] + DOCS


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _name(path: str) -> str:
    return os.path.relpath(path, ROOT)


# ----- generated from the results -----

def test_performance_md_is_what_the_results_give():
    assert _read(docs.PERFORMANCE) == docs.performance(), "docs/performance.md is stale: python -m benchmarks.docs"


def test_readme_table_is_what_the_results_give():
    readme = _read(README)
    assert readme.count(docs.BEGIN) == 1 and readme.count(docs.END) == 1
    assert readme == docs.readme_with_table(readme), "README.md's table is stale: python -m benchmarks.docs"


def test_docs_cli_checks_without_writing():
    assert docs.main(["--check"]) == 0


def test_docs_cli_documents_itself():
    ap = docs.parser()
    assert issubclass(ap.formatter_class, argparse.ArgumentDefaultsHelpFormatter)
    assert all(a.help for a in ap._actions)


def test_every_results_file_is_cited():
    cited = "".join(_read(path) for path in MARKDOWN)
    for name in sorted(os.listdir(os.path.join(ROOT, "benchmarks", "results"))):
        assert f"benchmarks/results/{name}" in cited, f"benchmarks/results/{name} is cited by no doc"


# ----- the repository's rules -----

def test_readme_is_at_most_300_lines():
    assert len(_read(README).splitlines()) <= 300


def test_readme_has_no_dates():
    assert not re.findall(r"\b20\d\d-\d\d-\d\d\b", _read(README))


def _tracked_files() -> list[str]:
    try:
        # tracked, and new files git does not ignore: what the next commit may hold
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [name for name in out.decode().split("\0") if name]


def test_no_tracked_file_holds_the_banned_word():
    word = "ses" + "sion"  # spelt in two pieces, so that this file does not hold it either
    found = []
    for name in _tracked_files():
        path = os.path.join(ROOT, name)
        if not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            data = f.read()
        if word.encode() in data.lower() or word in name.lower():
            found.append(name)
    assert not found, f"files that say {word!r}: {found}"


# ----- links -----

def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but '-' and '_' dropped, spaces as '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: str) -> set[str]:
    text = re.sub(r"^```.*?^```$", "", _read(path), flags=re.M | re.S)
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.*)$", text, re.M)}


@pytest.mark.parametrize("path", MARKDOWN, ids=_name)
def test_relative_links_resolve(path):
    text = re.sub(r"^```.*?^```$", "", _read(path), flags=re.M | re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        file, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
        assert os.path.exists(resolved), f"{_name(path)}: link to {target}: no such file"
        if anchor:
            assert anchor in _anchors(resolved), f"{_name(path)}: link to {target}: no such heading"


# ----- the signatures in docs/ are the code's -----

def _is_signature(code: str) -> bool:
    """A block of call forms with their defaults (`jax_flash_amd.name(arg, key=default, ...)`), not a program."""
    return bool(re.match(r"(?:[\w, ]+= )?jax_flash_amd\.[\w.]+\(", code)) and "import" not in code


def _documented_signatures() -> list[tuple[str, str]]:
    """(dotted name, parameter text) of every `jax_flash_amd.<name>(...)` call form in the docs' signature blocks."""
    found = []
    for _, code in [block for path in DOCS for block in python_blocks(path) if _is_signature(block[1])]:
        for m in re.finditer(r"^(?:[\w, ]+= )?jax_flash_amd\.([\w.]+)\(", code, re.M):
            depth, i = 1, m.end()
            while depth:
                depth += {"(": 1, ")": -1}.get(code[i], 0)
                i += 1
            found.append((m.group(1), code[m.end():i - 1]))
    return found


SIGNATURES = _documented_signatures()


def test_api_md_documents_every_public_function():
    documented = {name for name, _ in SIGNATURES}
    functions = {name for name in jax_flash_amd.__all__ if inspect.isfunction(getattr(jax_flash_amd, name))}
    assert functions - {"flash_attention_fn"} <= documented  # flash_attention_fn's is in its prose


@pytest.mark.parametrize("name,params", SIGNATURES, ids=[name for name, _ in SIGNATURES])
def test_signature_is_the_code(name, params):
    args = ast.parse(f"def f({params}): pass").body[0].args
    documented = [(a.arg, "positional") for a in args.posonlyargs + args.args]
    documented += [(a.arg, "keyword") for a in args.kwonlyargs]
    defaults = dict(zip([a.arg for a in args.args][len(args.args) - len(args.defaults):], args.defaults))
    defaults.update({a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None})
    obj = jax_flash_amd
    for part in name.split("."):
        obj = getattr(obj, part)
    actual = inspect.signature(obj).parameters.values()
    kinds = {inspect.Parameter.KEYWORD_ONLY: "keyword"}
    assert documented == [(p.name, kinds.get(p.kind, "positional")) for p in actual]
    for p in actual:
        if p.default is inspect.Parameter.empty:
            assert p.name not in defaults, f"{name}: {p.name} has no default"
        else:
            assert eval(ast.unparse(defaults[p.name]), {"jnp": jnp}) == p.default, f"{name}: default of {p.name}"


# ----- blocks in docs/: printed outputs, and the blocks that run -----

def _blocks_with_output(path: str) -> list[tuple[int, str, str | None]]:
    """(line, code, the ```text block right after it or None) of each python block of a doc."""
    text = _read(path)
    pattern = r"^```python\n(.*?)^```\n(?:\n```text\n(.*?)^```$)?"
    return [(text[:m.start()].count("\n") + 2, m.group(1), m.group(2)) for m in re.finditer(pattern, text, re.M | re.S)]


def _runnable_doc_blocks():
    readme = {code for _, code in python_blocks(README)}
    cases = []
    for path in DOCS:
        for line, code, output in _blocks_with_output(path):
            if code in readme:  # run by test_readme.py
                continue
            if _is_signature(code):  # test_signature_is_the_code
                continue
            cases.append(pytest.param(code, output, id=f"{os.path.basename(path)}:{line}"))
    return cases


@pytest.mark.parametrize("code,output", _runnable_doc_blocks())
def test_doc_block_runs_and_prints_what_it_shows(code, output, monkeypatch):
    assert "make_mesh" not in code, "a block needing devices belongs in README.md too (tests/test_readme.py)"
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "doc", "exec"), {"__name__": "__doc_block__"})
    if output is not None:
        assert printed.getvalue() == output
