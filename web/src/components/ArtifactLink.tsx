// Download of a run's artifact: fetched with the bearer token (a plain <a download> cannot send
// the Authorization header, so a server with users would refuse it) and saved via a Blob URL.
import { useState } from "react";
import { ApiError, downloadFile } from "../api";

export function ArtifactLink({ url, name }: { url: string; name: string }) {
  const [state, setState] = useState<"idle" | "busy" | "saved">("idle");
  const [error, setError] = useState<string | null>(null);
  return (
    <>
      <button
        type="button"
        className="text-sky-700 underline"
        data-testid={`artifact-${name}`}
        data-state={state}
        disabled={state === "busy"}
        onClick={() => {
          setState("busy");
          setError(null);
          downloadFile(url, name)
            .then(() => setState("saved"))
            .catch((e: ApiError) => {
              setState("idle");
              setError(e.status === 401 ? `${e.message} — set a token in Settings` : e.message);
            });
        }}
      >
        {name}
      </button>
      {error && (
        <span className="ml-1 text-red-700" data-testid="artifact-error">
          {error}
        </span>
      )}
    </>
  );
}
