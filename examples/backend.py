"""Backend selection shared by the example scripts, run before Keras loads,
and the record of a full run's results.

KERAS_BACKEND is read once, when keras is first imported, so a script's
`--backend` must be applied before that.
"""

import json
import os
import platform
import sys
import time
from pathlib import Path

# A run's wall time counts from here: most scripts import this module
# first, the others (which import Keras at the top) once it has loaded.
STARTED = time.perf_counter()
RESULTS = Path(__file__).resolve().parent / "results"


def select_backend(name=None):
    """Sets `KERAS_BACKEND` (when `name` is given) and quiets TensorFlow's
    C++ logs; on torch, imports torch first (importing tensorflow before
    torch can crash torch)."""
    if name:
        os.environ["KERAS_BACKEND"] = name
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if os.environ.get("KERAS_BACKEND") == "torch":
        import torch  # noqa: F401


def publish(name, summary, args):
    """Writes a full run's `summary` to `examples/results/<name>.json`, with
    the run's arguments, wall time and versions: the figures the examples'
    pages quote come from these files. A `--smoke` run writes nothing."""
    if getattr(args, "smoke", False):
        return None
    import keras

    record = {
        "script": Path(sys.argv[0]).name,
        "arguments": {
            k: v for k, v in sorted(vars(args).items()) if k != "output"
        },
        "wall_seconds": round(time.perf_counter() - STARTED, 1),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "keras": keras.__version__,
        "backend": keras.backend.backend(),
        "summary": summary,
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(record, indent=2, default=str) + "\n")
    print(f"results: {path}")
    return path
