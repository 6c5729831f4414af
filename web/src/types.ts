// Shapes of Rewind's HTTP API (see /openapi.json and src/rewind/api/views.py).

export type RunStatus = "queued" | "running" | "completed" | "failed" | "interrupted" | "cancelled";
export type NodeStatus =
  | "inherited"
  | "hit"
  | "executed"
  | "override"
  | "failed"
  | "running"
  | "pending"
  | "skipped";

export interface Override {
  kind: "param" | "output" | "input";
  node: string;
  param?: string;
  field?: string;
  name?: string; // a runtime input (kind "input")
  value: unknown;
}

export interface Run {
  run_id: string;
  pipeline: string;
  status: RunStatus;
  parent_run_id: string | null;
  fork_node: string | null;
  fork_number: number | null;
  override: Override | null;
  change: string | null;
  prompt_tokens: number;
  completion_tokens: number;
  tokens: number;
  latency_ms: number;
  created_at: number;
  finished_at: number | null;
  error: string | null;
  config: Record<string, unknown>;
  // how a Burr app run was launched: runtime inputs and halt conditions (forks replay them)
  launch?: { inputs?: Record<string, unknown>; halt_after?: string[]; halt_before?: string[] };
  // the run of a Burr sub-application: the run and node (1-based) that spawned it
  spawning_run_id?: string | null;
  spawning_number?: number | null;
  created_by?: string | null;
}

export interface Artifact {
  name: string;
  sha256: string;
  size: number;
  url: string;
}

export interface RunDetail extends Run {
  ancestors: Run[];
  children: Run[];
  artifacts: Artifact[];
  live: boolean;
}

/** A grid or stability job whose runs the runs list groups (GET /api/runs, tree). */
export interface JobGroupInfo {
  id: string;
  kind: "grid" | "stability";
  batch: string;
  parent_run_id: string | null;
  count: number;
  statuses: Record<string, number>;
}

/** A run of the runs tree (run_id set), or a job group (run_id null, job set). */
export interface TreeItem {
  run_id: string | null;
  children: TreeItem[];
  jobs?: TreeItem[];
  sub_runs?: TreeItem[];
  job?: JobGroupInfo;
}

export interface RunsResponse {
  runs: Run[];
  sub_runs?: Run[];
  tree: TreeItem[];
}

/** Filters of the runs list (query parameters of GET /api/runs). */
export interface RunFilters {
  q: string;
  pipeline: string;
  status: string;
  since: string; // yyyy-mm-dd (local day start), or ""
  until: string; // yyyy-mm-dd (inclusive day), or ""
}

export interface Call {
  index: number;
  kind: string;
  name: string;
  key: string;
  outcome: string;
  reason: string;
  tokens: number;
  latency_ms: number;
}

export interface Execution {
  position: number;
  number: number;
  name: string;
  status: NodeStatus;
  cache_outcome: string;
  cache_reason: string;
  inherited: boolean;
  input_hash: string | null;
  output_hash: string | null;
  state_hash: string | null;
  params: Record<string, unknown>;
  tokens: number;
  prompt_tokens: number | null;
  completion_tokens: number | null;
  latency_ms: number;
  error: string | null;
  live: boolean;
  calls: Call[];
}

export interface GraphNode {
  name: string;
  status: NodeStatus;
  numbers: number[];
  executions: number;
}

export interface Edge {
  src: string;
  dst: string;
  condition: string;
}

export interface Graph {
  run: Run;
  pipeline: string;
  nodes: GraphNode[];
  edges: Edge[];
  executions: Execution[];
  running: { position: number; number: number; name: string } | null;
  live: boolean;
}

export interface ChatMessage {
  role: string;
  content: unknown;
  name?: string;
  tool_calls?: unknown;
  tool_call_id?: string;
}

export interface LlmRequest {
  endpoint: string | null;
  messages: ChatMessage[];
  params: Record<string, unknown>;
  tools: unknown;
  tool_choice?: unknown;
  response_schema?: unknown;
  body?: unknown;
}

export interface LlmResponse {
  status: number | null;
  content: unknown;
  tool_calls: unknown;
  finish_reason: string | null;
  usage: Record<string, unknown> | null;
  streamed_events: number | null;
}

/** One call of a node with its request and response (GET /api/runs/{id}/nodes/{n}/calls). */
export interface CallDetail {
  index: number;
  kind: string;
  name: string;
  key: string;
  request_hash: string;
  result_hash: string | null;
  outcome: string;
  reason: string;
  label: string;
  determinism: string | null;
  prompt_tokens: number;
  completion_tokens: number;
  tokens: number;
  latency_ms: number;
  produced_at: number | null;
  /** llm: LlmRequest; tool: { args } */
  request: LlmRequest | { args: unknown };
  /** llm: LlmResponse; tool: { result } */
  response: LlmResponse | { result: unknown };
  request_bytes: number | null;
  request_truncated: boolean;
  request_url: string | null;
  response_bytes: number | null;
  response_truncated: boolean;
  response_url: string | null;
}

