"""Shared benchmark plumbing: where results go, what machine made them, tables and plots."""

from __future__ import annotations

import datetime as _dt
import json
import platform
from pathlib import Path

DEFAULT_OUT = Path("bench_results")


def machine_info() -> dict:
    """Returns the device name, date and software versions to stamp on every result."""
    info = {
        "date": _dt.date.today().isoformat(),
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "device": "cpu",
    }
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            info["device"] = props.name
            info["num_sms"] = props.multi_processor_count
            info["cuda"] = torch.version.cuda
    except ImportError:
        pass
    try:
        import cupy

        info["cupy"] = cupy.__version__
    except ImportError:
        pass
    return info


def format_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """Formats rows as a fixed-width table.

    Args:
        rows: one dict per row.
        columns: (key, header, format spec) triples, e.g. ("us", "µs", ".1f").

    Returns:
        The table as text.
    """
    cells = [[h for _, h, _ in columns]]
    for row in rows:
        line = []
        for key, _, spec in columns:
            value = row.get(key)
            line.append("—" if value is None else format(value, spec) if spec else str(value))
        cells.append(line)
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    out = []
    for n, r in enumerate(cells):
        out.append("  ".join(c.rjust(w) if n and i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))))
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def write_results(name: str, payload: dict, out_dir: Path | str = DEFAULT_OUT) -> Path:
    """Writes ``<out_dir>/<name>.json`` stamped with :func:`machine_info`; returns its path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps({"machine": machine_info(), **payload}, indent=1))
    return path


def try_pyplot():
    """Returns matplotlib.pyplot with a headless backend, or None when matplotlib is absent."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        return plt
    except ImportError:
        return None
