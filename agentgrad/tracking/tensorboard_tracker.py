"""TensorBoard: an event file with a scalar per figure and step, the configuration as text, the curve as an image.

Written with TensorBoard's own event writer and protocol buffers (no TensorFlow, no torch), under `log_dir/<run
name>` (default `runs/`, as TRL and torch's SummaryWriter do). Extra: `agentgrad[tensorboard]`.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentgrad.tracking.base import RunInfo, flatten, import_tracker_library


class TensorBoardTracker:
    """`report_to=["tensorboard"]`, or `TensorBoardTracker(log_dir="tb")`: `tensorboard --logdir tb` shows the runs."""

    name = "tensorboard"

    def __init__(self, log_dir: str | Path = "runs") -> None:
        self.log_dir = Path(log_dir)
        self.run_dir: Path | None = None
        self._writer: Any = None

    def start(self, run: RunInfo) -> None:
        import_tracker_library("tensorboard", "tensorboard", self.name)
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.run_dir = self.log_dir / run.name
        self._writer = EventFileWriter(str(self.run_dir))
        text = json.dumps({"config": flatten(run.config), "tags": dict(run.tags)}, indent=2, default=str)
        self._write(0, [self._text("run/config", text)])

    def log_metrics(self, step: int, values: Mapping[str, float]) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        self._write(step, [Summary.Value(tag=name, simple_value=float(v)) for name, v in values.items()])

    def log_artifact(self, path: Path) -> None:
        """A PNG goes in as an image; anything else as its path, in text (TensorBoard keeps no files)."""
        from tensorboard.compat.proto.summary_pb2 import Summary

        if path.suffix == ".png":
            data = path.read_bytes()
            width, height = struct.unpack(">II", data[16:24])  # the PNG's IHDR chunk
            image = Summary.Image(encoded_image_string=data, width=width, height=height, colorspace=3)
            self._write(0, [Summary.Value(tag=f"artifacts/{path.stem}", image=image)])
        else:
            self._write(0, [self._text(f"artifacts/{path.name}", str(path.resolve()))])

    def finish(self, summary: Mapping[str, float], status: str) -> None:
        if self._writer is None:
            return
        self.log_metrics(0, summary)
        self._write(0, [self._text("run/status", status)])
        self._writer.close()
        self._writer = None

    def _text(self, tag: str, text: str) -> Any:
        from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
        from tensorboard.compat.proto.tensor_pb2 import TensorProto
        from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto

        metadata = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="text"))
        tensor = TensorProto(dtype=7, string_val=[text.encode()], tensor_shape=TensorShapeProto())  # 7: DT_STRING
        return Summary.Value(tag=tag, metadata=metadata, tensor=tensor)

    def _write(self, step: int, values: list[Any]) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        if self._writer is None:
            raise RuntimeError("TensorBoardTracker: start(run) first; the trainer does it when fit begins")
        self._writer.add_event(Event(wall_time=time.time(), step=step, summary=Summary(value=values)))
        self._writer.flush()
