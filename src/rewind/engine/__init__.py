"""The engine: attaching to a user's Burr app and driving its runs (record, fork, replay)."""

from rewind.engine.attach import Pipeline, attach, load_pipeline
from rewind.engine.drive import Launch, drive, plan_launch

__all__ = ["Launch", "Pipeline", "attach", "drive", "load_pipeline", "plan_launch"]
