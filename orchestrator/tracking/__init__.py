"""Tracking: MLflow as the sweep's record (runs per trial, the registry of promoted layouts, the UI)."""
