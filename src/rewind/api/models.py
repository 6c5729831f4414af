"""Response models of the HTTP API: one pydantic model per record the API serves.

Each route declares its model as ``response_model`` (served with ``exclude_unset``, so a key the
view does not send is not invented), the OpenAPI document carries the models as
``components.schemas``, and the browser UI's TypeScript types are generated from that document
(``web/src/api-schema.d.ts``, ``npm run types``): one schema per record for the server, the
document and the UI.

The models are frozen and keep keys they do not declare (:class:`ApiModel`): a field a view
adds before its model does is served, not dropped (``tests/test_api_models.py`` fails until the
model declares it). Their JSON schemas leave ``additionalProperties`` unset (JSON Schema's
default: allowed), so the generated TypeScript types are closed records.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, create_model

from rewind.store.retention import DeletedRun

__all__ = [
    "ApiModel",
    "Artifact",
    "ArtifactList",
    "CallDetail",
    "CancelAccepted",
    "Correlation",
    "Cost",
    "Diff",
    "Execution",
    "FailuresResponse",
    "Graph",
    "Health",
    "JobView",
    "NodeCalls",
    "NodeDetail",
    "NodeList",
    "PipelineList",
    "Progress",
    "Run",
    "RunDeleted",
    "RunDetail",
    "RunsResponse",
    "Settings",
    "TraceCompare",
    "TraceDetail",
    "TraceReplayResult",
    "TracesResponse",
    "TreeItem",
    "model_of",
    "typed",
]


def _closed(schema: dict[str, Any]) -> None:
    """Leave ``additionalProperties`` out of a model's JSON schema (allowed by default)."""
    schema.pop("additionalProperties", None)


class ApiModel(BaseModel):
    """Base of the response models: frozen, keeps undeclared keys, schema without
    ``additionalProperties``."""

    model_config = ConfigDict(extra="allow", frozen=True, json_schema_extra=_closed)


RunStatus = Literal["queued", "running", "completed", "failed", "interrupted", "cancelled"]
NodeStatus = Literal[
    "inherited", "hit", "executed", "override", "failed", "running", "pending", "skipped"
]


# -- runs --------------------------------------------------------------------------------------


class Override(ApiModel):
    """A fork's one change: a node's param, a field its output wrote, or a runtime input."""

    kind: Literal["param", "output", "input"]
    node: str
    param: str | None = None
    field: str | None = None
    name: str | None = Field(None, description='a runtime input (kind "input")')
    value: Any = None


class RunLaunch(ApiModel):
    """How a Burr app run was launched (forks replay it): runtime inputs, halt conditions."""

    inputs: dict[str, Any] | None = None
    halt_after: list[str] | None = None
    halt_before: list[str] | None = None
    effects: str | None = Field(None, description="a fork: its effects mode")
    sub_run_fork: dict[str, Any] | None = Field(
        None, description="a fork re-running a sub-run: which sub-run, from where, what change"
    )


class Run(ApiModel):
    """A run as the API shows it (``tokens``: what this run spent; latency in ms; times in
    unix seconds)."""

    run_id: str
    pipeline: str
    status: RunStatus
    parent_run_id: str | None
    fork_node: str | None
    fork_number: int | None = Field(description="1-based number of the fork node")
    override: Override | None
    change: str | None = Field(description="one line saying what a fork changed")
    prompt_tokens: int
    completion_tokens: int
    tokens: int
    latency_ms: float
    created_at: float
    finished_at: float | None
    error: str | None
    config: dict[str, Any]
    launch: RunLaunch | None = None
    effects_mode: str | None = None
    admissible: str | None = None
    last_audit: dict[str, Any] | None = None
    spawning_run_id: str | None = Field(
        None, description="a sub-run: the run whose node spawned it"
    )
    spawning_number: int | None = Field(None, description="a sub-run: its spawning node (1-based)")
    spawn_key: str | None = None
    created_by: str | None = None


class Artifact(ApiModel):
    """A file a run published."""

    name: str
    sha256: str
    size: int
    url: str


