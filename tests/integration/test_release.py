"""The release artefacts: sdist and wheel build, pass `twine check --strict`
and the wheel works when installed into a fresh virtualenv.

Each backend's pass installs the wheel with its own extra
(`keras-attention-layers[tensorflow]`, `[jax]`, `[torch]`), so the three
passes together cover the three extras.
"""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import keras
import pytest

import keras_attention

ROOT = Path(__file__).resolve().parents[2]
BACKEND = keras.backend.backend()


def run(*command, cwd=ROOT, env=None, timeout=900):
    result = subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return result.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    # Without build isolation: hatchling comes with the [dev] extra, and a
    # fresh build environment would cost a download and an install.
    run(sys.executable, "-m", "build", "--no-isolation", "--outdir", out, ROOT)
    return out


def test_build_makes_checked_sdist_and_wheel(dist):
    version = keras_attention.__version__
    wheel = dist / f"keras_attention_layers-{version}-py3-none-any.whl"
    sdist = dist / f"keras_attention_layers-{version}.tar.gz"
    assert wheel.is_file() and sdist.is_file()
    out = run(sys.executable, "-m", "twine", "check", "--strict", wheel, sdist)
    assert out.count("PASSED") == 2, out
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(
            f"keras_attention_layers-{version}.dist-info/METADATA"
        ).decode()
    assert "keras_attention/layers/multi_head_self_attention.py" in names
    assert not any(name.startswith(("tests/", "examples/")) for name in names)
    assert "Requires-Dist: keras>=3.11" in metadata
    for extra in ("tensorflow", "jax", "torch", "viz"):
        assert f"Provides-Extra: {extra}" in metadata
    assert "Description-Content-Type: text/markdown" in metadata


@pytest.mark.slow
def test_wheel_in_fresh_virtualenv_with_backend_extra(dist, tmp_path):
    wheel = next(dist.glob("*.whl"))
    env_dir = tmp_path / "env"
    run(sys.executable, "-m", "venv", env_dir)
    python = env_dir / "bin" / "python"
    # --no-compile: the smoke test imports a fraction of the backend, and
    # byte-compiling all of it at install would take most of the test.
    pip = (python, "-m", "pip", "install", "--quiet", "--no-compile")
    run(*pip, "-c", ROOT / "constraints.txt", f"{wheel}[{BACKEND}]")
    # Outside the repository, so the import finds the installed package.
    env = {**os.environ, "KERAS_BACKEND": BACKEND}
    env.pop("PYTHONPATH", None)
    out = run(
        python,
        ROOT / "tests" / "integration" / "wheel_smoke.py",
        cwd=tmp_path,
        env=env,
    )
    assert f"keras_attention {keras_attention.__version__} from " in out
    assert str(env_dir) in out and f"on {BACKEND}: trained" in out
