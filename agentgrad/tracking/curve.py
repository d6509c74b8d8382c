"""The learning curve of a run as a PNG (drawn with Pillow, which every tracker extra installs), for trackers to keep."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from agentgrad.tracking.base import import_tracker_library

CURVE_KEYS = ("train/reward_mean", "train/accuracy", "val/accuracy", "val/reward_mean", "apo/best_score")
"""The figures the curve draws, those of them the run logged."""

COLORS = ((31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189))
SIZE = (720, 420)
MARGIN = 50


def draw_learning_curve(
    history: Mapping[str, Sequence[tuple[int, float]]], path: Path, keys: Sequence[str] = CURVE_KEYS
) -> Path | None:
    """Draw the `keys` of `history` ({name: [(step, value)]}) against the step into `path`; None when none was logged."""
    series = {k: sorted(history[k]) for k in keys if history.get(k)}
    if not series:
        return None
    import_tracker_library("PIL", "mlflow", "the learning curve")
    from PIL import Image, ImageDraw

    points = [p for s in series.values() for p in s]
    x0, x1 = min(p[0] for p in points), max(p[0] for p in points)
    y0, y1 = min(0.0, min(p[1] for p in points)), max(1.0, max(p[1] for p in points))
    width, height = SIZE
    image = Image.new("RGB", SIZE, "white")
    draw = ImageDraw.Draw(image)
    left, top, right, bottom = MARGIN, 20, width - 20, height - MARGIN

    def at(step: int, value: float) -> tuple[float, float]:
        x = left + (step - x0) / max(x1 - x0, 1) * (right - left)
        return x, bottom - (value - y0) / max(y1 - y0, 1e-9) * (bottom - top)

    draw.rectangle((left, top, right, bottom), outline="black")
    draw.text((left, bottom + 8), f"step {x0}", fill="black")
    draw.text((right - 60, bottom + 8), f"step {x1}", fill="black")
    draw.text((4, top), f"{y1:.2f}", fill="black")
    draw.text((4, bottom - 10), f"{y0:.2f}", fill="black")
    for i, (name, line) in enumerate(series.items()):
        color = COLORS[i % len(COLORS)]
        xy = [at(step, value) for step, value in line]
        if len(xy) > 1:
            draw.line(xy, fill=color, width=2)
        for x, y in xy:
            draw.ellipse((x - 3, y - 3, x + 3, y + 3), fill=color)
        draw.text((left + 10, top + 8 + 14 * i), name, fill=color)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, format="PNG")
    return path