class ArtifactList(ApiModel):
    """The files a run published."""

    run_id: str
    artifacts: list[Artifact]


class NodeSubRuns(ApiModel):
    """The sub-runs (Burr sub-applications) one node of a run spawned."""

    number: int = Field(description="1-based node number")
    runs: list[Run]


class RunDetail(Run):
    """A run with its parent chain, forks, sub-runs and artifacts."""

    ancestors: list[Run]
    children: list[Run]
    sub_runs: list[NodeSubRuns] = Field(default_factory=list)
    artifacts: list[Artifact]
    live: bool = Field(description="this server executes the run now")
    drift: dict[str, Any] | None = Field(
        None, description="a fork's code drift from its parent's recording"
    )


class JobGroupInfo(ApiModel):
    """A grid or stability job whose runs the runs list groups."""

    id: str
    kind: Literal["grid", "stability"]
    batch: str
    parent_run_id: str | None
    count: int
    statuses: dict[str, int]


class TreeItem(ApiModel):
    """A run of the runs tree (``run_id`` set), or a job group (``run_id`` null, ``job``
    set)."""

    run_id: str | None
    children: list[TreeItem]
    jobs: list[TreeItem] = Field(default_factory=list)
    sub_runs: list[TreeItem] = Field(default_factory=list)
    job: JobGroupInfo | None = None


class RunsResponse(ApiModel):
    """The runs list and its tree (forks under parents, job runs under their job)."""

    runs: list[Run]
    sub_runs: list[Run] = Field(default_factory=list)
    tree: list[TreeItem]


class CancelAccepted(ApiModel):
    """A cancel accepted: ``cancelling``, or ``interrupted`` when its process was gone."""

    run_id: str
    status: str
    links: dict[str, str]


def model_of(record: type[Any], name: str, **fields: Any) -> type[ApiModel]:
    """A response model with the fields of a domain dataclass (its ``to_json`` is ``asdict``),
    plus ``fields`` (``name=(type, default)``): the record's one schema, not a copy.

    Args:
        record: a dataclass whose JSON is its fields.
        name: the model's (and the OpenAPI schema's) name.
    """
    hints = get_type_hints(record)
    own = {f.name: (hints[f.name], ...) for f in dataclasses.fields(record)}
    model: type[ApiModel] = create_model(
        name, __base__=ApiModel, __doc__=record.__doc__, **fields, **own
    )
    return model


RunDeleted = model_of(
    DeletedRun,
    "RunDeleted",
    dry_run=(bool, Field(description="checked and counted only: nothing was deleted")),
)


class Progress(ApiModel):
    """What the store says of a run in flight, whoever executes it."""

    run_id: str
    status: str
    executing_here: bool
    node: dict[str, Any] | None
    nodes: int
    prompt_tokens: int
    completion_tokens: int
    tokens: int
    cancel_requested: Any = None


class JobView(ApiModel):
    """A run or fork job as the store keeps it (``GET /api/jobs/{job_id}``)."""

    job_id: str
    kind: str = Field(description="record or fork")
    run_id: str = Field(description="the run of the current attempt")
    state: Literal["queued", "running", "succeeded", "failed"]
    attempts: int
    error: str | None
    worker: str | None = Field(description="host:pid:start of the process that executed it last")
    earlier_runs: list[str] = Field(description="runs of earlier attempts, left interrupted")
    created_at: float
    started_at: float | None
    finished_at: float | None


# -- graph and nodes ---------------------------------------------------------------------------


class Call(ApiModel):
    """One LLM or tool call of a node execution (its row; no request or response)."""

    index: int
    kind: str
    name: str
    key: str
    request_hash: str
    result_hash: str | None
    outcome: str
    reason: str
    prompt_tokens: int
    completion_tokens: int
    tokens: int
    latency_ms: float
    determinism: str | None


