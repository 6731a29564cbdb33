"""Serving on the simulated chip: request traces, a cost model calibrated from RTL runs,
a continuous-batching scheduler and InferenceX-style metrics (docs/serving.md)."""
