"""Every command-line tool documents itself: each exposes parser() (its argparse parser), every option has help
text, and `--help` shows every option with its default (argparse.ArgumentDefaultsHelpFormatter)."""
import argparse
import importlib
import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULES = ["jax_flash_amd.amd_report", "benchmarks.attention", "benchmarks.variants", "benchmarks.decode",
           "benchmarks.gpt", "benchmarks.scaling", "benchmarks.ring", "benchmarks.profile_kernels",
           "benchmarks.dropout_stats", "benchmarks.sweep", "benchmarks.docs", "benchmarks.compiled_code"]
SCRIPTS = sorted(f for f in os.listdir(os.path.join(ROOT, "examples")) if f.endswith(".py"))
TOOLS = MODULES + [f"examples/{f}" for f in SCRIPTS]


def _load(tool):
    """The tool's module: imported by name, or (an example script) from its file."""
    if not tool.endswith(".py"):
        return importlib.import_module(tool)
    spec = importlib.util.spec_from_file_location(f"_cli_{os.path.basename(tool)[:-3]}", os.path.join(ROOT, tool))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an import would (dataclasses look their module up there)
    spec.loader.exec_module(module)
    return module


def _command(tool):
    return [sys.executable, os.path.join(ROOT, tool)] if tool.endswith(".py") else [sys.executable, "-m", tool]


def _options(ap):
    return [a for a in ap._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


def _squeezed(text):
    """text without whitespace: argparse wraps help text, and breaks a default longer than a line."""
    return "".join(text.split())


@pytest.mark.parametrize("tool", TOOLS)
def test_every_option_has_help_and_its_default_shown(tool):
    ap = _load(tool).parser()
    assert issubclass(ap.formatter_class, argparse.ArgumentDefaultsHelpFormatter), tool
    options = _options(ap)
    assert options, tool
    text = _squeezed(ap.format_help())
    for action in options:
        assert action.help and action.help != argparse.SUPPRESS and action.help.strip(), (tool, action.option_strings)
        assert _squeezed(f"(default: {action.default})") in text, (tool, action.option_strings, action.default)


@pytest.mark.parametrize("tool", TOOLS)
def test_help_runs(tool):
    """`--help` as a user runs it: exits 0 at once (nothing else runs) and lists every option and its default."""
    proc = subprocess.run(_command(tool) + ["--help"], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])})
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = _squeezed(proc.stdout)
    for action in _options(_load(tool).parser()):
        assert action.option_strings[0] in text and _squeezed(f"(default: {action.default})") in text, (tool,
                                                                                                     action.dest)