class Execution(ApiModel):
    """One node execution: display status, cache outcome and reason, hashes, tokens, calls."""

    position: int = Field(description="0-based (number = position + 1)")
    number: int
    name: str
    status: NodeStatus
    cache_outcome: str
    cache_reason: str
    inherited: bool
    sequence_id: int | None
    src_app_id: str | None
    src_sequence_id: int | None
    input_hash: str | None
    output_hash: str | None
    state_hash: str | None
    params: dict[str, Any]
    prompt_tokens: int | None
    completion_tokens: int | None
    tokens: int
    latency_ms: float
    error: str | None
    started_at: float | None
    determinism: str | None
    live: bool = Field(description="reported finished by the worker, row not committed yet")
    calls: list[Call]


class NodeRow(Execution):
    """A node execution of the nodes list, with the sub-runs it spawned."""

    sub_runs: list[str]


class NodeList(ApiModel):
    """A run's node executions."""

    run_id: str
    nodes: list[NodeRow]


class GraphNode(ApiModel):
    """A pipeline node, coloured by its latest execution."""

    name: str
    status: NodeStatus
    numbers: list[int] = Field(description="1-based numbers of its executions")
    executions: int


class Edge(ApiModel):
    """A transition of the pipeline."""

    src: str
    dst: str
    condition: str


class RunningNode(ApiModel):
    """The node executing now."""

    position: int
    number: int
    name: str


class Graph(ApiModel):
    """A run's pipeline graph and node executions."""

    run: Run
    pipeline: str
    nodes: list[GraphNode]
    edges: list[Edge]
    executions: list[Execution]
    running: RunningNode | None
    live: bool


class ChatMessage(ApiModel):
    """One chat message of an LLM request."""

    role: str
    content: Any = None
    name: str | None = None
    tool_calls: Any = None
    tool_call_id: str | None = None


class LlmRequest(ApiModel):
    """An LLM request laid out (long strings and lists cut)."""

    endpoint: str | None
    messages: list[ChatMessage | str] = Field(
        description="a cut list ends with a string saying how many messages were left out"
    )
    params: dict[str, Any]
    tools: Any = None
    tool_choice: Any = None
    response_schema: Any = None
    body: Any = None


class LlmResponse(ApiModel):
    """An LLM response laid out."""

    status: int | None
    content: Any = None
    tool_calls: Any = None
    finish_reason: str | None
    usage: dict[str, Any] | None
    streamed_events: int | None


class ToolRequest(ApiModel):
    """A tool call's arguments."""

    args: Any


class ToolResponse(ApiModel):
    """A tool call's result."""

    result: Any


class CallDetail(Call):
    """One call of a node with its request and response (bounded; ``*_url`` serves the
    whole)."""

    label: str
    produced_at: float | None
    request: LlmRequest | ToolRequest
    response: LlmResponse | ToolResponse
    request_bytes: int | None
    request_truncated: bool
    request_url: str | None
    response_bytes: int | None
    response_truncated: bool
    response_url: str | None


class NodeCalls(ApiModel):
    """A page of a node's calls."""

    run_id: str
    number: int
    total: int
    offset: int
    calls: list[CallDetail]


class ParamHint(ApiModel):
    """The values the pipeline allows a fork to give a param."""

    choices: list[Any] | None = None
    type: Literal["number", "integer"] | None = None
    min: int | float | None = None
    max: int | float | None = None
    description: str | None = None


class NodeDetail(ApiModel):
    """One node: its row, first page of calls, the inputs it read, the output it wrote, the
    state after it, and per param the values a fork may give it."""

    run_id: str
    node: Execution
    calls: list[CallDetail] = Field(default_factory=list)
    calls_total: int = Field(0, description="all calls of the node (calls holds the first page)")
    sub_runs: list[Run] = Field(default_factory=list)
    input: dict[str, Any]
    output: dict[str, Any]
    state: dict[str, Any] | None
    param_hints: dict[str, ParamHint] = Field(default_factory=dict)


class NodeInput(ApiModel):
    """A node's input document."""

    input_hash: str | None
    input: Any


class NodeOutput(ApiModel):
    """The fields a node wrote."""

    output_hash: str | None
    output: Any


class NodeState(ApiModel):
    """The semantic state after a node (null for a failed node)."""

    state_hash: str | None
    state: Any


