"""Test setup: on a CPU-only machine the kernels run in Triton's interpreter, which Triton enables
only if TRITON_INTERPRET=1 is set before triton is first imported (so before jax_flash_amd)."""
import os

# test workers (pytest-xdist) share one GPU: none may take most of its memory up front
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402

if jax.default_backend() == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


def _skipped_here(item) -> bool:
    return any(item.iter_markers("skip")) or any(
        (m.args[0] if m.args else m.kwargs.get("condition")) is True for m in item.iter_markers("skipif"))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Of a test marked `matrix`, the first case this machine runs is in the default selection and the others are
    marked `slow` (.ci/run runs them): the default run stays within minutes, every case still runs in CI."""
    first = set()
    for item in items:
        if item.get_closest_marker("matrix") is None or _skipped_here(item):
            continue
        key = (item.path, item.originalname)
        if key in first:
            item.add_marker(pytest.mark.slow)
        first.add(key)
