import { defineConfig } from "vite";
import react from "@vitejs/plugin-react";
import { fileURLToPath } from "node:url";

// The build goes straight into the Python package, which serves it at "/".
const outDir = fileURLToPath(new URL("../src/rewind/static", import.meta.url));

export default defineConfig({
  plugins: [react()],
  base: "/",
  build: {
    outDir,
    emptyOutDir: true,
    sourcemap: false,
    // ELK (the graph layout, ~1.5 MB) is a lazily loaded web worker of its own.
    chunkSizeWarningLimit: 1500,
  },
  server: {
    // `npm run dev` proxies the API to a running `rewind serve --port 8765`.
    proxy: { "/api": "http://127.0.0.1:8765" },
  },
});