export interface NodeDetail {
  run_id: string;
  node: Execution;
  calls?: CallDetail[];
  /** all calls of the node (``calls`` holds the first page) */
  calls_total?: number;
  input: Record<string, unknown>;
  output: Record<string, unknown>;
  state: Record<string, unknown> | null;
  /** Per param, the values the pipeline allows a fork to give it (where it declares them). */
  param_hints?: Record<string, ParamHint>;
}

export interface ParamHint {
  choices?: unknown[];
  type?: "number" | "integer";
  min?: number;
  max?: number;
  description?: string;
}

export interface DiffChange {
  path: string;
  kind: "changed" | "added" | "removed" | "type_changed";
  old: unknown;
  new: unknown;
  text_diff: string | null;
  /** where the old value sat in A when a list item moved (insertion/removal before it) */
  old_path: string | null;
}

export interface DiffSide {
  position: number;
  name: string;
  output_hash: string;
  tokens: number;
  outcome: string;
  /** sha256 of the code that produced the node ("" when its run recorded no graph) */
  code: string;
  output: Record<string, unknown>;
}

export interface DiffRow {
  index: number;
  name: string;
  status: "equal" | "changed" | "only_a" | "only_b";
  token_delta: number;
  hash_equal: boolean;
  /** the node ran other code in B than in A: its changes are not the override's alone */
  code_changed: boolean;
  a: DiffSide | null;
  b: DiffSide | null;
  changes: DiffChange[];
}

export interface Diff {
  run_a: string;
  run_b: string;
  tokens_a: number;
  tokens_b: number;
  token_delta: number;
  first_divergence: number | null;
  counts: Record<string, number>;
  code_changed: string[];
  nodes: DiffRow[];
}

export interface CostSide {
  run_id: string;
  tokens: number;
  latency_ms: number;
}

export interface Cost {
  original: CostSide;
  replay: CostSide;
  delta: { tokens: number; latency_ms: number };
  saved: { tokens: number; latency_ms: number };
  nodes: {
    number: number;
    name: string;
    status: NodeStatus;
    original_tokens: number | null;
    replay_tokens: number;
    original_latency_ms: number | null;
    replay_latency_ms: number;
  }[];
}

export interface PipelineInfo {
  name: string;
  description: string;
  inputs: Record<string, string>;
  nodes: string[];
  edges: Edge[];
}

export interface Settings {
  model_endpoint: {
    kind: string;
    base_url: string | null;
    description: string;
    started: boolean;
    api_key_set: boolean;
  };
  model: string;
  temperature_default: number;
  store: { root: string; database: string; dialect: string };
  auth: { token_required: boolean; user?: string | null; admin?: boolean };
  workers: number;
  version: string;
  pipelines: string[];
  /** each setting in force and where it came from (an env variable, "server" or "default") */
  effective?: { name: string; value: unknown; source: string; note: string }[];
}

export interface RunEvent {
  event: string;
  run_id: string;
  seq: number;
  position?: number;
  name?: string;
  status?: string;
  [key: string]: unknown;
}

// -- audit, what-if grid, hash stability (src/rewind/api/reports.py) --------------------------

export type Verdict = "faithful" | "divergent" | "audit-incomplete" | "not-re-executed";

export interface Fingerprint {
  digest: string | null;
  epoch: string | null;
}

export interface AuditResource {
  resource: string;
  kind: string;
  recorded: Fingerprint;
  reference: string;
  reference_post: Fingerprint;
  epoch_delta: string;
  status: "match" | "mismatch" | "missing";
}

export interface AuditVerdict {
  run_id: string;
  position: number;
  node: string;
  call_index: number;
  tool: string;
  verdict: Verdict;
  resources: AuditResource[];
  reason: string;
  dependents: string[];
}

export interface AuditReport {
  run_id: string;
  against: string | null;
  passed: boolean;
  note: string;
  counts: Record<Verdict, number>;
  inherited_skipped: string[];
  verdicts: AuditVerdict[];
}

export type JobStatus = "queued" | "running" | "completed" | "failed" | "interrupted";

export interface JobFork {
  index: number;
  run_id: string | null;
  status: string;
  label: string;
  error?: string | null;
}

export interface Job<R> {
  id: string;
  kind: "grid" | "stability";
  run_id: string;
  status: JobStatus;
  request: Record<string, unknown>;
  progress: { done: number; total: number; forks: JobFork[] };
  error: { error: string; message: string; hint: string } | null;
  submitted_at: number;
  started_at: number | null;
  finished_at: number | null;
  report?: R | null;
}

export interface GridCell {
  output_hash: string | null;
  short: string;
  status: "equal" | "changed" | "only_b" | "failed" | string;
  changed_fields: number | null;
  outcome: string;
  tokens: number;
}

