"""Request bodies of the HTTP API: a run to start, a fork or an unchanged replay to make.

Every body forbids keys it does not declare (a typo is a 422 naming the field, not a silently
ignored option).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "AllowCodeChange",
    "EffectsMode",
    "ForkRequest",
    "InputOverrideBody",
    "NodeRef",
    "OutputOverrideBody",
    "OverrideBody",
    "ParamOverrideBody",
    "ReplayRequest",
    "RestoreMode",
    "StartRunRequest",
]


class ParamOverrideBody(BaseModel):
    """Change one param of a node (``analyse.group_by``); the node re-executes with it."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["param"]
    node: str = Field(min_length=1, max_length=200)
    param: str = Field(min_length=1, max_length=200)
    value: Any = Field(description="the new value (any JSON)")


class OutputOverrideBody(BaseModel):
    """Replace one field the fork node wrote; the node is not executed."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["output"]
    node: str = Field(min_length=1, max_length=200)
    field: str = Field(min_length=1, max_length=200)
    value: Any = Field(description="the new value of the field (any JSON)")


class InputOverrideBody(BaseModel):
    """Change one Burr runtime input of one node (``prompt.prompt``); the node re-executes with
    it, the other nodes keep the recorded inputs."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["input"]
    node: str = Field(min_length=1, max_length=200)
    name: str = Field(min_length=1, max_length=200)
    value: Any = Field(description="the new value of the input (any JSON)")


OverrideBody = Annotated[
    ParamOverrideBody | OutputOverrideBody | InputOverrideBody, Field(discriminator="kind")
]
NodeRef = Annotated[
    str | int,
    Field(description='node name ("analyse", "analyse#2") or 1-based number (3)'),
]


EffectsMode = Annotated[
    Literal["recorded", "dry-run", "live"],
    Field(
        description="side-effecting calls: serve the recorded result (default), log and execute "
        "nothing (dry-run), or re-execute against a verified pre-state (live)"
    ),
]
RestoreMode = Annotated[
    Literal["refuse", "replace"],
    Field(
        description="effects=live only: when restoring a pinned snapshot, refuse (default) or "
        "replace (delete) files the snapshot does not hold"
    ),
]


AllowCodeChange = Annotated[
    bool,
    Field(
        description="fork even if the pipeline's graph changed since the recording where the "
        "fork runs it (a node renamed, removed or inserted; a transition changed): refused with "
        "409 otherwise. Changed code of a node is always allowed and labelled."
    ),
]


class ForkRequest(BaseModel):
    """Fork a finished run at a node with at most one change (none: an unchanged replay)."""

    model_config = ConfigDict(extra="forbid")
    at: NodeRef
    override: OverrideBody | None = None
    effects: EffectsMode = "recorded"
    allow_code_change: AllowCodeChange = False
    restore: RestoreMode = "refuse"


class ReplayRequest(BaseModel):
    """Unchanged replay of a finished run from a node (default: the first)."""

    model_config = ConfigDict(extra="forbid")
    at: NodeRef = 1
    effects: EffectsMode = "recorded"
    allow_code_change: AllowCodeChange = False
    restore: RestoreMode = "refuse"


class StartRunRequest(BaseModel):
    """Record a new run of a registered pipeline (``GET /api/pipelines``)."""

    model_config = ConfigDict(extra="forbid")
    pipeline: str = Field("research", max_length=200)
    question: str | None = Field(None, min_length=1, max_length=4000)
    state: dict[str, Any] | None = None
