// Shapes of Rewind's HTTP API: aliases of the types generated from its OpenAPI document
// (src/api-schema.d.ts, regenerated with `npm run types`; the server's models live in
// src/rewind/api/models.py). Only shapes the document does not carry are written here.
import type { components } from "./api-schema";

type S = components["schemas"];

export type RunStatus = S["Run"]["status"];
export type NodeStatus = S["Execution"]["status"];
export type Override = S["Override"];
export type Run = S["Run"];
export type Artifact = S["Artifact"];
export type RunDetail = S["RunDetail"];
/** A grid or stability job whose runs the runs list groups (GET /api/runs, tree). */
export type JobGroupInfo = S["JobGroupInfo"];
/** A run of the runs tree (run_id set), or a job group (run_id null, job set). */
export type TreeItem = S["TreeItem"];
export type RunsResponse = S["RunsResponse"];

/** Filters of the runs list (query parameters of GET /api/runs). */
export interface RunFilters {
  q: string;
  pipeline: string;
  status: string;
  since: string; // yyyy-mm-dd (local day start), or ""
  until: string; // yyyy-mm-dd (inclusive day), or ""
}

export type Call = S["Call"];
export type Execution = S["Execution"];
export type GraphNode = S["GraphNode"];
export type Edge = S["Edge"];
export type Graph = S["Graph"];
export type ChatMessage = S["ChatMessage"];
export type LlmRequest = S["LlmRequest"];
export type LlmResponse = S["LlmResponse"];
/** One call of a node with its request and response (GET /api/runs/{id}/nodes/{n}/calls). */
export type CallDetail = S["CallDetail"];
export type NodeCalls = S["NodeCalls"];
export type NodeDetail = S["NodeDetail"];
export type ParamHint = S["ParamHint"];
export type DiffChange = S["DiffChange"];
export type DiffSide = S["DiffSide"];
export type DiffRow = S["DiffRow"];
export type Diff = S["Diff"];
export type CostSide = S["CostSide"];
export type Cost = S["Cost"];
export type PipelineInfo = S["PipelineInfo"];
export type PipelineList = S["PipelineList"];
export type Settings = S["Settings"];
export type RunDeleted = S["RunDeleted"];
export type CancelAccepted = S["CancelAccepted"];
export type RunAccepted = S["RunAccepted"];

/** One server-sent event of a run (GET /api/runs/{id}/events; the stream's data, not a schema). */
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

export type Verdict = S["AuditVerdict"]["verdict"];
export type Fingerprint = S["Fingerprint"];
export type AuditResource = S["AuditResource"];
export type AuditVerdict = S["AuditVerdict"];
export type AuditReport = S["AuditReportModel"];
export type LiveForkResource = S["LiveForkResource"];
export type JobStatus = S["GridJob"]["status"];
export type JobFork = S["JobFork"];
/** A grid or stability job with its report ``R`` once completed. */
export type Job<R> = Omit<S["GridJob"], "report"> & { report?: R | null };
export type GridCell = S["GridCell"];
export type GridRow = S["GridRow"];
export type GridVariant = S["GridVariant"];
export type GridReport = S["GridReportModel"];
export type StabilityNode = S["StabilityNode"];
export type StabilityReport = S["StabilityReportModel"];

// -- traces (src/rewind/tracing/service.py) -------------------------------------------------------

export type TraceStatus = S["TraceSummary"]["status"];
export type TraceSummary = S["TraceSummary"];
export type TracesResponse = S["TracesResponse"];
export type TraceStep = S["TraceStep"];
export type TraceDetail = S["TraceDetail"];
export type ReplaySwitches = S["ReplaySwitches"];
export type TraceCompareStep = S["TraceCompareRow"];
export type TraceCompare = S["TraceCompare"];
export type TraceReplayResult = S["TraceReplayResult"];
export type FailureGroup = S["FailureGroup"];
export type FailureDimension = S["Correlation"]["dimension"];
export type Correlation = S["Correlation"];
export type FailurePatternJson = S["FailurePattern"];
export type FailuresResponse = S["FailuresResponse"];
