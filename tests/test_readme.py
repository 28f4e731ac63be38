"""README.md's recipes run exactly as printed: every ```python block, in a fresh namespace, on this machine.

On a CPU a reader without TRITON_INTERPRET gets the `xla` implementation, so the blocks run that way here too (the
kernels themselves are the other tests' business). Blocks that build a mesh need several devices: they run in a
process of their own with 8 CPU host devices, as tests/helpers.py run_on_8_host_devices does for the sharding tests.
"""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def python_blocks(path: str) -> list[tuple[int, str]]:
    """(line number, code) of every ```python block of a Markdown file."""
    with open(path) as f:
        text = f.read()
    return [(text[:m.start()].count("\n") + 2, m.group(1))
            for m in re.finditer(r"^```python\n(.*?)^```$", text, re.M | re.S)]


BLOCKS = python_blocks(os.path.join(ROOT, "README.md"))


def needs_devices(code: str) -> bool:
    return "make_mesh" in code


def test_the_readme_has_its_recipes():
    # attention, jax.nn / FlashAttention, Flax, KV cache, sharding, ring, explain, causal alignment
    assert len(BLOCKS) >= 8
    assert sum(needs_devices(code) for _, code in BLOCKS) == 2


@pytest.mark.parametrize("code", [pytest.param(code, id=f"line{line}") for line, code in BLOCKS
                                  if not needs_devices(code)])
def test_block_runs_as_printed(code, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # a reader's CPU: the xla implementation
    exec(compile(code, "README.md", "exec"), {"__name__": "__readme__"})


@pytest.mark.parametrize("code", [pytest.param(code, id=f"line{line}") for line, code in BLOCKS
                                  if needs_devices(code)])
def test_block_runs_as_printed_on_8_host_devices(code):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    # from the repository root, so that the package beside these tests is the one imported
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
