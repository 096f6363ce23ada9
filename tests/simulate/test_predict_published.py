"""tools/predict_published.py: the simulator against a published step time.

The full 32-layer MaxText Llama-2 7B compile takes about half a minute, too long
here; the script's plumbing (the published flags, a deviceless compile of the
embedded program, the simulation, the fit, predicted / published) runs on 2 and 3
layers, extrapolated to 32 (the script's docstring says why that is sound for this
model, and the README gives the full run's figure).
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from xla_streams import jax_compat
from xla_streams.programs import PROGRAMS, Llama2Config

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tools" / "predict_published.py"
SOURCE = "https://github.com/NVIDIA/JAX-Toolbox/blob/main/docs/frameworks/maxtext/README.md"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("predict_published", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # its dataclasses look themselves up there
    spec.loader.exec_module(sys.modules[spec.name])
    return sys.modules[spec.name]


def test_the_program_is_the_published_configuration() -> None:
    # MaxText configs/models/llama2-7b.yml and JAX-Toolbox's 7B row: seq 4096, 2 per GPU.
    c = Llama2Config()
    assert (c.layers, c.d_model, c.heads, c.head_dim, c.d_ff, c.vocab) == (
        32, 4096, 32, 128, 11008, 32000,
    )  # fmt: skip
    assert (c.seq, c.batch_per_device) == (4096, 2)
    assert "llama2_7b_fsdp" in PROGRAMS and PROGRAMS["llama2_7b_fsdp"].num_devices == 8
    published = _script().MAXTEXT_LLAMA2_7B
    assert (published.step_s, published.devices, published.source) == (0.721, 8, SOURCE)
    assert published.config == c
    assert "--xla_disable_hlo_passes=rematerialization" in published.xla_flags


def test_the_fit_is_a_line_through_two_counts_of_at_least_two() -> None:
    script = _script()
    assert script.extrapolate({2: 0.05, 4: 0.09}, 32) == pytest.approx(0.05 + 30 * 0.02)
    assert script.extrapolate({4: 0.09, 2: 0.05}, 2) == pytest.approx(0.05)
    with pytest.raises(ValueError, match="not sound"):
        script.extrapolate({1: 0.03, 2: 0.05}, 32)
    with pytest.raises(ValueError, match="two layer counts"):
        script.extrapolate({2: 0.05}, 32)
    assert script.parse_layers("32") == (32,) and script.parse_layers("4,2") == (2, 4)
    for bad in ("1,2", "x", "2,3,4", "0"):
        with pytest.raises(Exception, match="count|integers|fit"):
            script.parse_layers(bad)


@pytest.mark.skipif(
    jax_compat.cuda_plugin_module() is None, reason="deviceless GPU compiles need jax[cuda12]"
)
def test_the_script_prints_predicted_over_published(tmp_path: Path) -> None:
    out = tmp_path / "published.json"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--layers", "2,3", "--json", str(out)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    text = result.stdout
    assert SOURCE in text and "published step time: 0.721 s" in text
    assert "extrapolated to 32 layers from 2 and 3" in text
    ratio = float(re.search(r"^predicted / published: ([0-9.]+)$", text, re.M).group(1))  # type: ignore[union-attr]
    report = json.loads(out.read_text())
    assert report["schema"] == "xla_streams.published.v1"
    assert report["ratio"] == pytest.approx(ratio, abs=0.005)
    assert report["ratio"] == pytest.approx(report["predicted_step_s"] / 0.721)
    # The model's aim: within 25% of the published time, inside the stated range.
    assert 0.75 <= report["ratio"] <= 1.25
    span = report["predicted_range_s"]
    assert span["low"] < report["predicted_step_s"] < span["high"]
    compiles = {c["layers"]: c for c in report["compiles"]}
    assert set(compiles) == {2, 3}
    for c in compiles.values():
        # Every layer's weights gathered and gradients scattered, asynchronously; cuDNN
        # flash attention forward (twice: recomputed for its statistics) and backward.
        assert c["async_collective_pairs"] > 0
        assert c["flash_attention_calls"] == 3 * c["layers"]
        assert c["exposed_communication_s"] < 0.2 * c["step_s"]
    assert compiles[3]["step_s"] > compiles[2]["step_s"]
