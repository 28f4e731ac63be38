"""The examples run: the quickstart's checks pass and say what ran; the GPT example trains (the loss goes
down, and flash and xla attention follow the same curve), also with the kernels in the interpreter."""
import json
import os
import subprocess
import sys

import jax
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ON_CPU = jax.default_backend() == "cpu"


@pytest.mark.skipif(not ON_CPU, reason="the CPU path of the quickstart")
def test_quickstart_cpu():
    # the README's main job, on a smaller problem: xla timed, the kernels checked in the interpreter
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "quickstart.py"), "--seq", "128",
                           "--heads", "2", "--check-seq", "40"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = proc.stdout
    assert "implementation='xla'" in out and "implementation='interpret'" in out
    assert out.count("(ok") == 3 and out.strip().splitlines()[-1].startswith("OK")  # xla vs jax.nn, 2 kernel checks
    assert "TF/s" not in out  # no GPU numbers on a CPU


@pytest.mark.slow
def test_train_gpt_compare(tmp_path):
    out = tmp_path / "runs.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # flash takes jax_flash_amd's CPU path
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "train_gpt.py"), "--compare", "--steps", "25",
                           "--seq-len", "64", "--batch", "4", "--d-model", "64", "--out-dir", str(tmp_path), "--json",
                           str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    flash, xla = (json.loads(line) for line in out.read_text().splitlines())
    assert flash["attention"] == "flash" and xla["attention"] == "xla"
    assert flash["implementation"] == ("xla" if ON_CPU else "triton")  # what "flash" ran, said plainly
    assert flash["params_m"] == xla["params_m"]  # one parameter tree for both modules
    for run in (flash, xla):
        first, last = sum(run["losses"][:5]) / 5, sum(run["losses"][-5:]) / 5
        assert last < first - 1.0, run["losses"]
    gap = max(abs(a - b) for a, b in zip(flash["losses"], xla["losses"]))
    assert gap < 0.05, gap  # same seed, same data: the same curve within float32 noise
    assert "tokens/s" in proc.stdout and "peak device memory" in proc.stdout
    assert (tmp_path / "train_gpt_compare.png").exists()  # matplotlib comes with the test extra


@pytest.mark.slow
def test_train_gpt_data_parallel_matches_one_device(tmp_path):
    # two host devices stand in for two GPUs: the same global batch gives the same losses
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["XLA_FLAGS"] = env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
    runs = []
    for devices in (1, 2):
        out = tmp_path / f"d{devices}.jsonl"
        proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "train_gpt.py"), "--steps", "8",
                               "--seq-len", "64", "--batch", "4", "--d-model", "64", "--devices", str(devices),
                               "--out-dir", str(tmp_path), "--json", str(out)], env=env, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs.append(json.loads(out.read_text()))
    assert runs[1]["devices"] == 2
    gap = max(abs(a - b) for a, b in zip(runs[0]["losses"], runs[1]["losses"]))
    assert gap < 1e-3, gap


@pytest.mark.slow
@pytest.mark.skipif(not ON_CPU, reason="the interpreter runs on CPU-only machines")
def test_train_gpt_interpret(tmp_path):
    # --implementation interpret sets TRITON_INTERPRET itself: the Triton kernels train the same tiny model
    out = tmp_path / "runs.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "train_gpt.py"), "--compare",
                           "--implementation", "interpret", "--steps", "3", "--seq-len", "32", "--batch", "2",
                           "--layers", "1", "--d-model", "32", "--heads", "2", "--out-dir", str(tmp_path), "--json",
                           str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    flash, xla = (json.loads(line) for line in out.read_text().splitlines())
    assert flash["implementation"] == "interpret" and "Triton's interpreter" in proc.stdout
    assert max(abs(a - b) for a, b in zip(flash["losses"], xla["losses"])) < 1e-3