# -- diff and cost -----------------------------------------------------------------------------


class DiffChange(ApiModel):
    """One changed path of a node's output."""

    path: str
    kind: Literal["changed", "added", "removed", "type_changed"]
    old: Any = None
    new: Any = None
    text_diff: str | None
    old_path: str | None = Field(description="where the old value sat in A when a list item moved")


class DiffSide(ApiModel):
    """One side of an aligned node pair."""

    position: int
    name: str
    output_hash: str
    tokens: int
    outcome: str
    code: str = Field(description='sha256 of the code that produced the node ("": unknown)')
    output: dict[str, Any]


class DiffRow(ApiModel):
    """An aligned pair of nodes."""

    index: int
    name: str
    status: Literal["equal", "changed", "only_a", "only_b"]
    token_delta: int
    hash_equal: bool
    code_changed: bool = Field(description="the node ran other code in B than in A")
    helpers_changed: list[str] = Field(default_factory=list)
    a: DiffSide | None
    b: DiffSide | None
    changes: list[DiffChange]


class Diff(ApiModel):
    """Field-level diff of two runs."""

    run_a: str
    run_b: str
    tokens_a: int
    tokens_b: int
    token_delta: int
    first_divergence: int | None = Field(description="row index of the first divergence")
    counts: dict[str, int]
    code_changed: list[str]
    nodes: list[DiffRow]


class CostSide(ApiModel):
    """What one run cost."""

    run_id: str
    tokens: int
    latency_ms: float


class CostFigure(ApiModel):
    """Tokens and latency (ms)."""

    tokens: int
    latency_ms: float


class CostNode(ApiModel):
    """One node of the replay: what it cost in the original and in the replay."""

    position: int
    number: int
    name: str
    status: NodeStatus
    original_tokens: int | None
    replay_tokens: int
    original_latency_ms: float | None
    replay_latency_ms: float


class Cost(ApiModel):
    """Tokens and latency of a run vs another (default: its parent)."""

    original: CostSide
    replay: CostSide
    delta: CostFigure = Field(description="replay − original")
    saved: CostFigure = Field(description="what inherited or cached nodes did not spend again")
    nodes: list[CostNode]


# -- server ------------------------------------------------------------------------------------


class PipelineInfo(ApiModel):
    """A pipeline runs can be started of."""

    name: str
    description: str
    inputs: dict[str, str]
    nodes: list[str]
    edges: list[Edge]


class PipelineList(ApiModel):
    """The pipelines runs can be started of."""

    pipelines: list[PipelineInfo]


class ModelEndpoint(ApiModel):
    """The model endpoint runs use (never its key)."""

    kind: str
    base_url: str | None
    description: str
    started: bool
    api_key_set: bool


class StoreInfo(ApiModel):
    """Where the store is (password hidden)."""

    root: str
    database: str
    dialect: str


class AuthInfo(ApiModel):
    """Whether requests need a token, and who asks."""

    token_required: bool
    user: str | None = None
    admin: bool | None = None


class EffectiveSetting(ApiModel):
    """A setting in force and where it came from (an env variable, "server" or "default")."""

    name: str
    value: Any = None
    source: str
    note: str


class Settings(ApiModel):
    """The server's configuration as the UI shows it."""

    model_endpoint: ModelEndpoint
    model: str
    temperature_default: float
    store: StoreInfo
    auth: AuthInfo
    workers: int
    version: str
    pipelines: list[str]
    effective: list[EffectiveSetting] = Field(default_factory=list)


class Health(ApiModel):
    """Liveness: the store answers; runs in flight."""

    status: str
    version: str
    runs_in_flight: int
    reports_in_flight: int
    execution: dict[str, Any]
    interrupted_at_start: list[str]
    uptime_s: float


# -- traces ------------------------------------------------------------------------------------


class TraceSummary(ApiModel):
    """A trace (or Burr run) in the traces list."""

    trace_id: str
    name: str
    kind: Literal["trace", "run"]
    status: str
    started_at: float
    ended_at: float | None
    duration_ms: float
    tokens: int
    steps: int
    failed_steps: int
    error: str | None
    parent_trace_id: str | None