export interface GridRow {
  index: number;
  name: string;
  occurrence: number;
  label: string;
  parent_hash: string | null;
  cells: (GridCell | null)[];
}

export interface GridVariant {
  index: number;
  label: string;
  override: Override;
  run_id: string | null;
  status: string;
  error: string | null;
  tokens: number;
  first_divergence: { index: number; node: string | null } | null;
  artifacts: Record<string, string>;
  changes_artifact: boolean | null;
  llm_requests: number;
  llm_shared: number;
  wall_ms: number;
}

export interface GridReport {
  kind: "grid";
  run_id: string;
  at: string;
  at_number: number;
  effects: string;
  workers: number;
  wall_ms: number;
  tokens: number;
  parent: { tokens: number; artifacts: Record<string, string> };
  new_llm_inputs: number;
  llm_requests: number;
  changes_artifact: string[];
  variants: GridVariant[];
  rows: GridRow[];
}

export interface StabilityNode {
  index: number;
  name: string;
  occurrence: number;
  label: string;
  stable: boolean;
  distinct: number;
  modal_hash: string | null;
  modal_count: number;
  modal_share: number;
  completed: number;
  parent_hash: string | null;
  matches_parent: boolean;
  determinism: string;
  hashes: (string | null)[];
}

export interface StabilityReport {
  kind: "stability";
  run_id: string;
  from_node: string;
  from_number: number;
  k: number;
  override: Override | null;
  stable_share: number;
  stable_nodes: number;
  node_count: number;
  first_spread: { index: number; label: string } | null;
  tokens: number;
  wall_ms: number;
  samples: { run_id: string; status: string; tokens: number; error: string | null }[];
  nodes: StabilityNode[];
}

// -- traces (src/rewind/tracing/service.py) -------------------------------------------------------

export type TraceStatus = "success" | "failed" | "running" | string;

export interface TraceSummary {
  trace_id: string;
  name: string;
  kind: "trace" | "run";
  status: TraceStatus;
  started_at: number;
  ended_at: number | null;
  duration_ms: number;
  tokens: number;
  steps: number;
  failed_steps: number;
  error: string | null;
  parent_trace_id: string | null;
}

export interface TracesResponse {
  traces: TraceSummary[];
  total: number;
  limit: number;
  offset: number;
  next_offset: number | null;
}

export interface TraceStep {
  number: number;
  position: number;
  name: string;
  type: string;
  status: TraceStatus;
  duration_ms: number;
  tokens: number;
  error: string | null;
  parent: number | null;
  prompt_tokens: number;
  completion_tokens: number;
  model: string | null;
  input: unknown;
  output: unknown;
  params: Record<string, unknown>;
  cache_outcome: string;
  cache_reason: string;
  inherited: boolean;
}

export interface TraceDetail extends Omit<TraceSummary, "steps"> {
  run_status: string;
  input: Record<string, unknown>;
  output: unknown;
  config: Record<string, unknown>;
  override: Override | null;
  error_type: string | null;
  error_message: string | null;
  steps: TraceStep[];
}

export interface ReplaySwitches {
  cached_llm: boolean;
  cached_tools: boolean;
  stop_at_divergence: boolean;
}

export interface TraceCompareStep {
  index: number;
  name: string;
  status: "equal" | "changed" | "only_a" | "only_b" | string;
  token_delta: number;
  hash_equal: boolean;
  a: { position: number } | null;
  b: { position: number } | null;
}

export interface TraceCompare {
  run_a: string;
  run_b: string;
  tokens_a: number;
  tokens_b: number;
  token_delta: number;
  first_divergence: number | null;
  counts: { equal: number; changed: number; only_a: number; only_b: number };
  nodes: TraceCompareStep[];
}

export interface TraceReplayResult {
  mode: "chain" | "recorded-calls" | string;
  switches: ReplaySwitches;
  stopped: boolean;
  trace: TraceDetail;
  diff: TraceCompare;
}

export interface FailureGroup {
  key: string;
  total: number;
  failed: number;
  rate: number;
  finding: boolean;
  examples: string[];
}

export type FailureDimension = "input_length" | "step_type" | "model" | "params";

export interface Correlation {
  dimension: FailureDimension;
  unit: "traces" | "steps";
  total: number;
  failed: number;
  rate: number;
  finding_rate: number | null;
  min_failures: number;
  edges?: number[];
  groups: FailureGroup[];
  findings: string[];
}

export interface FailurePatternJson {
  pattern: string;
  signature: string | null;
  count: number;
  share: number;
  example_trace_ids: string[];
  steps: Record<string, number>;
  description: string;
  suggested_fix: string;
}

export interface FailuresResponse {
  total_traces: number;
  failed_traces: number;
  patterns: FailurePatternJson[];
  correlations?: Correlation[];
}
