"""MkDocs hook: puts the package version into `config.extra.version`.

The version is read from `keras_attention/version.py` without importing
the package, so the docs build does not load Keras or a backend.
"""

import ast
from pathlib import Path

_VERSION_FILE = Path(__file__).parents[1] / "keras_attention" / "version.py"


def on_config(config):
    tree = ast.parse(_VERSION_FILE.read_text(encoding="utf-8"))
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == "__version__"
        ):
            config.extra["version"] = ast.literal_eval(node.value)
    return config