class TracesResponse(ApiModel):
    """A page of traces."""

    traces: list[TraceSummary]
    total: int
    limit: int
    offset: int
    next_offset: int | None


class TraceStep(ApiModel):
    """One step of a trace with its input, output, timing and tokens."""

    number: int
    position: int
    name: str
    type: str
    status: str
    duration_ms: float
    tokens: int
    error: str | None
    parent: int | None
    prompt_tokens: int
    completion_tokens: int
    model: str | None
    input: Any = None
    output: Any = None
    params: dict[str, Any]
    cache_outcome: str
    cache_reason: str
    inherited: bool
    span_id: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    attributes: dict[str, Any] = Field(default_factory=dict)
    error_type: str | None = None
    error_message: str | None = None
    input_hash: str | None = None
    output_hash: str | None = None
    state_hash: str | None = None


class TraceDetail(ApiModel):
    """One trace with every step."""

    trace_id: str
    name: str
    kind: Literal["trace", "run"]
    status: str
    started_at: float
    ended_at: float | None
    duration_ms: float
    tokens: int
    failed_steps: int
    error: str | None
    parent_trace_id: str | None
    run_status: str
    input: dict[str, Any]
    output: Any = None
    config: dict[str, Any]
    override: Override | None
    error_type: str | None
    error_message: str | None
    steps: list[TraceStep]
    span_id: str | None = None
    attributes: dict[str, Any] = Field(default_factory=dict)
    prompt_tokens: int = 0
    completion_tokens: int = 0


class TraceCompareRow(DiffRow):
    """An aligned pair of steps, with the similarity of their outputs."""

    similarity: float | None = None


class TraceCompare(Diff):
    """Step-by-step comparison of two traces."""

    nodes: list[TraceCompareRow]  # type: ignore[assignment]
    output: dict[str, Any] | None = None


class ReplaySwitches(ApiModel):
    """What a trace replay serves from the record."""

    cached_llm: bool
    cached_tools: bool
    stop_at_divergence: bool


class TraceReplayResult(ApiModel):
    """A trace replay: the mode used, whether it stopped, whether it ended as its recorded
    chain did, the replay and its diff."""

    mode: str = Field(description="chain (its code ran) or recorded-calls")
    switches: ReplaySwitches
    stopped: bool
    ended_as_recorded: bool = Field(
        description="a recorded-calls replay of a trace whose chain raised: it failed with the "
        "recorded error because the recorded chain raised after its steps (not because a step "
        "of the replay failed); as `rewind replay-trace --json` says"
    )
    trace: TraceDetail
    diff: TraceCompare


class FailureGroup(ApiModel):
    """One group of a failure correlation."""

    key: str
    total: int
    failed: int
    rate: float
    finding: bool
    examples: list[str]


class Correlation(ApiModel):
    """Failure rates per group of one dimension."""

    dimension: Literal["input_length", "step_type", "model", "params"]
    unit: Literal["traces", "steps"]
    total: int
    failed: int
    rate: float
    finding_rate: float | None
    min_failures: int
    edges: list[int] | None = None
    groups: list[FailureGroup]
    findings: list[str]


class FailurePattern(ApiModel):
    """One failure pattern with its count and examples."""

    pattern: str
    signature: str | None
    count: int
    share: float
    example_trace_ids: list[str]
    steps: dict[str, int]
    description: str
    suggested_fix: str


class FailuresResponse(ApiModel):
    """Failure patterns over the matching traces."""

    total_traces: int
    failed_traces: int
    patterns: list[FailurePattern]
    correlations: list[Correlation] = Field(default_factory=list)


def typed(model: Any) -> dict[str, Any]:
    """Route keyword arguments serving ``model``: ``@r.get(path, **typed(Run))``.

    The route returns the view's dict; FastAPI validates it into ``model`` and serves it with
    ``exclude_unset`` (a key the dict lacks is not added with its default)."""
    return {"response_model": model, "response_model_exclude_unset": True}
