import { StrictMode } from "react";
import { createRoot } from "react-dom/client";
import App from "./App";
import { takeTokenFromHash } from "./api";
import "./index.css";

takeTokenFromHash();
createRoot(document.getElementById("root")!).render(
  <StrictMode>
    <App />
  </StrictMode>,
);
